"""Choosing which levels of a complete tree to measure, and their weights.

With pure DP the level precisions are ``a_l = q_l^2 / Var`` (:mod:`~sparsedp.optimize.params`):
splitting a share between two levels loses (``q_1^2 + q_2^2 < (q_1 + q_2)^2``), so the exact error
``E(q) = sum_j c_j / lambda_j`` of :mod:`~sparsedp.optimize.tree_spectral` has a local minimum on
(nearly) every subset of levels, and a gradient method started from one subset stays near it.
The choice of levels is the choice of the tree's radices (a level of share 0 is absent), so it is
searched combinatorially: the value of a subset ``S`` of levels is the optimum of the continuous
problem restricted to ``S`` (L-BFGS-B on ``q = u / sum(u)``, ``u >= tiny``), and a local search
toggles one level in or out, or moves one level up or down, taking the first neighbour that
improves the exact error, from several starting subsets (every k-ary tree the levels contain).
Subsets are cached, so each is optimised once; the winner is re-solved to full accuracy.  Gaussian noise makes ``E`` convex in ``q`` (``a_l = q_l / Var``); the
search then ends at its first round.
"""

from __future__ import annotations

import numpy as np

from .calibrate import NoiseModel
from .params import LevelShares, precision, precision_pullback
from .search import Deadline, lbfgs
from .tree_spectral import level_error

__all__ = ["LevelSearch"]


class LevelSearch:
    """Best level shares of one complete tree (closed-form error ``c``, block sizes ``sizes``)."""

    def __init__(self, c: np.ndarray, sizes: np.ndarray, model: NoiseModel, deadline: Deadline | None = None):
        self.c = np.asarray(c, dtype=np.float64)
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.model = model
        self.deadline = deadline
        self.L = self.sizes.size
        self._cache: dict[frozenset, tuple[float, np.ndarray]] = {}

    def value(self, subset: frozenset, start: np.ndarray | None = None, ftol: float = 1e-10) -> tuple[float, np.ndarray]:
        """Optimal error and full share vector with support in ``subset`` (must contain level 0),
        from ``start`` shares (uniform on the subset by default); cached per subset."""
        if subset in self._cache:
            return self._cache[subset]
        idx = np.array(sorted(subset))
        shares = LevelShares(idx.size)

        def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
            q = np.zeros(self.L)
            q[idx] = shares.shares(u)
            E, dEa = level_error(self.c, self.sizes, precision(q, self.model))
            return E, shares.pullback(u, precision_pullback(q[idx], dEa[idx], self.model))

        u0 = np.full(idx.size, 1.0 / idx.size) if start is None else np.maximum(start[idx], 1e-3 / idx.size)
        res = lbfgs(fun, u0, bounds=shares.bounds, maxiter=300, ftol=ftol, gtol=1e-12)
        q = np.zeros(self.L)
        q[idx] = shares.shares(res.x)
        self._cache[subset] = (res.fun, q)
        return res.fun, q

    def _moved(self, q: np.ndarray, old: frozenset, new: frozenset) -> np.ndarray:
        """Warm start for a neighbour: the current shares, a moved level keeping its share, an
        added level a fair share."""
        start = q.copy()
        gone, came = sorted(old - new), sorted(new - old)
        if gone and came:
            start[came[0]] = q[gone[0]]
        elif came:
            start[came[0]] = 1.0 / len(new)
        for g in gone:
            start[g] = 0.0
        return start

    def _neighbours(self, subset: frozenset) -> list[frozenset]:
        out = []
        for lev in range(1, self.L):
            out.append(subset ^ {lev})  # toggle
        for lev in subset:
            if lev == 0:
                continue
            for new in (lev - 1, lev + 1):
                if 1 <= new < self.L and new not in subset:
                    out.append((subset - {lev}) | {new})
        return out

    def run(self, starts: list[frozenset], max_rounds: int = 100) -> tuple[float, np.ndarray]:
        """Local search from each start (first improvement, neighbours warm-started from the
        current shares); the best subset is then re-solved to full accuracy.  Returns ``(E, q)``."""
        best: tuple[float, np.ndarray, frozenset] = (np.inf, np.zeros(self.L), frozenset({0}))
        for start in starts:
            cur = frozenset(start) | {0}
            cur_val = self.value(cur)
            for _ in range(max_rounds):
                if self.deadline is not None and self.deadline.expired():
                    break
                improved = False
                for s in self._neighbours(cur):
                    val = self.value(s, self._moved(cur_val[1], cur, s))
                    if val[0] < cur_val[0] * (1.0 - 1e-9):
                        cur, cur_val, improved = s, val, True
                        break
                if not improved:
                    break
            if cur_val[0] < best[0]:
                best = (cur_val[0], cur_val[1], cur)
            if self.deadline is not None and self.deadline.expired():
                break
        if not np.isfinite(best[0]):
            return best[0], best[1]
        del self._cache[best[2]]
        polished = self.value(best[2], best[1], ftol=1e-15)
        return min(polished, (best[0], best[1]), key=lambda t: t[0])
