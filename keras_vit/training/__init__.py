"""Training: recipes, schedules, SAM, strategies, callbacks, `train`.
TensorFlow backend (tf.data, tf.distribute)."""

from keras_vit.training.callbacks import TerminateOnNaNWithAdvice, default_callbacks
from keras_vit.training.quickstart import quickstart
from keras_vit.training.recipes import NO_DECAY, RECIPES, Recipe, get_recipe, make_optimizer
from keras_vit.training.sam import SAMModel
from keras_vit.training.schedules import WarmupDecay
from keras_vit.training.strategy import get_strategy, is_multi_worker, prepare_model, worker_task
from keras_vit.training.trainer import PRECISIONS, evaluate, set_precision, train

__all__ = [
    "NO_DECAY", "PRECISIONS", "RECIPES", "Recipe", "SAMModel",
    "TerminateOnNaNWithAdvice", "WarmupDecay", "default_callbacks", "evaluate",
    "get_recipe", "get_strategy", "is_multi_worker", "make_optimizer",
    "prepare_model", "quickstart", "set_precision", "train", "worker_task",
]
