"""keras_vit.export: SavedModel and TFLite/LiteRT exports of every family,
verified against Keras; quantization modes; errors; the CLI."""

import json
import os
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import keras_vit
from conftest import random_weights, run_cli, tiny_mixer, tiny_vit
from data_helpers import write_digit_folder
from keras_vit import export
from keras_vit.export._report import evaluate, reject
from keras_vit.layers.fused import portable_graph

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="export needs the TensorFlow backend")
SIZE = 32


def tiny(family, classifier_activation=None, classes=5):
    """conftest's tiny model of `family`, its weights redrawn: a ViT of two
    blocks pooled by `family` ("token", "gap"), a hybrid on a one-unit
    ResNet stem, or a Mixer of two blocks; 32x32 images."""
    kw = dict(classes=classes, classifier_activation=classifier_activation)
    if family == "mixer":
        model = tiny_mixer(num_blocks=2, **kw)
    elif family == "hybrid":
        model = tiny_vit(patch_size=1, resnet_layers=(1,), **kw)
    else:
        model = tiny_vit(num_layers=2, classifier=family, **kw)
    return random_weights(model)


def pixels(n, size=SIZE, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (n, size, size, 3)).astype("float32")


def logits(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


FAMILIES = ["token", "gap", "hybrid", "mixer"]


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_model_reloads_identical(family, tmp_path):
    model = tiny(family)
    images = pixels(6)
    report = export.to_saved_model(model, tmp_path / "sm", validation_data=images,
                                   verbose=False)
    assert report.passed and report.validation_images == 6
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    uint8 = images.astype("uint8")
    got = served(images=tf.constant(uint8))
    serve, spec = export.serving_function(model)
    with portable_graph():  # the graph to_saved_model traces
        before_saving = tf.function(serve, input_signature=[spec])(tf.constant(uint8))
    for key in ("logits", "probabilities", "top_k_indices", "top_k_probabilities"):
        assert np.array_equal(got[key].numpy(), before_saving[key].numpy()), key
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((tmp_path / "sm" / "saved_model.pb").read_bytes())
    saved_ops = {node.op for function in saved.meta_graphs[0].graph_def.library.function
                 for node in function.node_def}
    assert not {"FusedBatchNormV3", "Bitcast"} & saved_ops  # converts anywhere
    np.testing.assert_allclose(got["logits"], logits(model, uint8.astype("float32")),
                               atol=1e-5)
    np.testing.assert_allclose(got["probabilities"].numpy().sum(-1), 1.0, atol=1e-6)
    expected_top = np.argsort(-got["probabilities"].numpy(), axis=-1)[:, :5]
    assert np.array_equal(got["top_k_indices"].numpy(), expected_top)
    assert report.signature["outputs"]["top_k_indices"] == "int32 [None, 5]"


@pytest.mark.parametrize("family", FAMILIES)
def test_tflite_float32_matches_keras_with_builtin_ops_only(family, tmp_path):
    model = tiny(family)
    report = export.to_tflite(model, tmp_path / "m.tflite", validation_data=pixels(8),
                              latency_repeats=3, verbose=False)
    assert report.passed and report.max_abs_diff <= 1e-4
    assert report.top1_agreement == 1.0
    assert report.builtin_ops_only
    assert not any(op.startswith("Flex") or op == "CUSTOM" for op in report.ops)
    assert report.ops.get("FULLY_CONNECTED", 0) > 0 and report.ops.get("SOFTMAX", 0) > 0
    assert report.size_bytes == os.path.getsize(tmp_path / "m.tflite")
    got = export.run_tflite(str(tmp_path / "m.tflite"), pixels(3, seed=5))
    np.testing.assert_allclose(got, logits(model, pixels(3, seed=5)), atol=1e-4)


def test_static_batch_and_a_partial_last_batch(tmp_path):
    model = tiny("token")
    path = str(tmp_path / "b4.tflite")
    report = export.to_tflite(model, path, batch_size=4, validation_data=pixels(6),
                              latency_repeats=3, verbose=False)
    assert report.batch_size == 4 and report.validation_images == 6
    np.testing.assert_allclose(export.run_tflite(path, pixels(6)), logits(model, pixels(6)),
                               atol=1e-4)


@pytest.fixture(scope="module")
def fp32_token10(tmp_path_factory):
    """The float32 export of `tiny("token", classes=10)` (its weights are
    seeded: the same model in each test), made once."""
    return export.to_tflite(tiny("token", classes=10),
                            tmp_path_factory.mktemp("fp32") / "fp32.tflite",
                            validation_data=pixels(24, seed=3), latency_repeats=3,
                            verbose=False)


@pytest.mark.parametrize("quantization", ["float16", "dynamic", "int8"])
def test_quantized_exports_run_and_their_figures_are_measured(quantization, tmp_path,
                                                              fp32_token10):
    model = tiny("token", classes=10)
    calibration, validation = pixels(32, seed=2), pixels(24, seed=3)
    path = str(tmp_path / f"{quantization}.tflite")
    report = export.to_tflite(model, path, quantization=quantization,
                              representative_data=calibration, validation_data=validation,
                              latency_repeats=3, check=False, verbose=False)
    fp32 = fp32_token10
    assert report.quantization == quantization and report.latency_ms > 0
    meta = export.read_tflite_metadata(path)  # MediaPipe's input: float, as raw pixels
    assert meta["inputs"][0]["dtype"] == "float32" and meta["outputs"][0]["dtype"] == "float32"
    assert meta["normalization"] == {"mean": [0.0] * 3, "std": [1.0] * 3}
    assert 0 < report.max_abs_diff < 1.0  # quantized: not bit-exact, but close
    assert report.size_bytes < fp32.size_bytes
    if quantization == "int8":
        assert report.float_ops == list(export.INT8_FLOAT_OPS)
        assert report.ops.get("QUANTIZE", 0) > 0 and report.ops.get("DEQUANTIZE", 0) > 0
    # The same file against a perturbed Keras model: the figures move.
    perturbed = tiny("token", classes=10)
    head = perturbed.get_layer("head")
    rng = np.random.default_rng(9)
    head.kernel.assign(rng.normal(size=head.kernel.shape).astype("float32"))
    max_diff, agreement, _ = export.verify_tflite(path, perturbed, validation)
    assert agreement < report.top1_agreement and max_diff > 10 * report.max_abs_diff


def test_int8_needs_calibration_data(tmp_path):
    with pytest.raises(ValueError, match="quantization='int8' needs representative_data"):
        export.to_tflite(tiny("token"), tmp_path / "m.tflite", quantization="int8")
    with pytest.raises(ValueError, match="representative_data holds 2 images; int8 "
                                         "calibration needs at least batch_size=4"):
        export.to_tflite(tiny("token"), tmp_path / "m.tflite", quantization="int8",
                         representative_data=pixels(2), batch_size=4)


def test_bad_arguments_name_the_value(tmp_path):
    model = tiny("token")
    with pytest.raises(ValueError, match=r"quantization='int4'; allowed: \('none', "
                                         r"'float16', 'dynamic', 'int8'\)"):
        export.to_tflite(model, tmp_path / "m.tflite", quantization="int4")
    with pytest.raises(ValueError, match="path='m.tfl': a TFLite file name ends with"):
        export.to_tflite(model, "m.tfl")
    with pytest.raises(ValueError, match=r"validation_data must be RGB images .* got "
                                         r"shape \(4, 32, 32\)"):
        export.to_tflite(model, tmp_path / "m.tflite", validation_data=np.zeros((4, 32, 32)))
    with pytest.raises(ValueError, match="top_k=0; give a positive int"):
        export.to_saved_model(model, tmp_path / "sm", top_k=0)


def test_verify_takes_images_not_a_source_string(tmp_path):
    for verify in (export.verify_tflite, export.verify_onnx, export.verify_openvino):
        with pytest.raises(TypeError, match=re.escape(
                "images='folder:/data/digits'; give images: an array (N, height, width, 3) "
                "of RGB pixels in [0, 255] or a tf.data.Dataset (sample a data source "
                "first: keras_vit.data.sample.sample_images).")):
            verify(tmp_path / "m.file", tiny("token"), "folder:/data/digits")
    assert list(tmp_path.iterdir()) == []


def test_serving_resizes_any_size_and_rejects_wrong_channels(tmp_path):
    model = tiny("gap", classifier_activation="softmax")
    export.to_saved_model(model, tmp_path / "sm", resize=True, top_k=3, verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    big = np.random.default_rng(4).integers(0, 256, (2, 48, 40, 3)).astype("uint8")
    got = served(images=tf.constant(big))
    resized = tf.image.resize(big.astype("float32"), (SIZE, SIZE)).numpy()
    np.testing.assert_allclose(got["probabilities"], logits(model, resized), atol=1e-5)
    assert got["top_k_indices"].shape == (2, 3)
    # softmax head: the logits are its pre-activation
    features = keras.Model(model.input, model.get_layer("head").input)(resized)
    head = model.get_layer("head")
    expected_logits = features.numpy() @ head.kernel.numpy() + head.bias.numpy()
    np.testing.assert_allclose(got["logits"], expected_logits, atol=1e-4)
    for channels in (1, 4):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="`images` must be RGB, uint8 .*got this many channels"):
            served(images=tf.zeros((1, 48, 40, channels), tf.uint8))


def test_fixed_size_signature_rejects_another_size(tmp_path):
    export.to_saved_model(tiny("token"), tmp_path / "sm", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"`images` must be 32x32 \(export with resize=True"):
        served(images=tf.zeros((1, 48, 48, 3), tf.uint8))


class ErfInv(keras.layers.Layer):
    def call(self, x):
        return keras.ops.erfinv(x / 300.0)


def test_an_op_without_a_builtin_kernel_is_named(tmp_path):
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.GlobalAveragePooling2D()(ErfInv()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(x), name="special")
    with pytest.raises(ValueError, match="'special' cannot be exported to TFLite with "
                                         "built-in ops only: Erfinv has no TFLite"):
        export.to_tflite(model, tmp_path / "m.tflite")
    assert not (tmp_path / "m.tflite").exists()


def test_ambiguous_outputs_must_be_named(tmp_path):
    inputs = keras.Input((SIZE, SIZE, 3))
    x = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(inputs))
    model = keras.Model(inputs, keras.layers.Activation("sigmoid")(x), name="sig")
    with pytest.raises(ValueError, match="Cannot tell whether 'sig' outputs logits or "
                                         "probabilities .*pass outputs='logits'"):
        export.to_tflite(model, tmp_path / "m.tflite")
    report = export.to_tflite(model, tmp_path / "m.tflite", outputs="logits",
                              latency_repeats=3, verbose=False)
    assert report.passed


def test_a_failing_check_raises_and_keeps_the_file_aside(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(b"model")
    given = {"split": None, "images": 100, "classes": None, "source": "given array"}
    report = export.ExportReport(format="tflite", path=str(path), quantization="int8",
                                 size_bytes=5, validation=given,
                                 max_abs_diff=0.5, top1_agreement=0.9, max_abs_logit=3.0)
    # what `export_verified` does with a report: judge it, reject a miss
    assert not evaluate(report, **export.CHECKS["int8"])
    with pytest.raises(export.ExportVerificationError,
                       match=r"fails its check \(top-1 agreement >= 97% MISSED\).*90.00% "
                             r"on 100 images \(given array\)") as error:
        reject(report)
    assert error.value.report.passed is False
    assert str(error.value).endswith("pass check=False (keras-vit export: --no-check) "
                                     "to keep it")
    assert not path.exists() and (tmp_path / "m.tflite.rejected").read_bytes() == b"model"
    saved = json.loads((tmp_path / "m.tflite.rejected.json").read_text())
    assert saved["passed"] is False and saved["path"].endswith("m.tflite.rejected")
    scaled = export.ExportReport(format="tflite", path=str(path), quantization="none",
                                 size_bytes=5, validation=dict(given, images=1),
                                 max_abs_diff=2e-2, top1_agreement=1.0, max_abs_logit=100.0)
    path.write_bytes(b"model")
    assert not evaluate(scaled, **export.CHECKS["none"])
    with pytest.raises(export.ExportVerificationError,
                       match=r"max \|diff\| <= 0.0001 x max \|logit\| 100"):
        reject(scaled)
    scaled.max_abs_diff = 5e-3  # within 1e-4 x 100 = 1e-2: passes
    path.write_bytes(b"model")
    scaled.path = str(path)
    assert evaluate(scaled, **export.CHECKS["none"]) and scaled.passed
    assert path.read_bytes() == b"model"  # a pass is not moved


def test_report_prints_and_serialises(tmp_path, capsys, caplog):
    """The library prints nothing (`print(report)` shows it once) and logs
    one line; the CLI prints the report."""
    with caplog.at_level("INFO", logger="keras_vit"):
        report = export.to_tflite(tiny("token"), tmp_path / "m.tflite", latency_repeats=3)
    assert capsys.readouterr().out == ""
    assert [r.getMessage() for r in caplog.records if "passed its check" in r.getMessage()] == [
        f"The tflite export (none) at {tmp_path / 'm.tflite'} passed its check "
        f"({report.criteria}): max |diff| {report.max_abs_diff:.3g}, top-1 agreement "
        "100.00% on 8 images (random pixels)."]
    text = str(report)
    assert "top-1 agreement with Keras  100.00%" in text and "built-in ops only" in text
    data = json.loads(report.to_json())
    assert data["format"] == "tflite" and data["ops"] == report.ops
    assert data["validation"] == {"split": None, "images": 8, "classes": None,
                                  "source": "random pixels"}
    assert data["calibration"] is None and data["labels"] is None
    assert data["keras_latency_ms"] > 0 and "8 images (random pixels)" in text
    fields = {k: v for k, v in data.items() if k != "size_mb"}
    assert export.ExportReport(**fields).to_dict() == data  # what `quickstart` prints


def test_cli_export_json(tmp_path):
    model = tiny("token", classes=3)
    model.save(tmp_path / "m.keras")
    folder = tmp_path / "images"  # 40x40 digits: resized to the model's 32x32
    write_digit_folder(str(folder), names=("a", "b", "c"), size=40,
                       splits={"train": 4, "test": 4})
    base = ["export", tmp_path / "m.keras"]
    result = run_cli(*base, "--format", "tflite", "--quantize", "dynamic",
                     "--calibration", f"folder:{folder}", "--out", tmp_path / "m.tflite",
                     "--json")
    assert result.code == 0, result.err[-3000:]
    report = json.loads(result.out.strip().splitlines()[-1])
    assert report["quantization"] == "dynamic" and report["calibration"] is None
    # verified on the calibration source's test split, not on its train images
    assert report["validation"] == {"split": "test", "images": 12, "classes": 3,
                                    "source": f"folder:{folder}"}
    assert os.path.getsize(report["path"]) == report["size_bytes"]
    result = run_cli(*base, "--format", "saved_model", "--quantize", "int8", "--out",
                     tmp_path / "sm")
    assert result.code == 2
    assert "--quantize int8 applies to --format tflite" in result.err


# --- calibration / validation samples, atomic writes, labels -------------

DIGIT_NAMES = [f"digit {i}" for i in range(10)]


@pytest.fixture(scope="module")
def digits(few_digits_folder):
    """`folder:DIR` of real scikit-learn digits (conftest): train/ 6 and
    test/ 3 per class (sorted file order puts every class 0 first, as in
    the issue)."""
    return f"folder:{few_digits_folder}"


def named(model):
    keras_vit.labels.set_class_names(model, DIGIT_NAMES)
    return model


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


def test_sample_images_is_stratified_and_seeded(digits):
    from keras_vit.data.sample import sample_images

    sample = sample_images(digits, "train", image_size=SIZE, count=10, seed=0)
    assert sample.images.shape == (10, SIZE, SIZE, 3) and sample.images.dtype == np.float32
    assert 0 <= sample.images.min() and sample.images.max() <= 255
    assert sorted(sample.labels) == list(range(10)) and sample.classes == 10
    assert sample.split == "train" and sample.source == digits
    assert sample.class_names == [str(i) for i in range(10)]
    assert all(f"/train/{label}/" in name for label, name in zip(sample.labels, sample.names,
                                                                          strict=True))
    again = sample_images(digits, "train", image_size=SIZE, count=10, seed=0)
    assert again.names == sample.names and np.array_equal(again.images, sample.images)
    other = sample_images(digits, "train", image_size=SIZE, count=10, seed=1)
    assert other.names != sample.names and other.classes == 10
    counts = np.bincount(sample_images(digits, "train", image_size=SIZE, count=25).labels)
    assert counts.min() >= 2 and counts.max() <= 3  # round-robin over the classes
    assert len(sample_images(digits, "test", image_size=SIZE, count=None)) == 30
    with pytest.raises(ValueError, match=re.escape(
            "`count` must be a positive integer or None (None: the whole split), got 0.")):
        sample_images(digits, "train", image_size=SIZE, count=0)


def test_validation_never_reuses_the_calibration_images(digits):
    from keras_vit.export import _images

    size = (SIZE, SIZE)
    assert _images.default_validation_split(digits) == "test"
    calibration = _images.calibration_data(digits, size, 20, "train")
    assert calibration.info == {"split": "train", "images": 20, "classes": 10,
                                "source": digits}
    validation = _images.validation_data_for(None, size, 2000, None, calibration_source=digits,
                                             calibration=calibration)
    assert validation.info == {"split": "test", "images": 30, "classes": 10, "source": digits}
    same = _images.validation_data_for(None, size, 2000, "train", calibration_source=digits,
                                       calibration_split="train", calibration=calibration)
    assert len(same.images) == 40 and not set(same.sample.names) & set(
        calibration.sample.names)
    arrays = _images.calibration_data(pixels(5), size, 500)
    chosen = _images.validation_data_for(None, size, 2000, None, calibration=arrays)
    assert chosen.info["source"] == "calibration images" and len(chosen.images) == 5


def test_int8_calibrates_on_a_stratified_train_sample_and_verifies_on_test(digits, tmp_path):
    model = named(tiny("token", classes=10))
    path = tmp_path / "m.tflite"
    report = export.to_tflite(model, path, quantization="int8", representative_data=digits,
                              num_calibration=20, latency_repeats=2, check=False,
                              verbose=False)
    assert report.calibration == {"split": "train", "images": 20, "classes": 10,
                                  "source": digits}
    assert report.validation == {"split": "test", "images": 30, "classes": 10,
                                 "source": digits}
    assert report.criteria and report.passed in (True, False)
    assert path.exists() and report.path == str(path)
    assert report.labels == str(tmp_path / "m.labels.txt")
    assert (tmp_path / "m.labels.txt").read_text().splitlines() == DIGIT_NAMES
    assert "calibration" in str(report) and "20 images, 10 classes" in str(report)
    assert leftovers(tmp_path) == []


def test_a_failed_check_leaves_only_the_rejected_file(digits, tmp_path, monkeypatch):
    monkeypatch.setitem(export.CHECKS, "none", {"min_top1_agreement": 1.01})
    path = tmp_path / "m.tflite"
    with pytest.raises(export.ExportVerificationError) as error:
        export.to_tflite(named(tiny("token", classes=10)), path, validation_data=digits,
                         latency_repeats=2, verbose=False)
    message = str(error.value)
    assert message.endswith("pass check=False (keras-vit export: --no-check) to keep it")
    assert "top-1 agreement >= 101% MISSED" in message and "split 'test'" in message
    assert not path.exists() and not (tmp_path / "m.labels.txt").exists()
    assert (tmp_path / "m.tflite.rejected").stat().st_size > 0
    assert export.read_tflite_metadata(tmp_path / "m.tflite.rejected")["labels"] == DIGIT_NAMES
    saved = json.loads((tmp_path / "m.tflite.rejected.json").read_text())
    assert saved["passed"] is False and saved["validation"]["split"] == "test"
    assert leftovers(tmp_path) == []


def test_check_false_keeps_the_file_and_reports_the_missed_bar(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(export.CHECKS, "none", {"min_top1_agreement": 1.01})
    path = tmp_path / "m.tflite"
    with caplog.at_level("WARNING", logger="keras_vit"):
        report = export.to_tflite(tiny("token"), path, latency_repeats=2, check=False,
                                  verbose=False)
    assert path.exists() and report.path == str(path)
    assert report.passed is False and report.criteria == "top-1 agreement >= 101% MISSED"
    assert "misses its check" in caplog.text and "--no-check" in caplog.text
    assert "FAILED (kept: check=False)" in str(report)
    assert json.loads(report.to_json())["passed"] is False
    assert not (tmp_path / "m.tflite.rejected").exists() and leftovers(tmp_path) == []


def test_a_missing_runtime_leaves_nothing(tmp_path, monkeypatch):
    from keras_vit.export import tflite

    def no_runtime(*args, **kwargs):
        raise ImportError("Running and verifying TFLite files needs the LiteRT runtime")

    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    with pytest.raises(ImportError, match="pip install ai-edge-litert"):  # before converting
        export.to_tflite(tiny("token"), tmp_path / "m.tflite", verbose=False)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    monkeypatch.setattr(tflite, "_interpreter", no_runtime)  # while verifying
    with pytest.raises(ImportError, match="LiteRT runtime"):
        export.to_tflite(named(tiny("token", classes=10)), tmp_path / "m.tflite",
                         latency_repeats=2, verbose=False)
    assert list(tmp_path.iterdir()) == []


def test_saved_model_has_labels_and_replaces_only_after_verification(digits, tmp_path,
                                                                     monkeypatch):
    from keras_vit.export import saved_model

    model = named(tiny("token", classes=10))
    path = tmp_path / "sm"
    path.mkdir()
    (path / "saved_model.pb").write_text("the previous export")
    (path / "fingerprint.pb").write_text("the previous export")  # a file the export writes
    bars = saved_model.CHECKS["none"]
    monkeypatch.setitem(saved_model.CHECKS, "none", {"min_top1_agreement": 1.01})
    with pytest.raises(export.ExportVerificationError):
        export.to_saved_model(model, path, validation_data=digits, verbose=False)
    assert (path / "fingerprint.pb").read_text() == "the previous export"  # untouched
    assert (tmp_path / "sm.rejected" / "saved_model.pb").exists()
    assert (tmp_path / "sm.rejected.json").exists() and leftovers(tmp_path) == []
    monkeypatch.setitem(saved_model.CHECKS, "none", bars)
    report = export.to_saved_model(model, path, validation_data=digits, verbose=False)
    assert report.passed and (path / "fingerprint.pb").read_bytes() != b"the previous export"
    assert report.validation == {"split": "test", "images": 30, "classes": 10,
                                 "source": digits}
    assert report.labels == str(path / "assets" / "labels.txt")
    assert (path / "assets" / "labels.txt").read_text().splitlines() == DIGIT_NAMES
    loaded = tf.saved_model.load(str(path))
    with open(loaded.labels.asset_path.numpy().decode()) as f:
        assert f.read().splitlines() == DIGIT_NAMES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sm", "sm.rejected",
                                                          "sm.rejected.json"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a SavedModel")
    with pytest.raises(ValueError, match="holds no saved_model.pb; an export replaces only"):
        export.to_saved_model(model, tmp_path / "other", verbose=False)
    assert (tmp_path / "other" / "notes.txt").exists()
