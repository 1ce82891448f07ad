"""Exact GLS error of a weighted interval tree and its gradient, for any tree shape and weights.

A tree strategy measures every node ``u`` (rows of :meth:`TreeLayout.matrix`) with noise precision
``a_u`` (variance ``v_u = 1 / a_u``).  With ``P = M^T V^{-1} M = sum_u a_u m_u m_u^T`` the total
squared error of the GLS workload answers is ``E = tr(W P^{-1} W^T)`` and

    dE/da_u = -||W P^{-1} m_u||^2 = -v_u^2 ||W G e_u||^2,   equivalently   dE/dv_u = ||W G e_u||^2,

(``G = P^{-1} M^T V^{-1}`` the estimator): the gradient is the vector of *impulse norms* whose
``v``-weighted sum is ``E`` itself (``E`` is homogeneous of degree 1 in ``v``).  So one evaluation
gives both, exactly:

* ``closed``: prefix, all-range, identity and total workloads use the ``O(n log n)`` closed form
  of :func:`sparsedp.tree_estimator.tree_impulse_norms`, reorganised for repeated evaluation
  (:class:`~sparsedp.tree_estimator.ImpulseNorms`, 4x faster at ``n = 2^20``);
* ``explicit``: any other workload (range lists, sparse matrices) row by row: with ``c_q`` the query
  ``w_q`` placed on the leaf rows (``M^T c_q = w_q``, the leaves are identity rows), the two-pass GLS
  solve of ``y = V c_q`` returns the node values ``X[:, q] = M P^{-1} w_q``, so
  ``E = sum_q w_q . X_leaves[:, q]`` and ``dE/da_u = -sum_q X[u, q]^2``.  ``O(queries x nodes)``,
  in blocks of queries.

Weighted unions (:func:`~sparsedp.workloads.weighted_union`, ``G = sum_i c_i G_i``): ``E`` and
``dE/da`` are linear in ``G``, so ``E = sum_i c_i E_i`` and ``dE/da = sum_i c_i dE_i/da`` over one
objective per part, each closed or explicit as above (``mode`` is ``"closed"`` when every part is):
an all-range part keeps its ``O(n log n)`` closed form and its rows are never formed.
"""

from __future__ import annotations

import numpy as np

from ..intervals import IntervalRows
from ..operators import Operator
from ..strategies import TreeLayout
from ..tree_estimator import layout_plan, two_pass
from .gram import CLOSED_KINDS, Gram, closed_parts, workload_rows
from ..tree_estimator import ImpulseNorms

__all__ = ["CLOSED_FORM_WORKLOADS", "TreeObjective", "has_closed_form", "row_weights", "tree_strategy"]

CLOSED_FORM_WORKLOADS = CLOSED_KINDS


def has_closed_form(gram: Gram) -> bool:
    """A prefix, all-range, identity or total workload, or a weighted sum of them."""
    return closed_parts(gram) is not None


class TreeObjective:
    """``a -> (E, dE/da)`` for node precisions ``a`` (strategy row order) on one tree layout."""

    def __init__(self, layout: TreeLayout, workload: Operator, gram: Gram | None = None, block_elems: int = 1 << 22):
        self.layout = layout
        self.W = workload
        gram = gram if gram is not None else Gram(workload)
        self.workload_kind = gram.kind
        self.block = max(1, block_elems // max(layout.nodes, 1))
        self._impulse: list[tuple[float, ImpulseNorms]] | None = None
        self._parts: list[tuple[float, TreeObjective]] | None = None
        closed = closed_parts(gram)
        if closed is not None:
            self.mode = "closed"
            merged: dict[str, float] = {}  # one impulse pass per kind: sum_i c_i norms_kind
            for c, kind in closed:
                merged[kind] = merged.get(kind, 0.0) + c
            self._impulse = [(c, ImpulseNorms(layout, kind)) for kind, c in merged.items()]
        elif gram.parts is not None:
            self.mode = "explicit"
            self._parts = [(c, TreeObjective(layout, g.W, g, block_elems)) for c, g in gram.parts]
        else:
            self.mode = "explicit"

    @property
    def cost(self) -> float:
        """Rough element operations of one evaluation (for time budgets)."""
        if self._parts is not None:
            return float(sum(obj.cost for _, obj in self._parts))
        if self.mode == "closed":
            return float(self.layout.nodes * self.layout.levels * 40)
        return float(self.layout.nodes) * float(self.W.shape[0]) * 8

    def __call__(self, a: np.ndarray) -> tuple[float, np.ndarray]:
        a = np.asarray(a, dtype=np.float64)
        if self.mode == "closed":
            v = 1.0 / a
            norms = sum(c * imp(v) for c, imp in self._impulse)  # type: ignore[union-attr]
            return float(norms @ v), -norms * v * v
        if self._parts is not None:
            total, grad = 0.0, np.zeros(self.layout.nodes)
            for c, obj in self._parts:
                E, g = obj(a)
                total += c * E
                grad += c * g
            return total, grad
        return self._explicit(a)

    def _solve(self, R: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Node values ``M P^{-1} R`` for leaf vectors ``R`` (``n x b``): the two-pass GLS of
        ``y = V c`` with ``c = R`` on the leaf rows."""
        lay = self.layout
        parent, level_start = lay.bfs()
        leaf0 = lay.row_offsets[0]
        Y = np.zeros((lay.nodes, R.shape[1]))
        Y[leaf0:] = R * v[leaf0:, None]
        return two_pass(parent, level_start, Y, v, plan=layout_plan(lay), overwrite=True)

    def _explicit(self, a: np.ndarray) -> tuple[float, np.ndarray]:
        """``E`` and ``dE/da`` query block by query block.

        Accuracy: when some leaves are far noisier than their ancestors (precision ratios ~1e12,
        which per-node optimisation produces for leaves the workload does not need), ``y = V c``
        is huge on them and the two-pass loses digits to cancellation (relative error ~1e-7
        measured against 40-digit arithmetic).  That is harmless for the search; final scores of
        explicit workloads come from :func:`sparsedp.expected_error` (exact to ~1e-16 there)."""
        lay = self.layout
        v = 1.0 / a
        leaf0 = lay.row_offsets[0]
        total, grad = 0.0, np.zeros(lay.nodes)
        queries = self.W.shape[0]
        for start in range(0, queries, self.block):
            stop = min(start + self.block, queries)
            Wb = workload_rows(self.W, start, stop)  # n x b
            X = self._solve(Wb, v)
            total += float(np.einsum("ij,ij->", X[leaf0:], Wb))
            grad -= np.einsum("ij,ij->i", X, X)
        return total, grad


def tree_strategy(layout: TreeLayout, weights: np.ndarray, name: str) -> IntervalRows:
    """``diag(w) T`` for the tree's node-by-leaf matrix ``T``, as the implicit
    :class:`~sparsedp.intervals.IntervalRows` (rows root first, the layout in ``meta``): measured
    and calibrated in ``O(nodes + n)`` and reconstructed with the two-pass GLS by
    :class:`~sparsedp.mechanism.MatrixMechanism`."""
    lo, hi = layout.intervals()
    w = np.asarray(weights, dtype=np.float64)
    return IntervalRows(layout.n, lo, hi, w, name=name, structure="tree", meta={"layout": layout})


def row_weights(strategy: Operator) -> np.ndarray:
    """The row weights of a tree strategy (``IntervalRows`` weights, ``diag(w) T``'s ``w``, or 1)."""
    if isinstance(strategy, IntervalRows):
        return np.asarray(strategy.weights, dtype=np.float64)
    if getattr(strategy, "row_weights", None) is not None:
        return np.asarray(strategy.row_weights, dtype=np.float64)
    return np.ones(strategy.shape[0])
