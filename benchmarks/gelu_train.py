"""The TensorFlow training step with keras_vit's GELU (its derivative
written out, `layers.fused._gelu_with_gradient`) against the same step with
`tf.nn.gelu` and the gradient TensorFlow derives for it: one process, two
models of the same configuration, rounds interleaved (ABAB, then BABA) so
that a noisy machine hits both alike; float32 AdamW `train_on_batch`.

    python benchmarks/gelu_train.py [--model vit_s16] [--batch 8] [--rounds 8] [--json PATH]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import MODELS, step_arguments, write_report  # noqa: E402
from machine import describe  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    step_arguments(parser, model="vit_s16", batch=8, rounds=8,
                   rounds_help="rounds of 2 steps per variant")
    args = parser.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf

    import keras_vit
    from keras_vit.layers import fused as _fused

    spec = MODELS[args.model]
    written_out = _fused._gelu_with_gradient
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, (args.batch, args.image_size, args.image_size, 3)).astype("float32")
    y = np.arange(args.batch) % 1000
    models = {}
    def derived(v, approximate):
        return tf.nn.gelu(v, approximate=approximate)

    for name, gelu in (("written-out gradient", written_out), ("tf.nn.gelu", derived)):
        # The step is traced (and the GELU chosen) at the first call.
        _fused._gelu_with_gradient = gelu
        model = keras_vit.VisionTransformer(
            patch_size=16, hidden_size=spec["hidden"], num_layers=spec["layers"],
            num_heads=spec["heads"], mlp_dim=spec["mlp"], classes=1000,
            classifier_activation=None, input_shape=(args.image_size, args.image_size, 3))
        model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        for _ in range(2):
            model.train_on_batch(x, y)
        models[name] = model
    _fused._gelu_with_gradient = written_out
    times = {name: [] for name in models}
    for round_ in range(args.rounds):
        for name in (list(models) if round_ % 2 == 0 else list(models)[::-1]):
            start = time.perf_counter()
            for _ in range(2):
                models[name].train_on_batch(x, y)
            times[name].append((time.perf_counter() - start) / 2)
    medians = {name: statistics.median(t) for name, t in times.items()}
    report = {"cpu": describe(), "tensorflow": tf.__version__, "model": args.model,
              "batch": args.batch, "seconds_per_step": {k: round(v, 4) for k, v in medians.items()},
              "rounds_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
              "speedup": round(medians["tf.nn.gelu"] / medians["written-out gradient"], 3)}
    write_report(report, args.json)
    return report


if __name__ == "__main__":
    main()
