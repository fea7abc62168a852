"""ImageNormalization: the models' built-in pixel preprocessing."""

import keras

from keras_vit.layers._utils import checked_channels


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageNormalization(keras.layers.Normalization):
    """`keras.layers.Normalization` over the channels of images that checks
    their channel count: a one-channel (grayscale) batch is a ValueError
    naming both counts, not broadcast over the per-channel mean and
    variance as `Normalization` alone would (2 or 4 channels likewise; in
    a TensorFlow graph traced without the channel count, as `predict` does
    after a batch of another shape, the same sentence comes from a runtime
    assertion).

    >>> layer = ImageNormalization(mean=[127.5] * 3, variance=[127.5**2] * 3)
    >>> tuple(layer(keras.ops.full((1, 2, 2, 3), 255.0)).shape)
    (1, 2, 2, 3)
    """

    def build(self, input_shape):
        """`Normalization.build`, and records the channel count images must
        have."""
        super().build(input_shape)
        self._channels = input_shape[-1]

    def call(self, inputs):
        """`(inputs - mean) / sqrt(variance)` per channel, after the
        channel-count check (a ValueError naming both counts)."""
        return super().call(checked_channels(inputs, getattr(self, "_channels", None)))
