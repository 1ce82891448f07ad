"""A hierarchical (Boost / ``hierarchical`` strategy) release of a partitioned histogram, chunk by chunk.

:func:`release_hierarchical` publishes the consistent BLUE of a balanced ``k``-ary tree's noisy
node counts (Hay, Rastogi, Miklau, Suciu, VLDB 2010) without ever holding the histogram, the tree
or the output on one process.  On the driver, in this order:

1. shape and budget: the chunked tree (:class:`~sparsedp.scaleout.tree.ChunkedTree`), per-level
   budgets and scales, the measurement plans of a full chunk, of the short last chunk and of the
   top nodes, and the certified privacy loss of the whole tree: ``top.loss + max chunk loss``
   (a leaf's column is covered by its chunk's subtree rows and by the top rows above its chunk)
   must be at most ``epsilon``; the generator is checked and split (``SeedSequence.spawn``);
2. validation: every block is read and checked on the workers (:func:`validate_chunk`), which
   return their exact totals; bad input stops here, before any charge or noise;
3. the charge: ``epsilon`` is spent **once**, for the whole tree, with one ledger entry, before
   any noise is drawn;
4. the top nodes are measured on the driver from the chunk totals; the chunks are measured and
   reduced by their upward passes on the workers (:func:`measure_chunk`, one summary each back);
5. the top solve on the driver (:func:`solve_top`), then the downward pass and the writing of
   every output block on the workers (:func:`release_chunk`).

Why independent per-chunk noise streams keep the guarantee, and why a rerun task cannot spend the
budget twice, is argued in ``docs/scaleout.md``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputBoundError, InvalidPrivacyParameterError, SparseDPError
from ..executors import get_executor
from ..privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time
from ..progress import progress_bar
from ..tree_estimator import two_pass_plan
from ..releases import ReleaseMethods, ReleaseResult, axis_labels
from ..validation import MAX_MAGNITUDE, check_epsilon
from .chunked import as_input, as_output, input_length, load_output, native_chunks
from .subtree import (
    ChunkSpec,
    ChunkSummary,
    chunk_generator,
    chunk_plan,
    measure_chunk,
    release_chunk,
    remove_scratch,
    validate_chunk,
)
from .passes import final_variances, upward
from .top import solve_top, top_plan
from .tree import ChunkedTree, add_up, check_chunking, default_chunk, level_budgets, level_coverage

__all__ = ["ScaleoutRelease", "release_hierarchical", "chunk_seeds"]


@dataclass(frozen=True)
class ScaleoutRelease(ReleaseMethods):
    """A published hierarchical histogram (see :func:`release_hierarchical`).

    ``estimate``: the leaf estimates when no output file was given (else ``None``: read ``out``);
    ``top_values``: final estimates of the top nodes, root first, the chunk roots last;
    ``level_budgets`` / ``level_scales`` / ``level_variances``: per level, root first (the noise of
    every node of that level); ``loss``: certified privacy loss of the whole measurement
    (``<= epsilon``, which was charged); ``ledger``: the one entry the accountant recorded;
    ``private``: ``False`` when the noise came from a seed; ``timings``: seconds per phase;
    ``leaf_variances``: every bin's exact variance (``variances=True``), else ``None``;
    ``budget_rule``: ``"uniform"`` (Boost), ``"boost-un"`` or ``"weights"`` (:attr:`method`)."""

    n: int
    k: int
    chunk: int
    chunks: int
    levels: int
    epsilon: float
    loss: float
    level_budgets: np.ndarray
    level_scales: np.ndarray
    level_variances: np.ndarray
    top_values: np.ndarray
    estimate: np.ndarray | None
    out: str | None
    ledger: LedgerEntry
    private: bool
    secure: bool
    executor: str
    timings: dict = field(default_factory=dict, compare=False)
    leaf_variances: np.ndarray | None = field(default=None, repr=False, compare=False)
    budget_rule: str = "uniform"
    #: records released per unit (:func:`~sparsedp.scaleout.records.release_records` with
    #: ``privacy_unit``): the unit, and the private choice of its bound for ``max_rows="auto"``
    privacy_unit: Any = field(default=None, compare=False)
    bound_choice: Any = field(default=None, repr=False, compare=False)

    @property
    def method(self) -> str:
        """The method these budgets are: ``"boost"`` (uniform, Hay et al. 2010), ``"boost-un"``
        (``eps_l ~ P_l^(1/3)``, :class:`~sparsedp.trees.BoostUN`'s rule) or ``"hierarchical"``
        (budgets proportional to the caller's level weights)."""
        return {"uniform": "boost", "boost-un": "boost-un"}.get(self.budget_rule, "hierarchical")

    def strategy(self) -> str:
        """What was measured and estimated, in words (the release's ``strategy``)."""
        budget = {"uniform": f"uniform budget epsilon / {self.levels} on every node (Boost, Hay et al. 2010)",
                  "boost-un": "one budget per level ~ P_l^(1/3) (Boost-UN)"}.get(
            self.budget_rule, "one budget per level, proportional to the given level weights")
        return (f"balanced {self.k}-ary tree of hierarchical({self.n}, {self.k}) ({self.levels} levels, "
                f"{budget}), Laplace noise per node, BLUE under consistency, chunk by chunk ({self.chunks} chunks "
                f"of {self.chunk} leaves)")

    def load(self) -> np.ndarray:
        """The leaf estimates: ``estimate``, or the output file (memory-mapped ``.npy``, or Zarr)."""
        return self.estimate if self.estimate is not None else load_output(self.out)

    def to_release(self, *, description: dict | None = None, private: bool | None = None) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: one answer per bin (label
        ``bin``; memory-mapped when written to a ``.npy``), each bin's exact variance when the release
        computed them (``variances=True``: ``variance_method="exact-tree"``, one constant when all are
        equal; the answers are then the array ``estimate`` of an ``.npz``), else every bin's variance
        bounded by the leaf level's noise variance (the BLUE is at least as accurate as the leaf's own
        measurement: ``variance_method="bound"``), the one ledger entry.  ``save(OUT)`` with the
        output array's path writes only its record, ``OUT.release.json``."""
        desc = {"method": self.method, "n": self.n, "k": self.k,
                "chunk": self.chunk, "chunks": self.chunks, "levels": self.levels, "epsilon": self.epsilon, "certified_loss": self.loss,
                "level_scales": self.level_scales.tolist(), "level_variances": self.level_variances.tolist(),
                "secure": self.secure, "executor": self.executor}
        desc.update(description or {})
        answers = self.load().reshape(-1)
        lv = self.leaf_variances
        arrays: dict = {}
        if lv is not None:
            how = "exact-tree"
            var = np.broadcast_to(lv[0], (self.n,)) if bool(np.all(lv == lv[0])) else lv
            arrays["estimate"] = answers  # an .npz keeps the answers under the histogram files' name
        else:
            how = "bound"
            var = np.broadcast_to(np.float64(self.level_variances[-1]), (self.n,))
        result = ReleaseResult(
            kind="histogram", answers=answers, labels=axis_labels((self.n,), ["bin"]), variances=var,
            variance_method=how, noise="laplace", secure=bool(self.secure), strategy=self.strategy(),
            ledger=[self.ledger], private=bool(self.private) if private is None else private, description=desc,
            arrays=arrays, source=self, path=self.out)
        if self.privacy_unit is None:
            return result
        from ..unit_records import per_unit_release  # the ledger and description of a per-unit release

        return per_unit_release(result, self.privacy_unit, self.bound_choice)


def chunk_seeds(rng: Any, count: int) -> list[Any]:
    """One noise stream per chunk plus one for the top nodes (the last): ``None`` each (OS entropy:
    exact, private noise) when ``rng`` is ``None``, else the ``count`` children of
    ``SeedSequence(rng)`` (an int or a ``SeedSequence``; a numpy ``Generator`` gives the entropy):
    reproducible, NOT private."""
    if rng is None:
        return [None] * count
    if isinstance(rng, np.random.Generator):
        rng = np.random.SeedSequence(rng.integers(0, 2**32, size=8, dtype=np.uint32).tolist())
    if isinstance(rng, (bool, np.bool_)):
        raise SparseDPError(f"rng must be None, an int seed, a SeedSequence or a Generator, got {rng!r}")
    if isinstance(rng, (int, np.integer)):
        if int(rng) < 0:
            raise SparseDPError(f"a seed must be >= 0, got {rng!r}")
        rng = np.random.SeedSequence(int(rng))
    if not isinstance(rng, np.random.SeedSequence):
        raise SparseDPError(f"rng must be None, an int seed, a SeedSequence or a Generator, got {type(rng).__name__}")
    return list(rng.spawn(count))


def check_release_args(epsilon: float, secure: Any, accountant: Any) -> tuple[float, bool]:
    """The checks every scale-out release makes first: ``epsilon`` (finite, ``> 0``), ``secure`` a
    bool, ``accountant`` ``None`` or an :class:`~sparsedp.privacy.Accountant`; ``(eps, secure)``."""
    eps = check_epsilon(epsilon, "epsilon")
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True or False, got {secure!r}")
    if accountant is not None and not isinstance(accountant, Accountant):
        raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
    return eps, bool(secure)


def make_scratch(scratch: str | Path | None, out: str | None, prefix: str = "sparsedp-scaleout-") -> str:
    """A fresh scratch directory (the caller removes it): inside ``scratch`` (created if missing), else
    next to the output file ``out``, else in the system's temporary directory."""
    if scratch is None:
        return tempfile.mkdtemp(prefix=prefix, dir=None if out is None else str(Path(out).resolve().parent))
    Path(scratch).mkdir(parents=True, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=str(scratch))


def _resolve_chunk(data: Any, n: int, k: int, chunk: int | None) -> tuple[Any, int]:
    """The chunk length (and the data, rechunked when asked): an explicit ``chunk`` (a power of
    ``k``) rechunks a dask array; otherwise a dask / Zarr input keeps its own blocks, which must be
    aligned (or :class:`SparseDPError`), and anything else gets :func:`default_chunk`."""
    native = native_chunks(data)
    if chunk is not None:
        c = int(chunk)
        ChunkedTree(n, k, c)  # a power of k in [1, n], or a clear error
        if native is not None and hasattr(data, "rechunk") and tuple(native) != ChunkedTree(n, k, c).lengths():
            data = data.rechunk(c)
        return data, c
    if native is not None:
        c = check_chunking(native, k)
        if c > n:  # pragma: no cover - a single short block
            c = n
        return data, c
    return data, default_chunk(n, k)


def release_hierarchical(
    data: Any,
    epsilon: float,
    *,
    k: int = 16,
    chunk: int | None = None,
    level_weights: Any = None,
    executor: Any = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    out: str | Path | None = None,
    secure: bool = True,
    scratch: str | Path | None = None,
    progress: bool | None = None,
    variances: bool = False,
) -> ScaleoutRelease:
    """Publish an epsilon-DP consistent histogram on a balanced ``k``-ary tree, chunk by chunk.

    Mechanism: every node ``u`` of the tree of :func:`sparsedp.strategies.hierarchical` is measured
    as ``x(I_u) + Lap(b_l)`` (exact discrete Laplace by default), ``b_l = (1 + m) / eps_l`` for the
    node's level (``eps_l = eps / L``: Boost; ``level_weights``: budgets proportional to the given
    per-level weights, root first, or ``"boost-un"``: ``eps_l ~ P_l^(1/3)`` with ``P_l`` the expected
    number of level-``l`` nodes in a uniformly random range's decomposition, as
    :class:`~sparsedp.trees.BoostUN`).  Sensitivity: one record changes one leaf, hence one node per
    level, so the loss is ``sum_l 1 / b_l <= epsilon`` (certified from the measured intervals, top
    plan plus chunk plan).  The estimate is the BLUE of the node counts under consistency (the
    O(n) two-pass), identical to the whole-tree :func:`~sparsedp.tree_estimator.two_pass` with the
    same noise.

    ``data``: a ``.npy`` / ``.zarr`` path, a ``dask.array`` or a numpy array of non-negative integer
    counts (see :mod:`sparsedp.scaleout.chunked`).  ``chunk``: leaves per task, a power of ``k``
    (default: the input's own aligned blocks, else the largest power of ``k`` up to ``2^20``).
    ``executor``: ``None`` (in-process), ``"threads"``, ``"dask"``, a ``dask.distributed.Client``
    or an executor (:mod:`sparsedp.executors`).  ``rng``: ``None`` (OS entropy: a private release),
    or an int / ``SeedSequence`` / ``Generator`` (one child stream per chunk: reproducible, not
    private).  ``out``: a ``.npy`` / ``.zarr`` path written block by block, or ``None`` (the leaves
    are returned in ``estimate``).  ``scratch``: a directory for the noisy node measurements
    between the two passes (default: a temporary directory next to ``out``; on a real cluster,
    storage every worker reaches), removed at the end.  ``variances``: also compute the exact
    variance of every bin's estimate (:func:`~sparsedp.scaleout.passes.final_variances`, per chunk
    from its root's outside variance; post-processing of public variances), kept in
    ``leaf_variances`` (needs ``out=None``).

    The chunking decides which noise stream measures which node, so the same ``rng`` with the same
    ``k`` and ``chunk`` gives the same release on every executor, bit for bit (the CLI's
    ``sparsedp histogram --method boost`` runs this function in process and with ``--executor``).
    """
    t_start = time.perf_counter()
    eps, secure = check_release_args(epsilon, secure, accountant)
    if isinstance(k, (bool, np.bool_)) or int(k) != k or k < 2:
        raise SparseDPError(f"k must be an integer >= 2, got {k!r}")
    k = int(k)
    if not isinstance(variances, (bool, np.bool_)):
        raise SparseDPError(f"variances must be True or False, got {variances!r}")
    if variances and out is not None:
        raise SparseDPError("variances=True returns every bin's exact variance with the estimate: use out=None (a "
                            ".npy / .zarr release records a bound on them)")
    n = input_length(data)
    data, c = _resolve_chunk(data, n, k, chunk)
    tree = ChunkedTree(n, k, c)
    m = tree.chunks

    # 1. budgets, scales, plans and the certified loss of the whole tree (no data read yet)
    rule = "uniform" if level_weights is None else "weights"
    if isinstance(level_weights, str):
        if level_weights != "boost-un":
            raise SparseDPError(f"level_weights must be per-level weights or 'boost-un', got {level_weights!r}")
        level_weights = np.cbrt(level_coverage(n, k))  # Boost-UN: eps_d ~ P_d^(1/3)
        rule = "boost-un"
    budgets = level_budgets(tree.levels, eps, level_weights)
    scales = tree.node_scales(budgets)
    tp = top_plan(tree, scales, secure)
    lengths = sorted(set(tree.lengths()))
    chunk_scales = tuple(float(s) for s in scales[tree.top_levels :])
    spec = ChunkSpec(k, tree.chunk_levels, chunk_scales, secure, label=f"scaleout hierarchical(n={n}, k={k})")
    losses = tuple((L, float(chunk_plan(spec, L).plan.loss)) for L in lengths)
    spec = ChunkSpec(k, tree.chunk_levels, chunk_scales, secure, losses, spec.label)
    loss = add_up(tp.loss, max(v for _, v in losses))
    if not loss <= eps:
        raise InvalidPrivacyParameterError(f"the certified loss {loss!r} of the tree exceeds epsilon {eps!r}")
    seeds = chunk_seeds(rng, m + 1)
    seeded = rng is not None
    full = chunk_plan(spec, lengths[-1]).plan
    level_scales = _per_level(tree, tp.plan, full, lambda p: p.scales)  # as measured (rounded up by the path)
    level_vars = _per_level(tree, tp.plan, full, lambda p: p.variances())

    ex = get_executor(executor)
    owns = isinstance(executor, str)
    src = as_input(data, c)
    dst = as_output(out, n, c)
    readers = src.blocks()
    timings: dict[str, float] = {}
    scratch_dir = None
    summaries: list[ChunkSummary] = []
    try:
        # 2. validate every block (no noise, no charge)
        t0 = time.perf_counter()
        totals = _run(ex, validate_chunk, [readers], m, "validate", progress)
        grand = sum(int(t) for t in totals)
        if grand > MAX_MAGNITUDE:
            raise InputBoundError("the histogram's total (the root count) exceeds the supported bound 2^50")
        timings["validate"] = time.perf_counter() - t0

        # 3. charge once, for the whole tree
        cost = PrivacyCost(epsilon=eps)
        label = f"scaleout hierarchical(n={n}, k={k}): {m} chunks of {c} leaves"
        entry = LedgerEntry(label=label, cost=cost, rows=tree.nodes(), columns=n, noise="laplace", secure=secure,
                            private=not seeded, sensitivity=float(tree.levels), scale_min=float(scales.min()),
                            scale_max=float(scales.max()), time=ledger_time())
        if accountant is not None:
            accountant.spend(cost, label=label, entry=entry)

        # 4. measure: the top nodes here, the chunks on the workers
        t0 = time.perf_counter()
        if tp.plan is not None:
            tgen = chunk_generator(seeds[-1])
            top_meas = tp.plan.measure(np.asarray(totals, dtype=np.int64), rng=tgen, label=f"{label}: top nodes")
            y_top = top_meas.y
            v_top = np.maximum(tp.plan.variances(), 1e-100)
        else:
            y_top = v_top = np.zeros(0)
        scratch_dir = work = make_scratch(scratch, dst.path)
        summaries = _run(ex, measure_chunk, [[spec] * m, readers, range(m), seeds[:m], [work] * m], m, "measure",
                         progress)
        timings["measure+upward"] = time.perf_counter() - t0
        for s, t in zip(summaries, totals):
            if s.total != t:
                raise SparseDPError(f"chunk {s.q} changed between validation and measurement (total {t} -> {s.total})")

        # 5. top solve, then the downward pass per chunk
        t0 = time.perf_counter()
        top_values = solve_top(tree, y_top, v_top, np.array([s.z for s in summaries]),
                               np.array([s.var for s in summaries]))
        roots = top_values[-m:]
        outside = [None] * m
        if variances:
            outside = _outside(tree, v_top, np.array([s.var for s in summaries])).tolist()
        timings["top"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dst.create()
        results = _run(ex, release_chunk, [[spec] * m, summaries, roots.tolist(), [dst.block(q) for q in range(m)],
                                           outside], m, "release", progress)
        timings["downward+write"] = time.perf_counter() - t0
        estimate = leaf_var = None
        if dst.kind == "return":
            estimate = np.concatenate([r[1] for r in results])
        if variances:
            leaf_var = np.concatenate([r[2] for r in results])
    finally:
        if scratch_dir is not None:
            remove_scratch([s.path for s in summaries])
            shutil.rmtree(scratch_dir, ignore_errors=True)  # also files of attempts whose summary was never used
        if owns:
            ex.close()
    timings["total"] = time.perf_counter() - t_start
    return ScaleoutRelease(
        n=n, k=k, chunk=c, chunks=m, levels=tree.levels, epsilon=eps, loss=loss, level_budgets=budgets,
        level_scales=level_scales, level_variances=level_vars, top_values=top_values, estimate=estimate, out=dst.path,
        ledger=entry, private=not seeded, secure=secure, executor=ex.name, timings=timings, leaf_variances=leaf_var,
        budget_rule=rule,
    )


def _outside(tree: ChunkedTree, v_top: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The outside variance of every chunk root (:func:`~sparsedp.scaleout.passes.final_variances` on
    the top tree, whose leaves are the chunk roots measured with their upward variances)."""
    if tree.chunks == 1:
        return np.array([np.inf])
    parent, level_start = tree.top.bfs()
    v = np.concatenate([v_top, var])
    plans = two_pass_plan(parent, level_start)
    state = upward(plans, level_start, np.zeros(v.size), v, overwrite=True)
    return final_variances(plans, state, v)[1][-tree.chunks :]


def _per_level(tree: ChunkedTree, top: Any, full: Any, get: Any) -> np.ndarray:
    """One value per level, root first, of a per-row array of the top plan and the full chunk's plan
    (every node of a level has the same budget)."""
    layout = tree.chunk_layout(tree.chunk)
    chunk_rows = [int(layout.row_offsets[lev]) for lev in reversed(range(layout.levels))]
    top_rows = [int(tree.top.row_offsets[lev]) for lev in reversed(range(1, tree.top.levels))]
    head = np.asarray(get(top), dtype=np.float64)[top_rows] if top is not None else np.zeros(0)
    return np.concatenate([head, np.asarray(get(full), dtype=np.float64)[chunk_rows]])


def _run(ex: Any, fn: Any, args: list, total: int, desc: str, progress: bool | None) -> list:
    """``ex.map(fn, *args)`` with a progress bar over chunks (drawn on a terminal only, unless
    ``progress`` says otherwise)."""
    disable = None if progress is None else not progress
    with progress_bar(total=total, desc=desc, unit="chunk", disable=disable) as bar:
        return ex.map(fn, *args, callback=lambda: bar.update(1))
