"""Bounds at the edges of export and predict (issue 25, items 11, 12, 14):
stale temporaries of killed exports are removed at the next export (only
those whose process is gone); absurd batch sizes are one line naming the
allowed range; `predict` streams many large photos in bounded memory with
the results of the per-image path; a full disk is one sentence naming the
folder (issue 29)."""

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from conftest import process_env, random_weights, run_cli, tiny_vit
from keras_vit import export
from keras_vit.export.batches import batched, check_batch_size
from keras_vit.export._files import remove_stale_temporaries, temporary_path
from official_fixtures import REPO_ROOT

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="export needs the TensorFlow backend")
SIZE = 32
LIMIT_32PX = 21845  # 256 MiB of float32 32x32 RGB images


def tiny():
    """conftest's tiny ViT (32x32 images) with 5 logits, its weights redrawn."""
    return random_weights(tiny_vit(classes=5, classifier_activation=None))


def pixels(n, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (n, SIZE, SIZE, 3)).astype("float32")


# --- item 14: stale temporaries -------------------------------------------

def dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def with_pid(temporary, pid, host=None):
    """`temporary` (`.<name>.tmp-<host>-<pid>-<random>`) as made by `pid`."""
    head, _, random = temporary.rsplit("-", 2)
    if host is not None:
        head = head.rsplit("-", 1)[0] + f"-{host}"
    return f"{head}-{pid}-{random}"


def stale_removed_lines(caplog):
    return [r.getMessage() for r in caplog.records if "stale temporar" in r.getMessage()]


def test_a_stale_temporary_is_removed_at_the_next_export_and_live_ones_kept(tmp_path,
                                                                           caplog):
    target = tmp_path / "m.tflite"
    mine = temporary_path(str(target))  # this process: alive
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        running = with_pid(mine, sleeper.pid)  # a concurrent export to the same target
        dead = with_pid(mine, dead_pid())
        elsewhere = with_pid(dead, dead_pid(), host="another_machine")  # pid unknowable
        other_target = with_pid(temporary_path(str(tmp_path / "n.tflite")), dead_pid())
        for path in (mine, running, elsewhere, other_target):
            with open(path, "wb") as f:
                f.write(b"x" * 10)
        with open(dead, "wb") as f:
            f.write(b"x" * 1_500_000)
        caplog.set_level(logging.WARNING, logger="keras_vit")
        export.to_tflite(tiny(), target, validation_data=pixels(2), latency_repeats=1,
                         verbose=False)
        assert not os.path.exists(dead)
        for kept in (mine, running, elsewhere, other_target):
            assert os.path.exists(kept), kept
        assert stale_removed_lines(caplog) == [
            f"Removed 1 stale temporary of {target} left by an export whose process is "
            "gone (1.5 MB freed)."]
        assert target.exists() and not os.path.exists(f"{dead}.old")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_killed_saved_model_export_leaves_directories_that_the_next_one_removes(
        tmp_path, caplog):
    target = tmp_path / "sm"
    dead = with_pid(temporary_path(str(target)), dead_pid())
    for directory in (dead, dead + ".labels", dead + ".old"):  # every temporary it makes
        os.makedirs(os.path.join(directory, "variables"))
        with open(os.path.join(directory, "variables", "data"), "wb") as f:
            f.write(b"x" * 100_000)
    caplog.set_level(logging.WARNING, logger="keras_vit")
    export.to_saved_model(tiny(), target, validation_data=pixels(2), verbose=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm"]
    assert stale_removed_lines(caplog) == [
        f"Removed 3 stale temporaries of {target} left by an export whose process is gone "
        "(0.3 MB freed)."]


def test_nothing_stale_says_nothing(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="keras_vit")
    assert remove_stale_temporaries(str(tmp_path / "m.onnx")) == 0
    assert caplog.records == []


# --- item 12: absurd batch sizes ------------------------------------------

def test_check_batch_size_names_the_value_and_the_allowed_range():
    assert check_batch_size(445, (224, 224)) == 445
    with pytest.raises(ValueError, match=r"^batch_size=446; allowed: 1\.\.445 \(a batch of "
                                         r"224x224 RGB images holds at most 256 MiB of "
                                         r"float32 pixels\)\.$"):
        check_batch_size(446, (224, 224))
    for bad in (0, -1, True, 2.0, "8"):
        with pytest.raises(ValueError, match=rf"^batch_size={bad!r}; allowed: 1\.\."):
            check_batch_size(bad, (224, 224))
    with pytest.raises(ValueError, match=r"^--batch-size 10000000; allowed: 1\.\.21845 "):
        check_batch_size(10**7, (SIZE, SIZE), "--batch-size")


def test_batched_clips_a_batch_larger_than_the_images_and_refuses_zero():
    calls = []
    got = batched(lambda x: calls.append(len(x)) or x[:, 0], np.arange(10.0)[:, None],
                  batch=10**12)
    assert calls == [10] and got.tolist() == list(range(10))
    with pytest.raises(ValueError, match=r"^batch=0; allowed: a positive int"):
        batched(lambda x: x, np.zeros((3, 1)), batch=0)


def test_an_absurd_tflite_batch_is_one_error_before_any_work(tmp_path):
    with pytest.raises(ValueError, match=rf"^batch_size=1000000; allowed: 1\.\.{LIMIT_32PX} "):
        export.to_tflite(tiny(), tmp_path / "m.tflite", batch_size=10**6, verbose=False)
    with pytest.raises(ValueError, match=rf"^batch_size=1000000; allowed: 1\.\.{LIMIT_32PX} "):
        export.convert(tiny(), batch_size=10**6)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("module, fmt, suffix", [("tflite", "_TFLite", "tflite"),
                                                  ("onnx", "_ONNX", "onnx")])
def test_a_full_disk_is_one_sentence_naming_the_folder_and_leaves_nothing(
        tmp_path, monkeypatch, module, fmt, suffix):
    """The disk fills while the export is written (a write that raises
    ENOSPC, as `f.write` does, without a file name): one OSError naming the
    folder, the target unchanged, no temporary left; the CLI says it in one
    line."""
    import importlib

    cls = getattr(importlib.import_module(f"keras_vit.export.{module}"), fmt)

    def full(self, temporary, names):
        with open(temporary, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cls, "prepare", lambda self, calibration: None)  # no conversion
    monkeypatch.setattr(cls, "write", full)
    out = tmp_path / "out"
    path = str(out / f"m.{suffix}")
    expected = (f"No space left on device writing in {str(out)!r} (the {suffix} export to "
                f"{path!r}); {path!r} is unchanged and the partial files are removed: free "
                "some space and run the export again (it starts over).")
    with pytest.raises(OSError) as info:
        getattr(export, f"to_{suffix}")(tiny(), path, validation_data=pixels(2),
                                        verbose=False)
    assert str(info.value) == expected and info.value.errno == errno.ENOSPC
    assert list(out.iterdir()) == []
    model = tmp_path / "m.keras"
    tiny().save(model)
    code, _, err = run_cli("export", model, "--format", suffix, "--out", path)
    assert (code, err) == (2, f"keras-vit: error: {expected}\n")
    assert list(out.iterdir()) == []


def test_cli_batch_sizes_are_one_line(tmp_path):
    model = tmp_path / "m.keras"
    tiny().save(model)
    code, _, err = run_cli("export", model, "--format", "tflite", "--batch-size", "1000000",
                           "--out", tmp_path / "m.tflite")
    assert code == 2 and err == (
        f"keras-vit: error: --batch-size 1000000; allowed: 1..{LIMIT_32PX} (a batch of 32x32 "
        "RGB images holds at most 256 MiB of float32 pixels).\n")
    code, _, err = run_cli("export", model, "--format", "saved_model", "--batch-size", "8",
                           "--out", tmp_path / "sm")
    assert code == 2 and err == (
        "keras-vit: error: --batch-size applies to --format tflite (a static batch); the "
        "saved_model export takes any batch size.\n")
    image = tmp_path / "a.png"
    keras.utils.save_img(image, pixels(1)[0].astype("uint8"))
    code, _, err = run_cli("predict", image, "--model", model, "--batch-size", "100000")
    assert code == 2 and err.startswith(
        f"keras-vit: error: --batch-size 100000; allowed: 1..{LIMIT_32PX} (")
    assert not (tmp_path / "m.tflite").exists() and not (tmp_path / "sm").exists()


# --- item 11: predict streams large photos ---------------------------------

# In a child process: predict three photos (one of them 12 MP) and the
# per-image path of earlier releases (each decoded at full size, resized,
# then one model.predict of them all) on the same files; then, with the
# address space capped at what the process holds plus BUDGET, predict the
# 12 MP photo COPIES times (decoded all at once, as before, they need
# COPIES x 36 MB).
PREDICT_UNDER_A_CAP = """
import io, json, resource, sys
import numpy as np, tensorflow as tf, keras
from keras_vit.cli import main

model_path, budget, copies, *paths = sys.argv[1:]

def predict(*args):
    out = io.StringIO()
    assert main(["predict", *args, "--model", model_path, "--json", "--top", "5"],
                out=out) == 0
    return json.loads(out.getvalue())["predictions"]

streamed = predict(*paths)
in_twos = predict(*paths, "--batch-size", "2")
model = keras.saving.load_model(model_path)
decoded = [tf.io.decode_image(open(p, "rb").read(), channels=3, expand_animations=False)
           for p in paths]
resized = np.stack([tf.image.resize(i, (32, 32), method="bilinear").numpy()
                    for i in decoded]).astype("float32")
logits = np.asarray(model.predict(resized, batch_size=32, verbose=0), "float64")
probs = np.exp(logits - logits.max(1, keepdims=True))
probs /= probs.sum(1, keepdims=True)
del decoded
for line in open("/proc/self/status"):
    if line.startswith("VmSize:"):
        limit = int(line.split()[1]) * 1024 + int(budget)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
many = predict(*[paths[0]] * int(copies))
print(json.dumps({"streamed": streamed, "in_twos": in_twos, "many": many,
                  "per_image": probs.tolist()}))
"""


def photos(tmp_path):
    """scikit-learn's two photos: one at 12 MP, one at 2 MP; and a small PNG."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    china, flower = load_sample_images().images
    paths = [tmp_path / "big.jpg", tmp_path / "flower.jpg", tmp_path / "small.png"]
    Image.fromarray(china).resize((4000, 3000), Image.BICUBIC).save(paths[0], quality=90)
    Image.fromarray(flower).resize((1600, 1200), Image.BICUBIC).save(paths[1], quality=90)
    Image.fromarray(flower[::8, ::8]).save(paths[2])
    return [str(p) for p in paths]


def test_predict_streams_many_large_photos_in_bounded_memory(tmp_path):
    model = tmp_path / "m.keras"
    tiny().save(model)
    paths = photos(tmp_path)
    budget, copies = 256 * 2**20, 12
    # a process of its own: the address-space cap (RLIMIT_AS) is set in it
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PREDICT_UNDER_A_CAP), str(model), str(budget),
         str(copies), *paths], capture_output=True, text=True, cwd=REPO_ROOT,
        env=process_env({"TF_CPP_MIN_LOG_LEVEL": "2"}), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    streamed = data["streamed"]
    assert [p["image"] for p in streamed] == paths
    for prediction, probabilities in zip(streamed, data["per_image"], strict=True):
        order = np.argsort(-np.asarray(probabilities), kind="stable")
        assert [row["index"] for row in prediction["top"]] == order.tolist()
        # the same batch of 3 as the per-image path: the same numbers
        assert [row["probability"] for row in prediction["top"]] == [
            probabilities[i] for i in order]
    for two, one in zip(data["in_twos"], streamed, strict=True):  # other batches: float32 rounding
        assert [r["index"] for r in two["top"]] == [r["index"] for r in one["top"]]
        np.testing.assert_allclose([r["probability"] for r in two["top"]],
                                   [r["probability"] for r in one["top"]], rtol=1e-5)
    assert len(data["many"]) == copies
    for prediction in data["many"]:
        assert prediction["image"] == paths[0]
        assert [r["index"] for r in prediction["top"]] == [
            r["index"] for r in streamed[0]["top"]]
        np.testing.assert_allclose([r["probability"] for r in prediction["top"]],
                                   [r["probability"] for r in streamed[0]["top"]], rtol=1e-5)
