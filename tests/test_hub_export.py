"""`keras_vit.export.to_hub_folder` and `keras-vit export --format
timm|transformers`: the folders open in timm and transformers themselves
and give keras_vit's logits; the arithmetic, mean/std and class names
travel; models a library would compute differently are refused with the
reason; the folder is verified and put in place atomically.

The models are the committed Hub fixtures (`tests/fixtures/hub`, timm and
transformers arithmetic, exact GELU), an official-format file keras_vit
wrote (`keras_vit_token.npz`: the official tanh GELU) and a hybrid with
timm's stem arithmetic."""

import importlib.util
import json
import os
import pathlib

import numpy as np
import pytest

import keras_vit
from conftest import predict, random_weights, run_cli, tiny_mixer, tiny_vit
from keras_vit import labels
from keras_vit.export import ExportVerificationError, to_hub_folder
from keras_vit.export import hub_folder as hub_folder_module
from keras_vit.weights import hub
from torch_libraries import library_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"
PHOTOS = np.load(HUB / "references.npz")["photos/32"].astype("float32")
SOURCES = {"timm_token": HUB / "timm_vit_token", "timm_gap": HUB / "timm_vit_gap",
           "transformers": HUB / "transformers_vit_classifier",
           "official_tanh": HUB / "keras_vit_token.npz"}


# R+Ti/16's shape (a ResNet stem, no stages) and R26's stages (timm's
# vit_tiny_r_s16_p8_224 and vit_small_r26_s32_224), with a tiny ViT on them.
HYBRIDS = {"timm_hybrid_stem": dict(resnet_layers=(), patch_size=2),
           "timm_hybrid_r26": dict(resnet_layers=(2, 2, 2, 2), patch_size=1)}


@pytest.fixture(scope="module")
def timm():
    """timm (with a torchvision stand-in where torchvision does not import);
    the timm cases are skipped where timm is not installed."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed (.ci/run installs it)")
    from torch_libraries import import_timm

    return import_timm()


def source_model(name):
    if name == "quick_gelu":  # OpenAI CLIP's GELU in a plain ViT: act_layer="quick_gelu"
        return random_weights(tiny_vit(gelu="quick", classifier_activation=None))
    if name in HYBRIDS:  # timm's stem arithmetic, the stages of one of its architectures
        model = tiny_vit(**HYBRIDS[name], resnet_width=1, resnet_arithmetic="timm",
                         gelu="erf", classifier_activation=None)
        rng = np.random.default_rng(0)
        model.set_weights([w + 0.05 * rng.normal(size=w.shape).astype("float32")
                           for w in model.get_weights()])
        return model
    return keras_vit.model_from_checkpoint(SOURCES[name], input_shape=(32, 32, 3),
                                           classifier_activation=None)


@pytest.mark.parametrize("source, library", [
    ("timm_token", "timm"), ("timm_gap", "timm"), ("official_tanh", "timm"),
    ("timm_hybrid_stem", "timm"), ("timm_hybrid_r26", "timm"), ("quick_gelu", "timm"),
    ("transformers", "transformers"), ("timm_token", "transformers"),
    ("official_tanh", "transformers")])
def test_the_library_opens_the_folder_and_gives_keras_vits_logits(tmp_path, request, source,
                                                                   library):
    timm = request.getfixturevalue("timm") if library == "timm" else None
    model = source_model(source)
    folder = tmp_path / "out"
    report = to_hub_folder(model, folder, library=library, verbose=False)
    assert report.passed and report.format == library and report.max_abs_diff == 0.0
    assert sorted(os.listdir(folder)) == sorted(
        ["config.json", "model.safetensors"]
        + (["preprocessor_config.json"] if library == "transformers" else []))
    reference = predict(model, PHOTOS)
    got = library_logits(library, folder, PHOTOS, timm)
    assert np.abs(got - reference).max() <= 1e-4 * max(1.0, np.abs(reference).max())


def test_the_arithmetic_mean_std_and_class_names_travel(tmp_path):
    model = source_model("official_tanh")  # tanh GELU, (0.5, 0.5) normalisation
    labels.set_class_names(model, [f"digit {i}" for i in range(10)])
    to_hub_folder(model, tmp_path / "t", library="transformers", verbose=False)
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    processor = json.loads((tmp_path / "t" / "preprocessor_config.json").read_text())
    assert config["hidden_act"] == "gelu_pytorch_tanh" and config["layer_norm_eps"] == 1e-6
    assert config["id2label"]["3"] == "digit 3" and config["label2id"]["digit 3"] == 3
    assert processor["image_mean"] == [0.5] * 3 and processor["size"] == {
        "height": 32, "width": 32}

    gap = source_model("timm_gap")  # erf GELU, fc_norm, ImageNet mean/std
    labels.set_class_names(gap, [f"c{i}" for i in range(10)])
    to_hub_folder(gap, tmp_path / "g", library="timm", verbose=False)
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["model_args"]["act_layer"] == "gelu" and config["model_args"]["fc_norm"]
    assert config["global_pool"] == "avg" and not config["model_args"]["class_token"]
    np.testing.assert_allclose(config["pretrained_cfg"]["mean"], (0.485, 0.456, 0.406))
    assert config["label_names"][:2] == ["c0", "c1"]
    # read back by keras_vit: the same arithmetic, preprocessing and names
    back = hub.read_hub_checkpoint(tmp_path / "g")
    assert back.arithmetic["fc_norm"] and back.class_names[:2] == ["c0", "c1"]


# a "gap", "token_avg" or distillation-token model, QuickGELU: written as
# transformers' SigLIP, DINOv2, DeiT classes, hidden_act "quick_gelu"; what
# transformers lacks of the #48 families: tests/test_family_export.py
@pytest.mark.parametrize("library, build, message", [
    ("transformers", tiny_mixer, "it is a Mixer, and transformers has no MLP-Mixer"),
    ("timm", lambda: tiny_mixer(gelu="erf"),
     "timm builds each Mixer shape from an architecture of fixed patch size, depth and "
     "width (mixer_s32_224"),
    ("timm", tiny_mixer, "it computes GELU with the tanh approximation"),
    ("timm", lambda: tiny_vit(representation_size=8),
     "it has a pre_logits layer (Dense + tanh, 8 units)"),
    ("timm", lambda: tiny_vit(layer_norm_epsilon=1e-12),
     "its LayerNorm epsilon is 1e-12, and each timm ViT architecture fixes its epsilon in "
     "code (1e-05 or 1e-06), which config.json's model_args cannot change"),
    ("timm", lambda: tiny_mixer(gelu="erf", layer_norm_epsilon=1e-5),
     "its LayerNorm epsilon is 1e-05 and timm's Mixer LayerNorms have 1e-6"),
    ("transformers", lambda: tiny_vit(resnet_layers=(), resnet_width=1, patch_size=2),
     "it is a hybrid, and transformers' ViT has no ResNet stem"),
    ("timm", lambda: tiny_vit(resnet_layers=(), resnet_width=1, patch_size=2),
     "its ResNet stem computes the official arithmetic (kernels standardised as "
     "(w - mean) / (std + 1e-5), GroupNorm epsilon 1e-6) and timm's computes"),
    ("timm", lambda: tiny_vit(resnet_layers=(1,), resnet_width=1, patch_size=1,
                              resnet_arithmetic="timm"),
     "this one has stages (1,) and width 1"),
])
def test_a_model_the_library_computes_differently_is_refused(tmp_path, library, build,
                                                             message):
    with pytest.raises(ValueError, match="cannot be written as a " + library) as error:
        to_hub_folder(build(), tmp_path / "out", library=library, verbose=False)
    assert message in str(error.value)
    assert not os.listdir(tmp_path)  # nothing written, not even a temporary


def test_a_model_of_any_size_is_written_at_its_stored_grid(tmp_path):
    model = random_weights(tiny_vit(input_shape=(None, None, 3), classifier_activation=None))
    report = to_hub_folder(model, tmp_path / "any", library="transformers", verbose=False)
    assert report.passed
    config = json.loads((tmp_path / "any" / "config.json").read_text())
    assert config["image_size"] == 224  # the stored grid: 28x28 patches of 8 (the default)


def test_bad_arguments_are_one_error_before_any_work(tmp_path):
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"library='torch'; allowed: \('timm', "):
        to_hub_folder(model, tmp_path / "out", library="torch")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file; a Hub folder is a directory"):
        to_hub_folder(model, tmp_path / "file")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_text("x")
    with pytest.raises(ValueError, match="is a directory without config.json; an export "
                                         "replaces only an earlier Hub folder"):
        to_hub_folder(model, tmp_path / "photos")
    with pytest.raises(ValueError, match="has no classification head"):
        to_hub_folder(tiny_vit(include_top=False, pooling="token"), tmp_path / "out")
    with pytest.raises(ValueError, match="has no preprocessing layer"):
        to_hub_folder(tiny_vit(include_preprocessing=False), tmp_path / "out")


def test_a_folder_that_misses_its_check_is_rejected_and_an_earlier_one_replaced(
        tmp_path, monkeypatch):
    model = random_weights(tiny_vit(classifier_activation=None))
    folder = tmp_path / "vit"
    to_hub_folder(model, folder, library="transformers", verbose=False)
    first = (folder / "model.safetensors").read_bytes()
    random_weights(model, seed=1)
    to_hub_folder(model, folder, library="transformers", verbose=False)  # replaced
    assert (folder / "model.safetensors").read_bytes() != first

    (folder / "README.md").write_text("my model card")  # never deleted unasked
    with pytest.raises(ValueError, match=r"holds README.md, which replacing the folder would "
                                         r"delete; an export replaces only a Hub folder of"):
        to_hub_folder(model, folder, library="transformers", verbose=False)
    assert (folder / "README.md").read_text() == "my model card"
    (folder / "README.md").unlink()

    runner = hub_folder_module._HubFolderExport.runner
    monkeypatch.setattr(hub_folder_module._HubFolderExport, "runner",
                        lambda self, file: (lambda x: runner(self, file)(x) + 1.0))
    with pytest.raises(ExportVerificationError, match="The transformers export"):
        to_hub_folder(model, tmp_path / "bad", library="transformers", verbose=False)
    assert sorted(os.listdir(tmp_path)) == ["bad.rejected", "bad.rejected.json", "vit"]


def test_the_cli_writes_a_verified_folder_and_refuses_in_one_line(tmp_path):
    path = tmp_path / "vit.keras"
    model = random_weights(tiny_vit())
    labels.set_class_names(model, ["cat", "dog", "bird"])
    model.save(path)
    result = run_cli("export", path, "--format", "transformers", "--out", tmp_path / "hf",
                     "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["passed"] and report["format"] == "transformers"
    assert report["labels"] == str(tmp_path / "hf" / "config.json")
    model = transformers.ViTForImageClassification.from_pretrained(tmp_path / "hf")
    assert model.config.id2label[2] == "bird"

    tiny_mixer().save(tmp_path / "mixer.keras")
    result = run_cli("export", tmp_path / "mixer.keras", "--format", "transformers",
                     "--out", tmp_path / "m")
    assert result.code == 2 and len(result.err_lines) == 1
    assert "cannot be written as a transformers Hub folder: it is a Mixer" in result.err
    result = run_cli("export", path, "--format", "timm", "--quantize", "int8",
                     "--out", tmp_path / "q")
    assert result.code == 2 and "--format timm takes --quantize none" in result.err
