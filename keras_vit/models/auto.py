"""Build the model an official checkpoint describes, from its keys alone."""

import re

from keras_vit.weights.official import POSEMB_KEY, describe, read_checkpoint


def architecture_from_checkpoint(params):
    """Reads the builder arguments off official checkpoint arrays.

    Returns `(family, config)`: `("vit", VisionTransformer kwargs)` or
    `("mixer", MLPMixer kwargs)`; head, pre_logits and resolution are left to
    the builder, which reads them from the checkpoint too.
    """
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


def model_from_checkpoint(path, **kwargs):
    """Builds and loads the ViT / hybrid / Mixer stored in an official `.npz`.

    Args:
        path: local path of an official-format checkpoint.
        **kwargs: further builder arguments (`input_shape`, `classes`,
            `include_top`, `classifier_activation`, ...).

    Example:

    ```python
    model = keras_vit.model_from_checkpoint("ViT-B_16.npz")
    ```
    """
    from keras_vit.models.mixer import MLPMixer
    from keras_vit.models.vit import VisionTransformer

    family, config = architecture_from_checkpoint(read_checkpoint(path))
    builder = MLPMixer if family == "mixer" else VisionTransformer
    return builder(**config, weights=path, **kwargs)
