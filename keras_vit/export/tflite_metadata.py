"""TFLite Metadata for image classifiers, written and read with the
`flatbuffers` package alone (no MediaPipe, no tflite-support).

The metadata is the `TFLITE_METADATA` entry of a `.tflite` model: a
`ModelMetadata` flatbuffer (schema `metadata_schema.fbs` of tflite-support
and MediaPipe, file identifier `M001`) in one of the model's buffers, and
the files it names (here `labels.txt`) in a zip archive appended to the
flatbuffer, as tflite-support's and MediaPipe's `MetadataPopulator` write
them. MediaPipe Tasks' `ImageClassifier` (Android, iOS, web, Python) reads
it: it feeds the input `(pixel - mean) / std` from `NormalizationOptions`
(it refuses a float model without them) and names each class from the
label file of the output tensor.

What `keras_vit.export.to_tflite` writes (unless `metadata=False`):

- model: name, description, version (`keras_vit <version>` unless given),
  author and license when given; `min_parser_version` 1.0.0;
- input `image`: RGB `ImageProperties` with the model's size,
  `NormalizationOptions` and the value range (`Stats`) the graph takes. A
  keras_vit model normalizes in its graph (its `preprocessing` layer:
  `(x - 127.5) / 127.5`, or a timm / transformers checkpoint's mean and
  std), so its file says mean 0, std 1: MediaPipe feeds raw 0..255 floats;
- outputs, in this order: `probabilities` (softmax, `Stats` 0..1) and
  `logits`, each with `labels.txt` as `TENSOR_AXIS_LABELS`: the model's class
  names, else the ImageNet-1k / ImageNet-21k names for a 1000 / 21843-class
  head, else `class_<i>`.

>>> meta = read_tflite_metadata("vit.tflite")  # needs an exported file  # doctest: +SKIP
>>> meta["normalization"], meta["labels"][:2], meta["outputs"][0]["name"]  # doctest: +SKIP
({'mean': [0.0, 0.0, 0.0], 'std': [1.0, 1.0, 1.0]}, ['cat', 'dog'], 'probabilities')

From a shell: `python -m keras_vit.export vit.tflite` prints it as JSON.
"""

import io
import json
import logging
import math
import re
import sys
import zipfile

import flatbuffers
import keras
import numpy as np
from flatbuffers import number_types as N  # noqa: N812  the flatbuffers idiom
from flatbuffers.table import Table

from keras_vit import __version__, _compat
from keras_vit._console import error_message
from keras_vit import labels as labels_lib
from keras_vit.export.model import model_classes
from keras_vit.layers.blocks import walk_layers

logger = logging.getLogger("keras_vit")

METADATA_NAME = "TFLITE_METADATA"
METADATA_IDENTIFIER = b"M001"
TFLITE_IDENTIFIER = b"TFL3"
MIN_PARSER_VERSION = "1.0.0"  # every field written here exists since 1.0.0
LABELS_FILE = "labels.txt"
OUTPUT_ORDER = ("probabilities", "logits")  # MediaPipe: classifications[0], [1]
METADATA_KEYS = ("name", "description", "version", "author", "license", "labels",
                 "normalization")

# metadata_schema.fbs enums (values as in the schema).
_ASSOCIATED_FILE_TYPES = {0: "UNKNOWN", 1: "DESCRIPTIONS", 2: "TENSOR_AXIS_LABELS",
                          3: "TENSOR_VALUE_LABELS", 4: "TENSOR_AXIS_SCORE_CALIBRATION",
                          5: "VOCABULARY", 6: "SCANN_INDEX_FILE"}
TENSOR_AXIS_LABELS = 2
_COLOR_SPACES = {0: "UNKNOWN", 1: "RGB", 2: "GRAYSCALE"}
RGB = 1
_CONTENT_TYPES = {0: None, 1: "feature", 2: "image", 3: "bounding_box", 4: "audio"}
FEATURE_PROPERTIES, IMAGE_PROPERTIES = 1, 2
_PROCESS_UNITS = {1: "normalization", 2: "score_calibration", 3: "score_thresholding",
                  4: "bert_tokenizer", 5: "sentencepiece_tokenizer", 6: "regex_tokenizer"}
NORMALIZATION_OPTIONS = 1
_TENSOR_TYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 9: "int8"}

# Layers that keep pixel values as they are at inference (skipped when
# looking for the model's input normalization).
_VALUE_PRESERVING = ("Resizing", "CenterCrop", "Cropping2D", "ZeroPadding2D")


# --- what the metadata says -------------------------------------------------

def _input_normalization_layer(model):
    """The Normalization / Rescaling layer the model applies to its input
    first (inside nested models too), or None."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        if isinstance(layer, (keras.layers.Normalization, keras.layers.Rescaling)):
            return layer
        if isinstance(layer, keras.Model):
            return _input_normalization_layer(layer)
        name = type(layer).__name__
        if name.startswith("Random") or name in _VALUE_PRESERVING:
            continue  # augmentation (identity at inference), resizing, cropping
        return None
    return None


def _channels(value, what):
    try:
        values = [float(v) for v in np.broadcast_to(np.asarray(value, "float64"), (3,))]
    except (TypeError, ValueError):
        raise ValueError(f"metadata normalization {what}={value!r}; give a number or 3 "
                         "numbers (one per RGB channel), in pixel units (0..255).") from None
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"metadata normalization {what}={value!r} is not finite.")
    return values


def input_normalization(model, normalization="auto"):
    """`(mean, std, how)`: the `NormalizationOptions` of the TFLite input.

    MediaPipe feeds the graph `(pixel - mean) / std` per RGB channel,
    pixels in 0..255. `"auto"`: a model that normalizes its input in its
    graph (a `Normalization` or `Rescaling` layer first: every keras_vit
    model built with `include_preprocessing=True`, timm / transformers
    checkpoints included) takes raw pixels, so mean 0, std 1. A keras_vit
    model built with `include_preprocessing=False` has no such layer: its
    pixels must be normalized outside, and only the caller knows how (a
    ValueError says so). Another model without such a layer is taken to
    take 0..255 pixels, as `to_tflite` documents, with a logged warning.
    `(mean, std)` (numbers or 3 per channel, pixel units) states it: e.g.
    `(127.5, 127.5)` for a graph that takes `(x - 127.5) / 127.5`; for a
    model that normalizes in its graph, anything but `(0, 1)` is refused
    (MediaPipe would normalize twice)."""
    if isinstance(normalization, str) and normalization == "auto":
        layer = _input_normalization_layer(model)
        if layer is not None:
            return [0.0] * 3, [1.0] * 3, (f"in the graph ({type(layer).__name__} layer "
                                          f"{layer.name!r})")
        if any(type(layer).__module__.startswith("keras_vit.") for layer in walk_layers(model)):
            raise ValueError(
                f"{model.name!r} has no input normalization in its graph (built with "
                "include_preprocessing=False): its TFLite file takes normalized pixels, "
                "and the TFLite metadata must say how MediaPipe normalizes them. Pass "
                "metadata={'normalization': (mean, std)} in pixel units, e.g. "
                "(127.5, 127.5) for the official (x - 127.5) / 127.5, or metadata=False "
                "(keras-vit export: --no-metadata).")
        logger.warning(
            "%r has no Normalization or Rescaling layer on its input; its TFLite metadata "
            "says it takes RGB pixels in [0, 255] (mean 0, std 1), as to_tflite assumes. "
            "Pass metadata={'normalization': (mean, std)} if it takes normalized pixels.",
            model.name)
        return [0.0] * 3, [1.0] * 3, "assumed: the model takes 0..255 pixels"
    if not isinstance(normalization, (tuple, list)) or len(normalization) != 2:
        raise ValueError(f"metadata normalization={normalization!r}; give 'auto' or "
                         "(mean, std) in pixel units, e.g. (127.5, 127.5).")
    mean, std = _channels(normalization[0], "mean"), _channels(normalization[1], "std")
    if min(std) <= 0:
        raise ValueError(f"metadata normalization std={normalization[1]!r}; every std "
                         "must be > 0.")
    layer = _input_normalization_layer(model)
    if layer is not None and (mean, std) != ([0.0] * 3, [1.0] * 3):
        raise ValueError(
            f"metadata normalization={tuple(normalization)!r}, but {model.name!r} "
            f"normalizes its input in its graph ({type(layer).__name__} layer "
            f"{layer.name!r}): its TFLite file takes 0..255 pixels, and MediaPipe would "
            "normalize them twice. Leave normalization out ('auto': mean 0, std 1).")
    return mean, std, "given"


def classifier_labels(model, num_classes, labels=None):
    """`(names, source)` for the label file: `labels` when given, else the
    model's class names, else the ImageNet-1k / ImageNet-21k names for a
    1000 / 21843-class head (downloaded once, see
    `keras_vit.preprocessing.class_names`), else `class_<i>`
    (`keras_vit.labels.class_labels`, each name on one line)."""
    return labels_lib.class_labels(
        model, num_classes, labels, what="metadata labels", label_file=True,
        unavailable=("the metadata", "Give the names: metadata={'labels': [...]} or "
                     "keras_vit.labels.set_class_names(model, names), or export with "
                     "metadata=False (keras-vit export: --no-metadata)."))


def _options(metadata):
    if metadata is True:
        return {}
    if isinstance(metadata, dict):
        unknown = sorted(set(metadata) - set(METADATA_KEYS))
        if unknown:
            raise ValueError(f"metadata has unknown key(s) {unknown}; allowed: "
                             f"{METADATA_KEYS}.")
        for key in ("name", "description", "version", "author", "license"):
            if metadata.get(key) is not None and not isinstance(metadata[key], str):
                raise TypeError(f"metadata {key}={metadata[key]!r}; give a string.")
        return dict(metadata)
    raise TypeError(f"metadata={metadata!r}; give True, False or a dict with keys "
                    f"{METADATA_KEYS}.")


def _fmt(values):
    return ", ".join(f"{v:g}" for v in values)


def classifier_metadata(model, *, image_size, quantization="none", metadata=True):
    """The metadata `to_tflite` writes for `model` (a dict for
    `metadata_buffer`), or None for `metadata=False`. `metadata`: True, or a
    dict overriding `name`, `description`, `version`, `author`, `license`,
    `labels` (class names) and `normalization` (`"auto"` or `(mean, std)`,
    see `input_normalization`)."""
    if metadata is False or metadata is None:
        return None
    options = _options(metadata)
    num_classes = model_classes(model)
    mean, std, how = input_normalization(model, options.get("normalization", "auto"))
    names, source = classifier_labels(model, num_classes, options.get("labels"))
    height, width = (int(s) for s in image_size)
    if mean == [0.0] * 3 and std == [1.0] * 3:
        pixels = "float32 RGB pixels in [0, 255] (the model normalizes them itself)"
    else:
        pixels = (f"float32 RGB pixels normalized as (pixel - mean) / std, mean "
                  f"({_fmt(mean)}), std ({_fmt(std)})")
    description = options.get("description") or (
        f"Image classifier over {num_classes} classes (keras_vit, Keras model "
        f"{model.name!r}, TFLite quantization {quantization!r}). Input: one "
        f"{height}x{width} image, {pixels}. Outputs: probabilities, then logits, in the "
        f"order of {LABELS_FILE}.")
    return {
        "name": options.get("name") or model.name,
        "description": description,
        "version": options.get("version") or f"keras_vit {__version__}",
        "author": options.get("author"), "license": options.get("license"),
        "image_size": (height, width), "mean": mean, "std": std, "normalization_source": how,
        "labels": names, "labels_source": source,
        "input_description": (
            f"Input image to be classified: {height}x{width}, three channels (red, green, "
            f"blue) per pixel, {pixels}."),
    }


# --- writing ------------------------------------------------------------------

class _Writer:
    """The few flatbuffers builder calls metadata_schema.fbs needs."""

    def __init__(self):
        self.b = flatbuffers.Builder(1024)

    def string(self, text):
        return None if text is None else self.b.CreateString(text)

    def floats(self, values):
        self.b.StartVector(4, len(values), 4)
        for value in reversed(values):
            self.b.PrependFloat32(float(value))
        return self.b.EndVector()

    def tables(self, offsets):
        self.b.StartVector(4, len(offsets), 4)
        for offset in reversed(offsets):
            self.b.PrependUOffsetTRelative(offset)
        return self.b.EndVector()

    def table(self, slots, **fields):
        """A table of `slots` fields; `fields`: `f<slot>=value` for offsets,
        `i8_<slot>` / `u8_<slot>` / `u32_<slot>` for scalars (None: absent)."""
        b = self.b
        b.StartObject(slots)
        for key, value in fields.items():
            if value is None:
                continue
            kind, slot = key.rsplit("_", 1) if "_" in key else ("f", key[1:])
            slot = int(slot)
            if kind == "f":
                b.PrependUOffsetTRelativeSlot(slot, value, 0)
            elif kind == "i8":
                b.PrependInt8Slot(slot, value, 0)
            elif kind == "u8":
                b.PrependUint8Slot(slot, value, 0)
            elif kind == "u32":
                b.PrependUint32Slot(slot, value, 0)
            else:
                raise AssertionError(key)
        return b.EndObject()


def _labels_file(w):
    return w.table(5, f0=w.string(LABELS_FILE),
                   f1=w.string("Labels for the classes the model recognizes, one per line, "
                               "in output order."),
                   i8_2=TENSOR_AXIS_LABELS)


def _output_tensor(w, name, description, stats=None):
    feature = w.table(0)
    content = w.table(3, u8_0=FEATURE_PROPERTIES, f1=feature)
    stats_offset = None
    if stats is not None:
        maximum, minimum = w.floats([stats[1]]), w.floats([stats[0]])
        stats_offset = w.table(2, f0=maximum, f1=minimum)
    files = w.tables([_labels_file(w)])
    return w.table(7, f0=w.string(name), f1=w.string(description), f3=content,
                   f5=stats_offset, f6=files)


def metadata_buffer(info):
    """The `ModelMetadata` flatbuffer (bytes, identifier `M001`) of
    `classifier_metadata(...)`'s dict: one subgraph, input `image`, outputs
    `probabilities` and `logits` (in that order) with `labels.txt`."""
    w = _Writer()
    height, width = info["image_size"]
    mean, std = info["mean"], info["std"]
    n = len(info["labels"])
    # input: image, RGB, normalization, value range after normalization
    size = w.table(2, u32_0=width, u32_1=height)
    image = w.table(2, i8_0=RGB, f1=size)
    content = w.table(3, u8_0=IMAGE_PROPERTIES, f1=image)
    normalization = w.table(2, f0=w.floats(mean), f1=w.floats(std))
    units = w.tables([w.table(2, u8_0=NORMALIZATION_OPTIONS, f1=normalization)])
    maximum = w.floats([(255.0 - m) / s for m, s in zip(mean, std, strict=True)])
    minimum = w.floats([(0.0 - m) / s for m, s in zip(mean, std, strict=True)])
    stats = w.table(2, f0=maximum, f1=minimum)
    image_tensor = w.table(7, f0=w.string("image"), f1=w.string(info["input_description"]),
                           f3=content, f4=units, f5=stats)
    outputs = [
        _output_tensor(w, "probabilities", f"Probabilities of the {n} classes (softmax), "
                       f"in the order of {LABELS_FILE}.", stats=(0.0, 1.0)),
        _output_tensor(w, "logits", f"Logits (scores before the softmax) of the {n} "
                       f"classes, in the order of {LABELS_FILE}."),
    ]
    subgraph = w.table(10, f0=w.string("image_classifier"), f2=w.tables([image_tensor]),
                       f3=w.tables(outputs))
    root = w.table(8, f0=w.string(info["name"]), f1=w.string(info["description"]),
                   f2=w.string(info.get("version")), f3=w.tables([subgraph]),
                   f4=w.string(info.get("author")), f5=w.string(info.get("license")),
                   f7=w.string(MIN_PARSER_VERSION))
    w.b.Finish(root, file_identifier=METADATA_IDENTIFIER)
    return bytes(w.b.Output())


def _aligned_buffer_class(schema):
    class AlignedBufferT(schema.BufferT):
        """Packs constant data 16-byte aligned (the object API's own Pack
        aligns uint8 vectors to 1 byte)."""

        def Pack(self, builder):  # noqa: N802 - the flatbuffers object API name
            if self.data is not None and len(self.data):
                array = np.ascontiguousarray(self.data, dtype=np.uint8).reshape(-1)
                builder.Prep(16, array.size)
                data = builder.CreateNumpyVector(array)
                schema.BufferStart(builder)
                schema.BufferAddData(builder, data)
                schema.BufferAddOffset(builder, self.offset)
                schema.BufferAddSize(builder, self.size)
                return schema.BufferEnd(builder)
            return super().Pack(builder)

    return AlignedBufferT


def unpack_model(content):
    """A TFLite flatbuffer as the schema's object API `ModelT` (constant data
    as NumPy views of `content`)."""
    schema = _compat.tflite_schema()
    return schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(content, 0))


def pack_model(model, size_hint=0):
    """`ModelT` back to TFLite flatbuffer bytes, constant data 16-byte aligned."""
    aligned = _aligned_buffer_class(_compat.tflite_schema())
    for buffer in model.buffers or []:
        buffer.__class__ = aligned
    builder = flatbuffers.Builder(size_hint + 4096)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_IDENTIFIER)
    return bytes(builder.Output())


def _signature_outputs(model):
    """{signature output name: tensor index} of `serving_default`."""
    for signature in model.signatureDefs or []:
        key = signature.signatureKey
        key = key.decode() if isinstance(key, bytes) else key
        if key == "serving_default":
            return {(o.name.decode() if isinstance(o.name, bytes) else o.name): o.tensorIndex
                    for o in signature.outputs or []}
    return {}


def add_metadata(content, metadata, files):
    """`content` (a TFLite flatbuffer, bytes) with `metadata` (a
    `ModelMetadata` flatbuffer) as its `TFLITE_METADATA` entry and `files`
    ({name: bytes}) zipped after it, as `MetadataPopulator` does; the
    subgraph's outputs put in `OUTPUT_ORDER` (the signature's names, which
    `serving_default` keeps: only the order MediaPipe reads changes)."""
    schema = _compat.tflite_schema()
    model = unpack_model(content)
    if any(buffer.offset > 1 for buffer in model.buffers or []):
        raise ValueError("This TFLite model keeps its weights outside the flatbuffer "
                         "(over 2 GB); metadata cannot be added. Export with "
                         "metadata=False (keras-vit export: --no-metadata).")
    subgraph = model.subgraphs[0]
    names = _signature_outputs(model)
    if set(OUTPUT_ORDER) <= set(names):
        order = [names[name] for name in OUTPUT_ORDER]
        assert sorted(order) == sorted(int(i) for i in subgraph.outputs), (order,
                                                                           subgraph.outputs)
        subgraph.outputs = np.asarray(order, dtype=np.int32)
    elif len(subgraph.outputs) != len(OUTPUT_ORDER):
        raise ValueError(f"The TFLite model has {len(subgraph.outputs)} outputs; the "
                         f"classifier metadata describes {OUTPUT_ORDER}.")
    aligned = _aligned_buffer_class(schema)
    entry = None
    for item in model.metadata or []:
        name = item.name.decode() if isinstance(item.name, bytes) else item.name
        if name == METADATA_NAME:
            entry = item
    buffer = aligned()
    buffer.data = np.frombuffer(metadata, dtype=np.uint8)
    if entry is not None:
        model.buffers[entry.buffer] = buffer
    else:
        model.buffers.append(buffer)
        entry = schema.MetadataT()
        entry.name = METADATA_NAME
        entry.buffer = len(model.buffers) - 1
        model.metadata = (model.metadata or []) + [entry]
    out = io.BytesIO()
    out.write(pack_model(model, len(content) + len(metadata)))
    with zipfile.ZipFile(out, "a") as archive:  # appended after the flatbuffer
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            archive.writestr(info, data, compress_type=zipfile.ZIP_STORED)
    return out.getvalue()


def with_classifier_metadata(content, info):
    """`content` with the metadata of `info` (`classifier_metadata`'s dict)
    and its label file inside."""
    labels = labels_lib.labels_text(info["labels"]).encode("utf-8")
    return add_metadata(content, metadata_buffer(info), {LABELS_FILE: labels})


# --- reading ------------------------------------------------------------------

def _read_tables():
    class T:
        def __init__(self, buf, pos):
            self.t = Table(buf, pos)

        def _off(self, slot):
            return self.t.Offset(4 + 2 * slot)

        def string(self, slot):
            o = self._off(slot)
            return self.t.String(o + self.t.Pos).decode("utf-8") if o else None

        def table(self, slot):
            o = self._off(slot)
            return T(self.t.Bytes, self.t.Indirect(o + self.t.Pos)) if o else None

        def tables(self, slot):
            o = self._off(slot)
            if not o:
                return []
            start = self.t.Vector(o)
            return [T(self.t.Bytes, self.t.Indirect(start + 4 * i))
                    for i in range(self.t.VectorLen(o))]

        def floats(self, slot):
            o = self._off(slot)
            if not o:
                return None
            start = self.t.Vector(o)
            return [float(self.t.Get(N.Float32Flags, start + 4 * i))
                    for i in range(self.t.VectorLen(o))]

        def scalar(self, slot, flags, default=0):
            o = self._off(slot)
            return self.t.Get(flags, o + self.t.Pos) if o else default

    return T, N


def _parse_metadata(buf):
    """`ModelMetadata` flatbuffer -> dict (the fields this module writes, and
    the associated files and process units of any metadata)."""
    T, N = _read_tables()  # noqa: N806  Table, number types
    if bytes(buf[4:8]) != METADATA_IDENTIFIER:
        raise ValueError(f"The {METADATA_NAME} entry is not a TFLite Metadata flatbuffer "
                         f"(identifier {bytes(buf[4:8])!r}, expected {METADATA_IDENTIFIER!r}).")
    root = T(buf, int.from_bytes(bytes(buf[:4]), "little"))

    def files(table, slot):
        return [{"name": f.string(0), "description": f.string(1),
                 "type": _ASSOCIATED_FILE_TYPES.get(f.scalar(2, N.Int8Flags), "UNKNOWN"),
                 "locale": f.string(3)} for f in table.tables(slot)]

    def tensor(t):
        out = {"name": t.string(0), "description": t.string(1), "content": None}
        content = t.table(3)
        if content is not None:
            kind = content.scalar(0, N.Uint8Flags)
            out["content"] = _CONTENT_TYPES.get(kind, f"type {kind}")
            properties = content.table(1)
            if kind == IMAGE_PROPERTIES and properties is not None:
                out["color_space"] = _COLOR_SPACES.get(properties.scalar(0, N.Int8Flags))
                size = properties.table(1)
                if size is not None:
                    out["default_size"] = {"width": size.scalar(0, N.Uint32Flags),
                                           "height": size.scalar(1, N.Uint32Flags)}
        units = []
        for unit in t.tables(4):
            kind = unit.scalar(0, N.Uint8Flags)
            entry = {"type": _PROCESS_UNITS.get(kind, f"type {kind}")}
            options = unit.table(1)
            if kind == NORMALIZATION_OPTIONS and options is not None:
                entry.update(mean=options.floats(0), std=options.floats(1))
            units.append(entry)
        out["process_units"] = units
        stats = t.table(5)
        out["stats"] = None if stats is None else {"min": stats.floats(1),
                                                   "max": stats.floats(0)}
        out["associated_files"] = files(t, 6)
        return out

    meta = {"name": root.string(0), "description": root.string(1),
            "version": root.string(2), "author": root.string(4),
            "license": root.string(5), "min_parser_version": root.string(7),
            "associated_files": files(root, 6), "inputs": [], "outputs": []}
    subgraphs = root.tables(3)
    if subgraphs:
        meta["inputs"] = [tensor(t) for t in subgraphs[0].tables(2)]
        meta["outputs"] = [tensor(t) for t in subgraphs[0].tables(3)]
        meta["associated_files"] += files(subgraphs[0], 4)
    return meta


def _labels(data):
    return labels_lib.parse_labels(data.decode("utf-8"))


def read_tflite_metadata(path):
    """The TFLite Metadata of a `.tflite` file (a path or its bytes), as a
    dict, or None when it has none.

    Keys: `name`, `description`, `version`, `author`, `license`,
    `min_parser_version`; `inputs` / `outputs`: one dict per subgraph
    input / output in order, the metadata (`name`, `description`,
    `content` "image" / "feature", `color_space`, `process_units`,
    `stats`, `associated_files`) with the tensor's `tensor` name, `shape`
    and `dtype`, and `labels` (the names of its `TENSOR_AXIS_LABELS` file);
    `packed_files`: {name: size} of the zip after the flatbuffer;
    shortcuts: `normalization` (`{"mean", "std"}` of the first input, None
    without one) and `labels` (of the first output).

    Example:

    >>> meta = read_tflite_metadata("vit.tflite")  # needs an exported file  # doctest: +SKIP
    >>> meta["outputs"][0]["name"], meta["outputs"][0]["stats"]  # doctest: +SKIP
    ('probabilities', {'min': [0.0], 'max': [1.0]})
    >>> meta["packed_files"]  # doctest: +SKIP
    {'labels.txt': 60}
    """
    if isinstance(path, (bytes, bytearray, memoryview)):
        content, where = bytes(path), "the given bytes"
    else:
        with open(path, "rb") as f:
            content, where = f.read(), repr(str(path))
    if len(content) < 8 or content[4:8] != TFLITE_IDENTIFIER:
        raise ValueError(f"{where} is not a TFLite model (no {TFLITE_IDENTIFIER!r} "
                         "file identifier).")
    schema = _compat.tflite_schema()
    model = schema.Model.GetRootAsModel(content, 0)
    buf = None
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name().decode("utf-8") == METADATA_NAME:
            buffer = model.Buffers(entry.Buffer())
            if buffer.DataLength():
                buf = buffer.DataAsNumpy().tobytes()
    if buf is None:
        return None
    meta = _parse_metadata(buf)
    packed = {}
    if zipfile.is_zipfile(io.BytesIO(content)):
        with zipfile.ZipFile(io.BytesIO(content)) as archive:
            packed = {name: archive.read(name) for name in archive.namelist()}
    meta["packed_files"] = {name: len(data) for name, data in packed.items()}
    subgraph = model.Subgraphs(0)
    for kind, count, index in (("inputs", subgraph.InputsLength(), subgraph.Inputs),
                               ("outputs", subgraph.OutputsLength(), subgraph.Outputs)):
        for i, entry in enumerate(meta[kind][:count]):
            t = subgraph.Tensors(index(i))
            entry.update(tensor=t.Name().decode("utf-8"),
                         shape=[int(d) for d in t.ShapeAsNumpy()],
                         dtype=_TENSOR_TYPES.get(t.Type(), f"type {t.Type()}"))
    for entry in meta["inputs"] + meta["outputs"]:
        entry["labels"] = None
        for file in entry["associated_files"]:
            if file["type"] == "TENSOR_AXIS_LABELS" and file["name"] in packed:
                entry["labels"] = _labels(packed[file["name"]])
                break
    norm = [u for u in (meta["inputs"][0]["process_units"] if meta["inputs"] else [])
            if u["type"] == "normalization"]
    meta["normalization"] = ({"mean": norm[0]["mean"], "std": norm[0]["std"]}
                             if norm else None)
    meta["labels"] = meta["outputs"][0]["labels"] if meta["outputs"] else None
    return meta


def normalize(images, meta):
    """`images` (0..255 pixels) as MediaPipe feeds them to a file with
    metadata `meta`: `(pixel - mean) / std` per channel (a mean or std of one
    value applies to every channel); as they are without metadata."""
    if not meta or not meta.get("normalization"):
        return np.asarray(images, "float32")
    mean = np.asarray(meta["normalization"]["mean"], "float32")
    std = np.asarray(meta["normalization"]["std"], "float32")
    return (np.asarray(images, "float32") - mean) / std


def summary(meta):
    """One line for the export report."""
    if meta is None:
        return None
    norm = meta["normalization"]
    mean = _fmt(sorted(set(norm["mean"]))) if norm else "-"
    std = _fmt(sorted(set(norm["std"]))) if norm else "-"
    labels = meta["labels"] or []
    return (f"TFLite Metadata: RGB image, normalization mean {mean} std {std}; outputs "
            f"{', '.join(o['name'] for o in meta['outputs'])}; {len(labels)} labels inside "
            f"({', '.join(meta['packed_files'])})")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m keras_vit.export MODEL.tflite  (prints its TFLite Metadata)",
              file=sys.stderr)
        return 2
    try:
        meta = read_tflite_metadata(argv[0])
    except (OSError, ValueError) as error:
        print(f"error: {error_message(error)[0]}", file=sys.stderr)  # one line
        return 2
    if meta is None:
        print(f"{argv[0]}: no TFLite Metadata (exported with metadata=False, or by "
              "another tool).")
        return 1
    for entry in meta["inputs"] + meta["outputs"]:
        if entry.get("labels") and len(entry["labels"]) > 10:
            entry["labels"] = entry["labels"][:10] + [f"... ({len(entry['labels'])} in all)"]
    meta["labels"] = meta["outputs"][0]["labels"] if meta["outputs"] else None
    # one line per list of numbers or short strings
    print(re.sub(r"\[\n\s+([^\[\]{}]*?)\n\s*\]",
                 lambda m: "[" + re.sub(r",\n\s+", ", ", m.group(1)) + "]",
                 json.dumps(meta, indent=1)))
    return 0
