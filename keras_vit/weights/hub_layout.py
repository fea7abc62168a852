"""The Hugging Face Hub's folder layout and its download: which files a
folder holds (`config.json`, `model.safetensors` or `pytorch_model.bin`,
single or sharded, `preprocessor_config.json`), reading them
(`read_folder`), and fetching them for an `"hf://ORG/NAME[@REV]"`
reference (`download`, with huggingface_hub: the `hf` extra). What the
files say is read by `keras_vit.weights.hub`.
"""

import dataclasses
import json
import os

from keras_vit.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MissingDependencyError,
    UnsupportedCheckpointError,
    WeightsDownloadError,
)
from keras_vit.weights.config_values import check_object, json_type
from keras_vit.weights.pytorch import ema_error, read_torch_state
from keras_vit.weights.safetensors import read_safetensors
from keras_vit.weights.sniff import SAFETENSORS_MAX_HEADER, ByteCount, check_checkpoint_bytes

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


def is_hub_uri(weights):
    return isinstance(weights, str) and weights.startswith(HF_PREFIX)


def is_hub_folder(path):
    """True for a folder with a `config.json` and weights (safetensors or
    `pytorch_model.bin`, single or sharded)."""
    path = os.path.expanduser(os.fspath(path))
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG)) and any(
        os.path.isfile(os.path.join(path, name)) for name in WEIGHT_FILES)


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


@dataclasses.dataclass(frozen=True)
class HubFolder:
    """A Hub folder, read: its `config` (a JSON object), `preprocessor`
    (None without `preprocessor_config.json`), their names in messages and
    the weights' `state`."""

    config: dict
    config_file: str
    preprocessor: dict | None
    preprocessor_file: str
    state: dict


def read_folder(path, name, source, ema=False):
    """Reads the folder `path` (named `name`, from `source`: an `hf://`
    reference names its files under it): config.json, checked to be an
    object, preprocessor_config.json when present, then the weights.

    Raises:
        UnsupportedCheckpointError: not in the Hub layout.
        CorruptCheckpointError, CheckpointNotFoundError: as
            `read_hub_checkpoint`.
    """
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
    preprocessor = None
    if os.path.isfile(os.path.join(path, PREPROCESSOR)):
        preprocessor = _read_json(os.path.join(path, PREPROCESSOR), "Preprocessor config")
    state = _read_folder_weights(path, ema=ema)
    return HubFolder(config, config_file, preprocessor,
                     _json_name(name, source, PREPROCESSOR), state)


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
