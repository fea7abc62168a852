"""Seconds from `fit` to the end of its first step on the TensorFlow
backend, with Keras' deferred build (the optimizer's and the metrics'
variables are created inside the first trace of the train step, so that
`tf.function` traces the step twice) against `_compat.build_before_fit`
(what `keras_vit.training.train` calls: built before `fit`, one trace).

Each measurement is a fresh process (tracing caches nothing across
processes), variants alternating (ABAB, then BABA); float32 AdamW, the
model's first `fit` of one step, which includes building, tracing and the
step itself.

    python benchmarks/first_step.py [--model vit_b16] [--batch 2] [--rounds 3] [--json PATH]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import (  # noqa: E402
    MODELS,
    alternating_processes,
    medians,
    step_arguments,
    write_report,
)
from machine import describe  # noqa: E402

VARIANTS = ("keras default (two traces)", "build_before_fit (one trace)")

_WORKER = """
import json, sys, time
import keras, numpy as np, tensorflow as tf
import keras_vit
from keras_vit import _compat

variant, hidden, layers, heads, mlp, batch, size = sys.argv[1], *map(int, sys.argv[2:])
model = keras_vit.VisionTransformer(patch_size=16, hidden_size=hidden, num_layers=layers,
                                    num_heads=heads, mlp_dim=mlp, classes=1000,
                                    classifier_activation=None, input_shape=(size, size, 3))
x = np.random.default_rng(0).random((batch, size, size, 3), "float32")
dataset = tf.data.Dataset.from_tensors((x, np.arange(batch) % 1000)).repeat()
traces, step = [], model.train_step
model.train_step = lambda data: (traces.append(1), step(data))[1]
start = time.perf_counter()
model.compile(optimizer=keras.optimizers.AdamW(1e-4), metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
if variant == "1":
    _compat.build_before_fit(model, dataset.element_spec)
model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)
first = time.perf_counter() - start
start = time.perf_counter()
model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)
print(json.dumps({"first_fit_s": first, "next_fit_s": time.perf_counter() - start,
                  "traces": len(traces), "tensorflow": tf.__version__}))
"""


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_arguments(parser, model="vit_b16", batch=2, rounds=3, rounds_help="processes per variant")
    args = parser.parse_args(argv)
    spec = MODELS[args.model]
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    runs = alternating_processes(VARIANTS, lambda index: [
        sys.executable, "-c", _WORKER, str(index), str(spec["hidden"]), str(spec["layers"]),
        str(spec["heads"]), str(spec["mlp"]), str(args.batch), str(args.image_size)],
        env, args.rounds, shown="first_fit_s")
    report = {"cpu": describe(), "tensorflow": runs[VARIANTS[0]][0]["tensorflow"],
              "model": args.model, "batch": args.batch, "image_size": args.image_size,
              "first_fit_s": medians(runs, "first_fit_s"),
              "next_fit_s": medians(runs, "next_fit_s"),
              "traces": {name: [run["traces"] for run in runs[name]] for name in VARIANTS},
              "rounds": runs}
    report["saved_s"] = round(report["first_fit_s"][VARIANTS[0]]
                              - report["first_fit_s"][VARIANTS[1]], 2)
    write_report(report, args.json)
    return report


if __name__ == "__main__":
    main()
