"""The README's demo command stays true."""

import json
import os
import subprocess
import sys

from official_fixtures import FIXTURES, REPO_ROOT, require

SCRIPT = REPO_ROOT / "examples" / "classify_photos.py"


def run(env_extra):
    env = dict(os.environ, **env_extra)
    result = subprocess.run([sys.executable, str(SCRIPT), "--json"], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])["results"]


def test_demo_on_the_official_fixtures():
    require(FIXTURES / "official")
    rows = run({"KERAS_VIT_FIXTURES": str(FIXTURES)})
    assert {r["checkpoint"] for r in rows} == {
        "mixer_tiny", "r26_vit_tiny", "rstem_vit_tiny", "vit_tiny_gap", "vit_tiny_token"}
    for row in rows:
        assert row["within_tolerance"] and row["top1_agreement"] == 1.0
        assert len(row["predictions"]) == 4


def test_demo_without_fixtures_writes_its_own_checkpoint(tmp_path):
    rows = run({"KERAS_VIT_FIXTURES": str(tmp_path)})
    assert rows[0]["max_abs_diff_vs_original"] == 0.0
    assert rows[0]["within_tolerance"]


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
