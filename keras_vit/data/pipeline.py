"""`make_dataset`: one call from a source string to the `(images,
one_hot_labels)` batches `model.fit` wants."""

import dataclasses
import logging

import tensorflow as tf

from keras_vit import _checks
from keras_vit._framework_text import assert_data, decode_failure
from keras_vit.data import augment
from keras_vit.data._binary import read_bytes, unsigned
from keras_vit.data.graph import as_written
from keras_vit.data.presets import Preset, get_preset
from keras_vit.data.sources import open_source

logger = logging.getLogger("keras_vit")
AUTOTUNE = tf.data.AUTOTUNE


@dataclasses.dataclass
class DatasetInfo:
    """What `make_dataset(..., with_info=True)` says about its dataset."""

    source: str
    split: str
    num_examples: int          # in this split (before worker sharding); None if unknown
    class_names: list
    num_classes: int
    global_batch_size: int
    batch_size: int            # what one element of the dataset holds
    preset: object
    _skipped: object = None      # a _SkippedFiles
    classes_present: int = None  # distinct labels among the split's records; None if unknown
    description: str = None      # e.g. "folder:/data/x (validation: 10% holdout)"

    @property
    def skipped_corrupt(self):
        """Distinct files (records) skipped so far (`skip_corrupt=True`):
        those that cannot be read (counted at listing), fail the structural
        check, fail to decode, or are larger than `max_image_pixels()`.
        Grows while the dataset is first iterated; a file read again in a
        later epoch (or read ahead) counts once."""
        return int(self._skipped) if self._skipped is not None else 0


class _SkippedFiles:
    """The records `skip_corrupt` skipped, by their index in the split's
    record order (in a hash table, so a record skipped again counts once),
    plus `listed`: the files left out at listing."""

    def __init__(self, listed):
        self.listed = listed
        with tf.device("/cpu:0"):  # tf.data runs there; the table has CPU kernels
            self.table = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=0, name="skipped_corrupt")

    def count_if_not(self, ok, index):
        """`ok`, recording `index` as skipped when `ok` is False."""
        keys = tf.boolean_mask(tf.reshape(index, [1]), tf.reshape(tf.logical_not(ok), [1]))
        with tf.control_dependencies([self.table.insert(keys, tf.ones_like(keys))]):
            return tf.identity(ok)

    def __int__(self):
        return self.listed + int(self.table.size())


def _contains(data, needle):
    """Whether the byte string `data` contains `needle` (binary-safe)."""
    chars = tf.strings.bytes_split(data)
    n = len(needle)
    length = tf.size(chars) - n + 1
    found = tf.ones([tf.maximum(length, 0)], tf.bool)
    for i in range(n):
        found &= chars[i:i + tf.maximum(length, 0)] == needle[i:i + 1]
    return tf.reduce_any(found)


def looks_like_image(encoded):
    """Structural check without decoding: a JPEG starts with SOI and ends
    with EOI (in its last 32 bytes), a PNG has its signature and IEND, GIF
    and BMP their magic. Catches truncated, empty and non-image files."""
    head = tf.strings.substr(encoded, 0, 8)
    size = tf.strings.length(encoded)
    tail = tf.strings.substr(encoded, tf.maximum(size - 32, 0), 32)
    jpeg = tf.logical_and(tf.strings.substr(head, 0, 3) == b"\xff\xd8\xff",
                          _contains(tail, b"\xff\xd9"))
    png = tf.logical_and(head == b"\x89PNG\r\n\x1a\n", _contains(tail, b"IEND"))
    gif = tf.strings.substr(head, 0, 4) == b"GIF8"
    bmp = tf.strings.substr(head, 0, 2) == b"BM"
    return tf.reduce_any(tf.stack([jpeg, png, gif, bmp]))


MAX_PIXELS_ENV = _checks.MAX_IMAGE_PIXELS_ENV
DEFAULT_MAX_IMAGE_PIXELS = _checks.DEFAULT_MAX_IMAGE_PIXELS
max_image_pixels = _checks.max_image_pixels  # one bound: images decoded, a model's input


def oversized(encoded):
    """`(height, width, bound)` when the encoded image (bytes) declares more
    than `bound = max_image_pixels()` pixels in its header, else None: the
    eager check made before decoding one image (`predict`, export sampling;
    `make_dataset` makes it inside its graph).

    >>> oversized(tf.io.encode_png(tf.zeros([2, 3, 3], tf.uint8)).numpy()) is None
    True
    """
    height, width = (int(n) for n in _header_shape_graph(tf.constant(encoded)))
    bound = max_image_pixels()
    return (height, width, bound) if height * width > bound else None


def too_large_error(name, height, width, bound, hint):
    """The ValueError for image file `name` of `height` x `width` pixels,
    more than `bound` (`max_image_pixels()`); `hint` says how to skip it."""
    return ValueError(
        f"Image file {name!r} is {width}x{height} = {width * height:,} pixels, more than "
        f"the bound of {bound:,} ({MAX_PIXELS_ENV}); {hint}, or raise the bound.")


def header_shape(encoded):
    """`(height, width)` (int64) that an image's header declares, read
    without decoding: JPEG (its frame header, `tf.image.extract_jpeg_shape`),
    PNG (IHDR), GIF (the logical screen), BMP (the info header, as
    TensorFlow's decoder reads it); `(0, 0)` for other bytes.

    >>> png = tf.io.encode_png(tf.zeros([2, 3, 3], tf.uint8))
    >>> [int(x) for x in header_shape(png)]
    [2, 3]
    """
    head = read_bytes(encoded, 0, 26)
    kind = tf.strings.substr(encoded, 0, 16)

    def pair(start, width, little_endian):  # two numbers of `width` bytes at `start`
        return unsigned(tf.reshape(head[start:start + 2 * width], [2, width]), little_endian)

    png = pair(16, 4, False)[::-1]  # (width, height) -> (height, width)
    gif = pair(6, 2, True)[::-1]
    bmp = pair(18, 4, True)[::-1]  # int32: a negative height is top-down
    bmp = tf.abs(tf.where(bmp >= 2**31, bmp - 2**32, bmp))
    shape = tf.where(kind == b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", png,
                     tf.where(tf.strings.substr(kind, 0, 4) == b"GIF8", gif,
                              tf.where(tf.strings.substr(kind, 0, 2) == b"BM", bmp,
                                       tf.zeros([2], tf.int64))))
    return tf.cond(tf.io.is_jpeg(encoded),
                   lambda: tf.cast(tf.image.extract_jpeg_shape(encoded)[:2], tf.int64),
                   lambda: shape)


# `header_shape` as one graph, for the eager check of one image at a time
# (`oversized`): run eagerly it is some forty small ops, about 3 ms an image
# on a CPU; as a graph under 1 ms. (Traced at the first call.)
_header_shape_graph = tf.function(header_shape, autograph=False,
                                  input_signature=[tf.TensorSpec([], tf.string)])


# The tf.debugging.Assert messages of `make_dataset`; `data_error` finds the
# file name in them with `_framework_text.assert_data`.
_CORRUPT = "Corrupt or non-image file"
_CORRUPT_END = "(pass skip_corrupt=True to skip and count such records)"
_LABEL = ("Label out of range [0, ", int, ") for")
_TOO_LARGE = "Image file too large"
_SKIP_HINT = "pass skip_corrupt=True (keras-vit: --skip-corrupt) to skip and count such files"


def _messages(error):
    """The messages of `error` and the errors it was raised from."""
    seen, out = set(), []
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        out.append(getattr(error, "message", None) or str(error))
        error = error.__cause__ or error.__context__
    return out


def data_error(error):
    """A one-line `ValueError` for a data error raised while iterating a
    `make_dataset` pipeline (or `model.fit` / `evaluate` on one), else None.

    The pipeline checks each record with `tf.debugging.Assert`; TensorFlow
    raises those as a `tf.errors.InvalidArgumentError` with a graph
    traceback. This turns them into one sentence naming the file:

    - a corrupt or non-image file: "Corrupt or non-image file 'DIR/3/7.png';
      pass skip_corrupt=True (keras-vit: --skip-corrupt) to skip and count
      such files."
    - an image larger than `max_image_pixels()`: "Image file 'DIR/3/7.png'
      is 30000x30000 = 900,000,000 pixels, more than the bound of
      178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass skip_corrupt=True ..."
    - a label outside the classes: "Label 7 of 'NAME' is out of range
      [0, 3): the data has 3 classes; ..."
    - a file that passes the structural check but that TensorFlow cannot
      decode (TensorFlow does not say which file): "An image file could not
      be decoded (TensorFlow: Invalid PNG. ...); pass skip_corrupt=True ..."

    Any other error gives None.

    Example:

    ```python
    try:
        model.fit(keras_vit.data.make_dataset("folder:/data/x", image_size=224))
    except Exception as error:
        converted = keras_vit.data.data_error(error)
        if converted is None:
            raise
        raise converted from None
    ```
    """
    for message in _messages(error):
        found = assert_data(message, _CORRUPT, str, _CORRUPT_END)
        if found:
            return ValueError(f"{_CORRUPT} {found[0]!r}; {_SKIP_HINT}.")
        found = assert_data(message, _TOO_LARGE, str, "height", int, "width", int, "bound", int)
        if found:
            return too_large_error(*found, _SKIP_HINT)
        found = assert_data(message, _LABEL, str, "label", int)
        if found:
            k, name, label = found
            return ValueError(
                f"Label {label} of {name!r} is out of range [0, {k}): the data has {k} "
                "classes. Check label_offset (keras-vit: --label-offset; -1 for 1-based "
                "labels) and num_classes.")
    for message in _messages(error):
        failure = decode_failure(message)
        if failure:
            return ValueError(
                f"An image file could not be decoded (TensorFlow: "
                f"{failure.strip().rstrip('.')}.) though it looks like an image; "
                f"TensorFlow does not say which file. {_SKIP_HINT[0].upper()}{_SKIP_HINT[1:]} "
                "(it decodes each file apart and skips those that fail).")
    return None


@dataclasses.dataclass(frozen=True)
class _Records:
    """What `make_dataset` does to each record and batch, by its preset:
    the checks, decoding to a `size` image (crop or resize, flip),
    RandAugment, the one-hot label, and the batch mix (label smoothing,
    mixup or cutmix). Each method is one `tf.data` stage."""

    preset: object              # a `Preset`
    size: tuple                 # (height, width)
    max_pixels: int             # `max_image_pixels()`
    classes: int
    skip_corrupt: bool

    @property
    def seeded(self):
        """Whether a record draws random numbers (the eval path draws none)."""
        return self.preset.training or self.preset.randaugment is not None

    def check(self, encoded, label, name, _):
        """`encoded`, once its label is in range and (without
        `skip_corrupt`, which filtered them out already) it looks like an
        image; else the pipeline stops with an Assert naming the file."""
        k = self.classes
        checks = [tf.debugging.Assert(
            tf.logical_and(label >= 0, label < k),
            [f"Label out of range [0, {k}) for", name, "label", label])]
        if not self.skip_corrupt:
            checks.append(tf.debugging.Assert(looks_like_image(encoded),
                                              [_CORRUPT, name, _CORRUPT_END]))
        with tf.control_dependencies(checks):
            return tf.identity(encoded)

    def to_image(self, encoded, element_seed, name):
        """Encoded bytes -> `size` image (decode, crop or resize, flip), and
        the seed left for RandAugment. An image of more than `max_pixels`
        (its header says) is never decoded: the pipeline stops naming it."""
        crop_seed = flip_seed = None
        if self.preset.training:
            crop_seed, flip_seed, ra_seed = tf.unstack(augment.split_seed(element_seed, 3))
        else:
            ra_seed = element_seed
        height, width = tf.unstack(header_shape(encoded))
        small_enough = height * width <= self.max_pixels
        # a branch, not a control dependency: map fusion drops those
        return tf.cond(small_enough, lambda: self._decode(encoded, crop_seed, flip_seed),
                       lambda: self._refuse(small_enough, name, height, width)), ra_seed

    def _decode(self, encoded, crop_seed, flip_seed):
        preset, size = self.preset, self.size
        if preset.training:
            image = augment.decode_and_inception_crop(encoded, size, crop_seed,
                                                      area_range=preset.crop_area)
            if preset.flip:
                image = augment.random_flip(image, flip_seed)
        else:
            image = augment.decode_image(encoded)
            image = (augment.resize_and_center_crop(image, size) if preset.center_crop
                     else augment.resize(image, size))
        return tf.ensure_shape(tf.cast(image, tf.float32), size + (3,))

    def _refuse(self, small_enough, name, height, width):
        with tf.control_dependencies([tf.debugging.Assert(small_enough, [
                _TOO_LARGE, name, "height", height, "width", width, "bound",
                self.max_pixels])]):
            return tf.zeros(self.size + (3,))

    def finish(self, image, label, ra_seed):
        """RandAugment (when the preset has it), and the one-hot label."""
        if self.preset.randaugment is not None:
            image = augment.randaugment(image, *self.preset.randaugment, ra_seed)
        image = tf.ensure_shape(image, self.size + (3,))
        return image, tf.one_hot(label, self.classes, dtype=tf.float32)

    def preprocess(self, record, element_seed):
        """A checked record -> `(image, one_hot_label)`."""
        encoded, label, name, _ = record
        image, ra_seed = self.to_image(encoded, element_seed if self.seeded else None, name)
        return self.finish(image, label, ra_seed)

    def decode_alone(self, record, element_seed):
        """A dataset of one `(image, label, ra_seed, ok, index)`: the record
        decoded in a dataset of its own whose errors are ignored (TF cannot
        catch a decode error inside a graph); one that yields nothing
        yields the fallback (ok=False) instead."""
        encoded, label, name, index = record
        element_seed = element_seed if self.seeded else None

        def decoded(encoded):
            image, ra = self.to_image(encoded, element_seed, name)
            return image, ra if ra is not None else tf.zeros([2], tf.int64), True

        fallback = tf.data.Dataset.from_tensors(
            (tf.zeros(self.size + (3,)), tf.zeros([2], tf.int64), False))
        one = tf.data.Dataset.from_tensors(encoded).map(as_written(decoded)).ignore_errors()
        return one.concatenate(fallback).take(1).map(
            as_written(lambda image, ra, ok: (image, label, ra, ok, index)))

    def mix(self, batch, batch_seed):
        """Label smoothing, then mixup or cutmix (one of them per batch,
        at random, when the preset has both)."""
        preset = self.preset
        images, labels = batch
        if preset.label_smoothing:
            labels = (labels * (1.0 - preset.label_smoothing)
                      + preset.label_smoothing / self.classes)
        which_seed, mix_seed = tf.unstack(augment.split_seed(batch_seed, 2))
        if preset.mixup and preset.cutmix:
            use_cutmix = tf.random.stateless_uniform([], which_seed) < 0.5
            return tf.cond(
                use_cutmix,
                lambda: augment.cutmix(images, labels, preset.cutmix, mix_seed),
                lambda: augment.mixup(images, labels, preset.mixup, mix_seed))
        if preset.mixup:
            return augment.mixup(images, labels, preset.mixup, mix_seed)
        if preset.cutmix:
            return augment.cutmix(images, labels, preset.cutmix, mix_seed)
        return images, labels


def _class_names(src, num_classes):
    """The class names of `src`, or `num_classes` names `"0"`, `"1"`...
    for a source without names; a ValueError when they disagree or when
    there are none."""
    classes = src.class_names or [str(i) for i in range(num_classes or 0)]
    if num_classes is not None and src.class_names and num_classes != len(src.class_names):
        raise ValueError(
            f"num_classes={num_classes} but {src.description} has "
            f"{len(src.class_names)} classes."
        )
    if not classes:
        raise ValueError(
            f"{src.description} has no class names (no dataset_info.json); pass "
            "`num_classes=`."
        )
    return classes


def _read(src, batch_size, input_context):
    """`(dataset of (encoded, label, name, index), batch size of one
    element)`: the split's records read, each with its index in the split
    (so that a skipped file counts once); with `input_context`, sharded
    before reading (each worker reads its own) and batched per replica."""
    dataset = src.records.enumerate()
    local_batch = batch_size
    if input_context is not None:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
        local_batch = input_context.get_per_replica_batch_size(batch_size)

    def read(index, record):
        return (*src.read(*(record if isinstance(record, tuple) else (record,))), index)

    return dataset.map(as_written(read), num_parallel_calls=AUTOTUNE), local_batch


def _skip_non_images(dataset, skipped):
    """Records that fail the structural check (truncated, empty, not an
    image) left out and counted in `skipped`."""
    return dataset.filter(as_written(lambda encoded, label, name, index: skipped.count_if_not(
        looks_like_image(encoded), index)))


def _order(dataset, *, cache, shuffle, shuffle_buffer, seed, repeat):
    """Cached (in memory, or in the file `cache` names), shuffled,
    repeated, as asked."""
    if cache:
        dataset = dataset.cache(cache if isinstance(cache, str) else "")
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    return dataset


def _checked(dataset, records, seed, skip=0):
    """`(record, element_seed)` pairs, each record passed by
    `records.check`: a seed (2 int64) of `tf.data.Dataset.random(seed)`
    per record that draws random numbers, else zeros. The first `skip`
    pairs are left out before any record is checked or decoded."""
    if records.seeded:
        seeds = tf.data.Dataset.random(seed=seed).batch(2)
        dataset = tf.data.Dataset.zip((dataset, seeds))
    else:  # the eval path draws no random numbers
        dataset = dataset.map(as_written(lambda *record: (record, tf.zeros([2], tf.int64))))
    if skip:
        dataset = dataset.skip(skip)
    return dataset.map(as_written(lambda record, s: ((records.check(*record), *record[1:]), s)),
                       num_parallel_calls=AUTOTUNE)


def _decoded(dataset, records, skipped):
    """`(image, one_hot_label)` of each record. With `skipped`
    (`skip_corrupt`), each record is decoded on its own and those that fail
    are left out and counted."""
    if skipped is None:
        return dataset.map(as_written(records.preprocess), num_parallel_calls=AUTOTUNE)
    dataset = dataset.interleave(as_written(records.decode_alone), cycle_length=16,
                                 block_length=1, num_parallel_calls=AUTOTUNE, deterministic=True)
    dataset = dataset.filter(as_written(lambda image, label, ra_seed, ok, index:
                                        skipped.count_if_not(ok, index)))
    return dataset.map(as_written(lambda image, label, ra_seed, ok, index: records.finish(
        image, label, ra_seed if records.seeded else None)), num_parallel_calls=AUTOTUNE)


def _mixed(dataset, records, seed, skip=0):
    """The batches through `records.mix` (with a seed per batch from
    `seed + 1`, the first `skip` seeds left out) when the preset smooths
    labels or mixes images."""
    preset = records.preset
    if not (preset.mixup or preset.cutmix or preset.label_smoothing):
        return dataset
    batch_seeds = tf.data.Dataset.random(seed=None if seed is None else seed + 1).batch(2)
    batch_seeds = batch_seeds.skip(skip) if skip else batch_seeds
    return tf.data.Dataset.zip((dataset, batch_seeds)).map(as_written(records.mix),
                                                           num_parallel_calls=AUTOTUNE)


def _prefetched(dataset):
    options = tf.data.Options()
    options.experimental_optimization.map_fusion = True
    return dataset.with_options(options).prefetch(AUTOTUNE)


def make_dataset(
    source: str,
    split: str = "train",
    *,
    image_size: int | tuple[int, int] = 224,
    batch_size: int = 32,
    training: bool = False,
    preset: str | Preset | None = None,
    seed: int | None = None,
    shuffle_buffer: int = 10_000,
    cache: bool | str = False,
    repeat: bool = False,
    data_dir: str | None = None,
    skip_corrupt: bool = False,
    input_context: tf.distribute.InputContext | None = None,
    num_classes: int | None = None,
    label_offset: int = 0,
    drop_remainder: bool | None = None,
    with_info: bool = False,
    holdout: float = 0.1,
    skip_batches: int = 0,
) -> tf.data.Dataset | tuple[tf.data.Dataset, DatasetInfo]:
    """Builds a batched `tf.data` pipeline of `(images, one_hot_labels)`.

    Args:
        source: `"tfds:NAME[:VERSION]"`, `"tfrecord:GLOB_OR_DIR"` (a
            `tf_records build` directory or a glob of shards in the TPU
            ImageNet schema) or `"folder:DIR"`: `DIR/<split>/<class>/` or
            `DIR/<class>/` (then `"validation"` is a stratified `holdout`
            of each class). `gs://` paths work. See docs/data.md.
        split: split name (`"train"`, `"test"`, `"validation"`, a TFDS
            split string...).
        image_size: int or (h, w) output size S.
        batch_size: the **global** batch size. Without `input_context` the
            dataset yields batches of this size; with it (inside
            `strategy.distribute_datasets_from_function`) each worker's
            pipeline yields per-replica batches of
            `input_context.get_per_replica_batch_size(batch_size)`. A plain
            `model.fit(dataset)` under a strategy wants global batches.
        training: shuffle, random augmentation, drop incomplete batches.
        preset: `"eval"`, `"eval_crop"`, `"finetune"`, an AugReg setting
            (`"none"`, `"light1"`, `"light2"`, `"medium1"`, `"medium2"`,
            `"strong1"`, `"strong2"`) or a `keras_vit.data.Preset`.
            Default: `"finetune"` when training, else `"eval"`.
        seed: int; the same seed gives the same batches (shuffle and every
            augmentation). None: different each run.
        shuffle_buffer: examples in the shuffle buffer.
        cache: cache the encoded records in memory (True) or in a file
            (a path) after the first epoch.
        repeat: repeat forever (then give `steps_per_epoch` to `fit`).
        data_dir: TFDS data directory.
        skip_corrupt: False (default): a corrupt, non-image or too large
            (`max_image_pixels()`) file stops the pipeline with a
            `tf.errors.InvalidArgumentError` naming it
            (`keras_vit.data.data_error(error)` makes it one ValueError
            line); a folder's file that cannot be read is a ValueError at
            once. True: such files are skipped and counted
            (`info.skipped_corrupt`). See docs/data.md.
        input_context: a `tf.distribute.InputContext`: shards the examples
            per input pipeline (worker) and batches per replica.
        num_classes: for sources without class names (bare TFRecords).
        label_offset: added to TFRecord labels (-1 for TPU ImageNet shards,
            whose labels are 1..1000).
        drop_remainder: default: `training`.
        with_info: also return a `DatasetInfo`.
        skip_batches: start the stream after this many batches (a
            resumed run: the batches of its finished epochs), skipped
            before any record is decoded (docs/data.md).
        holdout: `"folder:DIR"` of class subfolders only: the fraction of
            each class held out as the validation split, a float in [0, 1)
            (default 0.1; 0: train on everything, no validation split).
            Ignored by other sources and by folders with split subfolders.

    Returns:
        `tf.data.Dataset` of `(float32 images (B, S, S, 3) in [0, 255],
        float32 one-hot labels (B, classes))`, or `(dataset, info)`.
        Models built with `include_preprocessing=True` take these pixels as
        they are.

    Example (a folder of class subfolders alone, a fifth of each class held
    out for `"validation"`; docs/data.md has more):

    >>> import os, shutil, tempfile
    >>> folder, png = tempfile.mkdtemp(), tf.io.encode_png(tf.zeros((8, 8, 3), tf.uint8))
    >>> for i in range(10):  # two classes of five 8x8 PNGs
    ...     tf.io.write_file(os.path.join(folder, ("cat", "dog")[i % 2], f"{i}.png"), png)
    >>> train, info = make_dataset(f"folder:{folder}", "train", image_size=4, batch_size=4,
    ...                            training=True, seed=0, holdout=0.2, with_info=True)
    >>> images, labels = next(iter(train))
    >>> tuple(images.shape), tuple(labels.shape)
    ((4, 4, 4, 3), (4, 2))
    >>> info.description
    'folder:... (train: 20% of each class held out)'
    >>> shutil.rmtree(folder)
    """
    _checks.positive_int(batch_size, "batch_size")
    _checks.non_negative_int(skip_batches, "skip_batches")
    size = _checks.positive_int_pair(image_size, "image_size")
    preset = get_preset(preset, training)
    if preset.randaugment is not None:
        augment.check_randaugment(*preset.randaugment)
    drop_remainder = training if drop_remainder is None else drop_remainder
    max_pixels = max_image_pixels()
    src = open_source(source, split, data_dir=data_dir, label_offset=label_offset,
                      holdout=holdout, skip_corrupt=skip_corrupt)
    classes = _class_names(src, num_classes)
    records = _Records(preset, size, max_pixels, len(classes), skip_corrupt)

    dataset, local_batch = _read(src, batch_size, input_context)
    skipped = _SkippedFiles(len(src.skipped)) if skip_corrupt else None
    if skipped is not None:
        dataset = _skip_non_images(dataset, skipped)
    dataset = _order(dataset, cache=cache, shuffle=training, shuffle_buffer=shuffle_buffer,
                     seed=seed, repeat=repeat)
    dataset = _checked(dataset, records, seed, skip_batches * local_batch)
    dataset = _decoded(dataset, records, skipped)
    dataset = dataset.batch(local_batch, drop_remainder=drop_remainder,
                            num_parallel_calls=AUTOTUNE)
    dataset = _prefetched(_mixed(dataset, records, seed, skip_batches))
    if skip_corrupt:
        logger.info("%s: corrupt records are skipped and counted in "
                    "info.skipped_corrupt.", src.description)
    if not with_info:
        return dataset
    info = DatasetInfo(source, split, src.num_examples, classes, len(classes), batch_size,
                       local_batch, preset, skipped,
                       classes_present=src.classes_present, description=src.description)
    return dataset, info
