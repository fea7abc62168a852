"""Preprocessing presets, each with its source.

| preset     | what                                                          | source |
| ---------- | ------------------------------------------------------------- | ------ |
| `eval`     | decode, bilinear resize to S                                  | official `vit_jax/input_pipeline.py` eval |
| `eval_crop`| resize shorter side to S/0.875, central S crop                | big_vision `resize_small(256)|central_crop(224)` |
| `finetune` | inception crop (area 0.05-1) + horizontal flip at S           | official `vit_jax` fine-tuning train pipeline |
| `small`    | inception crop (area 0.35-1) + flip: images of 64 px or less   | keras_vit: a 5% crop of a 32 px image is 7 px |
| `digits`   | inception crop (area 0.65-1), no flip                         | keras_vit quickstart (digits are not mirror-symmetric) |
| `none` ... `strong2` | inception crop + flip + RandAugment + MixUp, the AugReg settings | big_vision `configs/vit_i1k.py` `RANDAUG_DEF` / `MIXUP_DEF` (AugReg, arXiv:2106.10270) |

AugReg settings (RandAugment `(num_ops, magnitude)`, MixUp alpha):
`none` (-, 0), `light1` ((2, 0), 0) -- magnitude 0 is not "nothing":
posterize, solarize and the enhance ops are strongest there --, `light2`
((2, 10), 0.2), `medium1` ((2, 15), 0.2), `medium2` ((2, 15), 0.5),
`strong1` ((2, 20), 0.5), `strong2` ((2, 20), 0.8).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Preset:
    """What one pipeline does to an image.

    Attributes:
        name: preset name.
        training: inception crop + flip (True) or the eval resize (False).
            RandAugment, MixUp and CutMix apply in either case when set.
        center_crop: eval only: resize-then-center-crop instead of resize.
        crop_area: area range of the inception crop (official: 0.05-1).
        flip: random horizontal flips when training.
        randaugment: `(num_ops, magnitude)` or None.
        mixup: MixUp alpha (0: off).
        cutmix: CutMix alpha (0: off). With both, each batch picks one of
            the two with probability 1/2.
        label_smoothing: applied to the one-hot labels.
        source: where the numbers come from.
    """

    name: str
    training: bool
    center_crop: bool = False
    crop_area: tuple = (0.05, 1.0)
    flip: bool = True
    randaugment: tuple = None
    mixup: float = 0.0
    cutmix: float = 0.0
    label_smoothing: float = 0.0
    source: str = ""

    def replace(self, **changes):
        """A copy of the preset with `changes` (its fields), e.g.
        `PRESETS["finetune"].replace(flip=False)`."""
        return dataclasses.replace(self, **changes)


_AUGREG = "big_vision configs/vit_i1k.py (AugReg)"
PRESETS = {
    p.name: p
    for p in [
        Preset("eval", False, source="vit_jax input_pipeline.py (eval: resize)"),
        Preset("eval_crop", False, center_crop=True,
               source="big_vision resize_small|central_crop"),
        Preset("finetune", True, source="vit_jax input_pipeline.py (train: inception crop + flip)"),
        Preset("small", True, crop_area=(0.35, 1.0),
               source="keras_vit: images of 64 px or less (a 5% crop of 32 px is 7 px)"),
        Preset("digits", True, crop_area=(0.65, 1.0), flip=False,
               source="keras_vit quickstart: digits are not mirror-symmetric"),
        Preset("none", True, source=_AUGREG),
        Preset("light1", True, randaugment=(2, 0), source=_AUGREG),
        Preset("light2", True, randaugment=(2, 10), mixup=0.2, source=_AUGREG),
        Preset("medium1", True, randaugment=(2, 15), mixup=0.2, source=_AUGREG),
        Preset("medium2", True, randaugment=(2, 15), mixup=0.5, source=_AUGREG),
        Preset("strong1", True, randaugment=(2, 20), mixup=0.5, source=_AUGREG),
        Preset("strong2", True, randaugment=(2, 20), mixup=0.8, source=_AUGREG),
    ]
}
AUGREG_PRESETS = ("none", "light1", "light2", "medium1", "medium2", "strong1", "strong2")


SMALL_IMAGE_SIZE = 64


def auto_preset(default, image_size):
    """The training preset for `image_size` when none is named: `small`
    for images of `SMALL_IMAGE_SIZE` px or less, else `default` (the
    recipe's). Returns `(name, reason)`: the reason says why, and for
    `small`, which flips images, what to use where a flip changes the class.

    >>> print(auto_preset("finetune", 32)[1])  # doctest: +NORMALIZE_WHITESPACE
    images of 32 px, <= 64: milder crops than 'finetune', random flips; for
    digits or characters, where a flip changes the class, use --preset digits
    """
    size = image_size if isinstance(image_size, int) else max(image_size)
    if size <= SMALL_IMAGE_SIZE and default in ("finetune", "none"):
        return "small", (f"images of {size} px, <= {SMALL_IMAGE_SIZE}: milder crops than "
                         f"{default!r}, random flips; for digits or characters, where a "
                         "flip changes the class, use --preset digits")
    return default, "the recipe's"


def get_preset(preset, training):
    """A `Preset` from a name, a Preset, or None (`finetune` when training,
    else `eval`)."""
    if preset is None:
        return PRESETS["finetune" if training else "eval"]
    if isinstance(preset, Preset):
        return preset
    if preset not in PRESETS:
        raise ValueError(
            f"Unknown preset {preset!r}; allowed: {sorted(PRESETS)} or a "
            "keras_vit.data.Preset."
        )
    return PRESETS[preset]
