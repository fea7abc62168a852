"""Classifying image files: reading, decoding, resizing and batching them,
and the top classes of each (what `keras-vit predict` prints).

`predict_images` is the Python form of the command; the command calls it
with `flags=True`, so that its messages name the command's flags
(`--batch-size 9999`) where the function's name its arguments
(`batch_size=9999`).
"""

import os

import numpy as np
import tensorflow as tf

from keras_vit import _console, models
from keras_vit._image_files import image_paths, read_image_file
from keras_vit._saving import load_keras_model
from keras_vit.data.augment import decode_image as _decode
from keras_vit.data.pipeline import looks_like_image, oversized, too_large_error
from keras_vit.export.batches import check_batch_size
from keras_vit.export.model import output_kind
from keras_vit.inspect.analysis import check_finite_outputs, input_size
from keras_vit.labels import class_labels, read_labels
from keras_vit.model_arguments import check_model_arguments


def build_model(model, weights=None, ema=False, image_size=None, flags=False):
    """The model to classify with: a named model (`"ViTB16"`) with
    `weights`, `"auto"` (the architecture the checkpoint `weights`
    describes) or a `.keras` file, at `image_size` (default: the
    checkpoint's). `check_model_arguments` first (`flags`: its messages
    name the command's flags)."""
    check_model_arguments(model, weights, ema, flags=flags)
    if model.endswith(".keras"):
        return load_keras_model(model, "--model" if flags else "model")
    shape = (image_size, image_size, 3) if image_size else None
    if model == "auto":
        return models.model_from_checkpoint(weights, input_shape=shape, ema=ema)
    return models.builder(model)(weights=weights, input_shape=shape, ema=ema)


def _name(argument, flags):
    """How a message names `argument`: its flag (`--skip-corrupt`) or itself."""
    return "--" + argument.replace("_", "-") if flags else argument


def read_image(path, skip_corrupt=False, flags=False):
    """The uint8 image in `path`, upright by its EXIF orientation; None for
    a file that cannot be read or decoded with `skip_corrupt`, else a
    ValueError naming it: train's sentences (a regular file only: a FIFO
    or a device is never read; the structural check before the decoder)."""
    skip = ("pass --skip-corrupt" if flags else "pass skip_corrupt=True") + \
        " to skip such files"
    try:
        data = read_image_file(path)
    except OSError as error:
        if skip_corrupt:
            return None
        raise ValueError(f"Cannot read image file {path!r} ({error.strerror or error}); "
                         f"{skip}.") from None
    try:
        if not bool(looks_like_image(data)):  # truncated, empty, not an image
            raise tf.errors.InvalidArgumentError(None, None, "")
        large = oversized(data)
        if large:  # never decoded
            if skip_corrupt:
                return None
            raise too_large_error(path, *large, skip)
        return _decode(data)
    except tf.errors.OpError as error:
        if skip_corrupt:
            return None
        reason = _console._op_error_message(error) if error.message else ""
        raise ValueError(f"Corrupt or non-image file {path!r}"
                         + (f" ({reason})" if reason else "") + f"; {skip}.") from None


def read_images(paths, skip_corrupt=False, flags=False):
    """`(decoded uint8 images, kept paths, skipped paths)` of `paths`."""
    images, kept, skipped = [], [], []
    for path in paths:
        image = read_image(path, skip_corrupt, flags)
        if image is None:
            skipped.append(path)
            continue
        images.append(image)
        kept.append(path)
    return images, kept, skipped


def resize_images(images, size):
    """`images` resized (bilinear) to `size` `(height, width)`, stacked as
    float32 (n, height, width, 3)."""
    return np.stack([tf.image.resize(image, size, method="bilinear").numpy()
                     for image in images]).astype("float32")


def load_images(paths, size):
    """The image files of `paths` (files or folders, `image_paths`),
    decoded and resized to `size`: float32 (n, height, width, 3)."""
    images, _, _ = read_images(image_paths(paths))
    return resize_images(images, size)


def resized_batches(paths, size, batch_size, skipped, skip_corrupt=False, flags=False):
    """Yields `(pixels, paths)` in the order of `paths`: float32 (n <=
    batch_size, height, width, 3) images, each resized (bilinear) right
    after it is decoded, so that one batch of resized images and one
    full-size image are held at a time. Files that do not decode (with
    `skip_corrupt`) are appended to `skipped`."""
    pixels, kept = [], []
    for path in paths:
        image = read_image(path, skip_corrupt, flags)
        if image is None:
            skipped.append(path)
            continue
        pixels.append(tf.image.resize(image, size, method="bilinear").numpy())
        kept.append(path)
        del image  # before the next file is decoded
        if len(pixels) == batch_size:
            yield np.stack(pixels).astype("float32"), kept
            pixels, kept = [], []
    if pixels:
        yield np.stack(pixels).astype("float32"), kept


def probabilities(model, raw, outputs="auto", flags=False):
    """`(probabilities, kind)`: the softmax of logits, probabilities as they
    are (`outputs`: what the model outputs; "auto" reads its head)."""
    try:
        kind = output_kind(model, outputs)
    except ValueError as error:
        if not flags:
            raise
        raise ValueError(
            f"{str(error).split('; pass ')[0]}; pass --outputs logits or "
            "--outputs probabilities.") from None
    raw = np.asarray(raw, dtype="float64")
    if kind == "logits":
        raw = np.exp(raw - raw.max(axis=1, keepdims=True))
        raw /= raw.sum(axis=1, keepdims=True)
    return raw, kind


def top_classes(paths, probs, labels, top):
    """The `predictions` entries of `paths` from their probabilities."""
    results = []
    for path, row in zip(paths, probs, strict=True):
        order = np.argsort(-row, kind="stable")[:top]
        results.append({"image": path, "top": [
            {"label": labels[i], "index": int(i), "probability": float(row[i])}
            for i in order]})
    return results


def check_finite(raw, paths):
    """`raw` outputs (one row per path of `paths`) unless one is NaN or inf
    (`check_finite_outputs`, naming the first such image): a ranking of NaN
    probabilities is no answer."""
    raw = np.asarray(raw)
    bad = [path for path, row in zip(paths, raw.reshape(len(raw), -1), strict=True)
           if not np.isfinite(row).all()]
    if bad:
        more = f" and {_console.plural(len(bad) - 1, 'other image')}" if len(bad) > 1 else ""
        check_finite_outputs(raw, f"{bad[0]!r}{more}", "probabilities")
    return raw


def _class_names(model, num_classes, labels, flags):
    """`labels` (a list, or a file read on first use) or the model's names."""
    if isinstance(labels, (str, os.PathLike)):
        what = f"{_name('labels', flags)} {labels!r}" if flags else f"labels={labels!r}"
        labels = read_labels(labels)
    else:
        what = _name("labels", flags)
    return class_labels(model, num_classes, labels, what=what)[0]


def predict_images(model, paths, top=5, labels=None, outputs="auto", image_size=None,
                   batch_size=32, skip_corrupt=False, flags=False):
    """`(predictions, skipped paths, (height, width))`: the image files
    `paths` streamed in batches of `batch_size` (decoded, resized to the
    model's input size, classified; only the `top` classes kept), in the
    order of `paths`. `labels`: the class names, a list or a text file of
    one name per line (default: the model's, ImageNet's or class_<i>,
    `keras_vit.labels.class_labels`). Files that do not decode are skipped
    with `skip_corrupt`, else a ValueError.

    Each prediction: `{"image": path, "top": [{"label", "index", "probability"}]}`.
    """
    size = input_size(model, image_size, _name("image_size", True) if flags else None)
    batch_size = check_batch_size(batch_size, size, _name("batch_size", flags))
    results, skipped, names = [], [], None
    for pixels, kept in resized_batches(paths, size, batch_size, skipped, skip_corrupt,
                                        flags):
        raw = model.predict(pixels, batch_size=batch_size, verbose=0)
        check_finite(raw, kept)
        probs, _ = probabilities(model, raw, outputs, flags)
        names = names or _class_names(model, probs.shape[1], labels, flags)
        results += top_classes(kept, probs, names, min(top, probs.shape[1]))
    return results, skipped, size
