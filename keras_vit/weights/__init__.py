"""Official checkpoints: registry, download, key mapping, posemb resize."""

from keras_vit.weights.download import WeightsDownloadError
from keras_vit.weights.official import (
    CheckpointMismatchError,
    CorruptCheckpointError,
    load_official_weights,
    official_manifest,
    read_checkpoint,
    save_official_weights,
)
from keras_vit.weights.posemb import resize_position_embedding

__all__ = [
    "CheckpointMismatchError",
    "CorruptCheckpointError",
    "WeightsDownloadError",
    "load_official_weights",
    "official_manifest",
    "read_checkpoint",
    "resize_position_embedding",
    "save_official_weights",
]
