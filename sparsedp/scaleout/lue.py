"""LUE-DPTree (seed 004) on partitioned data: per-node budgets on an SC or top-down k-ary tree, chunk by chunk.

:func:`release_lue` publishes what :class:`~sparsedp.trees.LUEDPTree` publishes in process -- the
node counts of its tree (Struct-Construct ``tree="sc"``, Algorithm 3.1, or the balanced top-down
``tree="kary"``) measured with per-node budgets ``eps_x`` (CNP + NPBD, Conclusion 3.5: minimise
``sum p_x / eps_x^2`` with every root-to-leaf path summing to ``epsilon``), then the O(n) BLUE under
consistency -- without ever holding the histogram, the tree or the output on one process.

**Chunks are subtrees of any shape.**  Both trees are *grown*: a node's children depend only on
its own interval (:class:`TreeShape`), so a worker grows the subtree under its chunk root from the
root's interval alone.  A chunk is one node's interval (its subtree is closed: it holds every node
below the root); the chunk roots tile ``[0, n)`` and may sit at different depths.  The driver grows
only the *top tree* -- the chunk roots and their ancestors -- (:func:`chunk_roots`): by default the
maximal nodes of at most ``chunk`` leaves; a dask array's own blocks must each be one node's
interval, else :class:`SparseDPError` (a block that cuts a subtree).

**Budgets without gathering the tree** (the same floating-point operations as the in-process
:func:`~sparsedp.trees.budget.allocate_budget`, so the budgets are identical):

1. each chunk computes its nodes' coverage ``p_x`` (eq. 3.5, from global ``lo``/``hi`` and its
   root's parent interval) and the bottom-up coefficients ``K_x`` and shares ``a_x / (1 + a_x)``,
   returning its root's ``K`` and share;
2. the driver finishes the bottom-up pass on the top tree, runs the top-down pass
   (``psum(child) = psum(parent) - eps_parent``) and sends each chunk its root's ``psum``;
3. normalisation (:func:`~sparsedp.trees.budget.normalise_budget`, and with exact noise the
   ``2^-39`` floor of :func:`~sparsedp.trees.publishers._secure_floor`): each chunk returns the
   certified maximum of its path sums (added rounded up from the top tree's certified path sum at
   its root's parent) and its smallest budget; the driver decides the next global step (scale by
   ``eps / B`` rounded down, or raise to the floor), which every chunk replays in order.

Scales are the publishers' ``b_x = (1 + m) / eps_x`` rounded up, ``m = 2^-40 + nodes levels
2^-58`` with the whole tree's node count and depth (summed / maximised over the chunks).

**Privacy.**  One record changes one leaf, hence the counts of the nodes on one root-to-leaf path,
and a leaf's column of the measured matrix meets exactly those nodes.  Before anything is charged
the driver certifies ``max_leaf sum_path 1 / b_x <= epsilon``: each term rounded up, each addition
rounded up, the top tree's part on the driver continued by every chunk over its own paths (the
measurement path may round scales up to its grid, which only lowers ``1 / b``).  Before drawing,
each chunk also checks its measurement plan's own certified coverage loss plus the top rows above
it against ``epsilon``.  The rest (charge
once, per-chunk noise streams, retries, scratch) is :mod:`sparsedp.scaleout.release`'s, see
``docs/scaleout.md``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputBoundError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..executors import get_executor
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, _quantize_up, plan_measurement
from ..privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time
from ..releases import ReleaseMethods, ReleaseResult, axis_labels
from ..tree_estimator import LevelPlan, two_pass, two_pass_plan
from ..trees.budget import add_up as add_up_arrays
from ..trees.budget import cnp_coefficients, npbd_budgets
from ..validation import MAX_MAGNITUDE, check_counts
from ._store import is_zarr
from .chunked import BlockReader, BlockWriter, as_output, input_length, load_output, native_chunks
from .passes import downward, final_variances, upward
from .release import _run, check_release_args, chunk_seeds, make_scratch
from .subtree import MIN_VARIANCE, ChunkSummary, _exact_total, chunk_generator, remove_scratch
from .tree import add_up

__all__ = ["TreeShape", "TopTree", "LUEScaleoutRelease", "chunk_roots", "release_lue"]

#: Default largest chunk (leaves): about 70 MB of work per task, as :data:`sparsedp.scaleout.tree.DEFAULT_CHUNK`.
DEFAULT_MAX_CHUNK = 2**20

#: The exact sampler's smallest budget a publisher's own rule measures with (``publishers.SECURE_MIN_BUDGET``).
SECURE_MIN_BUDGET = 2.0**-39
#: ``publishers.MIN_NODE_BUDGET``.
MIN_NODE_BUDGET = 1e-100
_MAX_ROUNDS = 16
#: The measurement path's ``max_distinct_scales`` default: more distinct exact scales are rounded up to a grid.
MAX_DISTINCT = 64


# -- the tree's shape: a node's children from its interval alone ----------------------------------

@dataclass(frozen=True)
class TreeShape:
    """How :class:`~sparsedp.trees.LUEDPTree` grows its tree over ``n`` bins: ``kind`` ``"sc"``
    (Struct-Construct with global branching ``k`` and upper bound ``upper``: the leftmost path
    splits ``k``-ary, every other node picks ``w in [k, upper]`` minimising its subtree's coverage)
    or ``"kary"`` (``k``-ary).  Children are balanced splits, smallest first
    (:func:`~sparsedp.trees.build.balanced_split`)."""

    kind: str
    n: int
    k: int
    upper: int = 20

    def choose(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """The branching of every internal node ``[lo, hi)`` (global bins), as ``sc_layout`` / ``kary_layout``."""
        out = np.full(lo.size, self.k, dtype=np.int64)
        if self.kind == "sc":
            from ..trees.sc import _subtree_sums

            ws = np.arange(self.k, int(self.upper) + 1)
            free = np.flatnonzero(lo > 0)
            if free.size and ws.size > 1:
                out[free] = ws[np.argmin(_subtree_sums(self.n, lo[free], hi[free], ws), axis=0)]
        return out

    def children(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(child lo, child hi, owner)`` of the nodes ``[lo, hi)`` (each of length >= 2)."""
        from ..trees.build import balanced_split

        return balanced_split(lo, hi, self.choose(lo, hi))

    def subtree(self, lo: int, hi: int) -> Any:
        """The subtree under the node ``[lo, hi)`` as an :class:`~sparsedp.trees.IntervalTree` over
        ``hi - lo`` bins (local coordinates: subtract ``lo``), breadth-first."""
        from ..trees.build import _from_levels

        clo, chi = np.array([lo], dtype=np.int64), np.array([hi], dtype=np.int64)
        levels = [(clo - lo, chi - lo, np.array([-1]))]
        while True:
            internal = np.flatnonzero(chi - clo > 1)
            if internal.size == 0:
                break
            a, b, owner = self.children(clo[internal], chi[internal])
            levels.append((a - lo, b - lo, internal[owner]))
            clo, chi = a, b
        return _from_levels(hi - lo, levels)


def _shape(tree: str, n: int, k: int | None, upper: int) -> TreeShape:
    if tree not in ("sc", "kary"):
        raise SparseDPError(f"tree must be 'sc' or 'kary' on scale-out, got {tree!r}")
    if isinstance(upper, (bool, np.bool_)) or int(upper) != upper or upper < 2:
        raise ShapeError(f"upper must be an integer >= 2, got {upper!r}")
    upper = int(upper)
    if k is not None and (isinstance(k, (bool, np.bool_)) or int(k) != k):
        raise ShapeError(f"branching k must be an integer, got {k!r}")
    if tree == "sc":
        from ..trees.sc import choose_branching

        kk = choose_branching(n, upper) if k is None else int(k)
        if kk < 2 or kk > upper:
            raise ShapeError(f"k must lie in [2, upper={upper}], got {kk}")
    else:
        kk = 2 if k is None else int(k)
        if kk < 2:
            raise ShapeError(f"branching k must be an integer >= 2, got {k!r}")
    return TreeShape(tree, int(n), kk, upper)


# -- the top tree: chunk roots and their ancestors -------------------------------------------------

@dataclass(frozen=True)
class TopTree:
    """The chunk roots (the top tree's leaves, possibly at different depths) and their ancestors,
    breadth-first as the whole tree orders them.  ``chunk[i]``: the chunk whose root node ``i``
    is (``-1`` for an inner node); ``depth[i]``: its depth in the whole tree."""

    lo: np.ndarray
    hi: np.ndarray
    parent: np.ndarray
    level_start: np.ndarray
    chunk: np.ndarray

    @property
    def size(self) -> int:
        return int(self.lo.size)

    @property
    def inner(self) -> np.ndarray:
        return np.flatnonzero(self.chunk < 0)

    @property
    def roots(self) -> np.ndarray:
        """Node index of every chunk root, in chunk order (left to right)."""
        idx = np.flatnonzero(self.chunk >= 0)
        return idx[np.argsort(self.chunk[idx])]

    @property
    def depth(self) -> np.ndarray:
        return np.repeat(np.arange(self.level_start.size - 1), np.diff(self.level_start))

    def bounds(self) -> np.ndarray:
        """Chunk boundaries ``0 = s_0 < s_1 < ... < s_m = n``."""
        r = self.roots
        return np.concatenate((self.lo[r], self.hi[r][-1:]))


def chunk_roots(shape: TreeShape, max_chunk: int | None = None, blocks: tuple[int, ...] | None = None) -> TopTree:
    """The top tree of ``shape``: with ``blocks`` (block lengths of the input, in order) every block
    must be the interval of one node (else :class:`SparseDPError`: the block cuts a subtree);
    otherwise the chunk roots are the maximal nodes of at most ``max_chunk`` leaves.  Grows only the
    nodes above the chunk roots (level by level, vectorised)."""
    n = shape.n
    if blocks is not None:
        sizes = np.asarray([int(b) for b in blocks], dtype=np.int64)
        if sizes.size == 0 or np.any(sizes < 1) or int(sizes.sum()) != n:
            raise ShapeError(f"blocks {tuple(sizes[:8])} do not tile {n} bins")
        cuts = np.concatenate(([0], np.cumsum(sizes)))
    else:
        c = int(DEFAULT_MAX_CHUNK if max_chunk is None else max_chunk)
        if isinstance(max_chunk, (bool, np.bool_)) or c < 1:
            raise SparseDPError(f"chunk must be a positive number of leaves, got {max_chunk!r}")
    lo, hi = np.array([0], dtype=np.int64), np.array([n], dtype=np.int64)
    par = np.array([-1], dtype=np.int64)
    los, his, pars, stops, sizes_lv = [], [], [], [], []
    offset = 0
    while lo.size:
        if blocks is not None:
            pos = np.searchsorted(cuts, lo, side="left")
            is_block = (cuts[np.minimum(pos, cuts.size - 1)] == lo) & (np.isin(hi, cuts))
            nxt = np.searchsorted(cuts, lo, side="right")  # first cut > lo
            inside = cuts[np.minimum(nxt, cuts.size - 1)] < hi
            exact = is_block & ~inside
            bad = ~exact & ~inside
            if np.any(bad):
                i = int(np.flatnonzero(bad)[0])
                b = int(np.searchsorted(cuts, lo[i], side="right")) - 1
                raise SparseDPError(
                    f"the block [{int(cuts[b])}, {int(cuts[b + 1])}) cuts a subtree of the {shape.kind} tree (its node "
                    f"[{int(lo[i])}, {int(hi[i])}) holds only part of it): every block must be one node's interval; "
                    f"pass chunk=MAX_LEAVES to rechunk the data at subtree boundaries")
            stop = exact
        else:
            stop = hi - lo <= c
        los.append(lo)
        his.append(hi)
        pars.append(par)
        stops.append(stop)
        sizes_lv.append(lo.size)
        split = np.flatnonzero(~stop)
        if split.size == 0:
            break
        a, b, owner = shape.children(lo[split], hi[split])
        par = offset + split[owner]
        offset += lo.size
        lo, hi = a, b
    stop_all = np.concatenate(stops)
    chunk = np.full(stop_all.size, -1, dtype=np.int64)
    idx = np.flatnonzero(stop_all)
    all_lo = np.concatenate(los)
    chunk[idx[np.argsort(all_lo[idx], kind="stable")]] = np.arange(idx.size)
    return TopTree(all_lo, np.concatenate(his), np.concatenate(pars),
                   np.concatenate(([0], np.cumsum(sizes_lv))).astype(np.int64), chunk)


# -- per-chunk budgets ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChunkRoot:
    """Chunk ``q``: its root ``[lo, hi)``, the root's parent interval ``(plo, phi)`` (``(-1, -1)``
    for the whole tree's root) and the root's depth in the whole tree."""

    q: int
    lo: int
    hi: int
    plo: int
    phi: int
    depth: int
    coef: str | None = None  # the scratch file of its subtree and budget shares (after the first pass)


@dataclass(frozen=True)
class _ChunkCoefficients:
    tree: Any  # the local IntervalTree
    frac: np.ndarray  # a_x / (1 + a_x): the share of its path budget each node takes
    K: float  # the root's K_x


_TREE_FIELDS = ("lo", "hi", "parent", "child_start", "level_start")


def _coefficients(shape: TreeShape, root: ChunkRoot) -> _ChunkCoefficients:
    """Coverage (eq. 3.5) and the CNP bottom-up pass of ``allocate_budget`` on one chunk's subtree;
    read back from ``root.coef`` (written by :func:`prepare_chunk`, the tree validated again) when
    there is one, instead of growing the subtree again."""
    if root.coef is not None:
        from ..trees.build import IntervalTree

        with np.load(root.coef, allow_pickle=False) as f:
            t = IntervalTree._from_fresh_arrays(root.hi - root.lo, *(f[k].astype(np.int64) for k in _TREE_FIELDS))
            frac, K = f["frac"].astype(np.float64), float(f["K"])
        if frac.shape != (t.size,) or int(t.lo[0]) != 0 or int(t.hi[0]) != root.hi - root.lo:
            raise SparseDPError(f"{root.coef}: not the subtree of chunk {root.q}")
        return _ChunkCoefficients(t, frac, K)
    t = shape.subtree(root.lo, root.hi)
    n = shape.n
    N = (t.lo + root.lo + 1.0) * (n - (t.hi + root.lo) + 1.0)  # as coverage._contain_counts, global bins
    Np = 0.0 if root.plo < 0 else (root.plo + 1.0) * (n - root.phi + 1.0)
    Nf = np.concatenate(([Np], N[t.parent[1:]]))
    p = (N - Nf) / (n * (n + 1) / 2.0)
    K, frac = cnp_coefficients(t, p)  # the publisher's own bottom-up pass, on the chunk's subtree
    return _ChunkCoefficients(t, frac, float(K[0]))


class _NodeBoundedCache:
    """A per-process LRU cache of per-chunk results holding at most ``max_nodes`` tree nodes in all
    (small chunks are all kept across the release's phases; chunks of ``2^20`` leaves two or three)."""

    def __init__(self, fn: Any, size: Any, max_nodes: int = 2**21) -> None:
        self.fn, self.size, self.max_nodes = fn, size, max_nodes
        self.items: OrderedDict = OrderedDict()
        self.nodes = 0
        self.lock = threading.Lock()

    def __call__(self, *key: Any) -> Any:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = self.fn(*key)
        n = self.size(value)
        with self.lock:
            if key not in self.items:
                self.items[key] = value
                self.nodes += n
            while self.nodes > self.max_nodes and len(self.items) > 1:
                _, old = self.items.popitem(last=False)
                self.nodes -= self.size(old)
        return value

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.nodes = 0


_cached_coefficients = _NodeBoundedCache(_coefficients, lambda c: c.tree.size)


def _apply(e: np.ndarray, ops: tuple[tuple[str, float], ...]) -> np.ndarray:
    """Replay the driver's normalisation steps: ``("scale", r)``: ``nextafter(e r, 0)``;
    ``("floor", f)``: ``max(e, f)`` (as ``normalise_budget`` and ``_secure_floor``)."""
    for op, v in ops:
        e = np.nextafter(e * v, 0.0) if op == "scale" else np.maximum(e, v)
    return e


def _chunk_budgets(shape: TreeShape, root: ChunkRoot, left: float, ops: tuple) -> tuple[Any, np.ndarray]:
    """The chunk's node budgets (NPBD top-down from its root's ``psum`` = ``left``, then ``ops``)."""
    cc = _cached_coefficients(shape, root)
    return cc.tree, _apply(npbd_budgets(cc.tree, cc.frac, left)[0], ops)


def _path_bound(t: Any, e: np.ndarray, acc_parent: float | None) -> float:
    """``max`` over the chunk's leaves of the certified path sums (``path_sum_bounds``), starting
    from the top tree's certified sum at the root's parent."""
    acc = e.copy()
    if acc_parent is not None:
        acc[0] = add_up(acc_parent, float(e[0]))
    for d in range(1, t.levels):
        sl = t.level(d)
        acc[sl] = add_up_arrays(acc[t.parent[sl]], e[sl])  # as path_sum_bounds
    return float(acc[t.degree == 0].max())


@dataclass(frozen=True)
class LUESpec:
    """What every chunk task needs besides its root (a few bytes): the tree shape, the scale margin
    ``m`` of the whole tree, exact or float noise, the budget steps and whether the exact sampler's
    scales are rounded up to the ``2^(k/64)`` grid (as the measurement path does for a plan with
    more than 64 distinct scales: decided for the whole tree, so every chunk rounds as the
    in-process plan would)."""

    shape: TreeShape
    secure: bool
    ops: tuple = ()
    margin: float = 0.0
    quantize: bool = False
    label: str = "scaleout lue"


def prepare_chunk(spec: LUESpec, root: ChunkRoot, reader: BlockReader,
                  scratch: str) -> tuple[int, float, float, int, int, str]:
    """Validate one block and run its bottom-up budget pass: ``(exact total, K_root, share_root,
    nodes, levels, file)``; the subtree and its shares go to ``file`` in ``scratch`` (the later
    passes read them instead of growing the subtree again; data-independent, so a rerun writes the
    same).  No noise."""
    import os
    import uuid

    x = reader.read()
    name = f"histogram[{reader.lo}:{reader.hi}]"
    xv = check_counts(x, reader.hi - reader.lo, name)
    total = _exact_total(xv, name)
    cc = _cached_coefficients(spec.shape, root)
    path = os.path.join(scratch, f"coef{root.q:07d}-{uuid.uuid4().hex}.npz")
    with open(path + ".part", "wb") as fh:
        np.savez(fh, frac=cc.frac, K=np.float64(cc.K), **{k: getattr(cc.tree, k) for k in _TREE_FIELDS})
    os.replace(path + ".part", path)
    return total, cc.K, float(cc.frac[0]), cc.tree.size, cc.tree.levels, path


def _distinct(e: np.ndarray, margin: float, secure: bool) -> np.ndarray:
    """Up to 65 of the distinct exact-sampler scales of budgets ``e`` (what the measurement path counts)."""
    if not secure or np.any(e < MIN_NODE_BUDGET):
        return np.zeros(0)
    return np.unique(np.nextafter(_scales(e, margin), np.inf))[:MAX_DISTINCT + 1]


def _inverse_scales(e: np.ndarray, margin: float) -> np.ndarray | None:
    """``1 / b_x`` rounded up for the publishers' scales of ``e`` (``None`` when a budget is below
    the smallest measurable one).  The measurement path only ever rounds scales up (the ``2^(k/64)``
    grid), so these bound the measured rows' ``1 / b`` from above."""
    if e.size and np.any(e < MIN_NODE_BUDGET):
        return None
    return np.nextafter(1.0 / _scales(e, margin), np.inf)


def bound_chunk(spec: LUESpec, root: ChunkRoot, left: float, acc_parent: float | None,
                inv_parent: float | None) -> tuple[float, float, float, np.ndarray, float]:
    """``(certified max path sum of the budgets, smallest budget, largest budget, distinct scales,
    certified max path sum of 1 / b)`` of one chunk after ``spec.ops``; the path sums continue the
    top tree's certified sums at the root's parent (``acc_parent``, ``inv_parent``)."""
    t, e = _chunk_budgets(spec.shape, root, left, spec.ops)
    inv = _inverse_scales(e, spec.margin)
    loss = math.inf if inv is None else _path_bound(t, inv, inv_parent)
    return (_path_bound(t, e, acc_parent), float(e.min()), float(e.max()), _distinct(e, spec.margin, spec.secure),
            loss)


@dataclass(frozen=True)
class _LUEChunkPlan:
    plan: MeasurementPlan
    level_start: np.ndarray
    plans: tuple[LevelPlan, ...]
    variances: np.ndarray
    leaves: np.ndarray
    eps: np.ndarray


def _scales(e: np.ndarray, margin: float) -> np.ndarray:
    if np.any(e <= 0):
        raise SparseDPError("lue-dptree: every node needs a budget > 0 (an unmeasured node has no weight)")
    if np.any(e < MIN_NODE_BUDGET):
        raise InvalidPrivacyParameterError(
            f"lue-dptree: node budget {float(e.min()):.3g} below the supported minimum {MIN_NODE_BUDGET:g}")
    return np.nextafter((1.0 / e) * (1.0 + margin), np.inf)


def _plan_scales(e: np.ndarray, spec: LUESpec) -> np.ndarray:
    """The scales to hand to ``plan_measurement`` (with ``max_distinct_scales`` off): the
    publishers' scales, or -- when the whole tree has more than 64 distinct exact-sampler scales --
    one float step below their ``2^(k/64)`` grid value, which the path's own ``nextafter`` restores
    exactly (the scales the in-process plan of the whole tree measures with)."""
    s = _scales(e, spec.margin)
    if spec.secure and spec.quantize:
        s = np.nextafter(_quantize_up(np.nextafter(s, np.inf)), 0.0)
    return s


def _measurement_plan(rows: IntervalRows, e: np.ndarray, spec: LUESpec) -> MeasurementPlan:
    return plan_measurement(rows, scales=_plan_scales(e, spec), noise="laplace", secure=spec.secure,
                            max_distinct_scales=sys.maxsize)


def _plan(spec: LUESpec, root: ChunkRoot, left: float) -> _LUEChunkPlan:
    t, e = _chunk_budgets(spec.shape, root, left, spec.ops)
    rows = IntervalRows(t.n, t.lo, t.hi, name=f"lue-dptree subtree [{root.lo}, {root.hi}) ({t.size} nodes)")
    plan = _measurement_plan(rows, e, spec)
    return _LUEChunkPlan(plan, t.level_start, t.plan, np.maximum(plan.variances(), MIN_VARIANCE), t.leaves, e)


_cached_plan = _NodeBoundedCache(_plan, lambda c: c.plan.rows)


def measure_chunk(spec: LUESpec, root: ChunkRoot, left: float, top_loss: float | None, epsilon: float,
                  reader: BlockReader, seed: Any, scratch: str) -> ChunkSummary:
    """Measure one chunk's subtree (no charge: the driver charged once), run the upward pass, keep
    the noisy measurements in a scratch file named for this attempt (as :func:`subtree.measure_chunk`).

    Before drawing, the plan's own certified loss plus the top rows above the chunk (``top_loss``)
    must be at most ``epsilon`` (the driver certified the path sums of ``1 / b`` before the charge;
    this is the measurement path's check of the same leaves)."""
    import os
    import uuid

    cp = _cached_plan(spec, root, left)
    total_loss = cp.plan.loss if top_loss is None else add_up(float(top_loss), float(cp.plan.loss))
    if not total_loss <= epsilon:
        raise SparseDPError(f"chunk {root.q}: certified loss {total_loss!r} exceeds epsilon {epsilon!r}")
    x = reader.read()
    meas = cp.plan.measure(x, rng=chunk_generator(seed), label=f"{spec.label} chunk {root.q}")  # validates, then draws
    total = _exact_total(np.asarray(x, dtype=np.float64), f"histogram[{reader.lo}:{reader.hi}]")
    path = os.path.join(scratch, f"chunk{root.q:07d}-{uuid.uuid4().hex}.npy")
    with open(path + ".part", "wb") as fh:
        np.save(fh, np.stack([meas.y, cp.variances]))  # the noisy rows and their (public) BLUE weights
    os.replace(path + ".part", path)
    z, var = upward(cp.plans, cp.level_start, meas.y, cp.variances, overwrite=True).root
    return ChunkSummary(root.q, z, var, total, path)


def release_chunk(spec: LUESpec, root: ChunkRoot, left: float, summary: ChunkSummary, root_value: float,
                  writer: BlockWriter, outside: float | None = None) -> Any:
    """Final leaf estimates of one chunk from its stored measurements (and their variances, stored
    with them) and its root's final value: no plan is rebuilt, only the subtree's shape.  Returns
    ``(sum of the leaves, the leaves or None, their exact variances or None)`` (the variances with
    ``outside``, the chunk root's outside variance: :func:`~sparsedp.scaleout.passes.final_variances`)."""
    t = _cached_coefficients(spec.shape, root).tree
    yv = np.load(summary.path, allow_pickle=False)
    if yv.shape != (2, t.size):
        raise SparseDPError(f"{summary.path}: {yv.shape} stored rows for a {t.size}-node subtree")
    y, v = yv[0].copy(), yv[1]
    state = upward(t.plan, t.level_start, y, v, overwrite=True)
    leaves = downward(t.plan, state, root_value)[t.leaves]
    var = None if outside is None else final_variances(t.plan, state, v, outside)[0][t.leaves]
    return float(leaves.sum()), writer.write(leaves), var


def chunk_budgets(spec: LUESpec, root: ChunkRoot, left: float) -> np.ndarray:
    """The chunk's final node budgets (breadth-first in its subtree): for checks and tests."""
    return _cached_plan(spec, root, left).eps.copy()


# -- the driver -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LUEScaleoutRelease(ReleaseMethods):
    """A published LUE-DPTree histogram (see :func:`release_lue`).

    ``bounds``: chunk boundaries (``m + 1``); ``top_values``: final estimates of the top tree's
    nodes (breadth-first, :attr:`top`); ``loss``: the largest certified loss over the chunks
    (``<= epsilon``, which was charged); ``nodes`` / ``levels``: of the whole tree; ``min_scale`` /
    ``max_scale``: over all nodes."""

    n: int
    tree: str
    k: int
    chunks: int
    bounds: np.ndarray
    levels: int
    nodes: int
    epsilon: float
    loss: float
    min_scale: float
    max_scale: float
    top: TopTree = field(repr=False)
    top_values: np.ndarray = field(repr=False)
    estimate: np.ndarray | None = field(repr=False)
    out: str | None
    ledger: LedgerEntry
    private: bool
    secure: bool
    executor: str
    spec: LUESpec = field(repr=False)
    roots: tuple = field(repr=False)
    lefts: tuple = field(repr=False)
    top_plan: MeasurementPlan | None = field(repr=False)
    timings: dict = field(default_factory=dict, compare=False)
    leaf_variances: np.ndarray | None = field(default=None, repr=False, compare=False)

    def load(self) -> np.ndarray:
        """The leaf estimates: ``estimate``, or the output file (memory-mapped ``.npy``, or Zarr)."""
        return self.estimate if self.estimate is not None else load_output(self.out)

    def to_release(self, *, description: dict | None = None, private: bool | None = None) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: one answer per bin (label
        ``bin``), each bin's exact variance when the release computed them (``variances=True``:
        ``variance_method="exact-tree"``; the answers are then the array ``estimate`` of an
        ``.npz``), else every bin's variance bounded by the largest noise variance of a leaf
        (``variance_method="bound"``: the BLUE is at least as accurate as the leaf's own
        measurement), the one ledger entry; ``save(OUT)`` with the output array's path writes only
        its record, ``OUT.release.json``."""
        desc = {"method": "lue", "tree": self.tree, "n": self.n, "k": self.k, "chunks": self.chunks,
                "largest_chunk": int(np.diff(self.bounds).max()), "levels": self.levels, "nodes": self.nodes,
                "epsilon": self.epsilon, "certified_loss": self.loss, "min_scale": self.min_scale,
                "max_scale": self.max_scale, "secure": self.secure, "executor": self.executor}
        desc.update(description or {})
        answers = self.load().reshape(-1)
        arrays: dict = {}
        lv = self.leaf_variances
        if lv is not None:
            how = "exact-tree"
            var = np.broadcast_to(lv[0], (self.n,)) if bool(np.all(lv == lv[0])) else lv
            arrays["estimate"] = answers  # an .npz keeps the answers under the histogram files' name
        else:
            how, bound = "bound", 0.0
            for q in range(self.chunks):  # the largest noise variance of a leaf (a row of one bin)
                plan = self.chunk_plan(q)
                rows = plan.measured
                leaf = (np.asarray(rows.hi) - np.asarray(rows.lo)) == 1
                if np.any(leaf):
                    bound = max(bound, float(plan.variances()[leaf].max()))
            var = np.broadcast_to(np.float64(bound), (self.n,))
        return ReleaseResult(
            kind="histogram", answers=answers, labels=axis_labels((self.n,), ["bin"]), arrays=arrays,
            variances=var, variance_method=how, noise="laplace",
            secure=bool(self.secure), strategy=f"LUE-DPTree ({self.tree} tree, {self.nodes} nodes, per-node budgets), "
            f"BLUE, chunk by chunk ({self.chunks} chunks)", ledger=[self.ledger],
            private=bool(self.private) if private is None else private, description=desc, source=self, path=self.out)

    def chunk_plan(self, q: int) -> MeasurementPlan:
        """The measurement plan chunk ``q`` used (its subtree's rows, breadth-first, at their scales)."""
        return _cached_plan(self.spec, self.roots[q], self.lefts[q]).plan

    def chunk_budgets(self, q: int) -> np.ndarray:
        """Chunk ``q``'s node budgets ``eps_x`` (breadth-first in its subtree)."""
        return chunk_budgets(self.spec, self.roots[q], self.lefts[q])


def _readers(data: Any, bounds: np.ndarray) -> list[BlockReader]:
    if isinstance(data, (str, Path)):
        p = Path(data)
        kind = "zarr" if is_zarr(p) else "npy"
        src = str(p.resolve())
        return [BlockReader(kind, src, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    if hasattr(data, "dask") and hasattr(data, "chunks"):
        return [BlockReader("dask", data[int(a):int(b)], int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    arr = np.asarray(data)
    return [BlockReader("array", arr[int(a):int(b)], int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _writers(out: Any, n: int, bounds: np.ndarray) -> tuple[Any, list[BlockWriter]]:
    lengths = np.diff(bounds)
    dst = as_output(out, n, int(lengths[0]))
    if dst.kind == "zarr" and (np.any(lengths[:-1] != lengths[0]) or lengths[-1] > lengths[0]):
        raise SparseDPError(f"{out}: a Zarr output needs equal chunks (two tasks must never write one Zarr chunk); "
                            f"this {lengths.size}-chunk LUE tree has chunks of {int(lengths.min())} to "
                            f"{int(lengths.max())} leaves: write a .npy output instead")
    return dst, [BlockWriter(dst.kind, dst.path, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _top_pass(top: TopTree, frac: np.ndarray, K_roots: np.ndarray, shape: TreeShape,
              eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(eps of the top nodes, psum of every top node)``: the CNP bottom-up pass above the chunk
    roots and the NPBD top-down pass (the operations of ``allocate_budget``)."""
    n = shape.n
    N = (top.lo + 1.0) * (n - top.hi + 1.0)
    Nf = np.concatenate(([0.0], N[top.parent[1:]]))
    p = (N - Nf) / (n * (n + 1) / 2.0)
    K = p.copy()
    roots = top.roots
    K[roots] = K_roots
    levels = top.level_start.size - 1
    for d in range(levels - 2, -1, -1):
        a, b = int(top.level_start[d]), int(top.level_start[d + 1])
        nxt = slice(b, int(top.level_start[d + 2]))
        S_all = np.bincount(top.parent[nxt] - a, weights=K[nxt], minlength=b - a)
        internal = top.chunk[a:b] < 0
        S = S_all[internal]
        cp, cS = np.cbrt(p[a:b][internal]), np.cbrt(S)
        denom = cp + cS
        f = np.where(denom > 0, cp / np.where(denom > 0, denom, 1.0), 1.0)
        idx = np.flatnonzero(internal) + a
        K[idx] = denom**3
        frac[idx] = f
    out = np.empty(top.size)
    left = np.empty(top.size)
    left[0] = eps
    out[0] = frac[0] * eps
    for d in range(1, levels):
        sl = slice(int(top.level_start[d]), int(top.level_start[d + 1]))
        par = top.parent[sl]
        left[sl] = left[par] - out[par]
        out[sl] = frac[sl] * left[sl]
    return np.maximum(out, 0.0), left


def _top_acc(top: TopTree, e: np.ndarray) -> np.ndarray:
    """Certified path sums (rounded up) from the root to every top node."""
    acc = e.copy()
    for d in range(1, top.level_start.size - 1):
        sl = slice(int(top.level_start[d]), int(top.level_start[d + 1]))
        acc[sl] = add_up_arrays(acc[top.parent[sl]], e[sl])
    return acc


def _resolve_blocks(data: Any, chunk: int | None) -> tuple[Any, tuple[int, ...] | None]:
    """A dask array keeps its own blocks unless ``chunk`` is given (then it is rechunked at the
    chunk roots, after they are known); paths and numpy arrays are read at any boundaries."""
    if chunk is None and hasattr(data, "dask") and hasattr(data, "chunks"):
        return data, native_chunks(data)
    return data, None


def release_lue(
    data: Any,
    epsilon: float,
    *,
    tree: str = "sc",
    k: int | None = None,
    upper: int = 20,
    chunk: int | None = None,
    executor: Any = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    out: str | Path | None = None,
    secure: bool = True,
    scratch: str | Path | None = None,
    progress: bool | None = None,
    variances: bool = False,
) -> LUEScaleoutRelease:
    """Publish an epsilon-DP LUE-DPTree histogram (seed 004, Algorithm 3.8) chunk by chunk.

    Mechanism: every node ``x`` of the tree of ``LUEDPTree(epsilon, tree, k=k, upper=upper)`` is
    measured as ``h_x + Lap(b_x)`` (exact discrete Laplace by default), ``b_x = (1 + m) / eps_x``
    with the publisher's per-node budgets ``eps_x`` (CNP + NPBD for uniform ranges, every
    root-to-leaf path summing to at most ``epsilon``).  Sensitivity: one record moves the nodes on
    one path by one, so the loss is ``max_leaf sum_path 1 / b_x <= epsilon``, certified (rounded up)
    over every path before anything is charged, and per chunk by its plan's own coverage before
    drawing.  The estimate is the BLUE under consistency (the O(n) two-pass split at the chunk roots), equal to
    ``LUEDPTree(...).fit`` with the same noise (``tests/test_scaleout_lue.py``: ``1e-9``).

    ``data``: ``.npy`` / ``.zarr`` path, ``dask.array`` or numpy array of non-negative integer counts.
    ``chunk``: the largest number of leaves per task (default ``2^20``); the chunk roots are the
    maximal tree nodes of at most that many leaves.  A dask array without ``chunk`` keeps its own
    blocks, each of which must be one node's interval (else :class:`SparseDPError`).  ``executor``,
    ``accountant``, ``rng``, ``out`` (``.npy``; ``.zarr`` only when the chunks are equal),
    ``secure``, ``scratch``, ``progress``, ``variances`` (every bin's exact variance in
    ``leaf_variances``, with ``out=None``): as :func:`~sparsedp.scaleout.release_hierarchical`.  The
    same ``rng`` and ``chunk`` give the same release on every executor, bit for bit (the CLI's
    ``sparsedp histogram --method lue`` runs this function in process and with ``--executor``).
    """
    t_start = time.perf_counter()
    eps, secure = check_release_args(epsilon, secure, accountant)
    if not isinstance(variances, (bool, np.bool_)):
        raise SparseDPError(f"variances must be True or False, got {variances!r}")
    if variances and out is not None:
        raise SparseDPError("variances=True returns every bin's exact variance with the estimate: use out=None (a "
                            ".npy / .zarr release records a bound on them)")
    n = input_length(data)
    shape = _shape(tree, n, k, upper)
    data, blocks = _resolve_blocks(data, chunk)
    top = chunk_roots(shape, chunk, blocks)
    bounds = top.bounds()
    if blocks is None and hasattr(data, "dask") and hasattr(data, "chunks"):
        data = data.rechunk((tuple(int(v) for v in np.diff(bounds)),))
    m = int(bounds.size - 1)
    roots_idx = top.roots
    depth = top.depth
    roots = []
    for q, i in enumerate(roots_idx):
        pi = int(top.parent[i])
        roots.append(ChunkRoot(q, int(top.lo[i]), int(top.hi[i]), -1 if pi < 0 else int(top.lo[pi]),
                               -1 if pi < 0 else int(top.hi[pi]), int(depth[i])))
    seeds = chunk_seeds(rng, m + 1)
    seeded = rng is not None
    readers = _readers(data, bounds)
    dst, writers = _writers(out, n, bounds)
    ex = get_executor(executor)  # last: an executor this call makes is closed in the finally below
    owns = isinstance(executor, str)
    spec = LUESpec(shape, secure, label=f"scaleout lue-dptree(n={n}, {shape.kind}, k={shape.k})")
    timings: dict[str, float] = {}
    scratch_dir = None
    summaries: list[ChunkSummary] = []
    try:
        # 1. validate every block and run its bottom-up budget pass (no noise, no charge)
        t0 = time.perf_counter()
        scratch_dir = make_scratch(scratch, dst.path)
        prep = _run(ex, prepare_chunk, [[spec] * m, roots, readers, [scratch_dir] * m], m, "validate", progress)
        roots = [dataclasses.replace(r, coef=p[5]) for r, p in zip(roots, prep)]
        totals = [int(r[0]) for r in prep]
        grand = sum(totals)
        if grand > MAX_MAGNITUDE:
            raise InputBoundError("the histogram's total (the root count) exceeds the supported bound 2^50")
        nodes = int(top.inner.size + sum(int(r[3]) for r in prep))
        levels = int(max(int(depth[i]) + int(r[4]) for i, r in zip(roots_idx, prep)))
        margin = 2.0**-40 + float(nodes) * float(levels) * 2.0**-58
        timings["validate+coefficients"] = time.perf_counter() - t0

        # 2. budgets: top passes here, normalisation steps replayed by every chunk
        t0 = time.perf_counter()
        frac = np.ones(top.size)
        frac[roots_idx] = [float(r[2]) for r in prep]
        e_top0, left = _top_pass(top, frac, np.array([float(r[1]) for r in prep]), shape, eps)
        lefts = [float(left[i]) for i in roots_idx]
        parents = [int(top.parent[i]) for i in roots_idx]
        ops: list[tuple[str, float]] = []
        floored = not secure

        inner = top.inner

        def bounds_of(ops_now: list) -> dict:
            s = LUESpec(shape, secure, tuple(ops_now), margin, label=spec.label)
            e_top = _apply(e_top0, tuple(ops_now))
            acc = _top_acc(top, e_top)
            inv = np.zeros(top.size)
            inv_inner = _inverse_scales(e_top[inner], margin)
            inv[inner] = np.inf if inv_inner is None else inv_inner
            acc_inv = _top_acc(top, inv)
            accp = [None if p < 0 else float(acc[p]) for p in parents]
            invp = [None if p < 0 else float(acc_inv[p]) for p in parents]
            res = _run(ex, bound_chunk, [[s] * m, roots, lefts, accp, invp], m, "budgets", progress)
            e_inner = e_top[inner]
            distinct = np.unique(np.concatenate([r[3] for r in res] + [_distinct(e_inner, margin, secure)]))
            return dict(B=max(r[0] for r in res), e_top=e_top, distinct=int(distinct.size), top_loss=invp,
                        e_min=min([r[1] for r in res] + ([float(e_inner.min())] if e_inner.size else [])),
                        e_max=max([r[2] for r in res] + ([float(e_inner.max())] if e_inner.size else [])),
                        loss=max(r[4] for r in res))

        for _ in range(2 * _MAX_ROUNDS):
            b = bounds_of(ops)
            if b["B"] > eps:
                ops.append(("scale", float(np.nextafter(eps / b["B"], 0.0))))
                continue
            if not floored:  # publishers._secure_floor: once, after the first normalisation
                floored = True
                if b["e_min"] < SECURE_MIN_BUDGET:
                    ops.append(("floor", SECURE_MIN_BUDGET))
                    continue
            break
        else:  # pragma: no cover
            raise SparseDPError(f"could not normalise the budgets to epsilon {eps!r}")
        e_top, e_min, e_max = b["e_top"], b["e_min"], b["e_max"]
        spec = LUESpec(shape, secure, tuple(ops), margin, b["distinct"] > MAX_DISTINCT, spec.label)
        # the certified loss of every leaf: its path's 1 / b (rounded up, added rounded up), top rows included;
        # the path only rounds scales up, and a leaf's column meets exactly the nodes of its path
        loss = float(b["loss"])
        if not loss <= eps:
            raise InvalidPrivacyParameterError(f"the certified loss {loss!r} of the tree exceeds epsilon {eps!r}")
        _scales(np.array([e_min, e_max]), margin)  # budgets below the smallest measurable one: refused here
        tplan = None
        if inner.size:
            cidx = np.searchsorted(bounds, top.lo[inner]), np.searchsorted(bounds, top.hi[inner])
            rows = IntervalRows(m, cidx[0], cidx[1], name=f"lue-dptree top ({inner.size} nodes over {m} chunks)")
            tplan = _measurement_plan(rows, e_top[inner], spec)
        timings["budgets"] = time.perf_counter() - t0

        # 3. charge once, for the whole tree
        cost = PrivacyCost(epsilon=eps)
        label = f"{spec.label}: {m} chunks"
        smin, smax = (float(s) for s in _scales(np.array([e_max, e_min]), margin))
        entry = LedgerEntry(label=label, cost=cost, rows=nodes, columns=n, noise="laplace", secure=secure,
                            private=not seeded, sensitivity=float(levels), scale_min=smin, scale_max=smax,
                            time=ledger_time())
        if accountant is not None:
            accountant.spend(cost, label=label, entry=entry)

        # 4. measure: the top nodes here, the chunks on the workers
        t0 = time.perf_counter()
        y = np.zeros(top.size)
        v = np.ones(top.size)
        if inner.size:
            tgen = chunk_generator(seeds[-1])
            y[inner] = tplan.measure(np.asarray(totals, dtype=np.int64), rng=tgen, label=f"{label}: top nodes").y
            v[inner] = np.maximum(tplan.variances(), MIN_VARIANCE)
        summaries = _run(ex, measure_chunk, [[spec] * m, roots, lefts, b["top_loss"], [eps] * m, readers, seeds[:m],
                                             [scratch_dir] * m], m, "measure", progress)
        timings["measure+upward"] = time.perf_counter() - t0
        for s, t in zip(summaries, totals):
            if s.total != t:
                raise SparseDPError(f"chunk {s.q} changed between validation and measurement (total {t} -> {s.total})")

        # 5. the top solve, then the downward pass per chunk
        t0 = time.perf_counter()
        y[roots_idx] = [s.z for s in summaries]
        v[roots_idx] = [s.var for s in summaries]
        tplans = two_pass_plan(top.parent, top.level_start)
        top_values = two_pass(top.parent, top.level_start, y, v, plan=tplans)
        outside = [None] * m
        if variances:  # every chunk root's outside variance, from the top tree's variances only
            tstate = upward(tplans, top.level_start, np.zeros(top.size), v, overwrite=True)
            outside = final_variances(tplans, tstate, v)[1][roots_idx].tolist()
        timings["top"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dst.create()
        results = _run(ex, release_chunk, [[spec] * m, roots, lefts, summaries, top_values[roots_idx].tolist(),
                                           writers, outside], m, "release", progress)
        timings["downward+write"] = time.perf_counter() - t0
        estimate = np.concatenate([r[1] for r in results]) if dst.kind == "return" else None
        leaf_var = np.concatenate([r[2] for r in results]) if variances else None
    finally:
        if scratch_dir is not None:
            remove_scratch([s.path for s in summaries])
            shutil.rmtree(scratch_dir, ignore_errors=True)
        if owns:
            ex.close()
        _cached_coefficients.clear()  # this process's copies (workers keep theirs, bounded)
        _cached_plan.clear()
    timings["total"] = time.perf_counter() - t_start
    return LUEScaleoutRelease(
        n=n, tree=shape.kind, k=shape.k, chunks=m, bounds=bounds, levels=levels, nodes=nodes, epsilon=eps, loss=loss,
        min_scale=float(entry.scale_min), max_scale=float(entry.scale_max), top=top, top_values=top_values,
        estimate=estimate, out=dst.path, ledger=entry, private=not seeded, secure=secure, executor=ex.name,
        spec=spec, roots=tuple(dataclasses.replace(r, coef=None) for r in roots), lefts=tuple(lefts), top_plan=tplan,
        timings=timings, leaf_variances=leaf_var,
    )
