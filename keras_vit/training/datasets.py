"""The pipelines of a run (`train`) or of an evaluation (`evaluate`): every
split read through `open_split`, with its `make_dataset` arguments by name;
the validation split picked when none is named; the run's global batch."""

import dataclasses
import logging

from keras_vit.data import data_error, make_dataset
from keras_vit.training import engine

logger = logging.getLogger("keras_vit")


@dataclasses.dataclass(frozen=True)
class Datasets:
    """The pipelines of a run and what `make_dataset` says of them."""

    train: object               # tf.data.Dataset, repeated
    validation: object
    info: object                # DatasetInfo of the training split
    val_info: object
    # (skip_batches) -> the training pipeline from that batch on (a resume)
    train_from: object = None


@dataclasses.dataclass(frozen=True)
class Reading:
    """How every split of a run (or an evaluation) is read."""

    image_size: int
    batch_size: int             # global
    data_dir: object = None
    cache: object = False
    skip_corrupt: bool = False
    holdout: float = 0.1


def open_split(data, split, reading, *, training=False, preset=None, seed=None, repeat=False,
               skip_batches=0):
    """`make_dataset(..., with_info=True)` of `split` read as `reading`
    says (the training stream: `training`, `preset`, `seed`, `repeat`,
    `skip_batches`); a missing split says which exist."""
    return make_dataset(
        data, split, image_size=reading.image_size, batch_size=reading.batch_size,
        training=training, preset=preset, seed=seed, cache=reading.cache, repeat=repeat,
        data_dir=reading.data_dir, skip_corrupt=reading.skip_corrupt, with_info=True,
        holdout=reading.holdout, skip_batches=skip_batches)


def pick_val_split(val_split, train_split, opener):
    """`val_split` as given, else `validation` when the data has it, else
    `test`. Returns `(split, dataset, info)`."""
    if val_split is not None:
        if val_split == train_split:
            logger.warning(
                "Validating on the training split %r: the validation accuracy measures "
                "memorisation, not generalisation. Name another split (--val-split) or "
                "leave it out (a folder of class subfolders then holds out 10%%).",
                val_split)
        return (val_split, *opener(val_split))
    try:
        return ("validation", *opener("validation"))
    except ValueError as first:
        try:
            return ("test", *opener("test"))
        except ValueError:
            raise first from None


def _clip_batch_size(batch_size, info, distribution):
    """`batch_size`, or the training split's image count when the batch is
    larger than the split (a multiple of the data-parallel replicas under a
    JAX distribution), with a warning."""
    count = info.num_examples
    if not count or batch_size <= count:
        return batch_size
    replicas = engine.replicas(distribution)
    clipped = max(replicas, count - count % replicas)
    logger.warning("batch_size=%d is larger than the %d images of the training split %r; "
                   "using batches of %d (every image once per step).", batch_size, count,
                   info.split, clipped)
    return clipped


def open_datasets(data, train_split, val_split, distribution, reading, *, preset, seed,
                  recipe=None):
    """`(Datasets, global batch size, why that batch)`: the training
    pipeline (shuffled, augmented by `preset`, repeated) and the validation
    one. With `recipe` (no batch size given) the batch is the recipe's for
    the split's size (`Recipe.batch_for`). A batch larger than the training
    split is clipped to it (the training pipeline is then opened again
    with that batch); under a JAX distribution each validation batch is
    padded so that it splits over the replicas."""
    def open_train(reading, skip_batches=0):
        return open_split(data, train_split, reading, training=True, preset=preset,
                          seed=seed, repeat=True, skip_batches=skip_batches)

    train_ds, info = open_train(reading)
    reason = "given"
    if recipe is not None:
        batch, reason = recipe.batch_for(info.num_examples, engine.replicas(distribution))
        reading = dataclasses.replace(reading, batch_size=batch)
    batch_size = _clip_batch_size(reading.batch_size, info, distribution)
    if batch_size != reading.batch_size:
        reading = dataclasses.replace(reading, batch_size=batch_size)
        reason = f"clipped to the training split ({reason})"
    if info.global_batch_size != batch_size:
        train_ds, info = open_train(reading)
    _, val_ds, val_info = pick_val_split(
        val_split, train_split, lambda split: open_split(data, split, reading))
    if distribution is not None:
        val_ds = engine.shardable_validation(val_ds, val_info, batch_size, distribution)
    return (Datasets(train_ds, val_ds, info, val_info,
                     lambda skip: open_train(reading, skip)[0]),
            batch_size, reason)


def raise_data_error(error):
    """Re-raises a TF pipeline error about the data as one ValueError."""
    converted = data_error(error)
    if converted is not None:
        raise converted from None
