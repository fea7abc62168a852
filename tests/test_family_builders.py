"""The named builders of the Hub families (#48): DINOv2 (with registers),
DeiT, DeiT-III, CLIP and SigLIP (`keras_vit.models.families`, rows of
`keras_vit.variants.HUB_VARIANTS`).

- Each builds without weights at its native size with the options of its
  row, and has the parameter count of timm's model of the same
  architecture (1000-class head, native size; timm's built on the meta
  device). The GFLOPs of docs/models.md are counted by torch's
  `FlopCounterMode` on that timm model, and the page's table is the one
  rendered here.
- `weights=` through a named builder: a timm folder of the full DeiT-Ti/16
  and DINOv2-S/14-reg architectures (at a 2x2 grid) loads and gives timm's
  output; a config.json's arithmetic wins over the family's, a bare file
  gets the family's.
- The refusals, each one sentence: a registered name, a URL, an official
  `.npz`, a checkpoint of another architecture, an unknown argument.
"""

import json
import re

import keras
import numpy as np
import pytest

import keras_vit
from conftest import predict, run_cli
from keras_vit.errors import CheckpointMismatchError
from keras_vit.variants import ALL_VARIANTS, HUB_VARIANTS, VIT_VARIANTS, find_variant
from keras_vit.weights import registry
from official_fixtures import REPO_ROOT, Fixture

FUNCTIONS = [v.function for v in HUB_VARIANTS.values()]
BY_FUNCTION = {v.function: v for v in HUB_VARIANTS.values()}

# With a 1000-class head at the native size: keras_vit's count_params, equal
# to timm's sum(p.numel()) (test_counts_are_timms).
PARAMS = {
    "DINOv2ViTS14": 22_441_192, "DINOv2ViTB14": 87_348_712, "DINOv2ViTL14": 305_392_616,
    "DINOv2ViTG14": 1_138_016_232,
    "DINOv2ViTS14Reg": 22_442_344, "DINOv2ViTB14Reg": 87_351_016,
    "DINOv2ViTL14Reg": 305_395_688, "DINOv2ViTG14Reg": 1_138_020_840,
    "DeiTTi16": 5_717_416, "DeiTS16": 22_050_664, "DeiTB16": 86_567_656,
    "DeiTTi16Distilled": 5_910_800, "DeiTS16Distilled": 22_436_432,
    "DeiTB16Distilled": 87_338_192,
    "DeiT3S16": 22_059_496, "DeiT3B16": 86_585_320, "DeiT3L16": 304_374_760,
    "CLIPViTB32": 88_225_000, "CLIPViTB16": 86_568_424, "CLIPViTL14": 304_204_776,
    "SigLIPViTB16": 93_653_224, "SigLIPViTL16": 316_981_224, "SigLIPSo400m14": 428_833_704,
    "DINOv3ViTS16": 21_971_944, "DINOv3ViTSPlus16": 29_068_264, "DINOv3ViTB16": 86_410_216,
    "DINOv3ViTL16": 304_104_424, "DINOv3ViTHPlus16": 841_790_440,
    "EVA02Ti14": 5_756_584, "EVA02S14": 22_129_000, "EVA02B14": 87_117_544,
    "EVA02L14": 305_080_232,
    "BEiTB16": 86_530_984, "BEiTL16": 304_430_568, "BEiTv2B16": 86_530_984,
    "BEiTv2L16": 304_430_568,
}
# Forward GFLOPs of one image at the native size (2 per multiply-add of the
# matrix products, attention's included), as torch's FlopCounterMode counts
# them on timm's model.
GFLOPS = {
    "DINOv2ViTS14": 93.4, "DINOv2ViTB14": 303.1, "DINOv2ViTL14": 1013.6,
    "DINOv2ViTG14": 3566.7,
    "DINOv2ViTS14Reg": 93.8, "DINOv2ViTB14Reg": 304.2, "DINOv2ViTL14Reg": 1017.1,
    "DINOv2ViTG14Reg": 3578.4,
    "DeiTTi16": 2.5, "DeiTS16": 9.2, "DeiTB16": 35.1,
    "DeiTTi16Distilled": 2.5, "DeiTS16Distilled": 9.2, "DeiTB16Distilled": 35.3,
    "DeiT3S16": 9.2, "DeiT3B16": 35.1, "DeiT3L16": 123.1,
    "CLIPViTB32": 8.8, "CLIPViTB16": 35.1, "CLIPViTL14": 162.0,
    "SigLIPViTB16": 35.4, "SigLIPViTL16": 162.6, "SigLIPSo400m14": 220.4,
    "DINOv3ViTS16": 12.5, "DINOv3ViTSPlus16": 16.2, "DINOv3ViTB16": 47.2,
    "DINOv3ViTL16": 164.7, "DINOv3ViTHPlus16": 449.6,
    "EVA02Ti14": 9.3, "EVA02S14": 30.9, "EVA02B14": 213.8, "EVA02L14": 723.5,
    "BEiTB16": 35.1, "BEiTL16": 123.1, "BEiTv2B16": 35.1, "BEiTv2L16": 123.1,
}
# Where timm's architecture of the same weights computes another GELU than
# the original model: timm's vit_*_clip_224 (the .openai weights) use erf,
# OpenAI's CLIP QuickGELU; timm's SigLIP (v1 .webli) erf, big_vision's flax
# nn.gelu the tanh form.
TIMM_GELU = {"clip": "erf", "siglip": "erf"}


def timm_name(variant):
    """timm's architecture name of the variant's first (timm) repository."""
    return variant.hub[0].split("/", 1)[1].split(".")[0]


@pytest.fixture(scope="module")
def timm():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")  # imported before the torchvision stand-in
    from torch_libraries import import_timm

    return import_timm()


@pytest.fixture(scope="module")
def timm_files(timm):
    """test_family_checkpoints' helpers (timm's folders, forward, photos)."""
    import test_family_checkpoints

    return test_family_checkpoints


# --- the table ---------------------------------------------------------------------------

def test_the_table_and_its_derived_lists():
    assert len(HUB_VARIANTS) == 36 and len(ALL_VARIANTS) == 56
    assert set(FUNCTIONS) == set(PARAMS) <= set(keras_vit.__all__)
    for function in FUNCTIONS:
        variant = BY_FUNCTION[function]
        assert keras_vit.models.builder(function).__name__ == function
        assert getattr(keras_vit, function) is keras_vit.models.builder(function)
        # no official .npz, so no registered name
        assert registry.available_weights(variant) == []
        assert registry.families_for(variant) == {} and registry.imagenet_choice(variant) is None
        assert variant.release != "official" and variant.module == "families"
    # the official table is what it was: a DeiT-B/16 has ViT-B/16's shapes, and
    # VisionTransformer still finds the official variant (never a Hub one)
    deit = BY_FUNCTION["DeiTB16"].config
    shape = {k: deit[k] for k in ("patch_size", "hidden_size", "num_layers", "num_heads",
                                  "mlp_dim")}
    assert find_variant("vit", shape) is VIT_VARIANTS["B/16"]


@pytest.mark.slow
@pytest.mark.parametrize("function", FUNCTIONS)
def test_each_builder_builds_its_row(function):
    """The whole model, without drawing random values (as test_models'
    parameter counts): native input size, 1000-class head, the row's
    options on the layers."""
    variant = BY_FUNCTION[function]
    config = variant.config
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, function)()
    size = variant.image_size
    assert model.input_shape == (None, size, size, 3) and model.output_shape == (None, 1000)
    # a distilled DeiT's two head biases are one, their mean (the same output)
    assert model.count_params() == PARAMS[function] - 1000 * bool(
        config.get("distillation_token"))
    assert model.name == variant.official_name.lower().replace("-", "_")
    encoder = model.get_layer("patch_encoder").get_config()
    assert encoder["num_register_tokens"] == config.get("num_register_tokens", 0)
    assert encoder["no_embed_class"] == config.get("no_embed_class", False)
    assert encoder["use_bias"] == config.get("patch_bias", True)
    assert encoder["use_class_token"] == (config.get("classifier", "token") in ("token", "avg"))
    assert encoder.get("use_position_embedding", True) == config.get("position_embedding", True)
    assert encoder["grid_size"] == (size // config["patch_size"],) * 2
    block = model.get_layer(f"encoderblock_{config['num_layers'] - 1}").get_config()
    assert block["layer_scale_init"] == config.get("layer_scale_init")
    assert block["mlp"] == config.get("mlp", "gelu")
    assert (block.get("qkv_bias", "qkv"), block.get("mlp_norm", False), block.get("rope")) == (
        config.get("qkv_bias", "qkv"), config.get("mlp_norm", False),
        (config.get("rope") or {}).get("variant"))
    rope = [layer for layer in model.layers if layer.name == "rope"]
    assert (rope[0].rope if rope else None) == config.get("rope")
    assert ("fc_norm" in {layer.name for layer in model.layers}) == config.get("fc_norm", False)
    assert (block["gelu"], block["layer_norm_epsilon"]) == (
        config["gelu"], config["layer_norm_epsilon"])
    names = {layer.name for layer in model.layers}
    assert ("pre_norm" in names) == config.get("pre_norm", False)
    assert ("map_head" in names) == (config.get("classifier") == "map")
    pre = model.get_layer("preprocessing").get_config()
    mean = np.broadcast_to(np.float64(pre["mean"]), (3,))
    np.testing.assert_allclose(mean, 255 * np.float64(config["image_mean"]))
    np.testing.assert_allclose(np.broadcast_to(np.float64(pre["variance"]), (3,)),
                               (255 * np.float64(config["image_std"])) ** 2)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_counts_are_timms(timm, function):
    """timm's model of the same architecture, 1000-class head, native size:
    its parameter count is keras_vit's, its FLOPs those of the docs; the
    architecture options of timm's name are the row's (its MLP and heads
    too), and its GELU too but where timm differs from the original model
    (`TIMM_GELU`; none with DINOv2-g's SwiGLU MLP)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from keras_vit.weights.timm_architectures import ARCHITECTURES

    variant = BY_FUNCTION[function]
    size = variant.image_size
    with torch.device("meta"):
        model = timm.create_model(timm_name(variant), pretrained=False, num_classes=1000,
                                  img_size=size)
        with FlopCounterMode(display=False) as counter:
            model(torch.empty(1, 3, size, size))
    assert sum(p.numel() for p in model.parameters()) == PARAMS[function]
    assert round(counter.get_total_flops() / 1e9, 1) == GFLOPS[function]
    timm_row, config = ARCHITECTURES[timm_name(variant)], variant.config
    assert (timm_row["mlp"], timm_row["num_heads"]) == (config.get("mlp", "gelu"),
                                                       config["num_heads"])
    if timm_row["mlp"] == "gelu":
        assert timm_row["gelu"] == TIMM_GELU.get(variant.release, config["gelu"])
    assert timm_row["eps"] == config["layer_norm_epsilon"]
    # timm's init values are float32 (BEiT-B's 0.1 reads 0.10000000149)
    scale = config.get("layer_scale_init")
    assert timm_row["layer_scale"] == (scale if scale is None else pytest.approx(scale, rel=1e-7))
    assert (timm_row["reg_tokens"], timm_row["no_embed_class"],
            timm_row["pre_norm"], timm_row["patch_bias"], timm_row["pool"]) == (
        config.get("num_register_tokens", 0),
        config.get("no_embed_class", False), config.get("pre_norm", False),
        config.get("patch_bias", True), config.get("classifier", "token"))
    assert (timm_row.get("rope"), timm_row.get("qkv_bias", "qkv"), timm_row.get("mlp_norm", False),
            timm_row.get("position_embedding", True), timm_row["fc_norm"],
            timm_row.get("relative_position_bias", False)) == (
        config.get("rope"), config.get("qkv_bias", "qkv"), config.get("mlp_norm", False),
        config.get("position_embedding", True), config.get("fc_norm", False),
        config.get("relative_position_bias", False))


def test_timm_repositories_are_timms_pretrained_tags(timm):
    from timm.models import get_pretrained_cfg

    for variant in HUB_VARIANTS.values():
        for repo in variant.hub:
            if repo.startswith("timm/"):
                cfg = get_pretrained_cfg(repo.split("/", 1)[1])
                assert cfg.hf_hub_id == repo and cfg.input_size == (3,) + (
                    variant.image_size,) * 2, repo
                np.testing.assert_allclose(cfg.mean, variant.config["image_mean"])
                np.testing.assert_allclose(cfg.std, variant.config["image_std"])


def _number(value):
    return f"{value:g}".replace("e-0", "e-")  # 1e-05 -> 1e-5


def _options(config):
    out = []
    if config.get("layer_scale_init"):
        out.append(f"LayerScale {_number(config['layer_scale_init'])}")
    if config.get("num_register_tokens"):
        out.append(f"{config['num_register_tokens']} registers")
    if config.get("distillation_token"):
        out.append("distillation token, two heads averaged")
    if config.get("no_embed_class"):
        out.append("no_embed_class")
    if config.get("pre_norm"):
        out.append("pre_norm")
    if config.get("patch_bias") is False:
        out.append("no patch bias")
    if config.get("classifier") == "map":
        out.append("map head, no class token")
    if config.get("mlp") == "swiglu":
        out.append("SwiGLU MLP")
    if config.get("mlp_norm"):
        out.append("LayerNorm in the MLP")
    if config.get("qkv_bias") in ("qv", "none"):
        out.append({"qv": "q/v biases", "none": "no qkv bias"}[config["qkv_bias"]])
    rope = config.get("rope")
    if rope:
        ref = rope.get("ref_grid")
        out.append(f"RoPE {rope['variant']} ({_number(rope['temperature'])}"
                   + (f", ref {ref[0]}x{ref[1]}" if ref else "") + ")")
    if config.get("position_embedding") is False:
        out.append("no position embedding")
    if config.get("relative_position_bias"):
        out.append("relative position bias")
    if config.get("classifier") == "avg":
        out.append("patch tokens' mean" + (", fc_norm" if config.get("fc_norm") else ""))
    return ", ".join(out) or "–"


_MEANS = {(0.485, 0.456, 0.406): "ImageNet", (0.48145466, 0.4578275, 0.40821073): "OpenAI CLIP",
          (0.5, 0.5, 0.5): "0.5"}


def family_table():
    """The table of docs/models.md (between `<!-- variants:hub -->` markers)."""
    lines = ["| function | model | patch | hidden | layers | heads | MLP | options | "
             "GELU, eps, mean/std | size | parameters | GFLOPs | Hub repositories |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: "
             "| --- |"]
    for variant in HUB_VARIANTS.values():
        c = variant.config
        lines.append(
            f"| `{variant.function}` | {variant.key} | {c['patch_size']} | {c['hidden_size']} "
            f"| {c['num_layers']} | {c['num_heads']} | {c['mlp_dim']} | {_options(c)} | "
            f"{'SiLU' if c.get('mlp') == 'swiglu' else c['gelu']}, "
            f"{_number(c['layer_norm_epsilon'])}, {_MEANS[c['image_mean']]} | "
            f"{variant.image_size} | {PARAMS[variant.function]:,} | "
            f"{GFLOPS[variant.function]:.1f} | "
            + ", ".join(f"`{repo}`" for repo in variant.hub) + " |")
    return "\n".join(lines)


def test_the_docs_table_is_the_variants_table():
    page = (REPO_ROOT / "docs" / "models.md").read_text()
    block = page.split("<!-- variants:hub -->\n")[1].split("\n<!-- /variants:hub -->")[0]
    assert block == family_table(), "docs/models.md: paste family_table()"


# --- building: options and outputs ------------------------------------------------------

def test_tiny_inputs_features_and_poolings():
    x = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 3)).astype("float32")
    model = keras_vit.DINOv2ViTS14Reg(input_shape=(28, 28, 3), features_only=True,
                                      out_indices=(5, 11))
    maps = [keras.ops.convert_to_numpy(m) for m in model(x)]
    assert [m.shape for m in maps] == [(2, 2, 2, 384)] * 2
    tokens = keras_vit.DINOv2ViTS14Reg(input_shape=(28, 28, 3), include_top=False)
    assert tokens.output_shape == (None, 1 + 4 + 4, 384)  # class, 4 registers, 2x2 patches
    pooled = keras_vit.SigLIPViTB16(input_shape=(32, 32, 3), pooling="map")
    assert pooled.output_shape == (None, 768)  # include_top=None with a pooling: no head
    assert pooled.get_layer("map_head") is not None
    classifier = keras_vit.DeiTTi16(input_shape=(32, 32, 3), classes=3, drop_path_rate=0.1)
    assert classifier.get_layer("encoderblock_11").drop_path_rate == pytest.approx(0.1)
    assert predict(classifier, np.zeros((2, 32, 32, 3), "float32")).shape == (2, 3)


# --- weights= ---------------------------------------------------------------------------

def test_a_keras_weights_file_round_trips(tmp_path):
    """A `.weights.h5` describes no architecture (no check before it
    loads): it loads into the builder that wrote it."""
    x = np.random.default_rng(1).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    model = keras_vit.DeiT3S16(input_shape=(32, 32, 3), pooling="token")
    path = tmp_path / "deit3.weights.h5"
    model.save_weights(path)
    again = keras_vit.DeiT3S16(weights=str(path), input_shape=(32, 32, 3), pooling="token")
    np.testing.assert_array_equal(predict(again, x), predict(model, x))


def _full_timm_folder(timm, timm_files, tmp_path, name, size, classes, **extra):
    """A timm folder of the full architecture `name` at `size` pixels."""
    args = dict(img_size=size, num_classes=classes, **extra)
    model = timm_files.randomized(timm.create_model(name, pretrained=False, **args))
    folder = tmp_path / name
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder


@pytest.mark.backends
def test_a_matching_timm_folder_loads_exactly(timm, timm_files, tmp_path):
    """DeiT-Ti/16 with its head (timm's logits), DINOv2-S/14 with registers
    without one (include_top=None: timm's num_classes=0 output, the class
    token after the final norm); the folders' size is the default input."""
    model, folder = _full_timm_folder(timm, timm_files, tmp_path, "deit_tiny_patch16_224",
                                      32, 5)
    keras_model = keras_vit.DeiTTi16(weights=str(folder), classifier_activation=None)
    assert keras_model.input_shape == (None, 32, 32, 3) and keras_model.output_shape == (None, 5)
    timm_files.assert_parity(predict(keras_model, timm_files.photos(32)),
                             timm_files.timm_forward(model, 32, folder))
    model, folder = _full_timm_folder(timm, timm_files, tmp_path,
                                      "vit_small_patch14_reg4_dinov2", 28, 0)
    keras_model = keras_vit.DINOv2ViTS14Reg(weights=str(folder))
    assert keras_model.output_shape == (None, 384)
    timm_files.assert_parity(predict(keras_model, timm_files.photos(28)),
                             timm_files.timm_forward(model, 28, folder))


def test_the_checkpoints_arithmetic_wins_and_a_bare_file_gets_the_familys(
        timm, timm_files, tmp_path):
    """A folder whose config.json says tanh GELU and mean/std 0.5 computes
    those (the library's forward); the same weights as a bare safetensors
    file say nothing, so DeiT's erf GELU and ImageNet mean/std apply."""
    from safetensors.torch import save_file

    model, folder = _full_timm_folder(timm, timm_files, tmp_path, "deit_tiny_patch16_224",
                                      32, 5, act_layer="gelu_tanh")
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"].update(mean=[0.5] * 3, std=[0.5] * 3)
    (folder / "config.json").write_text(json.dumps(config))
    keras_model = keras_vit.DeiTTi16(weights=str(folder), classifier_activation=None)
    assert keras_model.get_layer("encoderblock_0").gelu == "tanh"
    timm_files.assert_parity(predict(keras_model, timm_files.photos(32)),
                             timm_files.timm_forward(model, 32, folder))

    model, folder = _full_timm_folder(timm, timm_files, tmp_path / "erf",
                                      "deit_tiny_patch16_224", 32, 5)
    bare = tmp_path / "deit_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(bare))
    keras_model = keras_vit.DeiTTi16(weights=str(bare), classifier_activation=None)
    assert keras_model.get_layer("encoderblock_0").gelu == "erf"
    timm_files.assert_parity(predict(keras_model, timm_files.photos(32)),
                             timm_files.timm_forward(model, 32, folder))  # ImageNet mean/std
    # an argument given wins over both
    quick = keras_vit.DeiTTi16(weights=str(bare), gelu="quick", image_mean=0.5)
    assert quick.get_layer("encoderblock_0").gelu == "quick"
    assert quick.get_layer("preprocessing").get_config()["mean"] == [127.5] * 3


def test_another_architecture_is_refused_in_one_sentence(timm_files, tmp_path):
    _, folder = timm_files.timm_folder(tmp_path, "vit_small_patch14_dinov2", 28)
    with pytest.raises(CheckpointMismatchError) as raised:
        keras_vit.DINOv2ViTS14Reg(weights=str(folder))
    assert str(raised.value) == (
        f"Checkpoint {folder} does not fit DINOv2ViTS14Reg (DINOv2-ViT-S_14-reg): it has "
        "hidden_size=32, num_layers=2, num_heads=2, mlp_dim=128, num_register_tokens=0, "
        "no_embed_class=False where DINOv2ViTS14Reg has hidden_size=384, num_layers=12, "
        "num_heads=6, mlp_dim=1536, num_register_tokens=4, no_embed_class=True; "
        f"keras_vit.model_from_checkpoint('{folder}') builds the model it holds.")
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "it has patch_size=14, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=128, "
            "classifier='token', LayerScale where SigLIPViTB16 has patch_size=16, "
            "hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072, classifier='map', "
            "no LayerScale;")):
        keras_vit.SigLIPViTB16(weights=str(folder))


HUB_HINT = ("pass weights='hf://timm/vit_small_patch14_dinov2.lvd142m' (or "
            "hf://facebook/dinov2-small), a local Hub folder, a .safetensors or PyTorch file, "
            "a Keras .weights.h5 file, or None for random weights.")


def test_registered_names_urls_and_official_npz_are_refused():
    with pytest.raises(ValueError) as raised:
        keras_vit.DINOv2ViTS14(weights="imagenet")
    assert str(raised.value) == (
        "DINOv2ViTS14 has no registered weights (weights='imagenet'): DINOv2-ViT-S_14 "
        "checkpoints are on the Hugging Face Hub; " + HUB_HINT)
    url = "https://storage.googleapis.com/vit_models/imagenet21k/ViT-S_16.npz"
    with pytest.raises(ValueError) as raised:
        keras_vit.DINOv2ViTS14(weights=url)
    assert str(raised.value) == (
        f"weights={url!r} downloads an official .npz (the format of "
        "google-research/vision_transformer), which holds no DINOv2-ViT-S_14; " + HUB_HINT)
    npz = Fixture("vit_tiny_token").checkpoint
    with pytest.raises(CheckpointMismatchError) as raised:
        keras_vit.DeiTTi16(weights=npz)
    assert str(raised.value).startswith(
        f"{npz} is an official .npz (google-research/vision_transformer's format, computed "
        "with the official ViT's arithmetic), not a DeiT-Ti_16 checkpoint: build the model "
        f"it holds with keras_vit.model_from_checkpoint({npz!r}), or pass weights="
        "'hf://timm/deit_tiny_patch16_224.fb_in1k'")


def test_unknown_arguments_are_refused():
    with pytest.raises(TypeError, match=re.escape(
            "CLIPViTB16() got unexpected keyword arguments ['classifier', 'num_layers']; "
            "allowed besides the keras.applications ones: ['dropout_rate', "
            "'attention_dropout_rate', 'drop_path_rate', 'attention', 'gelu', "
            "'layer_norm_epsilon', 'image_mean', 'image_std'].")):
        keras_vit.CLIPViTB16(num_layers=2, classifier="gap")


def test_command_line_lists_them_and_says_where_their_weights_are():
    code, text, _ = run_cli("models", "--json")
    rows = {row["function"]: row for row in json.loads(text)["models"]}
    assert rows["SigLIPSo400m14"]["hub"] == ["timm/vit_so400m_patch14_siglip_224.webli",
                                             "google/siglip-so400m-patch14-224"]
    assert rows["DINOv2ViTS14"]["image_size"] == 518 and rows["DINOv2ViTS14"]["weights"] == []
    code, text, _ = run_cli("models")
    assert "DINOv2ViTS14Reg  DINOv2-S/14-reg" in text
    code, _, err = run_cli("download", "imagenet", "--model", "DeiTB16", "--print-url")
    assert code == 2 and err.strip().endswith(
        "DeiTB16 has no registered weights: its checkpoints are on the Hugging Face Hub "
        "(timm/deit_base_patch16_224.fb_in1k, facebook/deit-base-patch16-224), which "
        "predict and train download themselves, e.g. --weights "
        "hf://timm/deit_base_patch16_224.fb_in1k.")
