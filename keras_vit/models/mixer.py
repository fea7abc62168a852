"""MLPMixer: the MLP-Mixer builder and the named Mixers.

Architecture as the official `vit_jax/models_mixer.py`:

```
images ─► (x - 127.5) / 127.5 ─► Patches ─► Dense "stem" ─► MixerBlock × L
  ─► LayerNorm ─► mean over patches ─► head
```
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import keras

from keras_vit import _checks
from keras_vit.layers import MixerBlock, Patches
from keras_vit.models.application import Encoder, build_application, named_model_builder
from keras_vit.models.arguments import (
    check_classes,
    check_feature_args,
    check_pooling,
    check_remat,
)
from keras_vit.variants import MIXER_VARIANTS, find_variant
from keras_vit.weights.checkpoint import Checkpoint


def MLPMixer(
    patch_size: int | tuple[int, int],
    hidden_size: int,
    num_blocks: int,
    tokens_mlp_dim: int,
    channels_mlp_dim: int,
    drop_path_rate: float = 0.0,
    include_top: bool = True,
    weights: str | os.PathLike | Checkpoint | None = None,
    input_tensor: keras.KerasTensor | None = None,
    input_shape: tuple[int, int, int] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | Callable | None = "softmax",
    include_preprocessing: bool = True,
    name: str | None = None,
    gelu: str | None = None,
    layer_norm_epsilon: float | None = None,
    image_mean: float | Sequence[float] | None = None,
    image_std: float | Sequence[float] | None = None,
    ema: bool = False,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    feature_format: str | None = None,
    remat: bool = False,
) -> keras.Model:
    """Builds an MLP-Mixer.

    Reference: Tolstikhin et al., "MLP-Mixer: An all-MLP Architecture for
    Vision" (NeurIPS 2021). Argument names follow the official config
    (`hidden_dim` is called `hidden_size` here, as for ViT).

    Args:
        patch_size: int or (h, w).
        hidden_size: channels per patch (official `hidden_dim`).
        num_blocks: number of Mixer blocks.
        tokens_mlp_dim, channels_mlp_dim: MLP widths of the two mixings.
        drop_path_rate: stochastic depth of the last block (0 in the paper);
            block i uses `drop_path_rate * i / (num_blocks - 1)`.
        include_top, weights, input_tensor, classes,
        classifier_activation, include_preprocessing, name: as in
            `keras_vit.VisionTransformer`.
        input_shape: `(height, width, channels)`, multiples of the patch
            size; defaults to the checkpoint's resolution, else 224. A
            Mixer's token-mixing weights fix the number of patches: with
            pretrained weights `input_shape` must be the checkpoint's
            resolution, and a None side (`(None, None, 3)`, any size at
            call time, which `VisionTransformer` takes) is a `ValueError`.
            Channels last, as in `keras_vit.VisionTransformer`.
        pooling: with `include_top=False`: None returns the patch sequence
            after the final LayerNorm `(batch, patches, hidden_size)`;
            `"gap"` or `"avg"` its mean over the patches (the official
            Mixer's own pooling), `"max"` its maximum: `(batch,
            hidden_size)`, the keras.applications `pooling=` values.
        gelu, layer_norm_epsilon, image_mean, image_std: the arithmetic, as
            in `keras_vit.VisionTransformer`: None takes it from a timm
            checkpoint (exact GELU, its mean/std), else the official one.
        ema: as in `keras_vit.VisionTransformer`.
        features_only, out_indices, feature_format: the blocks' outputs for
            dense prediction, as in `keras_vit.VisionTransformer`: `"nhwc"`
            maps `(batch, H / p, W / p, hidden_size)` or `"tokens"`
            `(batch, patches, hidden_size)` (a Mixer has no class token).
        remat: rematerialise each Mixer block in training (gradient
            checkpointing), as in `keras_vit.VisionTransformer`.

    Example:

    >>> model = MLPMixer(patch_size=4, hidden_size=48, num_blocks=2,
    ...                  tokens_mlp_dim=24, channels_mlp_dim=96,
    ...                  input_shape=(32, 32, 3), classes=10)
    >>> model.output_shape
    (None, 10)
    >>> features = MLPMixer(patch_size=4, hidden_size=48, num_blocks=2,
    ...                     tokens_mlp_dim=24, channels_mlp_dim=96,
    ...                     input_shape=(32, 32, 3), include_top=False,
    ...                     pooling="avg")
    >>> features.output_shape
    (None, 48)
    """
    patch = _checks.positive_int_pair(patch_size, "patch_size")
    hidden_size = _checks.positive_int(hidden_size, "hidden_size")
    num_blocks = _checks.positive_int(num_blocks, "num_blocks")
    tokens_mlp_dim = _checks.positive_int(tokens_mlp_dim, "tokens_mlp_dim")
    channels_mlp_dim = _checks.positive_int(channels_mlp_dim, "channels_mlp_dim")
    _checks.fraction(drop_path_rate, "drop_path_rate")
    out_indices, feature_format = check_feature_args(
        features_only, out_indices, feature_format, num_blocks, pooling=pooling,
        classes=classes)
    include_top = include_top and out_indices is None
    remat = check_remat(remat)
    classes = check_classes(classes)
    pooling = check_pooling(pooling, include_top, ("gap",))

    config = dict(patch_size=patch, hidden_size=hidden_size, num_blocks=num_blocks,
                  tokens_mlp_dim=tokens_mlp_dim, channels_mlp_dim=channels_mlp_dim)
    variant = find_variant("mixer", config)

    def encode(x, grid_size, arith):
        return mixer_encoder(x, **config, grid_size=grid_size, drop_path_rate=drop_path_rate,
                             gelu=arith["gelu"], layer_norm_epsilon=arith["layer_norm_epsilon"],
                             remat=remat)

    encoder = Encoder(
        "mixer", encode, patch, "gap", num_prefix_tokens=0, norm_name="pre_head_layer_norm",
        description=variant.official_name if variant else "this MLPMixer",
        default_name="mlp_mixer", fixed_grid=True)
    return build_application(
        encoder, variant=variant, weights=weights, include_top=include_top,
        input_tensor=input_tensor, input_shape=input_shape, pooling=pooling,
        classes=classes, classifier_activation=classifier_activation,
        include_preprocessing=include_preprocessing, name=name, gelu=gelu,
        layer_norm_epsilon=layer_norm_epsilon, image_mean=image_mean, image_std=image_std,
        ema=ema, out_indices=out_indices, feature_format=feature_format)


def mixer_encoder(
    x: keras.KerasTensor,
    *,
    patch_size: tuple[int, int],
    hidden_size: int,
    num_blocks: int,
    tokens_mlp_dim: int,
    channels_mlp_dim: int,
    grid_size: tuple[int, int],
    drop_path_rate: float = 0.0,
    gelu: str = "tanh",
    layer_norm_epsilon: float = 1e-6,
    remat: bool = False,
) -> keras.KerasTensor:
    """The Mixer encoder as the official `MlpMixer` up to its final
    LayerNorm: preprocessed images `(batch, H, W, 3)` -> the patch sequence
    `(batch, patches, hidden_size)`, with the official layer names.

    `grid_size`: the patch grid of the images (it fixes the token-mixing
    weights). `remat`: rematerialised blocks (`MixerBlock(remat=True)`).

    Example:

    >>> images = keras.Input((32, 32, 3))
    >>> mixer_encoder(images, patch_size=(4, 4), hidden_size=48, num_blocks=2,
    ...               tokens_mlp_dim=24, channels_mlp_dim=96, grid_size=(8, 8)).shape
    (None, 64, 48)
    """
    tokens = grid_size[0] * grid_size[1]
    x = Patches(patch_size, name="patches")(x)
    x = keras.layers.Dense(hidden_size, name="stem")(x)
    x = keras.layers.Reshape((tokens, hidden_size), name="tokens")(x)
    for i in range(num_blocks):
        x = MixerBlock(
            tokens_mlp_dim, channels_mlp_dim,
            drop_path_rate=drop_path_rate * i / max(num_blocks - 1, 1),
            layer_norm_epsilon=layer_norm_epsilon, gelu=gelu, remat=remat,
            name=f"mixerblock_{i}",
        )(x)
    return x


def _named(key: str) -> Callable[..., keras.Model]:
    return named_model_builder(
        MIXER_VARIANTS[key], MLPMixer, ("drop_path_rate",),
        "MLP-Mixer (Tolstikhin et al., 2021).",
    )


MixerS8 = _named("S/8")
MixerS16 = _named("S/16")
MixerS32 = _named("S/32")
MixerB16 = _named("B/16")
MixerB32 = _named("B/32")
MixerL16 = _named("L/16")
