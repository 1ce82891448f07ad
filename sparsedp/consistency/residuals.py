"""The residual ``max |C x - b|`` of a float64 vector, evaluated so that it measures the vector.

At large scale a float64 evaluation of ``C x - b`` is dominated by its own rounding: a parent of
size ``1e8`` has ulp ``1.5e-8``, so ``x_parent - (x_child1 + x_child2)`` computed in float64 can be
off by ``1e-8`` whatever ``x`` is (and is exactly 0 for a vector whose parents *are* the float sums
of their children, although the exact residual is up to half an ulp).  Here:

* every row is first evaluated in float64 (the blocks' vectorised residuals), with the rigorous
  bound ``|fl(r_i) - r_i| <= gamma_{m+1} (|C||x| + |b|)_i`` on its error (Higham, *Accuracy and
  Stability of Numerical Algorithms*, 2002, eq. 3.5; ``m`` the row's number of terms,
  ``gamma_k = k u / (1 - k u)``, ``u = 2^-53``);
* rows whose bound exceeds ``floor`` (1 % of the tolerance) and that could hold the maximum are
  re-evaluated **exactly**: each product ``C_ij x_j`` is split into ``p + e`` without error
  (Dekker's TwoProduct with Veltkamp splitting) and the terms are summed by ``math.fsum`` (correctly
  rounded), in decreasing order of ``|fl(r_i)| + bound_i`` until no remaining row can exceed the
  exact maximum found;
* so the reported ``residual`` is the exact ``max |C x - b|`` of the returned vector, up to at most
  ``floor`` on rows that were not refined (their float error is below it), and
  ``relative_residual = residual / max_i (|C||x| + |b|)_i`` is the normwise backward error of
  ``x`` as a solution of ``C x = b``.

If more than ``MAX_REFINE`` rows would need the exact evaluation (their float bounds all exceed the
exact maximum found, e.g. when it is 0), the refinement stops and ``residual`` is the largest
remaining *upper bound* instead (``bounded=True``): still a true bound, never an underestimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:  # pragma: no cover
    from .blocks import Block

__all__ = ["ResidualReport", "accurate_residual", "dot2_rows", "exact_rows", "two_product"]

_U = 2.0**-53
_SPLIT = 2.0**27 + 1.0
CHUNK = 4096
MAX_REFINE = 1 << 16


@dataclass(frozen=True)
class ResidualReport:
    """``residual`` = max |Cx - b| (exact up to ``floor`` on unrefined rows); ``relative`` its
    normwise backward error; ``refined`` the number of rows evaluated exactly; ``float_residual``
    what a plain float64 evaluation gives; ``scale`` is ``max_i (|C||x| + |b|)_i`` (so ``u scale``,
    ``u = 2^-53``, is the residual that rounding ``x`` to float64 alone can cause)."""

    residual: float
    relative: float
    refined: int
    float_residual: float
    floor: float
    mse: float = 0.0
    bounded: bool = False
    rows: int = 0
    scale: float = 0.0


def _gamma(k: int) -> float:
    return k * _U / (1.0 - k * _U)


def two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a * b = p + e`` exactly (Dekker 1971): ``p = fl(a b)``, ``e`` its rounding error."""
    p = a * b

    def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = _SPLIT * x
        hi = c - (c - x)
        return hi, x - hi

    ah, al = split(a)
    bh, bl = split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def exact_rows(C: sp.csr_matrix, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``C x - b`` row by row, each row correctly rounded from the exact value (TwoProduct + fsum)."""
    C = sp.csr_matrix(C)
    p, e = two_product(C.data, x[C.indices])
    p, e, ptr, bl = p.tolist(), e.tolist(), C.indptr.tolist(), (-np.asarray(b, dtype=np.float64)).tolist()
    return np.array([math.fsum(p[ptr[i] : ptr[i + 1]] + e[ptr[i] : ptr[i + 1]] + [bl[i]]) for i in range(C.shape[0])])


DOT2_MAX_TERMS = 256  # rows with more non-zeros go through ``exact_rows`` (a Python loop per row)


def dot2_rows(C: sp.csr_matrix, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``C x - b`` for every row, as accurate as if computed in twice the working precision.

    Ogita, Rump and Oishi's ``Dot2`` (*Accurate sum and dot product*, SIAM J. Sci. Comput. 26, 2005,
    Alg. 5.3), vectorised across rows: every product ``C_ij x_j = p + e`` exactly (TwoProduct), the
    ``p`` and ``-b_i`` are summed with TwoSum and all rounding errors collected in a compensation
    term.  The result ``r_i`` satisfies (ibid., Prop. 5.5)

        ``|r_i - (C x - b)_i| <= u |(C x - b)_i| + gamma_{2k+1}^2 (|C||x| + |b|)_i``

    (``k`` the row's number of non-zeros, ``u = 2^-53``): relative accuracy ``u`` down to residuals
    of about ``1e-32`` times the row's scale.  Rows with more than ``DOT2_MAX_TERMS`` non-zeros are
    evaluated by :func:`exact_rows` instead (correctly rounded).  O(nnz) vectorised work, one pass per
    position within a row.
    """
    C = sp.csr_matrix(C)
    m = C.shape[0]
    lens = np.diff(C.indptr)
    s = -np.asarray(b, dtype=np.float64).copy()
    c = np.zeros(m)
    if C.nnz == 0:
        return s
    short = lens <= DOT2_MAX_TERMS
    p, e = two_product(C.data, x[C.indices])
    starts = C.indptr[:-1]
    for k in range(int(lens[short].max(initial=0))):
        rr = np.flatnonzero(short & (lens > k))  # rows with a k-th term (distinct)
        idx = starts[rr] + k
        a, t = s[rr], p[idx]
        tot = a + t  # TwoSum (Knuth): tot + err == a + t exactly
        z = tot - a
        err = (a - (tot - z)) + (t - z)
        s[rr] = tot
        c[rr] += err + e[idx]
    out = s + c
    long_rows = np.flatnonzero(~short)
    if long_rows.size:
        out[long_rows] = exact_rows(C[long_rows], x, np.asarray(b, dtype=np.float64)[long_rows])
    return out


def accurate_residual(blocks: list["Block"], x: np.ndarray, floor: float) -> ResidualReport:
    """:class:`ResidualReport` of ``x`` for the rows of ``blocks`` (module docstring)."""
    rows_total, sq, float_res, top_scale = 0, 0.0, 0.0, 0.0
    best = 0.0  # exact maximum so far (rows whose float value is trustworthy to ``floor`` count as they are)
    parts = []
    for blk in blocks:
        xl = blk.local(x)
        g = 1.01 * _gamma(blk.row_terms() + 1)  # 1 % margin for the rounding of the computed scale itself
        rows, uppers = [], []
        for first, r, scale in blk.residual_chunks(xl):
            if r.size == 0:
                continue
            r = np.abs(r)
            err = g * scale
            rows_total += r.size
            sq += float(np.dot(r, r))
            float_res = max(float_res, float(r.max()))
            top_scale = max(top_scale, float(scale.max()))
            cand = err > floor
            best = max(best, float(np.max(r, where=~cand, initial=0.0)))
            if cand.any():
                idx = np.flatnonzero(cand)
                rows.append(first + idx)
                uppers.append(r[idx] + err[idx])
        if rows:
            parts.append((blk, xl, np.concatenate(rows), np.concatenate(uppers)))
    if rows_total == 0:
        return ResidualReport(0.0, 0.0, 0, 0.0, floor)
    refined = 0
    bounded = False
    for blk, xl, cand, upper in parts:
        order = np.argsort(-upper, kind="stable")
        cand, upper = cand[order], upper[order]
        for lo in range(0, cand.size, CHUNK):
            if upper[lo] <= best:
                break  # no remaining row of this block can exceed the exact maximum found
            if refined >= MAX_REFINE:
                best, bounded = max(best, float(upper[lo])), True  # a rigorous bound on the rest
                break
            rows = cand[lo : lo + CHUNK]
            C, b = blk.select_rows(rows)
            best = max(best, float(np.abs(exact_rows(C, xl, b)).max()))
            refined += rows.size
    rel = best / top_scale if top_scale > 0 else 0.0
    return ResidualReport(best, rel, refined, float_res, floor, sq / rows_total, bounded, rows_total, top_scale)
