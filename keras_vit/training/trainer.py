"""`train`: one call from a model name, a data source and a recipe to a
trained, saved model; what `keras-vit train` runs. The run is planned
(`plan`), checked (`preflight`), run by the backend's engine (`engine`)
and evaluated by `keras_vit.training.evaluate` (`evaluation`): the end of
a run reports on the validation split and draws `curves.png` and
`confusion_matrix.png` in the run folder."""

import dataclasses
import errno
import logging
import os
import time
from collections.abc import Sequence

import keras
import tensorflow as tf

from keras_vit import _console, models
from keras_vit import labels as labels_lib
from keras_vit._framework_text import says_disk_full
from keras_vit._saving import load_keras_model, save_atomically, without_optimizer
from keras_vit.data.presets import Preset, auto_preset
from keras_vit.data.sources import check_holdout
from keras_vit.errors import TrainingDivergedError
from keras_vit.export.model import output_kind
from keras_vit.layers import lora
from keras_vit.training import distribution as distribution_lib
from keras_vit.training import engine, evaluation, preflight
from keras_vit.training import plan as plan_lib
from keras_vit.training.callbacks import (
    BestModelCheckpoint,
    TerminateOnNaNWithAdvice,
    WeightsMoved,
    default_callbacks,
    unmoved_message,
)
from keras_vit.training.datasets import Reading, open_datasets, raise_data_error
from keras_vit.training.layer_decay import layer_decay_scales
from keras_vit.training.plan import TrainPlan, format_summary
from keras_vit.training.precision import warn_if_emulated
from keras_vit.training.recipes import Recipe, get_recipe, make_optimizer
from keras_vit.training.report import format_report
from keras_vit.training.run_folder import open_run_folder
from keras_vit.training.sam import SAMModel
from keras_vit.variants import ALL_VARIANTS

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
    if isinstance(model, (str, os.PathLike)) and str(model).endswith(".keras"):
        model = load_keras_model(model, "model")
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
    preflight.check_model_name(model, weights)
    kwargs = dict(model_kwargs or {})
    kwargs.setdefault("dropout_rate", recipe.dropout_rate if dropout_rate is None else dropout_rate)
    kwargs.setdefault("drop_path_rate",
                      recipe.drop_path_rate if drop_path_rate is None else drop_path_rate)
    if model == "auto":  # the architecture, arithmetic and family of the checkpoint
        return models.model_from_checkpoint(
            weights, classes=classes, input_shape=(image_size, image_size, 3),
            classifier_activation=None, **kwargs)
    if ALL_VARIANTS[model].family == "mixer":
        kwargs.pop("dropout_rate")
    return models.builder(model)(
        weights=weights, classes=classes, input_shape=(image_size, image_size, 3),
        classifier_activation=None, **kwargs)


def train(
    model: str | os.PathLike | keras.Model,
    data: str,
    *,
    weights: str | os.PathLike | None = None,
    recipe: str | Recipe = "finetune",
    out: str | os.PathLike = "runs/keras_vit",
    image_size: int | None = None,
    batch_size: int | None = None,
    steps: int | None = None,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
    learning_rate: float | None = None,
    sam_rho: float | None = None,
    precision: str = "float32",
    strategy: str | tf.distribute.Strategy = "auto",
    jit_compile: bool | str = "auto",
    seed: int | None = 0,
    gradient_accumulation_steps: int | None = None,
    train_split: str = "train",
    val_split: str | None = None,
    preset: str | Preset | None = None,
    label_smoothing: float | None = None,
    dropout_rate: float | None = None,
    drop_path_rate: float | None = None,
    data_dir: str | None = None,
    cache: bool | str = False,
    model_kwargs: dict | None = None,
    skip_corrupt: bool = False,
    holdout: float = 0.1,
    verbose: int = 1,
    distribution: str = "auto",
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    overwrite: bool = False,
    lora_rank: int | None = None,
    lora_targets: str | Sequence[str] | None = None,
    layer_decay: float | None = None,
    ema: float | None = None,
    check_memory: bool = True,
) -> dict:
    """Trains `model` on `data` with a recipe; returns a results dict.

    Prints a summary (model, weights, data, preset, batch, steps, optimizer,
    precision, strategy, output folder) before the first step. The class
    names are stored in the saved model's head and in `OUT/labels.txt`.
    Recipes, resuming, strategies, memory and the measurements behind the
    defaults: docs/training.md.

    Args:
        model: a named model (`"ViTB16"`), `"auto"` (the model the
            `weights` checkpoint describes, `keras_vit.model_from_checkpoint`:
            a timm or transformers folder, `hf://ORG/NAME`, an official
            `.npz`, ...), a `.keras` path or a keras.Model (build it inside
            `strategy.scope()` yourself then).
        data: a `keras_vit.data.make_dataset` source (`"tfds:cifar10"`,
            `"tfrecord:gs://..."`, `"folder:..."`).
        weights, dropout_rate, drop_path_rate, model_kwargs: the named
            model's builder arguments (a ValueError for another model).
        recipe: `"finetune"`, `"augreg"`, `"scratch"` or a `Recipe`; the
            other arguments override its values.
        out: the run folder (`run.json`, `model.keras`, `best.keras`,
            `log.csv`, `labels.txt`, `tensorboard/`, `backup/`). The same
            call again resumes a killed run; a folder of another run or a
            finished one is a ValueError. `overwrite`: remove the run files
            (`run_folder.RUN_FILES`) and start afresh.
        image_size, batch_size: default: the recipe's (the batch halved
            while an epoch has fewer than 10 steps, down to 64); a batch
            larger than the training split is clipped to it.
        steps, epochs, steps_per_epoch, gradient_accumulation_steps: the
            run's length (`steps` or `epochs`) and batches per update.
        learning_rate, label_smoothing: override the recipe's.
        sam_rho: train with SAM at this radius.
        precision: `float32`, `mixed_bfloat16`, `mixed_float16`.
        strategy: TensorFlow: a `get_strategy` name or a Strategy.
        distribution, coordinator, num_processes, process_id: JAX:
            `"auto"`, `"data"`, `"model:N"` or `"none"`
            (`get_distribution`), and a multi-process job.
        jit_compile: `"auto"` (TensorFlow: XLA on GPU/TPU, off on CPU; JAX:
            on; torch: eager), True or False.
        seed, verbose: the random seed (None: unseeded) and Keras' verbosity
            (1, the live progress bar, becomes one line per epoch, 2, when
            stdout is a file or a pipe outside a notebook, as on the CLI).
        train_split, val_split, holdout: split names (`val_split=None`:
            `validation`, else `test`); a folder without split folders
            holds out `holdout` of each class.
        preset, data_dir, cache, skip_corrupt: `make_dataset`'s.
        lora_rank, lora_targets: fine-tune LoRA adapters of this rank
            (`enable_lora`); the saved models hold merged kernels.
        layer_decay: layer-wise learning-rate decay in (0, 1]
            (`layer_decay_scales`).
        ema: weight EMA decay in (0, 1); the averaged weights are validated
            and saved.
        check_memory: refuse before the first step a CPU step estimated
            larger than the available memory (`keras_vit.training.memory`).

    Returns:
        dict with `status` (`"completed"`), `outputs` (`"logits"` for a
        named model), `val_accuracy`, `val_loss` (the training loss, with
        label smoothing: `val_loss_is`), `seconds`, `steps`, `epochs`,
        `data`, `summary`, `skipped_corrupt`, the artifact paths (`model`:
        model.keras, the model without the optimizer's state, of
        `model_size_mb`), `best`,
        `parameters`, `trainable_parameters`, `lora`, `layer_decay`, `ema`.

    Raises:
        ValueError: a bad argument (checked before any work), a data or
            model problem, a folder of another run, or a run that changed
            no weight, in one sentence.
        TrainingDivergedError: the loss became NaN/inf; no `model.keras`
            is written; its `results` say where.

    Example:

    ```python
    results = keras_vit.training.train(
        "ViTB16", "folder:/data/flowers", weights="imagenet21k",
        recipe="finetune", image_size=224, batch_size=64, steps=2_000)
    model = keras.saving.load_model(results["model"])
    ```
    """
    start = time.perf_counter()
    preflight.check_model_name(model, weights)
    preflight.check_numbers(image_size=image_size, batch_size=batch_size, steps=steps,
                            epochs=epochs, steps_per_epoch=steps_per_epoch,
                            gradient_accumulation_steps=gradient_accumulation_steps,
                            learning_rate=learning_rate, sam_rho=sam_rho, lora_rank=lora_rank)
    preflight.check_fine_tuning(lora_rank, lora_targets, layer_decay, ema)
    preflight.check_model_kwargs(model, model_kwargs, weights=weights,
                                 dropout_rate=dropout_rate, drop_path_rate=drop_path_rate)
    preflight.check_arguments(out, seed, label_smoothing, dropout_rate, drop_path_rate,
                              skip_corrupt, overwrite, cache, verbose, data_dir, train_split,
                              val_split)
    jit_compile = preflight.check_jit_compile(jit_compile)
    check_holdout(holdout)  # (the data layer's check: also for sources without a folder)
    recipe = get_recipe(recipe)
    set_precision(precision)
    strategy, distribution = engine.choose(
        strategy, distribution, sam_rho=sam_rho, coordinator=coordinator,
        num_processes=num_processes, process_id=process_id, seed=seed)
    warn_if_emulated(precision, "; --precision float32 trains faster here")
    image_size = preflight.image_size_for(model, image_size) or recipe.image_size
    if preset is None:
        preset, preset_reason = auto_preset(recipe.preset, image_size)
    else:
        preset_reason = "given"
    reading = Reading(image_size=image_size, batch_size=batch_size or recipe.batch_size,
                      data_dir=data_dir, cache=cache, skip_corrupt=skip_corrupt,
                      holdout=holdout)
    datasets, batch_size, batch_reason = open_datasets(
        data, train_split, val_split, distribution, reading, preset=preset, seed=seed,
        recipe=None if batch_size else recipe)
    info, val_info = datasets.info, datasets.val_info
    steps_per_epoch, epochs, updates = plan_lib.schedule(
        info, batch_size, steps, epochs, steps_per_epoch, gradient_accumulation_steps)
    plan = TrainPlan(
        model=model, weights=weights, data=data, train_split=train_split,
        validation_split=val_info.split, class_names=tuple(info.class_names),
        images={"train": info.num_examples, "validation": val_info.num_examples},
        image_size=image_size, batch_size=batch_size, epochs=epochs,
        steps_per_epoch=steps_per_epoch, updates=updates,
        gradient_accumulation_steps=gradient_accumulation_steps, recipe=recipe,
        learning_rate=learning_rate, sam_rho=sam_rho, precision=precision, seed=seed,
        preset=preset, label_smoothing=label_smoothing, dropout_rate=dropout_rate,
        drop_path_rate=drop_path_rate, model_kwargs=model_kwargs, holdout=holdout,
        lora_rank=lora_rank, lora_targets=plan_lib.lora_targets(lora_targets),
        layer_decay=layer_decay, ema=ema, out=out, strategy=strategy,
        distribution=distribution, jit_compile=engine.jit_compile_for(jit_compile, strategy),
        preset_reason=preset_reason,
        check_memory=preflight.check_flag(check_memory, "check_memory"),
        skip_corrupt=skip_corrupt, verbose=_console.progress_verbosity(verbose),
        overwrite=overwrite, start=start,
        batch_reason=batch_reason)
    if plan.named and weights is None and recipe.name == "finetune":
        logger.warning(
            "Fine-tuning %s without pretrained weights: the 'finetune' recipe (SGD, "
            "few steps) expects a pretrained model, and random weights will learn little. "
            "Pass %s or use --recipe scratch.", model, preflight.weights_hint(model))
    with engine.run_scope(distribution):
        return _train_in_scope(plan, datasets)


def _train_in_scope(plan, datasets):
    """The rest of `train`, under the JAX distribution's scope when there
    is one: the run folder (locked), then the model, `fit` and the files."""
    is_chief, task_id = engine.task(plan.strategy)
    if not is_chief:  # every worker saves; only the chief's files are the run's
        plan = dataclasses.replace(plan, out=os.path.join(plan.out, "workers", str(task_id)))
    preflight.check_run_entries(plan.out, plan.overwrite)
    with open_run_folder(plan.out, plan.record(), overwrite=plan.overwrite,
                         epochs=plan.epochs) as folder:
        return _fit_and_save(plan, datasets, folder)


def _compiled_model(plan, info, element_spec):
    """`(model, what fit trains, optimizer)`: the model built (or loaded)
    for the data's classes and compiled by the recipe; TensorFlow: under
    the strategy, with its optimizer, and built for batches of
    `element_spec` (the training dataset's), so that `fit` traces its step
    once, not twice."""
    with engine.model_scope(plan.strategy):
        net = _build_model(plan.model, plan.weights, info.num_classes, plan.image_size,
                           plan.recipe, plan.dropout_rate, plan.drop_path_rate,
                           plan.model_kwargs)
        distribution_lib.check_model_split(net, plan.distribution)
        preflight.check_data_classes(net, info, plan.data, names_must_match=False)
        if plan.lora_rank:
            lora.enable_lora(net, plan.lora_rank, plan.lora_targets, seed=plan.seed)
        scales = (layer_decay_scales(net, plan.layer_decay) if plan.layer_decay is not None
                  else None)
        trainable = SAMModel(net, rho=plan.sam_rho) if plan.sam_rho else net
        optimizer = make_optimizer(plan.recipe, plan.updates, plan.learning_rate,
                                   plan.gradient_accumulation_steps,
                                   learning_rate_scales=scales, ema=plan.ema)
        trainable.compile(
            optimizer=optimizer,
            loss=keras.losses.CategoricalCrossentropy(
                from_logits=_outputs(net) == "logits", label_smoothing=plan.smoothing),
            **engine.compile_options(plan.distribution, plan.jit_compile))
        engine.build_for_fit(trainable, element_spec)
    return net, trainable, optimizer


def _outputs(net):
    """What `net` outputs, `"logits"` or `"probabilities"` (its head's
    activation: `keras_vit.export.output_kind`): the loss takes either, and
    model.keras keeps it. Named models are built with logits
    (`classifier_activation=None`); a model given with a softmax head
    trains (and is saved) with it. A subclassed model, whose last operation
    only its call() knows, is taken to output logits."""
    try:
        return output_kind(net)
    except ValueError:
        return "logits"


def _prepared(plan, datasets, folder):
    """`(net, trainable, optimizer, summary, names_inside)`: the model
    compiled and made ready for the engine, the pre-flight disk and memory
    checks passed, the summary printed."""
    net, trainable, optimizer = _compiled_model(plan, datasets.info,
                                                datasets.train.element_spec)
    names_inside = labels_lib.set_class_names(net, datasets.info.class_names)
    rows = engine.rows(trainable, plan.strategy, plan.distribution)
    preflight.check_free_space(plan.out, net, plan.recipe)
    memory = preflight.check_step_memory(plan, net)
    summary = plan_lib.summary(plan, net, datasets, rows, folder, memory,
                               engine.step_kind(plan.jit_compile))
    if plan.verbose:
        logger.info("training %s on %s\n%s", summary["model"], plan.data,
                    format_summary(summary))
    return net, trainable, optimizer, summary, names_inside


def _fit_and_save(plan, datasets, folder):
    """Builds, fits and saves, in the locked run folder `folder`."""
    info, out = datasets.info, plan.out
    net, trainable, optimizer, summary, names_inside = _prepared(plan, datasets, folder)
    callbacks = default_callbacks(out, model=net, ema=plan.ema is not None)
    nan_guard = next(c for c in callbacks if isinstance(c, TerminateOnNaNWithAdvice))
    best = next(c for c in callbacks if isinstance(c, BestModelCheckpoint))
    moved = WeightsMoved()
    backup = next(c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore))
    callbacks.insert(callbacks.index(backup) + 1, moved)  # compares the restored weights
    train = datasets.train
    if folder.resumed_epoch and datasets.train_from is not None:
        # the batches the run never killed gives after its finished epochs
        train = datasets.train_from(folder.resumed_epoch * plan.steps_per_epoch)
    try:
        history = trainable.fit(train, epochs=plan.epochs,
                                steps_per_epoch=plan.steps_per_epoch,
                                validation_data=datasets.validation, callbacks=callbacks,
                                shuffle=False, verbose=plan.verbose)
        if nan_guard.stopped_at is None:
            metrics = trainable.evaluate(datasets.validation, verbose=0)
    except Exception as error:  # a corrupt file: one sentence naming it
        _raise_disk_full(error, out)
        raise_data_error(error)
        raise
    final = os.path.join(out, "model.keras")
    if nan_guard.stopped_at is not None:
        folder.finish("diverged", diverged_at=list(nan_guard.stopped_at))
        _raise_diverged(nan_guard.stopped_at, final, best, history=history, start=plan.start,
                        epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch, out=out,
                        pictures=evaluation.run_pictures(out, None))
    if history.epoch and moved.changed is False:
        raise ValueError(unmoved_message(optimizer, plan.updates, trainable))
    labels_path = os.path.join(out, "labels.txt")
    try:
        # the model alone: the optimizer's state is the backup's (LoRA: plain kernels)
        save_atomically(without_optimizer(lora.merge_lora(net)), final)
        labels_lib.write_labels(info.class_names, labels_path)
    except OSError as error:
        _raise_disk_full(error, out)
        raise
    if not names_inside:
        logger.warning("%s's last layer is not a keras_vit ClassifierHead, so the class "
                       "names are not inside %s; they are in %s.", net.name, final,
                       labels_path)
    val_info = datasets.val_info
    report = evaluation.run_report(net, datasets.validation, list(info.class_names),
                                   val_info.split, engine.one_process(plan.strategy))
    if report is not None and plan.verbose:
        logger.info("model.keras on the %s split:\n%s", val_info.split,
                    format_report(report))
    results = plan_lib.results(plan, summary, datasets, folder, metrics=metrics,
                               history=history, best=best, outputs=_outputs(net),
                               evaluation=report, pictures=evaluation.run_pictures(out, report))
    if plan.verbose:
        logger.info("saved %s (%.1f MB: the model and its class names, without the "
                    "optimizer's state)", final, results["model_size_mb"])
    if plan.skip_corrupt and (info.skipped_corrupt or val_info.skipped_corrupt):
        logger.warning("Skipped corrupt, unreadable or too large image files: %d in "
                       "training, %d in validation (distinct files).",
                       info.skipped_corrupt, val_info.skipped_corrupt)
    folder.finish("completed", val_accuracy=results["val_accuracy"], best=best.best)
    return results


def _raise_diverged(stopped_at, final, best, *, history, start, epochs, steps_per_epoch, out,
                    pictures):
    """Raises TrainingDivergedError for a run the NaN guard stopped."""
    epoch, batch, loss = stopped_at
    kept = (f"{best.path} holds epoch {best.best['epoch']} ({best.monitor} "
            f"{best.best['value']:.4f}), the best before it"
            if best.best else "No epoch finished before it, so there is no best.keras")
    stale = (f"; the {final} there is from an earlier run" if os.path.exists(final) else "")
    message = (f"Training diverged: the loss became {loss} at epoch {epoch + 1}, batch "
               f"{batch}; model.keras was not written (its weights are not finite){stale}. "
               f"{kept}. Try a lower --learning-rate or a longer warmup.")
    results = {
        "status": "diverged", "error": message, "val_accuracy": None, "val_loss": None,
        "seconds": round(time.perf_counter() - start, 1),
        "epochs": epochs, "steps_per_epoch": steps_per_epoch,
        "epochs_run_now": len(history.epoch),
        "diverged_at": {"epoch": epoch + 1, "batch": batch, "loss": loss},
        "model": None, "best_model": best.path if best.best else None, "best": best.best,
        "log": os.path.join(out, "log.csv"), "pictures": pictures,
    }
    raise TrainingDivergedError(message, results)


def _raise_disk_full(error, out):
    """Re-raises a full disk (`ENOSPC`, also as h5py's or TensorFlow's
    text) met while the run wrote to `out` as one ValueError naming it."""
    seen, met = error, set()
    while seen is not None and id(seen) not in met:
        met.add(id(seen))
        if ((isinstance(seen, OSError) and seen.errno == errno.ENOSPC)
                or says_disk_full(str(seen))):
            raise ValueError(
                f"The disk of {out} filled up while the run wrote its files there "
                f"([Errno {errno.ENOSPC}] No space left on device); free some space there and "
                "run the same command again (it resumes from the last finished epoch), or "
                "pass --out on another disk to start afresh.") from None
        seen = seen.__cause__ or seen.__context__
