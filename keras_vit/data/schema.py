"""The TFRecord schema, shared by the `tf_records` writer and the reader.

The convention of the TPU ImageNet shards (`tensorflow/tpu`
`imagenet_to_gcs.py`), so existing ImageNet TFRecords read as they are:

| key                 | type   | content                                   |
| ------------------- | ------ | ----------------------------------------- |
| `image/encoded`     | bytes  | the encoded image (JPEG, PNG, ...)        |
| `image/format`      | bytes  | `JPEG`, `PNG`, ...                        |
| `image/class/label` | int64  | the class index (TPU ImageNet: 1..1000)   |
| `image/class/text`  | bytes  | the class name                            |
| `image/filename`    | bytes  | the source file name                      |
| `image/height`      | int64  | pixels                                    |
| `image/width`       | int64  | pixels                                    |

Shards are named `<split>-<index:05d>-of-<count:05d>`, e.g.
`train-00000-of-00016`.
"""

import re

import tensorflow as tf

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/format": tf.io.FixedLenFeature([], tf.string, default_value=""),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/class/text": tf.io.FixedLenFeature([], tf.string, default_value=""),
    "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
    "image/height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    "image/width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
}

SHARD_RE = re.compile(r"^(?P<split>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})$")
INFO_FILE = "dataset_info.json"


def shard_name(split, index, num_shards):
    """`shard_name("train", 0, 16) == "train-00000-of-00016"`."""
    return f"{split}-{index:05d}-of-{num_shards:05d}"


def _bytes(value):
    if isinstance(value, str):
        value = value.encode("utf-8")
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))


def encode_example(encoded, label, *, image_format, text="", filename="",
                   height=0, width=0):
    """Returns one serialized `tf.train.Example` in this schema."""
    example = tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": _bytes(encoded),
        "image/format": _bytes(image_format),
        "image/class/label": _int(label),
        "image/class/text": _bytes(text),
        "image/filename": _bytes(filename),
        "image/height": _int(height),
        "image/width": _int(width),
    }))
    return example.SerializeToString()


def parse_example(serialized):
    """Parses one serialized example into the `FEATURES` dict (graph-safe)."""
    return tf.io.parse_single_example(serialized, FEATURES)
