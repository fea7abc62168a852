"""`tf_records build` cannot mix runs or reuse a damaged shard, `verify`
checks the records against the manifest, and a killed build leaves no
process behind (issue #17, items 1-3)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from data_helpers import make_folder
from official_fixtures import REPO_ROOT
from test_tf_records import tool

from keras_vit.data import schema
from tf_records import manifest
from tf_records.build import SLOW_WRITE_ENV, build
from tf_records.verify import verify

SHARDS = 4
REMEDY = ("; delete them and rerun the same command to rewrite them, or pass --overwrite "
          "to start over.")


def run(src, out, num_shards=SHARDS, workers=1, **kwargs):
    return build(f"folder:{src}", "train", str(out), num_shards, workers, verbose=False,
                 **kwargs)


def shard(out, index):
    return out / schema.shard_name("train", index, SHARDS)


def names_in(path):
    return sorted(schema.parse_example(r)["image/filename"].numpy().decode()
                  for r in tf.data.TFRecordDataset(str(path)))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A folder of 12 images and its 4 shards of 3 records."""
    src = tmp_path_factory.mktemp("src")
    make_folder(str(src), per_class=4)
    out = tmp_path_factory.mktemp("pristine")
    run(src, out)
    return src, out


@pytest.fixture
def out(pristine, tmp_path):
    """A copy of the pristine shards, for a test to damage."""
    shutil.copytree(pristine[1], tmp_path / "out")
    return tmp_path / "out"


def test_resume_with_other_arguments_is_refused(pristine, out):
    src = pristine[0]
    shard(out, 0).unlink()  # the state after an interrupted build
    shard(out, 1).unlink()
    for kwargs, flag, then, now in (({"seed": 1}, "--seed", 0, 1),
                                    ({"num_shards": 3}, "--num-shards", 4, 3)):
        with pytest.raises(ValueError, match=re.escape(
                f"The train shards in {out} were built with {flag} {then}, this run has "
                f"{flag} {now}; rerun with {flag} {then} to resume them, or pass "
                "--overwrite to start over.")):
            run(src, out, **kwargs)
    summary = run(src, out)  # the same arguments resume
    assert (summary["shards_written"], summary["shards_reused"], summary["num_examples"]) \
        == (2, 2, 12)
    assert verify(str(out))["ok"]


def test_resume_after_the_source_folder_changed_is_refused(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(str(src), per_class=3)
    run(src, out, num_shards=2)
    (out / "train-00001-of-00002").unlink()
    shutil.copy(src / "china" / "0.jpg", src / "china" / "new.jpg")
    shutil.copy(src / "flower" / "0.jpg", src / "flower" / "new.jpg")
    (src / "stripes" / "0.png").unlink()
    with open(src / "flower" / "1.jpg", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match=re.escape(
            f"The source folder changed since the train shards in {out} were written: "
            "2 files added, 1 removed, 1 modified (e.g. 'china/new.jpg' added); pass "
            "--overwrite to start over.")):
        run(src, out, num_shards=2)
    summary = run(src, out, num_shards=2, overwrite=True)
    assert summary["shards_written"] == 2 and summary["num_examples"] == 10
    assert verify(str(out))["ok"]


def test_shards_without_a_manifest_are_not_resumed(pristine, out):
    (out / "train.manifest.json").unlink()  # as written by the code before manifests
    shard(out, 3).unlink()
    with pytest.raises(ValueError, match=re.escape(
            f"{out} holds train shards but no train.manifest.json (written by an older "
            "tf_records build or another tool), so they cannot be checked against this "
            "source; pass --overwrite to rebuild them.")):
        run(pristine[0], out)


def test_an_empty_finished_shard_is_named_not_reused(pristine, out):
    shard(out, 1).write_bytes(b"")
    info = (out / "dataset_info.json").read_text()
    with pytest.raises(OSError, match=re.escape(
            f"Damaged finished train shard(s) in {out}: train-00001-of-00004 (0 records, "
            f"its manifest says 3){REMEDY}")):
        run(pristine[0], out)
    assert (out / "dataset_info.json").read_text() == info
    report = verify(str(out))
    assert not report["ok"]
    assert "train-00001-of-00004: 0 records, its manifest says 3" in report["problems"]


def test_a_corrupt_finished_shard_is_named_with_the_remedy(pristine, out):
    data = bytearray(shard(out, 2).read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard(out, 2).write_bytes(bytes(data))
    result = tool("build", "--source", f"folder:{pristine[0]}", "--out", str(out),
                  "--num-shards", str(SHARDS), "--workers", "1", check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert re.fullmatch(
        rf"tf_records build: error: Damaged finished train shard\(s\) in {re.escape(str(out))}"
        rf": train-00002-of-00004 \(corrupted record at \d+\){re.escape(REMEDY)}",
        result.stderr.strip().splitlines()[-1])
    shard(out, 2).unlink()  # the remedy
    summary = run(pristine[0], out)
    assert (summary["shards_written"], summary["shards_reused"]) == (1, 3)
    assert verify(str(out))["ok"]


@pytest.mark.parametrize("with_info", [False, True])
def test_verify_fails_on_an_empty_shard(tmp_path, with_info):
    png = tf.io.encode_png(np.zeros((4, 4, 3), "uint8")).numpy()
    with tf.io.TFRecordWriter(str(tmp_path / "val-00000-of-00002")) as writer:
        writer.write(schema.encode_example(png, 0, image_format="PNG", filename="a/0.png"))
    (tmp_path / "val-00001-of-00002").write_bytes(b"")
    if with_info:
        (tmp_path / "dataset_info.json").write_text(
            json.dumps({"splits": {"val": {"num_examples": 1}}}))
    report = verify(str(tmp_path))
    assert not report["ok"]
    assert report["problems"] == ["val-00001-of-00002: empty shard (no records)"]


def test_verify_finds_duplicated_and_missing_source_files(pristine, out):
    shutil.copy(shard(out, 0), shard(out, 1))  # what a build mixing two runs left
    twice, lost = names_in(shard(out, 0)), names_in(shard(pristine[1], 1))
    duplicated = f"train: source files in more than one record: 3 ({', '.join(twice)})"
    report = verify(str(out))
    assert not report["ok"] and report["problems"] == [
        duplicated, f"train: source files of the manifest with no record: 3 ({', '.join(lost)})"]
    (out / "train.manifest.json").unlink()  # duplicates are found without a manifest too
    report = verify(str(out))
    assert report["problems"] == [duplicated] and not report["splits"]["train"]["manifest"]


def test_skipped_corrupt_files_are_recorded_and_resumed(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(str(src), per_class=2)
    (src / "flower" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    run(src, out, num_shards=2, skip_corrupt=True)
    assert verify(str(out))["ok"]  # the skipped file is not missing
    summary = run(src, out, num_shards=2)  # every shard reused, the skipped file still told
    assert (summary["shards_reused"], summary["num_examples"]) == (2, 6)
    assert summary["skipped_corrupt"] == 1
    assert summary["skipped_files"][0].startswith("flower/broken.jpg: ")


def test_more_shards_than_files_is_refused(pristine, tmp_path):
    with pytest.raises(ValueError, match=re.escape(
            f"--num-shards 13 is more than the 12 examples of folder:{pristine[0]} (train); "
            "give at most 12, so that no shard is empty.")):
        run(pristine[0], tmp_path / "out", num_shards=13)


def test_tfds_manifest_difference_names_the_versions():
    old = {"format": 1, "split": "train", "source": "tfds:mnist", "seed": None,
           "num_shards": 2, "class_names": ["0", "1"],
           "tfds": {"name": "mnist", "version": "3.0.1", "split": "train",
                    "num_examples": 60000}}
    new = dict(old, tfds=dict(old["tfds"], version="3.0.2"))
    where = "the train shards in /out"
    assert manifest.difference(old, old, where) is None
    assert manifest.difference(old, new, where) == (
        "The TFDS dataset changed since the train shards in /out were written (mnist 3.0.1 "
        "train: 60000 examples then, mnist 3.0.2 train: 60000 examples now); pass "
        "--overwrite to start over.")


def marked(marker):
    """Pids of the live processes whose environment holds `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    pids.append(int(entry))
        except (OSError, ValueError):
            continue
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_build_leaves_no_process_behind(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    make_folder(str(src), per_class=4)
    marker = f"KERAS_VIT_TEST_MARKER={tmp_path}".encode()
    process = subprocess.Popen(
        [sys.executable, "-m", "tf_records", "build", "--source", f"folder:{src}", "--out",
         str(out), "--num-shards", str(SHARDS), "--workers", "2", "--json"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, **{SLOW_WRITE_ENV: "0.5", "KERAS_VIT_TEST_MARKER": str(tmp_path)}))
    deadline = time.time() + 180
    while time.time() < deadline and not list(out.glob(".train-*.tmp-*")):
        time.sleep(0.05)
    assert list(out.glob(".train-*.tmp-*")), "no shard was being written"
    assert len(marked(marker)) >= 4  # the build, 2 workers, the resource tracker
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.time() + 5
    while marked(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert marked(marker) == []
    shards = sorted(p.name for p in out.glob("train-*"))
    time.sleep(2)  # a worker left writing would finish a shard (3 x 0.5 s) by now
    assert sorted(p.name for p in out.glob("train-*")) == shards
    summary = run(src, out)  # the same command resumes
    assert summary["shards_reused"] == len(shards) and summary["num_examples"] == 12
    assert verify(str(out))["ok"]
