"""`to_saved_model`: a SavedModel whose `serving_default` signature takes
a batch of uint8 images and returns logits, probabilities and the top k."""

import numpy as np

from keras_vit.export._common import (
    ExportReport,
    check as check_report,
    compare,
    directory_size,
    logits_and_probabilities,
    model_image_size,
    require_tensorflow_backend,
    validation_images,
)
from keras_vit.layers._fused import portable_graph


def serving_function(model, *, resize=False, top_k=5, image_size=None, outputs="auto"):
    """The `serving_default` function and its input signature.

    Input `images`: uint8, `(batch, H, W, 3)` at the model's size, or any
    `(batch, height, width, 3)` with `resize=True` (bilinear resize inside,
    as the eval pipeline). Outputs: `logits` and `probabilities`
    `(batch, classes)`, `top_k_indices` (int32) and `top_k_probabilities`
    `(batch, k)`. A channel count other than 3, or another size without
    `resize`, fails with an error that says so.
    """
    import tensorflow as tf

    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}; give a positive int.")
    height, width = model_image_size(model, image_size)
    call = logits_and_probabilities(model, outputs)
    classes = model.output_shape[-1]
    k = min(top_k, classes)
    spec = tf.TensorSpec([None, None, None, None] if resize else [None, height, width, None],
                         tf.uint8, name="images")

    def serve(images):
        rgb = tf.debugging.assert_equal(
            tf.shape(images)[-1], 3, message="keras_vit serving: `images` must be RGB, "
            "uint8 (batch, height, width, 3); got this many channels")
        checks = [rgb]
        if not resize:
            checks.append(tf.debugging.assert_equal(
                tf.shape(images)[1:3], [height, width],
                message=f"keras_vit serving: `images` must be {height}x{width} "
                "(export with resize=True to accept any size); got height, width"))
        with tf.control_dependencies(checks):
            images = tf.cast(images, tf.float32)
        if resize:
            images = tf.image.resize(images, (height, width), method="bilinear")
        images = tf.ensure_shape(images, [None, height, width, 3])
        logits, probabilities = call(images)
        top = tf.math.top_k(probabilities, k=k)
        return {"logits": logits, "probabilities": probabilities,
                "top_k_indices": top.indices, "top_k_probabilities": top.values}

    return serve, spec


def to_saved_model(model, path, *, resize=False, top_k=5, image_size=None, outputs="auto",
                   validation_data=None, validation_split="test", num_validation=32,
                   check=True, verbose=True):
    """Writes a SavedModel with a `serving_default` signature and verifies it.

    The SavedModel is reloaded with `tf.saved_model.load` and its signature
    is run on the validation images; its logits are compared with the Keras
    model's on the same pixels.

    Args:
        model: a Keras image classifier (any keras_vit model, fine-tuned or
            wrapped; the input is RGB pixels in [0, 255]).
        path: the SavedModel directory.
        resize: accept uint8 images of any size and resize them inside.
        top_k: how many classes `top_k_indices` holds.
        image_size: `(height, width)` for a model built with a free size.
        outputs: `"auto"`, `"logits"` or `"probabilities"`: what the model
            outputs (auto reads the head).
        validation_data: images (array, `tf.data.Dataset` or a
            `keras_vit.data` source string) to verify on; default: seeded
            random pixels.
        validation_split: split of a source string.
        num_validation: at most this many validation images.
        check: raise `ExportVerificationError` when the reloaded
            SavedModel's logits differ from Keras by more than 1e-5.
        verbose: print the report.

    Returns:
        `ExportReport`.

    Example:

    >>> report = keras_vit.export.to_saved_model(model, "served/1")  # doctest: +SKIP
    >>> loaded = tf.saved_model.load("served/1")  # doctest: +SKIP
    >>> loaded.signatures["serving_default"](images=uint8_batch)["top_k_indices"]
    """
    import keras
    import tensorflow as tf

    require_tensorflow_backend()
    size = model_image_size(model, image_size)
    serve, spec = serving_function(model, resize=resize, top_k=top_k, image_size=size,
                                   outputs=outputs)
    # Standard ops only, so that the file also converts (TFLite, ONNX, TF.js).
    with portable_graph():
        archive = keras.export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serving_default", serve, input_signature=[spec])
        archive.write_out(str(path), verbose=False)

    images, source = validation_images(validation_data, size, num_validation,
                                       validation_split)
    pixels = np.clip(np.round(images), 0, 255).astype("uint8")
    reference, _ = logits_and_probabilities(model, outputs)(pixels.astype("float32"))
    signature = tf.saved_model.load(str(path)).signatures["serving_default"]
    got = signature(images=tf.constant(pixels))
    max_diff, agreement, max_logit = compare(reference, got["logits"])
    report = ExportReport(
        format="saved_model", path=str(path), quantization="none",
        size_bytes=directory_size(str(path)), validation=source,
        validation_images=len(pixels), max_abs_diff=max_diff, top1_agreement=agreement,
        max_abs_logit=max_logit, batch_size=len(pixels),
        signature={"inputs": {"images": f"uint8 {spec.shape.as_list()}"},
                   "outputs": {k: f"{v.dtype.name} {v.shape.as_list()}"
                               for k, v in signature.structured_outputs.items()}})
    if check:
        check_report(report, max_abs_diff=1e-5, min_top1_agreement=1.0)
    if verbose:
        print(report)
    return report

