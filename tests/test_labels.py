"""keras_vit.labels: class names stored in a model."""

import re

import keras
import numpy as np
import pytest

from conftest import tiny_keras_file, tiny_vit
from keras_vit import labels

NAMES = ("ant", "bee", "cow")


def test_class_names_survive_save_and_load(tmp_path):
    path = tiny_keras_file(tmp_path / "m.keras")
    model = keras.saving.load_model(path)
    assert labels.class_names(model) is None
    assert labels.set_class_names(model, NAMES)
    model.save(path)
    assert labels.class_names(keras.saving.load_model(path)) == list(NAMES)
    with pytest.raises(ValueError, match="2 class names for a model with 3 outputs"):
        labels.set_class_names(model, NAMES[:2])
    bare = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert labels.set_class_names(bare, NAMES) is False
    np.testing.assert_equal(labels.class_names(bare), None)


def test_class_labels_given_model_imagenet_or_class_i(monkeypatch):
    from keras_vit import preprocessing

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    assert labels.class_labels(model, 3, ["x", "y", "z"]) == (["x", "y", "z"], "given")
    assert labels.class_labels(model, 3) == (["class_0", "class_1", "class_2"], "class_<i>")
    tiny = tiny_vit(classes=3)
    labels.set_class_names(tiny, NAMES)
    assert labels.class_labels(tiny, 3) == (list(NAMES), "model")
    imagenet = [f"synset {i}" for i in range(1000)]
    monkeypatch.setattr(preprocessing, "class_names", lambda n: imagenet)
    wide = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1000)])
    assert labels.class_labels(wide, 1000) == (imagenet, "ImageNet-1k")


def test_class_labels_errors(monkeypatch):
    from keras_vit import preprocessing

    with pytest.raises(TypeError, match=r"^metadata labels must be a list of strings; "
                                        r"got 'abc'\.$"):
        labels.class_labels(None, 3, "abc", what="metadata labels")
    with pytest.raises(ValueError, match=re.escape(
            "labels has 2 names; the model has 3 classes (one name per class, in label "
            "order).")):
        labels.class_labels(None, 3, ["a", "b"])
    # written one per line: a tab is refused there, and for printing too (issue #46)
    with pytest.raises(ValueError, match=re.escape(
            "Class name 'b\\tc' holds a control character ('\\t'); the label file has one "
            "name per line.")):
        labels.class_labels(None, 2, ["a", "b\tc"], label_file=True)
    with pytest.raises(ValueError, match=re.escape(
            "Class name 'b\\tc' in labels holds a control character ('\\t'); a class name "
            "is one line of printable text.")):
        labels.class_labels(None, 2, ["a", "b\tc"])

    def offline(n):
        raise OSError("no network")

    monkeypatch.setattr(preprocessing, "class_names", offline)
    with pytest.raises(OSError, match="no network"):  # as it is, without `unavailable`
        labels.class_labels(None, 1000)
    with pytest.raises(ValueError, match=re.escape(
            "The ImageNet-21k label file for the metadata of this 21843-class head could not "
            "be loaded (no network). Give the names.")):
        labels.class_labels(None, 21843, unavailable=("the metadata", "Give the names."))


def test_label_files_are_written_and_read_by_one_module(tmp_path):
    path = tmp_path / "labels.txt"
    assert labels.write_labels(NAMES, path) == path
    assert path.read_text() == "ant\nbee\ncow\n" == labels.labels_text(NAMES)
    assert labels.read_labels(path) == list(NAMES)
    assert labels.parse_labels("ant\r\nbee\n\n  \ncow") == list(NAMES)
    with pytest.raises(ValueError, match=re.escape(f"Labels file not found: {str(tmp_path / 'no.txt')!r}.")):
        labels.read_labels(str(tmp_path / "no.txt"))
