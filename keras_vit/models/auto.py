"""Build the model a checkpoint describes: an official `.npz` from its keys
alone, a timm / transformers checkpoint from its config.json and shapes.
Reading the architecture off a checkpoint is `keras_vit.weights.architecture`'s
(`architecture_from_checkpoint` is importable from here too)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from keras_vit.errors import CheckpointMismatchError
from keras_vit.models.mixer import MLPMixer
from keras_vit.models.vit import VisionTransformer
from keras_vit.weights.architecture import architecture_from_checkpoint
from keras_vit.weights.checkpoint import Checkpoint
from keras_vit.weights.dino import LIBRARY as DINO
from keras_vit.weights.sources import read_source

if TYPE_CHECKING:
    import keras

__all__ = ["architecture_from_checkpoint", "model_from_checkpoint"]

# Where a Hub folder's config.json says the number of attention heads.
_HEADS_KEYS = {"timm": "model_args.num_heads", "transformers": "num_attention_heads"}


def model_from_checkpoint(path: str | os.PathLike | Checkpoint, ema: bool = False,
                          **kwargs: Any) -> keras.Model:
    """Builds and loads the ViT / hybrid / Mixer stored in a checkpoint.

    The checkpoint is read once (`keras_vit.weights.resolve`): the
    architecture comes from the arrays it holds, and the same arrays load.

    Args:
        path: local path of an official-format `.npz`; a `Checkpoint` read
            by `keras_vit.weights.resolve`; or a timm /
            Hugging Face transformers checkpoint: `"hf://ORG/NAME"`
            (downloaded with huggingface_hub, the `hf` extra), a folder in
            the Hub layout (config.json + model.safetensors or
            pytorch_model.bin), a bare `.safetensors` file, or a PyTorch
            file (`torch.save` of a state dict or of a training checkpoint
            holding one; `keras_vit.weights.pytorch`). Those bring their
            source's arithmetic (GELU form, LayerNorm epsilon, fc_norm,
            hybrid stem, position-embedding resize, input mean/std). A
            checkpoint without a head (transformers `ViTModel`, DINO's
            and DINOv2's ViTs, a head-less official `.npz`) gives
            `include_top=False`, with its pooler `pooling="token"`; a timm
            file without a head gives timm's `num_classes=0` output (the
            class token after the final norm, the average, or the attention
            pooling, as its classifier pools; a distilled DeiT's tokens).
            The output is what the source class computes: the logits of a
            classifier (pass `classifier_activation=None`; the default is
            softmax), the `pooler_output` of a transformers `*Model` /
            `*VisionModel` (`pooling="token"`, SigLIP's `"map"`), CLIP's
            `image_embeds` (its projection is the head,
            `classifier_activation=None`). See
            docs/models.md#weights-from-the-hugging-face-hub-timm-transformers.
        ema: with a PyTorch training checkpoint, its EMA weights
            (`state_dict_ema` / `model_ema`) instead of its weights.
        **kwargs: further builder arguments (`input_shape`, `classes`,
            `include_top`, `classifier_activation`, `features_only`,
            `out_indices`, `feature_format`, `remat`, ...); architecture
            arguments given here (e.g. `num_heads` for a bare
            `.safetensors` of a non-standard width) override what is read.

    Raises:
        CheckpointNotFoundError: no file at `path` ("Weights file not found:
            'PATH'.", the same as `weights=path` of any builder).
        UnsupportedCheckpointError: a file in none of those formats (a
            Keras model or `.weights.h5`, an HTML page, ...).
        CorruptCheckpointError: a damaged file.
        ValueError: `ema=True` for a checkpoint without EMA weights.
        TypeError: `path` neither a str / os.PathLike path nor a
            `Checkpoint` (None, bytes, ...), or `library=` (an argument of
            `keras_vit.weights.hub.read_hub_checkpoint`, whose result can
            be passed as `path`).
        CheckpointMismatchError: an `.npz` whose keys are not those of an
            official ViT / hybrid / Mixer checkpoint.

    Example:

    ```python
    model = keras_vit.model_from_checkpoint("ViT-B_16.npz")
    model = keras_vit.model_from_checkpoint(
        "hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    model = keras_vit.model_from_checkpoint("hf://google/vit-base-patch16-224")
    # A backbone for a dense-prediction head: blocks 3, 5, 7 and 11, as maps
    backbone = keras_vit.model_from_checkpoint(
        "ViT-B_16.npz", features_only=True, out_indices=(3, 5, 7, 11))
    ```
    """
    if "library" in kwargs:  # read_hub_checkpoint's argument, not a builder's
        raise TypeError(
            "model_from_checkpoint takes no `library` (the file says whose it is); to read "
            "a file as DINO's, pass keras_vit.weights.hub.read_hub_checkpoint(path, "
            f"library={kwargs['library']!r}) as its `path`.")
    checkpoint = read_source(path, ema=ema)
    family, config = checkpoint.model_config()
    for key in list(kwargs):
        if key in config:
            config[key] = kwargs.pop(key)
    if family == "vit" and not config.get("num_heads"):
        key = _HEADS_KEYS.get(checkpoint.format, "num_heads")
        if getattr(checkpoint, "config", None) is not None:
            said, fix = f"its config.json has no {key}", f"Add {key} to its config.json"
        else:
            said = "no config.json says it"
            fix = f"Put it in a folder with a config.json that has {key}"
        raise CheckpointMismatchError(
            f"Cannot tell the number of attention heads of {checkpoint.source} "
            f"({checkpoint.format} format, width {config['hidden_size']}, not a "
            f"standard width; {said}). {fix}, or pass num_heads= to "
            "keras_vit.model_from_checkpoint.")
    kwargs = headless_defaults(checkpoint, family, config.get("classifier"), kwargs)
    builder = MLPMixer if family == "mixer" else VisionTransformer
    return builder(**config, weights=checkpoint, **kwargs)


def headless_defaults(checkpoint: Checkpoint, family: str, classifier: str | None,
                      kwargs: dict) -> dict:
    """`kwargs` with the defaults for a checkpoint without a head when they
    give no `classes` and no `features_only`: `include_top=False` and the
    output its library computes, `pooling="token"` for a pooler
    (`pre_logits`) or DINO's class token, timm's `num_classes=0` pooling
    (`classifier`: the class token after the final norm, or the map
    head's vector; a distilled DeiT's class and distillation tokens
    averaged) for a timm ViT, the checkpoint's `builder_defaults`
    otherwise (a transformers class's `pooler_output`; CLIP's projection
    kept as the head without softmax, `image_embeds`); else the token
    sequence. Shared by `model_from_checkpoint` and the named Hub-family
    builders."""
    info = checkpoint.info()
    kwargs = dict(kwargs)
    # what the source class computes (transformers: its pooler_output, CLIP's
    # image_embeds through the projection kept as the head, without softmax)
    defaults = dict(getattr(checkpoint, "builder_defaults", None) or {})
    if "classifier_activation" in defaults and kwargs.get("classes") in (None, info.classes):
        kwargs.setdefault("classifier_activation", defaults["classifier_activation"])
    if info.classes is None and "classes" not in kwargs and not kwargs.get("features_only"):
        kwargs.setdefault("include_top", False)
        # DINO's forward is the class token after the final norm (no pre_logits);
        # timm's without a head (num_classes=0) pools as its classifier does
        library = getattr(checkpoint, "library", None)
        if not kwargs["include_top"] and (info.representation_size or library == DINO):
            kwargs.setdefault("pooling", "token")
        elif not kwargs["include_top"] and library == "timm" and family == "vit":
            # a distilled DeiT's is the mean of its class and distillation tokens
            kwargs.setdefault("pooling", "distilled" if info.distillation_token
                              else classifier or info.classifier)
        elif not kwargs["include_top"] and "pooling" in defaults:
            kwargs.setdefault("pooling", defaults["pooling"])
    return kwargs
