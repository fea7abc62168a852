"""Checkpoint families: registered `weights=` names -> official files.

Every file is a released `.npz` from the official buckets of
google-research/vision_transformer (`gs://vit_models`, `gs://mixer_models`),
served over HTTPS at `https://storage.googleapis.com`. Set the environment
variable `KERAS_VIT_MIRROR` to a base URL that has the same layout (an
internal mirror, a local `http.server`) to download from there instead.

The registry holds exactly the files an official source lists; each family
says which source in `evidence` (quoted in the comments below). The sources:

- LISTING: the official `vit_jax.ipynb` (google-research/vision_transformer
  @ c6de1e5), cell "# Shows all available pre-trained models.", whose saved
  output is `gsutil ls -lh gs://vit_models/imagenet*`,
  `gsutil ls -lh gs://vit_models/sam` and `gsutil ls -lh gs://mixer_models/*`.
- README: the official `README.md` at the same commit.
- AUGREG_COLAB: the official `vit_jax_augreg.ipynb`, cell "# Note that this
  dataframe contains the models from the "i21k_300" column of table 3",
  whose saved output lists the recommended checkpoint (best upstream
  validation accuracy) of each AugReg model with its ImageNet fine-tune.

The number of classes, the `pre_logits` layer and the resolution are read
from the file itself when it is loaded; the values here document what the
sources say each family holds.

`weights="imagenet"` (the keras.applications habit) is an alias: the
official ImageNet-1k classifier with the best documented top-1 for the
variant, at its own resolution (`IMAGENET_CHOICES`, with the number and
where it is written).

>>> from keras_vit.variants import VIT_VARIANTS
>>> lookup("imagenet", VIT_VARIANTS["B/16"], "ViT-B_16").url.rsplit("/", 1)[-1]
'B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'
"""

import dataclasses
import decimal
import hashlib
import math
import os
import re
import urllib.parse

from keras_vit.variants import OFFICIAL, OFFICIAL_VARIANTS

OFFICIAL_BASE_URL = "https://storage.googleapis.com"
MIRROR_ENV = "KERAS_VIT_MIRROR"
# Downloads go to `$KERAS_HOME/models/keras_vit/<filename>` (Keras' cache).
CACHE_SUBDIR = os.path.join("models", "keras_vit")

LISTING = "official vit_jax.ipynb bucket listing (gsutil ls -lh)"
README = "official README.md"
AUGREG_COLAB = "official vit_jax_augreg.ipynb recommended-checkpoint table"


@dataclasses.dataclass(frozen=True)
class Family:
    """One `weights=` name of one model family (ViT or Mixer).

    Attributes:
        name: the `weights=` value.
        description: one line for `keras-vit models` and the README.
        folder: bucket folder, e.g. `"vit_models/imagenet21k"`.
        files: variant key -> file key (`"B/16"`, `"B/16-224"`) or AugReg
            file stem.
        resolution: image side the files were trained / fine-tuned at.
        classes: classes of their head.
        pre_logits: whether they have the `pre_logits` (Dense + tanh) layer.
        source: the paper.
        evidence: the official source that lists these files.
        architecture: builder arguments the files need and the defaults do
            not give, e.g. `{"classifier": "gap", "representation_size":
            None}`; the named models (`ViTB16`, ...) apply them.
        resolutions: variant key -> resolution, where it differs from
            `resolution`.
    """

    name: str
    description: str
    folder: str
    files: dict
    resolution: int
    classes: int
    pre_logits: bool
    source: str
    evidence: str = ""
    architecture: dict = None
    resolutions: dict = None

    def resolution_for(self, key):
        """The image side of the file of variant `key`."""
        return (self.resolutions or {}).get(key, self.resolution)


def base_url():
    """The official base URL, or `$KERAS_VIT_MIRROR` when set."""
    return os.environ.get(MIRROR_ENV, OFFICIAL_BASE_URL).rstrip("/")


def url_for(folder, stem):
    """`https://storage.googleapis.com/<folder>/<stem>.npz` (quoted)."""
    path = urllib.parse.quote(f"{folder}/{stem}.npz")
    return f"{base_url()}/{path}"


def cache_root():
    """`$KERAS_HOME` (read at each call, so it can be changed at run time),
    else `~/.keras`, as Keras itself uses."""
    return os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")


def cache_path(filename):
    """Where a download named `filename` is cached:
    `$KERAS_HOME/models/keras_vit/<filename>`."""
    return os.path.join(cache_root(), CACHE_SUBDIR, filename)


# --- cache names ------------------------------------------------------------
#
# A registered name caches under a readable name of its bucket path
# (`vit_models--imagenet21k--ViT-B_16.npz`); a URL under
# `url--<digest>--<file name>`, where the digest is of the whole URL, so two
# URLs never share an entry. A URL of the official bucket (or of its
# `KERAS_VIT_MIRROR`) whose folder is a registered family's folder gets the
# registered entry: the URL `--print-url` prints and the name fill one file.


def official_url(url):
    """`url` with the `$KERAS_VIT_MIRROR` base replaced by the official one
    (what a cache name is computed from); other URLs as given.

    >>> official_url("https://storage.googleapis.com/vit_models/sam/ViT-B_16.npz")
    'https://storage.googleapis.com/vit_models/sam/ViT-B_16.npz'
    """
    mirror = os.environ.get(MIRROR_ENV, "").rstrip("/")
    if mirror and url.startswith(mirror + "/"):
        return OFFICIAL_BASE_URL + url[len(mirror):]
    return url


def download_url(url):
    """Where to download `url` from: an official-bucket URL from
    `$KERAS_VIT_MIRROR` when that is set; other URLs as given."""
    if os.environ.get(MIRROR_ENV) and url.startswith(OFFICIAL_BASE_URL + "/"):
        return base_url() + url[len(OFFICIAL_BASE_URL):]
    return url


def bucket_file_name(url):
    """The file name a URL serves, as its server names it (the last part of
    its path, unquoted): what to look for when fetching it by hand.

    >>> bucket_file_name(url_for("vit_models/imagenet21k", "R26+ViT-B_32"))
    'R26+ViT-B_32.npz'
    """
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    return path.rstrip("/").rsplit("/", 1)[-1] or "download"


def registered_filename(folder, stem):
    """The cache name of the bucket file `<folder>/<stem>.npz`:
    `"vit_models/imagenet21k+imagenet2012", "ViT-B_16"` ->
    `"vit_models--imagenet21k_imagenet2012--ViT-B_16.npz"`."""
    return f"{folder.replace('/', '--').replace('+', '_')}--{stem}.npz"


def _registered_folders():
    return {f.folder for table in (VIT_FAMILIES, MIXER_FAMILIES) for f in table.values()}


def url_cache_name(url):
    """The cache file name of a `weights=` URL (`http://` or `https://`).

    An official-bucket URL (or its `$KERAS_VIT_MIRROR` copy) in a registered
    folder gets the registered name's entry; any other URL
    `url--<16 hex digits of the SHA-256 of the URL>--<its file name>` (the
    fragment left out: it never reaches the server).

    >>> url_cache_name("https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz")
    'vit_models--imagenet21k--ViT-B_16.npz'
    >>> url_cache_name("http://host/a/model.npz")
    'url--996738c07d0f6bee--model.npz'
    >>> url_cache_name("http://host/b/model.npz")
    'url--40825320332201dc--model.npz'
    """
    canonical = urllib.parse.urldefrag(official_url(url))[0]
    parts = urllib.parse.urlsplit(canonical)
    if not parts.hostname:
        raise ValueError(f"The URL {url!r} names no host; give the checkpoint's whole URL, "
                         "e.g. https://HOST/PATH/FILE.npz.")
    name = bucket_file_name(canonical)
    if canonical.startswith(OFFICIAL_BASE_URL + "/") and not parts.query:
        folder = urllib.parse.unquote(parts.path).strip("/").rpartition("/")[0]
        if folder in _registered_folders() and name.endswith(".npz") and len(name) > 4:
            return registered_filename(folder, name[:-4])
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._+-]", "_", name)[-100:].lstrip(".") or "download"
    return f"url--{digest}--{readable}"


# Recommended AugReg checkpoints: best upstream validation accuracy.
# README, "We recommend using the following checkpoints, trained with
# [AugReg] that have the best pre-training metrics" (the 9-row table), and
# AUGREG_COLAB for B/8 ("B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-
# sd_0.0", also big_vision's `VANITY_NAMES["howto-i21k-B/8"]`).
_AUGREG_I21K = {
    "Ti/16": "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "S/32": "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
    "S/16": "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
    "B/8": "B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
    "B/32": "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "B/16": "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
    "L/16": "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
    "R+Ti/16": "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
    "R26+S/32": "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
    "R50+L/32": "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
}
# Their ImageNet-2012 fine-tunes: README "Fine-tuned checkpoint" column
# (all "res_384"); B/8 from AUGREG_COLAB ("...--imagenet2012-steps_20k-
# lr_0.03-res_224", adapt_resolution 224). Fine-tuning learning rate and
# resolution are part of the file name.
_AUGREG_FT = {
    "Ti/16": ("0.03", 384), "S/32": ("0.01", 384), "S/16": ("0.03", 384),
    "B/8": ("0.03", 224), "B/32": ("0.01", 384), "B/16": ("0.03", 384),
    "L/16": ("0.01", 384), "R+Ti/16": ("0.03", 384), "R26+S/32": ("0.01", 384),
    "R50+L/32": ("0.01", 384),
}
_AUGREG_I1K = {
    key: f"{stem}--imagenet2012-steps_20k-lr_{_AUGREG_FT[key][0]}-res_{_AUGREG_FT[key][1]}"
    for key, stem in _AUGREG_I21K.items()
}


def _same(*keys):
    return {k: k for k in keys}


VIT_FAMILIES = {
    f.name: f
    for f in [
        Family(
            "imagenet21k",
            "ImageNet-21k pre-training (ViT paper)",
            "vit_models/imagenet21k",
            # LISTING "gs://vit_models/imagenet21k/:" R26+ViT-B_32.npz,
            # R50+ViT-B_16.npz, R50+ViT-L_32.npz, ViT-B_16.npz, ViT-B_32.npz,
            # ViT-B_8.npz, ViT-H_14.npz, ViT-L_16.npz, ViT-L_32.npz.
            _same("B/8", "B/16", "B/32", "L/16", "L/32", "H/14", "R26+B/32",
                  "R50+B/16", "R50+L/32"),
            224, 21843, True, "arXiv:2010.11929", LISTING,
        ),
        Family(
            "imagenet21k+imagenet2012",
            "ImageNet-21k pre-training, ImageNet-2012 fine-tuning at 384",
            "vit_models/imagenet21k+imagenet2012",
            # LISTING "gs://vit_models/imagenet21k+imagenet2012/:"
            # R50+ViT-B_16.npz, ViT-B_16.npz, ViT-B_32.npz, ViT-B_8.npz,
            # ViT-L_16.npz, ViT-L_32.npz (and the two -224 files below).
            # ViT-B_8 is 384 too: its 334.78 MiB are ViT-B_16's 331.4 MiB
            # plus a 48x48 instead of 24x24 position embedding, minus the
            # smaller patch kernel.
            _same("B/8", "B/16", "B/32", "L/16", "L/32", "R50+B/16"),
            384, 1000, False, "arXiv:2010.11929", LISTING,
        ),
        Family(
            "imagenet21k+imagenet2012-224",
            "ImageNet-21k pre-training, ImageNet-2012 fine-tuning at 224 "
            "(the '-224' files)",
            "vit_models/imagenet21k+imagenet2012",
            # LISTING: ViT-B_16-224.npz, ViT-L_16-224.npz; README changelog
            # 2020-10-29: 'These models have the suffix "-224" in their name.
            # They are expected to achieve 81.2% and 82.7% top-1 accuracies'.
            {"B/16": "B/16-224", "L/16": "L/16-224"},
            224, 1000, False, "arXiv:2010.11929", LISTING,
        ),
        Family(
            "sam",
            "ImageNet-2012 from scratch with SAM, no strong augmentation",
            "vit_models/sam",
            # LISTING "gs://vit_models/sam": ViT-B_16.npz, ViT-B_32.npz,
            # ViT-L_16.npz, ViT-L_32.npz, ViT-S_16.npz ("TOTAL: 5 objects").
            _same("S/16", "B/16", "B/32", "L/16", "L/32"),
            224, 1000, False, "arXiv:2106.01548", LISTING,
        ),
        Family(
            "gsam",
            "ImageNet-2012 from scratch with GSAM",
            "vit_models/gsam",
            # Not in LISTING (it lists gs://vit_models/imagenet* and /sam
            # only). README: "[`gs://vit_models/gsam`] - Models pre-trained on
            # ImageNet with [GSAM]". Official `vit_jax/configs/models.py` has
            # exactly four GSAM configs, "ViT-{S_16,B_16,S_32,B_32}-gap-norep"
            # ("classifier=gap, representation=None"), added by PR #215 "Add
            # config for ViT-XX-gap-norep ... which are compatible with GSAM
            # checkpoints". File names: the maintainer's answer in issue #195
            # ("we've consistently been using the same basename for
            # different models ... the code expects the basename to be the
            # same for every model with the same architecture"), and issue
            # #223 "There is no "cls" in gs://vit_models/gsam/ViT-B_16.npz".
            _same("S/16", "S/32", "B/16", "B/32"),
            224, 1000, False, "arXiv:2203.08065",
            README + ", vit_jax/configs/models.py gap-norep configs",
            architecture={"classifier": "gap", "representation_size": None},
        ),
        Family(
            "augreg",
            "AugReg ImageNet-21k pre-training, recommended checkpoint",
            "vit_models/augreg",
            _AUGREG_I21K,
            224, 21843, False, "arXiv:2106.10270", README + ", " + AUGREG_COLAB,
        ),
        Family(
            "augreg+imagenet2012",
            "AugReg recommended checkpoint fine-tuned on ImageNet-2012",
            "vit_models/augreg",
            _AUGREG_I1K,
            384, 1000, False, "arXiv:2106.10270", README + ", " + AUGREG_COLAB,
            resolutions={key: res for key, (_, res) in _AUGREG_FT.items() if res != 384},
        ),
    ]
}

MIXER_FAMILIES = {
    f.name: f
    for f in [
        # LISTING "gs://mixer_models/imagenet1k/:" Mixer-B_16.npz,
        # Mixer-L_16.npz; "gs://mixer_models/imagenet21k/:" the same two.
        Family("imagenet1k", "ImageNet-2012 pre-training (Mixer paper)",
               "mixer_models/imagenet1k", _same("B/16", "L/16"),
               224, 1000, False, "arXiv:2105.01601", LISTING),
        Family("imagenet21k", "ImageNet-21k pre-training (Mixer paper)",
               "mixer_models/imagenet21k", _same("B/16", "L/16"),
               224, 21843, False, "arXiv:2105.01601", LISTING),
        # LISTING "gs://mixer_models/sam/:" Mixer-B_16.npz, Mixer-B_32.npz.
        Family("sam", "ImageNet-2012 from scratch with SAM",
               "mixer_models/sam", _same("B/16", "B/32"),
               224, 1000, False, "arXiv:2106.01548", LISTING),
        # LISTING "gs://mixer_models/gsam/:" Mixer-B_16.npz, Mixer-B_32.npz,
        # Mixer-S_16.npz, Mixer-S_32.npz, Mixer-S_8.npz.
        Family("gsam", "ImageNet-2012 from scratch with GSAM",
               "mixer_models/gsam", _same("S/8", "S/16", "S/32", "B/16", "B/32"),
               224, 1000, False, "arXiv:2203.08065", LISTING),
    ]
}

# --- sizes of the official files ---------------------------------------------
#
# A download of a registered file (or of its official-bucket URL, from the
# bucket or `$KERAS_VIT_MIRROR`) must have the size an official source states
# for it; the download module refuses any other (`expected_size`). Files no
# official source gives a size for (gsam ViTs, AugReg fine-tunes, AugReg B/8,
# `augreg:<filename>`) are bounded by `KERAS_VIT_MAX_DOWNLOAD_BYTES` only.

@dataclasses.dataclass(frozen=True)
class StatedSize:
    """The size of an official file as an official source writes it, and
    the byte range that statement allows (it is rounded).

    >>> size = expected_size(url_for("vit_models/sam", "ViT-B_16"))
    >>> size.text, size.low, size.high
    ('330.3 MiB', 346339410, 346349895)
    >>> size.allows(346_340_000)
    True
    """

    text: str      # as the source writes it, e.g. "330.3 MiB"
    low: int       # bytes
    high: int
    source: str    # where it is written (LISTING, README)

    def allows(self, size):
        """Whether a file of `size` bytes has this size."""
        return self.low <= size <= self.high

    def describe(self):
        """`330.3 MiB (346,339,410 to 346,349,895 bytes) per the <source>`."""
        return f"{self.text} ({self.low:,} to {self.high:,} bytes) per the {self.source}"


_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _stated(text, rounding, source):
    """A `StatedSize` of `text` ("331.4 MiB"), exact to +-`rounding` units."""
    number, unit = text.split()
    value, rounding, scale = decimal.Decimal(number), decimal.Decimal(rounding), _UNITS[unit]
    return StatedSize(text, math.ceil((value - rounding) * scale),
                      math.floor((value + rounding) * scale), source)


# LISTING, as gsutil writes `ls -lh` sizes: in the largest unit, rounded to
# 0.01 (gsutil's `MakeHumanReadable`: `round(num / 2**exp, 2)`, "%g"), so
# "331.4 MiB" is 331.395 to 331.405 MiB. Its "TOTAL: ... bytes" lines give
# exact sums that these ranges must hold (a test checks).
_LISTED_SIZES = {
    "vit_models/imagenet21k+imagenet2012/R50+ViT-B_16.npz": "377.57 MiB",
    "vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz": "330.29 MiB",
    "vit_models/imagenet21k+imagenet2012/ViT-B_16.npz": "331.4 MiB",
    "vit_models/imagenet21k+imagenet2012/ViT-B_32.npz": "336.89 MiB",
    "vit_models/imagenet21k+imagenet2012/ViT-B_8.npz": "334.78 MiB",
    "vit_models/imagenet21k+imagenet2012/ViT-L_16-224.npz": "1.13 GiB",
    "vit_models/imagenet21k+imagenet2012/ViT-L_16.npz": "1.14 GiB",
    "vit_models/imagenet21k+imagenet2012/ViT-L_32.npz": "1.14 GiB",
    "vit_models/imagenet21k/R26+ViT-B_32.npz": "450.23 MiB",
    "vit_models/imagenet21k/R50+ViT-B_16.npz": "439.85 MiB",
    "vit_models/imagenet21k/R50+ViT-L_32.npz": "1.31 GiB",
    "vit_models/imagenet21k/ViT-B_16.npz": "393.69 MiB",
    "vit_models/imagenet21k/ViT-B_32.npz": "400.01 MiB",
    "vit_models/imagenet21k/ViT-B_8.npz": "393.72 MiB",
    "vit_models/imagenet21k/ViT-H_14.npz": "2.46 GiB",
    "vit_models/imagenet21k/ViT-L_16.npz": "1.22 GiB",
    "vit_models/imagenet21k/ViT-L_32.npz": "1.23 GiB",
    "vit_models/sam/ViT-B_16.npz": "330.3 MiB",
    "vit_models/sam/ViT-B_32.npz": "336.61 MiB",
    "vit_models/sam/ViT-L_16.npz": "1.13 GiB",
    "vit_models/sam/ViT-L_32.npz": "1.14 GiB",
    "vit_models/sam/ViT-S_16.npz": "252.57 MiB",
    "mixer_models/gsam/Mixer-B_16.npz": "228.47 MiB",
    "mixer_models/gsam/Mixer-B_32.npz": "230.04 MiB",
    "mixer_models/gsam/Mixer-S_16.npz": "70.71 MiB",
    "mixer_models/gsam/Mixer-S_32.npz": "72.91 MiB",
    "mixer_models/gsam/Mixer-S_8.npz": "78.79 MiB",
    "mixer_models/imagenet1k/Mixer-B_16.npz": "228.47 MiB",
    "mixer_models/imagenet1k/Mixer-L_16.npz": "794.29 MiB",
    "mixer_models/imagenet21k/Mixer-B_16.npz": "289.61 MiB",
    "mixer_models/imagenet21k/Mixer-L_16.npz": "875.78 MiB",
    "mixer_models/sam/Mixer-B_16.npz": "228.47 MiB",
    "mixer_models/sam/Mixer-B_32.npz": "230.04 MiB",
}
# README AugReg table ("We recommend using the following checkpoints"),
# column "Size" of the pre-trained checkpoint, in whole MiB (how it rounds is
# not stated, so +-1 MiB). B/8 is not in that table.
_README_SIZES = {
    "Ti/16": "37 MiB", "S/32": "118 MiB", "S/16": "115 MiB", "B/32": "398 MiB",
    "B/16": "391 MiB", "L/16": "1243 MiB", "R+Ti/16": "40 MiB", "R26+S/32": "170 MiB",
    "R50+L/32": "1337 MiB",
}
EXPECTED_SIZES = {
    **{path: _stated(text, "0.005", LISTING) for path, text in _LISTED_SIZES.items()},
    **{f"vit_models/augreg/{_AUGREG_I21K[key]}.npz": _stated(text, "1", README + " AugReg table")
       for key, text in _README_SIZES.items()},
}


def expected_size(url):
    """The `StatedSize` of the official file `url` serves (an official-bucket
    URL, or its `$KERAS_VIT_MIRROR` copy), or None where no official source
    states its size (and for any other URL).

    >>> expected_size(url_for("vit_models/imagenet21k", "ViT-H_14")).text
    '2.46 GiB'
    >>> expected_size("http://host/model.npz") is None
    True
    """
    canonical = urllib.parse.urldefrag(official_url(url))[0]
    parts = urllib.parse.urlsplit(canonical)
    if not canonical.startswith(OFFICIAL_BASE_URL + "/") or parts.query:
        return None
    return EXPECTED_SIZES.get(urllib.parse.unquote(parts.path).lstrip("/"))


AUGREG_PREFIX = "augreg:"
IMAGENET = "imagenet"


@dataclasses.dataclass(frozen=True)
class ImagenetChoice:
    """What `weights="imagenet"` loads for one variant."""

    weights: str      # the family name
    top1: float       # ImageNet top-1 (%) as the source states it; None: none stated
    evidence: str     # where the number (or the reason for the choice) is written


_ONLY = "the only official ImageNet-1k classifier of this model"
_README_AUGREG = "README AugReg table, 'Imagenet accuracy' column"
_README_REPLICATION = ("README 'Expected ViT results' (the imagenet21k model "
                       "fine-tuned on imagenet2012 with the official code; the "
                       "better dropout column)")
_GSAM_MIXER = ("README at 0dfc05e ('Release GSAM model checkpoints'): \"The "
               "resultant MLP-Mixers outperform those of similar sizes trained "
               "with AdamW optimizer or with the original SAM algorithm\"; no "
               "top-1 in the official README")

# The best official ImageNet-1k classifier per variant, by the top-1 the
# official sources state. AugReg fine-tunes (README: L/16 85.59%, B/16
# 85.49%, ...) beat the original imagenet21k+imagenet2012 files wherever both
# exist (README replication: B/16 84.53%, B/32 81.66%, L/16 85.05%; changelog
# "-224": 81.2%, 82.7%) and the from-scratch sam/gsam files. Variants absent
# here (ViT-H/14, R26+ViT-B/32) have no official 1k classifier.
IMAGENET_CHOICES = {
    "vit": {
        "Ti/16": ImagenetChoice("augreg+imagenet2012", 78.22, _README_AUGREG),
        "S/16": ImagenetChoice("augreg+imagenet2012", 83.73, _README_AUGREG),
        "S/32": ImagenetChoice("augreg+imagenet2012", 79.58, _README_AUGREG),
        "B/8": ImagenetChoice("augreg+imagenet2012", 85.58,
                              "vit_jax_augreg.ipynb recommended table: "
                              "adapt_final_test 0.85578 at 224"),
        "B/16": ImagenetChoice("augreg+imagenet2012", 85.49, _README_AUGREG),
        "B/32": ImagenetChoice("augreg+imagenet2012", 83.59, _README_AUGREG),
        "L/16": ImagenetChoice("augreg+imagenet2012", 85.59, _README_AUGREG),
        "L/32": ImagenetChoice("imagenet21k+imagenet2012", 81.89, _README_REPLICATION),
        "R+Ti/16": ImagenetChoice("augreg+imagenet2012", 75.40, _README_AUGREG),
        "R26+S/32": ImagenetChoice("augreg+imagenet2012", 83.85, _README_AUGREG),
        "R50+B/16": ImagenetChoice("imagenet21k+imagenet2012", 85.08, _README_REPLICATION),
        "R50+L/32": ImagenetChoice("augreg+imagenet2012", 85.99, _README_AUGREG),
    },
    "mixer": {
        "S/8": ImagenetChoice("gsam", None, _ONLY),
        "S/16": ImagenetChoice("gsam", None, _ONLY),
        "S/32": ImagenetChoice("gsam", None, _ONLY),
        "B/16": ImagenetChoice("gsam", None, _GSAM_MIXER),
        "B/32": ImagenetChoice("gsam", None, _GSAM_MIXER),
        "L/16": ImagenetChoice("imagenet1k", None, _ONLY),
    },
}


@dataclasses.dataclass(frozen=True)
class RemoteCheckpoint:
    """A registered checkpoint resolved for one model variant."""

    weights: str      # the name the user passed
    url: str
    filename: str     # cache file name
    family: object = None  # the `Family` (None for `augreg:<filename>`)


def _table(variant):  # a Hub family's variant (DINOv2, ...) has no official files
    tables = {"vit": VIT_FAMILIES, "mixer": MIXER_FAMILIES}
    return tables[variant.family] if variant.release == OFFICIAL else {}


def families_for(variant):
    """`{name: Family}` of the registered families that have `variant`."""
    return {name: f for name, f in _table(variant).items() if variant.key in f.files}


def imagenet_choice(variant):
    """The `ImagenetChoice` of `variant`, or None when it has no official
    ImageNet-1k classifier."""
    if variant is None:
        return None
    return IMAGENET_CHOICES[variant.family].get(variant.key)


def available_weights(variant):
    """Registered names valid for `variant`: `"imagenet"` when it has an
    ImageNet-1k classifier, its families, and `augreg:<filename>` when it
    has AugReg files."""
    names = [IMAGENET] if imagenet_choice(variant) else []
    names += list(families_for(variant))
    if variant.augreg_name:
        names.append(AUGREG_PREFIX + "<filename>")
    return names


def family_of(weights, variant):
    """The `Family` a registered name (or `"imagenet"`) means for `variant`;
    None for anything else (paths, URLs, unknown names, `augreg:`)."""
    if variant is None or not isinstance(weights, str):
        return None
    if weights == IMAGENET:
        choice = imagenet_choice(variant)
        weights = choice.weights if choice else None
    return families_for(variant).get(weights)


def architecture_for(weights, variant):
    """Builder arguments the files of `weights` need for `variant` (the
    family's `architecture`), `{}` when none or not a registered name."""
    family = family_of(weights, variant)
    return dict(family.architecture or {}) if family else {}


def _file_stem(variant, file_key):
    """'B/16-224' -> 'ViT-B_16-224' for the variant's official name."""
    suffix = file_key[len(variant.key):]
    return variant.official_name + suffix


def lookup(weights, variant, model_description):
    """Returns the `RemoteCheckpoint` of a registered name for `variant`.

    Args:
        weights: a registered name (`keras-vit models` lists them),
            `"imagenet"`, or `"augreg:<filename>"`.
        variant: the `keras_vit.variants.Variant`, or None for an
            architecture that is no named variant.
        model_description: the model's name in messages (`"ViT-B_16"`).

    Raises:
        ValueError: unknown name for this model, listing the valid ones;
            `"imagenet"` for a variant without an ImageNet-1k classifier.
    """
    valid = available_weights(variant) if variant else []
    if weights.startswith(AUGREG_PREFIX):
        filename = weights[len(AUGREG_PREFIX):]
        if filename.endswith(".npz"):
            filename = filename[:-4]
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", filename):
            raise ValueError(
                f"AugReg file name {filename!r} is not a file name: it may hold "
                "letters, digits and '._+-' only (no '/'), e.g. "
                f"'{AUGREG_PREFIX}{_AUGREG_I21K['B/16']}'."
            )
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
    if weights == IMAGENET and variant is not None and imagenet_choice(variant) is None:
        others = ", ".join(
            f"{name!r} ({f.classes:,} classes)" for name, f in families_for(variant).items())
        raise ValueError(
            f"{model_description} has no official ImageNet-1k classifier, so "
            f"weights='imagenet' is not available (its checkpoints: "
            f"{others or 'none'}). Valid: {_listing(valid)}."
        )
    family = family_of(weights, variant)
    if family is None:
        raise ValueError(
            f"Unknown weights {weights!r} for {model_description}. Valid: "
            f"{_listing(valid)}."
        )
    stem = family.files[variant.key]
    if "/" in stem:  # a variant key with a suffix, e.g. "B/16-224"
        stem = _file_stem(variant, stem)
    return RemoteCheckpoint(
        weights, url_for(family.folder, stem), registered_filename(family.folder, stem),
        family,
    )


def _listing(valid):
    names = ", ".join(repr(v) for v in valid) if valid else "(no registered checkpoints)"
    return (
        f"None, {names}, or the path to an official .npz or a Keras "
        ".weights.h5 file"
    )


# ------------------------------------------------- docs/models.md tables

def _variant_keys(family, kind):
    keys = list(family.files)
    return ", ".join(("Mixer " if kind == "mixer" else "") + k for k in keys)


def weights_markdown():
    """The checkpoint table of docs/models.md, rendered from the registry
    (the page holds it between `<!-- registry:weights -->` markers; a test
    compares)."""
    lines = ["| `weights=` | content | res. | classes | pre_logits | models |",
             "| --- | --- | ---: | ---: | --- | --- |"]
    for kind, table in (("vit", VIT_FAMILIES), ("mixer", MIXER_FAMILIES)):
        for f in table.values():
            name = f"`{f.name}`" + (" (Mixer)" if kind == "mixer" else "")
            res = str(f.resolution) + "".join(
                f" ({k}: {r})" for k, r in (f.resolutions or {}).items())
            content = f.description
            if f.architecture:
                content += "; builds " + ", ".join(
                    f"`{k}={v!r}`" for k, v in f.architecture.items())
            lines.append(f"| {name} | {content} | {res} | {f.classes:,} | "
                         f"{'yes' if f.pre_logits else 'no'} | {_variant_keys(f, kind)} |")
    return "\n".join(lines)


def imagenet_markdown():
    """The `weights="imagenet"` table of docs/models.md, rendered from
    `IMAGENET_CHOICES` (between `<!-- registry:imagenet -->` markers)."""
    lines = ["| model | `weights=\"imagenet\"` loads | res. | ImageNet top-1 | source |",
             "| --- | --- | ---: | ---: | --- |"]
    for function, variant in OFFICIAL_VARIANTS.items():
        choice = imagenet_choice(variant)
        if choice is None:
            lines.append(f"| `{function}` | – (no official ImageNet-1k classifier) | | | |")
            continue
        family = families_for(variant)[choice.weights]
        top1 = f"{choice.top1:.2f}%" if choice.top1 is not None else "not stated"
        lines.append(f"| `{function}` | `{choice.weights}` | "
                     f"{family.resolution_for(variant.key)} | {top1} | {choice.evidence} |")
    return "\n".join(lines)
