"""timm checkpoint keys -> official keys, in one place (the way back out,
official arrays -> a timm state dict and config.json, and the timm name of
an official key, `source_name`, is `timm_export`).

A timm state dict (`model.safetensors` of a `timm/...` Hub repository, or
of a folder written by `timm.models.push_to_hf.save_for_hf`) is turned
into the official `.npz` layout (`keras_vit.weights.official`), which the
one loader maps onto keras_vit layers. Every key is accounted for: a key
with no rule here (layer scale, register tokens, attention pooling, q/k
norms, ...) comes back in `unmapped` and is reported by the loader as
unexpected; nothing is dropped silently.

The families keras_vit builds:

| timm                                   | official                         |
| -------------------------------------- | -------------------------------- |
| `patch_embed.proj.weight (D, C, p, p)` | `embedding/kernel (p, p, C, D)`  |
| `cls_token`, `pos_embed`               | `cls`, `Transformer/posembed_input/pos_embedding` |
| `blocks.i.attn.qkv.weight (3D, D)`     | `.../MultiHeadDotProductAttention_1/{query,key,value}/kernel (D, H, D/H)` |
| `blocks.i.attn.proj`                   | `.../out`                        |
| `blocks.i.norm1`, `norm2`, `mlp.fc1/2` | `LayerNorm_0`, `LayerNorm_2`, `MlpBlock_3/Dense_0/1` (a `SwiGLUPacked`'s `fc1` of `2M` rows too) |
| `norm` / `fc_norm`                     | `Transformer/encoder_norm` / `fc_norm` |
| `head`                                 | `head`                           |
| `dist_token`, `reg_token`              | `dist`, `reg` (DeiT, DINOv2 registers) |
| `blocks.i.ls1.gamma`, `ls2.gamma`      | `.../LayerScale_0/scale`, `LayerScale_1/scale` |
| `norm_pre` (CLIP's `ln_pre`)           | `pre_norm`                       |
| `attn_pool.latent`, `.q`, `.kv`, `.proj`, `.norm`, `.mlp.fc1/2` | `MAPHead_0/probe`, `.../MultiHeadDotProductAttention_0/{query,key+value,out}`, `LayerNorm_0`, `MlpBlock_0/Dense_0/1` (SigLIP) |
| `patch_embed.backbone.stem.conv/norm`  | `conv_root`, `gn_root` (hybrids) |
| `...stages.s.blocks.u.conv1..3/norm1..3/downsample` | `block{s+1}/unit{u+1}/conv1..3/gn1..3/conv_proj/gn_proj` |
| Mixer `stem.proj`, `blocks.i.mlp_tokens/mlp_channels`, `norm` | `stem`, `MixerBlock_i/token_mixing/channel_mixing`, `pre_head_layer_norm` |

timm's `Eva` (EVA-02, DINOv3: rotary embeddings, q/v biases, split SwiGLU,
sub-LayerNorm, `gamma_1/2`) is read by `keras_vit.weights.timm_eva`.

timm's arithmetic, which the loaded model reproduces: what the
architecture's name computes in timm (`timm_architectures.ARCHITECTURES`,
written from timm itself: erf, tanh or quick GELU, LayerNorm epsilon 1e-6
or CLIP's 1e-5, the pooling, the heads), `model_args` where config.json has them; `gap` models pool, then LayerNorm (`fc_norm`);
a `SwiGLUPacked` MLP (DINOv2's ViT-g/14: `fc1` of twice the rows `fc2`
takes, SiLU of the first half times the second) is `mlp="swiglu"`;
hybrid stems standardise kernels as `(w - mean) / sqrt(var + 1e-8)` with
GroupNorm epsilon 1e-5 (`resnet_arithmetic="timm"`); position embeddings
resized with `resample_abs_pos_embed` (bicubic, antialias).
"""

import re

import numpy as np

from keras_vit.errors import (
    CheckpointMismatchError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from keras_vit.weights import config_values as cv
from keras_vit.weights import timm_beit, timm_eva
from keras_vit.weights.architecture import mlp_of, posemb_without_prefix
from keras_vit.weights.npz import DIST_KEY, POSEMB_KEY, REG_KEY
from keras_vit.weights.timm_architectures import ARCHITECTURES, REFUSED, TIMM_VERSION

FORMAT = "timm"

# Every config.json value this module reads, and what it may hold
# (`config_values.check_values`; a parent before its children).
CONFIG_VALUES = {
    "architecture": cv.OPTIONAL_STRING, "global_pool": cv.OPTIONAL_STRING,
    "num_classes": cv.OPTIONAL_COUNT, "label_names": cv.OPTIONAL_NAMES,
    "model_args": cv.OPTIONAL_OBJECT,
    "model_args.num_heads": cv.OPTIONAL_POSITIVE_INT,
    "model_args.embed_dim": cv.OPTIONAL_POSITIVE_INT,
    "model_args.depth": cv.OPTIONAL_POSITIVE_INT,
    "model_args.patch_size": cv.OPTIONAL_SIZE,
    "model_args.mlp_ratio": cv.OPTIONAL_RATIOS,
    "model_args.num_classes": cv.OPTIONAL_COUNT,
    "model_args.global_pool": cv.OPTIONAL_STRING,
    "model_args.act_layer": cv.OPTIONAL_STRING,
    "model_args.class_token": cv.OPTIONAL_BOOLEAN,
    "model_args.no_embed_class": cv.OPTIONAL_BOOLEAN,
    "model_args.padding_same": cv.OPTIONAL_BOOLEAN,
    "model_args.pre_norm": cv.OPTIONAL_BOOLEAN,
    "model_args.reg_tokens": cv.OPTIONAL_COUNT,
    "model_args.init_values": cv.OPTIONAL_NUMBER,
    "pretrained_cfg": cv.OPTIONAL_OBJECT,
    "pretrained_cfg.mean": cv.MEAN, "pretrained_cfg.std": cv.STD,
    "pretrained_cfg.input_size": cv.OPTIONAL_INPUT_SIZE,
    "pretrained_cfg.interpolation": cv.OPTIONAL_STRING,
    "pretrained_cfg.crop_pct": cv.OPTIONAL_POSITIVE_NUMBER,
    "pretrained_cfg.crop_mode": cv.OPTIONAL_STRING,
    "pretrained_cfg.label_names": cv.OPTIONAL_NAMES,
    **timm_eva.CONFIG_VALUES, **timm_beit.CONFIG_VALUES,
}

# timm model names -> attention heads, for configs without `model_args`
# (the Hub's timm repositories record only the architecture name).
_HEADS_BY_NAME = (
    ("vit_tiny_", 3), ("vit_small_", 6), ("vit_medium_", 8), ("vit_base_", 12),
    ("vit_large_", 16), ("vit_huge_", 16), ("vit_giant_", 16), ("vit_gigantic_", 16),
    ("vit_so400m_", 16), ("deit_tiny_", 3), ("deit_small_", 6), ("deit_base_", 12),
    ("deit3_small_", 6), ("deit3_medium_", 8), ("deit3_base_", 12), ("deit3_large_", 16),
    ("deit3_huge_", 16),
)
_HEADS_BY_WIDTH = {192: 3, 384: 6, 512: 8, 768: 12, 1024: 16, 1152: 16, 1280: 16}

_BLOCK = r"blocks\.(\d+)\."
_STAGE_UNIT = r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\."
_STEM = r"patch_embed\.backbone\.(?:stem\.)?"


def is_timm_state(keys):
    """True when the key names are those of a timm ViT / hybrid / Mixer."""
    keys = set(keys)
    return bool({"patch_embed.proj.weight", "stem.proj.weight"} & keys) or any(
        k.startswith("patch_embed.backbone.") for k in keys)


def family(keys):
    return "mixer" if "stem.proj.weight" in keys else "vit"


def _t(a):
    return np.ascontiguousarray(np.asarray(a).T)


def _conv(a):
    """PyTorch conv `(O, I, kh, kw)` -> Flax `(kh, kw, I, O)`."""
    return np.ascontiguousarray(np.asarray(a).transpose(2, 3, 1, 0))


def _heads_kernel(w, heads):
    """PyTorch Linear `(D*, D)` weight -> official `(D, H, D*/H)`."""
    return _t(w).reshape(w.shape[1], heads, -1)


def to_official(state, num_heads):
    """`(params, names, unmapped)`: the official arrays, the timm key each
    official key came from, and the timm keys no rule maps.

    `num_heads` splits the fused query-key-value weights into the official
    per-head arrays.
    """
    params, names, unmapped = {}, {}, []

    def put(key, value, source):
        params[key] = np.asarray(value, dtype=np.float32)
        names[key] = source

    for key, value in state.items():
        value = np.asarray(value)
        if not (_map_one(key, value, num_heads, put)
                or timm_eva.map_one(key, value, num_heads, put, state)
                or timm_beit.map_key(key, value, put)):
            unmapped.append(key)
    return params, names, sorted(unmapped)


_SIMPLE = {
    "patch_embed.proj.bias": "embedding/bias",
    "cls_token": "cls",
    "dist_token": DIST_KEY,
    "reg_token": REG_KEY,
    "norm_pre.weight": "pre_norm/scale",
    "norm_pre.bias": "pre_norm/bias",
    "attn_pool.latent": "MAPHead_0/probe",
    "attn_pool.norm.weight": "MAPHead_0/LayerNorm_0/scale",
    "attn_pool.norm.bias": "MAPHead_0/LayerNorm_0/bias",
    "attn_pool.mlp.fc1.bias": "MAPHead_0/MlpBlock_0/Dense_0/bias",
    "attn_pool.mlp.fc2.bias": "MAPHead_0/MlpBlock_0/Dense_1/bias",
    "attn_pool.proj.bias": "MAPHead_0/MultiHeadDotProductAttention_0/out/bias",
    "pos_embed": POSEMB_KEY,
    "fc_norm.weight": "fc_norm/scale",
    "fc_norm.bias": "fc_norm/bias",
    "head.bias": "head/bias",
    "head_dist.bias": "head_dist/bias",
    "stem.proj.bias": "stem/bias",
}


def _map_one(key, value, heads, put):  # noqa: C901 - one table, read top down
    if key == "patch_embed.proj.weight":
        put("embedding/kernel", _conv(value), key)
    elif key == "stem.proj.weight":
        put("stem/kernel", _conv(value), key)
    elif key in ("norm.weight", "norm.bias"):
        # A Mixer's final norm is "pre_head_layer_norm"; the caller renames.
        put(f"Transformer/encoder_norm/{'scale' if key.endswith('weight') else 'bias'}",
            value, key)
    elif key in ("head.weight", "head_dist.weight"):
        put(f"{key[:-len('.weight')]}/kernel", _t(value), key)
    elif key in _SIMPLE:
        put(_SIMPLE[key], value, key)
    elif key in ("attn_pool.mlp.fc1.weight", "attn_pool.mlp.fc2.weight"):
        put(f"MAPHead_0/MlpBlock_0/Dense_{int(key[len('attn_pool.mlp.fc')]) - 1}/kernel",
            _t(value), key)
    elif m := re.fullmatch(r"attn_pool\.(q|kv)\.(weight|bias)", key):
        _map_head_attention(m[1], m[2], value, heads, key, put)
    elif key == "attn_pool.proj.weight":
        put("MAPHead_0/MultiHeadDotProductAttention_0/out/kernel",
            _t(value).reshape(heads, -1, value.shape[0]), key)
    elif m := re.fullmatch(_BLOCK + r"ls([12])\.gamma", key):
        put(f"Transformer/encoderblock_{m[1]}/LayerScale_{int(m[2]) - 1}/scale", value, key)
    elif m := re.fullmatch(_BLOCK + r"attn\.qkv\.(weight|bias)", key):
        i, kind = m.groups()
        prefix = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1"
        for name, part in zip(("query", "key", "value"), np.split(value, 3, axis=0), strict=True):
            if kind == "weight":
                put(f"{prefix}/{name}/kernel", _heads_kernel(part, heads), key)
            else:
                put(f"{prefix}/{name}/bias", part.reshape(heads, -1), key)
    elif m := re.fullmatch(_BLOCK + r"attn\.proj\.(weight|bias)", key):
        i, kind = m.groups()
        prefix = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/out"
        if kind == "weight":
            put(f"{prefix}/kernel", _t(value).reshape(heads, -1, value.shape[0]), key)
        else:
            put(f"{prefix}/bias", value, key)
    elif m := re.fullmatch(_BLOCK + r"(norm1|norm2|mlp\.fc1|mlp\.fc2|mlp_tokens\.fc1|"
                           r"mlp_tokens\.fc2|mlp_channels\.fc1|mlp_channels\.fc2)"
                           r"\.(weight|bias)", key):
        i, part, kind = m.groups()
        put(_block_key(int(i), part, kind), _t(value) if kind == "weight" and
            "fc" in part else value, key)
    elif m := re.fullmatch(_STEM + r"(conv|norm)\.(weight|bias)", key):
        part, kind = m.groups()
        if part == "conv" and kind == "weight":
            put("conv_root/kernel", _conv(value), key)
        elif part == "norm":
            put(f"gn_root/{'scale' if kind == 'weight' else 'bias'}", value, key)
        else:
            return False
    elif m := re.fullmatch(_STAGE_UNIT + r"(conv[123]|norm[123]|downsample\.conv|"
                           r"downsample\.norm)\.(weight|bias)", key):
        stage, unit, part, kind = m.groups()
        prefix = f"block{int(stage) + 1}/unit{int(unit) + 1}"
        part = {"downsample.conv": "conv_proj", "downsample.norm": "gn_proj"}.get(
            part, part.replace("norm", "gn"))
        if part.startswith("conv") and kind == "weight":
            put(f"{prefix}/{part}/kernel", _conv(value), key)
        elif part.startswith("gn"):
            put(f"{prefix}/{part}/{'scale' if kind == 'weight' else 'bias'}", value, key)
        else:
            return False
    else:
        return False
    return True


def _map_head_attention(part, kind, value, heads, key, put):
    """timm's `attn_pool.q` / `attn_pool.kv` (keys, then values) -> the
    per-head query, key and value arrays of `MAPHead_0`."""
    prefix = "MAPHead_0/MultiHeadDotProductAttention_0"
    names = ("query",) if part == "q" else ("key", "value")
    for name, piece in zip(names, np.split(value, len(names), axis=0), strict=True):
        if kind == "weight":
            put(f"{prefix}/{name}/kernel", _heads_kernel(piece, heads), key)
        else:
            put(f"{prefix}/{name}/bias", piece.reshape(heads, -1), key)


def _block_key(i, part, kind):
    leaf = {"weight": "scale", "bias": "bias"} if part.startswith("norm") else \
        {"weight": "kernel", "bias": "bias"}
    if part.startswith("mlp_"):  # Mixer
        table = {"mlp_tokens.fc1": "token_mixing/Dense_0", "mlp_tokens.fc2": "token_mixing/Dense_1",
                 "mlp_channels.fc1": "channel_mixing/Dense_0",
                 "mlp_channels.fc2": "channel_mixing/Dense_1"}
        return f"MixerBlock_{i}/{table[part]}/{leaf[kind]}"
    table = {"norm1": "LayerNorm_0", "norm2": "LayerNorm_2", "mlp.fc1": "MlpBlock_3/Dense_0",
             "mlp.fc2": "MlpBlock_3/Dense_1"}
    return f"Transformer/encoderblock_{i}/{table[part]}/{leaf[kind]}"


def mixer_keys(params, names):
    """Renames the ViT-style keys a Mixer state produced (its final norm is
    `pre_head_layer_norm`, its blocks' second norm `LayerNorm_1`)."""
    out, out_names = {}, {}
    for key, value in params.items():
        new = key.replace("Transformer/encoder_norm/", "pre_head_layer_norm/")
        m = re.match(r"Transformer/encoderblock_(\d+)/LayerNorm_(0|2)/(.*)", key)
        if m:
            i, n, leaf = m.groups()
            new = f"MixerBlock_{i}/LayerNorm_{0 if n == '0' else 1}/{leaf}"
        out[new] = value
        out_names[new] = names[key]
    return out, out_names


def num_heads_of(config, width):
    """Attention heads of a timm ViT: `model_args["num_heads"]`, else what
    the architecture's name builds (`timm_architectures.ARCHITECTURES`:
    `vit_giant_patch14_dinov2` 24, `vit_base_patch16_gap_224` 16), else
    its size (`vit_base_...` -> 12), else the usual head width 64 for the
    standard widths; None when none of these tells."""
    args = config.get("model_args") or {}
    if args.get("num_heads"):
        return int(args["num_heads"])
    name = str(config.get("architecture", ""))
    row = ARCHITECTURES.get(name)
    if row is not None and width % row["num_heads"] == 0:
        return row["num_heads"]
    for prefix, heads in _HEADS_BY_NAME:
        if name.startswith(prefix) and width % heads == 0:
            return heads
    return _HEADS_BY_WIDTH.get(width)


def architecture(state, config):
    """Builder arguments `(family, kwargs)` read off a timm state dict and
    its `config.json` (None for a bare file).

    Raises `CheckpointMismatchError` for timm models keras_vit does not
    build the same way (a class token that is not pooled, position
    embeddings without the class token, 'same' padding turned off in a
    hybrid, attention pooling, ...).
    """
    config = config or {}
    args = config.get("model_args") or {}
    keys = set(state)
    name = config.get("architecture") or "this timm checkpoint"
    if family(keys) == "mixer":
        stem = state["stem.proj.weight"]
        blocks = {int(m[1]) for k in keys if (m := re.match(_BLOCK, k))}
        return "mixer", dict(
            patch_size=tuple(int(s) for s in stem.shape[2:]),
            hidden_size=int(stem.shape[0]), num_blocks=len(blocks),
            tokens_mlp_dim=int(state["blocks.0.mlp_tokens.fc1.weight"].shape[0]),
            channels_mlp_dim=int(state["blocks.0.mlp_channels.fc1.weight"].shape[0]),
        )
    if "patch_embed.proj.weight" not in keys:
        raise CheckpointMismatchError(
            f"{name}: no 'patch_embed.proj.weight', which every timm ViT and "
            "hybrid has; not a model keras_vit builds.")
    proj = state["patch_embed.proj.weight"]
    width = int(proj.shape[0])
    if timm_beit.is_beit(config, keys):  # before Eva's: a BEiT has its gamma_1, q_bias
        return timm_beit.architecture(state, config, named_arguments(config), num_heads_of)
    if timm_eva.is_eva(config, keys):
        named_arguments(config)  # a refused name says what keras_vit lacks
        return "vit", timm_eva.architecture(state, config, num_heads_of(config, width))
    blocks = {int(m[1]) for k in keys if (m := re.match(_BLOCK, k))}
    named = named_arguments(config)
    pool = config.get("global_pool") or args.get("global_pool") or named.get("pool") or None
    has_cls = "cls_token" in keys
    _refuse_unsupported(name, args, pool, has_cls, keys, state)
    heads = num_heads_of(config, width)  # None: the caller must be told
    mlp, mlp_dim = _mlp(name, {**named, **args}, state)
    kwargs = dict(
        patch_size=tuple(int(s) for s in proj.shape[2:]), hidden_size=width,
        num_layers=len(blocks), num_heads=heads, mlp_dim=mlp_dim,
        classifier="map" if "attn_pool.latent" in keys else "token" if has_cls else "gap",
    )
    if mlp != "gelu":
        kwargs["mlp"] = mlp
    kwargs.update(_token_options(name, {**named, **args}, keys, state))
    if any(k.startswith("patch_embed.backbone.") for k in keys):
        units = {}
        for key in keys:
            m = re.match(_STAGE_UNIT, key)
            if m:
                stage, unit = int(m[1]), int(m[2])
                units[stage] = max(units.get(stage, 0), unit + 1)
        root = next((state[k] for k in ("patch_embed.backbone.stem.conv.weight",
                                        "patch_embed.backbone.conv.weight") if k in state), None)
        if root is None or root.shape[0] % 64:
            raise CheckpointMismatchError(
                f"{name}: a hybrid whose ResNet stem is not the BiT stem keras_vit "
                "builds (7x7 convolution with 64 x width filters).")
        kwargs["resnet_layers"] = tuple(units[s] for s in sorted(units))
        kwargs["resnet_width"] = int(root.shape[0]) // 64
    return "vit", kwargs


# timm architecture names -> the kind of model keras_vit builds for them.
_HYBRID_NAME = re.compile(r"vit_[a-z]+_r(?:esnet)?\d*d?_")
_KINDS = {"vit": "a ViT", "hybrid": "an R+ViT hybrid", "mixer": "an MLP-Mixer"}
BUILT = ("keras_vit builds timm's ViTs (vit_*, deit_*, deit3_*), EVAs (eva02_*, eva_giant_*, "
         "vit_*_dinov3), BEiTs (beit_*, beitv2_*), R+ViT hybrids (vit_*_r26_*, vit_*_r50_*, "
         "vit_*_resnet*) and MLP-Mixers (mixer_*)")


# timm's ViT descendants outside vit_* / deit*, and what keras_vit lacks for each.
OTHER_FAMILIES = (
    ("beit", f"a BEiT that timm {TIMM_VERSION} does not register"),
    ("eva", f"an EVA that timm {TIMM_VERSION} does not register"),
    ("vit_pe_", "a Perception Encoder: rotary position embeddings"),
    ("naflexvit", "a NaFlex ViT: patches of variable count with factorised position "
                  "embeddings"),
)


def kind_of_name(name):
    """"vit", "hybrid" or "mixer": what timm's architecture `name` builds
    (None: a name keras_vit does not build)."""
    if name.startswith("mixer_"):
        return "mixer"
    if name.startswith(("vit_", "deit_", "deit3_")) or name in ARCHITECTURES or name in REFUSED:
        return "hybrid" if _HYBRID_NAME.match(name) else "vit"
    return None


def _kind_of_weights(keys):
    """`(kind, what the weights hold)` for messages."""
    def example(preferred, part, default):
        return preferred if preferred in keys else next(
            (k for k in sorted(keys) if part in k), default)

    if family(keys) == "mixer":
        key = example("blocks.0.mlp_tokens.fc1.weight", ".mlp_tokens.", "stem.proj.weight")
        return "mixer", f"MLP-Mixer token-mixing keys ({key})"
    if any(k.startswith("patch_embed.backbone.") for k in keys):
        key = example("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.", None)
        return "hybrid", f"a ResNet stem ({key})"
    key = example("blocks.0.attn.qkv.weight", ".attn.", "patch_embed.proj.weight")
    return "vit", f"ViT attention keys ({key})"


def check_architecture(config, keys, where):
    """Raises `UnsupportedCheckpointError` when config.json (`where`) names
    an architecture keras_vit does not build, `CorruptCheckpointError`
    when it names another kind of model than the weights hold (a Mixer for
    ViT weights, a ViT for a hybrid's)."""
    name = config.get("architecture")
    if not name:
        return
    claimed = kind_of_name(name)
    if claimed is None:
        family = next((why for prefix, why in OTHER_FAMILIES if name.startswith(prefix)), None)
        raise UnsupportedCheckpointError(
            f"{where!r} says architecture {name!r}, which is not one keras_vit "
            f"builds{f' ({family})' if family else ''}; {BUILT}.")
    kind, held = _kind_of_weights(keys)
    if claimed != kind:
        raise CorruptCheckpointError(
            f"{where!r} says architecture {name!r} ({_KINDS[claimed]}) but the weights "
            f"hold {held}; the file and the weights must describe the same model.")


def check_config(config, state, arch, where):
    """Raises `CorruptCheckpointError` when a value of config.json (`where`)
    contradicts the weights: the width, depth, patch, MLP width, a head
    count that does not divide the width, the classes and label names."""
    args = config.get("model_args") or {}
    mixer = family(state) == "mixer"
    width, patch = arch["hidden_size"], tuple(arch["patch_size"])
    proj = "stem.proj.weight" if mixer else "patch_embed.proj.weight"
    depth_key = "num_blocks" if mixer else "depth"
    depth = arch["num_blocks" if mixer else "num_layers"]

    def check(key, value, agrees, held):
        cv.check_agrees(where, key, value, agrees, held)

    check("model_args.embed_dim", args.get("embed_dim"), lambda v: v == width,
          f"width {width} ({proj} has {width} output channels)")
    check(f"model_args.{depth_key}", args.get(depth_key), lambda v: v == depth,
          f"{depth} blocks (blocks.0 to blocks.{depth - 1})")
    check("model_args.patch_size", args.get("patch_size"), lambda v: cv.pair(v) == patch,
          f"{patch[0]}x{patch[1]} patches ({proj} has a {patch[0]}x{patch[1]} kernel)")
    if not mixer:
        heads = args.get("num_heads")
        mlp = arch["mlp_dim"] * (2 if arch.get("mlp") == "swiglu" else 1)  # fc1's rows
        eva = timm_eva.is_eva(config, state)
        check("model_args.mlp_ratio", args.get("mlp_ratio"),
              lambda v: not isinstance(v, list) and (
                  timm_eva.mlp_ratio_agrees(width, v, arch["mlp_dim"]) if eva
                  else int(width * v) == mlp),
              f"an MLP of width {mlp} (blocks.0.mlp.fc1.weight has {mlp} rows), not "
              f"width {width} x mlp_ratio")
        check("model_args.num_heads", heads, lambda v: width % v == 0,
              f"width {width} ({proj} has {width} output channels), which {heads} "
              "heads do not divide")
    head = state.get("head.weight")
    if head is None:
        return
    classes = int(head.shape[0])
    held = f"a {classes}-class head (head.weight has {classes} rows)"
    check("num_classes", config.get("num_classes"), lambda v: v == classes, held)
    check("model_args.num_classes", args.get("num_classes"), lambda v: v == classes, held)
    for key, names in (("label_names", config.get("label_names")),
                       ("pretrained_cfg.label_names",
                        (config.get("pretrained_cfg") or {}).get("label_names"))):
        if names and len(names) != classes:
            raise CorruptCheckpointError(
                f"{where!r} has {len(names)} {key}, but the weights hold {held}; the "
                "file and the weights must describe the same model.")


def named_arguments(config):
    """What timm computes for config.json's architecture name and its
    weights do not show (`timm_architectures.ARCHITECTURES`), as
    `model_args` names them; {} for a name timm does not register.

    Raises `CheckpointMismatchError` for an architecture keras_vit does not
    build (rotary embeddings, RMSNorm, ...), naming what it lacks.
    """
    name = str((config or {}).get("architecture") or "")
    if name in REFUSED:
        raise CheckpointMismatchError(
            f"{name} has {REFUSED[name]} (in timm {TIMM_VERSION}), which keras_vit does "
            "not build; it cannot be loaded without changing its results, so it is "
            "refused.")
    row = ARCHITECTURES.get(name)
    if row is None:
        return {}
    act = "silu" if row["mlp"] == "swiglu" else {
        "erf": "gelu", "tanh": "gelu_tanh", "quick": "quick_gelu"}[row["gelu"]]
    out = dict(act_layer=act, mlp=row["mlp"], norm_eps=row["eps"], pool=row["pool"],
               class_token=row["class_token"], reg_tokens=row["reg_tokens"],
               no_embed_class=row["no_embed_class"], pre_norm=row["pre_norm"],
               distilled=row["distilled"], patch_bias=row["patch_bias"])
    if row["layer_scale"] is not None:
        out["init_values"] = row["layer_scale"]
    pre_norm = ((config or {}).get("model_args") or {}).get("pre_norm")
    if pre_norm is not None and row["patch_bias"] != row["pre_norm"]:
        # timm's VisionTransformer: PatchEmbed(bias=not pre_norm), model_args' too
        out["patch_bias"] = not pre_norm
    return out


def _token_options(name, args, keys, state):
    """The builder options of the later families (#48) the weights hold,
    each checked against what the architecture name or `model_args` says
    (a `CorruptCheckpointError` naming both where they disagree)."""
    out = {}
    reg = state.get("reg_token")
    registers = int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0
    held = {"class_token": "cls_token" in keys, "reg_tokens": registers,
            "distilled": "dist_token" in keys, "pre_norm": "norm_pre.weight" in keys,
            "patch_bias": "patch_embed.proj.bias" in keys,
            "init_values": "blocks.0.ls1.gamma" in keys}
    for key, value in held.items():
        said = args.get(key)
        if said is None:
            continue
        if (bool(said) if key == "init_values" else said) != value:  # a gamma's init: held or not
            raise CorruptCheckpointError(
                f"{name} says {key}={said!r}, but its weights hold "
                f"{_held_phrase(key, value, registers)}; the file and the weights must "
                "describe the same model.")
    if registers:
        out["num_register_tokens"] = registers
    if held["distilled"]:
        out["distillation_token"] = True
    if held["init_values"]:
        out["layer_scale_init"] = float(args.get("init_values") or 1e-5)
    if not held["patch_bias"]:
        out["patch_bias"] = False
    if held["pre_norm"]:
        out["pre_norm"] = True
    prefix = int(held["class_token"]) + int(held["distilled"]) + registers
    posemb = state.get("pos_embed")
    if args.get("no_embed_class") or (
            posemb is not None and posemb.ndim == 3
            and posemb_without_prefix(int(posemb.shape[1]), prefix)):
        out["no_embed_class"] = True
    return out


def _mlp(name, args, state):
    """`(mlp, mlp_dim)` the weights hold (`architecture.mlp_of`: a
    `SwiGLUPacked` `fc1` has twice the rows `fc2` takes), checked against
    what the architecture's name builds (a `CorruptCheckpointError` naming
    both) and its activation: a SwiGLU MLP gated by another activation
    than SiLU, or beside an attention-pooling head (whose MLP timm builds
    with the same activation), is a `CheckpointMismatchError`."""
    fc1, fc2 = state.get("blocks.0.mlp.fc1.weight"), state.get("blocks.0.mlp.fc2.weight")
    if fc1 is None or np.ndim(fc1) != 2:
        raise CheckpointMismatchError(
            f"{name}: no 2-D 'blocks.0.mlp.fc1.weight', which every timm ViT's MLP has; "
            "not a model keras_vit builds.")
    mlp, mlp_dim = mlp_of(int(fc1.shape[0]),
                          int(fc2.shape[1]) if fc2 is not None and np.ndim(fc2) == 2 else None)
    said = args.get("mlp")
    if said is not None and said != mlp:
        raise CorruptCheckpointError(
            f"{name} builds a {_MLP_NAMES[said]} MLP, but its weights hold a "
            f"{_MLP_NAMES[mlp]} MLP (blocks.0.mlp.fc1.weight has {int(fc1.shape[0])} rows, "
            f"blocks.0.mlp.fc2.weight takes {mlp_dim}; a SwiGLU's fc1 has twice the rows "
            "its fc2 takes); the file and the weights must describe the same model.")
    act = args.get("act_layer")
    if mlp == "swiglu" and act not in (None, "silu"):
        raise CheckpointMismatchError(
            f"{name} has a SwiGLU MLP gated by act_layer={act!r}; keras_vit's SwiGLU MLP "
            "gates with SiLU (timm's SwiGLUPacked), so it is refused.")
    if mlp == "swiglu" and "attn_pool.latent" in state:
        raise CheckpointMismatchError(
            f"{name} has a SwiGLU MLP and an attention-pooling head, whose MLP timm builds "
            "with the SiLU activation; keras_vit's head computes GELU, so it is refused.")
    return mlp, mlp_dim


_MLP_NAMES = {"gelu": "GELU", "swiglu": "SwiGLU"}


def _held_phrase(key, value, registers):
    return {
        "class_token": f"{'a' if value else 'no'} class token (cls_token)",
        "reg_tokens": f"{registers} register tokens (reg_token)",
        "distilled": f"{'a' if value else 'no'} distillation token (dist_token)",
        "pre_norm": f"{'a' if value else 'no'} pre-norm (norm_pre)",
        "patch_bias": f"{'a' if value else 'no'} patch-embedding bias (patch_embed.proj.bias)",
        "init_values": f"{'' if value else 'no '}layer scale (blocks.0.ls1.gamma)",
    }[key]


def _refuse_unsupported(name, args, pool, has_cls, keys, state):
    why = None
    if pool not in (None, "token", "avg", "map"):
        why = (f"global_pool={pool!r}; keras_vit builds 'token' (class token), "
               "'avg' (gap) and 'map' (attention pooling) timm models")
    elif pool == "map" and (has_cls or "attn_pool.latent" not in keys):
        why = ("global_pool='map' with a class token" if has_cls else
               "global_pool='map' without attention-pooling weights (attn_pool.latent)")
    elif "attn_pool.latent" in keys and pool != "map":
        why = f"attention-pooling weights (attn_pool) but global_pool={pool!r}"
    elif pool == "avg" and has_cls:
        why = ("global_pool='avg' with a class token (the class token is left out "
               "of the average); keras_vit's gap models have no class token")
    elif pool == "token" and not has_cls:
        why = "global_pool='token' without a class token"
    elif "pos_embed" not in keys or args.get("pos_embed", "learn") != "learn":
        said = (f"model_args.pos_embed={args['pos_embed']!r}, " if "pos_embed" in args
                else "")
        why = (f"no learned position embedding ({said}no 'pos_embed' tensor), which "
               "every keras_vit ViT adds to its patch tokens")
    elif args.get("padding_same") is False:
        why = ("a hybrid stem without TensorFlow 'same' padding (padding_same="
               "False), unlike the official hybrids keras_vit builds")
    if why:
        raise CheckpointMismatchError(
            f"{name} has {why}; it cannot be loaded into a keras_vit model "
            "without changing its results, so it is refused.")


# timm activation names (`model_args["act_layer"]`) -> keras_vit's GELU forms.
GELU_FORMS = {"gelu": "erf", "gelu_tanh": "tanh", "quick_gelu": "quick"}


def arithmetic(config, keys, mlp="gelu"):
    """Builder arguments reproducing timm's arithmetic: the GELU form and
    LayerNorm epsilon of the architecture's name (`named_arguments`),
    `model_args["act_layer"]` where given; exact GELU and 1e-6 for a bare
    file. With `mlp="swiglu"` (the architecture `architecture` read, whose
    activation it checked: SiLU) no GELU form."""
    if timm_eva.is_eva(config, keys) and not timm_beit.is_beit(config, keys):
        return timm_eva.arithmetic(config, keys)
    named = named_arguments(config)
    act = ((config or {}).get("model_args") or {}).get("act_layer") or \
        named.get("act_layer") or "gelu"
    if mlp == "swiglu":  # SiLU (`architecture` checked it); the GELU form is unused
        act = "gelu"
    if not isinstance(act, str) or act not in GELU_FORMS:
        raise CheckpointMismatchError(
            f"{(config or {}).get('architecture') or 'This timm checkpoint'} has "
            f"act_layer={act!r}; keras_vit builds GELU blocks ({sorted(GELU_FORMS)}).")
    out = dict(gelu=GELU_FORMS[act], layer_norm_epsilon=named.get("norm_eps", 1e-6))
    if family(keys) == "vit":
        out["fc_norm"] = "fc_norm.weight" in keys
        if any(k.startswith("patch_embed.backbone.") for k in keys):
            out["resnet_arithmetic"] = "timm"
    return out


IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)


def preprocessing(config):
    """`{"mean", "std", ...}` of a timm `config.json` (`pretrained_cfg`):
    mean/std on the [0, 1] scale, plus `input_size`, `interpolation`,
    `crop_pct` for the image pipeline. None for a bare file."""
    if not config:
        return None
    cfg = config.get("pretrained_cfg") or {}
    out = {"mean": tuple(float(v) for v in cfg.get("mean", IMAGENET_DEFAULT_MEAN)),
           "std": tuple(float(v) for v in cfg.get("std", IMAGENET_DEFAULT_STD))}
    for key in ("input_size", "interpolation", "crop_pct", "crop_mode"):
        if cfg.get(key) is not None:
            out[key] = cfg[key]
    return out


def class_names(config):
    names = (config or {}).get("label_names") or \
        ((config or {}).get("pretrained_cfg") or {}).get("label_names")
    if isinstance(names, dict):
        try:
            names = [names[str(i)] if str(i) in names else names[i] for i in range(len(names))]
        except KeyError:
            return None
    return list(names) if names else None
