"""Data sources: `tfds:NAME[:VERSION]`, `tfrecord:GLOB_OR_DIR`, `folder:DIR`.

Each opens as a `Source`: a `tf.data.Dataset` of `(encoded_bytes, label,
name)` records (undecoded, so caching and shuffling stay cheap), the number
of examples when known, and the class names. `gs://` and other
`tf.io.gfile` paths work wherever a path is taken.
"""

import dataclasses
import json
import os

import tensorflow as tf

from keras_vit.data import schema

SCHEMES = ("tfds", "tfrecord", "folder")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


@dataclasses.dataclass
class Source:
    """`records`: the cheap, undecoded elements (file names, serialized
    examples); `read` maps one to `(encoded, label, name)`. Shard `records`
    before `read` so that a worker reads only its own files."""

    records: tf.data.Dataset
    read: object
    num_examples: int            # None when unknown
    class_names: list
    description: str

    @property
    def num_classes(self):
        return len(self.class_names)

    @property
    def dataset(self):
        """`(encoded, label, name)` records."""
        return self.records.map(self.read, num_parallel_calls=tf.data.AUTOTUNE)


def parse_source(source):
    """`"folder:/data/x"` -> `("folder", "/data/x")`; raises on unknown schemes."""
    if not isinstance(source, str) or ":" not in source:
        raise ValueError(
            f"Data source {source!r} has no scheme; use one of "
            f"{', '.join(s + ':...' for s in SCHEMES)} (e.g. 'tfds:cifar10', "
            "'tfrecord:gs://bucket/train-*', 'folder:/data/images')."
        )
    scheme, rest = source.split(":", 1)
    if scheme not in SCHEMES:
        raise ValueError(
            f"Unknown data source scheme {scheme!r} in {source!r}; valid: "
            f"{', '.join(repr(s) for s in SCHEMES)}."
        )
    if not rest:
        raise ValueError(f"Data source {source!r} names nothing after '{scheme}:'.")
    return scheme, rest


def open_source(source, split="train", data_dir=None, label_offset=0):
    """Opens a source string for one split. `label_offset` is added to
    TFRecord labels (-1 for the 1-based TPU ImageNet shards)."""
    scheme, rest = parse_source(source)
    if scheme == "folder":
        return folder_source(rest, split)
    if scheme == "tfrecord":
        return tfrecord_source(rest, split, label_offset)
    return tfds_source(rest, split, data_dir)


# --- folders --------------------------------------------------------------

def list_folder(directory, split="train"):
    """`(files, labels, class_names)` of a folder of class subfolders.

    Uses `DIR/<split>/` when it exists, else `DIR/` itself. Classes are the
    sorted subfolder names; files the sorted image files in each.
    """
    root = directory
    candidate = os.path.join(directory, split)
    if tf.io.gfile.isdir(candidate):
        root = candidate
    if not tf.io.gfile.isdir(root):
        raise ValueError(f"Image folder not found: {directory!r}.")
    classes = sorted(
        name.rstrip("/") for name in tf.io.gfile.listdir(root)
        if tf.io.gfile.isdir(os.path.join(root, name))
    )
    if not classes:
        raise ValueError(
            f"Image folder {root!r} has no class subfolders; expected "
            f"{root}/<class_name>/<image files>."
        )
    files, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, name)
        for filename in sorted(tf.io.gfile.listdir(folder)):
            if filename.lower().endswith(IMAGE_EXTENSIONS):
                files.append(os.path.join(folder, filename))
                labels.append(label)
    if not files:
        raise ValueError(
            f"No image files ({', '.join(IMAGE_EXTENSIONS)}) under {root!r}."
        )
    return files, labels, classes


def folder_source(directory, split):
    files, labels, classes = list_folder(directory, split)
    paths = tf.data.Dataset.from_tensor_slices((files, labels))

    def read(path, label):
        return tf.io.read_file(path), tf.cast(label, tf.int64), path

    return Source(paths, read, len(files), classes, f"folder:{directory} ({split})")


# --- TFRecords ------------------------------------------------------------

def read_info(directory):
    """`dataset_info.json` of a `tf_records build` output, or None."""
    path = os.path.join(directory, schema.INFO_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def tfrecord_files(spec, split):
    """Shard files of `split` in a directory, or the files of a glob."""
    if tf.io.gfile.isdir(spec):
        pattern = os.path.join(spec, f"{split}-*-of-*")
        directory = spec
    else:
        pattern, directory = spec, os.path.dirname(spec)
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise ValueError(f"No TFRecord files match {pattern!r}.")
    return files, directory


def tfrecord_source(spec, split, label_offset=0):
    files, directory = tfrecord_files(spec, split)
    info = read_info(directory) if directory else None
    class_names = (info or {}).get("class_names")
    num_examples = None
    if info and tf.io.gfile.isdir(spec):
        num_examples = info.get("splits", {}).get(split, {}).get("num_examples")
    dataset = tf.data.Dataset.from_tensor_slices(files)
    dataset = dataset.interleave(
        tf.data.TFRecordDataset, cycle_length=min(len(files), 16),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )

    def parse(serialized):
        example = schema.parse_example(serialized)
        return (example["image/encoded"],
                example["image/class/label"] + label_offset,
                example["image/filename"])

    return Source(dataset, parse, num_examples, class_names or [],
                  f"tfrecord:{spec} ({split})")


# --- TFDS -----------------------------------------------------------------

def tfds_source(spec, split, data_dir=None):
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise ValueError(
            "The 'tfds:' source needs tensorflow-datasets: pip install "
            "tensorflow-datasets (or keras-vit[tfds])."
        ) from None
    name, _, version = spec.partition(":")
    full_name = f"{name}:{version}" if version else name
    try:
        builder = tfds.builder(full_name, data_dir=data_dir)
    except Exception as error:  # DatasetNotFoundError and friends
        raise ValueError(f"Unknown TFDS dataset {full_name!r}: {error}") from None
    features = builder.info.features
    image_key = next((k for k in ("image",) if k in features), None)
    label_key = next((k for k in ("label",) if k in features), None)
    if image_key is None or label_key is None:
        raise ValueError(
            f"TFDS dataset {full_name!r} has no 'image' and 'label' features "
            f"(it has {sorted(features.keys())})."
        )
    try:
        dataset = builder.as_dataset(
            split=split, shuffle_files=False,
            decoders={image_key: tfds.decode.SkipDecoding()},
        )
    except Exception as error:
        if builder.is_prepared():
            raise
        raise ValueError(
            f"TFDS dataset {full_name!r} is not prepared in "
            f"{builder.data_dir!r} and cannot be downloaded here. Prepare it "
            f"where the data is reachable (`tfds build {name}` or "
            f"`tfds.builder('{full_name}').download_and_prepare()`), then pass "
            "`data_dir=` pointing at that TFDS data directory."
        ) from error
    def read(i, ex):
        name = ex["file_name"] if "file_name" in ex else \
            tf.strings.format("tfds:{}[{}] #{}", (full_name, split, i))
        return ex[image_key], tf.cast(ex[label_key], tf.int64), name

    records = dataset.enumerate()
    try:
        num_examples = builder.info.splits[split].num_examples
    except (KeyError, ValueError):
        num_examples = None
    class_names = list(features[label_key].names)
    return Source(records, read, num_examples, class_names, f"tfds:{full_name} ({split})")
