"""`get_strategy`: pick the distribution strategy for this machine."""

import json
import logging
import os

import keras
import tensorflow as tf

from keras_vit import _compat

logger = logging.getLogger("keras_vit")
STRATEGIES = ("auto", "tpu", "multiworker", "mirrored", "default")


def _tpu_resolver():
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=os.environ.get("TPU_NAME", ""))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return resolver
    except (ValueError, tf.errors.NotFoundError, tf.errors.InvalidArgumentError,
            tf.errors.UnavailableError, RuntimeError):
        return None


def _workers_in_tf_config():
    try:
        config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON: {error}") from None
    return len(config.get("cluster", {}).get("worker", []))


def get_strategy(name="auto"):
    """Returns a `tf.distribute.Strategy` and logs which.

    `"auto"`: a TPU when a `TPUClusterResolver` connects (Cloud TPU VM,
    `TPU_NAME`, Colab); `MultiWorkerMirroredStrategy` when `TF_CONFIG` names
    several workers; `MirroredStrategy` with more than one GPU; else the
    default strategy. The names `"tpu"`, `"multiworker"`, `"mirrored"`,
    `"default"` force one (a forced TPU that cannot connect is an error).
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; allowed: {STRATEGIES}.")
    if name in ("auto", "tpu"):
        is_tpu_host = bool(os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")
                           or os.path.exists("/dev/accel0") or name == "tpu")
        resolver = _tpu_resolver() if is_tpu_host else None
        if resolver is not None:
            strategy = tf.distribute.TPUStrategy(resolver)
            logger.info("Strategy: TPUStrategy, %d replicas.", strategy.num_replicas_in_sync)
            return strategy
        if name == "tpu":
            raise ValueError("strategy='tpu' but no TPU answered "
                             f"(TPU_NAME={os.environ.get('TPU_NAME', '')!r}).")
    if name == "multiworker" or (name == "auto" and _workers_in_tf_config() > 1):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        logger.info("Strategy: MultiWorkerMirroredStrategy, %d replicas.",
                    strategy.num_replicas_in_sync)
        return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if name == "mirrored" or (name == "auto" and len(gpus) > 1):
        strategy = tf.distribute.MirroredStrategy()
        logger.info("Strategy: MirroredStrategy over %d devices.", strategy.num_replicas_in_sync)
        return strategy
    strategy = tf.distribute.get_strategy()
    logger.info("Strategy: default (one device: %s).", gpus[0].name if gpus else "CPU")
    return strategy


def uses_only_cpus(strategy):
    """True when every replica of `strategy` runs on a CPU."""
    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy: this process's devices
        devices = [d.name for d in tf.config.list_logical_devices()
                   if d.device_type in ("GPU", "TPU")] or ["/cpu:0"]
    return all("CPU" in d.upper() for d in devices)


def is_multi_worker(strategy):
    """True for a `MultiWorkerMirroredStrategy` that spans several workers."""
    return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and _compat.in_multi_worker_mode(strategy))


def describe_strategy(strategy):
    """`{"backend", "kind", "devices", "processes"}` of a tf.distribute
    `strategy` for the final JSON line (a `keras.distribution`'s:
    `keras_vit.training.distribution.describe`).

    >>> describe_strategy(tf.distribute.get_strategy())  # doctest: +NORMALIZE_WHITESPACE
    {'backend': 'tensorflow', 'kind': '_DefaultDistributionStrategy', 'devices': 1,
     'processes': 1}
    """
    processes = 1
    if is_multi_worker(strategy):
        cluster = strategy.cluster_resolver.cluster_spec().as_dict()
        processes = sum(len(tasks) for tasks in cluster.values())
    return {"backend": keras.backend.backend(), "kind": type(strategy).__name__,
            "devices": int(strategy.num_replicas_in_sync), "processes": processes}


def worker_task(strategy):
    """`(is_chief, task_id)` of this process: the chief writes the run's
    files; other workers write theirs to a scratch folder."""
    if not is_multi_worker(strategy):
        return True, 0
    resolver = strategy.cluster_resolver
    task_type, task_id = resolver.task_type, resolver.task_id or 0
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0
                                        and not has_chief)
    return is_chief, task_id


def prepare_model(model, strategy):
    """Makes `model.fit`/`evaluate` work under a multi-worker
    `MultiWorkerMirroredStrategy` in Keras 3 (keras-team/keras#20585).

    Keras 3.15's TensorFlow trainer fails there twice:
    `_maybe_symbolic_build` all-reduces the whole first batch structure at
    once (a tuple of `PerReplica` cannot be converted to a tensor), and the
    step outputs are reduced with `strategy.reduce("MEAN", v, axis=0)`, which
    rejects scalar logs. This builds from the first local replica's batch
    (only shapes and dtypes are used) and returns the step logs as
    1-element vectors, which the reduction averages back to scalars. Only
    this model instance changes; any other strategy leaves it untouched.
    Returns `model`.
    """
    if not is_multi_worker(strategy):
        return model

    def as_vectors(step):
        def wrapped(data):
            return tf.nest.map_structure(
                lambda t: tf.reshape(t, [1]) if t.shape.rank == 0 else t, step(data))
        return wrapped

    _compat.build_from_first_replica(model, strategy)
    model.train_step = as_vectors(model.train_step)
    model.test_step = as_vectors(model.test_step)
    return model
