"""Node coverage probabilities and the canonical decomposition of range queries (seed 004, 3.3-3.4).

A range query ``Q = [l, r]`` is answered from a tree by its *canonical decomposition* ``Node(Q)``:
the nodes ``x`` with ``[L(x), R(x)]`` inside ``Q`` whose parent is not inside ``Q`` (condition
3.4).  They are disjoint and tile ``Q``.  The coverage probability of a node is the probability
that a random query uses it: ``p_x = sum_{Q : x in Node(Q)} P_Q`` (3.1).

Uniform queries (every one of the ``n(n+1)/2`` ranges equally likely), eq. 3.5 (Algorithm 3.2,
CNCP): ``N(x) = L(x) (n - R(x) + 1)`` ranges contain ``x``; those containing ``x`` but not its
parent ``f`` number ``N(x) - N(f)`` (a range containing ``f`` contains ``x``), so

    p_root = 1 / (n(n+1)/2),     p_x = (L(x)(n - R(x) + 1) - L(f)(n - R(f) + 1)) / (n(n+1)/2).

Computed for all nodes at once in ``O(nodes)``.  For a given (weighted) list of queries the
probabilities are the weighted usage counts of the decomposition, computed by
:func:`decompose` for all queries at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError, SparseDPError
from ..validation import check_vector
from .build import IntervalTree, as_interval_tree

__all__ = ["coverage_probabilities", "decompose", "check_ranges", "answer_ranges"]


def _contain_counts(tree: IntervalTree) -> np.ndarray:
    """``N(x) = L(x) (n - R(x) + 1)``: the number of ranges that contain node ``x`` (float)."""
    return (tree.lo + 1.0) * (tree.n - tree.hi + 1.0)


def check_ranges(ranges: Any, n: int, name: str = "ranges") -> tuple[np.ndarray, np.ndarray]:
    """Validate an ``(m, 2)`` array of inclusive 0-based ranges ``[lo, hi]`` on ``n`` bins and
    return them as half-open ``(lo, hi + 1)`` int64 arrays."""
    arr = np.asarray(ranges)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ShapeError(f"{name} must have shape (m, 2), got {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr.astype(float))) or np.any(arr != np.round(arr)):
            raise ShapeError(f"{name} must hold integer bin indices")
    arr = arr.astype(np.int64)
    lo, hi = arr[:, 0], arr[:, 1]
    if np.any(lo < 0) or np.any(hi >= n) or np.any(lo > hi):
        raise ShapeError(f"{name} must satisfy 0 <= lo <= hi < {n} (inclusive, 0-based)")
    return lo, hi + 1


def decompose(tree: Any, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Canonical decomposition of the half-open ranges ``[lo[i], hi[i])`` for all ``i`` at once.

    Returns ``(query, node)`` pairs.  Vectorised top-down: a frontier of (query, node) pairs that
    partially overlap is expanded to the children; a range partially overlaps at most two nodes per
    depth, so the cost is ``O(m * levels * max branching)``.
    """
    t = as_interval_tree(tree)
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    q = np.arange(lo.size)
    node = np.zeros(lo.size, dtype=np.int64)
    out_q, out_node = [], []
    while q.size:
        inside = (lo[q] <= t.lo[node]) & (t.hi[node] <= hi[q])
        out_q.append(q[inside]), out_node.append(node[inside])
        partial = ~inside & (t.lo[node] < hi[q]) & (lo[q] < t.hi[node])
        q, node = q[partial], node[partial]
        deg = t.child_start[node + 1] - t.child_start[node]
        q = np.repeat(q, deg)
        node = np.repeat(t.child_start[node] - np.cumsum(deg) + deg, deg) + np.arange(q.size)
    return np.concatenate(out_q), np.concatenate(out_node)


def answer_ranges(tree: Any, node_values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Range answers ``sum_{x in Node(Q)} value_x`` from (possibly inconsistent) node values."""
    q, node = decompose(tree, lo, hi)
    return np.bincount(q, weights=np.asarray(node_values, dtype=np.float64)[node], minlength=np.size(lo))


def coverage_probabilities(tree: Any, queries: Any = None, weights: Any = None) -> np.ndarray:
    """Coverage probability ``p_x`` of every node (breadth-first order), eqs. 3.1 and 3.5.

    ``queries=None``: all ``n(n+1)/2`` ranges equally likely, closed form 3.5 in ``O(nodes)``
    (nothing is enumerated).  Otherwise ``queries`` is an ``(m, 2)`` array of inclusive 0-based
    ranges, optionally with non-negative ``weights`` (their probabilities up to a constant):
    ``p_x = sum_Q w_Q [x in Node(Q)] / sum_Q w_Q``.
    """
    t = as_interval_tree(tree)
    if queries is None:
        if weights is not None:
            raise SparseDPError("weights need a list of queries")
        N = _contain_counts(t)
        Nf = np.concatenate(([0.0], N[t.parent[1:]]))
        return (N - Nf) / (t.n * (t.n + 1) / 2.0)
    lo, hi = check_ranges(queries, t.n, "queries")
    if lo.size == 0:
        raise ShapeError("queries is empty")
    w = np.ones(lo.size) if weights is None else check_vector(weights, lo.size, "weights")
    if np.any(w < 0) or w.sum() <= 0:
        raise SparseDPError("weights must be >= 0 with a positive sum")
    q, node = decompose(t, lo, hi)
    return np.bincount(node, weights=w[q], minlength=t.size) / w.sum()
