"""`to_hub_folder` for the families of #48: a tiny keras_vit model of each
(width 32, 2 heads, 2 blocks, random weights) is written as a timm folder,
opened by timm itself (`timm.create_model("local-dir:DIR",
pretrained=True)`), and as a transformers folder, opened by the class its
config.json names (`DeiTForImageClassificationWithTeacher`,
`Dinov2ForImageClassification`, ...); each library's forward on
scikit-learn's two sample photos is keras_vit's within 1e-4 x max(1,
|value|), and `keras_vit.model_from_checkpoint(DIR)` gives the same model
back (the same arrays, arithmetic and normalisation). A timm config.json
names the registered architecture whose code computes what `model_args`
cannot say (the LayerNorm epsilon) and matches the model's other fields.

What timm or transformers cannot express is refused, each in its
sentence."""

import json

import numpy as np
import pytest

import keras_vit
from conftest import predict, random_weights, tiny_vit
from keras_vit.export import to_hub_folder
from keras_vit.export.hub_folder import model_arithmetic, model_normalization
from keras_vit.weights.architecture import architecture_from_checkpoint
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.official import official_arrays
from keras_vit.weights.transformers_export import transformers_class

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")  # imported before the torchvision stand-in
from family_photos import assert_parity, photos  # noqa: E402
from torch_libraries import import_timm, library_logits  # noqa: E402

timm = import_timm()

TINY = dict(hidden_size=32, num_heads=2, num_layers=2, mlp_dim=64, classes=5,
            classifier_activation=None)
CLIP_NORMALIZATION = dict(image_mean=(0.48145466, 0.4578275, 0.40821073),
                          image_std=(0.26862954, 0.26130258, 0.27577711))

# (id, image size, builder options, the architecture config.json names)
FAMILIES = [
    ("dinov2", 56, dict(patch_size=14, layer_scale_init=1e-5), "vit_base_patch14_dinov2"),
    ("dinov2_reg", 56, dict(patch_size=14, layer_scale_init=1e-5, num_register_tokens=4,
                            no_embed_class=True), "vit_base_patch14_reg4_dinov2"),
    ("deit3", 32, dict(patch_size=8, layer_scale_init=1e-6, no_embed_class=True, gelu="erf"),
     "deit3_base_patch16_224"),
    ("clip", 32, dict(patch_size=8, gelu="erf", pre_norm=True, patch_bias=False,
                      layer_norm_epsilon=1e-5, **CLIP_NORMALIZATION),
     "vit_base_patch16_clip_224"),
    ("clip_quickgelu", 32, dict(patch_size=8, gelu="quick", pre_norm=True, patch_bias=False,
                                layer_norm_epsilon=1e-5, **CLIP_NORMALIZATION),
     "vit_base_patch16_clip_quickgelu_224"),
    ("siglip", 32, dict(patch_size=8, classifier="map", gelu="erf"),
     "vit_base_patch16_siglip_224"),
    ("siglip_tanh", 32, dict(patch_size=8, classifier="map", gelu="tanh"),
     "vit_base_patch32_siglip_256"),
    # a CLIP name for its epsilon alone: model_args turn its pre-norm off
    # (and so its patch bias on)
    ("epsilon_1e-5", 32, dict(patch_size=8, gelu="erf", layer_norm_epsilon=1e-5),
     "vit_base_patch16_clip_224"),
    ("gap_registers", 32, dict(patch_size=8, classifier="gap", num_register_tokens=2,
                               gelu="erf"), "vit_base_patch16_gap_224"),
    ("map_layer_scale", 32, dict(patch_size=8, classifier="map", gelu="erf",
                                 layer_scale_init=1e-5), "vit_base_patch16_siglip_224"),
    # the map head pools the patch tokens, registers left out, as timm's
    ("map_registers", 32, dict(patch_size=8, classifier="map", gelu="erf",
                               num_register_tokens=2), "vit_base_patch16_siglip_224"),
]


def family_model(size, options, seed=0):
    model = keras_vit.VisionTransformer(**TINY, **options, input_shape=(size, size, 3))
    return random_weights(model, seed=seed)


def same_model(model, back):
    """`back` is `model`: the same official arrays, builder arguments,
    arithmetic and input normalisation."""
    ours, theirs = official_arrays(model), official_arrays(back)
    assert sorted(ours) == sorted(theirs)
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)
    assert architecture_from_checkpoint(theirs) == architecture_from_checkpoint(ours)
    assert model_arithmetic(back) == model_arithmetic(model)
    np.testing.assert_allclose(model_normalization(back), model_normalization(model),
                               rtol=1e-6)


@pytest.mark.parametrize("size, options, name", [f[1:] for f in FAMILIES],
                         ids=[f[0] for f in FAMILIES])
def test_timm_opens_the_folder_and_gives_keras_vits_logits(tmp_path, size, options, name):
    model = family_model(size, options)
    folder = tmp_path / "out"
    report = to_hub_folder(model, folder, library="timm", verbose=False)
    assert report.passed and report.max_abs_diff == 0.0
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == name
    x = photos(size)
    reference = predict(model, x)
    assert_parity(library_logits("timm", folder, x, timm), reference)
    back = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    same_model(model, back)
    assert np.array_equal(predict(back, x), reference)


def test_the_options_travel_in_model_args(tmp_path):
    """DINOv2 with 2 registers (no registered name has 2): LayerScale's
    initial value, the registers and no_embed_class are written, not left
    to the name's code."""
    model = family_model(56, dict(patch_size=14, layer_scale_init=1e-4, num_register_tokens=2,
                                  no_embed_class=True))
    to_hub_folder(model, tmp_path / "reg2", library="timm", verbose=False)
    config = json.loads((tmp_path / "reg2" / "config.json").read_text())
    args = config["model_args"]
    assert (args["init_values"], args["reg_tokens"], args["no_embed_class"],
            args["pre_norm"], args["class_token"], args["global_pool"]) == (
        1e-4, 2, True, False, True, "token")
    back = keras_vit.model_from_checkpoint(tmp_path / "reg2", classifier_activation=None)
    assert back.get_layer("encoderblock_0").layer_scale_init == 1e-4
    assert_parity(library_logits("timm", tmp_path / "reg2", photos(56), timm),
                  predict(model, photos(56)))


def deit_class_token_head(size, options):
    """A distillation-token model whose head reads the class token alone
    (as transformers' DeiTForImageClassification): built from the arrays
    of a distilled one, its `head` the class token's half."""
    params = official_arrays(family_model(size, options))
    params["head/kernel"] = params["head/kernel"][:TINY["hidden_size"]] * 2
    del params["head_dist/kernel"], params["head_dist/bias"]
    checkpoint = Checkpoint(source="deit", params=params,
                            arithmetic=dict(gelu=options["gelu"]))
    return keras_vit.model_from_checkpoint(checkpoint, classifier_activation=None)


# (id, image size, builder options, the class config.json names); the
# DeiT, DINOv2 and SigLIP ones are transformers' own, not its ViT
TRANSFORMERS_CLASSES = [
    ("vit_quickgelu", 32, dict(patch_size=8, gelu="quick"), "ViTForImageClassification"),
    # DeiT's distilled head: each head its half of the kernel, doubled, and the mean bias
    ("deit_distilled", 32, dict(patch_size=8, distillation_token=True, gelu="erf",
                                layer_norm_epsilon=1e-12),
     "DeiTForImageClassificationWithTeacher"),
    ("deit_class_token_head", 32, dict(patch_size=8, distillation_token=True, gelu="erf"),
     "DeiTForImageClassification"),
    ("dinov2", 28, dict(patch_size=14, classifier="token_avg", layer_scale_init=1e-5,
                        gelu="erf", **CLIP_NORMALIZATION), "Dinov2ForImageClassification"),
    # the class position embedding, folded into keras_vit's class token, is a zero row
    ("dinov2_registers", 28, dict(patch_size=14, classifier="token_avg",
                                  layer_scale_init=1e-5, num_register_tokens=4,
                                  no_embed_class=True, gelu="erf"),
     "Dinov2WithRegistersForImageClassification"),
    ("siglip_gap", 32, dict(patch_size=8, classifier="gap", gelu="tanh"),
     "SiglipForImageClassification"),
]


@pytest.mark.parametrize("size, options, name", [c[1:] for c in TRANSFORMERS_CLASSES],
                         ids=[c[0] for c in TRANSFORMERS_CLASSES])
def test_transformers_opens_the_folder_and_gives_keras_vits_logits(tmp_path, size, options,
                                                                   name):
    build = deit_class_token_head if name == "DeiTForImageClassification" else family_model
    model = build(size, options)
    folder = tmp_path / "out"
    report = to_hub_folder(model, folder, library="transformers", verbose=False)
    assert report.passed and report.max_abs_diff == 0.0
    assert json.loads((folder / "config.json").read_text())["architectures"] == [name]
    x = photos(size)
    reference = predict(model, x)
    assert_parity(library_logits("transformers", folder, x), reference)
    back = keras_vit.model_from_checkpoint(folder, classifier_activation=None)
    same_model(model, back)
    assert np.array_equal(predict(back, x), reference)


def _distilled():
    return tiny_vit(distillation_token=True)


@pytest.mark.parametrize("library, build, message", [
    ("timm", lambda: tiny_vit(distillation_token=True, num_register_tokens=2),
     "it has a distillation token and 2 register tokens, and timm's distilled DeiT "
     "(VisionTransformerDistilled) has no registers."),
    ("timm", lambda: tiny_vit(patch_bias=False),
     "its patch embedding has no bias (patch_bias=False) with pre_norm=False, and timm's "
     "VisionTransformer gives its patch embedding a bias exactly when it has no pre-norm "
     "(PatchEmbed(bias=not pre_norm))."),
    ("timm", lambda: tiny_vit(pre_norm=True),
     "its patch embedding has a bias (patch_bias=True) with pre_norm=True, and timm's "
     "VisionTransformer gives its patch embedding a bias exactly when it has no pre-norm "
     "(PatchEmbed(bias=not pre_norm))."),
    ("timm", lambda: tiny_vit(layer_norm_epsilon=1e-12, layer_scale_init=1e-5),
     "its LayerNorm epsilon is 1e-12, and each timm ViT architecture fixes its epsilon in "
     "code (1e-05 or 1e-06), which config.json's model_args cannot change."),
    ("timm", lambda: tiny_vit(resnet_layers=(), resnet_width=1, patch_size=2,
                              resnet_arithmetic="timm", num_register_tokens=1),
     "it is a hybrid built with num_register_tokens, and keras_vit writes timm hybrids as "
     "the official ones only, without the options of the later families."),
    ("timm", lambda: tiny_vit(include_top=False, pooling="token"),
     "it has no classification head (include_top=False), and the folder is verified as a "
     "classifier; give it one with classes=N and fine-tune it."),
    ("timm", lambda: deit_class_token_head(32, dict(patch_size=8, distillation_token=True,
                                                    gelu="erf")),
     "its head reads the class token alone (transformers' DeiTForImageClassification), and "
     "timm's distilled DeiT averages a head on each of the class and distillation tokens."),
    ("transformers", lambda: tiny_vit(layer_scale_init=1e-5),
     "it scales each block's residual branches (LayerScale, layer_scale_init) and "
     "classifies the class token alone (classifier='token'), and transformers' ViT has no "
     "LayerScale while its DINOv2 classifies the class token beside the patch tokens' mean "
     "(classifier='token_avg')."),
    ("transformers", lambda: tiny_vit(num_register_tokens=4),
     "it has 4 register tokens (num_register_tokens), and transformers' ViT has no "
     "registers."),
    ("transformers", lambda: tiny_vit(distillation_token=True, num_register_tokens=2),
     "it has 2 register tokens (num_register_tokens), and transformers' DeiT has no "
     "registers."),
    ("transformers", lambda: tiny_vit(no_embed_class=True),
     "its class token has no position embedding (no_embed_class=True), and transformers' "
     "ViT adds one to the class token."),
    ("transformers", lambda: tiny_vit(pre_norm=True, patch_bias=False),
     "it normalises its embeddings before the blocks (pre_norm=True, CLIP's), and "
     "transformers' CLIPForImageClassification averages the patch tokens beside a class "
     "token without the final LayerNorm, which no keras_vit classifier computes, while its "
     "ViT has no pre-norm."),
    ("transformers", lambda: tiny_vit(patch_bias=False),
     "its patch embedding has no bias (patch_bias=False), and transformers' ViT's patch "
     "embedding has one."),
    ("transformers", lambda: tiny_vit(classifier="map"),
     "it pools with SigLIP's attention-pooling head (classifier='map'), and transformers "
     "has no classifier on that head (SiglipForImageClassification averages the tokens: "
     "classifier='gap')."),
    ("transformers", lambda: tiny_vit(classifier="token_avg"),
     "it has no LayerScale (layer_scale_init=None), and transformers' "
     "Dinov2ForImageClassification scales each block's residual branches."),
    ("transformers", lambda: tiny_vit(classifier="token_avg", layer_scale_init=1e-5,
                                      no_embed_class=True),
     "its class token has no position embedding (no_embed_class=True), and transformers' "
     "Dinov2ForImageClassification adds one to the class token."),
    ("transformers", lambda: tiny_vit(classifier="token_avg", layer_scale_init=1e-5,
                                      num_register_tokens=4),
     "its register tokens have position embeddings (no_embed_class=False), and "
     "transformers' Dinov2WithRegistersForImageClassification adds none to its registers."),
    ("transformers", lambda: tiny_vit(classifier="gap", fc_norm=True),
     "it normalises the pooled vector (fc_norm=True), and transformers' "
     "SiglipForImageClassification pools the tokens after its final LayerNorm."),
], ids=["timm-distillation", "timm-patch-bias", "timm-pre-norm-bias",
        "timm-epsilon",
        "timm-hybrid", "timm-headless", "timm-deit-class-token-head",
        "transformers-layer-scale-token",
        "transformers-registers", "transformers-deit-registers",
        "transformers-no-embed-class", "transformers-clip", "transformers-patch-bias",
        "transformers-map", "transformers-dinov2-no-layer-scale",
        "transformers-dinov2-no-embed-class", "transformers-dinov2-register-posemb",
        "transformers-siglip-fc-norm"])
def test_what_the_library_cannot_express_is_refused_in_one_sentence(tmp_path, library, build,
                                                                    message):
    model = build()
    with pytest.raises(ValueError) as error:
        # outputs named: a model without a head reaches the library's refusal
        to_hub_folder(model, tmp_path / "out", library=library, outputs="logits",
                      verbose=False)
    assert str(error.value) == (
        f"{model.name!r} cannot be written as a {library} Hub folder: {message}")
    assert not list(tmp_path.iterdir())  # nothing written, not even a temporary


def test_dinov2_and_siglip_are_written_square():
    """transformers' DINOv2 resizes a non-square input's position
    embeddings as a square grid, and SigLIP's config holds one image and
    patch side: both refuse another shape. Asked of the class choice
    itself: `to_hub_folder` reads the grid off the position embeddings,
    which refuse a non-square one before it."""
    arch = dict(patch_size=(8, 8), hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64,
                classifier="gap")
    with pytest.raises(ValueError) as error:
        transformers_class(arch, dict(gelu="erf", fc_norm=False), (32, 40))
    assert str(error.value) == (
        "it takes 32x40 images in 8x8 patches, and transformers' "
        "SiglipForImageClassification computes square images of square patches only")
    assert transformers_class(arch, dict(gelu="erf", fc_norm=False), (32, 32)) == \
        "SiglipForImageClassification"
