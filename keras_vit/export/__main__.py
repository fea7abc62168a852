"""`python -m keras_vit.export MODEL.tflite`: the TFLite Metadata of a file
(input normalization, outputs, labels inside) as JSON; exit status 1 when
it has none."""

import sys

from keras_vit import _console
from keras_vit.export.tflite_metadata import main

# (keras_vit's __init__ quieted TensorFlow before it was imported, as the
# `keras-vit` command does; LiteRT's native lines are filtered out here.)
with _console.filtered_stderr():
    status = main()
sys.exit(status)
