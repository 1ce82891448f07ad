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

Each pass is one vectorised ``reduceat``/``repeat`` per level, so the cost is ``O(nodes)``; the
input may be a matrix (one column per right-hand side).
"""

from __future__ import annotations

import numpy as np

from .strategies import TreeLayout

__all__ = ["two_pass", "bfs_order", "tree_gls", "tree_impulse_norms", "upward_variances"]


def two_pass(parent: np.ndarray, level_start: np.ndarray, y: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """Consistent GLS estimates of every node of a tree (or forest) of any shape.

    Nodes are in breadth-first order: depth ``d`` is ``level_start[d] : level_start[d + 1]``, the
    children of a node are contiguous and in the order of their parents, ``parent[i]`` is the index
    of ``i``'s parent (``-1`` for a root).  ``y`` (shape ``(nodes,)`` or ``(nodes, k)``) are the node
    measurements with variances ``variances`` (all > 0).  Returns the node estimates (same shape as
    ``y``); every parent equals the sum of its children.  Leaves may lie at any depth.  One
    vectorised step per depth each way (see the module docstring).
    """
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)  # (nodes,) or the shape of y
    extra = (slice(None),) + (None,) * (y.ndim - v.ndim)
    levels = len(level_start) - 1
    z = y.copy()
    var = v.copy()
    Z = np.zeros_like(y)
    V = np.zeros_like(v)
    groups: list[tuple[np.ndarray, slice | np.ndarray]] = []  # per depth d >= 1: child group sizes, parents
    for d in range(levels - 2, -1, -1):
        lo, hi = level_start[d + 1], level_start[d + 2]
        par = parent[lo:hi]
        starts = np.flatnonzero(np.concatenate(([True], par[1:] != par[:-1])))
        inner = par[starts]  # the nodes of depth d that have children, in increasing order
        # a whole level of parents is a slice: faster than fancy indexing on large 2-D arrays
        idx: slice | np.ndarray = slice(level_start[d], level_start[d + 1]) if inner.size == level_start[d + 1] - level_start[d] else inner
        Zi = np.add.reduceat(z[lo:hi], starts, axis=0)
        Vi = np.add.reduceat(var[lo:hi], starts, axis=0)
        vari = 1.0 / (1.0 / v[idx] + 1.0 / Vi)
        own = vari / v[idx]  # weight of the node's own measurement
        Z[idx], V[idx], var[idx] = Zi, Vi, vari
        z[idx] = y[idx] * own[extra] + Zi * (1.0 - own)[extra]
        groups.append((np.diff(np.append(starts, hi - lo)), idx))
    # downward, in place: z of depth d - 1 is final when depth d is computed; roots keep z
    for d, (counts, idx) in zip(range(1, levels), reversed(groups)):
        sl = slice(level_start[d], level_start[d + 1])
        share = var[sl] / np.repeat(V[idx], counts, axis=0)
        z[sl] += share[extra] * np.repeat(z[idx] - Z[idx], counts, axis=0)
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
    nodes = two_pass(parent, level_start, y, variances)
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


def _parents(layout: TreeLayout, lev: int) -> np.ndarray:
    """Index (in level ``lev + 1``) of the parent of every node of level ``lev``."""
    return np.repeat(np.arange(layout.sizes[lev + 1]), np.diff(layout.child_starts[lev]))


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
    """
    if workload not in ("prefix", "all_ranges", "identity", "total"):
        raise ValueError(f"unsupported workload {workload!r}")
    v = np.asarray(variances, dtype=np.float64)
    L = layout.levels
    var_z, V = upward_variances(layout, v)
    parent = [_parents(layout, lev) for lev in range(L - 1)]
    share = [var_z[lev] / V[lev + 1][parent[lev]] for lev in range(L - 1)]
    # cumulative share of earlier siblings, F_{j-1}
    F = [_group_exclusive_cumsum(share[lev], layout.child_starts[lev]) for lev in range(L - 1)]
    # profile moments bottom-up
    length = [np.ones(layout.sizes[0])]
    S1, S2, Q = [np.ones(layout.sizes[0])], [np.ones(layout.sizes[0])], [np.ones(layout.sizes[0])]
    t: list[dict[str, np.ndarray]] = []
    for lev in range(L - 1):
        f, Fm, ln = share[lev], F[lev], length[lev]
        terms = {
            "len": ln,
            "lenF": ln * Fm,
            "lenF2": ln * Fm * Fm,
            "fS1": f * S1[lev],
            "fS1F": f * S1[lev] * Fm,
            "f2S2": f * f * S2[lev],
            "f2Q": f * f * Q[lev],
        }
        t.append(terms)
        starts = layout.child_starts[lev][:-1]
        total = {k: np.add.reduceat(a, starts) for k, a in terms.items()}
        length.append(total["len"])
        S1.append(total["lenF"] + total["fS1"])
        S2.append(total["lenF2"] + 2 * total["fS1F"] + total["f2S2"])
        Q.append(total["f2Q"])
    # group totals and suffix sums over later siblings, per child
    T, R = [], []
    for lev in range(L - 1):
        starts = layout.child_starts[lev]
        counts = np.diff(starts)
        Tl = {k: np.add.reduceat(a, starts[:-1]) for k, a in t[lev].items()}
        # later siblings = group total - earlier siblings - self
        Rl = {k: np.repeat(Tl[k], counts) - _group_exclusive_cumsum(a, starts) - a for k, a in t[lev].items()}
        T.append(Tl)
        R.append(Rl)

    out = np.empty(layout.nodes)
    for lev in range(L):
        idx = np.arange(layout.sizes[lev])
        anc = {lev: idx}
        for up in range(lev, L - 1):
            anc[up + 1] = parent[up][anc[up]]
        dz = {lev: var_z[lev] / layout.level_rows(v, lev)}
        for up in range(lev + 1, L):
            a = anc[up]
            dz[up] = var_z[up][a] / V[up][a] * dz[up - 1]
        off = np.zeros(idx.size)
        xh = dz[L - 1]
        s1 = np.zeros(idx.size)  # sum of running sums
        s2 = np.zeros(idx.size)  # sum of squared running sums
        sq = np.zeros(idx.size)  # sum of squared leaf values
        for down in range(L - 1, lev, -1):
            u, b = anc[down], anc[down - 1]
            d = xh - dz[down - 1]
            Tu, tb, Rb = T[down - 1], t[down - 1], R[down - 1]
            A = {k: Tu[k][u] - tb[k][b] for k in ("len", "lenF", "lenF2", "fS1", "fS1F", "f2S2", "f2Q")}
            Rlen, RlenF, RfS1 = Rb["len"][b], Rb["lenF"][b], Rb["fS1"][b]
            delta = dz[down - 1]
            s2 += (
                off * off * A["len"]
                + 2 * off * d * (A["lenF"] + A["fS1"])
                + d * d * (A["lenF2"] + 2 * A["fS1F"] + A["f2S2"])
                + delta * delta * Rlen
                + 2 * off * delta * Rlen
                + 2 * d * delta * (RlenF + RfS1)
            )
            s1 += off * A["len"] + d * (A["lenF"] + A["fS1"]) + delta * Rlen
            sq += d * d * A["f2Q"]
            off = off + d * F[down - 1][b]
            xh = delta + share[down - 1][b] * d
        ln, m1, m2, q = length[lev], S1[lev], S2[lev], Q[lev]
        s2 += ln * off * off + 2 * off * xh * m1 + xh * xh * m2
        s1 += ln * off + xh * m1
        sq += xh * xh * q
        if workload == "prefix":
            res = s2
        elif workload == "all_ranges":
            res = (layout.n + 1) * s2 - s1 * s1
        elif workload == "identity":
            res = sq
        else:
            res = dz[L - 1] ** 2
        out[layout.row_offsets[lev] : layout.row_offsets[lev] + layout.sizes[lev]] = res
    return out
