"""Small helpers shared by the layers: the channel-count check of their
inputs (argument checks live in `keras_vit._checks`)."""

import keras


def check_channels(shape, expected):
    """One ValueError when images of `shape` (channels last) do not have the
    `expected` channel count the model was built for (None: unknown, not
    checked). Keras' own input check lets a last axis of 1 through, and a
    grayscale batch would then be broadcast over the RGB channels."""
    got = shape[-1] if len(shape) else None
    if expected is None or got is None or got == expected:
        return
    hint = (" For grayscale images, repeat the channel explicitly first: "
            "np.repeat(images, 3, axis=-1) (keras.ops.repeat for tensors)."
            if got == 1 and expected == 3 else "")
    raise ValueError(
        f"The model takes images with {expected} channels"
        f"{' (RGB)' if expected == 3 else ''}; got {got} channel{'s' * (got != 1)} "
        f"(shape {tuple(shape)}).{hint}")


def checked_channels(inputs, expected):
    """`inputs` after `check_channels`; in a TensorFlow graph whose channel
    count is unknown when traced (`predict` on a batch of another shape
    relaxes the traced shape), the same sentence as a runtime assertion,
    and the static channel count restored."""
    check_channels(inputs.shape, expected)
    if expected is None or inputs.shape[-1] is not None:
        return inputs
    if keras.backend.backend() != "tensorflow":  # JAX, torch: shapes are concrete
        return inputs
    import tensorflow as tf  # the TensorFlow backend only (layers run on every backend)

    check = tf.debugging.assert_equal(
        tf.shape(inputs)[-1], expected,
        message=f"The model takes images with {expected} channels; got another "
                "count (for grayscale images, repeat the channel: "
                "np.repeat(images, 3, axis=-1))")
    with tf.control_dependencies([check]):
        outputs = tf.identity(inputs)
    outputs.set_shape([*inputs.shape[:-1], expected])  # static only: the check runs first
    return outputs


def dtype_config(layer):
    """`layer`'s `dtype` for its config: its policy, or, when some of its
    `dense_layers` are quantized (`model.quantize(...)`), a
    `keras.dtype_policies.DTypePolicyMap` of their quantized policies under
    `<layer name>/<sublayer name>` over the layer's own policy, as keras-hub
    saves quantized backbones. A block built from that config gives each
    sublayer its policy (`sublayer_policy`), so a reloaded block builds the
    quantized variables the file holds.

    Example (in a block's `get_config`):

    >>> config["dtype"] = dtype_config(self)  # a line of a method  # doctest: +SKIP
    """
    quantized = {f"{layer.name}/{sublayer.name}": sublayer.dtype_policy
                 for sublayer in layer.dense_layers
                 if sublayer is not None and sublayer.quantization_mode}
    if not quantized:
        return keras.dtype_policies.serialize(sublayer_policy(layer))
    return keras.dtype_policies.serialize(keras.dtype_policies.DTypePolicyMap(
        default_policy=sublayer_policy(layer), policy_map=quantized))


def sublayer_policy(layer, name=None):
    """The dtype policy `layer` gives its sublayer `name`: its own, or, for a
    block built from a quantized config (`dtype_config`'s map), the policy
    saved for `<layer name>/<name>` (the map's default for `name=None`)."""
    policy = layer.dtype_policy
    if isinstance(policy, keras.dtype_policies.DTypePolicyMap):
        return policy.default_policy if name is None else policy[f"{layer.name}/{name}"]
    return policy
