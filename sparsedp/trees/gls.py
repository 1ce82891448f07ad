"""Per-node budgets that minimise the exact post-BLUE error of a query distribution (``objective="gls"``).

LUE-DPTree (seed 004, 3.4.2) chooses the budgets ``eps_x`` by a proxy: the error of the canonical
decomposition *before* consistency, ``2 sum_x p_x / eps_x^2`` (eq. 3.6).  The release is the BLUE,
so the error that matters is that of the GLS answers.  With node ``x`` measured with variance
``v_x = 2 / eps_x^2`` (Laplace ``Lap(1 / eps_x)``), ``P = sum_x m_x m_x^T / v_x`` (``m_x`` the
0/1 row of ``x``'s interval) and a query distribution ``D`` over ranges ``q``, the objective is

    E(eps) = sum_q D(q) q^T P^{-1} q
           = (1 - w) tr(W_all P^{-1} W_all^T) / (n (n + 1) / 2) + w 1^T P^{-1} 1      (uniform ranges)
           = sum_q w_q q^T P^{-1} q / sum_q w_q                                        (a weighted list)

(``w`` the probability of the whole-domain query when it is listed through ``whole_domain``),
minimised subject to every root-to-leaf path summing to ``epsilon``.  Its gradient is
``dE/dv_x = ||W G e_x||^2`` (the impulse norms of the two-pass estimator ``G``), both from
:class:`sparsedp.optimize.weighted_tree.TreeObjective`: closed forms in ``O(n levels)`` for the
uniform ranges and the whole domain, the explicit two-pass per query for a list.

The optimiser's evaluator works on a :class:`~sparsedp.strategies.TreeLayout` (every leaf on level
0).  A tree whose leaves lie at several depths (SC trees, balanced splits of ``n`` that is not a
power of ``k``) is *embedded*: a leaf of depth ``d`` keeps its row on level 0 and gets unmeasured
pass-through copies of its interval at depths ``d .. levels - 2`` (noise variance
:data:`UNMEASURED_VARIANCE`, which changes no float in the GLS; their gradient is ignored).  The
budgets are the optimiser's top-down split (:class:`~sparsedp.optimize.params.NodeSplit`, every
path sums to 1; pass-through copies keep the lower bound ``1e-12`` of the split, which is wasted,
not spent), searched by :func:`sparsedp.optimize.tree_family.fit_nodes` (L-BFGS-B) from the proxy's
allocation and from uniform budgets; the better result is kept, and never one worse than the
proxy's own allocation under the exact objective.  The returned budgets are ``epsilon`` times the
real nodes' shares, normalised so that every path sums to at most ``epsilon`` exactly
(:func:`~sparsedp.trees.budget.normalise_budget`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import workloads as wl
from ..errors import SparseDPError
from ..operators import SparseOperator
from ..optimize.calibrate import noise_model
from ..optimize.params import precision
from ..optimize.search import Deadline
from ..optimize.tree_family import fit_nodes
from ..optimize.weighted_tree import TreeObjective
from ..strategies import TreeLayout
from ..validation import check_epsilon, check_vector
from .budget import allocate_budget, normalise_budget
from .build import as_interval_tree
from .coverage import check_ranges, coverage_probabilities

__all__ = ["GLSQueryObjective", "embed_layout", "gls_budget", "gls_error", "query_coverage"]

#: Noise variance of the unmeasured pass-through rows of an embedded tree: ``1 / v = 1e-100`` is
#: below the last digit of any real precision, and ``v^2`` stays finite.
UNMEASURED_VARIANCE = 1e100

#: Laplace at unit budget: variance ``2 / q^2`` for path share ``q``.
_LAPLACE = noise_model("laplace")


@dataclass(frozen=True)
class Embedding:
    """An interval tree as a :class:`TreeLayout`: ``rows[i]`` is the layout row of tree node ``i``;
    rows not in ``rows`` are pass-through copies of shallow leaves."""

    layout: TreeLayout
    rows: np.ndarray
    real: np.ndarray  # bool per layout row


def embed_layout(tree: Any) -> Embedding:
    """Embed an interval tree (leaves at any depth) in a :class:`TreeLayout` (leaves on level 0).

    Depth ``d`` of the layout holds the internal nodes of depth ``d`` and a copy of every leaf of
    depth ``<= d`` (the leaf itself on the last depth), sorted by ``lo``; both depths tile the bins
    and depth ``d + 1`` refines depth ``d``, so the children of a row are found by ``searchsorted``.
    ``O(rows log rows)``; rows ``<= nodes + n (levels - 1 - min leaf depth)``."""
    t = as_interval_tree(tree)
    D = t.levels
    depth = t.depth
    leaf = t.degree == 0
    per_depth_nodes: list[np.ndarray] = []
    per_depth_lo: list[np.ndarray] = []
    for d in range(D):
        if d < D - 1:
            internal = np.flatnonzero(~leaf[t.level(d)]) + t.level(d).start
            copies = np.flatnonzero(leaf & (depth <= d))
            idx = np.concatenate((internal, -1 - copies))  # negative: a pass-through copy of leaf i
            lo = t.lo[np.concatenate((internal, copies))]
        else:
            idx = t.leaves
            lo = t.lo[idx]
        order = np.argsort(lo, kind="stable")
        per_depth_nodes.append(idx[order])
        per_depth_lo.append(lo[order])
    sizes = [per_depth_lo[D - 1 - lev].size for lev in range(D)]  # level 0 = leaves
    leaf_starts = tuple(np.append(per_depth_lo[D - 1 - lev], t.n).astype(np.int64) for lev in range(D))
    child_starts = tuple(
        np.append(np.searchsorted(per_depth_lo[D - 1 - lev], per_depth_lo[D - 2 - lev]), sizes[lev]).astype(np.int64)
        for lev in range(D - 1)
    )
    offsets = np.concatenate(([0], np.cumsum(sizes[::-1])))[:-1][::-1]  # row_offsets[lev]
    layout = TreeLayout(n=t.n, sizes=tuple(sizes), child_starts=child_starts, leaf_starts=leaf_starts,
                        row_offsets=tuple(int(o) for o in offsets))
    rows = np.empty(t.size, dtype=np.int64)
    real = np.zeros(layout.nodes, dtype=bool)
    for d in range(D):
        idx = per_depth_nodes[d]
        r = offsets[D - 1 - d] + np.arange(idx.size)
        mine = idx >= 0
        rows[idx[mine]] = r[mine]
        real[r[mine]] = True
    return Embedding(layout, rows, real)


class GLSQueryObjective:
    """``a -> (E, dE/da)`` on the rows of an embedded tree: the exact expected squared GLS error of one
    query drawn from the distribution (see the module docstring), for row precisions ``a``
    (``1 / variance``; pass-through rows are measured with :data:`UNMEASURED_VARIANCE` whatever
    ``a`` says, and get gradient 0).  Usable as the ``obj`` of
    :func:`sparsedp.optimize.tree_family.fit_nodes` (it has ``.layout``).

    ``queries=None``: uniform random ranges; otherwise an ``(m, 2)`` array of inclusive ranges with
    optional non-negative ``weights``.  ``whole_domain`` in ``[0, 1]``: the probability of the
    whole-domain query ``[0, n - 1]`` mixed into that distribution."""

    def __init__(self, tree: Any, queries: Any = None, weights: Any = None, whole_domain: float = 0.0):
        self.tree = as_interval_tree(tree)
        self.embedding = embed_layout(self.tree)
        self.layout = self.embedding.layout
        n = self.tree.n
        w_all = float(whole_domain)
        if not 0.0 <= w_all <= 1.0:
            raise SparseDPError(f"whole_domain must be in [0, 1], got {whole_domain!r}")
        parts: list[tuple[float, TreeObjective]] = []
        if w_all < 1.0:
            if queries is None:
                if weights is not None:
                    raise SparseDPError("weights need a list of queries")
                parts.append(((1.0 - w_all) / (n * (n + 1) / 2.0), TreeObjective(self.layout, wl.all_ranges(n))))
            else:
                lo, hi = check_ranges(queries, n, "queries")
                if lo.size == 0:
                    raise SparseDPError("queries is empty")
                w = np.ones(lo.size) if weights is None else check_vector(weights, lo.size, "weights")
                if np.any(w < 0) or w.sum() <= 0:
                    raise SparseDPError("weights must be >= 0 with a positive sum")
                keep = w > 0
                lo, hi, w = lo[keep], hi[keep], w[keep]
                W = _weighted_ranges(n, lo, hi, np.sqrt(w))
                parts.append(((1.0 - w_all) / float(w.sum()), TreeObjective(self.layout, W)))
        if w_all > 0.0:
            parts.append((w_all, TreeObjective(self.layout, wl.total(n))))
        self.parts = parts

    def __call__(self, a: np.ndarray) -> tuple[float, np.ndarray]:
        a = np.where(self.embedding.real, np.asarray(a, dtype=np.float64), 1.0 / UNMEASURED_VARIANCE)
        E, g = 0.0, np.zeros(a.size)
        for coef, obj in self.parts:
            e, ga = obj(a)
            E += coef * e
            g += coef * np.where(self.embedding.real, ga, 0.0)
        return E, g

    def error(self, variances: Any) -> float:
        """The expected squared error of one query for per-node noise ``variances`` (tree order)."""
        v = check_vector(variances, self.tree.size, "variances")
        if np.any(v <= 0):
            raise SparseDPError("variances must be > 0")
        a = np.full(self.layout.nodes, 1.0 / UNMEASURED_VARIANCE)
        a[self.embedding.rows] = 1.0 / v
        return self(a)[0]

    def error_of_budget(self, eps_per_node: Any) -> float:
        """:meth:`error` for Laplace budgets: ``v_x = 2 / eps_x^2`` (``inf`` if a budget is 0)."""
        e = check_vector(eps_per_node, self.tree.size, "eps_per_node")
        if np.any(e <= 0):
            return float("inf")
        return self.error(2.0 / e**2)


def query_coverage(tree: Any, queries: Any = None, weights: Any = None, whole_domain: float = 0.0) -> np.ndarray:
    """Coverage probabilities of the proxy (eq. 3.1 / 3.5) for the distribution of the module
    docstring: ``(1 - w) p + w [x = root]`` (the whole-domain query uses the root alone); for a
    list of queries every node gets at least ``1e-9 max p`` (so every node is still measured)."""
    t = as_interval_tree(tree)
    w = float(whole_domain)
    if not 0.0 <= w <= 1.0:
        raise SparseDPError(f"whole_domain must be in [0, 1], got {whole_domain!r}")
    p = coverage_probabilities(t, queries, weights)
    if w:
        p = (1.0 - w) * p
        p[0] += w
    if queries is not None:
        p = np.maximum(p, 1e-9 * p.max())
    return p


def _weighted_ranges(n: int, lo: np.ndarray, hi: np.ndarray, scale: np.ndarray) -> SparseOperator:
    """``diag(scale) W`` for the half-open ranges ``[lo, hi)`` as a sparse operator (one row each)."""
    lengths = hi - lo
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.repeat(lo - indptr[:-1], lengths) + np.arange(indptr[-1])
    A = sp.csr_matrix((np.repeat(scale, lengths), indices, indptr), shape=(lo.size, n))
    return SparseOperator(A, name=f"weighted ranges ({lo.size})")


def _shares_from_budget(emb: Embedding, eps_per_node: np.ndarray, epsilon: float) -> np.ndarray:
    q = np.zeros(emb.layout.nodes)
    q[emb.rows] = eps_per_node / epsilon
    return q


def gls_budget(
    tree: Any,
    epsilon: float,
    queries: Any = None,
    weights: Any = None,
    whole_domain: float = 0.0,
    *,
    seconds: float | None = 30.0,
    maxiter: int = 300,
) -> np.ndarray:
    """Per-node budgets minimising the exact expected squared error of the BLUE answer to one query of
    the distribution (module docstring), every root-to-leaf path summing to at most ``epsilon``
    exactly.  Starts: the proxy's allocation (:func:`~sparsedp.trees.budget.allocate_budget` for
    the same distribution) and uniform budgets; the best is kept (never worse than the proxy's
    allocation under the exact objective).  ``seconds`` bounds each search (``None``: no limit).
    Data-independent: costs no privacy."""
    t = as_interval_tree(tree)
    eps = check_epsilon(epsilon, "epsilon")
    obj = GLSQueryObjective(t, queries, weights, whole_domain)
    emb = obj.embedding
    p = query_coverage(t, queries, weights, whole_domain)
    starts = [allocate_budget(t, 1.0, p), np.full(t.size, 1.0 / t.levels)]
    best_q, best_E = None, np.inf
    for start in starts:
        q0 = _shares_from_budget(emb, start, 1.0)
        E0 = obj(precision(q0, _LAPLACE))[0]
        if E0 < best_E:
            best_q, best_E = q0, E0
        deadline = Deadline(seconds) if seconds is not None else None
        q, E, _ = fit_nodes(obj, _LAPLACE, q0, deadline, maxiter=maxiter)
        if E < best_E:
            best_q, best_E = q, E
    assert best_q is not None
    out = np.maximum(best_q[emb.rows], 0.0) * eps
    return normalise_budget(t, out, eps)


def gls_error(tree: Any, eps_per_node: Any, queries: Any = None, weights: Any = None, whole_domain: float = 0.0) -> float:
    """Exact expected squared error of the BLUE (consistent) answer to one query of the distribution,
    for Laplace budgets ``eps_per_node`` (``v_x = 2 / eps_x^2``)."""
    return GLSQueryObjective(tree, queries, weights, whole_domain).error_of_budget(eps_per_node)
