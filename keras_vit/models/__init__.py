"""ViT, R+ViT hybrid and MLP-Mixer builders and named models."""

from keras_vit.models.auto import architecture_from_checkpoint, model_from_checkpoint
from keras_vit.models.mixer import (
    MixerB16, MixerB32, MixerL16, MixerS16, MixerS32, MLPMixer,
)
from keras_vit.models.vit import (
    R26ViTS32, R50ViTB16, R50ViTL32, RViTTi16, ViTB8, ViTB16, ViTB32, ViTH14,
    ViTL16, ViTL32, ViTS16, ViTS32, ViTTi16, VisionTransformer,
)
