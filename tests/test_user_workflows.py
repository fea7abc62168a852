"""A user's own folder, end to end, through the `keras-vit` command:
train -> predict -> evaluate -> export gives the right answer or one clear
error. Each scenario is one of issue 12's numbered problems, on real scans
(scikit-learn's digits) written as PNG folders in the test."""

import io
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

import keras_vit
from keras_vit import cli, labels
from official_fixtures import REPO_ROOT

# folder names the model must give back; sorted, since class i is the i-th name in
# sorted order (the keras.utils.image_dataset_from_directory convention)
NAMES = ("ant", "bee", "cow")


def write_digit_folder(root, per_class=20, classes=NAMES, size=16, splits=None):
    """`root/<name>/<i>.png` (or `root/<split>/<name>/...` for `splits`,
    a dict split -> images per class) from real digit scans."""
    digits = load_digits()
    paths = []
    layout = splits or {None: per_class}
    for digit, name in enumerate(classes):
        scans = digits.images[digits.target == digit]
        offset = 0
        for split, count in layout.items():
            folder = os.path.join(root, *(s for s in (split, name) if s))
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                pixels = (scans[offset + i] * (255.0 / 16.0))[..., None].repeat(3, -1)
                pixels = tf.image.resize(pixels, (size, size))
                png = tf.io.encode_png(tf.cast(tf.round(pixels), tf.uint8)).numpy()
                path = os.path.join(folder, f"{i:03d}.png")
                with open(path, "wb") as f:
                    f.write(png)
                paths.append(path)
            offset += count
    return paths


def tiny_model_file(path, classes=len(NAMES), size=16):
    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
        input_shape=(size, size, 3), classes=classes, classifier_activation=None,
        classifier="gap", name="tiny_vit")
    model.save(path)
    return str(path)


def run_cli(argv, capsys):
    """`keras-vit ARGV` in this process: (exit status, stdout, stderr)."""
    out = io.StringIO()
    code = cli.main([str(a) for a in argv], out=out)
    captured = capsys.readouterr()
    return code, out.getvalue() + captured.out, captured.err


def console(*args, timeout=600):
    """`keras-vit ARGS` in a fresh process (nothing from this one loaded)."""
    return subprocess.run([sys.executable, "-m", "keras_vit.cli", *map(str, args)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def last_json(text):
    """The last line of TEXT that is a JSON object (Keras' epoch lines may follow)."""
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def assert_one_line_error(code, err, *fragments):
    lines = [line for line in err.strip().splitlines() if line.startswith("keras-vit:")]
    assert code == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("keras-vit: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory):
    """A class-folder-only dataset (no train/ or test/) trained through the
    CLI once; the scenarios below use its outputs."""
    root = tmp_path_factory.mktemp("flat")
    data = root / "digits"
    write_digit_folder(str(data))
    start = tiny_model_file(root / "start.keras")
    out = root / "run"
    capture = io.StringIO()
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(["train", "--model", start, "--data", f"folder:{data}",
                         "--recipe", "scratch", "--image-size", "16", "--batch-size", "8",
                         "--epochs", "2", "--steps-per-epoch", "3", "--out", str(out),
                         "--quiet"], out=capture)
    assert code == 0, err.getvalue()[-3000:]
    return {"data": data, "out": out, "results": last_json(capture.getvalue()),
            "stderr": err.getvalue()}


def test_flat_folder_validates_on_a_disjoint_stratified_holdout(flat_run):
    """Problem 3: a folder without train/test used to validate on its own
    training images."""
    data = flat_run["results"]["data"]
    assert data["train"]["images"] + data["validation"]["images"] == 60
    assert data["validation"]["images"] == 6          # 10% of each of 3 classes of 20
    assert data["validation"]["classes"] == 3 and data["train"]["classes"] == 3
    assert data["train"]["split"] == "train" and data["validation"]["split"] != "train"
    assert flat_run["results"]["class_names"] == list(NAMES)
    assert "10% of each class held out" in flat_run["stderr"]


def test_train_prints_a_summary_before_the_first_step(flat_run):
    """Problem 9: what it will do, before 20 s of silence."""
    text = flat_run["stderr"]
    for word in ("parameters", "image size", "16 px", "classes", "train", "validation",
                 "preset", "small", "batch", "steps", "peak learning rate", "precision",
                 "strategy", "output"):
        assert word in text, word
    assert "shuffle" not in text  # Keras' "shuffle=True is ignored" warning is gone


def test_predict_in_a_fresh_process_gives_probabilities_and_folder_names(flat_run):
    """Problem 1: logits were printed as probabilities, names were lost."""
    model = flat_run["results"]["model"]
    images = flat_run["data"] / NAMES[2]
    result = console("predict", images, "--model", model, "--top", "3", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert len(document["predictions"]) == 20
    for row in document["predictions"]:
        assert {"image", "top"} <= set(row)
        probabilities = [t["probability"] for t in row["top"]]
        assert all(0.0 <= p <= 1.0 for p in probabilities)
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-5)
        assert {t["label"] for t in row["top"]} == set(NAMES)
        assert all(NAMES[t["index"]] == t["label"] for t in row["top"])


def test_evaluate_reports_the_holdout_split(flat_run, capsys):
    code, out, err = run_cli(["evaluate", flat_run["results"]["model"], "--data",
                              f"folder:{flat_run['data']}"], capsys)
    assert code == 0, err
    evaluated = last_json(out)
    assert evaluated["split"] == "validation" and evaluated["images"] == 6
    assert evaluated["accuracy"] == pytest.approx(flat_run["results"]["val_accuracy"],
                                                  abs=1e-6)


def test_int8_export_calibrates_on_every_class_and_verifies_on_the_holdout(flat_run,
                                                                          tmp_path, capsys):
    """Problem 2: calibration used to be the first 100 files (one class)."""
    path = tmp_path / "m.tflite"
    code, out, err = run_cli(["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "int8", "--calibration",
                              f"folder:{flat_run['data']}", "--out", path, "--json",
                              "--no-check"], capsys)
    assert code == 0, err
    report = last_json(out)
    assert report["calibration"]["split"] == "train"
    assert report["calibration"]["classes"] == 3 and report["calibration"]["images"] == 54
    assert report["validation"]["split"] != "train"
    assert report["validation"]["classes"] == 3 and report["validation"]["images"] == 6
    label_file = report["labels"]
    assert label_file and open(label_file).read().split() == list(NAMES)


def test_a_corrupt_calibration_image_is_named_or_left_out_and_counted(tmp_path, capsys):
    """A file that trains with --skip-corrupt must not stop the export
    without a name (it said "TensorFlow does not say which file")."""
    data = tmp_path / "digits"
    write_digit_folder(str(data), splits={"train": 6, "test": 3})
    broken = data / "train" / NAMES[2] / "004.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 5)  # a PNG header only
    model = tiny_model_file(tmp_path / "m.keras")
    args = ["export", model, "--format", "tflite", "--quantize", "int8", "--calibration",
            f"folder:{data}", "--out", tmp_path / "m.tflite", "--json", "--no-check"]
    code, out, err = run_cli(args, capsys)
    assert_one_line_error(code, err, "004.png", "--skip-corrupt")
    assert not (tmp_path / "m.tflite").exists()
    code, out, err = run_cli(args + ["--skip-corrupt"], capsys)
    assert code == 0, err
    report = last_json(out)
    assert report["calibration"]["images"] == 17 and report["calibration"]["skipped_corrupt"] == 1
    assert report["validation"]["images"] == 9 and report["validation"]["split"] == "test"


def test_a_failed_export_check_leaves_nothing_at_the_final_path(flat_run, tmp_path,
                                                               capsys, monkeypatch):
    """Problem 7: a file that misses its bar never sits at the final path."""
    from keras_vit.export import tflite

    monkeypatch.setitem(tflite.CHECKS, "dynamic", {"min_top1_agreement": 1.01})
    path = tmp_path / "m.tflite"
    code, out, err = run_cli(["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "dynamic", "--validation",
                              f"folder:{flat_run['data']}", "--out", path], capsys)
    assert_one_line_error(code, err, "--no-check")
    assert not path.exists()
    assert os.path.exists(str(path) + ".rejected")
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
    code, out, err = run_cli(["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "dynamic", "--validation",
                              f"folder:{flat_run['data']}", "--out", path, "--json",
                              "--no-check"], capsys)
    assert code == 0, err
    report = last_json(out)
    assert path.exists() and report["passed"] is False and "101" in report["criteria"]


def test_a_missing_split_is_one_line_naming_the_split_and_what_exists(tmp_path, capsys):
    """Problem 4: `--val-split validation` on train/ + test/ took the split
    folders for classes."""
    data = tmp_path / "digits"
    write_digit_folder(str(data), splits={"train": 4, "test": 2})
    model = tiny_model_file(tmp_path / "m.keras")
    code, out, err = run_cli(["train", "--model", model, "--data", f"folder:{data}",
                              "--recipe", "scratch", "--image-size", "16", "--steps", "1",
                              "--val-split", "validation", "--out", tmp_path / "run"],
                             capsys)
    assert_one_line_error(code, err, "'validation'", "train", "test")


def test_a_corrupt_image_is_one_line_or_skipped_and_counted(tmp_path, capsys):
    """Problem 5: one corrupt file gave a 30-line TensorFlow traceback."""
    data = tmp_path / "digits"
    write_digit_folder(str(data), per_class=6)
    broken = data / NAMES[1] / "003.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated download
    model = tiny_model_file(tmp_path / "m.keras")
    args = ["train", "--model", model, "--data", f"folder:{data}", "--recipe", "scratch",
            "--image-size", "16", "--batch-size", "4", "--epochs", "1",
            "--steps-per-epoch", "4", "--holdout", "0.2", "--quiet"]
    code, out, err = run_cli(args + ["--out", tmp_path / "a"], capsys)
    assert_one_line_error(code, err, "003.png", "--skip-corrupt")
    code, out, err = run_cli(args + ["--out", tmp_path / "b", "--skip-corrupt"], capsys)
    assert code == 0, err
    skipped = last_json(out)["skipped_corrupt"]
    assert skipped["train"] + skipped["validation"] >= 1


def test_evaluating_a_10_class_model_on_3_classes_says_both_counts(tmp_path, capsys):
    """Problem 6: a Keras shape error."""
    data = tmp_path / "digits"
    write_digit_folder(str(data), per_class=5)
    model = tiny_model_file(tmp_path / "m10.keras", classes=10)
    code, out, err = run_cli(["evaluate", model, "--data", f"folder:{data}"], capsys)
    assert_one_line_error(code, err, "10", "3")


@pytest.mark.parametrize("argv, fragments", [
    (["predict", "{tmp}/missing.png", "--model", "{model}"], ["missing.png"]),
    (["predict", "{tmp}/empty", "--model", "{model}"], ["empty"]),
    (["export", "{tmp}/weights.npz", "--format", "tflite", "--out", "{tmp}/x.tflite"],
     ["weights.npz", ".keras"]),
    (["evaluate", "{tmp}/nothing.keras", "--data", "folder:{tmp}"], ["nothing.keras"]),
])
def test_bad_input_is_one_line_without_a_traceback(tmp_path, capsys, argv, fragments):
    """Problem 6: tracebacks and TensorFlow internals in messages."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.npz").write_bytes(b"not really")
    model = tiny_model_file(tmp_path / "m.keras")
    argv = [a.format(tmp=tmp_path, model=model) for a in argv]
    code, out, err = run_cli(argv, capsys)
    line = assert_one_line_error(code, err, *fragments)
    assert "function_node" not in line and "job:localhost" not in line


def test_finetune_recipe_without_weights_warns(tmp_path, caplog):
    """Problem 9: ViTB16 + finetune + no weights trained random weights silently."""
    from keras_vit.training import train

    data = tmp_path / "digits"
    write_digit_folder(str(data), per_class=4)
    with caplog.at_level("WARNING", logger="keras_vit"):
        train("ViTTi16", f"folder:{data}", recipe="finetune", image_size=32,
              batch_size=4, steps=1, strategy="default", out=str(tmp_path / "run"),
              verbose=0)
    assert any("without pretrained weights" in r.getMessage() for r in caplog.records)


def test_class_names_survive_save_and_load(tmp_path):
    path = tiny_model_file(tmp_path / "m.keras")
    model = keras.saving.load_model(path)
    assert labels.class_names(model) is None
    assert labels.set_class_names(model, NAMES)
    model.save(path)
    assert labels.class_names(keras.saving.load_model(path)) == list(NAMES)
    with pytest.raises(ValueError, match="2 class names for a model with 3 outputs"):
        labels.set_class_names(model, NAMES[:2])
    bare = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert labels.set_class_names(bare, NAMES) is False
    np.testing.assert_equal(labels.class_names(bare), None)
