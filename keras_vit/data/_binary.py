"""Bytes and the unsigned integers they hold, read from an encoded image
(a string tensor) inside the graph: shared by the header reader of
`pipeline.header_shape` and the EXIF reader of `exif`."""

import tensorflow as tf


def read_bytes(encoded, start, count):
    """`count` bytes of `encoded` from `start` (int64 values 0-255); past
    its end, and from a `start` outside it, zeros."""
    size = tf.cast(tf.strings.length(encoded), tf.int64)
    start = tf.cast(tf.clip_by_value(tf.cast(start, tf.int64), 0, size), tf.int32)
    raw = tf.strings.substr(encoded, start, count) + b"\0" * count
    return tf.reshape(tf.cast(tf.io.decode_raw(raw, tf.uint8)[:count], tf.int64), [count])


def unsigned(values, little_endian):
    """The unsigned integers held by the bytes in `values`' last axis (as
    `read_bytes` gives them), in byte order `little_endian` (a bool, or a
    bool tensor read from the data)."""
    weights = [256 ** i for i in range(values.shape[-1])]
    weights = tf.where(little_endian, tf.constant(weights, tf.int64),
                       tf.constant(weights[::-1], tf.int64))
    return tf.reduce_sum(values * weights, -1)
