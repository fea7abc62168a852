"""The keras.applications idiom kept (issue #46, items 1 and 10):
`preprocess_input` is a pass-through for models that include their
preprocessing, `normalize_pixels` normalises for those that do not, and the
models are channels-last whatever `keras.config.image_data_format()` says."""

import logging
import re

import keras
import numpy as np
import pytest
from conftest import predict, random_weights, tiny_mixer, tiny_vit

import keras_vit
from keras_vit.inspect.analysis import upsample_maps

# A hybrid whose ResNet stem (root + one stage: stride 4) feeds 4x4 patches.
HYBRID = dict(resnet_layers=(1,), patch_size=4)
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def pixels(n=2, size=32, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, size, size, channels)).astype("float32")


# --- item 1: preprocess_input before a default model --------------------------------

@pytest.mark.parametrize("build", [
    lambda: tiny_vit(),
    lambda: tiny_vit(**HYBRID),
    lambda: tiny_mixer(),
    lambda: tiny_vit(image_mean=IMAGENET["mean"], image_std=IMAGENET["std"]),
], ids=["vit", "hybrid", "mixer", "timm_mean_std"])
def test_preprocess_input_then_a_default_model_equals_raw_pixels(build):
    """keras' applications_test: for a model that includes its
    preprocessing, `model.predict(preprocess_input(x))` is
    `model.predict(x)` (main normalised twice: ViT-Ti/16's top-1 429 -> 925)."""
    model = random_weights(build(), seed=1)
    x = pixels()
    assert keras_vit.preprocess_input(x) is x
    assert keras_vit.preprocess_input(x, "channels_last") is x
    np.testing.assert_array_equal(model.predict(keras_vit.preprocess_input(x), verbose=0),
                                  model.predict(x, verbose=0))


def test_normalize_pixels_feeds_a_model_without_preprocessing():
    """The normalising function has its own name; a model built with
    `include_preprocessing=False` fed `normalize_pixels(x)` computes what
    the default model computes on raw pixels: the official form, and a
    foreign checkpoint's mean and std."""
    x = pixels(seed=3)
    for arith, kwargs in (({}, {}), ({"image_mean": IMAGENET["mean"],
                                      "image_std": IMAGENET["std"]}, IMAGENET)):
        raw = random_weights(tiny_vit(**arith), seed=2)
        bare = random_weights(tiny_vit(include_preprocessing=False, **arith), seed=2)
        np.testing.assert_allclose(predict(bare, keras_vit.normalize_pixels(x, **kwargs)),
                                   predict(raw, x), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(keras_vit.normalize_pixels(np.array([0, 127.5, 255])),
                                  np.array([-1, 0, 1], "float32"))


def test_normalize_pixels_channels_first_and_its_checks():
    x = pixels(seed=4)
    last = keras_vit.normalize_pixels(x, **IMAGENET)
    first = keras_vit.normalize_pixels(x.transpose(0, 3, 1, 2), "channels_first", **IMAGENET)
    np.testing.assert_array_equal(first, last.transpose(0, 3, 1, 2))
    tensor = keras_vit.normalize_pixels(keras.ops.convert_to_tensor(x), **IMAGENET)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tensor), last, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"Pixels of shape \(2, 32, 32, 1\) have no "
                                         r"channels_last channel axis of 3"):
        keras_vit.normalize_pixels(pixels(channels=1), **IMAGENET)
    with pytest.raises(ValueError, match=r"`std` must be a finite positive number.*got 0"):
        keras_vit.normalize_pixels(x, std=0)
    with pytest.raises(ValueError, match=r"`mean` has 2 values and `std` 3"):
        keras_vit.normalize_pixels(x, mean=(0.5, 0.5), std=IMAGENET["std"])


def test_preprocess_input_refuses_what_would_normalise():
    """Old calls that asked for a normalisation are refused, never passed
    through silently: `mean`/`std` name the new function, and a mean given
    in the old second position is not a data_format."""
    x = pixels()
    with pytest.raises(TypeError, match=r"preprocess_input\(x\) is a pass-through.*takes no "
                                        r"mean or std.*keras_vit\.normalize_pixels\(x, "
                                        r"mean=\.\.\., std=\.\.\.\)"):
        keras_vit.preprocess_input(x, **IMAGENET)
    with pytest.raises(ValueError, match=r"Unknown data_format=0\.5; allowed: None, "
                                         r"'channels_last', 'channels_first'\."):
        keras_vit.preprocess_input(x, 0.5)


# --- item 10: channels_first --------------------------------------------------------

@pytest.fixture
def channels_first():
    keras.config.set_image_data_format("channels_first")
    try:
        yield
    finally:
        keras.config.set_image_data_format("channels_last")


@pytest.mark.parametrize("build", [
    lambda **kw: tiny_vit(**HYBRID, **kw),
    lambda **kw: tiny_vit(**kw),
    lambda **kw: tiny_mixer(**kw),
], ids=["hybrid", "vit", "mixer"])
def test_models_are_channels_last_under_channels_first(build, channels_first, caplog):
    """Under `image_data_format("channels_first")` a default-size model
    builds (main: every hybrid failed, "Number of groups (32) cannot be more
    than the number of channels (2)"), takes (batch, height, width, 3),
    computes what it computes under channels_last, and one warning line
    says it is channels-last."""
    with caplog.at_level(logging.WARNING, logger="keras_vit"):
        model = build(input_shape=None)
    assert model.input_shape == (None, 224, 224, 3)
    said = [r.getMessage() for r in caplog.records if r.name == "keras_vit"]
    assert len(said) == 1 and said[0].startswith(
        "keras.config.image_data_format() is 'channels_first', but this ") and (
        "built channels-last, as every keras_vit model: it takes images of shape "
        "(batch, height, width, channels)") in said[0], said
    keras.config.set_image_data_format("channels_last")
    reference = random_weights(build(input_shape=(32, 32, 3)), seed=5)
    keras.config.set_image_data_format("channels_first")
    model = build(input_shape=(32, 32, 3))
    model.set_weights(reference.get_weights())
    x = pixels(seed=6)
    np.testing.assert_array_equal(predict(model, x), predict(reference, x))


@pytest.mark.parametrize("shape", [(3, 32, 32), (1, 28, 28), (3, None, None)])
def test_a_channels_first_input_shape_is_refused(shape):
    """`input_shape=(3, 224, 224)` was read as a 3-pixel-high image of 224
    channels (it built with a patch of 1); it gets one sentence asking for
    channels-last."""
    expected = (*shape[1:], shape[0])
    with pytest.raises(ValueError, match=(
            rf"^input_shape={re.escape(str(shape))} looks channels-first \(channels, height, "
            r"width\); keras_vit models take channels-last images, \(height, width, "
            r"channels\), whatever keras.config.image_data_format\(\) says: use "
            rf"input_shape={re.escape(str(expected))} and transpose")):
        tiny_vit(patch_size=1, input_shape=shape)
    with pytest.raises(ValueError, match=r"^the input_tensor's shape=\(3, 32, 32\) looks "
                                         r"channels-first"):
        tiny_vit(input_shape=None, input_tensor=keras.Input((3, 32, 32)))
    # channels-last shapes of 1 or 4 channels, and small images, still build
    assert tiny_vit(patch_size=1, input_shape=(4, 4, 1)).input_shape == (None, 4, 4, 1)


def test_attention_maps_upsample_channels_last_under_channels_first(channels_first):
    maps = np.random.default_rng(7).random((2, 4, 4)).astype("float32")
    got = upsample_maps(maps, (32, 32))
    keras.config.set_image_data_format("channels_last")
    np.testing.assert_array_equal(got, upsample_maps(maps, (32, 32)))
