"""Peak memory of one training step with and without per-block
rematerialisation (`remat=True`, gradient checkpointing), on CPU.

    python benchmarks/remat.py [--model ViTL16] [--batch 8] [--size 224] \\
        [--backends tensorflow jax] [--repeats 1] [--json remat.json]

Each configuration (backend x remat) runs in a fresh process: it builds the
model (`weights=None`, 1000 classes, logits), compiles it with AdamW and
sparse categorical cross-entropy, and runs ONE `train_on_batch` (forward,
backward, AdamW update; the first step also traces the graph and creates
the optimizer's slots) on a batch of random pixels. Reported per process
(peak RSS, `ru_maxrss`, is a high-water mark, so it is read after each
phase): the peak after the imports, after building and compiling, and
after the step, and the step's seconds. With `--repeats N` each process is
run N times and the medians are reported. This is a benchmark, not a test:
the numbers depend on the machine, the backend's allocator and its
threads. Prints one line per run and the summary; `--json` writes it,
with the CPU model and flags.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import textwrap

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from machine import cpu  # noqa: E402  (the same CPU record as the README's)

ROOT = pathlib.Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, {root!r})
    import keras, numpy as np
    import keras_vit

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    imports = peak_mb()
    model = getattr(keras_vit, {model!r})(weights=None, classifier_activation=None,
                                          input_shape=({size}, {size}, 3), remat={remat})
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, ({batch}, {size}, {size}, 3)).astype("float32")
    y = rng.integers(0, 1000, ({batch},))
    built = peak_mb()
    start = time.perf_counter()
    loss = float(np.asarray(model.train_on_batch(x, y)))
    seconds = time.perf_counter() - start
    print(json.dumps({{"imports_peak_mb": imports, "built_peak_mb": built,
                      "step_peak_mb": peak_mb(), "step_seconds": seconds,
                      "loss": loss, "parameters": model.count_params(),
                      "keras": keras.__version__}}))
""")


def run(backend, remat, args):
    """One fresh process; its JSON line."""
    code = CHILD.format(root=str(ROOT), model=args.model, size=args.size,
                        batch=args.batch, remat=remat)
    env = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=args.timeout)
    if result.returncode != 0:
        raise SystemExit(f"{backend} remat={remat} failed (exit {result.returncode}):\n"
                         f"{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summarize(runs):
    """The medians of the runs of one configuration."""
    keys = ("imports_peak_mb", "built_peak_mb", "step_peak_mb", "step_seconds")
    row = {key: statistics.median(r[key] for r in runs) for key in keys}
    row["step_above_built_mb"] = statistics.median(
        r["step_peak_mb"] - r["built_peak_mb"] for r in runs)
    row["loss"] = runs[0]["loss"]
    row["parameters"] = runs[0]["parameters"]
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="ViTL16", help="a keras_vit named model")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--backends", nargs="+", default=["tensorflow"],
                        choices=["tensorflow", "jax", "torch"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per process")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args(argv)

    results = []
    for backend in args.backends:
        for remat in (False, True):
            runs = []
            for repeat in range(args.repeats):
                runs.append(run(backend, remat, args))
                print(f"{backend} remat={remat} run {repeat + 1}: {json.dumps(runs[-1])}",
                      flush=True)
            results.append({"backend": backend, "remat": remat, **summarize(runs),
                            "runs": runs})
    print(f"\n{args.model}, batch {args.batch}, {args.size}x{args.size}, one AdamW step "
          f"(median of {args.repeats}); peak RSS in MB")
    print(f"{'backend':<11} {'remat':<6} {'built':>8} {'step peak':>10} "
          f"{'step - built':>13} {'seconds':>8}")
    for row in results:
        print(f"{row['backend']:<11} {str(row['remat']):<6} {row['built_peak_mb']:8.0f} "
              f"{row['step_peak_mb']:10.0f} {row['step_above_built_mb']:13.0f} "
              f"{row['step_seconds']:8.1f}")
    for backend in args.backends:
        plain, remat = (next(r for r in results if r["backend"] == backend and r["remat"] == m)
                        for m in (False, True))
        print(f"{backend}: remat lowers the step's peak by "
              f"{plain['step_peak_mb'] - remat['step_peak_mb']:.0f} MB "
              f"({remat['step_peak_mb'] / plain['step_peak_mb']:.2f}x), "
              f"step time x{remat['step_seconds'] / plain['step_seconds']:.2f}")
    report = {"model": args.model, "batch": args.batch, "image_size": args.size,
              "repeats": args.repeats, "results": results, "cpu": cpu(),
              "python": platform.python_version(),
              "date": datetime.date.today().isoformat(),
              "command": "python benchmarks/remat.py " + " ".join(argv or sys.argv[1:])}
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
