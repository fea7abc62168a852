"""Small helpers shared by the layers (argument validation only)."""


def to_pair(value, name):
    """Returns `value` as a tuple of two positive ints (`16` -> `(16, 16)`)."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise TypeError(
            f"`{name}` must be an int or a pair of ints, got {value!r}."
        )
    if min(value) <= 0:
        raise ValueError(f"`{name}` must be positive, got {value!r}.")
    return tuple(int(v) for v in value)


def check_rate(value, name):
    """Checks that a dropout-style rate lies in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a float in [0, 1), got {value!r}.")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be in [0, 1), got {value!r}.")
    return float(value)


def check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be a positive int, got {value!r}.")
    if value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
    return int(value)


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
    import keras

    if keras.backend.backend() != "tensorflow":  # JAX, torch: shapes are concrete
        return inputs
    import tensorflow as tf

    check = tf.debugging.assert_equal(
        tf.shape(inputs)[-1], expected,
        message=f"The model takes images with {expected} channels; got another "
                "count (for grayscale images, repeat the channel: "
                "np.repeat(images, 3, axis=-1))")
    with tf.control_dependencies([check]):
        outputs = tf.identity(inputs)
    outputs.set_shape([*inputs.shape[:-1], expected])  # static only: the check runs first
    return outputs
