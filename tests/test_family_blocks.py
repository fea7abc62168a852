"""The block options of the later ViT families (issue 48, item 1):
LayerScale (DINOv2, DeiT-III), QuickGELU (OpenAI CLIP) and the multi-head
attention-pooling head `map` (SigLIP). Known answers in NumPy, parity with
timm's own modules where timm imports, the layer harness, a tiny
VisionTransformer saved and reloaded with safe_mode, and today's models
unchanged at the defaults."""

import os

import keras
import numpy as np
import pytest
from conftest import predict
from harness import run_layer_test
from keras import ops

import keras_vit
from keras_vit import layers
from keras_vit.layers.fused import dense
from keras_vit.models.vit import VisionTransformer

TINY = dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
            input_shape=(32, 32, 3))


# --- NumPy references -------------------------------------------------------

def _erf(x):
    from math import erf

    return np.vectorize(erf)(x)


GELUS = {
    "tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "erf": lambda x: 0.5 * x * (1 + _erf(x / np.sqrt(2))),
    "quick": lambda x: x / (1 + np.exp(-1.702 * x)),
}


def _layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _np_block(x, w, heads, eps, gelu, gammas=None):
    """x + ls1 * MHSA(LN(x)); x + ls2 * MLP(LN(x)), in float64."""
    b, n, d = x.shape
    hd = d // heads
    y = _layer_norm(x, w["norm1/gamma"], w["norm1/beta"], eps)
    qkv = (y @ w["qkv/kernel"] + w["qkv/bias"]).reshape(b, n, 3, heads, hd)
    q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    a = _softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)) @ v
    a = a.transpose(0, 2, 1, 3).reshape(b, n, d)
    a = a @ w["attention_output/kernel"] + w["attention_output/bias"]
    x = x + (a * gammas[0] if gammas else a)
    y = _layer_norm(x, w["norm2/gamma"], w["norm2/beta"], eps)
    y = GELUS[gelu](y @ w["mlp_dense1/kernel"] + w["mlp_dense1/bias"])
    y = y @ w["mlp_dense2/kernel"] + w["mlp_dense2/bias"]
    return x + (y * gammas[1] if gammas else y)


def _np_map(x, w, heads, eps, gelu):
    """SigLIP's MAPHead: probe -> MHA over x -> y + MLP(LN(y)), in float64."""
    b, n, d = x.shape
    hd = d // heads
    q = (w["probe"].reshape(1, d) @ w["query/kernel"] + w["query/bias"]).reshape(heads, hd)
    kv = (x @ w["key_value/kernel"] + w["key_value/bias"]).reshape(b, n, 2, heads, hd)
    k, v = kv[:, :, 0], kv[:, :, 1]                                   # (b, n, h, hd)
    att = _softmax(np.einsum("bnhd,hd->bhn", k, q) / np.sqrt(hd))
    y = np.einsum("bhn,bnhd->bhd", att, v).reshape(b, d)
    y = y @ w["out/kernel"] + w["out/bias"]
    m = _layer_norm(y, w["norm/gamma"], w["norm/beta"], eps)
    m = GELUS[gelu](m @ w["mlp_dense1/kernel"] + w["mlp_dense1/bias"])
    return y + m @ w["mlp_dense2/kernel"] + w["mlp_dense2/bias"]


def _randomize(layer, seed=0, scale=0.5):
    """Random known weights, keyed by their path inside `layer`."""
    rng = np.random.default_rng(seed)
    values = {}
    for v in layer.weights:
        key = v.path.split("/", 1)[1]
        values[key] = rng.normal(scale=scale, size=v.shape).astype("float32")
        v.assign(values[key])
    return {k: v.astype("float64") for k, v in values.items()}


# --- the layer harness ------------------------------------------------------

@pytest.mark.backends
@pytest.mark.parametrize("case", [
    (layers.TransformerBlock, dict(num_heads=2, mlp_dim=24, layer_scale_init=1e-5,
                                   gelu="quick", drop_path_rate=0.1), (2, 5, 16)),
    (layers.LayerScale, dict(init_value=1e-6), (2, 5, 16)),
    (layers.AttentionPooling, dict(num_heads=2, mlp_dim=24, gelu="quick",
                                   layer_norm_epsilon=1e-5), (2, 5, 16)),
], ids=["block-layer-scale-quick", "layer-scale", "attention-pooling"])
def test_block_options_in_the_layer_harness(case):
    """Config round trip, .keras with safe_mode, mixed_bfloat16 (LayerNorm,
    softmax in float32, weights float32), tf.data."""
    cls, kwargs, shape = case
    run_layer_test(cls, kwargs, shape)


# --- known answers ----------------------------------------------------------

def test_quick_gelu_is_x_sigmoid_1702x():
    x = np.linspace(-6, 6, 49, dtype="float32").reshape(-1, 1)
    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    layer.build((None, 1))
    got = ops.convert_to_numpy(dense(layer, x, gelu="quick"))
    np.testing.assert_allclose(got, x / (1 + np.exp(-1.702 * x)), rtol=1e-6, atol=1e-7)
    # the same function in training calls (TensorFlow's written-out gradient path)
    got = ops.convert_to_numpy(dense(layer, x, gelu="quick", training=True))
    np.testing.assert_allclose(got, x / (1 + np.exp(-1.702 * x)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("gelu, layer_scale", [
    ("tanh", None), ("erf", None), ("quick", None), ("tanh", 1e-5), ("quick", 0.3)])
def test_block_equals_numpy(gelu, layer_scale):
    """x + gamma1 * MHSA(LN(x)), then x + gamma2 * MLP(LN(x)) with each GELU
    form; LayerScale's gammas random (as trained), not their initial value."""
    block = layers.TransformerBlock(2, 24, layer_norm_epsilon=1e-6, gelu=gelu,
                                    layer_scale_init=layer_scale)
    x = np.random.default_rng(1).normal(size=(2, 5, 16)).astype("float32")
    block.build(x.shape)
    w = _randomize(block)
    gammas = (w["ls1/gamma"], w["ls2/gamma"]) if layer_scale else None
    want = _np_block(x.astype("float64"), w, 2, 1e-6, gelu, gammas)
    got = ops.convert_to_numpy(block(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layer_scale_starts_at_its_init_value_and_is_a_named_sublayer():
    block = layers.TransformerBlock(2, 24, layer_scale_init=1e-6, name="b")
    block.build((None, 5, 16))
    scales = {v.path: ops.convert_to_numpy(v) for v in block.weights if "/ls" in v.path}
    assert sorted(scales) == ["b/ls1/gamma", "b/ls2/gamma"]
    for value in scales.values():
        np.testing.assert_array_equal(value, np.full((16,), 1e-6, "float32"))
    # a tiny scale: the block is nearly the identity at initialisation
    x = np.random.default_rng(0).normal(size=(1, 5, 16)).astype("float32")
    np.testing.assert_allclose(ops.convert_to_numpy(block(x)), x, atol=1e-4)


@pytest.mark.parametrize("value, error", [
    (0, ValueError), (-1e-5, ValueError), (float("nan"), ValueError),
    ("1e-5", TypeError), (True, TypeError)])
def test_layer_scale_init_refuses_bad_values(value, error):
    with pytest.raises(error, match="layer_scale_init"):
        layers.TransformerBlock(2, 24, layer_scale_init=value)
    with pytest.raises(error, match="layer_scale_init"):
        VisionTransformer(**TINY, layer_scale_init=value)


def test_unknown_gelu_names_the_forms():
    with pytest.raises(ValueError, match="quick"):
        layers.TransformerBlock(2, 24, gelu="quick_gelu")


@pytest.mark.parametrize("gelu", ["erf", "quick"])
def test_attention_pooling_equals_numpy(gelu):
    pool = layers.AttentionPooling(num_heads=4, mlp_dim=24, layer_norm_epsilon=1e-6,
                                   gelu=gelu)
    x = np.random.default_rng(2).normal(size=(3, 7, 16)).astype("float32")
    pool.build(x.shape)
    w = _randomize(pool, seed=5)
    assert sorted(w) == sorted([
        "probe", "query/kernel", "query/bias", "key_value/kernel", "key_value/bias",
        "out/kernel", "out/bias", "norm/gamma", "norm/beta", "mlp_dense1/kernel",
        "mlp_dense1/bias", "mlp_dense2/kernel", "mlp_dense2/bias"])
    want = _np_map(x.astype("float64"), w, 4, 1e-6, gelu)
    np.testing.assert_allclose(ops.convert_to_numpy(pool(x)), want, rtol=1e-4, atol=1e-4)


def test_attention_pooling_takes_any_number_of_tokens():
    """The probe attends over however many tokens come (any image size)."""
    pool = layers.AttentionPooling(num_heads=2, mlp_dim=8)
    inputs = keras.Input((None, 16))
    model = keras.Model(inputs, pool(inputs))
    for tokens in (3, 10):
        assert model(np.ones((2, tokens, 16), "float32")).shape == (2, 16)


# --- parity with timm's own modules (where timm imports) ----------------------

def _timm():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")  # reads torchvision's version: first
    from torch_libraries import import_timm

    try:
        return import_timm()
    except ImportError as error:
        pytest.skip(f"timm is not importable: {error}")


def _linear(layer, module):
    layer.kernel.assign(module.weight.detach().numpy().T)
    layer.bias.assign(module.bias.detach().numpy())


def _norm(layer, module):
    layer.gamma.assign(module.weight.detach().numpy())
    layer.beta.assign(module.bias.detach().numpy())


def test_block_with_layer_scale_and_quick_gelu_equals_timms_block():
    """timm's `Block(init_values=..., act_layer=QuickGELU)` with its weights
    copied: LayerScale's `gamma` and the fused qkv map one to one."""
    _timm()
    import torch
    from timm.layers import QuickGELU
    from timm.models.vision_transformer import Block

    torch.manual_seed(0)
    ref = Block(16, 2, mlp_ratio=1.5, qkv_bias=True, init_values=1e-5,
                act_layer=QuickGELU).eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.3)
    block = layers.TransformerBlock(2, 24, layer_norm_epsilon=1e-5, gelu="quick",
                                    layer_scale_init=1e-5)
    block.build((None, 5, 16))
    _norm(block.norm1, ref.norm1)
    _norm(block.norm2, ref.norm2)
    _linear(block.qkv, ref.attn.qkv)
    _linear(block.attention_output, ref.attn.proj)
    _linear(block.mlp_dense1, ref.mlp.fc1)
    _linear(block.mlp_dense2, ref.mlp.fc2)
    block.ls1.gamma.assign(ref.ls1.gamma.detach().numpy())
    block.ls2.gamma.assign(ref.ls2.gamma.detach().numpy())
    x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(block(x)), want, rtol=1e-4, atol=1e-4)


def test_attention_pooling_equals_timms_attention_pool_latent():
    """timm's `AttentionPoolLatent` (the `global_pool='map'` head of its
    SigLIP ViTs) with its weights copied: latent -> probe, q, kv, proj,
    norm, mlp.fc1 / fc2."""
    _timm()
    import torch
    from timm.layers.attention_pool import AttentionPoolLatent

    torch.manual_seed(0)
    ref = AttentionPoolLatent(16, num_heads=2, mlp_ratio=2.0,
                              norm_layer=torch.nn.LayerNorm).eval()
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.5)
    pool = layers.AttentionPooling(2, 32, layer_norm_epsilon=1e-5, gelu="erf")
    pool.build((None, 5, 16))
    pool.probe.assign(ref.latent.detach().numpy())
    for layer, module in ((pool.query, ref.q), (pool.key_value, ref.kv), (pool.out, ref.proj),
                          (pool.mlp_dense1, ref.mlp.fc1), (pool.mlp_dense2, ref.mlp.fc2)):
        _linear(layer, module)
    _norm(pool.norm, ref.norm)
    x = np.random.default_rng(0).normal(size=(3, 5, 16)).astype("float32")
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ops.convert_to_numpy(pool(x)), want, rtol=1e-4, atol=1e-4)


# --- VisionTransformer with the options ---------------------------------------

def test_vision_transformer_with_the_block_options_saves_and_reloads(tmp_path):
    """classifier="map" (no class token), LayerScale and QuickGELU: a tiny
    model, saved as .keras and reloaded with safe_mode, gives the same
    logits; the options are in the blocks' configs."""
    model = VisionTransformer(**TINY, classifier="map", layer_scale_init=1e-5,
                              gelu="quick", classes=3, classifier_activation=None)
    assert model.count_params() < 10_000
    names = [w.path for w in model.weights]
    assert "encoderblock_0/ls1/gamma" in names and "map_head/probe" in names
    assert "patch_encoder/class_token" not in names
    block = model.get_layer("encoderblock_0")
    assert block.get_config()["layer_scale_init"] == 1e-5
    assert block.get_config()["gelu"] == "quick"
    assert model.get_layer("map_head").get_config()["gelu"] == "quick"
    images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    for w in model.weights:  # a zero head would hide differences
        w.assign(np.random.default_rng(len(w.path)).normal(scale=0.2, size=w.shape))
    want = ops.convert_to_numpy(model(images))
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(loaded(images)), want)


def test_map_pooling_without_the_head():
    """include_top=False, pooling="map": the pooled vector of the map head."""
    model = VisionTransformer(**TINY, classifier="map", include_top=False, pooling="map")
    assert model.output_shape == (None, 16)
    assert model.get_layer("map_head") is not None
    tokens = VisionTransformer(**TINY, classifier="map", include_top=False)
    assert tokens.output_shape == (None, 16, 16)  # 16 patches, no class token


@pytest.mark.parametrize("kwargs, match", [
    (dict(classifier="map", representation_size=8), "representation_size=8"),
    (dict(include_top=False, pooling="map"), "Unknown `pooling='map'`"),
    (dict(classifier="map", include_top=False, pooling="token"), "class token"),
])
def test_map_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VisionTransformer(**TINY, **kwargs)


# --- today's models unchanged at the defaults ---------------------------------

# The weights of these tiny models before issue 48 (written from commit bb0290b).
DEFAULT_TOKEN = [
    ("patch_encoder/kernel", (192, 16)), ("patch_encoder/bias", (16,)),
    ("patch_encoder/class_token", (1, 1, 16)), ("patch_encoder/position_embedding", (1, 17, 16)),
    ("encoderblock_0/norm1/gamma", (16,)), ("encoderblock_0/norm1/beta", (16,)),
    ("encoderblock_0/norm2/gamma", (16,)), ("encoderblock_0/norm2/beta", (16,)),
    ("encoderblock_0/mlp_dense1/kernel", (16, 32)), ("encoderblock_0/mlp_dense1/bias", (32,)),
    ("encoderblock_0/qkv/kernel", (16, 48)), ("encoderblock_0/qkv/bias", (48,)),
    ("encoderblock_0/attention_output/kernel", (16, 16)),
    ("encoderblock_0/attention_output/bias", (16,)),
    ("encoderblock_0/mlp_dense2/kernel", (32, 16)), ("encoderblock_0/mlp_dense2/bias", (16,)),
    ("encoder_norm/gamma", (16,)), ("encoder_norm/beta", (16,)),
    ("pre_logits/kernel", (16, 8)), ("pre_logits/bias", (8,)),
    ("head/kernel", (8, 3)), ("head/bias", (3,))]


def test_default_models_keep_their_weights():
    """No LayerScale, no map head at the defaults: the same weights, names,
    shapes and order as before (the official parity tests check values)."""
    model = VisionTransformer(**TINY, classes=3, representation_size=8)
    assert [(w.path, tuple(w.shape)) for w in model.weights] == DEFAULT_TOKEN
    gap = VisionTransformer(**TINY, classes=3, classifier="gap")
    expected = [(p, (1, 16, 16) if p.endswith("position_embedding") else s)
                for p, s in DEFAULT_TOKEN
                if not p.startswith(("pre_logits", "head")) and not p.endswith("class_token")]
    assert [(w.path, tuple(w.shape)) for w in gap.weights] == expected + [
        ("head/kernel", (16, 3)), ("head/bias", (3,))]
    config = model.get_layer("encoderblock_0").get_config()
    assert config["layer_scale_init"] is None and config["gelu"] == "tanh"
    # a block config saved before issue 48 (no layer_scale_init) still loads
    del config["layer_scale_init"]
    assert layers.TransformerBlock.from_config(config).ls1 is None


@pytest.mark.parametrize("kwargs", [
    dict(layer_scale_init=1e-5, num_register_tokens=4, no_embed_class=True),
    dict(layer_scale_init=1e-6, no_embed_class=True),
    dict(distillation_token=True),  # head and head_dist, kept as one Dense
    dict(classifier="map"),
    dict(pre_norm=True, patch_bias=False, gelu="quick"),
    dict(num_register_tokens=2),
    dict(classifier="token_avg", layer_scale_init=1e-5),
], ids=["dinov2_reg", "deit3", "deit_distilled", "siglip", "clip", "registers",
        "dinov2_classifier"])
def test_official_files_keep_every_option(tmp_path, kwargs):
    """An `.npz` written by save_official_weights holds the later families'
    weights under keras_vit's keys (`weights.npz`: `reg`, `dist`,
    `LayerScale_0/1`, `pre_norm`, big_vision's `MAPHead_0`), and
    model_from_checkpoint builds the same model from it: same options,
    same outputs to the bit. A distilled DeiT's head is written as DeiT's
    `head` and `head_dist`; DINOv2's classifier's `(2D, classes)` head says
    `token_avg`."""
    from keras_vit.weights.npz import read_checkpoint
    from keras_vit.weights.official import save_official_weights

    rng = np.random.default_rng(0)
    model = VisionTransformer(**{**TINY, "classes": 3}, **kwargs)
    for weight in model.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.1)
    save_official_weights(model, tmp_path / "w.npz")
    assert ("head_dist/kernel" in read_checkpoint(tmp_path / "w.npz")) == \
        ("distillation_token" in kwargs)
    arithmetic = {"gelu": kwargs["gelu"]} if "gelu" in kwargs else {}
    loaded = keras_vit.model_from_checkpoint(tmp_path / "w.npz", **arithmetic)
    assert [(w.path, tuple(w.shape)) for w in loaded.weights] == \
        [(w.path, tuple(w.shape)) for w in model.weights]
    x = rng.uniform(0, 255, (2, *model.input_shape[1:])).astype("float32")
    np.testing.assert_array_equal(predict(loaded, x), predict(model, x))
