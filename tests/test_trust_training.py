"""Issue #46, training options and traps: `train()`'s arguments are checked
before any work (item 9), builder options on a model not built here are
refused (9), planted links in `--out` are refused, never written through
(16), the recipe's batch is picked from the data (22), quickstart asks
before it deletes a finished run (23), model.keras says what it outputs
(26), and `--seed` / a full disk are named (21)."""

import errno
import os
import pathlib
import re

import pytest
from data_helpers import make_folder

from conftest import run_cli, tiny_keras_file
from keras_vit import _atomic
from keras_vit.training import recipes, trainer

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """18 real-photo crops in 3 classes (15 train, 3 held out) and a tiny
    fixed-size (32x32) logits `.keras` model."""
    root = tmp_path_factory.mktemp("trust_training")
    make_folder(str(root / "data"), per_class=6, size=32)
    tiny_keras_file(root / "tiny.keras", classifier="gap", classifier_activation=None)
    return root


def _train(folder, out, **kwargs):
    kwargs = dict(dict(recipe="scratch", epochs=1, batch_size=8, verbose=0), **kwargs)
    return trainer.train(str(folder / "tiny.keras"), f"folder:{folder / 'data'}",
                         out=str(out), **kwargs)


# --- item 9 (and the seed of item 21): every argument checked before any work ---------

@pytest.mark.parametrize("kwargs, error, message", [
    ({"label_smoothing": 5.0}, ValueError, "`label_smoothing` must be a number in [0, 1), "
                                           "got 5.0."),
    ({"label_smoothing": -1.0}, ValueError, "`label_smoothing` must be a number in [0, 1), "
                                            "got -1.0."),
    ({"dropout_rate": 1.5}, ValueError, "`dropout_rate` must be a number in [0, 1), got 1.5."),
    ({"drop_path_rate": "0.1"}, TypeError, "`drop_path_rate` must be a number in [0, 1), "
                                           "got '0.1'."),
    ({"skip_corrupt": "yes"}, TypeError, "`skip_corrupt` must be True or False "
                                         "(--skip-corrupt), got 'yes'."),
    ({"overwrite": 1}, TypeError, "`overwrite` must be True or False (--overwrite), got 1."),
    ({"seed": 10**23}, ValueError, "`seed` must be an integer from 0 to 4294967295 "
                                   "(2**32 - 1), got 100000000000000000000000."),
    ({"seed": -1}, ValueError, "`seed` must be an integer from 0 to 4294967295 (2**32 - 1), "
                               "got -1."),
    ({"out": None}, TypeError, "`out` (--out) must be a folder path, got None."),
    ({"cache": 1}, TypeError, "`cache` must be True, False or a file path, got 1."),
    ({"verbose": 3}, ValueError, "`verbose` must be 0, 1 or 2 (Keras' fit), got 3."),
    ({"train_split": None}, TypeError, "`train_split` must be a split name (a non-empty "
                                       "string), got None."),
    ({"lora_rank": 4, "lora_targets": 5}, TypeError, "`lora_targets` (--lora-targets) must "
     "be a layer name or a sequence of them (e.g. ('qkv', 'mlp')), got 5."),
    ({"model_kwargs": "remat"}, TypeError, "`model_kwargs` must be a dict of the builder's "
     "arguments (e.g. {'remat': True}) or None, got 'remat'."),
])
def test_train_checks_every_argument_before_any_work(kwargs, error, message, tmp_path):
    kwargs = {"out": str(tmp_path / "run"), **kwargs}
    with pytest.raises(error) as info:
        trainer.train("ViTTi16", "folder:/nonexistent", epochs=1, **kwargs)
    assert str(info.value) == message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("kwargs, named", [
    ({"dropout_rate": 0.3}, "dropout_rate=0.3 is an option"),
    ({"weights": "imagenet21k", "drop_path_rate": 0.1},
     "weights='imagenet21k' (--weights), drop_path_rate=0.1 are options"),
])
def test_builder_options_on_a_model_file_are_refused_not_recorded(folder, tmp_path, kwargs,
                                                                  named):
    """A dropout_rate (or weights) for a .keras model was ignored, but
    recorded in run.json as if used."""
    model = str(folder / "tiny.keras")
    with pytest.raises(ValueError, match=re.escape(
            f"{named} of a named model's builder, but the model is {model!r}, which is not "
            "built here and keeps its own weights, dropout and drop path; leave")):
        _train(folder, tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()


def test_cli_weights_with_a_model_file_is_refused(folder, tmp_path):
    code, _, err = run_cli("train", "--model", folder / "tiny.keras", "--weights",
                           "imagenet21k", "--data", f"folder:{folder / 'data'}", "--epochs",
                           "1", "--out", tmp_path / "run")
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(
        "keras-vit: error: weights='imagenet21k' (--weights) is an option of a named model's "
        "builder")


def test_cli_seed_out_of_range_is_refused_when_parsed():
    """`--seed 10**23` said NumPy's "Seed must be between..." after 9 s,
    without the flag."""
    code, _, err = run_cli("train", "--data", "folder:x", "--epochs", "1",
                           "--seed", str(10**23))
    assert code == 2
    assert err.strip().endswith(
        "argument --seed: must be an integer from 0 to 4294967295 (2**32 - 1), got "
        "100000000000000000000000 (see keras-vit train --help)")


# --- item 16: planted links in --out ---------------------------------------------------

@pytest.mark.parametrize("name", ["labels.txt", "log.csv", "run.json", "best.keras.json",
                                  "model.keras", ".run.json.tmp-1", "best.keras.json.tmp"])
def test_a_link_planted_in_the_run_folder_is_refused_and_its_target_kept(folder, tmp_path,
                                                                         name):
    """train wrote labels.txt and appended log.csv through links planted in
    --out; their targets were overwritten or appended to."""
    target = tmp_path / "mine.txt"
    target.write_text("the user's file\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / name).symlink_to(target)
    with pytest.raises(ValueError, match=(
            rf"^{re.escape(str(out / name))} is a symbolic link \(to '.*mine\.txt'\), and "
            r"train writes its run files in --out only as regular files and folders of its "
            r"own \(it would write through it\); remove it, or pass --out NEW")):
        _train(folder, out)
    assert target.read_text() == "the user's file\n"


def test_links_and_fifos_inside_backup_and_tensorboard_are_refused(folder, tmp_path):
    target = tmp_path / "mine.h5"
    target.write_bytes(b"user")
    out = tmp_path / "run"
    (out / "backup").mkdir(parents=True)
    (out / "backup" / "latest.weights.h5").symlink_to(target)
    with pytest.raises(ValueError, match=r"backup/latest\.weights\.h5 is a symbolic link"):
        _train(folder, out)
    os.remove(out / "backup" / "latest.weights.h5")
    os.rmdir(out / "backup")
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "train").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(ValueError, match=r"tensorboard/train is a symbolic link"):
        _train(folder, out)
    os.remove(out / "tensorboard" / "train")
    os.mkfifo(out / "log.csv")
    with pytest.raises(ValueError, match=r"log\.csv is not a regular file, .* or --overwrite "
                                         r"\(which removes the entry, not what it points to\)"):
        _train(folder, out)
    assert target.read_bytes() == b"user"


def test_overwrite_removes_planted_links_and_writes_real_files(folder, tmp_path, monkeypatch):
    """And labels.txt goes through keras_vit._atomic (a link planted after
    the check is replaced, never followed). (One run for both.)"""
    target = tmp_path / "mine.txt"
    target.write_text("the user's file\n")
    out = tmp_path / "run"
    out.mkdir()
    for name in ("labels.txt", "log.csv"):
        (out / name).symlink_to(target)
    written, write_text = [], _atomic.write_text
    monkeypatch.setattr(_atomic, "write_text",
                        lambda path, text: (written.append(path), write_text(path, text))[1])
    results = _train(folder, out, overwrite=True)
    assert "labels.txt" in [os.path.basename(p) for p in written]
    assert target.read_text() == "the user's file\n"
    for name in ("labels.txt", "log.csv"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert results["outputs"] == "logits"  # item 26: the run says what model.keras outputs


# --- item 21: a disk that fills during training ---------------------------------------

def test_a_disk_that_fills_during_training_is_named(folder, tmp_path, monkeypatch):
    """A full disk said `[Errno 28] No space left on device` without the path."""
    def full(model, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer, "save_atomically", full)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=(
            rf"^The disk of {re.escape(str(out))} filled up while the run wrote its files "
            r"there \(\[Errno 28\] No space left on device\); free some space there and "
            r"run the same command again \(it resumes from the last finished epoch\), or "
            r"pass --out on another disk to start afresh\.$")):
        _train(folder, out)

# --- item 22: the recipe's batch is picked from the data ------------------------------

def test_the_recipe_batch_gives_an_epoch_enough_steps():
    finetune = recipes.get_recipe("finetune")
    assert finetune.batch_for(796) == (
        64, "the finetune recipe's 512 halved to 64 so that an epoch of the 796 training "
            "images has at least 10 steps (--batch-size sets it)")
    assert finetune.batch_for(50_000) == (512, "the finetune recipe's")
    assert finetune.batch_for(None) == (512, "the finetune recipe's")
    assert finetune.batch_for(3_000, replicas=3)[0] == 255  # a multiple of the replicas
    assert recipes.get_recipe("scratch").batch_for(60) == (64, "the scratch recipe's")
    # halving stops at 64: the reason says how many steps an epoch has then,
    # not "at least 10" (198 images: 3 steps)
    assert finetune.batch_for(198) == (
        64, "the finetune recipe's 512 halved to 64, the smallest it is halved to: an epoch "
            "of the 198 training images has 3 steps, fewer than 10 (--batch-size sets a "
            "smaller batch)")
    # 64 updates: a warmup of 6 (finetune's 500 would be the whole run)
    assert finetune.warmup_for(60) == 6 and finetune.warmup_for(10_000) == 500


def test_train_without_a_batch_size_says_why_the_batch(tmp_path, monkeypatch):
    """796 images, the default finetune recipe: "batch 512 (global)" and
    "5 epochs x 1 step = 5 batches" without a word why."""
    monkeypatch.setattr(trainer, "_train_in_scope", lambda plan, datasets: plan)
    data = tmp_path / "data"
    make_folder(str(data / "train"), per_class=266, size=8)  # 3 classes: 798 images
    make_folder(str(data / "validation"), per_class=1, size=8)
    plan = trainer.train("ViTTi16", f"folder:{data}", image_size=32, epochs=5,
                         out=str(tmp_path / "run"), verbose=0)
    assert (plan.batch_size, plan.steps_per_epoch, plan.updates) == (64, 12, 60)
    assert "halved to 64 so that an epoch of the 798 training images" in plan.batch_reason
    given = trainer.train("ViTTi16", f"folder:{data}", image_size=32, epochs=5,
                          batch_size=512, out=str(tmp_path / "run"), verbose=0)
    assert (given.batch_size, given.steps_per_epoch, given.batch_reason) == (512, 1, "given")


# --- item 23: quickstart asks before it deletes a finished run ------------------------

def test_quickstart_refuses_a_finished_run_without_overwrite(tmp_path, digits_folder):
    out = tmp_path / "qs"
    out.mkdir()
    (out / "digits").symlink_to(digits_folder)
    (out / "model.keras").write_bytes(b"the last run's model")
    code, _, err = run_cli("quickstart", "--out", out, "--epochs", "1", "--no-export")
    assert code == 2
    assert re.search(r"holds the files of a run without a run record .*; pass --out NEW or "
                     r"--overwrite", err.strip().splitlines()[-1])
    assert (out / "model.keras").read_bytes() == b"the last run's model"


def test_quickstart_help_names_overwrite():
    code, _, _ = run_cli("quickstart", "--help")
    from keras_vit import cli

    text = cli.build_parser()._subparsers._group_actions[0].choices["quickstart"].format_help()
    assert code == 0 and "--overwrite" in text and "finished quickstart" in text


# --- item 26: what model.keras outputs is documented ----------------------------------

def test_the_docs_say_what_model_keras_outputs():
    for page in (ROOT / "README.md", ROOT / "docs" / "training.md"):
        text = " ".join(page.read_text().split())
        assert "model.keras` outputs logits" in text, page
        assert "keras.ops.softmax" in text, page
