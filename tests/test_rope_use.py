"""What the ViTs do, on the #50 families beyond `test_family_use`'s
parametrized tests (which cover their feature maps, LoRA, int8 and its
reload, a fresh process in safe mode, rollout and the memory estimate's
fixed part): a RoPE model under a mixed bfloat16 policy rotates by its
float32 table, feature maps of a RoPE backbone at any size, layer decay and
the model-parallel layout of the new weights, a layer-decay step of BEiT's
tables, the memory estimate of a model built for any size, and `keras-vit
train` and `explain` on a tiny folder of images. Tiny random models (patch 8, width 32, 2 blocks)."""

import json
import re

import keras
import numpy as np
import pytest

from conftest import predict, random_weights, run_cli
from keras_vit import VisionTransformer, inspect
from keras_vit.layers import fused
from keras_vit.training import distribution, memory
from keras_vit.training.layer_decay import layer_decay_scales
from test_family_use import build, images, options

ROPE = ["dinov3", "eva02"]


@pytest.mark.backends
@pytest.mark.parametrize("family", ROPE)
def test_mixed_bfloat16_rotates_by_the_float32_table(family, monkeypatch):
    """The blocks get the RotaryEmbedding's float32 sines and cosines (not
    rounded to bfloat16 with the tokens, as Keras' autocast would), and the
    logits stay near the float32 model's."""
    reference = build(family)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = VisionTransformer(**options(family))
    finally:
        keras.config.set_dtype_policy("float32")
    model.set_weights(reference.get_weights())
    seen = []
    apply_rope = fused.apply_rope
    monkeypatch.setattr(fused, "apply_rope", lambda x, rope, variant: seen.append(
        (keras.backend.standardize_dtype(x.dtype), keras.backend.standardize_dtype(rope.dtype)))
        or apply_rope(x, rope, variant))
    logits = predict(model, images(family))
    assert seen and set(seen) == {("bfloat16", "float32")}
    expected = predict(reference, images(family))
    np.testing.assert_allclose(logits.astype("float32"), expected, rtol=0,
                               atol=0.03 * np.abs(expected).max())


@pytest.mark.backends
@pytest.mark.parametrize("family, size, grid", [("dinov3", (48, 40), (6, 5)),
                                                ("eva02", (24, 56), (3, 7))])
def test_a_rope_backbone_for_any_size_gives_each_size_its_grid(family, size, grid):
    model = build(family, features_only=True, out_indices=1, input_shape=(None, None, 3))
    x = np.random.default_rng(0).uniform(0, 255, (1, *size, 3)).astype("float32")
    assert tuple(keras.ops.convert_to_numpy(model(x)).shape) == (1, *grid, 32)


def test_the_new_weights_decay_with_their_block_and_are_not_split():
    """Layer decay gives the q/v biases and the relative position table
    their block's depth; the model-parallel layout splits the same kernels
    as a ViT's (q/v biases, the tables and the MLP norm are replicated)."""
    beit, eva = build("beit"), build("eva02")
    scales = layer_decay_scales(beit, 0.5)
    for i in range(2):
        for name in ("q_bias", "v_bias", "relative_position_bias_table"):
            assert scales[f"encoderblock_{i}/{name}"] == 0.5 ** (2 - i)
    assert scales["head/kernel"] == 1.0
    assert layer_decay_scales(eva, 0.5)["encoderblock_0/mlp_norm/gamma"] == 0.25
    for model in (beit, eva, build("dinov3")):
        split = sorted(v.path for v in model.weights for pattern, _ in distribution.LAYOUTS
                       if re.fullmatch(pattern, v.path))
        assert split == sorted(f"encoderblock_{i}/{name}" for i in range(2) for name in (
            "qkv/kernel", "attention_output/kernel", "mlp_dense1/kernel", "mlp_dense1/bias",
            "mlp_dense2/kernel"))


@pytest.mark.backends
@pytest.mark.parametrize("family", ROPE)
def test_the_memory_estimate_of_a_model_for_any_size_counts_at_the_training_size(family):
    """A model built with `input_shape=(None, None, 3)` is counted at the
    training size, as the same model built for it (it was not counted at
    all: its blocks' token counts are None)."""
    fixed = memory.estimate_training_memory(build(family), 4)
    any_size = build(family, input_shape=(None, None, 3))
    estimate = memory.estimate_training_memory(any_size, 4, image_size=32)
    assert estimate.per_image == fixed.per_image > 0
    assert memory.check_host_memory(any_size, 4, image_size=32, name="m",
                                    optimizer_slots=1, available=1 << 40) is not None


@pytest.mark.backends
def test_the_memory_estimate_counts_rotary_embeddings_and_the_mlp_norm():
    """The estimate's own definition (keras_vit.training.memory): rotary
    embeddings keep 1.5 T D more per block, EVA-02's MLP norm 2 T M; the
    rotary table itself (no batch axis, no gradient) is not counted."""
    from test_family_use import ACTIVATIONS, MLP, TOKENS, WIDTH, _per_image

    plain = _per_image()
    assert _per_image(rope="dinov3") - plain == pytest.approx(
        2 * ACTIVATIONS * 4 * memory.ROPE * TOKENS * WIDTH, abs=1)
    assert _per_image(mlp_norm=True) - plain == pytest.approx(
        2 * ACTIVATIONS * 4 * memory.MLP_NORM * TOKENS * MLP, abs=1)


def test_position_embedding_similarity_says_when_there_is_none():
    with pytest.raises(ValueError, match=r"has no position embedding \(built with "
                                         r"position_embedding=False"):
        inspect.position_embedding_similarity(build("beit"))


@pytest.mark.backends
def test_layer_decay_trains_beits_gathered_tables():
    """One AdamW step with layer decay and decoupled weight decay: each
    block's relative position table (its gradient gathered by the index)
    moves, the deeper one more."""
    from keras_vit.training.layer_decay import LayerDecayAdamW

    model = build("beit")
    before = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    model.compile(optimizer=LayerDecayAdamW(
        1e-3, learning_rate_scales=layer_decay_scales(model, 0.5),
        decoupled_weight_decay=0.05), loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    model.train_on_batch(images("beit"), np.array([0, 2]))
    moved = [np.abs(keras.ops.convert_to_numpy(model.get_layer(f"encoderblock_{i}")
                                               .relative_position_bias_table)
                    - before[f"encoderblock_{i}/relative_position_bias_table"]).max()
             for i in range(2)]
    assert 0 < moved[0] < moved[1]


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="CLI image loading uses tf")
def test_cli_trains_and_explains_a_dinov3_model_for_any_size(tmp_path):
    """`keras-vit train` one epoch on a tiny folder (a model built for any
    size, under mixed bfloat16, with LoRA and layer decay), then `explain
    --class` on the trained model: no position-embedding picture, as it
    has none."""
    from PIL import Image

    from data_helpers import make_folder

    make_folder(tmp_path / "data", per_class=2, size=32)
    random_weights(VisionTransformer(**{**options("dinov3"), "input_shape": (None, None, 3),
                                        "classes": 3})).save(tmp_path / "m.keras")
    code, out, err = run_cli("train", "--model", tmp_path / "m.keras", "--data",
                             f"folder:{tmp_path / 'data'}", "--image-size", "32",
                             "--batch-size", "2", "--epochs", "1", "--out", tmp_path / "run",
                             "--lora", "2", "--layer-decay", "0.7", "--precision",
                             "mixed_bfloat16", "--json")
    assert code == 0, err
    results = json.loads(out.strip().splitlines()[-1])
    assert results["status"] == "completed" and results["lora"]["layers"] == 4
    Image.fromarray(images("dinov3", n=1)[0].astype("uint8")).save(tmp_path / "photo.png")
    code, out, err = run_cli("explain", tmp_path / "photo.png", "--model", results["model"],
                             "--class", "flower", "--image-size", "32",
                             "--out", tmp_path / "pictures", "--json")
    assert code == 0, err
    assert sorted(json.loads(out.strip().splitlines()[-1])["pictures"]) == [
        "attention_distance", "embedding_filters", "rollout"]
