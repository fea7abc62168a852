"""The numbers behind the ViT paper's pictures (Fig. 6 and 7), for any
keras_vit ViT: pretrained, fine-tuned with a new head, at another
resolution, or nested inside a user's functional model. NumPy results; no
plotting library needed."""

import keras
import numpy as np

from keras_vit.layers import PatchEncoder, Patches, ResNetRoot
from keras_vit.layers.blocks import encoder_blocks
from keras_vit.layers.rotary import RotaryEmbedding


def find_vit(model):
    """The keras_vit ViT inside `model` (itself or nested, depth first):
    the functional model that holds the `PatchEncoder`."""
    if not isinstance(model, keras.Model):
        raise TypeError(f"Expected a keras.Model, got {type(model).__name__}.")
    if any(isinstance(layer, PatchEncoder) for layer in model.layers):
        return model
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            try:
                return find_vit(layer)
            except ValueError:
                continue
    raise ValueError(
        f"{model.name!r} holds no keras_vit ViT (no PatchEncoder layer). MLP-Mixers "
        "have no attention or position embedding to inspect.")


def check_finite_outputs(outputs, what, result):
    """`outputs` (an array) when every value is finite, else the one
    ValueError of `keras-vit predict`, `evaluate` and `explain` (and their
    functions): the model's outputs for `what` (e.g. `'cat.png'`) are NaN or
    inf, so no `result` (`'probabilities'`, `'accuracy'`, ...) is given.

    >>> check_finite_outputs(np.array([[1.0, np.nan]]), "'x.png'", "probabilities")
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: The model's outputs for 'x.png' are not finite (NaN or inf): ... probabilities; ...
    """
    values = np.asarray(outputs)
    if values.dtype.kind in "fc" and not np.isfinite(values).all():
        raise ValueError(
            f"The model's outputs for {what} are not finite (NaN or inf): its weights hold a "
            f"non-finite value or its arithmetic overflows, so it gives no {result}; check "
            "the weights it was built from.")
    return outputs


def input_size(model, image_size, flag=None):
    """`(height, width)` to resize images to for `model`: its input size
    (`image_size`, when given, must be it); for a model that takes any size,
    `image_size`, else the size its position embedding is stored at. The one
    check of `keras-vit predict`, `explain` and `evaluate` (`flag`: the
    command's flag, `"--image-size"`; None: the argument `image_size`).

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3))
    >>> input_size(model, 64, "--image-size")
    Traceback (most recent call last):
    ValueError: --image-size 64: the model takes 32x32 images; leave --image-size out.
    """
    shape = tuple(model.input_shape[1:3])
    named = (f"{flag} {image_size}" if flag
             else f"image_size={image_size} (keras-vit: --image-size)")
    if None not in shape:
        if image_size and shape != (image_size, image_size):
            raise ValueError(f"{named}: the model takes {shape[0]}x{shape[1]} images; leave "
                             f"{flag or 'it'} out.")
        return shape
    if image_size:
        return (image_size, image_size)
    try:
        return stored_image_size(model)
    except (ValueError, StopIteration):
        raise ValueError(f"The model takes any image size ({shape}); pass "
                         f"{flag or 'image_size (keras-vit: --image-size)'}.") from None


def stored_image_size(model):
    """`(height, width)` in pixels of the grid `model`'s position embedding
    is stored at: the input size of a fixed-size ViT, and the size a model
    built with `input_shape=(None, None, 3)` computes without resizing (the
    checkpoint's, else 224).

    >>> import keras_vit
    >>> stored_image_size(keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     input_shape=(None, None, 3)))
    (224, 224)
    """
    vit = find_vit(model)
    shape = tuple(vit.input_shape[1:3])
    if None not in shape:
        return shape
    layers = vit.layers
    encoder = next(layer for layer in layers if isinstance(layer, PatchEncoder))
    patch = next(layer for layer in layers if isinstance(layer, Patches)).patch_size
    stride = 1
    if any(isinstance(layer, ResNetRoot) for layer in layers):
        # The root halves twice (conv, pool); every stage after the first once.
        stages = {layer.name.split("_")[0] for layer in layers
                  if layer.name.startswith("block") and "_unit" in layer.name}
        stride = 4 * 2 ** (len(stages) - 1)
    return tuple(int(g * p * stride) for g, p in zip(encoder.grid_size, patch, strict=True))


class _Parts:
    def __init__(self, model):
        self.vit = find_vit(model)
        layers = self.vit.layers
        self.encoder = next(layer for layer in layers if isinstance(layer, PatchEncoder))
        self.blocks = encoder_blocks(self.vit)  # a ViT: TransformerBlocks
        self.patches = next((layer for layer in layers if isinstance(layer, Patches)), None)
        # the rotary embedding the blocks of a RoPE model are called with
        self.rope = next((layer for layer in layers if isinstance(layer, RotaryEmbedding)),
                         None)
        # A model that takes any size is inspected at its stored grid.
        self.image_size = stored_image_size(self.vit)
        self.grid = tuple(self.encoder.grid_size)
        self.prefix = self.encoder.num_prefix_tokens  # class, distillation, registers
        self.class_token = self.encoder.use_class_token
        # Pixels per token: the patch size, times the ResNet stride in hybrids.
        self.pixels = (self.image_size[0] / self.grid[0], self.image_size[1] / self.grid[1])


def _run(probe, images, batch_size):
    """Runs a multi-output probe in batches; a list of NumPy arrays."""
    chunks = []
    for i in range(0, len(images), batch_size):
        out = probe(images[i:i + batch_size], training=False)
        out = out if isinstance(out, (list, tuple)) else [out]
        chunks.append([keras.ops.convert_to_numpy(o) for o in out])
    return [np.concatenate(parts) for parts in zip(*chunks, strict=True)]


def _images(images, parts):
    array = np.asarray(images, dtype="float32")
    if array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or tuple(array.shape[1:3]) != parts.image_size:
        raise ValueError(
            f"images must be (N, {parts.image_size[0]}, {parts.image_size[1]}, C) for "
            f"{parts.vit.name!r}; got shape {array.shape}.")
    return array


class _AttentionOf(keras.layers.Layer):
    """A block's attention probabilities as a layer output (a functional
    graph keeps only the first output of a re-called block)."""

    def __init__(self, block):
        super().__init__(name=f"{block.name}_attention")
        self.block = block

    def call(self, x, rope=None):
        return self.block(x, rope=rope, training=False, return_attention_scores=True)[1]


def attention_weights(model, images, batch_size=16):
    """Attention probabilities of every block: a list over layers of
    arrays `(N, heads, tokens, tokens)` (query, key), inference mode."""
    parts = _Parts(model)
    images = _images(images, parts)
    rope = None if parts.rope is None else parts.rope.output
    probe = keras.Model(parts.vit.input, [
        # (a RoPE block's inputs are its tokens and the rotary embedding)
        _AttentionOf(block)(keras.tree.flatten(block.input)[0],
                            rope=rope if block.rope else None)
        for block in parts.blocks])
    return [a.astype("float32") for a in _run(probe, images, batch_size)]


def rollout(attentions, num_prefix_tokens, grid, token=None, class_token=None):
    """Attention rollout (Abnar & Zuidema 2020) from attention arrays.

    Heads are averaged, the identity is added (residual), rows are
    renormalised and the layers multiplied, first layer rightmost. The map
    is the rolled-out attention of `token` (an index into the whole
    sequence) to every patch: the columns of the patch tokens only, the
    `num_prefix_tokens` before them (class, distillation and register
    tokens, in that order) left out. `token=None` takes the class token's
    row (index 0) when the model has one, else the mean of the patch
    tokens' rows (what `classifier="gap"` pools; for `classifier="map"`,
    SigLIP's, the attention-pooling head's own attention is not in the
    rollout). `class_token`: whether the sequence starts with a class
    token; None: when it has prefix tokens (a model with register or
    distillation tokens but no class token needs `class_token=False`).
    Returns `(N, grid_h, grid_w)`.

    One image, one head, a prefix token and 2 patches; the prefix token
    attends to the second patch, each patch to itself:

    >>> a = np.array([[[[0, 0, 1], [0, 1, 0], [0, 0, 1]]]], "float32")
    >>> rollout([a], 1, (1, 2))                     # a class token: its row
    array([[[0. , 0.5]]], dtype=float32)
    >>> rollout([a], 1, (1, 2), class_token=False)  # a register: the patches' rows
    array([[[0.5, 0.5]]], dtype=float32)
    """
    tokens = attentions[0].shape[-1]
    result = np.broadcast_to(np.eye(tokens, dtype="float64"),
                             (attentions[0].shape[0], tokens, tokens))
    for attention in attentions:
        a = attention.astype("float64").mean(axis=1) + np.eye(tokens)
        a /= a.sum(axis=-1, keepdims=True)
        result = a @ result
    return _patch_map(result, num_prefix_tokens, grid, token, class_token)


def _patch_map(result, num_prefix_tokens, grid, token=None, class_token=None):
    """`(N, grid_h, grid_w)`: the row of `token` (None: the class token's,
    else the patch rows' mean; see `rollout`) of the rolled-out `(N,
    tokens, tokens)` matrices, at the patch columns."""
    tokens = result.shape[-1]
    if class_token is None:
        class_token = num_prefix_tokens > 0
    if token is None:
        rows = result[:, 0] if class_token else result[:, num_prefix_tokens:].mean(axis=1)
    else:
        if not 0 <= token < tokens:
            raise ValueError(f"token={token} is outside the {tokens} tokens.")
        rows = result[:, token]
    return rows[:, num_prefix_tokens:].reshape(-1, *grid).astype("float32")


def gradient_rollout(attentions, gradients, num_prefix_tokens, grid, class_token=None):
    """The class-specific relevance of Chefer, Gur and Wolf (ICCV 2021,
    "Generic Attention-model Explainability for Interpreting Bi-Modal and
    Encoder-Decoder Transformers", Eq. 5-6; their ViT rule) from each
    block's attention probabilities and the gradient of one class's output
    with respect to them: per block `A_bar = mean over heads of max(grad *
    A, 0)`, then `R = I` and `R = R + A_bar @ R` block by block, first
    block first. The map is the class token's row (no class token: the
    patch rows' mean, as `rollout`), at the patch columns. Returns `(N,
    grid_h, grid_w)`; `keras_vit.inspect.class_relevance` computes it for
    a model.

    One image, one head, a class token and 2 patches, where only the
    class token's attention to the second patch raised the class:

    >>> a = np.array([[[[0, 0.5, 0.5], [0, 1, 0], [0, 0, 1]]]], "float32")
    >>> g = np.array([[[[0, -1, 2], [0, 0, 0], [0, 0, 0]]]], "float32")
    >>> gradient_rollout([a], [g], 1, (1, 2))
    array([[[0., 1.]]], dtype=float32)
    """
    tokens = attentions[0].shape[-1]
    result = np.broadcast_to(np.eye(tokens, dtype="float64"),
                             (attentions[0].shape[0], tokens, tokens))
    for attention, gradient in zip(attentions, gradients, strict=True):
        weighted = np.maximum(gradient.astype("float64") * attention, 0).mean(axis=1)
        result = result + weighted @ result
    return _patch_map(result, num_prefix_tokens, grid, class_token=class_token)


def attention_rollout(model, images, token=None, upsample=True):
    """Attention-rollout maps of `images` (ViT paper Fig. 6).

    Returns `(N, H, W)` maps at the image size (bilinear upsampling of the
    patch grid), or `(N, grid_h, grid_w)` with `upsample=False`. See
    `rollout` for `token`.

    Example:

    >>> import numpy as np, keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> images = np.zeros((2, 32, 32, 3), "uint8")
    >>> attention_rollout(model, images).shape
    (2, 32, 32)
    >>> attention_rollout(model, images, upsample=False).shape
    (2, 4, 4)
    """
    parts = _Parts(model)
    grid_maps = rollout(attention_weights(model, images), parts.prefix, parts.grid, token,
                        class_token=parts.class_token)
    return upsample_maps(grid_maps, parts.image_size) if upsample else grid_maps


def upsample_maps(grid_maps, image_size):
    """`(N, grid_h, grid_w)` maps to `(N, H, W)`, bilinear."""
    resized = keras.ops.image.resize(grid_maps[..., None], image_size,
                                     interpolation="bilinear", data_format="channels_last")
    return keras.ops.convert_to_numpy(resized)[..., 0]


def patch_centres(grid, pixels):
    """`(grid_h * grid_w, 2)` centres of the patches in pixels (row, col)."""
    rows, cols = np.meshgrid(np.arange(grid[0]), np.arange(grid[1]), indexing="ij")
    return np.stack([(rows.ravel() + 0.5) * pixels[0], (cols.ravel() + 0.5) * pixels[1]], -1)


def mean_distance(attentions, num_prefix_tokens, grid, pixels):
    """Mean attention distance `(layers, heads)` in pixels from attention
    arrays: patch-to-patch attention (prefix tokens dropped, rows
    renormalised over the patches) weights the distance between query and
    key patch centres; averaged over queries and images."""
    centres = patch_centres(grid, pixels)
    distances = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
    result = []
    for attention in attentions:
        a = attention[:, :, num_prefix_tokens:, num_prefix_tokens:].astype("float64")
        a = a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-30)
        result.append((a * distances).sum(-1).mean(axis=(0, 2)))
    return np.stack(result).astype("float32")


def attention_distance(model, images):
    """Mean attention distance in pixels per (layer, head), as in the ViT
    paper's Fig. 7 (right). Returns `(layers, heads)`."""
    parts = _Parts(model)
    return mean_distance(attention_weights(model, images), parts.prefix, parts.grid,
                         parts.pixels)


def position_embedding_similarity(model):
    """Cosine similarity of every patch's position embedding with every
    other one (ViT paper Fig. 7, centre): `(grid_h, grid_w, grid_h,
    grid_w)`; `[i, j]` is the map of patch (i, j). A ValueError for a model
    without a position embedding (`position_embedding=False`: RoPE or
    BEiT's relative position bias place its tokens)."""
    parts = _Parts(model)
    if parts.encoder.position_embedding is None:
        raise ValueError(
            f"{parts.vit.name!r} has no position embedding (built with "
            "position_embedding=False: rotary embeddings or a relative position bias place "
            "its tokens), so there is no position-embedding similarity to draw.")
    embedding = keras.ops.convert_to_numpy(parts.encoder.position_embedding)[0]
    # the patch rows: with no_embed_class the embedding has no prefix rows
    patches = embedding[parts.encoder.num_embedded_prefix_tokens:].astype("float64")
    unit = patches / np.maximum(np.linalg.norm(patches, axis=-1, keepdims=True), 1e-12)
    similarity = unit @ unit.T
    return similarity.reshape(*parts.grid, *parts.grid).astype("float32")


def principal_filters(kernel, patch_size, channels, n):
    """Top `n` principal components of linear-embedding filters.

    `kernel`: `(patch_h * patch_w * channels, D)`, one filter per column.
    Returns `(components (n, patch_h, patch_w, channels), explained
    variance ratios (n,))`; components are unit vectors (sign arbitrary)."""
    filters = kernel.T.astype("float64")           # (D, P)
    filters = filters - filters.mean(axis=0)
    _, singular, vt = np.linalg.svd(filters, full_matrices=False)
    n = min(n, vt.shape[0])
    variance = singular ** 2
    ratios = variance[:n] / max(variance.sum(), 1e-30)
    return (vt[:n].reshape(n, *patch_size, channels).astype("float32"),
            ratios.astype("float32"))


def embedding_filters(model, n=28):
    """The top `n` principal components of the patch-embedding filters
    (ViT paper Fig. 7, left) as `(n, patch_h, patch_w, 3)` arrays, and
    their explained-variance ratios. Hybrids embed ResNet features, not
    pixels: a ValueError says so."""
    parts = _Parts(model)
    if parts.patches is None or any(isinstance(layer, ResNetRoot)
                                    for layer in parts.vit.layers):
        raise ValueError(f"{parts.vit.name!r} is a hybrid: its embedding filters act on "
                         "ResNet features, not on pixels.")
    kernel = keras.ops.convert_to_numpy(parts.encoder.kernel)
    channels = kernel.shape[0] // (parts.patches.patch_size[0] * parts.patches.patch_size[1])
    return principal_filters(kernel, parts.patches.patch_size, channels, n)


def intermediate_features(model, images, layers=None, batch_size=16):
    """Token features after the given blocks: `{block name: (N, tokens, D)}`.

    `layers`: block indices (negative counts from the end) or names;
    default: every block."""
    parts = _Parts(model)
    images = _images(images, parts)
    names = [block.name for block in parts.blocks]
    if layers is None:
        chosen = parts.blocks
    else:
        chosen = []
        for layer in layers:
            if isinstance(layer, str):
                if layer not in names:
                    raise ValueError(f"No block {layer!r}; blocks: {names}.")
                chosen.append(parts.blocks[names.index(layer)])
            elif isinstance(layer, int) and -len(names) <= layer < len(names):
                chosen.append(parts.blocks[layer])
            else:
                raise ValueError(f"Block {layer!r} is out of range for {len(names)} blocks.")
    probe = keras.Model(parts.vit.input, [block.output for block in chosen])
    return dict(zip([block.name for block in chosen], _run(probe, images, batch_size), strict=True))
