"""Small image folders made in the test from real images: crops of
scikit-learn's two sample photos (`make_folder`) and scikit-learn's scans
of handwritten digits (`write_digit_folder`, `write_digit_images`)."""

import os

import numpy as np
import tensorflow as tf
from PIL import Image
from sklearn.datasets import load_digits, load_sample_images

CLASSES = ("china", "flower", "stripes")


def make_folder(root, per_class=6, size=64, seed=0):
    """`root/<class>/<i>.jpg|png`: crops of the two photos and a synthetic
    stripe pattern (PNG), all `size` x `size`. Returns {path: (label, pixels)}."""
    china, flower = load_sample_images().images
    rng = np.random.default_rng(seed)
    truth = {}
    for label, name in enumerate(CLASSES):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            if name == "stripes":
                x = np.arange(size)[None, :, None] * (i + 1) * 9 % 256
                pixels = np.broadcast_to(x, (size, size, 3)).astype("uint8")
                pixels = np.ascontiguousarray(pixels)
                data = tf.io.encode_png(pixels).numpy()
                path = os.path.join(root, name, f"{i}.png")
            else:
                photo = china if name == "china" else flower
                y0 = int(rng.integers(0, photo.shape[0] - 4 * size))
                x0 = int(rng.integers(0, photo.shape[1] - 4 * size))
                crop = photo[y0:y0 + 4 * size, x0:x0 + 4 * size]
                crop = tf.cast(tf.image.resize(crop, (size, size)), tf.uint8).numpy()
                data = tf.io.encode_jpeg(crop, quality=95).numpy()
                pixels = tf.io.decode_jpeg(data).numpy()
                path = os.path.join(root, name, f"{i}.jpg")
            with open(path, "wb") as f:
                f.write(data)
            truth[path] = (label, pixels)
    return truth


def digit_pixels(scan, size=None):
    """One 8x8 digit scan (values 0..16) as uint8 RGB pixels, upscaled to
    `size` x `size` (a multiple of 8; nearest neighbour) when given."""
    pixels = np.round(np.asarray(scan) * (255.0 / 16.0)).astype("uint8")
    if size is not None:
        if size % 8:
            raise ValueError(f"size={size} is not a multiple of the scans' 8 pixels")
        pixels = pixels.repeat(size // 8, axis=0).repeat(size // 8, axis=1)
    return np.repeat(pixels[..., None], 3, axis=-1)


def write_digit_folder(root, digits=(0, 1, 2), per_class=20, offset=0, size=None,
                       names=None, splits=None):
    """`root/<name>/<i:04d>.png`: `per_class` real scans of each digit in
    `digits`, from its `offset`-th scan on; `name` is the digit, or the
    digit's entry of `names`. With `splits` (a dict split -> scans per
    class), `root/<split>/<name>/...`, each split taking the next scans.
    Returns the paths written, class by class."""
    scans = load_digits()
    names = list(names) if names is not None else [str(d) for d in digits]
    layout = splits or {None: per_class}
    written = []
    for digit, name in zip(digits, names, strict=True):
        of_digit = scans.images[scans.target == digit]
        start = offset
        for split, count in layout.items():
            folder = os.path.join(root, *(s for s in (split, name) if s))
            os.makedirs(folder, exist_ok=True)
            for i in range(count):
                path = os.path.join(folder, f"{i:04d}.png")
                Image.fromarray(digit_pixels(of_digit[start + i], size)).save(path)
                written.append(path)
            start += count
    return written


def write_digit_images(folder, count, size=32):
    """The first `count` digit scans as loose files
    `folder/digit<i>_<label>.png` (`size` x `size`); returns their paths."""
    scans = load_digits()
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(str(folder), f"digit{i}_{scans.target[i]}.png")
        Image.fromarray(digit_pixels(scans.images[i], size)).save(path)
        paths.append(path)
    return paths


def corrupt_png(path):
    """Truncated: fails the structural check (no IEND)."""
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[: len(raw) // 2])


def undecodable_png(path):
    """PNG signature and IEND, garbage between: passes the structural check."""
    raw = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(raw[:8] + b"garbage!" * 8 + raw[-12:])


def iterate(dataset):
    """The number of images in the batches of `dataset`."""
    return sum(int(x.shape[0]) for x, _ in dataset)
