"""`to_saved_model`: a SavedModel whose `serving_default` signature takes
a batch of uint8 images and returns logits, probabilities and the top k,
with the class names as the asset `assets/labels.txt`; written under a
temporary name, verified, then renamed into place."""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf

from keras_vit import _compat
from keras_vit._atomic import publish
from keras_vit.export.batches import batched
from keras_vit.export._files import check_replaceable_directory
from keras_vit.export._images import Sampling
from keras_vit.export.model import (
    exported_model,
    logits_and_probabilities,
    model_classes,
    model_image_size,
    dynamic_size_layout,
    export_image_size,
    require_tensorflow_backend,
    run_time_sizes,
    takes_any_size,
)
from keras_vit.export._pipeline import ExportFormat, export_verified
from keras_vit.export._report import ExportReport
from keras_vit.labels import write_labels
from keras_vit.layers.fused import portable_graph

LABELS_ASSET = "labels.txt"
# What the reloaded SavedModel must reach against Keras on the validation
# images: its graph is the Keras model's, so float32 rounding only.
CHECKS = {"none": {"max_abs_diff": 1e-5, "min_top1_agreement": 1.0}}


def serving_function(model, *, resize=False, top_k=5, image_size=None, outputs="auto"):
    """The `serving_default` function and its input signature.

    Input `images`: uint8, `(batch, H, W, 3)` at the model's size, or any
    `(batch, height, width, 3)` with `resize=True` (bilinear resize inside,
    as the eval pipeline). A model built with `input_shape=(None, None, 3)`
    and `resize=False` takes any `(batch, height, width, 3)` as it is
    (sides multiples of the patch size; a hybrid any size), its position
    embedding resized inside; `image_size` is then the size that
    `resize=True` resizes to. Outputs: `logits` and `probabilities`
    `(batch, classes)`, `top_k_indices` (int32) and `top_k_probabilities`
    `(batch, k)`. A channel count other than 3, or another size without
    `resize`, fails with an error that says so.
    """
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}; give a positive int.")
    dynamic = takes_any_size(model) and not resize
    multiple = None
    if dynamic:
        native, multiple = dynamic_size_layout(model)
        size = image_size or native
        height, width = model_image_size(model, size) if size else (None, None)
    else:
        height, width = model_image_size(model, image_size)
    call = logits_and_probabilities(model, outputs)
    classes = model_classes(model)
    k = min(top_k, classes)
    spec = tf.TensorSpec([None, None, None, None] if resize or dynamic
                         else [None, height, width, None], tf.uint8, name="images")

    def serve(images):
        rgb = tf.debugging.assert_equal(
            tf.shape(images)[-1], 3, message="keras_vit serving: `images` must be RGB, "
            "uint8 (batch, height, width, 3); got this many channels")
        checks = [rgb]
        if dynamic and multiple is not None:
            checks.append(tf.debugging.assert_equal(
                tf.math.floormod(tf.shape(images)[1:3], multiple), [0, 0],
                message=f"keras_vit serving: `images` height and width must be "
                f"multiples of the patch size {multiple[0]}x{multiple[1]}; got "
                "height, width modulo it"))
        elif not resize and not dynamic:
            checks.append(tf.debugging.assert_equal(
                tf.shape(images)[1:3], [height, width],
                message=f"keras_vit serving: `images` must be {height}x{width} "
                "(export with resize=True to accept any size); got height, width"))
        with tf.control_dependencies(checks):
            images = tf.cast(images, tf.float32)
        if resize:
            images = tf.image.resize(images, (height, width), method="bilinear")
        images = tf.ensure_shape(images, [None, None, None, 3] if dynamic
                                 else [None, height, width, 3])
        logits, probabilities = call(images)
        top = tf.math.top_k(probabilities, k=k)
        return {"logits": logits, "probabilities": probabilities,
                "top_k_indices": top.indices, "top_k_probabilities": top.values}

    return serve, spec


# What a SavedModel export writes in its directory: all that replacing an
# earlier one may delete (a NOTES.md beside them is the user's).
WRITTEN = ("saved_model.pb", "fingerprint.pb", "variables", "assets")


def _check_replaceable(path):
    check_replaceable_directory(path, "a SavedModel", "saved_model.pb",
                                "that holds no saved_model.pb",
                                " (e.g. a version subdirectory such as served/1)",
                                written=WRITTEN)


class _Served:
    """A written SavedModel loaded once (`tf.saved_model.load`): called on
    images (N, H, W, 3) of uint8 values, its `serving_default` logits, 32
    images per call; `outputs`: the signature's outputs, `name -> "dtype
    shape"`."""

    def __init__(self, path):
        self.loaded = tf.saved_model.load(path)  # kept: its signature reads its variables
        self.signature = self.loaded.signatures["serving_default"]

    def __call__(self, images):
        pixels = np.asarray(images).astype("uint8")
        return batched(lambda x: self.signature(images=tf.constant(x))["logits"].numpy(),
                       pixels)

    @property
    def outputs(self):
        return {k: f"{v.dtype.name} {v.shape.as_list()}"
                for k, v in self.signature.structured_outputs.items()}


@dataclasses.dataclass
class _SavedModel(ExportFormat):
    """The SavedModel of `to_saved_model`: a directory with the
    `serving_default` signature and the class names as the asset
    `assets/labels.txt`, reloaded with `tf.saved_model.load` and run on
    uint8 pixels."""

    serve: object = None  # serving_function(...)
    spec: object = None

    name = "saved_model"
    checks = CHECKS
    timed = False

    def write(self, temporary, names):
        # Standard ops only, so that the file also converts (TFLite, ONNX, TF.js).
        with portable_graph():
            archive = keras.export.ExportArchive()
            archive.track(self.model)
            if names:
                labels_dir = temporary + ".labels"  # the asset keeps its name: labels.txt
                os.makedirs(labels_dir)
                asset = tf.saved_model.Asset(
                    write_labels(names, os.path.join(labels_dir, LABELS_ASSET)))
                archive.track(asset)
                # What tf.saved_model.load restores: `loaded.labels`.
                _compat.attach_to_export_archive(archive, "labels", asset)
            archive.add_endpoint("serving_default", self.serve, input_signature=[self.spec])
            archive.write_out(temporary, verbose=False)
        return temporary

    def inputs(self, images):
        return np.clip(np.round(images), 0, 255).astype("uint8").astype("float32")

    def runner(self, file):
        return _Served(file)

    def report_fields(self, file, run, images, reference):
        return dict(batch_size=min(32, len(images)),
                    signature={"inputs": {"images": f"uint8 {self.spec.shape.as_list()}"},
                               "outputs": run.outputs})

    def put_in_place(self, temporary):
        _check_replaceable(self.path)  # again: files may have been added meanwhile
        publish(temporary, self.path)

    def label_file(self, names):
        return os.path.join(self.path, "assets", LABELS_ASSET) if names else None

    def temporaries(self, temporary):
        return [temporary, temporary + ".labels"]


def to_saved_model(model: keras.Model, path: str | os.PathLike, *, resize: bool = False,
                   top_k: int = 5, image_size: int | tuple[int, int] | None = None,
                   outputs: str = "auto",
                   validation_data: str | np.ndarray | tf.data.Dataset | None = None,
                   validation_split: str | None = None, num_validation: int = 2000,
                   check: bool = True, verbose: bool = True, seed: int = 0,
                   data_dir: str | None = None, holdout: float = 0.1,
                   skip_corrupt: bool = False,
                   representative_data: str | np.ndarray | tf.data.Dataset | None = None,
                   ) -> ExportReport:
    """Writes a SavedModel with a `serving_default` signature, verifies it,
    then puts it at `path`.

    The SavedModel is written to a temporary directory beside `path`,
    reloaded and its signature run on the validation images against the
    Keras model. Only a verified SavedModel replaces what is at `path`; one
    that misses the bar is moved to `<path>.rejected` (its report in
    `<path>.rejected.json`), and any error leaves nothing at `path`. The
    model's class names are the asset `assets/labels.txt`. See
    docs/deploy.md.

    Args:
        model: a Keras image classifier (any keras_vit model, fine-tuned or
            wrapped; the input is RGB pixels in [0, 255]).
        path: the SavedModel directory.
        resize: accept uint8 images of any size and resize them inside
            (a model built with `input_shape=(None, None, 3)` takes any size
            without it).
        top_k: how many classes `top_k_indices` holds.
        image_size: `(height, width)` for a model built with a free size:
            the size it is verified at (and `resize=True` resizes to);
            default for a keras_vit ViT: its stored position-embedding
            grid's size (the checkpoint's resolution). Without `resize`
            the signature takes any size the model takes and is verified
            at two other sizes too (`export.model.run_time_sizes`,
            reported in `run_time_sizes`).
        outputs: `"auto"`, `"logits"` or `"probabilities"`: what the model
            outputs (auto reads the head).
        validation_data, validation_split, num_validation, seed, data_dir,
        holdout, skip_corrupt: the validation images, as in `to_tflite`.
        check: raise `ExportVerificationError` when the reloaded
            SavedModel's logits differ from Keras by more than 1e-5
            (x max |logit| above 1) or a top-1 class differs (a
            `model.quantize("int8")` model: one int8 step,
            `export.model.KERAS_QUANTIZED_CHECKS`). `check=False`
            still measures and reports, keeps the SavedModel and logs a
            warning when the bar is missed.
        verbose: log one line (INFO, logger "keras_vit") when the export passes;
            the report itself is returned (`print(report)` shows it).
        representative_data: what `--calibration` names on the command
            line: a SavedModel is not quantized, so nothing is calibrated,
            but without `validation_data` the export is verified on this
            source's validation split (an array or dataset: on those
            images), as `to_tflite` and `to_onnx` verify a float export.

    Returns:
        `ExportReport` (`labels`: `<path>/assets/labels.txt` or None).

    Example:

    >>> report = keras_vit.export.to_saved_model(  # reads /data/digits  # doctest: +SKIP
    ...     model, "served/1", validation_data="folder:/data/digits")
    >>> report.validation  # doctest: +SKIP
    {'split': 'test', 'images': 360, 'classes': 10, 'source': 'folder:/data/digits'}
    >>> loaded = tf.saved_model.load("served/1")  # doctest: +SKIP
    >>> loaded.signatures["serving_default"](images=uint8_batch)["top_k_indices"]  # doctest: +SKIP
    >>> open(loaded.labels.asset_path.numpy()).read().split()  # doctest: +SKIP
    """
    require_tensorflow_backend()
    path = str(path)
    _check_replaceable(path)
    model = exported_model(model, "saved_model")
    size = export_image_size(model, image_size)  # any size: the stored grid's
    serve, spec = serving_function(model, resize=resize, top_k=top_k, image_size=size,
                                   outputs=outputs)
    fmt = _SavedModel(model, path, "none", size, outputs,
                      run_time_sizes=() if resize else run_time_sizes(model, size),
                      serve=serve, spec=spec)
    sampling = Sampling(representative_data=representative_data,
                        validation_data=validation_data, num_validation=num_validation,
                        validation_split=validation_split, seed=seed, data_dir=data_dir,
                        holdout=holdout, skip_corrupt=skip_corrupt)
    return export_verified(fmt, sampling, check=check, verbose=verbose)
