"""Non-negative integer counts at a level with crossed invariants (post-processing).

Crossed invariants pin several marginals of a unit's cells, none inside another (``age`` and
``race``; :func:`~sparsedp.topdown.design.pinned_marginals`).  With the parents' integer counts
fixed, each parent's children x cells table ``X`` must then have

* the parent's cells as column sums (``sum_i X_ic = parent_c``), and
* for every pinned marginal ``k``, the child's values as grouped row sums
  (``sum_{c in g} X_ic = values_k[i, g]`` for every cell ``g`` of the marginal),

with ``X`` non-negative integers (at the root, the rows alone).  With one marginal this is the
transportation problem of :mod:`sparsedp.topdown.rounding`; with several the constraint matrix is
no longer totally unimodular, and an integer table may not exist at all: a child pinned to
(young, white) by its age and race and another to (old, black), under a parent whose rounded cells
say (young, black) = 1 and (old, white) = 1.

**Projection** (:func:`project_crossed`): the point of the ``1 + K`` families' intersection closest
to the GLS estimate in ``sum w (X - x)^2`` (``w = 1 / variance``), by cyclic Dykstra projections
(each family a batched simplex projection, :func:`~sparsedp.topdown.rounding.project_children` /
:func:`~sparsedp.topdown.rounding.project_marginal`), up to ``max_iter`` cycles (the intersection
may be empty: the rounding below decides).

**Rounding** (:func:`round_crossed`): the integer table closest to the projection, as a mixed
integer linear program (``scipy.optimize.milp``, HiGHS) on unit segments: each value is
``lo - t_down + sum_j s_j + t_up`` with binary segments ``s_j`` between ``floor(x) - 1`` and
``ceil(x) + 1`` costing ``w (2 (t_j - x) + 1)`` each (the quadratic's increments: exact there) and
integer tails beyond costing the last increment per unit (convex, so the segments fill in order).
When no integer table has the parent's cells as column sums, the **fallback** solves the parent
again with its column sums elastic: first the least total deviation ``sum |X_c - parent_c|``,
then the closest table with that deviation, keeping the parent's marginals on ``keep`` (the
invariants of the levels above); the parent's cells become the sums of its children, and the
caller (:func:`~sparsedp.topdown.release.integer_counts`) sums every ancestor again.  The children's
own marginals are those of the true table (or consistent official values), which is always such
a table, so the fallback always has one; the parent's invariants still hold (they are the sums of
its children's), and the counts stay non-negative integers that add up.  :class:`CrossedRounding`
counts the parents that needed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError, SparseDPError
from .rounding import project_children, project_marginal, snap_integral, unit_segments

__all__ = ["Grouped", "CrossedRounding", "project_crossed", "round_crossed"]

#: one pinned marginal of the units' cells: ``(c2m, values)``, for every cell the index of its cell
#: in the marginal, and the ``(units, marginal cells)`` values
Grouped = tuple[np.ndarray, np.ndarray]

#: the largest number of table values in one mixed integer program (a block of parents or units)
_BLOCK = 4096


@dataclass(frozen=True)
class CrossedRounding:
    """The result of :func:`round_crossed`: ``counts`` the ``(units, cells)`` integers; ``parent_counts``
    the parents' cells (equal to those given unless the fallback changed some: then each changed
    parent is the sum of its children); ``fallbacks`` how many parents' cells changed."""

    counts: np.ndarray
    parent_counts: np.ndarray | None
    fallbacks: int


def project_crossed(est: np.ndarray, w: np.ndarray, groups: Sequence[Grouped], parents: np.ndarray | None = None,
                    parent_counts: np.ndarray | None = None, tol: float = 1e-9, max_iter: int = 2000) -> np.ndarray:
    """The ``(units, cells)`` table in ``{X >= 0, grouped row sums = values_k for every k}`` (and,
    with ``parents``, ``{column sums per parent = parent_counts}``) closest to ``est`` in
    ``sum w (X - est)^2``: cyclic Dykstra over the families of constraints (each one's correction
    kept apart), family by family of units (a parent's children; a unit alone at the root): a
    family stops once a cycle moves none of its values by more than ``tol`` times its largest
    count (at least 1), and later cycles leave it out, at most ``max_iter`` cycles (an empty
    intersection stops there: :func:`round_crossed` decides)."""
    x = np.asarray(est, dtype=np.float64).copy()
    n = x.shape[0]
    if x.size == 0:
        return x
    nested = parents is not None and parent_counts is not None
    fam_of = np.asarray(parents) if nested else np.arange(n)
    n_fam = parent_counts.shape[0] if nested else n  # type: ignore[union-attr]
    big = np.ones(n_fam)
    for _, vals in groups:
        np.maximum.at(big, fam_of, np.max(vals, axis=1, initial=0))
    if nested:
        big = np.maximum(big, np.max(parent_counts, axis=1, initial=0))
    inc = [np.zeros_like(x) for _ in range(len(groups) + nested)]
    active = np.zeros(n_fam, dtype=bool)
    active[fam_of] = True
    for _ in range(max_iter):
        rows = np.flatnonzero(active[fam_of])
        if rows.size == 0:
            break
        fam, local = np.unique(fam_of[rows], return_inverse=True)
        before = xr = x[rows]
        wr = w[rows]
        steps = [lambda v, c2m=c2m, vals=vals: project_marginal(v, wr, c2m, vals[rows]) for c2m, vals in groups]
        if nested:
            steps.insert(0, lambda v: project_children(v, wr, local, parent_counts[fam]))  # type: ignore[index]
        for j, step in enumerate(steps):
            y = step(xr + inc[j][rows])
            inc[j][rows] = xr + inc[j][rows] - y
            xr = y
        x[rows] = xr
        gap = np.zeros(fam.size)
        np.maximum.at(gap, local, np.abs(xr - before).max(axis=1))
        active[fam[gap <= tol * big[fam]]] = False
    return x


def round_crossed(x: np.ndarray, w: np.ndarray, groups: Sequence[Grouped], parents: np.ndarray | None = None,
                  parent_counts: np.ndarray | None = None, keep: Sequence[np.ndarray] = ()) -> CrossedRounding:
    """Non-negative integers with every unit's grouped row sums equal to ``values_k`` (and, with
    ``parents`` -- each unit's parent, children of a parent consecutive -- every parent's column
    sums equal to its cells), closest to ``x`` (:func:`project_crossed`) in ``sum w (X - x)^2``
    within one of its floors and ceilings (linear beyond): one mixed integer program per block of
    parents (or units at the root).  A parent without such a table is solved alone with its column
    sums elastic (the module docstring), its marginals on each of ``keep`` (``c2m`` arrays)
    unchanged; raises :class:`~sparsedp.errors.InfeasibleConstraintsError` when even that has no
    solution (official invariant values no table has)."""
    x = np.asarray(x, dtype=np.float64)
    n, C = x.shape
    w = np.maximum(np.asarray(w, dtype=np.float64), 1e-300)
    w = w / (float(w.mean()) if w.size else 1.0)  # the same optimum, costs of order 1 for the solver
    out = np.zeros((n, C), dtype=np.int64)
    if parents is None or parent_counts is None:
        for lo, hi in _blocks(np.arange(n + 1) * C):
            out[lo:hi] = _solve(x[lo:hi], w[lo:hi], [(c, v[lo:hi]) for c, v in groups])
        return CrossedRounding(out, None, 0)
    P = parent_counts.shape[0]
    new = np.asarray(parent_counts).astype(np.int64, copy=True)
    counts = np.bincount(parents, minlength=P)
    ptr = np.concatenate(([0], np.cumsum(counts)))
    has = np.flatnonzero(counts > 0)
    changed = 0
    for a, b in _blocks(ptr[np.append(has, has[-1] + 1)] * C if has.size else np.zeros(1, dtype=np.int64)):
        ps = has[a:b]
        lo, hi = int(ptr[ps[0]]), int(ptr[ps[-1] + 1])
        sub = [(c, v[lo:hi]) for c, v in groups]
        local = np.searchsorted(ps, parents[lo:hi])
        try:
            out[lo:hi] = _solve(x[lo:hi], w[lo:hi], sub, local, new[ps])
            continue
        except InfeasibleConstraintsError:
            pass
        for p in ps:  # the block has a parent without a table: each parent alone, elastic if need be
            lo, hi = int(ptr[p]), int(ptr[p + 1])
            sub = [(c, v[lo:hi]) for c, v in groups]
            zero = np.zeros(hi - lo, dtype=np.int64)
            try:
                out[lo:hi] = _solve(x[lo:hi], w[lo:hi], sub, zero, new[p:p + 1])
            except InfeasibleConstraintsError:
                out[lo:hi] = _solve(x[lo:hi], w[lo:hi], sub, zero, new[p:p + 1], keep=keep)
                new[p] = out[lo:hi].sum(axis=0)
                changed += 1
    return CrossedRounding(out, new, changed)


def _blocks(ends: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive runs ``[a, b)`` of the items whose values span ``ends[a] : ends[b]`` (``ends``:
    cumulative, one more than the items), each of at most :data:`_BLOCK` values (or one item)."""
    out, a, m = [], 0, ends.size - 1
    while a < m:
        b = a + 1
        while b < m and ends[b + 1] - ends[a] <= _BLOCK:
            b += 1
        out.append((a, b))
        a = b
    return out


def _solve(x: np.ndarray, w: np.ndarray, groups: Sequence[Grouped], parents: np.ndarray | None = None,
           parent_counts: np.ndarray | None = None, keep: Sequence[np.ndarray] | None = None) -> np.ndarray:
    """One block's mixed integer program (:func:`round_crossed`); ``keep`` not ``None``: the
    parents' column sums elastic (least deviation first, then the closest table with it)."""
    n, C = x.shape
    ub = np.full((n, C), np.iinfo(np.int64).max, dtype=np.int64)
    for c2m, vals in groups:  # no value above any of its marginal cells
        ub = np.minimum(ub, np.asarray(vals, dtype=np.int64)[:, c2m])
    xs = snap_integral(x)
    lo = np.clip(np.floor(xs).astype(np.int64) - 1, 0, ub)
    hi = np.clip(np.ceil(xs).astype(np.int64) + 1, lo, ub)
    e_seg, t = unit_segments(lo, hi)
    cells = np.arange(n * C)
    xv, wv, lov, hiv = x.ravel(), w.ravel(), lo.ravel(), hi.ravel()
    entry = np.concatenate([e_seg, cells, cells])
    sign = np.concatenate([np.ones(e_seg.size), -np.ones(n * C), np.ones(n * C)])
    cost = np.concatenate([wv[e_seg] * (2.0 * (t - xv[e_seg]) + 1.0),  # the quadratic's increments
                           wv * (2.0 * (xv - lov) + 1.0), wv * (2.0 * (hiv - xv) + 1.0)])  # linear tails
    upper = np.concatenate([np.ones(e_seg.size), lov, (ub - hi).ravel()]).astype(np.float64)
    unit, cell = entry // C, entry % C
    rows, rhs = [], []
    for c2m, vals in groups:
        m = int(vals.shape[1])
        rows.append(sp.csr_matrix((sign, (unit * m + c2m[cell], np.arange(entry.size))), shape=(n * m, entry.size)))
        base = np.bincount((np.arange(n)[:, None] * m + c2m[None, :]).ravel(), weights=lov, minlength=n * m)
        rhs.append(np.asarray(vals, dtype=np.float64).ravel() - base)
    nv = entry.size
    if parents is not None and parent_counts is not None:
        P = parent_counts.shape[0]
        col = sp.csr_matrix((sign, (parents[unit] * C + cell, np.arange(nv))), shape=(P * C, nv))
        base = np.bincount((parents[:, None] * C + np.arange(C)[None, :]).ravel(), weights=lov, minlength=P * C)
        rows.append(col)
        rhs.append(parent_counts.ravel().astype(np.float64) - base)
    A = sp.vstack(rows, format="csr")
    b = np.concatenate(rhs)
    if keep is None:
        s = _milp(cost, A, b, upper)
        if s is None:
            raise InfeasibleConstraintsError("no non-negative integer table meets the crossed invariants and its "
                                             "parent's counts")
        return _table(lov, entry, sign, s[:nv], n, C)
    # elastic columns: X's column sums + d_plus - d_minus = the parent's cells; the parent's
    # marginals on ``keep`` unchanged (sum over a marginal cell of d_plus - d_minus = 0)
    P = parent_counts.shape[0]  # type: ignore[union-attr]
    k = P * C
    D = sp.vstack([sp.csr_matrix((A.shape[0] - k, 2 * k)), sp.hstack([sp.identity(k), -sp.identity(k)])], format="csr")
    A2 = sp.hstack([A, D], format="csr")
    extra, zeros = [], []
    for c2m in keep:
        m = int(c2m.max()) + 1
        g = (np.arange(P)[:, None] * m + c2m[None, :]).ravel()
        G = sp.csr_matrix((np.ones(k), (g, np.arange(k))), shape=(P * m, k))
        extra.append(sp.hstack([sp.csr_matrix((P * m, nv)), G, -G], format="csr"))
        zeros.append(np.zeros(P * m))
    A2 = sp.vstack([A2] + extra, format="csr")
    b2 = np.concatenate([b] + zeros)
    up2 = np.concatenate([upper, np.full(2 * k, np.inf)])
    least = _milp(np.r_[np.zeros(nv), np.ones(2 * k)], A2, b2, up2)
    if least is None:
        raise InfeasibleConstraintsError(
            "no non-negative integer table of a parent's children meets their crossed invariants with the parent's "
            "marginals that the invariants of the levels above fix (an invariant only above the parent's level "
            "finer than the crossed ones)")
    bound = float(np.round(least[nv:].sum()))
    cap = sp.csr_matrix(np.r_[np.zeros(nv), np.ones(2 * k)][None, :])
    s = _milp(np.r_[cost, np.zeros(2 * k)], A2, b2, up2, (cap, bound))
    if s is None:  # pragma: no cover - the first solution meets the bound
        raise SparseDPError("the elastic rounding lost its solution")
    return _table(lov, entry, sign, s[:nv], n, C)


def _milp(cost: np.ndarray, A: sp.csr_matrix, b: np.ndarray, upper: np.ndarray,
          cap: tuple[sp.csr_matrix, float] | None = None) -> np.ndarray | None:
    """``argmin cost . s`` over integers ``0 <= s <= upper`` with ``A s = b`` (and ``cap[0] s <=
    cap[1]``), or ``None`` when there is none.  The linear relaxation first (HiGHS' dual simplex,
    no presolve: 5x faster than branch and bound here): a vertex that is integral is the integer
    optimum, and an empty relaxation has no integer point; else HiGHS' branch and bound."""
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp

    ub = dict(A_ub=cap[0], b_ub=[cap[1]]) if cap is not None else {}
    lp = linprog(cost, A_eq=A, b_eq=b, bounds=np.c_[np.zeros(cost.size), upper], method="highs-ds",
                 options={"presolve": False}, **ub)
    if lp.status == 2:
        return None
    if lp.status == 0 and np.all(np.abs(lp.x - np.round(lp.x)) <= 1e-7):
        return np.round(lp.x)
    cons = [LinearConstraint(A, b, b)]
    if cap is not None:
        cons.append(LinearConstraint(cap[0], -np.inf, cap[1]))
    res = milp(cost, constraints=cons, integrality=np.ones(cost.size), bounds=Bounds(np.zeros(cost.size), upper))
    if res.status == 2:
        return None
    if res.status != 0 or res.x is None:
        raise SparseDPError(f"the crossed rounding's integer program did not finish ({res.message})")
    return np.round(res.x)


def _table(lo: np.ndarray, entry: np.ndarray, sign: np.ndarray, s: np.ndarray, n: int, C: int) -> np.ndarray:
    """The ``(n, C)`` integer table ``lo + sum of its signed segments and tails``."""
    X = lo + np.bincount(entry, weights=sign * s, minlength=n * C)
    return np.rint(X).astype(np.int64).reshape(n, C)
