"""What an export is measured by: how far its logits are from the Keras
model's, and how long a run takes (the export's and the Keras model's)."""

import statistics
import time

import numpy as np
import tensorflow as tf


def compare(reference, got):
    """max |diff|, top-1 agreement and max |reference| of two logit arrays."""
    reference, got = np.asarray(reference, "float64"), np.asarray(got, "float64")
    return (float(np.abs(reference - got).max()),
            float((reference.argmax(-1) == got.argmax(-1)).mean()),
            float(np.abs(reference).max()))


def median_ms(fn, repeats, warmup=2):
    """Median wall time of `fn()` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def keras_latency_ms(model, image, repeats):
    """Median time of one traced `model(image)` call (batch of one)."""
    call = tf.function(lambda x: model(x, training=False))
    x = tf.constant(image)
    return median_ms(lambda: call(x).numpy(), repeats)
