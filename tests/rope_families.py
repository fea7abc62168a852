"""Ground truth for the #50 parity tests: tiny random DINOv3, EVA-02 and
BEiT / BEiTv2 models written by timm and Hugging Face transformers
themselves, in the layouts users download, and the libraries' own outputs.

- `timm_folder(name)`: `timm.create_model(name, ...)` of a registered name
  made tiny by keyword arguments (width 64, 2 heads of 32, 2 blocks), every
  parameter random, written by `timm.models.save_for_hf` (config.json with
  `architecture`, `model_args`, `pretrained_cfg`; model.safetensors, or
  pytorch_model.bin). `timm_outputs(name, images)`: timm's
  `forward_features`, `forward_head(pre_logits=True)` and logits, at the
  trained size or, as timm computes it, at another.
- `transformers_folder(kind)`: `DINOv3ViTModel`, `BeitModel` or
  `BeitForImageClassification` from a tiny config, random, written by
  `save_pretrained` beside a preprocessor_config.json (model.safetensors;
  `bin=True`: pytorch_model.bin as older files are). `transformers_outputs`:
  last_hidden_state, pooler_output and logits.
- `photos(height, width)`: the two sample photos at any size.

No keras_vit here. Each folder and model is made once per session (a
temporary folder removed at exit) and shared: call these from module- or
session-scoped fixtures, and treat models and folders as read-only. Import
transformers before this module (timm's torchvision stand-in). Each write
takes about 0.1 s (transformers' first about 0.4 s).

>>> import transformers  # doctest: +SKIP
>>> from rope_families import timm_folder, timm_outputs, photos  # doctest: +SKIP
>>> model, folder = timm_folder("vit_small_patch16_dinov3")  # doctest: +SKIP
>>> timm_outputs("vit_small_patch16_dinov3", photos(48, 80))["pre_logits"].shape  # doctest: +SKIP
(2, 64)
"""

import atexit
import json
import pathlib
import re
import shutil
import tempfile
import zlib

import numpy as np

from family_photos import photos as square_photos

WIDTH, HEADS, DEPTH, CLASSES = 64, 2, 2, 5
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

# timm name -> (trained image size, builder kwargs besides the tiny shape, classes).
# Each keeps its registered arithmetic (RoPE variant, ref_feat_shape, MLP, ...).
TIMM = {
    # DINOv3: 4 registers, RoPE (base 100, centred coords), LayerScale, avg pool, no fc_norm
    "vit_small_patch16_dinov3": (64, {}, 0),
    "vit_small_patch16_dinov3_qkvb": (64, {}, 0),  # q/v biases (k bias a zero buffer)
    # split SwiGLU, hidden int(64 * 2.6) = 166 aligned up to 168 (swiglu_align_to=8)
    "vit_small_plus_patch16_dinov3": (64, dict(mlp_ratio=2.6), 0),
    # EVA-02: abs pos embed + RoPE with ref_feat_shape=(16, 16), avg pool + fc_norm
    "eva02_tiny_patch14_224": (56, {}, 0),  # packed SwiGLU (fc1 = 2 x 170), fused qkv
    "eva02_base_patch14_224": (56, {}, 0),  # q/k/v_proj, split SwiGLU with sub-LayerNorm
    "eva02_tiny_patch14_336": (56, {}, CLASSES),  # the fine-tuned layout: a head
    "eva02_base_patch14_448": (56, {}, CLASSES),
    # BEiT: relative position bias per block, q/v bias, LayerScale, mean pool + fc_norm
    "beit_base_patch16_224": (64, {}, CLASSES),
    "beitv2_base_patch16_224": (64, {}, CLASSES),
}
# A second size each family's parity test may use (DINOv3: non-square).
SECOND_SIZE = {"dinov3": (48, 80), "eva02": (84, 84), "beit": (96, 96)}

# transformers kind -> (class name, config class name, config kwargs, processor)
TRANSFORMERS = {
    "dinov3_vit": ("DINOv3ViTModel", "DINOv3ViTConfig", dict(
        intermediate_size=4 * WIDTH, num_register_tokens=4, layerscale_value=1e-5), "dinov3"),
    # ViT-S+/H+ layout: gate_proj, up_proj, down_proj, SiLU
    "dinov3_vit_gated": ("DINOv3ViTModel", "DINOv3ViTConfig", dict(
        intermediate_size=168, num_register_tokens=4, layerscale_value=1e-5,
        use_gated_mlp=True, hidden_act="silu"), "dinov3"),
    "beit": ("BeitModel", "BeitConfig", dict(
        intermediate_size=4 * WIDTH, use_relative_position_bias=True, use_mean_pooling=True,
        layer_scale_init_value=0.1), "beit"),
    "beit_classifier": ("BeitForImageClassification", "BeitConfig", dict(
        intermediate_size=4 * WIDTH, use_relative_position_bias=True, use_mean_pooling=True,
        layer_scale_init_value=0.1, num_labels=CLASSES), "beit"),
}
TRANSFORMERS_SIZE = 64  # image_size of the transformers configs (4x4 patches of 16)

_CACHE = {}
_ROOT = []


def _root():
    """The session's temporary folder (made on first use, removed at exit)."""
    if not _ROOT:
        _ROOT.append(pathlib.Path(tempfile.mkdtemp(prefix="keras_vit_rope_families_")))
        atexit.register(shutil.rmtree, _ROOT[0], True)
    return _ROOT[0]


def _cached(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def _timm():
    import transformers  # noqa: F401 - before the torchvision stand-in
    from torch_libraries import import_timm

    return import_timm()


def photos(height, width=None):
    """The two sample photos (uint8 values as float32, NHWC) at `height` x
    `width` (default square): centre-cropped to that aspect ratio, then
    resized bicubic. Square: `family_photos.photos(height)`."""
    width = height if width is None else width
    if width == height:
        return square_photos(height)
    from PIL import Image
    from sklearn.datasets import load_sample_images

    out = []
    for image in load_sample_images().images:
        h, w = image.shape[:2]
        crop_h, crop_w = min(h, w * height // width), min(w, h * width // height)
        top, left = (h - crop_h) // 2, (w - crop_w) // 2
        crop = Image.fromarray(image[top:top + crop_h, left:left + crop_w])
        out.append(np.asarray(crop.resize((width, height), Image.BICUBIC)))
    return np.stack(out).astype("float32")


def randomized(model, seed):
    """`model` with every parameter random, so that each moves the output:
    norm weights 1 + 0.2 N, layer scales 0.5 N, position embeddings and
    relative position bias tables N (large enough that a wrong resize
    shows), query and key kernels 0.25 N (attention far from uniform, so
    a wrong rotation shows), the rest 0.1 N. Returns it in eval mode."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if re.search(r"(norm\d?|layernorm\w*)\.weight$", name):
                parameter.copy_(1 + 0.2 * noise)
            elif re.search(r"(gamma_\d|lambda_?\d)$", name):
                parameter.copy_(0.5 * noise)
            elif re.search(r"(pos_embed|relative_position_bias_table)$", name):
                parameter.copy_(noise)
            elif re.search(r"(qkv|q_proj|k_proj)\.weight$", name):
                parameter.copy_(0.25 * noise)
            else:
                parameter.copy_(0.1 * noise)
    return model.eval()


def _seed(text):
    return zlib.crc32(text.encode())


# --- timm ------------------------------------------------------------------------------

def timm_folder(name, classes=None, bin=False):
    """`(model, folder)`: timm's `name` (a key of `TIMM`) at its tiny shape
    and trained size, random, written by `save_for_hf` (model.safetensors;
    `bin=True`: pytorch_model.bin, the same weights). `classes`: the head
    (default `TIMM`'s; 0 for none). The config.json's `model_args` hold the kwargs given
    (embed_dim, depth, num_heads, img_size, num_classes, any of `TIMM`);
    the name's own (RoPE, ref_feat_shape, MLP, ...) come from the name."""
    size, extra, default_classes = TIMM[name]
    classes = default_classes if classes is None else classes

    def make():
        timm = _timm()
        args = dict(embed_dim=WIDTH, depth=DEPTH, num_heads=HEADS, img_size=size,
                    num_classes=classes, **extra)
        model = randomized(timm.create_model(name, pretrained=False, **args), _seed(name))
        folder = _root() / f"timm-{name}-{classes}{'-bin' * bin}"
        timm.models.save_for_hf(model, folder, model_args=args, safe_serialization=not bin)
        return model, folder

    return _cached(("timm", name, classes, bin), make)


def timm_model_at(name, size, classes=None):
    """timm's model of `timm_folder(name, classes)` for `size` (an int or
    `(h, w)`) pixel images, as timm makes one (read-only, cached):

    - DINOv3 (`dynamic_img_size=True`, no position embedding): the model
      itself; RoPE is computed for each call's grid (patch centres
      normalised to [-1, 1] per axis, so a 3x5 grid spans the same range
      as 4x4).
    - EVA-02 and BEiT: `timm.create_model(f"local-dir:{folder}",
      pretrained=True, img_size=size)`, what a user at another size runs
      (identical to `model.set_input_size(img_size=size)` and, for EVA-02,
      to `dynamic_img_size=True`). EVA-02: `checkpoint_filter_fn` resizes
      `pos_embed` with `resample_abs_pos_embed` (bicubic, antialias=True,
      class token kept) and the RoPE grid is `arange(n) / n * 16` per axis
      (`ref_feat_shape=(16, 16)` of the name). BEiT: each block's
      `relative_position_bias_table` is resized by `resize_rel_pos_bias_
      table` (geometric-progression offsets, linear interpolation, the 3
      class rows kept; `keras_vit.weights.relative_position`).
    """
    model, folder = timm_folder(name, classes)
    size = (size, size) if isinstance(size, int) else tuple(size)
    if size == (TIMM[name][0],) * 2 or "dinov3" in name:
        return model

    def make():
        return _timm().create_model(f"local-dir:{folder}", pretrained=True, img_size=size).eval()

    return _cached(("timm-at", name, model.num_classes, size), make)


def timm_pixels(folder, images):
    """`images` (NHWC, [0, 255]) as timm's model takes them: `/ 255`, then
    the folder's `pretrained_cfg` mean and std (DINOv3, BEiTv2: ImageNet's;
    EVA-02: OpenAI CLIP's; BEiT: 0.5), NCHW float32. (timm's eval transform
    would also resize and centre-crop by `crop_pct`; the images are given
    at the model's size instead.)"""
    import torch

    cfg = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    x = (np.asarray(images, np.float32) / 255.0 - np.float32(cfg["mean"])) / np.float32(cfg["std"])
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def timm_outputs(name, images, classes=None):
    """timm's outputs of `timm_folder(name, classes)` on `images` (NHWC
    float, values in [0, 255]) at their size (`timm_model_at`), as NumPy:

    - "features": `forward_features`, `(B, prefix + h*w, D)` (DINOv3:
      class, 4 registers, patches, after the final norm; EVA-02 and BEiT
      with avg pool: no final norm, `norm` is Identity);
    - "pre_logits": `forward_head(features, pre_logits=True)`, `(B, D)`
      (DINOv3: mean of the patch tokens, no fc_norm; EVA-02, BEiT: mean of
      the patch tokens, then fc_norm);
    - "logits": `model(x)`, `(B, classes)` (the pre-logits when headless).
    """
    import torch

    _, folder = timm_folder(name, classes)
    model = timm_model_at(name, tuple(np.shape(images)[1:3]), classes)
    x = timm_pixels(folder, images)
    with torch.no_grad():
        features = model.forward_features(x)
        out = dict(features=features, pre_logits=model.forward_head(features, pre_logits=True),
                   logits=model(x))
    return {k: v.numpy() for k, v in out.items()}


# --- transformers -----------------------------------------------------------------------

def _dinov3_processor(folder, size):
    """DINOv3's preprocessor_config.json, written as JSON: its processor
    class needs torchvision, which this machine lacks. The class defaults
    (transformers 5 `DINOv3ViTImageProcessor`): rescale, resize bilinear,
    ImageNet mean/std, no crop."""
    config = dict(
        image_processor_type="DINOv3ViTImageProcessor", do_resize=True, do_rescale=True,
        do_normalize=True, do_center_crop=False, rescale_factor=1 / 255, resample=2,
        image_mean=list(IMAGENET["mean"]), image_std=list(IMAGENET["std"]),
        size=dict(height=size, width=size))
    (folder / "preprocessor_config.json").write_text(json.dumps(config, indent=2) + "\n")


def transformers_folder(kind, bin=False):
    """`(model, folder)`: transformers' `kind` (a key of `TRANSFORMERS`),
    width 64, 2 heads, 2 layers, 64 px images of 16 px patches, random,
    written by `save_pretrained` (model.safetensors, transformers 5's
    on-disk names: DINOv3 `layer.N.*`, BEiT the legacy `encoder.layer.N.
    attention.attention.query.*`) beside a preprocessor_config.json (BEiT:
    `BeitImageProcessorPil`'s, mean/std 0.5, bicubic; DINOv3: ImageNet's).
    `bin=True`: pytorch_model.bin instead (`torch.save` of the same keys
    and weights; BEiT's with the `relative_position_index` buffers older
    files hold)."""
    class_name, config_name, extra, processor = TRANSFORMERS[kind]

    def make():
        import transformers

        config = getattr(transformers, config_name)(
            hidden_size=WIDTH, num_hidden_layers=DEPTH, num_attention_heads=HEADS,
            image_size=TRANSFORMERS_SIZE, patch_size=16, **extra)
        model = randomized(getattr(transformers, class_name)(config), _seed(kind))
        folder = _root() / f"transformers-{kind}{'-bin' * bin}"
        model.save_pretrained(folder)
        if processor == "beit":
            transformers.BeitImageProcessorPil(
                size=dict(height=TRANSFORMERS_SIZE, width=TRANSFORMERS_SIZE)).save_pretrained(folder)
        else:
            _dinov3_processor(folder, TRANSFORMERS_SIZE)
        if bin:
            _write_bin(folder, with_index=processor == "beit")
        return model, folder

    return _cached(("transformers", kind, bin), make)


def _write_bin(folder, with_index):
    """model.safetensors -> pytorch_model.bin (`torch.save` of the same keys;
    transformers 5 writes safetensors whatever it is asked). `with_index`:
    BEiT's int64 `...relative_position_bias.relative_position_index`
    buffers too, as the original and older transformers files hold them
    (transformers 5 skips them: `_keys_to_ignore_on_load_unexpected`)."""
    import torch
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    if with_index:
        for key in [k for k in state if k.endswith("relative_position_bias_table")]:
            rows = state[key].shape[0]
            side = int(round(((rows - 3) ** 0.5 + 1) / 2))
            state[key.replace("_bias_table", "_index")] = _beit_index(side)
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _beit_index(side):
    """transformers' own index for a `side` x `side` grid (int64 tensor)."""
    from transformers.models.beit.modeling_beit import BeitRelativePositionBias

    return BeitRelativePositionBias.generate_relative_position_index((side, side)).clone()


def transformers_pixels(folder, images):
    """`images` (NHWC, [0, 255]) as transformers' model takes them: `/ 255`
    (rescale_factor), then the folder's preprocessor `image_mean` /
    `image_std`, NCHW float32 (the processor's resize is left out: the
    images are given at the size wanted)."""
    import torch

    cfg = json.loads((folder / "preprocessor_config.json").read_text())
    x = (np.asarray(images, np.float32) / 255.0 - np.float32(cfg["image_mean"])) \
        / np.float32(cfg["image_std"])
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def transformers_outputs(kind, images):
    """transformers' outputs of `transformers_folder(kind)` on `images`
    (NHWC float, [0, 255]) at their own size, as NumPy. Both classes take
    any size of whole patches with the same weights: DINOv3 computes RoPE
    for the call's grid (as timm's DINOv3), BEiT resizes each block's
    relative position table bilinearly to the call's grid in every forward
    (`interpolate_pos_encoding=True` changes nothing for these models).

    - "last_hidden_state": DINOv3: after the final norm, class, registers,
      patches; BEiT with mean pooling: the last block's output (its final
      `layernorm` is Identity);
    - "pooler_output": DINOv3: the class token of last_hidden_state; BEiT:
      `pooler.layernorm` of the mean of the patch tokens;
    - "logits": the classifier's (BeitForImageClassification), else None.
    """
    import torch

    model, folder = transformers_folder(kind)
    x = transformers_pixels(folder, images)
    with torch.no_grad():
        out = model(x)
        base = model.beit(x) if hasattr(model, "beit") else out
    return dict(last_hidden_state=base.last_hidden_state.numpy(),
                pooler_output=base.pooler_output.numpy(),
                logits=out.logits.numpy() if hasattr(out, "logits") else None)
