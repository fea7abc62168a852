"""`sample_images`: a small, seeded, class-stratified sample of one split
of a data source, decoded as the eval pipeline decodes (for calibrating and
verifying exports, or a quick look at a data set).

>>> import os, shutil, tempfile
>>> import numpy as np, tensorflow as tf
>>> from keras_vit.data.sample import sample_images
>>> folder = tempfile.mkdtemp()  # two classes of three 8x8 PNGs
>>> for name in ("cat", "dog"):
...     for i in range(3):
...         png = tf.io.encode_png(np.full((8, 8, 3), 40 * i, "uint8"))
...         tf.io.write_file(os.path.join(folder, name, f"{i}.png"), png)
>>> sample = sample_images(f"folder:{folder}", "train", image_size=4, count=4,
...                        holdout=0, seed=0)
>>> sample.images.shape, sample.classes
((4, 4, 4, 3), 2)
>>> shutil.rmtree(folder)
"""

import dataclasses

import numpy as np
import tensorflow as tf

from keras_vit import _checks
from keras_vit._console import _op_error_message
from keras_vit.data import augment
from keras_vit.data.graph import as_written
from keras_vit.data.pipeline import oversized, too_large_error
from keras_vit.data.sources import open_source

# Sources whose labels are not listed up front (TFRecords, TFDS) are scanned
# record by record for their labels; the scan stops after this many records.
MAX_SCAN = 50_000


@dataclasses.dataclass
class Sample:
    """Images of one split of a source, in a stratified order.

    `images`: float32 `(N, H, W, 3)` pixels in [0, 255]; `labels`: int
    `(N,)`; `class_names`: the source's class names (list, may be empty);
    `split` and `source` name where the images come from; `classes`: the
    number of distinct labels in the sample; `indices`: the position of each
    image in the split's record order; `names`: file names / record ids."""

    images: np.ndarray
    labels: np.ndarray
    class_names: list
    split: str
    source: str
    classes: int
    indices: np.ndarray = None
    names: list = None
    skipped_corrupt: list = dataclasses.field(default_factory=list)

    def __len__(self):
        return len(self.images)

    def describe(self):
        """`{"split", "images", "classes", "source"}` (what export reports say),
        with `"skipped_corrupt"` (a count) when files were skipped."""
        row = {"split": self.split, "images": len(self), "classes": self.classes,
               "source": self.source}
        if self.skipped_corrupt:
            row["skipped_corrupt"] = len(self.skipped_corrupt)
        return row


def stratified_order(labels, count=None, seed=0, exclude=None):
    """Positions into `labels`, `count` of them (all when None): the classes
    are visited round-robin in a seeded order, each class's positions in a
    seeded shuffle, so every class is present once `count` >= the number of
    classes and any prefix of the result is stratified too. `exclude`:
    positions never chosen."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    keep = np.ones(len(labels), bool)
    if exclude is not None and len(exclude):
        keep[np.asarray(exclude, int)] = False
    classes = np.unique(labels[keep])
    pools = [rng.permutation(np.flatnonzero(keep & (labels == c))) for c in classes]
    pools = [pools[i] for i in rng.permutation(len(pools))]
    total = int(keep.sum()) if count is None else min(int(count), int(keep.sum()))
    order, depth = [], 0
    while len(order) < total:
        for pool in pools:
            if depth < len(pool):
                order.append(int(pool[depth]))
                if len(order) == total:
                    break
        depth += 1
    return np.asarray(order, dtype="int64")


def _record_labels(src, limit):
    """int labels of the first `limit` records (read, not decoded)."""
    labels = src.records.take(limit).map(
        as_written(lambda *record: src.read(*record)[1]), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return np.fromiter((int(x) for x in labels.as_numpy_iterator()), dtype="int64")


def _decode_failure(encoded):
    """TensorFlow's own sentence for why `encoded` does not decode (eager,
    so without a graph's node names), or None."""
    try:
        tf.io.decode_image(encoded, channels=3, expand_animations=False)
    except tf.errors.OpError as error:
        return _op_error_message(error).rstrip(". ") or None
    return None


def sample_images(source, split, *, image_size, count, seed=0, data_dir=None, holdout=0.1,
                  exclude=None, skip_corrupt=False):
    """A seeded, class-stratified sample of `count` images of `source`'s `split`.

    The classes are visited round-robin in a seeded order (each class's
    images in a seeded shuffle), so every class is present when `count` is
    at least the number of classes, and the same seed gives the same images.
    Only the chosen images are decoded, with the eval preprocessing of
    `make_dataset`. TFRecord and TFDS sources are scanned (undecoded) for
    their labels over their first `MAX_SCAN` (50,000) records.

    Args:
        source: a `keras_vit.data` source string (`"folder:DIR"`,
            `"tfrecord:..."`, `"tfds:NAME"`).
        split: the split (`"train"`, `"test"`, `"validation"`; a folder of
            class subfolders alone has a stratified `holdout` for
            validation / test).
        image_size: int or `(height, width)`.
        count: how many images; None: the whole split (up to the scan cap
            for streamed sources).
        seed: the sampling seed.
        data_dir: TFDS data directory.
        holdout: the held-out fraction of a folder without split subfolders.
        exclude: record positions (`Sample.indices` of another sample of the
            same split) never to choose.
        skip_corrupt: a chosen file that does not decode is left out (the
            sample is smaller; `Sample.skipped_corrupt` names them, and the
            split's files that cannot be read at all, such as a dangling
            symbolic link) instead of a ValueError naming it.

    Returns:
        `Sample`.

    Example:

    >>> s = sample_images(  # downloads cifar10  # doctest: +SKIP
    ...     "tfds:cifar10", "test", image_size=224, count=100)
    >>> s.classes, s.images.dtype  # doctest: +SKIP
    (10, dtype('float32'))
    """
    if not isinstance(source, str):
        raise TypeError(f"source must be a data source string such as 'folder:DIR'; "
                        f"got {type(source).__name__}.")
    _checks.positive_int(count, "count", "None: the whole split", or_none=True)
    size = _checks.positive_int_pair(image_size, "image_size")
    src = open_source(source, split, data_dir=data_dir, holdout=holdout,
                      skip_corrupt=skip_corrupt)
    labels = getattr(src, "labels", None)
    if labels is not None:
        labels = np.asarray(labels, dtype="int64")
        scanned = len(labels)
    else:
        labels = _record_labels(src, MAX_SCAN)
        scanned = len(labels)
    if scanned == 0:
        raise ValueError(f"{src.description} holds no images.")
    order = stratified_order(labels, count, seed, exclude)
    if len(order) == 0:
        raise ValueError(f"{src.description} has no images left to sample "
                         f"({0 if exclude is None else len(exclude)} excluded).")

    chosen = tf.constant(np.sort(order))

    def pick(position, record):
        return tf.reduce_any(tf.equal(position, chosen))

    def read(position, record):  # undecoded: a file that fails is named below
        record = record if isinstance(record, tuple) else (record,)
        encoded, label, name = src.read(*record)
        return position, encoded, label, name

    @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
    def decode(encoded):  # (as written: `graph.as_written`)
        return tf.ensure_shape(augment.resize(augment.decode_image(encoded), size),
                               size + (3,))

    dataset = (src.records.take(scanned).enumerate().filter(as_written(pick))
               .map(as_written(read), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))
    found, skipped = {}, list(getattr(src, "skipped", []))  # unreadable, left out at listing
    for position, encoded, label, name in dataset.as_numpy_iterator():
        name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        large = oversized(encoded)
        if large:  # never decoded
            if skip_corrupt:
                skipped.append(name)
                continue
            raise too_large_error(name, *large, "pass skip_corrupt=True (keras-vit: "
                                  "--skip-corrupt) to leave such files out of the sample")
        try:
            image = decode(encoded).numpy()
        except tf.errors.InvalidArgumentError:
            if skip_corrupt:
                skipped.append(name)
                continue
            reason = _decode_failure(encoded) or "it does not decode"
            raise ValueError(
                f"Corrupt or non-image file {name!r} in {src.description} ({reason}); "
                "pass skip_corrupt=True (keras-vit: --skip-corrupt) to leave such files "
                "out of the sample.") from None
        found[int(position)] = (image, int(label), name)
    if skipped:
        order = np.asarray([p for p in order if int(p) in found], dtype="int64")
        if len(order) == 0:
            raise ValueError(f"None of the {len(skipped)} images sampled from "
                             f"{src.description} decode.")
    missing = [int(p) for p in order if int(p) not in found]
    assert not missing, f"records {missing[:5]} vanished between two reads"
    images = np.stack([found[int(p)][0] for p in order]).astype("float32")
    sample_labels = np.asarray([found[int(p)][1] for p in order], dtype="int64")
    return Sample(images=images, labels=sample_labels, class_names=list(src.class_names or []),
                  split=split, source=source, classes=int(len(np.unique(sample_labels))),
                  indices=order, names=[found[int(p)][2] for p in order],
                  skipped_corrupt=skipped)
