"""Checks of numeric arguments: one ValueError naming the argument, the
value and what is allowed. `keras_vit.cli` uses the same checks as argparse
types, so `--epochs 0` and `train(epochs=0)` say the same thing."""

import math
import numbers
import os


def _name(name):
    return f"{name} " if name else ""


def positive_int(value, name=None):
    """`value` if it is an int > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{_name(name)}must be a positive integer, got {value!r}.")
    return int(value)


def non_negative_int(value, name=None):
    """`value` if it is an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{_name(name)}must be an integer >= 0, got {value!r}.")
    return int(value)


def positive_float(value, name=None):
    """`value` if it is a finite number > 0."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"{_name(name)}must be a finite number > 0, got {value!r}.")
    return float(value)


def fraction(value, name=None):
    """`value` if it is a number in [0, 1)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or not 0 <= value < 1):
        raise ValueError(f"{_name(name)}must be a number in [0, 1), got {value!r}.")
    return float(value)


def optional(check, **values):
    """Applies `check` to each keyword value that is not None."""
    for name, value in values.items():
        if value is not None:
            check(value, name)


def finite_or_none(obj):
    """`obj` with every NaN/inf float (nested in dicts, lists, tuples) as
    None, so that `json.dumps(..., allow_nan=False)` writes strict JSON."""
    if isinstance(obj, numbers.Real) and not isinstance(obj, numbers.Integral):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def positive_env(name, default, unit, whole=True, example=None):
    """The positive number in environment variable `name` (`default` when it
    is unset or empty): an int with `whole`, else a float; anything else is
    a ValueError naming the variable, the value and what is allowed (the
    bounds of keras_vit: download size and time, checkpoint size, image
    pixels).

    >>> os.environ["KERAS_VIT_EXAMPLE"] = "2.5"
    >>> positive_env("KERAS_VIT_EXAMPLE", 60.0, "seconds", whole=False)
    2.5
    >>> del os.environ["KERAS_VIT_EXAMPLE"]
    """
    raw = os.environ.get(name, "")
    text = raw.strip()
    if not text:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        example = example if example is not None else (default if whole else f"{default:g}")
        raise ValueError(f"{name} must be a positive {'whole ' if whole else ''}number of "
                         f"{unit} (e.g. {example}), got {raw!r}.")
    return value
