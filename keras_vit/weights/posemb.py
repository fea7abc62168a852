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

from keras_vit.errors import CheckpointMismatchError


def square_grid(num_patches):
    """Returns `(g, g)` for `num_patches == g * g`; raises otherwise."""
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(
            f"A position embedding of {num_patches} patch tokens is not a "
            "square grid; pass `old_grid` to resize it."
        )
    return side, side


MAX_EXTRA_TOKENS = 16  # prefix tokens beyond the class token named as such (DINOv2: 4 registers)


def checkpoint_grid(rows, prefix):
    """`(g, g)`: the grid of a checkpoint's position embedding of `rows`
    rows, the first `prefix` of them prefix tokens (1: the class token).

    Raises:
        CheckpointMismatchError: the other rows are no square grid. When a
            square grid and a few more rows would fit, the message says what
            those rows likely are (a distillation token, register tokens)
            and that the checkpoint holds no weights of those tokens.

    >>> checkpoint_grid(1 + 14 * 14, 1)
    (14, 14)
    """
    # rows for prefix tokens the checkpoint holds no weights of: refused in one
    # sentence, never resized.
    tokens = rows - prefix
    side = math.isqrt(max(tokens, 0))
    extra = tokens - side * side
    if extra == 0 and side:
        return side, side
    head = (f"A checkpoint's position embedding of {rows} rows "
            f"({'the class token and ' * bool(prefix)}")
    if side and extra <= MAX_EXTRA_TOKENS:
        what = ("a distillation token, as DeiT's distilled models have" if extra == 1
                else "e.g. a distillation token and register tokens")
        raise CheckpointMismatchError(
            f"{head}{tokens} more) holds {extra} extra prefix token{'s' * (extra > 1)} "
            f"before a {side}x{side} grid of patches ({what}), but the checkpoint holds "
            "no weights of such tokens, so it is refused.")
    raise CheckpointMismatchError(
        f"{head}{tokens} patch tokens) holds no square grid of patches, which every "
        "checkpoint keras_vit reads has.")


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


# --- the resizes of other libraries ----------------------------------------
#
# A checkpoint from timm, Hugging Face transformers or DINO is resized as its
# own library resizes it, so that a model loaded at another resolution
# computes what that library computes. All are PyTorch's `F.interpolate(...,
# mode="bicubic")` on the (D, h, w) grid, written here in NumPy (float64,
# then float32) so that no PyTorch is needed.


def _cubic(x, a):
    """Keys' cubic convolution kernel with parameter `a`."""
    x = np.abs(x)
    return np.where(
        x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0),
    )


def _bicubic_matrix(old, new, scale=None):
    """`(new, old)` interpolation matrix of PyTorch's bicubic upsampling
    with `align_corners=False` and no antialias (`upsample_bicubic2d`):
    source coordinate `(i + 0.5) * scale - 0.5`, kernel a = -0.75,
    indices clamped at the borders. `scale`: source pixels per output
    pixel, `old / new` when the output size is given (`size=`); a call
    with `scale_factor=f` samples at `1 / f`."""
    matrix = np.zeros((new, old))
    scale = old / new if scale is None else scale
    for i in range(new):
        src = (i + 0.5) * scale - 0.5
        base = int(np.floor(src))
        t = src - base
        for offset in (-1, 0, 1, 2):
            weight = _cubic(np.float64(t - offset), -0.75)
            matrix[i, min(max(base + offset, 0), old - 1)] += weight
    return matrix


def _antialiased_bicubic_matrix(old, new):
    """`(new, old)` matrix of PyTorch's `antialias=True` bicubic resize
    (`_upsample_bicubic2d_aa`, PIL's algorithm): kernel a = -0.5, stretched
    by the scale when shrinking, truncated at the borders and normalised."""
    matrix = np.zeros((new, old))
    scale = old / new
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    for i in range(new):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), old)
        j = np.arange(lo, hi)
        weights = _cubic((j - center + 0.5) * inv, -0.5)
        total = weights.sum()
        matrix[i, lo:hi] = weights / total if total != 0 else weights
    return matrix


def _resize_grid(posemb, new_grid, num_prefix_tokens, old_grid, matrices):
    posemb = np.asarray(posemb)
    if posemb.ndim != 3 or posemb.shape[0] != 1:
        raise ValueError(
            f"Expected a position embedding of shape (1, tokens, D), got "
            f"{posemb.shape}."
        )
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
    if old_grid is None:
        old_grid = square_grid(grid.shape[0])
    (old_h, old_w), (new_h, new_w) = tuple(old_grid), tuple(new_grid)
    if old_h * old_w != grid.shape[0]:
        raise ValueError(
            f"old_grid {tuple(old_grid)} does not hold the {grid.shape[0]} "
            "patch embeddings."
        )
    grid = grid.reshape(old_h, old_w, -1).astype(np.float64)
    if (old_h, old_w) != (new_h, new_w):
        grid = np.einsum("ih,hwd->iwd", matrices(old_h, new_h), grid)
        grid = np.einsum("jw,iwd->ijd", matrices(old_w, new_w), grid)
    grid = grid.reshape(1, new_h * new_w, -1)
    return np.concatenate([prefix, grid], axis=1).astype(np.float32)


def resample_abs_pos_embed_timm(posemb, new_grid, num_prefix_tokens=1, old_grid=None):
    """Resizes a position embedding as timm does when a checkpoint is loaded
    at another size (`timm.layers.resample_abs_pos_embed`, called by
    `checkpoint_filter_fn`): bicubic with `antialias=True` and
    `align_corners=False`; the prefix (class) tokens are kept.

    Arguments and result as `resize_position_embedding`.

    Example:

    >>> pe = np.zeros((1, 1 + 14 * 14, 8), "float32")
    >>> resample_abs_pos_embed_timm(pe, (24, 24)).shape
    (1, 577, 8)
    """
    return _resize_grid(posemb, new_grid, num_prefix_tokens, old_grid,
                        _antialiased_bicubic_matrix)


def interpolate_pos_encoding_transformers(posemb, new_grid, num_prefix_tokens=1,
                                          old_grid=None):
    """Resizes a position embedding as Hugging Face transformers' ViT does
    with `interpolate_pos_encoding=True` (`ViTEmbeddings.
    interpolate_pos_encoding`): bicubic, `align_corners=False`, no
    antialias, to the exact new grid; the class token is kept.

    Arguments and result as `resize_position_embedding`.

    Example:

    >>> pe = np.zeros((1, 1 + 14 * 14, 8), "float32")
    >>> interpolate_pos_encoding_transformers(pe, (24, 24)).shape
    (1, 577, 8)
    """
    return _resize_grid(posemb, new_grid, num_prefix_tokens, old_grid,
                        _bicubic_matrix)


def _dino_matrix(old, new):
    """DINO's `scale_factor=(new + 0.1) / old`: PyTorch samples at its inverse."""
    return _bicubic_matrix(old, new, scale=old / (new + 0.1))


def interpolate_pos_encoding_dino(posemb, new_grid, num_prefix_tokens=1, old_grid=None):
    """Resizes a position embedding as DINO's ViT does at another input size
    (facebookresearch/dino `VisionTransformer.interpolate_pos_encoding`):
    bicubic, `align_corners=False`, no antialias, called with
    `scale_factor=((h + 0.1) / old, (w + 0.1) / old)` for a new grid of h
    rows and w columns (the 0.1 guards the output size against rounding).
    PyTorch then samples at the inverse of that factor, source coordinate
    `(i + 0.5) * old / (new + 0.1) - 0.5`, not `old / new`: the grid is
    stretched a little less than the other libraries stretch it. The class
    token is kept; at the stored grid the embedding is returned unchanged,
    as DINO does.

    Arguments and result as `resize_position_embedding`.

    Example:

    >>> pe = np.zeros((1, 1 + 14 * 14, 8), "float32")
    >>> interpolate_pos_encoding_dino(pe, (28, 20)).shape
    (1, 561, 8)
    """
    return _resize_grid(posemb, new_grid, num_prefix_tokens, old_grid, _dino_matrix)


POSEMB_RESIZES = {
    "official": resize_position_embedding,
    "timm": resample_abs_pos_embed_timm,
    "transformers": interpolate_pos_encoding_transformers,
    "dino": interpolate_pos_encoding_dino,
    # transformers' Dinov2WithRegisters: `F.interpolate(size=..., mode="bicubic",
    # antialias=True, align_corners=False)` in float32, the call timm makes
    "transformers-antialias": resample_abs_pos_embed_timm,
}
