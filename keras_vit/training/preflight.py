"""Pre-flight checks of a `train` call, each before the work it guards: its
arguments (before any work), the model's input size and class count, the
run folder's entries (before any write), the disk's free space and the
host's memory (before the first step). Each is a ValueError or TypeError
in one sentence naming the argument, the flag or the file."""

import logging
import math
import os
import shutil
import stat
from collections.abc import Sequence

import keras

from keras_vit import _checks
from keras_vit._saving import keras_input_shape
from keras_vit.labels import class_names
from keras_vit.training import memory as memory_lib
from keras_vit.training.run_folder import RUN_FILES
from keras_vit.variants import ALL_VARIANTS, unknown_model_message
from keras_vit.weights import registry

logger = logging.getLogger("keras_vit")


def check_numbers(*, image_size, batch_size, steps, epochs, steps_per_epoch,
                  gradient_accumulation_steps, learning_rate, sam_rho, lora_rank):
    """`train`'s counts (positive integers) and rates (positive numbers),
    or None, each checked before any work."""
    _checks.optional(_checks.positive_int, image_size=image_size, batch_size=batch_size,
                     steps=steps, epochs=epochs, steps_per_epoch=steps_per_epoch,
                     gradient_accumulation_steps=gradient_accumulation_steps)
    _checks.optional(_checks.positive_float, learning_rate=learning_rate, sam_rho=sam_rho)
    _checks.optional(_checks.positive_int, lora_rank=lora_rank)


def check_jit_compile(jit_compile):
    """`jit_compile`: `"auto"` or a boolean (as the boolean)."""
    if not (isinstance(jit_compile, str) and jit_compile == "auto"):
        jit_compile = _checks.boolean(jit_compile, "jit_compile", 'or "auto"')
    return jit_compile


def check_flag(value, name):
    """A boolean argument (TypeError naming it for anything else)."""
    return _checks.boolean(value, name)


def check_arguments(out, seed, label_smoothing, dropout_rate, drop_path_rate, skip_corrupt,
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


def check_model_name(model, weights=None):
    """A `model` given as a name is a named model or `"auto"` with
    `weights` (a ValueError with the closest names otherwise), checked
    before any work: a keras.Model and a `.keras` path pass (read later)."""
    if isinstance(model, keras.Model) or (isinstance(model, (str, os.PathLike))
                                          and str(model).endswith(".keras")):
        return
    if model == "auto":
        if weights is None:
            raise ValueError("model='auto' (--model auto) builds the model a checkpoint "
                             "describes; give the checkpoint as weights= (--weights).")
        return
    if not isinstance(model, str) or model not in ALL_VARIANTS:
        raise ValueError(unknown_model_message(
            model, "model (--model)", ", 'auto', a .keras file or a keras.Model"))


def check_model_kwargs(model, model_kwargs, **builder_options):
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


def check_fine_tuning(lora_rank, lora_targets, layer_decay, ema):
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


def weights_hint(model):
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
    if variant.hub:  # a Hub family's (DINOv2, ...)
        return f"weights (e.g. --weights hf://{variant.hub[0]}, a Hub folder or a file)"
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


def image_size_for(model, image_size):
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


def check_step_memory(plan, net):
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


def check_free_space(out, model, recipe):
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


def check_data_classes(model, info, data, names_must_match=True):
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
