"""DINO's and DINOv2's released ViTs (facebookresearch/dino and
facebookresearch/dinov2, `vision_transformer.py`), read as backbones.

What the files are: DINO (Caron et al., 2021, "Emerging Properties in
Self-Supervised Vision Transformers") released its self-supervised ViTs as
PyTorch files, `torch.save` of a plain state dict:
`dino_deitsmall16_pretrain.pth` (ViT-S/16), `dino_deitsmall8_pretrain.pth`
(ViT-S/8), `dino_vitbase16_pretrain.pth` (ViT-B/16) and
`dino_vitbase8_pretrain.pth` (ViT-B/8), which `torch.hub.load(
"facebookresearch/dino:main", "dino_vits16")` (`dino_vits8`,
`dino_vitb16`, `dino_vitb8`) loads. Their keys are timm's
(`patch_embed.proj`, `cls_token`, `pos_embed`, `blocks.i.attn.qkv`, ...,
`norm`), without a head. The training checkpoints beside them,
`*_pretrain_full_checkpoint.pth`, hold `student`, `teacher`, `optimizer`,
`epoch`, `args` and `dino_loss`; the weights DINO evaluates are the
teacher's `backbone.` (`keras_vit.weights.pytorch` reads them and leaves
its projection `head.` out).

DINO's arithmetic is timm's at the trained size: exact (erf) GELU
(`nn.GELU`), LayerNorm epsilon 1e-6, biased query-key-value projections,
and its forward output is the class token after the final norm
(`norm(x)[:, 0]`; no `fc_norm`, and a `head` is never applied). It differs
in two places, which the loaded model reproduces:

- the input: ImageNet mean (0.485, 0.456, 0.406) and std (0.229, 0.224,
  0.225) on [0, 1] pixels; its evaluation resizes to 256 (bicubic) and
  crops the centre 224 (`eval_linear.py`);
- the position embedding at another input size: `interpolate_pos_encoding`,
  bicubic with a `scale_factor` of `(new + 0.1) / old`, not timm's
  antialiased resize (`keras_vit.weights.posemb.interpolate_pos_encoding_dino`).

DINOv2 (Oquab et al., 2023) released its backbones the same way
(`dinov2_vits14_pretrain.pth`, `_vitb14_`, `_vitl14_`, `_vitg14_`, and
`dinov2_vits14_reg4_pretrain.pth`, ... with 4 register tokens; torch.hub
`dinov2_vits14`, ...), with the same arithmetic and resize, plus LayerScale
(`blocks.i.ls1.gamma`, `ls2.gamma`, timm's names), a `mask_token` used only
in training (left out, logged) and, with registers, `register_tokens`
inserted after the class token with no position embedding of their own.
Those are read as timm reads them (`timm.models.vision_transformer.
_convert_dinov2`): the class token's position embedding is added to the
class token, and the position embedding covers the patches only
(`no_embed_class`), which is exact at every size since DINOv2 never resizes
the class token's. ViT-g/14's MLP is a SwiGLU (`SwiGLUFFNFused`: `mlp.w12`,
a Linear to twice the hidden width `(int(4 D * 2 / 3) + 7) // 8 * 8`, 4096 at
`D` = 1536; SiLU of its first half times its second half; `mlp.w3` back to
`D`), read as timm reads it (`w12` -> `fc1`, `w3` -> `fc2`) into
`mlp="swiglu"` blocks. DINO's and DINOv2's ViTs all have heads of 64
channels: a released width without a config says its heads (ViT-g/14's
1536: 24).

Example:

```python
model = keras_vit.model_from_checkpoint("dino_deitsmall16_pretrain.pth")
model = keras_vit.model_from_checkpoint("dinov2_vits14_reg4_pretrain.pth")
features = model(images)            # (batch, 384): DINO's forward output
```
"""

import logging
import os
import re

import numpy as np

from keras_vit.weights.timm import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, architecture

LIBRARY = "dino"
# The released files (and the training checkpoints beside them), and the
# torch.hub entry points' names under which a user may save their weights.
RELEASE_NAMES = re.compile(
    r"dino_(?:deitsmall|vitbase)(?:8|16)_pretrain(?:_full_checkpoint)?\.pth"
    r"|dino_vit[sb](?:8|16)\.(?:pth|pt|bin)"
    r"|dinov2_vit[sblg]14(?:_reg4)?(?:_pretrain)?\.(?:pth|pt|bin)")
logger = logging.getLogger("keras_vit")
# Where a DINO training checkpoint keeps the weights DINO evaluates.
TEACHER = "teacher"
RESIZE_HOW = "bicubic at scale (n + 0.1) / old, no antialias (interpolate_pos_encoding)"

# The keys of DINO's VisionTransformer (num_classes=0: no head).
_KEY = re.compile(r"cls_token|pos_embed|patch_embed\.proj\.(?:weight|bias)|norm\.(?:weight|bias)"
                  r"|blocks\.\d+\.(?:norm1|attn\.qkv|attn\.proj|norm2|mlp\.fc1|mlp\.fc2"
                  r"|mlp\.w12|mlp\.w3)\.(?:weight|bias)"
                  r"|blocks\.\d+\.ls[12]\.gamma|register_tokens|mask_token")  # DINOv2's
_REQUIRED = ("patch_embed.proj.weight", "cls_token", "pos_embed", "norm.weight", "norm.bias")


def is_dino(name, where):
    """True when the weights are DINO's by where they come from: a file
    named as a DINO release (`RELEASE_NAMES`), or the `teacher` of a DINO
    training checkpoint (`where`, as `pytorch.read_torch_weights` says).

    >>> is_dino("~/Downloads/dino_vitbase8_pretrain.pth", None)
    True
    >>> is_dino("checkpoint.pth", "teacher"), is_dino("vit.pth", None)
    (True, False)
    """
    return where == TEACHER or bool(
        RELEASE_NAMES.fullmatch(os.path.basename(os.fspath(name))))


def why(name, where):
    """What made `is_dino` say so, for the log line."""
    if where == TEACHER:
        return "the teacher of a DINO training checkpoint"
    return f"its file name {os.path.basename(os.fspath(name))!r} is a DINO release's"


def layout_problem(state):
    """Why `state` (timm keys) is not DINO's ViT, or None when it is: the
    keys of DINO's `VisionTransformer` without a head, nothing else.

    >>> layout_problem({"head.weight": None})
    "it holds 'head.weight', which DINO's ViT does not have (its forward applies no head)"
    """
    extra = sorted(k for k in state if not _KEY.fullmatch(k))
    if extra:
        return (f"it holds {extra[0]!r}, which DINO's ViT does not have"
                + (" (its forward applies no head)" if extra[0].startswith("head.") else ""))
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        return f"it has no {missing[0]!r}, which DINO's ViT has"
    return None


def prepare(state, source):
    """DINOv2's layout as timm reads it (`_convert_dinov2`): `mask_token`
    left out (logged), `register_tokens` -> `reg_token` with the class
    token's position embedding added to the class token; DINO's files pass
    unchanged; ViT-g/14's SwiGLU MLP `mlp.w12`, `mlp.w3` -> `mlp.fc1`,
    `mlp.fc2` (timm's `SwiGLUPacked`, the same layout)."""
    state = {_SWIGLU.sub(lambda m: f".mlp.{_SWIGLU_NAMES[m[1]]}.", key): value
             for key, value in state.items()}
    if state.pop("mask_token", None) is not None:
        logger.info("%s: its mask_token (used by DINOv2's training only) is left out.", source)
    registers = state.pop("register_tokens", None)
    if registers is not None:
        posemb = np.asarray(state["pos_embed"])
        state["reg_token"] = registers
        state["cls_token"] = np.asarray(state["cls_token"]) + posemb[:, :1]
        state["pos_embed"] = posemb[:, 1:]
    return state


_SWIGLU = re.compile(r"\.mlp\.(w12|w3)\.")
_SWIGLU_NAMES = {"w12": "fc1", "w3": "fc2"}
# The widths of DINO's and DINOv2's released ViTs -> their heads (64 channels each).
RELEASED_HEADS = {384: 6, 768: 12, 1024: 16, 1536: 24}


def arithmetic():
    """Builder arguments reproducing DINO's arithmetic (timm's, without
    `fc_norm`)."""
    return dict(gelu="erf", layer_norm_epsilon=1e-6, fc_norm=False)


def preprocessing():
    """`{"mean", "std", ...}` of DINO's evaluation (`eval_linear.py`):
    ImageNet mean/std on the [0, 1] scale; resize to 256 (bicubic), centre
    crop 224."""
    return {"mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
            "input_size": (3, 224, 224), "interpolation": "bicubic", "crop_pct": 0.875}


def read_config(state, config=None, preprocessor=None):
    """`(family, architecture, arithmetic, preprocessing, class names)` of
    DINO's ViT: the architecture off timm's keys (DINO's files have no
    config.json), DINO's arithmetic and preprocessing, no class names."""
    family, arch = architecture(state, None)
    if not arch.get("num_heads"):  # the released ViT-g/14's width: 24 heads
        arch["num_heads"] = RELEASED_HEADS.get(arch["hidden_size"])
    return family, arch, arithmetic(), preprocessing(), None
