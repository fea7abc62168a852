"""`to_tflite`: LiteRT (TFLite) flatbuffers with built-in ops only, in
float32, float16, dynamic-range int8 or full int8, run and verified with
`ai-edge-litert`, written atomically with TFLite Metadata inside (input
normalization, label file: what MediaPipe Tasks' `ImageClassifier` needs,
see `tflite_metadata`) and the class names beside them
(`<stem>.labels.txt`).

A `to_tflite` file in MediaPipe (`pip install mediapipe`), on one image:

>>> import mediapipe as mp  # not a test dependency  # doctest: +SKIP
>>> from mediapipe.tasks.python import vision  # doctest: +SKIP
>>> classifier = vision.ImageClassifier.create_from_model_path("vit.tflite")  # doctest: +SKIP
>>> result = classifier.classify(mp.Image.create_from_file("cat.jpg"))  # doctest: +SKIP
>>> result.classifications[0].categories[0].category_name  # doctest: +SKIP
'cat'
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import os
import tempfile
import warnings
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_vit import _compat
from keras_vit._framework_text import tflite_unsupported_ops
from keras_vit.export.batches import check_batch_size
from keras_vit.export._images import INT8_NEEDS_DATA, Sampling, as_images, calibration_data
from keras_vit.export._measure import compare
from keras_vit.export.model import (
    export_image_size,
    logits_and_probabilities,
    output_kind,
    reference_logits,
    exported_model,
    require_tensorflow_backend,
)
from keras_vit.export._pipeline import (
    ExportFormat,
    check_file_path,
    check_quantization,
    export_verified,
)
from keras_vit.export._report import ExportReport
from keras_vit.export.tflite_metadata import (
    classifier_metadata,
    normalize,
    pack_model,
    read_tflite_metadata,
    summary,
    unpack_model,
    with_classifier_metadata,
)
from keras_vit.layers.fused import portable_graph

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")
# Full int8: these TFLite ops stay in float (measured on the quickstart's
# digits ViT, see docs/deploy.md): quantizing Softmax and GELU
# outputs and the LayerNorm statistics is where ViTs lose accuracy.
INT8_FLOAT_OPS = ("SOFTMAX", "GELU", "MEAN", "SQUARED_DIFFERENCE", "RSQRT")
# What each mode must reach against Keras on the validation images.
CHECKS = {
    "none": {"max_abs_diff": 1e-4, "min_top1_agreement": 1.0},
    "float16": {"min_top1_agreement": 0.99},
    "dynamic": {"min_top1_agreement": 0.99},
    "int8": {"min_top1_agreement": 0.97},
}


def _float_ops(float_ops):
    return list(INT8_FLOAT_OPS if float_ops == "auto" else float_ops or ())


RUNTIME_MISSING = ("Running and verifying TFLite files needs the LiteRT runtime: "
                   "pip install ai-edge-litert (or 'keras-vision-transformer[export]').")


def _interpreter(model_path=None, model_content=None, num_threads=None, delegates=True):
    try:  # optional: the [export] extra
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        raise ImportError(RUNTIME_MISSING) from None

    kwargs = {} if delegates else {
        "experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    return Interpreter(model_path=model_path, model_content=model_content,
                       num_threads=num_threads or os.cpu_count(), **kwargs)


def tflite_ops(model_path=None, model_content=None):
    """Op name -> count in a TFLite model (before any delegate)."""
    interpreter = _interpreter(model_path, model_content, delegates=False)
    return dict(collections.Counter(_compat.tflite_op_names(interpreter)))


def run_tflite(model_path, images, *, num_threads=None, output="logits", normalize_input=True):
    """Runs a `to_tflite` file on `images` (N, H, W, 3) float32 pixels in
    [0, 255] in batches of its static batch size; returns `output` for all N
    (a partial last batch is padded, and the padding dropped).

    The pixels are normalized as the file's TFLite metadata says (as
    MediaPipe does: `(pixel - mean) / std`; mean 0, std 1 for a model that
    normalizes in its graph, the default); `normalize_input=False` feeds
    `images` as they are."""
    if normalize_input:
        images = normalize(images, read_tflite_metadata(model_path))
    return _runner(model_path, num_threads=num_threads, output=output)(images)


def _runner(model_path, num_threads=None, output="logits"):
    """Loads a `to_tflite` file once: a function of images (N, H, W, 3),
    float32 as the graph takes them (not normalized here) -> `output` for
    all N, in batches of the file's static batch size (a partial last batch
    padded, the padding dropped)."""
    interpreter = _interpreter(model_path, num_threads=num_threads)
    runner = interpreter.get_signature_runner("serving_default")
    batch = runner.get_input_details()["images"]["shape"][0]

    def run(images):
        results = []
        for start in range(0, len(images), batch):
            chunk = np.asarray(images[start:start + batch], "float32")
            n = len(chunk)
            if n < batch:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, 0)])
            results.append(runner(images=chunk)[output][:n])
        return np.concatenate(results)

    return run


def verify_tflite(path, model, images, *, image_size=None, outputs="auto", num_threads=None):
    """Compares a `to_tflite` file with a Keras model on `images`.

    Returns `(max |logit diff|, top-1 agreement, max |Keras logit|)`; use
    it to check a file shipped earlier against the model it came from.
    `images` are 0..255 pixels: both sides get them normalized as the
    file's metadata says (the graph is the Keras model's).
    """
    size = export_image_size(model, image_size)
    images = as_images(images, size, len(images), name="images")
    inputs = normalize(images, read_tflite_metadata(path))
    reference = reference_logits(model, inputs, outputs)
    return compare(reference, run_tflite(path, inputs, num_threads=num_threads,
                                         normalize_input=False))


def convert(model, *, quantization="none", representative_data=None, batch_size=1,
            image_size=None, outputs="auto", float_ops="auto", num_calibration=500,
            calibration_split="train", seed=0):
    """The TFLite flatbuffer (bytes) of `model` with built-in ops only.

    The graph takes `images`: float32 `(batch_size, H, W, 3)` pixels in
    [0, 255] and returns `logits` and `probabilities`, in a
    `serving_default` signature. Raises ValueError naming any op that has
    no TFLite built-in kernel (no Flex / SELECT_TF_OPS fallback). Under
    `"int8"`, a source string calibrates on a seeded class-stratified
    sample of `num_calibration` images of its `calibration_split`; an
    array or dataset on its first `num_calibration` images. Nothing is
    verified here (see `to_tflite`)."""
    require_tensorflow_backend()
    quantization = check_quantization(quantization, QUANTIZATIONS)
    size = export_image_size(model, image_size)
    batch_size = check_batch_size(batch_size, size)
    call = logits_and_probabilities(model, outputs)
    calibration = None
    if quantization == "int8":
        calibration = calibration_data(representative_data, size, num_calibration,
                                       calibration_split, seed)
        if calibration is None:
            raise ValueError(INT8_NEEDS_DATA)
        calibration = calibration.images
        if len(calibration) < batch_size:
            raise ValueError(f"representative_data holds {len(calibration)} images; "
                             f"int8 calibration needs at least batch_size={batch_size}.")
    float_ops = _float_ops(float_ops)
    converter_error = _compat.tflite_converter_error()

    def serve(images):
        logits, probabilities = call(images)
        return {"logits": logits, "probabilities": probabilities}

    with tempfile.TemporaryDirectory() as saved_model_dir:
        # TFLite has no training-mode FusedBatchNormV3: trace the standard ops.
        with portable_graph():
            archive = keras.export.ExportArchive()
            archive.track(model)
            archive.add_endpoint("serving_default", serve, input_signature=[
                tf.TensorSpec((batch_size, *size, 3), tf.float32, name="images")])
            archive.write_out(saved_model_dir, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(saved_model_dir)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantization != "none":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        if quantization == "float16":
            converter.target_spec.supported_types = [tf.float16]
        try:
            if quantization == "int8":
                return _convert_int8(converter, calibration, batch_size, float_ops)
            if quantization == "dynamic":
                return float16_constants(converter.convert())
            return converter.convert()
        except converter_error as error:
            ops = tflite_unsupported_ops(str(error))
            raise ValueError(
                f"{model.name!r} cannot be exported to TFLite with built-in ops only: "
                f"{', '.join(ops) if ops else 'see the converter message below'} "
                "has no TFLite built-in kernel (Flex / SELECT_TF_OPS is not used: it "
                f"needs the TF runtime on the device).\n{str(error)[-1500:]}") from None


# TFLite builtin operator codes (schema.fbs BuiltinOperator).
_ADD, _CONCATENATION, _DEQUANTIZE, _MUL, _SUB = 0, 2, 6, 18, 41
_FLOAT32, _FLOAT16 = 0, 1


def float16_constants(content, min_elements=1024):
    """Dynamic-range int8 keeps the constants of ops without a hybrid kernel
    in float32: the position embedding, 0.3 MB of ViT-S/16's 23 MB. This
    stores each such constant of at least `min_elements` values that only
    ADD, MUL, SUB or CONCATENATION read as float16 behind a DEQUANTIZE op,
    as the float16 mode stores every weight (the op runs once, on constant
    data: XNNPACK folds it). Returns the new flatbuffer (bytes)."""
    model = unpack_model(content)
    if model.buffers[0].data is not None and len(model.buffers[0].data):
        return content  # buffer 0 is not the empty one that non-constant tensors use
    subgraph = model.subgraphs[0]
    codes = [max(c.builtinCode, c.deprecatedBuiltinCode) for c in model.operatorCodes]
    readers = collections.defaultdict(set)
    for op in subgraph.operators:
        for i in op.inputs if op.inputs is not None else ():
            readers[int(i)].add(codes[op.opcodeIndex])
    buffer_users = collections.Counter(t.buffer for t in subgraph.tensors)
    ends = {int(i) for i in subgraph.inputs} | {int(i) for i in subgraph.outputs}
    def values(tensor):
        return np.frombuffer(np.asarray(model.buffers[tensor.buffer].data, np.uint8).tobytes(),
                             "<f4")

    chosen = [i for i, t in enumerate(subgraph.tensors)
              if t.type == _FLOAT32 and i not in ends and buffer_users[t.buffer] == 1
              and model.buffers[t.buffer].data is not None
              and len(model.buffers[t.buffer].data) >= 4 * min_elements
              and readers[i] and readers[i] <= {_ADD, _CONCATENATION, _MUL, _SUB}
              and np.abs(values(t)).max() < 65504]  # within float16's range
    if not chosen:
        return content
    schema = importlib.import_module(type(model).__module__)
    if _DEQUANTIZE not in codes:
        code = schema.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = _DEQUANTIZE
        code.version = 3  # float16 input
        model.operatorCodes.append(code)
        codes.append(_DEQUANTIZE)
    dequantize = codes.index(_DEQUANTIZE)
    new_ops = []
    for index in chosen:
        tensor = subgraph.tensors[index]
        buffer = model.buffers[tensor.buffer]
        buffer.data = values(tensor).astype("<f2").view(np.uint8)
        half = schema.TensorT()
        half.shape, half.type, half.buffer = tensor.shape, _FLOAT16, tensor.buffer
        half.name = (tensor.name.decode() if isinstance(tensor.name, bytes)
                     else tensor.name) + "_float16"
        subgraph.tensors.append(half)
        tensor.buffer = 0  # the DEQUANTIZE output now: no data of its own
        op = schema.OperatorT()
        op.opcodeIndex = dequantize
        op.inputs = np.asarray([len(subgraph.tensors) - 1], np.int32)
        op.outputs = np.asarray([index], np.int32)
        new_ops.append(op)
    subgraph.operators = new_ops + list(subgraph.operators)  # constants first
    return pack_model(model, len(content))


def _convert_int8(converter, calibration, batch_size, float_ops):
    def representative_dataset():
        for start in range(0, len(calibration) - batch_size + 1, batch_size):
            yield [calibration[start:start + batch_size]]

    converter.representative_dataset = representative_dataset
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8,
                                           tf.lite.OpsSet.TFLITE_BUILTINS]
    if not float_ops:
        return converter.convert()
    # The debugger runs its models through tf.lite.Interpreter internally
    # (deprecated in TF 2.21; everything else here runs on LiteRT).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"(?s).*tf\.lite\.Interpreter is deprecated")
        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=converter, debug_dataset=representative_dataset,
            debug_options=tf.lite.experimental.QuantizationDebugOptions(
                denylisted_ops=list(float_ops)))
        return debugger.get_nondebug_quantized_model()


def _check_metadata(meta, info):
    """The metadata read back from the file is what was meant (an internal
    invariant: a mismatch is a bug of the writer)."""
    assert meta is not None, "no TFLite metadata in the written file"
    assert meta["normalization"] == {"mean": info["mean"], "std": info["std"]}, meta
    assert [o["name"] for o in meta["outputs"]] == ["probabilities", "logits"], meta
    for output in meta["outputs"]:
        assert output["labels"] == info["labels"], output["name"]
        assert output["shape"][-1] == len(info["labels"]), output


def _report_metadata(meta, info):
    if meta is None:
        return None
    return {"summary": summary(meta), "normalization": meta["normalization"],
            "normalization_source": info["normalization_source"] if info else None,
            "labels": len(meta["labels"] or []),
            "labels_source": info["labels_source"] if info else None,
            "outputs": [o["name"] for o in meta["outputs"]],
            "packed_files": meta["packed_files"]}


@dataclasses.dataclass
class _TFLite(ExportFormat):
    """The LiteRT file of `to_tflite`: converted with its metadata inside,
    checked for built-in ops only and for the metadata read back, run as
    MediaPipe feeds it (pixels normalized as its metadata says)."""

    batch_size: int = 1
    float_ops: object = "auto"
    num_calibration: int = 500
    info: dict = None  # classifier_metadata(...); None: metadata=False

    name = "tflite"
    checks = CHECKS

    def prepare(self, calibration):
        content = convert(self.model, quantization=self.quantization,
                          representative_data=None if calibration is None
                          else calibration.images,
                          batch_size=self.batch_size, image_size=self.size,
                          outputs=self.outputs, float_ops=self.float_ops,
                          num_calibration=self.num_calibration)
        if self.info is not None:
            content = with_classifier_metadata(content, self.info)
        self.content = content

    def write(self, temporary, names):
        with open(temporary, "wb") as f:
            f.write(self.content)
        self.ops = tflite_ops(model_path=temporary)
        foreign = sorted(op for op in self.ops if op.startswith("Flex") or op == "CUSTOM")
        if foreign:
            raise ValueError(f"{self.path} uses ops outside the TFLite built-ins: {foreign}.")
        self.meta = read_tflite_metadata(temporary)  # what MediaPipe will read
        if self.info is not None:
            _check_metadata(self.meta, self.info)
        return temporary

    def inputs(self, images):
        return normalize(images, self.meta)  # as MediaPipe feeds the graph

    def runner(self, file):
        return _runner(file, num_threads=self.num_threads)  # fed as `inputs` normalizes

    def report_fields(self, file, run, images, reference):
        int8 = self.quantization == "int8"
        height, width = self.size
        return dict(
            batch_size=self.batch_size, ops=self.ops, builtin_ops_only=True,
            float_ops=_float_ops(self.float_ops) if int8 else None,
            signature={"inputs": {"images": f"float32 [{self.batch_size}, {height}, "
                                            f"{width}, 3]"},
                       "outputs": {"logits": "float32", "probabilities": "float32"}},
            metadata=_report_metadata(self.meta, self.info))

    def latency_batch(self, images):
        return np.resize(images, (self.batch_size, *images.shape[1:])).astype("float32")


def to_tflite(model: keras.Model, path: str | os.PathLike, *, quantization: str | None = None,
              representative_data: str | np.ndarray | tf.data.Dataset | None = None,
              batch_size: int = 1, image_size: int | tuple[int, int] | None = None,
              outputs: str = "auto", float_ops: str | Sequence[str] = "auto",
              validation_data: str | np.ndarray | tf.data.Dataset | None = None,
              validation_split: str | None = None, num_validation: int = 2000,
              num_calibration: int = 500, calibration_split: str = "train",
              num_threads: int | None = None, latency_repeats: int = 20, check: bool = True,
              verbose: bool = True, seed: int = 0, data_dir: str | None = None,
              holdout: float = 0.1, skip_corrupt: bool = False,
              metadata: bool | dict = True) -> ExportReport:
    """Exports `model` to a LiteRT (TFLite) file, verifies it, then puts it
    at `path`.

    The file is written under a temporary name beside `path`, verified
    against Keras, and only then renamed to `path`; one that misses its bar
    (`CHECKS`) is moved to `<path>.rejected` with its report as
    `<path>.rejected.json`; any error (a missing LiteRT runtime included)
    leaves nothing at `path` and no temporary file. The model's class names,
    when it has them, are written beside it as `<stem>.labels.txt`. The
    file carries TFLite Metadata, so MediaPipe Tasks' `ImageClassifier`
    opens it, and is verified as MediaPipe feeds it. See docs/deploy.md
    and docs/deploy.md#tflite-metadata-mediapipes-imageclassifier-opens-the-file.

    Args:
        model: a Keras image classifier taking RGB pixels in [0, 255] (or
            normalized pixels, with `metadata={"normalization": (mean,
            std)}` saying how).
        path: the `.tflite` file to write.
        quantization: `None`/`"none"` (float32), `"float16"` (weights in
            fp16), `"dynamic"` (int8 weights, float activations; the
            position embedding in fp16, see `float16_constants`) or
            `"int8"` (int8 weights and activations, calibrated on
            `representative_data`; the ops in `float_ops` stay float).
        representative_data: calibration images for `"int8"`: a
            `keras_vit.data` source string (a seeded class-stratified
            sample of `num_calibration` images of its `calibration_split`,
            see `keras_vit.data.sample.sample_images`), an array or a
            `tf.data.Dataset` (its first `num_calibration` images).
        batch_size: the static batch of the graph, 1..`max_batch_size(
            image size)`; never changed to fit the validation images (a
            partial last batch is padded when the file is run).
        image_size: `(height, width)` for a model built with a free size
            (`input_shape=(None, None, 3)`, a RoPE model's included): the
            file's one size, chosen here (a TFLite graph has static
            shapes; the RoPE angles and any position-embedding resize are
            computed for it at conversion); default: its stored
            position-embedding grid's size.
        float_ops: TFLite op names kept in float under `"int8"`;
            `"auto"` is `INT8_FLOAT_OPS`, `()` quantizes everything.
        validation_data: images to verify on (same kinds; a stratified
            sample of up to `num_validation` images of a source's
            `validation_split`). Default: the validation split of the
            `representative_data` source (never its calibration images);
            for calibration arrays, those (reported as "calibration
            images"); else 8 seeded random pixel images.
        validation_split: split of a validation source; None:
            `"validation"` when the source has one, else `"test"` (a
            folder of class subfolders alone: its holdout).
        num_validation: at most this many validation images (2000).
        num_calibration: int8 calibration images (500).
        calibration_split: split of a calibration source (`"train"`).
        num_threads: LiteRT threads (default: all cores).
        latency_repeats: timed runs for the median latencies.
        check: raise `ExportVerificationError` when the export misses its
            mode's bar (`CHECKS`, listed in docs/deploy.md); `check=False`
            still measures and reports (`passed`, `criteria`), keeps the
            file and logs a warning when the bar is missed.
        verbose: log one line (INFO, logger "keras_vit") when the export passes;
            the report itself is returned (`print(report)` shows it).
        seed: the sampling seed (calibration and validation samples).
        data_dir, holdout: a TFDS data directory; the held-out fraction of
            a folder without split subfolders.
        skip_corrupt: leave image files that do not decode out of the
            calibration / validation samples (counted in the report) instead
            of a ValueError naming the first.
        metadata: True (TFLite Metadata and `labels.txt` inside the file),
            False (none: MediaPipe's ImageClassifier then refuses a float
            model), or a dict overriding any of `name`, `description`,
            `version`, `author`, `license`, `labels` (class names) and
            `normalization` (`(mean, std)` in pixel units, per channel or
            one for all, for a graph that takes normalized pixels; "auto"
            reads the model, see `tflite_metadata.input_normalization`).
            MediaPipe's ImageClassifier also needs `batch_size=1`.

    Returns:
        `ExportReport` (size, op counts, calibration and validation
        samples, max |logit diff| and top-1 agreement with Keras, LiteRT
        and Keras latencies, the labels file, the metadata summary).

    Example:

    >>> report = keras_vit.export.to_tflite(  # reads /data/digits  # doctest: +SKIP
    ...     model, "vit.tflite", quantization="int8",
    ...     representative_data="folder:/data/digits")
    >>> report.calibration  # doctest: +SKIP
    {'split': 'train', 'images': 500, 'classes': 10, 'source': 'folder:/data/digits'}
    >>> report.validation["split"], report.top1_agreement, report.labels  # doctest: +SKIP
    ('test', 0.994, 'vit.labels.txt')
    >>> keras_vit.export.read_tflite_metadata("vit.tflite")["normalization"]  # doctest: +SKIP
    {'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0]}
    """
    path = check_file_path(path, ".tflite", "a TFLite file name")
    require_tensorflow_backend()
    quantization = check_quantization(quantization, QUANTIZATIONS)
    model = exported_model(model, "tflite")
    size = export_image_size(model, image_size)
    batch_size = check_batch_size(batch_size, size)
    output_kind(model, outputs)
    info = classifier_metadata(model, image_size=size, quantization=quantization,
                               metadata=metadata)  # its errors before the conversion
    try:  # before the conversion: an unverifiable file is never written
        importlib.import_module("ai_edge_litert.interpreter")
    except ImportError:
        raise ImportError(RUNTIME_MISSING) from None
    fmt = _TFLite(model, path, quantization, size, outputs, num_threads,
                  batch_size=batch_size, float_ops=float_ops, num_calibration=num_calibration,
                  info=info)
    sampling = Sampling(representative_data=representative_data, validation_data=validation_data,
                        num_calibration=num_calibration, num_validation=num_validation,
                        validation_split=validation_split, calibration_split=calibration_split,
                        seed=seed, data_dir=data_dir, holdout=holdout, skip_corrupt=skip_corrupt)
    return export_verified(fmt, sampling, check=check, verbose=verbose,
                           latency_repeats=latency_repeats)
