"""ViT, R+ViT hybrid and MLP-Mixer builders and named models.

The names load on first use (PEP 562), so `keras_vit.models.variants` (the
table of variants, pure Python) can be read without importing Keras.
"""

from keras_vit._lazy import attach

_EXPORTS = {
    **dict.fromkeys(["architecture_from_checkpoint", "model_from_checkpoint"], "auto"),
    **dict.fromkeys(["MixerB16", "MixerB32", "MixerL16", "MixerS8", "MixerS16",
                     "MixerS32", "MLPMixer"], "mixer"),
    **dict.fromkeys(["R26ViTB32", "R26ViTS32", "R50ViTB16", "R50ViTL32", "RViTTi16", "ViTB8", "ViTB16",
                     "ViTB32", "ViTH14", "ViTL16", "ViTL32", "ViTS16", "ViTS32", "ViTTi16",
                     "VisionTransformer"], "vit"),
}

__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
