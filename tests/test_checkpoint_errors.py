"""What a user sees when the file passed as a checkpoint is not one keras_vit
reads, is missing, or does not fit the model: real files of each format,
written here byte by byte or by the library that makes them."""

import json
import pickle
import re
import struct
import zipfile

import h5py
import keras
import numpy as np
import pytest

import conftest
import keras_vit
from conftest import predict
from keras_vit.weights import official
from keras_vit.weights.official import (
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsupportedCheckpointError,
)

ACCEPTED = ("keras_vit reads official .npz checkpoints (google-research/"
            "vision_transformer format) and Keras .weights.h5 files, and with weights= "
            "or model_from_checkpoint also timm and Hugging Face transformers "
            ".safetensors and PyTorch (.pth, .bin) files and Hub folders.")


def tiny_vit(**kwargs):
    """The tiny ViT of conftest.py for 16x16 images in 4x4 patches, 5 classes
    (the sizes the messages below name)."""
    return conftest.tiny_vit(**{"patch_size": 4, "input_shape": (16, 16, 3), "classes": 5,
                                **kwargs})


def entry_points():
    """Every public way a path reaches the checkpoint reader."""
    return {
        "read_checkpoint": official.read_checkpoint,
        "model_from_checkpoint": keras_vit.model_from_checkpoint,
        "ViTB16(weights=)": lambda path: keras_vit.ViTB16(weights=path),
        "VisionTransformer(weights=)": lambda path: tiny_vit(weights=path),
        "load_official_weights": lambda path: official.load_official_weights(
            tiny_vit(), path),
    }


def assert_unsupported_everywhere(path, expected_start):
    """Same exception, same message, from every entry point."""
    messages = set()
    for name, load in entry_points().items():
        with pytest.raises(UnsupportedCheckpointError) as info:
            load(str(path))
        assert isinstance(info.value, ValueError), name
        messages.add(str(info.value))
    assert len(messages) == 1, messages
    message = messages.pop()
    assert message.startswith(expected_start), message
    return message


# --- files of other formats ---------------------------------------------

def write_torch_zip(path):
    """The layout of torch.save since PyTorch 1.6 (zip, data.pkl + storages)."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"head.weight": 0}, protocol=2))
        archive.writestr("archive/data/0", np.zeros(4, "float32").tobytes())
        archive.writestr("archive/version", "3\n")
        archive.writestr("archive/byteorder", "little")


@pytest.mark.parametrize("filename", ["model.pth", "model.bin", "renamed.npz"])
def test_pytorch_zip_checkpoint(tmp_path, filename):
    """The official-format readers name a PyTorch file and where it is read;
    `weights=` and `model_from_checkpoint` read it (tests/test_pytorch.py),
    and this one holds no tensors."""
    path = tmp_path / filename
    write_torch_zip(path)
    for name, load in entry_points().items():
        with pytest.raises(UnsupportedCheckpointError) as info:
            load(str(path))
        message = str(info.value)
        if name in ("read_checkpoint", "load_official_weights"):
            assert message == (
                f"{str(path)!r} is a PyTorch checkpoint (zip with data.pkl); {ACCEPTED} Load a "
                "timm, Hugging Face transformers or DINO PyTorch file with weights=path or "
                "keras_vit.model_from_checkpoint(path) (or its folder with config.json)."), name
        else:
            assert message == (
                f"{str(path)!r} holds no tensor state dict: looked for a dict of tensors, then "
                "under 'state_dict', 'model', 'module', 'model_state_dict', 'teacher'; the "
                "file holds head.weight."), name


def test_legacy_pytorch_pickle(tmp_path):
    path = tmp_path / "old.pth"
    # torch.save before 1.6: the pickled magic number, protocol, then sys info.
    path.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
                     + pickle.dumps(1001, protocol=2)
                     + pickle.dumps({"protocol_version": 1001}, protocol=2))
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is a legacy PyTorch checkpoint (pickled, "
        f"torch.save before 1.6); {ACCEPTED} Save it again with PyTorch >= 1.6, e.g. "
        "torch.save(torch.load(path, weights_only=True), 'model.pth'): that zip format is "
        "read with weights=path or keras_vit.model_from_checkpoint(path).")


def test_plain_pickle(tmp_path):
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"head/kernel": [1.0]}, protocol=4))
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is a Python pickle (protocol 4), e.g. a PyTorch "
        "or joblib file; keras_vit never unpickles files; ")


def test_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    header = json.dumps({
        "__metadata__": {"format": "pt"},
        "blocks.0.attn.qkv.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "cls_token": {"dtype": "F32", "shape": [1, 1, 2], "data_offsets": [16, 24]},
    }).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(24))
    # The official reader names the format and where safetensors are read.
    for load in (official.read_checkpoint,
                 lambda p: official.load_official_weights(tiny_vit(), p)):
        with pytest.raises(UnsupportedCheckpointError) as info:
            load(str(path))
        message = str(info.value)
        assert message.startswith(
            f"{str(path)!r} is a safetensors file (2 tensors, e.g. "
            f"'blocks.0.attn.qkv.weight'); {ACCEPTED} "), message
        assert "pickled" not in message
        assert message.endswith("with weights=path or "
                                "keras_vit.model_from_checkpoint(path) (or its "
                                "folder with config.json).")
    # The builders read timm / transformers safetensors (tests/test_hub.py);
    # these keys are neither.
    for load in (keras_vit.model_from_checkpoint, lambda p: tiny_vit(weights=p)):
        with pytest.raises(UnsupportedCheckpointError,
                           match="neither a timm nor a transformers"):
            load(str(path))


def test_keras2_whole_model_h5(tmp_path):
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = "2.15.0"
        f.attrs["backend"] = "tensorflow"
        f.attrs["model_config"] = json.dumps({"class_name": "Functional", "config": {}})
        f.create_group("model_weights").create_dataset("dense/kernel", data=np.zeros((3, 2)))
    message = assert_unsupported_everywhere(
        path, f"{str(path)!r} is a whole Keras model saved as HDF5 (.h5 with a "
        "model_config attribute), not a Keras .weights.h5 file; ")
    assert "keras.saving.load_model(path)" in message


def test_other_hdf5(tmp_path):
    path = tmp_path / "data.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.zeros((2, 2)))
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is an HDF5 file but not a Keras weights file "
        "(top-level entries: images); ")


def test_keras_weights_of_another_model(tmp_path):
    path = tmp_path / "dense.weights.h5"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save_weights(path)
    with pytest.raises(UnsupportedCheckpointError, match=re.escape(
            f"{str(path)!r} is a Keras .weights.h5 file of another model (layers: "
            "dense), not of a keras_vit ViT, hybrid or Mixer; ")):
        keras_vit.ViTB16(weights=str(path))


def test_whole_keras_model_file(tmp_path):
    path = tmp_path / "model.keras"
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.save(path)
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is a whole Keras model (.keras zip with config.json "
        f"and model.weights.h5); {ACCEPTED} Load it with keras.saving.load_model(path).")


def test_html_error_page_saved_as_npz(tmp_path):
    path = tmp_path / "ViT-B_16.npz"
    path.write_text("<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>"
                    "<body>Access denied</body></html>\n")
    message = assert_unsupported_everywhere(
        path, f"{str(path)!r} is an HTML page, not a checkpoint (titled "
        "'403 Forbidden'); ")
    assert "Download the checkpoint again." in message
    path.write_text("<html><body>" + "x" * 100 + "</body></html>")
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is an HTML page, not a checkpoint (it starts with "
        f"'<html><body>{'x' * 48}...'); ")


def test_git_lfs_pointer(tmp_path):
    path = tmp_path / "ViT-B_16.npz"
    path.write_text("version https://git-lfs.github.com/spec/v1\n"
                    "oid sha256:" + "0" * 64 + "\nsize 346000000\n")
    assert_unsupported_everywhere(
        path, f"{str(path)!r} is a Git LFS pointer, not the file it points to; ")


def test_single_npy_array(tmp_path):
    path = tmp_path / "kernel.npz"
    with open(path, "wb") as f:
        np.save(f, np.zeros(3, "float32"))
    assert_unsupported_everywhere(path, f"{str(path)!r} is a single NumPy array (.npy)")
    # under an .npz name: corrupt as well (a cached download is fetched again)
    with pytest.raises(CorruptCheckpointError, match="is a single NumPy array"):
        official.read_checkpoint(path)
    other = tmp_path / "kernel.bin"
    path.rename(other)
    with pytest.raises(UnsupportedCheckpointError) as info:
        official.read_checkpoint(other)
    assert not isinstance(info.value, CorruptCheckpointError)


def test_tensorflow_checkpoint(tmp_path):
    import tensorflow as tf

    prefix = str(tmp_path / "ckpt")
    tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])).write(prefix)
    assert_unsupported_everywhere(
        prefix, f"{prefix!r} is the prefix of a TensorFlow checkpoint ({prefix}.index, "
        f"{prefix}.data-*); ")
    assert_unsupported_everywhere(
        prefix + ".index", f"{prefix + '.index'!r} is a part of a TensorFlow checkpoint; ")
    assert_unsupported_everywhere(
        str(tmp_path), f"{str(tmp_path)!r} is a TensorFlow checkpoint directory; ")


def test_npz_with_other_keys_is_a_mismatch(tmp_path):
    path = tmp_path / "timm.npz"
    np.savez(path, **{"blocks.0.attn.qkv.weight": np.zeros((6, 2), "float32")})
    with pytest.raises(CheckpointMismatchError, match="Not an official ViT or Mixer checkpoint"):
        keras_vit.model_from_checkpoint(str(path))


def test_truncated_npz_stays_corrupt(tmp_path):
    model = tiny_vit()
    good = keras_vit.save_official_weights(model, tmp_path / "good.npz")
    data = open(good, "rb").read()
    path = tmp_path / "truncated.npz"
    path.write_bytes(data[: len(data) // 2])
    for load in entry_points().values():
        with pytest.raises(CorruptCheckpointError):
            load(str(path))


def test_empty_file_is_corrupt(tmp_path):
    path = tmp_path / "empty.npz"
    path.write_bytes(b"")
    with pytest.raises(CorruptCheckpointError, match=re.escape(
            f"{str(path)!r} is empty (0 bytes)")):
        tiny_vit(weights=str(path))


# --- accepted files, whatever their names --------------------------------

def test_keras_weights_file_loads_under_any_name(tmp_path):
    keras.utils.set_random_seed(3)
    model = tiny_vit(classifier_activation=None)
    rng = np.random.default_rng(0)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.1
                       for w in model.get_weights()])
    images = rng.integers(0, 255, (2, 16, 16, 3)).astype("uint8")
    expected = predict(model, images)
    path = tmp_path / "model.weights.h5"
    model.save_weights(path)
    assert official.sniff_checkpoint(path) == "keras_weights"
    renamed = tmp_path / "model.h5"
    renamed.write_bytes(path.read_bytes())
    for weights in (path, renamed):
        again = tiny_vit(weights=str(weights), classifier_activation=None)
        np.testing.assert_array_equal(predict(again, images), expected)


def test_official_npz_under_another_name_loads(tmp_path):
    model = tiny_vit()
    path = tmp_path / "checkpoint.bin"
    assert keras_vit.save_official_weights(model, path) == str(path)
    assert official.sniff_checkpoint(path) == "npz"
    again = keras_vit.model_from_checkpoint(str(path))
    assert again.count_params() == model.count_params()


# --- not found: one exception, one message, everywhere --------------------

@pytest.mark.parametrize("filename", ["nothing.npz", "nothing.pth", "nothing.weights.h5"])
def test_missing_file_is_the_same_error_everywhere(tmp_path, filename):
    missing = str(tmp_path / filename)
    expected = f"Weights file not found: {missing!r}."
    loaders = dict(entry_points(), sniff_checkpoint=official.sniff_checkpoint)
    for name, load in loaders.items():
        with pytest.raises(CheckpointNotFoundError) as info:
            load(missing)
        assert str(info.value) == expected, name
        assert isinstance(info.value, ValueError), name
        assert isinstance(info.value, FileNotFoundError), name
        assert info.value.path == missing
    assert pickle.loads(pickle.dumps(info.value)).path == missing


def test_missing_relative_file_is_not_a_registered_name():
    with pytest.raises(CheckpointNotFoundError, match=re.escape(
            "Weights file not found: 'no_such_model.pth'.")):
        keras_vit.ViTB16(weights="no_such_model.pth")


# --- key mismatch: summary first, hint, capped key lists ------------------

def test_mismatch_message_summary_hint_and_capped_lists(tmp_path):
    path = str(tmp_path / "deep.npz")
    keras_vit.save_official_weights(
        tiny_vit(hidden_size=32, num_layers=4, mlp_dim=64), path)
    with pytest.raises(CheckpointMismatchError) as info:
        tiny_vit(weights=path)
    error = info.value
    lines = str(error).split("\n")
    assert lines[0] == (
        f"Checkpoint {path} does not fit model 'vision_transformer': 0 missing, "
        "48 unexpected, 23 mis-shaped keys; the file looks like a ViT (4 blocks, "
        "width 32, 2 heads, MLP 64, patch 4) with a 5-class head.")
    assert f"keras_vit.model_from_checkpoint({path!r})" in lines[1]
    assert f"keras-vit predict --model auto --weights {path}" in lines[1]
    unexpected = next(line for line in lines if line.startswith("  unexpected keys (48): "))
    misshaped = next(line for line in lines if line.startswith("  mis-shaped keys (23): "))
    assert unexpected.endswith(", ... and 28 more")
    assert misshaped.endswith(", ... and 3 more")
    assert unexpected.count("Transformer/") == 20
    assert misshaped.count(" vs model ") == 20
    assert not any(line.startswith("  missing keys") for line in lines)
    # the full lists stay on the exception
    assert (len(error.missing), len(error.unexpected), len(error.misshaped)) == (0, 48, 23)
    assert error.source == path and error.model_name == "vision_transformer"


def test_mismatch_names_the_variant_the_file_is(tmp_path):
    """A ViT-Ti/16-shaped file (arrays of zeros; built from the manifest)."""
    manifest = official.official_manifest(keras_vit.ViTTi16(weights=None, classes=10))
    params = {key: np.zeros(shape, "float32") for key, shape in manifest}
    with pytest.raises(CheckpointMismatchError) as info:
        official.load_official_weights(tiny_vit(), params)
    first, hint = str(info.value).split("\n")[:2]
    assert first.startswith("Checkpoint checkpoint does not fit model 'vision_transformer': ")
    assert first.endswith(
        "the file looks like a ViT-Ti/16 (keras_vit.ViTTi16: 12 blocks, width 192, "
        "patch 16) with a 10-class head.")
    assert "keras_vit.model_from_checkpoint(path) or keras_vit.ViTTi16(weights=path)" in hint


def test_mixer_file_into_vit_says_how_to_build_it():
    from official_fixtures import Fixture

    fixture = Fixture("mixer_tiny")
    with pytest.raises(CheckpointMismatchError, match=re.escape(
            "it does not fit this VisionTransformer. To build the model the file "
            "describes, use keras_vit.model_from_checkpoint(path)")):
        tiny_vit(weights=fixture.checkpoint)


# --- download path ------------------------------------------------------

def test_url_serving_html_is_refused_after_one_retry_and_not_cached(tmp_path):
    """Content that is not an .npz under an .npz name counts as a corrupt
    download (fetched once more, as a proxy's page may be transient) and is
    named (an UnsupportedCheckpointError too)."""
    import os
    import pathlib

    from keras_vit.weights.registry import CACHE_SUBDIR
    from test_download import Server

    server = Server(tmp_path / "www")
    try:
        url = server.put("files/model.npz", data=b"<html><body>Not here</body></html>")
        with pytest.raises(UnsupportedCheckpointError) as info:
            tiny_vit(weights=url)
    finally:
        server.close()
    assert isinstance(info.value, CorruptCheckpointError)
    message = str(info.value)
    assert message.startswith(f"The checkpoint downloaded from {url} is corrupt (")
    assert "is an HTML page, not a checkpoint" in message
    assert "twice in a row; the file was removed from the cache" in message
    assert server.requests == ["/files/model.npz"] * 2
    cache = pathlib.Path(os.environ["KERAS_HOME"]) / CACHE_SUBDIR
    assert not (cache / "url--model.npz").exists()


def test_save_official_weights_returns_the_path(tmp_path):
    path = tmp_path / "mine.npz"
    assert keras_vit.save_official_weights(tiny_vit(), path) == str(path)
    assert keras_vit.save_official_weights(tiny_vit(), str(path)) == str(path)
