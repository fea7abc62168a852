"""`preprocess_input` (a pass-through, as keras.applications' for models
that include their preprocessing), `normalize_pixels` (for models built with
`include_preprocessing=False`) and `decode_predictions` for the official heads.

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


DATA_FORMATS = ("channels_last", "channels_first")


def _checked_data_format(data_format):
    """`data_format` as given ("channels_last" for None: keras_vit models
    are channels-last whatever `keras.config.image_data_format()` says)."""
    if data_format is None:
        return "channels_last"
    if data_format not in DATA_FORMATS:
        raise ValueError(
            f"Unknown data_format={data_format!r}; allowed: None, "
            f"{', '.join(repr(f) for f in DATA_FORMATS)}."
        )
    return data_format


def preprocess_input(x: ArrayLike, data_format: str | None = None, *,
                     mean: Any = None, std: Any = None) -> Any:
    """A pass-through: returns `x` unchanged, as
    `keras.applications.convnext.preprocess_input` does.

    keras_vit models include their preprocessing (`include_preprocessing=
    True`, the default): they take raw RGB pixels in [0, 255] and normalise
    them themselves, with the checkpoint's own mean and std. So the
    keras.applications idiom `model.predict(preprocess_input(x))` gives
    the same predictions as `model.predict(x)`, and normalising here too
    would normalise twice. For a model built with
    `include_preprocessing=False`, use `normalize_pixels`.

    Args:
        x: array or tensor of pixels.
        data_format: None, "channels_last" or "channels_first", as in
            keras.applications (the value is checked, nothing else done).
        mean, std: not accepted: the normalising function is
            `normalize_pixels(x, mean=..., std=...)`; either one given is a
            TypeError that says so.

    Returns:
        `x`, unchanged.

    Example:

    >>> x = np.array([0, 127.5, 255])
    >>> preprocess_input(x) is x
    True
    """
    if mean is not None or std is not None:
        raise TypeError(
            "preprocess_input(x) is a pass-through (keras_vit models normalise "
            "their pixels themselves) and takes no mean or std; to normalise "
            "pixels for a model built with include_preprocessing=False, call "
            "keras_vit.normalize_pixels(x, mean=..., std=...)."
        )
    _checked_data_format(data_format)
    return x


def _channel_values(values, name):
    """`values` (a number or a sequence of per-channel numbers on the [0, 1]
    scale) as a float32 array of shape () or (channels,), checked."""
    array = np.asarray(0.5 if values is None else values, dtype="float64")
    if array.ndim > 1 or array.size == 0 or not np.all(np.isfinite(array)) or (
            name == "std" and not np.all(array > 0)):
        allowed = "positive " if name == "std" else ""
        raise ValueError(
            f"`{name}` must be a finite {allowed}number or a sequence of one "
            f"per channel on the [0, 1] scale (e.g. 0.5, or ImageNet's "
            f"(0.485, 0.456, 0.406)), got {values!r}."
        )
    return array.astype("float32")


def normalize_pixels(x: ArrayLike, data_format: str | None = None, *,
                     mean: float | Sequence[float] | None = None,
                     std: float | Sequence[float] | None = None) -> Any:
    """Normalises raw RGB pixels in [0, 255] as a model built with
    `include_preprocessing=False` expects: `(x / 255 - mean) / std`; by
    default `(x - 127.5) / 127.5`, to [-1, 1] (the official eval
    preprocessing).

    Models built with `include_preprocessing=True` (the default) do this
    themselves: feed them raw pixels (`preprocess_input` is a
    pass-through), never the output of this function.

    Args:
        x: array or tensor of pixels, any numeric dtype.
        data_format: where the channels are: None or "channels_last"
            (`(..., channels)`, the layout keras_vit models take, whatever
            `keras.config.image_data_format()` says), or "channels_first"
            (`(..., channels, height, width)`). Only per-channel `mean` /
            `std` use it.
        mean, std: a number, or one value per channel, on the [0, 1] scale:
            those of weights from timm or transformers, whose
            normalisation is not the official one, e.g.
            `keras_vit.weights.hub.read_hub_checkpoint(path).
            preprocessing["mean"]` (ImageNet: `(0.485, 0.456, 0.406)`,
            `(0.229, 0.224, 0.225)`). None: 0.5, the official form.

    Returns:
        float32 NumPy array for NumPy input, else a float32 backend tensor.

    Example:

    >>> normalize_pixels(np.array([0, 127.5, 255]))
    array([-1.,  0.,  1.], dtype=float32)
    """
    data_format = _checked_data_format(data_format)
    is_numpy = isinstance(x, (np.ndarray, list, tuple, int, float, np.number))
    if mean is None and std is None:
        if is_numpy:
            x = np.asarray(x, dtype="float32")
            return (x - np.float32(127.5)) / np.float32(127.5)
        x = ops.cast(x, "float32")
        return (x - 127.5) / 127.5
    mean, std = _channel_values(mean, "mean"), _channel_values(std, "std")
    channels = max(mean.size, std.size)
    if mean.ndim and std.ndim and mean.size != std.size:
        raise ValueError(
            f"`mean` has {mean.size} values and `std` {std.size}; give one "
            "per channel for both, or a single number."
        )
    shift, scale = np.float32(255) * mean, np.float32(255) * std
    x = np.asarray(x, dtype="float32") if is_numpy else ops.cast(x, "float32")
    if mean.ndim or std.ndim:
        axis = -1 if data_format == "channels_last" else -3
        shape = tuple(x.shape)
        if len(shape) < -axis or shape[axis] not in (None, channels):
            raise ValueError(
                f"Pixels of shape {shape} have no {data_format} channel axis of "
                f"{channels} for the {channels} per-channel `mean`/`std` values; "
                "pass images of that many channels, or the right data_format."
            )
        if axis == -3:
            shift, scale = shift.reshape(-1, 1, 1), scale.reshape(-1, 1, 1)
    return (x - shift) / scale


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
