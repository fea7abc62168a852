"""What the SavedModel and TFLite exports share: the logits of a model,
validation / calibration images, timing and the verification report."""

import dataclasses
import json
import os
import statistics
import time

import keras
import numpy as np

OUTPUT_KINDS = ("auto", "logits", "probabilities")


class ExportVerificationError(ValueError):
    """An export is further from the Keras model than its mode allows.

    `report` holds the measured figures; the rejected file is kept next to
    the requested path with a `.rejected` suffix for inspection."""

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


def model_image_size(model, image_size=None):
    """(height, width) the model takes; `image_size` for models built with
    a free input size."""
    shape = model.input_shape
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
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    name = getattr(activation, "__name__", None)
    if isinstance(last, keras.layers.Dense) and name in ("softmax", "linear"):
        return "probabilities" if name == "softmax" else "logits"
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
                             and getattr(last.activation, "__name__", None) == "softmax")
    if kind == "logits":
        def call(images):
            logits = ops.cast(model(images, training=False), "float32")
            return logits, ops.softmax(logits, axis=-1)
    elif head_is_softmax_dense:
        features = keras.Model(model.input, last.input)

        def call(images):
            x = ops.cast(features(images, training=False), last.compute_dtype)
            logits = ops.cast(ops.matmul(x, last.kernel) + last.bias, "float32")
            return logits, ops.softmax(logits, axis=-1)
    else:
        def call(images):
            probabilities = ops.cast(model(images, training=False), "float32")
            return ops.log(ops.maximum(probabilities, 1e-30)), probabilities
    return call


def as_images(data, image_size, limit, split="test", name="validation_data"):
    """float32 pixels in [0, 255], shape (N, H, W, 3), N <= limit, from an
    array, a `tf.data.Dataset` (of images or `(images, labels)`, batched or
    not) or a `keras_vit.data` source string. None stays None."""
    import tensorflow as tf

    if data is None:
        return None
    if isinstance(data, str):
        from keras_vit.data import make_dataset
        data = make_dataset(data, split, image_size=image_size, batch_size=32,
                            preset="eval")
    if isinstance(data, tf.data.Dataset):
        chunks, count = [], 0
        for element in data:
            images = element[0] if isinstance(element, (tuple, list)) else element
            images = np.asarray(images, dtype="float32")
            if images.ndim == 3:
                images = images[None]
            chunks.append(images)
            count += len(images)
            if count >= limit:
                break
        if not chunks:
            raise ValueError(f"{name} is an empty dataset.")
        data = np.concatenate(chunks)
    array = np.asarray(data, dtype="float32")
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"{name} must be RGB images (N, height, width, 3) in [0, 255]; "
                         f"got shape {array.shape}.")
    array = array[:limit]
    if tuple(array.shape[1:3]) != tuple(image_size):
        array = tf.image.resize(array, image_size).numpy()
    return array


def validation_images(data, size, limit, split, calibration=None):
    """`(images, description)` to verify an export on: `data`; else the
    calibration data (its `split` when it is a source string); else 8 (at
    most `limit`) seeded random pixel images."""
    images = as_images(data, size, limit, split=split)
    if images is not None:
        return images, data if isinstance(data, str) else "given"
    images = as_images(calibration, size, limit, split=split, name="representative_data")
    if images is not None:
        name = calibration if isinstance(calibration, str) else "given"
        return images, f"{name} (the calibration data)"
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, (min(limit, 8), *size, 3)).astype("float32"), "random pixels"


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


@dataclasses.dataclass
class ExportReport:
    """How far an export is from its Keras model, measured.

    `max_abs_diff` and `top1_agreement` compare the export's logits with
    the Keras model's on `validation_images` images (`validation` says
    which); latencies are medians per batch of `batch_size`."""

    format: str
    path: str
    quantization: str
    size_bytes: int
    validation: str
    validation_images: int
    max_abs_diff: float
    top1_agreement: float
    max_abs_logit: float = None
    batch_size: int = 1
    ops: dict = None
    builtin_ops_only: bool = None
    float_ops: list = None
    latency_ms: float = None
    keras_latency_ms: float = None
    signature: dict = None
    passed: bool = None
    criteria: str = None

    @property
    def size_mb(self):
        return self.size_bytes / 1e6

    def to_dict(self):
        data = dataclasses.asdict(self)
        data["size_mb"] = round(self.size_mb, 3)
        return data

    def to_json(self):
        return json.dumps(self.to_dict())

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
        rows.append(("validation", f"{self.validation_images} images ({self.validation})"))
        rows.append(("max |logit diff| vs Keras", f"{self.max_abs_diff:.3g}"))
        rows.append(("top-1 agreement with Keras", f"{100 * self.top1_agreement:.2f}%"))
        if self.latency_ms is not None:
            rows.append(("median latency", f"{self.latency_ms:.2f} ms per batch of "
                         f"{self.batch_size} (Keras: {self.keras_latency_ms:.2f} ms)"))
        if self.criteria:
            rows.append(("check", f"{'passed' if self.passed else 'FAILED'}: {self.criteria}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def check(report, max_abs_diff=None, min_top1_agreement=None):
    """Sets `report.passed`/`criteria`; raises ExportVerificationError (and
    renames the file to `.rejected`) when the export falls short.

    `max_abs_diff` scales with the logits above 1: the bar is
    `max_abs_diff * max(1, max |Keras logit|)`, float32 rounding being
    relative."""
    rules, passed = [], True
    if max_abs_diff is not None:
        scale = max(1.0, report.max_abs_logit or 0.0)
        limit = max_abs_diff * scale
        rules.append(f"max |diff| <= {max_abs_diff:g}"
                     + (f" x max |logit| {scale:.3g}" if scale > 1 else ""))
        passed &= report.max_abs_diff <= limit
    if min_top1_agreement is not None:
        rules.append(f"top-1 agreement >= {100 * min_top1_agreement:g}%")
        passed &= report.top1_agreement >= min_top1_agreement
    report.criteria, report.passed = " and ".join(rules), bool(passed)
    if not passed:
        rejected = report.path.rstrip("/") + ".rejected"
        if os.path.exists(rejected):
            import shutil
            shutil.rmtree(rejected) if os.path.isdir(rejected) else os.remove(rejected)
        os.replace(report.path, rejected)
        report.path = rejected
        raise ExportVerificationError(
            f"The {report.format} export ({report.quantization}) fails its check "
            f"({report.criteria}): max |diff| {report.max_abs_diff:.3g}, top-1 agreement "
            f"{100 * report.top1_agreement:.2f}% on {report.validation_images} images. "
            f"Kept for inspection at {rejected}; pass check=False to accept it.", report)
    return report
