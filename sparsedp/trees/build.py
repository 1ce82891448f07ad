"""Interval trees of any shape (seed 004, Definition 3.1): flat arrays and networkx graphs.

A tree over a histogram of ``n`` bins has one node per interval ``[lo, hi)`` (0-based, half-open);
the root is ``[0, n)``, every internal node has >= 2 children that tile its interval in order, and
the leaves are the single bins.  (The seed's 1-based inclusive ``[L(x), R(x)]`` is
``L = lo + 1``, ``R = hi``.)

Two forms of the same tree:

* :class:`IntervalTree` -- flat numpy arrays in breadth-first order (parents before children, the
  children of a node contiguous and sorted by ``lo``, the nodes of one depth contiguous).  Every
  algorithm of :mod:`sparsedp.trees` runs on it, level by level, vectorised: this is what makes
  ``n = 2^24`` possible.
* a :class:`networkx.DiGraph` (edges parent -> child) whose node ``i`` carries
  ``interval = (lo, hi)``, ``lo``, ``hi`` and ``depth``; ``G.graph["n"]`` is the histogram size.
  Builders return graphs (:func:`kary_tree`, :func:`tree_from_splits`, :func:`sc_tree`); the flat
  builders :func:`kary_layout` and :func:`sc_layout` skip networkx for large ``n``.

Balanced k-ary split (Algorithm 3.1's rule "if ``L(y0) < L(y1)`` then ``|Seg(y0)| <= |Seg(y1)|``"):
an interval of ``m`` bins gets ``k' = min(k, m)`` children; with ``m = q k' + r`` the first
``k' - r`` children have ``q`` bins and the last ``r`` have ``q + 1``.  This is the split of the
worked examples (Example 3.1: ``[1,5] -> [1,2], [3,5]``; Example 3.4: ``[3,5] -> [3,3], [4,5]``).
The seed's Conclusions 3.1-3.2 state the opposite order (largest child first); the worked numbers
only reproduce with smallest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Callable, Sequence

import networkx as nx
import numpy as np

from ..errors import ShapeError, UnsupportedStructureError
from ..tree_estimator import LevelPlan, two_pass_plan
from ..workloads import _check_n

__all__ = [
    "IntervalTree",
    "as_interval_tree",
    "to_graph",
    "kary_layout",
    "kary_tree",
    "tree_from_splits",
    "balanced_split",
    "check_structure",
]


@dataclass(frozen=True, eq=False)
class IntervalTree:
    """A histogram interval tree as flat arrays, breadth-first (see the module docstring).

    ``lo``, ``hi``: node intervals ``[lo, hi)``; ``parent``: parent index (``-1`` for the root);
    ``child_start`` (length ``size + 1``): node ``i``'s children are
    ``child_start[i] : child_start[i + 1]`` (empty for a leaf); ``level_start``: the nodes of depth
    ``d`` are ``level_start[d] : level_start[d + 1]``.

    Validated on construction (:func:`check_structure`, ``O(nodes)``, vectorised): a tree that is
    not a histogram interval tree in this layout raises :class:`ShapeError` (lengths, types) or
    :class:`UnsupportedStructureError` (structure).  The arrays are copied to read-only ``int64``
    arrays, so a validated tree cannot be edited afterwards; publishers still call :meth:`check`
    before measuring, so an object whose fields were forged around the constructor is refused too.
    """

    n: int
    lo: np.ndarray
    hi: np.ndarray
    parent: np.ndarray
    child_start: np.ndarray
    level_start: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _tree_size(self.n))
        for name in _FIELDS:
            object.__setattr__(self, name, _index_array(getattr(self, name), name))
        check_structure(self)

    @classmethod
    def _from_fresh_arrays(cls, n: int, *arrays: np.ndarray) -> "IntervalTree":
        """Construct from int64 arrays that nothing else references (a builder's own): validated
        like the constructor, made read-only, but not copied."""
        tree = object.__new__(cls)
        object.__setattr__(tree, "n", _tree_size(n))
        for name, arr in zip(_FIELDS, arrays, strict=True):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != 1:
                arr = _index_array(arr, name)
            arr.setflags(write=False)
            object.__setattr__(tree, name, arr)
        check_structure(tree)
        return tree

    def check(self) -> "IntervalTree":
        """Re-validate the structure of this object (its fields as they are now) and return it.

        Raises like the constructor.  Publishers call this before they measure anything."""
        n = getattr(self, "n", None)
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ShapeError(f"IntervalTree: n must be a positive integer, got {n!r}")
        for name in _FIELDS:
            arr = getattr(self, name, None)
            if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.ndim != 1:
                raise ShapeError(f"IntervalTree: {name} must be a 1-D int64 array")
        check_structure(self)
        return self

    @property
    def size(self) -> int:
        """Number of nodes."""
        return int(self.lo.size)

    @cached_property
    def plan(self) -> tuple[LevelPlan, ...]:
        """The per-depth plan of :func:`~sparsedp.tree_estimator.two_pass` for this shape (computed once)."""
        return two_pass_plan(self.parent, self.level_start)

    @property
    def levels(self) -> int:
        """Number of depths (the height in nodes of the longest root-to-leaf path)."""
        return int(self.level_start.size - 1)

    @property
    def degree(self) -> np.ndarray:
        """Number of children of every node."""
        return np.diff(self.child_start)

    @property
    def depth(self) -> np.ndarray:
        """Depth of every node (root 0)."""
        return np.repeat(np.arange(self.levels), np.diff(self.level_start))

    @property
    def leaves(self) -> np.ndarray:
        """Indices of the leaves ordered by bin: ``leaves[j]`` is the node ``[j, j + 1)``."""
        idx = np.flatnonzero(self.degree == 0)
        out = np.empty(self.n, dtype=np.int64)
        out[self.lo[idx]] = idx
        return out

    def level(self, d: int) -> slice:
        """The slice of node indices at depth ``d``."""
        return slice(int(self.level_start[d]), int(self.level_start[d + 1]))

    def child_sums(self, values: np.ndarray, d: int) -> np.ndarray:
        """Sum of ``values`` over the children of every node of depth ``d`` (0 for leaves)."""
        nxt = self.level(d + 1)
        base = self.level_start[d]
        size = int(self.level_start[d + 1] - base)
        return np.bincount(self.parent[nxt] - base, weights=values[nxt], minlength=size)


_FIELDS = ("lo", "hi", "parent", "child_start", "level_start")


def _tree_size(n: Any) -> int:
    """``n`` as a positive ``int`` (a bool, a string or a fractional number is refused)."""
    if isinstance(n, (bool, np.bool_)):
        raise ShapeError(f"IntervalTree: n must be a positive integer, got {n!r}")
    return _check_n(n)


def _index_array(value: Any, name: str) -> np.ndarray:
    """A read-only 1-D ``int64`` copy of ``value`` (integral values only)."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:  # pragma: no cover - ragged input
        raise ShapeError(f"IntervalTree: {name} must be a 1-D integer array: {exc}") from exc
    if arr.ndim != 1:
        raise ShapeError(f"IntervalTree: {name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.number) or arr.size == 0):
        raise ShapeError(f"IntervalTree: {name} must hold integers, got dtype {arr.dtype}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        f = arr.astype(np.float64)
        if not np.all(np.isfinite(f)) or np.any(f != np.round(f)) or np.any(np.abs(f) > 2.0**62):
            raise ShapeError(f"IntervalTree: {name} must hold integers")
    elif arr.size and arr.dtype == np.uint64 and int(arr.max()) > 2**62:
        raise ShapeError(f"IntervalTree: {name} has values too large for an index")
    out = np.array(arr, dtype=np.int64, copy=True)
    out.setflags(write=False)
    return out


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def check_structure(t: IntervalTree) -> None:
    """Raise unless ``t`` is a histogram interval tree in breadth-first layout, in ``O(nodes)``.

    Checked, vectorised: lengths (``lo``, ``hi``, ``parent``: ``size >= 1``; ``child_start``:
    ``size + 1``); ``level_start`` strictly increasing from ``0`` to ``size`` with one root; the root
    is ``[0, n)`` with parent ``-1``; the other nodes' parents are non-decreasing and every depth's
    parents lie on the previous depth (so parents precede children, children are contiguous and
    levels are in breadth-first order); ``child_start`` is the one the parents imply; no node has
    exactly one child; the children of every node tile its interval in order (the first starts at
    the parent's ``lo``, each next at the previous one's ``hi``, the last ends at the parent's
    ``hi``, none is empty); every leaf is one bin.  Together these make every bin lie in exactly the
    nodes of one root-to-leaf path, which is what the privacy of the tree publishers rests on.
    Raises :class:`ShapeError` (lengths) or :class:`UnsupportedStructureError` (structure).
    """
    size = t.lo.size
    if size == 0:
        raise ShapeError("IntervalTree: a tree has at least one node")
    if t.hi.size != size or t.parent.size != size or t.child_start.size != size + 1:
        raise ShapeError(
            f"IntervalTree: lo, hi, parent need {size} entries and child_start {size + 1}; got "
            f"{t.hi.size}, {t.parent.size} and {t.child_start.size}"
        )
    ls = t.level_start
    if ls.size < 2 or ls[0] != 0 or ls[-1] != size or np.any(ls[1:] <= ls[:-1]) or ls[1] != 1:
        raise UnsupportedStructureError(
            f"IntervalTree: level_start must rise strictly from 0 to {size} with one root on level 0, "
            f"got {ls.tolist()[:8]}"
        )
    if t.lo[0] != 0 or t.hi[0] != t.n or t.parent[0] != -1:
        raise UnsupportedStructureError(
            f"IntervalTree: node 0 must be the root [0, {t.n}) with parent -1, got [{t.lo[0]}, {t.hi[0]}) "
            f"and parent {t.parent[0]}"
        )
    par = t.parent[1:]
    descending = par[1:] < par[:-1]
    if np.any(descending):
        i = _first(descending) + 2
        raise UnsupportedStructureError(
            f"IntervalTree: node {i} has parent {t.parent[i]} after a child of {t.parent[i - 1]}: children must be "
            "contiguous and in the order of their parents (breadth-first)"
        )
    # parents are non-decreasing, so each depth's parents lie on the previous depth iff its first
    # and last ones do: O(levels)
    first_par, last_par = t.parent[ls[1:-1]], t.parent[ls[2:] - 1]
    off = (first_par < ls[:-2]) | (last_par >= ls[1:-1])
    if np.any(off):
        d = _first(off) + 1
        raise UnsupportedStructureError(
            f"IntervalTree: the parents of depth {d} must lie on depth {d - 1} (nodes {ls[d - 1]}..{ls[d] - 1})"
        )
    cs = t.child_start
    counts = cs[1:] - cs[:-1]
    if cs[0] != 1 or cs[-1] != size or np.any(counts < 0):
        raise UnsupportedStructureError(
            f"IntervalTree: child_start must rise from 1 to {size}, got {cs.tolist()[:8]}..."
        )
    # The ranges cs[p] : cs[p + 1] tile 1 .. size - 1; parents are non-decreasing, so every node of
    # p's range has parent p iff its first and last ones do.
    internal = np.flatnonzero(counts)
    firsts = cs[internal]
    lasts = cs[internal + 1] - 1
    wrong = (t.parent[firsts] != internal) | (t.parent[lasts] != internal)
    if np.any(wrong):
        p = int(internal[_first(wrong)])
        raise UnsupportedStructureError(
            f"IntervalTree: child_start says node {p}'s children are {cs[p]}..{cs[p + 1] - 1}; the parents disagree"
        )
    length = t.hi - t.lo
    bad = (counts == 1) | ((counts == 0) & (length != 1)) | (length < 1)
    if np.any(bad):
        i = _first(bad)
        what = "has a single child; internal nodes need >= 2" if counts[i] == 1 else \
            f"is a leaf (or empty) covering [{t.lo[i]}, {t.hi[i]}); leaves must be single bins"
        raise UnsupportedStructureError(f"IntervalTree: node {i} {what}")
    # tiling: a child starts where its previous sibling ends, a first child at its parent's lo, and
    # a last child ends at its parent's hi (children are non-empty, checked above, so they tile)
    start = t.hi[:-1].copy()  # start[i - 1]: where node i must start unless it is a first child
    start[firsts - 1] = t.lo[internal]
    bad_start = t.lo[1:] != start
    bad_end = t.hi[lasts] != t.hi[internal]
    if np.any(bad_start) or np.any(bad_end):
        i = int(_first(bad_start) + 1) if np.any(bad_start) else int(lasts[_first(bad_end)])
        p = int(t.parent[i])
        raise UnsupportedStructureError(
            f"IntervalTree: the children of node {p} do not tile [{t.lo[p]}, {t.hi[p]}) in order "
            f"(child {i} is [{t.lo[i]}, {t.hi[i]}))"
        )


def _from_levels(n: int, levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> IntervalTree:
    """Assemble a tree from per-depth ``(lo, hi, parent_position_in_previous_level)`` arrays."""
    sizes = np.array([lv[0].size for lv in levels], dtype=np.int64)
    level_start = np.concatenate(([0], np.cumsum(sizes)))
    lo = np.concatenate([lv[0] for lv in levels]).astype(np.int64)
    hi = np.concatenate([lv[1] for lv in levels]).astype(np.int64)
    parent = np.concatenate(
        [np.array([-1], dtype=np.int64)]
        + [lv[2].astype(np.int64) + level_start[d - 1] for d, lv in enumerate(levels) if d > 0]
    )
    counts = np.bincount(parent[1:], minlength=lo.size) if lo.size > 1 else np.zeros(1, dtype=np.int64)
    child_start = np.concatenate(([1], 1 + np.cumsum(counts))).astype(np.int64)
    return IntervalTree._from_fresh_arrays(n, lo, hi, parent, child_start, level_start)


def balanced_split(lo: np.ndarray, hi: np.ndarray, k: np.ndarray | int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split every interval ``[lo, hi)`` (length >= 2) into ``min(k, length)`` balanced parts,
    smallest first.  Returns the children's ``lo``, ``hi`` and the index of their interval."""
    m = hi - lo
    kk = np.minimum(np.broadcast_to(np.asarray(k, dtype=np.int64), m.shape), m)
    q, r = np.divmod(m, kk)
    owner = np.repeat(np.arange(m.size), kk)
    j = np.arange(owner.size) - np.repeat(np.cumsum(kk) - kk, kk)
    small = (kk - r)[owner]
    start = lo[owner] + j * q[owner] + np.maximum(0, j - small)
    length = q[owner] + (j >= small)
    return start, start + length, owner


def grow(n: int, choose: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> IntervalTree:
    """Grow a tree level by level: ``choose(lo, hi)`` gives the branching of each internal node
    (intervals of length >= 2) of the current depth; children are balanced splits."""
    lo, hi = np.array([0], dtype=np.int64), np.array([n], dtype=np.int64)
    levels = [(lo, hi, np.array([-1]))]
    while True:
        internal = np.flatnonzero(hi - lo > 1)
        if internal.size == 0:
            break
        k = np.asarray(choose(lo[internal], hi[internal]), dtype=np.int64)
        if np.any(k < 2):
            raise ShapeError("every internal node needs a branching >= 2")
        clo, chi, owner = balanced_split(lo[internal], hi[internal], k)
        levels.append((clo, chi, internal[owner]))
        lo, hi = clo, chi
    return _from_levels(n, levels)


def kary_layout(n: int, k: int = 2) -> IntervalTree:
    """The balanced ``k``-ary interval tree over ``n`` bins as flat arrays (vectorised)."""
    n = _check_n(n)
    if int(k) != k or k < 2:
        raise ShapeError(f"branching k must be an integer >= 2, got {k!r}")
    return grow(n, lambda lo, hi: np.full(lo.size, int(k)))


def to_graph(tree: IntervalTree) -> nx.DiGraph:
    """The tree as a :class:`networkx.DiGraph` (nodes ``0..size-1`` in breadth-first order)."""
    G = nx.DiGraph(n=tree.n)
    depth = tree.depth
    G.add_nodes_from(
        (i, {"interval": (int(a), int(b)), "lo": int(a), "hi": int(b), "depth": int(d)})
        for i, (a, b, d) in enumerate(zip(tree.lo, tree.hi, depth))
    )
    kids = np.arange(1, tree.size)
    G.add_edges_from(zip(tree.parent[kids].tolist(), kids.tolist()))
    return G


def kary_tree(n: int, k: int = 2) -> nx.DiGraph:
    """Balanced ``k``-ary interval tree over ``n`` bins as a networkx graph."""
    return to_graph(kary_layout(n, k))


def tree_from_splits(n: int, split_fn: Callable[[int, int], Sequence[int]]) -> nx.DiGraph:
    """Any interval tree (Algorithm 3.5, TSC): ``split_fn(lo, hi)`` returns the sizes of the
    children of ``[lo, hi)`` (>= 2 positive sizes summing to ``hi - lo``), called for every
    interval of length >= 2; intervals of length 1 are leaves."""
    n = _check_n(n)
    levels_lo, levels_hi, levels_par = [[0]], [[n]], [[-1]]
    while True:
        lo, hi = levels_lo[-1], levels_hi[-1]
        nlo, nhi, npar = [], [], []
        for i, (a, b) in enumerate(zip(lo, hi)):
            if b - a < 2:
                continue
            sizes = [int(s) for s in split_fn(int(a), int(b))]
            if len(sizes) < 2 or min(sizes) < 1 or sum(sizes) != b - a:
                raise ShapeError(
                    f"split_fn({a}, {b}) must return >= 2 positive sizes summing to {b - a}, got {sizes}"
                )
            starts = a + np.concatenate(([0], np.cumsum(sizes)))
            nlo += starts[:-1].tolist()
            nhi += starts[1:].tolist()
            npar += [i] * len(sizes)
        if not nlo:
            break
        levels_lo.append(nlo), levels_hi.append(nhi), levels_par.append(npar)
    levels = [(np.array(a), np.array(b), np.array(p)) for a, b, p in zip(levels_lo, levels_hi, levels_par)]
    return to_graph(_from_levels(n, levels))


def as_interval_tree(tree: Any) -> IntervalTree:
    """An :class:`IntervalTree` from an :class:`IntervalTree` or a networkx graph of intervals.

    The graph's nodes need an ``interval`` ``(lo, hi)`` attribute (or ``lo`` and ``hi``); it must
    be a tree rooted at ``[0, n)`` whose internal nodes have >= 2 children tiling their interval and
    whose leaves are single bins.  Otherwise :class:`UnsupportedStructureError` is raised.
    """
    if isinstance(tree, IntervalTree):
        return tree  # validated on construction
    if not isinstance(tree, nx.DiGraph):
        raise UnsupportedStructureError(f"expected an IntervalTree or a networkx.DiGraph, got {type(tree).__name__}")
    if tree.number_of_nodes() == 0 or not nx.is_arborescence(tree):
        raise UnsupportedStructureError("the graph is not a rooted tree (arborescence)")

    def interval(v: Any) -> tuple[int, int]:
        data = tree.nodes[v]
        if "interval" in data:
            return int(data["interval"][0]), int(data["interval"][1])
        if "lo" in data and "hi" in data:
            return int(data["lo"]), int(data["hi"])
        raise UnsupportedStructureError(f"node {v!r} has no 'interval' attribute")

    root = next(v for v, d in tree.in_degree() if d == 0)
    rlo, n = interval(root)
    if rlo != 0 or n < 1:
        raise UnsupportedStructureError(f"the root must cover [0, n), got [{rlo}, {n})")
    levels = [(np.array([0]), np.array([n]), np.array([-1]))]
    frontier = [root]
    while True:
        nlo, nhi, npar, nxt = [], [], [], []
        for i, v in enumerate(frontier):
            a, b = interval(v)
            kids = sorted(tree.successors(v), key=lambda c: interval(c)[0])
            if not kids:
                if b - a != 1:
                    raise UnsupportedStructureError(f"leaf {v!r} covers [{a}, {b}); leaves must be single bins")
                continue
            spans = [interval(c) for c in kids]
            ends = [a] + [s[1] for s in spans]
            tiled = all(s[0] == e for s, e in zip(spans, ends[:-1])) and ends[-1] == b
            if len(kids) < 2 or not tiled or any(s[1] <= s[0] for s in spans):
                raise UnsupportedStructureError(f"the children of node {v!r} do not tile [{a}, {b}) with >= 2 parts")
            for c, (ca, cb) in zip(kids, spans):
                nlo.append(ca), nhi.append(cb), npar.append(i), nxt.append(c)
        if not nxt:
            break
        levels.append((np.array(nlo), np.array(nhi), np.array(npar)))
        frontier = nxt
    return _from_levels(n, levels)


@lru_cache(maxsize=None)
def kary_height(m: int, k: int) -> int:
    """Number of levels of the balanced ``k``-ary tree over ``m`` bins (smallest child first)."""
    if m <= 1:
        return 1
    kk = min(k, m)
    q, r = divmod(m, kk)
    return 1 + kary_height(q + (r > 0), k)
