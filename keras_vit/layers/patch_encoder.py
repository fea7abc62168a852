"""PatchEncoder: linear patch projection, class token, learned position
embedding (ViT paper, Eq. 1)."""

import keras
from keras import ops

from keras_vit.layers._utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEncoder(keras.layers.Layer):
    """Projects a grid of flattened patches to tokens and adds positions.

    `z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos` (ViT paper, Eq. 1).
    Input: `(batch, grid_h, grid_w, patch_dim)`, the output of `Patches`
    (or of the hybrid ResNet stem with 1x1 patches). Output:
    `(batch, num_prefix_tokens + grid_h * grid_w, hidden_size)`.

    Args:
        hidden_size: width `D` of the tokens.
        use_class_token: prepend the learned class token (classifier
            `"token"`); `False` for `"gap"` models.
        kernel_initializer, position_initializer: initializers of the
            projection and of the position embedding (official defaults:
            LeCun normal and normal(stddev=0.02); the class token starts at 0).

    Attributes:
        grid_size: `(grid_h, grid_w)` once built.
        num_prefix_tokens: 1 with a class token, else 0.

    Example:

    >>> patches = keras.ops.ones((2, 4, 4, 48))
    >>> PatchEncoder(64)(patches).shape
    (2, 17, 64)
    """

    def __init__(
        self,
        hidden_size,
        use_class_token=True,
        kernel_initializer="lecun_normal",
        position_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_size = check_positive_int(hidden_size, "hidden_size")
        self.use_class_token = bool(use_class_token)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.position_initializer = keras.initializers.get(
            position_initializer
            or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.grid_size = None

    @property
    def num_prefix_tokens(self):
        return 1 if self.use_class_token else 0

    def build(self, input_shape):
        if len(input_shape) != 4 or None in tuple(input_shape[1:]):
            raise ValueError(
                "PatchEncoder expects a static patch grid of shape (batch, "
                f"grid_h, grid_w, patch_dim), got {tuple(input_shape)}."
            )
        _, gh, gw, patch_dim = input_shape
        self.grid_size = (int(gh), int(gw))
        self.kernel = self.add_weight(
            name="kernel",
            shape=(patch_dim, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        self.bias = self.add_weight(
            name="bias", shape=(self.hidden_size,), initializer="zeros"
        )
        if self.use_class_token:
            self.class_token = self.add_weight(
                name="class_token",
                shape=(1, 1, self.hidden_size),
                initializer="zeros",
            )
        num_tokens = self.num_prefix_tokens + gh * gw
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=(1, num_tokens, self.hidden_size),
            initializer=self.position_initializer,
        )
        self.built = True

    def call(self, inputs):
        gh, gw = self.grid_size
        x = ops.reshape(inputs, (-1, gh * gw, inputs.shape[-1]))
        x = ops.matmul(x, self.kernel) + self.bias
        if self.use_class_token:
            cls = ops.broadcast_to(
                ops.cast(self.class_token, x.dtype),
                (ops.shape(x)[0], 1, self.hidden_size),
            )
            x = ops.concatenate([cls, x], axis=1)
        return x + self.position_embedding

    def compute_output_shape(self, input_shape):
        _, gh, gw, _ = input_shape
        return (input_shape[0], self.num_prefix_tokens + gh * gw, self.hidden_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_size": self.hidden_size,
                "use_class_token": self.use_class_token,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "position_initializer": keras.initializers.serialize(
                    self.position_initializer
                ),
            }
        )
        return config
