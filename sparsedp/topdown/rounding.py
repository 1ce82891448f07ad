"""Non-negative integer counts that add up, level by level from the top (post-processing).

Given the real-valued estimates of every level (the GLS) and the invariants, the counts are fixed
top-down.  The root's cells are projected onto ``{v >= 0}`` (and onto its invariant marginal, if
any) and rounded.  Then, for each level, with the parents' integer counts fixed:

* **1-D** (no invariant at the level): for every parent and cell, the children's values are
  projected onto ``{v >= 0, sum v = parent's count}`` in the weighted norm
  ``sum w_i (v_i - e_i)^2`` (``w = 1 / variance``), then rounded by largest remainders, which keeps
  each sum: a controlled rounding of a one-dimensional sum (every value goes to its floor or its
  ceiling, and among those roundings this one is the closest in squared distance).
* **2-D** (the children's invariant marginal is fixed too, e.g. each state's total population):
  the children x cells table of each parent must have the parent's cells as column sums and the
  invariant as (grouped) row sums: a transportation polytope.  The projection onto it is computed
  by Dykstra's alternating projections (the two families are batched simplex projections), and the
  integer table closest to the projection in squared distance, with every value within one of its
  floor / ceiling, by one linear program (HiGHS): the constraint matrix is the incidence matrix of a
  bipartite graph (every variable in one row group and one column), totally unimodular, so the
  simplex vertex is integral; with convex piecewise-linear costs between consecutive integers it is
  the integer optimum over the window.

Everything here is vectorised over all parents and cells of a level (the groups of one size as the
rows of one array, one pass per distinct size), except that the 2-D linear program is one solve per
parent.  The projection and the rounding of a group depend on its own values alone, so
a level rounded whole or subtree by subtree (the chunked release) gives the same integers.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError, SparseDPError

__all__ = ["simplex_project", "round_groups", "project_transport", "round_transport"]


def simplex_project(v: np.ndarray, w: np.ndarray, starts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """For every group ``g`` (the contiguous slice ``starts[g] : starts[g + 1]``), the point of
    ``{x >= 0, sum x = totals[g]}`` closest to ``v`` in ``sum w_i (x_i - v_i)^2`` (``w > 0``):
    ``x_i = max(0, v_i - lam_g / w_i)``, ``lam_g`` found by sorting the breakpoints ``v_i w_i``.

    Groups of one size are solved together as the rows of one array (one pass per distinct
    size): every group's result depends on its own values alone, so a level projected whole or
    subtree by subtree gives the same bits."""
    v = np.asarray(v, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    totals = np.asarray(totals, dtype=np.float64)
    n = v.size
    if n == 0:
        return v.copy()
    if np.any(totals < 0):
        raise InfeasibleConstraintsError("a group's total is negative")
    sizes = np.diff(starts)
    if np.any((sizes == 0) & (totals > 0)):
        raise InfeasibleConstraintsError("a group with a positive total has no members")
    if sizes.size and sizes[0] > 0 and np.all(sizes == sizes[0]):
        return _simplex_project_equal(v.reshape(-1, int(sizes[0])), w.reshape(-1, int(sizes[0])), totals).ravel()
    out = np.zeros(n)
    first = np.asarray(starts[:-1], dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    ss = sizes[order]
    cut = np.flatnonzero(np.diff(ss)) + 1
    for grp in np.split(order, cut):
        k = int(sizes[grp[0]])
        if k == 0:
            continue
        idx = first[grp][:, None] + np.arange(k)
        out[idx] = _simplex_project_equal(v[idx], w[idx], totals[grp])
    return out


def _simplex_project_equal(v: np.ndarray, w: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """:func:`simplex_project` for groups of one size, as the rows of ``(groups, size)`` arrays."""
    bp = v * w
    order = np.argsort(-bp, axis=1, kind="stable")
    vs, iws, bs = (np.take_along_axis(a, order, axis=1) for a in (v, 1.0 / w, bp))
    cv, ci = np.cumsum(vs, axis=1), np.cumsum(iws, axis=1)
    lam = (cv - totals[:, None]) / ci
    ok = bs > lam
    k = v.shape[1]
    last = np.where(ok.any(axis=1), k - 1 - np.argmax(ok[:, ::-1], axis=1), -1)
    lam_g = np.where(last >= 0, lam[np.arange(v.shape[0]), np.maximum(last, 0)], np.inf)
    x = np.where(np.isfinite(lam_g)[:, None], np.maximum(0.0, v - lam_g[:, None] / w), 0.0)
    act = x > 0
    a = np.where(act, 1.0 / w, 0.0).sum(axis=1)
    fix = (a > 0) & np.isfinite(lam_g)
    lam_g = np.where(fix, lam_g + (x.sum(axis=1) - totals) / np.where(a > 0, a, 1.0), lam_g)
    return np.maximum(np.where(act, v - lam_g[:, None] / w, 0.0), 0.0)


def round_groups(x: np.ndarray, starts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Integers, each ``floor(x_i)`` or ``floor(x_i) + 1``, that add up to the integer
    ``totals[g]`` in every contiguous group (largest remainders first); ``x >= 0`` with group sums
    within less than one of the totals.  Raises if a group cannot be rounded that way."""
    x = np.asarray(x, dtype=np.float64)
    totals = np.asarray(totals)
    fl = np.floor(x)
    frac = x - fl
    fl = fl.astype(np.int64)
    sizes = np.diff(starts)
    nz = sizes > 0
    have = np.zeros(sizes.size, dtype=np.int64)
    if x.size:
        have[nz] = np.add.reduceat(fl, starts[:-1][nz])
    need = totals.astype(np.int64) - have
    if np.any(need < 0) or np.any(need > sizes):
        g = int(np.flatnonzero((need < 0) | (need > sizes))[0])
        raise InfeasibleConstraintsError(f"a group cannot be rounded to its total (needs {int(need[g])} more units "
                                         f"over {int(sizes[g])} values)")
    if x.size == 0:
        return fl
    # the largest remainders of each group first (ties: the earlier member), groups of one size as
    # the rows of one array: each group's rounding depends on its own values alone
    up = np.zeros(x.size, dtype=bool)
    first = np.asarray(starts[:-1], dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    cut = np.flatnonzero(np.diff(sizes[order])) + 1
    for grp in np.split(order, cut):
        k = int(sizes[grp[0]])
        if k == 0:
            continue
        idx = first[grp][:, None] + np.arange(k)
        rank = np.empty((grp.size, k), dtype=np.int64)
        np.put_along_axis(rank, np.argsort(-frac[idx], axis=1, kind="stable"), np.arange(k), axis=1)
        up[idx] = rank < need[grp][:, None]
    return fl + up


def _column_groups(parents: np.ndarray, n_parents: int, C: int) -> tuple[np.ndarray, np.ndarray]:
    """For children sorted by parent, the (cell, parent) groups of the children x cells table
    laid out cell-major (``table.T.ravel()``): group starts and the parents with children."""
    n = parents.size
    counts = np.bincount(parents, minlength=n_parents)
    has = np.flatnonzero(counts > 0)
    ptr = np.concatenate(([0], np.cumsum(counts)))[has]
    starts = (ptr[None, :] + (np.arange(C) * n)[:, None]).ravel()
    return np.append(starts, n * C), has


def project_children(est: np.ndarray, w: np.ndarray, parents: np.ndarray, parent_counts: np.ndarray) -> np.ndarray:
    """1-D: each parent's children, cell by cell, onto ``{v >= 0, sum v = parent's count}``."""
    n, C = est.shape
    starts, has = _column_groups(parents, parent_counts.shape[0], C)
    totals = parent_counts[has].T.ravel().astype(np.float64)
    x = simplex_project(est.T.ravel(), w.T.ravel(), starts, totals)
    return x.reshape(C, n).T


def round_children(x: np.ndarray, parents: np.ndarray, parent_counts: np.ndarray) -> np.ndarray:
    """1-D: largest-remainder rounding of each parent's children, cell by cell, to the parent's count."""
    n, C = x.shape
    starts, has = _column_groups(parents, parent_counts.shape[0], C)
    totals = parent_counts[has].T.ravel()
    return round_groups(x.T.ravel(), starts, totals).reshape(C, n).T


def _row_groups(c2m: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """For a units x cells table with its cells reordered by marginal cell (``order``), the
    (unit, marginal cell) groups of ``table[:, order].ravel()``: ``(order, starts)``."""
    C = c2m.size
    order = np.argsort(c2m, kind="stable")
    m = int(c2m.max()) + 1
    per = np.bincount(c2m, minlength=m)
    local = np.concatenate(([0], np.cumsum(per)))[:-1]
    starts = (local[None, :] + (np.arange(n) * C)[:, None]).ravel()
    return order, np.append(starts, n * C)


def project_marginal(est: np.ndarray, w: np.ndarray, c2m: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each unit's cells onto ``{v >= 0, marginal(v) = values}`` (groups of cells by ``c2m``)."""
    n, C = est.shape
    order, starts = _row_groups(c2m, n)
    x = simplex_project(est[:, order].ravel(), w[:, order].ravel(), starts, values.ravel().astype(np.float64))
    out = np.empty_like(est)
    out[:, order] = x.reshape(n, C)
    return out


def round_marginal(x: np.ndarray, c2m: np.ndarray, values: np.ndarray) -> np.ndarray:
    n, C = x.shape
    order, starts = _row_groups(c2m, n)
    r = round_groups(x[:, order].ravel(), starts, values.ravel())
    out = np.empty((n, C), dtype=np.int64)
    out[:, order] = r.reshape(n, C)
    return out


def _newton_groups(z: np.ndarray, iw: np.ndarray, totals: np.ndarray, act: np.ndarray, A: np.ndarray | None,
                   gsum: Callable[[np.ndarray], np.ndarray], spread: Callable[[np.ndarray], np.ndarray],
                   out: np.ndarray, max_steps: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every group's weighted simplex projection ``x = max(0, z - lam_g * iw)`` with ``sum x =
    totals_g`` (``iw = 1 / w``; ``gsum``: an array's per-group sums, ``spread``: a per-group array
    back to the entries), by Newton's method on ``lam`` from the active set ``act`` (``A``: its
    per-group ``sum iw``, ``None``: compute it); ``x`` is written to ``out`` (scratch meanwhile).

    ``phi(lam) = sum max(0, z - lam iw) - t`` is convex, piecewise linear and decreasing; a step
    ``lam = (sum_act z - t) / sum_act iw`` is exact once the active set it produces is the one it
    came from, and after the first step the iterates approach the root from one side.  Between
    Dykstra passes the active set barely changes: usually one step.  A group without an active
    entry starts from all its entries active (``lam`` below the root); a group of total 0 is 0.

    Safeguard: in exact arithmetic the steps end, but a large group whose active set moves a lot
    may need many, and in floating point an entry at a breakpoint can flip in and out forever.  A
    group whose active set still changed at step ``max_steps`` is projected exactly by sorting
    (:func:`simplex_project`) instead -- so every group's result is an exact projection (Dykstra
    needs that), and it depends on the group's own values alone: its own step count decides.
    Returns ``(x, act, A)``."""
    zero = totals <= 0
    if A is None:
        A = gsum(np.multiply(iw, act, out=out))
    converged = False
    for step in range(max_steps):
        S = gsum(np.multiply(z, act, out=out))
        cold = (A <= 0) & ~zero
        if cold.any():
            A, S = np.where(cold, gsum(iw), A), np.where(cold, gsum(z), S)
        lam = (S - totals) / np.where(zero, 1.0, A)
        lam[zero] = np.inf
        u = np.subtract(z, np.multiply(spread(lam), iw, out=out), out=out)
        new = u > 0
        if np.array_equal(new, act):
            converged = True
            break
        prev, act = act, new
        if step + 1 < max_steps:
            A = gsum(iw * act)
    np.maximum(u, 0.0, out=u)
    if not converged:
        bad = gsum(np.not_equal(new, prev)) > 0
        if bad.any():
            _exact_groups(z, iw, totals, bad, spread, u)
            new = u > 0
        A = gsum(iw * new)
    return u, new, A


def _exact_groups(z: np.ndarray, iw: np.ndarray, totals: np.ndarray, bad: np.ndarray,
                  spread: Callable[[np.ndarray], np.ndarray], out: np.ndarray) -> None:
    """The groups flagged ``bad`` projected exactly by :func:`simplex_project` into ``out`` (their
    entries gathered group by group: ``spread`` of the group numbers gives each entry's group)."""
    gid = spread(np.arange(totals.size).reshape(totals.shape))
    members = np.flatnonzero(bad.ravel()[gid.ravel()])
    members = members[np.argsort(gid.ravel()[members], kind="stable")]
    g = gid.ravel()[members]
    first = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    starts = np.r_[first, g.size]
    t = np.maximum(totals.ravel()[g[first]], 0.0)
    np.put(out, members, simplex_project(z.ravel()[members], 1.0 / iw.ravel()[members], starts, t))


def _row_group_sums(c2m: np.ndarray) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """For a cells x units array (transposed), the sums per (marginal cell, unit) ``(m, units)``
    and the spread of such an array back to the cells (``c2m``: each cell's marginal cell)."""
    m = int(c2m.max()) + 1
    if m == 1:
        return (lambda a: a.sum(axis=0, keepdims=True)), (lambda lam: lam)
    cols = [np.flatnonzero(c2m == k) for k in range(m)]
    return (lambda a: np.stack([a[c].sum(axis=0) for c in cols])), (lambda lam: lam[c2m])


def project_transport(est: np.ndarray, w: np.ndarray, parents: np.ndarray, parent_counts: np.ndarray,
                      c2m: np.ndarray, values: np.ndarray, tol: float = 1e-9, max_iter: int = 5000) -> np.ndarray:
    """2-D: each parent's children x cells table onto ``{X >= 0, column sums = the parent's cells,
    grouped row sums = values}`` (weighted; children sorted by parent), by Dykstra's alternating
    projections, family by family: a family stops once its own largest gap between the two
    projections is at most ``tol`` times its parent's largest count (at least 1), and later passes
    leave it out.  So a family's result depends on its own values alone -- the same bits whether
    its level is projected whole or subtree by subtree -- and the families that converge early cost
    nothing more.

    Each pass's two simplex projections (per (parent, cell) and per (child, marginal cell)) are
    Newton steps from the previous pass's active sets (:func:`_newton_groups`; no sorting, except
    for a group whose steps do not settle, projected exactly by sorting instead).  The
    arrays are held cells x children (each cell's children contiguous: a family's sums are
    contiguous segment sums, a child's sums adds of whole rows) and updated in place.  The
    families that stopped stay in the working arrays (their result already written) until they
    hold a sixteenth of its children; then the arrays are compacted (into C-ordered copies, so
    that every sum runs in the same order whatever the other families)."""
    x = est.astype(np.float64, copy=True)
    n, C = x.shape
    if x.size == 0:
        return x
    n_par = parent_counts.shape[0]
    scale = np.maximum(1.0, np.abs(parent_counts).max(axis=1))
    kids = np.bincount(parents, minlength=n_par)
    fam = np.flatnonzero(kids > 0)
    fk = kids[fam]
    rows = np.arange(n)
    xa = np.ascontiguousarray(x.T)
    pa, qa, yb = np.zeros_like(xa), np.zeros_like(xa), np.empty_like(xa)
    iw = np.ascontiguousarray(1.0 / np.asarray(w, dtype=np.float64).T)
    tr = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(n, -1).T)
    tc = np.ascontiguousarray(parent_counts[fam].T, dtype=np.float64)
    act_c, act_r = np.zeros((C, n), dtype=bool), np.zeros((C, n), dtype=bool)
    A_c = A_r = None
    rsum, rspread = _row_group_sums(c2m)
    frozen = np.zeros(fam.size, dtype=bool)
    starts = np.concatenate(([0], np.cumsum(fk)))[:-1]

    def csum(a: np.ndarray) -> np.ndarray:
        return np.add.reduceat(a, starts, axis=1)

    def cspread(lam: np.ndarray) -> np.ndarray:
        return np.repeat(lam, fk, axis=1)

    for _ in range(max_iter):
        np.add(xa, pa, out=pa)  # z = x + p
        y, act_c, A_c = _newton_groups(pa, iw, tc, act_c, A_c, csum, cspread, yb)
        np.subtract(pa, y, out=pa)  # p = z - y
        np.add(y, qa, out=qa)  # z' = y + q
        xa, act_r, A_r = _newton_groups(qa, iw, tr, act_r, A_r, rsum, rspread, xa)
        np.subtract(qa, xa, out=qa)  # q = z' - x
        gap = np.maximum.reduceat(np.abs(np.subtract(xa, y, out=yb), out=yb), starts, axis=1).max(axis=0)
        done = (gap <= tol * scale[fam]) & ~frozen
        if not done.any():
            continue
        drow = np.repeat(done, fk)
        x[rows[drow]] = xa[:, drow].T
        frozen |= done
        if frozen.all():
            return x
        if 16 * int(fk[frozen].sum()) >= rows.size:  # compact: the stopped families leave the arrays
            keep = ~frozen
            kr = np.repeat(keep, fk)
            # C-ordered copies: ``a[:, idx]`` may come back Fortran-ordered, and numpy sums such an
            # array in another order (other bits: the result would depend on the other families)
            rows, fam, fk, frozen = rows[kr], fam[keep], fk[keep], frozen[keep]
            xa, pa, qa, iw, tr, act_c, act_r, A_r = (np.ascontiguousarray(a[:, kr]) for a in
                                                     (xa, pa, qa, iw, tr, act_c, act_r, A_r))
            tc, A_c = np.ascontiguousarray(tc[:, keep]), np.ascontiguousarray(A_c[:, keep])
            yb = np.empty((C, rows.size))
            starts = np.concatenate(([0], np.cumsum(fk)))[:-1]
    live = ~np.repeat(frozen, fk)
    x[rows[live]] = xa[:, live].T
    return x


def round_transport(x: np.ndarray, w: np.ndarray, parents: np.ndarray, parent_counts: np.ndarray, c2m: np.ndarray,
                    values: np.ndarray, window: int = 0, block: int = 1) -> np.ndarray:
    """2-D controlled rounding: the integer table with the parents' cells as column sums and
    ``values`` as grouped row sums that is closest to ``x`` in ``sum w (X - x)^2`` among the tables
    within ``window`` of ``x``'s floors and ceilings (``window=0``: each value to its floor or its
    ceiling).  One HiGHS linear program over unit segments per block of parents (consecutive
    parents up to about ``block`` values; the default 1: each parent alone): the bipartite
    constraint matrix is totally unimodular, so the solution is integral.  A block with no
    solution in the window is solved again with a wider one (``window + 1``, then ``+ 3``) before
    giving up.  Each parent alone is what makes a family's integers depend on its own values only
    (the same whole or subtree by subtree): where a family has tied optima the solver's choice
    among them -- and a widened window -- would otherwise depend on the families sharing its
    block.  Larger blocks are faster (the census districts' totals-first rounding: about 5.3 s in
    blocks of 2^16 values) but give that up."""
    n, C = x.shape
    out = np.empty((n, C), dtype=np.int64)
    counts = np.bincount(parents, minlength=parent_counts.shape[0])
    ptr = np.concatenate(([0], np.cumsum(counts)))
    has = np.flatnonzero(counts > 0)
    i = 0
    while i < has.size:  # blocks of consecutive parents (their children are consecutive)
        j = i + 1
        while j < has.size and (ptr[has[j] + 1] - ptr[has[i]]) * C <= block:
            j += 1
        ps = has[i:j]
        lo_c, hi_c = int(ptr[ps[0]]), int(ptr[ps[-1] + 1])
        local = parents[lo_c:hi_c] - ps[0]
        args = (x[lo_c:hi_c], w[lo_c:hi_c], local, parent_counts[ps[0]:ps[-1] + 1], c2m, values[lo_c:hi_c])
        for extra in (0, 1, 3):
            try:
                out[lo_c:hi_c] = _round_transport_block(*args, window=window + extra)
                break
            except InfeasibleConstraintsError:
                if extra == 3:
                    raise
        i = j
    return out


def snap_integral(x: np.ndarray) -> np.ndarray:
    """``x`` with every value within ``1e-9`` of an integer made that integer (a projection's
    rounding error), so that its floor and ceiling are the integer itself."""
    return np.where(np.abs(x - np.rint(x)) <= 1e-9, np.rint(x), x)


def unit_segments(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The unit steps of every value between its bounds ``lo <= hi`` (integer arrays of one shape):
    per step, the value's flat index and the step's lower end ``t`` (the step from ``t`` to ``t + 1``),
    the steps of a value consecutive and increasing -- the variables of a rounding's linear program,
    where a convex cost per step makes them fill in order."""
    seg = (hi - lo).ravel()
    entry = np.repeat(np.arange(seg.size), seg)
    t = lo.ravel()[entry] + (np.arange(entry.size) - np.repeat(np.cumsum(seg) - seg, seg))
    return entry, t


def _round_transport_block(x: np.ndarray, w: np.ndarray, parents: np.ndarray, parent_counts: np.ndarray,
                           c2m: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    from scipy.optimize import linprog

    n, C = x.shape
    xs = snap_integral(x)  # an integral value stays fixed unless widened
    lo = np.maximum(0.0, np.floor(xs) - window).astype(np.int64)
    hi = (np.ceil(xs) + window).astype(np.int64)
    entry, t = unit_segments(lo, hi)
    xv, wv = x.ravel()[entry], np.maximum(w.ravel()[entry], 1e-12)
    cost = wv * (2.0 * (t - xv) + 1.0)  # (t + 1 - x)^2 - (t - x)^2: increasing in t, convex
    unit, cell = entry // C, entry % C
    m = int(c2m.max()) + 1
    nrow = n * m
    ncol = parent_counts.shape[0] * C
    A = sp.csr_matrix((np.ones(entry.size), (unit * m + c2m[cell], np.arange(entry.size))), shape=(nrow, entry.size))
    B = sp.csr_matrix((np.ones(entry.size), (parents[unit] * C + cell, np.arange(entry.size))),
                      shape=(ncol, entry.size))
    lo_rows = np.bincount((np.arange(n)[:, None] * m + c2m[None, :]).ravel(), weights=lo.ravel(), minlength=nrow)
    lo_cols = np.bincount((parents[:, None] * C + np.arange(C)[None, :]).ravel(), weights=lo.ravel(),
                          minlength=ncol)
    keep = np.repeat(np.bincount(parents, minlength=parent_counts.shape[0]) > 0, C)
    b_eq = np.concatenate([values.ravel() - lo_rows, (parent_counts.ravel() - lo_cols)[keep]])
    if entry.size == 0:
        if np.any(b_eq != 0):
            raise InfeasibleConstraintsError("the controlled rounding has no solution in its window")
        return lo
    # HiGHS' presolve takes minutes on one large family (3,669 districts of a county x 16 cells:
    # 51 s) where the dual simplex alone takes 0.14 s.  The costs scaled to at most 1 (the same
    # argmin): with weights 1 / variance they are ~1e-3, where HiGHS' absolute dual feasibility
    # tolerance (1e-7) would accept a slightly suboptimal vertex; scaled, fewer iterations too
    top = float(np.abs(cost).max())
    res = linprog(cost / (top if top > 0 else 1.0), A_eq=sp.vstack([A, B[keep]], format="csr"), b_eq=b_eq,
                  bounds=(0.0, 1.0), method="highs-ds", options={"presolve": False})
    if res.status != 0:
        raise InfeasibleConstraintsError(f"the controlled rounding has no solution within {window} of the estimate "
                                         f"({res.message})")
    s = res.x
    if np.any(np.abs(s - np.round(s)) > 1e-6):  # pragma: no cover - a vertex of a TU system is integral
        raise SparseDPError("the controlled rounding's solution is not integral")
    X = lo.ravel() + np.bincount(entry, weights=np.round(s), minlength=n * C).astype(np.int64)
    return X.reshape(n, C)
