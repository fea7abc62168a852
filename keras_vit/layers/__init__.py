"""Keras layers of the ViT family. `keras.ops` only: they run on the
TensorFlow, JAX and PyTorch backends."""

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
