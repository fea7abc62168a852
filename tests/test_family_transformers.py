"""The later ViT families as Hugging Face transformers writes them (#48):
DINOv2 (with registers), DeiT, CLIP's and SigLIP's vision towers, read by
keras_vit.

Each tiny model is made by transformers from its config class, given
random weights, saved with `save_pretrained` beside its image processor's
`preprocessor_config.json`, opened with `keras_vit.model_from_checkpoint`,
and compared with transformers' own forward on the two sample photos
within 1e-4 x max(1, |value|): what the class computes (the logits of a
classifier, `pooler_output` of a `*Model` / `*VisionModel`, `image_embeds`
of CLIP's projection). DINOv2 is checked at a second size too, its
position embedding resized as transformers resizes it in the forward.
"""

import json
import logging
import re

import numpy as np
import pytest

import keras_vit
from conftest import predict
from family_photos import assert_parity, photos
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def randomized(model, seed=0):
    """`model` with every parameter random: norm weights 1 + 0.2 N, layer
    scales 0.5 N, position embeddings N, the rest 0.1 N (so that each one
    moves the output, and another resize of the position embeddings would
    show)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if re.search(r"(norm\d?|layernorm|layrnorm)\.weight$", name):
                parameter.copy_(1 + 0.2 * noise)
            elif name.endswith("lambda1"):
                parameter.copy_(0.5 * noise)
            elif "position_embedding" in name:  # large enough that a resize shows
                parameter.copy_(noise)
            else:
                parameter.copy_(0.1 * noise)
    return model.eval()


def dinov2_config(**extra):
    return transformers.Dinov2Config(**TINY, mlp_ratio=2, image_size=28, patch_size=14,
                                     **extra)


def dinov2_reg_config(**extra):
    return transformers.Dinov2WithRegistersConfig(
        **TINY, mlp_ratio=2, image_size=28, patch_size=14, num_register_tokens=4, **extra)


def deit_config(**extra):
    return transformers.DeiTConfig(**TINY, intermediate_size=64, image_size=32,
                                   patch_size=16, **extra)


def clip_config(**extra):
    return transformers.CLIPVisionConfig(**TINY, intermediate_size=64, image_size=32,
                                         patch_size=16, **extra)


def siglip_config(**extra):
    return transformers.SiglipVisionConfig(**TINY, intermediate_size=64, image_size=32,
                                           patch_size=16, **extra)


PROCESSORS = {"dinov2": "BitImageProcessorPil", "deit": "DeiTImageProcessorPil",
              "clip": "CLIPImageProcessorPil", "siglip": "SiglipImageProcessorPil"}


def saved(tmp_path, model, processor, name=None):
    """`(model, folder)`: `model` randomized, written by `save_pretrained`
    with its image processor's `preprocessor_config.json` (ImageNet's
    mean/std)."""
    model = randomized(model)
    folder = tmp_path / (name or type(model).__name__)
    model.save_pretrained(folder)
    getattr(transformers, PROCESSORS[processor])(image_mean=MEAN, image_std=STD) \
        .save_pretrained(folder)
    return model, folder


def pixels(size, folder):
    """The photos as transformers takes them, normalised with the folder's
    preprocessor mean/std."""
    cfg = json.loads((folder / "preprocessor_config.json").read_text())
    x = (photos(size) / 255.0 - np.float32(cfg["image_mean"])) / np.float32(cfg["image_std"])
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


def forward(model, size, folder, output, **kwargs):
    with torch.no_grad():
        return getattr(model(pixels(size, folder), **kwargs), output).numpy()


# (id, model class, config, processor, image size, the output it computes,
#  model_from_checkpoint arguments, builder options the file must give)
CLASSES = [
    ("dinov2", "Dinov2Model", dinov2_config, "dinov2", 28, "pooler_output", {},
     dict(layer_scale_init=1e-5)),
    ("dinov2_with_registers", "Dinov2WithRegistersModel", dinov2_reg_config, "dinov2", 28,
     "pooler_output", {}, dict(num_register_tokens=4, no_embed_class=True)),
    ("deit", "DeiTModel", deit_config, "deit", 32, "pooler_output", {},
     dict(distillation_token=True)),
    ("deit_classifier", "DeiTForImageClassification", lambda: deit_config(num_labels=5),
     "deit", 32, "logits", dict(classifier_activation=None), dict(distillation_token=True)),
    # its two heads averaged (one Dense on the class and distillation tokens)
    ("deit_with_teacher", "DeiTForImageClassificationWithTeacher",
     lambda: deit_config(num_labels=5), "deit", 32, "logits",
     dict(classifier_activation=None), dict(distillation_token=True, head="token_dist")),
    # the head on the class token beside the patch tokens' mean (registers left out)
    ("dinov2_classifier", "Dinov2ForImageClassification", lambda: dinov2_config(num_labels=3),
     "dinov2", 28, "logits", dict(classifier_activation=None), dict(head="token_avg")),
    ("dinov2_reg_classifier", "Dinov2WithRegistersForImageClassification",
     lambda: dinov2_reg_config(num_labels=3), "dinov2", 28, "logits",
     dict(classifier_activation=None), dict(head="token_avg", num_register_tokens=4)),
    ("clip_vision_model", "CLIPVisionModel", clip_config, "clip", 32, "pooler_output", {},
     dict(pre_norm=True, patch_bias=False, gelu="quick", layer_norm_epsilon=1e-5)),
    ("clip_with_projection", "CLIPVisionModelWithProjection",
     lambda: clip_config(projection_dim=24), "clip", 32, "image_embeds", {},
     dict(pre_norm=True, patch_bias=False)),
    ("siglip_vision_model", "SiglipVisionModel", siglip_config, "siglip", 32,
     "pooler_output", {}, dict(classifier="map", gelu="tanh", layer_norm_epsilon=1e-6)),
    # the head on the mean of all tokens after the final LayerNorm (no class token)
    ("siglip_classifier", "SiglipForImageClassification",
     lambda: transformers.SiglipConfig(
         vision_config=siglip_config(vision_use_head=False).to_dict(), num_labels=5),
     "siglip", 32, "logits", dict(classifier_activation=None), dict(head="gap")),
]


@pytest.mark.backends
@pytest.mark.parametrize("case", CLASSES, ids=[c[0] for c in CLASSES])
def test_transformers_classes_give_what_the_class_computes(tmp_path, case):
    _, name, config, processor, size, output, kwargs, options = case
    model, folder = saved(tmp_path, getattr(transformers, name)(config()), processor)
    keras_model = keras_vit.model_from_checkpoint(folder, **kwargs)
    for key, value in options.items():
        assert _option(keras_model, key) == value, key
    assert_parity(predict(keras_model, photos(size)), forward(model, size, folder, output))


@pytest.mark.backends
@pytest.mark.parametrize("name, config", [("Dinov2Model", dinov2_config),
                                          ("Dinov2WithRegistersModel", dinov2_reg_config)])
def test_dinov2_at_a_second_size_resizes_as_transformers(tmp_path, name, config):
    """At 70 px (5x5 patches of 14) the 2x2 position embedding is resized
    as the class does in its forward (Dinov2: bicubic; with registers:
    bicubic with antialias); the class position embedding folded into the
    class token is never resized. The token sequence (`last_hidden_state`)
    is compared: each patch token carries its resized position embedding."""
    model, folder = saved(tmp_path, getattr(transformers, name)(config()), "dinov2")
    keras_model = keras_vit.model_from_checkpoint(folder, input_shape=(70, 70, 3),
                                                  pooling=None)
    assert_parity(predict(keras_model, photos(70)),
                  forward(model, 70, folder, "last_hidden_state"))


@pytest.mark.backends
def test_clip_at_a_second_size_resizes_as_interpolate_pos_encoding(tmp_path):
    model, folder = saved(tmp_path, transformers.CLIPVisionModel(clip_config()), "clip")
    keras_model = keras_vit.model_from_checkpoint(folder, input_shape=(64, 64, 3))
    assert_parity(predict(keras_model, photos(64)), forward(
        model, 64, folder, "pooler_output", interpolate_pos_encoding=True))


@pytest.mark.backends
@pytest.mark.parametrize("name, config, processor, size, kwargs", [
    ("Dinov2ForImageClassification", lambda: dinov2_config(num_labels=3), "dinov2", 70, {}),
    ("DeiTForImageClassificationWithTeacher", lambda: deit_config(num_labels=5), "deit", 64,
     dict(interpolate_pos_encoding=True)),
])
def test_the_classifiers_at_a_second_size_give_their_logits(tmp_path, name, config, processor,
                                                             size, kwargs):
    """DINOv2's classifier (class token beside the patch mean) at 70 px and
    DeiT's distilled one (two tokens, two heads) at 64 px: the position
    embedding resized as the class does in its forward, the logits equal."""
    model, folder = saved(tmp_path, getattr(transformers, name)(config()), processor)
    keras_model = keras_vit.model_from_checkpoint(folder, input_shape=(size, size, 3),
                                                  classifier_activation=None)
    assert_parity(predict(keras_model, photos(size)),
                  forward(model, size, folder, "logits", **kwargs))


def test_dinov2_classifier_without_its_head_gives_the_pooler_and_the_heads_input(tmp_path):
    """Dinov2ForImageClassification with include_top=False:
    pooling='token' is Dinov2Model's pooler_output, pooling='token_avg' the
    vector its classifier reads (class token, mean of the patch tokens)."""
    model, folder = saved(tmp_path, transformers.Dinov2ForImageClassification(
        dinov2_config(num_labels=3)), "dinov2")
    pooled = keras_vit.model_from_checkpoint(folder, include_top=False, pooling="token")
    both = keras_vit.model_from_checkpoint(folder, include_top=False, pooling="token_avg")
    with torch.no_grad():
        out = model.dinov2(pixels(28, folder))
    tokens = out.last_hidden_state
    assert_parity(predict(pooled, photos(28)), out.pooler_output.numpy())
    assert_parity(predict(both, photos(28)),
                  torch.cat([tokens[:, 0], tokens[:, 1:].mean(dim=1)], dim=1).numpy())


@pytest.mark.backends
def test_a_pytorch_model_bin_of_transformers_5_names_loads(tmp_path):
    """A folder with `pytorch_model.bin` (`torch.save` of the state dict in
    memory: transformers 5's names, `attention.q_proj`, ...) instead of
    safetensors."""
    model, folder = saved(tmp_path, transformers.Dinov2WithRegistersModel(
        dinov2_reg_config()), "dinov2")
    (folder / "model.safetensors").unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    assert any(".q_proj." in key for key in model.state_dict())
    keras_model = keras_vit.model_from_checkpoint(folder)
    assert_parity(predict(keras_model, photos(28)), forward(model, 28, folder, "pooler_output"))


TEXT = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=64, max_position_embeddings=16)
VISION = dict(**TINY, intermediate_size=64, image_size=32, patch_size=16)


@pytest.mark.backends
@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_full_checkpoints_load_their_vision_tower_and_say_what_is_left_out(
        tmp_path, caplog, kind):
    """CLIPModel: image_embeds (get_image_features); SiglipModel: the vision
    tower's pooler_output. One log line names the text tower left out."""
    if kind == "clip":
        model = transformers.CLIPModel(transformers.CLIPConfig(
            text_config=TEXT, vision_config=VISION, projection_dim=24))
    else:
        model = transformers.SiglipModel(transformers.SiglipConfig(
            text_config=TEXT, vision_config=VISION))
    model, folder = saved(tmp_path, model, kind)
    # transformers 4 saved the position index buffer (0, 1, ..., N - 1) too
    from safetensors.numpy import load_file, save_file

    state = load_file(folder / "model.safetensors")
    state["vision_model.embeddings.position_ids"] = np.arange(4 + (kind == "clip"))[None]
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        keras_model = keras_vit.model_from_checkpoint(folder)
    lines = [r.getMessage() for r in caplog.records if "text tower" in r.getMessage()]
    tower = "vision_model.*, visual_projection" if kind == "clip" else "vision_model.*"
    roots = "logit_scale, text_model, text_projection" if kind == "clip" else \
        "logit_bias, logit_scale, text_model"
    assert len(lines) == 1 and re.fullmatch(
        rf"{re.escape(str(folder))} holds a text tower too \(\d+ tensors: {roots}\); "
        rf"keras_vit builds the vision tower \({re.escape(tower)}\) and leaves the text "
        r"tower out\.", lines[0]), lines
    with torch.no_grad():
        pooled = model.vision_model(pixels(32, folder)).pooler_output
        reference = model.visual_projection(pooled) if kind == "clip" else pooled
    assert_parity(predict(keras_model, photos(32)), reference.numpy())


def _dinov2_folder(tmp_path):
    return saved(tmp_path, transformers.Dinov2Model(dinov2_config()), "dinov2")[1]


def _edit_config(folder, **values):
    config = json.loads((folder / "config.json").read_text())
    config.update(values)
    (folder / "config.json").write_text(json.dumps(config))


LOADED = ("'vit', 'dinov2', 'dinov2_with_registers', 'deit', 'clip_vision_model', 'clip', "
          "'siglip_vision_model', 'siglip', 'beit', 'dinov3_vit'")
NAFLEX = (
    "NaFlex patches: its image processor picks each image's patch grid from its aspect "
    "ratio (up to max_num_patches), resizes the position embeddings to that grid "
    "(bilinear, antialias) and masks the padding patches, which a keras_vit model of one "
    "fixed grid does not compute (SigLIP 2's fixed-resolution checkpoints are model_type "
    "'siglip' and load)")


@pytest.mark.parametrize("model_type, feature", [
    ("data2vec-vision", "BEiT's blocks under its own key names (data2vec_vision.*), which "
                        "keras_vit does not read"),
    ("aimv2_vision_model", "RMSNorm"),
    ("vit_mae", "random patch masking (mask_ratio) in its forward"),
    ("siglip2_vision_model", NAFLEX),
])
def test_families_keras_vit_does_not_build_are_refused_naming_what_is_missing(
        tmp_path, model_type, feature):
    folder = _dinov2_folder(tmp_path)
    _edit_config(folder, model_type=model_type)
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            f"A transformers {model_type!r} checkpoint has {feature}, which keras_vit does "
            f"not build; it loads the model types {LOADED}.")):
        keras_vit.model_from_checkpoint(folder)


def test_use_swiglu_ffn_beside_a_gelu_mlp_is_corrupt(tmp_path):
    """config.json says DINOv2-g's SwiGLU MLP (tests/test_family_swiglu.py
    loads one); the weights hold the GELU MLP."""
    folder = _dinov2_folder(tmp_path)
    _edit_config(folder, use_swiglu_ffn=True)
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            "config.json' says use_swiglu_ffn true, but the weights hold a GELU MLP "
            "(encoder.layer.0.mlp.fc1.weight has the 64 rows mlp.fc2.weight takes); the file "
            "and the weights must describe the same model.")):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.parametrize("values, message", [
    (dict(model_type="dinov2_with_registers", num_register_tokens=4,
          architectures=["Dinov2WithRegistersModel"]),
     "says num_register_tokens 4, but the weights hold 0 register tokens (no "
     "embeddings.register_tokens)"),
    (dict(patch_size=16), "says patch_size 16, but the weights hold 14x14 patches "
     "(embeddings.patch_embeddings.projection.weight has a 14x14 kernel)"),
    (dict(hidden_size=64), "says hidden_size 64, but the weights hold width 32 "
     "(embeddings.patch_embeddings.projection.weight has 32 output channels)"),
    (dict(image_size=56), "says image_size 56, but the weights hold 4 patch position "
     "embeddings (embeddings.position_embeddings, patch 14x14)"),
    (dict(model_type="deit", architectures=["DeiTModel"]), "says model_type 'deit', but the weights hold the keys of a "
     "'dinov2' model (layer scale (encoder.layer.0.layer_scale1.lambda1))"),
])
def test_a_config_that_contradicts_its_weights_is_corrupt(tmp_path, values, message):
    folder = _dinov2_folder(tmp_path)
    _edit_config(folder, **values)
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(folder / 'config.json')!r} {message}; the file and the weights must "
            "describe the same model.")):
        keras_vit.model_from_checkpoint(folder)


def _option(model, key):
    """A builder option as the built model has it."""
    encoder = model.get_layer("patch_encoder")
    block = model.get_layer("encoderblock_0")
    return {
        "layer_scale_init": block.layer_scale_init,
        "num_register_tokens": encoder.num_register_tokens,
        "no_embed_class": encoder.no_embed_class,
        "distillation_token": encoder.distillation_token,
        "pre_norm": any(layer.name == "pre_norm" for layer in model.layers),
        "patch_bias": encoder.use_bias,
        "classifier": "map" if any(layer.name == "map_head" for layer in model.layers)
        else "token",
        "gelu": block.gelu,
        "layer_norm_epsilon": block.layer_norm_epsilon,
    }[key] if key != "head" else model.get_layer("pool").mode
