"""`make_dataset`: one call from a source string to the `(images,
one_hot_labels)` batches `model.fit` wants."""

import dataclasses
import logging

import tensorflow as tf

from keras_vit.data import augment
from keras_vit.data.presets import get_preset
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
    _skipped: tf.Variable = None

    @property
    def skipped_corrupt(self):
        """Corrupt or non-image records skipped so far (`skip_corrupt=True`);
        grows while the dataset is iterated."""
        return int(self._skipped.numpy()) if self._skipped is not None else 0


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


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"`batch_size` must be a positive int, got {batch_size!r}.")


def make_dataset(
    source,
    split="train",
    *,
    image_size=224,
    batch_size=32,
    training=False,
    preset=None,
    seed=None,
    shuffle_buffer=10_000,
    cache=False,
    repeat=False,
    data_dir=None,
    skip_corrupt=False,
    input_context=None,
    num_classes=None,
    label_offset=0,
    drop_remainder=None,
    with_info=False,
):
    """Builds a batched `tf.data` pipeline of `(images, one_hot_labels)`.

    Args:
        source: `"tfds:NAME[:VERSION]"`, `"tfrecord:GLOB_OR_DIR"` (a
            `tf_records build` directory or a glob of shards in the TPU
            ImageNet schema) or `"folder:DIR"` (class subfolders;
            `DIR/<split>/` is used when it exists). `gs://` paths work.
        split: split name (`"train"`, `"test"`, a TFDS split string...).
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
        skip_corrupt: False (default): a corrupt or non-image file stops the
            pipeline with an error naming it. True: such records are skipped
            and counted (`info.skipped_corrupt`).
        input_context: a `tf.distribute.InputContext`: shards the examples
            per input pipeline (worker) and batches per replica.
        num_classes: for sources without class names (bare TFRecords).
        label_offset: added to TFRecord labels (-1 for TPU ImageNet shards,
            whose labels are 1..1000).
        drop_remainder: default: `training`.
        with_info: also return a `DatasetInfo`.

    Returns:
        `tf.data.Dataset` of `(float32 images (B, S, S, 3) in [0, 255],
        float32 one-hot labels (B, classes))`, or `(dataset, info)`.
        Models built with `include_preprocessing=True` take these pixels as
        they are.

    Example:

    ```python
    train = keras_vit.data.make_dataset(
        "folder:/data/flowers", "train", image_size=224, batch_size=64,
        training=True, preset="medium2", seed=0)
    model.fit(train, epochs=10)
    ```
    """
    _check_batch_size(batch_size)
    size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(size) != 2 or min(size) <= 0:
        raise ValueError(f"`image_size` must be a positive int or (h, w), got {image_size!r}.")
    preset = get_preset(preset, training)
    if preset.randaugment is not None:
        augment.check_randaugment(*preset.randaugment)
    drop_remainder = training if drop_remainder is None else drop_remainder

    src = open_source(source, split, data_dir=data_dir, label_offset=label_offset)
    classes = src.class_names or [str(i) for i in range(num_classes or 0)]
    if num_classes is not None and src.class_names and num_classes != len(src.class_names):
        raise ValueError(
            f"num_classes={num_classes} but {src.description} has "
            f"{len(src.class_names)} classes."
        )
    k = len(classes)
    if k == 0:
        raise ValueError(
            f"{src.description} has no class names (no dataset_info.json); pass "
            "`num_classes=`."
        )

    dataset = src.records
    local_batch = batch_size
    if input_context is not None:  # shard before reading: each worker reads its own
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)
        local_batch = input_context.get_per_replica_batch_size(batch_size)
    dataset = dataset.map(src.read, num_parallel_calls=AUTOTUNE)

    skipped = None
    if skip_corrupt:
        skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_corrupt")

        def keep(encoded, label, name):
            ok = looks_like_image(encoded)
            with tf.control_dependencies(
                    [skipped.assign_add(tf.cast(tf.logical_not(ok), tf.int64))]):
                return tf.identity(ok)

        dataset = dataset.filter(keep)

    if cache:
        dataset = dataset.cache(cache if isinstance(cache, str) else "")
    if training:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()

    def preprocess(record, element_seed):
        encoded, label, name = record
        checks = [tf.debugging.Assert(
            tf.logical_and(label >= 0, label < k),
            [f"Label out of range [0, {k}) for", name, "label", label])]
        if not skip_corrupt:  # skip_corrupt filtered these out already
            checks.append(tf.debugging.Assert(looks_like_image(encoded), [
                "Corrupt or non-image file (pass skip_corrupt=True to skip and "
                "count such records):", name]))
        with tf.control_dependencies(checks):
            encoded = tf.identity(encoded)
        if preset.training:
            crop_seed, flip_seed, ra_seed = tf.unstack(augment.split_seed(element_seed, 3))
            image = augment.decode_and_inception_crop(encoded, size, crop_seed,
                                                      area_range=preset.crop_area)
            if preset.flip:
                image = augment.random_flip(image, flip_seed)
        else:
            ra_seed = element_seed
            image = augment.decode_image(encoded)
            image = (augment.resize_and_center_crop(image, size) if preset.center_crop
                     else augment.resize(image, size))
        if preset.randaugment is not None:
            image = augment.randaugment(image, *preset.randaugment, ra_seed)
        image = tf.ensure_shape(image, size + (3,))
        return image, tf.one_hot(label, k, dtype=tf.float32)

    if preset.training or preset.randaugment is not None:
        seeds = tf.data.Dataset.random(seed=seed).batch(2)
        dataset = tf.data.Dataset.zip((dataset, seeds))
        dataset = dataset.map(preprocess, num_parallel_calls=AUTOTUNE)
    else:  # the eval path draws no random numbers
        dataset = dataset.map(lambda *record: preprocess(record, None),
                              num_parallel_calls=AUTOTUNE)
    dataset = dataset.batch(local_batch, drop_remainder=drop_remainder,
                            num_parallel_calls=AUTOTUNE)

    if preset.mixup or preset.cutmix or preset.label_smoothing:
        batch_seeds = tf.data.Dataset.random(
            seed=None if seed is None else seed + 1).batch(2)
        dataset = tf.data.Dataset.zip((dataset, batch_seeds))

        def mix(batch, batch_seed):
            images, labels = batch
            if preset.label_smoothing:
                labels = labels * (1.0 - preset.label_smoothing) + preset.label_smoothing / k
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

        dataset = dataset.map(mix, num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.experimental_optimization.map_fusion = True
    dataset = dataset.with_options(options).prefetch(AUTOTUNE)
    if skip_corrupt:
        logger.info("%s: corrupt records are skipped and counted in "
                    "info.skipped_corrupt.", src.description)
    if not with_info:
        return dataset
    info = DatasetInfo(source, split, src.num_examples, classes, k, batch_size,
                       local_batch, preset, skipped)
    return dataset, info
