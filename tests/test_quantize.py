"""`model.quantize(mode)` on keras_vit models: the blocks' Dense layers are
quantized, the model saves and reloads (a fresh process, safe_mode on)
with the same logits, and each export runs the quantized model as Keras
does or says in one sentence why it cannot."""

import json
import re
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from conftest import predict, process_env, random_weights, run_cli, tiny_mixer, tiny_vit
from keras_vit import export
from keras_vit.layers.blocks import quantization_modes
from keras_vit.weights.official import save_official_weights

MODES = ("int8", "int4", "float8")
FAMILIES = {
    "vit": lambda: tiny_vit(classifier_activation=None),
    "mixer": lambda: tiny_mixer(classifier_activation=None),
    "hybrid": lambda: tiny_vit(resnet_layers=(1,), resnet_width=1, patch_size=1,
                               classifier_activation=None),
}
IMAGES = np.random.default_rng(0).uniform(0, 255, (4, 32, 32, 3)).astype("float32")


def quantized(family="vit", mode="int8"):
    model = random_weights(FAMILIES[family]())
    with warnings.catch_warnings():  # Keras names every layer it has no quantize for
        warnings.simplefilter("ignore", UserWarning)
        model.quantize(mode)
    return model


@pytest.mark.parametrize("family, mode", [
    pytest.param("vit", mode, marks=pytest.mark.backends) for mode in MODES] + [
    ("mixer", "int8"), ("hybrid", "int4")])
def test_a_quantized_model_saves_and_reloads_with_its_logits(tmp_path, family, mode):
    float_logits = predict(random_weights(FAMILIES[family]()), IMAGES)
    model = quantized(family, mode)
    logits = predict(model, IMAGES)
    assert 0 < np.abs(logits - float_logits).max() < 0.1 * np.abs(float_logits).max()
    assert quantization_modes(model) == {mode}
    model.save(tmp_path / "q.keras")
    reloaded = keras.saving.load_model(tmp_path / "q.keras")  # safe_mode on
    assert quantization_modes(reloaded) == {mode}
    np.testing.assert_allclose(predict(reloaded, IMAGES), logits, atol=1e-5)
    reloaded.save(tmp_path / "again.keras")  # the reloaded model's policy map saves again
    np.testing.assert_allclose(
        predict(keras.saving.load_model(tmp_path / "again.keras"), IMAGES), logits, atol=1e-5)


def test_a_fresh_process_reloads_an_int8_model(tmp_path):
    model = quantized("vit", "int8")
    model.save(tmp_path / "q.keras")
    np.save(tmp_path / "images.npy", IMAGES)
    code = ("import sys, numpy as np, keras; import keras_vit; "
            "m = keras.saving.load_model(sys.argv[1]); "
            "np.save(sys.argv[2], np.asarray(m(np.load(sys.argv[3]))))")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "q.keras"),
                    str(tmp_path / "out.npy"), str(tmp_path / "images.npy")],
                   check=True, env=process_env(), capture_output=True, timeout=300)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), predict(model, IMAGES),
                               atol=1e-5)


def test_a_float_model_has_no_quantization_mode():
    assert quantization_modes(tiny_vit()) == set()


@pytest.mark.parametrize("fmt, mode", [("onnx", "int8"), ("tflite", "int4")])
def test_the_exports_that_run_a_quantized_model_as_keras_does(tmp_path, fmt, mode):
    """(SavedModel: through the CLI below.)"""
    model = quantized("vit", mode)
    write = {"onnx": lambda: export.to_onnx(model, tmp_path / "m.onnx"),
             "tflite": lambda: export.to_tflite(model, tmp_path / "m.tflite")}[fmt]
    report = write()
    assert report.passed and report.max_abs_diff <= 1e-4


@pytest.mark.parametrize("fmt, mode, why", [
    ("tflite", "int8", "the tflite export runs only model.quantize('int4') models as Keras "
                       "does: the TFLite converter has no built-in kernel for Keras' int8"),
    ("onnx", "float8", "the onnx export runs only model.quantize('int8' / 'int4') models as "
                       "Keras does: tf2onnx cannot convert float8 tensors"),
    ("openvino", "int8", "the openvino export runs only model.quantize('int4') models as Keras "
                         "does: OpenVINO's CPU plugin does not compute Keras' int8 matmuls"),
])
def test_the_exports_that_cannot_say_why_before_converting(tmp_path, fmt, mode, why):
    model = quantized("vit", mode)
    write = {"tflite": lambda: export.to_tflite(model, tmp_path / "m.tflite"),
             "onnx": lambda: export.to_onnx(model, tmp_path / "m.onnx"),
             "openvino": lambda: export.to_openvino(model, tmp_path / "m.xml")}[fmt]
    with pytest.raises(ValueError, match=f"is quantized by model.quantize\\('{mode}'\\)") as e:
        write()
    assert why in str(e.value)
    assert not list(tmp_path.iterdir())


def test_float_weight_files_refuse_a_quantized_model(tmp_path):
    model = quantized("vit", "int8")
    message = re.escape("is quantized by model.quantize('int8'): its Dense kernels are "
                        "stored quantized with scales, and official checkpoints")
    with pytest.raises(ValueError, match=message):
        save_official_weights(model, tmp_path / "w.npz")
    with pytest.raises(ValueError, match=message):
        export.to_hub_folder(model, tmp_path / "hub")
    model.save(tmp_path / "q.keras")
    result = run_cli("export", tmp_path / "q.keras", "--format", "tflite", "--out",
                     tmp_path / "q.tflite")
    assert result.code == 2 and len(result.err_lines) == 1
    assert "is quantized by model.quantize('int8') and the tflite export" in result.err
    result = run_cli("export", tmp_path / "q.keras", "--format", "saved_model", "--out",
                     tmp_path / "served", "--json")
    assert result.code == 0 and json.loads(result.out)["passed"]
