"""The shared input checks: text, fractions, negatives and bounds are refused with a precise error
class, and no message carries a value taken from the data (only the bound and a position)."""

import numpy as np
import pytest

from sparsedp.errors import (
    FractionalCountError,
    InputBoundError,
    NegativeCountError,
    NonFiniteInputError,
    ShapeError,
)
from sparsedp.validation import MAX_MAGNITUDE, check_counts, check_magnitude, check_vector

TEXT = {
    "list of numeric strings": ["10", "20", "30"],
    "list mixing numbers and text": [10, 20, "30"],
    "str array": np.array(["10", "20", "30"]),
    "bytes array": np.array([b"10", b"20", b"30"]),
    "object array with text": np.array([10, "20", 30], dtype=object),
    "non-numeric strings": ["a", "b", "c"],
}


@pytest.mark.parametrize("kind", sorted(TEXT))
@pytest.mark.parametrize("check", [check_vector, check_counts])
def test_text_is_refused_and_named_as_text(kind, check):
    with pytest.raises(ShapeError, match="text where numbers are expected") as info:
        check(TEXT[kind], 3, "x")
    assert "complex" not in str(info.value)


def test_the_first_text_entry_is_located_without_printing_it():
    with pytest.raises(ShapeError, match="position 2") as info:
        check_counts([10, 20, "secret"], name="x")
    assert "secret" not in str(info.value)
    with pytest.raises(ShapeError, match="position 1"):
        check_counts(np.array([1, "7", 3], dtype=object))


def test_fractional_count_has_its_own_error():
    with pytest.raises(FractionalCountError, match="not an integer") as info:
        check_counts([3, 1.5, 2])
    assert not isinstance(info.value, NegativeCountError)
    assert "1.5" not in str(info.value) and "position 1" in str(info.value)


def test_negative_count_names_its_position_not_its_value():
    with pytest.raises(NegativeCountError, match="position 2") as info:
        check_counts([3, 4, -12345])
    assert "12345" not in str(info.value)


def test_magnitude_error_names_the_bound_not_the_value():
    big = 3 * 2.0**50 + 12345
    with pytest.raises(InputBoundError, match="position 1") as info:
        check_counts([1, big])
    msg = str(info.value)
    assert f"{MAX_MAGNITUDE:.6g}" in msg and f"{big:.6g}" not in msg and "3.37" not in msg
    with pytest.raises(InputBoundError, match=r"position \(1, 0\)"):
        check_magnitude(np.array([[1.0], [-big]]), "table")


def test_non_finite_error_names_the_first_position_not_a_count():
    with pytest.raises(NonFiniteInputError, match="position 1") as info:
        check_vector([1.0, np.nan, np.inf, np.nan])
    assert "3" not in str(info.value)


def test_real_inputs_still_pass():
    assert check_counts([1, 2, 3]).tolist() == [1.0, 2.0, 3.0]
    assert check_counts(np.array([2**60, 0], dtype=object) // 2**20).tolist() == [2.0**40, 0.0]
    assert check_vector(np.arange(3, dtype=np.int8), 3).dtype == np.float64
    assert check_vector((0.5, -1.0)).tolist() == [0.5, -1.0]


@pytest.mark.parametrize("bad,match", [(np.array([1 + 2j, 3]), "complex"), (np.array([1, None], dtype=object), "NoneType"),
                                       (np.array([1, 2], dtype="timedelta64[s]"), "real numbers")])
def test_other_non_real_inputs_are_refused(bad, match):
    with pytest.raises(ShapeError, match=match):
        check_vector(bad)
