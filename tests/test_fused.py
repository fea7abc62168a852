"""The fused encoder arithmetic (`keras_vit.layers.fused`): the same values
and gradients as the plain Keras layers, eager and traced (where TensorFlow's
grappler fuses it into oneDNN kernels), and only standard ops inside
`portable_graph()`."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers
from keras_vit.layers import fused as _fused


def _random_weights(layer, seed, scale=0.3):
    rng = np.random.default_rng(seed)
    layer.set_weights([rng.normal(size=w.shape).astype("float32") * scale
                       for w in layer.get_weights()])


@pytest.mark.backends
def test_fused_dense_and_layer_norm_equal_the_keras_layers():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 8)).astype("float32")
    dense = keras.layers.Dense(12)
    dense.build(x.shape)
    _random_weights(dense, 1)
    expected = ops.convert_to_numpy(dense(x))
    np.testing.assert_allclose(ops.convert_to_numpy(_fused.dense(dense, x)), expected,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(_fused.dense(dense, x, gelu=True)),
                               ops.convert_to_numpy(ops.gelu(expected, approximate=True)),
                               rtol=1e-6, atol=1e-6)

    tokens = rng.normal(size=(2, 5, 8)).astype("float32") * 3 + 1
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    norm.build(tokens.shape)
    _random_weights(norm, 2, scale=1.0)
    np.testing.assert_allclose(ops.convert_to_numpy(_fused.layer_norm(norm, tokens)),
                               ops.convert_to_numpy(norm(tokens)), rtol=1e-5, atol=1e-5)


@pytest.mark.backends
def test_quantized_dense_is_called_as_is():
    x = np.random.default_rng(0).normal(size=(4, 16)).astype("float32")
    dense = keras.layers.Dense(8)
    dense.build(x.shape)
    dense.quantize("int8")
    np.testing.assert_array_equal(ops.convert_to_numpy(_fused.dense(dense, x)),
                                  ops.convert_to_numpy(dense(x)))


def _traced_value_and_gradients(block, x, portable):
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = block(x, training=False)
            loss = tf.reduce_sum(y * tf.cos(y))
        return y, tape.gradient(loss, [x, *block.trainable_variables])

    if portable:
        with _fused.portable_graph():
            return step(tf.constant(x))
    return step(tf.constant(x))


def _op_types(block, shape, portable):
    import tensorflow as tf

    traced = tf.function(lambda x: block(x, training=False))
    spec = tf.TensorSpec(shape, tf.float32)
    if portable:
        with _fused.portable_graph():
            graph = traced.get_concrete_function(spec).graph
    else:
        graph = traced.get_concrete_function(spec).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("block", [
    layers.TransformerBlock(num_heads=2, mlp_dim=24),
    layers.MixerBlock(tokens_mlp_dim=6, channels_mlp_dim=20),
], ids=["transformer", "mixer"])
def test_fused_and_portable_graphs_agree_in_value_and_gradient(block):
    x = np.random.default_rng(4).normal(size=(3, 9, 16)).astype("float32")
    block.build(x.shape)
    _random_weights(block, 5)
    fused_y, fused_grads = _traced_value_and_gradients(block, x, portable=False)
    plain_y, plain_grads = _traced_value_and_gradients(block, x, portable=True)
    np.testing.assert_allclose(fused_y.numpy(), plain_y.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fused_y.numpy(), ops.convert_to_numpy(block(x)),
                               rtol=1e-5, atol=1e-5)
    assert len(fused_grads) == len(block.trainable_variables) + 1
    for fused, plain in zip(fused_grads, plain_grads, strict=True):
        np.testing.assert_allclose(fused.numpy(), plain.numpy(), rtol=1e-4, atol=1e-4)

    fused_ops = _op_types(block, (None, 9, 16), portable=False)
    portable_ops = _op_types(block, (None, 9, 16), portable=True)
    assert {"FusedBatchNormV3", "Bitcast"} <= fused_ops
    assert not {"FusedBatchNormV3", "Bitcast"} & portable_ops
    assert "Mean" in portable_ops  # the standard LayerNorm formula


def test_xla_compiled_blocks_use_the_plain_layer_norm():
    """jit_compile=True (and TPUs) need static shapes: the fused LayerNorm
    pattern's opaque row count must not reach XLA."""
    import tensorflow as tf

    x = np.random.default_rng(8).normal(size=(2, 9, 16)).astype("float32")
    for block in (layers.TransformerBlock(num_heads=2, mlp_dim=24),
                  layers.MixerBlock(tokens_mlp_dim=6, channels_mlp_dim=20)):
        block.build(x.shape)
        _random_weights(block, 9)
        compiled = tf.function(lambda x, block=block: block(x, training=False), jit_compile=True)
        np.testing.assert_allclose(compiled(x).numpy(), ops.convert_to_numpy(block(x)),
                                   rtol=1e-5, atol=1e-5)


def test_mixed_bfloat16_block_follows_the_float32_block():
    x = np.random.default_rng(6).normal(size=(2, 9, 32)).astype("float32")
    full = layers.TransformerBlock(num_heads=4, mlp_dim=64)
    half = layers.TransformerBlock(num_heads=4, mlp_dim=64, dtype="mixed_bfloat16")
    full.build(x.shape)
    half.build(x.shape)
    _random_weights(full, 7, scale=0.2)
    half.set_weights(full.get_weights())
    import tensorflow as tf

    expected = full(x).numpy()
    eager, attention = half(x, return_attention_scores=True)
    traced = tf.function(lambda x: half(x, training=False))(x)
    for y in (eager, traced):
        assert y.dtype == tf.bfloat16
        np.testing.assert_allclose(tf.cast(y, tf.float32).numpy(), expected,
                                   rtol=0.05, atol=0.05 * np.abs(expected).max())
    assert attention.dtype == tf.float32
    np.testing.assert_allclose(attention.numpy().sum(-1), 1.0, atol=1e-2)


def _attention_pair(dtype, seed=10, **kwargs):
    """Two TransformerBlocks with the same weights, one per attention
    implementation."""
    x = np.random.default_rng(seed).normal(size=(2, 9, 32)).astype("float32")
    pair = [layers.TransformerBlock(num_heads=4, mlp_dim=48, attention=attention,
                                    dtype=dtype, **kwargs)
            for attention in ("fused", "dot_product")]
    for block in pair:
        block.build(x.shape)
    _random_weights(pair[0], seed + 1, scale=0.3)
    pair[1].set_weights(pair[0].get_weights())
    return x, pair


def _value_and_gradient(block, x):
    """The block's output and the gradient of a weighted sum of it with
    respect to the input and every weight, on any backend."""
    backend = keras.backend.backend()
    weights = np.linspace(-1.0, 1.0, x.size, dtype="float32").reshape(x.shape)
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = block(x, training=True)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
        grads = tape.gradient(loss, [x] + [v.value for v in block.trainable_variables])
        return ops.convert_to_numpy(y), [ops.convert_to_numpy(g) for g in grads]
    if backend == "jax":
        import jax

        values = [v.value for v in block.trainable_variables]

        def loss(x, values):
            y, _ = block.stateless_call(values, [v.value for v in
                                                 block.non_trainable_variables],
                                        x, training=True)
            return (y.astype("float32") * weights).sum(), y

        (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
            x, values)
        return np.asarray(y), [np.asarray(grads[0])] + [np.asarray(g) for g in grads[1]]
    import torch

    x = torch.tensor(x, requires_grad=True)
    y = block(x, training=True)
    (y.float() * torch.tensor(weights)).sum().backward()
    grads = [x.grad] + [v.value.grad for v in block.trainable_variables]
    return ops.convert_to_numpy(y), [g.float().numpy() for g in grads]


@pytest.mark.backends
def test_dot_product_attention_equals_the_fused_attention_in_value_and_gradient():
    x, (fused, dot_product) = _attention_pair("float32")
    y_fused, g_fused = _value_and_gradient(fused, x)
    y_dot, g_dot = _value_and_gradient(dot_product, x)
    np.testing.assert_allclose(y_dot, y_fused, rtol=1e-5, atol=1e-5)
    assert len(g_dot) == len(g_fused) == 1 + len(fused.trainable_variables)
    for a, b in zip(g_dot, g_fused, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(b).max()))
    assert dot_product.get_config()["attention"] == "dot_product"
    assert layers.TransformerBlock.from_config(dot_product.get_config()).attention \
        == "dot_product"


@pytest.mark.backends
def test_dot_product_attention_under_mixed_bfloat16_follows_the_fused_block():
    """Under the same mixed_bfloat16 policy both implementations take the
    softmax in float32 from bfloat16 operands: they differ by bfloat16
    rounding only."""
    x, (fused, dot_product) = _attention_pair("mixed_bfloat16", seed=20)
    y_fused = ops.convert_to_numpy(ops.cast(fused(x), "float32"))
    y_dot = ops.convert_to_numpy(ops.cast(dot_product(x), "float32"))
    assert keras.backend.standardize_dtype(dot_product(x).dtype) == "bfloat16"
    np.testing.assert_allclose(y_dot, y_fused, rtol=0.02, atol=0.02 * np.abs(y_fused).max())


@pytest.mark.backends
def test_attention_scores_and_attention_dropout_take_the_fused_path(monkeypatch):
    calls = []
    monkeypatch.setattr(
        "keras_vit.layers.transformer.softmax_attention",
        lambda *args, **kwargs: calls.append("fused") or _fused.softmax_attention(*args, **kwargs))
    x, (_, block) = _attention_pair("float32")
    block(x)
    assert calls == []
    _, scores = block(x, return_attention_scores=True)
    assert calls == ["fused"] and tuple(scores.shape) == (2, 4, 9, 9)
    dropping = layers.TransformerBlock(num_heads=4, mlp_dim=48, attention="dot_product",
                                       attention_dropout_rate=0.1)
    dropping(x, training=True)
    assert calls == ["fused", "fused"]
    dropping(x, training=False)
    assert calls == ["fused", "fused"]


@pytest.mark.backends
def test_auto_attention_takes_what_measured_faster(monkeypatch):
    """What measured faster (docs/performance/accelerator.md)."""
    backend = keras.backend.backend()
    assert _fused.accelerator() == "cpu"
    for training in (False, True):
        assert _fused.uses_dot_product_attention("auto", training) == (backend == "torch")
        assert _fused.uses_dot_product_attention("dot_product", training)
        assert not _fused.uses_dot_product_attention("fused", training)
    monkeypatch.setattr(_fused, "accelerator", lambda: "gpu")
    for training in (False, True):
        assert _fused.uses_dot_product_attention("auto", training) == (
            backend in ("jax", "torch"))
    monkeypatch.setattr(_fused, "accelerator", lambda: "tpu")
    assert _fused.uses_dot_product_attention("auto") == (backend in ("jax", "torch"))
    assert _fused.uses_dot_product_attention("auto", training=True) == (backend == "torch")
    with pytest.raises(ValueError, match=r"Unknown attention='flash'; allowed: "
                                         r"\('auto', 'fused', 'dot_product'\)"):
        layers.TransformerBlock(num_heads=2, mlp_dim=8, attention="flash")


def test_padded_attention_equals_the_unpadded_attention_in_value_and_gradient():
    """cuDNN's training kernels take even token counts only; an odd count (a
    class token) is padded by one masked token and its query row dropped.
    Through JAX's XLA implementation the padded attention gives the
    unpadded values and gradients; an even count runs unpadded."""
    import jax

    def loss(attention, weights):
        return lambda q, k, v: (attention(q, k, v) * weights).sum()

    seeds = jax.random.split(jax.random.PRNGKey(0), 4)
    for tokens in (9, 8):
        query, key, value, weights = (jax.random.normal(s, (2, tokens, 3, 8)) for s in seeds)

        expected = jax.value_and_grad(loss(lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, scale=0.3, implementation="xla"), weights),
            argnums=(0, 1, 2))(query, key, value)
        got = jax.value_and_grad(loss(lambda q, k, v: _fused.padded_attention(
            q, k, v, 0.3, "xla"), weights), argnums=(0, 1, 2))(query, key, value)
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
        for a, b in zip(got[1], expected[1], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("gelu", ["tanh", "erf"])
def test_training_gelu_has_the_value_and_gradient_of_keras_gelu(gelu):
    """TensorFlow training calls take a GELU with its derivative written out
    (fewer ops than the derived gradient); it is `ops.gelu` to float32
    rounding, in value and gradient, for both forms, and keeps the dtype."""
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).normal(size=(4000,)) * 4, "float32")
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours = _fused._gelu_with_gradient(x, approximate=gelu == "tanh")
        keras_gelu = tf.nn.gelu(x, approximate=gelu == "tanh")
    np.testing.assert_allclose(ours, keras_gelu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(ours, x), tape.gradient(keras_gelu, x),
                               rtol=1e-5, atol=1e-5)
    half = tf.cast(x, "bfloat16")
    with tf.GradientTape() as tape:
        tape.watch(half)
        y = _fused._gelu_with_gradient(half, approximate=gelu == "tanh")
    assert y.dtype == tape.gradient(y, half).dtype == tf.bfloat16
