"""keras_vit: Vision Transformers, R+ViT hybrids and MLP-Mixers for Keras 3,
with the official checkpoints.

>>> import keras_vit
>>> model = keras_vit.ViTB16(weights="imagenet21k+imagenet2012")  # doctest: +SKIP
"""

# How the package loads (two constraints):
#
# - `import keras_vit; keras.saving.load_model("model.keras")` must work in a
#   fresh process, so `import keras_vit` registers every serializable class
#   (layers, ClassifierHead, the WarmupDecay schedule). Registering a Keras
#   class imports Keras, hence TensorFlow (~5 s and its native log lines).
# - `keras-vit --help` (and `keras-vit models`) must not pay for that.
#
# So every public name is resolved on first use (PEP 562 `__getattr__`,
# below; `keras_vit.models` and `keras_vit.weights` do the same), and this
# module then calls `_load_all()` eagerly, which imports and registers
# everything: user code sees the package exactly as before. The single
# exception is the `keras-vit` command: its console script is the top-level
# module `keras_vit_cli`, which runs before this file and sets `LAZY = True`
# (`python -m keras_vit.cli` and `python -m keras_vit` are recognised too).
# Then nothing heavy is imported here; the commands that build or load models
# call `_load_all()` first (after quieting TensorFlow's logging).

import importlib as _importlib
import logging as _logging
import sys as _sys

__version__ = "0.1.0"

# Public name -> module that defines it.
_EXPORTS = {
    **dict.fromkeys(
        ["MLPMixer", "MixerB16", "MixerB32", "MixerL16", "MixerS8", "MixerS16", "MixerS32",
         "R26ViTB32", "R26ViTS32", "R50ViTB16", "R50ViTL32", "RViTTi16", "ViTB16", "ViTB32", "ViTB8",
         "ViTH14", "ViTL16", "ViTL32", "ViTS16", "ViTS32", "ViTTi16", "VisionTransformer",
         "model_from_checkpoint"],
        "keras_vit.models"),
    "decode_predictions": "keras_vit.preprocessing",
    "preprocess_input": "keras_vit.preprocessing",
    **dict.fromkeys(
        ["load_official_weights", "official_manifest", "resize_position_embedding",
         "save_official_weights"],
        "keras_vit.weights"),
}
_SUBMODULES = ("cli", "data", "export", "inspect", "labels", "layers", "models",
               "preprocessing", "training", "weights")
# Modules that register serializable Keras objects (imported by `_load_all`).
_REGISTERING = ("keras_vit.layers", "keras_vit.models.vit", "keras_vit.models.mixer",
                "keras_vit.models.auto", "keras_vit.training.schedules")

__all__ = [
    "MLPMixer", "MixerB16", "MixerB32", "MixerL16", "MixerS8", "MixerS16", "MixerS32",
    "R26ViTB32", "R26ViTS32", "R50ViTB16", "R50ViTL32", "RViTTi16", "ViTB16", "ViTB32",
    "ViTB8", "ViTH14", "ViTL16", "ViTL32", "ViTS16", "ViTS32", "ViTTi16",
    "VisionTransformer", "decode_predictions", "layers",
    "load_official_weights", "model_from_checkpoint", "official_manifest", "preprocess_input",
    "resize_position_embedding", "save_official_weights", "weights",
]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _load_all():
    """Imports the whole public API and registers every serializable class
    (what `import keras_vit` does outside the `keras-vit` command)."""
    for module in _REGISTERING:
        _importlib.import_module(module)
    for name in ("layers", "weights", "preprocessing", "labels"):
        globals()[name] = _importlib.import_module(f"{__name__}.{name}")
    for name in _EXPORTS:
        __getattr__(name)


def _lazy():
    """True when this import is the `keras-vit` command's: its launcher
    `keras_vit_cli` is loading (console script, `python -m keras_vit_cli`),
    or the interpreter was started as `python -m keras_vit.cli` /
    `python -m keras_vit` (runpy imports this package first; meanwhile
    `sys.argv[0]` is still "-m")."""
    if getattr(_sys.modules.get("keras_vit_cli"), "LAZY", False):
        return True
    argv = getattr(_sys, "orig_argv", [])
    if _sys.argv[:1] != ["-m"] or "-m" not in argv:
        return False
    return argv[argv.index("-m") + 1:argv.index("-m") + 2] in (["keras_vit.cli"], ["keras_vit"])


# Head replacement, position-embedding resizing and re-downloads are said in
# INFO lines; show them unless the application configured logging itself.
class _StderrHandler(_logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment (so redirections see it)."""

    def __init__(self):
        super().__init__(_sys.stderr)

    @property
    def stream(self):
        return _sys.stderr

    @stream.setter
    def stream(self, value):
        pass


_logger = _logging.getLogger("keras_vit")
if not _logging.getLogger().handlers and not _logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(_logging.Formatter("keras_vit: %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)

if not _lazy():
    _load_all()
