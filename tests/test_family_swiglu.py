"""DINOv2's ViT-g/14 and its MLP, the packed SwiGLU
(`TransformerBlock(mlp="swiglu")`, `VisionTransformer(mlp="swiglu")`,
`DINOv2ViTG14[Reg]`): one Dense to twice the hidden width, SiLU of the
first half times the second half, a Dense back.

- The block: the layer harness, a NumPy known answer, the default (GELU)
  block unchanged, an unknown MLP refused in one sentence; the official
  `.npz` round trip (the kind read off the shapes); the memory estimate.
- Parity with the libraries that wrote the weights, tiny random models
  (width 32, 2 heads, 2 blocks, 28x28 photos at patch 14) written by the
  library itself: timm's `vit_giant_patch14_dinov2` and `..._reg4_...`
  (`SwiGLUPacked`), a `dinov2_vitg14_pretrain.pth` in DINOv2's own layout
  (`mlp.w12`, `mlp.w3`, checked against timm's `checkpoint_filter_fn`),
  transformers' `Dinov2Model` / `Dinov2WithRegistersModel` with
  `use_swiglu_ffn` (saved `weights_in`, and transformers 5's in-memory
  `gate_proj`, `up_proj`, `down_proj`); each within 1e-4 x max(1, |v|)
  on the two sample photos. Contradicting configs are refused by name.
- Export: a SwiGLU model written as a timm folder opens in timm with the
  same logits; transformers' ViT export refuses it in one sentence.
- LoRA's `"mlp"` target, int8 quantization and `features_only` on it.
The named builders' parameter counts (timm's, on the meta device) are in
tests/test_family_builders.py.
"""

import json
import re
import warnings

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from conftest import predict, random_weights
from family_photos import assert_parity, photos
from harness import run_layer_test
from keras_vit import layers
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.models.vit import VisionTransformer

TINY = dict(patch_size=14, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
            layer_scale_init=1e-5, mlp="swiglu", input_shape=(28, 28, 3))
IMAGENET = dict(image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))


def tiny(**overrides):
    """A tiny SwiGLU DINOv2, every weight random (seeded)."""
    return random_weights(VisionTransformer(**{**TINY, "classes": 5,
                                               "classifier_activation": None, **overrides}))


# --- the block ----------------------------------------------------------------------

@pytest.mark.backends
def test_the_swiglu_block_in_the_layer_harness():
    """Config round trip, .keras with safe_mode, mixed_bfloat16, tf.data."""
    block, _ = run_layer_test(layers.TransformerBlock, dict(
        num_heads=2, mlp_dim=24, mlp="swiglu", layer_scale_init=1e-5, drop_path_rate=0.1),
        (2, 5, 16))
    assert tuple(block.mlp_dense1.kernel.shape) == (16, 48)
    assert tuple(block.mlp_dense2.kernel.shape) == (24, 16)


def test_the_swiglu_block_equals_numpy(monkeypatch):
    """x + ls1 MHSA(LN(x)), then x + ls2 W2 (SiLU(a) * b) with (a, b) the
    halves of W1 LN(x): timm's SwiGLUPacked (gate first)."""
    import test_family_blocks as reference

    def swiglu(h):
        a, b = np.split(h, 2, axis=-1)
        return a / (1 + np.exp(-a)) * b

    monkeypatch.setitem(reference.GELUS, "swiglu", swiglu)
    block = layers.TransformerBlock(2, 24, layer_scale_init=1e-5, mlp="swiglu")
    x = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    block.build(x.shape)
    w = reference._randomize(block)
    want = reference._np_block(x.astype("float64"), w, 2, 1e-6, "swiglu",
                               (w["ls1/gamma"], w["ls2/gamma"]))
    np.testing.assert_allclose(ops.convert_to_numpy(block(x)), want, rtol=1e-4, atol=1e-4)


def test_the_default_block_is_todays_gelu_block():
    """The default writes mlp="gelu", and a config saved before the option
    (no "mlp") loads as the same block, with the same weights."""
    block = layers.TransformerBlock(2, 24)
    block.build((None, 5, 16))
    config = block.get_config()
    assert config["mlp"] == "gelu"
    del config["mlp"]
    again = layers.TransformerBlock.from_config(config)
    again.build((None, 5, 16))
    assert again.mlp == "gelu"
    assert [(v.path, tuple(v.shape)) for v in again.weights] == \
        [(v.path, tuple(v.shape)) for v in block.weights]
    assert tuple(block.mlp_dense1.kernel.shape) == (16, 24)


def test_an_unknown_mlp_is_refused_in_one_sentence():
    message = ("Unknown mlp='geglu'; allowed: ('gelu', 'swiglu') ('gelu': Dense, GELU, "
               "Dense; 'swiglu': the gated MLP of DINOv2's ViT-g/14).")
    with pytest.raises(ValueError) as raised:
        layers.TransformerBlock(2, 24, mlp="geglu")
    assert str(raised.value) == message
    with pytest.raises(ValueError, match=re.escape(message)):
        VisionTransformer(**{**TINY, "mlp": "geglu"})


def test_the_official_npz_round_trips_and_says_its_mlp(tmp_path):
    """`save_official_weights` writes the packed kernel under `MlpBlock_3/
    Dense_0` (twice the rows `Dense_1` takes), which `describe` reads back
    as `mlp="swiglu"`."""
    from keras_vit.weights.architecture import architecture_from_checkpoint, describe_architecture
    from keras_vit.weights.official import save_official_weights
    from keras_vit.weights.npz import read_checkpoint

    model = tiny()
    path = save_official_weights(model, tmp_path / "g.npz")
    params = read_checkpoint(path)
    assert params["Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel"].shape == (32, 128)
    assert params["Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel"].shape == (64, 32)
    family, config = architecture_from_checkpoint(params)
    assert (family, config["mlp"], config["mlp_dim"]) == ("vit", "swiglu", 64)
    assert describe_architecture(params) == (
        "a ViT (2 blocks, width 32, 2 heads, SwiGLU MLP 64, patch 14) with a 5-class head")
    back = keras_vit.model_from_checkpoint(path, classifier_activation=None)
    assert back.get_layer("encoderblock_0").mlp == "swiglu"
    x = photos(28)
    np.testing.assert_array_equal(predict(back, x), predict(model, x))


@pytest.mark.backends
def test_the_memory_estimate_counts_the_swiglu_mlp():
    """6 T M values per block instead of the GELU MLP's 3 T M
    (keras_vit.training.memory)."""
    from keras_vit.training import memory

    def per_image(mlp):
        model = VisionTransformer(**{**TINY, "mlp": mlp, "classes": 3})
        return memory.estimate_training_memory(model, 1).per_image

    activations = {"jax": 1.15, "torch": 1.1}.get(keras.backend.backend(), 1.0)
    tokens = 1 + 2 * 2
    assert per_image("swiglu") - per_image("gelu") == pytest.approx(
        2 * activations * 4 * (6 - 3) * tokens * 64, abs=1)


def test_heads_are_what_the_timm_name_builds():
    """A Hub config.json names the architecture only: its heads are the
    name's (timm builds DINOv2-g with 24, vit_base_patch16_gap_224 with 16),
    not the size's usual count."""
    from keras_vit.weights import timm as timm_format

    assert timm_format.num_heads_of({"architecture": "vit_giant_patch14_dinov2"}, 1536) == 24
    assert timm_format.num_heads_of({"architecture": "vit_base_patch16_gap_224"}, 768) == 16


# --- timm ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def timm_files():
    """tests/test_family_checkpoints' helpers (timm, its folders, forward)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")  # imported before the torchvision stand-in
    import test_family_checkpoints

    return test_family_checkpoints


@pytest.mark.backends
@pytest.mark.parametrize("name, classes", [("vit_giant_patch14_dinov2", 5),
                                           ("vit_giant_patch14_reg4_dinov2", 0)])
def test_timm_dinov2_giant_gives_timms_output(timm_files, tmp_path, name, classes):
    """The logits, or without a head timm's num_classes=0 output (the class
    token after the final norm); fc1 of 2 x 85 rows (int(32 x 5.33334))."""
    model, folder = timm_files.timm_folder(tmp_path, name, 28, classes=classes)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    block = keras_model.get_layer("encoderblock_1")
    assert (block.mlp, block.mlp_dim, block.num_heads) == ("swiglu", 85, 2)
    assert_parity(predict(keras_model, photos(28)), timm_files.timm_forward(model, 28, folder))


def test_timm_configs_that_contradict_the_mlp_are_refused(timm_files, tmp_path):
    """A SwiGLU name over GELU weights is corrupt; a SwiGLU gated by GELU
    (timm's GluMlp with act_layer="gelu") is refused; a named builder names
    the MLP kind among the differences."""
    _, folder = timm_files.timm_folder(tmp_path, "vit_small_patch14_dinov2", 28)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(
        {**config, "architecture": "vit_giant_patch14_dinov2"}))
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            "vit_giant_patch14_dinov2 builds a SwiGLU MLP, but its weights hold a GELU MLP "
            "(blocks.0.mlp.fc1.weight has 128 rows, blocks.0.mlp.fc2.weight takes 128; a "
            "SwiGLU's fc1 has twice the rows its fc2 takes); the file and the weights must "
            "describe the same model.")):
        keras_vit.model_from_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "mlp='gelu' where DINOv2ViTG14 has hidden_size=1536, num_layers=40, "
            "num_heads=24, mlp_dim=4096, mlp='swiglu';")):
        keras_vit.DINOv2ViTG14(weights=str(folder))
    _, folder = timm_files.timm_folder(tmp_path / "geglu", "vit_giant_patch14_dinov2", 28,
                                       act_layer="gelu")
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "vit_giant_patch14_dinov2 has a SwiGLU MLP gated by act_layer='gelu'; keras_vit's "
            "SwiGLU MLP gates with SiLU (timm's SwiGLUPacked), so it is refused.")):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.backends
def test_dinov2s_own_giant_file_gives_dinov2s_output(timm_files, tmp_path, caplog):
    """A `dinov2_vitg14_pretrain.pth` in DINOv2's layout (`mlp.w12`,
    `mlp.w3`, `mask_token`; DINOv2's hidden width (int(4 x 32 x 2/3) + 7)
    // 8 x 8 = 88), checked to be what timm's `checkpoint_filter_fn` reads
    as DINOv2's, gives DINOv2's forward: the class token after the final
    norm."""
    import logging

    import torch
    from timm.models.vision_transformer import checkpoint_filter_fn

    args = dict(depth=2, embed_dim=32, num_heads=2, num_classes=0, mlp_ratio=2 * 88 / 32)
    model = timm_files.randomized(timm_files.timm.create_model(
        "vit_giant_patch14_dinov2", pretrained=False, img_size=28, **args))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    original = {re.sub(r"\.mlp\.fc([12])\.", lambda m: ".mlp.w12." if m[1] == "1"
                       else ".mlp.w3.", k): v for k, v in state.items()}
    original["mask_token"] = torch.zeros(1, 32)
    assert original["blocks.0.mlp.w12.weight"].shape == (176, 32)
    read_by_timm = checkpoint_filter_fn(dict(original), model)
    assert sorted(read_by_timm) == sorted(state)
    for key, value in state.items():
        torch.testing.assert_close(read_by_timm[key], value, rtol=0, atol=0)
    path = tmp_path / "dinov2_vitg14_pretrain.pth"
    torch.save(original, path)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        keras_model = keras_vit.model_from_checkpoint(path, num_heads=2)
    assert "is read as DINO's ViT" in caplog.text
    assert keras_model.get_layer("encoderblock_0").mlp_dim == 88
    x = (photos(28) / 255.0 - np.float32(IMAGENET["image_mean"])) / np.float32(
        IMAGENET["image_std"])
    with torch.no_grad():
        expected = model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    assert_parity(predict(keras_model, photos(28)), expected)


# --- transformers -------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_files():
    """tests/test_family_transformers' helpers (tiny configs, folders, forward)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import test_family_transformers

    return test_family_transformers


@pytest.mark.backends
@pytest.mark.parametrize("cls, config", [("Dinov2Model", "dinov2_config"),
                                         ("Dinov2WithRegistersModel", "dinov2_reg_config")])
def test_transformers_swiglu_dinov2_gives_its_pooler_output(hf_files, tmp_path, cls, config):
    """`use_swiglu_ffn=True` (mlp_ratio 2: a hidden width of (int(64 x 2/3)
    + 7) // 8 x 8 = 48): the saved folder (`weights_in`, `weights_out`),
    and its in-memory state dict (transformers 5's `gate_proj`, `up_proj`,
    `down_proj`) as a bare PyTorch file."""
    import torch

    model = getattr(hf_files.transformers, cls)(getattr(hf_files, config)(use_swiglu_ffn=True))
    model, folder = hf_files.saved(tmp_path, model, "dinov2")
    expected = hf_files.forward(model, 28, folder, "pooler_output")
    keras_model = keras_vit.model_from_checkpoint(folder)
    assert keras_model.get_layer("encoderblock_0").mlp_dim == 48
    assert_parity(predict(keras_model, photos(28)), expected)
    assert "encoder.layer.0.mlp.gate_proj.weight" in model.state_dict()
    torch.save(model.state_dict(), tmp_path / "memory.pth")
    bare = keras_vit.model_from_checkpoint(
        tmp_path / "memory.pth", num_heads=2, include_top=False, pooling="token",
        image_mean=hf_files.MEAN, image_std=hf_files.STD)
    assert_parity(predict(bare, photos(28)), expected)


@pytest.mark.parametrize("values, message", [
    (dict(use_swiglu_ffn=False),
     "says use_swiglu_ffn false, but the weights hold a SwiGLU MLP of width 48 "
     "(encoder.layer.0.mlp.weights_in.weight has 96 rows, mlp.weights_out.weight takes 48)"),
    (dict(mlp_ratio=4),
     "says mlp_ratio 4, but the weights hold a SwiGLU MLP of width 48 "
     "(encoder.layer.0.mlp.weights_in.weight has 96 rows, mlp.weights_out.weight takes 48), "
     "not (int(int(width 32 x mlp_ratio) x 2 / 3) + 7) // 8 x 8"),
], ids=["use_swiglu_ffn", "mlp_ratio"])
def test_transformers_configs_that_contradict_the_swiglu_are_corrupt(
        hf_files, tmp_path, values, message):
    model = hf_files.transformers.Dinov2Model(hf_files.dinov2_config(use_swiglu_ffn=True))
    _, folder = hf_files.saved(tmp_path, model, "dinov2")
    hf_files._edit_config(folder, **values)
    with pytest.raises(CorruptCheckpointError, match=re.escape(message)):
        keras_vit.model_from_checkpoint(folder)


# --- export -------------------------------------------------------------------------

def test_a_swiglu_model_exported_to_timm_gives_timms_logits(timm_files, tmp_path):
    """config.json names vit_giant_patch14_dinov2 (whose code sets
    SwiGLUPacked), model_args the rest: SiLU, mlp_ratio 2 x 64 / 32."""
    from keras_vit.export import to_hub_folder
    from torch_libraries import library_logits

    model = tiny(gelu="erf", **IMAGENET)
    folder = tmp_path / "out"
    report = to_hub_folder(model, folder, library="timm", verbose=False)
    assert report.passed and report.max_abs_diff == 0.0
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "vit_giant_patch14_dinov2"
    assert (config["model_args"]["act_layer"], config["model_args"]["mlp_ratio"]) == ("silu", 4.0)
    x = photos(28)
    assert_parity(library_logits("timm", folder, x, timm_files.timm), predict(model, x))
    back = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    assert back.get_layer("encoderblock_0").mlp == "swiglu"
    np.testing.assert_array_equal(predict(back, x), predict(model, x))


@pytest.mark.parametrize("library, options, message", [
    ("transformers", dict(layer_scale_init=None),
     "its MLP is a SwiGLU (mlp='swiglu'), and keras_vit writes transformers' "
     "ViT with its GELU MLP only (DINOv2's use_swiglu_ffn is not "
     "written)."),
    ("timm", dict(classifier="map"),
     "it has a SwiGLU MLP and an attention-pooling head, whose MLP timm builds with the "
     "blocks' SiLU where keras_vit's computes GELU."),
], ids=["transformers", "timm-map"])
def test_what_the_library_cannot_express_is_refused(tmp_path, library, options, message):
    from keras_vit.export import to_hub_folder

    model = VisionTransformer(**{**TINY, "classes": 5, **options})
    with pytest.raises(ValueError) as raised:
        to_hub_folder(model, tmp_path / "out", library=library, verbose=False)
    assert str(raised.value) == (
        f"{model.name!r} cannot be written as a {library} Hub folder: {message}")


# --- LoRA, quantization, features -----------------------------------------------------

def test_lora_quantization_and_features_take_the_swiglu_blocks(tmp_path):
    """LoRA's "mlp" target adapts the packed Dense (2 x 64 units) and
    merges; int8 quantizes it; features_only gives the blocks' patch maps."""
    from keras_vit.layers.blocks import quantization_modes
    from keras_vit.layers.lora import enable_lora, lora_layers, merge_lora

    x = photos(28)
    model = tiny()
    enable_lora(model, rank=2, targets=("mlp",))
    adapted = lora_layers(model)
    assert [(d.name, tuple(d.kernel.shape)) for d in adapted] == [
        ("mlp_dense1", (32, 128)), ("mlp_dense2", (64, 32))] * 2
    rng = np.random.default_rng(3)
    for layer in adapted:
        layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape) * 0.3)
    merged = merge_lora(model)
    np.testing.assert_allclose(predict(merged, x), predict(model, x), rtol=1e-5, atol=1e-5)

    quantized = tiny(num_layers=1)  # (Keras collects garbage once per quantized Dense)
    float_outputs = predict(quantized, x)
    with warnings.catch_warnings():  # Keras names every layer it has no quantize for
        warnings.simplefilter("ignore", UserWarning)
        quantized.quantize("int8")
    assert quantization_modes(quantized) == {"int8"}
    diff = np.abs(predict(quantized, x) - float_outputs).max()
    assert 0 < diff < 0.1 * np.abs(float_outputs).max()

    features = VisionTransformer(**TINY, features_only=True, out_indices=(0, 1))
    assert [tuple(f.shape) for f in features(x)] == [(2, 2, 2, 32)] * 2
