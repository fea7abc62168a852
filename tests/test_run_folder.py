"""keras_vit.training.run_folder, `train`'s output folder: a run resumes
only its own state (the run record), a finished or foreign run is refused
in one sentence, --overwrite starts afresh, and one process writes a folder
at a time."""

import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from data_helpers import CLASSES, make_folder

import keras_vit
from conftest import run_cli, tiny_keras_file
from keras_vit.training import run_folder, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Two 3-class folders of 18 real-photo crops (32 px): X with the
    classes china/flower/stripes, Y the same images under a/b/c; and a
    tiny fixed-size (32x32) `.keras` model."""
    root = tmp_path_factory.mktemp("runs")
    make_folder(str(root / "X"), per_class=6, size=32)
    make_folder(str(root / "Y"), per_class=6, size=32)
    for old, new in zip(CLASSES, "abc", strict=True):
        os.rename(root / "Y" / old, root / "Y" / new)
    tiny_keras_file(root / "tiny.keras", classifier="gap", classifier_activation=None)
    return root


class _CtrlC(keras.callbacks.Callback):
    """Ctrl-C after epoch 2 (after BackupAndRestore saved it)."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt


def _train(folders, data, out, **kwargs):
    kwargs = dict(dict(recipe="scratch", batch_size=4, epochs=4, verbose=0), **kwargs)
    return trainer.train(str(folders / "tiny.keras"), f"folder:{folders / data}",
                         out=str(out), **kwargs)


def test_a_run_resumes_only_its_own_state(folders, tmp_path, monkeypatch):
    out = tmp_path / "run"
    original = trainer.default_callbacks
    monkeypatch.setattr(trainer, "default_callbacks",
                        lambda *a, **k: original(*a, **k) + [_CtrlC()])
    with pytest.raises(KeyboardInterrupt):
        _train(folders, "X", out)  # run A, stopped after epoch 2
    monkeypatch.setattr(trainer, "default_callbacks", original)
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "running" and record["config"]["class_names"] == list(CLASSES)
    assert record["config"]["image_size"] == 32  # the .keras model's fixed size

    # run B: another folder, same --out: refused before any work, nothing touched
    before = sorted(os.listdir(out))
    with pytest.raises(ValueError) as error:
        _train(folders, "Y", out)
    assert str(error.value) == (
        f"{out} holds a different run (model tiny.keras, data folder:{folders / 'X'}, "
        f"3 classes china..stripes; its data is 'folder:{folders / 'X'}', this run's is "
        f"'folder:{folders / 'Y'}'); pass --out NEW or --overwrite (train(..., out=NEW) or "
        "overwrite=True).")
    assert sorted(os.listdir(out)) == before

    # run A again: resumes after epoch 2, and says so
    results = _train(folders, "X", out)
    assert results["resumed"] and results["first_epoch_run_now"] == 3
    assert results["summary"]["run"].startswith(
        f"resuming at epoch 3 of 4 of the run started {record['started']}")
    assert json.loads((out / "run.json").read_text())["status"] == "completed"

    # a finished run is not run again silently
    with pytest.raises(ValueError, match=r"holds a completed run of the same configuration "
                                         r"\(model tiny\.keras, .*; pass --out NEW or "
                                         r"--overwrite"):
        _train(folders, "X", out)

    # --overwrite: B starts afresh; nothing of A's run is left
    results = _train(folders, "Y", out, overwrite=True, epochs=1)
    assert not results["resumed"] and results["first_epoch_run_now"] == 1
    steps = results["summary"]["steps_per_epoch"]
    assert (f" 1 epoch x {steps} steps = {steps} batches\n"
            in trainer.format_summary(results["summary"]))  # not "1 epochs"
    assert results["best"]["epoch"] == 1
    assert json.loads((out / "best.keras.json").read_text()) == results["best"]
    log = (out / "log.csv").read_text().strip().splitlines()
    assert log[1:] and log[0].startswith("epoch,") and log[1].startswith("1,")
    assert len(log) == 2  # one header, one epoch (counted from 1): A's rows are gone
    assert (out / "labels.txt").read_text().split("\n")[:3] == ["a", "b", "c"]
    for name in ("model.keras", "best.keras"):
        model = keras.saving.load_model(out / name)
        assert keras_vit.labels.class_names(model) == ["a", "b", "c"]


def test_run_files_without_a_record_are_refused(tmp_path):
    (tmp_path / "log.csv").write_text("epoch,loss\n0,1.0\n")
    (tmp_path / "notes.txt").write_text("mine")
    config = {"model": "ViTTi16", "data": "folder:/x", "class_names": ["a", "b"]}
    with pytest.raises(ValueError, match=r"holds the files of a run without a run record "
                                         r"\(log\.csv; no run\.json"):
        with run_folder.open_run_folder(str(tmp_path), config):
            pass
    with run_folder.open_run_folder(str(tmp_path), config, overwrite=True) as folder:
        assert folder.describe().startswith("new run")
    assert sorted(os.listdir(tmp_path)) == [".run.lock", "notes.txt", "run.json"]


def test_a_same_run_killed_before_its_first_backup_starts_again(tmp_path):
    config = {"model": "ViTTi16", "data": "folder:/x", "class_names": ["a", "b"]}
    with run_folder.open_run_folder(str(tmp_path), config):
        (tmp_path / "log.csv").write_text("epoch,loss\n")  # killed here: no backup
    with run_folder.open_run_folder(str(tmp_path), config) as folder:
        assert folder.resumed_epoch == 0
    assert not (tmp_path / "log.csv").exists()


def test_a_run_stopped_by_an_error_before_its_first_epoch_leaves_the_folder_free(tmp_path):
    """A refusal before the first step (too little memory), a corrupt image
    or Ctrl-C in epoch 1: the folder then takes a different run without
    --overwrite. A run with a backup, or other files, keeps everything."""
    config = {"model": "ViTTi16", "data": "folder:/x", "class_names": ["a", "b"]}
    other = dict(config, data="folder:/y")
    for stop in (ValueError("no"), KeyboardInterrupt()):
        with pytest.raises(type(stop)):
            with run_folder.open_run_folder(str(tmp_path), config):
                (tmp_path / "log.csv").write_text("")
                raise stop
        assert os.listdir(tmp_path) == [".run.lock"]
    with pytest.raises(KeyboardInterrupt):
        with run_folder.open_run_folder(str(tmp_path), config):
            (tmp_path / "backup").mkdir()
            (tmp_path / "backup" / "training_metadata.json").write_text('{"epoch": 1}')
            raise KeyboardInterrupt
    with pytest.raises(ValueError, match="holds a different run"):
        with run_folder.open_run_folder(str(tmp_path), other):
            pass
    assert sorted(os.listdir(tmp_path)) == [".run.lock", "backup", "run.json"]


def test_a_second_process_on_the_same_folder_is_refused(folders, tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from keras_vit.training.run_folder import open_run_folder
            with open_run_folder({str(tmp_path)!r}, {{"model": "x"}}):
                print("locked", flush=True)
                time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=(
                rf"^Another keras-vit train process is writing to {tmp_path} \(pid "
                rf"{holder.pid}, started .*\); wait for it to finish, or pass --out NEW\.$")):
            _train(folders, "X", tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / "run.json").read_text())["config"] == {"model": "x"}


def test_the_cli_refuses_another_run_in_one_line(folders, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(
        {"status": "completed", "started": "2026-11-23 10:00:00 UTC",
         "config": {"model": "ViTTi16", "data": "folder:/elsewhere",
                    "class_names": [str(i) for i in range(10)]}}))
    code, _, stderr = run_cli("train", "--model", folders / "tiny.keras", "--data",
                              f"folder:{folders / 'X'}", "--recipe", "scratch", "--epochs", "1",
                              "--out", out)
    assert code == 2
    lines = [line for line in stderr.strip().splitlines()
             if line.startswith("keras-vit: error:")]
    assert len(lines) == 1, stderr
    assert re.fullmatch(
        rf"keras-vit: error: {re.escape(str(out))} holds a different run \(model ViTTi16, "
        r"data folder:/elsewhere, 10 classes 0\.\.9; its model is 'ViTTi16', this run's is "
        rf"'{re.escape(str(folders / 'tiny.keras'))} \(SHA-256 [0-9a-f]{{12}}\.\.\.\)'\); "
        r"pass --out NEW or --overwrite \(train\(\.\.\., out=NEW\) or overwrite=True\)\.",
        lines[0]), lines[0]
    assert "Traceback" not in stderr


def test_weights_moved_sees_a_change_and_no_change():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    moved = trainer.WeightsMoved()
    moved.set_model(model)
    moved.on_train_begin()
    moved.on_train_end()
    assert moved.changed is False
    moved.on_train_begin()
    model.layers[0].bias.assign(np.ones(1, "float32") * 1e-30)
    moved.on_train_end()
    assert moved.changed is True
