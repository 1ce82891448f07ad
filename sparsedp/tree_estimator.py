"""O(n) best linear unbiased estimate on a hierarchical (tree) strategy: the two-pass method.

Measurements ``y_u = x(I_u) + z_u`` for every tree node ``u`` (``x(I_u)`` the sum of the leaves below
``u``), independent noise of variance ``v_u``.  The generalised least-squares estimate (the BLUE)
is computed in two passes over the levels, generalising Hay, Rastogi, Miklau and Suciu (VLDB 2010)
from equal to per-node variances:

* upward: the best estimate of ``x(I_u)`` from the subtree of ``u`` combines ``u``'s own
  measurement with the sum of its children's subtree estimates, by inverse-variance weighting:
  ``z_u = (y_u / v_u + Z_u / V_u) / (1 / v_u + 1 / V_u)`` with ``Z_u = sum_c z_c``,
  ``V_u = sum_c var(z_c)`` and ``var(z_u) = 1 / (1 / v_u + 1 / V_u)`` (leaves: ``z = y``).
* downward: the root keeps ``xhat = z``; a parent's discrepancy ``xhat_u - Z_u`` is split among its
  children in proportion to ``var(z_c)``: ``xhat_c = z_c + var(z_c) / V_u (xhat_u - Z_u)``.

Each pass is one vectorised step per level (a reshape on balanced k-ary levels, else
``reduceat``/``repeat``), so the cost is ``O(nodes)``; the input may be a matrix (one column per
right-hand side).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .strategies import TreeLayout

__all__ = [
    "LevelPlan",
    "two_pass",
    "two_pass_plan",
    "layout_plan",
    "bfs_order",
    "tree_gls",
    "tree_impulse_norms",
    "ImpulseNorms",
    "upward_variances",
]


@dataclass(frozen=True)
class LevelPlan:
    """How the children of one depth attach to their parents (one step of :func:`two_pass`).

    Children are the nodes ``lo:hi``; ``parents`` are their parents' indices (a slice when every
    node of the parent depth has children), ``starts`` the first child of each parent relative to
    ``lo`` and ``counts`` the group sizes.  When every group but the last has ``k`` children (a
    balanced k-ary level; BFS order makes the groups consecutive), ``k > 0`` and the first ``full``
    groups are handled as a ``(full, k)`` reshape instead of index gathers and scatters.
    """

    lo: int
    hi: int
    parents: slice | np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    k: int
    full: int

    def sum(self, a: np.ndarray) -> np.ndarray:
        """Per parent, the sum of its children's rows of ``a`` (``a`` = the children's rows)."""
        if not self.k:
            return np.add.reduceat(a, self.starts, axis=0)
        m = self.full * self.k
        out = np.empty((self.counts.size,) + a.shape[1:], dtype=np.result_type(a, np.float64))
        _group_sum(a[:m], self.k, out[: self.full])
        if self.full < self.counts.size:
            out[self.full] = a[m:].sum(axis=0)
        return out

    def sum_range(self, a: np.ndarray, i0: int, i1: int, absolute: bool = False) -> np.ndarray:
        """:meth:`sum` for the parents ``i0 : i1`` only (``a`` = all the children's rows); with
        ``absolute``, of the children's absolute values."""
        size = self.counts.size
        c0 = int(self.starts[i0])
        c1 = int(self.starts[i1]) if i1 < size else self.hi - self.lo
        seg = np.abs(a[c0:c1]) if absolute else a[c0:c1]
        if self.k and i1 <= self.full:
            return _group_sum(seg, self.k, np.empty((i1 - i0,) + a.shape[1:]))
        return np.add.reduceat(seg, self.starts[i0:i1] - c0, axis=0)

    def parent_rows(self, a: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """Rows of ``a`` (all nodes) of the parents ``i0 : i1``."""
        if isinstance(self.parents, slice):
            return a[self.parents.start + i0 : self.parents.start + i1]
        return a[self.parents[i0:i1]]

    def add_spread(self, out: np.ndarray, share: np.ndarray, a: np.ndarray) -> None:
        """``out[child] += share[child] * a[parent of child]`` (``out`` = the children's rows)."""
        if not self.k:
            out += _bcast(share, out) * np.repeat(a, self.counts, axis=0)
            return
        m = self.full * self.k
        head = out[:m].reshape((self.full, self.k) + out.shape[1:])
        head += _bcast(share[:m].reshape((self.full, self.k) + share.shape[1:]), head) * a[: self.full, None]
        if self.full < self.counts.size:
            out[m:] += _bcast(share[m:], out[m:]) * a[self.full]

    def spread(self, a: np.ndarray) -> np.ndarray:
        """Each parent's row of ``a`` repeated for each of its children."""
        if self.k and self.full == self.counts.size:
            return np.repeat(a, self.k, axis=0)
        return np.repeat(a, self.counts, axis=0)


def _group_sum(a: np.ndarray, k: int, out: np.ndarray) -> np.ndarray:
    """``out[g] = a[g k] + ... + a[g k + k - 1]`` (consecutive groups of ``k`` rows), left to right."""
    head = a.reshape((out.shape[0], k) + a.shape[1:])
    if k == 1:
        np.copyto(out, head[:, 0])
    else:
        np.add(head[:, 0], head[:, 1], out=out)
        for j in range(2, k):
            out += head[:, j]
    return out


def _bcast(w: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``w`` with trailing axes added to broadcast against ``like``."""
    return w.reshape(w.shape + (1,) * (like.ndim - w.ndim))


def two_pass_plan(parent: np.ndarray, level_start: np.ndarray) -> tuple[LevelPlan, ...]:
    """The per-depth plans of a breadth-first tree (deepest parent depth first), for :func:`two_pass`.

    Depends only on the shape; compute it once and pass it to every :func:`two_pass` call.
    """
    plans = []
    levels = len(level_start) - 1
    for d in range(levels - 2, -1, -1):
        lo, hi = int(level_start[d + 1]), int(level_start[d + 2])
        par = parent[lo:hi]
        starts = np.flatnonzero(np.concatenate(([True], par[1:] != par[:-1])))
        inner = par[starts]  # the nodes of depth d that have children, in increasing order
        counts = np.diff(np.append(starts, hi - lo))
        whole = inner.size == level_start[d + 1] - level_start[d]
        idx: slice | np.ndarray = slice(int(level_start[d]), int(level_start[d + 1])) if whole else inner
        k, full = 0, 0
        if whole and counts.size:
            k = int(counts[0])
            full = counts.size if counts[-1] == k else counts.size - 1
            if not (np.all(counts[:full] == k) and counts[-1] <= k):
                k, full = 0, 0
        plans.append(LevelPlan(lo, hi, idx, starts, counts, k, full))
    return tuple(plans)


def layout_plan(layout: TreeLayout) -> tuple[LevelPlan, ...]:
    """:func:`two_pass_plan` of a layout's breadth-first form, cached on the layout."""
    if "two_pass_plan" not in layout._cache:
        layout._cache["two_pass_plan"] = two_pass_plan(*layout.bfs())
    return layout._cache["two_pass_plan"]


def two_pass(
    parent: np.ndarray,
    level_start: np.ndarray,
    y: np.ndarray,
    variances: np.ndarray,
    plan: tuple[LevelPlan, ...] | None = None,
    overwrite: bool = False,
) -> np.ndarray:
    """Consistent GLS estimates of every node of a tree (or forest) of any shape.

    Nodes are in breadth-first order: depth ``d`` is ``level_start[d] : level_start[d + 1]``, the
    children of a node are contiguous and in the order of their parents, ``parent[i]`` is the index
    of ``i``'s parent (``-1`` for a root).  ``y`` (shape ``(nodes,)`` or ``(nodes, k)``) are the node
    measurements with variances ``variances`` (all > 0; shape ``(nodes,)`` or that of ``y``).
    Returns the node estimates (same shape as ``y``); every parent equals the sum of its children.
    Leaves may lie at any depth.  One vectorised step per depth each way (see the module
    docstring); ``plan`` (from :func:`two_pass_plan`) skips recomputing the tree's shape, and
    balanced levels run as reshapes.  ``overwrite=True`` lets it reuse ``y`` (a float64 array the
    caller no longer needs) as work space and for the result instead of copying it.
    """
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)  # (nodes,) or the shape of y
    extra = (slice(None),) + (None,) * (y.ndim - v.ndim)
    plans = two_pass_plan(parent, level_start) if plan is None else plan
    own_y = overwrite and isinstance(y, np.ndarray) and y.flags.writeable
    z = y if own_y else y.copy()
    var = v.copy()
    inner = int(level_start[-2]) if len(level_start) > 1 else 0  # nodes of the deepest depth have no children
    Z = np.empty((inner,) + y.shape[1:])
    V = np.empty((inner,) + v.shape[1:])
    for lp in plans:  # upward, deepest parents first
        idx = lp.parents
        Zi = lp.sum(z[lp.lo : lp.hi])
        Vi = lp.sum(var[lp.lo : lp.hi])
        vari = 1.0 / (1.0 / v[idx] + 1.0 / Vi)
        own = vari / v[idx]  # weight of the node's own measurement
        Z[idx], V[idx], var[idx] = Zi, Vi, vari
        z[idx] = y[idx] * own[extra] + Zi * (1.0 - own)[extra]
    # downward, in place: the parents' z is final when their children are computed; roots keep z
    for lp in reversed(plans):
        idx = lp.parents
        sl = slice(lp.lo, lp.hi)
        lp.add_spread(z[sl], var[sl] / lp.spread(V[idx]), z[idx] - Z[idx])
    return z


def bfs_order(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A breadth-first numbering of a forest given by any parent array (``-1`` = root).

    Returns ``(perm, bfs_parent, level_start)``: node ``perm[i]`` becomes node ``i``, children of one
    parent are contiguous, ``bfs_parent`` and ``level_start`` are as :func:`two_pass` wants them.
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = parent.size
    frontier = np.flatnonzero(parent < 0)
    kids_of = np.argsort(parent, kind="stable")  # the roots first, then children grouped by parent
    counts = np.bincount(parent[parent >= 0], minlength=n)
    first = np.concatenate(([0], np.cumsum(counts)))[:-1] + frontier.size
    layers = []
    while frontier.size:
        layers.append(frontier)
        sizes = counts[frontier]
        total = int(sizes.sum())
        if not total:
            break
        offsets = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        frontier = kids_of[np.repeat(first[frontier], sizes) + offsets]
    perm = np.concatenate(layers) if layers else np.zeros(0, dtype=np.int64)
    if perm.size != n:
        raise ValueError("the parent array is not a forest (it has a cycle)")
    inv = np.empty(n, dtype=np.int64)
    inv[perm] = np.arange(n)
    p = parent[perm]
    bfs_parent = np.where(p >= 0, inv[np.maximum(p, 0)], -1)
    level_start = np.concatenate(([0], np.cumsum([layer.size for layer in layers])))
    return perm, bfs_parent, level_start


def tree_gls(layout: TreeLayout, y: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """GLS leaf estimates from node measurements ``y`` (rows ordered root first, as the strategy).

    ``y`` has shape ``(nodes,)`` or ``(nodes, k)``; ``variances`` shape ``(nodes,)``, all > 0.
    Returns the ``n`` leaf estimates (shape ``(n,)`` or ``(n, k)``).
    """
    parent, level_start = layout.bfs()
    nodes = two_pass(parent, level_start, y, variances, plan=layout_plan(layout))
    return layout.level_rows(nodes, 0)


def upward_variances(layout: TreeLayout, v: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per level: ``var(z_u)`` of the upward estimates, and ``V_u = sum_c var(z_c)`` over the
    children (an empty array at the leaf level)."""
    var_z = [layout.level_rows(v, 0)]
    V: list[np.ndarray] = [np.empty(0)]
    for lev in range(1, layout.levels):
        Vc = np.add.reduceat(var_z[-1], layout.child_starts[lev - 1][:-1])
        var_z.append(1.0 / (1.0 / layout.level_rows(v, lev) + 1.0 / Vc))
        V.append(Vc)
    return var_z, V


def _group_exclusive_cumsum(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Within each sibling group (``starts`` = child_starts), the sum of the earlier siblings."""
    cs = np.cumsum(a)
    before = np.concatenate(([0.0], cs))[starts[:-1]]
    return cs - a - np.repeat(before, np.diff(starts))


def tree_impulse_norms(layout: TreeLayout, variances: np.ndarray, workload: str) -> np.ndarray:
    """``||W G e_u||^2`` for every node ``u``, ``G`` the two-pass GLS estimator, in ``O(n log n)``.

    ``workload`` is ``"prefix"``, ``"all_ranges"``, ``"identity"`` or ``"total"``.  Returned in
    strategy row order (root first).  With them the expected error is ``sum_u v_u ||W G e_u||^2``.

    Derivation.  An impulse at node ``i`` changes the upward estimates only on the path root -> i:
    ``dz_i = var(z_i) / v_i`` and ``dz_a = var(z_a) / V_a * dz_b`` for a parent ``a`` of ``b``.  The
    downward pass then gives each off-path child ``c`` of a path node ``u`` the estimate
    ``share_c d_u`` (``d_u = xhat_u - dz_b``, ``share_c = var(z_c) / V_u``), spread over its leaves by
    the fixed profile ``rho_c`` (the products of shares down to each leaf; it sums to 1), and node
    ``i`` itself ``xhat_i rho_i``.  So the leaf response is a sum of scaled profiles over blocks that
    tile the leaves, and the running sums are affine in each block: with per-node profile moments
    ``S1_c = sum cumsum(rho_c)``, ``S2_c = sum cumsum(rho_c)^2``, ``Q_c = sum rho_c^2`` (computed
    bottom-up) and per-child suffix sums over later siblings, each path step costs ``O(1)``.
    Computed by :class:`ImpulseNorms`, which keeps the layout-only work for repeated calls.
    """
    return ImpulseNorms(layout, workload)(variances)


class ImpulseNorms:
    """``v -> ||W G e_u||^2`` (strategy row order) for one layout and workload
    (``"prefix"``, ``"all_ranges"``, ``"identity"`` or ``"total"``)."""

    def __init__(self, layout: TreeLayout, workload: str):
        if workload not in ("prefix", "all_ranges", "identity", "total"):
            raise ValueError(f"unsupported workload {workload!r}")
        self.layout = layout
        self.workload = workload
        L = layout.levels
        self.counts = [np.diff(layout.child_starts[lev]) for lev in range(L - 1)]
        self.parent = [np.repeat(np.arange(layout.sizes[lev + 1]), self.counts[lev]) for lev in range(L - 1)]
        # ancestors of every level-lev node at each level above, and whether that level is uniform
        self.anc: list[dict[int, np.ndarray]] = []
        self.uniform: list[dict[int, int]] = []  # level a -> block size m (0: not uniform)
        for lev in range(L):
            anc = {lev: np.arange(layout.sizes[lev])}
            uni = {lev: 1}
            for up in range(lev, L - 1):
                anc[up + 1] = self.parent[up][anc[up]]
                sizes = np.bincount(anc[up + 1], minlength=layout.sizes[up + 1])
                uni[up + 1] = int(sizes[0]) if sizes.size and np.all(sizes == sizes[0]) else 0
            self.anc.append(anc)
            self.uniform.append(uni)

    def _per_level(self, v: np.ndarray):
        """Per-level arrays of one evaluation: upward variances, shares, profile moments and the
        combined per-node step coefficients."""
        lay = self.layout
        L = lay.levels
        var_z, V = upward_variances(lay, v)
        share = [var_z[lev] / V[lev + 1][self.parent[lev]] for lev in range(L - 1)]
        F = [_group_exclusive_cumsum(share[lev], lay.child_starts[lev]) for lev in range(L - 1)]
        length = [np.ones(lay.sizes[0])]
        S1, S2, Q = [np.ones(lay.sizes[0])], [np.ones(lay.sizes[0])], [np.ones(lay.sizes[0])]
        coef = []
        for lev in range(L - 1):
            f, Fm, ln = share[lev], F[lev], length[lev]
            t = {
                "len": ln,
                "lenF": ln * Fm,
                "lenF2": ln * Fm * Fm,
                "fS1": f * S1[lev],
                "fS1F": f * S1[lev] * Fm,
                "f2S2": f * f * S2[lev],
                "f2Q": f * f * Q[lev],
            }
            starts = lay.child_starts[lev]
            T = {k: np.add.reduceat(a, starts[:-1]) for k, a in t.items()}
            length.append(T["len"])
            S1.append(T["lenF"] + T["fS1"])
            S2.append(T["lenF2"] + 2 * T["fS1F"] + T["f2S2"])
            Q.append(T["f2Q"])
            par = self.parent[lev]
            A = {k: T[k][par] - t[k] for k in t}  # the parent's group without the node itself
            R = {k: np.repeat(T[k], self.counts[lev]) - _group_exclusive_cumsum(t[k], starts) - t[k] for k in ("len", "lenF", "fS1")}
            coef.append(
                {
                    "c1": A["len"],
                    "c2": A["lenF"] + A["fS1"],
                    "c3": A["lenF2"] + 2 * A["fS1F"] + A["f2S2"],
                    "cq": A["f2Q"],
                    "r1": R["len"],
                    "r2": R["lenF"] + R["fS1"],
                    "F": F[lev],
                    "share": share[lev],
                }
            )
        return var_z, V, length, S1, S2, Q, coef

    def __call__(self, variances: np.ndarray) -> np.ndarray:
        lay = self.layout
        v = np.asarray(variances, dtype=np.float64)
        L = lay.levels
        var_z, V, length, S1, S2, Q, coef = self._per_level(v)
        ratio = [np.empty(0)] + [var_z[up] / V[up] for up in range(1, L)]
        out = np.empty(lay.nodes)
        need_s1 = self.workload == "all_ranges"
        need_sq = self.workload == "identity"
        for lev in range(L):
            anc, uni = self.anc[lev], self.uniform[lev]
            N = lay.sizes[lev]

            def spread(c: np.ndarray, a: int, uni: dict = uni, anc: dict = anc) -> np.ndarray:
                """Per-ancestor (level ``a``) values for every impulse node."""
                m = uni[a]
                return np.repeat(c, m) if m else c[anc[a]]

            dz = {lev: var_z[lev] / lay.level_rows(v, lev)}
            for up in range(lev + 1, L):
                dz[up] = spread(ratio[up], up) * dz[up - 1]
            if self.workload == "total":
                res = dz[L - 1] ** 2
                out[lay.row_offsets[lev] : lay.row_offsets[lev] + N] = res
                continue
            off = np.zeros(N)
            xh = dz[L - 1].copy()
            s2 = np.zeros(N)
            s1 = np.zeros(N) if need_s1 else None
            sq = np.zeros(N) if need_sq else None
            for down in range(L - 1, lev, -1):
                a = down - 1
                c = coef[a]
                delta = dz[a]
                d = xh - delta
                if need_sq:
                    sq += d * d * spread(c["cq"], a)
                else:
                    c1, c2, c3 = spread(c["c1"], a), spread(c["c2"], a), spread(c["c3"], a)
                    r1, r2 = spread(c["r1"], a), spread(c["r2"], a)
                    od = off * d
                    s2 += off * off * c1 + 2.0 * od * c2 + d * d * c3 + delta * (delta * r1 + 2.0 * off * r1 + 2.0 * d * r2)
                    if need_s1:
                        s1 += off * c1 + d * c2 + delta * r1
                off += d * spread(c["F"], a)
                xh = delta + spread(c["share"], a) * d
            if need_sq:
                res = sq + xh * xh * Q[lev]
            else:
                ln, m1, m2 = length[lev], S1[lev], S2[lev]
                s2 += ln * off * off + 2.0 * off * xh * m1 + xh * xh * m2
                if need_s1:
                    s1 += ln * off + xh * m1
                    res = (lay.n + 1) * s2 - s1 * s1
                else:
                    res = s2
            out[lay.row_offsets[lev] : lay.row_offsets[lev] + N] = res
        return out
