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

    >>> [layer.name for layer in walk_layers(model)]  # doctest: +SKIP
    ['images', 'preprocessing', 'patches', 'patch_encoder', ...]
    """
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer)


def encoder_blocks(model):
    """The encoder blocks of `model` (its `TransformerBlock` and
    `MixerBlock` layers, those of nested models included), in depth order.

    >>> [block.name for block in encoder_blocks(model)]  # doctest: +SKIP
    ['encoderblock_0', 'encoderblock_1', ...]
    """
    return [layer for layer in walk_layers(model) if isinstance(layer, ENCODER_BLOCKS)]


def quantization_modes(model):
    """The quantization modes (`"int8"`, `"int4"`, `"float8"`, ...) of the
    layers of `model` that `model.quantize(...)` quantized (the blocks'
    `dense_layers` included); empty for a float model.

    >>> quantization_modes(model)  # doctest: +SKIP
    {'int8'}
    """
    modes = set()
    for layer in model.layers:
        for sublayer in [layer, *getattr(layer, "dense_layers", ())]:
            if sublayer is not None and sublayer.quantization_mode:
                modes.add(sublayer.quantization_mode)
    return modes
