"""The TopDown release: measure every level, estimate by GLS, make non-negative integer counts.

:func:`topdown` runs, in this order:

1. **plan** (:func:`~sparsedp.topdown.design.plan_topdown`): one calibrated
   :class:`~sparsedp.measure.MeasurementPlan` per level, the budget split, the invariants' form;
2. **check**: the data (at construction of the :class:`HierarchicalTable`), the invariants'
   values (explicit ones: non-negative integers, consistent across levels), the generator, and that
   the whole cost fits in the accountant -- all before anything is charged or drawn;
3. **measure**: level by level, ``plan.measure`` (validate, charge with a ledger entry, draw exact
   noise): ``y_d = A_d x_d + z_d``;
4. **post-process** (:func:`release_from_measurements`, a function of the ``y_d``, the public
   design and the invariants only): per unit, the GLS of its own queries in the cells' component
   basis; the hierarchy GLS per component (:mod:`sparsedp.topdown.gls`) with the invariant
   components exact; back to cells, with exact variances; then the top-down non-negative integer
   counts (:mod:`sparsedp.topdown.rounding`).

Invariants are published exactly, by design (NOT private): the release's ``invariants`` and its
description say which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .. import noise as _noise
from ..errors import (
    InfeasibleConstraintsError,
    InputBoundError,
    InvalidPrivacyParameterError,
    NegativeCountError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
)
from ..privacy import Accountant, LedgerEntry, ledger_time
from ..privacy_unit import ONE_ROW
from ..releases import AxisLabel, ReleaseMethods, ReleaseResult, load_release, register_reader
from .intervals import count_report
from ..validation import MAX_MAGNITUDE
from .design import Invariant, TopDownDesign, pinned_marginals, plan_topdown
from .crossed import CrossedRounding, project_crossed, round_crossed
from .gls import hierarchy_gls, rowmul
from .hierarchy import CellDomain, HierarchicalTable, Hierarchy, check_contributions
from .table_file import full_codes
from .subtrees import (
    measure_units,
    noise_seeds,
    scatter_rows,
    stream,
    subtree_level_index,
    subtree_ranges,
    unit_plan,
)
from .units import declared_unit, design_unit_charge, level_costs, plan_for_unit, unit_description, unit_entry
from .rounding import (
    project_children,
    project_marginal,
    project_transport,
    round_children,
    round_marginal,
    round_transport,
)

__all__ = ["TopDownRelease", "topdown", "release_from_measurements", "estimate_from_measurements", "integer_counts",
           "resolve_invariants", "load_topdown", "topdown_from_result"]

Pin = tuple[tuple[int, ...], np.ndarray]
#: what is pinned at one level: ``None``, one marginal and its values (nested invariants), or
#: several (crossed invariants: none inside another; :func:`~sparsedp.topdown.design.pinned_marginals`)
LevelPins = Pin | tuple[Pin, ...] | None


def level_pins(pin: LevelPins) -> tuple[Pin, ...]:
    """A level's pinned marginals and their values as a tuple (``()``: none)."""
    if pin is None:
        return ()
    if len(pin) == 2 and isinstance(pin[1], np.ndarray):
        return (pin,)  # type: ignore[return-value]
    return tuple(pin)  # type: ignore[arg-type]


def pin_values(cells: CellDomain, pin: LevelPins, axes: tuple[int, ...]) -> np.ndarray:
    """The values of the marginal on ``axes`` that a level's pins determine (summed down from the
    first pinned marginal containing it)."""
    for ax, vals in level_pins(pin):
        if set(axes) <= set(ax):
            return _project_values(cells, vals, ax, axes)
    raise ShapeError(f"{cells.marginal_name(axes)!r} is not pinned at this level")  # pragma: no cover


# -- invariants ------------------------------------------------------------------------------------


def _explicit_values(inv: Invariant, h: Hierarchy, d: int, axes: tuple[int, ...]) -> np.ndarray:
    m = h.cells.marginal_size(axes)
    vals = np.asarray(getattr(inv.values, "to_numpy", lambda: inv.values)())
    if vals.ndim == 1 and m == 1:
        vals = vals[:, None]
    if vals.shape != (h.sizes[d], m):
        raise ShapeError(f"invariant {h.levels[d]}:{h.cells.marginal_name(axes)}: values must have shape "
                         f"{(h.sizes[d], m)} (units of the level in hierarchy order, marginal cells), got {vals.shape}")
    if vals.dtype.kind not in "iuf" or not np.all(np.isfinite(vals)):
        raise InfeasibleConstraintsError("invariant values must be finite numbers")
    if np.any(vals < 0) or np.any(vals != np.round(vals)):
        raise InfeasibleConstraintsError("invariant values must be non-negative integers (counts)")
    if vals.size and float(vals.max()) > MAX_MAGNITUDE:
        raise InputBoundError(f"an invariant value exceeds {MAX_MAGNITUDE:.0f}")
    if any(h.leaves(e).any() for e in range(d)):
        raise UnsupportedStructureError("explicit invariant values need every leaf at or below their level")
    return vals.astype(np.int64)


def _project_values(cells: CellDomain, values: np.ndarray, axes: tuple[int, ...], to: tuple[int, ...]) -> np.ndarray:
    """Marginal values on ``axes`` summed down to the marginal on ``to`` (a subset)."""
    sub = [cells.sizes[i] for i in axes]
    t = values.reshape((values.shape[0],) + tuple(sub))
    drop = tuple(1 + k for k, i in enumerate(axes) if i not in to)
    return (t.sum(axis=drop) if drop else t).reshape(values.shape[0], -1)


def resolve_invariants(table: HierarchicalTable, design: TopDownDesign,
                       invariants: Sequence[Any] = ()) -> list[LevelPins]:
    """Per level, the invariant marginals pinned there (:func:`~sparsedp.topdown.design.pinned_marginals`)
    and their values: ``None`` where none, ``(axes, values)`` for one (nested invariants), a tuple
    of those for crossed ones; from the data, or the explicit values of ``invariants`` (the same
    list given to :func:`plan_topdown`), checked (non-negative integers; levels that meet agree;
    crossed marginals agree on what they share).  Raises
    :class:`~sparsedp.errors.InfeasibleConstraintsError` when they do not."""
    h = design.hierarchy
    cells = h.cells
    specs = [Invariant.parse(s) for s in invariants] if invariants else [None] * len(design.invariants)
    if len(specs) != len(design.invariants):
        raise ShapeError("give the same invariants to plan_topdown and resolve_invariants")
    # values of each invariant at its own level and every level above
    per_level: list[list[tuple[tuple[int, ...], np.ndarray]]] = [[] for _ in range(h.depth + 1)]
    for spec, (d, axes) in zip(specs, design.invariants):
        if spec is not None and (h.level_index(spec.level), cells.axes(spec.marginal)) != (d, axes):
            raise ShapeError(f"invariant {spec.level}:{spec.marginal} is not the design's "
                             f"{h.levels[d]}:{cells.marginal_name(axes)}")
        if spec is None or spec.values is None:
            for e in range(d + 1):
                per_level[e].append((axes, cells.marginal(table.counts[e], axes)))
            continue
        push_explicit(per_level, spec, h, d, axes)
    explicit = any(sp_ is not None and sp_.values is not None for sp_ in specs)
    return [level_values(cells, h.levels[d], marginals, per_level[d], explicit)
            for d, marginals in enumerate(pinned_marginals(design))]


def level_values(cells: CellDomain, level: str, marginals: Sequence[tuple[int, ...]],
                 entries: Sequence[tuple[tuple[int, ...], np.ndarray]], explicit: bool) -> LevelPins:
    """One level's pins from the values of the invariants that hold there (``entries``:
    ``(axes, values)``) and its pinned ``marginals`` (:func:`~sparsedp.topdown.design.pinned_marginals`):
    ``None`` for none, ``(axes, values)`` for one (:func:`agreed_values`), a tuple of those for
    crossed ones (:func:`agreed_pins`; with ``explicit`` values among the invariants and three or
    more marginals, :func:`check_tables_exist`).  What :func:`resolve_invariants` and the chunked
    release (on the driver) compute per level."""
    if not marginals:
        return None
    if len(marginals) == 1:
        return (marginals[0], agreed_values(cells, level, marginals[0], entries))
    pins = agreed_pins(cells, level, marginals, entries)
    if len(marginals) > 2 and explicit:
        check_tables_exist(cells, level, pins)
    return pins


def check_tables_exist(cells: CellDomain, level: str, pins: LevelPins) -> None:
    """Three or more crossed marginals can agree pairwise and still have no table of counts (two
    always have one: per cell of what they share, a transportation problem); official values for
    them are checked here, before any charge, by the rounding's integer program on every unit
    (:func:`~sparsedp.topdown.crossed.round_crossed`).  Values from the data always have one."""
    groups = [(cells.cell_to_marginal(ax), vals) for ax, vals in level_pins(pins)]
    n = groups[0][1].shape[0]
    try:
        round_crossed(np.zeros((n, cells.size)), np.ones((n, cells.size)), groups)
    except InfeasibleConstraintsError:
        raise InfeasibleConstraintsError(
            f"the invariants at level {level!r} agree on what they share, but no table of non-negative integer "
            "counts has them all") from None


def push_explicit(per_level: list[list[tuple[tuple[int, ...], np.ndarray]]], spec: Invariant, h: Hierarchy, d: int,
                  axes: tuple[int, ...]) -> None:
    """An invariant's explicit values (checked, :func:`_explicit_values`) at its level ``d`` and,
    summed up, at every level above, appended to ``per_level``."""
    vals = _explicit_values(spec, h, d, axes)
    for e in range(d, -1, -1):
        per_level[e].append((axes, vals))
        if e:
            vals = h.children_sum(e - 1, vals)


def agreed_values(cells: CellDomain, level: str, finest: tuple[int, ...],
                  entries: Sequence[tuple[tuple[int, ...], np.ndarray]]) -> np.ndarray:
    """The values of the ``finest`` invariant marginal at a level, checked to determine every other
    invariant's values there (``entries``: ``(axes, values)``); raises
    :class:`~sparsedp.errors.InfeasibleConstraintsError` when they disagree."""
    ref = next(v for ax, v in entries if ax == finest)
    for ax, v in entries:
        if not np.array_equal(_project_values(cells, ref, finest, ax), v):
            raise InfeasibleConstraintsError(
                f"the invariants disagree at level {level!r}: {cells.marginal_name(ax)!r} is not the "
                f"sum of {cells.marginal_name(finest)!r} (or of the level below)")
    return ref


def agreed_pins(cells: CellDomain, level: str, marginals: Sequence[tuple[int, ...]],
                entries: Sequence[tuple[tuple[int, ...], np.ndarray]]) -> tuple[Pin, ...]:
    """Crossed invariants at a level: each pinned marginal's values (:func:`agreed_values` over the
    ``entries`` inside it), checked to agree pairwise on the marginal they share (``age`` and
    ``race``: the same totals); raises :class:`~sparsedp.errors.InfeasibleConstraintsError` when
    they do not."""
    pins = tuple((m, agreed_values(cells, level, m, [(ax, v) for ax, v in entries if set(ax) <= set(m)]))
                 for m in marginals)
    for i, (a, va) in enumerate(pins):
        for b, vb in pins[i + 1:]:
            common = tuple(k for k in a if k in b)
            if not np.array_equal(_project_values(cells, va, a, common), _project_values(cells, vb, b, common)):
                raise InfeasibleConstraintsError(
                    f"the invariants disagree at level {level!r}: {cells.marginal_name(a)!r} and "
                    f"{cells.marginal_name(b)!r} give different {cells.marginal_name(common)!r}")
    return pins


# -- post-processing ---------------------------------------------------------------------------------


def own_level(design: TopDownDesign, d: int, n: int, y: np.ndarray | None, pin: LevelPins
              ) -> tuple[np.ndarray, np.ndarray]:
    """Level ``d``'s units (``n`` of them, measured as ``y``: the level plan's rows for these
    units, or ``None`` when the level is not measured): each unit's GLS estimate of its components
    from its own queries (and the invariant components, exact), with variances (``inf``: not
    measured).  Row by row: the same for a unit whether its level is processed whole or by parts."""
    lp = design.levels[d]
    cells = design.hierarchy.cells
    C = cells.size
    B = design.basis
    comp = cells.component_attributes()
    info = design.information(d) if lp.plan is not None else np.zeros(C)
    if lp.plan is not None:
        rows = sum(b.size for b in lp.blocks)
        if y is None or y.shape != (n * rows,):
            raise ShapeError(f"level {lp.name!r}: expected {n * rows} measurements")
        rhs = np.zeros((n, C))  # sum over the marginal blocks of Q_S^T y_S / var_S (cells)
        rhs_comp = np.zeros((n, C))  # the blocks that measure components directly
        start = 0
        for b, var in zip(lp.blocks, lp.block_variances()):
            yb = y[start:start + n * b.size].reshape(n, b.size)
            start += n * b.size
            if b.components is not None:
                rhs_comp[:, list(b.components)] += yb / var
            elif b.size == C:
                rhs += yb / var[0]
            else:
                rhs += yb[:, cells.cell_to_marginal(b.axes)] / var[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(info > 0, (rowmul(rhs, B.T) + rhs_comp) / np.where(info > 0, info, 1.0), 0.0)
    else:
        e = np.zeros((n, C))
    with np.errstate(divide="ignore"):
        v = np.broadcast_to(np.where(info > 0, 1.0 / info, np.inf), (n, C)).copy()
    for axes, values in level_pins(pin):  # crossed marginals agree on the components they share
        N = C // cells.marginal_size(axes)
        spread = values[:, cells.cell_to_marginal(axes)] / N
        mask = np.array([set(a) <= set(axes) for a in comp])
        e[:, mask] = rowmul(spread, B.T)[:, mask]
        v[:, mask] = 0.0
    return e, v


def _own_estimates(design: TopDownDesign, ys: Sequence[np.ndarray | None], pins: Sequence[LevelPins]
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per level, :func:`own_level` of all its units."""
    h = design.hierarchy
    own, own_var = [], []
    for d, lp in enumerate(design.levels):
        y = ys[d] if lp.plan is not None else None
        if lp.plan is not None and (y is None or y.shape != (lp.plan.rows,)):
            raise ShapeError(f"level {lp.name!r}: expected {lp.plan.rows} measurements")
        e, v = own_level(design, d, h.sizes[d], y, pins[d])
        own.append(e)
        own_var.append(v)
    return own, own_var


def _weights(var: np.ndarray, kind: str) -> np.ndarray:
    if kind == "uniform":
        return np.ones_like(var)
    return 1.0 / np.maximum(var, 1e-12)


def check_weights(weights: Any) -> str:
    """``"variance"`` or ``"uniform"`` (else :class:`SparseDPError`)."""
    if weights not in ("variance", "uniform"):
        raise SparseDPError(f"weights must be 'variance' or 'uniform', got {weights!r}")
    return weights


def round_level(cells: CellDomain, d: int, est: np.ndarray, var: np.ndarray, pin: LevelPins,
                parents: np.ndarray | None, above: np.ndarray | None, weights: str = "variance",
                totals_first: bool = False) -> np.ndarray:
    """The non-negative integer counts of one level's units: the root (``d == 0``: ``parents`` and
    ``above`` unused) projected and rounded; below it, each parent's children (``parents``: their
    parent indices into ``above``, the parents' integer counts) projected onto ``{v >= 0, sum v =
    parent}`` per cell and rounded (with the level's invariant ``pin``, the transportation problem).
    ``totals_first`` (a level without invariant): each unit's total is made a non-negative integer
    first (the children's totals adding up to their parent's, weighted by the sum of their cells'
    variances), then its cells with that total as an exact row sum (the transportation problem,
    slower: a linear program per block of families).  Per parent: the same for a family whether
    its level is rounded whole or by parts.  Crossed pins (several marginals): :func:`round_crossed_level`,
    refused (:class:`~sparsedp.errors.InfeasibleConstraintsError`) when a parent's cells would have
    to change (:func:`integer_counts` does that)."""
    if len(level_pins(pin)) > 1:
        r = round_crossed_level(cells, d, est, var, pin, parents, above, weights)
        if r.fallbacks:
            raise InfeasibleConstraintsError(f"{r.fallbacks} parent(s) have no integer table of children meeting the "
                                             "crossed invariants and their cells (integer_counts changes them)")
        return r.counts
    w = _weights(var, weights)
    if pin is not None and pin[0] == cells.axes("cells"):
        return pin[1].astype(np.int64)
    if pin is None and totals_first:
        tot, tw = est.sum(axis=1, keepdims=True), _weights(var.sum(axis=1, keepdims=True), weights)
        if d == 0:
            pin = ((), np.maximum(np.rint(tot), 0.0).astype(np.int64))
        else:
            up = above.sum(axis=1, keepdims=True)  # type: ignore[union-attr]
            pin = ((), round_children(project_children(tot, tw, parents, up), parents, up))
    if d == 0:
        if pin is None:
            return np.maximum(np.rint(est), 0.0).astype(np.int64)
        c2m = cells.cell_to_marginal(pin[0])
        return round_marginal(project_marginal(est, w, c2m, pin[1]), c2m, pin[1])
    if pin is None:
        return round_children(project_children(est, w, parents, above), parents, above)
    c2m = cells.cell_to_marginal(pin[0])
    x = project_transport(est, w, parents, above, c2m, pin[1])
    return round_transport(x, w, parents, above, c2m, pin[1])


def round_crossed_level(cells: CellDomain, d: int, est: np.ndarray, var: np.ndarray, pin: LevelPins,
                        parents: np.ndarray | None, above: np.ndarray | None, weights: str = "variance",
                        keep: Sequence[tuple[int, ...]] = ()) -> CrossedRounding:
    """A level with crossed pins (:mod:`sparsedp.topdown.crossed`): each parent's children (the
    root's cells when ``d == 0``) projected onto the crossed invariants and the parent's cells
    (cyclic Dykstra), then the closest integer table (a mixed integer program); a parent with no
    such table gets the sums of its children (its marginals on ``keep`` unchanged)."""
    w = _weights(var, weights)
    groups = [(cells.cell_to_marginal(ax), vals) for ax, vals in level_pins(pin)]
    if d == 0:
        return round_crossed(project_crossed(est, w, groups), w, groups)
    x = project_crossed(est, w, groups, parents, above)
    return round_crossed(x, w, groups, parents, above, [cells.cell_to_marginal(ax) for ax in keep])


def integer_counts(design: TopDownDesign, estimate: Sequence[np.ndarray], variance: Sequence[np.ndarray],
                   pins: Sequence[LevelPins], weights: str = "variance",
                   report: dict[str, int] | None = None) -> tuple[np.ndarray, ...]:
    """Non-negative integer counts, top-down, every parent the sum of its children, invariants exact
    (module :mod:`sparsedp.topdown.rounding`; :func:`round_level` per level; crossed invariants
    :func:`round_crossed_level`, where a parent whose cells no integer table of children meets
    becomes the sum of its children and every ancestor the sum of theirs).  ``report``: filled
    with ``crossed_fallbacks``, how many parents that changed (a function of the estimate and the
    invariants: post-processing)."""
    check_weights(weights)
    h = design.hierarchy
    out: list[np.ndarray] = []
    fallbacks = 0
    keep = pinned_marginals(design)[0]  # every invariant holds at the root: the ancestors keep these
    for d in range(h.depth + 1):
        if len(level_pins(pins[d])) > 1:
            r = round_crossed_level(h.cells, d, estimate[d], variance[d], pins[d], h.parents[d] if d else None,
                                    out[d - 1] if d else None, weights, keep)
            if r.fallbacks:
                out[d - 1] = r.parent_counts  # type: ignore[assignment]
                resum_ancestors(h, out, d - 1)
                fallbacks += r.fallbacks
            out.append(r.counts)
            continue
        out.append(round_level(h.cells, d, estimate[d], variance[d], pins[d], h.parents[d] if d else None,
                               out[d - 1] if d else None, weights,
                               bool(design.totals_first[d]) if design.totals_first else False))
    if report is not None:
        report["crossed_fallbacks"] = fallbacks
    return tuple(out)


def resum_ancestors(h: Hierarchy, counts: list[np.ndarray], d: int) -> None:
    """Every level above ``d`` made again the sum of its children (its leaves unchanged), in place."""
    for e in range(d - 1, -1, -1):
        inner = ~h.leaves(e)
        counts[e] = counts[e].copy()
        counts[e][inner] = h.children_sum(e, counts[e + 1])[inner]


def to_cells(design: TopDownDesign, est: np.ndarray, var: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Component estimates and variances back to cells (row by row)."""
    B = design.basis
    return rowmul(est, B), rowmul(var, B * B)


def estimate_from_measurements(design: TopDownDesign, ys: Sequence[np.ndarray | None], pins: Sequence[LevelPins]
                               ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Post-processing only: the GLS estimate of every level's ``(units, cells)`` counts from the
    levels' measurements ``ys`` (``None``: not measured), the public design and the invariants, and
    its exact variances (tree x Kronecker: the hierarchy GLS per component of the cells' basis)."""
    own, own_var = _own_estimates(design, ys, pins)
    g = hierarchy_gls(design.hierarchy, own, own_var)
    pairs = [to_cells(design, e, v) for e, v in zip(g.estimate, g.variance)]
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)


def release_from_measurements(design: TopDownDesign, ys: Sequence[np.ndarray | None], pins: Sequence[LevelPins],
                              weights: str = "variance", report: dict[str, int] | None = None
                              ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """Post-processing only: ``(counts, estimate, variance)`` per level from the measurements
    (:func:`estimate_from_measurements`, then :func:`integer_counts`, which fills ``report``)."""
    check_weights(weights)
    est, var = estimate_from_measurements(design, ys, pins)
    return integer_counts(design, est, var, pins, weights, report), est, var


# -- the release -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TopDownRelease(ReleaseMethods):
    """A TopDown release.  Per level ``d`` (root first): ``counts[d]`` the published non-negative
    integer ``(units, cells)`` counts (every parent the sum of its children in every cell,
    invariants exact); ``estimate[d]`` the GLS estimate they are rounded from and ``variance[d]``
    its exact variance; ``noisy[d]`` the level's raw measurement (``None``: not measured or not
    kept).  ``invariants``: the published exact marginals (NOT private); ``ledger``: one entry per
    measured level."""

    hierarchy: Hierarchy
    counts: tuple[np.ndarray, ...]
    estimate: tuple[np.ndarray, ...]
    variance: tuple[np.ndarray, ...]
    noisy: tuple[Any, ...] = ()
    invariants: tuple[dict, ...] = ()
    ledger: tuple = ()
    private: bool = True
    noise: str = "gaussian"
    secure: bool = True
    description: dict = field(default_factory=dict, repr=False)
    design: TopDownDesign | None = field(default=None, repr=False)

    @property
    def cells(self) -> CellDomain:
        return self.hierarchy.cells

    def level(self, level: Any, values: str = "counts") -> Any:
        """One level as a DataFrame: its codes (and its ancestors') and one column per cell."""
        h = self.hierarchy
        d = h.level_index(level)
        pd = _pandas()
        data = {g: p for g, p in zip(h.geo, h.paths(d))} if d else {"level": np.array([h.levels[0]], dtype=object)}
        frame = pd.DataFrame(data)
        arr = self._values(values)[d]
        for j, c in enumerate(h.cells.columns):
            frame[c] = arr[:, j]
        return frame

    def _values(self, values: str) -> tuple[np.ndarray, ...]:
        if values not in ("counts", "estimate", "variance"):
            raise SparseDPError(f"values must be 'counts', 'estimate' or 'variance', got {values!r}")
        return getattr(self, values)

    def to_pandas(self, values: str = "counts") -> Any:  # type: ignore[override]
        """One row per geographic unit, root first then level by level: ``level``, ``depth``, one
        column per geography level (the unit's code and its ancestors'; ``None`` below its level)
        and one column per cell (``values``: ``"counts"``, ``"estimate"`` or ``"variance"``)."""
        frame = self.hierarchy.unit_frame()
        arr = np.concatenate(self._values(values), axis=0)
        cols = {c: arr[:, j] for j, c in enumerate(self.cells.columns)}
        pd = _pandas()
        return pd.concat([frame, pd.DataFrame(cols)], axis=1)

    def published_table(self) -> Any:
        """The table the command line writes (``--out units.csv|.parquet``): :meth:`to_pandas` of
        the counts with, after the geography columns, ``code`` (each unit's full code: its own and
        its ancestors' codes joined outermost first by ``/``, as text, leading zeros kept --
        ``55/025/000150`` -- unambiguous whatever the codes' widths; ``None`` for the root;
        :func:`sparsedp.topdown.table_file.full_codes`) and ``total`` (the unit's published count
        over all its cells, the sum of its cell columns).  A cell named like one of them gets the
        other name with a ``unit_`` prefix."""
        frame = self.to_pandas()
        geo = list(self.hierarchy.geo)
        taken = set(frame.columns)
        code = "code" if "code" not in taken else "unit_code"
        total = "total" if "total" not in taken else "unit_total"
        cells = np.concatenate(self.counts, axis=0)
        at = frame.columns.get_loc(geo[-1]) + 1 if geo else len(frame.columns)
        frame.insert(at, code, full_codes(self.hierarchy))
        frame.insert(at + 1, total, cells.sum(axis=1).astype(np.int64))
        return frame

    def unit_table(self) -> Any:
        """The published table, one row per unit (:meth:`to_pandas` of the counts): what
        ``to_release().to_pandas()`` and ``sparsedp.load_release(path).to_pandas()`` give."""
        return self.to_pandas()

    def to_release(self) -> ReleaseResult:
        """The common release model: one answer per (unit, cell), units level by level (root first),
        cells in C order; labels ``unit`` (global index), ``cell`` and ``depth``; variances: the GLS
        estimate's (exact; the integer counts are rounded from it, ``variance_method`` says so);
        arrays: the GLS ``estimate``, the units' ``parent`` (global index) and ``code``.  Its
        ``confidence_intervals()`` are for the published integer counts
        (:mod:`sparsedp.topdown.intervals`): integers, never below 0, covering the true count as
        often as the GLS estimate's interval does."""
        h = self.hierarchy
        total, C = h.units, h.cells.size
        shape = (total, C)
        answers = np.concatenate([c.ravel() for c in self.counts]).astype(np.float64)
        depth = np.repeat(np.arange(h.depth + 1, dtype=np.int8), np.asarray(h.sizes) * C)
        off = h.offsets()
        parent = np.concatenate([np.array([-1], dtype=np.int64)] +
                                [h.parents[d].astype(np.int64) + off[d - 1] for d in range(1, h.depth + 1)])
        codes = np.concatenate([np.asarray(c, dtype=str) for c in h.codes])
        desc = dict(self.description)
        desc.setdefault("hierarchy", h.describe())
        variances = np.concatenate([v.ravel() for v in self.variance])
        estimate = np.concatenate([e.ravel() for e in self.estimate])
        return ReleaseResult(
            kind="topdown", answers=answers,
            labels={"unit": AxisLabel(shape, 0), "cell": AxisLabel(shape, 1, list(h.cells.columns)), "depth": depth},
            variances=variances, noise=self.noise, secure=self.secure,
            strategy="per level: the cells' histogram (and marginals) of every unit; tree GLS per component; "
                     "top-down non-negative integer rounding",
            ledger=self.ledger, private=self.private, description=desc,
            arrays={"estimate": estimate, "parent": parent, "code": codes},
            report=count_report(variances, estimate, self.noise, self.secure),
            variance_method="gls: exact variance of the GLS estimate the integer count is rounded from",
            source=self)

    def error_report(self) -> Any:
        """The GLS estimate's exact variances with intervals for the published counts
        (:func:`sparsedp.topdown.intervals.count_report`): what :meth:`to_release` carries, and
        what a saved release uses when loaded."""
        return count_report(np.concatenate([v.ravel() for v in self.variance]),
                            np.concatenate([e.ravel() for e in self.estimate]), self.noise, self.secure)

    def check(self) -> dict[str, int]:
        """Counts of violations (all 0 for a valid release): negatives, non-integers, parents that
        differ from the sum of their children (per cell), invariants not kept."""
        h = self.hierarchy
        neg = sum(int((c < 0).sum()) for c in self.counts)
        nonint = sum(int((c != np.round(c)).sum()) for c in self.counts)
        bad = 0
        for d in range(h.depth):
            s = h.children_sum(d, self.counts[d + 1])
            inner = ~h.leaves(d)
            bad += int((s[inner] != self.counts[d][inner]).sum())
        inv = 0
        for item in self.invariants:
            d = h.level_index(item["level"])
            axes = h.cells.axes(item["marginal"])
            inv += int((h.cells.marginal(self.counts[d], axes) != np.asarray(item["values"])).sum())
        return {"negative": neg, "non_integer": nonint, "inconsistent": bad, "invariant_violations": inv}


def _pandas() -> Any:
    from .hierarchy import _pd

    return _pd()


def level_entry(lp: Any, seeded: bool, rows: int, columns: int) -> LedgerEntry:
    """The ledger entry of one measured level (its plan's cost, scales and sensitivity; ``rows`` and
    ``columns``: the whole level's)."""
    p = lp.plan
    return LedgerEntry(label=lp.label, cost=p.cost, rows=int(rows), columns=int(columns), noise=p.noise,
                       secure=p.secure, private=not seeded, sensitivity=lp.sensitivity,
                       scale_min=float(np.min(p.scales)), scale_max=float(np.max(p.scales)), time=ledger_time())


def charge_levels(design: TopDownDesign, accountant: Accountant | None, seeded: bool,
                  units: Sequence[int], privacy_unit: Any = None) -> list[LedgerEntry]:
    """Charge every measured level of ``design`` once (``units``: the levels' real unit counts),
    one ledger entry each, before any noise is drawn; the entries.  ``privacy_unit``: a declared
    unit the per-record ``design`` protects, each level charged per unit (:mod:`.units`)."""
    C = design.hierarchy.cells.size
    entries = []
    for lp in design.measured:
        per_unit = lp.plan.rows // max(lp.units, 1)
        entry = level_entry(lp, seeded, per_unit * units[lp.depth], C * units[lp.depth])
        if privacy_unit is not None:
            entry = unit_entry(entry, privacy_unit)
        if accountant is not None:
            accountant.spend(entry.cost, label=entry.label, entry=entry)
        entries.append(entry)
    return entries


def measure_levels(design: TopDownDesign, counts: Sequence[np.ndarray], subtree_level: int, rng: Any
                   ) -> list[np.ndarray | None]:
    """Every level's measurement ``y`` (no charge: the caller charged), the noise keyed by subtree
    (:mod:`sparsedp.topdown.subtrees`): the levels above ``subtree_level`` whole from the top
    stream, each subtree's units from its own stream, level by level."""
    h = design.hierarchy
    s = subtree_level
    top_seed, seeds = noise_seeds(rng, h.sizes[s])
    top = stream(top_seed)
    ys: list[np.ndarray | None] = []
    for lp in design.levels[:s]:
        ys.append(None if lp.plan is None else lp.plan.measure(counts[lp.depth].ravel(), rng=top, label=lp.label).y)
    ups = [unit_plan(lp) for lp in design.levels[s:]]
    for lp in design.levels[s:]:
        ys.append(None if lp.plan is None else np.zeros(lp.plan.rows))
    ranges = subtree_ranges(h, s)
    cache: dict = {}
    for g in range(h.sizes[s]):
        gen = stream(seeds[g])
        for i, up in enumerate(ups):
            if up is None:
                continue
            d = s + i
            lo, hi = int(ranges[i][0][g]), int(ranges[i][1][g])
            if hi > lo:
                scatter_rows(ys[d], up.sizes, h.sizes[d], lo, measure_units(cache, up, counts[d][lo:hi], gen))
    return ys


def resolve_contributions(declared: int, asked: Any) -> int:
    """The cells per person a release calibrates to: ``asked`` (``None``: the ``declared`` number
    of the data), never fewer than the data declare (their count columns overlap that much)."""
    k = declared if asked is None else check_contributions(asked)
    if k < declared:
        raise ShapeError(f"contributions_per_person={k}, but the table's count columns count one person in up to "
                         f"{declared} cells: give at least {declared}")
    return k


def topdown(table: HierarchicalTable, *, rho: float | None = None, epsilon: float | None = None,
            noise: str | None = None, split: Any = None, queries: Any = None, invariants: Sequence[Any] = (),
            secure: bool = True, accountant: Accountant | None = None, rng: Any = None, weights: str = "variance",
            design: TopDownDesign | None = None, keep_noisy: bool = True,
            measure_invariants: bool | None = None, subtree_level: Any = 1,
            contributions_per_person: int | None = None, workload: Any = None) -> TopDownRelease:
    """Release every level of ``table`` (a :class:`HierarchicalTable`): the counts of every unit
    and cell, non-negative integers, every parent the sum of its children, the ``invariants``
    exact (module docstring).

    ``rho`` (zCDP, discrete Gaussian noise; the default kind) or ``epsilon`` (pure DP, discrete
    Laplace); ``workload``: what the release is for, per level ``{marginal: weight}`` (default
    every unit's cells and total; :mod:`sparsedp.topdown.workload`); ``split``: ``None`` (the
    default) or ``"optimal"`` / an :class:`~sparsedp.topdown.OptimalSplit`: each level's queries and
    the budget shares chosen for the workload from the public design alone
    (:func:`~sparsedp.topdown.design.optimal_split`), or the levels' budget weights (``"equal"``,
    a list, one per level root first, or ``{level: weight}``; 0 skips a non-leaf level);
    ``queries``: per level, ``None`` (chosen by the optimiser; the cells' histogram with given
    weights) or queries with weights (``{"cells": 3, "total": 1}``, ``"residual:age"``), one spec
    for every level or a list; ``invariants``: ``"state:total"``-style strings or
    :class:`~sparsedp.topdown.Invariant` s (published exactly: not private); ``accountant``: charged
    once per measured level, with ledger entries, after every check; ``rng``: ``None`` (secure
    randomness) or a seed / Generator (reproducible; the release is then marked not private);
    ``weights``: the norm of the non-negative projection, ``"variance"`` (``1 / Var``) or
    ``"uniform"``; ``design``: a :func:`plan_topdown` result to reuse (its hierarchy must be the
    table's).  ``secure=False`` draws float noise (for comparisons only).

    The noise is keyed by subtree (:mod:`sparsedp.topdown.subtrees`): the levels above
    ``subtree_level`` (a level name or index, default 1) from one stream, each unit of that level's
    subtree from its own (children of ``SeedSequence(rng)`` when seeded), so that the chunked
    release (:func:`sparsedp.topdown.scaleout.topdown_scaleout`, same ``subtree_level``) publishes
    the same bits for the same seed.

    ``contributions_per_person``: how many cells of their unit one person may be counted in
    (default: the table's, 1 unless its count columns overlap and it was read with
    ``contributions_per_person=K``; never fewer): the noise is calibrated to a person changing
    that many counts by one (:func:`~sparsedp.topdown.design.person_sensitivity`), within the
    same budget, and the ledger records it.

    A table of records with a declared ``privacy_unit``
    (:meth:`HierarchicalTable.from_records`) is released per unit: every level is planned at
    ``epsilon / L`` (``rho / L^2``, ``L`` the unit's bound on its records) and charged ``L``
    (``L^2``) times that per unit, the ledger entries and the description naming the unit
    (:mod:`sparsedp.topdown.units`)."""
    if not isinstance(table, HierarchicalTable):
        raise ShapeError(f"expected a HierarchicalTable (see HierarchicalTable.from_counts / read_table), got "
                         f"{type(table).__name__}")
    k = resolve_contributions(table.contributions_per_person, contributions_per_person)
    pu = declared_unit(table.privacy_unit)
    if design is None:
        def plan(r: Any, e: Any) -> TopDownDesign:
            return plan_topdown(table.hierarchy, rho=r, epsilon=e, noise=noise, split=split, queries=queries,
                                invariants=invariants, secure=secure, measure_invariants=measure_invariants,
                                contributions_per_person=k, workload=workload)

        design = plan(rho, epsilon) if pu is None else plan_for_unit(plan, pu, rho, epsilon, noise)
    elif design.hierarchy is not table.hierarchy:
        raise ShapeError("the design was planned for another hierarchy")
    elif design.contributions_per_person < k:
        raise ShapeError(f"the design was planned for {design.contributions_per_person} cell(s) per person; the "
                         f"table's count columns count a person in up to {k}")
    pins = resolve_invariants(table, design, invariants)
    check_weights(weights)
    s = subtree_level_index(design.hierarchy, subtree_level)
    noise_seeds(rng if not isinstance(rng, np.random.Generator) else None, 0)  # the generator's form, before any charge
    if accountant is not None:
        if not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        accountant.check_all(level_costs(design, pu))
    for c in table.counts:  # the checks every plan makes, for all levels before the first charge
        if c.size and (c.min() < 0 or float(c.max()) > MAX_MAGNITUDE):  # pragma: no cover - checked on construction
            raise NegativeCountError("counts must be non-negative integers below 2^50")
    seeded = rng is not None and not (isinstance(rng, _noise.SecureRandomBits) and rng.secure)
    seeded = seeded or table.truncation_seeded  # reproducible truncation: not private either
    ledger = charge_levels(design, accountant, seeded, design.hierarchy.sizes, pu)
    private = not seeded
    ys = measure_levels(design, table.counts, s, rng)
    report: dict[str, int] = {}
    counts, est, var = release_from_measurements(design, ys, pins, weights, report)
    h = design.hierarchy
    published = tuple({"level": h.levels[d], "marginal": h.cells.marginal_name(ax),
                       "values": pin_values(h.cells, pins[d], ax)} for d, ax in design.invariants)
    desc = design.describe()
    desc.update(hierarchy=h.describe(), weights=weights,
                non_private=("the invariants are the true values, published exactly by request (not private); the "
                             "units and cells are the public domain" if design.invariants else
                             "the units and cells are the public domain"),
                units_observed=bool(table.units_observed), privacy_unit=ONE_ROW.describe())
    if any(len(level_pins(p)) > 1 for p in pins):  # crossed invariants: how often the parents were re-summed
        desc["rounding"] = {"crossed_fallbacks": int(report.get("crossed_fallbacks", 0))}
    if pu is not None:
        desc = unit_description(desc, pu, design.noise, float(design_unit_charge(design, pu)))
    return TopDownRelease(h, counts, est, var, tuple(ys) if keep_noisy else (), published, tuple(ledger), private,
                          design.noise, design.secure, desc, design)


def load_topdown(path: str | Path) -> TopDownRelease:
    """Read a TopDown release file (``TopDownRelease.save``) or a chunked release directory
    (:func:`sparsedp.topdown.scaleout.topdown_scaleout`) back: counts, estimates, variances per
    level, the hierarchy, the ledger (no design and no raw measurements)."""
    return topdown_from_result(load_release(path))


def topdown_from_result(rel: ReleaseResult) -> TopDownRelease:
    """The :class:`TopDownRelease` of a ``"topdown"`` :class:`~sparsedp.releases.ReleaseResult`
    (:meth:`TopDownRelease.to_release`, or one loaded from a file): its per-level tables and
    hierarchy, rebuilt from the answers and the ``parent`` / ``code`` arrays."""
    if rel.kind != "topdown":
        raise SparseDPError(f"a {rel.kind!r} release, not a topdown one")
    if isinstance(rel.source, TopDownRelease):
        return rel.source
    if hasattr(rel.source, "to_topdown"):  # a release chunked by subtree (sparsedp.topdown.scaleout)
        return rel.source.to_topdown()
    desc = rel.description
    hd = desc.get("hierarchy") or {}
    try:
        levels = list(hd["levels"])
        sizes = [int(s) for s in hd["units"]]
        cells = CellDomain(tuple(hd["attributes"]), tuple(tuple(v) for v in hd["attributes"].values()),
                           tuple(hd["cells"]))
        parent, codes = np.asarray(rel.arrays["parent"]), np.asarray(rel.arrays["code"]).astype(object)
    except (KeyError, TypeError) as exc:
        raise SparseDPError(f"this topdown release lacks its hierarchy ({exc})") from exc
    off = np.concatenate(([0], np.cumsum(sizes)))
    parents = tuple([np.array([-1], dtype=np.int64)] +
                    [parent[off[d]:off[d + 1]] - off[d - 1] for d in range(1, len(sizes))])
    h = Hierarchy(tuple(levels), parents, tuple(codes[off[d]:off[d + 1]] for d in range(len(sizes))), cells)
    C = cells.size

    def split(a: Any, dtype: Any) -> tuple[np.ndarray, ...]:
        a = np.asarray(a).reshape(-1, C)
        return tuple(a[off[d]:off[d + 1]].astype(dtype) for d in range(len(sizes)))

    counts = split(rel.answers, np.int64)
    invariants = []
    for spec in desc.get("invariants", ()):
        level, _, marg = str(spec).rpartition(":")
        d = h.level_index(level)
        invariants.append({"level": level, "marginal": marg, "values": cells.marginal(counts[d], cells.axes(marg))})
    variances = split(rel.variances, np.float64) if rel.variances is not None else tuple(
        np.full((n, C), np.nan) for n in sizes)
    return TopDownRelease(h, counts, split(rel.arrays["estimate"], np.float64), variances, (), tuple(invariants),
                          rel.ledger, rel.private, rel.noise or "gaussian", rel.secure, dict(desc))


register_reader("topdown.from_release", topdown_from_result)  # load_release: a TopDown file's tables (to_pandas)
