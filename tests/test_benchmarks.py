"""`benchmarks/accelerator.py` runs end to end on tiny shapes on the CPU,
so that the script a GPU session runs cannot rot (its numbers are measured
on a device, never asserted here)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import accelerator  # noqa: E402


def test_accelerator_benchmark_runs_on_tiny_shapes(tmp_path, capsys):
    report = accelerator.main([
        "--models", "tiny", "--frameworks", "keras_vit-tf,timm-eager",
        "--image-size", "32", "--batch", "2",
        "--steps", "1", "--rounds", "1", "--warmup", "1", "--timeout", "240",
        "--json", str(tmp_path / "report.json")])
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert report["peak"]["peak_tflops"] > 0
    rows = report["results"]["tiny"]
    assert list(rows) == ["keras_vit-tf", "timm-eager"]
    for name, row in rows.items():
        assert "error" not in row, (name, row)
        for mode in ("train", "infer"):
            assert row[mode]["images_per_s"] > 0 and 0 < row[mode]["mfu"] < 1, (name, row)
        assert row["platform"] == "cpu" and row.get("peak_rss_gb", 0) > 0
    assert rows["keras_vit-tf"]["attention_ran"] == "fused"  # auto, on the CPU
    table = capsys.readouterr().out
    assert "| tiny | timm-eager |  |" in table and "| tiny | keras_vit-tf | fused |" in table


def test_accelerator_benchmark_names_an_unknown_framework():
    with pytest.raises(SystemExit, match=r"--frameworks: unknown \['keras_vit-mlx'\]; allowed: "
                                         r"keras_vit-jax, keras_vit-tf, keras_vit-torch"):
        accelerator.main(["--frameworks", "keras_vit-mlx"])
