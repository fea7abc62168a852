"""What the SavedModel and TFLite exports share: the logits of a model,
validation / calibration images, timing, the verification report and
atomic writes (temporary name, verify, then rename)."""

import dataclasses
import logging
import os
import re
import secrets
import shutil
import socket
import statistics
import sys
import time

import keras
import numpy as np

logger = logging.getLogger("keras_vit")
OUTPUT_KINDS = ("auto", "logits", "probabilities")


class ExportVerificationError(ValueError):
    """An export is further from the Keras model than its mode allows.

    `report` holds the measured figures; the rejected file is kept next to
    the requested path with a `.rejected` suffix for inspection, its report
    beside it as `<path>.rejected.json`. Nothing is left at the requested
    path."""

    def __init__(self, message, report):
        super().__init__(message)
        self.report = report


def require_tensorflow_backend():
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(
            f"keras_vit.export needs the TensorFlow backend; the Keras backend is "
            f"{backend!r}. Run with KERAS_BACKEND=tensorflow (the .keras file "
            "loads under any backend).")


def _graph_inputs(model):
    """The symbolic inputs of a Functional or Sequential model; None for a
    subclassed model (its graph is its Python `call`)."""
    try:
        return model.inputs
    except AttributeError:
        return None


def model_input_shape(model):
    """`model.input_shape`; for a subclassed model, the shape it was built
    or first called with. A ValueError when no shape is known."""
    if _graph_inputs(model) is not None:
        return model.input_shape
    shapes = list((getattr(model, "_build_shapes_dict", None) or {}).values())
    if len(shapes) == 1 and isinstance(shapes[0], (tuple, list)):
        return (None, *shapes[0][1:])
    raise ValueError(
        f"{model.name!r} ({type(model).__name__}) has no known input shape: a subclassed "
        "model is built by its first call. Call it once on a batch of images, e.g. "
        "model(np.zeros((1, 224, 224, 3))), or model.build((None, 224, 224, 3)), "
        "before exporting.")


def model_classes(model):
    """The number of outputs (classes) of `model`."""
    if _graph_inputs(model) is not None:
        return int(model.output_shape[-1])
    spec = model.compute_output_spec(keras.KerasTensor(model_input_shape(model)))
    return int(spec.shape[-1])


def model_image_size(model, image_size=None):
    """(height, width) the model takes; `image_size` for models built with
    a free input size."""
    shape = model_input_shape(model)
    if isinstance(shape, list) or len(shape) != 4:
        raise ValueError(f"Export takes a model with one image input (batch, height, "
                         f"width, channels); this one takes {shape}.")
    if shape[-1] != 3:
        raise ValueError(f"Export takes RGB models (3 input channels); this one takes "
                         f"{shape[-1]}.")
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if None not in shape[1:3] and tuple(shape[1:3]) != size:
            raise ValueError(f"image_size={image_size} but the model is built for "
                             f"{tuple(shape[1:3])}.")
        return size
    if None in shape[1:3]:
        raise ValueError("The model takes any image size; pass image_size=(height, width) "
                         "for the export.")
    return tuple(shape[1:3])


def output_kind(model, outputs="auto"):
    """`"logits"` or `"probabilities"`: what `model`'s output is.

    `"auto"` reads the last layer: a Dense with a softmax gives
    probabilities, one without an activation gives logits; anything else is
    ambiguous and must be named."""
    if outputs not in OUTPUT_KINDS:
        raise ValueError(f"outputs={outputs!r}; allowed: {OUTPUT_KINDS}.")
    if outputs != "auto":
        return outputs
    if _graph_inputs(model) is None:
        raise ValueError(
            f"Cannot tell whether {model.name!r} outputs logits or probabilities: it is a "
            f"subclassed model ({type(model).__name__}), whose last operation only its "
            "call() knows; pass outputs='logits' or outputs='probabilities'.")
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    name = getattr(activation, "__name__", None)
    if isinstance(last, keras.layers.Dense) and name in ("softmax", "linear"):
        return "probabilities" if name == "softmax" else "logits"
    if last.name in ("pre_logits", "encoder_norm", "pool"):
        raise ValueError(
            f"{model.name!r} has no classification head: it outputs features of shape "
            f"{tuple(model.output_shape[1:])} (built with include_top=False, or from a "
            "checkpoint without a head). Give it one with classes=N and fine-tune it "
            "(keras-vit train), or load a classifier checkpoint.")
    raise ValueError(
        f"Cannot tell whether {model.name!r} outputs logits or probabilities (its "
        f"last layer is {type(last).__name__} {last.name!r}); pass outputs='logits' "
        "or outputs='probabilities'.")


def logits_and_probabilities(model, outputs="auto"):
    """A function `images -> (logits, probabilities)` for `model`.

    For a softmax head the logits are the head's pre-activation (the Dense
    is re-applied without its softmax); for a model that outputs
    probabilities through another layer, log-probabilities stand in for the
    logits (they differ from logits by a constant per image)."""
    from keras import ops

    kind = output_kind(model, outputs)
    last = model.layers[-1]
    head_is_softmax_dense = (isinstance(last, keras.layers.Dense)
                             and getattr(last.activation, "__name__", None) == "softmax"
                             and _graph_inputs(model) is not None)
    if kind == "logits":
        def call(images):
            logits = ops.cast(model(images, training=False), "float32")
            return logits, ops.softmax(logits, axis=-1)
    elif head_is_softmax_dense:
        features = keras.Model(model.inputs[0], last.input)  # Sequential has no .input

        def call(images):
            x = ops.cast(features(images, training=False), last.compute_dtype)
            logits = ops.cast(ops.matmul(x, last.kernel) + last.bias, "float32")
            return logits, ops.softmax(logits, axis=-1)
    else:
        def call(images):
            probabilities = ops.cast(model(images, training=False), "float32")
            return ops.log(ops.maximum(probabilities, 1e-30)), probabilities
    return call


def pixel_graph(model, size, outputs="auto"):
    """The traced TensorFlow function (a `ConcreteFunction`) that the ONNX
    and OpenVINO exports convert: input `images`, float32 `(batch, height,
    width, 3)` RGB pixels in [0, 255] with any batch (the model's own
    preprocessing inside); outputs `logits` and `probabilities`, float32
    `(batch, classes)` (see `logits_and_probabilities`). Traced with
    standard ops only (`portable_graph`)."""
    import tensorflow as tf

    from keras_vit.layers._fused import portable_graph

    call = logits_and_probabilities(model, outputs)

    def serve(images):
        logits, probabilities = call(images)
        return {"logits": logits, "probabilities": probabilities}

    with portable_graph():
        return tf.function(serve).get_concrete_function(
            tf.TensorSpec((None, *size, 3), tf.float32, name="images"))


def _as_array(images, name):
    array = np.asarray(images, dtype="float32")
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"{name} must be RGB images (N, height, width, 3) in [0, 255]; "
                         f"got shape {array.shape}.")
    return array


def _images_and_labels(data, image_size, limit, name):
    """`(images, labels or None, kind)` from an array or a `tf.data.Dataset`
    (of images or `(images, labels)`, batched or not; one-hot labels are
    argmaxed); the first `limit` images."""
    import tensorflow as tf

    limit = sys.maxsize if limit is None else limit
    labels = None
    if isinstance(data, tf.data.Dataset):
        kind = "tf.data.Dataset"
        chunks, label_chunks, count = [], [], 0
        for element in data:
            if isinstance(element, (tuple, list)):
                images, element_labels = element[0], element[1] if len(element) > 1 else None
            else:
                images, element_labels = element, None
            images = np.asarray(images, dtype="float32")
            if images.ndim == 3:
                images = images[None]
                if element_labels is not None:
                    element_labels = np.asarray(element_labels)[None]
            chunks.append(images)
            if element_labels is not None:
                element_labels = np.asarray(element_labels)
                if element_labels.ndim == 2:  # one-hot
                    element_labels = element_labels.argmax(-1)
                label_chunks.append(element_labels.reshape(len(images), -1)[:, 0])
            count += len(images)
            if count >= limit:
                break
        if not chunks:
            raise ValueError(f"{name} is an empty dataset.")
        data = np.concatenate(chunks)
        if len(label_chunks) == len(chunks):
            labels = np.concatenate(label_chunks)[:limit].astype("int64")
    else:
        kind = "array"
    array = _as_array(data, name)[:limit]
    if tuple(array.shape[1:3]) != tuple(image_size):
        array = tf.image.resize(array, image_size).numpy()
    return array, labels, kind


def as_images(data, image_size, limit, split="test", name="validation_data", seed=0):
    """float32 pixels in [0, 255], shape (N, H, W, 3), N <= limit, from an
    array, a `tf.data.Dataset` (of images or `(images, labels)`, batched or
    not; its first `limit` images) or a `keras_vit.data` source string (a
    seeded class-stratified sample of its `split`, see
    `keras_vit.data.sample.sample_images`). None stays None."""
    if data is None:
        return None
    if isinstance(data, str):
        from keras_vit.data.sample import sample_images
        return sample_images(data, split, image_size=image_size, count=limit,
                             seed=seed).images
    return _images_and_labels(data, image_size, limit, name)[0]


def describe(split=None, images=0, classes=None, source=None):
    """The `calibration` / `validation` entry of an `ExportReport`."""
    return {"split": split, "images": int(images),
            "classes": None if classes is None else int(classes), "source": source}


def _open_split(source, split, data_dir=None, holdout=0.1):
    from keras_vit.data.sample import _open
    return _open(source, split, data_dir, holdout)


def default_validation_split(source, data_dir=None, holdout=0.1):
    """`"validation"` when `source` has that split, else `"test"` (a folder
    of class subfolders alone answers both with its holdout)."""
    try:
        _open_split(source, "validation", data_dir, holdout)
        return "validation"
    except Exception:  # noqa: BLE001 - no such split, in the source's own words
        return "test"


def _same_records(source, split_a, split_b):
    """Whether two splits of `source` are the same records: the same split
    name, or a TFRecord glob (it names its files; the split is ignored)."""
    if split_a == split_b:
        return True
    import tensorflow as tf

    from keras_vit.data.sources import parse_source
    scheme, rest = parse_source(source)
    return scheme == "tfrecord" and not tf.io.gfile.isdir(rest)


@dataclasses.dataclass
class ExportData:
    """Images an export is calibrated or verified on, and what they are."""

    images: np.ndarray
    info: dict
    sample: object = None  # keras_vit.data.sample.Sample for a source string


def source_data(source, split, size, count, seed=0, data_dir=None, holdout=0.1,
                exclude=None, skip_corrupt=False):
    """`ExportData` of a seeded stratified sample of a source string."""
    from keras_vit.data.sample import sample_images

    sample = sample_images(source, split, image_size=size, count=count, seed=seed,
                           data_dir=data_dir, holdout=holdout, exclude=exclude,
                           skip_corrupt=skip_corrupt)
    info = describe(split, len(sample), sample.classes, source)
    if sample.skipped_corrupt:
        info["skipped_corrupt"] = len(sample.skipped_corrupt)
        logger.warning("Left %d corrupt or non-image file(s) out of the %s sample of %s: %s",
                       len(sample.skipped_corrupt), split, source,
                       ", ".join(sample.skipped_corrupt[:5])
                       + (", ..." if len(sample.skipped_corrupt) > 5 else ""))
    return ExportData(sample.images, info, sample)


def given_data(data, size, count, name, source=None):
    """`ExportData` of an array or a `tf.data.Dataset`."""
    images, labels, kind = _images_and_labels(data, size, count, name)
    classes = None if labels is None else len(np.unique(labels))
    return ExportData(images, describe(None, len(images), classes, source or f"given {kind}"))


def calibration_data(data, size, count, split="train", seed=0, data_dir=None, holdout=0.1,
                     skip_corrupt=False):
    """`ExportData` to calibrate int8 on, or None when `data` is None: a
    seeded class-stratified sample of `count` images of a source string's
    `split`, or the first `count` images of an array / dataset."""
    if data is None:
        return None
    if isinstance(data, str):
        return source_data(data, split, size, count, seed, data_dir, holdout,
                           skip_corrupt=skip_corrupt)
    return given_data(data, size, count, "representative_data")


def validation_data_for(data, size, count, split=None, *, calibration_source=None,
                        calibration_split="train", calibration=None, seed=0, data_dir=None,
                        holdout=0.1, skip_corrupt=False):
    """`ExportData` to verify an export on.

    - `data` given: a source string's `split` (default: `"validation"` when
      it has one, else `"test"`), or the array / dataset itself;
    - else a calibration source string: ITS validation split, never the
      calibration images (records sampled for calibration are excluded when
      the two splits are the same records);
    - else calibration arrays (`calibration`, an `ExportData`): those,
      reported as "calibration images";
    - else 8 (at most `count`) seeded random pixel images."""
    if data is None and isinstance(calibration_source, str):
        data = calibration_source
    if isinstance(data, str):
        split = split or default_validation_split(data, data_dir, holdout)
        exclude = None
        if (calibration is not None and calibration.sample is not None
                and data == calibration_source and _same_records(data, split,
                                                                 calibration_split)):
            exclude = calibration.sample.indices
        return source_data(data, split, size, count, seed + 1, data_dir, holdout,
                           exclude=exclude, skip_corrupt=skip_corrupt)
    if data is not None:
        return given_data(data, size, count, "validation_data")
    if calibration is not None:
        images = calibration.images[:count]  # [:None]: all
        return ExportData(images, describe(None, len(images), calibration.info["classes"],
                                           "calibration images"))
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (min(count or 8, 8), *size, 3)).astype("float32")
    return ExportData(images, describe(None, len(images), None, "random pixels"))


def validation_images(data, size, limit, split, calibration=None):
    """`(images, description)`: the images `validation_data_for` picks
    (kept for callers of earlier releases)."""
    if isinstance(calibration, str) or calibration is None:
        chosen = validation_data_for(data, size, limit, split, calibration_source=calibration)
    else:
        chosen = validation_data_for(data, size, limit, split,
                                     calibration=given_data(calibration, size, limit,
                                                            "representative_data"))
    return chosen.images, chosen.info["source"]


# The float32 RGB pixels of one batch at most: the bound of a TFLite static
# batch and of `keras-vit predict --batch-size` (445 images at 224 px).
MAX_BATCH_BYTES = 256 * 2**20


def max_batch_size(image_size):
    """The largest batch of `image_size` (height, width) float32 RGB images
    within `MAX_BATCH_BYTES` (at least 1).

    Example:

    >>> max_batch_size((224, 224)), max_batch_size((32, 32))
    (445, 21845)
    """
    height, width = image_size
    return max(1, MAX_BATCH_BYTES // (height * width * 3 * 4))


def check_batch_size(batch_size, image_size, name="batch_size"):
    """`batch_size` when it is an int in `1..max_batch_size(image_size)`;
    else a ValueError naming the value and that range (`name` is the
    argument, or a command-line flag such as `"--batch-size"`).

    Example:

    >>> check_batch_size(10**6, (224, 224))
    Traceback (most recent call last):
    ValueError: batch_size=1000000; allowed: 1..445 (a batch of 224x224 RGB images holds at most 256 MiB of float32 pixels).
    """
    limit = max_batch_size(image_size)
    if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
            or not 1 <= batch_size <= limit):
        given = f"{name} {batch_size}" if name.startswith("--") else f"{name}={batch_size!r}"
        raise ValueError(f"{given}; allowed: 1..{limit} (a batch of {image_size[0]}x"
                         f"{image_size[1]} RGB images holds at most {MAX_BATCH_BYTES >> 20} "
                         "MiB of float32 pixels).")
    return int(batch_size)


def batched(fn, images, batch=32):
    """`fn` applied to `images` in chunks of `batch` (a positive int; one
    chunk when it exceeds the images), concatenated."""
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ValueError(f"batch={batch!r}; allowed: a positive int (images per run).")
    return np.concatenate([np.asarray(fn(images[i:i + batch]))
                           for i in range(0, len(images), batch)])


def reference_logits(model, images, outputs="auto", batch=32):
    """The Keras model's logits (see `logits_and_probabilities`), in batches."""
    call = logits_and_probabilities(model, outputs)
    return batched(lambda x: call(x)[0], images, batch)


def median_ms(fn, repeats, warmup=2):
    """Median wall time of `fn()` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def keras_latency_ms(model, image, repeats):
    """Median time of one traced `model(image)` call (batch of one)."""
    import tensorflow as tf

    call = tf.function(lambda x: model(x, training=False))
    x = tf.constant(image)
    return median_ms(lambda: call(x).numpy(), repeats)


def compare(reference, got):
    """max |diff|, top-1 agreement and max |reference| of two logit arrays."""
    reference, got = np.asarray(reference, "float64"), np.asarray(got, "float64")
    return (float(np.abs(reference - got).max()),
            float((reference.argmax(-1) == got.argmax(-1)).mean()),
            float(np.abs(reference).max()))


def directory_size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def _describe_row(info):
    text = f"{info['images']} images"
    if info.get("classes") is not None:
        text += f", {info['classes']} classes"
    source = info.get("source")
    if info.get("split"):
        text += f" ({source}, split {info['split']!r})"
    elif source:
        text += f" ({source})"
    return text


def _describe_bf16(bf16):
    if not bf16.get("available"):
        return f"not available ({bf16.get('reason')})"
    return (f"max |logit diff| {bf16['max_abs_diff']:.3g}, top-1 agreement "
            f"{100 * bf16['top1_agreement']:.2f}%")


@dataclasses.dataclass
class ExportReport:
    """How far an export is from its Keras model, measured.

    `max_abs_diff` and `top1_agreement` compare the export's logits with
    the Keras model's on the validation images: `validation` is
    `{"split", "images", "classes", "source"}` (source: a data source
    string, `"given array"`, `"given tf.data.Dataset"`, `"calibration
    images"` or `"random pixels"`); `calibration` says the same of the int8
    calibration images (None for other modes). `labels` is the class-name
    file written with the export (None when the model has no class names).
    `passed` / `criteria`: the mode's bar and whether it was met (also with
    `check=False`, which keeps a file that misses it). Latencies are
    medians per batch of `batch_size`. `opset`: the ONNX opset; `runtime`:
    what ran the verification (ONNX Runtime, OpenVINO); `bf16` (OpenVINO):
    the same file at bf16 inference precision, `{"available": True,
    "max_abs_diff", "top1_agreement", "passed"}`, or `{"available": False,
    "reason"}` on a CPU without bf16.

    Example (`report.to_dict()`, abridged):

    ```
    {"format": "tflite", "path": "vit.tflite", "quantization": "int8",
     "calibration": {"split": "train", "images": 500, "classes": 10,
                     "source": "folder:digits"},
     "validation": {"split": "test", "images": 360, "classes": 10,
                    "source": "folder:digits"},
     "labels": "vit.labels.txt", "top1_agreement": 0.994, "passed": true,
     "criteria": "top-1 agreement >= 97%", ...}
    ```
    """

    format: str
    path: str
    quantization: str
    size_bytes: int
    validation: dict
    max_abs_diff: float
    top1_agreement: float
    max_abs_logit: float = None
    calibration: dict = None
    labels: str = None
    batch_size: int = 1
    ops: dict = None
    builtin_ops_only: bool = None
    float_ops: list = None
    latency_ms: float = None
    keras_latency_ms: float = None
    signature: dict = None
    passed: bool = None
    criteria: str = None
    opset: int = None  # ONNX: the opset the file declares
    runtime: str = None  # what ran the verification, e.g. "onnxruntime 1.22.0 (CPU)"
    bf16: dict = None  # OpenVINO: the same file run at bf16 inference precision
    metadata: dict = None  # TFLite: the TFLite Metadata inside the file (MediaPipe)

    def __post_init__(self):
        if isinstance(self.validation, str):  # a report of an earlier release
            self.validation = describe(None, 0, None, self.validation)

    @property
    def size_mb(self):
        return self.size_bytes / 1e6

    @property
    def validation_images(self):
        """How many images the export was verified on."""
        return self.validation["images"]

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["size_mb"] = round(self.size_mb, 3)
        return data

    def to_json(self):
        from keras_vit._console import json_dumps

        return json_dumps(self.to_dict())

    def __str__(self):
        rows = [("format", self.format), ("path", self.path),
                ("quantization", self.quantization),
                ("size", f"{self.size_mb:.2f} MB")]
        if self.ops is not None:
            rows.append(("ops", f"{sum(self.ops.values())} ("
                         + ", ".join(f"{k} {v}" for k, v in sorted(self.ops.items())) + ")"))
            rows.append(("built-in ops only", "yes" if self.builtin_ops_only else "NO"))
        if self.float_ops:
            rows.append(("kept in float", ", ".join(self.float_ops)))
        if self.opset is not None:
            rows.append(("opset", str(self.opset)))
        if self.labels:
            rows.append(("labels", self.labels))
        if self.metadata:
            rows.append(("metadata", self.metadata["summary"]))
        if self.runtime:
            rows.append(("verified with", self.runtime))
        if self.calibration:
            rows.append(("calibration", _describe_row(self.calibration)))
        rows.append(("validation", _describe_row(self.validation)))
        rows.append(("max |logit diff| vs Keras", f"{self.max_abs_diff:.3g}"))
        rows.append(("top-1 agreement with Keras", f"{100 * self.top1_agreement:.2f}%"))
        if self.bf16 is not None:
            rows.append(("bf16 inference", _describe_bf16(self.bf16)))
        if self.latency_ms is not None:
            rows.append(("median latency", f"{self.latency_ms:.2f} ms per batch of "
                         f"{self.batch_size} (Keras: {self.keras_latency_ms:.2f} ms)"))
        if self.criteria:
            verdict = "passed" if self.passed else "FAILED"
            if not self.passed and not self.path.endswith(".rejected"):
                verdict += " (kept: check=False)"
            rows.append(("check", f"{verdict}: {self.criteria}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def evaluate(report, max_abs_diff=None, min_top1_agreement=None):
    """Sets `report.passed` and `report.criteria` (the bars, joined by
    "and"; a missed one is marked "MISSED"); returns `report.passed`.

    `max_abs_diff` scales with the logits above 1: the bar is
    `max_abs_diff * max(1, max |Keras logit|)`, float32 rounding being
    relative."""
    rules, passed = [], True
    if max_abs_diff is not None:
        scale = max(1.0, report.max_abs_logit or 0.0)
        ok = report.max_abs_diff <= max_abs_diff * scale
        rules.append(f"max |diff| <= {max_abs_diff:g}"
                     + (f" x max |logit| {scale:.3g}" if scale > 1 else "")
                     + ("" if ok else " MISSED"))
        passed &= ok
    if min_top1_agreement is not None:
        ok = report.top1_agreement >= min_top1_agreement
        rules.append(f"top-1 agreement >= {100 * min_top1_agreement:g}%"
                     + ("" if ok else " MISSED"))
        passed &= ok
    report.criteria, report.passed = " and ".join(rules), bool(passed)
    return report.passed


def _measured(report):
    return (f"max |diff| {report.max_abs_diff:.3g}, top-1 agreement "
            f"{100 * report.top1_agreement:.2f}% on {_describe_row(report.validation)}")


def _remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def reject(report, file=None):
    """Moves the export (`file`, default `report.path`) to
    `<report.path>.rejected`, writes the report beside it as
    `<report.path>.rejected.json` and raises `ExportVerificationError`."""
    final = report.path.rstrip("/").rstrip(os.sep)
    rejected = final + ".rejected"
    _remove(rejected)
    os.replace(file or final, rejected)
    report.path = rejected
    report.labels = None
    with open(rejected + ".json", "w") as f:
        f.write(report.to_json() + "\n")
    raise ExportVerificationError(
        f"The {report.format} export ({report.quantization}) fails its check "
        f"({report.criteria}): {_measured(report)}. Kept for inspection at {rejected} "
        f"(its report: {rejected}.json); pass check=False (keras-vit export: --no-check) "
        "to keep it", report)


def check(report, max_abs_diff=None, min_top1_agreement=None, file=None):
    """Sets `report.passed`/`criteria`; when the export falls short, moves
    it (`file`, default `report.path`) to `<path>.rejected` with the report
    as `<path>.rejected.json` and raises ExportVerificationError."""
    if not evaluate(report, max_abs_diff, min_top1_agreement):
        reject(report, file)
    return report


def warn_kept(report):
    """Logs that an export missing its bar was kept (`check=False`)."""
    logger.warning(
        "The %s export (%s) at %s misses its check (%s): %s. Kept because check=False "
        "(keras-vit export: --no-check).", report.format, report.quantization, report.path,
        report.criteria, _measured(report))


def _host():
    """This machine's name as it appears in temporary names."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:40] or "host"


def _split_target(path):
    return os.path.split(os.path.abspath(path.rstrip("/") or path))


def _temporary_name(directory, name):
    return os.path.join(directory,
                        f".{name}.tmp-{_host()}-{os.getpid()}-{secrets.token_hex(4)}")


def _writer_alive(host, pid):
    """Whether the process that named a temporary may still be writing it:
    one of another machine (or of this process) is taken as alive."""
    if host != _host() or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's process, or no such pid number
        return True
    return True


def _size(path):
    if os.path.isdir(path) and not os.path.islink(path):
        return sum(os.lstat(os.path.join(root, f)).st_size
                   for root, _, files in os.walk(path) for f in files)
    return os.lstat(path).st_size


# An earlier release's temporary (no pid in its name) untouched for this
# long (seconds) is stale: no export leaves its file unmodified that long
# while it still runs; a younger one is kept and named.
EARLIER_TEMPORARY_AGE = 3600
_TEMPORARY = re.compile(r"(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]{8}(\.old|\.labels)?")
_EARLIER_TEMPORARY = re.compile(r"[0-9a-f]{8}(\.old|\.labels)?")


def _temporaries(directory, name):
    """`(stale, earlier)`: the paths of `name`'s temporaries in `directory`
    whose writer is gone, and those of earlier releases (writer unknown)."""
    prefix = f".{name}.tmp-"
    try:
        entries = sorted(e for e in os.listdir(directory) if e.startswith(prefix))
    except OSError:
        return [], []
    stale, earlier = [], []
    for entry in entries:
        found = _TEMPORARY.fullmatch(entry[len(prefix):])
        if found is not None and not _writer_alive(found["host"], int(found["pid"])):
            stale.append(os.path.join(directory, entry))
        elif found is None and _EARLIER_TEMPORARY.fullmatch(entry[len(prefix):]):
            path = os.path.join(directory, entry)
            try:
                untouched = time.time() - os.lstat(path).st_mtime
            except OSError:
                continue
            (stale if untouched > EARLIER_TEMPORARY_AGE else earlier).append(path)
    return stale, earlier


def _plural(count, one, many):
    return f"{count} {one if count == 1 else many}"


def remove_stale_temporaries(path):
    """Removes the temporaries of export target `path` that an export
    killed before its cleanup left behind, and logs one line saying how
    many and the bytes freed; returns that count.

    A temporary is `.<name>.tmp-<host>-<pid>-<random>` (or that with
    `.old` / `.labels`) beside `path`: it is stale when it was made on this
    machine by a process that is gone. Those of running processes (a
    concurrent export to the same target) and of other machines are kept.
    Those of earlier releases (`.<name>.tmp-<random>`, whose writer is not
    known) are stale once untouched for `EARLIER_TEMPORARY_AGE` (an hour);
    younger ones are kept and named in a warning.

    Example: after `kill -9` of an export to `vit.tflite`,

    >>> remove_stale_temporaries("vit.tflite")  # doctest: +SKIP
    Removed 1 stale temporary of /data/vit.tflite left by an export whose process is gone (83.1 MB freed).
    1
    """
    directory, name = _split_target(path)
    target = os.path.join(directory, name)
    stale, earlier = _temporaries(directory, name)
    removed, freed, failed = 0, 0, []
    for temporary in stale:
        try:
            size = _size(temporary)
            _remove(temporary)
        except FileNotFoundError:  # removed meanwhile (another export's sweep)
            continue
        except OSError as error:
            failed.append(f"{temporary} ({error.strerror or error})")
            continue
        removed, freed = removed + 1, freed + size
    if removed:
        logger.warning("Removed %s of %s left by an export whose process is gone (%.1f MB "
                       "freed).", _plural(removed, "stale temporary", "stale temporaries"),
                       target, freed / 1e6)
    if failed:
        logger.warning("Could not remove %s of %s: %s",
                       _plural(len(failed), "stale temporary", "stale temporaries"), target,
                       ", ".join(failed))
    if earlier:
        logger.warning("Kept %s of %s written by an earlier keras_vit release (which does not "
                       "record its process); remove them by hand when no export to it is "
                       "running: %s", _plural(len(earlier), "temporary", "temporaries"),
                       target, ", ".join(earlier))
    return removed


def temporary_path(path):
    """`.<name>.tmp-<host>-<pid>-<random>` in the directory of `path`
    (created), once the stale temporaries of `path` are removed
    (`remove_stale_temporaries`)."""
    directory, name = _split_target(path)
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(path)
    return _temporary_name(directory, name)


def publish(temporary, path):
    """Moves `temporary` to `path`, replacing what is there (a file or a
    SavedModel directory) only now."""
    path = path.rstrip("/") or path
    if os.path.isdir(path) and not os.path.islink(path) or (
            os.path.lexists(path) and os.path.isdir(temporary)):
        old = _temporary_name(*_split_target(path)) + ".old"
        os.replace(path, old)
        os.replace(temporary, path)
        _remove(old)
    else:
        os.replace(temporary, path)


def write_labels(names, path):
    """Writes `names` one per line to `path` atomically; returns `path`."""
    temporary = temporary_path(path)
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in names))
        os.replace(temporary, path)
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)
    return path


def labels_path(path):
    """`<stem>.labels.txt` beside an export file."""
    return os.path.splitext(str(path))[0] + ".labels.txt"


def labels_beside(names, path):
    """Writes `names` to `labels_path(path)` and returns that path; for a
    model without class names, removes an earlier export's (stale) file
    there and returns None."""
    labels = labels_path(path)
    if names:
        return write_labels(names, labels)
    if os.path.exists(labels):
        os.remove(labels)
    return None


INT8_NEEDS_DATA = ("quantization='int8' needs representative_data: real images (array, "
                   "tf.data.Dataset or a keras_vit.data source such as 'folder:DIR') to "
                   "calibrate the activation ranges.")


def export_images(quantization, representative_data, validation_data, size, *,
                  num_calibration, num_validation, validation_split, calibration_split, seed,
                  data_dir, holdout, skip_corrupt):
    """`(calibration, validation)` of a quantizing export: the int8
    calibration sample (`ExportData`, or None when the mode needs none and
    no images were given) and the validation images, never the
    calibration ones (`validation_data_for`)."""
    calibration = None
    if quantization == "int8":
        calibration = calibration_data(representative_data, size, num_calibration,
                                       calibration_split, seed, data_dir, holdout,
                                       skip_corrupt=skip_corrupt)
        if calibration is None:
            raise ValueError(INT8_NEEDS_DATA)
    elif representative_data is not None and not isinstance(representative_data, str):
        calibration = given_data(representative_data, size, num_validation,
                                 "representative_data")
    validation = validation_data_for(
        validation_data, size, num_validation, validation_split,
        calibration_source=representative_data if isinstance(representative_data, str)
        else None, calibration_split=calibration_split, calibration=calibration, seed=seed,
        data_dir=data_dir, holdout=holdout, skip_corrupt=skip_corrupt)
    return calibration, validation


def model_class_names(model):
    """The class names stored in `model`'s head, or None."""
    from keras_vit.labels import class_names
    names = class_names(model)
    return list(names) if names else None
