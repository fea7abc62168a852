"""`keras-vit explain` names the class (#49): each rollout picture says the
predicted class and its probability, and `--class NAME` draws that
class's relevance (`keras_vit.inspect.class_relevance`, Chefer et al.'s
gradient-weighted rollout), checked against the same rule computed with
timm's own forward and PyTorch's autograd."""

import json

import keras
import numpy as np
import pytest

import keras_vit
from conftest import random_weights, run_cli, tiny_vit
from data_helpers import write_digit_images
from keras_vit import inspect, labels
from keras_vit.inspect import plots

NAMES = ["cat", "dog", "fox"]


def chefer_relevance_with_timm(model, x, index):
    """Chefer et al.'s ViT rule on timm's model: the attention after
    `attn_drop` and its gradient (PyTorch autograd) of each image's class
    output, `R += mean_h(max(grad * A, 0)) @ R`; the class token's row."""
    import torch

    attentions = []
    hooks = []
    for block in model.blocks:
        block.attn.fused_attn = False  # the explicit softmax, where the hook sees it

        def keep(module, inputs, output):
            output.retain_grad()
            attentions.append(output)
        hooks.append(block.attn.attn_drop.register_forward_hook(keep))
    outputs = model(torch.from_numpy(x))
    outputs[torch.arange(len(x)), torch.as_tensor(index)].sum().backward()
    for hook in hooks:
        hook.remove()
    tokens = attentions[0].shape[-1]
    relevance = torch.eye(tokens).expand(len(x), tokens, tokens)
    for attention in attentions:
        relevance = relevance + (attention.grad * attention).clamp(min=0).mean(dim=1) @ relevance
    grid = int(round((tokens - 1) ** 0.5))
    return relevance[:, 0, 1:].reshape(len(x), grid, grid).detach().numpy()


@pytest.mark.backends
def test_class_relevance_is_chefers_rule_on_timms_model(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")  # before the torchvision stand-in
    from family_photos import photos
    from test_family_checkpoints import timm_folder, timm_forward

    model, folder = timm_folder(tmp_path, "vit_tiny_patch16_224", 32)
    ours = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    images = photos(32)
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    x = ((images / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"]))
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    index = [1, 3]
    reference = chefer_relevance_with_timm(model, x, index)
    got = inspect.class_relevance(ours, images, index, upsample=False)
    assert got.shape == reference.shape == (2, 2, 2)
    assert reference.max() > 0 and not np.allclose(reference[0], reference[1])
    np.testing.assert_allclose(got, reference, rtol=2e-3, atol=2e-4 * reference.max())
    # another class, another map (rollout alone is the same for every class)
    other = inspect.class_relevance(ours, images, [0, 0], upsample=False)
    assert not np.allclose(other, got)
    np.testing.assert_allclose(  # the model itself is left as it was
        keras.ops.convert_to_numpy(ours(images, training=False)),
        timm_forward(model, 32, folder), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def named_model(tmp_path_factory):
    """A tiny 3-class ViT with random weights and the class names NAMES,
    saved, and two digit images."""
    root = tmp_path_factory.mktemp("explain")
    model = random_weights(tiny_vit(classes=3, classifier_activation=None))
    labels.set_class_names(model, NAMES)
    model.save(root / "model.keras")
    return {"path": root / "model.keras", "model": model,
            "images": write_digit_images(str(root / "images"), 2)}


def _spy_titles(monkeypatch):
    drawn = []
    plot_rollout = plots.plot_rollout

    def spy(image, attention_map, path, title=None, image_title="image"):
        drawn.append((image_title, title, attention_map))
        return plot_rollout(image, attention_map, path, title, image_title)
    monkeypatch.setattr(plots, "plot_rollout", spy)
    return drawn


def _probabilities(model, paths):
    from PIL import Image

    pixels = np.stack([np.asarray(Image.open(p).convert("RGB"), "float32") for p in paths])
    logits = keras.ops.convert_to_numpy(model(pixels, training=False)).astype("float64")
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return pixels, exp / exp.sum(axis=1, keepdims=True)


def test_each_rollout_picture_names_the_predicted_class(named_model, tmp_path, monkeypatch):
    drawn = _spy_titles(monkeypatch)
    result = run_cli("explain", *named_model["images"], "--model", named_model["path"],
                     "--out", tmp_path, "--json")
    assert result.code == 0, result.err
    predictions = json.loads(result.out)["predictions"]
    _, probs = _probabilities(named_model["model"], named_model["images"])
    for row, p, path, (left, right, _) in zip(predictions, probs, named_model["images"], drawn,
                                              strict=True):
        top = int(np.argmax(p))
        assert row["image"] == path and row["explained"] is None
        assert row["predicted"]["class"] == NAMES[top] and row["predicted"]["index"] == top
        assert row["predicted"]["probability"] == pytest.approx(p[top], abs=1e-5)
        assert left == f"predicted: {NAMES[top]} ({p[top]:.1%})"
        assert right == "attention rollout"


def test_class_draws_that_classs_relevance(named_model, tmp_path, monkeypatch):
    drawn = _spy_titles(monkeypatch)
    result = run_cli("explain", *named_model["images"], "--model", named_model["path"],
                     "--out", tmp_path, "--class", "fox")
    assert result.code == 0, result.err
    pixels, probs = _probabilities(named_model["model"], named_model["images"])
    expected = inspect.class_relevance(named_model["model"], pixels, 2)
    for (left, right, shown), p, want, path in zip(drawn, probs, expected,
                                                    named_model["images"], strict=True):
        assert right == f"relevance of fox ({p[2]:.1%})"
        assert left.startswith("predicted: ")
        np.testing.assert_allclose(shown, want, rtol=1e-4, atol=1e-7)
        assert f"{path}: predicted {left[11:]}; relevance drawn for fox ({p[2]:.1%})" \
            in result.out.splitlines()


def test_an_unknown_class_lists_the_names(named_model, tmp_path):
    result = run_cli("explain", *named_model["images"], "--model", named_model["path"],
                     "--out", tmp_path, "--class", "dgo")
    assert result.code == 2 and result.err_lines == [
        "keras-vit: error: Unknown --class 'dgo' (did you mean 'dog'?); the classes of "
        "'vision_transformer': cat, dog, fox."]
    with pytest.raises(ValueError, match=r"class_name=7; allowed: 0 to 2"):
        plots.classify(named_model["model"], np.zeros((1, 32, 32, 3)), class_name=7)


def test_a_model_without_a_head_has_no_class_to_name(tmp_path):
    headless = tiny_vit(include_top=False, pooling="token")
    images = np.zeros((1, 32, 32, 3), "float32")
    assert plots.classify(headless, images) is None
    written = plots.explain(headless, images, str(tmp_path))
    assert len(written["rollout"]) == 1
    with pytest.raises(ValueError, match="class_name needs a classifier, but"):
        plots.explain(headless, images, str(tmp_path), class_name="dog")
