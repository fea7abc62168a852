"""Image augmentations for ViT training, graph-safe inside `dataset.map`.

Every random choice uses stateless TF random ops driven by an explicit
`seed` tensor (shape `[2]`, int64), so a pipeline with a seed gives the same
images every run, whatever the parallelism.

- `inception_crop`: Szegedy et al. 2015; area (0.05, 1), aspect (3/4, 4/3),
  as big_vision's `decode_jpeg_and_inception_crop` (the AugReg code). JPEGs
  are decoded only inside the crop window (`tf.image.decode_and_crop_jpeg`).
- `randaugment`: Cubuk et al. 2020, one op drawn *per image* per layer, with
  the op list and magnitude mapping of the TPU/big_vision `autoaugment.py`
  (`_MAX_LEVEL = 10`, magnitudes 0..30, fill value 128).
- `mixup` (Zhang et al. 2018) and `cutmix` (Yun et al. 2019): on batches,
  one coefficient per batch mixing each image with its neighbour (roll by
  one), as big_vision's `mixup`; labels mixed the same way.
"""

import math

import tensorflow as tf

from keras_vit import _checks
from keras_vit.data import exif

MAX_LEVEL = 10.0
MAX_MAGNITUDE = 30
FILL = 128.0
TRANSLATE_CONST = 100.0
CUTOUT_CONST = 40.0
RANDAUGMENT_OPS = (
    "AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
    "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY",
    "TranslateX", "TranslateY", "Cutout", "SolarizeAdd",
)


def split_seed(seed, num):
    """`num` independent seeds from one `[2]` seed."""
    return tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), num)


# --- decoding and cropping ------------------------------------------------

def decode_image(encoded):
    """Decodes JPEG/PNG/GIF/BMP bytes to `(H, W, 3)` uint8, turned upright
    by a JPEG's EXIF orientation (`keras_vit.data.exif`)."""
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    image.set_shape([None, None, 3])
    return exif.apply_orientation(image, exif.orientation(encoded))


def _crop_window(shape, seed, area_range, aspect_range):
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, bounding_boxes=tf.zeros([1, 0, 4]), seed=seed,
        min_object_covered=0.0, aspect_ratio_range=aspect_range,
        area_range=area_range, max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return begin, size


def decode_and_inception_crop(encoded, size, seed, area_range=(0.05, 1.0),
                              aspect_range=(3 / 4, 4 / 3)):
    """Inception crop, then bilinear resize to `size`; returns float32
    pixels in [0, 255]. JPEGs are decoded inside the window only, which is
    drawn in the stored image and then turned upright with it (the default
    aspect range holds each ratio's inverse, so the crops drawn are the
    same either way round)."""
    def jpeg():
        shape = tf.image.extract_jpeg_shape(encoded)
        begin, window = _crop_window(shape, seed, area_range, aspect_range)
        crop = tf.stack([begin[0], begin[1], window[0], window[1]])
        image = tf.image.decode_and_crop_jpeg(encoded, crop, channels=3)
        return exif.apply_orientation(image, exif.jpeg_orientation(encoded))

    def other():
        image = decode_image(encoded)
        begin, window = _crop_window(tf.shape(image), seed, area_range, aspect_range)
        return tf.slice(image, begin, window)

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, 3])
    return resize(image, size)


def resize(image, size):
    """Bilinear resize to `size`, float32 in [0, 255] (the official eval).
    Bilinear weights are convex, so the result needs no clipping."""
    return tf.image.resize(image, size, method="bilinear")


def resize_and_center_crop(image, size, crop_fraction=0.875):
    """Resizes the shorter side to `size / crop_fraction`, then takes the
    central `size` crop (big_vision `resize_small|central_crop`)."""
    h, w = size
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = max(h, w) / crop_fraction / tf.reduce_min(shape)
    new = tf.cast(tf.math.ceil(shape * scale), tf.int32)
    image = tf.image.resize(image, new, method="bilinear")
    top = (new[0] - h) // 2
    left = (new[1] - w) // 2
    return tf.clip_by_value(image[top:top + h, left:left + w], 0.0, 255.0)


def random_flip(image, seed):
    return tf.image.stateless_random_flip_left_right(image, seed)


# --- RandAugment ----------------------------------------------------------

def _blend(degenerate, image, factor):
    return tf.clip_by_value(degenerate + factor * (image - degenerate), 0.0, 255.0)


def _grayscale(image):
    return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def _auto_contrast(image):
    low = tf.reduce_min(image, axis=[0, 1], keepdims=True)
    high = tf.reduce_max(image, axis=[0, 1], keepdims=True)
    scale = tf.math.divide_no_nan(255.0, high - low)
    return tf.where(high > low, (image - low) * scale, image)


def _equalize_channel(channel):
    values = tf.cast(channel, tf.int32)
    histogram = tf.math.bincount(values, minlength=256, maxlength=256)
    nonzero = tf.boolean_mask(histogram, histogram > 0)
    step = (tf.reduce_sum(nonzero) - nonzero[-1]) // 256

    def equalized():
        lut = (tf.cumsum(histogram) + step // 2) // step
        lut = tf.clip_by_value(tf.concat([[0], lut[:-1]], 0), 0, 255)
        return tf.cast(tf.gather(lut, values), tf.float32)

    return tf.cond(step > 0, equalized, lambda: channel)


def _equalize(image):
    return tf.stack([_equalize_channel(image[..., c]) for c in range(3)], axis=-1)


def _transform(image, matrix):
    """Projective transform (output -> input coordinates), nearest, gray fill."""
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=tf.cast(matrix, tf.float32)[None],
        output_shape=tf.shape(image)[:2], fill_value=FILL,
        interpolation="NEAREST", fill_mode="CONSTANT",
    )
    return out[0]


def _rotate(image, degrees):
    h = tf.cast(tf.shape(image)[0], tf.float32)
    w = tf.cast(tf.shape(image)[1], tf.float32)
    a = degrees * math.pi / 180.0
    cos, sin = tf.cos(a), tf.sin(a)
    x0 = (w - 1) / 2 - (cos * (w - 1) / 2 - sin * (h - 1) / 2)
    y0 = (h - 1) / 2 - (sin * (w - 1) / 2 + cos * (h - 1) / 2)
    return _transform(image, [cos, -sin, x0, sin, cos, y0, 0.0, 0.0])


def _sharpness(image, factor):
    kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
    kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
    smooth = tf.nn.depthwise_conv2d(image[None], kernel, [1, 1, 1, 1], "VALID")[0]
    smooth = tf.round(tf.clip_by_value(smooth, 0.0, 255.0))
    # the border keeps the original pixels
    smooth = tf.pad(smooth, [[1, 1], [1, 1], [0, 0]])
    mask = tf.pad(tf.ones_like(smooth[1:-1, 1:-1]), [[1, 1], [1, 1], [0, 0]])
    degenerate = tf.where(mask > 0, smooth, image)
    return _blend(degenerate, image, factor)


def _cutout(image, pad, seed):
    h, w = tf.shape(image)[0], tf.shape(image)[1]
    center = tf.random.stateless_uniform([2], seed, maxval=tf.int32.max, dtype=tf.int32)
    cy, cx = center[0] % h, center[1] % w
    rows = tf.range(h)[:, None]
    cols = tf.range(w)[None, :]
    inside = (tf.abs(rows - cy) < pad) & (tf.abs(cols - cx) < pad)
    return tf.where(inside[..., None], FILL, image)


def _apply_op(index, image, level, seed):
    """One RandAugment op (`RANDAUGMENT_OPS[index]`) at `level` on a float32
    [0, 255] image."""
    sign_seed, cutout_seed = tf.unstack(split_seed(seed, 2))
    sign = tf.where(tf.random.stateless_uniform([], sign_seed) < 0.5, -1.0, 1.0)
    frac = level / MAX_LEVEL
    enhance = frac * 1.8 + 0.1
    bits = tf.cast(tf.cast(frac * 4, tf.int32), tf.int32)
    threshold = tf.cast(tf.cast(frac * 256, tf.int32), tf.float32)
    add = tf.cast(tf.cast(frac * 110, tf.int32), tf.float32)
    shear = sign * frac * 0.3
    shift = sign * frac * TRANSLATE_CONST
    pad = tf.cast(frac * CUTOUT_CONST, tf.int32)

    def posterize():
        shift_bits = 8 - tf.clip_by_value(bits, 0, 8)
        pixels = tf.cast(image, tf.int32)
        return tf.cast(tf.bitwise.left_shift(
            tf.bitwise.right_shift(pixels, shift_bits), shift_bits), tf.float32)

    branches = [
        lambda: _auto_contrast(image),
        lambda: _equalize(image),
        lambda: 255.0 - image,
        lambda: _rotate(image, sign * frac * 30.0),
        posterize,
        lambda: tf.where(image < threshold, image, 255.0 - image),
        lambda: _blend(_grayscale(image), image, enhance),
        lambda: _blend(tf.fill(tf.shape(image), tf.reduce_mean(_grayscale(image))),
                       image, enhance),
        lambda: _blend(tf.zeros_like(image), image, enhance),
        lambda: _sharpness(image, enhance),
        lambda: _transform(image, [1.0, shear, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
        lambda: _transform(image, [1.0, 0.0, 0.0, shear, 1.0, 0.0, 0.0, 0.0]),
        lambda: _transform(image, [1.0, 0.0, -shift, 0.0, 1.0, 0.0, 0.0, 0.0]),
        lambda: _transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, -shift, 0.0, 0.0]),
        lambda: _cutout(image, pad, cutout_seed),
        lambda: tf.where(image < 128.0, tf.clip_by_value(image + add, 0.0, 255.0), image),
    ]
    out = tf.switch_case(index, branches)
    out.set_shape(image.shape)
    return out


def check_randaugment(num_ops, magnitude):
    _checks.non_negative_int(num_ops, "num_ops", "the RandAugment ops per image")
    if isinstance(magnitude, bool) or not isinstance(magnitude, (int, float)) \
            or not 0 <= magnitude <= MAX_MAGNITUDE:
        raise ValueError(
            f"RandAugment magnitude must be in [0, {MAX_MAGNITUDE}] (the paper's "
            f"scale; 10 = the ops' reference strength), got {magnitude!r}."
        )


def randaugment(image, num_ops, magnitude, seed):
    """Applies `num_ops` ops, each drawn uniformly per image from the 16 of
    `RANDAUGMENT_OPS`, at `magnitude` (0..30; `randaug(2, 15)` of AugReg).

    Args:
        image: `(H, W, 3)` float32 in [0, 255] (or uint8).
        seed: `[2]` int tensor; same seed, same result.

    Returns:
        float32 `(H, W, 3)` in [0, 255], integer-valued like the uint8 ops.
    """
    check_randaugment(num_ops, magnitude)
    image = tf.round(tf.cast(image, tf.float32))
    level = tf.constant(float(magnitude))
    indices, op_seeds = randaugment_choices(num_ops, seed)
    for i in range(num_ops):
        image = tf.round(_apply_op(indices[i], image, level, op_seeds[i]))
    return image


def randaugment_choices(num_ops, seed):
    """The op indices `randaugment` draws for `seed`, and the seeds of the
    ops' own randomness (signs, cutout position)."""
    seeds = split_seed(seed, 2 * max(num_ops, 1))
    indices = [
        tf.random.stateless_uniform([], seeds[2 * i], maxval=len(RANDAUGMENT_OPS),
                                    dtype=tf.int32)
        for i in range(num_ops)
    ]
    return indices, [seeds[2 * i + 1] for i in range(num_ops)]


# --- batch mixing ---------------------------------------------------------

def _beta(seed, alpha):
    """One sample of Beta(alpha, alpha), as max(lambda, 1 - lambda)."""
    s1, s2 = tf.unstack(split_seed(seed, 2))
    a = tf.random.stateless_gamma([], s1, alpha=alpha)
    b = tf.random.stateless_gamma([], s2, alpha=alpha)
    lam = a / (a + b)
    return tf.maximum(lam, 1.0 - lam)


def mixup(images, labels, alpha, seed):
    """`lam * x + (1 - lam) * roll(x, 1)`, one `lam ~ Beta(alpha, alpha)`
    per batch (big_vision's `mixup(p=alpha)`); labels the same way."""
    lam = _beta(seed, alpha)
    images = lam * images + (1.0 - lam) * tf.roll(images, 1, axis=0)
    labels = lam * labels + (1.0 - lam) * tf.roll(labels, 1, axis=0)
    return images, labels


def cutmix(images, labels, alpha, seed):
    """Pastes a box of each neighbour's image (roll by one); the box area is
    `1 - lam`, `lam ~ Beta(alpha, alpha)`; labels mixed by the exact pasted
    area."""
    lam_seed, box_seed = tf.unstack(split_seed(seed, 2))
    s1, s2 = tf.unstack(split_seed(lam_seed, 2))
    a = tf.random.stateless_gamma([], s1, alpha=alpha)
    b = tf.random.stateless_gamma([], s2, alpha=alpha)
    lam = a / (a + b)
    h, w = tf.shape(images)[1], tf.shape(images)[2]
    hf, wf = tf.cast(h, tf.float32), tf.cast(w, tf.float32)
    cut = tf.sqrt(1.0 - lam)
    ch, cw = tf.cast(hf * cut, tf.int32), tf.cast(wf * cut, tf.int32)
    center = tf.random.stateless_uniform([2], box_seed, maxval=tf.int32.max, dtype=tf.int32)
    cy, cx = center[0] % h, center[1] % w
    y0, y1 = tf.maximum(cy - ch // 2, 0), tf.minimum(cy + ch // 2, h)
    x0, x1 = tf.maximum(cx - cw // 2, 0), tf.minimum(cx + cw // 2, w)
    rows = tf.range(h)[:, None]
    cols = tf.range(w)[None, :]
    box = (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
    images = tf.where(box[None, :, :, None], tf.roll(images, 1, axis=0), images)
    kept = 1.0 - tf.cast((y1 - y0) * (x1 - x0), tf.float32) / (hf * wf)
    labels = kept * labels + (1.0 - kept) * tf.roll(labels, 1, axis=0)
    return images, labels
