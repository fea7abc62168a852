"""The EXIF orientation of JPEG bytes, read and applied in the graph.

Cameras and phones store a photo as the sensor saw it and record in EXIF
tag 0x0112 (Orientation, 1-8) how to turn it upright. `tf.io.decode_image`
ignores the tag, so a portrait phone photo decodes lying on its side: a
model would train or predict on it rotated, without a word. keras_vit
applies it wherever it decodes an image (training, evaluation, the CLI), as
every image viewer, Pillow's `ImageOps.exif_transpose` and Hugging Face's
image processors do.

Only JPEG's EXIF block (an APP1 segment before the image data) is read:
at most `MAX_SEGMENTS` segments and `MAX_ENTRIES` directory entries, so a
crafted file costs bounded time. Anything missing, out of range or damaged
reads as 1 (as stored): the tag changes how an image is shown, never
whether it decodes.

>>> import tensorflow as tf
>>> image = tf.reshape(tf.cast(tf.range(6), tf.uint8), [2, 3, 1])
>>> int(orientation(tf.io.encode_jpeg(tf.zeros([2, 3, 3], tf.uint8))))
1
>>> apply_orientation(image, 6)[..., 0].numpy().tolist()  # 90 degrees clockwise
[[3, 0], [4, 1], [5, 2]]
"""

import tensorflow as tf

from keras_vit.data._binary import read_bytes, unsigned

TAG = 0x0112
MAX_SEGMENTS = 32  # JPEG segments walked before giving up
MAX_ENTRIES = 64  # entries of the first image directory searched
_ENTRY = 12  # bytes per TIFF directory entry


def _exif_start(encoded):
    """Offset of the TIFF header inside the EXIF APP1 segment, or -1."""
    def walk(position, found, done):
        head = read_bytes(encoded, position, 10)
        marker, kind = head[0], head[1]
        length = unsigned(head[2:4], False)
        exif = tf.logical_and(tf.equal(kind, 0xE1), tf.reduce_all(
            tf.equal(head[4:10], tf.constant(list(b"Exif\0\0"), tf.int64))))
        # image data (SOS), end of image or anything but a marker: stop
        stop = tf.logical_or(tf.not_equal(marker, 0xFF), tf.logical_or(
            tf.equal(kind, 0xDA), tf.logical_or(tf.equal(kind, 0xD9), length < 2)))
        found = tf.where(exif, position + 10, found)
        return position + 2 + length, found, tf.logical_or(exif, stop)

    _, found, _ = tf.while_loop(
        lambda position, found, done: tf.logical_not(done), walk,
        (tf.constant(2, tf.int64), tf.constant(-1, tf.int64), tf.constant(False)),
        maximum_iterations=MAX_SEGMENTS)
    return found


def _orientation_at(encoded, tiff):
    """The orientation in the TIFF block at `tiff`, or 1."""
    order = read_bytes(encoded, tiff, 8)
    little = tf.reduce_all(tf.equal(order[:2], tf.constant(list(b"II"), tf.int64)))
    big = tf.reduce_all(tf.equal(order[:2], tf.constant(list(b"MM"), tf.int64)))
    # an unsigned 32-bit offset: one past the file reads zeros (no entries)
    directory = tiff + unsigned(order[4:8], little)
    count = unsigned(read_bytes(encoded, directory, 2), little)
    entries = tf.reshape(read_bytes(encoded, directory + 2, MAX_ENTRIES * _ENTRY),
                         [MAX_ENTRIES, _ENTRY])
    match = tf.logical_and(tf.equal(unsigned(entries[:, 0:2], little), TAG),
                           tf.range(MAX_ENTRIES, dtype=tf.int64) < count)
    values = unsigned(entries[:, 8:10], little)  # a SHORT value sits first in its field
    value = tf.reduce_sum(tf.where(match, values, 0) * tf.cast(
        tf.equal(tf.cumsum(tf.cast(match, tf.int64)), 1), tf.int64))  # the first match
    valid = tf.logical_and(tf.logical_or(little, big), tf.logical_and(value >= 1, value <= 8))
    return tf.cast(tf.where(valid, value, 1), tf.int32)


def orientation(encoded):
    """The EXIF orientation (int32, 1-8) of encoded image bytes; 1 for a
    JPEG without one and for any other format."""
    encoded = tf.convert_to_tensor(encoded, tf.string)
    return tf.cond(tf.io.is_jpeg(encoded), lambda: jpeg_orientation(encoded),
                   lambda: tf.constant(1))


def jpeg_orientation(encoded):
    """`orientation` of bytes already known to be a JPEG (no format check)."""
    tiff = _exif_start(encoded)
    return tf.cond(tiff >= 0, lambda: _orientation_at(encoded, tiff), lambda: tf.constant(1))


def apply_orientation(image, value):
    """`image` (height, width, channels) turned upright for EXIF
    orientation `value`, as Pillow's `ImageOps.exif_transpose`."""
    image = tf.convert_to_tensor(image)
    branches = [
        lambda: image,  # 1: as stored
        lambda: tf.reverse(image, [1]),  # 2: mirrored left-right
        lambda: tf.reverse(image, [0, 1]),  # 3: rotated 180
        lambda: tf.reverse(image, [0]),  # 4: mirrored top-bottom
        lambda: tf.transpose(image, [1, 0, 2]),  # 5: transposed
        lambda: tf.reverse(tf.transpose(image, [1, 0, 2]), [1]),  # 6: 90 clockwise
        lambda: tf.reverse(tf.transpose(image, [1, 0, 2]), [0, 1]),  # 7: transversed
        lambda: tf.reverse(tf.transpose(image, [1, 0, 2]), [0]),  # 8: 90 anticlockwise
    ]
    index = tf.clip_by_value(tf.cast(value, tf.int32) - 1, 0, 7)
    upright = tf.switch_case(index, branches)
    upright.set_shape([None, None, image.shape[-1]])
    return upright
