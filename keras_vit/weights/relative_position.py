"""BEiT's relative-position-bias tables, resized for another window as the
library that wrote them resizes them (NumPy only).

A BEiT attention layer holds a table of `(2h-1)(2w-1) + 3` rows by heads
for an `h x w` grid of patches: row `(dy + h - 1) * (2w - 1) + dx + w - 1`
is the bias of one patch attending to another `dy` rows and `dx` columns
away, then three rows for the class token: class to patch, patch to class,
class to class (the index into it: `keras_vit.layers.transformer.
relative_position_index`, as timm's `gen_relative_position_index` and
transformers' `BeitRelativePositionBias.generate_relative_position_index`).
At another input size the grid, and so the table, changes; the three class
rows are kept as they are.

- timm (`timm.layers.resize_rel_pos_bias_table`, called by
  `beit.checkpoint_filter_fn` when a checkpoint is loaded at another
  `img_size`, and by `Beit.set_input_size`): BEiT's own scheme. The old
  offsets are laid out on a geometric progression `0, 1, 1 + q, 1 + q +
  q^2, ...` (both signs) whose ratio q (bisection in [1.01, 1.5] to 1e-6)
  makes the old half-width reach the new one; each new integer offset is
  read off that uneven grid by linear interpolation (timm's
  `RegularGridInterpolator`, float32), values beyond its ends held at the
  end values. Rows and columns are done separately, so a non-square grid
  is fine. (timm's optional SciPy path, `TIMM_USE_SCIPY_INTERP=1`, is not
  reproduced: `scipy.interpolate.interp2d` raises since SciPy 1.14.)
- transformers (`BeitRelativePositionBias.forward`, at every call, for the
  grid of the pixels given): PyTorch's bilinear `F.interpolate` with
  `align_corners=False` from the stored table to the new one, no
  antialias. transformers reshapes the stored table as `(2w-1, 2h-1)`
  before it (width first); every released checkpoint is square, where the
  two orders agree, and the function here copies that order exactly (so a
  non-square table comes out as transformers computes it, even at its own
  grid, where timm leaves it alone).
"""

import numpy as np

NUM_CLASS_ROWS = 3  # class->patch, patch->class, class->class, after the offsets
METHODS = ("timm", "transformers")


def _grid(grid, name):
    """`(h, w)` of positive ints from a pair, or ValueError naming it."""
    try:
        h, w = (int(v) for v in grid)
        valid = h >= 1 and w >= 1 and (h, w) == tuple(grid)
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError(f"{name}={grid!r} is not a grid of patches; "
                         "expected (rows, columns), two positive integers.")
    return h, w


def table_rows(grid):
    """Rows of the relative-position-bias table of a `grid` of patches:
    `(2h-1)(2w-1)` offsets and the 3 class-token rows.

    >>> table_rows((14, 14))
    732
    """
    h, w = _grid(grid, "grid")
    return (2 * h - 1) * (2 * w - 1) + NUM_CLASS_ROWS


def relative_position_grid(rows):
    """`(g, g)`: the square grid of patches whose table has `rows` rows
    (`(2g-1)^2 + 3`), or None when no square grid has that many.

    >>> relative_position_grid(732), relative_position_grid(700)
    ((14, 14), None)
    """
    side = int(round(((max(int(rows) - NUM_CLASS_ROWS, 0)) ** 0.5 + 1) / 2))
    return (side, side) if side >= 1 and table_rows((side, side)) == rows else None


# --- timm: offsets on a geometric progression, linear interpolation -------------------

def _timm_offsets(src, dst):
    """timm's `_calc(src, dst)` (`layers/pos_embed_rel.py`): the positions of
    the `src` old offsets, spaced by powers of the ratio q found by
    bisection, as float32 (timm makes a float32 tensor of them)."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if 1 * (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return np.asarray([-d for d in reversed(dis)] + [0] + dis, np.float32)


def _timm_matrix(src, dst):
    """`(dst, src)` weights of timm's `RegularGridInterpolator` along one
    axis: the new offsets `-(dst//2) .. dst//2` read linearly off the
    positions of `_timm_offsets`, held at the ends."""
    points = _timm_offsets(src, dst)
    half = dst // 2.0
    targets = np.arange(-half, half + 0.1, 1.0, dtype=np.float32)
    right = np.minimum(np.searchsorted(points, targets, side="left"), src - 1)
    left = np.clip(right - 1, 0, src - 1)
    d_left = np.maximum(targets - points[left], 0).astype(np.float64)
    d_right = np.maximum(points[right] - targets, 0).astype(np.float64)
    both_zero = (d_left == 0) & (d_right == 0)
    d_left[both_zero] = d_right[both_zero] = 1.0
    matrix = np.zeros((dst, src))
    rows = np.arange(dst)
    np.add.at(matrix, (rows, left), d_right / (d_left + d_right))
    np.add.at(matrix, (rows, right), d_left / (d_left + d_right))
    return matrix


# --- transformers: PyTorch's bilinear resize --------------------------------------------

def _bilinear_matrix(old, new):
    """`(new, old)` matrix of PyTorch's `F.interpolate(mode="bilinear",
    align_corners=False)` along one axis: source `(i + 0.5) * old / new -
    0.5`, clamped at 0, its two neighbours weighted linearly."""
    src = np.maximum((np.arange(new) + 0.5) * (old / new) - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), old - 1)
    weight = np.clip(src - low, 0.0, 1.0)
    high = np.minimum(low + 1, old - 1)
    matrix = np.zeros((new, old))
    rows = np.arange(new)
    np.add.at(matrix, (rows, low), 1.0 - weight)
    np.add.at(matrix, (rows, high), weight)
    return matrix


def resize_relative_position_bias_table(table, old_grid, new_grid, method="timm"):
    """Resizes a BEiT relative-position-bias table from a grid of
    `old_grid` patches to `new_grid`, as `method`'s library does; the 3
    class-token rows (the last) are kept.

    Args:
        table: array `(table_rows(old_grid), heads)`.
        old_grid: `(h, w)` of the table; None for the square grid its rows
            imply (every released checkpoint is square).
        new_grid: `(h, w)`, need not be square.
        method: "timm" (its checkpoint filter and `set_input_size`) or
            "transformers" (its forward at another size).

    Returns:
        array `(table_rows(new_grid), heads)` in `table`'s float dtype; the
        table itself when the grid does not change (for transformers, when
        it is also square: its width-first reshape resamples a non-square
        table even at its own grid).

    Example:

    >>> table = np.arange(2 * 12, dtype="float32").reshape(12, 2)  # a 2x2 grid, 2 heads
    >>> resize_relative_position_bias_table(table, (2, 2), (3, 3)).shape
    (28, 2)
    >>> resize_relative_position_bias_table(table, (2, 2), (3, 3), method="transformers")[-3:]
    array([[18., 19.],
           [20., 21.],
           [22., 23.]], dtype=float32)
    """
    if method not in METHODS:
        raise ValueError(f"Unknown method={method!r}; allowed: {METHODS}.")
    table = np.asarray(table)
    if table.ndim != 2 or not np.issubdtype(table.dtype, np.floating):
        raise ValueError(f"Expected a float table of shape (rows, heads), got "
                         f"{table.dtype} {table.shape}.")
    if old_grid is None:
        old_grid = relative_position_grid(table.shape[0])
        if old_grid is None:
            raise ValueError(f"A table of {table.shape[0]} rows is no square grid's "
                             "(2g-1)^2 + 3 rows; pass old_grid.")
    old_h, old_w = _grid(old_grid, "old_grid")
    new_h, new_w = _grid(new_grid, "new_grid")
    if table.shape[0] != table_rows((old_h, old_w)):
        raise ValueError(f"old_grid {(old_h, old_w)} has a table of "
                         f"{table_rows((old_h, old_w))} rows, not {table.shape[0]}.")
    if (old_h, old_w) == (new_h, new_w) and (method == "timm" or old_h == old_w):
        return table  # (transformers resamples a non-square table even at its own grid)
    heads = table.shape[1]
    offsets = table[:-NUM_CLASS_ROWS].astype(np.float64)
    src_h, src_w, dst_h, dst_w = 2 * old_h - 1, 2 * old_w - 1, 2 * new_h - 1, 2 * new_w - 1
    if method == "timm":
        rows, cols = _timm_matrix(src_h, dst_h), _timm_matrix(src_w, dst_w)
        grid = offsets.reshape(src_h, src_w, heads)
    else:  # transformers reshapes as (2w-1, 2h-1): modeling_beit.py, BeitRelativePositionBias
        rows, cols = _bilinear_matrix(src_w, dst_h), _bilinear_matrix(src_h, dst_w)
        grid = offsets.reshape(src_w, src_h, heads)
    resized = np.einsum("ia,jb,abh->ijh", rows, cols, grid).reshape(dst_h * dst_w, heads)
    return np.concatenate([resized.astype(table.dtype), table[-NUM_CLASS_ROWS:]], axis=0)
