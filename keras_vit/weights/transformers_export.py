"""Official arrays -> a transformers state dict and configs: the way back
out of `keras_vit.weights.transformers` (whose `to_official`, with
`transformers_families`' key maps, this inverts), for
`keras_vit.export.hub_folder`'s transformers folders.

Each model is written as the transformers class that computes its
function (`transformers_class`), with that class's `config.json` and the
keys its `save_pretrained` writes:

- `classifier="token"`: `ViTForImageClassification`;
- a distillation token with DeiT's distilled head:
  `DeiTForImageClassificationWithTeacher` (`cls_classifier` and
  `distillation_classifier` each get their half of the kernel, doubled,
  and the mean bias); with a head on the class token alone:
  `DeiTForImageClassification`;
- `classifier="token_avg"` with LayerScale: `Dinov2ForImageClassification`;
  with registers and `no_embed_class` too:
  `Dinov2WithRegistersForImageClassification` (the class position
  embedding, which keras_vit folds into the class token, a zero row);
- `classifier="gap"` (no class token): `SiglipForImageClassification`
  (the mean of all tokens after the final LayerNorm);
- BEiT's relative position bias tables: `BeitForImageClassification`
  (`classifier="avg"` with `fc_norm`: `use_mean_pooling`; or `"token"`).

What no transformers class computes is refused in one sentence naming
what differs: `classifier="map"` (transformers has no classifier on
SigLIP's attention-pooling head), a CLIP model (`pre_norm`:
`CLIPForImageClassification` averages the patch tokens beside a class
token without the final LayerNorm, which no keras_vit classifier
computes), LayerScale with a class-token head (DINOv2 classifies with
`token_avg`), a RoPE model (DINOv3, EVA-02: transformers has no image
classifier for them), and each option a class lacks.

The folder's `preprocessor_config.json` is a `ViTImageProcessor`'s for
each class: it resizes to the model's size and normalises with its
mean/std, which is all the model's own preprocessing does.
"""

import dataclasses

import numpy as np

from keras_vit.weights import transformers_families as families
from keras_vit.weights.npz import AVG_POOL_KEY, POSEMB_KEY
from keras_vit.weights.timm_export import torch_array
from keras_vit.weights.transformers import source_name


@dataclasses.dataclass(frozen=True)
class TransformersClass:
    """A transformers classifier keras_vit writes: its `model_type`, the
    prefix of its base model's keys, its name in sentences and the builder
    options (beyond the ViT's shape) it computes."""

    model_type: str
    prefix: str
    name: str
    options: frozenset = frozenset()


_DEIT = TransformersClass("deit", "deit.", "DeiT", frozenset({"distillation_token"}))
CLASSES = {
    "ViTForImageClassification": TransformersClass("vit", "vit.", "ViT"),
    "DeiTForImageClassification": _DEIT,
    "DeiTForImageClassificationWithTeacher": _DEIT,
    "Dinov2ForImageClassification": TransformersClass(
        "dinov2", "dinov2.", "Dinov2ForImageClassification",
        frozenset({"layer_scale_init"})),
    "Dinov2WithRegistersForImageClassification": TransformersClass(
        "dinov2_with_registers", "dinov2_with_registers.",
        "Dinov2WithRegistersForImageClassification",
        frozenset({"layer_scale_init", "num_register_tokens", "no_embed_class"})),
    "SiglipForImageClassification": TransformersClass(
        "siglip", "vision_model.", "SiglipForImageClassification"),
    "BeitForImageClassification": TransformersClass(
        "beit", "beit.", "BeitForImageClassification",
        frozenset({"layer_scale_init", "qkv_bias", "position_embedding",
                   "relative_position_bias", "fc_norm"})),
}
HIDDEN_ACT = {"erf": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}
# the builder's shape arguments, which every class takes
_SHAPE = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "classifier")
# each option a class may lack, in the order they are refused
_OPTIONS = {
    "layer_scale_init": "it scales each block's residual branches (LayerScale, "
                        "layer_scale_init), and transformers' {name} has no LayerScale",
    "num_register_tokens": "it has {value} register tokens (num_register_tokens), and "
                           "transformers' {name} has no registers",
    "distillation_token": "it has a distillation token (distillation_token=True), and "
                          "transformers' {name} has none",
    "no_embed_class": "its class token has no position embedding (no_embed_class=True), "
                      "and transformers' {name} adds one to the class token",
    "pre_norm": "it normalises its embeddings before the blocks (pre_norm=True), and "
                "transformers' {name} has no such LayerNorm",
    "patch_bias": "its patch embedding has no bias (patch_bias=False), and transformers' "
                  "{name}'s patch embedding has one",
    "mlp": "its MLP is a SwiGLU (mlp={value!r}), and keras_vit writes transformers' {name} "
           "with its GELU MLP only (DINOv2's use_swiglu_ffn is not written)",
    "fc_norm": "it normalises the pooled vector (fc_norm=True), and transformers' {name} "
               "pools the tokens after its final LayerNorm",
}


def transformers_class(arch, arithmetic, image_size, distilled_head=True):
    """The name of the transformers class that computes the ViT `arch`
    (`architecture_from_checkpoint`'s kwargs) with `arithmetic`
    (`hub_folder.model_arithmetic`) at `image_size`; `distilled_head`:
    a distillation-token model's head is DeiT's distilled classifier.

    Raises:
        ValueError: a model no transformers class computes (the message
            says what differs).

    Example:

    >>> arch = dict(patch_size=(14, 14), hidden_size=384, num_layers=12, num_heads=6,
    ...             mlp_dim=1536, classifier="token_avg", layer_scale_init=1e-5)
    >>> transformers_class(arch, {"gelu": "erf", "fc_norm": False}, (224, 224))
    'Dinov2ForImageClassification'
    """
    classifier = arch["classifier"]
    if "resnet_layers" in arch:
        raise ValueError("it is a hybrid, and transformers' ViT has no ResNet stem")
    if arch.get("rope") is not None:
        raise ValueError(
            "it rotates its queries and keys (rope, DINOv3's or EVA-02's RoPE), and "
            "transformers has no image classifier that does (DINOv3ViTModel has no head)")
    if arch.get("relative_position_bias"):
        name = "BeitForImageClassification"
        _check_beit(arch, arithmetic)
    elif arch.get("distillation_token"):
        name = "DeiTForImageClassificationWithTeacher" if distilled_head else \
            "DeiTForImageClassification"
        if classifier != "token":
            raise ValueError(
                f"it has a distillation token and pools with classifier={classifier!r}, "
                "and transformers' DeiT classifies the class and distillation tokens")
    elif classifier == "token_avg":
        name = "Dinov2WithRegistersForImageClassification" \
            if arch.get("num_register_tokens") else "Dinov2ForImageClassification"
    elif classifier == "gap":
        name = "SiglipForImageClassification"
    elif classifier == "map":
        raise ValueError(
            "it pools with SigLIP's attention-pooling head (classifier='map'), and "
            "transformers has no classifier on that head (SiglipForImageClassification "
            "averages the tokens: classifier='gap')")
    elif arch.get("pre_norm"):
        raise ValueError(
            "it normalises its embeddings before the blocks (pre_norm=True, CLIP's), and "
            "transformers' CLIPForImageClassification averages the patch tokens beside a "
            "class token without the final LayerNorm, which no keras_vit classifier "
            "computes, while its ViT has no pre-norm")
    elif arch.get("layer_scale_init"):
        raise ValueError(
            "it scales each block's residual branches (LayerScale, layer_scale_init) and "
            "classifies the class token alone (classifier='token'), and transformers' "
            "ViT has no LayerScale while its DINOv2 classifies the class token beside "
            "the patch tokens' mean (classifier='token_avg')")
    else:
        name = "ViTForImageClassification"
    _refuse_options(CLASSES[name], arch, arithmetic, image_size)
    return name


def _check_beit(arch, arithmetic):
    """What `BeitForImageClassification` computes beside the tables: the
    query and value biases, the patch tokens' mean through
    `pooler.layernorm` (`use_mean_pooling`) or the class token after the
    final norm."""
    if arch.get("qkv_bias", "qkv") != "qv":
        raise ValueError(
            f"it is a BEiT (relative position bias tables) with qkv_bias="
            f"{arch.get('qkv_bias', 'qkv')!r}, and transformers' BEiT has a query and a "
            "value bias and no key bias ('qv')")
    if (arch["classifier"], bool(arithmetic["fc_norm"])) not in (("avg", True),
                                                                  ("token", False)):
        raise ValueError(
            f"it is a BEiT that pools with classifier={arch['classifier']!r} and "
            f"fc_norm={bool(arithmetic['fc_norm'])}, and transformers' BEiT normalises the "
            "patch tokens' mean (use_mean_pooling: 'avg' with fc_norm) or takes the class "
            "token after the final LayerNorm ('token')")


def _refuse_options(target, arch, arithmetic, image_size):
    """The options of `arch` and `arithmetic` that `target` does not
    compute, each refused in its own sentence."""
    for option in [*_OPTIONS, *sorted(set(arch) - set(_OPTIONS) - set(_SHAPE))]:
        if option in arch and option not in target.options:
            template = _OPTIONS.get(
                option, "it is built with {option}={value!r}, which keras_vit does not "
                        "write as transformers' {name}")
            raise ValueError(template.format(option=option, value=arch[option],
                                             name=target.name))
    if target.model_type.startswith("dinov2"):
        if "layer_scale_init" not in arch:
            raise ValueError(
                f"it has no LayerScale (layer_scale_init=None), and transformers' "
                f"{target.name} scales each block's residual branches")
        if arch.get("num_register_tokens") and not arch.get("no_embed_class"):
            raise ValueError(
                f"its register tokens have position embeddings (no_embed_class=False), "
                f"and transformers' {target.name} adds none to its registers")
        if arch["mlp_dim"] % arch["hidden_size"]:
            raise ValueError(
                f"its MLP is {arch['mlp_dim']} wide for width {arch['hidden_size']}, and "
                f"transformers' {target.name} builds it as width x mlp_ratio, a whole number")
    if arithmetic["fc_norm"] and target.model_type != "beit":
        raise ValueError(
            f"it normalises the pooled vector (fc_norm=True), and transformers' "
            f"{target.name} pools the tokens after its final LayerNorm")
    patch = tuple(int(p) for p in arch["patch_size"])
    if target.model_type not in ("vit", "deit") and (
            image_size[0] != image_size[1] or patch[0] != patch[1]):
        raise ValueError(
            f"it takes {image_size[0]}x{image_size[1]} images in {patch[0]}x{patch[1]} "
            f"patches, and transformers' {target.name} computes square images of square "
            "patches only")


def from_official(params, class_name="ViTForImageClassification"):
    """`{transformers key: float32 array}` of a ViT classifier's official
    arrays, as `class_name`'s `save_pretrained` names them (the encoder
    under its base model's prefix, the heads at the top level): the
    inverse of `keras_vit.weights.transformers.to_official`.

    Raises:
        ValueError: an official key the class has no place for
            (`pre_logits`, `fc_norm`, a hybrid's stem, ...).

    Example:

    >>> import numpy as np
    >>> sorted(from_official({"cls": np.zeros((1, 1, 8), "float32")}))
    ['vit.embeddings.cls_token']
    """
    target = CLASSES[class_name]
    teacher = class_name.endswith("WithTeacher")
    clip_style = target.model_type == "siglip"
    state = {}
    for key, value in params.items():
        name = source_name(key)
        if name == key:
            name = families.official_name(key)
        if key == AVG_POOL_KEY and target.model_type == "beit":
            continue  # use_mean_pooling says it
        beit_pooler = target.model_type == "beit" and name and name.startswith("pooler.layernorm.")
        if name is None or (name.startswith(("pooler.", "pre_layrnorm.", "head."))
                            and not beit_pooler) or (
                name.startswith("distillation_classifier.") and not teacher):
            raise ValueError(
                f"transformers' {class_name} has no counterpart of {key!r}.")
        value = torch_array(key, value)
        if name.startswith(("classifier.", "distillation_classifier.")):
            state[("cls_" if teacher and name.startswith("classifier.") else "") + name] = value
            continue
        if clip_style and key == "cls":
            raise ValueError(f"transformers' {class_name} has no class token ({key!r}).")
        if clip_style and key == POSEMB_KEY:
            value = value[0]  # nn.Embedding's (N, D)
        if target.model_type == "dinov2_with_registers" and key == POSEMB_KEY:
            # keras_vit holds the class position embedding in the class token
            value = np.concatenate([np.zeros_like(value[:, :1]), value], axis=1)
        state[target.prefix + families.styled(name, target.model_type)] = value
    if target.model_type.startswith("dinov2"):  # pre-training's, never read by the forward
        width = params["embedding/kernel"].shape[-1]
        state[target.prefix + families.MASK_TOKEN] = np.zeros((1, width), np.float32)
    return dict(sorted(state.items()))


def hub_configs(class_name, arch, arithmetic, image_size, classes, mean, std,
                class_names=None):
    """`(config.json, preprocessor_config.json)` that
    `<class_name>.from_pretrained(DIR)` and `AutoImageProcessor.
    from_pretrained(DIR)` read: the shape, GELU form (`"gelu"`: erf,
    `"gelu_pytorch_tanh"`: tanh, `"quick_gelu"`), LayerNorm epsilon,
    LayerScale's initial value, register count and `id2label`; the
    processor (a `ViTImageProcessor`) resizes to the model's size
    (bilinear, as keras_vit's eval pipeline) and normalises with its
    mean/std. `class_name` is `transformers_class`'s answer."""
    target = CLASSES[class_name]
    height, width = (int(s) for s in image_size)
    patch = [int(p) for p in arch["patch_size"]]
    names = [str(n) for n in class_names] if class_names else [
        f"LABEL_{i}" for i in range(int(classes))]
    shape = dict(
        hidden_size=arch["hidden_size"], num_hidden_layers=arch["num_layers"],
        num_attention_heads=arch["num_heads"], hidden_act=HIDDEN_ACT[arithmetic["gelu"]],
        layer_norm_eps=float(arithmetic["layer_norm_epsilon"]),
        image_size=height if height == width else [height, width],
        patch_size=patch[0] if patch[0] == patch[1] else patch, num_channels=3)
    labels = dict(id2label={str(i): n for i, n in enumerate(names)},
                  label2id={n: i for i, n in enumerate(names)})
    if target.model_type == "siglip":
        vision = dict(model_type="siglip_vision_model", **shape,
                      intermediate_size=arch["mlp_dim"], attention_dropout=0.0,
                      vision_use_head=False)
        config = dict(architectures=[class_name], model_type="siglip",
                      vision_config=vision, **labels)
    else:
        config = dict(architectures=[class_name], model_type=target.model_type, **shape,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      initializer_range=0.02, qkv_bias=True)
        if target.model_type.startswith("dinov2"):
            config.update(mlp_ratio=arch["mlp_dim"] // arch["hidden_size"],
                          layerscale_value=float(arithmetic["layer_scale_init"]),
                          drop_path_rate=0.0, use_swiglu_ffn=False)
            if arch.get("num_register_tokens"):
                config["num_register_tokens"] = int(arch["num_register_tokens"])
        elif target.model_type == "beit":
            config.pop("qkv_bias")
            scale = arithmetic.get("layer_scale_init")
            config.update(
                intermediate_size=arch["mlp_dim"], use_relative_position_bias=True,
                use_shared_relative_position_bias=False, use_mask_token=False,
                use_absolute_position_embeddings=arch.get("position_embedding", True),
                use_mean_pooling=arch["classifier"] == "avg", drop_path_rate=0.0,
                layer_scale_init_value=0.0 if scale is None else float(scale))
        else:
            config.update(intermediate_size=arch["mlp_dim"], encoder_stride=patch[0])
        config.update(labels)
    preprocessor = dict(
        image_processor_type="ViTImageProcessor", do_resize=True,
        size={"height": height, "width": width}, resample=2, do_rescale=True,
        rescale_factor=1 / 255, do_normalize=True, image_mean=[float(m) for m in mean],
        image_std=[float(s) for s in std])
    return config, preprocessor
