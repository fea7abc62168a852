"""What the ViT and Mixer builders share: the keras.applications argument
handling, the checkpoint/head decisions and the weight loading."""

import logging
import os
import shutil
import tempfile

import h5py
import keras

from keras_vit import _checks
from keras_vit.errors import CheckpointMismatchError
from keras_vit.labels import set_class_names
from keras_vit.layers import ClassifierHead, SequencePooling
from keras_vit.layers.preprocessing import ImageNormalization
from keras_vit.weights.official import _fmt, load_official_weights

logger = logging.getLogger("keras_vit")

IMAGE_MEAN = 127.5
IMAGE_STD = 127.5


def check_classes(classes):
    return _checks.positive_int(classes, "classes", or_none=True)


# keras.applications' `pooling=`: the backbone's feature vector, a global
# average / maximum over the patch tokens after the final LayerNorm (class
# token left out), without pre_logits. Every model family takes them.
FEATURE_POOLINGS = ("avg", "max")
# The poolings after which a model's pre_logits layer (when it has one) is
# applied, as the official model with `num_classes=0`.
PRE_LOGITS_POOLINGS = ("token", "gap")


def check_pooling(pooling, include_top, allowed):
    """`pooling` if allowed with `include_top`; `allowed`: the model's own
    poolings (its classifiers), to which `FEATURE_POOLINGS` are added."""
    allowed = (None, *allowed, *(p for p in FEATURE_POOLINGS if p not in allowed))
    if include_top:
        if pooling is not None:
            raise ValueError(
                f"`pooling={pooling!r}` is only used with include_top=False; "
                "with the head the model pools as its classifier says. "
                f"Allowed with include_top=False: {allowed}."
            )
        return None
    if pooling not in allowed:
        raise ValueError(
            f"Unknown `pooling={pooling!r}`. Allowed: {allowed}."
        )
    return pooling


def mixed_precision_head_dtype():
    """float32 for the final norm, pooling and head under a mixed policy."""
    policy = keras.config.dtype_policy()
    if policy.compute_dtype in ("float16", "bfloat16"):
        return "float32"
    return None


def image_input(input_tensor, input_shape, default_size, effective_patch,
                description, pretrained, mixer_grid=None, allow_dynamic=True):
    """Validates the input shape and returns `(inputs, x, (height, width))`.

    `effective_patch` is the pixel size of one token (patch x ResNet
    stride); the image must be a multiple of it. `mixer_grid`: the token
    grid a Mixer checkpoint was trained at (Mixers cannot change it).

    A side given as None (`input_shape=(None, None, 3)`, as
    keras.applications allows) makes a model that takes any size at call
    time; `allow_dynamic=False` (Mixers) refuses it. The returned
    `(height, width)` is then `default_size` for each None side: the size
    the position embedding is stored at (the checkpoint's, else 224).
    """
    if input_shape is None and input_tensor is not None:
        shape = tuple(input_tensor.shape)
        input_shape = shape[1:] if len(shape) == 4 else shape
    if input_shape is None:
        input_shape = (default_size, default_size, 3)
    input_shape = tuple(input_shape)

    def valid(d, may_be_none):
        if d is None:
            return may_be_none
        return isinstance(d, int) and not isinstance(d, bool) and d > 0

    if len(input_shape) != 3 or not (
        valid(input_shape[0], True) and valid(input_shape[1], True)
        and valid(input_shape[2], False)
    ):
        raise ValueError(
            "`input_shape` must be (height, width, channels) with positive "
            "ints (channels last; height and width may be None for any size "
            f"at call time), got {input_shape!r}."
        )
    height, width, channels = input_shape
    dynamic = height is None or width is None
    if dynamic and not allow_dynamic:
        raise ValueError(
            f"{description[:1].upper()}{description[1:]} cannot take "
            f"input_shape={input_shape}: an "
            "MLP-Mixer's token-mixing weights fix the number of patches, so "
            "its image size is fixed when it is built. Give the size, e.g. "
            f"input_shape=({default_size}, {default_size}, {channels}), and "
            "resize images to it."
        )
    if pretrained and channels != 3:
        raise ValueError(
            f"Pretrained weights expect 3 input channels (RGB), got "
            f"input_shape={input_shape}. Use weights=None for {channels} "
            "channels."
        )
    ph, pw = effective_patch
    if (height is not None and height % ph) or (width is not None and width % pw):
        suggest = tuple(None if s is None else max(1, round(s / p)) * p
                        for s, p in ((height, ph), (width, pw)))
        raise ValueError(
            f"Image size {(height, width)} is not divisible by the patch size "
            f"{(ph, pw)} of {description}; use a multiple, e.g. {suggest}."
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
    size = (default_size if height is None else height,
            default_size if width is None else width)
    if input_tensor is None:
        inputs = keras.layers.Input(shape=input_shape, name="images")
        return inputs, inputs, size
    if not keras.backend.is_keras_tensor(input_tensor):
        x = keras.layers.Input(tensor=input_tensor, shape=input_shape)
        return x, x, size
    inputs = keras.utils.get_source_inputs(input_tensor)
    return inputs, input_tensor, size


def preprocessing_layer(mean=None, std=None):
    """`(x - 127.5) / 127.5`: raw [0, 255] pixels to [-1, 1], exactly the
    official eval pipeline (an `ImageNormalization`: the channel count is
    checked).

    `mean`, `std`: per-channel values on the [0, 1] scale (timm's
    `pretrained_cfg`, transformers' `image_mean`/`image_std`), e.g. the
    ImageNet `(0.485, 0.456, 0.406)`, `(0.229, 0.224, 0.225)`; then
    `(x - 255 * mean) / (255 * std)`. None, or 0.5 for every channel, is
    the official form.
    """
    official = all(v is None or all(float(c) == 0.5 for c in v) for v in (mean, std))
    if official:
        return ImageNormalization(
            mean=IMAGE_MEAN, variance=IMAGE_STD**2, name="preprocessing"
        )
    mean = [255.0 * float(c) for c in (mean if mean is not None else (0.5,) * 3)]
    std = [255.0 * float(c) for c in (std if std is not None else (0.5,) * 3)]
    return ImageNormalization(
        mean=mean, variance=[s * s for s in std], name="preprocessing"
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
    uses_pre_logits = include_top or pooling in PRE_LOGITS_POOLINGS
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
    if info.representation_size and (not representation_size or not uses_pre_logits):
        dropped.append("pre_logits/")
    return classes, representation_size, tuple(dropped)


ARITHMETIC_DEFAULTS = dict(gelu="tanh", layer_norm_epsilon=1e-6, fc_norm=False,
                          resnet_arithmetic="official", image_mean=None, image_std=None)


def arithmetic(resolved, **given):
    """The builder's arithmetic arguments: each the user's value when not
    None, else the checkpoint source's (timm / transformers weights), else
    the official default (`ARITHMETIC_DEFAULTS`)."""
    out = {}
    source = getattr(resolved, "foreign", None)
    pre = (source.preprocessing or {}) if source is not None else {}
    for key, default in ARITHMETIC_DEFAULTS.items():
        value = given.get(key)
        if value is None and source is not None:
            if key in ("image_mean", "image_std"):
                value = pre.get(key[len("image_"):])
            else:
                value = source.arithmetic.get(key)
        out[key] = default if value is None else value
    for key in ("image_mean", "image_std"):
        value = out[key]
        if value is not None:
            value = (value,) * 3 if isinstance(value, (int, float)) else tuple(value)
            if len(value) != 3 or not all(isinstance(v, (int, float)) for v in value) \
                    or (key == "image_std" and min(value) <= 0):
                raise ValueError(
                    f"`{key}` must be a number or 3 numbers on the [0, 1] scale"
                    f"{' (positive)' if key == 'image_std' else ''}, got {value!r}.")
            out[key] = value
    return out


def classification_head(x, norm_name, pool, representation_size, include_top,
                        classes, classifier_activation, layer_norm_epsilon=1e-6,
                        fc_norm=False, num_prefix_tokens=0):
    """Final LayerNorm, pooling, optional `pre_logits` (Dense + tanh) and
    the zero-initialised head; float32 under a mixed-precision policy.

    `pool`: "token" / "gap" (then pre_logits when `representation_size`),
    or the feature poolings "avg" / "max" over the patch tokens (the first
    `num_prefix_tokens` left out), never followed by pre_logits.

    `fc_norm=True` (timm's `gap` models): pool first, then the LayerNorm
    (named "fc_norm"); the sequence itself is not normalised."""
    dtype = mixed_precision_head_dtype()
    if not fc_norm:
        x = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name=norm_name)(x)
    if pool is not None:
        prefix = num_prefix_tokens if pool in FEATURE_POOLINGS else 0
        x = SequencePooling(pool, num_prefix_tokens=prefix, dtype=dtype, name="pool")(x)
        if fc_norm:
            x = keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=dtype, name="fc_norm")(x)
        if representation_size and pool in PRE_LOGITS_POOLINGS:
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
    if resolved.foreign is not None:  # timm / transformers: their own rules
        resolved.foreign.load(model, resolved.dropped)
        names = resolved.foreign.class_names
        if names and "head/" not in resolved.dropped \
                and model.output_shape[-1] == len(names):
            set_class_names(model, names)  # the config's id2label / label_names
        return model
    load_official_weights(model, resolved.params, resolved.source,
                          dropped=resolved.dropped)
    return model


def _h5_arrays(path):
    """{dataset path: shape} of a Keras weights file (its optimizer aside)."""
    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.__setitem__(name, item.shape)
                     if isinstance(item, h5py.Dataset) else None)
    return {k: v for k, v in arrays.items() if not k.startswith("optimizer/")}


def check_keras_weights(model, path):
    """A CheckpointMismatchError unless the Keras weights file at `path`
    holds exactly the arrays `model` saves (same paths, same shapes):
    Keras' `load_weights` reads the entries the model asks for and says
    nothing about the others (a deeper model's file loads into a shallower
    one). The model's own layout is what `model.save_weights` writes."""
    with tempfile.TemporaryDirectory() as tmp:
        own = os.path.join(tmp, "own.weights.h5")
        model.save_weights(own)
        wanted = _h5_arrays(own)
    found = _h5_arrays(path)
    missing = sorted(set(wanted) - set(found))
    unexpected = sorted(set(found) - set(wanted))
    misshaped = sorted(f"{k}: file {found[k]}, model {wanted[k]}"
                       for k in set(wanted) & set(found) if found[k] != wanted[k])
    if missing or unexpected or misshaped:
        parts = [f"{len(x)} {what} ({_fmt(x, 5)})" for x, what in (
            (unexpected, "arrays in the file that the model does not have"),
            (missing, "arrays of the model missing from the file"),
            (misshaped, "arrays of another shape")) if x]
        raise CheckpointMismatchError(
            f"The Keras weights file {path!r} does not fit {model.name!r} (written by "
            f"another architecture, e.g. another depth or width): {'; '.join(parts)}. "
            "Load it into the model that wrote it (same variant and options).",
            missing=missing, unexpected=unexpected, misshaped=misshaped, source=path,
            model_name=model.name)


def _load_keras_weights(model, path):
    """`model.load_weights` for a Keras 3 weights file (recognised by its
    bytes) after `check_keras_weights`: Keras picks its reader by the
    name, so a file not named `*.weights.h5` is read through a link (or
    copy) that is."""
    check_keras_weights(model, path)
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
