"""Fine-tuning tools: layer-wise learning-rate decay (`layer_decay`,
`--layer-decay`) and weight EMA (`ema`, `--ema`)."""

import json
import re

import keras
import numpy as np
import pytest

from conftest import run_cli, tiny_mixer, tiny_vit
from keras_vit import training
from keras_vit.training.callbacks import default_callbacks
from keras_vit.training.layer_decay import (
    LayerDecayAdamW,
    LayerDecaySGD,
    layer_decay_scales,
    layer_depths,
)

IMAGES = np.random.default_rng(0).uniform(0, 255, (6, 32, 32, 3)).astype("float32")


def _one_step(optimizer, model, gradient=1.0):
    """Applies one update of `gradient` (a constant) to every trainable
    variable; returns {path: mean change per unit gradient}, the variable's
    effective learning rate for SGD."""
    variables = model.trainable_variables
    before = [keras.ops.convert_to_numpy(v) for v in variables]
    optimizer.apply([keras.ops.full(v.shape, gradient) for v in variables], variables)
    return {v.path: float(np.mean(b - keras.ops.convert_to_numpy(v)))
            for v, b in zip(variables, before, strict=True)}


@pytest.mark.backends
def test_each_variable_trains_at_its_layers_rate():
    """lr x RATE^(L+1-depth): the patch embedding, class token and position
    embedding at depth 0, block i at i+1, the final norm and head at L+1."""
    model = tiny_vit(num_layers=2)
    depths, num_layers = layer_depths(model)
    assert num_layers == 2
    assert {path: depth for path, depth in depths.items() if "encoderblock" not in path} == {
        "patch_encoder/kernel": 0, "patch_encoder/bias": 0, "patch_encoder/class_token": 0,
        "patch_encoder/position_embedding": 0, "encoder_norm/gamma": 3,
        "encoder_norm/beta": 3, "head/kernel": 3, "head/bias": 3}
    assert {depths[f"encoderblock_{i}/qkv/kernel"] for i in (0, 1)} == {1, 2}
    optimizer = LayerDecaySGD(0.1, learning_rate_scales=layer_decay_scales(model, 0.5))
    rates = _one_step(optimizer, model)
    expected = {path: 0.1 * 0.5 ** (3 - depth) for path, depth in depths.items()}
    assert rates == pytest.approx(expected, rel=1e-5)
    assert optimizer.learning_rate_scale(model.get_layer("head").kernel) == 1.0

    # AdamW: a zero gradient moves a variable by its decoupled weight decay
    # alone, scaled with its learning rate (not on biases, norms, embeddings)
    model = tiny_vit(num_layers=2)
    adamw = LayerDecayAdamW(0.1, learning_rate_scales=layer_decay_scales(model, 0.5),
                            decoupled_weight_decay=0.2, no_decay=training.NO_DECAY)
    values = {v.path: keras.ops.convert_to_numpy(v) for v in model.trainable_variables}
    _one_step(adamw, model, gradient=0.0)
    for variable in model.trainable_variables:  # element by element: w * decay * lr * scale
        path = variable.path
        decayed = not re.search("bias|gamma|beta|position_embedding|class_token", path)
        rate = 0.2 * 0.1 * 0.5 ** (3 - depths[path]) if decayed else 0.0
        np.testing.assert_allclose(values[path] - keras.ops.convert_to_numpy(variable),
                                   values[path] * rate, rtol=1e-3, atol=1e-9, err_msg=path)


def test_a_mixer_and_a_hybrid_have_their_depths():
    mixer_depths, blocks = layer_depths(tiny_mixer(num_blocks=2))
    assert blocks == 2 and mixer_depths["stem/kernel"] == 0
    assert mixer_depths["mixerblock_1/token_mixing1/kernel"] == 2
    assert mixer_depths["pre_head_layer_norm/gamma"] == 3
    hybrid_depths, _ = layer_depths(tiny_vit(resnet_layers=(1,), patch_size=1))
    assert hybrid_depths["resnet_root/conv_root/kernel"] == 0
    assert hybrid_depths["block1_unit1/conv1/kernel"] == 0


def test_layer_decay_and_ema_values_are_checked():
    with pytest.raises(ValueError, match=re.escape(
            "layer_decay=1.5; allowed: a number in (0, 1] (e.g. 0.65 for ViT-B, 0.75 for "
            "ViT-L as in BEiT / MAE).")):
        layer_decay_scales(tiny_vit(), 1.5)
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=re.escape(
            "Layer-wise learning-rate decay needs a keras_vit model with TransformerBlock "
            "or MixerBlock layers; 'plain' has none.")):
        layer_decay_scales(plain, 0.5)
    optimizer = LayerDecaySGD(0.1, learning_rate_scales=layer_decay_scales(tiny_vit(), 0.5))
    with pytest.raises(ValueError, match=re.escape(
            "No layer-decay learning rate for 2 variable(s) of the model being trained (e.g. "
            "'sequential/dense_1/kernel'): the optimizer was made for another model; make it "
            "from this one (layer_decay_scales(model, rate)).")):
        optimizer.build(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
                        .trainable_variables)
    for given, message in (
            ({"ema": 1.0}, "ema=1.0 (--ema); allowed: a decay in (0, 1), e.g. 0.9998"),
            ({"ema": True}, "ema=True (--ema); allowed: a decay in (0, 1)"),
            ({"layer_decay": 0}, "layer_decay=0 (--layer-decay); allowed: a number in "
                                 "(0, 1]")):
        with pytest.raises(ValueError, match=re.escape(message)):
            training.train("ViTTi16", "folder:/nowhere", **given)
    code, _, err = run_cli("train", "--data", "folder:/nowhere", "--ema")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "keras-vit: error: --ema takes a decay in (0, 1), e.g. --ema 0.9998 (a moving "
        "average of the weights while training); a PyTorch checkpoint's EMA weights are "
        "--weights-ema.")


class _RawWeights(keras.callbacks.Callback):
    """The training weights after each update (before any EMA swap)."""

    def __init__(self):
        super().__init__()
        self.after = []

    def on_train_batch_end(self, batch, logs=None):
        self.after.append([keras.ops.convert_to_numpy(v)
                           for v in self.model.trainable_variables])


@pytest.mark.backends
def test_validation_and_saved_models_use_the_moving_average(tmp_path):
    """avg_1 = w_1, avg_t = d * avg_(t-1) + (1 - d) * w_t after update t
    (Keras' `use_ema`): validation, best.keras (at its epoch) and the model
    after `fit` (then model.keras) hold the average, not the last weights."""
    model = tiny_vit()
    decay = 0.5
    model.compile(training.make_optimizer("scratch", 6, learning_rate=0.05, ema=decay),
                  "categorical_crossentropy", metrics=["accuracy"])
    raw = _RawWeights()
    labels = np.eye(3, dtype="float32")[[0, 1, 2, 0, 1, 2]]
    history = model.fit(IMAGES, labels, batch_size=2, epochs=2, verbose=0,
                        callbacks=[raw, *default_callbacks(str(tmp_path), ema=True)],
                        validation_data=(IMAGES, labels))
    averages = [raw.after[0]]  # 3 updates per epoch
    for weights in raw.after[1:]:
        averages.append([decay * a + (1 - decay) * w for a, w in zip(averages[-1], weights, strict=True)])
    final = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    for got, want in zip(final, averages[-1], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert any(not np.allclose(f, w) for f, w in zip(final, raw.after[-1], strict=True))
    loss, _ = model.evaluate(IMAGES, labels, verbose=0)
    assert loss == pytest.approx(history.history["val_loss"][-1], rel=1e-5)
    epoch = json.loads((tmp_path / "best.keras.json").read_text())["epoch"]
    best = keras.saving.load_model(tmp_path / "best.keras")
    for got, want in zip([keras.ops.convert_to_numpy(v) for v in best.trainable_variables],
                         averages[3 * epoch - 1], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_builder_flags_on_a_model_file_are_refused(tmp_path, few_digits_folder):
    """`--remat` and `--weights-ema` build a named model; on a `.keras`
    file they were ignored."""
    start = tmp_path / "start.keras"
    tiny_vit(classes=10).save(start)
    code, _, err = run_cli("train", "--model", start, "--data", f"folder:{few_digits_folder}",
                           "--remat", "--out", tmp_path / "run")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "keras-vit: error: model_kwargs={'remat': True} (--remat, --weights-ema) build a "
        f"named model, but the model is {str(start)!r}, which is not built here; give a "
        "named model (e.g. ViTB16), or build the model with them yourself.")
