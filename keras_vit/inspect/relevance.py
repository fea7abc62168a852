"""`class_relevance`: where in an image a ViT finds one class, the
gradient-weighted attention rollout of Chefer, Gur and Wolf (ICCV 2021;
`analysis.gradient_rollout`). Attention rollout alone is the same map for
every class; weighting each block's attention by the gradient of a class's
output makes it the map of that class (what `keras-vit explain --class`
draws).

The attention probabilities and their gradient are read through each
encoder block's `TransformerBlock.probing_attention` (a zero added to the
probabilities, whose gradient is theirs), with the backend's own automatic
differentiation: `tf.GradientTape`, `jax.grad` or `torch.autograd.grad`.
The model's weights and their gradients are left as they were.
"""

import contextlib

import keras
import numpy as np

from keras_vit.inspect.analysis import _images, _Parts, gradient_rollout, upsample_maps


def _probed(blocks, deltas, seen):
    """Each block's attention probabilities appended to `seen`, and
    `deltas` (zeros of their shape) added to them, within the context."""
    stack = contextlib.ExitStack()
    for block, delta in zip(blocks, deltas, strict=True):
        def probe(weights, training=None, delta=delta):
            seen.append(weights)
            return weights + delta
        stack.enter_context(block.probing_attention(probe))
    return stack


def _class_score(outputs, index):
    """The sum over the batch of each image's output for its class `index`
    (an int per image)."""
    outputs = keras.ops.cast(outputs, "float32")
    one_hot = keras.ops.one_hot(keras.ops.convert_to_tensor(index), outputs.shape[-1])
    return keras.ops.sum(outputs * one_hot)


def _tensorflow(model, x, index, blocks, shapes):
    import tensorflow as tf  # the TensorFlow backend only

    deltas, seen = [tf.zeros(shape) for shape in shapes], []
    with tf.GradientTape() as tape:
        tape.watch(deltas)
        with _probed(blocks, deltas, seen):
            outputs = model(x, training=False)
        score = _class_score(outputs, index)
    return outputs, seen, tape.gradient(score, deltas)


def _jax(model, x, index, blocks, shapes):
    import jax  # the JAX backend only

    def score(deltas):
        seen = []
        with _probed(blocks, deltas, seen):
            outputs = model(x, training=False)
        return _class_score(outputs, index), (outputs, seen)

    deltas = [jax.numpy.zeros(shape, "float32") for shape in shapes]
    gradients, (outputs, seen) = jax.grad(score, has_aux=True)(deltas)
    return outputs, seen, gradients


def _torch(model, x, index, blocks, shapes):
    import torch  # the torch backend only

    deltas = [keras.ops.zeros(shape, "float32").requires_grad_() for shape in shapes]
    seen = []
    with torch.enable_grad(), _probed(blocks, deltas, seen):
        outputs = model(x, training=False)
        score = _class_score(outputs, index)
        # (autograd.grad, not backward(): no gradient is left on the weights)
        gradients = torch.autograd.grad(score, deltas, allow_unused=True)
    return outputs, [a.detach() for a in seen], gradients


_BACKENDS = {"tensorflow": _tensorflow, "jax": _jax, "torch": _torch}


def attention_and_gradients(model, images, class_index):
    """`(outputs, attentions, gradients)` of one batch: `model`'s outputs
    `(N, classes)`, and per encoder block its attention probabilities
    `(N, heads, tokens, tokens)` and the gradient of each image's output
    for its class (`class_index`: one int, or one per image) with respect
    to them; NumPy arrays, inference mode."""
    parts = _Parts(model)
    x = _images(images, parts)
    index = np.broadcast_to(np.asarray(class_index, "int64"), (len(x),))
    tokens = parts.prefix + int(np.prod(parts.grid))
    shapes = [(len(x), block.num_heads, tokens, tokens) for block in parts.blocks]
    outputs, seen, gradients = _BACKENDS[keras.backend.backend()](
        model, x, index, parts.blocks, shapes)
    numpy = keras.ops.convert_to_numpy
    if len(seen) != len(parts.blocks):
        raise ValueError(f"{model.name!r} called its {len(parts.blocks)} encoder blocks "
                         f"{len(seen)} times in one forward pass; class_relevance needs each "
                         "called once.")
    gradients = [np.zeros(shape, "float32") if g is None else numpy(g).astype("float32")
                 for g, shape in zip(gradients, shapes, strict=True)]
    return (numpy(outputs), [numpy(a).astype("float32") for a in seen], gradients)


def class_relevance(model, images, class_index, upsample=True, batch_size=8):
    """Relevance maps of `images` for one class each: the gradient-weighted
    attention rollout (`analysis.gradient_rollout`) of the model's output
    for `class_index` (an int, or one per image), a logit or a probability
    as the model outputs it.

    Returns `(N, H, W)` maps at the image size (bilinear upsampling of the
    patch grid), or `(N, grid_h, grid_w)` with `upsample=False`; larger is
    more relevant, 0 is none.

    Raises:
        ValueError: the model does not output one row of class scores per
            image, or `class_index` is not one of its classes.

    Example:

    >>> import numpy as np, keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> images = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3))
    >>> class_relevance(model, images, class_index=1).shape
    (2, 32, 32)
    >>> class_relevance(model, images, [0, 2], upsample=False).shape
    (2, 4, 4)
    """
    parts = _Parts(model)
    images = _images(images, parts)
    outputs_shape = model.output_shape
    if isinstance(outputs_shape, list) or len(outputs_shape) != 2:
        raise ValueError(f"{model.name!r} outputs {outputs_shape}, not one row of class "
                         "scores per image; class_relevance needs a classifier.")
    index = np.broadcast_to(np.asarray(class_index), (len(images),))
    classes = outputs_shape[-1]
    if index.dtype.kind not in "iu" or ((index < 0) | (index >= classes)).any():
        raise ValueError(f"class_index={class_index!r}; allowed: 0 to {classes - 1} (the "
                         f"model's {classes} classes).")
    maps = []
    for start in range(0, len(images), batch_size):
        _, attentions, gradients = attention_and_gradients(
            model, images[start:start + batch_size], index[start:start + batch_size])
        maps.append(gradient_rollout(attentions, gradients, parts.prefix, parts.grid,
                                     class_token=parts.class_token))
    grid_maps = np.concatenate(maps)
    return upsample_maps(grid_maps, parts.image_size) if upsample else grid_maps
