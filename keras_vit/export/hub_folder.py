"""`to_hub_folder`: a keras_vit classifier as a Hugging Face Hub folder that
timm or transformers opens, verified and written atomically.

The folder holds `config.json` and `model.safetensors` (plus
`preprocessor_config.json` for transformers), as `timm.models.push_to_hf.
save_for_hf` and `save_pretrained` lay them out:

- `timm`: `config.json` holds `architecture`, `model_args` (shape, GELU,
  pooling, `fc_norm`, and the options of the later families: LayerScale's
  `init_values`, `reg_tokens`, `no_embed_class`, `pre_norm`, `global_pool=
  "map"`), `pretrained_cfg` (input size, mean/std) and `label_names`;
  `timm.create_model("local-dir:DIR", pretrained=True)` opens it. The
  architecture name is a registered one whose code computes the model's
  LayerNorm epsilon (`timm_export.vit_architecture`).
- `transformers`: the class that computes the model
  (`transformers_export.transformers_class`): `ViTForImageClassification`,
  `DeiTForImageClassificationWithTeacher` (a distillation token and DeiT's
  distilled head) or `DeiTForImageClassification` (its head on the class
  token), `Dinov2ForImageClassification` or
  `Dinov2WithRegistersForImageClassification` (`classifier="token_avg"`
  with LayerScale), `SiglipForImageClassification` (`classifier="gap"`),
  see `keras_vit.weights.transformers_export`; `config.json` is
  that class's (`hidden_act`, `layer_norm_eps`, `id2label`, ...),
  `preprocessor_config.json` a `ViTImageProcessor`'s (size, mean/std);
  `<class>.from_pretrained(DIR)` opens it.

The arithmetic travels: the GELU form (`"gelu"` / `"gelu_tanh"` /
`"quick_gelu"` in timm, `"gelu"` / `"gelu_pytorch_tanh"` / `"quick_gelu"`
in transformers), the LayerNorm epsilon, timm's `fc_norm`, the input
normalisation and the class names. A model the library would compute
differently is refused with the reason (a Mixer with the official tanh
GELU for timm, whose Mixer takes its GELU from code, a patch bias that
does not go with the pre-norm as timm's does, a distillation token
with a head on the class token alone, or a SwiGLU MLP beside a `map`
head; a `map` head, a CLIP model, a hybrid, LayerScale with a
class-token head, or a SwiGLU MLP for transformers; a `pre_logits`
layer for both, ...). A SwiGLU model (DINOv2-g) is written to timm
under `vit_giant_patch14_dinov2`, whose code builds timm's `SwiGLUPacked`.

Verified like every export (`_pipeline.export_verified`): written under a
temporary name, read back by keras_vit's own reader
(`weights.hub.read_hub_checkpoint`, the same code that loads timm and
transformers folders), built into a model and compared with the Keras
model's logits on the validation images; only then renamed into place.
The tests open the folders with timm and transformers themselves.
"""

from __future__ import annotations

import dataclasses
import json
import os

import keras
import numpy as np

from keras_vit._atomic import publish
from keras_vit.export.batches import batched
from keras_vit.export._files import check_replaceable_directory
from keras_vit.export._images import Sampling
from keras_vit.export._labels import model_class_names
from keras_vit.export.model import (
    export_image_size,
    output_kind,
    require_tensorflow_backend,
)
from keras_vit.export._pipeline import ExportFormat, export_verified
from keras_vit.export._report import ExportReport
from keras_vit.layers import (
    AttentionPooling,
    BottleneckUnit,
    ImageNormalization,
    ResNetRoot,
)
from keras_vit.layers.blocks import encoder_blocks, walk_layers
from keras_vit.layers.resnet import RESNET_ARITHMETIC
from keras_vit.models.auto import model_from_checkpoint
from keras_vit.weights import timm as timm_format
from keras_vit.weights import timm_export
from keras_vit.weights import transformers as transformers_format
from keras_vit.weights import transformers_export
from keras_vit.weights.architecture import ROPE_PREFIX, architecture_from_checkpoint, describe
from keras_vit.weights.hub import read_hub_checkpoint
from keras_vit.weights.hub_layout import CONFIG, PREPROCESSOR, WEIGHTS
from keras_vit.weights.npz import AVG_POOL_KEY
from keras_vit.weights.official import official_arrays
from keras_vit.weights.safetensors import write_safetensors

EXPORT_LIBRARIES = ("timm", "transformers")
# The folder is the model's float32 weights under other names: read back, it
# computes the same logits up to float32 rounding (relative above 1).
CHECKS = {"none": {"max_abs_diff": 1e-4, "min_top1_agreement": 1.0}}


def _check_library(library):
    if library not in EXPORT_LIBRARIES:
        raise ValueError(f"library={library!r}; allowed: {EXPORT_LIBRARIES}.")


def model_arithmetic(model):
    """`{"gelu", "layer_norm_epsilon", "fc_norm", "layer_scale_init"}` of a
    keras_vit model, read off its blocks, norms and attention-pooling head
    (`layer_scale_init`: the blocks' initial LayerScale, None without),
    with `"resnet_arithmetic"` ("official", "timm" or None for another) for
    a hybrid.

    Raises:
        ValueError: blocks that differ in GELU form, LayerNorm epsilon or
            LayerScale (no library builds such a model from a config).
    """
    layers = list(walk_layers(model))
    blocks = encoder_blocks(model)
    norms = [layer for layer in layers if layer.name in (
        "encoder_norm", "pre_head_layer_norm", "fc_norm", "pre_norm")]
    pools = [layer for layer in layers if isinstance(layer, AttentionPooling)]
    gelus = {block.gelu for block in blocks} | {pool.gelu for pool in pools}
    epsilons = {float(block.layer_norm_epsilon) for block in blocks} | {
        float(norm.epsilon) for norm in norms} | {
        float(pool.layer_norm_epsilon) for pool in pools}
    scales = {getattr(block, "layer_scale_init", None) for block in blocks}
    if len(gelus) != 1 or len(epsilons) != 1 or len(scales) > 1:
        raise ValueError(
            f"{model.name!r} mixes GELU forms {sorted(gelus)}, LayerNorm epsilons "
            f"{sorted(epsilons)} or LayerScales {sorted(scales, key=str)} across its blocks; "
            "timm and transformers build one of each.")
    scale = scales.pop() if scales else None
    out = {"gelu": gelus.pop(), "layer_norm_epsilon": epsilons.pop(),
           "fc_norm": any(norm.name == "fc_norm" for norm in norms),
           "layer_scale_init": None if scale is None else float(scale)}
    stems = {(layer.standardization, layer.standardization_epsilon, layer.group_norm_epsilon)
             for layer in layers if isinstance(layer, (ResNetRoot, BottleneckUnit))}
    if stems:  # a hybrid: which named stem arithmetic (None: neither)
        out["resnet_arithmetic"] = next(
            (name for name, values in RESNET_ARITHMETIC.items() if stems == {values}), None)
    return out


def model_normalization(model):
    """`(mean, std)` per channel on the [0, 1] scale of the model's
    `preprocessing` layer (pixels in [0, 255] -> `(x - 255 mean) / (255 std)`).

    Raises:
        ValueError: a model without one (built with include_preprocessing=False).
    """
    layer = next((layer for layer in walk_layers(model) if isinstance(layer, ImageNormalization)),
                 None)
    if layer is None:
        raise ValueError(
            f"{model.name!r} has no preprocessing layer (built with "
            "include_preprocessing=False), so the folder could not say how its images are "
            "normalised; build it with include_preprocessing=True.")
    config = layer.get_config()
    mean = np.broadcast_to(np.asarray(config["mean"], "float64").reshape(-1), (3,))
    std = np.sqrt(np.broadcast_to(np.asarray(config["variance"], "float64").reshape(-1), (3,)))
    return tuple(float(m) for m in mean / 255.0), tuple(float(s) for s in std / 255.0)


@dataclasses.dataclass
class HubFolderFiles:
    """What `to_hub_folder` writes: `files` (`name -> JSON-able dict`) and
    `state` (`name -> float32 array`, `model.safetensors`)."""

    library: str
    files: dict
    state: dict


def hub_folder(model, library, size, class_names=None):
    """The `HubFolderFiles` of `model` for `library` ("timm" or "transformers"),
    in memory; its state maps back onto exactly the model's arrays.

    Raises:
        ValueError: `library` unknown, or a model the library does not
            compute the same way (the message says why).
    """
    _check_library(library)
    params = official_arrays(model)
    family, arch = architecture_from_checkpoint(params)
    info = describe(params)
    arithmetic = model_arithmetic(model)
    mean, std = model_normalization(model)
    try:
        if info.representation_size:
            raise ValueError(
                f"it has a pre_logits layer (Dense + tanh, {info.representation_size} "
                f"units) before its head, which {library}'s classifiers do not have; "
                "fine-tune a model without one (representation_size=None)")
        classes = info.classes or 0  # a model without a head is refused below
        if library == "timm":
            if info.distillation_token and info.classes and not info.distilled_head:
                raise ValueError(
                    "its head reads the class token alone (transformers' "
                    "DeiTForImageClassification), and timm's distilled DeiT averages a "
                    "head on each of the class and distillation tokens")
            files = {CONFIG: timm_export.hub_config(
                family, arch, arithmetic, size, classes, mean, std, class_names)}
            state = (timm_export.eva_from_official if family == "vit" and
                     timm_export.is_eva(arch) else timm_export.from_official)(params)
        else:
            if family != "vit":
                raise ValueError("it is a Mixer, and transformers has no MLP-Mixer")
            name = transformers_export.transformers_class(
                arch, arithmetic, size, distilled_head=info.distilled_head)
            config, preprocessor = transformers_export.hub_configs(
                name, arch, arithmetic, size, classes, mean, std, class_names)
            files = {CONFIG: config, PREPROCESSOR: preprocessor}
            state = transformers_export.from_official(params, name)
        if info.classes is None:
            raise ValueError(
                "it has no classification head (include_top=False), and the folder is "
                "verified as a classifier; give it one with classes=N and fine-tune it")
    except ValueError as error:
        raise ValueError(
            f"{model.name!r} cannot be written as a {library} Hub folder: {error}.") from None
    _check_round_trip(library, family, arch, params, state)
    return HubFolderFiles(library, files, state)


def _check_round_trip(library, family, arch, params, state):
    """The written state maps back onto exactly `params` (an internal invariant)."""
    module = timm_format if library == "timm" else transformers_format
    back, names, unmapped = module.to_official(state, arch.get("num_heads") or 1)
    if family == "mixer":
        back, names = timm_format.mixer_keys(back, names)
    # what the model computes beyond its weights (RoPE, the avg head) is config.json's
    params = {k: v for k, v in params.items() if not k.startswith(ROPE_PREFIX)
              and k != AVG_POOL_KEY}
    if unmapped or set(back) != set(params) or any(
            not np.array_equal(back[k], params[k]) for k in params):
        raise AssertionError(f"the {library} state does not map back onto the model's arrays")


# What an export writes in a Hub folder: all that replacing one may delete.
_WRITTEN = (CONFIG, WEIGHTS, PREPROCESSOR)


def _check_replaceable(path):
    # a model card, another library's weights: never deleted unasked
    check_replaceable_directory(path, "a Hub folder", CONFIG, f"without {CONFIG}",
                                written=_WRITTEN)


@dataclasses.dataclass
class _HubFolderExport(ExportFormat):
    """A Hub folder (`HubFolderFiles`), read back by `read_hub_checkpoint` and
    built with `model_from_checkpoint` to be run."""

    folder: HubFolderFiles = None

    checks = CHECKS
    timed = False

    def __post_init__(self):
        self.name = self.folder.library

    def write(self, temporary, names):
        os.makedirs(temporary)
        for name, content in self.folder.files.items():
            with open(os.path.join(temporary, name), "w") as f:
                json.dump(content, f, indent=2)
                f.write("\n")
        write_safetensors(os.path.join(temporary, WEIGHTS), self.folder.state)
        return temporary

    def runner(self, file):
        checkpoint = read_hub_checkpoint(file, source=self.path)
        reread = model_from_checkpoint(checkpoint, input_shape=(*self.size, 3),
                                       classifier_activation=None)
        return lambda images: batched(
            lambda x: np.asarray(reread(x, training=False), "float32"), images, 32)

    def report_fields(self, file, run, images, reference):
        return {"runtime": "keras_vit's Hub reader (read_hub_checkpoint, "
                           "model_from_checkpoint)"}

    def put_in_place(self, temporary):
        _check_replaceable(self.path)
        publish(temporary, self.path)

    def label_file(self, names):
        return os.path.join(self.path, CONFIG) if names else None


def to_hub_folder(model: keras.Model, path: str | os.PathLike, library: str = "timm", *,
                  outputs: str = "auto",
                  validation_data: str | np.ndarray | None = None,
                  validation_split: str | None = None, num_validation: int = 2000,
                  check: bool = True, verbose: bool = True, seed: int = 0,
                  data_dir: str | None = None, holdout: float = 0.1,
                  skip_corrupt: bool = False) -> ExportReport:
    """Writes `model` (a keras_vit ViT or Mixer classifier) as a Hugging
    Face Hub folder that `library` opens, verified, at `path`.

    The folder holds `config.json` + `model.safetensors` (+
    `preprocessor_config.json` for transformers), with the model's
    arithmetic, input normalisation and class names; upload it with
    `huggingface_hub`'s `upload_folder` to share it. It is verified as
    every export (read back by keras_vit's Hub reader and compared with
    the Keras model) before it is renamed to `path`; an earlier Hub folder
    of the files it writes is replaced, a folder holding anything else is
    refused. See docs/deploy.md#back-to-pytorch-hub-folders-for-timm-and-transformers.

    Args:
        model: a keras_vit classifier (a head, its preprocessing layer
            inside), taking RGB pixels in [0, 255].
        path: the folder to write.
        library: `"timm"` (ViT with `token`, `gap` or `map` pooling and
            the options of DINOv2, DeiT, DeiT-III, CLIP and SigLIP; DINOv3
            and EVA-02 as timm's `Eva`; Mixer with exact GELU) or
            `"transformers"` (ViT with `token` pooling:
            `ViTForImageClassification`; DeiT with a distillation token,
            DINOv2 with `token_avg`, SigLIP's `gap`: their own classes;
            no CLIP and no `map` head).
        outputs, validation_data, validation_split, num_validation, check,
            verbose, seed, data_dir, holdout, skip_corrupt: as in
            `to_onnx`.

    Returns:
        The `ExportReport` (`format` is the library; `labels` is the
        config.json that holds the class names).

    Raises:
        ValueError: an unknown `library`; a model the library would compute
            differently (the message says what differs), without a head or
            a preprocessing layer; a `path` that is a file or a directory
            other than a Hub folder.
        ExportVerificationError: the folder read back misses the bar.

    Example:

    ```python
    keras_vit.export.to_hub_folder(model, "vit_digits", library="transformers",
                                   validation_data="folder:digits")
    from transformers import ViTForImageClassification
    torch_model = ViTForImageClassification.from_pretrained("vit_digits")
    # timm: timm.create_model("local-dir:vit_digits_timm", pretrained=True)
    ```
    """
    path = os.fspath(path)
    _check_library(library)
    require_tensorflow_backend()
    _check_replaceable(path)
    # a model built for any size is written at its stored grid (the checkpoint's size)
    size = export_image_size(model)
    output_kind(model, outputs)  # a model without a head is refused here
    folder = hub_folder(model, library, size, model_class_names(model))
    fmt = _HubFolderExport(model, path, "none", size, outputs, folder=folder)
    sampling = Sampling(validation_data=validation_data, num_validation=num_validation,
                        validation_split=validation_split, seed=seed, data_dir=data_dir,
                        holdout=holdout, skip_corrupt=skip_corrupt)
    return export_verified(fmt, sampling, check=check, verbose=verbose)
