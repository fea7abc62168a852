"""Official checkpoint format: full-size loading, key conventions, the
writer, the position-embedding resize."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_vit
from conftest import predict
from keras_vit.weights import official
from keras_vit.weights.posemb import resize_position_embedding
from official_fixtures import OFFICIAL, TOOLS, Fixture, assert_close, require


def make_official_npz(manifest_rows, seed, tmp_path):
    """Writes a checkpoint with the shared official-format generator."""
    tool = require(TOOLS / "make_official_npz.py")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps(manifest_rows))
    out = tmp_path / "checkpoint.npz"
    subprocess.run([sys.executable, str(tool), str(manifest), str(seed), str(out)],
                   check=True, capture_output=True)
    return out


def test_manifest_from_architecture_equals_the_official_manifest():
    """Our key/shape table, derived from the model, reproduces the official
    manifests of every fixture (pre-Linen names, GroupNorm as (C,))."""
    for name in ("vit_tiny_token", "vit_tiny_gap", "mixer_tiny", "rstem_vit_tiny"):
        fixture = Fixture(name)
        model = fixture.build(weights=None, classes=fixture.config["num_classes"],
                              input_shape=(fixture.image_size,) * 2 + (3,),
                              **({"representation_size": 32} if name == "vit_tiny_token" else {}))
        expected = json.loads(require(OFFICIAL / f"{name}_manifest.json").read_text())
        assert official.official_manifest(model) == sorted(expected), name


@pytest.mark.slow
def test_full_size_vit_b16_checkpoint_loads_at_224_and_384(tmp_path):
    """An ImageNet-21k-layout ViT-B/16 file (pre_logits 768, 21,843 classes)
    written by the official-format generator from our manifest."""
    architecture = keras_vit.VisionTransformer(
        16, 768, 12, 12, 3072, representation_size=768, classes=21843,
        weights=None)
    manifest = official.official_manifest(architecture)
    assert len(manifest) == 12 * 16 + 10  # blocks + embedding, cls, posemb, norm, pre_logits, head
    del architecture
    path = make_official_npz(manifest, 7, tmp_path)
    arrays = dict(np.load(path))

    model = keras_vit.ViTB16(weights=str(path))
    assert model.output_shape == (None, 21843)
    assert model.count_params() == sum(a.size for a in arrays.values())
    q = arrays["Transformer/encoderblock_11/MultiHeadDotProductAttention_1/query/kernel"]
    qkv = keras.ops.convert_to_numpy(model.get_layer("encoderblock_11").qkv.kernel)
    np.testing.assert_array_equal(qkv[:, :768], q.reshape(768, 768))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model.get_layer("head").kernel), arrays["head/kernel"])
    del model
    keras.backend.clear_session()

    model384 = keras_vit.ViTB16(weights=str(path), input_shape=(384, 384, 3))
    posemb = keras.ops.convert_to_numpy(model384.get_layer("patch_encoder").position_embedding)
    np.testing.assert_array_equal(
        posemb, resize_position_embedding(arrays[official.POSEMB_KEY], (24, 24)))
    assert posemb.shape == (1, 577, 768)


def test_linen_named_checkpoint_loads(tmp_path):
    """Files written by Linen code name block children LayerNorm_0/_1,
    MultiHeadDotProductAttention_0, MlpBlock_0."""
    fixture = Fixture("vit_tiny_token")
    rename = {"LayerNorm_2": "LayerNorm_1", "MultiHeadDotProductAttention_1":
              "MultiHeadDotProductAttention_0", "MlpBlock_3": "MlpBlock_0"}
    linen = {}
    for key, value in np.load(fixture.checkpoint).items():
        for old, new in rename.items():
            key = key.replace(f"/{old}/", f"/{new}/")
        linen[key] = value
    assert "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel" in linen
    path = tmp_path / "linen.npz"
    np.savez(path, **linen)
    model = fixture.build(weights=str(path), classifier_activation=None)
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["logits"])


def test_groupnorm_parameters_in_both_layouts(tmp_path):
    """r26 stores GroupNorm as (1,1,1,C); the same values as (C,) load too."""
    fixture = Fixture("r26_vit_tiny")
    arrays = dict(np.load(fixture.checkpoint))
    assert arrays["gn_root/scale"].shape == (1, 1, 1, 64)
    squeezed = {k: (v.reshape(-1) if "/gn" in "/" + k and k.endswith(("scale", "bias"))
                    and v.ndim == 4 else v) for k, v in arrays.items()}
    assert squeezed["gn_root/scale"].shape == (64,)
    path = tmp_path / "squeezed.npz"
    np.savez(path, **squeezed)
    model = fixture.build(weights=str(path), classifier_activation=None)
    assert_close(predict(model, fixture.io["images_uint8"]), fixture.io["logits"])


@pytest.mark.parametrize("name", ["vit_tiny_token", "mixer_tiny", "r26_vit_tiny"])
def test_save_official_weights_round_trip(name, tmp_path):
    fixture = Fixture(name)
    model = fixture.build()
    path = tmp_path / "again.npz"
    assert keras_vit.save_official_weights(model, path) == str(path)
    written = dict(np.load(path))
    original = dict(np.load(fixture.checkpoint))
    assert sorted(written) == sorted(original)
    for key, value in original.items():
        np.testing.assert_array_equal(written[key].reshape(value.shape), value, err_msg=key)
    again = fixture.build(weights=str(path))
    images = fixture.io["images_uint8"]
    np.testing.assert_array_equal(predict(again, images), predict(model, images))


def test_a_missing_key_is_an_error_not_a_random_weight(tmp_path):
    fixture = Fixture("vit_tiny_token")
    arrays = dict(np.load(fixture.checkpoint))
    del arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
    arrays["Transformer/encoderblock_1/extra/kernel"] = np.zeros(3, "float32")
    path = tmp_path / "broken.npz"
    np.savez(path, **arrays)
    with pytest.raises(official.CheckpointMismatchError) as info:
        fixture.build(weights=str(path))
    message = str(info.value)
    assert message.split("\n")[0] == (
        f"Checkpoint {path} does not fit model 'vision_transformer': 1 missing, "
        "1 unexpected, 0 mis-shaped keys; the file looks like a ViT (2 blocks, "
        "width 48, 3 heads, MLP 96, patch 4) with a 10-class head and a 32-unit "
        "pre_logits layer.")
    assert info.value.missing == ["Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias"]
    assert "missing keys (1): Transformer/encoderblock_1/MlpBlock_3/Dense_1/bias" in message
    assert "unexpected keys (1): Transformer/encoderblock_1/extra/kernel" in message


def test_not_an_npz_is_a_clear_error(tmp_path):
    path = tmp_path / "page.npz"
    path.write_text("<html>Access denied</html>")
    with pytest.raises(official.UnsupportedCheckpointError,
                       match=r"is an HTML page, not a checkpoint"):
        keras_vit.ViTB16(weights=str(path))


def test_pickled_npz_is_refused(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, **{"head/kernel": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(official.CorruptCheckpointError, match="pickled"):
        official.read_checkpoint(path)


# --- resize_position_embedding -------------------------------------------

def test_resize_is_identity_on_the_same_grid():
    posemb = np.random.default_rng(0).normal(size=(1, 1 + 16, 3)).astype("float32")
    np.testing.assert_array_equal(resize_position_embedding(posemb, (4, 4)), posemb)


def test_resize_keeps_class_token_and_aligns_corners():
    grid = np.arange(9, dtype="float32").reshape(1, 9, 1)  # 3x3 ramp 0..8
    posemb = np.concatenate([np.full((1, 1, 1), -5.0, "float32"), grid], axis=1)
    out = resize_position_embedding(posemb, (5, 5))
    assert out[0, 0, 0] == -5.0
    g = out[0, 1:, 0].reshape(5, 5)
    # aligned corners: corners equal the old corners, linear in between
    assert (g[0, 0], g[0, -1], g[-1, 0], g[-1, -1]) == (0.0, 2.0, 6.0, 8.0)
    np.testing.assert_allclose(g[0], [0, 0.5, 1, 1.5, 2])
    np.testing.assert_allclose(g[:, 0], [0, 1.5, 3, 4.5, 6])


def test_resize_to_a_non_square_grid():
    posemb = np.random.default_rng(1).normal(size=(1, 16, 2)).astype("float32")
    out = resize_position_embedding(posemb, (6, 3), num_prefix_tokens=0)
    assert out.shape == (1, 18, 2)
    np.testing.assert_allclose(out[0].reshape(6, 3, 2)[0, 0], posemb[0, 0], rtol=1e-6)


def test_resize_matches_the_official_fixture():
    fixture = Fixture("vit_tiny_token")
    posemb = np.load(fixture.checkpoint)[official.POSEMB_KEY]
    np.testing.assert_array_equal(resize_position_embedding(posemb, (12, 12)),
                                  fixture.io["posemb_48"])


def test_non_square_model_grid_loads():
    fixture = Fixture("vit_tiny_token")
    model = fixture.build(input_shape=(32, 48, 3))
    assert model.get_layer("patch_encoder").position_embedding.shape == (1, 1 + 8 * 12, 48)


def test_resize_rejects_a_non_square_checkpoint_grid():
    with pytest.raises(ValueError, match=r"A position embedding of 12 patch tokens is not a square grid"):
        resize_position_embedding(np.zeros((1, 13, 4)), (4, 4))
