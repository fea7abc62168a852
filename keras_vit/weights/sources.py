"""The ways in for weights (`keras_vit.weights.resolve`): `resolve(weights)` -> a `Checkpoint`.

`resolve` decides once what `weights` is and hands it to that source's
reader; every reader returns a `keras_vit.weights.checkpoint.Checkpoint`
(the parameters under official names, the arithmetic, preprocessing and
class names), and no file is opened again after it:

| `weights`                            | source                                  |
|--------------------------------------|-----------------------------------------|
| None                                 | none (random initialisation)            |
| a `Checkpoint`                       | itself (read already)                   |
| `"hf://ORG/NAME[@REV]"`              | the Hugging Face Hub (`hub_layout`)     |
| `"http(s)://..."`                    | a download, cached (`weights.download`) |
| a path (exists, has a separator or a | a local file or Hub folder, told by its |
| checkpoint suffix, starts with `~`)  | bytes (`read_local`): an official       |
|                                      | `.npz`, a Keras `.weights.h5`, a timm / |
|                                      | transformers `.safetensors` or PyTorch  |
|                                      | file (`weights.pytorch`)                |
| anything else                        | a registered name (`weights.registry`)  |
"""

from __future__ import annotations

import os
import reprlib

from keras_vit import _checks
from keras_vit.errors import UnsupportedCheckpointError
from keras_vit.weights import hub, hub_layout, registry
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.cache import cached_source
from keras_vit.weights.download import fetch_checkpoint
from keras_vit.weights.keras_h5 import KerasWeightsFile
from keras_vit.weights.npz import as_not_npz, read_npz
from keras_vit.weights.pytorch import ema_error
from keras_vit.weights.sniff import FILE_SUFFIXES, sniff_checkpoint
from keras_vit.variants import Variant


def resolve(weights: str | os.PathLike | Checkpoint | None, variant: Variant | None = None,
            description: str = "this model", ema: bool = False) -> Checkpoint | None:
    """Turns `weights` (None, a registered name, a URL, an `hf://`
    reference, a local path, or a `Checkpoint` read already) into a
    `Checkpoint`.

    A local file is recognised by its bytes (`sniff_checkpoint`), not its
    name: an official `.npz` is read into arrays, a Keras `.weights.h5` is
    read by `model.load_weights` when the model is built. An `hf://ORG/NAME`
    reference, a folder in the Hugging Face Hub layout or a `.safetensors`
    file is read by `keras_vit.weights.hub` (timm and transformers formats).

    Args:
        weights: what the user passed as `weights=`.
        variant: the named variant being built (None: an architecture that
            is no named variant); registered names depend on it.
        description: the model's name in messages (`"ViT-B_16"`).
        ema: read the EMA weights of a PyTorch training checkpoint
            (`state_dict_ema` / `model_ema`) instead of its weights.

    Returns:
        None for `weights=None`, else a `Checkpoint`.

    Raises:
        TypeError: `weights` is not None, a str, a path or a `Checkpoint`.
        ValueError: an unknown registered name; `ema=True` for weights that
            are not a PyTorch training checkpoint.
        CheckpointNotFoundError: a path with no file ("Weights file not
            found: 'PATH'.").
        UnsupportedCheckpointError: a file in another format (PyTorch, a
            whole Keras model, HTML, ...); under a `.npz` name a
            `NotAnNpzError`.
        CorruptCheckpointError: a damaged file (also after one re-download
            of a URL or registered name).
        WeightsDownloadError: a URL, `hf://` reference or registered name
            that cannot be downloaded.
        MissingDependencyError: an `hf://` reference without
            huggingface_hub installed.

    Example:

    ```python
    checkpoint = resolve("ViT-B_16.npz")
    checkpoint.format, checkpoint.info().classes   # ("official", 21843)
    ```
    """
    ema = _checks.boolean(ema, "ema")
    if weights is None or isinstance(weights, Checkpoint):
        if ema:
            raise ValueError(
                "ema=True picks the EMA weights when a PyTorch training checkpoint is "
                + ("read; this Checkpoint is read already (pass ema=True to "
                   "keras_vit.weights.resolve)." if weights else "read; weights is None."))
        return weights
    if not isinstance(weights, (str, os.PathLike)):
        raise TypeError(
            "`weights` must be None, a registered name or a file path, got "
            f"{type(weights).__name__} {weights!r}."
        )
    weights = os.fspath(weights)
    kind = where(weights)
    if ema and kind in ("url", "name"):
        raise ema_error(weights, "an official checkpoint")
    return _SOURCES[kind](weights, variant, description, ema)


def where(weights: str) -> str:
    """What `weights` (a str, as `resolve` reads it) names: "hf" (an
    `hf://` reference), "url" (an official `.npz` to download), "path" (a
    local file or folder) or "name" (a registered name)."""
    if hub_layout.is_hub_uri(weights):
        return "hf"
    if weights.startswith(("http://", "https://")):
        return "url"
    return "path" if _looks_like_path(weights) else "name"


def _from_hub(weights, variant, description, ema):
    return hub.read_hub_checkpoint(hub_layout.download(weights), source=weights, ema=ema)


def _from_path(weights, variant, description, ema):
    return read_local(weights, ema=ema)


def _from_url(weights, variant, description, ema):
    # One cache entry per URL (its digest in the name); an official
    # bucket URL comes from $KERAS_VIT_MIRROR when that is set.
    return _fetched(weights, registry.download_url(weights), registry.url_cache_name(weights))


def _from_registry(weights, variant, description, ema):
    remote = registry.lookup(weights, variant, description)
    return _fetched(weights, remote.url, remote.filename)


# What `weights` names (`where`) -> its reader.
_SOURCES = {"hf": _from_hub, "path": _from_path, "url": _from_url, "name": _from_registry}


def read_local(path: str | os.PathLike, ema: bool = False) -> Checkpoint:
    """The `Checkpoint` of a local file or Hub folder, sniffed once and
    read once (a Keras weights file: when the model loads it).

    Raises:
        CheckpointNotFoundError, UnsupportedCheckpointError,
        CorruptCheckpointError: as `resolve`.
    """
    ema = _checks.boolean(ema, "ema")
    name = os.fspath(path)
    path = os.path.expanduser(name)
    kind = "hub_folder" if hub_layout.is_hub_folder(path) else _sniffed(path, name)
    if ema and kind in _NO_EMA:
        raise ema_error(name, _NO_EMA[kind])
    return _READERS[kind](path, name, ema, kind)


def _sniffed(path, name):
    try:
        return sniff_checkpoint(path, name=name, safetensors=True, torch=True)
    except UnsupportedCheckpointError as error:
        raise as_not_npz(error, name) from error


def _hub_folder(path, name, ema, kind):
    return hub.read_hub_checkpoint(path, source=name, ema=ema)


def _hub_file(path, name, ema, kind):
    return hub.read_hub_checkpoint(path, source=name, ema=ema, kind=kind)


def _keras_weights(path, name, ema, kind):
    return KerasWeightsFile(source=name, path=path)


def _npz(path, name, ema, kind):
    return Checkpoint(source=name, path=path, params=read_npz(path, name))


# A local checkpoint's kind (`sniff_checkpoint`'s, or a Hub folder) -> its
# reader; the kinds that hold no EMA weights, as messages name them.
_READERS = {"hub_folder": _hub_folder, "torch": _hub_file, "safetensors": _hub_file,
            "keras_weights": _keras_weights, "npz": _npz}
_NO_EMA = {"safetensors": "a safetensors file", "npz": "an official .npz",
           "keras_weights": "a Keras .weights.h5 file"}


def read_source(path: str | os.PathLike | Checkpoint, ema: bool = False) -> Checkpoint:
    """`model_from_checkpoint`'s sources, which describe a model: a
    `Checkpoint`, an `hf://` reference, the http(s) URL of an official `.npz`
    or a local file or Hub folder (no registered name, which needs the model
    it is for).

    Raises:
        TypeError: `path` is not a str, an `os.PathLike` (a str path) or a
            `Checkpoint`.
        as `resolve`.
    """
    if not isinstance(path, (str, os.PathLike, Checkpoint)) or (
            isinstance(path, os.PathLike) and not isinstance(os.fspath(path), str)):
        shown = f"{type(path).__name__} {reprlib.repr(path)}"
        decode = " (decode it: path.decode())" if isinstance(path, bytes) else ""
        raise TypeError(
            "model_from_checkpoint's `path` must be a str or os.PathLike path, an "
            f"'hf://ORG/NAME' reference or a keras_vit.weights Checkpoint, got {shown}"
            f"{decode}.")
    if isinstance(path, Checkpoint) or hub_layout.is_hub_uri(path) or (
            isinstance(path, str) and path.startswith(("http://", "https://"))):
        return resolve(path, ema=ema)  # a URL: an official .npz, downloaded and cached
    return read_local(path, ema=ema)


def _fetched(weights, url, filename):
    """The official `.npz` at `url`, downloaded into the cache entry
    `filename` (or found there) and read once."""
    path, params = fetch_checkpoint(url, filename)
    # messages name where the bytes came from (a mirror, an earlier run's)
    return Checkpoint(source=cached_source(weights, path), path=path, params=params)


def _looks_like_path(weights):
    return (
        os.path.exists(weights)
        or weights.lower().endswith(FILE_SUFFIXES)
        or os.sep in weights
        or (os.altsep is not None and os.altsep in weights)
        or weights.startswith("~")
    ) and not weights.startswith(registry.AUGREG_PREFIX)
