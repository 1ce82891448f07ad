"""Noise calibration that never under-calibrates: certified sensitivities, scales and losses.

The privacy of every release here rests on one inequality about the matrix that is actually
measured, ``y = A x + z``, one record changing one entry of ``x`` by one (or a stated unit):

* Laplace noise with per-row scales ``b_i`` is ``epsilon``-DP for
  ``epsilon >= max_j sum_i |A_ij| / b_i`` (homoscedastic: ``b = Delta_1(A) / epsilon``);
* Gaussian noise with per-row ``sigma_i`` is ``rho``-zCDP for
  ``rho >= max_j sum_i A_ij^2 / (2 sigma_i^2)`` (Bun and Steinke, TCC 2016).

The sums are computed in float64, which can round *down*: ``haar(20)``'s largest column sums to
``5.166666666666666`` in float64 although the float entries add up to slightly more than that.
Every function below therefore returns an upper bound that is certified in exact arithmetic over
the float values given: a float sum of ``k`` non-negative terms is within a relative
``gamma_k = k u / (1 - k u)`` (``u = 2^-53``) of the exact sum (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., eq. 3.4 and section 4.2), so ``s_hat (1 + gamma_k)`` rounded up is
``>= s``.  When every term is an integer and the sums stay below ``2^53`` the float sums are exact
and returned as they are (``Delta_1`` of a 0/1 strategy is an exact integer).  Scales are rounded
up after the division ``Delta / epsilon``.  Tests compare all of this with
:class:`fractions.Fraction` sums of the entries.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import ShapeError, SparseDPError
from .validation import budget_fraction, check_positive

__all__ = [
    "column_norm_bound",
    "sensitivity_bound",
    "laplace_loss",
    "gaussian_loss",
    "laplace_scale",
    "gaussian_sigma",
    "round_up",
    "certified_sqrt",
]

_U = 2.0**-53
_EXACT_INT = 2.0**53


def _gamma(k: int) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: the relative error bound of a ``k``-term float sum."""
    ku = k * _U
    if ku >= 0.5:
        raise SparseDPError(f"cannot certify a sum of {k} terms in float64")
    return ku / (1.0 - ku)


def round_up(values: Any, rel: float = 0.0) -> np.ndarray:
    """``values (1 + rel)`` then one float step up (for ``rel > 0``): an upper bound of
    ``values (1 + rel)`` in exact arithmetic (the product's rounding is covered by the step)."""
    v = np.asarray(values, dtype=np.float64)
    if rel == 0.0:
        return v
    return np.nextafter(v * (1.0 + rel) * (1.0 + 2 * _U), np.inf)


def _as_sparse(A: Any) -> sp.csr_matrix | sp.csc_matrix:
    """The explicit matrix of ``A`` (an Operator's own entries), CSR or CSC, never copied to another format."""
    if callable(getattr(A, "tosparse", None)) and not sp.issparse(A):  # an Operator: its own entries
        A = A.tosparse()
    if sp.issparse(A):
        mat = A if A.format in ("csr", "csc") else sp.csr_matrix(A)
    else:
        mat = sp.csr_matrix(np.asarray(A, dtype=np.float64))
    if mat.ndim != 2:
        raise ShapeError("expected a 2-D matrix")
    if mat.nnz and not np.all(np.isfinite(mat.data)):
        raise ShapeError("the measured matrix contains NaN or infinite entries")
    return mat


def _certified_column_sums(mat: sp.spmatrix, terms: np.ndarray, extra_roundings: int) -> np.ndarray:
    """Upper bounds of the exact column sums of the non-negative ``terms`` (aligned with
    ``mat.data``), each term itself within ``extra_roundings`` roundings of its exact value.

    Any summation order obeys ``|s_hat - s| <= gamma_{k-1} s`` for ``k`` non-negative terms
    (Higham, eq. 4.4), so CSR input is summed by ``bincount`` without a CSC copy; duplicate
    entries are summed separately, which can only enlarge the bound."""
    n = mat.shape[1]
    if mat.format == "csc":
        counts = np.diff(mat.indptr)
        sums = np.zeros(n)
        nz = counts > 0
        if mat.nnz:
            sums[nz] = np.add.reduceat(terms, mat.indptr[:-1][nz])
    else:
        cols = mat.indices
        counts = np.bincount(cols, minlength=n)
        sums = np.bincount(cols, weights=terms, minlength=n)
    exact = extra_roundings == 0 and bool(np.all(terms == np.floor(terms))) and float(sums.max(initial=0.0)) < _EXACT_INT
    if exact:
        return sums
    k = int(counts.max(initial=0))
    return round_up(sums, _gamma(max(k - 1, 0) + extra_roundings))


def column_norm_bound(A: Any, p: int = 1, row_scales: Any = None) -> np.ndarray:
    """Certified upper bounds of the column ``p``-norms (``p`` in {1, 2}) of ``diag(1/row_scales) A``.

    ``A``: the matrix actually measured (sparse, dense or an :class:`~sparsedp.operators.Operator`,
    whose explicit entries are used, never a closed form it claims).  For ``p = 2`` the bound is of
    the Euclidean norm (the square root of the sum of squares).
    """
    if p not in (1, 2):
        raise SparseDPError(f"norm must be 1 or 2, got {p!r}")
    mat = _as_sparse(A)
    terms = np.abs(mat.data)
    roundings = 0
    if row_scales is not None:
        b = np.asarray(row_scales, dtype=np.float64).ravel()
        if b.size != mat.shape[0]:
            raise ShapeError(f"row_scales has {b.size} entries for {mat.shape[0]} rows")
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise SparseDPError("row scales must be finite and > 0")
        rows = mat.indices if mat.format == "csc" else np.repeat(np.arange(mat.shape[0]), np.diff(mat.indptr))
        terms = terms / b[rows]
        roundings += 1
    if p == 2:
        exact_square = roundings == 0 and bool(np.all((terms == np.floor(terms)) & (terms < 2.0**26)))
        terms = terms * terms
        if not exact_square:
            roundings += 1 if row_scales is None else 2  # the square doubles the division's error
    sums = _certified_column_sums(mat, terms, roundings)
    if p == 1:
        return sums
    return certified_sqrt(sums)


def certified_sqrt(values: Any) -> np.ndarray:
    """``sqrt(values)`` rounded up: ``>=`` the exact root.  The correctly rounded root is within half
    an ulp, so one step up suffices; it is kept only when it is an integer below ``2^26`` whose
    square (then exact in float64) equals the value."""
    v = np.asarray(values, dtype=np.float64)
    roots = np.sqrt(v)
    exact = (roots == np.floor(roots)) & (roots < 2.0**26) & (roots * roots == v)
    return np.where(exact, roots, np.nextafter(roots, np.inf))


def sensitivity_bound(A: Any, p: int = 1) -> float:
    """``Delta_p(A) = max_j ||A[:, j]||_p``, certified ``>=`` the exact value over the float entries."""
    norms = column_norm_bound(A, p)
    return float(norms.max()) if norms.size else 0.0


def laplace_loss(A: Any, scales: Any) -> float:
    """The ``epsilon`` that measuring ``A x`` with independent ``Lap(b_i)`` noise costs:
    ``max_j sum_i |A_ij| / b_i``, certified ``>=`` the exact value."""
    norms = column_norm_bound(A, 1, row_scales=scales)
    return float(norms.max()) if norms.size else 0.0


def gaussian_loss(A: Any, sigmas: Any) -> float:
    """The ``rho`` (zCDP) that measuring ``A x`` with independent ``N(0, sigma_i^2)`` noise costs:
    ``max_j sum_i A_ij^2 / (2 sigma_i^2)``, certified ``>=`` the exact value."""
    norms = column_norm_bound(A, 2, row_scales=sigmas)
    worst = float(norms.max()) if norms.size else 0.0
    return float(round_up(worst * worst / 2.0, 2 * _U))


def laplace_scale(sensitivity: float, epsilon: float) -> float:
    """``b = Delta_1 / epsilon`` rounded up, so ``Delta_1 / b <= epsilon`` holds exactly, with
    ``epsilon`` the budget as written (:func:`~sparsedp.validation.budget_fraction`: ``0.1`` is
    ``1/10``, below the float ``0.1``), which is what an :class:`~sparsedp.privacy.Accountant`
    charges."""
    s, e = check_positive(sensitivity, "sensitivity"), check_positive(epsilon, "epsilon")
    budget = budget_fraction(e)
    b = s / e
    while Fraction(b) * budget < Fraction(s):  # at most a few steps
        b = math.nextafter(b, math.inf)
    return b


def gaussian_sigma(sensitivity: float, rho: float) -> float:
    """``sigma = Delta_2 / sqrt(2 rho)`` rounded up, so ``Delta_2^2 / (2 sigma^2) <= rho`` holds
    exactly for ``rho`` as written (:func:`~sparsedp.validation.budget_fraction`)."""
    s, r = check_positive(sensitivity, "sensitivity"), check_positive(rho, "rho")
    budget = budget_fraction(r)
    sigma = float(round_up(s / math.sqrt(2.0 * r), 3 * _U))
    while Fraction(s) ** 2 > 2 * Fraction(sigma) ** 2 * budget:  # at most a few steps
        sigma = math.nextafter(sigma, math.inf)
    return sigma
