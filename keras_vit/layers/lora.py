"""LoRA on the encoder blocks: Keras' own `Dense.enable_lora` on the blocks'
Dense layers (and on those of a `classifier="map"` model's attention-pooling
head), everything else frozen but the head, and the merge back to plain
Dense kernels for saving and export.

Low-rank adaptation (Hu et al., "LoRA: Low-Rank Adaptation of Large Language
Models", 2021) adds `(alpha / rank) * A @ B` to a frozen kernel `W`; `A`
(`(in, rank)`, He-uniform) and `B` (`(rank, out)`, zeros) train. The blocks
read `dense.kernel`, which Keras computes as `W + (alpha / rank) * A @ B` for
a LoRA-enabled Dense, so the fused encoder path runs the adapters too.

Saving: Keras writes a LoRA-enabled Dense's kernel merged (`W + delta`), and
the blocks rebuild plain Dense layers from their config, so a saved `.keras`
file is a plain, merged model that loads anywhere (safe mode on). A model
still holding adapters in memory is merged by `merge_lora` (what
`keras_vit.export` does before it traces one).
"""

import contextlib

import keras
import numpy as np

from keras_vit import _checks
from keras_vit.layers.blocks import encoder_blocks, walk_layers
from keras_vit.layers.head import ClassifierHead
from keras_vit.layers.mixer import MixerBlock
from keras_vit.layers.pooling import AttentionPooling
from keras_vit.layers.transformer import TransformerBlock

# Target name -> the layer's Dense attributes it covers, per layer type. The
# attention-pooling head (`classifier="map"`, SigLIP) is an attention layer
# too: its probe's query and the keys-values are "qkv", its output
# projection "attention_output", its MLP "mlp", as keras-hub's
# `backbone.enable_lora` adapts the query and value of every attention layer,
# a SigLIP backbone's pooling head's included.
LORA_TARGETS = {
    TransformerBlock: {"qkv": ("qkv",), "attention_output": ("attention_output",),
                       "mlp": ("mlp_dense1", "mlp_dense2")},
    MixerBlock: {"token_mixing": ("token_mixing1", "token_mixing2"),
                 "channel_mixing": ("channel_mixing1", "channel_mixing2")},
    AttentionPooling: {"qkv": ("query", "key_value"), "attention_output": ("out",),
                       "mlp": ("mlp_dense1", "mlp_dense2")},
}
# The targets when none are given: the attention projections of a ViT (as
# keras-hub's `backbone.enable_lora`), both MLPs of a Mixer (it has no
# attention).
DEFAULT_TARGETS = {TransformerBlock: ("qkv", "attention_output"),
                   MixerBlock: ("token_mixing", "channel_mixing"),
                   AttentionPooling: ("qkv", "attention_output")}
ADAPTER_NAMES = ("lora_kernel_a", "lora_kernel_b")


def lora_layers(model):
    """The Dense layers of `model` with LoRA enabled (`enable_lora`), in the
    blocks' order; empty for a model without adapters."""
    return [layer for layer in walk_layers(model)
            for layer in [layer, *getattr(layer, "dense_layers", ())]
            if isinstance(layer, keras.layers.Dense) and layer.lora_enabled]


def _check_targets(blocks, targets):
    kinds = {type(block) for block in blocks}
    if targets is None:
        return None
    if isinstance(targets, str):
        targets = (targets,)
    allowed = sorted({name for kind in kinds for name in LORA_TARGETS[kind]})
    if not targets or any(not isinstance(t, str) or t not in allowed for t in targets):
        raise ValueError(f"Unknown LoRA targets={tuple(targets)!r}; allowed for this "
                         f"model: {tuple(allowed)} (one or more).")
    return tuple(dict.fromkeys(targets))


def _targeted(block, targets):
    table = LORA_TARGETS[type(block)]
    names = DEFAULT_TARGETS[type(block)] if targets is None else targets
    return [getattr(block, attribute) for name in names if name in table
            for attribute in table[name]]


def enable_lora(model, rank, targets=None, alpha=None, seed=None):
    """Turns `model` into a LoRA fine-tuning model, in place: rank-`rank`
    adapters on the targeted Dense layers of every encoder block and of the
    attention-pooling head of a `classifier="map"` model (`AttentionPooling`,
    SigLIP's: an attention layer, so the same target names cover its Dense
    layers, as keras-hub's `enable_lora` adapts every attention layer), and
    every other weight frozen except the classification head's
    (`ClassifierHead`); the pooling head's probe and LayerNorm are frozen.

    Args:
        model: a keras_vit model (ViT, hybrid or Mixer; built).
        rank: adapter rank, from 1 to the smallest input or output width of
            a targeted layer.
        targets: names of the blocks' Dense layers to adapt. ViT blocks:
            `"qkv"`, `"attention_output"`, `"mlp"` (both MLP layers; in the
            attention-pooling head: `"qkv"` its `query` and `key_value`,
            `"attention_output"` its `out`, `"mlp"` its two MLP layers);
            Mixer blocks: `"token_mixing"`, `"channel_mixing"`. Default:
            `("qkv", "attention_output")` for ViTs, both MLPs for Mixers.
        alpha: the adapters' scale numerator (`alpha / rank`); default
            `rank` (scale 1), as Keras.
        seed: seed of the adapters' He-uniform initialisation.

    Returns:
        `{"parameters": ..., "trainable_parameters": ...}` of the model now.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViTB16(weights="imagenet21k", classes=10)  # downloads  # doctest: +SKIP
    >>> enable_lora(model, rank=8)  # doctest: +SKIP
    {'parameters': 86406154, 'trainable_parameters': 302602}
    >>> tiny = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> enable_lora(tiny, rank=4)
    {'parameters': 8675, 'trainable_parameters': 819}
    """
    rank = _checks.positive_int(rank, "rank")
    if alpha is not None:
        _checks.positive_float(alpha, "alpha")
    blocks = encoder_blocks(model)
    if not blocks:
        raise ValueError(f"enable_lora needs a keras_vit model with TransformerBlock or "
                         f"MixerBlock layers; {model.name!r} has none.")
    targets = _check_targets(blocks, targets)
    if lora_layers(model):
        raise ValueError(f"LoRA is already enabled on {model.name!r}; enable it once "
                         "(a saved .keras file is merged: load it to start afresh).")
    pooling_heads = [layer for layer in walk_layers(model)
                     if isinstance(layer, AttentionPooling)]
    dense_layers = [d for layer in (*blocks, *pooling_heads) for d in _targeted(layer, targets)]
    if not dense_layers:
        raise ValueError(f"No layer of {model.name!r} is among targets={targets!r}.")
    quantized = sorted({d.quantization_mode for d in dense_layers if d.quantization_mode})
    if quantized:
        raise ValueError(f"{model.name!r} is quantized ({', '.join(quantized)}); enable "
                         "LoRA on the float model, then merge and quantize.")
    smallest = min(min(d.kernel.shape) for d in dense_layers)
    if rank > smallest:
        raise ValueError(f"rank={rank} is larger than the smallest width of the targeted "
                         f"layers ({smallest}); allowed: 1 to {smallest}.")
    initializer = keras.initializers.HeUniform(seed=seed)
    for variable in model.variables:
        variable.trainable = False
    for dense in dense_layers:
        dense.enable_lora(rank, lora_alpha=alpha, a_initializer=initializer)
    for head in (layer for layer in walk_layers(model) if isinstance(layer, ClassifierHead)):
        for variable in head.variables:
            variable.trainable = True
    return parameter_counts(model)


def parameter_counts(model):
    """`{"parameters", "trainable_parameters"}` of `model` (adapters
    included)."""
    return {"parameters": int(sum(np.prod(v.shape) for v in model.weights)),
            "trainable_parameters": int(sum(np.prod(v.shape)
                                            for v in model.trainable_weights))}


def merged_kernel(dense):
    """`W + (alpha / rank) * A @ B` of a LoRA-enabled Dense, in float32
    NumPy (the kernel's own dtype when it is another), computed on the
    host from the variables."""
    kernel = next(v for v in dense.weights if v.name == "kernel")
    a = keras.ops.convert_to_numpy(dense.lora_kernel_a).astype("float64")
    b = keras.ops.convert_to_numpy(dense.lora_kernel_b).astype("float64")
    base = keras.ops.convert_to_numpy(kernel)
    delta = (dense.lora_alpha / dense.lora_rank) * (a @ b)
    return (base.astype("float64") + delta).astype(base.dtype)


def merge_lora(model):
    """A copy of `model` without adapters: each LoRA-enabled Dense's kernel
    is `W + (alpha / rank) * A @ B`, every other weight the same (compiled
    as `model` was, without optimizer state). `model` itself is unchanged;
    a model without adapters is returned as is.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32,
    ...     input_shape=(32, 32, 3), classes=3)
    >>> plain_parameters = model.count_params()
    >>> summary = enable_lora(model, rank=4)  # then model.fit(...)
    >>> plain = merge_lora(model)
    >>> plain.count_params() == plain_parameters
    True
    """
    adapted = lora_layers(model)
    if not adapted:
        return model
    merged = {id(next(v for v in d.weights if v.name == "kernel")): merged_kernel(d)
              for d in adapted}
    source = {v.path: v for v in model.weights if v.name not in ADAPTER_NAMES}
    copy = keras.models.clone_model(model)
    if sorted(v.path for v in copy.weights) != sorted(source) or len(source) != len(
            copy.weights):
        raise ValueError(f"Cannot merge the adapters of {model.name!r}: its copy's "
                         "variables are not its own (a model of duplicate variable paths).")
    for variable in copy.weights:
        original = source[variable.path]
        variable.assign(merged.get(id(original), original.value))
    return copy


def adapter_values(model):
    """`{variable path: value}` of the adapters (`A`, `B`) of `model`'s
    LoRA-enabled Dense layers, as NumPy arrays."""
    return {v.path: keras.ops.convert_to_numpy(v)
            for layer in lora_layers(model)
            for v in (layer.lora_kernel_a, layer.lora_kernel_b)}


def set_adapter_values(model, values):
    """Assigns `adapter_values(model)`-shaped `values` to `model`'s adapters;
    a ValueError when the adapters are not the same (paths, shapes)."""
    adapters = {v.path: v for layer in lora_layers(model)
                for v in (layer.lora_kernel_a, layer.lora_kernel_b)}
    shapes = {path: tuple(v.shape) for path, v in adapters.items()}
    given = {path: tuple(np.shape(value)) for path, value in values.items()}
    if shapes != given:
        raise ValueError(f"The saved LoRA adapters do not fit {model.name!r}: saved "
                         f"{len(given)} arrays, the model has {len(shapes)} adapters of "
                         "other names or shapes.")
    for path, variable in adapters.items():
        variable.assign(values[path])


@contextlib.contextmanager
def base_kernels_saved(model):
    """Within this context, saving `model`'s weights (`save_weights`, a
    backup) writes each LoRA-enabled Dense's frozen kernel `W` instead of
    Keras' merged `W + delta` (the adapters are not in the file: save them
    with `adapter_values`). Loading such a file into the model with LoRA
    enabled restores `W` exactly and zeroes the adapters (Keras), which
    `set_adapter_values` then restores: a resumed run continues exactly.

    Keras' `Dense.save_own_variables` merges when `lora_enabled` is set, so
    the flag is cleared during the save and set again after."""
    adapted = lora_layers(model)
    for layer in adapted:
        layer.lora_enabled = False
    try:
        yield
    finally:
        for layer in adapted:
            layer.lora_enabled = True
