"""timm's BEiT and BEiT v2 (`timm.models.beit.Beit`: `beit_*`, `beitv2_*`):
the key its blocks have beside an Eva's, and the builder arguments of its
architecture. `keras_vit.weights.timm` calls both (`map_key` for every
timm state, `architecture` when `is_beit` says so). The rest of a BEiT
state has the ViT's names (patch embedding, class token, `qkv` without
bias, `proj`, norms, MLP, `fc_norm`, head) or an Eva's
(`keras_vit.weights.timm_eva`: `gamma_1`, `gamma_2`, `q_bias`, `v_bias`,
`mlp.norm`):

`blocks.i.attn.relative_position_bias_table` is the official
`Transformer/encoderblock_i/MultiHeadDotProductAttention_1/
relative_position_bias_table`.

What BEiT computes (`VisionTransformer` arguments): a class token, no
learned position embedding (`position_embedding=False`; `use_abs_pos_emb`
models add one, resized as timm resizes a ViT's), each block's relative
position bias table over the patch grid (`relative_position_bias=True`;
at another size resized as timm's `checkpoint_filter_fn` does,
`keras_vit.weights.relative_position`), query and value biases
(`qkv_bias="qv"`), layer scale, exact GELU, LayerNorm epsilon 1e-6; the
head on the mean of the patch tokens after `fc_norm` (`global_pool="avg"`:
`classifier="avg"`, `fc_norm=True`), or on the class token after the final
norm (`global_pool="token"`). The mean and std are the pretrained config's
(BEiT: 0.5; BEiT v2: ImageNet's).

Refused, each with its reason: a relative position bias shared by the
blocks (`use_shared_rel_pos_bias`, timm's `rel_pos_bias`: no registered
name has it), a SwiGLU MLP (`swiglu_mlp`), `global_pool=''`.
"""

import re

import numpy as np

from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.weights import config_values as cv
from keras_vit.weights.timm_architectures import ARCHITECTURES

_BLOCK = r"blocks\.(\d+)\."
BEIT_PREFIXES = ("beit_", "beitv2_")
# BEiT's config.json values beside an Eva's (`timm_eva.CONFIG_VALUES`)
CONFIG_VALUES = {f"model_args.{key}": cv.OPTIONAL_BOOLEAN
                 for key in ("use_rel_pos_bias", "use_shared_rel_pos_bias")}


def is_beit(config, keys):
    """Whether a timm checkpoint is a BEiT: config.json's architecture name,
    else (a bare file) relative position bias tables in its keys."""
    name = str((config or {}).get("architecture") or "")
    if name:
        return name.startswith(BEIT_PREFIXES)
    return any(k.endswith("relative_position_bias_table") for k in keys)


def map_key(key, value, put):
    """Puts a BEiT block's relative position bias table under its official
    key (`put(official key, array, source key)`); False for any other key."""
    m = re.fullmatch(_BLOCK + r"attn\.relative_position_bias_table", key)
    if m is None:
        return False
    put(f"Transformer/encoderblock_{m[1]}/MultiHeadDotProductAttention_1/"
        "relative_position_bias_table", value, key)
    return True


def _refuse(name, args, keys, pool):
    why = None
    if any(k.startswith("rel_pos_bias.") for k in keys) or args.get("use_shared_rel_pos_bias"):
        why = ("a relative position bias shared by all blocks (use_shared_rel_pos_bias, "
               "rel_pos_bias.relative_position_bias_table); keras_vit builds BEiT's "
               "per-block tables (use_rel_pos_bias)")
    elif any(re.fullmatch(_BLOCK + r"mlp\.fc1_[gx]\.weight", k) for k in keys) or \
            args.get("swiglu_mlp"):
        why = "a SwiGLU MLP (swiglu_mlp, mlp.fc1_g / fc1_x); keras_vit's BEiT blocks have GELU"
    elif pool not in ("avg", "token"):
        why = (f"global_pool={pool!r}; keras_vit builds BEiT's 'avg' (the mean of the patch "
               "tokens) and 'token' (the class token) heads")
    elif "cls_token" not in keys:
        why = "no class token (cls_token), which every BEiT has"
    elif "blocks.0.mlp.fc1.weight" not in keys:
        why = "no 'blocks.0.mlp.fc1.weight', which every BEiT block's MLP has"
    if why:
        raise CheckpointMismatchError(
            f"{name} has {why}; it cannot be loaded into a keras_vit model without "
            "changing its results, so it is refused.")


# model_args keys -> (the row's field, how a value reads as it, the key the weights show)
_ARGS_AS_ROW = {
    "use_rel_pos_bias": ("relative_position_bias", bool,
                         "blocks.0.attn.relative_position_bias_table"),
    "use_abs_pos_emb": ("position_embedding", bool, "pos_embed"),
    "qkv_bias": ("qkv_bias", lambda v: "qv" if v else "none", "blocks.0.attn.q_bias"),
    "init_values": ("layer_scale", bool, "blocks.0.gamma_1"),
    "scale_mlp": ("mlp_norm", bool, "blocks.0.mlp.norm.weight"),
}


def _check_held(name, args, keys):
    """A `CorruptCheckpointError` where the weights hold another BEiT than
    the architecture's name (its `ARCHITECTURES` row) or `model_args` say:
    the tables, the position embedding, the q/v biases, layer scale, the
    MLP's norm."""
    row = ARCHITECTURES.get(name) or {}
    for arg, (field, read, key) in _ARGS_AS_ROW.items():
        said, where = row.get(field), f"the architecture {name}"
        if field == "layer_scale" and field in row:
            said = row[field] is not None
        if arg in args:
            said, where = read(args[arg]), f"model_args.{arg}={args[arg]!r}"
        held = key in keys
        if said is not None and (said if isinstance(said, bool) else said == "qv") != held:
            raise CorruptCheckpointError(
                f"{where} builds {field}={said!r}, but the weights hold "
                f"{'a' if held else 'no'} {key}; the file and the weights must describe "
                "the same model.")


def architecture(state, config, named, num_heads_of):
    """`("vit", VisionTransformer kwargs)` of a timm BEiT state dict and its
    config.json (None for a bare file); `named`: what the architecture's
    name computes (`timm.named_arguments`); `num_heads_of(config, width)`:
    `keras_vit.weights.timm.num_heads_of`.

    Raises `CheckpointMismatchError` for what keras_vit does not build
    (module docstring)."""
    config = config or {}
    args = config.get("model_args") or {}
    keys = set(state)
    name = config.get("architecture") or "this timm BEiT checkpoint"
    said = [v for v in (config.get("global_pool"), args.get("global_pool")) if v is not None]
    pool = said[0] if said else named.get("pool") or "avg"  # '' (no pooling): refused
    _refuse(name, args, keys, pool)
    _check_held(name, args, keys)
    proj = state["patch_embed.proj.weight"]
    width = int(proj.shape[0])
    blocks = {int(m[1]) for k in keys if (m := re.match(_BLOCK, k))}
    kwargs = dict(
        patch_size=tuple(int(s) for s in proj.shape[2:]), hidden_size=width,
        num_layers=len(blocks), num_heads=num_heads_of(config, width),
        mlp_dim=int(np.shape(state["blocks.0.mlp.fc1.weight"])[0]), classifier=pool,
        qkv_bias="qv" if "blocks.0.attn.q_bias" in keys else
        "qkv" if "blocks.0.attn.qkv.bias" in keys else "none")
    if "pos_embed" not in keys:
        kwargs["position_embedding"] = False
    if "blocks.0.attn.relative_position_bias_table" in keys:
        kwargs["relative_position_bias"] = True
    if "blocks.0.gamma_1" in keys:
        kwargs["layer_scale_init"] = float(args.get("init_values") or 0.1)
    if "blocks.0.mlp.norm.weight" in keys:
        kwargs["mlp_norm"] = True
    if "patch_embed.proj.bias" not in keys:
        kwargs["patch_bias"] = False
    return "vit", kwargs


# --- the way back: official arrays of a BEiT -> timm (`timm_export`) ------------------

def is_beit_model(arch):
    """Whether official arrays' builder arguments are a BEiT's (each block
    holds a relative position bias table)."""
    return bool(arch.get("relative_position_bias"))


def hub_arguments(arch, arithmetic):
    """`(architecture name, model_args)` of the config.json that timm's
    `Beit` builds a BEiT from (`model_args` set every option the registered
    `beit_base_patch16_224` would otherwise fix); `arch`:
    `architecture_from_checkpoint`'s, `arithmetic`:
    `hub_folder.model_arithmetic`'s.

    Raises:
        ValueError: what timm's `Beit` computes otherwise (its exact GELU,
            LayerNorm epsilon 1e-6, no key bias, a class token, ...)."""
    why = None
    classifier = arch["classifier"]
    if arithmetic["gelu"] != "erf" or arithmetic["layer_norm_epsilon"] != 1e-6:
        why = (f"GELU {arithmetic['gelu']!r} and LayerNorm epsilon "
               f"{arithmetic['layer_norm_epsilon']:g}, and timm's Beit computes the exact "
               "GELU and epsilon 1e-6 in its code")
    elif arch.get("mlp", "gelu") != "gelu":
        why = "a SwiGLU MLP, and keras_vit writes timm's Beit with its GELU MLP only"
    elif arch.get("qkv_bias", "qkv") == "qkv":
        why = ("a key bias (qkv_bias='qkv'), and timm's Beit has query and value biases "
               "only")
    elif classifier not in ("avg", "token"):
        why = (f"classifier={classifier!r}, and timm's Beit pools the patch tokens' mean "
               "('avg') or the class token ('token')")
    else:
        extra = [k for k in ("num_register_tokens", "distillation_token", "no_embed_class",
                             "pre_norm", "patch_bias") if k in arch]
        if extra:
            why = f"{extra[0]}={arch[extra[0]]!r}, which timm's Beit does not build"
    if why:
        raise ValueError(f"it is a BEiT (relative position bias tables) with {why}")
    width, scale = arch["hidden_size"], arithmetic.get("layer_scale_init")
    ratio = arch["mlp_dim"] / width
    if int(width * ratio) != arch["mlp_dim"]:
        raise ValueError(f"timm's Beit builds the MLP width as int(width x mlp_ratio), which "
                         f"cannot give {arch['mlp_dim']} for width {width}")
    return "beit_base_patch16_224", dict(
        embed_dim=width, depth=arch["num_layers"], num_heads=arch["num_heads"],
        mlp_ratio=ratio, global_pool=classifier, qkv_bias=arch["qkv_bias"] == "qv",
        use_abs_pos_emb=arch.get("position_embedding", True), use_rel_pos_bias=True,
        use_shared_rel_pos_bias=False, init_values=None if scale is None else float(scale),
        use_fc_norm=bool(arithmetic["fc_norm"]), scale_mlp=bool(arch.get("mlp_norm")))
