"""keras_vit.training.trainer at its edges: degenerate runs say so. Its
numeric arguments are checked before any work, one optimizer update moves
the weights, a run that changes no weight fails in one sentence, a diverged
run exits 1 and keeps its best finite epoch, the schedule counts updates
under gradient accumulation, a fixed-size `.keras` model trains at its
size, and an absurd batch size is clipped to the data."""

import collections
import dataclasses
import json

import keras
import numpy as np
import pytest
from data_helpers import make_folder, write_digit_folder
from keras import ops

from conftest import run_cli, tiny_keras_file
from keras_vit.training import memory, preflight, recipes, trainer
from keras_vit.training.schedules import WarmupDecay

TF = keras.backend.backend() == "tensorflow"
tf_only = pytest.mark.skipif(not TF, reason="the TensorFlow backend's paths")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """18 real-photo crops in 3 classes (15 train, 3 held out) and a tiny
    fixed-size (32x32) `.keras` model."""
    root = tmp_path_factory.mktemp("edges")
    make_folder(str(root / "data"), per_class=6, size=32)
    tiny_keras_file(root / "tiny.keras", classifier="gap", classifier_activation=None)
    return root


def _train(folder, out, **kwargs):
    kwargs = dict(dict(recipe="scratch", epochs=1, verbose=0), **kwargs)
    return trainer.train(str(folder / "tiny.keras"), f"folder:{folder / 'data'}",
                         out=str(out), **kwargs)


def _weights(path):
    return [np.array(w) for w in keras.saving.load_model(path).trainable_weights]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"epochs": 0}, ValueError, "`epochs` must be a positive integer, got 0."),
    ({"steps": 0}, ValueError, "`steps` must be a positive integer, got 0."),
    ({"steps": 10, "batch_size": 0}, ValueError,
     "`batch_size` must be a positive integer, got 0."),
    ({"steps": 10, "gradient_accumulation_steps": 0}, ValueError,
     "`gradient_accumulation_steps` must be a positive integer, got 0."),
    ({"steps": 10, "learning_rate": float("nan")}, ValueError,
     "`learning_rate` must be a finite number > 0, got nan."),
    ({"steps": 10, "learning_rate": -0.1}, ValueError,
     "`learning_rate` must be a finite number > 0, got -0.1."),
    ({"steps": 2.5}, TypeError, "`steps` must be a positive integer, got 2.5."),
])
def test_train_checks_its_numbers_before_any_work(kwargs, error, message):
    from keras_vit.training import train

    with pytest.raises(error) as info:
        train("ViTTi16", "folder:/nonexistent", **kwargs)
    assert str(info.value) == message


def test_the_run_plan_is_frozen_and_its_numbers_are_checked():
    fields = {f.name: None for f in dataclasses.fields(trainer.TrainPlan)}
    good = {**fields, "model": "ViTTi16", "out": "runs/x", "image_size": 32, "batch_size": 8,
            "epochs": 2, "steps_per_epoch": 3, "updates": 6}
    plan = trainer.TrainPlan(**good)
    assert plan.named and not dataclasses.replace(plan, model="m.keras").named
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch_size = 4
    with pytest.raises(ValueError, match=r"^`updates` must be a positive integer, got 0\.$"):
        trainer.TrainPlan(**{**good, "updates": 0})


def test_a_new_option_of_the_plan_reaches_run_json_the_summary_and_the_results(monkeypatch):
    """A field made with `plan.option()` is recorded in run.json only when
    set (a folder of a run from before it resumes), and shown in the
    summary (a row of its own) and the results: no other edit."""
    from keras_vit.training import plan as plan_lib

    @dataclasses.dataclass(frozen=True)
    class Plan(plan_lib.TrainPlan):
        mixup: float | None = plan_lib.option()

    fields = {f.name: None for f in dataclasses.fields(Plan)}
    good = {**fields, "model": "ViTTi16", "class_names": ("a", "b"), "updates": 6,
            "recipe": recipes.get_recipe("scratch")}
    record = Plan(**good).record()
    assert "mixup" not in record and "ema" not in record
    assert list(record)[:5] == ["model", "weights", "data", "train_split", "validation_split"]
    assert record["class_names"] == ["a", "b"] and record["model"] == "ViTTi16"
    plan = Plan(**{**good, "mixup": 0.2})
    assert plan.record()["mixup"] == 0.2 and plan.options() == {"mixup": 0.2}
    monkeypatch.setattr(plan_lib, "_OPTIONS", ("mixup",))
    summary = {"model": "ViTTi16", "parameters": 10, "weights": "w", "image_size": 32,
               "classes": 2, "data": {k: {"images": 1, "classes": 2, "description": "d"}
                                      for k in ("train", "validation")},
               "preset": "small", "preset_reason": "given", "batch_size": 8, "epochs": 1,
               "steps_per_epoch": 1, "recipe": "scratch", "optimizer": "adamw",
               "learning_rate": 0.1, "warmup_steps": 0, "decay": "cosine",
               "precision": "float32", "strategy": {"name": "s", "replicas": 1,
                                                    "devices": ["cpu"]},
               "out": "o", "run": "r", **plan.options()}
    assert "\n  mixup       0.2\n" in plan_lib.format_summary(summary)


@pytest.mark.parametrize("recipe", ["finetune", "scratch"])
def test_warmup_never_swallows_the_run(recipe):
    recipe = recipes.get_recipe(recipe)
    assert recipe.warmup_for(1) == 0  # one update: no warmup (step 0 would be lr 0)
    assert recipe.warmup_for(2) == 1
    optimizer = recipes.make_optimizer(recipe, 1)
    assert float(optimizer.learning_rate) == pytest.approx(recipe.learning_rate)


def test_the_schedule_counts_updates_under_gradient_accumulation():
    """Keras calls the schedule with its batch counter; 10 updates of 4
    batches each see the schedule of 10 updates (they saw lr 0 from the
    third update on)."""
    optimizer = recipes.make_optimizer("scratch", 10, gradient_accumulation_steps=4)
    variable = keras.Variable(np.zeros(1, "float32"))
    seen = []
    for _ in range(40):
        optimizer.apply([keras.ops.ones(1)], [variable])
        seen.append(float(optimizer.learning_rate))
    schedule = WarmupDecay(2e-3, 10, warmup_steps=1)
    expected = [float(schedule(i)) for i in range(1, 11)]  # the lr after update i
    assert seen[3::4][:9] == pytest.approx(expected[:9], rel=1e-5)
    assert int(optimizer.iterations) == 10


def test_a_run_that_changes_no_weight_fails_and_says_why(folder, tmp_path):
    with pytest.raises(ValueError, match=r"^Training changed no weight: the learning rate "
                                         r"was 0 at every update \(3 updates\); "
                                         r"model\.keras was not written\."):
        _train(folder, tmp_path / "zero", batch_size=4, learning_rate=1e-50)  # 0 in float32
    assert not (tmp_path / "zero" / "model.keras").exists()
    frozen = keras.saving.load_model(folder / "tiny.keras")
    frozen.trainable = False
    with pytest.raises(ValueError, match=r"the model has no trainable weights"):
        trainer.train(frozen, f"folder:{folder / 'data'}", recipe="scratch", epochs=1,
                      batch_size=4, out=str(tmp_path / "frozen"), verbose=0)


def test_more_batches_per_update_than_the_run_has_is_refused_before_any_work(folder,
                                                                            tmp_path):
    with pytest.raises(ValueError, match=(
            r"^gradient_accumulation_steps=100 batches per update, but the whole run has 3 "
            r"batches: no optimizer update would happen; give at most 3")):
        _train(folder, tmp_path / "gas", batch_size=4, gradient_accumulation_steps=100)
    assert not (tmp_path / "gas").exists()


def test_a_fixed_size_model_trains_at_its_size(folder, tmp_path):
    with pytest.raises(ValueError, match=(
            r"'.*tiny\.keras' takes 32x32 images \(its input size is fixed\), but "
            r"image_size=384 \(--image-size\) was given; leave it out or give 32\.$")):
        _train(folder, tmp_path / "size", image_size=384)
    assert not (tmp_path / "size").exists()  # refused before any work


def test_an_absurd_batch_size_is_clipped_to_the_split_and_one_update_moves_the_weights(
        folder, tmp_path, caplog):
    """An absurd batch size is clipped to the 15 training images: one batch,
    one epoch, so one optimizer update, at the full learning rate (it used
    to be warmup's 0). (One run for both: a run of batch_size=15 is the
    same run.)"""
    results = _train(folder, tmp_path / "big", batch_size=10**12)
    assert results["summary"]["batch_size"] == 15
    assert results["summary"]["steps_per_epoch"] == 1
    assert "batch_size=1000000000000 is larger than the 15 images of the training split " \
           "'train'; using batches of 15" in caplog.text
    assert results["summary"]["warmup_steps"] == 0
    start, end = _weights(folder / "tiny.keras"), _weights(results["model"])
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(start, end, strict=True)) > 1e-4


def test_a_folder_without_room_for_the_run_is_refused_before_the_first_step(
        folder, tmp_path, monkeypatch):
    """A full disk mid-run ended in an h5py error and a segmentation fault
    (found with `--out` on a 3 MB tmpfs)."""
    free = collections.namedtuple("usage", "total used free")(10**9, 10**9 - 10**5, 10**5)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: free)
    out = tmp_path / "full"
    with pytest.raises(ValueError, match=(
            rf"^{out} has 0\.1 MB free, but this run writes about [0-9.]+ MB there \(the "
            r"backup with the optimizer's state, best\.keras and model\.keras of 5,651 "
            r"parameters\); free some space or pass --out on another disk\.$")):
        _train(folder, out, batch_size=4)
    assert not (out / "model.keras").exists() and not (out / "backup").exists()


def test_a_resumed_run_counts_the_files_it_writes_again_as_room(tmp_path, monkeypatch):
    """A resume rewrites backup/latest.weights.h5 and best.keras in their
    own space: a disk with room for the rest is not refused. Only those
    two files count (regular, one link), and never more than the run
    writes."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])  # 8 float32
    recipe = recipes.get_recipe("scratch")  # AdamW: 2 slots
    needed = 8 * 4 * (3 + 2) + (1 << 20)
    usage = collections.namedtuple("usage", "total used free")
    free = [0]
    monkeypatch.setattr(preflight.shutil, "disk_usage",
                        lambda path: usage(10**9, 10**9 - free[0], free[0]))
    out = tmp_path / "run"
    (out / "backup").mkdir(parents=True)
    free[0] = needed - 500_000
    with pytest.raises(ValueError, match=(
            rf"^{out} has 0\.5 MB free, but this run writes about 1\.0 MB there \(the backup "
            r"with the optimizer's state, best\.keras and model\.keras of 8 parameters\); "
            r"free some space or pass --out on another disk\.$")):
        preflight.check_free_space(str(out), model, recipe)  # a new run
    (out / "backup" / "latest.weights.h5").write_bytes(b"w" * 300_000)
    (out / "best.keras").write_bytes(b"b" * 200_000)
    preflight.check_free_space(str(out), model, recipe)  # the resume fits
    # Not room: model.keras (its replacement is written beside it), another
    # file in backup/, a best.keras with a second link.
    (out / "model.keras").write_bytes(b"m" * 400_000)
    (out / "backup" / "other.h5").write_bytes(b"o" * 400_000)
    free[0] = needed - 500_001
    with pytest.raises(ValueError, match=(
            r"of 8 parameters, 0\.5 MB of it over the files of the run it resumes\); free "
            r"some space or pass --out on another disk\.$")):
        preflight.check_free_space(str(out), model, recipe)
    (tmp_path / "link.keras").hardlink_to(out / "best.keras")
    free[0] = needed - 300_001
    with pytest.raises(ValueError, match=r"0\.3 MB of it over the files"):
        preflight.check_free_space(str(out), model, recipe)
    (out / "backup" / "latest.weights.h5").write_bytes(b"w" * 2 * needed)
    free[0] = 0
    preflight.check_free_space(str(out), model, recipe)  # at most what the run writes
    # The name is Keras' own: its backup of an epoch is that file.
    model.compile(optimizer="adamw", loss="mse")
    model.fit(np.zeros((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(str(tmp_path / "keras"), delete_checkpoint=False)])
    assert (tmp_path / "keras" / preflight._REWRITTEN[0][1]).is_file()


def test_itemsize_of_variable_dtypes():
    assert [memory.itemsize(d) for d in ("float32", "bfloat16", "float16", "int64",
                                            "bool")] == [4, 2, 2, 8, 1]


def test_finetune_recipe_without_weights_warns(tmp_path, caplog, monkeypatch):
    """ViTTi16 + finetune + no weights does not train random weights
    silently: the warning comes once the run is planned, before the model
    is built (the training itself is left out: ViT-Ti/16's saves alone took
    25 s)."""
    from keras_vit.training import train

    monkeypatch.setattr(trainer, "_train_in_scope", lambda plan, datasets: {})
    data = tmp_path / "digits"
    write_digit_folder(str(data), per_class=4, size=16)
    with caplog.at_level("WARNING", logger="keras_vit"):
        train("ViTTi16", f"folder:{data}", recipe="finetune", image_size=32,
              batch_size=4, steps=1, strategy="default", out=str(tmp_path / "run"),
              verbose=0)
    assert any("without pretrained weights" in r.getMessage() for r in caplog.records)


# --- a run that diverges ---------------------------------------------------------

@keras.saving.register_keras_serializable(package="keras_vit_tests")
class NaNAfter(keras.layers.Layer):
    """Identity for the first `after` training steps, NaN from then on: a
    run that diverges at a known step."""

    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after

    def build(self, input_shape):
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls")

    def call(self, x, training=False):
        if training:
            self.calls.assign(self.calls + 1.0)
        return x * ops.where(self.calls > self.after, float("nan"), 1.0)

    def get_config(self):
        return {**super().get_config(), "after": self.after}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    make_folder(str(root), per_class=8, size=32)
    return str(root)


@tf_only
def test_a_diverged_run_exits_1_with_strict_json_and_keeps_the_best_finite_epoch(
        photos, tmp_path):
    inputs = keras.Input((32, 32, 3))
    x = keras.layers.Rescaling(1 / 255)(inputs)
    x = keras.layers.Flatten()(x)
    x = NaNAfter(6)(x)  # steps 1-6 finite (epoch 1: 4 steps), NaN from step 7
    outputs = keras.layers.Dense(3)(x)
    path = tmp_path / "start.keras"
    keras.Model(inputs, outputs).save(path)
    out = tmp_path / "run"
    result = run_cli(
        "train", "--model", str(path), "--data", f"folder:{photos}", "--recipe", "scratch",
        "--image-size", "32", "--batch-size", "4", "--epochs", "3", "--steps-per-epoch", "4",
        "--out", str(out), "--quiet", "--json")
    status, stdout, err = result.code, result.out, result.err_lines
    assert status == 1
    results = json.loads(stdout.strip().splitlines()[-1],
                         parse_constant=lambda c: pytest.fail(f"{c} in the JSON line"))
    assert results["status"] == "diverged"
    assert results["diverged_at"] == {"epoch": 2, "batch": 3, "loss": None}
    assert results["val_accuracy"] is None and results["model"] is None
    assert results["best"]["epoch"] == 1 and results["best_model"] == str(out / "best.keras")
    assert not (out / "model.keras").exists()
    assert err[-1] == (
        "keras-vit: error: Training diverged: the loss became nan at epoch 2, batch 3; "
        "model.keras was not written (its weights are not finite). "
        f"{out / 'best.keras'} holds epoch 1 (val_accuracy "
        f"{results['best']['value']:.4f}), the best before it. Try a lower "
        "--learning-rate or a longer warmup.")
    best = keras.saving.load_model(out / "best.keras")
    assert all(np.isfinite(w).all() for w in best.get_weights())
    assert not (out / "backup").exists()  # a rerun starts afresh, not from NaN weights


# --- a reduced precision the CPU emulates (issue 29) ---------------------------

AVX512 = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl"})
BF16_EMULATED = ("mixed_bfloat16 is emulated on this CPU (its flags in /proc/cpuinfo have "
                 "none of avx512_bf16, amx_bf16, bf16): bfloat16 math runs in software, "
                 "several times slower than float32")
FP16_EMULATED = ("mixed_float16 is emulated on this CPU (its flags in /proc/cpuinfo have "
                 "none of avx512_fp16, amx_fp16, asimdhp): float16 math runs in software, "
                 "several times slower than float32")


@pytest.mark.parametrize("policy, flags, expected", [
    ("mixed_bfloat16", AVX512, BF16_EMULATED + "."),
    ("mixed_bfloat16", AVX512 | {"avx512_bf16"}, None),
    ("bfloat16", AVX512 | {"amx_bf16", "amx_tile"}, None),
    ("mixed_bfloat16", frozenset({"fp", "asimd", "bf16"}), None),  # ARM with BF16
    ("mixed_float16", AVX512 | {"avx512_bf16"}, FP16_EMULATED + "."),
    ("mixed_float16", AVX512 | {"avx512_fp16"}, None),
    ("float32", AVX512, None),
    ("mixed_bfloat16", None, None),  # flags unknown (no /proc/cpuinfo): no claim
])
def test_a_reduced_precision_is_called_emulated_only_without_its_cpu_flags(
        policy, flags, expected):
    from keras_vit.training.precision import emulated_message

    assert emulated_message(policy, flags) == expected


def test_the_emulation_warning_is_logged_once_per_process_and_only_on_the_cpu(
        monkeypatch, caplog, tmp_path):
    from keras_vit.training import precision

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\n"
                       "flags\t\t: fpu avx2 avx512f\n")
    assert precision.cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "avx512f"})
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")  # ARM
    assert precision.cpu_flags(cpuinfo) == frozenset({"fp", "asimd", "bf16"})
    assert precision.cpu_flags(tmp_path / "none") is None
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setattr(precision, "backend_runs_on_cpu", lambda: False)  # a GPU
    assert precision.warn_if_emulated("mixed_bfloat16", flags=AVX512) is None
    monkeypatch.setattr(precision, "backend_runs_on_cpu", lambda: True)
    advice = "; --precision float32 trains faster here"
    with caplog.at_level("WARNING", logger="keras_vit"):
        for _ in range(2):
            assert precision.warn_if_emulated(keras.mixed_precision.DTypePolicy(
                "mixed_bfloat16"), advice, flags=AVX512) == f"{BF16_EMULATED}{advice}."
        assert precision.warn_if_emulated("float32", advice, flags=AVX512) is None
    assert [r.getMessage() for r in caplog.records] == [f"{BF16_EMULATED}{advice}."]
