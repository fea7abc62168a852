"""The one way in for weights: `keras_vit.weights.resolve` tells the source
once and returns one `Checkpoint`; the builders plan from it and load it,
and no file is opened again on the way."""

import pathlib
import shutil

import keras
import numpy as np
import pytest

import keras_vit
from conftest import predict, tiny_vit
from keras_vit.errors import NotAnNpzError, UnsupportedCheckpointError
from keras_vit.models.mixer import mixer_encoder
from keras_vit.models.vit import vit_encoder
from keras_vit.weights import sources
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.hub import HubCheckpoint
from keras_vit.weights.keras_h5 import KerasWeightsFile
from keras_vit.weights.sources import resolve
from official_fixtures import OFFICIAL

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"
NPZ = OFFICIAL / "vit_tiny_token.npz"
IMAGES = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")


@pytest.fixture
def counted(monkeypatch):
    """{reader: calls} of the three readers `resolve` hands a path to."""
    calls = {"sniff": 0, "npz": 0, "hub": 0}

    def count(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(sources, "sniff_checkpoint",
                        count("sniff", sources.sniff_checkpoint))
    monkeypatch.setattr(sources, "read_npz", count("npz", sources.read_npz))
    monkeypatch.setattr(sources.hub, "read_hub_checkpoint",
                        count("hub", sources.hub.read_hub_checkpoint))
    return calls


def test_each_source_gives_one_checkpoint(tmp_path):
    h5 = tmp_path / "tiny.weights.h5"
    tiny_vit().save_weights(h5)
    official = resolve(NPZ)
    assert type(official) is Checkpoint and official.format == "official"
    assert official.info().classes == 10 and official.model_config()[0] == "vit"
    assert official.arithmetic == {} and official.preprocessing is None
    keras_file = resolve(str(h5))
    assert isinstance(keras_file, KerasWeightsFile) and keras_file.info() is None
    folder = resolve(HUB / "timm_vit_token")
    assert isinstance(folder, HubCheckpoint) and folder.format == "timm"
    assert folder.arithmetic["gelu"] == "erf" and folder.preprocessing["mean"]
    bare = resolve(HUB / "transformers_vit_classifier" / "model.safetensors")
    assert bare.format == "transformers" and bare.preprocessing is None
    assert resolve(None) is None and resolve(official) is official
    with pytest.raises(TypeError, match="`weights` must be None, a registered name or a "
                                        "file path, got int 3."):
        resolve(3)


@pytest.mark.parametrize("how", ["builder", "model_from_checkpoint"])
def test_a_file_is_sniffed_once_and_read_once(counted, how):
    """`model_from_checkpoint` read an `.npz` twice (once for the
    architecture, once for the builder), each time sniffing it twice."""
    if how == "builder":
        keras_vit.VisionTransformer(patch_size=4, hidden_size=48, num_layers=2, num_heads=3,
                                    mlp_dim=96, weights=str(NPZ))
    else:
        keras_vit.model_from_checkpoint(str(NPZ))
    assert counted == {"sniff": 1, "npz": 1, "hub": 0}


def test_a_hub_folder_is_read_once(counted):
    keras_vit.model_from_checkpoint(HUB / "timm_vit_token")
    assert counted == {"sniff": 0, "npz": 0, "hub": 1}


def test_a_checkpoint_object_loads_without_its_file(tmp_path):
    """What `resolve` returned is all the builder needs: the same model as
    from the path, after the file is gone."""
    path = tmp_path / "copy.npz"
    shutil.copyfile(NPZ, path)
    checkpoint = resolve(path)
    from_path = keras_vit.model_from_checkpoint(path)
    path.unlink()
    from_object = keras_vit.model_from_checkpoint(checkpoint)
    again = keras_vit.VisionTransformer(patch_size=4, hidden_size=48, num_layers=2,
                                        num_heads=3, mlp_dim=96, weights=checkpoint)
    np.testing.assert_array_equal(predict(from_object, IMAGES), predict(from_path, IMAGES))
    np.testing.assert_array_equal(predict(again, IMAGES), predict(from_path, IMAGES))


def test_architecture_arguments_given_override_what_is_read():
    """As `model_from_checkpoint`'s docstring says, for every format: a
    width the file does not have is the loader's mismatch, named."""
    with pytest.raises(keras_vit.weights.CheckpointMismatchError, match="mis-shaped"):
        keras_vit.model_from_checkpoint(NPZ, num_heads=2)


def test_a_keras_weights_file_has_no_architecture(tmp_path):
    h5 = tmp_path / "tiny.weights.h5"
    tiny_vit().save_weights(h5)
    with pytest.raises(UnsupportedCheckpointError, match="holds no architecture"):
        keras_vit.model_from_checkpoint(h5)


def test_another_format_under_an_npz_name_is_a_not_an_npz_error(tmp_path):
    """The same class through a builder as through `read_checkpoint`: the
    bytes are not what the name says."""
    fake = tmp_path / "model.npz"
    fake.write_bytes(b"\x80\x04\x95" + b"\0" * 64)
    with pytest.raises(NotAnNpzError, match="a Python pickle"):
        tiny_vit(weights=str(fake))


def test_the_encoders_are_the_models_token_sequence():
    """`vit_encoder` / `mixer_encoder` are the pure encoder functions the
    builders wrap: the same layers, the same sequence before the final
    LayerNorm."""
    images = keras.Input((32, 32, 3), name="images")
    tokens = vit_encoder(images, patch_size=(4, 4), hidden_size=48, num_layers=2,
                         num_heads=3, mlp_dim=96, grid_size=(8, 8))
    assert tokens.shape == (None, 65, 48)
    encoder = keras.Model(images, tokens)
    model = keras_vit.VisionTransformer(patch_size=4, hidden_size=48, num_layers=2,
                                        num_heads=3, mlp_dim=96, input_shape=(32, 32, 3),
                                        include_top=False, include_preprocessing=False)
    assert [layer.name for layer in encoder.layers] == [layer.name for layer in model.layers[:-1]]
    encoder.set_weights(model.get_weights()[:-2])  # all but the final LayerNorm
    norm = model.get_layer("encoder_norm")
    np.testing.assert_allclose(predict(norm, predict(encoder, IMAGES)), predict(model, IMAGES),
                               atol=1e-6)
    mixed = mixer_encoder(images, patch_size=(4, 4), hidden_size=48, num_blocks=2,
                          tokens_mlp_dim=24, channels_mlp_dim=96, grid_size=(8, 8))
    assert mixed.shape == (None, 64, 48)


def test_a_headless_official_file_builds_the_features_it_holds(tmp_path):
    """`save_official_weights` of an `include_top=False` model writes no
    head: `model_from_checkpoint` builds the token sequence back, as for a
    transformers `ViTModel` (it said "pass `classes=`" before)."""
    features = tiny_vit(include_top=False, weights=None)
    path = keras_vit.save_official_weights(features, tmp_path / "features.npz")
    again = keras_vit.model_from_checkpoint(path)
    assert again.output_shape == features.output_shape == (None, 17, 16)
    np.testing.assert_array_equal(predict(again, IMAGES), predict(features, IMAGES))
