"""Inspect a ViT: attention rollout, a class's relevance (gradient-weighted
rollout), mean attention distance, position-embedding similarity,
patch-embedding filters, intermediate features.

>>> import numpy as np, keras_vit
>>> from keras_vit import inspect
>>> model = keras_vit.VisionTransformer(
...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
...     input_shape=(32, 32, 3), classes=3)
>>> images = np.zeros((2, 32, 32, 3), "uint8")
>>> inspect.attention_rollout(model, images).shape         # (N, H, W)
(2, 32, 32)
>>> inspect.attention_distance(model, images).shape        # (layers, heads) pixels
(2, 2)
"""

from keras_vit.inspect.analysis import (
    attention_distance,
    attention_rollout,
    attention_weights,
    embedding_filters,
    find_vit,
    gradient_rollout,
    intermediate_features,
    mean_distance,
    patch_centres,
    position_embedding_similarity,
    principal_filters,
    rollout,
    upsample_maps,
)
from keras_vit.inspect.relevance import class_relevance

__all__ = [
    "attention_distance", "attention_rollout", "attention_weights", "class_relevance",
    "embedding_filters", "find_vit", "gradient_rollout", "intermediate_features",
    "mean_distance", "patch_centres",
    "position_embedding_similarity", "principal_filters", "rollout", "upsample_maps",
]
