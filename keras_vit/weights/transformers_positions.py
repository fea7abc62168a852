"""The transformers families whose positions are not a learned embedding
alone: BEiT (`model_type` "beit": a relative position bias table in each
layer) and DINOv3 (`"dinov3_vit"`: 2-D rotary embeddings). What their
keys are under the ViT names of `keras_vit.weights.transformers`, and
what their classes compute; `transformers_families` calls these where a
model type's rule differs.

The keys (transformers -> the ViT name or official key):

- BEiT, as `save_pretrained` writes it (under `beit.`): the ViT's names,
  with no `attention.attention.key.bias` (BEiT's key has none: `qkv_bias=
  "qv"`); `encoder.layer.i.lambda_1`, `lambda_2` -> `.../LayerScale_0/scale`,
  `LayerScale_1/scale`; `encoder.layer.i.attention.attention.
  relative_position_bias.relative_position_bias_table` (transformers 5's
  memory: `layers.i.relative_position_bias.relative_position_bias_table`)
  -> `.../MultiHeadDotProductAttention_1/relative_position_bias_table`;
  `pooler.layernorm` (`use_mean_pooling`) -> `fc_norm`; `embeddings.
  mask_token` left out, with a log line (pre-training only).
- DINOv3, as `save_pretrained` writes it (no prefix; `model.layer.i` in
  memory): `layer.i.` -> `encoder.layer.i.`, then DINOv2's names
  (`norm1`, `attention.q_proj`, ..., `layer_scale1.lambda1`,
  `mlp.gate_proj` + `mlp.up_proj` stacked, `mlp.down_proj`); a plain MLP's
  `mlp.up_proj` -> `intermediate.dense`; `embeddings.patch_embeddings`
  (a Conv2d) -> `embeddings.patch_embeddings.projection`; `norm` ->
  `layernorm`; `embeddings.register_tokens` -> `reg`; `embeddings.
  mask_token` left out, with a log line.

What each class computes (the loaded model's output):

- `BeitModel`: `pooler_output`, the mean of the patch tokens through
  `pooler.layernorm` (`use_mean_pooling`: `pooling="avg"`, `fc_norm=True`),
  else the class token after the final `layernorm`;
  `BeitForImageClassification`: its logits, the head on that
  (`classifier="avg"` or `"token"`). Each layer's table is for the
  patch grid of the input: at another size than `image_size` the
  offsets' rows are resized bilinearly (`align_corners=False`), as
  `BeitRelativePositionBias.forward` does (`table_resize=
  "transformers"`: `keras_vit.weights.relative_position`); absolute
  position embeddings (`use_absolute_position_embeddings`) as the ViT's.
- `DINOv3ViTModel`: `pooler_output`, the class token after the final norm
  (`pooling="token"`). RoPE of base `rope_theta` on the patch tokens'
  queries and keys (the class and register tokens are not rotated),
  coordinates the patch centres in [-1, 1] for the grid of the input:
  keras_vit's `rope="dinov3"` with `temperature=rope_theta`; query, key
  and value biases as `query_bias`, `key_bias`, `value_bias` say ("qkv",
  "qv" or "none"); the gated MLP (`use_gated_mlp`, SiLU) is
  `mlp="swiglu"`. transformers has no image classifier for DINOv3.

Refused, each with its reason: BEiT's table shared by all layers
(`use_shared_relative_position_bias`), DINOv3's other bias combinations
(`key_bias` without `query_bias` or `value_bias`, ...), a projection or
MLP without bias (`proj_bias`, `mlp_bias` false), a gated MLP gated by
another activation than SiLU.
"""

import re

import numpy as np

from keras_vit.errors import CheckpointMismatchError

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)

_LAYER = r"encoder\.layer\.(\d+)\."
TABLE = "relative_position_bias_table"
# DINOv3's saved and in-memory names -> the ViT names (before DINOv2's renames)
RENAMES = [
    (r"^(?:model\.)?layer\.(\d+)\.", r"encoder.layer.\1."),
    (r"^embeddings\.patch_embeddings\.(weight|bias)$",
     r"embeddings.patch_embeddings.projection.\1"),
    (r"^norm\.", "layernorm."),
]
# the ViT names -> each style's saved names (for messages about missing keys)
BACK = {
    "beit": [
        (r"^encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1$", r"encoder.layer.\1.lambda_\2"),
    ],
    "dinov3": [
        (r"^encoder\.layer\.(\d+)\.", r"layer.\1."),
        (r"^(layer\.\d+)\.layernorm_before\.", r"\1.norm1."),
        (r"^(layer\.\d+)\.layernorm_after\.", r"\1.norm2."),
        *[(rf"^(layer\.\d+)\.attention\.attention\.{n}\.", rf"\1.attention.{p}_proj.")
          for p, n in (("q", "query"), ("k", "key"), ("v", "value"))],
        (r"^(layer\.\d+)\.attention\.output\.dense\.", r"\1.attention.o_proj."),
        (r"^(layer\.\d+)\.intermediate\.dense\.", r"\1.mlp.up_proj."),
        (r"^(layer\.\d+)\.output\.dense\.", r"\1.mlp.down_proj."),
        (r"^embeddings\.patch_embeddings\.projection\.", "embeddings.patch_embeddings."),
        (r"^layernorm\.", "norm."),
    ],
}


def plain_up_proj(out, raw):
    """DINOv3's plain MLP: each `encoder.layer.i.mlp.up_proj` left after the
    gated MLPs' halves are stacked -> `intermediate.dense`."""
    for name in [n for n in out if re.fullmatch(_LAYER + r"mlp\.up_proj\.(weight|bias)", n)]:
        new = name.replace(".mlp.up_proj.", ".intermediate.dense.")
        if new not in out:
            out[new], raw[new] = out.pop(name), raw.pop(name)


def leaves_out_mask_token(keys):
    """Whether a state's `embeddings.mask_token` is left out: BEiT's (its
    layer scale `lambda_1` or tables), as DINOv2's and DINOv3's are."""
    return any(re.search(r"\.lambda_[12]$", k) or k.endswith(TABLE) for k in keys)


def map_key(key, value, put):
    """Puts the official arrays of a BEiT key the ViT has no rule for;
    False when `key` is none of them."""
    if m := re.fullmatch(_LAYER + r"lambda_([12])", key):
        put(f"Transformer/encoderblock_{m[1]}/LayerScale_{int(m[2]) - 1}/scale", value, key)
    elif m := re.fullmatch(_LAYER + r"(?:attention\.attention\.)?relative_position_bias\."
                           + TABLE, key):
        put(f"Transformer/encoderblock_{m[1]}/MultiHeadDotProductAttention_1/{TABLE}",
            value, key)
    elif m := re.fullmatch(r"pooler\.layernorm\.(weight|bias)", key):
        put(f"fc_norm/{'scale' if m[1] == 'weight' else 'bias'}", value, key)
    else:
        return False
    return True


def official_name(key):
    """The ViT-style name of an official key `map_key` puts, or None."""
    rules = [
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/" + TABLE,
         lambda m: f"encoder.layer.{m[1]}.attention.attention.relative_position_bias.{TABLE}"),
        (r"fc_norm/(scale|bias)",
         lambda m: f"pooler.layernorm.{'weight' if m[1] == 'scale' else 'bias'}"),
    ]
    for pattern, make in rules:
        if m := re.fullmatch(pattern, key):
            return make(m)
    return None


def model_type_of_keys(keys):
    """"beit" or "dinov3_vit" when the (prepared) keys are theirs, else None:
    BEiT's layer scale `lambda_1`, tables, mean-pooling norm, or a query
    bias without a key bias and without DINOv3's `layer_scale1`; DINOv3's
    class token without position embeddings."""
    keys = set(keys)
    attn = "encoder.layer.0.attention.attention."
    if leaves_out_mask_token(keys) or "pooler.layernorm.weight" in keys or (
            f"{attn}query.bias" in keys and f"{attn}key.bias" not in keys
            and "encoder.layer.0.layer_scale1.lambda1" not in keys):
        return "beit"
    if "embeddings.cls_token" in keys and "embeddings.position_embeddings" not in keys:
        return "dinov3_vit"
    return None


EVIDENCE = {
    "beit": "BEiT's layer scale (encoder.layer.0.lambda_1), relative position tables or a "
            "query bias without a key bias",
    "dinov3_vit": "a class token without position embeddings (RoPE)",
}


def _table(state):
    """The first layer's relative position bias table (saved or in-memory
    name), or None."""
    return next((state[k] for k in (
        f"encoder.layer.0.attention.attention.relative_position_bias.{TABLE}",
        f"encoder.layer.0.relative_position_bias.{TABLE}") if k in state), None)


def _qkv_bias(state):
    attn = "encoder.layer.0.attention.attention."
    held = tuple(f"{attn}{n}.bias" in state for n in ("query", "key", "value"))
    return {(True, True, True): "qkv", (True, False, True): "qv",
            (False, False, False): "none"}.get(held), held


def refuse(model_type, state, config):
    """Raises `CheckpointMismatchError` for a BEiT or DINOv3 keras_vit does
    not build (module docstring)."""
    if model_type not in ("beit", "dinov3_vit"):
        return
    why = None
    qkv, held = _qkv_bias(state)
    if model_type == "beit" and (config.get("use_shared_relative_position_bias") or any(
            k.endswith(TABLE) and not k.startswith("encoder.layer.") for k in state)):
        why = ("a relative position bias shared by all layers "
               "(use_shared_relative_position_bias); keras_vit builds BEiT's per-layer "
               "tables (use_relative_position_bias)")
    elif qkv is None:
        said = ", ".join(f"{n}_bias={h}" for n, h in zip(("query", "key", "value"), held,
                                                         strict=True))
        why = (f"attention biases {said}; keras_vit builds all three, the query's and the "
               "value's, or none")
    elif "encoder.layer.0.attention.output.dense.bias" not in state or \
            "encoder.layer.0.output.dense.bias" not in state:
        why = "a projection or MLP without bias (proj_bias or mlp_bias false)"
    elif model_type == "dinov3_vit" and config.get("use_gated_mlp") and \
            config.get("hidden_act", "gelu") != "silu":
        why = (f"a gated MLP gated by hidden_act={config.get('hidden_act', 'gelu')!r}; "
               "keras_vit's gated MLP (mlp='swiglu') gates with SiLU")
    if why:
        raise CheckpointMismatchError(
            f"This transformers {model_type!r} checkpoint has {why}; it cannot be loaded "
            "without changing its results, so it is refused.")


def options(model_type, state):
    """The builder options of a BEiT or DINOv3 (prepared) state: the
    attention biases, no position embedding, BEiT's tables, layer scale."""
    if model_type not in ("beit", "dinov3_vit"):
        return {}
    out = {}
    qkv, _ = _qkv_bias(state)
    if qkv != "qkv":
        out["qkv_bias"] = qkv
    if "embeddings.position_embeddings" not in state:
        out["position_embedding"] = False
    if _table(state) is not None:
        out["relative_position_bias"] = True
    if "encoder.layer.0.lambda_1" in state:
        out["layer_scale_init"] = 0.1  # an initial value; the checkpoint's scales load
    return out


def classifier(model_type, state):
    """BEiT's head on the mean-pooled patch tokens (`pooler.layernorm`):
    "avg"; None: the ViT's rule."""
    if model_type == "beit" and "pooler.layernorm.weight" in state and \
            "classifier.weight" in state:
        return "avg"
    return None


def arithmetic(model_type, config, state):
    """What BEiT and DINOv3 compute beyond the GELU form and epsilon:
    BEiT's pooled LayerNorm (`fc_norm`), DINOv3's RoPE."""
    if model_type == "beit":
        return {"fc_norm": "pooler.layernorm.weight" in state}
    if model_type == "dinov3_vit":
        return {"rope": {"variant": "dinov3",
                         "temperature": float(config.get("rope_theta", 100.0))}}
    return {}


def gated(model_type, config):
    """Whether the MLP is DINOv3's gated one (`use_gated_mlp`)."""
    return model_type == "dinov3_vit" and bool(config.get("use_gated_mlp"))


def source_class(model_type, state):
    """BEiT's and DINOv3's `HubCheckpoint` fields beyond the ViT's: the
    headless pooling (`pooler_output`), BEiT's table resize."""
    out = {}
    if model_type == "beit":
        out["pooling"] = "avg" if "pooler.layernorm.weight" in state else "token"
        out["table_resize"] = "transformers"
    elif model_type == "dinov3_vit":
        out["pooling"] = "token"
    return out


def check_config(model_type, config, state, arch, check):
    """config.json's BEiT and DINOv3 values against the weights (`check(key,
    value, agrees, held)`, `config_values.check_agrees`): the attention
    biases, the gated MLP, BEiT's tables and pooling, the image size of
    BEiT's tables."""
    if model_type not in ("beit", "dinov3_vit"):
        return
    attn = "encoder.layer.0.attention.attention."
    if model_type == "dinov3_vit":
        for name in ("query", "key", "value"):
            held = f"{attn}{name}.bias" in state
            check(f"{name}_bias", config.get(f"{name}_bias"), lambda v, h=held: bool(v) == h,
                  f"{'a' if held else 'no'} {name} bias (layer.0.attention.{name[0]}_proj.bias)")
        swiglu = arch.get("mlp") == "swiglu"
        check("use_gated_mlp", config.get("use_gated_mlp"), lambda v: bool(v) == swiglu,
              f"{'a gated' if swiglu else 'a plain'} MLP (layer.0.mlp.gate_proj "
              f"{'present' if swiglu else 'absent'})")
        return
    table = _table(state)
    check("use_relative_position_bias", config.get("use_relative_position_bias"),
          lambda v: bool(v) == (table is not None),
          f"{'a' if table is not None else 'no'} relative position bias table")
    mean = "pooler.layernorm.weight" in state
    final = "layernorm.weight" in state
    check("use_mean_pooling", config.get("use_mean_pooling"),
          lambda v: bool(v) == mean or not (mean or final),  # no pooler: either
          f"{'a' if mean else 'no'} mean-pooling LayerNorm (pooler.layernorm)"
          f"{'' if mean else ' and a final one (layernorm)' if final else ''}")
    patch = tuple(arch["patch_size"])
    if table is not None and np.ndim(table) == 2:
        rows = int(np.shape(table)[0])
        check("image_size", config.get("image_size"),
              lambda v: _table_rows(v, patch) == rows,
              f"relative position tables of {rows} rows (encoder.layer.0.attention.attention."
              f"relative_position_bias.{TABLE}, patch {patch[0]}x{patch[1]})")


def _table_rows(image_size, patch):
    h, w = (image_size, image_size) if isinstance(image_size, int) else image_size
    gh, gw = h // patch[0], w // patch[1]
    return (2 * gh - 1) * (2 * gw - 1) + 3
