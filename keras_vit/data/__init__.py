"""tf.data input pipelines (TensorFlow only): sources, presets,
augmentation, the TFRecord schema."""

from keras_vit.data.augment import RANDAUGMENT_OPS, cutmix, mixup, randaugment
from keras_vit.data.pipeline import (
    DatasetInfo, data_error, header_shape, looks_like_image, make_dataset, max_image_pixels,
)
from keras_vit.data.presets import AUGREG_PRESETS, PRESETS, Preset
from keras_vit.data.sources import (
    HOLDOUT_SPLITS, SCHEMES, SPLIT_FOLDER_NAMES, Source, open_source, parse_source,
)

__all__ = [
    "AUGREG_PRESETS", "DatasetInfo", "HOLDOUT_SPLITS", "PRESETS", "Preset",
    "RANDAUGMENT_OPS", "SCHEMES", "SPLIT_FOLDER_NAMES", "Source", "cutmix", "data_error",
    "header_shape", "looks_like_image", "make_dataset", "max_image_pixels", "mixup",
    "open_source", "parse_source", "randaugment",
]
