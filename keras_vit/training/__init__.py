"""Training: recipes, schedules, SAM, strategies, callbacks, `train`.
TensorFlow backend (tf.data, tf.distribute).

The names load on first use (PEP 562), so `import keras_vit` can register
the serializable `WarmupDecay` (needed to load a trained `.keras` file)
without importing TensorFlow under another backend.
"""

import importlib

# Eager (its module imports only os at load): the function must shadow its own
# submodule's name, which importing the submodule would bind here.
from keras_vit.training.quickstart import quickstart

_EXPORTS = {
    "TerminateOnNaNWithAdvice": "callbacks", "default_callbacks": "callbacks",
    "NO_DECAY": "recipes", "RECIPES": "recipes", "Recipe": "recipes",
    "get_recipe": "recipes", "make_optimizer": "recipes",
    "SAMModel": "sam",
    "WarmupDecay": "schedules",
    "get_strategy": "strategy", "is_multi_worker": "strategy",
    "prepare_model": "strategy", "worker_task": "strategy",
    "PRECISIONS": "trainer", "evaluate": "trainer", "set_precision": "trainer",
    "train": "trainer",
}

__all__ = sorted([*_EXPORTS, "quickstart"])


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'keras_vit.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"keras_vit.training.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
