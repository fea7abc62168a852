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
