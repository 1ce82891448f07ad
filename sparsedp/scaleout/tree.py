"""A balanced k-ary hierarchy cut into chunk subtrees and a top tree (the shape of a scale-out release).

The tree is the one of :func:`sparsedp.strategies.hierarchical` (``TreeLayout.balanced(n, k)``):
level 0 holds the ``n`` leaves, each level above groups ``k`` consecutive nodes of the level below
(the last group may be smaller) until one root remains.  With a chunk length ``c = k^j``
(``1 <= c <= n``) the nodes of levels ``0 .. j`` split into ``m = ceil(n / c)`` disjoint subtrees:
chunk ``q`` holds the leaves ``[q c, min((q + 1) c, n))`` and every node above them up to its
root at level ``j`` (``c`` is a multiple of every ``k^l``, ``l <= j``, so the groups of each level
never straddle a chunk boundary).  The last chunk may be shorter; its subtree is grouped the same
way and, where one node is left before level ``j``, continues as a chain of single-child nodes,
exactly as the global grouping does.  The levels above ``j`` form the *top tree*: the balanced
k-ary tree over the ``m`` chunk roots (``TreeLayout.balanced(m, k)``, whose leaves are the chunk
roots).  Chunk boundaries that are not multiples of a power of ``k`` would cut a group: such a
chunking has no subtree decomposition and is refused (:func:`check_chunking`).

Budgets are per level (every root-to-leaf path crosses each level once): ``eps_l`` for the
``L`` levels, root first, with ``sum_l eps_l <= epsilon`` certified (additions rounded up);
uniform (Boost, Hay et al. 2010): ``eps / L`` per level.  Node scales are the tree publishers'
``b_l = (1 + m) / eps_l`` rounded up (``m = 2^-40 + nodes levels 2^-58``,
:func:`sparsedp.trees.publishers._node_scales`), so a balanced tree measured here has the scales of
:class:`~sparsedp.trees.Boost` on the same tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..strategies import TreeLayout
from ..tree_estimator import LevelPlan, two_pass_plan
from ..validation import check_epsilon

__all__ = ["ChunkedTree", "chunk_layout", "check_chunking", "default_chunk", "level_budgets", "level_coverage"]

#: Default target chunk length (leaves): the largest ``k^j`` at most this (about 70 MB of work per task).
DEFAULT_CHUNK = 2**20


def _is_power(c: int, k: int) -> bool:
    while c > 1 and c % k == 0:
        c //= k
    return c == 1


def _power(c: int, k: int) -> int:
    j = 0
    while c > 1:
        c //= k
        j += 1
    return j


def default_chunk(n: int, k: int, target: int = DEFAULT_CHUNK) -> int:
    """The largest ``k^j <= min(n, target)`` (at least 1)."""
    c = 1
    while c * k <= min(int(n), int(target)):
        c *= k
    return c


def check_chunking(chunks: tuple[int, ...], k: int) -> int:
    """The chunk length ``c = k^j`` of a chunking (block lengths in order), or raise.

    Every block but the last must hold the same ``k^j`` leaves and the last at most that many:
    only then is every block a subtree of the balanced k-ary tree."""
    sizes = [int(s) for s in chunks]
    if not sizes or any(s < 1 for s in sizes):
        raise ShapeError(f"empty chunks in {tuple(sizes)[:8]}")
    c = sizes[0]
    if any(s != c for s in sizes[:-1]) or sizes[-1] > c or not _is_power(c, k):
        shown = ", ".join(str(s) for s in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
        raise SparseDPError(
            f"chunks ({shown}) are not subtrees of a {k}-ary tree: every chunk but the last must hold the same "
            f"k^j leaves (e.g. {default_chunk(sum(sizes), k)}) and the last at most that many; rechunk the data "
            f"(pass chunk=k**j) to cut it at subtree boundaries"
        )
    return c


def chunk_layout(length: int, k: int, levels: int) -> TreeLayout:
    """The subtree of a chunk of ``length`` leaves with exactly ``levels`` levels (``length <= k^(levels-1)``):
    groups of ``k`` level by level as :meth:`TreeLayout.balanced`, continued by single-child nodes
    when one node is left early (a short last chunk)."""
    length, k, levels = int(length), int(k), int(levels)
    if length < 1 or levels < 1 or length > k ** (levels - 1):
        raise ShapeError(f"a chunk of {length} leaves does not fit a {levels}-level {k}-ary subtree")
    sizes = [length]
    child_starts: list[np.ndarray] = []
    leaf_starts = [np.arange(length + 1, dtype=np.int64)]
    for _ in range(levels - 1):
        m = sizes[-1]
        parents = -(-m // k)
        starts = np.minimum(np.arange(parents + 1, dtype=np.int64) * k, m)
        child_starts.append(starts)
        leaf_starts.append(leaf_starts[-1][starts])
        sizes.append(parents)
    offsets, acc = [], 0
    for size in reversed(sizes):
        offsets.append(acc)
        acc += size
    return TreeLayout(n=length, sizes=tuple(sizes), child_starts=tuple(child_starts),
                      leaf_starts=tuple(leaf_starts), row_offsets=tuple(reversed(offsets)))


def add_up(a: float, b: float) -> float:
    """``a + b`` rounded up (TwoSum)."""
    s = a + b
    bp = s - a
    err = (a - (s - bp)) + (b - bp)
    return math.nextafter(s, math.inf) if err > 0 else s


def _path_bound(eps: np.ndarray) -> float:
    """Certified ``>=`` bound of ``sum(eps)`` added root first (as ``path_sum_bounds``)."""
    acc = float(eps[0])
    for e in eps[1:]:
        acc = add_up(acc, float(e))
    return acc


def _contain_sum(n: int, s: int) -> tuple[int, int]:
    """For the level of node width ``s`` (nodes ``[i s, min((i + 1) s, n))``): the exact sum over its
    nodes of ``N(x) = (lo + 1)(n - hi + 1)`` (ranges containing ``x``), and ``N`` of its last node."""
    F = n // s  # full nodes
    a = n + 1 - s
    total = s * (a - 1) * F * (F - 1) // 2 - s * s * (F - 1) * F * (2 * F - 1) // 6 + a * F
    last = (F - 1) * s + 1 if n % s == 0 else F * s + 1  # the last node ends at n: N = lo + 1
    if n % s:
        total += F * s + 1
    return total, last


def level_coverage(n: int, k: int) -> np.ndarray:
    """``P_d``, root first: the expected number of nodes of depth ``d`` in the canonical decomposition of
    a uniformly random range (all ``n (n + 1) / 2`` ranges equally likely) on the tree of
    ``hierarchical(n, k)`` -- the per-depth sums of :func:`sparsedp.trees.coverage_probabilities`
    (eq. 3.5: ``p_x = (N(x) - N(parent x)) / (n (n + 1) / 2)``), in exact integer arithmetic from
    closed forms per level, ``O(levels)`` (no node is enumerated)."""
    n, k = int(n), int(k)
    widths = [1]
    while -(-n // widths[-1]) > 1:
        widths.append(widths[-1] * k)
    sums = [_contain_sum(n, s) for s in widths]  # leaves first
    out = []
    for lev, s in enumerate(widths):
        S, _ = sums[lev]
        if lev + 1 < len(widths):
            M = -(-n // s)
            Sp, last_parent = sums[lev + 1]
            Mp = -(-M // k)
            short = k - (M - (Mp - 1) * k)  # missing children of the last parent
            S -= k * Sp - short * last_parent
        out.append(S / (n * (n + 1) / 2))
    return np.array(out[::-1])


def level_budgets(levels: int, epsilon: float, weights: object = None) -> np.ndarray:
    """Per-level budgets (root first) whose certified sum is at most ``epsilon``.

    ``weights=None``: uniform, ``eps / levels`` per level (Boost); else per-level budgets
    proportional to ``weights`` (``levels`` positive numbers, root first), e.g. Boost-UN's
    ``P_d^(1/3)``.  Scaled down (rounding toward 0) until the certified sum fits, as
    :func:`sparsedp.trees.budget.normalise_budget` does."""
    eps = check_epsilon(epsilon, "epsilon")
    if weights is None:
        e = np.full(int(levels), eps / int(levels))
    else:
        w = np.asarray(weights, dtype=np.float64).ravel()
        if w.size != int(levels) or not np.all(np.isfinite(w)) or np.any(w <= 0):
            raise InvalidPrivacyParameterError(f"level weights must be {levels} finite positive numbers")
        e = eps * w / w.sum()
    for _ in range(8):
        bound = _path_bound(e)
        if bound <= eps:
            return e
        e = np.nextafter(e * np.nextafter(eps / bound, 0.0), 0.0)
    raise SparseDPError(f"could not normalise the level budgets to epsilon {eps!r}")  # pragma: no cover


@dataclass(frozen=True)
class ChunkedTree:
    """The balanced ``k``-ary tree over ``n`` leaves cut into chunks of ``chunk = k^j`` leaves.

    ``levels``: levels of the whole tree (``L``); ``chunk_levels = j + 1`` (a chunk root's level
    is ``j``); ``top_levels = L - j - 1`` levels above the chunk roots (0 when one chunk holds
    everything)."""

    n: int
    k: int
    chunk: int

    def __post_init__(self) -> None:
        n, k, c = int(self.n), int(self.k), int(self.chunk)
        if n < 1:
            raise ShapeError(f"n must be >= 1, got {n}")
        if k < 2:
            raise ShapeError(f"branching k must be >= 2, got {k}")
        if c < 1 or c > n or not _is_power(c, k):
            raise SparseDPError(f"the chunk length must be a power of k = {k} between 1 and n = {n}, got {c}")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "k", k)
        object.__setattr__(self, "chunk", c)

    @property
    def chunks(self) -> int:
        """Number of chunks ``m = ceil(n / chunk)``."""
        return -(-self.n // self.chunk)

    @property
    def chunk_levels(self) -> int:
        return _power(self.chunk, self.k) + 1

    @cached_property
    def top(self) -> TreeLayout:
        """The top tree over the chunk roots (its level 0 = the chunk roots)."""
        return TreeLayout.balanced(self.chunks, self.k)

    @property
    def top_levels(self) -> int:
        """Levels strictly above the chunk roots."""
        return self.top.levels - 1

    @property
    def levels(self) -> int:
        return self.chunk_levels + self.top_levels

    def bounds(self, q: int) -> tuple[int, int]:
        """Leaves ``[lo, hi)`` of chunk ``q``."""
        return q * self.chunk, min((q + 1) * self.chunk, self.n)

    def lengths(self) -> tuple[int, ...]:
        """Leaves per chunk."""
        return tuple(hi - lo for lo, hi in (self.bounds(q) for q in range(self.chunks)))

    def chunk_layout(self, length: int) -> TreeLayout:
        """The subtree of a chunk of ``length`` leaves (:func:`chunk_layout`)."""
        return chunk_layout(length, self.k, self.chunk_levels)

    def nodes(self) -> int:
        """Nodes of the whole tree (``O(levels)`` arithmetic)."""
        total, m = 0, self.n
        for _ in range(self.chunk_levels - 1):
            total += m
            m = -(-m // self.k)
        return total + self.top.nodes

    def node_scales(self, budgets: np.ndarray) -> np.ndarray:
        """Per-level Laplace scales (root first) of per-level budgets: ``(1 + m) / eps_l`` rounded up,
        ``m = 2^-40 + nodes levels 2^-58`` (the tree publishers' rule)."""
        e = np.asarray(budgets, dtype=np.float64)
        if e.shape != (self.levels,) or not np.all(np.isfinite(e)) or np.any(e <= 0):
            raise InvalidPrivacyParameterError(f"need {self.levels} positive finite level budgets")
        margin = 2.0**-40 + float(self.nodes()) * float(self.levels) * 2.0**-58
        return np.nextafter((1.0 / e) * (1.0 + margin), np.inf)


def bfs_plan(layout: TreeLayout) -> tuple[np.ndarray, np.ndarray, tuple[LevelPlan, ...]]:
    """``(parent, level_start, plan)`` of a layout in strategy row order (root first)."""
    parent, level_start = layout.bfs()
    return parent, level_start, two_pass_plan(parent, level_start)


def row_levels(layout: TreeLayout) -> np.ndarray:
    """The level of every row of a layout (strategy row order, root first), counted from the root."""
    return np.repeat(np.arange(layout.levels), [layout.sizes[lev] for lev in reversed(range(layout.levels))])
