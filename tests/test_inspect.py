"""keras_vit.inspect: known answers for rollout, attention distance,
position-embedding similarity and embedding filters; any ViT (new head,
another resolution, nested in a user's model)."""

import os

import keras
import numpy as np
import pytest

import conftest
from conftest import run_cli
from keras_vit import inspect
from keras_vit.layers import TransformerBlock

pytestmark = pytest.mark.backends


def tiny_vit(classifier="token", size=32, patch=8, classes=5, layers=2):
    """The tiny ViT of conftest.py with random weights (scale 0.3) everywhere."""
    model = conftest.tiny_vit(patch_size=patch, num_layers=layers, classifier=classifier,
                              input_shape=(size, size, 3), classes=classes,
                              classifier_activation=None)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3
                       for w in model.get_weights()])
    return model


def images(n=3, size=32):
    return np.random.default_rng(1).uniform(0, 255, (n, size, size, 3)).astype("float32")


def force_attention(monkeypatch, make):
    """Every block's attention probabilities become `make(tokens)`."""
    original = TransformerBlock._attention

    def attention(self, x, training, return_attention_scores=False, rope=None):
        out, weights = original(self, x, training, return_attention_scores=True, rope=rope)
        tokens = weights.shape[-1]
        forced = keras.ops.broadcast_to(keras.ops.convert_to_tensor(make(tokens)),
                                        keras.ops.shape(weights))
        return out, forced

    monkeypatch.setattr(TransformerBlock, "_attention", attention)


def test_identity_attention_rolls_out_to_the_tokens_own_position(monkeypatch):
    force_attention(monkeypatch, lambda t: np.eye(t, dtype="float32"))
    model = tiny_vit("token")
    for patch in (0, 5, 15):
        maps = inspect.attention_rollout(model, images(), token=1 + patch, upsample=False)
        expected = np.zeros((4, 4), "float32")
        expected.flat[patch] = 1.0
        np.testing.assert_allclose(maps, np.broadcast_to(expected, maps.shape), atol=1e-6)
    class_map = inspect.attention_rollout(model, images(), upsample=False)
    np.testing.assert_allclose(class_map, 0.0, atol=1e-6)  # all its mass on itself
    np.testing.assert_allclose(inspect.attention_distance(model, images()), 0.0, atol=1e-6)


def test_uniform_attention_gives_the_grid_mean_distance(monkeypatch):
    force_attention(monkeypatch, lambda t: np.full((t, t), 1.0 / t, "float32"))
    model = tiny_vit("gap", size=48, patch=8)           # 6x6 grid of 8-pixel patches
    got = inspect.attention_distance(model, images(2, 48))
    rows, cols = np.meshgrid(np.arange(6), np.arange(6), indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], -1) * 8.0
    expected = np.mean([np.hypot(*(a - b)) for a in centres for b in centres])
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    maps = inspect.attention_rollout(model, images(2, 48))   # gap: mean over tokens
    assert maps.shape == (2, 48, 48)
    np.testing.assert_allclose(maps, 1.0 / 36, rtol=1e-4)


def test_rollout_multiplies_renormalised_layers_by_hand():
    rng = np.random.default_rng(3)
    attentions = [rng.dirichlet(np.ones(5), size=(1, 2, 5)).astype("float32")
                  for _ in range(3)]
    expected = np.eye(5)
    for a in attentions:
        a = a[0].mean(0) + np.eye(5)
        expected = (a / a.sum(-1, keepdims=True)) @ expected
    got = inspect.rollout(attentions, 1, (2, 2))
    np.testing.assert_allclose(got[0].ravel(), expected[0, 1:], rtol=1e-5)
    with pytest.raises(ValueError, match="token=7 is outside the 5 tokens"):
        inspect.rollout(attentions, 1, (2, 2), token=7)


def sinusoidal_2d(grid, dim):
    """A hand-built 2-D sinusoidal position embedding (half the channels per axis)."""
    rows, cols = np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / 10.0 ** (np.arange(quarter) / quarter)
    parts = []
    for pos in (rows.ravel(), cols.ravel()):
        angles = pos[:, None] * omega[None]
        parts += [np.sin(angles), np.cos(angles)]
    return np.concatenate(parts, -1)


def test_position_embedding_similarity_known_answers():
    model = tiny_vit("token", size=48, patch=8)        # 6x6 grid, width 16
    encoder = model.get_layer("patch_encoder")
    table = sinusoidal_2d(6, 16).astype("float32")
    encoder.position_embedding.assign(np.concatenate([np.ones((1, 16)), table])[None])
    sim = inspect.position_embedding_similarity(model)
    assert sim.shape == (6, 6, 6, 6)
    flat = sim.reshape(36, 36)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-6)
    np.testing.assert_allclose(flat, flat.T, atol=1e-6)
    for i, j in [(2, 3), (0, 0), (5, 1)]:
        others = sim[i, j].copy()
        others[i, j] = -np.inf
        best = np.unravel_index(np.argmax(others), (6, 6))
        assert abs(best[0] - i) + abs(best[1] - j) == 1, (i, j, best)


def test_embedding_filters_recover_the_principal_directions():
    model = tiny_vit("token", patch=4)                 # filters of 4*4*3 = 48 pixels
    rng = np.random.default_rng(5)
    basis, _ = np.linalg.qr(rng.normal(size=(48, 2)))
    coefficients = rng.normal(size=(16, 2)) * np.array([5.0, 1.0])
    model.get_layer("patch_encoder").kernel.assign((basis @ coefficients.T).astype("float32"))
    components, ratios = inspect.embedding_filters(model, n=2)
    assert components.shape == (2, 4, 4, 3)
    flat = components.reshape(2, 48)
    for k in range(2):
        assert abs(flat[k] @ basis[:, k]) > 0.99
    assert ratios[0] > ratios[1] and ratios.sum() == pytest.approx(1.0, abs=1e-5)


def test_works_on_fine_tuned_resized_and_nested_models():
    base = tiny_vit("token", size=32)
    fine_tuned = conftest.tiny_vit(num_layers=2, input_shape=(48, 48, 3),
                                   classifier_activation=None)
    assert inspect.attention_rollout(fine_tuned, images(2, 48)).shape == (2, 48, 48)
    inputs = keras.Input((32, 32, 3))
    outputs = keras.layers.Dense(2)(base(inputs))
    wrapper = keras.Model(inputs, outputs, name="user_model")
    np.testing.assert_allclose(inspect.attention_rollout(wrapper, images()),
                               inspect.attention_rollout(base, images()), atol=1e-6)
    assert inspect.attention_distance(wrapper, images()).shape == (2, 2)
    features = inspect.intermediate_features(wrapper, images(), layers=[-1, "encoderblock_0"])
    assert list(features) == ["encoderblock_1", "encoderblock_0"]
    assert features["encoderblock_1"].shape == (3, 17, 16)
    with pytest.raises(ValueError, match="No block 'encoderblock_9'"):
        inspect.intermediate_features(base, images(), layers=["encoderblock_9"])


def test_errors_name_the_problem():
    mixer = conftest.tiny_mixer(classes=2)
    with pytest.raises(ValueError, match="holds no keras_vit ViT .*MLP-Mixers"):
        inspect.attention_rollout(mixer, images())
    with pytest.raises(ValueError, match=r"images must be \(N, 32, 32, C\).*got shape"):
        inspect.attention_rollout(tiny_vit(), images(1, 48))
    hybrid = conftest.tiny_vit(patch_size=1, resnet_layers=(1,), classes=2)
    with pytest.raises(ValueError, match="is a hybrid"):
        inspect.embedding_filters(hybrid)
    assert inspect.attention_distance(hybrid, images()).shape == (1, 2)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="CLI image loading uses tf")
@pytest.mark.parametrize("name", ["vit_tiny_token", "r26_vit_tiny"])
def test_cli_explain_writes_the_pictures_of_a_fixture_checkpoint(name, tmp_path):
    """Real photos (the fixture's) through an official-format checkpoint:
    every PNG is non-empty and has the figure's pixel size."""
    import json

    from PIL import Image

    from official_fixtures import Fixture

    fixture = Fixture(name)
    paths = []
    for i, image in enumerate(fixture.io["images_uint8"]):
        paths.append(str(tmp_path / f"photo{i}.png"))
        Image.fromarray(image).save(paths[-1])
    code, out, _ = run_cli("explain", *paths, "--weights", fixture.checkpoint,
                           "--out", tmp_path / "pictures", "--json")
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    pictures = result["pictures"]
    assert len(pictures["rollout"]) == len(paths)
    assert ("embedding_filters" in pictures) == (name == "vit_tiny_token")  # not for hybrids
    model = fixture.build()
    grid = model.get_layer("patch_encoder").grid_size
    expected = {"rollout": (640, 340), "attention_distance": (500, 400),
                "position_embedding_similarity": (
                    int(100 * max(4, grid[1] * 0.45)), int(100 * max(4, grid[0] * 0.45)))}
    if "embedding_filters" in pictures:
        n = min(28, model.get_layer("patch_encoder").kernel.shape[-1],
                model.get_layer("patch_encoder").kernel.shape[0])
        cols = min(n, 7)
        expected["embedding_filters"] = (int(cols * 90), int(-(-n // cols) * 90))
    for kind, size in expected.items():
        for path in pictures[kind]:
            assert os.path.getsize(path) > 1000
            with Image.open(path) as picture:
                assert picture.size == size, (kind, picture.size, size)
