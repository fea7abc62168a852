"""The ViTs people load today (#48), written by timm itself and read by
keras_vit: DINOv2 (with and without registers), DeiT, DeiT-III, CLIP
(erf and QuickGELU) and SigLIP (attention pooling, erf and tanh GELU).

Each tiny model is made by `timm.create_model` with its registered name
(so its arithmetic is the name's), given random weights, saved with
`save_for_hf`, opened with `keras_vit.model_from_checkpoint`, and compared
with timm's own forward on the two sample photos within 1e-4 x max(1,
|value|): the classifier's logits, or the pooled output of a model
without a head (timm's `num_classes=0`). DINOv2 is checked at a second
size too, its position embedding resized as timm resizes it on load.
"""

import json

import numpy as np
import pytest

import keras_vit
from conftest import predict
from family_photos import assert_parity, photos
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")  # imported before the torchvision stand-in
from torch_libraries import import_timm  # noqa: E402

timm = import_timm()

WIDTH, HEADS, DEPTH, CLASSES = 32, 2, 2, 5


def randomized(model, seed=0):
    """`model` with every parameter random (LayerScale and norms too, so
    that each one moves the output)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight",
                              "norm_pre.weight", "fc_norm.weight")):
                parameter.copy_(1 + 0.2 * noise)
            elif name.endswith("gamma"):
                parameter.copy_(0.5 * noise)
            else:
                parameter.copy_(0.1 * noise)
    return model.eval()


def timm_folder(tmp_path, name, size, classes=CLASSES, **extra):
    """`(timm model, folder)`: a tiny `name` written by `save_for_hf`."""
    args = dict(depth=DEPTH, embed_dim=WIDTH, num_heads=HEADS, img_size=size,
                num_classes=classes, **extra)
    model = randomized(timm.create_model(name, pretrained=False, **args))
    folder = tmp_path / name
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder


def timm_forward(model, size, folder):
    """timm's output on the photos, normalised with the folder's mean/std."""
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    x = (photos(size) / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"])
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()


# (timm name, image size, builder options the file must give)
FAMILIES = [
    ("vit_small_patch14_dinov2", 56, dict(layer_scale_init=1e-5)),
    ("vit_small_patch14_reg4_dinov2", 56,
     dict(layer_scale_init=1e-5, num_register_tokens=4, no_embed_class=True)),
    ("deit_tiny_patch16_224", 32, {}),
    ("deit3_small_patch16_224", 32, dict(layer_scale_init=1e-6, no_embed_class=True)),
    # the two heads averaged; headless, the two tokens averaged
    ("deit_tiny_distilled_patch16_224", 32, dict(distillation_token=True)),
    ("vit_base_patch16_clip_224", 32, dict(pre_norm=True, patch_bias=False)),
    ("vit_base_patch16_clip_quickgelu_224", 32, dict(pre_norm=True, patch_bias=False)),
    ("vit_base_patch16_siglip_224", 32, dict(classifier="map")),
    ("vit_base_patch32_siglip_256", 64, dict(classifier="map")),
]
IDS = [name for name, _, _ in FAMILIES]


@pytest.mark.backends
@pytest.mark.parametrize("name, size, options", FAMILIES, ids=IDS)
def test_timm_classifiers_give_timms_logits(tmp_path, name, size, options):
    model, folder = timm_folder(tmp_path, name, size)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    for key, value in options.items():
        assert _option(keras_model, key) == value, key
    assert_parity(predict(keras_model, photos(size)), timm_forward(model, size, folder))


@pytest.mark.backends
@pytest.mark.parametrize("name, size, options", FAMILIES, ids=IDS)
def test_headless_timm_models_give_timms_pooled_output(tmp_path, name, size, options):
    """timm's `num_classes=0` forward: the class token after the final
    norm, or the attention-pooled (SigLIP) output."""
    model, folder = timm_folder(tmp_path, name, size, classes=0)
    keras_model = keras_vit.model_from_checkpoint(folder)
    got = predict(keras_model, photos(size))
    assert got.shape == (2, WIDTH)
    assert_parity(got, timm_forward(model, size, folder))


@pytest.mark.backends
@pytest.mark.parametrize("name, size, second", [
    ("vit_small_patch14_dinov2", 56, 84), ("vit_small_patch14_reg4_dinov2", 56, 84),
    ("deit_tiny_distilled_patch16_224", 32, 64)])
def test_a_second_size_resizes_as_timm(tmp_path, name, size, second):
    """At a second size (DINOv2: 84 px, 6x6 patches of 14; the distilled
    DeiT: 64 px, 4x4 patches of 16) the position embedding is resized as
    timm resizes it on load (bicubic, antialias); registers, the class and
    the distillation token are never resized."""
    _, folder = timm_folder(tmp_path, name, size)
    resized = timm.create_model(f"local-dir:{folder}", pretrained=True,
                                img_size=second).eval()
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                  input_shape=(second, second, 3))
    assert_parity(predict(keras_model, photos(second)), timm_forward(resized, second, folder))


def test_distilled_deit_is_one_dense_on_both_tokens_and_writes_back_its_two_heads(tmp_path):
    """DeiT distilled: `head` and `head_dist` averaged are built as one
    Dense on the class and distillation tokens side by side (kernel
    `[W; W_dist] / 2`, bias the mean); written back to timm, timm's own
    forward gives the same logits. With include_top=False the tokens are
    timm's forward_features."""
    model, folder = timm_folder(tmp_path, "deit_tiny_distilled_patch16_224", 32)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    assert keras_model.get_layer("pool").mode == "token_dist"
    assert tuple(keras_model.get_layer("head").kernel.shape) == (2 * WIDTH, CLASSES)
    logits = predict(keras_model, photos(32))
    out = tmp_path / "written"
    keras_vit.export.to_hub_folder(keras_model, out, library="timm")
    reread = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    assert type(reread).__name__ == "VisionTransformerDistilled"
    assert_parity(logits, timm_forward(reread, 32, out))
    tokens = keras_vit.model_from_checkpoint(folder, include_top=False)
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    x = (photos(32) / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"])
    with torch.no_grad():
        expected = model.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
    assert_parity(predict(tokens, photos(32)), expected.numpy())


def test_a_config_that_contradicts_its_weights_is_corrupt(tmp_path):
    """config.json names an architecture with 4 registers; the weights
    hold none: both named."""
    _, folder = timm_folder(tmp_path, "vit_small_patch14_dinov2", 56)
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = "vit_small_patch14_reg4_dinov2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptCheckpointError,
                       match=r"vit_small_patch14_reg4_dinov2 says reg_tokens=4, but its "
                             r"weights hold 0 register tokens \(reg_token\)"):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.parametrize("name, missing", [
    ("vit_base_patch16_224_miil", "attention without a query-key-value bias"),
    ("vit_small_patch16_rope_224", "grid_indexing='xy'"),
])
def test_families_keras_vit_does_not_build_are_refused_naming_what_is_missing(
        tmp_path, name, missing):
    _, folder = timm_folder(tmp_path, "vit_small_patch14_dinov2", 56)
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = name
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointMismatchError, match=f"{name} has .*{missing}"):
        keras_vit.model_from_checkpoint(folder)


def test_the_architecture_table_is_timms():
    """`timm_architectures` against the installed timm, for the names this
    issue covers and a sample of the refused ones."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tools"))
    from timm_architectures import rows

    from keras_vit.weights.timm_architectures import ARCHITECTURES, REFUSED

    names = [name for name, _, _ in FAMILIES] + ["deit_tiny_distilled_patch16_224",
                                                 "vit_base_patch16_224",
                                                 "vit_giant_patch14_dinov2"]
    built, refused = rows(timm, names + ["vit_base_patch16_224_miil"])
    assert built == {name: ARCHITECTURES[name] for name in names}
    assert refused == {"vit_base_patch16_224_miil": REFUSED["vit_base_patch16_224_miil"]}


def _option(model, key):
    """A builder option as the built model has it."""
    encoder = model.get_layer("patch_encoder")
    block = model.get_layer("encoderblock_0")
    return {
        "layer_scale_init": block.layer_scale_init,
        "num_register_tokens": encoder.num_register_tokens,
        "no_embed_class": encoder.no_embed_class,
        "pre_norm": any(layer.name == "pre_norm" for layer in model.layers),
        "patch_bias": encoder.use_bias,
        "distillation_token": encoder.distillation_token,
        "classifier": "map" if any(layer.name == "map_head" for layer in model.layers)
        else "token",
    }[key]


def dinov2_interpolated(posemb, grid):
    """DINOv2's `interpolate_pos_encoding` of a `(1, 1 + M*M, D)` embedding
    (class row first) to `grid` x `grid`: bicubic, `scale_factor=(grid +
    0.1) / M`, no antialias, as facebookresearch/dinov2 calls it."""
    cls, patches = posemb[:, :1], posemb[:, 1:]
    m, dim = int(round(patches.shape[1] ** 0.5)), patches.shape[-1]
    scale = (grid + 0.1) / m
    resized = torch.nn.functional.interpolate(
        patches.reshape(1, m, m, dim).permute(0, 3, 1, 2), scale_factor=(scale, scale),
        mode="bicubic", antialias=False)
    return torch.cat([cls, resized.permute(0, 2, 3, 1).reshape(1, -1, dim)], dim=1)


@pytest.mark.backends
@pytest.mark.parametrize("registers", [False, True], ids=["dinov2", "dinov2_reg4"])
@pytest.mark.parametrize("size", [56, 84])
def test_dinov2_released_files_give_dinov2s_output(tmp_path, registers, size, caplog):
    """A `dinov2_vits14[_reg4]_pretrain.pth` in DINOv2's own layout (its
    `register_tokens`, its class position embedding, its `mask_token`),
    checked to be what timm's `checkpoint_filter_fn` reads as DINOv2's, gives
    DINOv2's forward: the class token after the final norm, at 56 px and at
    84 px (the patch position embedding resized as DINOv2 does)."""
    import logging

    from timm.models.vision_transformer import checkpoint_filter_fn

    name = "vit_small_patch14_reg4_dinov2" if registers else "vit_small_patch14_dinov2"
    args = dict(depth=DEPTH, embed_dim=WIDTH, num_heads=HEADS, num_classes=0)
    model = randomized(timm.create_model(name, pretrained=False, img_size=56, **args))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    original = dict(state, mask_token=torch.zeros(1, WIDTH))
    if registers:  # the inverse of timm's _convert_dinov2
        cls_pos = 0.1 * torch.randn(1, 1, WIDTH, generator=torch.Generator().manual_seed(1))
        original["register_tokens"] = original.pop("reg_token")
        original["cls_token"] = state["cls_token"] - cls_pos
        original["pos_embed"] = torch.cat([cls_pos, state["pos_embed"]], dim=1)
    read_by_timm = checkpoint_filter_fn(dict(original), model)
    assert sorted(read_by_timm) == sorted(state)
    for key, value in state.items():
        torch.testing.assert_close(read_by_timm[key], value, rtol=0, atol=1e-7)
    path = tmp_path / f"dinov2_vits14{'_reg4' if registers else ''}_pretrain.pth"
    torch.save(original, path)

    reference = model
    if size != 56:  # DINOv2 resizes the patch rows of its own embedding, class row kept
        reference = timm.create_model(name, pretrained=False, img_size=size, **args).eval()
        resized = dict(state)
        grid = size // 14
        if registers:
            full = dinov2_interpolated(original["pos_embed"], grid)
            resized["pos_embed"] = full[:, 1:]
        else:
            resized["pos_embed"] = dinov2_interpolated(state["pos_embed"], grid)
        reference.load_state_dict(resized)
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        keras_model = keras_vit.model_from_checkpoint(path, num_heads=HEADS,
                                                      input_shape=(size, size, 3))
    assert "its mask_token (used by DINOv2's training only) is left out" in caplog.text
    got = predict(keras_model, photos(size))
    assert got.shape == (2, WIDTH)
    x = (photos(size) / 255.0 - np.float32([0.485, 0.456, 0.406])) / np.float32(
        [0.229, 0.224, 0.225])
    with torch.no_grad():
        expected = reference(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()
    assert_parity(got, expected)


@pytest.mark.parametrize("name, missing", [
    ("beit_giant_patch14_224", "a BEiT that timm 1.0.31 does not register"),
    ("naflexvit_base_patch16_gap", "a NaFlex ViT: patches of variable count"),
])
def test_other_vit_families_are_refused_naming_what_is_missing(tmp_path, name, missing):
    from keras_vit.errors import UnsupportedCheckpointError

    _, folder = timm_folder(tmp_path, "vit_small_patch14_dinov2", 56)
    config = json.loads((folder / "config.json").read_text())
    config["architecture"] = name
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpointError,
                       match=rf"says architecture '{name}', which is not one keras_vit builds "
                             rf"\({missing}"):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.backends
def test_attention_pooling_leaves_registers_out_as_timm(tmp_path):
    """timm's map head attends over the patch tokens only
    (`pool_include_prefix=False`): a map model with registers
    (`vit_so150m_patch16_reg4_map_256`'s arithmetic) gives timm's logits."""
    model, folder = timm_folder(tmp_path, "vit_so150m_patch16_reg4_map_256", 32, mlp_ratio=2.0)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    assert keras_model.get_layer("map_head").num_prefix_tokens == 4
    assert_parity(predict(keras_model, photos(32)), timm_forward(model, 32, folder))
