"""Accuracy of a completion: RSE, and the oracle floor no rank-``r`` method can beat under noise.

``rse(X_hat, X) = ||X_hat - X||_F / ||X||_F`` (seed 003, Sec. 5).  Either argument may be a dense
array or a factor pair ``(A, B)`` meaning ``A @ B.T``; with two factor pairs the norm is computed from
``k x k`` Gram matrices, ``||A B^T - U V^T||^2 = <A^T A, B^T B> - 2 <A^T U, B^T V> + <U^T U, V^T V>``,
in ``O((m + n) k^2)`` without forming an ``m x n`` array.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..validation import check_positive

Factors = tuple[np.ndarray, np.ndarray]


def _as_factors_or_dense(X: Any, name: str) -> Factors | np.ndarray:
    if isinstance(X, tuple):
        if len(X) != 2:
            raise ShapeError(f"{name}: a factor pair (A, B) meaning A @ B.T, got {len(X)} items")
        A, B = (np.asarray(f, dtype=np.float64) for f in X)
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[1]:
            raise ShapeError(f"{name}: factors must be m x k and n x k, got {A.shape} and {B.shape}")
        return A, B
    if hasattr(X, "left") and hasattr(X, "right"):
        return np.asarray(X.left), np.asarray(X.right)
    D = np.asarray(X, dtype=np.float64)
    if D.ndim != 2:
        raise ShapeError(f"{name} must be a 2-D array or a factor pair, got shape {D.shape}")
    return D


def _shape(X: Factors | np.ndarray) -> tuple[int, int]:
    return (X[0].shape[0], X[1].shape[0]) if isinstance(X, tuple) else X.shape  # type: ignore[return-value]


def _inner(X: Factors | np.ndarray, Y: Factors | np.ndarray) -> float:
    """Frobenius inner product ``<X, Y>`` of two matrices given densely or as factors."""
    if isinstance(X, tuple) and isinstance(Y, tuple):
        return float(np.sum((X[0].T @ Y[0]) * (X[1].T @ Y[1])))
    if isinstance(X, tuple):
        X, Y = Y, X
    if isinstance(Y, tuple):
        return float(np.sum((X @ Y[1]) * Y[0]))  # type: ignore[operator]
    return float(np.sum(X * Y))  # type: ignore[operator]


def rse(estimate: Any, truth: Any) -> float:
    """Relative standard error ``||estimate - truth||_F / ||truth||_F`` (dense arrays, factor pairs
    ``(A, B)`` = ``A @ B.T``, or a :class:`CompletionResult`)."""
    E = _as_factors_or_dense(estimate, "estimate")
    T = _as_factors_or_dense(truth, "truth")
    if _shape(E) != _shape(T):
        raise ShapeError(f"estimate has shape {_shape(E)}, truth {_shape(T)}")
    tt = _inner(T, T)
    if tt <= 0:
        raise ShapeError("truth is the zero matrix: RSE undefined")
    sq = _inner(E, E) - 2.0 * _inner(E, T) + tt
    return math.sqrt(max(sq, 0.0) / tt)


def oracle_rse(n: int, m: int | None = None, rank: int = 10, p: float = 0.15, scale: float = 1.0,
               signal_power: float | None = None) -> float:
    """The oracle floor of the RSE of a rank-``r`` fit to noisy observed entries.

    An oracle that knows the row and column spaces still fits ``r (m + n - r)`` free parameters to
    ``p m n`` observations with noise variance ``sigma^2 = 2 b^2`` (Laplace scale ``b = scale``), so its
    expected squared error is ``sigma^2 r (m + n - r) / p`` (Candes-Plan 2010, "Matrix completion with
    noise", Sec. III.B).  Divided by ``||X||_F^2 = m n P`` (``P`` = mean squared entry,
    ``signal_power``; ``P = r`` for ``X = U V^T`` with standard normal ``U, V``, the seed's model):

        ``oracle_rse = sqrt(2) b sqrt(r (m + n - r) / p) / sqrt(m n P)``,

    for ``m = n``, ``P = r``: ``sqrt(2) b sqrt((2 n r - r^2) / p) / (n sqrt(r))``.
    """
    m = n if m is None else m
    if int(rank) != rank or not 1 <= rank <= min(m, n):
        raise ShapeError(f"rank must be an integer in [1, min(m, n)], got {rank!r}")
    if not 0 < p <= 1:
        raise ShapeError(f"p must lie in (0, 1], got {p!r}")
    b = check_positive(scale, "scale")
    P = float(rank) if signal_power is None else check_positive(signal_power, "signal_power")
    return math.sqrt(2.0) * b * math.sqrt(rank * (m + n - rank) / p) / math.sqrt(m * n * P)


class RSETracker:
    """RSE of successive factor iterates against a fixed truth (dense or factors); ``None`` truth
    records nothing.  With factored truth each call costs ``O((m + n) k^2)``."""

    def __init__(self, truth: Any, shape: tuple[int, int]) -> None:
        self.truth = None if truth is None else _as_factors_or_dense(truth, "truth")
        if self.truth is not None and _shape(self.truth) != shape:
            raise ShapeError(f"truth has shape {_shape(self.truth)}, observed {shape}")
        self.values: list[float] = []

    def __call__(self, A: np.ndarray, B: np.ndarray) -> None:
        if self.truth is not None:
            self.values.append(rse((A, B), self.truth))  # type: ignore[arg-type]
