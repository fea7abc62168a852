"""`python -m keras_vit.export MODEL.tflite`: the TFLite Metadata of a file
(input normalization, outputs, labels inside) as JSON; exit status 1 when
it has none."""

import sys

from keras_vit.export.tflite_metadata import main

sys.exit(main())
