"""The images an export is calibrated (int8) and verified on, and what
they are: a seeded class-stratified sample of a `keras_vit.data` source
(never the calibration images for verification), the given array or
`tf.data.Dataset`, or seeded random pixels."""

import dataclasses
import logging
import sys

import numpy as np
import tensorflow as tf

from keras_vit.data.sample import sample_images
from keras_vit.data.sources import open_source, parse_source

logger = logging.getLogger("keras_vit")


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


def as_images(data, image_size, limit, name="images"):
    """float32 pixels in [0, 255], shape (N, H, W, 3), N <= limit, resized
    to `image_size` when they differ, from an array or a `tf.data.Dataset`
    (of images or `(images, labels)`, batched or not; its first `limit`
    images): what `verify_tflite`, `verify_onnx` and `verify_openvino`
    compare on. A string is refused (a TypeError): sample a data source
    first (`keras_vit.data.sample.sample_images`)."""
    if isinstance(data, str):
        raise TypeError(f"{name}={data!r}; give images: an array (N, height, width, 3) of "
                        "RGB pixels in [0, 255] or a tf.data.Dataset (sample a data source "
                        "first: keras_vit.data.sample.sample_images).")
    return _images_and_labels(data, image_size, limit, name)[0]


def describe(split=None, images=0, classes=None, source=None):
    """The `calibration` / `validation` entry of an `ExportReport`."""
    return {"split": split, "images": int(images),
            "classes": None if classes is None else int(classes), "source": source}


def default_validation_split(source, data_dir=None, holdout=0.1):
    """`"validation"` when `source` has that split, else `"test"` (a folder
    of class subfolders alone answers both with its holdout)."""
    try:
        open_source(source, "validation", data_dir=data_dir, holdout=holdout)
        return "validation"
    except Exception:  # noqa: BLE001 - no such split, in the source's own words
        return "test"


def _same_records(source, split_a, split_b):
    """Whether two splits of `source` are the same records: the same split
    name, or a TFRecord glob (it names its files; the split is ignored)."""
    if split_a == split_b:
        return True
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


INT8_NEEDS_DATA = ("quantization='int8' needs representative_data: real images (array, "
                   "tf.data.Dataset or a keras_vit.data source such as 'folder:DIR') to "
                   "calibrate the activation ranges.")


@dataclasses.dataclass(frozen=True)
class Sampling:
    """Where an export's calibration and validation images come from: the
    `to_tflite` / `to_onnx` / `to_openvino` / `to_saved_model` arguments of
    the same names (see `to_tflite`)."""

    representative_data: object = None
    validation_data: object = None
    num_calibration: int = 500
    num_validation: int = 2000
    validation_split: str = None
    calibration_split: str = "train"
    seed: int = 0
    data_dir: str = None
    holdout: float = 0.1
    skip_corrupt: bool = False


def export_images(quantization, sampling, size):
    """`(calibration, validation)` of an export (`sampling`: a `Sampling`):
    the int8 calibration sample (`ExportData`, or None when the mode needs
    none and no images were given) and the validation images, never the
    calibration ones (`validation_data_for`)."""
    s = sampling
    calibration = None
    if quantization == "int8":
        calibration = calibration_data(s.representative_data, size, s.num_calibration,
                                       s.calibration_split, s.seed, s.data_dir, s.holdout,
                                       skip_corrupt=s.skip_corrupt)
        if calibration is None:
            raise ValueError(INT8_NEEDS_DATA)
    elif s.representative_data is not None and not isinstance(s.representative_data, str):
        calibration = given_data(s.representative_data, size, s.num_validation,
                                 "representative_data")
    source = s.representative_data if isinstance(s.representative_data, str) else None
    validation = validation_data_for(
        s.validation_data, size, s.num_validation, s.validation_split,
        calibration_source=source, calibration_split=s.calibration_split,
        calibration=calibration, seed=s.seed, data_dir=s.data_dir, holdout=s.holdout,
        skip_corrupt=s.skip_corrupt)
    return calibration, validation
