"""keras_vit.export.to_onnx / to_openvino: parity with Keras on real digits
through ONNX Runtime and the OpenVINO runtime, any batch size, class names
read back from the files, int8 calibrated on the train split and verified
on the test split, atomic writes, errors, the CLI."""

import json
import os
import re
import sys

import keras
import numpy as np
import pytest

import keras_vit
from conftest import random_weights, run_cli, tiny_vit
from keras_vit import export

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="export needs the TensorFlow backend")
SIZE = 32
NAMES = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def model():
    """conftest's tiny ViT, 32 wide, 10 classes with softmax, weights redrawn,
    the digits' names."""
    model = random_weights(tiny_vit(hidden_size=32, mlp_dim=64, classes=10))
    keras_vit.labels.set_class_names(model, NAMES)
    return model


@pytest.fixture(scope="module")
def digits(few_digits_folder):
    """`folder:DIR` of real scikit-learn digits as RGB PNGs (conftest):
    train/ 6 and test/ 3 per class."""
    return f"folder:{few_digits_folder}"


@pytest.fixture(scope="module")
def test_digits(digits):
    """The 30 test digits at 32x32, float32 pixels in [0, 255]."""
    from keras_vit.data.sample import sample_images

    return sample_images(digits, "test", image_size=SIZE, count=None).images


def keras_outputs(model, images):
    """(logits, probabilities) of the Keras model: a softmax head's
    pre-activation and its output."""
    head = model.get_layer("head")
    features = keras.Model(model.input, head.input)(images, training=False)
    logits = keras.ops.convert_to_numpy(features) @ head.kernel.numpy() + head.bias.numpy()
    return logits, keras.ops.convert_to_numpy(model(images, training=False))


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


@pytest.fixture(scope="module")
def onnx_export(model, digits, tmp_path_factory):
    directory = tmp_path_factory.mktemp("onnx")
    report = export.to_onnx(model, directory / "vit.onnx", validation_data=digits,
                            latency_repeats=2, verbose=False)
    return directory, report


@pytest.fixture(scope="module")
def openvino_export(model, digits, tmp_path_factory):
    directory = tmp_path_factory.mktemp("openvino")
    report = export.to_openvino(model, directory / "vit.xml", validation_data=digits,
                                latency_repeats=2, verbose=False)
    return directory, report


@pytest.fixture(scope="module")
def bf16_criteria(openvino_export):
    """The bar an OpenVINO export adds where OpenVINO runs bf16 on this CPU,
    "" where it does not, as OpenVINO itself reports it (not keras_vit's
    reading of it): "BF16" among the CPU's optimization capabilities, and
    the exported file compiled at bf16 when asked for bf16."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(str(openvino_export[0] / "vit.xml"), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "bf16"})
    runs_bf16 = ("BF16" in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
                 and compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.bf16)
    return " and bf16 top-1 agreement >= 99%" if runs_bf16 else ""


# --- ONNX -----------------------------------------------------------------

def test_onnx_float32_matches_keras_on_real_digits_with_any_batch(model, onnx_export,
                                                                  test_digits, digits):
    import onnx
    import onnxruntime

    directory, report = onnx_export
    path = directory / "vit.onnx"
    assert report.passed and report.max_abs_diff <= 1e-4 and report.top1_agreement == 1.0
    assert report.criteria == "max |diff| <= 0.0001 and top-1 agreement >= 100%"
    assert report.validation == {"split": "test", "images": 30, "classes": 10,
                                 "source": digits}
    assert report.format == "onnx" and report.quantization == "none"
    assert report.size_bytes == os.path.getsize(path) and report.latency_ms > 0
    assert report.runtime.startswith(f"onnxruntime {onnxruntime.__version__}")
    proto = onnx.load(str(path))
    assert report.opset == 15 == next(o.version for o in proto.opset_import if o.domain == "")
    (images,) = proto.graph.input
    dims = [d.dim_param or d.dim_value for d in images.type.tensor_type.shape.dim]
    assert images.name == "images" and dims == ["batch", SIZE, SIZE, 3]
    assert images.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert [o.name for o in proto.graph.output] == ["logits", "probabilities"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected, expected_probabilities = keras_outputs(model, test_digits)
    for batch in (1, 7, 30):  # one file, any batch
        logits, probabilities = session.run(None, {"images": test_digits[:batch]})
        np.testing.assert_allclose(logits, expected[:batch], atol=1e-4)
        np.testing.assert_allclose(probabilities, expected_probabilities[:batch], atol=1e-5)
    np.testing.assert_allclose(export.run_onnx(path, test_digits, batch=4), expected,
                               atol=1e-4)
    max_diff, agreement, _ = export.verify_onnx(path, model, test_digits)
    assert max_diff <= 1e-4 and agreement == 1.0
    # class names inside the file and beside it
    assert export.onnx_class_names(path) == NAMES
    assert json.loads(session.get_modelmeta().custom_metadata_map["labels"]) == NAMES
    assert report.labels == str(directory / "vit.labels.txt")
    assert (directory / "vit.labels.txt").read_text().splitlines() == NAMES
    assert sorted(p.name for p in directory.iterdir()) == ["vit.labels.txt", "vit.onnx"]
    text = str(report)
    assert re.search(r"\nopset +15\n", text) and "verified with" in text


@pytest.mark.parametrize("quantization, op", [("dynamic", "DynamicQuantizeLinear"),
                                              ("int8", "QuantizeLinear")])
def test_onnx_int8_calibrates_on_train_and_verifies_on_test(model, digits, quantization,
                                                            op, onnx_export, tmp_path):
    import onnx

    path = tmp_path / f"{quantization}.onnx"
    report = export.to_onnx(model, path, quantization=quantization,
                            representative_data=digits, num_calibration=20,
                            latency_repeats=2, check=False, verbose=False)
    assert report.quantization == quantization
    assert report.calibration == ({"split": "train", "images": 20, "classes": 10,
                                   "source": digits} if quantization == "int8" else None)
    # verified on the source's test split, never on the calibration images
    assert report.validation == {"split": "test", "images": 30, "classes": 10,
                                 "source": digits}
    assert 0 < report.max_abs_diff < 1.0 and report.top1_agreement >= 0.9
    assert report.criteria == ("top-1 agreement >= 97%" if quantization == "int8"
                               else "top-1 agreement >= 99%") + (
        "" if report.passed else " MISSED")
    proto = onnx.load(str(path))
    assert op in {node.op_type for node in proto.graph.node}
    assert report.size_bytes < onnx_export[1].size_bytes
    assert export.onnx_class_names(path) == NAMES
    assert (tmp_path / f"{quantization}.labels.txt").read_text().splitlines() == NAMES
    got = export.run_onnx(path, np.zeros((3, SIZE, SIZE, 3), "float32"))
    assert got.shape == (3, 10)
    assert leftovers(tmp_path) == []


def test_onnx_bad_arguments_name_the_value(model, tmp_path):
    with pytest.raises(ValueError, match=r"quantization='float16'; allowed: \('none', "
                                         r"'dynamic', 'int8'\)"):
        export.to_onnx(model, tmp_path / "m.onnx", quantization="float16")
    with pytest.raises(ValueError, match="path='m.onx': an ONNX file name ends with '.onnx'"):
        export.to_onnx(model, "m.onx")
    with pytest.raises(ValueError, match=r"opset=9; allowed: an int from 13 to 18"):
        export.to_onnx(model, tmp_path / "m.onnx", opset=9)
    with pytest.raises(ValueError, match="quantization='int8' needs representative_data"):
        export.to_onnx(model, tmp_path / "m.onnx", quantization="int8")
    with pytest.raises(ValueError, match=r"validation_data must be RGB images .* got "
                                         r"shape \(4, 32, 32\)"):
        export.to_onnx(model, tmp_path / "m.onnx", validation_data=np.zeros((4, 32, 32)))
    with pytest.raises(ValueError, match="path='m.onnx': an OpenVINO IR file name ends "
                                         "with '.xml'"):
        export.to_openvino(model, "m.onnx")
    with pytest.raises(ValueError, match=r"quantization='int8'; allowed: \('none', "
                                         r"'float16'\)"):
        export.to_openvino(model, tmp_path / "m.xml", quantization="int8")
    assert list(tmp_path.iterdir()) == []


class ErfInv(keras.layers.Layer):
    def call(self, x):
        return keras.ops.erfinv(x / 300.0)


def test_an_op_without_a_conversion_is_named(tmp_path):
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.GlobalAveragePooling2D()(ErfInv()(inputs))
    special = keras.Model(inputs, keras.layers.Dense(3)(x), name="special")
    with pytest.raises(ValueError, match="'special' cannot be exported to ONNX: Erfinv has "
                                         "no ONNX conversion in tf2onnx"):
        export.to_onnx(special, tmp_path / "m.onnx")
    with pytest.raises(ValueError, match="'special' cannot be exported to OpenVINO: Erfinv "
                                         "has no conversion in OpenVINO"):
        export.to_openvino(special, tmp_path / "m.xml")
    assert list(tmp_path.iterdir()) == []


def test_a_missing_dependency_names_the_extra_and_leaves_nothing(model, tmp_path,
                                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ImportError, match=r"\(onnxruntime not installed\): pip install "
                                          r"'keras-vision-transformer\[onnx\]'"):
        export.to_onnx(model, tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(ImportError, match=r"pip install 'keras-vision-transformer"
                                          r"\[openvino\]'"):
        export.to_openvino(model, tmp_path / "m.xml")
    assert list(tmp_path.iterdir()) == []


# --- OpenVINO -------------------------------------------------------------

def test_openvino_float32_matches_keras_on_real_digits_with_any_batch(model, openvino_export,
                                                                      test_digits, digits,
                                                                      bf16_criteria):
    import openvino as ov

    directory, report = openvino_export
    xml, weights = directory / "vit.xml", directory / "vit.bin"
    assert report.passed and report.max_abs_diff <= 1e-4 and report.top1_agreement == 1.0
    assert report.validation == {"split": "test", "images": 30, "classes": 10,
                                 "source": digits}
    assert report.format == "openvino" and report.quantization == "none"
    assert report.size_bytes == os.path.getsize(xml) + os.path.getsize(weights)
    assert report.runtime.startswith("OpenVINO ") and report.runtime.endswith("(CPU, f32)")
    compiled = ov.Core().compile_model(str(xml), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert compiled.input("images").get_partial_shape().to_string() == f"[?,{SIZE},{SIZE},3]"
    expected, expected_probabilities = keras_outputs(model, test_digits)
    for batch in (1, 7, 30):
        result = compiled({"images": test_digits[:batch]})
        np.testing.assert_allclose(result["logits"], expected[:batch], atol=1e-4)
        np.testing.assert_allclose(result["probabilities"], expected_probabilities[:batch],
                                   atol=1e-5)
    max_diff, agreement, _ = export.verify_openvino(xml, model, test_digits)
    assert max_diff <= 1e-4 and agreement == 1.0
    assert export.openvino_class_names(xml) == NAMES
    assert (directory / "vit.labels.txt").read_text().splitlines() == NAMES
    assert sorted(p.name for p in directory.iterdir()) == ["vit.bin", "vit.labels.txt",
                                                           "vit.xml"]
    # bf16: measured where OpenVINO runs it on this CPU, else said so (never faked)
    from keras_vit.export.openvino import bf16_support

    assert report.criteria == ("max |diff| <= 0.0001 and top-1 agreement >= 100%"
                               + bf16_criteria)
    available, reason = bf16_support()
    if bf16_criteria:
        assert available and reason is None
        assert report.bf16["available"] is True and report.bf16["passed"] is True
        assert report.bf16["top1_agreement"] >= 0.99
        assert report.bf16["max_abs_diff"] > 1e-4  # bf16's rounding: not the f32 run
        assert re.search(r"\nbf16 inference +max \|logit diff\| [0-9.e-]+, top-1 agreement "
                         r"[0-9.]+%\n", str(report))
    else:
        if available:  # "BF16" among the capabilities, yet compiled at another precision
            hint = "INFERENCE_PRECISION_HINT"
            asked = ov.Core().compile_model(str(xml), "CPU", {hint: "bf16"})
            reason = (f"OpenVINO compiled it at {asked.get_property(hint).get_type_name()} "
                      "when asked for bf16")
        assert report.bf16 == {"available": False, "reason": reason}
        assert re.search(rf"\nbf16 inference +not available \({re.escape(reason)}\)\n",
                         str(report))


def test_openvino_float16_weights_halve_the_file(model, openvino_export, digits, tmp_path,
                                                 bf16_criteria):
    report = export.to_openvino(model, tmp_path / "fp16.xml", quantization="float16",
                                validation_data=digits, latency_repeats=2, verbose=False)
    assert report.passed and report.criteria == "top-1 agreement >= 99%" + bf16_criteria
    assert report.bf16["available"] is bool(bf16_criteria)
    assert 0 < report.max_abs_diff < 0.05
    assert os.path.getsize(tmp_path / "fp16.bin") < 0.6 * os.path.getsize(
        openvino_export[0] / "vit.bin")


@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_a_failed_check_leaves_the_previous_file_and_the_rejected_one(model, digits, fmt,
                                                                      tmp_path, monkeypatch,
                                                                      request):
    module = export.onnx if fmt == "onnx" else export.openvino
    # OpenVINO adds its bf16 bar (met) where it runs bf16 on this CPU
    bf16 = request.getfixturevalue("bf16_criteria") if fmt == "openvino" else ""
    monkeypatch.setitem(module.CHECKS, "none", {"min_top1_agreement": 1.01})
    suffix = ".onnx" if fmt == "onnx" else ".xml"
    path = tmp_path / f"m{suffix}"
    path.write_text("the previous export")
    run = export.to_onnx if fmt == "onnx" else export.to_openvino
    with pytest.raises(export.ExportVerificationError) as error:
        run(model, path, validation_data=digits, latency_repeats=2, verbose=False)
    message = str(error.value)
    assert message.startswith(f"The {fmt} export (none) fails its check (top-1 agreement "
                              f">= 101% MISSED{bf16})")
    assert message.endswith("pass check=False (keras-vit export: --no-check) to keep it")
    assert path.read_text() == "the previous export"  # untouched
    assert not (tmp_path / "m.labels.txt").exists() and leftovers(tmp_path) == []
    rejected = tmp_path / f"m{suffix}.rejected"
    if fmt == "openvino":  # both files of the IR, for inspection
        assert sorted(p.name for p in rejected.iterdir()) == ["m.bin", "m.xml"]
        assert export.openvino_class_names(rejected / "m.xml") == NAMES
    else:
        assert export.onnx_class_names(rejected) == NAMES
    saved = json.loads((tmp_path / f"m{suffix}.rejected.json").read_text())
    assert saved["passed"] is False and saved["validation"]["split"] == "test"
    # check=False keeps it, with the miss in its report
    report = run(model, path, validation_data=digits, latency_repeats=2, check=False,
                 verbose=False)
    assert report.passed is False and "FAILED (kept: check=False)" in str(report)
    assert path.stat().st_size > 100 and (tmp_path / "m.labels.txt").exists()


# --- the command line (in this process: conftest's run_cli) ---------------

def test_cli_export_onnx_int8_json(model, digits, tmp_path):
    model.save(tmp_path / "m.keras")
    result = run_cli("export", tmp_path / "m.keras", "--format", "onnx", "--quantize", "int8",
                     "--calibration", digits, "--calibration-samples", "20", "--out",
                     tmp_path / "m.onnx", "--no-check", "--json")
    assert result.code == 0, result.err[-3000:]
    report = json.loads(result.out.strip().splitlines()[-1])
    assert report["format"] == "onnx" and report["quantization"] == "int8"
    assert report["opset"] == 15 and report["labels"] == str(tmp_path / "m.labels.txt")
    assert report["calibration"]["split"] == "train" and report["calibration"]["images"] == 20
    assert report["validation"]["split"] == "test" and report["validation"]["images"] == 30
    assert os.path.getsize(tmp_path / "m.onnx") == report["size_bytes"]


@pytest.mark.parametrize("argv, message", [
    (["--format", "onnx", "--quantize", "float16"],
     "--quantize float16 applies to --format tflite or openvino; --format onnx takes "
     "--quantize none|dynamic|int8."),
    (["--format", "openvino", "--quantize", "int8"],
     "--quantize int8 applies to --format tflite or onnx; --format openvino takes "
     "--quantize none|float16."),
    (["--format", "tflite", "--opset", "17"],
     "--opset applies to --format onnx; not to --format tflite."),
    (["--format", "onnx", "--batch-size", "4"],
     "--batch-size applies to --format tflite (a static batch); the onnx export takes any "
     "batch size."),
], ids=["onnx-float16", "openvino-int8", "tflite-opset", "onnx-batch-size"])
def test_cli_export_argument_errors_are_one_line(argv, message, tmp_path):
    result = run_cli("export", tmp_path / "m.keras", *argv, "--out", tmp_path / "m.out")
    assert result.code == 2 and "Traceback" not in result.err
    assert result.err_lines == [f"keras-vit: error: {message}"]
