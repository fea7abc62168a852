"""The position arithmetic of #50 against timm's own functions: the 2-D
rotary embeddings (DINOv3's, EVA-02's), the rotation, and BEiT's relative
position index; and the errors of the new block options."""

import keras
import numpy as np
import pytest
import transformers  # noqa: F401 - before timm's stand-in (tests/torch_libraries.py)
from torch_libraries import import_timm

from keras_vit.layers import TransformerBlock
from keras_vit.layers.rotary import RotaryEmbedding, apply_rope, check_rope
from keras_vit.layers.transformer import relative_position_index

timm = import_timm()
torch = pytest.importorskip("torch")
from timm.layers import pos_embed_sincos as timm_rope  # noqa: E402
from timm.models.beit import gen_relative_position_index  # noqa: E402

GRIDS = [(4, 4), (3, 5)]


def timm_embedding(variant, grid, head_dim=32):
    if variant == "dinov3":
        return timm_rope.RotaryEmbeddingDinoV3(dim=head_dim, temperature=100).get_embed(grid)
    return timm_rope.RotaryEmbeddingCat(dim=head_dim, temperature=10000, in_pixels=False,
                                        ref_feat_shape=(4, 4)).get_embed(grid)


ROPES = {"dinov3": "dinov3", "eva": {"variant": "eva", "ref_grid": (4, 4)}}


@pytest.mark.backends
@pytest.mark.parametrize("variant", sorted(ROPES))
@pytest.mark.parametrize("grid", GRIDS)
def test_rotary_embedding_and_rotation_are_timms(variant, grid):
    """The sines and cosines of each grid (the trained one and another), and
    queries rotated by them, as timm computes them; the two prefix rows
    leave their tokens unchanged."""
    expected = timm_embedding(variant, grid).numpy()
    layer = RotaryEmbedding(32, ROPES[variant], num_prefix_tokens=2)
    got = keras.ops.convert_to_numpy(layer(np.zeros((1, *grid, 3), "float32")))
    np.testing.assert_allclose(got[2:], expected, atol=5e-6)  # XLA: 1e-6 off
    x = np.random.default_rng(0).normal(size=(2, 3, 2 + grid[0] * grid[1], 32)).astype("float32")
    rotated = keras.ops.convert_to_numpy(apply_rope(x, got, variant))
    reference = timm_rope.apply_rot_embed_cat(torch.tensor(x[:, :, 2:]), torch.tensor(expected),
                                              half=variant == "dinov3").numpy()
    np.testing.assert_allclose(rotated[:, :, 2:], reference, atol=1e-5)
    np.testing.assert_array_equal(rotated[:, :, :2], x[:, :, :2])


def test_relative_position_index_is_timms():
    for window in [(2, 2), (3, 4)]:
        np.testing.assert_array_equal(relative_position_index(window),
                                      gen_relative_position_index(window).numpy())


@pytest.mark.parametrize("rope, message", [
    ("rotary", "Unknown rope='rotary'"),
    ({"variant": "dinov3", "ref_grid": (4, 4)}, "is not a parameter of the 'dinov3' RoPE"),
    ({"variant": "eva", "temperature": -1}, "rope temperature"),
])
def test_a_bad_rope_is_named(rope, message):
    with pytest.raises(ValueError, match=message):
        check_rope(rope)


def test_the_new_block_options_refuse_what_they_cannot_compute():
    x = keras.ops.ones((1, 5, 16))
    with pytest.raises(ValueError, match="takes the call argument `rope`"):
        TransformerBlock(2, 32, rope="dinov3")(x)
    with pytest.raises(ValueError, match="Unknown qkv_bias='k'"):
        TransformerBlock(2, 32, qkv_bias="k")
    with pytest.raises(ValueError, match=r"for a class token and a 3x3 patch grid \(10 tokens\), "
                                         "got 5 tokens"):
        TransformerBlock(2, 32, relative_position_bias=(3, 3))(x)
    with pytest.raises(ValueError, match="head width divisible by 4"):
        RotaryEmbedding(6, "eva")


def test_block_options_keep_the_default_config():
    """A block at its defaults saves the config it saved before #50; the new
    options round-trip."""
    config = TransformerBlock(2, 32).get_config()
    assert not {"qkv_bias", "mlp_norm", "rope", "relative_position_bias"} & set(config)
    block = TransformerBlock(2, 32, qkv_bias="qv", mlp_norm=True, rope="eva",
                             relative_position_bias=(2, 3))
    again = TransformerBlock.from_config(block.get_config())
    assert (again.qkv_bias, again.mlp_norm, again.rope, again.relative_position_bias) == \
        ("qv", True, "eva", (2, 3))


@pytest.fixture(scope="module")
def rope_file(tmp_path_factory):
    """A tiny DINOv3-style model's official `.npz` (its `rope/dinov3` key
    `[100, 0, 0]`) and the model's builder arguments."""
    import keras_vit
    from keras_vit.weights.official import save_official_weights

    kwargs = dict(patch_size=8, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64,
                  classes=3, input_shape=(None, None, 3), rope="dinov3",
                  position_embedding=False, classifier="avg")
    path = save_official_weights(keras_vit.VisionTransformer(**kwargs),
                                 tmp_path_factory.mktemp("rope") / "rope.npz")
    return dict(np.load(path)), kwargs


@pytest.mark.parametrize("tamper", [
    {"rope/dinov3": [100.0, 0.0, 0.0, 0.0, 0.0]},        # another shape
    {"rope/dinov3": [float("nan"), 0.0, 0.0]},           # not finite
    {"rope/dinov3": [0.0, 0.0, 0.0]},                    # no temperature
    {"rope/dinov3": [100.0, 16.0, 16.0]},                # a reference grid DINOv3 has not
    {"rope/eva": [1e4, 16.0, 0.0]},                      # half a reference grid
    {"rope/eva": [1e4, 16.5, 16.5]},                     # not whole patches
], ids=["shape", "nan", "zero", "dinov3-grid", "half-grid", "fraction"])
def test_a_tampered_rope_key_is_refused_by_name(rope_file, tmp_path, tamper):
    """A crafted `rope/...` value is a CorruptCheckpointError naming the key
    when the file's architecture is read; loaded into a model built with
    its own RoPE, the value must be the model's (CheckpointMismatchError)."""
    import keras_vit
    from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError

    arrays, kwargs = rope_file
    arrays = {k: v for k, v in arrays.items() if not k.startswith("rope/")}
    arrays.update({k: np.asarray(v, "float32") for k, v in tamper.items()})
    path = tmp_path / "tampered.npz"
    np.savez(path, **arrays)
    with pytest.raises(CorruptCheckpointError, match=r"rotary embedding keys \['rope/"):
        keras_vit.model_from_checkpoint(path)
    with pytest.raises(CheckpointMismatchError, match="rope/"):
        keras_vit.VisionTransformer(**kwargs, weights=path)


def test_two_rope_keys_are_refused(rope_file, tmp_path):
    import keras_vit
    from keras_vit.errors import CorruptCheckpointError

    arrays, _ = rope_file
    np.savez(tmp_path / "two.npz", **arrays, **{"rope/eva": np.float32([1e4, 0, 0])})
    with pytest.raises(CorruptCheckpointError, match=r"\['rope/dinov3', 'rope/eva'\]"):
        keras_vit.model_from_checkpoint(tmp_path / "two.npz")
