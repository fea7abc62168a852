"""`to_openvino`: an OpenVINO IR (`.xml` + `.bin`) with a dynamic batch,
float32 weights (or float16-compressed ones), verified with the OpenVINO
runtime on the CPU against Keras at f32 inference precision (and at bf16
where the CPU has it), written atomically, with the class names inside
(`rt_info` `keras_vit/labels`, a JSON list) and beside it
(`<stem>.labels.txt`).

The graph is the one the ONNX export converts (`export.model.pixel_graph`):
input `images`, float32 `(batch, height, width, 3)` RGB pixels in [0, 255]
(the model's preprocessing inside); outputs `logits` and `probabilities`,
float32 `(batch, classes)`. It is converted by `openvino.convert_model`
from the traced TensorFlow function. (Keras' own
`model.export(format="openvino")` traces the model as it runs on
TensorFlow, and OpenVINO has no conversion for the `Bitcast` of keras_vit's
fused LayerNorm; the export traces the standard ops instead.)
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import TYPE_CHECKING

import numpy as np

from keras_vit._atomic import publish
from keras_vit._framework_text import openvino_unconverted_ops
from keras_vit.export.batches import batched
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
    import tensorflow as tf

QUANTIZATIONS = ("none", "float16")
# What each mode must reach against Keras on the validation images at f32
# inference precision (float16: weights stored in fp16, as the TFLite
# float16 export).
CHECKS = {
    "none": {"max_abs_diff": 1e-4, "min_top1_agreement": 1.0},
    "float16": {"min_top1_agreement": 0.99},
}
# The same file at bf16 inference precision, where the CPU has bf16
# (AVX512_BF16 or AMX): OpenVINO's default there.
BF16_MIN_TOP1_AGREEMENT = 0.99
RT_INFO = "keras_vit"
MISSING = ("Exporting to OpenVINO needs the openvino package (not installed): "
           "pip install 'keras-vision-transformer[openvino]'")


def _require():
    try:
        importlib.import_module("openvino")
    except ImportError:
        raise ImportError(MISSING, name="openvino") from None


def _version():
    import openvino as ov  # optional: the [openvino] extra

    return ov.get_version().split("-")[0]


def convert(model, *, image_size=None, outputs="auto"):
    """The `openvino.Model` of `model` (not yet saved or verified).

    Input `images`: float32 `(batch, H, W, 3)` pixels in [0, 255], any
    batch (and, for a model built with `input_shape=(None, None, 3)`, any
    height and width the model takes); outputs `logits` and
    `probabilities` `(batch, classes)`."""
    require_tensorflow_backend()
    _require()
    import openvino as ov  # optional: the [openvino] extra

    size = export_image_size(model, image_size)
    function = pixel_graph(model, size, outputs, any_size=bool(any_size_input(model)))
    try:
        ov_model = ov.convert_model(function)
    except Exception as error:  # noqa: BLE001 - OpConversionFailure: say which ops
        found = openvino_unconverted_ops(str(error))
        if found is None:
            raise
        raise ValueError(
            f"{model.name!r} cannot be exported to OpenVINO: {found} has no "
            f"conversion in OpenVINO {_version()}'s TensorFlow frontend.") from None
    names = [port.get_names() for port in ov_model.outputs]  # a tensor may have several
    if ("images" not in ov_model.inputs[0].get_names() or len(names) != 2
            or not all(any(key in port for port in names)
                       for key in ("logits", "probabilities"))):
        raise RuntimeError(f"OpenVINO named the graph's tensors {ov_model.inputs} -> "
                           f"{ov_model.outputs}; expected images -> logits, probabilities.")
    return ov_model


def _compile(path, precision="f32", num_threads=None):
    import openvino as ov  # optional: the [openvino] extra

    config = {"INFERENCE_PRECISION_HINT": precision}
    if num_threads:
        config["INFERENCE_NUM_THREADS"] = int(num_threads)
    return ov.Core().compile_model(str(path), "CPU", config)


def run_openvino(path, images, *, num_threads=None, output="logits", precision="f32",
                 batch=32):
    """Runs a `to_openvino` IR (`.xml`, its `.bin` beside it) on the CPU on
    `images` (N, H, W, 3) float32 pixels in [0, 255], `batch` images per
    call, at `precision` (`"f32"` or `"bf16"`, OpenVINO's
    `INFERENCE_PRECISION_HINT`); returns `output` for all N."""
    _require()
    return _runner(path, num_threads, output, precision, batch)(images)


def _runner(path, num_threads=None, output="logits", precision="f32", batch=32):
    """Compiles a `to_openvino` IR once for the CPU: a function of images
    (N, H, W, 3) float32 pixels -> `output` for all N, `batch` per call."""
    compiled = _compile(path, precision, num_threads)
    port = compiled.output(output)
    return lambda images: batched(
        lambda x: compiled({"images": np.asarray(x, "float32")})[port],
        np.asarray(images, "float32"), batch)


def bf16_support():
    """`(available, reason)`: whether OpenVINO runs bf16 on this CPU."""
    _require()
    import openvino as ov  # optional: the [openvino] extra

    core = ov.Core()
    capabilities = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    if "BF16" in capabilities:
        return True, None
    return False, (f"{core.get_property('CPU', 'FULL_DEVICE_NAME')} has no bf16 "
                   f"(OpenVINO CPU capabilities: {', '.join(capabilities)})")


def _precision(compiled):
    """The inference precision OpenVINO compiled `compiled` at: `"f32"`,
    `"bf16"`... (the property is an `openvino.Type`, printed
    `<Type: 'bfloat16'>`)."""
    return compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()


def _measure_bf16(path, images, reference, num_threads):
    available, reason = bf16_support()
    if not available:
        return {"available": False, "reason": reason}
    compiled = _compile(path, "bf16", num_threads)
    precision = _precision(compiled)
    if precision != "bf16":
        return {"available": False,
                "reason": f"OpenVINO compiled it at {precision} when asked for bf16"}
    port = compiled.output("logits")
    got = batched(lambda x: compiled({"images": np.asarray(x, "float32")})[port], images)
    max_diff, agreement, _ = compare(reference, got)
    return {"available": True, "max_abs_diff": max_diff, "top1_agreement": agreement,
            "passed": bool(agreement >= BF16_MIN_TOP1_AGREEMENT)}


def openvino_class_names(path):
    """The class names stored in an OpenVINO IR (`rt_info` `keras_vit/labels`),
    or None."""
    _require()
    import openvino as ov  # optional: the [openvino] extra

    ov_model = ov.Core().read_model(str(path))
    if not ov_model.has_rt_info([RT_INFO, "labels"]):
        return None
    return json.loads(ov_model.get_rt_info([RT_INFO, "labels"]).astype(str))


def verify_openvino(path, model, images, *, image_size=None, outputs="auto",
                    num_threads=None, precision="f32"):
    """Compares a `to_openvino` IR with a Keras model on `images`.

    Returns `(max |logit diff|, top-1 agreement, max |Keras logit|)`."""
    size = export_image_size(model, image_size)
    images = as_images(images, size, len(images), name="images")
    reference = reference_logits(model, images, outputs)
    return compare(reference, run_openvino(path, images, num_threads=num_threads,
                                           precision=precision))


def bin_path(path):
    """The `.bin` (weights) beside an IR `.xml`."""
    return os.path.splitext(str(path))[0] + ".bin"


@dataclasses.dataclass
class _OpenVINO(ExportFormat):
    """The OpenVINO IR of `to_openvino`: the `.xml` and its `.bin` in one
    temporary directory, class names in `rt_info`, run on the CPU at f32
    (and measured at bf16 where the CPU has it)."""

    name = "openvino"
    checks = CHECKS

    def prepare(self, calibration):
        self.ov_model = convert(self.model, image_size=self.size, outputs=self.outputs)

    def write(self, temporary, names):
        import openvino as ov  # optional: the [openvino] extra

        for key, value in pixel_graph_metadata(self.size, self.kind, names,
                                               any_size_input(self.model)).items():
            self.ov_model.set_rt_info(value, [RT_INFO, key])
        xml = os.path.join(temporary, os.path.basename(self.path))
        os.makedirs(temporary)
        ov.save_model(self.ov_model, xml, compress_to_fp16=self.quantization == "float16")
        return xml

    def runner(self, file):
        return _runner(file, self.num_threads)

    def report_fields(self, file, run, images, reference):
        return dict(batch_size=1, runtime=f"OpenVINO {_version()} (CPU, f32)",
                    bf16=_measure_bf16(file, images, reference, self.num_threads),
                    signature=pixel_graph_signature(self.size, bool(self.run_time_sizes)))

    def judge(self, report):
        passed = super().judge(report)
        if report.bf16["available"]:
            report.criteria += (f" and bf16 top-1 agreement >= "
                                f"{100 * BF16_MIN_TOP1_AGREEMENT:g}%"
                                + ("" if report.bf16["passed"] else " MISSED"))
            report.passed = passed = passed and report.bf16["passed"]
        return passed

    def put_in_place(self, temporary):
        publish(os.path.join(temporary, os.path.basename(bin_path(self.path))),
                bin_path(self.path))
        publish(os.path.join(temporary, os.path.basename(self.path)), self.path)


def to_openvino(model: keras.Model, path: str | os.PathLike, *,
                quantization: str | None = None,
                image_size: int | tuple[int, int] | None = None, outputs: str = "auto",
                validation_data: str | np.ndarray | tf.data.Dataset | None = None,
                validation_split: str | None = None, num_validation: int = 2000,
                num_threads: int | None = None, latency_repeats: int = 20,
                check: bool = True, verbose: bool = True, seed: int = 0,
                data_dir: str | None = None, holdout: float = 0.1,
                skip_corrupt: bool = False) -> ExportReport:
    """Exports `model` to an OpenVINO IR (`path`, a `.xml`, and its weights
    `<stem>.bin`), verifies it with the OpenVINO runtime, then puts it at
    `path`.

    The IR takes `images`, float32 `(batch, H, W, 3)` RGB pixels in
    [0, 255] with any batch size, and returns `logits` and
    `probabilities`, float32 `(batch, classes)`. The class names are inside
    (`openvino_class_names` reads them) and beside it as
    `<stem>.labels.txt`. Both files are written to a temporary directory
    beside `path`, verified on the CPU at f32 (and at bf16 where the CPU
    has it: `report.bf16`) against Keras, and only then renamed into place;
    a file that misses its bar is moved to `<path>.rejected` (a directory
    holding both files) with its report as `<path>.rejected.json`; any
    error (a missing openvino included) leaves nothing at `path`. See
    docs/deploy.md#onnx-and-openvino-cpu-servers.

    Args:
        model: a Keras image classifier taking RGB pixels in [0, 255].
        path: the `.xml` file to write (`<stem>.bin` is written beside it).
        quantization: `None`/`"none"` (float32 weights) or `"float16"`
            (weights stored in fp16: half the size; computed in f32).
        image_size: `(height, width)` for a model built with a free size
            (`input_shape=(None, None, 3)`): the size it is verified at;
            default: its stored position-embedding grid's size. The IR then
            takes any height and width the model takes, and is verified at
            two other sizes too (`export.model.run_time_sizes`, reported
            in `run_time_sizes`).
        outputs: `"auto"`, `"logits"` or `"probabilities"`: what the model
            outputs (auto reads the head).
        validation_data: images to verify on: a `keras_vit.data` source
            string (a seeded class-stratified sample of up to
            `num_validation` images of its `validation_split`), an array or
            a `tf.data.Dataset`; default: 8 seeded random pixel images.
        validation_split, num_validation, seed, data_dir, holdout,
        skip_corrupt: as in `to_tflite`.
        num_threads: OpenVINO inference threads (default: its own).
        latency_repeats: timed runs (batch of one) for the median latencies.
        check: raise `ExportVerificationError` when the file misses its
            bar (`CHECKS`, listed in docs/deploy.md). `check=False` still
            measures and reports, keeps the file and logs a warning.
        verbose: log one line (INFO, logger "keras_vit") when the export passes;
            the report itself is returned (`print(report)` shows it).

    Returns:
        `ExportReport` (`runtime`, `bf16`, size of both files, validation
        sample, max |logit diff| and top-1 agreement with Keras, latencies,
        the labels file).

    Example:

    >>> report = keras_vit.export.to_openvino(  # reads /data/digits  # doctest: +SKIP
    ...     model, "vit.xml", validation_data="folder:/data/digits")
    >>> report.top1_agreement, report.bf16["available"]  # doctest: +SKIP
    (1.0, False)
    >>> import openvino  # doctest: +SKIP
    >>> compiled = openvino.Core().compile_model("vit.xml", "CPU")  # doctest: +SKIP
    >>> logits = compiled({"images": float32_pixels})["logits"]  # doctest: +SKIP
    """
    path = check_file_path(path, ".xml", "an OpenVINO IR file name",
                           " (its weights go to the .bin beside it)")
    require_tensorflow_backend()
    quantization = check_quantization(quantization, QUANTIZATIONS)
    model = exported_model(model, "openvino")
    _require()  # before the conversion: an unverifiable file is never written
    size = export_image_size(model, image_size)
    output_kind(model, outputs)  # an ambiguous model is refused before any work
    fmt = _OpenVINO(model, path, quantization, size, outputs, num_threads,
                    run_time_sizes(model, size))
    sampling = Sampling(validation_data=validation_data, num_validation=num_validation,
                        validation_split=validation_split, seed=seed, data_dir=data_dir,
                        holdout=holdout, skip_corrupt=skip_corrupt)
    return export_verified(fmt, sampling, check=check, verbose=verbose,
                           latency_repeats=latency_repeats)
