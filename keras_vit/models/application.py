"""The one application builder: what every model family shares.

A family (`models/vit.py`, `models/mixer.py`) checks its own arguments (the
shared ones with `models.arguments`) and supplies a pure encoder function,
preprocessed images -> token sequence;
`build_application` does the rest, as keras.applications builders do: the
weights (`keras_vit.weights.resolve`, read once into a `Checkpoint`), the
input (shape, size, preprocessing), the head or feature pooling, and
loading the checkpoint into the model; with `features_only=True`, the
model of the blocks' outputs (`feature_info` describes it).
`named_model_builder` makes the one-line named models (`ViTB16`,
`MixerB16`, ...) of the variants table.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import keras

from keras_vit.errors import CheckpointMismatchError
from keras_vit.labels import set_class_names
from keras_vit.layers import AttentionPooling, ClassifierHead, SequencePooling
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.layers.features import FeatureMap
from keras_vit.layers.preprocessing import ImageNormalization
from keras_vit.models.arguments import FEATURE_POOLINGS, PRE_LOGITS_POOLINGS
from keras_vit.variants import Variant
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.registry import (
    architecture_for,
    available_weights,
    families_for,
    family_of,
    imagenet_choice,
)
from keras_vit.weights.sources import resolve

logger = logging.getLogger("keras_vit")

IMAGE_MEAN = 127.5
IMAGE_STD = 127.5


def mixed_precision_head_dtype():
    """float32 for the final norm, pooling and head under a mixed policy."""
    policy = keras.config.dtype_policy()
    if policy.compute_dtype in ("float16", "bfloat16"):
        return "float32"
    return None


def looks_channels_first(input_shape):
    """Whether an image shape `(a, b, c)` reads as channels-first: a side of
    1 or 3 pixels before a channel count that is None or above 4 (an RGB
    or grayscale image of (3, 224, 224) or (1, 28, 28)), which channels-last
    would take as a 3-pixel-high image of 224 channels."""
    if len(input_shape) != 3:
        return False
    first, _, last = input_shape
    return first in (1, 3) and (last is None or (isinstance(last, int) and last > 4))


def channels_last_notice(description):
    """Says, once per model built, that the model is channels-last when
    `keras.config.image_data_format()` is "channels_first" (keras_vit builds
    every layer channels-last whatever that setting; a default model builds
    and is correct, it just takes (batch, height, width, channels))."""
    if keras.config.image_data_format() == "channels_first":
        logger.warning(
            "keras.config.image_data_format() is 'channels_first', but %s is "
            "built channels-last, as every keras_vit model: it takes images "
            "of shape (batch, height, width, channels), so transpose "
            "channels-first batches with keras.ops.transpose(x, (0, 2, 3, 1)).",
            description)


def image_input(input_tensor, input_shape, default_size, effective_patch,
                description, pretrained, mixer_grid=None, allow_dynamic=True):
    """Validates the input shape and returns `(inputs, x, (height, width))`.

    `effective_patch` is the pixel size of one token (patch x ResNet
    stride); the image must be a multiple of it. `mixer_grid`: the token
    grid a Mixer checkpoint was trained at (Mixers cannot change it).

    A side given as None (`input_shape=(None, None, 3)`, as
    keras.applications allows) makes a model that takes any size at call
    time; `allow_dynamic=False` (Mixers) refuses it. The returned
    `(height, width)` is then `default_size` for each None side: the size
    the position embedding is stored at (the checkpoint's, else 224).
    """
    given = "input_shape"
    if input_shape is None and input_tensor is not None:
        shape = tuple(input_tensor.shape)
        input_shape = shape[1:] if len(shape) == 4 else shape
        given = "the input_tensor's shape"
    if input_shape is None:
        input_shape = (default_size, default_size, 3)
    input_shape = tuple(input_shape)
    if looks_channels_first(input_shape):
        raise ValueError(
            f"{given}={input_shape} looks channels-first (channels, height, "
            "width); keras_vit models take channels-last images, (height, "
            "width, channels), whatever keras.config.image_data_format() "
            f"says: use input_shape={(*input_shape[1:], input_shape[0])} and "
            "transpose the images with keras.ops.transpose(x, (0, 2, 3, 1))."
        )

    def valid(d, may_be_none):
        if d is None:
            return may_be_none
        return isinstance(d, int) and not isinstance(d, bool) and d > 0

    if len(input_shape) != 3 or not (
        valid(input_shape[0], True) and valid(input_shape[1], True)
        and valid(input_shape[2], False)
    ):
        raise ValueError(
            "`input_shape` must be (height, width, channels) with positive "
            "ints (channels last; height and width may be None for any size "
            f"at call time), got {input_shape!r}."
        )
    height, width, channels = input_shape
    dynamic = height is None or width is None
    if dynamic and not allow_dynamic:
        raise ValueError(
            f"{description[:1].upper()}{description[1:]} cannot take "
            f"input_shape={input_shape}: an "
            "MLP-Mixer's token-mixing weights fix the number of patches, so "
            "its image size is fixed when it is built. Give the size, e.g. "
            f"input_shape=({default_size}, {default_size}, {channels}), and "
            "resize images to it."
        )
    if pretrained and channels != 3:
        raise ValueError(
            f"Pretrained weights expect 3 input channels (RGB), got "
            f"input_shape={input_shape}. Use weights=None for {channels} "
            "channels."
        )
    ph, pw = effective_patch
    if (height is not None and height % ph) or (width is not None and width % pw):
        suggest = tuple(None if s is None else max(1, round(s / p)) * p
                        for s, p in ((height, ph), (width, pw)))
        raise ValueError(
            f"Image size {(height, width)} is not divisible by the patch size "
            f"{(ph, pw)} of {description}; use a multiple, e.g. {suggest}."
        )
    if mixer_grid is not None and (height // ph, width // pw) != tuple(mixer_grid):
        trained = (mixer_grid[0] * ph, mixer_grid[1] * pw)
        raise ValueError(
            f"{description} checkpoints fix the number of patches: the "
            f"token-mixing weights were trained on {mixer_grid[0]}x"
            f"{mixer_grid[1]} patches ({trained[0]}x{trained[1]} pixels), "
            f"input_shape={input_shape} gives {height // ph}x{width // pw}. "
            "A Mixer cannot change resolution with pretrained weights: resize "
            f"images to {trained[0]}x{trained[1]} or use weights=None."
        )
    size = (default_size if height is None else height,
            default_size if width is None else width)
    if input_tensor is None:
        inputs = keras.layers.Input(shape=input_shape, name="images")
        return inputs, inputs, size
    if not keras.backend.is_keras_tensor(input_tensor):
        x = keras.layers.Input(tensor=input_tensor, shape=input_shape)
        return x, x, size
    inputs = keras.utils.get_source_inputs(input_tensor)
    return inputs, input_tensor, size


def preprocessing_layer(mean=None, std=None):
    """`(x - 127.5) / 127.5`: raw [0, 255] pixels to [-1, 1], exactly the
    official eval pipeline (an `ImageNormalization`: the channel count is
    checked).

    `mean`, `std`: per-channel values on the [0, 1] scale (timm's
    `pretrained_cfg`, transformers' `image_mean`/`image_std`), e.g. the
    ImageNet `(0.485, 0.456, 0.406)`, `(0.229, 0.224, 0.225)`; then
    `(x - 255 * mean) / (255 * std)`. None, or 0.5 for every channel, is
    the official form.
    """
    official = all(v is None or all(float(c) == 0.5 for c in v) for v in (mean, std))
    if official:
        return ImageNormalization(
            mean=IMAGE_MEAN, variance=IMAGE_STD**2, name="preprocessing"
        )
    mean = [255.0 * float(c) for c in (mean if mean is not None else (0.5,) * 3)]
    std = [255.0 * float(c) for c in (std if std is not None else (0.5,) * 3)]
    return ImageNormalization(
        mean=mean, variance=[s * s for s in std], name="preprocessing"
    )


def plan_head(checkpoint, info, include_top, pooling, classes, representation_size,
              description):
    """Decides classes, representation size and which checkpoint parts to
    drop. `info`: the checkpoint's `CheckpointInfo` (None without weights or
    for a Keras weights file). Returns `(classes, representation_size,
    dropped_prefixes)`."""
    if info is None:
        if classes is None:
            classes = 1000
        return classes, representation_size, ()
    if include_top and classes is None:
        if info.classes is None:
            raise ValueError(
                f"Checkpoint {checkpoint.source} has no classification head; "
                "pass `classes=` to build a new one."
            )
        classes = info.classes
    keep_head = include_top and classes == info.classes
    uses_pre_logits = include_top or pooling in PRE_LOGITS_POOLINGS
    if representation_size is None:
        if info.representation_size and uses_pre_logits and (
            keep_head or not include_top
        ):
            representation_size = info.representation_size
    elif representation_size != info.representation_size:
        raise ValueError(
            f"`representation_size={representation_size}` does not match "
            f"checkpoint {checkpoint.source}, whose pre_logits layer has "
            f"{info.representation_size} units (None: no pre_logits). Leave "
            "it as None."
        )
    dropped = []
    if include_top and info.classes is None:
        dropped.append("head/")  # the new head keeps its zero initialisation
        logger.info(
            "%s: checkpoint %s has no classification head; adding a zero-initialised "
            "%d-class head, as the official fine-tuning does.", description,
            checkpoint.source, classes)
    if not keep_head and info.classes is not None:
        dropped.append("head/")
        if include_top:
            logger.info(
                "%s: replacing the checkpoint's %d-class head with a "
                "zero-initialised %d-class head%s, as the official fine-tuning "
                "does.", description, info.classes, classes,
                " and dropping pre_logits"
                if info.representation_size and not representation_size else "",
            )
    if info.representation_size and (not representation_size or not uses_pre_logits):
        dropped.append("pre_logits/")
    if info.distilled_head and "head/" in dropped:
        dropped.append("head_dist/")  # DeiT's second head goes with the first
    return classes, representation_size, tuple(dropped)


ARITHMETIC_DEFAULTS = dict(gelu="tanh", layer_norm_epsilon=1e-6, fc_norm=False,
                          resnet_arithmetic="official", image_mean=None, image_std=None,
                          rope=None)


def arithmetic(checkpoint, defaults=None, **given):
    """The builder's arithmetic arguments: each the user's value when not
    None, else the checkpoint's (timm / transformers weights carry their
    library's), else the named variant's (`defaults`: a Hub family's, e.g.
    DINOv2's erf GELU), else the official default (`ARITHMETIC_DEFAULTS`)."""
    out = {}
    source = checkpoint.arithmetic if checkpoint is not None else {}
    pre = (checkpoint.preprocessing if checkpoint is not None else None) or {}
    for key, default in {**ARITHMETIC_DEFAULTS, **(defaults or {})}.items():
        value = given.get(key)
        if value is None:
            value = pre.get(key[len("image_"):]) if key.startswith("image_") \
                else source.get(key)
        out[key] = default if value is None else value
    for key in ("image_mean", "image_std"):
        value = out[key]
        if value is not None:
            value = (value,) * 3 if isinstance(value, (int, float)) else tuple(value)
            if len(value) != 3 or not all(isinstance(v, (int, float)) for v in value) \
                    or (key == "image_std" and min(value) <= 0):
                raise ValueError(
                    f"`{key}` must be a number or 3 numbers on the [0, 1] scale"
                    f"{' (positive)' if key == 'image_std' else ''}, got {value!r}.")
            out[key] = value
    return out


def classification_head(x, norm_name, pool, representation_size, include_top,
                        classes, classifier_activation, layer_norm_epsilon=1e-6,
                        fc_norm=False, num_prefix_tokens=0, extra_prefix_tokens=0,
                        attention_pool=None, gelu="tanh"):
    """Final LayerNorm, pooling, optional `pre_logits` (Dense + tanh) and
    the zero-initialised head; float32 under a mixed-precision policy.

    `pool`: "token" / "gap" (then pre_logits when `representation_size`),
    or the feature poolings "avg" / "max" over the patch tokens (the first
    `num_prefix_tokens` left out), never followed by pre_logits. With
    `extra_prefix_tokens` (register or distillation tokens), "gap" leaves
    out every prefix token too (timm's `global_pool="avg"`); without, it
    averages every token (the official "gap").

    `pool="token_dist"` (DeiT's distilled classifier) and `"token_avg"`
    (DINOv2's linear classifier): the head reads two tokens side by side
    (`SequencePooling`); `"distilled"`, their mean without a head.

    `fc_norm=True` (timm's `gap` models): pool first, then the LayerNorm
    (named "fc_norm"); the sequence itself is not normalised.

    `pool="map"`: the attention-pooling head (`AttentionPooling`, named
    "map_head") of `attention_pool` (its `num_heads`, `mlp_dim`) with the
    model's `gelu` and epsilon, over the patch tokens (a "map" model's prefix
    tokens are registers or a distillation token, which timm leaves out)."""
    dtype = mixed_precision_head_dtype()
    if not fc_norm:
        x = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name=norm_name)(x)
    if pool == "map":
        x = AttentionPooling(**attention_pool, layer_norm_epsilon=layer_norm_epsilon,
                             gelu=gelu, num_prefix_tokens=num_prefix_tokens, dtype=dtype,
                             name="map_head")(x)
    elif pool is not None:
        prefix = (num_prefix_tokens if pool in FEATURE_POOLINGS or pool == "token_avg"
                  or (pool == "gap" and extra_prefix_tokens) else 0)
        x = SequencePooling(pool, num_prefix_tokens=prefix, dtype=dtype, name="pool")(x)
        if fc_norm:
            x = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="fc_norm")(x)
        if representation_size and pool in PRE_LOGITS_POOLINGS:
            x = keras.layers.Dense(representation_size, activation="tanh",
                                   dtype=dtype, name="pre_logits")(x)
    if include_top:
        x = ClassifierHead(classes, activation=classifier_activation,
                           kernel_initializer="zeros", dtype=dtype, name="head")(x)
    return x


def check_checkpoint(checkpoint, info, family, classifier, description):
    """A CheckpointMismatchError when the checkpoint is of another family
    (a Mixer's for a ViT) or, for a ViT, has another classifier."""
    if info is None:
        return
    if info.family != family:
        other = "a Mixer" if info.family == "mixer" else "a ViT"
        raise CheckpointMismatchError(
            f"Checkpoint {checkpoint.source} is {other} checkpoint; it does not "
            f"fit {description}. To build the model the file describes, use "
            "keras_vit.model_from_checkpoint(path) (command line: keras-vit "
            "predict --model auto)."
        )
    if info.classifier != classifier:
        raise CheckpointMismatchError(
            f"Checkpoint {checkpoint.source} is a classifier="
            f"{info.classifier!r} model ("
            f"{'with' if info.classifier == 'token' else 'without'} "
            f"class token); build with classifier={info.classifier!r}."
        )


def head_pooling(encoder, info):
    """The pooling the classification head reads: the encoder's
    classifier, except for a model with a distillation token, whose head is
    DeiT's distilled classifier (`"token_dist"`: a head on the class token
    and one on the distillation token, averaged, which is one Dense on the
    two tokens side by side), unless the checkpoint's head reads the class
    token alone (transformers' `DeiTForImageClassification`)."""
    single = info is not None and info.classes is not None and not info.distilled_head
    if encoder.distillation_token and encoder.classifier == "token" and not single:
        return "token_dist"
    return encoder.classifier


def load_checkpoint(model, checkpoint, dropped):
    """Loads `checkpoint` into `model` (all but the `dropped` prefixes) and
    gives a kept head the class names the checkpoint carries."""
    checkpoint.load(model, dropped)
    names = checkpoint.class_names
    if names and "head/" not in dropped and isinstance(model.layers[-1], ClassifierHead) \
            and model.output_shape[-1] == len(names):
        set_class_names(model, names)  # the config's id2label / label_names


@dataclasses.dataclass(frozen=True)
class Encoder:
    """What a model family gives `build_application`.

    Attributes:
        family: "vit" or "mixer" (the checkpoint family it loads).
        encode: `encode(x, grid_size, arithmetic) -> tokens`: the family's
            pure encoder function on preprocessed images, its architecture
            bound; `grid_size` the token grid, `arithmetic` the resolved
            arithmetic arguments (`ARITHMETIC_DEFAULTS`' keys).
        effective_patch: pixels per token (patch x ResNet stride).
        classifier: the head's pooling, "token", "gap", "token_avg" or
            "map" (`VisionTransformer`'s `classifier`).
        num_prefix_tokens: tokens before the patch tokens (class,
            distillation and register tokens).
        norm_name: the final LayerNorm's name (the official one).
        description: the model's name in messages.
        default_name: the Keras model's name when `name` is None.
        fixed_grid: whether a checkpoint fixes the token grid (Mixers).
        attention_pool: for classifier "map", the attention-pooling head's
            `num_heads` and `mlp_dim` (`AttentionPooling`).
        extra_prefix_tokens: register and distillation tokens among the
            prefix tokens ("gap" then averages the patch tokens only).
        distillation_token: whether a distillation token follows the class
            token (`head_pooling`).
    """

    family: str
    encode: Callable[[Any, tuple[int, int], dict], Any]
    effective_patch: tuple[int, int]
    classifier: str
    num_prefix_tokens: int
    norm_name: str
    description: str
    default_name: str
    fixed_grid: bool = False
    attention_pool: dict | None = None
    extra_prefix_tokens: int = 0
    distillation_token: bool = False


def build_application(
    encoder: Encoder,
    *,
    variant: Variant | None,
    weights: str | os.PathLike | Checkpoint | None,
    include_top: bool,
    input_tensor: keras.KerasTensor | None,
    input_shape: tuple[int | None, int | None, int] | None,
    pooling: str | None,
    classes: int | None,
    classifier_activation: str | Callable | None,
    include_preprocessing: bool,
    name: str | None,
    representation_size: int | None = None,
    ema: bool = False,
    out_indices: tuple[int, ...] | None = None,
    feature_format: str = "nhwc",
    default_size: int = 224,
    arithmetic_defaults: dict | None = None,
    **given_arithmetic: Any,
) -> keras.Model:
    """Builds a keras.applications-style model around `encoder`: weights,
    input, preprocessing, head or pooling; the checkpoint loaded last.

    The family's builder has checked its arguments (`arguments.check_classes`,
    `check_pooling`, `check_feature_args`); `given_arithmetic`: the
    arithmetic arguments the user gave (None: from the checkpoint, else
    official; `arithmetic_defaults`: a named Hub variant's, before the
    official). `default_size`: the input side without a checkpoint (224; a
    Hub variant's native size). `out_indices` (absolute block indices): the
    `features_only=True` model of those blocks' outputs (`features_model`),
    built after the checkpoint is loaded into the model without head, so
    that every weights source loads as it does for `include_top=False`.

    Example (what `VisionTransformer` does):

    ```python
    encoder = Encoder("vit", encode, (16, 16), "token", 1, "encoder_norm",
                      "ViT-B_16", "vit_b16")
    model = build_application(encoder, variant=None, weights=None, ...)
    ```
    """
    description = encoder.description
    if out_indices is not None:
        include_top, pooling = False, None
    checkpoint = resolve(weights, variant, description, ema=ema)
    info = checkpoint.info() if checkpoint is not None else None
    check_checkpoint(checkpoint, info, encoder.family, encoder.classifier, description)
    classes, representation_size, dropped = plan_head(
        checkpoint, info, include_top, pooling, classes, representation_size, description)
    effective = encoder.effective_patch
    grid = info.grid if info is not None else None
    # without a grid in the weights (RoPE alone: DINOv3), the size the checkpoint says
    said = ((checkpoint.preprocessing or {}).get("input_size") if checkpoint else None) or ()
    default_size = (grid[0] * effective[0] if grid is not None
                    else int(said[-1]) if len(said) == 3 else default_size)
    channels_last_notice(description)
    inputs, x, size = image_input(
        input_tensor, input_shape, default_size, effective, description,
        pretrained=checkpoint is not None,
        mixer_grid=grid if encoder.fixed_grid else None,
        allow_dynamic=not encoder.fixed_grid)
    arith = arithmetic(checkpoint, arithmetic_defaults, **given_arithmetic)
    if arith["fc_norm"] and not include_top and pooling is None:
        # fc_norm normalises the pooled vector: the token sequence (timm's
        # forward_features) and the blocks' outputs have none to load.
        dropped = (*dropped, "fc_norm/")
    if include_preprocessing:
        x = preprocessing_layer(arith["image_mean"], arith["image_std"])(x)
    x = encoder.encode(x, (size[0] // effective[0], size[1] // effective[1]), arith)
    x = classification_head(
        x, encoder.norm_name, head_pooling(encoder, info) if include_top else pooling,
        representation_size, include_top, classes, classifier_activation,
        layer_norm_epsilon=arith["layer_norm_epsilon"], fc_norm=arith["fc_norm"],
        num_prefix_tokens=encoder.num_prefix_tokens,
        attention_pool=encoder.attention_pool, gelu=arith["gelu"],
        extra_prefix_tokens=encoder.extra_prefix_tokens)
    model = keras.Model(inputs, x, name=name or encoder.default_name)
    if checkpoint is not None:
        load_checkpoint(model, checkpoint, dropped)
    if out_indices is not None:
        model = features_model(model, inputs, encoder, out_indices, feature_format)
    return model


def features_model(model: keras.Model, inputs: Any, encoder: Encoder,
                   out_indices: Sequence[int], feature_format: str) -> keras.Model:
    """The `features_only=True` model of `model` (built without head from
    `inputs`): the outputs of its blocks `out_indices` (absolute, in that
    order), each through a `FeatureMap` named `<block>_features`; the
    blocks after the last one asked for are left out, as timm prunes them."""
    blocks = encoder_blocks(model)
    grid = model.get_layer("patches").output
    outputs = [
        FeatureMap(encoder.num_prefix_tokens, feature_format, encoder.effective_patch,
                   block=blocks[i].name, name=f"{blocks[i].name}_features")(
            [blocks[i].output, grid])
        for i in out_indices]
    return keras.Model(inputs, outputs, name=model.name)


def feature_info(model: keras.Model) -> list[dict]:
    """What each output of a `features_only=True` model is, as timm's
    `model.feature_info`: a list, in the order of the outputs, of
    `{"module": the block's layer name, "index": its index among the
    blocks, "num_chs": channels, "reduction": pixels of the image per
    feature-map position}`. The reduction is the patch size (an int; a
    `(rows, columns)` pair for a non-square patch), times the ResNet
    stride for hybrids (R50+ViT-B/16: the ResNet's stride 16 times its
    1x1 patch, 16; R26+ViT-S/32: 32).

    It is read from the model's layers, so it holds for a model reloaded
    from a `.keras` file.

    Raises:
        TypeError: `model` is not a `keras.Model`.
        ValueError: `model` is not a `features_only=True` model.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=4, hidden_size=48, num_layers=3, num_heads=3, mlp_dim=96,
    ...     input_shape=(32, 32, 3), features_only=True, out_indices=(0, 2))
    >>> [(info["module"], info["num_chs"], info["reduction"])
    ...  for info in keras_vit.models.feature_info(model)]
    [('encoderblock_0', 48, 4), ('encoderblock_2', 48, 4)]
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model, got {type(model).__name__}.")
    names = getattr(model, "output_names", None) or []
    layers = [model.get_layer(name) for name in names]
    if not layers or not all(isinstance(layer, FeatureMap) for layer in layers):
        raise ValueError(
            f"{model.name!r} is not a features_only model (its outputs are not the "
            "blocks' feature maps); build one with features_only=True, e.g. "
            "keras_vit.ViTB16(features_only=True, out_indices=(3, 5, 7, 11)).")
    blocks = [block.name for block in encoder_blocks(model)]
    info = []
    for layer, output in zip(layers, model.outputs, strict=True):
        rows, columns = layer.reduction
        info.append({"module": layer.block, "index": blocks.index(layer.block),
                     "num_chs": int(output.shape[-1]),
                     "reduction": rows if rows == columns else (rows, columns)})
    return info


_NAMED_DOC = """Builds {description} ({params}).

    {summary}

    Args:
        include_top, weights, input_tensor, input_shape, pooling, classes,
        classifier_activation, include_preprocessing, name: as in
            `keras_vit.VisionTransformer` (keras.applications style).
        ema: with a PyTorch training checkpoint as `weights`, its EMA
            weights (`state_dict_ema` / `model_ema`).
        features_only, out_indices, feature_format: the blocks' outputs
            for dense prediction (timm's `features_only=True`), as in
            `keras_vit.VisionTransformer`; `keras_vit.models.feature_info`
            describes them.
        remat: rematerialise each block in training (gradient
            checkpointing), as in `keras_vit.VisionTransformer`.
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
              ema: bool = False, features_only: bool = False,
              out_indices: int | Sequence[int] | None = None,
              feature_format: str | None = None, remat: bool = False,
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
            name=name or default_name(variant), ema=ema, features_only=features_only,
            out_indices=out_indices, feature_format=feature_format, remat=remat,
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
