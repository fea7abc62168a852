"""Every use of a private Keras, TensorFlow or LiteRT API, in one place.

keras_vit otherwise uses public API only. Each hook below names the versions
it was checked on and has a test in `tests/test_compat.py` that fails loudly
when the assumption it rests on stops holding (a renamed attribute, a moved
module): never a silent fallback. When a framework release breaks one, this
file and that test are the only places to look.

Checked on: Keras 3.13-3.15, TensorFlow 2.20-2.21, ai-edge-litert 2.x.
"""

# --- saving, training and layers ---------------------------------------------

# --- export --------------------------------------------------------------------
