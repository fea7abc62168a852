"""The fused encoder arithmetic (`keras_vit.layers._fused`): the same values
and gradients as the plain Keras layers, eager and traced (where TensorFlow's
grappler fuses it into oneDNN kernels), and only standard ops inside
`portable_graph()`."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers
from keras_vit.layers import _fused


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
