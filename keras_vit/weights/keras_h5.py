"""Keras `.weights.h5` files of keras_vit models: `weights=path` for a file
that `model.save_weights` wrote (told by its bytes, `sniff_checkpoint`).

Such a file holds the arrays of one architecture under Keras' layer paths
and says nothing else: the builder is given the architecture, and loading
checks that the file holds exactly the arrays the model saves before Keras
reads it (Keras' `load_weights` reads the entries the model asks for and
says nothing about the others).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile

import h5py
import keras
import numpy as np

from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.npz import as_not_npz, keras_weights_error
from keras_vit.weights.official import _check_finite, _fmt


@dataclasses.dataclass(kw_only=True)
class KerasWeightsFile(Checkpoint):
    """A Keras `.weights.h5` of a keras_vit model, not read until `load`.

    Example:

    ```python
    model.save_weights("fine_tuned.weights.h5")
    keras_vit.ViTB16(classes=10, weights="fine_tuned.weights.h5")
    ```
    """

    format: str = "keras"

    def info(self) -> None:
        return None

    def model_config(self) -> tuple[str, dict]:
        raise as_not_npz(keras_weights_error(self.source), self.source)

    def load(self, model: keras.Model, dropped: tuple[str, ...] = ()) -> int:
        """`model.load_weights` after `check_keras_weights`: Keras picks its
        reader by the name, so a file not named `*.weights.h5` is read
        through a link (or copy) that is."""
        check_keras_weights(model, self.path)
        if self.path.endswith(".weights.h5"):
            model.load_weights(self.path)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                link = os.path.join(tmp, "model.weights.h5")
                try:
                    os.symlink(os.path.abspath(self.path), link)
                except OSError:
                    shutil.copyfile(self.path, link)
                model.load_weights(link)
        return len(model.weights)


def _h5_arrays(path):
    """{dataset path: (shape, dtype)} of a Keras weights file (its optimizer
    aside)."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, (item.shape, item.dtype))
                     if isinstance(item, h5py.Dataset) else None)
    return {k: v for k, v in arrays.items() if not k.startswith("optimizer/")}


def _check_values(path, found, wanted):
    """Each array of the file of the model's kind of number (a string or
    object array is no weight), and each float array finite."""
    for key in sorted(found):
        dtype, own = found[key][1], wanted[key][1]
        if dtype.kind not in "biuf" or (dtype.kind == "f") != (own.kind == "f"):
            raise CorruptCheckpointError(
                f"The Keras weights file {path!r} holds array {key!r} as {dtype}, where the "
                f"model's is {own}: it was not written by model.save_weights of this model "
                "(load the weights of the model that wrote it).")
    with h5py.File(path, "r") as f:
        for key in sorted(found):
            if found[key][1].kind == "f":
                _check_finite(np.asarray(f[key][()], dtype="float32"), repr(path), key)


def check_keras_weights(model: keras.Model, path: str) -> None:
    """A CheckpointMismatchError unless the Keras weights file at `path`
    holds exactly the arrays `model` saves (same paths, same shapes): a
    deeper model's file would otherwise load into a shallower one. The
    model's own layout is what `model.save_weights` writes. Then a
    CorruptCheckpointError for an array of another kind of number (a
    string array) or a float array holding NaN or infinities."""
    with tempfile.TemporaryDirectory() as tmp:
        own = os.path.join(tmp, "own.weights.h5")
        model.save_weights(own)
        wanted = _h5_arrays(own)
    found = _h5_arrays(path)
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    misshaped = sorted(f"{k}: file {found[k][0]}, model {wanted[k][0]}"
                       for k in set(wanted) & set(found) if found[k][0] != wanted[k][0])
    if missing or unexpected or misshaped:
        parts = [f"{len(x)} {what} ({_fmt(x, 5)})" for x, what in (
            (unexpected, "arrays in the file that the model does not have"),
            (missing, "arrays of the model missing from the file"),
            (misshaped, "arrays of another shape")) if x]
        raise CheckpointMismatchError(
            f"The Keras weights file {path!r} does not fit {model.name!r} (written by "
            f"another architecture, e.g. another depth or width): {'; '.join(parts)}. "
            "Load it into the model that wrote it (same variant and options).",
            missing=missing, unexpected=unexpected, misshaped=misshaped, source=path,
            model_name=model.name)
    _check_values(path, found, wanted)
