"""BEiT and BEiT v2 (timm's `beit_*`, `beitv2_*`; transformers' `beit`)
and transformers' DINOv3 (`dinov3_vit`), written by the libraries
themselves (tests/rope_families.py: tiny random models, width 64, 2 heads,
2 blocks) and read by keras_vit (#50).

Each folder is opened with `keras_vit.model_from_checkpoint` and compared
with the library's own forward on the two sample photos within 1e-4 x
max(1, |value|), at the trained size and another: BEiT's relative position
tables resized by the library that wrote them (timm's `checkpoint_filter_fn`
on load: geometric-progression offsets; transformers' forward: bilinear),
DINOv3's RoPE computed for the grid of each call (one model of
`input_shape=(None, None, 3)` at two sizes, one of them not square).
"""

import json

import pytest
from safetensors.numpy import load_file, save_file

import keras_vit
from conftest import predict
from family_photos import assert_parity
from test_family_checkpoints import timm_forward
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")  # before the torchvision stand-in
from rope_families import (  # noqa: E402
    SECOND_SIZE,
    TIMM,
    TRANSFORMERS_SIZE,
    WIDTH,
    photos,
    randomized,
    timm_folder,
    timm_outputs,
    transformers_folder,
    transformers_outputs,
)
from torch_libraries import import_timm  # noqa: E402

timm = import_timm()
BEIT_SECOND = SECOND_SIZE["beit"][0]


@pytest.mark.parametrize("name", [  # BEiTv2 (another mean/std) on TensorFlow only
    pytest.param("beit_base_patch16_224", marks=pytest.mark.backends),
    "beitv2_base_patch16_224"])
def test_timm_beit_gives_timms_logits_at_its_size_and_another(name):
    """The head on the patch tokens' mean after fc_norm, q/v biases, layer
    scale, each block's table; at 96 px the tables resized as timm's
    checkpoint filter resizes them (BEiT: mean/std 0.5; BEiT v2: ImageNet's,
    from the folder's pretrained_cfg)."""
    _, folder = timm_folder(name)
    for size in (TIMM[name][0], BEIT_SECOND):
        model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                input_shape=(size, size, 3))
        block = model.get_layer("encoderblock_0")
        assert (block.qkv_bias, block.relative_position_bias) == ("qv", (size // 16,) * 2)
        assert model.get_layer("pool").mode == "avg"
        assert_parity(predict(model, photos(size)), timm_outputs(name, photos(size))["logits"])


@pytest.mark.backends
def test_headless_timm_beit_gives_timms_pooled_output():
    """timm's `num_classes=0` forward: fc_norm of the patch tokens' mean."""
    name = "beitv2_base_patch16_224"
    _, folder = timm_folder(name, classes=0)
    model = keras_vit.model_from_checkpoint(folder)
    size = TIMM[name][0]
    got = predict(model, photos(size))
    assert got.shape == (2, WIDTH)
    assert_parity(got, timm_outputs(name, photos(size), classes=0)["logits"])


@pytest.mark.backends
@pytest.mark.parametrize("kind, output", [("beit", "pooler_output"),
                                          ("beit_classifier", "logits")])
def test_transformers_beit_gives_its_output_at_its_size_and_another(kind, output):
    """BeitModel's pooler_output (pooler.layernorm of the patch tokens'
    mean) and BeitForImageClassification's logits; at 96 px the tables
    resized as transformers' forward resizes them (bilinear)."""
    _, folder = transformers_folder(kind)
    for size in (TRANSFORMERS_SIZE, BEIT_SECOND):
        model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                input_shape=(size, size, 3))
        assert_parity(predict(model, photos(size)),
                      transformers_outputs(kind, photos(size))[output])


@pytest.mark.parametrize("kind", [pytest.param("dinov3_vit", marks=pytest.mark.backends),
                                  "dinov3_vit_gated"])
def test_transformers_dinov3_gives_its_pooler_output_at_any_size(kind):
    """DINOv3ViTModel's pooler_output (the class token after the final norm):
    RoPE of base rope_theta on the patch tokens, 4 registers, q/v biases,
    layer scale, a GELU or gated (SwiGLU) MLP; one keras model of any size,
    at the trained 64 px and at 48 x 80."""
    _, folder = transformers_folder(kind)
    model = keras_vit.model_from_checkpoint(folder, input_shape=(None, None, 3))
    assert model.get_layer("rope").rope == {"variant": "dinov3", "temperature": 100.0}
    assert model.get_layer("encoderblock_0").mlp == ("swiglu" if "gated" in kind else "gelu")
    for size in ((TRANSFORMERS_SIZE, TRANSFORMERS_SIZE), (48, 80)):
        assert_parity(predict(model, photos(*size)),
                      transformers_outputs(kind, photos(*size))["pooler_output"])


def _timm_beit(tmp_path, classes=5, size=32, **extra):
    """`(model, folder)`: a tiny timm BEiT with `extra` model_args."""
    args = dict(depth=2, embed_dim=WIDTH, num_heads=2, img_size=size, num_classes=classes,
                **extra)
    model = randomized(timm.create_model("beit_base_patch16_224", pretrained=False, **args), 1)
    folder = tmp_path / "beit"
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder


def test_timm_beit_options_the_weights_show(tmp_path):
    """global_pool='token' (the final norm, then the class token), an
    absolute position embedding beside the tables (resized as timm resizes
    a ViT's) and scale_mlp's LayerNorm inside the MLP, at 32 and 64 px."""
    model, folder = _timm_beit(tmp_path, global_pool="token", use_abs_pos_emb=True,
                               scale_mlp=True)
    for size in (32, 64):
        keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                      input_shape=(size, size, 3))
        assert keras_model.get_layer("pool").mode == "token"
        assert keras_model.get_layer("encoderblock_0").mlp_layer_norm is not None
        reference = model if size == 32 else timm.create_model(
            f"local-dir:{folder}", pretrained=True, img_size=size).eval()
        assert_parity(predict(keras_model, photos(size)), timm_forward(reference, size, folder))


def test_a_bare_timm_beit_file_is_told_by_its_tables(tmp_path):
    """No config.json: the relative position tables say BEiT (not an Eva,
    whose gamma_1 and q_bias it shares); the heads must be given."""
    model, folder = _timm_beit(tmp_path)
    bare = tmp_path / "beit.safetensors"
    save_file(load_file(folder / "model.safetensors"), bare)
    keras_model = keras_vit.model_from_checkpoint(bare, num_heads=2, classifier_activation=None,
                                                  image_mean=0.5, image_std=0.5)
    assert_parity(predict(keras_model, photos(32)), timm_forward(model, 32, folder))


def test_beits_keras_vit_does_not_build_are_refused_with_the_reason(tmp_path):
    _, folder = _timm_beit(tmp_path, use_shared_rel_pos_bias=True, use_rel_pos_bias=False)
    with pytest.raises(CheckpointMismatchError, match="shared by all blocks"):
        keras_vit.model_from_checkpoint(folder)
    config = transformers.BeitConfig(
        hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        image_size=32, use_shared_relative_position_bias=True)
    transformers.BeitModel(config).save_pretrained(tmp_path / "shared")
    with pytest.raises(CheckpointMismatchError, match="shared by all layers"):
        keras_vit.model_from_checkpoint(tmp_path / "shared")


@pytest.mark.parametrize("extra, match", [
    (dict(use_gated_mlp=True, hidden_act="gelu"), "gated MLP gated by hidden_act='gelu'"),
    (dict(query_bias=False), "attention biases query_bias=False, key_bias=False, "
                             "value_bias=True"),
])
def test_dinov3_models_keras_vit_does_not_build_are_refused(tmp_path, extra, match):
    config = transformers.DINOv3ViTConfig(
        hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        image_size=32, **extra)
    transformers.DINOv3ViTModel(config).save_pretrained(tmp_path / "dinov3")
    with pytest.raises(CheckpointMismatchError, match=match):
        keras_vit.model_from_checkpoint(tmp_path / "dinov3")


def test_a_beit_config_that_contradicts_its_tables_is_corrupt(tmp_path):
    """image_size 96 says 6x6 patches (121 + 3 table rows); the tables hold
    4x4's (52 rows)."""
    _, folder = transformers_folder("beit")
    copy = tmp_path / "beit"
    copy.mkdir()
    for file in folder.iterdir():
        copy.joinpath(file.name).write_bytes(file.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config["image_size"] = 96
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptCheckpointError, match=r"image_size.*52 rows"):
        keras_vit.model_from_checkpoint(copy)


def test_the_architecture_table_is_timms_for_beit():
    """`timm_architectures`' BEiT rows against the installed timm."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tools"))
    from timm_architectures import rows

    from keras_vit.weights.timm_architectures import ARCHITECTURES

    names = ["beit_base_patch16_224", "beitv2_base_patch16_224"]
    built, refused = rows(timm, names)
    assert built == {name: ARCHITECTURES[name] for name in names} and not refused


def test_beit_written_back_to_timm_and_to_transformers_gives_its_logits(tmp_path):
    """`to_hub_folder`: timm's Beit (`beit_base_patch16_224` with model_args:
    q/v biases, tables, layer scale, use_fc_norm) and transformers'
    BeitForImageClassification (`use_mean_pooling`), each opened by its
    library (every key read, none missing) and run on the photos."""
    from torch_libraries import library_logits

    _, folder = timm_folder("beit_base_patch16_224")
    model = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    images = photos(TIMM["beit_base_patch16_224"][0])
    logits = predict(model, images)
    for library in ("timm", "transformers"):
        out = tmp_path / library
        keras_vit.export.to_hub_folder(model, out, library=library, validation_data=images,
                                       verbose=False)
        assert_parity(library_logits(library, out, images, timm=timm), logits)


def test_dinov3_has_no_transformers_classifier_to_be_written_as(tmp_path):
    _, folder = transformers_folder("dinov3_vit")
    model = keras_vit.model_from_checkpoint(folder, classes=3)
    with pytest.raises(ValueError, match="transformers has no image classifier that does"):
        keras_vit.export.to_hub_folder(model, tmp_path / "out", library="transformers",
                                       validation_data=photos(TRANSFORMERS_SIZE))


def test_a_timm_beit_config_that_contradicts_its_weights_is_corrupt(tmp_path):
    _, folder = _timm_beit(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"]["use_abs_pos_emb"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptCheckpointError, match=r"model_args.use_abs_pos_emb=True builds "
                       r"position_embedding=True, but the weights hold no pos_embed"):
        keras_vit.model_from_checkpoint(folder)
