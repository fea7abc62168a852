"""Official arrays -> a timm state dict and `config.json`: the way back
out of `keras_vit.weights.timm` (whose `to_official` this inverts), for
`keras_vit.export.hub_folder`'s timm folders; `source_name`, the timm name
of an official key, also names a timm checkpoint's keys in messages.

The folder written opens with `timm.create_model("local-dir:DIR",
pretrained=True)`; a model timm does not compute the same way is refused
with what differs (`hub_config`). A ViT's architecture name comes from
`timm_architectures.ARCHITECTURES` (`vit_architecture`): `model_args`
set the shape and every option timm's `VisionTransformer` takes, the name
brings what they cannot (the LayerNorm epsilon: 1e-5 in the CLIP names).
"""

import re

import numpy as np

from keras_vit.weights import timm_beit
from keras_vit.weights.architecture import ROPE_PREFIX
from keras_vit.weights.npz import AVG_POOL_KEY, DIST_KEY, POSEMB_KEY, REG_KEY
from keras_vit.weights.timm import GELU_FORMS, kind_of_name
from keras_vit.weights.timm_architectures import ARCHITECTURES, TIMM_VERSION


def source_name(key):
    """The timm key an official key comes from (for messages)."""
    rules = [
        (r"embedding/(kernel|bias)", lambda m: f"patch_embed.proj.{_wb(m[1])}"),
        (r"stem/(kernel|bias)", lambda m: f"stem.proj.{_wb(m[1])}"),
        (r"cls", lambda m: "cls_token"),
        (re.escape(POSEMB_KEY), lambda m: "pos_embed"),
        (r"(?:Transformer/encoder_norm|pre_head_layer_norm)/(scale|bias)",
         lambda m: f"norm.{_wb(m[1])}"),
        (r"fc_norm/(scale|bias)", lambda m: f"fc_norm.{_wb(m[1])}"),
        (re.escape(DIST_KEY), lambda m: "dist_token"),
        (re.escape(REG_KEY), lambda m: "reg_token"),
        (r"pre_norm/(scale|bias)", lambda m: f"norm_pre.{_wb(m[1])}"),
        (r"Transformer/encoderblock_(\d+)/LayerScale_(\d)/scale",
         lambda m: f"blocks.{m[1]}.ls{int(m[2]) + 1}.gamma"),
        (r"MAPHead_0/probe", lambda m: "attn_pool.latent"),
        (r"MAPHead_0/MultiHeadDotProductAttention_0/query/(kernel|bias)",
         lambda m: f"attn_pool.q.{_wb(m[1])}"),
        (r"MAPHead_0/MultiHeadDotProductAttention_0/(?:key|value)/(kernel|bias)",
         lambda m: f"attn_pool.kv.{_wb(m[1])}"),
        (r"MAPHead_0/MultiHeadDotProductAttention_0/out/(kernel|bias)",
         lambda m: f"attn_pool.proj.{_wb(m[1])}"),
        (r"MAPHead_0/LayerNorm_0/(scale|bias)", lambda m: f"attn_pool.norm.{_wb(m[1])}"),
        (r"MAPHead_0/MlpBlock_0/Dense_(\d)/(kernel|bias)",
         lambda m: f"attn_pool.mlp.fc{int(m[1]) + 1}.{_wb(m[2])}"),
        (r"head/(kernel|bias)", lambda m: f"head.{_wb(m[1])}"),
        (r"head_dist/(kernel|bias)", lambda m: f"head_dist.{_wb(m[1])}"),
        (r"pre_logits/(kernel|bias)", lambda m: f"pre_logits.fc.{_wb(m[1])}"),
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/"
         r"(?:query|key|value)/(kernel|bias)", lambda m: f"blocks.{m[1]}.attn.qkv.{_wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/out/(kernel|bias)",
         lambda m: f"blocks.{m[1]}.attn.proj.{_wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/"
         r"relative_position_bias_table",  # BEiT's (timm_beit)
         lambda m: f"blocks.{m[1]}.attn.relative_position_bias_table"),
        (r"Transformer/encoderblock_(\d+)/LayerNorm_0/(scale|bias)",
         lambda m: f"blocks.{m[1]}.norm1.{_wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/LayerNorm_2/(scale|bias)",
         lambda m: f"blocks.{m[1]}.norm2.{_wb(m[2])}"),
        (r"Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_(\d)/(kernel|bias)",
         lambda m: f"blocks.{m[1]}.mlp.fc{int(m[2]) + 1}.{_wb(m[3])}"),
        (r"MixerBlock_(\d+)/LayerNorm_(\d)/(scale|bias)",
         lambda m: f"blocks.{m[1]}.norm{int(m[2]) + 1}.{_wb(m[3])}"),
        (r"MixerBlock_(\d+)/(token|channel)_mixing/Dense_(\d)/(kernel|bias)",
         lambda m: f"blocks.{m[1]}.mlp_{m[2]}s.fc{int(m[3]) + 1}.{_wb(m[4])}"),
        (r"conv_root/kernel", lambda m: "patch_embed.backbone.stem.conv.weight"),
        (r"gn_root/(scale|bias)", lambda m: f"patch_embed.backbone.stem.norm.{_wb(m[1])}"),
        (r"block(\d+)/unit(\d+)/(\w+)/(kernel|scale|bias)", _unit_name),
    ]
    for pattern, make in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return make(m)
    return key


def _wb(leaf):
    return "bias" if leaf == "bias" else "weight"


def _unit_name(m):
    stage, unit, part, leaf = m.groups()
    part = {"conv_proj": "downsample.conv", "gn_proj": "downsample.norm"}.get(
        part, part.replace("gn", "norm"))
    return (f"patch_embed.backbone.stages.{int(stage) - 1}.blocks.{int(unit) - 1}."
            f"{part}.{_wb(leaf)}")


def torch_array(key, value):
    """An official array in PyTorch's layout: the inverse of the reshapes
    and transposes `to_official` applies (the query, key and value kernels
    each as one `(D, D)` Linear weight)."""
    value = np.asarray(value, dtype=np.float32)
    if value.ndim == 4:  # a convolution (kh, kw, I, O) -> (O, I, kh, kw)
        value = value.transpose(3, 2, 0, 1)
    elif re.search(r"/(query|key|value)/kernel$", key):  # (D, H, D/H) -> (D*, D)
        value = value.reshape(value.shape[0], -1).T
    elif re.search(r"/(query|key|value)/bias$", key):  # (H, D/H) -> (D*,)
        value = value.reshape(-1)
    elif re.search(r"MultiHeadDotProductAttention_\d/out/kernel$", key):  # (H, D/H, D) -> (D, D*)
        value = value.reshape(-1, value.shape[-1]).T
    elif key.endswith("/kernel"):  # a Dense (I, O) -> a Linear (O, I)
        value = value.T
    return np.ascontiguousarray(value)


def from_official(params):
    """`{timm key: float32 array}` of official arrays (a ViT, hybrid or
    Mixer): the inverse of `to_official`, named by `source_name`. The
    query, key and value of each block are fused into timm's `qkv`, those
    of the attention-pooling head (SigLIP's `MAPHead_0`) into its
    `attn_pool.q` (the query) and `attn_pool.kv` (keys, then values);
    LayerScale gammas, register / distillation tokens and the pre-norm
    keep their shapes.

    Raises:
        ValueError: an official key timm has no name for (`pre_logits`).

    Example:

    >>> import numpy as np
    >>> sorted(from_official({"cls": np.zeros((1, 1, 8), "float32")}))
    ['cls_token']
    """
    state, fused = {}, {}
    for key, value in params.items():
        name = source_name(key)
        if name == key or name.startswith("pre_logits."):
            raise ValueError(f"timm's models have no counterpart of {key!r}.")
        if ".attn.qkv." in name or name.startswith("attn_pool.kv."):
            fused.setdefault(name, {})[key.split("/")[-2]] = torch_array(key, value)
        else:
            state[name] = torch_array(key, value)
    for name, parts in fused.items():  # rows in timm's order: (query,) key, value
        state[name] = np.concatenate([parts[p] for p in ("query", "key", "value")
                                      if p in parts])
    if not any(".backbone.stages." in name for name in state):
        # a stem without stages (R+Ti/16) is timm's backbone itself
        state = {name.replace("patch_embed.backbone.stem.", "patch_embed.backbone."): value
                 for name, value in state.items()}
    return dict(sorted(state.items()))


# timm's Mixer architectures: (patch, blocks, width) -> name; their code
# fixes these three (`mixer_b16_224(**kwargs)` cannot take another width).
MIXER_ARCHITECTURES = {(32, 8, 512): "mixer_s32_224", (16, 8, 512): "mixer_s16_224",
                       (32, 12, 768): "mixer_b32_224", (16, 12, 768): "mixer_b16_224",
                       (32, 24, 1024): "mixer_l32_224", (16, 24, 1024): "mixer_l16_224"}


# timm's hybrids: ResNet stages -> name; their code builds the stem (width
# 64, timm's StdConv2dSame and GroupNorm), config.json sets the ViT on it.
HYBRID_ARCHITECTURES = {(): "vit_tiny_r_s16_p8_224", (2, 2, 2, 2): "vit_small_r26_s32_224",
                        (3, 4, 9): "vit_base_r50_s16_224",
                        (3, 4, 6, 3): "vit_large_r50_s32_224"}


def _hybrid_architecture(arch, arithmetic):
    layers = tuple(arch["resnet_layers"])
    if layers not in HYBRID_ARCHITECTURES or arch["resnet_width"] != 1:
        raise ValueError(
            f"timm builds a hybrid's ResNet stem in the code of each architecture "
            f"(stages {', '.join(map(str, HYBRID_ARCHITECTURES))}, width 1); this one has "
            f"stages {layers} and width {arch['resnet_width']}")
    if arithmetic.get("resnet_arithmetic") != "timm":
        raise ValueError(
            "its ResNet stem computes the official arithmetic (kernels standardised as "
            "(w - mean) / (std + 1e-5), GroupNorm epsilon 1e-6) and timm's computes "
            "(w - mean) / sqrt(var + 1e-8) with GroupNorm epsilon 1e-5, fixed in its code")
    return HYBRID_ARCHITECTURES[layers]


def _ratio(hidden, width, what):
    """`width / hidden` as timm's `int(hidden * ratio)` gives it back."""
    ratio = width / hidden
    if int(hidden * ratio) != width:
        raise ValueError(f"timm builds the {what} width as int(width x ratio), which "
                         f"cannot give {width} for width {hidden}")
    return ratio


def hub_config(family, arch, arithmetic, image_size, classes, mean, std, class_names=None):
    """The `config.json` that `timm.create_model("local-dir:DIR",
    pretrained=True)` (or `hf-hub:ORG/NAME`) builds the model from:
    `architecture`, `model_args` (the shape and arithmetic), and
    `pretrained_cfg` (input size, mean/std on the [0, 1] scale, bilinear
    resize without a crop, as keras_vit's eval pipeline) with `label_names`.

    A ViT's architecture name is chosen by `vit_architecture`, its
    `model_args` state every option of the later families (#48):
    `init_values` (LayerScale), `reg_tokens`, `no_embed_class`,
    `class_token`, `global_pool` ("token", "avg" or "map"), `pre_norm`,
    `act_layer` ("gelu", "gelu_tanh" or "quick_gelu"; "silu" with a
    SwiGLU MLP, whose `SwiGLUPacked` only an architecture's code can set:
    `vit_giant_patch14_dinov2`'s, `mlp_ratio` then `2 * mlp_dim / width`).

    Args:
        family, arch: `architecture.architecture_from_checkpoint` of the
            model's official arrays.
        arithmetic: `{"gelu", "layer_norm_epsilon", "fc_norm"}` of the model
            (and `"layer_scale_init"`, its blocks' initial LayerScale, or None).
        image_size: `(height, width)`; classes: the head's width.
        mean, std: per-channel, on the [0, 1] scale.

    Raises:
        ValueError: a model timm does not compute the same way (the message
            says what differs).
    """
    size = [int(s) for s in image_size]
    args = dict(img_size=size, num_classes=int(classes), in_chans=3)
    if family == "mixer":
        _check_fixed_epsilon(arithmetic, "Mixer")
        if arithmetic["gelu"] != "erf":
            raise ValueError(
                "it computes GELU with the tanh approximation (the official Mixer's) and "
                "timm's MlpMixer computes the exact (erf) GELU, a class in its code that "
                "config.json cannot change")
        width = arch["hidden_size"]
        shape = (_patch(arch["patch_size"]), arch["num_blocks"], width)
        name = MIXER_ARCHITECTURES.get(shape)
        if name is None:
            raise ValueError(
                "timm builds each Mixer shape from an architecture of fixed patch size, "
                "depth and width (" + ", ".join(MIXER_ARCHITECTURES.values()) + "); this "
                f"one (patch {shape[0]}, {shape[1]} blocks, width {width}) is none of them")
        args.update(mlp_ratio=[
            _ratio(width, arch["tokens_mlp_dim"], "token-mixing MLP"),
            _ratio(width, arch["channels_mlp_dim"], "channel-mixing MLP")], global_pool="avg")
        pool = "avg"
    elif timm_beit.is_beit_model(arch):  # timm's Beit: its own model_args
        name, beit_args = timm_beit.hub_arguments(arch, arithmetic)
        args.update(patch_size=_patch(arch["patch_size"]), **beit_args)
        pool, width = beit_args["global_pool"], arch["hidden_size"]
    else:
        if "resnet_layers" in arch:
            _check_fixed_epsilon(arithmetic, "hybrid")
            _refuse_hybrid_options(arch)
            name = _hybrid_architecture(arch, arithmetic)
        elif is_eva(arch):
            return eva_config(arch, arithmetic, size, classes, mean, std, class_names)
        else:
            name = vit_architecture(arch, arithmetic)
        pool = POOLS[arch["classifier"]]
        width = arch["hidden_size"]
        swiglu = arch.get("mlp") == "swiglu"
        if swiglu and pool == "map":
            raise ValueError(
                "it has a SwiGLU MLP and an attention-pooling head, whose MLP timm builds "
                "with the blocks' SiLU where keras_vit's computes GELU")
        args.update(patch_size=_patch(arch["patch_size"]), embed_dim=width,
                    depth=arch["num_layers"], num_heads=arch["num_heads"],
                    mlp_ratio=_ratio(width, arch["mlp_dim"] * (2 if swiglu else 1),
                                     "SwiGLU MLP's packed" if swiglu else "MLP"),
                    global_pool=pool, class_token=pool == "token",
                    fc_norm=bool(arithmetic["fc_norm"]),
                    act_layer="silu" if swiglu else
                    {v: k for k, v in GELU_FORMS.items()}[arithmetic["gelu"]])
        if "resnet_layers" not in arch:  # every option, whatever the name's code sets
            scale = arithmetic.get("layer_scale_init")
            args.update(init_values=None if scale is None else float(scale),
                        reg_tokens=int(arch.get("num_register_tokens", 0)),
                        no_embed_class=bool(arch.get("no_embed_class", False)),
                        pre_norm=bool(arch.get("pre_norm", False)))
    return _config(name, args, pool, width, _first_conv(family, arch), mean, std, class_names)


def _config(name, args, pool, width, first_conv, mean, std, class_names):
    """config.json of the architecture `name` with `model_args` `args`."""
    cfg = dict(input_size=[3, *args["img_size"]], fixed_input_size=True,
               interpolation="bilinear", crop_pct=1.0, crop_mode="center",
               mean=[float(m) for m in mean], std=[float(s) for s in std],
               num_classes=args["num_classes"], first_conv=first_conv, classifier="head")
    config = dict(architecture=name, num_classes=args["num_classes"], num_features=int(width),
                  global_pool=pool, model_args=args, pretrained_cfg=cfg)
    if class_names:
        config["label_names"] = [str(n) for n in class_names]
    return config


# --- timm's Eva (EVA-02, DINOv3, EVA-01): keras_vit.weights.timm_eva's way back ---------

def is_eva(arch):
    """Whether a ViT's builder arguments need timm's `Eva` (RoPE, q/v or no
    attention biases, a norm inside the MLP, no position embedding, the
    patch tokens' mean beside a class token), or its block names (BEiT's
    tables: timm's `Beit` names its blocks' weights as `Eva`)."""
    return bool(arch.get("rope") or arch.get("qkv_bias", "qkv") != "qkv" or arch.get("mlp_norm")
                or arch.get("position_embedding") is False or arch["classifier"] == "avg"
                or arch.get("relative_position_bias"))


def eva_config(arch, arithmetic, size, classes, mean, std, class_names=None):
    """The config.json of an Eva (`is_eva`): of `ARCHITECTURES`' Eva rows
    with the model's LayerNorm epsilon and RoPE variant (fixed in each
    name's code), the nearest the model, and `model_args` for
    the rest: the fused `qkv` with `q_bias`/`v_bias` (`qkv_fused=True`),
    a packed SwiGLU, or the split one (`fc1_g`, `fc1_x`) with a norm inside
    (`scale_mlp`; `swiglu_align_to=0`), the RoPE's temperature and
    `ref_feat_shape` (its variant is the name's).

    Raises:
        ValueError: what timm's `Eva` does not build (another GELU than
            erf, a distillation token, attention pooling, a pre-norm or no
            patch bias, BEiT's relative position bias, a key bias, a RoPE
            variant and epsilon no Eva name has).
    """
    rope, eps = arch.get("rope"), float(arithmetic["layer_norm_epsilon"])
    variant = (rope or {}).get("variant")
    why = _eva_refusal(arch, arithmetic)
    rows = {n: row for n, row in ARCHITECTURES.items() if "rope" in row}
    names = sorted(n for n, row in rows.items()
                   if row["eps"] == eps and (row["rope"] or {}).get("variant") == variant)
    if why is None and not names:
        have = sorted({((row["rope"] or {}).get("variant"), row["eps"]) for row in rows.values()},
                      key=str)
        why = (f"its RoPE is {variant!r} with LayerNorm epsilon {eps:g}, and timm's EVA "
               "architectures fix both in code (" + ", ".join(
                   f"{v!r} with {e:g}" for v, e in have) + ")")
    if why:
        raise ValueError(why)
    want = dict(mlp=arch.get("mlp", "gelu"), qkv_bias=arch.get("qkv_bias", "qkv"),
                mlp_norm=bool(arch.get("mlp_norm")), fc_norm=bool(arithmetic["fc_norm"]),
                position_embedding=arch.get("position_embedding", True) is not False,
                reg_tokens=int(arch.get("num_register_tokens", 0)),
                class_token=arch["classifier"] != "gap")
    # the name nearest the model (model_args then set each field)
    name = min(names, key=lambda n: (sum(rows[n][k] != v for k, v in want.items()),
                                     rows[n]["num_heads"] != arch["num_heads"], n))
    width, swiglu = arch["hidden_size"], arch.get("mlp") == "swiglu"
    scale = arithmetic.get("layer_scale_init")
    pool = "token" if arch["classifier"] == "token" else "avg"
    args = dict(
        img_size=[int(s) for s in size], num_classes=int(classes), in_chans=3,
        patch_size=_patch(arch["patch_size"]), embed_dim=width, depth=arch["num_layers"],
        num_heads=arch["num_heads"], global_pool=pool,
        mlp_ratio=_ratio(width, arch["mlp_dim"], "MLP"),  # packed or split: fc2's input
        swiglu_mlp=swiglu, swiglu_align_to=0, scale_mlp=bool(arch.get("mlp_norm")),
        qkv_fused=True, qkv_bias=arch.get("qkv_bias", "qkv") == "qv",
        class_token=arch["classifier"] in ("token", "avg"),
        num_reg_tokens=int(arch.get("num_register_tokens", 0)),
        no_embed_class=bool(arch.get("no_embed_class", False)),
        init_values=None if scale is None else float(scale),
        use_abs_pos_emb=arch.get("position_embedding", True) is not False,
        use_fc_norm=bool(arithmetic["fc_norm"]), use_rot_pos_emb=rope is not None)
    if rope is not None:  # the variant is the name's; its parameters model_args'
        args["rope_temperature"] = float(rope["temperature"])
        if variant == "eva":
            args["ref_feat_shape"] = list(rope["ref_grid"]) if rope.get("ref_grid") else None
    return _config(name, args, pool, width, "patch_embed.proj", mean, std, class_names)


def _eva_refusal(arch, arithmetic):
    """Why timm's `Eva` cannot compute `arch`, or None."""
    if arch.get("mlp", "gelu") == "gelu" and arithmetic["gelu"] != "erf":
        return (f"it computes the {arithmetic['gelu']!r} GELU, and timm's EVA blocks the exact "
                "(erf) one, fixed in its code")
    if arch.get("qkv_bias", "qkv") == "qkv":
        return ("its attention has a key bias, and timm's EVA attention has q/v biases only "
                "(its k_bias is a zero buffer)")
    if arch.get("distillation_token"):
        return "it has a distillation token, which timm's EVA has not"
    if arch["classifier"] not in ("token", "avg", "gap"):
        return f"it pools with classifier={arch['classifier']!r}, which keras_vit writes to " \
               "timm's EVA as 'token' or 'avg' only"
    if arch.get("pre_norm") or arch.get("patch_bias", True) is False:
        return ("it has a pre-norm or a patch embedding without bias, which timm's EVA builds "
                "only together (use_pre_transformer_norm)")
    if arch.get("relative_position_bias"):
        return "it has BEiT's relative position bias, which timm's EVA has not"
    return None


def eva_from_official(params):
    """`{timm key: array}` of an Eva's official arrays (`eva_config`'s
    layout): `from_official`'s ViT keys with `q_bias`/`v_bias`,
    `gamma_1`/`gamma_2`, `mlp.norm`, and a SwiGLU with a norm split into
    `fc1_g` (the gate half) and `fc1_x`; the constant keys (`rope/...`,
    `pooling/avg`) are config.json's."""
    plain, state = {}, {}
    for key, value in params.items():
        m = re.fullmatch(r"Transformer/encoderblock_(\d+)/(MultiHeadDotProductAttention_1/"
                         r"(query|value)/bias|MlpBlock_3/LayerNorm_0/(scale|bias))", key)
        if key.startswith(ROPE_PREFIX) or key == AVG_POOL_KEY:
            continue
        if m and m[3]:
            state[f"blocks.{m[1]}.attn.{m[3][0]}_bias"] = np.asarray(value).reshape(-1)
        elif m:
            state[f"blocks.{m[1]}.mlp.norm.{_wb(m[4])}"] = np.asarray(value)
        else:
            plain[key] = value
    for name, value in from_official(plain).items():
        m = re.fullmatch(r"blocks\.(\d+)\.(ls([12])\.gamma|mlp\.fc1\.(weight|bias))", name)
        if m and m[3]:
            state[f"blocks.{m[1]}.gamma_{m[3]}"] = value
        elif m and _split_swiglu(params, m[1]):  # [gate | x]
            gate, up = np.split(value, 2, axis=0)
            state[f"blocks.{m[1]}.mlp.fc1_g.{m[4]}"] = np.ascontiguousarray(gate)
            state[f"blocks.{m[1]}.mlp.fc1_x.{m[4]}"] = np.ascontiguousarray(up)
        else:
            state[name] = value
    return dict(sorted(state.items()))


def _split_swiglu(params, i):
    """Whether block `i` is a SwiGLU with a norm inside: timm's `SwiGLU`,
    whose `fc1_g` and `fc1_x` are the packed kernel's halves."""
    prefix = f"Transformer/encoderblock_{i}/MlpBlock_3"
    kernel = np.shape(params[f"{prefix}/Dense_0/kernel"])
    return f"{prefix}/LayerNorm_0/scale" in params and \
        kernel[-1] == 2 * np.shape(params[f"{prefix}/Dense_1/kernel"])[0]


# keras_vit's classifier -> timm's global_pool
POOLS = {"token": "token", "gap": "avg", "map": "map"}


def _check_fixed_epsilon(arithmetic, what):
    if arithmetic["layer_norm_epsilon"] != 1e-6:
        raise ValueError(
            f"its LayerNorm epsilon is {arithmetic['layer_norm_epsilon']:g} and timm's "
            f"{what} LayerNorms have 1e-6 (not a model argument)")


# The options of the later families (#48) as the official arrays show them
# (`architecture_from_checkpoint`), for the hybrid refusal.
_FAMILY_OPTIONS = ("layer_scale_init", "num_register_tokens", "distillation_token",
                   "no_embed_class", "patch_bias", "pre_norm")


def _refuse_hybrid_options(arch):
    options = [key for key in _FAMILY_OPTIONS if key in arch]
    options += ["classifier='map'"] if arch["classifier"] == "map" else []
    if options:
        raise ValueError(
            f"it is a hybrid built with {', '.join(options)}, and keras_vit writes timm "
            "hybrids as the official ones only, without the options of the later families")


def model_fields(arch, arithmetic):
    """What a ViT computes, as `timm_architectures.ARCHITECTURES` rows say
    it: mlp, gelu (None with a SwiGLU MLP), eps, pool, class_token,
    reg_tokens, no_embed_class, pre_norm, layer_scale (the initial value,
    None: none), fc_norm, patch_bias, distilled (not num_heads:
    `model_args` set it)."""
    scale = arithmetic.get("layer_scale_init")
    mlp = arch.get("mlp", "gelu")
    return dict(
        mlp=mlp, gelu=None if mlp == "swiglu" else arithmetic["gelu"],
        eps=float(arithmetic["layer_norm_epsilon"]),
        pool=POOLS[arch["classifier"]], class_token=arch["classifier"] == "token",
        reg_tokens=int(arch.get("num_register_tokens", 0)),
        no_embed_class=bool(arch.get("no_embed_class", False)),
        pre_norm=bool(arch.get("pre_norm", False)),
        layer_scale=None if scale is None else float(scale),
        fc_norm=bool(arithmetic["fc_norm"]), patch_bias=bool(arch.get("patch_bias", True)),
        distilled=bool(arch.get("distillation_token", False)))


def vit_architecture(arch, arithmetic):
    """The registered timm name a ViT's config.json names: of the ViT names
    of `ARCHITECTURES` whose code computes what `model_args` cannot say
    (the MLP, the LayerNorm epsilon, the distilled DeiT's class exactly when there is
    a distillation token, a patch bias exactly when there is no pre-norm),
    the one that matches most of the model's
    other fields (`model_fields`; `model_args` then set them all), first
    among the `vit_base_` names, then by name.

    Raises:
        ValueError: a model no registered name computes (a distillation
            token with registers or without a class-token position
            embedding, an epsilon no name has, a patch bias with a pre-norm
            or none without one).

    Example:

    >>> vit_architecture(dict(classifier="map"), dict(
    ...     gelu="erf", layer_norm_epsilon=1e-6, fc_norm=False))
    'vit_base_patch16_siglip_224'
    """
    want = model_fields(arch, arithmetic)
    if want["distilled"]:
        _check_distilled(want)
    if want["patch_bias"] == want["pre_norm"]:
        raise ValueError(
            f"its patch embedding {'has a' if want['patch_bias'] else 'has no'} bias "
            f"(patch_bias={want['patch_bias']}) with pre_norm={want['pre_norm']}, and timm's "
            "VisionTransformer gives its patch embedding a bias exactly when it has no "
            "pre-norm (PatchEmbed(bias=not pre_norm))")
    names = [name for name, row in ARCHITECTURES.items()
             if kind_of_name(name) == "vit" and row["distilled"] == want["distilled"]
             and row["patch_bias"] != row["pre_norm"] and row["mlp"] == want["mlp"]]
    candidates = [name for name in names if ARCHITECTURES[name]["eps"] == want["eps"]]
    if not names:
        raise ValueError(
            f"its MLP is {want['mlp']!r}, which no timm ViT architecture of "
            f"{TIMM_VERSION} builds (timm's MLP class is set in code, not by model_args)")
    if not candidates:
        epsilons = sorted({ARCHITECTURES[name]["eps"] for name in names}, reverse=True)
        raise ValueError(
            f"its LayerNorm epsilon is {want['eps']:g}, and each timm ViT architecture "
            f"fixes its epsilon in code ({' or '.join(f'{e:g}' for e in epsilons)}), "
            "which config.json's model_args cannot change")

    def mismatches(name):
        row = ARCHITECTURES[name]
        return sum((row[key] is None) != (want[key] is None) if key == "layer_scale"
                   else row[key] != want[key] for key in want)

    return min(candidates, key=lambda name: (
        mismatches(name), not name.startswith("vit_base_"), name))


def _check_distilled(want):
    """timm's distilled DeiT (`VisionTransformerDistilled`) gives both prefix
    tokens a position embedding and has no registers."""
    if want["reg_tokens"]:
        raise ValueError(
            f"it has a distillation token and {want['reg_tokens']} register "
            f"token{'s' if want['reg_tokens'] != 1 else ''}, and "
            "timm's distilled DeiT (VisionTransformerDistilled) has no registers")
    if want["no_embed_class"]:
        raise ValueError(
            "it has a distillation token and no position embedding on its prefix tokens "
            "(no_embed_class=True), and timm's distilled DeiT (VisionTransformerDistilled) "
            "embeds the class and distillation tokens")


def _first_conv(family, arch):
    """timm's `pretrained_cfg["first_conv"]`: the model's first convolution."""
    if family == "mixer":
        return "stem.proj"
    if "resnet_layers" not in arch:
        return "patch_embed.proj"
    return ("patch_embed.backbone.stem.conv" if arch["resnet_layers"]
            else "patch_embed.backbone.conv")


def _patch(patch_size):
    patch = [int(p) for p in patch_size]
    return patch[0] if patch[0] == patch[1] else patch
