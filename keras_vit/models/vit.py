"""VisionTransformer: the ViT and R+ViT hybrid builder, and the named models.

Architecture as the official `vit_jax/models_vit.py`:

```
images ─► (x - 127.5) / 127.5 ─► [ResNet root + stages] ─► Patches
  ─► PatchEncoder (projection, class token, position embedding) ─► Dropout
  ─► TransformerBlock × L ─► LayerNorm ─► pool (token | gap)
  ─► [pre_logits: Dense + tanh] ─► head
```
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import keras

from keras_vit import _checks
from keras_vit.layers import (
    BottleneckUnit,
    PatchEncoder,
    Patches,
    ResNetRoot,
    TransformerBlock,
)
from keras_vit.layers.fused import check_attention
from keras_vit.layers.resnet import resnet_arithmetic as resnet_arithmetic_args
from keras_vit.layers.rotary import RotaryEmbedding, check_rope
from keras_vit.layers.transformer import check_layer_scale_init, check_mlp, check_qkv_bias
from keras_vit.models.application import (
    ARITHMETIC_DEFAULTS,
    Encoder,
    build_application,
    mixed_precision_head_dtype,
    named_model_builder,
)
from keras_vit.models.arguments import (
    check_classes,
    check_feature_args,
    check_pooling,
    check_remat,
)
from keras_vit.variants import VIT_VARIANTS, Variant, effective_patch_size, find_variant
from keras_vit.weights.checkpoint import Checkpoint

CLASSIFIERS = ("token", "gap", "map", "token_avg", "avg")
# the classifiers with a class token
CLASS_TOKEN_CLASSIFIERS = ("token", "token_avg", "avg")


def VisionTransformer(
    patch_size: int | tuple[int, int],
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    mlp_dim: int,
    classifier: str = "token",
    representation_size: int | None = None,
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    resnet_layers: tuple[int, ...] | list[int] | None = None,
    resnet_width: int = 1,
    include_top: bool = True,
    weights: str | os.PathLike | Checkpoint | None = None,
    input_tensor: keras.KerasTensor | None = None,
    input_shape: tuple[int | None, int | None, int] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | Callable | None = "softmax",
    include_preprocessing: bool = True,
    name: str | None = None,
    gelu: str | None = None,
    layer_norm_epsilon: float | None = None,
    fc_norm: bool | None = None,
    resnet_arithmetic: str | None = None,
    image_mean: float | Sequence[float] | None = None,
    image_std: float | Sequence[float] | None = None,
    ema: bool = False,
    features_only: bool = False,
    out_indices: int | Sequence[int] | None = None,
    feature_format: str | None = None,
    remat: bool = False,
    attention: str = "auto",
    layer_scale_init: float | None = None,
    num_register_tokens: int = 0,
    distillation_token: bool = False,
    no_embed_class: bool = False,
    patch_bias: bool = True,
    pre_norm: bool = False,
    mlp: str = "gelu",
    rope: str | dict | None = None,
    qkv_bias: str = "qkv",
    mlp_norm: bool = False,
    position_embedding: bool = True,
    relative_position_bias: bool = False,
) -> keras.Model:
    """Builds a Vision Transformer or an R+ViT hybrid.

    Reference: Dosovitskiy et al., "An Image is Worth 16x16 Words:
    Transformers for Image Recognition at Scale" (ICLR 2021). The argument
    names are the official config fields.

    Args:
        patch_size: int or (h, w) patch size (on the ResNet grid for hybrids).
        hidden_size: token width D.
        num_layers: number of transformer blocks.
        num_heads: attention heads per block.
        mlp_dim: MLP hidden width (with `mlp="swiglu"`, after the gating).
        classifier: `"token"` (class token), `"gap"` (mean of all tokens),
            `"map"` (no class token; a multi-head attention-pooling head,
            `keras_vit.layers.AttentionPooling`, as SigLIP's) or
            `"token_avg"` (the head reads the class token beside the mean of
            the patch tokens: DINOv2's linear classifier, transformers'
            `Dinov2ForImageClassification`) or `"avg"` (a class token, and
            the head reads the mean of the patch tokens: timm's
            `global_pool="avg"` of EVA-02, DINOv3 and BEiT).
        representation_size: width of the `pre_logits` Dense + tanh layer,
            None for none. With checkpoint weights, None means "as the
            checkpoint has it" when its head is kept.
        dropout_rate, attention_dropout_rate: dropout rates.
        drop_path_rate: stochastic depth of the last block; block i uses
            `drop_path_rate * i / (num_layers - 1)`.
        resnet_layers: None for a pure ViT; a tuple of bottleneck-unit counts
            per stage for a hybrid (`()`: the stem only).
        resnet_width: ResNet width factor (width = 64 * factor).
        include_top: whether to include the classification head.
        weights: None, a registered name (`keras-vit models` lists them), an
            `"augreg:<filename>"`, a URL, an official `.npz` or a Keras
            `.weights.h5` file, a timm / transformers checkpoint
            (`"hf://ORG/NAME"`, a Hub folder, a `.safetensors` file), or a
            `keras_vit.weights.Checkpoint`; read once
            (`keras_vit.weights.resolve`). See docs/models.md#checkpoints.
        input_tensor: optional Keras tensor to use as image input.
        input_shape: `(height, width, 3)`, multiples of the patch size
            (times the ResNet stride for hybrids); defaults to the
            checkpoint's resolution, else 224. Another size than the
            checkpoint's resizes the position embeddings once, at loading
            (bilinear, aligned corners). `(None, None, 3)`: one model for
            any image size at call time. Channels last always: a shape
            that reads as channels-first, e.g. `(3, 224, 224)`, is a
            `ValueError`. See docs/models.md#kerasapplications-conventions.
        pooling: with `include_top=False`: None, the token sequence after
            the final LayerNorm `(batch, tokens, hidden_size)`; `"token"`
            or `"gap"`, the official pooled vector (with `pre_logits` if the
            model has one); `"avg"` or `"max"`, the keras.applications
            feature vector over the patch tokens, no `pre_logits`;
            `"token_avg"`, the class token beside the patch tokens' mean
            (`2 * hidden_size`); `"distilled"` (with a distillation
            token), the mean of the class and distillation tokens (timm's
            DeiT without head); `"map"`, a classifier="map" model's pooling
            head.
        classes: number of classes; None keeps the checkpoint's head (1000
            without weights). Another number replaces the head by a
            zero-initialised one and drops `pre_logits`.
        classifier_activation: activation of the head; None for logits.
        include_preprocessing: True: the model takes raw pixels in
            [0, 255] and normalises them itself (`keras_vit.preprocess_input`
            is a pass-through); False: it takes
            `keras_vit.normalize_pixels(x)`.
        name: model name.
        gelu, layer_norm_epsilon, fc_norm, resnet_arithmetic, image_mean,
            image_std: the arithmetic. None (the default): a timm or
            transformers checkpoint's, else the official one:
            `gelu="tanh"` (or `"erf"`; `"quick"`: OpenAI CLIP's
            `x * sigmoid(1.702 x)`), `layer_norm_epsilon=1e-6`,
            `fc_norm=False` (True: pool, then LayerNorm),
            `resnet_arithmetic="official"` (or `"timm"`), and
            `image_mean=image_std=0.5` per channel on the [0, 1] scale.
            See docs/models.md#weights-from-the-hugging-face-hub-timm-transformers.
        ema: with a PyTorch training checkpoint as `weights` (timm's
            `train.py`, ...), load its EMA weights (`state_dict_ema` /
            `model_ema`) instead of its weights.
        features_only: a backbone for dense prediction, as timm's
            `features_only=True`: the model returns a list, the outputs of
            the blocks `out_indices` (before the final LayerNorm); no head,
            final LayerNorm or pooling is built (`pooling`, `classes` and
            `representation_size` are a `ValueError`).
            `keras_vit.models.feature_info(model)` describes the outputs.
            See docs/models.md#features_onlytrue-a-backbone-for-detection-and-segmentation-heads.
        out_indices: with `features_only=True`, as timm's: block indices
            (negative: from the end), or an int n: the last n blocks; None:
            the last 3.
        feature_format: with `features_only=True`, `"nhwc"` (None, the
            default): `(batch, H / p, W / p, hidden_size)` maps of the patch
            tokens (class, distillation and register tokens left out);
            `"tokens"`: the token sequence, those tokens first.
        remat: rematerialise each transformer block in training (gradient
            checkpointing): less memory, more compute, the same outputs
            and gradients. Saved in the blocks' configs. See
            docs/models.md#remattrue-per-block-rematerialisation-gradient-checkpointing.
        attention: `"auto"` (the default), `"dot_product"` or `"fused"`:
            the same function through flash-attention kernels or the
            explicit oneDNN-fused path; `"auto"` takes the one that measured
            faster on the backend and device. Saved in the blocks' configs.
            See docs/models.md#attention-which-kernels-compute-the-attention.
        layer_scale_init: None (the default, the official block) or the
            initial value of a learned per-channel LayerScale on each
            residual branch (DINOv2: 1e-5, DeiT-III: 1e-6).
        num_register_tokens: learned register tokens after the class token
            (DINOv2-reg); `"gap"` then averages the patch tokens only.
        distillation_token: a distillation token after the class token
            (DeiT distilled). The head is DeiT's distilled classifier: a
            head on the class token and one on the distillation token,
            averaged (as DeiT at inference; built as one Dense named "head"
            on the two tokens side by side, `(2 * hidden_size, classes)`),
            unless `weights` hold a head on the class token alone
            (transformers' `DeiTForImageClassification`).
        no_embed_class: position embeddings of the patch grid only, the
            prefix tokens get none (timm's `no_embed_class`).
        patch_bias: whether the patch projection has a bias (False: OpenAI
            CLIP).
        pre_norm: a LayerNorm after the embeddings, before the blocks
            (OpenAI CLIP's `ln_pre`), named `"pre_norm"`.
            See docs/models.md#tokens-and-embeddings-of-later-families.
        mlp: the blocks' MLP, `"gelu"` (the default: Dense, GELU, Dense) or
            `"swiglu"`: one Dense to `2 * mlp_dim`, SiLU of its first half
            times its second half, Dense (DINOv2's ViT-g/14, timm's
            `SwiGLUPacked`); `gelu` then only sets a `"map"` head's.
            See docs/models.md#blocks-and-heads-of-later-families.
        rope: None (the default: no rotary embedding) or a 2-D rotary
            position embedding of the queries and keys, computed from the
            grid of each call (`keras_vit.layers.RotaryEmbedding`):
            `"dinov3"`, `"eva"`, or a dict with its `temperature` and EVA's
            `ref_grid` (`keras_vit.layers.rotary.check_rope`). None with
            weights: the checkpoint's.
        qkv_bias: the attention projections' biases, `"qkv"` (the
            default), `"qv"` (no key bias: BEiT, EVA-02) or `"none"`
            (DINOv3).
        mlp_norm: a LayerNorm inside each MLP, before its second Dense
            (EVA-02's sub-LayerNorm).
        position_embedding: False: no learned position embedding (DINOv3,
            whose positions are its RoPE; BEiT).
        relative_position_bias: BEiT's per-block relative position bias
            table over the model's patch grid (the model then takes one
            image size, resized from the checkpoint's at loading).

    Returns:
        A functional `keras.Model`.

    Example:

    >>> model = VisionTransformer(
    ...     patch_size=4, hidden_size=48, num_layers=2, num_heads=3,
    ...     mlp_dim=96, input_shape=(32, 32, 3), classes=10)
    >>> model.output_shape
    (None, 10)
    """
    return vision_transformer_model(None, **locals())


def vision_transformer_model(
    variant: Variant | None, *, patch_size, hidden_size, num_layers, num_heads, mlp_dim,
    classifier, representation_size, dropout_rate, attention_dropout_rate, drop_path_rate,
    resnet_layers, resnet_width, include_top, weights, input_tensor, input_shape, pooling,
    classes, classifier_activation, include_preprocessing, name, gelu, layer_norm_epsilon,
    fc_norm, resnet_arithmetic, image_mean, image_std, ema, features_only, out_indices,
    feature_format, remat, attention, layer_scale_init, num_register_tokens,
    distillation_token, no_embed_class, patch_bias, pre_norm, mlp, rope=None,
    qkv_bias="qkv", mlp_norm=False, position_embedding=True, relative_position_bias=False,
) -> keras.Model:
    """`VisionTransformer` with every argument given, built as the named
    `variant`: a row of `keras_vit.variants.HUB_VARIANTS` (its name in
    messages, its `image_size` the input side without weights, the
    arithmetic of its config where neither an argument nor the checkpoint
    gives one), or None: the official variant of the architecture, if any
    (`find_variant`). `keras_vit.models.families` builds its named models
    through it."""
    patch, hidden_size, num_layers, num_heads, mlp_dim, resnet_layers = _check_architecture(
        patch_size, hidden_size, num_layers, num_heads, mlp_dim, classifier,
        representation_size, dropout_rate, attention_dropout_rate, drop_path_rate,
        resnet_layers, resnet_width)
    layer_scale_init = check_layer_scale_init(layer_scale_init)
    mlp = check_mlp(mlp)
    qkv_bias = check_qkv_bias(qkv_bias)
    check_rope(rope)
    mlp_norm, position_embedding, relative_position_bias = (
        _checks.boolean(v, n) for v, n in ((mlp_norm, "mlp_norm"),
                                          (position_embedding, "position_embedding"),
                                          (relative_position_bias, "relative_position_bias")))
    if relative_position_bias and classifier not in CLASS_TOKEN_CLASSIFIERS:
        raise ValueError(
            "relative_position_bias=True is BEiT's table, which has rows for a class token; "
            f"classifier={classifier!r} has none. Use classifier='avg' or 'token'.")
    out_indices, feature_format = check_feature_args(
        features_only, out_indices, feature_format, num_layers, pooling=pooling,
        classes=classes, representation_size=representation_size)
    include_top = include_top and out_indices is None
    remat = check_remat(remat)
    num_register_tokens = _checks.non_negative_int(num_register_tokens, "num_register_tokens")
    attention = check_attention(attention)
    classes = check_classes(classes)
    pooling = _check_model_pooling(pooling, include_top, classifier, distillation_token)
    config = dict(patch_size=patch, hidden_size=hidden_size, num_layers=num_layers,
                  num_heads=num_heads, mlp_dim=mlp_dim, resnet_layers=resnet_layers,
                  resnet_width=resnet_width)
    later = dict(qkv_bias=qkv_bias, mlp_norm=mlp_norm, position_embedding=position_embedding,
                 relative_position_bias=relative_position_bias)
    if variant is None:
        # an official variant has the GELU MLP and the official blocks
        official = mlp == "gelu" and later == _OFFICIAL_BLOCKS and rope is None
        variant = find_variant("vit", config) if official else None

    def encode(x, grid_size, arith):
        return vit_encoder(
            x, **config, grid_size=grid_size,
            use_class_token=classifier in CLASS_TOKEN_CLASSIFIERS,
            dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=drop_path_rate, gelu=arith["gelu"],
            layer_norm_epsilon=arith["layer_norm_epsilon"],
            resnet_arithmetic=arith["resnet_arithmetic"], remat=remat,
            layer_scale_init=layer_scale_init,
            attention=attention, num_register_tokens=num_register_tokens,
            distillation_token=bool(distillation_token),
            no_embed_class=bool(no_embed_class), patch_bias=bool(patch_bias),
            pre_norm=bool(pre_norm), mlp=mlp, rope=arith["rope"], **later)

    encoder = Encoder(
        "vit", encode, effective_patch_size(config), classifier,
        num_prefix_tokens=int(classifier in CLASS_TOKEN_CLASSIFIERS)
        + int(bool(distillation_token))
        + num_register_tokens, norm_name="encoder_norm",
        extra_prefix_tokens=int(bool(distillation_token)) + num_register_tokens,
        distillation_token=bool(distillation_token),
        description=variant.official_name if variant else "this VisionTransformer",
        default_name="vision_transformer",
        attention_pool=dict(num_heads=num_heads, mlp_dim=mlp_dim)
        if classifier == "map" else None)
    return build_application(
        encoder, variant=variant, weights=weights, include_top=include_top,
        input_tensor=input_tensor, input_shape=input_shape, pooling=pooling,
        classes=classes, classifier_activation=classifier_activation,
        include_preprocessing=include_preprocessing, name=name,
        representation_size=representation_size, gelu=gelu,
        layer_norm_epsilon=layer_norm_epsilon, fc_norm=fc_norm,
        resnet_arithmetic=resnet_arithmetic, image_mean=image_mean, image_std=image_std,
        rope=rope, ema=ema, out_indices=out_indices, feature_format=feature_format,
        default_size=variant.image_size if variant else 224,
        arithmetic_defaults={k: v for k, v in (variant.config if variant else {}).items()
                             if k in ARITHMETIC_DEFAULTS})



# the block options of later families at their defaults (the official ViT)
_OFFICIAL_BLOCKS = dict(qkv_bias="qkv", mlp_norm=False, position_embedding=True,
                        relative_position_bias=False)


def _check_model_pooling(pooling, include_top, classifier, distillation_token):
    """`pooling` (`check_pooling`) for this model: "token" and "token_avg"
    need a class token, "distilled" a distillation token, "map" a
    classifier="map" model's attention-pooling head."""
    class_token = classifier in CLASS_TOKEN_CLASSIFIERS
    if not include_top and pooling in ("token", "token_avg") and not class_token:
        raise ValueError(
            f"pooling={pooling!r} needs a class token, but this model has "
            f"classifier={classifier!r}. Use pooling='gap'.")
    if not include_top and pooling == "distilled" and not distillation_token:
        raise ValueError(
            "pooling='distilled' averages the class and distillation tokens; this model "
            "has no distillation token (distillation_token=False). Use pooling='token'.")
    own = (("token", "gap", "token_avg", "avg") + (("distilled",) if distillation_token else ())
           if class_token else ("gap", "map") if classifier == "map" else ("gap",))
    return check_pooling(pooling, include_top, own)


def _check_architecture(patch_size, hidden_size, num_layers, num_heads, mlp_dim, classifier,
                        representation_size, dropout_rate, attention_dropout_rate,
                        drop_path_rate, resnet_layers, resnet_width):
    """`VisionTransformer`'s architecture arguments, checked: `(patch,
    hidden_size, num_layers, num_heads, mlp_dim, resnet_layers)`."""
    patch = _checks.positive_int_pair(patch_size, "patch_size")
    hidden_size = _checks.positive_int(hidden_size, "hidden_size")
    num_layers = _checks.positive_int(num_layers, "num_layers")
    num_heads = _checks.positive_int(num_heads, "num_heads")
    mlp_dim = _checks.positive_int(mlp_dim, "mlp_dim")
    if hidden_size % num_heads:
        raise ValueError(
            f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}."
        )
    if classifier not in CLASSIFIERS:
        raise ValueError(
            f"Unknown classifier={classifier!r}; allowed: {CLASSIFIERS}."
        )
    if representation_size is not None:
        _checks.positive_int(representation_size, "representation_size")
        if classifier in ("map", "token_avg", "avg"):
            raise ValueError(
                f"representation_size={representation_size!r} adds pre_logits after a "
                f"'token' or 'gap' pooling; classifier={classifier!r} has none. Pass None.")
    for rate_name, rate in (("dropout_rate", dropout_rate),
                            ("attention_dropout_rate", attention_dropout_rate),
                            ("drop_path_rate", drop_path_rate)):
        _checks.fraction(rate, rate_name)
    if resnet_layers is not None:
        if not isinstance(resnet_layers, (tuple, list)):
            raise TypeError(
                f"`resnet_layers` must be None or a tuple of ints, got {resnet_layers!r}."
            )
        resnet_layers = tuple(_checks.positive_int(n, "resnet_layers") for n in resnet_layers)
        _checks.positive_int(resnet_width, "resnet_width")
    return patch, hidden_size, num_layers, num_heads, mlp_dim, resnet_layers


def vit_encoder(
    x: keras.KerasTensor,
    *,
    patch_size: tuple[int, int],
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    mlp_dim: int,
    grid_size: tuple[int, int],
    use_class_token: bool = True,
    dropout_rate: float = 0.0,
    attention_dropout_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    resnet_layers: tuple[int, ...] | None = None,
    resnet_width: int = 1,
    gelu: str = "tanh",
    layer_norm_epsilon: float = 1e-6,
    resnet_arithmetic: str = "official",
    remat: bool = False,
    attention: str = "auto",
    layer_scale_init: float | None = None,
    num_register_tokens: int = 0,
    distillation_token: bool = False,
    no_embed_class: bool = False,
    patch_bias: bool = True,
    pre_norm: bool = False,
    mlp: str = "gelu",
    rope: str | dict | None = None,
    qkv_bias: str = "qkv",
    mlp_norm: bool = False,
    position_embedding: bool = True,
    relative_position_bias: bool = False,
) -> keras.KerasTensor:
    """The ViT encoder as the official `Encoder` (plus the hybrid's ResNet):
    preprocessed images `(batch, H, W, 3)` -> the token sequence `(batch,
    tokens, hidden_size)` before the final LayerNorm. Layer names are the
    official ones, so official checkpoints map onto them.

    `grid_size`: the token grid the position embedding is stored at.
    `remat`: rematerialised blocks (`TransformerBlock(remat=True)`).
    `attention`: the blocks' attention implementation
    (`TransformerBlock(attention=...)`). `layer_scale_init`: the blocks'
    LayerScale (`TransformerBlock(layer_scale_init=...)`), None for none.
    `num_register_tokens`, `distillation_token`, `no_embed_class`,
    `patch_bias` (`use_bias`): the `PatchEncoder` options; `pre_norm`: a
    LayerNorm named "pre_norm" after the embeddings (float32 under a mixed
    policy); `mlp`: the blocks' MLP (`TransformerBlock(mlp=...)`).
    `rope`: a `RotaryEmbedding` (named "rope") of the patch grid, which
    every block rotates its queries and keys by; `qkv_bias`, `mlp_norm`:
    the blocks'; `position_embedding`: the `PatchEncoder`'s
    (`use_position_embedding`); `relative_position_bias`: each block's
    BEiT table over the patch grid (a ValueError for an unknown grid).

    Example:

    >>> images = keras.Input((32, 32, 3))
    >>> vit_encoder(images, patch_size=(4, 4), hidden_size=48, num_layers=2,
    ...             num_heads=3, mlp_dim=96, grid_size=(8, 8)).shape
    (None, 65, 48)
    """
    if resnet_layers is not None:
        width = 64 * resnet_width
        stem = resnet_arithmetic_args(resnet_arithmetic)
        x = ResNetRoot(width, name="resnet_root", **stem)(x)
        for stage, units in enumerate(resnet_layers, start=1):
            for unit in range(1, units + 1):
                stride = 2 if stage > 1 and unit == 1 else 1
                x = BottleneckUnit(width * 2 ** (stage - 1), strides=stride,
                                   name=f"block{stage}_unit{unit}", **stem)(x)
    x = Patches(patch_size, name="patches")(x)
    window = None
    if relative_position_bias:
        if x.shape[1] is None or x.shape[2] is None:
            raise ValueError(
                "A model with relative_position_bias=True (BEiT) takes one image size: its "
                "tables are for one patch grid. Give input_shape=(height, width, 3).")
        window = (int(x.shape[1]), int(x.shape[2]))
    encoder = PatchEncoder(hidden_size, use_class_token=use_class_token, grid_size=grid_size,
                           num_register_tokens=num_register_tokens,
                           distillation_token=distillation_token,
                           no_embed_class=no_embed_class, use_bias=patch_bias,
                           use_position_embedding=position_embedding, name="patch_encoder")
    rope_table = None
    if rope is not None:
        rope_table = RotaryEmbedding(hidden_size // num_heads, rope,
                                     num_prefix_tokens=encoder.num_prefix_tokens,
                                     name="rope")(x)
    x = encoder(x)
    x = keras.layers.Dropout(dropout_rate, name="encoder_dropout")(x)
    if pre_norm:
        x = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=mixed_precision_head_dtype(),
            name="pre_norm")(x)
    for i in range(num_layers):
        block = TransformerBlock(
            num_heads, mlp_dim, dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=drop_path_rate * i / max(num_layers - 1, 1),
            layer_norm_epsilon=layer_norm_epsilon, gelu=gelu, remat=remat,
            attention=attention, layer_scale_init=layer_scale_init, mlp=mlp,
            qkv_bias=qkv_bias, mlp_norm=mlp_norm,
            rope=None if rope is None else check_rope(rope)["variant"],
            relative_position_bias=window, name=f"encoderblock_{i}",
        )
        x = block(x) if rope_table is None else block(x, rope=rope_table)
    return x


REGULARIZATION_ARGS = ("dropout_rate", "attention_dropout_rate", "drop_path_rate",
                       "classifier", "representation_size", "attention")

def _named(key: str) -> Callable[..., keras.Model]:
    return named_model_builder(
        VIT_VARIANTS[key], VisionTransformer, REGULARIZATION_ARGS,
        "Vision Transformer (Dosovitskiy et al., 2021).",
    )


ViTTi16 = _named("Ti/16")
ViTS16 = _named("S/16")
ViTS32 = _named("S/32")
ViTB8 = _named("B/8")
ViTB16 = _named("B/16")
ViTB32 = _named("B/32")
ViTL16 = _named("L/16")
ViTL32 = _named("L/32")
ViTH14 = _named("H/14")
RViTTi16 = _named("R+Ti/16")
R26ViTS32 = _named("R26+S/32")
R26ViTB32 = _named("R26+B/32")
R50ViTB16 = _named("R50+B/16")
R50ViTL32 = _named("R50+L/32")
