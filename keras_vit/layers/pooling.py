"""SequencePooling: turn the token sequence into one vector (`token` or
`gap`, the official `classifier` field; `avg` or `max` over the patch
tokens, the keras.applications `pooling=` values)."""

import keras
from keras import ops

from keras_vit import _checks

POOLING_MODES = ("token", "gap", "avg", "max")


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """Pools `(batch, tokens, hidden)` to `(batch, hidden)`.

    Args:
        mode: `"token"` takes the first (class) token, `"gap"` averages all
            tokens (the official `classifier="gap"`: a mean over the
            sequence after the final LayerNorm). `"avg"` and `"max"`: the
            mean / maximum over the patch tokens only, the first
            `num_prefix_tokens` (the class token) left out; the
            keras.applications `pooling="avg"` / `"max"`.
        num_prefix_tokens: how many leading tokens `"avg"` and `"max"`
            leave out (1 for a class-token model); `"gap"` leaves them out
            too (the builders pass 0 for the official `"gap"`, and every
            prefix token for a model with register or distillation tokens,
            as timm's `global_pool="avg"`). `"token"` ignores it.

    Example:

    >>> x = keras.ops.reshape(keras.ops.arange(6.0), (1, 3, 2))
    >>> keras.ops.convert_to_numpy(SequencePooling("gap")(x))
    array([[2., 3.]], dtype=float32)
    >>> keras.ops.convert_to_numpy(SequencePooling("avg", num_prefix_tokens=1)(x))
    array([[3., 4.]], dtype=float32)
    """

    def __init__(self, mode="token", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        if mode not in POOLING_MODES:
            raise ValueError(
                f"Unknown pooling mode {mode!r}; allowed: {POOLING_MODES}."
            )
        self.mode = mode
        self.num_prefix_tokens = _checks.non_negative_int(num_prefix_tokens, "num_prefix_tokens")
        self.built = True

    def call(self, inputs):
        if self.mode == "token":
            return inputs[:, 0]
        if self.mode == "gap":
            return ops.mean(inputs[:, self.num_prefix_tokens:] if self.num_prefix_tokens
                            else inputs, axis=1)
        patches = inputs[:, self.num_prefix_tokens:] if self.num_prefix_tokens else inputs
        if self.mode == "avg":
            return ops.mean(patches, axis=1)
        return ops.max(patches, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config["mode"] = self.mode
        config["num_prefix_tokens"] = self.num_prefix_tokens
        return config
