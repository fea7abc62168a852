"""timm's `Eva` models (#50), written by timm itself and read by keras_vit:
DINOv3 (RoPE from a base of 100, four registers, layer scale, no query-key
bias or q/v biases, GELU or split SwiGLU aligned to 8, `global_pool="avg"`
after the final norm) and EVA-02 (EVA's RoPE rescaled to `ref_feat_shape`,
q/v biases fused or in `q_proj`/`k_proj`/`v_proj`, packed or split SwiGLU
with its sub-LayerNorm, a learned position embedding, the patch tokens'
mean then `fc_norm`), plus EVA-01 and timm's RoPE ViT with a register and
no class token, which the same reader builds.

Each tiny model (2 blocks, width 64, 2 heads) is made by `timm.create_model`
with its registered name, given random weights, saved with `save_for_hf`,
opened with `keras_vit.model_from_checkpoint` and compared with timm's own
forward on the two sample photos within 1e-4 x max(1, |value|): the logits
at the trained size and at a second one (DINOv3: the same timm model, whose
`dynamic_img_size` takes any grid; EVA-02: timm built at that size from the
same folder, its position embedding resized on load and its RoPE
coordinates rescaled to `ref_feat_shape`), and the pooled output of a model
without a head.
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

WIDTH, HEADS, DEPTH, CLASSES = 64, 2, 2, 5


def randomized(model, seed=0):
    """`model` with every parameter random (layer scales and norms too)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("norm.weight") or name.endswith(("norm1.weight", "norm2.weight")):
                parameter.copy_(1 + 0.2 * noise)
            elif "gamma" in name:
                parameter.copy_(0.5 * noise)
            else:
                parameter.copy_(0.1 * noise)
    return model.eval()


def timm_folder(tmp_path, name, size, classes=CLASSES, **extra):
    """`(timm model, folder)`: a tiny `name` written by `save_for_hf`."""
    args = dict(depth=DEPTH, embed_dim=WIDTH, num_heads=HEADS, img_size=size,
                num_classes=classes, **extra)
    model = randomized(timm.create_model(name, pretrained=False, **args))
    folder = tmp_path / f"{name}_{classes}"
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder


def normalised(images, folder):
    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    return (images / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"])


def timm_forward(model, images, folder):
    """timm's output on `images` (NHWC, 0-255), normalised as the folder says."""
    x = normalised(images, folder)
    with torch.no_grad():
        return model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()


# (timm name, trained size, second size, extra model_args, builder options the file gives)
FAMILIES = [
    ("vit_small_patch16_dinov3", 48, 64, {},
     dict(rope={"variant": "dinov3", "temperature": 100.0}, qkv_bias="none",
          num_register_tokens=4, layer_scale_init=1e-5, epsilon=1e-5)),
    # split SwiGLU (fc1_g, fc1_x): int(64 x 2.6) = 166 rounded up to 168
    ("vit_small_plus_patch16_dinov3_qkvb", 48, 64, dict(mlp_ratio=2.6),
     dict(qkv_bias="qv", mlp="swiglu", mlp_dim=168, position_embedding=False)),
    # fused qkv with q_bias/v_bias, packed SwiGLU (GluMlp)
    ("eva02_tiny_patch14_224", 56, 70, {},
     dict(rope={"variant": "eva", "temperature": 10000.0, "ref_grid": (16, 16)},
          qkv_bias="qv", mlp="swiglu", mlp_norm=False, fc_norm=True, epsilon=1e-6)),
    # q_proj/k_proj/v_proj, split SwiGLU with its sub-LayerNorm (scale_mlp)
    ("eva02_base_patch14_224", 56, 42, {}, dict(qkv_bias="qv", mlp="swiglu", mlp_norm=True)),
]
# the same reader's other Eva models, on one backend: EVA-01 (GELU MLP, no RoPE) and
# timm's RoPE ViT with a register and no class token (the patch tokens' mean, fc_norm)
OTHERS = [
    ("eva_giant_patch14_224", 56, 70, {}, dict(rope=None, mlp="gelu", fc_norm=True)),
    ("vit_medium_patch16_rope_reg1_gap_256", 48, 64, {},
     dict(num_register_tokens=1, position_embedding=False, classifier="gap")),
]
IDS = [case[0] for case in FAMILIES + OTHERS]


def _option(model, key):
    """A builder option as the built model has it."""
    block = model.get_layer("encoderblock_0")
    encoder = model.get_layer("patch_encoder")
    rope = [layer for layer in model.layers if layer.name == "rope"]
    return {
        "rope": rope[0].rope if rope else None,
        "qkv_bias": block.qkv_bias,
        "mlp": block.mlp,
        "mlp_dim": block.mlp_dim,
        "mlp_norm": block.mlp_layer_norm is not None,
        "num_register_tokens": encoder.num_register_tokens,
        "layer_scale_init": block.layer_scale_init,
        "position_embedding": encoder.use_position_embedding,
        "epsilon": block.norm1.epsilon,
        "fc_norm": any(layer.name == "fc_norm" for layer in model.layers),
        "classifier": model.get_layer("pool").mode,
    }[key]


@pytest.mark.parametrize("name, size, second, extra, options", [
    *(pytest.param(*case, marks=pytest.mark.backends) for case in FAMILIES), *OTHERS], ids=IDS)
def test_timm_eva_classifiers_give_timms_logits_at_two_sizes(
        tmp_path, name, size, second, extra, options):
    model, folder = timm_folder(tmp_path, name, size, **extra)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                  input_shape=(size, size, 3))
    for key, value in options.items():
        assert _option(keras_model, key) == value, key
    if name.startswith(("vit_small", "vit_medium")):
        assert _option(keras_model, "classifier") in ("avg", "gap")
    assert_parity(predict(keras_model, photos(size)), timm_forward(model, photos(size), folder))
    if "dinov3" in name:  # dynamic_img_size: the same timm model takes any grid
        reference = model
    else:  # built at that size from the folder: pos_embed resized, RoPE rescaled
        reference = timm.create_model(f"local-dir:{folder}", pretrained=True,
                                      img_size=second).eval()
    resized = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                              input_shape=(second, second, 3))
    assert_parity(predict(resized, photos(second)),
                  timm_forward(reference, photos(second), folder))


@pytest.mark.backends
@pytest.mark.parametrize("name, size", [("vit_small_patch16_dinov3", 48),
                                        ("eva02_base_patch14_224", 56)])
def test_headless_timm_eva_models_give_timms_pooled_output(tmp_path, name, size):
    """timm's `num_classes=0` forward: the patch tokens' mean (registers and
    class token left out), after the final norm (DINOv3) or followed by
    fc_norm (EVA-02)."""
    model, folder = timm_folder(tmp_path, name, size, classes=0)
    keras_model = keras_vit.model_from_checkpoint(folder, input_shape=(size, size, 3))
    got = predict(keras_model, photos(size))
    assert got.shape == (2, WIDTH)
    assert_parity(got, timm_forward(model, photos(size), folder))


@pytest.mark.backends
def test_dinov3_takes_any_size_in_one_model(tmp_path):
    """`input_shape=(None, None, 3)`: one DINOv3 model at 48 px, 64 px and
    48x80 px (its RoPE from each call's grid), timm's logits each time."""
    model, folder = timm_folder(tmp_path, "vit_small_patch16_dinov3", 48)
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                  input_shape=(None, None, 3))
    for images in (photos(48), photos(64), photos(80)[:, 16:64]):
        assert_parity(predict(keras_model, images), timm_forward(model, images, folder))


@pytest.mark.backends
def test_a_config_asking_for_the_class_token_pools_it(tmp_path):
    """DINOv3 with `global_pool="token"` (upstream DINOv3's output): the
    class token after the final norm."""
    model, folder = timm_folder(tmp_path, "vit_small_patch16_dinov3", 48, global_pool="token")
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                  input_shape=(48, 48, 3))
    assert keras_model.get_layer("pool").mode == "token"
    assert_parity(predict(keras_model, photos(48)), timm_forward(model, photos(48), folder))


def _edited(folder, config=None, state=None):
    from safetensors.numpy import load_file, save_file

    if config is not None:
        (folder / "config.json").write_text(json.dumps(config(json.loads(
            (folder / "config.json").read_text()))))
    if state is not None:
        tensors = load_file(folder / "model.safetensors")
        save_file(state(tensors), folder / "model.safetensors")
    return folder


def test_rope_buffers_and_key_biases_load_only_when_they_are_what_keras_vit_computes(
        tmp_path):
    """`rope.periods` (DINOv3's, here in bfloat16 precision as the release
    stores them) and a zero `attn.k_bias` are what keras_vit computes and
    load; other periods or a key bias that is not zero are refused."""
    _, folder = timm_folder(tmp_path, "vit_small_patch16_dinov3_qkvb", 48)
    k = np.arange(WIDTH // HEADS // 4, dtype=np.float32)
    periods = (100.0 ** (2 * k / (WIDTH // HEADS // 2))).astype(np.float32)
    bf16 = torch.from_numpy(periods).bfloat16().float().numpy()
    _edited(folder, state=lambda s: {**s, "rope.periods": bf16,
                                     "blocks.0.attn.k_bias": np.zeros(WIDTH, np.float32)})
    keras_vit.model_from_checkpoint(folder)
    _edited(folder, state=lambda s: {**s, "rope.periods": periods * 2})
    with pytest.raises(CheckpointMismatchError, match=r"rope\.periods .* is not the rotary"):
        keras_vit.model_from_checkpoint(folder)
    _edited(folder, state=lambda s: {**s, "rope.periods": bf16,
                                     "blocks.0.attn.k_bias": np.ones(WIDTH, np.float32)})
    with pytest.raises(CheckpointMismatchError, match=r"blocks\.0\.attn\.k_bias holds a key "
                                                      r"bias that is not zero"):
        keras_vit.model_from_checkpoint(folder)


def test_eva_weights_that_contradict_their_architecture_or_args_are_refused(tmp_path):
    _, folder = timm_folder(tmp_path, "eva02_tiny_patch14_224", 56)
    config = json.loads((folder / "config.json").read_text())
    _edited(folder, config=lambda c: {**c, "architecture": "eva02_base_patch14_224"})
    with pytest.raises(CorruptCheckpointError, match=r"the architecture eva02_base_patch14_224 "
                                                     r"builds mlp_norm=True, but the weights "
                                                     r"hold mlp_norm=False"):
        keras_vit.model_from_checkpoint(folder)
    _edited(folder, config=lambda c: {**config, "model_args": {
        **config["model_args"], "qk_norm": True}})
    with pytest.raises(CheckpointMismatchError, match=r"model_args\.qk_norm=True, which "
                                                      r"changes what timm's Eva computes"):
        keras_vit.model_from_checkpoint(folder)
    _edited(folder, config=lambda c: {k: v for k, v in config.items() if k != "architecture"})
    with pytest.raises(CheckpointMismatchError, match=r"An EVA-style timm checkpoint .* "
                                                      r"must name the architecture"):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.parametrize("name, missing", [
    ("eva02_base_patch16_clip_224", "a normalisation inside the attention"),
    ("eva02_enormous_patch14_clip_224", "EvaBlockPostNorm blocks"),
    ("vit_small_patch16_rope_mixed_224", "learned mixed-axis rotary frequencies"),
    ("vit_pe_core_tiny_patch16_384", "grid_indexing='xy'"),
])
def test_eva_architectures_keras_vit_does_not_build_are_refused_naming_what_is_missing(
        tmp_path, name, missing):
    _, folder = timm_folder(tmp_path, "eva02_tiny_patch14_224", 56)
    _edited(folder, config=lambda c: {**c, "architecture": name})
    with pytest.raises(CheckpointMismatchError, match=f"{name} has .*{missing}"):
        keras_vit.model_from_checkpoint(folder)


def test_the_eva_rows_are_timms():
    """`timm_architectures` against the installed timm for the EVA names
    (built and refused)."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "tools"))
    from timm_architectures import rows

    from keras_vit.weights.timm_architectures import ARCHITECTURES, REFUSED

    names = ["vit_small_patch16_dinov3", "vit_huge_plus_patch16_dinov3_qkvb",
             "eva02_tiny_patch14_224", "eva02_large_patch14_448", "eva_giant_patch14_224"]
    refused_names = ["eva02_base_patch16_clip_224", "vit_small_patch16_rope_224"]
    built, refused = rows(timm, names + refused_names)
    assert built == {name: ARCHITECTURES[name] for name in names}
    assert refused == {name: REFUSED[name] for name in refused_names}
