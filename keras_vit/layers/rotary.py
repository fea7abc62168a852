"""Rotary position embeddings (RoPE) over the patch grid, the two 2-D
variants the families keras_vit loads use: DINOv3's and EVA-02's.

A rotary embedding rotates each pair of query and key channels by an angle
that grows with the token's position, so the attention logit of two tokens
depends on their offset. Over an image each head's channels are split in
two: the first half rotates with the row coordinate, the second with the
column coordinate (timm's `RotaryEmbeddingCat` / `RotaryEmbeddingDinoV3`,
"axial" RoPE).

The angles are computed from the grid of the call, in float32, so one
model takes any image size (`input_shape=(None, None, 3)`) and an export
keeps that (no table is stored: the layer has no weights).

- `"dinov3"` (DINOv3, timm `rope_type="dinov3"`, transformers
  `DINOv3ViTRopePositionEmbedding`): coordinates are the patch centres
  normalised to [-1, 1] on each axis, `2 (i + 0.5) / n - 1`; periods
  `temperature ** (2 k / (head_dim / 2))`, `k < head_dim / 4`
  (temperature 100); angle `2 pi coordinate / period`; the "half" layout:
  channel `c` pairs with channel `c + head_dim / 2`.
- `"eva"` (EVA-02, timm `rope_type="cat"`, `in_pixels=False`): coordinates
  are patch indices, rescaled to `ref_grid` (the pretraining grid) when it
  is given, `i * ref / n`; frequencies `temperature ** (-k / (head_dim /
  4))` (temperature 10000); angle `coordinate * frequency`; the
  interleaved layout: channel `2c` pairs with `2c + 1`.
"""

import math

import keras
from keras import ops

from keras_vit import _checks

ROPE_VARIANTS = ("dinov3", "eva")
_DEFAULTS = {"dinov3": {"temperature": 100.0},
             "eva": {"temperature": 10000.0, "ref_grid": None}}


def check_rope(rope):
    """`rope`: None (no RoPE), a variant name of `ROPE_VARIANTS`, or a dict
    `{"variant": ..., "temperature": ..., "ref_grid": (h, w)}` (`ref_grid`:
    EVA only). Returns None or the complete dict.

    >>> check_rope("dinov3")
    {'variant': 'dinov3', 'temperature': 100.0}
    >>> check_rope({"variant": "eva", "ref_grid": [16, 16]})
    {'variant': 'eva', 'temperature': 10000.0, 'ref_grid': (16, 16)}
    """
    if rope is None:
        return None
    given = rope
    if isinstance(rope, str):
        rope = {"variant": rope}
    if not isinstance(rope, dict) or rope.get("variant") not in ROPE_VARIANTS:
        rope = given
        raise ValueError(
            f"Unknown rope={rope!r}; allowed: None, one of {ROPE_VARIANTS} or a dict "
            "{'variant': ..., 'temperature': ..., 'ref_grid': (h, w)} ('ref_grid': 'eva' only).")
    variant = rope["variant"]
    unknown = sorted(set(rope) - {"variant"} - set(_DEFAULTS[variant]))
    if unknown:
        raise ValueError(
            f"rope={rope!r}: {unknown} is not a parameter of the {variant!r} RoPE; allowed: "
            f"{sorted(_DEFAULTS[variant])}.")
    out = {"variant": variant, **_DEFAULTS[variant]}
    out["temperature"] = _checks.positive_float(
        rope.get("temperature", out["temperature"]), "rope temperature")
    if variant == "eva" and rope.get("ref_grid") is not None:
        out["ref_grid"] = _checks.positive_int_pair(rope["ref_grid"], "rope ref_grid")
    return out


def _axis_coordinates(n, variant, ref):
    """float32 coordinates of `n` positions along one axis."""
    index = ops.cast(ops.arange(n), "float32")
    n = ops.cast(n, "float32")
    if variant == "dinov3":
        return 2.0 * ((index + 0.5) / n) - 1.0
    if ref is not None:
        return index / n * float(ref)
    return index


def rotary_angles(grid_h, grid_w, head_dim, rope):
    """The `(grid_h * grid_w, head_dim / 2)` float32 rotation angles of a
    patch grid (row-major), the row coordinate's `head_dim / 4` first.
    `grid_h`, `grid_w`: ints or scalar tensors; `rope`: `check_rope`'s dict.

    >>> tuple(rotary_angles(2, 3, 8, check_rope("dinov3")).shape)
    (6, 4)
    """
    quarter = head_dim // 4
    k = ops.cast(ops.arange(quarter), "float32")
    temperature = rope["temperature"]
    if rope["variant"] == "dinov3":
        periods = ops.power(temperature, 2.0 * k / float(head_dim // 2))
        scale = 2.0 * math.pi / periods
    else:
        scale = 1.0 / ops.power(temperature, k / float(quarter))
    ref = rope.get("ref_grid") or (None, None)
    rows = _axis_coordinates(grid_h, rope["variant"], ref[0])
    cols = _axis_coordinates(grid_w, rope["variant"], ref[1])
    if rope["variant"] == "dinov3":
        # DINOv3 divides by the period: the same float32 steps as its code
        row_angles = 2.0 * math.pi * rows[:, None] / periods[None, :]
        col_angles = 2.0 * math.pi * cols[:, None] / periods[None, :]
    else:
        row_angles = rows[:, None] * scale[None, :]
        col_angles = cols[:, None] * scale[None, :]
    n_rows, n_cols = ops.shape(row_angles)[0], ops.shape(col_angles)[0]
    row_angles = ops.broadcast_to(row_angles[:, None, :], (n_rows, n_cols, quarter))
    col_angles = ops.broadcast_to(col_angles[None, :, :], (n_rows, n_cols, quarter))
    return ops.reshape(ops.concatenate([row_angles, col_angles], axis=-1),
                       (-1, 2 * quarter))


def _layout(values, variant):
    """`(tokens, head_dim / 2)` -> `(tokens, head_dim)`: `[v, v]` for the
    half layout (DINOv3), `[v0, v0, v1, v1, ...]` interleaved (EVA)."""
    if variant == "dinov3":
        return ops.concatenate([values, values], axis=-1)
    return ops.reshape(ops.repeat(values[:, :, None], 2, axis=-1), (ops.shape(values)[0], -1))


def _rotated(x, variant):
    """The partner of each channel with its sign: `[-x2, x1]` (half) or
    `[-x1, x0, -x3, x2, ...]` (interleaved)."""
    if variant == "dinov3":
        first, second = ops.split(x, 2, axis=-1)
        return ops.concatenate([-second, first], axis=-1)
    shape = ops.shape(x)
    pairs = ops.reshape(x, (*shape[:-1], shape[-1] // 2, 2))
    even, odd = ops.unstack(pairs, 2, axis=-1)
    return ops.reshape(ops.stack([-odd, even], axis=-1), shape)


def apply_rope(x, rope, variant):
    """Rotates `x` `(..., tokens, head_dim)` by `rope`, a `RotaryEmbedding`
    output `(tokens, 2 * head_dim)` (sine, then cosine): `x cos + rotated(x)
    sin`, computed in float32 and returned in `x`'s dtype (timm's
    `apply_rot_embed_cat`). The prefix tokens' rows are sine 0, cosine 1:
    they come back unchanged."""
    dtype = x.dtype
    x32 = ops.cast(x, "float32")
    sin, cos = ops.split(rope, 2, axis=-1)
    return ops.cast(x32 * cos + _rotated(x32, variant) * sin, dtype)


@keras.saving.register_keras_serializable(package="keras_vit")
class RotaryEmbedding(keras.layers.Layer):
    """The sine and cosine of a 2-D rotary position embedding for the grid of
    its input, which `TransformerBlock(rope=...)` rotates queries and keys
    by. No weights; always float32.

    Input: the patch grid `(batch, grid_h, grid_w, channels)` (`Patches`'
    output; only its shape is read). Output: `(num_prefix_tokens + grid_h *
    grid_w, 2 * head_dim)`, the sines then the cosines of each token's
    angles in the layout of `variant`; the `num_prefix_tokens` first rows
    (class and register tokens, which RoPE leaves alone) are sine 0 and
    cosine 1.

    Args:
        head_dim: the attention heads' width (a multiple of 4).
        rope: the variant, `check_rope`'s input (`"dinov3"`, `"eva"` or a
            dict with its `temperature` and EVA's `ref_grid`).
        num_prefix_tokens: tokens before the patch tokens.

    Example:

    >>> layer = RotaryEmbedding(head_dim=8, rope="dinov3", num_prefix_tokens=1)
    >>> tuple(layer(keras.ops.zeros((2, 3, 4, 5))).shape)
    (13, 16)
    """

    def __init__(self, head_dim, rope, num_prefix_tokens=0, **kwargs):
        kwargs["dtype"] = "float32"
        super().__init__(**kwargs)
        self.head_dim = _checks.positive_int(head_dim, "head_dim")
        if self.head_dim % 4:
            raise ValueError(
                f"A 2-D rotary embedding needs a head width divisible by 4, got {head_dim}.")
        self.rope = check_rope(rope)
        if self.rope is None:
            raise ValueError("RotaryEmbedding needs a rope variant, got None.")
        self.num_prefix_tokens = _checks.non_negative_int(num_prefix_tokens,
                                                          "num_prefix_tokens")

    @property
    def variant(self):
        return self.rope["variant"]

    def call(self, inputs):
        """`(tokens, 2 * head_dim)` sines and cosines for `inputs`' grid."""
        shape = ops.shape(inputs)
        angles = _layout(rotary_angles(shape[1], shape[2], self.head_dim, self.rope),
                         self.variant)
        sin, cos = ops.sin(angles), ops.cos(angles)
        if self.num_prefix_tokens:
            sin = ops.pad(sin, ((self.num_prefix_tokens, 0), (0, 0)))
            cos = ops.pad(cos, ((self.num_prefix_tokens, 0), (0, 0)), constant_values=1.0)
        return ops.concatenate([sin, cos], axis=-1)

    def compute_output_shape(self, input_shape):
        h, w = input_shape[1], input_shape[2]
        tokens = None if h is None or w is None else self.num_prefix_tokens + h * w
        return (tokens, 2 * self.head_dim)

    def get_config(self):
        config = super().get_config()
        config.update(head_dim=self.head_dim, rope=dict(self.rope),
                      num_prefix_tokens=self.num_prefix_tokens)
        config.pop("dtype", None)
        return config
