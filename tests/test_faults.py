"""Nothing lost, nothing silently wrong (issue 17): training faults
(best.keras across resumes, diverged runs, numeric arguments), exports of
Sequential and subclassed classifiers, unreadable .keras files, Keras
weights files of another architecture, channel counts."""

import contextlib
import io
import json
import math
import zipfile

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from data_helpers import make_folder
from keras_vit import _checks, _console, cli
from keras_vit.training.callbacks import BestModelCheckpoint
from keras_vit.weights.official import CheckpointMismatchError

TF = keras.backend.backend() == "tensorflow"
tf_only = pytest.mark.skipif(not TF, reason="the TensorFlow backend's paths")


def tiny_vit(num_layers=1, **kwargs):
    kwargs.setdefault("input_shape", (32, 32, 3))
    kwargs.setdefault("classes", 3)
    return keras_vit.VisionTransformer(patch_size=8, hidden_size=16, num_layers=num_layers,
                                       num_heads=2, mlp_dim=32, **kwargs)


def run_cli(*args):
    """`keras-vit ARGS` in this process: (status, stdout, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = cli.main(list(args), out=out)
        except SystemExit as exit_:  # argparse
            status = exit_.code
    return status, out.getvalue(), [line for line in err.getvalue().splitlines() if line]


# ------------------------------------------------------------ numeric arguments

@pytest.mark.parametrize("args, message", [
    (["train", "--data", "folder:x", "--epochs", "0"],
     "argument --epochs: must be a positive integer, got 0"),
    (["train", "--data", "folder:x", "--steps", "0"],
     "argument --steps: must be a positive integer, got 0"),
    (["train", "--data", "folder:x", "--batch-size", "0"],
     "argument --batch-size: must be a positive integer, got 0"),
    (["train", "--data", "folder:x", "--gradient-accumulation-steps", "0"],
     "argument --gradient-accumulation-steps: must be a positive integer, got 0"),
    (["train", "--data", "folder:x", "--learning-rate", "-1"],
     "argument --learning-rate: must be a finite number > 0, got -1.0"),
    (["train", "--data", "folder:x", "--learning-rate", "nan"],
     "argument --learning-rate: must be a finite number > 0, got nan"),
    (["train", "--data", "folder:x", "--sam-rho", "inf"],
     "argument --sam-rho: must be a finite number > 0, got inf"),
    (["train", "--data", "folder:x", "--holdout", "1"],
     "argument --holdout: must be a number in [0, 1), got 1.0"),
    (["train", "--data", "folder:x", "--epochs", "two"],
     "argument --epochs: must be a positive integer, got 'two'"),
    (["train", "--data", "folder:x", "--process-id", "-1"],
     "argument --process-id: must be an integer >= 0, got -1"),
    (["predict", "a.png", "--top", "0"], "argument --top: must be a positive integer, got 0"),
    (["evaluate", "m.keras", "--data", "folder:x", "--batch-size", "-3"],
     "argument --batch-size: must be a positive integer, got -3"),
    (["export", "m.keras", "--format", "tflite", "--out", "m.tflite",
      "--calibration-samples", "0"],
     "argument --calibration-samples: must be a positive integer, got 0"),
    (["quickstart", "--epochs", "0"], "argument --epochs: must be a positive integer, got 0"),
])
def test_numeric_flags_are_checked_in_one_line(args, message):
    status, _, err = run_cli(*args)
    command = args[0]
    assert status == 2
    assert err == [f"keras-vit {command}: error: {message} (see keras-vit {command} --help)"]


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "epochs must be a positive integer, got 0."),
    ({"steps": 0}, "steps must be a positive integer, got 0."),
    ({"steps": 10, "batch_size": 0}, "batch_size must be a positive integer, got 0."),
    ({"steps": 10, "gradient_accumulation_steps": 0},
     "gradient_accumulation_steps must be a positive integer, got 0."),
    ({"steps": 10, "learning_rate": float("nan")},
     "learning_rate must be a finite number > 0, got nan."),
    ({"steps": 10, "learning_rate": -0.1}, "learning_rate must be a finite number > 0, got -0.1."),
    ({"steps": 2.5}, "steps must be a positive integer, got 2.5."),
])
def test_train_checks_its_numbers_before_any_work(kwargs, message):
    from keras_vit.training import train

    with pytest.raises(ValueError) as info:
        train("ViTTi16", "folder:/nonexistent", **kwargs)
    assert str(info.value) == message


def test_json_lines_are_strict():
    assert _console.json_dumps({"a": float("nan"), "b": [float("inf"), 1.5, np.float32(2)],
                                "c": (np.float64("-inf"), 3)}) == \
        '{"a": null, "b": [null, 1.5, 2.0], "c": [null, 3]}'
    assert _checks.finite_or_none(True) is True


# ------------------------------------------------------------ training faults

@keras.saving.register_keras_serializable(package="keras_vit_tests")
class NaNAfter(keras.layers.Layer):
    """Identity for the first `after` training steps, NaN from then on: a
    run that diverges at a known step."""

    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls")

    def call(self, x, training=False):
        if training:
            self.calls.assign(self.calls + 1.0)
        return x * ops.where(self.calls > self.after, float("nan"), 1.0)

    def get_config(self):
        return {**super().get_config(), "after": self.after}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_folder(str(root), per_class=8, size=32)
    return str(root)


@tf_only
def test_a_diverged_run_exits_1_with_strict_json_and_keeps_the_best_finite_epoch(
        photos, tmp_path):
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Flatten()(x)
    x = NaNAfter(6)(x)  # steps 1-6 finite (epoch 1: 4 steps), NaN from step 7
    outputs = keras.layers.Dense(3)(x)
    path = tmp_path / "start.keras"
    keras.Model(inputs, outputs).save(path)
    out = tmp_path / "run"
    status, stdout, err = run_cli(
        "train", "--model", str(path), "--data", f"folder:{photos}", "--recipe", "scratch",
        "--image-size", "32", "--batch-size", "4", "--epochs", "3", "--steps-per-epoch", "4",
        "--out", str(out), "--quiet", "--json")
    assert status == 1
    results = json.loads(stdout.strip().splitlines()[-1],
                         parse_constant=lambda c: pytest.fail(f"{c} in the JSON line"))
    assert results["status"] == "diverged"
    assert results["diverged_at"] == {"epoch": 2, "batch": 2, "loss": None}
    assert results["val_accuracy"] is None and results["model"] is None
    assert results["best"]["epoch"] == 1 and results["best_model"] == str(out / "best.keras")
    assert not (out / "model.keras").exists()
    assert err[-1] == (
        "keras-vit: error: Training diverged: the loss became nan at epoch 2, batch 2; "
        "model.keras was not written (its weights are not finite). "
        f"{out / 'best.keras'} holds epoch 1 (val_accuracy "
        f"{results['best']['value']:.4f}), the best before it. Try a lower "
        "--learning-rate or a longer warmup.")
    best = keras.saving.load_model(out / "best.keras")
    assert all(np.isfinite(w).all() for w in best.get_weights())
    assert not (out / "backup").exists()  # a rerun starts afresh, not from NaN weights


def _model_file(path):
    tiny_vit().save(path)
    return str(path)


def _callback(tmp_path, resumed_at=None, state=None):
    backup = tmp_path / "backup"
    if resumed_at is not None:
        backup.mkdir()
        (backup / "training_metadata.json").write_text(json.dumps({"epoch": resumed_at,
                                                                   "batch": 0}))
    best = tmp_path / "best.keras"
    if state is not None:
        _model_file(best)
        (tmp_path / "best.keras.json").write_text(json.dumps(state))
    callback = BestModelCheckpoint(best, backup_dir=str(backup))
    callback.set_model(tiny_vit())
    callback.on_train_begin()
    return callback, best


def test_best_keras_is_the_best_of_the_whole_run_across_a_resume(tmp_path):
    state = {"monitor": "val_accuracy", "value": 0.9, "epoch": 2}
    callback, best = _callback(tmp_path, resumed_at=3, state=state)
    before = best.read_bytes()
    callback.on_epoch_end(3, {"val_accuracy": 0.5, "loss": 1.0})  # worse: kept
    assert best.read_bytes() == before
    assert json.loads((tmp_path / "best.keras.json").read_text()) == state
    callback.on_epoch_end(4, {"val_accuracy": 0.95, "loss": float("nan")})  # diverged
    assert best.read_bytes() == before
    callback.on_epoch_end(4, {"val_accuracy": 0.95, "loss": 0.3})  # better
    assert best.read_bytes() != before
    assert json.loads((tmp_path / "best.keras.json").read_text()) == {
        "monitor": "val_accuracy", "value": 0.95, "epoch": 5}
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_a_new_run_does_not_inherit_the_best_value_of_an_old_one(tmp_path):
    callback, best = _callback(tmp_path, resumed_at=None,
                               state={"monitor": "val_accuracy", "value": 0.99, "epoch": 7})
    callback.on_epoch_end(0, {"val_accuracy": 0.1, "loss": 2.0})
    assert json.loads((tmp_path / "best.keras.json").read_text())["epoch"] == 1


# ------------------------------------------------------------ exports of any classifier

def _sequential(build):
    layers = [keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
              keras.layers.Dense(4, activation="softmax")]
    if build == "input":
        return keras.Sequential([keras.Input((16, 16, 3)), *layers])
    model = keras.Sequential(layers)
    model.build((None, 16, 16, 3))
    return model


@tf_only
@pytest.mark.parametrize("build", ["input", "build"])
def test_cli_exports_a_sequential_softmax_classifier(tmp_path, build):
    path = tmp_path / "seq.keras"
    _sequential(build).save(path)
    status, stdout, err = run_cli("export", str(path), "--format", "tflite", "--out",
                                  str(tmp_path / "seq.tflite"), "--json")
    assert status == 0, err
    report = json.loads(stdout)
    assert report["passed"] and report["max_abs_diff"] < 1e-4


@tf_only
def test_subclassed_classifier_exports_with_named_outputs(tmp_path):
    from keras_vit import export

    class Classifier(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.flatten = keras.layers.Flatten()
            self.dense = keras.layers.Dense(4)

        def call(self, x):
            return self.dense(self.flatten(x / 255.0))

    model = Classifier(name="mine")
    with pytest.raises(ValueError, match=(
            r"^'mine' \(Classifier\) has no known input shape: a subclassed model is built by "
            r"its first call\. Call it once on a batch of images, e\.g\. model\(np\.zeros\(\(1, "
            r"224, 224, 3\)\)\), or model\.build\(\(None, 224, 224, 3\)\), before exporting\.$")):
        export.to_tflite(model, tmp_path / "m.tflite", verbose=False)
    model(np.zeros((1, 16, 16, 3), "float32"))
    with pytest.raises(ValueError, match=(
            r"^Cannot tell whether 'mine' outputs logits or probabilities: it is a subclassed "
            r"model \(Classifier\), whose last operation only its call\(\) knows; pass "
            r"outputs='logits' or outputs='probabilities'\.$")):
        export.to_tflite(model, tmp_path / "m.tflite", verbose=False)
    for fn, out in ((export.to_tflite, "m.tflite"), (export.to_saved_model, "m_sm")):
        report = fn(model, tmp_path / out, outputs="logits", verbose=False)
        assert report.passed and report.max_abs_diff < 1e-4


# ------------------------------------------------------------ .keras files

@pytest.mark.parametrize("content", ["text", "truncated", "empty"])
def test_an_unreadable_keras_file_is_called_unreadable_not_missing(tmp_path, content):
    path = tmp_path / "model.keras"
    if content == "text":
        path.write_text("not a model\n")
    elif content == "truncated":
        _model_file(tmp_path / "whole.keras")
        data = (tmp_path / "whole.keras").read_bytes()
        path.write_bytes(data[: len(data) // 2])
    else:
        path.write_bytes(b"")
    size = path.stat().st_size
    expected = (f"MODEL {str(path)!r} exists but is not a readable .keras file (a .keras "
                f"file is a zip archive; this one, {size:,} bytes, is not: truncated by an "
                "interrupted copy or download, or another kind of file renamed).")
    for args in (("evaluate", str(path), "--data", "folder:x"),
                 ("export", str(path), "--format", "tflite", "--out", str(tmp_path / "m.tflite"))):
        status, _, err = run_cli(*args)
        assert (status, err) == (2, [f"keras-vit: error: {expected}"])
    image = tmp_path / "a.png"
    keras.utils.save_img(image, np.zeros((8, 8, 3), "uint8"))
    status, _, err = run_cli("predict", str(image), "--model", str(path))
    assert err == [f"keras-vit: error: {expected.replace('MODEL', '--model', 1)}"]
    status, _, err = run_cli("evaluate", str(tmp_path / "absent.keras"), "--data", "folder:x")
    assert err == [f"keras-vit: error: Model not found: {str(tmp_path / 'absent.keras')!r}."]


def test_a_keras_file_needing_an_unregistered_class_says_what_to_import(tmp_path):
    from keras_vit._saving import load_keras_model

    path = tmp_path / "m.keras"
    _model_file(path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode()
    members["config.json"] = config.replace('"keras_vit>Patches"',
                                            '"keras_vit>Tokenizer"').encode()
    other = tmp_path / "other.keras"
    with zipfile.ZipFile(other, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError) as info:
        load_keras_model(other)
    assert str(info.value) == (
        f"Cannot load {str(other)!r}: it needs keras_vit's 'Tokenizer', which this "
        f"keras_vit ({keras_vit.__version__}) does not have (written by another version?). "
        "Load it with the keras_vit version that wrote it.")


# ------------------------------------------------------------ Keras weights files

def test_keras_weights_of_a_deeper_model_are_refused(tmp_path):
    deep = tiny_vit(num_layers=2)
    path = tmp_path / "deep.weights.h5"
    deep.save_weights(path)
    with pytest.raises(CheckpointMismatchError) as info:
        tiny_vit(num_layers=1, weights=str(path))
    message = str(info.value)
    assert message.startswith(
        f"The Keras weights file {str(path)!r} does not fit 'vision_transformer' (written "
        "by another architecture, e.g. another depth or width): 12 arrays in the file that "
        "the model does not have (layers/transformer_block_1/")
    assert message.endswith("Load it into the model that wrote it (same variant and "
                            "options).")
    assert len(info.value.unexpected) == 12 and not info.value.missing
    with pytest.raises(CheckpointMismatchError, match="12 arrays of the model missing"):
        tiny_vit(num_layers=3, weights=str(path))
    wider = tmp_path / "wide.weights.h5"
    keras_vit.VisionTransformer(patch_size=8, hidden_size=32, num_layers=2, num_heads=2,
                                mlp_dim=32, input_shape=(32, 32, 3),
                                classes=3).save_weights(wider)
    with pytest.raises(CheckpointMismatchError, match="arrays of another shape"):
        tiny_vit(num_layers=2, weights=str(wider))
    same = tiny_vit(num_layers=2, weights=str(path))
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(ops.convert_to_numpy(same(x)),
                                  ops.convert_to_numpy(deep(x)))


# ------------------------------------------------------------ channel counts

@pytest.mark.backends
@pytest.mark.parametrize("preprocessing", [True, False])
@pytest.mark.parametrize("channels", [1, 2, 4])
def test_a_channel_count_other_than_the_models_is_one_value_error(preprocessing, channels):
    model = tiny_vit(include_preprocessing=preprocessing)
    images = np.ones((1, 32, 32, channels), "float32")
    with pytest.raises(ValueError) as info:
        model(images)
    message = str(info.value)
    assert ("The model takes images with 3 channels (RGB); got "
            f"{channels} channel{'s' * (channels > 1)} (shape (1, 32, 32, {channels}))" in message
            or "expected shape=(None, 32, 32, 3), found shape=(1, 32, 32, "
               f"{channels})" in message)  # Keras' own input check (2, 4 channels)
    if channels == 1:
        assert "np.repeat(images, 3, axis=-1)" in message
        gray = ops.convert_to_numpy(model(np.repeat(images, 3, axis=-1)))
        assert np.isfinite(gray).all()


@pytest.mark.backends
def test_a_hybrid_checks_its_channels_too():
    model = keras_vit.VisionTransformer(patch_size=1, hidden_size=16, num_layers=1,
                                        num_heads=2, mlp_dim=32, resnet_layers=(1,),
                                        input_shape=(32, 32, 3), classes=3,
                                        include_preprocessing=False)
    with pytest.raises(ValueError, match=r"takes images with 3 channels \(RGB\); got 1 channel"):
        model(np.ones((1, 32, 32, 1), "float32"))


@tf_only
def test_predict_after_another_shape_still_checks_the_channels():
    """predict() relaxes the traced shape after a batch of another shape
    (the channel count is then unknown when traced): the check runs in the
    graph, with the same sentence, instead of broadcasting a gray batch."""
    import tensorflow as tf

    model = tiny_vit()
    model.predict(np.ones((1, 32, 32, 3), "float32"), verbose=0)
    for channels in (1, 4):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="The model takes images with 3 channels; got another count"):
            model.predict(np.ones((1, 32, 32, channels), "float32"), verbose=0)
    assert model.predict(np.ones((2, 32, 32, 3), "float32"), verbose=0).shape == (2, 3)
    assert not math.isnan(float(model.predict(np.ones((1, 32, 32, 3)), verbose=0)[0, 0]))
