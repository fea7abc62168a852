"""Seconds to open the training and validation pipelines
(`keras_vit.data.make_dataset`) and draw their first training batch, with
the pipeline's functions traced as written (`keras_vit.data._graph.as_written`,
what the library does) against the same functions through AutoGraph (what
`Dataset.map` does by default).

Each measurement is a fresh process (tracing caches nothing across
processes), variants alternating (ABAB, then BABA), on the quickstart's
digits folder (written once under --data). The CPU time of the process
from the first `make_dataset` call to the first batch is recorded with the
wall time.

    python benchmarks/pipeline_start.py [--preset medium2] [--rounds 3] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import machine_info  # noqa: E402

VARIANTS = ("AutoGraph", "as written (the library)")

_WORKER = """
import json, sys, time
variant, data, preset = sys.argv[1:4]
import tensorflow as tf
if variant == "0":  # as_written returns the function itself: AutoGraph converts it
    tf.autograph.experimental.do_not_convert = lambda fn: fn
from keras_vit.data import make_dataset

start, cpu = time.perf_counter(), time.process_time()
train = make_dataset(data, "train", training=True, preset=preset, seed=0, repeat=True,
                     image_size=32, batch_size=64)
validation = make_dataset(data, "test", image_size=32, batch_size=64)
opened = time.perf_counter() - start
next(iter(train))
print(json.dumps({"open_s": opened, "first_batch_s": time.perf_counter() - start,
                  "cpu_s": time.process_time() - cpu, "tensorflow": tf.__version__}))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="medium2",
                        help="the training preset (medium2: RandAugment and MixUp)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per variant")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(),
                                                       "keras_vit_bench_digits"),
                        help="where the digits folder is written (once)")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    from keras_vit.training.quickstart import write_digits

    write_digits(args.data)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    runs = {name: [] for name in VARIANTS}
    for round_ in range(args.rounds):
        for index in ((0, 1) if round_ % 2 == 0 else (1, 0)):
            result = subprocess.run(
                [sys.executable, "-c", _WORKER, str(index), f"folder:{args.data}", args.preset],
                env=env, capture_output=True, text=True, check=True)
            runs[VARIANTS[index]].append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"round {round_ + 1}: {VARIANTS[index]}: "
                  f"{runs[VARIANTS[index]][-1]['first_batch_s']:.2f} s", file=sys.stderr)

    def median(key):
        return {name: round(statistics.median(run[key] for run in runs[name]), 2)
                for name in VARIANTS}

    report = {**machine_info(), "tensorflow": runs[VARIANTS[0]][0]["tensorflow"],
              "preset": args.preset, "open_s": median("open_s"),
              "first_batch_s": median("first_batch_s"), "cpu_s": median("cpu_s"),
              "rounds": runs}
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}, indent=1))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return report


if __name__ == "__main__":
    main()
