"""DropPath: stochastic depth per sample (Huang et al. 2016, "Deep Networks
with Stochastic Depth"), as used by AugReg's `sd` setting."""

import keras
from keras import ops

from keras_vit import _checks


@keras.saving.register_keras_serializable(package="keras_vit")
class DropPath(keras.layers.Layer):
    """Drops a whole residual branch per sample while training.

    In training each sample's branch is zeroed with probability `rate` and
    kept ones are scaled by `1 / (1 - rate)`; at inference it is the
    identity.

    Args:
        rate: probability of dropping the branch, in [0, 1).
        seed: optional int seed.

    Example:

    >>> layer = DropPath(0.5, seed=0)
    >>> y = layer(keras.ops.ones((4, 3, 2)), training=True)
    >>> sorted(set(keras.ops.convert_to_numpy(y).ravel().tolist()))  # 0 or 2
    [0.0, 2.0]
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = _checks.fraction(rate, "rate")
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True
        self.built = True

    def call(self, inputs, training=None):
        """`inputs` with each sample's branch zeroed with probability `rate`
        (the kept ones scaled by `1 / (1 - rate)`) when `training`; else
        `inputs`."""
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        noise = keras.random.uniform(
            shape, seed=self.seed_generator, dtype=inputs.dtype
        )
        mask = ops.floor(keep + noise)
        return inputs * ops.cast(mask / keep, inputs.dtype)

    def compute_output_shape(self, input_shape):
        """The input shape: the layer keeps it."""
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
