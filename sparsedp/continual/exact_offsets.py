"""Exact running-sum offsets ``e = W G z``: the release ``s~_t = s_t + e_t`` as an exact function of
the noisy measurement, for tree strategies and for ``[I; B]`` (p-Identity) strategies.

Why.  A tree counter that measures every node -- the root and the upper nodes hold *future* steps --
cannot wait for ``y = M x + z`` to release step ``t``.  It uses the identity ``W G y = s + W G z``
(``G M = I``): the offsets ``e = W G z`` do not depend on the data, so they are computed from the
noise at creation and ``s~_t = s_t + e_t`` is released online.  That identity holds in exact
arithmetic only.  Evaluated in float64, ``e_t`` takes its values on a countable set fixed by the
public estimator and the noise lattice, and ``s_t + e_t`` reveals ``s_t``: an observer who knows the
estimator enumerates the noise and recomputes the output bit for bit under each hypothesis
(measured on the old float evaluation at ``N = 13``, ``epsilon = 1``: an audited lower bound of
2.254 for a claim of 1.0).  The rule: after exact noise, only post-processing of the measurement is
published.

How.  Here ``e`` is computed exactly, in integers, for an estimator whose coefficients are dyadic
rationals, and the release is the correctly rounded float of the exact rational ``s_t + e_t``.
Since ``s_t + e_t = (W G y)_t`` exactly, the output is a function of ``y`` alone: post-processing.

The estimator is the two-pass GLS of Hay et al. (2010) with its two kinds of coefficients rounded to
``P`` bits, which keeps it *exactly* unbiased (``G M = I``) whatever the rounding:

* upward, a node ``u`` with children ``C`` combines its own measurement and the sum of its
  children's upward estimates, ``zbar_u = a_u y_u + (1 - a_u) sum_c zbar_c``, ``a_u = A_u / 2^P``
  (optimal: ``V_u / (v_u + V_u)``, ``V_u = sum_c var(zbar_c)``); an unmeasured node has ``a_u = 0``;
* downward, ``xhat_c = zbar_c + d_c (xhat_u - sum_c' zbar_c')`` with ``d_c = D_c / 2^P`` and
  ``sum_c D_c = 2^P`` exactly (optimal: ``var(zbar_c) / V_u``).

Both keep every estimate an affine combination, with weights summing to 1, of unbiased estimates of
the same quantity, so ``G M = I`` holds in exact arithmetic.  Rounding the optimal coefficients to
``P = 64`` bits moves the variance by a relative ``O(2^-128)`` (second order at the optimum); the
variances reported (:func:`sparsedp.continual.path_variances`) are those of the optimal GLS.

**``[I; B]`` strategies** (:class:`DiagonalPlusRows`; HDMM's p-Identity measured with per-row
scales on its identity block).  With ``y_1 = x + z_1`` and ``y_2 = B x + z_2`` (integer ``B``), every
estimate ``x^ = y_1 + K (y_2 - B y_1)`` is exactly unbiased, whatever ``K``; the GLS (BLUE) is
``K = V_1 B^T (B V_1 B^T + V_2)^{-1}`` (the update form of ``(M^T V^{-1} M)^{-1} M^T V^{-1} y``).
``K`` is rounded to ``P = 64``-bit dyadic entries and ``e = cumsum(z_1 + K (z_2 - B z_1))`` is computed
in integers: ``O(N p)`` big-integer operations.

In integers (trees): with ``g`` the noise lattice (``z_u = g Z_u``), the upward estimate of a level-``l``
node is ``Ybar_u g 2^{-P l}`` and the downward estimate ``Xhat_u g 2^{-P (2 L - 2 - l)}``
(``L`` levels), both with integer ``Ybar``, ``Xhat``; the leaves' running sums have the common
denominator ``2^T``, ``T = 2 P (L - 1)``.  Integers grow to about ``T + 60`` bits (Python integers,
vectorised over numpy object arrays, ``O(nodes)`` operations).  Cost at ``N = 2^20`` (radix 12, 7
levels): see ``docs/continual.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..strategies import TreeLayout

__all__ = ["COEFFICIENT_BITS", "DiagonalPlusRows", "ExactOffsets", "exact_tree_offsets"]

#: Bits of the estimator's dyadic coefficients (module docstring).
COEFFICIENT_BITS = 64


@dataclass(frozen=True)
class ExactOffsets:
    """The running-sum offsets ``e_t = grid * num[t] / 2^shift`` (exact rationals) of a release.

    :meth:`release` gives the correctly rounded float of ``s_t + e_t`` for an exact running sum
    ``s_t`` (a multiple of ``grid``); :meth:`floats` the offsets themselves, correctly rounded
    (test hooks and diagnostics)."""

    num: tuple[int, ...]
    shift: int
    grid: float

    def release(self, t: int, running_sum: float) -> float:
        """``fl(s_t + e_t)`` for step ``t`` (0-based), ``s_t = running_sum`` exactly on the grid."""
        units = running_sum / self.grid
        s = int(units)
        if s != units:
            raise SparseDPError(f"running sum {running_sum!r} is not on the noise lattice {self.grid!r}")
        return ((s << self.shift) + self.num[t]) / (1 << self.shift) * self.grid

    def floats(self) -> np.ndarray:
        """Every ``e_t``, correctly rounded."""
        den = 1 << self.shift
        return np.array([n / den for n in self.num], dtype=np.float64) * self.grid


def _as_units(z: np.ndarray, grid: float) -> np.ndarray:
    """``z / grid`` as Python integers (object array); refuses values off the lattice."""
    u = np.asarray(z, dtype=np.float64) / grid
    if not np.all(np.isfinite(u)) or not np.array_equal(u, np.round(u)):
        raise SparseDPError("exact offsets need noise on the lattice (integer multiples of the grid)")
    return np.array([int(v) for v in u.tolist()], dtype=object)


def _dyadic(frac: np.ndarray, bits: int) -> np.ndarray:
    """``round(2^bits frac)`` as Python integers (object array; exact: a float times a power of two)."""
    scaled = np.round(np.ldexp(np.asarray(frac, dtype=np.float64), bits))
    return np.array([int(v) for v in scaled.tolist()], dtype=object)


def _shares(var_children: np.ndarray, starts: np.ndarray, bits: int) -> np.ndarray:
    """``D_c`` per child: ``round(2^P var_c / V_u)``, the child of largest variance in each group
    (first on ties) corrected so that every group sums to exactly ``2^P``."""
    counts = np.diff(starts)
    V = np.add.reduceat(var_children, starts[:-1])
    D = _dyadic(var_children / np.repeat(V, counts), bits)
    group_sum = np.add.reduceat(D, starts[:-1])
    parent_of = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((-var_children, parent_of))
    absorb = order[starts[:-1]]
    D[absorb] = D[absorb] + ((1 << bits) - group_sum)
    return D


def exact_tree_offsets(layout: TreeLayout, z: np.ndarray, variances: np.ndarray, grid: float,
                       bits: int = COEFFICIENT_BITS) -> ExactOffsets:
    """Exact running-sum offsets ``e = W G z`` of the dyadic two-pass GLS (module docstring).

    ``z``: per node (strategy row order, root first), the noise in sum units, on the lattice
    ``grid`` (0 for unmeasured nodes); ``variances``: per node, its variance in sum units (``inf``:
    not measured; the leaves must be measured).  ``O(nodes)`` big-integer operations."""
    z = np.asarray(z, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    if z.shape != (layout.nodes,) or v.shape != (layout.nodes,):
        raise SparseDPError(f"need one noise value and one variance per node ({layout.nodes})")
    if not np.all(np.isfinite(layout.level_rows(v, 0))) or np.any(v <= 0):
        raise SparseDPError("every leaf must be measured and every variance must be positive")
    P = int(bits)
    one = 1 << P
    L = layout.levels
    Z = _as_units(np.where(np.isfinite(v), z, 0.0), grid)
    ybar = [layout.level_rows(Z, 0)]  # upward estimates, level l in units of g 2^(-P l)
    vbar = [layout.level_rows(v, 0).copy()]
    for lev in range(1, L):
        starts = layout.child_starts[lev - 1]
        S = np.add.reduceat(ybar[-1], starts[:-1])
        VS = np.add.reduceat(vbar[-1], starts[:-1])
        vl = layout.level_rows(v, lev)
        measured = np.isfinite(vl)
        alpha = np.where(measured, VS / np.where(measured, vl + VS, 1.0), 0.0)
        A = _dyadic(alpha, P)
        a = np.array([x / one for x in A.tolist()], dtype=np.float64)
        ybar.append(A * layout.level_rows(Z, lev) * (1 << (P * (lev - 1))) + (one - A) * S)
        vbar.append(np.where(measured, a * a * np.where(measured, vl, 0.0) + (1.0 - a) ** 2 * VS, VS))
    xhat = ybar[L - 1]  # the root: downward units g 2^(-P (2L - 2 - l)) equal the upward ones at l = L - 1
    for lev in range(L - 2, -1, -1):
        starts = layout.child_starts[lev]
        E = P * (2 * L - 2 - 2 * lev)
        S = np.add.reduceat(ybar[lev], starts[:-1])
        resid = xhat - S * (1 << (E - P))
        D = _shares(vbar[lev], starts, P)
        xhat = ybar[lev] * (1 << E) + D * np.repeat(resid, np.diff(starts))
    return ExactOffsets(tuple(np.cumsum(xhat).tolist()), 2 * P * (L - 1), float(grid))


def _int_matvec(B: Any, u: np.ndarray) -> np.ndarray:
    """``B u`` exactly, for an integer sparse ``B`` (entries below ``2^31``) and Python-integer ``u``:
    int64 products on 21-bit limbs of ``u`` (no partial sum can overflow below ``2^62``), combined
    in Python integers."""
    Bi = B.astype(np.int64)
    u = np.asarray(u, dtype=object)
    width = int(np.asarray(abs(Bi).sum(axis=1)).max(initial=0)) if Bi.nnz else 0
    limb = max(1, 62 - max(1, width.bit_length()) - 1)  # |B| row sums * 2^limb < 2^62
    mask = (1 << limb) - 1
    out = np.zeros(B.shape[0], dtype=object)
    rest = u.copy()
    shift = 0
    while np.any(rest != 0):
        sign = np.where(rest < 0, -1, 1)
        mag = rest * sign
        low = np.array([int(v) & mask for v in mag.tolist()], dtype=np.int64) * sign.astype(np.int64)
        part = Bi @ low
        out = out + np.array([int(v) << shift for v in part.tolist()], dtype=object)
        rest = np.array([(int(m) >> limb) * int(sg) for m, sg in zip(mag.tolist(), sign.tolist())], dtype=object)
        shift += limb
    return out


class DiagonalPlusRows:
    """Exact offsets of ``[I; B]`` strategies (module docstring): ``e = cumsum(z_1 + K (z_2 - B z_1))``
    with the GLS gain ``K`` rounded to dyadic rationals (exactly unbiased for any ``K``).

    ``B``: the extra rows (integer, ``p x N``); ``v1``, ``v2``: the noise variances of the identity
    rows and of the extra rows (data units).  The gain is computed once (``O(N p^2 + p^3)``)."""

    def __init__(self, B: Any, v1: np.ndarray, v2: np.ndarray, bits: int = COEFFICIENT_BITS) -> None:
        import scipy.linalg as sla
        import scipy.sparse as sp

        self.B = sp.csr_matrix(B)
        if not np.array_equal(self.B.data, np.round(self.B.data)) or np.abs(self.B.data).max(initial=0) >= 2.0**31:
            raise SparseDPError("exact offsets need integer extra rows (entries below 2^31)")
        v1 = np.asarray(v1, dtype=np.float64)
        v2 = np.asarray(v2, dtype=np.float64)
        p, N = self.B.shape
        if v1.shape != (N,) or v2.shape != (p,):
            raise SparseDPError("need one variance per identity row and per extra row")
        BV = (self.B @ sp.diags(v1)).toarray()  # B V_1, p x N
        S = BV @ self.B.T.toarray() + np.diag(v2)
        K = sla.solve(S, BV, assume_a="pos").T  # V_1 B^T S^-1, N x p
        self.bits = int(bits)
        self.K = _dyadic(K.ravel(), self.bits).reshape(K.shape)
        self.N, self.p = N, p

    def offsets(self, z: np.ndarray, grid: float) -> ExactOffsets:
        """The exact offsets for the noise ``z`` (identity rows first, then the extra rows; data units,
        on the lattice ``grid``)."""
        Z = _as_units(np.asarray(z, dtype=np.float64), grid)
        if Z.size != self.N + self.p:
            raise SparseDPError(f"need {self.N + self.p} noise values")
        z1, z2 = Z[: self.N], Z[self.N:]
        r = z2 - _int_matvec(self.B, z1)
        num = z1 * (1 << self.bits) + self.K.dot(r)
        return ExactOffsets(tuple(np.cumsum(num).tolist()), self.bits, float(grid))
