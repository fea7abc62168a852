"""Seconds to open the training and validation pipelines
(`keras_vit.data.make_dataset`) and draw their first training batch, with
the pipeline's functions traced as written (`keras_vit.data.graph.as_written`,
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
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import alternating_processes, medians, write_report  # noqa: E402
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
    runs = alternating_processes(VARIANTS, lambda index: [
        sys.executable, "-c", _WORKER, str(index), f"folder:{args.data}", args.preset],
        env, args.rounds, shown="first_batch_s")
    report = {**machine_info(), "tensorflow": runs[VARIANTS[0]][0]["tensorflow"],
              "preset": args.preset, "open_s": medians(runs, "open_s"),
              "first_batch_s": medians(runs, "first_batch_s"), "cpu_s": medians(runs, "cpu_s"),
              "rounds": runs}
    write_report(report, args.json)
    return report


if __name__ == "__main__":
    main()
