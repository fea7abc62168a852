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
  Floating tensors come out as float32 (as `safetensors.read_safetensors`).
- Bounded: `data.pkl` at most `MAX_PICKLE_BYTES`; stored (uncompressed)
  members only, each name once, as torch writes them; a tensor at most the
  elements of the storage it views (no stride-0 expansion), the tensors at
  most `MAX_VIEWS_PER_ELEMENT` times the elements stored, and the bytes
  made at most `max_checkpoint_bytes()` in all (for a sharded folder: all
  its shards together).

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
import reprlib
import zipfile

import numpy as np

from keras_vit.errors import CorruptCheckpointError, UnsupportedCheckpointError
from keras_vit.weights.sniff import ByteCount, sniff_checkpoint

logger = logging.getLogger("keras_vit")

MAX_PICKLE_BYTES = 1 << 23  # 8 MiB: a ViT-H state dict's data.pkl is about 0.2 MB
MAX_GLOBALS = 1000          # distinct globals a data.pkl may name (a state dict: 3 or 4)
MAX_DEPTH = 32              # nesting of the pickled object (a training checkpoint: about 6)
MAX_VIEWS_PER_ELEMENT = 2   # tensor elements per stored element (a slice and its whole: 2)
_MAX_INT = 1 << 63          # sizes, strides and offsets are int64 in torch
# Where the weights sit in a checkpoint that holds more than a state dict,
# in the order they are looked up (timm train.py, Lightning-style, DDP
# wrappers, PyTorch tutorials, DINO's teacher); with `ema=True`: the EMA copies.
STATE_KEYS = ("state_dict", "model", "module", "model_state_dict", "teacher")
EMA_KEYS = ("state_dict_ema", "model_ema")
# Prefixes that wrappers add to every key: DistributedDataParallel,
# torch.compile, DINO's MultiCropWrapper, a Lightning module's `model`.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "backbone.", "model.")

_STORAGES = {
    "FloatStorage": np.dtype("<f4"), "HalfStorage": np.dtype("<f2"),
    "BFloat16Storage": np.dtype("<u2"), "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"), "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"), "BoolStorage": np.dtype("?"),
}


class _FileError(ValueError):
    """A ValueError this module raises about the file (re-raised as it is;
    any other ValueError from reading is wrapped as a CorruptCheckpointError)."""


class Opaque:
    """A global of the file that is not part of a tensor state dict (e.g.
    `argparse.Namespace`), kept as its name and arguments: never imported,
    never called."""

    def __init__(self, *args, **kwargs):
        self.args = args
        self.state = None

    def __setstate__(self, state):  # BUILD stores, nothing else
        self.state = state

    def __repr__(self):
        return f"<{self.name} (not loaded)>"


class _Sealed:
    """Objects of ours that a pickle reaches: no attribute of theirs can be
    set by the file (BUILD raises)."""

    __slots__ = ()

    def __setstate__(self, state):
        raise pickle.UnpicklingError(f"BUILD on {type(self).__name__.strip('_')}")


class _StorageType(_Sealed):
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    @property
    def dtype(self):
        return _STORAGES.get(self.name)


class _Storage(_Sealed):
    """One `data/<key>` member as a 1-D array of its dtype."""

    __slots__ = ("array", "name", "bfloat16")

    def __init__(self, array, name, bfloat16):
        self.array, self.name, self.bfloat16 = array, name, bfloat16


class _Tensor(_Sealed):
    """What `_rebuild_tensor_v2` made: the checked, copied array."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


class _Call(_Sealed):
    """One of the reader's functions, as the file's global resolves to it."""

    __slots__ = ("function",)

    def __init__(self, function):
        self.function = function

    def __call__(self, *args):
        return self.function(*args)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, reader):
        super().__init__(file)
        self.reader = reader
        self.opaque = {}
        self.calls = {"torch._utils._rebuild_tensor_v2": _Call(reader.rebuild_tensor),
                      "torch._utils._rebuild_parameter": _Call(reader.rebuild_parameter)}

    def find_class(self, module, name):
        full = f"{module}.{name}"
        if full == "collections.OrderedDict":
            return collections.OrderedDict
        if full in self.calls:
            return self.calls[full]
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        if full not in self.opaque:
            if len(self.opaque) >= MAX_GLOBALS:
                raise _FileError(f"{self.reader.name!r}: its data.pkl names more than "
                                 f"{MAX_GLOBALS} globals; a tensor checkpoint names a few.")
            self.opaque[full] = type("Opaque", (Opaque,), {"name": full, "__module__": __name__})
        return self.opaque[full]

    def persistent_load(self, pid):
        return self.reader.storage(pid)


class _Reader:
    """Reads one torch zip: its storages on demand (each once), the tensors
    checked against them (a view holds at most its storage's elements, the
    views of the file at most `MAX_VIEWS_PER_ELEMENT` times the elements
    stored; the same view twice is one tensor), every byte made counted
    against the bound (`count`: a `ByteCount`, shared by a folder's shards)."""

    def __init__(self, name, archive, prefix, count):
        self.name, self.archive, self.prefix, self.count = name, archive, prefix, count
        self.storages, self.views, self.stored, self.viewed = {}, {}, 0, 0
        order = self._member("byteorder", optional=True)
        if order is not None and order.strip() not in (b"little", b"big"):
            raise CorruptCheckpointError(
                f"{name!r} is a damaged PyTorch checkpoint: its byteorder is "
                f"{reprlib.repr(order)}, not little or big.")
        self.big_endian = order is not None and order.strip() == b"big"

    def _count(self, nbytes):
        self.count.add(nbytes)

    def _member(self, path, optional=False, size=None):
        """The bytes of `<prefix>path` (at most `size` of them are used)."""
        try:
            info = self.archive.getinfo(self.prefix + path)
        except KeyError:
            if optional:
                return None
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: it has no "
                f"{self.prefix}{path}, which its data.pkl refers to.") from None
        if info.compress_type != zipfile.ZIP_STORED:
            raise CorruptCheckpointError(
                f"{self.name!r}: {info.filename} is compressed; torch.save stores its "
                "members uncompressed, so the file was rewritten by another tool. Save "
                "it again with torch.save.")
        if size is not None and info.file_size < size:
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: {path} holds "
                f"{info.file_size:,} bytes, fewer than its tensors need ({size:,}).")
        if info.file_size > (size if size is not None else MAX_PICKLE_BYTES):
            raise CorruptCheckpointError(
                f"{self.name!r}: {path} holds {info.file_size:,} bytes, more than "
                f"{'its storage declares' if size is not None else 'such a member needs'}.")
        return self.archive.read(info)

    def _unreadable_type(self, type_name):
        return UnsupportedCheckpointError(
            f"{self.name!r} holds tensors {type_name}, a type keras_vit does not read "
            f"({', '.join(sorted(_STORAGES))}); convert them to float32.")

    def storage(self, pid):
        if isinstance(pid, tuple) and len(pid) == 5 and _what(pid[1]).startswith("the global"):
            raise self._unreadable_type(f"stored as {pid[1].name}")
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str)
                and _is_count(pid[4])):
            raise CorruptCheckpointError(
                f"{self.name!r} is not a PyTorch tensor checkpoint: its data.pkl refers to "
                f"{reprlib.repr(pid)}, not to a storage ('storage', type, key, location, size).")
        _, kind, key, _, numel = pid
        if kind.dtype is None:
            raise self._unreadable_type(f"of torch.{kind.name}")
        if key not in self.storages:
            nbytes = numel * kind.dtype.itemsize
            self._count(nbytes)
            self.stored += numel
            data = self._member(f"data/{key}", size=nbytes)
            dtype = kind.dtype.newbyteorder(">") if self.big_endian else kind.dtype
            array = np.frombuffer(data, dtype, count=numel)
            self.storages[key] = _Storage(array, key, kind.name == "BFloat16Storage")
        return self.storages[key]

    def rebuild_tensor(self, storage, offset, size, stride, *rest):
        if not isinstance(storage, _Storage):
            raise _FileError(
                f"{self.name!r}: a tensor's data is {_what(storage)}, not a storage of "
                "the file.")
        if not (_is_counts(size) and _is_counts(stride) and len(size) == len(stride)
                and _is_count(offset)):
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: a tensor of storage "
                f"{storage.name} has shape {reprlib.repr(size)}, strides "
                f"{reprlib.repr(stride)} and offset {reprlib.repr(offset)}, which do not "
                "describe a view (tuples of whole numbers below 2**63 of one length).")
        count = math.prod(size)
        same = (storage.name, offset, size, stride)
        if same in self.views:  # tied weights: one tensor under two names
            return self.views[same]
        if count > len(storage.array):
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: a tensor of shape {size} "
                f"(strides {stride}) holds {count:,} elements, more than the "
                f"{len(storage.array):,} of storage {storage.name} it views (its strides "
                "repeat elements); keras_vit reads views no larger than their storage.")
        self.viewed += count
        if self.viewed > MAX_VIEWS_PER_ELEMENT * self.stored:
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: its tensors hold "
                f"{self.viewed:,} elements, more than {MAX_VIEWS_PER_ELEMENT} times the "
                f"{self.stored:,} its storages hold; a state dict's views (a slice, a "
                "transpose) read each stored element once or twice.")
        # float32 out, or the integers' own size; bfloat16 needs two temporaries more
        item = storage.array.itemsize
        self._count(count * (max(4, item) + (8 if storage.bfloat16 else 0)))
        end = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
        if count and end > len(storage.array):
            raise CorruptCheckpointError(
                f"{self.name!r} is a damaged PyTorch checkpoint: a tensor of shape "
                f"{size} (strides {stride}, offset {offset}) reaches element {end - 1:,} "
                f"of storage {storage.name}, which has {len(storage.array):,}.")
        view = np.lib.stride_tricks.as_strided(
            storage.array[offset:] if count else storage.array[:0], size,
            tuple(s * item for s in stride) if count else (0,) * len(size), writeable=False)
        if storage.bfloat16:
            array = (view.astype(np.uint32) << 16).view(np.float32)
        elif view.dtype.kind == "f":
            array = view.astype(np.float32)
        else:
            array = view.astype(view.dtype.newbyteorder("="))
        self.views[same] = _Tensor(array)
        return self.views[same]

    def rebuild_parameter(self, data, requires_grad=False, backward_hooks=None, *rest):
        if not isinstance(data, _Tensor):
            raise _FileError(f"{self.name!r}: a parameter's data is {_what(data)}, not a tensor.")
        return data


def ema_error(name, what):
    """The ValueError of `ema=True` for weights that have no EMA copy."""
    return ValueError(
        f"ema=True reads the EMA weights of a PyTorch training checkpoint "
        f"(state_dict_ema / model_ema); {name!r} is {what}, which holds one set of weights.")


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_INT


def _is_counts(values):
    return isinstance(values, tuple) and len(values) <= 64 and all(map(_is_count, values))


def _what(value):
    if isinstance(value, Opaque) or (isinstance(value, type) and issubclass(value, Opaque)):
        return f"the global {value.name!r} (not loaded)"
    return f"a {type(value).__name__}"


def _data_pickle(name, archive):
    """The archive prefix ("<folder>/" or ""): where the one `data.pkl` is.
    No member may appear twice: zipfile reads the last of two members of
    one name, so a second `data/<key>` would replace a storage silently."""
    names = archive.namelist()
    found = [n for n in names
             if n == "data.pkl" or (n.endswith("/data.pkl") and n.count("/") == 1)]
    if len(found) != 1:
        raise UnsupportedCheckpointError(
            f"{name!r} is a zip archive but not a PyTorch checkpoint "
            f"({len(found)} top-level data.pkl members, torch.save writes one).")
    if len(set(names)) != len(names):
        seen = set()
        twice = next(n for n in names if n in seen or seen.add(n))
        raise CorruptCheckpointError(
            f"{name!r} is a damaged PyTorch checkpoint: its member {twice!r} appears "
            "more than once (torch.save writes each once, and which copy is read would "
            "depend on the reader).")
    return found[0][:-len("data.pkl")]


def read_torch_file(path, name=None, sniffed=False, count=None):
    """The object `torch.save` wrote to `path`, with each tensor a NumPy
    array and each other global an `Opaque` record.

    `sniffed=True`: `sniff_checkpoint` has called the file `"torch"`
    already (it is not sniffed again). `count`: the `sniff.ByteCount` the
    bytes made are counted in (a sharded folder's, shared by its shards;
    default: this file's own).

    Raises:
        CheckpointNotFoundError: no file at `path`.
        UnsupportedCheckpointError: not a PyTorch zip checkpoint (a legacy
            torch < 1.6 file says how to save it again), or tensors of a
            type keras_vit does not read.
        CorruptCheckpointError: a damaged file (truncated zip, a storage
            shorter than its tensors, views past a storage or larger
            than it, views reading the stored elements more than
            `MAX_VIEWS_PER_ELEMENT` times, a zip member twice, nesting deeper
            than `MAX_DEPTH`, ...), or more than `max_checkpoint_bytes()`
            of storages and tensors.
        ValueError: a tensor whose data is something other than a storage
            (the message names the global found).
    """
    name = os.fspath(path) if name is None else name
    path = os.path.expanduser(os.fspath(path))
    if not sniffed and sniff_checkpoint(path, name=name, torch=True) != "torch":
        raise UnsupportedCheckpointError(f"{name!r} is not a PyTorch checkpoint.")
    count = ByteCount(repr(name)) if count is None else count
    try:
        with zipfile.ZipFile(path) as archive:
            reader = _Reader(name, archive, _data_pickle(name, archive), count)
            pickled = reader._member("data.pkl")
            return _arrays(_Unpickler(io.BytesIO(pickled), reader).load(), name)
    except (CorruptCheckpointError, UnsupportedCheckpointError, _FileError):
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, OSError, KeyError,
            IndexError, TypeError, AttributeError, ValueError, OverflowError, MemoryError,
            RecursionError) as error:
        raise CorruptCheckpointError(
            f"{name!r} is not a readable PyTorch checkpoint ({type(error).__name__}: "
            f"{str(error)[:200]}).") from error


def _arrays(obj, name):
    """`obj` with each `_Tensor` replaced by its array (in dicts, lists,
    tuples), each object converted once (a pickle can share one list under
    many others), at most `MAX_DEPTH` deep."""
    done = {}

    def convert(value, depth):
        if isinstance(value, _Tensor):
            return value.array
        if not isinstance(value, (dict, list, tuple)):
            return value
        if id(value) in done:
            return done[id(value)]
        if depth > MAX_DEPTH:
            raise CorruptCheckpointError(
                f"{name!r}: its data.pkl nests deeper than {MAX_DEPTH} levels (or holds a "
                "cycle); a tensor checkpoint nests a few.")
        if isinstance(value, dict):
            out = {k: convert(v, depth + 1) for k, v in value.items()}
        else:
            out = type(value)(convert(v, depth + 1) for v in value)
        done[id(value)] = out
        return out

    return convert(obj, 0)


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
            held = sorted(map(str, obj)) if isinstance(obj, dict) else [_what(obj)]
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
    state = _unwrapped(state)
    if where == "teacher" and any(k.startswith("backbone.") for k in state):
        dropped = [k for k in state if not k.startswith("backbone.")]
        state = _unwrapped({k: v for k, v in state.items() if k.startswith("backbone.")})
        others.append(f"the teacher's projection head ({len(dropped)} tensors)")
    return state, where, others


def _unwrapped(state):
    """`state` without the wrapper prefixes that every key has, stripped
    until none is left (`_orig_mod.module.x` -> `x`).

    In linear time: the prefixes are found at a moving offset and each key
    is cut once (a key of a million `module.` costs one pass, not a copy
    per prefix)."""
    start = 0
    while state and (prefix := next((p for p in WRAPPER_PREFIXES
                                     if all(k.startswith(p, start) for k in state)), None)):
        start += len(prefix)
    return {k[start:]: v for k, v in state.items()} if start else state


def read_torch_weights(path, name=None, ema=False, sniffed=False, count=None):
    """`(state, where)`: the tensor state dict in a PyTorch checkpoint
    (see `state_dict_of`) and the key it was found under (None: the file
    is the state dict itself), with one log line saying what was read and
    what else the file held. `where` tells whose weights they are, e.g.
    `"teacher"` in DINO's training checkpoints.

    Example:

    ```python
    state, where = read_torch_weights("dino_vitbase16_pretrain_full_checkpoint.pth")
    where  # "teacher"
    ```
    """
    name = os.fspath(path) if name is None else name
    state, where, others = state_dict_of(read_torch_file(path, name, sniffed, count), name,
                                         ema=ema)
    what = f"{where!r}" if where else "the state dict"
    also = f"; also in the file: {', '.join(others)}" if others else ""
    logger.info("read %s (%d tensors) of %r%s", what, len(state), name, also)
    return state, where


def read_torch_state(path, name=None, ema=False, sniffed=False, count=None):
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
    return read_torch_weights(path, name, ema=ema, sniffed=sniffed, count=count)[0]
