"""The one table of model variants (official `vit_jax/configs/models.py`).

Keys are the paper names ("B/16", "R50+B/16", ...). Each entry holds the
builder arguments, the official checkpoint model name (the file name under
`gs://vit_models/<family>/`), the AugReg file prefix and the public function
name in `keras_vit`. Every list of model names (the public API, the
command line's choices, the registry's tables) is derived from it.

Pure data: the bottom floor of the package (imports nothing of it, no Keras).

>>> VIT_VARIANTS["B/16"].function, VIT_VARIANTS["B/16"].config["hidden_size"]
('ViTB16', 768)
>>> len(ALL_VARIANTS)
20
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Variant:
    key: str             # "B/16"
    family: str          # "vit" | "mixer"
    function: str        # "ViTB16"
    official_name: str   # "ViT-B_16" (checkpoint file stem)
    config: dict         # VisionTransformer / MLPMixer arguments
    augreg_name: str = None  # "B_16": prefix of AugReg files, if any


def _vit(size, patch, **extra):
    base = {
        "Ti": dict(hidden_size=192, num_layers=12, num_heads=3, mlp_dim=768),
        "S": dict(hidden_size=384, num_layers=12, num_heads=6, mlp_dim=1536),
        "B": dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072),
        "L": dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096),
        "H": dict(hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120),
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

VIT_VARIANTS = {
    key: Variant(key, "vit", fn, official, config, augreg)
    for key, fn, official, config, augreg in _TABLE
}
MIXER_VARIANTS = {
    key: Variant(key, "mixer", fn, official, config)
    for key, fn, official, config in _MIXER_TABLE
}
ALL_VARIANTS = {v.function: v for v in [*VIT_VARIANTS.values(), *MIXER_VARIANTS.values()]}


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
    """Returns the `Variant` whose architecture equals `config`, or None."""
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
