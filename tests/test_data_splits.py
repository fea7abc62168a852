"""Folder layouts (split subfolders or a stratified holdout) and corrupt files,
on real folders of scikit-learn's handwritten digits."""

import hashlib
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from data_helpers import corrupt_png, iterate, undecodable_png, write_digit_folder

from keras_vit import data
from keras_vit.data import sources

PER_CLASS = 20


def files(source, split, **kwargs):
    src = data.open_source(source, split, **kwargs)
    return [p.decode() for p, _ in src.records.as_numpy_iterator()], src


def relative(paths, root):
    return {os.path.relpath(p, root) for p in paths}


@pytest.fixture
def class_folder(tmp_path):
    root = tmp_path / "digits"
    write_digit_folder(str(root))
    return str(root)


# --- class layout: the stratified holdout -----------------------------------

def test_holdout_is_stratified_disjoint_and_complete(class_folder):
    train, train_src = files(f"folder:{class_folder}", "train")
    val, val_src = files(f"folder:{class_folder}", "validation")
    assert not set(train) & set(val)
    assert len(train) + len(val) == 3 * PER_CLASS
    assert len(val) == 3 * max(1, round(0.1 * PER_CLASS))  # 2 of each class
    assert sorted(set(val_src.labels)) == [0, 1, 2] and val_src.classes_present == 3
    assert train_src.class_names == val_src.class_names == ["0", "1", "2"]
    assert val_src.split_kind == train_src.split_kind == "holdout"
    assert val_src.description == f"folder:{class_folder} (validation: 10% holdout)"
    assert train_src.description == f"folder:{class_folder} (train: 10% of each class held out)"
    # every held-out name is an alias of the same files
    for split in ("val", "valid", "test", "holdout"):
        assert files(f"folder:{class_folder}", split)[0] == val


def test_holdout_is_deterministic_and_stable_when_a_class_is_added(class_folder):
    first, _ = files(f"folder:{class_folder}", "validation", holdout=0.25)
    again, _ = files(f"folder:{class_folder}", "validation", holdout=0.25)
    assert first == again
    write_digit_folder(class_folder, digits=(7,))
    after, src = files(f"folder:{class_folder}", "validation", holdout=0.25)
    assert src.class_names == ["0", "1", "2", "7"]
    assert relative(first, class_folder) < relative(after, class_folder)
    added = relative(after, class_folder) - relative(first, class_folder)
    assert {p.split(os.sep)[0] for p in added} == {"7"}
    assert len(first) == 3 * 5  # round(0.25 * 20)


def test_holdout_does_not_depend_on_python_hash_seed(class_folder):
    """The held-out files are those of the sha1 order of 'class/file'."""
    _, src = files(f"folder:{class_folder}", "validation")
    expected = []
    for name in ("0", "1", "2"):
        names = [f"{name}/{f:04d}.png" for f in range(PER_CLASS)]
        names.sort(key=lambda p: hashlib.sha1(p.encode()).hexdigest())
        expected += names[:2]
    got, _ = files(f"folder:{class_folder}", "validation")
    assert relative(got, class_folder) == {p.replace("/", os.sep) for p in expected}


def test_holdout_log_line_once(class_folder, caplog):
    caplog.set_level(logging.INFO, logger="keras_vit")
    files(f"folder:{class_folder}", "train")
    files(f"folder:{class_folder}", "validation")
    data.make_dataset(f"folder:{class_folder}", "validation", image_size=8, batch_size=4)
    lines = [r.getMessage() for r in caplog.records if "holding out" in r.getMessage()]
    assert lines == [
        f"folder:{class_folder} has no train/validation/test subfolders: holding out 10% of "
        "each class (6 of 60 images, chosen by a stable hash of each file's path) as the "
        "validation split."]
    files(f"folder:{class_folder}", "validation", holdout=0.2)  # another holdout: its own line
    lines = [r.getMessage() for r in caplog.records if "holding out" in r.getMessage()]
    assert len(lines) == 2 and "holding out 20% of each class (12 of 60 images" in lines[1]


def test_holdout_says_the_real_fraction_when_rounding_changes_it(tmp_path, caplog):
    """9 images, 3 a class: 10% of each class rounds to one image, 3 of 9."""
    caplog.set_level(logging.INFO, logger="keras_vit")
    root = str(tmp_path / "nine")
    write_digit_folder(root, per_class=3)
    _, train_src = files(f"folder:{root}", "train")
    _, val_src = files(f"folder:{root}", "validation")
    lines = [r.getMessage() for r in caplog.records if "holding out" in r.getMessage()]
    assert lines == [
        f"folder:{root} has no train/validation/test subfolders: holding out 33% of the "
        "images, not 10% (3 of 9: 10% of each class rounded to whole images, at least one "
        "of each class of 2 or more), chosen by a stable hash of each file's path, as the "
        "validation split."]
    assert train_src.description == (
        f"folder:{root} (train: 10% of each class held out: 3 of 9 images, 33%)")
    assert val_src.description == f"folder:{root} (validation: 10% holdout: 3 of 9 images, 33%)"


def test_make_dataset_on_the_holdout(class_folder):
    dataset, info = data.make_dataset(f"folder:{class_folder}", "validation", image_size=8,
                                      batch_size=4, with_info=True)
    labels = np.concatenate([y.numpy().argmax(1) for _, y in dataset])
    assert info.num_examples == 6 and info.classes_present == 3 and info.num_classes == 3
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]
    assert info.description == f"folder:{class_folder} (validation: 10% holdout)"
    _, info = data.make_dataset(f"folder:{class_folder}", image_size=8, batch_size=4,
                                holdout=0, with_info=True)
    assert info.num_examples == 60
    assert info.description == f"folder:{class_folder} (train: all images, no holdout)"


def test_single_image_class_stays_in_train(tmp_path):
    root = str(tmp_path / "d")
    write_digit_folder(root, digits=(0, 1), per_class=10)
    write_digit_folder(root, digits=(5,), per_class=1)
    train, train_src = files(f"folder:{root}", "train", holdout=0.5)
    val, val_src = files(f"folder:{root}", "validation", holdout=0.5)
    assert len(val) == 10 and val_src.classes_present == 2
    assert val_src.class_names == ["0", "1", "5"]  # all classes, labels consistent
    assert train_src.labels.count(2) == 1 and 2 not in val_src.labels
    # a class is never emptied by a large holdout
    train, train_src = files(f"folder:{root}", "train", holdout=0.99)
    assert train_src.classes_present == 3


def test_holdout_bad_values(class_folder):
    source = f"folder:{class_folder}"
    for error, bad in ((ValueError, -0.1), (ValueError, 1), (ValueError, 1.5),
                       (TypeError, "0.1"), (TypeError, True), (TypeError, None)):
        with pytest.raises(error, match=re.escape(
                f"`holdout` must be a number in [0, 1) (the fraction of each class held out "
                f"for validation, e.g. 0.1), got {bad!r}.")):
            data.open_source(source, "train", holdout=bad)
    with pytest.raises(ValueError, match=re.escape(
            f"{source} has no split subfolders and holdout=0, so there is no held-out set "
            "for split 'validation'.")):
        data.make_dataset(source, "validation", holdout=0)
    with pytest.raises(ValueError, match=re.escape(
            f"{source} has no split subfolders (train, validation, val, valid, test), so its "
            "splits are 'train' and the held-out 'validation', 'val', 'valid', 'test', "
            "'holdout'; got split='extra'.")):
        data.open_source(source, "extra")


def test_holdout_is_ignored_by_other_sources():
    pytest.importorskip("tensorflow_datasets")
    import tensorflow_datasets as tfds
    with tfds.testing.mock_data(num_examples=4):
        _, info = data.make_dataset("tfds:mnist", "train", image_size=8, batch_size=2,
                                    holdout=0.5, with_info=True)
    assert info.classes_present is None and info.description.startswith("tfds:mnist")


# --- split layout -------------------------------------------------------------

@pytest.fixture
def split_folder(tmp_path):
    root = tmp_path / "digits"
    write_digit_folder(str(root / "train"), per_class=6)
    write_digit_folder(str(root / "test"), digits=(0, 2), per_class=3, offset=6)
    return str(root)


def test_split_layout_uses_the_subfolder_and_all_classes(split_folder):
    test, src = files(f"folder:{split_folder}", "test")
    assert len(test) == 6 and all(os.sep + "test" + os.sep in p for p in test)
    assert src.class_names == ["0", "1", "2"]  # union: '1' has no test images
    assert sorted(set(src.labels)) == [0, 2] and src.classes_present == 2
    assert src.split_kind == "folder" and src.description == f"folder:{split_folder} (test)"
    train, src = files(f"folder:{split_folder}", "train")
    assert len(train) == 18 and src.classes_present == 3


def test_split_layout_missing_split_names_the_split_and_those_there_are(split_folder):
    with pytest.raises(ValueError) as info:
        data.make_dataset(f"folder:{split_folder}", "validation", image_size=8)
    assert str(info.value) == (f"folder:{split_folder} has no split 'validation': its split "
                               "subfolders are 'test', 'train'.")
    with pytest.raises(ValueError, match=re.escape(
            f"folder:{split_folder} has no split 'holdout': its split subfolders are 'test', "
            "'train'.")):
        data.open_source(f"folder:{split_folder}", "holdout")


def test_split_layout_validation_aliases(tmp_path):
    root = str(tmp_path / "d")
    write_digit_folder(os.path.join(root, "train"), per_class=4)
    write_digit_folder(os.path.join(root, "val"), per_class=2, offset=4)
    os.makedirs(os.path.join(root, "notes"))
    val, src = files(f"folder:{root}", "validation")
    assert len(val) == 6 and src.description == f"folder:{root} (validation: subfolder 'val')"
    with pytest.raises(ValueError, match=re.escape(
            f"folder:{root} has no split 'test': its split subfolders are 'train', 'val'. "
            "(Its other subfolders, 'notes', are not splits.)")):
        data.open_source(f"folder:{root}", "test")


def test_a_class_named_test_with_images_is_a_class(tmp_path):
    """`test` holding images (not subfolders) is no split folder."""
    root = str(tmp_path / "d")
    write_digit_folder(root, digits=(0, 1), per_class=4)
    os.rename(os.path.join(root, "1"), os.path.join(root, "test"))
    _, src = files(f"folder:{root}", "train")
    assert src.split_kind == "holdout" and src.class_names == ["0", "test"]


def test_quickstart_layout(tmp_path):
    """The quickstart's digits folder: train/ and test/, validation falls back clearly."""
    from keras_vit.training.quickstart import write_digits as quickstart_digits
    root = str(tmp_path / "q")
    counts = quickstart_digits(root, size=8)
    _, info = data.make_dataset(f"folder:{root}", "test", image_size=8, batch_size=64,
                                with_info=True)
    assert info.num_examples == counts["test"] and info.classes_present == 10
    with pytest.raises(ValueError, match=r"has no split 'validation': its split subfolders "
                                         r"are 'test', 'train'\.$"):
        data.make_dataset(f"folder:{root}", "validation", image_size=8)


# --- corrupt files ---------------------------------------------------------------

def test_corrupt_file_without_skip_is_one_line_naming_it(tmp_path):
    root = str(tmp_path / "d")
    victim = write_digit_folder(root, per_class=4)[5]
    corrupt_png(victim)
    dataset = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4, holdout=0)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        iterate(dataset)
    converted = data.data_error(info.value)
    assert isinstance(converted, ValueError)
    assert str(converted) == (
        f"Corrupt or non-image file {victim!r}; pass skip_corrupt=True (keras-vit: "
        "--skip-corrupt) to skip and count such files.")
    dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                      holdout=0, skip_corrupt=True, with_info=True)
    assert iterate(dataset) == 11 and info.skipped_corrupt == 1


def test_corrupt_file_during_fit(tmp_path):
    """What Keras' fit raises still converts."""
    import keras

    root = str(tmp_path / ("d w[eird] 'name' caf\u00e9 \"q\" back\\slash ] [x" + "y" * 200))
    victim = write_digit_folder(root, per_class=4)[2]
    corrupt_png(victim)
    dataset = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4, holdout=0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    model.compile(loss="categorical_crossentropy")
    with pytest.raises(Exception) as info:
        model.fit(dataset, epochs=1, verbose=0)
    converted = data.data_error(info.value)
    assert converted is not None and "\n" not in str(converted)
    assert str(converted).startswith(f"Corrupt or non-image file {victim!r}; pass ")


def test_undecodable_file_passing_the_structural_check(tmp_path):
    root = str(tmp_path / "d")
    victim = write_digit_folder(root, per_class=4)[7]
    undecodable_png(victim)
    assert bool(data.looks_like_image(tf.constant(open(victim, "rb").read())))
    dataset = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4, holdout=0)
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        iterate(dataset)
    converted = data.data_error(info.value)
    assert str(converted).startswith("An image file could not be decoded (TensorFlow: Invalid "
                                     "PNG")
    assert "pass skip_corrupt=True" in str(converted).replace("Pass", "pass")
    for training in (False, True):
        dataset, info = data.make_dataset(f"folder:{root}", image_size=8, batch_size=4,
                                          holdout=0, skip_corrupt=True, training=training,
                                          drop_remainder=False, seed=0, with_info=True)
        assert iterate(dataset) == 11 and info.skipped_corrupt == 1


def test_skip_corrupt_keeps_the_pixels_and_the_order(tmp_path):
    root = str(tmp_path / "d")
    write_digit_folder(root, per_class=4)
    plain = data.make_dataset(f"folder:{root}", image_size=8, batch_size=5, holdout=0)
    skipping = data.make_dataset(f"folder:{root}", image_size=8, batch_size=5, holdout=0,
                                 skip_corrupt=True)
    for (a, la), (b, lb) in zip(plain, skipping, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(la.numpy(), lb.numpy())
    kwargs = dict(image_size=8, batch_size=4, holdout=0, training=True, preset="light1", seed=3)
    a = [x.numpy() for x, _ in data.make_dataset(f"folder:{root}", **kwargs)]
    b = [x.numpy() for x, _ in data.make_dataset(f"folder:{root}", skip_corrupt=True, **kwargs)]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_data_error_label_out_of_range_and_other_errors():
    @tf.function
    def fail(name, label):
        k = 3  # the pipeline's Assert, verbatim
        tf.debugging.Assert(tf.logical_and(label >= 0, label < k),
                            [f"Label out of range [0, {k}) for", name, "label", label])
        return label

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        fail(tf.constant("shard-00001 #7"), tf.constant(3, tf.int64))
    assert str(data.data_error(info.value)).startswith(
        "Label 3 of 'shard-00001 #7' is out of range [0, 3): the data has 3 classes.")
    assert data.data_error(ValueError("something else")) is None
    assert data.data_error(tf.errors.InvalidArgumentError(None, None, "Incompatible shapes")) \
        is None


def test_non_image_files_are_logged(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="keras_vit")
    root = str(tmp_path / "d")
    write_digit_folder(root, per_class=3)
    open(os.path.join(root, "0", "readme.txt"), "w").close()
    open(os.path.join(root, "0", ".DS_Store"), "w").close()
    _, src = files(f"folder:{root}", "train", holdout=0)
    assert src.num_examples == 9
    assert any(f"{root}: left out 1 file without an image extension" in r.getMessage()
               for r in caplog.records)


def test_split_folder_names_constant():
    assert sources.SPLIT_FOLDER_NAMES == ("train", "validation", "val", "valid", "test")
    assert data.SPLIT_FOLDER_NAMES is sources.SPLIT_FOLDER_NAMES
