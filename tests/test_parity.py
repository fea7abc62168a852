"""Parity with the official implementation's outputs on real photos.

Runs under every backend: CI runs this file with KERAS_BACKEND=tensorflow
and KERAS_BACKEND=jax.
"""

import numpy as np
import pytest

from conftest import predict
from official_fixtures import NAMES, Fixture, assert_close

pytestmark = pytest.mark.backends

VIT_NAMES = [n for n in NAMES if not n.startswith("mixer")]


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    return Fixture(request.param)


def test_logits(fixture):
    model = fixture.build(classifier_activation=None)
    assert model.count_params() == fixture.config["num_params"]
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["logits"])


@pytest.mark.parametrize("name", VIT_NAMES)
def test_dot_product_attention_logits(name):
    """`attention="dot_product"` (`keras.ops.dot_product_attention`, the
    accelerators' path) gives the official logits too."""
    fixture = Fixture(name)
    model = fixture.build(classifier_activation=None, attention="dot_product")
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["logits"])


def test_logits_without_builtin_preprocessing(fixture):
    model = fixture.build(classifier_activation=None, include_preprocessing=False)
    assert_close(predict(model, fixture.io["inputs"]), fixture.io["logits"])


def test_pre_logits(fixture):
    pooling = "gap" if fixture.is_mixer else fixture.config["model"]["classifier"]
    model = fixture.build(include_top=False, pooling=pooling)
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["pre_logits"])


def test_encoder_sequence_output(fixture):
    """include_top=False, pooling=None: the tokens after the final LayerNorm
    (official `act/Transformer`, `act/pre_head_layer_norm` for Mixer)."""
    key = "act/pre_head_layer_norm" if fixture.is_mixer else "act/Transformer"
    reference = fixture.io[key]
    model = fixture.build(include_top=False)
    assert_close(predict(model, fixture.io["images_uint8"]), reference,
                 scale=np.abs(reference).max())


@pytest.mark.parametrize("name", VIT_NAMES)
def test_load_at_another_resolution(name):
    fixture = Fixture(name)
    r = fixture.resize_to
    model = fixture.build(classifier_activation=None, input_shape=(r, r, 3))
    posemb = model.get_layer("patch_encoder").position_embedding
    assert_close(keras_numpy(posemb), fixture.io[f"posemb_{r}"])
    assert_close(predict(model, fixture.io[f"images_uint8_{r}"]), fixture.io[f"logits_{r}"])
    features = fixture.build(include_top=False, input_shape=(r, r, 3),
                             pooling=fixture.config["model"]["classifier"])
    assert_close(predict(features, fixture.io[f"images_uint8_{r}"]),
                 fixture.io[f"pre_logits_{r}"])


def test_drop_head_fine_tune_path():
    """Official fine-tuning: new classes -> pre_logits dropped, zero head;
    the num_classes=0 output is the encoder output at the class token."""
    fixture = Fixture("vit_tiny_token")
    model = fixture.build(classes=5, classifier_activation=None)
    assert [layer.name for layer in model.layers if layer.name == "pre_logits"] == []
    head = model.get_layer("head")
    assert np.all(keras_numpy(head.kernel) == 0) and np.all(keras_numpy(head.bias) == 0)
    images = fixture.io["images_uint8"]
    np.testing.assert_array_equal(predict(model, images), np.zeros((4, 5), "float32"))
    features = keras_model_before_head(model)
    assert_close(predict(features, images), fixture.io["encoded_cls"])


def keras_numpy(variable):
    import keras

    return keras.ops.convert_to_numpy(variable)


def keras_model_before_head(model):
    import keras

    return keras.Model(model.inputs, model.get_layer("head").input)
