"""Checkpoints: official registry, download, key mappings (official,
timm, transformers, the Hugging Face Hub), posemb resizes.

One way in: `resolve(weights)` tells the source (a registered name, a URL,
`hf://`, a path) and returns one `Checkpoint` (`checkpoint.py`), which the
builders plan from and load.

Reading comes before loading: `sniff` (what a file is), `npz` (reading an
official `.npz`) and `architecture` (the model the arrays describe) use
NumPy only; `official` maps the arrays onto a Keras model's weights. The
error classes are `keras_vit.errors`'.

The names load on first use (PEP 562), so `keras_vit.weights.registry`
(pure Python) can be read without importing Keras or TensorFlow.
"""

from keras_vit._lazy import attach

_EXPORTS = {
    # the error classes from the bottom floor: reading one loads no Keras
    **dict.fromkeys(["CheckpointMismatchError", "CheckpointNotFoundError",
                     "CorruptCheckpointError", "MissingDependencyError",
                     "UnsupportedCheckpointError", "WeightsDownloadError"],
                    "keras_vit.errors"),
    "ACCEPTED_FORMATS": "sniff",
    "sniff_checkpoint": "sniff",
    "load_official_weights": "official",
    "official_manifest": "official",
    "read_checkpoint": "npz",
    "save_official_weights": "official",
    "resize_position_embedding": "posemb",
    "resample_abs_pos_embed_timm": "posemb",
    "interpolate_pos_encoding_transformers": "posemb",
    "interpolate_pos_encoding_dino": "posemb",
    "resolve": "sources",
    "Checkpoint": "checkpoint",
    "KerasWeightsFile": "keras_h5",
    "read_hub_checkpoint": "hub",
    "read_torch_state": "pytorch",
    "HubCheckpoint": "hub",
}

__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS)
