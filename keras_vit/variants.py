"""The one table of model variants (official `vit_jax/configs/models.py`,
and the families whose weights are on the Hugging Face Hub).

Keys are the paper names ("B/16", "R50+B/16", ...). Each entry holds the
builder arguments, the official checkpoint model name (the file name under
`gs://vit_models/<family>/`), the AugReg file prefix and the public function
name in `keras_vit`. Every list of model names (the public API, the
command line's choices, the registry's tables) is derived from it.

`HUB_VARIANTS` (#48, #50): DINOv2 (with registers), DeiT, DeiT-III, CLIP,
SigLIP, DINOv3, EVA-02, BEiT and BEiTv2, `VisionTransformer`s whose config holds their
architecture and their arithmetic (GELU form, LayerNorm epsilon, input mean
and std, RoPE), with
their native image size and Hub repositories. They have no official
`.npz` files (`release` is not "official"), so the registry has no
`weights=` names for them.

Pure data: the bottom floor of the package (imports nothing of it, no Keras).

>>> VIT_VARIANTS["B/16"].function, VIT_VARIANTS["B/16"].config["hidden_size"]
('ViTB16', 768)
>>> HUB_VARIANTS["DINOv2-S/14"].function, HUB_VARIANTS["DINOv2-S/14"].image_size
('DINOv2ViTS14', 518)
>>> len(ALL_VARIANTS), len(HUB_VARIANTS)
(56, 36)
"""

import dataclasses

from keras_vit._checks import did_you_mean

OFFICIAL = "official"


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str             # "B/16"
    family: str          # "vit" | "mixer": the builder, and the checkpoints it loads
    function: str        # "ViTB16"
    official_name: str   # "ViT-B_16" (checkpoint file stem; the model's name in messages)
    config: dict         # VisionTransformer / MLPMixer arguments
    augreg_name: str = None  # "B_16": prefix of AugReg files, if any
    # Who released the weights: "official" (google-research/vision_transformer,
    # the registry's .npz files) or a family whose weights are on the Hugging
    # Face Hub only: "dinov2", "deit", "deit3", "clip", "siglip", "dinov3", "eva02", "beit",
    # "beitv2".
    release: str = OFFICIAL
    image_size: int = 224    # the default input side without weights
    hub: tuple = ()          # Hub repositories of its weights, timm's first

    @property
    def module(self):
        """The module of `keras_vit.models` that defines `function`."""
        return self.family if self.release == OFFICIAL else "families"


def _vit(size, patch, **extra):
    base = {
        "Ti": dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768),
        "S": dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536),
        "B": dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072),
        "L": dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096),
        "H": dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120),
        # DINOv2's ViT-g (its SwiGLU MLP's hidden width: (int(4 x 1536 x 2/3) + 7) // 8 x 8)
        "g": dict(hidden_size=1536, num_layers=40, num_heads=24, mlp_dim=4096),
        # SigLIP's shape-optimised ViT (Alabdulmohsin et al., 2023; big_vision's "So400m")
        "So400m": dict(hidden_size=1152, num_layers=27, num_heads=16, mlp_dim=4304),
    }[size]
    return dict(patch_size=patch, **base, **extra)


def _mixer(size, patch):
    base = {
        "S": dict(hidden_size=512, num_blocks=8, tokens_mlp_dim=256,
                  channels_mlp_dim=2048),
        "B": dict(hidden_size=768, num_blocks=12, tokens_mlp_dim=384,
                  channels_mlp_dim=3072),
        "L": dict(hidden_size=1024, num_blocks=24, tokens_mlp_dim=512,
                  channels_mlp_dim=4096),
    }[size]
    return dict(patch_size=patch, **base)


_TABLE = [
    # key, function, official name, config, AugReg prefix
    ("Ti/16", "ViTTi16", "ViT-Ti_16", _vit("Ti", 16), "Ti_16"),
    ("S/16", "ViTS16", "ViT-S_16", _vit("S", 16), "S_16"),
    ("S/32", "ViTS32", "ViT-S_32", _vit("S", 32), "S_32"),
    ("B/8", "ViTB8", "ViT-B_8", _vit("B", 8), "B_8"),
    ("B/16", "ViTB16", "ViT-B_16", _vit("B", 16), "B_16"),
    ("B/32", "ViTB32", "ViT-B_32", _vit("B", 32), "B_32"),
    ("L/16", "ViTL16", "ViT-L_16", _vit("L", 16), "L_16"),
    ("L/32", "ViTL32", "ViT-L_32", _vit("L", 32), None),
    ("H/14", "ViTH14", "ViT-H_14", _vit("H", 14), None),
    # Hybrids. The stem alone has output stride 4: R+Ti/16 uses 8x8 patches
    # on it (official comment says /16; the effective patch is 32 pixels).
    ("R+Ti/16", "RViTTi16", "R+ViT-Ti_16",
     _vit("Ti", 8, resnet_layers=(), resnet_width=1), "R_Ti_16"),
    # R26 = 4 stages of 2 units: output stride 32, 1x1 patches.
    ("R26+S/32", "R26ViTS32", "R26+ViT-S_32",
     _vit("S", 1, resnet_layers=(2, 2, 2, 2), resnet_width=1), "R26_S_32"),
    # Official `get_r26_b32_config`: ViT-B/32 on the same R26 stem
    # (101,383,976 parameters in the official `models_test.py`). Released as
    # `gs://vit_models/imagenet21k/R26+ViT-B_32.npz` only; no AugReg files.
    ("R26+B/32", "R26ViTB32", "R26+ViT-B_32",
     _vit("B", 1, resnet_layers=(2, 2, 2, 2), resnet_width=1), None),
    # "R50" with (3, 4, 9) units: output stride 16, 1x1 patches.
    ("R50+B/16", "R50ViTB16", "R50+ViT-B_16",
     _vit("B", 1, resnet_layers=(3, 4, 9), resnet_width=1), None),
    ("R50+L/32", "R50ViTL32", "R50+ViT-L_32",
     _vit("L", 1, resnet_layers=(3, 4, 6, 3), resnet_width=1), "R50_L_32"),
]

_MIXER_TABLE = [
    # Mixer-S/8: not in the official `models.py`, but released as
    # `gs://mixer_models/gsam/Mixer-S_8.npz` (bucket listing in the official
    # `vit_jax.ipynb`); the Mixer paper's S width/depth with 8x8 patches.
    ("S/8", "MixerS8", "Mixer-S_8", _mixer("S", 8)),
    ("S/16", "MixerS16", "Mixer-S_16", _mixer("S", 16)),
    ("S/32", "MixerS32", "Mixer-S_32", _mixer("S", 32)),
    ("B/16", "MixerB16", "Mixer-B_16", _mixer("B", 16)),
    ("B/32", "MixerB32", "Mixer-B_32", _mixer("B", 32)),
    ("L/16", "MixerL16", "Mixer-L_16", _mixer("L", 16)),
]

# The arithmetic of the Hub families: VisionTransformer arguments that the
# weights do not show. Input mean and std are on the [0, 1] scale.
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_IMAGENET = dict(layer_norm_epsilon=1e-6, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)


def _dinov2(size, registers=False):
    # timm's vit_*_patch14_dinov2 (init_values=1e-5, erf GELU, eps 1e-6);
    # with registers its vit_*_patch14_reg4_dinov2: 4 registers, and position
    # embeddings of the patch grid only; ViT-g's MLP is a SwiGLU (timm's
    # SwiGLUPacked; SiLU, its "gelu" unused)
    extra = dict(num_register_tokens=4, no_embed_class=True) if registers else {}
    if size == "g":
        extra["mlp"] = "swiglu"
    return _vit(size, 14, layer_scale_init=1e-5, gelu="erf", **_IMAGENET, **extra)


def _deit(size, deit3=False, distilled=False):
    # timm's deit_*: the plain ViT with erf GELU and ImageNet mean/std;
    # deit3_*: LayerScale (init_values=1e-6) and no_embed_class;
    # deit_*_distilled_*: a distillation token, and its head beside the class
    # token's (the two averaged)
    extra = dict(layer_scale_init=1e-6, no_embed_class=True) if deit3 else \
        dict(distillation_token=True) if distilled else {}
    return _vit(size, 16, gelu="erf", **_IMAGENET, **extra)


def _clip(size, patch):
    # OpenAI CLIP's image tower: ln_pre, conv1 without bias, QuickGELU, eps 1e-5
    return _vit(size, patch, pre_norm=True, patch_bias=False, gelu="quick",
                layer_norm_epsilon=1e-5, image_mean=CLIP_MEAN, image_std=CLIP_STD)


def _dinov3(size, plus=False):
    # timm's vit_*_patch16_dinov3 (Simeoni et al., 2025): 4 registers, no
    # position embedding but RoPE (periods from a base of 100, patch centres in
    # [-1, 1]), LayerScale 1e-5, no query-key-value bias, eps 1e-5, the patch
    # tokens' mean after the final norm (timm's global_pool="avg"); S+ and H+:
    # a SwiGLU MLP (SiLU, the "gelu" unused) of 4 x width, H+ with 20 heads
    config = _vit(size, 16, **(dict(mlp="swiglu") if plus else {}))
    if size == "H":
        config["num_heads"] = 20
    return dict(config, layer_scale_init=1e-5, num_register_tokens=4, qkv_bias="none",
                position_embedding=False, classifier="avg",
                rope={"variant": "dinov3", "temperature": 100.0}, gelu="erf",
                layer_norm_epsilon=1e-5, image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)


def _eva02(size):
    # timm's eva02_* (Fang et al., 2023): a learned position embedding and RoPE
    # (EVA's: the patch index rescaled to the 16x16 grid of its 224 px
    # pretraining, timm's ref_feat_shape), q/v biases, a SwiGLU MLP of
    # int(width x 8/3) (B and L: with a LayerNorm inside, timm's scale_mlp),
    # the patch tokens' mean then fc_norm, eps 1e-6, OpenAI CLIP's mean/std
    config = _vit(size, 14)
    config["mlp_dim"] = config["hidden_size"] * 8 // 3
    extra = dict(mlp_norm=True) if size in ("B", "L") else {}
    return dict(config, mlp="swiglu", qkv_bias="qv", classifier="avg", fc_norm=True,
                rope={"variant": "eva", "temperature": 10000.0, "ref_grid": (16, 16)},
                gelu="erf", layer_norm_epsilon=1e-6, image_mean=CLIP_MEAN, image_std=CLIP_STD,
                **extra)


def _beit(size, v2=False):
    # timm's beit_* / beitv2_* (Bao et al., 2022; Peng et al., 2022): no
    # position embedding but a relative position bias table in each block,
    # q/v biases, LayerScale (BEiT-B 0.1, the others 1e-5), the patch tokens'
    # mean then fc_norm, eps 1e-6; BEiT's inputs scaled to [-1, 1], BEiTv2's
    # with ImageNet's mean/std
    means = dict(image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD) if v2 else dict(
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    return _vit(size, 16, qkv_bias="qv", relative_position_bias=True, position_embedding=False,
                layer_scale_init=0.1 if size == "B" and not v2 else 1e-5, classifier="avg",
                fc_norm=True, gelu="erf", layer_norm_epsilon=1e-6, **means)


def _siglip(size, patch):
    # big_vision's SigLIP image tower: no class token, a MAP head, flax's
    # nn.gelu (tanh-approximate), eps 1e-6, inputs scaled to [-1, 1]
    return _vit(size, patch, classifier="map", gelu="tanh", layer_norm_epsilon=1e-6,
                image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))


_HUB_TABLE = [
    # key, function, name, release, config, native size, Hub repositories
    # DINOv2 (ViT-g/14: a SwiGLU MLP)
    ("DINOv2-S/14", "DINOv2ViTS14", "DINOv2-ViT-S_14", "dinov2", _dinov2("S"), 518,
     ("timm/vit_small_patch14_dinov2.lvd142m", "facebook/dinov2-small")),
    ("DINOv2-B/14", "DINOv2ViTB14", "DINOv2-ViT-B_14", "dinov2", _dinov2("B"), 518,
     ("timm/vit_base_patch14_dinov2.lvd142m", "facebook/dinov2-base")),
    ("DINOv2-L/14", "DINOv2ViTL14", "DINOv2-ViT-L_14", "dinov2", _dinov2("L"), 518,
     ("timm/vit_large_patch14_dinov2.lvd142m", "facebook/dinov2-large")),
    ("DINOv2-g/14", "DINOv2ViTG14", "DINOv2-ViT-g_14", "dinov2", _dinov2("g"), 518,
     ("timm/vit_giant_patch14_dinov2.lvd142m", "facebook/dinov2-giant")),
    ("DINOv2-S/14-reg", "DINOv2ViTS14Reg", "DINOv2-ViT-S_14-reg", "dinov2",
     _dinov2("S", True), 518,
     ("timm/vit_small_patch14_reg4_dinov2.lvd142m", "facebook/dinov2-with-registers-small")),
    ("DINOv2-B/14-reg", "DINOv2ViTB14Reg", "DINOv2-ViT-B_14-reg", "dinov2",
     _dinov2("B", True), 518,
     ("timm/vit_base_patch14_reg4_dinov2.lvd142m", "facebook/dinov2-with-registers-base")),
    ("DINOv2-L/14-reg", "DINOv2ViTL14Reg", "DINOv2-ViT-L_14-reg", "dinov2",
     _dinov2("L", True), 518,
     ("timm/vit_large_patch14_reg4_dinov2.lvd142m", "facebook/dinov2-with-registers-large")),
    ("DINOv2-g/14-reg", "DINOv2ViTG14Reg", "DINOv2-ViT-g_14-reg", "dinov2",
     _dinov2("g", True), 518,
     ("timm/vit_giant_patch14_reg4_dinov2.lvd142m", "facebook/dinov2-with-registers-giant")),
    # DeiT
    ("DeiT-Ti/16", "DeiTTi16", "DeiT-Ti_16", "deit", _deit("Ti"), 224,
     ("timm/deit_tiny_patch16_224.fb_in1k", "facebook/deit-tiny-patch16-224")),
    ("DeiT-S/16", "DeiTS16", "DeiT-S_16", "deit", _deit("S"), 224,
     ("timm/deit_small_patch16_224.fb_in1k", "facebook/deit-small-patch16-224")),
    ("DeiT-B/16", "DeiTB16", "DeiT-B_16", "deit", _deit("B"), 224,
     ("timm/deit_base_patch16_224.fb_in1k", "facebook/deit-base-patch16-224")),
    # DeiT distilled (the class token's head and the distillation token's, averaged)
    ("DeiT-Ti/16-distilled", "DeiTTi16Distilled", "DeiT-Ti_16-distilled", "deit",
     _deit("Ti", distilled=True), 224,
     ("timm/deit_tiny_distilled_patch16_224.fb_in1k",
      "facebook/deit-tiny-distilled-patch16-224")),
    ("DeiT-S/16-distilled", "DeiTS16Distilled", "DeiT-S_16-distilled", "deit",
     _deit("S", distilled=True), 224,
     ("timm/deit_small_distilled_patch16_224.fb_in1k",
      "facebook/deit-small-distilled-patch16-224")),
    ("DeiT-B/16-distilled", "DeiTB16Distilled", "DeiT-B_16-distilled", "deit",
     _deit("B", distilled=True), 224,
     ("timm/deit_base_distilled_patch16_224.fb_in1k",
      "facebook/deit-base-distilled-patch16-224")),
    ("DeiT3-S/16", "DeiT3S16", "DeiT3-S_16", "deit3", _deit("S", deit3=True), 224,
     ("timm/deit3_small_patch16_224.fb_in1k", "timm/deit3_small_patch16_224.fb_in22k_ft_in1k")),
    ("DeiT3-B/16", "DeiT3B16", "DeiT3-B_16", "deit3", _deit("B", deit3=True), 224,
     ("timm/deit3_base_patch16_224.fb_in1k", "timm/deit3_base_patch16_224.fb_in22k_ft_in1k")),
    ("DeiT3-L/16", "DeiT3L16", "DeiT3-L_16", "deit3", _deit("L", deit3=True), 224,
     ("timm/deit3_large_patch16_224.fb_in1k", "timm/deit3_large_patch16_224.fb_in22k_ft_in1k")),
    # CLIP: OpenAI's image towers
    ("CLIP-B/32", "CLIPViTB32", "CLIP-ViT-B_32", "clip", _clip("B", 32), 224,
     ("timm/vit_base_patch32_clip_224.openai", "openai/clip-vit-base-patch32")),
    ("CLIP-B/16", "CLIPViTB16", "CLIP-ViT-B_16", "clip", _clip("B", 16), 224,
     ("timm/vit_base_patch16_clip_224.openai", "openai/clip-vit-base-patch16")),
    ("CLIP-L/14", "CLIPViTL14", "CLIP-ViT-L_14", "clip", _clip("L", 14), 224,
     ("timm/vit_large_patch14_clip_224.openai", "openai/clip-vit-large-patch14")),
    # SigLIP: the image towers (SigLIP 2's NaFlex models are not built)
    ("SigLIP-B/16", "SigLIPViTB16", "SigLIP-ViT-B_16", "siglip", _siglip("B", 16), 224,
     ("timm/vit_base_patch16_siglip_224.webli", "google/siglip-base-patch16-224")),
    ("SigLIP-L/16", "SigLIPViTL16", "SigLIP-ViT-L_16", "siglip", _siglip("L", 16), 256,
     ("timm/vit_large_patch16_siglip_256.webli", "google/siglip-large-patch16-256")),
    ("SigLIP-So400m/14", "SigLIPSo400m14", "SigLIP-So400m_14", "siglip",
     _siglip("So400m", 14), 224,
     ("timm/vit_so400m_patch14_siglip_224.webli", "google/siglip-so400m-patch14-224")),
    # DINOv3 (#50): RoPE, registers; S+ and H+ with a SwiGLU MLP
    ("DINOv3-S/16", "DINOv3ViTS16", "DINOv3-ViT-S_16", "dinov3", _dinov3("S"), 256,
     ("timm/vit_small_patch16_dinov3.lvd1689m",)),
    ("DINOv3-S+/16", "DINOv3ViTSPlus16", "DINOv3-ViT-Splus_16", "dinov3",
     _dinov3("S", plus=True), 256, ("timm/vit_small_plus_patch16_dinov3.lvd1689m",)),
    ("DINOv3-B/16", "DINOv3ViTB16", "DINOv3-ViT-B_16", "dinov3", _dinov3("B"), 256,
     ("timm/vit_base_patch16_dinov3.lvd1689m",)),
    ("DINOv3-L/16", "DINOv3ViTL16", "DINOv3-ViT-L_16", "dinov3", _dinov3("L"), 256,
     ("timm/vit_large_patch16_dinov3.lvd1689m",)),
    ("DINOv3-H+/16", "DINOv3ViTHPlus16", "DINOv3-ViT-Hplus_16", "dinov3",
     _dinov3("H", plus=True), 256, ("timm/vit_huge_plus_patch16_dinov3.lvd1689m",)),
    # EVA-02 (#50): RoPE beside the position embedding, SwiGLU, fc_norm; fine-tuned
    ("EVA02-Ti/14", "EVA02Ti14", "EVA02-Ti_14", "eva02", _eva02("Ti"), 336,
     ("timm/eva02_tiny_patch14_336.mim_in22k_ft_in1k",)),
    ("EVA02-S/14", "EVA02S14", "EVA02-S_14", "eva02", _eva02("S"), 336,
     ("timm/eva02_small_patch14_336.mim_in22k_ft_in1k",)),
    ("EVA02-B/14", "EVA02B14", "EVA02-B_14", "eva02", _eva02("B"), 448,
     ("timm/eva02_base_patch14_448.mim_in22k_ft_in22k_in1k",
      "timm/eva02_base_patch14_448.mim_in22k_ft_in1k")),
    ("EVA02-L/14", "EVA02L14", "EVA02-L_14", "eva02", _eva02("L"), 448,
     ("timm/eva02_large_patch14_448.mim_m38m_ft_in22k_in1k",
      "timm/eva02_large_patch14_448.mim_in22k_ft_in22k_in1k")),
    # BEiT and BEiTv2 (#50): relative position bias tables (one image size),
    # q/v biases, LayerScale, fc_norm; fine-tuned on ImageNet-22k then -1k
    ("BEiT-B/16", "BEiTB16", "BEiT-B_16", "beit", _beit("B"), 224,
     ("timm/beit_base_patch16_224.in22k_ft_in22k_in1k", "microsoft/beit-base-patch16-224")),
    ("BEiT-L/16", "BEiTL16", "BEiT-L_16", "beit", _beit("L"), 224,
     ("timm/beit_large_patch16_224.in22k_ft_in22k_in1k", "microsoft/beit-large-patch16-224")),
    ("BEiTv2-B/16", "BEiTv2B16", "BEiTv2-B_16", "beitv2", _beit("B", v2=True), 224,
     ("timm/beitv2_base_patch16_224.in1k_ft_in22k_in1k",)),
    ("BEiTv2-L/16", "BEiTv2L16", "BEiTv2-L_16", "beitv2", _beit("L", v2=True), 224,
     ("timm/beitv2_large_patch16_224.in1k_ft_in22k_in1k",)),
]

VIT_VARIANTS = {
    key: Variant(key, "vit", fn, official, config, augreg)
    for key, fn, official, config, augreg in _TABLE
}
MIXER_VARIANTS = {
    key: Variant(key, "mixer", fn, official, config)
    for key, fn, official, config in _MIXER_TABLE
}
HUB_VARIANTS = {
    key: Variant(key, "vit", fn, name, config, release=release, image_size=size, hub=hub)
    for key, fn, name, release, config, size, hub in _HUB_TABLE
}
OFFICIAL_VARIANTS = {v.function: v for v in [*VIT_VARIANTS.values(), *MIXER_VARIANTS.values()]}
ALL_VARIANTS = {**OFFICIAL_VARIANTS, **{v.function: v for v in HUB_VARIANTS.values()}}


def _normalized(config):
    config = dict(config)
    for key in ("patch_size",):
        if isinstance(config.get(key), (tuple, list)) and len(set(config[key])) == 1:
            config[key] = config[key][0]
    if config.get("resnet_layers") is not None:
        config["resnet_layers"] = tuple(config["resnet_layers"])
        config.setdefault("resnet_width", 1)
    else:
        config.pop("resnet_width", None)
        config.pop("resnet_layers", None)
    return config


def find_variant(family, config):
    """Returns the official `Variant` whose architecture equals `config`, or
    None (the Hub families are named by their builders, never found: a DeiT
    has the official ViT's architecture)."""
    table = VIT_VARIANTS if family == "vit" else MIXER_VARIANTS
    wanted = _normalized(config)
    for variant in table.values():
        if _normalized(variant.config) == wanted:
            return variant
    return None


def effective_patch_size(config):
    """Pixels per token side: patch size times the ResNet stem's stride."""
    patch = config["patch_size"]
    patch = (patch, patch) if isinstance(patch, int) else tuple(patch)
    layers = config.get("resnet_layers")
    if layers is None:
        return patch
    # Root: stride 4; stage 1: stride 1; each further stage: stride 2.
    stride = 4 * 2 ** max(len(layers) - 1, 0)
    return (patch[0] * stride, patch[1] * stride)


def unknown_model_message(name, what="model", also=""):
    """The one sentence of a model name that is not a named model:
    `"Unknown --model 'ViTTI16' (did you mean 'ViTTi16'?); named models:
    ..."`. `what`: how the name was given (`"--model"`, `"model"`);
    `also`: what else is allowed (`", 'auto' or a .keras file"`).

    >>> unknown_model_message("ViTTI16", "--model")[:52]
    "Unknown --model 'ViTTI16' (did you mean 'ViTTi16'?);"
    """
    return (f"Unknown {what} {name!r}{did_you_mean(name, ALL_VARIANTS)}; named models: "
            f"{', '.join(ALL_VARIANTS)}{also}.")
