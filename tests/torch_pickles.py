"""torch.save files written opcode by opcode: what no pickler writes (a
stride-0 view, a huge shape, a BUILD on a storage type, one key of
megabytes), and no torch needed. Shared by the PyTorch reader's tests and
benchmarks/bounds.py (plain functions, no pytest)."""

import warnings
import zipfile


def g(module, name):
    """GLOBAL `module.name`."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text):
    """BINUNICODE `text`."""
    data = text.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def i(n):
    """BININT `n` (LONG4 past 31 bits)."""
    if 0 <= n < 2**31:
        return b"J" + n.to_bytes(4, "little")
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8b" + len(data).to_bytes(4, "little") + data


def storage(numel=6, key="0", kind="FloatStorage", build=b""):
    """The persistent id of storage `key`: `numel` elements of `kind`
    (`build`: opcodes put after the type)."""
    return (b"(" + s("storage") + g("torch", kind) + build + s(key) + s("cpu") + i(numel)
            + b"tQ")


def tensor(stored, shape=(6,), stride=(1,), offset=0):
    """`torch._utils._rebuild_tensor_v2` of `stored` (`storage(...)`)."""
    def ints(xs):
        return b"(" + b"".join(i(x) for x in xs) + b"t"
    return (g("torch._utils", "_rebuild_tensor_v2") + b"(" + stored + i(offset) + ints(shape)
            + ints(stride) + b"\x89" + g("collections", "OrderedDict") + b")RtR")


def mapping(items):
    """A dict of `(key, opcodes)` pairs."""
    return b"}(" + b"".join(s(k) + v for k, v in items) + b"u"


def state(items):
    """A whole data.pkl: protocol 2, the dict of `items`, STOP."""
    return b"\x80\x02" + mapping(items) + b"."


def torch_zip(path, payload, storages, extra=()):
    """`payload` as `data.pkl` of a torch.save zip with `storages`
    ({key: bytes}); `extra`: more (name, bytes) members. Returns `path` as str."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile: "Duplicate name"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("a/data.pkl", payload)
            archive.writestr("a/byteorder", "little")
            for key, data in storages.items():
                archive.writestr(f"a/data/{key}", data)
            for name, data in extra:
                archive.writestr(name, data)
    return str(path)
