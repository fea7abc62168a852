"""TransformerBlock: the pre-LN encoder block of the ViT paper (Eq. 2-3)."""

import contextlib

import keras
import numpy as np
from keras import ops

from keras_vit import _checks
from keras_vit.layers.fused import (
    check_attention,
    check_gelu,
    dense,
    dot_product_attention,
    layer_norm,
    softmax_attention,
    swiglu,
    uses_dot_product_attention,
)
from keras_vit.layers._remat import rematerialized_call
from keras_vit.layers._utils import dtype_config, sublayer_policy
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.rotary import ROPE_VARIANTS


def check_layer_scale_init(value, name="layer_scale_init"):
    """`layer_scale_init`: None (no LayerScale) or a finite number > 0."""
    if value is None:
        return None
    return _checks.positive_float(value, name, "DINOv2: 1e-5, DeiT-III: 1e-6")


# The MLPs a block computes: "gelu", Dense -> GELU -> Dense (the ViT's);
# "swiglu", one Dense to twice the width -> SiLU(first half) x second half
# -> Dense (DINOv2's ViT-g/14, timm's SwiGLUPacked).
MLP_KINDS = ("gelu", "swiglu")


def check_mlp(mlp):
    """`mlp`: one of `MLP_KINDS`."""
    if mlp not in MLP_KINDS:
        raise ValueError(
            f"Unknown mlp={mlp!r}; allowed: {MLP_KINDS} ('gelu': Dense, GELU, Dense; "
            "'swiglu': the gated MLP of DINOv2's ViT-g/14).")
    return mlp


# The biases of the query, key and value projections: "qkv" (all three, the
# ViT's); "qv" (BEiT, EVA, DINOv3 "qkvb": the key has none, timm's `q_bias`,
# `v_bias`); "none".
QKV_BIAS_KINDS = ("qkv", "qv", "none")


def check_qkv_bias(qkv_bias):
    """`qkv_bias`: one of `QKV_BIAS_KINDS`."""
    if qkv_bias not in QKV_BIAS_KINDS:
        raise ValueError(
            f"Unknown qkv_bias={qkv_bias!r}; allowed: {QKV_BIAS_KINDS} ('qkv': a bias on "
            "the query, key and value; 'qv': on the query and value only (BEiT, EVA); "
            "'none': no bias).")
    return qkv_bias


def check_rope_variant(rope):
    """A block's `rope`: None or one of `keras_vit.layers.rotary.ROPE_VARIANTS`."""
    if rope is not None and rope not in ROPE_VARIANTS:
        raise ValueError(f"Unknown rope={rope!r}; allowed: None or one of {ROPE_VARIANTS}.")
    return rope


def relative_position_index(window):
    """BEiT's `(h * w + 1, h * w + 1)` index into a relative position bias
    table of `(2h - 1)(2w - 1) + 3` rows for a class token and an `(h, w)`
    patch grid: one row per 2-D offset of two patches, then the three of
    the class token (to a patch, from a patch, to itself), as timm's
    `gen_relative_position_index`.

    >>> relative_position_index((2, 2))[0].tolist()
    [11, 9, 9, 9, 9]
    """
    h, w = window
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    coords = np.stack([rows.ravel(), cols.ravel()])             # 2, hw
    offsets = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0)
    index = (offsets[..., 0] + h - 1) * (2 * w - 1) + offsets[..., 1] + w - 1
    size = (2 * h - 1) * (2 * w - 1) + 3
    out = np.zeros((h * w + 1, h * w + 1), np.int32)
    out[1:, 1:] = index
    out[0, :] = size - 3
    out[:, 0] = size - 2
    out[0, 0] = size - 1
    return out


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerScale(keras.layers.Layer):
    """A learned per-channel scale, `x * gamma` (CaiT's LayerScale, as
    timm's `LayerScale`): `gamma` of shape `(hidden,)`, initialised to
    `init_value` (DINOv2: 1e-5, DeiT-III: 1e-6). The scale is float32 and
    cast to the compute dtype under a mixed-precision policy.

    Example:

    >>> scale = LayerScale(0.5)
    >>> keras.ops.convert_to_numpy(scale(keras.ops.ones((1, 2, 3))))[0, 0]
    array([0.5, 0.5, 0.5], dtype=float32)
    """

    def __init__(self, init_value=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = _checks.positive_float(init_value, "init_value")
        self.gamma = None

    def build(self, input_shape):
        """Creates `gamma`, one scale per channel (the last axis), at `init_value`."""
        self.gamma = self.add_weight(
            name="gamma", shape=(int(input_shape[-1]),),
            initializer=keras.initializers.Constant(self.init_value))
        self.built = True

    def call(self, inputs):
        """`inputs * gamma` (per channel)."""
        return inputs * ops.cast(self.gamma, inputs.dtype)

    def compute_output_shape(self, input_shape):
        """The input shape: the layer keeps it."""
        return input_shape

    def get_config(self):
        config = super().get_config()
        config["init_value"] = self.init_value
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class TransformerBlock(keras.layers.Layer):
    """Pre-LayerNorm transformer encoder block.

    ```
    x = x + DropPath([ls1] Dropout(MHSA(LayerNorm(x))))
    x = x + DropPath([ls2] MLP(LayerNorm(x)))  # MLP: Dense, GELU, Dropout,
                                                #      Dense, Dropout
    ```

    With `mlp="swiglu"` the MLP is gated: `Dense(2 * mlp_dim)`, then
    `SiLU(first half) * second half`, Dropout, `Dense`, Dropout (DINOv2's
    ViT-g/14; `keras_vit.layers.fused.swiglu`).

    `ls1`, `ls2`: `LayerScale` (per-channel `gamma`), only with
    `layer_scale_init` (DINOv2, DeiT-III, timm's `init_values`).

    As in the official `Encoder1DBlock`: LayerNorm epsilon 1e-6, query
    divided by `sqrt(head_dim)`, GELU with the tanh approximation. The
    attention softmax and the LayerNorm statistics are computed in float32
    under a mixed-precision policy.

    The query, key and value projections are held as one fused
    `(hidden, 3 * hidden)` kernel (`qkv`), one matmul instead of three;
    `keras_vit.weights.official` maps them to the official per-head
    `(hidden, heads, head_dim)` arrays.

    Args:
        num_heads: number of attention heads; must divide the width.
        mlp_dim: width of the MLP hidden layer (with `mlp="swiglu"`, the
            width after the gating: `mlp_dense1` has `2 * mlp_dim` units).
        dropout_rate: dropout after attention and in the MLP.
        attention_dropout_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth rate of both residual branches.
        layer_norm_epsilon: LayerNorm epsilon (official and timm: 1e-6;
            Hugging Face transformers ViT: 1e-12).
        gelu: `"tanh"` (the tanh approximation, official), `"erf"`
            (exact GELU, PyTorch's `nn.GELU()` as timm and transformers
            use it) or `"quick"` (`x * sigmoid(1.702 x)`, OpenAI CLIP's
            QuickGELU). Weights loaded from those libraries set it. Not
            used by `mlp="swiglu"`, whose activation is SiLU.
        layer_scale_init: None (the default: no LayerScale, the official
            block) or a float: each residual branch is multiplied by a
            learned per-channel scale (sublayers `ls1`, `ls2`, weight
            `gamma`) initialised to it, as timm's `init_values` (DINOv2
            1e-5, DeiT-III 1e-6).
        remat: rematerialise the block in training calls (gradient
            checkpointing, `keras.remat`): less memory, more compute, the
            same values and gradients (the same dropout and drop-path
            masks). Saved in the config. See
            docs/models.md#remattrue-per-block-rematerialisation-gradient-checkpointing.
        attention: the same function computed as `"fused"` (explicit
            matmul-softmax-matmul for oneDNN's fusions), `"dot_product"`
            (`keras.ops.dot_product_attention`'s flash-attention kernels),
            or `"auto"` (the default): what measured faster on the backend
            and device
            (`keras_vit.layers.fused.uses_dot_product_attention`:
            see docs/models.md#attention-which-kernels-compute-the-attention).
            Calls with `return_attention_scores=True`, and training calls
            with attention dropout, always use `"fused"`. Saved in the
            config.
        mlp: `"gelu"` (the default: Dense, GELU, Dense) or `"swiglu"`:
            the packed SwiGLU MLP of DINOv2's ViT-g/14 (timm's
            `SwiGLUPacked`): `mlp_dense1` projects to `2 * mlp_dim`, its
            first half through SiLU times its second half feeds
            `mlp_dense2`. The sublayers keep their names, so LoRA's `"mlp"`
            target, quantization and the official keys (`MlpBlock_3/
            Dense_0`, `Dense_1`) cover both.
        qkv_bias: `"qkv"` (the default: the query, key and value
            projections have a bias, in `qkv`), `"qv"` (BEiT, EVA-02,
            DINOv3 "qkvb": `qkv` has none, the block's weights `q_bias`
            and `v_bias` are added to the query and the value; the key's is
            zero) or `"none"`.
        mlp_norm: a LayerNorm (sublayer `mlp_norm`) over the MLP's hidden
            activations, before `mlp_dense2` (EVA-02's sub-LayerNorm,
            timm's `scale_mlp`). Default False.
        rope: None (the default) or a rotary position embedding variant of
            `keras_vit.layers.rotary.ROPE_VARIANTS` (`"dinov3"`, `"eva"`):
            the call's `rope` input, a `RotaryEmbedding` output, rotates the
            queries and keys in that variant's channel layout (in float32).
        relative_position_bias: None (the default) or the `(grid_h,
            grid_w)` patch grid of BEiT's relative position bias: a learned
            table `relative_position_bias_table` of `(2 grid_h - 1)(2 grid_w
            - 1) + 3` rows by `num_heads`, indexed by the offset of two
            tokens (`relative_position_index`) and added to the attention
            logits. The block then takes a class token and that grid only.

    Call arguments:
        inputs: `(batch, tokens, hidden)`.
        rope: with `rope` set, the `RotaryEmbedding` output `(tokens, 2 *
            head_dim)` for the call's grid (required then; None otherwise).
        training: Python bool.
        return_attention_scores: if `True`, returns
            `(outputs, attention)` with the softmax attention weights of
            shape `(batch, heads, tokens, tokens)` in float32.

    Example:

    >>> block = TransformerBlock(num_heads=2, mlp_dim=32)
    >>> x = keras.ops.ones((1, 5, 16))
    >>> y, attention = block(x, return_attention_scores=True)
    >>> tuple(y.shape), tuple(attention.shape)
    ((1, 5, 16), (1, 2, 5, 5))
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu="tanh",
        remat=False,
        attention="auto",
        layer_scale_init=None,
        mlp="gelu",
        qkv_bias="qkv",
        mlp_norm=False,
        rope=None,
        relative_position_bias=None,
        **kwargs,
    ):
        if rope is not None:
            # The `rope` call argument is float32 (RoPE in float32, as timm):
            # Keras' autocast would round it to a mixed policy's compute
            # dtype with the inputs, so `call` casts the inputs itself.
            kwargs["autocast"] = False
        super().__init__(**kwargs)
        self.attention = check_attention(attention)
        self.mlp = check_mlp(mlp)
        self.qkv_bias = check_qkv_bias(qkv_bias)
        self.mlp_norm = _checks.boolean(mlp_norm, "mlp_norm")
        self.rope = check_rope_variant(rope)
        self.relative_position_bias = None if relative_position_bias is None else \
            _checks.positive_int_pair(relative_position_bias, "relative_position_bias")
        self.layer_scale_init = check_layer_scale_init(layer_scale_init)
        self.gelu = check_gelu(gelu)
        self.remat = _checks.boolean(remat, "remat")
        self.num_heads = _checks.positive_int(num_heads, "num_heads")
        self.mlp_dim = _checks.positive_int(mlp_dim, "mlp_dim")
        self.dropout_rate = _checks.fraction(dropout_rate, "dropout_rate")
        self.attention_dropout_rate = _checks.fraction(
            attention_dropout_rate, "attention_dropout_rate"
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
        self.mlp_dense1 = keras.layers.Dense(
            self.mlp_dim * (2 if self.mlp == "swiglu" else 1),
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=sublayer_policy(self, "mlp_dense1"),
            name="mlp_dense1",
        )
        self.attention_dropout = keras.layers.Dropout(
            self.attention_dropout_rate, dtype=policy, name="attention_dropout"
        )
        self.dropout = keras.layers.Dropout(
            self.dropout_rate, dtype=policy, name="dropout"
        )
        self.drop_path = DropPath(
            self.drop_path_rate, dtype=policy, name="drop_path"
        )
        # Created only with LayerScale, so that the default block's weights
        # are today's.
        self.ls1 = self.ls2 = None
        if self.layer_scale_init is not None:
            self.ls1 = LayerScale(self.layer_scale_init, dtype=policy, name="ls1")
            self.ls2 = LayerScale(self.layer_scale_init, dtype=policy, name="ls2")
        self.mlp_layer_norm = None
        if self.mlp_norm:
            self.mlp_layer_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, dtype=policy, name="mlp_norm")
        self.q_bias = self.v_bias = self.relative_position_bias_table = None
        # `attention_probe`: None, or (only inside `probing_attention`) a
        # callable `probe(weights, training)` in place of the attention
        # dropout: it sees the softmax weights and returns those the values
        # are weighted with. Not in the config.
        self._attention_probe = None
        # Created in build(), when the width is known.
        self.qkv = None
        self.attention_output = None
        self.mlp_dense2 = None

    def build(self, input_shape):
        """Creates the norms, the attention and MLP Dense layers for
        `(batch, tokens, hidden)` inputs; a ValueError for another rank or
        an unknown hidden size."""
        if len(input_shape) != 3 or input_shape[-1] is None:
            raise ValueError(
                "TransformerBlock expects (batch, tokens, hidden) with a known "
                f"hidden size, got {tuple(input_shape)}."
            )
        hidden = int(input_shape[-1])
        if hidden % self.num_heads:
            raise ValueError(
                f"The hidden size {hidden} is not divisible by num_heads="
                f"{self.num_heads}."
            )
        self.hidden_size = hidden
        self.head_dim = hidden // self.num_heads
        self.qkv = keras.layers.Dense(
            3 * hidden, kernel_initializer="glorot_uniform",
            use_bias=self.qkv_bias == "qkv",
            dtype=sublayer_policy(self, "qkv"), name="qkv",
        )
        if self.qkv_bias == "qv":
            self.q_bias = self.add_weight(name="q_bias", shape=(hidden,), initializer="zeros")
            self.v_bias = self.add_weight(name="v_bias", shape=(hidden,), initializer="zeros")
        if self.relative_position_bias is not None:
            gh, gw = self.relative_position_bias
            self.relative_position_bias_table = self.add_weight(
                name="relative_position_bias_table",
                shape=((2 * gh - 1) * (2 * gw - 1) + 3, self.num_heads),
                initializer="zeros", autocast=False)
        self.attention_output = keras.layers.Dense(
            hidden, kernel_initializer="glorot_uniform",
            dtype=sublayer_policy(self, "attention_output"), name="attention_output",
        )
        self.mlp_dense2 = keras.layers.Dense(
            hidden,
            kernel_initializer="glorot_uniform",
            bias_initializer=keras.initializers.RandomNormal(stddev=1e-6),
            dtype=sublayer_policy(self, "mlp_dense2"),
            name="mlp_dense2",
        )
        self.norm1.build(input_shape)
        self.norm2.build(input_shape)
        self.qkv.build(input_shape)
        self.attention_output.build(input_shape)
        self.mlp_dense1.build(input_shape)
        self.mlp_dense2.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        if self.ls1 is not None:
            self.ls1.build(input_shape)
            self.ls2.build(input_shape)
        if self.mlp_layer_norm is not None:
            self.mlp_layer_norm.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        self.built = True

    def _uses_dot_product(self, training, return_attention_scores):
        """Whether this call computes attention with
        `ops.dot_product_attention` (see `attention`)."""
        return (not return_attention_scores and self._attention_probe is None
                and not (training and self.attention_dropout_rate > 0)
                and uses_dot_product_attention(self.attention, bool(training)))

    def _relative_position_bias(self, tokens):
        """BEiT's `(heads, tokens, tokens)` float32 bias, gathered from the
        table; a ValueError when `tokens` is not the class token and the
        block's grid."""
        gh, gw = self.relative_position_bias
        if isinstance(tokens, int) and tokens != gh * gw + 1:
            raise ValueError(
                f"{self.name}: the relative position bias is for a class token and a {gh}x{gw} "
                f"patch grid ({gh * gw + 1} tokens), got {tokens} tokens; build the model "
                "for this image size (the table is resized when the weights are loaded).")
        index = relative_position_index(self.relative_position_bias).reshape(-1)
        bias = ops.take(ops.cast(self.relative_position_bias_table, "float32"), index, axis=0)
        return ops.transpose(ops.reshape(bias, (gh * gw + 1, gh * gw + 1, -1)), (2, 0, 1))

    def _qkv(self, rows):
        """The fused query-key-value projection of `rows`, with `qkv_bias`."""
        qkv = dense(self.qkv, rows)
        if self.qkv_bias != "qv":
            return qkv
        # (as tensors: JAX cannot read a variable's dtype with autocast off, see __init__)
        q_bias, v_bias = ops.convert_to_tensor(self.q_bias), ops.convert_to_tensor(self.v_bias)
        bias = ops.concatenate([q_bias, ops.zeros_like(q_bias), v_bias])
        return qkv + ops.cast(bias, qkv.dtype)

    def _attention(self, x, training, return_attention_scores=False, rope=None):
        """Attention branch on normalized `x` (batch, tokens, hidden):
        returns `(output (batch, tokens, hidden), softmax weights or None)`."""
        tokens = x.shape[1] if x.shape[1] is not None else ops.shape(x)[1]
        rows = ops.reshape(x, (-1, self.hidden_size))
        qkv = self._qkv(rows)
        extra = dict(rope=rope, rope_variant=self.rope, bias=None
                     if self.relative_position_bias is None
                     else self._relative_position_bias(tokens))
        if self._uses_dot_product(training, return_attention_scores):
            out, weights = dot_product_attention(qkv, tokens, self.num_heads, **extra), None
        else:
            out, weights = softmax_attention(
                qkv, tokens, self.num_heads, self._attention_probe or self.attention_dropout,
                training, **extra)
        out = dense(self.attention_output, out)
        return ops.reshape(out, (-1, tokens, self.hidden_size)), weights

    def _mlp(self, x, training):
        rows = ops.reshape(x, (-1, self.hidden_size))
        if self.mlp == "swiglu":
            y = swiglu(dense(self.mlp_dense1, rows))
        else:
            y = dense(self.mlp_dense1, rows, gelu=self.gelu, training=training)
        y = self.dropout(y, training=training)
        if self.mlp_layer_norm is not None:
            y = layer_norm(self.mlp_layer_norm, y)
        y = dense(self.mlp_dense2, y)
        return ops.reshape(y, ops.shape(x))

    def _forward(self, inputs, training, return_attention_scores=False, rope=None):
        y, weights = self._attention(layer_norm(self.norm1, inputs), training,
                                     return_attention_scores, rope)
        y = self.dropout(y, training=training)
        if self.ls1 is not None:
            y = self.ls1(y)
        x = inputs + self.drop_path(y, training=training)
        y = self.dropout(self._mlp(layer_norm(self.norm2, x), training), training=training)
        if self.ls2 is not None:
            y = self.ls2(y)
        return x + self.drop_path(y, training=training), weights

    def call(self, inputs, rope=None, training=None, return_attention_scores=False):
        """The block's output for `(batch, tokens, hidden)` `inputs`, the same
        shape; with `return_attention_scores`, `(output, attention)`, the
        attention probabilities `(batch, heads, tokens, tokens)` in float32.
        With `remat` and `training`, the activations are recomputed in the
        backward pass instead of kept. `rope`: the rotary embedding of the
        call's grid, given exactly when the block has `rope`."""
        if (rope is None) != (self.rope is None):
            raise ValueError(
                f"{self.name}: a block with rope={self.rope!r} takes " + (
                    "the call argument `rope` (a RotaryEmbedding output)." if self.rope
                    else "no `rope` call argument."))
        if not self.autocast:  # (rope: see __init__)
            inputs = ops.cast(inputs, self.compute_dtype)
            rope = ops.cast(rope, "float32")
        if self.remat and training and not return_attention_scores:
            return rematerialized_call(
                lambda x: self._forward(x, training, rope=rope)[0], inputs,
                [self.dropout, self.attention_dropout, self.drop_path])
        x, weights = self._forward(inputs, training, return_attention_scores, rope)
        if return_attention_scores:
            return x, ops.cast(weights, "float32")
        return x

    @contextlib.contextmanager
    def probing_attention(self, probe):
        """Within the block, `probe(weights, training)` stands in for the
        attention dropout (the explicit softmax path then always runs): it
        receives the attention probabilities `(batch, heads, tokens,
        tokens)` in float32 and returns the weights the values are
        averaged with. What `keras_vit.inspect.class_relevance` reads the
        probabilities and their gradient through; outside it the block is
        as before.

        >>> block = TransformerBlock(num_heads=2, mlp_dim=32)
        >>> x = keras.ops.ones((1, 5, 16))
        >>> seen = []
        >>> with block.probing_attention(lambda w, training=None: seen.append(w) or w):
        ...     y = block(x)
        >>> tuple(seen[0].shape)
        (1, 2, 5, 5)
        """
        self._attention_probe = probe
        try:
            yield
        finally:
            self._attention_probe = None

    @property
    def dense_layers(self):
        """The block's Dense layers (query-key-value, attention output, the
        two MLP layers), which `model.quantize(mode)` quantizes; their
        quantized policies are saved in the block's config (`dtype`, a
        `DTypePolicyMap`), so a quantized model reloads."""
        return [self.qkv, self.attention_output, self.mlp_dense1, self.mlp_dense2]

    def get_config(self):
        config = super().get_config()
        # the options of later families, saved only when set: the configs
        # (and so the saved files) of today's models are unchanged
        for key, default in (("qkv_bias", "qkv"), ("mlp_norm", False), ("rope", None),
                             ("relative_position_bias", None)):
            if getattr(self, key) != default:
                config[key] = getattr(self, key)
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "gelu": self.gelu,
                "remat": self.remat,
                "attention": self.attention,
                "layer_scale_init": self.layer_scale_init,
                "mlp": self.mlp,
                "dtype": dtype_config(self),
            }
        )
        return config
