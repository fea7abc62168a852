"""The `keras-vit` command end to end on a user's own folder: train ->
predict -> evaluate -> export gives the right answer or one clear error,
on real scans (scikit-learn's digits) written as PNG folders in the test."""

import json
import os

import pytest
from data_helpers import write_digit_folder

from conftest import run_cli, run_cli_process, tiny_keras_file

# folder names the model must give back; sorted, since class i is the i-th name in
# sorted order (the keras.utils.image_dataset_from_directory convention)
NAMES = ("ant", "bee", "cow")


def digit_folder(root, per_class=20, splits=None):
    """`root/<name>/<i>.png` of 16x16 digit scans, a class for each of NAMES
    (or `root/<split>/<name>/...` for `splits`, a dict split -> images per class)."""
    return write_digit_folder(root, per_class=per_class, size=16, names=NAMES, splits=splits)


def tiny_model_file(path, classes=None):
    """The tiny ViT (conftest.py) for 16x16 images with a logits head for
    `classes` (default: one per NAMES), saved at `path`."""
    return tiny_keras_file(path, patch_size=4, input_shape=(16, 16, 3),
                           classes=classes or len(NAMES), classifier_activation=None,
                           classifier="gap", name="tiny_vit")


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
    digit_folder(str(data))
    start = tiny_model_file(root / "start.keras")
    out = root / "run"
    code, stdout, stderr = run_cli("train", "--model", start, "--data", f"folder:{data}",
                                   "--recipe", "scratch", "--image-size", "16",
                                   "--batch-size", "8", "--epochs", "2", "--steps-per-epoch",
                                   "3", "--out", out, "--quiet")
    assert code == 0, stderr[-3000:]
    return {"data": data, "out": out, "results": last_json(stdout), "stderr": stderr}


def test_flat_folder_validates_on_a_disjoint_stratified_holdout(flat_run):
    """A folder without train/test does not validate on its own training
    images."""
    data = flat_run["results"]["data"]
    assert data["train"]["images"] + data["validation"]["images"] == 60
    assert data["validation"]["images"] == 6          # 10% of each of 3 classes of 20
    assert data["validation"]["classes"] == 3 and data["train"]["classes"] == 3
    assert data["train"]["split"] == "train" and data["validation"]["split"] != "train"
    assert flat_run["results"]["class_names"] == list(NAMES)
    assert "10% of each class held out" in flat_run["stderr"]


def test_train_prints_a_summary_before_the_first_step(flat_run):
    """What it will do, before the silence of the first steps."""
    text = flat_run["stderr"]
    for word in ("parameters", "image size", "16 px", "classes", "train", "validation",
                 "preset", "small", "batch", "steps", "peak learning rate", "precision",
                 "strategy", "output"):
        assert word in text, word
    assert "shuffle" not in text  # Keras' "shuffle=True is ignored" warning is gone
    # the preset chosen for small images, why, and what digits want instead (issue 29)
    assert ("small (images of 16 px, <= 64: milder crops than 'finetune', random flips; "
            "for digits or characters, where a flip changes the class, use --preset "
            "digits)\n") in text


def test_predict_in_a_fresh_process_gives_probabilities_and_folder_names(flat_run):
    """Probabilities (not logits) and the folder names, from the saved model
    alone: nothing of this process loaded."""
    model = flat_run["results"]["model"]
    images = flat_run["data"] / NAMES[2]
    result = run_cli_process("predict", images, "--model", model, "--top", "3", "--json")
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


def test_evaluate_reports_the_holdout_split(flat_run):
    code, out, err = run_cli(*["evaluate", flat_run["results"]["model"], "--data",
                              f"folder:{flat_run['data']}", "--json"])
    assert code == 0, err
    evaluated = last_json(out)
    assert evaluated["split"] == "validation" and evaluated["images"] == 6
    assert evaluated["accuracy"] == pytest.approx(flat_run["results"]["val_accuracy"],
                                                  abs=1e-6)
    # two losses, each named: train's is the training loss (scratch: label smoothing 0.1)
    assert "loss" not in evaluated and evaluated["cross_entropy"] > 0
    assert evaluated["cross_entropy_is"] == (
        "mean cross-entropy of the model's predictions and the true labels, without label "
        "smoothing (train's val_loss adds the recipe's label smoothing)")
    assert flat_run["results"]["val_loss_is"] == (
        "the training loss on the validation images: cross-entropy with label smoothing 0.1")


def test_int8_export_calibrates_on_every_class_and_verifies_on_the_holdout(flat_run,
                                                                          tmp_path):
    """Calibration is a stratified sample of the training split (not the
    first files, all of one class)."""
    path = tmp_path / "m.tflite"
    code, out, err = run_cli(*["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "int8", "--calibration",
                              f"folder:{flat_run['data']}", "--out", path, "--json",
                              "--no-check"])
    assert code == 0, err
    report = last_json(out)
    assert report["calibration"]["split"] == "train"
    assert report["calibration"]["classes"] == 3 and report["calibration"]["images"] == 54
    assert report["validation"]["split"] != "train"
    assert report["validation"]["classes"] == 3 and report["validation"]["images"] == 6
    label_file = report["labels"]
    assert label_file and open(label_file).read().split() == list(NAMES)


def test_a_corrupt_calibration_image_is_named_or_left_out_and_counted(tmp_path):
    """A file that trains with --skip-corrupt must not stop the export
    without a name (it said "TensorFlow does not say which file")."""
    data = tmp_path / "digits"
    digit_folder(str(data), splits={"train": 6, "test": 3})
    broken = data / "train" / NAMES[2] / "0004.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really" * 5)  # a PNG header only
    model = tiny_model_file(tmp_path / "m.keras")
    args = ["export", model, "--format", "tflite", "--quantize", "int8", "--calibration",
            f"folder:{data}", "--out", tmp_path / "m.tflite", "--json", "--no-check"]
    code, out, err = run_cli(*args)
    assert_one_line_error(code, err, "004.png", "--skip-corrupt")
    assert not (tmp_path / "m.tflite").exists()
    code, out, err = run_cli(*args, "--skip-corrupt")
    assert code == 0, err
    report = last_json(out)
    assert report["calibration"]["images"] == 17 and report["calibration"]["skipped_corrupt"] == 1
    assert report["validation"]["images"] == 9 and report["validation"]["split"] == "test"


def test_a_failed_export_check_leaves_nothing_at_the_final_path(flat_run, tmp_path,
                                                               monkeypatch):
    """A file that misses its bar never sits at the final path."""
    from keras_vit.export import tflite

    monkeypatch.setitem(tflite.CHECKS, "dynamic", {"min_top1_agreement": 1.01})
    path = tmp_path / "m.tflite"
    code, out, err = run_cli(*["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "dynamic", "--validation",
                              f"folder:{flat_run['data']}", "--out", path, "--json"])
    assert_one_line_error(code, err, "--no-check")
    assert not path.exists()
    assert os.path.exists(str(path) + ".rejected")
    # --json: the report is on stdout too (not only in .rejected.json)
    rejected = json.loads(out)
    assert rejected["passed"] is False and rejected["path"] == str(path) + ".rejected"
    assert rejected == json.loads(open(str(path) + ".rejected.json").read())
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []
    code, out, err = run_cli(*["export", flat_run["results"]["model"], "--format", "tflite",
                              "--quantize", "dynamic", "--validation",
                              f"folder:{flat_run['data']}", "--out", path, "--json",
                              "--no-check"])
    assert code == 0, err
    report = last_json(out)
    assert path.exists() and report["passed"] is False and "101" in report["criteria"]


def test_a_missing_split_is_one_line_naming_the_split_and_what_exists(tmp_path):
    """`--val-split validation` on train/ + test/ does not take the split
    folders for classes."""
    data = tmp_path / "digits"
    digit_folder(str(data), splits={"train": 4, "test": 2})
    model = tiny_model_file(tmp_path / "m.keras")
    code, out, err = run_cli(*["train", "--model", model, "--data", f"folder:{data}",
                              "--recipe", "scratch", "--image-size", "16", "--steps", "1",
                              "--val-split", "validation", "--out", tmp_path / "run"])
    assert_one_line_error(code, err, "'validation'", "train", "test")


def test_a_corrupt_image_is_one_line_or_skipped_and_counted(tmp_path):
    """One corrupt file is one line, not a TensorFlow traceback."""
    data = tmp_path / "digits"
    digit_folder(str(data), per_class=6)
    broken = data / NAMES[1] / "0003.png"
    broken.write_bytes(broken.read_bytes()[:40])  # truncated download
    model = tiny_model_file(tmp_path / "m.keras")
    args = ["train", "--model", model, "--data", f"folder:{data}", "--recipe", "scratch",
            "--image-size", "16", "--batch-size", "4", "--epochs", "1",
            "--steps-per-epoch", "4", "--holdout", "0.2", "--quiet"]
    code, out, err = run_cli(*args, "--out", tmp_path / "a")
    assert_one_line_error(code, err, "003.png", "--skip-corrupt")
    code, out, err = run_cli(*args, "--out", tmp_path / "b", "--skip-corrupt")
    assert code == 0, err
    skipped = last_json(out)["skipped_corrupt"]
    assert skipped["train"] + skipped["validation"] >= 1


def test_evaluating_a_10_class_model_on_3_classes_says_both_counts(tmp_path):
    """Not a Keras shape error."""
    data = tmp_path / "digits"
    digit_folder(str(data), per_class=5)
    model = tiny_model_file(tmp_path / "m10.keras", classes=10)
    code, out, err = run_cli("evaluate", model, "--data", f"folder:{data}")
    assert_one_line_error(code, err, "10", "3")


@pytest.mark.parametrize("argv, fragments", [
    (["predict", "{tmp}/missing.png", "--model", "{model}"], ["missing.png"]),
    (["predict", "{tmp}/empty", "--model", "{model}"], ["empty"]),
    (["export", "{tmp}/weights.npz", "--format", "tflite", "--out", "{tmp}/x.tflite"],
     ["weights.npz", ".keras"]),
    (["evaluate", "{tmp}/nothing.keras", "--data", "folder:{tmp}"], ["nothing.keras"]),
])
def test_bad_input_is_one_line_without_a_traceback(tmp_path, argv, fragments):
    """No traceback and no TensorFlow internals in the message."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.npz").write_bytes(b"not really")
    model = tiny_model_file(tmp_path / "m.keras")
    argv = [a.format(tmp=tmp_path, model=model) for a in argv]
    code, out, err = run_cli(*argv)
    line = assert_one_line_error(code, err, *fragments)
    assert "function_node" not in line and "job:localhost" not in line
