"""`train` and `evaluate`: one call from a model name, a data source and a
recipe to a trained, saved model; what `keras-vit train` runs."""

import contextlib
import dataclasses
import errno
import hashlib
import logging
import math
import os
import shutil
import stat
import time
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

import keras_vit
from keras_vit import _atomic, _checks, _compat
from keras_vit import labels as labels_lib
from keras_vit._console import plural
from keras_vit._saving import (
    host_values,
    keras_input_shape,
    load_keras_model,
    save_atomically,
)
from keras_vit.data import data_error, make_dataset
from keras_vit.data.graph import as_written
from keras_vit.data.presets import Preset, auto_preset
from keras_vit.data.sources import check_holdout
from keras_vit.export.model import output_kind
from keras_vit.inspect.analysis import check_finite_outputs, input_size
from keras_vit.layers import lora
from keras_vit.labels import class_names
from keras_vit.training import distribution as distribution_lib
from keras_vit.training import memory as memory_lib
from keras_vit.training.callbacks import (
    BestModelCheckpoint,
    TerminateOnNaNWithAdvice,
    default_callbacks,
)
from keras_vit.training.layer_decay import layer_decay_scales
from keras_vit.training.precision import warn_if_emulated
from keras_vit.training.recipes import Recipe, get_recipe, make_optimizer
from keras_vit.training.run_folder import RUN_FILES, open_run_folder
from keras_vit.training.sam import SAMModel
from keras_vit.training.sam import check_backend as check_sam_backend
from keras_vit.training.strategy import (
    describe_strategy,
    get_strategy,
    prepare_model,
    uses_only_cpus,
    worker_task,
)
from keras_vit.variants import ALL_VARIANTS
from keras_vit.weights import registry

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


def _check_model_kwargs(model, model_kwargs, **builder_options):
    """`model_kwargs`, `weights`, `dropout_rate` and `drop_path_rate`
    (`builder_options`, None when not given) go to a named model's
    builder: for a `.keras` file or a keras.Model (not built here) they
    are a ValueError, not ignored (and recorded in `run.json` as used)."""
    if isinstance(model, str) and not model.endswith(".keras"):
        if model_kwargs is not None and not isinstance(model_kwargs, dict):
            raise TypeError(f"`model_kwargs` must be a dict of the builder's arguments "
                            f"(e.g. {{'remat': True}}) or None, got {model_kwargs!r}.")
        return
    given = "a keras.Model" if isinstance(model, keras.Model) else repr(str(model))
    if model_kwargs:
        raise ValueError(
            f"model_kwargs={model_kwargs!r} (--remat, --weights-ema) build a named model, "
            f"but the model is {given}, which is not built here; give a named model "
            "(e.g. ViTB16), or build the model with them yourself.")
    options = {name: value for name, value in builder_options.items() if value is not None}
    if options:
        named = ", ".join(f"{name}={value!r}" + (" (--weights)" if name == "weights" else "")
                          for name, value in options.items())
        raise ValueError(
            f"{named} {'is an option' if len(options) == 1 else 'are options'} of a named "
            f"model's builder, but the model is {given}, which is not built here and keeps "
            "its own weights, dropout and drop path; leave "
            f"{'it' if len(options) == 1 else 'them'} out, or give a named model (e.g. "
            "ViTB16).")


def _check_arguments(out, seed, label_smoothing, dropout_rate, drop_path_rate, skip_corrupt,
                     overwrite, cache, verbose, data_dir, train_split, val_split):
    """The values of `train`'s arguments that no later check reads before
    any work: a wrong type is a TypeError, a bad value a ValueError, each
    naming the argument (and its flag)."""
    if not isinstance(out, (str, os.PathLike)) or not str(os.fspath(out)).strip():
        raise (ValueError if isinstance(out, str) else TypeError)(
            f"`out` (--out) must be a folder path, got {out!r}.")
    _checks.optional(_checks.seed, seed=seed)
    _checks.optional(_checks.fraction, label_smoothing=label_smoothing,
                     dropout_rate=dropout_rate, drop_path_rate=drop_path_rate)
    _checks.boolean(skip_corrupt, "skip_corrupt", "--skip-corrupt")
    _checks.boolean(overwrite, "overwrite", "--overwrite")
    if not (isinstance(cache, bool) or (isinstance(cache, str) and cache.strip())):
        raise TypeError(f"`cache` must be True, False or a file path, got {cache!r}.")
    if not (isinstance(verbose, int) and not isinstance(verbose, bool) and verbose in (0, 1, 2)):
        raise (TypeError if not isinstance(verbose, int) or isinstance(verbose, bool)
               else ValueError)(f"`verbose` must be 0, 1 or 2 (Keras' fit), got {verbose!r}.")
    if data_dir is not None and not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"`data_dir` (--data-dir) must be a folder path or None, got "
                        f"{data_dir!r}.")
    for name, value, optional in (("train_split", train_split, False),
                                  ("val_split", val_split, True)):
        if not ((value is None and optional) or (isinstance(value, str) and value.strip())):
            raise TypeError(f"`{name}` must be a split name (a non-empty string"
                            f"{', or None' if optional else ''}), got {value!r}.")


def _weights_hint(model):
    """"weights (e.g. --weights NAME ...)" with a registered name that exists
    for the named `model` (its ImageNet-21k pre-training first), else how to
    pass a file: the no-weights warning never suggests weights the model lacks."""
    variant = ALL_VARIANTS.get(model)
    names = [n for n in (registry.available_weights(variant) if variant else ())
             if not n.endswith(">")]
    pretrained = [n for n in ("imagenet21k", "augreg") if n in names] or names
    if pretrained:
        return (f"weights (e.g. --weights {pretrained[0]}; `keras-vit models` lists "
                f"{model}'s: {', '.join(names)})")
    if variant is None:
        return "weights (a registered name, listed by `keras-vit models`, or a checkpoint file)"
    return f"weights (no registered weights exist for {model}: a checkpoint file)"


def _fixed_input_size(model):
    """`(height, width)` of a model (keras.Model or `.keras` path) whose
    input size is fixed; None for a named model or a dynamic input."""
    if isinstance(model, keras.Model):
        shape = model.input_shape
    elif isinstance(model, (str, os.PathLike)) and str(model).endswith(".keras"):
        shape = keras_input_shape(model)
    else:
        return None
    if not (isinstance(shape, (tuple, list)) and len(shape) == 4):
        return None
    height, width = shape[1], shape[2]
    return None if height is None or width is None else (int(height), int(width))


def _image_size_for(model, image_size):
    """`image_size` checked against a model whose input size is fixed (that
    size when `image_size` is None): a ValueError before any work, instead
    of a shape error from the first step."""
    fixed = _fixed_input_size(model)
    if fixed is None:
        return image_size
    height, width = fixed
    name = (repr(str(model)) if isinstance(model, (str, os.PathLike))
            else f"The model {model.name!r}")
    if height != width:
        raise ValueError(f"{name} takes {height}x{width} images, but train feeds square "
                         "images; give a model with a square or dynamic input size.")
    if image_size is not None and image_size != height:
        raise ValueError(f"{name} takes {height}x{width} images (its input size is fixed), "
                         f"but image_size={image_size} (--image-size) was given; leave it "
                         f"out or give {height}.")
    return height


def _clip_batch_size(batch_size, info, distribution):
    """`batch_size`, or the training split's image count when the batch is
    larger than the split (a multiple of the data-parallel replicas under a
    JAX distribution), with a warning."""
    count = info.num_examples
    if not count or batch_size <= count:
        return batch_size
    replicas = distribution.num_model_replicas if distribution is not None else 1
    clipped = max(replicas, count - count % replicas)
    logger.warning("batch_size=%d is larger than the %d images of the training split %r; "
                   "using batches of %d (every image once per step).", batch_size, count,
                   info.split, clipped)
    return clipped


def _model_identity(model):
    """What the run record says of `model`: a name, a `.keras` file (its
    path and SHA-256), or a keras.Model (name, class, parameters)."""
    if isinstance(model, keras.Model):
        return {"name": model.name, "class": type(model).__name__,
                "parameters": int(model.count_params())}
    if str(model).endswith(".keras"):
        digest = hashlib.sha256()
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        return {"file": os.path.abspath(model), "sha256": digest.hexdigest()}
    return str(model)


def _data_identity(data):
    """`data` with a folder's path made absolute (a run started from
    another working directory is the same run)."""
    if isinstance(data, str) and data.startswith("folder:"):
        return "folder:" + os.path.abspath(data[len("folder:"):])
    return data if isinstance(data, str) else repr(data)


def _open_data(data, split, **kwargs):
    """`make_dataset(..., with_info=True)`; a missing split says which exist."""
    return make_dataset(data, split, with_info=True, **kwargs)


def _pick_val_split(data, val_split, train_split, open_split):
    """`val_split` as given, else `validation` when the data has it, else
    `test`. Returns `(split, dataset, info)`."""
    if val_split is not None:
        if val_split == train_split:
            logger.warning(
                "Validating on the training split %r: the validation accuracy measures "
                "memorisation, not generalisation. Name another split (--val-split) or "
                "leave it out (a folder of class subfolders then holds out 10%%).",
                val_split)
        return (val_split, *open_split(val_split))
    try:
        return ("validation", *open_split("validation"))
    except ValueError as first:
        try:
            return ("test", *open_split("test"))
        except ValueError:
            raise first from None


def _split_row(info):
    present = getattr(info, "classes_present", None)
    return {"split": info.split, "images": info.num_examples,
            "classes": present if present is not None else info.num_classes,
            "description": getattr(info, "description", info.source)}


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


def format_summary(summary):
    """The lines `train` prints before the first step."""
    d = summary
    trainable = d.get("trainable_parameters", d["parameters"])
    rows = [
        ("model", f"{d['model']} ({d['parameters']:,} parameters"
                  + (f", {trainable:,} trainable" if trainable != d["parameters"] else "")
                  + ")"),
        ("weights", d["weights"]),
        ("image size", f"{d['image_size']} px"),
        ("classes", f"{d['classes']}" + (f": {', '.join(d['class_names'][:10])}"
                                         + (", ..." if len(d["class_names"]) > 10 else "")
                                         if d.get("class_names") else "")),
    ]
    for kind in ("train", "validation"):
        row = d["data"][kind]
        images = ("unknown number of images" if row["images"] is None
                  else plural(row["images"], "image"))
        rows.append((kind, f"{images}, {plural(row['classes'], 'class', 'classes')}  "
                           f"[{row['description']}]"))
    rows += [
        ("preset", f"{d['preset']} ({d['preset_reason']})"),
        ("batch", f"{d['batch_size']} (global"
                  + (f"; {d['batch_reason']}" if d.get("batch_reason") else "") + ")"
                  + (f", {plural(d['gradient_accumulation_steps'], 'batch', 'batches')} "
                     "per update" if d.get("gradient_accumulation_steps") else "")),
        ("steps", f"{plural(d['epochs'], 'epoch')} x {plural(d['steps_per_epoch'], 'step')} "
                  f"= {plural(d['epochs'] * d['steps_per_epoch'], 'batch', 'batches')}"),
        ("optimizer", f"{d['recipe']} recipe: {d['optimizer']}, peak learning rate "
                      f"{d['learning_rate']:g}, {plural(d['warmup_steps'], 'warmup update')}, "
                      f"{d['decay']} decay" + (f", SAM rho {d['sam_rho']:g}"
                                                if d.get("sam_rho") else "")
                      + (f", layer decay {d['layer_decay']:g}" if d.get("layer_decay")
                         else "")
                      + (f", weight EMA {d['ema']:g}" if d.get("ema") else "")),
        ("precision", d["precision"]),
        *([("step", d["step"])] if d.get("step") else []),
        *([("memory", f"about {d['memory']['estimated'] / 1e9:,.1f} GB per step (estimated), "
                      f"{d['memory']['available'] / 1e9:,.1f} GB available")]
          if d.get("memory") else []),
        ("strategy", f"{d['strategy']['name']}, {plural(d['strategy']['replicas'], 'replica')} on "
                     f"{', '.join(d['strategy']['devices'])}"),
        ("output", d["out"]),
        ("run", d["run"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What one `train` call does, decided once before the first step from
    its arguments, the recipe, the backend and the training split: the run
    folder, the model, `fit` and the results read it, and nothing changes
    it (a worker's own folder is a copy with another `out`). A plan of no
    optimizer update (`updates` < 1) is a ValueError.

    >>> plan.batch_size, plan.steps_per_epoch, plan.updates  # doctest: +SKIP
    (64, 50, 2000)
    """

    model: object               # a variant name, a `.keras` path or a keras.Model
    data: object                # the `make_dataset` source
    weights: object
    recipe: Recipe
    out: str
    image_size: int
    batch_size: int             # global, clipped to the training split
    epochs: int
    steps_per_epoch: int
    updates: int                # optimizer updates of the whole run
    gradient_accumulation_steps: int | None
    learning_rate: float | None  # None: the recipe's
    sam_rho: float | None
    precision: str
    strategy: object            # TensorFlow: a tf.distribute.Strategy; else None
    distribution: object        # JAX: a keras.distribution.Distribution or None
    jit_compile: object
    seed: int | None
    train_split: str
    preset: object              # a preset name or a `keras_vit.data.Preset`
    preset_reason: str
    label_smoothing: float | None
    dropout_rate: float | None
    drop_path_rate: float | None
    model_kwargs: dict | None
    lora_rank: int | None
    lora_targets: tuple | None
    layer_decay: float | None
    ema: float | None
    check_memory: bool
    skip_corrupt: bool
    holdout: float
    verbose: int
    overwrite: bool
    start: float                # time.perf_counter() when `train` was called
    batch_reason: str = "given"  # why `batch_size` (the summary's batch row)

    def __post_init__(self):
        # image_size, batch_size, epochs and steps_per_epoch are not checked
        # again here: `train` checked its arguments before any work (and
        # make_dataset a recipe's sizes), and made the others from them.
        _checks.positive_int(self.updates, "updates")

    @property
    def named(self):
        """Whether `model` is a variant name (built here, with `weights`)."""
        return isinstance(self.model, str) and not self.model.endswith(".keras")


@dataclasses.dataclass(frozen=True)
class _Datasets:
    """The pipelines of a run and what `make_dataset` says of them."""

    train: object               # tf.data.Dataset, repeated
    validation: object
    info: object                # DatasetInfo of the training split
    val_info: object
    # (skip_batches) -> the training pipeline from that batch on (a resume)
    train_from: object = None


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

    Prints a summary (model, parameters, weights, image size, classes and
    images per split, preset, batch, steps, optimizer and peak learning
    rate, precision, strategy and devices, output directory) before the
    first step. The data's class names are stored in the saved model's head
    (`keras_vit.labels.class_names(keras.saving.load_model(path))`), and in
    `OUT/labels.txt`.

    Args:
        model: a named model (`"ViTB16"`), a `.keras` path or a keras.Model
            (build it inside `strategy.scope()` yourself then).
        data: a `keras_vit.data.make_dataset` source (`"tfds:cifar10"`,
            `"tfrecord:gs://..."`, `"folder:..."`).
        weights: `weights=` of the named model (`"imagenet21k"`, a path).
            The `finetune` recipe without weights warns: it fine-tunes
            random weights.
        recipe: `"finetune"`, `"augreg"`, `"scratch"` or a `Recipe`; the
            other arguments override its values.
        out: run directory: `run.json` (the run record), `model.keras`
            (final), `best.keras`, `log.csv`, `labels.txt`, `tensorboard/`,
            `backup/`. A killed run resumes when the same call runs again
            (same model, data, class names and every argument that changes
            the result: the record matches); a folder holding another run,
            or a finished one, is a ValueError saying so. One process
            writes a folder at a time (a file lock). Under a multi-worker
            strategy the chief writes there and the other workers under
            `out/workers/<task id>/`.
        overwrite: remove the run files in `out` (only those: see
            `keras_vit.training.run_folder.RUN_FILES`) and start afresh.
        image_size: input size (default: the recipe's: 384 for `finetune`,
            224 otherwise; a model whose input size is fixed trains at that
            size, and another `image_size` is a ValueError).
        batch_size: global batch size, always honoured (one larger than the
            training split is clipped to the split, with a warning). None:
            the recipe's, halved while an epoch of the training split has
            fewer than 10 steps, down to 64 (`Recipe.batch_for`: finetune's
            512 on 796 images is 64, 12 steps an epoch); the summary's batch
            row says why.
        steps: total optimizer steps (or give `epochs`).
        sam_rho: train with SAM at this radius.
        precision: `float32`, `mixed_bfloat16`, `mixed_float16`.
        strategy: TensorFlow backend: a `keras_vit.training.get_strategy`
            name or a Strategy.
        distribution: JAX backend: `"auto"` (data parallel over every
            device when there are several), `"data"`, `"model:N"` (kernels
            split over N devices) or `"none"`; see
            `keras_vit.training.get_distribution`. On torch: one device.
        coordinator, num_processes, process_id: JAX multi-process jobs
            (`keras.distribution.initialize`; default: Keras'
            `KERAS_DISTRIBUTION_*` variables). Process 0 writes the run's
            files; the others write theirs under `out/workers/<id>/`.
        jit_compile: `"auto"`: TensorFlow: XLA on GPU/TPU, off on CPU (XLA's
            CPU bf16 path does not use AMX; MirroredStrategy over CPU
            devices fails with XLA; in float32 `True` measured 1.05-1.18x
            faster for ViT-S/16, 0.97-1.03x for ViT-B/16); JAX: always
            compiled; torch: eager (as Keras' own "auto"; `True` is
            `torch.compile`).
        gradient_accumulation_steps: batches per optimizer update.
        train_split, val_split: split names. `val_split=None`: `validation`
            when the data has it, else `test`. A folder of class subfolders
            without split folders holds out `holdout` of each class
            (deterministic) as its validation split.
        preset: a `keras_vit.data` preset; default: the recipe's, or
            `small` for images of 64 px or less.
        skip_corrupt: skip and count corrupt image files instead of stopping
            at the first with an error naming it.
        holdout: fraction held out of a folder without split folders.
        lora_rank: fine-tune with LoRA adapters of this rank
            (`keras_vit.training.enable_lora`): only the adapters and the
            head train. `model.keras` and `best.keras` hold the merged
            model (plain Dense kernels `W + delta`), which loads and exports
            as any other.
        lora_targets: the blocks' Dense layers that get adapters (default:
            `qkv` and `attention_output` of a ViT, both MLPs of a Mixer;
            `"mlp"` adds a ViT's MLP).
        layer_decay: layer-wise learning-rate decay rate in (0, 1]: the
            learning rate of block `i` of `L` is multiplied by `rate ** (L -
            i)`, that of the patch embedding by `rate ** (L + 1)`, the head's
            by 1 (`keras_vit.training.layer_decay_scales`).
        check_memory: on the CPU, refuse before the first step a step whose
            estimated memory is more than the machine has available
            (`keras_vit.training.memory`; the OOM killer would otherwise end
            the run mid-epoch without a word). False trains anyway (swap, or
            an estimate too high for this model).
        ema: keep an exponential moving average of the weights with this
            decay in (0, 1) (Keras' `use_ema`): validation, `best.keras`
            and `model.keras` use the averaged weights.

    Returns:
        dict with `status` (`"completed"`), `outputs` (what `model.keras`
        outputs: `"logits"` for a named model, built with
        `classifier_activation=None`; apply `keras.ops.softmax` for
        probabilities), `val_accuracy`, `val_loss` (the
        training loss: with the recipe's label smoothing; `val_loss_is` says it),
        `seconds`, `steps`, `epochs`, `data` (`{"train": {split, images,
        classes}, "validation": ...}`), `summary`, `skipped_corrupt`, the
        artifact paths and `best` (`{"monitor", "value", "epoch"}` of
        `best.keras`, the best epoch of the whole run, resumes included),
        `parameters` and `trainable_parameters` (of the model trained:
        with LoRA, the adapters and the head), `lora` (`{"rank",
        "targets"}` or None), `layer_decay` and `ema` (`{"decay",
        "weights_saved": "ema"}` or None).

    Raises:
        ValueError: a bad argument (numbers are checked before any work),
            a data or model problem, an output folder that holds another
            run, or a run that changed no weight, in one sentence.
        TrainingDivergedError: the loss became NaN/inf; no `model.keras`
            is written; its `results` say where (`keras-vit train` prints
            them as its JSON line and exits with status 1).

    Example:

    ```python
    results = keras_vit.training.train(
        "ViTB16", "folder:/data/flowers", weights="imagenet21k",
        recipe="finetune", image_size=224, batch_size=64, steps=2_000)
    model = keras.saving.load_model(results["model"])
    ```
    """
    start = time.perf_counter()
    _checks.optional(_checks.positive_int, image_size=image_size, batch_size=batch_size,
                     steps=steps, epochs=epochs, steps_per_epoch=steps_per_epoch,
                     gradient_accumulation_steps=gradient_accumulation_steps)
    _checks.optional(_checks.positive_float, learning_rate=learning_rate, sam_rho=sam_rho)
    _checks.optional(_checks.positive_int, lora_rank=lora_rank)
    _check_fine_tuning(lora_rank, lora_targets, layer_decay, ema)
    _check_model_kwargs(model, model_kwargs, weights=weights, dropout_rate=dropout_rate,
                        drop_path_rate=drop_path_rate)
    _check_arguments(out, seed, label_smoothing, dropout_rate, drop_path_rate, skip_corrupt,
                     overwrite, cache, verbose, data_dir, train_split, val_split)
    if not (isinstance(jit_compile, str) and jit_compile == "auto"):
        jit_compile = _checks.boolean(jit_compile, "jit_compile", 'or "auto"')
    check_holdout(holdout)  # (the data layer's check: also for sources without a folder)
    recipe = get_recipe(recipe)
    set_precision(precision)
    strategy, distribution = _strategy_or_distribution(
        strategy, distribution, sam_rho, coordinator, num_processes, process_id)
    if seed is not None:
        keras.utils.set_random_seed(seed)
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    warn_if_emulated(precision, "; --precision float32 trains faster here")
    image_size = _image_size_for(model, image_size) or recipe.image_size
    if preset is None:
        preset, preset_reason = auto_preset(recipe.preset, image_size)
    else:
        preset_reason = "given"
    datasets, batch_size, batch_reason = _open_datasets(
        data, train_split, val_split, distribution, preset=preset, seed=seed,
        recipe=None if batch_size else recipe, image_size=image_size,
        batch_size=batch_size or recipe.batch_size, data_dir=data_dir, cache=cache,
        skip_corrupt=skip_corrupt, holdout=holdout)
    steps_per_epoch, epochs, updates = _schedule(
        datasets.info, batch_size, steps, epochs, steps_per_epoch, gradient_accumulation_steps)
    plan = TrainPlan(
        model=model, data=data, weights=weights, recipe=recipe, out=out,
        image_size=image_size, batch_size=batch_size, epochs=epochs,
        steps_per_epoch=steps_per_epoch, updates=updates,
        gradient_accumulation_steps=gradient_accumulation_steps,
        learning_rate=learning_rate, sam_rho=sam_rho, precision=precision,
        strategy=strategy, distribution=distribution,
        jit_compile=_jit_compile(jit_compile, strategy), seed=seed,
        train_split=train_split, preset=preset, preset_reason=preset_reason,
        label_smoothing=label_smoothing, dropout_rate=dropout_rate,
        drop_path_rate=drop_path_rate, model_kwargs=model_kwargs,
        lora_rank=lora_rank, lora_targets=_targets(lora_targets), layer_decay=layer_decay,
        ema=ema, check_memory=_checks.boolean(check_memory, "check_memory"),
        skip_corrupt=skip_corrupt, holdout=holdout, verbose=verbose, overwrite=overwrite,
        start=start, batch_reason=batch_reason)
    if plan.named and weights is None and recipe.name == "finetune":
        logger.warning(
            "Fine-tuning %s without pretrained weights: the 'finetune' recipe (SGD, "
            "few steps) expects a pretrained model, and random weights will learn little. "
            "Pass %s or use --recipe scratch.", model, _weights_hint(model))

    # JAX: the distribution is active from building the model to saving it
    # (fit shards the batches, and every process's pipeline, under it).
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        return _train_in_scope(plan, datasets)


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


def _open_datasets(data, train_split, val_split, distribution, *, preset, seed, recipe=None,
                   **common):
    """`(_Datasets, global batch size, why that batch)`: the training
    pipeline (shuffled, augmented by `preset`, repeated) and the validation
    one. With `recipe` (no batch size given) the batch is the recipe's for
    the split's size (`Recipe.batch_for`). A batch larger than the training
    split is clipped to it (the training pipeline is then opened again
    with that batch); under a JAX distribution each validation batch is
    padded so that it splits over the replicas."""
    def open_train(skip_batches=0):
        return _open_data(data, train_split, training=True, preset=preset, seed=seed,
                          repeat=True, skip_batches=skip_batches, **common)

    train_ds, info = open_train()
    reason = "given"
    if recipe is not None:
        replicas = distribution.num_model_replicas if distribution is not None else 1
        common["batch_size"], reason = recipe.batch_for(info.num_examples, replicas)
    batch_size = _clip_batch_size(common["batch_size"], info, distribution)
    if batch_size != common["batch_size"]:
        common["batch_size"] = batch_size
        reason = f"clipped to the training split ({reason})"
    if info.global_batch_size != batch_size:
        train_ds, info = open_train()
    _, val_ds, val_info = _pick_val_split(
        data, val_split, train_split, lambda split: _open_data(data, split, **common))
    if distribution is not None:
        val_ds = _shardable_validation(val_ds, val_info, batch_size, distribution)
    return (_Datasets(train_ds, val_ds, info, val_info, lambda skip: open_train(skip)[0]),
            batch_size, reason)


def _schedule(info, batch_size, steps, epochs, steps_per_epoch, gradient_accumulation_steps):
    """`(steps_per_epoch, epochs, updates)` of a run: by default an epoch
    is the training split once (at most `steps` batches; 50 batches for a
    split of unknown size), and `steps` make `epochs` (rounded up)."""
    if steps_per_epoch is None:
        per_epoch = (info.num_examples or 50 * batch_size) // batch_size
        steps_per_epoch = max(1, min(per_epoch, steps or per_epoch))
    if steps is None and epochs is None:
        raise ValueError("Give `steps` or `epochs` (keras-vit train: --steps or --epochs).")
    epochs = epochs or math.ceil(steps / steps_per_epoch)
    total_steps = steps or epochs * steps_per_epoch
    updates = total_steps // (gradient_accumulation_steps or 1)
    if not updates:
        raise ValueError(
            f"gradient_accumulation_steps={gradient_accumulation_steps} batches per update, "
            f"but the whole run has {plural(total_steps, 'batch', 'batches')}: no optimizer "
            f"update would happen; give at most {total_steps} (--gradient-accumulation-steps), "
            "or more steps or epochs.")
    return steps_per_epoch, epochs, updates


def _jit_compile(jit_compile, strategy):
    """`jit_compile="auto"` made True or False (see `train`)."""
    if jit_compile != "auto":
        return jit_compile
    if keras.backend.backend() == "torch":  # as Keras' own "auto": torch.compile stays off
        return False
    return True if strategy is None else not uses_only_cpus(strategy)


def _step_kind(jit_compile):
    """How the training step runs, as the summary says it."""
    backend = keras.backend.backend()
    if backend == "torch":
        return "torch.compile (jit_compile=True)" if jit_compile else "eager (PyTorch)"
    if backend == "jax":
        return "XLA (jax.jit)" if jit_compile else "eager (JAX, jit_compile=False)"
    return "XLA (jit_compile=True)" if jit_compile else "TensorFlow graph (no XLA)"


def _train_in_scope(plan, datasets):
    """The rest of `train`, under the JAX distribution's scope when there
    is one: the run folder (locked), then the model, `fit` and the files."""
    if plan.strategy is not None:
        is_chief, task_id = worker_task(plan.strategy)
    else:
        is_chief, task_id = _process_task()
    if not is_chief:  # every worker saves; only the chief's files are the run's
        plan = dataclasses.replace(plan, out=os.path.join(plan.out, "workers", str(task_id)))
    check_run_entries(plan.out, plan.overwrite)
    with open_run_folder(plan.out, _run_record(plan, datasets), overwrite=plan.overwrite,
                         epochs=plan.epochs) as folder:
        return _fit_and_save(plan, datasets, folder)


# The run files kept in folders (each holding only what Keras writes there).
_RUN_FOLDERS = ("backup", "tensorboard")


def _entry_problem(path, folder):
    """What is wrong with the entry at `path` for a run file (`folder`: a
    run folder), in words; None for a regular file (a real folder) or none."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(status.st_mode):
        return f"a symbolic link (to {os.readlink(path)!r})"
    if folder:
        return None if stat.S_ISDIR(status.st_mode) else "not a folder"
    if stat.S_ISREG(status.st_mode):
        return None
    return "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file"


def check_run_entries(out, overwrite=False):
    """A ValueError before any write when an entry of run folder `out` that
    `train` writes or renames onto (a run file, a temporary of one, or
    anything in `backup/` or `tensorboard/`) is a symbolic link, a FIFO, a
    device or a folder where a file belongs: Keras' and the logs' writers
    open such paths as they are, so a planted link would make the run write
    (or append to) its target. With `overwrite` the run files themselves
    are not checked: `--overwrite` removes them (a link, not its target)."""
    if not os.path.isdir(out):
        return
    names = [entry.name for entry in os.scandir(out)
             if (entry.name in RUN_FILES and not overwrite) or any(
                 entry.name.startswith(prefix) for name in RUN_FILES
                 for prefix in (f".{name}.tmp", f"{name}.tmp"))]
    for name in sorted(names):
        path = os.path.join(out, name)
        found = [(path, _entry_problem(path, name in _RUN_FOLDERS))]
        if name in _RUN_FOLDERS and found[0][1] is None:
            for root, folders, files in os.walk(path):
                found += [(os.path.join(root, n), _entry_problem(os.path.join(root, n), False))
                          for n in files]
                found += [(os.path.join(root, n), _entry_problem(os.path.join(root, n), True))
                          for n in folders]
        removable = (" or --overwrite (which removes the entry, not what it points to)"
                     if name in RUN_FILES else "")
        for where, problem in found:
            if problem is not None:
                raise ValueError(
                    f"{where} is {problem}, and train writes its run files in --out only as "
                    "regular files and folders of its own (it would write through it); "
                    f"remove it, or pass --out NEW{removable}.")


def _run_record(plan, datasets):
    """What `run.json` records of the run: a folder resumes only a run with
    the same record."""
    info, val_info = datasets.info, datasets.val_info
    return {
        "model": _model_identity(plan.model),
        "weights": None if plan.weights is None else str(plan.weights),
        "data": _data_identity(plan.data), "train_split": plan.train_split,
        "validation_split": val_info.split, "class_names": list(info.class_names),
        "images": {"train": info.num_examples, "validation": val_info.num_examples},
        "image_size": plan.image_size, "batch_size": plan.batch_size, "epochs": plan.epochs,
        "steps_per_epoch": plan.steps_per_epoch, "updates": plan.updates,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "recipe": dataclasses.asdict(plan.recipe), "learning_rate": plan.learning_rate,
        "sam_rho": plan.sam_rho, "precision": plan.precision, "seed": plan.seed,
        "preset": plan.preset if isinstance(plan.preset, str) else repr(plan.preset),
        "label_smoothing": plan.label_smoothing, "dropout_rate": plan.dropout_rate,
        "drop_path_rate": plan.drop_path_rate, "model_kwargs": plan.model_kwargs,
        "holdout": plan.holdout,
        # Only when set: a folder of a run from before these options resumes.
        **{key: value for key, value in (
            ("lora_rank", plan.lora_rank),
            ("lora_targets", list(plan.lora_targets) if plan.lora_targets else None),
            ("layer_decay", plan.layer_decay), ("ema", plan.ema)) if value is not None},
    }


def _compiled_model(plan, info, element_spec):
    """`(model, what fit trains, optimizer)`: the model built (or loaded)
    for the data's classes and compiled by the recipe; TensorFlow: under
    the strategy, with its optimizer, and built for batches of
    `element_spec` (the training dataset's), so that `fit` traces its step
    once, not twice."""
    with (plan.strategy.scope() if plan.strategy is not None
          else contextlib.nullcontext()):
        net = _build_model(plan.model, plan.weights, info.num_classes, plan.image_size,
                           plan.recipe, plan.dropout_rate, plan.drop_path_rate,
                           plan.model_kwargs)
        distribution_lib.check_model_split(net, plan.distribution)
        _check_classes(net, info, plan.data, names_must_match=False)
        if plan.lora_rank:
            lora.enable_lora(net, plan.lora_rank, plan.lora_targets, seed=plan.seed)
        scales = (layer_decay_scales(net, plan.layer_decay) if plan.layer_decay is not None
                  else None)
        trainable = SAMModel(net, rho=plan.sam_rho) if plan.sam_rho else net
        smoothing = _label_smoothing(plan)
        optimizer = make_optimizer(plan.recipe, plan.updates, plan.learning_rate,
                                   plan.gradient_accumulation_steps,
                                   learning_rate_scales=scales, ema=plan.ema)
        trainable.compile(
            optimizer=optimizer,
            loss=keras.losses.CategoricalCrossentropy(
                from_logits=_outputs(net) == "logits", label_smoothing=smoothing),
            # Padded validation batches (JAX) carry sample weights: accuracy
            # weighted, so that the padding counts for nothing.
            **({"weighted_metrics": ["accuracy"]} if plan.distribution is not None
               else {"metrics": ["accuracy"]}),
            jit_compile=plan.jit_compile)
        if keras.backend.backend() == "tensorflow":
            _compat.build_before_fit(trainable, element_spec)
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


def _label_smoothing(plan):
    """The label smoothing the training loss uses: the argument, else the recipe's."""
    return (plan.recipe.label_smoothing if plan.label_smoothing is None
            else plan.label_smoothing)


def val_loss_is(smoothing, split="validation"):
    """What the results' `val_loss` is, in words (`evaluate`'s `cross_entropy`
    has no label smoothing, so the two differ when `smoothing` > 0)."""
    what = (f"with label smoothing {smoothing:g}" if smoothing
            else "without label smoothing")
    return f"the training loss on the {split} images: cross-entropy {what}"


def _summary(plan, net, datasets, strategy_row, distribution_row, folder, memory):
    """What `train` prints before the first step (`format_summary`) and
    returns as `results["summary"]`."""
    recipe, info = plan.recipe, datasets.info
    return {
        "model": plan.model if isinstance(plan.model, str) else net.name,
        **lora.parameter_counts(net),
        "lora": ({"rank": plan.lora_rank, "targets": list(plan.lora_targets or ())
                  or "default"} if plan.lora_rank else None),
        "layer_decay": plan.layer_decay, "ema": plan.ema,
        "weights": (str(plan.weights) if plan.weights is not None else
                    "random initialisation" if plan.named else "those of the model given"),
        "image_size": plan.image_size, "classes": info.num_classes,
        "class_names": list(info.class_names),
        "data": {"train": _split_row(info), "validation": _split_row(datasets.val_info)},
        "preset": plan.preset if isinstance(plan.preset, str) else plan.preset.name,
        "preset_reason": plan.preset_reason, "batch_size": plan.batch_size,
        "batch_reason": plan.batch_reason,
        "gradient_accumulation_steps": plan.gradient_accumulation_steps,
        "epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch,
        "recipe": recipe.name, "optimizer": recipe.optimizer,
        "learning_rate": (plan.learning_rate if plan.learning_rate is not None
                          else recipe.learning_rate),
        "warmup_steps": recipe.warmup_for(plan.updates), "decay": recipe.decay,
        "sam_rho": plan.sam_rho, "precision": plan.precision,
        "jit_compile": plan.jit_compile, "step": _step_kind(plan.jit_compile),
        "strategy": strategy_row,
        "distribution": distribution_row, "out": plan.out, "run": folder.describe(),
        "resumed_epoch": folder.resumed_epoch, "run_started": folder.started,
        "memory": memory,
    }


def _fit_and_save(plan, datasets, folder):
    """Builds, fits and saves, in the locked run folder `folder`."""
    info, val_info, out = datasets.info, datasets.val_info, plan.out
    net, trainable, optimizer = _compiled_model(plan, info, datasets.train.element_spec)
    names_inside = labels_lib.set_class_names(net, info.class_names)
    if plan.strategy is not None:
        prepare_model(trainable, plan.strategy)
        strategy_row = _strategy_row(plan.strategy)
    else:
        strategy_row = _distribution_row(plan.distribution)
    distribution_row = (describe_strategy(plan.strategy) if plan.strategy is not None
                        else distribution_lib.describe(plan.distribution))
    _check_free_space(out, net, plan.recipe)
    memory = _check_memory(plan, net)
    summary = _summary(plan, net, datasets, strategy_row, distribution_row, folder, memory)
    if plan.verbose:
        logger.info("training %s on %s\n%s", summary["model"], plan.data,
                    format_summary(summary))
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
            val_loss, val_accuracy = trainable.evaluate(datasets.validation, verbose=0)
    except Exception as error:  # a corrupt file: one sentence naming it
        _raise_disk_full(error, out)
        _raise_data_error(error)
        raise
    final = os.path.join(out, "model.keras")
    if nan_guard.stopped_at is not None:
        folder.finish("diverged", diverged_at=list(nan_guard.stopped_at))
        _raise_diverged(nan_guard.stopped_at, final, best, history=history, start=plan.start,
                        epochs=plan.epochs, steps_per_epoch=plan.steps_per_epoch, out=out)
    if history.epoch and moved.changed is False:
        raise ValueError(_unmoved_message(optimizer, plan.updates, trainable))
    labels_path = os.path.join(out, "labels.txt")
    try:
        save_atomically(lora.merge_lora(net), final)  # LoRA: plain kernels, no optimizer state
        _atomic.write_text(labels_path, "".join(f"{name}\n" for name in info.class_names))
    except OSError as error:
        _raise_disk_full(error, out)
        raise
    if not names_inside:
        logger.warning("%s's last layer is not a keras_vit ClassifierHead, so the class "
                       "names are not inside %s; they are in %s.", net.name, final,
                       labels_path)
    results = {
        "status": "completed",
        "val_accuracy": float(val_accuracy), "val_loss": float(val_loss),
        "val_loss_is": val_loss_is(_label_smoothing(plan)),
        "seconds": round(time.perf_counter() - plan.start, 1),
        "epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch,
        "epochs_run_now": len(history.epoch), "first_epoch_run_now":  # counted from 1
            history.epoch[0] + 1 if history.epoch else None,
        "resumed": bool(folder.resumed_epoch), "run_record": os.path.join(out, "run.json"),
        "model": final, "outputs": _outputs(net), "best_model": best.path, "best": best.best,
        "log": os.path.join(out, "log.csv"), "labels": labels_path,
        "recipe": plan.recipe.name, "sam_rho": plan.sam_rho,
        "precision": plan.precision, "replicas": distribution_row["devices"],
        "distribution": distribution_row,
        "classes": info.num_classes, "class_names": list(info.class_names),
        "parameters": summary["parameters"],
        "trainable_parameters": summary["trainable_parameters"],
        "lora": summary["lora"], "layer_decay": plan.layer_decay,
        "ema": ({"decay": plan.ema, "weights_saved": "ema"} if plan.ema is not None
                else None),
        "data": {k: {f: v[f] for f in ("split", "images", "classes")}
                 for k, v in summary["data"].items()},
        "preset": summary["preset"], "image_size": plan.image_size,
        "skipped_corrupt": ({"train": info.skipped_corrupt,
                             "validation": val_info.skipped_corrupt}
                            if plan.skip_corrupt else None),
        "summary": summary,
    }
    if plan.skip_corrupt and (info.skipped_corrupt or val_info.skipped_corrupt):
        logger.warning("Skipped corrupt, unreadable or too large image files: %d in "
                       "training, %d in validation (distinct files).",
                       info.skipped_corrupt, val_info.skipped_corrupt)
    folder.finish("completed", val_accuracy=results["val_accuracy"], best=best.best)
    return results


# Copies of the weights a run writes to its folder: the backup (weights and
# the optimizer's slots), best.keras and model.keras.
_SLOTS = {"sgd": 1, "adamw": 2}
# At its fullest a run's folder holds the backup, best.keras and the copy of
# a better epoch that `save_atomically` writes beside it before the rename
# (model.keras comes after Keras deleted the backup): `needed`. A resumed
# run finds two of those on disk already, and their space is room: the
# backup's weights file (Keras' BackupAndRestore rewrites it in place) and
# best.keras (the rename replaces it). Not a model.keras: it stays while the
# run trains. (A file name Keras changes subtracts nothing: the check then
# counts as for a new run.)
_REWRITTEN = (("backup", "latest.weights.h5"), ("best.keras",))


def _check_memory(plan, net):
    """`{"estimated", "available"}` bytes of the training step on this
    host, or None where it is not counted (an accelerator, a subclassed
    model); a ValueError before the first step when the step cannot fit
    in the host's memory (`keras_vit.training.memory`)."""
    if not plan.check_memory:
        return None
    share = memory_lib.host_share(plan.strategy)
    available = memory_lib.available_memory()
    estimate = memory_lib.check_host_memory(
        net, max(1, round(plan.batch_size * share)), image_size=plan.image_size,
        name=(os.path.basename(os.fspath(plan.model))
              if isinstance(plan.model, (str, os.PathLike)) else net.name),
        optimizer_slots=_SLOTS.get(plan.recipe.optimizer, 2),
        weight_copies=(bool(plan.gradient_accumulation_steps) + (plan.ema is not None)
                       + bool(plan.sam_rho)),
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        can_remat=(plan.named and not (plan.model_kwargs or {}).get("remat")
                   and memory_lib.remat_saves_memory()),
        available=available)
    if estimate is None or available is None:
        return None
    return {"estimated": estimate.total, "available": available}


def _check_free_space(out, model, recipe):
    """A ValueError before the first step when `out` cannot hold what the
    run writes there (a full disk mid-run ended in an h5py error and a
    segmentation fault). A resumed run's backup and best.keras, written
    again in their own space, count as room."""
    weights = sum(int(math.prod(v.shape)) * memory_lib.itemsize(v.dtype)
                  for v in model.weights)
    needed = weights * (3 + _SLOTS.get(recipe.optimizer, 2)) + (1 << 20)  # + logs
    reused = min(_rewritten_bytes(out), needed)
    free = shutil.disk_usage(out).free
    if free < needed - reused:
        over = (f", {reused / 1e6:,.1f} MB of it over the files of the run it resumes"
                if reused else "")
        raise ValueError(
            f"{out} has {free / 1e6:,.1f} MB free, but this run writes about "
            f"{needed / 1e6:,.1f} MB there (the backup with the optimizer's state, best.keras "
            f"and model.keras of {model.count_params():,} parameters{over}); free some space "
            "or pass --out on another disk.")


def _rewritten_bytes(out):
    """Bytes on `out`'s disk held by the files `_REWRITTEN` names: each a
    regular file there with no other link (whose space the rewrite frees),
    counted by its size or its allocated blocks, whichever is smaller."""
    device = os.stat(out).st_dev
    total = 0
    for parts in _REWRITTEN:
        try:
            status = os.lstat(os.path.join(out, *parts))
        except OSError:
            continue
        if (stat.S_ISREG(status.st_mode) and status.st_nlink == 1
                and status.st_dev == device):
            blocks = getattr(status, "st_blocks", None)
            total += status.st_size if blocks is None else min(status.st_size, blocks * 512)
    return total


class WeightsMoved(keras.callbacks.Callback):
    """Whether `fit` changed any trainable weight: `changed` is True or
    False after training (None before). Compares a SHA-256 of each
    trainable variable's bytes at the start of training (after
    `BackupAndRestore` restored them: place it after that callback) and
    at the end, so nothing is copied."""

    def __init__(self):
        super().__init__()
        self.changed = None
        self._before = None

    def _digests(self):
        with host_values(self.model):
            return [hashlib.sha256(np.ascontiguousarray(
                keras.ops.convert_to_numpy(v.value)).tobytes()).digest()
                for v in self.model.trainable_variables]

    def on_train_begin(self, logs=None):
        self._before = self._digests()

    def on_train_end(self, logs=None):
        self.changed = self._digests() != self._before


def _unmoved_message(optimizer, updates, model):
    """Why a run changed no weight, in one sentence."""
    if not model.trainable_variables:
        return ("Training changed no weight: the model has no trainable weights (every "
                "layer is frozen); model.keras was not written.")
    schedule = optimizer.learning_rate_schedule if hasattr(
        optimizer, "learning_rate_schedule") else None
    schedule = _compat.optimizer_learning_rate(optimizer) if schedule is None else schedule
    try:  # the schedule at (up to 1,000 of) the run's updates
        every = getattr(schedule, "steps_per_update", 1)
        steps = np.unique(np.linspace(0, updates - 1, min(updates, 1000)).astype("int64"))
        peak = float(np.max(keras.ops.convert_to_numpy(schedule(steps * every))))
    except Exception:  # noqa: BLE001  (another schedule: its current value)
        peak = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
    if peak == 0:
        why = f"the learning rate was 0 at every update ({plural(updates, 'update')})"
    else:
        why = (f"{plural(updates, 'optimizer update')} at a peak learning rate of {peak:g} "
               f"{'was' if updates == 1 else 'were'} too small to change any float32 weight")
    return (f"Training changed no weight: {why}; model.keras was not written. Give a "
            "larger --learning-rate, or more steps or epochs.")


class TrainingDivergedError(RuntimeError):
    """`train` stopped on a NaN/inf loss. `results` is the run's results
    dict (`"status": "diverged"`, metrics None, `"model": None`); the
    weights were not saved as `model.keras`; `best.keras`, when written,
    holds the best epoch before the divergence."""

    def __init__(self, message, results):
        super().__init__(message)
        self.results = results


def _raise_diverged(stopped_at, final, best, *, history, start, epochs, steps_per_epoch, out):
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
        "log": os.path.join(out, "log.csv"),
    }
    raise TrainingDivergedError(message, results)


def _shardable_validation(dataset, info, batch_size, distribution):
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


def _process_task():
    """`(is_chief, process id)` of a JAX multi-process job (0 is the chief)."""
    if keras.backend.backend() != "jax":
        return True, 0
    import jax  # the JAX backend only

    return jax.process_index() == 0, jax.process_index()


def _raise_disk_full(error, out):
    """Re-raises a full disk (`ENOSPC`, also as h5py's or TensorFlow's
    text) met while the run wrote to `out` as one ValueError naming it."""
    seen, met = error, set()
    while seen is not None and id(seen) not in met:
        met.add(id(seen))
        if ((isinstance(seen, OSError) and seen.errno == errno.ENOSPC)
                or "No space left on device" in str(seen)):
            raise ValueError(
                f"The disk of {out} filled up while the run wrote its files there "
                f"([Errno {errno.ENOSPC}] No space left on device); free some space there and "
                "run the same command again (it resumes from the last finished epoch), or "
                "pass --out on another disk to start afresh.") from None
        seen = seen.__cause__ or seen.__context__


def _raise_data_error(error):
    """Re-raises a TF pipeline error about the data as one ValueError."""
    converted = data_error(error)
    if converted is not None:
        raise converted from None


def _targets(targets):
    """`lora_targets` as a tuple of names (None: the default targets)."""
    if targets is None:
        return None
    return (targets,) if isinstance(targets, str) else tuple(targets)


def _check_fine_tuning(lora_rank, lora_targets, layer_decay, ema):
    """The fine-tuning options' values, before any work (`enable_lora` and
    `layer_decay_scales` check them against the model later)."""
    if lora_targets is not None and not (
            isinstance(lora_targets, str) or (isinstance(lora_targets, Sequence) and all(
                isinstance(t, str) for t in lora_targets))):
        raise TypeError(f"`lora_targets` (--lora-targets) must be a layer name or a sequence "
                        f"of them (e.g. ('qkv', 'mlp')), got {lora_targets!r}.")
    if lora_targets is not None and lora_rank is None:
        raise ValueError(f"lora_targets={lora_targets!r} (--lora-targets) needs lora_rank "
                         "(--lora RANK).")
    if layer_decay is not None and (isinstance(layer_decay, bool)
                                    or not isinstance(layer_decay, (int, float))
                                    or not 0 < layer_decay <= 1):
        raise ValueError(f"layer_decay={layer_decay!r} (--layer-decay); allowed: a number "
                         "in (0, 1], e.g. 0.65 for ViT-B or 0.75 for ViT-L (BEiT, MAE).")
    if ema is not None and (isinstance(ema, bool) or not isinstance(ema, (int, float))
                            or not 0 < ema < 1):
        raise ValueError(f"ema={ema!r} (--ema); allowed: a decay in (0, 1), e.g. 0.9998 "
                         "(timm's --model-ema-decay); 1 would keep the first weights.")


def _check_classes(model, info, data, names_must_match=True):
    """The model's outputs and stored class names against the data's: a
    ValueError, or with `names_must_match=False` a warning for other names
    (training a trained model on new data renames its classes)."""
    outputs = model.output_shape[-1]
    if outputs != info.num_classes:
        raise ValueError(
            f"The model outputs {outputs} classes but {data} ({info.split}) has "
            f"{info.num_classes}: {', '.join(map(str, info.class_names[:10]))}"
            f"{', ...' if info.num_classes > 10 else ''}.")
    names = class_names(model)
    if names is not None and list(names) != list(info.class_names):
        different = [(i, a, b) for i, (a, b)
                     in enumerate(zip(names, info.class_names, strict=True)) if a != b]
        i, a, b = different[0]
        message = (f"The model's class names differ from those of {data} ({info.split}): "
                   f"class {i} is {a!r} in the model and {b!r} in the data "
                   f"({len(different)} of {outputs} differ)")
        if names_must_match:
            raise ValueError(message + "; its predictions would be scored against other "
                             "classes.")
        logger.warning("%s; training gives the model the data's class names.", message)


# What `evaluate`'s `cross_entropy` is (train's `val_loss` is the training loss).
CROSS_ENTROPY_IS = ("mean cross-entropy of the model's predictions and the true labels, "
                    "without label smoothing (train's val_loss adds the recipe's label "
                    "smoothing)")


def evaluate(model_path, data, split=None, image_size=None, batch_size=64,
             data_dir=None, skip_corrupt=False, holdout=0.1):
    """Accuracy and cross-entropy of a saved model on a data source's split.

    `split=None`: `validation` when the data has it, else `test` (a folder
    of class subfolders: its deterministic holdout). The model's class count
    (and its stored class names) must match the data's; otherwise a
    ValueError says both.

    Example:

    >>> keras_vit.training.evaluate("runs/x/model.keras", "folder:data")  # doctest: +SKIP
    {'accuracy': 0.98, 'cross_entropy': 0.07, 'cross_entropy_is': 'mean cross-entropy ...', ...}
    """
    model = load_keras_model(model_path)
    height, width = input_size(model, image_size)  # predict's check
    if height != width:
        raise ValueError(f"{str(model_path)!r} takes {height}x{width} images, but evaluate "
                         "feeds square images; give a model with a square or dynamic input "
                         "size.")
    common = dict(image_size=height, batch_size=batch_size, data_dir=data_dir,
                  skip_corrupt=skip_corrupt, holdout=holdout)
    split, dataset, info = _pick_val_split(
        data, split, None, lambda s: _open_data(data, s, **common))
    _check_classes(model, info, data)
    try:
        from_logits = output_kind(model) == "logits"
    except ValueError:
        from_logits = False
    model.compile(loss=keras.losses.CategoricalCrossentropy(from_logits=from_logits),
                  metrics=["accuracy"])
    try:
        loss, accuracy = model.evaluate(dataset, verbose=0)
    except Exception as error:
        _raise_data_error(error)
        raise
    # NaN or inf outputs make the loss NaN or inf (and an accuracy of argmax ties).
    check_finite_outputs(np.array([loss], "float64"), f"{data} (split {split!r})",
                         "accuracy")
    return {"accuracy": float(accuracy), "cross_entropy": float(loss),
            "cross_entropy_is": CROSS_ENTROPY_IS, "model": str(model_path),
            "data": data, "split": split, "images": info.num_examples,
            "classes": info.num_classes,
            "skipped_corrupt": info.skipped_corrupt if skip_corrupt else None}

