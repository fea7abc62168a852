"""Patches: cut an image into non-overlapping patches (ViT paper, Sec. 3.1)."""

import keras
from keras import ops

from keras_vit.layers._utils import to_pair


@keras.saving.register_keras_serializable(package="keras_vit")
class Patches(keras.layers.Layer):
    """Splits images into non-overlapping `patch_size` patches.

    The patch grid is kept: an input of shape `(N, H, W, C)` becomes
    `(N, H // ph, W // pw, ph * pw * C)`, each patch flattened in
    `(row, column, channel)` order, which is the order of the official
    `embedding/kernel (ph, pw, C, D)` once reshaped to `(ph * pw * C, D)`.
    A strided convolution with kernel = stride = patch size is exactly
    `PatchEncoder(Patches(x))`.

    Args:
        patch_size: int or `(height, width)` of a patch.

    Example:

    >>> x = keras.ops.ones((2, 32, 32, 3))
    >>> Patches(16)(x).shape
    (2, 2, 2, 768)
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = to_pair(patch_size, "patch_size")

    def _grid(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                "Patches expects images of shape (batch, height, width, "
                f"channels), got shape {tuple(input_shape)}."
            )
        _, h, w, c = input_shape
        if h is None or w is None or c is None:
            raise ValueError(
                "Patches needs a static height, width and channel count, got "
                f"shape {tuple(input_shape)}. Build the model with a fixed "
                "`input_shape`."
            )
        ph, pw = self.patch_size
        if h % ph or w % pw:
            raise ValueError(
                f"Image size {(h, w)} is not divisible by the patch size "
                f"{self.patch_size}."
            )
        return h // ph, w // pw, c

    def build(self, input_shape):
        self._grid(input_shape)
        self.built = True

    def call(self, inputs):
        gh, gw, c = self._grid(inputs.shape)
        ph, pw = self.patch_size
        if (ph, pw) == (1, 1):
            return inputs
        x = ops.reshape(inputs, (-1, gh, ph, gw, pw, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (-1, gh, gw, ph * pw * c))

    def compute_output_shape(self, input_shape):
        gh, gw, c = self._grid(input_shape)
        ph, pw = self.patch_size
        return (input_shape[0], gh, gw, ph * pw * c)

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config
