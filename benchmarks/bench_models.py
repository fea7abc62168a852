"""Inference and training throughput of ViT-Ti/16, S/16, B/16 and Mixer-B/16:
keras_vit against keras-hub and timm, with the matmul peak of each framework.

Frameworks, each in its own persistent worker process:

- `keras_vit-tf`: keras_vit, TensorFlow backend (the reference of the ratios),
- `keras_hub-tf`: keras-hub's `ViTBackbone` with the same configuration and a
  1000-way Dense head on the class token, as `ViTImageClassifier` pools
  (keras-hub has no MLP-Mixer: its Mixer rows say "n/a"),
- `keras_vit-tfxla`: the same TensorFlow model with its train and predict
  steps compiled by XLA (`compile(jit_compile=True)`; Keras' "auto" leaves
  XLA off on a CPU-only machine, as keras_vit's trainer does); `XLA_FLAGS`
  in the environment reach it and are recorded, e.g.
  `XLA_FLAGS="--xla_cpu_use_onednn=true
  --xla_cpu_experimental_onednn_fusion_type=LIBRARY_FUSION_TYPE_DOT"` for
  oneDNN's matmuls in place of XLA's own (as `TF_ENABLE_ONEDNN_OPTS` for
  the TensorFlow workers),
- `keras_vit-tfinter`: the TensorFlow graph step with
  `inter_op_parallelism_threads` = N instead of 1: TensorFlow's own default
  on an N-CPU machine, and so what `keras-vit train` and a plain
  `model.fit` run with. Independent ops (a matmul's input and weight
  gradients) then run at once on the shared intra-op pool of N threads,
- `keras_vit-tfreplicas`: the TensorFlow graph step as N single-threaded
  replicas: N logical CPU devices under a `MirroredStrategy`, each replica
  a 1/N part of the batch, intra-op threads 1, inter-op N (on one thread
  TensorFlow's matmuls are closer to PyTorch's than on two; this asks
  whether N one-thread replicas beat one N-thread step),
- `keras_vit-jax`: keras_vit, JAX backend,
- `timm-torch`: timm's `vit_{tiny,small,base}_patch16_224` and
  `mixer_b16_224` on PyTorch.

Everything runs on the CPU (the workers hide GPUs). One process per framework
because Keras picks its backend once per process, and TensorFlow and PyTorch
each bundle their own oneDNN/OpenMP thread pools, which interfere in one
process. The driver talks to the workers in JSON lines and only one works at a
time. For every configuration (model, batch, dtype, mode) each worker builds
its model and makes `--warmup` untimed calls (the first compiles); then, in
round r, each framework in turn times `--iters` calls, a different framework
starting each round, each after `--settle` idle seconds (OpenMP and XLA
worker threads spin-wait for a while after a parallel region; without the
pause the previous framework's spinning threads take CPU from the next). A
row's time per call is the median over the rounds of the round's mean.
Weights are random (seeded): speed does not depend on them.
Inputs: seeded random images in [0, 255] (NHWC for Keras, NCHW for PyTorch),
random labels.

- `infer` (images/s): Keras `model.predict_on_batch(x)`; timm `model(x)` in
  eval mode under `torch.inference_mode()`.
- `train` (ms/step, images/s): Keras `train_on_batch(x, y)` after
  `compile(AdamW(1e-4), SparseCategoricalCrossentropy(from_logits=True))`;
  timm forward, cross-entropy, backward, `AdamW.step()`,
  `zero_grad(set_to_none=True)`.
- `bfloat16`: Keras builds the model under the `mixed_bfloat16` policy;
  PyTorch runs forward and loss under `torch.autocast("cpu",
  dtype=torch.bfloat16)`, its standard CPU mixed-precision recipe.

Threads, set explicitly in every worker from `--threads N` (default: every
CPU this process may use): the worker is pinned to the same N CPUs
(`os.sched_setaffinity`, before any import; it is the only limit XLA honours
on CPU, `intra_op_parallelism_threads` in XLA_FLAGS has no effect), and
OMP_NUM_THREADS = MKL_NUM_THREADS = N; TensorFlow:
`set_intra_op_parallelism_threads(N)`, `set_inter_op_parallelism_threads(1)`
(N for keras_vit-tfinter);
PyTorch: `torch.set_num_threads(N)`, `torch.set_num_interop_threads(1)`. The
values read back from each framework are reported.

Matmul peak, in the same run: each worker times float32 and bfloat16
products, three independent (1576x768)@(768x3072) (a ViT-B/16 MLP layer at
batch 8) or 2048^3 per call, summed to one scalar so that no host copy is
timed; its peak is the better shape, median of `--rounds` rounds. GFLOP per
image are counted from the configuration: 2 x the multiply-adds of every dense
layer, the patch embedding, and the attention products q.k and attn.v (ViT-B/16
at 224: 35.1 GFLOP); a training step counts 3 forward passes. Each row reports
the achieved GFLOP/s (images/s x GFLOP per image) and its fraction of
TensorFlow's (oneDNN's) peak of the same dtype, the project's reference, and
of the framework's own. `keras_vit ÷ peer` = keras_vit-tf images/s ÷ the row's
images/s: above 1, keras_vit-tf is faster.

A framework that fails a configuration (out of memory, ...) gets the error in
that row and the run goes on; a framework whose packages are missing is
skipped with the pip command to install them.

timm imports torchvision at import time. Install PyTorch and torchvision from
the CPU wheel index, then timm:

    pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu
    pip install timm

If torchvision still cannot be imported, the timm worker registers a stand-in
module with the few names timm 1.0 imports at import time (the models
benchmarked use none of them) and the JSON says `"torchvision": "stub"`;
KERAS_VIT_BENCH_STUB_TORCHVISION=1 forces it.

    python benchmarks/bench_models.py [--models vit_ti16,vit_s16,vit_b16,mixer_b16]
        [--frameworks keras_vit-tf,keras_hub-tf,keras_vit-jax,timm-torch]  (the
        default; keras_vit-tfxla and keras_vit-tfinter only where named)
        [--batch 8,32] [--dtypes float32,bfloat16] [--modes infer,train]
        [--image-size 224] [--rounds 3] [--warmup 2] [--iters N]
        [--round-seconds 2] [--peak-seconds 0.5] [--settle 1] [--threads N]
        [--json [PATH]] [--out DIR]

`--iters` defaults to what makes a round last about `--round-seconds`,
estimated from the last warmup call. `--json` alone prints the JSON instead
of the table; `--json PATH` writes it there. `--out DIR` saves the table as
DIR/bench_models.md and the plot as DIR/bench_models.png. The JSON keeps the
machine (CPU model, family/model numbers and flags: `machine.cpu`), versions,
thread settings, peaks and, per row, every round's seconds per call
(`round_s`) and the medians. Progress goes to stderr.
"""

import argparse
import contextlib
import gc
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

FRAMEWORKS = ("keras_vit-tf", "keras_vit-tfxla", "keras_vit-tfinter", "keras_vit-tfreplicas",
              "keras_hub-tf", "keras_vit-jax", "timm-torch")
OPT_IN = ("keras_vit-tfxla", "keras_vit-tfinter", "keras_vit-tfreplicas")  # run only where named
REFERENCE = "keras_vit-tf"
INSTALL = {
    "keras_vit-tf": "pip install tensorflow keras",
    "keras_vit-tfxla": "pip install tensorflow keras",
    "keras_vit-tfinter": "pip install tensorflow keras",
    "keras_vit-tfreplicas": "pip install tensorflow keras",
    "keras_hub-tf": "pip install keras-hub tensorflow",
    "keras_vit-jax": "pip install jax",
    "timm-torch": "pip install timm torch",
}
MODELS = {
    "vit_ti16": dict(family="vit", keras_vit="ViTTi16", timm="vit_tiny_patch16_224",
                     hidden=192, layers=12, heads=3, mlp=768),
    "vit_s16": dict(family="vit", keras_vit="ViTS16", timm="vit_small_patch16_224",
                    hidden=384, layers=12, heads=6, mlp=1536),
    "vit_b16": dict(family="vit", keras_vit="ViTB16", timm="vit_base_patch16_224",
                    hidden=768, layers=12, heads=12, mlp=3072),
    "mixer_b16": dict(family="mixer", keras_vit="MixerB16", timm="mixer_b16_224",
                      hidden=768, layers=12, tokens_mlp=384, channels_mlp=3072),
}
PATCH = 16
CLASSES = 1000
DTYPES = ("float32", "bfloat16")
MODES = ("infer", "train")
PEAK_SHAPES = ((1576, 768, 3072), (2048, 2048, 2048))  # (m, k, n)
PEAK_CHAIN = 3  # independent products per timed call
STUB_ENV = "KERAS_VIT_BENCH_STUB_TORCHVISION"


def progress(message):
    print(message, file=sys.stderr, flush=True)


def usable_cpus():
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count()))


def gflop_per_image(model, image_size, mode):
    """2 x multiply-adds of the dense, patch-embedding and attention products."""
    return gflop_of(MODELS[model], image_size, mode)


def gflop_of(spec, image_size, mode):
    """`gflop_per_image` of a `MODELS`-style configuration (also used by
    `benchmarks/accelerator.py`)."""
    patch = spec.get("patch", PATCH)
    patches = (image_size // patch) ** 2
    d = spec["hidden"]
    embed = 2 * patches * patch * patch * 3 * d
    if spec["family"] == "vit":
        n = patches + 1
        block = (2 * n * d * 3 * d          # q, k, v
                 + 2 * 2 * n * n * d        # q.k and attn.v
                 + 2 * n * d * d            # attention output
                 + 2 * 2 * n * d * spec["mlp"])
    else:
        block = (2 * 2 * d * patches * spec["tokens_mlp"]
                 + 2 * 2 * patches * d * spec["channels_mlp"])
    forward = (embed + spec["layers"] * block + 2 * d * CLASSES) / 1e9
    return forward * (3 if mode == "train" else 1)


def random_batch(batch, image_size, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 255, (batch, image_size, image_size, 3)).astype("float32")
    return images, rng.integers(0, CLASSES, batch)


def random_operands(shape, seed=0):
    import numpy as np

    m, k, n = shape
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k), dtype="float32"),
            [rng.standard_normal((k, n), dtype="float32") for _ in range(PEAK_CHAIN)])


def seconds_per_call(call, seconds):
    """Mean time of `call` over at least one call and at least `seconds`."""
    calls, start = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


# ---------------------------------------------------------------- workers


class NotAvailable(Exception):
    """The framework has no such model: an "n/a" row, not an error."""


class Worker:
    """Answers the driver's requests; subclasses build the steps."""

    def __init__(self):
        self.step = None
        self.matmuls = {}

    def peak(self, seconds):
        gflops = {}
        for dtype in DTYPES:
            for shape in PEAK_SHAPES:
                key = (dtype, shape)
                if key not in self.matmuls:
                    self.matmuls[key] = self.matmul_call(shape, dtype)
                    self.matmuls[key]()  # compiles
                flop = 2 * shape[0] * shape[1] * shape[2] * PEAK_CHAIN
                per_call = seconds_per_call(self.matmuls[key], seconds)
                gflops.setdefault(dtype, {})["x".join(map(str, shape))] = flop / per_call / 1e9
        return {"gflops": gflops}

    def build(self, model, image_size, batch, dtype, mode, warmup):
        self.release()
        start = time.perf_counter()
        self.step, info = self.make_step(MODELS[model], image_size, batch, dtype, mode)
        built = time.perf_counter()
        for _ in range(warmup):
            call_start = time.perf_counter()
            self.step()
        done = time.perf_counter()
        return {"build_s": built - start, "warmup_s": done - built,
                "call_s": done - call_start, **info}

    def time(self, iters):
        start = time.perf_counter()
        for _ in range(iters):
            self.step()
        return {"seconds": time.perf_counter() - start}

    def release(self):
        self.step = None
        self.matmuls.clear()
        self.free()
        gc.collect()
        return {}

    def free(self):
        pass


class KerasWorker(Worker):
    def __init__(self, framework, threads):
        super().__init__()
        library, variant = framework.split("-")
        self.jit_compile = variant == "tfxla"  # else Keras' "auto"
        self.backend = "tf" if variant.startswith("tf") else variant
        os.environ["KERAS_BACKEND"] = {"tf": "tensorflow", "jax": "jax"}[self.backend]
        versions, settings = {}, {}
        self.strategy = None  # keras_vit-tfreplicas: its MirroredStrategy
        if self.backend == "tf":
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(
                1 if variant == "tfreplicas" else threads)
            # tfinter: TensorFlow's own default on an N-CPU machine (what
            # `keras-vit train` runs with), so that independent ops, such as
            # a matmul's two gradients, run at once on the intra-op pool.
            tf.config.threading.set_inter_op_parallelism_threads(
                threads if variant in ("tfinter", "tfreplicas") else 1)
            if variant == "tfreplicas":  # N one-thread replicas, one per logical CPU
                # (after the threads: listing the devices starts the runtime)
                cpu = tf.config.list_physical_devices("CPU")[0]
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * threads)
                self.strategy = tf.distribute.MirroredStrategy(
                    [f"/cpu:{i}" for i in range(threads)])
                settings["replicas"] = threads
            versions["tensorflow"] = tf.__version__
            settings["tf_intra_op"] = tf.config.threading.get_intra_op_parallelism_threads()
            settings["tf_inter_op"] = tf.config.threading.get_inter_op_parallelism_threads()
            if "TF_ENABLE_ONEDNN_OPTS" in os.environ:  # 0: Eigen's kernels
                settings["TF_ENABLE_ONEDNN_OPTS"] = os.environ["TF_ENABLE_ONEDNN_OPTS"]
        else:
            import jax

            versions["jax"] = jax.__version__
            settings["jax"] = "CPU affinity"
        import keras

        self.keras = keras
        versions["keras"] = keras.__version__
        if library == "keras_hub":
            import keras_hub as library_module
        else:
            import keras_vit as library_module
        self.library = library_module
        versions[library] = library_module.__version__
        if os.environ.get("XLA_FLAGS") and (self.jit_compile or self.backend == "jax"):
            settings["XLA_FLAGS"] = repr(os.environ["XLA_FLAGS"])  # e.g. XLA's CPU kernels
        self.info = {"versions": versions, "threads": settings}

    def matmul_call(self, shape, dtype):
        return (tf_matmul_call if self.backend == "tf" else jax_matmul_call)(shape, dtype)

    def build_model(self, spec, image_size):
        keras = self.keras
        shape = (image_size, image_size, 3)
        if self.library.__name__ == "keras_vit":
            return getattr(self.library, spec["keras_vit"])(
                weights=None, classes=CLASSES, input_shape=shape, classifier_activation=None)
        if spec["family"] != "vit":
            raise NotAvailable("keras-hub has no MLP-Mixer")
        backbone = self.library.models.ViTBackbone(
            image_shape=shape, patch_size=PATCH, num_layers=spec["layers"],
            num_heads=spec["heads"], hidden_dim=spec["hidden"], mlp_dim=spec["mlp"])
        # ViTImageClassifier's "token" pooling: the class token of the last norm.
        logits = keras.layers.Dense(CLASSES, name="predictions")(backbone.output[:, 0])
        return keras.Model(backbone.input, logits)

    def make_step(self, spec, image_size, batch, dtype, mode):
        keras = self.keras
        keras.mixed_precision.set_global_policy(
            "mixed_bfloat16" if dtype == "bfloat16" else "float32")
        keras.utils.set_random_seed(0)
        def scope():
            return self.strategy.scope() if self.strategy else contextlib.nullcontext()

        with scope():
            model = self.build_model(spec, image_size)
        images, labels = random_batch(batch, image_size)
        x = keras.ops.convert_to_tensor(images)
        y = keras.ops.convert_to_tensor(labels.astype("int32"))
        if mode == "infer":
            if self.jit_compile:
                model.compile(jit_compile=True)

            def step():
                model.predict_on_batch(x)
        else:
            with scope():
                model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                              jit_compile=self.jit_compile or "auto")

            def step():
                model.train_on_batch(x, y)
        return step, {"params": model.count_params(), "jit_compile": bool(model.jit_compile)}

    def free(self):
        self.keras.backend.clear_session()
        self.keras.mixed_precision.set_global_policy("float32")


def tf_matmul_call(shape, dtype):
    import tensorflow as tf

    a, bs = random_operands(shape)
    a = tf.cast(a, dtype)
    bs = [tf.cast(b, dtype) for b in bs]
    # Operands are arguments, not captured constants, so nothing is folded.
    products = tf.function(lambda a, bs: tf.add_n([tf.reduce_sum(a @ b) for b in bs]))
    return lambda: products(a, bs).numpy()


def torch_matmul_call(shape, dtype):
    import torch

    a, bs = random_operands(shape)
    a = torch.from_numpy(a).to(getattr(torch, dtype))
    bs = [torch.from_numpy(b).to(getattr(torch, dtype)) for b in bs]

    def products():
        with torch.inference_mode():
            return sum((a @ b).sum() for b in bs).item()
    return products


def jax_matmul_call(shape, dtype):
    import jax
    import jax.numpy as jnp

    a, bs = random_operands(shape)
    a = jnp.asarray(a, dtype)
    bs = [jnp.asarray(b, dtype) for b in bs]
    products = jax.jit(lambda a, bs: sum(jnp.sum(a @ b) for b in bs))
    return lambda: products(a, bs).block_until_ready()


class TimmWorker(Worker):
    def __init__(self, framework, threads):
        super().__init__()
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        torchvision = import_torchvision()
        import timm

        self.torch, self.timm = torch, timm
        self.info = {
            "versions": {"torch": torch.__version__, "timm": timm.__version__,
                         "torchvision": torchvision},
            "threads": {"torch_threads": torch.get_num_threads(),
                        "torch_interop": torch.get_num_interop_threads()},
        }

    def matmul_call(self, shape, dtype):
        return torch_matmul_call(shape, dtype)

    def make_step(self, spec, image_size, batch, dtype, mode):
        torch = self.torch
        torch.manual_seed(0)
        model = self.timm.create_model(spec["timm"], pretrained=False, num_classes=CLASSES,
                                       img_size=image_size)
        images, labels = random_batch(batch, image_size)
        x = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
        y = torch.from_numpy(labels)

        def autocast():
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")
        if mode == "infer":
            model.eval()

            def step():
                with torch.inference_mode(), autocast():
                    model(x)
        else:
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

            def step():
                with autocast():
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        params = sum(p.numel() for p in model.parameters())
        return step, {"params": params}


# What timm 1.0 imports from torchvision when `timm` is imported (1.0.31;
# the imports it guards with try/except are left out).
def import_torchvision():
    """torchvision's version, or "stub" after registering the stand-in."""
    if os.environ.get(STUB_ENV) != "1":
        try:
            import torchvision

            return torchvision.__version__
        except Exception as error:  # noqa: BLE001  a missing or mismatched wheel
            progress(f"timm-torch: torchvision not importable ({error}); using a stand-in")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from torch_libraries import install_torchvision_stub  # tests/: the shared stand-in

    install_torchvision_stub()
    return "stub"


def limit_threads(threads):
    """Pins this process to `threads` CPUs and sets the OpenMP/MKL counts."""
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(threads)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, usable_cpus()[:threads])
    return {"cpus": usable_cpus(), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}


def worker_main(framework, threads):
    serve(lambda: (TimmWorker if framework == "timm-torch" else KerasWorker)(
        framework, threads), threads)


def serve(make_worker, threads):
    """A worker process's loop: pins the threads, builds the worker with
    `make_worker()`, then answers the driver's JSON-line requests (an op
    name and its arguments) until "exit". deploy.py's workers use it too."""
    # The protocol owns the real stdout; anything else written to fd 1 (print,
    # C++ logging) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message):
        protocol.write(json.dumps(message) + "\n")

    settings = limit_threads(threads)
    try:
        worker = make_worker()
    except ModuleNotFoundError as error:
        reply({"ok": False, "missing": error.name, "error": str(error)})
        return
    except Exception as error:  # noqa: BLE001  reported to the driver, which goes on
        reply({"ok": False, "error": f"{type(error).__name__}: {error}"})
        return
    worker.info["threads"].update(settings)
    reply({"ok": True, "info": worker.info})
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        if op == "exit":
            break
        try:
            reply({"ok": True, **getattr(worker, op)(**request)})
        except NotAvailable as reason:
            reply({"ok": False, "na": str(reason)})
        except Exception as error:  # noqa: BLE001  reported to the driver
            import traceback

            traceback.print_exc()
            reply({"ok": False, "error": f"{type(error).__name__}: {error}"})


# ----------------------------------------------------------------- driver


def die_with_parent():
    """Linux: the kernel kills the worker when the driver dies."""
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h> PR_SET_PDEATHSIG
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class WorkerProcess:
    """The driver's end of one worker; restarts it if it died."""

    def __init__(self, framework, threads):
        self.framework, self.threads = framework, threads
        self.process = None

    def start(self):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="",
                   JAX_PLATFORMS="cpu")
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", self.framework,
             "--threads", str(self.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            preexec_fn=die_with_parent if sys.platform == "linux" else None)

    def hello(self):
        return self.read()

    def request(self, op, **arguments):
        if self.process is None:
            self.start()
            hello = self.read()
            if not hello["ok"]:
                return hello
        try:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # read() reports the exit
        return self.read()

    def read(self):
        line = self.process.stdout.readline()
        if line:
            return json.loads(line)
        code = self.process.wait()
        self.process = None
        return {"ok": False, "error": f"worker exited with code {code}"}

    def close(self):
        if self.process is None:
            return
        try:
            self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


def start_workers(frameworks, threads):
    """Starts the workers together; returns the live ones and the skipped."""
    workers = {name: WorkerProcess(name, threads) for name in frameworks}
    for worker in workers.values():
        worker.start()
    infos, skipped = {}, {}
    for name, worker in list(workers.items()):
        hello = worker.hello()
        if hello["ok"]:
            infos[name] = hello["info"]
            continue
        if hello.get("missing"):
            skipped[name] = f"{hello['missing']} not installed: {INSTALL[name]}"
        else:
            skipped[name] = hello["error"]
        progress(f"skipping {name}: {skipped[name]}")
        worker.close()
        del workers[name]
    return workers, infos, skipped


def rotated(names, start):
    start %= max(len(names), 1)
    return names[start:] + names[:start]


def measure_peaks(workers, rounds, seconds, settle):
    """{framework: {dtype: {"gflops": best shape's median, "rounds": ...}}}."""
    raw = {name: {} for name in workers}
    for r in range(rounds):
        progress(f"matmul peak, round {r + 1}/{rounds}")
        for name in rotated(list(workers), r):
            time.sleep(settle)
            reply = workers[name].request("peak", seconds=seconds)
            if not reply["ok"]:
                progress(f"  {name}: matmul peak failed: {reply['error']}")
                continue
            for dtype, shapes in reply["gflops"].items():
                for shape, gflops in shapes.items():
                    raw[name].setdefault(dtype, {}).setdefault(shape, []).append(gflops)
    for worker in workers.values():
        worker.request("release")
    return {name: {dtype: {"gflops": max(statistics.median(v) for v in shapes.values()),
                           "rounds": shapes}
                   for dtype, shapes in by_dtype.items()}
            for name, by_dtype in raw.items()}


def reference_peak(peaks):
    for name in (REFERENCE, "keras_hub-tf"):
        if peaks.get(name):
            return {"source": name, **{d: v["gflops"] for d, v in peaks[name].items()}}
    return None


def run_config(config, workers, args, label):
    rows = {name: {**config, "framework": name, "status": "ok"} for name in workers}
    for name, worker in workers.items():
        progress(f"{label}: building {name}")
        reply = worker.request("build", warmup=args.warmup, **config)
        if not reply["ok"]:
            fail(rows[name], reply)
            continue
        del reply["ok"]
        call_s = reply.pop("call_s")
        iters = args.iters or max(1, round(args.round_seconds / call_s))
        rows[name].update(reply, iters=iters, warmup=args.warmup, round_s=[])
    for r in range(args.rounds):
        live = [name for name in workers if rows[name]["status"] == "ok"]
        for name in rotated(live, r):
            time.sleep(args.settle)
            reply = workers[name].request("time", iters=rows[name]["iters"])
            if reply["ok"]:
                rows[name]["round_s"].append(reply["seconds"] / rows[name]["iters"])
            else:
                fail(rows[name], reply)
        progress(f"{label}: round {r + 1}/{args.rounds}: " + ", ".join(
            f"{name} {config['batch'] / rows[name]['round_s'][-1]:.1f} img/s"
            for name in live if rows[name]["status"] == "ok"))
    for worker in workers.values():
        worker.request("release")
    return list(rows.values())


def fail(row, reply, name="framework"):
    """Marks `row` n/a or failed from a worker's `reply`; `name`: the row's
    field that names it in the progress line."""
    if "na" in reply:
        row.update(status="n/a", error=reply["na"])
    else:
        row.update(status="error", error=reply["error"])
        progress(f"  {row[name]}: {reply['error']}")


def summarize(rows, peaks, tf_peak):
    for row in rows:
        if row["status"] != "ok":
            continue
        seconds = statistics.median(row["round_s"])
        gflop = gflop_per_image(row["model"], row["image_size"], row["mode"])
        row.update(median_s=seconds, ms=seconds * 1e3, img_s=row["batch"] / seconds,
                   gflop_per_image=gflop)
        row["gflops"] = row["img_s"] * gflop
        own = peaks.get(row["framework"], {}).get(row["dtype"])
        row["frac_own_peak"] = row["gflops"] / own["gflops"] if own else None
        row["frac_tf_peak"] = (row["gflops"] / tf_peak[row["dtype"]]
                               if tf_peak and row["dtype"] in tf_peak else None)
    keys = ("model", "batch", "dtype", "mode")
    reference = {tuple(r[k] for k in keys): r.get("img_s")
                 for r in rows if r["framework"] == REFERENCE}
    for row in rows:
        ref = reference.get(tuple(row[k] for k in keys))
        row["keras_vit_over_peer"] = ref / row["img_s"] if ref and row.get("img_s") else None


def machine_info():
    """The machine record of every report (`machine.cpu`: the CPU's model,
    family/model numbers and flags), with the keys the tables print."""
    info = machine.cpu()
    return {"cpu": info["model"], "cpuid": info["cpuid"], "flags": info["flags"],
            "avx512f": "avx512f" in info["flags"], "amx_bf16": "amx_bf16" in info["flags"],
            "cpu_count": os.cpu_count(), "usable_cpus": len(usable_cpus()),
            "platform": platform.platform(), "python": platform.python_version()}


# ---------------------------------------------------------------- reports


def fmt(value, spec, suffix=""):
    return "" if value is None else f"{value:{spec}}{suffix}"


def _cpuid(info):
    """" (family 25 model 17 stepping 1)" where the report has the numbers."""
    return f" ({info['cpuid']})" if info.get("cpuid") else ""


def markdown(result):
    m, s = result["machine"], result["settings"]
    lines = [
        "# Model throughput: keras_vit, keras-hub, timm", "",
        f"{m['cpu']}{_cpuid(m)}, {m['cpu_count']} CPUs (avx512f: {m['avx512f']}, "
        f"amx_bf16: {m['amx_bf16']}); {s['image_size']}x{s['image_size']}, "
        f"median of {s['rounds']} rounds; per round "
        + (f"{s['iters']} calls" if s["iters"] else f"about {s['round_seconds']:g} s of calls")
        + f" after {s['warmup']} warmup calls.", "",
        f"Threads: {result['threads']} per framework, every worker pinned to the same CPUs.",
    ]
    for name, info in result["workers"].items():
        settings = ", ".join(f"{k}={v}" for k, v in info["threads"].items())
        versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        lines.append(f"- {name}: {versions}; {settings}")
    for name, reason in result["skipped"].items():
        lines.append(f"- {name}: skipped ({reason})")
    lines += ["", "Matmul peak, GFLOP/s (best of "
              + ", ".join("x".join(map(str, shape)) for shape in PEAK_SHAPES) + "):", "",
              "| framework | " + " | ".join(DTYPES) + " |",
              "| --- |" + " ---: |" * len(DTYPES)]
    for name, by_dtype in result["peaks"].items():
        lines.append(f"| {name} | " + " | ".join(
            fmt(by_dtype.get(d, {}).get("gflops"), ",.0f") for d in DTYPES) + " |")
    lines += ["", "GFLOP/s = img/s x GFLOP per image counted from the configuration "
              "(training: 3 forward passes); % TF peak: of TensorFlow's matmul peak of "
              "the same dtype. keras_vit ÷ peer = keras_vit-tf img/s ÷ this row's: "
              "above 1, keras_vit-tf is faster.", "",
              "| model | batch | dtype | mode | framework | ms/step | img/s | GFLOP/s "
              "| % TF peak | keras_vit ÷ peer |",
              "| --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        head = f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['mode']} | {r['framework']} |"
        if r["status"] != "ok":
            error = " ".join(r["error"].split()).replace("|", "/")[:80]
            lines.append(f"{head} {r['status']}: {error} | | | | |")
            continue
        percent = r["frac_tf_peak"] * 100 if r["frac_tf_peak"] is not None else None
        lines.append(f"{head} {r['ms']:,.1f} | {r['img_s']:,.1f} | {r['gflops']:,.0f} | "
                     f"{fmt(percent, '.1f', '%')} | {fmt(r['keras_vit_over_peer'], '.2f')} |")
    return "\n".join(lines) + "\n"


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frameworks = [f for f in FRAMEWORKS if f in result["workers"]]
    modes = [m for m in MODES if any(r["mode"] == m for r in result["rows"])]
    tf_peak = result["tf_peak"]
    bars = len(result["rows"]) / len(modes)
    figure, axes = plt.subplots(len(modes), 1, squeeze=False,
                                figsize=(max(8, 0.3 * bars + 2), 4.5 * len(modes)))
    width = 0.8 / max(len(frameworks), 1)
    for axis, mode in zip(axes[:, 0], modes, strict=True):
        rows = [r for r in result["rows"] if r["mode"] == mode]
        groups = list(dict.fromkeys((r["model"], r["batch"], r["dtype"]) for r in rows))
        for i, framework in enumerate(frameworks):
            values = {(r["model"], r["batch"], r["dtype"]): r.get("img_s")
                      for r in rows if r["framework"] == framework}
            axis.bar([g + i * width for g in range(len(groups))],
                     [values.get(group) or float("nan") for group in groups], width,
                     label=framework)
        if tf_peak:
            for g, (model, _, dtype) in enumerate(groups):
                if dtype in tf_peak:
                    ceiling = tf_peak[dtype] / gflop_per_image(
                        model, result["settings"]["image_size"], mode)
                    axis.hlines(ceiling, g - width / 2, g + 0.8 - width / 2, colors="black",
                                linestyles="dashed",
                                label="TF matmul peak of the dtype, in images/s"
                                if g == 0 else None)
        axis.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
        axis.set_xticklabels([f"{m}\nb{b} {d}" for m, b, d in groups], fontsize=8)
        axis.set_yscale("log")
        axis.set_ylabel("images/s")
        axis.set_title(f"{mode}, {result['settings']['image_size']}px, "
                       f"{result['threads']} threads")
        axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ------------------------------------------------------------------- main


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--frameworks",
                        default=",".join(f for f in FRAMEWORKS if f not in OPT_IN))
    parser.add_argument("--batch", default="8,32", help="batch sizes")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls after build")
    parser.add_argument("--iters", type=int, help="timed calls per round (default: auto)")
    parser.add_argument("--round-seconds", type=float, default=2.0,
                        help="target round length when --iters is not given")
    parser.add_argument("--peak-seconds", type=float, default=0.5,
                        help="least time per matmul shape and round")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="idle seconds before each timed request")
    parser.add_argument("--threads", type=int, default=len(usable_cpus()))
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH")
    parser.add_argument("--out", metavar="DIR", help="writes bench_models.md and .png")
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for option, allowed in (("models", MODELS), ("frameworks", FRAMEWORKS),
                            ("dtypes", DTYPES), ("modes", MODES)):
        values = getattr(args, option).split(",")
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"--{option}: unknown {unknown}; choose from {list(allowed)}")
        setattr(args, option, values)
    args.frameworks = [f for f in FRAMEWORKS if f in args.frameworks]
    args.batch = [int(b) for b in args.batch.split(",")]
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: the first call compiles")
    if args.image_size % PATCH:
        parser.error(f"--image-size must be a multiple of {PATCH}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.threads)
        return 0
    workers, infos, skipped = start_workers(args.frameworks, args.threads)
    if not workers:
        progress("no framework could start")
        return 1
    try:
        peaks = measure_peaks(workers, args.rounds, args.peak_seconds, args.settle)
        tf_peak = reference_peak(peaks)
        configs = [dict(model=model, image_size=args.image_size, batch=batch, dtype=dtype,
                        mode=mode)
                   for model in args.models for batch in args.batch
                   for dtype in args.dtypes for mode in args.modes]
        rows = []
        for i, config in enumerate(configs, 1):
            label = (f"[{i}/{len(configs)}] {config['model']} batch {config['batch']} "
                     f"{config['dtype']} {config['mode']}")
            rows += run_config(config, workers, args, label)
    finally:
        for worker in workers.values():
            worker.close()
    summarize(rows, peaks, tf_peak)
    result = {
        "machine": machine_info(),
        "threads": args.threads,
        "versions": {k: v for info in infos.values() for k, v in info["versions"].items()},
        "workers": infos,  # per framework: versions and the thread settings read back
        "skipped": skipped,
        "settings": {k: getattr(args, k) for k in (
            "models", "frameworks", "batch", "dtypes", "modes", "image_size", "rounds",
            "warmup", "iters", "round_seconds", "peak_seconds", "settle")},
        "gflop_per_image": {m: gflop_per_image(m, args.image_size, "infer")
                            for m in args.models},
        "peaks": peaks,
        "tf_peak": tf_peak,
        "rows": rows,
    }
    table = markdown(result)
    if args.json == "-":
        print(json.dumps(result, indent=1))
    else:
        print(table)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_models.md"), "w") as f:
            f.write(table)
        if rows:
            plot(result, os.path.join(args.out, "bench_models.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
