"""Checkpoint families: registered `weights=` names -> official files.

Every file is a released `.npz` from the official buckets of
google-research/vision_transformer (`gs://vit_models`, `gs://mixer_models`),
served over HTTPS at `https://storage.googleapis.com`. Set the environment
variable `KERAS_VIT_MIRROR` to a base URL that has the same layout (an
internal mirror, a local `http.server`) to download from there instead.

The number of classes, the `pre_logits` layer and the resolution are read
from the file itself when it is loaded; the values here document what the
papers and the official README say each family holds.
"""

import dataclasses
import os
import urllib.parse

OFFICIAL_BASE_URL = "https://storage.googleapis.com"
MIRROR_ENV = "KERAS_VIT_MIRROR"


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    description: str
    folder: str            # "vit_models/imagenet21k"
    files: dict            # variant key -> file stem
    resolution: int
    classes: int
    pre_logits: bool
    source: str


def base_url():
    """The official base URL, or `$KERAS_VIT_MIRROR` when set."""
    return os.environ.get(MIRROR_ENV, OFFICIAL_BASE_URL).rstrip("/")


def url_for(folder, stem):
    """`https://storage.googleapis.com/<folder>/<stem>.npz` (quoted)."""
    path = urllib.parse.quote(f"{folder}/{stem}.npz")
    return f"{base_url()}/{path}"


_AUGREG_I21K = {
    # Recommended AugReg checkpoints: best upstream validation accuracy
    # (official README, "How to train your ViT?").
    "Ti/16": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "S/32": "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
    "S/16": "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "B/32": "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "B/16": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "L/16": "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
    "R+Ti/16": "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "R26+S/32": "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "R50+L/32": "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
}
# ImageNet-2012 fine-tunes of the recommended checkpoints at 384 (official
# README table; the fine-tuning learning rate is part of the file name).
_AUGREG_FT_LR = {
    "Ti/16": "0.03", "S/32": "0.01", "S/16": "0.03", "B/32": "0.01",
    "B/16": "0.03", "L/16": "0.01", "R+Ti/16": "0.03", "R26+S/32": "0.01",
    "R50+L/32": "0.01",
}
_AUGREG_I1K = {
    key: f"{stem}--imagenet2012-steps_20k-lr_{_AUGREG_FT_LR[key]}-res_384"
    for key, stem in _AUGREG_I21K.items()
}

VIT_FAMILIES = {
    f.name: f
    for f in [
        Family(
            "imagenet21k",
            "ImageNet-21k pre-training (ViT paper)",
            "vit_models/imagenet21k",
            {k: k for k in ("B/8", "B/16", "B/32", "L/16", "L/32", "H/14",
                            "R50+B/16", "R50+L/32")},
            224, 21843, True, "arXiv:2010.11929",
        ),
        Family(
            "imagenet21k+imagenet2012",
            "ImageNet-21k pre-training, ImageNet-2012 fine-tuning at 384",
            "vit_models/imagenet21k+imagenet2012",
            {k: k for k in ("B/16", "B/32", "L/16", "L/32", "R50+B/16")},
            384, 1000, False, "arXiv:2010.11929",
        ),
        Family(
            "imagenet21k+imagenet2012-224",
            "ImageNet-21k pre-training, ImageNet-2012 fine-tuning at 224 "
            "(the '-224' files)",
            "vit_models/imagenet21k+imagenet2012",
            {"B/16": "B/16-224", "L/16": "L/16-224"},
            224, 1000, False, "arXiv:2010.11929",
        ),
        Family(
            "sam",
            "ImageNet-2012 from scratch with SAM, no strong augmentation",
            "vit_models/sam",
            {k: k for k in ("S/16", "S/32", "B/16", "B/32")},
            224, 1000, False, "arXiv:2106.01548",
        ),
        Family(
            "gsam",
            "ImageNet-2012 from scratch with GSAM",
            "vit_models/gsam",
            {k: k for k in ("S/16", "S/32", "B/16", "B/32")},
            224, 1000, False, "arXiv:2203.08065",
        ),
        Family(
            "augreg",
            "AugReg ImageNet-21k pre-training, recommended checkpoint",
            "vit_models/augreg",
            _AUGREG_I21K,
            224, 21843, False, "arXiv:2106.10270",
        ),
        Family(
            "augreg+imagenet2012",
            "AugReg recommended checkpoint fine-tuned on ImageNet-2012 at 384",
            "vit_models/augreg",
            _AUGREG_I1K,
            384, 1000, False, "arXiv:2106.10270",
        ),
    ]
}

MIXER_FAMILIES = {
    f.name: f
    for f in [
        Family("imagenet1k", "ImageNet-2012 pre-training (Mixer paper)",
               "mixer_models/imagenet1k", {k: k for k in ("B/16", "L/16")},
               224, 1000, False, "arXiv:2105.01601"),
        Family("imagenet21k", "ImageNet-21k pre-training (Mixer paper)",
               "mixer_models/imagenet21k", {k: k for k in ("B/16", "L/16")},
               224, 21843, False, "arXiv:2105.01601"),
        Family("sam", "ImageNet-2012 from scratch with SAM",
               "mixer_models/sam",
               {k: k for k in ("S/16", "S/32", "B/16", "B/32")},
               224, 1000, False, "arXiv:2106.01548"),
        Family("gsam", "ImageNet-2012 from scratch with GSAM",
               "mixer_models/gsam",
               {k: k for k in ("S/16", "S/32", "B/16", "B/32")},
               224, 1000, False, "arXiv:2203.08065"),
    ]
}

AUGREG_PREFIX = "augreg:"


@dataclasses.dataclass(frozen=True)
class RemoteCheckpoint:
    """A registered checkpoint resolved for one model variant."""

    weights: str      # the name the user passed
    url: str
    filename: str     # cache file name


def families_for(variant):
    table = VIT_FAMILIES if variant.family == "vit" else MIXER_FAMILIES
    return {name: f for name, f in table.items() if variant.key in f.files}


def available_weights(variant):
    """Registered names valid for `variant` (plus `augreg:` when it has
    AugReg files)."""
    names = list(families_for(variant))
    if variant.augreg_name:
        names.append(AUGREG_PREFIX + "<filename>")
    return names


def _file_stem(variant, file_key):
    """'B/16-224' -> 'ViT-B_16-224' for the variant's official name."""
    suffix = file_key[len(variant.key):]
    return variant.official_name + suffix


def resolve(weights, variant, model_description):
    """Returns the `RemoteCheckpoint` of a registered name for `variant`.

    Raises:
        ValueError: unknown name for this model, listing the valid ones.
    """
    valid = available_weights(variant) if variant else []
    if weights.startswith(AUGREG_PREFIX):
        filename = weights[len(AUGREG_PREFIX):]
        if filename.endswith(".npz"):
            filename = filename[:-4]
        if variant is None or not variant.augreg_name:
            raise ValueError(
                f"{model_description} has no AugReg checkpoints; "
                f"weights={weights!r} is not available. Valid: "
                f"{_listing(valid)}."
            )
        prefix = filename.split("-")[0]
        if prefix != variant.augreg_name or not filename:
            raise ValueError(
                f"AugReg file {filename!r} is not a {variant.key} checkpoint: "
                f"AugReg files for {model_description} start with "
                f"'{variant.augreg_name}-' (see "
                f"{url_for('vit_models/augreg', 'index').replace('.npz', '.csv')})."
            )
        return RemoteCheckpoint(
            weights, url_for("vit_models/augreg", filename),
            f"augreg--{filename}.npz",
        )
    family = families_for(variant).get(weights) if variant else None
    if family is None:
        raise ValueError(
            f"Unknown weights {weights!r} for {model_description}. Valid: "
            f"{_listing(valid)}."
        )
    stem = family.files[variant.key]
    if "/" in stem:  # a variant key with a suffix, e.g. "B/16-224"
        stem = _file_stem(variant, stem)
    folder_tag = family.folder.replace("/", "--").replace("+", "_")
    return RemoteCheckpoint(
        weights, url_for(family.folder, stem), f"{folder_tag}--{stem}.npz"
    )


def _listing(valid):
    names = ", ".join(repr(v) for v in valid) if valid else "(no registered checkpoints)"
    return (
        f"None, {names}, or the path to an official .npz or a Keras "
        ".weights.h5 file"
    )
