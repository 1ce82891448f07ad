"""Exact variance of every GLS workload answer for structured strategies, in bounded memory.

For measurements ``y = M x + z`` with independent noise ``Var(z_i) = v_i`` and the estimate
``x_hat = G y`` that :mod:`sparsedp.inference` computes (the GLS estimate, ``G = M^-1`` for a
square strategy), a linear query ``q`` is answered with variance

    Var(q^T x_hat) = sum_i v_i (G^T q)_i^2 = q^T (M^T V^-1 M)^-1 q.

The covariance is never formed; each strategy kind gives it in closed form, exactly (in floating
point) and in ``O(levels)`` work per range query:

* **tree** (hierarchical, any per-node variances; seed 004 / Hay et al. 2010).  With a flat prior
  and Gaussian noise of the same variances the GLS estimate is the posterior mean and ``C`` the
  posterior covariance, so ``q^T C q`` follows from the posterior's tree structure.  The upward
  pass gives each node ``u`` the variance ``s_u = var(z_u)`` of its subtree-only estimate and
  ``S_u = sum_c s_c`` over its children.  Given the node total ``h_u``, the children are
  ``h_c = z_c + (s_c / S_u)(h_u - Z_u) + e``, ``Cov(e) = diag(s) - s s^T / S_u``, independent of
  the rest of the tree.  For the part ``R_u`` of a query inside ``u``'s subtree write
  ``E[R_u | h_u] = alpha_u h_u + const`` and ``gamma_u = Var(R_u | h_u)``; by the law of total
  variance

      alpha_u = sum_c alpha_c s_c / S_u,
      gamma_u = sum_c gamma_c + sum_c alpha_c^2 s_c - (sum_c alpha_c s_c)^2 / S_u,

  and ``Var(q^T x_hat) = gamma_root + alpha_root^2 s_root``.  Leaves have ``alpha = q_j``,
  ``gamma = 0``; a node wholly inside a range has ``alpha = 1, gamma = 0`` and one wholly outside
  ``0, 0``.  So a range ``[a, b]`` needs the recursion only on the two boundary paths (leaf ``a``
  and leaf ``b`` up to the root), the full siblings entering through within-group prefix sums of
  ``s``: ``O(levels)`` per query after an ``O(nodes)`` upward pass.  A sparse query runs the same
  recursion on the union of its leaves' ancestors (``O(nnz levels)``), a dense one bottom-up
  (``O(nodes)``).
* **fenwick** (seed 000): ``x_hat = M^-1 y`` has node sums equal to ``y``, so the prefix
  ``P(t) = x_hat[0] + ... + x_hat[t-1]`` is the Fenwick query ``sum_{i in dec(t)} y_i`` with
  ``dec(t)`` the nodes ``t`` with its bits below each set bit ``j`` cleared; a range ``[a, e)`` is
  ``P(e) - P(a)`` and nodes common to both decompositions cancel:
  ``Var = sum_j [bit j of a] v_{a_j} + [bit j of e] v_{e_j} - 2 [a_j = e_j] v_{a_j}``.
* **haar** (Privelet): ``G = M^T diag(1 / r)`` (``r_i = ||m_i||^2``), so ``P(t)`` has coefficient
  ``(sum_{j < t} M_ij) / r_i`` on row ``i``: non-zero for the total and for the splits strictly
  containing ``t`` (one chain in the split tree, ``<= ceil(log2 n)`` rows), found by descending.
* **identity**: ``Var = sum_{j=a}^{b} v_j`` (prefix sums of ``v``).

Weighted strategies ``diag(w) M`` use ``M`` with variances ``v / w^2`` (as the estimator does).
Everything is batched so that peak memory is ``O(nodes + batch levels)``; every entry point first
estimates what it will allocate and raises :class:`MemoryLimitError` instead of exceeding
``memory_limit``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

from .errors import SparseDPError
from .operators import Operator, SparseOperator
from .strategies import TreeLayout, fenwick_inverse
from .tree_estimator import upward_variances

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "IntervalTreeCovariance",
    "MemoryLimitError",
    "StructuredCovariance",
    "check_memory",
    "format_bytes",
]

#: Default bound (bytes) on what an error computation may allocate: 4 GB.
DEFAULT_MEMORY_LIMIT: float = 4e9

_BATCH = 1 << 17  # queries per vectorised batch


class MemoryLimitError(SparseDPError):
    """An accuracy computation would need more memory than ``memory_limit`` allows.  Nothing was
    allocated; the message says how much it needs."""


def format_bytes(b: float) -> str:
    """``1.5 GiB``-style size."""
    for unit, size in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def check_memory(needed: float, limit: float, what: str) -> None:
    """Raise :class:`MemoryLimitError` if ``needed`` bytes exceed ``limit``."""
    if needed > limit:
        raise MemoryLimitError(
            f"{what} needs about {format_bytes(needed)}, more than memory_limit = {format_bytes(limit)}; "
            "raise memory_limit, use a structured strategy (hierarchical, fenwick, haar, identity), "
            "or method='estimate' with fewer probes"
        )


def _batches(total: int, size: int) -> Iterator[slice]:
    for start in range(0, total, size):
        yield slice(start, min(start + size, total))


def _row_blocks(W: sp.csr_matrix, cost: np.ndarray, budget: float) -> Iterator[slice]:
    """Consecutive row blocks of ``W`` whose summed ``cost`` (per row) stays within ``budget``."""
    acc = np.cumsum(cost)
    start, m = 0, W.shape[0]
    while start < m:
        base = acc[start - 1] if start else 0.0
        stop = int(np.searchsorted(acc, base + budget, side="right"))
        stop = min(max(stop, start + 1), m)
        yield slice(start, stop)
        start = stop


class StructuredCovariance:
    """``Var(q^T x_hat)`` for the estimator of one structured strategy (see the module docstring).

    ``ranges(a, e)``: half-open leaf ranges ``[a, e)``; ``rows(W)``: every row of a sparse matrix;
    ``functional(q)``: one dense vector.  ``memory(queries)`` estimates the bytes a call on that
    many range queries allocates beyond the strategy itself.
    """

    kind = "structured"
    n: int

    def ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64)
        e = np.asarray(e, dtype=np.int64)
        out = np.empty(a.size)
        for sl in _batches(a.size, _BATCH):
            out[sl] = self._ranges(a[sl], e[sl])
        return out

    def prefix(self) -> np.ndarray:
        """``Var(P(t))`` for ``t = 1 .. n`` (the prefix workload), in batches."""
        out = np.empty(self.n)
        for sl in _batches(self.n, _BATCH):
            t = np.arange(sl.start + 1, sl.stop + 1, dtype=np.int64)
            out[sl] = self._ranges(np.zeros_like(t), t)
        return out

    def memory(self, queries: int) -> float:
        return 8.0 * (self._fixed() + 40 * min(queries, _BATCH) + queries)

    def _fixed(self) -> float:  # 8-byte words held beyond the inputs
        return 0.0

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def functional(self, q: np.ndarray) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


# -- trees ---------------------------------------------------------------------------------------


def _sibling_prefix(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Within each sibling group (``starts`` = child_starts), the sum of ``a`` over the earlier
    siblings; balanced k-ary levels by a reshape (sums stay within the group: no cancellation)."""
    counts = np.diff(starts)
    out = np.empty_like(a)
    k = int(counts[0]) if counts.size else 0
    if k and np.all(counts[:-1] == k) and counts[-1] <= k:
        full = counts.size if counts[-1] == k else counts.size - 1
        head = a[: full * k].reshape(full, k)
        oh = out[: full * k].reshape(full, k)
        oh[:, 0] = 0.0
        np.cumsum(head[:, :-1], axis=1, out=oh[:, 1:])
        tail = a[full * k :]
        if tail.size:
            out[full * k] = 0.0
            np.cumsum(tail[:-1], out=out[full * k + 1 :])
        return out
    cs = np.cumsum(a)
    before = np.concatenate(([0.0], cs))[starts[:-1]]
    return cs - a - np.repeat(before, counts)


def _uniform_groups(starts: np.ndarray) -> int:
    """``k`` if every sibling group but the last has ``k`` members (so parent = index // k)."""
    counts = np.diff(starts)
    k = int(counts[0]) if counts.size else 0
    return k if k and np.all(counts[:-1] == k) and counts[-1] <= k else 0


class TreeCovariance(StructuredCovariance):
    """Covariance of the two-pass GLS leaf estimate of a :class:`TreeLayout` with per-node
    variances ``v`` (strategy row order, root first)."""

    kind = "tree"

    def __init__(self, layout: TreeLayout, v: np.ndarray):
        self.layout = layout
        self.n = layout.n
        self.levels = layout.levels
        s, S = upward_variances(layout, np.asarray(v, dtype=np.float64))
        self.s = s  # per level: var(z_u) of the subtree-only estimate
        self.S = S  # per level: sum of the children's s (empty at the leaves)
        self.pre = [_sibling_prefix(s[lev], layout.child_starts[lev]) for lev in range(self.levels - 1)]
        self.k = [_uniform_groups(layout.child_starts[lev]) for lev in range(self.levels - 1)]

    def _fixed(self) -> float:
        return 3.0 * self.layout.nodes

    def _parent(self, lev: int, idx: np.ndarray) -> np.ndarray:
        k = self.k[lev]
        if k:
            return idx // k
        return np.searchsorted(self.layout.child_starts[lev], idx, side="right") - 1

    def prefix(self) -> np.ndarray:
        """``Var(P(t))``, ``t = 1 .. n``.  With ``a = 0`` the left boundary is always a whole node,
        so one state suffices: ``t = alpha s_B + pre_B``, ``gamma += alpha^2 s_B + pre_B - t^2 / S``,
        ``alpha = t / S`` (``pre = 0`` above the meeting point, where ``B`` is leftmost)."""
        out = np.empty(self.n)
        for sl in _batches(self.n, _BATCH):
            B = np.arange(sl.start, sl.stop, dtype=np.int64)
            alpha = np.ones(B.size)
            gamma = np.zeros(B.size)
            for lev in range(self.levels - 1):
                p = self._parent(lev, B)
                sB = self.s[lev][B]
                t = alpha * sB + self.pre[lev][B]
                S = self.S[lev + 1][p]
                gamma += alpha * alpha * sB + self.pre[lev][B] - t * t / S
                alpha = t / S
                B = p
            out[sl] = gamma + alpha * alpha * self.s[-1][0]
        return out

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        A, B = a.copy(), e - 1
        merged = A == B
        aL = np.ones(a.size)  # left boundary state (the merged state once the paths meet)
        gL = np.zeros(a.size)
        aR = np.ones(a.size)
        gR = np.zeros(a.size)
        for lev in range(self.levels - 1):
            s, pre, S_up = self.s[lev], self.pre[lev], self.S[lev + 1]
            pA, pB = self._parent(lev, A), self._parent(lev, B)
            sA, sB, SA, SB = s[A], s[B], S_up[pA], S_up[pB]
            preA, preB = pre[A], pre[B]
            joining = ~merged & (pA == pB)
            split = ~merged & ~joining
            # merged: one partial child, the others outside the range
            tM = aL * sA
            gM = gL + aL * aL * sA - tM * tM / SA
            # joining: partial A and B, the siblings strictly between them wholly inside
            mid = np.maximum(preB - preA - sA, 0.0)
            tJ = aL * sA + aR * sB + mid
            gJ = gL + gR + aL * aL * sA + aR * aR * sB + mid - tJ * tJ / SA
            # still split: A's later siblings and B's earlier siblings are wholly inside
            suf = np.maximum(SA - preA - sA, 0.0)
            tl = aL * sA + suf
            gl = gL + aL * aL * sA + suf - tl * tl / SA
            tr = aR * sB + preB
            gr = gR + aR * aR * sB + preB - tr * tr / SB
            gL = np.where(merged, gM, np.where(joining, gJ, gl))
            aL = np.where(merged, tM, np.where(joining, tJ, tl)) / SA
            gR = np.where(split, gr, gR)
            aR = np.where(split, tr / SB, aR)
            merged |= joining
            A, B = pA, pB
        return gL + aL * aL * self.s[-1][0]

    def functional(self, q: np.ndarray) -> float:
        alpha = np.asarray(q, dtype=np.float64)
        gamma = np.zeros(1)
        for lev in range(self.levels - 1):
            starts = self.layout.child_starts[lev][:-1]
            s = self.s[lev]
            t = np.add.reduceat(alpha * s, starts)
            sq = np.add.reduceat(alpha * alpha * s, starts)
            g = np.add.reduceat(gamma, starts) if gamma.size > 1 else np.zeros(starts.size)
            gamma = g + sq - t * t / self.S[lev + 1]
            alpha = t / self.S[lev + 1]
        return float(gamma[0] + alpha[0] ** 2 * self.s[-1][0]) if gamma.size else float(alpha[0] ** 2 * self.s[-1][0])

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of ``W``: the recursion on the union of each row's leaves' ancestors."""
        W = sp.csr_matrix(W, dtype=np.float64)
        W.sum_duplicates()  # canonical: sorted column indices within each row
        words = 8.0 * 10  # per non-zero, per batch
        check_memory(8.0 * (self._fixed() + W.shape[0]) + words * min(W.nnz, _BATCH * 8), memory_limit,
                     "the per-query variances of this workload")
        out = np.zeros(W.shape[0])
        nnz_row = np.diff(W.indptr).astype(np.float64)
        for rows in _row_blocks(W, nnz_row, float(_BATCH * 8)):
            blk = W[rows]
            if blk.nnz == 0:  # rows without entries: exact answers, variance 0
                continue
            qid = np.repeat(np.arange(blk.shape[0]), np.diff(blk.indptr))
            node, alpha = blk.indices.astype(np.int64), blk.data.copy()
            gamma = np.zeros(alpha.size)
            for lev in range(self.levels - 1):
                p = self._parent(lev, node)
                key = qid * np.int64(self.layout.sizes[lev + 1]) + p  # sorted: parents are monotone in node
                first = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
                s = self.s[lev][node]
                t = np.add.reduceat(alpha * s, first)
                sq = np.add.reduceat(alpha * alpha * s, first)
                g = np.add.reduceat(gamma, first)
                qid, node = qid[first], p[first]
                S = self.S[lev + 1][node]
                gamma = g + sq - t * t / S
                alpha = t / S
            out[rows] = np.bincount(qid, weights=gamma + alpha * alpha * self.s[-1][0], minlength=blk.shape[0])
        return out


# -- interval trees of any shape -----------------------------------------------------------------


class IntervalTreeCovariance(StructuredCovariance):
    """Covariance of the two-pass GLS (BLUE) estimate on an interval tree of any shape: leaves at
    different depths (SC trees, trees from splits), any branching, any per-node variances ``v``
    (breadth-first node order, as :class:`sparsedp.trees.IntervalTree` and
    :func:`sparsedp.tree_estimator.two_pass` use).

    ``tree`` needs the arrays ``n``, ``lo``, ``hi``, ``parent``, ``child_start`` and
    ``level_start`` of an :class:`~sparsedp.trees.IntervalTree`.  The recursion is the one of the
    module docstring (:class:`TreeCovariance` is its layered special case).  For a range
    ``[a, e)`` the partially covered nodes are those strictly containing a cut point ``a`` or
    ``e``: two root paths.  The path of cut ``c`` ends at ``N(c)``, the parent of ``T(c)``, the
    shallowest node starting at ``c`` (a node is ``T(lo)`` iff it is not the first child of its
    parent); ``N(c)``'s children starting at ``T(c)`` lie right of the cut.  Bottom-up, depth by
    depth, a left-path node adds its children right of the cut, a right-path node those left of
    it, the node where the paths meet those between, each as a within-group prefix sum of ``s``;
    a node above the meeting point has one partial child.  ``O(nodes)`` set-up, ``O(path
    lengths)`` per range, no matrix."""

    kind = "tree"

    def __init__(self, tree: object, v: np.ndarray):
        t = tree
        self.n = int(t.n)  # type: ignore[attr-defined]
        lo, parent = np.asarray(t.lo), np.asarray(t.parent)  # type: ignore[attr-defined]
        cstart, ls = np.asarray(t.child_start), np.asarray(t.level_start)  # type: ignore[attr-defined]
        size = lo.size
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (size,):
            raise SparseDPError(f"variances must have one entry per tree node ({size}), got shape {v.shape}")
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise SparseDPError("variances must be finite and > 0 on every node")
        self.parent = parent
        self._lo, self._ls = lo, ls
        self.levels = int(ls.size - 1)
        self.depth = np.repeat(np.arange(self.levels, dtype=np.int32 if self.levels < 2**31 else np.int64), np.diff(ls))
        s = v.copy()
        S = np.zeros(size)
        internal = np.diff(cstart) > 0
        for d in range(self.levels - 1, 0, -1):  # children at depth d are final: sum them into depth d - 1
            a, b, pa = int(ls[d]), int(ls[d + 1]), int(ls[d - 1])
            S[pa:a] = np.bincount(parent[a:b] - pa, weights=s[a:b], minlength=a - pa)
            up = np.flatnonzero(internal[pa:a]) + pa
            s[up] = 1.0 / (1.0 / v[up] + 1.0 / S[up])
        self.s, self.S = s, S
        # within each sibling group, the sum of s over the earlier siblings (per depth: no long sums)
        pre = np.zeros(size)
        counts = np.diff(cstart)
        for d in range(1, self.levels):
            a, b = int(ls[d]), int(ls[d + 1])
            c = counts[int(ls[d - 1]) : a]
            starts = cstart[int(ls[d - 1]) : a][c > 0]
            c = c[c > 0]
            if int(c.max()) <= 64:  # sibling by sibling, all groups at once: sums stay within a group
                order = np.argsort(-c, kind="stable")
                starts, c = starts[order], c[order]
                alive = np.searchsorted(-c, -np.arange(1, int(c.max())), side="left")  # groups with > j children
                for j in range(1, int(c.max())):
                    g = starts[: alive[j - 1]] + j
                    pre[g] = pre[g - 1] + s[g - 1]
            else:  # wide groups: prefix sums along the depth (cancellation ~ eps * depth sum)
                cs = np.cumsum(s[a:b])
                cs -= s[a:b]
                first = cstart[parent[a:b]]
                first -= a  # first sibling of each node, relative to a
                np.subtract(cs, cs[first], out=pre[a:b])
                del cs, first
        self.pre = pre
        top = np.zeros(self.n, dtype=np.int64)  # T(c): the shallowest node starting at bin c
        nonfirst = np.flatnonzero(lo[1:] != lo[parent[1:]]) + 1
        top[lo[nonfirst]] = nonfirst
        self.top = top

    def _fixed(self) -> float:
        return 5.0 * self.s.size + self.n

    def memory(self, queries: int) -> float:
        return 8.0 * (self._fixed() + 24 * min(queries, _BATCH) + queries)

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        s, S, pre, parent, depth = self.s, self.S, self.pre, self.parent, self.depth
        q = a.size
        hasL, hasR = a > 0, e < self.n
        TL = self.top[np.where(hasL, a, 0)]
        TR = self.top[np.where(hasR, e, 0)]
        curL = np.where(hasL, parent[TL], 0)
        curR = np.where(hasR, parent[TR], 0)
        dA = np.where(hasL, depth[curL], -1)
        dE = np.where(hasR, depth[curR], -1)
        pcL = np.full(q, -1, dtype=np.int64)  # the last path node done (the partial child of the next)
        pcR = np.full(q, -1, dtype=np.int64)
        aL, gL = np.zeros(q), np.zeros(q)  # left state; the merged state once the paths meet
        aR, gR = np.zeros(q), np.zeros(q)
        merged = np.zeros(q, dtype=bool)
        top_depth = int(max(dA.max(initial=-1), dE.max(initial=-1)))
        for d in range(top_depth, -1, -1):
            actL = dA >= d
            actR = dE >= d
            both = actL & actR & (curL == curR)
            # nodes above the meeting point: one partial child
            i = np.flatnonzero(both & merged)
            if i.size:
                u, c = curL[i], pcL[i]
                t = aL[i] * s[c]
                gL[i] += aL[i] * t - t * t / S[u]
                aL[i] = t / S[u]
                pcL[i] = u
            # the meeting point: the partial children of both sides and the whole children between
            i = np.flatnonzero(both & ~merged)
            if i.size:
                u, cl, cr = curL[i], pcL[i], pcR[i]
                hl, hr = cl >= 0, cr >= 0
                cl0, cr0 = np.maximum(cl, 0), np.maximum(cr, 0)
                tl = np.where(hl, aL[i] * s[cl0], 0.0)
                tr = np.where(hr, aR[i] * s[cr0], 0.0)
                start = np.where(hl, cl0 + 1, TL[i])
                stop = np.where(hr, cr0, TR[i])
                mid = np.maximum(pre[stop] - pre[start], 0.0)
                t = tl + tr + mid
                gL[i] += gR[i] + np.where(hl, aL[i] * tl, 0.0) + np.where(hr, aR[i] * tr, 0.0) + mid - t * t / S[u]
                aL[i] = t / S[u]
                pcL[i] = u
                merged[i] = True
            # left path only: the partial child and the whole children right of the cut
            i = np.flatnonzero(actL & ~both)
            if i.size:
                u, c = curL[i], pcL[i]
                h = c >= 0
                c0 = np.maximum(c, 0)
                tp = np.where(h, aL[i] * s[c0], 0.0)
                rest = np.where(h, S[u] - pre[c0] - s[c0], S[u] - pre[TL[i]])
                rest = np.maximum(rest, 0.0)
                t = tp + rest
                gL[i] += np.where(h, aL[i] * tp, 0.0) + rest - t * t / S[u]
                aL[i] = t / S[u]
                pcL[i] = u
            # right path only: the partial child and the whole children left of the cut
            i = np.flatnonzero(actR & ~both)
            if i.size:
                u, c = curR[i], pcR[i]
                h = c >= 0
                c0 = np.maximum(c, 0)
                tp = np.where(h, aR[i] * s[c0], 0.0)
                rest = np.where(h, pre[c0], pre[TR[i]])
                t = tp + rest
                gR[i] += np.where(h, aR[i] * tp, 0.0) + rest - t * t / S[u]
                aR[i] = t / S[u]
                pcR[i] = u
            moveL = np.flatnonzero(actL)
            curL[moveL] = parent[curL[moveL]]
            moveR = np.flatnonzero(actR)
            curR[moveR] = parent[curR[moveR]]
        root = s[0]
        out = np.where(hasL, gL + aL * aL * root, np.where(hasR, gR + aR * aR * root, root))
        return out

    def functional(self, q: np.ndarray) -> float:
        """``Var(q^T x_hat)`` for one dense vector ``q`` over the ``n`` bins (``O(nodes)``)."""
        return float(self.functionals(np.asarray(q, dtype=np.float64)[:, None])[0])

    def functionals(self, Q: np.ndarray) -> np.ndarray:
        """``Var(q^T x_hat)`` for every column ``q`` of the dense ``(n, k)`` array ``Q``, bottom-up
        over all nodes (``O(nodes k)``)."""
        Q = np.asarray(Q, dtype=np.float64)
        if Q.ndim != 2 or Q.shape[0] != self.n:
            raise SparseDPError(f"queries must have shape ({self.n}, k), got {Q.shape}")
        size = self.s.size
        leaf = self.S == 0
        alpha = np.zeros((size, Q.shape[1]))
        gamma = np.zeros((size, Q.shape[1]))
        alpha[leaf] = Q[self._lo[leaf]]
        ls = self._ls
        s, S = self.s[:, None], self.S
        for d in range(self.levels - 1, 0, -1):
            a, b, pa = int(ls[d]), int(ls[d + 1]), int(ls[d - 1])
            p = self.parent[a:b] - pa
            m = a - pa
            t = _group_rows(p, alpha[a:b] * s[a:b], m)
            sq = _group_rows(p, alpha[a:b] ** 2 * s[a:b], m)
            g = _group_rows(p, gamma[a:b], m)
            inner = np.flatnonzero(S[pa:a] > 0)
            Su = S[pa:a][inner, None]
            gamma[pa:a][inner] = g[inner] + sq[inner] - t[inner] ** 2 / Su
            alpha[pa:a][inner] = t[inner] / Su
        return gamma[0] + alpha[0] ** 2 * self.s[0]

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of a sparse ``W``, in dense blocks of columns (``O(nodes)`` per row): for range
        workloads use :meth:`ranges`."""
        W = sp.csr_matrix(W, dtype=np.float64)
        per_col = 8.0 * 3 * self.s.size
        check_memory(per_col + 8.0 * self._fixed(), memory_limit, "the per-query variances of this workload")
        k = max(1, min(W.shape[0], int(memory_limit / 4 // per_col), 256))
        out = np.empty(W.shape[0])
        for start in range(0, W.shape[0], k):
            stop = min(start + k, W.shape[0])
            out[start:stop] = self.functionals(W[start:stop].T.toarray())
        return out


def _group_rows(p: np.ndarray, a: np.ndarray, m: int) -> np.ndarray:
    """``out[j] = sum_{i: p_i = j} a[i]`` for a 2-D ``a`` (``m`` groups)."""
    out = np.zeros((m, a.shape[1]))
    if p.size:
        starts = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1])))  # parents are sorted
        out[p[starts]] = np.add.reduceat(a, starts, axis=0)
    return out


# -- Fenwick -------------------------------------------------------------------------------------


class FenwickCovariance(StructuredCovariance):
    """Covariance of ``x_hat = M^-1 y`` for the Fenwick strategy (variances in row order)."""

    kind = "fenwick"

    def __init__(self, n: int, v: np.ndarray):
        self.n = n
        self.v = np.asarray(v, dtype=np.float64)
        self.bits = int(n).bit_length()

    def _fixed(self) -> float:
        return 0.0

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        out = np.zeros(a.size)
        vv = np.concatenate(([0.0], self.v))  # node i (1-based) -> vv[i]; node 0 = none
        for j in range(self.bits):
            na = np.where((a >> j) & 1, (a >> j) << j, 0)
            ne = np.where((e >> j) & 1, (e >> j) << j, 0)
            out += np.where(na == ne, 0.0, vv[na] + vv[ne])
        return out

    def _inverse(self) -> sp.csr_matrix:
        return fenwick_inverse(self.n)

    def functional(self, q: np.ndarray) -> float:
        c = self._inverse().T @ np.asarray(q, dtype=np.float64)
        return float(np.dot(c * c, self.v))

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        return _rows_via_inverse(W, self._inverse(), self.v, memory_limit)


def _rows_via_inverse(W: sp.csr_matrix, G: sp.csr_matrix, v: np.ndarray, memory_limit: float) -> np.ndarray:
    """``sum_i v_i ((W G)_{qi})^2`` per row ``q``, in row blocks whose product fits in memory."""
    W = sp.csr_matrix(W, dtype=np.float64)
    G = sp.csr_matrix(G)
    gnnz = np.diff(G.indptr).astype(np.float64)
    row = np.repeat(np.arange(W.shape[0]), np.diff(W.indptr))
    cost = np.bincount(row, weights=gnnz[W.indices], minlength=W.shape[0])  # nnz of each row of W G, at most
    per_entry = 40.0  # bytes per non-zero of a product block (data, indices, squares, temporaries)
    budget = max(memory_limit / 4 / per_entry, 1.0)
    check_memory(per_entry * float(cost.max(initial=0.0)) + 8.0 * W.shape[0], memory_limit,
                 "the per-query variances of this workload (one row of W M^-1)")
    out = np.empty(W.shape[0])
    for rows in _row_blocks(W, cost, budget):
        B = W[rows] @ G
        B.data *= B.data
        out[rows] = B @ v
    return out


# -- Haar ----------------------------------------------------------------------------------------


class HaarCovariance(StructuredCovariance):
    """Covariance of ``x_hat = M^T diag(1 / r) y`` for the Haar strategy.

    Rows are read from the explicit matrix (interval supports ``[lo, hi)`` with the value ``left``
    on ``[lo, mid)`` and ``right`` on ``[mid, hi)``, ``mid = lo + ceil((hi - lo) / 2)``; row 0 is
    the total) and checked at the ends of each part; :meth:`build` returns ``None`` if the matrix
    does not have this form.
    """

    kind = "haar"

    def __init__(self, n: int, v: np.ndarray, lo, hi, mid, left, right, r, lchild, rchild):
        self.n, self.v = n, np.asarray(v, dtype=np.float64)
        self.lo, self.hi, self.mid, self.left, self.right, self.r = lo, hi, mid, left, right, r
        self.lchild, self.rchild = lchild, rchild
        self.depth = int(np.ceil(np.log2(n))) + 1 if n > 1 else 1
        self.M: SparseOperator | None = None

    @classmethod
    def build(cls, M: SparseOperator, v: np.ndarray) -> HaarCovariance | None:
        A = sp.csr_matrix(M.matrix)
        n = A.shape[1]
        r = np.asarray(M.meta.get("row_sq_norms"), dtype=np.float64)
        if A.shape[0] != n or r.shape != (n,) or not A.has_sorted_indices:
            return None
        ptr, idx, data = A.indptr, A.indices, A.data
        cnt = np.diff(ptr)
        if np.any(cnt == 0):
            return None
        lo = idx[ptr[:-1]].astype(np.int64)
        hi = idx[ptr[1:] - 1].astype(np.int64) + 1
        if np.any(hi - lo != cnt) or lo[0] != 0 or hi[0] != n or not np.all(data[: cnt[0]] == data[0]):
            return None  # rows must be intervals and row 0 the (constant) total
        mid = lo + (hi - lo + 1) // 2
        mid[0] = n
        first, split = ptr[:-1], ptr[:-1] + (mid - lo)
        left = data[first].astype(np.float64)
        right = np.where(mid < hi, data[np.minimum(split, ptr[1:] - 1)], 0.0)
        d = slice(1, None)
        ok = (np.all(data[split[d] - 1] == left[d]) and np.all(data[split[d]] == right[d])
              and np.all(data[ptr[1:][d] - 1] == right[d]) and np.all(left[d] > 0) and np.all(right[d] < 0))
        if not ok:
            return None
        # children in the split tree: the rows whose interval is [lo, mid) or [mid, hi)
        key = lo * (n + 1) + hi
        order = np.argsort(key[1:]) + 1
        sk = key[order]

        def find(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if not sk.size:
                return np.full(a.size, -1, dtype=np.int64)
            k = a * (n + 1) + b
            pos = np.minimum(np.searchsorted(sk, k), sk.size - 1)
            return np.where(sk[pos] == k, order[pos], -1)

        lchild = find(lo, mid)
        rchild = find(mid, hi)
        lchild[0] = rchild[0] = -1
        return cls(n, v, lo, hi, mid, left, right, r, lchild, rchild)

    def _fixed(self) -> float:
        return 10.0 * self.n

    def _chain(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each ``t``, the rows (by depth; ``-1`` = none) with a non-zero coefficient in
        ``P(t)`` other than the total, and those coefficients ``(sum_{j<t} M_ij) / r_i``."""
        rows = np.full((self.depth, t.size), -1, dtype=np.int64)
        coef = np.zeros((self.depth, t.size))
        cur = np.full(t.size, 1 if self.n > 1 else -1, dtype=np.int64)
        for d in range(self.depth):
            act = cur >= 0
            if not act.any():
                break
            c = np.maximum(cur, 0)
            lo, hi, mid = self.lo[c], self.hi[c], self.mid[c]
            inside = act & (lo < t) & (t < hi)
            part = np.where(t <= mid, (t - lo) * self.left[c], (mid - lo) * self.left[c] + (t - mid) * self.right[c])
            rows[d] = np.where(inside, c, -1)
            coef[d] = np.where(inside, part / self.r[c], 0.0)
            nxt = np.where(t < mid, self.lchild[c], np.where(t > mid, self.rchild[c], -1))
            cur = np.where(inside, nxt, -1)
        return rows, coef

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        ra, ca = self._chain(a)
        re, ce = self._chain(e)
        vv = np.concatenate((self.v, [0.0]))  # index -1 -> 0
        same = (ra == re) & (ra >= 0)
        out = np.where(same, vv[ra] * (ce - ca) ** 2, vv[ra] * ca * ca + vv[re] * ce * ce).sum(axis=0)
        total = (e - a) * self.left[0] / self.r[0]
        return out + self.v[0] * total * total

    def functional(self, q: np.ndarray) -> float:
        assert self.M is not None
        c = self.M.matrix @ np.asarray(q, dtype=np.float64) / self.r
        return float(np.dot(c * c, self.v))

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        assert self.M is not None
        from .inference import sparse_inverse  # the estimator's own G, cached on the operator

        check_memory(24.0 * self.M.matrix.nnz, memory_limit, "the Haar inverse M^T diag(1/r)")
        return _rows_via_inverse(W, sparse_inverse(self.M), self.v, memory_limit)


# -- identity ------------------------------------------------------------------------------------


class IdentityCovariance(StructuredCovariance):
    """``x_hat = y``: independent entries."""

    kind = "identity"

    def __init__(self, n: int, v: np.ndarray):
        self.n = n
        self.v = np.asarray(v, dtype=np.float64)
        self.cs = np.concatenate(([0.0], np.cumsum(self.v)))

    def _fixed(self) -> float:
        return float(self.n)

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        return self.cs[e] - self.cs[a]

    def functional(self, q: np.ndarray) -> float:
        q = np.asarray(q, dtype=np.float64)
        return float(np.dot(q * q, self.v))

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        W = sp.csr_matrix(W, dtype=np.float64, copy=True)
        W.data *= W.data
        return np.asarray(W @ self.v).ravel()
