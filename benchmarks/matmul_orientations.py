"""TensorFlow's (oneDNN) float32 matmul against PyTorch's at the shapes of a
ViT training step, in each orientation the step uses: forward `x @ W`, the
input gradient `dy @ W^T` (`transpose_b`) and the weight gradient `x^T @ dy`
(`transpose_a`, and with an explicit transpose). Medians of 5 rounds of 20
calls, `--threads` threads each (TensorFlow: intra-op, one inter-op thread;
PyTorch: `set_num_threads`); TensorFlow's times include copying the result
to NumPy (2-3 ms at ViT-B/16's shapes). `--threads 1` against the default 2
separates the kernels themselves from how each framework shares a matmul
between threads.

    python benchmarks/matmul_orientations.py [--model vit_b16] [--batch 8] [--threads 2]
"""

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import MODELS, timed_rounds  # noqa: E402
from machine import describe  # noqa: E402


def median_ms(call, calls=20, rounds=5):
    """Median ms per call of `rounds` rounds of `calls`, after 2 warm-ups."""
    return round(1e3 * statistics.median(timed_rounds(call, 2, rounds, calls)), 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_b16", choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=8, help="images (197 tokens each)")
    parser.add_argument("--threads", type=int, default=2, help="threads per matmul")
    args = parser.parse_args(argv)

    import numpy as np
    import tensorflow as tf
    import torch

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    torch.set_num_threads(args.threads)
    spec = MODELS[args.model]
    rows = args.batch * 197
    print(f"{describe()}; TensorFlow {tf.__version__}, PyTorch {torch.__version__}; "
          f"{args.threads} thread(s)")
    for k, n in ((spec["hidden"], 3 * spec["hidden"]), (spec["hidden"], spec["mlp"]),
                 (spec["mlp"], spec["hidden"])):
        print(compare(rows, k, n, np, tf, torch), flush=True)


def compare(rows, k, n, np, tf, torch):
    """One shape's row: ms per call in each orientation and framework."""
    rng = np.random.default_rng(0)
    x, w, dy = (rng.random(shape, dtype=np.float32) for shape in ((rows, k), (k, n), (rows, n)))
    tx, tw, tdy = (tf.constant(a) for a in (x, w, dy))
    px, pw, pdy = (torch.from_numpy(a) for a in (x, w, dy))
    forward = tf.function(lambda a, b: tf.matmul(a, b))
    input_grad = tf.function(lambda a, b: tf.matmul(a, b, transpose_b=True))
    weight_grad = tf.function(lambda a, b: tf.matmul(a, b, transpose_a=True))
    weight_grad_explicit = tf.function(lambda a, b: tf.matmul(tf.transpose(a), b))
    return {"shape (rows, in, out)": (rows, k, n),
            "forward tf": median_ms(lambda: forward(tx, tw).numpy()),
            "forward torch": median_ms(lambda: px @ pw),
            "input grad tf": median_ms(lambda: input_grad(tdy, tw).numpy()),
            "input grad torch": median_ms(lambda: pdy @ pw.t()),
            "weight grad tf": median_ms(lambda: weight_grad(tx, tdy).numpy()),
            "weight grad tf, explicit transpose": median_ms(
                lambda: weight_grad_explicit(tx, tdy).numpy()),
            "weight grad torch": median_ms(lambda: px.t() @ pdy)}


if __name__ == "__main__":
    main()
