"""keras_vit: Vision Transformers, R+ViT hybrids and MLP-Mixers for Keras 3,
with the official checkpoints.

>>> import keras_vit
>>> model = keras_vit.ViTB16(weights="imagenet21k+imagenet2012")  # downloads  # doctest: +SKIP
>>> tiny = keras_vit.VisionTransformer(  # an architecture of your own, no weights
...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
...     input_shape=(32, 32, 3), classes=10)
>>> tiny.output_shape
(None, 10)
"""

# How the package loads (two constraints):
#
# - `import keras_vit; keras.saving.load_model("model.keras")` must work in a
#   fresh process, so `import keras_vit` registers every serializable class
#   (layers, ClassifierHead, the WarmupDecay schedule). Registering a Keras
#   class imports Keras, hence TensorFlow (~5 s and its native log lines).
# - `keras-vit --help` (and `keras-vit models`) must not pay for that.
#
# So every public name is resolved on first use (PEP 562 `__getattr__`, made
# by `_lazy.attach` as for `keras_vit.models`, `.weights` and `.training`),
# and this module then calls `_load_all()` eagerly (`_load_quietly`: the
# native log lines filtered out), which imports and registers everything:
# user code sees the package exactly as before. The single
# exception is the `keras-vit` command: its console script is the top-level
# module `keras_vit_cli`, which runs before this file and sets `LAZY = True`
# (`python -m keras_vit.cli` and `python -m keras_vit` are recognised too).
# Then nothing heavy is imported here; the commands that build or load models
# call `_load_all()` first (after quieting TensorFlow's logging).

import importlib as _importlib
import logging as _logging
import os as _os
import sys as _sys

from keras_vit import _console
from keras_vit._lazy import attach as _attach
from keras_vit.variants import ALL_VARIANTS as _VARIANTS

__version__ = "0.1.0"

# Public name -> submodule that defines it: the named models of the variants
# table, the builders, preprocessing and the official-weights helpers.
_EXPORTS = {
    **dict.fromkeys([*_VARIANTS, "MLPMixer", "VisionTransformer", "model_from_checkpoint"],
                    "models"),
    "decode_predictions": "preprocessing",
    "normalize_pixels": "preprocessing",
    "preprocess_input": "preprocessing",
    **dict.fromkeys(
        ["load_official_weights", "official_manifest", "resize_position_embedding",
         "save_official_weights"],
        "weights"),
}
_SUBMODULES = ("cli", "data", "export", "inspect", "labels", "layers", "models",
               "prediction", "preprocessing", "training", "weights")
# Modules that register serializable Keras objects (imported by `_load_all`).
_REGISTERING = ("keras_vit.layers", "keras_vit.models.vit", "keras_vit.models.mixer",
                "keras_vit.models.auto", "keras_vit.training.schedules",
                "keras_vit.training.layer_decay")

__getattr__, __dir__, __all__ = _attach(__name__, _EXPORTS, extra=["layers", "weights"],
                                        submodules=_SUBMODULES)


def _load_all():
    """Imports the whole public API and registers every serializable class
    (what `import keras_vit` does outside the `keras-vit` command)."""
    for module in _REGISTERING:
        _importlib.import_module(module)
    for name in ("layers", "weights", "preprocessing", "labels"):
        globals()[name] = _importlib.import_module(f"{__name__}.{name}")
    for name in _EXPORTS:
        __getattr__(name)


def _load_quietly():
    """`_load_all()` with the lines TensorFlow's and jaxlib's native runtimes
    write to file descriptor 2 while they load (absl's "All log messages
    before absl::InitializeLog()" banner, the `I0000`/`E0000` lines of
    oneDNN, the CUDA stubs, the CPU feature guard) dropped, as the
    `keras-vit` command drops them (`_console.filtered_stderr`): so
    `import keras_vit` prints nothing. TensorFlow's devices are listed in
    the same block (`tf.config.list_physical_devices`, which starts no
    runtime: a strategy or a logical-device split can still come after), so
    a machine without a GPU says its `cuInit` error there rather than at
    the first operation. Only this block is filtered, and no logging level
    or environment variable is set: the user's own TensorFlow logging
    settings rule everything after it, and with `TF_CPP_MIN_LOG_LEVEL=0` set
    explicitly nothing is filtered at all."""
    if _os.environ.get("TF_CPP_MIN_LOG_LEVEL", "").strip() == "0":
        _load_all()
        return
    with _console.filtered_stderr():
        _load_all()
        tf = _sys.modules.get("tensorflow")  # the TensorFlow backend (not JAX's, torch's)
        if tf is not None:
            tf.config.list_physical_devices()


def _imported_by_the_command():
    """True when this import is the `keras-vit` command's: its launcher
    `keras_vit_cli` is loading (console script, `python -m keras_vit_cli`),
    or the interpreter was started as `python -m keras_vit.cli` /
    `python -m keras_vit` (runpy imports this package first; meanwhile
    `sys.argv[0]` is still "-m"), or as `python -m keras_vit.export`."""
    if getattr(_sys.modules.get("keras_vit_cli"), "LAZY", False):
        return True
    return _run_module() in ("keras_vit.cli", "keras_vit", "keras_vit.export")


def _run_module():
    """The module of `python -m MODULE` while runpy imports its packages
    (this one first), else None."""
    argv = getattr(_sys, "orig_argv", [])
    if _sys.argv[:1] != ["-m"] or "-m" not in argv:
        return None
    return next(iter(argv[argv.index("-m") + 1:]), None)


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

    def emit(self, record):
        # A library imported later may configure the root logger
        # (`logging.warning(...)` calls `basicConfig`; TensorFlow's SavedModel
        # writer does): the record would then come twice, "keras_vit: ..."
        # and "WARNING:keras_vit:...". The root's handler shows it alone.
        if not _root_shows(record):
            super().emit(record)


def _root_shows(record):
    """Whether `record` propagates to a root handler writing to the terminal."""
    logger = _logging.getLogger(record.name)
    while logger.parent is not None:
        if not logger.propagate:
            return False
        logger = logger.parent
    return any(isinstance(h, _logging.StreamHandler) and not isinstance(h, _StderrHandler)
               and getattr(h, "stream", None) in (_sys.stderr, _sys.__stderr__,
                                                  _sys.stdout, _sys.__stdout__)
               and record.levelno >= h.level for h in logger.handlers)


_logger = _logging.getLogger("keras_vit")
if not _logging.getLogger().handlers and not _logger.handlers:
    _handler = _StderrHandler()
    _handler.setFormatter(_logging.Formatter("keras_vit: %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)

if not _imported_by_the_command():
    _load_quietly()
elif _run_module() == "keras_vit.export":
    # `python -m keras_vit.export FILE.tflite` is a command too: quiet as
    # `keras-vit`, before keras_vit.export (runpy imports it next) imports
    # TensorFlow, whose start-up lines are filtered out here.
    _console.quiet()
    _console.load_tensorflow()
