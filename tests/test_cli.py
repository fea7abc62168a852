"""The `keras-vit` command in this process (`keras_vit.cli.main`): `models`
and `predict`, text and --json; numeric flags; the one-line errors. (In a
fresh process, as the console script runs: test_console.py.)"""

import json
import pathlib
import shutil
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli, tiny_keras_file
from official_fixtures import Fixture


def test_models_json_lists_variants_and_families():
    code, text, _ = run_cli("models", "--json")
    assert code == 0
    data = json.loads(text)
    functions = {row["function"] for row in data["models"]}
    assert {"ViTB16", "R50ViTB16", "MixerL16", "RViTTi16"} <= functions
    b16 = next(r for r in data["models"] if r["function"] == "ViTB16")
    assert b16["config"]["hidden_size"] == 768 and "imagenet21k" in b16["weights"]
    families = {(r["family"], r["weights"]) for r in data["weights"]}
    assert ("vit", "augreg") in families and ("mixer", "imagenet1k") in families


def test_models_text_table():
    code, text, _ = run_cli("models")
    assert code == 0
    assert "ViTB16     B/16" in text and "augreg:<filename>" in text
    # a hybrid's patch is in cells of the ResNet stem's grid: both columns, named
    header, *rows = [line.split() for line in text.splitlines()[1:22]]
    assert " patch (grid cells) pixels per token hidden " in text.splitlines()[1]
    patch = {row[0]: (int(row[2]), int(row[3])) for row in rows if row[0][0] in "VRM"}
    assert patch["RViTTi16"] == (8, 32) and patch["R50ViTB16"] == (1, 16)
    assert patch["R26ViTS32"] == (1, 32) and patch["ViTB16"] == (16, 16)
    code, text, _ = run_cli("models", "--json")
    pixels = {row["function"]: row["pixels_per_token"] for row in json.loads(text)["models"]}
    assert pixels["RViTTi16"] == 32 and pixels["MixerB16"] == 16


def write_pngs(images, tmp_path):
    paths = []
    for i, image in enumerate(images):
        path = tmp_path / f"photo{i}.png"
        path.write_bytes(tf.io.encode_png(image).numpy())
        paths.append(str(path))
    return paths


def test_predict_json_matches_the_official_logits(tmp_path):
    fixture = Fixture("vit_tiny_token")
    paths = write_pngs(fixture.io["images_uint8"], tmp_path)
    code, text, _ = run_cli("predict", *paths, "--weights", fixture.checkpoint, "--top", "3",
                            "--json")
    assert code == 0
    result = json.loads(text)
    assert result["image_size"] == [32, 32]
    logits = fixture.io["logits"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    for row, p in zip(result["predictions"], probs, strict=True):
        assert [t["index"] for t in row["top"]] == list(np.argsort(-p)[:3])
        assert row["top"][0]["label"] == f"class_{np.argmax(p)}"
        assert row["top"][0]["probability"] == pytest.approx(p.max(), abs=1e-5)


def test_predict_text_with_labels_and_resize(tmp_path):
    fixture = Fixture("mixer_tiny")
    big = tf.image.resize(fixture.io["images_uint8"], (64, 64)).numpy().astype("uint8")
    paths = write_pngs(big[:1], tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"thing{i}" for i in range(10)))
    code, text, _ = run_cli("predict", *paths, "--weights", fixture.checkpoint,
                            "--labels", str(labels), "--top", "2")
    assert code == 0
    assert text.startswith(f"{paths[0]}:\n  1. thing")
    assert text.count("(class ") == 2
    labels.write_text("\n".join(f"thing{i}" for i in range(9)) + "\n\n")  # a blank line
    code, _, err = run_cli("predict", *paths, "--weights", fixture.checkpoint,
                           "--labels", str(labels))
    assert code == 2
    assert err == (f"keras-vit: error: --labels {str(labels)!r} has 9 names; the model has "
                   "10 classes (one name per class, in label order).\n")


def test_predict_errors_exit_2(tmp_path):
    fixture = Fixture("vit_tiny_token")
    code, _, err = run_cli("predict", tmp_path / "none.png", "--weights", fixture.checkpoint)
    assert code == 2
    assert err == f"keras-vit: error: Image not found: '{tmp_path / 'none.png'}'.\n"
    (tmp_path / "x.png").write_bytes(b"not an image")
    code, _, err = run_cli("predict", tmp_path / "x.png", "--weights", fixture.checkpoint)
    assert code == 2
    assert err.startswith("keras-vit: error: Corrupt or non-image file") and err.count("\n") == 1
    (tmp_path / "ok.png").write_bytes(tf.io.encode_png(fixture.io["images_uint8"][0]).numpy())
    code, _, err = run_cli("predict", tmp_path / "ok.png", "--weights", "imagenet21k")
    assert code == 2
    assert "--model auto reads the architecture from a local official .npz, a " in err
    # `predict model.keras image.png` (evaluate's order): found here by hand.
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"any")
    code, _, err = run_cli("predict", keras_file, tmp_path / "ok.png")
    assert code == 2
    assert err == (
        f"keras-vit: error: '{keras_file}' is a Keras model file, not an image: give it "
        f"as --model {keras_file}.\n")
    code, _, err = run_cli("predict", tmp_path / "ok.png", "--model", "ViTQ",
                           "--weights", "imagenet21k")
    assert code == 2
    assert "Unknown --model 'ViTQ'" in err
    # a Hub folder given as --model; one whose config.json contradicts its weights
    hub = pathlib.Path(__file__).parent / "fixtures" / "hub" / "timm_vit_token"
    code, _, err = run_cli("predict", tmp_path / "ok.png", "--model", hub)
    assert code == 2
    assert err == (
        "keras-vit: error: --model takes a named model (e.g. ViTB16), 'auto' or a .keras "
        f"file; got '{hub}' (a Hugging Face Hub folder: use --model auto --weights {hub}).\n")
    crafted = tmp_path / "crafted"
    shutil.copytree(hub, crafted)
    config = json.loads((crafted / "config.json").read_text())
    (crafted / "config.json").write_text(json.dumps({**config, "architecture": "mixer_s16_224"}))
    code, _, err = run_cli("predict", tmp_path / "ok.png", "--weights", crafted)
    assert code == 2
    assert err == (
        f"keras-vit: error: '{crafted / 'config.json'}' says architecture 'mixer_s16_224' "
        "(an MLP-Mixer) but the weights hold ViT attention keys (blocks.0.attn.qkv.weight); "
        "the file and the weights must describe the same model.\n")


def test_fit_progress_is_a_line_per_epoch_unless_on_a_terminal():
    """A log file or pipe gets `verbose=2` (no carriage returns and colour
    codes); a terminal the live bar; --quiet always one line per epoch."""
    from types import SimpleNamespace

    from keras_vit.cli import _progress_verbosity

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    for json_flag in (False, True):
        for tty, quiet, expected in ((True, False, 1), (False, False, 2), (True, True, 2)):
            stream = "stderr" if json_flag else "stdout"
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, stream, Stream(tty))
                assert _progress_verbosity(SimpleNamespace(json=json_flag, quiet=quiet)) == expected


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
    # an empty path: not "[Errno 2] No such file or directory: ''"
    (["train", "--data", "folder:x", "--out", ""],
     "argument --out: must be a file or folder path, got ''"),
    (["export", "m.keras", "--format", "tflite", "--out", " "],
     "argument --out: must be a file or folder path, got ' '"),
    (["explain", "a.png", "--out", ""], "argument --out: must be a file or folder path, got ''"),
    (["quickstart", "--out", ""], "argument --out: must be a file or folder path, got ''"),
])
def test_numeric_and_path_flags_are_checked_in_one_line(args, message):
    result = run_cli(*args)
    command = args[0]
    assert result.code == 2
    assert result.err_lines == [
        f"keras-vit {command}: error: {message} (see keras-vit {command} --help)"]


# ------------------------------------------------------------ .keras files

@pytest.mark.parametrize("content", ["text", "truncated", "empty"])
def test_an_unreadable_keras_file_is_called_unreadable_not_missing(tmp_path, content):
    path = tmp_path / "model.keras"
    if content == "text":
        path.write_text("not a model\n")
    elif content == "truncated":
        tiny_keras_file(tmp_path / "whole.keras")
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
        result = run_cli(*args)
        assert (result.code, result.err_lines) == (2, [f"keras-vit: error: {expected}"])
    image = tmp_path / "a.png"
    keras.utils.save_img(image, np.zeros((8, 8, 3), "uint8"))
    result = run_cli("predict", str(image), "--model", str(path))
    assert result.err_lines == [f"keras-vit: error: {expected.replace('MODEL', '--model', 1)}"]
    result = run_cli("evaluate", str(tmp_path / "absent.keras"), "--data", "folder:x")
    assert result.err_lines == [
        f"keras-vit: error: Model not found: {str(tmp_path / 'absent.keras')!r}."]


# ------------------------------------------------------------ --help

def test_every_command_has_a_description_and_every_argument_a_help_line():
    """Walks the whole parser: each subcommand, each flag and positional
    (argparse's own -h aside)."""
    import argparse

    from keras_vit.cli import build_parser

    missing = []

    def walk(parser, command):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = "/".join(action.option_strings) or action.metavar or action.dest
            if not (action.help or "").strip():
                missing.append(f"{command}: {name} has no help")
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    if not (sub.description or "").strip():
                        missing.append(f"{command} {sub_name}: no description")
                    walk(sub, f"{command} {sub_name}")

    walk(build_parser(), "keras-vit")
    assert missing == []


@pytest.mark.parametrize("progress, fresh", [("\r 3/10 [=====>....] - loss: 0.52", "\n"),
                                             ("Epoch 1/10\n", "")])
def test_an_error_after_a_progress_bar_starts_on_a_fresh_line(monkeypatch, progress, fresh):
    """A Keras progress bar leaves its line open ("\\r" redraws it): the
    error line must not be glued to it."""
    from keras_vit import cli

    def command(args, out):
        sys.stdout.write(progress)
        raise ValueError("Something went wrong.")

    monkeypatch.setattr(cli, "cmd_models", command)
    code, _, err = run_cli("models")
    assert (code, err) == (2, f"{fresh}keras-vit: error: Something went wrong.\n")
