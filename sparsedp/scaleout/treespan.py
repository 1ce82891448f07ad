"""The restaurant's trees x span release (seed 002) on partitioned data, chunk by chunk.

:func:`~sparsedp.consistency.restaurant_release` measures every item's binary tree over
the ``T`` days (one row per (node, item), homoscedastic Laplace ``b = 5 h / eps``, ``Delta_1 = 5 h``
for one order of at most 5 items) and projects the noisy values onto the feasible set
``{(A (x) K) c}`` (parents = sums of children, every node's 5 items in the span of the combos,
``K = COMBOS^T``).  With equal variances the projection is ``P_tree (x) P_span``: the node vectors'
coordinates in an orthonormal basis ``Q`` of the span (``C = Y Q``, three columns) go through the
scalar O(T) two-pass, the leaves become ``Q c_leaf`` and every inner node the sum of its children
(:mod:`sparsedp.consistency.treespan`).  Here that release runs on the scale-out path of
:mod:`sparsedp.scaleout`: the time axis is cut into chunks of ``c = 2^j`` days, each a complete
subtree of the time tree holding its ``c x 5`` block of sales, and on the driver, in this order:

1. shape and budget: the chunked tree (:class:`~sparsedp.scaleout.tree.ChunkedTree` with ``k = 2``),
   the scale ``b``, the plans of a full chunk, the short last chunk and the top nodes, and the
   certified loss ``top.loss + max chunk loss <= epsilon`` (an item-day's column meets ``5``-unit
   rows of its chunk's subtree and of the top tree above it, one per level);
2. validation of every block on the workers (:func:`validate_sales_chunk`: shape ``(c, 5)``,
   finite, non-negative whole counts, each day's sales ``orders @ COMBOS`` for non-negative
   integer orders; the block's exact item totals come back); bad input stops here;
3. the charge: ``epsilon`` once, one ledger entry, before any noise;
4. the top nodes (the trees above the chunk roots, 5 items each) measured on the driver from the
   chunks' exact item totals; every chunk's subtree measured on a worker through
   ``MeasurementPlan.measure`` from its own noise stream, reduced to span coordinates and run
   through the upward pass (:func:`measure_sales_chunk`: the root's three upward estimates and
   their variance come back);
5. the top solve on the driver (:func:`~sparsedp.scaleout.top.solve_top`, one span coordinate at
   a time), the downward pass and the writing of each chunk's ``c x 5`` leaf block on the workers
   (:func:`release_sales_chunk`), and the top nodes re-aggregated from the chunk roots' sums.

The result equals the in-process release's projection of the same noisy values to ``1e-9``
(``tests/test_scaleout_treespan.py``): the two passes split at a subtree root are those of the
whole tree (:mod:`sparsedp.scaleout.passes`), and ``P_span`` acts per node.  Why independent
per-chunk noise streams keep the guarantee and why a rerun task cannot spend twice: ``docs/scaleout.md``.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..calibration import laplace_scale
from ..consistency.restaurant import COMBOS, ITEMS, ORDER_L1, RestaurantSales, _orders_of, restaurant_rows
from ..consistency.treespan import reaggregate
from ..errors import InputBoundError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..executors import get_executor
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time
from ..releases import ReleaseMethods, ReleaseResult, axis_labels
from ..tree_estimator import LevelPlan
from ..validation import MAX_MAGNITUDE, check_epsilon
from ._store import stored_shape
from .chunked import BlockReader, BlockWriter, as_input, as_output, load_output, native_chunks
from .passes import downward, upward
from .release import _run, check_release_args, chunk_seeds, make_scratch
from .subtree import chunk_generator
from .top import solve_top
from .tree import ChunkedTree, add_up, bfs_plan, chunk_layout, check_chunking, default_chunk

__all__ = ["ScaleoutRestaurantRelease", "release_restaurant"]

#: Default days per chunk: the largest ``2^j`` up to this (a task then holds ~10 c values per array).
DEFAULT_CHUNK_DAYS = 2**18
P = len(ITEMS)


def span_basis() -> np.ndarray:
    """An orthonormal basis ``Q`` (5 x 3) of the combos' span (the allowed daily item vectors)."""
    Q, _ = np.linalg.qr(COMBOS.T.astype(np.float64))
    return Q


_Q = span_basis()


@dataclass(frozen=True)
class SpanChunkSpec:
    """What a chunk task needs to rebuild its plan: ``levels`` of the chunk subtree, the Laplace
    ``scale`` of every node value, ``secure``, the certified ``losses`` per chunk length."""

    levels: int
    scale: float
    secure: bool
    losses: tuple[tuple[int, float], ...] = ()
    label: str = "scaleout restaurant"


@dataclass(frozen=True)
class _ChunkShape:
    """The two passes' shape data of a chunk subtree (no measurement plan: cheap to build)."""

    level_start: np.ndarray
    plans: tuple[LevelPlan, ...]
    nodes: int


@lru_cache(maxsize=4)
def _chunk_shape(levels: int, length: int) -> _ChunkShape:
    layout = chunk_layout(length, 2, levels)
    _, level_start, plans = bfs_plan(layout)
    return _ChunkShape(level_start, plans, layout.nodes)


@dataclass(frozen=True)
class _ChunkPlan:
    plan: MeasurementPlan
    level_start: np.ndarray
    plans: tuple[LevelPlan, ...]
    nodes: int


def _build_plan(levels: int, scale: float, secure: bool, length: int) -> _ChunkPlan:
    rows = restaurant_rows(chunk_layout(length, 2, levels))  # (node, item) rows over the chunk's item-major sales
    plan = plan_measurement(rows, scales=scale, unit=ORDER_L1, noise="laplace", secure=secure)
    sh = _chunk_shape(levels, length)
    return _ChunkPlan(plan, sh.level_start, sh.plans, sh.nodes)


_cached_plan = lru_cache(maxsize=4)(_build_plan)


def _chunk_plan(spec: SpanChunkSpec, length: int) -> _ChunkPlan:
    cp = _cached_plan(spec.levels, spec.scale, spec.secure, int(length))
    expected = dict(spec.losses).get(int(length))
    if expected is not None and cp.plan.loss != expected:
        raise SparseDPError(f"chunk plan loss {cp.plan.loss!r} differs from the certified {expected!r}")
    return cp


def _name(reader: BlockReader) -> str:
    return f"sales[{reader.lo}:{reader.hi}]"


def _checked_sales(reader: BlockReader) -> np.ndarray:
    """The block's ``(days, 5)`` int64 sales, checked (:func:`_orders_of`), or an error."""
    x = np.asarray(reader.read())
    if x.shape != (reader.hi - reader.lo, P):
        raise ShapeError(f"{_name(reader)}: expected a ({reader.hi - reader.lo}, {P}) block, got {x.shape}")
    return _orders_of(x, _name(reader), reader.lo) @ COMBOS


def _item_totals(sales: np.ndarray, name: str) -> tuple[int, ...]:
    """Exact per-item totals of checked sales (each at most ``2^50``: a chunk root's value)."""
    f = sales.sum(axis=0, dtype=np.float64)
    if np.any(f > 2.0 * MAX_MAGNITUDE):
        raise InputBoundError(f"{name}: the total of item {ITEMS[int(np.argmax(f > 2.0 * MAX_MAGNITUDE))]!r} exceeds "
                              "the supported bound 2^50")
    t = sales.sum(axis=0, dtype=np.int64)
    if np.any(t > MAX_MAGNITUDE):
        raise InputBoundError(f"{name}: the total of item {ITEMS[int(np.argmax(t > MAX_MAGNITUDE))]!r} exceeds the "
                              "supported bound 2^50")
    return tuple(int(v) for v in t)


def validate_sales_chunk(reader: BlockReader) -> tuple[int, ...]:
    """Read and check one ``(days, 5)`` block of daily item sales; its exact item totals.  No noise."""
    return _item_totals(_checked_sales(reader), _name(reader))


@dataclass(frozen=True)
class SpanChunkSummary:
    """What a chunk hands to the driver: ``z`` (its root's upward estimates of the three span
    coordinates) and ``var`` (their common variance, unit noise), the exact item ``totals`` and the
    scratch ``path`` of this attempt's span coordinates."""

    q: int
    z: tuple[float, ...]
    var: float
    totals: tuple[int, ...]
    path: str


def _coordinates(y: np.ndarray, nodes: int) -> np.ndarray:
    """Node-major noisy values ``y`` (5 per node) -> their span coordinates ``Y Q`` (nodes x 3)."""
    return np.einsum("ui,ij->uj", y.reshape(nodes, P), _Q)


def measure_sales_chunk(spec: SpanChunkSpec, reader: BlockReader, q: int, seed: Any, scratch: str) -> SpanChunkSummary:
    """Measure chunk ``q``'s item trees (no charge: the driver charged the whole release), reduce
    them to span coordinates, keep those in ``scratch`` under a name unique to this attempt and run
    the upward pass (unit variances: every node value has the same noise)."""
    sales = _checked_sales(reader)
    cp = _chunk_plan(spec, reader.hi - reader.lo)
    items = np.ascontiguousarray(sales.T).ravel()  # item-major, as restaurant_rows reads it
    meas = cp.plan.measure(items, rng=chunk_generator(seed), label=f"{spec.label} chunk {q}")  # validates, then draws
    C = _coordinates(meas.y, cp.nodes)
    path = os.path.join(scratch, f"span{q:07d}-{uuid.uuid4().hex}.npy")
    tmp = path + ".part"
    with open(tmp, "wb") as fh:
        np.save(fh, C)
    os.replace(tmp, path)  # a killed attempt leaves at most a .part file
    ones = np.ones(cp.nodes)
    roots = [upward(cp.plans, cp.level_start, C[:, j], ones).root for j in range(C.shape[1])]
    return SpanChunkSummary(q, tuple(r[0] for r in roots), roots[0][1], _item_totals(sales, _name(reader)), path)


def release_sales_chunk(spec: SpanChunkSpec, summary: SpanChunkSummary, root: tuple[float, ...],
                        writer: BlockWriter) -> tuple[np.ndarray, np.ndarray | None]:
    """Consistent leaves of one chunk from its stored coordinates and its root's final coordinates:
    the downward pass, ``Q c_leaf`` per day, written by ``writer``.  Returns ``(the chunk root's
    5 values = the float sum of its leaves, bottom-up; the leaves or None)``.  Draws no noise."""
    C = np.load(summary.path, allow_pickle=False)
    length = writer.hi - writer.lo
    cp = _chunk_shape(spec.levels, length)  # the tree's shape only: the release pass builds no measurement plan
    if C.shape != (cp.nodes, _Q.shape[1]):
        raise SparseDPError(f"{summary.path}: {C.shape} coordinates for a {cp.nodes}-node subtree")
    ones = np.ones(cp.nodes)
    first_leaf = int(cp.level_start[-2])
    leaves_c = np.empty((length, C.shape[1]))
    for j in range(C.shape[1]):
        state = upward(cp.plans, cp.level_start, np.array(C[:, j]), ones, overwrite=True)
        leaves_c[:, j] = downward(cp.plans, state, root[j])[first_leaf:]
    X = np.empty((cp.nodes, P))
    X[first_leaf:] = np.einsum("uj,ij->ui", leaves_c, _Q)
    reaggregate(cp.plans, X)
    written = writer.write(X[first_leaf:])
    return X[0].copy(), None if written is None else np.array(written)  # a copy: X is not kept alive


# -- inputs and outputs: (days, 5) blocks ----------------------------------------------------------


def _shape(data: Any) -> tuple[int, ...]:
    if isinstance(data, (str, Path)) and not Path(data).exists():
        raise SparseDPError(f"no such file: {data}")
    return stored_shape(data, "sales")


# -- the driver ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScaleoutRestaurantRelease(ReleaseMethods):
    """A published restaurant release (see :func:`release_restaurant`).

    ``estimate``: the consistent ``(days, 5)`` daily item values when no output file was given
    (else ``None``: read ``out``); ``top_values``: the consistent 5 values of every top node
    (``(top nodes, 5)``, strategy row order of the time tree: root first, the chunk roots last;
    every other node is a sum of days); ``scale``: the Laplace scale of every measured value,
    ``variance`` its noise variance; ``sensitivity``: ``Delta_1 = 5 h``; ``loss``: the certified
    loss (``<= epsilon``, which was charged); ``ledger``: the one entry; ``private``: ``False`` when
    the noise came from a seed; ``timings``: seconds per phase."""

    days: int
    chunk: int
    chunks: int
    levels: int
    epsilon: float
    loss: float
    sensitivity: float
    scale: float
    variance: float
    top_values: np.ndarray
    estimate: np.ndarray | None
    out: str | None
    ledger: LedgerEntry
    private: bool
    secure: bool
    executor: str
    timings: dict = field(default_factory=dict, compare=False)

    def load(self) -> np.ndarray:
        """The consistent ``(days, 5)`` values: ``estimate``, or the output file (memory-mapped ``.npy``, or Zarr)."""
        return self.estimate if self.estimate is not None else load_output(self.out)

    def to_release(self, *, description: dict | None = None, private: bool | None = None) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: the consistent ``(days, 5)``
        values flattened day by day (labels ``day`` and ``item``), each value's variance bounded by
        the noise variance of one measured value (an orthogonal projection never raises it:
        ``variance_method="bound"``), the one ledger entry; ``save(OUT)`` with the output array's
        path writes only its record, ``OUT.release.json``."""
        desc = {"days": self.days, "chunk": self.chunk, "chunks": self.chunks, "levels": self.levels,
                "epsilon": self.epsilon, "certified_loss": self.loss, "sensitivity": self.sensitivity,
                "laplace_scale": self.scale, "noise_variance": self.variance, "secure": self.secure,
                "executor": self.executor, "items": list(ITEMS)}
        desc.update(description or {})
        values = self.load()
        n = int(np.prod(values.shape))
        return ReleaseResult(
            kind="restaurant", answers=values.reshape(-1),
            labels=axis_labels((self.days, P), ["day", "item"], {"item": list(ITEMS)}),
            variances=np.broadcast_to(np.float64(self.variance), (n,)), variance_method="bound", noise="laplace",
            secure=bool(self.secure), strategy=f"item trees over {self.days} days x combo span, chunk by chunk "
            f"({self.chunks} chunks of {self.chunk} days)", ledger=[self.ledger],
            private=bool(self.private) if private is None else private, description=desc, source=self, path=self.out)


def _resolve_chunk(data: Any, days: int, chunk: int | None) -> tuple[Any, int]:
    native = native_chunks(data)
    if chunk is not None:
        if isinstance(chunk, (bool, np.bool_)) or int(chunk) != chunk:
            raise SparseDPError(f"chunk must be a power of 2 (days per chunk), got {chunk!r}")
        c = int(chunk)
        ChunkedTree(days, 2, c)  # a power of 2 in [1, days], or a clear error
        if native is not None and hasattr(data, "rechunk") and tuple(native) != ChunkedTree(days, 2, c).lengths():
            data = data.rechunk({0: c, 1: -1})
        return data, c
    if native is not None and len(native) > 1:
        return data, check_chunking(native, 2)
    if native is not None and hasattr(data, "rechunk"):  # one block: cut it at the default subtrees
        c = default_chunk(days, 2, DEFAULT_CHUNK_DAYS)
        return data.rechunk({0: c, 1: -1}), c
    return data, default_chunk(days, 2, DEFAULT_CHUNK_DAYS)


def _top_plan(tree: ChunkedTree, scale: float, secure: bool) -> tuple[MeasurementPlan | None, int]:
    """The plan of the top inner nodes' (node, item) rows over the chunks' item-major totals."""
    top = tree.top
    inner = top.nodes - top.sizes[0]
    if inner == 0:
        return None, 0
    rows = restaurant_rows(top)
    rows = IntervalRows(rows.shape[1], rows.lo[: P * inner], rows.hi[: P * inner],
                        name=f"restaurant top ({tree.chunks} chunk roots)")
    return plan_measurement(rows, scales=scale, unit=ORDER_L1, noise="laplace", secure=secure), inner


@dataclass(frozen=True)
class _Setup:
    tree: ChunkedTree
    scale: float
    sensitivity: float
    spec: SpanChunkSpec
    top: MeasurementPlan | None
    inner: int
    full: MeasurementPlan
    loss: float


def _plan_release(days: int, epsilon: float, chunk: int, secure: bool = True) -> _Setup:
    """The chunked tree, the scale ``b = 5 h / epsilon`` (rounded up with the tree publishers' margin
    ``2^-40 + rows levels 2^-58`` for the certificate's rounding slack, raised further if that is short),
    the chunk and top plans and the certified loss ``top.loss + max chunk loss`` (``<= epsilon``).
    Nothing is read, charged or drawn."""
    eps = check_epsilon(epsilon, "epsilon")
    tree = ChunkedTree(days, 2, chunk)
    T, c, m = tree.n, tree.chunk, tree.chunks
    sens = float(ORDER_L1 * tree.levels)
    margin = 2.0**-40 + float(P * tree.nodes()) * float(tree.levels) * 2.0**-58  # as ChunkedTree.node_scales
    scale = math.nextafter(laplace_scale(sens, eps) * (1.0 + margin), math.inf)
    lengths = sorted(set(tree.lengths()))
    label = f"scaleout restaurant({T} days): {m} chunks of {c} days"
    for _ in range(3):
        top, inner = _top_plan(tree, scale, secure)
        spec = SpanChunkSpec(tree.chunk_levels, scale, secure, (), label)
        losses = tuple((L, float(_chunk_plan(spec, L).plan.loss)) for L in lengths)
        loss = add_up(0.0 if top is None else float(top.loss), max(v for _, v in losses))
        if loss <= eps:
            break
        # the certificate's rounding slack grows with the rows: raise b by the excess (the loss is ~ 1 / b)
        scale = math.nextafter(scale * (loss / eps) * (1.0 + 2.0**-40), math.inf)
    if not loss <= eps:  # pragma: no cover - one step always suffices
        raise InvalidPrivacyParameterError(f"the certified loss {loss!r} of the release exceeds epsilon {eps!r}")
    spec = SpanChunkSpec(tree.chunk_levels, scale, secure, losses, label)
    return _Setup(tree, scale, sens, spec, top, inner, _chunk_plan(spec, lengths[-1]).plan, loss)


def release_restaurant(
    data: Any,
    epsilon: float,
    *,
    chunk: int | None = None,
    executor: Any = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    out: str | Path | None = None,
    secure: bool = True,
    scratch: str | Path | None = None,
    progress: bool | None = None,
) -> ScaleoutRestaurantRelease:
    """Publish the restaurant's consistent item trees (seed 002) chunk by chunk over the days.

    Mechanism (as :func:`~sparsedp.consistency.restaurant_release`): every (node ``u``,
    item ``i``) of the binary time tree (``h`` levels) is measured as ``s_i(I_u) + Lap(b)``, exact
    discrete Laplace by default, ``b = 5 h / epsilon`` rounded up with a ``2^-40`` margin.
    Sensitivity: one order adds one combo (L1 norm at most 5) to one day, which lies in one node per
    level, so ``Delta_1 = 5 h``; the loss is certified from the measured intervals (top plan plus
    the largest chunk plan, ``unit = 5``) before anything is read.  The estimate is the projection
    ``P_tree (x) P_span`` of the noisy values (the BLUE: equal variances), equal to the in-process
    release's for the same noise.

    ``data``: daily item sales ``(days, 5)`` (columns cola, burger, wings, fries, nuggets): a
    ``.npy`` (memory-mapped) / ``.zarr`` path, a ``dask.array``, a numpy array or a
    :class:`~sparsedp.consistency.RestaurantSales`.  Each day must be ``orders @ COMBOS``
    for non-negative integer orders.  ``chunk``: days per task, a power of 2 (default: the input's
    own aligned blocks, else the largest power of 2 up to ``2^18``).  ``executor``, ``rng``,
    ``out``, ``scratch``, ``progress``: as :func:`~sparsedp.scaleout.release.release_hierarchical`
    (``out`` a ``.npy`` / ``.zarr`` path receives the ``(days, 5)`` consistent values block by block).

    Order: every input and parameter is checked (a :class:`~sparsedp.errors.SparseDPError`), then
    ``epsilon`` is charged once, then noise is drawn.
    """
    t_start = time.perf_counter()
    eps, secure = check_release_args(epsilon, secure, accountant)
    if isinstance(data, RestaurantSales):
        data = np.asarray(data.sales)
    shape = _shape(data)
    if len(shape) != 2 or shape[1] != P or shape[0] < 1:
        raise ShapeError(f"the sales must be a (days, {P}) array ({', '.join(ITEMS)}), got shape {shape}")
    T = int(shape[0])
    data, c = _resolve_chunk(data, T, chunk)

    # 1. scale, plans and the certified loss (no data read yet)
    st = _plan_release(T, eps, c, secure)
    spec, top, inner, full, sens, label, loss = st.spec, st.top, st.inner, st.full, st.sensitivity, st.spec.label, st.loss
    tree, m = st.tree, st.tree.chunks
    seeds = chunk_seeds(rng, m + 1)
    seeded = rng is not None

    ex = get_executor(executor)
    owns = isinstance(executor, str)
    src = as_input(data, c, T)
    dst = as_output(out, T, c, P)
    readers = src.blocks()
    timings: dict[str, float] = {}
    scratch_dir = None
    try:
        # 2. validate every block (no charge, no noise)
        t0 = time.perf_counter()
        totals = _run(ex, validate_sales_chunk, [readers], m, "validate", progress)
        grand = np.sum(np.array(totals, dtype=np.float64), axis=0)
        if np.any(grand > MAX_MAGNITUDE):
            raise InputBoundError(f"the total of item {ITEMS[int(np.argmax(grand > MAX_MAGNITUDE))]!r} (a root count) "
                                  "exceeds the supported bound 2^50")
        timings["validate"] = time.perf_counter() - t0

        # 3. charge once
        cost = PrivacyCost(epsilon=eps)
        entry = LedgerEntry(label=label, cost=cost, rows=P * tree.nodes(), columns=P * T, noise="laplace",
                            secure=secure, private=not seeded, sensitivity=sens, scale_min=float(full.scales.min()),
                            scale_max=float(full.scales.max()), time=ledger_time())
        if accountant is not None:
            accountant.spend(cost, label=label, entry=entry)

        # 4. measure: the top nodes here, the chunks on the workers
        t0 = time.perf_counter()
        if top is not None:
            tgen = chunk_generator(seeds[-1])
            t_items = np.ascontiguousarray(np.array(totals, dtype=np.int64).T).ravel()  # item-major chunk totals
            y_top = _coordinates(top.measure(t_items, rng=tgen, label=f"{label}: top nodes").y, inner)
        else:
            y_top = np.zeros((0, _Q.shape[1]))
        scratch_dir = make_scratch(scratch, dst.path, "sparsedp-restaurant-")
        summaries = _run(ex, measure_sales_chunk, [[spec] * m, readers, range(m), seeds[:m], [scratch_dir] * m], m,
                         "measure", progress)
        timings["measure+upward"] = time.perf_counter() - t0
        for s, t in zip(summaries, totals):
            if tuple(s.totals) != tuple(t):
                raise SparseDPError(f"chunk {s.q} changed between validation and measurement")

        # 5. top solve (one span coordinate at a time), then the downward pass per chunk
        t0 = time.perf_counter()
        z = np.array([s.z for s in summaries])
        var = np.array([s.var for s in summaries])
        coords = np.column_stack([solve_top(tree, y_top[:, j], np.ones(inner), z[:, j], var)
                                  for j in range(z.shape[1])])
        timings["top"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dst.create()
        roots = [tuple(r) for r in coords[-m:].tolist()]
        results = _run(ex, release_sales_chunk, [[spec] * m, summaries, roots, [dst.block(q) for q in range(m)]], m,
                       "release", progress)
        timings["downward+write"] = time.perf_counter() - t0
        top_values = np.empty((tree.top.nodes, P))
        top_values[inner:] = np.array([r[0] for r in results])
        reaggregate(tree.top, top_values)
        estimate = np.concatenate([r[1] for r in results]) if dst.kind == "return" else None
    finally:
        if scratch_dir is not None:
            shutil.rmtree(scratch_dir, ignore_errors=True)
        if owns:
            ex.close()
    timings["total"] = time.perf_counter() - t_start
    return ScaleoutRestaurantRelease(
        days=T, chunk=c, chunks=m, levels=tree.levels, epsilon=eps, loss=loss, sensitivity=sens,
        scale=float(full.scales[0]), variance=float(full.variances()[0]), top_values=top_values, estimate=estimate,
        out=dst.path, ledger=entry, private=not seeded, secure=secure, executor=ex.name, timings=timings,
    )
