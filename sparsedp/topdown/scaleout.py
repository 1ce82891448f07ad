"""The TopDown release chunked by subtree, on Dask (or any executor of :mod:`sparsedp.executors`).

:func:`topdown_scaleout` publishes the release of :func:`sparsedp.topdown.topdown` -- the same
bits, for the same seed and ``subtree_level`` -- without the table or the output ever being on
one process: each task owns whole subtrees of the *subtree level* ``s`` (default 1: the states),
reads them itself (a part of a Parquet dataset, a slice of an in-memory table, or a synthetic
generator keyed by part), and the driver holds the levels above ``s``, one summary per subtree
and, while it plans, the hierarchy's public structure (one parent index per unit, no code and no
count).  On the driver, in this order:

1. **validate** (tasks, no noise): every part is read and checked (non-negative integer counts,
   the declared levels and cells); each task returns, per subtree, its root's codes, its units per
   level, the levels where it has leaves, its units' parent indices (the public structure) and its
   root's exact counts (kept on the driver, never published: the top levels are measured from
   them);
2. **plan and check**, before any charge: the design (:func:`~sparsedp.topdown.plan_topdown` on a
   skeleton: the real top levels and, below ``s``, a few units with leaves where the table has
   them -- every level's plan is per unit, so its scales, grid and cost are the real level's;
   the optimised design, the default, chosen by :func:`~sparsedp.topdown.design.optimal_split` on
   the whole public structure gathered from the parts, then planned on the skeleton with its
   shares), its error summary on the whole structure (data-free), the invariants (levels ``0 ..
   s`` from the roots' counts or explicit values, deeper explicit values; those deeper and from the
   data are taken by each task from its own subtrees), the generator, the accountant; where,
   below ``s``, explicit values meet an invariant taken from the data, every part is read again
   to check, subtree by subtree, that they agree (as in process: the error before any charge);
3. **charge** every measured level once, one ledger entry each (its whole-level rows);
4. **measure**: the top levels on the driver from the top stream; every subtree on a worker from
   its own stream (:mod:`sparsedp.topdown.subtrees`), then the subtree's part of the GLS upward
   pass (with the invariants of its levels); the measurements go to a scratch file, the root's
   upward estimate and variance (one vector of components each) back to the driver;
5. **top**: the driver finishes the upward pass, runs the downward pass over the top levels, and
   rounds the top levels (levels ``0 .. s``, as :func:`~sparsedp.topdown.release.integer_counts`
   does: the subtree roots' counts are fixed here, with the invariants -- crossed ones too, whose
   fallback sums a parent and its ancestors again; crossed invariants meeting below ``s`` are
   refused before anything is read); it writes them;
6. **release**: every task reads back its subtrees' measurements, repeats the (deterministic)
   upward pass, runs the downward pass from its root's estimate, rounds its levels given its
   root's integer counts (and its levels' invariants: a part is read again when they come from the
   data, so that no count is ever written to the scratch files), writes its part of the output and
   returns small metadata (units per level, violations counted).

The release directory holds ``topdown.json`` (the manifest: the ledger, the description, the
files), ``top.npz`` (levels ``0 .. s``) and ``parts/part-NNNNN.npz`` (every level below ``s`` of
the part's subtrees): per unit its depth, code, parent (index in the level above), counts,
estimate and variance.  :func:`load_chunked` (and :func:`sparsedp.load_release`) read it.

The noise of a seeded release is reproducible and NOT private; unseeded, every stream is OS
entropy.  A task whose worker dies is run again: validation and release draw no noise; a rerun
measurement draws fresh noise into a new scratch file, and only the attempt whose summary the
driver received is used (as in :mod:`sparsedp.scaleout`; ``docs/scaleout.md``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import noise as _noise
from ..errors import (
    InfeasibleConstraintsError,
    InputBoundError,
    InvalidPrivacyParameterError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
)
from ..executors import DaskExecutor, get_executor
from ..privacy import Accountant
from ..progress import progress_bar
from ..release_file import FORMAT
from ..releases import register_reader
from ..safe_files import resolve_inside
from ..validation import MAX_MAGNITUDE
from .design import (
    _Z95,
    Invariant,
    TopDownDesign,
    _optimal_spec,
    chosen_shares,
    totals_first_levels,
    optimal_split,
    pinned_components,
    pinned_marginals,
    plan_topdown,
)
from .gls import Upward, class_variances, downward_level, shape_classes, upward_level
from .hierarchy import (
    CellDomain,
    HierarchicalTable,
    Hierarchy,
    _check_count_matrix,
    check_contributions,
    expand_columns,
)
from .release import (
    LevelPins,
    TopDownRelease,
    agreed_values,
    charge_levels,
    check_weights,
    integer_counts,
    level_pins,
    level_values,
    own_level,
    pin_values,
    push_explicit,
    resolve_contributions,
    round_level,
    to_cells,
)
from .subtrees import measure_units, noise_seeds, stream, subtree_ranges, unit_plan
from .units import level_costs

__all__ = ["SubtreeData", "TableSource", "ParquetSource", "SyntheticNation", "ChunkedTopDownRelease",
           "topdown_scaleout", "load_chunked", "split_subtrees", "full_error_summary", "MANIFEST"]

#: The manifest of a chunked TopDown release directory.
MANIFEST = "topdown.json"


# -- the data of one subtree, and where it comes from ---------------------------------------------


@dataclass(frozen=True, eq=False)
class SubtreeData:
    """One subtree (SECRET: true counts): ``path`` (the codes of its root and the root's ancestors,
    levels ``1 .. s``), ``hierarchy`` (levels ``s .. depth``, the root at its level 0) and
    ``counts`` (one ``(units, cells)`` int64 array per level)."""

    path: tuple[str, ...]
    hierarchy: Hierarchy
    counts: tuple[np.ndarray, ...]


def split_subtrees(table: HierarchicalTable, s: int) -> list[SubtreeData]:
    """The subtrees of the units of level ``s`` of ``table`` (every level ``s .. depth`` kept, empty
    where a subtree is shallower)."""
    h = table.hierarchy
    if not 1 <= s <= h.depth:
        raise ShapeError(f"the subtree level must be 1 .. {h.depth}, got {s}")
    ranges = subtree_ranges(h, s)
    paths = [np.asarray(p).astype(str) for p in h.paths(s)]
    out = []
    for g in range(h.sizes[s]):
        parents, codes, counts = [np.array([-1], dtype=np.int64)], [np.asarray(h.codes[s][g:g + 1]).astype(str)], []
        counts.append(np.array(table.counts[s][g:g + 1]))
        for i in range(1, len(ranges)):
            lo, hi = int(ranges[i][0][g]), int(ranges[i][1][g])
            plo = int(ranges[i - 1][0][g])
            parents.append(np.array(h.parents[s + i][lo:hi]) - plo)
            codes.append(np.asarray(h.codes[s + i][lo:hi]).astype(str))
            counts.append(np.array(table.counts[s + i][lo:hi]))
        sub = Hierarchy(tuple(h.levels[s:]), tuple(parents), tuple(codes), h.cells)
        out.append(SubtreeData(tuple(str(p[g]) for p in paths), sub, tuple(counts)))
    return out


@dataclass(frozen=True, eq=False)
class _TablePart:
    subtrees: tuple[SubtreeData, ...]

    def read(self) -> list[SubtreeData]:
        return list(self.subtrees)


@dataclass(frozen=True, eq=False)
class TableSource:
    """An in-memory :class:`HierarchicalTable` cut into parts of ``per_part`` subtrees (sliced on
    the driver: for tests and tables that fit in memory)."""

    table: HierarchicalTable
    per_part: int = 1
    #: the parts hold the subtrees in the table's order (else they are sorted by their codes)
    in_order: bool = True

    @property
    def levels(self) -> tuple[str, ...]:
        return self.table.hierarchy.levels

    @property
    def cells(self) -> CellDomain:
        return self.table.cells

    def parts(self, s: int) -> list[Any]:
        subs = split_subtrees(self.table, s)
        k = max(1, int(self.per_part))
        return [_TablePart(tuple(subs[i:i + k])) for i in range(0, len(subs), k)]


@dataclass(frozen=True)
class _ParquetPart:
    files: tuple[str, ...]
    fixed: tuple[tuple[str, str], ...]  # columns given by the partition's directory name
    geo: tuple[str, ...]
    counts: tuple[str, ...]
    attributes: Any
    sep: str
    root: str
    s: int
    contributions_per_person: int = 1

    def read(self) -> list[SubtreeData]:
        import pandas as pd

        cols = [g for g in self.geo if g not in dict(self.fixed)] + list(self.counts)
        try:
            frame = pd.concat([pd.read_parquet(f, columns=cols) for f in self.files], ignore_index=True)
        except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
            raise SparseDPError(f"cannot read {self.files[0]}: {exc}") from exc
        for name, value in self.fixed:
            frame[name] = value
        for g in self.geo:
            miss = frame[g].isna()
            frame[g] = frame[g].astype("string").astype(object)
            frame.loc[miss, g] = None
        table = HierarchicalTable.from_counts(frame, list(self.geo), list(self.counts), attributes=self.attributes,
                                              sep=self.sep, root=self.root,
                                              contributions_per_person=self.contributions_per_person)
        return split_subtrees(table, self.s)


@dataclass(frozen=True)
class ParquetSource:
    """A Parquet table too big for one process, read part by part by the workers: a directory
    partitioned by a geography column (Hive layout, ``state_fips=06/...parquet``: one part per
    directory), a directory of ``.parquet`` files (one part per file), or one file.  Every part
    must hold whole subtrees of the subtree level (partition by a geography column at or above
    it).  ``geo`` / ``counts`` / ``attributes`` / ``sep`` / ``root`` / ``contributions_per_person``
    as :func:`read_table` (each part's count columns are checked to partition the people on its
    rows, by its worker, during validation)."""

    path: str
    geo: tuple[str, ...]
    counts: Any
    attributes: Any = None
    sep: str = "_"
    root: str = "root"
    contributions_per_person: int = 1

    def _files(self) -> list[tuple[tuple[str, ...], tuple[tuple[str, str], ...]]]:
        p = Path(self.path)
        if p.is_file():
            return [((str(p),), ())]
        if not p.is_dir():
            raise SparseDPError(f"no such Parquet table: {p}")
        subdirs = sorted(d for d in p.iterdir() if d.is_dir() and "=" in d.name)
        if subdirs:
            out = []
            for d in subdirs:
                name, _, value = d.name.partition("=")
                files = tuple(sorted(str(f) for f in d.rglob("*.parquet")))
                if files:
                    out.append((files, ((name, value),)))
            return out
        files = sorted(str(f) for f in p.glob("*.parquet"))
        if not files:
            raise SparseDPError(f"{p}: no .parquet files")
        return [((f,), ()) for f in files]

    def _schema(self) -> list[str]:
        import pyarrow.parquet as pq

        files, fixed = self._files()[0]
        try:
            names = list(pq.read_schema(files[0]).names)
        except Exception as exc:  # noqa: BLE001
            raise SparseDPError(f"cannot read {files[0]}: {exc}") from exc
        return names + [n for n, _ in fixed if n not in names]

    @property
    def levels(self) -> tuple[str, ...]:
        return (self.root, *self._geo())

    def _geo(self) -> tuple[str, ...]:
        return tuple(g.strip() for g in self.geo.split(",")) if isinstance(self.geo, str) else tuple(self.geo)

    def _counts(self) -> list[str]:
        geo = self._geo()
        header = self._schema()
        missing = [g for g in geo if g not in header]
        if missing:
            raise ShapeError(f"unknown geography column(s) {missing}; the table has {header[:40]}")
        return expand_columns(self.counts, [c for c in header if c not in geo])

    @property
    def cells(self) -> CellDomain:
        from .hierarchy import _cell_domain

        return _cell_domain(self._counts(), self.attributes, self.sep)

    def parts(self, s: int) -> list[Any]:
        counts = tuple(self._counts())
        k = check_contributions(self.contributions_per_person)
        return [_ParquetPart(files, fixed, self._geo(), counts, self.attributes, self.sep, self.root, s, k)
                for files, fixed in self._files()]


@dataclass(frozen=True)
class _SyntheticPart:
    spec: "SyntheticNation"
    state: int

    def read(self) -> list[SubtreeData]:
        return [self.spec.subtree(self.state)]


@dataclass(frozen=True)
class SyntheticNation:
    """A synthetic nation generated subtree by subtree (a benchmark input: each part is one state,
    made by its worker from ``(seed, state)``; no count of the nation is ever on the
    driver): ``states`` states, each with ``counties`` counties, ``tracts`` tracts per county and
    ``blocks`` blocks per tract on average (sizes drawn uniformly within +-50% when ``vary``),
    ``cells`` = ``ages`` x ``races`` cells, counts Poisson with mean ``mean`` (many zeros).  Levels:
    ``nation > state > county > tract > block``; the subtree level is 1 (the states)."""

    states: int = 50
    counties: int = 64
    tracts: int = 25
    blocks: int = 125
    ages: int = 2
    races: int = 8
    mean: float = 1.5
    seed: int = 0
    vary: bool = True
    in_order: bool = True

    @property
    def levels(self) -> tuple[str, ...]:
        return ("nation", "state", "county", "tract", "block")

    @property
    def cells(self) -> CellDomain:
        ages = tuple(f"a{i}" for i in range(self.ages))
        races = tuple(f"r{i}" for i in range(self.races))
        cols = tuple(f"{a}_{r}" for a in ages for r in races)
        return CellDomain(("age", "race"), (ages, races), cols)

    def _sizes(self, gen: np.random.Generator, mean: int, n: int) -> np.ndarray:
        if not self.vary or mean < 2:
            return np.full(n, mean, dtype=np.int64)
        return gen.integers(max(1, mean - mean // 2), mean + mean // 2 + 1, n).astype(np.int64)

    def subtree(self, state: int) -> SubtreeData:
        """State ``state``'s subtree (deterministic in ``(seed, state)``)."""
        gen = np.random.default_rng([int(self.seed), int(state)])
        nc = int(self._sizes(gen, self.counties, 1)[0])
        tr = self._sizes(gen, self.tracts, nc)
        bl = self._sizes(gen, self.blocks, int(tr.sum()))
        sizes = [1, nc, int(tr.sum()), int(bl.sum())]
        parents = (np.array([-1], dtype=np.int64), np.zeros(nc, dtype=np.int64),
                   np.repeat(np.arange(nc, dtype=np.int64), tr),
                   np.repeat(np.arange(int(tr.sum()), dtype=np.int64), bl))
        codes = tuple(np.char.zfill(np.arange(n).astype(str), w) for n, w in zip(sizes, (2, 3, 4, 4)))
        codes = (np.array([f"{state:02d}"]),) + codes[1:]
        cells = self.cells
        leaf = gen.poisson(self.mean, (sizes[-1], cells.size)).astype(np.int64)
        h = Hierarchy(self.levels[1:], parents, codes, cells)
        counts = [leaf]
        for d in range(h.depth - 1, -1, -1):
            counts.insert(0, h.children_sum(d, counts[0]))
        return SubtreeData((f"{state:02d}",), h, tuple(counts))

    def parts(self, s: int) -> list[Any]:
        if s != 1:
            raise ShapeError("the synthetic nation's subtrees are its states (subtree level 1)")
        return [_SyntheticPart(self, q) for q in range(self.states)]

    def table(self) -> HierarchicalTable:
        """The whole nation in memory (small nations: the in-process release's input)."""
        return assemble_table([self.subtree(q) for q in range(self.states)], self.levels)


def assemble_table(subtrees: Sequence[SubtreeData], levels: Sequence[str]) -> HierarchicalTable:
    """One in-memory :class:`HierarchicalTable` of subtrees of level 1 (in order; the root above)."""
    if not subtrees:
        raise ShapeError("no subtrees")
    if any(len(sub.path) != 1 for sub in subtrees):
        raise ShapeError("assemble_table takes subtrees of level 1")
    cells = subtrees[0].hierarchy.cells
    L = len(levels)
    parents = [np.array([-1], dtype=np.int64), np.zeros(len(subtrees), dtype=np.int64)]
    codes = [np.array([levels[0]], dtype=object), np.array([sub.path[0] for sub in subtrees], dtype=object)]
    counts = [None, np.concatenate([sub.counts[0] for sub in subtrees])]
    for i in range(1, L - 1):
        off = np.concatenate(([0], np.cumsum([sub.hierarchy.sizes[i - 1] for sub in subtrees])[:-1]))
        parents.append(np.concatenate([sub.hierarchy.parents[i] + o for sub, o in zip(subtrees, off)]))
        codes.append(np.concatenate([np.asarray(sub.hierarchy.codes[i]).astype(object) for sub in subtrees]))
        counts.append(np.concatenate([sub.counts[i] for sub in subtrees]))
    counts[0] = counts[1].sum(axis=0, keepdims=True)
    h = Hierarchy(tuple(levels), tuple(parents), tuple(codes), cells)
    return HierarchicalTable(h, tuple(np.ascontiguousarray(c, dtype=np.int64) for c in counts))


def _as_source(data: Any, per_part: int) -> Any:
    if isinstance(data, HierarchicalTable) and data.privacy_unit is not None and not data.privacy_unit.is_row:
        raise SparseDPError("a table truncated to a privacy unit is released in process (sparsedp.topdown.topdown): "
                            "the chunked release calibrates to one record")
    if isinstance(data, HierarchicalTable):
        return TableSource(data, per_part)
    if hasattr(data, "parts") and hasattr(data, "cells") and hasattr(data, "levels"):
        return data
    raise ShapeError(f"expected a HierarchicalTable, a ParquetSource, a SyntheticNation or a source with parts(), "
                     f"got {type(data).__name__}")


# -- the tasks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RootInfo:
    """What validation learns of one subtree (no noise; the counts stay on the driver)."""

    path: tuple[str, ...]
    sizes: tuple[int, ...]  # units per level s .. depth
    leaves: tuple[int, ...]  # leaves of the subtree per level
    counts: np.ndarray  # the root's exact (cells,) counts: the top levels are measured from them
    total: int
    #: the subtree's public structure: per level ``s .. depth``, its units' parent indices within it
    parents: tuple[np.ndarray, ...] = ()


@dataclass(frozen=True)
class _Expect:
    """What every task checks its data against."""

    levels: tuple[str, ...]
    cells: CellDomain
    s: int


def _check_subtree(sub: SubtreeData, ex: _Expect) -> None:
    h = sub.hierarchy
    if h.levels != ex.levels[ex.s:] or h.cells.columns != ex.cells.columns or len(sub.path) != ex.s:
        raise ShapeError(f"subtree {sub.path}: levels {h.levels} / cells differ from the release's "
                         f"{ex.levels[ex.s:]}")
    for d, c in enumerate(sub.counts):
        if c.shape != (h.sizes[d], ex.cells.size):
            raise ShapeError(f"subtree {sub.path}: level {d}: counts of shape {c.shape}")
        _check_count_matrix(c, ex.cells.columns)
    for d in range(h.depth):
        inner = ~h.leaves(d)
        if not np.array_equal(h.children_sum(d, sub.counts[d + 1])[inner], sub.counts[d][inner]):
            raise ShapeError(f"subtree {sub.path}: a unit's counts are not the sum of its children's")


def validate_part(part: Any, ex: _Expect) -> list[RootInfo]:
    """Read one part and check it (no noise): its subtrees' :class:`RootInfo`."""
    out = []
    for sub in part.read():
        _check_subtree(sub, ex)
        h = sub.hierarchy
        total = int(sub.counts[0].sum())
        if total > MAX_MAGNITUDE:
            raise InputBoundError(f"subtree {sub.path}: the total count exceeds {MAX_MAGNITUDE:.0f}")
        out.append(RootInfo(sub.path, h.sizes, tuple(int(h.leaves(d).sum()) for d in range(h.depth + 1)),
                            np.asarray(sub.counts[0][0], dtype=np.int64).copy(), total,
                            tuple(np.asarray(p, dtype=np.int64) for p in h.parents)))
    return out


@dataclass(frozen=True)
class _Meet:
    """A level below ``s`` where explicit invariant values meet invariants taken from the data:
    the marginals of those from the data (``data``), and the explicit ones' agreed values on the
    finest explicit marginal ``axes`` (the whole level's rows, checked among themselves on the
    driver)."""

    data: tuple[tuple[int, ...], ...]
    axes: tuple[int, ...]
    values: np.ndarray


@dataclass(frozen=True)
class _Agreement:
    """What the pre-charge agreement tasks share (small, picklable): per level ``s .. depth``, its
    name, its pinned (finest) invariant marginal, and where explicit values meet invariants taken
    from the data, the marginals of those from the data (``data``) and the explicit values' finest
    marginal (``explicit``; ``None``: nothing to check there)."""

    cells: CellDomain
    names: tuple[str, ...]
    finest: tuple[tuple[int, ...] | None, ...]
    data: tuple[tuple[tuple[int, ...], ...], ...]
    explicit: tuple[tuple[int, ...] | None, ...]


def agree_part(ag: _Agreement, part: Any, rows: Sequence[Sequence[np.ndarray | None]]) -> int:
    """Check, before any charge, that the explicit invariant values below the subtree level agree
    with the invariants taken from the data where they meet: per subtree ``j`` of the part and per
    level ``s + i`` where ``rows[j][i]`` is given (the subtree's rows of the explicit values on
    ``ag.explicit[i]``), the marginals of the subtree's own counts and those rows go through
    :func:`~sparsedp.topdown.release.agreed_values` -- the check of
    :func:`~sparsedp.topdown.resolve_invariants` on the subtree's units (a level agrees iff every
    subtree's rows do).  ``O(units x cells)`` per subtree, vectorised; no noise.  Raises
    :class:`~sparsedp.errors.InfeasibleConstraintsError` naming the subtree; returns the number of
    subtrees read."""
    subs = part.read()
    if len(subs) != len(rows):
        raise SparseDPError("a part changed between validation and the check of the invariants")
    for sub, per in zip(subs, rows):
        for i, given in enumerate(per):
            axes, finest = ag.explicit[i], ag.finest[i]
            if given is None or axes is None or finest is None:
                continue
            entries = [(ax, ag.cells.marginal(sub.counts[i], ax)) for ax in ag.data[i]] + [(axes, given)]
            try:
                agreed_values(ag.cells, ag.names[i], finest, entries)
            except InfeasibleConstraintsError as exc:
                raise InfeasibleConstraintsError(f"subtree {sub.path}: {exc}") from exc
    return len(subs)


@dataclass(frozen=True, eq=False)
class _Spec:
    """What the measurement and release tasks share (small, picklable)."""

    design: TopDownDesign  # the skeleton's: per-level plans, blocks, information
    s: int
    ups: tuple[Any, ...]  # UnitPlan per level s .. depth (None: not measured)
    #: per level ``s .. depth``, the invariant marginal pinned there (``None``: none is, or crossed ones
    #: at level ``s``); level ``s``'s pins (crossed ones included) come from the driver, a deeper
    #: level's values from the subtree's own counts or the explicit values
    pin_axes: tuple[tuple[int, ...] | None, ...]
    weights: str
    label: str
    #: whether a level below ``s`` has an invariant taken from the data: the release task then reads
    #: its part again for the values (they are never written to the scratch files)
    reads_part: bool = False


@dataclass(frozen=True)
class RootSummary:
    """A subtree's upward pass at its root (components) and its scratch file."""

    g: int
    z: np.ndarray
    a: np.ndarray
    total: int
    path: str


def _own_all(spec: _Spec, h: Hierarchy, ys: Sequence[np.ndarray | None], pins: Sequence[Any]) -> tuple[list, list]:
    own, var = [], []
    for i in range(h.depth + 1):
        e, v = own_level(spec.design, spec.s + i, h.sizes[i], ys[i], pins[i])
        own.append(e)
        var.append(v)
    return own, var


def _upward_all(h: Hierarchy, own: list, var: list) -> list[Upward]:
    ups: list[Upward] = [None] * (h.depth + 1)  # type: ignore[list-item]
    child = None
    for i in range(h.depth, -1, -1):
        child = ups[i] = upward_level(h, i, own[i], var[i], child)
    return ups


def _subtree_pins(spec: _Spec, sub: SubtreeData | None, given: Sequence[LevelPins]) -> list[LevelPins]:
    """Per level ``s .. depth`` of one subtree, its pins (``None``: no invariant there): the
    driver's rows ``given[i]`` (the root's pins, crossed ones included; a deeper level's explicit
    values) or, from the data, ``(axes, values)`` with the marginal of the subtree's own counts
    ``sub.counts[i]`` -- the rows of that level's pins in the whole hierarchy, as
    :func:`~sparsedp.topdown.resolve_invariants` computes them."""
    cells = spec.design.hierarchy.cells
    out: list[LevelPins] = []
    for i, ax in enumerate(spec.pin_axes):
        if given[i] is not None:
            out.append(given[i])
        elif ax is None or i == 0:  # the root's pins are always the driver's
            out.append(None)
        else:
            out.append((ax, cells.marginal(sub.counts[i], ax)))  # type: ignore[union-attr]
    return out


def measure_part(spec: _Spec, part: Any, index: Sequence[int], seeds: Sequence[Any], scratch: str,
                 given: Sequence[Sequence[LevelPins]]) -> list[RootSummary]:
    """Measure the part's subtrees (``index``: their global numbers at level ``s``; ``seeds``: their
    streams; ``given``: per subtree, per level ``s .. depth``, its rows of the pins the driver
    holds -- the root's, explicit values below -- else ``None``), no charge (the driver charged
    every level); run each subtree's upward pass; keep the measurements and the subtree's shape in
    a scratch file unique to this attempt."""
    subs = part.read()
    if len(subs) != len(index) or len(given) != len(index):
        raise SparseDPError("a part changed between validation and measurement")
    out = []
    cache: dict = {}
    for sub, g, seed, giv in zip(subs, index, seeds, given):
        h = sub.hierarchy
        gen = stream(seed)
        ys = [None if up is None else measure_units(cache, up, sub.counts[i], gen) for i, up in enumerate(spec.ups)]
        own, var = _own_all(spec, h, ys, _subtree_pins(spec, sub, giv))
        ups = _upward_all(h, own, var)
        path = os.path.join(scratch, f"subtree{g:07d}-{uuid.uuid4().hex}.npz")
        arrays: dict[str, np.ndarray] = {}  # the public geography and the noisy measurements only
        for i in range(h.depth + 1):
            arrays[f"parent{i}"] = np.asarray(h.parents[i], dtype=np.int64)
            arrays[f"code{i}"] = np.asarray(h.codes[i]).astype(str)
            if ys[i] is not None:
                arrays[f"y{i}"] = ys[i]
        tmp = path + ".part"
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)  # a killed attempt leaves at most a .part file
        out.append(RootSummary(int(g), ups[0].z[0].copy(), ups[0].a[0].copy(), int(sub.counts[0].sum()), path))
    return out


@dataclass(frozen=True)
class _RootFinal:
    """What the driver sends each subtree: its root's final estimate, variance and variance from
    outside (components), and its integer counts."""

    est: np.ndarray
    var: np.ndarray
    outside: np.ndarray
    counts: np.ndarray


def _load_scratch(spec: _Spec, path: str) -> tuple[Hierarchy, list]:
    cells = spec.design.hierarchy.cells
    levels = spec.design.hierarchy.levels[spec.s:]
    with np.load(path, allow_pickle=False) as f:
        parents = tuple(f[f"parent{i}"] for i in range(len(levels)))
        codes = tuple(f[f"code{i}"] for i in range(len(levels)))
        ys = [f[f"y{i}"] if f"y{i}" in f.files else None for i in range(len(levels))]
    return Hierarchy(levels, parents, codes, cells), ys


def release_part(spec: _Spec, summaries: Sequence[RootSummary], finals: Sequence[_RootFinal],
                 offsets: Sequence[Sequence[int]], out: str, part: Any,
                 given: Sequence[Sequence[LevelPins]]) -> dict[str, Any]:
    """The final values of the part's subtrees (levels below ``s``): the downward pass from each
    root's estimate, the rounding from its integer counts (with the invariants of its levels),
    written to ``out`` (``.npz``); small metadata back (units per level, violations counted).
    ``offsets[j]``: the global index, per level ``s .. depth``, of subtree ``j``'s first unit;
    ``part`` (read again only when a level below ``s`` has an invariant taken from the data) and
    ``given``: as :func:`measure_part`.  No noise is drawn."""
    D = spec.design.hierarchy.depth
    s = spec.s
    cells = spec.design.hierarchy.cells
    C = cells.size
    cols: dict[str, list] = {k: [] for k in ("depth", "code", "parent", "counts", "estimate", "variance")}
    per_level = np.zeros(D + 1, dtype=np.int64)
    bad = {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    subs: list[Any] = part.read() if spec.reads_part and part is not None else [None] * len(summaries)
    if len(subs) != len(summaries) or len(given) != len(summaries):
        raise SparseDPError("a part changed between measurement and release")
    for summary, fin, off, sub, giv in zip(summaries, finals, offsets, subs, given):
        if sub is not None and int(sub.counts[0].sum()) != summary.total:
            raise SparseDPError(f"subtree {sub.path} changed between measurement and release")
        h, ys = _load_scratch(spec, summary.path)
        pins = _subtree_pins(spec, sub, giv)
        own, var = _own_all(spec, h, ys, pins)
        ups: list[Any] = _upward_all(h, own, var)
        del own, ys  # the downward pass needs the upward pass and the own variances only
        est, out_side = fin.est.reshape(1, C), fin.outside.reshape(1, C)
        counts = fin.counts.reshape(1, C).astype(np.int64)
        if not np.array_equal(counts[0], fin.counts):  # pragma: no cover
            raise SparseDPError("root counts are not integers")
        for i in range(1, h.depth + 1):
            n = h.sizes[i]
            if n == 0:
                continue
            est, v, out_side = downward_level(h.parents[i], ups[i - 1], est, out_side, var[i - 1], ups[i])
            ups[i - 1] = var[i - 1] = None  # done with the level above: free it
            ec, vc = to_cells(spec.design, est, v)
            del v
            ci = round_level(cells, s + i, ec, vc, pins[i], h.parents[i], counts, spec.weights,
                             bool(spec.design.totals_first[s + i]) if spec.design.totals_first else False)
            for d_inv, ax in spec.design.invariants:  # each invariant checked at its own level
                if d_inv == s + i:
                    want = pin_values(cells, pins[i], ax)
                    bad["invariant_violations"] += int((cells.marginal(ci, ax) != want).sum())
            if i == 1:
                have = h.children_sum(0, ci)
                bad["inconsistent"] += int((have[0] != fin.counts).sum()) if h.sizes[1] else 0
            else:
                inner = ~h.leaves(i - 1)
                bad["inconsistent"] += int((h.children_sum(i - 1, ci)[inner] != counts[inner]).sum())
            bad["negative"] += int((ci < 0).sum())
            counts = ci
            cols["depth"].append(np.full(n, s + i, dtype=np.int8))
            cols["code"].append(np.asarray(h.codes[i]).astype(str))
            cols["parent"].append(np.asarray(h.parents[i], dtype=np.int64) + int(off[i - 1]))
            cols["counts"].append(ci)
            cols["estimate"].append(ec)
            cols["variance"].append(vc)
            per_level[s + i] += n
    empty = {"depth": np.zeros(0, np.int8), "code": np.zeros(0, "<U1"), "parent": np.zeros(0, np.int64),
             "counts": np.zeros((0, C), np.int64), "estimate": np.zeros((0, C)), "variance": np.zeros((0, C))}
    arrays = {k: (v[0] if len(v) == 1 else np.concatenate(v)) if v else empty[k] for k, v in cols.items()}
    del cols
    # units level by level (the order of the whole release), subtrees in order within a level
    if np.any(np.diff(arrays["depth"]) < 0):  # several subtrees: their units level by level
        order = np.argsort(arrays["depth"], kind="stable")
        arrays = {k: a[order] for k, a in arrays.items()}
    # the global index (within its level, levels s .. depth) of the part's first unit
    arrays["first"] = np.asarray(offsets[0] if len(offsets) else [0] * (D + 1 - s), dtype=np.int64)
    tmp = out + ".part"
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)  # zlib: counts, codes and variances compress 10-200x, estimates ~3x
    os.replace(tmp, out)
    return {"file": out, "units": per_level.tolist(), "violations": bad}


# -- the driver ------------------------------------------------------------------------------------


def _top_hierarchy(paths: list[tuple[str, ...]], levels: tuple[str, ...], cells: CellDomain) -> Hierarchy:
    """Levels ``0 .. s`` from the subtree roots' codes (sorted: the numbering of the whole table)."""
    s = len(paths[0])
    parents = [np.array([-1], dtype=np.int64)]
    codes = [np.array([levels[0]], dtype=object)]
    prev: dict[tuple[str, ...], int] = {(): 0}
    for d in range(1, s + 1):
        keys = list(dict.fromkeys(p[:d] for p in paths))  # in order of first appearance
        index = {k: i for i, k in enumerate(keys)}
        if d > 1 and np.any(np.diff([prev[k[:-1]] for k in keys]) < 0):
            raise ShapeError("the subtrees are not in the order of their codes")
        parents.append(np.array([prev[k[:-1]] for k in keys], dtype=np.int64))
        codes.append(np.array([k[-1] for k in keys], dtype=object))
        prev = index
    return Hierarchy(levels[:s + 1], tuple(parents), tuple(codes), cells)


def _real_shape(top: Hierarchy, infos: list[RootInfo], levels: int) -> list[tuple[int, int]]:
    """``(units, leaf units)`` per level of the real hierarchy (the public structure the skeleton
    stands for): the top levels', then the subtrees' summed."""
    s = top.depth
    out = [(int(top.sizes[d]), int(top.leaves(d).sum())) for d in range(s)]
    return out + [(sum(int(i.sizes[j]) for i in infos), sum(int(i.leaves[j]) for i in infos))
                  for j in range(levels - s)]


def _skeleton(top: Hierarchy, infos: list[RootInfo], levels: tuple[str, ...]) -> Hierarchy:
    """The top levels and, below them, a chain per subtree down to its deepest level plus one leaf
    at every level where the subtree has leaves: per-unit plans like the real levels', the same
    leaf levels (what planning checks), a few units each."""
    s = top.depth
    D = len(levels) - 1
    parents = list(top.parents) + [[] for _ in range(D - s)]
    counts = [0] * (D + 1)
    chain_prev: list[int | None] = list(range(len(infos)))  # the chain unit of each subtree at the level above
    for i in range(1, D - s + 1):
        d = s + i
        nxt: list[int | None] = []
        for g, info in enumerate(infos):
            p = chain_prev[g]
            deepest = max(j for j, n in enumerate(info.sizes) if n > 0)  # the subtree's deepest level
            if p is None or i > deepest:
                nxt.append(None)
                continue
            if i < deepest:  # the chain continues (not a leaf)
                parents[d].append(p)
                nxt.append(counts[d])
                counts[d] += 1
                if info.leaves[i] > 0:
                    parents[d].append(p)
                    counts[d] += 1
            else:  # the deepest level: a leaf
                parents[d].append(p)
                counts[d] += 1
                nxt.append(None)
        chain_prev = nxt
    par = tuple(np.asarray(p, dtype=np.int64) for p in parents)
    codes = list(top.codes) + [np.array([f"u{j}" for j in range(len(par[d]))], dtype=object)
                               for d in range(s + 1, D + 1)]
    return Hierarchy(tuple(levels), par, tuple(codes), top.cells)


def _check_plan_args(split: Any, invariants: Sequence[Any], s: int, levels: tuple[str, ...], cells: CellDomain,
                     rng: Any) -> None:
    """The plan's arguments that need no data, checked before anything is read: the split's form
    (weights, ``"equal"``, ``"optimal"`` or an :class:`~sparsedp.topdown.OptimalSplit`), the
    invariants' levels and marginals (crossed ones meeting at or above the subtree level only:
    :func:`_check_crossed`), the generator."""
    _optimal_spec(split)  # ShapeError for an unknown string, before any part is read
    found = []
    for spec in invariants:
        iv = Invariant.parse(spec)
        lev = iv.level
        d = levels.index(lev) if isinstance(lev, str) and lev in levels else lev
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or not 0 <= int(d) < len(levels):
            raise ShapeError(f"unknown level {lev!r}: the hierarchy has {levels}")
        found.append((int(d), cells.axes(iv.marginal)))
    _check_crossed(found, s, levels, cells)
    if isinstance(rng, _noise.SecureRandomBits):
        raise SparseDPError("the chunked release takes rng=None (OS entropy) or a seed, not a SecureRandomBits")
    noise_seeds(rng if not isinstance(rng, np.random.Generator) else None, 0)


def _check_crossed(found: Sequence[tuple[int, tuple[int, ...]]], s: int, levels: tuple[str, ...],
                   cells: CellDomain) -> None:
    """Crossed invariants (``(depth, axes)`` of each; two marginals neither inside the other, such
    as ``age`` and ``race``) hold together at the shallower one's level and every level above it,
    and a level where they meet is rounded by :func:`~sparsedp.topdown.release.integer_counts`,
    whose fallback (a parent without an integer table of children becomes their sum) changes the
    parent and every ancestor.  The chunked release rounds levels ``0 .. s`` on the driver -- there
    it is the same rounding -- but a subtree's root is final once the parts are split: crossed
    invariants meeting below the subtree level ``s`` raise
    :class:`~sparsedp.errors.UnsupportedStructureError` naming the shallowest subtree level that
    takes them (the deepest level where two crossed invariants meet), before anything is read."""
    need, worst = s, None
    for i, (da, a) in enumerate(found):
        for db, b in found[i + 1:]:
            if set(a) <= set(b) or set(b) <= set(a) or min(da, db) <= need:
                continue
            need, worst = min(da, db), (a, b)
    if worst is not None:
        a, b = worst
        raise UnsupportedStructureError(
            f"the invariants on {cells.marginal_name(a)!r} and {cells.marginal_name(b)!r} are crossed (neither "
            f"contains the other) and meet at level {levels[need]!r}, below the subtree level {levels[s]!r}: the "
            f"chunked release rounds crossed invariants on the driver, at or above the subtree level -- choose "
            f"subtree_level={levels[need]!r} or deeper (or the in-process release, sparsedp.topdown.topdown)")


def _full_structure(top: Hierarchy, infos: Sequence[RootInfo], levels: tuple[str, ...]) -> Hierarchy:
    """The whole hierarchy's public structure on the driver: the top levels as they are, and below
    the subtree level every subtree's parent indices shifted by its first unit's index (the units in
    the order of the whole release), codes left as placeholders (one shared string; the codes stay in
    the parts).  What the optimised design and the error summary read: the shape, never a count
    (``O(units)`` integers)."""
    s = top.depth
    parents, codes = list(top.parents), list(top.codes)
    for i in range(1, len(levels) - s):
        above = np.array([info.sizes[i - 1] for info in infos], dtype=np.int64)
        off = np.concatenate(([0], np.cumsum(above)[:-1]))
        p = np.concatenate([info.parents[i] + o for info, o in zip(infos, off)]) if infos else np.zeros(0, np.int64)
        parents.append(p.astype(np.int64, copy=False))
        codes.append(np.broadcast_to(np.array([""], dtype=object), p.shape))
    return Hierarchy(tuple(levels), tuple(parents), tuple(codes), top.cells)


def _plan(h_full: Hierarchy, skel: Hierarchy, shape: list[tuple[int, int]], split: Any, queries: Any,
          workload: Any, **common: Any) -> TopDownDesign:
    """The design :func:`~sparsedp.topdown.plan_topdown` gives on the whole hierarchy, planned on the
    skeleton: with an optimised split (the default, ``"optimal"``, an :class:`OptimalSplit`) the
    choice is made on the whole public structure ``h_full`` (:func:`optimal_split`, data-free),
    the skeleton planned with its explicit shares (:func:`chosen_shares`), the levels the choice
    found without information skipped alike, and the choice recorded (``design.split_choice``);
    else the skeleton planned with the given split (the workload is then unused, as in process)."""
    opt = _optimal_spec(split)
    if opt is None:
        return plan_topdown(skel, split=split, queries=queries, shape=shape, **common)
    choice = optimal_split(h_full, queries=queries, spec=opt, workload=workload, **common)
    shares, qs = chosen_shares(h_full, choice, queries)
    design = plan_topdown(skel, split=shares, queries=qs, shape=shape, **common)
    skipped = dict(choice.skipped)
    levels = tuple(replace(lp, skipped=skipped.get(lp.depth)) for lp in design.levels)
    return replace(design, levels=levels, split_choice=choice,
                   totals_first=totals_first_levels(skel, opt.workload if opt.workload is not None else workload))


def _resolve_pins(h: Hierarchy, top_counts: Sequence[np.ndarray], design: TopDownDesign, invariants: Sequence[Any],
                  s: int) -> tuple[list[LevelPins], list[_Meet | None]]:
    """Per level of the whole hierarchy ``h`` (public structure), its pins (the marginals of
    :func:`~sparsedp.topdown.design.pinned_marginals` and their values) where the driver has them:
    levels ``0 .. s`` (from the subtree roots' counts ``top_counts``, or explicit values summed up;
    crossed invariants too, :func:`~sparsedp.topdown.release.level_values`), and deeper levels
    (one pinned marginal at most: :func:`_check_crossed`) where the finest marginal pinned has
    explicit values; ``None`` where nothing is pinned or the workers take the values from their own
    counts.  Checked as :func:`~sparsedp.topdown.resolve_invariants` does (explicit values:
    non-negative integers of the level's shape; invariants that meet agree; crossed ones agree on
    what they share and, official, have a table), so bad values are refused before any charge.  A
    level below ``s`` where explicit values meet invariants taken from the data gets a
    :class:`_Meet` (second list): the explicit ones are checked among themselves here, and against
    each subtree's own counts by :func:`agree_part`, still before the charge."""
    cells = h.cells
    specs = [Invariant.parse(x) for x in invariants]
    per_level: list[list[tuple[tuple[int, ...], np.ndarray]]] = [[] for _ in range(h.depth + 1)]
    from_data: list[list[tuple[int, ...]]] = [[] for _ in range(h.depth + 1)]  # below s: on the workers
    for spec, (d, axes) in zip(specs, design.invariants):
        if spec.values is None:
            for e in range(min(d, s) + 1):
                per_level[e].append((axes, cells.marginal(top_counts[e], axes)))
            for e in range(s + 1, d + 1):
                if axes not in from_data[e]:
                    from_data[e].append(axes)
            continue
        push_explicit(per_level, spec, h, d, axes)
    values: list[LevelPins] = []
    meets: list[_Meet | None] = []
    explicit = any(spec.values is not None for spec in specs)
    for d, marginals in enumerate(pinned_marginals(design)):
        if d <= s:  # every invariant holding here has its values on the driver
            values.append(level_values(cells, h.levels[d], marginals, per_level[d], explicit))
            meets.append(None)
            continue
        if not marginals or not per_level[d]:
            values.append(None)
            meets.append(None)
            continue
        finest = marginals[0]
        # the finest marginal the driver holds there (all of them nested in ``finest``)
        mine = max((ax for ax, _ in per_level[d]), key=len)
        agreed = agreed_values(cells, h.levels[d], mine, per_level[d])
        values.append((finest, agreed) if mine == finest else None)
        meets.append(_Meet(tuple(from_data[d]), mine, agreed) if from_data[d] else None)
    return values, meets


def _subtree_starts(infos: Sequence[RootInfo], levels: int) -> list[np.ndarray]:
    """Per level ``s .. depth`` (``levels`` of them), the index within the whole level of each
    subtree's first unit (its units are consecutive there, subtrees in order)."""
    out = []
    for i in range(levels):
        sizes = np.array([info.sizes[i] for info in infos], dtype=np.int64)
        out.append(np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64))
    return out


def _subtree_rows(values: Sequence[Any], starts: Sequence[np.ndarray], info: RootInfo, g: int) -> list[Any]:
    """Subtree ``g``'s rows (views) of per-level arrays or pins of the whole levels ``s .. depth``
    (``None`` kept): ``info.sizes[i]`` rows from ``starts[i][g]``."""
    return [_rows(v, int(starts[i][g]), int(starts[i][g]) + int(info.sizes[i])) for i, v in enumerate(values)]


def _rows(v: Any, lo: int, hi: int) -> Any:
    """Rows ``lo:hi`` (views) of an array, or of each marginal's values of a level's pins."""
    if v is None or isinstance(v, np.ndarray):
        return None if v is None else v[lo:hi]
    pins = tuple((ax, vals[lo:hi]) for ax, vals in level_pins(v))
    return pins[0] if len(pins) == 1 else pins


def full_error_summary(design: TopDownDesign, h: Hierarchy) -> list[dict[str, Any]]:
    """:meth:`TopDownDesign.error_summary` for the whole hierarchy ``h`` (public structure) of a
    design planned on a skeleton of it: per level the root mean variance of the GLS estimate of a
    cell and of a unit's total as standard deviations and 95% half-widths, no data.  Every unit of
    level ``d`` has own variance ``1 / information(d)`` per component (0 where an invariant pins it,
    ``inf`` unmeasured), so the exact GLS variances come per context of ``h`` compressed by subtree
    shape (:func:`~sparsedp.topdown.gls.shape_classes`, :func:`~sparsedp.topdown.gls.class_variances`)
    and their means are weighted by the contexts' units: ``O(contexts x cells)``, not ``O(units x
    cells)`` as :meth:`TopDownDesign.error_summary` on ``h`` would hold."""
    C = h.cells.size
    comp = h.cells.component_attributes()
    pins = pinned_marginals(design)
    own_var = []
    for d, lp in enumerate(design.levels):
        info = design.information(d) if lp.plan is not None else np.zeros(C)
        v = np.where(info > 0, 1.0 / np.where(info > 0, info, 1.0), np.inf)
        v[pinned_components(h.cells, pins[d])] = 0.0
        own_var.append(v)
    sc = shape_classes(h)
    var = class_variances(sc, own_var)
    B2 = design.basis * design.basis
    k = comp.index(())
    rows = []
    for d, (lp, vd) in enumerate(zip(design.levels, var)):
        w = sc.weight[d].astype(np.float64)
        n = float(w.sum())
        cell = float(np.sqrt(max(float((w @ (vd @ B2)).sum()) / (n * C), 0.0))) if n else 0.0
        total = float(np.sqrt(max(C * float(w @ vd[:, k]) / n, 0.0))) if n else 0.0
        rows.append({"level": lp.name, "units": int(h.sizes[d]), "budget": lp.budget, "skipped": lp.skipped,
                     "sd_cell": cell, "half_width_cell": _Z95 * cell, "sd_total": total, "half_width_total": _Z95 * total})
    return rows


def _exit_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # through the ``finally`` that removes the scratch directory


class _Scratch:
    """The run's private scratch directory (mode ``0700``: the noisy measurements between the two
    passes), removed by :meth:`remove` on every way out of the run: a return, an exception, Ctrl-C,
    and (while it exists, in the main thread) SIGTERM and SIGHUP, which then end the run through
    the caller's ``finally``.  Only SIGKILL (or a power cut) leaves it behind."""

    def __init__(self) -> None:
        self.path: str | None = None
        self._handlers: dict[int, Any] = {}

    def make(self, parent: str) -> str:
        self.path = tempfile.mkdtemp(prefix="sparsedp-topdown-", dir=parent)  # mode 0700
        os.chmod(self.path, 0o700)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
                if sig is not None and signal.getsignal(sig) in (signal.SIG_DFL, None):
                    self._handlers[sig] = signal.signal(sig, _exit_on_signal)
        return self.path

    def remove(self) -> None:
        for sig, old in self._handlers.items():
            signal.signal(sig, old)
        self._handlers.clear()
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None


def _run(ex: Any, fn: Any, args: list, desc: str, progress: bool | None) -> list:
    total = len(args[0])
    disable = None if progress is None else not progress
    with progress_bar(total=total, desc=desc, unit="part", disable=disable) as bar:
        return ex.map(fn, *args, callback=lambda: bar.update(1))


def topdown_scaleout(data: Any, out: str | Path, *, rho: float | None = None, epsilon: float | None = None,
                     noise: str | None = None, split: Any = None, queries: Any = None,
                     invariants: Sequence[Any] = (), secure: bool = True, accountant: Accountant | None = None,
                     rng: Any = None, weights: str = "variance", measure_invariants: bool | None = None,
                     subtree_level: Any = 1, executor: Any = None, workers: int | None = None, per_part: int = 1,
                     scratch: str | Path | None = None, progress: bool | None = None,
                     contributions_per_person: int | None = None, workload: Any = None) -> "ChunkedTopDownRelease":
    """The release of :func:`sparsedp.topdown.topdown` chunked by subtree (module docstring),
    written to the directory ``out``; returns its :class:`ChunkedTopDownRelease`.

    ``data``: a :class:`HierarchicalTable` (cut into parts of ``per_part`` subtrees on the driver),
    a :class:`ParquetSource` (each worker reads its own part), a :class:`SyntheticNation`, or any
    object with ``levels``, ``cells`` and ``parts(s)`` (each part's ``read()`` giving
    :class:`SubtreeData`).  The privacy parameters are :func:`~sparsedp.topdown.topdown`'s:
    ``split`` (``None``, the default, ``"optimal"`` or an :class:`~sparsedp.topdown.OptimalSplit`:
    the optimised design for ``workload``, chosen on the whole public structure; ``"equal"`` or
    weights), ``queries``, ``workload``, ``invariants`` (at any level, from the data or with
    explicit values; where both meet, their agreement is checked before any charge, below the
    subtree level by the tasks on their own subtrees; crossed ones -- neither marginal inside the
    other -- where they meet at or above the subtree level, rounded on the driver: those meeting
    below it raise :class:`~sparsedp.errors.UnsupportedStructureError` naming the subtree level to
    choose).  The description's
    ``error_summary`` is the design's on the whole hierarchy (:func:`full_error_summary`).
    ``subtree_level``: a level name or index (default 1); for the same seed and subtree level the
    release is bit for bit :func:`~sparsedp.topdown.topdown`'s.  ``contributions_per_person``:
    as :func:`~sparsedp.topdown.topdown` (default: the source's own, 1 unless declared).
    ``executor``: ``None`` (in-process), ``"threads"``, ``"dask"`` (a new ``LocalCluster`` of ``workers`` processes, one
    thread each; default 2), a ``dask.distributed.Client`` or an executor.  ``scratch``: where a private
    temporary directory (mode ``0700``) is made for the noisy measurements between the two passes
    (default: next to ``out``; on a real cluster, storage every worker reaches); it holds the
    public geography and the noisy measurements only (no count of the data) and is removed on every
    way out of the run, SIGTERM included (SIGKILL excepted: then delete the ``sparsedp-topdown-*``
    directory it leaves; with a seed its noise is reproducible, so it is not private).  The
    returned release's ``timings`` (seconds per phase) stay in memory: they are not written, as the
    phases that read the data take data-dependent time."""
    t_start = time.perf_counter()
    source = _as_source(data, per_part)
    levels = tuple(source.levels)
    cells = source.cells
    s = levels.index(subtree_level) if isinstance(subtree_level, str) and subtree_level in levels else subtree_level
    if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or not 1 <= int(s) < len(levels):
        raise ShapeError(f"the subtree level must be a level below the root (1 .. {len(levels) - 1}), got "
                         f"{subtree_level!r}")
    s = int(s)
    weights = check_weights(weights)
    invariants = list(invariants)
    _check_plan_args(split, invariants, s, levels, cells, rng)
    declared = source.table.contributions_per_person if isinstance(source, TableSource) else getattr(
        source, "contributions_per_person", 1)
    k = resolve_contributions(check_contributions(declared), contributions_per_person)
    if accountant is not None and not isinstance(accountant, Accountant):
        raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
    out_dir = Path(out)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise SparseDPError(f"{out_dir} exists and is not an empty directory")
    owns = executor == "dask" or isinstance(executor, str)
    if executor == "dask":
        ex: Any = DaskExecutor.local(n_workers=int(workers or 2), threads_per_worker=1)
    else:
        ex = get_executor(executor)
    timings: dict[str, float] = {}
    work = _Scratch()
    summaries: list[RootSummary] = []
    try:
        # 1. validate every part (no noise, no charge)
        t0 = time.perf_counter()
        parts = source.parts(s)
        if not parts:
            raise ShapeError("the table has no parts")
        expect = _Expect(levels, cells, s)
        infos_by_part = _run(ex, validate_part, [parts, [expect] * len(parts)], "validate", progress)
        flat = [(q, j, info) for q, infos in enumerate(infos_by_part) for j, info in enumerate(infos)]
        if not flat:
            raise ShapeError("the table has no rows")
        order = list(range(len(flat)))
        if not getattr(source, "in_order", False):
            order.sort(key=lambda i: flat[i][2].path)
        paths = [flat[i][2].path for i in order]
        if len(set(paths)) != len(paths):
            seen: set = set()
            dup = next(p for p in paths if p in seen or seen.add(p))  # type: ignore[func-returns-value]
            raise ShapeError(f"subtree {dup} appears twice: every part must hold whole subtrees, each once")
        infos = [flat[i][2] for i in order]
        gidx = {(flat[i][0], flat[i][1]): g for g, i in enumerate(order)}
        grand = sum(i.total for i in infos)
        if grand > MAX_MAGNITUDE:
            raise InputBoundError(f"the total count exceeds {MAX_MAGNITUDE:.0f}")  # the bound, never the total
        timings["validate"] = time.perf_counter() - t0

        # 2. plan and check, before any charge
        t0 = time.perf_counter()
        top = _top_hierarchy(paths, levels, cells)
        skel = _skeleton(top, infos, levels)
        whole = _full_structure(top, infos, levels)  # public: units and parents, no count
        infos = [replace(i, parents=()) for i in infos]  # the structure is held once, until planned
        in_part = [len(x) for x in infos_by_part]
        flat.clear()  # the per-part copies of the structure go too
        infos_by_part.clear()
        design = _plan(whole, skel, _real_shape(top, infos, len(levels)), split, queries, workload, rho=rho,
                       epsilon=epsilon, noise=noise, invariants=invariants, secure=secure,
                       measure_invariants=measure_invariants, contributions_per_person=k)
        top_counts: list[np.ndarray] = [np.zeros((0, cells.size), dtype=np.int64)] * (s + 1)
        top_counts[s] = np.stack([i.counts for i in infos]).astype(np.int64)
        for d in range(s - 1, -1, -1):
            top_counts[d] = top.children_sum(d, top_counts[d + 1])
        # below s one pinned marginal at most (_check_crossed); at or above s crossed ones are rounded here
        pin_axes = [m[0] if len(m) == 1 else None for m in pinned_marginals(design)]
        values, meets = _resolve_pins(whole, top_counts, design, invariants, s)
        pins = values[:s + 1]
        errors = full_error_summary(design, whole)  # data-free: the whole structure's, not the skeleton's
        del whole
        timings["plan"] = time.perf_counter() - t0  # the design and its errors (data-free), the invariants
        index = [[gidx[(q, j)] for j in range(in_part[q])] for q in range(len(parts))]
        starts = _subtree_starts(infos, len(levels) - s)
        if any(m is not None for m in meets):  # below s, explicit values meet invariants from the data
            t0 = time.perf_counter()
            agree = _Agreement(cells, levels[s:], tuple(pin_axes[s:]),
                               tuple(() if m is None else m.data for m in meets[s:]),
                               tuple(None if m is None else m.axes for m in meets[s:]))
            explicit = [None if m is None else m.values for m in meets[s:]]
            _run(ex, agree_part, [[agree] * len(parts), parts,
                                  [[_subtree_rows(explicit, starts, infos[g], g) for g in idx] for idx in index]],
                 "check", progress)
            timings["check invariants"] = time.perf_counter() - t0
        if accountant is not None:  # the exact sum of the levels' charges (a float sum may round above it)
            accountant.check_all(level_costs(design, None))
        n_s = len(infos)
        top_seed, seeds = noise_seeds(rng, n_s)
        seeded = rng is not None
        units = [int(n) for n in top.sizes] + [int(sum(i.sizes[d - s] for i in infos))
                                               for d in range(s + 1, len(levels))]

        # where the output and the measurements go (made before the charge: a bad path costs nothing)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "parts").mkdir(exist_ok=True)
            scratch_dir = work.make(str(Path(scratch) if scratch else out_dir.resolve().parent))
        except OSError as exc:
            raise SparseDPError(f"cannot create the release directory {out_dir} or its scratch space: {exc}") from exc

        # 3. charge every measured level once
        ledger = charge_levels(design, accountant, seeded, units)

        # 4. measure: the top levels here, the subtrees on the workers
        t0 = time.perf_counter()
        gen = stream(top_seed)
        ys_top = [None if lp.plan is None else lp.plan.measure(top_counts[d].ravel(), rng=gen, label=lp.label).y
                  for d, lp in enumerate(design.levels[:s])]
        spec = _Spec(design, s, tuple(unit_plan(lp) for lp in design.levels[s:]), tuple(pin_axes[s:]), weights,
                     "topdown", any(pin_axes[d] is not None and values[d] is None for d in range(s + 1, len(levels))))
        part_seeds = [[seeds[g] for g in idx] for idx in index]
        # per subtree, its rows of the pins the driver holds (its root's at level s, crossed ones included)
        part_given = [[_subtree_rows(values[s:], starts, infos[g], g) for g in idx] for idx in index]
        res = _run(ex, measure_part, [[spec] * len(parts), parts, index, part_seeds, [scratch_dir] * len(parts),
                                      part_given], "measure", progress)
        by_g: dict[int, RootSummary] = {r.g: r for rs in res for r in rs}
        summaries = [by_g[g] for g in range(n_s)]
        for r, info in zip(summaries, infos):
            if r.total != info.total:
                raise SparseDPError(f"subtree {info.path} changed between validation and measurement")
        timings["measure+upward"] = time.perf_counter() - t0

        # 5. the top: finish the upward pass, downward over levels 0 .. s, round them
        t0 = time.perf_counter()
        own, own_var = [], []
        for d in range(s):
            e, v = own_level(design, d, top.sizes[d], ys_top[d], pins[d])
            own.append(e)
            own_var.append(v)
        ups: list[Any] = [None] * (s + 1)
        ups[s] = Upward(np.stack([r.z for r in summaries]), np.stack([r.a for r in summaries]), None, None)
        for d in range(s - 1, -1, -1):
            ups[d] = upward_level(top, d, own[d], own_var[d], ups[d + 1])
        est, var = [ups[0].z], [ups[0].a]
        outside = np.full_like(ups[0].a, np.inf)
        for d in range(1, s + 1):
            e, v, outside = downward_level(top.parents[d], ups[d - 1], est[d - 1], outside, own_var[d - 1], ups[d])
            est.append(e)
            var.append(v)
        est_c, var_c = [], []
        for d in range(s + 1):
            ec, vc = to_cells(design, est[d], var[d])
            est_c.append(ec)
            var_c.append(vc)
        # the in-process rounding of levels 0 .. s (integer_counts reads the design's hierarchy, invariants and
        # totals_first): crossed invariants and their fallback, which sums a parent and its ancestors again, stay
        # here -- the subtrees' roots leave with their final counts
        report: dict[str, int] = {}
        counts = list(integer_counts(replace(design, hierarchy=top), est_c, var_c, pins, weights, report))
        top_bad = {"negative": int(sum((c < 0).sum() for c in counts)), "non_integer": 0,
                   "inconsistent": int(sum((top.children_sum(d, counts[d + 1]) != counts[d]).sum() for d in range(s)))}
        inv_bad = 0
        published = []
        for d, ax in design.invariants:  # those below s are checked by the release tasks
            if d <= s:
                vals = pin_values(cells, pins[d], ax)
                inv_bad += int((cells.marginal(counts[d], ax) != vals).sum())
            published.append({"level": levels[d], "marginal": cells.marginal_name(ax)})
        timings["top"] = time.perf_counter() - t0

        # 6. every part: the downward pass, the rounding, its output
        t0 = time.perf_counter()
        _write_units(out_dir / "top.npz", top, counts, est_c, var_c)
        finals = [_RootFinal(est[s][g], var[s][g], outside[g], counts[s][g]) for g in range(n_s)]
        offs = [[[int(g)] + [int(starts[i][g]) for i in range(1, len(levels) - s)] for g in idx] for idx in index]
        files = [str(out_dir / "parts" / f"part-{q:05d}.npz") for q in range(len(parts))]
        metas = _run(ex, release_part, [[spec] * len(parts), [[by_g[g] for g in idx] for idx in index],
                                        [[finals[g] for g in idx] for idx in index], offs, files, parts, part_given],
                     "release", progress)
        timings["downward+round+write"] = time.perf_counter() - t0
    finally:
        work.remove()
        if owns:
            ex.close()
    checks = dict(top_bad, invariant_violations=inv_bad)
    for m in metas:
        for k, v in m["violations"].items():
            checks[k] += v
    h_desc = {"levels": list(levels), "units": units, "cells": list(cells.columns),
              "attributes": {n: list(v) for n, v in zip(cells.names, cells.values)},
              "leaves": _leaf_counts(top, infos, s, len(levels))}
    desc = design.describe()
    for item, (d, _) in zip(desc["exact_disclosures"], design.invariants):  # the whole level's, not the skeleton's
        item.update(units=units[d], values=units[d] * int(item["cells"]))
    desc.update(hierarchy=h_desc, weights=weights, subtree_level=levels[s], parts=len(parts), error_summary=errors,
                non_private=("the invariants are the true values, published exactly by request (not private); the "
                             "units and cells are the public domain" if design.invariants else
                             "the units and cells are the public domain"),
                units_observed=False)
    if any(len(level_pins(p)) > 1 for p in pins):  # crossed invariants: how often the parents were re-summed
        desc["rounding"] = {"crossed_fallbacks": int(report.get("crossed_fallbacks", 0))}
    timings["total"] = time.perf_counter() - t_start
    manifest = {"format": FORMAT, "kind": "topdown", "layout": "chunked by subtree", "private": not seeded,
                "noise": design.noise, "secure": design.secure, "ledger": [e.as_dict() for e in ledger],
                "description": desc, "invariants": published, "exact_disclosures": desc["exact_disclosures"],
                "files": ["top.npz"] +
                [str(Path(f).relative_to(out_dir)) for f in files],
                # the codes (level 1 .. subtree level) of each part's subtrees: one unit is read from one part
                "subtrees": [[list(paths[g]) for g in idx] for idx in index],
                "contiguous": all(list(idx) == list(range(idx[0], idx[0] + len(idx))) for idx in index if idx),
                "checks": checks,
                "executor": getattr(ex, "name", "?")}  # no timings: reading the data takes data-dependent time
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, default=_json_default) + "\n")
    return ChunkedTopDownRelease(str(out_dir), manifest, timings)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _leaf_counts(top: Hierarchy, infos: list[RootInfo], s: int, L: int) -> list[int]:
    return [int(top.leaves(d).sum()) if d < s else int(sum(i.leaves[d - s] for i in infos)) for d in range(L)]


def _write_units(path: Path, h: Hierarchy, counts: Sequence[np.ndarray], est: Sequence[np.ndarray],
                 var: Sequence[np.ndarray]) -> None:
    arrays = {"depth": np.concatenate([np.full(n, d, dtype=np.int8) for d, n in enumerate(h.sizes)]),
              "code": np.concatenate([np.asarray(c).astype(str) for c in h.codes]),
              "parent": np.concatenate([np.asarray(p, dtype=np.int64) for p in h.parents]),
              "counts": np.concatenate(counts), "estimate": np.concatenate(est), "variance": np.concatenate(var)}
    tmp = str(path) + ".part"
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)
    os.replace(tmp, path)


# -- the release on disk ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ChunkedTopDownRelease:
    """A TopDown release written chunk by chunk (a directory; module docstring).  ``manifest``: its
    ``topdown.json``; :meth:`check` gives the violations counted while it was made;
    :meth:`parts` reads the files one at a time; :meth:`to_topdown` / :meth:`to_pandas` /
    :meth:`to_release` read everything (one row per unit / per answer: as large as the release)."""

    path: str
    manifest: dict = field(repr=False)
    #: seconds per phase of the run that made it (in memory only, never written: the phases that read
    #: the data take data-dependent time; empty for a release read back from disk)
    timings: dict = field(default_factory=dict, repr=False)

    @property
    def ledger(self) -> list[dict]:
        return list(self.manifest.get("ledger") or ())

    @property
    def private(self) -> bool:
        return bool(self.manifest.get("private", True))

    @property
    def description(self) -> dict:
        return dict(self.manifest.get("description") or {})

    def check(self) -> dict[str, int]:
        """Violations counted when the release was made (all 0): negatives, non-integers, parents
        unequal to the sum of their children, invariants not kept."""
        return dict(self.manifest["checks"])

    def parts(self) -> Any:
        """Each file's arrays in turn (``depth``, ``code``, ``parent``, ``counts``, ``estimate``,
        ``variance``: one row per unit, levels in order; ``parent``: the index of the unit's parent
        within its level; a part's ``first``: the index within its level of its first unit, per level
        from the subtree level down), the top levels first."""
        for f in self.manifest["files"]:
            with np.load(resolve_inside(self.path, f), allow_pickle=False) as z:  # inside the directory only
                yield {k: z[k] for k in z.files}

    def unit(self, codes: Sequence[Any]) -> dict[str, Any]:
        """One unit's published row without reading the whole release: ``codes`` name it from the
        level below the root down (``("06",)`` a state, ``("06", "037")`` a county).  Reads the
        top file and at most one part (the one holding its subtree, from the manifest's
        ``subtrees``).  Returns ``level``, ``codes``, ``counts`` (int64, one per cell),
        ``estimate`` and ``variance``; :class:`SparseDPError` when no such unit exists."""
        codes = tuple(str(c) for c in codes)
        hd = self.description["hierarchy"]
        levels = list(hd["levels"])
        s = levels.index(self.description["subtree_level"])
        if not 1 <= len(codes) < len(levels):
            raise SparseDPError(f"name a unit by 1 to {len(levels) - 1} codes (levels {levels[1:]}), got {codes!r}")
        with np.load(resolve_inside(self.path, self.manifest["files"][0]), allow_pickle=False) as z:
            top = {k: z[k] for k in z.files}
        idx = 0
        for d in range(1, min(len(codes), s) + 1):
            idx = _child(top, d, idx, codes[d - 1], 0, levels)
        if len(codes) <= s:
            return _row(top, levels, codes, int(np.flatnonzero(top["depth"] == len(codes))[idx]))
        if not self.manifest.get("contiguous", False):  # parts of scattered subtrees: positions are not global
            return self._unit_from_all(codes)
        part = self._part_of(codes[:s])
        first = part["first"]
        for d in range(s + 1, len(codes) + 1):
            idx = _child(part, d, idx, codes[d - 1], int(first[d - s]), levels)
        return _row(part, levels, codes, int(np.flatnonzero(part["depth"] == len(codes))[idx - int(first[len(codes) - s])]))

    def level(self, level: Any, values: str = "counts") -> np.ndarray:
        """One level's ``counts`` / ``estimate`` / ``variance`` (``(units, cells)``, in the order of the
        whole release) without holding the others: the top file for levels down to the subtree
        level, else each part in turn, keeping that level's rows."""
        if values not in ("counts", "estimate", "variance"):
            raise SparseDPError(f"values must be 'counts', 'estimate' or 'variance', got {values!r}")
        levels = list(self.description["hierarchy"]["levels"])
        d = levels.index(level) if level in levels else level
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= int(d) < len(levels):
            raise SparseDPError(f"no level {level!r}: the levels are {levels}")
        d = int(d)
        s = levels.index(self.description["subtree_level"])
        if d <= s or not self.manifest.get("contiguous", False):
            if d <= s:
                with np.load(resolve_inside(self.path, self.manifest["files"][0]), allow_pickle=False) as z:
                    return z[values][z["depth"] == d]
            td = self.to_topdown()
            return {"counts": td.counts, "estimate": td.estimate, "variance": td.variance}[values][d]
        rows = []
        for name in self.manifest["files"][1:]:
            with np.load(resolve_inside(self.path, name), allow_pickle=False) as z:
                rows.append((int(z["first"][d - s]), z[values][z["depth"] == d]))
        rows.sort(key=lambda r: r[0])  # parts in the order of their subtrees
        return np.concatenate([r[1] for r in rows]) if rows else np.zeros((0, len(self.description["hierarchy"]["cells"])))

    def _unit_from_all(self, codes: tuple[str, ...]) -> dict[str, Any]:
        """:meth:`unit` by reading the whole release (parts whose subtrees are not consecutive)."""
        td = self.to_topdown()
        h = td.hierarchy
        idx = 0
        for d in range(1, len(codes) + 1):
            kids = np.flatnonzero((np.asarray(h.parents[d]) == idx) & (np.asarray(h.codes[d]).astype(str) == codes[d - 1]))
            if kids.size != 1:
                raise SparseDPError(f"no {h.levels[d]} {codes[d - 1]!r} under that {h.levels[d - 1]} in this release")
            idx = int(kids[0])
        d = len(codes)
        return {"level": h.levels[d], "codes": codes, "counts": td.counts[d][idx], "estimate": td.estimate[d][idx],
                "variance": td.variance[d][idx]}

    def _part_of(self, root: tuple[str, ...]) -> dict[str, np.ndarray]:
        """The arrays of the part that holds the subtree ``root`` (codes down to the subtree level)."""
        names = self.manifest["files"][1:]
        where = self.manifest.get("subtrees")
        order = range(len(names))
        if where is not None:  # the manifest says which part; an older one is searched part by part
            order = [q for q, roots in enumerate(where) if list(root) in roots][:1] or []
        for q in order:
            with np.load(resolve_inside(self.path, names[q]), allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            if where is not None:
                return arrays
            if _holds(arrays, root):
                return arrays
        raise SparseDPError(f"no unit {root!r} in this release")

    def to_topdown(self) -> TopDownRelease:
        """The whole release as a :class:`~sparsedp.topdown.TopDownRelease` (in memory)."""
        desc = self.description
        hd = desc["hierarchy"]
        levels = list(hd["levels"])
        cells = CellDomain(tuple(hd["attributes"]), tuple(tuple(v) for v in hd["attributes"].values()),
                           tuple(hd["cells"]))
        chunks = list(self.parts())
        L = len(levels)
        per: dict[str, list[list[np.ndarray]]] = {k: [[] for _ in range(L)]
                                                  for k in ("code", "parent", "counts", "estimate", "variance")}
        for ch in chunks:
            dep = ch["depth"].astype(np.int64)
            cut = np.searchsorted(dep, np.arange(L + 1))
            for d in range(L):
                for k in per:
                    per[k][d].append(ch[k][cut[d]:cut[d + 1]])
        cat = {k: [np.concatenate(v[d]) for d in range(L)] for k, v in per.items()}
        for d in range(1, L):  # parts in any order: a level's units by parent (children are contiguous)
            o = np.argsort(cat["parent"][d], kind="stable")
            for k in cat:
                cat[k][d] = cat[k][d][o]
        h = Hierarchy(tuple(levels), tuple(cat["parent"]), tuple(c.astype(object) for c in cat["code"]), cells)
        counts = tuple(c.astype(np.int64).reshape(-1, cells.size) for c in cat["counts"])
        invariants = []
        for item in self.manifest.get("invariants") or ():
            d = h.level_index(item["level"])
            invariants.append({"level": item["level"], "marginal": item["marginal"],
                               "values": cells.marginal(counts[d], cells.axes(item["marginal"]))})
        return TopDownRelease(h, counts, tuple(e.reshape(-1, cells.size) for e in cat["estimate"]),
                              tuple(v.reshape(-1, cells.size) for v in cat["variance"]), (), tuple(invariants),
                              tuple(self.ledger), self.private, self.manifest.get("noise") or "gaussian",
                              bool(self.manifest.get("secure", True)), desc)

    def to_pandas(self, values: str = "counts") -> Any:
        """One row per unit (root first, level by level): ``level``, ``depth``, the codes, one column
        per cell (:meth:`TopDownRelease.to_pandas`)."""
        return self.to_topdown().to_pandas(values)

    def unit_table(self) -> Any:
        """The published table, one row per unit: what ``sparsedp.load_release(dir).to_pandas()`` gives."""
        return self.to_pandas()

    def to_release(self) -> Any:
        """The common release model (:class:`~sparsedp.releases.ReleaseResult`, kind ``"topdown"``)."""
        from dataclasses import replace

        rel = self.to_topdown().to_release()
        return replace(rel, source=self, path=self.path)


def _child(arrays: dict, d: int, parent: int, code: str, first: int, levels: list) -> int:
    """The index within level ``d`` (global: ``first`` is the index of the arrays' first unit at that
    level) of the unit with ``code`` under the unit ``parent`` of level ``d - 1``."""
    at = np.flatnonzero(arrays["depth"] == d)
    hit = np.flatnonzero((arrays["parent"][at] == parent) & (arrays["code"][at] == code))
    if hit.size != 1:
        raise SparseDPError(f"no {levels[d]} {code!r} under that {levels[d - 1]} in this release")
    return first + int(hit[0])


def _row(arrays: dict, levels: list, codes: tuple, i: int) -> dict[str, Any]:
    return {"level": levels[len(codes)], "codes": codes, "counts": arrays["counts"][i].astype(np.int64),
            "estimate": arrays["estimate"][i], "variance": arrays["variance"][i]}


def _holds(arrays: dict, root: tuple[str, ...]) -> bool:  # pragma: no cover - manifests before "subtrees"
    """Whether a part of an older release (no ``subtrees`` in its manifest) holds ``root``: its
    subtree-level units' codes (only the last code is kept there)."""
    s = len(root)
    at = arrays["depth"] == s + 1
    return bool(at.any()) and root[-1] in set(arrays["code"][at].tolist())


def load_chunked(path: str | Path) -> ChunkedTopDownRelease:
    """Open a chunked TopDown release directory (its ``topdown.json``)."""
    p = Path(path)
    if p.is_file() and p.name == MANIFEST:
        p = p.parent
    m = p / MANIFEST
    if not m.is_file():
        raise SparseDPError(f"{p}: not a chunked TopDown release (no {MANIFEST})")
    try:
        manifest = json.loads(m.read_text())
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read {m}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("kind") != "topdown" or "files" not in manifest:
        raise SparseDPError(f"{m} is not a chunked TopDown release's manifest")
    for f in manifest["files"]:
        if not resolve_inside(p, f).is_file():  # a name inside the directory (no '..', absolute path, symlink out)
            raise SparseDPError(f"{p}: the release's file {f} is missing")
    return ChunkedTopDownRelease(str(p), manifest)


register_reader("topdown.load_directory", load_chunked)  # load_release reads chunked TopDown directories with it
