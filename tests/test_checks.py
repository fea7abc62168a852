"""keras_vit._checks: one wording for argument checks; a wrong type is a
TypeError, a bad value a ValueError, each naming the argument, the value
and what is allowed."""

import re

import numpy as np
import pytest

from keras_vit import _checks


@pytest.mark.parametrize("check, value, expected", [
    (_checks.positive_int, 3, 3),
    (_checks.positive_int, np.int64(3), 3),
    (_checks.non_negative_int, 0, 0),
    (_checks.positive_float, 2, 2.0),
    (_checks.positive_float, np.float32(0.5), 0.5),
    (_checks.fraction, 0, 0.0),
    (_checks.fraction, 0.25, 0.25),
    (_checks.positive_int_pair, 16, (16, 16)),
    (_checks.positive_int_pair, [224, 160], (224, 160)),
    (_checks.boolean, np.bool_(True), True),
])
def test_good_values_come_back_as_python_numbers(check, value, expected):
    got = check(value, "x")
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("check, value, error, message", [
    (_checks.positive_int, 0, ValueError, "`epochs` must be a positive integer, got 0."),
    (_checks.boolean, 1, TypeError, "`epochs` must be True or False, got 1."),
    (_checks.boolean, None, TypeError, "`epochs` must be True or False, got None."),
    (_checks.positive_int, -2, ValueError, "`epochs` must be a positive integer, got -2."),
    (_checks.positive_int, 2.5, TypeError, "`epochs` must be a positive integer, got 2.5."),
    (_checks.positive_int, True, TypeError, "`epochs` must be a positive integer, got True."),
    (_checks.positive_int, "3", TypeError, "`epochs` must be a positive integer, got '3'."),
    (_checks.positive_int, None, TypeError, "`epochs` must be a positive integer, got None."),
    (_checks.non_negative_int, -1, ValueError, "`epochs` must be an integer >= 0, got -1."),
    (_checks.non_negative_int, 1.0, TypeError, "`epochs` must be an integer >= 0, got 1.0."),
    (_checks.positive_float, 0, ValueError, "`epochs` must be a finite number > 0, got 0."),
    (_checks.positive_float, float("inf"), ValueError,
     "`epochs` must be a finite number > 0, got inf."),
    (_checks.positive_float, "1", TypeError, "`epochs` must be a finite number > 0, got '1'."),
    (_checks.fraction, 1, ValueError, "`epochs` must be a number in [0, 1), got 1."),
    (_checks.fraction, -0.1, ValueError, "`epochs` must be a number in [0, 1), got -0.1."),
    (_checks.fraction, float("nan"), ValueError,
     "`epochs` must be a number in [0, 1), got nan."),
    (_checks.fraction, False, TypeError, "`epochs` must be a number in [0, 1), got False."),
    (_checks.positive_int_pair, (0, 16), ValueError,
     "`epochs` must be a positive integer or a pair of positive integers, got (0, 16)."),
    (_checks.positive_int_pair, -3, ValueError,
     "`epochs` must be a positive integer or a pair of positive integers, got -3."),
    (_checks.positive_int_pair, (16, 16, 3), TypeError,
     "`epochs` must be a positive integer or a pair of positive integers, got (16, 16, 3)."),
    (_checks.positive_int_pair, (16.0, 16), TypeError,
     "`epochs` must be a positive integer or a pair of positive integers, got (16.0, 16)."),
])
def test_a_wrong_type_is_a_type_error_and_a_bad_value_a_value_error(check, value, error,
                                                                     message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        check(value, "epochs")


def test_hint_none_and_an_unnamed_argument():
    with pytest.raises(ValueError, match=re.escape(
            "`count` must be a positive integer or None (None: the whole split), got 0.")):
        _checks.positive_int(0, "count", "None: the whole split", or_none=True)
    assert _checks.positive_int(None, "count", or_none=True) is None
    # the CLI's argparse types: argparse names the flag itself
    with pytest.raises(ValueError, match=r"^must be a number in \[0, 1\), got 1\.5\.$"):
        _checks.fraction(1.5)


def test_optional_checks_only_what_is_given():
    _checks.optional(_checks.positive_int, steps=None, epochs=3)
    with pytest.raises(ValueError, match=r"^`steps` must be a positive integer, got 0\.$"):
        _checks.optional(_checks.positive_int, steps=0, epochs=None)
