"""Reading an official `.npz` checkpoint: `{canonical key: float32 array}`.

The released files (google-research/vision_transformer) are `numpy.savez`
archives of float32 arrays keyed by '/'-joined Flax parameter paths. ViT
block children carry the pre-Linen names of the 2020 release
(`LayerNorm_0`, `MultiHeadDotProductAttention_1`, `LayerNorm_2`,
`MlpBlock_3`); files written by Linen code use `LayerNorm_0`,
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`. Both are
read (`canonical_keys`).

Nothing a file declares is allocated before it is checked: an `.npz` is
read member by member from the zip directory's sizes (numpy's own stored
or deflate members only; each `.npy` header's shape x itemsize must be the
member's size), within `max_checkpoint_bytes()`
(`$KERAS_VIT_MAX_CHECKPOINT_BYTES`, default 16 GiB) in all. NumPy only, no
Keras: downloading a checkpoint reads it with this module.

>>> list(canonical_keys({"Transformer/encoderblock_0/MlpBlock_0/Dense_0/bias": 0,
...                      "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/out/bias": 0}))
... # doctest: +NORMALIZE_WHITESPACE
['Transformer/encoderblock_0/MlpBlock_3/Dense_0/bias',
 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/bias']
"""

import math
import os
import re
import zipfile
import zlib

import numpy as np

from keras_vit.errors import CorruptCheckpointError, NotAnNpzError, UnsupportedCheckpointError
from keras_vit.weights.sniff import check_checkpoint_bytes, max_checkpoint_bytes, sniff_checkpoint

POSEMB_KEY = "Transformer/posembed_input/pos_embedding"
# keras_vit's keys for the prefix tokens the official ViT does not have
# (#48): DeiT's distillation token `(1, 1, D)` and DINOv2's register tokens
# `(1, R, D)`, in the order they follow the class token. The other
# additions keep big_vision's names where it has them (`MAPHead_0/...`,
# SigLIP's attention-pooling head) and otherwise name the layer:
# `Transformer/encoderblock_i/LayerScale_{0,1}/scale` (after the attention,
# after the MLP) and `pre_norm/{scale,bias}` (OpenAI CLIP's `ln_pre`).
DIST_KEY = "dist"
# no weight: the head of a class-token model reads the patch tokens' mean
# (classifier "avg": EVA-02, DINOv3, BEiT); a (0,) array
AVG_POOL_KEY = "pooling/avg"
REG_KEY = "reg"


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
    if not any("/MultiHeadDotProductAttention_0/" in k and _ENCODER_CHILD.match(k)
               for k in params):  # (a SigLIP MAPHead_0's attention is not Linen's)
        return dict(params)
    out = {}
    for key, value in params.items():
        match = _ENCODER_CHILD.match(key)
        if match:
            block, child, rest = match.groups()
            key = f"{block}/{_LINEN_TO_PRE_LINEN.get(child, child)}{rest}"
        out[key] = value
    return out


def as_not_npz(error, name):
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
        raise as_not_npz(error, name) from error
    if kind == "keras_weights":
        raise as_not_npz(keras_weights_error(name), name)
    return read_npz(path, name)


def keras_weights_error(name):
    """What `read_checkpoint` and `model_from_checkpoint` say of a Keras
    `.weights.h5` file."""
    return UnsupportedCheckpointError(
        f"{name!r} is a Keras .weights.h5 file, not an official .npz "
        "checkpoint: it holds no architecture. Pass it as `weights=` to "
        "the builder of the model that wrote it (e.g. "
        "keras_vit.ViTB16(weights=path)) or call model.load_weights(path); "
        "read_checkpoint and model_from_checkpoint read official .npz files.")


def read_npz(path, name):
    """`read_checkpoint` of a file `sniff_checkpoint` has already called an
    `"npz"`: the arrays, read once, without sniffing the file again."""
    return canonical_keys(read_npz_arrays(path, name))


def read_npz_arrays(path, name):
    """`{member name without .npy: array}` of any `.npz` of numeric arrays
    (a LoRA backup's too), read with the checks of `read_checkpoint`: each
    `.npy` header against the zip directory before anything is allocated,
    `max_checkpoint_bytes()` in all; no key renamed.

    Raises:
        CorruptCheckpointError: as `read_checkpoint` (`name` names the file).
    """
    path = os.path.expanduser(os.fspath(path))
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
    return params


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
