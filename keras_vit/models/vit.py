"""VisionTransformer: the ViT and R+ViT hybrid builder, and the named models.

Architecture as the official `vit_jax/models_vit.py`:

```
images ─► (x - 127.5) / 127.5 ─► [ResNet root + stages] ─► Patches
  ─► PatchEncoder (projection, class token, position embedding) ─► Dropout
  ─► TransformerBlock × L ─► LayerNorm ─► pool (token | gap)
  ─► [pre_logits: Dense + tanh] ─► head
```
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import keras

from keras_vit import _checks
from keras_vit.layers import (
    BottleneckUnit,
    PatchEncoder,
    Patches,
    ResNetRoot,
    TransformerBlock,
)
from keras_vit.layers.resnet import resnet_arithmetic as resnet_arithmetic_args
from keras_vit.models import _common
from keras_vit.variants import VIT_VARIANTS, Variant, effective_patch_size, find_variant
from keras_vit.weights.registry import (
    architecture_for,
    available_weights,
    families_for,
    family_of,
    imagenet_choice,
)
from keras_vit.weights.resolve import resolve_weights

CLASSIFIERS = ("token", "gap")


def VisionTransformer(
    patch_size: int | tuple[int, int],
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    mlp_dim: int,
    classifier: str = "token",
    representation_size: int | None = None,
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    resnet_layers: tuple[int, ...] | list[int] | None = None,
    resnet_width: int = 1,
    include_top: bool = True,
    weights: str | os.PathLike | None = None,
    input_tensor: keras.KerasTensor | None = None,
    input_shape: tuple[int | None, int | None, int] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | Callable | None = "softmax",
    include_preprocessing: bool = True,
    name: str | None = None,
    gelu: str | None = None,
    layer_norm_epsilon: float | None = None,
    fc_norm: bool | None = None,
    resnet_arithmetic: str | None = None,
    image_mean: float | Sequence[float] | None = None,
    image_std: float | Sequence[float] | None = None,
) -> keras.Model:
    """Builds a Vision Transformer or an R+ViT hybrid.

    Reference: Dosovitskiy et al., "An Image is Worth 16x16 Words:
    Transformers for Image Recognition at Scale" (ICLR 2021). The argument
    names are the official config fields.

    Args:
        patch_size: int or (h, w) patch size (on the ResNet grid for hybrids).
        hidden_size: token width D.
        num_layers: number of transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: MLP hidden width.
        classifier: `"token"` (class token) or `"gap"` (mean of all tokens).
        representation_size: width of the `pre_logits` Dense + tanh layer,
            None for none. With checkpoint weights, None means "as the
            checkpoint has it" when its head is kept.
        dropout_rate, attention_dropout_rate: dropout rates.
        drop_path_rate: stochastic depth of the last block; block i uses
            `drop_path_rate * i / (num_layers - 1)`.
        resnet_layers: None for a pure ViT; a tuple of bottleneck-unit counts
            per stage for a hybrid (`()`: the stem only).
        resnet_width: ResNet width factor (width = 64 * factor).
        include_top: whether to include the classification head.
        weights: None, a registered name (`keras-vit models` lists them), an
            `"augreg:<filename>"`, a URL, or a path to an official `.npz` or
            a Keras `.weights.h5` file.
        input_tensor: optional Keras tensor to use as image input.
        input_shape: `(height, width, 3)`, multiples of the patch size
            (times the ResNet stride for hybrids); defaults to the
            checkpoint's resolution, else 224. Another size than the
            checkpoint's resizes the position embeddings once, at loading,
            with the official algorithm (bilinear, aligned corners).
            `(None, None, 3)`, as keras.applications allows: one model for
            any image size at call time. The position embedding is stored
            at the checkpoint's grid (without weights: 224 pixels' worth)
            and resized in the graph, with the same algorithm, to each
            call's grid (not at all at the stored grid), so a call at a size
            equals a model built at that size. Each height and width must
            be a multiple of the patch size: another raises a `ValueError`
            in eager calls and on JAX; in a TensorFlow graph it fails in a
            reshape. Hybrids accept any size (their stem pads, as the
            official one). E.g. `ViTB16(weights="imagenet",
            input_shape=(None, None, 3))(images_384)`.
        pooling: with `include_top=False`: None returns the token sequence
            after the final LayerNorm `(batch, tokens, hidden_size)`;
            `"token"` or `"gap"` the official pooled vector (then
            `pre_logits` if the model has one, as the official model with
            `num_classes=0`); `"avg"` or `"max"` the keras.applications
            feature vector: the mean / maximum over the patch tokens after
            the final LayerNorm, the class token left out, no `pre_logits`.
            E.g. `ViTB16(weights="imagenet", include_top=False,
            pooling="avg")` gives `(batch, 768)`.
        classes: number of classes; None keeps the checkpoint's head (1000
            without weights). Another number replaces the head by a
            zero-initialised one and drops `pre_logits`.
        classifier_activation: activation of the head; None for logits.
        include_preprocessing: if True the model takes raw pixels in
            [0, 255] and applies `(x - 127.5) / 127.5`.
        name: model name.
        gelu, layer_norm_epsilon, fc_norm, resnet_arithmetic, image_mean,
            image_std: the arithmetic. None (the default) takes it from
            the checkpoint's source library when `weights` is a timm or
            transformers checkpoint (`hf://...`, a Hub folder,
            `.safetensors`), else the official one: `gelu="tanh"` (or
            `"erf"`, exact), `layer_norm_epsilon=1e-6`, `fc_norm=False`
            (True: pool, then LayerNorm, as timm's gap models),
            `resnet_arithmetic="official"` (or `"timm"`: the hybrid stem's
            weight standardisation and GroupNorm epsilons), and input
            normalisation `image_mean=image_std=0.5` per channel on the
            [0, 1] scale, i.e. `(x - 127.5) / 127.5`.

    Returns:
        A functional `keras.Model`.

    Example:

    >>> model = VisionTransformer(
    ...     patch_size=4, hidden_size=48, num_layers=2, num_heads=3,
    ...     mlp_dim=96, input_shape=(32, 32, 3), classes=10)
    >>> model.output_shape
    (None, 10)
    """
    patch = _checks.positive_int_pair(patch_size, "patch_size")
    hidden_size = _checks.positive_int(hidden_size, "hidden_size")
    num_layers = _checks.positive_int(num_layers, "num_layers")
    num_heads = _checks.positive_int(num_heads, "num_heads")
    mlp_dim = _checks.positive_int(mlp_dim, "mlp_dim")
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}."
        )
    if classifier not in CLASSIFIERS:
        raise ValueError(
            f"Unknown classifier={classifier!r}; allowed: {CLASSIFIERS}."
        )
    if representation_size is not None:
        _checks.positive_int(representation_size, "representation_size")
    for rate_name, rate in (("dropout_rate", dropout_rate),
                            ("attention_dropout_rate", attention_dropout_rate),
                            ("drop_path_rate", drop_path_rate)):
        _checks.fraction(rate, rate_name)
    if resnet_layers is not None:
        if not isinstance(resnet_layers, (tuple, list)):
            raise TypeError(
                f"`resnet_layers` must be None or a tuple of ints, got {resnet_layers!r}."
            )
        resnet_layers = tuple(_checks.positive_int(n, "resnet_layers") for n in resnet_layers)
        _checks.positive_int(resnet_width, "resnet_width")
    classes = _common.check_classes(classes)
    pooling = _common.check_pooling(pooling, include_top, CLASSIFIERS)
    if pooling == "token" and classifier != "token":
        raise ValueError(
            "pooling='token' needs a class token, but this model has "
            f"classifier={classifier!r}. Use pooling='gap'."
        )

    config = dict(patch_size=patch, hidden_size=hidden_size, num_layers=num_layers,
                  num_heads=num_heads, mlp_dim=mlp_dim, resnet_layers=resnet_layers,
                  resnet_width=resnet_width)
    variant = find_variant("vit", config)
    description = variant.official_name if variant else "this VisionTransformer"

    resolved = resolve_weights(weights, variant, description)
    _common.check_family(resolved, "vit", description)
    if resolved is not None and resolved.info is not None \
            and resolved.info.classifier != classifier:
        raise _common.CheckpointMismatchError(
            f"Checkpoint {resolved.source} is a classifier="
            f"{resolved.info.classifier!r} model ("
            f"{'with' if resolved.info.classifier == 'token' else 'without'} "
            f"class token); build with classifier={resolved.info.classifier!r}."
        )
    classes, representation_size, dropped = _common.plan_head(
        resolved, include_top, pooling, classes, representation_size, description
    )
    effective = effective_patch_size(config)
    default_size = 224
    if resolved is not None and resolved.info is not None:
        default_size = resolved.info.grid[0] * effective[0]
    inputs, x, size = _common.image_input(
        input_tensor, input_shape, default_size, effective, description,
        pretrained=resolved is not None,
    )

    arith = _common.arithmetic(
        resolved, gelu=gelu, layer_norm_epsilon=layer_norm_epsilon, fc_norm=fc_norm,
        resnet_arithmetic=resnet_arithmetic, image_mean=image_mean, image_std=image_std)
    if include_preprocessing:
        x = _common.preprocessing_layer(arith["image_mean"], arith["image_std"])(x)
    if resnet_layers is not None:
        width = 64 * resnet_width
        stem = resnet_arithmetic_args(arith["resnet_arithmetic"])
        x = ResNetRoot(width, name="resnet_root", **stem)(x)
        for stage, units in enumerate(resnet_layers, start=1):
            for unit in range(1, units + 1):
                stride = 2 if stage > 1 and unit == 1 else 1
                x = BottleneckUnit(width * 2 ** (stage - 1), strides=stride,
                                   name=f"block{stage}_unit{unit}", **stem)(x)
    x = Patches(patch, name="patches")(x)
    x = PatchEncoder(hidden_size, use_class_token=classifier == "token",
                     grid_size=(size[0] // effective[0], size[1] // effective[1]),
                     name="patch_encoder")(x)
    x = keras.layers.Dropout(dropout_rate, name="encoder_dropout")(x)
    for i in range(num_layers):
        x = TransformerBlock(
            num_heads, mlp_dim, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=drop_path_rate * i / max(num_layers - 1, 1),
            layer_norm_epsilon=arith["layer_norm_epsilon"], gelu=arith["gelu"],
            name=f"encoderblock_{i}",
        )(x)
    x = _common.classification_head(
        x, "encoder_norm", classifier if include_top else pooling,
        representation_size, include_top, classes, classifier_activation,
        layer_norm_epsilon=arith["layer_norm_epsilon"], fc_norm=arith["fc_norm"],
        num_prefix_tokens=int(classifier == "token"),
    )
    if resolved is not None:
        resolved.dropped = dropped
    return _common.finish(inputs, x, name or "vision_transformer", resolved)


REGULARIZATION_ARGS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate",
                       "classifier", "representation_size")

_NAMED_DOC = """Builds {description} ({params}).

    {summary}

    Args:
        include_top, weights, input_tensor, input_shape, pooling, classes,
        classifier_activation, include_preprocessing, name: as in
            `keras_vit.VisionTransformer` (keras.applications style).
        **kwargs: {regularization}.

    Registered weights: {weights}.{imagenet}{architecture}

    Example:

    ```python
    model = keras_vit.{function}(weights="{example}")
    ```
    """


def default_name(variant: Variant) -> str:
    return variant.official_name.lower().replace("+", "_").replace("-", "_")


def apply_family_architecture(variant: Variant, weights: str | os.PathLike | None,
                              kwargs: dict) -> dict:
    """`kwargs` with the builder settings the files of `weights` need (a
    family's `architecture`, e.g. `weights="gsam"` ViTs: `classifier="gap",
    representation_size=None`) where the user did not pass them.

    Raises:
        ValueError: the user passed a conflicting value.
    """
    settings = architecture_for(weights, variant)
    if not settings:
        return kwargs
    kwargs = dict(kwargs)
    family = family_of(weights, variant)
    for key, value in settings.items():
        if key in kwargs and kwargs[key] != value:
            needed = ", ".join(f"{k}={v!r}" for k, v in settings.items())
            raise ValueError(
                f"weights={weights!r} loads {variant.official_name} files of the "
                f"{family.name!r} family, built with {needed}; got {key}="
                f"{kwargs[key]!r}. Leave `{key}` out (or pass {key}={value!r}), "
                f"or use other weights."
            )
        kwargs[key] = value
    return kwargs


def named_model_builder(variant: Variant, builder: Callable[..., keras.Model],
                        allowed_kwargs: Sequence[str], summary: str
                        ) -> Callable[..., keras.Model]:
    """Makes the one-line named function (`ViTB16`, `MixerB16`, ...).

    The function takes the keras.applications arguments plus
    `allowed_kwargs`; a registered `weights=` name whose family declares an
    `architecture` sets those arguments (see `apply_family_architecture`).
    """

    def build(include_top: bool = True, weights: str | os.PathLike | None = None,
              input_tensor: keras.KerasTensor | None = None,
              input_shape: tuple[int | None, int | None, int] | None = None,
              pooling: str | None = None, classes: int | None = None,
              classifier_activation: str | Callable | None = "softmax",
              include_preprocessing: bool = True, name: str | None = None,
              **kwargs: Any) -> keras.Model:
        unknown = sorted(set(kwargs) - set(allowed_kwargs))
        if unknown:
            raise TypeError(
                f"{variant.function}() got unexpected keyword arguments "
                f"{unknown}; allowed besides the keras.applications ones: "
                f"{list(allowed_kwargs)}."
            )
        kwargs = apply_family_architecture(variant, weights, kwargs)
        return builder(
            **variant.config, **kwargs, include_top=include_top,
            weights=weights, input_tensor=input_tensor,
            input_shape=input_shape, pooling=pooling, classes=classes,
            classifier_activation=classifier_activation,
            include_preprocessing=include_preprocessing,
            name=name or default_name(variant),
        )

    names = available_weights(variant)
    choice = imagenet_choice(variant)
    imagenet = ""
    if choice is not None:
        family = families_for(variant)[choice.weights]
        top1 = f", top-1 {choice.top1:g}%" if choice.top1 is not None else ""
        imagenet = (f"\n    `weights=\"imagenet\"` is {choice.weights!r} "
                    f"({family.resolution_for(variant.key)}px{top1}).")
    architecture = "".join(
        f"\n    `weights={f.name!r}` builds "
        + ", ".join(f"{k}={v!r}" for k, v in f.architecture.items())
        + " (the files' architecture)."
        for f in families_for(variant).values() if f.architecture)
    build.__name__ = build.__qualname__ = variant.function
    build.__doc__ = _NAMED_DOC.format(
        description=variant.official_name, function=variant.function,
        params=", ".join(f"{k}={v}" for k, v in variant.config.items()),
        summary=summary, regularization=", ".join(allowed_kwargs),
        weights=", ".join(names) if names else "none (weights=None or a file)",
        imagenet=imagenet, architecture=architecture,
        example=names[0] if names else "/path/to/checkpoint.npz",
    )
    return build


def _named(key: str) -> Callable[..., keras.Model]:
    return named_model_builder(
        VIT_VARIANTS[key], VisionTransformer, REGULARIZATION_ARGS,
        "Vision Transformer (Dosovitskiy et al., 2021).",
    )


ViTTi16 = _named("Ti/16")
ViTS16 = _named("S/16")
ViTS32 = _named("S/32")
ViTB8 = _named("B/8")
ViTB16 = _named("B/16")
ViTB32 = _named("B/32")
ViTL16 = _named("L/16")
ViTL32 = _named("L/32")
ViTH14 = _named("H/14")
RViTTi16 = _named("R+Ti/16")
R26ViTS32 = _named("R26+S/32")
R26ViTB32 = _named("R26+B/32")
R50ViTB16 = _named("R50+B/16")
R50ViTL32 = _named("R50+L/32")
