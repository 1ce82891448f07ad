"""Products on the noise grid that exact noise can trust: ``round(A x / g)`` computed exactly.

Exact (discrete) noise releases ``y = g (round(A x / g) + k)`` with ``k`` integer noise
calibrated to the sensitivity of ``A / g`` in grid units (:mod:`sparsedp.measure`).  The
calibration is only as good as the product it is applied to:

* **Exact grid** (every ``A_ij / g`` an integer ``K_ij``, integral ``x``): the cells must be the
  integers ``K x`` *exactly*.  A float64 product is exact only while every partial sum stays below
  ``2^53``; with signed entries the partial sums can exceed it while ``|A x|`` stays small
  (``16 I - J`` on counts near ``2^50``), and a float FFT is never exact.  Then the snapped value
  is wrong by a data-dependent amount and neighbours can differ by more than the sensitivity.
  Each structured operator therefore computes ``K x`` in integer arithmetic (int64 sparse and
  dense products, int64 prefix sums, the number-theoretic transform of a Toeplitz strategy),
  after certifying from ``|K| |x|`` that no intermediate can leave the int64 range
  (:data:`INT_LIMIT`); beyond it the input is refused (:class:`InputBoundError`) before anything
  is charged.  (Float64 arithmetic is used where it is provably exact: integers whose every
  partial sum is below :data:`FLOAT_EXACT`.)
* **Inexact grid** (some ``A_ij / g`` not an integer): the calibration allows one more grid unit
  per *touched* row (``ceil(|A_ij| / g) + 1``), since ``|round(a) - round(b)| <= ceil(|a - b|)``.
  A float product keeps that bound if (1) it is *row-local* -- row ``i`` reads only the ``x_j``
  with ``A_ij != 0``, so rows a change does not touch are computed identically -- and (2) its
  rounding error is below a quarter of a grid unit (then ``ceil(|A_ij| / g + 1/2) <=
  ceil(|A_ij| / g) + 1``).  With ``t`` terms summed per row, the error of ``fl(A x / g)`` is at
  most ``gamma_{t+1} sum_j |A_ij / g| |x_j|`` (Higham, *Accuracy and Stability of Numerical
  Algorithms*, 2002, eq. 3.5), ``gamma_k = k u / (1 - k u)``, ``u = 2^-53``; the input is refused
  when that bound reaches 1/4 (:func:`check_rounding`).

Every operator the measurement path measures implements
:meth:`~sparsedp.operators.Operator.grid_product`; an operator that cannot is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import InputBoundError

__all__ = ["INT_LIMIT", "FLOAT_EXACT", "grid_integers", "check_integer_range", "check_rounding",
           "csr_grid_product"]

#: Every intermediate of an exact integer product stays below this (int64 holds ``2^63 - 1``; the
#: margin absorbs the relative error of the float64 bound that certifies it).
INT_LIMIT: float = 2.0**61
#: Below this every integer partial sum is exact in float64 (``2^53``, with the same margin).
FLOAT_EXACT: float = 2.0**52
_U = 2.0**-53  # unit roundoff of float64


def grid_integers(values: np.ndarray, grid: float) -> np.ndarray:
    """``values / grid`` as int64, for entries the calibration certified to be integers on the grid
    (its check is ``values / grid == round(values / grid)`` in float64; the integers are what is
    measured and what the sensitivity was computed from)."""
    v = np.asarray(values, dtype=np.float64)
    k = np.rint(v / grid if grid != 1.0 else v)
    if k.size and float(np.max(np.abs(k))) >= INT_LIMIT:
        raise InputBoundError("a strategy entry / grid does not fit in int64")
    return k.astype(np.int64)


def check_integer_range(bound: Any, what: str) -> None:
    """Refuse (:class:`InputBoundError`) when the certified bound on an integer product's
    intermediates (``|K| |x|``, computed in float64 on non-negative values) reaches
    :data:`INT_LIMIT`.  The message names the limit, never a data value."""
    b = np.asarray(bound, dtype=np.float64)
    if b.size and not float(np.max(b)) < INT_LIMIT:
        raise InputBoundError(
            f"{what}: sum_j |A_ij / grid| |x_j| could exceed 2^61, where the exact integer product on the "
            "grid is no longer certified; scale the data down or coarsen the grid")


def check_rounding(bound: Any, terms: int, what: str) -> None:
    """Refuse (:class:`InputBoundError`) unless ``gamma_{terms+1} max_i sum_j |A_ij / g| |x_j|`` (the
    float error of a row-local product with ``terms`` summands per row, then one division) is below
    a quarter of a grid unit (module doc)."""
    b = np.asarray(bound, dtype=np.float64)
    if not b.size:
        return
    k = float(terms + 2)  # the summands, the division by g, and one for the bound's own rounding
    gamma = k * _U / (1.0 - k * _U)
    if not gamma * float(np.max(b)) * (1.0 + 1e-6) < 0.25:
        raise InputBoundError(
            f"{what}: with an inexact grid the float product could be off by a quarter grid unit at "
            "these magnitudes; use a grid on which the strategy is integral, or smaller data")


def csr_grid_product(A: sp.csr_matrix, x: np.ndarray, grid: float, exact: bool, what: str) -> np.ndarray:
    """``round(A x / g)``'s argument for an explicit CSR matrix: ``K x`` in int64 (``exact``: every
    ``A_ij / g`` an integer, ``x`` integral) or the row-local float ``A x / g`` with certified
    rounding (module doc)."""
    A = sp.csr_matrix(A)
    absx = np.abs(np.asarray(x, dtype=np.float64))
    if exact:
        K = sp.csr_matrix((grid_integers(A.data, grid), A.indices, A.indptr), shape=A.shape)
        absK = sp.csr_matrix((np.abs(K.data).astype(np.float64), A.indices, A.indptr), shape=A.shape)
        check_integer_range(absK @ absx, what)
        return np.asarray(K @ np.asarray(x).astype(np.int64), dtype=np.int64)
    absA = sp.csr_matrix((np.abs(A.data), A.indices, A.indptr), shape=A.shape)
    terms = int(np.diff(A.indptr).max(initial=0))
    check_rounding((absA @ absx) / grid, terms, what)
    out = np.asarray(A @ np.asarray(x, dtype=np.float64), dtype=np.float64)  # CSR: row-local
    return out / grid if grid != 1.0 else out
