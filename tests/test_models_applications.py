"""The model builders' keras.applications conventions: `pooling="avg"/"max"`
feature vectors and `input_shape=(None, None, 3)` models that take any image
size (position embeddings resized in the graph with the official algorithm)."""

import re

import keras
import numpy as np
import pytest

import keras_vit
from conftest import predict, run_cli
from official_fixtures import Fixture, assert_close
from keras_vit.layers import PatchEncoder, interpolate_position_embedding
from keras_vit.weights.posemb import resize_position_embedding

VIT = dict(patch_size=4, hidden_size=24, num_layers=2, num_heads=2, mlp_dim=48)
HYBRID = dict(patch_size=1, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
              resnet_layers=(1,), resnet_width=1)  # stem stride 4: 4 pixels per token
MIXER = dict(patch_size=4, hidden_size=24, num_blocks=2, tokens_mlp_dim=12,
             channels_mlp_dim=48)


def images(*shape, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, shape).astype("float32")


def randomize(model, seed=1):
    """Non-trivial weights everywhere (the head and the class token start
    at zero, the last GroupNorms with zero scale)."""
    rng = np.random.default_rng(seed)
    model.set_weights([w + rng.normal(0, 0.2, w.shape).astype(w.dtype)
                       for w in model.get_weights()])
    return model


def checkpoint(tmp_path, config, size, name="ckpt.npz", **kwargs):
    """An official-format .npz of a random model built at `size`."""
    model = randomize(keras_vit.VisionTransformer(
        **config, input_shape=(size, size, 3), classes=5, **kwargs))
    return keras_vit.save_official_weights(model, tmp_path / name)


# --- pooling="avg" / "max" --------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("builder,config,prefix", [
    (keras_vit.VisionTransformer, dict(VIT, classifier="token"), 1),
    (keras_vit.VisionTransformer, dict(VIT, classifier="gap"), 0),
    (keras_vit.VisionTransformer, HYBRID, 1),
    (keras_vit.MLPMixer, MIXER, 0),
], ids=["vit_token", "vit_gap", "hybrid", "mixer"])
def test_avg_and_max_pool_the_patch_tokens_of_the_sequence_output(builder, config, prefix):
    sequence_model = randomize(builder(**config, input_shape=(16, 16, 3), include_top=False))
    x = images(3, 16, 16, 3)
    sequence = predict(sequence_model, x)  # after the final LayerNorm
    patches = sequence[:, prefix:]
    for pooling, expected in (("avg", patches.mean(1)), ("max", patches.max(1))):
        model = builder(**config, input_shape=(16, 16, 3), include_top=False,
                        pooling=pooling)
        model.set_weights(sequence_model.get_weights())
        assert model.output_shape == (None, config["hidden_size"])
        np.testing.assert_allclose(predict(model, x), expected, rtol=1e-6, atol=1e-6)
    if builder is keras_vit.MLPMixer:  # "gap" is the Mixer's own pooling: the same
        model = builder(**config, input_shape=(16, 16, 3), include_top=False, pooling="gap")
        model.set_weights(sequence_model.get_weights())
        np.testing.assert_allclose(predict(model, x), patches.mean(1), rtol=1e-6, atol=1e-6)


def test_avg_and_max_have_no_pre_logits_token_and_gap_keep_it(tmp_path):
    """keras.applications' feature vector is the backbone's: no pre_logits;
    `"token"` keeps the official `num_classes=0` output (pre_logits)."""
    path = checkpoint(tmp_path, VIT, 16, representation_size=12)
    sequence = predict(keras_vit.VisionTransformer(
        **VIT, weights=path, include_top=False), images(2, 16, 16, 3))
    token = keras_vit.VisionTransformer(**VIT, weights=path, include_top=False,
                                        pooling="token")
    assert token.output_shape == (None, 12) and "pre_logits" in [layer.name for layer in token.layers]
    for pooling, reduce in (("avg", np.mean), ("max", np.max)):
        model = keras_vit.VisionTransformer(**VIT, weights=path, include_top=False,
                                            pooling=pooling)
        assert "pre_logits" not in [layer.name for layer in model.layers]
        np.testing.assert_allclose(predict(model, images(2, 16, 16, 3)),
                                   reduce(sequence[:, 1:], axis=1), rtol=1e-6, atol=1e-6)


def test_pooling_errors_list_the_allowed_values():
    with pytest.raises(ValueError, match=re.escape(
            "Unknown `pooling='min'`. Allowed: (None, 'token', 'gap', 'token_avg', 'avg', "
            "'max').")):
        keras_vit.VisionTransformer(**VIT, input_shape=(16, 16, 3), include_top=False,
                                    pooling="min")
    with pytest.raises(ValueError, match=re.escape(
            "Unknown `pooling='token'`. Allowed: (None, 'gap', 'avg', 'max').")):
        keras_vit.MLPMixer(**MIXER, input_shape=(16, 16, 3), include_top=False,
                           pooling="token")
    with pytest.raises(ValueError, match=re.escape(
            "`pooling='avg'` is only used with include_top=False")):
        keras_vit.VisionTransformer(**VIT, input_shape=(16, 16, 3), pooling="avg")


# --- the in-graph position-embedding resize ---------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("new_grid,prefix", [
    ((8, 8), 1), ((12, 12), 1), ((6, 10), 1), ((1, 3), 0), ((16, 5), 0)])
def test_interpolate_position_embedding_is_the_official_resize(new_grid, prefix):
    posemb = np.random.default_rng(0).normal(size=(1, prefix + 64, 7)).astype("float32")
    got = keras.ops.convert_to_numpy(
        interpolate_position_embedding(posemb, new_grid, (8, 8), prefix))
    expected = resize_position_embedding(posemb, new_grid, prefix, (8, 8))
    if new_grid == (8, 8):
        np.testing.assert_array_equal(got, posemb)  # exact at the stored grid
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-6)


def test_patch_encoder_needs_a_grid_for_an_unknown_size():
    with pytest.raises(ValueError, match=re.escape("pass grid_size=(grid_h, grid_w)")):
        PatchEncoder(8).build((None, None, None, 12))
    encoder = PatchEncoder(8, grid_size=(2, 2))
    encoder.build((None, None, None, 12))
    assert encoder.position_embedding.shape == (1, 5, 8)
    assert encoder.get_config()["grid_size"] == (2, 2)


# --- input_shape=(None, None, 3) --------------------------------------------

@pytest.mark.backends
def test_dynamic_model_equals_models_built_at_each_size(tmp_path):
    """Built with a checkpoint trained at 32: the stored grid stays 8x8; a
    call at 48 or 24x40 equals a model built at that size, which resizes
    the embedding in NumPy at loading (`resize_position_embedding`)."""
    path = checkpoint(tmp_path, VIT, 32)
    dynamic = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=(None, None, 3),
                                          classifier_activation=None)
    assert dynamic.input_shape == (None, None, None, 3)
    assert dynamic.get_layer("patch_encoder").grid_size == (8, 8)
    for height, width in ((32, 32), (48, 48), (24, 40)):
        fixed = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=(height, width, 3),
                                            classifier_activation=None)
        x = images(2, height, width, 3, seed=height + width)
        expected = predict(fixed, x)
        assert np.abs(expected).max() > 0.1  # a real head, not zeros
        got = predict(dynamic, x)
        if (height, width) == (32, 32):
            np.testing.assert_array_equal(got, expected)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["vit_tiny_token", "vit_tiny_gap", "rstem_vit_tiny",
                                  "r26_vit_tiny"])
def test_dynamic_model_matches_the_official_outputs_at_both_fixture_sizes(name):
    """One model, the official checkpoint: at the checkpoint's size it is
    the official model; at `resize_to` it is the official model whose
    position embedding `interpolate_posembed` resized."""
    fixture = Fixture(name)
    model = fixture.build(classifier_activation=None, input_shape=(None, None, 3))
    stored = np.load(fixture.checkpoint)["Transformer/posembed_input/pos_embedding"]
    np.testing.assert_array_equal(  # the checkpoint's grid, as it is
        keras.ops.convert_to_numpy(model.get_layer("patch_encoder").position_embedding), stored)
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["logits"])
    r = fixture.resize_to
    assert_close(predict(model, fixture.io[f"images_uint8_{r}"]), fixture.io[f"logits_{r}"])


@pytest.mark.parametrize("config,sizes", [
    (dict(VIT, classifier="gap"), ((48, 48), (24, 40))),
    (HYBRID, ((48, 48), (24, 40))),
], ids=["vit_gap", "hybrid"])
def test_dynamic_gap_and_hybrid_models_equal_models_built_at_each_size(tmp_path, config, sizes):
    path = checkpoint(tmp_path, config, 32)
    dynamic = keras_vit.VisionTransformer(**config, weights=path, include_top=False,
                                          input_shape=(None, None, 3))
    assert dynamic.get_layer("patch_encoder").grid_size == (8, 8)
    for height, width in sizes:
        fixed = keras_vit.VisionTransformer(**config, weights=path, include_top=False,
                                            input_shape=(height, width, 3))
        x = images(2, height, width, 3, seed=height)
        np.testing.assert_allclose(predict(dynamic, x), predict(fixed, x), rtol=0, atol=1e-5)


def test_dynamic_model_without_weights_stores_224_and_pools():
    model = keras_vit.VisionTransformer(**VIT, input_shape=(None, None, 3),
                                        include_top=False, pooling="avg",
                                        include_preprocessing=False)
    assert model.get_layer("patch_encoder").grid_size == (56, 56)
    assert model.output_shape == (None, 24)
    assert predict(model, images(1, 20, 12, 3) / 255).shape == (1, 24)
    sequence = keras_vit.VisionTransformer(**VIT, input_shape=(None, None, 3),
                                           include_top=False)
    assert sequence.output_shape == (None, None, 24)
    assert predict(sequence, images(2, 8, 12, 3)).shape == (2, 1 + 2 * 3, 24)


def test_dynamic_model_rejects_a_size_not_divisible_by_the_patch():
    model = keras_vit.VisionTransformer(**VIT, input_shape=(None, None, 3), classes=3)
    with pytest.raises(ValueError, match=re.escape(
            "Image size (30, 32) is not divisible by the patch size (4, 4).")):
        model(images(1, 30, 32, 3))


def test_mixer_refuses_a_dynamic_size():
    with pytest.raises(ValueError, match=re.escape(
            "This MLPMixer cannot take input_shape=(None, None, 3): an MLP-Mixer's "
            "token-mixing weights fix the number of patches")):
        keras_vit.MLPMixer(**MIXER, input_shape=(None, None, 3))


def test_input_shape_errors():
    with pytest.raises(ValueError, match=re.escape(
            "`input_shape` must be (height, width, channels) with positive ints "
            "(channels last; height and width may be None for any size at call time), "
            "got (None, None, None).")):
        keras_vit.VisionTransformer(**VIT, input_shape=(None, None, None))
    with pytest.raises(ValueError, match=re.escape(
            "Image size (30, None) is not divisible by the patch size (4, 4)")):
        keras_vit.VisionTransformer(**VIT, input_shape=(30, None, 3))


def test_dynamic_model_round_trips_through_a_keras_file(tmp_path):
    model = randomize(keras_vit.VisionTransformer(**VIT, input_shape=(None, None, 3),
                                                  classes=3))
    path = str(tmp_path / "dynamic.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert loaded.input_shape == (None, None, None, 3)
    for shape in ((2, 32, 32, 3), (1, 24, 40, 3)):
        x = images(*shape)
        np.testing.assert_array_equal(predict(loaded, x), predict(model, x))


def test_dynamic_model_under_mixed_precision_matches_a_fixed_size_model(tmp_path):
    """Under mixed_bfloat16 the in-graph resize runs in float32: the dynamic
    model computes what a model built at that size computes under the same
    policy. (bfloat16 itself moves random-weight logits by a few percent
    against float32, and by a different amount on CPUs with and without
    AMX, so float32 is only a loose sanity check here.)"""
    path = checkpoint(tmp_path, VIT, 32)
    x = images(2, 24, 40, 3)
    reference = predict(keras_vit.VisionTransformer(
        **VIT, weights=path, input_shape=(None, None, 3), classifier_activation=None), x)
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=(None, None, 3),
                                        classifier_activation=None)
    encoder = model.get_layer("patch_encoder")
    assert encoder.position_embedding.dtype == "float32"
    logits = predict(model, x)
    assert logits.dtype == np.float32
    fixed = predict(keras_vit.VisionTransformer(
        **VIT, weights=path, input_shape=(24, 40, 3), classifier_activation=None), x)
    np.testing.assert_allclose(logits, fixed, atol=1e-2 * np.abs(fixed).max())
    relative = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
    assert relative < 0.15, relative


def test_dynamic_model_exports_a_saved_model_that_serves_any_size(tmp_path):
    tf = pytest.importorskip("tensorflow")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("SavedModel export needs the TensorFlow backend")
    from keras_vit.export import to_saved_model

    path = checkpoint(tmp_path, VIT, 32)
    model = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=(None, None, 3))
    report = to_saved_model(model, str(tmp_path / "served"), verbose=False)
    assert report.signature["inputs"]["images"] == "uint8 [None, None, None, None]"
    serve = tf.saved_model.load(str(tmp_path / "served")).signatures["serving_default"]
    for shape in ((2, 32, 32, 3), (3, 48, 24, 3)):
        pixels = images(*shape).round().astype("uint8")
        logits = serve(images=tf.constant(pixels))["logits"].numpy()
        reference = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=shape[1:],
                                                classifier_activation=None)
        np.testing.assert_allclose(logits, predict(reference, pixels.astype("float32")),
                                   rtol=0, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiples of the patch size 4x4"):
        serve(images=tf.zeros((1, 30, 32, 3), tf.uint8))


def test_cli_predict_and_inspect_take_a_model_of_any_size(tmp_path):
    """`keras-vit predict` on a .keras model built with (None, None, 3)
    resizes images to the stored grid's size, or to --image-size;
    `keras_vit.inspect` works at the stored size."""
    import json

    from PIL import Image

    from keras_vit import inspect
    from keras_vit.inspect.analysis import stored_image_size
    from keras_vit.prediction import resize_images

    path = checkpoint(tmp_path, VIT, 32)
    model = keras_vit.VisionTransformer(**VIT, weights=path, input_shape=(None, None, 3))
    model.save(tmp_path / "any.keras")
    fixed = keras_vit.VisionTransformer(**VIT, weights=path)
    fixed.save(tmp_path / "fixed.keras")
    photo = images(40, 56, 3).astype("uint8")
    Image.fromarray(photo).save(tmp_path / "photo.png")
    for extra, size in (([], 32), (["--image-size", "48"], 48)):
        code, out, _ = run_cli("predict", tmp_path / "photo.png", "--model",
                               tmp_path / "any.keras", "--json", *extra)
        assert code == 0
        result = json.loads(out)
        assert result["image_size"] == [size, size]
        resized = resize_images([photo.astype("float32")], (size, size))
        expected = predict(model, resized)[0]
        got = {t["index"]: t["probability"] for t in result["predictions"][0]["top"]}
        np.testing.assert_allclose([got[i] for i in range(5)], expected, atol=1e-5)
    code, _, err = run_cli("predict", tmp_path / "photo.png", "--model",
                           tmp_path / "fixed.keras", "--image-size", "48")
    assert code == 2
    assert err == (
        "keras-vit: error: --image-size 48: the model takes 32x32 images; leave "
        "--image-size out.\n")

    assert stored_image_size(model) == (32, 32)
    hybrid = keras_vit.VisionTransformer(**HYBRID, weights=checkpoint(tmp_path, HYBRID, 32,
                                                                      "hybrid.npz"),
                                         input_shape=(None, None, 3))
    assert stored_image_size(hybrid) == (32, 32)
    np.testing.assert_allclose(inspect.attention_distance(model, images(2, 32, 32, 3)),
                               inspect.attention_distance(fixed, images(2, 32, 32, 3)),
                               atol=1e-4)
