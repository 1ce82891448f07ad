"""Strategies whose rows are weighted intervals, measured and calibrated without their matrix.

Row ``i`` of an :class:`IntervalRows` operator is ``w_i`` on the columns ``[lo_i, hi_i)``: the
node rows of every interval tree (hierarchical strategies, LUE-DPTree, Boost), with any shape,
overlapping or not.  The explicit matrix has ``sum_i (hi_i - lo_i)`` non-zeros (``n`` times the
number of levels for a tree: 117 million at ``n = 2^24``, 16-ary); this operator needs
``O(rows + n)``:

* ``A x`` by prefix sums, ``w_i (P[hi_i] - P[lo_i])`` with ``P = cumsum(x)`` -- in int64 for
  integral ``x`` (exact), in float64 otherwise;
* ``A^T y`` by a difference array;
* the privacy loss of per-row noise scales ``b_i`` (:meth:`IntervalRows.certified_loss`),
  ``max_j sum_{i: lo_i <= j < hi_i} |w_i| / b_i`` -- the coverage of bin ``j`` -- computed
  *exactly in integers*: each term is rounded up to a multiple of ``2^-s`` (``s`` chosen so the
  total fits in int64), the coverage is an exact int64 cumulative sum of ``+T_i`` at ``lo_i`` and
  ``-T_i`` at ``hi_i``, and the result is rounded up when converted back.  The bound is ``>=`` the
  exact rational coverage and within ``rows 2^-s`` of it (relative ``~2^-30`` or better); tests
  compare it with Fraction sums over the explicit entries.

The class is final in spirit: :func:`sparsedp.measure.plan_measurement` trusts this structured loss
only for ``type(op) is IntervalRows``; any subclass is calibrated from its explicit entries.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import ShapeError, SparseDPError, UnsupportedStructureError
from .grid_product import check_integer_range, check_rounding, grid_integers
from .operators import Operator

__all__ = ["IntervalRows"]

_INT_BUDGET = 2.0**61  # the exact int64 sums stay below 2^62 (positive and negative parts)


def _exact_int_bincount(index: np.ndarray, values: np.ndarray, length: int) -> np.ndarray:
    """``sum of values[k] over index[k] == j`` in exact int64 for non-negative ``values < 2^63``:
    ``bincount`` in three 21-bit digits (each float64 digit sum stays below 2^53 for fewer than
    2^32 terms), recombined in int64."""
    if index.size >= 2**32:
        raise SparseDPError("too many intervals for an exact coverage")
    out = np.zeros(length, dtype=np.int64)
    mask = (1 << 21) - 1
    for k in range(3):
        digit = ((values >> (21 * k)) & mask).astype(np.float64)
        out += np.bincount(index, weights=digit, minlength=length).astype(np.int64) << (21 * k)
    return out


class IntervalRows(Operator):
    """Rows ``w_i 1[lo_i, hi_i)`` over ``n`` columns (see the module docstring).

    ``lo``, ``hi``: integer arrays with ``0 <= lo < hi <= n``; ``weights``: one finite non-zero
    weight per row (default 1).  ``meta`` carries structure for fast estimators (e.g. a tree layout).
    """

    def __init__(
        self,
        n: int,
        lo: Any,
        hi: Any,
        weights: Any = None,
        *,
        name: str = "intervals",
        structure: str = "intervals",
        meta: dict | None = None,
    ) -> None:
        lo_a = np.asarray(lo)
        hi_a = np.asarray(hi)
        if lo_a.ndim != 1 or lo_a.shape != hi_a.shape:
            raise ShapeError("lo and hi must be 1-D arrays of the same length")
        if lo_a.size and not (np.issubdtype(lo_a.dtype, np.integer) and np.issubdtype(hi_a.dtype, np.integer)):
            if not (np.all(lo_a == np.round(lo_a)) and np.all(hi_a == np.round(hi_a))):
                raise ShapeError("interval ends must be integers")
        lo_a, hi_a = lo_a.astype(np.int64), hi_a.astype(np.int64)
        n = int(n)
        if n < 1:
            raise ShapeError(f"n must be >= 1, got {n}")
        if lo_a.size and (lo_a.min() < 0 or hi_a.max() > n or np.any(hi_a <= lo_a)):
            raise ShapeError(f"intervals must satisfy 0 <= lo < hi <= {n}")
        w = np.ones(lo_a.size) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
        if w.shape != lo_a.shape:
            raise ShapeError(f"weights must have one entry per row ({lo_a.size}), got {w.size}")
        if not np.all(np.isfinite(w)) or np.any(w == 0):
            raise ShapeError("weights must be finite and non-zero")
        super().__init__((lo_a.size, n), name=name, structure=structure)
        self.lo, self.hi, self.weights = lo_a, hi_a, w
        self.meta = dict(meta or {})

    def _scaled_rows(self, weights: np.ndarray, name: str | None) -> "IntervalRows":
        """``diag(weights) self`` stays interval rows: the weights multiply
        (:func:`sparsedp.operators.scale_rows`)."""
        return IntervalRows(self.shape[1], self.lo, self.hi, self.weights * weights,
                            name=name or f"weighted({self.name})", structure=self.structure, meta=self.meta)

    def frozen_copy(self) -> "IntervalRows":
        """An :class:`IntervalRows` (this exact class) with read-only copies of ``lo``, ``hi`` and
        ``weights`` (``meta`` is copied shallowly: it only guides estimators).  ``O(rows)``.  What
        :func:`~sparsedp.measure.plan_measurement` measures, so that editing the caller's operator
        after planning (``M.weights[:] = 1e6``) changes nothing measured."""
        lo, hi, w = (np.array(a, copy=True) for a in (self.lo, self.hi, self.weights))
        out = IntervalRows(self.shape[1], lo, hi, w, name=self.name, structure=self.structure, meta=self.meta)
        for arr in (out.lo, out.hi, out.weights):  # fresh arrays (the copies, or the constructor's)
            arr.flags.writeable = False
        return out

    # -- products ------------------------------------------------------------------------------
    def _matvec(self, x: np.ndarray) -> np.ndarray:
        v = np.ravel(x)
        if v.size and np.all(v == np.round(v)) and float(np.abs(v).sum()) < 2.0**62:
            P = np.concatenate(([0], np.cumsum(v.astype(np.int64))))  # exact
            return self.weights * (P[self.hi] - P[self.lo]).astype(np.float64)
        P = np.concatenate(([0.0], np.cumsum(v, dtype=np.float64)))
        return self.weights * (P[self.hi] - P[self.lo])

    def grid_product(self, x: np.ndarray, grid: float, exact: bool) -> np.ndarray:
        """:meth:`~sparsedp.operators.Operator.grid_product` by exact int64 prefix sums of integral
        ``x``: ``(w_i / g) (P[hi_i] - P[lo_i])`` in int64 when exact, else one float product and
        one division per row (row-local: the differences are exact).  Non-integral data are refused:
        float prefix sums would carry one entry's rounding into every later row."""
        v = np.ravel(x)
        if not np.all(v == np.round(v)):
            raise UnsupportedStructureError(
                "exact noise on interval rows needs integral data (round x, or measure the explicit form)")
        absx = np.abs(v).astype(np.float64)
        check_integer_range(absx.sum(), self.name)  # every prefix sum
        P = np.concatenate(([0], np.cumsum(v.astype(np.int64))))
        diff = P[self.hi] - P[self.lo]
        Pa = np.concatenate(([0.0], np.cumsum(absx)))
        absdiff = Pa[self.hi] - Pa[self.lo]
        if exact:
            w = grid_integers(self.weights, grid)
            check_integer_range(np.abs(w).astype(np.float64) * absdiff, self.name)
            return w * diff
        check_rounding(np.abs(self.weights) * absdiff / grid, 1, self.name)
        out = self.weights * diff.astype(np.float64)
        return out / grid if grid != 1.0 else out

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        t = self.weights * np.ravel(y)
        m = self.shape[1] + 1
        d = np.bincount(self.lo, weights=t, minlength=m) - np.bincount(self.hi, weights=t, minlength=m)
        return np.cumsum(d[:-1])

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.column_stack([self._matvec(X[:, j]) for j in range(X.shape[1])])

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.column_stack([self._rmatvec(Y[:, j]) for j in range(Y.shape[1])])

    def tosparse(self) -> sp.csr_matrix:
        lengths = self.hi - self.lo
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        indices = np.repeat(self.lo - indptr[:-1], lengths) + np.arange(indptr[-1])
        data = np.repeat(self.weights, lengths)
        return sp.csr_matrix((data, indices, indptr), shape=self.shape)

    # -- norms -----------------------------------------------------------------------------------
    def column_norms(self, p: int = 1) -> np.ndarray:
        """Column ``p``-norms from the coverage (float arithmetic; for analytics, not calibration)."""
        t = np.abs(self.weights) if p == 1 else self.weights**2
        m = self.shape[1] + 1
        d = np.bincount(self.lo, weights=t, minlength=m) - np.bincount(self.hi, weights=t, minlength=m)
        cov = np.cumsum(d[:-1])
        return cov if p == 1 else np.sqrt(np.maximum(cov, 0.0))

    def certified_loss(self, scales: Any = None, p: int = 1) -> float:
        """``max_j sum_{i covers j} (|w_i| / b_i)^p``, certified ``>=`` the exact value.

        ``p = 1``: the epsilon of Laplace scales ``b_i`` (the sensitivity ``Delta_1`` for unit
        scales).  ``p = 2``: ``sum (w_i / sigma_i)^2``, twice the rho of Gaussian scales (the
        squared ``Delta_2`` for unit scales).  Exact int64 coverage of upward-rounded fixed-point
        terms (module docstring)."""
        if p not in (1, 2):
            raise SparseDPError(f"norm must be 1 or 2, got {p!r}")
        w = np.abs(self.weights)
        if scales is None:
            q = w
        else:
            b = np.broadcast_to(np.asarray(scales, dtype=np.float64), w.shape)
            if not np.all(np.isfinite(b)) or np.any(b <= 0):
                raise SparseDPError("scales must be finite and > 0")
            q = np.nextafter(w / b, np.inf)  # >= the exact quotient
        t = q if p == 1 else np.nextafter(q * q, np.inf)
        if not t.size:
            return 0.0
        if not np.all(np.isfinite(t)):
            raise SparseDPError("the terms of the loss overflow float64")
        total = float(np.sum(t)) * (1 + 1e-6)
        shift = math.floor(math.log2(_INT_BUDGET / total)) if total > 0 else 0
        # T_i = ceil(t_i 2^shift), computed exactly: t_i 2^shift is exact (a power of two), and
        # values below 2^53 are converted to integers without rounding after the ceil
        scaled = np.ldexp(t, shift)
        T = np.ceil(scaled).astype(np.int64)
        d = _exact_int_bincount(self.lo, T, self.shape[1] + 1) - _exact_int_bincount(self.hi, T, self.shape[1] + 1)
        cov = int(np.cumsum(d[:-1]).max())
        return math.ldexp(math.nextafter(float(cov), math.inf) if float(cov) < cov else float(cov), -shift)
