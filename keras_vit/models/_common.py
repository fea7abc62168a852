"""What the ViT and Mixer builders share: the keras.applications argument
handling, the checkpoint/head decisions and the weight loading."""

import logging
import os
import shutil
import tempfile

import keras

from keras_vit.weights.official import CheckpointMismatchError, load_official_weights

logger = logging.getLogger("keras_vit")

IMAGE_MEAN = 127.5
IMAGE_STD = 127.5


def check_classes(classes):
    if classes is None:
        return None
    if isinstance(classes, bool) or not isinstance(classes, int):
        raise TypeError(f"`classes` must be a positive int or None, got {classes!r}.")
    if classes <= 0:
        raise ValueError(f"`classes` must be a positive int or None, got {classes}.")
    return classes


def check_pooling(pooling, include_top, allowed):
    if include_top:
        if pooling is not None:
            raise ValueError(
                f"`pooling={pooling!r}` is only used with include_top=False; "
                "with the head the model pools as its classifier says. "
                f"Allowed with include_top=False: {(None, *allowed)}."
            )
        return None
    if pooling not in (None, *allowed):
        raise ValueError(
            f"Unknown `pooling={pooling!r}`. Allowed: {(None, *allowed)}."
        )
    return pooling


def mixed_precision_head_dtype():
    """float32 for the final norm, pooling and head under a mixed policy."""
    policy = keras.config.dtype_policy()
    if policy.compute_dtype in ("float16", "bfloat16"):
        return "float32"
    return None


def image_input(input_tensor, input_shape, default_size, effective_patch,
                description, pretrained, mixer_grid=None):
    """Validates the input shape and returns `(inputs, x, (height, width))`.

    `effective_patch` is the pixel size of one token (patch x ResNet
    stride); the image must be a multiple of it. `mixer_grid`: the token
    grid a Mixer checkpoint was trained at (Mixers cannot change it).
    """
    if input_shape is None and input_tensor is not None:
        shape = tuple(input_tensor.shape)
        input_shape = shape[1:] if len(shape) == 4 else shape
    if input_shape is None:
        input_shape = (default_size, default_size, 3)
    input_shape = tuple(input_shape)
    if len(input_shape) != 3 or any(
        not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in input_shape
    ):
        raise ValueError(
            "`input_shape` must be (height, width, channels) with positive "
            f"ints (channels last), got {input_shape!r}."
        )
    height, width, channels = input_shape
    if pretrained and channels != 3:
        raise ValueError(
            f"Pretrained weights expect 3 input channels (RGB), got "
            f"input_shape={input_shape}. Use weights=None for {channels} "
            "channels."
        )
    ph, pw = effective_patch
    if height % ph or width % pw:
        raise ValueError(
            f"Image size {(height, width)} is not divisible by the patch size "
            f"{(ph, pw)} of {description}; use a multiple, e.g. "
            f"{(max(1, round(height / ph)) * ph, max(1, round(width / pw)) * pw)}."
        )
    if mixer_grid is not None and (height // ph, width // pw) != tuple(mixer_grid):
        trained = (mixer_grid[0] * ph, mixer_grid[1] * pw)
        raise ValueError(
            f"{description} checkpoints fix the number of patches: the "
            f"token-mixing weights were trained on {mixer_grid[0]}x"
            f"{mixer_grid[1]} patches ({trained[0]}x{trained[1]} pixels), "
            f"input_shape={input_shape} gives {height // ph}x{width // pw}. "
            "A Mixer cannot change resolution with pretrained weights: resize "
            f"images to {trained[0]}x{trained[1]} or use weights=None."
        )
    if input_tensor is None:
        inputs = keras.layers.Input(shape=input_shape, name="images")
        return inputs, inputs, (height, width)
    if not keras.backend.is_keras_tensor(input_tensor):
        x = keras.layers.Input(tensor=input_tensor, shape=input_shape)
        return x, x, (height, width)
    inputs = keras.utils.get_source_inputs(input_tensor)
    return inputs, input_tensor, (height, width)


def preprocessing_layer():
    """`(x - 127.5) / 127.5`: raw [0, 255] pixels to [-1, 1], exactly the
    official eval pipeline."""
    return keras.layers.Normalization(
        mean=IMAGE_MEAN, variance=IMAGE_STD**2, name="preprocessing"
    )


def plan_head(resolved, include_top, pooling, classes, representation_size,
              description):
    """Decides classes, representation size and which checkpoint parts to
    drop. Returns `(classes, representation_size, dropped_prefixes)`."""
    if resolved is None or resolved.keras_weights:
        if classes is None:
            classes = 1000
        return classes, representation_size, ()
    info = resolved.info
    if include_top and classes is None:
        if info.classes is None:
            raise ValueError(
                f"Checkpoint {resolved.source} has no classification head; "
                "pass `classes=` to build a new one."
            )
        classes = info.classes
    keep_head = include_top and classes == info.classes
    uses_pre_logits = include_top or pooling is not None
    if representation_size is None:
        if info.representation_size and uses_pre_logits and (
            keep_head or not include_top
        ):
            representation_size = info.representation_size
    elif representation_size != info.representation_size:
        raise ValueError(
            f"`representation_size={representation_size}` does not match "
            f"checkpoint {resolved.source}, whose pre_logits layer has "
            f"{info.representation_size} units (None: no pre_logits). Leave "
            "it as None."
        )
    dropped = []
    if not keep_head and info.classes is not None:
        dropped.append("head/")
        if include_top:
            logger.info(
                "%s: replacing the checkpoint's %d-class head with a "
                "zero-initialised %d-class head%s, as the official fine-tuning "
                "does.", description, info.classes, classes,
                " and dropping pre_logits"
                if info.representation_size and not representation_size else "",
            )
    if info.representation_size and not representation_size:
        dropped.append("pre_logits/")
    return classes, representation_size, tuple(dropped)


def classification_head(x, norm_name, pool, representation_size, include_top,
                        classes, classifier_activation):
    """Final LayerNorm, pooling, optional `pre_logits` (Dense + tanh) and
    the zero-initialised head; float32 under a mixed-precision policy."""
    from keras_vit.layers import ClassifierHead, SequencePooling

    dtype = mixed_precision_head_dtype()
    x = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype, name=norm_name)(x)
    if pool is not None:
        x = SequencePooling(pool, dtype=dtype, name="pool")(x)
        if representation_size:
            x = keras.layers.Dense(representation_size, activation="tanh",
                                   dtype=dtype, name="pre_logits")(x)
    if include_top:
        x = ClassifierHead(classes, activation=classifier_activation,
                           kernel_initializer="zeros", dtype=dtype, name="head")(x)
    return x


def finish(inputs, outputs, name, resolved):
    model = keras.Model(inputs, outputs, name=name)
    if resolved is None:
        return model
    if resolved.keras_weights:
        _load_keras_weights(model, resolved.path)
        return model
    load_official_weights(model, resolved.params, resolved.source,
                          dropped=resolved.dropped)
    return model


def _load_keras_weights(model, path):
    """`model.load_weights` for a Keras 3 weights file (recognised by its
    bytes): Keras picks its reader by the name, so a file not named
    `*.weights.h5` is read through a link (or copy) that is."""
    if path.endswith(".weights.h5"):
        model.load_weights(path)
        return
    with tempfile.TemporaryDirectory() as tmp:
        link = os.path.join(tmp, "model.weights.h5")
        try:
            os.symlink(os.path.abspath(path), link)
        except OSError:
            shutil.copyfile(path, link)
        model.load_weights(link)


def check_family(resolved, family, description):
    if resolved is None or resolved.keras_weights:
        return
    if resolved.info.family != family:
        other = "a Mixer" if resolved.info.family == "mixer" else "a ViT"
        raise CheckpointMismatchError(
            f"Checkpoint {resolved.source} is {other} checkpoint; it does not "
            f"fit {description}. To build the model the file describes, use "
            "keras_vit.model_from_checkpoint(path) (command line: keras-vit "
            "predict --model auto)."
        )
