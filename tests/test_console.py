"""The `keras-vit` console script (the `keras_vit_cli` launcher and
`keras_vit._console`) as a user runs it: a fresh process each time.

`--help` and argument errors must not import TensorFlow or Keras; every
error is one `keras-vit: error:` line with exit status 2 and nothing else on
stderr (TensorFlow's native log lines filtered out); `predict` of a trained
model reports probabilities and the class names stored in it.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from conftest import REPO_ROOT as ROOT
from conftest import process_env, run_cli_process, tiny_vit
from data_helpers import write_digit_images
from keras_vit import _checks, _console, labels

COMMANDS = ["models", "download", "predict", "explain", "train", "evaluate", "plot", "export",
            "quickstart"]
CLASS_NAMES = ["zero", "one", "two", "three", "four"]
# The command must quiet TensorFlow itself: the children run without this.
UNQUIET = {"TF_CPP_MIN_LOG_LEVEL": None}


def python(code, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=process_env(UNQUIET), cwd=kw.pop("cwd", ROOT), **kw)


def keras_vit(*argv):
    """`keras-vit ARGV...` through the console script's launcher module."""
    return run_cli_process(*argv, launcher="keras_vit_cli", env=UNQUIET)


def assert_one_error_line(result, *fragments, status=2):
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keras-vit: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------ no TensorFlow

def test_help_of_every_command_imports_neither_tensorflow_nor_keras():
    result = python(f"""
        import io, contextlib, sys, time
        import keras_vit_cli
        start = time.perf_counter()
        for argv in [["--help"]] + [[c, "--help"] for c in {COMMANDS!r}]:
            with contextlib.redirect_stdout(io.StringIO()) as text:
                try:
                    keras_vit_cli.main(argv)
                except SystemExit as exit:
                    assert exit.code == 0, (argv, exit.code)
            assert "usage: keras-vit" in text.getvalue(), argv
        print(sorted(m for m in ("tensorflow", "keras", "jax", "torch") if m in sys.modules))
        print(time.perf_counter() - start)
    """)
    assert result.returncode == 0, result.stderr
    modules, seconds = result.stdout.split("\n")[:2]
    assert modules == "[]"
    assert float(seconds) < 1.0
    assert result.stderr == ""


@pytest.mark.parametrize("launcher", ["keras_vit_cli", "keras_vit.cli", "keras_vit"])
def test_help_process_is_fast_and_silent(launcher):
    start = time.perf_counter()
    result = run_cli_process("--help", launcher=launcher, env=UNQUIET)
    seconds = time.perf_counter() - start
    assert result.returncode == 0 and result.stderr == ""
    assert "--verbose" in result.stdout and "--debug" in result.stdout
    for command in COMMANDS:
        assert command in result.stdout
    assert seconds < 3.0  # ~0.1 s alone; generous for a loaded machine


def test_models_json_without_tensorflow():
    result = python("""
        import io, json, sys
        import keras_vit_cli
        from keras_vit import cli
        out = io.StringIO()
        assert cli.main(["models", "--json"], out=out) == 0
        assert json.loads(out.getvalue())["models"]
        print("tensorflow" in sys.modules, "keras" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False False"


def test_the_export_module_command_is_as_quiet_as_keras_vit(tmp_path):
    """`python -m keras_vit.export FILE.tflite` set up TensorFlow's logging
    as `keras-vit` does (it showed TensorFlow's start-up lines)."""
    missing = tmp_path / "none.tflite"
    result = run_cli_process(missing, launcher="keras_vit.export", env=UNQUIET)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"error: No such file or directory: {str(missing)!r}.\n"


def test_console_script_is_installed():
    result = run_cli_process("models", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["models"]


def test_installed_console_script_is_the_lazy_launcher():
    script = shutil.which("keras-vit", path=os.path.dirname(sys.executable))
    if script is None or "keras_vit_cli" not in pathlib.Path(script).read_text():
        pytest.skip("the installed keras-vit script predates keras_vit_cli: pip install -e .")
    result = subprocess.run([script, "--help"], capture_output=True, text=True,
                            env=process_env(UNQUIET))
    assert result.returncode == 0 and result.stderr == ""


# ------------------------------------------------------------ errors

def test_predict_missing_file(tmp_path):
    line = assert_one_error_line(keras_vit("predict", tmp_path / "x.png", "--weights", "a.npz"))
    assert line == f"keras-vit: error: Image not found: '{tmp_path / 'x.png'}'."


def test_predict_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("no pictures here")
    assert_one_error_line(keras_vit("predict", tmp_path, "--weights", "a.npz"),
                          "No image files", ".png", repr(str(tmp_path)))


def test_export_of_an_official_checkpoint():
    line = assert_one_error_line(keras_vit("export", "x.npz", "--format", "tflite",
                                           "--out", "x.tflite"))
    assert line == ("keras-vit: error: MODEL must be a .keras file written by keras-vit "
                    "train or model.save; got 'x.npz' (an official checkpoint: make a .keras "
                    "file of it in Python with keras_vit.model_from_checkpoint('x.npz')"
                    ".save('x.keras'); keras-vit predict reads it as it is with --model auto "
                    "--weights x.npz).")
    assert_one_error_line(keras_vit("evaluate", "x.npz", "--data", "folder:x"), "got 'x.npz'")


def test_predict_model_that_is_not_a_keras_file(tmp_path):
    image = write_digit_images(tmp_path, 1)[0]
    assert_one_error_line(keras_vit("predict", image, "--model", "x.txt"),
                          "--model must be a .keras file", "'x.txt'")
    assert_one_error_line(keras_vit("predict", image, "--model", "x.npz"),
                          "--model auto --weights x.npz")
    assert_one_error_line(keras_vit("predict", image, "--model", str(tmp_path / "m.keras")),
                          "Model not found")


def test_unknown_model(tmp_path):
    image = write_digit_images(tmp_path, 1)[0]
    assert_one_error_line(keras_vit("predict", image, "--model", "ViTQ", "--weights", "x"),
                          "Unknown --model 'ViTQ'", "ViTB16")


def test_debug_shows_the_traceback(tmp_path):
    result = keras_vit("--debug", "predict", tmp_path / "x.png", "--weights", "a.npz")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "Image not found" in result.stderr
    # also accepted after the command
    result = keras_vit("predict", tmp_path / "x.png", "--weights", "a.npz", "--debug")
    assert "Traceback" in result.stderr


def test_usage_errors_are_argparse_lines():
    result = keras_vit("predict")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("keras-vit predict: error:")


# ------------------------------------------------------------ predict, trained model

@pytest.fixture(scope="module")
def trained_model(tmp_path_factory):
    """A tiny keras_vit ViT with a logits head, class names and the
    `scratch` recipe's optimizer (AdamW, its WarmupDecay schedule), saved
    as a trained model would be."""
    from keras_vit import training

    path = tmp_path_factory.mktemp("trained") / "model.keras"
    model = tiny_vit(classes=len(CLASS_NAMES), classifier_activation=None)
    assert labels.set_class_names(model, CLASS_NAMES)
    model.compile(optimizer=training.make_optimizer(training.get_recipe("scratch"), 10),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")
    model.fit(x, np.arange(4) % len(CLASS_NAMES), epochs=1, verbose=0)
    model.save(path)
    return path


def test_import_keras_vit_registers_everything_for_load_model(trained_model):
    """`import keras_vit` alone registers the class names and the saved
    optimizer's WarmupDecay (keras_vit.training itself loads lazily: the
    trainer is not imported). (Was also
    test_training.py::test_a_trained_model_loads_after_import_keras_vit_alone,
    a process of its own.)"""
    result = python(f"""
        import sys
        import keras
        import keras_vit
        model = keras.saving.load_model({str(trained_model)!r})
        print(keras_vit.labels.class_names(model))
        print(type(model.optimizer.learning_rate).__name__
              if not hasattr(model.optimizer, "_learning_rate")
              else type(model.optimizer._learning_rate).__name__)
        print("keras_vit.training.trainer" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    names, schedule, trainer = result.stdout.strip().splitlines()[-3:]
    assert names == repr(CLASS_NAMES)
    assert schedule == "WarmupDecay"
    assert trainer == "False"


def test_predict_trained_model_probabilities_and_names(trained_model, tmp_path):
    images = write_digit_images(tmp_path, 3)
    (tmp_path / "sub").mkdir()
    nested = write_digit_images(tmp_path / "sub", 1)
    (tmp_path / "notes.txt").write_text("ignored: not an image extension")
    result = keras_vit("predict", tmp_path, "--model", trained_model,
                       "--top", len(CLASS_NAMES), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert set(data) == {"model", "weights", "image_size", "predictions", "skipped"}
    assert data["image_size"] == [32, 32] and data["skipped"] == []
    assert [p["image"] for p in data["predictions"]] == sorted(images + nested)
    for prediction in data["predictions"]:
        top = prediction["top"]
        assert sorted(row["label"] for row in top) == sorted(CLASS_NAMES)
        assert all(CLASS_NAMES[row["index"]] == row["label"] for row in top)
        probabilities = [row["probability"] for row in top]
        assert all(0 <= p <= 1 for p in probabilities)
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-6)
        assert probabilities == sorted(probabilities, reverse=True)


def test_predict_corrupt_file_fails_or_is_skipped(trained_model, tmp_path):
    good = write_digit_images(tmp_path, 1)[0]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    assert_one_error_line(keras_vit("predict", good, bad, "--model", trained_model),
                          "Corrupt or non-image file", repr(str(bad)), "--skip-corrupt")
    result = keras_vit("predict", tmp_path, "--model", trained_model, "--json",
                       "--skip-corrupt", "--top", 2)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["skipped"] == [str(bad)]
    assert [p["image"] for p in data["predictions"]] == [good]
    assert result.stderr.strip() == f"keras-vit: skipped 1 unreadable image file: {bad}"


@pytest.mark.parametrize("backend, package", [("torch", "torch"), ("jax", "jax")])
def test_a_backend_that_is_not_installed_is_one_sentence(monkeypatch, backend, package):
    """KERAS_BACKEND=torch without PyTorch: Keras' import fails with "No
    module named 'torch'"; the CLI says what to install instead."""
    monkeypatch.setenv("KERAS_BACKEND", backend)
    with pytest.raises(ValueError, match=f"^KERAS_BACKEND={backend} but {backend} is not "
                                         f"installed; install {package} "):
        _console._missing_backend(ModuleNotFoundError(f"No module named '{package}'",
                                                      name=package))
    # another missing module is not the backend's: the error goes on as it was
    _console._missing_backend(ModuleNotFoundError("No module named 'h5py'", name="h5py"))


def test_a_warning_is_printed_once_after_a_root_handler_appears():
    """absl's `basicConfig` (the first TensorFlow log line, e.g. in
    tf.saved_model.save) used to make every keras_vit line print twice."""
    result = python("""
        import logging
        import keras_vit_cli  # as the command starts (lazy: no TensorFlow to wait for)
        from keras_vit import _console
        _console.quiet()
        logging.basicConfig()  # what absl does
        logging.getLogger("keras_vit").warning("once")
    """)
    lines = [line for line in result.stderr.splitlines() if "once" in line]
    assert lines == ["keras_vit: once"], result.stderr


def test_a_library_warning_is_printed_once_when_the_root_logger_has_a_handler(capsys):
    """Outside the command (keras_vit propagates): once a library calls
    `logging.basicConfig` (TensorFlow's SavedModel writer does), the root's
    handler shows keras_vit's lines and keras_vit's own handler stays quiet."""
    import logging

    logging.getLogger("keras_vit").warning("alone")
    assert capsys.readouterr().err == "keras_vit: alone\n"
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    root.addHandler(handler)
    try:
        logging.getLogger("keras_vit").warning("once")
    finally:
        root.removeHandler(handler)
    assert capsys.readouterr().err == "WARNING:keras_vit:once\n"


def test_json_lines_are_strict():
    assert _console.json_dumps({"a": float("nan"), "b": [float("inf"), 1.5, np.float32(2)],
                                "c": (np.float64("-inf"), 3)}) == \
        '{"a": null, "b": [null, 1.5, 2.0], "c": [null, 3]}'
    assert _checks.finite_or_none(True) is True
