"""Argument checks, one wording for the whole package: a wrong type is a
TypeError, a bad value a ValueError, each naming the argument, the value
and what is allowed ("`epochs` must be a positive integer, got 0.").
`keras_vit.cli` uses the same checks as argparse types, so `--epochs 0` and
`train(epochs=0)` say the same thing (argparse names the flag itself).

>>> positive_int(3, "epochs")
3
>>> fraction(0.1, "holdout")
0.1
>>> positive_int_pair(16, "patch_size")
(16, 16)
"""

import difflib
import math
import numbers
import os
import unicodedata


def _fail(error, value, name, allowed, hint):
    """Raises `error` (TypeError or ValueError) in the one wording."""
    named = f"`{name}` " if name else ""
    raise error(f"{named}must be {allowed}{f' ({hint})' if hint else ''}, got {value!r}.")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(value, name=None, hint=None, *, or_none=False):
    """`value` (an int > 0, not a bool) as an int; None as it is with
    `or_none`. `hint` says what the argument is, in the message.

    >>> positive_int(0, "batch_size")
    Traceback (most recent call last):
    ValueError: `batch_size` must be a positive integer, got 0.
    """
    allowed = "a positive integer" + (" or None" if or_none else "")
    if value is None and or_none:
        return None
    if not _is_int(value):
        _fail(TypeError, value, name, allowed, hint)
    if value <= 0:
        _fail(ValueError, value, name, allowed, hint)
    return int(value)


def boolean(value, name=None, hint=None):
    """`value` (True or False, a NumPy bool too) as a bool: a flag given
    as 1, "yes" or None is a TypeError, not silently true or false.

    >>> boolean("false", "ema")
    Traceback (most recent call last):
    TypeError: `ema` must be True or False, got 'false'.
    """
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    if not (isinstance(value, bool) or numpy_bool):  # NumPy is not imported here: the CLI
        _fail(TypeError, value, name, "True or False", hint)
    return bool(value)


def non_negative_int(value, name=None, hint=None):
    """`value` (an int >= 0, not a bool) as an int."""
    if not _is_int(value):
        _fail(TypeError, value, name, "an integer >= 0", hint)
    if value < 0:
        _fail(ValueError, value, name, "an integer >= 0", hint)
    return int(value)


# The seeds NumPy (and so `keras.utils.set_random_seed`) takes.
MAX_SEED = 2**32 - 1


def seed(value, name=None, hint=None):
    """`value` (an int in [0, 2**32 - 1], not a bool) as an int: a random
    seed, checked before any work (NumPy refuses a larger one only when
    `keras.utils.set_random_seed` runs, seconds into a command).

    >>> seed(-1, "seed")
    Traceback (most recent call last):
    ValueError: `seed` must be an integer from 0 to 4294967295 (2**32 - 1), got -1.
    """
    allowed = f"an integer from 0 to {MAX_SEED} (2**32 - 1)"
    if not _is_int(value):
        _fail(TypeError, value, name, allowed, hint)
    if not 0 <= value <= MAX_SEED:
        _fail(ValueError, value, name, allowed, hint)
    return int(value)


def positive_float(value, name=None, hint=None):
    """`value` (a finite number > 0, not a bool) as a float."""
    if not _is_real(value):
        _fail(TypeError, value, name, "a finite number > 0", hint)
    if not math.isfinite(value) or value <= 0:
        _fail(ValueError, value, name, "a finite number > 0", hint)
    return float(value)


def fraction(value, name=None, hint=None):
    """`value` (a number in [0, 1), not a bool) as a float: a dropout
    rate, a holdout fraction."""
    if not _is_real(value):
        _fail(TypeError, value, name, "a number in [0, 1)", hint)
    if not 0 <= value < 1:  # (NaN fails this too)
        _fail(ValueError, value, name, "a number in [0, 1)", hint)
    return float(value)


def positive_int_pair(value, name=None, hint=None):
    """`value` (a positive int, or a pair of them) as a tuple of two ints:
    `16` -> `(16, 16)`, `[224, 160]` -> `(224, 160)`."""
    allowed = "a positive integer or a pair of positive integers"
    pair = (value, value) if _is_int(value) else value
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(_is_int(v) for v in pair)):
        _fail(TypeError, value, name, allowed, hint)
    if min(pair) <= 0:
        _fail(ValueError, value, name, allowed, hint)
    return tuple(int(v) for v in pair)


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


MAX_IMAGE_PIXELS_ENV = "KERAS_VIT_MAX_IMAGE_PIXELS"
DEFAULT_MAX_IMAGE_PIXELS = 178_956_970  # Pillow's decompression-bomb error bound


def max_image_pixels():
    """The most pixels (height x width) an image may have: one to be
    decoded by `keras_vit.data.make_dataset` (the size is read from the
    image's header before decoding), and the input a `.keras` file's model
    declares (every image is resized to it): `$KERAS_VIT_MAX_IMAGE_PIXELS`,
    default 178,956,970 (as Pillow's decompression-bomb bound; about
    13,000 x 13,000, 0.5 GB decoded).

    >>> os.environ["KERAS_VIT_MAX_IMAGE_PIXELS"] = "1_000_000"
    >>> max_image_pixels()
    1000000
    >>> del os.environ["KERAS_VIT_MAX_IMAGE_PIXELS"]

    Raises:
        ValueError: the variable is set to something other than a positive
            integer.
    """
    return positive_env(MAX_IMAGE_PIXELS_ENV, DEFAULT_MAX_IMAGE_PIXELS, "pixels")


def label_line_problem(name):
    """Why `name` cannot be a class name, one line of a label file (one
    class name per line, UTF-8, as `labels.txt` and the export label files)
    and of a terminal, or None when it can: "a line break ('\\\\n')" (any
    character `str.splitlines` breaks at), "a control character ('\\\\t')"
    (an ANSI escape too) or "an undecodable byte" (a file name that is not
    UTF-8). Spaces and every printable character are fine. The one rule for
    class names wherever they enter: a class folder, a head's `class_names`
    (the API, a `.keras` file), a `--labels` file, a Hub config.

    >>> label_line_problem("a\\nb")
    "a line break ('\\\\n')"
    >>> label_line_problem("tabby cat") is None
    True
    """
    for char in str(name):
        kind = unicodedata.category(char)
        if len(f"a{char}b".splitlines()) > 1:
            return f"a line break ({char!r})"
        if kind == "Cc":
            return f"a control character ({char!r})"
        if kind == "Cs":
            return "an undecodable byte (the name is not UTF-8)"
    return None


def did_you_mean(value, choices, cutoff=0.75):
    """`" (did you mean 'ViTTi16'?)"`: the `choices` closest to `value`
    (difflib, case ignored; the one that differs only in case, else at
    most 3 at a similarity of `cutoff` or more), or `""` when none is
    close. The one wording of a mistyped name (a model, a class).

    >>> did_you_mean("ViTTI16", ["ViTTi16", "ViTS16", "ViTB16"])
    " (did you mean 'ViTTi16'?)"
    >>> did_you_mean("zebra", ["cat", "dog"])
    ''
    """
    choices = [str(c) for c in choices]
    folded = {}
    for choice in choices:
        folded.setdefault(choice.casefold(), choice)
    key = str(value).casefold()
    close = [key] if key in folded else difflib.get_close_matches(key, list(folded), n=3,
                                                                 cutoff=cutoff)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(folded[c]) for c in close)}?)"
