"""What a TopDown release measures: one calibrated plan per geographic level, and the invariants.

Per level ``d`` with ``n_d`` units the measured matrix is the stack, over the level's queries
``S`` (marginals of the cells: ``cells``, ``total``, an attribute, ...), of
``I_{n_d} (x) Q_S`` (``Q_S``: the 0/1 matrix that sums the cells of each marginal cell), applied to
the level's counts (unit-major, cells in C order).  One person added or removed changes one cell
of one unit at every level by one, so it moves each query of each level by exactly one in one entry:
a query measured with Gaussian ``sigma_S`` costs ``1 / (2 sigma_S^2)`` (Laplace ``b_S``:
``1 / b_S``), a level the sum over its queries, the release the sum over its levels (sequential
composition).  The plans compute these losses themselves from the matrices' entries
(:func:`sparsedp.measure.plan_measurement`); the split only chooses the scales.

Budgets are split in exact arithmetic and rounded *down* (``Fraction``), so the levels' charges
never add up to more than the total.  A level (not a leaf level) may get no budget: it is then
not measured (and not charged), and its estimate comes from the levels around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from ..calibration import gaussian_sigma, laplace_scale
from ..errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..operators import SparseOperator, scale_rows
from ..privacy import PrivacyCost, sequential
from ..validation import budget_fraction, check_epsilon, check_rho
from .hierarchy import CellDomain, Hierarchy

__all__ = ["QueryBlock", "LevelPlan", "TopDownDesign", "Invariant", "plan_topdown"]

#: scales of stacked queries are widened by this factor over the calibrated ones, so that the
#: plan's certified loss (which carries a float-rounding margin) stays within the level's budget
_WIDEN = 1.0 + 2.0**-30


@dataclass(frozen=True)
class QueryBlock:
    """One query of a level: the marginal on ``axes`` (``name``), its budget, and its rows
    ``start : start + units * size`` of the level's measurement (unit-major).  ``components``:
    ``None`` for a marginal (``size`` marginal cells per unit), or the basis components measured
    directly (the cells' histogram without what an invariant pins: one orthonormal row each)."""

    axes: tuple[int, ...]
    name: str
    budget: float
    start: int
    size: int
    components: tuple[int, ...] | None = None


@dataclass(frozen=True, eq=False)
class LevelPlan:
    """The measurement of one level (``plan`` is ``None`` when the level gets no budget)."""

    depth: int
    name: str
    units: int
    budget: float
    blocks: tuple[QueryBlock, ...]
    plan: MeasurementPlan | None

    @property
    def label(self) -> str:
        return f"topdown {self.name} ({', '.join(b.name for b in self.blocks)})"

    def block_variances(self) -> tuple[np.ndarray, ...]:
        """Per block, the noise variance of each of a unit's ``size`` rows (the same for every
        unit; exact for discrete noise)."""
        if self.plan is None:
            return ()
        var = self.plan.variances()
        out = []
        for b in self.blocks:
            seg = var[b.start:b.start + self.units * b.size].reshape(self.units, b.size)
            if self.units and np.any(seg != seg[0]):  # pragma: no cover - scales are per block and row
                raise SparseDPError("a query's units have different noise variances")
            out.append(seg[0].copy())
        return tuple(out)


@dataclass(frozen=True)
class Invariant:
    """An exact (NOT private) published marginal at one level: every unit of ``level`` (and every
    leaf above it) keeps its true ``marginal`` (``"total"``, an attribute, ``"age+race"``,
    ``"cells"``).  ``values``: ``None`` (the data's own, the usual case) or an explicit
    ``(units, marginal cells)`` array of non-negative integers (e.g. official figures)."""

    level: Any
    marginal: Any = "total"
    values: Any = None

    @classmethod
    def parse(cls, spec: Any) -> "Invariant":
        """``"state:total"``, ``("state", "total")``, ``("state", "total", values)`` or an Invariant."""
        if isinstance(spec, Invariant):
            return spec
        if isinstance(spec, str):
            level, sep, marg = spec.rpartition(":")
            if not sep or not level or not marg:
                raise ShapeError(f"an invariant is 'LEVEL:MARGINAL' (e.g. 'state:total'), got {spec!r}")
            return cls(level, marg)
        if isinstance(spec, (tuple, list)) and len(spec) in (2, 3):
            return cls(*spec)
        raise ShapeError(f"cannot read an invariant from {spec!r}")


@dataclass(frozen=True, eq=False)
class TopDownDesign:
    """The public design of a release: noise, budgets per level and query, the plans, invariants."""

    hierarchy: Hierarchy
    noise: str
    secure: bool
    total: float  # the budget: rho (gaussian) or epsilon (laplace)
    levels: tuple[LevelPlan, ...]
    invariants: tuple[tuple[int, tuple[int, ...]], ...]  # (depth, axes) of each invariant
    basis: np.ndarray  # (cells, cells) orthonormal rows: the components

    @property
    def split(self) -> tuple[float, ...]:
        return tuple(lp.budget for lp in self.levels)

    @property
    def measured(self) -> tuple[LevelPlan, ...]:
        return tuple(lp for lp in self.levels if lp.plan is not None)

    def cost(self) -> PrivacyCost:
        """What the release charges (sequential composition of the levels' plans)."""
        costs = [lp.plan.cost for lp in self.measured]
        if not costs:
            raise SparseDPError("nothing is measured")
        return sequential(*costs)

    def information(self, d: int) -> np.ndarray:
        """Per component (basis row), the information ``1 / variance`` of one unit's measurement at
        level ``d`` (``sum_S [A(k) subset S] (cells / |S|) / var_S``; 0 when unmeasured)."""
        lp = self.levels[d]
        C = self.hierarchy.cells.size
        comp = self.hierarchy.cells.component_attributes()
        info = np.zeros(C)
        for b, var in zip(lp.blocks, lp.block_variances()):
            if b.components is not None:
                info[list(b.components)] += 1.0 / var
                continue
            hit = np.array([set(a) <= set(b.axes) for a in comp])
            info[hit] += (C / b.size) / float(var[0])
        return info

    def gls_variances(self) -> tuple[np.ndarray, ...]:
        """Per level, the exact ``(units, cells)`` variances of the GLS estimate this design gives,
        without any data (they depend on the hierarchy, the plans and the invariants only): the
        accuracy a split buys, before non-negativity and rounding."""
        from .gls import hierarchy_gls

        h = self.hierarchy
        C = h.cells.size
        comp = h.cells.component_attributes()
        pins = pinned_axes(self)
        own, own_var = [], []
        for d in range(h.depth + 1):
            info = self.information(d) if self.levels[d].plan is not None else np.zeros(C)
            with np.errstate(divide="ignore"):
                v = np.broadcast_to(np.where(info > 0, 1.0 / info, np.inf), (h.sizes[d], C)).copy()
            if pins[d] is not None:
                v[:, [set(a) <= set(pins[d]) for a in comp]] = 0.0
            own.append(np.zeros((h.sizes[d], C)))
            own_var.append(v)
        B2 = self.basis * self.basis
        return tuple(v @ B2 for v in hierarchy_gls(h, own, own_var).variance)

    def describe(self) -> dict[str, Any]:
        cells = self.hierarchy.cells
        unit = "rho" if self.noise == "gaussian" else "epsilon"
        return {
            "noise": self.noise, "secure": self.secure, unit: self.total,
            "levels": [{"level": lp.name, unit: lp.budget, "measured": lp.plan is not None,
                        "queries": {b.name: b.budget for b in lp.blocks},
                        "scales": ([float(lp.plan.scales[b.start]) for b in lp.blocks] if lp.plan is not None else [])}
                       for lp in self.levels],
            "invariants": [f"{self.hierarchy.levels[d]}:{cells.marginal_name(ax)}" for d, ax in self.invariants],
            "neighbours": "add or remove one person (one cell of one leaf unit, hence of every level, by one)",
        }


def _shares(weights: Sequence[Any], total: Fraction, what: str) -> list[float]:
    """``total`` split in proportion to ``weights``, each share rounded down to a float."""
    w = []
    for x in weights:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating, Fraction)):
            raise InvalidPrivacyParameterError(f"{what} weights must be numbers, got {x!r}")
        f = Fraction(x) if isinstance(x, Fraction) else budget_fraction(float(x))
        if not np.isfinite(float(x)) or f < 0:
            raise InvalidPrivacyParameterError(f"{what} weights must be finite and >= 0, got {x!r}")
        w.append(f)
    s = sum(w, Fraction(0))
    if s <= 0:
        raise InvalidPrivacyParameterError(f"{what}: the weights add up to 0")
    out = []
    for f in w:
        q = total * f / s
        v = float(q)
        while v > 0 and budget_fraction(v) > q:  # what an Accountant charges for v must fit in the share
            v = float(np.nextafter(v, -np.inf))
        out.append(v if q > 0 else 0.0)
    return out


def _level_weights(h: Hierarchy, split: Any) -> list[Any]:
    if split is None:
        return [1] * (h.depth + 1)
    if isinstance(split, Mapping):
        unknown = [k for k in split if k not in h.levels]
        if unknown:
            raise ShapeError(f"split names unknown level(s) {unknown}; the levels are {h.levels}")
        return [split.get(name, 0) for name in h.levels]
    w = list(split)
    if len(w) != h.depth + 1:
        raise ShapeError(f"split has {len(w)} weights for {h.depth + 1} levels {h.levels}")
    return w


def _queries(cells: CellDomain, spec: Any, levels: int) -> list[list[tuple[tuple[int, ...], Any]]]:
    """Per level, ``[(axes, weight)]``: ``None`` (the cells), a mapping ``{marginal: weight}`` or a
    sequence of marginals (equal weights) for every level, or a list of those, one per level."""

    def one(q: Any) -> list[tuple[tuple[int, ...], Any]]:
        if q is None:
            return [(cells.axes("cells"), 1)]
        if isinstance(q, str):
            q = [q]
        items = list(q.items()) if isinstance(q, Mapping) else [(m, 1) for m in q]
        out: list[tuple[tuple[int, ...], Any]] = []
        for m, w in items:
            ax = cells.axes(m)
            if any(ax == a for a, _ in out):
                raise ShapeError(f"the marginal {cells.marginal_name(ax)!r} is listed twice")
            out.append((ax, w))
        if not out:
            raise ShapeError("a level's query list is empty (give it a zero budget to skip it)")
        return out

    if isinstance(spec, (list, tuple)) and len(spec) == levels and spec and all(
            s is None or isinstance(s, (Mapping, list, tuple)) for s in spec):
        return [one(s) for s in spec]
    return [one(spec)] * levels


def _marginal_matrix(cells: CellDomain, axes: tuple[int, ...]) -> sp.csr_matrix:
    C = cells.size
    m = cells.marginal_size(axes)
    return sp.csr_matrix((np.ones(C), (cells.cell_to_marginal(axes), np.arange(C))), shape=(m, C))


def _plan_level(h: Hierarchy, d: int, budget: float, queries: list[tuple[tuple[int, ...], Any]], noise: str,
                secure: bool, pinned: tuple[int, ...] | None) -> LevelPlan:
    """The plan of level ``d``.  ``pinned``: the invariant marginal at this level when its
    components are not to be measured (the cells query then measures the other components only)."""
    cells = h.cells
    n, C = h.sizes[d], cells.size
    all_axes = cells.axes("cells")
    if budget == 0:
        blocks = tuple(QueryBlock(ax, cells.marginal_name(ax), 0.0, 0, cells.marginal_size(ax)) for ax, _ in queries)
        return LevelPlan(d, h.levels[d], n, 0.0, blocks, None)
    budgets = _shares([w for _, w in queries], budget_fraction(budget), f"level {h.levels[d]!r} query")
    comp = cells.component_attributes()
    blocks, start = [], 0
    for (ax, _), b in zip(queries, budgets):
        if b == 0:
            continue
        comps = None
        if pinned is not None and ax == all_axes:
            comps = tuple(k for k, a in enumerate(comp) if not set(a) <= set(pinned))
            if not comps:  # the invariant publishes every cell: nothing to measure
                continue
        m = len(comps) if comps is not None else cells.marginal_size(ax)
        name = cells.marginal_name(ax) if comps is None else f"cells | {cells.marginal_name(pinned)}"
        blocks.append(QueryBlock(ax, name, b, start, m, comps))
        start += n * m
    if not blocks:
        return LevelPlan(d, h.levels[d], n, 0.0, (), None)
    key = "epsilon" if noise == "laplace" else "rho"
    level_budget_f = budget  # the level's share is charged (a query dropped above leaves its part unused)
    eye = sp.identity(n, format="csr")
    R, norms = cells.integer_basis()
    rows, weights, sens = [], [], []
    for b in blocks:
        if b.components is None:
            rows.append(sp.kron(eye, _marginal_matrix(cells, b.axes), format="csr"))
            weights.append(np.ones(n * b.size))
            sens.append(1.0)
        else:
            Rb = R[list(b.components)]
            rows.append(sp.kron(eye, sp.csr_matrix(Rb.astype(np.float64)), format="csr"))
            weights.append(np.tile(1.0 / norms[list(b.components)], n))
            Bb = Rb / norms[list(b.components)][:, None]
            p = 1 if noise == "laplace" else 2
            sens.append(float(np.max(np.sum(np.abs(Bb) ** p, axis=0)) ** (1.0 / p)))
    weighted = any(b.components is not None for b in blocks)
    if len(blocks) == 1 and blocks[0].components is None and blocks[0].axes == all_axes:
        A: Any = sp.identity(n * C, format="csr")
    else:
        A = rows[0] if len(rows) == 1 else sp.vstack(rows, format="csr")
    if weighted:  # diag(w) H with H integer: exact noise on the integer rows (the plan's integer form)
        A = scale_rows(SparseOperator(A, name=f"topdown {h.levels[d]} rows"), np.concatenate(weights))
    if len(blocks) == 1:
        plan = plan_measurement(A, **{key: level_budget_f}, noise=noise, secure=secure)
    else:
        scales = np.concatenate([
            np.full(n * b.size, (laplace_scale(s_, b.budget) if noise == "laplace" else gaussian_sigma(s_, b.budget))
                    * _WIDEN) for b, s_ in zip(blocks, sens)])
        plan = plan_measurement(A, **{key: level_budget_f}, scales=scales, noise=noise, secure=secure)
    return LevelPlan(d, h.levels[d], n, level_budget_f, tuple(blocks), plan)


def plan_topdown(h: Hierarchy, *, rho: float | None = None, epsilon: float | None = None, noise: str | None = None,
                 split: Any = None, queries: Any = None, invariants: Sequence[Any] = (),
                 secure: bool = True, measure_invariants: bool | None = None) -> TopDownDesign:
    """Plan a release (nothing is measured or charged): ``rho`` (zCDP, discrete Gaussian noise) or
    ``epsilon`` (pure DP, discrete Laplace noise) in total; ``split``: the levels' weights (a list,
    one per level, or ``{level: weight}``; default equal), each level's budget its share of the total
    (rounded down); ``queries``: what each level measures, ``None`` (the cells' full histogram),
    ``{marginal: weight}`` / a list of marginals for every level, or a list of those per level;
    ``invariants``: ``"level:marginal"`` strings or :class:`Invariant` s (checked here for form;
    their values are taken or checked when the data are read); ``measure_invariants``: whether the
    cells query also measures what the invariants publish exactly (default: not for Gaussian noise,
    where the histogram's other components then cost ``1 - m / cells`` of it for an invariant
    marginal of ``m`` cells; yes for Laplace, whose contrasts would cost more in L1)."""
    if noise is None:
        noise = "laplace" if epsilon is not None and rho is None else "gaussian"
    if noise not in ("gaussian", "laplace"):
        raise SparseDPError(f"noise must be 'gaussian' or 'laplace', got {noise!r}")
    if noise == "gaussian":
        if epsilon is not None or rho is None:
            raise InvalidPrivacyParameterError("Gaussian noise takes rho (zCDP)")
        total = check_rho(rho, "rho")
    else:
        if rho is not None or epsilon is None:
            raise InvalidPrivacyParameterError("Laplace noise takes epsilon (pure DP)")
        total = check_epsilon(epsilon, "epsilon")
    weights = _level_weights(h, split)
    budgets = _shares(weights, budget_fraction(total), "split")
    qs = _queries(h.cells, queries, h.depth + 1)
    for d in range(h.depth + 1):
        if h.leaves(d).any() and budgets[d] == 0:
            raise SparseDPError(f"level {h.levels[d]!r} has leaves but no budget: their counts would be undetermined")
    inv = []
    for spec in invariants:
        iv = Invariant.parse(spec)
        inv.append((h.level_index(iv.level), h.cells.axes(iv.marginal)))
    pins = _pinned(h, inv)
    skip = (noise == "gaussian") if measure_invariants is None else not bool(measure_invariants)
    levels = tuple(_plan_level(h, d, budgets[d], qs[d], noise, bool(secure), pins[d] if skip else None)
                   for d in range(h.depth + 1))
    design = TopDownDesign(h, noise, bool(secure), total, levels, tuple(inv), h.cells.basis())
    _check_identifiable(design)
    return design


def pinned_axes(design: TopDownDesign) -> list[tuple[int, ...] | None]:
    """Per level, the finest invariant marginal that holds there (invariants hold at their level and
    every level above it); ``None`` where none does.  Two invariants that meet at a level must be
    nested (``total`` inside ``age`` inside ``cells``): crossed ones (``age`` and ``race``) are not
    supported."""
    return _pinned(design.hierarchy, design.invariants)


def _pinned(h: Hierarchy, invariants: Sequence[tuple[int, tuple[int, ...]]]) -> list[tuple[int, ...] | None]:
    out: list[tuple[int, ...] | None] = [None] * (h.depth + 1)
    for d in range(h.depth + 1):
        found = [ax for (dd, ax) in invariants if dd >= d]
        if not found:
            continue
        finest = max(found, key=len)
        for ax in found:
            if not set(ax) <= set(finest):
                from ..errors import UnsupportedStructureError

                raise UnsupportedStructureError(
                    f"invariants on {h.cells.marginal_name(ax)!r} and {h.cells.marginal_name(finest)!r} meet at level "
                    f"{h.levels[d]!r} and neither contains the other: crossed invariants are not supported")
        out[d] = finest
    return out


def _check_identifiable(design: TopDownDesign) -> None:
    """Every leaf's components must be measured at its level or pinned by an invariant."""
    h = design.hierarchy
    pins = pinned_axes(design)
    comp = h.cells.component_attributes()
    for d in range(h.depth + 1):
        if not h.leaves(d).any():
            continue
        info = design.information(d)
        pinned = np.array([pins[d] is not None and set(a) <= set(pins[d]) for a in comp])
        if np.any((info == 0) & ~pinned):
            raise SparseDPError(f"level {h.levels[d]!r} has leaves and its queries do not determine every cell: "
                                "measure the cells there (queries including 'cells')")
