"""`python -m tf_records build|verify`, and reading its output back."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from data_helpers import CLASSES, make_folder
from official_fixtures import REPO_ROOT

from keras_vit import data
from keras_vit.data import schema
from tf_records.build import SLOW_WRITE_ENV


def tool(*args, env=None, check=True):
    result = subprocess.run(
        [sys.executable, "-m", "tf_records", *args], check=False, cwd=REPO_ROOT,
        env=dict(os.environ, **(env or {})), capture_output=True, text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(result.stdout + result.stderr[-3000:])
    return result


def last_json(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    truth = make_folder(str(root), per_class=5)
    out = tmp_path_factory.mktemp("records")
    summary = last_json(tool("build", "--source", f"folder:{root}", "--split", "train",
                             "--out", str(out), "--num-shards", "3", "--workers", "2", "--json"))
    return root, truth, out, summary


def test_build_writes_named_shards_and_info(built):
    _, truth, out, summary = built
    assert summary["num_examples"] == len(truth) == 15
    assert summary["shards_written"] == 3 and summary["skipped_corrupt"] == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["dataset_info.json", "train-00000-of-00003", "train-00001-of-00003",
                     "train-00002-of-00003", "train.manifest.json"]
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["class_names"] == list(CLASSES)
    assert info["splits"]["train"]["num_examples"] == 15


def test_verify_reports_counts(built):
    _, _, out, _ = built
    report = last_json(tool("verify", str(out), "--json"))
    assert report["ok"] and report["splits"]["train"]["num_examples"] == 15
    text = tool("verify", str(out)).stdout
    assert "train: 15 records in 3 shards" in text and text.strip().endswith("OK")


def test_records_equal_the_source_files(built):
    _, truth, out, _ = built
    src = data.open_source(f"tfrecord:{out}", "train")
    assert src.class_names == list(CLASSES) and src.num_examples == 15
    by_name = {"/".join(pathlib.Path(p).parts[-2:]): (p, label)
               for p, (label, _) in truth.items()}
    seen = set()
    for encoded, label, filename in src.dataset:
        path, expected_label = by_name[filename.numpy().decode()]
        assert int(label) == expected_label
        assert encoded.numpy() == pathlib.Path(path).read_bytes()
        seen.add(path)
    assert seen == set(truth)


def test_dataset_from_records_gives_the_source_pixels(built):
    _, truth, out, _ = built
    dataset = data.make_dataset(f"tfrecord:{out}", image_size=64, batch_size=4)
    got = sorted((int(y.argmax()), x.astype("uint8").tobytes())
                 for xb, yb in dataset for x, y in zip(xb.numpy(), yb.numpy()))
    expected = sorted((label, pixels.tobytes()) for label, pixels in truth.values())
    assert got == expected


def test_rerun_resumes_without_rewriting(built):
    root, _, out, _ = built
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("train-*")}
    summary = last_json(tool("build", "--source", f"folder:{root}", "--out", str(out),
                             "--num-shards", "3", "--workers", "2", "--json"))
    assert summary["shards_written"] == 0 and summary["shards_reused"] == 3
    assert summary["num_examples"] == 15
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("train-*")}


def test_interrupted_build_leaves_no_partial_final_shard(tmp_path):
    root = tmp_path / "folder"
    make_folder(str(root), per_class=8)
    out = tmp_path / "records"
    command = [sys.executable, "-m", "tf_records", "build", "--source", f"folder:{root}",
               "--out", str(out), "--num-shards", "4", "--workers", "2", "--json"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env=dict(os.environ, **{SLOW_WRITE_ENV: "0.2"}))
    deadline = time.time() + 120
    victim = None
    while time.time() < deadline and victim is None:
        temporary = [p for p in out.glob(".train-*.tmp-*")] if out.exists() else []
        ready = [p for p in temporary if p.stat().st_size > 0]
        if ready:
            victim = int(ready[0].name.rsplit("-", 1)[1])
        time.sleep(0.05)
    assert victim is not None, "no shard was being written"
    os.kill(victim, signal.SIGKILL)  # a worker dies mid-shard
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2
    assert "A worker process died while writing" in stderr.decode()
    for shard in out.glob("train-*-of-*"):  # every final-named shard is complete
        assert sum(1 for _ in tf.data.TFRecordDataset(str(shard))) == 6
    summary = last_json(tool("build", "--source", f"folder:{root}", "--out", str(out),
                             "--num-shards", "4", "--workers", "2", "--json"))
    assert summary["num_examples"] == 24 and summary["shards_written"] >= 1
    assert not list(out.glob(".*tmp*"))
    assert last_json(tool("verify", str(out), "--json"))["ok"]


def test_corrupt_source_file_fails_or_is_skipped(tmp_path):
    root = tmp_path / "folder"
    make_folder(str(root), per_class=2)
    (root / "flower" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    result = tool("build", "--source", f"folder:{root}", "--out", str(tmp_path / "a"),
                  "--num-shards", "2", "--workers", "1", check=False)
    assert result.returncode == 2
    assert "Corrupt or non-image file" in result.stderr and "broken.jpg" in result.stderr
    assert "--skip-corrupt" in result.stderr
    summary = last_json(tool("build", "--source", f"folder:{root}", "--out", str(tmp_path / "b"),
                             "--num-shards", "2", "--workers", "1", "--skip-corrupt", "--json"))
    assert summary["num_examples"] == 6 and summary["skipped_corrupt"] == 1
    assert "broken.jpg" in summary["skipped_files"][0]


def test_verify_names_a_corrupt_record(tmp_path):
    good = tf.io.encode_png(np.zeros((4, 4, 3), "uint8")).numpy()
    path = tmp_path / schema.shard_name("val", 0, 1)
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(schema.encode_example(good, 0, image_format="PNG", height=4, width=4))
        writer.write(schema.encode_example(b"garbage", 1, image_format="JPEG"))
    result = tool("verify", str(tmp_path), "--json", check=False)
    report = last_json(result)
    assert result.returncode == 1 and not report["ok"]
    assert report["corrupt"][0]["file"] == "val-00000-of-00001"
    assert report["corrupt"][0]["index"] == 1
    assert report["splits"]["val"]["num_examples"] == 2


def test_tpu_imagenet_style_records_read_with_label_offset(tmp_path):
    """Existing ImageNet shards: 1-based labels, no dataset_info.json."""
    pixels = np.full((8, 8, 3), 200, "uint8")
    path = tmp_path / "train-00000-of-01024"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in (1, 1000):
            writer.write(schema.encode_example(tf.io.encode_jpeg(pixels).numpy(), label,
                                               image_format="JPEG", text="n0", filename="x.JPEG"))
    dataset = data.make_dataset(f"tfrecord:{tmp_path}/train-*", image_size=8, batch_size=2,
                                num_classes=1000, label_offset=-1)
    _, labels = next(iter(dataset))
    assert labels.numpy().argmax(1).tolist() == [0, 999]
