"""TFLite Metadata in `to_tflite` files (what MediaPipe Tasks' ImageClassifier
needs): read back field by field, the input normalization checked
numerically against the graph, the label file inside the zip, the errors,
`--no-metadata`; MediaPipe itself when it is installed. (The atomic flow
and the quantized files: tests/test_export.py reads their metadata too.)"""

import io
import json
import zipfile

import keras
import numpy as np
import pytest

import keras_vit
from conftest import random_weights, run_cli, tiny_vit
from keras_vit import export
from keras_vit.export import tflite_metadata

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="export needs the TensorFlow backend")
SIZE = 32
NAMES = [f"digit {i}" for i in range(10)]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MODES = ("none", "float16", "dynamic", "int8")


def tiny(**kw):
    """conftest's tiny ViT, 32 wide, 10 logits unless `kw` says otherwise,
    its weights redrawn (scale 0.3)."""
    kw = {"classes": 10, **kw}
    return random_weights(tiny_vit(hidden_size=32, mlp_dim=64, classifier_activation=None,
                                   **kw), scale=0.3)


def pixels(n, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, (n, SIZE, SIZE, 3)).astype("float32")


def keras_logits(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


def mediapipe_style(images, meta):
    """What MediaPipe feeds the graph: (pixel - mean) / std from the metadata."""
    mean = np.asarray(meta["normalization"]["mean"], "float32")
    std = np.asarray(meta["normalization"]["std"], "float32")
    return (images - mean) / std


class Exports:
    """Files exported once per module, by (kind, quantization)."""

    def __init__(self, root):
        self.root, self.files, self.models = root, {}, {}

    def model(self, kind):
        if kind not in self.models:
            if kind == "official":
                model = tiny()
                keras_vit.labels.set_class_names(model, NAMES)
            elif kind == "timm":  # a foreign checkpoint's mean / std in its graph
                model = tiny(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)
            self.models[kind] = model
        return self.models[kind]

    def __call__(self, kind, quantization="none"):
        key = (kind, quantization)
        if key not in self.files:
            path = self.root / f"{kind}_{quantization}.tflite"
            report = export.to_tflite(self.model(kind), path, quantization=quantization,
                                      representative_data=pixels(8, seed=2),
                                      validation_data=pixels(8, seed=3), latency_repeats=2,
                                      check=False, verbose=False)
            self.files[key] = (str(path), report)
        return self.files[key]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return Exports(tmp_path_factory.mktemp("tflite_metadata"))


def test_metadata_reads_back_field_by_field(exports):
    path, report = exports("official")
    meta = export.read_tflite_metadata(path)
    assert meta["name"] == "vision_transformer"
    assert meta["version"] == f"keras_vit {keras_vit.__version__}"
    assert meta["min_parser_version"] == "1.0.0"
    assert "10 classes" in meta["description"] and "[0, 255]" in meta["description"]
    (image,) = meta["inputs"]
    assert (image["name"], image["content"], image["color_space"]) == ("image", "image", "RGB")
    assert image["default_size"] == {"width": SIZE, "height": SIZE}
    assert (image["dtype"], image["shape"]) == ("float32", [1, SIZE, SIZE, 3])
    assert image["process_units"] == [{"type": "normalization", "mean": [0.0] * 3,
                                       "std": [1.0] * 3}]
    assert image["stats"] == {"min": [0.0] * 3, "max": [255.0] * 3}
    assert meta["normalization"] == {"mean": [0.0] * 3, "std": [1.0] * 3}
    assert [o["name"] for o in meta["outputs"]] == ["probabilities", "logits"]
    probabilities, logits = meta["outputs"]
    assert probabilities["stats"] == {"min": [0.0], "max": [1.0]} and logits["stats"] is None
    for output in meta["outputs"]:
        assert (output["content"], output["dtype"], output["shape"]) == ("feature", "float32",
                                                                         [1, 10])
        assert [(f["name"], f["type"]) for f in output["associated_files"]] == [
            ("labels.txt", "TENSOR_AXIS_LABELS")]
        assert output["labels"] == NAMES
    assert meta["labels"] == NAMES
    # the label file is zipped after the flatbuffer, as MetadataPopulator does
    content = open(path, "rb").read()
    assert content[4:8] == b"TFL3"
    with zipfile.ZipFile(io.BytesIO(content)) as archive:
        assert archive.namelist() == ["labels.txt"]
        assert archive.read("labels.txt") == "".join(f"{n}\n" for n in NAMES).encode()
        assert archive.getinfo("labels.txt").compress_type == zipfile.ZIP_STORED
    assert meta["packed_files"] == {"labels.txt": len("".join(f"{n}\n" for n in NAMES))}
    # still beside the file, as before
    assert report.labels == path[:-len(".tflite")] + ".labels.txt"
    assert open(report.labels).read().splitlines() == NAMES
    assert report.metadata == {
        "summary": "TFLite Metadata: RGB image, normalization mean 0 std 1; outputs "
                   "probabilities, logits; 10 labels inside (labels.txt)",
        "normalization": {"mean": [0.0] * 3, "std": [1.0] * 3},
        "normalization_source": "in the graph (ImageNormalization layer 'preprocessing')",
        "labels": 10, "labels_source": "model", "outputs": ["probabilities", "logits"],
        "packed_files": {"labels.txt": 80}}
    assert "metadata                    TFLite Metadata: RGB image" in str(report)
    assert json.loads(report.to_json())["metadata"]["labels"] == 10


def test_outputs_reordered_for_mediapipe_and_weights_aligned(exports):
    import importlib

    from ai_edge_litert.interpreter import Interpreter

    path, _ = exports("official")
    model = exports.model("official")
    interpreter = Interpreter(model_path=path)
    names = [d["name"] for d in interpreter.get_output_details()]
    signature = interpreter.get_signature_list()["serving_default"]["outputs"]
    assert sorted(signature) == ["logits", "probabilities"]
    images = pixels(3, seed=5)
    got_logits = export.run_tflite(path, images)
    got_probabilities = export.run_tflite(path, images, output="probabilities")
    np.testing.assert_allclose(got_logits, keras_logits(model, images), atol=1e-4)
    np.testing.assert_allclose(got_probabilities, keras.ops.convert_to_numpy(
        keras.ops.softmax(keras_logits(model, images))), atol=1e-5)
    meta = export.read_tflite_metadata(path)
    assert names == [o["tensor"] for o in meta["outputs"]]  # subgraph order = metadata order
    schema = importlib.import_module("tensorflow.lite.python.schema_py_generated")
    content = open(path, "rb").read()
    tflite = schema.Model.GetRootAsModel(content, 0)
    starts = [tflite.Buffers(i)._tab.Vector(tflite.Buffers(i)._tab.Offset(4))
              for i in range(tflite.BuffersLength()) if tflite.Buffers(i).DataLength() > 0]
    assert starts and all(start % 16 == 0 for start in starts)


@pytest.mark.parametrize("kind", ["official", "timm"])
def test_normalization_matches_the_graph_numerically(exports, kind):
    """MediaPipe feeds (pixel - mean) / std from the metadata: on raw pixels
    that must give the Keras model's logits on the same raw pixels."""
    path, report = exports(kind)
    model = exports.model(kind)
    meta = export.read_tflite_metadata(path)
    assert meta["normalization"] == {"mean": [0.0] * 3, "std": [1.0] * 3}
    raw = pixels(6, seed=7)
    expected = keras_logits(model, raw)
    got = export.run_tflite(path, mediapipe_style(raw, meta), normalize_input=False)
    np.testing.assert_allclose(got, expected, atol=1e-4)
    # the check can tell: the official formula applied again would be wrong
    wrong = export.run_tflite(path, (raw - 127.5) / 127.5, normalize_input=False)
    assert np.abs(wrong - expected).max() > 0.05
    assert report.passed and report.max_abs_diff <= 1e-4


def test_a_model_without_preprocessing_needs_its_normalization_stated(tmp_path):
    model = tiny(include_preprocessing=False)
    path = tmp_path / "m.tflite"
    with pytest.raises(ValueError, match=r"'vision_transformer' has no input normalization "
                                         r"in its graph \(built with include_preprocessing="
                                         r"False\).*metadata=\{'normalization': \(mean, std\)"
                                         r"\}.*--no-metadata"):
        export.to_tflite(model, path, verbose=False)
    assert not path.exists()
    report = export.to_tflite(model, path, metadata={"normalization": (127.5, 127.5)},
                              latency_repeats=2, verbose=False)
    meta = export.read_tflite_metadata(path)
    assert meta["normalization"] == {"mean": [127.5] * 3, "std": [127.5] * 3}
    assert meta["inputs"][0]["stats"] == {"min": [-1.0] * 3, "max": [1.0] * 3}
    assert report.passed and report.metadata["normalization_source"] == "given"
    raw = pixels(4, seed=8)
    expected = keras_logits(model, keras_vit.normalize_pixels(raw))
    np.testing.assert_allclose(export.run_tflite(path, raw), expected, atol=1e-4)
    np.testing.assert_allclose(
        export.run_tflite(path, mediapipe_style(raw, meta), normalize_input=False), expected,
        atol=1e-4)


def test_dynamic_mode_stores_the_position_embedding_as_float16(exports):
    """What brings ViT-S/16's dynamic-range file to 0.2597 of float32's (from
    0.261): float32 constants of ADD/MUL/SUB/CONCATENATION of at least
    `min_elements` values become float16 + DEQUANTIZE."""
    from keras_vit.export import tflite

    path, _ = exports("official")
    content = open(path, "rb").read()
    before = export.tflite_ops(model_content=content)
    smaller = tflite.float16_constants(content, min_elements=17 * 32)  # the 17x32 posemb
    model = tflite_metadata.unpack_model(smaller)
    halves = [list(t.shape) for t in model.subgraphs[0].tensors if t.type == 1]  # FLOAT16
    assert halves == [[1, 17, 32]] and len(smaller) < len(content)
    after = export.tflite_ops(model_content=smaller)
    assert after.pop("DEQUANTIZE") == 1 and after == before
    assert tflite.float16_constants(content) == content  # nothing that large: unchanged
    images = pixels(3, seed=9)
    from ai_edge_litert.interpreter import Interpreter

    runner = Interpreter(model_content=smaller).get_signature_runner("serving_default")
    got = np.concatenate([runner(images=image[None])["logits"] for image in images])
    expected = keras_logits(exports.model("official"), images)
    np.testing.assert_allclose(got, expected, atol=5e-3)


def test_labels_model_names_imagenet_or_class_i(monkeypatch):
    from keras_vit import preprocessing

    assert tflite_metadata.classifier_labels(tiny(classes=3), 3) == (
        ["class_0", "class_1", "class_2"], "class_<i>")
    imagenet = [f"synset {i}" for i in range(1000)]
    monkeypatch.setattr(preprocessing, "class_names", lambda n: imagenet if n == 1000 else None)
    assert tflite_metadata.classifier_labels(tiny(classes=1000), 1000) == (imagenet,
                                                                          "ImageNet-1k")

    def offline(n):
        raise OSError("no network")

    monkeypatch.setattr(preprocessing, "class_names", offline)
    with pytest.raises(ValueError, match=r"The ImageNet-1k label file for the metadata of "
                                         r"this 1000-class head could not be loaded \(no "
                                         r"network\). Give the names: metadata="):
        tflite_metadata.classifier_labels(tiny(classes=1000), 1000)


def test_bad_metadata_arguments_name_the_value(tmp_path):
    model, path = tiny(), tmp_path / "m.tflite"
    cases = [
        ({"colour": "red"}, ValueError,
         r"metadata has unknown key\(s\) \['colour'\]; allowed: \('name', 'description'"),
        ("yes", TypeError, r"metadata='yes'; give True, False or a dict"),
        ({"version": 2}, TypeError, r"metadata version=2; give a string"),
        ({"labels": ["a", "b"]}, ValueError,
         r"metadata labels has 2 names; the model has 10 classes"),
        ({"labels": [f"x{i}" for i in range(9)] + ["two\nlines"]}, ValueError,
         r"Class name 'two\\nlines' holds a line break"),
        ({"normalization": (0, 0)}, ValueError,
         r"metadata normalization std=0; every std must be > 0"),
        ({"normalization": (0, (1, 2))}, ValueError,
         r"metadata normalization std=\(1, 2\); give a number or 3 numbers"),
        ({"normalization": 127.5}, ValueError,
         r"metadata normalization=127.5; give 'auto' or \(mean, std\)"),
        ({"normalization": (127.5, 127.5)}, ValueError,
         r"metadata normalization=\(127.5, 127.5\), but 'vision_transformer' normalizes "
         r"its input in its graph \(ImageNormalization layer 'preprocessing'\).*twice"),
    ]
    for metadata, error, message in cases:
        with pytest.raises(error, match=message):
            export.to_tflite(model, path, metadata=metadata, verbose=False)
    assert list(tmp_path.iterdir()) == []  # all before the conversion
    path.write_text("not a model")
    with pytest.raises(ValueError, match=r"m.tflite' is not a TFLite model \(no b'TFL3'"):
        export.read_tflite_metadata(path)


def test_metadata_overrides_and_the_reader_command(exports, tmp_path, capsys):
    path, _ = exports("official")
    assert tflite_metadata.main([path]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["labels"] == NAMES and printed["normalization"]["std"] == [1.0] * 3
    info = tflite_metadata.classifier_metadata(
        exports.model("official"), image_size=(SIZE, SIZE),
        metadata={"name": "digits", "version": "7", "author": "me", "license": "MIT",
                  "labels": [str(i) for i in range(10)]})
    content = tflite_metadata.with_classifier_metadata(open(path, "rb").read(), info)
    meta = export.read_tflite_metadata(content)  # a second populate replaces the first
    assert (meta["name"], meta["version"], meta["author"], meta["license"]) == (
        "digits", "7", "me", "MIT")
    assert meta["labels"] == [str(i) for i in range(10)]
    assert meta["packed_files"] == {"labels.txt": 20}


def test_cli_no_metadata(exports, tmp_path, capsys):
    model = exports.model("official")
    model.save(tmp_path / "m.keras")
    result = run_cli("export", tmp_path / "m.keras", "--format", "tflite", "--no-metadata",
                     "--out", tmp_path / "m.tflite", "--json")
    assert result.code == 0
    report = json.loads(result.out.strip().splitlines()[-1])
    assert report["metadata"] is None and report["passed"]
    assert export.read_tflite_metadata(tmp_path / "m.tflite") is None
    assert (tmp_path / "m.labels.txt").read_text().splitlines() == NAMES
    assert tflite_metadata.main([str(tmp_path / "m.tflite")]) == 1
    assert "no TFLite Metadata" in capsys.readouterr().out
    result = run_cli("export", tmp_path / "m.keras", "--format", "saved_model",
                     "--no-metadata", "--out", tmp_path / "sm")
    assert result.code == 2
    assert "--no-metadata applies to --format tflite; not to --format saved_model." in result.err


@pytest.mark.parametrize("quantization", MODES)
def test_mediapipe_image_classifier_opens_it_and_agrees(exports, quantization):
    """MediaPipe Tasks (when installed: `pip install mediapipe`; see
    tests/mediapipe_check/README.md for the full check on a trained model)."""
    pytest.importorskip("mediapipe", reason="mediapipe is not installed (optional)")
    import mediapipe as mp
    import tensorflow as tf
    from mediapipe.tasks.python import vision
    from mediapipe.tasks.python.core.base_options import BaseOptions
    from sklearn.datasets import load_digits, load_sample_images

    path, _ = exports("official", quantization)
    photos = [tf.image.resize(p, (SIZE, SIZE), antialias=True).numpy()
              for p in load_sample_images().images]
    digits = [tf.image.resize(np.repeat(d[..., None] * 255 / 16, 3, -1), (SIZE, SIZE)).numpy()
              for d in load_digits().images[:20]]
    images = np.clip(np.round(np.stack(photos + digits)), 0, 255).astype("uint8")
    options = vision.ImageClassifierOptions(base_options=BaseOptions(model_asset_path=path))
    with vision.ImageClassifier.create_from_options(options) as classifier:
        results = [classifier.classify(mp.Image(image_format=mp.ImageFormat.SRGB,
                                                data=np.ascontiguousarray(image)))
                   for image in images]
    assert [c.head_name for c in results[0].classifications] == ["probabilities", "logits"]
    got = [r.classifications[0].categories[0].category_name for r in results]
    litert = export.run_tflite(path, images.astype("float32"), output="probabilities")
    assert got == [NAMES[i] for i in litert.argmax(-1)]
    scores = np.array([[c.score for c in sorted(r.classifications[0].categories,
                                                 key=lambda c: c.index)] for r in results])
    np.testing.assert_allclose(scores, litert, atol=1e-5)
    if quantization == "none":
        expected = keras_logits(exports.model("official"), images.astype("float32"))
        assert got == [NAMES[i] for i in expected.argmax(-1)]
