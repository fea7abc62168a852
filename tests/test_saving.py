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


def _double(x):
    return x * 2


def _code_asking_file(path, kind):
    """A small `.keras` file that asks to run code: a Lambda layer 'x' calling a
    named function, a Lambda layer 'x' holding a Python lambda, or a Dense
    layer 'd' whose activation is `builtins.eval` (crafted in config.json)."""
    import json

    import keras

    inputs = keras.Input((4,))
    if kind == "lambda_named":
        outputs = keras.layers.Lambda(_double, name="x")(inputs)
    elif kind == "lambda_bytecode":
        outputs = keras.layers.Lambda(lambda x: x * 2, name="x")(inputs)
    else:
        outputs = keras.layers.Dense(2, activation="relu", name="d")(inputs)
    keras.Model(inputs, outputs).save(path)
    if kind == "eval":
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        config = json.loads(members["config.json"])
        dense = next(layer for layer in config["config"]["layers"]
                     if layer["class_name"] == "Dense")
        dense["config"]["activation"] = {"module": "builtins", "class_name": "function",
                                         "config": "eval", "registered_name": "function"}
        members["config.json"] = json.dumps(config).encode()
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
    return str(path)


@pytest.mark.parametrize("kind, code", [
    ("lambda_named", "a Lambda layer 'x' calling the function '_double'"),
    ("lambda_bytecode", "a Lambda layer 'x' holding Python bytecode"),
    ("eval", "the function builtins.eval, the activation of layer 'd'"),
])
def test_a_keras_file_asking_to_run_code_says_so_and_that_safe_mode_refuses_it(
        tmp_path, kind, code):
    from keras_vit._saving import load_keras_model

    path = _code_asking_file(tmp_path / "m.keras", kind)
    with pytest.raises(ValueError) as info:
        load_keras_model(path)
    assert str(info.value) == (
        f"Cannot load {path!r}: the file asks to run code that is not part of Keras or "
        f"keras_vit ({code}), and loading in safe_mode refuses it. A model keras_vit "
        "writes never holds code; load .keras files only from a source you trust.")
    assert "import" not in str(info.value)


def test_docs_quote_what_plain_keras_says_without_import_keras_vit(tmp_path):
    """docs/training.md quotes the error of `keras.saving.load_model` on a
    keras_vit model when keras_vit's classes are not registered (a process
    that did not `import keras_vit`; here: taken out of Keras' registry)."""
    import re

    import keras
    from official_fixtures import REPO_ROOT

    path = tiny_keras_file(tmp_path / "m.keras")
    registry = keras.saving.get_custom_objects()
    ours = {name: obj for name, obj in registry.items() if name.startswith("keras_vit>")}
    try:
        for name in ours:
            del registry[name]
        with pytest.raises(TypeError) as info:
            keras.saving.load_model(path)
    finally:
        registry.update(ours)
    said = re.search(r"Could not locate class '[^']+'", str(info.value)).group(0)
    assert said == "Could not locate class 'ImageNormalization'"
    assert f'"{said}"' in (REPO_ROOT / "docs" / "training.md").read_text()
