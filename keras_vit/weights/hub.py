"""Weights from the Hugging Face Hub and its folder layout (timm and
transformers formats).

`weights=` and `keras_vit.model_from_checkpoint` accept:

- `"hf://ORG/NAME"` (optionally `"hf://ORG/NAME@REVISION"`): downloaded
  with `huggingface_hub.hf_hub_download` into its cache (`HF_HOME`,
  `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_ENDPOINT` and tokens apply as for
  every Hugging Face library). Needs the `hf` extra:
  `pip install 'keras-vision-transformer[hf]'`.
- a local folder in the Hub layout: `config.json` + `model.safetensors`
  (or `model.safetensors.index.json` and its shards), or else
  `pytorch_model.bin` (or its index and shards), plus
  `preprocessor_config.json` for transformers, as written by timm's
  `push_to_hf.save_for_hf` or transformers' `save_pretrained`.
- a bare `.safetensors` file or PyTorch file (`torch.save` of a state dict
  or of a training checkpoint holding one: `keras_vit.weights.pytorch`),
  with a builder that says the architecture
  (no `config.json`: the format is told from the key names; the
  preprocessing stays the official one unless `image_mean`/`image_std`
  are given). DINO's released ViTs (`dino_vitbase16_pretrain.pth`, ...,
  and the teacher of its training checkpoints) bring DINO's arithmetic:
  `keras_vit.weights.dino`.

The format is told from `config.json` (transformers configs have
`model_type`, timm configs `architecture`) and the key names; the key
mapping of each format is in `keras_vit.weights.timm` and
`keras_vit.weights.transformers`. The loaded model computes what the
source library computes: its GELU form, LayerNorm epsilon, `fc_norm`,
hybrid-stem standardisation, position-embedding resize and input
normalisation become the model's configuration (and so are kept by
`.keras` files). Files are read with NumPy (float32, float16 and bfloat16
tensors); PyTorch's pickles go through a restricted unpickler that calls
nothing the file names.

Example:

```python
model = keras_vit.model_from_checkpoint(
    "hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
model = keras_vit.ViTB16(weights="hf://google/vit-base-patch16-224")
model = keras_vit.model_from_checkpoint("path/to/saved_folder")
```
"""

import dataclasses
import json
import logging
import math
import os
import struct

import numpy as np

from keras_vit._checks import label_line_problem
from keras_vit.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MissingDependencyError,
    UnsupportedCheckpointError,
    WeightsDownloadError,
)
from keras_vit.layers import PatchEncoder
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.weights import dino as dino_format
from keras_vit.weights import timm as timm_format
from keras_vit.weights import transformers as transformers_format
from keras_vit.weights.architecture import describe
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.config_values import check_object, check_values, json_type
from keras_vit.weights.npz import POSEMB_KEY
from keras_vit.weights.official import load_official_weights
from keras_vit.weights.posemb import POSEMB_RESIZES, square_grid
from keras_vit.weights.pytorch import ema_error, read_torch_state, read_torch_weights
from keras_vit.weights.sniff import (
    SAFETENSORS_MAX_HEADER,
    ByteCount,
    check_checkpoint_bytes,
    is_zip,
)

logger = logging.getLogger("keras_vit")
# How each source library resizes position embeddings (`posemb.POSEMB_RESIZES`).
_RESIZE_HOW = {"timm": "bicubic with antialias (resample_abs_pos_embed)",
               "transformers": "bicubic, align_corners=False (interpolate_pos_encoding)",
               "dino": dino_format.RESIZE_HOW}
# Whose arithmetic, preprocessing and position-embedding resize weights carry.
LIBRARIES = ("timm", "transformers", "dino")

HF_PREFIX = "hf://"
INSTALL_HINT = "pip install 'keras-vision-transformer[hf]'"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"
# A folder's weights, in the order they are looked for: safetensors first.
WEIGHT_FILES = (WEIGHTS, WEIGHTS_INDEX, TORCH_WEIGHTS, TORCH_INDEX)
PREPROCESSOR = "preprocessor_config.json"
_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": None,
           "I64": np.int64, "I32": np.int32}
# Bits per element of every dtype of the safetensors format (read or not).
_FORMAT_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
                "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32,
                "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
                "F6_E2M3": 6, "F6_E3M2": 6}
_MAX_DIMS = 64  # NumPy's limit; a larger list is a damaged header
_TILING = "the safetensors format requires the tensors to tile the data section exactly"


def is_hub_uri(weights):
    return isinstance(weights, str) and weights.startswith(HF_PREFIX)


def is_hub_folder(path):
    """True for a folder with a `config.json` and weights (safetensors or
    `pytorch_model.bin`, single or sharded)."""
    path = os.path.expanduser(os.fspath(path))
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG)) and any(
        os.path.isfile(os.path.join(path, name)) for name in WEIGHT_FILES)


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
    with open(path, "wb") as f:
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


def _json_name(folder, source, filename):
    """How messages name a JSON file of a folder: under an `hf://` source
    when the folder is its download."""
    if is_hub_uri(source):
        return f"{source.rstrip('/')}/{filename}"
    return os.path.join(folder, filename)


def _read_json(path, what):
    try:
        size = os.path.getsize(path)
        if size > SAFETENSORS_MAX_HEADER:
            raise ValueError(f"{size:,} bytes, more than the {SAFETENSORS_MAX_HEADER:,} "
                             "a checkpoint's JSON file may have")
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError, RecursionError) as error:
        raise CorruptCheckpointError(f"{what} {path!r} is not readable JSON ({error}).") from error


def _shards(index_path, index):
    """`{shard file: set of tensor names}` of a sharded folder's index: a
    `weight_map` of tensor names to files inside the folder."""
    if not isinstance(index, dict):
        raise CorruptCheckpointError(
            f"Index {index_path!r} is a JSON {json_type(index)}; expected an object "
            "with a weight_map of tensor names to shard files.")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise CorruptCheckpointError(
            f"Index {index_path!r} has no weight_map of tensor names to shard "
            f"files (a non-empty JSON object of strings); got "
            f"{json.dumps(weight_map)[:60]}.")
    shards = {}
    for key, shard in weight_map.items():
        parts = shard.replace("\\", "/").split("/")
        if not shard or os.path.isabs(shard) or parts[0] == "" or ".." in parts:
            raise CorruptCheckpointError(
                f"Index {index_path!r} maps tensor {key!r} to {shard!r}, which is "
                "not a file inside its folder.")
        shards.setdefault(shard, set()).add(key)
    return shards


def _read_folder_weights(folder, ema=False):
    """The folder's state dict: `model.safetensors` (or its shards) when
    present, else `pytorch_model.bin` (or its shards)."""
    name = next(n for n in WEIGHT_FILES if os.path.isfile(os.path.join(folder, n)))
    path = os.path.join(folder, name)
    if ema and name in (WEIGHTS, WEIGHTS_INDEX):
        raise ema_error(folder, f"a folder of {name}")
    if name == WEIGHTS:
        return read_safetensors(path)
    if name == TORCH_WEIGHTS:
        return read_torch_state(path, ema=ema)
    count = ByteCount(repr(folder))  # the folder's arrays in all, not shard by shard
    read = (lambda shard: read_safetensors(shard, count)) if name == WEIGHTS_INDEX else (
        lambda shard: read_torch_state(shard, ema=ema, count=count))
    shards = _shards(path, _read_json(path, "Index"))
    paths = {shard: os.path.join(folder, shard) for shard in sorted(shards)}
    for shard_path in paths.values():
        if not os.path.isfile(shard_path):
            raise CheckpointNotFoundError(shard_path)
    check_checkpoint_bytes(repr(folder), sum(map(os.path.getsize, paths.values())))
    state = {}
    for shard, shard_path in paths.items():
        arrays = read(shard_path)
        if set(arrays) != shards[shard]:
            absent = sorted(shards[shard] - set(arrays))
            extra = sorted(set(arrays) - shards[shard])
            says = ([f"it holds no {absent[0]!r} ({len(absent)} missing)"] if absent else []) + (
                [f"it holds {extra[0]!r}, which the index maps elsewhere or not at "
                 f"all ({len(extra)} such)"] if extra else [])
            raise CorruptCheckpointError(
                f"Shard {shard_path!r} does not match {path!r}: {'; '.join(says)}.")
        state.update(arrays)
    return state


# --- download -----------------------------------------------------------------


def _huggingface_hub():
    try:
        import huggingface_hub
    except ImportError as error:
        raise MissingDependencyError(
            f"weights='hf://...' downloads with huggingface_hub, which is not "
            f"installed: {INSTALL_HINT}"
        ) from error
    return huggingface_hub


def parse_uri(uri):
    """`"hf://org/name@rev"` -> `("org/name", "rev" or None)`."""
    rest = uri[len(HF_PREFIX):].strip("/")
    repo, _, revision = rest.partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(
            f"Bad Hugging Face Hub reference {uri!r}; expected "
            "'hf://ORG/NAME' or 'hf://ORG/NAME@REVISION', e.g. "
            "'hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k'.")
    return repo, revision or None


def download(uri):
    """Downloads the files a model needs (config.json, the weights:
    `model.safetensors` or else `pytorch_model.bin`, single or sharded,
    preprocessor_config.json when there is one) with
    `huggingface_hub.hf_hub_download` and returns the folder they are in
    (a snapshot folder of the Hugging Face cache).

    Raises:
        MissingDependencyError: huggingface_hub is not installed.
        WeightsDownloadError: the repository or a file cannot be fetched
            (offline without a cached copy, unknown repository, ...).
        UnsupportedCheckpointError: the repository has neither weights file.
    """
    hub = _huggingface_hub()
    import huggingface_hub.errors as errors  # a submodule, not an attribute
    repo, revision = parse_uri(uri)

    class Absent(Exception):
        """The file is not in the repository (the server said so)."""

    def get(filename, optional=False):
        """The file's local path; None for an `optional` file that the
        repository does not have (or, offline, the cache)."""
        try:
            return hub.hf_hub_download(repo, filename, revision=revision)
        except errors.LocalEntryNotFoundError:  # offline and not cached
            if optional:
                return None
            raise
        except errors.EntryNotFoundError as error:  # not in the repository
            if optional:
                return None
            raise Absent(f"{filename} is not in the repository") from error

    try:
        config = get(CONFIG)
        folder = os.path.dirname(config)
        for single, sharded in ((WEIGHTS, WEIGHTS_INDEX), (TORCH_WEIGHTS, TORCH_INDEX)):
            if get(single, optional=True) is not None:
                break
            index = get(sharded, optional=True)
            if index is not None:
                for shard in sorted(_shards(index, _read_json(index, "Index"))):
                    get(shard)
                break
        else:
            raise UnsupportedCheckpointError(
                f"{uri} has no weights keras_vit reads: no {WEIGHTS}, {TORCH_WEIGHTS} "
                f"or their sharded indexes ({WEIGHTS_INDEX}, {TORCH_INDEX}).")
        get(PREPROCESSOR, optional=True)
    except (UnsupportedCheckpointError, MissingDependencyError):
        raise
    except Exception as error:  # noqa: BLE001 - huggingface_hub's many kinds
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        hint = ("HF_HUB_OFFLINE is set and the files are not in the Hugging Face "
                "cache" if offline else
                "check the name and revision, your network, HF_ENDPOINT and HF_TOKEN")
        raise WeightsDownloadError(
            f"Could not download {uri} from the Hugging Face Hub "
            f"({type(error).__name__}: {error}); {hint}. Or download the "
            "repository elsewhere and pass its folder."
        ) from error
    return folder


# --- one checkpoint --------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class HubCheckpoint(Checkpoint):
    """A timm or transformers checkpoint, read and described.

    Attributes (besides `Checkpoint`'s; `format` is "timm" or
    "transformers": whose key names, `preprocessing` None for a bare
    `.safetensors`):
        library: whose arithmetic, preprocessing and position-embedding
            resize the weights carry: "timm", "transformers" or "dino"
            (DINO's ViTs, timm keys: `keras_vit.weights.dino`); default:
            `format`.
        config: the parsed `config.json` (None for a bare file).
        state: `{source key: float32 array}`.
        family: "vit" or "mixer".
        architecture: builder arguments read off config and shapes
            (patch size, width, depth, heads, MLP, classifier, ResNet).
        params, names, unmapped, heads: `state` under official keys, each
            official key's source name, the source keys no mapping rule
            knows, and the number of heads `params` splits the attention
            into (`convert`'s last).
    """

    library: str | None = None
    config: dict | None = None
    state: dict
    family: str
    architecture: dict
    names: dict | None = None
    unmapped: list | None = None
    heads: int | None = None    # the number of heads `params` is split into

    def __post_init__(self):
        if self.library is None:
            self.library = self.format
        self.convert(self.architecture.get("num_heads") or 1)

    @property
    def module(self):
        return timm_format if self.format == "timm" else transformers_format

    def convert(self, num_heads):
        """Maps the state onto official keys (`params`), splitting the
        attention weights into `num_heads` heads (once per head count)."""
        if num_heads == self.heads and self.params is not None:
            return self.params
        params, names, unmapped = self.module.to_official(self.state, num_heads)
        if self.family == "mixer":
            params, names = timm_format.mixer_keys(params, names)
        self.params, self.names, self.unmapped = params, names, unmapped
        self.heads = num_heads
        return params

    def info(self):
        """`architecture.CheckpointInfo` (head, pre_logits, classifier, grid)."""
        try:
            return describe(self.params)
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(
                f"{self.source} ({self.format} format): {error}") from None

    def model_config(self):
        """`(family, builder arguments)` read off the config and shapes."""
        return self.family, dict(self.architecture)

    def source_name(self, key):
        if self.format == "timm":
            return timm_format.source_name(key)
        prefix = "vit." if any(k.startswith("vit.") for k in self.state) else ""
        return transformers_format.source_name(key, prefix)

    def load(self, model, dropped=()):
        """Assigns the weights to `model` (built with this checkpoint's
        architecture), resizing the position embedding as the source
        library does. The whole key set is checked first.

        Raises:
            CheckpointMismatchError: missing, unexpected (including keys no
                mapping rule knows) or mis-shaped keys, named as in the
                checkpoint.
        """
        shape = model.input_shape
        if self.family == "vit" and isinstance(shape, tuple) and None in shape[1:3]:
            how = _RESIZE_HOW[self.library]
            raise ValueError(
                f"input_shape={tuple(shape[1:])} (any size at call time) resizes the "
                "position embedding in the graph with the official algorithm (bilinear, "
                f"aligned corners); {self.source} is a {self.library} checkpoint, which "
                f"resizes {how}, so at other sizes the model would not compute what "
                f"{self.library} computes. Build one model per size, e.g. "
                "input_shape=(384, 384, 3).")
        blocks = encoder_blocks(model)
        heads = getattr(blocks[0], "num_heads", None) if blocks else None  # a Mixer's: none
        width = self.architecture.get("hidden_size")
        if heads and width and width % heads:
            heads = None  # cannot split: the shape check below names the misfit
        params = dict(self.convert(heads) if heads else self.params)
        encoder = next(
            (layer for layer in model.layers if isinstance(layer, PatchEncoder)), None)
        posemb = params.get(POSEMB_KEY)
        if encoder is not None and posemb is not None and posemb.ndim == 3:
            params[POSEMB_KEY] = self._resize(posemb, encoder)
        extra = {k: self.state[k] for k in self.unmapped}
        try:
            return load_official_weights(model, {**params, **extra}, self.source,
                                         dropped=dropped, key_name=self._name_of)
        except CheckpointMismatchError as error:
            raise self._mismatch(model, error) from None

    def _resize(self, posemb, encoder):
        prefix = encoder.num_prefix_tokens
        new = tuple(encoder.grid_size)
        tokens = posemb.shape[1] - prefix
        try:
            old = square_grid(tokens)
        except ValueError:
            return posemb  # reported as mis-shaped by the loader
        if old == new:
            return posemb
        logger.info(
            "Resizing the position embedding of %s from a %dx%d to a %dx%d grid "
            "as %s does (%s).", self.source, *old, *new, self.library,
            _RESIZE_HOW[self.library])
        return POSEMB_RESIZES[self.library](posemb, new, prefix, old)

    def _name_of(self, key):
        """The checkpoint's own name of an official key."""
        return self.names.get(key) or self.source_name(key)

    def _mismatch(self, model, error):
        def named(keys):
            out = []
            for key in keys:
                head, _, rest = key.partition(": ")
                name = self._name_of(head)
                out.append(f"{name}: {rest}" if rest else name)
            return list(dict.fromkeys(out))

        missing, unexpected = named(error.missing), named(error.unexpected)
        misshaped = named(error.misshaped)
        lines = [
            f"Checkpoint {self.source} ({self.format} format) does not fit model "
            f"{model.name!r}: {len(missing)} missing, {len(unexpected)} unexpected, "
            f"{len(misshaped)} mis-shaped keys (named as in the checkpoint; no key "
            "is ignored).",
            f"  To build the model the checkpoint describes, use "
            f"keras_vit.model_from_checkpoint({self.source!r}).",
        ]
        for what, keys in (("missing", missing), ("unexpected", unexpected),
                           ("mis-shaped", misshaped)):
            if keys:
                shown = ", ".join(keys[:20]) + (
                    f", ... and {len(keys) - 20} more" if len(keys) > 20 else "")
                lines.append(f"  {what} keys ({len(keys)}): {shown}")
        return CheckpointMismatchError(
            "\n".join(lines), missing=missing, unexpected=unexpected,
            misshaped=misshaped, source=self.source, model_name=model.name)


def _detect_format(config, state, source):
    if config is not None:
        if "model_type" in config or "architectures" in config:
            return "transformers"
        if "architecture" in config:
            return "timm"
    if transformers_format.is_transformers_state(state):
        return "transformers"
    if timm_format.is_timm_state(state):
        return "timm"
    shown = ", ".join(sorted(state)[:5])
    raise UnsupportedCheckpointError(
        f"{source!r} is neither a timm nor a transformers ViT / hybrid / Mixer "
        f"checkpoint (keys: {shown}, ...).")


def _checked_library(library):
    if library is not None and not isinstance(library, str):
        raise TypeError(f"`library` must be None (told from the file) or one of "
                        f"{', '.join(map(repr, LIBRARIES))}, got {library!r}.")
    if library is not None and library not in LIBRARIES:
        raise ValueError(f"`library` must be None (told from the file) or one of "
                         f"{', '.join(map(repr, LIBRARIES))}, got {library!r}.")
    return library


def _library(library, fmt, config, state, name, source, where):
    """Whose arithmetic the weights carry (`LIBRARIES`): `library` when
    given (checked against the file), else told from the file: DINO's when
    no config.json says otherwise, `dino.is_dino` says so (a release's
    file name, a DINO training checkpoint's teacher) and the keys are
    DINO's ViT; else the format of the keys. Weights that look like DINO's
    but are not its layout are read as their keys say (logged); DINO's
    arithmetic is never given to another layout."""
    if library not in (None, dino_format.LIBRARY):
        if library != fmt:
            raise ValueError(
                f"library={library!r} does not fit {source!r}: its "
                f"{'config.json and ' if config is not None else ''}keys are those of {fmt}.")
        return fmt
    if library is None and (config is not None or not dino_format.is_dino(name, where)):
        return fmt
    problem = (dino_format.layout_problem(state) if fmt == "timm"
               else f"its keys are those of {fmt}, not timm's as DINO's are")
    if library is None:
        reason = dino_format.why(name, where)
        if problem:
            logger.info("%s looks like DINO's (%s), but %s: it is read as a %s checkpoint, "
                        "not as DINO's.", source, reason, problem, fmt)
            return fmt
    elif config is not None:
        raise ValueError(
            f"library='dino' reads DINO's own files (no config.json); {source!r} is a Hub "
            f"folder, whose config.json says its library ({fmt}).")
    elif problem:
        raise UnsupportedCheckpointError(
            f"library='dino': {source!r} is not one of DINO's ViTs ({problem}).")
    else:
        reason = "library='dino'"
    logger.info(
        "%s is read as DINO's ViT (%s): inputs normalised with ImageNet mean %s and std %s "
        "(on [0, 1]), erf GELU, LayerNorm epsilon 1e-6, its output the class token after "
        "the final norm, position embeddings resized %s.", source, reason,
        timm_format.IMAGENET_DEFAULT_MEAN, timm_format.IMAGENET_DEFAULT_STD,
        dino_format.RESIZE_HOW)
    return dino_format.LIBRARY


def read_hub_checkpoint(path, source=None, ema=False, kind=None, library=None):
    """Reads a Hub-layout folder, or a bare `.safetensors` or PyTorch file
    (`keras_vit.weights.pytorch`) of timm or transformers keys, DINO's
    released ViTs among them (`keras_vit.weights.dino`).

    Args:
        path: a folder (config.json + model.safetensors or
            pytorch_model.bin, single or sharded [+
            preprocessor_config.json]) or a `.safetensors` / PyTorch file.
        source: how to name it in messages (default: `path`).
        ema: read a PyTorch training checkpoint's EMA weights
            (`state_dict_ema` / `model_ema`).
        kind: for a file, what `sniff_checkpoint` called it already
            (`"torch"` or `"safetensors"`; None: told here).
        library: whose arithmetic, preprocessing and position-embedding
            resize the weights carry (`LIBRARIES`). None: told from the
            file: DINO's for a bare file named as a DINO release or the
            teacher of a DINO training checkpoint, when its keys are DINO's
            ViT; else the format of the keys. "dino": a DINO file under
            another name.

    Returns:
        A `HubCheckpoint`.

    Raises:
        CheckpointNotFoundError, CorruptCheckpointError,
        UnsupportedCheckpointError: unreadable or not a timm/transformers
            ViT, hybrid or Mixer (with `library="dino"`: not DINO's ViT).
            A config.json (or preprocessor_config.json) that is not an
            object, a value in it of the wrong type, or one the weights
            contradict (the architecture, width, depth, heads, labels) is a
            CorruptCheckpointError naming the file, key and value
            (`config_values`); an architecture keras_vit does not build is
            an UnsupportedCheckpointError.
        CheckpointMismatchError: a model keras_vit cannot reproduce
            exactly (the message says what differs).
        ValueError, TypeError: a `library` not in `LIBRARIES`, or one the
            file's keys or config.json contradict.

    Example:

    ```python
    ckpt = read_hub_checkpoint("vit_folder")
    ckpt.format, ckpt.architecture, ckpt.preprocessing
    ckpt = read_hub_checkpoint("renamed.pth", library="dino")
    ckpt.library, ckpt.preprocessing["mean"]   # "dino", (0.485, 0.456, 0.406)
    ```
    """
    library = _checked_library(library)
    name = os.fspath(path)
    source = source or name
    path = os.path.expanduser(name)
    config = preprocessor = where = None
    torch_file = False
    if os.path.isdir(path):
        if not is_hub_folder(path):
            raise UnsupportedCheckpointError(
                f"{name!r} is a folder without {CONFIG} and {WEIGHTS} (or {TORCH_WEIGHTS}): "
                "not in the "
                "Hugging Face Hub layout (timm save_for_hf / transformers "
                "save_pretrained). Pass the checkpoint file inside it, or a "
                "folder with both files.")
        config = _read_json(os.path.join(path, CONFIG), "Config")
        config_file = _json_name(name, source, CONFIG)
        check_object(config, config_file)
        if os.path.isfile(os.path.join(path, PREPROCESSOR)):
            preprocessor = _read_json(os.path.join(path, PREPROCESSOR), "Preprocessor config")
        state = _read_folder_weights(path, ema=ema)
    elif not os.path.isfile(path):
        raise CheckpointNotFoundError(name)
    elif torch_file := (kind == "torch" if kind else is_zip(path)):
        state, where = read_torch_weights(path, name, ema=ema, sniffed=kind == "torch")
    elif ema:
        raise ema_error(name, "a safetensors file")
    else:
        state = read_safetensors(path)
    fmt = _detect_format(config, state, source)
    module = timm_format if fmt == "timm" else transformers_format
    if config is not None:
        check_values(config, module.CONFIG_VALUES, config_file)
        if fmt == "timm":
            timm_format.check_architecture(config, state, config_file)
        elif preprocessor is not None:  # timm's mean and std are config.json's
            preprocessor_file = _json_name(name, source, PREPROCESSOR)
            check_object(preprocessor, preprocessor_file)
            check_values(preprocessor, transformers_format.PREPROCESSOR_VALUES,
                         preprocessor_file)
    told = library is None
    library = _library(library, fmt, config, state, name, source, where)
    if library == dino_format.LIBRARY:
        family, arch = timm_format.architecture(state, None)
        arithmetic, preprocessing = dino_format.arithmetic(), dino_format.preprocessing()
        names = None
    elif fmt == "timm":
        family, arch = timm_format.architecture(state, config)
        arithmetic = timm_format.arithmetic(config, set(state))
        preprocessing = timm_format.preprocessing(config)
        names = timm_format.class_names(config)
    else:
        family, arch = transformers_format.architecture(state, config)
        arithmetic = transformers_format.arithmetic(config)
        preprocessing = (transformers_format.preprocessing(preprocessor)
                         if config is not None else None)
        names = transformers_format.class_names(config)
    if config is not None:
        module.check_config(config, state, arch, config_file)
    for label in names or ():  # printed one per line, on a terminal too
        problem = label_line_problem(label)
        if problem:
            raise CorruptCheckpointError(
                f"{config_file!r} holds the class name {label!r} "
                f"({'label_names' if fmt == 'timm' else 'id2label'}), which holds "
                f"{problem}; a class name is one line of printable text.")
    if config is None and library != dino_format.LIBRARY:
        dino_like = told and fmt == "timm" and dino_format.layout_problem(state) is None
        logger.info(
            "%s is a bare %s %s file: no config.json says its input "
            "normalisation; the model uses the official (x - 127.5) / 127.5 "
            "unless image_mean/image_std are given.%s", source, fmt,
            "PyTorch" if torch_file else "safetensors",
            " (DINO's weights under another name: read_hub_checkpoint(path, "
            "library='dino').)" if dino_like else "")
    return HubCheckpoint(format=fmt, library=library, source=source, path=path,
                         config=config, state=state,
                         family=family, architecture=arch, arithmetic=arithmetic,
                         preprocessing=preprocessing, class_names=names)
