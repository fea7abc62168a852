"""tf.data input pipelines (TensorFlow only): sources, presets,
augmentation, the TFRecord schema."""

from keras_vit.data.augment import RANDAUGMENT_OPS, cutmix, mixup, randaugment
from keras_vit.data.pipeline import DatasetInfo, looks_like_image, make_dataset
from keras_vit.data.presets import AUGREG_PRESETS, PRESETS, Preset
from keras_vit.data.sources import SCHEMES, open_source, parse_source

__all__ = [
    "AUGREG_PRESETS", "DatasetInfo", "PRESETS", "Preset", "RANDAUGMENT_OPS",
    "SCHEMES", "cutmix", "looks_like_image", "make_dataset", "mixup",
    "open_source", "parse_source", "randaugment",
]
