"""Weights from the Hugging Face Hub: timm and transformers checkpoints
(Hub folders, bare .safetensors, hf:// through huggingface_hub) against
the outputs of the libraries that wrote them.

The fixtures under tests/fixtures/hub are tiny random-weight models saved
by timm and transformers themselves, with their outputs on the two sample
photos; tests/fixtures/hub/make_hub_fixtures.py regenerates them (it needs
PyTorch, timm and transformers; these tests do not).
"""

import http.server
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest

import keras_vit
from conftest import predict, run_cli
from keras_vit.weights import hub, hub_layout, posemb, safetensors
from keras_vit.weights import timm as timm_format
from keras_vit.weights.official import CheckpointMismatchError

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"
REFS = np.load(HUB / "references.npz")

# (fixture, output, size, builder kwargs): every reference output.
CASES = [
    ("timm_vit_token", "logits", 32, {}),
    ("timm_vit_token", "logits", 48, {}),
    ("timm_vit_token", "logits", 24, {}),
    ("timm_vit_gap", "logits", 32, {}),
    ("timm_vit_gap", "logits", 24, {}),
    ("timm_mixer", "logits", 32, {}),
    ("timm_hybrid", "logits", 32, {}),
    ("transformers_vit_classifier", "logits", 32, {}),
    ("transformers_vit_classifier", "logits", 48, {}),
    ("transformers_vit_classifier", "logits", 24, {}),
    ("transformers_vit_model", "pooler", 32, {}),
    ("transformers_vit_model", "pooler", 48, {}),
    ("transformers_vit_model", "sequence", 24, {"pooling": None}),
]


def assert_parity(got, reference, what):
    """max |diff| <= 1e-4 * max(1, largest |reference|)."""
    got = np.asarray(got)
    assert got.shape == reference.shape, what
    diff = float(np.abs(got - reference).max())
    tolerance = 1e-4 * max(1.0, float(np.abs(reference).max()))
    assert diff <= tolerance, f"{what}: max |diff| {diff:.3g} > {tolerance:.3g}"


def photos(size):
    return REFS[f"photos/{size}"].astype("float32")


def from_checkpoint(name, size=32, **kwargs):
    if "pooling" not in kwargs and name != "transformers_vit_model":
        kwargs.setdefault("classifier_activation", None)
    return keras_vit.model_from_checkpoint(str(HUB / name), input_shape=(size, size, 3),
                                           **kwargs)


@pytest.mark.backends
@pytest.mark.parametrize("name,output,size,kwargs", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_parity_with_the_source_library(name, output, size, kwargs):
    """Each checkpoint, loaded from its Hub folder (at its size, or at
    another one with the source's position-embedding resize), reproduces
    the source library's outputs on the two sample photos."""
    model = from_checkpoint(name, size, **kwargs)
    assert_parity(predict(model, photos(size)), REFS[f"{name}/{size}/{output}"],
                  f"{name} {output} at {size}px")


@pytest.mark.backends
@pytest.mark.parametrize("name", ["timm_vit_token", "timm_vit_gap", "timm_mixer",
                                  "transformers_vit_classifier", "transformers_vit_model"])
def test_preprocessing_is_the_sources(name):
    """The model's preprocessing layer computes the source library's input
    (mean/std of the timm pretrained_cfg / preprocessor_config.json)."""
    model = from_checkpoint(name)
    layer = model.get_layer("preprocessing")
    got = keras.ops.convert_to_numpy(layer(photos(32)))
    np.testing.assert_allclose(got, REFS[f"{name}/32/inputs"].transpose(0, 2, 3, 1),
                               atol=2e-6, rtol=0)


@pytest.mark.backends
@pytest.mark.parametrize("name", ["keras_vit_token", "keras_vit_gap"])
def test_timm_reads_the_official_files_keras_vit_writes(tmp_path, name):
    """The reverse direction: an official-format `.npz` written by
    `save_official_weights` (make_keras_vit_npz.py), read by timm's own
    official loader (`_load_weights`, tanh GELU), gives keras_vit's logits;
    saving the loaded model again writes the same arrays."""
    path = HUB / f"{name}.npz"
    model = keras_vit.model_from_checkpoint(str(path), classifier_activation=None)
    reference = REFS[f"{name}/32/logits"]
    assert_parity(predict(model, photos(32)), reference, f"timm _load_weights of {name}.npz")
    # The same arithmetic on both sides: 10x tighter than the parity bound
    # (measured 6e-7), so that exact-erf GELU (2e-4 here) would fail.
    diff = np.abs(predict(model, photos(32)) - reference).max()
    assert diff <= 1e-5 * max(1.0, float(np.abs(reference).max())), diff
    again = keras_vit.save_official_weights(model, tmp_path / "again.npz")
    with np.load(path) as written, np.load(again) as rewritten:
        assert sorted(written) == sorted(rewritten)
        for key in written:
            np.testing.assert_array_equal(written[key], rewritten[key], err_msg=key)


def test_the_arithmetic_is_read_from_the_checkpoint():
    vit = hub.read_hub_checkpoint(HUB / "timm_vit_gap")
    assert vit.format == "timm" and vit.family == "vit"
    assert vit.architecture == dict(patch_size=(8, 8), hidden_size=32, num_layers=2,
                                    num_heads=2, mlp_dim=64, classifier="gap")
    assert vit.arithmetic == dict(gelu="erf", layer_norm_epsilon=1e-6, fc_norm=True)
    assert vit.preprocessing["mean"] == pytest.approx((0.485, 0.456, 0.406))
    hybrid = hub.read_hub_checkpoint(HUB / "timm_hybrid")
    assert hybrid.architecture["resnet_layers"] == (1,)
    assert hybrid.arithmetic["resnet_arithmetic"] == "timm"
    hf = hub.read_hub_checkpoint(HUB / "transformers_vit_classifier")
    assert hf.format == "transformers"
    assert hf.arithmetic == dict(gelu="erf", layer_norm_epsilon=1e-12, fc_norm=False)
    assert hf.class_names == [f"class_{i}" for i in range(10)]


def test_gelu_form_decides_parity():
    """The official tanh GELU does not reproduce timm (so the parity above
    checks the arithmetic, not only the weights)."""
    model = from_checkpoint("timm_vit_token", gelu="tanh")
    reference = REFS["timm_vit_token/32/logits"]
    assert float(np.abs(predict(model, photos(32)) - reference).max()) > \
        1e-4 * max(1.0, float(np.abs(reference).max()))


def test_keras_file_keeps_the_sources_arithmetic(tmp_path):
    """A .keras file of a loaded model keeps GELU form, fc_norm, the stem
    arithmetic and the mean/std: it loads back to the same outputs."""
    for name in ("timm_vit_gap", "timm_hybrid"):
        model = from_checkpoint(name)
        path = tmp_path / f"{name}.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        assert_parity(predict(loaded, photos(32)), REFS[f"{name}/32/logits"], name)
    config = loaded.get_layer("resnet_root").get_config()
    assert (config["standardization"], config["standardization_epsilon"],
            config["group_norm_epsilon"]) == ("variance", 1e-8, 1e-5)


def test_class_names_come_from_the_config():
    model = from_checkpoint("transformers_vit_classifier")
    assert keras_vit.labels.class_names(model) == [f"class_{i}" for i in range(10)]


def test_builder_with_explicit_architecture_and_bare_safetensors():
    """`weights=` of a builder: a Hub folder, and a bare .safetensors file
    (no config.json: the format from the key names, timm's arithmetic;
    the preprocessing from `image_mean`/`image_std`)."""
    arch = dict(patch_size=8, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
                input_shape=(32, 32, 3), classifier_activation=None)
    reference = REFS["timm_vit_token/32/logits"]
    model = keras_vit.VisionTransformer(**arch, weights=str(HUB / "timm_vit_token"))
    assert_parity(predict(model, photos(32)), reference, "folder")
    bare = str(HUB / "timm_vit_token" / "model.safetensors")
    model = keras_vit.VisionTransformer(**arch, weights=bare)
    assert_parity(predict(model, photos(32)), reference, "bare .safetensors")
    bare = str(HUB / "timm_vit_gap" / "model.safetensors")
    model = keras_vit.VisionTransformer(
        **{**arch, "classifier": "gap"}, weights=bare,
        image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
    assert_parity(predict(model, photos(32)), REFS["timm_vit_gap/32/logits"], "gap")


def test_new_head_and_headless():
    model = from_checkpoint("timm_vit_token", classes=3)
    assert model.output_shape == (None, 3)
    model = from_checkpoint("transformers_vit_classifier", include_top=False, pooling="token")
    assert model.output_shape == (None, 32)


# --- tampered checkpoints -----------------------------------------------------


def tampered(tmp_path, name, change):
    from safetensors.numpy import save_file

    folder = tmp_path / name
    shutil.copytree(HUB / name, folder)
    state = safetensors.read_safetensors(folder / "model.safetensors")
    change(state)
    save_file({k: np.ascontiguousarray(v) for k, v in state.items()},
              str(folder / "model.safetensors"))
    return str(folder)


@pytest.mark.parametrize("name,change,kind,key", [
    ("timm_vit_token", lambda s: s.pop("blocks.1.norm1.weight"), "missing",
     "blocks.1.norm1.weight"),
    ("timm_vit_token", lambda s: s.update({"blocks.0.attn.q_norm.weight": np.ones(16, "float32")}),
     "unexpected", "blocks.0.attn.q_norm.weight"),
    ("timm_vit_token", lambda s: s.update({"blocks.1.mlp.fc1.weight": np.ones((60, 32), "float32")}),
     "misshaped", "blocks.1.mlp.fc1.weight"),
    ("timm_mixer", lambda s: s.pop("norm.bias"), "missing", "norm.bias"),
    ("timm_hybrid", lambda s: s.pop("patch_embed.backbone.stages.0.blocks.0.downsample.norm.weight"),
     "missing", "patch_embed.backbone.stages.0.blocks.0.downsample.norm.weight"),
    ("transformers_vit_classifier", lambda s: s.pop("vit.layernorm.weight"), "missing",
     "vit.layernorm.weight"),
    ("transformers_vit_model", lambda s: s.update({"embeddings.mask_token": np.zeros((1, 1, 32), "float32")}),
     "unexpected", "embeddings.mask_token"),
])
def test_tampered_checkpoint_is_refused(tmp_path, name, change, kind, key):
    """No key ignored, nothing left random: a missing, extra or mis-shaped
    key raises CheckpointMismatchError naming it as the checkpoint does."""
    folder = tampered(tmp_path, name, change)
    with pytest.raises(CheckpointMismatchError) as info:
        keras_vit.model_from_checkpoint(folder)
    error = info.value
    found = {"missing": error.missing, "unexpected": error.unexpected,
             "misshaped": error.misshaped}[kind]
    assert any(k == key or k.startswith(key + ":") for k in found), (kind, found)
    assert key in str(error) and f"({hub.timm_format.FORMAT}" in str(error) or \
        "(transformers format)" in str(error)


def test_unsupported_timm_models_are_refused(tmp_path):
    folder = tmp_path / "avg_with_cls"
    shutil.copytree(HUB / "timm_vit_token", folder)
    config = json.loads((folder / "config.json").read_text())
    config["global_pool"] = "avg"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match="class token"):
        keras_vit.model_from_checkpoint(str(folder))
    folder = tmp_path / "hybrid_vit"
    shutil.copytree(HUB / "transformers_vit_classifier", folder)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "vit-hybrid"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match="vit-hybrid"):
        keras_vit.model_from_checkpoint(str(folder))


def _set(key, value):
    """A change to a parsed config.json: `key` ("a.b") set to `value`."""
    def change(config):
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
        return config
    return change


def _drop(key):
    def change(config):
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        del node[leaf]
        return config
    return change


_AGREE = "; the file and the weights must describe the same model."
_BUILT = ("keras_vit builds timm's ViTs (vit_*, deit_*, deit3_*), EVAs (eva02_*, eva_giant_*, "
          "vit_*_dinov3), BEiTs (beit_*, beitv2_*), R+ViT hybrids (vit_*_r26_*, vit_*_r50_*, "
          "vit_*_resnet*) and MLP-Mixers (mixer_*).")

# (fixture, file, change, error class, message after the file's repr): each
# config value keras_vit uses is checked for its type and against the weights.
CRAFTED_CONFIGS = {
    "config_array": ("timm_vit_token", "config.json", lambda c: [1, 2], "Corrupt",
                     " is a JSON array ([1, 2]); expected an object of settings."),
    "config_string": ("timm_vit_token", "config.json", lambda c: "vit", "Corrupt",
                      ' is a JSON string ("vit"); expected an object of settings.'),
    "config_null": ("timm_vit_token", "config.json", lambda c: None, "Corrupt",
                    " is JSON null; expected an object of settings."),
    "model_args_array": ("timm_vit_token", "config.json", _set("model_args", [2]), "Corrupt",
                         ": model_args is [2]; expected a JSON object, or null."),
    "pretrained_cfg_string": ("timm_vit_token", "config.json", _set("pretrained_cfg", "x"),
                              "Corrupt", ': pretrained_cfg is "x"; expected a JSON object, '
                              "or null."),
    "heads_not_dividing_the_width": (
        "timm_vit_token", "config.json", _set("model_args.num_heads", 3), "Corrupt",
        " says model_args.num_heads 3, but the weights hold width 32 (patch_embed.proj."
        "weight has 32 output channels), which 3 heads do not divide" + _AGREE),
    "heads_a_string": ("timm_vit_token", "config.json", _set("model_args.num_heads", "big"),
                       "Corrupt", ': model_args.num_heads is "big"; expected a positive '
                       "whole number, or null."),
    "heads_zero": ("timm_vit_token", "config.json", _set("model_args.num_heads", 0),
                   "Corrupt", ": model_args.num_heads is 0; expected a positive whole "
                   "number, or null."),
    "heads_unknown": (
        "timm_vit_token", "config.json", _drop("model_args.num_heads"), "Mismatch",
        None),  # the message names the folder: checked in the test
    "width_disagrees": (
        "timm_vit_token", "config.json", _set("model_args.embed_dim", 64), "Corrupt",
        " says model_args.embed_dim 64, but the weights hold width 32 (patch_embed.proj."
        "weight has 32 output channels)" + _AGREE),
    "depth_disagrees": (
        "timm_vit_token", "config.json", _set("model_args.depth", 12), "Corrupt",
        " says model_args.depth 12, but the weights hold 2 blocks (blocks.0 to blocks.1)"
        + _AGREE),
    "mlp_ratio_disagrees": (
        "timm_vit_token", "config.json", _set("model_args.mlp_ratio", 4), "Corrupt",
        " says model_args.mlp_ratio 4, but the weights hold an MLP of width 64 (blocks.0."
        "mlp.fc1.weight has 64 rows), not width 32 x mlp_ratio" + _AGREE),
    "mean_a_string": ("timm_vit_token", "config.json", _set("pretrained_cfg.mean", "big"),
                      "Corrupt", ': pretrained_cfg.mean is "big"; expected an array of 3 '
                      "numbers."),
    "mean_a_number": ("timm_vit_token", "config.json", _set("pretrained_cfg.mean", 5),
                      "Corrupt", ": pretrained_cfg.mean is 5; expected an array of 3 "
                      "numbers."),
    "std_zero": ("timm_vit_token", "config.json", _set("pretrained_cfg.std", [0, 0.5, 0.5]),
                 "Corrupt", ": pretrained_cfg.std is [0, 0.5, 0.5]; expected an array of 3 "
                 "positive numbers."),
    "act_layer_array": ("timm_vit_token", "config.json", _set("model_args.act_layer", ["gelu"]),
                        "Corrupt", ': model_args.act_layer is ["gelu"]; expected a string, '
                        "or null."),
    "class_token_a_string": (
        "timm_vit_token", "config.json", _set("model_args.class_token", "no"), "Corrupt",
        ': model_args.class_token is "no"; expected true or false, or null.'),
    "label_names_count": (
        "timm_vit_token", "config.json", _set("label_names", ["cat", "dog"]), "Corrupt",
        " has 2 label_names, but the weights hold a 10-class head (head.weight has 10 "
        "rows)" + _AGREE),
    "num_classes_disagrees": (
        "timm_vit_token", "config.json", _set("num_classes", 1000), "Corrupt",
        " says num_classes 1000, but the weights hold a 10-class head (head.weight has 10 "
        "rows)" + _AGREE),
    "unsupported_architecture": (
        "timm_vit_token", "config.json", _set("architecture", "resnet50"), "Unsupported",
        " says architecture 'resnet50', which is not one keras_vit builds; " + _BUILT),
    "mixer_architecture_on_vit_weights": (
        "timm_vit_token", "config.json", _set("architecture", "mixer_b16_224"), "Corrupt",
        " says architecture 'mixer_b16_224' (an MLP-Mixer) but the weights hold ViT "
        "attention keys (blocks.0.attn.qkv.weight)" + _AGREE),
    "vit_architecture_on_mixer_weights": (
        "timm_mixer", "config.json", _set("architecture", "vit_base_patch16_224"), "Corrupt",
        " says architecture 'vit_base_patch16_224' (a ViT) but the weights hold MLP-Mixer "
        "token-mixing keys (blocks.0.mlp_tokens.fc1.weight)" + _AGREE),
    "hybrid_architecture_on_vit_weights": (
        "timm_vit_token", "config.json", _set("architecture", "vit_base_r50_s16_224"),
        "Corrupt", " says architecture 'vit_base_r50_s16_224' (an R+ViT hybrid) but the "
        "weights hold ViT attention keys (blocks.0.attn.qkv.weight)" + _AGREE),
    "vit_architecture_on_hybrid_weights": (
        "timm_hybrid", "config.json", _set("architecture", "vit_base_patch16_224"), "Corrupt",
        " says architecture 'vit_base_patch16_224' (a ViT) but the weights hold a ResNet "
        "stem (patch_embed.backbone.stem.conv.weight)" + _AGREE),
    "transformers_heads_not_dividing_the_width": (
        "transformers_vit_classifier", "config.json", _set("num_attention_heads", 3),
        "Corrupt", " says num_attention_heads 3, but the weights hold width 32 (embeddings."
        "patch_embeddings.projection.weight has 32 output channels), which 3 heads do not "
        "divide" + _AGREE),
    "transformers_heads_a_string": (
        "transformers_vit_classifier", "config.json", _set("num_attention_heads", "2"),
        "Corrupt", ': num_attention_heads is "2"; expected a positive whole number, or null.'),
    "transformers_epsilon_a_string": (
        "transformers_vit_classifier", "config.json", _set("layer_norm_eps", "big"),
        "Corrupt", ': layer_norm_eps is "big"; expected a positive number.'),
    "transformers_hidden_act_array": (
        "transformers_vit_classifier", "config.json", _set("hidden_act", ["gelu"]), "Corrupt",
        ': hidden_act is ["gelu"]; expected a string.'),
    "transformers_id2label_array": (
        "transformers_vit_classifier", "config.json", _set("id2label", ["cat"]), "Corrupt",
        ': id2label is ["cat"]; expected an object of class indices to names (strings), '
        "or null."),
    "transformers_id2label_count": (
        "transformers_vit_classifier", "config.json", _set("id2label", {"0": "cat"}),
        "Corrupt", " has 1 id2label entries, but the weights hold a 10-class head "
        "(classifier.weight has 10 rows)" + _AGREE),
    "transformers_width_disagrees": (
        "transformers_vit_classifier", "config.json", _set("hidden_size", 64), "Corrupt",
        " says hidden_size 64, but the weights hold width 32 (embeddings.patch_embeddings."
        "projection.weight has 32 output channels)" + _AGREE),
    "transformers_layers_disagree": (
        "transformers_vit_classifier", "config.json", _set("num_hidden_layers", 12),
        "Corrupt", " says num_hidden_layers 12, but the weights hold 2 layers (encoder."
        "layer.0 to encoder.layer.1)" + _AGREE),
    "transformers_architecture_not_a_vit": (
        "transformers_vit_classifier", "config.json", _set("architectures", ["MixerModel"]),
        "Unsupported", " says architectures 'MixerModel', which is not one keras_vit "
        "builds; it loads transformers' ViTModel and ViTForImageClassification "
        "(model_type 'vit')."),
    "preprocessor_array": (
        "transformers_vit_classifier", "preprocessor_config.json", lambda c: [], "Corrupt",
        " is a JSON array ([]); expected an object of settings."),
    "preprocessor_mean_a_string": (
        "transformers_vit_classifier", "preprocessor_config.json", _set("image_mean", "big"),
        "Corrupt", ': image_mean is "big"; expected a number or an array of 3 numbers.'),
    "preprocessor_rescale_zero": (
        "transformers_vit_classifier", "preprocessor_config.json",
        _set("rescale_factor", 0), "Corrupt", ": rescale_factor is 0; expected a positive "
        "number."),
}


@pytest.mark.parametrize("case", sorted(CRAFTED_CONFIGS))
def test_crafted_config_json_is_one_named_error(tmp_path, case):
    """A config.json (or preprocessor_config.json) value of the wrong type,
    or one the weights contradict, is one error naming the file, the key,
    the value and what is allowed (never numpy's or Python's own words)."""
    name, filename, change, kind, message = CRAFTED_CONFIGS[case]
    folder = tmp_path / case
    shutil.copytree(HUB / name, folder)
    path = folder / filename
    path.write_text(json.dumps(change(json.loads(path.read_text()))))
    error = {"Corrupt": keras_vit.weights.CorruptCheckpointError,
             "Unsupported": keras_vit.weights.UnsupportedCheckpointError,
             "Mismatch": CheckpointMismatchError}[kind]
    with pytest.raises(error) as info:
        keras_vit.model_from_checkpoint(str(folder))
    if case == "heads_unknown":
        assert str(info.value) == (
            f"Cannot tell the number of attention heads of {folder} (timm format, width 32, "
            "not a standard width; its config.json has no model_args.num_heads). Add "
            "model_args.num_heads to its config.json, or pass num_heads= to "
            "keras_vit.model_from_checkpoint.")
    else:
        assert str(info.value) == f"{str(path)!r}{message}"


def test_heads_of_hub_configs_without_model_args():
    """The Hub's timm configs name the architecture only."""
    assert timm_format.num_heads_of({"architecture": "vit_base_patch16_224"}, 768) == 12
    assert timm_format.num_heads_of({"architecture": "vit_huge_patch14_224"}, 1280) == 16
    assert timm_format.num_heads_of({"architecture": "vit_small_r26_s32_224"}, 384) == 6
    assert timm_format.num_heads_of({}, 100) is None


def test_truncated_safetensors_is_corrupt(tmp_path):
    path = tmp_path / "model.safetensors"
    data = (HUB / "timm_mixer" / "model.safetensors").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(keras_vit.weights.CorruptCheckpointError, match="truncated"):
        safetensors.read_safetensors(path)


# --- position embeddings ----------------------------------------------------------


def test_posemb_resizes_keep_prefix_and_identity():
    pe = np.random.default_rng(0).standard_normal((1, 17, 8)).astype("float32")
    for resize in (posemb.resample_abs_pos_embed_timm,
                   posemb.interpolate_pos_encoding_transformers):
        np.testing.assert_array_equal(resize(pe, (4, 4)), pe)
        out = resize(pe, (3, 5))
        assert out.shape == (1, 16, 8)
        np.testing.assert_array_equal(out[:, :1], pe[:, :1])
    constant = np.ones((1, 16, 2), "float32")
    np.testing.assert_allclose(
        posemb.resample_abs_pos_embed_timm(constant, (3, 3), num_prefix_tokens=0), 1.0,
        rtol=1e-6)


# --- hf:// -------------------------------------------------------------------------


def test_missing_huggingface_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ImportError, match=r"keras-vision-transformer\[hf\]"):
        keras_vit.model_from_checkpoint("hf://timm/some_model")


def test_bad_hub_reference():
    with pytest.raises(ValueError, match="hf://ORG/NAME"):
        hub_layout.parse_uri("hf://just_a_name")


COMMIT = "0123456789abcdef0123456789abcdef01234567"


class _HubHandler(http.server.BaseHTTPRequestHandler):
    """The Hub's file URLs: /{org}/{name}/resolve/{revision}/{filename},
    with the headers huggingface_hub needs (X-Repo-Commit, ETag,
    Content-Length; X-Error-Code on 404)."""

    repos = {}

    def log_message(self, *args):
        pass

    def _serve(self, body_too):
        parts = self.path.split("?")[0].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.end_headers()
            return
        repo, filename = "/".join(parts[:2]), "/".join(parts[4:])
        folder = self.repos.get(repo)
        if folder is None or not (folder / filename).is_file():
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound" if folder is None else "EntryNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = (folder / filename).read_bytes()
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{abs(hash(data)):x}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body_too:
            self.wfile.write(data)

    def do_HEAD(self):  # noqa: N802
        self._serve(False)

    def do_GET(self):  # noqa: N802
        self._serve(True)


_CHILD = """
import sys, numpy as np, keras, keras_vit
refs = np.load(sys.argv[1])
x = refs["photos/32"].astype("float32")
for uri, name in (("hf://test/tiny-timm-vit", "timm_vit_token"),
                  ("hf://google/tiny-vit", "transformers_vit_classifier"),
                  ("hf://test/torch-only-vit", "timm_vit_token")):
    model = keras_vit.model_from_checkpoint(uri, classifier_activation=None)
    ref = refs[name + "/32/logits"]
    diff = float(np.abs(keras.ops.convert_to_numpy(model(x)) - ref).max())
    assert diff <= 1e-4 * max(1, float(np.abs(ref).max())), (uri, diff)
print("OK")
"""


def test_hf_uri_through_a_loopback_hub(tmp_path):
    """hf:// downloads with huggingface_hub from HF_ENDPOINT into its cache
    (HF_HOME); then HF_HUB_OFFLINE=1 loads from the cache alone. A
    repository that holds only `pytorch_model.bin` (written by torch.save)
    loads too."""
    pytest.importorskip("huggingface_hub")
    torch = pytest.importorskip("torch")
    torch_only = tmp_path / "torch_only"
    torch_only.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", torch_only)
    state = safetensors.read_safetensors(HUB / "timm_vit_token" / "model.safetensors")
    torch.save({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
               torch_only / "pytorch_model.bin")
    _HubHandler.repos = {"test/tiny-timm-vit": HUB / "timm_vit_token",
                         "google/tiny-vit": HUB / "transformers_vit_classifier",
                         "test/torch-only-vit": torch_only}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
           "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_DISABLE_XET": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_HUB_CACHE", None)
    run = [sys.executable, "-c", _CHILD, str(HUB / "references.npz")]
    try:
        done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]
    done = subprocess.run(run, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "OK" in done.stdout, done.stderr[-3000:]


def test_normalize_pixels_with_the_sources_mean_std():
    ckpt = hub.read_hub_checkpoint(HUB / "transformers_vit_model")
    got = keras_vit.normalize_pixels(REFS["photos/32"], **{
        k: ckpt.preprocessing[k] for k in ("mean", "std")})
    np.testing.assert_allclose(got, REFS["transformers_vit_model/32/inputs"].transpose(0, 2, 3, 1),
                               atol=2e-6, rtol=0)


def test_cli_predict_with_a_hub_folder(tmp_path):
    """`keras-vit predict --weights FOLDER` (--model auto) reads the
    architecture from config.json; a headless checkpoint says so in one line."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    for i, photo in enumerate(load_sample_images().images):
        Image.fromarray(photo).save(tmp_path / f"photo{i}.png")
    code, out, _ = run_cli("predict", tmp_path, "--weights", HUB / "transformers_vit_classifier",
                           "--top", "10", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["image_size"] == [32, 32]
    model = keras_vit.model_from_checkpoint(str(HUB / "transformers_vit_classifier"))
    from keras_vit.prediction import load_images

    expected = model.predict(load_images([str(tmp_path)], (32, 32)), verbose=0)
    for row, probs in zip(result["predictions"], expected, strict=True):
        got = {t["index"]: t["probability"] for t in row["top"]}
        assert {t["label"] for t in row["top"]} == {f"class_{i}" for i in range(10)}
        np.testing.assert_allclose([got[i] for i in range(10)], probs, atol=1e-5)
    code, _, err = run_cli("predict", tmp_path, "--weights", HUB / "transformers_vit_model")
    assert code == 2
    assert err.count("\n") == 1 and "has no classification head: it outputs features of " \
        "shape (32,)" in err


def test_dynamic_input_shape_is_refused_for_hub_checkpoints():
    """In-graph resizing is the official bilinear one, not timm's or
    transformers' bicubic: a model that takes any size would silently
    compute something else than the source library."""
    for name, how in (("timm_vit_token", "bicubic with antialias"),
                      ("transformers_vit_classifier", "bicubic, align_corners=False")):
        with pytest.raises(ValueError, match=r"input_shape=\(None, None, 3\) \(any size at "
                           rf"call time\).*{name}.*resizes {how}"):
            keras_vit.model_from_checkpoint(str(HUB / name), input_shape=(None, None, 3))


def test_sharded_folder_and_bfloat16_weights(tmp_path):
    """A folder with `model.safetensors.index.json` and shards (as
    `save_pretrained` writes big models) loads like the single file; BF16
    tensors (written here by hand: NumPy has no bfloat16) are read as the
    float32 values they stand for."""
    import struct

    from safetensors.numpy import save_file

    state = safetensors.read_safetensors(HUB / "timm_vit_token" / "model.safetensors")
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", sharded)
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2],
              "model-00002-of-00002.safetensors": keys[1::2]}
    for shard, names in shards.items():
        save_file({k: state[k] for k in names}, str(sharded / shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: s for s, names in shards.items() for k in names}}))
    x = photos(32)
    expected = predict(from_checkpoint("timm_vit_token"), x)
    got = predict(keras_vit.model_from_checkpoint(str(sharded), classifier_activation=None), x)
    np.testing.assert_array_equal(got, expected)

    def write_bf16(path, arrays):
        header, blobs, offset = {}, [], 0
        for key, value in arrays.items():
            bits = (np.ascontiguousarray(value, "<f4").view("<u4") >> 16).astype("<u2")
            blob = bits.tobytes()
            header[key] = {"dtype": "BF16", "shape": list(value.shape),
                           "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))

    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    shutil.copy(HUB / "timm_vit_token" / "config.json", bf16)
    write_bf16(bf16 / "model.safetensors", state)
    read = safetensors.read_safetensors(bf16 / "model.safetensors")
    for key, value in state.items():
        truncated = ((value.astype("<f4").view("<u4") >> 16) << 16).view("<f4")
        np.testing.assert_array_equal(read[key], truncated, err_msg=key)
    model = keras_vit.model_from_checkpoint(str(bf16), classifier_activation=None)
    assert np.abs(predict(model, x) - expected).max() < 0.1
