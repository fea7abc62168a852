"""timm's `Eva` checkpoints (EVA-02, DINOv3, EVA, timm's RoPE ViTs) ->
official keys and builder arguments; `keras_vit.weights.timm` calls it for
the architectures `timm_architectures.ARCHITECTURES` records with a `rope`
field (timm's `eva.py` models), and for Eva keys under no such name.

| timm (`Eva`)                           | official (`.../` = `encoderblock_i/`)   |
| -------------------------------------- | --------------------------------------- |
| `blocks.i.gamma_1`, `gamma_2`          | `.../LayerScale_0/scale`, `LayerScale_1` |
| `blocks.i.attn.q_bias`, `v_bias`       | `.../MultiHeadDotProductAttention_1/{query,value}/bias` |
| `blocks.i.attn.{q,k,v}_proj`           | `.../{query,key,value}/kernel`, q/v bias |
| `blocks.i.mlp.fc1_g`, `fc1_x`          | `.../MlpBlock_3/Dense_0`: `[fc1_g | fc1_x]` |
| `blocks.i.mlp.norm` (sub-LayerNorm)    | `.../MlpBlock_3/LayerNorm_0`            |

The rest (patch embedding, `cls_token`, `reg_token`, `pos_embed`, the
fused `qkv` kernel, norms, `fc1`/`fc2`, `norm`, `fc_norm`, `head`) are the
ViT's keys (`timm.to_official`). What the weights do not show comes from
the architecture's row: the rotary embedding (`{"variant": "dinov3",
"temperature": 100}`; EVA-02's `{"variant": "eva", "temperature": 1e4,
"ref_grid": (16, 16)}`, timm's `ref_feat_shape`), the LayerNorm epsilon
(DINOv3 1e-5, EVA 1e-6) and the pooling: timm's `global_pool="avg"` beside
a class token is `classifier="avg"` (the patch tokens' mean, registers left
out), after the final norm (DINOv3) or followed by `fc_norm` (EVA-02).
Buffers that timm computes and never loads (`attn.k_bias`, zero;
`rope.periods`, `rope.bands`) are accepted only when they are what
keras_vit computes.
"""

import re

import numpy as np

from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.weights import config_values as cv
from keras_vit.weights.architecture import posemb_without_prefix
from keras_vit.weights.timm_architectures import ARCHITECTURES, TIMM_VERSION

_BLOCK = r"blocks\.(\d+)\."
# keys only timm's Eva writes
_EVA_KEY = re.compile(_BLOCK + r"(?:gamma_[12]|attn\.[qkv]_bias|attn\.[qkv]_proj\.|"
                      r"mlp\.fc1_[gx]\.|mlp\.norm\.)")
_ROPE_BUFFERS = ("rope.periods", "rope.bands")

# model_args keys and what keras_vit does with them: the shapes and options
# the weights show (checked against them), the rotary embedding's parameters,
# and what only training reads. Any other is refused: it changes what timm
# computes beyond what the architecture's name builds.
_READ = frozenset((
    "embed_dim", "depth", "num_heads", "patch_size", "num_classes", "img_size", "in_chans",
    "global_pool", "mlp_ratio", "class_token", "num_reg_tokens", "init_values", "swiglu_mlp",
    "swiglu_align_to", "qkv_bias", "qkv_fused", "scale_mlp", "use_abs_pos_emb",
    "use_fc_norm", "use_post_transformer_norm", "no_embed_class", "dynamic_img_size",
    "use_rot_pos_emb", "rope_temperature", "ref_feat_shape"))
# the model_args values of an Eva this module reads (`config_values.check_values`)
CONFIG_VALUES = {
    **{f"model_args.{key}": cv.OPTIONAL_BOOLEAN for key in (
        "swiglu_mlp", "qkv_bias", "qkv_fused", "scale_mlp", "use_abs_pos_emb", "use_fc_norm",
        "use_post_transformer_norm", "use_rot_pos_emb", "dynamic_img_size")},
    "model_args.num_reg_tokens": cv.OPTIONAL_COUNT,
    "model_args.swiglu_align_to": cv.OPTIONAL_COUNT,
    "model_args.rope_temperature": cv.OPTIONAL_POSITIVE_NUMBER,
    "model_args.ref_feat_shape": cv.OPTIONAL_SIZE,
}
_TRAINING = frozenset((
    "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
    "drop_path_rate", "head_init_scale", "rope_shift_coords", "rope_jitter_coords",
    "rope_rescale_coords"))


def is_eva(config, keys):
    """True for timm's `Eva` models: config.json names an architecture
    whose row has a `rope` field, or names none timm registers and the
    keys are an Eva's (`gamma_1`, `q_bias`, `q_proj`, `fc1_g`, `mlp.norm`)."""
    row = ARCHITECTURES.get(str((config or {}).get("architecture") or ""))
    if row is not None:
        return "rope" in row
    return any(_EVA_KEY.match(key) for key in keys)


def map_one(key, value, heads, put, state):
    """Maps one Eva-only key with `put(official key, array, source)`;
    False for a key this table does not know."""
    m = re.fullmatch(_BLOCK + r"(.+)", key)
    if key in _ROPE_BUFFERS:  # checked by `architecture`: what keras_vit computes
        return True
    if m is None:
        return False
    i, part = m.groups()
    prefix = f"Transformer/encoderblock_{i}"
    attn = f"{prefix}/MultiHeadDotProductAttention_1"
    if part in ("gamma_1", "gamma_2"):
        put(f"{prefix}/LayerScale_{int(part[-1]) - 1}/scale", value, key)
    elif part in ("attn.q_bias", "attn.v_bias"):
        put(f"{attn}/{'query' if part[5] == 'q' else 'value'}/bias", value.reshape(heads, -1), key)
    elif part == "attn.k_bias":
        if np.any(value):
            raise CheckpointMismatchError(
                f"{key} holds a key bias that is not zero; timm's EVA attention has none (its "
                "k_bias is a zero buffer) and keras_vit builds none, so it is refused.")
    elif mp := re.fullmatch(r"attn\.([qkv])_proj\.(weight|bias)", part):
        name = {"q": "query", "k": "key", "v": "value"}[mp[1]]
        if mp[2] == "weight":
            put(f"{attn}/{name}/kernel", np.ascontiguousarray(value.T).reshape(
                value.shape[1], heads, -1), key)
        else:
            put(f"{attn}/{name}/bias", value.reshape(heads, -1), key)
    elif mp := re.fullmatch(r"mlp\.fc1_([gx])\.(weight|bias)", part):
        gate = f"blocks.{i}.mlp.fc1_g.{mp[2]}"
        up = f"blocks.{i}.mlp.fc1_x.{mp[2]}"
        if gate not in state or up not in state:
            return False
        if mp[1] == "g":  # SiLU(fc1_g(x)) * fc1_x(x): the packed [gate | up]
            both = np.concatenate([state[gate], state[up]], axis=0)
            put(f"{prefix}/MlpBlock_3/Dense_0/{'kernel' if mp[2] == 'weight' else 'bias'}",
                np.ascontiguousarray(both.T) if mp[2] == "weight" else both, f"{gate} + {up}")
    elif mp := re.fullmatch(r"mlp\.norm\.(weight|bias)", part):
        put(f"{prefix}/MlpBlock_3/LayerNorm_0/{'scale' if mp[1] == 'weight' else 'bias'}",
            value, key)
    else:
        return False
    return True


def _row(config, keys):
    name = (config or {}).get("architecture")
    row = ARCHITECTURES.get(str(name or ""))
    if row is None or "rope" not in row:
        example = next((k for k in sorted(keys) if _EVA_KEY.match(k)), "")
        said = f"config.json names {name!r}" if name else "no config.json names its architecture"
        raise CheckpointMismatchError(
            f"An EVA-style timm checkpoint ({example}) whose architecture keras_vit cannot tell: "
            f"{said}, which is not one of timm {TIMM_VERSION}'s EVA, EVA-02 or DINOv3 names. "
            "Its rotary embedding and pooling are not in its weights; its config.json must "
            "name the architecture (e.g. 'eva02_base_patch14_224', 'vit_base_patch16_dinov3').")
    return str(name), row


def _check_model_args(name, args):
    for key, value in args.items():
        if key not in _READ and key not in _TRAINING:
            raise CheckpointMismatchError(
                f"{name} has model_args.{key}={value!r}, which changes what timm's Eva computes "
                "beyond what its architecture name builds; keras_vit reads "
                f"{', '.join(sorted(_READ))} (and ignores the training-only "
                f"{', '.join(sorted(_TRAINING))}), so it is refused.")


def rope_of(config):
    """The `VisionTransformer(rope=...)` the architecture computes: its
    row's, with `model_args["rope_temperature"]` and (EVA's)
    `["ref_feat_shape"]` where given; None without RoPE."""
    name, row = _row(config, ())
    args = (config or {}).get("model_args") or {}
    rope = row["rope"]
    if args.get("use_rot_pos_emb") is not None and bool(args["use_rot_pos_emb"]) != bool(rope):
        raise CheckpointMismatchError(
            f"{name} has model_args.use_rot_pos_emb={args['use_rot_pos_emb']!r}, but the "
            f"architecture's name builds {'a' if rope else 'no'} rotary embedding; keras_vit "
            "cannot tell which one, so it is refused.")
    if rope is None:
        return None
    rope = dict(rope)
    if args.get("rope_temperature") is not None:
        rope["temperature"] = float(args["rope_temperature"])
    if rope["variant"] == "eva" and args.get("ref_feat_shape") is not None:
        ref = args["ref_feat_shape"]
        rope["ref_grid"] = tuple(ref) if isinstance(ref, list) else (ref, ref)
    if rope["variant"] == "eva" and rope.get("ref_grid") is not None:
        rope["ref_grid"] = tuple(int(r) for r in rope["ref_grid"])
    return rope


def _held(state, keys):
    """What the weights show, under the row's field names."""
    reg = state.get("reg_token")
    fc1 = state.get("blocks.0.mlp.fc1.weight")
    fc2 = state.get("blocks.0.mlp.fc2.weight")
    if fc2 is None or np.ndim(fc2) != 2:
        raise CheckpointMismatchError(
            "no 2-D 'blocks.0.mlp.fc2.weight', which every timm EVA's MLP has; not a model "
            "keras_vit builds.")
    mlp_dim = int(fc2.shape[1])
    split = "blocks.0.mlp.fc1_g.weight" in keys
    packed = fc1 is not None and np.ndim(fc1) == 2 and int(fc1.shape[0]) == 2 * mlp_dim
    return dict(
        class_token="cls_token" in keys,
        reg_tokens=int(reg.shape[1]) if reg is not None and np.ndim(reg) == 3 else 0,
        layer_scale="blocks.0.gamma_1" in keys,
        mlp="swiglu" if split or packed else "gelu",
        qkv_bias="qv" if {"blocks.0.attn.q_bias", "blocks.0.attn.q_proj.bias"} & keys
        else "none",
        mlp_norm="blocks.0.mlp.norm.weight" in keys,
        position_embedding="pos_embed" in keys,
    ), mlp_dim


# model_args keys -> the row's field, and how a value reads as the field's
_ARGS_AS_ROW = {
    "class_token": ("class_token", bool),
    "num_reg_tokens": ("reg_tokens", int),
    "init_values": ("layer_scale", lambda v: v is not None),
    "swiglu_mlp": ("mlp", lambda v: "swiglu" if v else "gelu"),
    "qkv_bias": ("qkv_bias", lambda v: "qv" if v else "none"),
    "scale_mlp": ("mlp_norm", bool),
    "use_abs_pos_emb": ("position_embedding", bool),
}


def _check_held(name, row, args, held):
    """A `CorruptCheckpointError` where the weights hold another model than
    the architecture's name (or `model_args`) builds."""
    said = {"class_token": row["class_token"], "reg_tokens": row["reg_tokens"],
            "layer_scale": row["layer_scale"] is not None, "mlp": row["mlp"],
            "qkv_bias": row["qkv_bias"], "mlp_norm": row["mlp_norm"],
            "position_embedding": row["position_embedding"]}
    source = {field: f"the architecture {name}" for field in said}
    for key, (field, read) in _ARGS_AS_ROW.items():
        if key in args and (args[key] is not None or key == "init_values"):
            said[field], source[field] = read(args[key]), f"model_args.{key}={args[key]!r}"
    for field, value in held.items():
        if said[field] != value:
            raise CorruptCheckpointError(
                f"{source[field]} builds {field}={said[field]!r}, but the weights hold "
                f"{field}={value!r}; the file and the weights must describe the same model.")


def _classifier(name, pool, keys):
    """`classifier` of the model the pooling and norms make, as keras_vit
    builds it, or a `CheckpointMismatchError`."""
    has_cls, norm, fc_norm = ("cls_token" in keys, "norm.weight" in keys,
                              "fc_norm.weight" in keys)
    why = None
    if pool not in ("avg", "token"):
        why = f"global_pool={pool!r}; keras_vit builds EVA's 'avg' and 'token' pooling"
    elif pool == "token" and not has_cls:
        why = "global_pool='token' without a class token"
    elif norm == fc_norm:
        why = ("a LayerNorm before and after the pooling (norm and fc_norm)" if norm else
               "no final LayerNorm (neither norm nor fc_norm)")
    elif fc_norm and pool == "token":
        why = "a LayerNorm after the class token (fc_norm with global_pool='token')"
    if why:
        raise CheckpointMismatchError(
            f"{name} has {why}; it cannot be loaded into a keras_vit model without changing "
            "its results, so it is refused.")
    return "token" if pool == "token" else "avg" if has_cls else "gap"


def _check_buffers(name, state, rope, head_dim):
    """`rope.periods` / `rope.bands` (buffers timm recomputes and never
    loads): accepted when they are keras_vit's, to bfloat16 precision (the
    DINOv3 release stores its periods in bfloat16)."""
    for key in _ROPE_BUFFERS:
        if key not in state:
            continue
        k = np.arange(head_dim // 4, dtype=np.float32)
        temperature = np.float32(rope["temperature"]) if rope else None
        want = None if rope is None else (
            temperature ** (2 * k / (head_dim // 2)) if rope["variant"] == "dinov3" and
            key == "rope.periods" else 1.0 / temperature ** (k / (head_dim // 4))
            if rope["variant"] == "eva" and key == "rope.bands" else None)
        got = np.asarray(state[key], np.float32)
        if want is None or got.shape != want.shape or not np.allclose(got, want, rtol=1e-2):
            raise CheckpointMismatchError(
                f"{name}: {key} ({got.shape}) is not the rotary embedding's that its "
                f"architecture computes ({rope}); keras_vit computes it from the "
                "architecture, so a file holding another is refused.")


def architecture(state, config, heads):
    """`VisionTransformer` arguments of an Eva state dict (`heads`:
    `timm.num_heads_of`'s), checked against its architecture's row and
    `model_args`."""
    config = config or {}
    keys = set(state)
    name, row = _row(config, keys)
    args = config.get("model_args") or {}
    _check_model_args(name, args)
    held, mlp_dim = _held(state, keys)
    _check_held(name, row, args, held)
    proj = state["patch_embed.proj.weight"]
    pool = config.get("global_pool") or args.get("global_pool") or row["pool"]
    kwargs = dict(
        patch_size=tuple(int(s) for s in proj.shape[2:]), hidden_size=int(proj.shape[0]),
        num_layers=len({int(m[1]) for k in keys if (m := re.match(_BLOCK, k))}),
        num_heads=heads, mlp_dim=mlp_dim, classifier=_classifier(name, pool, keys))
    if held["mlp"] != "gelu":
        kwargs["mlp"] = held["mlp"]
    if held["reg_tokens"]:
        kwargs["num_register_tokens"] = held["reg_tokens"]
    if held["layer_scale"]:
        kwargs["layer_scale_init"] = float(args.get("init_values") or row["layer_scale"] or 1e-5)
    if "patch_embed.proj.bias" not in keys:
        kwargs["patch_bias"] = False
    posemb = state.get("pos_embed")
    prefix = int(held["class_token"]) + held["reg_tokens"]
    if args.get("no_embed_class") or (posemb is not None and np.ndim(posemb) == 3
                                      and posemb_without_prefix(int(posemb.shape[1]), prefix)):
        kwargs["no_embed_class"] = True
    if held["qkv_bias"] != "qkv":
        kwargs["qkv_bias"] = held["qkv_bias"]
    if held["mlp_norm"]:
        kwargs["mlp_norm"] = True
    if not held["position_embedding"]:
        kwargs["position_embedding"] = False
    if heads:
        _check_buffers(name, state, rope_of(config), int(proj.shape[0]) // heads)
    return kwargs


def arithmetic(config, keys):
    """The builder's arithmetic of an Eva: its row's GELU form (SwiGLU: SiLU,
    the GELU form unused) and LayerNorm epsilon, `fc_norm` where the
    weights have it, and the rotary embedding (`rope_of`)."""
    _, row = _row(config, keys)
    out = dict(gelu=row["gelu"] or "erf", layer_norm_epsilon=row["eps"],
               fc_norm="fc_norm.weight" in keys)
    rope = rope_of(config)
    if rope is not None:
        out["rope"] = rope
    return out


def mlp_ratio_agrees(width, ratio, mlp_dim):
    """Whether `model_args["mlp_ratio"]` gives an Eva MLP of `mlp_dim`:
    `int(width * ratio)`, rounded up to a multiple of at most 64 by a split
    SwiGLU's `swiglu_align_to` (DINOv3's S+ and H+: 8)."""
    hidden = int(width * ratio)
    return hidden <= mlp_dim < hidden + 64
