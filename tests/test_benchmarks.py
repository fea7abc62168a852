"""`benchmarks/accelerator.py` runs end to end on tiny shapes on the CPU,
so that the script a GPU session runs cannot rot (its numbers are measured
on a device, never asserted here); so do the CPU benchmarks whose reports
docs/performance/ quotes (`first_step.py`, `gelu_train.py`,
`pipeline_start.py`, `bounds.py`), with what each report must say that is
not a time; `quantize_export.py`'s table (its conversions take minutes: the
rows from given cells)."""

import argparse
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import accelerator  # noqa: E402
import bounds  # noqa: E402
import first_step  # noqa: E402
import gelu_train  # noqa: E402
import jax_profile  # noqa: E402
import machine  # noqa: E402
import pipeline_start  # noqa: E402
import quantize_export  # noqa: E402


def test_accelerator_benchmark_runs_on_tiny_shapes(tmp_path, capsys):
    report = accelerator.main([
        "--models", "tiny", "--frameworks", "keras_vit-tf,timm-eager",
        "--image-size", "32", "--batch", "2",
        "--steps", "1", "--rounds", "1", "--warmup", "1", "--timeout", "240",
        "--peak-size", "256", "--json", str(tmp_path / "report.json")])
    assert json.loads((tmp_path / "report.json").read_text()) == report
    assert report["peak"]["peak_tflops"] > 0
    # on a CPU, the fastest framework's float32 matmul (`_cpu_peak`), at the
    # size asked (2048^3 by default: 20 s of the test on one thread)
    assert report["peak"]["peak_shape"] == "256^3 float32"
    assert "(cpu), the best of torch" in report["peak"]["peak_source"]
    assert "tensorflow" in report["peak"]["peak_source"]
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
    assert report["environment"]["cpu"] == machine.describe()


def test_first_step_benchmark_counts_the_traces_it_compares(tmp_path):
    """Fresh processes, one per variant: Keras' deferred build traces the
    step twice, `_compat.build_before_fit` once (what `train` relies on)."""
    report = first_step.main(["--model", "tiny", "--image-size", "32", "--batch", "2",
                              "--rounds", "1", "--json", str(tmp_path / "first.json")])
    assert json.loads((tmp_path / "first.json").read_text()) == report
    assert report["traces"] == {first_step.VARIANTS[0]: [2], first_step.VARIANTS[1]: [1]}
    assert set(report["first_fit_s"]) == set(first_step.VARIANTS)
    assert report["cpu"] == machine.describe()


def test_gelu_benchmark_times_both_gradients_and_restores_the_library():
    from keras_vit.layers import fused as _fused

    library_gelu = _fused._gelu_with_gradient
    report = gelu_train.main(["--model", "tiny", "--image-size", "32", "--batch", "2",
                              "--rounds", "2"])
    assert _fused._gelu_with_gradient is library_gelu
    assert set(report["seconds_per_step"]) == {"written-out gradient", "tf.nn.gelu"}
    assert all(len(times) == 2 for times in report["rounds_s"].values())
    assert report["speedup"] > 0


def test_pipeline_start_benchmark_opens_both_variants_on_the_digits(digits_folder):
    report = pipeline_start.main(["--preset", "digits", "--rounds", "1",
                                  "--data", str(digits_folder)])
    assert set(report["first_batch_s"]) == set(pipeline_start.VARIANTS)
    for variant in pipeline_start.VARIANTS:
        (run,) = report["rounds"][variant]
        assert 0 < run["open_s"] <= run["first_batch_s"], (variant, run)
    assert report["cpu"] == machine.cpu()["model"] and report["flags"] == machine.cpu()["flags"]


def test_bounds_benchmark_refuses_the_hostile_files_and_reads_the_long_keys(tmp_path,
                                                                           monkeypatch):
    """The issue-46 cases at a tiny size, in this process: the stride-0
    view and both .keras bombs are refused, their peers load, and every
    long-key file reads as the one key "w"."""
    monkeypatch.setattr(bounds, "FRESH", True)  # main sets it from --in-process
    report = bounds.main(["--cases", "pytorch,keras", "--pickle-kib", "32", "--rounds", "1",
                          "--bomb-mib", "80", "--in-process",
                          "--json", str(tmp_path / "bounds.json")])
    assert json.loads((tmp_path / "bounds.json").read_text()) == report
    rows = report["rows"]
    assert [row["case"] for row in rows] == ["pytorch stride 0"] * 2 + [".keras bomb"] * 3
    stride0, imported, weights, config, genuine = (row["outcome"] for row in rows)
    assert stride0.startswith("CorruptCheckpointError: ") and "(16384, 16384)" in stride0
    assert imported == genuine == "ok"
    assert "its member 'model.weights.h5' declares" in weights and "bomb" in weights
    assert "its config.json declares" in config
    timed = report["timings"]
    sizes = [row["data_pkl_bytes"] for row in timed]  # within a prefix of the size asked
    assert all(0 <= bound - size < 7 for size, bound in zip(sizes[:4], [32768, 16384] * 2,
                                                             strict=True))
    assert sizes[-1] == sizes[0]  # the peer: the first key's data.pkl size
    assert all(row["seconds"] > 0 and len(row["rounds_s"]) == 1 for row in timed)
    assert ["ratio_to_half_size" in row for row in timed] == [True, False, True, False, False]
    assert "1.60 s" in report["before_the_fix"] and report["cpu"] == machine.cpu()


def test_the_cpu_record_names_the_cpu_its_numbers_and_the_flags_that_pick_kernels():
    """Every benchmark records the CPU through `machine.cpu` (`describe` for
    one line): a virtual machine's model name can be all it says ("AMD
    EPYC"), so the family/model numbers are kept too; aarch64 says
    "Features" where x86 says "flags"."""
    import doctest

    assert doctest.testmod(machine).failed == 0
    xeon = machine.cpu({"model name": "Intel(R) Xeon(R) Platinum 8581C CPU @ 2.10GHz",
                        "cpu family": "6", "model": "207", "stepping": "2",
                        "flags": "avx2 avx512f amx_bf16 amx_tile amx_int8 avx512_bf16"})
    assert xeon["cpuid"] == "family 6 model 207 stepping 2"
    assert xeon["flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16",
                             "amx_int8"]
    arm = machine.cpu({"Features": "fp asimd bf16", "CPU part": "0xd4f"})
    assert arm["cpuid"] == "" and arm["flags"] == [] and arm["model"]
    assert machine.describe({**arm, "model": "aarch64"}) == "aarch64"
    here = machine.cpu()
    assert here["model"] and here["cores"] >= 1


def test_accelerator_benchmark_names_an_unknown_framework():
    with pytest.raises(SystemExit, match=r"--frameworks: unknown \['keras_vit-mlx'\]; allowed: "
                                         r"keras_vit-jax, keras_vit-tf, keras_vit-torch"):
        accelerator.main(["--frameworks", "keras_vit-mlx"])


def test_official_flax_peer_names_what_is_missing(tmp_path):
    """Without flax or a vision_transformer checkout the peer's row says
    what is missing (`worker_main` records `not installed: <name>`)."""
    args = argparse.Namespace(vit_jax=str(tmp_path), model="tiny", dtype="float32")
    with pytest.raises(ModuleNotFoundError) as error:
        accelerator.official_flax_worker(args)
    assert "--vit-jax: a checkout of google-research/vision_transformer" in error.value.name


# One traced step as jax.profiler writes it on a GPU: kernels on a stream,
# one inside a command buffer (named after its fusion), a cuBLAS GEMM, and
# a host thread; and the compiled HLO those kernels come from.
_TRACE = [
    {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}},
    {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
    {"ph": "X", "pid": 1, "tid": 7, "name": "nvjet_sm90_tst_128x128_NNT", "dur": 3000,
     "args": {"hlo_op": "custom-call.3"}},
    {"ph": "X", "pid": 1, "tid": 7, "name": "loop_add_fusion_2", "dur": 1000,
     "args": {"hlo_op": "command_buffer_1"}},
    {"ph": "X", "pid": 1, "tid": 7, "name": "input_reduce_fusion", "dur": 500,
     "args": {"hlo_op": "input_reduce_fusion"}},
    {"ph": "X", "pid": 1, "tid": 8, "name": "custom-call.3", "dur": 3000},
    {"ph": "X", "pid": 2, "tid": 9, "name": "PjitFunction(step)", "dur": 9000},
]
_HLO = """
ENTRY %main {
  %custom-call.3 = (bf16[8,8]{1,0}, s8[0]{0}) custom-call(%p0, %p1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(block)/dot_general"}
  %loop_add_fusion.2 = bf16[8,8]{1,0} fusion(%gemm_fusion_dot.1), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/transpose(jvp(block))/add_any"}
  ROOT %input_reduce_fusion = f32[8]{0} fusion(%x), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(step)/adam_w/reduce_sum"}
}
"""


def test_profile_summary_joins_kernels_with_their_instructions():
    summary = jax_profile.summarize(_TRACE, _HLO, steps=1)
    assert summary["device_ms_per_step"] == 4.5
    assert summary["by_kind"] == {"gemm": 3.0, "elementwise fusion": 1.0, "reduction fusion": 0.5}
    assert summary["by_phase"] == {"forward": 3.0, "backward": 1.0, "optimizer": 0.5}
    top = summary["top"][1]
    assert (top["instruction"], top["kind"], top["phase"]) == (
        "loop_add_fusion_2", "elementwise fusion", "backward")
    assert "threads" not in summary
    host_only = jax_profile.summarize(_TRACE[3:4] + _TRACE[-1:], "", steps=1)
    assert host_only["device_ms_per_step"] == 0 and host_only["threads"] == {
        "/host:CPU / 9": 9.0}


def test_quantize_export_rows_are_ratios_to_float32_in_the_same_format():
    refusal = ("'m' is quantized by model.quantize('int8') and the tflite export runs only "
               "model.quantize('int4') models as Keras does: the TFLite converter has no "
               "built-in kernel for Keras' int8 and float8 matmuls; export the float model.")
    cells = {("float32", "tflite"): {"size_bytes": 20_000_000, "latency_ms": [5.0, 4.0, 6.0]},
             ("int4", "tflite"): {"size_bytes": 30_000_000, "latency_ms": [20.0, 21.0, 19.0]},
             ("int8", "tflite"): {"error": refusal}}
    rows = quantize_export.rows(cells, ["float32", "int8", "int4"], ["tflite"])
    assert rows == [
        {"mode": "float32", "format": "tflite", "size_mb": 20.0, "latency_ms": 5.0,
         "size_vs_float32": 1.0, "latency_vs_float32": 1.0},
        {"mode": "int8", "format": "tflite", "error": refusal},
        {"mode": "int4", "format": "tflite", "size_mb": 30.0, "latency_ms": 20.0,
         "size_vs_float32": 1.5, "latency_vs_float32": 4.0}]
    assert quantize_export.why(refusal) == ("the TFLite converter has no built-in kernel "
                                            "for Keras' int8 and float8 matmuls")
