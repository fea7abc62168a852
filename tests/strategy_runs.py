"""Runs distributed-training scenarios in a fresh process (logical CPU
devices must be configured before TensorFlow starts). Prints one JSON line
per scenario, in the order given (several in one process save its start).

    python tests/strategy_runs.py SCENARIO [SCENARIO ...]
        (mirrored, sam_mirrored, sam_m_sharpness, single)
    TF_CONFIG=... python tests/strategy_runs.py multiworker  (one per worker)

`single` and `multiworker` save the final weights to `$WEIGHTS_OUT` (.npz).
Imported (`from strategy_runs import run, tiny_vit`), it configures no
device: `run(tf.distribute.get_strategy())` is `single` in the importing
process.
"""

import json
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402


def _two_logical_cpus():
    """Splits the CPU into 2 logical devices (before TensorFlow starts)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)


if __name__ == "__main__" and "TF_CONFIG" not in os.environ:
    _two_logical_cpus()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402
from keras_vit.training import SAMModel, prepare_model  # noqa: E402

STEPS, GLOBAL_BATCH = 3, 8


def data(steps=STEPS):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (steps * GLOBAL_BATCH, 16, 16, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 4, steps * GLOBAL_BATCH), 4)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def tiny_vit():
    """The same tiny ViT with the same random weights every call."""
    keras.utils.set_random_seed(1)
    model = keras_vit.VisionTransformer(
        patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
        input_shape=(16, 16, 3), classes=4, classifier_activation=None)
    rng = np.random.default_rng(2)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.2
                       for w in model.get_weights()])
    return model


def run(strategy, sam_rho=None, steps=STEPS):
    """`steps` SGD steps of `tiny_vit` (SAM with `sam_rho`) under `strategy`:
    the final weights and the last loss."""
    with strategy.scope():
        model = tiny_vit()
        trainable = SAMModel(model, rho=sam_rho) if sam_rho else model
        trainable.compile(keras.optimizers.SGD(0.1),
                          keras.losses.CategoricalCrossentropy(from_logits=True),
                          jit_compile=False)
    prepare_model(trainable, strategy)
    history = trainable.fit(data(steps), epochs=1, verbose=0)
    return model.get_weights(), history.history["loss"][-1]


def m_sharpness_reference(rho=0.05, lr=0.1):
    """One SAM step by hand: each half of the batch (one replica) perturbs
    with its own gradient; the SAM gradients are averaged."""
    model = tiny_vit()
    x, y = next(iter(data(1)))
    variables = model.trainable_variables
    loss_fn = keras.losses.CategoricalCrossentropy(from_logits=True)
    sam_grads = []
    for half in (slice(0, GLOBAL_BATCH // 2), slice(GLOBAL_BATCH // 2, None)):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[half], model(x[half], training=True))
        grads = tape.gradient(loss, variables)
        scale = rho / (tf.linalg.global_norm(grads) + 1e-12)
        values = [v.value + g * scale for v, g in zip(variables, grads, strict=True)]
        with tf.GradientTape() as tape:
            tape.watch(values)
            with keras.StatelessScope(state_mapping=list(zip(variables, values, strict=True))):
                loss = loss_fn(y[half], model(x[half], training=True))
        sam_grads.append(tape.gradient(loss, values))
    return [v.numpy() - lr * (a.numpy() + b.numpy()) / 2
            for v, a, b in zip(variables, *sam_grads, strict=True)]


def main(scenario):
    """Runs one scenario; prints its JSON line."""
    if scenario in ("single", "multiworker"):
        strategy = (tf.distribute.MultiWorkerMirroredStrategy() if scenario == "multiworker"
                    else tf.distribute.get_strategy())
        weights, loss = run(strategy)
        np.savez(os.environ["WEIGHTS_OUT"], *weights)
        print(json.dumps({"scenario": scenario, "loss": float(loss),
                          "replicas": strategy.num_replicas_in_sync}))
        return
    if scenario == "sam_m_sharpness":  # one step
        expected = m_sharpness_reference()
        got, _ = run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), 0.05, steps=1)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(got, expected, strict=True))
        print(json.dumps({"scenario": scenario, "max_weight_diff": diff}))
        return
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    single = tf.distribute.get_strategy()
    rho = 0.05 if scenario == "sam_mirrored" else None
    w_multi, loss_multi = run(mirrored, rho)
    w_single, loss_single = run(single, rho)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(w_multi, w_single, strict=True))
    print(json.dumps({"scenario": scenario, "replicas": mirrored.num_replicas_in_sync,
                      "max_weight_diff": diff, "loss_multi": float(loss_multi),
                      "loss_single": float(loss_single)}))


if __name__ == "__main__":
    for name in sys.argv[1:]:
        main(name)
