"""What a user looks at after training (#49): the classification report of
`keras-vit evaluate` and of the end of `train`, the confusion-matrix and
training-curve pictures, `keras-vit plot` on a run folder (an untrusted
input), and a mistyped model name.

The report's known answers come from a folder of one-colour images and a
model whose outputs the test decides: global average pooling and a Dense
layer that scores each class by the distance of the image's colour to the
class's own colour (`2 c.x - |c|^2`), so every image's ranking of the
classes is known. The report's arithmetic is checked against
scikit-learn's on random outputs.
"""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image

from conftest import run_cli, tiny_vit
from keras_vit.training import curves, report

NAMES = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu"]
# each class's colour: red 30 x its index
PROTOTYPES = np.array([[30.0 * j, 0.0, 0.0] for j in range(len(NAMES))], "float32")
# true class -> the class each of its images is made to look like
IMAGES = {"ant": ["ant", "ant", "bee"], "bee": ["bee", "cat"], "cat": ["cat", "cat"],
          "dog": ["ant"], "eel": ["eel"], "fox": ["fox"], "gnu": ["ant", "gnu"]}
EXPECTED = np.zeros((7, 7), "int64")
for true_name, looks in IMAGES.items():
    for name in looks:
        EXPECTED[NAMES.index(true_name), NAMES.index(name)] += 1


def last_json(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def one_error_line(result, *fragments):
    assert result.code == 2, result.err
    assert "Traceback" not in result.err
    lines = result.err_lines
    assert len(lines) == 1, result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def colour_folder(tmp_path_factory):
    """`validation/<class>/<i>.png`: 32x32 images of one colour each, the
    colour of the class each is made to look like (IMAGES)."""
    root = tmp_path_factory.mktemp("colours")
    for true_name, looks in IMAGES.items():
        folder = root / "validation" / true_name
        folder.mkdir(parents=True)
        for i, name in enumerate(looks):
            pixels = np.broadcast_to(PROTOTYPES[NAMES.index(name)], (32, 32, 3))
            Image.fromarray(pixels.astype("uint8")).save(folder / f"{i}.png")
    return root


def colour_model(path):
    """The stub: logits `2 c_j . mean(x) - |c_j|^2`, ranking the classes by
    the distance of the image's colour to theirs (ties: the lower index)."""
    inputs = keras.Input((32, 32, 3))
    dense = keras.layers.Dense(len(NAMES))
    model = keras.Model(inputs, dense(keras.layers.GlobalAveragePooling2D()(inputs)))
    dense.set_weights([2 * PROTOTYPES.T, -np.sum(PROTOTYPES ** 2, axis=1)])
    model.save(path)
    return str(path)


def expected_cross_entropy():
    losses = []
    for true_name, looks in IMAGES.items():
        for name in looks:
            x = PROTOTYPES[NAMES.index(name)].astype("float64")
            logits = 2 * PROTOTYPES @ x - np.sum(PROTOTYPES.astype("float64") ** 2, axis=1)
            shifted = logits - logits.max()
            losses.append(np.log(np.exp(shifted).sum()) - shifted[NAMES.index(true_name)])
    return float(np.mean(losses))


# --- the report's numbers -----------------------------------------------------------

def test_the_report_is_scikit_learns_arithmetic():
    """Random outputs in three batches, one class never predicted and one
    with no image: confusion matrix, precision, recall, F1, balanced and
    top-5 accuracy as scikit-learn computes them (undefined ratios: None
    here, NaN there)."""
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = rng.choice([0, 1, 2, 3, 4, 6, 7], size=90)       # no image of class 5
    outputs = rng.normal(size=(90, 8))
    outputs[:, 6] -= 10                                       # class 6 never predicted
    outputs[np.arange(90), labels] += rng.uniform(0, 2, 90)
    counts = report.Counts(8)
    for part in np.array_split(np.arange(90), 3):
        counts.add(labels[part], outputs[part])
    got = counts.report([f"c{i}" for i in range(8)])
    predicted = outputs.argmax(axis=1)
    np.testing.assert_array_equal(got["confusion_matrix"]["counts"],
                                  metrics.confusion_matrix(labels, predicted, labels=range(8)))
    precision, recall, f1, support = metrics.precision_recall_fscore_support(
        labels, predicted, labels=range(8), zero_division=np.nan)
    rows = got["per_class"]
    for name, values in (("precision", precision), ("recall", recall), ("f1", f1)):
        mine = np.array([np.nan if r[name] is None else r[name] for r in rows])
        np.testing.assert_allclose(mine, values, equal_nan=True, err_msg=name)
    assert [r["images"] for r in rows] == support.tolist()
    assert rows[6]["precision"] is None and rows[5]["recall"] is None
    assert got["accuracy"] == pytest.approx(metrics.accuracy_score(labels, predicted))
    assert got["balanced_accuracy"] == pytest.approx(
        np.mean([r for r in recall if not np.isnan(r)]))
    assert got["top5_accuracy"] == pytest.approx(
        metrics.top_k_accuracy_score(labels, outputs, k=5, labels=range(8)))


def test_top5_only_above_five_classes():
    for classes, top5 in ((5, None), (6, 1.0)):
        counts = report.Counts(classes)
        counts.add(np.array([0, 1]), np.eye(classes)[[1, 1]])
        got = counts.report([str(i) for i in range(classes)])
        assert got["top5_accuracy"] == top5
        assert ("top-5" in report.format_report(got)) == (top5 is not None)


# --- keras-vit evaluate -------------------------------------------------------------

def test_evaluate_gives_the_known_confusion_matrix_table_and_picture(colour_folder,
                                                                      tmp_path):
    model = colour_model(tmp_path / "colours.keras")
    plots = tmp_path / "plots"
    result = run_cli("evaluate", model, "--data", f"folder:{colour_folder}", "--json",
                     "--plot", plots)
    assert result.code == 0, result.err
    got = last_json(result.out)
    assert got["split"] == "validation" and got["images"] == 12
    assert got["confusion_matrix"]["labels"] == NAMES == got["class_names"]
    np.testing.assert_array_equal(got["confusion_matrix"]["counts"], EXPECTED)
    assert got["accuracy"] == pytest.approx(8 / 12)
    # gnu's image coloured as ant ranks gnu 7th of 7; dog's coloured as ant ranks it 4th
    assert got["top5_accuracy"] == pytest.approx(11 / 12)
    assert got["cross_entropy"] == pytest.approx(expected_cross_entropy(), rel=1e-5)
    bee = got["per_class"][1]
    assert bee == {"name": "bee", "images": 2, "correct": 1, "predicted": 2,
                   "precision": 0.5, "recall": 0.5, "f1": 0.5}
    assert got["per_class"][3]["precision"] is None  # dog: never predicted
    assert got["most_confused"][0] == {"true": "ant", "predicted": "bee", "images": 1}
    picture = plots / "confusion_matrix.png"
    assert got["plot"] == str(picture) and picture.stat().st_size > 5000
    with Image.open(picture) as image:
        side = int(100 * max(5.0, 0.45 * 7 + 2.5))
        assert image.size == (side, side)
    table = run_cli("evaluate", model, "--data", f"folder:{colour_folder}")
    assert table.code == 0 and not table.out.lstrip().startswith("{")
    lines = table.out.splitlines()
    assert any(line.startswith("top-1 accuracy") and "66.67%" in line for line in lines)
    assert any(line.startswith("top-5 accuracy") and "91.67%" in line for line in lines)
    assert "bee          2        1      0.500    0.500   0.500" in lines
    assert "3 dog    1    0    0    0    0    0    0" in lines


def test_a_missing_plotting_library_is_one_line_naming_the_extra(colour_folder, tmp_path,
                                                                  monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.metrics", None)  # import fails
    result = run_cli("evaluate", colour_model(tmp_path / "m.keras"), "--data",
                     f"folder:{colour_folder}", "--plot", tmp_path / "plots")
    one_error_line(result, "The confusion-matrix picture needs scikit-learn",
                   'pip install "keras-vision-transformer[plots]"')


# --- the end of train: the report, curves.png, the summary --------------------------

@pytest.fixture(scope="module")
def run(colour_folder, tmp_path_factory):
    """A tiny ViT with remat and LoRA trained two epochs through the CLI
    (train images: the validation ones again, under train/)."""
    root = tmp_path_factory.mktemp("run")
    data = root / "data"
    for split in ("train", "validation"):
        shutil.copytree(colour_folder / "validation", data / split)
    start = root / "start.keras"
    tiny_vit(classes=7, classifier_activation=None, remat=True).save(start)
    out = root / "run"
    result = run_cli("train", "--model", start, "--data", f"folder:{data}", "--recipe",
                     "scratch", "--batch-size", "4", "--epochs", "2", "--out", out,
                     "--lora", "2", "--quiet", "--json")
    assert result.code == 0, result.err[-3000:]
    return {"data": data, "out": out, "results": last_json(result.out), "err": result.err}


def test_train_ends_with_the_report_of_model_keras_and_its_pictures(run):
    results, out = run["results"], run["out"]
    evaluated = run_cli("evaluate", results["model"], "--data", f"folder:{run['data']}",
                        "--json")
    assert evaluated.code == 0, evaluated.err
    evaluated = last_json(evaluated.out)
    report_ = results["evaluation"]
    for key in ("confusion_matrix", "per_class", "top5_accuracy", "most_confused"):
        assert report_[key] == evaluated[key], key
    assert report_["accuracy"] == pytest.approx(results["val_accuracy"], abs=1e-6)
    assert report_["cross_entropy"] == pytest.approx(evaluated["cross_entropy"], rel=1e-5)
    assert "model.keras on the validation split:" in run["err"]
    assert "confusion matrix (rows: true class, columns: predicted class" in run["err"]
    assert results["pictures"] == {"curves": str(out / "curves.png"),
                                   "confusion_matrix": str(out / "confusion_matrix.png")}
    for path, size in ((out / "curves.png", (1000, 400)),
                       (out / "confusion_matrix.png", (565, 565))):
        assert path.stat().st_size > 5000
        with Image.open(path) as image:
            assert image.size == size


def test_the_summary_and_results_name_lora_and_remat(run):
    results = run["results"]
    assert results["lora"] == {"rank": 2, "targets": ["qkv", "attention_output"],
                               "default_targets": True, "layers": 2}
    assert results["remat"] is True and results["summary"]["remat"] is True
    assert ("LoRA        rank 2 on qkv, attention_output (the default targets): 2 Dense "
            "layers with adapters") in run["err"]
    assert "remat       on: each block's activations recomputed" in run["err"]


# --- keras-vit plot -----------------------------------------------------------------

def test_plot_redraws_the_curves_of_a_run(run, tmp_path):
    out = tmp_path / "again.png"
    result = run_cli("plot", run["out"], "--out", out, "--json")
    assert result.code == 0, result.err
    drawn = last_json(result.out)
    best = run["results"]["best"]
    assert drawn == {"run": str(run["out"]), "log": str(run["out"] / "log.csv"),
                     "curves": str(out), "epochs": 2, "best_epoch": best["epoch"],
                     "best_val_accuracy": pytest.approx(best["value"]),
                     "columns": ["loss", "val_loss", "accuracy", "val_accuracy"]}
    with Image.open(out) as image:
        assert image.size == (1000, 400)


def test_the_best_epoch_is_the_first_highest_finite_val_accuracy(tmp_path):
    (tmp_path / "log.csv").write_text(
        "epoch,accuracy,loss,val_accuracy,val_loss\n1,0.5,1.0,0.6,1.0\n"
        "2,0.6,nan,0.9,1.0\n3,0.7,0.8,0.8,0.9\n4,0.8,0.7,0.8,0.8\n5,0.9,0.6,inf,0.7\n")
    log = curves.read_log(str(tmp_path / "log.csv"))
    assert log.best_epoch() == 3  # 2: loss NaN; 5: not finite; 4: not better than 3
    result = run_cli("plot", tmp_path)
    assert result.code == 0, result.err
    assert result.out == (f"{tmp_path / 'curves.png'} (5 epochs of {tmp_path / 'log.csv'}; "
                          "best epoch 3, val_accuracy 0.8000)\n")


HEADER = "epoch,accuracy,loss,val_accuracy,val_loss\n"


@pytest.mark.parametrize("text, fragments", [
    (HEADER + "1,0.5,abc,0.5,1.0\n", ["log.csv row 2: loss is 'abc', not a number"]),
    ("epoch,accuracy,val_loss\n1,0.5,1.0\n", ["has no loss column"]),
    (HEADER + "1,0.5,1.0\n", ["row 2 has 3 fields, but its header has 5"]),
    (HEADER + "1,0.5,1.0,0.5,1.0\n3,0.5,1.0,0.5,1.0\n", ["records the epochs 1, 3, not 1"]),
    (HEADER, ["holds no epoch yet"]),
    ("", ["is empty"]),
    (b"epoch,loss\n1,\xff\n", ["is not UTF-8 text"]),
    ("x" * 2000, ["holds more than 1,000 bytes"]),
    ('epoch,loss\n1,"' + "9" * 200_000 + '"\n', ["cannot be read as CSV"]),
])
def test_a_tampered_log_is_one_sentence(tmp_path, monkeypatch, text, fragments):
    monkeypatch.setattr(curves, "MAX_LOG_BYTES", 1000 if text == "x" * 2000 else
                        curves.MAX_LOG_BYTES)
    log = tmp_path / "log.csv"
    log.write_bytes(text if isinstance(text, bytes) else text.encode())
    one_error_line(run_cli("plot", tmp_path), str(log), *fragments)
    assert not (tmp_path / "curves.png").exists()


def test_plot_refuses_links_folders_and_missing_logs(tmp_path):
    one_error_line(run_cli("plot", tmp_path / "none"), "is not a folder")
    one_error_line(run_cli("plot", tmp_path), "log.csv is not there")
    (tmp_path / "elsewhere.csv").write_text(HEADER + "1,0.5,1.0,0.5,1.0\n")
    os.symlink(tmp_path / "elsewhere.csv", tmp_path / "log.csv")
    one_error_line(run_cli("plot", tmp_path), "cannot be read as a training log (a symbolic "
                   "link)")
    os.remove(tmp_path / "log.csv")
    os.mkfifo(tmp_path / "log.csv")  # never blocks: opened without waiting, refused
    one_error_line(run_cli("plot", tmp_path), "is not a regular file")


def test_plot_replaces_a_planted_link_at_curves_png_and_never_writes_through_it(tmp_path):
    """A symbolic link planted at the run's curves.png (to a file of the
    user's) is replaced by the picture; the file it pointed to is untouched."""
    (tmp_path / "log.csv").write_text(HEADER + "1,0.5,1.0,0.5,1.0\n2,0.6,0.9,0.6,0.95\n")
    victim = tmp_path / "precious.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "curves.png")
    code, _, err = run_cli("plot", tmp_path)
    assert code == 0, err
    assert victim.read_text() == "precious"
    assert not os.path.islink(tmp_path / "curves.png")
    with Image.open(tmp_path / "curves.png") as picture:
        assert picture.size[0] > 100


def test_plot_loads_no_tensorflow(run):
    code = ("import sys, keras_vit_cli\n"
            "status = keras_vit_cli.main(['plot', sys.argv[1], '--json'])\n"
            "print(status, sorted(m for m in ('tensorflow', 'keras', 'jax', 'torch') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(run["out"])], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []"


# --- mistyped names and renamed flags -----------------------------------------------

def test_a_mistyped_model_name_is_told_before_any_work(tmp_path):
    # the data (nowhere) and the images (none) are never looked at
    for argv in (["train", "--model", "ViTTI16", "--data", "folder:/nowhere"],
                 ["predict", tmp_path / "none.png", "--model", "ViTTI16", "--weights", "x"],
                 ["download", "imagenet21k", "--model", "ViTTI16", "--print-url"]):
        one_error_line(run_cli(*argv), "Unknown --model 'ViTTI16' (did you mean 'ViTTi16'?); "
                                       "named models: ViTTi16, ViTS16")
    from keras_vit.training import train

    with pytest.raises(ValueError, match=r"Unknown model \(--model\) 'ViTB61' \(did you mean "
                                         r"'ViTB16'\?\)"):
        train("ViTB61", "folder:/nowhere")


def test_predict_ema_names_its_new_spelling(tmp_path):
    result = run_cli("predict", tmp_path / "x.png", "--weights", "a.npz", "--ema")
    assert result.code == 2 and result.err_lines == [
        "keras-vit predict: error: --ema is train's weight average (keras-vit train --ema "
        "DECAY); a PyTorch training checkpoint's EMA weights are --weights-ema (see keras-vit "
        "predict --help)"]
