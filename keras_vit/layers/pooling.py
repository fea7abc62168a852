"""SequencePooling: turn the token sequence into one vector (`token` or
`gap`, the official `classifier` field)."""

import keras
from keras import ops

POOLING_MODES = ("token", "gap")


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """Pools `(batch, tokens, hidden)` to `(batch, hidden)`.

    Args:
        mode: `"token"` takes the first (class) token, `"gap"` averages all
            tokens (the official `classifier="gap"`: a mean over the
            sequence after the final LayerNorm).

    Example:

    >>> x = keras.ops.reshape(keras.ops.arange(6.0), (1, 3, 2))
    >>> SequencePooling("gap")(x)
    array([[2., 3.]], dtype=float32)
    """

    def __init__(self, mode="token", **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLING_MODES:
            raise ValueError(
                f"Unknown pooling mode {mode!r}; allowed: {POOLING_MODES}."
            )
        self.mode = mode
        self.built = True

    def call(self, inputs):
        if self.mode == "token":
            return inputs[:, 0]
        return ops.mean(inputs, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config["mode"] = self.mode
        return config
