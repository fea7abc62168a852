"""LoRA on keras_vit models (`keras_vit.training.enable_lora`, `--lora`):
Keras' `Dense.enable_lora` on the blocks' Dense layers; only the adapters
and the head train; saving, resuming and exporting give the adapted model's
function, merged into plain kernels."""

import json
import os
import re
import subprocess
import sys
import warnings
import zipfile

import keras
import numpy as np
import pytest

from conftest import predict, process_env, random_weights, run_cli, tiny_mixer, tiny_vit
from keras_vit import training
from keras_vit.layers import MixerBlock, TransformerBlock
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.layers.lora import (
    adapter_values,
    enable_lora,
    lora_layers,
    merge_lora,
    parameter_counts,
)
from keras_vit.training.callbacks import BackupAndRestore
from keras_vit.weights.official import official_params, save_official_weights

IMAGES = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")


def two_block_vit(**overrides):
    return random_weights(tiny_vit(num_layers=2, classifier_activation=None, **overrides))


def trained_adapters(model, seed=1):
    """Nonzero `B`s (as after some training), so that the adapters change
    the function."""
    rng = np.random.default_rng(seed)
    for layer in lora_layers(model):
        layer.lora_kernel_b.assign(rng.normal(size=layer.lora_kernel_b.shape) * 0.3)
    return model


@pytest.mark.backends
def test_only_the_adapters_and_the_head_train():
    model = two_block_vit()
    before = predict(model, IMAGES)
    counts = enable_lora(model, rank=2, seed=0)
    names = sorted(v.path for v in model.trainable_weights)
    assert names == sorted(
        [f"encoderblock_{i}/{layer}/lora_kernel_{ab}" for i in range(2)
         for layer in ("qkv", "attention_output") for ab in "ab"]
        + ["head/bias", "head/kernel"])
    # 16 wide: qkv A 16x2, B 2x48; attention_output A 16x2, B 2x16; head 16x3 + 3
    assert counts == {"parameters": parameter_counts(model)["parameters"],
                      "trainable_parameters": 2 * (32 + 96 + 32 + 32) + 51}
    # B starts at zero: the function is the model's own
    np.testing.assert_allclose(predict(model, IMAGES), before, atol=1e-6)
    frozen = {v.path: keras.ops.convert_to_numpy(v) for v in model.weights if not v.trainable}
    model.compile(keras.optimizers.SGD(0.1), keras.losses.MeanSquaredError())
    model.fit(IMAGES, np.ones((4, 3), "float32"), epochs=2, verbose=0)
    for v in model.weights:
        if v.path in frozen:
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), frozen[v.path])
    assert any(np.abs(keras.ops.convert_to_numpy(layer.lora_kernel_b)).max() > 0
               for layer in lora_layers(model))


@pytest.mark.backends
def test_merged_and_saved_models_compute_the_adapted_function(tmp_path):
    model = trained_adapters(_enabled(two_block_vit(), rank=3, targets=("qkv", "mlp")))
    adapted = predict(model, IMAGES)
    assert np.abs(adapted - predict(model, IMAGES * 0 + IMAGES)).max() == 0
    merged = merge_lora(model)
    assert lora_layers(merged) == [] and len(lora_layers(model)) == 6  # model unchanged
    np.testing.assert_allclose(predict(merged, IMAGES), adapted, atol=1e-5)
    model.save(tmp_path / "m.keras")  # Keras writes merged kernels
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert lora_layers(loaded) == []
    np.testing.assert_allclose(predict(loaded, IMAGES), adapted, atol=1e-5)


def _enabled(model, **kwargs):
    enable_lora(model, **kwargs)
    return model


def test_targets_ranks_and_models_are_checked():
    vit = tiny_vit()
    with pytest.raises(ValueError, match=re.escape(
            "Unknown LoRA targets=('query',); allowed for this model: "
            "('attention_output', 'mlp', 'qkv') (one or more).")):
        enable_lora(vit, 2, targets="query")
    with pytest.raises(ValueError, match=re.escape(
            "rank=17 is larger than the smallest width of the targeted layers (16); "
            "allowed: 1 to 16.")):
        enable_lora(vit, 17)
    with pytest.raises(ValueError, match=re.escape("`rank` must be a positive integer, got 0.")):
        enable_lora(vit, 0)
    enable_lora(vit, 2, targets=["mlp"])
    assert [layer.name for layer in lora_layers(vit)] == ["mlp_dense1", "mlp_dense2"]
    with pytest.raises(ValueError, match=re.escape(
            f"LoRA is already enabled on {vit.name!r}; enable it once")):
        enable_lora(vit, 2)
    mixer = tiny_mixer()
    enable_lora(mixer, 2)  # a Mixer's default: both MLPs
    assert [layer.name for layer in lora_layers(mixer)] == [
        "token_mixing1", "token_mixing2", "channel_mixing1", "channel_mixing2"]
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="plain")
    with pytest.raises(ValueError, match=re.escape(
            "enable_lora needs a keras_vit model with TransformerBlock or MixerBlock "
            "layers; 'plain' has none.")):
        enable_lora(plain, 2)
    quantized = tiny_vit()
    with warnings.catch_warnings():  # Keras names every layer it has no quantize for
        warnings.simplefilter("ignore", UserWarning)
        quantized.quantize("int8")
    with pytest.raises(ValueError, match=re.escape("is quantized (int8); enable LoRA on "
                                                   "the float model, then merge and quantize.")):
        enable_lora(quantized, 2)


def test_a_backup_restores_the_adapters_exactly(tmp_path):
    """Keras' backup holds merged kernels and no adapters, and loading it
    zeroes the adapters (which then never train again: both factors zero).
    keras_vit's backup keeps `W` and the adapters."""
    model = trained_adapters(_enabled(two_block_vit(), rank=2, seed=0))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    adapted = predict(model, IMAGES)
    backup = BackupAndRestore(str(tmp_path / "backup"))
    backup.set_model(model)
    backup.on_epoch_end(0)  # writes the epoch-1 backup
    assert sorted(os.listdir(tmp_path / "backup")) == [
        "latest.weights.h5", "lora_adapters.npz", "random_state.npz",  # (its dropout's)
        "training_metadata.json"]

    resumed = _enabled(two_block_vit(), rank=2, seed=5)  # other adapters, same W
    resumed.compile(keras.optimizers.SGD(0.1), "mse")
    restore = BackupAndRestore(str(tmp_path / "backup"))
    restore.set_model(resumed)
    restore.on_train_begin()
    np.testing.assert_array_equal(predict(resumed, IMAGES), adapted)
    for path, value in adapter_values(model).items():
        np.testing.assert_array_equal(adapter_values(resumed)[path], value)

    adapters = tmp_path / "backup" / "lora_adapters.npz"
    good = adapters.read_bytes()
    with zipfile.ZipFile(adapters, "w", zipfile.ZIP_DEFLATED) as archive:  # 64 MB of zeros
        archive.writestr("encoderblock_0/qkv/lora_kernel_a.npy", bytes(64 << 20))
    with pytest.raises(ValueError, match=re.escape(
            "is not a LoRA backup of this model: its member "
            "'encoderblock_0/qkv/lora_kernel_a.npy' holds 67,108,864 bytes, more than the "
            "model's adapter of that name; start the run afresh (--overwrite).")):
        restore.on_train_begin()
    adapters.write_bytes(good)
    (tmp_path / "backup" / "training_metadata.json").write_text('{"epoch": 2, "batch": 0}')
    stale = BackupAndRestore(str(tmp_path / "backup"))
    stale.set_model(resumed)
    with pytest.raises(ValueError, match=re.escape(
            "holds epoch 2 but no LoRA adapters of that epoch (the run was stopped while "
            "writing it); start the run afresh (--overwrite).")):
        stale.on_train_begin()


def test_official_weights_of_an_adapted_model_are_merged(tmp_path):
    model = trained_adapters(_enabled(two_block_vit(), rank=2))
    path = save_official_weights(model, tmp_path / "w.npz")
    reloaded = tiny_vit(num_layers=2, classifier_activation=None, weights=path)
    np.testing.assert_allclose(predict(reloaded, IMAGES), predict(model, IMAGES), atol=1e-5)
    with pytest.raises(ValueError, match=re.escape(
            "has LoRA adapters: its kernels are W + (alpha / rank) * A @ B, which official "
            "checkpoints do not hold; merge them first (keras_vit.training.merge_lora(model)).")):
        official_params(model)


def test_an_export_of_an_adapted_model_is_merged_and_verified(tmp_path):
    from keras_vit import export

    model = trained_adapters(_enabled(two_block_vit(), rank=2))
    report = export.to_saved_model(model, tmp_path / "sm", validation_data=IMAGES,
                                   verbose=False)
    assert report.passed
    import tensorflow as tf

    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    assert not [v.name for v in loaded.variables if "lora" in v.name]
    assert [v.name for v in loaded.variables if "kernel" in v.name]  # plain kernels
    pixels = IMAGES.astype("uint8")
    logits = loaded.signatures["serving_default"](images=tf.constant(pixels))
    np.testing.assert_allclose(logits["logits"].numpy(),
                               predict(model, pixels.astype("float32")), atol=1e-4)


def _cli_train(start, data, out, *flags):
    code, stdout, err = run_cli(
        "train", "--model", start, "--data", f"folder:{data}", "--recipe", "scratch",
        "--batch-size", "30", "--epochs", "2", "--out", out, "--json", *flags)
    assert code == 0, err[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_cli_fine_tuning_runs_save_models_a_fresh_process_loads(tmp_path, few_digits_folder):
    """`--lora` (merged model.keras), and `--layer-decay` with `--ema` (whose
    optimizer, saved with the model, `import keras_vit` registers): both
    load in a fresh process, safe mode on, without a warning."""
    start = tmp_path / "start.keras"
    tiny_vit(num_layers=2, classifier="gap", classes=10, classifier_activation=None).save(start)
    results = _cli_train(start, few_digits_folder, tmp_path / "lora", "--lora", "2",
                         "--lora-targets", "qkv,mlp")
    # qkv A 16x2 B 2x48, mlp_dense1 A 16x2 B 2x32, mlp_dense2 A 32x2 B 2x16, per block
    adapters = 2 * (32 + 96 + 32 + 64 + 64 + 32)
    assert results["trainable_parameters"] == adapters + 16 * 10 + 10
    assert results["parameters"] == results["summary"]["parameters"] > adapters
    assert results["lora"] == {"rank": 2, "targets": ["qkv", "mlp"], "default_targets": False,
                               "layers": 6}
    assert results["remat"] is False and results["summary"]["remat"] is False
    assert json.loads((tmp_path / "lora" / "run.json").read_text())["config"][
        "lora_rank"] == 2
    tools = _cli_train(start, few_digits_folder, tmp_path / "tools", "--layer-decay", "0.7",
                       "--ema", "0.9")
    assert tools["layer_decay"] == 0.7 and tools["ema"] == {"decay": 0.9,
                                                           "weights_saved": "ema"}
    assert tools["trainable_parameters"] == tools["parameters"] and tools["lora"] is None
    code = ("import sys, json, keras, numpy as np, keras_vit\n"
            "from keras_vit.layers.lora import lora_layers\n"
            "x = np.load(sys.argv[1])\n"
            "ms = [keras.saving.load_model(p, safe_mode=True) for p in sys.argv[2:]]\n"
            "print(json.dumps([[len(lora_layers(m)), type(getattr(m, 'optimizer', None)).__name__, "
            "np.asarray(m(x)).tolist()] for m in ms]))")
    np.save(tmp_path / "x.npy", IMAGES)
    paths = [tmp_path / "lora" / "model.keras", tmp_path / "tools" / "model.keras"]
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code,
                             tmp_path / "x.npy", *paths],
                            capture_output=True, text=True, env=process_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    # (with the adapters' optimizer state saved, Keras warned that it skipped it;
    # now no model.keras holds an optimizer: the run's backup kept its state)
    (adapted, lora_optimizer, lora_logits), (_, optimizer, tools_logits) = json.loads(
        result.stdout.strip().splitlines()[-1])
    assert adapted == 0 and lora_optimizer == optimizer == "NoneType"
    for path, logits in zip(paths, (lora_logits, tools_logits), strict=True):
        np.testing.assert_allclose(logits, predict(keras.saving.load_model(path), IMAGES),
                                   atol=1e-5)


def test_lora_flags_are_checked_before_any_work(tmp_path):
    code, _, err = run_cli("train", "--model", "ViTTi16", "--data", "folder:/nowhere",
                           "--lora-targets", "qkv", "--out", tmp_path / "run")
    assert code == 2 and err.strip().splitlines()[-1] == (
        "keras-vit: error: lora_targets=('qkv',) (--lora-targets) needs lora_rank "
        "(--lora RANK).")
    code, _, err = run_cli("train", "--model", "ViTTi16", "--data", "folder:/nowhere",
                           "--lora", "0", "--out", tmp_path / "run")
    assert code == 2 and "argument --lora: must be a positive integer, got 0 (see" in err
    with pytest.raises(TypeError, match=re.escape(
            "`lora_rank` must be a positive integer, got 1.5.")):
        training.train("ViTTi16", "folder:/nowhere", lora_rank=1.5)
    assert not (tmp_path / "run").exists()


def test_encoder_blocks_are_both_kinds_in_depth_order_nested_models_included():
    vit, mixer = tiny_vit(), tiny_mixer()
    blocks = encoder_blocks(vit)
    assert blocks and all(isinstance(b, TransformerBlock) for b in blocks)
    assert [b.name for b in blocks] == [f"encoderblock_{i}" for i in range(len(blocks))]
    assert encoder_blocks(mixer) and all(isinstance(b, MixerBlock) for b in encoder_blocks(mixer))
    outer = keras.Sequential([vit])
    assert encoder_blocks(outer) == blocks
