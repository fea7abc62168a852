"""Layers: known answers, training-time behaviour, and for every public
layer the shared checks of `tests/harness.py` (config round trip, `.keras`
with safe_mode, mixed_bfloat16, tf.data, each backend)."""

import numpy as np
import pytest
from harness import run_layer_test
from keras import ops

from keras_vit import layers

# (class, constructor arguments, input shape[, run_layer_test options]): every
# class of `keras_vit.layers.__all__` at least once (checked below).
BLOCK = dict(num_heads=2, mlp_dim=24, dropout_rate=0.1, attention_dropout_rate=0.1,
             drop_path_rate=0.2)
LAYER_CASES = [
    (layers.Patches, dict(patch_size=(4, 2)), (2, 8, 8, 3)),
    (layers.PatchEncoder, dict(hidden_size=16, use_class_token=False), (2, 3, 3, 12)),
    (layers.PatchEncoder, dict(hidden_size=16), (2, 3, 3, 12)),
    (layers.TransformerBlock, BLOCK, (2, 5, 16)),
    # the attention weights: softmax in float32 under a mixed policy (the same
    # shapes as above, so that JAX reuses its compiled ops)
    (layers.TransformerBlock, BLOCK, (2, 5, 16),
     dict(call_kwargs={"return_attention_scores": True}, float32_outputs=(1,),
          expected_output_shape=[(2, 5, 16), (2, 2, 5, 5)])),
    (layers.MixerBlock, dict(tokens_mlp_dim=6, channels_mlp_dim=20, drop_path_rate=0.1),
     (2, 9, 16)),
    (layers.DropPath, dict(rate=0.3, seed=1), (4, 3, 2)),
    (layers.StdConv2D, dict(filters=32, kernel_size=(3, 3), padding="same", use_bias=False),
     (1, 8, 8, 3)),
    (layers.ResNetRoot, dict(width=32), (1, 16, 16, 3)),
    (layers.BottleneckUnit, dict(features=32, strides=(2, 2)), (1, 8, 8, 64)),
    (layers.SequencePooling, dict(mode="gap"), (2, 5, 16)),
    (layers.SequencePooling, dict(mode="max", num_prefix_tokens=1), (2, 5, 16)),
    (layers.SequencePooling, dict(mode="distilled"), (2, 5, 16)),
    (layers.SequencePooling, dict(mode="token_dist"), (2, 5, 16)),
    (layers.SequencePooling, dict(mode="token_avg", num_prefix_tokens=2), (2, 5, 16)),
    (layers.PatchEncoder, dict(hidden_size=16, grid_size=(2, 4)), (2, 3, 3, 12)),
    (layers.ClassifierHead, dict(units=3, class_names=["cat", "dog", "emu"]), (2, 16)),
    (layers.ImageNormalization, dict(mean=[127.5] * 3, variance=[127.5**2] * 3), (2, 4, 4, 3)),
    (layers.LayerScale, dict(init_value=0.1), (2, 5, 16)),
    (layers.AttentionPooling, dict(num_heads=2, mlp_dim=24), (2, 5, 16)),
]


def test_every_public_layer_has_a_case():
    public = {name for name in layers.__all__ if isinstance(getattr(layers, name), type)}
    assert public == {case[0].__name__ for case in LAYER_CASES}


@pytest.mark.backends
@pytest.mark.parametrize("case", LAYER_CASES,
                         ids=[f"{case[0].__name__}-{i}" for i, case in enumerate(LAYER_CASES)])
def test_layer_harness(case):
    """Config round trip, .keras save/load with safe_mode, mixed_bfloat16
    (softmax and LayerNorm statistics in float32, weights float32), inside
    tf.data (TensorFlow): `tests/harness.py`."""
    cls, kwargs, shape, *options = case
    run_layer_test(cls, kwargs, shape, **(options[0] if options else {}))


def test_patches_equal_a_strided_convolution():
    """Patches + PatchEncoder == the official Conv(kernel=stride=patch)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    kernel = rng.normal(size=(4, 2, 3, 5)).astype("float32")
    conv = ops.convert_to_numpy(ops.conv(x, kernel, strides=(4, 2), padding="valid"))
    patches = ops.convert_to_numpy(layers.Patches((4, 2))(x))
    assert patches.shape == (2, 2, 6, 24)
    np.testing.assert_allclose(patches @ kernel.reshape(24, 5), conv, atol=1e-5)


def test_patches_reject_indivisible_size():
    with pytest.raises(ValueError, match=r"Image size \(30, 32\) is not divisible by the patch "
                                         r"size \(16, 16\)\."):
        layers.Patches(16)(np.zeros((1, 30, 32, 3), "float32"))


def test_patch_encoder_prepends_class_token_and_adds_positions():
    encoder = layers.PatchEncoder(4)
    x = np.ones((2, 2, 3, 6), "float32")
    encoder.build(x.shape)
    encoder.kernel.assign(np.zeros((6, 4)))
    encoder.class_token.assign(np.full((1, 1, 4), 7.0))
    encoder.position_embedding.assign(np.arange(28, dtype="float32").reshape(1, 7, 4))
    y = ops.convert_to_numpy(encoder(x))
    assert encoder.grid_size == (2, 3) and encoder.num_prefix_tokens == 1
    np.testing.assert_array_equal(y[:, 0], np.tile(7.0 + np.arange(4), (2, 1)))
    np.testing.assert_array_equal(y[0, 1:], np.arange(4, 28).reshape(6, 4))


def test_transformer_block_attention_weights_are_row_stochastic():
    block = layers.TransformerBlock(num_heads=4, mlp_dim=8)
    x = np.random.default_rng(2).normal(size=(3, 7, 16)).astype("float32")
    y, attention = block(x, return_attention_scores=True)
    attention = ops.convert_to_numpy(attention)
    assert attention.shape == (3, 4, 7, 7)
    np.testing.assert_allclose(attention.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(ops.convert_to_numpy(y), ops.convert_to_numpy(block(x)))


def test_transformer_block_matches_numpy_reference():
    """The equations of Encoder1DBlock, written out in float64 NumPy."""
    block = layers.TransformerBlock(num_heads=2, mlp_dim=12)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block.build(x.shape)
    block.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3
                       for w in block.get_weights()])
    w = {v.path.split("/", 1)[1]: ops.convert_to_numpy(v).astype("float64") for v in block.weights}

    def ln(z, g, b):
        mu, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + 1e-6) * g + b

    def gelu(z):
        return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))

    h = ln(x, w["norm1/gamma"], w["norm1/beta"]) @ w["qkv/kernel"] + w["qkv/bias"]
    q, k, v = (h[..., i * 8:(i + 1) * 8].reshape(2, 5, 2, 4) for i in range(3))
    logits = np.einsum("bqhd,bkhd->bhqk", q / 2.0, k)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bkhd->bqhd", a, v).reshape(2, 5, 8)
    x1 = x + o @ w["attention_output/kernel"] + w["attention_output/bias"]
    m = gelu(ln(x1, w["norm2/gamma"], w["norm2/beta"]) @ w["mlp_dense1/kernel"]
             + w["mlp_dense1/bias"])
    expected = x1 + m @ w["mlp_dense2/kernel"] + w["mlp_dense2/bias"]
    np.testing.assert_allclose(ops.convert_to_numpy(block(x)), expected, rtol=1e-4, atol=1e-4)


def test_drop_path_drops_whole_samples_and_rescales():
    layer = layers.DropPath(0.5, seed=0)
    x = np.ones((256, 3, 4), "float32")
    y = ops.convert_to_numpy(layer(x, training=True))
    per_sample = y.reshape(256, -1)
    assert set(np.unique(per_sample)) <= {0.0, 2.0}
    assert np.all(per_sample.min(1) == per_sample.max(1))  # whole sample
    assert 0.35 < (per_sample[:, 0] == 0).mean() < 0.65
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(x, training=False)), x)


def test_std_conv_standardizes_the_kernel():
    conv = layers.StdConv2D(4, 3, use_bias=False)
    conv.build((1, 5, 5, 2))
    w = ops.convert_to_numpy(conv.standardized_kernel(conv.kernel))
    np.testing.assert_allclose(w.mean(axis=(0, 1, 2)), 0, atol=1e-6)
    np.testing.assert_allclose(w.std(axis=(0, 1, 2)), 1, atol=1e-4)


def test_bottleneck_projection_only_when_shape_changes():
    same = layers.BottleneckUnit(32)
    same.build((1, 8, 8, 128))
    assert not same.has_projection
    changed = layers.BottleneckUnit(32)
    changed.build((1, 8, 8, 64))
    assert changed.has_projection


def test_layer_argument_errors():
    with pytest.raises(ValueError,
                       match=r"`drop_path_rate` must be a number in \[0, 1\), got 1.5\."):
        layers.TransformerBlock(2, 8, drop_path_rate=1.5)
    with pytest.raises(TypeError, match=r"`patch_size` must be a positive integer or a pair of "
                                        r"positive integers, got 'x'\."):
        layers.Patches("x")
    with pytest.raises(ValueError, match=r"The hidden size 10 is not divisible by num_heads=3\."):
        layers.TransformerBlock(3, 8)(np.zeros((1, 2, 10), "float32"))
    with pytest.raises(ValueError, match=r"Unknown pooling mode 'min'; allowed: "
                                         r"\('token', 'gap', 'avg', 'max', 'distilled', "
                                         r"'token_dist', 'token_avg'\)\."):
        layers.SequencePooling("min")
