"""CPU inference of every keras_vit deployment format against timm, eager
and under `torch.compile`: ViT-S/16 and ViT-B/16 at 224, batch 1 and 8.

Engines (one persistent worker process per runtime, all pinned to the same
CPUs with the same thread count, only one working at a time):

| engine | what is timed | precision class |
| --- | --- | --- |
| `keras` | `model.predict_on_batch(x)`, TensorFlow backend (XLA) | fp32 |
| `savedmodel` | the `to_saved_model` file's `serving_default` (uint8 pixels) | fp32 |
| `tflite-fp32`, `tflite-fp16` | `to_tflite` file in LiteRT with XNNPACK (`ai-edge-litert`); fp16 = float16 weights | fp32 |
| `tflite-dynamic` | `to_tflite(quantization="dynamic")`: int8 weights, dynamic-range activations | reduced |
| `onnx-fp32` | `to_onnx` file in ONNX Runtime (CPU provider) | fp32 |
| `onnx-int8` | `to_onnx(quantization="dynamic")`: ONNX Runtime's dynamic int8 MatMuls | reduced |
| `openvino-fp32`, `openvino-bf16` | `to_openvino` IR, `INFERENCE_PRECISION_HINT` f32 / bf16 (bf16 only where the CPU has avx512_bf16 or AMX) | fp32 / reduced |
| `timm-eager`, `timm-eager-bf16` | timm `model(x)` under `inference_mode` (bf16: `torch.autocast("cpu")`) | fp32 / reduced |
| `timm-compile`, `timm-compile-bf16` | the same after `torch.compile(model)` (inductor) | fp32 / reduced |

Every engine computes the same network: a keras_vit model with seeded random
weights (head included) is saved, exported to each format, and written as an
official `.npz` that timm loads with its own official loader
(`timm.models.vision_transformer._load_weights`; timm keeps its exact-erf
GELU). Keras formats take float32 NHWC pixels in [0, 255] with the model's
preprocessing inside the graph; timm takes normalized NCHW tensors
(its preprocessing is not timed).

Timing: per configuration (model, batch) every engine is loaded and makes
`--warmup` untimed calls (compilation); then in round r each engine in turn,
a different one first each round, after `--settle` idle seconds, times calls
for about `--round-seconds`; a row's time per call is the median over rounds.
Ratios: `÷ timm eager` = this row's images/s over timm eager's of the same
precision class (fp32 rows against `timm-eager`, reduced-precision rows
against `timm-eager-bf16`): above 1, keras_vit's format is faster. On a CPU
without native bf16 (no avx512_bf16, no AMX) PyTorch's bf16 is emulated and
slower than its fp32, so `÷ fastest timm` (against the fastest timm row of
any precision, eager or compiled) is the fair comparison there.

Top-1 agreement: each keras_vit engine's (and timm eager's, which checks
that timm loaded the same weights) top-1 class on real images (scikit-learn's
digits scaled to 224 and crops of its two sample photos) against the Keras
model's. The weights are random, so this measures how faithfully the format
computes the same network, not accuracy; a random network's top-1 margins are
smaller than a trained one's, so quantized agreement here is pessimistic.

    python benchmarks/deploy.py [--models vit_s16,vit_b16] [--batch 1,8]
        [--engines keras,savedmodel,...] [--rounds 3] [--round-seconds 2]
        [--warmup 2] [--settle 1] [--threads N] [--agreement-images 64]
        [--peer-python PATH] [--work DIR] [--json PATH] [--out DIR]

`--peer-python`: the interpreter of the timm workers (default: this one), for
PyTorch installed in another environment. `--work`: where the exports are
kept (reused by the next run with the same model and seed; default
`~/.cache/keras_vit_bench/deploy`). `--out DIR` writes DIR/deploy.md and
DIR/deploy.json. The machine (CPU model and flags), versions and thread
settings of each runtime are in the output. Progress goes to stderr.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import (  # noqa: E402
    NotAvailable,
    die_with_parent,
    fail,
    import_torchvision,
    machine_info,
    progress,
    rotated,
    serve,
    usable_cpus,
)
from machine import cpu  # noqa: E402

MODELS = {
    "vit_s16": dict(keras_vit="ViTS16", timm="vit_small_patch16_224"),
    "vit_b16": dict(keras_vit="ViTB16", timm="vit_base_patch16_224"),
}
ENGINES = {  # engine: (runtime worker, precision class)
    "keras": ("tf", "fp32"),
    "savedmodel": ("tf", "fp32"),
    "tflite-fp32": ("litert", "fp32"),
    "tflite-fp16": ("litert", "fp32"),
    "tflite-dynamic": ("litert", "reduced"),
    "onnx-fp32": ("onnxruntime", "fp32"),
    "onnx-int8": ("onnxruntime", "reduced"),
    "openvino-fp32": ("openvino", "fp32"),
    "openvino-bf16": ("openvino", "reduced"),
    "timm-eager": ("torch", "fp32"),
    "timm-eager-bf16": ("torch", "reduced"),
    "timm-compile": ("torch", "fp32"),
    "timm-compile-bf16": ("torch", "reduced"),
}
PEER = {"fp32": "timm-eager", "reduced": "timm-eager-bf16"}
GOAL = 1.5  # the issue's goal: >= 1.5x timm eager of the same precision class
MIN_AGREEMENT = 0.99
IMAGE_SIZE = 224
CLASSES = 1000
SEED = 0
TFLITE_MODES = {"tflite-fp32": "none", "tflite-fp16": "float16", "tflite-dynamic": "dynamic"}


def has_bf16(flags=None):
    """Whether the CPU runs bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    flags = cpu()["flags"] if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def files(work, model):
    base = os.path.join(work, f"{model}-seed{SEED}")
    return {
        "keras": base + ".keras",
        "npz": base + ".npz",
        "savedmodel": base + "-savedmodel",
        "onnx-fp32": base + ".onnx",
        "onnx-int8": base + "-int8.onnx",
        "openvino": base + ".xml",
        "agreement": base + "-agreement.npy",
        **{f"{engine}-b{batch}": f"{base}-{mode}-b{batch}.tflite"
           for engine, mode in TFLITE_MODES.items() for batch in (1, 8)},
    }


def engine_file(paths, engine, batch):
    if engine.startswith("tflite"):
        return paths[f"{engine}-b{batch}"]
    if engine.startswith("openvino"):
        return paths["openvino"]
    return paths[engine]


# ---------------------------------------------------------------- workers


class Worker:
    def __init__(self, threads):
        self.threads = threads
        self.engines = {}  # name -> (call, predict)

    def load(self, engine, model, batch, paths, warmup):
        start = time.perf_counter()
        x = self.batch_input(batch)
        call, predict = self.make(engine, model, batch, paths, x)
        loaded = time.perf_counter()
        for _ in range(warmup):
            call()
        self.engines[engine] = (call, predict, batch)
        return {"load_s": loaded - start, "warmup_s": time.perf_counter() - loaded}

    def batch_input(self, batch):
        import numpy as np

        rng = np.random.default_rng(0)
        return rng.uniform(0, 255, (batch, IMAGE_SIZE, IMAGE_SIZE, 3)).astype("float32")

    def time(self, engine, seconds):
        call = self.engines[engine][0]
        calls, start = 0, time.perf_counter()
        while True:
            call()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return {"seconds": elapsed / calls, "calls": calls}

    def top1(self, engine, path):
        import numpy as np

        _, predict, batch = self.engines[engine]
        images = np.load(path)
        count = len(images)
        padded = np.resize(images, (-(-count // batch) * batch, *images.shape[1:]))
        logits = np.concatenate([np.asarray(predict(padded[i:i + batch]))
                                 for i in range(0, len(padded), batch)])
        return {"top1": logits[:count].argmax(-1).tolist()}

    def release(self):
        import gc

        self.engines.clear()
        gc.collect()
        return {}


class TFWorker(Worker):
    """keras and savedmodel; also prepares every export."""

    def __init__(self, threads):
        super().__init__(threads)
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import keras

        import keras_vit

        self.tf, self.keras, self.keras_vit = tf, keras, keras_vit
        self.info = {"versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                                  "keras_vit": keras_vit.__version__},
                     "threads": {"tf_intra_op": threads, "tf_inter_op": 1}}

    def prepare(self, model, work, engines, agreement_images):
        """Builds the seeded model and writes every export `engines` need
        (kept in `work` for the next run); returns seconds per file."""
        import numpy as np

        from keras_vit import export

        os.makedirs(work, exist_ok=True)
        paths = files(work, model)
        seconds = {}
        keras = self.keras
        if not os.path.exists(paths["keras"]):
            keras.utils.set_random_seed(SEED)
            net = getattr(self.keras_vit, MODELS[model]["keras_vit"])(
                weights=None, classes=CLASSES, input_shape=(IMAGE_SIZE, IMAGE_SIZE, 3),
                classifier_activation=None)
            # The head starts at zero (all logits equal): give it weights.
            head = net.get_layer("head")
            kernel, bias = head.get_weights()
            rng = np.random.default_rng(SEED)
            head.set_weights([rng.normal(0, kernel.shape[0] ** -0.5, kernel.shape)
                              .astype("float32"), np.zeros_like(bias)])
            self.keras_vit.save_official_weights(net, paths["npz"])
            net.save(paths["keras"])
        net = None
        images = agreement_set(agreement_images)
        np.save(paths["agreement"], images)
        sample = images[:8]

        def model_():
            nonlocal net
            if net is None:
                net = keras.saving.load_model(paths["keras"])
            return net

        def timed(name, path, make):
            if os.path.exists(path):
                return
            progress(f"  exporting {model} {name} -> {path}")
            start = time.perf_counter()
            make(path)
            seconds[name] = time.perf_counter() - start

        common = dict(validation_data=sample, check=False, verbose=False,
                      latency_repeats=1)
        if "savedmodel" in engines:
            timed("savedmodel", paths["savedmodel"], lambda p: export.to_saved_model(
                model_(), p, validation_data=sample, check=False, verbose=False))
        for engine, mode in TFLITE_MODES.items():
            if engine in engines:
                for batch in (1, 8):
                    timed(f"{engine} batch {batch}", paths[f"{engine}-b{batch}"],
                          lambda p, mode=mode, batch=batch: export.to_tflite(
                              model_(), p, quantization=None if mode == "none" else mode,
                              batch_size=batch, metadata=False, **common))
        if "onnx-fp32" in engines:
            timed("onnx-fp32", paths["onnx-fp32"],
                  lambda p: export.to_onnx(model_(), p, **common))
        if "onnx-int8" in engines:
            timed("onnx-int8", paths["onnx-int8"],
                  lambda p: export.to_onnx(model_(), p, quantization="dynamic", **common))
        if any(e.startswith("openvino") for e in engines):
            timed("openvino", paths["openvino"],
                  lambda p: export.to_openvino(model_(), p, **common))
        return {"paths": paths, "export_s": seconds}

    def make(self, engine, model, batch, paths, x):
        tf = self.tf
        if engine == "keras":
            net = self.keras.saving.load_model(paths["keras"])
            return (lambda: net.predict_on_batch(x)), net.predict_on_batch
        serve = tf.saved_model.load(paths["savedmodel"]).signatures["serving_default"]
        pixels = tf.constant(x.round().astype("uint8"))

        def predict(images):
            return serve(images=tf.constant(images.round().astype("uint8")))["logits"].numpy()
        return (lambda: serve(images=pixels)["logits"].numpy()), predict


def agreement_set(count):
    """`count` real images at 224: digits scaled up (gray to RGB) and crops
    of scikit-learn's two sample photos, float32 in [0, 255]."""
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits, load_sample_images

    photos = load_sample_images().images
    crops = []
    rng = np.random.default_rng(SEED)
    for i in range(min(8, count)):
        photo = photos[i % 2]
        side = int(rng.integers(200, 420))
        y = int(rng.integers(0, photo.shape[0] - side + 1))
        x0 = int(rng.integers(0, photo.shape[1] - side + 1))
        crops.append(tf.image.resize(photo[y:y + side, x0:x0 + side],
                                     (IMAGE_SIZE, IMAGE_SIZE)).numpy())
    digits = load_digits().images[:max(0, count - len(crops))] * (255.0 / 16.0)
    digits = tf.image.resize(digits[..., None], (IMAGE_SIZE, IMAGE_SIZE)).numpy()
    digits = np.repeat(digits, 3, axis=-1)
    return np.concatenate([np.stack(crops), digits]).astype("float32")[:count]


class LiteRTWorker(Worker):
    def __init__(self, threads):
        super().__init__(threads)
        from importlib.metadata import version

        self.info = {"versions": {"ai-edge-litert": version("ai-edge-litert")},
                     "threads": {"num_threads": threads}}

    def make(self, engine, model, batch, paths, x):
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=engine_file(paths, engine, batch),
                                  num_threads=self.threads)
        interpreter.allocate_tensors()
        runner = interpreter.get_signature_runner()

        def predict(images):
            return runner(images=images)["logits"]
        return (lambda: runner(images=x)), predict


class ORTWorker(Worker):
    def __init__(self, threads):
        super().__init__(threads)
        import onnxruntime as ort

        self.ort = ort
        self.info = {"versions": {"onnxruntime": ort.__version__},
                     "threads": {"intra_op_num_threads": threads, "inter_op_num_threads": 1}}

    def make(self, engine, model, batch, paths, x):
        options = self.ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        session = self.ort.InferenceSession(engine_file(paths, engine, batch), options,
                                            providers=["CPUExecutionProvider"])

        def predict(images):
            return session.run(["logits"], {"images": images})[0]
        return (lambda: predict(x)), predict


class OpenVINOWorker(Worker):
    def __init__(self, threads):
        super().__init__(threads)
        import openvino as ov

        self.ov = ov
        self.info = {"versions": {"openvino": ov.get_version()},
                     "threads": {"INFERENCE_NUM_THREADS": threads}}

    def make(self, engine, model, batch, paths, x):
        precision = "bf16" if engine.endswith("bf16") else "f32"
        if precision == "bf16" and not has_bf16():
            raise NotAvailable("this CPU has neither avx512_bf16 nor AMX")
        compiled = self.ov.Core().compile_model(
            engine_file(paths, engine, batch), "CPU",
            {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": self.threads})
        request = compiled.create_infer_request()
        output = compiled.output("logits")

        def predict(images):
            return request.infer({"images": images})[output]
        return (lambda: predict(x)), predict


class TorchWorker(Worker):
    def __init__(self, threads):
        super().__init__(threads)
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
        torchvision = import_torchvision()
        import timm

        self.torch, self.timm = torch, timm
        self.info = {"versions": {"torch": torch.__version__, "timm": timm.__version__,
                                  "torchvision": torchvision},
                     "threads": {"torch_threads": torch.get_num_threads(),
                                 "torch_interop": torch.get_num_interop_threads()}}

    def make(self, engine, model, batch, paths, x):
        import numpy as np

        torch, timm = self.torch, self.timm
        from timm.models.vision_transformer import _load_weights

        net = timm.create_model(MODELS[model]["timm"], pretrained=False,
                                num_classes=CLASSES)
        _load_weights(net, paths["npz"])
        net.eval()
        if "compile" in engine:
            net = torch.compile(net)
        bf16 = engine.endswith("bf16")

        def tensor(images):  # the official preprocessing, not timed
            return torch.from_numpy(
                np.ascontiguousarray((images / 127.5 - 1.0).transpose(0, 3, 1, 2)))
        inputs = tensor(x)

        def run(t):
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                        enabled=bf16):
                return net(t).float().numpy()
        return (lambda: run(inputs)), (lambda images: run(tensor(images)))


WORKERS = {"tf": TFWorker, "litert": LiteRTWorker, "onnxruntime": ORTWorker,
           "openvino": OpenVINOWorker, "torch": TorchWorker}
INSTALL = {"tf": "pip install -e .", "litert": "pip install ai-edge-litert",
           "onnxruntime": "pip install -e '.[onnx]'", "openvino": "pip install -e '.[openvino]'",
           "torch": "pip install torch --index-url https://download.pytorch.org/whl/cpu "
                    "&& pip install timm (or --peer-python)"}


def worker_main(runtime, threads):
    serve(lambda: WORKERS[runtime](threads), threads)


# ----------------------------------------------------------------- driver


class WorkerProcess:
    def __init__(self, runtime, threads, python):
        self.runtime = runtime
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        self.process = subprocess.Popen(
            [python, os.path.abspath(__file__), "--worker", runtime, "--threads",
             str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            preexec_fn=die_with_parent if sys.platform == "linux" else None)

    def read(self):
        line = self.process.stdout.readline()
        if line:
            return json.loads(line)
        return {"ok": False, "error": f"worker exited with code {self.process.wait()}"}

    def request(self, op, **arguments):
        try:
            self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass
        return self.read()

    def close(self):
        try:
            self.process.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.process.kill()


def start_workers(engines, threads, peer_python):
    runtimes = list(dict.fromkeys(ENGINES[e][0] for e in ["keras", *engines]))
    workers = {r: WorkerProcess(r, threads, peer_python if r == "torch" else sys.executable)
               for r in runtimes}
    infos, skipped = {}, {}
    for runtime, worker in list(workers.items()):
        hello = worker.read()
        if hello["ok"]:
            infos[runtime] = hello["info"]
            continue
        skipped[runtime] = (f"{hello['missing']} not installed: {INSTALL[runtime]}"
                            if hello.get("missing") else hello["error"])
        progress(f"skipping {runtime}: {skipped[runtime]}")
        worker.close()
        del workers[runtime]
    if "tf" not in workers:
        raise SystemExit("the TensorFlow worker (keras_vit) could not start: "
                         + skipped.get("tf", ""))
    return workers, infos, skipped


def run_config(model, batch, engines, workers, paths, args, label):
    rows = {}
    for engine in engines:
        runtime, precision = ENGINES[engine]
        row = rows[engine] = dict(model=model, batch=batch, engine=engine,
                                  precision=precision, status="ok", round_s=[])
        if runtime not in workers:
            row.update(status="skipped", error="runtime not available")
            continue
        progress(f"{label}: loading {engine}")
        reply = workers[runtime].request("load", engine=engine, model=model, batch=batch,
                                         paths=paths, warmup=args.warmup)
        if not reply["ok"]:
            fail(row, reply, "engine")
            continue
        row.update(load_s=reply["load_s"], warmup_s=reply["warmup_s"])
    for r in range(args.rounds):
        live = [e for e in engines if rows[e]["status"] == "ok"]
        for engine in rotated(live, r):
            time.sleep(args.settle)
            reply = workers[ENGINES[engine][0]].request("time", engine=engine,
                                                        seconds=args.round_seconds)
            if reply["ok"]:
                rows[engine]["round_s"].append(reply["seconds"])
            else:
                fail(rows[engine], reply, "engine")
        progress(f"{label}: round {r + 1}/{args.rounds}: " + ", ".join(
            f"{e} {batch / rows[e]['round_s'][-1]:.1f}" for e in live
            if rows[e]["status"] == "ok") + " img/s")
    reference = None
    for engine in ["keras", *[e for e in engines if e != "keras"]]:
        if engine not in rows or rows[engine]["status"] != "ok":
            continue
        if engine.startswith("timm") and engine != "timm-eager":
            continue  # the same weights as timm-eager, which checks the loading
        reply = workers[ENGINES[engine][0]].request("top1", engine=engine,
                                                    path=paths["agreement"])
        if not reply["ok"]:
            fail(rows[engine], reply, "engine")
            continue
        if engine == "keras":
            reference = reply["top1"]
        if reference:
            rows[engine]["top1_agreement"] = (
                sum(a == b for a, b in zip(reply["top1"], reference, strict=True)) / len(reference))
    for worker in workers.values():
        worker.request("release")
    return list(rows.values())


def summarize(rows):
    for row in rows:
        if row["status"] == "ok" and row["round_s"]:
            seconds = statistics.median(row["round_s"])
            row.update(ms=seconds * 1e3, img_s=row["batch"] / seconds)
    by_key = {(r["model"], r["batch"], r["engine"]): r for r in rows}
    fastest_timm = {}
    for row in rows:
        if row["engine"].startswith("timm") and row.get("img_s"):
            key = (row["model"], row["batch"])
            if row["img_s"] > fastest_timm.get(key, (0, None))[0]:
                fastest_timm[key] = (row["img_s"], row["engine"])
    for row in rows:
        peer = by_key.get((row["model"], row["batch"], PEER[row["precision"]]))
        row["over_timm_eager"] = (row["img_s"] / peer["img_s"]
                                  if row.get("img_s") and peer and peer.get("img_s")
                                  else None)
        best_timm = fastest_timm.get((row["model"], row["batch"]))
        row["over_fastest_timm"] = (row["img_s"] / best_timm[0]
                                    if row.get("img_s") and best_timm else None)
    goals = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for batch in dict.fromkeys(r["batch"] for r in rows):
            for precision in ("fp32", "reduced"):
                candidates = [r for r in rows if r["model"] == model and r["batch"] == batch
                              and r["precision"] == precision
                              and not r["engine"].startswith("timm")
                              and r.get("over_timm_eager") is not None]
                # The fastest format that keeps >= 99% top-1 agreement.
                faithful = [r for r in candidates
                            if (r.get("top1_agreement") or 0) >= MIN_AGREEMENT]
                if faithful:
                    best = max(faithful, key=lambda r: r["over_timm_eager"])
                    best_timm = fastest_timm.get((model, batch), (None, None))
                    goals.append(dict(model=model, batch=batch, precision=precision,
                                      best=best["engine"], ratio=best["over_timm_eager"],
                                      over_fastest_timm=best["over_fastest_timm"],
                                      fastest_timm=best_timm[1],
                                      top1_agreement=best.get("top1_agreement"),
                                      goal_met=best["over_timm_eager"] >= GOAL))
    return goals


def fmt(value, spec, suffix=""):
    return "" if value is None else f"{value:{spec}}{suffix}"


def markdown(result):
    m, s = result["machine"], result["settings"]
    lines = ["# Deployment formats on the CPU: keras_vit vs timm", "",
             f"{m['cpu']}, {m['cpu_count']} CPUs, {result['threads']} threads "
             f"(avx512f: {m['avx512f']}, avx512_bf16/amx: {m['bf16']}, "
             f"amx_bf16: {m['amx_bf16']}); {IMAGE_SIZE}x{IMAGE_SIZE}, random weights "
             f"(seed {SEED}); median of {s['rounds']} rounds of about "
             f"{s['round_seconds']:g} s after {s['warmup']} warmup calls.", ""]
    for name, info in result["workers"].items():
        versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        threads = ", ".join(f"{k}={v}" for k, v in info["threads"].items() if k != "cpus")
        lines.append(f"- {name}: {versions}; {threads}")
    for name, reason in result["skipped"].items():
        lines.append(f"- {name}: skipped ({reason})")
    lines += ["", "`÷ timm eager`: images/s over timm eager's of the same precision class "
              "(fp32 rows: timm fp32; reduced rows: timm bf16 autocast). Top-1: agreement "
              "with the Keras model on "
              f"{s['agreement_images']} real images (random weights).", "",
              "| model | batch | engine | precision | ms/batch | img/s | ÷ timm eager "
              "| ÷ fastest timm | top-1 |",
              "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        head = f"| {r['model']} | {r['batch']} | {r['engine']} | {r['precision']} |"
        if r["status"] != "ok" or "ms" not in r:
            error = " ".join(str(r.get("error", "")).split()).replace("|", "/")[:70]
            lines.append(f"{head} {r['status']}: {error} | | | | |")
            continue
        agreement = r.get("top1_agreement")
        lines.append(f"{head} {r['ms']:,.1f} | {r['img_s']:,.1f} | "
                     f"{fmt(r['over_timm_eager'], '.2f')} | "
                     f"{fmt(r['over_fastest_timm'], '.2f')} | "
                     f"{fmt(None if agreement is None else agreement * 100, '.1f', '%')} |")
    lines += ["", "Best keras_vit format per precision class among those with >= 99% "
              "top-1 agreement (goal: >= 1.5x timm eager of the class); `÷ fastest timm`: "
              "against the fastest timm row of any precision and mode:", "",
              "| model | batch | precision | best format | ÷ timm eager | goal | "
              "÷ fastest timm (which) | top-1 |",
              "| --- | ---: | --- | --- | ---: | --- | ---: | ---: |"]
    for g in result["goals"]:
        agreement = g["top1_agreement"]
        lines.append(f"| {g['model']} | {g['batch']} | {g['precision']} | {g['best']} | "
                     f"{g['ratio']:.2f} | {'met' if g['goal_met'] else 'missed'} | "
                     f"{fmt(g['over_fastest_timm'], '.2f')} ({g['fastest_timm']}) | "
                     f"{fmt(None if agreement is None else agreement * 100, '.1f', '%')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batch", default="1,8")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-seconds", type=float, default=2.0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=len(usable_cpus()))
    parser.add_argument("--agreement-images", type=int, default=64)
    parser.add_argument("--peer-python", default=sys.executable)
    parser.add_argument("--work", default=os.path.join(
        os.path.expanduser("~"), ".cache", "keras_vit_bench", "deploy"))
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--out", metavar="DIR")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for option, allowed in (("models", MODELS), ("engines", ENGINES)):
        values = getattr(args, option).split(",")
        unknown = [v for v in values if v not in allowed]
        if unknown:
            parser.error(f"--{option}: unknown {unknown}; choose from {list(allowed)}")
        setattr(args, option, values)
    args.engines = [e for e in ENGINES if e in args.engines]
    try:
        args.batch = [int(b) for b in args.batch.split(",")]
    except ValueError:
        parser.error(f"--batch: {args.batch!r} is not a comma-separated list of ints")
    if any(b not in (1, 8) for b in args.batch):
        parser.error(f"--batch: {args.batch}; allowed: 1 and 8 (the TFLite exports "
                     "have a static batch)")
    for option in ("rounds", "warmup", "threads", "agreement_images"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, args.threads)
        return 0
    machine = machine_info()
    machine["bf16"] = has_bf16()
    progress(f"{machine['cpu']}: avx512f {machine['avx512f']}, bf16 {machine['bf16']}, "
             f"{args.threads} threads")
    workers, infos, skipped = start_workers(args.engines, args.threads, args.peer_python)
    rows, exports = [], {}
    try:
        for model in args.models:
            progress(f"{model}: preparing the exports in {args.work}")
            reply = workers["tf"].request("prepare", model=model, work=args.work,
                                          engines=args.engines,
                                          agreement_images=args.agreement_images)
            if not reply["ok"]:
                raise SystemExit(f"{model}: the exports failed: {reply['error']}")
            exports[model] = reply["export_s"]
            workers["tf"].request("release")
            for batch in args.batch:
                rows += run_config(model, batch, args.engines, workers, reply["paths"], args,
                                   f"{model} batch {batch}")
                if args.out:  # what is measured so far survives an interrupted run
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, "deploy.partial.json"), "w") as f:
                        json.dump({"machine": machine, "rows": rows}, f, indent=1)
    finally:
        for worker in workers.values():
            worker.close()
    goals = summarize(rows)
    result = {"machine": machine, "threads": args.threads, "workers": infos,
              "skipped": skipped, "export_s": exports,
              "settings": {k: getattr(args, k) for k in (
                  "models", "batch", "engines", "rounds", "round_seconds", "warmup",
                  "settle", "agreement_images")},
              "rows": rows, "goals": goals}
    table = markdown(result)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "deploy.md"), "w") as f:
            f.write(table)
        with open(os.path.join(args.out, "deploy.json"), "w") as f:
            json.dump(result, f, indent=1)
        partial = os.path.join(args.out, "deploy.partial.json")
        if os.path.exists(partial):
            os.remove(partial)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
