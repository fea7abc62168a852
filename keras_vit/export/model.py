"""What every export reads from the Keras model: the backend it runs on,
its input shape and image size, its number of classes, whether it outputs
logits or probabilities, its logits (in batches), and the traced pixel
graph that ONNX and OpenVINO convert."""

import json

import keras
import tensorflow as tf
from keras import ops

from keras_vit import __version__, _compat
from keras_vit.export.batches import batched
from keras_vit.layers import BottleneckUnit, PatchEncoder, Patches, ResNetRoot
from keras_vit.layers.fused import portable_graph
from keras_vit.layers.blocks import quantization_modes, walk_layers
from keras_vit.layers.features import FeatureMap
from keras_vit.layers.lora import merge_lora

OUTPUT_KINDS = ("auto", "logits", "probabilities")


def require_tensorflow_backend():
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(
            f"keras_vit.export needs the TensorFlow backend; the Keras backend is "
            f"{backend!r}. Run with KERAS_BACKEND=tensorflow (the .keras file "
            "loads under any backend).")


# The `model.quantize(mode)` modes each export runs as Keras does (measured
# on small ViTs, Mixers and hybrids with TF 2.21: tests/test_quantize.py),
# and why the others are refused before any conversion.
KERAS_QUANTIZED = {
    "saved_model": (("int8", "int4", "float8"), None),
    "onnx": (("int8", "int4"), "tf2onnx cannot convert float8 tensors; export the float model "
                               "(quantization='dynamic' or 'int8' quantizes it for ONNX Runtime)"),
    "tflite": (("int4",), "the TFLite converter has no built-in kernel for Keras' int8 and float8 "
                          "matmuls; export the float model with quantization='dynamic' or "
                          "'int8', which the converter quantizes"),
    "openvino": (("int4",), "OpenVINO's CPU plugin does not compute Keras' int8 matmuls as Keras "
                            "does (logits off by 0.1 on a small ViT) and cannot read float8; "
                            "export the float model, or use --format onnx"),
}


# What an export of a `model.quantize("int8")` model must reach against that
# quantized Keras model, in place of the float32 bars. Keras' int8 Dense
# quantizes its input per call (abs-max per row, `inputs_quantizer`), so
# float32 rounding a few ulps away in the exported graph (another LayerNorm or
# GELU kernel) can move an input across a rounding boundary: one int8 step,
# 1/127 of that row's largest value. The logits then differ by about that
# fraction of their size, not by float32 rounding: on the quickstart's digits
# ViT, max |logit diff| 0.0063 with logits up to 4.35 on the 360 test digits,
# top-1 agreement 100% (ONNX and SavedModel alike; the float32 bar, 1e-4 x
# 4.35, refused both). int4 (weights only, inputs kept float: 2.6e-6 on the
# same model) and float8 keep the float32 bars. The bar: one int8 step of the
# largest logit, and the top-1 agreement of the other exports that quantize
# activations per call (dynamic range, 99%): an image whose top-2 margin is
# below a step may flip.
KERAS_QUANTIZED_CHECKS = {"max_abs_diff": 1 / 127, "min_top1_agreement": 0.99}


def keras_quantized_mode(model):
    """The `model.quantize` mode (`"int8"`) of `model` when one of its Dense
    layers quantizes its input per call (an `inputs_quantizer`): its float
    exports are judged by `KERAS_QUANTIZED_CHECKS`; else None."""
    if _graph_inputs(model) is None:
        return None
    for layer in model.layers:
        for sublayer in [layer, *getattr(layer, "dense_layers", ())]:
            if (sublayer is not None and sublayer.quantization_mode
                    and getattr(sublayer, "inputs_quantizer", None) is not None):
                return sublayer.quantization_mode
    return None


def refuse_keras_quantized(model, fmt):
    """A ValueError when `model` was quantized with `model.quantize(mode)`
    in a mode the export `fmt` cannot run as Keras does (`KERAS_QUANTIZED`)."""
    allowed, why = KERAS_QUANTIZED[fmt]
    modes = quantization_modes(model) if _graph_inputs(model) is not None else set()
    refused = sorted(modes - set(allowed))
    if refused:
        raise ValueError(
            f"{model.name!r} is quantized by model.quantize({refused[0]!r}) and the {fmt} "
            f"export runs only model.quantize({' / '.join(map(repr, allowed))}) models as Keras "
            f"does: {why}.")


def exported_model(model, fmt):
    """The model an export `fmt` traces: `model`, refused when quantized in
    a mode `fmt` cannot run (`refuse_keras_quantized`), with LoRA adapters
    merged into plain Dense kernels (`keras_vit.layers.lora.merge_lora`;
    the graph then has no adapter matmuls)."""
    refuse_keras_quantized(model, fmt)
    return merge_lora(model)


def _graph_inputs(model):
    """The symbolic inputs of a Functional or Sequential model; None for a
    subclassed model (its graph is its Python `call`)."""
    try:
        return model.inputs
    except AttributeError:
        return None


def model_input_shape(model):
    """`model.input_shape`; for a subclassed model, the shape it was built
    or first called with. A ValueError when no shape is known."""
    if _graph_inputs(model) is not None:
        return model.input_shape
    built = _compat.build_shapes(model) if isinstance(model, keras.layers.Layer) else None
    shapes = list((built or {}).values())
    if len(shapes) == 1 and isinstance(shapes[0], (tuple, list)):
        return (None, *shapes[0][1:])
    raise ValueError(
        f"{model.name!r} ({type(model).__name__}) has no known input shape: a subclassed "
        "model is built by its first call. Call it once on a batch of images, e.g. "
        "model(np.zeros((1, 224, 224, 3))), or model.build((None, 224, 224, 3)), "
        "before exporting.")


def model_classes(model):
    """The number of outputs (classes) of `model`."""
    if _graph_inputs(model) is not None:
        return int(model.output_shape[-1])
    spec = model.compute_output_spec(keras.KerasTensor(model_input_shape(model)))
    return int(spec.shape[-1])


def model_image_size(model, image_size=None):
    """(height, width) the model takes; `image_size` for models built with
    a free input size."""
    shape = model_input_shape(model)
    if isinstance(shape, list) or len(shape) != 4:
        raise ValueError(f"Export takes a model with one image input (batch, height, "
                         f"width, channels); this one takes {shape}.")
    if shape[-1] != 3:
        raise ValueError(f"Export takes RGB models (3 input channels); this one takes "
                         f"{shape[-1]}.")
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if None not in shape[1:3] and tuple(shape[1:3]) != size:
            raise ValueError(f"image_size={image_size} but the model is built for "
                             f"{tuple(shape[1:3])}.")
        return size
    if None in shape[1:3]:
        raise ValueError("The model takes any image size; pass image_size=(height, width) "
                         "for the export.")
    return tuple(shape[1:3])


def _token_layout(model):
    """`(grid, pixels, hybrid)` of a keras_vit ViT: the stored
    position-embedding grid (tokens), the pixels of one token (the patch
    times a hybrid stem's stride) and whether a ResNet stem comes first;
    None for another model."""
    layers = list(walk_layers(model))
    encoder = next((layer for layer in layers if isinstance(layer, PatchEncoder)), None)
    patches = next((layer for layer in layers if isinstance(layer, Patches)), None)
    if encoder is None or patches is None or encoder.grid_size is None:
        return None
    stride, hybrid = 1, any(isinstance(layer, ResNetRoot) for layer in layers)
    if hybrid:
        stride = 4
        for unit in layers:
            if isinstance(unit, BottleneckUnit):
                stride *= unit.strides[0]
    return (encoder.grid_size,
            (patches.patch_size[0] * stride, patches.patch_size[1] * stride), hybrid)


def dynamic_size_layout(model):
    """For a model built with `input_shape=(None, None, 3)`: `(native,
    multiple)`. `native`: `(height, width)` of the stored position-embedding
    grid in pixels (the checkpoint's resolution), None for a model that is
    not a keras_vit ViT. `multiple`: the pixel multiple each image side
    must be (the patch size), None for a hybrid, whose stem takes any size.
    """
    layout = _token_layout(model)
    if layout is None:
        return None, None
    grid, pixels, hybrid = layout
    return (grid[0] * pixels[0], grid[1] * pixels[1]), (None if hybrid else pixels)


def takes_any_size(model):
    """True for a model built with a None height or width."""
    shape = model_input_shape(model)
    return not isinstance(shape, list) and len(shape) == 4 and None in shape[1:3]


def any_size_input(model):
    """What a model built for any size takes, for the exports that keep it:
    False for a model of one size; else the `(height, width)` pixel
    multiple each side must be (the patch size), or True (a hybrid, or a
    model that is not a keras_vit ViT: any size)."""
    if not takes_any_size(model):
        return False
    multiple = dynamic_size_layout(model)[1]
    return tuple(multiple) if multiple is not None else True


def export_image_size(model, image_size=None):
    """`model_image_size`, where a model built for any size defaults to the
    size of its stored position-embedding grid (the checkpoint's
    resolution): the size an export is verified at (and TFLite's fixed
    size)."""
    if image_size is None and takes_any_size(model):
        image_size = dynamic_size_layout(model)[0]
    return model_image_size(model, image_size)


def run_time_sizes(model, size):
    """The two sizes other than `size` at which an export that keeps a
    model's run-time-sized input is verified as well: `(h + 2 s, w + s)`
    (another aspect ratio) and `(2 h, 2 w)`, `s` the pixels of one token
    (the patch, times a hybrid stem's stride; for a model that is not a
    keras_vit ViT, a quarter of each side). `()` for a model of one size.

    Example (a ViT of patch 8 built for any size, verified at 32x32):

    >>> import keras_vit
    >>> model = keras_vit.VisionTransformer(
    ...     patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32,
    ...     input_shape=(None, None, 3), classes=3)
    >>> run_time_sizes(model, (32, 32))
    ((48, 40), (64, 64))
    """
    if not takes_any_size(model):
        return ()
    height, width = size
    layout = _token_layout(model)
    step = layout[1] if layout else (max(1, height // 4), max(1, width // 4))
    return ((height + 2 * step[0], width + step[1]), (2 * height, 2 * width))


def output_kind(model, outputs="auto"):
    """`"logits"` or `"probabilities"`: what `model`'s output is.

    `"auto"` reads the last layer: a Dense with a softmax gives
    probabilities, one without an activation gives logits; anything else is
    ambiguous and must be named."""
    if outputs not in OUTPUT_KINDS:
        raise ValueError(f"outputs={outputs!r}; allowed: {OUTPUT_KINDS}.")
    graph = _graph_inputs(model) is not None
    if graph and (len(model.outputs) > 1 or isinstance(model.layers[-1], FeatureMap)):
        raise ValueError(
            f"{model.name!r} outputs {len(model.outputs)} feature map(s) (features_only=True), "
            "not classes, and keras_vit's exports verify a classifier's top-1; export it "
            "with Keras: model.export(path, format='tf_saved_model').")
    if outputs != "auto":
        return outputs
    if not graph:
        raise ValueError(
            f"Cannot tell whether {model.name!r} outputs logits or probabilities: it is a "
            f"subclassed model ({type(model).__name__}), whose last operation only its "
            "call() knows; pass outputs='logits' or outputs='probabilities'.")
    last = model.layers[-1]
    activation = getattr(last, "activation", None)
    name = getattr(activation, "__name__", None)
    if isinstance(last, keras.layers.Dense) and name in ("softmax", "linear"):
        return "probabilities" if name == "softmax" else "logits"
    if last.name in ("pre_logits", "encoder_norm", "pool"):
        raise ValueError(
            f"{model.name!r} has no classification head: it outputs features of shape "
            f"{tuple(model.output_shape[1:])} (built with include_top=False, or from a "
            "checkpoint without a head). Give it one with classes=N and fine-tune it "
            "(keras-vit train), or load a classifier checkpoint.")
    raise ValueError(
        f"Cannot tell whether {model.name!r} outputs logits or probabilities (its "
        f"last layer is {type(last).__name__} {last.name!r}); pass outputs='logits' "
        "or outputs='probabilities'.")


def logits_and_probabilities(model, outputs="auto"):
    """A function `images -> (logits, probabilities)` for `model`.

    For a softmax head the logits are the head's pre-activation (the Dense
    is re-applied without its softmax); for a model that outputs
    probabilities through another layer, log-probabilities stand in for the
    logits (they differ from logits by a constant per image)."""
    kind = output_kind(model, outputs)
    last = model.layers[-1]
    head_is_softmax_dense = (isinstance(last, keras.layers.Dense)
                             and getattr(last.activation, "__name__", None) == "softmax"
                             and _graph_inputs(model) is not None)
    if kind == "logits":
        def call(images):
            logits = ops.cast(model(images, training=False), "float32")
            return logits, ops.softmax(logits, axis=-1)
    elif head_is_softmax_dense:
        features = keras.Model(model.inputs[0], last.input)  # Sequential has no .input

        def call(images):
            x = ops.cast(features(images, training=False), last.compute_dtype)
            logits = ops.cast(ops.matmul(x, last.kernel) + last.bias, "float32")
            return logits, ops.softmax(logits, axis=-1)
    else:
        def call(images):
            probabilities = ops.cast(model(images, training=False), "float32")
            return ops.log(ops.maximum(probabilities, 1e-30)), probabilities
    return call


def reference_logits(model, images, outputs="auto", batch=32):
    """The Keras model's logits (see `logits_and_probabilities`), in batches."""
    call = logits_and_probabilities(model, outputs)
    return batched(lambda x: call(x)[0], images, batch)


def pixel_graph(model, size, outputs="auto", any_size=False):
    """The traced TensorFlow function (a `ConcreteFunction`) that the ONNX
    and OpenVINO exports convert: input `images`, float32 `(batch, height,
    width, 3)` RGB pixels in [0, 255] with any batch (the model's own
    preprocessing inside), `size` `(height, width)`, or any height and
    width with `any_size` (a model built with `input_shape=(None, None,
    3)`: its RoPE angles or position-embedding resize are computed from the
    call's grid inside the graph); outputs `logits` and `probabilities`,
    float32 `(batch, classes)` (see `logits_and_probabilities`). Traced with
    standard ops only (`portable_graph`)."""
    call = logits_and_probabilities(model, outputs)

    def serve(images):
        logits, probabilities = call(images)
        return {"logits": logits, "probabilities": probabilities}

    with portable_graph():
        return tf.function(serve).get_concrete_function(
            tf.TensorSpec((None, *((None, None) if any_size else size), 3), tf.float32,
                          name="images"))


def _input_text(size, any_size):
    """The `images` input of a file converted from `pixel_graph`, in words."""
    if not any_size:
        return f"(batch, {size[0]}, {size[1]}, 3)"
    multiple = any_size if isinstance(any_size, tuple) else None
    return ("(batch, height, width, 3), any height and width" + (
        f" (multiples of {multiple[0]} and {multiple[1]})" if multiple else ""))


def pixel_graph_metadata(size, kind, names, any_size=False):
    """What a file converted from `pixel_graph` says about itself (ONNX
    `metadata_props`, OpenVINO `rt_info`): its image size (for a file that
    takes any size, `any_size`: True or the `(height, width)` multiple each
    side must be, the size it was verified at first), input and outputs,
    what the Keras model output (`kind`), the keras_vit version and the
    class names `names` (a JSON list under "labels"; left out when None)."""
    height, width = size
    info = {"image_size": json.dumps([height, width]),
            "input": f"images: float32 {_input_text(size, any_size)} RGB pixels in [0, 255]",
            "outputs": "logits, probabilities: float32 (batch, classes)",
            "keras_output": kind, "keras_vit_version": __version__}
    if names:
        info["labels"] = json.dumps(list(names))
    return info


def pixel_graph_signature(size, any_size=False):
    """The report's `signature` of a file converted from `pixel_graph`."""
    height, width = ("height", "width") if any_size else size
    return {"inputs": {"images": f"float32 [batch, {height}, {width}, 3]"},
            "outputs": {"logits": "float32 [batch, classes]",
                        "probabilities": "float32 [batch, classes]"}}
