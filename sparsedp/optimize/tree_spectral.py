"""Closed-form GLS error of a complete interval tree with one weight per level, in ``O(levels^2)``.

A *complete* tree over ``n`` leaves has radices ``r_1, ..., r_L`` (bottom-up) with
``n = r_1 ... r_L``: level ``l`` holds ``n / s_l`` nodes, each the sum of ``s_l = r_1 ... r_l``
consecutive leaves (level 0 = the leaves, level ``L`` = the root).  Level ``l`` is measured with
weight ``w_l``, so its rows have noise variance ``v_l = Var / w_l^2`` once the weighted strategy is
calibrated at unit budget.

Spectral form.  ``M_l^T M_l = s_l Q_l`` with ``Q_l`` the orthogonal projector onto vectors constant on
the level-``l`` blocks.  The partitions are nested, so the ``Q_l`` commute and
``Pi_j = Q_j - Q_{j+1}`` (``Q_{L+1} = 0``) are orthogonal projectors that sum to ``I``.  Hence

    P = M^T V^{-1} M = sum_l a_l s_l Q_l = sum_j lambda_j Pi_j,   lambda_j = sum_{l <= j} s_l a_l,

(``a_l = 1 / v_l``, the level precisions) and the total squared GLS error of a workload ``W`` is

    E = tr(P^{-1} W^T W) = sum_j c_j / lambda_j,   c_j = tr(Pi_j W^T W) = t_j - t_{j+1},
    t_l = tr(Q_l W^T W) = (1 / s_l) sum_B ||W 1_B||^2   (B the level-l blocks).

The ``c_j`` depend on the workload and the radices only; they cost ``L`` evaluations of
:func:`~sparsedp.optimize.gram.block_sq_norms` (``O(n)`` each for prefix, all-range and range-list
workloads), after which the error and its gradient
``dE/da_l = -s_l sum_{j >= l} c_j / lambda_j^2`` cost ``O(L)``.  This is exact: the tests compare
it with dense ``tr(W (M^T V^-1 M)^-1 W^T)`` and with :func:`sparsedp.expected_error`.  It
generalises the observation of Hay et al. (VLDB 2010) that the uniform-budget tree is diagonalised by
a Haar-like basis to any per-level budgets and any workload.

For ``n = 2^m`` the binary tree contains every power-of-two radix sequence as a limit (a level of
weight 0 is a level that is not there), so optimising its ``m + 1`` weights searches all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import permutations

import numpy as np

from ..operators import Operator
from ..strategies import TreeLayout
from .gram import block_sq_norms

__all__ = ["BlockTraces", "CompleteTree", "collapse", "detail_traces", "level_error", "prime_factors", "radix_orders"]


@dataclass(frozen=True)
class CompleteTree:
    """A complete interval tree given by its radices ``r_1, ..., r_L`` (bottom-up)."""

    n: int
    radices: tuple[int, ...]

    def __post_init__(self) -> None:
        if math.prod(self.radices) != self.n or any(r < 2 for r in self.radices):
            raise ValueError(f"radices {self.radices} do not multiply to n = {self.n}")

    @property
    def sizes(self) -> np.ndarray:
        """Leaves per node of each level, ``s_0 = 1, ..., s_L = n``."""
        return np.concatenate(([1.0], np.cumprod(np.asarray(self.radices, dtype=np.float64))))

    @property
    def levels(self) -> int:
        return len(self.radices) + 1

    def layout(self) -> TreeLayout:
        """The tree as a :class:`~sparsedp.strategies.TreeLayout` (level ``l`` groups ``r_{l+1}``)."""
        radices = self.radices
        return TreeLayout.grouped(self.n, lambda level, m: radices[level])


class BlockTraces:
    """``t(s) = tr(Q_s W^T W) = (1 / s) sum_B ||W 1_B||^2`` per block size ``s``, computed once each
    (the trees tried share most block sizes).  For a weighted union ``W^T W = sum_i c_i W_i^T W_i``
    it is ``sum_i c_i t_i(s)``, each part in its own closed form
    (:func:`~sparsedp.optimize.gram.block_sq_norms`)."""

    def __init__(self, W: Operator):
        self.W = W
        self._t: dict[int, float] = {}

    def t(self, size: int) -> float:
        size = int(size)
        if size not in self._t:
            self._t[size] = block_sq_norms(self.W, size) / size
        return self._t[size]

    def details(self, tree: CompleteTree) -> np.ndarray:
        """``c_j = tr(Pi_j W^T W)`` for ``j = 0 .. L`` (non-negative; rounding clipped at 0)."""
        t = np.array([self.t(int(s)) for s in tree.sizes] + [0.0])
        return np.maximum(t[:-1] - t[1:], 0.0)


def detail_traces(W: Operator, tree: CompleteTree) -> np.ndarray:
    """``c_j = tr(Pi_j W^T W)`` for ``j = 0 .. L`` (see :class:`BlockTraces`)."""
    return BlockTraces(W).details(tree)


def level_error(c: np.ndarray, sizes: np.ndarray, a: np.ndarray) -> tuple[float, np.ndarray]:
    """``E = sum_j c_j / lambda_j`` and ``dE/da`` for level precisions ``a`` (``a_0 > 0``)."""
    lam = np.cumsum(sizes * a)
    ratio = c / (lam * lam)
    grad = -sizes * np.cumsum(ratio[::-1])[::-1]
    return float(np.sum(c / lam)), grad


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n`` with multiplicity, ascending."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def radix_orders(n: int, limit: int = 12, rng: np.random.Generator | None = None) -> list[tuple[int, ...]]:
    """Distinct orderings of ``n``'s prime factors as radix sequences (at most ``limit``).

    Ascending and descending first, then further distinct orderings (enumerated when there are few,
    sampled otherwise).  Every complete tree over ``n`` is a coarsening (levels of weight 0) of one of
    the orderings.  ``n = 1`` has no radices.
    """
    factors = prime_factors(n)
    if not factors:
        return [()]
    seen: list[tuple[int, ...]] = []
    for cand in (tuple(factors), tuple(reversed(factors))):
        if cand not in seen:
            seen.append(cand)
    if len(set(factors)) > 1:
        if len(factors) <= 8:
            for perm in permutations(factors):
                if len(seen) >= limit:
                    break
                if perm not in seen:
                    seen.append(perm)
        else:
            gen = rng if rng is not None else np.random.default_rng(0)
            for _ in range(20 * limit):
                if len(seen) >= limit:
                    break
                perm = tuple(int(f) for f in gen.permutation(factors))
                if perm not in seen:
                    seen.append(perm)
    return seen[:limit]


def collapse(tree: CompleteTree, q: np.ndarray, tol: float = 1e-9) -> tuple[CompleteTree, np.ndarray]:
    """Drop the inner levels whose path share ``q_l`` is below ``tol`` times the largest (a level of
    weight ~0 measures nothing): their children attach to their parents, radices multiply.  The
    leaves and the root are kept (an unused root with a share of ``tol``); the shares returned
    sum to 1."""
    q = np.asarray(q, dtype=np.float64)
    keep = q >= tol * q.max()
    keep[0] = keep[-1] = True
    q = np.where(keep, np.maximum(q, tol * q.max()), 0.0)  # the root stays, with a tiny share if unused
    radices: list[int] = []
    acc = 1
    for lev, r in enumerate(tree.radices, start=1):
        acc *= r
        if keep[lev]:
            radices.append(acc)
            acc = 1
    kept = q[keep]
    return CompleteTree(tree.n, tuple(radices)), kept / kept.sum()
