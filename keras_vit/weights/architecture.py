"""The architecture an official checkpoint describes, read from its keys
and shapes alone: the family, head, pre_logits, classifier and grid
(`describe`), the builder arguments (`architecture_from_checkpoint`), the
named variant (`checkpoint_variant`) and one phrase for messages
(`describe_architecture`). NumPy arrays in, plain values out: no Keras.

>>> import numpy as np
>>> describe({"MixerBlock_0/token_mixing/Dense_0/kernel": np.zeros((196, 256))}).grid
(14, 14)
"""

import dataclasses
import math
import re

import numpy as np

from keras_vit.errors import CheckpointMismatchError, CorruptCheckpointError
from keras_vit.variants import find_variant
from keras_vit.weights.npz import AVG_POOL_KEY, DIST_KEY, POSEMB_KEY, REG_KEY
from keras_vit.weights.posemb import checkpoint_grid, square_grid
from keras_vit.weights.relative_position import relative_position_grid


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """What the builders need to know about a checkpoint before building."""

    family: str                 # "vit" | "mixer"
    classes: int                # head width, or None without a head
    representation_size: int    # pre_logits width, or None
    classifier: str             # "token" | "gap" | "map" | "token_avg" | "avg" (ViT)
    grid: tuple                 # (gh, gw) the checkpoint was trained at
    num_register_tokens: int = 0     # DINOv2's registers ("reg")
    distillation_token: bool = False  # DeiT's ("dist")
    no_embed_class: bool = False     # the position embedding covers the patches only
    distilled_head: bool = False     # DeiT's second head ("head_dist")


MAP_PROBE = "MAPHead_0/probe"
LAYER_SCALE = "Transformer/encoderblock_0/LayerScale_0/scale"
MLP_IN = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
MLP_OUT = "Transformer/encoderblock_0/MlpBlock_3/Dense_1/kernel"
ATTENTION = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1"
RELATIVE_TABLE = f"{ATTENTION}/relative_position_bias_table"
MLP_NORM = "Transformer/encoderblock_0/MlpBlock_3/LayerNorm_0/scale"
ROPE_PREFIX = "rope/"


def rope_of(params):
    """The `VisionTransformer(rope=...)` a `rope/<variant>` key records
    (`[temperature, ref_h, ref_w]`, 0: no reference grid), or None; a
    CorruptCheckpointError for more than one such key or a value no
    `official.rope_key` writes.

    >>> import numpy as np
    >>> rope_of({"rope/eva": np.array([1e4, 16, 16])})
    {'variant': 'eva', 'temperature': 10000.0, 'ref_grid': (16, 16)}
    """
    keys = sorted(k for k in params if k.startswith(ROPE_PREFIX))
    if not keys:
        return None
    value = np.asarray(params[keys[0]], dtype="float64")
    ref = value[1:] if value.shape == (3,) else None
    if len(keys) > 1 or ref is None or not np.isfinite(value).all() or value[0] <= 0 \
            or (ref < 0).any() or (ref != np.round(ref)).any() or (ref[0] == 0) != (ref[1] == 0) \
            or (keys[0] == f"{ROPE_PREFIX}dinov3" and ref.any()):
        raise CorruptCheckpointError(
            f"The checkpoint's rotary embedding keys {keys} hold "
            f"{[np.asarray(params[k]).tolist() for k in keys]}; keras_vit writes one key "
            "rope/<variant> of [temperature > 0, ref_h, ref_w] (whole numbers, both 0 for "
            "no reference grid, as DINOv3's always).")
    variant = keys[0][len(ROPE_PREFIX):]
    rope = {"variant": variant, "temperature": float(value[0])}
    if variant == "eva":
        rope["ref_grid"] = (int(ref[0]), int(ref[1])) if ref[0] else None
    return rope


def _relative_table_grid(params):
    """The square patch grid of a BEiT relative position table, or None."""
    table = params.get(RELATIVE_TABLE)
    return None if table is None or table.ndim != 2 else relative_position_grid(table.shape[0])


def _is_square(n):
    return n > 0 and math.isqrt(n) ** 2 == n


def posemb_without_prefix(rows, prefix):
    """Whether a position embedding of `rows` rows covers the patch grid
    alone (timm's `no_embed_class`: DeiT-III, DINOv2 with registers) though
    the checkpoint has `prefix` prefix tokens: `rows` is a square and
    `rows - prefix` is not."""
    return prefix > 0 and not _is_square(rows - prefix) and _is_square(rows)


def mlp_of(rows_in, rows_out):
    """`(mlp, mlp_dim)` of a block whose first MLP Dense has `rows_in`
    outputs and whose second takes `rows_out` inputs (None: unknown): the
    GELU MLP takes what the first gives; the packed SwiGLU gives twice what
    the second takes (`TransformerBlock(mlp="swiglu")`).

    >>> mlp_of(3072, 3072), mlp_of(8192, 4096), mlp_of(3072, None)
    (('gelu', 3072), ('swiglu', 4096), ('gelu', 3072))
    """
    if rows_out is not None and rows_in == 2 * rows_out:
        return "swiglu", int(rows_out)
    return "gelu", int(rows_in)


def describe(params):
    """Reads family, head, pre_logits, classifier and grid from the keys."""
    head = params.get("head/kernel")
    classes = int(head.shape[-1]) if head is not None else None
    pre = params.get("pre_logits/kernel")
    representation = int(pre.shape[-1]) if pre is not None else None
    if POSEMB_KEY in params or (
            "embedding/kernel" in params and f"{ATTENTION}/query/kernel" in params):
        classifier = "map" if MAP_PROBE in params else "token" if "cls" in params else "gap"
        if classifier == "token" and AVG_POOL_KEY in params:
            classifier = "avg"
        width = params["embedding/kernel"].shape[-1] if "embedding/kernel" in params else None
        if classifier == "token" and head is not None and pre is None \
                and DIST_KEY not in params and width and head.shape[0] == 2 * width:
            # a head on the class token beside the patch tokens' mean (DINOv2's)
            classifier = "token_avg"
        reg = params.get(REG_KEY)
        registers = int(reg.shape[1]) if reg is not None and reg.ndim == 3 else 0
        dist = DIST_KEY in params
        prefix = int("cls" in params) + int(dist) + registers
        if POSEMB_KEY not in params:  # RoPE (DINOv3) or relative biases (BEiT)
            return CheckpointInfo("vit", classes, representation, classifier,
                                  _relative_table_grid(params), registers, dist, False,
                                  "head_dist/kernel" in params)
        rows = int(params[POSEMB_KEY].shape[1])
        # timm's no_embed_class (DeiT-III, DINOv2 with registers): the rows are
        # the patch grid alone, the prefix tokens get no position embedding
        no_embed = posemb_without_prefix(rows, prefix)
        return CheckpointInfo("vit", classes, representation, classifier,
                              checkpoint_grid(rows, 0 if no_embed else prefix),
                              registers, dist, no_embed, "head_dist/kernel" in params)
    token_kernel = params.get("MixerBlock_0/token_mixing/Dense_0/kernel")
    if token_kernel is not None:
        return CheckpointInfo("mixer", classes, None, "gap",
                              square_grid(int(token_kernel.shape[0])))
    raise CheckpointMismatchError(
        "Not an official ViT or Mixer checkpoint: it has neither "
        f"{POSEMB_KEY!r} nor 'MixerBlock_0/token_mixing/Dense_0/kernel'. "
        f"First keys: {sorted(params)[:8]}"
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
    out = params.get(MLP_OUT)
    mlp, mlp_dim = mlp_of(int(params[MLP_IN].shape[-1]),
                          int(out.shape[0]) if out is not None and out.ndim == 2 else None)
    config = dict(
        patch_size=tuple(embedding.shape[:2]), hidden_size=int(embedding.shape[-1]),
        num_layers=len(blocks), num_heads=int(query.shape[1]), mlp_dim=mlp_dim,
        classifier=info.classifier,
    )
    # the options of the later families (#48), given only where they differ
    # from the official ViT, so that its builder arguments stay what they were
    if mlp != "gelu":
        config["mlp"] = mlp
    if LAYER_SCALE in params:
        config["layer_scale_init"] = 1e-5  # an initial value; the checkpoint's scales load
    if info.num_register_tokens:
        config["num_register_tokens"] = info.num_register_tokens
    if info.distillation_token:
        config["distillation_token"] = True
    if info.no_embed_class:
        config["no_embed_class"] = True
    if "embedding/bias" not in params:
        config["patch_bias"] = False
    if "pre_norm/scale" in params:
        config["pre_norm"] = True
    config.update(_block_options(params))
    if "conv_root/kernel" in params:
        units = {}
        for key in params:
            m = re.match(r"block(\d+)/unit(\d+)/", key)
            if m:
                stage, unit = int(m.group(1)), int(m.group(2))
                units[stage] = max(units.get(stage, 0), unit)
        config["resnet_layers"] = tuple(units[s] for s in sorted(units))
        config["resnet_width"] = int(params["conv_root/kernel"].shape[-1]) // 64
    return "vit", config


def _block_options(params):
    """The options of the RoPE families (#50) the keys show, given only
    where they differ from the official ViT."""
    options = {}
    if f"{ATTENTION}/query/bias" not in params:
        options["qkv_bias"] = "none"
    elif f"{ATTENTION}/key/bias" not in params:
        options["qkv_bias"] = "qv"
    if MLP_NORM in params:
        options["mlp_norm"] = True
    if POSEMB_KEY not in params:
        options["position_embedding"] = False
    if RELATIVE_TABLE in params:
        options["relative_position_bias"] = True
    if "fc_norm/scale" in params and "Transformer/encoder_norm/scale" not in params:
        options["fc_norm"] = True  # pooled, then normalised
    rope = rope_of(params)
    if rope is not None:
        options["rope"] = rope
    return options


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
            kind = "SwiGLU MLP" if config.get("mlp") == "swiglu" else "MLP"
            shape += [f"{config['num_heads']} heads", f"{kind} {config['mlp_dim']}"]
        else:
            shape += [f"token MLP {config['tokens_mlp_dim']}",
                      f"channel MLP {config['channels_mlp_dim']}"]
    shape.append(f"patch {_patch(config['patch_size'])}")
    if "resnet_layers" in config:
        stages = config["resnet_layers"]
        shape.insert(0, f"ResNet stages {stages}" if stages else "ResNet stem")
    if family == "vit" and info.classifier in ("gap", "token_avg"):
        shape.append(f"classifier {info.classifier!r}")
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
