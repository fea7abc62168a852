"""What a weights file is, told from its bytes before anything reads it,
and the bound on how many bytes of arrays one checkpoint may declare.

`sniff_checkpoint(path)` names an official `.npz` or a Keras `.weights.h5`;
anything else (a PyTorch or safetensors file, a whole Keras model, a
TensorFlow checkpoint, an HTML error page, ...) raises
`UnsupportedCheckpointError` naming what was found. No NumPy, no Keras
(h5py only for an HDF5 file).

>>> sniff_checkpoint("no/such/file.npz")
Traceback (most recent call last):
...
keras_vit.errors.CheckpointNotFoundError: Weights file not found: 'no/such/file.npz'.
"""

import json
import os
import re
import struct
import zipfile

from keras_vit import _checks
from keras_vit.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)

# Every reader's messages name all of them (the same message from each entry point).
ACCEPTED_FORMATS = (
    "keras_vit reads official .npz checkpoints (google-research/"
    "vision_transformer format) and Keras .weights.h5 files, and with weights= "
    "or model_from_checkpoint also timm and Hugging Face transformers "
    ".safetensors and PyTorch (.pth, .bin) files and Hub folders"
)

# The one list of weights-file name endings. The checkpoints whose
# architecture `model_from_checkpoint` reads (`keras-vit predict --model
# auto`; besides Hub folders and hf://): official .npz, safetensors, PyTorch
# (".tar": `.pth.tar`).
ARCHITECTURE_SUFFIXES = (".npz", ".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar")
# Names with any of these endings are files, never registered names: a
# missing one is "not found", not "unknown weights name".
FILE_SUFFIXES = (*ARCHITECTURE_SUFFIXES, ".h5", ".hdf5", ".keras", ".pkl", ".pickle",
                 ".npy", ".msgpack", ".index")

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


class ByteCount:
    """The bytes of arrays one checkpoint makes, counted as its reader makes
    them against `max_checkpoint_bytes()`: one count per file, or one for
    all the shards of a folder together (`what`: the folder), so that a
    folder is bounded as a whole, not shard by shard.

    >>> count = ByteCount("'folder'")
    >>> count.add(2**20)
    >>> count.total
    1048576
    """

    def __init__(self, what):
        self.what, self.total = what, 0
        max_checkpoint_bytes()  # a bad setting is its own error, not the file's

    def add(self, nbytes):
        """Counts `nbytes` more; a CorruptCheckpointError past the bound."""
        self.total += nbytes
        check_checkpoint_bytes(self.what, self.total)


_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
_NPY_MAGIC = b"\x93NUMPY"
# torch.save before 1.6: pickle protocol 2, then the magic number 0x1950a86a20f9469cfc6c.
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
# Footer of a TensorFlow checkpoint `.index` file (an SSTable).
_TF_INDEX_MAGIC = struct.pack("<Q", 0xDB4775248B80FB57)
_TF_DATA_SHARD = re.compile(r"\.data-\d+-of-\d+$")
_CONVERT = "Convert it or load it with the library that wrote it."
_LOAD_MODEL = "Load it with keras.saving.load_model(path)"
_READ_ELSEWHERE = ("Load a timm, Hugging Face transformers or DINO PyTorch file with "
                   "weights=path or keras_vit.model_from_checkpoint(path) (or its folder "
                   "with config.json).")


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


def _json_header_not_an_object(head, length, size):
    """True when `head`, whose first 8 bytes declare a header of `length`
    bytes, starts as safetensors (a header the file can hold) but its
    header is a JSON value other than an object."""
    if head[8:9] not in b'["-0123456789tfn':
        return False
    if not 2 <= length <= min(size - 8, len(head) - 8):
        return False
    try:
        return not isinstance(json.loads(head[8:8 + length]), dict)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False


def _sniff_safetensors(name, path, head, size):
    length = safetensors_header_length(head)
    if length is None:
        if len(head) < 9:
            return None
        (length,) = struct.unpack("<Q", head[:8])
        if _json_header_not_an_object(head, length, size):
            return CorruptCheckpointError(
                f"{name!r} is a damaged safetensors file: its header is not a JSON "
                f"object (it starts with {head[8:8 + min(length, 20)]!r}). "
                "Download it again.")
        if head[8:9] == b"{":  # a length no header has, then `{`
            return CorruptCheckpointError(
                f"{name!r} is a damaged safetensors file: its first 8 bytes give a "
                f"header length of {length:,} bytes, where the format allows 2 to "
                f"{SAFETENSORS_MAX_HEADER:,} (the file has {size:,} bytes). "
                "Download it again.")
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
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
        what = "a safetensors file"
    return _unsupported(
        name, what, "Load a timm or Hugging Face transformers safetensors file "
        "with weights=path or keras_vit.model_from_checkpoint(path) (or its "
        "folder with config.json).")


def _sniff_zip(name, path, torch=False):
    """"npz", or an error naming the kind of zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return CorruptCheckpointError(
            f"{name!r} is a damaged or truncated zip archive, not a readable "
            f"{'.npz or PyTorch' if torch else '.npz'} checkpoint ({error}). Download it again."
        )
    if all(m.endswith(".npy") for m in members):
        return "npz"
    if any(m == "data.pkl" or m.endswith("/data.pkl") for m in members):
        if torch:
            return "torch"
        return _unsupported(name, "a PyTorch checkpoint (zip with data.pkl)", _READ_ELSEWHERE)
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
    import h5py  # only for HDF5 files: reading an .npz (a download) never loads it

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


def sniff_checkpoint(path, name=None, safetensors=False, torch=False):
    """Tells what the file at `path` is, from its first bytes (magic numbers,
    not the extension), before anything reads it.

    Args:
        path: local path.
        name: how to name it in messages (default: `path` as given).
        safetensors, torch: whether the caller reads safetensors files and
            PyTorch zip files (`weights=` does, with `keras_vit.weights.hub`
            and `keras_vit.weights.pytorch`; `read_checkpoint` does not).

    Returns:
        `"npz"` for an official-format `.npz` (a zip of `.npy` arrays),
        `"keras_weights"` for a Keras 3 `.weights.h5` (HDF5) written by a
        keras_vit model (its Functional layers include `patches`), or, with
        `safetensors=True`, `"safetensors"` for a file that starts as one
        (a truncated one too: its reader says so), with `torch=True`,
        `"torch"` for a zip holding a `data.pkl`.

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
        CorruptCheckpointError: an empty file, a damaged zip, HDF5 or
            safetensors file (a header length no header has, a header that
            is JSON but not an object).
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
    if safetensors and safetensors_header_length(head) is not None:
        return "safetensors"
    found = _identify(name, path, head, size, torch)
    if isinstance(found, Exception):
        raise found
    return found


def _identify(name, path, head, size, torch=False):
    """The accepted kind, or the exception that names what the file is."""
    if head.startswith(_ZIP_MAGICS):
        return _sniff_zip(name, path, torch)
    if any(head[o:o + 8] == _HDF5_MAGIC for o in (0, 512, 1024, 2048)):
        return _sniff_hdf5(name, path)
    if head.startswith(_LEGACY_TORCH_MAGIC):
        return _unsupported(
            name, "a legacy PyTorch checkpoint (pickled, torch.save before 1.6)",
            "Save it again with PyTorch >= 1.6, e.g. torch.save(torch.load(path, "
            "weights_only=True), 'model.pth'): that zip format is read with "
            "weights=path or keras_vit.model_from_checkpoint(path).")
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


def is_zip(path):
    """True when the file at `path` starts as a zip archive (a PyTorch
    `torch.save` file, an `.npz`)."""
    with open(path, "rb") as f:
        return f.read(4).startswith(_ZIP_MAGICS)


def _tail(path):
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return f.read(8)
