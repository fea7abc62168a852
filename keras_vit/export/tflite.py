"""`to_tflite`: LiteRT (TFLite) flatbuffers with built-in ops only, in
float32, float16, dynamic-range int8 or full int8, run and verified with
`ai-edge-litert`."""

import collections
import os
import re
import tempfile
import warnings

import numpy as np

from keras_vit.export._common import (
    ExportReport,
    as_images,
    check as check_report,
    compare,
    keras_latency_ms,
    logits_and_probabilities,
    median_ms,
    model_image_size,
    require_tensorflow_backend,
    validation_images,
)
from keras_vit.layers._fused import portable_graph

QUANTIZATIONS = ("none", "float16", "dynamic", "int8")
# Full int8: these TFLite ops stay in float (measured on the quickstart's
# digits ViT, see the README's Deploy section): quantizing Softmax and GELU
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


def _interpreter(model_path=None, model_content=None, num_threads=None, delegates=True):
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        raise ImportError("Running and verifying TFLite files needs the LiteRT runtime: "
                          "pip install ai-edge-litert (or keras-vit[export]).") from None

    kwargs = {} if delegates else {
        "experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES}
    return Interpreter(model_path=model_path, model_content=model_content,
                       num_threads=num_threads or os.cpu_count(), **kwargs)


def tflite_ops(model_path=None, model_content=None):
    """Op name -> count in a TFLite model (before any delegate)."""
    interpreter = _interpreter(model_path, model_content, delegates=False)
    return dict(collections.Counter(op["op_name"] for op in interpreter._get_ops_details()))


def run_tflite(model_path, images, *, num_threads=None, output="logits"):
    """Runs a `to_tflite` file on `images` (N, H, W, 3) float32 pixels in
    [0, 255] in batches of its static batch size; returns `output` for all N
    (a partial last batch is padded, and the padding dropped)."""
    interpreter = _interpreter(model_path, num_threads=num_threads)
    runner = interpreter.get_signature_runner("serving_default")
    batch = runner.get_input_details()["images"]["shape"][0]
    results = []
    for start in range(0, len(images), batch):
        chunk = np.asarray(images[start:start + batch], "float32")
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, 0)])
        results.append(runner(images=chunk)[output][:n])
    return np.concatenate(results)


def verify_tflite(path, model, images, *, image_size=None, outputs="auto", num_threads=None):
    """Compares a `to_tflite` file with a Keras model on `images`.

    Returns `(max |logit diff|, top-1 agreement, max |Keras logit|)`; use
    it to check a file shipped earlier against the model it came from.
    """
    size = model_image_size(model, image_size)
    images = as_images(images, size, len(images), name="images")
    reference, _ = logits_and_probabilities(model, outputs)(images)
    return compare(reference, run_tflite(path, images, num_threads=num_threads))


def _unsupported_ops(message):
    names = re.findall(r"tf\.([A-Za-z0-9_]+)\(", message)
    listed = re.search(r"(?:TF Select ops|Flex ops): ([^\n]+)", message)
    if listed:
        names += [n.strip() for n in listed.group(1).split(",")]
    return sorted(set(n for n in names if n))


def convert(model, *, quantization="none", representative_data=None, batch_size=1,
            image_size=None, outputs="auto", float_ops="auto", num_calibration=100):
    """The TFLite flatbuffer (bytes) of `model` with built-in ops only.

    The graph takes `images`: float32 `(batch_size, H, W, 3)` pixels in
    [0, 255] and returns `logits` and `probabilities`, in a
    `serving_default` signature. Raises ValueError naming any op that has
    no TFLite built-in kernel (no Flex / SELECT_TF_OPS fallback)."""
    import keras
    import tensorflow as tf
    from tensorflow.lite.python.convert_phase import ConverterError

    require_tensorflow_backend()
    quantization = "none" if quantization is None else quantization
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization={quantization!r}; allowed: {QUANTIZATIONS} "
                         "(None means 'none').")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; give a positive int (static batch).")
    size = model_image_size(model, image_size)
    call = logits_and_probabilities(model, outputs)
    calibration = None
    if quantization == "int8":
        calibration = as_images(representative_data, size, num_calibration, split="train",
                                name="representative_data")
        if calibration is None:
            raise ValueError("quantization='int8' needs representative_data: real images "
                             "(array, tf.data.Dataset or a keras_vit.data source such as "
                             "'folder:DIR') to calibrate the activation ranges.")
        if len(calibration) < batch_size:
            raise ValueError(f"representative_data holds {len(calibration)} images; "
                             f"int8 calibration needs at least batch_size={batch_size}.")
    float_ops = _float_ops(float_ops)

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
            return converter.convert()
        except ConverterError as error:
            ops = _unsupported_ops(str(error))
            raise ValueError(
                f"{model.name!r} cannot be exported to TFLite with built-in ops only: "
                f"{', '.join(ops) if ops else 'see the converter message below'} "
                "has no TFLite built-in kernel (Flex / SELECT_TF_OPS is not used: it "
                f"needs the TF runtime on the device).\n{str(error)[-1500:]}") from None


def _convert_int8(converter, calibration, batch_size, float_ops):
    import tensorflow as tf

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


def to_tflite(model, path, *, quantization=None, representative_data=None, batch_size=1,
              image_size=None, outputs="auto", float_ops="auto", validation_data=None,
              validation_split="test", num_validation=100, num_calibration=100,
              num_threads=None, latency_repeats=20, check=True, verbose=True):
    """Exports `model` to a LiteRT (TFLite) file and verifies it.

    Args:
        model: a Keras image classifier taking RGB pixels in [0, 255].
        path: the `.tflite` file to write.
        quantization: `None`/`"none"` (float32), `"float16"` (weights in
            fp16), `"dynamic"` (int8 weights, float activations) or
            `"int8"` (int8 weights and activations, calibrated on
            `representative_data`; the ops in `float_ops` stay float).
        representative_data: calibration images for `"int8"` (array,
            `tf.data.Dataset` or a `keras_vit.data` source string, its
            `train` split); `num_calibration` of them are used.
        batch_size: the static batch of the graph.
        float_ops: TFLite op names kept in float under `"int8"`;
            `"auto"` is `INT8_FLOAT_OPS`, `()` quantizes everything.
        validation_data: images to verify on (same kinds;
            `validation_split` of a source); default: the calibration
            images, else seeded random pixels.
        num_threads: LiteRT threads (default: all cores).
        latency_repeats: timed runs for the median latencies.
        check: raise `ExportVerificationError` when the export misses its
            mode's bar (`CHECKS`): fp32 max |logit diff| <= 1e-4 and 100%
            top-1 agreement; float16 / dynamic >= 99%; int8 >= 97%.
        verbose: print the report.

    Returns:
        `ExportReport` (size, op counts, max |logit diff| and top-1
        agreement with Keras, LiteRT and Keras latencies).

    Example:

    >>> report = keras_vit.export.to_tflite(model, "vit.tflite",
    ...                                     quantization="dynamic")  # doctest: +SKIP
    >>> report.top1_agreement, report.latency_ms  # doctest: +SKIP
    """
    path = str(path)
    if not path.endswith(".tflite"):
        raise ValueError(f"path={path!r}: a TFLite file name ends with '.tflite'.")
    quantization = "none" if quantization is None else quantization
    size = model_image_size(model, image_size)
    content = convert(model, quantization=quantization,
                      representative_data=representative_data, batch_size=batch_size,
                      image_size=size, outputs=outputs, float_ops=float_ops,
                      num_calibration=num_calibration)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content)
    ops = tflite_ops(model_path=path)
    foreign = sorted(op for op in ops if op.startswith("Flex") or op == "CUSTOM")
    if foreign:
        raise ValueError(f"{path} uses ops outside the TFLite built-ins: {foreign}.")

    images, source = validation_images(validation_data, size, num_validation,
                                       validation_split, calibration=representative_data)
    max_diff, agreement, max_logit = verify_tflite(path, model, images, image_size=size,
                                                   outputs=outputs, num_threads=num_threads)

    interpreter = _interpreter(path, num_threads=num_threads)
    runner = interpreter.get_signature_runner("serving_default")
    batch = np.resize(images, (batch_size, *images.shape[1:])).astype("float32")
    report = ExportReport(
        format="tflite", path=path, quantization=quantization,
        size_bytes=os.path.getsize(path), validation=source,
        validation_images=len(images), max_abs_diff=max_diff, top1_agreement=agreement,
        max_abs_logit=max_logit, batch_size=batch_size, ops=ops, builtin_ops_only=True,
        float_ops=_float_ops(float_ops) if quantization == "int8" else None,
        latency_ms=median_ms(lambda: runner(images=batch), latency_repeats),
        keras_latency_ms=keras_latency_ms(model, batch, latency_repeats),
        signature={"inputs": {"images": f"float32 [{batch_size}, {size[0]}, {size[1]}, 3]"},
                   "outputs": {"logits": "float32", "probabilities": "float32"}})
    if check:
        check_report(report, **CHECKS[quantization])
    if verbose:
        print(report)
    return report

