"""Input checks shared by every module: each raises a specific :class:`SparseDPError`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .errors import (
    InvalidPrivacyParameterError,
    NegativeCountError,
    NonFiniteInputError,
    ShapeError,
)

__all__ = ["check_vector", "check_positive", "check_counts", "check_probability"]


def check_vector(x: Any, length: int | None = None, name: str = "x") -> np.ndarray:
    """Return ``x`` as a 1-D float64 array, checking shape and finiteness.

    Raises :class:`ShapeError` if ``x`` is not 1-D or not of ``length``, and
    :class:`NonFiniteInputError` if it holds NaN or infinity.
    """
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


def check_counts(x: Any, length: int | None = None, name: str = "x") -> np.ndarray:
    """Like :func:`check_vector`, and also require non-negative integral values (a histogram)."""
    arr = check_vector(x, length, name)
    if np.any(arr < 0):
        raise NegativeCountError(f"{name} must hold non-negative counts; min is {arr.min()}")
    if np.any(arr != np.round(arr)):
        raise NegativeCountError(f"{name} must hold integral counts")
    return arr


def check_positive(value: Any, name: str) -> float:
    """Return ``value`` as a float, requiring it finite and > 0 (epsilon, rho, scales)."""
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPrivacyParameterError(f"{name} must be a positive number, got {value!r}") from exc
    if not math.isfinite(v) or v <= 0:
        raise InvalidPrivacyParameterError(f"{name} must be finite and > 0, got {value!r}")
    return v


def check_probability(value: Any, name: str) -> float:
    """Return ``value`` as a float in the open interval (0, 1) (delta)."""
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise InvalidPrivacyParameterError(f"{name} must be a number in (0, 1), got {value!r}") from exc
    if not (0.0 < v < 1.0):
        raise InvalidPrivacyParameterError(f"{name} must lie in (0, 1), got {value!r}")
    return v
