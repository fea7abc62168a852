"""The `keras-vit` command: `models` and `predict`, text and --json."""

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import cli
from keras_vit.models.auto import architecture_from_checkpoint
from keras_vit.weights.official import read_checkpoint
from official_fixtures import NAMES, Fixture


def run(argv):
    out = io.StringIO()
    code = cli.main(argv, out=out)
    return code, out.getvalue()


def test_models_json_lists_variants_and_families():
    code, text = run(["models", "--json"])
    assert code == 0
    data = json.loads(text)
    functions = {row["function"] for row in data["models"]}
    assert {"ViTB16", "R50ViTB16", "MixerL16", "RViTTi16"} <= functions
    b16 = next(r for r in data["models"] if r["function"] == "ViTB16")
    assert b16["config"]["hidden_size"] == 768 and "imagenet21k" in b16["weights"]
    families = {(r["family"], r["weights"]) for r in data["weights"]}
    assert ("vit", "augreg") in families and ("mixer", "imagenet1k") in families


def test_models_text_table():
    code, text = run(["models"])
    assert code == 0
    assert "ViTB16     B/16" in text and "augreg:<filename>" in text


def test_console_script_is_installed():
    result = subprocess.run([sys.executable, "-m", "keras_vit.cli", "models", "--json"],
                            capture_output=True, text=True, check=True)
    assert json.loads(result.stdout)["models"]


@pytest.mark.parametrize("name", NAMES)
def test_architecture_is_read_from_the_checkpoint(name):
    fixture = Fixture(name)
    builder, expected = fixture.architecture()
    family, config = architecture_from_checkpoint(read_checkpoint(fixture.checkpoint))
    assert family == ("mixer" if fixture.is_mixer else "vit")
    assert config == expected


def write_pngs(images, tmp_path):
    paths = []
    for i, image in enumerate(images):
        path = tmp_path / f"photo{i}.png"
        path.write_bytes(tf.io.encode_png(image).numpy())
        paths.append(str(path))
    return paths


def test_predict_json_matches_the_official_logits(tmp_path):
    fixture = Fixture("vit_tiny_token")
    paths = write_pngs(fixture.io["images_uint8"], tmp_path)
    code, text = run(["predict", *paths, "--weights", fixture.checkpoint, "--top", "3", "--json"])
    assert code == 0
    result = json.loads(text)
    assert result["image_size"] == [32, 32]
    logits = fixture.io["logits"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    for row, p in zip(result["predictions"], probs):
        assert [t["index"] for t in row["top"]] == list(np.argsort(-p)[:3])
        assert row["top"][0]["label"] == f"class_{np.argmax(p)}"
        assert row["top"][0]["probability"] == pytest.approx(p.max(), abs=1e-5)


def test_predict_text_with_labels_and_resize(tmp_path):
    fixture = Fixture("mixer_tiny")
    big = tf.image.resize(fixture.io["images_uint8"], (64, 64)).numpy().astype("uint8")
    paths = write_pngs(big[:1], tmp_path)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"thing{i}" for i in range(10)))
    code, text = run(["predict", *paths, "--weights", fixture.checkpoint,
                      "--labels", str(labels), "--top", "2"])
    assert code == 0
    assert text.startswith(f"{paths[0]}:\n  1. thing")
    assert text.count("(class ") == 2


def test_predict_errors_exit_2(tmp_path, capsys):
    fixture = Fixture("vit_tiny_token")
    code, _ = run(["predict", str(tmp_path / "none.png"), "--weights", fixture.checkpoint])
    assert code == 2
    assert capsys.readouterr().err == (
        f"keras-vit: error: Image not found: '{tmp_path / 'none.png'}'.\n")
    (tmp_path / "x.png").write_bytes(b"not an image")
    code, _ = run(["predict", str(tmp_path / "x.png"), "--weights", fixture.checkpoint])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit: error: Cannot decode") and err.count("\n") == 1
    (tmp_path / "ok.png").write_bytes(tf.io.encode_png(fixture.io["images_uint8"][0]).numpy())
    code, _ = run(["predict", str(tmp_path / "ok.png"), "--weights", "imagenet21k"])
    assert code == 2
    assert "--model auto reads the architecture from a local official .npz, a " in capsys.readouterr().err
    # `predict model.keras image.png` (evaluate's order): found here by hand.
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"any")
    code, _ = run(["predict", str(keras_file), str(tmp_path / "ok.png")])
    assert code == 2
    assert capsys.readouterr().err == (
        f"keras-vit: error: '{keras_file}' is a Keras model file, not an image: give it "
        f"as --model {keras_file}.\n")
    code, _ = run(["predict", str(tmp_path / "ok.png"), "--model", "ViTQ",
                   "--weights", "imagenet21k"])
    assert code == 2
    assert "Unknown --model 'ViTQ'" in capsys.readouterr().err


def test_model_from_checkpoint_matches_the_explicit_builder():
    fixture = Fixture("r26_vit_tiny")
    model = keras_vit.model_from_checkpoint(fixture.checkpoint, classifier_activation=None)
    np.testing.assert_allclose(model.predict(fixture.io["images_uint8"], verbose=0),
                               fixture.io["logits"], rtol=1e-5, atol=2e-5)
