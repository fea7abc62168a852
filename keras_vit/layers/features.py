"""FeatureMap: one encoder block's output as a feature for a dense-prediction
head (a `features_only=True` model's outputs)."""

import keras
from keras import ops

from keras_vit import _checks

FEATURE_FORMATS = ("nhwc", "tokens")


@keras.saving.register_keras_serializable(package="keras_vit")
class FeatureMap(keras.layers.Layer):
    """A block's token sequence as a feature map `(batch, gh, gw, width)`, or
    as the sequence itself.

    Inputs: `[tokens, grid]`: the block's output `(batch, num_prefix_tokens
    + gh * gw, width)` and the patch grid the tokens were made from
    `(batch, gh, gw, channels)` (the `Patches` output, whose grid is that of
    each call's image size, so a model built with
    `input_shape=(None, None, 3)` gives each image size its own map).

    `"nhwc"`: the patch tokens (the first `num_prefix_tokens`, the class,
    distillation and register tokens, left out) in row-major grid order, as
    `Patches` made them, reshaped to `(batch, gh, gw, width)`. `"tokens"`:
    the sequence as it is, prefix tokens included.

    Args:
        num_prefix_tokens: leading tokens that are not patches (class,
            distillation and register tokens: 1 for a class-token ViT, 5
            for DINOv2 with 4 registers, 0 for SigLIP).
        feature_format: `"nhwc"` or `"tokens"`.
        reduction: `(rows, columns)` pixels of the image per token (the
            patch size, times the ResNet stride for hybrids): metadata for
            `keras_vit.models.feature_info`.
        block: the name of the block whose output this is (metadata, as
            timm's `feature_info` `module`).

    Example:

    >>> tokens = keras.ops.ones((2, 1 + 3 * 4, 8))
    >>> grid = keras.ops.ones((2, 3, 4, 48))
    >>> tuple(FeatureMap(num_prefix_tokens=1)([tokens, grid]).shape)
    (2, 3, 4, 8)
    """

    def __init__(self, num_prefix_tokens=0, feature_format="nhwc", reduction=(1, 1),
                 block=None, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = _checks.non_negative_int(num_prefix_tokens,
                                                          "num_prefix_tokens")
        if feature_format not in FEATURE_FORMATS:
            raise ValueError(f"Unknown feature_format={feature_format!r}; allowed: "
                             f"{FEATURE_FORMATS}.")
        self.feature_format = feature_format
        self.reduction = _checks.positive_int_pair(reduction, "reduction")
        self.block = block
        self.built = True

    def call(self, inputs):
        tokens, grid = inputs
        if self.feature_format == "tokens":
            return tokens
        patches = tokens[:, self.num_prefix_tokens:] if self.num_prefix_tokens else tokens
        gh, gw = grid.shape[1], grid.shape[2]
        batch = -1
        if gh is None or gw is None:  # a model for any size: the grid of this call
            shape = ops.shape(grid)
            gh = shape[1] if gh is None else gh
            gw = shape[2] if gw is None else gw
            batch = ops.shape(tokens)[0]
        return ops.reshape(patches, (batch, gh, gw, tokens.shape[-1]))

    def compute_output_shape(self, input_shape):
        tokens, grid = input_shape
        if self.feature_format == "tokens":
            return tuple(tokens)
        return (tokens[0], grid[1], grid[2], tokens[-1])

    def get_config(self):
        config = super().get_config()
        config.update({"num_prefix_tokens": self.num_prefix_tokens,
                       "feature_format": self.feature_format,
                       "reduction": self.reduction, "block": self.block})
        return config
