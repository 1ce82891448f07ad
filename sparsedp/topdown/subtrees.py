"""Noise keyed by subtree: what makes a TopDown release the same in-process and chunked on Dask.

A release is cut at a *subtree level* ``s`` (default 1, e.g. the states): the levels above it (the
*top*: the root, ...) are measured as whole levels, and every unit of level ``s`` owns its subtree
(itself and every unit below it).  The noise is drawn from independent streams:

* the top levels' noise from one stream (a ``SeedSequence`` child, or OS entropy);
* subtree ``g`` (the ``g``-th unit of level ``s``) draws the noise of its own units, level by
  level from ``s`` down, from its own stream (child ``1 + g``; OS entropy when unseeded).

Each level's plan is block diagonal in its units (one person moves one cell of one unit per
level), so measuring a level's units subtree by subtree with the level plan's own per-unit rows,
scales, grid and row factors (:class:`UnitPlan`, tiled from the level plan) is the same
measurement as the whole level: every unit's noise is independent with the same law, and the
privacy charge is the level plan's, once per level.  The in-process release
(:func:`sparsedp.topdown.topdown`) and the chunked one (:mod:`sparsedp.topdown.scaleout`) draw
exactly these streams, so for the same seed they publish the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import noise as _noise
from ..errors import ShapeError, SparseDPError
from ..measure import MeasurementPlan
from ..operators import SparseOperator
from ..scaleout.release import chunk_seeds
from .design import LevelPlan
from .hierarchy import Hierarchy

__all__ = ["UnitPlan", "unit_plan", "noise_seeds", "stream", "subtree_ranges", "subtree_level_index",
           "block_offsets", "scatter_rows", "measure_units"]


@dataclass(frozen=True, eq=False)
class UnitPlan:
    """One unit's rows of a level plan (small, picklable): ``matrix`` (``rows x cells``, the
    measured integer rows of one unit, block by block), ``sizes`` (rows per block), the per-row
    ``scales`` / ``unit_scales`` / ``row_factors`` of one unit, and the plan's calibration
    (``grid``, sensitivities, ``loss``, ``cost``).  :meth:`for_units` is the level plan of ``n``
    units (the same plan the level has, restricted to ``n`` of its units)."""

    name: str
    matrix: sp.csr_matrix
    sizes: tuple[int, ...]
    noise: str
    secure: bool
    grid: float
    grid_exact: bool
    scales: np.ndarray
    unit_scales: np.ndarray
    row_factors: np.ndarray | None
    sensitivity: float
    data_sensitivity: float
    loss: float
    cost: Any
    identity: bool

    @property
    def rows(self) -> int:
        """Rows per unit."""
        return int(sum(self.sizes))

    def _tile(self, a: np.ndarray, n: int) -> np.ndarray:
        out, at = [], 0
        for m in self.sizes:
            out.append(np.tile(a[at:at + m], n))
            at += m
        return np.concatenate(out) if out else np.zeros(0)

    def for_units(self, n: int) -> MeasurementPlan:
        """The level's plan of ``n`` units (rows block by block, unit-major within a block, as the
        level plan's)."""
        n = int(n)
        if n < 1:
            raise ShapeError("a plan needs at least one unit")
        C = self.matrix.shape[1]
        if self.identity:
            A = sp.identity(n * C, format="csr", dtype=np.float64)
        else:
            parts, at = [], 0
            eye = sp.identity(n, format="csr")
            for m in self.sizes:
                parts.append(sp.kron(eye, self.matrix[at:at + m], format="csr"))
                at += m
            A = parts[0] if len(parts) == 1 else sp.vstack(parts, format="csr")
        op = SparseOperator(A, name=f"{self.name} ({n} units)")
        return MeasurementPlan(
            strategy=op, measured=op, noise=self.noise, secure=self.secure, grid=self.grid,
            grid_exact=self.grid_exact, scales=self._tile(self.scales, n), unit_scales=self._tile(self.unit_scales, n),
            sensitivity=self.sensitivity, data_sensitivity=self.data_sensitivity, loss=self.loss, cost=self.cost,
            row_factors=None if self.row_factors is None else self._tile(self.row_factors, n),
            identity=self.identity)


def unit_plan(lp: LevelPlan) -> UnitPlan | None:
    """The :class:`UnitPlan` of a measured level (``None`` when it is not measured): unit 0's
    rows of the level plan, checked to be the same for every unit (scales, factors)."""
    p = lp.plan
    if p is None:
        return None
    n = lp.units
    sizes = tuple(int(b.size) for b in lp.blocks)
    rows = np.concatenate([b.start + np.arange(b.size) for b in lp.blocks]).astype(np.int64)
    C = p.measured.shape[1] // n
    if p.identity:
        M = sp.identity(C, format="csr", dtype=np.float64)
    else:
        M = sp.csr_matrix(p.measured.tosparse())[rows][:, :C]
    sc, us = np.asarray(p.scales)[rows], np.asarray(p.unit_scales)[rows]
    rf = None if p.row_factors is None else np.asarray(p.row_factors)[rows]
    up = UnitPlan(lp.label, sp.csr_matrix(M), sizes, p.noise, p.secure, p.grid, p.grid_exact, sc.copy(), us.copy(),
                  None if rf is None else rf.copy(), p.sensitivity, p.data_sensitivity, p.loss, p.cost, p.identity)
    # every unit of the level has unit 0's scales and factors (the plan is block diagonal in units)
    if not (np.array_equal(up._tile(sc, n), p.scales) and np.array_equal(up._tile(us, n), p.unit_scales)
            and (rf is None or np.array_equal(up._tile(rf, n), p.row_factors))):
        raise SparseDPError(f"level {lp.name!r}: the plan's units are not measured alike")  # pragma: no cover
    return up


def block_offsets(sizes: tuple[int, ...], n: int) -> list[int]:
    """Where each block's rows start in the measurement of ``n`` units."""
    out, at = [], 0
    for m in sizes:
        out.append(at)
        at += n * m
    return out


def scatter_rows(y_level: np.ndarray, sizes: tuple[int, ...], n: int, lo: int, y_part: np.ndarray) -> None:
    """Put the measurement ``y_part`` of units ``lo : lo + k`` into the level's ``y_level`` (``n``
    units), block by block."""
    k = y_part.size // max(sum(sizes), 1)
    for m, a, b in zip(sizes, block_offsets(sizes, n), block_offsets(sizes, k)):
        y_level[a + lo * m:a + (lo + k) * m] = y_part[b:b + k * m]


def measure_units(plans: dict, up: UnitPlan, x: np.ndarray, gen: Any) -> np.ndarray:
    """``y`` of the units whose ``(units, cells)`` counts are ``x`` (through
    :meth:`MeasurementPlan.measure`: validated, then drawn; no charge), from ``gen``.  ``plans``
    caches the plans by number of units."""
    n = int(x.shape[0])
    if n == 0:
        return np.zeros(0)
    key = (id(up), n)
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = up.for_units(n)
    return plan.measure(np.ascontiguousarray(x).ravel(), rng=gen, label=up.name).y


def subtree_level_index(h: Hierarchy, level: Any) -> int:
    """The subtree level (a name or index ``1 .. depth``) of ``h``."""
    s = h.level_index(level)
    if s < 1:
        raise ShapeError(f"the subtree level must be below the root (1 .. {h.depth}), got {level!r}")
    return s


def noise_seeds(rng: Any, roots: int) -> tuple[Any, list[Any]]:
    """``(top, per subtree)``: the streams' seeds.  ``None`` (OS entropy: exact, private noise) each
    when ``rng`` is ``None``; a :class:`~sparsedp.noise.SecureRandomBits` is shared by all (drawn in
    order, in-process only); else the children of ``SeedSequence(rng)`` (an int, a
    ``SeedSequence``, or a ``Generator``, which gives the entropy): child 0 for the top, ``1 + g``
    for subtree ``g`` -- reproducible, NOT private."""
    if rng is None:
        return None, [None] * roots
    if isinstance(rng, _noise.SecureRandomBits):
        return rng, [rng] * roots
    kids = chunk_seeds(rng, 1 + roots)  # the children of SeedSequence(rng), as the chunked histograms draw them
    return kids[0], kids[1:]


def stream(seed: Any) -> Any:
    """The generator of a stream's seed (``None`` and :class:`SecureRandomBits` as they are)."""
    if seed is None or isinstance(seed, _noise.SecureRandomBits):
        return seed
    return np.random.Generator(np.random.PCG64(seed))


def subtree_ranges(h: Hierarchy, s: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """For levels ``s .. depth``, ``(lo, hi)``: the units ``lo[g] : hi[g]`` of that level in the
    subtree of unit ``g`` of level ``s`` (contiguous: children are numbered by parent)."""
    lo = np.arange(h.sizes[s], dtype=np.int64)
    hi = lo + 1
    out = [(lo, hi)]
    for d in range(s, h.depth):
        ptr = h.indptr(d)
        lo, hi = ptr[lo], ptr[hi]
        out.append((lo, hi))
    return out
