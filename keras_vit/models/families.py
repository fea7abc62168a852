"""The named models of the families whose weights are on the Hugging Face
Hub (#48, #50): DINOv2 (with registers), DeiT, DeiT-III, CLIP, SigLIP,
DINOv3 and EVA-02.

Each is a `VisionTransformer` of its row of `keras_vit.variants.HUB_VARIANTS`
(the architecture and the arithmetic), built keras.applications style:

```python
model = keras_vit.DINOv2ViTS14(weights="hf://timm/vit_small_patch14_dinov2.lvd142m")
```

`weights=`: None (random weights), an `hf://ORG/NAME` reference, a local
Hub folder, a `.safetensors` or PyTorch file, a Keras `.weights.h5` file or
a `Checkpoint` read already. These families have no registered names and
no official `.npz` files: a registered name, an http(s) URL (an official
`.npz`) or an official `.npz` is refused, and so is a checkpoint of another
architecture, in one sentence naming what differs
(`keras_vit.model_from_checkpoint` builds the model a checkpoint holds).

The arithmetic (GELU form, LayerNorm epsilon, input mean and std): an
argument given wins, else what the checkpoint's config.json says (timm's
or transformers', which can differ for the same weights), else the
family's (its `Variant.config`: the original model's). A bare `.safetensors`
or PyTorch file says none, so it gets the family's. See
docs/models.md#dinov2-deit-clip-and-siglip-named-builders.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras

from keras_vit.errors import CheckpointMismatchError
from keras_vit.models.application import ARITHMETIC_DEFAULTS, default_name
from keras_vit.models.auto import headless_defaults
from keras_vit.models.vit import VisionTransformer, vision_transformer_model
from keras_vit.variants import HUB_VARIANTS, Variant
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.dino import LIBRARY as DINO
from keras_vit.weights.sources import resolve, where

# The arithmetic a user may pass (the rest, fc_norm and the ResNet stem's,
# are the checkpoint's alone).
ARITHMETIC_ARGS = ("gelu", "layer_norm_epsilon", "image_mean", "image_std")
# Arguments of the named Hub builders besides the keras.applications ones.
HUB_ARGS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate", "attention",
            *ARITHMETIC_ARGS)

_VIT_DEFAULTS = {name: p.default
                 for name, p in inspect.signature(VisionTransformer).parameters.items()
                 if p.default is not inspect.Parameter.empty}

SUMMARIES = {
    "dinov2": "DINOv2 (Oquab et al., 2023): a self-supervised ViT with LayerScale and "
              "14-pixel patches",
    "deit": "DeiT (Touvron et al., 2021): the ViT trained data-efficiently on ImageNet-1k",
    "deit3": "DeiT III (Touvron et al., 2022): a ViT with LayerScale and position "
             "embeddings of the patch grid only",
    "clip": "the image tower of OpenAI's CLIP (Radford et al., 2021): a LayerNorm "
            "before the blocks, QuickGELU, a patch projection without bias",
    "siglip": "the image tower of SigLIP (Zhai et al., 2023): no class token, an "
              "attention-pooling (map) head",
    "dinov3": "DINOv3 (Simeoni et al., 2025): a self-supervised ViT with rotary position "
              "embeddings, 4 registers, LayerScale and 16-pixel patches",
    "eva02": "EVA-02 (Fang et al., 2023): a ViT with rotary and learned position "
             "embeddings, a SwiGLU MLP and q/v biases, pooling the patch tokens",
    "beit": "BEiT (Bao et al., 2022): a ViT pretrained by masked image modelling, with a "
            "relative position bias in each block (one image size), q/v biases and LayerScale",
    "beitv2": "BEiT v2 (Peng et al., 2022): BEiT's architecture, pretrained with a "
              "semantic visual tokenizer",
}
REGISTERS = ("\n    With 4 register tokens (Darcet et al., 2024, 'Vision Transformers Need "
             "Registers').")


# --- what a checkpoint may be ----------------------------------------------------------

def _where_to_find(variant: Variant) -> str:
    return (f"pass weights='hf://{variant.hub[0]}' (or "
            f"{', '.join(f'hf://{r}' for r in variant.hub[1:])}), a local Hub folder, a "
            ".safetensors or PyTorch file, a Keras .weights.h5 file, or None for random "
            "weights")


def hub_checkpoint(variant: Variant, weights: Any, ema: bool) -> Checkpoint | None:
    """`weights` read once (`keras_vit.weights.resolve`) for the named Hub
    `variant`, or None.

    Raises:
        ValueError: a registered name or an http(s) URL (an official
            `.npz`): these families have neither.
        CheckpointMismatchError: an official `.npz` (its arithmetic is the
            official ViT's), or a ViT of another architecture
            (`check_architecture`).
        as `resolve`.
    """
    if isinstance(weights, (str, os.PathLike)) and not isinstance(os.fspath(weights), bytes):
        kind = where(os.fspath(weights))
        if kind == "name":
            raise ValueError(
                f"{variant.function} has no registered weights (weights={weights!r}): "
                f"{variant.official_name} checkpoints are on the Hugging Face Hub; "
                f"{_where_to_find(variant)}.")
        if kind == "url":
            raise ValueError(
                f"weights={weights!r} downloads an official .npz (the format of "
                f"google-research/vision_transformer), which holds no "
                f"{variant.official_name}; {_where_to_find(variant)}.")
    checkpoint = resolve(weights, variant, variant.official_name, ema=ema)
    if checkpoint is not None and checkpoint.format == "official":
        raise CheckpointMismatchError(
            f"{checkpoint.source} is an official .npz (google-research/vision_transformer's "
            f"format, computed with the official ViT's arithmetic), not a "
            f"{variant.official_name} checkpoint: build the model it holds with "
            f"keras_vit.model_from_checkpoint({checkpoint.source!r}), or "
            f"{_where_to_find(variant)}.")
    if checkpoint is not None:
        check_architecture(variant, checkpoint)
    return checkpoint


# The architecture options and their defaults (VisionTransformer's).
_OPTIONS = {"classifier": "token", "layer_scale_init": None, "num_register_tokens": 0,
            "distillation_token": False, "no_embed_class": False, "patch_bias": True,
            "pre_norm": False, "resnet_layers": None, "mlp": "gelu", "qkv_bias": "qkv",
            "mlp_norm": False, "position_embedding": True, "relative_position_bias": False}
_SHAPE = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim")


def _architecture(config: dict) -> dict:
    """The architecture of VisionTransformer arguments, comparable: the
    patch a pair, each option with its default, LayerScale present or not
    (the checkpoint holds the scales; the initial value is no shape)."""
    out = {key: config.get(key) for key in _SHAPE}
    patch = out["patch_size"]
    out["patch_size"] = (patch, patch) if isinstance(patch, int) else tuple(patch)
    out.update({key: config.get(key, default) for key, default in _OPTIONS.items()})
    if out["classifier"] in ("token_avg", "avg"):  # the class token's encoder; heads differ
        out["classifier"] = "token"
    out["layer_scale_init"] = out["layer_scale_init"] is not None
    if out["resnet_layers"] is not None:
        out["resnet_layers"] = tuple(out["resnet_layers"])
    return out


def _phrase(key: str, value: Any) -> str:
    if key == "layer_scale_init":
        return "LayerScale" if value else "no LayerScale"
    if key == "patch_size" and value[0] == value[1]:
        return f"patch_size={value[0]}"
    return f"{key}={value!r}"


def check_architecture(variant: Variant, checkpoint: Checkpoint) -> None:
    """A `CheckpointMismatchError` in one sentence when `checkpoint` holds a
    ViT of another architecture than `variant`'s (width, depth, heads, MLP,
    patch, classifier, LayerScale, registers, distillation token, position
    embeddings, patch bias, pre-norm, MLP kind). A Mixer is left to the builder's
    check, a Keras weights file (which does not describe itself) to its
    loading; a checkpoint that does not say its heads is read with the
    variant's."""
    if checkpoint.info() is None:
        return
    family, config = checkpoint.model_config()
    if family != "vit":
        return
    mine, theirs = _architecture(variant.config), _architecture(config)
    differs = [key for key, value in mine.items()
               if theirs[key] != value and not (key == "num_heads" and theirs[key] is None)]
    if differs:
        raise CheckpointMismatchError(
            f"Checkpoint {checkpoint.source} does not fit {variant.function} "
            f"({variant.official_name}): it has "
            f"{', '.join(_phrase(key, theirs[key]) for key in differs)} where "
            f"{variant.function} has {', '.join(_phrase(key, mine[key]) for key in differs)}; "
            f"keras_vit.model_from_checkpoint({checkpoint.source!r}) builds the model it "
            "holds.", source=checkpoint.source, model_name=variant.function)


def _says_arithmetic(checkpoint: Checkpoint | None) -> bool:
    """Whether the checkpoint says its GELU and epsilon: a Hub folder's
    config.json, DINO's own files. A bare timm / transformers file's are
    its reader's guesses, an official `.npz` and a Keras file have none."""
    return getattr(checkpoint, "config", None) is not None or \
        getattr(checkpoint, "library", None) == DINO


def _checkpoint_classifier(checkpoint: Checkpoint | None) -> str | None:
    """The classifier of `checkpoint`'s head, None without a checkpoint or
    one that does not describe itself."""
    info = checkpoint.info() if checkpoint is not None else None
    return info.classifier if info is not None else None


def _default_head(checkpoint: Checkpoint | None, classifier: str, pooling: str | None,
                  classes: int | None, features_only: bool) -> tuple[bool, str | None]:
    """`(include_top, pooling)` for `include_top=None`: no head when a
    `pooling` is given; a head without weights (keras.applications' 1000
    classes), with `classes`, or with a checkpoint that has one; else
    `model_from_checkpoint`'s defaults for a checkpoint without a head
    (`headless_defaults`)."""
    if pooling is not None:
        return False, pooling
    if checkpoint is None or checkpoint.info() is None or classes is not None:
        return True, None
    given = headless_defaults(checkpoint, "vit", classifier,
                              {"features_only": True} if features_only else {})
    return given.get("include_top", True), given.get("pooling")


# --- the named builders -----------------------------------------------------------------

# the heads on a class token's encoder: a checkpoint's wins over the family's
_CLASS_TOKEN_HEADS = ("token", "token_avg", "avg")


def hub_model_builder(variant: Variant) -> Callable[..., keras.Model]:
    """Makes the one-line named function of a Hub family's `variant`
    (`DINOv2ViTS14`, ...): the keras.applications arguments plus
    `HUB_ARGS`; `include_top=None` (its default): the checkpoint's head
    when it has one, else the output its library computes without one
    (`headless_defaults`); a 1000-class head without weights."""
    variant_architecture = {k: v for k, v in variant.config.items()
                            if k not in ARITHMETIC_DEFAULTS}
    family_arithmetic = {k: v for k, v in variant.config.items() if k in ARITHMETIC_DEFAULTS}

    def build(include_top: bool | None = None, weights: str | os.PathLike | None = None,
              input_tensor: keras.KerasTensor | None = None,
              input_shape: tuple[int | None, int | None, int] | None = None,
              pooling: str | None = None, classes: int | None = None,
              classifier_activation: str | Callable | None = "softmax",
              include_preprocessing: bool = True, name: str | None = None,
              ema: bool = False, features_only: bool = False,
              out_indices: int | Sequence[int] | None = None,
              feature_format: str | None = None, remat: bool = False,
              **kwargs: Any) -> keras.Model:
        architecture = dict(variant_architecture)
        unknown = sorted(set(kwargs) - set(HUB_ARGS))
        if unknown:
            raise TypeError(
                f"{variant.function}() got unexpected keyword arguments {unknown}; allowed "
                f"besides the keras.applications ones: {list(HUB_ARGS)}.")
        checkpoint = hub_checkpoint(variant, weights, ema)
        head = _checkpoint_classifier(checkpoint)
        if head in _CLASS_TOKEN_HEADS and architecture.get("classifier", "token") in \
                _CLASS_TOKEN_HEADS:  # Dinov2ForImageClassification's, DINOv3's class token
            architecture["classifier"] = head
        if not _says_arithmetic(checkpoint):
            kwargs = {**family_arithmetic, **{k: v for k, v in kwargs.items() if v is not None}}
        if include_top is None:
            include_top, pooling = _default_head(
                checkpoint, architecture.get("classifier", "token"), pooling, classes,
                features_only)
        return vision_transformer_model(variant, **{
            **_VIT_DEFAULTS, **architecture, **kwargs, "include_top": include_top,
            "pooling": pooling, "classes": classes, "features_only": features_only,
            "weights": checkpoint,
            "input_tensor": input_tensor, "input_shape": input_shape,
            "classifier_activation": classifier_activation,
            "include_preprocessing": include_preprocessing,
            "name": name or default_name(variant), "ema": False,
            "out_indices": out_indices, "feature_format": feature_format, "remat": remat})

    build.__name__ = build.__qualname__ = variant.function
    build.__doc__ = _docstring(variant)
    return build


_DOC = """Builds {name}: {summary}.

    Architecture: {shape}.{registers}
    Without weights: {arithmetic}; {size}x{size} pixels. A checkpoint's
    config.json says its own arithmetic, which wins (timm's and
    transformers' can differ for the same weights); an argument given wins
    over both.

    Weights on the Hugging Face Hub: {repos}
    (docs/models.md#dinov2-deit-clip-and-siglip-named-builders).

    Args:
        include_top: None (the default): the checkpoint's head when it has
            one, else its library's output without one (timm's
            `num_classes=0` pooling); with `weights=None`, a 1000-class head.
            True or False as keras.applications.
        weights: None (random weights), `"hf://ORG/NAME"`, a local Hub
            folder, a `.safetensors` or PyTorch file, a Keras `.weights.h5`
            file, or a `keras_vit.weights.Checkpoint`; a checkpoint of
            another architecture is a `CheckpointMismatchError`.
        input_tensor, input_shape, pooling, classes, classifier_activation,
            include_preprocessing, name, ema, features_only, out_indices,
            feature_format, remat: as in `keras_vit.VisionTransformer`.
        **kwargs: {kwargs}.

    Example:

    ```python
    model = keras_vit.{function}(weights="hf://{example}")
    ```
    """


def _docstring(variant: Variant) -> str:
    config = variant.config
    shape = ", ".join(f"{k}={config[k]}" for k in
                      ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim"))
    options = [f"{k}={config[k]!r}" for k in _OPTIONS if k in config]
    return _DOC.format(
        name=variant.official_name, function=variant.function,
        summary=SUMMARIES[variant.release], shape=", ".join([shape, *options]),
        registers=REGISTERS if config.get("num_register_tokens") else "",
        repos=", ".join(f"`hf://{repo}`" for repo in variant.hub), size=variant.image_size,
        arithmetic=("SiLU (its SwiGLU MLP's), " if config.get("mlp") == "swiglu" else
                    f"gelu={config['gelu']!r}, ") + (f"layer_norm_epsilon="
                    f"{config['layer_norm_epsilon']}, image_mean={config['image_mean']}, "
                    f"image_std={config['image_std']}") + "".join(
                        f", {k}={config[k]!r}" for k in ("fc_norm", "rope") if k in config),
        kwargs=", ".join(HUB_ARGS), example=variant.hub[0])


def _named(key: str) -> Callable[..., keras.Model]:
    return hub_model_builder(HUB_VARIANTS[key])


DINOv2ViTS14 = _named("DINOv2-S/14")
DINOv2ViTB14 = _named("DINOv2-B/14")
DINOv2ViTL14 = _named("DINOv2-L/14")
DINOv2ViTG14 = _named("DINOv2-g/14")
DINOv2ViTS14Reg = _named("DINOv2-S/14-reg")
DINOv2ViTB14Reg = _named("DINOv2-B/14-reg")
DINOv2ViTL14Reg = _named("DINOv2-L/14-reg")
DINOv2ViTG14Reg = _named("DINOv2-g/14-reg")
DeiTTi16 = _named("DeiT-Ti/16")
DeiTS16 = _named("DeiT-S/16")
DeiTB16 = _named("DeiT-B/16")
DeiTTi16Distilled = _named("DeiT-Ti/16-distilled")
DeiTS16Distilled = _named("DeiT-S/16-distilled")
DeiTB16Distilled = _named("DeiT-B/16-distilled")
DeiT3S16 = _named("DeiT3-S/16")
DeiT3B16 = _named("DeiT3-B/16")
DeiT3L16 = _named("DeiT3-L/16")
CLIPViTB32 = _named("CLIP-B/32")
CLIPViTB16 = _named("CLIP-B/16")
CLIPViTL14 = _named("CLIP-L/14")
SigLIPViTB16 = _named("SigLIP-B/16")
SigLIPViTL16 = _named("SigLIP-L/16")
SigLIPSo400m14 = _named("SigLIP-So400m/14")
DINOv3ViTS16 = _named("DINOv3-S/16")
DINOv3ViTSPlus16 = _named("DINOv3-S+/16")
DINOv3ViTB16 = _named("DINOv3-B/16")
DINOv3ViTL16 = _named("DINOv3-L/16")
DINOv3ViTHPlus16 = _named("DINOv3-H+/16")
EVA02Ti14 = _named("EVA02-Ti/14")
EVA02S14 = _named("EVA02-S/14")
EVA02B14 = _named("EVA02-B/14")
EVA02L14 = _named("EVA02-L/14")
BEiTB16 = _named("BEiT-B/16")
BEiTL16 = _named("BEiT-L/16")
BEiTv2B16 = _named("BEiTv2-B/16")
BEiTv2L16 = _named("BEiTv2-L/16")
