"""`run_layer_test`: the checks every public keras_vit layer passes, on the
model of keras-hub's `TestCase.run_layer_test`.

For one layer class, its constructor arguments and an input shape:

- config round trip: `from_config(get_config())` gives the same config (as
  JSON) with every constructor argument in it, and the same output with the
  same weights; so does `serialize_keras_object`/`deserialize_keras_object`
  through the registered name;
- `.keras` file: a functional model around the layer saves and loads with
  `safe_mode=True` and gives identical outputs; its symbolic output shapes
  are the eager ones;
- `mixed_bfloat16` (the global policy, and the `dtype` argument): it builds
  and runs, every sublayer follows the policy, every weight stays float32,
  each float output has the policy's compute dtype (bfloat16) unless the
  layer says it is float32 (attention weights: the softmax runs in float32),
  LayerNorm statistics are computed in float32, and the output follows the
  float32 layer's within bfloat16 rounding;
- `tf.data`: inside `Dataset.map` it gives the eager output (TensorFlow
  backend only: elsewhere tf.data cannot run a Keras layer).

Tests that use it are marked `pytest.mark.backends`, so that CI runs them
under JAX too (and `KERAS_BACKEND=torch python -m pytest -m backends` under
PyTorch).

>>> run_layer_test(layers.Patches, {"patch_size": 2}, (2, 4, 4, 3))  # doctest: +SKIP
"""

import json
import os
import tempfile

import keras
import numpy as np
from keras import ops

from keras_vit.layers import fused as _fused

MIXED = "mixed_bfloat16"


def run_layer_test(layer_cls, init_kwargs, input_shape, *, call_kwargs=None,
                   expected_output_shape=None, float32_outputs=(), seed=0):
    """Runs every check of this module on `layer_cls(**init_kwargs)` called on
    a random float32 batch of `input_shape` (with `call_kwargs`).

    `expected_output_shape`: the eager output's shape (a list of shapes for
    several outputs), if given. `float32_outputs`: indices of the (flattened)
    outputs that stay float32 under a mixed policy. Returns the float32 layer
    and its outputs, as a list of NumPy arrays.
    """
    call_kwargs = dict(call_kwargs or {})
    x = np.random.default_rng(seed).normal(size=input_shape).astype("float32")
    layer = layer_cls(**init_kwargs)
    outputs = _call(layer, x, call_kwargs)
    if expected_output_shape is not None:
        shapes = [tuple(y.shape) for y in outputs]
        expected = (expected_output_shape if isinstance(expected_output_shape, list)
                    else [expected_output_shape])
        assert shapes == [tuple(s) for s in expected], (shapes, expected)
    check_config_round_trip(layer, init_kwargs, x, outputs, call_kwargs)
    check_keras_file(layer, x, outputs, call_kwargs)
    check_mixed_bfloat16(layer_cls, init_kwargs, layer, x, outputs, call_kwargs,
                         float32_outputs)
    if keras.backend.backend() == "tensorflow":
        check_tf_data(layer, x, outputs, call_kwargs)
    return layer, outputs


def _flat(y):
    return list(y) if isinstance(y, (tuple, list)) else [y]


def _call(layer, x, call_kwargs):
    return [ops.convert_to_numpy(y) for y in _flat(layer(x, **call_kwargs))]


def _plain(value):
    return tuple(value) if isinstance(value, list) else value


def _config_json(layer):
    return json.dumps(layer.get_config(), sort_keys=True, default=repr)


def check_config_round_trip(layer, init_kwargs, x, outputs, call_kwargs):
    """Every constructor argument is in the config; the layer rebuilt from
    its config (directly and through its registered name) has the same
    config, and with the same weights gives the same output."""
    config = layer.get_config()
    for key, value in init_kwargs.items():
        assert _plain(config[key]) == _plain(value), (key, config[key], value)
    clone = type(layer).from_config(config)
    assert _config_json(clone) == _config_json(layer)
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    for got, want in zip(_call(clone, x, call_kwargs), outputs, strict=True):
        np.testing.assert_array_equal(got, want)
    # serialize/deserialize through the registered name, as a .keras file does
    revived = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(layer))))
    assert type(revived) is type(layer)
    assert _config_json(revived) == _config_json(layer)


def check_keras_file(layer, x, outputs, call_kwargs):
    """A functional model around `layer` (built, its weights as they are)
    saved as `.keras` and loaded with `safe_mode=True` gives identical
    outputs; its symbolic output shapes are the eager ones (batch free)."""
    inputs = keras.Input(x.shape[1:])
    model = keras.Model(inputs, layer(inputs, **call_kwargs))
    symbolic = [tuple(t.shape) for t in _flat(model.outputs)]
    assert symbolic == [(None, *y.shape[1:]) for y in outputs], symbolic
    expected = _call(model, x, {})
    for got, want in zip(expected, outputs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "layer.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
    assert any(type(sub) is type(layer) for sub in loaded.layers)
    for got, want in zip(_call(loaded, x, {}), expected, strict=True):
        np.testing.assert_array_equal(got, want)


def sublayers(layer):
    """Every layer inside `layer` (attributes, lists of layers), depth first."""
    found, seen, stack = [], {id(layer)}, [layer]
    while stack:
        for value in vars(stack.pop()).values():
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, keras.layers.Layer) and id(item) not in seen:
                    seen.add(id(item))
                    found.append(item)
                    stack.append(item)
    return found


def _mixed_layer(layer_cls, init_kwargs, how):
    if how == "argument":
        return layer_cls(**init_kwargs, dtype=MIXED)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(MIXED)
    try:
        return layer_cls(**init_kwargs)
    finally:
        keras.config.set_dtype_policy(previous)


def check_mixed_bfloat16(layer_cls, init_kwargs, layer, x, outputs, call_kwargs,
                         float32_outputs=()):
    """Under `mixed_bfloat16`, set globally or as the `dtype` argument:
    every sublayer has the policy, weights are float32, float outputs are
    bfloat16 (float32 at `float32_outputs`). With the global policy (the
    sublayers' policies being the same either way): LayerNorm statistics
    are float32 and the outputs follow the float32 `layer`'s (same weights)."""
    for how in ("global", "argument"):
        mixed = _mixed_layer(layer_cls, init_kwargs, how)
        mixed.build(x.shape)
        assert [w.dtype for w in mixed.weights] == ["float32"] * len(mixed.weights)
        mixed.set_weights(layer.get_weights())
        for sub in [mixed, *sublayers(mixed)]:
            assert sub.dtype_policy.name == MIXED, (how, sub.name, sub.dtype_policy.name)
        results = _flat(mixed(x, **call_kwargs))
        for i, (y, want) in enumerate(zip(results, outputs, strict=True)):
            dtype = keras.backend.standardize_dtype(y.dtype)
            if not dtype.startswith("float") and dtype != "bfloat16":
                continue
            assert dtype == ("float32" if i in float32_outputs else "bfloat16"), (how, i, dtype)
            if how == "global":
                got = ops.convert_to_numpy(ops.cast(y, "float32"))
                np.testing.assert_allclose(got, want, rtol=0.05,
                                           atol=0.05 * max(float(np.abs(want).max()), 1.0))
        if how == "global":
            for norm in (s for s in sublayers(mixed)
                         if isinstance(s, keras.layers.LayerNormalization)):
                _check_float32_statistics(norm)


def _check_float32_statistics(norm):
    """LayerNorm (as the blocks call it, `_fused.layer_norm`) of rows of 256s
    and 258s in bfloat16: in float32 the mean is 257 and the output +-1; in
    bfloat16 257 is not representable (its spacing there is 2), so
    statistics computed in bfloat16 would be off by a whole unit."""
    width = norm.gamma.shape[-1]
    probe = np.tile(np.array([256.0, 258.0], "float32"), (width + 1) // 2)[:width]
    probe = np.broadcast_to(probe, (2, 3, width))
    y = _fused.layer_norm(norm, ops.cast(probe, "bfloat16"))
    assert keras.backend.standardize_dtype(y.dtype) == "bfloat16"
    mean, var = probe.mean(-1, keepdims=True), probe.var(-1, keepdims=True)
    gamma = ops.convert_to_numpy(norm.gamma).astype("float64")
    beta = ops.convert_to_numpy(norm.beta).astype("float64")
    expected = (probe - mean) / np.sqrt(var + norm.epsilon) * gamma + beta
    np.testing.assert_allclose(ops.convert_to_numpy(ops.cast(y, "float32")), expected,
                               rtol=1e-2, atol=1e-2)


def check_tf_data(layer, x, outputs, call_kwargs):
    """TensorFlow backend: `layer` inside `tf.data.Dataset.map` (a traced
    graph, the batch size unknown) gives the eager output."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices(x).batch(len(x)).map(
        lambda batch: layer(batch, **call_kwargs))
    got = _flat(next(iter(dataset)))
    for y, want in zip(got, outputs, strict=True):
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
