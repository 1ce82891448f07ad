"""Tree starts for the p-Identity family: ``Theta`` begins as the internal nodes of an interval tree.

A k-ary interval tree whose leaves are the cells *is* a p-Identity strategy: the identity is its
leaf level and its ``p`` internal nodes are 0/1 rows of ``Theta``.  With one weight ``c_l`` per level
(relative to the leaves, ``Theta = diag(c_level) T``) it is the weighted tree of
:mod:`sparsedp.optimize.weighted_tree`, normalised by the same ``D`` as every p-Identity strategy.

HDMM (McKenna et al., VLDB 2018, section 5.2) starts ``Theta`` at ``U[0, 1]`` entries.  For range
workloads that start is far from the optimum: every column has ``delta ~ p / 2``, and L-BFGS-B takes
thousands of ``O(p^2 n)`` steps to undo it.  Measured at ``n = 4096``, Laplace, all ranges plus
0.915 x the whole-domain query (issue 11): from the random start, 10000 iterations reached a range
MSE of 250.18 (eps = 1); from the 16-ary tree with fitted level weights, 750 iterations reached
248.9 (``benchmarks/bench_trees.py --pidentity-whole``).

:func:`tree_rows` chooses the tree: the smallest fan-out ``k >= 2`` whose internal nodes number at
most ``p`` (``p = 273`` gives the 16-ary tree over 4096 cells); rows left over start as small
random rows.  :func:`tree_start` fits the level weights by L-BFGS on ``log c`` with the exact
gradient ``df/dc_l = <df/dTheta, T_l>`` (chain rule through ``Theta = c_l T_l`` on level ``l``), then
returns the start.
"""

from __future__ import annotations

import numpy as np

from ..errors import SparseDPError
from .pidentity import PIdentityObjective, internal_nodes
from .search import Deadline, lbfgs

__all__ = ["PERTURB_SCALE", "internal_nodes", "perturbed_tree_start", "tree_fanout", "tree_rows", "tree_start"]


def tree_fanout(n: int, p: int) -> int:
    """The smallest ``k >= 2`` with ``internal_nodes(n, k) <= p`` (``n`` if none below it: the
    root alone).  ``internal_nodes`` does not increase with ``k``, so this is a bisection."""
    if n <= 2 or internal_nodes(n, 2) <= p:
        return 2
    lo, hi = 2, n  # internal_nodes(n, lo) > p, internal_nodes(n, n) = 1 <= p
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if internal_nodes(n, mid) <= p:
            hi = mid
        else:
            lo = mid
    return hi


def tree_rows(n: int, p: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``(T, level, k)``: the internal nodes of the k-ary tree (:func:`tree_fanout`) as 0/1 rows
    ``T`` (``q x n`` with ``q = internal_nodes(n, k) <= p``; the levels bottom-up, each row one
    block) and the level of each row (0 = the blocks of ``k`` cells, the root last)."""
    if p < 1:
        raise SparseDPError(f"p must be at least 1, got {p}")
    k = tree_fanout(n, p)
    blocks, level = [], []
    size, lev = k, 0
    while n > 1:
        size = min(size, n)
        starts = np.arange(0, n, size)
        blocks.append(np.stack([starts, np.minimum(starts + size, n)], axis=1))
        level.append(np.full(starts.size, lev))
        if size >= n:
            break
        size *= k
        lev += 1
    if not blocks:
        return np.zeros((0, n)), np.zeros(0, dtype=np.intp), k
    spans = np.concatenate(blocks)
    cols = np.arange(n)
    T = ((cols[None, :] >= spans[:, :1]) & (cols[None, :] < spans[:, 1:])).astype(np.float64)
    return T, np.concatenate(level).astype(np.intp), k


def tree_start(
    obj: PIdentityObjective,
    rng: np.random.Generator,
    *,
    maxiter: int = 60,
    deadline: Deadline | None = None,
) -> tuple[np.ndarray, str]:
    """A start ``Theta`` (``p x n``) for :class:`PIdentityObjective` ``obj``: the tree of
    :func:`tree_rows` with level weights ``c`` minimising ``f(diag(c_level) T)`` (L-BFGS on
    ``log c`` from ``c = 1``, at most ``maxiter`` iterations), and the rows beyond the tree's at
    ``U[0, 0.1] x min(c)`` (a zero row is a stationary point of ``f`` under ``Theta >= 0``: it
    would never move).  Also returns a description for the candidate's note."""
    n, p = obj.n, obj.p
    T, level, k = tree_rows(n, p)
    q, nl = T.shape[0], int(level.max()) + 1 if level.size else 0
    theta = np.zeros((p, n))
    c = np.ones(nl)
    if nl:

        def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
            cu = np.exp(u)
            theta[:q] = cu[level][:, None] * T
            f, g = obj(theta.ravel())
            g = g.reshape(p, n)[:q]
            return f, np.bincount(level, weights=np.einsum("ij,ij->i", g, T), minlength=nl) * cu

        res = lbfgs(fun, np.zeros(nl), deadline=deadline, maxiter=maxiter, ftol=1e-12, gtol=1e-10)
        c = np.exp(res.x)
        theta[:q] = c[level][:, None] * T
    if q < p:
        scale = float(c.min()) if nl else 1.0
        theta[q:] = rng.uniform(0.0, 0.1 * scale, size=(p - q, n))
    weights = ", ".join(f"{v:.3g}" for v in c)
    return theta, f"{k}-ary tree start ({q} of {p} rows, level weights {weights})"


#: Entries of :func:`perturbed_tree_start`'s perturbation: ``U[0, PERTURB_SCALE * min(c)]``.
PERTURB_SCALE = 1.0


def perturbed_tree_start(
    obj: PIdentityObjective,
    rng: np.random.Generator,
    *,
    scale: float = PERTURB_SCALE,
    maxiter: int = 60,
    deadline: Deadline | None = None,
) -> tuple[np.ndarray, str]:
    """:func:`tree_start` plus ``U[0, scale * min(c)]`` on every entry of ``Theta``.

    The tree start has zeros wherever a row's block does not cover a column; under ``Theta >= 0``
    (Laplace) L-BFGS-B keeps an entry at its bound while the gradient pushes it down, so the search
    stays near the tree's sparsity pattern -- a local optimum on some workloads (all ranges at
    ``n = 256``: ``2.1552e6``, above the ``2.1344e6`` a ``U[0, 1]`` start reaches in 1000
    iterations).  With every entry positive the search keeps the tree's head start and reaches the
    random start's basin: measured at ``n = 256`` (Laplace, ``p = 17``), 100 evaluations reach
    13,781 on prefix sums (tree start 13,774, ``U[0, 1]`` 14,203) and 2.1461e6 on all ranges (tree
    2.1571e6, ``U[0, 1]`` 2.1489e6)."""
    theta, how = tree_start(obj, rng, maxiter=maxiter, deadline=deadline)
    c = theta.max(axis=1)
    floor = float(c[c > 0].min()) if np.any(c > 0) else 1.0
    theta = theta + rng.uniform(0.0, scale * floor, size=theta.shape)
    return theta, how.replace("tree start", f"tree start + U[0, {scale:g} min c]", 1)
