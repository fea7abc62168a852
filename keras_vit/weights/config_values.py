"""The values of a checkpoint's JSON files (`config.json`,
`preprocessor_config.json`), checked before they are used.

Each format module (`timm`, `transformers`) lists the keys it reads and
what each may hold (`CONFIG_VALUES`); `check_values` walks that list over
the parsed file and raises one `CorruptCheckpointError` naming the file,
the key, the value and what is allowed, so that no config value reaches
NumPy or the builders as a raw Python error (`int("big")`, a list where a
number belongs, a head count that does not divide the width). A key that
is absent, or `null` where the list allows it, is left to the reader's
default. No NumPy, no Keras.

>>> check_values({"model_args": {"num_heads": "big"}},
...              {"model_args.num_heads": OPTIONAL_POSITIVE_INT}, "config.json")
Traceback (most recent call last):
...
keras_vit.errors.CorruptCheckpointError: 'config.json': model_args.num_heads is "big"; \
expected a positive whole number, or null.
"""

import json
import numbers

from keras_vit.errors import CorruptCheckpointError


def json_type(value):
    """The JSON name of a parsed value's type ("object", "array", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    return "number"


def shown(value, limit=60):
    """A value as JSON spells it, cut to `limit` characters."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value):
    return _int(value) and value > 0


def _numbers(lengths, positive=False, scalar=True):
    def one(value):
        return _number(value) and (value > 0 or not positive)

    def check(value):
        return (scalar and one(value)) or (
            isinstance(value, list) and len(value) in lengths and all(map(one, value)))
    return check


def _names(value):
    if isinstance(value, list):
        return all(isinstance(v, str) for v in value)
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _size(value):  # an int, or [height, width]
    return _positive_int(value) or (isinstance(value, list) and len(value) == 2
                                    and all(map(_positive_int, value)))


def _optional(check, expected):
    return (lambda value: value is None or check(value)), f"{expected}, or null"


# (check, what is allowed), for the format modules' `CONFIG_VALUES`.
OBJECT = (lambda v: isinstance(v, dict), "a JSON object")
OPTIONAL_OBJECT = _optional(lambda v: isinstance(v, dict), "a JSON object")
STRING = (lambda v: isinstance(v, str), "a string")
OPTIONAL_STRING = _optional(lambda v: isinstance(v, str), "a string")
OPTIONAL_STRINGS = _optional(lambda v: isinstance(v, list) and all(
    isinstance(s, str) for s in v), "an array of strings")
BOOLEAN = (lambda v: isinstance(v, bool), "true or false")
POSITIVE_INT = (_positive_int, "a positive whole number")
POSITIVE_NUMBER = (lambda v: _number(v) and v > 0, "a positive number")
OPTIONAL_BOOLEAN = _optional(lambda v: isinstance(v, bool), "true or false")
OPTIONAL_POSITIVE_INT = _optional(_positive_int, "a positive whole number")
OPTIONAL_COUNT = _optional(lambda v: _int(v) and v >= 0, "a whole number >= 0")
OPTIONAL_POSITIVE_NUMBER = _optional(lambda v: _number(v) and v > 0, "a positive number")
OPTIONAL_NUMBER = _optional(_number, "a number")
OPTIONAL_RATIOS = _optional(_numbers((2,), positive=True),  # a Mixer's: (tokens, channels)
                            "a positive number or an array of 2")
# timm's mean and std: one number per channel; transformers' broadcast.
MEAN = (_numbers((3,), scalar=False), "an array of 3 numbers")
STD = (_numbers((3,), positive=True, scalar=False), "an array of 3 positive numbers")
MEANS = (_numbers((1, 3)), "a number or an array of 3 numbers")
STDS = (_numbers((1, 3), positive=True), "a positive number or an array of 3")
OPTIONAL_LABELS = _optional(lambda v: isinstance(v, dict) and _names(v),
                            "an object of class indices to names (strings)")
OPTIONAL_NAMES = _optional(_names, "an array of strings or an object of strings")
OPTIONAL_SIZE = _optional(_size, "a positive whole number or an array of 2")
OPTIONAL_INPUT_SIZE = _optional(
    lambda v: isinstance(v, list) and len(v) == 3 and all(map(_positive_int, v)),
    "an array of 3 positive whole numbers (channels, height, width)")


def check_object(value, where, expected="an object of settings"):
    """`value` when it is a JSON object, else the error naming the file."""
    if not isinstance(value, dict):
        found = "JSON null" if value is None else \
            f"a JSON {json_type(value)} ({shown(value, 40)})"
        raise CorruptCheckpointError(f"{where!r} is {found}; expected {expected}.")
    return value


def check_values(config, values, where):
    """Raises `CorruptCheckpointError` for the first value of `config` that
    `values` (`{"dotted.key": (check, what is allowed)}`, a parent before
    its children) does not allow; `where` names the file."""
    for key, (check, expected) in values.items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node.get(parent) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        if not check(node[leaf]):
            raise CorruptCheckpointError(
                f"{where!r}: {key} is {shown(node[leaf])}; expected {expected}.")


def check_agrees(where, key, value, agrees, weights):
    """Raises `disagreement(...)` when config value `value` (of `key`; None:
    absent, not checked) fails `agrees(value)`; `weights` says what the
    weights hold instead."""
    if value is not None and not agrees(value):
        raise disagreement(where, key, value, weights)


def pair(size):
    """A config's patch size (an int, or [height, width]) as a tuple."""
    return tuple(size) if isinstance(size, list) else (size, size)


def disagreement(where, key, value, weights):
    """The error for a config value the weights contradict: `weights` says
    what they hold instead."""
    return CorruptCheckpointError(
        f"{where!r} says {key} {shown(value)}, but the weights hold {weights}; "
        "the file and the weights must describe the same model.")
