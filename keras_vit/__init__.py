"""keras_vit: Vision Transformers, R+ViT hybrids and MLP-Mixers for Keras 3,
with the official checkpoints.

>>> import keras_vit
>>> model = keras_vit.ViTB16(weights="imagenet21k+imagenet2012")  # doctest: +SKIP
"""

import logging as _logging

from keras_vit import layers, weights
from keras_vit.models import (
    MixerB16,
    MixerB32,
    MixerL16,
    MixerS16,
    MixerS32,
    MLPMixer,
    R26ViTS32,
    R50ViTB16,
    R50ViTL32,
    RViTTi16,
    ViTB8,
    ViTB16,
    ViTB32,
    ViTH14,
    ViTL16,
    ViTL32,
    ViTS16,
    ViTS32,
    ViTTi16,
    VisionTransformer,
    model_from_checkpoint,
)
from keras_vit.preprocessing import decode_predictions, preprocess_input
# Registers WarmupDecay so load_model reads trained files (no TensorFlow import).
from keras_vit.training import schedules as _schedules  # noqa: F401
from keras_vit.weights import (
    load_official_weights,
    official_manifest,
    resize_position_embedding,
    save_official_weights,
)

__version__ = "0.1.0"

# Head replacement, position-embedding resizing and re-downloads are said in
# INFO lines; show them unless the application configured logging itself.
_logger = _logging.getLogger("keras_vit")
if not _logging.getLogger().handlers and not _logger.handlers:
    _handler = _logging.StreamHandler()
    _handler.setFormatter(_logging.Formatter("keras_vit: %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(_logging.INFO)

__all__ = [
    "MLPMixer", "MixerB16", "MixerB32", "MixerL16", "MixerS16", "MixerS32",
    "R26ViTS32", "R50ViTB16", "R50ViTL32", "RViTTi16", "ViTB16", "ViTB32",
    "ViTB8", "ViTH14", "ViTL16", "ViTL32", "ViTS16", "ViTS32", "ViTTi16",
    "VisionTransformer", "decode_predictions", "layers",
    "load_official_weights", "model_from_checkpoint", "official_manifest", "preprocess_input",
    "resize_position_embedding", "save_official_weights", "weights",
]
