"""MixerBlock: token mixing + channel mixing (MLP-Mixer paper, Eq. 1)."""

import keras
from keras import ops

from keras_vit import _checks
from keras_vit.layers.fused import check_gelu, dense, layer_norm
from keras_vit.layers._remat import rematerialized_call
from keras_vit.layers._utils import dtype_config, sublayer_policy
from keras_vit.layers.drop_path import DropPath


@keras.saving.register_keras_serializable(package="keras_vit")
class MixerBlock(keras.layers.Layer):
    """One MLP-Mixer block.

    ```
    U = X + W2 GELU(W1 LayerNorm(X)^T)^T      # token mixing, across patches
    Y = U + W4 GELU(W3 LayerNorm(U))           # channel mixing, per patch
    ```

    As in the official `MixerBlock`: LayerNorm epsilon 1e-6, GELU with the
    tanh approximation, Dense layers with biases. Token-mixing weights
    depend on the number of patches, so a trained Mixer cannot change its
    input resolution.

    Args:
        tokens_mlp_dim: hidden width of the token-mixing MLP.
        channels_mlp_dim: hidden width of the channel-mixing MLP.
        drop_path_rate: stochastic depth rate of both residual branches
            (0 in the paper).
        layer_norm_epsilon: LayerNorm epsilon (official: 1e-6).
        gelu: `"tanh"` (official) or `"erf"` (exact GELU, as timm's
            Mixers compute it).
        remat: rematerialise the block in training calls (gradient
            checkpointing), as `TransformerBlock(remat=True)`.

    Example:

    >>> block = MixerBlock(tokens_mlp_dim=8, channels_mlp_dim=32)
    >>> tuple(block(keras.ops.ones((2, 16, 12))).shape)
    (2, 16, 12)
    """

    def __init__(
        self,
        tokens_mlp_dim,
        channels_mlp_dim,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu="tanh",
        remat=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.gelu = check_gelu(gelu)
        self.remat = _checks.boolean(remat, "remat")
        self.tokens_mlp_dim = _checks.positive_int(tokens_mlp_dim, "tokens_mlp_dim")
        self.channels_mlp_dim = _checks.positive_int(
            channels_mlp_dim, "channels_mlp_dim"
        )
        self.drop_path_rate = _checks.fraction(drop_path_rate, "drop_path_rate")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        policy = sublayer_policy(self)
        self.norm1 = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="norm1"
        )
        self.norm2 = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="norm2"
        )
        self.token_mixing1 = keras.layers.Dense(
            self.tokens_mlp_dim, dtype=sublayer_policy(self, "token_mixing1"),
            name="token_mixing1"
        )
        self.channel_mixing1 = keras.layers.Dense(
            self.channels_mlp_dim, dtype=sublayer_policy(self, "channel_mixing1"),
            name="channel_mixing1"
        )
        self.drop_path = DropPath(
            self.drop_path_rate, dtype=policy, name="drop_path"
        )
        self.token_mixing2 = None
        self.channel_mixing2 = None

    def build(self, input_shape):
        """Creates the norms and the token- and channel-mixing MLPs for
        `(batch, tokens, channels)` inputs with static sizes; a ValueError
        otherwise."""
        if len(input_shape) != 3 or None in tuple(input_shape[1:]):
            raise ValueError(
                "MixerBlock expects (batch, tokens, channels) with a static "
                f"number of tokens and channels, got {tuple(input_shape)}."
            )
        _, tokens, channels = input_shape
        self.token_mixing2 = keras.layers.Dense(
            tokens, dtype=sublayer_policy(self, "token_mixing2"),
            name="token_mixing2"
        )
        self.channel_mixing2 = keras.layers.Dense(
            channels, dtype=sublayer_policy(self, "channel_mixing2"),
            name="channel_mixing2"
        )
        self.norm1.build(input_shape)
        self.norm2.build(input_shape)
        self.token_mixing1.build((None, channels, tokens))
        self.token_mixing2.build((None, channels, self.tokens_mlp_dim))
        self.channel_mixing1.build(input_shape)
        self.channel_mixing2.build((None, tokens, self.channels_mlp_dim))
        self.built = True

    def call(self, inputs, training=None):
        """Token mixing, then channel mixing, each a residual MLP after a
        LayerNorm; the output has the input's shape."""
        if self.remat and training:
            return rematerialized_call(
                lambda x: self._forward(x, training), inputs, [self.drop_path])
        return self._forward(inputs, training)

    def _forward(self, inputs, training):
        _, tokens, channels = inputs.shape
        # Token mixing: one MLP over the token axis, shared by all channels.
        y = ops.reshape(ops.swapaxes(layer_norm(self.norm1, inputs), 1, 2), (-1, tokens))
        y = dense(self.token_mixing2,
                  dense(self.token_mixing1, y, gelu=self.gelu, training=training))
        y = ops.swapaxes(ops.reshape(y, (-1, channels, tokens)), 1, 2)
        x = inputs + self.drop_path(y, training=training)
        # Channel mixing: one MLP over the channels, shared by all tokens.
        y = ops.reshape(layer_norm(self.norm2, x), (-1, channels))
        y = dense(self.channel_mixing2,
                  dense(self.channel_mixing1, y, gelu=self.gelu, training=training))
        y = ops.reshape(y, (-1, tokens, channels))
        return x + self.drop_path(y, training=training)

    def compute_output_shape(self, input_shape):
        """The input shape: the block keeps it."""
        return input_shape

    @property
    def dense_layers(self):
        """The block's Dense layers (token and channel mixing), which
        `model.quantize(mode)` quantizes; their quantized policies are saved
        in the block's config (`dtype`, a `DTypePolicyMap`)."""
        return [self.token_mixing1, self.token_mixing2, self.channel_mixing1,
                self.channel_mixing2]

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "tokens_mlp_dim": self.tokens_mlp_dim,
                "channels_mlp_dim": self.channels_mlp_dim,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "gelu": self.gelu,
                "remat": self.remat,
                "dtype": dtype_config(self),
            }
        )
        return config
