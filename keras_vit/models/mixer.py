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
from keras_vit.models import _common
from keras_vit.variants import MIXER_VARIANTS, find_variant
from keras_vit.models.vit import named_model_builder
from keras_vit.weights.resolve import resolve_weights


def MLPMixer(
    patch_size: int | tuple[int, int],
    hidden_size: int,
    num_blocks: int,
    tokens_mlp_dim: int,
    channels_mlp_dim: int,
    drop_path_rate: float = 0.0,
    include_top: bool = True,
    weights: str | os.PathLike | None = None,
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
        pooling: with `include_top=False`: None returns the patch sequence
            after the final LayerNorm `(batch, patches, hidden_size)`;
            `"gap"` or `"avg"` its mean over the patches (the official
            Mixer's own pooling), `"max"` its maximum: `(batch,
            hidden_size)`, the keras.applications `pooling=` values.
        gelu, layer_norm_epsilon, image_mean, image_std: the arithmetic, as
            in `keras_vit.VisionTransformer`: None takes it from a timm
            checkpoint (exact GELU, its mean/std), else the official one.

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
    classes = _common.check_classes(classes)
    pooling = _common.check_pooling(pooling, include_top, ("gap",))

    config = dict(patch_size=patch, hidden_size=hidden_size, num_blocks=num_blocks,
                  tokens_mlp_dim=tokens_mlp_dim, channels_mlp_dim=channels_mlp_dim)
    variant = find_variant("mixer", config)
    description = variant.official_name if variant else "this MLPMixer"
    resolved = resolve_weights(weights, variant, description)
    _common.check_family(resolved, "mixer", description)
    classes, _, dropped = _common.plan_head(
        resolved, include_top, pooling, classes, None, description
    )
    default_size, grid = 224, None
    if resolved is not None and resolved.info is not None:
        grid = resolved.info.grid
        default_size = grid[0] * patch[0]
    inputs, x, (height, width) = _common.image_input(
        input_tensor, input_shape, default_size, patch, description,
        pretrained=resolved is not None, mixer_grid=grid, allow_dynamic=False,
    )
    tokens = (height // patch[0]) * (width // patch[1])

    arith = _common.arithmetic(resolved, gelu=gelu, layer_norm_epsilon=layer_norm_epsilon,
                               image_mean=image_mean, image_std=image_std)
    if include_preprocessing:
        x = _common.preprocessing_layer(arith["image_mean"], arith["image_std"])(x)
    x = Patches(patch, name="patches")(x)
    x = keras.layers.Dense(hidden_size, name="stem")(x)
    x = keras.layers.Reshape((tokens, hidden_size), name="tokens")(x)
    for i in range(num_blocks):
        x = MixerBlock(
            tokens_mlp_dim, channels_mlp_dim,
            drop_path_rate=drop_path_rate * i / max(num_blocks - 1, 1),
            layer_norm_epsilon=arith["layer_norm_epsilon"], gelu=arith["gelu"],
            name=f"mixerblock_{i}",
        )(x)
    x = _common.classification_head(
        x, "pre_head_layer_norm", "gap" if include_top else pooling, None,
        include_top, classes, classifier_activation,
        layer_norm_epsilon=arith["layer_norm_epsilon"],
    )
    if resolved is not None:
        resolved.dropped = dropped
    return _common.finish(inputs, x, name or "mlp_mixer", resolved)


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
