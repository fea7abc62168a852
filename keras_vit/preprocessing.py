"""`preprocess_input` and `decode_predictions` for the official heads.

Label files (the ones the official colabs and BiT use), downloaded into the
Keras cache on first use like the weights (`KERAS_VIT_MIRROR` applies):

- ImageNet-1k: `bit_models/ilsvrc2012_wordnet_lemmas.txt` (1000 lines),
- ImageNet-21k: `bit_models/imagenet21k_wordnet_lemmas.txt` (21843 lines)
  and `bit_models/imagenet21k_wordnet_ids.txt` (WordNet ids).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from keras import ops

from keras_vit import _checks
from keras_vit.weights import registry
from keras_vit.weights.download import fetch

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

LABEL_FILES = {
    1000: "bit_models/ilsvrc2012_wordnet_lemmas.txt",
    21843: "bit_models/imagenet21k_wordnet_lemmas.txt",
}
_cache = {}


def preprocess_input(x: ArrayLike, mean: float | Sequence[float] | None = None,
                     std: float | Sequence[float] | None = None) -> Any:
    """Maps raw RGB pixels in [0, 255] to [-1, 1]: `(x - 127.5) / 127.5`.

    The official eval preprocessing. Models built with
    `include_preprocessing=True` (the default) do this themselves; use this
    function for models built with `include_preprocessing=False`.

    Args:
        x: array or tensor of pixels, any shape, any numeric dtype
            (channels last).
        mean, std: per-channel values on the [0, 1] scale for weights from
            timm or transformers whose normalisation is not the official
            one, e.g. `keras_vit.weights.hub.read_hub_checkpoint(path).
            preprocessing["mean"]` (ImageNet: `(0.485, 0.456, 0.406)`,
            `(0.229, 0.224, 0.225)`); then `(x / 255 - mean) / std`.
            None: 0.5, the official form.

    Returns:
        float32 NumPy array for NumPy input, else a float32 backend tensor.

    Example:

    >>> preprocess_input(np.array([0, 127.5, 255]))
    array([-1.,  0.,  1.], dtype=float32)
    """
    if mean is not None or std is not None:
        mean = np.broadcast_to(np.asarray(0.5 if mean is None else mean, "float32"), (3,))
        std = np.broadcast_to(np.asarray(0.5 if std is None else std, "float32"), (3,))
        shift, scale = np.float32(255) * mean, np.float32(255) * std
        if isinstance(x, (np.ndarray, list, tuple, int, float)):
            return (np.asarray(x, dtype="float32") - shift) / scale
        return (ops.cast(x, "float32") - shift) / scale
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        x = np.asarray(x, dtype="float32")
        return (x - np.float32(127.5)) / np.float32(127.5)
    x = ops.cast(x, "float32")
    return (x - 127.5) / 127.5


def class_names(num_classes: int) -> list[str]:
    """The label list of a 1000- or 21843-class official head."""
    if num_classes not in LABEL_FILES:
        raise ValueError(
            f"No label file for a {num_classes}-class head; registered: "
            f"{sorted(LABEL_FILES)} (ImageNet-1k, ImageNet-21k). Pass "
            "`labels=[...]` with your class names."
        )
    if num_classes not in _cache:
        stem = LABEL_FILES[num_classes]
        url = f"{registry.base_url()}/{stem}"
        path = fetch(url, "labels--" + stem.split("/")[-1],
                     hint=f"download {url} and pass labels=[...] read from it")
        with open(path, encoding="utf-8") as f:
            names = [line.rstrip("\n") for line in f if line.strip()]
        if len(names) != num_classes:
            raise ValueError(
                f"Label file {path} has {len(names)} names, expected "
                f"{num_classes}; delete it to download it again."
            )
        _cache[num_classes] = names
    return _cache[num_classes]


def decode_predictions(preds: ArrayLike, top: int = 5, labels: Sequence[str] | None = None
                       ) -> list[list[tuple[int, str, float]]]:
    """Decodes a batch of class scores into `(index, name, score)` tuples.

    Args:
        preds: `(batch, classes)` probabilities or logits.
        top: how many classes per image.
        labels: optional list of class names; by default the ImageNet-1k or
            ImageNet-21k names, chosen by the number of classes.

    Returns:
        One list per image of `(class_index, class_name, score)`, best first.

    Example:

    >>> decode_predictions(np.array([[0.1, 0.7, 0.2]]), top=2,
    ...                    labels=["cat", "dog", "fox"])
    [[(1, 'dog', 0.7), (2, 'fox', 0.2)]]
    """
    preds = np.asarray(ops.convert_to_numpy(preds))
    if preds.ndim != 2:
        raise ValueError(
            f"`preds` must be a 2-D (batch, classes) array, got shape {preds.shape}."
        )
    top = _checks.positive_int(top, "top")
    if labels is None:
        labels = class_names(preds.shape[1])
    elif len(labels) != preds.shape[1]:
        raise ValueError(
            f"`labels` has {len(labels)} names but `preds` has {preds.shape[1]} "
            "classes."
        )
    results = []
    for row in preds:
        order = np.argsort(-row, kind="stable")[:top]
        results.append([(int(i), labels[i], float(row[i])) for i in order])
    return results
