"""The ground truth of the #50 parity tests (tests/rope_families.py) is
what the libraries themselves read: each tiny timm folder opens in timm
(`local-dir:`) with the model's logits, each transformers folder opens in
transformers with no missing, unexpected or mis-shaped key and the same
output, in both file kinds; the outputs have the shapes the docstrings
state at the trained and at the second size."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import rope_families as rf  # noqa: E402

TIMM_NAMES = list(rf.TIMM)
TIMM_FILES = [(name, False) for name in TIMM_NAMES] + [
    ("vit_small_patch16_dinov3", True), ("beit_base_patch16_224", True)]
HF_FILES = [(kind, False) for kind in rf.TRANSFORMERS] + [
    ("dinov3_vit", True), ("beit_classifier", True)]


def _id(case):
    return f"{case[0]}-{'bin' if case[1] else 'safetensors'}"


@pytest.mark.parametrize("name, bin", TIMM_FILES, ids=[_id(c) for c in TIMM_FILES])
def test_each_timm_folder_opens_in_timm(name, bin):
    timm = rf._timm()
    model, folder = rf.timm_folder(name, bin=bin)
    assert {p.name for p in folder.iterdir()} == {
        "config.json", "pytorch_model.bin" if bin else "model.safetensors"}
    back = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    x = rf.timm_pixels(folder, rf.photos(rf.TIMM[name][0]))
    with torch.no_grad():
        np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())


@pytest.mark.parametrize("name", TIMM_NAMES)
def test_timm_outputs_at_two_sizes(name):
    size, _, classes = rf.TIMM[name]
    family = next(f for f in rf.SECOND_SIZE if f in name)
    prefix = 5 if family == "dinov3" else 1
    for h, w in [(size, size), rf.SECOND_SIZE[family]]:
        patch = 14 if family == "eva02" else 16
        out = rf.timm_outputs(name, rf.photos(h, w))
        assert out["features"].shape == (2, prefix + (h // patch) * (w // patch), rf.WIDTH)
        assert out["pre_logits"].shape == (2, rf.WIDTH)
        assert out["logits"].shape == (2, classes or rf.WIDTH)


@pytest.mark.parametrize("kind, bin", HF_FILES, ids=[_id(c) for c in HF_FILES])
def test_each_transformers_folder_opens_in_transformers(kind, bin):
    model, folder = rf.transformers_folder(kind, bin=bin)
    config = json.loads((folder / "config.json").read_text())
    back, info = getattr(transformers, config["architectures"][0]).from_pretrained(
        folder, output_loading_info=True)
    assert not any(info.values()), info
    x = rf.transformers_pixels(folder, rf.photos(48, 80))
    with torch.no_grad():
        got, want = back.eval()(x), model(x)
    for key in ("logits", "pooler_output"):
        if hasattr(want, key):
            np.testing.assert_array_equal(getattr(got, key).numpy(), getattr(want, key).numpy())
            break


def test_transformers_outputs_state_their_shapes():
    for kind, prefix in [("dinov3_vit", 5), ("beit_classifier", 1)]:
        out = rf.transformers_outputs(kind, rf.photos(48, 80))
        assert out["last_hidden_state"].shape == (2, prefix + 15, rf.WIDTH)
        assert out["pooler_output"].shape == (2, rf.WIDTH)
    assert out["logits"].shape == (2, rf.CLASSES)
    assert rf.transformers_outputs("beit", rf.photos(64))["logits"] is None
