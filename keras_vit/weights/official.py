"""Official `.npz` checkpoint keys <-> Keras weights, both directions, in
one place.

The released files (google-research/vision_transformer) are `numpy.savez`
archives of float32 arrays keyed by '/'-joined Flax parameter paths. ViT
block children carry the pre-Linen names of the 2020 release
(`LayerNorm_0`, `MultiHeadDotProductAttention_1`, `LayerNorm_2`,
`MlpBlock_3`); files written by Linen code use `LayerNorm_0`,
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`. Both are
read (`canonical_keys`). Hybrid GroupNorm parameters are `(C,)` or the
legacy `(1, 1, 1, C)`.

`official_params(model)` lists, for every weight of a keras_vit model, the
official key(s), their shapes and the two conversions. Loading checks the
whole key set first and raises `CheckpointMismatchError` listing every
missing, unexpected and mis-shaped key: no key is ignored and no weight is
left at its random initialisation silently.

`sniff_checkpoint(path)` tells, from a file's first bytes, what it is before
anything reads it: an official `.npz`, a Keras `.weights.h5`, or something
else (a PyTorch or safetensors file, a whole Keras model, a TensorFlow
checkpoint, an HTML error page, ...), which raises
`UnsupportedCheckpointError` naming what was found.

Nothing a file declares is allocated before it is checked: an `.npz` is
read member by member from the zip directory's sizes (numpy's own stored
or deflate members only; each `.npy` header's shape x itemsize must be the
member's size), within `max_checkpoint_bytes()`
(`$KERAS_VIT_MAX_CHECKPOINT_BYTES`, default 16 GiB) in all.
"""

import dataclasses
import errno
import json
import logging
import math
import os
import re
import struct
import zipfile
import zlib

import numpy as np

from keras_vit import _checks
from keras_vit.layers import (
    BottleneckUnit,
    MixerBlock,
    PatchEncoder,
    Patches,
    ResNetRoot,
    TransformerBlock,
)
from keras_vit.weights.posemb import resize_position_embedding, square_grid

logger = logging.getLogger("keras_vit")

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"


class CheckpointMismatchError(ValueError):
    """The checkpoint's keys or shapes do not fit the model.

    Raised by `load_official_weights` with the full key lists as attributes
    `missing`, `unexpected` and `misshaped` (the message shows at most 20 of
    each), and `source` / `model_name`.
    """

    def __init__(self, message, missing=(), unexpected=(), misshaped=(),
                 source=None, model_name=None):
        super().__init__(message)
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.misshaped = list(misshaped)
        self.source = source
        self.model_name = model_name


class CorruptCheckpointError(ValueError):
    """The file is an official `.npz` (a zip of `.npy` arrays), an HDF5 or a
    safetensors file, but a damaged or lying one: bad zip, CRC error,
    truncated, pickled entries, an empty file, a header that does not fit
    the data, or more bytes than `max_checkpoint_bytes()`."""


class UnsupportedCheckpointError(ValueError):
    """The file is readable but in a format keras_vit does not load (a
    PyTorch or safetensors checkpoint, a whole Keras model, a TensorFlow
    checkpoint, an HTML page, ...). The message names the format found."""


class NotAnNpzError(CorruptCheckpointError, UnsupportedCheckpointError):
    """A file named `.npz` whose bytes are another format (a server's error
    page saved under the checkpoint's name, a `.npy` or `.h5` renamed): both
    corrupt (a cached download is deleted and fetched again) and
    unsupported (the message names the format found)."""


class CheckpointNotFoundError(ValueError, FileNotFoundError):
    """No file at the given path ("Weights file not found: 'PATH'.").

    Both a `ValueError` (a bad `weights=` argument) and a
    `FileNotFoundError` (`errno` is ENOENT); `path` is the path as given.
    """

    def __init__(self, path):
        self.path = path
        message = f"Weights file not found: {path!r}."
        super().__init__(message)
        self.errno, self.strerror = errno.ENOENT, message

    def __str__(self):  # OSError's "[Errno 2] ..." form would hide the message
        return self.strerror

    def __reduce__(self):
        return type(self), (self.path,)


ACCEPTED_FORMATS = (
    "keras_vit reads official .npz checkpoints (google-research/"
    "vision_transformer format) and Keras .weights.h5 files"
)


@dataclasses.dataclass
class Param:
    """One Keras variable and the official array(s) it corresponds to."""

    keys: tuple
    variable: object
    to_keras: object      # list of official arrays -> Keras value
    to_official: object   # Keras value -> list of official arrays
    kind: str = "plain"   # "posemb" | "groupnorm" | "plain"

    def official_shapes(self):
        arrays = self.to_official(np.zeros(tuple(self.variable.shape), "float32"))
        return [tuple(a.shape) for a in arrays]


def _same(key, variable):
    return Param((key,), variable, lambda a: a[0], lambda v: [v])


def _dense(prefix, layer):
    return [_same(f"{prefix}/kernel", layer.kernel), _same(f"{prefix}/bias", layer.bias)]


def _layer_norm(prefix, layer):
    return [_same(f"{prefix}/scale", layer.gamma), _same(f"{prefix}/bias", layer.beta)]


def _group_norm(prefix, layer):
    def flat(a):
        return a[0].reshape(-1)

    return [
        Param((f"{prefix}/scale",), layer.gamma, flat, lambda v: [v], "groupnorm"),
        Param((f"{prefix}/bias",), layer.beta, flat, lambda v: [v], "groupnorm"),
    ]


def _patch_kernel(key, variable, patch_size):
    ph, pw = patch_size

    def to_official(v):
        return [v.reshape(ph, pw, v.shape[0] // (ph * pw), v.shape[1])]

    return Param((key,), variable, lambda a: a[0].reshape(-1, a[0].shape[-1]), to_official)


def _transformer_block(prefix, block):
    d, h = block.hidden_size, block.num_heads
    attn = f"{prefix}/MultiHeadDotProductAttention_1"
    qkv = tuple(f"{attn}/{n}/kernel" for n in ("query", "key", "value"))
    qkv_b = tuple(f"{attn}/{n}/bias" for n in ("query", "key", "value"))
    return [
        *_layer_norm(f"{prefix}/LayerNorm_0", block.norm1),
        Param(
            qkv, block.qkv.kernel,
            lambda a: np.concatenate([x.reshape(d, d) for x in a], axis=1),
            lambda v: [x.reshape(d, h, d // h) for x in np.split(v, 3, axis=1)],
        ),
        Param(
            qkv_b, block.qkv.bias,
            lambda a: np.concatenate([x.reshape(d) for x in a]),
            lambda v: [x.reshape(h, d // h) for x in np.split(v, 3)],
        ),
        Param(
            (f"{attn}/out/kernel",), block.attention_output.kernel,
            lambda a: a[0].reshape(d, d), lambda v: [v.reshape(h, d // h, d)],
        ),
        _same(f"{attn}/out/bias", block.attention_output.bias),
        *_layer_norm(f"{prefix}/LayerNorm_2", block.norm2),
        *_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp_dense1),
        *_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp_dense2),
    ]


def _mixer_block(prefix, block):
    return [
        *_layer_norm(f"{prefix}/LayerNorm_0", block.norm1),
        *_dense(f"{prefix}/token_mixing/Dense_0", block.token_mixing1),
        *_dense(f"{prefix}/token_mixing/Dense_1", block.token_mixing2),
        *_layer_norm(f"{prefix}/LayerNorm_1", block.norm2),
        *_dense(f"{prefix}/channel_mixing/Dense_0", block.channel_mixing1),
        *_dense(f"{prefix}/channel_mixing/Dense_1", block.channel_mixing2),
    ]


def _bottleneck(prefix, unit):
    params = []
    parts = [("conv1", "gn1"), ("conv2", "gn2"), ("conv3", "gn3")]
    if unit.has_projection:
        parts.append(("conv_proj", "gn_proj"))
    for conv, norm in parts:
        params.append(_same(f"{prefix}/{conv}/kernel", getattr(unit, conv).kernel))
        params += _group_norm(f"{prefix}/{norm}", getattr(unit, norm))
    return params


_BLOCK_INDEX = re.compile(r"_(\d+)$")
_UNIT_NAME = re.compile(r"^block(\d+)_unit(\d+)$")


def official_params(model):
    """Returns the `Param` list of a keras_vit ViT / hybrid / Mixer model.

    Every weight of the model appears exactly once; the layer names given by
    `keras_vit.models` identify blocks and units.
    """
    try:
        patch_size = model.get_layer("patches").patch_size
    except ValueError:
        raise ValueError(
            f"Model {model.name!r} has no 'patches' layer: official weights "
            "map only onto models built by keras_vit.VisionTransformer / "
            "keras_vit.MLPMixer (pass the inner model if you wrapped it)."
        ) from None
    params = []
    for layer in model.layers:
        name = layer.name
        if isinstance(layer, PatchEncoder):
            params.append(_patch_kernel("embedding/kernel", layer.kernel, patch_size))
            params.append(_same("embedding/bias", layer.bias))
            if layer.use_class_token:
                params.append(_same("cls", layer.class_token))
            params.append(
                Param((POSEMB_KEY,), layer.position_embedding,
                      lambda a: a[0], lambda v: [v], "posemb")
            )
        elif isinstance(layer, TransformerBlock):
            i = int(_BLOCK_INDEX.search(name).group(1))
            params += _transformer_block(f"Transformer/encoderblock_{i}", layer)
        elif isinstance(layer, MixerBlock):
            i = int(_BLOCK_INDEX.search(name).group(1))
            params += _mixer_block(f"MixerBlock_{i}", layer)
        elif isinstance(layer, ResNetRoot):
            params.append(_same("conv_root/kernel", layer.conv_root.kernel))
            params += _group_norm("gn_root", layer.gn_root)
        elif isinstance(layer, BottleneckUnit):
            stage, unit = _UNIT_NAME.match(name).groups()
            params += _bottleneck(f"block{stage}/unit{unit}", layer)
        elif name == "stem":
            params.append(_patch_kernel("stem/kernel", layer.kernel, patch_size))
            params.append(_same("stem/bias", layer.bias))
        elif name == "encoder_norm":
            params += _layer_norm("Transformer/encoder_norm", layer)
        elif name == "pre_head_layer_norm":
            params += _layer_norm("pre_head_layer_norm", layer)
        elif name == "fc_norm":  # timm's gap models: LayerNorm after pooling
            params += _layer_norm("fc_norm", layer)
        elif name in ("pre_logits", "head"):
            params += _dense(name, layer)
        elif layer.weights and not isinstance(layer, Patches):
            raise ValueError(
                f"Layer {name!r} ({type(layer).__name__}) of model "
                f"{model.name!r} has weights with no official counterpart."
            )
    covered = {id(p.variable) for p in params}
    left = [v.path for v in model.weights if id(v) not in covered]
    if left:  # internal invariant: the table above covers every layer
        raise AssertionError(f"weights without an official key: {left}")
    return params


def official_manifest(model):
    """`[[key, shape], ...]` (sorted) of the official checkpoint that fits
    `model`: the input `make_official_npz.py` takes."""
    rows = []
    for param in official_params(model):
        for key, shape in zip(param.keys, param.official_shapes()):
            rows.append([key, list(shape)])
    return sorted(rows)


# --- what is this file? ----------------------------------------------------

_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
MAX_CHECKPOINT_BYTES_ENV = "KERAS_VIT_MAX_CHECKPOINT_BYTES"
DEFAULT_MAX_CHECKPOINT_BYTES = 16 * 2**30
SAFETENSORS_MAX_HEADER = 100_000_000  # bytes: the safetensors library's own limit


def max_checkpoint_bytes():
    """The most bytes of arrays one checkpoint may declare:
    `$KERAS_VIT_MAX_CHECKPOINT_BYTES`, default 16 GiB (ViT-H/14, the largest
    official checkpoint, is 2.5 GB in float32).

    An `.npz` whose members declare more in all (their uncompressed sizes
    in the zip directory), or a safetensors file or sharded folder with a
    larger data section, is refused before anything is allocated.

    >>> os.environ["KERAS_VIT_MAX_CHECKPOINT_BYTES"] = str(2**30)
    >>> max_checkpoint_bytes()
    1073741824
    >>> del os.environ["KERAS_VIT_MAX_CHECKPOINT_BYTES"]

    Raises:
        ValueError: the variable is set to something other than a positive
            whole number of bytes.
    """
    return _checks.positive_env(MAX_CHECKPOINT_BYTES_ENV, DEFAULT_MAX_CHECKPOINT_BYTES,
                                "bytes")


def check_checkpoint_bytes(what, total):
    """Raises `CorruptCheckpointError` when `what` (a file, as messages name
    it) declares more than `max_checkpoint_bytes()` bytes of arrays."""
    limit = max_checkpoint_bytes()
    if total > limit:
        raise CorruptCheckpointError(
            f"{what} declares {total:,} bytes of arrays, more than the limit "
            f"of {limit:,} ({MAX_CHECKPOINT_BYTES_ENV}; the largest official "
            f"checkpoint, ViT-H/14, is 2.5 GB). Set {MAX_CHECKPOINT_BYTES_ENV} "
            "higher to read it.")


_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
# torch.save before 1.6: pickle protocol 2, then the magic number 0x1950a86a20f9469cfc6c.
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
# Footer of a TensorFlow checkpoint `.index` file (an SSTable).
_TF_INDEX_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)
_TF_DATA_SHARD = re.compile(r"\.data-\d+-of-\d+$")
_CONVERT = "Convert it or load it with the library that wrote it."
_LOAD_MODEL = "Load it with keras.saving.load_model(path)"


def _unsupported(name, what, advice=_CONVERT):
    return UnsupportedCheckpointError(
        f"{name!r} is {what}; {ACCEPTED_FORMATS}. {advice}"
    )


def _snippet(text, limit=60):
    line = " ".join(text.strip().split())
    return repr(line[:limit] + ("..." if len(line) > limit else ""))


def _looks_like_text(head):
    if not head or b"\x00" in head:
        return False
    text = head.decode("utf-8", "replace")
    bad = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and c not in "\t\r\n\f"))
    return bad <= max(1, len(text) // 100)


def _sniff_text(name, head):
    text = head.decode("utf-8", "replace")
    lower = text.lstrip().lower()
    if lower.startswith("version https://git-lfs.github.com/spec"):
        return _unsupported(
            name, "a Git LFS pointer, not the file it points to",
            "Fetch the real file (`git lfs pull`) and pass that.")
    if lower.startswith(("<!doctype html", "<html")) or "<html" in lower[:1000]:
        title = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
        shown = (f"titled {_snippet(title.group(1))}" if title and title.group(1).strip()
                 else f"it starts with {_snippet(text)}")
        what = f"an HTML page, not a checkpoint ({shown})"
        return _unsupported(
            name, what, "Was an error or login page saved in place of the file? "
            "Download the checkpoint again.")
    if lower.startswith("model_checkpoint_path"):
        return _unsupported(
            name, "the 'checkpoint' index of a TensorFlow checkpoint directory")
    if lower.startswith(("{", "[")):
        what = f"a JSON file, not a checkpoint (it starts with {_snippet(text)})"
        return _unsupported(name, what, "Pass the weights file itself.")
    what = f"a text file, not a checkpoint (it starts with {_snippet(text)})"
    return _unsupported(name, what, "Pass the weights file itself.")


def safetensors_header_length(head):
    """The header length a file's first bytes declare when they look like
    safetensors (a little-endian u64 below 2**32, then `{`), else None.

    >>> safetensors_header_length(b"\\x02\\0\\0\\0\\0\\0\\0\\0{}")
    2
    """
    if len(head) < 9 or head[8:9] != b"{":
        return None
    (length,) = struct.unpack("<Q", head[:8])
    return length if 2 <= length < 2**32 else None


def _sniff_safetensors(name, path, head, size):
    length = safetensors_header_length(head)
    if length is None:
        return None
    if length > size - 8:
        return CorruptCheckpointError(
            f"{name!r} is a truncated safetensors file: its header length is "
            f"{length:,} bytes, but only {size - 8:,} follow the length field. "
            "Download it again.")
    with open(path, "rb") as f:
        f.seek(8)
        header = f.read(min(length, SAFETENSORS_MAX_HEADER))
    try:
        tensors = [k for k in json.loads(header) if k != "__metadata__"]
        example = f", e.g. {sorted(tensors)[0]!r}" if tensors else ""
        what = f"a safetensors file ({len(tensors)} tensors{example})"
    except (ValueError, TypeError, UnicodeDecodeError):
        what = "a safetensors file"
    return _unsupported(
        name, what, "Load a timm or Hugging Face transformers safetensors file "
        "with weights=path or keras_vit.model_from_checkpoint(path) (or its "
        "folder with config.json).")


def _sniff_zip(name, path):
    """"npz", or an error naming the kind of zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return CorruptCheckpointError(
            f"{name!r} is a damaged or truncated zip archive, not a readable "
            f".npz checkpoint ({error}). Download it again."
        )
    if all(m.endswith(".npy") for m in members):
        return "npz"
    if any(m == "data.pkl" or m.endswith("/data.pkl") for m in members):
        return _unsupported(name, "a PyTorch checkpoint (zip with data.pkl)")
    if "config.json" in members and any(m.startswith("model.weights.") for m in members):
        return _unsupported(
            name, "a whole Keras model (.keras zip with config.json and "
            "model.weights.h5)", f"{_LOAD_MODEL}.")
    shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
    return _unsupported(
        name, f"a zip archive but not a NumPy .npz (members: {shown})",
        "Unpack it and pass the checkpoint inside.")


def _sniff_hdf5(name, path):
    """"keras_weights", or an error naming the kind of HDF5 file."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            attrs = set(f.attrs)
            entries = sorted(f.keys())
            layers = sorted(f["layers"].keys()) if isinstance(
                f.get("layers"), h5py.Group) else []
    except OSError as error:
        return CorruptCheckpointError(
            f"{name!r} is a damaged or truncated HDF5 file ({error}). "
            "Write or download it again."
        )
    if "model_config" in attrs:
        return _unsupported(
            name, "a whole Keras model saved as HDF5 (.h5 with a model_config "
            "attribute), not a Keras .weights.h5 file",
            f"{_LOAD_MODEL} (tf_keras.models.load_model for Keras 2 files).")
    if "layer_names" in attrs:
        return _unsupported(
            name, "a Keras 2 weights file (model.save_weights to .h5, with "
            "layer_names), which holds no architecture and does not map onto "
            "keras_vit's layers",
            "Load it into the Keras 2 model that wrote it.")
    if entries and set(entries) <= {"layers", "vars", "optimizer"}:
        if "patches" in layers:  # every keras_vit ViT, hybrid and Mixer
            return "keras_weights"
        shown = ", ".join(layers[:5]) + (", ..." if len(layers) > 5 else "")
        return _unsupported(
            name, f"a Keras .weights.h5 file of another model (layers: "
            f"{shown or 'none'}), not of a keras_vit ViT, hybrid or Mixer",
            "Load it into the model that wrote it.")
    shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
    return _unsupported(
        name, f"an HDF5 file but not a Keras weights file (top-level "
        f"entries: {shown or 'none'})")


def _sniff_directory(name, path):
    entries = set(os.listdir(path))
    if "saved_model.pb" in entries or "saved_model.pbtxt" in entries:
        return _unsupported(
            name, "a TensorFlow SavedModel directory",
            "Load it with tf.saved_model.load or keras.layers.TFSMLayer.")
    if "checkpoint" in entries or any(e.endswith(".index") for e in entries):
        return _unsupported(name, "a TensorFlow checkpoint directory")
    if any(e.startswith(("_CHECKPOINT_METADATA", "_METADATA")) for e in entries):
        return _unsupported(name, "an Orbax (JAX) checkpoint directory")
    return _unsupported(name, "a directory", "Pass the checkpoint file inside it.")


def sniff_checkpoint(path, name=None):
    """Tells what the file at `path` is, from its first bytes (magic numbers,
    not the extension), before anything reads it.

    Args:
        path: local path.
        name: how to name it in messages (default: `path` as given).

    Returns:
        `"npz"` for an official-format `.npz` (a zip of `.npy` arrays) or
        `"keras_weights"` for a Keras 3 `.weights.h5` (HDF5) written by a
        keras_vit model (its Functional layers include `patches`).

    Raises:
        CheckpointNotFoundError: no file at `path`.
        UnsupportedCheckpointError: a PyTorch checkpoint (zip with data.pkl,
            or a legacy pickle), a Python pickle, a safetensors file, a whole
            Keras model (.keras, or .h5 with a model_config), a Keras 2 or
            other HDF5 file, a Keras .weights.h5 of a non-keras_vit model, a
            TensorFlow checkpoint or SavedModel, a single .npy array, a
            gzip/tar/other zip archive, a text/HTML/JSON file, a Git LFS
            pointer, a directory, or unrecognised bytes. The message names
            the format found and what is accepted.
        CorruptCheckpointError: an empty file, a damaged zip or HDF5 file.
    """
    name = os.fspath(path) if name is None else name
    path = os.path.expanduser(os.fspath(path))
    if os.path.isdir(path):
        raise _sniff_directory(name, path)
    if not os.path.isfile(path):
        if os.path.isfile(path + ".index"):
            raise _unsupported(
                name, f"the prefix of a TensorFlow checkpoint ({name}.index, "
                f"{name}.data-*)")
        raise CheckpointNotFoundError(name)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head:
        raise CorruptCheckpointError(
            f"{name!r} is empty (0 bytes): an interrupted download or copy? "
            "Fetch it again."
        )
    found = _identify(name, path, head, size)
    if isinstance(found, Exception):
        raise found
    return found


def _identify(name, path, head, size):
    """The accepted kind, or the exception that names what the file is."""
    if head.startswith(_ZIP_MAGICS):
        return _sniff_zip(name, path)
    if any(head[o:o + 8] == _HDF5_MAGIC for o in (0, 512, 1024, 2048)):
        return _sniff_hdf5(name, path)
    if head.startswith(_LEGACY_TORCH_MAGIC):
        return _unsupported(
            name, "a legacy PyTorch checkpoint (pickled, torch.save before 1.6)")
    if head[0] == 0x80 and len(head) > 1 and 2 <= head[1] <= 5:
        return _unsupported(
            name, f"a Python pickle (protocol {head[1]}), e.g. a PyTorch or "
            "joblib file; keras_vit never unpickles files")
    if head.startswith(_NPY_MAGIC):
        return _unsupported(
            name, "a single NumPy array (.npy), not an .npz archive of named "
            "arrays", "Save all arrays with numpy.savez under their official "
            "keys, or use keras_vit.save_official_weights(model, path).")
    safetensors = _sniff_safetensors(name, path, head, size)
    if safetensors is not None:
        return safetensors
    if head.startswith(b"\x1f\x8b"):
        return _unsupported(name, "a gzip-compressed file (e.g. a .tar.gz)",
                            "Unpack it and pass the checkpoint inside.")
    if head[257:262] == b"ustar":
        return _unsupported(name, "a tar archive",
                            "Unpack it and pass the checkpoint inside.")
    if _TF_DATA_SHARD.search(path) or (
            path.endswith(".index") and size >= 8 and _tail(path) == _TF_INDEX_MAGIC):
        return _unsupported(name, "a part of a TensorFlow checkpoint")
    if _looks_like_text(head):
        return _sniff_text(name, head)
    return _unsupported(
        name, f"in no format keras_vit recognises (it starts with {head[:16]!r})")


def _tail(path):
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return f.read(8)


# --- reading -------------------------------------------------------------

_LINEN_TO_PRE_LINEN = {
    "LayerNorm_1": "LayerNorm_2",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "MlpBlock_0": "MlpBlock_3",
}
_ENCODER_CHILD = re.compile(r"^(Transformer/encoderblock_\d+)/([^/]+)(/.*)$")


def canonical_keys(params):
    """Renames Linen-style encoder-block keys to the pre-Linen names.

    A file is Linen-style when it has `MultiHeadDotProductAttention_0`; then
    `LayerNorm_1 -> LayerNorm_2`, `MultiHeadDotProductAttention_0 -> _1`,
    `MlpBlock_0 -> MlpBlock_3` (`LayerNorm_0` is the same in both).
    """
    if not any("/MultiHeadDotProductAttention_0/" in k for k in params):
        return dict(params)
    out = {}
    for key, value in params.items():
        match = _ENCODER_CHILD.match(key)
        if match:
            block, child, rest = match.groups()
            key = f"{block}/{_LINEN_TO_PRE_LINEN.get(child, child)}{rest}"
        out[key] = value
    return out


def _as_not_npz(error, name):
    """`error` (an UnsupportedCheckpointError) as a NotAnNpzError when the
    file is named `.npz`: content that is not what its name says."""
    if name.endswith(".npz") and not isinstance(error, CorruptCheckpointError):
        return NotAnNpzError(str(error))
    return error


def read_checkpoint(path):
    """Reads an official `.npz` into `{canonical key: float32 array}`.

    The format is checked first from the file's bytes (`sniff_checkpoint`);
    then the zip directory (stored or deflate members only, sizes their
    compressed bytes can hold, `max_checkpoint_bytes()` in all) and each
    `.npy` header (its shape x itemsize is the member's size) before any
    array is allocated; every member is then streamed in full, so the zip
    CRC of each array is checked. Nothing is unpickled (as
    `allow_pickle=False`).

    Raises:
        CheckpointNotFoundError: no file at `path` ("Weights file not found:
            'PATH'.").
        UnsupportedCheckpointError: not an official `.npz`: a PyTorch,
            safetensors or TensorFlow checkpoint, a whole Keras model, a
            Keras `.weights.h5` (load those with `weights=` or
            `model.load_weights`), an HTML page, ... Under a `.npz` name it
            is a `NotAnNpzError`, a CorruptCheckpointError as well.
        CorruptCheckpointError: an `.npz` that is damaged: a CRC error, a
            truncated or empty file, an entry that is not a numeric array
            (pickled objects), a header or zip directory that does not fit
            the data, a bzip2/LZMA member, or more than
            `max_checkpoint_bytes()` in all.
    """
    name = os.fspath(path)
    try:
        kind = sniff_checkpoint(path)
    except UnsupportedCheckpointError as error:
        raise _as_not_npz(error, name) from error
    if kind == "keras_weights":
        raise _as_not_npz(UnsupportedCheckpointError(
            f"{name!r} is a Keras .weights.h5 file, not an official .npz "
            "checkpoint: it holds no architecture. Pass it as `weights=` to "
            "the builder of the model that wrote it (e.g. "
            "keras_vit.ViTB16(weights=path)) or call model.load_weights(path); "
            "read_checkpoint and model_from_checkpoint read official .npz files."
        ), name)
    path = os.path.expanduser(name)
    max_checkpoint_bytes()  # a bad setting is its own error, not the file's
    try:
        with zipfile.ZipFile(path) as archive:
            params = dict(_read_npy_member(name, archive, info)
                          for info in _npz_members(name, archive))
    except CorruptCheckpointError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError,
            KeyError) as error:
        raise CorruptCheckpointError(
            f"{name} is not a readable .npz checkpoint: {error}"
        ) from error
    if not params:
        raise CorruptCheckpointError(f"{name} is an empty .npz archive.")
    return canonical_keys(params)


# What numpy.savez (stored) and numpy.savez_compressed (deflate) write; other
# methods (bzip2, LZMA) decompress a whole chunk at once, whatever its size.
_NPZ_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
_OTHER_METHODS = {zipfile.ZIP_BZIP2: "bzip2", zipfile.ZIP_LZMA: "LZMA"}
_DEFLATE_MAX_RATIO = 1032  # 258-byte matches at 2 bits each: deflate's limit
_READ_CHUNK = 1 << 20  # bytes per read: faster than larger ones (cache)


def _npz_members(name, archive):
    """The archive's members, checked against the zip directory before any
    is decompressed: numpy's methods, sizes their compressed bytes can hold,
    no name twice, and `max_checkpoint_bytes()` in all."""
    members, seen = archive.infolist(), set()
    for info in members:
        where = f"{name}: member {info.filename!r}"
        if info.filename in seen:
            raise CorruptCheckpointError(f"{where} appears twice in the archive.")
        seen.add(info.filename)
        if info.flag_bits & 0x1:
            raise CorruptCheckpointError(f"{where} is encrypted.")
        if info.compress_type not in _NPZ_METHODS:
            method = _OTHER_METHODS.get(info.compress_type,
                                        f"zip method {info.compress_type}")
            raise CorruptCheckpointError(
                f"{where} is compressed with {method}; keras_vit reads .npz "
                "members stored or deflate-compressed, as numpy.savez and "
                "numpy.savez_compressed write them.")
        stored = info.compress_type == zipfile.ZIP_STORED
        most = info.compress_size if stored else (
            _DEFLATE_MAX_RATIO * info.compress_size + 1024)
        if info.file_size > most or (stored and info.file_size != most):
            holds = (f"it stores {most:,}" if stored else f"its {info.compress_size:,} "
                     f"deflate bytes can hold at most {most:,}")
            raise CorruptCheckpointError(
                f"{where} declares {info.file_size:,} bytes, but {holds}: the zip "
                "directory is wrong.")
    check_checkpoint_bytes(name, sum(info.file_size for info in members))
    return members


def _npy_header(fp):
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fp)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(fp)
    raise ValueError(f".npy format version {version[0]}.{version[1]} (numeric "
                     "arrays are written as 1.0 or 2.0)")


def _read_npy_member(name, archive, info):
    """`(key, array)` of one `.npy` member, its header checked against the
    zip directory's size before the array is allocated; the data streamed
    in bounded chunks (zipfile checks the CRC at the end)."""
    key = info.filename.removesuffix(".npy")  # as numpy's NpzFile names it
    where = f"{name}: entry {key!r}"
    with archive.open(info) as fp:
        try:
            shape, fortran, dtype = _npy_header(fp)
        except ValueError as error:
            raise CorruptCheckpointError(f"{where} has no readable .npy header "
                                         f"({error}).") from error
        if dtype.hasobject:
            raise CorruptCheckpointError(
                f"{name} is not a readable .npz checkpoint: Object arrays cannot "
                f"be loaded when allow_pickle=False (entry {key!r} holds pickled "
                "Python objects).")
        if dtype.kind not in "fiu":
            raise CorruptCheckpointError(
                f"{where} has dtype {dtype}, expected a float array.")
        header, count = fp.tell(), math.prod(shape)
        if min(shape, default=0) < 0 or count * dtype.itemsize != info.file_size - header:
            raise CorruptCheckpointError(
                f"{where} declares shape {shape} of {dtype} "
                f"({max(count, 0) * dtype.itemsize:,} bytes), but the zip directory "
                f"says it holds {info.file_size - header:,} bytes after its "
                f"{header}-byte .npy header.")
        try:
            array = np.empty(count, dtype)
        except MemoryError as error:
            raise MemoryError(f"{where}: not enough memory for its "
                              f"{count * dtype.itemsize:,} bytes.") from error
        buffer, filled = memoryview(array.view(np.uint8)), 0
        while filled < len(buffer):
            chunk = fp.read(min(_READ_CHUNK, len(buffer) - filled))
            if not chunk:
                raise CorruptCheckpointError(
                    f"{where} ends after {filled:,} of its {len(buffer):,} bytes.")
            buffer[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    return key, array.reshape(shape, order="F" if fortran else "C")


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What the builders need to know about a checkpoint before building."""

    family: str                 # "vit" | "mixer"
    classes: int                # head width, or None without a head
    representation_size: int    # pre_logits width, or None
    classifier: str             # "token" | "gap" (ViT)
    grid: tuple                 # (gh, gw) the checkpoint was trained at


def describe(params):
    """Reads family, head, pre_logits, classifier and grid from the keys."""
    head = params.get("head/kernel")
    classes = int(head.shape[-1]) if head is not None else None
    pre = params.get("pre_logits/kernel")
    representation = int(pre.shape[-1]) if pre is not None else None
    if POSEMB_KEY in params:
        classifier = "token" if "cls" in params else "gap"
        prefix = 1 if classifier == "token" else 0
        tokens = params[POSEMB_KEY].shape[1] - prefix
        return CheckpointInfo("vit", classes, representation, classifier,
                              square_grid(tokens))
    token_kernel = params.get("MixerBlock_0/token_mixing/Dense_0/kernel")
    if token_kernel is not None:
        return CheckpointInfo("mixer", classes, None, "gap",
                              square_grid(int(token_kernel.shape[0])))
    raise CheckpointMismatchError(
        "Not an official ViT or Mixer checkpoint: it has neither "
        f"{POSEMB_KEY!r} nor 'MixerBlock_0/token_mixing/Dense_0/kernel'. "
        f"First keys: {sorted(params)[:8]}"
    )


def _fmt(keys, limit=20):
    keys = list(keys)
    text = ", ".join(keys[:limit])
    if len(keys) > limit:
        text += f", ... and {len(keys) - limit} more"
    return text


def _what_the_file_is(params):
    """`(phrase, variant or None)` for the mismatch message."""
    from keras_vit.models.auto import checkpoint_variant, describe_architecture

    try:
        return describe_architecture(params), checkpoint_variant(params)
    except (CheckpointMismatchError, KeyError, IndexError, ValueError):
        return "no complete official ViT, hybrid or Mixer checkpoint", None


def _mismatch_message(model, params, source, missing, unexpected, misshaped):
    what, variant = _what_the_file_is(params)
    path = source if isinstance(source, str) and os.path.isfile(
        os.path.expanduser(source)) else None
    shown = repr(path) if path else "path"
    named = f" or keras_vit.{variant.function}(weights={shown})" if variant else ""
    lines = [
        f"Checkpoint {source} does not fit model {model.name!r}: "
        f"{len(missing)} missing, {len(unexpected)} unexpected, "
        f"{len(misshaped)} mis-shaped keys; the file looks like {what}.",
        f"  To build the model the file describes, use "
        f"keras_vit.model_from_checkpoint({shown}){named} (command line: "
        f"keras-vit predict --model auto --weights {path or 'PATH'}); "
        "`keras-vit models` lists which model each checkpoint family fits.",
    ]
    if missing:
        lines.append(f"  missing keys ({len(missing)}): {_fmt(missing)}")
    if unexpected:
        lines.append(f"  unexpected keys ({len(unexpected)}): {_fmt(unexpected)}")
    if misshaped:
        lines.append(f"  mis-shaped keys ({len(misshaped)}): {_fmt(misshaped)}")
    return "\n".join(lines)


def load_official_weights(model, params, source=None, dropped=()):
    """Assigns official checkpoint weights to `model`'s weights.

    Args:
        model: a keras_vit model.
        params: `{key: array}` (e.g. from `read_checkpoint`), or the path
            of an official `.npz` (read with `read_checkpoint`).
        source: how to name the checkpoint in messages (default: the path,
            or "checkpoint" for a dict).
        dropped: key prefixes the caller decided not to load (the head
            when it is replaced, `pre_logits` when it is dropped); they are
            neither loaded nor reported as unexpected.

    Returns:
        The number of model weights assigned.

    The position embedding is resized with the official algorithm when the
    grid differs. The whole key set is checked before any weight is
    assigned.

    Raises:
        CheckpointMismatchError: keys or shapes do not fit the model. The
            message opens with one line counting the missing, unexpected
            and mis-shaped keys and saying which architecture the file
            describes, then how to build that one
            (`keras_vit.model_from_checkpoint`), then at most 20 keys of each
            kind; the exception's `missing`, `unexpected` and `misshaped`
            hold all of them.
        CheckpointNotFoundError, UnsupportedCheckpointError,
            CorruptCheckpointError: from `read_checkpoint` when `params` is
            a path.
    """
    if isinstance(params, (str, os.PathLike)):
        if source is None:
            source = os.fspath(params)
        params = read_checkpoint(params)
    if source is None:
        source = "checkpoint"
    params = canonical_keys(params)
    table = official_params(model)
    expected = {k for p in table for k in p.keys}
    missing, misshaped, assignments = [], [], []
    for param in table:
        if any(k.startswith(tuple(dropped)) for k in param.keys):
            continue  # e.g. a new head: keeps its (zero) initialisation
        present = [k for k in param.keys if k in params]
        missing += [k for k in param.keys if k not in params]
        if len(present) != len(param.keys):
            continue
        arrays = [np.asarray(params[k], dtype="float32") for k in param.keys]
        wanted = param.official_shapes()
        bad = []
        for key, array, shape in zip(param.keys, arrays, wanted):
            if array.shape == shape:
                continue
            if param.kind == "groupnorm" and array.size == int(np.prod(shape)) \
                    and array.shape[-1] == shape[-1]:
                continue
            if param.kind == "posemb" and array.ndim == 3 and \
                    array.shape[0] == 1 and array.shape[2] == shape[2]:
                arrays = [_resize_posemb(model, array, source)]
                continue
            bad.append(f"{key}: checkpoint {array.shape} vs model {shape}")
        if bad:
            misshaped += bad
            continue
        assignments.append((param, param.to_keras(arrays)))
    unexpected = [
        k for k in sorted(params)
        if k not in expected and not any(k.startswith(p) for p in dropped)
    ]
    if missing or unexpected or misshaped:
        raise CheckpointMismatchError(
            _mismatch_message(model, params, source, missing, unexpected, misshaped),
            missing=missing, unexpected=unexpected, misshaped=misshaped,
            source=source, model_name=model.name,
        )
    for param, value in assignments:
        param.variable.assign(value)
    return len(assignments)


def _resize_posemb(model, posemb, source):
    encoder = next(l for l in model.layers if isinstance(l, PatchEncoder))
    prefix = encoder.num_prefix_tokens
    old = square_grid(posemb.shape[1] - prefix)
    new = encoder.grid_size
    logger.info(
        "Resizing the position embedding of %s from a %dx%d to a %dx%d grid "
        "(bilinear, aligned corners%s).", source, *old, *new,
        ", class token kept" if prefix else "",
    )
    return resize_position_embedding(posemb, new, prefix, old)


def save_official_weights(model, path):
    """Writes `model`'s weights as an official-format `.npz` (pre-Linen
    names, float32) and returns `path` (as a str). The file loads back with
    `weights=path`, `keras_vit.model_from_checkpoint(path)` and into the
    official JAX code.

    Raises:
        ValueError: `model` is not a keras_vit ViT / hybrid / Mixer (no
            'patches' layer, or a layer with no official counterpart).
    """
    path = os.fspath(path)
    arrays = {}
    for param in official_params(model):
        value = np.asarray(param.variable.numpy(), dtype="float32")
        for key, array in zip(param.keys, param.to_official(value)):
            arrays[key] = np.ascontiguousarray(array, dtype="float32")
    with open(os.path.expanduser(path), "wb") as f:
        np.savez(f, **dict(sorted(arrays.items())))
    return path
