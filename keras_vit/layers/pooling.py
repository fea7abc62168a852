"""SequencePooling: turn the token sequence into one vector (`token` or
`gap`, the official `classifier` field; `avg` or `max` over the patch
tokens, the keras.applications `pooling=` values); AttentionPooling: the
learned multi-head attention-pooling head (`map`, SigLIP)."""

import keras
from keras import ops

from keras_vit import _checks
from keras_vit.layers._utils import dtype_config, sublayer_policy
from keras_vit.layers.fused import check_gelu, dense, layer_norm

POOLING_MODES = ("token", "gap", "avg", "max", "distilled", "token_dist", "token_avg")
# the modes whose vector is two tokens side by side: (batch, 2 * hidden)
CONCAT_MODES = ("token_dist", "token_avg")


@keras.saving.register_keras_serializable(package="keras_vit")
class SequencePooling(keras.layers.Layer):
    """Pools `(batch, tokens, hidden)` to `(batch, hidden)` (`(batch, 2 *
    hidden)` for `"token_dist"` and `"token_avg"`).

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

    Three modes of later families read the class token with another:
    `"distilled"`, the mean of the class and distillation tokens (DeiT
    distilled without its heads: timm's `num_classes=0` output);
    `"token_dist"`, the two side by side (the input of DeiT's distilled
    classifier, whose two heads averaged are one Dense on it);
    `"token_avg"`, the class token beside the mean of the patch tokens
    (after `num_prefix_tokens`; DINOv2's linear classifier, transformers'
    `Dinov2ForImageClassification`).

    Example:

    >>> x = keras.ops.reshape(keras.ops.arange(6.0), (1, 3, 2))
    >>> keras.ops.convert_to_numpy(SequencePooling("gap")(x))
    array([[2., 3.]], dtype=float32)
    >>> keras.ops.convert_to_numpy(SequencePooling("avg", num_prefix_tokens=1)(x))
    array([[3., 4.]], dtype=float32)
    >>> keras.ops.convert_to_numpy(SequencePooling("distilled")(x))
    array([[1., 2.]], dtype=float32)
    >>> keras.ops.convert_to_numpy(SequencePooling("token_avg", num_prefix_tokens=1)(x))
    array([[0., 1., 3., 4.]], dtype=float32)
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
        """`(batch, hidden)` pooled from `(batch, tokens, hidden)` by `mode`."""
        if self.mode == "token":
            return inputs[:, 0]
        if self.mode == "distilled":
            return (inputs[:, 0] + inputs[:, 1]) / 2
        if self.mode == "token_dist":
            return ops.concatenate([inputs[:, 0], inputs[:, 1]], axis=-1)
        if self.mode == "token_avg":
            return ops.concatenate(
                [inputs[:, 0], ops.mean(inputs[:, self.num_prefix_tokens:], axis=1)], axis=-1)
        if self.mode == "gap":
            return ops.mean(inputs[:, self.num_prefix_tokens:] if self.num_prefix_tokens
                            else inputs, axis=1)
        patches = inputs[:, self.num_prefix_tokens:] if self.num_prefix_tokens else inputs
        if self.mode == "avg":
            return ops.mean(patches, axis=1)
        return ops.max(patches, axis=1)

    def compute_output_shape(self, input_shape):
        """`(batch, hidden)`; `(batch, 2 * hidden)` for the two-token modes."""
        width = input_shape[-1]
        if self.mode in CONCAT_MODES and width is not None:
            width *= 2
        return (input_shape[0], width)

    def get_config(self):
        config = super().get_config()
        config["mode"] = self.mode
        config["num_prefix_tokens"] = self.num_prefix_tokens
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class AttentionPooling(keras.layers.Layer):
    """Multi-head attention pooling (`map`: SigLIP's `MAPHead`, timm's
    `AttentionPoolLatent`): a learned probe token attends over the tokens.

    ```
    y = Dense_out(MHA(query=Dense_q(probe), key, value=Dense_kv(x)))
    y = y + MLP(LayerNorm(y))                # MLP: Dense, GELU, Dense
    ```

    Pools `(batch, tokens, hidden)` to `(batch, hidden)`; the first
    `num_prefix_tokens` (registers, a distillation token) are left out, as
    timm's `pool_include_prefix=False` leaves them. The query is
    divided by `sqrt(head_dim)`; the softmax and the LayerNorm statistics
    are computed in float32 under a mixed-precision policy. Weights: the
    probe `(1, 1, hidden)` (timm's `latent`), `query` (timm's `q`),
    `key_value` (timm's `kv`: keys, then values), `out` (`proj`), `norm`,
    `mlp_dense1`, `mlp_dense2` (`mlp.fc1`, `mlp.fc2`).

    Args:
        num_heads: attention heads; must divide the width.
        mlp_dim: width of the MLP hidden layer.
        layer_norm_epsilon: the LayerNorm's epsilon.
        gelu: the MLP's GELU form, `"tanh"`, `"erf"` or `"quick"`.
        num_prefix_tokens: tokens before the patch tokens, not attended over
            (default 0: every token, as SigLIP's).

    Example:

    >>> pool = AttentionPooling(num_heads=2, mlp_dim=32)
    >>> tuple(pool(keras.ops.ones((3, 5, 16))).shape)
    (3, 16)
    """

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu="tanh",
                 num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = _checks.non_negative_int(num_prefix_tokens, "num_prefix_tokens")
        self.num_heads = _checks.positive_int(num_heads, "num_heads")
        self.mlp_dim = _checks.positive_int(mlp_dim, "mlp_dim")
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu = check_gelu(gelu)
        self.norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=sublayer_policy(self), name="norm")
        self.mlp_dense1 = keras.layers.Dense(
            self.mlp_dim, dtype=sublayer_policy(self, "mlp_dense1"), name="mlp_dense1")
        self.probe = self.query = self.key_value = self.out = self.mlp_dense2 = None

    def build(self, input_shape):
        """Creates the probe and the attention and MLP layers for
        `(batch, tokens, hidden)` inputs; a ValueError for another rank, an
        unknown hidden size or one not divisible by `num_heads`."""
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "AttentionPooling expects (batch, tokens, hidden) with a known "
                f"hidden size, got {tuple(input_shape)}.")
        hidden = int(input_shape[-1])
        if hidden % self.num_heads:
            raise ValueError(
                f"The hidden size {hidden} is not divisible by num_heads={self.num_heads}.")
        self.hidden_size = hidden
        self.probe = self.add_weight(
            name="probe", shape=(1, 1, hidden), initializer="glorot_uniform")
        self.query, self.key_value, self.out, self.mlp_dense2 = (
            keras.layers.Dense(units, dtype=sublayer_policy(self, name), name=name)
            for name, units in (("query", hidden), ("key_value", 2 * hidden),
                                ("out", hidden), ("mlp_dense2", hidden)))
        rows = (None, hidden)
        self.query.build(rows)
        self.key_value.build(rows)
        self.out.build(rows)
        self.norm.build(rows)
        self.mlp_dense1.build(rows)
        self.mlp_dense2.build((None, self.mlp_dim))
        self.built = True

    def call(self, inputs):
        """`(batch, hidden)`: the learned probe's multi-head attention over the
        tokens (the first `num_prefix_tokens` left out), plus an MLP on
        its LayerNorm (a residual)."""
        hidden, heads = self.hidden_size, self.num_heads
        head_dim = hidden // heads
        if self.num_prefix_tokens:
            inputs = inputs[:, self.num_prefix_tokens:]
        dtype = inputs.dtype
        tokens = inputs.shape[1] if inputs.shape[1] is not None else ops.shape(inputs)[1]
        probe = ops.reshape(ops.cast(self.probe, dtype), (1, hidden))
        query = ops.reshape(dense(self.query, probe), (heads, head_dim))
        query = query / ops.cast(head_dim ** 0.5, dtype)
        kv = dense(self.key_value, ops.reshape(inputs, (-1, hidden)))
        kv = ops.reshape(kv, (-1, tokens, 2, heads, head_dim))
        key, value = ops.unstack(ops.transpose(kv, (2, 0, 3, 1, 4)), 2, axis=0)
        # (batch, heads, tokens, dim) x (heads, dim) -> (batch, heads, tokens)
        logits = ops.einsum("bhnd,hd->bhn", key, query)
        weights = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), dtype)
        y = ops.reshape(ops.einsum("bhn,bhnd->bhd", weights, value), (-1, hidden))
        y = dense(self.out, y)
        mlp = dense(self.mlp_dense1, layer_norm(self.norm, y), gelu=self.gelu)
        return y + dense(self.mlp_dense2, mlp)

    def compute_output_shape(self, input_shape):
        """`(batch, hidden)`."""
        return (input_shape[0], input_shape[-1])

    @property
    def dense_layers(self):
        """The Dense layers, which `model.quantize(mode)` quantizes; their
        quantized policies are saved in the config (`dtype`, a
        `DTypePolicyMap`, as `TransformerBlock`'s), so a quantized model
        reloads."""
        return [self.query, self.key_value, self.out, self.mlp_dense1, self.mlp_dense2]

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                      layer_norm_epsilon=self.layer_norm_epsilon, gelu=self.gelu,
                      num_prefix_tokens=self.num_prefix_tokens, dtype=dtype_config(self))
        return config
