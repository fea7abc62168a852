"""The argument checks of the keras.applications shell, shared by every
model family (`models/vit.py`, `models/mixer.py`) before anything is
built: `classes`, `pooling`, `remat`, and the `features_only` arguments
(`out_indices`, `feature_format`), each refused in one sentence that names
the value and the allowed ones. `application.build_application` builds
from the checked values.
"""

import numbers

import keras

from keras_vit import _checks
from keras_vit.layers.features import FEATURE_FORMATS


def check_classes(classes):
    return _checks.positive_int(classes, "classes", or_none=True)


# keras.applications' `pooling=`: the backbone's feature vector, a global
# average / maximum over the patch tokens after the final LayerNorm (class
# token left out), without pre_logits. Every model family takes them.
FEATURE_POOLINGS = ("avg", "max")
# The poolings after which a model's pre_logits layer (when it has one) is
# applied, as the official model with `num_classes=0`.
PRE_LOGITS_POOLINGS = ("token", "gap")


def check_pooling(pooling, include_top, allowed):
    """`pooling` if allowed with `include_top`; `allowed`: the model's own
    poolings (its classifiers), to which `FEATURE_POOLINGS` are added."""
    allowed = (None, *allowed, *(p for p in FEATURE_POOLINGS if p not in allowed))
    if include_top:
        if pooling is not None:
            raise ValueError(
                f"`pooling={pooling!r}` is only used with include_top=False; "
                "with the head the model pools as its classifier says. "
                f"Allowed with include_top=False: {allowed}."
            )
        return None
    if pooling not in allowed:
        raise ValueError(
            f"Unknown `pooling={pooling!r}`. Allowed: {allowed}."
        )
    return pooling


# The Keras backends that train, hence rematerialise (`keras.remat`); numpy
# and openvino run inference only, and their `keras.remat` is a no-op.
REMAT_BACKENDS = ("tensorflow", "jax", "torch")


def check_remat(remat):
    """`remat` as a bool; True on a backend that does not train is a
    ValueError naming it."""
    remat = _checks.boolean(remat, "remat")
    backend = keras.backend.backend()
    if remat and backend not in REMAT_BACKENDS:
        raise ValueError(
            f"remat=True rematerialises the blocks in training, and the Keras backend "
            f"{backend!r} does not train; use one of {REMAT_BACKENDS} "
            "(KERAS_BACKEND), or remat=False.")
    return remat


# timm's default `out_indices` for ViTs and Mixers: the last 3 blocks.
DEFAULT_FEATURE_BLOCKS = 3


def check_feature_args(features_only, out_indices, feature_format, num_blocks, **head):
    """`(block indices, feature_format)` for `features_only=True`, else
    `(None, None)`; `head`: the head arguments the user gave (`pooling`,
    `classes`, `representation_size`), each refused when not None with
    `features_only=True` (no head is built), as `out_indices` and
    `feature_format` are without it.

    >>> check_feature_args(True, (0, -1), None, 4)
    ((0, 3), 'nhwc')
    """
    if not _checks.boolean(features_only, "features_only"):
        for name, value in (("out_indices", out_indices), ("feature_format", feature_format)):
            if value is not None:
                raise ValueError(f"`{name}={value!r}` is only used with features_only=True.")
        return None, None
    for name, value in head.items():
        if value is not None:
            raise ValueError(
                f"features_only=True returns the blocks' outputs and builds no head; "
                f"`{name}={value!r}` belongs to the head or its pooling. Leave it out.")
    feature_format = "nhwc" if feature_format is None else feature_format
    if feature_format not in FEATURE_FORMATS:
        raise ValueError(
            f"Unknown feature_format={feature_format!r}; allowed: {FEATURE_FORMATS}.")
    return block_indices(out_indices, num_blocks), feature_format


def block_indices(out_indices, num_blocks):
    """timm's `out_indices` as absolute block indices, in the order given:
    None: the last `DEFAULT_FEATURE_BLOCKS` blocks (all of them when there
    are fewer); an int n: the last n blocks; a sequence: those blocks,
    negative indices counted from the end.

    >>> block_indices(2, 12), block_indices((3, -1), 12)
    ((10, 11), (3, 11))
    """
    allowed = (f"an int n from 1 to {num_blocks} (the last n blocks) or a sequence of "
               f"block indices from {-num_blocks} to {num_blocks - 1} (negative: from "
               "the end)")

    def is_int(value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if out_indices is None:
        last = min(DEFAULT_FEATURE_BLOCKS, num_blocks)
        return tuple(range(num_blocks - last, num_blocks))
    if is_int(out_indices):
        if not 1 <= out_indices <= num_blocks:
            raise ValueError(f"`out_indices={out_indices!r}` is out of range for "
                             f"{num_blocks} blocks; allowed: {allowed}.")
        return tuple(range(num_blocks - int(out_indices), num_blocks))
    if not isinstance(out_indices, (tuple, list)) or not all(map(is_int, out_indices)):
        raise TypeError(f"`out_indices` must be {allowed}, got {out_indices!r}.")
    if not out_indices:
        raise ValueError(f"`out_indices` is empty; allowed: {allowed}.")
    chosen = []
    for index in out_indices:
        if not -num_blocks <= index < num_blocks:
            raise ValueError(f"`out_indices={out_indices!r}`: {index} is out of range for "
                             f"{num_blocks} blocks; allowed: {allowed}.")
        block = int(index) % num_blocks
        if block in chosen:
            raise ValueError(f"`out_indices={out_indices!r}` names block {block} twice "
                             f"({num_blocks} blocks); each block can be one output.")
        chosen.append(block)
    return tuple(chosen)
