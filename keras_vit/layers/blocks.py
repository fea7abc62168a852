"""What a model is made of, read off its layers: every layer (nested models
included), its encoder blocks, and the quantization modes of its Dense
layers. The one place that knows which layer classes are encoder blocks:
a new block type is one more entry in `ENCODER_BLOCKS`.
"""

import keras

from keras_vit.layers.mixer import MixerBlock
from keras_vit.layers.transformer import TransformerBlock

# The layer classes that are one encoder block (one of the model's depth).
ENCODER_BLOCKS = (TransformerBlock, MixerBlock)


def walk_layers(model):
    """Every layer of `model`, those of nested models too (depth first, a
    nested model before its layers).

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> [layer.name for layer in walk_layers(model)]
    ['images', 'preprocessing', 'patches', 'patch_encoder', ...]
    """
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer)


def encoder_blocks(model):
    """The encoder blocks of `model` (its `TransformerBlock` and
    `MixerBlock` layers, those of nested models included), in depth order.

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> [block.name for block in encoder_blocks(model)]
    ['encoderblock_0', 'encoderblock_1']
    """
    return [layer for layer in walk_layers(model) if isinstance(layer, ENCODER_BLOCKS)]


def quantization_modes(model):
    """The quantization modes (`"int8"`, `"int4"`, `"float8"`, ...) of the
    layers of `model` that `model.quantize(...)` quantized (the blocks'
    `dense_layers` included); empty for a float model.

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> quantization_modes(model)
    set()
    >>> model.quantize("int8")  # 6 s; tests/test_quantize.py runs it  # doctest: +SKIP
    >>> quantization_modes(model)  # doctest: +SKIP
    {'int8'}
    """
    modes = set()
    for layer in model.layers:
        for sublayer in [layer, *getattr(layer, "dense_layers", ())]:
            if sublayer is not None and sublayer.quantization_mode:
                modes.add(sublayer.quantization_mode)
    return modes
