"""Model builders: official parameter counts, the keras.applications
signature, .keras round trips, mixed precision, the architecture read from
a checkpoint (`model_from_checkpoint`), channel counts and the bad inputs."""

import logging
import math
import re

import keras
import numpy as np
import pytest
from keras import ops

import conftest
import keras_vit
from conftest import predict
from keras_vit.models.auto import architecture_from_checkpoint
from keras_vit.weights.official import CheckpointMismatchError, read_checkpoint
from official_fixtures import NAMES, Fixture

TF = keras.backend.backend() == "tensorflow"
tf_only = pytest.mark.skipif(not TF, reason="the TensorFlow backend's paths")

# Parameter counts of the official architectures with a 1000-class head at
# 224 (token classifier, no pre_logits), as published for the official
# weights (ViT paper / timm model cards; ViT-B/16: 86,567,656).
OFFICIAL_PARAMS = {
    "ViTTi16": 5_717_416, "ViTS16": 22_050_664, "ViTS32": 22_878_952,
    "ViTB8": 86_576_872, "ViTB16": 86_567_656, "ViTB32": 88_224_232,
    "ViTL16": 304_326_632, "ViTL32": 306_535_400, "ViTH14": 632_045_800,
    "RViTTi16": 6_337_704, "R26ViTS32": 36_431_912, "R50ViTB16": 98_659_112,
    "R50ViTL32": 328_994_856, "R26ViTB32": 101_383_976,
    "MixerS8": 20_646_504,  # not in the official models.py: see test_registry.py
    "MixerS16": 18_528_264, "MixerS32": 19_104_624, "MixerB16": 59_880_472,
    "MixerB32": 60_293_428, "MixerL16": 208_196_168,
}


# This file's tiny models (the shared ones of conftest.py, their shapes
# asserted below): 16x16 images in 16 patches of 4x4, width 32, 5 classes.
SMALL = dict(patch_size=4, hidden_size=32, input_shape=(16, 16, 3), classes=5)


def tiny_vit(**kwargs):
    return conftest.tiny_vit(**{**SMALL, "num_layers": 2, "mlp_dim": 64, **kwargs})


def tiny_mixer(**kwargs):
    return conftest.tiny_mixer(**{**SMALL, "num_blocks": 2, "channels_mlp_dim": 64,
                                  **kwargs})


@pytest.mark.slow
@pytest.mark.parametrize("function", sorted(OFFICIAL_PARAMS))
def test_named_variant_has_the_official_parameter_count(function):
    # The whole model is built (every layer, every variable with its shape);
    # only the random draw of the values is skipped (a StatelessScope that
    # does not initialize its variables: 2 s instead of 8 s for ViT-H/14).
    # count_params reads the shapes. The autouse fixture's clear_session
    # forgets the uninitialized variables.
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, function)()
    assert model.count_params() == OFFICIAL_PARAMS[function]
    assert model.input_shape == (None, 224, 224, 3)
    assert model.output_shape == (None, 1000)


def test_named_function_passes_regularization_and_rejects_unknown_kwargs():
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), classes=3, dropout_rate=0.1,
                              drop_path_rate=0.2, name="tiny")
    assert model.name == "tiny"
    rates = [model.get_layer(f"encoderblock_{i}").drop_path_rate for i in range(12)]
    np.testing.assert_allclose(rates, 0.2 * np.arange(12) / 11)
    assert model.get_layer("encoderblock_0").dropout_rate == 0.1
    assert keras_vit.ViTB16.__name__ == "ViTB16" and "imagenet21k" in keras_vit.ViTB16.__doc__
    with pytest.raises(TypeError, match=re.escape(
            "ViTB16() got unexpected keyword arguments ['num_layers']; allowed besides "
            "the keras.applications ones: ['dropout_rate', 'attention_dropout_rate', "
            "'drop_path_rate', 'classifier', 'representation_size', 'attention'].")):
        keras_vit.ViTB16(num_layers=3)


def test_generic_builder_recognises_the_named_variant():
    with pytest.raises(ValueError, match=re.escape("Unknown weights 'nope' for ViT-B_16.")):
        keras_vit.VisionTransformer(16, 768, 12, 12, 3072, weights="nope")


@pytest.mark.parametrize("build,pooling,shape", [
    (tiny_vit, None, (None, 17, 32)),
    (tiny_vit, "token", (None, 32)),
    (tiny_vit, "gap", (None, 32)),
    (tiny_mixer, None, (None, 16, 32)),
    (tiny_mixer, "gap", (None, 32)),
])
def test_include_top_false_outputs(build, pooling, shape):
    assert build(include_top=False, pooling=pooling).output_shape == shape


def test_hybrid_output_stride_and_shapes():
    model = keras_vit.VisionTransformer(
        patch_size=1, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=32,
        resnet_layers=(1, 1), input_shape=(64, 64, 3), include_top=False)
    assert model.get_layer("block2_unit1").output.shape == (None, 8, 8, 512)
    assert model.output_shape == (None, 65, 32)


def test_classifier_activation_and_preprocessing():
    model = tiny_vit(classifier_activation=None, include_preprocessing=False)
    assert model.get_layer("head").activation is keras.activations.linear
    assert "preprocessing" not in [layer.name for layer in model.layers]
    softmax = tiny_vit()
    assert softmax.get_layer("head").activation is keras.activations.softmax


def test_input_tensor_is_used():
    tensor = keras.Input((16, 16, 3), name="mine")
    model = tiny_vit(input_tensor=tensor)
    assert model.inputs[0] is tensor


@pytest.mark.parametrize("build", [tiny_vit, tiny_mixer])
def test_keras_file_round_trip_with_safe_mode(build, tmp_path):
    model = build(dropout_rate=0.1) if build is tiny_vit else build(drop_path_rate=0.1)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.1
                       for w in model.get_weights()])
    x = rng.uniform(0, 255, size=(2, 16, 16, 3)).astype("float32")
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(predict(loaded, x), predict(model, x))
    assert [layer["config"] for layer in loaded.get_config()["layers"]] == [
        layer["config"] for layer in model.get_config()["layers"]]


def test_hybrid_keras_file_round_trip(tmp_path):
    fixture = Fixture("rstem_vit_tiny")
    model = fixture.build()
    path = tmp_path / "hybrid.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    images = fixture.io["images_uint8"]
    np.testing.assert_array_equal(predict(loaded, images), predict(model, images))


def test_weights_h5_file_loads(tmp_path):
    model = tiny_vit()
    model.set_weights([np.full(w.shape, 0.01, "float32") for w in model.get_weights()])
    path = tmp_path / "tiny.weights.h5"
    model.save_weights(path)
    again = tiny_vit(weights=str(path))
    for a, b in zip(model.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def tiny_hybrid(**kwargs):
    return conftest.tiny_vit(**{**SMALL, "patch_size": 1, "resnet_layers": (1,), **kwargs})


@pytest.mark.backends
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("build", [tiny_vit, tiny_mixer, tiny_hybrid])
def test_mixed_precision_builds_runs_and_returns_float32(build, policy):
    keras.config.set_dtype_policy(policy)
    model = build(drop_path_rate=0.1)
    y = model(np.ones((2, 16, 16, 3), "float32"))
    assert keras.backend.standardize_dtype(y.dtype) == "float32"
    assert model.get_layer("head").compute_dtype == "float32"
    block = model.layers[-4]  # the last Transformer / Mixer block
    assert block.compute_dtype == policy.split("_")[1] and block.variable_dtype == "float32"
    features = build(include_top=False, pooling="gap")
    # the batch of 2 above: JAX compiles each eager op once per shape (a batch
    # of 1 compiled the encoder again: 31 s -> 18 s for the six cases on JAX)
    assert keras.backend.standardize_dtype(features(np.ones((2, 16, 16, 3))).dtype) == "float32"


@pytest.mark.backends
def test_mixed_bfloat16_matches_float32_on_the_fixture():
    fixture = Fixture("vit_tiny_token")
    reference = fixture.io["logits"]
    keras.config.set_dtype_policy("mixed_bfloat16")
    logits = predict(fixture.build(classifier_activation=None), fixture.io["images_uint8"])
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference, atol=0.1 * np.abs(reference).max())
    assert (logits.argmax(1) == reference.argmax(1)).all()


def test_new_classes_replace_the_head_and_say_so(caplog):
    fixture = Fixture("vit_tiny_token")
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        model = fixture.build(classes=3)
    assert model.output_shape == (None, 3)
    assert ("replacing the checkpoint's 10-class head with a zero-initialised "
            "3-class head and dropping pre_logits") in caplog.text


def test_classes_none_keeps_checkpoint_head_and_pre_logits():
    model = Fixture("vit_tiny_token").build()
    assert model.output_shape == (None, 10)
    assert model.get_layer("pre_logits").units == 32


# --- the architecture read from a checkpoint --------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_architecture_is_read_from_the_checkpoint(name):
    fixture = Fixture(name)
    builder, expected = fixture.architecture()
    family, config = architecture_from_checkpoint(read_checkpoint(fixture.checkpoint))
    assert family == ("mixer" if fixture.is_mixer else "vit")
    assert config == expected


def test_model_from_checkpoint_matches_the_explicit_builder():
    fixture = Fixture("r26_vit_tiny")
    model = keras_vit.model_from_checkpoint(fixture.checkpoint, classifier_activation=None)
    np.testing.assert_allclose(model.predict(fixture.io["images_uint8"], verbose=0),
                               fixture.io["logits"], rtol=1e-5, atol=2e-5)


# --- bad inputs: one test each, with the exact message ---------------------

def test_error_image_size_not_divisible_by_patch():
    with pytest.raises(ValueError, match=re.escape(
            "Image size (225, 225) is not divisible by the patch size (16, 16) of "
            "ViT-B_16; use a multiple, e.g. (224, 224).")):
        keras_vit.ViTB16(input_shape=(225, 225, 3))


def test_error_hybrid_size_uses_effective_patch():
    with pytest.raises(ValueError, match=re.escape(
            "Image size (48, 48) is not divisible by the patch size (32, 32) of "
            "R26+ViT-S_32; use a multiple, e.g. (64, 64).")):
        keras_vit.R26ViTS32(input_shape=(48, 48, 3))


def test_error_channels_other_than_three_with_pretrained_weights():
    with pytest.raises(ValueError, match=re.escape(
            "Pretrained weights expect 3 input channels (RGB), got input_shape="
            "(32, 32, 1). Use weights=None for 1 channels.")):
        Fixture("vit_tiny_token").build(input_shape=(32, 32, 1))


def test_error_unknown_weights_name_lists_valid_names():
    with pytest.raises(ValueError, match=re.escape(
            "Unknown weights 'imagenet22k' for ViT-S_16. Valid: None, 'imagenet', 'sam', 'gsam', "
            "'augreg', 'augreg+imagenet2012', 'augreg:<filename>', or the path to an "
            "official .npz or a Keras .weights.h5 file.")):
        keras_vit.ViTS16(weights="imagenet22k")


def test_error_model_without_registered_weights():
    with pytest.raises(ValueError, match=re.escape(
            "Unknown weights 'imagenet21k' for this VisionTransformer. Valid: None, "
            "(no registered checkpoints), or the path to an official .npz or a "
            "Keras .weights.h5 file.")):
        tiny_vit(weights="imagenet21k")


def test_error_augreg_file_of_another_model():
    with pytest.raises(ValueError, match=re.escape(
            "AugReg file 'B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0' "
            "is not a S/16 checkpoint: AugReg files for ViT-S_16 start with 'S_16-'")):
        keras_vit.ViTS16(weights="augreg:B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0")


def test_error_mixer_with_weights_at_another_resolution():
    with pytest.raises(ValueError, match=re.escape(
            "this MLPMixer checkpoints fix the number of patches: the token-mixing "
            "weights were trained on 8x8 patches (32x32 pixels), input_shape="
            "(48, 48, 3) gives 12x12. A Mixer cannot change resolution with "
            "pretrained weights: resize images to 32x32 or use weights=None.")):
        Fixture("mixer_tiny").build(input_shape=(48, 48, 3))


def test_error_checkpoint_of_another_architecture():
    fixture = Fixture("vit_tiny_token")
    _, kwargs = fixture.architecture()
    kwargs.update(hidden_size=60, num_layers=3, weights=fixture.checkpoint)
    with pytest.raises(keras_vit.weights.CheckpointMismatchError) as info:
        keras_vit.VisionTransformer(**kwargs)
    message = str(info.value)
    assert message.startswith(
        f"Checkpoint {fixture.checkpoint} does not fit model 'vision_transformer':")
    assert ("missing keys (16): Transformer/encoderblock_2/LayerNorm_0/scale, "
            "Transformer/encoderblock_2/LayerNorm_0/bias, ") in message
    assert "mis-shaped keys (" in message
    assert "embedding/kernel: checkpoint (4, 4, 3, 48) vs model (4, 4, 3, 60)" in message
    assert isinstance(info.value, ValueError)


def test_error_hybrid_checkpoint_into_plain_vit():
    fixture = Fixture("rstem_vit_tiny")
    _, kwargs = fixture.architecture()
    kwargs.pop("resnet_layers"), kwargs.pop("resnet_width")
    kwargs.update(patch_size=8)
    with pytest.raises(ValueError) as info:
        keras_vit.VisionTransformer(**kwargs, weights=fixture.checkpoint)
    assert "unexpected keys (3): conv_root/kernel, gn_root/bias, gn_root/scale" in str(info.value)


def test_error_mixer_checkpoint_into_vit():
    fixture = Fixture("mixer_tiny")
    with pytest.raises(ValueError, match=re.escape(
            f"Checkpoint {fixture.checkpoint} is a Mixer checkpoint; it does not fit "
            "this VisionTransformer.")):
        tiny_vit(weights=fixture.checkpoint)


def test_error_gap_checkpoint_into_token_model():
    fixture = Fixture("vit_tiny_gap")
    _, kwargs = fixture.architecture()
    kwargs["classifier"] = "token"
    with pytest.raises(ValueError, match=re.escape(
            f"Checkpoint {fixture.checkpoint} is a classifier='gap' model (without "
            "class token); build with classifier='gap'.")):
        keras_vit.VisionTransformer(**kwargs, weights=fixture.checkpoint)


@pytest.mark.parametrize("classes", [0, -3])
def test_error_classes_not_positive(classes):
    with pytest.raises(ValueError, match=re.escape(
            f"`classes` must be a positive integer or None, got {classes}.")):
        tiny_vit(classes=classes)


def test_error_classes_wrong_type():
    with pytest.raises(TypeError, match=re.escape(
            "`classes` must be a positive integer or None, got '10'.")):
        tiny_vit(classes="10")


def test_error_pooling_not_allowed():
    with pytest.raises(ValueError, match=re.escape(
            "Unknown `pooling='min'`. Allowed: (None, 'token', 'gap', 'token_avg', 'avg', "
            "'max').")):
        tiny_vit(include_top=False, pooling="min")
    with pytest.raises(ValueError, match=re.escape(
            "Unknown `pooling='token'`. Allowed: (None, 'gap', 'avg', 'max').")):
        tiny_mixer(include_top=False, pooling="token")
    with pytest.raises(ValueError, match=re.escape(
            "`pooling='gap'` is only used with include_top=False; with the head the "
            "model pools as its classifier says. Allowed with include_top=False: "
            "(None, 'token', 'gap', 'token_avg', 'avg', 'max').")):
        tiny_vit(pooling="gap")
    with pytest.raises(ValueError, match=re.escape(
            "pooling='token' needs a class token, but this model has classifier='gap'. "
            "Use pooling='gap'.")):
        tiny_vit(classifier="gap", include_top=False, pooling="token")


def test_error_weights_file_not_found(tmp_path):
    missing = str(tmp_path / "nothing.npz")
    with pytest.raises(ValueError, match=re.escape(f"Weights file not found: '{missing}'.")):
        tiny_vit(weights=missing)


def test_error_weights_wrong_type():
    with pytest.raises(TypeError, match=re.escape(
            "`weights` must be None, a registered name or a file path, got int 3.")):
        tiny_vit(weights=3)


def test_error_representation_size_conflicts_with_checkpoint():
    with pytest.raises(ValueError, match=re.escape(
            "`representation_size=16` does not match checkpoint")):
        Fixture("vit_tiny_token").build(representation_size=16)


# --- Keras weights files of another architecture --------------------------------

def test_keras_weights_of_a_deeper_model_are_refused(tmp_path):
    deep = conftest.tiny_vit(num_layers=2)
    path = tmp_path / "deep.weights.h5"
    deep.save_weights(path)
    with pytest.raises(CheckpointMismatchError) as info:
        conftest.tiny_vit(num_layers=1, weights=str(path))
    message = str(info.value)
    assert message.startswith(
        f"The Keras weights file {str(path)!r} does not fit 'vision_transformer' (written "
        "by another architecture, e.g. another depth or width): 12 arrays in the file that "
        "the model does not have (layers/transformer_block_1/")
    assert message.endswith("Load it into the model that wrote it (same variant and "
                            "options).")
    assert len(info.value.unexpected) == 12 and not info.value.missing
    with pytest.raises(CheckpointMismatchError, match="12 arrays of the model missing"):
        conftest.tiny_vit(num_layers=3, weights=str(path))
    wider = tmp_path / "wide.weights.h5"
    conftest.tiny_vit(hidden_size=32, num_layers=2).save_weights(wider)
    with pytest.raises(CheckpointMismatchError, match="arrays of another shape"):
        conftest.tiny_vit(num_layers=2, weights=str(wider))
    same = conftest.tiny_vit(num_layers=2, weights=str(path))
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(ops.convert_to_numpy(same(x)),
                                  ops.convert_to_numpy(deep(x)))


# --- channel counts -----------------------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("preprocessing", [True, False])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_a_channel_count_other_than_the_models_is_one_value_error(preprocessing, channels):
    model = conftest.tiny_vit(include_preprocessing=preprocessing)
    images = np.ones((1, 32, 32, channels), "float32")
    with pytest.raises(ValueError) as info:
        model(images)
    message = str(info.value)
    assert ("The model takes images with 3 channels (RGB); got "
            f"{channels} channel{'s' * (channels > 1)} (shape (1, 32, 32, {channels}))" in message
            or "expected shape=(None, 32, 32, 3), found shape=(1, 32, 32, "
               f"{channels})" in message)  # Keras' own input check (2, 4 channels)
    if channels == 1:
        assert "np.repeat(images, 3, axis=-1)" in message
        gray = ops.convert_to_numpy(model(np.repeat(images, 3, axis=-1)))
        assert np.isfinite(gray).all()


@pytest.mark.backends
def test_a_hybrid_checks_its_channels_too():
    model = conftest.tiny_vit(patch_size=1, resnet_layers=(1,), include_preprocessing=False)
    with pytest.raises(ValueError, match=r"takes images with 3 channels \(RGB\); got 1 channel"):
        model(np.ones((1, 32, 32, 1), "float32"))


@tf_only
def test_predict_after_another_shape_still_checks_the_channels():
    """predict() relaxes the traced shape after a batch of another shape
    (the channel count is then unknown when traced): the check runs in the
    graph, with the same sentence, instead of broadcasting a gray batch."""
    import tensorflow as tf

    model = conftest.tiny_vit()
    model.predict(np.ones((1, 32, 32, 3), "float32"), verbose=0)
    for channels in (1, 4):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="The model takes images with 3 channels; got another count"):
            model.predict(np.ones((1, 32, 32, channels), "float32"), verbose=0)
    assert model.predict(np.ones((2, 32, 32, 3), "float32"), verbose=0).shape == (2, 3)
    assert not math.isnan(float(model.predict(np.ones((1, 32, 32, 3)), verbose=0)[0, 0]))
