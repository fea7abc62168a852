"""keras_vit._saving: loading `.keras` files."""

import zipfile

import pytest

import keras_vit
from conftest import tiny_keras_file


def test_a_keras_file_needing_an_unregistered_class_says_what_to_import(tmp_path):
    from keras_vit._saving import load_keras_model

    path = tmp_path / "m.keras"
    tiny_keras_file(path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode()
    members["config.json"] = config.replace('"keras_vit>Patches"',
                                            '"keras_vit>Tokenizer"').encode()
    other = tmp_path / "other.keras"
    with zipfile.ZipFile(other, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(ValueError) as info:
        load_keras_model(other)
    assert str(info.value) == (
        f"Cannot load {str(other)!r}: it needs keras_vit's 'Tokenizer', which this "
        f"keras_vit ({keras_vit.__version__}) does not have (written by another version?). "
        "Load it with the keras_vit version that wrote it.")
