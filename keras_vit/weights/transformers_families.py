"""The later ViT families of Hugging Face transformers (#48) and what each
source class computes: DINOv2 (with registers), DeiT, and the vision towers
of CLIP and SigLIP, as `save_pretrained` writes them (and as transformers
5 names them in memory). `keras_vit.weights.transformers` reads them: this
module turns their keys into its ViT key names (`prepare`), maps the keys
the ViT has no counterpart of onto the official ones (`map_key`), and says
per `model_type` what the source class computes.

The keys (transformers -> the ViT name or official key):

- the base model's prefix `dinov2.`, `dinov2_with_registers.`, `deit.`,
  `vision_model.`: stripped, as `vit.` is;
- DINOv2's `encoder.layer.i.norm1`, `norm2`, `mlp.fc1`, `mlp.fc2` (and
  transformers 5's `attention.q_proj`, ..., `o_proj`): the ViT's
  `layernorm_before`, `layernorm_after`, `intermediate.dense`,
  `output.dense` (`attention.attention.query`, ..., `attention.output.dense`);
  `layer_scale1.lambda1`, `layer_scale2.lambda1` -> `.../LayerScale_0/scale`,
  `LayerScale_1/scale`; DINOv2-g's SwiGLU MLP (`use_swiglu_ffn`): `mlp.weights_in`
  (twice the hidden width: the gate's rows, then the up projection's) and
  `mlp.weights_out` as saved, `mlp.gate_proj` + `mlp.up_proj` (stacked) and
  `mlp.down_proj` in transformers 5's memory -> `intermediate.dense`,
  `output.dense` of a `mlp="swiglu"` model;
- `embeddings.register_tokens (1, R, D)` -> `reg`, the class position
  embedding folded into the class token (`cls + pos[:, :1]`; the position
  embedding then covers the patches alone, `no_embed_class=True`);
- DeiT's `embeddings.distillation_token`, `cls_classifier`,
  `distillation_classifier` -> `dist`, `head`, `head_dist`;
- CLIP's and SigLIP's `encoder.layers.i.self_attn.{q,k,v,out}_proj`,
  `layer_norm1`, `layer_norm2`, `mlp.fc1`, `mlp.fc2`: the ViT's attention,
  norms and MLP; `embeddings.patch_embedding`: the patch projection;
  `embeddings.class_embedding (D,)` -> `cls (1, 1, D)`;
  `embeddings.position_embedding.weight (N, D)` -> the position embedding
  `(1, N, D)`; CLIP's `pre_layrnorm` -> `pre_norm`, `post_layernorm` ->
  `Transformer/encoder_norm`; `visual_projection.weight (P, D)` (no bias) ->
  `head` with a zero bias;
- SigLIP's attention-pooling head `head.probe`, `head.attention.in_proj_weight
  (3D, D)` / `in_proj_bias` (torch's `nn.MultiheadAttention`: query, key,
  value stacked), `out_proj`, `layernorm`, `mlp.fc1/2` -> `MAPHead_0/probe`,
  `MAPHead_0/MultiHeadDotProductAttention_0/{query,key,value,out}`,
  `MAPHead_0/LayerNorm_0`, `MAPHead_0/MlpBlock_0/Dense_0/1`.

Left out, each with a log line: DINOv2's `embeddings.mask_token` (replaces
masked patches in pre-training only; the forward without `bool_masked_pos`
never reads it; a ViT's is reported as unexpected, as it comes with a
masked-image-modeling decoder);
the text tower of a full `clip` / `siglip` checkpoint (`text_model.*`,
`text_projection`, `logit_scale`, `logit_bias`; one log line says so).
Left out as the constant it is: the `embeddings.position_ids` buffer
transformers 4 saved for CLIP and SigLIP, when it holds `0, 1, ..., N - 1`
(other values are reported as an unexpected key); an empty
`embeddings.register_tokens` (DINOv3 without registers saves `(1, 0, D)`).

BEiT and DINOv3: `keras_vit.weights.transformers_positions`, which these
rules call where a model type's differ (its renames, keys, options,
pooling and the resize of BEiT's tables).

What each source class gives (the loaded model's output):

- `Dinov2Model`, `Dinov2WithRegistersModel`: `pooler_output`, the class
  token after the final LayerNorm (`pooling="token"`);
  `Dinov2ForImageClassification` (and `...WithRegisters...`): its logits,
  the head on the class token concatenated with the mean of the patch
  tokens (registers left out): `classifier="token_avg"`, which the head's
  `(2D, classes)` kernel tells.
- `DeiTModel`: its pooler (Dense + tanh on the class token, `pre_logits`);
  `DeiTForImageClassification`: the logits of its head on the class token;
  `DeiTForImageClassificationWithTeacher`: its logits, a head on the
  class token and one on the distillation token averaged (keras_vit's
  distilled classifier, `SequencePooling("token_dist")`).
- `CLIPVisionModel`: `pooler_output`, the class token after
  `post_layernorm`; `CLIPVisionModelWithProjection` and a full `CLIPModel`:
  `image_embeds`, the pooler output through `visual_projection` (a Linear
  without bias, loaded as the head with a zero bias and
  `classifier_activation=None`, so the output is exactly `image_embeds`).
- `SiglipVisionModel`, a full `SiglipModel`: `pooler_output`, the
  attention-pooling head's output (`classifier="map"`);
  `SiglipForImageClassification`: its logits, the head on the mean of
  all tokens after the final LayerNorm (`classifier="gap"`).

The token sequence (`pooling=None`) is `last_hidden_state` for each, except
CLIP's, whose `last_hidden_state` is taken before `post_layernorm`.
"""

import dataclasses
import logging
import re

import numpy as np

from keras_vit.errors import CheckpointMismatchError
from keras_vit.weights import transformers_positions as positions
from keras_vit.weights.architecture import mlp_of
from keras_vit.weights.npz import DIST_KEY, REG_KEY

logger = logging.getLogger("keras_vit")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class Family:
    """What a transformers `model_type` computes where its config.json is
    silent: the classes keras_vit builds, `hidden_act` and `layer_norm_eps`
    (its config class's defaults), the mean/std of its image processor's
    defaults, and the output pooling of its base model without a head
    (`pooler_output`; None: `last_hidden_state`)."""

    classes: tuple
    hidden_act: str
    layer_norm_eps: float
    mean: tuple = (0.5, 0.5, 0.5)
    std: tuple = (0.5, 0.5, 0.5)
    pooler: str | None = None


FAMILIES = {
    "vit": Family(("ViTModel", "ViTForImageClassification"), "gelu", 1e-12),
    "dinov2": Family(("Dinov2Model", "Dinov2ForImageClassification"), "gelu", 1e-6,
                     OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "token"),
    "dinov2_with_registers": Family(
        ("Dinov2WithRegistersModel", "Dinov2WithRegistersForImageClassification"),
        "gelu", 1e-6, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "token"),
    "deit": Family(("DeiTModel", "DeiTForImageClassification",
                    "DeiTForImageClassificationWithTeacher"), "gelu", 1e-12),
    "clip_vision_model": Family(("CLIPVisionModel", "CLIPVisionModelWithProjection"),
                                "quick_gelu", 1e-5, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "token"),
    "clip": Family(("CLIPModel",), "quick_gelu", 1e-5, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
                   "token"),
    "siglip_vision_model": Family(("SiglipVisionModel",), "gelu_pytorch_tanh", 1e-6),
    "siglip": Family(("SiglipModel", "SiglipForImageClassification"), "gelu_pytorch_tanh",
                     1e-6),
    # BEiT and DINOv3: `transformers_positions` (BEiT's pooling is its mean pooling's)
    "beit": Family(("BeitModel", "BeitForImageClassification"), "gelu", 1e-12),
    "dinov3_vit": Family(("DINOv3ViTModel",), "gelu", 1e-5, positions.IMAGENET_DEFAULT_MEAN,
                         positions.IMAGENET_DEFAULT_STD, "token"),
}
# A full (text + vision) checkpoint's config keeps the vision tower's values here.
VISION_CONFIG = {"clip": "vision_config", "siglip": "vision_config"}

_NAFLEX = (
    "NaFlex patches: its image processor picks each image's patch grid from its aspect "
    "ratio (up to max_num_patches), resizes the position embeddings to that grid "
    "(bilinear, antialias) and masks the padding patches, which a keras_vit model of "
    "one fixed grid does not compute (SigLIP 2's fixed-resolution checkpoints are "
    "model_type 'siglip' and load)")
# model types keras_vit does not build -> what they have that it lacks
REFUSED = {
    "data2vec-vision": "BEiT's blocks under its own key names (data2vec_vision.*), which "
                       "keras_vit does not read",
    "aimv2": "RMSNorm", "aimv2_vision_model": "RMSNorm",
    "vit_mae": "random patch masking (mask_ratio) in its forward",
    "siglip2": _NAFLEX, "siglip2_vision_model": _NAFLEX,
    "vit-hybrid": "a BiT backbone whose layers differ from the official hybrids'",
    "vit_hybrid": "a BiT backbone whose layers differ from the official hybrids'",
}

PREFIXES = ("vit.", "dinov2_with_registers.", "dinov2.", "deit.", "vision_model.", "beit.")
TEXT_TOWER = ("text_model.", "text_projection.", "logit_scale", "logit_bias")
MASK_TOKEN = "embeddings.mask_token"
REGISTERS = "embeddings.register_tokens"
# transformers 4 saved CLIP's and SigLIP's index buffer 0, 1, ..., N - 1
POSITION_IDS = "embeddings.position_ids"


def _is_arange(value):
    value = np.asarray(value).reshape(-1)
    return np.array_equal(value, np.arange(value.size))


_LAYERS = r"^encoder\.layers\.(\d+)\."  # CLIP, SigLIP
_DINO_LAYER = r"^encoder\.layer\.(\d+)\."  # DINOv2 (saved, and in memory)
_BLOCK = r"encoder.layer.\1."
# the families' key names -> the ViT names of `keras_vit.weights.transformers`
RENAMES = [
    *positions.RENAMES,  # DINOv3's layer., patch embedding and norm first
    *[(_LAYERS + rf"self_attn\.{p}_proj\.", _BLOCK + f"attention.attention.{n}.")
      for p, n in (("q", "query"), ("k", "key"), ("v", "value"))],
    (_LAYERS + r"self_attn\.out_proj\.", _BLOCK + "attention.output.dense."),
    (_LAYERS + r"layer_norm1\.", _BLOCK + "layernorm_before."),
    (_LAYERS + r"layer_norm2\.", _BLOCK + "layernorm_after."),
    (_LAYERS + r"mlp\.fc1\.", _BLOCK + "intermediate.dense."),
    (_LAYERS + r"mlp\.fc2\.", _BLOCK + "output.dense."),
    *[(_DINO_LAYER + rf"attention\.{p}_proj\.", _BLOCK + f"attention.attention.{n}.")
      for p, n in (("q", "query"), ("k", "key"), ("v", "value"))],
    (_DINO_LAYER + r"attention\.o_proj\.", _BLOCK + "attention.output.dense."),
    (_DINO_LAYER + r"norm1\.", _BLOCK + "layernorm_before."),
    (_DINO_LAYER + r"norm2\.", _BLOCK + "layernorm_after."),
    (_DINO_LAYER + r"mlp\.fc1\.", _BLOCK + "intermediate.dense."),
    (_DINO_LAYER + r"mlp\.fc2\.", _BLOCK + "output.dense."),
    (_DINO_LAYER + r"mlp\.weights_in\.", _BLOCK + "intermediate.dense."),  # SwiGLU
    (_DINO_LAYER + r"mlp\.(?:weights_out|down_proj)\.", _BLOCK + "output.dense."),
    (r"^embeddings\.patch_embedding\.", "embeddings.patch_embeddings.projection."),
    (r"^post_layernorm\.", "layernorm."),
]
# the ViT names -> each style's saved names (for messages about missing keys)
_BACK = {
    "clip": [
        *[(rf"^encoder\.layer\.(\d+)\.attention\.attention\.{n}\.",
           rf"encoder.layers.\1.self_attn.{p}_proj.")
          for p, n in (("q", "query"), ("k", "key"), ("v", "value"))],
        (r"^encoder\.layer\.(\d+)\.attention\.output\.dense\.",
         r"encoder.layers.\1.self_attn.out_proj."),
        (r"^encoder\.layer\.(\d+)\.layernorm_before\.", r"encoder.layers.\1.layer_norm1."),
        (r"^encoder\.layer\.(\d+)\.layernorm_after\.", r"encoder.layers.\1.layer_norm2."),
        (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"encoder.layers.\1.mlp.fc1."),
        (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"encoder.layers.\1.mlp.fc2."),
        (r"^embeddings\.patch_embeddings\.projection\.", "embeddings.patch_embedding."),
        (r"^embeddings\.cls_token$", "embeddings.class_embedding"),
        (r"^embeddings\.position_embeddings$", "embeddings.position_embedding.weight"),
        (r"^layernorm\.", "post_layernorm."),
        (r"^classifier\.", "visual_projection."),
    ],
    "dinov2": [
        (r"^encoder\.layer\.(\d+)\.layernorm_before\.", r"encoder.layer.\1.norm1."),
        (r"^encoder\.layer\.(\d+)\.layernorm_after\.", r"encoder.layer.\1.norm2."),
        (r"^encoder\.layer\.(\d+)\.intermediate\.dense\.", r"encoder.layer.\1.mlp.fc1."),
        (r"^encoder\.layer\.(\d+)\.output\.dense\.", r"encoder.layer.\1.mlp.fc2."),
    ],
    **positions.BACK,
}
# DINOv2-g's SwiGLU MLP as saved (for messages)
_SWIGLU_BACK = [(r"^(encoder\.layer\.\d+)\.mlp\.fc1\.", r"\1.mlp.weights_in."),
                (r"^(encoder\.layer\.\d+)\.mlp\.fc2\.", r"\1.mlp.weights_out.")]
_STYLE = {"clip_vision_model": "clip", "clip": "clip", "siglip_vision_model": "clip",
          "siglip": "clip", "dinov2": "dinov2", "dinov2_with_registers": "dinov2",
          "beit": "beit", "dinov3_vit": "dinov3"}


@dataclasses.dataclass
class Prepared:
    """A state dict under the ViT names: `state`, each key's name in the
    file (`raw`), the keys left out (`left_out`) and the prefix stripped."""

    state: dict
    raw: dict
    left_out: list
    prefix: str


def prefix_of(keys):
    """The base-model prefix the keys have (`vit.`, `dinov2.`, ...), or ""."""
    return next((p for p in PREFIXES if any(k.startswith(p) for k in keys)), "")


def prepare(state, renames=()):
    """The state under the ViT names of `keras_vit.weights.transformers`
    (DINOv2's mask token and a text tower left out)
    (`renames`, transformers 5's in-memory ViT names, applied after the
    families'), the values reshaped where a family stores them otherwise:
    CLIP's class embedding `(D,)` -> `(1, 1, D)`, CLIP's and SigLIP's
    position embedding `(N, D)` -> `(1, N, D)`; with register tokens the
    class position embedding folded into the class token (`cls + pos[:, :1]`,
    the position embedding then the patches' alone: exact at any size,
    since the class position embedding is never resized); a
    `visual_projection` without bias gets a zero one."""
    prefix = prefix_of(state)
    # DINOv2's and DINOv3's (layer_scale1) and BEiT's mask tokens
    masked = any(k.endswith("layer_scale1.lambda1") for k in state) or \
        positions.leaves_out_mask_token(state)
    out, raw, left_out = {}, {}, []
    for key, value in state.items():
        name = key[len(prefix):] if prefix and key.startswith(prefix) else key
        if (masked and name == MASK_TOKEN) or key.startswith(TEXT_TOWER) or (
                name == POSITION_IDS and _is_arange(value)) or (
                name == REGISTERS and np.size(value) == 0):  # DINOv3's (1, 0, D)
            left_out.append(key)
            continue
        for pattern, repl in (*RENAMES, *renames):
            name = re.sub(pattern, repl, name)
        out[name], raw[name] = value, key
    cls, pos = "embeddings.cls_token", "embeddings.position_embeddings"
    for old, new, ndim in (("embeddings.class_embedding", cls, 1),
                           ("embeddings.position_embedding.weight", pos, 2)):
        value = out.get(old)
        if value is not None and np.ndim(value) == ndim and new not in out:
            value = np.asarray(out.pop(old))
            out[new] = value[None] if ndim == 2 else value.reshape(1, 1, -1)
            raw[new] = raw.pop(old)
    _stack_gate_and_up(out, raw)
    positions.plain_up_proj(out, raw)
    if "embeddings.register_tokens" in out and cls in out and pos in out:
        c, p = np.asarray(out[cls]), np.asarray(out[pos])
        if c.ndim == 3 and p.ndim == 3 and c.shape[1:] == (1, p.shape[2]) and p.shape[1] > 1:
            out[cls], out[pos] = c + p[:, :1], p[:, 1:]
    projection = out.get("visual_projection.weight")
    if projection is not None and "visual_projection.bias" not in out:
        out["visual_projection.bias"] = np.zeros(np.shape(projection)[:1], np.float32)
        raw["visual_projection.bias"] = "visual_projection (no bias: zeros)"
    return Prepared(out, raw, left_out, prefix)


_GATE = re.compile(r"encoder\.layer\.(\d+)\.mlp\.gate_proj\.(weight|bias)")


def _stack_gate_and_up(out, raw):
    """transformers 5's in-memory SwiGLU halves, `mlp.gate_proj` and
    `mlp.up_proj` (the `Chunk(dim=0)` of `weights_in`), stacked back into
    `intermediate.dense` (gate rows first); one half alone stays as it is
    (reported as unexpected)."""
    for name in [n for n in out if _GATE.fullmatch(n)]:
        up = name.replace(".gate_proj.", ".up_proj.")
        if up not in out:
            continue
        block, leaf = _GATE.fullmatch(name).groups()
        new = f"encoder.layer.{block}.intermediate.dense.{leaf}"
        out[new] = np.concatenate([np.asarray(out.pop(name)), np.asarray(out.pop(up))])
        raw[new] = f"{raw.pop(name)} + {raw.pop(up)}"


def log_left_out(prepared, source=None):
    """One log line for what `prepare` left out: a full checkpoint's text
    tower, DINOv2's mask token."""
    source = source or "This transformers checkpoint"
    mask = [k for k in prepared.left_out if k.endswith(MASK_TOKEN)]
    if mask:
        logger.info("%s: its %s (used by masked pre-training only) is left out.",
                    source, mask[0])
    text = [k for k in prepared.left_out if k.startswith(TEXT_TOWER)]
    if text:
        roots = sorted({k.split(".")[0] for k in text})
        logger.info(
            "%s holds a text tower too (%d tensors: %s); keras_vit builds the vision "
            "tower (%s*%s) and leaves the text tower out.",
            source, len(text), ", ".join(roots),
            prepared.prefix, ", visual_projection" if "visual_projection.weight"
            in prepared.state else "")


def _t(a):
    return np.ascontiguousarray(np.asarray(a).T)


def _heads_kernel(w, heads):
    return _t(w).reshape(w.shape[1], heads, -1)


_MAP = "MAPHead_0/MultiHeadDotProductAttention_0"
_HEADS = {"classifier": "head", "cls_classifier": "head",
          "distillation_classifier": "head_dist", "visual_projection": "head"}


def map_key(key, value, heads, put):  # noqa: C901 - one table, read top down
    """Puts the official arrays of a family key the ViT has no rule for;
    False when `key` is none of them."""
    def leaf(kind, norm=False):
        return ("scale" if norm else "kernel") if kind == "weight" else "bias"

    if key == "embeddings.distillation_token":
        put(DIST_KEY, value, key)
    elif key == "embeddings.register_tokens":
        put(REG_KEY, value, key)
    elif m := re.fullmatch(r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1", key):
        put(f"Transformer/encoderblock_{m[1]}/LayerScale_{int(m[2]) - 1}/scale", value, key)
    elif m := re.fullmatch(r"pre_layrnorm\.(weight|bias)", key):
        put(f"pre_norm/{leaf(m[1], True)}", value, key)
    elif m := re.fullmatch(r"(cls_classifier|distillation_classifier|visual_projection)"
                           r"\.(weight|bias)", key):
        put(f"{_HEADS[m[1]]}/{leaf(m[2])}", _t(value) if m[2] == "weight" else value, key)
    elif key == "head.probe":
        put("MAPHead_0/probe", value, key)
    elif m := re.fullmatch(r"head\.attention\.in_proj_(weight|bias)", key):
        for name, part in zip(("query", "key", "value"), np.split(value, 3, axis=0),
                              strict=True):
            put(f"{_MAP}/{name}/{leaf(m[1])}", _heads_kernel(part, heads)
                if m[1] == "weight" else part.reshape(heads, -1), key)
    elif m := re.fullmatch(r"head\.attention\.out_proj\.(weight|bias)", key):
        put(f"{_MAP}/out/{leaf(m[1])}", _t(value).reshape(heads, -1, value.shape[0])
            if m[1] == "weight" else value, key)
    elif m := re.fullmatch(r"head\.layernorm\.(weight|bias)", key):
        put(f"MAPHead_0/LayerNorm_0/{leaf(m[1], True)}", value, key)
    elif m := re.fullmatch(r"head\.mlp\.fc([12])\.(weight|bias)", key):
        put(f"MAPHead_0/MlpBlock_0/Dense_{int(m[1]) - 1}/{leaf(m[2])}",
            _t(value) if m[2] == "weight" else value, key)
    else:
        return positions.map_key(key, value, put)  # BEiT's
    return True


def official_name(key):
    """The family name (ViT style) of an official key `map_key` puts, or None."""
    def wb(leaf):
        return "bias" if leaf == "bias" else "weight"

    rules = [
        (re.escape(DIST_KEY), lambda m: "embeddings.distillation_token"),
        (re.escape(REG_KEY), lambda m: "embeddings.register_tokens"),
        (r"Transformer/encoderblock_(\d+)/LayerScale_(\d)/scale",
         lambda m: f"encoder.layer.{m[1]}.layer_scale{int(m[2]) + 1}.lambda1"),
        (r"pre_norm/(scale|bias)", lambda m: f"pre_layrnorm.{wb(m[1])}"),
        (r"head_dist/(kernel|bias)", lambda m: f"distillation_classifier.{wb(m[1])}"),
        (r"MAPHead_0/probe", lambda m: "head.probe"),
        (_MAP + r"/(?:query|key|value)/(kernel|bias)",
         lambda m: f"head.attention.in_proj_{wb(m[1])}"),
        (_MAP + r"/out/(kernel|bias)", lambda m: f"head.attention.out_proj.{wb(m[1])}"),
        (r"MAPHead_0/LayerNorm_0/(scale|bias)", lambda m: f"head.layernorm.{wb(m[1])}"),
        (r"MAPHead_0/MlpBlock_0/Dense_(\d)/(kernel|bias)",
         lambda m: f"head.mlp.fc{int(m[1]) + 1}.{wb(m[2])}"),
    ]
    for pattern, make in rules:
        if m := re.fullmatch(pattern, key):
            return make(m)
    return positions.official_name(key)


def styled(name, model_type, swiglu=False):
    """A ViT-named key as `model_type` names it (for messages); `swiglu`:
    DINOv2's SwiGLU MLP (`mlp.weights_in`, `weights_out`)."""
    for pattern, repl in (*_BACK.get(_STYLE.get(model_type), ()),
                          *(_SWIGLU_BACK if swiglu else ())):
        name = re.sub(pattern, repl, name)
    return name


def model_type_of_keys(keys):
    """The `model_type` a state dict's keys (after `prepare`) are those of."""
    keys = set(keys)
    kind = positions.model_type_of_keys(keys)
    if kind is not None:
        return kind
    if "embeddings.register_tokens" in keys:
        return "dinov2_with_registers"
    if any(re.fullmatch(r"encoder\.layer\.\d+\.layer_scale1\.lambda1", k) for k in keys):
        return "dinov2"
    if "embeddings.distillation_token" in keys:
        return "deit"
    if "pre_layrnorm.weight" in keys or "visual_projection.weight" in keys:
        return "clip_vision_model"
    if "head.probe" in keys or (
            "embeddings.cls_token" not in keys and "embeddings.position_embeddings" in keys):
        return "siglip_vision_model"
    return "vit"


_EVIDENCE = {
    "vit": "a class token, none of the later families' keys",
    "dinov2": "layer scale (encoder.layer.0.layer_scale1.lambda1)",
    "dinov2_with_registers": "register tokens (embeddings.register_tokens)",
    "deit": "a distillation token (embeddings.distillation_token)",
    "clip_vision_model": "a pre-norm (pre_layrnorm) or a projection (visual_projection)",
    "siglip_vision_model": "no class token",
    **positions.EVIDENCE,
}


def evidence(model_type):
    """What in the keys says `model_type_of_keys`' answer (for messages)."""
    return _EVIDENCE[model_type]


def vision_config(config):
    """The config values of the vision tower: config.json itself, or its
    `vision_config` for a full `clip` / `siglip` checkpoint."""
    config = config or {}
    key = VISION_CONFIG.get(config.get("model_type"))
    return (config.get(key) or {}) if key else config


def refuse_model_type(model_type):
    """Raises `CheckpointMismatchError` for a `model_type` keras_vit does not build."""
    if model_type in FAMILIES:
        return
    loaded = ", ".join(repr(t) for t in FAMILIES)
    if model_type in REFUSED:
        raise CheckpointMismatchError(
            f"A transformers {model_type!r} checkpoint has {REFUSED[model_type]}, which "
            f"keras_vit does not build; it loads the model types {loaded}.")
    raise CheckpointMismatchError(
        f"A transformers {model_type!r} checkpoint, which is not a model type keras_vit "
        f"builds; it loads {loaded}.")


def mlp(model_type, state):
    """`(mlp, mlp_dim)` of the (prepared) state (`architecture.mlp_of`):
    `"swiglu"` when `intermediate.dense` has twice the rows `output.dense`
    takes (DINOv2-g's `weights_in`), which only DINOv2 builds: another
    model type's is a `CheckpointMismatchError`."""
    rows = int(np.shape(state["encoder.layer.0.intermediate.dense.weight"])[0])
    out = state.get("encoder.layer.0.output.dense.weight")
    kind, width = mlp_of(rows, int(np.shape(out)[1]) if np.ndim(out) == 2 else None)
    if kind == "swiglu" and not model_type.startswith(("dinov2", "dinov3")):
        raise CheckpointMismatchError(
            f"A transformers {model_type!r} checkpoint whose MLP projects to {rows} rows, "
            f"twice the {width} its output takes: a SwiGLU MLP, which transformers builds "
            "for DINOv2 (use_swiglu_ffn) and DINOv3 (use_gated_mlp) only, not a model "
            "keras_vit builds.")
    return kind, width


def options(model_type, state, config):
    """The builder options of the family the (prepared) state holds:
    layer scale, registers (with `no_embed_class`: their class position
    embedding is folded into the class token), the distillation token, the
    pre-norm, a patch projection without bias."""
    out = {}
    if "encoder.layer.0.layer_scale1.lambda1" in state:
        out["layer_scale_init"] = 1e-5  # an initial value; the checkpoint's scales load
    reg = state.get("embeddings.register_tokens")
    if reg is not None and np.ndim(reg) == 3:
        out["num_register_tokens"] = int(reg.shape[1])
        if "embeddings.position_embeddings" in state:  # DINOv3 has none
            out["no_embed_class"] = True
    if "embeddings.distillation_token" in state:
        out["distillation_token"] = True
    if "pre_layrnorm.weight" in state:
        out["pre_norm"] = True
    if "embeddings.patch_embeddings.projection.bias" not in state:
        out["patch_bias"] = False
    out.update(positions.options(model_type, state))
    return out


def source_class(model_type, state):
    """What `HubCheckpoint` keeps of the source class beyond the
    architecture: builder defaults (the headless output pooling,
    `classifier_activation=None` for a projection) and the
    position-embedding resize where the model type's differs from the
    ViT's."""
    family = FAMILIES[model_type]
    heads = ("classifier.weight", "cls_classifier.weight", "visual_projection.weight")
    out = {"builder_defaults": {}}
    extra = positions.source_class(model_type, state)  # BEiT's, DINOv3's
    pooler = "map" if "head.probe" in state else extra.get("pooling", family.pooler)
    if "table_resize" in extra:
        out["table_resize"] = extra["table_resize"]
    if pooler and not any(k in state for k in heads):
        out["builder_defaults"]["pooling"] = pooler
    if "visual_projection.weight" in state:
        out["builder_defaults"]["classifier_activation"] = None
    if model_type == "dinov2_with_registers":
        out["resize"] = "transformers-antialias"
        out["resize_how"] = ("bicubic with antialias, align_corners=False "
                             "(Dinov2WithRegisters interpolate_pos_encoding)")
    return out
