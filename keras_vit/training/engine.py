"""The engine of a run, chosen per backend in this one place: TensorFlow
trains under a tf.distribute strategy, JAX under a keras.distribution
(the validation batches padded so that they split over its replicas),
torch on one device; whether the step is compiled (XLA, jax.jit,
torch.compile) and how the summary says so; which process writes the run's
files; how the model is compiled and built for `fit`."""

import contextlib

import keras
import tensorflow as tf

from keras_vit import _compat
from keras_vit.data.graph import as_written
from keras_vit.training import distribution as distribution_lib
from keras_vit.training.sam import check_backend as check_sam_backend
from keras_vit.training.strategy import (
    describe_strategy,
    get_strategy,
    is_multi_worker,
    prepare_model,
    uses_only_cpus,
    worker_task,
)


def choose(strategy, distribution, *, sam_rho, coordinator, num_processes, process_id, seed):
    """`(strategy, distribution)` of the run, the random seed set in
    between (as `train` always did): a Strategy on TensorFlow (made from
    its name) and no distribution, or a keras.distribution (or None) and no
    strategy. Bad specifications, and a multi-process job that cannot
    start, fail here, before any work."""
    strategy, distribution = _strategy_or_distribution(
        strategy, distribution, sam_rho, coordinator, num_processes, process_id)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    return strategy, distribution


def run_scope(distribution):
    """JAX: the distribution is active from building the model to saving
    it (fit shards the batches, and every process's pipeline, under it)."""
    return distribution.scope() if distribution is not None else contextlib.nullcontext()


def model_scope(strategy):
    """TensorFlow: the strategy's scope, where the model and its optimizer
    are made."""
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def replicas(distribution):
    """The data-parallel replicas a global batch is split over (1 without
    a JAX distribution: a tf.distribute strategy splits any batch)."""
    return distribution.num_model_replicas if distribution is not None else 1


def task(strategy):
    """`(is_chief, task id)` of this process: the chief writes the run's files."""
    return worker_task(strategy) if strategy is not None else _process_task()


def one_process(strategy):
    """Whether the run is one process: no multi-worker strategy, no
    multi-process JAX job (what the end-of-run report needs: it predicts
    the validation batches in this process alone)."""
    if strategy is not None:
        return not is_multi_worker(strategy)
    if keras.backend.backend() != "jax":
        return True
    import jax  # the JAX backend only

    return jax.process_count() == 1


def compile_options(distribution, jit_compile):
    """`compile`'s metrics and `jit_compile`: padded validation batches
    (JAX) carry sample weights, so the accuracy is weighted there, and the
    padding counts for nothing."""
    return {**({"weighted_metrics": ["accuracy"]} if distribution is not None
               else {"metrics": ["accuracy"]}),
            "jit_compile": jit_compile}


def build_for_fit(trainable, element_spec):
    """TensorFlow: `trainable` built for batches of `element_spec` (the
    training dataset's), so that `fit` traces its step once, not twice."""
    if keras.backend.backend() == "tensorflow":
        _compat.build_before_fit(trainable, element_spec)


def rows(trainable, strategy, distribution):
    """`(strategy row, distribution row)` of the summary, the model made
    ready for the strategy first on TensorFlow."""
    if strategy is not None:
        prepare_model(trainable, strategy)
        return _strategy_row(strategy), describe_strategy(strategy)
    return _distribution_row(distribution), distribution_lib.describe(distribution)


def _strategy_or_distribution(strategy, distribution, sam_rho, coordinator, num_processes,
                              process_id):
    """`(strategy, distribution)`: TensorFlow trains under a tf.distribute
    strategy (a name still, or a Strategy) and no distribution; JAX and
    torch under a keras.distribution (or None) and no strategy. Bad
    specifications, and a multi-process job that cannot start, fail here,
    before any work."""
    backend = keras.backend.backend()
    distribution_lib.parse_spec(distribution)  # a bad spec fails before any work
    if backend == "tensorflow":
        distribution_lib.get_distribution(distribution)  # data/model:N raise: use strategy=
        distribution_lib.initialize_processes(coordinator, num_processes, process_id)  # raises
        return strategy, None
    if not (strategy == "auto" or strategy == "default"):
        raise ValueError(
            f"strategy={strategy!r} is a TensorFlow tf.distribute strategy; on the "
            f"{backend} backend give distribution= (keras-vit train --distribution "
            f"{distribution_lib.SPEC_HELP}).")
    if sam_rho:
        check_sam_backend(sam_rho)  # before any work
    distribution_lib.initialize_processes(coordinator, num_processes, process_id)
    return None, distribution_lib.get_distribution(distribution)


def jit_compile_for(jit_compile, strategy):
    """`jit_compile="auto"` made True or False (see `train`)."""
    if jit_compile != "auto":
        return jit_compile
    if keras.backend.backend() == "torch":  # as Keras' own "auto": torch.compile stays off
        return False
    return True if strategy is None else not uses_only_cpus(strategy)


def step_kind(jit_compile):
    """How the training step runs, as the summary says it."""
    backend = keras.backend.backend()
    if backend == "torch":
        return "torch.compile (jit_compile=True)" if jit_compile else "eager (PyTorch)"
    if backend == "jax":
        return "XLA (jax.jit)" if jit_compile else "eager (JAX, jit_compile=False)"
    return "XLA (jit_compile=True)" if jit_compile else "TensorFlow graph (no XLA)"


def _process_task():
    """`(is_chief, process id)` of a JAX multi-process job (0 is the chief)."""
    if keras.backend.backend() != "jax":
        return True, 0
    import jax  # the JAX backend only

    return jax.process_index() == 0, jax.process_index()


def _distribution_row(distribution):
    """The summary's "strategy" row on JAX/torch: the distribution's devices."""
    if distribution is None:
        devices = []
        if keras.backend.backend() == "jax":
            import jax  # the JAX backend only

            devices = jax.local_devices()[:1]
        kind = "one device"
    else:
        devices = list(distribution.device_mesh.devices.flat)
        kind = (f"keras.distribution {type(distribution).__name__} "
                f"({distribution_lib.describe(distribution)['kind']})")
    return {"name": kind, "replicas": max(1, len(devices)),
            "devices": [str(d) for d in devices] or [keras.backend.backend()]}


def _strategy_row(strategy):
    try:  # the default strategy raises RuntimeError here
        devices = list(strategy.extended.worker_devices or ())
    except (RuntimeError, AttributeError):
        devices = []
    return {"name": type(strategy).__name__, "replicas": strategy.num_replicas_in_sync,
            "devices": devices or [d.name for d in tf.config.list_logical_devices()[:1]]}


def shardable_validation(dataset, info, batch_size, distribution):
    """The validation pipeline with every batch padded to `batch_size`, so
    that a `keras.distribution` can split each one over its replicas
    (Keras cannot shard a last batch of, say, 51 images over 2 devices, and
    shards a pipeline per process only when its batch size is static),
    without leaving an image out.

    Each batch becomes `(x, y, w)`: padding rows are zeros with weight 0;
    real images weigh `padded_total / count`. Keras averages the loss over
    every row it sees (padding included) and weights each batch by its row
    count, so that factor makes `val_loss` the mean over the real images
    exactly; the accuracy (a weighted metric then) is unchanged by it.
    """
    replicas = distribution.num_model_replicas
    if batch_size % replicas:
        raise ValueError(
            f"batch_size={batch_size} cannot be split over the {replicas} data-parallel "
            f"replicas of the distribution; give a multiple of {replicas}.")
    count = info.num_examples
    if count is None:
        count = int(dataset.reduce(0, as_written(lambda n, batch: n + tf.shape(batch[0])[0])))
    if not count:
        raise ValueError(f"The validation split {info.split!r} holds no images.")
    padded = -(-count // batch_size) * batch_size
    scale = padded / count

    def pad(x, y):
        n = tf.shape(x)[0]
        extra = batch_size - n
        x = tf.pad(x, [[0, extra]] + [[0, 0]] * (len(x.shape) - 1))
        y = tf.pad(y, [[0, extra]] + [[0, 0]] * (len(y.shape) - 1))
        w = tf.concat([tf.fill([n], tf.constant(scale, tf.float32)), tf.zeros([extra])], 0)
        return (tf.ensure_shape(x, [batch_size, *x.shape[1:]]),
                tf.ensure_shape(y, [batch_size, *y.shape[1:]]),
                tf.ensure_shape(w, [batch_size]))
    return dataset.map(as_written(pad))
