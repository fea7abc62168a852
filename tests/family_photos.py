"""The images and the tolerance the #48 family parity tests share
(tests/test_family_checkpoints.py, test_family_transformers.py,
test_family_export.py, test_family_use.py): scikit-learn's two sample
photos at a model's size, and the issue's bound, 1e-4 x max(1, |value|).
No torch, timm or transformers here."""

import numpy as np
from sklearn.datasets import load_sample_images


def photos(size):
    """scikit-learn's two sample photos, centre-cropped and resized to
    `size` (bicubic; uint8 values as float32, NHWC)."""
    from PIL import Image

    out = []
    for image in load_sample_images().images:
        h, w = image.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        crop = Image.fromarray(image[top:top + side, left:left + side])
        out.append(np.asarray(crop.resize((size, size), Image.BICUBIC)))
    return np.stack(out).astype("float32")


def assert_parity(got, reference):
    """`got` equals the library's `reference` within 1e-4 x max(1, |value|)."""
    assert got.shape == reference.shape, (got.shape, reference.shape)
    diff = float(np.abs(got - reference).max())
    assert diff <= 1e-4 * max(1.0, float(np.abs(reference).max())), diff
