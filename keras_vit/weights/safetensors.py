"""The safetensors codec: `read_safetensors` (NumPy, every header rule of
the format checked before a tensor is read, the bytes counted against
`sniff.max_checkpoint_bytes()`) and `write_safetensors` (float32, as timm
and transformers read it). No PyTorch, nothing unpickled.
"""

import json
import math
import os
import struct

import numpy as np

from keras_vit import _atomic
from keras_vit.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from keras_vit.weights.sniff import SAFETENSORS_MAX_HEADER, ByteCount, check_checkpoint_bytes

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": None,
           "I64": np.int64, "I32": np.int32}
# Bits per element of every dtype of the safetensors format (read or not).
_FORMAT_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
                "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
                "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
                "F6_E2M3": 6, "F6_E3M2": 6}
_MAX_DIMS = 64  # NumPy's limit; a larger list is a damaged header
_TILING = "the safetensors format requires the tensors to tile the data section exactly"


def write_safetensors(path, arrays, metadata=None):
    """Writes `{name: array}` as a `.safetensors` file (float32, little
    endian, names sorted, the header padded to 8 bytes) with
    `__metadata__` `{"format": "pt", **metadata}`, which transformers and
    timm read with `safetensors.torch.load_file`. Returns `path`.

    Example:

    ```python
    write_safetensors("model.safetensors", {"cls_token": np.zeros((1, 1, 8))})
    read_safetensors("model.safetensors")["cls_token"].shape   # (1, 1, 8)
    ```
    """
    header, offset = {"__metadata__": {"format": "pt", **(metadata or {})}}, 0
    arrays = {k: np.ascontiguousarray(v, dtype="<f4") for k, v in sorted(arrays.items())}
    for key, value in arrays.items():
        header[key] = {"dtype": "F32", "shape": list(value.shape),
                       "data_offsets": [offset, offset + value.nbytes]}
        offset += value.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with _atomic.replacing(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for value in arrays.values():
            f.write(value.tobytes())
    return path


def read_safetensors(path, count=None):
    """Reads a `.safetensors` file into `{name: float32 array}` with NumPy
    (F32, F16, BF16, F64; no PyTorch, nothing unpickled).

    The header is checked against the format's rules before any tensor is
    read: a length within the file and the format's 100 MB limit, a JSON
    object without repeated names, `__metadata__` a map of strings, each
    entry a known dtype, a shape of non-negative ints and `data_offsets`
    whose size is dtype x shape, the offsets tiling the data section
    exactly (no overlap, no gap, nothing after the last tensor), and the
    data section and the float32 arrays made within
    `sniff.max_checkpoint_bytes()` (`count`: the `sniff.ByteCount` they
    are counted in, a sharded folder's for its shards; default: the
    file's own). Each tensor is then read on its own (no whole-file copy).

    Raises:
        CorruptCheckpointError: a truncated file or a header that breaks
            these rules (the message names the file and the tensor).
        UnsupportedCheckpointError: a valid file with a tensor of a dtype
            keras_vit does not read (U8, BOOL, F8_E4M3, ...).

    Example:

    ```python
    state = read_safetensors("folder/model.safetensors")
    state["cls_token"].shape  # (1, 1, 768)
    ```
    """
    name = os.fspath(path)
    path = os.path.expanduser(name)
    if not os.path.isfile(path):
        raise CheckpointNotFoundError(name)
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        length, entries = _safetensors_header(name, f, size)
        check_checkpoint_bytes(repr(name), size - 8 - length)
        _check_tiling(name, entries, size - 8 - length)
        count = ByteCount(repr(name)) if count is None else count
        count.add(sum(4 * math.prod(shape) for _, shape, _, _ in entries.values()))
        for key, (dtype, _, _, _) in entries.items():
            if dtype not in _DTYPES:
                raise UnsupportedCheckpointError(
                    f"{name!r}: tensor {key!r} has dtype {dtype}; keras_vit reads "
                    f"{', '.join(_DTYPES)} tensors.")
        out = {}
        for key, (dtype, shape, begin, end) in entries.items():
            f.seek(8 + length + begin)
            buffer = bytearray(end - begin)
            if f.readinto(buffer) != len(buffer):
                raise CorruptCheckpointError(
                    f"{name!r} is truncated: tensor {key!r} ends at byte {end} "
                    "of its data section, after the end of the file.")
            out[key] = _tensor(buffer, dtype, shape)
    return out


def _tensor(buffer, dtype, shape):
    if dtype == "BF16":
        bits = np.frombuffer(buffer, dtype="<u2").astype(np.uint32) << 16
        array = bits.view(np.float32)
    else:
        array = np.frombuffer(buffer, dtype=np.dtype(_DTYPES[dtype]).newbyteorder("<"))
    return array.astype(np.float32, copy=False).reshape(shape)


def _unique_names(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the name {key!r} appears twice")
        out[key] = value
    return out


def _safetensors_header(name, f, size):
    """`(header length, {tensor: (dtype, shape, begin, end)})`, each entry
    checked on its own; the header read only once its length is checked."""
    head = f.read(8)
    if len(head) < 8:
        raise CorruptCheckpointError(
            f"{name!r} is not a readable safetensors file: {size} bytes, fewer "
            "than the 8 of the header length.")
    (length,) = struct.unpack("<Q", head)
    if length > SAFETENSORS_MAX_HEADER:
        raise CorruptCheckpointError(
            f"{name!r}: its safetensors header length is {length:,} bytes, more "
            f"than the format's limit of {SAFETENSORS_MAX_HEADER:,}.")
    if length > size - 8:
        raise CorruptCheckpointError(
            f"{name!r} is truncated: its safetensors header length is {length:,} "
            f"bytes, but only {size - 8:,} follow the length field. Download it again.")
    raw = f.read(length)
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_names)
    except RecursionError:
        raise CorruptCheckpointError(
            f"{name!r} is a damaged safetensors file: its header nests JSON arrays or "
            "objects too deeply to read; expected an object of tensor entries, each "
            "an object of dtype, shape and data_offsets.") from None
    except ValueError as error:
        raise CorruptCheckpointError(
            f"{name!r} is not a readable safetensors file (its header is not "
            f"JSON: {error}).") from error
    if not raw.startswith(b"{") or not isinstance(header, dict):
        raise CorruptCheckpointError(
            f"{name!r}: its safetensors header is not a JSON object "
            f"(it starts with {raw[:20]!r}).")
    metadata = header.pop("__metadata__", {})
    bad = ([k for k, v in metadata.items() if not isinstance(v, str)]
           if isinstance(metadata, dict) else None)
    if bad is None or bad:
        got = (f"its value for {bad[0]!r} is {type(metadata[bad[0]]).__name__}" if bad
               else f"it is {type(metadata).__name__}")
        raise CorruptCheckpointError(
            f"{name!r}: __metadata__ must be a JSON object of strings, {got}.")
    return length, {key: _entry(name, key, value) for key, value in header.items()}


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name, key, entry):
    """`(dtype, shape, begin, end)` of one header entry, or the error."""
    what = f"{name!r}: tensor {key!r}"
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise CorruptCheckpointError(
            f"{what} is not an entry with dtype, shape and data_offsets "
            f"(got {json.dumps(entry)[:60]}).")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _FORMAT_BITS:
        raise CorruptCheckpointError(
            f"{what} has dtype {json.dumps(dtype)[:40]}, which is not a "
            f"safetensors dtype ({', '.join(_FORMAT_BITS)}).")
    if not isinstance(shape, list) or not all(map(_is_count, shape)):
        raise CorruptCheckpointError(
            f"{what} has shape {json.dumps(shape)[:60]}; expected a list of "
            "non-negative integers.")
    if len(shape) > _MAX_DIMS:
        raise CorruptCheckpointError(
            f"{what} has a shape of {len(shape)} dimensions; expected at most {_MAX_DIMS}.")
    if any(d >= 2**63 for d in shape):
        raise CorruptCheckpointError(
            f"{what} has shape {json.dumps(shape)[:60]}; expected dimensions below 2**63.")
    if 4 * math.prod(d for d in shape if d) >= 2**63:  # numpy's bound, a 0 among them or not
        raise CorruptCheckpointError(
            f"{what} has shape {json.dumps(shape)[:60]}, whose dimensions multiply past "
            "the 2**63 bytes any float32 array can have (a 0 among them does not help).")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(map(_is_count, offsets))
            and offsets[0] <= offsets[1]):
        raise CorruptCheckpointError(
            f"{what} has data_offsets {json.dumps(offsets)[:60]}; expected "
            "[BEGIN, END] with 0 <= BEGIN <= END.")
    (begin, end), bits = offsets, math.prod(shape) * _FORMAT_BITS[dtype]
    if bits != 8 * (end - begin):
        needs = f"{bits // 8:,}" if bits % 8 == 0 else f"{bits / 8:,}"
        raise CorruptCheckpointError(
            f"{what} has data_offsets [{begin}, {end}] ({end - begin:,} bytes), "
            f"but dtype {dtype} x shape {shape} needs {needs} bytes.")
    return dtype, shape, begin, end


def _check_tiling(name, entries, data_size):
    """The tensors, sorted by offsets, tile the `data_size` bytes after the
    header exactly."""
    ended, previous = 0, None
    for key, (_, _, begin, end) in sorted(entries.items(), key=lambda e: e[1][2:]):
        if begin < ended:
            raise CorruptCheckpointError(
                f"{name!r}: tensor {key!r} (data_offsets [{begin}, {end}]) overlaps "
                f"tensor {previous!r}, which ends at byte {ended}; {_TILING}.")
        if begin > ended:
            after = f"tensor {previous!r} ends" if previous else "the data section begins"
            raise CorruptCheckpointError(
                f"{name!r}: tensor {key!r} begins at byte {begin}, but {after} at "
                f"byte {ended}: {begin - ended:,} bytes belong to no tensor; {_TILING}.")
        ended, previous = end, key
    if ended > data_size:
        raise CorruptCheckpointError(
            f"{name!r} is truncated: tensor {previous!r} ends at byte {ended} of "
            f"a {data_size}-byte data section. Download it again.")
    if ended < data_size:
        last = f"the last tensor, {previous!r}," if previous else "the header (no tensors)"
        raise CorruptCheckpointError(
            f"{name!r}: {data_size - ended:,} bytes follow {last} at the end of "
            f"the file; {_TILING}.")
