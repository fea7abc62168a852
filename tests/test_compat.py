"""Each private framework hook in keras_vit/_compat.py, checked against the
installed Keras / TensorFlow / LiteRT: a test here fails loudly when the
assumption behind a hook stops holding."""

# --- saving, training and layers ---------------------------------------------

# --- export --------------------------------------------------------------------
