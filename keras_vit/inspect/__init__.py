"""Inspect a ViT: attention rollout, mean attention distance, position-
embedding similarity, patch-embedding filters, intermediate features.

>>> from keras_vit import inspect
>>> maps = inspect.attention_rollout(model, images)        # doctest: +SKIP
>>> distance = inspect.attention_distance(model, images)   # (layers, heads) pixels
"""

from keras_vit.inspect.analysis import (
    attention_distance,
    attention_rollout,
    attention_weights,
    embedding_filters,
    find_vit,
    intermediate_features,
    mean_distance,
    patch_centres,
    position_embedding_similarity,
    principal_filters,
    rollout,
    upsample_maps,
)

__all__ = [
    "attention_distance", "attention_rollout", "attention_weights", "embedding_filters",
    "find_vit", "intermediate_features", "mean_distance", "patch_centres",
    "position_embedding_similarity", "principal_filters", "rollout", "upsample_maps",
]
