"""The rules for naming the model to run: a named model (`"ViTB16"`) with
`weights`, `"auto"` (the architecture a checkpoint describes) or a `.keras`
file (which holds its own weights). Checked from the names alone, nothing
read or imported (`keras-vit predict` and `explain` check them before
TensorFlow loads; `keras_vit.prediction.build_model` checks them too).
"""

import os

from keras_vit._saving import check_keras_path
from keras_vit.variants import ALL_VARIANTS, unknown_model_message
from keras_vit.weights.sniff import ARCHITECTURE_SUFFIXES


class _Names:
    """How the messages name the arguments: the command's flags, or
    Python's arguments."""

    def __init__(self, flags):
        self.flags = flags
        self.model, self.weights, self.ema, self.auto = (
            ("--model", "--weights", "--weights-ema", "--model auto") if flags
            else ("model", "weights", "ema", "model='auto'"))

    def model_is(self, value, quoted=False):
        """`--model X` (`--model 'X'` when `quoted`) or `model='X'`."""
        return (f"--model {value!r}" if quoted else f"--model {value}") if self.flags \
            else f"model={value!r}"

    def auto_from(self, weights):
        return (f"--model auto --weights {weights}" if self.flags
                else f"model='auto', weights={weights!r}")


def check_model_name(model, flags=False):
    """ValueError (with the closest names) when `model` is neither a named
    model, "auto", nor anything that looks like a file or folder: a
    mistyped name is told before any work.

    >>> check_model_name("ViTTI16", flags=True)
    Traceback (most recent call last):
    ValueError: Unknown --model 'ViTTI16' (did you mean 'ViTTi16'?); named models: ...
    """
    if (model == "auto" or model in ALL_VARIANTS or os.path.splitext(model)[1]
            or os.sep in model or os.path.isdir(model)):
        return
    raise ValueError(unknown_model_message(model, _Names(flags).model,
                                           ", 'auto' or a .keras file"))


def check_model_arguments(model, weights=None, ema=False, images=(), flags=False):
    """ValueError unless `model` (a named model, "auto" or a `.keras` file)
    and `weights` (a registered name, augreg:<file>, URL or path; None for
    a `.keras` file) go together; `ema`: a PyTorch checkpoint's EMA weights
    (not for a `.keras` file). `images`: the image paths of the command, one
    of which may be a `.keras` file given in the wrong place. `flags`: the
    messages name the command's flags (`--model`) instead of the arguments.
    """
    n = _Names(flags)
    if model.endswith(".keras"):
        given = [name for name, value in ((n.weights, weights), (n.ema, ema)) if value]
        if given:  # never ignored (as train refuses --weights-ema for a .keras model)
            raise ValueError(
                f"{' and '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to a named "
                f"model or {n.auto}; {n.model} {model!r} is a .keras file that holds its "
                f"own weights: leave {' and '.join(given)} out.")
        check_keras_path(model, n.model)
        return
    hub_folder = os.path.isfile(os.path.join(model, "config.json"))
    if model.endswith(ARCHITECTURE_SUFFIXES) or hub_folder:
        what = ("an official checkpoint" if model.endswith(".npz") else
                "a Hugging Face Hub folder" if hub_folder else "a checkpoint")
        raise ValueError(f"{n.model} takes a named model (e.g. ViTB16), 'auto' or a .keras "
                         f"file; got {model!r} ({what}: use {n.auto_from(model)}).")
    if model != "auto" and model not in ALL_VARIANTS:
        if os.path.splitext(model)[1] or os.sep in model:
            check_keras_path(model, n.model)
        check_model_name(model, flags)
    given_model = [p for p in images or () if str(p).endswith(".keras")]
    if weights is None and given_model:  # `predict model.keras image.png`
        raise ValueError(f"{given_model[0]!r} is a Keras model file, not an image: give it "
                         f"as {n.model_is(given_model[0])}.")
    if weights is None:
        raise ValueError(f"{n.model_is(model, quoted=True)} "
                         f"needs {n.weights} (a registered name, augreg:<file>, URL or path).")
    if model != "auto":
        return
    _check_auto_weights(weights, n)


def _check_auto_weights(weights, n):
    """`weights` names a checkpoint whose architecture `model="auto"` reads."""
    if weights.startswith(("hf://", "http://", "https://")):  # a URL: an official .npz
        return
    if not weights.endswith(ARCHITECTURE_SUFFIXES) and not os.path.isdir(weights):
        raise ValueError(
            f"{n.auto} reads the architecture from a local official .npz, a "
            "Hugging Face Hub folder (config.json + model.safetensors or "
            "pytorch_model.bin), a .safetensors or PyTorch file (.pth, .pt, .bin, "
            f".ckpt, .pth.tar), hf://ORG/NAME or the http(s) URL of an official .npz; for "
            f"{n.weights} {weights!r} name the model, e.g. {n.model_is('ViTB16')}.")
    if not os.path.exists(weights):
        raise ValueError(f"Checkpoint not found: {weights!r}.")
