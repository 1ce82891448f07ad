"""Parametrisations of weighted trees that satisfy the sensitivity constraint exactly.

A weighted interval tree measures node ``u`` as ``w_u x(I_u)``.  At unit budget its noise variance
is ``Var / w_u^2`` (:mod:`~sparsedp.optimize.calibrate`), i.e. its *precision* is
``a_u = w_u^2 / Var``.  Every leaf lies in one node per level on its root-to-leaf path, so

* pure DP (Laplace): ``Delta_1 = max_paths sum_u w_u``; the *path share* is ``q_u = w_u``;
* zCDP (Gaussian): ``Delta_2^2 = max_paths sum_u w_u^2``; the path share is ``q_u = w_u^2``;

and ``Delta = 1`` iff the shares sum to 1 along every path.  Precision ``a_u = q_u^e / Var`` with
``e = 2`` (Laplace) or ``e = 1`` (Gaussian).

* :class:`LevelShares`: one share per level, ``q = u / sum(u)`` with ``u >= tiny`` (every path
  has one node per level).  Box constraints rather than a softmax: L-BFGS-B's projected steps
  bring a share back from its bound, where a softmax logit saturates and stays stuck.
* :class:`NodeSplit`: one share per node by a top-down split of the budget: the root keeps
  ``s_root`` of the path budget 1, a node with remaining budget ``r_u`` keeps ``q_u = r_u s_u`` and
  passes ``r_u (1 - s_u)`` to each child; leaves keep everything (``s = 1``), so every path sums to
  exactly 1; ``s_u`` in a box ``[tiny, 1 - tiny]``.  This is the parametrisation of budget
  allocations on trees of Cormode et al. (ICDE 2012) and seed 004 (eq. 3.6), here with the exact
  GLS error as the objective.  Its gradient is one bottom-up pass (reverse mode of the top-down
  recursion).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..strategies import TreeLayout
from .calibrate import NoiseModel

__all__ = [
    "LevelShares",
    "NodeSplit",
    "level_to_node",
    "node_to_level",
    "normalised",
    "normalised_pullback",
    "precision",
    "precision_pullback",
]


def precision(q: np.ndarray, model: NoiseModel) -> np.ndarray:
    """``a = q^e / Var`` (``e = 2`` Laplace, ``1`` Gaussian)."""
    return (q * q if model.p == 1 else q) / model.sigma2


def precision_pullback(q: np.ndarray, dE_da: np.ndarray, model: NoiseModel) -> np.ndarray:
    """``dE/dq`` from ``dE/da``."""
    return dE_da * ((2.0 * q) if model.p == 1 else 1.0) / model.sigma2


def normalised(u: np.ndarray) -> np.ndarray:
    """``q = u / sum(u)``."""
    return u / u.sum()


def normalised_pullback(u: np.ndarray, dE_dq: np.ndarray) -> np.ndarray:
    """``dE/du`` for ``q = u / sum(u)``: ``(g - <g, q>) / sum(u)``."""
    total = u.sum()
    return (dE_dq - float(np.dot(dE_dq, u / total))) / total


@dataclass(frozen=True)
class LevelShares:
    """One path share per level, ``q = u / sum(u)`` on the box ``u >= lower`` (leaves first)."""

    levels: int
    lower: float = 1e-15

    @property
    def bounds(self) -> tuple[float, None]:
        return (self.lower, None)

    def shares(self, u: np.ndarray) -> np.ndarray:
        return normalised(u)

    def pullback(self, u: np.ndarray, dE_dq: np.ndarray) -> np.ndarray:
        return normalised_pullback(u, dE_dq)

    def start(self, q: np.ndarray) -> np.ndarray:
        """Parameters reproducing given shares (clipped to the box)."""
        q = np.asarray(q, dtype=np.float64)
        return np.maximum(q / q.sum(), self.lower)


class NodeSplit:
    """Top-down split of the path budget on a :class:`~sparsedp.strategies.TreeLayout`.

    Parameters are the kept fractions ``s`` of the inner nodes (strategy rows
    ``0 : row_offsets[0]``, root first) in the box ``[lower, 1 - lower]``; leaves keep their whole
    remaining budget.
    """

    lower = 1e-12

    def __init__(self, layout: TreeLayout):
        self.layout = layout
        self.inner = int(layout.row_offsets[0])  # rows of the inner nodes: 0 .. inner - 1
        self._counts = [np.diff(cs) for cs in layout.child_starts]

    @property
    def bounds(self) -> tuple[float, float]:
        return (self.lower, 1.0 - self.lower)

    def _split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lay = self.layout
        s = np.ones(lay.nodes)
        s[: self.inner] = x
        r = np.empty(lay.nodes)
        r[lay.row_offsets[lay.levels - 1]] = 1.0
        for lev in range(lay.levels - 1, 0, -1):
            passed = lay.level_rows(r, lev) * (1.0 - lay.level_rows(s, lev))
            off = lay.row_offsets[lev - 1]
            r[off : off + lay.sizes[lev - 1]] = np.repeat(passed, self._counts[lev - 1])
        return s, r

    def shares(self, x: np.ndarray) -> np.ndarray:
        s, r = self._split(x)
        return r * s

    def pullback(self, x: np.ndarray, dE_dq: np.ndarray) -> np.ndarray:
        """``dE/ds`` by one bottom-up pass: ``R_u = dE/dr_u = g_u s_u + (1 - s_u) sum_c R_c``,
        ``dE/ds_u = r_u (g_u - sum_c R_c)``."""
        lay = self.layout
        s, r = self._split(x)
        g = np.asarray(dE_dq, dtype=np.float64)
        R = np.empty(lay.nodes)
        out = np.empty(lay.nodes)
        R[lay.row_offsets[0] :] = g[lay.row_offsets[0] :]
        for lev in range(1, lay.levels):
            child = lay.level_rows(R, lev - 1)
            Rc = np.add.reduceat(child, lay.child_starts[lev - 1][:-1])
            off = lay.row_offsets[lev]
            sl = slice(off, off + lay.sizes[lev])
            R[sl] = g[sl] * s[sl] + (1.0 - s[sl]) * Rc
            out[sl] = r[sl] * (g[sl] - Rc)
        return out[: self.inner]

    def start(self, q: np.ndarray) -> np.ndarray:
        """Parameters reproducing given per-node shares whose paths sum to 1 (top-down)."""
        lay = self.layout
        q = np.asarray(q, dtype=np.float64)
        r = np.empty(lay.nodes)
        r[lay.row_offsets[lay.levels - 1]] = 1.0
        for lev in range(lay.levels - 1, 0, -1):
            passed = lay.level_rows(r, lev) - lay.level_rows(q, lev)
            off = lay.row_offsets[lev - 1]
            r[off : off + lay.sizes[lev - 1]] = np.repeat(passed, self._counts[lev - 1])
        s = q[: self.inner] / np.maximum(r[: self.inner], 1e-300)
        return np.clip(s, self.lower, 1.0 - self.lower)


def level_to_node(layout: TreeLayout, per_level: np.ndarray) -> np.ndarray:
    """Expand one value per level (leaves first) to one per strategy row (root first)."""
    out = np.empty(layout.nodes)
    for lev in range(layout.levels):
        off = layout.row_offsets[lev]
        out[off : off + layout.sizes[lev]] = per_level[lev]
    return out


def node_to_level(layout: TreeLayout, per_node: np.ndarray) -> np.ndarray:
    """Sum a per-row array over each level (leaves first)."""
    return np.array([float(layout.level_rows(per_node, lev).sum()) for lev in range(layout.levels)])
