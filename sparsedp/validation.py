"""Input checks shared by every module: each raises a specific :class:`SparseDPError`."""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import (
    FractionalCountError,
    InputBoundError,
    InvalidPrivacyParameterError,
    NegativeCountError,
    NonFiniteInputError,
    ShapeError,
)

__all__ = [
    "MAX_MAGNITUDE",
    "MIN_EPSILON",
    "MAX_EPSILON",
    "MIN_RHO",
    "MAX_RHO",
    "check_vector",
    "check_positive",
    "check_epsilon",
    "check_rho",
    "check_counts",
    "check_magnitude",
    "check_probability",
]

#: Largest absolute value of any quantity a release measures (a count, an entry of ``M x``, a
#: bounded value).  ``2^50``: every integer up to it is a float64, and adding exact discrete noise of
#: any scale the samplers accept (``<= 2^40``, tails far below ``2^52``) stays an exact integer sum
#: below ``2^53``.  Above ``2^53`` neighbouring counts collapse or separate under float rounding
#: (``10^18 + 64`` and ``10^18 + 65`` round 128 apart whatever the noise), so inputs beyond this
#: bound are refused with :class:`~sparsedp.errors.InputBoundError` before anything is charged.
MAX_MAGNITUDE: float = float(2**50)

#: Accepted range of a pure-DP ``epsilon``.  Below ``1e-9`` the noise scales overflow the exact
#: samplers; above ``1e6`` budgets enter the estimators as ``eps^2`` weights whose products
#: overflow (``eps = 1e300`` gave all-NaN histograms).  Neither end is a meaningful privacy level.
MIN_EPSILON: float = 1e-9
MAX_EPSILON: float = 1e6
#: Accepted range of a zCDP ``rho`` (``epsilon^2 / 2`` at the ends above).
MIN_RHO: float = 0.5e-18
MAX_RHO: float = 0.5e12


def check_vector(x: Any, length: int | None = None, name: str = "x") -> np.ndarray:
    """Return ``x`` as a 1-D float64 array, checking type, shape and finiteness.

    Raises :class:`ShapeError` if ``x`` holds anything but real numbers (text, even ``"10"``; a
    complex, date or ``None`` value), is not 1-D or not of ``length``, and
    :class:`NonFiniteInputError` if it holds NaN or infinity.  Messages name the position of the
    first offending entry, never its value: the data are private.
    """
    arr = _as_real_array(x, name)
    if arr.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ShapeError(f"{name} must have length {length}, got {arr.shape[0]}")
    finite = np.isfinite(arr)
    if not finite.all():
        raise NonFiniteInputError(f"{name} contains NaN or infinite values (the first at {_first(~finite)})")
    return arr


def _as_real_array(x: Any, name: str) -> np.ndarray:
    """``x`` as a float64 array if it holds only real numbers; else :class:`ShapeError` naming what
    it holds instead and where.  The dtype of ``np.asarray(x)`` decides in one vectorised step
    (text arrives as ``'U'``/``'S'``, a list mixing numbers and text too); only an object array
    (Python ints beyond int64, ``None``, mixed objects) is inspected entry by entry."""
    try:
        raw = x if isinstance(x, np.ndarray) else np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{name} must be a numeric vector: {exc}") from exc
    kind = raw.dtype.kind
    if kind in "US":
        raise ShapeError(f"{name} holds text where numbers are expected (the first at {_first_text(x, raw)}); "
                         "convert it to numbers first")
    if kind == "c":
        raise ShapeError(f"{name} must hold real numbers, got dtype {raw.dtype} (a complex value would lose its "
                         "imaginary part)")
    if kind in "VmM":
        raise ShapeError(f"{name} must hold real numbers, got dtype {raw.dtype}")
    if kind == "O":
        flat = raw.ravel()
        bad = _first_not_real(flat)
        if bad is not None:
            what = "text" if isinstance(flat[bad], (str, bytes)) else f"a {type(flat[bad]).__name__}"
            where = _first(np.arange(flat.size).reshape(raw.shape) == bad)
            raise ShapeError(f"{name} holds {what} where numbers are expected (at {where})")
    try:
        return np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ShapeError(f"{name} must be a numeric vector: {exc}") from exc


def _first_not_real(flat: np.ndarray) -> int | None:
    """Index of the first entry of an object array that is not a real number (bools are not)."""
    for i, v in enumerate(flat):
        if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
            return i
    return None


def _first_text(x: Any, raw: np.ndarray) -> str:
    """Where the first text entry of ``x`` is: in a text array every entry is text (the first
    position); a list mixing numbers and text became a text array, so look up its first string."""
    if not isinstance(x, np.ndarray) and raw.ndim == 1:
        for i, v in enumerate(x):
            if isinstance(v, (str, bytes)):
                return f"position {i}"
    return _first(np.ones(raw.shape, dtype=bool)) if raw.size else "position 0"


def _first(mask: np.ndarray) -> str:
    """``"position i"`` (or ``"position (i, j)"``) of the first true entry of ``mask``: error
    messages point at an entry, they never print a value computed from the data."""
    idx = np.argwhere(mask)[0]
    return f"position {int(idx[0])}" if idx.size == 1 else f"position {tuple(int(i) for i in idx)}"


def check_counts(x: Any, length: int | None = None, name: str = "x") -> np.ndarray:
    """Like :func:`check_vector`, and also require non-negative (:class:`NegativeCountError`),
    whole-number (:class:`FractionalCountError`) values (a histogram) of at most
    :data:`MAX_MAGNITUDE` (:class:`InputBoundError` above it)."""
    arr = check_vector(x, length, name)
    check_magnitude(arr, name)
    negative = arr < 0
    if negative.any():
        raise NegativeCountError(f"{name} must hold non-negative counts (the first negative one at {_first(negative)})")
    fractional = arr != np.round(arr)
    if fractional.any():
        raise FractionalCountError(f"{name} must hold whole-number counts: the count at {_first(fractional)} is "
                                   "not an integer")
    return arr


def _real(value: Any, name: str, what: str) -> float:
    """``value`` as a float if it is a real number (not a bool, string or complex), else raise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.number) \
                and not np.issubdtype(value.dtype, np.bool_) and not np.issubdtype(value.dtype, np.complexfloating):
            return float(value)
        raise InvalidPrivacyParameterError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    return float(value)


def check_positive(value: Any, name: str) -> float:
    """Return ``value`` as a float, requiring a real number (not a bool or a string), finite and > 0
    (epsilon, rho, scales, tolerances)."""
    v = _real(value, name, "a positive number")
    if not math.isfinite(v) or v <= 0:
        raise InvalidPrivacyParameterError(f"{name} must be finite and > 0, got {value!r}")
    return v


def check_epsilon(value: Any, name: str = "epsilon") -> float:
    """A pure-DP budget: a real number in ``[MIN_EPSILON, MAX_EPSILON]`` (see those constants)."""
    v = check_positive(value, name)
    if not MIN_EPSILON <= v <= MAX_EPSILON:
        raise InvalidPrivacyParameterError(f"{name} must lie in [{MIN_EPSILON:g}, {MAX_EPSILON:g}], got {value!r}")
    return v


def check_rho(value: Any, name: str = "rho") -> float:
    """A zCDP budget: a real number in ``[MIN_RHO, MAX_RHO]``."""
    v = check_positive(value, name)
    if not MIN_RHO <= v <= MAX_RHO:
        raise InvalidPrivacyParameterError(f"{name} must lie in [{MIN_RHO:g}, {MAX_RHO:g}], got {value!r}")
    return v


def check_magnitude(values: Any, name: str = "x", bound: float = MAX_MAGNITUDE) -> None:
    """Refuse any ``|value| > bound`` (default :data:`MAX_MAGNITUDE`) with :class:`InputBoundError`.

    ``values`` must already be a finite float array.  The bound is the release's input domain:
    it is checked before any budget is spent or noise drawn, and no guarantee is claimed beyond it.
    """
    arr = np.asarray(values)
    if arr.size and float(np.max(np.abs(arr))) > bound:
        raise InputBoundError(
            f"{name} has a value above the supported bound {bound:.6g} (2^{math.log2(bound):.0f}; the first at "
            f"{_first(np.abs(arr) > bound)}): above it float64 rounding, not noise, decides the output"
        )


def check_probability(value: Any, name: str) -> float:
    """Return ``value`` as a float in the open interval (0, 1) (delta)."""
    v = _real(value, name, "a number in (0, 1)")
    if not (0.0 < v < 1.0):
        raise InvalidPrivacyParameterError(f"{name} must lie in (0, 1), got {value!r}")
    return v


def budget_fraction(value: float) -> Fraction:
    """A budget as the exact number the user wrote: the shortest decimal that reads back as the
    float (``0.1`` is ``1/10``, not the binary ``0.1000000000000000055...``), or the float's own
    value where that is smaller.  So ten spends of ``epsilon=0.1`` add up to exactly 1.  The noise
    is calibrated to this value, never above it (:func:`sparsedp.calibration.laplace_scale`,
    :func:`~sparsedp.calibration.gaussian_sigma` and the plans' loss check), so what is charged
    always covers what the noise costs."""
    v = float(value)
    return min(Fraction(v), Fraction(repr(v))) if math.isfinite(v) else Fraction(v)
