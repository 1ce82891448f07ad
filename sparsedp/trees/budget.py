"""Per-node privacy budgets (seed 004, 3.4.2: Conclusions 3.4-3.5, Algorithms 3.3 CNP and 3.4 NPBD).

Privacy (Conclusion 3.4).  Node ``x`` releases ``h_x + Lap(1 / eps_x)``.  One record changes one
bin, hence exactly the counts of the nodes on one root-to-leaf path, each by 1: the release is
``max_leaf sum_{y in Path(root, leaf)} eps_y``-DP (sequential composition along a path, parallel
across disjoint subtrees).  Equivalently, the strategy ``diag(eps) M_tree`` has
``Delta_1 = max_leaf sum_path eps`` with unit-scale noise.

Exact path sums (issue 16).  Every budget rule here returns budgets whose path sums are
``<= epsilon`` in exact rational arithmetic over the float values, without slack:
:func:`path_sum_bounds` adds along each path with every float addition rounded *up* (TwoSum gives the
exact rounding error of ``a + b``; the sum moves one float step up when it rounded down), so its
result is ``>=`` the exact sum; :func:`normalise_budget` scales the budgets down (``eps / bound``
and each product rounded toward 0) until that certified bound is ``<= epsilon``.  The change is a
few float steps, a relative ``~ (levels + 2) 2^-53`` (below ``1e-14`` in the tests): every path of
:func:`allocate_budget` sums to ``eps`` up to that.

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
from ..validation import check_epsilon, check_positive, check_vector
from .build import IntervalTree, as_interval_tree

__all__ = [
    "allocate_budget",
    "expected_range_error",
    "path_sums",
    "path_sum_bounds",
    "normalise_budget",
    "optimal_error",
    "level_budget",
    "uniform_budget",
]

_MAX_ROUNDS = 16


def cnp_coefficients(t: IntervalTree, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bottom-up (CNP): per node ``K_x`` and the share ``a_x / (1 + a_x)`` of its path budget.

    ``K_leaf = p_leaf``, ``K_x = (p_x^(1/3) + (sum_children K)^(1/3))^3`` and the share
    ``p_x^(1/3) / (p_x^(1/3) + (sum_children K)^(1/3))`` (1 where both are 0).  Used by
    :func:`allocate_budget` and, on one chunk's subtree, by :mod:`sparsedp.scaleout.lue`."""
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
    summing to ``epsilon`` (CNP + NPBD, Conclusion 3.5), normalised so that no path exceeds
    ``epsilon`` exactly (:func:`normalise_budget`).  A node with ``p_x = 0`` gets ``eps_x = 0``
    (it is not worth measuring).  ``O(nodes)``."""
    t = as_interval_tree(tree)
    eps = check_epsilon(epsilon, "epsilon")
    p = check_vector(probabilities, t.size, "probabilities")
    if np.any(p < 0):
        raise SparseDPError("probabilities must be >= 0")
    _, frac = cnp_coefficients(t, p)
    return normalise_budget(t, npbd_budgets(t, frac, eps)[0], eps)


def npbd_budgets(t: IntervalTree, frac: np.ndarray, psum: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-down (NPBD): ``eps_x = frac_x psum(x)`` with ``psum(root) = psum`` and ``psum(child) =
    psum(x) - eps_x``; ``(max(eps, 0), psum)`` per node.  Used by :func:`allocate_budget` and, from a
    chunk root's ``psum``, by :mod:`sparsedp.scaleout.lue`."""
    out = np.empty(t.size)
    left = np.empty(t.size)  # psum(x): budget left for the subtree of x
    left[0] = psum
    out[0] = frac[0] * psum
    for d in range(1, t.levels):
        sl = t.level(d)
        par = t.parent[sl]
        left[sl] = left[par] - out[par]
        out[sl] = frac[sl] * left[sl]
    return np.maximum(out, 0.0), left


def optimal_error(tree: Any, epsilon: float, probabilities: Any) -> float:
    """The minimum of :func:`expected_range_error` over path-feasible budgets: ``2 K_root / eps^2``."""
    t = as_interval_tree(tree)
    eps = check_positive(epsilon, "epsilon")
    K, _ = cnp_coefficients(t, check_vector(probabilities, t.size, "probabilities"))
    return float(2.0 * K[0] / eps**2)


def path_sums(tree: Any, eps_per_node: Any) -> np.ndarray:
    """``sum_{y in Path(root, leaf)} eps_y`` for every leaf, ordered by bin (Conclusion 3.4), in
    float arithmetic (rounded to nearest: for reporting; :func:`path_sum_bounds` certifies)."""
    t = as_interval_tree(tree)
    e = check_vector(eps_per_node, t.size, "eps_per_node")
    acc = e.copy()
    for d in range(1, t.levels):
        sl = t.level(d)
        acc[sl] += acc[t.parent[sl]]
    return acc[t.leaves]


def add_up(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` rounded up, elementwise: ``fl(a + b)``, one float step higher where TwoSum (Knuth) shows the
    rounding went down.  ``>= a + b`` exactly for finite ``a``, ``b`` (no overflow)."""
    s = a + b
    bp = s - a
    err = (a - (s - bp)) + (b - bp)  # exactly (a + b) - s
    return np.where(err > 0, np.nextafter(s, np.inf), s)


def path_sum_bounds(tree: Any, eps_per_node: Any) -> np.ndarray:
    """Certified upper bounds of ``sum_{y in Path(root, leaf)} eps_y`` for every leaf (by bin).

    Each addition along a path is rounded up (:func:`add_up`), so the result is ``>=`` the exact
    rational sum of the float budgets.  For a (validated) interval tree the bins covered by node
    ``y`` are those of the leaves below it, so ``max(path_sum_bounds)`` bounds
    ``max_j sum_{y : j in [lo_y, hi_y)} eps_y``, the ``Delta_1`` of ``diag(eps) M`` (``M`` the
    node-interval rows); the tests compare it with :func:`sparsedp.calibration.laplace_loss` of
    the explicit matrix and with :class:`fractions.Fraction` sums.  ``O(nodes)``.
    """
    t = as_interval_tree(tree)
    e = check_vector(eps_per_node, t.size, "eps_per_node")
    if np.any(e < 0):
        raise SparseDPError("eps_per_node must be >= 0")
    acc = e.copy()
    for d in range(1, t.levels):
        sl = t.level(d)
        acc[sl] = add_up(acc[t.parent[sl]], e[sl])
    return acc[t.leaves]


def normalise_budget(tree: Any, eps_per_node: Any, epsilon: float) -> np.ndarray:
    """Budgets scaled down just enough that every root-to-leaf path sums to ``<= epsilon`` exactly.

    While the certified bound ``B = max(path_sum_bounds)`` exceeds ``epsilon``: multiply every
    budget by ``epsilon / B`` rounded toward 0 and round each product toward 0.  The exact new sums
    are then ``<= epsilon``; the loop only absorbs the bound's own upward rounding (one or two
    rounds).  Budgets already within ``epsilon`` are returned unchanged.
    """
    t = as_interval_tree(tree)
    eps = check_positive(epsilon, "epsilon")
    e = check_vector(eps_per_node, t.size, "eps_per_node").copy()
    if np.any(e < 0):
        raise SparseDPError("eps_per_node must be >= 0")
    for _ in range(_MAX_ROUNDS):
        bound = float(path_sum_bounds(t, e).max())
        if bound <= eps:
            return e
        ratio = np.nextafter(eps / bound, 0.0)
        e = np.nextafter(e * ratio, 0.0)
    raise SparseDPError(f"could not normalise the budgets to epsilon {eps!r}")  # pragma: no cover


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
    """Boost (Hay et al. 2010): ``eps / levels`` on every node, so no path exceeds ``eps``
    (normalised: exactly)."""
    t = as_interval_tree(tree)
    eps = check_epsilon(epsilon, "epsilon")
    return normalise_budget(t, np.full(t.size, eps / t.levels), eps)


def level_budget(tree: Any, epsilon: float, probabilities: Any) -> np.ndarray:
    """Boost-UN: one budget per depth, ``eps_d`` proportional to ``P_d^(1/3)`` (``P_d`` the total
    coverage probability of depth ``d``), the minimiser of ``sum_d P_d / eps_d^2`` with
    ``sum_d eps_d = eps``; scaled so that the longest path sums to ``eps`` (normalised: exactly
    at most ``eps``)."""
    t = as_interval_tree(tree)
    eps = check_epsilon(epsilon, "epsilon")
    p = check_vector(probabilities, t.size, "probabilities")
    P = np.add.reduceat(p, t.level_start[:-1])
    share = np.cbrt(P)
    per_level = eps * share / share.sum()
    out = per_level[t.depth]
    return normalise_budget(t, out * (eps / path_sums(t, out).max()), eps)
