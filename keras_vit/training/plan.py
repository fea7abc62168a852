"""The run plan: what one `train` call does, decided once before the first
step, and the three things written from it: `run.json`'s record
(`TrainPlan.record`), the summary printed before the first step
(`summary`, `format_summary`) and the results (`results`).

Adding a training option: a field made with `option()` at the end of
`TrainPlan` (it is then recorded in `run.json` when set, and shown in the
summary and the results), `train`'s argument, and the CLI flag.
"""

import dataclasses
import hashlib
import math
import os
import time

import keras

from keras_vit import _checks
from keras_vit._console import plural
from keras_vit.layers import lora
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.training.recipes import Recipe


def _recorded(convert=None, *, when_set=False):
    """A field written to `run.json` (converted by `convert`); with
    `when_set` only when not None, so that a folder of a run from before
    the field existed resumes."""
    return dataclasses.field(metadata={"record": convert or (lambda value: value),
                                       "when_set": when_set})


def _not_recorded():
    """A field of how the run goes, not of what it computes: not in `run.json`."""
    return dataclasses.field(metadata={"record": None})


def option(default=None):
    """A training option added after these: recorded in `run.json` when
    set, and shown in the summary (a row of its own) and the results."""
    return dataclasses.field(default=default, metadata={
        "record": lambda value: value, "when_set": True, "option": True})


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


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """What one `train` call does, decided once before the first step from
    its arguments, the recipe, the backend and the training split: the run
    folder, the model, `fit` and the results read it, and nothing changes
    it (a worker's own folder is a copy with another `out`). A plan of no
    optimizer update (`updates` < 1) is a ValueError.

    The fields are in `run.json`'s order; `record()` writes them.

    >>> plan.batch_size, plan.steps_per_epoch, plan.updates  # a run's plan  # doctest: +SKIP
    (64, 50, 2000)
    """

    model: object = _recorded(_model_identity)  # a variant name, a `.keras` path or a Model
    weights: object = _recorded(lambda weights: None if weights is None else str(weights))
    data: object = _recorded(_data_identity)    # the `make_dataset` source
    train_split: str = _recorded()
    validation_split: str = _recorded()
    class_names: tuple = _recorded(list)        # the training split's
    images: dict = _recorded()                  # {"train": count, "validation": count}
    image_size: int = _recorded()
    batch_size: int = _recorded()               # global, clipped to the training split
    epochs: int = _recorded()
    steps_per_epoch: int = _recorded()
    updates: int = _recorded()                  # optimizer updates of the whole run
    gradient_accumulation_steps: int | None = _recorded()
    recipe: Recipe = _recorded(dataclasses.asdict)
    learning_rate: float | None = _recorded()   # None: the recipe's
    sam_rho: float | None = _recorded()
    precision: str = _recorded()
    seed: int | None = _recorded()
    # a preset name or a `keras_vit.data.Preset`
    preset: object = _recorded(lambda preset: preset if isinstance(preset, str) else repr(preset))
    label_smoothing: float | None = _recorded()
    dropout_rate: float | None = _recorded()
    drop_path_rate: float | None = _recorded()
    model_kwargs: dict | None = _recorded()
    holdout: float = _recorded()
    lora_rank: int | None = _recorded(when_set=True)
    lora_targets: tuple | None = _recorded(lambda targets: list(targets) if targets else None,
                                           when_set=True)
    layer_decay: float | None = _recorded(when_set=True)
    ema: float | None = _recorded(when_set=True)
    out: str = _not_recorded()
    strategy: object = _not_recorded()          # TensorFlow: a tf.distribute.Strategy; else None
    distribution: object = _not_recorded()      # JAX: a keras.distribution.Distribution or None
    jit_compile: object = _not_recorded()
    preset_reason: str = _not_recorded()
    check_memory: bool = _not_recorded()
    skip_corrupt: bool = _not_recorded()
    verbose: int = _not_recorded()
    overwrite: bool = _not_recorded()
    start: float = _not_recorded()              # time.perf_counter() when `train` was called
    batch_reason: str = dataclasses.field(      # why `batch_size` (the summary's batch row)
        default="given", metadata={"record": None})
    # New training options: `option()` fields here.

    def __post_init__(self):
        # image_size, batch_size, epochs and steps_per_epoch are not checked
        # again here: `train` checked its arguments before any work (and
        # make_dataset a recipe's sizes), and made the others from them.
        _checks.positive_int(self.updates, "updates")

    @property
    def named(self):
        """Whether `model` is a variant name (built here, with `weights`)."""
        return isinstance(self.model, str) and not self.model.endswith(".keras")

    @property
    def smoothing(self):
        """The label smoothing the training loss uses: the argument, else the recipe's."""
        return (self.recipe.label_smoothing if self.label_smoothing is None
                else self.label_smoothing)

    def record(self):
        """What `run.json` records of the run: a folder resumes only a run
        with the same record."""
        record = {}
        for field in dataclasses.fields(self):
            convert = field.metadata.get("record")
            if convert is None:
                continue
            value = convert(getattr(self, field.name))
            if value is not None or not field.metadata["when_set"]:
                record[field.name] = value
        return record

    def options(self):
        """`{name: value}` of the options made with `option()`."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                if field.metadata.get("option")}


def lora_targets(targets):
    """`lora_targets` as a tuple of names (None: the default targets)."""
    if targets is None:
        return None
    return (targets,) if isinstance(targets, str) else tuple(targets)


def schedule(info, batch_size, steps, epochs, steps_per_epoch, gradient_accumulation_steps):
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


def val_loss_is(smoothing, split="validation"):
    """What the results' `val_loss` is, in words (`evaluate`'s `cross_entropy`
    has no label smoothing, so the two differ when `smoothing` > 0)."""
    what = (f"with label smoothing {smoothing:g}" if smoothing
            else "without label smoothing")
    return f"the training loss on the {split} images: cross-entropy {what}"


def _split_row(info):
    present = getattr(info, "classes_present", None)
    return {"split": info.split, "images": info.num_examples,
            "classes": present if present is not None else info.num_classes,
            "description": getattr(info, "description", info.source)}


def _lora_row(plan, net):
    """The summary's `lora`: the rank, the target names (the default ones
    spelled out) and how many Dense layers have adapters; None without LoRA."""
    if not plan.lora_rank:
        return None
    targets = plan.lora_targets or tuple(dict.fromkeys(
        name for block in encoder_blocks(net)
        for name in lora.DEFAULT_TARGETS.get(type(block), ())))
    return {"rank": plan.lora_rank, "targets": list(targets),
            "default_targets": plan.lora_targets is None,
            "layers": len(lora.lora_layers(net))}


def summary(plan, net, datasets, engine_rows, folder, memory, step):
    """What `train` prints before the first step (`format_summary`) and
    returns as `results["summary"]`. `engine_rows`: the strategy and
    distribution rows (`engine.rows`), `step`: how the step runs."""
    recipe, info = plan.recipe, datasets.info
    strategy_row, distribution_row = engine_rows
    return {
        "model": plan.model if isinstance(plan.model, str) else net.name,
        **lora.parameter_counts(net),
        "lora": _lora_row(plan, net),
        "remat": any(getattr(block, "remat", False) for block in encoder_blocks(net)),
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
        "jit_compile": plan.jit_compile, "step": step,
        "strategy": strategy_row,
        "distribution": distribution_row, "out": plan.out, "run": folder.describe(),
        "resumed_epoch": folder.resumed_epoch, "run_started": folder.started,
        "memory": memory, **plan.options(),
    }


# The summary rows of the options made with `option()` (shown when set).
_OPTIONS = tuple(field.name for field in dataclasses.fields(TrainPlan)
                 if field.metadata.get("option"))


def format_summary(summary):
    """The lines `train` prints before the first step."""
    d = summary
    trainable = d.get("trainable_parameters", d["parameters"])
    rows = [
        ("model", f"{d['model']} ({d['parameters']:,} parameters"
                  + (f", {trainable:,} trainable" if trainable != d["parameters"] else "")
                  + ")"),
        *([("LoRA", f"rank {d['lora']['rank']} on {', '.join(d['lora']['targets'])}"
                    + (" (the default targets)" if d["lora"].get("default_targets") else "")
                    + f": {plural(d['lora']['layers'], 'Dense layer')} with adapters")]
          if d.get("lora") else []),
        *([("remat", "on: each block's activations recomputed in the backward pass")]
          if d.get("remat") else []),
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
        *[(name.replace("_", " "), str(d[name])) for name in _OPTIONS
          if d.get(name) is not None],
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


def results(plan, summary, datasets, folder, *, metrics, history, best, outputs,
            evaluation=None, pictures=None):
    """The results dict of a completed run (`train`'s return value):
    `metrics` is `(val_loss, val_accuracy)`, `best` the BestModelCheckpoint,
    `outputs` what model.keras outputs, `evaluation` its classification
    report on the validation split (`keras_vit.training.report`),
    `pictures` the PNG files drawn (`{"curves": path, ...}`)."""
    info, val_info, out = datasets.info, datasets.val_info, plan.out
    val_loss, val_accuracy = metrics
    distribution_row = summary["distribution"]
    return {
        "status": "completed",
        "val_accuracy": float(val_accuracy), "val_loss": float(val_loss),
        "val_loss_is": val_loss_is(plan.smoothing),
        "seconds": round(time.perf_counter() - plan.start, 1),
        "epochs": plan.epochs, "steps_per_epoch": plan.steps_per_epoch,
        "epochs_run_now": len(history.epoch), "first_epoch_run_now":  # counted from 1
            history.epoch[0] + 1 if history.epoch else None,
        "resumed": bool(folder.resumed_epoch), "run_record": os.path.join(out, "run.json"),
        "model": os.path.join(out, "model.keras"),
        "model_size_mb": round(os.path.getsize(os.path.join(out, "model.keras")) / 1e6, 3),
        "outputs": outputs,
        "best_model": best.path, "best": best.best,
        "log": os.path.join(out, "log.csv"), "labels": os.path.join(out, "labels.txt"),
        "pictures": pictures or {}, "evaluation": evaluation,
        "recipe": plan.recipe.name, "sam_rho": plan.sam_rho,
        "precision": plan.precision, "replicas": distribution_row["devices"],
        "distribution": distribution_row,
        "classes": info.num_classes, "class_names": list(info.class_names),
        "parameters": summary["parameters"],
        "trainable_parameters": summary["trainable_parameters"],
        "lora": summary["lora"], "remat": summary["remat"], "layer_decay": plan.layer_decay,
        "ema": ({"decay": plan.ema, "weights_saved": "ema"} if plan.ema is not None
                else None),
        "data": {k: {f: v[f] for f in ("split", "images", "classes")}
                 for k, v in summary["data"].items()},
        "preset": summary["preset"], "image_size": plan.image_size,
        "skipped_corrupt": ({"train": info.skipped_corrupt,
                             "validation": val_info.skipped_corrupt}
                            if plan.skip_corrupt else None),
        **plan.options(),
        "summary": summary,
    }
