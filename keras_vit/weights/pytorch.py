"""PyTorch checkpoints, read with the standard library and NumPy: nothing
a file names is imported or called, and torch is not needed.

`torch.save` (torch >= 1.6) writes a zip: `<archive>/data.pkl`, the pickled
object, whose tensors point at storages stored as `<archive>/data/<key>`
(raw little-endian bytes), plus `byteorder` and `version`. This module reads
`.pth`, `.pt`, `.bin` (Hub `pytorch_model.bin`), `.pth.tar` and `.ckpt` files
in that format:

- `data.pkl` goes through a restricted unpickler, as PyTorch's own
  `torch.load(weights_only=True)` does. It resolves only what a tensor state
  dict needs, each to a function of ours: `collections.OrderedDict`,
  `torch._utils._rebuild_tensor_v2` / `_rebuild_parameter` and the storage
  types (`torch.FloatStorage`, ...). Any other global (`argparse.Namespace`
  in timm's training checkpoints, `os.system` in a crafted file) becomes an
  inert `Opaque` record, never called; where a tensor is expected and an
  `Opaque` is found, a ValueError names the global.
- Storages are read from `data/<key>` with their dtype (float32, float16,
  bfloat16, float64, the integer types, bool); tensors are their views with
  offset, shape and strides, each checked against the storage, and copied.
  Floating tensors come out as float32 (as `hub.read_safetensors`).
- Bounded: `data.pkl` at most `MAX_PICKLE_BYTES`; stored (uncompressed)
  members only, as torch writes them; the tensors made at most
  `max_checkpoint_bytes()` in all.

Example:

```python
state = read_torch_state("vit_s16.pth")      # {"cls_token": array, ...}
```
"""

import collections
import io
import logging
import math
import os
import pickle
import zipfile

import numpy as np

from keras_vit.errors import CorruptCheckpointError, UnsupportedCheckpointError
from keras_vit.weights.sniff import check_checkpoint_bytes, max_checkpoint_bytes

logger = logging.getLogger("keras_vit")

MAX_PICKLE_BYTES = 1 << 26  # 64 MiB: a ViT-H state dict's data.pkl is about 0.2 MB
# Where the weights sit in a checkpoint that holds more than a state dict,
# in the order they are looked up (timm train.py, Lightning-style, DDP
# wrappers, PyTorch tutorials, DINO's teacher); with `ema=True`: the EMA copies.
STATE_KEYS = ("state_dict", "model", "module", "model_state_dict", "teacher")
EMA_KEYS = ("state_dict_ema", "model_ema")
# Prefixes of every key that wrappers add: DistributedDataParallel,
# torch.compile, DINO's MultiCropWrapper.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "backbone.")

_STORAGES = {
    "FloatStorage": np.dtype("<f4"), "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"), "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"), "BoolStorage": np.dtype("?"),
}


class Opaque:
    """A global of the file that is not part of a tensor state dict (e.g.
    `argparse.Namespace`), kept as its name and arguments: never imported,
    never called."""

    def __init__(self, *args):
        self.args = args
        self.state = None

    def __setstate__(self, state):  # BUILD stores, nothing else
        self.state = state

    def __repr__(self):
        return f"<{self.name} (not loaded)>"


def _opaque(name):
    return type("Opaque", (Opaque,), {"name": name, "__module__": __name__})


class _StorageType:
    def __init__(self, name):
        self.name = name
        self.dtype = _STORAGES[name]


class _Storage:
    """One `data/<key>` member as a 1-D array of its dtype."""

    def __init__(self, array, name, bfloat16):
        self.array, self.name, self.bfloat16 = array, name, bfloat16


class _Tensor:
    """What `_rebuild_tensor_v2` made: the checked, copied array."""

    def __init__(self, array):
        self.array = array


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, reader):
        super().__init__(file)
        self.reader = reader

    def find_class(self, module, name):
        full = f"{module}.{name}"
        if full == "collections.OrderedDict":
            return collections.OrderedDict
        if full == "torch._utils._rebuild_tensor_v2":
            return self.reader.rebuild_tensor
        if full == "torch._utils._rebuild_parameter":
            return self.reader.rebuild_parameter
        if module == "torch" and name in _STORAGES:
            return _StorageType(name)
        return _opaque(full)

    def persistent_load(self, pid):
        return self.reader.storage(pid)


class _Reader:
    """Reads one torch zip: its storages on demand (each once), the tensors
    checked against them, the bytes made counted against the bound."""

    def __init__(self, name, archive, prefix):
        self.name, self.archive, self.prefix = name, archive, prefix
        self.storages, self.made = {}, 0
        self.limit = max_checkpoint_bytes()
        order = self._member("byteorder", optional=True)
        self.big_endian = order is not None and order.strip() == b"big"

    def _member(self, path, optional=False):
        try:
            info = self.archive.getinfo(f"{self.prefix}/{path}")
        except KeyError:
            if optional:
                return None
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: it has no "
                f"{self.prefix}/{path}, which its data.pkl refers to.") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise CorruptCheckpointError(
                f"{self.name!r}: {info.filename} is compressed; torch.save stores its "
                "members uncompressed, so the file was rewritten by another tool. Save "
                "it again with torch.save.")
        return self.archive.read(info)

    def storage(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and isinstance(pid[4], int) and not isinstance(pid[4], bool) and pid[4] >= 0):
            raise CorruptCheckpointError(
                f"{self.name!r} is not a PyTorch tensor checkpoint: its data.pkl refers to "
                f"{str(pid)[:80]}, not to a storage ('storage', type, key, location, size).")
        _, kind, key, _, numel = pid
        if key not in self.storages:
            if numel * kind.dtype.itemsize > self.limit:
                check_checkpoint_bytes(repr(self.name), numel * kind.dtype.itemsize)
            data = self._member(f"data/{key}")
            if len(data) < numel * kind.dtype.itemsize:
                raise CorruptCheckpointError(
                    f"{self.name!r} is a damaged PyTorch checkpoint: storage {key} holds "
                    f"{len(data):,} bytes, fewer than its {numel:,} {kind.name} elements "
                    f"need ({numel * kind.dtype.itemsize:,}).")
            dtype = kind.dtype.newbyteorder(">") if self.big_endian else kind.dtype
            array = np.frombuffer(data, dtype, count=numel)
            self.storages[key] = _Storage(array, key, kind.name == "BFloat16Storage")
        return self.storages[key]

    def rebuild_tensor(self, storage, offset, size, stride, *rest):
        if not isinstance(storage, _Storage):
            raise ValueError(
                f"{self.name!r}: a tensor's data is {_what(storage)}, not a storage of "
                "the file.")
        shape, strides = _ints(size, "shape"), _ints(stride, "strides")
        if len(shape) != len(strides) or not _is_count(offset):
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: a tensor of storage "
                f"{storage.name} has shape {size!r}, strides {stride!r} and offset "
                f"{offset!r}, which do not describe a view.")
        count = math.prod(shape)
        end = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
        if count and end > len(storage.array):
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: a tensor of shape "
                f"{shape} (strides {strides}, offset {offset}) reaches element {end - 1:,} "
                f"of storage {storage.name}, which has {len(storage.array):,}.")
        self.made += count * 4
        check_checkpoint_bytes(repr(self.name), self.made)
        item = storage.array.itemsize
        view = np.lib.stride_tricks.as_strided(
            storage.array[offset:] if count else storage.array[:0], shape,
            tuple(s * item for s in strides), writeable=False)
        array = np.array(view)
        if storage.bfloat16:
            array = (array.astype(np.uint32) << 16).view(np.float32)
        elif array.dtype.kind == "f":
            array = array.astype(np.float32)
        return _Tensor(array.astype(array.dtype.newbyteorder("=")))

    def rebuild_parameter(self, data, requires_grad=False, backward_hooks=None, *rest):
        if not isinstance(data, _Tensor):
            raise ValueError(f"{self.name!r}: a parameter's data is {_what(data)}, not a tensor.")
        return data


def ema_error(name, what):
    """The ValueError of `ema=True` for weights that have no EMA copy."""
    return ValueError(
        f"ema=True reads the EMA weights of a PyTorch training checkpoint "
        f"(state_dict_ema / model_ema); {name!r} is {what}, which holds one set of weights.")


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ints(values, what):
    if not isinstance(values, tuple) or not all(_is_count(v) for v in values):
        raise CorruptCheckpointError(
            f"a tensor's {what} is {str(values)[:60]}, not a tuple of whole numbers >= 0")
    return values


def _what(value):
    if isinstance(value, Opaque) or (isinstance(value, type) and issubclass(value, Opaque)):
        return f"the global {value.name!r} (not loaded)"
    return f"a {type(value).__name__}"


def _data_pickle(name, archive):
    """The archive prefix: the folder holding the one `data.pkl`."""
    found = [n for n in archive.namelist()
             if n.endswith("/data.pkl") and n.count("/") == 1]
    if len(found) != 1:
        raise UnsupportedCheckpointError(
            f"{name!r} is a zip archive but not a PyTorch checkpoint "
            f"({len(found)} top-level */data.pkl members, torch.save writes one).")
    info = archive.getinfo(found[0])
    if info.file_size > MAX_PICKLE_BYTES:
        raise CorruptCheckpointError(
            f"{name!r}: its data.pkl has {info.file_size:,} bytes, more than the "
            f"{MAX_PICKLE_BYTES:,} a tensor checkpoint's needs.")
    return found[0][:-len("/data.pkl")]


def read_torch_file(path, name=None):
    """The object `torch.save` wrote to `path`, with each tensor a NumPy
    array and each other global an `Opaque` record.

    Raises:
        UnsupportedCheckpointError: not a PyTorch zip checkpoint.
        CorruptCheckpointError: a damaged file (truncated zip, a storage
            shorter than its tensors, views past a storage, ...), or more
            than `max_checkpoint_bytes()` of tensors.
        ValueError: a tensor whose data is something other than a storage
            (the message names the global found).
    """
    name = os.fspath(path) if name is None else name
    try:
        with zipfile.ZipFile(os.path.expanduser(os.fspath(path))) as archive:
            reader = _Reader(name, archive, _data_pickle(name, archive))
            pickled = reader._member("data.pkl")
            obj = _Unpickler(io.BytesIO(pickled), reader).load()
    except (CorruptCheckpointError, UnsupportedCheckpointError, ValueError):
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError, KeyError,
            IndexError, TypeError, AttributeError, MemoryError, RecursionError) as error:
        raise CorruptCheckpointError(
            f"{name!r} is not a readable PyTorch checkpoint ({type(error).__name__}: "
            f"{error}).") from error
    return _arrays(obj)


def _arrays(obj):
    """`obj` with each `_Tensor` replaced by its array (in dicts, lists, tuples)."""
    if isinstance(obj, _Tensor):
        return obj.array
    if isinstance(obj, dict):
        return {k: _arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_arrays(v) for v in obj)
    return obj


def _is_state(obj):
    """A non-empty dict of names to tensors (or to globals where tensors
    belong: `state_dict_of` names them)."""
    return isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj) \
        and all(isinstance(v, (np.ndarray, Opaque)) for v in obj.values())


def state_dict_of(obj, name, ema=False):
    """The tensor state dict in what `read_torch_file` returned:
    `(state, where, others)`. A dict of tensors is itself; else the first of
    `STATE_KEYS` (`EMA_KEYS` with `ema=True`) that holds one. Prefixes that
    wrappers add to every key (`WRAPPER_PREFIXES`) are stripped; under DINO's
    `teacher`, the `backbone.` keys are the ViT and its projection head
    (`head.*`) is left out and counted in `others`.

    Raises:
        UnsupportedCheckpointError: no state dict where one is looked for.
        ValueError: a value of the state dict that is not a tensor (the
            message names the global found there).
    """
    where, others = None, []
    if ema and _is_state(obj):
        raise ema_error(name, f"a state dict of {len(obj)} tensors")
    if not _is_state(obj) or ema:
        keys = EMA_KEYS if ema else STATE_KEYS
        found = next((k for k in keys if isinstance(obj, dict) and _is_state(obj.get(k))), None)
        if found is None:
            held = sorted(map(str, obj)) if isinstance(obj, dict) else [type(obj).__name__]
            raise UnsupportedCheckpointError(
                f"{name!r} holds no {'EMA ' if ema else ''}tensor state dict: looked for "
                f"a dict of tensors, then under {', '.join(map(repr, keys))}; the file "
                f"holds {', '.join(held[:8]) or 'nothing'}.")
        where, others = found, [str(k) for k in obj if k != found]
        obj = obj[found]
    state = dict(obj)
    for key, value in state.items():
        if not isinstance(value, np.ndarray):
            raise ValueError(
                f"{name!r}: {key!r} in its state dict is {_what(value)}, not a tensor.")
    if where == "teacher" and any(k.startswith("backbone.") for k in state):
        dropped = [k for k in state if not k.startswith("backbone.")]
        state = {k: v for k, v in state.items() if k.startswith("backbone.")}
        others.append(f"the teacher's projection head ({len(dropped)} tensors)")
    for prefix in WRAPPER_PREFIXES:
        if all(k.startswith(prefix) for k in state):
            state = {k[len(prefix):]: v for k, v in state.items()}
    return state, where, others


def read_torch_state(path, name=None, ema=False):
    """`{key: array}` of the tensor state dict in a PyTorch checkpoint
    (see `state_dict_of`), with one log line saying what was read and what
    else the file held.

    Example:

    ```python
    state = read_torch_state("checkpoint-300.pth.tar")  # timm train.py
    # keras_vit: read 'state_dict' (152 tensors) of 'checkpoint-300.pth.tar';
    #   also in the file: arch, args, epoch, optimizer, state_dict_ema, version
    ```
    """
    name = os.fspath(path) if name is None else name
    state, where, others = state_dict_of(read_torch_file(path, name), name, ema=ema)
    what = f"{where!r}" if where else "the state dict"
    also = f"; also in the file: {', '.join(others)}" if others else ""
    logger.info("read %s (%d tensors) of %r%s", what, len(state), name, also)
    return state
