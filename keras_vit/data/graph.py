"""How the data pipeline's Python functions become graph functions."""

import tensorflow as tf


def as_written(fn):
    """`fn`, for `Dataset.map`, `filter`, `interleave` or `reduce`, traced
    as written instead of through AutoGraph.

    AutoGraph rewrites a function's Python control flow on tensors into
    graph control flow before tf.data traces it. The pipeline's functions
    have none (they branch with `tf.cond` and `tf.where`), and the rewrite
    alone cost every training start 1.5 s (preset `digits`) to 2.6 s
    (`medium2`) on a 2-core Intel Xeon: `python benchmarks/pipeline_start.py
    --preset medium2` (docs/performance/pipeline_start_2026-11-27_*.json).
    A Python `if` on a tensor in such a function is an error when it is
    traced, never a silently different graph.

    Example:

    >>> import tensorflow as tf
    >>> ds = tf.data.Dataset.range(3).map(as_written(lambda x: x * 2))
    >>> [int(x) for x in ds]
    [0, 2, 4]
    """
    return tf.autograph.experimental.do_not_convert(fn)
