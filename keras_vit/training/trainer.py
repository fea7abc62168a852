"""`train` and `evaluate`: one call from a model name, a data source and a
recipe to a trained, saved model; what `keras-vit train` runs."""

import json
import math
import os
import time

import logging

import keras

from keras_vit.training.callbacks import default_callbacks
from keras_vit.training.recipes import get_recipe, make_optimizer
from keras_vit.training.sam import SAMModel
from keras_vit.training.strategy import get_strategy, prepare_model, uses_only_cpus, worker_task

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
logger = logging.getLogger("keras_vit")


def set_precision(precision):
    """`float32`, `mixed_bfloat16` (TPU, CPU with AMX) or `mixed_float16`
    (GPU; `compile` wraps the optimizer in a LossScaleOptimizer)."""
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown precision {precision!r}; allowed: {PRECISIONS}.")
    keras.config.set_dtype_policy(precision)


def _build_model(model, weights, classes, image_size, recipe, dropout_rate, drop_path_rate,
                 model_kwargs):
    import keras_vit
    from keras_vit.models.variants import ALL_VARIANTS

    if isinstance(model, str) and model.endswith(".keras"):
        model = keras.saving.load_model(model)
    if isinstance(model, keras.Model):
        wanted = keras.config.dtype_policy().name
        used = {layer.dtype_policy.name for layer in model.layers if layer.weights}
        if wanted not in used:
            logger.warning(
                "The model's layers use the dtype policies %s, not %r: a model "
                "(or .keras file) keeps the policy it was built with. Build it "
                "after keras_vit.training.set_precision(%r) to train in that "
                "precision.", sorted(used), wanted, wanted)
        return model
    if model not in ALL_VARIANTS:
        raise ValueError(f"Unknown model {model!r}; choose from {sorted(ALL_VARIANTS)}, a "
                         ".keras file or a keras.Model.")
    kwargs = dict(model_kwargs or {})
    kwargs.setdefault("dropout_rate", recipe.dropout_rate if dropout_rate is None else dropout_rate)
    kwargs.setdefault("drop_path_rate",
                      recipe.drop_path_rate if drop_path_rate is None else drop_path_rate)
    if ALL_VARIANTS[model].family == "mixer":
        kwargs.pop("dropout_rate")
    return getattr(keras_vit, model)(
        weights=weights, classes=classes, input_shape=(image_size, image_size, 3),
        classifier_activation=None, **kwargs)


def train(model, data, *, weights=None, recipe="finetune", out="runs/keras_vit",
          image_size=None, batch_size=None, steps=None, epochs=None,
          steps_per_epoch=None, learning_rate=None, sam_rho=None,
          precision="float32", strategy="auto", jit_compile="auto", seed=0,
          gradient_accumulation_steps=None, train_split="train",
          val_split="test", preset=None, label_smoothing=None, dropout_rate=None,
          drop_path_rate=None, data_dir=None, cache=False, model_kwargs=None,
          verbose=1):
    """Trains `model` on `data` with a recipe; returns a results dict.

    Args:
        model: a named model (`"ViTB16"`), a `.keras` path or a keras.Model
            (build it inside `strategy.scope()` yourself then).
        data: a `keras_vit.data.make_dataset` source (`"tfds:cifar10"`,
            `"tfrecord:gs://..."`, `"folder:..."`).
        weights: `weights=` of the named model (`"imagenet21k"`, a path).
        recipe: `"finetune"`, `"augreg"`, `"scratch"` or a `Recipe`; the
            other arguments override its values.
        out: run directory: `model.keras` (final), `best.keras`, `log.csv`,
            `tensorboard/`, `backup/` (resume: run the same call again).
            Under a multi-worker strategy the chief writes there and the
            other workers under `out/workers/<task id>/`.
        steps: total optimizer steps (or give `epochs`).
        sam_rho: train with SAM at this radius.
        precision: `float32`, `mixed_bfloat16`, `mixed_float16`.
        strategy: `keras_vit.training.get_strategy` name or a Strategy.
        jit_compile: `"auto"`: XLA on GPU/TPU, off on CPU (XLA's CPU bf16
            path does not use AMX; MirroredStrategy over CPU devices fails
            with XLA).
        gradient_accumulation_steps: batches per optimizer update.

    Returns:
        dict with `val_accuracy`, `val_loss`, `seconds`, `steps`, `epochs`,
        and the artifact paths.
    """
    from keras_vit.data import make_dataset

    start = time.perf_counter()
    recipe = get_recipe(recipe)
    set_precision(precision)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    image_size = image_size or recipe.image_size
    batch_size = batch_size or recipe.batch_size
    preset = preset or recipe.preset
    train_ds, info = make_dataset(
        data, train_split, image_size=image_size, batch_size=batch_size, training=True,
        preset=preset, seed=seed, repeat=True, data_dir=data_dir, cache=cache,
        with_info=True)
    val_ds = make_dataset(data, val_split, image_size=image_size, batch_size=batch_size,
                          data_dir=data_dir, cache=cache)
    if steps_per_epoch is None:
        per_epoch = (info.num_examples or 50 * batch_size) // batch_size
        steps_per_epoch = max(1, min(per_epoch, steps or per_epoch))
    if steps is None and epochs is None:
        raise ValueError("Give `steps` or `epochs`.")
    epochs = epochs or math.ceil(steps / steps_per_epoch)
    total_steps = steps or epochs * steps_per_epoch
    updates = total_steps // (gradient_accumulation_steps or 1)
    if jit_compile == "auto":
        jit_compile = not uses_only_cpus(strategy)

    with strategy.scope():
        net = _build_model(model, weights, info.num_classes, image_size, recipe,
                           dropout_rate, drop_path_rate, model_kwargs)
        trainable = SAMModel(net, rho=sam_rho) if sam_rho else net
        smoothing = recipe.label_smoothing if label_smoothing is None else label_smoothing
        trainable.compile(
            optimizer=make_optimizer(recipe, max(updates, 2), learning_rate,
                                     gradient_accumulation_steps),
            loss=keras.losses.CategoricalCrossentropy(from_logits=True,
                                                      label_smoothing=smoothing),
            metrics=["accuracy"], jit_compile=jit_compile)
    prepare_model(trainable, strategy)
    is_chief, task_id = worker_task(strategy)
    if not is_chief:  # every worker saves; only the chief's files are the run's
        out = os.path.join(out, "workers", str(task_id))
    history = trainable.fit(train_ds, epochs=epochs, steps_per_epoch=steps_per_epoch,
                            validation_data=val_ds, callbacks=default_callbacks(out),
                            verbose=verbose)
    val_loss, val_accuracy = trainable.evaluate(val_ds, verbose=0)
    final = os.path.join(out, "model.keras")
    net.save(final)
    results = {
        "val_accuracy": float(val_accuracy), "val_loss": float(val_loss),
        "seconds": round(time.perf_counter() - start, 1),
        "epochs": epochs, "steps_per_epoch": steps_per_epoch,
        "epochs_run_now": len(history.epoch), "first_epoch_run_now":
            history.epoch[0] if history.epoch else None,
        "model": final, "best_model": os.path.join(out, "best.keras"),
        "log": os.path.join(out, "log.csv"), "recipe": recipe.name, "sam_rho": sam_rho,
        "precision": precision, "replicas": strategy.num_replicas_in_sync,
        "classes": info.num_classes,
    }
    return results


def evaluate(model_path, data, split="test", image_size=None, batch_size=64,
             data_dir=None):
    """Accuracy and loss of a saved model on a data source's split."""
    from keras_vit.data import make_dataset

    model = keras.saving.load_model(model_path)
    size = image_size or model.input_shape[1]
    dataset = make_dataset(data, split, image_size=size, batch_size=batch_size,
                           data_dir=data_dir)
    from_logits = model.layers[-1].get_config().get("activation") in (None, "linear")
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits),
                  metrics=["accuracy"])
    loss, accuracy = model.evaluate(dataset, verbose=0)
    return {"accuracy": float(accuracy), "loss": float(loss), "model": model_path,
            "data": data, "split": split}


def print_json_line(results):
    print(json.dumps(results))
