"""`to_openvino`: an OpenVINO IR (`.xml` + `.bin`) with a dynamic batch,
float32 weights (or float16-compressed ones), verified with the OpenVINO
runtime on the CPU against Keras at f32 inference precision (and at bf16
where the CPU has it), written atomically, with the class names inside
(`rt_info` `keras_vit/labels`, a JSON list) and beside it
(`<stem>.labels.txt`).

The graph is the one the ONNX export converts (`_common.pixel_graph`):
input `images`, float32 `(batch, height, width, 3)` RGB pixels in [0, 255]
(the model's preprocessing inside); outputs `logits` and `probabilities`,
float32 `(batch, classes)`. It is converted by `openvino.convert_model`
from the traced TensorFlow function. (Keras' own
`model.export(format="openvino")` traces the model as it runs on
TensorFlow, and OpenVINO has no conversion for the `Bitcast` of keras_vit's
fused LayerNorm; the export traces the standard ops instead.)
"""

import importlib
import json
import os
import re
import shutil

import numpy as np

from keras_vit.export._common import (
    ExportReport,
    as_images,
    batched,
    compare,
    directory_size,
    evaluate,
    keras_latency_ms,
    labels_beside,
    median_ms,
    model_class_names,
    model_image_size,
    output_kind,
    pixel_graph,
    publish,
    reference_logits,
    reject,
    require_tensorflow_backend,
    temporary_path,
    validation_data_for,
    warn_kept,
)

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
    import openvino as ov

    return ov.get_version().split("-")[0]


def _check_quantization(quantization):
    quantization = "none" if quantization is None else quantization
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}; allowed: {QUANTIZATIONS} "
                         "(None means 'none').")
    return quantization


def convert(model, *, image_size=None, outputs="auto"):
    """The `openvino.Model` of `model` (not yet saved or verified).

    Input `images`: float32 `(batch, H, W, 3)` pixels in [0, 255], any
    batch; outputs `logits` and `probabilities` `(batch, classes)`."""
    require_tensorflow_backend()
    _require()
    import openvino as ov

    size = model_image_size(model, image_size)
    function = pixel_graph(model, size, outputs)
    try:
        ov_model = ov.convert_model(function)
    except Exception as error:  # noqa: BLE001 - OpConversionFailure: say which ops
        found = re.search(r"No conversion rule found for operations: ([^\n]+)", str(error))
        if found is None:
            raise
        raise ValueError(
            f"{model.name!r} cannot be exported to OpenVINO: {found.group(1).strip()} has no "
            f"conversion in OpenVINO {_version()}'s TensorFlow frontend.") from None
    names = [port.get_names() for port in ov_model.outputs]  # a tensor may have several
    if ("images" not in ov_model.inputs[0].get_names() or len(names) != 2
            or not all(any(key in port for port in names)
                       for key in ("logits", "probabilities"))):
        raise RuntimeError(f"OpenVINO named the graph's tensors {ov_model.inputs} -> "
                           f"{ov_model.outputs}; expected images -> logits, probabilities.")
    return ov_model


def _compile(path, precision="f32", num_threads=None):
    import openvino as ov

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
    compiled = _compile(path, precision, num_threads)
    port = compiled.output(output)
    return batched(lambda x: compiled({"images": np.asarray(x, "float32")})[port],
                   np.asarray(images, "float32"), batch)


def bf16_support():
    """`(available, reason)`: whether OpenVINO runs bf16 on this CPU."""
    _require()
    import openvino as ov

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
    import openvino as ov

    ov_model = ov.Core().read_model(str(path))
    if not ov_model.has_rt_info([RT_INFO, "labels"]):
        return None
    return json.loads(ov_model.get_rt_info([RT_INFO, "labels"]).astype(str))


def verify_openvino(path, model, images, *, image_size=None, outputs="auto",
                    num_threads=None, precision="f32"):
    """Compares a `to_openvino` IR with a Keras model on `images`.

    Returns `(max |logit diff|, top-1 agreement, max |Keras logit|)`."""
    size = model_image_size(model, image_size)
    images = as_images(images, size, len(images), name="images")
    reference = reference_logits(model, images, outputs)
    return compare(reference, run_openvino(path, images, num_threads=num_threads,
                                           precision=precision))


def bin_path(path):
    """The `.bin` (weights) beside an IR `.xml`."""
    return os.path.splitext(str(path))[0] + ".bin"


def to_openvino(model, path, *, quantization=None, image_size=None, outputs="auto",
                validation_data=None, validation_split=None, num_validation=2000,
                num_threads=None, latency_repeats=20, check=True, verbose=True, seed=0,
                data_dir=None, holdout=0.1, skip_corrupt=False):
    """Exports `model` to an OpenVINO IR (`path`, a `.xml`, and its weights
    `<stem>.bin`), verifies it with the OpenVINO runtime, then puts it at
    `path`.

    The IR takes `images`, float32 `(batch, H, W, 3)` RGB pixels in
    [0, 255] with any batch size (the model's preprocessing is inside),
    and returns `logits` and `probabilities`, float32 `(batch, classes)`.
    The class names are inside (`rt_info` `keras_vit/labels`, a JSON list;
    read them with `openvino_class_names`) and beside it as
    `<stem>.labels.txt`.

    Both files are written to a temporary directory beside `path`
    (`.<name>.tmp-<random>`), compiled for the CPU at f32 inference
    precision and run on the validation images; the logits are compared
    with the Keras model's on the same pixels. Where the CPU has bf16
    (AVX512_BF16 or AMX; OpenVINO then runs bf16 by default) the same file
    is measured at bf16 too (`report.bf16`); elsewhere `report.bf16` says
    it is not available. Only then are `<stem>.bin` and `path` renamed into
    place. An export that misses its bar is moved to `<path>.rejected` (a
    directory holding both files) with its report as
    `<path>.rejected.json`; any error (a missing openvino included) leaves
    nothing at `path` and no temporary files.

    Args:
        model: a Keras image classifier taking RGB pixels in [0, 255].
        path: the `.xml` file to write (`<stem>.bin` is written beside it).
        quantization: `None`/`"none"` (float32 weights) or `"float16"`
            (weights stored in fp16: half the size; computed in f32).
        image_size: `(height, width)` for a model built with a free size.
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
            bar (`CHECKS`): float32 max |logit diff| <= 1e-4 (x the largest
            |logit| above 1) and 100% top-1 agreement at f32; float16
            >= 99%; and, where bf16 is measured, >= 99% at bf16.
            `check=False` still measures and reports, keeps the file and
            logs a warning.
        verbose: print the report.

    Returns:
        `ExportReport` (`runtime`, `bf16`, size of both files, validation
        sample, max |logit diff| and top-1 agreement with Keras, latencies,
        the labels file).

    Example:

    >>> report = keras_vit.export.to_openvino(
    ...     model, "vit.xml", validation_data="folder:/data/digits")  # doctest: +SKIP
    >>> report.top1_agreement, report.bf16["available"]  # doctest: +SKIP
    (1.0, False)
    >>> import openvino  # doctest: +SKIP
    >>> compiled = openvino.Core().compile_model("vit.xml", "CPU")  # doctest: +SKIP
    >>> logits = compiled({"images": float32_pixels})["logits"]  # doctest: +SKIP
    """
    path = str(path)
    if not path.endswith(".xml"):
        raise ValueError(f"path={path!r}: an OpenVINO IR file name ends with '.xml' "
                         "(its weights go to the .bin beside it).")
    if os.path.isdir(path):
        raise ValueError(f"path={path!r} is a directory; give a .xml file name.")
    require_tensorflow_backend()
    quantization = _check_quantization(quantization)
    _require()  # before the conversion: an unverifiable file is never written
    import openvino as ov

    import keras_vit

    size = model_image_size(model, image_size)
    kind = output_kind(model, outputs)
    validation = validation_data_for(validation_data, size, num_validation, validation_split,
                                     seed=seed, data_dir=data_dir, holdout=holdout,
                                     skip_corrupt=skip_corrupt)
    ov_model = convert(model, image_size=size, outputs=outputs)
    names = model_class_names(model)
    info = {"image_size": json.dumps(list(size)),
            "input": f"images: float32 (batch, {size[0]}, {size[1]}, 3) RGB pixels in "
                     "[0, 255]",
            "outputs": "logits, probabilities: float32 (batch, classes)",
            "keras_output": kind, "keras_vit_version": keras_vit.__version__}
    if names:
        info["labels"] = json.dumps(list(names))
    for key, value in info.items():
        ov_model.set_rt_info(value, [RT_INFO, key])
    temporary = temporary_path(path)
    xml = os.path.join(temporary, os.path.basename(path))
    try:
        os.makedirs(temporary)
        ov.save_model(ov_model, xml, compress_to_fp16=quantization == "float16")
        images = validation.images
        reference = reference_logits(model, images, outputs)
        max_diff, agreement, max_logit = compare(
            reference, run_openvino(xml, images, num_threads=num_threads))
        bf16 = _measure_bf16(xml, images, reference, num_threads)
        compiled = _compile(xml, "f32", num_threads)
        one = np.asarray(images[:1], "float32")
        report = ExportReport(
            format="openvino", path=path, quantization=quantization,
            size_bytes=directory_size(temporary), validation=validation.info,
            max_abs_diff=max_diff, top1_agreement=agreement, max_abs_logit=max_logit,
            batch_size=1, runtime=f"OpenVINO {_version()} (CPU, f32)", bf16=bf16,
            latency_ms=median_ms(lambda: compiled({"images": one}), latency_repeats),
            keras_latency_ms=keras_latency_ms(model, one, latency_repeats),
            signature={"inputs": {"images": f"float32 [batch, {size[0]}, {size[1]}, 3]"},
                       "outputs": {"logits": "float32 [batch, classes]",
                                   "probabilities": "float32 [batch, classes]"}})
        passed = evaluate(report, **CHECKS[quantization])
        if bf16["available"]:
            report.criteria += (f" and bf16 top-1 agreement >= "
                                f"{100 * BF16_MIN_TOP1_AGREEMENT:g}%"
                                + ("" if bf16["passed"] else " MISSED"))
            report.passed = passed = passed and bf16["passed"]
        if not passed and check:
            reject(report, file=temporary)
        publish(os.path.join(temporary, os.path.basename(bin_path(path))), bin_path(path))
        publish(xml, path)
        report.labels = labels_beside(names, path)
    finally:
        if os.path.lexists(temporary):
            shutil.rmtree(temporary)
    if not passed:
        warn_kept(report)
    if verbose:
        print(report)
    return report
