"""`weights=` argument -> checkpoint arrays, for the model builders."""

import dataclasses
import os

from keras_vit.weights import registry
from keras_vit.weights.download import fetch_checkpoint
from keras_vit.weights.official import describe, read_checkpoint


@dataclasses.dataclass
class ResolvedWeights:
    source: str                 # what to call it in messages
    path: str
    params: dict = None         # official arrays (None for .weights.h5)
    info: object = None         # official.CheckpointInfo
    keras_weights: bool = False  # a Keras .weights.h5 file
    dropped: tuple = ()         # key prefixes the builder chose not to load


def resolve_weights(weights, variant, description):
    """Turns `weights` (None, registered name, URL, local path) into arrays.

    Returns None for `weights=None`. Raises ValueError for unknown names or
    missing files, TypeError for a non-string.
    """
    if weights is None:
        return None
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "`weights` must be None, a registered name or a file path, got "
            f"{type(weights).__name__} {weights!r}."
        )
    weights = os.fspath(weights)
    if weights.startswith(("http://", "https://")):
        filename = "url--" + os.path.basename(weights.split("?")[0])
        path, params = fetch_checkpoint(weights, filename)
        return ResolvedWeights(weights, path, params, describe(params))
    looks_like_path = (
        os.path.exists(weights)
        or weights.endswith((".npz", ".h5"))
        or os.sep in weights
    ) and not weights.startswith(registry.AUGREG_PREFIX)
    if looks_like_path:
        path = os.path.expanduser(weights)
        if not os.path.isfile(path):
            raise ValueError(f"Weights file not found: {weights!r}.")
        if path.endswith(".h5"):
            return ResolvedWeights(weights, path, keras_weights=True)
        params = read_checkpoint(path)
        return ResolvedWeights(weights, path, params, describe(params))
    remote = registry.resolve(weights, variant, description)
    path, params = fetch_checkpoint(remote.url, remote.filename)
    return ResolvedWeights(f"{weights!r} ({remote.url})", path, params, describe(params))
