"""Compile an interval tree to a strategy matrix and to consistency constraint rows.

``to_strategy(tree)``: one row per node (breadth-first), ones on the node's bins; with per-node
budgets it is ``diag(eps) M`` measured with unit-scale Laplace noise, whose sensitivity
``Delta_1 = max_leaf sum_path eps`` is the privacy of the release (Conclusion 3.4).
``to_constraints(tree)``: rows ``h_parent - sum_children h_child = 0`` on the node vector
(one per internal node), the consistency of Definition 3.3, as ``(C, b)`` with ``b = 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..operators import SparseOperator
from ..strategies import _interval_rows, weighted
from ..validation import check_vector
from .build import as_interval_tree

__all__ = ["to_strategy", "to_constraints"]


def to_strategy(tree: Any, eps_per_node: Any = None) -> SparseOperator:
    """Node-by-bin 0/1 matrix (``sum over nodes of node length`` non-zeros); ``diag(eps) M`` if
    ``eps_per_node`` is given."""
    t = as_interval_tree(tree)
    M = SparseOperator(_interval_rows(t.lo, t.hi, t.n), name=f"interval-tree({t.n}, {t.size} nodes)", meta={"tree": t})
    if eps_per_node is None:
        return M
    return weighted(M, check_vector(eps_per_node, t.size, "eps_per_node"))


def to_constraints(tree: Any) -> tuple[sp.csr_matrix, np.ndarray]:
    """``(C, b)``: ``C h = b`` says every internal node equals the sum of its children."""
    t = as_interval_tree(tree)
    internal = np.flatnonzero(t.degree > 0)
    row_of = np.full(t.size, -1)
    row_of[internal] = np.arange(internal.size)
    kids = np.arange(1, t.size)
    rows = np.concatenate([row_of[internal], row_of[t.parent[kids]]])
    cols = np.concatenate([internal, kids])
    vals = np.concatenate([np.ones(internal.size), -np.ones(kids.size)])
    C = sp.csr_matrix((vals, (rows, cols)), shape=(internal.size, t.size))
    return C, np.zeros(internal.size)
