"""Training and inference on one accelerator: keras_vit on the JAX,
TensorFlow (XLA) and torch backends against timm (eager and
`torch.compile`), in bfloat16 mixed precision, ViT-B/16, ViT-L/16 and
DINOv2-L/14 (patch 14, LayerScale; timm's `vit_large_patch14_dinov2`) at
224, and on a CPU DINOv2-S/14 and CLIP-B/16 (`dinov2_s14`, `clip_b16`:
pre-norm, no patch bias, QuickGELU, eps 1e-5; timm's `_quickgelu_` name).

Frameworks, each configuration in its own process (Keras picks its backend
once per process; one framework's allocator never holds another's memory):

- `keras_vit-jax`, `keras_vit-tf`, `keras_vit-torch`: `keras_vit.VisionTransformer`
  with the model's configuration, built under the `mixed_bfloat16` policy
  (float32 weights, bfloat16 compute, float32 softmax / LayerNorm / head).
  Training: `train_on_batch` after `compile(AdamW(1e-4),
  SparseCategoricalCrossentropy(from_logits=True))`, XLA-compiled on JAX
  and TensorFlow (`jit_compile=True`), eager on torch. Inference:
  `predict_on_batch`. `--attention` sets the blocks' attention
  implementation (`auto`: flash-attention kernels on a GPU, cuDNN's on JAX
  and PyTorch's SDPA on torch; the explicit path on TensorFlow and on a
  CPU under JAX); each row says which one ran.
- `timm-eager`, `timm-compile`: timm's `VisionTransformer` of the same
  configuration (`vit_base_patch16_224`, `vit_large_patch16_224`), float32
  weights under `torch.autocast(bfloat16)` (its AMP recipe), forward +
  cross-entropy + backward + `AdamW.step()` + `zero_grad(set_to_none=True)`;
  inference `model(x)` under `inference_mode`. `timm-compile` wraps the
  model in `torch.compile` (default mode).
- `official-flax`: the official flax ViT block as a JAX peer (see
  `official_flax_worker`; `--vit-jax` names a checkout of
  google-research/vision_transformer).

`--profile DIR` traces 3 JAX training steps (keras_vit-jax with `--loop
stateless`, official-flax) and writes, per row, the compiled HLO, the trace
and `benchmarks/jax_profile.py`'s summary of where the device time goes.

Every worker takes seeded random images (uint8 values, on the device before
timing) and labels; weights are random (speed does not depend on them).
After `--warmup` untimed steps (the first compiles), `--rounds` rounds of
`--steps` steps are timed, each ended by a device synchronisation (Keras
returns the loss / logits to the host; PyTorch `cuda.synchronize()`); a row
gives the median round. MFU = images/s x FLOP per image / peak, with FLOP per
image counted from the configuration (`bench_models.gflop_of`: dense,
patch-embedding and attention products; a training step counts 3 forward
passes; ViT-B/16 at 224: 35.1 GFLOP forward) and the peak of the device
measured in the same run (a bfloat16 8192^3 product through PyTorch, or JAX
where PyTorch is missing; on a CPU the fastest float32 2048^3 product of
PyTorch's and TensorFlow's; `--peak-size N`: N^3 instead); on a GPU whose
datasheet peak is in `SPEC_PEAK_TFLOPS` (H100, H200: 989 TFLOP/s dense
bfloat16) a second MFU (`mfu_spec`) against it. Peak memory: the
device's allocator peak (JAX `memory_stats`, `torch.cuda.max_memory_allocated`,
TensorFlow `get_memory_info`); on a CPU the process's peak RSS.

The run records the device, driver and library versions. A framework that
is not installed or fails (out of memory, ...) gets its error in its row and
the run goes on; each worker is stopped after `--timeout` seconds.

    python benchmarks/accelerator.py [--models vit_b16,vit_l16,dinov2_l14]
        [--frameworks keras_vit-jax,keras_vit-tf,keras_vit-torch,timm-eager,timm-compile]
        [--batch 128] [--image-size 224] [--dtype bfloat16] [--attention auto]
        [--steps 10] [--rounds 3] [--warmup 3] [--timeout 300] [--peak-size N]
        [--json PATH]

`--models tiny --image-size 32 --batch 2 --peak-size 256` runs a two-block
model in seconds on a CPU (tests/test_benchmarks.py does, so that the
script cannot rot; the CPU peak's 2048^3 products alone take about 20 s
on one thread).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_models import (  # noqa: E402  (the benchmarks' shared FLOP count and matmuls)
    PEAK_CHAIN,
    gflop_of,
    jax_matmul_call,
    tf_matmul_call,
    torch_matmul_call,
)
from machine import describe  # noqa: E402

FRAMEWORKS = ("keras_vit-jax", "keras_vit-tf", "keras_vit-torch", "timm-eager",
              "timm-compile", "official-flax")
BACKENDS = {"keras_vit-jax": "jax", "keras_vit-tf": "tensorflow", "keras_vit-torch": "torch"}
MODELS = {
    "vit_s16": dict(family="vit", hidden=384, layers=12, heads=6, mlp=1536),
    "vit_b16": dict(family="vit", hidden=768, layers=12, heads=12, mlp=3072),
    "vit_l16": dict(family="vit", hidden=1024, layers=24, heads=16, mlp=4096),
    # DINOv2-L/14 (#48): patch 14, LayerScale (init 1e-5); timm's
    # vit_large_patch14_dinov2 at --image-size (257 tokens at 224)
    "dinov2_l14": dict(family="vit", hidden=1024, layers=24, heads=16, mlp=4096, patch=14,
                       options=dict(layer_scale_init=1e-5), timm="vit_large_patch14_dinov2"),
    "dinov2_s14": dict(family="vit", hidden=384, layers=12, heads=6, mlp=1536, patch=14,
                       options=dict(layer_scale_init=1e-5), timm="vit_small_patch14_dinov2"),
    # OpenAI CLIP's image tower: pre-norm, no patch bias, QuickGELU, LayerNorm eps 1e-5
    "clip_b16": dict(family="vit", hidden=768, layers=12, heads=12, mlp=3072,
                     options=dict(pre_norm=True, patch_bias=False, gelu="quick",
                                  layer_norm_epsilon=1e-5),
                     timm="vit_base_patch16_clip_quickgelu_224"),
    # DINOv3-S/16 (#50): 2-D RoPE (DINOv3's), no position embedding, no qkv
    # bias, 4 registers, LayerScale, eps 1e-5, the patch tokens' mean (timm's
    # vit_small_patch16_dinov3 with a 1000-class head)
    "dinov3_s16": dict(family="vit", hidden=384, layers=12, heads=6, mlp=1536,
                       options=dict(rope="dinov3", qkv_bias="none", position_embedding=False,
                                    num_register_tokens=4, layer_scale_init=1e-5,
                                    layer_norm_epsilon=1e-5, classifier="avg", gelu="erf"),
                       timm="vit_small_patch16_dinov3"),
    # EVA-02-S/14 (#50): EVA's RoPE (reference grid 16x16), packed SwiGLU of
    # 1024, q/v biases, average pooling with fc_norm (timm's eva02_small_patch14_224)
    "eva02_s14": dict(family="vit", hidden=384, layers=12, heads=6, mlp=1024, patch=14,
                      options=dict(rope={"variant": "eva", "ref_grid": (16, 16)},
                                   mlp="swiglu", qkv_bias="qv", classifier="avg",
                                   fc_norm=True),
                      timm="eva02_small_patch14_224"),
    "tiny": dict(family="vit", hidden=32, layers=2, heads=2, mlp=64),
}
PATCH = 16
# Dense bfloat16 tensor-core peaks of the vendors' datasheets (TFLOP/s, without
# sparsity), by a name nvidia-smi / the frameworks report: MFU is given against
# this and against the peak measured in the same run.
SPEC_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}
CLASSES = 1000
MODES = ("train", "infer")
ATTENTION = ("auto", "fused", "dot_product")
DTYPES = ("bfloat16", "float32")


def progress(message):
    print(message, file=sys.stderr, flush=True)


# --- workers (one configuration per process) ------------------------------------------

def random_batch(batch, image_size, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, image_size, image_size, 3)).astype("float32")
    return images, rng.integers(0, CLASSES, batch).astype("int32")


def timed_rounds(step, warmup, rounds, steps):
    """Seconds per step of each round (`step` ends synchronised)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps)
    return times


def keras_worker(args):
    """keras_vit on the backend of `args.framework`."""
    os.environ["KERAS_BACKEND"] = BACKENDS[args.framework]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.layers import fused as _fused

    spec = MODELS[args.model]
    if args.dtype == "bfloat16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = keras_vit.VisionTransformer(
        patch_size=spec.get("patch", PATCH), hidden_size=spec["hidden"],
        num_layers=spec["layers"], num_heads=spec["heads"], mlp_dim=spec["mlp"],
        classes=CLASSES, classifier_activation=None,
        input_shape=(args.image_size, args.image_size, 3), attention=args.attention,
        **spec.get("options", {}))
    images, labels = random_batch(args.batch, args.image_size)
    x, y = keras.ops.convert_to_tensor(images), keras.ops.convert_to_tensor(labels)
    result = {"attention": args.attention,
              "attention_ran": ("dot_product" if _fused.uses_dot_product_attention(args.attention)
                                else "fused"),
              "keras": keras.__version__, "keras_vit": keras_vit.__version__}
    timings = {}
    if "infer" in args.modes:
        timings["infer"] = timed_rounds(lambda: np.asarray(model.predict_on_batch(x)),
                                        args.warmup, args.rounds, args.steps)
    if "train" in args.modes:
        model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=args.framework != "keras_vit-torch")
        step = (jax_stateless_step(model, x, y) if args.loop == "stateless"
                else lambda: model.train_on_batch(x, y))
        timings["train"] = timed_rounds(step, args.warmup, args.rounds, args.steps)
        result["loop"] = args.loop
        if args.profile and args.loop == "stateless":
            result["profile"] = profile_summary(
                step, args, f"{args.framework}_{result['attention_ran']}")
    result.update(device_report(BACKENDS[args.framework]))
    return timings, result


def jax_stateless_step(model, x, y):
    """One training step as Keras' JAX trainer computes it
    (`stateless_call`, `value_and_grad`, `optimizer.stateless_apply`), jitted
    with the state donated and kept on the device between steps: the step
    without `train_on_batch`'s per-call work (the host round trip of the
    loss, re-assigning every variable)."""
    import jax

    if os.environ["KERAS_BACKEND"] != "jax":
        raise ValueError("--loop stateless is for keras_vit-jax")
    optimizer, loss_fn = model.optimizer, model.loss
    optimizer.build(model.trainable_variables)
    state = [[v.value for v in variables] for variables in (
        model.trainable_variables, model.non_trainable_variables, optimizer.variables)]

    def step(trainable, non_trainable, optimizer_values, x, y):
        def loss_of(trainable):
            logits, updated = model.stateless_call(trainable, non_trainable, x, training=True)
            return loss_fn(y, logits), updated

        (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable)
        trainable, optimizer_values = optimizer.stateless_apply(
            optimizer_values, grads, trainable)
        return trainable, non_trainable, optimizer_values, loss

    step = jax.jit(step, donate_argnums=(0, 1, 2))

    def call():
        *state[:], loss = step(*state, x, y)
        loss.block_until_ready()

    call.compiled_text = lambda: step.lower(*state, x, y).compile().as_text()
    return call


def official_flax_worker(args):
    """The official ViT block, `vit_jax.models_vit.Encoder1DBlock` (flax,
    google-research/vision_transformer; `--vit-jax` names a checkout) with
    `dtype=bfloat16`, in a ViT of the model's configuration: a 16x16 patch
    convolution, class token and position embeddings, the blocks, the final
    LayerNorm and a float32 head, as keras_vit's. The residual stream is
    cast to the compute dtype before the blocks, as Keras' mixed policy does
    (the official `Encoder` keeps it in float32 because its position
    embeddings are float32). AdamW as Keras' (lr 1e-4, weight decay 0.004,
    epsilon 1e-7), one `jax.jit` step with its state donated: a JAX peer
    that no one here wrote the block of."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, os.path.abspath(args.vit_jax or os.environ.get("VIT_JAX", ".")))
    try:
        import flax
        import flax.linen as nn
        from vit_jax import models_vit
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(error.msg, name=f"{error.name} (--vit-jax: a checkout of "
                                  "google-research/vision_transformer)") from error

    spec = MODELS[args.model]
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32

    class ViT(nn.Module):
        @nn.compact
        def __call__(self, images, train):
            x = (images.astype(dtype) - 127.5) / 127.5
            x = nn.Conv(spec["hidden"], (PATCH, PATCH), strides=(PATCH, PATCH),
                        padding="VALID", dtype=dtype, name="embedding")(x)
            n, h, w, c = x.shape
            x = x.reshape(n, h * w, c)
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c))
            x = jnp.concatenate([jnp.tile(cls.astype(dtype), (n, 1, 1)), x], axis=1)
            position = self.param("pos_embedding", nn.initializers.normal(0.02),
                                  (1, h * w + 1, c))
            x = (x + position).astype(dtype)
            for i in range(spec["layers"]):
                x = models_vit.Encoder1DBlock(
                    mlp_dim=spec["mlp"], num_heads=spec["heads"], dtype=dtype,
                    dropout_rate=0.0, attention_dropout_rate=0.0,
                    name=f"encoderblock_{i}")(x, deterministic=not train)
            x = nn.LayerNorm(name="encoder_norm")(x)
            return nn.Dense(CLASSES, name="head")(x[:, 0])

    model = ViT()
    images, labels = random_batch(args.batch, args.image_size)
    x, y = jnp.asarray(images), jnp.asarray(labels)
    params = jax.jit(lambda: model.init(jax.random.PRNGKey(0), x[:1], train=False))()
    state = [params, (jax.tree.map(jnp.zeros_like, params),
                      jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))]

    def loss_of(params, x, y):
        logits = model.apply(params, x, train=True).astype(jnp.float32)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    def step(params, optimizer, x, y):
        loss, grads = jax.value_and_grad(loss_of)(params, x, y)
        m, v, t = optimizer
        t = t + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, grads)
        rate = 1e-4 * jnp.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        params = jax.tree.map(lambda p, m, v: p - 1e-4 * 0.004 * p
                              - rate * m / (jnp.sqrt(v) + 1e-7), params, m, v)
        return params, (m, v, t), loss

    step = jax.jit(step, donate_argnums=(0, 1))
    infer = jax.jit(lambda params, x: model.apply(params, x, train=False))

    def train():
        *state[:], loss = step(*state, x, y)
        loss.block_until_ready()

    train.compiled_text = lambda: step.lower(*state, x, y).compile().as_text()
    timings = {}
    if "infer" in args.modes:
        timings["infer"] = timed_rounds(lambda: infer(state[0], x).block_until_ready(),
                                        args.warmup, args.rounds, args.steps)
    result = {"attention_ran": "flax MultiHeadDotProductAttention", "flax": flax.__version__,
              "jax": jax.__version__}
    if "train" in args.modes:
        timings["train"] = timed_rounds(train, args.warmup, args.rounds, args.steps)
        result["loop"] = "stateless"
        if args.profile:
            result["profile"] = profile_summary(train, args, "official-flax")
    result.update(device_report("jax"))
    return timings, result


def profile_summary(call, args, name):
    """`jax_profile.profile_step` into `--profile`, the headline figures
    for the report (the rest is in the directory)."""
    from jax_profile import profile_step

    summary = profile_step(call, call.compiled_text, args.profile, f"{args.model}_{name}")
    return {key: summary.get(key) for key in ("device_ms_per_step", "by_kind", "by_phase",
                                              "error")
            if key in summary}


def timm_worker(args):
    """timm's VisionTransformer, eager or `torch.compile`d, AMP bfloat16."""
    import torch

    timm_module, torchvision = import_timm()
    spec = MODELS[args.model]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = timm_module.create_model(
        spec.get("timm", "vit_base_patch16_224"), pretrained=False, img_size=args.image_size,
        patch_size=spec.get("patch", PATCH), embed_dim=spec["hidden"], depth=spec["layers"],
        num_heads=spec["heads"], mlp_ratio=spec["mlp"] / spec["hidden"],
        num_classes=CLASSES).to(device)
    if args.framework == "timm-compile":
        model = torch.compile(model)
    images, labels = random_batch(args.batch, args.image_size)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device) / 255.0
    y = torch.from_numpy(labels).long().to(device)

    def autocast():
        return torch.autocast(device, dtype=torch.bfloat16,
                              enabled=args.dtype == "bfloat16")

    def synchronize():
        if device == "cuda":
            torch.cuda.synchronize()

    timings = {}
    if "infer" in args.modes:
        model.eval()

        def infer():
            with torch.inference_mode(), autocast():
                model(x)
            synchronize()

        timings["infer"] = timed_rounds(infer, args.warmup, args.rounds, args.steps)
    if "train" in args.modes:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss_fn = torch.nn.CrossEntropyLoss()

        def train():
            with autocast():
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronize()

        timings["train"] = timed_rounds(train, args.warmup, args.rounds, args.steps)
    result = {"timm": timm_module.__version__, "torch": torch.__version__,
              "torchvision": torchvision}
    result.update(device_report("torch"))
    return timings, result


def import_timm():
    """timm and torchvision's version ("stub": the tests' stand-in, where
    torchvision does not import; no CPU wheel here)."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from torch_libraries import import_timm as timm_with_torchvision

    timm = timm_with_torchvision()
    return timm, getattr(sys.modules["torchvision"], "__version__", "stub")


def device_report(backend):
    """The device this backend computes on and its peak memory so far."""
    report = {"peak_memory_gb": None}
    if backend == "jax":
        import jax

        device = jax.devices()[0]
        report.update(platform=device.platform, device=device.device_kind, jax=jax.__version__)
        stats = device.memory_stats() if device.platform != "cpu" else None
        if stats:
            report["peak_memory_gb"] = stats.get("peak_bytes_in_use", 0) / 1e9
    elif backend == "torch":
        import torch

        if torch.cuda.is_available():
            report.update(platform="gpu", device=torch.cuda.get_device_name(0),
                          peak_memory_gb=torch.cuda.max_memory_allocated() / 1e9)
        else:
            report.update(platform="cpu", device=platform.processor() or "cpu")
        report["torch"] = torch.__version__
    else:
        import tensorflow as tf

        gpus = tf.config.list_logical_devices("GPU")
        report.update(platform="gpu" if gpus else "cpu", tensorflow=tf.__version__,
                      device=gpus[0].name if gpus else "cpu")
        if gpus:
            report["peak_memory_gb"] = tf.config.experimental.get_memory_info(
                "GPU:0")["peak"] / 1e9
    if report["peak_memory_gb"] is None:
        import resource

        report["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return report


def _cpu_peak(n=2048):
    """The CPU's float32 n^3 matmul rate (FLOP/s), the best of the
    frameworks installed here (bench_models' matmul calls: PyTorch's and
    TensorFlow's, JAX's where neither is): on some CPUs TensorFlow's (oneDNN)
    matmul outruns PyTorch's (an AMD EPYC: about 210 against 178 GFLOP/s),
    and a peak below what a step reaches would put its MFU above 100%."""
    import importlib

    calls = {}
    for module, make in (("torch", torch_matmul_call), ("tensorflow", tf_matmul_call)):
        try:
            version = importlib.import_module(module).__version__
        except ImportError:
            continue
        calls[f"{module} {version}"] = make((n, n, n), "float32")
    if not calls:
        import jax

        calls[f"jax {jax.__version__}"] = jax_matmul_call((n, n, n), "float32")
    flop = 2 * n ** 3 * PEAK_CHAIN
    rates = {name: flop / statistics.median(timed_rounds(call, 2, 5, 1))
             for name, call in calls.items()}
    best = max(rates, key=rates.get)
    return {"peak_tflops": rates[best] / 1e12, "peak_shape": f"{n}^3 float32",
            "peak_source": f"{best} (cpu), the best of "
                           + ", ".join(f"{name}: {rate / 1e9:.0f} GFLOP/s"
                                       for name, rate in rates.items())}


def peak_worker(args):
    """The device's matmul peak (FLOP/s): bfloat16 8192^3 on a GPU (PyTorch,
    or JAX where PyTorch is missing), median of 5 timed calls after 2
    warm-ups; on a CPU `_cpu_peak` (2048^3). `--peak-size N`: N^3 instead."""
    try:
        import torch

        if not torch.cuda.is_available():
            return {}, _cpu_peak(args.peak_size or 2048)
        n = args.peak_size or 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

        def call():
            (a @ b).sum().item()

        source = f"torch {torch.__version__} (cuda)"
    except ImportError:
        import jax
        import jax.numpy as jnp

        if jax.devices()[0].platform == "cpu":
            return {}, _cpu_peak(args.peak_size or 2048)
        n = args.peak_size or 8192
        a = jnp.ones((n, n), jnp.bfloat16)
        product = jax.jit(lambda a: (a @ a).sum())

        def call():
            product(a).block_until_ready()

        source = f"jax {jax.__version__}"
    times = timed_rounds(call, 2, 5, 1)
    return {}, {"peak_tflops": 2 * n ** 3 / statistics.median(times) / 1e12,
                "peak_shape": f"{n}^3", "peak_source": source}


WORKERS = {"keras_vit-jax": keras_worker, "keras_vit-tf": keras_worker,
           "keras_vit-torch": keras_worker, "timm-eager": timm_worker,
           "timm-compile": timm_worker, "official-flax": official_flax_worker,
           "peak": peak_worker}


def worker_main(args):
    try:
        timings, result = WORKERS[args.framework](args)
    except ModuleNotFoundError as error:
        result, timings = {"error": f"not installed: {error.name}"}, {}
    except Exception as error:  # noqa: BLE001  the row records any failure
        result, timings = {"error": f"{type(error).__name__}: {str(error)[:300]}"}, {}
    for mode, times in timings.items():
        seconds = statistics.median(times)
        result[mode] = {"ms_per_step": 1e3 * seconds, "images_per_s": args.batch / seconds,
                        "rounds_ms": [round(1e3 * t, 3) for t in times]}
    print("RESULT " + json.dumps(result), flush=True)


# --- driver --------------------------------------------------------------------------

def run_worker(framework, args, model=None, attention="auto"):
    command = [sys.executable, os.path.abspath(__file__), "--worker", framework,
               "--model", model or "tiny", "--batch", str(args.batch),
               "--image-size", str(args.image_size), "--dtype", args.dtype,
               "--attention", attention, "--loop", args.loop, "--steps", str(args.steps),
               "--rounds", str(args.rounds), "--warmup", str(args.warmup),
               "--modes", ",".join(args.modes)]
    if args.profile:
        command += ["--profile", args.profile]
    if args.vit_jax:
        command += ["--vit-jax", args.vit_jax]
    if args.peak_size:
        command += ["--peak-size", str(args.peak_size)]
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after --timeout {args.timeout} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        tail = done.stderr.strip().splitlines()[-3:]
        return {"error": f"worker exited {done.returncode}: {' | '.join(tail)[:400]}"}
    result = json.loads(lines[-1][len("RESULT "):])
    result["worker_seconds"] = round(time.perf_counter() - started, 1)
    return result


def environment():
    info = {"date": time.strftime("%Y-%m-%d"), "python": platform.python_version(),
            "machine": platform.machine(), "cpu": describe()}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if smi.returncode == 0:
            info["gpu"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def step_arguments(parser, model, batch, rounds, rounds_help):
    """The options of the single-step CPU benchmarks (`gelu_train.py`,
    `first_step.py`): --model, --batch, --image-size, --rounds, --json."""
    parser.add_argument("--model", default=model, choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=batch, help="images per step")
    parser.add_argument("--image-size", type=int, default=224, help="pixels, square")
    parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    parser.add_argument("--json", metavar="PATH", help="write the report here")
    return parser


def alternating_processes(variants, command, env, rounds, shown):
    """Two variants' worker, each run in a fresh process per round,
    alternating (AB, then BA, ...); `command(index)` is the command line of
    variant `index`, which prints a JSON line last. Returns {variant: [its
    JSON line of each round]}; prints each run's `shown` (seconds)."""
    runs = {name: [] for name in variants}
    for round_ in range(rounds):
        for index in ((0, 1) if round_ % 2 == 0 else (1, 0)):
            result = subprocess.run(command(index), env=env, capture_output=True, text=True,
                                    check=True)
            runs[variants[index]].append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}: {variants[index]}: "
                  f"{runs[variants[index]][-1][shown]:.2f} s", file=sys.stderr)
    return runs


def medians(runs, key):
    """{variant: the median of `key` over its runs}, to 0.01."""
    return {name: round(statistics.median(run[key] for run in rows), 2)
            for name, rows in runs.items()}


def write_report(report, path):
    """Prints `report` (less its raw `rounds`) and writes it whole to
    `path` (--json) when one is given."""
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=1))
    if path:
        with open(path, "w") as file:
            json.dump(report, file, indent=1)


def spec_peak(gpu):
    """The datasheet's dense bfloat16 peak of the GPU nvidia-smi named, or None."""
    return next((peak for name, peak in SPEC_PEAK_TFLOPS.items() if name in (gpu or "")), None)


def add_mfu(row, spec, image_size, peak_tflops, spec_tflops=None):
    """MFU against the peak measured in the run (`mfu`) and against the
    datasheet's dense bfloat16 peak (`mfu_spec`), where known."""
    for mode in MODES:
        if mode in row and peak_tflops:
            tflops = row[mode]["images_per_s"] * gflop_of(spec, image_size, mode) / 1e3
            row[mode]["tflops"] = tflops
            row[mode]["mfu"] = tflops / peak_tflops
            if spec_tflops:
                row[mode]["mfu_spec"] = tflops / spec_tflops


def _figure(mode_row, key, scale=1, unit=""):
    """A measured figure for the table, blank where the mode was not run."""
    return f"{scale * mode_row[key]:.1f}{unit}" if key in mode_row else ""


def table(report):
    lines = ["| model | framework | attention | train img/s | train MFU (measured peak) "
             "| train MFU (spec peak) | infer img/s | peak memory GB | train ÷ timm "
             "| infer ÷ timm |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for model, rows in report["results"].items():
        # the ratios are against timm compiled where it ran, else timm eager (a CPU)
        peer = rows.get("timm-compile") or rows.get("timm-eager") or {}
        peer_name = "timm-compile" if "timm-compile" in rows else "timm-eager"
        for framework, row in rows.items():
            if "error" in row:
                lines.append(f"| {model} | {framework} | | {row['error']} | | | | | | |")
                continue
            train, infer = row.get("train", {}), row.get("infer", {})
            memory = row.get("peak_memory_gb") or row.get("peak_rss_gb")
            ratios = [f"{mode_row['images_per_s'] / peer[mode]['images_per_s']:.2f}x "
                      f"{peer_name}" if "images_per_s" in mode_row and mode in peer
                      and "images_per_s" in peer[mode] else ""
                      for mode, mode_row in (("train", train), ("infer", infer))]
            lines.append(
                f"| {model} | {framework} | {row.get('attention_ran', '')} "
                f"| {_figure(train, 'images_per_s')} | {_figure(train, 'mfu', 100, '%')} "
                f"| {_figure(train, 'mfu_spec', 100, '%')} "
                f"| {_figure(infer, 'images_per_s')} | {memory or 0:.1f} | {ratios[0]} "
                f"| {ratios[1]} |")
    return "\n".join(lines)


def parse_list(text, allowed, name):
    items = [item for item in text.split(",") if item]
    unknown = [item for item in items if item not in allowed]
    if unknown or not items:
        raise SystemExit(f"--{name}: unknown {unknown or text!r}; allowed: {', '.join(allowed)}")
    return items


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="vit_b16,vit_l16",
                        help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help=f"comma-separated, from {', '.join(FRAMEWORKS)}")
    parser.add_argument("--modes", default="train,infer", help="train, infer or both")
    parser.add_argument("--batch", type=int, default=128, help="images per step")
    parser.add_argument("--image-size", type=int, default=224, help="pixels, square")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES,
                        help="bfloat16: mixed precision (Keras mixed_bfloat16, PyTorch AMP)")
    parser.add_argument("--attention", default="auto",
                        help="keras_vit's attention implementation, comma-separated from "
                             f"{', '.join(ATTENTION)}: a keras_vit row for each")
    parser.add_argument("--loop", default="keras", choices=("keras", "stateless"),
                        help="keras_vit's training loop: keras (train_on_batch) or, on JAX, "
                             "stateless (the same step jitted with its state donated)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (compiling)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per worker")
    parser.add_argument("--json", metavar="PATH", help="write the report here (after each row)")
    parser.add_argument("--peak-size", type=int, metavar="N",
                        help="the peak's matmul is N^3 (default: 8192 on a GPU, 2048 on a CPU)")
    parser.add_argument("--profile", metavar="DIR",
                        help="JAX training steps (keras_vit-jax with --loop stateless, "
                             "official-flax): trace 3 steps into DIR and summarise where "
                             "the device time goes (benchmarks/jax_profile.py)")
    parser.add_argument("--vit-jax", metavar="PATH",
                        help="official-flax: a checkout of google-research/vision_transformer "
                             "(default: $VIT_JAX)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.modes = parse_list(args.modes, MODES, "modes")
    attentions = parse_list(args.attention, ATTENTION, "attention")
    if args.worker:
        args.framework = args.worker
        return worker_main(args)

    models = parse_list(args.models, MODELS, "models")
    frameworks = parse_list(args.frameworks, FRAMEWORKS, "frameworks")
    report = {"environment": environment(), "settings": {
        k: getattr(args, k) for k in ("batch", "image_size", "dtype", "attention", "loop", "steps",
                                      "rounds", "warmup", "modes")}, "results": {}}
    progress(f"accelerator benchmark: {report['environment']}")
    report["peak"] = run_worker("peak", args)
    progress(f"peak: {report['peak']}")
    for model in models:
        rows = report["results"].setdefault(model, {})
        for framework, attention in [(f, a) for f in frameworks
                                     for a in (attentions if f in BACKENDS else ["auto"])]:
            name = framework if len(attentions) == 1 or framework not in BACKENDS \
                else f"{framework} ({attention})"
            progress(f"{model} {name} ...")
            row = run_worker(framework, args, model, attention)
            add_mfu(row, MODELS[model], args.image_size, report["peak"].get("peak_tflops"),
                    spec_peak(report["environment"].get("gpu")))
            rows[name] = row
            progress(f"  {json.dumps(row)}")
            if args.json:
                with open(args.json, "w") as file:
                    json.dump(report, file, indent=1)
    print(table(report))
    return report


if __name__ == "__main__":
    main()
