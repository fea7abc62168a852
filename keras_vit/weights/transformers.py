"""Hugging Face transformers ViT checkpoint keys <-> official keys.

`ViTForImageClassification` (keys under `vit.`, head `classifier`) and
`ViTModel` (keys at the top level, or under `vit.`; the pooler
`pooler.dense` is a Dense + tanh on the class token, the official
`pre_logits`), as `save_pretrained` writes them (the names of
`convert_vit_timm_to_pytorch.py`):

| transformers                                          | official                         |
| ----------------------------------------------------- | -------------------------------- |
| `embeddings.patch_embeddings.projection (D, C, p, p)` | `embedding/kernel (p, p, C, D)`  |
| `embeddings.cls_token`, `embeddings.position_embeddings` | `cls`, `Transformer/posembed_input/pos_embedding` |
| `encoder.layer.i.attention.attention.{query,key,value}` | `.../MultiHeadDotProductAttention_1/{query,key,value}` |
| `encoder.layer.i.attention.output.dense`              | `.../MultiHeadDotProductAttention_1/out` |
| `encoder.layer.i.layernorm_before`, `layernorm_after` | `LayerNorm_0`, `LayerNorm_2`     |
| `encoder.layer.i.intermediate.dense`, `output.dense`  | `MlpBlock_3/Dense_0`, `Dense_1` (DINOv2-g's `mlp.weights_in`, `weights_out`: `mlp="swiglu"`) |
| `layernorm`, `pooler.dense`, `classifier`             | `Transformer/encoder_norm`, `pre_logits`, `head` |

The in-memory names of transformers 5 (`layers.i.attention.q_proj`,
`o_proj`, `mlp.fc1`, ...) are read too.

The way back (official arrays -> a transformers folder) is
`transformers_export`'s.

transformers' arithmetic, which the loaded model reproduces: GELU as
`hidden_act` says ("gelu": exact erf); LayerNorm epsilon `layer_norm_eps`
(1e-12 in Google's checkpoints); position embeddings resized as
`interpolate_pos_encoding` does (bicubic, `align_corners=False`); pixels
normalised with `image_mean` / `image_std` of `preprocessor_config.json`.
"""

import re

import numpy as np

from keras_vit.errors import (
    CheckpointMismatchError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)
from keras_vit.weights import config_values as cv
from keras_vit.weights import transformers_families as families
from keras_vit.weights import transformers_positions as positions
from keras_vit.weights.npz import POSEMB_KEY

FORMAT = "transformers"

# Every config.json / preprocessor_config.json value this module reads, and
# what it may hold (`config_values.check_values`).
CONFIG_VALUES = {
    "model_type": cv.STRING, "architectures": cv.OPTIONAL_STRINGS,
    "hidden_size": cv.OPTIONAL_POSITIVE_INT, "num_hidden_layers": cv.OPTIONAL_POSITIVE_INT,
    "num_attention_heads": cv.OPTIONAL_POSITIVE_INT,
    "intermediate_size": cv.OPTIONAL_POSITIVE_INT, "patch_size": cv.OPTIONAL_SIZE,
    "num_channels": cv.POSITIVE_INT, "qkv_bias": cv.OPTIONAL_BOOLEAN,
    "hidden_act": cv.STRING, "pooler_act": cv.STRING,
    "layer_norm_eps": cv.POSITIVE_NUMBER, "id2label": cv.OPTIONAL_LABELS,
    # the later families (#48; `transformers_families`)
    "image_size": cv.OPTIONAL_SIZE, "mlp_ratio": cv.OPTIONAL_POSITIVE_NUMBER,
    "num_register_tokens": cv.OPTIONAL_COUNT, "use_swiglu_ffn": cv.OPTIONAL_BOOLEAN,
    "projection_dim": cv.OPTIONAL_POSITIVE_INT, "vision_use_head": cv.OPTIONAL_BOOLEAN,
    "pooler_output_size": cv.OPTIONAL_POSITIVE_INT,
    # BEiT and DINOv3 (`transformers_positions`)
    **{k: cv.OPTIONAL_BOOLEAN for k in (
        "use_relative_position_bias", "use_shared_relative_position_bias",
        "use_absolute_position_embeddings", "use_mean_pooling", "use_mask_token",
        "query_bias", "key_bias", "value_bias", "proj_bias", "mlp_bias", "use_gated_mlp")},
    "rope_theta": cv.OPTIONAL_POSITIVE_NUMBER,
}
# a full `clip` / `siglip` checkpoint's vision tower values (a parent before its children)
_VISION_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "patch_size", "num_channels", "hidden_act",
                "layer_norm_eps", "image_size", "vision_use_head")
CONFIG_VALUES.update({"vision_config": cv.OPTIONAL_OBJECT,
                      **{f"vision_config.{k}": CONFIG_VALUES[k] for k in _VISION_KEYS}})
PREPROCESSOR_VALUES = {
    "image_mean": cv.MEANS, "image_std": cv.STDS,
    "do_normalize": cv.BOOLEAN, "do_rescale": cv.BOOLEAN,
    "rescale_factor": cv.POSITIVE_NUMBER,
    "size": (lambda v: not isinstance(v, dict) or "height" not in v or all(
        isinstance(v.get(k), int) and not isinstance(v.get(k), bool) and v[k] > 0
        for k in ("height", "width")),
        "an object with a positive whole height and width"),
    "resample": cv.OPTIONAL_COUNT,
}

_LAYER = r"encoder\.layer\.(\d+)\."
# transformers 5 in-memory names -> the saved (legacy) names.
_V5 = [
    (r"(^|\.)layers\.(\d+)\.attention\.q_proj\.", r"\1encoder.layer.\2.attention.attention.query."),
    (r"(^|\.)layers\.(\d+)\.attention\.k_proj\.", r"\1encoder.layer.\2.attention.attention.key."),
    (r"(^|\.)layers\.(\d+)\.attention\.v_proj\.", r"\1encoder.layer.\2.attention.attention.value."),
    (r"(^|\.)layers\.(\d+)\.attention\.o_proj\.", r"\1encoder.layer.\2.attention.output.dense."),
    (r"(^|\.)layers\.(\d+)\.mlp\.fc1\.", r"\1encoder.layer.\2.intermediate.dense."),
    (r"(^|\.)layers\.(\d+)\.mlp\.fc2\.", r"\1encoder.layer.\2.output.dense."),
    (r"(^|\.)layers\.(\d+)\.", r"\1encoder.layer.\2."),
]
GELU_FORMS = {"gelu": "erf", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh",
              "gelu_fast": "tanh", "quick_gelu": "quick"}


def is_transformers_state(keys):
    """True when the key names are those of a transformers ViT (or of one
    of the later families: CLIP's and SigLIP's `patch_embedding`)."""
    return any(k.endswith(("embeddings.patch_embeddings.projection.weight",
                           "embeddings.patch_embedding.weight")) for k in keys) or \
        "embeddings.patch_embeddings.weight" in keys  # DINOv3's


def canonical(state):
    """Strips the base model's prefix (`vit.`, `dinov2.`, `deit.`,
    `vision_model.`, ...) and renames transformers-5 names and the later
    families' to the ViT's saved names (`transformers_families.prepare`;
    the keys it leaves out are not in the result); returns `(state, prefix)`."""
    prepared = families.prepare(state, _V5)
    return prepared.state, prepared.prefix


def model_type(config, state):
    """config.json's `model_type`, else the one the keys say."""
    said = (config or {}).get("model_type")
    return said if said else families.model_type_of_keys(canonical(state)[0])


def _t(a):
    return np.ascontiguousarray(np.asarray(a).T)


def to_official(state, num_heads):
    """`(params, names, unmapped)` as `keras_vit.weights.timm.to_official`;
    names are the keys as saved (with the `vit.` prefix of
    `ViTForImageClassification`, ...)."""
    prepared = families.prepare(state, _V5)
    params, names, unmapped = {}, {}, []

    def put(key, value, source):
        params[key] = np.asarray(value, dtype=np.float32)
        names[key] = prepared.raw.get(source, source)

    for key, value in prepared.state.items():
        value = np.asarray(value)
        if not (_map_one(key, value, num_heads, put)
                or families.map_key(key, value, num_heads, put)):
            unmapped.append(prepared.raw.get(key, key))
    return params, names, sorted(unmapped)


def _leaf(kind, norm=False):
    if norm:
        return "scale" if kind == "weight" else "bias"
    return "kernel" if kind == "weight" else "bias"


def _map_one(key, value, heads, put):
    if key == "embeddings.patch_embeddings.projection.weight":
        put("embedding/kernel", np.ascontiguousarray(value.transpose(2, 3, 1, 0)), key)
    elif key == "embeddings.patch_embeddings.projection.bias":
        put("embedding/bias", value, key)
    elif key == "embeddings.cls_token":
        put("cls", value, key)
    elif key == "embeddings.position_embeddings":
        put(POSEMB_KEY, value, key)
    elif m := re.fullmatch(r"layernorm\.(weight|bias)", key):
        put(f"Transformer/encoder_norm/{_leaf(m[1], True)}", value, key)
    elif m := re.fullmatch(r"pooler\.dense\.(weight|bias)", key):
        put(f"pre_logits/{_leaf(m[1])}", _t(value) if m[1] == "weight" else value, key)
    elif m := re.fullmatch(r"classifier\.(weight|bias)", key):
        put(f"head/{_leaf(m[1])}", _t(value) if m[1] == "weight" else value, key)
    elif m := re.fullmatch(_LAYER + r"attention\.attention\.(query|key|value)\.(weight|bias)", key):
        i, name, kind = m.groups()
        prefix = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/{name}"
        if kind == "weight":
            put(f"{prefix}/kernel", _t(value).reshape(value.shape[1], heads, -1), key)
        else:
            put(f"{prefix}/bias", value.reshape(heads, -1), key)
    elif m := re.fullmatch(_LAYER + r"attention\.output\.dense\.(weight|bias)", key):
        i, kind = m.groups()
        prefix = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/out"
        if kind == "weight":
            put(f"{prefix}/kernel", _t(value).reshape(heads, -1, value.shape[0]), key)
        else:
            put(f"{prefix}/bias", value, key)
    elif m := re.fullmatch(_LAYER + r"(layernorm_before|layernorm_after)\.(weight|bias)", key):
        i, part, kind = m.groups()
        norm = "LayerNorm_0" if part == "layernorm_before" else "LayerNorm_2"
        put(f"Transformer/encoderblock_{i}/{norm}/{_leaf(kind, True)}", value, key)
    elif m := re.fullmatch(_LAYER + r"(intermediate|output)\.dense\.(weight|bias)", key):
        i, part, kind = m.groups()
        dense = "Dense_0" if part == "intermediate" else "Dense_1"
        put(f"Transformer/encoderblock_{i}/MlpBlock_3/{dense}/{_leaf(kind)}",
            _t(value) if kind == "weight" else value, key)
    else:
        return False
    return True


def source_name(key, prefix=""):
    """The transformers key an official key comes from (for messages)."""
    def wb(leaf):
        return "bias" if leaf == "bias" else "weight"

    rules = [
        (r"embedding/(kernel|bias)",
         lambda m: f"{prefix}embeddings.patch_embeddings.projection.{wb(m[1])}"),
        (r"cls", lambda m: f"{prefix}embeddings.cls_token"),
        (re.escape(POSEMB_KEY), lambda m: f"{prefix}embeddings.position_embeddings"),
        (r"Transformer/encoder_norm/(scale|bias)", lambda m: f"{prefix}layernorm.{wb(m[1])}"),
        (r"pre_logits/(kernel|bias)", lambda m: f"{prefix}pooler.dense.{wb(m[1])}"),
        (r"head/(kernel|bias)", lambda m: f"classifier.{wb(m[1])}"),
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(query|key|value)/"
         r"(kernel|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.attention.attention.{m[2]}.{wb(m[3])}"),
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/out/(kernel|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.attention.output.dense.{wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/LayerNorm_0/(scale|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.layernorm_before.{wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/LayerNorm_2/(scale|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.layernorm_after.{wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_0/(kernel|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.intermediate.dense.{wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_1/(kernel|bias)",
         lambda m: f"{prefix}encoder.layer.{m[1]}.output.dense.{wb(m[2])}"),
    ]
    for pattern, make in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return make(m)
    return key


def architecture(state, config):
    """`("vit", VisionTransformer kwargs)` from a transformers `config.json`
    (shapes when there is none): the ViT, and the later families of
    `transformers_families` (their options read off the keys).

    Raises `CheckpointMismatchError` for configurations keras_vit does not
    build (another `model_type`, no query/key/value bias, a pooler
    activation other than tanh, ...).
    """
    config = config or {}
    state, _ = canonical(state)
    kind = model_type(config, state)
    families.refuse_model_type(kind)
    vision = families.vision_config(config)
    positions.refuse(kind, state, vision)
    proj = state.get("embeddings.patch_embeddings.projection.weight")
    mlp = state.get("encoder.layer.0.intermediate.dense.weight")
    if proj is None or mlp is None:
        missing = ("embeddings.patch_embeddings.projection.weight" if proj is None
                   else "encoder.layer.0.intermediate.dense.weight")
        raise CheckpointMismatchError(
            f"No {missing!r} (under its {kind} name): not a transformers ViT checkpoint.")
    width = int(proj.shape[0])
    layers = {int(m[1]) for k in state if (m := re.match(_LAYER, k))}
    heads = vision.get("num_attention_heads") or {192: 3, 384: 6, 768: 12, 1024: 16,
                                                  1280: 16}.get(width)
    if vision.get("qkv_bias") is False:
        raise CheckpointMismatchError(
            "This transformers ViT has no query/key/value biases (qkv_bias="
            "false); the keras_vit TransformerBlock always has them.")
    if vision.get("pooler_act", "tanh") != "tanh" and "pooler.dense.weight" in state:
        raise CheckpointMismatchError(
            f"pooler_act={vision['pooler_act']!r}; keras_vit's pre_logits layer "
            "(the ViTModel pooler) is Dense + tanh.")
    if vision.get("num_channels", 3) != 3:
        raise CheckpointMismatchError(
            f"num_channels={vision['num_channels']}; keras_vit loads RGB models.")
    classifier = positions.classifier(kind, state) or (
        "map" if "head.probe" in state else "gap" if kind.startswith("siglip") else "token")
    head = state.get("classifier.weight")
    if classifier == "token" and head is not None and head.ndim == 2 \
            and head.shape[1] == 2 * width:
        # Dinov2ForImageClassification: the class token beside the patch tokens' mean
        classifier = "token_avg"
    mlp, mlp_dim = families.mlp(kind, state)
    kwargs = dict(
        patch_size=tuple(int(s) for s in proj.shape[2:]), hidden_size=width,
        num_layers=len(layers), num_heads=int(heads) if heads else None,
        mlp_dim=mlp_dim, classifier=classifier,
    )
    if mlp != "gelu":
        kwargs["mlp"] = mlp
    kwargs.update(families.options(kind, state, vision))
    return "vit", kwargs


def check_config(config, state, arch, where):
    """Raises `CorruptCheckpointError` when a value of config.json (`where`)
    contradicts the weights: the model type, width, depth, MLP width and
    kind (`use_swiglu_ffn`), patch, image size, register count, projection
    width, a head count that does not divide the width, the number of labels;
    `UnsupportedCheckpointError` when `architectures` names a class of the
    model type keras_vit does not build."""
    kind = model_type(config, state)
    classes = families.FAMILIES[kind].classes
    other = [n for n in config.get("architectures") or ()
             if not (n.startswith("ViT") if kind == "vit" else n in classes)]
    if other:
        names = ", ".join(classes[:-1]) + f" and {classes[-1]}" if len(classes) > 1 \
            else classes[0]
        raise UnsupportedCheckpointError(
            f"{where!r} says architectures {other[0]!r}, which is not one keras_vit "
            f"builds; it loads transformers' {names} (model_type {kind!r}).")
    state = canonical(state)[0]
    _check_model_type(config, kind, state, where)
    vision = families.vision_config(config)
    at = "vision_config." if vision is not config else ""
    width, depth, mlp = arch["hidden_size"], arch["num_layers"], arch["mlp_dim"]
    patch, heads = tuple(arch["patch_size"]), vision.get("num_attention_heads")
    proj = "embeddings.patch_embeddings.projection.weight"

    def check(key, value, agrees, held):
        cv.check_agrees(where, at + key, value, agrees, held)

    check("hidden_size", vision.get("hidden_size"), lambda v: v == width,
          f"width {width} ({proj} has {width} output channels)")
    check("num_hidden_layers", vision.get("num_hidden_layers"), lambda v: v == depth,
          f"{depth} layers (encoder.layer.0 to encoder.layer.{depth - 1})")
    positions.check_config(kind, vision, state, arch, check)
    if arch.get("mlp") == "swiglu" and kind == "dinov3_vit":  # use_gated_mlp: checked
        check("intermediate_size", vision.get("intermediate_size"), lambda v: v == mlp,
              f"a gated MLP of width {mlp} (layer.0.mlp.up_proj.weight has {mlp} rows)")
    elif arch.get("mlp") == "swiglu":
        _check_swiglu(vision, width, mlp, check)
    else:
        check("use_swiglu_ffn", vision.get("use_swiglu_ffn"), lambda v: not v,
              f"a GELU MLP (encoder.layer.0.mlp.fc1.weight has the {mlp} rows "
              "mlp.fc2.weight takes)")
        check("intermediate_size", vision.get("intermediate_size"), lambda v: v == mlp,
              f"an MLP of width {mlp} (encoder.layer.0.intermediate.dense.weight has {mlp} "
              "rows)")
        check("mlp_ratio", vision.get("mlp_ratio"), lambda v: int(width * v) == mlp,
              f"an MLP of width {mlp} (encoder.layer.0.intermediate.dense.weight has {mlp} "
              f"rows), not width {width} x mlp_ratio")
    check("patch_size", vision.get("patch_size"),
          lambda v: cv.pair(v) == patch,
          f"{patch[0]}x{patch[1]} patches ({proj} has a {patch[0]}x{patch[1]} kernel)")
    check("num_attention_heads", heads, lambda v: width % v == 0,
          f"width {width} ({proj} has {width} output channels), which {heads} heads "
          "do not divide")
    _check_tokens(vision, state, arch, check)
    _check_heads(config, state, where)


def swiglu_width(width, mlp_ratio):
    """The hidden width of DINOv2's SwiGLU MLP (`Dinov2SwiGLUFFN`,
    facebookresearch/dinov2's `SwiGLUFFNFused`): two thirds of
    `int(width * mlp_ratio)`, rounded up to a multiple of 8.

    >>> swiglu_width(1536, 4), swiglu_width(32, 4)
    (4096, 88)
    """
    return (int(int(width * mlp_ratio) * 2 / 3) + 7) // 8 * 8


def _check_swiglu(vision, width, mlp, check):
    """config.json's `use_swiglu_ffn` and `mlp_ratio` against a SwiGLU MLP
    of hidden width `mlp` (`weights_in` of `2 * mlp` rows)."""
    held = (f"a SwiGLU MLP of width {mlp} (encoder.layer.0.mlp.weights_in.weight has "
            f"{2 * mlp} rows, mlp.weights_out.weight takes {mlp})")
    check("use_swiglu_ffn", vision.get("use_swiglu_ffn", False), lambda v: v is True, held)
    check("mlp_ratio", vision.get("mlp_ratio"),
          lambda v: swiglu_width(width, v) == mlp,
          f"{held}, not (int(int(width {width} x mlp_ratio) x 2 / 3) + 7) // 8 x 8")


def _check_model_type(config, kind, state, where):
    """The register count, then the model type, against the weights."""
    reg = state.get("embeddings.register_tokens")
    registers = int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0
    cv.check_agrees(where, "num_register_tokens", config.get("num_register_tokens"),
                    lambda v: v == registers,
                    f"{registers} register tokens (embeddings.register_tokens has "
                    f"{registers} rows)" if reg is not None else
                    "0 register tokens (no embeddings.register_tokens)")
    held = families.model_type_of_keys(state)
    said = {"clip": "clip_vision_model", "siglip": "siglip_vision_model"}.get(kind, kind)
    if held != said:
        raise CorruptCheckpointError(
            f"{where!r} says model_type {kind!r}, but the weights hold the keys of a "
            f"{held!r} model ({families.evidence(held)}); the file and the weights must "
            "describe the same model.")


def _check_tokens(vision, state, arch, check):
    """`image_size` against the grid of position embeddings."""
    posemb = state.get("embeddings.position_embeddings")
    if posemb is None or posemb.ndim != 3 or vision.get("image_size") is None:
        return
    prefix = 0 if arch.get("no_embed_class") or arch["classifier"] == "gap" \
        or arch["classifier"] == "map" else \
        1 + int(bool(arch.get("distillation_token")))
    rows = int(posemb.shape[1]) - prefix
    patch = tuple(arch["patch_size"])
    check("image_size", vision.get("image_size"),
          lambda v: (cv.pair(v)[0] // patch[0]) * (cv.pair(v)[1] // patch[1]) == rows,
          f"{rows} patch position embeddings (embeddings.position_embeddings, "
          f"patch {patch[0]}x{patch[1]})")


def _check_heads(config, state, where):
    """The labels against the classifier, `projection_dim` against the projection."""
    head = next((state[k] for k in ("classifier.weight", "cls_classifier.weight")
                 if k in state), None)
    labels = config.get("id2label")
    if head is not None and labels and len(labels) != head.shape[0]:
        raise CorruptCheckpointError(
            f"{where!r} has {len(labels)} id2label entries, but the weights hold a "
            f"{head.shape[0]}-class head (classifier.weight has {head.shape[0]} rows); "
            "the file and the weights must describe the same model.")
    projection = state.get("visual_projection.weight")
    if projection is not None:
        rows = int(projection.shape[0])
        cv.check_agrees(where, "projection_dim", config.get("projection_dim"),
                        lambda v: v == rows,
                        f"a {rows}-wide projection (visual_projection.weight has {rows} rows)")


def arithmetic(config, state=None):
    """The GELU form and LayerNorm epsilon of config.json (its
    `vision_config` for a full CLIP / SigLIP), else the model type's
    defaults (the model type the keys say for a bare file)."""
    config = config or {}
    kind = model_type(config, state or {})
    family = families.FAMILIES.get(kind, families.FAMILIES["vit"])
    vision = families.vision_config(config)
    act = vision.get("hidden_act", family.hidden_act)
    if positions.gated(kind, vision):  # SiLU (`architecture` refused another); no GELU
        act = "gelu"
    if act not in GELU_FORMS:
        raise CheckpointMismatchError(
            f"hidden_act={act!r}; keras_vit builds GELU blocks "
            f"({sorted(GELU_FORMS)}).")
    out = dict(gelu=GELU_FORMS[act],
               layer_norm_epsilon=float(vision.get("layer_norm_eps", family.layer_norm_eps)),
               fc_norm=False)
    out.update(positions.arithmetic(kind, vision, canonical(state or {})[0]))  # BEiT, DINOv3
    return out


def preprocessing(preprocessor, kind="vit"):
    """`{"mean", "std", ...}` on the [0, 1] scale from
    `preprocessor_config.json` (ViTImageProcessor and the later families'
    processors: rescale by `rescale_factor`, then normalise). Without one,
    the defaults of the model type's image processor (ViT's, DeiT's,
    SigLIP's: 0.5, 0.5; DINOv2's and CLIP's: OpenAI CLIP's)."""
    p = preprocessor or {}
    family = families.FAMILIES.get(kind, families.FAMILIES["vit"])
    mean = p.get("image_mean", family.mean)
    std = p.get("image_std", family.std)
    if p.get("do_normalize", True) is False:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    factor = float(p.get("rescale_factor", 1 / 255)) if p.get("do_rescale", True) else 1.0
    scale = 1.0 / (255.0 * factor)  # mean/std in units of a [0, 255] / 255 pixel
    mean = tuple(float(m) * scale for m in np.broadcast_to(mean, (3,)))
    std = tuple(float(s) * scale for s in np.broadcast_to(std, (3,)))
    out = {"mean": mean, "std": std}
    size = p.get("size")
    if isinstance(size, dict) and "height" in size:
        out["input_size"] = (3, size["height"], size["width"])
    if "resample" in p:
        out["resample"] = p["resample"]
    return out


def class_names(config):
    labels = (config or {}).get("id2label")
    if not labels:
        return None
    names = [labels.get(str(i), labels.get(i)) for i in range(len(labels))]
    if any(n is None for n in names) or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return names



def read_config(state, config, preprocessor):
    """`(family, architecture, arithmetic, preprocessing, class names)` of
    a transformers checkpoint (`config` and `preprocessor` None for a bare
    file, whose preprocessing is then None)."""
    family, arch = architecture(state, config)
    return (family, arch, arithmetic(config, state),
            preprocessing(preprocessor, model_type(config, state))
            if config is not None else None,
            class_names(config))


def source_class(state, config, source):
    """What the source class computes beyond the architecture
    (`transformers_families.source_class`: builder defaults, a head
    refusal, the resize); logs the one line of a left-out text tower."""
    prepared = families.prepare(state, _V5)
    families.log_left_out(prepared, source)
    return families.source_class(model_type(config, state), prepared.state)


def check_files(config, config_file, preprocessor, preprocessor_file, state):
    """`preprocessor_config.json`, when there is one: a JSON object of
    values of the right types."""
    if preprocessor is not None:
        cv.check_object(preprocessor, preprocessor_file)
        cv.check_values(preprocessor, PREPROCESSOR_VALUES, preprocessor_file)


_TOP_LEVEL = ("classifier.", "cls_classifier.", "distillation_classifier.",
              "visual_projection.")


def state_source_name(key, state):
    """The name `state` (its prefix and family) has for an official key."""
    prepared = canonical(state)[0]
    name = source_name(key)
    if name == key:
        name = families.official_name(key)
        if name is None:
            return key
    swiglu = any(".mlp.weights_in." in k or ".mlp.gate_proj." in k for k in state)
    name = families.styled(name, families.model_type_of_keys(prepared), swiglu)
    prefix = families.prefix_of(state)
    return name if name.startswith(_TOP_LEVEL) else prefix + name
