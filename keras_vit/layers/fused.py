"""The dense and attention arithmetic of the encoder blocks, written so that
each backend's compiler fuses it.

On TensorFlow with oneDNN (the default on x86 CPUs) grappler's remapper
turns `MatMul -> BiasAdd [-> Gelu(approximate)]` on 2-D operands into one
`_MklNativeFusedMatMul`: the bias and the GELU run inside the matmul's
output pass instead of as 7-10 separate element-wise ops over the
activations. That needs `tf.nn.bias_add` (not `+`) and a 2-D matmul (not the
reshape-`Tensordot`-reshape a Keras `Dense` emits for a 3-D input).
Measured on ViT-B/16 (`benchmarks/profile_ops.py`), the un-fused GELU and
bias adds took 30% of a bfloat16 forward pass.

On the other backends the same code is `ops.matmul` + `ops.add`, which XLA
(JAX) fuses by itself. Float32 results equal `keras.layers.Dense` to within
float32 rounding on every backend.
"""

import contextlib
import math
import os
import threading

import keras
from keras import ops

from keras_vit import _compat
from keras_vit.layers.rotary import apply_rope

_state = threading.local()


@contextlib.contextmanager
def portable_graph():
    """Within this context the blocks trace only standard ops (no
    training-mode `FusedBatchNormV3`, no `Bitcast`), for graphs that may
    leave the TensorFlow runtime: `keras_vit.export` traces SavedModel and
    TFLite exports in it. Results are the same."""
    previous = getattr(_state, "portable", False)
    _state.portable = True
    try:
        yield
    finally:
        _state.portable = previous


def _tensorflow():
    import tensorflow as tf

    return tf


def _onednn_tensorflow():
    """True on the TensorFlow backend with its oneDNN kernels enabled."""
    return (keras.backend.backend() == "tensorflow"
            and os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") != "0")


def _in_xla_context():
    """True while tracing for XLA (`jit_compile=True`, TPUs): XLA needs
    the row count of `layer_norm`'s fused pattern as a compile-time
    constant."""
    return _compat.in_xla_context()


def layer_norm(layer, x):
    """`layer(x)` for a `keras.layers.LayerNormalization` over the last axis
    of `x`, fused into one oneDNN `_MklLayerNorm` kernel on TensorFlow.

    Grappler rewrites LayerNorm into `_MklLayerNorm` only for the pattern
    `Reshape -> FusedBatchNormV3(scale=Fill(1), offset=Fill(0)) -> Reshape
    -> Mul(gamma) -> AddV2(beta)` with a row count it cannot constant-fold
    (with a folded count the `Fill`s become constants and the pattern no
    longer matches). The count is made opaque by adding a zero computed from
    gamma's bits, which is exact for every gamma value. Statistics are
    computed in float32 for any input dtype; 6x faster than the 10
    element-wise ops of the plain formula on ViT-B/16 rows. Under XLA and
    in `portable_graph()` it is the plain `layer(x)`.
    """
    if (not _onednn_tensorflow() or getattr(_state, "portable", False)
            or _in_xla_context() or layer.rms_scaling or not (layer.center and layer.scale)
            or layer.axis not in (-1, len(x.shape) - 1, [-1], [len(x.shape) - 1])):
        return layer(x)
    tf = _tensorflow()
    gamma = tf.cast(layer.gamma, x.dtype)
    beta = tf.cast(layer.beta, x.dtype)
    width = x.shape[-1]
    bits = tf.bitcast(tf.cast(layer.gamma[0], tf.float32), tf.int32)
    rows = tf.size(x) // width + tf.bitwise.bitwise_and(bits, 0)
    y = tf.reshape(x, tf.stack([1, rows, width, 1]))
    ones = tf.fill(tf.reshape(rows, [1]), tf.constant(1.0, tf.float32))
    zeros = tf.fill(tf.reshape(rows, [1]), tf.constant(0.0, tf.float32))
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(
        y, ones, zeros, epsilon=layer.epsilon, data_format="NCHW")
    return tf.reshape(y, tf.shape(x)) * gamma + beta


GELU_FORMS = ("tanh", "erf", "quick")

# OpenAI CLIP's QuickGELU: x * sigmoid(1.702 x) (timm's `quick_gelu`).
QUICK_GELU_SCALE = 1.702


def gelu_tanh(x):
    """GELU with the tanh approximation, as `flax.linen.gelu` (the official
    models) computes it. Exact-erf GELU changes official logits by ~2e-4."""
    return ops.gelu(x, approximate=True)


def gelu_erf(x):
    """Exact GELU, `0.5 x (1 + erf(x / sqrt(2)))` (PyTorch's `nn.GELU()`).
    `ops.gelu(x, approximate=False)`, except in `portable_graph()` on
    TensorFlow: there it is written with `Erf`, as PyTorch exports it to
    ONNX, since `tf.nn.gelu` computes it with `Erfc`, which tf2onnx cannot
    convert (an ONNX export of every timm or transformers model was refused:
    "Erfc has no ONNX conversion"). The same function to float rounding."""
    if getattr(_state, "portable", False) and keras.backend.backend() == "tensorflow":
        tf = _tensorflow()
        return 0.5 * x * (1.0 + tf.math.erf(x * tf.cast(0.5 ** 0.5, x.dtype)))
    return ops.gelu(x, approximate=False)


def quick_gelu(x):
    """OpenAI CLIP's QuickGELU, `x * sigmoid(1.702 x)` (timm's
    `quick_gelu`, transformers' `"quick_gelu"`)."""
    return x * ops.sigmoid(ops.cast(QUICK_GELU_SCALE, x.dtype) * x)


def swiglu(x):
    """The gating of a packed SwiGLU MLP: `x` `(rows, 2 * hidden)` is the
    one Dense's output; its first half through SiLU (`a * sigmoid(a)`)
    times its second half, `(rows, hidden)`. timm's `SwiGLUPacked`
    (`GluMlp(act_layer=SiLU, gate_last=False)`), DINOv2's `SwiGLUFFN(Fused)`
    (`w12`) and transformers' `Dinov2SwiGLUFFN` (`weights_in`: `gate_proj`
    then `up_proj`) compute the same. Written with `sigmoid`, plain ops
    every exporter converts.

    >>> keras.ops.convert_to_numpy(swiglu(keras.ops.convert_to_tensor([[0.0, 2.0, 5.0, 3.0]])))
    array([[0.       , 5.2847824]], dtype=float32)
    """
    gate, up = ops.split(x, 2, axis=-1)
    return gate * ops.sigmoid(gate) * up


def check_gelu(gelu):
    """Validates a GELU form name: "tanh" (official), "erf" (exact, as
    PyTorch's `nn.GELU()` in timm and transformers) or "quick"
    (`x * sigmoid(1.702 x)`, OpenAI CLIP's QuickGELU)."""
    if gelu not in GELU_FORMS:
        raise ValueError(f"Unknown gelu={gelu!r}; allowed: {GELU_FORMS}.")
    return gelu


def _gelu_with_gradient(x, approximate):
    """GELU for TensorFlow training calls, with its derivative written out.

    In training grappler cannot fuse the GELU into the matmul (the backward
    pass reads its intermediates), and the gradient TensorFlow derives for
    `tf.nn.gelu` is about 20 element-wise ops over the MLP's activations,
    `Pow` among them. Here the tanh form is `x * sigmoid(2u)`
    (`0.5 * (1 + tanh(u)) == sigmoid(2u)`, `u = sqrt(2/pi) (x + 0.044715
    x^3)`), 5 ops forward and 7 back; the erf form keeps the normal CDF for
    the backward pass. The same function as `ops.gelu` to float rounding
    (tests/test_fused.py); inference keeps `tf.nn.gelu`, which grappler
    fuses into the matmul.
    """
    tf = _tensorflow()
    dtype = x.dtype

    @tf.custom_gradient
    def gelu(x):
        if approximate:
            c = (2.0 / math.pi) ** 0.5
            x2 = x * x
            s = tf.sigmoid(x * (tf.cast(2 * c, dtype) + tf.cast(2 * c * 0.044715, dtype) * x2))

            def grad(dy):
                slope = tf.cast(2 * c, dtype) + tf.cast(6 * c * 0.044715, dtype) * x2
                return dy * (s + x * s * (1 - s) * slope)

            return x * s, grad
        cdf = 0.5 * (1.0 + tf.math.erf(x * tf.cast(0.5 ** 0.5, dtype)))

        def grad(dy):
            density = tf.exp(-0.5 * x * x) * tf.cast((2 * math.pi) ** -0.5, dtype)
            return dy * (cdf + x * density)

        return x * cdf, grad

    return gelu(x)


def dense(layer, x, gelu=False, training=False):
    """`layer(x)`, then GELU if `gelu`, for a `keras.layers.Dense`
    without its own activation and a 2-D `x` of shape `(rows, features)`.

    `gelu`: False (none), True or "tanh" (the tanh approximation), "erf"
    (exact GELU), "quick" (`x * sigmoid(1.702 x)`). `training`: on
    TensorFlow a training call takes the tanh or erf GELU with a
    written-out gradient (`_gelu_with_gradient`).

    Must be called from inside the owning layer's `call`, so that the
    mixed-precision autocast scope casts the kernel to the compute dtype.
    A quantized `Dense` (`layer.quantize(...)`) is simply called.
    """
    if layer.quantization_mode or layer.activation is not keras.activations.linear:
        y = layer(x)
    else:
        y = ops.matmul(x, ops.cast(layer.kernel, x.dtype))
        if layer.bias is not None:
            bias = ops.cast(layer.bias, x.dtype)
            if keras.backend.backend() == "tensorflow":
                y = _tensorflow().nn.bias_add(y, bias)
            else:
                y = ops.add(y, bias)
    # On TensorFlow ops.gelu is tf.nn.gelu, the op grappler fuses.
    if not gelu:
        return y
    if gelu == "quick":
        return quick_gelu(y)
    if training and keras.backend.backend() == "tensorflow":
        return _gelu_with_gradient(y, approximate=gelu != "erf")
    if gelu == "erf":
        return gelu_erf(y)
    return gelu_tanh(y)


ATTENTION_IMPLEMENTATIONS = ("auto", "fused", "dot_product")


def check_attention(attention):
    """Validates an attention implementation name (see `TransformerBlock`)."""
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"Unknown attention={attention!r}; allowed: {ATTENTION_IMPLEMENTATIONS} "
            "('auto' picks the faster one for the backend and device).")
    return attention


def accelerator():
    """The platform the Keras backend computes on: `"cpu"`, `"gpu"` or
    `"tpu"` (`keras.distribution.list_devices()`'s first device; on torch,
    which has no `keras.distribution`, where Keras puts a new tensor)."""
    if keras.backend.backend() == "torch":
        platform = ops.zeros(()).device.type
        return {"cuda": "gpu", "xla": "tpu"}.get(platform, platform)
    try:
        devices = keras.distribution.list_devices()
    except Exception:  # noqa: BLE001 - a backend without devices computes on the CPU
        return "cpu"
    platform = str(devices[0]).split(":")[0].lower() if devices else "cpu"
    return {"cuda": "gpu"}.get(platform, platform)


def uses_dot_product_attention(attention, training=False):
    """Whether `attention` ("auto", "fused", "dot_product") computes with
    `keras.ops.dot_product_attention` on this backend and device.

    "auto" takes what measured faster (`benchmarks/accelerator.py`;
    `docs/performance/accelerator.md`: ViT-B/16 and L/16, bfloat16, batch
    128, one H100; `docs/performance/attention_cpu.json`: ViT-S/16, float32,
    batch 8, 2 CPU cores):

    - torch: `dot_product` (PyTorch's `scaled_dot_product_attention`): on
      the GPU it trained 1.56x faster in 28% less memory, on the CPU 1.12x,
      and inferred 1.2x faster on the CPU (GPU inference: a tie within
      that run's noise);
    - JAX on a GPU: `dot_product` (cuDNN flash attention, `padded_attention`):
      ViT-B/16 trained 1.22x and inferred 1.25x faster than the explicit
      path, in 17% less memory;
    - JAX on a TPU (not measured): `dot_product` for inference (Keras'
      splash-attention kernel), the explicit path for training;
    - JAX on the CPU: the explicit path (`dot_product` took 1.8x as long);
    - TensorFlow: the explicit path (oneDNN fuses it on CPU; TensorFlow's
      `dot_product_attention` is the same einsum-softmax-einsum, a tie).
    """
    if attention != "auto":
        return attention == "dot_product"
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend != "jax":
        return False
    platform = accelerator()
    return platform == "gpu" or (platform == "tpu" and not training)


def _rotate_query_key(query, key, rope, rope_variant):
    """`query`, `key` rotated by a `RotaryEmbedding` output `rope`
    `(tokens, 2 * head_dim)` (`keras_vit.layers.rotary.apply_rope`), for
    the `(..., tokens, head_dim)` layout; unchanged without `rope`."""
    if rope is None:
        return query, key
    return apply_rope(query, rope, rope_variant), apply_rope(key, rope, rope_variant)


def dot_product_attention(qkv, tokens, num_heads, rope=None, rope_variant=None, bias=None):
    """Multi-head softmax attention from a fused `(batch * tokens, 3 * width)`
    query-key-value projection through flash-attention kernels where the
    backend has them: cuDNN's on a JAX GPU (`padded_attention`), else
    `keras.ops.dot_product_attention`.

    The same function as `softmax_attention` without attention dropout:
    logits `query . key / sqrt(dim)`, softmax in float32, weights cast to
    the compute dtype before the product with the values (in float32 the
    results agree to float32 rounding, `tests/test_fused.py`). The
    `(batch, tokens, heads, dim)` layout the kernels take is the projection's
    own, so no transpose is needed. `rope`, `rope_variant` and `bias` as
    `softmax_attention`'s.

    Returns:
        output `(batch * tokens, width)` in the compute dtype.
    """
    width = qkv.shape[-1] // 3
    head_dim = width // num_heads
    qkv = ops.reshape(qkv, (-1, tokens, 3, num_heads, head_dim))
    query, key, value = ops.unstack(qkv, 3, axis=2)
    if rope is not None:  # (tokens, 1, 2 dim): broadcast over the heads
        query, key = _rotate_query_key(query, key, rope[:, None, :], rope_variant)
    scale = 1.0 / head_dim ** 0.5
    out = None
    if keras.backend.backend() == "jax" and accelerator() == "gpu" and bias is None:
        out = _jax_cudnn_attention(query, key, value, scale)
    if out is None:
        out = ops.dot_product_attention(
            query, key, value, scale=scale,
            bias=None if bias is None else ops.cast(bias[None], query.dtype))
    return ops.reshape(out, (-1, width))


def padded_attention(query, key, value, scale, implementation):
    """`jax.nn.dot_product_attention` over `(batch, tokens, heads, dim)` with
    an odd token count padded by one zero token: the padded key is masked
    out (`key_value_seq_lengths`) and the padded query row dropped, so the
    result and its gradients are those of the unpadded attention.

    cuDNN's flash-attention training kernels take even sequence lengths
    only (JAX raises "Unsupported sequence length" otherwise), and a ViT
    with a class token has an odd count (197 at 224 px). An even count runs
    as it is.
    """
    import jax
    import jax.numpy as jnp

    tokens = query.shape[1]
    if tokens % 2 == 0:
        return jax.nn.dot_product_attention(query, key, value, scale=scale,
                                            implementation=implementation)
    pad = ((0, 0), (0, 1), (0, 0), (0, 0))
    query, key, value = (jnp.pad(x, pad) for x in (query, key, value))
    lengths = jnp.full((query.shape[0],), tokens, jnp.int32)
    out = jax.nn.dot_product_attention(
        query, key, value, scale=scale, query_seq_lengths=lengths,
        key_value_seq_lengths=lengths, implementation=implementation)
    return out[:, :tokens]


def _jax_cudnn_attention(query, key, value, scale):
    """cuDNN flash attention (`padded_attention`) on a JAX GPU, or None where
    cuDNN does not take these inputs (float32, an old GPU or cuDNN): the
    caller then uses `keras.ops.dot_product_attention`. Keras' own op would
    fall back to XLA's unfused path for every odd token count in training
    (`docs/performance/accelerator.md`)."""
    try:
        return padded_attention(query, key, value, scale, "cudnn")
    except (NotImplementedError, RuntimeError, ValueError):
        return None


def softmax_attention(qkv, tokens, num_heads, dropout, training, rope=None,
                      rope_variant=None, bias=None):
    """Multi-head softmax attention from a fused `(batch * tokens, 3 * width)`
    query-key-value projection.

    One transpose puts the heads first (`(3, batch, heads, tokens, dim)`), so
    both products are plain batched matmuls and the output needs one
    transpose back. The query is divided by `sqrt(dim)` before the
    product, as in the official model.

    The softmax is computed in float32: under a mixed policy the logits are
    cast up, except on TensorFlow with oneDNN, whose bfloat16/float16
    softmax kernel already accumulates in float32 (same result, two fewer
    casts over `(batch, heads, tokens, tokens)`).

    `rope`: None, or a `RotaryEmbedding` output `(tokens, 2 * head_dim)`
    that the queries and keys are rotated by (in float32, before the
    scaling), in the layout of `rope_variant`. `bias`: None, or a
    `(heads, tokens, tokens)` float32 bias added to the logits (BEiT's
    relative position bias).

    Returns:
        `(output, weights)`: output `(batch * tokens, width)` in the compute
        dtype; weights `(batch, heads, tokens, tokens)` before dropout, in
        the dtype the softmax ran in.
    """
    width = qkv.shape[-1] // 3
    head_dim = width // num_heads
    dtype = qkv.dtype
    qkv = ops.reshape(qkv, (-1, tokens, 3, num_heads, head_dim))
    # Unstack, not qkv[i]: the gradient of three slices is three scatters
    # into zero tensors of the full size (15% of a ViT-S training step).
    query, key, value = ops.unstack(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3, axis=0)
    query, key = _rotate_query_key(query, key, rope, rope_variant)
    query = query / ops.cast(head_dim ** 0.5, dtype)
    if keras.backend.backend() == "tensorflow":
        logits = _tensorflow().matmul(query, key, transpose_b=True)
    else:
        logits = ops.matmul(query, ops.swapaxes(key, -1, -2))
    if bias is not None:
        logits = ops.cast(logits, "float32") + bias[None]
    elif dtype != "float32" and not _onednn_tensorflow():
        logits = ops.cast(logits, "float32")
    weights = ops.softmax(logits, axis=-1)
    dropped = dropout(weights, training=training)
    out = ops.matmul(ops.cast(dropped, dtype), value)
    out = ops.transpose(out, (0, 2, 1, 3))
    return ops.reshape(out, (-1, width)), weights
