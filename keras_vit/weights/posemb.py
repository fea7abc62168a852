"""Position-embedding resizing, the official algorithm.

`vit_jax/checkpoint.py` (`interpolate_posembed`): the class-token embedding
is kept apart and copied; the grid of patch embeddings is resized with
`scipy.ndimage.zoom(..., order=1)`, i.e. bilinear interpolation with aligned
corners. Other choices change official logits by 1e-2 or more
(align_corners=False, bicubic).
"""

import math

import numpy as np
import scipy.ndimage


def square_grid(num_patches):
    """Returns `(g, g)` for `num_patches == g * g`; raises otherwise."""
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"A position embedding of {num_patches} patch tokens is not a "
            "square grid; pass `old_grid` to resize it."
        )
    return side, side


def resize_position_embedding(posemb, new_grid, num_prefix_tokens=1, old_grid=None):
    """Resizes a `(1, prefix + gh * gw, D)` position embedding to `new_grid`.

    Args:
        posemb: array `(1, num_prefix_tokens + old_h * old_w, D)`.
        new_grid: `(new_h, new_w)`; need not be square.
        num_prefix_tokens: 1 for class-token models (kept unchanged), 0 for
            `gap` models (everything is grid).
        old_grid: `(old_h, old_w)`; inferred as square when omitted (every
            released checkpoint is square).

    Returns:
        float32 array `(1, num_prefix_tokens + new_h * new_w, D)`.

    Example:

    >>> pe = np.zeros((1, 1 + 14 * 14, 768), "float32")
    >>> resize_position_embedding(pe, (24, 24)).shape
    (1, 577, 768)
    """
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(
            f"Expected a position embedding of shape (1, tokens, D), got "
            f"{posemb.shape}."
        )
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        old_grid = square_grid(grid.shape[0])
    old_h, old_w = old_grid
    new_h, new_w = new_grid
    if old_h * old_w != grid.shape[0]:
        raise ValueError(
            f"old_grid {tuple(old_grid)} does not hold the {grid.shape[0]} "
            "patch embeddings."
        )
    grid = grid.reshape(old_h, old_w, -1)
    if (old_h, old_w) != (new_h, new_w):
        zoom = (new_h / old_h, new_w / old_w, 1)
        grid = scipy.ndimage.zoom(grid, zoom, order=1)
        if grid.shape[:2] != (new_h, new_w):  # internal invariant of zoom
            raise AssertionError(f"zoom produced {grid.shape}")
    grid = grid.reshape(1, new_h * new_w, -1)
    return np.concatenate([prefix, grid], axis=1).astype(np.float32)
