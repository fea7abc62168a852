"""Whether a reduced precision is native on this CPU, or emulated (and
slow): `train` and `keras-vit predict` log one warning per process when a
model computes in bfloat16 or float16 on a CPU without the instructions
for it.

A CPU without avx512_bf16 / AMX (most AVX-512 and all AVX2 parts) runs
bfloat16 matrix products in software: `mixed_bfloat16` there trains several
times slower than float32 (issue #29 measured 4.4x on an AVX-512 CPU
without avx512_bf16, in keras_vit and in timm alike). float16 likewise needs
avx512_fp16 or AMX-FP16.

Loads nothing heavy: Keras and the backend are imported by the one function
that asks where the backend runs.
"""

import logging

logger = logging.getLogger("keras_vit")

# The /proc/cpuinfo flags that make each reduced dtype native: x86 ("flags"),
# then ARM ("Features": the BF16 and half-precision SIMD instructions).
NATIVE_FLAGS = {
    "bfloat16": ("avx512_bf16", "amx_bf16", "bf16"),
    "float16": ("avx512_fp16", "amx_fp16", "asimdhp"),
}
_warned = set()  # holds True once this process has warned


def cpu_flags(path="/proc/cpuinfo"):
    """The flags of the first CPU in `path` (x86 `flags`, ARM `Features`), as
    a frozenset; None when they cannot be read (no /proc: not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        return None
    return None


def emulated_message(policy, flags, advice=""):
    """The warning for dtype policy `policy` (a name: "mixed_bfloat16",
    "bfloat16", "mixed_float16", "float16", "float32"...) on a CPU with
    `flags` (`cpu_flags()`), or None when its compute dtype is native there,
    float32, or the flags are unknown (None). `advice` ends the sentence.

    >>> print(emulated_message("mixed_bfloat16", frozenset({"avx2", "avx512f"})))
    ... # doctest: +NORMALIZE_WHITESPACE
    mixed_bfloat16 is emulated on this CPU (its flags in /proc/cpuinfo have none
    of avx512_bf16, amx_bf16, bf16): bfloat16 math runs in software, several
    times slower than float32.
    >>> emulated_message("mixed_bfloat16", frozenset({"avx512f", "avx512_bf16"})) is None
    True
    """
    dtype = next((d for d in NATIVE_FLAGS if str(policy).endswith(d)), None)
    if dtype is None or flags is None or flags & set(NATIVE_FLAGS[dtype]):
        return None
    return (f"{policy} is emulated on this CPU (its flags in /proc/cpuinfo have none of "
            f"{', '.join(NATIVE_FLAGS[dtype])}): {dtype} math runs in software, several "
            f"times slower than float32{advice}.")


def backend_runs_on_cpu():
    """Whether Keras' backend computes on the CPU here (no GPU or TPU that
    it would use; `keras_vit.layers.fused.accelerator`)."""
    # here, not at the top: keras_vit.cli imports this module, and fused loads Keras
    from keras_vit.layers.fused import accelerator

    return accelerator() == "cpu"


def warn_if_emulated(policy, advice="", flags=None):
    """Logs `emulated_message(policy, ...)` (a warning, once per process)
    when the backend runs on the CPU and that CPU lacks the
    instructions of `policy`'s compute dtype; reads /proc/cpuinfo only
    then (`flags`: given instead, for the tests). Returns the message or
    None."""
    policy = str(getattr(policy, "name", policy))
    if not policy.endswith(tuple(NATIVE_FLAGS)) or not backend_runs_on_cpu():
        return None
    message = emulated_message(policy, cpu_flags() if flags is None else flags, advice)
    if message and not _warned:
        _warned.add(True)
        logger.warning(message)
    return message


def compute_policy(model):
    """The name of the reduced-precision dtype policy `model`'s weighted
    layers compute in ("mixed_bfloat16", ...), else its own policy's name."""
    names = {layer.dtype_policy.name for layer in model.layers if layer.weights}
    return next((n for n in sorted(names) if n.endswith(tuple(NATIVE_FLAGS))),
                model.dtype_policy.name)
