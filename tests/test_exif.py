"""EXIF orientation: a phone photo decodes upright everywhere keras_vit
decodes it, as Pillow's `ImageOps.exif_transpose` turns it (the reference),
and no crafted EXIF block can fail a decode or cost unbounded time."""

import doctest
import io
import struct

import numpy as np
import pytest
import tensorflow as tf

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageOps  # noqa: E402

from keras_vit import data, prediction  # noqa: E402
from keras_vit.data import augment, exif  # noqa: E402

ORIENTATIONS = range(1, 9)


@pytest.fixture(scope="module")
def photo():
    """A real photo (scikit-learn's china.jpg), 40 x 64: not square, so a
    quarter turn changes its shape."""
    from sklearn.datasets import load_sample_images

    return Image.fromarray(load_sample_images().images[0]).resize((64, 40))


def jpeg(image, orientation=None, little_endian=False, before=b""):
    """JPEG bytes of `image` written by Pillow: with Pillow's own EXIF block
    holding `orientation` (big-endian, after a JFIF segment), or with one
    written here in little-endian order right after the start of the image,
    behind the segments `before`."""
    buffer = io.BytesIO()
    if orientation is not None and not little_endian:
        exif_data = Image.Exif()
        exif_data[0x0112] = orientation
        image.save(buffer, "JPEG", quality=95, exif=exif_data)
        encoded = buffer.getvalue()
        return encoded[:2] + before + encoded[2:]
    image.save(buffer, "JPEG", quality=95)
    encoded = buffer.getvalue()
    if orientation is None:
        return encoded
    tiff = b"II*\0" + struct.pack("<IH", 8, 1) + struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0)
    return app1(b"Exif\0\0" + tiff + b"\0\0\0\0", encoded, before)


def app1(payload, encoded, before=b""):
    """`encoded` with an APP1 segment holding `payload` right after its
    start-of-image marker (and `before` ahead of it)."""
    segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    return encoded[:2] + before + segment + encoded[2:]


def upright(encoded):
    """The reference: Pillow turns the file by the orientation it reads.
    Pillow's JPEG decoder differs from TensorFlow's by a few levels here
    and there, so Pillow turns TensorFlow's pixels, and a second check
    compares with Pillow's own decode on average."""
    reference = ImageOps.exif_transpose(Image.open(io.BytesIO(encoded))).convert("RGB")
    stored = Image.fromarray(tf.io.decode_image(encoded, channels=3).numpy())
    stored.getexif()[0x0112] = Image.open(io.BytesIO(encoded)).getexif().get(0x0112, 1)
    turned = np.asarray(ImageOps.exif_transpose(stored))
    assert turned.shape == np.asarray(reference).shape
    assert np.abs(turned.astype(int) - np.asarray(reference).astype(int)).mean() < 3  # a wrong turn: tens of levels
    return turned


def assert_close(ours, reference, atol=0):
    assert ours.shape == reference.shape
    assert np.abs(ours.astype(int) - reference.astype(int)).max() <= atol


def test_the_module_examples_run():
    assert doctest.testmod(exif).failed == 0


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_each_orientation_decodes_as_pillow_turns_it(photo, orientation):
    encoded = jpeg(photo, orientation)
    assert int(exif.orientation(encoded)) == orientation
    assert_close(augment.decode_image(encoded).numpy(), upright(encoded))
    if orientation in (6, 8):  # a quarter turn: stored 40 x 64, shown 64 x 40
        assert augment.decode_image(encoded).shape == (64, 40, 3)


@pytest.mark.parametrize("orientation", (3, 6, 8))
def test_little_endian_exif_and_segments_before_it_are_read(photo, orientation):
    icc = b"\xff\xe2" + struct.pack(">H", 16) + b"ICC_PROFILE\0" + b"\0\0"
    for encoded in (jpeg(photo, orientation, little_endian=True),
                    jpeg(photo, orientation, little_endian=True, before=icc),
                    jpeg(photo, orientation, before=icc)):
        assert int(exif.orientation(encoded)) == orientation
        assert_close(augment.decode_image(encoded).numpy(), upright(encoded))


def test_images_without_exif_and_other_formats_are_as_stored(photo):
    array = np.asarray(photo)
    png = tf.io.encode_png(array).numpy()
    assert int(exif.orientation(png)) == 1
    np.testing.assert_array_equal(augment.decode_image(png).numpy(), array)
    assert int(exif.orientation(jpeg(photo))) == 1


def test_a_crafted_exif_block_reads_as_stored_and_still_decodes(photo):
    plain = jpeg(photo)
    stored = augment.decode_image(plain).numpy()
    le = struct.pack  # little-endian TIFF pieces
    crafted = {
        "value 9": b"II*\0" + le("<I", 8) + le("<H", 1) + le("<HHIHH", 0x0112, 3, 1, 9, 0),
        "value 0": b"II*\0" + le("<I", 8) + le("<H", 1) + le("<HHIHH", 0x0112, 3, 1, 0, 0),
        "directory past the file": b"II*\0" + le("<I", 0xFFFFFFF0),
        "65,535 entries, none there": b"II*\0" + le("<I", 8) + le("<H", 0xFFFF),
        "no byte order": b"XX*\0" + le("<I", 8) + le("<H", 1) + le("<HHIHH", 0x0112, 3, 1, 6, 0),
        "truncated": b"II*",
        "empty": b"",
    }
    for name, tiff in crafted.items():
        encoded = app1(b"Exif\0\0" + tiff, plain)
        assert int(exif.orientation(encoded)) == 1, name
        np.testing.assert_array_equal(augment.decode_image(encoded).numpy(), stored, err_msg=name)
    # a segment whose length runs past the file, and one that says 0 bytes
    for broken in (plain[:2] + b"\xff\xe1\xff\xff", plain[:2] + b"\xff\xe1\0\0" + plain[2:]):
        assert int(exif.orientation(broken)) == 1


def test_the_tag_after_the_segment_limit_is_not_searched_for(photo):
    """MAX_SEGMENTS bounds the walk: EXIF behind more segments is not read."""
    filler = (b"\xff\xe2" + struct.pack(">H", 4) + b"\0\0") * exif.MAX_SEGMENTS
    assert int(exif.orientation(jpeg(photo, 6, before=filler))) == 1
    assert int(exif.orientation(jpeg(photo, 6, before=filler[:-6 * 2]))) == 6


def test_the_inception_crop_turns_its_window_upright(photo):
    """The same JPEG data with orientation 1 and 6 and the same seed: the
    window is drawn in the stored image, so the crops are one quarter turn
    apart."""
    seed = tf.constant([3, 4], tf.int64)
    stored = augment.decode_and_inception_crop(jpeg(photo, 1), (24, 24), seed)
    turned = augment.decode_and_inception_crop(jpeg(photo, 6), (24, 24), seed)
    np.testing.assert_allclose(turned.numpy(), np.rot90(stored.numpy(), -1), atol=1e-3)


def test_a_folder_dataset_and_the_cli_give_the_photo_upright(photo, tmp_path):
    """A phone's portrait photo in a training folder and on the CLI."""
    encoded = jpeg(photo, 6)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "portrait.jpg").write_bytes(encoded)
    dataset = data.make_dataset(f"folder:{tmp_path}", "train", image_size=(64, 40),
                                batch_size=1, holdout=0.0)
    images, _ = next(iter(dataset))
    assert_close(np.round(images[0].numpy()).astype("uint8"), upright(encoded), atol=1)
    assert_close(prediction.read_image(str(tmp_path / "a" / "portrait.jpg")).numpy(),
                 upright(encoded))


def test_a_tfrecord_gives_the_photo_upright(photo, tmp_path):
    """A record holds the file's bytes, tag included (as `tf_records build`
    writes them: `test_tf_records.py`): the pipeline gives the photo
    upright, as from a folder."""
    from keras_vit.data import schema

    encoded = jpeg(photo, 8)
    with tf.io.TFRecordWriter(str(tmp_path / "train-00000-of-00001")) as writer:
        for label in (0, 1):
            writer.write(schema.encode_example(encoded, label, image_format="JPEG",
                                               height=40, width=64))
    dataset = data.make_dataset(f"tfrecord:{tmp_path}", "train", image_size=(64, 40),
                                batch_size=2, num_classes=2)
    images, _ = next(iter(dataset))
    for image in images.numpy():
        assert_close(np.round(image).astype("uint8"), upright(encoded), atol=1)
