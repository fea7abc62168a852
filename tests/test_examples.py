"""The scripts in examples/ stay true: the README's demo command, the
training examples' arguments and runs. Each runs in this process (its
`main()` with `sys.argv` set), as `python examples/NAME ARGS` would."""

import json
import os
import runpy
import sys

import pytest

import keras_vit
from keras_vit.training.quickstart import QUICKSTART_MODEL
from official_fixtures import FIXTURES, REPO_ROOT, require


def run_example(name, *argv, env=None):
    """`python examples/NAME ARGV` in this process: the script loaded afresh
    (its module-level settings read `env`), `main()` called with `sys.argv`
    set; its exit status."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        patch.setattr(sys, "argv", [name, *map(str, argv)])
        main = runpy.run_path(str(REPO_ROOT / "examples" / name), run_name="example")["main"]
        try:
            return main() or 0
        except SystemExit as exit_:
            return exit_.code


def run(env_extra, capsys, whole=False):
    code = run_example("classify_photos.py", "--json", env=env_extra)
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    document = json.loads(out.strip().splitlines()[-1])
    return document if whole else document["results"]


def test_demo_on_the_official_fixtures(capsys):
    require(FIXTURES / "official")
    document = run({"KERAS_VIT_FIXTURES": str(FIXTURES)}, capsys, whole=True)
    assert document["parity_with_official"] and document["passed"]
    assert document["outcome"] == ("All logits within rtol=1e-5, atol=2e-5 of the official "
                                   "implementation's (5 checkpoints).")
    rows = document["results"]
    assert {r["checkpoint"] for r in rows} == {
        "mixer_tiny", "r26_vit_tiny", "rstem_vit_tiny", "vit_tiny_gap", "vit_tiny_token"}
    for row in rows:
        assert row["within_tolerance"] and row["top1_agreement"] == 1.0
        assert len(row["predictions"]) == 4


def test_demo_without_fixtures_writes_its_own_checkpoint(tmp_path, capsys):
    document = run({"KERAS_VIT_FIXTURES": str(tmp_path)}, capsys, whole=True)
    rows = document["results"]
    assert rows[0]["max_abs_diff_vs_original"] == 0.0
    assert rows[0]["within_tolerance"]
    # a round trip is no parity check, and says so (it said "All logits within
    # rtol=1e-5, atol=2e-5 of the reference.")
    assert not document["parity_with_official"]
    assert document["outcome"] == (
        f"No parity check with the official implementation was made (no fixtures in "
        f"{tmp_path / 'official'}); the self-written checkpoint reads back bit for bit.")


@pytest.mark.parametrize("name", ["finetune_cifar10.py", "train_from_scratch.py",
                                  "sam_finetune.py", "tpu_finetune.py"])
def test_training_examples_parse_their_arguments(name, capsys):
    code = run_example(name, "--help")
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "usage:" in out


def test_train_from_scratch_example_runs(digits_folder, tmp_path, capsys):
    code = run_example("train_from_scratch.py", "--data", f"folder:{digits_folder}",
                       "--classes", "10", "--epochs", "1", "--num-layers", "1",
                       "--preset", "digits", "--out", tmp_path / "run")
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    results = json.loads(out.strip().splitlines()[-1])
    assert results["epochs"] == 1 and results["classes"] == 10


def test_explain_digits_example_writes_the_pictures(digits_folder, tmp_path, capsys):
    os.symlink(digits_folder, tmp_path / "digits")  # the script reads MODEL's digits/test
    model = keras_vit.VisionTransformer(**QUICKSTART_MODEL, input_shape=(32, 32, 3),
                                        classes=10, classifier_activation=None)
    model.save(tmp_path / "model.keras")
    code = run_example("explain_digits.py", "--model", tmp_path / "model.keras", "--out",
                       tmp_path / "pictures", "--images", "2")
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    written = sorted(p.name for p in (tmp_path / "pictures").iterdir())
    assert written == ["attention_distance.png", "embedding_filters.png",
                       "position_embedding_similarity.png", "rollout_digit0.png",
                       "rollout_digit2.png"]  # every 90th test digit
    assert "mean attention distance (pixels)" in out
