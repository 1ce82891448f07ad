"""Struct-Construct (SC, seed 004 Algorithm 3.1): greedy choice of the branching of every node.

1. The global branching ``k = argmin_{2 <= w <= U} E_w``, ``E_w = 2 Delta_w^2 / eps^2 sum_x p_x``
   (eq. 3.2) for the balanced ``w``-ary tree, ``Delta_w`` its number of levels (uniform budget).
2. Nodes with ``L(x) = 1`` (on the leftmost path) are split ``k``-ary; every other node picks
   ``w in [k, U]`` minimising the subtree value ``H(L(x), R(x), w)`` (Definition 3.4): the sum of
   the coverage probabilities of the balanced ``w``-ary subtree of ``[L(x), R(x)]``, ``x``
   included.  (``x``'s own term does not depend on ``w``.)

Computing ``H`` in O(1).  For a node at offsets ``a..b`` from ``lo`` (``[lo + a, lo + b)``),
``N = (A + a)(C - b)`` with ``A = lo + 1``, ``C = n - lo + 1``.  The sum over a subtree of
``N(y) - N(parent y)`` is therefore ``A C s0 - A sb + C sa - sab`` for the moments
``(s0, sa, sb, sab)`` of signed offsets (``+1`` per non-root node, ``-deg(u)`` per internal node).
The moments of the balanced ``w``-ary subtree depend only on ``(m, w)`` (``m`` bins); children have
``q`` or ``q + 1`` bins, so they are memoised and shared, and one depth of the tree is chosen for
all its nodes at once: the whole SC tree costs ``O(U * nodes)`` vectorised work, not the seed's
``O(U n log n)``.
"""

from __future__ import annotations

from functools import lru_cache

import networkx as nx
import numpy as np

from ..errors import ShapeError
from ..workloads import _check_n
from .build import IntervalTree, grow, kary_height, to_graph

__all__ = ["sc_layout", "sc_tree", "subtree_coverage", "choose_branching", "kary_coverage_sum"]


def _shift(mom: tuple[float, float, float, float], o: float) -> tuple[float, float, float, float]:
    s0, sa, sb, sab = mom
    return s0, sa + o * s0, sb + o * s0, sab + o * (sa + sb) + o * o * s0


@lru_cache(maxsize=None)
def _moments(m: int, w: int) -> tuple[float, float, float, float]:
    """Signed offset moments of the balanced ``w``-ary subtree over ``m`` bins (root excluded as a
    node, included as a parent)."""
    if m <= 1:
        return 0.0, 0.0, 0.0, 0.0
    k = min(w, m)
    q, r = divmod(m, k)
    s0, sa, sb, sab = -float(k), 0.0, -float(k) * m, 0.0
    o = 0
    for j in range(k):
        size = q + (j >= k - r)
        c = _shift((1.0, 0.0, float(size), 0.0), o)
        d = _shift(_moments(size, w), o)
        s0, sa, sb, sab = s0 + c[0] + d[0], sa + c[1] + d[1], sb + c[2] + d[2], sab + c[3] + d[3]
        o += size
    return s0, sa, sb, sab


def _subtree_sums(n: int, lo: np.ndarray, hi: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """``|Q_all| * (H - p_x)`` for the nodes ``[lo, hi)`` and every branching in ``ws`` (one row
    per ``w``): the descendants' coverage in counts."""
    sizes, inv = np.unique(hi - lo, return_inverse=True)
    inv = inv.ravel()
    A = lo + 1.0
    C = n - lo + 1.0
    out = np.empty((len(ws), lo.size))
    for i, w in enumerate(ws):
        mom = np.array([_moments(int(s), int(w)) for s in sizes]).T
        s0, sa, sb, sab = (m[inv] for m in mom)
        out[i] = A * C * s0 - A * sb + C * sa - sab
    return out


def subtree_coverage(n: int, lo: int, hi: int, w: int, parent: tuple[int, int] | None = None) -> float:
    """``H(L, R, w)`` of Definition 3.4 for the node ``[lo, hi)`` (0-based, half-open) whose parent
    covers ``parent = (plo, phi)`` (``None`` for the root): the sum of the uniform coverage
    probabilities of its balanced ``w``-ary subtree, itself included.

    Example 3.4: ``subtree_coverage(5, 2, 5, 2, parent=(0, 5))`` is 0.9333 and with ``w = 3`` it is 1.0.
    """
    n = _check_n(n)
    own = (lo + 1.0) * (n - hi + 1.0) - (0.0 if parent is None else (parent[0] + 1.0) * (n - parent[1] + 1.0))
    rest = _subtree_sums(n, np.array([lo]), np.array([hi]), np.array([int(w)]))[0, 0]
    return float((own + rest) / (n * (n + 1) / 2.0))


def kary_coverage_sum(n: int, k: int) -> float:
    """``sum_x p_x`` over the balanced ``k``-ary tree on ``n`` bins (uniform queries), in O(log n)."""
    return subtree_coverage(n, 0, n, k)


def choose_branching(n: int, upper: int = 20) -> int:
    """Step 1 of SC: ``argmin_{2 <= w <= upper} Delta_w^2 sum_x p_x`` (eq. 3.2, uniform budget)."""
    n = _check_n(n)
    if int(upper) != upper or upper < 2:
        raise ShapeError(f"upper must be an integer >= 2, got {upper!r}")
    cost = [kary_height(n, w) ** 2 * kary_coverage_sum(n, w) for w in range(2, int(upper) + 1)]
    return 2 + int(np.argmin(cost))


def sc_layout(n: int, k: int | None = None, upper: int = 20) -> IntervalTree:
    """The SC tree (Algorithm 3.1) as flat arrays; ``k=None`` chooses it by :func:`choose_branching`."""
    n = _check_n(n)
    if int(upper) != upper or upper < 2:
        raise ShapeError(f"upper must be an integer >= 2, got {upper!r}")
    k = choose_branching(n, upper) if k is None else int(k)
    if k < 2 or k > upper:
        raise ShapeError(f"k must lie in [2, upper={upper}], got {k}")
    ws = np.arange(k, int(upper) + 1)

    def choose(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        out = np.full(lo.size, k, dtype=np.int64)
        free = np.flatnonzero(lo > 0)
        if free.size and ws.size > 1:
            out[free] = ws[np.argmin(_subtree_sums(n, lo[free], hi[free], ws), axis=0)]
        return out

    return grow(n, choose)


def sc_tree(n: int, k: int | None = None, upper: int = 20) -> nx.DiGraph:
    """The SC tree (Algorithm 3.1) as a networkx graph (see :func:`sc_layout`)."""
    return to_graph(sc_layout(n, k, upper))
