"""Official `.npz` checkpoint keys <-> Keras weights, both directions, in
one place.

The file format (key names, pre-Linen and Linen, read safely) is
`keras_vit.weights.npz`'s; this module maps its canonical keys onto a
model's weights. Hybrid GroupNorm parameters are `(C,)` or the legacy
`(1, 1, 1, C)`.

`official_params(model)` lists, for every weight of a keras_vit model, the
official key(s), their shapes and the two conversions. Loading checks the
whole key set first and raises `CheckpointMismatchError` listing every
missing, unexpected and mis-shaped key: no key is ignored and no weight is
left at its random initialisation silently.

Reading a file sits one step below, without Keras: `weights.sniff` tells
what a file is from its first bytes (`sniff_checkpoint`) and bounds the
bytes a checkpoint may declare (`max_checkpoint_bytes`), `weights.npz`
reads an official `.npz` (`read_checkpoint`), `weights.architecture` says
which model the arrays describe (`describe`, `describe_architecture`), and
the error classes live in `keras_vit.errors`. Those names are importable
from this module too, as they always were.
"""

import dataclasses
import logging
import os
import re

import numpy as np

from keras_vit import _atomic

# The names marked F401: this module's public API, defined below it.
from keras_vit.errors import (  # noqa: F401
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotAnNpzError,
    UnsupportedCheckpointError,
)
from keras_vit.layers import (
    AttentionPooling,
    BottleneckUnit,
    MixerBlock,
    PatchEncoder,
    Patches,
    ResNetRoot,
    TransformerBlock,
)
from keras_vit.layers.rotary import RotaryEmbedding
from keras_vit.layers.blocks import quantization_modes
from keras_vit.layers.lora import lora_layers, merge_lora
from keras_vit.weights.architecture import (  # noqa: F401
    CheckpointInfo,
    checkpoint_variant,
    describe,
    describe_architecture,
)
from keras_vit.weights.npz import (
    AVG_POOL_KEY,
    DIST_KEY,
    POSEMB_KEY,
    REG_KEY,
    canonical_keys,
    read_checkpoint,
)
from keras_vit.weights.relative_position import (
    relative_position_grid,
    resize_relative_position_bias_table,
)
from keras_vit.weights.posemb import checkpoint_grid, resize_position_embedding
from keras_vit.weights.sniff import (  # noqa: F401
    ACCEPTED_FORMATS,
    DEFAULT_MAX_CHECKPOINT_BYTES,
    MAX_CHECKPOINT_BYTES_ENV,
    SAFETENSORS_MAX_HEADER,
    max_checkpoint_bytes,
    safetensors_header_length,
    sniff_checkpoint,
)

logger = logging.getLogger("keras_vit")


@dataclasses.dataclass
class Param:
    """One Keras variable and the official array(s) it corresponds to."""

    keys: tuple
    variable: object
    to_keras: object      # list of official arrays -> Keras value
    to_official: object   # Keras value -> list of official arrays
    kind: str = "plain"   # "posemb" | "groupnorm" | "relpos" | "constant" | "plain"
    grid: tuple = None    # "relpos": the model's patch grid

    def official_shapes(self):
        if self.variable is None:  # a "constant": what the model computes with
            return [tuple(a.shape) for a in self.to_official(None)]
        arrays = self.to_official(np.zeros(tuple(self.variable.shape), "float32"))
        return [tuple(a.shape) for a in arrays]


def _constant(key, value):
    """A key with no weight behind it, whose value the model's arithmetic
    must equal (`rope/<variant>`, `pooling/avg`): written by
    `official_arrays`, compared at loading."""
    value = np.asarray(value, "float32")
    return Param((key,), None, lambda a: a[0], lambda v: [value], "constant")


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


def _qkv_biases(attn, block):
    """The attention projections' biases: one `(3D,)` weight for "qkv",
    `q_bias` and `v_bias` for "qv" (the official `key/bias` absent), none
    for "none"."""
    d, h = block.hidden_size, block.num_heads
    if block.qkv_bias == "qkv":
        return [Param(
            tuple(f"{attn}/{n}/bias" for n in ("query", "key", "value")), block.qkv.bias,
            lambda a: np.concatenate([x.reshape(d) for x in a]),
            lambda v: [x.reshape(h, d // h) for x in np.split(v, 3)],
        )]
    if block.qkv_bias == "qv":
        return [Param((f"{attn}/{n}/bias",), variable, lambda a: a[0].reshape(d),
                      lambda v: [v.reshape(h, d // h)])
                for n, variable in (("query", block.q_bias), ("value", block.v_bias))]
    return []


def _relative_position_table(key, block):
    """BEiT's table, `kind="relpos"`: another grid's is resized at loading."""
    return Param((key,), block.relative_position_bias_table, lambda a: a[0], lambda v: [v],
                 "relpos", block.relative_position_bias)


def _transformer_block(prefix, block):
    d, h = block.hidden_size, block.num_heads
    attn = f"{prefix}/MultiHeadDotProductAttention_1"
    qkv = tuple(f"{attn}/{n}/kernel" for n in ("query", "key", "value"))
    return [
        *_layer_norm(f"{prefix}/LayerNorm_0", block.norm1),
        Param(
            qkv, block.qkv.kernel,
            lambda a: np.concatenate([x.reshape(d, d) for x in a], axis=1),
            lambda v: [x.reshape(d, h, d // h) for x in np.split(v, 3, axis=1)],
        ),
        *_qkv_biases(attn, block),
        *([_relative_position_table(f"{attn}/relative_position_bias_table", block)]
          if block.relative_position_bias is not None else []),
        Param(
            (f"{attn}/out/kernel",), block.attention_output.kernel,
            lambda a: a[0].reshape(d, d), lambda v: [v.reshape(h, d // h, d)],
        ),
        _same(f"{attn}/out/bias", block.attention_output.bias),
        *_layer_norm(f"{prefix}/LayerNorm_2", block.norm2),
        *_dense(f"{prefix}/MlpBlock_3/Dense_0", block.mlp_dense1),
        *_dense(f"{prefix}/MlpBlock_3/Dense_1", block.mlp_dense2),
        *(_layer_norm(f"{prefix}/MlpBlock_3/LayerNorm_0", block.mlp_layer_norm)
          if block.mlp_layer_norm is not None else []),
        *([_same(f"{prefix}/LayerScale_0/scale", block.ls1.gamma),
           _same(f"{prefix}/LayerScale_1/scale", block.ls2.gamma)] if block.ls1 else []),
    ]


def _map_head(prefix, head):
    """big_vision's `MAPHead` keys (SigLIP's official checkpoints) of an
    `AttentionPooling` layer: its packed `key_value` Dense is split into the
    per-head key and value arrays."""
    d, h = head.hidden_size, head.num_heads
    attn = f"{prefix}/MultiHeadDotProductAttention_0"
    kv = (f"{attn}/key/kernel", f"{attn}/value/kernel")
    kv_b = (f"{attn}/key/bias", f"{attn}/value/bias")
    return [
        _same(f"{prefix}/probe", head.probe),
        Param((f"{attn}/query/kernel",), head.query.kernel,
              lambda a: a[0].reshape(d, d), lambda v: [v.reshape(d, h, d // h)]),
        Param((f"{attn}/query/bias",), head.query.bias,
              lambda a: a[0].reshape(d), lambda v: [v.reshape(h, d // h)]),
        Param(kv, head.key_value.kernel,
              lambda a: np.concatenate([x.reshape(d, d) for x in a], axis=1),
              lambda v: [x.reshape(d, h, d // h) for x in np.split(v, 2, axis=1)]),
        Param(kv_b, head.key_value.bias,
              lambda a: np.concatenate([x.reshape(d) for x in a]),
              lambda v: [x.reshape(h, d // h) for x in np.split(v, 2)]),
        Param((f"{attn}/out/kernel",), head.out.kernel,
              lambda a: a[0].reshape(d, d), lambda v: [v.reshape(h, d // h, d)]),
        _same(f"{attn}/out/bias", head.out.bias),
        *_layer_norm(f"{prefix}/LayerNorm_0", head.norm),
        *_dense(f"{prefix}/MlpBlock_0/Dense_0", head.mlp_dense1),
        *_dense(f"{prefix}/MlpBlock_0/Dense_1", head.mlp_dense2),
    ]


def _distilled_head(layer):
    """DeiT's distilled classifier, `head` on the class token and
    `head_dist` on the distillation token averaged, as the one Dense on the
    two tokens side by side that keras_vit builds: kernel `[W; W_dist] / 2`,
    bias `(b + b_dist) / 2`. Written back, each head gets its half of the
    kernel and the mean bias: the same output, the two biases' difference
    (which only timm's distillation training reads) is not kept, and a log
    line says so when they differ."""
    d = layer.kernel.shape[0] // 2

    def bias(a):
        if not np.array_equal(a[0], a[1]):
            logger.info("DeiT's head/bias and head_dist/bias are kept as their mean, "
                        "which gives its output (the two heads averaged) unchanged.")
        return (a[0] + a[1]) * 0.5

    return [
        Param(("head/kernel", "head_dist/kernel"), layer.kernel,
              lambda a: np.concatenate(a, axis=0) * 0.5, lambda v: [v[:d] * 2, v[d:] * 2]),
        Param(("head/bias", "head_dist/bias"), layer.bias, bias, lambda v: [v, v]),
    ]


def _head_pooling(model):
    """The mode of the model's head pooling layer ("pool"), or None."""
    try:
        return model.get_layer("pool").mode
    except ValueError:
        return None


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


def _patch_encoder(layer, patch_size):
    """The projection, the prefix tokens the layer has (class, distillation,
    registers) and the position embedding."""
    params = [_patch_kernel("embedding/kernel", layer.kernel, patch_size)]
    if layer.use_bias:
        params.append(_same("embedding/bias", layer.bias))
    for key, token, kept in (("cls", "class_token", layer.use_class_token),
                             (DIST_KEY, "dist_token", layer.distillation_token),
                             (REG_KEY, "register_tokens", layer.num_register_tokens)):
        if kept:
            params.append(_same(key, getattr(layer, token)))
    if layer.use_position_embedding:
        params.append(Param((POSEMB_KEY,), layer.position_embedding,
                            lambda a: a[0], lambda v: [v], "posemb"))
    return params


def rope_key(rope):
    """The official-format key and value recording a `RotaryEmbedding`'s
    variant: `rope/<variant>` = `[temperature, ref_h, ref_w]` (0: none),
    so that a saved file rebuilds the same arithmetic.

    >>> rope_key({"variant": "eva", "temperature": 10000.0, "ref_grid": (16, 16)})
    ('rope/eva', [10000.0, 16, 16])
    """
    ref = rope.get("ref_grid") or (0, 0)
    return f"rope/{rope['variant']}", [rope["temperature"], *ref]


def _norms_and_heads(model, layer):
    """The params of a norm, pooling, RoPE or head layer, or None."""
    name = layer.name
    norms = {"encoder_norm": "Transformer/encoder_norm",
             "pre_norm": "pre_norm",  # OpenAI CLIP's ln_pre
             "pre_head_layer_norm": "pre_head_layer_norm",
             "fc_norm": "fc_norm"}  # timm's gap models: LayerNorm after pooling
    if name in norms:
        return _layer_norm(norms[name], layer)
    if isinstance(layer, AttentionPooling):
        return _map_head("MAPHead_0", layer)
    if isinstance(layer, RotaryEmbedding):
        return [_constant(*rope_key(layer.rope))]
    if name == "pool" and layer.mode == "avg" and _has_head(model):
        # the head reads the patch tokens' mean beside a class token
        return [_constant(AVG_POOL_KEY, np.zeros((0,), "float32"))]
    if name == "head" and _head_pooling(model) == "token_dist":
        return _distilled_head(layer)
    if name in ("pre_logits", "head"):
        return _dense(name, layer)
    return None


def _has_head(model):
    return any(layer.name == "head" for layer in model.layers)


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
    if lora_layers(model):
        raise ValueError(
            f"Model {model.name!r} has LoRA adapters: its kernels are W + (alpha / rank) * "
            "A @ B, which official checkpoints do not hold; merge them first "
            "(keras_vit.training.merge_lora(model)).")
    modes = quantization_modes(model)
    if modes:
        raise ValueError(
            f"Model {model.name!r} is quantized by model.quantize({sorted(modes)[0]!r}): its "
            "Dense kernels are stored quantized with scales, and official checkpoints (and "
            "the timm / transformers folders written from them) hold float32 weights. "
            "Save or export the float model, before model.quantize.")
    params = []
    for layer in model.layers:
        name = layer.name
        if isinstance(layer, PatchEncoder):
            params += _patch_encoder(layer, patch_size)
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
        elif (found := _norms_and_heads(model, layer)) is not None:
            params += found
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
        for key, shape in zip(param.keys, param.official_shapes(), strict=True):
            rows.append([key, list(shape)])
    return sorted(rows)


def _fmt(keys, limit=20):
    keys = list(keys)
    text = ", ".join(keys[:limit])
    if len(keys) > limit:
        text += f", ... and {len(keys) - limit} more"
    return text


def _what_the_file_is(params):
    """`(phrase, variant or None)` for the mismatch message."""
    try:
        return describe_architecture(params), checkpoint_variant(params)
    except (CheckpointMismatchError, KeyError, IndexError, ValueError):
        return "no complete official ViT, hybrid or Mixer checkpoint", None


def mismatch_error(model, params, source, missing, unexpected, misshaped,
                   key_name=None, fmt=None):
    """The one `CheckpointMismatchError` of keys that do not fit `model`: a
    line counting the missing, unexpected and mis-shaped keys, how to build
    the model the checkpoint describes, then at most 20 keys of each kind.
    `fmt`: a timm / transformers checkpoint, whose keys are named as in it
    (`key_name` of each official key); else an official file, described
    from `params`."""
    if key_name is not None:
        missing, unexpected, misshaped = (
            _named(keys, key_name) for keys in (missing, unexpected, misshaped))
    counts = (f"{len(missing)} missing, {len(unexpected)} unexpected, "
              f"{len(misshaped)} mis-shaped keys")
    if fmt is not None:
        lines = [
            f"Checkpoint {source} ({fmt} format) does not fit model {model.name!r}: "
            f"{counts} (named as in the checkpoint; no key is ignored).",
            f"  To build the model the checkpoint describes, use "
            f"keras_vit.model_from_checkpoint({source!r}).",
        ]
    else:
        what, variant = _what_the_file_is(params)
        path = source if isinstance(source, str) and os.path.isfile(
            os.path.expanduser(source)) else None
        shown = repr(path) if path else "path"
        named = f" or keras_vit.{variant.function}(weights={shown})" if variant else ""
        lines = [
            f"Checkpoint {source} does not fit model {model.name!r}: "
            f"{counts}; the file looks like {what}.",
            f"  To build the model the file describes, use "
            f"keras_vit.model_from_checkpoint({shown}){named} (command line: "
            f"keras-vit predict --model auto --weights {path or 'PATH'}); "
            "`keras-vit models` lists which model each checkpoint family fits.",
        ]
    for what, keys in (("missing", missing), ("unexpected", unexpected),
                       ("mis-shaped", misshaped)):
        if keys:
            lines.append(f"  {what} keys ({len(keys)}): {_fmt(keys)}")
    return CheckpointMismatchError(
        "\n".join(lines), missing=missing, unexpected=unexpected,
        misshaped=misshaped, source=source, model_name=model.name)


def _named(keys, key_name):
    """`keys` ("KEY" or "KEY: what is wrong") under the checkpoint's own
    names, each once."""
    out = []
    for key in keys:
        head, _, rest = key.partition(": ")
        name = key_name(head)
        out.append(f"{name}: {rest}" if rest else name)
    return list(dict.fromkeys(out))


def load_official_weights(model, params, source=None, dropped=(), key_name=None, fmt=None):
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
        key_name: how messages name an official key (the checkpoint's own
            name of it, for a timm or transformers file); default: itself.
        fmt: the format of a timm or transformers file (its mismatch
            message names its keys with `key_name`).

    Returns:
        The number of model weights assigned.

    The position embedding is resized with the official algorithm when the
    grid differs. The whole key set is checked before any weight is
    assigned, then every value: this is where every format's weights pass
    (official, timm, transformers, PyTorch files, Hub folders), and a NaN
    or infinite value is refused here, once for all of them.

    Raises:
        CheckpointMismatchError: keys or shapes do not fit the model. The
            message opens with one line counting the missing, unexpected
            and mis-shaped keys and saying which architecture the file
            describes, then how to build that one
            (`keras_vit.model_from_checkpoint`), then at most 20 keys of each
            kind; the exception's `missing`, `unexpected` and `misshaped`
            hold all of them.
        CorruptCheckpointError: a weight holds NaN or infinite values (the
            message names the checkpoint and the key).
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
    missing, misshaped, assignments, loaded = [], [], [], []
    for param in table:
        if any(k.startswith(tuple(dropped)) for k in param.keys):
            continue  # e.g. a new head: keeps its (zero) initialisation
        present = [k for k in param.keys if k in params]
        missing += [k for k in param.keys if k not in params]
        if len(present) != len(param.keys):
            continue
        arrays = [np.asarray(params[k], dtype="float32") for k in param.keys]
        loaded += zip(param.keys, arrays, strict=True)
        wanted = param.official_shapes()
        bad = []
        for key, array, shape in zip(param.keys, arrays, wanted, strict=True):
            if array.shape == shape:
                continue
            if param.kind == "groupnorm" and array.size == int(np.prod(shape)) \
                    and array.shape[-1] == shape[-1]:
                continue
            if param.kind == "posemb" and array.ndim == 3 and \
                    array.shape[0] == 1 and array.shape[2] == shape[2]:
                arrays = [_resize_posemb(model, array, source)]
                continue
            if param.kind == "relpos" and array.ndim == 2 and array.shape[1] == shape[1]:
                arrays = [_resize_relative_position_table(param, array, key, source)]
                continue
            bad.append(f"{key}: checkpoint {array.shape} vs model {shape}")
        if param.kind == "constant" and not bad:
            wanted_value = param.to_official(None)[0]
            if not np.array_equal(arrays[0], wanted_value):
                bad.append(f"{param.keys[0]}: checkpoint {arrays[0].tolist()} vs model "
                           f"{wanted_value.tolist()}")
        if bad:
            misshaped += bad
            continue
        if param.kind != "constant":
            assignments.append((param, param.to_keras(arrays)))
    unexpected = [
        k for k in sorted(params)
        if k not in expected and not any(k.startswith(p) for p in dropped)
    ]
    if missing or unexpected or misshaped:
        raise mismatch_error(model, params, source, missing, unexpected, misshaped,
                             key_name if fmt else None, fmt)
    for key, array in loaded:
        _check_finite(array, source, key_name(key) if key_name else key)
    for param, value in assignments:
        param.variable.assign(value)
    return len(assignments)


def _check_finite(array, source, key):
    """A CorruptCheckpointError when `array` (float32, one weight) holds a
    NaN or an infinity (ViT-B/16's 86M values: 0.03 s)."""
    if np.isfinite(array).all():
        return
    nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
    raise CorruptCheckpointError(
        f"Checkpoint {source}: its weight {key!r} holds {nan:,} NaN and {inf:,} infinite "
        f"values (of {array.size:,}), and keras_vit refuses non-finite weights, with which "
        "the model would output NaN (write or download the file again).")


def _resize_posemb(model, posemb, source):
    encoder = next(layer for layer in model.layers if isinstance(layer, PatchEncoder))
    prefix = encoder.num_embedded_prefix_tokens
    old = checkpoint_grid(posemb.shape[1], prefix)
    new = encoder.grid_size
    logger.info(
        "Resizing the position embedding of %s from a %dx%d to a %dx%d grid "
        "(bilinear, aligned corners%s).", source, *old, *new,
        ", class token kept" if prefix else "",
    )
    return resize_position_embedding(posemb, new, prefix, old)


def _resize_relative_position_table(param, table, key, source):
    """BEiT's table of another grid, resized to the model's (timm's
    `resize_rel_pos_bias_table`); a CheckpointMismatchError for a table of
    no square grid."""
    new = param.grid
    old = relative_position_grid(int(table.shape[0]))
    if old is None:
        raise CheckpointMismatchError(
            f"Checkpoint {source}: {key} has {table.shape[0]} rows, which is no square patch "
            f"grid's (2n - 1)^2 + 3; the model's has {param.variable.shape[0]}.")
    if "encoderblock_0/" in key:  # one line for the model's tables
        logger.info("Resizing the relative position bias tables of %s from a %dx%d to a "
                    "%dx%d grid (as timm's resize_rel_pos_bias_table).", source, *old, *new)
    return resize_relative_position_bias_table(table, old, new)


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
    arrays = official_arrays(model)
    with _atomic.replacing(os.path.expanduser(path), "wb") as f:
        np.savez(f, **dict(sorted(arrays.items())))
    return path


def official_arrays(model):
    """`{official key: float32 array}` of `model`'s weights: what
    `save_official_weights` writes, in memory.

    Raises:
        ValueError: as `save_official_weights`.
    """
    arrays = {}
    for param in official_params(merge_lora(model)):
        value = None if param.variable is None else np.asarray(param.variable.numpy(),
                                                                dtype="float32")
        for key, array in zip(param.keys, param.to_official(value), strict=True):
            arrays[key] = np.ascontiguousarray(array, dtype="float32")
    return arrays
