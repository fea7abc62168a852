"""Export to SavedModel (a uint8 `serving_default` signature) and to
LiteRT / TFLite (float32, float16, dynamic-range int8, full int8), each
verified against the Keras model on a seeded class-stratified sample of the
data's validation split (int8 calibrated on its train split), written
atomically (temporary name, verify, rename; a miss goes to
`<path>.rejected` with `<path>.rejected.json`), with the model's class
names inside (SavedModel `assets/labels.txt`, TFLite `<stem>.labels.txt`
and, with the input normalization, in its TFLite Metadata: MediaPipe
Tasks' `ImageClassifier` opens it; `read_tflite_metadata` reads it back).
ONNX (`to_onnx`: float32, dynamic or static int8, verified with ONNX
Runtime) and OpenVINO IR (`to_openvino`, verified with the OpenVINO
runtime) take float32 pixels with any batch, their class names inside the
file and in `<stem>.labels.txt`.

The examples read a folder of images (`/data/digits`): the tests skip them.

>>> from keras_vit import export
>>> export.to_saved_model(model, "served/1", resize=True,
...                       validation_data="folder:/data/digits")  # doctest: +SKIP
>>> report = export.to_tflite(model, "model.tflite", quantization="int8",
...                           representative_data="folder:/data/digits")  # doctest: +SKIP
>>> report.calibration["split"], report.validation["split"]  # doctest: +SKIP
('train', 'test')
>>> export.to_onnx(model, "model.onnx", quantization="int8",
...                representative_data="folder:/data/digits")  # doctest: +SKIP
>>> export.to_openvino(model, "model.xml",
...                    validation_data="folder:/data/digits")  # doctest: +SKIP
>>> export.onnx_class_names("model.onnx")[:3]  # doctest: +SKIP
['0', '1', '2']
"""

from keras_vit.export._labels import labels_path
from keras_vit.errors import ExportVerificationError
from keras_vit.export._report import ExportReport
from keras_vit.export.hub_folder import to_hub_folder
from keras_vit.export.onnx import onnx_class_names, run_onnx, to_onnx, verify_onnx
from keras_vit.export.openvino import (
    openvino_class_names,
    run_openvino,
    to_openvino,
    verify_openvino,
)
from keras_vit.export.saved_model import LABELS_ASSET, serving_function, to_saved_model
from keras_vit.export.tflite import (
    CHECKS,
    INT8_FLOAT_OPS,
    QUANTIZATIONS,
    convert,
    run_tflite,
    tflite_ops,
    to_tflite,
    verify_tflite,
)
from keras_vit.export.tflite_metadata import read_tflite_metadata

__all__ = [
    "CHECKS", "ExportReport", "ExportVerificationError", "INT8_FLOAT_OPS",
    "LABELS_ASSET", "QUANTIZATIONS", "convert", "labels_path", "run_tflite",
    "serving_function", "tflite_ops",
    "to_saved_model", "to_tflite", "verify_tflite", "read_tflite_metadata",
    "onnx_class_names", "run_onnx", "to_onnx", "verify_onnx",
    "openvino_class_names", "run_openvino", "to_openvino", "verify_openvino",
    "to_hub_folder",
]
