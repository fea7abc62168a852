"""Layer-wise learning-rate decay (BEiT, MAE fine-tuning; timm's
`--layer-decay`): the learning rate of a variable at depth `d` of a model of
`L` blocks is `learning_rate * rate ** (L + 1 - d)`.

Depth 0: everything before the first encoder block (the patch embedding,
the class token, the position embedding, a hybrid's ResNet); depth `i + 1`:
block `i`; depth `L + 1`: everything after the last block (the final
LayerNorm, `pre_logits`, the head). A variable's decoupled weight decay is
scaled with its learning rate, as in timm (PyTorch's AdamW decays by
`lr * weight_decay` of the variable's group).

Keras optimizers have one learning rate, so the two optimizers here are
Keras' SGD and Adam with their `update_step` given each variable's rate
(`learning_rate * scale`); decoupled weight decay runs in the same step.
They save and reload with the model (`import keras_vit` registers them).
"""

import re

import keras

from keras_vit import _compat
from keras_vit.layers.blocks import encoder_blocks, walk_layers


def layer_depths(model):
    """`({variable path: depth}, L)` for a keras_vit model of `L` encoder
    blocks (nested models included): depth 0 before the first block, `i +
    1` for block `i`, `L + 1` after the last.

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> depths, num_layers = layer_depths(model)
    >>> depths["patch_encoder/class_token"], depths["head/kernel"], num_layers
    (0, 3, 2)
    """
    blocks = encoder_blocks(model)
    if not blocks:
        raise ValueError(f"Layer-wise learning-rate decay needs a keras_vit model with "
                         f"TransformerBlock or MixerBlock layers; {model.name!r} has none.")
    index = {id(block): i for i, block in enumerate(blocks)}
    depths, depth = {}, 0  # a layer between two blocks: the depth of the one before
    for layer in walk_layers(model):
        if isinstance(layer, keras.Model):
            continue  # (its variables are its layers')
        if id(layer) in index:
            depth = index[id(layer)] + 1
        elif depth == len(blocks):
            depth = len(blocks) + 1
        for variable in layer.variables:  # (not the dropouts' integer seed states)
            if keras.backend.is_float_dtype(variable.dtype):
                depths.setdefault(variable.path, depth)
    return depths, len(blocks)


def layer_decay_scales(model, rate):
    """`{variable path: rate ** (L + 1 - depth)}` for every variable of
    `model` (see `layer_depths`); `rate` in (0, 1].

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> layer_decay_scales(model, 0.65)["head/kernel"]
    1.0
    >>> layer_decay_scales(model, 0.5)["patch_encoder/class_token"]  # 0.5 ** 3
    0.125
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise ValueError(f"layer_decay={rate!r}; allowed: a number in (0, 1] (e.g. 0.65 "
                         "for ViT-B, 0.75 for ViT-L as in BEiT / MAE).")
    depths, num_layers = layer_depths(model)
    return {path: float(rate) ** (num_layers + 1 - depth) for path, depth in depths.items()}


class _LayerDecay:
    """Mixin over a Keras optimizer: per-variable learning-rate scales
    (`learning_rate_scales`, variable path -> scale) and decoupled weight
    decay scaled with them (`decoupled_weight_decay`, not on variables whose
    name matches one of `no_decay`)."""

    def __init__(self, *args, learning_rate_scales=None, decoupled_weight_decay=0.0,
                 no_decay=(), **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(learning_rate_scales, dict) or not learning_rate_scales:
            raise TypeError("`learning_rate_scales` must be a dict of variable path -> "
                            f"scale; got {learning_rate_scales!r}.")
        self.learning_rate_scales = {str(k): float(v) for k, v in learning_rate_scales.items()}
        self.decoupled_weight_decay = float(decoupled_weight_decay)
        self.no_decay = tuple(no_decay)
        self._scales = self._decays = None

    def build(self, var_list):
        missing = [v.path for v in var_list if v.path not in self.learning_rate_scales]
        if missing:
            raise ValueError(
                f"No layer-decay learning rate for {len(missing)} variable(s) of the model "
                f"being trained (e.g. {missing[0]!r}): the optimizer was made for another "
                "model; make it from this one (layer_decay_scales(model, rate)).")
        self._scales = [self.learning_rate_scales[v.path] for v in var_list]
        self._decays = [self.decoupled_weight_decay > 0
                        and not any(re.search(n, v.name) for n in self.no_decay)
                        for v in var_list]
        super().build(var_list)

    def learning_rate_scale(self, variable):
        """The scale of `variable`'s learning rate (1.0 at the head)."""
        return self._scales[_compat.optimizer_variable_index(self, variable)]

    def update_step(self, gradient, variable, learning_rate):
        index = _compat.optimizer_variable_index(self, variable)
        rate = keras.ops.cast(learning_rate, variable.dtype) * self._scales[index]
        if self._decays[index]:
            variable.assign(variable - variable * self.decoupled_weight_decay * rate)
        super().update_step(gradient, variable, rate)

    def get_config(self):
        config = super().get_config()
        config.update(learning_rate_scales=self.learning_rate_scales,
                      decoupled_weight_decay=self.decoupled_weight_decay,
                      no_decay=list(self.no_decay))
        return config


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecaySGD(_LayerDecay, keras.optimizers.SGD):
    """Keras' SGD with layer-wise learning rates (`layer_decay_scales`).

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> optimizer = LayerDecaySGD(0.01, momentum=0.9,
    ...                           learning_rate_scales=layer_decay_scales(model, 0.75))
    """


@keras.saving.register_keras_serializable(package="keras_vit")
class LayerDecayAdamW(_LayerDecay, keras.optimizers.Adam):
    """Keras' Adam with layer-wise learning rates and decoupled weight
    decay scaled with them (AdamW as timm's layer-decay param groups).

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> optimizer = LayerDecayAdamW(
    ...     1e-3, learning_rate_scales=layer_decay_scales(model, 0.65),
    ...     decoupled_weight_decay=0.05, no_decay=["bias"])
    """
