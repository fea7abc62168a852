"""`to_onnx`: an ONNX file with a dynamic batch, in float32, dynamic-range
int8 or static int8 (ONNX Runtime's quantizer), verified with ONNX Runtime
against Keras, written atomically, with the class names inside
(`metadata_props["labels"]`, a JSON list) and beside it
(`<stem>.labels.txt`).

The graph is the one the other exports trace (`export.model.pixel_graph`): input
`images`, float32 `(batch, height, width, 3)` RGB pixels in [0, 255] (the
model's preprocessing is inside); outputs `logits` and `probabilities`,
float32 `(batch, classes)`. It is converted by tf2onnx from the frozen
TensorFlow function. (Keras' own `model.export(format="onnx")` hands tf2onnx
the traced function as it is, and tf2onnx turns the captured constants of
the preprocessing layer's mean and variance into two extra graph inputs, so
its file cannot be run with `images` alone; freezing first makes them
constants. The weights go through tf2onnx as graph inputs and become
initializers afterwards: see `_weights_as_inputs` for the memory this
saves.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import os
import tempfile
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from keras_vit import _compat
from keras_vit.export.batches import batched
from keras_vit.export._files import is_disk_full
from keras_vit.export._images import Sampling, as_images
from keras_vit.export._measure import compare
from keras_vit.export.model import (
    any_size_input,
    export_image_size,
    output_kind,
    pixel_graph,
    pixel_graph_metadata,
    pixel_graph_signature,
    reference_logits,
    exported_model,
    require_tensorflow_backend,
    run_time_sizes,
)
from keras_vit.export._pipeline import (
    ExportFormat,
    check_file_path,
    check_quantization,
    export_verified,
)
from keras_vit.export._report import ExportReport

if TYPE_CHECKING:
    import keras

QUANTIZATIONS = ("none", "dynamic", "int8")
# What each mode must reach against Keras on the validation images (the
# TFLite bars: float32 exact to rounding, dynamic-range int8 >= 99%, static
# int8 >= 97%).
CHECKS = {
    "none": {"max_abs_diff": 1e-4, "min_top1_agreement": 1.0},
    "dynamic": {"min_top1_agreement": 0.99},
    "int8": {"min_top1_agreement": 0.97},
}
# The ops onnxruntime's quantizer quantizes under "dynamic" and "int8" (the
# matrix products and convolutions; "int8" also the attention products of
# two activations). Softmax, GELU and the LayerNorm statistics stay in
# float, as in the TFLite int8 export (`INT8_FLOAT_OPS`).
QUANTIZED_OPS = ("MatMul", "Conv", "Gemm")
MIN_OPSET = 13
LABELS_KEY = "labels"
PROTOBUF_LIMIT = 2 ** 31
MISSING = ("Exporting to ONNX needs onnx, onnxruntime and tf2onnx ({missing} not installed): "
           "pip install 'keras-vision-transformer[onnx]'")


def _require():
    """Imports onnx, onnxruntime and tf2onnx, or raises ImportError naming
    the missing ones and the extra to install."""
    missing = []
    for name in ("onnx", "onnxruntime", "tf2onnx"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(MISSING.format(missing=", ".join(missing)), name=missing[0])


def max_opset():
    """The highest opset this tf2onnx and onnx can write."""
    import onnx  # optional: the [onnx] extra
    import tf2onnx  # optional: the [onnx] extra

    return min(max(tf2onnx.constants.OPSET_TO_IR_VERSION), onnx.defs.onnx_opset_version())


def _check_opset(opset):
    """`opset` as an int; None: tf2onnx's preferred opset (15 in tf2onnx
    1.16-1.17: what ONNX Runtime >= 1.10, OpenVINO and TensorRT 8 read)."""
    import tf2onnx  # optional: the [onnx] extra

    if opset is None:
        return tf2onnx.constants.PREFERRED_OPSET
    highest = max_opset()
    if isinstance(opset, bool) or not isinstance(opset, int) or not (
            MIN_OPSET <= opset <= highest):
        raise ValueError(f"opset={opset!r}; allowed: an int from {MIN_OPSET} to {highest} "
                         "(None: tf2onnx's default).")
    return opset


def _check_weight_bytes(model):
    weight_bytes = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    if weight_bytes >= PROTOBUF_LIMIT - (64 << 20):
        raise ValueError(
            f"{model.name!r} holds {weight_bytes / 1e9:.2f} GB of float32 weights; an ONNX "
            "file is one protobuf, limited to 2 GB (external weight files are not "
            "written). Export it to OpenVINO (to_openvino) or a SavedModel instead.")


@contextlib.contextmanager
def _quiet(logger):
    """No log records from `logger` (tf2onnx logs the ops it cannot convert;
    `convert` raises a ValueError naming them)."""
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _unconvertible(proto):
    """Op types in `proto` that no ONNX schema defines (ops tf2onnx could
    not convert are left in the graph under their TensorFlow names)."""
    import onnx  # optional: the [onnx] extra

    return sorted({node.op_type for node in proto.graph.node
                   if not onnx.defs.has(node.op_type, node.domain or "")})


def convert(model, *, opset=None, image_size=None, outputs="auto"):
    """The float32 ONNX model (`onnx.ModelProto`) of `model`.

    Input `images`: float32 `(batch, H, W, 3)` pixels in [0, 255], the
    batch dimension named `batch` (any size); for a model built with
    `input_shape=(None, None, 3)` the height and width too (`height`,
    `width`: any size the model takes, `image_size` unused); outputs
    `logits` and `probabilities` `(batch, classes)`. Raises ValueError
    naming any TensorFlow op that has no ONNX conversion. Nothing is
    verified and no metadata is set here (see `to_onnx`)."""
    import tf2onnx  # optional: the [onnx] extra

    require_tensorflow_backend()
    _require()
    opset = _check_opset(opset)
    size = export_image_size(model, image_size)
    _check_weight_bytes(model)
    any_size = bool(any_size_input(model))
    function = pixel_graph(model, size, outputs, any_size=any_size)
    frozen = _compat.freeze_concrete_function(function)
    names = {tensor.name: key for key, tensor in function.structured_outputs.items()}
    rename = {frozen.inputs[0].name: "images"}
    rename.update({after.name: names[before.name]
                   for before, after in zip(function.outputs, frozen.outputs, strict=True)})
    graph_def = frozen.graph.as_graph_def(add_shapes=True)
    del function, frozen
    weights = _weights_as_inputs(graph_def)
    with (_compat.silenced_tensorflow_deprecations(), tf.device("/cpu:0"),
          _quiet(logging.getLogger("tf2onnx"))):
        proto, _ = tf2onnx.convert.from_graph_def(
            graph_def, name=model.name, input_names=["images:0", *weights],
            output_names=list(rename)[1:], opset=opset, tensors_to_rename=rename)
    del graph_def
    unknown = _unconvertible(proto)
    if unknown:
        raise ValueError(
            f"{model.name!r} cannot be exported to ONNX: {', '.join(unknown)} has no ONNX "
            f"conversion in tf2onnx {tf2onnx.__version__} (opset {opset}).")
    _inputs_as_weights(proto, weights)
    for value in list(proto.graph.input) + list(proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    if any_size:
        for axis, name in ((1, "height"), (2, "width")):
            proto.graph.input[0].type.tensor_type.shape.dim[axis].dim_param = name
    return proto


def _weights_as_inputs(graph_def, min_bytes=1024):
    """Turns each float constant of more than `min_bytes` in `graph_def`
    (the weights) into a placeholder; returns `{"<name>:0": value}`.

    tf2onnx copies every constant into a fresh protobuf message at each of
    its optimizer passes, and protobuf's arenas keep the copies until the
    model is done: converting ViT-B/16 with its weights inside took more
    than 20 GB (ViT-S/16: 4 GB, +88 MB per pass). Converted as inputs, the
    weights are copied once, into the initializers (`_inputs_as_weights`);
    ViT-S/16 then converts in 1.8 GB, 3x faster."""
    floats = {tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum,
              tf.float32.as_datatype_enum, tf.float64.as_datatype_enum}
    weights = {}
    for node in graph_def.node:
        tensor = node.attr["value"].tensor if node.op == "Const" else None
        if tensor is None or tensor.dtype not in floats or len(tensor.tensor_content) <= min_bytes:
            continue
        weights[f"{node.name}:0"] = tf.make_ndarray(tensor)
        dtype, shape = tensor.dtype, type(tensor.tensor_shape)()
        shape.CopyFrom(tensor.tensor_shape)
        node.op = "Placeholder"
        node.attr.clear()
        node.attr["dtype"].type = dtype
        node.attr["shape"].shape.CopyFrom(shape)
    return weights


def _inputs_as_weights(proto, weights):
    """Makes the graph inputs `_weights_as_inputs` created initializers
    holding their values; `images` stays the only input."""
    import onnx  # optional: the [onnx] extra

    inputs = {value.name for value in proto.graph.input}
    lost = sorted(set(weights) - inputs)
    assert not lost, f"tf2onnx dropped or renamed the weight inputs {lost[:5]}"
    proto.graph.initializer.extend(onnx.numpy_helper.from_array(value, name)
                                   for name, value in weights.items())
    images = [value for value in proto.graph.input if value.name == "images"]
    del proto.graph.input[:]
    proto.graph.input.extend(images)


def _annotate(proto, names, size, kind, any_size=False):
    """Sets the file's `metadata_props` and `doc_string`."""
    import onnx  # optional: the [onnx] extra

    props = pixel_graph_metadata(size, kind, names, any_size)  # the class names under LABELS_KEY
    onnx.helper.set_model_props(proto, props)
    proto.doc_string = (f"keras_vit image classifier. {props['input']}; {props['outputs']}. "
                        f"Class names: metadata_props[{LABELS_KEY!r}] (a JSON list)."
                        if names else f"keras_vit image classifier. {props['input']}; "
                        f"{props['outputs']}.")


class _Batches:
    """onnxruntime's CalibrationDataReader over calibration images, `batch`
    per call, with the `__len__` / `set_range` its strided calibration
    reads."""

    def __init__(self, images, batch=8):
        self.chunks = [np.asarray(images[i:i + batch], "float32")
                       for i in range(0, len(images), batch)]
        self.set_range(0, len(self.chunks))

    def __len__(self):
        return len(self.chunks)

    def set_range(self, start_index, end_index):
        self.pending = iter(self.chunks[start_index:end_index])

    def get_next(self):
        chunk = next(self.pending, None)
        return None if chunk is None else {"images": chunk}


def _quantize(float_path, out_path, quantization, calibration=None):
    """Writes the `"dynamic"` or `"int8"` model of the float32 file."""
    from onnxruntime.quantization import (  # optional: the [onnx] extra
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process  # optional

    prepared = float_path + ".prepared.onnx"
    # Shape inference and ONNX Runtime's graph optimizations first, as its
    # quantizer asks (ONNX shape inference: only the batch is symbolic).
    quant_pre_process(float_path, prepared, skip_symbolic_shape=True)
    # reduce_range: 7-bit weights. ONNX Runtime's u8 x s8 kernels on x86
    # CPUs without VNNI (AVX2, AVX-512 before Cascade Lake; AMD before Zen 4)
    # saturate 16-bit intermediate sums; with 8-bit weights the quickstart's
    # digits ViT agreed with Keras on 91-92% of the test digits (max |logit
    # diff| 4.2), with 7-bit weights on 100% (0.23 dynamic, 0.35 static).
    # The file runs where it is deployed, so it is made safe for every CPU.
    if quantization == "dynamic":
        quantize_dynamic(prepared, out_path, op_types_to_quantize=list(QUANTIZED_OPS),
                         per_channel=True, reduce_range=True, weight_type=QuantType.QInt8)
    else:
        quantize_static(prepared, out_path, _Batches(calibration),
                        quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=list(QUANTIZED_OPS), per_channel=True,
                        reduce_range=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax,
                        calibration_providers=["CPUExecutionProvider"],
                        # one batch at a time, ranges merged after each: the
                        # memory of one batch's activations, all images used
                        # (CalibMaxIntermediateOutputs drops the batches it
                        # clears in onnxruntime 1.32 instead of merging them)
                        extra_options={"CalibStridedMinMax": 1})


def session(path, num_threads=None):
    """An ONNX Runtime `InferenceSession` on the CPU."""
    _require()
    import onnxruntime as ort  # optional: the [onnx] extra

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if num_threads:
        options.intra_op_num_threads = num_threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(path, images, *, num_threads=None, output="logits", batch=32):
    """Runs a `to_onnx` file with ONNX Runtime on `images` (N, H, W, 3)
    float32 pixels in [0, 255], `batch` images per call; returns `output`
    (`"logits"` or `"probabilities"`) for all N."""
    return _runner(path, num_threads, output, batch)(images)


def _runner(path, num_threads=None, output="logits", batch=32):
    """Opens a `to_onnx` file once (`session`): a function of images
    (N, H, W, 3) float32 pixels -> `output` for all N, `batch` per call."""
    runner = session(path, num_threads)
    return lambda images: batched(
        lambda x: runner.run([output], {"images": np.asarray(x, "float32")})[0],
        np.asarray(images, "float32"), batch)


def onnx_class_names(path):
    """The class names stored in an ONNX file (`metadata_props["labels"]`),
    or None."""
    _require()
    import onnx  # optional: the [onnx] extra

    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    return json.loads(props[LABELS_KEY]) if LABELS_KEY in props else None


def verify_onnx(path, model, images, *, image_size=None, outputs="auto", num_threads=None):
    """Compares a `to_onnx` file with a Keras model on `images`.

    Returns `(max |logit diff|, top-1 agreement, max |Keras logit|)`; use
    it to check a file shipped earlier against the model it came from."""
    size = export_image_size(model, image_size)
    images = as_images(images, size, len(images), name="images")
    reference = reference_logits(model, images, outputs)
    return compare(reference, run_onnx(path, images, num_threads=num_threads))


@dataclasses.dataclass
class _ONNX(ExportFormat):
    """The ONNX file of `to_onnx`: converted by tf2onnx, quantized by ONNX
    Runtime, its class names inside, run with ONNX Runtime on the CPU."""

    opset: int = None

    name = "onnx"
    checks = CHECKS

    def prepare(self, calibration):
        self.proto = convert(self.model, opset=self.opset, image_size=self.size,
                             outputs=self.outputs)
        self.calibration = None if calibration is None else calibration.images

    def write(self, temporary, names):
        import onnx  # optional: the [onnx] extra

        proto, self.proto = self.proto, None  # one model in memory at a time
        with tempfile.TemporaryDirectory() as work:
            if self.quantization != "none":
                float_path = os.path.join(work, "float32.onnx")
                try:
                    onnx.save_model(proto, float_path)
                    quantized = os.path.join(work, f"{self.quantization}.onnx")
                    _quantize(float_path, quantized, self.quantization, self.calibration)
                except OSError as error:  # a full disk is the temporary folder's, not path's
                    if error.filename or not is_disk_full(error):
                        raise
                    raise OSError(error.errno, error.strerror, work) from None
                proto = onnx.load(quantized)
        _annotate(proto, names, self.size, self.kind, any_size_input(self.model))
        onnx.checker.check_model(proto)
        onnx.save_model(proto, temporary)
        return temporary

    def runner(self, file):
        return _runner(file, self.num_threads)

    def report_fields(self, file, run, images, reference):
        import onnxruntime as ort  # optional: the [onnx] extra

        return dict(batch_size=1, opset=self.opset,
                    runtime=f"onnxruntime {ort.__version__} (CPUExecutionProvider)",
                    signature=pixel_graph_signature(self.size, bool(self.run_time_sizes)))


def to_onnx(model: keras.Model, path: str | os.PathLike, *, quantization: str | None = None,
            opset: int | None = None,
            representative_data: str | np.ndarray | tf.data.Dataset | None = None,
            image_size: int | tuple[int, int] | None = None, outputs: str = "auto",
            validation_data: str | np.ndarray | tf.data.Dataset | None = None,
            validation_split: str | None = None, num_validation: int = 2000,
            num_calibration: int = 500, calibration_split: str = "train",
            num_threads: int | None = None, latency_repeats: int = 20, check: bool = True,
            verbose: bool = True, seed: int = 0, data_dir: str | None = None,
            holdout: float = 0.1, skip_corrupt: bool = False) -> ExportReport:
    """Exports `model` to an ONNX file, verifies it with ONNX Runtime, then
    puts it at `path`.

    The file takes `images`, float32 `(batch, H, W, 3)` RGB pixels in
    [0, 255] with any batch size, and returns `logits` and
    `probabilities`, float32 `(batch, classes)` (for a softmax head the
    logits are its pre-activation, see
    `export.model.logits_and_probabilities`). The class names are inside
    (`onnx_class_names` reads them) and beside it as `<stem>.labels.txt`.
    It is written under a temporary name, verified with ONNX Runtime (CPU)
    against Keras on the validation images, and only then renamed to
    `path`; a file that misses its bar (`CHECKS`) is moved to
    `<path>.rejected` with its report as `<path>.rejected.json`; any error
    (a missing dependency included, checked before converting) leaves
    nothing at `path`. See docs/deploy.md#onnx-and-openvino-cpu-servers.

    Args:
        model: a Keras image classifier taking RGB pixels in [0, 255].
        path: the `.onnx` file to write.
        quantization: `None`/`"none"` (float32), `"dynamic"` (int8
            weights, activations quantized per call by ONNX Runtime;
            no calibration) or `"int8"` (static: int8 weights and
            activations in QDQ form, ranges calibrated on
            `representative_data`). Both quantize `QUANTIZED_OPS`
            (MatMul, Conv, Gemm; weights per channel); Softmax, GELU and
            LayerNorm stay float. Weights are 7-bit (`reduce_range`, see
            `_quantize`). On a CPU server `"dynamic"` is the faster;
            `"int8"` is the QDQ form int8 accelerators read.
        opset: the ONNX opset (13 to `max_opset()`); None: tf2onnx's
            default (15). The report states it.
        representative_data: calibration images for `"int8"`, as in
            `to_tflite`.
        image_size: `(height, width)` for a model built with a free size
            (`input_shape=(None, None, 3)`): the size it is verified and
            calibrated at; default: its stored position-embedding grid's
            size. The file then takes any height and width the model takes
            (its input dimensions `height`, `width`), and is verified at
            two other sizes too (`export.model.run_time_sizes`, reported
            in `run_time_sizes`).
        outputs: `"auto"`, `"logits"` or `"probabilities"`: what the model
            outputs (auto reads the head).
        validation_data, validation_split, num_validation, num_calibration,
        calibration_split, seed, data_dir, holdout, skip_corrupt: as in
            `to_tflite`.
        num_threads: ONNX Runtime intra-op threads (default: its own).
        latency_repeats: timed runs (batch of one) for the median latencies.
        check: raise `ExportVerificationError` when the file misses its
            mode's bar (`CHECKS`; a `model.quantize("int8")` model's:
            `export.model.KERAS_QUANTIZED_CHECKS`; docs/deploy.md lists
            them). `check=False` still measures and reports, keeps the file
            and logs a warning.
        verbose: log one line (INFO, logger "keras_vit") when the export passes;
            the report itself is returned (`print(report)` shows it).

    Returns:
        `ExportReport` (`opset`, `runtime`, size, calibration and
        validation samples, max |logit diff| and top-1 agreement with
        Keras, latencies, the labels file).

    Example:

    >>> report = keras_vit.export.to_onnx(  # reads /data/digits  # doctest: +SKIP
    ...     model, "vit.onnx", validation_data="folder:/data/digits")
    >>> report.opset, report.top1_agreement, report.labels  # doctest: +SKIP
    (15, 1.0, 'vit.labels.txt')
    >>> import onnxruntime  # doctest: +SKIP
    >>> session = onnxruntime.InferenceSession("vit.onnx")  # the file above  # doctest: +SKIP
    >>> logits, probabilities = session.run(None, {"images": float32_pixels})  # doctest: +SKIP
    >>> keras_vit.export.onnx_class_names("vit.onnx")[:2]  # doctest: +SKIP
    ['0', '1']
    """
    path = check_file_path(path, ".onnx", "an ONNX file name")
    require_tensorflow_backend()
    quantization = check_quantization(quantization, QUANTIZATIONS)
    model = exported_model(model, "onnx")
    _require()  # before the conversion: an unverifiable file is never written
    opset = _check_opset(opset)
    size = export_image_size(model, image_size)
    output_kind(model, outputs)  # an ambiguous model is refused before any work
    _check_weight_bytes(model)
    fmt = _ONNX(model, path, quantization, size, outputs, num_threads,
                run_time_sizes(model, size), opset=opset)
    sampling = Sampling(representative_data=representative_data, validation_data=validation_data,
                        num_calibration=num_calibration, num_validation=num_validation,
                        validation_split=validation_split, calibration_split=calibration_split,
                        seed=seed, data_dir=data_dir, holdout=holdout, skip_corrupt=skip_corrupt)
    return export_verified(fmt, sampling, check=check, verbose=verbose,
                           latency_repeats=latency_repeats)
