"""The README's demo command stays true."""

import json
import os
import subprocess
import sys

from official_fixtures import FIXTURES, REPO_ROOT, require

SCRIPT = REPO_ROOT / "examples" / "classify_photos.py"


def run(env_extra, whole=False):
    env = dict(os.environ, **env_extra)
    result = subprocess.run([sys.executable, str(SCRIPT), "--json"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    document = json.loads(result.stdout.strip().splitlines()[-1])
    return document if whole else document["results"]


def test_demo_on_the_official_fixtures():
    require(FIXTURES / "official")
    document = run({"KERAS_VIT_FIXTURES": str(FIXTURES)}, whole=True)
    assert document["parity_with_official"] and document["passed"]
    assert document["outcome"] == ("All logits within rtol=1e-5, atol=2e-5 of the official "
                                   "implementation's (5 checkpoints).")
    rows = document["results"]
    assert {r["checkpoint"] for r in rows} == {
        "mixer_tiny", "r26_vit_tiny", "rstem_vit_tiny", "vit_tiny_gap", "vit_tiny_token"}
    for row in rows:
        assert row["within_tolerance"] and row["top1_agreement"] == 1.0
        assert len(row["predictions"]) == 4


def test_demo_without_fixtures_writes_its_own_checkpoint(tmp_path):
    document = run({"KERAS_VIT_FIXTURES": str(tmp_path)}, whole=True)
    rows = document["results"]
    assert rows[0]["max_abs_diff_vs_original"] == 0.0
    assert rows[0]["within_tolerance"]
    # a round trip is no parity check, and says so (it said "All logits within
    # rtol=1e-5, atol=2e-5 of the reference.")
    assert not document["parity_with_official"]
    assert document["outcome"] == (
        f"No parity check with the official implementation was made (no fixtures in "
        f"{tmp_path / 'official'}); the self-written checkpoint reads back bit for bit.")


def test_training_examples_parse_their_arguments():
    for name in ("finetune_cifar10.py", "train_from_scratch.py", "sam_finetune.py",
                 "tpu_finetune.py"):
        result = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / name), "--help"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "usage:" in result.stdout


def test_train_from_scratch_example_runs(tmp_path):
    from keras_vit.training.quickstart import write_digits

    write_digits(str(tmp_path / "digits"))
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "train_from_scratch.py"),
         "--data", f"folder:{tmp_path / 'digits'}", "--classes", "10", "--epochs", "1",
         "--num-layers", "1", "--preset", "digits", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    assert results["epochs"] == 1 and results["classes"] == 10


def test_explain_digits_example_writes_the_pictures(tmp_path):
    import keras_vit
    from keras_vit.training.quickstart import QUICKSTART_MODEL, write_digits

    write_digits(str(tmp_path / "digits"))
    model = keras_vit.VisionTransformer(**QUICKSTART_MODEL, input_shape=(32, 32, 3),
                                        classes=10, classifier_activation=None)
    model.save(tmp_path / "model.keras")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "examples" / "explain_digits.py"),
                             "--model", str(tmp_path / "model.keras"), "--out",
                             str(tmp_path / "pictures"), "--images", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    written = sorted(p.name for p in (tmp_path / "pictures").iterdir())
    assert written == ["attention_distance.png", "embedding_filters.png",
                       "position_embedding_similarity.png", "rollout_digit0.png",
                       "rollout_digit2.png"]  # every 90th test digit
    assert "mean attention distance (pixels)" in result.stdout
