"""The data layer at its edges: class names that cannot be a line of
labels.txt, `skipped_corrupt` counting distinct files, entries that cannot
be read, and images too large to decode. Folders of real digit scans and
crafted files, made in the test."""

import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli, tiny_keras_file, tiny_vit
from data_helpers import corrupt_png, iterate, undecodable_png, write_digit_folder
from keras_vit import data, labels
from keras_vit.data import sample, sources
from official_fixtures import REPO_ROOT

# The tiny ViT (conftest.py) for the 8x8 digit scans, with a logits head.
TINY_8PX = dict(patch_size=4, input_shape=(8, 8, 3), classifier_activation=None,
                classifier="gap")


def _chunk(kind, payload):
    return (struct.pack(">I", len(payload)) + kind + payload
            + struct.pack(">I", zlib.crc32(kind + payload)))


def zeros_png(width, height, rows=1000):
    """A valid 8-bit greyscale PNG of zeros, `width` x `height`, written
    without compressing all of it: each block of `rows` rows is compressed
    once and ends in a full flush, so the blocks' bytes repeat; then an
    empty final block and the Adler-32 of all those zeros (a = 1,
    b = length mod 65521)."""
    assert height % rows == 0
    block = bytes((width + 1) * rows)  # a filter byte (0) and the pixels of each row
    compress = zlib.compressobj(9)
    first = compress.compress(block) + compress.flush(zlib.Z_FULL_FLUSH)
    again = compress.compress(block) + compress.flush(zlib.Z_FULL_FLUSH)
    adler = ((width + 1) * height % 65521) << 16 | 1
    idat = first + again * (height // rows - 1) + b"\x03\x00" + struct.pack(">I", adler)
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat)
            + _chunk(b"IEND", b""))


def folder(tmp_path, per_class=4):
    root = str(tmp_path / "d")
    return root, write_digit_folder(root, per_class=per_class)


# --- class names that cannot be a line of labels.txt -----------------

def test_the_label_line_rule_known_answers():
    assert labels.label_line_problem("a\nb") == "a line break ('\\n')"
    assert labels.label_line_problem("a\rb") == "a line break ('\\r')"
    assert labels.label_line_problem("a\u2028b") == "a line break ('\\u2028')"
    assert labels.label_line_problem("a\tb") == "a control character ('\\t')"
    assert labels.label_line_problem("a\x00b") == "a control character ('\\x00')"
    assert labels.label_line_problem("b\udcffad") == "an undecodable byte (the name is not UTF-8)"
    for fine in ("tabby cat", "caf\u00e9", "\u732b", "n01440764 tench, Tinca tinca", "a/b?"):
        assert labels.label_line_problem(fine) is None


def test_a_class_folder_with_a_line_break_is_refused_at_listing(tmp_path):
    root, _ = folder(tmp_path)
    os.rename(os.path.join(root, "1"), os.path.join(root, "a\nb"))
    bad = os.path.join(root, "a\nb")
    message = (f"Class folder {bad!r} has a name holding a line break ('\\n'); class names "
               "are written one per line (labels.txt, the export label files), so rename "
               "it: a class name may hold any printable characters and spaces, but no line "
               "breaks, tabs or other control characters.")
    for call in (lambda: data.make_dataset(f"folder:{root}", image_size=8, holdout=0),
                 lambda: data.open_source(f"folder:{root}", "validation"),
                 lambda: sources.list_folder(root)):
        with pytest.raises(ValueError) as info:
            call()
        assert str(info.value) == message


def test_a_split_layout_class_folder_with_a_tab_is_refused(tmp_path):
    root = str(tmp_path / "d")
    write_digit_folder(os.path.join(root, "train"), per_class=2)
    write_digit_folder(os.path.join(root, "test"), per_class=2, digits=(0,))
    os.mkdir(os.path.join(root, "test", "x\ty"))  # only in the other split: still a class
    with pytest.raises(ValueError, match=r"^Class folder '.*/test/x\\ty' has a name holding "
                                         r"a control character \('\\t'\); class names"):
        data.open_source(f"folder:{root}", "train")


def test_export_label_files_use_the_same_rule():
    from keras_vit.export import tflite_metadata

    with pytest.raises(ValueError, match=r"^Class name 'b\\tc' holds a control character "
                                         r"\('\\t'\); the label file has one name per line"):
        tflite_metadata.classifier_labels(None, 2, labels=["a", "b\tc"])


# --- skipped_corrupt counts distinct files --------------------------

@pytest.mark.parametrize("damage", [corrupt_png, undecodable_png])
def test_one_corrupt_file_counts_once_over_one_and_many_epochs(tmp_path, damage):
    root, written = folder(tmp_path)
    damage(written[5])
    dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                      holdout=0, skip_corrupt=True, with_info=True)
    assert iterate(dataset) == 11 and info.skipped_corrupt == 1
    for _ in range(3):  # the same dataset, read again
        assert iterate(dataset) == 11
    assert info.skipped_corrupt == 1
    # training: shuffled, repeated, read ahead; 30 batches of 4 are 10+ epochs
    dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                      holdout=0, skip_corrupt=True, with_info=True,
                                      training=True, repeat=True, seed=0)
    assert sum(int(x.shape[0]) for x, _ in dataset.take(30)) == 120
    assert info.skipped_corrupt == 1


def test_a_partial_epoch_counts_the_files_read_so_far_once(tmp_path):
    root, written = folder(tmp_path)
    corrupt_png(written[2])
    corrupt_png(written[9])
    dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                      holdout=0, skip_corrupt=True, with_info=True,
                                      training=True, repeat=True, seed=0)
    assert info.skipped_corrupt == 0  # nothing read yet
    # the shuffle buffer holds the whole epoch, so one batch read all of it
    assert sum(int(x.shape[0]) for x, _ in dataset.take(1)) == 4
    assert info.skipped_corrupt == 2


def test_train_reports_distinct_skipped_files(tmp_path):
    from keras_vit import training

    root = str(tmp_path / "d")
    written = write_digit_folder(os.path.join(root, "train"), per_class=4)
    write_digit_folder(os.path.join(root, "test"), per_class=2, offset=4)
    corrupt_png(written[1])
    model = tiny_vit(**TINY_8PX)
    results = training.train(model, f"folder:{root}", recipe="scratch", image_size=8,
                             batch_size=4, epochs=4, steps_per_epoch=3, skip_corrupt=True,
                             out=str(tmp_path / "run"), verbose=0)
    assert results["skipped_corrupt"] == {"train": 1, "validation": 0}


# --- entries that cannot be read -----------------------------------

def unreadable_entries(root):
    """A dangling symbolic link, a symbolic link loop, a directory and a FIFO,
    each named like an image in class "1"; returns their paths, sorted."""
    entries = [os.path.join(root, "1", name) for name in
               ("a_dangling.png", "b_loop.png", "c_folder.png", "d_fifo.png")]
    os.symlink(os.path.join(root, "nowhere.png"), entries[0])
    os.symlink(entries[1], entries[1])
    os.mkdir(entries[2])
    os.mkfifo(entries[3])  # reading it would wait forever
    return entries


def test_unreadable_entries_are_named_at_listing_or_counted(tmp_path):
    root, _ = folder(tmp_path)
    entries = unreadable_entries(root)
    with pytest.raises(ValueError) as info:
        data.make_dataset(f"folder:{root}", image_size=8, holdout=0)
    assert str(info.value) == (
        f"Cannot read image file {entries[0]!r} (a symbolic link to "
        f"{os.path.join(root, 'nowhere.png')!r}, which does not exist); 3 more in "
        f"folder:{root} cannot be read either; pass skip_corrupt=True (keras-vit: "
        "--skip-corrupt) to skip and count such files.")
    assert [sources._unreadable(path) for path in entries[1:]] == [
        "a symbolic link loop", "a directory", "not a regular file"]
    dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                      holdout=0, skip_corrupt=True, with_info=True)
    assert info.skipped_corrupt == 4 and info.num_examples == 12
    assert iterate(dataset) == 12 and iterate(dataset) == 12 and info.skipped_corrupt == 4
    with pytest.raises(ValueError, match=r"^Cannot read image file .*; remove or repair it\.$"):
        sources.list_folder(root)
    os.remove(entries[0])
    loop = re.escape(repr(entries[1]))
    with pytest.raises(ValueError, match=rf"^Cannot read image file {loop} \(a symbolic link "
                                         r"loop\); 2 more in folder:"):
        data.make_dataset(f"folder:{root}", image_size=8, holdout=0)


def test_unreadable_entries_keep_the_holdout_of_the_other_files(tmp_path):
    root, _ = folder(tmp_path, per_class=10)
    before = sources.list_folder(root, "validation", holdout=0.2)[0]
    held = [p for p in before if os.sep + "1" + os.sep in p]
    os.remove(held[0])
    os.symlink(os.path.join(root, "gone.png"), held[0])
    src = data.open_source(f"folder:{root}", "validation", holdout=0.2, skip_corrupt=True)
    assert src.skipped == [held[0]]
    assert [p.decode() for p, _ in src.records.as_numpy_iterator()] == \
        [p for p in before if p != held[0]]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_a_file_without_read_permission_is_named(tmp_path):
    root, written = folder(tmp_path)
    os.chmod(written[0], 0)
    with pytest.raises(ValueError, match=r"\(no permission to read it\); pass skip_corrupt"):
        data.make_dataset(f"folder:{root}", image_size=8, holdout=0)


def test_export_samples_name_or_count_unreadable_entries(tmp_path):
    root, _ = folder(tmp_path)
    dangling = os.path.join(root, "2", "zz.png")
    os.symlink(os.path.join(root, "nowhere.png"), dangling)
    with pytest.raises(ValueError, match=r"^Cannot read image file .*zz\.png' \(a symbolic"):
        sample.sample_images(f"folder:{root}", "train", image_size=8, count=6, holdout=0)
    picked = sample.sample_images(f"folder:{root}", "train", image_size=8, count=6,
                                  holdout=0, skip_corrupt=True)
    assert picked.skipped_corrupt == [dangling] and len(picked.images) == 6


def test_cli_train_names_a_dangling_link_in_one_line(tmp_path):
    root, _ = folder(tmp_path)
    dangling = os.path.join(root, "0", "x.png")
    os.symlink("missing.png", dangling)
    code, _, err = run_cli("train", "--model", "ViTTi16", "--data", f"folder:{root}",
                           "--steps", "1", "--image-size", "8", "--out", tmp_path / "run")
    err = err.strip().splitlines()
    assert code == 2
    assert err[-1] == (f"keras-vit: error: Cannot read image file {dangling!r} (a symbolic "
                       "link to 'missing.png', which does not exist); pass skip_corrupt=True "
                       "(keras-vit: --skip-corrupt) to skip and count such files.")


# --- images too large to decode ------------------------------------

def test_header_shape_known_answers(tmp_path):
    from PIL import Image

    png = tf.io.encode_png(np.zeros((3, 5, 3), "uint8"))
    jpeg = tf.io.encode_jpeg(np.zeros((7, 2, 3), "uint8"))
    encoded = {"png": png.numpy(), "jpeg": jpeg.numpy()}
    for kind in ("gif", "bmp"):
        path = tmp_path / f"x.{kind}"
        Image.new("RGB", (6, 4)).save(path)
        encoded[kind] = path.read_bytes()
    for kind, raw in encoded.items():
        decoded = tf.io.decode_image(raw, channels=3, expand_animations=False)
        assert [int(x) for x in data.header_shape(raw)] == list(decoded.shape[:2]), kind
    assert [int(x) for x in data.header_shape(zeros_png(30000, 30000)[:40])] == [30000, 30000]
    assert [int(x) for x in data.header_shape(b"not an image")] == [0, 0]


def test_the_crafted_png_is_a_real_png():
    assert tf.io.decode_png(zeros_png(300, 200, rows=100)).shape == (200, 300, 1)


def test_max_image_pixels_bound(monkeypatch):
    monkeypatch.delenv("KERAS_VIT_MAX_IMAGE_PIXELS", raising=False)
    assert data.max_image_pixels() == 178_956_970
    monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", "1000")
    assert data.max_image_pixels() == 1000
    for bad in ("0", "-5", "lots", "1e9"):
        monkeypatch.setenv("KERAS_VIT_MAX_IMAGE_PIXELS", bad)
        with pytest.raises(ValueError, match=rf"^KERAS_VIT_MAX_IMAGE_PIXELS must be a "
                                             rf"positive whole number of pixels \(e.g. "
                                             rf"178956970\), got '{bad}'\.$"):
            data.make_dataset("folder:/does-not-matter", image_size=8)


def test_a_30000_px_png_is_named_or_skipped_and_counted(tmp_path):
    root, _ = folder(tmp_path)
    huge = os.path.join(root, "2", "huge.png")
    with open(huge, "wb") as f:
        f.write(zeros_png(30000, 30000))
    for training in (False, True):
        dataset = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4, holdout=0,
                                    training=training, seed=0)
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            iterate(dataset)
        assert str(data.data_error(info.value)) == (
            f"Image file {huge!r} is 30000x30000 = 900,000,000 pixels, more than the bound "
            "of 178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass skip_corrupt=True "
            "(keras-vit: --skip-corrupt) to skip and count such files, or raise the bound.")
        dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                          holdout=0, training=training, seed=0,
                                          drop_remainder=False, skip_corrupt=True,
                                          with_info=True)
        assert iterate(dataset) == 12 and info.skipped_corrupt == 1


def test_cli_train_names_a_huge_image_in_one_line(tmp_path):
    root, _ = folder(tmp_path)
    huge = os.path.join(root, "0", "huge.png")
    with open(huge, "wb") as f:
        f.write(zeros_png(30000, 30000))
    model = tiny_keras_file(tmp_path / "tiny.keras", **TINY_8PX)
    code, _, err = run_cli("train", "--model", model, "--data", f"folder:{root}", "--recipe",
                           "scratch", "--batch-size", "4", "--epochs", "1", "--holdout",
                           "0.25", "--quiet", "--out", tmp_path / "run")
    err = err.strip().splitlines()
    assert code == 2
    assert err[-1] == (
        f"keras-vit: error: Image file {huge!r} is 30000x30000 = 900,000,000 pixels, more "
        "than the bound of 178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass skip_corrupt=True "
        "(keras-vit: --skip-corrupt) to skip and count such files, or raise the bound.")


def test_the_pixel_bound_is_checked_before_decoding_within_a_memory_limit(tmp_path):
    """A 20000 x 20000 PNG (389 KB) that TensorFlow would decode into 1.2 GB:
    under RLIMIT_AS = the warmed-up process + 1 GiB (where decoding it runs
    out of memory), the pipeline names it, or skips and counts it."""
    warm_up = str(tmp_path / "warm")
    write_digit_folder(warm_up, per_class=1)
    root, _ = folder(tmp_path, per_class=2)
    huge = os.path.join(root, "0", "huge.png")
    with open(huge, "wb") as f:
        f.write(zeros_png(20000, 20000))
    code = textwrap.dedent(f"""
        import resource
        import tensorflow as tf
        from keras_vit import data
        for skip in (False, True):  # start both pipelines' threads before the limit
            list(data.make_dataset("folder:" + {warm_up!r}, image_size=8, holdout=0,
                                   skip_corrupt=skip))
        status = open("/proc/self/status").read()
        size = int(status.split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
        try:
            list(data.make_dataset("folder:" + {root!r}, image_size=8, holdout=0))
        except tf.errors.InvalidArgumentError as error:
            print(data.data_error(error))
        dataset, info = data.make_dataset("folder:" + {root!r}, image_size=8, batch_size=2,
                                          holdout=0, skip_corrupt=True, with_info=True)
        print(sum(int(x.shape[0]) for x, _ in dataset), info.skipped_corrupt)
        """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_ARENA_MAX="2")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, cwd=REPO_ROOT, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-2:] == [
        f"Image file {huge!r} is 20000x20000 = 400,000,000 pixels, more than the bound of "
        "178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass skip_corrupt=True (keras-vit: "
        "--skip-corrupt) to skip and count such files, or raise the bound.",
        "6 1"]


def test_export_samples_name_or_skip_a_huge_image_without_decoding_it(tmp_path):
    """The images an export is verified on pass the same pixel bound: a
    30000 x 30000 PNG (a 3.6 GB decode) is named, or skipped and listed."""
    root, _ = folder(tmp_path)
    huge = os.path.join(root, "2", "huge.png")
    with open(huge, "wb") as f:
        f.write(zeros_png(30000, 30000))
    with pytest.raises(ValueError) as info:
        sample.sample_images(f"folder:{root}", "train", image_size=8, count=None, holdout=0)
    assert str(info.value) == (
        f"Image file {huge!r} is 30000x30000 = 900,000,000 pixels, more than the bound of "
        "178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass skip_corrupt=True (keras-vit: "
        "--skip-corrupt) to leave such files out of the sample, or raise the bound.")
    picked = sample.sample_images(f"folder:{root}", "train", image_size=8, count=None,
                                  holdout=0, skip_corrupt=True)
    assert len(picked.images) == 12 and len(picked.skipped_corrupt) == 1


def test_cli_predict_names_or_skips_a_huge_image_without_decoding_it(tmp_path):
    huge = str(tmp_path / "huge.png")
    with open(huge, "wb") as f:
        f.write(zeros_png(30000, 30000))
    small = str(tmp_path / "small.png")
    with open(small, "wb") as f:
        f.write(tf.io.encode_png(np.zeros((8, 8, 3), "uint8")).numpy())
    model = tiny_keras_file(tmp_path / "tiny.keras", **TINY_8PX)
    code, _, err = run_cli("predict", huge, small, "--model", model)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"keras-vit: error: Image file {huge!r} is 30000x30000 = 900,000,000 pixels, more "
        "than the bound of 178,956,970 (KERAS_VIT_MAX_IMAGE_PIXELS); pass --skip-corrupt to "
        "skip such files, or raise the bound.")
    code, out, _ = run_cli("predict", huge, small, "--model", model, "--skip-corrupt", "--json")
    assert code == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert [p["image"] for p in result["predictions"]] == [small]
