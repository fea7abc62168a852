"""Trains a tiny ViT for a few steps on the JAX backend under a
`keras_vit.training.get_distribution` spec and writes its final weights;
run by tests/test_distribution.py in subprocesses (the device count is an
XLA flag that must be set before JAX starts).

    XLA_FLAGS=--xla_force_host_platform_device_count=4 KERAS_BACKEND=jax \\
    python tests/distribution_worker.py SPEC OUT.npz [--then SPEC OUT.npz ...]
        [--steps 3] [--sam-rho R]
        [--coordinator HOST:PORT --num-processes N --process-id I]

SPEC is a `get_distribution` spec; `sam+SPEC`: SAMModel (rho `--sam-rho`)
under that spec; or `hand-sam`: SAM steps written out by hand with
`jax.grad` on one device (no SAMModel, no optimizer, no fit), the
reference for `sam+SPEC`. The SAM runs (`sam+SPEC`, `hand-sam`) use plain
SGD at `SAM_LR`, which the hand reference applies; the others AdamW.
`--then` runs more specs in the same process, one after the other (each
from the same initial weights; without a distribution, on one device of
the process), to save a process start; each run prints one
`DISTRIBUTION ...` line.

The data are scikit-learn's digits (8x8 scaled to 16x16, RGB), the first
`steps x 16` in order; the initial weights come from a seeded NumPy
generator, so every run starts from the same point whatever the devices.
"""

import argparse
import os
import sys

import numpy as np

BATCH = 16
CONFIG = dict(patch_size=4, hidden_size=24, num_layers=2, num_heads=2, mlp_dim=48,
              dropout_rate=0.0, drop_path_rate=0.0)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--sam-rho", type=float)
    parser.add_argument("--coordinator")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--then", nargs=2, action="append", default=[],
                        metavar=("SPEC", "OUT"), help="another run after this one")
    args = parser.parse_args(argv)

    import keras_vit.training as training

    processes = training.initialize_processes(args.coordinator, args.num_processes,
                                              args.process_id)
    import keras
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    count = args.steps * BATCH
    images = np.repeat(np.kron(digits.images[:count], np.ones((2, 2)))[..., None] * 16.0,
                       3, axis=-1).astype("float32")
    labels = keras.utils.to_categorical(digits.target[:count], 10).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)
    for spec, out in [(args.spec, args.out), *args.then]:
        run(spec, out, args, dataset, processes)
    return 0


def run(spec, out, args, dataset, processes):
    """Trains under `spec` and writes the weights to `out` (process 0)."""
    import jax
    import keras

    import keras_vit.training as training

    sam = spec.startswith("sam+")
    if sam:
        assert args.sam_rho, f"{spec} needs --sam-rho"
        spec = spec[len("sam+"):]
    distribution = None if spec == "hand-sam" else training.get_distribution(spec)
    scope = distribution.scope() if distribution is not None else _nothing()
    with scope:
        import keras_vit

        model = keras_vit.VisionTransformer(**CONFIG, input_shape=(16, 16, 3), classes=10,
                                            classifier_activation=None)
        rng = np.random.default_rng(0)
        initial = [rng.normal(0, 0.1, v.shape).astype("float32") for v in model.weights]
        model.set_weights(initial)
        loss = keras.losses.CategoricalCrossentropy(from_logits=True)
        if spec == "hand-sam":
            sgd = hand_sam(model, dataset, loss, 0.0)  # plain SGD, to compare
            model.set_weights(initial)
            hand_sam(model, dataset, loss, args.sam_rho)
        else:
            trainable = training.SAMModel(model, rho=args.sam_rho) if sam else model
            trainable.compile(optimizer=(keras.optimizers.SGD(SAM_LR) if sam
                                         else keras.optimizers.AdamW(1e-2)), loss=loss)
            trainable.fit(dataset, epochs=1, steps_per_epoch=args.steps, shuffle=False,
                          verbose=0)
        qkv = model.get_layer("encoderblock_0").weights
        sharding = {v.path: str(v.value.sharding.spec) for v in qkv
                    if hasattr(v.value.sharding, "spec")}
        weights = {v.path.replace("/", "."): global_value(v.value) for v in model.weights}
        weights.update({"initial." + v.path.replace("/", "."): w
                        for v, w in zip(model.weights, initial, strict=True)})
        if spec == "hand-sam":
            weights.update({"sgd." + v.path.replace("/", "."): np.asarray(w)
                            for v, w in zip(model.trainable_variables, sgd, strict=True)})
    info = training.distribution.describe(distribution)
    print("DISTRIBUTION", info, "SHARDING", sharding, "PROCESSES", processes,
          "LOCAL_DEVICES", jax.local_device_count(), flush=True)
    if jax.process_index() == 0:
        np.savez(out, **weights)


SAM_LR = 2.0


def hand_sam(model, dataset, loss, rho):
    """SAM by hand: w <- w - lr * grad L(w + rho * g / |g|), g = grad L(w)."""
    import jax
    import jax.numpy as jnp

    values = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]

    def batch_loss(values, x, y):
        logits, _ = model.stateless_call(values, fixed, x, training=True)
        return loss(y, logits)

    grad = jax.grad(batch_loss)
    for x, y in dataset.as_numpy_iterator():
        g = grad(values, x, y)
        norm = jnp.sqrt(sum(jnp.sum(t ** 2) for t in g))
        g_sam = grad([v + t * (rho / (norm + 1e-12)) for v, t in zip(values, g, strict=True)], x, y)
        values = [v - SAM_LR * t for v, t in zip(values, g_sam, strict=True)]
    for variable, value in zip(model.trainable_variables, values, strict=True):
        variable.assign(value)
    return values


def global_value(array):
    """The whole of a (possibly sharded, multi-process) jax.Array."""
    if array.is_fully_addressable or array.is_fully_replicated:
        return np.asarray(array)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


class _nothing:  # noqa: N801  used like contextlib.nullcontext
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    sys.exit(main())
