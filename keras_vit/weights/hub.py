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
`model_type`, timm configs `architecture`) and the key names, and looked
up in one table, `FORMATS` (format -> its module: `keras_vit.weights.timm`,
`keras_vit.weights.transformers`, `keras_vit.weights.dino`). The folder
layout and the download are `keras_vit.weights.hub_layout`'s, the
safetensors codec `keras_vit.weights.safetensors`'. The loaded model computes what the
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
import logging
import os
from collections.abc import Callable
from types import ModuleType

import numpy as np

from keras_vit._checks import label_line_problem
from keras_vit.errors import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from keras_vit.layers import PatchEncoder
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.layers.rotary import check_rope
from keras_vit.weights import dino as dino_format
from keras_vit.weights import hub_layout
from keras_vit.weights import timm as timm_format
from keras_vit.weights import timm_export
from keras_vit.weights import transformers as transformers_format
from keras_vit.weights.architecture import describe
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.config_values import check_values
from keras_vit.weights.npz import AVG_POOL_KEY, POSEMB_KEY
from keras_vit.weights.official import load_official_weights, rope_key
from keras_vit.weights.posemb import POSEMB_RESIZES, square_grid
from keras_vit.weights.relative_position import (
    relative_position_grid,
    resize_relative_position_bias_table,
)
from keras_vit.weights.pytorch import ema_error, read_torch_weights
from keras_vit.weights.safetensors import read_safetensors
from keras_vit.weights.sniff import is_zip

logger = logging.getLogger("keras_vit")


@dataclasses.dataclass(frozen=True)
class Format:
    """One row of `FORMATS`: what reading a checkpoint of one source
    library takes."""

    keys: ModuleType  # the module of its key names: to_official, CONFIG_VALUES, check_config
    resize_how: str  # how it resizes position embeddings (`posemb.POSEMB_RESIZES`)
    # (state, config, preprocessor) -> (family, architecture, arithmetic,
    # preprocessing, class names)
    read_config: Callable
    # the rest: a format of key names (DINO's are timm's)
    source_name: Callable | None = None  # (official key, state) -> the checkpoint's name
    check_files: Callable | None = None  # (config, its name, preprocessor, its name, state)
    config_keys: tuple = ()  # config.json keys that say the format
    is_state: Callable | None = None  # True for the format's key names
    labels_key: str = ""  # the config.json key of the class names (for messages)
    # (state, source) -> state in the layout `keys` reads (DINOv2's registers)
    prepare: Callable | None = None
    # (state, config, source) -> what the source class computes beyond the
    # architecture, as `HubCheckpoint` fields (builder_defaults, resize)
    source_class: Callable | None = None


def _timm_config(state, config, preprocessor):
    """timm's `read_config` (its mean and std are config.json's)."""
    family, arch = timm_format.architecture(state, config)
    return (family, arch, timm_format.arithmetic(config, set(state), arch.get("mlp", "gelu")),
            timm_format.preprocessing(config), timm_format.class_names(config))


# Whose arithmetic, preprocessing and position-embedding resize weights
# carry, and whose key names they have: a new format is a module and a row.
# A config or state dict that says two formats is the later row's.
FORMATS = {
    "timm": Format(
        keys=timm_format, resize_how="bicubic with antialias (resample_abs_pos_embed)",
        read_config=_timm_config, source_name=lambda key, state: timm_export.source_name(key),
        check_files=lambda config, name, _p, _n, state: timm_format.check_architecture(
            config, state, name),
        config_keys=("architecture",), is_state=timm_format.is_timm_state,
        labels_key="label_names"),
    "transformers": Format(
        keys=transformers_format,
        resize_how="bicubic, align_corners=False (interpolate_pos_encoding)",
        read_config=transformers_format.read_config,
        source_name=transformers_format.state_source_name,
        check_files=transformers_format.check_files,
        config_keys=("model_type", "architectures"),
        is_state=transformers_format.is_transformers_state, labels_key="id2label",
        source_class=transformers_format.source_class),
    dino_format.LIBRARY: Format(
        keys=timm_format, resize_how=dino_format.RESIZE_HOW,
        read_config=dino_format.read_config, prepare=dino_format.prepare),
}
LIBRARIES = tuple(FORMATS)


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
        builder_defaults: builder arguments the source class implies
            (`model_from_checkpoint` takes them unless given): the output
            pooling of a model without a head (its `pooler_output`),
            `classifier_activation=None` for a projection (CLIP's
            `image_embeds`).
        resize, resize_how: the position-embedding resize
            (`posemb.POSEMB_RESIZES` key, and in words) where the model
            type's differs from its library's; None: the library's.
        table_resize: whose resize BEiT's relative position bias tables
            take to another patch grid (`relative_position.
            resize_relative_position_bias_table`'s `method`: transformers');
            None: timm's (the official loader's).
    """

    library: str | None = None
    config: dict | None = None
    state: dict
    family: str
    architecture: dict
    names: dict | None = None
    unmapped: list | None = None
    heads: int | None = None    # the number of heads `params` is split into
    builder_defaults: dict = dataclasses.field(default_factory=dict)
    resize: str | None = None
    resize_how: str | None = None
    table_resize: str | None = None

    def __post_init__(self):
        if self.library is None:
            self.library = self.format
        self.convert(self.architecture.get("num_heads") or 1)

    @property
    def module(self):
        """The module that maps this checkpoint's keys (timm's or
        transformers' format: `keras_vit.weights.timm` or `.transformers`)."""
        return FORMATS[self.format].keys

    def convert(self, num_heads):
        """Maps the state onto official keys (`params`), splitting the
        attention weights into `num_heads` heads (once per head count)."""
        if num_heads == self.heads and self.params is not None:
            return self.params
        params, names, unmapped = self.module.to_official(self.state, num_heads)
        if self.family == "mixer":
            params, names = timm_format.mixer_keys(params, names)
        params.update(arithmetic_keys(self.architecture, self.arithmetic, params))
        self.params, self.names, self.unmapped = params, names, unmapped
        self.heads = num_heads
        return params

    def info(self):
        """`architecture.CheckpointInfo` (head, pre_logits, classifier, grid);
        the classifier the config says where the keys cannot (a model
        without a head pooling the patch tokens beside a class token: "avg")."""
        try:
            info = describe(self.params)
        except CheckpointMismatchError as error:
            raise CheckpointMismatchError(
                f"{self.source} ({self.format} format): {error}") from None
        if self.architecture.get("classifier") == "avg" and info.classifier == "token":
            info = dataclasses.replace(info, classifier="avg")
        return info

    def model_config(self):
        """`(family, builder arguments)` read off the config and shapes."""
        return self.family, dict(self.architecture)

    def source_name(self, key):
        """The checkpoint's own key that the official key `key` comes from
        (for messages)."""
        return FORMATS[self.format].source_name(key, self.state)

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
        if self.family == "vit" and isinstance(shape, tuple) and None in shape[1:3] \
                and POSEMB_KEY in self.params:  # RoPE alone (DINOv3): any size
            how = self.how
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
        if self.table_resize is not None and blocks:
            self._resize_tables(params, getattr(blocks[0], "relative_position_bias", None))
        extra = {k: self.state[k] for k in self.unmapped}
        return load_official_weights(model, {**params, **extra}, self.source,
                                     dropped=dropped, key_name=self._name_of, fmt=self.format)

    @property
    def how(self):
        """How the weights' library resizes the position embedding, in words."""
        return self.resize_how or FORMATS[self.library].resize_how

    def _resize(self, posemb, encoder):
        prefix = encoder.num_embedded_prefix_tokens  # registers may have none
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
            "as %s does (%s).", self.source, *old, *new, self.library, self.how)
        return POSEMB_RESIZES[self.resize or self.library](posemb, new, prefix, old)

    def _resize_tables(self, params, grid):
        """BEiT's relative position bias tables resized to the model's patch
        `grid` by `table_resize`'s library (None: the model has none; a
        table of no square grid is left to the loader's shape check)."""
        tables = [k for k in params if k.endswith("/relative_position_bias_table")]
        old = relative_position_grid(params[tables[0]].shape[0]) if tables else None
        if grid is None or old is None or old == tuple(grid):
            return
        logger.info("Resizing the relative position bias tables of %s from a %dx%d to a "
                    "%dx%d grid as %s does.", self.source, *old, *grid, self.table_resize)
        for key in tables:
            params[key] = resize_relative_position_bias_table(
                params[key], old, tuple(grid), method=self.table_resize)

    def _name_of(self, key):
        """The checkpoint's own name of an official key."""
        return self.names.get(key) or self.source_name(key)


def arithmetic_keys(architecture, arithmetic, params):
    """The official constant keys (`official._constant`) of what the
    source computes beyond its weights: `rope/<variant>` for a rotary
    embedding, `pooling/avg` for a head on the patch tokens' mean beside a
    class token."""
    out = {}
    if arithmetic.get("rope") is not None:
        key, value = rope_key(check_rope(arithmetic["rope"]))
        out[key] = np.asarray(value, "float32")
    if architecture.get("classifier") == "avg" and "head/kernel" in params:
        out[AVG_POOL_KEY] = np.zeros((0,), "float32")
    return out


def _detect_format(config, state, source):
    """The format (a row of `FORMATS`) that config.json, else the key names, say."""
    formats = [(fmt, row) for fmt, row in reversed(FORMATS.items()) if row.is_state]
    for fmt, row in formats if config is not None else ():
        if any(key in config for key in row.config_keys):
            return fmt
    for fmt, row in formats:
        if row.is_state(state):
            return fmt
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
    config = preprocessor = preprocessor_file = config_file = where = None
    torch_file = False
    if os.path.isdir(path):
        folder = hub_layout.read_folder(path, name, source, ema=ema)
        config, config_file, state = folder.config, folder.config_file, folder.state
        preprocessor, preprocessor_file = folder.preprocessor, folder.preprocessor_file
    elif not os.path.isfile(path):
        raise CheckpointNotFoundError(name)
    elif torch_file := (kind == "torch" if kind else is_zip(path)):
        state, where = read_torch_weights(path, name, ema=ema, sniffed=kind == "torch")
    elif ema:
        raise ema_error(name, "a safetensors file")
    else:
        state = read_safetensors(path)
    fmt = _detect_format(config, state, source)
    row = FORMATS[fmt]
    if config is not None:
        check_values(config, row.keys.CONFIG_VALUES, config_file)
        row.check_files(config, config_file, preprocessor, preprocessor_file, state)
    told = library is None
    library = _library(library, fmt, config, state, name, source, where)
    if FORMATS[library].prepare is not None:
        state = FORMATS[library].prepare(state, source)
    family, arch, arithmetic, preprocessing, names = FORMATS[library].read_config(
        state, config, preprocessor)
    if config is not None:
        row.keys.check_config(config, state, arch, config_file)
    for label in names or ():  # printed one per line, on a terminal too
        problem = label_line_problem(label)
        if problem:
            raise CorruptCheckpointError(
                f"{config_file!r} holds the class name {label!r} "
                f"({row.labels_key}), which holds "
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
    extra = row.source_class(state, config, source) if row.source_class and \
        library == fmt else {}
    return HubCheckpoint(format=fmt, library=library, source=source, path=path,
                         config=config, state=state,
                         family=family, architecture=arch, arithmetic=arithmetic,
                         preprocessing=preprocessing, class_names=names, **extra)
