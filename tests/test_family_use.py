"""Everything the ViTs have works on the later families (#48, item 5; #50,
item 4): tiny models of each family's option set (DINOv2, DINOv2 with
registers, OpenAI CLIP, SigLIP, DeiT distilled with its two heads; DINOv3's
and EVA-02's rotary embeddings, BEiT's relative position bias) give feature
maps of the patch tokens only, take LoRA and merge it, quantize and reload (in this process
and in a fresh one, safe mode on), roll attention out from the class token
over the patches only, are counted by the training-memory estimate, and
export verified (SavedModel, TFLite, ONNX, OpenVINO)."""

import json
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from conftest import predict, process_env, random_weights, run_cli
from keras_vit import VisionTransformer, inspect
from keras_vit.layers import AttentionPooling, TransformerBlock
from keras_vit.layers.blocks import quantization_modes
from keras_vit.layers.lora import enable_lora, lora_layers, merge_lora
from keras_vit.models import feature_info
from keras_vit.training import memory

TINY = dict(hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64)
# Each family's options; DINOv2 at patch 14 on a non-square 3x4 grid.
FAMILIES = {
    "dinov2": dict(patch_size=14, layer_scale_init=1e-5, gelu="erf",
                   input_shape=(42, 56, 3)),
    "dinov2_reg": dict(patch_size=14, layer_scale_init=1e-5, num_register_tokens=4,
                       no_embed_class=True, gelu="erf", input_shape=(42, 56, 3)),
    "clip": dict(patch_size=8, pre_norm=True, patch_bias=False, gelu="quick",
                 layer_norm_epsilon=1e-5, input_shape=(32, 32, 3)),
    "siglip": dict(patch_size=8, classifier="map", input_shape=(32, 32, 3)),
    "deit_distilled": dict(patch_size=8, distillation_token=True, input_shape=(32, 32, 3)),
    # #50: rotary embeddings (DINOv3's, EVA-02's) and BEiT's relative position bias
    "dinov3": dict(patch_size=8, rope="dinov3", qkv_bias="none", position_embedding=False,
                   num_register_tokens=4, layer_scale_init=1e-5, classifier="avg",
                   input_shape=(32, 32, 3)),
    "eva02": dict(patch_size=8, rope={"variant": "eva", "ref_grid": (4, 4)}, mlp="swiglu",
                  mlp_norm=True, qkv_bias="qv", classifier="avg", fc_norm=True,
                  input_shape=(32, 32, 3)),
    "beit": dict(patch_size=8, relative_position_bias=True, qkv_bias="qv",
                 position_embedding=False, layer_scale_init=0.1, classifier="avg",
                 fc_norm=True, input_shape=(32, 32, 3)),
}
# Tokens before the patches: class, distillation, registers.
PREFIX = {"dinov2": 1, "dinov2_reg": 5, "clip": 1, "siglip": 0, "deit_distilled": 2,
          "dinov3": 5, "eva02": 1, "beit": 1}
GRID = {"dinov2": (3, 4), "dinov2_reg": (3, 4), "clip": (4, 4), "siglip": (4, 4),
        "deit_distilled": (4, 4), "dinov3": (4, 4), "eva02": (4, 4), "beit": (4, 4)}
NAMES = list(FAMILIES)
# the int8 save-and-reload test (the slowest, 8 s a family on JAX): EVA-02's
# quantized blocks reload in test_a_fresh_process_reloads_each_family_in_safe_mode
INT8_NAMES = [name for name in FAMILIES if name != "eva02"]


def options(family, **overrides):
    kwargs = {**TINY, **FAMILIES[family], **overrides}
    if kwargs.get("include_top", True) and not kwargs.get("features_only"):
        kwargs.setdefault("classes", 3)
        kwargs.setdefault("classifier_activation", None)
    return kwargs


def build(family, **overrides):
    """The family's tiny model, every weight random (seeded)."""
    return random_weights(VisionTransformer(**options(family, **overrides)))


def images(family, n=2, seed=1):
    shape = FAMILIES[family]["input_shape"]
    return np.random.default_rng(seed).uniform(0, 255, (n, *shape)).astype("float32")


def copy_weights(source, target):
    """`target`'s weights from `source`'s of the same path."""
    values = {v.path: v for v in source.weights}
    for variable in target.weights:
        variable.assign(values[variable.path])
    return target


def quantized(family):
    model = build(family)
    with warnings.catch_warnings():  # Keras names every layer it has no quantize for
        warnings.simplefilter("ignore", UserWarning)
        model.quantize("int8")
    return model


# --- features_only ------------------------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("family", NAMES)
def test_feature_maps_are_the_patch_tokens_of_the_blocks(family):
    """The blocks' outputs of the headless model, the class, distillation
    and register tokens left out, on the patch grid (3x4 at patch 14);
    "tokens" is the whole sequence."""
    headless = build(family, include_top=False)
    x = images(family)
    blocks = keras.Model(headless.input, [headless.get_layer(f"encoderblock_{i}").output
                                          for i in (1, 0)])
    sequences = [keras.ops.convert_to_numpy(s) for s in blocks(x)]
    grid, prefix = GRID[family], PREFIX[family]
    assert sequences[0].shape[1] == prefix + grid[0] * grid[1]
    for fmt in ("nhwc", "tokens"):
        features = VisionTransformer(**options(family, features_only=True, out_indices=(1, 0),
                                               feature_format=fmt))
        maps = [keras.ops.convert_to_numpy(m) for m in copy_weights(headless, features)(x)]
        for got, sequence in zip(maps, sequences, strict=True):
            expected = (sequence[:, prefix:].reshape(2, *grid, 32) if fmt == "nhwc"
                        else sequence)
            np.testing.assert_array_equal(got, expected)
    patch = FAMILIES[family]["patch_size"]
    assert [(i["module"], i["num_chs"], i["reduction"]) for i in feature_info(features)] == [
        ("encoderblock_1", 32, patch), ("encoderblock_0", 32, patch)]


@pytest.mark.backends
def test_a_dinov2_backbone_for_any_size_gives_each_size_its_grid():
    model = build("dinov2_reg", features_only=True, out_indices=1, input_shape=(None, None, 3))
    for size, grid in (((28, 70), (2, 5)), ((56, 42), (4, 3))):
        x = np.random.default_rng(0).uniform(0, 255, (1, *size, 3)).astype("float32")
        assert tuple(keras.ops.convert_to_numpy(model(x)).shape) == (1, *grid, 32)


@pytest.mark.backends
def test_timm_dinov2_reg_intermediates_are_the_feature_maps(tmp_path):
    """Parity with timm's own `forward_intermediates` (the blocks' patch
    tokens, prefix tokens split off, NCHW) of a tiny DINOv2 with registers
    that timm wrote."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import torch
    from family_photos import assert_parity, photos
    from test_family_checkpoints import timm_folder

    import keras_vit

    timm_model, folder = timm_folder(tmp_path, "vit_small_patch14_reg4_dinov2", 56)
    features = keras_vit.model_from_checkpoint(folder, features_only=True, out_indices=(0, 1))
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    x = (photos(56) / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"])
    with torch.no_grad():
        reference = timm_model.forward_intermediates(
            torch.from_numpy(x.transpose(0, 3, 1, 2).copy()), indices=[0, 1],
            intermediates_only=True)
    got = [keras.ops.convert_to_numpy(m) for m in features(photos(56))]
    assert got[0].shape == (2, 4, 4, 32)
    for mine, theirs in zip(got, reference, strict=True):
        assert_parity(mine.transpose(0, 3, 1, 2), theirs.numpy())


# --- LoRA ---------------------------------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("family", NAMES)
def test_lora_adapts_the_blocks_and_the_map_head_and_merges(family, tmp_path):
    """Adapters on each block's qkv and attention output and, for SigLIP's
    attention-pooling head (an attention layer), on its query, key_value
    and out; LayerScale, registers, the probe stay frozen; the merged and
    the saved model compute the adapted function."""
    model = build(family)
    x = images(family)
    before = predict(model, x)
    enable_lora(model, rank=2, seed=0)
    trainable = sorted(v.path for v in model.trainable_weights)
    expected = [f"encoderblock_{i}/{layer}/lora_kernel_{ab}" for i in range(2)
                for layer in ("qkv", "attention_output") for ab in "ab"]
    if family == "siglip":
        expected += [f"map_head/{layer}/lora_kernel_{ab}"
                     for layer in ("query", "key_value", "out") for ab in "ab"]
    expected += ["head/bias", "head/kernel"]
    assert trainable == sorted(expected)
    np.testing.assert_allclose(predict(model, x), before, atol=1e-6)  # B starts at zero
    rng = np.random.default_rng(3)
    for layer in lora_layers(model):
        layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape) * 0.3)
    adapted = predict(model, x)
    assert np.abs(adapted - before).max() > 1e-3
    merged = merge_lora(model)
    assert lora_layers(merged) == []
    np.testing.assert_allclose(predict(merged, x), adapted, atol=1e-5)
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(predict(keras.saving.load_model(tmp_path / "m.keras"), x),
                               adapted, atol=1e-5)


def test_lora_targets_name_the_same_roles_in_the_map_head():
    model = build("siglip")
    enable_lora(model, rank=2, targets=("mlp",))
    assert [(layer.name) for layer in lora_layers(model)] == [
        "mlp_dense1", "mlp_dense2", "mlp_dense1", "mlp_dense2", "mlp_dense1", "mlp_dense2"]
    assert all(d.lora_enabled for d in model.get_layer("map_head").dense_layers
               if d.name.startswith("mlp"))


# --- quantization and .keras --------------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("family", INT8_NAMES)
def test_an_int8_model_saves_and_reloads_with_its_outputs(family, tmp_path):
    """SigLIP's attention-pooling head is quantized with the blocks; its
    config keeps its sublayers' quantized policies, so the file reloads (it
    did not: "Layer 'query' expected 2 variables, but received 0")."""
    float_outputs = predict(build(family), images(family))
    model = quantized(family)
    outputs = predict(model, images(family))
    assert 0 < np.abs(outputs - float_outputs).max() < 0.1 * np.abs(float_outputs).max()
    assert quantization_modes(model) == {"int8"}
    if family == "siglip":
        assert {d.quantization_mode for d in model.get_layer("map_head").dense_layers} \
            == {"int8"}
    model.save(tmp_path / "q.keras")
    reloaded = keras.saving.load_model(tmp_path / "q.keras")  # safe_mode on
    assert quantization_modes(reloaded) == {"int8"}
    np.testing.assert_array_equal(predict(reloaded, images(family)), outputs)


def test_a_fresh_process_reloads_each_family_in_safe_mode(tmp_path):
    """Every family's float model and the int8 models of those with new
    quantized layers' configs (SigLIP's map head, DINOv2-reg's blocks with
    LayerScale, EVA-02's with q/v biases and an MLP norm) reload in a
    process that built none of them."""
    expected = {}
    for family in NAMES:
        kinds = [("float", build)] + ([("int8", quantized)] if family in (
            "siglip", "dinov2_reg", "eva02") else [])
        for kind, make in kinds:
            model = make(family)
            name = f"{family}_{kind}"
            model.save(tmp_path / f"{name}.keras")
            np.save(tmp_path / f"{name}_x.npy", images(family))
            expected[name] = predict(model, images(family))
    code = ("import sys, pathlib, numpy as np, keras; import keras_vit\n"
            "folder = pathlib.Path(sys.argv[1])\n"
            "for path in sorted(folder.glob('*.keras')):\n"
            "    m = keras.saving.load_model(path, safe_mode=True)\n"
            "    x = np.load(folder / f'{path.stem}_x.npy')\n"
            "    np.save(folder / f'{path.stem}_out.npy', keras.ops.convert_to_numpy(m(x)))\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True,
                   env=process_env(), capture_output=True, timeout=600)
    for name, outputs in expected.items():
        np.testing.assert_allclose(np.load(tmp_path / f"{name}_out.npy"), outputs,
                                   atol=1e-5, err_msg=name)


# --- attention rollout --------------------------------------------------------------

def force_attention(monkeypatch, prefix):
    """Every block's attention: the first `prefix` tokens attend to the
    first patch only, each patch to itself."""
    original = TransformerBlock._attention

    def make(tokens):
        a = np.eye(tokens, dtype="float32")
        a[:prefix] = 0.0
        a[:prefix, prefix] = 1.0
        return a

    def attention(self, x, training, return_attention_scores=False, rope=None):
        out, weights = original(self, x, training, return_attention_scores=True, rope=rope)
        forced = keras.ops.broadcast_to(keras.ops.convert_to_tensor(make(weights.shape[-1])),
                                        keras.ops.shape(weights))
        return out, forced

    monkeypatch.setattr(TransformerBlock, "_attention", attention)


ROLLOUT_MODELS = {**{family: {} for family in NAMES},
                  "map_registers": dict(num_register_tokens=2)}  # no class token


@pytest.mark.backends
@pytest.mark.parametrize("family", list(ROLLOUT_MODELS))
def test_rollout_reads_the_class_token_and_maps_the_patches_only(family, monkeypatch):
    """Known answer: the prefix tokens attend to the first patch, each
    patch to itself. The class token's rollout over 2 blocks is then 3/4
    on the first patch and 0 elsewhere; without a class token (SigLIP,
    and a "map" model with registers, whose row 0 is a register) the mean
    of the patch tokens' rows: 1/16 on every patch."""
    name = "siglip" if family == "map_registers" else family
    prefix = PREFIX[name] + ROLLOUT_MODELS[family].get("num_register_tokens", 0)
    force_attention(monkeypatch, prefix)
    model = build(name, **ROLLOUT_MODELS[family])
    grid = GRID[name]
    maps = inspect.attention_rollout(model, images(name), upsample=False)
    if name == "siglip":
        expected = np.full(grid, 1 / (grid[0] * grid[1]), "float32")
    else:
        expected = np.zeros(grid, "float32")
        expected[0, 0] = 0.75
    np.testing.assert_allclose(maps, np.broadcast_to(expected, maps.shape), atol=1e-6)
    assert inspect.attention_rollout(model, images(name)).shape == (
        2, *FAMILIES[name]["input_shape"][:2])
    np.testing.assert_allclose(inspect.attention_distance(model, images(name)), 0.0,
                               atol=1e-5)  # patch to patch: each to itself


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="CLI image loading uses tf")
@pytest.mark.parametrize("family", ["dinov2_reg", "siglip"])
def test_cli_explain_draws_a_family_model(family, tmp_path):
    from PIL import Image

    path = tmp_path / "model.keras"
    build(family).save(path)
    Image.fromarray(images(family, n=1)[0].astype("uint8")).save(tmp_path / "photo.png")
    code, out, err = run_cli("explain", tmp_path / "photo.png", "--model", path,
                             "--out", tmp_path / "pictures", "--json")
    assert code == 0, err
    pictures = json.loads(out.strip().splitlines()[-1])["pictures"]
    assert sorted(pictures) == ["attention_distance", "embedding_filters",
                                "position_embedding_similarity", "rollout"]


# --- training memory ----------------------------------------------------------------

ACTIVATIONS, COPIES = {"jax": (1.15, 4.0), "torch": (1.1, 1.5)}.get(
    keras.backend.backend(), (1.0, 1.5))
# LayerScale's T D values per block: fitted to ViT-S/14 at 224 px on each backend
LAYER_SCALE = 7.0 if keras.backend.backend() == "torch" else 0.5
TOKENS, WIDTH, MLP, HEADS = 17, 32, 64, 2  # 32 px in patches of 8, a class token


def _per_image(**kwargs):
    model = VisionTransformer(**{**TINY, "patch_size": 8, "input_shape": (32, 32, 3),
                                 "classes": 3, **kwargs})
    return memory.estimate_training_memory(model, 1).per_image


def _block(tokens):
    return (ACTIVATIONS * 4 * (8 * tokens * WIDTH + 3 * tokens * MLP)
            + 4 * COPIES * HEADS * tokens**2)


@pytest.mark.backends
def test_the_memory_estimate_counts_layer_scale_registers_pre_norm_and_the_map_head():
    """The estimate's own definition (keras_vit.training.memory): LayerScale
    keeps 0.5 T D more per block (torch 7 T D); registers are tokens of every block, of the
    patch encoder, its dropout and the final norm (4 values per output
    value); pre_norm is one more LayerNorm of T D; the attention-pooling
    head keeps its keys and values (2 T D) and 1.5 H T float32 attention
    values, and its output (4 D) as any layer."""
    plain = _per_image()
    assert _per_image(layer_scale_init=1e-5) - plain == pytest.approx(
        2 * ACTIVATIONS * 4 * LAYER_SCALE * TOKENS * WIDTH, abs=1)
    registers = 4
    assert _per_image(num_register_tokens=registers) - plain == pytest.approx(
        2 * (_block(TOKENS + registers) - _block(TOKENS)) + 3 * 4 * 4 * registers * WIDTH,
        abs=1)
    assert _per_image(pre_norm=True) - plain == pytest.approx(4 * 4 * TOKENS * WIDTH, abs=1)
    patches = TOKENS - 1
    assert _per_image(classifier="map") - _per_image(classifier="map", include_top=False) \
        == pytest.approx(ACTIVATIONS * 4 * 2 * patches * WIDTH + 4 * COPIES * HEADS * patches
                         + 4 * 4 * WIDTH + 4 * 4 * 3, abs=1)


@pytest.mark.backends
@pytest.mark.parametrize("family", NAMES)
def test_the_memory_estimates_fixed_part_is_the_models_parameters(family):
    """Gradients and 2 optimizer slots of every parameter: the LayerScale
    gammas, the registers, the distillation token and the map head
    included."""
    model = build(family)
    parameters = model.count_params()
    extra = {"dinov2": 2 * 2 * 32, "dinov2_reg": 4 * 32 + 2 * 2 * 32 - 32,
             "deit_distilled": 2 * 32 + 32 * 3}.get(family)  # + head_dist's kernel
    if extra is not None:  # against the plain ViT of the same shape and head
        plain = VisionTransformer(**{**TINY, **{k: FAMILIES[family][k] for k in (
            "patch_size", "input_shape", "include_top") if k in FAMILIES[family]},
            "classes": 3})
        assert parameters - plain.count_params() == extra
    estimate = memory.estimate_training_memory(model, 1, optimizer_slots=2)
    assert estimate.fixed == memory.RUNTIME_BYTES + 4 * parameters * 3


# --- exports ------------------------------------------------------------------------

def _verified_exports(family, tmp_path):
    """SavedModel, TFLite (with its MediaPipe metadata), ONNX and OpenVINO
    of the family's 5-class model, each verified against Keras."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("export needs the TensorFlow backend")
    from keras_vit import export

    model = build(family, classes=5)
    x = images(family, n=6)
    reports = {
        "saved_model": export.to_saved_model(model, tmp_path / "sm", validation_data=x,
                                             verbose=False),
        "tflite": export.to_tflite(model, tmp_path / "m.tflite", validation_data=x,
                                   latency_repeats=2, verbose=False)}
    metadata = export.read_tflite_metadata(tmp_path / "m.tflite")
    assert metadata["inputs"][0]["shape"][1:3] == list(FAMILIES[family]["input_shape"][:2])
    if _importable("tf2onnx", "onnxruntime"):
        reports["onnx"] = export.to_onnx(model, tmp_path / "m.onnx", validation_data=x,
                                         latency_repeats=2, verbose=False)
    if _importable("openvino"):
        reports["openvino"] = export.to_openvino(model, tmp_path / "m.xml", validation_data=x,
                                                 latency_repeats=2, verbose=False)
    for fmt, report in reports.items():
        assert report.passed and report.max_abs_diff <= 1e-4, fmt
        assert report.top1_agreement == 1.0, fmt
    assert reports["tflite"].builtin_ops_only
    return reports


def _importable(*names):
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in names)


def test_a_dinov2_with_registers_exports_verified(tmp_path):
    _verified_exports("dinov2_reg", tmp_path)


def test_a_siglip_exports_verified(tmp_path):
    _verified_exports("siglip", tmp_path)


def test_the_map_heads_config_keeps_quantized_policies_only_when_quantized():
    """A float head's config is as before (its policy's name)."""
    head = AttentionPooling(num_heads=2, mlp_dim=8)
    head.build((None, 5, 16))
    assert head.get_config()["dtype"] == keras.dtype_policies.serialize(head.dtype_policy)


# --- training from a timm folder ----------------------------------------------------

def test_train_fine_tunes_a_timm_dinov2_with_a_new_head_and_lora(tmp_path):
    """A tiny DINOv2 that timm wrote (no head), opened with a new 3-class
    head and trained one epoch with LoRA by `keras_vit.training.train`: the
    saved model reloads (safe mode on) with the file's LayerScale and
    embeddings (frozen) and a trained head."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from data_helpers import make_folder
    from test_family_checkpoints import timm_folder

    import keras_vit
    from keras_vit.training import train

    _, folder = timm_folder(tmp_path, "vit_small_patch14_dinov2", 28, classes=0)
    make_folder(tmp_path / "data", per_class=4, size=28)
    model = keras_vit.model_from_checkpoint(folder, classes=3, classifier_activation=None)
    start = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights}
    results = train(model, f"folder:{tmp_path / 'data'}", out=tmp_path / "run", epochs=1,
                    batch_size=2, lora_rank=2, verbose=0)
    assert results["status"] == "completed" and results["classes"] == 3
    assert results["lora"] == {"rank": 2, "targets": ["qkv", "attention_output"],
                               "default_targets": True, "layers": 4}
    saved = keras.saving.load_model(results["model"])  # merged, safe mode on
    values = {v.path: keras.ops.convert_to_numpy(v) for v in saved.weights}
    for path in ("encoderblock_1/ls1/gamma", "encoderblock_0/ls2/gamma",
                 "patch_encoder/position_embedding"):
        np.testing.assert_array_equal(values[path], start[path])
    assert np.abs(values["head/kernel"]).max() > 0  # zero at the start
    # the adapters, merged (from the third step on: the head starts at zero)
    assert np.abs(values["encoderblock_0/qkv/kernel"]
                  - start["encoderblock_0/qkv/kernel"]).max() > 0


def test_cli_train_auto_fine_tunes_a_timm_distilled_deit_with_a_new_head(tmp_path):
    """`keras-vit train --model auto --weights FOLDER`: the model the timm
    folder describes (a distilled DeiT, its two heads replaced by a new
    3-class one on both tokens), fine-tuned one epoch with LoRA; the JSON
    line says so and the saved model keeps the distilled head."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from conftest import run_cli
    from data_helpers import make_folder
    from test_family_checkpoints import timm_folder

    _, folder = timm_folder(tmp_path, "deit_tiny_distilled_patch16_224", 32)
    make_folder(tmp_path / "data", per_class=4, size=32)
    code, text, err = run_cli(
        "train", "--model", "auto", "--weights", folder, "--data", f"folder:{tmp_path / 'data'}",
        "--image-size", "32", "--batch-size", "4", "--epochs", "1", "--lora", "2",
        "--out", tmp_path / "run", "--json")
    assert code == 0, err
    results = json.loads(text.strip().splitlines()[-1])
    assert results["status"] == "completed" and results["classes"] == 3
    saved = keras.saving.load_model(results["model"])
    assert saved.get_layer("pool").mode == "token_dist"
    assert tuple(saved.get_layer("head").kernel.shape) == (2 * 32, 3)
    code, _, err = run_cli("train", "--model", "auto", "--data", f"folder:{tmp_path / 'data'}",
                           "--epochs", "1", "--out", tmp_path / "run2")
    assert code != 0 and "--model auto" in err
