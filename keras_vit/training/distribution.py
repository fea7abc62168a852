"""Multi-device training on the JAX backend with `keras.distribution`.

TensorFlow trains under `tf.distribute` strategies (`get_strategy`); Keras
marks `keras.distribution` on TensorFlow as not for use. On JAX,
`get_distribution` turns one spec into a `keras.distribution` object that
`train` sets before building the model:

- `"auto"`: `DataParallel` over every device when there is more than one
  (every process's devices in a multi-process job), else none;
- `"data"`: `DataParallel` over every device (even one);
- `"model:N"`: `ModelParallel` on a `(devices / N, N)` mesh with axes
  `("batch", "model")`: the batch is split over the first axis, and the
  transformer's large kernels over the `model` axis of N devices
  (`vit_layout_map`), as Megatron-LM splits them: the fused qkv and the first
  MLP kernel by output columns, the attention-output and second MLP kernel
  by input rows, so that each block needs one all-reduce after attention and
  one after the MLP; MLP-Mixer's channel MLP the same way;
- `"none"`: one device.

Several processes (one per host, or several on one host) join through
`initialize_processes`, which calls `keras.distribution.initialize` with the
coordinator's address, the process count and this process's id, from its
arguments or from Keras' variables `KERAS_DISTRIBUTION_JOB_ADDRESSES`,
`KERAS_DISTRIBUTION_NUM_PROCESSES`, `KERAS_DISTRIBUTION_PROCESS_ID`. It must
run before anything touches a JAX device. Each process then reads its own
shard of a statically batched `tf.data` pipeline (`DataParallel` shards it
by process); the batch size is global. `train` pads its validation
pipeline's last batch for this (`engine.shardable_validation`).

Example (two processes on one machine, 4 CPU devices each; run with
`XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax`,
`process_id` 0 and 1):

```python
import keras_vit
from keras_vit import training

training.initialize_processes("127.0.0.1:12345", num_processes=2, process_id=0)
with training.get_distribution("data").scope():
    model = keras_vit.ViTTi16(weights=None, classes=10, input_shape=(32, 32, 3))
    model.compile(...)
    model.fit(dataset.batch(64, drop_remainder=True), ...)  # 64: the global batch
```
"""

import os
import re

import keras

KINDS = ("auto", "data", "none")
SPEC_HELP = "auto, data, model:N (N devices per model replica) or none"
ENV = {"coordinator": "KERAS_DISTRIBUTION_JOB_ADDRESSES",
       "num_processes": "KERAS_DISTRIBUTION_NUM_PROCESSES",
       "process_id": "KERAS_DISTRIBUTION_PROCESS_ID"}
# (variable path pattern, layout) for `ModelParallel`: Megatron-style
# column/row splits of every transformer block and Mixer channel MLP. The
# small weights of the later families are replicated: BEiT's and EVA-02's
# `q_bias` / `v_bias` (added to the split qkv output), BEiT's
# `relative_position_bias_table`, EVA-02's `mlp_norm` (checked on JAX over
# 4 CPU devices: model:2 gives the one-device logits to 2e-7).
MODEL_AXIS = "model"
BATCH_AXIS = "batch"
LAYOUTS = (
    (r".*encoderblock_\d+/qkv/kernel", (None, MODEL_AXIS)),
    (r".*encoderblock_\d+/qkv/bias", (MODEL_AXIS,)),
    (r".*encoderblock_\d+/attention_output/kernel", (MODEL_AXIS, None)),
    (r".*encoderblock_\d+/mlp_dense1/kernel", (None, MODEL_AXIS)),
    (r".*encoderblock_\d+/mlp_dense1/bias", (MODEL_AXIS,)),
    (r".*encoderblock_\d+/mlp_dense2/kernel", (MODEL_AXIS, None)),
    (r".*mixerblock_\d+/channel_mixing1/kernel", (None, MODEL_AXIS)),
    (r".*mixerblock_\d+/channel_mixing1/bias", (MODEL_AXIS,)),
    (r".*mixerblock_\d+/channel_mixing2/kernel", (MODEL_AXIS, None)),
)


def parse_spec(spec):
    """`"auto"|"data"|"none"|"model:N"` -> `(kind, model_devices)`."""
    if not isinstance(spec, str):
        raise TypeError(f"distribution={spec!r}; give a string: {SPEC_HELP}.")
    if spec in KINDS:
        return spec, None
    match = re.fullmatch(r"model:(\d+)", spec)
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"distribution={spec!r}; allowed: {SPEC_HELP}.")
    return "model", int(match.group(1))


def _backend_check(kind):
    backend = keras.backend.backend()
    if backend == "jax" or kind == "none":
        return
    if backend == "tensorflow":
        raise ValueError(
            f"distribution={kind!r} is for the JAX backend (keras.distribution); on "
            "TensorFlow use strategy= (keras-vit train --strategy), or set "
            "KERAS_BACKEND=jax.")
    raise ValueError(
        f"distribution={kind!r}: Keras {keras.__version__} has no keras.distribution "
        f"for the {backend} backend; train on one device (distribution='none') or set "
        "KERAS_BACKEND=jax.")


def initialize_processes(coordinator=None, num_processes=None, process_id=None):
    """Joins a multi-process JAX job (`keras.distribution.initialize`);
    returns the number of processes (1: nothing to join).

    Arguments left `None` are read from `KERAS_DISTRIBUTION_JOB_ADDRESSES`,
    `KERAS_DISTRIBUTION_NUM_PROCESSES` and `KERAS_DISTRIBUTION_PROCESS_ID`.
    """
    coordinator = coordinator or os.environ.get(ENV["coordinator"]) or None
    num_processes = _env_int("num_processes", num_processes)
    process_id = _env_int("process_id", process_id)
    if num_processes is None and coordinator is None and process_id is None:
        return 1
    if keras.backend.backend() != "jax":
        raise ValueError(
            "coordinator/num_processes/process_id start a JAX multi-process job; on the "
            f"{keras.backend.backend()} backend use "
            + ("TF_CONFIG with strategy='multiworker'." if keras.backend.backend()
               == "tensorflow" else "one process.")
            + " Unset KERAS_DISTRIBUTION_* or set KERAS_BACKEND=jax.")
    missing = [name for name, value in (("coordinator", coordinator),
                                        ("num_processes", num_processes),
                                        ("process_id", process_id)) if value is None]
    if missing:
        raise ValueError(
            "A multi-process job needs the coordinator's address, the process count and "
            f"this process's id; missing: {', '.join(missing)} (flags --coordinator, "
            "--num-processes, --process-id, or "
            + ", ".join(ENV[name] for name in missing) + ").")
    if num_processes < 1 or not 0 <= process_id < num_processes:
        raise ValueError(f"process_id={process_id} with num_processes={num_processes}; "
                         "the id must be in 0 .. num_processes - 1.")
    if not re.fullmatch(r"[^\s:,]+:\d+(,[^\s:,]+:\d+)*", coordinator):
        raise ValueError(f"coordinator={coordinator!r}; give HOST:PORT (the address of "
                         "process 0), e.g. 10.0.0.1:1234.")
    import jax  # the JAX backend only

    if jax.distributed.is_initialized():  # already joined (a second train() call)
        return num_processes
    keras.distribution.initialize(coordinator, num_processes, process_id)
    return num_processes


def _env_int(name, value):
    if value is not None:
        return value
    raw = os.environ.get(ENV[name])
    if raw in (None, ""):
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{ENV[name]}={raw!r} is not an integer.") from None


def get_distribution(spec="auto"):
    """The `keras.distribution` object for `spec` (None: one device).

    Example:

    ```python
    distribution = keras_vit.training.get_distribution("model:2")
    keras.distribution.set_distribution(distribution)
    model = keras_vit.ViTL16(weights=None, classes=10)  # kernels split over 2 devices
    ```
    """
    kind, model_devices = parse_spec(spec)
    if keras.backend.backend() != "jax":
        if kind == "auto":
            return None
        _backend_check(kind)
        return None
    if kind == "none":
        return None
    devices = keras.distribution.list_devices()
    if kind == "auto":
        return keras.distribution.DataParallel(devices=devices) if len(devices) > 1 else None
    if kind == "data":
        return keras.distribution.DataParallel(devices=devices)
    if len(devices) % model_devices:
        raise ValueError(
            f"distribution='model:{model_devices}' needs a device count divisible by "
            f"{model_devices}; this job has {len(devices)} devices.")
    mesh = keras.distribution.DeviceMesh(
        shape=(len(devices) // model_devices, model_devices),
        axis_names=(BATCH_AXIS, MODEL_AXIS), devices=devices)
    return keras.distribution.ModelParallel(layout_map=vit_layout_map(mesh),
                                            batch_dim_name=BATCH_AXIS)


def vit_layout_map(mesh):
    """A `keras.distribution.LayoutMap` splitting the transformer's and the
    Mixer's large kernels over `mesh`'s `model` axis (see the module)."""
    layout_map = keras.distribution.LayoutMap(mesh)
    for pattern, axes in LAYOUTS:
        layout_map[pattern] = axes
    return layout_map


def check_model_split(model, distribution):
    """A `ModelParallel` split must divide every sharded dimension: one
    ValueError naming the first that does not."""
    if not isinstance(distribution, keras.distribution.ModelParallel):
        return
    mesh = distribution.device_mesh
    size = dict(zip(mesh.axis_names, mesh.shape, strict=True))[MODEL_AXIS]
    for variable in model.weights:
        for pattern, axes in LAYOUTS:
            if re.fullmatch(pattern, variable.path):
                for dim, axis in zip(variable.shape, axes, strict=True):
                    if axis == MODEL_AXIS and dim % size:
                        raise ValueError(
                            f"model:{size} cannot split {variable.path} {tuple(variable.shape)}: "
                            f"{dim} is not divisible by {size}. Choose a model axis that "
                            "divides the hidden size, the qkv width and the MLP width.")


def describe(distribution=None):
    """`{"backend", "kind", "devices", "processes"}` of `distribution` (None:
    one device) for the final JSON line; a TensorFlow strategy's:
    `keras_vit.training.strategy.describe_strategy`.

    >>> describe(None)  # on JAX  # doctest: +SKIP
    {'backend': 'jax', 'kind': 'none', 'devices': 1, 'processes': 1}
    >>> {key: value for key, value in describe(None).items() if key != "backend"}
    {'kind': 'none', 'devices': 1, 'processes': 1}
    """
    backend = keras.backend.backend()
    processes = 1
    if backend == "jax":
        import jax  # the JAX backend only

        processes = jax.process_count()
    if distribution is None:
        return {"backend": backend, "kind": "none", "devices": 1, "processes": processes}
    mesh = distribution.device_mesh
    kind = ("data" if isinstance(distribution, keras.distribution.DataParallel)
            else f"model:{dict(zip(mesh.axis_names, mesh.shape, strict=True))[MODEL_AXIS]}")
    return {"backend": backend, "kind": kind, "devices": int(mesh.devices.size),
            "processes": processes, "mesh": dict(zip(mesh.axis_names, mesh.shape, strict=True))}
