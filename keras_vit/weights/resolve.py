"""`weights=` argument -> checkpoint arrays, for the model builders."""

import dataclasses
import os

from keras_vit.weights import hub, registry
from keras_vit.weights.download import cached_source, fetch_checkpoint
from keras_vit.weights.architecture import describe
from keras_vit.weights.npz import read_checkpoint
from keras_vit.weights.sniff import sniff_checkpoint

# Names with these endings are files, never registered names: a missing one
# is "not found", not "unknown weights name".
FILE_SUFFIXES = (
    ".npz", ".h5", ".hdf5", ".keras", ".pth", ".pt", ".bin", ".ckpt",
    ".safetensors", ".pkl", ".pickle", ".npy", ".msgpack", ".index",
)


@dataclasses.dataclass
class ResolvedWeights:
    source: str                 # what to call it in messages
    path: str
    params: dict = None         # official arrays (None for .weights.h5)
    info: object = None         # architecture.CheckpointInfo
    keras_weights: bool = False  # a Keras .weights.h5 file
    dropped: tuple = ()         # key prefixes the builder chose not to load
    foreign: object = None      # hub.HubCheckpoint (timm / transformers)

    def arithmetic(self, name, value, default):
        """A builder argument: the user's `value` when given, else the
        checkpoint source's (timm / transformers), else `default`."""
        if value is not None:
            return value
        if self.foreign is not None:
            return self.foreign.arithmetic.get(name, default)
        return default


def resolve_weights(weights, variant, description):
    """Turns `weights` (None, registered name, URL, `hf://` reference,
    local path) into arrays.

    A local file is recognised by its bytes (`sniff_checkpoint`), not its
    name: an official `.npz` gives its arrays, a Keras `.weights.h5` is
    loaded later by `model.load_weights`. An `hf://ORG/NAME` reference, a
    folder in the Hugging Face Hub layout or a `.safetensors` file is read
    by `keras_vit.weights.hub` (timm and transformers formats): its arrays
    mapped to official keys, and its source's arithmetic in `foreign`.

    Returns:
        None for `weights=None`, else a `ResolvedWeights`.

    Raises:
        TypeError: `weights` is not None, a str or a path.
        ValueError: an unknown registered name.
        CheckpointNotFoundError: a path with no file ("Weights file not
            found: 'PATH'.").
        UnsupportedCheckpointError: a file in another format (PyTorch,
            safetensors, a whole Keras model, HTML, ...).
        CorruptCheckpointError: a damaged file (also after one re-download
            of a URL or registered name).
        WeightsDownloadError: a URL, `hf://` reference or registered name
            that cannot be downloaded.
        MissingDependencyError: an `hf://` reference without
            huggingface_hub installed.
    """
    if weights is None:
        return None
    if isinstance(weights, hub.HubCheckpoint):  # read by model_from_checkpoint
        return ResolvedWeights(weights.source, weights.source, weights.params,
                               weights.info(), foreign=weights)
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "`weights` must be None, a registered name or a file path, got "
            f"{type(weights).__name__} {weights!r}."
        )
    weights = os.fspath(weights)
    foreign = hub.resolve_hub(weights)
    if foreign is not None:
        return ResolvedWeights(weights, weights, foreign.params, foreign.info(),
                               foreign=foreign)
    if weights.startswith(("http://", "https://")):
        # One cache entry per URL (its digest in the name); an official
        # bucket URL comes from $KERAS_VIT_MIRROR when that is set.
        path, params = fetch_checkpoint(registry.download_url(weights),
                                        registry.url_cache_name(weights))
        # messages name where the bytes came from (a mirror, an earlier run's)
        return ResolvedWeights(cached_source(weights, path), path, params, describe(params))
    looks_like_path = (
        os.path.exists(weights)
        or weights.lower().endswith(FILE_SUFFIXES)
        or os.sep in weights
        or (os.altsep is not None and os.altsep in weights)
        or weights.startswith("~")
    ) and not weights.startswith(registry.AUGREG_PREFIX)
    if looks_like_path:
        path = os.path.expanduser(weights)
        if sniff_checkpoint(path, name=weights) == "keras_weights":
            return ResolvedWeights(weights, path, keras_weights=True)
        params = read_checkpoint(weights)
        return ResolvedWeights(weights, path, params, describe(params))
    remote = registry.resolve(weights, variant, description)
    path, params = fetch_checkpoint(remote.url, remote.filename)
    return ResolvedWeights(cached_source(weights, path), path, params, describe(params))
