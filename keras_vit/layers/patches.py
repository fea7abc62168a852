"""Patches: cut an image into non-overlapping patches (ViT paper, Sec. 3.1)."""

import keras
from keras import ops

from keras_vit import _checks
from keras_vit.layers._utils import checked_channels


@keras.saving.register_keras_serializable(package="keras_vit")
class Patches(keras.layers.Layer):
    """Splits images into non-overlapping `patch_size` patches.

    The patch grid is kept: an input of shape `(N, H, W, C)` becomes
    `(N, H // ph, W // pw, ph * pw * C)`, each patch flattened in
    `(row, column, channel)` order, which is the order of the official
    `embedding/kernel (ph, pw, C, D)` once reshaped to `(ph * pw * C, D)`.
    A strided convolution with kernel = stride = patch size is exactly
    `PatchEncoder(Patches(x))`.

    Height and width may be unknown when the layer is built (a model built
    with `input_shape=(None, None, 3)`); each image must then have sides
    that are multiples of the patch size. A static side that is not raises
    a `ValueError` (eager calls, JAX, fixed-size models); in a TensorFlow
    graph with unknown sides the reshape fails when the graph runs.

    Args:
        patch_size: int or `(height, width)` of a patch.

    Example:

    >>> x = keras.ops.ones((2, 32, 32, 3))
    >>> tuple(Patches(16)(x).shape)
    (2, 2, 2, 768)
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = _checks.positive_int_pair(patch_size, "patch_size")

    def _grid(self, input_shape):
        """`(grid_h, grid_w, channels)`; a grid side is None where the image
        side is unknown (a model built with `input_shape=(None, None, 3)`)."""
        if len(input_shape) != 4:
            raise ValueError(
                "Patches expects images of shape (batch, height, width, "
                f"channels), got shape {tuple(input_shape)}."
            )
        _, h, w, c = input_shape
        if c is None:
            raise ValueError(
                "Patches needs a static channel count, got shape "
                f"{tuple(input_shape)}."
            )
        ph, pw = self.patch_size
        if (h is not None and h % ph) or (w is not None and w % pw):
            raise ValueError(
                f"Image size {(h, w)} is not divisible by the patch size "
                f"{self.patch_size}. Height and width must be multiples of it."
            )
        return (None if h is None else h // ph), (None if w is None else w // pw), c

    def build(self, input_shape):
        """Records the channel count images must have (the input's last axis)."""
        self._channels = self._grid(input_shape)[2]
        self.built = True

    def call(self, inputs):
        """The patch grid `(batch, grid_h, grid_w, ph * pw * channels)` of
        images `(batch, height, width, channels)`; a ValueError for a
        channel count other than the built one or a static side that is
        not a multiple of the patch size."""
        # Static sides (eager, JAX, a fixed-size model) are checked here; a
        # side only known when the graph runs (a TensorFlow graph of a
        # dynamic-size model) is not: an image whose side is not a multiple
        # of the patch then fails in the reshape below ("Input to reshape
        # is a tensor with ... values"), never silently (the batch size is
        # explicit, so no other reading of the pixels fits).
        inputs = checked_channels(inputs, getattr(self, "_channels", None))
        gh, gw, c = self._grid(inputs.shape)
        ph, pw = self.patch_size
        if (ph, pw) == (1, 1):
            return inputs
        if gh is None or gw is None:
            shape = ops.shape(inputs)
            batch = shape[0]
            gh = shape[1] // ph if gh is None else gh
            gw = shape[2] // pw if gw is None else gw
        else:
            batch = -1
        x = ops.reshape(inputs, (batch, gh, ph, gw, pw, c))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        return ops.reshape(x, (batch, gh, gw, ph * pw * c))

    def compute_output_shape(self, input_shape):
        """`(batch, height // ph, width // pw, ph * pw * channels)`."""
        gh, gw, c = self._grid(input_shape)
        ph, pw = self.patch_size
        return (input_shape[0], gh, gw, ph * pw * c)

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config
