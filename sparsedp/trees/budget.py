"""Per-node privacy budgets (seed 004, 3.4.2: Conclusions 3.4-3.5, Algorithms 3.3 CNP and 3.4 NPBD).

Privacy (Conclusion 3.4).  Node ``x`` releases ``h_x + Lap(1 / eps_x)``.  One record changes one
bin, hence exactly the counts of the nodes on one root-to-leaf path, each by 1: the release is
``max_leaf sum_{y in Path(root, leaf)} eps_y``-DP (sequential composition along a path, parallel
across disjoint subtrees).  Equivalently, the strategy ``diag(eps) M_tree`` has
``Delta_1 = max_leaf sum_path eps`` with unit-scale noise.  :func:`allocate_budget` makes every path
sum to ``eps`` exactly.

Optimal allocation (3.6): minimise ``sum_x p_x / eps_x^2`` s.t. every root-to-leaf path sums to
``eps``.  The optimum of a subtree given the budget ``s`` left for it is ``K_x / s^2`` (homogeneity):
``K_leaf = p``, and for an internal node with ``S = sum_children K_y`` the split ``e / (s - e)`` that
minimises ``p / e^2 + S / (s - e)^2`` is ``a_x = (p_x / S)^(1/3)`` (the seed's node coefficient; its
``sum p_y b_y^3 / a_y^3`` is ``S``), so ``eps_x = a_x / (1 + a_x) s`` (``= a_x / b_x psum(x)``)
and ``K_x = (p_x^(1/3) + S^(1/3))^3``.  Both passes run per depth, vectorised.  The minimum of
:func:`expected_range_error` is ``2 K_root / eps^2``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..validation import check_positive, check_vector
from .build import IntervalTree, as_interval_tree

__all__ = ["allocate_budget", "expected_range_error", "path_sums", "optimal_error", "level_budget", "uniform_budget"]


def _coefficients(t: IntervalTree, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bottom-up (CNP): per node ``K_x`` and the share ``a_x / (1 + a_x)`` of its path budget."""
    K = p.copy()
    frac = np.ones(t.size)
    for d in range(t.levels - 2, -1, -1):
        sl = t.level(d)
        internal = t.degree[sl] > 0
        S = t.child_sums(K, d)[internal]
        cp, cS = np.cbrt(p[sl][internal]), np.cbrt(S)
        denom = cp + cS
        f = np.where(denom > 0, cp / np.where(denom > 0, denom, 1.0), 1.0)
        idx = np.flatnonzero(internal) + sl.start
        K[idx] = denom**3
        frac[idx] = f
    return K, frac


def allocate_budget(tree: Any, epsilon: float, probabilities: Any) -> np.ndarray:
    """Per-node budgets ``eps_x`` minimising ``sum p_x / eps_x^2`` with every root-to-leaf path
    summing to ``epsilon`` (CNP + NPBD, Conclusion 3.5).  A node with ``p_x = 0`` gets ``eps_x = 0``
    (it is not worth measuring).  ``O(nodes)``."""
    t = as_interval_tree(tree)
    eps = check_positive(epsilon, "epsilon")
    p = check_vector(probabilities, t.size, "probabilities")
    if np.any(p < 0):
        raise SparseDPError("probabilities must be >= 0")
    _, frac = _coefficients(t, p)
    out = np.empty(t.size)
    left = np.empty(t.size)  # psum(x): budget left for the subtree of x
    left[0] = eps
    out[0] = frac[0] * eps
    for d in range(1, t.levels):
        sl = t.level(d)
        par = t.parent[sl]
        left[sl] = left[par] - out[par]
        out[sl] = frac[sl] * left[sl]
    return out


def optimal_error(tree: Any, epsilon: float, probabilities: Any) -> float:
    """The minimum of :func:`expected_range_error` over path-feasible budgets: ``2 K_root / eps^2``."""
    t = as_interval_tree(tree)
    eps = check_positive(epsilon, "epsilon")
    K, _ = _coefficients(t, check_vector(probabilities, t.size, "probabilities"))
    return float(2.0 * K[0] / eps**2)


def path_sums(tree: Any, eps_per_node: Any) -> np.ndarray:
    """``sum_{y in Path(root, leaf)} eps_y`` for every leaf, ordered by bin (Conclusion 3.4): the
    release is ``max(path_sums)``-DP."""
    t = as_interval_tree(tree)
    e = check_vector(eps_per_node, t.size, "eps_per_node")
    acc = e.copy()
    for d in range(1, t.levels):
        sl = t.level(d)
        acc[sl] += acc[t.parent[sl]]
    return acc[t.leaves]


def expected_range_error(tree: Any, eps_per_node: Any, probabilities: Any) -> float:
    """Expected squared error of a random range answered by its canonical decomposition of the
    noisy counts (no consistency step), eqs. 3.2 / 3.6: ``2 sum_x p_x / eps_x^2``
    (``Lap(1/eps_x)`` has variance ``2 / eps_x^2``).  Nodes with ``p_x = 0`` contribute nothing."""
    t = as_interval_tree(tree)
    e = check_vector(eps_per_node, t.size, "eps_per_node")
    p = check_vector(probabilities, t.size, "probabilities")
    used = p > 0
    if np.any(e[used] <= 0):
        return float("inf")
    return float(2.0 * np.sum(p[used] / e[used] ** 2))


def uniform_budget(tree: Any, epsilon: float) -> np.ndarray:
    """Boost (Hay et al. 2010): ``eps / levels`` on every node, so no path exceeds ``eps``."""
    t = as_interval_tree(tree)
    return np.full(t.size, check_positive(epsilon, "epsilon") / t.levels)


def level_budget(tree: Any, epsilon: float, probabilities: Any) -> np.ndarray:
    """Boost-UN: one budget per depth, ``eps_d`` proportional to ``P_d^(1/3)`` (``P_d`` the total
    coverage probability of depth ``d``), the minimiser of ``sum_d P_d / eps_d^2`` with
    ``sum_d eps_d = eps``; scaled so that the longest path sums to ``eps``."""
    t = as_interval_tree(tree)
    eps = check_positive(epsilon, "epsilon")
    p = check_vector(probabilities, t.size, "probabilities")
    P = np.add.reduceat(p, t.level_start[:-1])
    share = np.cbrt(P)
    per_level = eps * share / share.sum()
    out = per_level[t.depth]
    return out * (eps / path_sums(t, out).max())
