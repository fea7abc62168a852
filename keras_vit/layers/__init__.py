"""Keras layers of the ViT family. `keras.ops` only: they run on the
TensorFlow, JAX and PyTorch backends."""

import warnings as _warnings

from keras_vit._framework_text import QUANTIZE_SKIPPED as _QUANTIZE_SKIPPED
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.head import ClassifierHead
from keras_vit.layers.mixer import MixerBlock
from keras_vit.layers.patch_encoder import PatchEncoder, interpolate_position_embedding
from keras_vit.layers.patches import Patches
from keras_vit.layers.pooling import AttentionPooling, SequencePooling
from keras_vit.layers.preprocessing import ImageNormalization
from keras_vit.layers.resnet import BottleneckUnit, ResNetRoot, StdConv2D
from keras_vit.layers.transformer import LayerScale, TransformerBlock

__all__ = [
    "AttentionPooling",
    "BottleneckUnit",
    "ClassifierHead",
    "DropPath",
    "ImageNormalization",
    "LayerScale",
    "MixerBlock",
    "PatchEncoder",
    "Patches",
    "ResNetRoot",
    "SequencePooling",
    "StdConv2D",
    "TransformerBlock",
    "interpolate_position_embedding",
]

# `model.quantize(mode)` warns once for each class of leaf layer it leaves in
# float (Keras 3.13-3.15): for a keras_vit model, nine or more warnings about
# layers with nothing to quantize (the input, Patches, the norms, the head,
# ...). Those, and only those, are hidden here by their exact message: any
# other warning of `quantize` still shows. (A `warnings.catch_warnings()`
# block around this import, as pytest's collection is, takes the filter
# away with it when it ends.)
_warnings.filterwarnings("ignore", message=_QUANTIZE_SKIPPED, category=UserWarning)
