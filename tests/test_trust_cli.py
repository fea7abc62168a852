"""Issue #46, the command line's predict / explain / evaluate: flags never
ignored (item 5), never a read of a FIFO or a device (14), no answer from
NaN or inf outputs (4), the messages of items 21 and 27. Data made here:
tiny models, crafted images, FIFOs, planted links, a loopback server."""

import contextlib
import functools
import http.server
import json
import logging
import os
import re
import signal
import threading

import numpy as np
import pytest
import tensorflow as tf
from conftest import run_cli, tiny_keras_file, tiny_vit
from official_fixtures import Fixture

from keras_vit import _image_files
from keras_vit.data import sources


def png(path, seed=0, size=32):
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype="uint8")
    path.write_bytes(tf.io.encode_png(pixels).numpy())
    return str(path)


def jpeg(path, seed=0, size=32):
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype="uint8")
    path.write_bytes(tf.io.encode_jpeg(pixels).numpy())
    return str(path)


@contextlib.contextmanager
def deadline(seconds=120):
    """A read that blocks for ever (a FIFO) fails the test instead of hanging it."""
    def expired(*_):
        raise TimeoutError(f"no answer in {seconds} s: a blocking read")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def last_error(err):
    lines = [line for line in err.splitlines() if line]
    assert lines and "Traceback" not in err, err
    return lines[-1]


# --- item 5: a .keras --model never ignores --weights / --weights-ema ----------------

@pytest.mark.parametrize("command", ["predict", "explain"])
def test_a_keras_model_refuses_weights_and_weights_ema(tmp_path, command):
    model = tiny_keras_file(tmp_path / "m.keras")
    image = png(tmp_path / "ok.png")
    out = ["--out", str(tmp_path / "pictures")] if command == "explain" else []
    code, stdout, err = run_cli(command, image, "--model", model, "--weights",
                                tmp_path / "nothere.npz", "--json", *out)
    assert code == 2 and stdout == ""
    assert last_error(err) == (
        f"keras-vit: error: --weights applies to a named model or --model auto; --model "
        f"{model!r} is a .keras file that holds its own weights: leave --weights out.")
    code, _, err = run_cli(command, image, "--model", model, "--weights", "x.npz",
                           "--weights-ema", *out)
    assert code == 2
    assert "--weights and --weights-ema apply to a named model" in last_error(err)
    code, _, err = run_cli(command, image, "--model", model, "--weights-ema", *out)
    assert code == 2
    assert last_error(err).endswith("leave --weights-ema out.")


# --- item 14: the regular-file rule in predict and explain ---------------------------

def test_predict_never_reads_a_fifo_or_a_device(tmp_path):
    model = tiny_keras_file(tmp_path / "m.keras")
    folder = tmp_path / "images"
    folder.mkdir()
    good = png(folder / "a.png")
    fifo = str(folder / "x.jpg")
    os.mkfifo(fifo)  # a read would wait for a writer for ever
    zero = str(tmp_path / "zero.png")
    os.symlink("/dev/zero", zero)  # a read would never end
    with deadline():
        code, _, err = run_cli("predict", fifo, "--model", model)
        assert code == 2
        assert last_error(err) == (
            f"keras-vit: error: Cannot read image file {fifo!r} (not a regular file); pass "
            "--skip-corrupt to skip such files.")
        code, _, err = run_cli("predict", zero, "--model", model)
        assert code == 2
        assert last_error(err) == (
            f"keras-vit: error: Cannot read image file {zero!r} (not a regular file); pass "
            "--skip-corrupt to skip such files.")
        code, out, err = run_cli("predict", folder, "--model", model, "--skip-corrupt",
                                 "--json")
        assert code == 0, err
        result = json.loads(out)
        assert [p["image"] for p in result["predictions"]] == [good]
        assert result["skipped"] == [fifo]
        code, _, err = run_cli("explain", fifo, "--model", model, "--out", tmp_path / "p")
        assert code == 2 and "(not a regular file)" in last_error(err)


def test_the_file_reader_checks_the_open_file_not_the_name(tmp_path):
    fifo = str(tmp_path / "x.png")
    os.mkfifo(fifo)
    with deadline(), pytest.raises(OSError, match="not a regular file"):
        _image_files.read_image_file(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        _image_files.read_image_file("/dev/zero")
    assert _image_files.unreadable_reason(fifo) == "not a regular file"
    assert sources._unreadable(fifo) == "not a regular file"  # the one rule of train too


# --- item 4: no answer from NaN or inf outputs ---------------------------------------

def overflowing_model(path, **overrides):
    """A tiny ViT whose weights are finite but whose head overflows to inf
    (float32): what a load-time check of the weights cannot see."""
    model = tiny_vit(**overrides)
    head = model.get_layer("head")
    kernel, bias = head.get_weights()
    head.set_weights([np.full_like(kernel, 3e38), bias])
    assert all(np.isfinite(w).all() for w in model.get_weights())
    model.save(path)
    return str(path)


def test_predict_refuses_non_finite_outputs(tmp_path):
    model = overflowing_model(tmp_path / "m.keras")
    image = png(tmp_path / "ok.png")
    code, out, err = run_cli("predict", image, "--model", model, "--json")
    assert code == 2 and out == ""
    assert last_error(err) == (
        f"keras-vit: error: The model's outputs for {image!r} are not finite (NaN or inf): "
        "its weights hold a non-finite value or its arithmetic overflows, so it gives no "
        "probabilities; check the weights it was built from.")


def test_evaluate_refuses_non_finite_outputs(tmp_path):
    model = overflowing_model(tmp_path / "m.keras")
    root = tmp_path / "data"
    for label in "abc":
        (root / label).mkdir(parents=True)
        for i in range(3):
            png(root / label / f"{i}.png", seed=i)
    code, out, err = run_cli("evaluate", model, "--data", f"folder:{root}")
    assert code == 2 and out == ""
    assert re.fullmatch(
        r"keras-vit: error: The model's outputs for folder:.* \(split 'validation'\) are not "
        r"finite \(NaN or inf\): .* so it gives no accuracy; check the weights it was built "
        r"from\.", last_error(err)), err


def test_explain_refuses_non_finite_outputs(tmp_path):
    model = overflowing_model(tmp_path / "m.keras")
    image = png(tmp_path / "ok.png")
    out = tmp_path / "pictures"
    code, _, err = run_cli("explain", image, "--model", model, "--out", out)
    assert code == 2
    assert "The model's outputs for 1 image (ok) are not finite (NaN or inf)" in \
        last_error(err)
    assert "so it gives no pictures" in last_error(err)
    assert not out.exists() or not os.listdir(out)


# --- item 21: a URL as --weights; evaluate's --image-size ----------------------------

@pytest.fixture
def served(tmp_path):
    """An http server on 127.0.0.1 serving `tmp_path / "served"`; its base URL."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_predict_takes_the_url_of_an_official_npz(tmp_path, served):
    root, base = served
    fixture = Fixture("vit_tiny_token")
    (root / "tiny.npz").write_bytes(open(fixture.checkpoint, "rb").read())
    image = png(tmp_path / "ok.png")
    code, out, err = run_cli("predict", image, "--weights", f"{base}/tiny.npz", "--top", "1",
                             "--json")
    assert code == 0, err
    assert "Checkpoint not found" not in err
    local = json.loads(run_cli("predict", image, "--weights", fixture.checkpoint, "--top",
                               "1", "--json").out)
    assert json.loads(out)["predictions"] == local["predictions"]


def test_evaluate_checks_image_size_as_predict_does(tmp_path):
    model = tiny_keras_file(tmp_path / "m.keras")
    root = tmp_path / "data"
    for label in "abc":
        (root / label).mkdir(parents=True)
        for i in range(2):
            png(root / label / f"{i}.png", seed=i)
    code, _, err = run_cli("evaluate", model, "--data", f"folder:{root}", "--image-size", "64")
    assert code == 2
    assert last_error(err) == (
        "keras-vit: error: image_size=64 (keras-vit: --image-size): the model takes 32x32 "
        "images; leave it out.")
    code, _, err = run_cli("predict", png(tmp_path / "ok.png"), "--model", model,
                           "--image-size", "64")
    assert code == 2
    assert last_error(err) == ("keras-vit: error: --image-size 64: the model takes 32x32 "
                               "images; leave --image-size out.")


# --- item 27: weights that exist, train's corrupt-file sentence, one list of types ---

def test_the_no_weights_warning_names_weights_the_model_has(caplog):
    from keras_vit.training import preflight
    from keras_vit.variants import ALL_VARIANTS
    from keras_vit.weights import registry

    hint = preflight.weights_hint("ViTTi16")
    assert "imagenet21k" not in hint
    suggested = re.search(r"--weights (\S+);", hint).group(1)
    assert suggested in registry.available_weights(ALL_VARIANTS["ViTTi16"])
    assert "--weights imagenet21k;" in preflight.weights_hint("ViTB16")


def test_predict_says_train_sentence_for_a_corrupt_image(tmp_path):
    model = tiny_keras_file(tmp_path / "m.keras")
    whole = open(jpeg(tmp_path / "whole.jpg"), "rb").read()
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(whole[:len(whole) // 2])
    code, _, err = run_cli("predict", truncated, "--model", model)
    assert code == 2
    assert last_error(err) == (
        f"keras-vit: error: Corrupt or non-image file {str(truncated)!r}; pass --skip-corrupt "
        "to skip such files.")
    # SOI ... EOI around garbage: TensorFlow's decoder fails inside a graph
    garbled = tmp_path / "garbled.jpg"
    garbled.write_bytes(b"\xff\xd8\xff" + b"\x00" * 64 + b"\xff\xd9")
    code, _, err = run_cli("predict", garbled, "--model", model)
    assert code == 2
    line = last_error(err)
    assert line.startswith(f"keras-vit: error: Corrupt or non-image file {str(garbled)!r}")
    assert line.endswith("; pass --skip-corrupt to skip such files.")
    assert "Graph execution error" not in line and "File " not in line
    assert "Detected at node" not in line


def test_one_list_of_image_types_with_one_wording(tmp_path, caplog):
    model = tiny_keras_file(tmp_path / "m.keras")
    folder = tmp_path / "images"
    folder.mkdir()
    good = png(folder / "a.png")
    (folder / "b.webp").write_bytes(b"RIFF....WEBP")
    (folder / "c.tiff").write_bytes(b"II*\0")
    (folder / "notes.txt").write_text("not an image")
    code, out, err = run_cli("predict", folder, "--model", model, "--json")
    assert code == 0, err
    assert [p["image"] for p in json.loads(out)["predictions"]] == [good]
    sentence = (f"{folder}: left out 2 image files of a type keras_vit does not read (.tiff, "
                ".webp); it reads .jpg, .jpeg, .png, .bmp, .gif: convert them (e.g. to PNG) to "
                "include them.")
    assert err.splitlines() == [f"keras-vit: {sentence}"]
    # a .webp given by name: the same list, never decoded by another rule
    code, _, err = run_cli("predict", folder / "b.webp", "--model", model)
    assert code == 2
    assert last_error(err) == (
        f"keras-vit: error: {str(folder / 'b.webp')!r} is a .webp file, an image type "
        "keras_vit does not read (it reads .jpg, .jpeg, .png, .bmp, .gif); convert it (e.g. "
        "to PNG).")
    # training's folder source: the same sentence (and the other files counted apart)
    data = tmp_path / "data"
    (data / "x").mkdir(parents=True)
    (data / "y").mkdir()
    png(data / "x" / "1.png")
    png(data / "y" / "1.png")
    (data / "x" / "2.webp").write_bytes(b"RIFF....WEBP")
    (data / "y" / "3.tiff").write_bytes(b"II*\0")
    (data / "y" / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.INFO, logger="keras_vit"):
        sources.list_folder(str(data))
    messages = [r.getMessage() for r in caplog.records]
    assert (f"{data}: left out 2 image files of a type keras_vit does not read (.tiff, "
            ".webp); it reads .jpg, .jpeg, .png, .bmp, .gif: convert them (e.g. to PNG) to "
            "include them.") in messages
    assert f"{data}: left out 1 file without an image extension (.jpg, .jpeg, .png, .bmp, " \
        ".gif)." in messages


def test_export_of_an_npz_says_how_to_make_a_keras_file(tmp_path):
    code, _, err = run_cli("export", "x.npz", "--format", "tflite", "--out",
                           tmp_path / "x.tflite")
    assert code == 2
    line = last_error(err)
    assert "keras_vit.model_from_checkpoint('x.npz').save('x.keras')" in line
    assert line.startswith("keras-vit: error: MODEL must be a .keras file")


def test_the_examples_in_the_docstrings():
    import doctest

    from keras_vit.inspect import analysis

    for module in (_image_files, analysis):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0
