"""The `tf_records` package (`python -m tf_records build|verify`) and reading
its output back: named shards and their info, resuming without rewriting,
a build that cannot mix runs or reuse a damaged shard, `verify` checking
the records against the manifest, and a killed build (or worker) that
leaves no partial shard and no process behind."""

import contextlib
import io
import json
import os
import pathlib
import re
import shutil
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
from tf_records import manifest
from tf_records.__main__ import main as tf_records_main
from tf_records.build import SLOW_WRITE_ENV, build
from tf_records.verify import verify


def tool(*args, check=True):
    """`python -m tf_records ARGS` in this process (its workers are processes
    of their own): a CompletedProcess with the exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = tf_records_main([str(a) for a in args])
    result = subprocess.CompletedProcess(["tf_records", *args], code, out.getvalue(),
                                         err.getvalue())
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


def test_one_worker_writes_in_this_process_the_records_of_two(built, tmp_path, monkeypatch):
    """`--workers 1` starts no process (no second TensorFlow import) and
    writes the same records, in the same shards, as two worker processes."""
    from tf_records import build as build_module

    def no_pool(*args, **kwargs):
        raise AssertionError("--workers 1 started a process pool")

    root, _, out, _ = built
    monkeypatch.setattr(build_module, "ProcessPoolExecutor", no_pool)
    here = tmp_path / "here"
    summary = last_json(tool("build", "--source", f"folder:{root}", "--out", str(here),
                             "--num-shards", "3", "--workers", "1", "--json"))
    assert (summary["num_examples"], summary["shards_written"]) == (15, 3)
    for name in (f"train-0000{i}-of-00003" for i in range(3)):
        # (compared as messages: a proto map's bytes are in no fixed order)
        records = [[tf.train.Example.FromString(r.numpy())
                    for r in tf.data.TFRecordDataset(str(folder / name))]
                   for folder in (out, here)]
        assert records[0] == records[1] and len(records[0]) == 5, name
    assert json.loads((here / "train.manifest.json").read_text()) == json.loads(
        (out / "train.manifest.json").read_text())


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
                 for xb, yb in dataset for x, y in zip(xb.numpy(), yb.numpy(), strict=True))
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
    if sys.platform.startswith("linux"):  # the writer is a worker of the build, not the build
        with open(f"/proc/{victim}/stat") as f:
            parent = int(f.read().rsplit(")", 1)[1].split()[1])
        assert parent == process.pid, (victim, parent, process.pid, sorted(
            p.name for p in out.iterdir()))
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


# --- a build that cannot mix runs or reuse a damaged shard; verify ---------------

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


@pytest.mark.parametrize("failure, overwrite", [("disk_full", False), ("ctrl_c", False),
                                               ("ctrl_c", True)])
def test_a_full_disk_or_ctrl_c_is_one_line_and_the_same_command_resumes(
        pristine, tmp_path, monkeypatch, failure, overwrite):
    """The writer of shard 1 fails after its first record: the disk is full
    (TensorFlow's error, as a real full disk gives it) or Ctrl-C. One line,
    no partial shard at a final name or as a temporary, the shard finished
    before it kept, and the same command (less --overwrite) resumes."""
    src, out = pristine[0], tmp_path / "out"
    failing = str(shard(out, 1))
    real_writer = tf.io.TFRecordWriter

    class Failing:
        def __init__(self, path):
            self.writer = real_writer(path)
            self.path = path

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.writer.close()

        def write(self, record):
            self.writer.write(record)
            self.writer.flush()
            if failure == "ctrl_c":
                raise KeyboardInterrupt
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{self.path}; No space left on device")

        def close(self):
            self.writer.close()

    def writer(path):
        folder, name = os.path.split(path)
        return Failing(path) if name.startswith(f".{shard(out, 1).name}.tmp-") \
            else real_writer(path)

    monkeypatch.setattr(tf.io, "TFRecordWriter", writer)  # --workers 1 writes in this process
    command = ("build", "--source", f"folder:{src}", "--out", out,
               "--num-shards", SHARDS, "--workers", 1, "--json")
    result = tool(*command, *(["--overwrite"] if overwrite else []), check=False)
    if failure == "ctrl_c":
        resume = ("re-run the same command without --overwrite to resume (with it, the build "
                  "starts over)" if overwrite else "re-run the same command to resume")
        assert (result.returncode, result.stderr) == (130, (
            f"tf_records build: interrupted; the finished train shards in {out} are kept and "
            f"no partial shard has a final name: {resume}.\n"))
    else:
        assert (result.returncode, result.stderr) == (2, (
            f"tf_records build: error: No space left on device writing {failing!r}: the "
            f"finished train shards in {out} are kept and no partial shard has a final name; "
            "free some space and re-run the same command to resume.\n"))
    # one worker writes the shards in order in this process: it stopped at shard 1
    assert sorted(p.name for p in out.iterdir()) == [shard(out, 0).name, "train.manifest.json"]
    monkeypatch.setattr(tf.io, "TFRecordWriter", real_writer)
    summary = last_json(tool(*command))
    assert (summary["shards_written"], summary["shards_reused"]) == (3, 1)
    for index in range(SHARDS):
        assert names_in(shard(out, index)) == names_in(shard(pristine[1], index))
