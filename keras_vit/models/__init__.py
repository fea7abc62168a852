"""ViT, R+ViT hybrid and MLP-Mixer builders and named models.

The names load on first use (PEP 562), so `import keras_vit.models` imports
no Keras. The named models are those of `keras_vit.variants` (the table): a
variant of family "vit" is defined in `models/vit.py`, of family "mixer" in
`models/mixer.py`, and those of the Hub families (DINOv2, DeiT, CLIP,
SigLIP) in `models/families.py` (`Variant.module`).
"""

from keras_vit._lazy import attach
from keras_vit.variants import ALL_VARIANTS, unknown_model_message

_EXPORTS = {
    "architecture_from_checkpoint": "keras_vit.weights.architecture",  # NumPy only
    "feature_info": "application",
    "model_from_checkpoint": "auto",
    "MLPMixer": "mixer",
    "VisionTransformer": "vit",
    **{function: variant.module for function, variant in ALL_VARIANTS.items()},
}

__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)


def builder(name):
    """The function that builds the named model `name` (`"ViTB16"`, a key of
    `keras_vit.variants.ALL_VARIANTS`): the one way from a model's name to
    its builder (`keras-vit`, `keras_vit.training.train`).

    >>> builder("ViTB16").__name__
    'ViTB16'
    """
    if name not in ALL_VARIANTS:
        raise ValueError(unknown_model_message(name))
    return __getattr__(name)
