"""Small image folders made from real photos (scikit-learn's two samples)."""

import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_sample_images

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
