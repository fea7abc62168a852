"""Build the model a checkpoint describes: an official `.npz` from its keys
alone, a timm / transformers checkpoint from its config.json and shapes."""

import os
import re

from keras_vit.models.variants import find_variant
from keras_vit.weights.official import (
    POSEMB_KEY,
    CheckpointMismatchError,
    describe,
    read_checkpoint,
)


def architecture_from_checkpoint(params):
    """Reads the builder arguments off official checkpoint arrays.

    Returns `(family, config)`: `("vit", VisionTransformer kwargs)` or
    `("mixer", MLPMixer kwargs)`; head, pre_logits and resolution are left to
    the builder, which reads them from the checkpoint too.

    Raises `CheckpointMismatchError` when the arrays are not those of an
    official ViT / hybrid / Mixer checkpoint.
    """
    try:
        return _architecture(params)
    except KeyError as error:
        raise CheckpointMismatchError(
            f"Cannot read the architecture off this checkpoint: it lacks "
            f"{error.args[0]!r}, which every official "
            f"{'Mixer' if describe(params).family == 'mixer' else 'ViT'} "
            "checkpoint has."
        ) from None


def _architecture(params):
    info = describe(params)
    if info.family == "mixer":
        stem = params["stem/kernel"]
        blocks = {int(m.group(1)) for k in params
                  if (m := re.match(r"MixerBlock_(\d+)/", k))}
        return "mixer", dict(
            patch_size=tuple(stem.shape[:2]), hidden_size=int(stem.shape[-1]),
            num_blocks=len(blocks),
            tokens_mlp_dim=int(params["MixerBlock_0/token_mixing/Dense_0/kernel"].shape[-1]),
            channels_mlp_dim=int(params["MixerBlock_0/channel_mixing/Dense_0/kernel"].shape[-1]),
        )
    embedding = params["embedding/kernel"]
    blocks = {int(m.group(1)) for k in params
              if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))}
    query = params["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"]
    config = dict(
        patch_size=tuple(embedding.shape[:2]), hidden_size=int(embedding.shape[-1]),
        num_layers=len(blocks), num_heads=int(query.shape[1]),
        mlp_dim=int(params["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"].shape[-1]),
        classifier=info.classifier,
    )
    if "conv_root/kernel" in params:
        units = {}
        for key in params:
            m = re.match(r"block(\d+)/unit(\d+)/", key)
            if m:
                stage, unit = int(m.group(1)), int(m.group(2))
                units[stage] = max(units.get(stage, 0), unit)
        config["resnet_layers"] = tuple(units[s] for s in sorted(units))
        config["resnet_width"] = int(params["conv_root/kernel"].shape[-1]) // 64
    assert POSEMB_KEY in params  # describe() said "vit"
    return "vit", config


def checkpoint_variant(params):
    """The named `Variant` (e.g. `ViTB16`) whose architecture the official
    checkpoint arrays have, or None."""
    family, config = architecture_from_checkpoint(params)
    config = {k: v for k, v in config.items() if k != "classifier"}
    return find_variant(family, config)


def _patch(size):
    return str(size[0]) if size[0] == size[1] else f"{size[0]}x{size[1]}"


def describe_architecture(params):
    """One phrase saying what official checkpoint arrays describe, for
    messages, e.g. "a ViT-B/16 (keras_vit.ViTB16: 12 blocks, width 768,
    patch 16) with a 1000-class head".

    Raises `CheckpointMismatchError` when the arrays are not a complete
    official ViT / Mixer checkpoint.
    """
    info = describe(params)
    family, config = architecture_from_checkpoint(params)
    variant = checkpoint_variant(params)
    shape = [f"{config.get('num_layers', config.get('num_blocks'))} blocks",
             f"width {config['hidden_size']}"]
    if variant is None:
        if family == "vit":
            shape += [f"{config['num_heads']} heads", f"MLP {config['mlp_dim']}"]
        else:
            shape += [f"token MLP {config['tokens_mlp_dim']}",
                      f"channel MLP {config['channels_mlp_dim']}"]
    shape.append(f"patch {_patch(config['patch_size'])}")
    if "resnet_layers" in config:
        stages = config["resnet_layers"]
        shape.insert(0, f"ResNet stages {stages}" if stages else "ResNet stem")
    if family == "vit" and info.classifier == "gap":
        shape.append("classifier 'gap'")
    if variant is not None:
        name = variant.official_name.replace("_", "/")
        article = "an" if name.startswith("R") else "a"  # "an R50+ViT-B/16"
        what = f"{article} {name} (keras_vit.{variant.function}: {', '.join(shape)})"
    elif family == "mixer":
        what = f"a Mixer ({', '.join(shape)})"
    elif "resnet_layers" in config:
        what = f"a hybrid R+ViT ({', '.join(shape)})"
    else:
        what = f"a ViT ({', '.join(shape)})"
    if info.classes is None:
        what += " without a classification head"
    else:
        what += f" with a {info.classes}-class head"
    if info.representation_size:
        what += f" and a {info.representation_size}-unit pre_logits layer"
    return what


def model_from_checkpoint(path, **kwargs):
    """Builds and loads the ViT / hybrid / Mixer stored in a checkpoint.

    Args:
        path: local path of an official-format `.npz`; or a timm /
            Hugging Face transformers checkpoint: `"hf://ORG/NAME"`
            (downloaded with huggingface_hub, the `hf` extra), a folder in
            the Hub layout (config.json + model.safetensors), or a bare
            `.safetensors` file. Those bring their source's arithmetic
            (GELU form, LayerNorm epsilon, fc_norm, hybrid stem, position-
            embedding resize, input mean/std); see
            `keras_vit.weights.hub`. A checkpoint without a head
            (transformers `ViTModel`) gives `include_top=False` and, with
            its pooler, `pooling="token"` (the pooler output).
        **kwargs: further builder arguments (`input_shape`, `classes`,
            `include_top`, `classifier_activation`, ...); architecture
            arguments given here (e.g. `num_heads` for a bare
            `.safetensors` of a non-standard width) override what is read.

    Raises:
        CheckpointNotFoundError: no file at `path` ("Weights file not found:
            'PATH'.", the same as `weights=path` of any builder).
        UnsupportedCheckpointError: not an official `.npz` (PyTorch,
            safetensors, a Keras model or `.weights.h5`, an HTML page, ...).
        CorruptCheckpointError: a damaged `.npz`.
        CheckpointMismatchError: an `.npz` whose keys are not those of an
            official ViT / hybrid / Mixer checkpoint.

    Example:

    ```python
    model = keras_vit.model_from_checkpoint("ViT-B_16.npz")
    model = keras_vit.model_from_checkpoint(
        "hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k")
    model = keras_vit.model_from_checkpoint("hf://google/vit-base-patch16-224")
    ```
    """
    from keras_vit.models.mixer import MLPMixer
    from keras_vit.models.vit import VisionTransformer
    from keras_vit.weights import hub

    foreign = hub.resolve_hub(path) if isinstance(path, (str, os.PathLike)) else None
    if foreign is None:
        family, config = architecture_from_checkpoint(read_checkpoint(path))
        builder = MLPMixer if family == "mixer" else VisionTransformer
        return builder(**config, weights=path, **kwargs)
    config = dict(foreign.architecture)
    for key in list(kwargs):
        if key in config:
            config[key] = kwargs.pop(key)
    if foreign.family == "vit" and not config.get("num_heads"):
        raise CheckpointMismatchError(
            f"Cannot tell the number of attention heads of {foreign.source} "
            f"({foreign.format} format, width {config['hidden_size']}, no "
            "config.json saying it); pass num_heads=.")
    info = foreign.info()
    if info.classes is None and "classes" not in kwargs:
        kwargs.setdefault("include_top", False)
        if not kwargs["include_top"] and info.representation_size:
            kwargs.setdefault("pooling", "token")
    builder = MLPMixer if foreign.family == "mixer" else VisionTransformer
    return builder(**config, weights=foreign, **kwargs)
