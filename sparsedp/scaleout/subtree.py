"""The per-chunk tasks of a scale-out release: validate, measure + upward pass, downward pass.

Every task is a module-level function of small picklable arguments, safe to run again (Dask runs a
task again when its worker dies):

* :func:`validate_chunk` reads a block, checks it (1-D, finite, non-negative integers, at most
  ``2^50``) and returns its exact total.  No noise.
* :func:`measure_chunk` reads the block, measures the chunk's subtree nodes through the one
  measurement path (``MeasurementPlan.measure`` with no accountant: the driver charged the whole
  tree once before any task was submitted), runs the upward pass, writes the noisy node
  measurements to a scratch file named for this attempt, and returns a :class:`ChunkSummary`
  (the root's upward estimate and variance, the block's exact total and the scratch file).  Its
  noise comes from the chunk's own stream: a ``SeedSequence`` child when the release is seeded (a
  rerun redraws the same noise), else an OS-seeded CSPRNG (exact noise; a rerun draws
  fresh noise into a new file, and only the attempt whose summary the driver received is ever
  used -- see ``docs/scaleout.md``).
* :func:`release_chunk` reads back exactly that file, repeats the (deterministic) upward pass, runs
  the downward pass from the root value the top solve gave, and writes the chunk's leaves.  It draws
  no noise, so running it again writes the same values.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputBoundError, SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..tree_estimator import LevelPlan
from ..validation import MAX_MAGNITUDE, check_counts
from .chunked import BlockReader, BlockWriter
from .passes import downward, final_variances, upward
from .tree import bfs_plan, chunk_layout, row_levels

__all__ = ["ChunkSpec", "ChunkSummary", "ChunkPlan", "chunk_plan", "validate_chunk", "measure_chunk", "release_chunk"]

#: BLUE weights use ``max(variance, MIN_VARIANCE)`` (as the tree publishers): post-processing only.
MIN_VARIANCE = 1e-100


@dataclass(frozen=True)
class ChunkSpec:
    """What every chunk task needs to rebuild its measurement plan (hashable, a few bytes).

    ``scales``: the Laplace scale of each of the chunk's levels, root (level ``j``) first;
    ``losses``: the certified loss the driver computed, per chunk length (a worker refuses a plan
    whose loss differs)."""

    k: int
    levels: int
    scales: tuple[float, ...]
    secure: bool
    losses: tuple[tuple[int, float], ...] = ()
    label: str = "scaleout"


@dataclass(frozen=True)
class ChunkPlan:
    """A chunk's measurement plan and the shape data of its two passes."""

    plan: MeasurementPlan
    level_start: np.ndarray
    plans: tuple[LevelPlan, ...]
    variances: np.ndarray  # BLUE weights: the plan's per-row variances, floored at MIN_VARIANCE


def _chunk_plan(k: int, levels: int, scales: tuple[float, ...], secure: bool, length: int) -> ChunkPlan:
    layout = chunk_layout(length, k, levels)
    lo, hi = layout.intervals()
    row_scales = np.asarray(scales, dtype=np.float64)[row_levels(layout)]
    rows = IntervalRows(length, lo, hi, name=f"subtree({length} leaves, k={k}, {levels} levels)")
    plan = plan_measurement(rows, scales=row_scales, noise="laplace", secure=secure)
    _, level_start, plans = bfs_plan(layout)
    return ChunkPlan(plan, level_start, plans, np.maximum(plan.variances(), MIN_VARIANCE))


_cached_plan = lru_cache(maxsize=4)(_chunk_plan)


def chunk_plan(spec: ChunkSpec, length: int) -> ChunkPlan:
    """The plan of a chunk of ``length`` leaves (cached per process: a worker builds it once)."""
    cp = _cached_plan(spec.k, spec.levels, spec.scales, spec.secure, int(length))
    expected = dict(spec.losses).get(int(length))
    if expected is not None and cp.plan.loss != expected:
        raise SparseDPError(f"chunk plan loss {cp.plan.loss!r} differs from the certified {expected!r}")
    return cp


def _exact_total(xv: np.ndarray, name: str) -> int:
    """The exact integer total of validated counts, refusing totals above ``2^50``."""
    if float(np.sum(xv)) > 2.0 * MAX_MAGNITUDE:  # float sum within 1e-9 relative: int64 is safe below
        raise InputBoundError(f"{name}: the total exceeds the supported bound 2^50")
    total = int(np.sum(xv.astype(np.int64)))
    if total > MAX_MAGNITUDE:
        raise InputBoundError(f"{name}: the total exceeds the supported bound 2^50")
    return total


def _name(reader: BlockReader) -> str:
    return f"histogram[{reader.lo}:{reader.hi}]"


def validate_chunk(reader: BlockReader) -> int:
    """Read and check one block (shape, finite, non-negative integers, at most ``2^50``); its exact total."""
    x = reader.read()
    xv = check_counts(x, reader.hi - reader.lo, _name(reader))
    return _exact_total(xv, _name(reader))


@dataclass(frozen=True)
class ChunkSummary:
    """What a chunk hands to the driver: ``z`` / ``var`` (its root's upward estimate and its
    variance), the block's exact ``total`` (checked against validation) and the scratch ``path`` of
    this attempt's noisy node measurements."""

    q: int
    z: float
    var: float
    total: int
    path: str


def chunk_generator(seed: Any) -> Any:
    """``None`` (OS entropy, exact noise) or a generator from the chunk's ``SeedSequence``."""
    return None if seed is None else np.random.Generator(np.random.PCG64(seed))


def measure_chunk(spec: ChunkSpec, reader: BlockReader, q: int, seed: Any, scratch: str) -> ChunkSummary:
    """Measure chunk ``q``'s subtree (no charge: the driver charged the whole tree), run the upward
    pass, keep the measurements in ``scratch`` under a name unique to this attempt."""
    x = reader.read()
    cp = chunk_plan(spec, reader.hi - reader.lo)
    meas = cp.plan.measure(x, rng=chunk_generator(seed), label=f"{spec.label} chunk {q}")  # validates, then draws
    total = _exact_total(np.asarray(x, dtype=np.float64), _name(reader))
    path = os.path.join(scratch, f"chunk{q:07d}-{uuid.uuid4().hex}.npy")
    tmp = path + ".part"
    with open(tmp, "wb") as fh:
        np.save(fh, meas.y)
    os.replace(tmp, path)  # a killed attempt leaves at most a .part file, never a readable one
    state = upward(cp.plans, cp.level_start, meas.y, cp.variances, overwrite=True)
    z, var = state.root
    return ChunkSummary(q, z, var, total, path)


def release_chunk(spec: ChunkSpec, summary: ChunkSummary, root_value: float, writer: BlockWriter,
                  outside: float | None = None) -> Any:
    """Final leaf estimates of one chunk from its stored measurements and its root's final value,
    written by ``writer``.  Returns ``(sum of the leaves, the leaves or None, their variances or
    None)``: with ``outside`` (the chunk root's outside variance from the top tree,
    :func:`~sparsedp.scaleout.passes.final_variances`), the exact variance of every leaf's estimate."""
    y = np.load(summary.path, allow_pickle=False)
    cp = chunk_plan(spec, writer.hi - writer.lo)
    if y.shape != (cp.plan.rows,):
        raise SparseDPError(f"{summary.path}: {y.shape} measurements for a {cp.plan.rows}-node subtree")
    state = upward(cp.plans, cp.level_start, y, cp.variances, overwrite=True)
    z = downward(cp.plans, state, root_value)
    first = int(cp.level_start[-2])
    leaves = z[first:]
    kept = writer.write(leaves)
    var = None
    if outside is not None:
        var = final_variances(cp.plans, state, cp.variances, outside)[0][first:]
    return float(leaves.sum()), kept, var


def remove_scratch(paths: list[str]) -> None:
    """Delete scratch files (missing ones are ignored)."""
    for p in paths:
        Path(p).unlink(missing_ok=True)
