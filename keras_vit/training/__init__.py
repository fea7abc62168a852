"""Training: recipes, schedules, SAM, strategies, callbacks, `train`.
Data pipelines are tf.data on every backend; multi-device training uses
tf.distribute strategies on TensorFlow and `keras.distribution` on JAX.

LoRA (`enable_lora`, `merge_lora`) is Keras' own `Dense.enable_lora` on the
encoder blocks (`keras_vit.layers.lora`).

The names load on first use (PEP 562), so `import keras_vit` can register
the serializable `WarmupDecay` (needed to load a trained `.keras` file)
without importing TensorFlow under another backend.
"""

from keras_vit._lazy import attach

# Eager (its module imports only os at load): the function must shadow its own
# submodule's name, which importing the submodule would bind here.
from keras_vit.training.quickstart import quickstart  # noqa: F401

_EXPORTS = {
    "BestModelCheckpoint": "callbacks", "TerminateOnNaNWithAdvice": "callbacks",
    "default_callbacks": "callbacks",
    "NO_DECAY": "recipes", "RECIPES": "recipes", "Recipe": "recipes",
    "get_recipe": "recipes", "make_optimizer": "recipes",
    "SAMModel": "sam",
    "enable_lora": "keras_vit.layers.lora", "merge_lora": "keras_vit.layers.lora",
    "get_distribution": "distribution", "initialize_processes": "distribution",
    "vit_layout_map": "distribution",
    "WarmupDecay": "schedules",
    "LayerDecayAdamW": "layer_decay", "LayerDecaySGD": "layer_decay",
    "layer_decay_scales": "layer_decay", "layer_depths": "layer_decay",
    "get_strategy": "strategy", "is_multi_worker": "strategy",
    "prepare_model": "strategy", "worker_task": "strategy",
    "PRECISIONS": "trainer", "TrainingDivergedError": "keras_vit.errors",
    "evaluate": "evaluation", "set_precision": "trainer", "train": "trainer",
}

__getattr__, __dir__, __all__ = attach(__name__, _EXPORTS, extra=["quickstart"])
