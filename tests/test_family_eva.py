"""timm's `Eva` models (#50), written by timm itself and read by keras_vit:
DINOv3 (RoPE from a base of 100, four registers, layer scale, no query-key
bias or q/v biases, GELU or split SwiGLU aligned to 8, `global_pool="avg"`
after the final norm) and EVA-02 (EVA's RoPE rescaled to `ref_feat_shape`,
q/v biases fused or in `q_proj`/`k_proj`/`v_proj`, packed or split SwiGLU
with its sub-LayerNorm, a learned position embedding, the patch tokens'
mean then `fc_norm`), plus EVA-01 and timm's RoPE ViT with a register and
no class token, which the same reader builds.

The tiny models (2 blocks, width 64, 2 heads) and timm's own outputs are
`tests/rope_families.py`'s: made by `timm.create_model` with the registered
name, random, saved with `save_for_hf`. keras_vit opens each folder with
`keras_vit.model_from_checkpoint` and must give timm's outputs on the two
sample photos within 1e-4 x max(1, |value|): the logits at the trained size
and at a second one (DINOv3: 48x80, one model taking any size; EVA-02: 84
px, timm built at that size from the same folder, its position embedding
resized on load and its RoPE coordinates rescaled to `ref_feat_shape`), and
the pooled output and the tokens of a model without a head.
"""

import json
import shutil

import numpy as np
import pytest

import keras_vit
from conftest import predict
from family_photos import assert_parity
from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")  # imported before the torchvision stand-in
import rope_families as rf  # noqa: E402

timm = rf._timm()
CLASSES, WIDTH, HEADS = rf.CLASSES, rf.WIDTH, rf.HEADS

DINOV3 = {"variant": "dinov3", "temperature": 100.0}
EVA02 = {"variant": "eva", "temperature": 10000.0, "ref_grid": (16, 16)}

# (timm name in rope_families.TIMM, classes, builder options the file gives)
CLASSIFIERS = [
    ("vit_small_patch16_dinov3", CLASSES,
     dict(rope=DINOV3, qkv_bias="none", mlp="gelu", num_register_tokens=4,
          layer_scale_init=1e-5, position_embedding=False, epsilon=1e-5, classifier="avg",
          fc_norm=False)),
    ("vit_small_patch16_dinov3_qkvb", CLASSES, dict(qkv_bias="qv")),
    # split SwiGLU (fc1_g, fc1_x): int(64 x 2.6) = 166 rounded up to 168
    ("vit_small_plus_patch16_dinov3", CLASSES, dict(mlp="swiglu", mlp_dim=168)),
    # fused qkv with q_bias/v_bias, packed SwiGLU (GluMlp), fc_norm after the mean
    ("eva02_tiny_patch14_336", None,
     dict(rope=EVA02, qkv_bias="qv", mlp="swiglu", mlp_norm=False, fc_norm=True,
          epsilon=1e-6, position_embedding=True, classifier="avg")),
    # q_proj/k_proj/v_proj, split SwiGLU with its sub-LayerNorm (scale_mlp)
    ("eva02_base_patch14_448", None, dict(rope=EVA02, qkv_bias="qv", mlp_norm=True)),
]


def _family(name):
    return "dinov3" if "dinov3" in name else "eva02"


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


# On every backend (`-m backends`): DINOv3 and EVA-02-B (split SwiGLU with its
# sub-LayerNorm, separate q/k/v); the other cases on TensorFlow (CI time)
ON_EVERY_BACKEND = ("vit_small_patch16_dinov3", "eva02_base_patch14_448")


@pytest.mark.parametrize("name, classes, options", [
    pytest.param(*case, id=case[0], marks=[pytest.mark.backends]
                 if case[0] in ON_EVERY_BACKEND else [])
    for case in CLASSIFIERS])
def test_timm_eva_classifiers_give_timms_logits_at_two_sizes(name, classes, options):
    """DINOv3: one model with `input_shape=(None, None, 3)` at 64 px and
    48x80 px (its RoPE from each call's grid). EVA-02: a model per size,
    56 and 84 px (the position embedding resized bicubic with antialias,
    as timm on load)."""
    _, folder = rf.timm_folder(name, classes)
    trained, second = (rf.TIMM[name][0],) * 2, rf.SECOND_SIZE[_family(name)]
    shapes = ([(None, None, 3)] if _family(name) == "dinov3"
              else [(*trained, 3), (*second, 3)])
    models = [keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                              input_shape=shape) for shape in shapes]
    for key, value in options.items():
        assert _option(models[0], key) == value, key
    for size, model in zip((trained, second), models if len(models) == 2 else models * 2,
                           strict=True):
        images = rf.photos(*size)
        assert_parity(predict(model, images), rf.timm_outputs(name, images, classes)["logits"])


@pytest.mark.backends
@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "eva02_base_patch14_224"])
def test_headless_timm_eva_models_give_timms_pooled_output_and_tokens(name):
    """timm's `num_classes=0` forward: the patch tokens' mean (registers and
    class token left out), after the final norm (DINOv3) or followed by
    fc_norm (EVA-02); `pooling=None`: `forward_features` (class token,
    registers, patches)."""
    _, folder = rf.timm_folder(name)
    size = rf.TIMM[name][0]
    images = rf.photos(size)
    expected = rf.timm_outputs(name, images)
    pooled = keras_vit.model_from_checkpoint(folder, input_shape=(size, size, 3))
    got = predict(pooled, images)
    assert got.shape == (2, WIDTH)
    assert_parity(got, expected["pre_logits"])
    tokens = keras_vit.model_from_checkpoint(folder, input_shape=(size, size, 3),
                                             pooling=None)
    assert_parity(predict(tokens, images), expected["features"])


def _written(tmp_path, name, size, classes=CLASSES, **extra):
    """`(timm model, folder)` for a name `rope_families.TIMM` does not hold."""
    args = dict(depth=rf.DEPTH, embed_dim=WIDTH, num_heads=HEADS, img_size=size,
                num_classes=classes, **extra)
    model = rf.randomized(timm.create_model(name, pretrained=False, **args), 0)
    folder = tmp_path / name
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder


def _timm_logits(model, folder, images):
    with torch.no_grad():
        return model(rf.timm_pixels(folder, images)).numpy()


@pytest.mark.parametrize("name, size, second, options", [
    ("eva_giant_patch14_224", 56, 70, dict(rope=None, mlp="gelu", fc_norm=True)),
    ("vit_medium_patch16_rope_reg1_gap_256", 48, 64,
     dict(rope=EVA02, num_register_tokens=1, position_embedding=False, classifier="gap")),
])
def test_the_other_timm_eva_models_give_timms_logits(tmp_path, name, size, second, options):
    """EVA-01 (GELU MLP, no RoPE) and timm's RoPE ViT with a register and no
    class token (the patch tokens' mean, then fc_norm), at two sizes."""
    model, folder = _written(tmp_path, name, size)
    for side in (size, second):
        keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                      input_shape=(side, side, 3))
        for key, value in options.items():
            assert _option(keras_model, key) == value, key
        reference = model if side == size else timm.create_model(
            f"local-dir:{folder}", pretrained=True, img_size=side).eval()
        images = rf.photos(side)
        assert_parity(predict(keras_model, images), _timm_logits(reference, folder, images))


@pytest.mark.backends
def test_a_config_asking_for_the_class_token_pools_it(tmp_path):
    """DINOv3 with `global_pool="token"` (upstream DINOv3's output): the
    class token after the final norm."""
    model, folder = _written(tmp_path, "vit_small_patch16_dinov3", 48, global_pool="token")
    keras_model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                                  input_shape=(48, 48, 3))
    assert keras_model.get_layer("pool").mode == "token"
    images = rf.photos(48)
    assert_parity(predict(keras_model, images), _timm_logits(model, folder, images))


def _copy(tmp_path, name, config=None, state=None):
    """A copy of `rope_families.timm_folder(name)`, its config.json and
    model.safetensors edited by `config(dict)` and `state(dict)`."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / name
    if not folder.exists():
        shutil.copytree(rf.timm_folder(name)[1], folder)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config(json.loads(
            (folder / "config.json").read_text()))))
    if state is not None:
        save_file(state(load_file(folder / "model.safetensors")), folder / "model.safetensors")
    return folder


def test_rope_buffers_and_key_biases_load_only_when_they_are_what_keras_vit_computes(
        tmp_path):
    """`rope.periods` (DINOv3's, here in bfloat16 precision as the release
    stores them) and a zero `attn.k_bias` are what keras_vit computes and
    load; other periods or a key bias that is not zero are refused."""
    name = "vit_small_patch16_dinov3_qkvb"
    k = np.arange(WIDTH // HEADS // 4, dtype=np.float32)
    periods = (100.0 ** (2 * k / (WIDTH // HEADS // 2))).astype(np.float32)
    bf16 = torch.from_numpy(periods).bfloat16().float().numpy()
    folder = _copy(tmp_path, name, state=lambda s: {
        **s, "rope.periods": bf16, "blocks.0.attn.k_bias": np.zeros(WIDTH, np.float32)})
    keras_vit.model_from_checkpoint(folder)
    _copy(tmp_path, name, state=lambda s: {**s, "rope.periods": periods * 2})
    with pytest.raises(CheckpointMismatchError, match=r"rope\.periods .* is not the rotary"):
        keras_vit.model_from_checkpoint(folder)
    _copy(tmp_path, name, state=lambda s: {
        **s, "rope.periods": bf16, "blocks.0.attn.k_bias": np.ones(WIDTH, np.float32)})
    with pytest.raises(CheckpointMismatchError,
                       match=r"blocks\.0\.attn\.k_bias holds a key bias that is not zero"):
        keras_vit.model_from_checkpoint(folder)


def test_eva_weights_that_contradict_their_architecture_or_args_are_refused(tmp_path):
    name = "eva02_tiny_patch14_224"
    config = json.loads((rf.timm_folder(name)[1] / "config.json").read_text())
    folder = _copy(tmp_path, name, config=lambda c: {
        **c, "architecture": "eva02_base_patch14_224"})
    with pytest.raises(CorruptCheckpointError,
                       match=r"the architecture eva02_base_patch14_224 builds mlp_norm=True, "
                             r"but the weights hold mlp_norm=False"):
        keras_vit.model_from_checkpoint(folder)
    _copy(tmp_path, name, config=lambda c: {
        **config, "model_args": {**config["model_args"], "qk_norm": True}})
    with pytest.raises(CheckpointMismatchError,
                       match=r"model_args\.qk_norm=True, which changes what timm's Eva computes"):
        keras_vit.model_from_checkpoint(folder)
    _copy(tmp_path, name, config=lambda c: {k: v for k, v in config.items()
                                            if k != "architecture"})
    with pytest.raises(CheckpointMismatchError,
                       match=r"An EVA-style timm checkpoint .* must name the architecture"):
        keras_vit.model_from_checkpoint(folder)


@pytest.mark.parametrize("name, missing", [
    ("eva02_base_patch16_clip_224", "a normalisation inside the attention"),
    ("eva02_enormous_patch14_clip_224", "EvaBlockPostNorm blocks"),
    ("vit_small_patch16_rope_mixed_224", "learned mixed-axis rotary frequencies"),
    ("vit_pe_core_tiny_patch16_384", "grid_indexing='xy'"),
])
def test_eva_architectures_keras_vit_does_not_build_are_refused_naming_what_is_missing(
        tmp_path, name, missing):
    folder = _copy(tmp_path, "eva02_tiny_patch14_224",
                   config=lambda c: {**c, "architecture": name})
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


@pytest.mark.parametrize("name, classes", [
    ("vit_small_patch16_dinov3", CLASSES), ("vit_small_plus_patch16_dinov3", CLASSES),
    ("eva02_tiny_patch14_336", None), ("eva02_base_patch14_448", None)])
def test_written_back_to_timm_timm_gives_the_same_logits(tmp_path, name, classes):
    """`to_hub_folder(library="timm")`: an Eva architecture of the model's
    epsilon and RoPE, `model_args` for the rest (fused qkv with q/v biases,
    packed SwiGLU, or split with its norm); timm's own `Eva` opens it
    (`local-dir:`) and gives the Keras model's logits."""
    _, folder = rf.timm_folder(name, classes)
    size = rf.TIMM[name][0]
    model = keras_vit.model_from_checkpoint(folder, classifier_activation=None,
                                            input_shape=(size, size, 3))
    out = tmp_path / "written"
    keras_vit.export.to_hub_folder(model, out, library="timm", verbose=False)
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"].startswith("vit_" if "dinov3" in name else "eva")
    reread = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    images = rf.photos(size)
    assert_parity(predict(model, images), _timm_logits(reread, out, images))


def test_an_avg_model_with_a_key_bias_is_not_written_to_timm(tmp_path):
    """timm's `Eva` (the `classifier="avg"` architecture) has no key bias:
    a model with one is refused in one sentence."""
    model = keras_vit.VisionTransformer(
        patch_size=16, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=64,
        input_shape=(32, 32, 3), classes=3, classifier="avg", gelu="erf")
    with pytest.raises(ValueError, match=r"cannot be written as a timm Hub folder: its "
                                         r"attention has a key bias, and timm's EVA"):
        keras_vit.export.to_hub_folder(model, tmp_path / "out", library="timm")


def test_the_named_builders_load_timms_full_architectures(tmp_path):
    """`EVA02Ti14` with timm's whole `eva02_tiny_patch14_336` layout and a
    head, at a 2x2 grid: timm's logits; a DINOv3 of another architecture
    (width 64, q/v biases) is refused by `DINOv3ViTS16` in one sentence.
    (DINOv3-S/16 itself, 22M parameters, is `test_family_builders`' row
    and count; its weights' arithmetic is the tiny models'.)"""
    model, folder = _written_full(tmp_path, "eva02_tiny_patch14_336", 28, CLASSES)
    keras_model = keras_vit.EVA02Ti14(weights=str(folder), classifier_activation=None)
    assert keras_model.input_shape == (None, 28, 28, 3)
    images = rf.photos(28)
    assert_parity(predict(keras_model, images), _timm_logits(model, folder, images))
    _, folder = rf.timm_folder("vit_small_patch16_dinov3_qkvb", CLASSES)
    with pytest.raises(CheckpointMismatchError, match=r"does not fit DINOv3ViTS16 .* it has "
                                                      r"hidden_size=64, .*qkv_bias='qv'"):
        keras_vit.DINOv3ViTS16(weights=str(folder))


def _written_full(tmp_path, name, size, classes):
    """A timm folder of the whole architecture `name` at `size` pixels, its
    weights random at the scale of a trained model (matrices of variance
    1 / fan-in, norms 1 + 0.2 N, layer scales 0.2 N): `rope_families`'
    larger values, through 12 blocks, leave float32 differences of 1e-3."""
    args = dict(img_size=size, num_classes=classes)
    model = timm.create_model(name, pretrained=False, **args).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for key, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if key.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
                parameter.copy_(1 + 0.2 * noise)
            elif "gamma" in key:
                parameter.copy_(0.2 * noise)
            elif parameter.ndim == 2:  # Linear (out, in)
                parameter.copy_(noise / parameter.shape[1] ** 0.5)
            else:
                parameter.copy_((0.02 if parameter.ndim == 4 else 0.1) * noise)
    folder = tmp_path / name
    timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=True)
    return model, folder
