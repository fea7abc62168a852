"""Any resolution, also after export (#50, item 3): a model with rotary
position embeddings (DINOv3's, EVA-02's) built with `input_shape=(None,
None, 3)` exports to a SavedModel, ONNX and OpenVINO file whose input keeps
its run-time height and width; each export is verified against the Keras
model at the size it is exported at and at two other sizes
(`export.model.run_time_sizes`: 48x40 and 64x64 for 32 px), and the file
gives the Keras outputs at a fourth size nobody checked. TFLite takes one
size, chosen at export. BEiT's relative position bias is for one patch
grid: it exports at its size. Tiny random models (patch 8, width 64, 2
blocks), TensorFlow only (the exports trace TensorFlow graphs)."""

import json

import keras
import numpy as np
import pytest

from conftest import predict, random_weights, run_cli
from keras_vit import VisionTransformer
from keras_vit.errors import ExportVerificationError

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="export needs the TensorFlow backend")

TINY = dict(patch_size=8, hidden_size=64, num_layers=2, num_heads=2, mlp_dim=96, classes=5,
            classifier_activation=None)
ROPE = {
    "dinov3": dict(rope="dinov3", qkv_bias="none", position_embedding=False,
                   num_register_tokens=4, layer_scale_init=1e-5, classifier="avg"),
    "eva02": dict(rope={"variant": "eva", "ref_grid": (4, 4)}, mlp="swiglu", mlp_norm=True,
                  qkv_bias="qv", classifier="avg", fc_norm=True),
}
BEIT = dict(relative_position_bias=True, qkv_bias="qv", position_embedding=False,
            layer_scale_init=0.1, classifier="avg", fc_norm=True)
EXPORTED = (32, 32)              # the size each export is made and verified at
VERIFIED_TOO = [[48, 40], [64, 64]]
UNSEEN = (40, 56)                # a size neither the export nor its check ran at


def pixels(height, width, n=4, seed=1):
    """uint8-valued float32 pixels (the SavedModel takes uint8)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, height, width, 3)).astype("float32")


@pytest.fixture(scope="module")
def rope_models():
    return {name: random_weights(VisionTransformer(**TINY, **options,
                                                   input_shape=(None, None, 3)))
            for name, options in ROPE.items()}


def _importable(*names):
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in names)


def _export(fmt, model, tmp_path, **kwargs):
    """`(report, run)`: the verified export of `fmt` and a function that
    runs the written file on float32 pixels."""
    import tensorflow as tf

    from keras_vit import export

    kwargs = dict(validation_data=pixels(*EXPORTED), verbose=False, **kwargs)
    if fmt == "saved_model":
        report = export.to_saved_model(model, tmp_path / "sm", **kwargs)
        serve = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
        return report, lambda x: serve(images=tf.constant(x.astype("uint8")))["logits"].numpy()
    if fmt == "onnx":
        if not _importable("tf2onnx", "onnxruntime"):
            pytest.skip("needs the [onnx] extra")
        report = export.to_onnx(model, tmp_path / "m.onnx", latency_repeats=1, **kwargs)
        return report, lambda x: export.run_onnx(tmp_path / "m.onnx", x)
    if not _importable("openvino"):
        pytest.skip("needs the [openvino] extra")
    report = export.to_openvino(model, tmp_path / "m.xml", latency_repeats=1, **kwargs)
    return report, lambda x: export.run_openvino(tmp_path / "m.xml", x)


# Both rotation layouts (DINOv3's halves, EVA-02's interleaved pairs) through
# each converter; the SavedModel is TensorFlow's own graph: one of them.
@pytest.mark.parametrize("fmt, family", [
    ("saved_model", "dinov3"), ("onnx", "dinov3"), ("onnx", "eva02"), ("openvino", "dinov3"),
    ("openvino", "eva02")])
def test_a_rope_export_keeps_any_size_and_is_verified_at_two_more(fmt, family, rope_models,
                                                                  tmp_path):
    model = rope_models[family]
    report, run = _export(fmt, model, tmp_path, image_size=EXPORTED)
    assert report.passed and report.top1_agreement == 1.0
    assert [row["size"] for row in report.run_time_sizes] == VERIFIED_TOO
    for row in report.run_time_sizes:
        assert row["images"] == 4 and row["top1_agreement"] == 1.0
        assert row["max_abs_diff"] <= 1e-5 * max(1.0, row["max_abs_logit"])
    assert "(also at 48x40 and 64x64)" in report.criteria
    assert "at 64x64" in str(report)
    x = pixels(*UNSEEN, n=2, seed=5)
    np.testing.assert_allclose(run(x), predict(model, x), rtol=0, atol=1e-5)
    if fmt != "saved_model":
        assert report.signature["inputs"] == {"images": "float32 [batch, height, width, 3]"}
    if fmt == "onnx":
        import onnx

        proto = onnx.load(str(tmp_path / "m.onnx"))
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims] == ["batch", "height", "width", 3]
        props = {p.key: p.value for p in proto.metadata_props}
        assert props["input"] == ("images: float32 (batch, height, width, 3), any height and "
                                  "width (multiples of 8 and 8) RGB pixels in [0, 255]")


def test_a_miss_at_another_size_rejects_the_export(rope_models, tmp_path, monkeypatch):
    """A file right at its export size and wrong at the others (its runner
    shifted there) is refused, and its report says where."""
    if not _importable("tf2onnx", "onnxruntime"):
        pytest.skip("needs the [onnx] extra")
    from keras_vit.export import onnx as onnx_export

    runner = onnx_export._runner

    def shifted(path, *args):
        run = runner(path, *args)
        return lambda x: run(x) + float(x.shape[1] != EXPORTED[0])

    monkeypatch.setattr(onnx_export, "_runner", shifted)
    with pytest.raises(ExportVerificationError, match=r"MISSED at 48x40 and 64x64\)"):
        _export("onnx", rope_models["dinov3"], tmp_path, image_size=EXPORTED)
    assert not (tmp_path / "m.onnx").exists() and (tmp_path / "m.onnx.rejected").exists()
    rejected = json.loads((tmp_path / "m.onnx.rejected.json").read_text())
    assert rejected["passed"] is False and rejected["max_abs_diff"] <= 1e-5
    assert [row["max_abs_diff"] >= 0.99 for row in rejected["run_time_sizes"]] == [True, True]


def test_tflite_takes_the_one_size_chosen_at_export(rope_models, tmp_path):
    """EVA-02's rotation and its position embedding's resize, both computed
    for 48x40 when converted."""
    from keras_vit import export

    model = rope_models["eva02"]
    x = pixels(48, 40)
    report = export.to_tflite(model, tmp_path / "m.tflite", image_size=(48, 40),
                              validation_data=x, latency_repeats=1, verbose=False)
    assert report.passed and report.builtin_ops_only and report.run_time_sizes is None
    assert export.read_tflite_metadata(tmp_path / "m.tflite")["inputs"][0]["shape"] == [
        1, 48, 40, 3]
    np.testing.assert_allclose(export.run_tflite(tmp_path / "m.tflite", x), predict(model, x),
                               rtol=0, atol=1e-4)


def test_cli_exports_a_rope_model_for_any_size_from_image_size(rope_models, tmp_path):
    """`keras-vit export --image-size`: the size a model built for any size
    is verified at (its two others follow from it)."""
    rope_models["eva02"].save(tmp_path / "eva.keras")
    code, out, err = run_cli("export", tmp_path / "eva.keras", "--format", "saved_model",
                             "--image-size", "16", "--out", tmp_path / "served", "--json")
    assert code == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["passed"] and report["validation"]["source"] == "random pixels"
    assert [row["size"] for row in report["run_time_sizes"]] == [[32, 24], [32, 32]]
    code, _, err = run_cli("export", tmp_path / "eva.keras", "--format", "timm",
                           "--image-size", "16", "--out", tmp_path / "hub")
    assert code == 2 and "--image-size applies to --format saved_model, tflite, onnx or " \
        "openvino" in err


def test_beit_exports_at_its_one_size(tmp_path):
    """BEiT's tables are for one grid: SavedModel, TFLite and ONNX at its
    32 px, no other size checked (OpenVINO converts the graph ONNX does)."""
    from keras_vit import export

    model = random_weights(VisionTransformer(**TINY, **BEIT, input_shape=(32, 32, 3)))
    x = pixels(32, 32)
    reports = [export.to_saved_model(model, tmp_path / "sm", validation_data=x, verbose=False),
               export.to_tflite(model, tmp_path / "m.tflite", validation_data=x,
                                latency_repeats=1, verbose=False)]
    if _importable("tf2onnx", "onnxruntime"):
        reports.append(export.to_onnx(model, tmp_path / "m.onnx", validation_data=x,
                                      latency_repeats=1, verbose=False))
    for report in reports:
        assert report.passed and report.run_time_sizes is None, report.format
        assert report.max_abs_diff <= 1e-5 * max(1.0, report.max_abs_logit), report.format
