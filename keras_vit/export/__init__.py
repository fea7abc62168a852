"""Export to SavedModel (a uint8 `serving_default` signature) and to
LiteRT / TFLite (float32, float16, dynamic-range int8, full int8), each
verified against the Keras model.

>>> from keras_vit import export
>>> export.to_saved_model(model, "served/1", resize=True)  # doctest: +SKIP
>>> export.to_tflite(model, "model.tflite", quantization="dynamic")  # doctest: +SKIP
"""

from keras_vit.export._common import ExportReport, ExportVerificationError
from keras_vit.export.saved_model import serving_function, to_saved_model
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

__all__ = [
    "CHECKS", "ExportReport", "ExportVerificationError", "INT8_FLOAT_OPS",
    "QUANTIZATIONS", "convert", "run_tflite", "serving_function", "tflite_ops",
    "to_saved_model", "to_tflite", "verify_tflite",
]
