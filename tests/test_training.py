"""keras_vit.training: schedules, weight decay, SAM, strategies, resume,
BestModelCheckpoint, the CLI and the quickstart."""

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from official_fixtures import REPO_ROOT

from conftest import run_cli, run_cli_process, tiny_keras_file, tiny_vit, xla_flags
from keras_vit import training
from keras_vit.training.callbacks import BestModelCheckpoint


def test_warmup_cosine_known_answers():
    s = training.WarmupDecay(0.03, total_steps=1000, warmup_steps=100)
    values = [float(s(step)) for step in (0, 50, 100, 550, 1000, 2000)]
    np.testing.assert_allclose(values, [0.0, 0.015, 0.03, 0.015, 0.0, 0.0], atol=1e-9)
    # cosine at a quarter of the decay: 0.03 * 0.5 * (1 + cos(pi / 4))
    np.testing.assert_allclose(float(s(325)), 0.03 * 0.5 * (1 + np.cos(np.pi / 4)), rtol=1e-6)
    linear = training.WarmupDecay(1.0, total_steps=110, warmup_steps=10, decay="linear")
    np.testing.assert_allclose(float(linear(60)), 1e-5 + (1 - 1e-5) * 0.5, rtol=1e-6)
    again = training.WarmupDecay.from_config(s.get_config())
    assert float(again(550)) == float(s(550))
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(s))
    assert isinstance(revived, training.WarmupDecay)


def test_schedule_errors():
    with pytest.raises(ValueError, match=r"Unknown decay 'step'; allowed: \('cosine', 'linear'\)\."):
        training.WarmupDecay(0.1, 10, decay="step")
    with pytest.raises(ValueError, match=r"total_steps=5 must exceed warmup_steps=5\."):
        training.WarmupDecay(0.1, 5, 5)


def test_recipes_build_their_optimizers():
    finetune = training.make_optimizer("finetune", 10_000)
    assert isinstance(finetune, keras.optimizers.SGD) and finetune.momentum == 0.9
    assert finetune.global_clipnorm == 1.0
    assert float(finetune.learning_rate) == 0.0  # step 0 of the warmup
    schedule = finetune._learning_rate
    assert (schedule.base_lr, schedule.warmup_steps) == (0.03, 500)
    augreg = training.make_optimizer("augreg", 100_000)
    assert isinstance(augreg, keras.optimizers.AdamW) and augreg.weight_decay == 0.1
    assert augreg._learning_rate.warmup_steps == 10_000
    with pytest.raises(ValueError, match=r"Unknown recipe 'fast'; allowed: \['augreg', 'finetune', 'scratch'\]\."):
        training.get_recipe("fast")


def test_weight_decay_skips_norms_biases_position_embedding_and_class_token():
    model = tiny_vit(patch_size=4, input_shape=(8, 8, 3))
    for v in model.trainable_variables:
        v.assign(np.ones(v.shape, "float32"))
    optimizer = training.make_optimizer(training.Recipe(
        "wd", "adamw", 0.5, 0, 0.1, 8, 8, "eval"), total_steps=10)
    optimizer.build(model.trainable_variables)
    optimizer.iterations.assign(5)  # mid-schedule: lr > 0
    zeros = [tf.zeros_like(v) for v in model.trainable_variables]
    optimizer.apply(zeros, model.trainable_variables)
    changed = {v.path: float(np.abs(v.numpy() - 1).max()) > 0 for v in model.trainable_variables}
    by_name = {path.split("/")[-1]: c for path, c in changed.items()}
    assert not any(c for p, c in changed.items()
                   if p.split("/")[-1] in training.NO_DECAY), changed
    assert changed["patch_encoder/kernel"] and changed["encoderblock_0/qkv/kernel"]
    assert not by_name["position_embedding"] and not by_name["class_token"]


def tiny_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(2)])


def test_sam_step_equals_the_hand_computed_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 2, 8), 2)
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    rho, lr = 0.1, 0.5

    reference = tiny_model()
    w = [v.numpy() for v in reference.trainable_variables]
    with tf.GradientTape() as tape:
        loss = loss_fn(y, reference(x))
    g = tape.gradient(loss, reference.trainable_variables)
    norm = np.sqrt(sum(float(np.sum(gi.numpy() ** 2)) for gi in g))
    for v, gi in zip(reference.trainable_variables, g, strict=True):
        v.assign_add(rho * gi / (norm + 1e-12))  # the ascent, then the gradient there
    with tf.GradientTape() as tape:
        loss = loss_fn(y, reference(x))
    g_sam = tape.gradient(loss, reference.trainable_variables)
    expected = [wi - lr * gi.numpy() for wi, gi in zip(w, g_sam, strict=True)]
    plain = [wi - lr * gi.numpy() for wi, gi in zip(w, g, strict=True)]

    model = tiny_model()
    sam = training.SAMModel(model, rho=rho)
    sam.compile(keras.optimizers.SGD(lr), loss_fn)
    sam.train_on_batch(x, y)
    for got, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    assert max(np.abs(a - b).max() for a, b in zip(model.get_weights(), plain, strict=True)) > 1e-3


def test_sam_with_fit_logs_loss_and_saves_the_inner_model(tmp_path):
    model = tiny_model()
    sam = training.SAMModel(model, rho=0.05)
    sam.compile(keras.optimizers.SGD(0.1), keras.losses.CategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
    x = np.random.default_rng(1).normal(size=(32, 3)).astype("float32")
    y = keras.utils.to_categorical((x[:, 0] > 0).astype(int), 2)
    history = sam.fit(x, y, epochs=3, batch_size=8, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    sam.model.save(tmp_path / "inner.keras")
    with pytest.raises(ValueError,
                       match=r"`rho` must be a finite number > 0 \(the SAM radius\), got 0\."):
        training.SAMModel(model, rho=0)


def strategy_runs(*scenarios):
    """tests/strategy_runs.py SCENARIOS in one fresh process (2 logical CPU
    devices): {scenario: its JSON line}."""
    result = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "strategy_runs.py"),
                             *scenarios], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()[-len(scenarios):]]
    assert [line["scenario"] for line in lines] == list(scenarios), result.stdout
    return {line["scenario"]: line for line in lines}


@pytest.fixture(scope="module")
def two_device_runs():
    """`mirrored` and `sam_m_sharpness`, one process start for both."""
    return strategy_runs("mirrored", "sam_m_sharpness")


def test_mirrored_on_two_cpu_devices_matches_single_device(two_device_runs):
    result = two_device_runs["mirrored"]
    assert result["replicas"] == 2
    assert result["max_weight_diff"] < 1e-5  # float32 summation order only


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(command, n=2, outputs=None):
    """Starts `command` as `n` MultiWorkerMirrored workers on 127.0.0.1
    (TF_CONFIG, free ports); returns their stdouts."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(n)]}
    processes = []
    for index in range(n):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}))
        if outputs:
            env["WEIGHTS_OUT"] = str(outputs[index])
        processes.append(subprocess.Popen(command, cwd=REPO_ROOT, env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    stdouts = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stdout[-2000:] + stderr[-3000:]
        stdouts.append(stdout)
    return stdouts


def load_npz(path):
    arrays = np.load(path)
    return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


def test_multi_worker_mirrored_two_processes_match_single_process(tmp_path):
    """Two worker processes (global batch 8, 4 per worker) end with
    identical weights, equal to one process taking the same 3 steps (this
    one: strategy_runs' `single` scenario, run here)."""
    from strategy_runs import run  # the script's model, data and fit; TensorFlow only

    script = [sys.executable, str(REPO_ROOT / "tests" / "strategy_runs.py")]
    outputs = [tmp_path / "worker0.npz", tmp_path / "worker1.npz"]
    results = [json.loads(out.strip().splitlines()[-1])
               for out in run_workers(script + ["multiworker"], outputs=outputs)]
    assert [r["replicas"] for r in results] == [2, 2]
    alone, _ = run(tf.distribute.get_strategy())
    worker0, worker1 = (load_npz(p) for p in outputs)
    assert all(np.array_equal(a, b) for a, b in zip(worker0, worker1, strict=True))
    assert max(float(np.abs(a - b).max()) for a, b in zip(worker0, alone, strict=True)) < 1e-6


@pytest.mark.long
def test_cli_train_on_two_workers(few_digits_folder, tmp_path):
    """`keras-vit train` under TF_CONFIG: the chief writes the run, the
    other worker writes under out/workers/1, and both models are equal.
    (On the ten digits' 60 + 30 scans: the quickstart's 1,797 cost each worker
    about 4 s more to read.)"""
    model = digits_model(tmp_path / "start.keras")
    out = tmp_path / "run"
    stdouts = run_workers([sys.executable, "-m", "keras_vit.cli", "train", "--model", model,
                           "--data", f"folder:{few_digits_folder}", "--recipe", "scratch",
                           "--image-size", "32", "--batch-size", "32", "--epochs", "2",
                           "--steps-per-epoch", "3", "--out", str(out), "--quiet"])
    chief, other = (json.loads(s.strip().splitlines()[-1]) for s in stdouts)
    assert chief["replicas"] == other["replicas"] == 2
    assert chief["model"] == str(out / "model.keras")
    assert other["model"] == str(out / "workers" / "1" / "model.keras")
    assert chief["val_accuracy"] == other["val_accuracy"]
    weights = [keras.saving.load_model(r["model"]).get_weights() for r in (chief, other)]
    assert all(np.array_equal(a, b) for a, b in zip(*weights, strict=True))


def test_sam_under_mirrored_is_per_replica_m_sharpness(two_device_runs):
    """Each replica perturbs with its own half-batch gradient (m-sharpness):
    equal to the hand-computed two-halves reference."""
    assert two_device_runs["sam_m_sharpness"]["max_weight_diff"] < 1e-6


def test_get_strategy_names():
    assert training.get_strategy("default") is tf.distribute.get_strategy()
    assert training.get_strategy("auto").num_replicas_in_sync == 1
    with pytest.raises(ValueError, match=r"Unknown strategy 'gpu'; allowed: "):
        training.get_strategy("gpu")


def test_a_strategy_is_described_for_the_final_json_line():
    from keras_vit.training.strategy import describe_strategy

    default = tf.distribute.get_strategy()
    assert describe_strategy(default) == {
        "backend": keras.backend.backend(), "kind": type(default).__name__, "devices": 1,
        "processes": 1}


def digits_model(path):
    """The tiny ViT (conftest.py) with a 10-class logits head, saved at `path`."""
    return tiny_keras_file(path, classifier="gap", classes=10, classifier_activation=None)


def cli(*args, env=None):
    """`keras-vit ARGS` succeeds; its final JSON line. In this process; with
    `env` (another backend) in a fresh process."""
    if env:
        result = run_cli_process(*args, env={"TF_CPP_MIN_LOG_LEVEL": "2", **env}, timeout=900)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        stdout = result.stdout
    else:
        code, stdout, stderr = run_cli(*args)
        assert code == 0, stdout[-2000:] + stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def test_cli_train_and_evaluate_end_with_json(digits_folder, tmp_path):
    model = digits_model(tmp_path / "start.keras")
    out = tmp_path / "run"
    results = cli("train", "--model", model, "--data", f"folder:{digits_folder}", "--recipe",
                  "scratch", "--image-size", "32", "--batch-size", "64", "--epochs", "2",
                  "--steps-per-epoch", "10", "--out", str(out), "--quiet", "--sam-rho", "0.05")
    assert results["epochs"] == 2 and results["sam_rho"] == 0.05
    assert 0.0 <= results["val_accuracy"] <= 1.0
    for key in ("model", "best_model", "log"):
        assert os.path.exists(results[key]), key
    evaluated = cli("evaluate", results["model"], "--data", f"folder:{digits_folder}", "--json")
    assert abs(evaluated["accuracy"] - results["val_accuracy"]) < 1e-6


@pytest.mark.long
def test_jit_compile_on_trains_with_xla_on_the_cpu(few_digits_folder, tmp_path, monkeypatch):
    """docs/training.md suggests `jit_compile=True` (`--jit-compile on`) for
    float32 on one CPU (TensorFlow's "auto" leaves XLA off there): the
    XLA-compiled step trains, with SAM and gradient accumulation, and moves
    the weights. (Marked `long`: 48 s in CI's two-worker run, 10-15 s
    alone; collected late, it could run alone at the end.)"""
    compiled = []
    compile_ = keras.Model.compile

    def spy(self, *args, **kwargs):
        compiled.append(kwargs.get("jit_compile"))
        return compile_(self, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "compile", spy)
    model = digits_model(tmp_path / "start.keras")
    code, out, err = run_cli(
        "train", "--model", model, "--data", f"folder:{few_digits_folder}", "--recipe",
        "scratch", "--image-size", 32, "--batch-size", 6, "--epochs", 1, "--steps-per-epoch",
        4, "--gradient-accumulation-steps", 2, "--sam-rho", 0.05, "--jit-compile", "on",
        "--out", tmp_path / "run")
    assert code == 0, err
    results = json.loads(out)
    assert compiled == [True]
    assert results["summary"]["jit_compile"] is True
    assert "\n  step        XLA (jit_compile=True)\n" in err  # the summary before training
    assert results["sam_rho"] == 0.05 and np.isfinite(results["val_loss"])
    before = keras.saving.load_model(model).get_weights()
    after = keras.saving.load_model(results["model"]).get_weights()
    assert max(np.abs(a - b).max() for a, b in zip(after, before, strict=True)) > 1e-4


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_jit_compile_takes_true_false_or_auto(value, tmp_path):
    with pytest.raises(TypeError, match=re.escape(
            f'`jit_compile` must be True or False (or "auto"), got {value!r}.')):
        training.train("ViTTi16", "folder:/nowhere", jit_compile=value,
                       out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_cli_jit_compile_takes_auto_on_or_off(tmp_path):
    code, _, err = run_cli("train", "--model", "ViTTi16", "--data", "folder:/nowhere",
                           "--jit-compile", "yes", "--out", tmp_path / "run")
    assert code == 2 and err.strip() == (
        "keras-vit train: error: argument --jit-compile: invalid choice: 'yes' (choose "
        "from 'auto', 'off', 'on') (see keras-vit train --help)")


# JAX: SAM's JAX train step under DataParallel over 2 CPU devices, killed
# and resumed the same way.
KILL_RUNS = {"tensorflow": ({}, []),
             "jax-data-sam": ({"KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                               "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2")},
                              ["--distribution", "data", "--sam-rho", "0.05"])}


@pytest.mark.long
@pytest.mark.parametrize("run", list(KILL_RUNS))
def test_killed_training_resumes_from_the_backup(digits_folder, tmp_path, run):
    """(JAX: both processes share the test run's persistent compilation
    cache (conftest), so the resumed one loads the train and validation
    steps that the killed one compiled: about 9 s less of the resumed run,
    the same executables. Epochs of 20 steps, not 40: 2-5 s less of each
    run; the kill, polled every 50 ms, still has three epochs to land in
    before the run would end.)"""
    env, flags = KILL_RUNS[run]
    model = digits_model(tmp_path / "start.keras")
    out = tmp_path / "run"
    args = [sys.executable, "-m", "keras_vit.cli", "train", "--model", model, "--data",
            f"folder:{digits_folder}", "--recipe", "scratch", "--image-size", "32",
            "--batch-size", "32", "--epochs", "5", "--steps-per-epoch", "20",
            "--out", str(out), "--quiet", *flags]
    process = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **env))
    log = out / "log.csv"
    record = out / "backup" / "training_metadata.json"  # renamed into place whole
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if json.loads(record.read_text())["epoch"] >= 2:  # (log.csv's row comes first)
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # mid-epoch 3, after the epoch-2 backup
    process.wait(timeout=60)
    assert (out / "backup").exists()
    results = cli(*args[3:], env=env)  # resumed (TensorFlow: in this process)
    if env:
        assert results["distribution"]["kind"] == "data"
        assert results["distribution"]["devices"] == 2 and results["sam_rho"] == 0.05
    assert results["first_epoch_run_now"] >= 3  # resumed, not restarted (counted from 1)
    assert results["epochs_run_now"] == 5 - results["first_epoch_run_now"] + 1
    rows = list(csv.DictReader(open(log)))
    epochs = [int(row["epoch"]) for row in rows]
    assert epochs[-1] == 5 and epochs.count(1) == 1  # log.csv counts from 1
    assert not (out / "backup").exists()  # removed after a finished run
    # best.keras: the best epoch of the whole run, the epochs before the kill
    # included (the first epoch after a resume used to overwrite it)
    values = [float(row["val_accuracy"]) for row in rows]
    best = json.loads((out / "best.keras.json").read_text())
    assert best == results["best"]
    assert best["value"] == pytest.approx(max(values), abs=1e-6)
    assert best["epoch"] == epochs[values.index(max(values))]
    # (in this process: a JAX run's best.keras scores the same on TensorFlow)
    evaluated = cli("evaluate", str(out / "best.keras"), "--data", f"folder:{digits_folder}",
                    "--json")
    assert evaluated["accuracy"] == pytest.approx(best["value"], abs=1e-6)


@pytest.mark.long
@pytest.mark.backends
@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="TensorFlow: test_quickstart_reduced; JAX: the same code as torch")
def test_quickstart_on_torch_trains_there_and_exports_in_tensorflow(tmp_path):
    """10 of the quickstart's 40 epochs on torch (one device, eager); the
    TFLite export runs in a TensorFlow process on the saved model.keras
    and verifies on the 360 test digits (JAX takes the same path). The
    full 40 epochs reach 97.8% on torch (README). Marked `long`: with one
    OpenMP thread per xdist worker (conftest's `_threads_for_tests`) it runs
    beside the other tests at the speed it has alone, and the torch run ends
    with it (87 s on 2 cores; 96 s collected late)."""
    results = training.quickstart(str(tmp_path / "qs"), epochs=10, verbose=0)
    assert results["distribution"]["backend"] == "torch"
    assert results["test_accuracy"] >= 0.7, results["test_accuracy"]
    report = results["tflite_report"]
    assert report["passed"] and report["validation"]["images"] == 360
    assert report["top1_agreement"] >= 0.99
    assert results["tflite"] == str(tmp_path / "qs" / "model_dynamic_int8.tflite")


@pytest.mark.backends
@pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch has no SAM step")
def test_sam_on_torch_is_one_sentence_before_any_work(tmp_path):
    message = ("SAM (sam_rho=0.05) has TensorFlow and JAX train steps only; train with "
               "KERAS_BACKEND=jax or tensorflow, or without SAM on torch.")
    with pytest.raises(ValueError, match=re.escape(message)):
        training.train("ViTTi16", "folder:does-not-matter", sam_rho=0.05, epochs=1,
                       out=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=re.escape(message)):
        training.SAMModel(keras.Sequential([keras.layers.Dense(1)]), rho=0.05)
    assert not (tmp_path / "run").exists()


@pytest.mark.long
def test_quickstart_reduced(tmp_path):
    """10 of the 40 epochs (seed 0: 83.1% measured on an Intel Xeon,
    2026-11-27, 84.7% on an earlier CPU; a rerun on the same CPU repeats it
    to the digit: far above the 10% of chance, so the quickstart trains);
    the full run is measured in the README. The model is exported to
    dynamic-int8 TFLite and verified on the 360 test digits (99.7%
    agreement measured); full int8 on the same real data keeps >= 97% top-1
    agreement (the bar for int8; 98.6% measured). (16 epochs measured 94.4%,
    and 99.7% and 99.2% agreement; 6 epochs are too few: the dynamic-int8
    export then misses its 99% agreement.)"""
    from keras_vit import export

    out = tmp_path / "qs"
    results = training.quickstart(str(out), epochs=10, verbose=0)
    assert results["test_accuracy"] >= 0.75
    assert results["test_loss_is"] == ("the training loss on the test images: cross-entropy "
                                       "with label smoothing 0.1")  # not evaluate's
    assert results["train_examples"] == 1437 and results["test_examples"] == 360
    assert os.path.exists(results["model"])
    loaded = keras.saving.load_model(results["model"])
    assert loaded.output_shape == (None, 10)
    report = results["tflite_report"]
    assert results["tflite"] == str(out / "model_dynamic_int8.tflite")
    assert report["quantization"] == "dynamic" and report["passed"]
    assert report["validation"]["images"] == 360 and report["top1_agreement"] >= 0.99
    assert report["validation"]["split"] == "test" and report["validation"]["classes"] == 10
    int8 = export.to_tflite(loaded, tmp_path / "int8.tflite", quantization="int8",
                            representative_data=f"folder:{out / 'digits'}",
                            latency_repeats=3, verbose=False)
    # calibrated on a stratified sample of the training digits, verified on
    # all 360 test digits (the defaults; never the calibration images)
    assert int8.calibration == {"split": "train", "images": 500, "classes": 10,
                                "source": f"folder:{out / 'digits'}"}
    assert int8.validation["images"] == 360 and int8.validation["split"] == "test"
    assert int8.top1_agreement >= 0.97


# That a trained model (the recipe's optimizer, WarmupDecay) loads after
# `import keras_vit` alone, without the trainer: one fresh process,
# test_console.py::test_import_keras_vit_registers_everything_for_load_model.


def test_mixed_bfloat16_training_runs(digits_folder, tmp_path, monkeypatch, caplog):
    """... and says once that it is emulated on a CPU without bfloat16
    instructions (flags given: the test's CPU may have them)."""
    from keras_vit.training import precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    monkeypatch.setattr(precision, "backend_runs_on_cpu", lambda: True)
    monkeypatch.setattr(precision, "_warned", set())
    training.set_precision("mixed_bfloat16")
    model = tiny_vit(classes=10, classifier_activation=None)
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    with caplog.at_level("WARNING", logger="keras_vit"):
        results = training.train(model, f"folder:{digits_folder}", recipe="scratch",
                                 image_size=32, batch_size=32, epochs=1, steps_per_epoch=4,
                                 precision="mixed_bfloat16", strategy="default",
                                 out=str(tmp_path / "run"), verbose=0)
    assert np.isfinite(results["val_loss"]) and results["precision"] == "mixed_bfloat16"
    assert [r.getMessage() for r in caplog.records if "emulated" in r.getMessage()] == [
        "mixed_bfloat16 is emulated on this CPU (its flags in /proc/cpuinfo have none of "
        "avx512_bf16, amx_bf16, bf16): bfloat16 math runs in software, several times slower "
        "than float32; --precision float32 trains faster here."]
    keras.config.set_dtype_policy("float32")


def test_train_traces_its_step_once(digits_folder, tmp_path):
    """The optimizer's and the metrics' variables exist before `fit`
    (`_compat.build_before_fit`), so that `tf.function` traces the train
    step once, not a second time because the first trace created them."""
    model = tiny_vit(classes=10, classifier_activation=None)
    traced, step = [], model.train_step
    model.train_step = lambda data: (traced.append(1), step(data))[1]
    results = training.train(model, f"folder:{digits_folder}", recipe="scratch",
                             image_size=32, batch_size=16, epochs=1, steps_per_epoch=2,
                             strategy="default", out=str(tmp_path / "run"), verbose=0)
    assert np.isfinite(results["val_loss"]) and len(traced) == 1


# --- BestModelCheckpoint -------------------------------------------------------

def _callback(tmp_path, resumed_at=None, state=None):
    backup = tmp_path / "backup"
    if resumed_at is not None:
        backup.mkdir()
        (backup / "training_metadata.json").write_text(json.dumps({"epoch": resumed_at,
                                                                   "batch": 0}))
        (backup / "latest.weights.h5").write_bytes(b"")  # (what the reader asks for)
    best = tmp_path / "best.keras"
    if state is not None:
        tiny_keras_file(best)
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
