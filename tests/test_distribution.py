"""JAX `keras.distribution` training (keras_vit.training.distribution):
data and model parallel over 4 CPU devices and two processes joined
through jax.distributed on 127.0.0.1 end where one device ends; the specs
and their errors; `keras-vit train --distribution` on JAX."""

import json
import os
import re
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest
from data_helpers import write_digit_folder

import keras_vit
from conftest import run_cli, tiny_keras_file, tiny_mixer, tiny_vit, xla_flags
from keras_vit.training import distribution as dist

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distribution_worker.py")
ROOT = os.path.dirname(HERE)

pytest.importorskip("jax")


def jax_env(devices):
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="",
               XLA_FLAGS=xla_flags(f"--xla_force_host_platform_device_count={devices}"),
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    for name in dist.ENV.values():
        env.pop(name, None)
    return env


def train_workers(tmp_path, devices, *specs, flags=(), timeout=300):
    """Trains under each of `specs`, one after the other, in one worker process
    with `devices` CPU devices (one process start for all); returns
    {spec: (final weights, the run's DISTRIBUTION line)}."""
    outs = {spec: tmp_path / f"{spec.replace(':', '_')}.npz" for spec in specs}
    command = [sys.executable, WORKER, specs[0], str(outs[specs[0]]), *flags]
    for spec in specs[1:]:
        command += ["--then", spec, str(outs[spec])]
    result = subprocess.run(command, env=jax_env(devices), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("DISTRIBUTION")]
    assert len(lines) == len(specs), result.stdout
    return {spec: (dict(np.load(outs[spec])), line) for spec, line in zip(specs, lines,
                                                                          strict=True)}


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """One process with 4 CPU devices (one process start for all) runs
    `none` (no distribution: the model lives on one device), then `data`,
    then `model:2`; then SAM (rho 0.05, SGD): `hand-sam`, the hand
    reference on one device, and `sam+data`, SAMModel under `data`."""
    return train_workers(tmp_path_factory.mktemp("runs"), 4, "none", "data", "model:2",
                         "hand-sam", "sam+data", flags=("--sam-rho", "0.05"))


@pytest.fixture(scope="module")
def one_device(four_devices):
    """The weights of the run on one device: the reference."""
    return four_devices["none"][0]


def assert_same_weights(got, expected):
    assert got.keys() == expected.keys()
    # Three AdamW steps at 1e-2 moved every kernel: the comparison means something.
    moved = [np.abs(expected[k] - expected["initial." + k]).max()
             for k in expected if k.endswith("kernel") and not k.startswith("initial.")]
    assert min(moved) > 1e-3, moved
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], atol=1e-5, rtol=0, err_msg=key)


def test_data_parallel_over_4_devices_ends_with_the_one_device_weights(four_devices,
                                                                        one_device):
    weights, stdout = four_devices["data"]
    assert "'kind': 'data', 'devices': 4, 'processes': 1" in stdout
    assert_same_weights(weights, one_device)


def test_model_parallel_2x2_splits_the_kernels_and_ends_with_the_same_weights(
        four_devices, one_device):
    weights, stdout = four_devices["model:2"]
    assert "'kind': 'model:2', 'devices': 4, 'processes': 1" in stdout
    assert "'mesh': {'batch': 2, 'model': 2}" in stdout
    sharding = stdout.split("SHARDING", 1)[1]
    for path, axes in (("qkv/kernel", "None, 'model'"), ("mlp_dense1/kernel", "None, 'model'"),
                       ("attention_output/kernel", "'model', None"),
                       ("mlp_dense2/kernel", "'model', None")):
        assert re.search(rf"'encoderblock_0/{path}': \"P(artitionSpec)?\({axes}\)\"",
                         sharding), (path, sharding)
    assert_same_weights(weights, one_device)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_processes(command, devices):
    """Runs `command + [--coordinator ... --num-processes 2 --process-id i]`
    for i = 0, 1 at once; returns both (returncode, stdout, stderr)."""
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen(
        command + ["--coordinator", coordinator, "--num-processes", "2", "--process-id", str(i)],
        env=jax_env(devices), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)]
    try:
        outputs = [p.communicate(timeout=400) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, *output) for p, output in zip(procs, outputs, strict=True)]


TWO_PROCESS_SPECS = ("data", "model:4")


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Two worker processes x 2 CPU devices joined through jax.distributed
    run `data`, then `model:4` (one pair of process starts for both):
    {spec: (the final weights, [each process' DISTRIBUTION line])}."""
    folder = tmp_path_factory.mktemp("two")
    outs = {spec: folder / f"{spec.replace(':', '_')}.npz" for spec in TWO_PROCESS_SPECS}
    command = [sys.executable, WORKER, "data", str(outs["data"]),
               "--then", "model:4", str(outs["model:4"])]
    lines = {spec: [] for spec in outs}
    for code, stdout, stderr in run_two_processes(command, 2):
        assert code == 0, stderr[-3000:]
        runs = [line for line in stdout.splitlines() if line.startswith("DISTRIBUTION")]
        assert len(runs) == len(outs), stdout
        for spec, line in zip(outs, runs, strict=True):
            lines[spec].append(line)
    return {spec: (dict(np.load(out)), lines[spec]) for spec, out in outs.items()}


@pytest.mark.parametrize("spec", TWO_PROCESS_SPECS)
def test_two_processes_through_jax_distributed_agree_with_one_process(
        two_processes, one_device, spec):
    """Two processes x 2 CPU devices. `data`: data parallel over the 4, each
    process reads its half of every global batch (Keras shards the tf.data
    pipeline). `model:4`: every large kernel is split over the 4 devices of
    both processes (no process holds a whole one), the batch is not split."""
    weights, lines = two_processes[spec]
    assert len(lines) == 2  # one run of `spec` in each process
    for line in lines:
        assert f"'kind': '{spec}', 'devices': 4, 'processes': 2" in line
        assert "LOCAL_DEVICES 2" in line
        if spec == "model:4":
            assert "'mesh': {'batch': 1, 'model': 4}" in line
            assert re.search(r"'encoderblock_0/qkv/kernel': \"P(artitionSpec)?\(None, 'model'\)",
                             line), line
    assert_same_weights(weights, one_device)


def test_sam_under_data_parallel_matches_a_hand_reference(four_devices):
    """SAMModel's JAX train step over 4 devices (`DataParallel`) ends with
    the weights of SAM written out by hand with `jax.grad` on one device
    (3 SGD steps, rho 0.05): on JAX the ascent uses the global batch's
    gradient, whatever the device count. (The `four_devices` process: the
    hand reference, without a distribution, then SAMModel.)"""
    expected = dict(four_devices["hand-sam"][0])
    sgd = {k[len("sgd."):]: expected.pop(k) for k in list(expected) if k.startswith("sgd.")}
    weights, stdout = four_devices["sam+data"]
    assert "'kind': 'data', 'devices': 4" in stdout
    assert_same_weights(weights, expected)
    # The perturbation mattered: plain SGD steps end elsewhere.
    assert max(np.abs(sgd[k] - expected[k]).max() for k in sgd) > 1e-3


def test_the_jax_path_loads_without_tensorflow():
    """`keras_vit.training.distribution` (what JAX training reads) imports
    no TensorFlow at load: a tf.distribute strategy is described by
    `strategy.describe_strategy`."""
    result = subprocess.run(
        [sys.executable, "-c", "import sys, keras_vit.training.distribution; "
                               "print('tensorflow' in sys.modules)"],
        env=jax_env(1), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "False"


# --- specs and errors (in this process, any backend) -------------------------

def test_specs_parse_and_bad_ones_say_what_is_allowed():
    assert dist.parse_spec("auto") == ("auto", None)
    assert dist.parse_spec("model:4") == ("model", 4)
    for bad in ("model", "model:0", "model:x", "tensor:2", "DATA"):
        with pytest.raises(ValueError, match=re.escape(
                f"distribution={bad!r}; allowed: auto, data, model:N (N devices per model "
                "replica) or none.")):
            dist.parse_spec(bad)
    with pytest.raises(TypeError, match="give a string"):
        dist.parse_spec(2)


def test_the_layout_map_names_every_large_kernel():
    vit = tiny_vit(num_layers=2)
    mixer = tiny_mixer(num_blocks=2)
    split = {}
    for model in (vit, mixer):
        for variable in model.weights:
            for pattern, axes in dist.LAYOUTS:
                if re.fullmatch(pattern, variable.path):
                    split[variable.path] = axes
    assert split == {
        **{f"encoderblock_{i}/{name}": axes for i in range(2) for name, axes in (
            ("qkv/kernel", (None, "model")), ("qkv/bias", ("model",)),
            ("attention_output/kernel", ("model", None)),
            ("mlp_dense1/kernel", (None, "model")), ("mlp_dense1/bias", ("model",)),
            ("mlp_dense2/kernel", ("model", None)))},
        **{f"mixerblock_{i}/{name}": axes for i in range(2) for name, axes in (
            ("channel_mixing1/kernel", (None, "model")), ("channel_mixing1/bias", ("model",)),
            ("channel_mixing2/kernel", ("model", None)))},
    }


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow message")
def test_tensorflow_points_to_strategies(tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            "distribution='data' is for the JAX backend (keras.distribution); on TensorFlow "
            "use strategy= (keras-vit train --strategy), or set KERAS_BACKEND=jax.")):
        keras_vit.training.train("ViTTi16", "folder:/nonexistent", distribution="data",
                                 out=str(tmp_path))


@pytest.mark.backends
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX messages")
def test_jax_refuses_a_split_the_devices_cannot_make_and_tf_strategies(tmp_path):
    """Before any work (the data folder does not exist)."""
    devices = len(keras.distribution.list_devices())
    with pytest.raises(ValueError, match=re.escape(
            f"distribution='model:3' needs a device count divisible by 3; this job has "
            f"{devices} devices.")):
        keras_vit.training.train("ViTTi16", "folder:/nonexistent", distribution="model:3",
                                 out=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=re.escape(
            "strategy='mirrored' is a TensorFlow tf.distribute strategy; on the jax backend "
            "give distribution=")):
        keras_vit.training.train("ViTTi16", "folder:/nonexistent", distribution="data",
                                 strategy="mirrored", out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.backends
def test_multi_process_arguments_are_checked(monkeypatch):
    for name in dist.ENV.values():
        monkeypatch.delenv(name, raising=False)
    assert dist.initialize_processes() == 1
    if keras.backend.backend() == "tensorflow":
        with pytest.raises(ValueError, match=re.escape(
                "coordinator/num_processes/process_id start a JAX multi-process job; on the "
                "tensorflow backend use TF_CONFIG with strategy='multiworker'.")):
            dist.initialize_processes("127.0.0.1:1234", 2, 0)
    if keras.backend.backend() != "jax":
        return
    with pytest.raises(ValueError, match=re.escape(
            "missing: num_processes, process_id (flags --coordinator, --num-processes, "
            "--process-id, or KERAS_DISTRIBUTION_NUM_PROCESSES, "
            "KERAS_DISTRIBUTION_PROCESS_ID).")):
        dist.initialize_processes("127.0.0.1:1234")
    with pytest.raises(ValueError, match=re.escape(
            "process_id=2 with num_processes=2; the id must be in 0 .. num_processes - 1.")):
        dist.initialize_processes("127.0.0.1:1234", 2, 2)
    with pytest.raises(ValueError, match=re.escape("coordinator='localhost'; give HOST:PORT")):
        dist.initialize_processes("localhost", 2, 0)
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match=re.escape(
            "KERAS_DISTRIBUTION_NUM_PROCESSES='two' is not an integer.")):
        dist.initialize_processes()


def test_cli_train_on_jax_over_4_devices_reports_its_distribution(tmp_path):
    """`keras-vit train --distribution data --sam-rho 0.05` on JAX: the final JSON line says
    backend, kind, devices and processes. (Bad specs on JAX:
    test_jax_refuses_a_split_the_devices_cannot_make_and_tf_strategies.)"""
    small_digits(tmp_path / "digits")
    command = [sys.executable, "-m", "keras_vit.cli", "train", "--data",
               f"folder:{tmp_path / 'digits'}", "--model",
               digits_model(tmp_path / "tiny.keras"), "--recipe", "scratch",
               "--image-size", "32", "--batch-size", "8", "--steps", "2", "--json", "--quiet",
               "--out", str(tmp_path / "run")]
    result = subprocess.run(command + ["--distribution", "data", "--sam-rho", "0.05"],
                            env=jax_env(4), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    line = json.loads(result.stdout.strip().splitlines()[-1])
    assert line["sam_rho"] == 0.05  # SAM's JAX train step, data parallel
    assert line["distribution"] == {"backend": "jax", "kind": "data", "devices": 4,
                                    "processes": 1, "mesh": {"batch": 4}}
    assert "keras.distribution DataParallel (data), 4 replicas" in result.stderr
    assert line["data"]["validation"]["images"] == 30
    # The saved model, reloaded in TensorFlow, scores the same
    # accuracy on the same 30 images: the padding counted for nothing.
    scores = evaluate_in_tensorflow(line["model"], f"folder:{tmp_path / 'digits'}")
    assert scores["images"] == 30
    assert abs(scores["accuracy"] - line["val_accuracy"]) < 1e-6
    # the end-of-run report, predicted over the padded batches: the 30 images, as evaluate
    report = line["evaluation"]
    assert report["images"] == 30 and abs(report["accuracy"] - line["val_accuracy"]) < 1e-6
    assert report["confusion_matrix"] == scores["confusion_matrix"]


def small_digits(root):
    """4 training and 3 test scans of every digit as PNG files: 30 test
    images in batches of 8 end with a batch of 6, which 4 devices cannot
    split unless it is padded."""
    write_digit_folder(str(root), digits=range(10), splits={"train": 4, "test": 3})
    return root


def digits_model(path):
    """The tiny ViT (conftest.py) with a 10-class logits head, saved at `path`."""
    return tiny_keras_file(path, classifier="gap", classes=10, classifier_activation=None)


def evaluate_in_tensorflow(model_path, data):
    """`keras-vit evaluate` on TensorFlow (in this process when it runs
    TensorFlow, else in a fresh one); its JSON."""
    if keras.backend.backend() == "tensorflow":
        code, stdout, stderr = run_cli("evaluate", model_path, "--data", data, "--json")
    else:
        result = subprocess.run(
            [sys.executable, "-m", "keras_vit.cli", "evaluate", str(model_path), "--data",
             data, "--json"], env=dict(jax_env(1), KERAS_BACKEND="tensorflow"), capture_output=True,
            text=True, timeout=400)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    assert code == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.mark.long
def test_cli_train_in_two_processes_writes_one_run(tmp_path):
    """`keras-vit train --distribution model:4` in two processes x 2
    devices joined on 127.0.0.1, every large kernel split over the devices
    of both processes: each process saves the whole model (backup,
    best.keras, model.keras: `_saving.host_values` gathers the pieces),
    both end with the same weights and scores, process 0 writes OUT and
    process 1 OUT/workers/1, and the saved model scores the reported
    validation accuracy in TensorFlow. (That the gathered
    pieces are the right ones: the `model:4` worker test above.)"""
    data = f"folder:{small_digits(tmp_path / 'digits')}"
    out = tmp_path / "run"
    results = run_two_processes(
        [sys.executable, "-m", "keras_vit.cli", "train", "--data", data, "--model",
         digits_model(tmp_path / "tiny.keras"), "--recipe", "scratch", "--image-size", "32",
         "--batch-size", "8", "--epochs", "2", "--steps-per-epoch", "2", "--json", "--quiet",
         "--out", str(out), "--distribution", "model:4"], 2)
    lines = []
    for code, stdout, stderr in results:
        assert code == 0, stderr[-3000:]
        lines.append(json.loads(stdout.strip().splitlines()[-1]))
    for line in lines:
        assert line["distribution"] == {"backend": "jax", "kind": "model:4", "devices": 4,
                                        "processes": 2, "mesh": {"batch": 1, "model": 4}}
        assert line["data"]["validation"]["images"] == 30
        assert line["epochs_run_now"] == 2 and line["best"]["epoch"] in (1, 2)
        assert line["evaluation"] is None  # each process sees part of the batches
    assert lines[0]["model"] == str(out / "model.keras")
    assert lines[1]["model"] == str(out / "workers" / "1" / "model.keras")
    assert lines[0]["val_accuracy"] == lines[1]["val_accuracy"]
    assert lines[0]["val_loss"] == lines[1]["val_loss"]
    models = [keras.saving.load_model(line["model"]) for line in lines]
    for a, b in zip(*(m.get_weights() for m in models), strict=True):
        np.testing.assert_array_equal(a, b)
    scores = evaluate_in_tensorflow(lines[0]["model"], data)
    assert scores["images"] == 30
    assert abs(scores["accuracy"] - lines[0]["val_accuracy"]) < 1e-6


def test_padded_validation_scores_exactly_what_the_unpadded_one_does():
    """`shardable_validation` pads the last batch (13 images in batches of
    4: 4, 4, 4, 1 -> four batches of 4) with zero-weight rows and weighs the
    real ones so that Keras' loss and accuracy are the unpadded ones."""
    from types import SimpleNamespace

    import tensorflow as tf

    from keras_vit.training.engine import shardable_validation

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (13, 16, 16, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 5, 13), 5).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    fake = SimpleNamespace(num_model_replicas=2)
    padded = shardable_validation(dataset, SimpleNamespace(num_examples=13, split="test"), 4,
                                   fake)
    shapes = [tuple(b[0].shape) for b in padded]
    assert shapes == [(4, 16, 16, 3)] * 4
    assert [float(b[2].numpy().sum()) for b in padded][-1] == pytest.approx(16 / 13)
    model = tiny_vit(input_shape=(16, 16, 3), classes=5, classifier_activation=None)
    model.set_weights([rng.normal(0, 0.3, w.shape).astype("float32")
                       for w in model.get_weights()])
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)
    model.compile(loss=loss, metrics=["accuracy"])
    expected = model.evaluate(dataset, verbose=0)
    model.compile(loss=loss, weighted_metrics=["accuracy"])
    got = model.evaluate(padded, verbose=0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert 0 < expected[1] < 1  # the accuracy is not trivially 0 or 1
    with pytest.raises(ValueError, match=re.escape("batch_size=5 cannot be split over the 2 "
                                                   "data-parallel replicas")):
        shardable_validation(dataset, SimpleNamespace(num_examples=13, split="test"), 5,
                              fake)
