"""The token options of the later ViT families (issue 48, item 1): register
tokens (DINOv2-reg), a distillation token (DeiT), position embeddings that
leave the prefix tokens out (timm's `no_embed_class`), a patch projection
without bias and a LayerNorm after the embeddings (OpenAI CLIP). Known
answers in NumPy, the layer harness, a tiny VisionTransformer saved and
reloaded with safe_mode, and today's models unchanged at the defaults."""

import os
import re

import keras
import numpy as np
import pytest
from harness import run_layer_test
from keras import ops

from keras_vit import layers
from keras_vit.models.vit import VisionTransformer
from keras_vit.weights.posemb import resize_position_embedding

TINY = dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
            input_shape=(32, 32, 3))
ALL_TOKENS = dict(num_register_tokens=3, distillation_token=True, no_embed_class=True,
                  use_bias=False)


@pytest.mark.backends
@pytest.mark.parametrize("kwargs", [
    dict(hidden_size=16, **ALL_TOKENS),
    dict(hidden_size=16, use_class_token=False, num_register_tokens=2),
    dict(hidden_size=16, num_register_tokens=2, no_embed_class=True, grid_size=(2, 4)),
], ids=["all", "registers-no-class", "no-embed-class-resized"])
def test_patch_encoder_options_in_the_layer_harness(kwargs):
    """Config round trip, .keras with safe_mode, mixed_bfloat16, tf.data."""
    layer, (y,) = run_layer_test(layers.PatchEncoder, kwargs, (2, 3, 3, 12))
    assert y.shape == (2, layer.num_prefix_tokens + 9, 16)


def _filled_encoder(grid=None, **kwargs):
    """A built PatchEncoder (patch_dim 6) whose weights are random known arrays."""
    rng = np.random.default_rng(3)
    encoder = layers.PatchEncoder(4, grid_size=grid, **kwargs)
    encoder.build((None, 2, 3, 6))
    values = {w.path.split("/")[-1]: rng.normal(size=w.shape).astype("float32")
              for w in encoder.weights}
    for w in encoder.weights:
        w.assign(values[w.path.split("/")[-1]])
    return encoder, values


@pytest.mark.parametrize("no_embed_class", [False, True])
@pytest.mark.parametrize("use_bias", [True, False])
def test_prefix_tokens_in_timm_order_with_positions(no_embed_class, use_bias):
    """[class; distillation; registers; patches E (+ b)] + E_pos, or with
    no_embed_class E_pos added to the patch tokens only, in NumPy."""
    encoder, w = _filled_encoder(num_register_tokens=2, distillation_token=True,
                                 no_embed_class=no_embed_class, use_bias=use_bias)
    x = np.random.default_rng(4).normal(size=(2, 2, 3, 6)).astype("float32")
    patches = x.reshape(2, 6, 6) @ w["kernel"] + (w["bias"] if use_bias else 0.0)
    prefix = np.concatenate([w["class_token"], w["distillation_token"],
                             w["register_tokens"]], axis=1)
    prefix = np.broadcast_to(prefix, (2, 4, 4))
    posemb = w["position_embedding"]
    if no_embed_class:
        assert posemb.shape == (1, 6, 4)
        expected = np.concatenate([prefix, patches + posemb], axis=1)
    else:
        assert posemb.shape == (1, 10, 4)
        expected = np.concatenate([prefix, patches], axis=1) + posemb
    assert encoder.num_prefix_tokens == 4
    assert ("bias" in w) == use_bias
    np.testing.assert_allclose(ops.convert_to_numpy(encoder(x)), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_another_grid_resizes_only_the_patch_positions(no_embed_class):
    """A 4x2 input on a 2x3 stored grid: the patch positions resized as
    `weights.resize_position_embedding` (scipy) does; the prefix tokens, and
    with no_embed_class their (absent) positions, never resized."""
    encoder, w = _filled_encoder(grid=(2, 3), num_register_tokens=2,
                                 no_embed_class=no_embed_class)
    x = np.zeros((1, 4, 2, 6), "float32")  # zero patches: the output is tokens + positions
    embedded = 0 if no_embed_class else 3
    posemb = resize_position_embedding(w["position_embedding"], (4, 2), embedded, (2, 3))
    prefix = np.concatenate([w["class_token"], w["register_tokens"]], axis=1)
    patch_part = w["bias"] + posemb[:, embedded:]
    prefix_part = prefix + (0.0 if no_embed_class else posemb[:, :3])
    expected = np.concatenate([prefix_part, patch_part], axis=1)
    np.testing.assert_allclose(ops.convert_to_numpy(encoder(x)), expected,
                               rtol=1e-5, atol=1e-5)


def _sequence_and_pool(**kwargs):
    """(the normed token sequence, the pooled vector) of one tiny model."""
    model = VisionTransformer(**TINY, include_top=False, **kwargs)
    x = np.random.default_rng(5).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    probe = keras.Model(model.inputs, [model.get_layer("encoder_norm").output, model.output])
    return [ops.convert_to_numpy(y) for y in probe(x)]


@pytest.mark.parametrize("kwargs, prefix", [
    (dict(classifier="gap", num_register_tokens=4, pooling="gap"), 4),
    (dict(num_register_tokens=2, pooling="gap"), 3),
    (dict(num_register_tokens=2, pooling="avg"), 3),
    (dict(distillation_token=True, pooling="gap"), 2),
    (dict(classifier="gap", pooling="gap"), 0),  # the official gap: every token
], ids=["gap-registers", "gap-class-registers", "avg", "gap-distilled", "gap-official"])
def test_gap_averages_the_patch_tokens_only(kwargs, prefix):
    """As timm's global_pool='avg' with num_prefix_tokens: registers, the
    distillation token and the class token are left out of the mean."""
    sequence, pooled = _sequence_and_pool(**kwargs)
    assert sequence.shape[1] == prefix + 16
    np.testing.assert_allclose(pooled, sequence[:, prefix:].mean(axis=1), rtol=1e-5,
                               atol=1e-6)


def test_token_pooling_reads_the_class_token_before_the_others():
    sequence, pooled = _sequence_and_pool(num_register_tokens=2, distillation_token=True,
                                          pooling="token")
    assert sequence.shape[1] == 4 + 16  # class, distillation, 2 registers
    np.testing.assert_array_equal(pooled, sequence[:, 0])


def test_pre_norm_normalises_the_embeddings():
    """CLIP's ln_pre: LayerNorm(eps 1e-6 here) of the PatchEncoder's output."""
    model = VisionTransformer(**TINY, classes=3, pre_norm=True, patch_bias=False)
    norm = model.get_layer("pre_norm")
    norm.gamma.assign(np.linspace(0.5, 2.0, 16, dtype="float32"))
    norm.beta.assign(np.linspace(-1.0, 1.0, 16, dtype="float32"))
    probe = keras.Model(model.inputs, [model.get_layer("patch_encoder").output, norm.output])
    x = np.random.default_rng(6).uniform(0, 255, size=(1, 32, 32, 3)).astype("float32")
    tokens, normed = (ops.convert_to_numpy(y) for y in probe(x))
    mean = tokens.mean(-1, keepdims=True)
    var = tokens.var(-1, keepdims=True)
    expected = (tokens - mean) / np.sqrt(var + 1e-6) * np.linspace(0.5, 2.0, 16) \
        + np.linspace(-1.0, 1.0, 16)
    np.testing.assert_allclose(normed, expected, rtol=1e-4, atol=1e-5)
    assert "patch_encoder/bias" not in [w.path for w in model.weights]


def test_pre_norm_in_float32_under_mixed_precision():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = VisionTransformer(**TINY, classes=3, pre_norm=True)
    finally:
        keras.config.set_dtype_policy("float32")
    assert model.get_layer("pre_norm").compute_dtype == "float32"


def test_tiny_model_with_every_option_saves_and_reloads(tmp_path):
    model = VisionTransformer(**TINY, include_top=False, pooling="token",
                              num_register_tokens=2, distillation_token=True,
                              no_embed_class=True, patch_bias=False, pre_norm=True)
    assert model.count_params() < 10_000
    x = np.random.default_rng(7).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    path = os.fspath(tmp_path / "tokens.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(loaded(x)),
                                  ops.convert_to_numpy(model(x)))
    encoder = loaded.get_layer("patch_encoder")
    assert (encoder.num_register_tokens, encoder.distillation_token, encoder.no_embed_class,
            encoder.use_bias) == (2, True, True, False)


def test_features_only_leaves_every_prefix_token_out():
    model = VisionTransformer(**TINY, features_only=True, out_indices=1,
                              num_register_tokens=4)
    x = np.zeros((1, 32, 32, 3), "float32")
    features = model(x)
    features = features[0] if isinstance(features, (list, tuple)) else features
    assert ops.convert_to_numpy(features).shape == (1, 4, 4, 16)


# A default model's weights, exactly as before these options (names and shapes).
DEFAULT_WEIGHTS = [
    ("patch_encoder/kernel", (192, 16)), ("patch_encoder/bias", (16,)),
    ("patch_encoder/class_token", (1, 1, 16)),
    ("patch_encoder/position_embedding", (1, 17, 16)),
    ("encoderblock_0/norm1/gamma", (16,)), ("encoderblock_0/norm1/beta", (16,)),
]


def test_defaults_draw_todays_initial_weights():
    """A seeded run's initial weights are today's: building a default
    PatchEncoder draws from Python's `random` (whence unseeded Keras
    initializers take their seeds) as before the token options. An
    initializer made in `__init__` for the (absent) tokens moved every later
    draw: the quickstart then trained another model. Known answer: this
    tiny ViT's absolute weight sum under `set_random_seed(0)` at 9e06fe0,
    before the options (TensorFlow's random ops)."""
    import random

    keras.utils.set_random_seed(0)
    model = VisionTransformer(patch_size=4, hidden_size=16, num_layers=2, num_heads=2,
                              mlp_dim=32, input_shape=(32, 32, 3), classes=3)
    total = float(sum(np.abs(w).sum() for w in model.get_weights()))
    if keras.backend.backend() == "tensorflow":
        assert total == pytest.approx(881.88720703125, rel=1e-6)
        assert random.random() == pytest.approx(0.5833820394550312)


def test_defaults_keep_todays_model():
    """Same weights list, names and shapes, and the same outputs as with
    every new option spelled out at its default."""
    model = VisionTransformer(**TINY, classes=3)
    got = [(w.path, tuple(w.shape)) for w in model.weights]
    assert got[:len(DEFAULT_WEIGHTS)] == DEFAULT_WEIGHTS
    assert "pre_norm" not in [layer.name for layer in model.layers]
    assert model.get_layer("pool").num_prefix_tokens == 0
    spelled = VisionTransformer(**TINY, classes=3, num_register_tokens=0,
                                distillation_token=False, no_embed_class=False,
                                patch_bias=True, pre_norm=False)
    assert [(w.path, tuple(w.shape)) for w in spelled.weights] == got
    spelled.set_weights(model.get_weights())
    x = np.random.default_rng(8).uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(ops.convert_to_numpy(spelled(x)),
                                  ops.convert_to_numpy(model(x)))


def test_the_distilled_classifier_is_one_dense_on_the_two_tokens():
    """DeiT's head and head_dist averaged: (x_cls W + b + x_dist W_d + b_d) / 2
    is the one Dense `head` on [x_cls, x_dist]; without a head,
    pooling='distilled' is the tokens' mean (timm's pre_logits)."""
    model = VisionTransformer(**TINY, distillation_token=True, classes=3,
                              classifier_activation=None)
    assert model.get_layer("pool").mode == "token_dist"
    kernel = model.get_layer("head").kernel
    assert tuple(kernel.shape) == (32, 3)
    rng = np.random.default_rng(3)
    w, w_dist, b, b_dist = (rng.normal(size=s).astype("float32")
                            for s in ((16, 3), (16, 3), (3,), (3,)))
    model.get_layer("head").set_weights([np.concatenate([w, w_dist]) / 2, (b + b_dist) / 2])
    x = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    tokens = keras.Model(model.inputs, model.get_layer("encoder_norm").output)(x)
    tokens = ops.convert_to_numpy(tokens)
    expected = (tokens[:, 0] @ w + b + tokens[:, 1] @ w_dist + b_dist) / 2
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)), expected, atol=1e-5)
    headless = VisionTransformer(**TINY, distillation_token=True, include_top=False,
                                 pooling="distilled")
    headless.set_weights(model.get_weights()[:len(headless.weights)])
    np.testing.assert_allclose(ops.convert_to_numpy(headless(x)),
                               (tokens[:, 0] + tokens[:, 1]) / 2, atol=1e-6)


def test_the_token_avg_classifier_reads_the_class_token_beside_the_patch_mean():
    """classifier='token_avg' (DINOv2's linear head): the head reads
    [x_cls, mean of the patch tokens], registers left out."""
    model = VisionTransformer(**TINY, classifier="token_avg", num_register_tokens=2,
                              classes=3, classifier_activation=None)
    head = model.get_layer("head")
    assert tuple(head.kernel.shape) == (32, 3)
    rng = np.random.default_rng(4)
    head.set_weights([rng.normal(size=(32, 3)).astype("float32"), np.ones(3, "float32")])
    x = rng.uniform(0, 255, size=(2, 32, 32, 3)).astype("float32")
    tokens = ops.convert_to_numpy(
        keras.Model(model.inputs, model.get_layer("encoder_norm").output)(x))
    features = np.concatenate([tokens[:, 0], tokens[:, 3:].mean(axis=1)], axis=1)
    np.testing.assert_allclose(ops.convert_to_numpy(model(x)),
                               features @ ops.convert_to_numpy(head.kernel) + 1, atol=1e-5)


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "pooling='distilled' averages the class and distillation tokens; this model "
            "has no distillation token (distillation_token=False). Use pooling='token'.")):
        VisionTransformer(**TINY, include_top=False, pooling="distilled")
    with pytest.raises(ValueError, match=re.escape(
            "pooling='token_avg' needs a class token, but this model has "
            "classifier='gap'. Use pooling='gap'.")):
        VisionTransformer(**TINY, classifier="gap", include_top=False, pooling="token_avg")
    with pytest.raises(ValueError, match=re.escape(
            "representation_size=8 adds pre_logits after a 'token' or 'gap' pooling; "
            "classifier='token_avg' has none. Pass None.")):
        VisionTransformer(**TINY, classifier="token_avg", representation_size=8)
    with pytest.raises(ValueError, match="num_register_tokens"):
        VisionTransformer(**TINY, num_register_tokens=-1)


@pytest.mark.parametrize("no_embed_class", [False, True])
def test_position_embedding_similarity_reads_the_patch_rows(no_embed_class):
    """inspect's Fig. 7 map: the patch rows of the embedding, whether or not
    it holds rows for the class and register tokens."""
    from keras_vit import inspect as vit_inspect

    model = VisionTransformer(**TINY, include_top=False, num_register_tokens=2,
                              no_embed_class=no_embed_class)
    posemb = ops.convert_to_numpy(model.get_layer("patch_encoder").position_embedding)[0]
    patches = posemb[0 if no_embed_class else 3:].astype("float64")
    unit = patches / np.linalg.norm(patches, axis=-1, keepdims=True)
    expected = (unit @ unit.T).reshape(4, 4, 4, 4)
    np.testing.assert_allclose(vit_inspect.position_embedding_similarity(model), expected,
                               rtol=1e-5, atol=1e-6)
