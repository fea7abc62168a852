"""PatchEncoder: linear patch projection, class token, learned position
embedding (ViT paper, Eq. 1); the prefix tokens of later families
(a distillation token, DeiT; register tokens, DINOv2-reg) and position
embeddings that leave them out (timm's `no_embed_class`)."""

import keras
from keras import ops

from keras_vit import _checks


def _linear_coordinates(old, new):
    """Source indices and weights of 1-D linear interpolation with aligned
    corners from `old` (a Python int) to `new` points (an int or a scalar
    tensor): output `i` reads input `i * (old - 1) / (new - 1)`, as
    `scipy.ndimage.zoom(order=1)` (a single output point reads input 0).

    The integer part comes from integer arithmetic, so for `new == old`
    every index is exactly `i` and every weight exactly 0 (XLA may divide
    floats through a reciprocal, which is not exact).
    """
    numerator = ops.arange(new, dtype="int32") * (old - 1)
    denominator = ops.maximum(ops.cast(new, "int32") - 1, 1)
    low = ops.minimum(ops.floor_divide(numerator, denominator), old - 1)
    remainder = numerator - low * denominator
    fraction = ops.cast(remainder, "float32") / ops.cast(denominator, "float32")
    high = ops.minimum(low + 1, old - 1)
    return low, high, fraction


def interpolate_position_embedding(posemb, new_grid, old_grid, num_prefix_tokens=1):
    """Resizes a `(1, prefix + old_h * old_w, D)` position embedding to
    `new_grid` inside the graph (keras.ops, any backend).

    The official algorithm, as `keras_vit.weights.resize_position_embedding`
    computes it in NumPy for loading: bilinear interpolation with aligned
    corners (`scipy.ndimage.zoom(order=1)`) of the patch grid, the prefix
    (class token) kept apart and unchanged. Computed in float32 with
    gathers and element-wise arithmetic only (no matmul, so no TF32 on
    GPUs); the same grid gives back the embedding exactly.

    Args:
        posemb: tensor `(1, num_prefix_tokens + old_h * old_w, D)`.
        new_grid: `(new_h, new_w)`: Python ints or scalar tensors (a size
            known only when the graph runs).
        old_grid: `(old_h, old_w)`, Python ints.
        num_prefix_tokens: leading tokens kept as they are.

    Returns:
        float32 tensor `(1, num_prefix_tokens + new_h * new_w, D)`.

    Example:

    >>> pe = keras.ops.zeros((1, 1 + 4 * 4, 8))
    >>> tuple(interpolate_position_embedding(pe, (6, 3), (4, 4)).shape)
    (1, 19, 8)
    """
    old_h, old_w = (int(v) for v in old_grid)
    new_h, new_w = new_grid
    posemb = ops.cast(posemb, "float32")
    width = posemb.shape[-1]
    prefix = posemb[:, :num_prefix_tokens]
    grid = ops.reshape(posemb[0, num_prefix_tokens:], (old_h, old_w, width))
    for axis, old, new in ((0, old_h, new_h), (1, old_w, new_w)):
        low, high, fraction = _linear_coordinates(old, new)
        fraction = ops.reshape(fraction, (-1, 1, 1) if axis == 0 else (1, -1, 1))
        grid = (ops.take(grid, low, axis=axis) * (1.0 - fraction)
                + ops.take(grid, high, axis=axis) * fraction)
    grid = ops.reshape(grid, (1, -1, width))
    return ops.concatenate([prefix, grid], axis=1) if num_prefix_tokens else grid


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEncoder(keras.layers.Layer):
    """Projects a grid of flattened patches to tokens and adds positions.

    `z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos` (ViT paper, Eq. 1).
    Input: `(batch, grid_h, grid_w, patch_dim)`, the output of `Patches`
    (or of the hybrid ResNet stem with 1x1 patches). Output:
    `(batch, num_prefix_tokens + grid_h * grid_w, hidden_size)`: the
    prefix tokens in timm's order (class, distillation, registers), then
    the patch tokens.

    Args:
        hidden_size: width `D` of the tokens.
        use_class_token: prepend the learned class token (classifier
            `"token"`); `False` for `"gap"` models.
        kernel_initializer, position_initializer: initializers of the
            projection and of the position embedding (official defaults:
            LeCun normal and normal(stddev=0.02); the class token starts at 0).
        grid_size: `(grid_h, grid_w)` of the stored position embedding;
            None: the input's grid when built. An input whose grid differs
            (or is unknown when built: a model with
            `input_shape=(None, None, 3)`) gets the stored embedding resized
            in the graph to its grid with the official algorithm
            (`interpolate_position_embedding`); the stored grid itself is
            used as it is.
        num_register_tokens: learned register tokens after the class
            (and distillation) token (Darcet et al., "Vision Transformers
            Need Registers"; DINOv2-reg, timm's `reg_tokens`).
        distillation_token: a learned distillation token after the class
            token (DeiT, Touvron et al. 2021).
        no_embed_class: True: the position embedding covers the patch grid
            only (`(1, grid_h * grid_w, D)`), added before the prefix tokens
            are prepended, which get none (timm's `no_embed_class`); False
            (official): it covers the prefix tokens too.
        use_bias: whether the patch projection has a bias (False: OpenAI
            CLIP's `conv1`).
        token_initializer: initializer of the distillation and register
            tokens (default normal(stddev=0.02)).
        use_position_embedding: False: no position embedding at all (the
            families whose blocks carry the positions: rotary embeddings,
            DINOv3 and EVA-02 without absolute ones; BEiT's relative
            position bias). Default True.

    Attributes:
        grid_size: `(grid_h, grid_w)` of the stored position embedding once
            built.
        num_prefix_tokens: class + distillation + register tokens.

    Example:

    >>> patches = keras.ops.ones((2, 4, 4, 48))
    >>> tuple(PatchEncoder(64)(patches).shape)
    (2, 17, 64)
    >>> tuple(PatchEncoder(64, grid_size=(2, 2))(patches).shape)  # 2x2 resized to 4x4
    (2, 17, 64)
    """

    def __init__(
        self,
        hidden_size,
        use_class_token=True,
        kernel_initializer="lecun_normal",
        position_initializer=None,
        grid_size=None,
        num_register_tokens=0,
        distillation_token=False,
        no_embed_class=False,
        use_bias=True,
        token_initializer=None,
        use_position_embedding=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.use_position_embedding = _checks.boolean(use_position_embedding,
                                                      "use_position_embedding")
        self.hidden_size = _checks.positive_int(hidden_size, "hidden_size")
        self.use_class_token = bool(use_class_token)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.position_initializer = keras.initializers.get(
            position_initializer
            or keras.initializers.RandomNormal(stddev=0.02)
        )
        self.grid_size = (None if grid_size is None
                          else _checks.positive_int_pair(grid_size, "grid_size"))
        self.num_register_tokens = _checks.non_negative_int(
            num_register_tokens, "num_register_tokens")
        self.distillation_token = bool(distillation_token)
        self.no_embed_class = bool(no_embed_class)
        self.use_bias = bool(use_bias)
        # Made when a token is built, not here: an unseeded initializer draws
        # its seed from Python's `random`, which would move every later draw
        # of a seeded run (and so today's models' initial weights).
        self.token_initializer = (keras.initializers.get(token_initializer)
                                  if token_initializer is not None else None)

    @property
    def num_prefix_tokens(self):
        """The tokens before the patches: class + distillation + register
        tokens."""
        return (int(self.use_class_token) + int(self.distillation_token)
                + self.num_register_tokens)

    @property
    def num_embedded_prefix_tokens(self):
        """Prefix tokens the position embedding covers (0 with
        `no_embed_class`)."""
        return 0 if self.no_embed_class else self.num_prefix_tokens

    def build(self, input_shape):
        """Creates the projection, the prefix tokens and the position embedding
        for a `(batch, grid_h, grid_w, patch_dim)` patch grid (its grid fixes
        `grid_size` when not given); a ValueError for another rank or an
        unknown `patch_dim`."""
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                "PatchEncoder expects a patch grid of shape (batch, grid_h, "
                f"grid_w, patch_dim) with a static patch_dim, got "
                f"{tuple(input_shape)}."
            )
        _, gh, gw, patch_dim = input_shape
        if self.grid_size is None:
            if gh is None or gw is None:
                raise ValueError(
                    "PatchEncoder got a patch grid of unknown size "
                    f"{tuple(input_shape)}; pass grid_size=(grid_h, grid_w), "
                    "the grid of the stored position embedding."
                )
            self.grid_size = (int(gh), int(gw))
        gh, gw = self.grid_size
        self.kernel = self.add_weight(
            name="kernel",
            shape=(patch_dim, self.hidden_size),
            initializer=self.kernel_initializer,
        )
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.hidden_size,), initializer="zeros"
            )
        if self.use_class_token:
            self.class_token = self.add_weight(
                name="class_token",
                shape=(1, 1, self.hidden_size),
                initializer="zeros",
            )
        if self.distillation_token:
            self.dist_token = self.add_weight(
                name="distillation_token",
                shape=(1, 1, self.hidden_size),
                initializer=self._token_initializer(),
            )
        if self.num_register_tokens:
            self.register_tokens = self.add_weight(
                name="register_tokens",
                shape=(1, self.num_register_tokens, self.hidden_size),
                initializer=self._token_initializer(),
            )
        self.position_embedding = None
        self.built = True
        if not self.use_position_embedding:
            return
        num_tokens = self.num_embedded_prefix_tokens + gh * gw
        # Not autocast: `call` reads it in its own dtype (float32 under a
        # mixed policy) so that a resize computes in float32, then casts.
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=(1, num_tokens, self.hidden_size),
            initializer=self.position_initializer,
            autocast=False,
        )
        self.built = True

    def call(self, inputs):
        """The token sequence `(batch, num_prefix_tokens + grid_h * grid_w,
        hidden_size)`: the projected patches plus the position embedding
        (interpolated to another grid than `grid_size`), after the prefix
        tokens."""
        gh, gw = inputs.shape[1], inputs.shape[2]
        patch_dim = inputs.shape[-1]
        if not self.use_position_embedding:
            x = ops.matmul(ops.reshape(inputs, (ops.shape(inputs)[0], -1, patch_dim)),
                           self.kernel)
            return self._prepend_prefix(x + self.bias if self.use_bias else x)
        if (gh, gw) == self.grid_size:
            x = ops.reshape(inputs, (-1, gh * gw, patch_dim))
            posemb = self.position_embedding
        else:
            shape = ops.shape(inputs)
            gh = shape[1] if gh is None else gh
            gw = shape[2] if gw is None else gw
            x = ops.reshape(inputs, (shape[0], -1, patch_dim))
            posemb = interpolate_position_embedding(
                self.position_embedding, (gh, gw), self.grid_size,
                self.num_embedded_prefix_tokens)
        x = ops.matmul(x, self.kernel)
        if self.use_bias:
            x = x + self.bias
        if self.no_embed_class:
            return self._prepend_prefix(x + ops.cast(posemb, x.dtype))
        return self._prepend_prefix(x) + ops.cast(posemb, x.dtype)

    def _token_initializer(self):
        """The distillation and register tokens' initializer (default
        normal(stddev=0.02))."""
        return self.token_initializer or keras.initializers.RandomNormal(stddev=0.02)

    def _prepend_prefix(self, x):
        """`[class; distillation; registers; x]`, those the layer has."""
        prefix = [token for token, kept in (
            ("class_token", self.use_class_token),
            ("dist_token", self.distillation_token),
            ("register_tokens", self.num_register_tokens)) if kept]
        if not prefix:
            return x
        batch = ops.shape(x)[0]
        tokens = []
        for attr in prefix:
            weight = getattr(self, attr)
            tokens.append(ops.broadcast_to(
                ops.cast(weight, x.dtype), (batch, weight.shape[1], self.hidden_size)))
        return ops.concatenate([*tokens, x], axis=1)

    def compute_output_shape(self, input_shape):
        """`(batch, num_prefix_tokens + grid_h * grid_w, hidden_size)`
        (None tokens for an unknown grid)."""
        _, gh, gw, _ = input_shape
        tokens = None if gh is None or gw is None else self.num_prefix_tokens + gh * gw
        return (input_shape[0], tokens, self.hidden_size)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_size": self.hidden_size,
                "use_class_token": self.use_class_token,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "position_initializer": keras.initializers.serialize(
                    self.position_initializer
                ),
                "grid_size": self.grid_size,
                "num_register_tokens": self.num_register_tokens,
                "distillation_token": self.distillation_token,
                "no_embed_class": self.no_embed_class,
                "use_bias": self.use_bias,
                "token_initializer": None if self.token_initializer is None
                else keras.initializers.serialize(self.token_initializer),
            }
        )
        if not self.use_position_embedding:  # saved only when off: today's configs unchanged
            config["use_position_embedding"] = False
        return config
