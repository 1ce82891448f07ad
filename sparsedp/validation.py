"""Input checks shared by every module: each raises a specific :class:`SparseDPError`."""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import (
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
    """Return ``x`` as a 1-D float64 array, checking shape and finiteness.

    Raises :class:`ShapeError` if ``x`` is not 1-D or not of ``length``, and
    :class:`NonFiniteInputError` if it holds NaN or infinity.
    """
    kind = getattr(getattr(x, "dtype", None), "kind", None)
    if kind in ("c", "S", "U", "O", "V", "m", "M") and not (kind == "O" and _all_real(x)):
        raise ShapeError(f"{name} must hold real numbers, got dtype {x.dtype} (a complex value would lose its "
                         "imaginary part)")
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{name} must be a numeric vector: {exc}") from exc
    if arr.ndim != 1:
        raise ShapeError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ShapeError(f"{name} must have length {length}, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.count_nonzero(~np.isfinite(arr)))
        raise NonFiniteInputError(f"{name} contains {bad} NaN or infinite value(s)")
    return arr


def _all_real(x: Any) -> bool:
    """An object array whose entries are all real numbers (Python ints of any size included)."""
    return all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in np.ravel(x))


def check_counts(x: Any, length: int | None = None, name: str = "x") -> np.ndarray:
    """Like :func:`check_vector`, and also require non-negative integral values (a histogram) of at
    most :data:`MAX_MAGNITUDE` (:class:`InputBoundError` above it)."""
    arr = check_vector(x, length, name)
    check_magnitude(arr, name)
    if np.any(arr < 0):
        raise NegativeCountError(f"{name} must hold non-negative counts; min is {arr.min()}")
    if np.any(arr != np.round(arr)):
        raise NegativeCountError(f"{name} must hold integral counts")
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
            f"{name} has values up to {float(np.max(np.abs(arr))):.6g}, above the supported bound "
            f"{bound:.6g} (2^{math.log2(bound):.0f}): above it float64 rounding, not noise, decides the output"
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
