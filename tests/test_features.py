"""Feature maps for dense prediction (`features_only=True`, `out_indices`,
`feature_format`, `keras_vit.models.feature_info`) and per-block
rematerialisation (`remat=True`): known answers (the official fixtures'
block activations, `inspect.intermediate_features`), round trips (`.keras`
with safe_mode, SavedModel) and the bad inputs with their messages."""

import re

import keras
import numpy as np
import pytest

import conftest
import keras_vit
from conftest import predict, random_weights
from keras_vit.inspect import intermediate_features
from keras_vit.layers import MixerBlock, TransformerBlock
from keras_vit.models import feature_info
from official_fixtures import REPO_ROOT, Fixture, assert_close

TF = keras.backend.backend() == "tensorflow"

# Three blocks of width 48 on 8x8 patches of 4x4 pixels (32x32 images).
VIT = dict(patch_size=4, hidden_size=48, num_layers=3, num_heads=3, mlp_dim=96,
           input_shape=(32, 32, 3))
MIXER = dict(patch_size=4, hidden_size=48, num_blocks=3, tokens_mlp_dim=24,
             channels_mlp_dim=96, input_shape=(32, 32, 3))
HYBRID = dict(VIT, patch_size=2, num_layers=2, resnet_layers=(1,))  # stride 4 x patch 2


def images(n=2, height=32, width=32, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (n, height, width, 3)).astype("float32")


def outputs(model, x):
    """The model's outputs as a list of arrays (Keras returns a model of
    one output's tensor alone)."""
    ys = model(x, training=False)
    return [keras.ops.convert_to_numpy(y) for y in (ys if isinstance(ys, list) else [ys])]


def seeded(builder, **kwargs):
    """`builder(**kwargs)` with every weight redrawn from a fixed seed."""
    return random_weights(builder(**kwargs), scale=0.3)


def as_maps(tokens, prefix, grid):
    """`(N, prefix + h * w, D)` tokens -> `(N, h, w, D)`, row-major."""
    return tokens[:, prefix:].reshape(len(tokens), *grid, tokens.shape[-1])


# --- the values: the blocks' outputs ---------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_maps_and_tokens_are_the_blocks_outputs(classifier):
    maps = seeded(keras_vit.VisionTransformer, **VIT, classifier=classifier,
                  features_only=True, out_indices=(2, 0))
    tokens = keras_vit.VisionTransformer(**VIT, classifier=classifier, features_only=True,
                                         out_indices=(2, 0), feature_format="tokens")
    tokens.set_weights(maps.get_weights())
    x = images()
    reference = intermediate_features(maps, x)  # {block name: (N, tokens, D)}
    prefix = int(classifier == "token")
    got_maps, got_tokens = outputs(maps, x), outputs(tokens, x)
    for i, name in enumerate(["encoderblock_2", "encoderblock_0"]):  # the order given
        assert got_maps[i].shape == (2, 8, 8, 48)
        assert got_tokens[i].shape == (2, prefix + 64, 48)  # class token first
        np.testing.assert_allclose(got_tokens[i], reference[name], atol=1e-5)
        np.testing.assert_allclose(got_maps[i], as_maps(reference[name], prefix, (8, 8)),
                                   atol=1e-5)


@pytest.mark.backends
def test_mixer_and_hybrid_maps_are_the_blocks_outputs():
    mixer = seeded(keras_vit.MLPMixer, **MIXER, classes=3)
    features = keras_vit.MLPMixer(**MIXER, features_only=True, out_indices=(1, 2))
    features.set_weights([w for w, v in zip(mixer.get_weights(), mixer.weights, strict=True)
                          if not v.path.startswith(("pre_head_layer_norm", "head"))])
    blocks = [layer.output for layer in mixer.layers if isinstance(layer, MixerBlock)]
    x = images()
    reference = [keras.ops.convert_to_numpy(y)
                 for y in keras.Model(mixer.input, blocks[1:])(x)]
    for got, want in zip(outputs(features, x), reference, strict=True):
        np.testing.assert_allclose(got, as_maps(want, 0, (8, 8)), atol=1e-5)

    hybrid = seeded(keras_vit.VisionTransformer, **HYBRID, features_only=True, out_indices=1)
    (got,) = outputs(hybrid, x)
    reference = intermediate_features(hybrid, x)["encoderblock_1"]
    np.testing.assert_allclose(got, as_maps(reference, 1, (4, 4)), atol=1e-5)


@pytest.mark.parametrize("name", ["vit_tiny_token", "r26_vit_tiny"])
def test_pretrained_features_equal_the_official_block_outputs(name):
    """The official implementation's `encoderblock_i` activations (its
    flax `capture_intermediates`), through `model_from_checkpoint`."""
    fixture = Fixture(name)
    x = fixture.io["images_uint8"].astype("float32")
    tokens = keras_vit.model_from_checkpoint(fixture.checkpoint, features_only=True,
                                             out_indices=(0, 1), feature_format="tokens")
    maps = fixture.build(features_only=True, out_indices=(-1,))  # the builder's weights=
    for i, got in enumerate(outputs(tokens, x)):
        want = fixture.io[f"act/Transformer/encoderblock_{i}"]
        assert_close(got, want, scale=np.abs(want).max())
    (got,) = outputs(maps, x)
    want = fixture.io["act/Transformer/encoderblock_1"]
    assert_close(got, as_maps(want, 1, (8, 8)), scale=np.abs(want).max())
    stride = 8 if name == "r26_vit_tiny" else 4  # ResNet stride 8 x 1x1 patches
    assert feature_info(maps) == [
        {"module": "encoderblock_1", "index": 1, "num_chs": 48, "reduction": stride}]


@pytest.mark.backends
def test_any_image_size_gives_its_own_grid():
    maps = seeded(keras_vit.VisionTransformer, **{**VIT, "input_shape": (None, None, 3)},
                  features_only=True, out_indices=(-1,))
    tokens = keras_vit.VisionTransformer(**{**VIT, "input_shape": (None, None, 3)},
                                         features_only=True, out_indices=(-1,),
                                         feature_format="tokens")
    tokens.set_weights(maps.get_weights())
    assert maps.output_shape == (None, None, None, 48)  # one output: not a list
    x = images(1, 48, 24)
    (got,) = outputs(maps, x)
    (sequence,) = outputs(tokens, x)
    assert got.shape == (1, 12, 6, 48) and sequence.shape == (1, 1 + 72, 48)
    np.testing.assert_array_equal(got, as_maps(sequence, 1, (12, 6)))


def test_named_builders_build_no_head_and_leave_out_the_later_blocks():
    model = keras_vit.ViTTi16(input_shape=(32, 32, 3), features_only=True, out_indices=(1, 3))
    assert model.output_shape == [(None, 2, 2, 192)] * 2
    assert [layer.name for layer in model.layers
            if isinstance(layer, TransformerBlock)] == [f"encoderblock_{i}" for i in range(4)]
    assert not {"encoder_norm", "head", "pre_logits"} & {layer.name for layer in model.layers}
    assert [(i["module"], i["num_chs"], i["reduction"]) for i in feature_info(model)] == [
        ("encoderblock_1", 192, 16), ("encoderblock_3", 192, 16)]


def test_default_out_indices_are_timms_last_three_blocks():
    model = keras_vit.MLPMixer(**{**MIXER, "num_blocks": 4}, features_only=True)
    assert [info["index"] for info in feature_info(model)] == [1, 2, 3]
    model = keras_vit.VisionTransformer(**{**VIT, "num_layers": 2}, features_only=True)
    assert [info["index"] for info in feature_info(model)] == [0, 1]  # fewer: all
    model = keras_vit.VisionTransformer(**VIT, features_only=True, out_indices=2)
    assert [info["index"] for info in feature_info(model)] == [1, 2]  # an int: the last n


def test_feature_info_of_a_non_square_patch_and_of_other_models():
    model = keras_vit.VisionTransformer(**{**VIT, "patch_size": (4, 2)}, features_only=True,
                                        out_indices=(0,))
    assert model.output_shape == (None, 8, 16, 48)
    assert feature_info(model)[0]["reduction"] == (4, 2)
    with pytest.raises(ValueError, match=re.escape(
            "'vision_transformer' is not a features_only model (its outputs are not the "
            "blocks' feature maps); build one with features_only=True")):
        feature_info(keras_vit.VisionTransformer(**VIT, classes=3))
    with pytest.raises(TypeError, match="Expected a keras.Model, got str."):
        feature_info("model.keras")


def test_weights_load_as_for_include_top_false(tmp_path):
    headless = seeded(keras_vit.VisionTransformer, **VIT, include_top=False)
    headless.save_weights(tmp_path / "backbone.weights.h5")
    model = keras_vit.VisionTransformer(**VIT, features_only=True, out_indices=(0, 1, 2),
                                        feature_format="tokens",
                                        weights=str(tmp_path / "backbone.weights.h5"))
    blocks = [layer.output for layer in headless.layers if isinstance(layer, TransformerBlock)]
    want = keras.Model(headless.input, blocks)(images())
    for got, expected in zip(outputs(model, images()), want, strict=True):
        np.testing.assert_array_equal(got, keras.ops.convert_to_numpy(expected))


def test_a_timm_gap_checkpoint_loads_without_its_fc_norm():
    """timm's gap models normalise the pooled vector (`fc_norm`), not the
    sequence: features, and `include_top=False` without pooling (timm's
    `forward_features`), leave those two arrays out."""
    path = str(REPO_ROOT / "tests" / "fixtures" / "hub" / "timm_vit_gap")
    classifier = keras_vit.model_from_checkpoint(path)
    blocks = [layer.output for layer in classifier.layers
              if isinstance(layer, TransformerBlock)]
    x = images(2)
    want = [keras.ops.convert_to_numpy(y) for y in keras.Model(classifier.input, blocks)(x)]
    features = keras_vit.model_from_checkpoint(path, features_only=True, out_indices=(0, 1),
                                               feature_format="tokens")
    for got, expected in zip(outputs(features, x), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    sequence = keras_vit.model_from_checkpoint(path, include_top=False)
    np.testing.assert_array_equal(predict(sequence, x), want[-1])  # no final norm: fc_norm


def test_a_checkpoint_without_head_gives_features_not_its_pooling(tmp_path):
    """`model_from_checkpoint` pools a headless checkpoint with pre_logits
    (`pooling="token"`) unless features are asked for."""
    headless = keras_vit.VisionTransformer(**VIT, representation_size=8, include_top=False,
                                           pooling="token")
    path = keras_vit.save_official_weights(headless, tmp_path / "headless.npz")
    model = keras_vit.model_from_checkpoint(path, features_only=True, out_indices=(-1,))
    assert model.output_shape == (None, 8, 8, 48)


# --- saving and exporting ---------------------------------------------------------------

@pytest.mark.backends
def test_keras_file_reloads_with_safe_mode_identical(tmp_path):
    model = seeded(keras_vit.VisionTransformer, **{**VIT, "input_shape": (None, None, 3)},
                   features_only=True, out_indices=(2, 0), remat=True,
                   attention="dot_product")
    model.save(tmp_path / "features.keras")
    again = keras.saving.load_model(tmp_path / "features.keras", safe_mode=True)
    assert again.output_names == ["encoderblock_2_features", "encoderblock_0_features"]
    assert feature_info(again) == feature_info(model)
    assert all(layer.remat and layer.attention == "dot_product"
               for layer in again.layers if isinstance(layer, TransformerBlock))
    x = images(2, 24, 40)
    for got, want in zip(outputs(again, x), outputs(model, x), strict=True):
        assert got.shape == (2, 6, 10, 48)
        np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(not TF, reason="a SavedModel is written on the TensorFlow backend")
def test_saved_model_export_serves_the_same_maps(tmp_path):
    """Keras' own `model.export` (the verified `keras_vit.export` pipeline
    exports classifiers: logits, probabilities, top-k)."""
    import tensorflow as tf

    model = seeded(keras_vit.VisionTransformer, **{**VIT, "input_shape": (None, None, 3)},
                   features_only=True, out_indices=(0, -1))
    model.export(str(tmp_path / "sm"), format="tf_saved_model", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm"))
    for x in (images(2), images(1, 48, 16)):
        got = served.serve(tf.constant(x))
        for y, want in zip(got, outputs(model, x), strict=True):
            np.testing.assert_allclose(y.numpy(), want, atol=1e-5)
    from keras_vit import export

    for given in ("auto", "logits"):  # (outputs="logits" once failed in an int() of a tuple)
        with pytest.raises(ValueError, match=re.escape(
                f"{model.name!r} outputs 2 feature map(s) (features_only=True), not classes, "
                "and keras_vit's exports verify a classifier's top-1; export it with Keras: "
                "model.export(path, format='tf_saved_model').")):
            export.to_saved_model(model, tmp_path / "refused", outputs=given)
    assert not (tmp_path / "refused").exists()


# --- remat -----------------------------------------------------------------------------

def _plain_and_remat(builder, **kwargs):
    models = []
    for remat in (False, True):
        keras.utils.set_random_seed(0)  # the same dropout seeds in both
        models.append(builder(**kwargs, remat=remat))
    random_weights(models[0], scale=0.3)
    models[1].set_weights(models[0].get_weights())
    return models


@pytest.mark.backends
@pytest.mark.parametrize("builder, kwargs", [
    (keras_vit.VisionTransformer, dict(VIT, dropout_rate=0.1, attention_dropout_rate=0.1,
                                       drop_path_rate=0.2)),
    (keras_vit.MLPMixer, dict(MIXER, drop_path_rate=0.2)),
    # #50: EVA-02's rotary embeddings, q/v biases and SwiGLU with its norm; BEiT's
    # relative position bias (a gathered table)
    (keras_vit.VisionTransformer, dict(VIT, rope={"variant": "eva", "ref_grid": (4, 4)},
                                       mlp="swiglu", mlp_norm=True, qkv_bias="qv",
                                       classifier="avg", fc_norm=True, dropout_rate=0.1,
                                       drop_path_rate=0.2)),
    (keras_vit.VisionTransformer, dict(VIT, relative_position_bias=True, qkv_bias="qv",
                                       position_embedding=False, classifier="avg",
                                       fc_norm=True, attention_dropout_rate=0.1,
                                       drop_path_rate=0.2)),
], ids=["vit", "mixer", "rope", "relative_position_bias"])
def test_remat_gives_the_plain_outputs_and_gradients(builder, kwargs):
    """With dropout and drop path: the recomputation draws the forward's
    masks (the weights after one SGD step, learning rate 1, differ by the
    gradients)."""
    plain, remat = _plain_and_remat(builder, **kwargs, classes=3, classifier_activation=None)
    assert all(block.remat for block in remat.layers
               if isinstance(block, (TransformerBlock, MixerBlock)))
    initial = plain.get_weights()
    x, y = images(4), np.eye(3, dtype="float32")[[0, 1, 2, 0]]
    inference = predict(plain, x)
    results = []
    for model in (plain, remat):
        keras.utils.set_random_seed(1)  # torch's dropout draws from its global generator
        forward = keras.ops.convert_to_numpy(model(x, training=True))
        model.compile(optimizer=keras.optimizers.SGD(1.0),
                      loss=keras.losses.CategoricalCrossentropy(from_logits=True))
        keras.utils.set_random_seed(2)
        model.train_on_batch(x, y)
        results.append((forward, model.get_weights()))
    (plain_forward, plain_weights), (remat_forward, remat_weights) = results
    assert not np.allclose(plain_forward, inference, atol=1e-3)  # masks were drawn
    np.testing.assert_allclose(remat_forward, plain_forward, atol=1e-5)
    assert max(np.abs(a - b).max() for a, b in zip(plain_weights, initial, strict=True)) > 0.01
    for got, want in zip(remat_weights, plain_weights, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


BAD_ARGUMENTS = [  # (arguments, error, message)
    (dict(features_only=True, out_indices=(0, 3)), ValueError,
     "`out_indices=(0, 3)`: 3 is out of range for 3 blocks; allowed: an int n from 1 to 3 "
     "(the last n blocks) or a sequence of block indices from -3 to 2 (negative: from the "
     "end)."),
    (dict(features_only=True, out_indices=(1, -2)), ValueError,
     "`out_indices=(1, -2)` names block 1 twice (3 blocks); each block can be one output."),
    (dict(features_only=True, out_indices=0), ValueError,
     "`out_indices=0` is out of range for 3 blocks; allowed: an int n from 1 to 3"),
    (dict(features_only=True, out_indices=()), ValueError, "`out_indices` is empty; allowed:"),
    (dict(features_only=True, out_indices=(0.5,)), TypeError,
     "`out_indices` must be an int n from 1 to 3 (the last n blocks) or a sequence of block "
     "indices from -3 to 2 (negative: from the end), got (0.5,)."),
    (dict(features_only=True, out_indices=True), TypeError, "got True."),
    (dict(features_only=True, feature_format="nchw"), ValueError,
     "Unknown feature_format='nchw'; allowed: ('nhwc', 'tokens')."),
    (dict(out_indices=(0,)), ValueError,
     "`out_indices=(0,)` is only used with features_only=True."),
    (dict(feature_format="tokens"), ValueError,
     "`feature_format='tokens'` is only used with features_only=True."),
    (dict(features_only=True, pooling="avg"), ValueError,
     "features_only=True returns the blocks' outputs and builds no head; `pooling='avg'` "
     "belongs to the head or its pooling. Leave it out."),
    (dict(features_only=True, classes=10), ValueError, "`classes=10` belongs to the head"),
    (dict(features_only=True, representation_size=8), ValueError,
     "`representation_size=8` belongs to the head"),
    (dict(features_only="yes"), TypeError, "`features_only` must be True or False, got 'yes'."),
    (dict(remat=1), TypeError, "`remat` must be True or False, got 1."),
    (dict(attention="flash"), ValueError,
     "Unknown attention='flash'; allowed: ('auto', 'fused', 'dot_product')"),
]


def test_bad_arguments_name_the_value():
    """Each refused before anything is built (one test: building nothing,
    they take no time, and a test each would cost Keras' clean-up)."""
    for bad, error, message in BAD_ARGUMENTS:
        with pytest.raises(error, match=re.escape(message)):
            keras_vit.VisionTransformer(**VIT, **bad)


def test_named_builders_and_model_from_checkpoint_check_the_same_way():
    with pytest.raises(ValueError, match=re.escape(
            "`out_indices=(12,)`: 12 is out of range for 12 blocks")):
        keras_vit.ViTB16(features_only=True, out_indices=(12,))  # before building anything
    with pytest.raises(ValueError, match=re.escape("`pooling='max'` belongs to the head")):
        keras_vit.MixerB16(features_only=True, pooling="max")
    with pytest.raises(ValueError, match=re.escape(
            "`out_indices=(-3,)`: -3 is out of range for 2 blocks")):
        keras_vit.model_from_checkpoint(Fixture("mixer_tiny").checkpoint, features_only=True,
                                        out_indices=(-3,))


def test_remat_on_a_backend_that_does_not_train_names_it(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "numpy")
    with pytest.raises(ValueError, match=re.escape(
            "remat=True rematerialises the blocks in training, and the Keras backend "
            "'numpy' does not train; use one of ('tensorflow', 'jax', 'torch') "
            "(KERAS_BACKEND), or remat=False.")):
        keras_vit.MLPMixer(**MIXER, remat=True)


def test_remat_is_in_the_block_config():
    block = TransformerBlock(num_heads=2, mlp_dim=8, remat=True)
    assert block.get_config()["remat"] is True
    assert TransformerBlock.from_config(block.get_config()).remat
    assert MixerBlock.from_config(MixerBlock(4, 8, remat=True).get_config()).remat
    assert not conftest.tiny_vit().get_layer("encoderblock_0").remat
