""".keras files and class names that lie (issue #46): members and configs
that would make Keras allocate what the file does not hold (13), Keras'
generic load error in place of the layer's own cause (20), and class
names that would reach the terminal raw (6). Every file is made here."""

import json
import pathlib
import re
import shutil
import zipfile

import keras
import numpy as np
import pytest

from conftest import run_cli, tiny_keras_file, tiny_mixer, tiny_vit
from keras_vit import labels
from keras_vit._saving import check_keras_archive, load_keras_model
from keras_vit.errors import CorruptCheckpointError
from keras_vit.layers.head import ClassifierHead

HUB = pathlib.Path(__file__).parent / "fixtures" / "hub"


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    return tiny_keras_file(tmp_path_factory.mktemp("tiny") / "tiny.keras")


def rewrite(source, path, config=None, members=None, compress=None):
    """A copy of the `.keras` file `source` at `path`: its config.json
    changed by `config(config)`, members added or replaced by `members`
    ({name: bytes}), those named in `compress` deflated."""
    with zipfile.ZipFile(source) as archive:
        files = {info.filename: archive.read(info) for info in archive.infolist()}
    if config:
        settings = json.loads(files["config.json"])
        config(settings)
        files["config.json"] = json.dumps(settings).encode()
    files.update(members or {})
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED
                             if name in (compress or ()) else zipfile.ZIP_STORED)
    return str(path)


def layer(settings, name):
    return next(item for item in settings["config"]["layers"]
                if item["config"]["name"] == name)


def set_value(name, key, value):
    return lambda settings: layer(settings, name)["config"].__setitem__(key, value)


@pytest.fixture
def keras_never_reads(monkeypatch):
    """Loading refused before Keras reads the file: no allocation it dictates."""
    def refuse(*args, **kwargs):
        raise AssertionError("keras.saving.load_model was called")

    monkeypatch.setattr(keras.saving, "load_model", refuse)


# --- 13: bounds checked before Keras reads the file --------------------------------

def test_a_compressed_weights_bomb_is_refused_before_keras(tiny_file, tmp_path,
                                                           keras_never_reads):
    with zipfile.ZipFile(tiny_file) as archive:
        weights = archive.read("model.weights.h5")
    padded = weights + bytes(80 << 20)  # a valid HDF5 file, 80 MiB of zeros behind it
    bomb = rewrite(tiny_file, tmp_path / "bomb.keras", members={"model.weights.h5": padded},
                   compress={"model.weights.h5"})
    assert pathlib.Path(bomb).stat().st_size < 200_000
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot load {bomb!r}: its member 'model.weights.h5' declares "
            f"{len(padded):,} bytes but stores ") + r"[\d,]+ \(more than 10:1; Keras stores "
            r"members uncompressed\): a decompression bomb or a damaged file\.$"):
        load_keras_model(bomb)


def test_a_config_bomb_is_refused_before_keras(tiny_file, tmp_path, keras_never_reads):
    with zipfile.ZipFile(tiny_file) as archive:
        config = archive.read("config.json")
    huge = config[:-1] + b" " * (17 << 20) + b"}"  # valid JSON, 17 MiB
    bomb = rewrite(tiny_file, tmp_path / "config.keras", members={"config.json": huge},
                   compress={"config.json"})
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot load {bomb!r}: its config.json declares {len(huge):,} bytes, more than "
            "the 16,777,216 a model's may (a keras_vit model's is under 1 MB); the file is "
            "damaged or not a model's.")):
        load_keras_model(bomb)


def test_an_input_of_80000_pixels_square_is_refused_before_keras(tiny_file, tmp_path,
                                                                  keras_never_reads):
    huge = rewrite(tiny_file, tmp_path / "huge.keras",
                   config=set_value("images", "batch_shape", [None, 80000, 80000, 3]))
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot load {huge!r}: its model takes 80,000 x 80,000-pixel images (input "
            "'images'), more than the limit of 178,956,970 pixels "
            "(KERAS_VIT_MAX_IMAGE_PIXELS); set KERAS_VIT_MAX_IMAGE_PIXELS higher to use it.")):
        load_keras_model(huge)


def test_the_command_line_refuses_it_in_one_line(tiny_file, tmp_path, keras_never_reads):
    huge = rewrite(tiny_file, tmp_path / "huge.keras",
                   config=set_value("images", "batch_shape", [None, 80000, 80000, 3]))
    image = tmp_path / "x.png"
    image.write_bytes(b"not read")
    result = run_cli("predict", "--model", huge, image)
    assert result.code != 0
    assert len(result.err_lines) == 1, result.err
    assert "80,000 x 80,000-pixel images" in result.err and huge in result.err


def test_a_config_asking_for_more_weights_than_the_file_holds(tiny_file, tmp_path,
                                                              keras_never_reads):
    grid = rewrite(tiny_file, tmp_path / "grid.keras",
                   config=set_value("patch_encoder", "grid_size", [10000, 10000]))
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot load {grid!r}: its config.json asks for at least ") + r"[\d,]+" +
            re.escape(" weights (layer 'patch_encoder': a position embedding of 10000 x "
                      "10000 x 16), more than its ") + r"[\d,]+" + re.escape(
            "-byte weights file holds; the file is damaged or was edited.")):
        load_keras_model(grid)


def test_members_past_max_checkpoint_bytes(tiny_file, monkeypatch, keras_never_reads):
    monkeypatch.setenv("KERAS_VIT_MAX_CHECKPOINT_BYTES", "1000")
    with pytest.raises(ValueError, match=re.escape(
            f"Cannot load {tiny_file!r}: its members declare ") + r"[\d,]+" + re.escape(
            " bytes, more than the limit of 1,000 (KERAS_VIT_MAX_CHECKPOINT_BYTES); set "
            "KERAS_VIT_MAX_CHECKPOINT_BYTES higher to read it.")):
        load_keras_model(tiny_file)


@pytest.mark.parametrize("make", [
    lambda: tiny_vit(),
    lambda: tiny_vit(classifier="gap", classifier_activation=None),
    lambda: tiny_mixer(),
    lambda: tiny_vit(classes=1000, input_shape=(224, 224, 3), patch_size=16),
], ids=["vit", "gap", "mixer", "vit224"])
def test_models_keras_writes_pass_the_bounds(make, tmp_path):
    path = str(tmp_path / "m.keras")
    make().save(path)
    check_keras_archive(path)
    deflated = rewrite(path, tmp_path / "deflated.keras",
                       compress={"config.json", "model.weights.h5"})
    check_keras_archive(deflated)  # a zip tool's recompression is not a bomb


def test_a_quantized_model_passes_the_bounds(tmp_path):
    model = tiny_vit(classes=64)
    model.quantize("int8")
    path = str(tmp_path / "q.keras")
    model.save(path)
    check_keras_archive(path)
    assert load_keras_model(path).output_shape == (None, 64)


# --- 20: the layer's own cause, not Keras' generic advice ----------------------------

@pytest.mark.parametrize("change, said", [
    (set_value("head", "class_names", ["x"]),
     "its layer 'head' (ClassifierHead) refused its config: 1 class names for a head with 3 "
     "classes; give one name per class, in label order."),
    (set_value("encoderblock_0", "num_heads", 0),
     "its layer 'encoderblock_0' (TransformerBlock) refused its config: `num_heads` must be "
     "a positive integer, got 0."),
    (set_value("patches", "patch_size", [0, 0]),
     "its layer 'patches' (Patches) refused its config: `patch_size` must be a positive "
     "integer or a pair of positive integers, got [0, 0]."),
    (set_value("head", "activation", "serialize_keras_object"),
     "its layer 'head' (ClassifierHead) refused its config: Could not interpret activation "
     "function identifier: serialize_keras_object."),
], ids=["class_names", "num_heads", "patch_size", "activation"])
def test_load_errors_name_the_layer_and_its_cause(tiny_file, tmp_path, change, said):
    path = rewrite(tiny_file, tmp_path / "bad.keras", config=change)
    with pytest.raises(ValueError, match=f"^{re.escape(f'Cannot load {path!r}: {said}')}$"):
        load_keras_model(path)


def test_a_quantized_head_policy_names_the_layer(tiny_file, tmp_path):
    policy = {"module": "keras", "class_name": "QuantizedDTypePolicy",
              "config": {"mode": "int8", "source_name": "float32"}, "registered_name": None}
    path = rewrite(tiny_file, tmp_path / "quantized.keras",
                   config=set_value("head", "dtype", policy))
    with pytest.raises(ValueError, match="^" + re.escape(
            f"Cannot load {path!r}: its layer 'head' (ClassifierHead) does not fit its "
            "weights: Layer 'head' expected 3 variables, but received 2 variables during "
            "loading. Expected: ['bias', 'kernel', 'kernel_scale'].") + "$"):
        load_keras_model(path)


def test_a_cause_from_the_file_reaches_the_terminal_escaped(tiny_file, tmp_path):
    path = rewrite(tiny_file, tmp_path / "escape.keras",
                   config=set_value("head", "activation", "\x1b]0;owned\x07\x1b[2J"))
    with pytest.raises(ValueError, match=re.escape(
            "refused its config: Could not interpret activation function identifier: "
            "\\x1b]0;owned\\x07\\x1b[2J.")) as error:
        load_keras_model(path)
    assert "\x1b" not in str(error.value)


# --- 6: one rule for class names wherever they enter -----------------------------------

def test_set_class_names_refuses_a_line_break():
    with pytest.raises(ValueError, match=re.escape(
            "Class name 'a\\nb' in class_names holds a line break ('\\n'); a class name is "
            "one line of printable text.")):
        labels.set_class_names(tiny_vit(), ["a\nb", "c", "d"])
    with pytest.raises(ValueError, match=re.escape(
            "Class name '\\x1b[2J' holds a control character ('\\x1b'); a class name is one "
            "line of printable text.")):
        ClassifierHead(2, class_names=["\x1b[2J", "b"])


def test_a_keras_file_with_escapes_in_its_class_names_is_refused(tiny_file, tmp_path):
    path = rewrite(tiny_file, tmp_path / "names.keras", config=set_value(
        "head", "class_names", ["\x1b]0;title\x07", "b", "c"]))
    with pytest.raises(ValueError, match="^" + re.escape(
            f"Cannot load {path!r}: its layer 'head' (ClassifierHead) refused its config: "
            "Class name '\\x1b]0;title\\x07' holds a control character ('\\x1b'); a class "
            "name is one line of printable text.") + "$"):
        load_keras_model(path)


def test_a_labels_file_with_an_escape_is_refused(tiny_file, tmp_path):
    names = tmp_path / "labels.txt"
    names.write_text("cat\n\x1b[2Jdog\nbird\n", encoding="utf-8")
    image = tmp_path / "x.png"
    keras.utils.save_img(str(image), np.zeros((32, 32, 3), "uint8"))
    result = run_cli("predict", "--model", tiny_file, "--labels", names, image)
    assert result.code != 0
    assert len(result.err_lines) == 1, result.err
    assert (f"Class name '\\x1b[2Jdog' in --labels {str(names)!r} holds a control character "
            "('\\x1b'); a class name is one line of printable text.") in result.err
    assert "\x1b" not in result.err
    with pytest.raises(ValueError, match=re.escape(
            "Class name 'b\\tc' in labels holds a control character ('\\t')")):
        labels.class_labels(None, 2, ["a", "b\tc"])


def test_a_hub_config_with_an_escape_in_its_label_names_is_refused(tmp_path):
    import keras_vit

    folder = tmp_path / "timm"
    shutil.copytree(HUB / "timm_vit_token", folder)
    settings = json.loads((folder / "config.json").read_text())
    settings["label_names"] = [f"c{i}" for i in range(9)] + ["x\x1b[2J"]
    (folder / "config.json").write_text(json.dumps(settings))
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            "config.json' holds the class name 'x\\x1b[2J' (label_names), which holds a "
            "control character ('\\x1b'); a class name is one line of printable text.")):
        keras_vit.model_from_checkpoint(str(folder))
