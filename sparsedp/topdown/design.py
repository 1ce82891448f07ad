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
not measured (and not charged), and its estimate comes from the levels around it.  A level that
carries no information (:func:`uninformative_levels`: the invariants determine it, or its units
are the next level's) gets no budget whatever the split, and the others share the whole total.

``split="optimal"`` (or an :class:`OptimalSplit`) chooses the shares without any data: it minimises
a level-weighted error of the GLS estimate, computed exactly from the design's public structure
(:func:`optimal_split`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from ..calibration import certified_sqrt, gaussian_sigma, laplace_scale
from ..errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..operators import SparseOperator, scale_rows
from ..privacy import PrivacyCost, sequential
from ..validation import budget_fraction, check_epsilon, check_rho
from .hierarchy import CellDomain, Hierarchy, check_contributions
from .gls import class_variances, shape_classes
from .workload import Residual, key_axes, marginal_mix, parse_queries, parse_workload, query_key, query_name

__all__ = ["QueryBlock", "LevelPlan", "TopDownDesign", "Invariant", "OptimalSplit", "SplitChoice", "optimal_split",
           "chosen_shares", "totals_first_levels", "plan_topdown", "person_sensitivity"]

#: the 97.5% quantile of the standard normal: a 95% half-width is this many standard deviations
_Z95 = 1.959963984540054

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
    #: the strategy query's name as :func:`~sparsedp.topdown.workload.query_key` reads it
    #: (``"cells"``, ``"total"``, ``"residual:age"``; ``name`` says ``"cells | total"`` when an
    #: invariant pins part of the cells)
    query: str = ""


@dataclass(frozen=True, eq=False)
class LevelPlan:
    """The measurement of one level (``plan`` is ``None`` when the level gets no budget)."""

    depth: int
    name: str
    units: int
    budget: float
    blocks: tuple[QueryBlock, ...]
    plan: MeasurementPlan | None
    #: cells of its unit one person may be counted in (1: the cells partition the people)
    contributions: int = 1
    #: with ``contributions > 1``: the level's sensitivity to one person (``Delta_2``, or ``Delta_1``
    #: for Laplace, over its unweighted queries), which the scales are calibrated to
    person_sensitivity: float | None = None
    #: why the level is not measured when it carries no information (``None``: it is not skipped)
    skipped: str | None = None

    @property
    def label(self) -> str:
        k = f", {self.contributions} cells per person" if self.contributions > 1 else ""
        return f"topdown {self.name} ({', '.join(b.name for b in self.blocks)}{k})"

    @property
    def sensitivity(self) -> float:
        """What one person changes the level's measurement by (the plan's ``Delta`` for one cell)."""
        if self.person_sensitivity is not None:
            return self.person_sensitivity
        return float(self.plan.data_sensitivity) if self.plan is not None else 0.0

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
    split_choice: "SplitChoice | None" = None  # how the split was chosen, when split="optimal"
    contributions_per_person: int = 1  # cells of its unit one person may be counted in
    #: per level, whether its units' totals are rounded before their cells (the workload reads the
    #: level's totals and not its cells: the cells are then rounded to add up to those totals)
    totals_first: tuple[bool, ...] = ()

    @property
    def split(self) -> tuple[float, ...]:
        return tuple(lp.budget for lp in self.levels)

    @property
    def measured(self) -> tuple[LevelPlan, ...]:
        return tuple(lp for lp in self.levels if lp.plan is not None)

    @property
    def spent(self) -> float:
        """The budget the measured levels charge in total (the requested ``total``, up to the
        downward rounding of each share)."""
        return float(sum(lp.budget for lp in self.measured))

    def notices(self) -> list[str]:
        """One line per level that is not measured because it carries no information (its budget
        went to the other levels)."""
        return [f"level {lp.name!r} is not measured ({lp.skipped}); its budget goes to the other levels"
                for lp in self.levels if lp.skipped is not None]

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
        B2 = self.basis * self.basis
        return tuple(v @ B2 for v in self._component_variances())

    def total_variances(self) -> tuple[np.ndarray, ...]:
        """Per level, the exact ``(units,)`` variances of the GLS estimate of each unit's total (the
        sum of its cells: ``cells`` times the variance of the constant component), without any
        data."""
        h = self.hierarchy
        C = h.cells.size
        k = h.cells.component_attributes().index(())
        if not np.allclose(np.abs(self.basis[k]), 1.0 / np.sqrt(C)):  # pragma: no cover - the basis' first row
            raise SparseDPError("the basis has no constant component")
        return tuple(C * v[:, k] for v in self._component_variances())

    def _component_variances(self) -> tuple[np.ndarray, ...]:
        """Per level, the ``(units, components)`` variances of the GLS estimate (no data)."""
        from .gls import hierarchy_gls

        h = self.hierarchy
        C = h.cells.size
        pins = pinned_marginals(self)
        own, own_var = [], []
        for d in range(h.depth + 1):
            info = self.information(d) if self.levels[d].plan is not None else np.zeros(C)
            with np.errstate(divide="ignore"):
                v = np.broadcast_to(np.where(info > 0, 1.0 / info, np.inf), (h.sizes[d], C)).copy()
            v[:, pinned_components(h.cells, pins[d])] = 0.0
            own.append(np.zeros((h.sizes[d], C)))
            own_var.append(v)
        return tuple(hierarchy_gls(h, own, own_var).variance)

    def level_errors(self) -> tuple[float, ...]:
        """Per level, the expected mean absolute error per cell of the GLS estimate,
        ``sqrt(2 / pi) * mean_{units, cells} sqrt(Var)`` (the mean absolute value of a centred
        Gaussian of standard deviation ``s`` is ``s sqrt(2 / pi)``), from
        :meth:`gls_variances` -- no data.  The released counts are also made non-negative and
        integer, which changes the error (it lowers it where many true counts are 0)."""
        return tuple(float(np.sqrt(2.0 / np.pi) * np.sqrt(v).mean()) if v.size else 0.0
                     for v in self.gls_variances())

    def error_summary(self) -> list[dict[str, Any]]:
        """Per level, what a statistician reads first, from the design alone (no data): the root
        mean variance of the GLS estimate of a cell and of a unit's total as a standard deviation
        (``sd_cell``, ``sd_total``) and the 95% half-width ``1.96 sd`` (normal approximation), before
        non-negativity and rounding; ``skipped``: why a level is not measured (else ``None``)."""
        out = []
        for lp, vc, vt in zip(self.levels, self.gls_variances(), self.total_variances()):
            sc = float(np.sqrt(vc.mean())) if vc.size else 0.0
            st = float(np.sqrt(vt.mean())) if vt.size else 0.0
            out.append({"level": lp.name, "units": int(lp.units), "budget": lp.budget, "skipped": lp.skipped,
                        "sd_cell": sc, "half_width_cell": _Z95 * sc, "sd_total": st, "half_width_total": _Z95 * st})
        return out

    def exact_disclosures(self) -> list[dict[str, Any]]:
        """The invariants as what they are: true values published exactly, NOT under differential
        privacy (no noise, no charge), one record each -- ``what`` (``"state:total"``), the level
        and marginal, its ``units`` and ``cells`` (values per unit), ``values`` published (and their
        sums at every level above, which they determine)."""
        h = self.hierarchy
        out = []
        for d, ax in self.invariants:
            name = h.cells.marginal_name(ax)
            m = h.cells.marginal_size(ax)
            out.append({"what": f"{h.levels[d]}:{name}", "level": h.levels[d], "marginal": name,
                        "units": int(h.sizes[d]), "cells": int(m), "values": int(h.sizes[d]) * int(m),
                        "published": "exactly (the true values): not differentially private"})
        return out

    def describe(self) -> dict[str, Any]:
        cells = self.hierarchy.cells
        unit = "rho" if self.noise == "gaussian" else "epsilon"
        extra = {} if self.split_choice is None else {"split_choice": self.split_choice.describe()}
        return {**extra,
            "noise": self.noise, "secure": self.secure, unit: self.total, "spent": self.spent,
            "skipped": [{"level": lp.name, "reason": lp.skipped} for lp in self.levels if lp.skipped is not None],
            "levels": [{"level": lp.name, unit: lp.budget, "measured": lp.plan is not None,
                        "queries": {b.name: b.budget for b in lp.blocks},
                        "scales": ([float(lp.plan.scales[b.start]) for b in lp.blocks] if lp.plan is not None else [])}
                       for lp in self.levels],
            "invariants": [f"{self.hierarchy.levels[d]}:{cells.marginal_name(ax)}" for d, ax in self.invariants],
            "exact_disclosures": self.exact_disclosures(),
            "neighbours": ("add or remove one person (one cell of one leaf unit, hence of every level, by one)"
                           if self.contributions_per_person == 1 else
                           f"add or remove one person (up to {self.contributions_per_person} cells of one leaf unit, "
                           "hence of every level, by one each)"),
            "contributions_per_person": self.contributions_per_person,
            "totals_first": [lp.name for lp, t in zip(self.levels, self.totals_first) if t],
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


# -- a data-free split: minimise a level-weighted error of the GLS -------------------------------------

_OBJECTIVES = ("mae", "variance", "max")

#: how far past its cap a term may end (the optimiser's tolerance and the shares' rounding)
_CAP_SLACK = 1e-5
#: the cells of a level above the leaves that measures more than its cells get ``(1 - margin) cap``: their
#: released error rises about 0.2% more than the GLS model's (measured on the census table, 100
#: releases: the model's is the Gaussian mean absolute error of the exact variances, the released
#: counts are integers after non-negativity)
_MIXED_MARGIN = 0.002


@dataclass(frozen=True)
class OptimalSplit:
    """``split=OptimalSplit(...)`` (or ``split="optimal"``, the default of :func:`plan_topdown`):
    choose what each level measures and with how much of the budget -- the levels' shares and,
    within a level, its strategy queries' shares -- to minimise the error of a **workload** (the
    marginals users read at each level, with weights), computed exactly from the public design
    (the hierarchy's shape, the cells, the invariants' form; never the counts).

    With ``E_{l,S} = sqrt(2 / pi) * mean_{units of level l, cells of marginal S} sqrt(Var)`` (the
    expected mean absolute error of the GLS estimate of a cell of marginal ``S`` -- a cell, a
    unit's total -- at level ``l``), ``V_{l,S}`` the mean variance, ``w_{l,S} = w_l u_{l,S}`` (level
    weight times workload weight), and each term divided by the plain design's ``E0_{l,S}`` (the
    equal split measuring each level's cells) when ``relative`` (the default):

    * ``objective="mae"`` (default): minimise ``sum w_{l,S} E_{l,S} / E0_{l,S} / sum w``;
    * ``objective="variance"``: the same with ``V`` (and ``V0``);
    * ``objective="max"``: minimise ``max w_{l,S} E_{l,S} / E0_{l,S}`` (minimax; with the cells'
      workload, ``relative=False`` and ``w_l = 1 / t_l`` it makes the worst ratio of a level's
      error to its target ``t_l`` as small as possible, see :meth:`for_targets`).

    ``level_weights``: one weight per level (root first) or ``{level: weight}`` (missing levels 0);
    default 1 each: every *level* counts the same, however many units and cells it has, so the
    coarse levels are not sacrificed to the many leaves.  ``queries=False`` keeps the query shares
    within a level as given (``queries=`` of :func:`plan_topdown`) and optimises the levels'
    shares only.  The chosen fractions are rounded to ``decimals`` digits (they are then charged
    exactly as any split)."""

    level_weights: Any = None
    objective: str = "mae"
    queries: bool = True
    decimals: int = 6
    #: the errors the objective adds up: ``None`` (the ``workload`` given to :func:`plan_topdown`,
    #: by default every unit's cells and total) or a workload (:mod:`sparsedp.topdown.workload`)
    workload: Any = None
    #: each term relative to the plain design's (the equal split measuring each level's cells):
    #: ``E_{l,S} / E0_{l,S}``, so terms of different sizes (a cell, a total) weigh alike
    relative: bool = True
    #: no workload term worse than ``cap`` times the plain design's (``E_t <= cap E0_t``, a
    #: constraint of the ``"mae"`` and ``"variance"`` objectives) at a level without leaves, and
    #: ``0.998 cap`` for the cells of such a level that measures more than its cells (their
    #: released error rises about 0.2% more than the model says); ``None``: unconstrained
    #: (``leaf_cap`` too)
    cap: float | None = 1.0
    #: the same bound for the terms of a level with leaves (``None``: ``cap``).  The leaves'
    #: released cells are non-negative integers, which removes much of the GLS error of their many
    #: small counts, the more so as their totals are measured better.  1.012 was chosen on the
    #: published 2020 Census voting-district table (a public table, never the data of a release):
    #: there the leaves' released cells end 0.2% *below* the plain design's and the totals 13% below.
    #: Data with few small leaf counts gain less of it (up to 1.2% on the leaves' cells)
    leaf_cap: float | None = 1.012
    #: the candidate queries when ``queries`` is not given: ``"marginals"`` (the workload's, the
    #: cells, and the marginal on each residual :func:`sparsedp.optimize` selects: sparse rows, one
    #: per marginal cell) or ``"residual"`` (Gaussian: each residual with its own scale, the most
    #: general marginal strategy, dense over a unit's cells: more memory and planning time)
    family: str = "marginals"

    @classmethod
    def for_targets(cls, targets: Any) -> "OptimalSplit":
        """The minimax split for per-level error targets ``t_l`` (a list root first, or
        ``{level: target}``): minimise ``max_l E_l / t_l``."""
        items = targets.items() if isinstance(targets, Mapping) else enumerate(targets)
        inv: dict[Any, float] = {}
        for k, t in items:
            if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(float(t)) or float(t) <= 0:
                raise SparseDPError(f"error targets must be finite numbers > 0, got {t!r}")
            inv[k] = 1.0 / float(t)
        weights: Any = inv if isinstance(targets, Mapping) else [inv[i] for i in range(len(inv))]
        return cls(level_weights=weights, objective="max", workload={"cells": 1}, relative=False, cap=None)


@dataclass(frozen=True)
class SplitChoice:
    """What :func:`optimal_split` chose, and why: the fractions of the total budget per level
    (``level_shares``, root first) and per query of each level (``query_shares``: ``{query:
    fraction of the total}``), the objective and its weights, the objective's value (and at the
    start, ``equal_value``), per level the expected mean absolute error per cell of the GLS estimate
    (``predicted_mae``, from the exact variances of the planned design) next to the start's
    (``equal_mae``), and per workload term ``(level, marginal)`` its weight, its predicted error
    per marginal cell and the plain design's (``plain_term_mae``: the equal split measuring each
    level's cells)."""

    level_shares: tuple[float, ...]
    query_shares: tuple[dict[str, float], ...]
    level_weights: tuple[float, ...]
    objective: str
    value: float
    equal_value: float
    predicted_mae: tuple[float, ...]
    equal_mae: tuple[float, ...]
    evaluations: int
    terms: tuple[tuple[str, str], ...] = ()
    term_weights: tuple[float, ...] = ()
    predicted_term_mae: tuple[float, ...] = ()
    plain_term_mae: tuple[float, ...] = ()
    relative: bool = True
    #: ``(depth, why)`` of the levels that carry no information (:func:`uninformative_levels`)
    skipped: tuple[tuple[int, str], ...] = ()

    def describe(self) -> dict[str, Any]:
        return {"method": "optimal (data-free: exact GLS variances of the design)", "objective": self.objective,
                "relative_to_plain_design": self.relative,
                "level_weights": list(self.level_weights), "level_shares": list(self.level_shares),
                "query_shares": [dict(q) for q in self.query_shares], "value": self.value,
                "start_value": self.equal_value, "predicted_gls_mae": list(self.predicted_mae),
                "start_predicted_gls_mae": list(self.equal_mae),
                "workload": [{"level": lev, "marginal": m, "weight": w, "predicted_gls_mae": e, "plain_design_mae": p}
                             for (lev, m), w, e, p in zip(self.terms, self.term_weights, self.predicted_term_mae,
                                                          self.plain_term_mae)]}


def _optimal_spec(split: Any) -> OptimalSplit | None:
    """The optimiser's spec of a ``split`` argument: ``None`` (the default) and ``"optimal"`` give
    :class:`OptimalSplit` 's defaults; ``"equal"`` and weights give ``None``."""
    if split is None:
        return OptimalSplit()
    if isinstance(split, OptimalSplit):
        return split
    if isinstance(split, str):
        if split == "optimal":
            return OptimalSplit()
        if split == "equal":
            return None
        raise ShapeError(f"split must be weights per level, 'equal' or 'optimal', got {split!r}")
    return None


def _check_spec(h: Hierarchy, spec: OptimalSplit) -> np.ndarray:
    if spec.objective not in _OBJECTIVES:
        raise SparseDPError(f"objective must be one of {_OBJECTIVES}, got {spec.objective!r}")
    if isinstance(spec.decimals, (bool, np.bool_)) or not isinstance(spec.decimals, (int, np.integer)) \
            or not 2 <= int(spec.decimals) <= 12:
        raise SparseDPError(f"decimals must be an integer in [2, 12], got {spec.decimals!r}")
    if spec.cap is not None and (isinstance(spec.cap, (bool, np.bool_)) or not isinstance(
            spec.cap, (int, float, np.integer, np.floating)) or not np.isfinite(float(spec.cap)) or float(spec.cap) <= 0):
        raise SparseDPError(f"cap must be None or a finite number > 0, got {spec.cap!r}")
    if spec.leaf_cap is not None and (isinstance(spec.leaf_cap, (bool, np.bool_)) or not isinstance(
            spec.leaf_cap, (int, float, np.integer, np.floating)) or not np.isfinite(float(spec.leaf_cap))
            or float(spec.leaf_cap) <= 0):
        raise SparseDPError(f"leaf_cap must be None or a finite number > 0, got {spec.leaf_cap!r}")
    raw = _level_weights(h, spec.level_weights)
    w = []
    for x in raw:
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating, Fraction)) \
                or not np.isfinite(float(x)) or float(x) < 0:
            raise SparseDPError(f"level weights must be finite numbers >= 0, got {x!r}")
        w.append(float(x))
    if sum(w) <= 0:
        raise SparseDPError("the level weights add up to 0")
    return np.asarray(w)


class _LevelErrorModel:
    """The per-level errors of the hierarchy GLS as a function of the blocks' budget fractions
    ``x``.  A unit's information on component ``k`` at level ``d`` is ``sum_b c_bk g(u_b0) /
    g(u_b)``: ``c_bk`` and the noise unit scale ``u_b0`` are read from a reference plan (the equal
    split), the scale at budget ``beta`` is ``u_b = u_b0 (beta_b0 / beta)^(1/p)`` (Gaussian ``p = 2``:
    ``sigma = Delta / sqrt(2 rho)``; Laplace ``p = 1``: ``b = Delta / epsilon``), and ``g`` the
    noise's variance at unit scale (discrete or continuous, as the plan draws).  Exact for the mean:
    the components whose information and invariant status agree at every level have the same GLS
    variances, so the GLS runs on one column per such group (``O(units x groups)``; 2 groups for a
    total invariant), and the cells whose variance mixes the groups alike are evaluated once."""

    def __init__(self, ref: TopDownDesign, terms: Sequence[tuple[int, tuple[int, ...]]] = (),
                 h: Hierarchy | None = None) -> None:
        from ..noise import discrete_gaussian_variance

        h = ref.hierarchy if h is None else h  # the reference plan may be planned on a miniature of h
        C = h.cells.size
        comp = h.cells.component_attributes()
        self.h, self.total = h, float(ref.total)
        self.root = 2.0 if ref.noise == "gaussian" else 1.0
        if ref.noise == "laplace":
            self.g: Callable[[np.ndarray], np.ndarray] = (
                (lambda u: 2.0 * np.exp(-1.0 / u) / np.expm1(-1.0 / u) ** 2) if ref.secure else (lambda u: 2.0 * u * u))
        else:
            self.g = (lambda u: np.array([discrete_gaussian_variance(float(t)) for t in u])) if ref.secure else (
                lambda u: u * u)
        pins = pinned_marginals(ref)
        blocks, coef, u0, beta0 = [], [], [], []
        for lp in ref.levels:
            for b, var in zip(lp.blocks, lp.block_variances()):
                c = np.zeros(C)
                if b.components is not None:
                    c[list(b.components)] = 1.0 / var
                else:
                    c[[set(a) <= set(b.axes) for a in comp]] = (C / b.size) / float(var[0])
                blocks.append((lp.depth, b))
                coef.append(c)
                u0.append(float(lp.plan.unit_scales[b.start]) if lp.plan is not None else np.nan)
                beta0.append(float(b.budget))
        self.blocks = blocks
        self.level_of = np.array([d for d, _ in blocks], dtype=np.int64)
        self.u0, self.beta0 = np.array(u0), np.array(beta0)
        self.g0 = self.g(self.u0)
        coef_m = np.array(coef).reshape(len(blocks), C)
        pinned = np.array([pinned_components(h.cells, pins[d]) for d in range(h.depth + 1)])
        sig = np.concatenate([coef_m, pinned.astype(np.float64)], axis=0).T  # (C, blocks + levels)
        _, first, group = np.unique(sig, axis=0, return_index=True, return_inverse=True)
        group = np.asarray(group).reshape(-1)
        self.coef = coef_m[:, first]  # (blocks, groups)
        self.pinned = pinned[:, first]  # (levels, groups)
        self.C = C
        self.evaluations = 0
        self.classes = shape_classes(h)

        def grouped(axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
            M = np.zeros((len(first), h.cells.marginal_size(axes)))
            np.add.at(M, group, marginal_mix(h.cells, ref.basis, axes))  # M[g, m] = sum_{k in g} (Q B^T)[m, k]^2
            return np.unique(M, axis=1, return_counts=True)

        self.mix, self.mix_count = grouped(h.cells.axes("cells"))
        #: the workload's terms ``(level, marginal)`` and, per distinct marginal, its grouped mix
        self.terms = tuple((int(d), tuple(ax)) for d, ax in terms)
        self.term_mix = {ax: grouped(ax) for ax in {ax for _, ax in self.terms}}

    def errors(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per level, ``E_l`` (expected MAE per cell) and ``V_l`` (mean variance per cell); per
        workload term ``(l, S)``, ``E_{l,S}`` and ``V_{l,S}`` (per cell of the marginal)."""
        self.evaluations += 1
        h = self.h
        beta = np.maximum(x, 0.0) * self.total
        on = beta > 0
        ratio = np.zeros(beta.size)
        if on.any():
            u = self.u0[on] * (self.beta0[on] / beta[on]) ** (1.0 / self.root)
            ratio[on] = self.g0[on] / self.g(u)
        info_b = self.coef * ratio[:, None]
        own_var = []
        for d in range(h.depth + 1):
            info = info_b[self.level_of == d].sum(axis=0)
            with np.errstate(divide="ignore"):
                v = np.where(info > 0, 1.0 / np.where(info > 0, info, 1.0), np.inf)
            own_var.append(np.where(self.pinned[d], 0.0, v))
        var = class_variances(self.classes, own_var)  # per level, (contexts, groups)

        def mean_errors(vd: np.ndarray, wt: np.ndarray, mix: np.ndarray, count: np.ndarray) -> tuple[float, float]:
            cv = np.maximum(vd @ mix, 0.0)  # (contexts, distinct marginal cells)
            n = float(count.sum()) * float(wt.sum())
            return (float(np.sqrt(2.0 / np.pi) * ((wt @ np.sqrt(cv)) @ count) / n), float(((wt @ cv) @ count) / n))

        wts = [w_.astype(np.float64) for w_ in self.classes.weight]
        E, V = np.zeros(h.depth + 1), np.zeros(h.depth + 1)
        for d, vd in enumerate(var):
            E[d], V[d] = mean_errors(vd, wts[d], self.mix, self.mix_count)
        TE, TV = np.zeros(len(self.terms)), np.zeros(len(self.terms))
        for i, (d, ax) in enumerate(self.terms):
            TE[i], TV[i] = mean_errors(var[d], wts[d], *self.term_mix[ax])
        return E, V, TE, TV


def _minimise(model: _LevelErrorModel, P: np.ndarray, lower: np.ndarray, y0: np.ndarray, w: np.ndarray,
              objective: str, cap: np.ndarray | None = None) -> np.ndarray:
    """``argmin`` over ``y >= lower``, ``sum y = 1`` of the objective of ``x = P y`` (SLSQP, forward
    differences that stay inside the bounds); ``w``: per workload term, its weight (divided by the
    plain design's error when relative), applied to ``E_{l,S}`` (``V_{l,S}`` for ``"variance"``).
    ``cap``: per term, ``c_t`` with the constraint ``c_t E_t <= 1`` (``None``: none)."""
    from scipy.optimize import minimize

    keep = w > 0
    n = y0.size
    step = 1e-7
    cache: dict[bytes, np.ndarray] = {}

    def terms(y: np.ndarray) -> np.ndarray:  # every term's error, E (V for "variance")
        key = np.asarray(y, dtype=np.float64).tobytes()
        if key not in cache:
            ev = model.errors(P @ np.clip(y, lower, None))
            cache[key] = ev[3] if objective == "variance" else ev[2]
        return cache[key]

    def jac_terms(y: np.ndarray) -> np.ndarray:
        f0 = terms(y)
        J = np.empty((f0.size, n))
        for i in range(n):
            e = np.zeros(n)
            e[i] = step if y[i] + step <= 1.0 else -step
            J[:, i] = (terms(y + e) - f0) / e[i]
        return J

    def vec(y: np.ndarray) -> np.ndarray:  # the weighted workload terms
        return (w * terms(y))[keep]

    def jac_vec(y: np.ndarray) -> np.ndarray:
        return (w[:, None] * jac_terms(y))[keep]

    simplex = {"type": "eq", "fun": lambda y: np.array([y[:n].sum() - 1.0]),
               "jac": lambda y: np.r_[np.ones(n), np.zeros(y.size - n)][None, :]}
    if objective in ("mae", "variance"):
        sw = float(w.sum())
        cons: list[dict[str, Any]] = [simplex]
        if cap is not None:
            cons.append({"type": "ineq", "fun": lambda y: 1.0 - cap * terms(y),
                         "jac": lambda y: -cap[:, None] * jac_terms(y)})
        res = minimize(lambda y: float(vec(y).sum() / sw), y0, jac=lambda y: jac_vec(y).sum(axis=0) / sw,
                       method="SLSQP", bounds=list(zip(lower, np.ones(n))), constraints=cons,
                       options={"maxiter": 200, "ftol": 1e-10})
        return np.clip(res.x, lower, None)
    # minimax: minimise t subject to w_t E_t(y) <= t
    t0 = float(vec(y0).max())
    cons = [simplex, {"type": "ineq", "fun": lambda z: z[n] - vec(z[:n]),
                      "jac": lambda z: np.hstack([-jac_vec(z[:n]), np.ones((int(keep.sum()), 1))])}]
    res = minimize(lambda z: float(z[n]), np.r_[y0, t0], jac=lambda z: np.r_[np.zeros(n), 1.0], method="SLSQP",
                   bounds=list(zip(lower, np.ones(n))) + [(0.0, None)], constraints=cons,
                   options={"maxiter": 300, "ftol": 1e-12})
    return np.clip(res.x[:n], lower, None)


def _round_shares(x: np.ndarray, lower: np.ndarray, decimals: int) -> np.ndarray:
    """``x / sum x`` in whole units of ``10^-decimals`` that add up to exactly one (largest
    remainders), none below ``lower`` (rounded up)."""
    unit = 10 ** decimals
    t = np.maximum(x / x.sum(), lower) * unit
    k = np.floor(t).astype(np.int64)
    k = np.maximum(k, np.ceil(lower * unit - 1e-9).astype(np.int64))
    short = unit - int(k.sum())
    order = np.argsort(-(t - np.floor(t)), kind="stable")
    if short > 0:
        k[order[:short]] += 1
    elif short < 0:  # the floors were lifted: take back from the largest shares
        for i in np.argsort(-k, kind="stable")[:-short]:
            k[i] -= 1
    return k / unit


def optimal_split(h: Hierarchy, *, rho: float | None = None, epsilon: float | None = None, noise: str | None = None,
                  queries: Any = None, invariants: Sequence[Any] = (), secure: bool = True,
                  measure_invariants: bool | None = None, spec: OptimalSplit | str = "optimal",
                  contributions_per_person: int = 1, shape: Sequence[tuple[int, int]] | None = None,
                  workload: Any = None) -> SplitChoice:
    """The data-free design of :class:`OptimalSplit` ``spec`` for a release planned with these
    arguments (those of :func:`plan_topdown`).

    **Strategy.**  With ``queries`` given, those are each level's candidate queries.  With
    ``queries=None`` the candidates come from the workload (:mod:`sparsedp.topdown.workload`): the
    workload's marginals of every level, the cells at levels with leaves (whose cells must be
    determined), and for Gaussian noise the marginal on each residual that :func:`sparsedp.optimize`
    selects for the union of the workload's marginals on the cell domain (the residual family,
    ResidualPlanner's optimum under zCDP), started at its shares; ``spec.family="residual"``
    measures the residuals themselves (every residual a marginal of the workload sees; all of
    them at levels with leaves).  The optimisation below then sets every candidate's share,
    across levels and within them (0: not measured); with the default cap it starts from the
    plain design, which meets the cap.

    **Model.**  At level ``d`` a unit's information on basis component ``k`` (its inverse noise
    variance) is ``I_dk = sum_S c_Sk / Var_S(beta_S)`` over the level's queries ``S`` with budgets
    ``beta_S`` (Gaussian: ``sigma_S = Delta_S / sqrt(2 rho_S)``, variance ``~ sigma_S^2``; Laplace:
    ``b_S = Delta_S / epsilon_S``, variance ``~ 2 b_S^2``; the exact variance of the noise the plan
    draws, discrete or not), ``c_Sk`` read from a reference plan; invariant components are exact
    (variance 0).  The exact variances of the hierarchy GLS (Hay et al., VLDB 2010, generalised in
    :mod:`sparsedp.topdown.gls`) then give every workload term ``E_{l,S}`` (see
    :class:`OptimalSplit`), and SLSQP minimises the objective over the simplex of budget fractions
    (a leaf level keeps at least ``10^-3`` of the budget on each query; another level or query may
    get 0).  Nothing here reads counts: the design is a function of the hierarchy's shape, the
    cells, the workload and the invariants' form, so choosing it costs no privacy.  The optimum is
    a local one (the objective is smooth); the value at the start and the plain design's errors are
    reported next to it."""
    spec = _optimal_spec(spec) if isinstance(spec, str) else spec
    if not isinstance(spec, OptimalSplit):
        raise SparseDPError(f"spec must be 'optimal' or an OptimalSplit, got {spec!r}")
    lw = _check_spec(h, spec)
    D1 = h.depth + 1
    wl = parse_workload(h.cells, spec.workload if spec.workload is not None else workload, D1)
    kind = noise_kind(noise, rho, epsilon)
    common = dict(rho=rho, epsilon=epsilon, noise=noise, invariants=invariants, secure=secure,
                  measure_invariants=measure_invariants, contributions_per_person=contributions_per_person,
                  shape=list(shape) if shape is not None else real_shape(h))
    if spec.family not in ("marginals", "residual") or (spec.family == "residual" and kind == "laplace"):
        raise SparseDPError(f"family must be 'marginals' or (Gaussian noise) 'residual', got {spec.family!r}")
    start = queries if queries is not None else _candidate_queries(h, wl, kind, spec.family)
    mini = miniature(h)  # the reference plans need one unit per kind of unit: plan them small
    ref = plan_topdown(mini, split="equal", queries=start, **common)
    pins = pinned_marginals(ref)  # the reference plan parsed the invariants (its levels are h's)
    # a marginal the invariants publish exactly at a level has no error there, and a level without
    # information (a twin of the next) has its twin's errors: neither is a term
    live = [(d, ax, u * lw[d]) for d in range(D1) for ax, u in wl[d]
            if u * lw[d] > 0 and not _inside(ax, pins[d]) and ref.levels[d].skipped is None]
    if not live:
        raise SparseDPError("nothing to measure: the invariants publish every marginal of the workload exactly")
    terms = [(d, ax) for d, ax, _ in live]
    tw = np.array([w_ for _, _, w_ in live])
    model = _LevelErrorModel(ref, terms, h)
    nb = len(model.blocks)
    if nb == 0:  # pragma: no cover - plan_topdown refuses a design that measures nothing at its leaves
        raise SparseDPError("nothing is measured")
    plain = _LevelErrorModel(plan_topdown(mini, split="equal", queries=None, **common), terms, h)
    _, _, PE, PV = plain.errors(np.array([b.budget for _, b in plain.blocks]) / float(ref.total))
    scale0 = PV if spec.objective == "variance" else PE
    scale = scale0 if spec.relative else np.ones(len(terms))
    w = tw / np.where(scale > 0, scale, 1.0)
    x_ref = np.array([b.budget for _, b in model.blocks]) / float(ref.total)
    has_leaf = np.array([bool(h.leaves(d).any()) for d in range(D1)])
    if spec.queries:
        P = np.eye(nb)
        y0 = x_ref / x_ref.sum()
        # the leaves' cells stay determined: every query that measures components (residuals, the
        # cells but what is pinned) or the cells at a level with leaves keeps 10^-3 of the budget
        needed = np.array([b.components is not None or b.axes == h.cells.axes("cells") for _, b in model.blocks])
        lower = np.where(has_leaf[model.level_of] & needed, 1e-3, 0.0)
    else:
        levels = sorted(set(model.level_of.tolist()))
        P = np.zeros((nb, len(levels)))
        for j, d in enumerate(levels):
            sel = model.level_of == d
            P[sel, j] = x_ref[sel] / x_ref[sel].sum()
        y0 = np.array([x_ref[model.level_of == d].sum() for d in levels])
        y0 = y0 / y0.sum()
        lower = np.array([1e-3 if has_leaf[d] else 0.0 for d in levels])
    capped = spec.cap is not None and spec.objective != "max"
    cap = 1.0 / (_term_caps(spec, [has_leaf[d] for d, _ in terms]) * np.where(scale0 > 0, scale0, 1.0)) \
        if capped else None
    if capped and spec.queries:  # start from the plain design (at a cap of 1), when the candidates can say it
        xp = _plain_point(model, plain, h)
        if xp is not None and np.allclose(model.errors(xp)[2], PE, rtol=1e-9, atol=0):
            y0 = np.maximum(xp, lower) / np.maximum(xp, lower).sum()
    ev0 = model.errors(P @ y0)
    y = _minimise(model, P, lower, y0, w, spec.objective, cap)
    if cap is not None:  # a level above the leaves whose cells now share its budget: its cells get the margin
        mixed = _mixed_levels(model, P @ y, h, has_leaf)
        tight = np.array([d in mixed and ax == h.cells.axes("cells") for d, ax in terms])
        if tight.any():
            cap = cap * np.where(tight, 1.0 / (1.0 - _MIXED_MARGIN), 1.0)
            y = _minimise(model, P, lower, y, w, spec.objective, cap)
    x = _round_shares(P @ y, P @ lower, int(spec.decimals))

    def value(ev: tuple[np.ndarray, ...]) -> float:
        t = w * (ev[3] if spec.objective == "variance" else ev[2])
        return float(np.max(t[w > 0])) if spec.objective == "max" else float(np.sum(t) / tw.sum())

    def excess(ev: tuple[np.ndarray, ...]) -> float:  # how far past the cap the worst term is
        return 0.0 if cap is None else max(0.0, float(np.max(cap * (ev[3] if spec.objective == "variance" else ev[2])))
                                           - 1.0 - _CAP_SLACK)

    ev1 = model.errors(x)
    if (excess(ev1), value(ev1)) > (excess(ev0), value(ev0)):  # the start was better (a tolerance): keep it
        x = _round_shares(P @ y0, P @ lower, int(spec.decimals))
    level = np.zeros(D1)
    np.add.at(level, model.level_of, x)
    qs: list[dict[str, float]] = [{} for _ in range(D1)]
    for (d, b), xb in zip(model.blocks, x):
        qs[d][b.query or h.cells.marginal_name(b.axes)] = float(xb)
    evf = model.errors(x)
    names = tuple((h.levels[d], h.cells.marginal_name(ax)) for d, ax in terms)
    return SplitChoice(tuple(float(v) for v in level), tuple(qs), tuple(float(v) for v in lw), spec.objective,
                       value(evf), value(ev0), tuple(float(e) for e in evf[0]), tuple(float(e) for e in ev0[0]),
                       model.evaluations, names, tuple(float(v) for v in tw), tuple(float(e) for e in evf[2]),
                       tuple(float(e) for e in PE), spec.relative,
                       tuple((lp.depth, lp.skipped) for lp in ref.levels if lp.skipped is not None))


def _mixed_levels(model: _LevelErrorModel, x: np.ndarray, h: Hierarchy, has_leaf: np.ndarray) -> set[int]:
    """The levels without leaves where the shares ``x`` measure something besides the cells (at
    least ``10^-4`` of the level's share on other queries)."""
    all_ax = h.cells.axes("cells")
    other = np.zeros(h.depth + 1)
    level = np.zeros(h.depth + 1)
    for (d, b), xb in zip(model.blocks, x):
        level[d] += xb
        if b.axes != all_ax:  # a marginal coarser than the cells, or a residual
            other[d] += xb
    return {d for d in range(h.depth + 1) if not has_leaf[d] and other[d] > 1e-4 * max(level[d], 1e-300)}


def _term_caps(spec: OptimalSplit, leafy: Sequence[bool]) -> np.ndarray:
    """Per workload term, its cap (:class:`OptimalSplit` ``cap``, ``leaf_cap`` at a level with leaves)."""
    leaf = spec.cap if spec.leaf_cap is None else spec.leaf_cap
    return np.array([float(leaf if lf else spec.cap) for lf in leafy])  # type: ignore[arg-type]


def _plain_point(model: _LevelErrorModel, plain: _LevelErrorModel, h: Hierarchy) -> np.ndarray | None:
    """The plain design (the equal split measuring each level's cells) in the model's block shares
    -- a residual block gets its level's share times its part of the cells' components, a cells
    block the whole share -- or ``None`` when the model's candidates cannot say it."""
    comp = h.cells.component_attributes()
    share = {d: b.budget for d, b in plain.blocks}
    total = sum(share.values())
    x = np.zeros(len(model.blocks))
    for i, (d, b) in enumerate(model.blocks):
        if d not in share:
            continue
        pb = [pb_ for dd, pb_ in plain.blocks if dd == d][0]
        measured = len(pb.components) if pb.components is not None else len(comp)
        if b.components is not None and b.query.startswith("residual:"):
            x[i] = share[d] / total * len(b.components) / measured
        elif b.axes == pb.axes and b.components == pb.components:  # the plain level's own query
            x[i] = share[d] / total
    return x if x.sum() > 0 else None


def real_shape(h: Hierarchy) -> list[tuple[int, int]]:
    """``(units, leaf units)`` per level of ``h`` (what :func:`uninformative_levels` reads)."""
    return [(int(h.sizes[d]), int(h.leaves(d).sum())) for d in range(h.depth + 1)]


def miniature(h: Hierarchy) -> Hierarchy:
    """A hierarchy with ``h``'s levels and cells and at most two units per level: one with
    children (above the deepest level) and one leaf where ``h`` has leaves.  Every plan of a level
    is the same per unit whatever the number of units, so a design planned on it (with
    ``shape=real_shape(h)``) has ``h``'s queries, scales and budgets at a fraction of the cost."""
    D = h.depth
    parents, codes = [np.array([-1], dtype=np.int64)], [np.asarray(h.codes[0], dtype=object)]
    for d in range(1, D + 1):
        n = (1 if d < D else 0) + (1 if d == D or bool(h.leaves(d).any()) else 0)
        parents.append(np.zeros(n, dtype=np.int64))
        codes.append(np.array([f"m{i}" for i in range(n)], dtype=object))
    return Hierarchy(tuple(h.levels), tuple(parents), tuple(codes), h.cells)


def _candidate_queries(h: Hierarchy, wl: Sequence[Sequence[tuple[tuple[int, ...], float]]],
                       noise: str, family: str) -> list[dict[Any, float]]:
    """Per level, the candidate strategy queries and their starting weights (:func:`optimal_split`):
    ``family="marginals"``: the workload's marginals, the cells at levels with leaves, and (Gaussian)
    the marginal on each residual :func:`sparsedp.optimize` selects for the workload, started at its
    shares; ``"residual"`` (Gaussian): the residuals themselves."""
    cells = h.cells
    D1 = h.depth + 1
    read = sorted({ax for lev in wl for ax, u in lev if u > 0}, key=lambda a: (len(a), a))
    all_ax = cells.axes("cells")
    if noise == "laplace":
        return [{ax: 1.0 for ax in (read + ([all_ax] if h.leaves(d).any() and all_ax not in read else []))}
                for d in range(D1)]
    start = _residual_start(cells, wl)
    if family == "marginals":
        cand = sorted(set(read) | set(start), key=lambda a: (len(a), a))
        return [{ax: max(start.get(ax, 0.0), 1e-3) for ax in
                 cand + ([all_ax] if h.leaves(d).any() and all_ax not in cand else [])} for d in range(D1)]
    groups = sorted(set(cells.component_attributes()), key=lambda a: (len(a), a))
    seen = [A for A in groups if any(set(A) <= set(S) for S in read)]
    return [{Residual(A): max(start.get(A, 0.0), 1e-3) for A in (groups if h.leaves(d).any() else seen)}
            for d in range(D1)]


def _residual_start(cells: CellDomain, wl: Sequence[Sequence[tuple[tuple[int, ...], float]]]) -> dict[tuple[int, ...], float]:
    """``{residual: share}``: the budget shares :func:`sparsedp.optimize` (the residual family,
    zCDP) gives the union of the workload's marginals on the cell domain (each marginal's weight
    its largest over the levels), normalised to add up to one."""
    from ..marginals import Domain
    from ..marginals.workload import marginal_workload
    from ..optimize import optimize

    weight: dict[tuple[int, ...], float] = {}
    for lev in wl:
        for ax, u in lev:
            if u > 0:
                weight[ax] = max(weight.get(ax, 0.0), float(u))
    dom = Domain(cells.names, cells.sizes)
    ms = sorted(weight, key=lambda a: (len(a), a))
    res = optimize(marginal_workload(dom, [list(m) for m in ms], weights=[weight[m] for m in ms]),
                   noise="gaussian", family="residual", rho=1.0)
    sel = res.strategy
    shares = np.asarray(sel.p, dtype=np.float64) / (2.0 * np.asarray(sel.sigma2, dtype=np.float64))
    shares = shares / shares.sum()
    return {tuple(A): float(f) for A, f in zip(sel.residuals, shares)}


def _marginal_matrix(cells: CellDomain, axes: tuple[int, ...]) -> sp.csr_matrix:
    C = cells.size
    m = cells.marginal_size(axes)
    return sp.csr_matrix((np.ones(C), (cells.cell_to_marginal(axes), np.arange(C))), shape=(m, C))


def _root_up(x: float) -> float:
    """``sqrt(x)`` rounded up (certified)."""
    return float(certified_sqrt(np.array([float(x)]))[0])


def person_sensitivity(cells: CellDomain, block: QueryBlock, per_cell: float, k: int, noise: str) -> float:
    """What one person counted in up to ``k`` cells of their unit (each by one) changes one query
    of the unit by, in the norm of the noise (``Delta_2`` Gaussian, ``Delta_1`` Laplace);
    ``per_cell``: the query's sensitivity to one cell.  A marginal whose cells each sum ``N``
    cells: ``Delta_1 = k``, and ``Delta_2 = sqrt(q N^2 + r^2)`` (``k = q N + r``: the ``k`` cells
    packed into as few marginal cells as they fill -- ``k`` for a total, ``sqrt(k)`` for the
    cells' histogram).  Orthonormal component rows: the largest norm over every set of at most
    ``k`` cells when there are at most ``_EXACT_SETS`` such sets (rounded up by a relative
    ``2^-40``), else the bounds ``Delta_2 <= min(sqrt(k), k per_cell)``, ``Delta_1 <= min(k
    per_cell, sqrt(rows k))`` (triangle and Cauchy-Schwarz inequalities).  ``k = 1`` gives
    ``per_cell``."""
    kk = min(int(k), cells.size)
    if kk == 1:
        return float(per_cell)
    if block.components is None:
        if noise == "laplace":
            return float(kk)
        q, r = divmod(kk, cells.size // block.size)
        n = cells.size // block.size
        return _root_up(q * n * n + r * r)
    exact = _largest_set_norm(cells.basis()[list(block.components)], kk, 1 if noise == "laplace" else 2)
    if exact is not None:
        return exact
    if noise == "laplace":
        return min(kk * float(per_cell), _root_up(len(block.components) * kk))
    return min(kk * float(per_cell), _root_up(kk))


#: most sets of cells :func:`person_sensitivity` enumerates for the exact norm of component rows
_EXACT_SETS = 20000


def _largest_set_norm(rows: np.ndarray, k: int, p: int) -> float | None:
    """``max ||rows @ e||_p`` over the 0/1 vectors ``e`` with at most ``k`` ones (``None``: too many
    sets to enumerate), rounded up by a relative ``2^-40`` over the float sums."""
    from itertools import combinations
    from math import comb

    C = rows.shape[1]
    if sum(comb(C, j) for j in range(1, k + 1)) > _EXACT_SETS:
        return None
    best = 0.0
    for j in range(1, k + 1):
        sets = np.array(list(combinations(range(C), j)), dtype=np.int64)
        moved = rows[:, sets].sum(axis=2)  # (rows, sets): what each set changes
        norms = np.abs(moved).sum(axis=0) if p == 1 else np.sqrt((moved * moved).sum(axis=0))
        best = max(best, float(norms.max()))
    return best * (1.0 + 2.0**-40)


def _block_components(cells: CellDomain, key: Any, pinned: Marginals | None) -> tuple[int, ...] | None:
    """The basis components a strategy query measures directly (``None``: a marginal, measured as
    its sums): a residual's components (those whose contrast set is its ``axes``), or the cells'
    components that the ``pinned`` invariant marginals (the level's, :func:`pinned_marginals`) do
    not determine."""
    comp = cells.component_attributes()
    if isinstance(key, Residual):
        return tuple(k for k, a in enumerate(comp) if a == key.axes)
    if pinned and tuple(key) == cells.axes("cells"):
        return tuple(int(k) for k in np.flatnonzero(~pinned_components(cells, pinned)))
    return None


def _plan_level(h: Hierarchy, d: int, budget: float, queries: list[tuple[tuple[int, ...], Any]], noise: str,
                secure: bool, pinned: Marginals | None, contributions: int = 1) -> LevelPlan:
    """The plan of level ``d``.  ``pinned``: the invariant marginals at this level
    (:func:`pinned_marginals`) when their components are not to be measured (the cells query then
    measures the other components only).
    ``contributions``: cells of a unit one person may be counted in; above 1 every query's scale
    is calibrated to :func:`person_sensitivity` within its share of the level's budget."""
    cells = h.cells
    n, C = h.sizes[d], cells.size
    if budget == 0:
        blocks = tuple(QueryBlock(key_axes(ax), query_name(cells, ax), 0.0, 0, len(_comps)
                                  if (_comps := _block_components(cells, ax, None)) is not None
                                  else cells.marginal_size(ax), _comps, query_name(cells, ax)) for ax, _ in queries)
        return LevelPlan(d, h.levels[d], n, 0.0, blocks, None)
    budgets = _shares([w for _, w in queries], budget_fraction(budget), f"level {h.levels[d]!r} query")
    blocks, start = [], 0
    for (ax, _), b in zip(queries, budgets):
        if b == 0:
            continue
        comps = _block_components(cells, ax, pinned)
        if comps is not None and not comps:  # the invariant publishes every cell: nothing to measure
            continue
        axes = key_axes(ax)
        m = len(comps) if comps is not None else cells.marginal_size(axes)
        name = (query_name(cells, ax) if comps is None or isinstance(ax, Residual)
                else f"cells | {' & '.join(cells.marginal_name(p) for p in pinned or ())}")
        blocks.append(QueryBlock(axes, name, b, start, m, comps, query_name(cells, ax)))
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
    if len(blocks) == 1 and blocks[0].components is None and blocks[0].axes == cells.axes("cells"):
        A: Any = sp.identity(n * C, format="csr")
    else:
        A = rows[0] if len(rows) == 1 else sp.vstack(rows, format="csr")
    if weighted:  # diag(w) H with H integer: exact noise on the integer rows (the plan's integer form)
        A = scale_rows(SparseOperator(A, name=f"topdown {h.levels[d]} rows"), np.concatenate(weights))
    if contributions > 1:  # each query within its share for a person in k cells: the level within its budget
        person = [person_sensitivity(cells, b, s_, contributions, noise) for b, s_ in zip(blocks, sens)]
        scales = np.concatenate([
            np.full(n * b.size, (laplace_scale(p_, b.budget) if noise == "laplace" else gaussian_sigma(p_, b.budget))
                    * _WIDEN) for b, p_ in zip(blocks, person)])
        plan = plan_measurement(A, **{key: level_budget_f}, scales=scales, noise=noise, secure=secure)
        level_sens = float(sum(person)) if noise == "laplace" else _root_up(sum(p_ * p_ for p_ in person))
        return LevelPlan(d, h.levels[d], n, level_budget_f, tuple(blocks), plan, int(contributions), level_sens)
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
                 secure: bool = True, measure_invariants: bool | None = None,
                 contributions_per_person: int = 1, shape: Sequence[tuple[int, int]] | None = None,
                 workload: Any = None) -> TopDownDesign:
    """Plan a release (nothing is measured or charged): ``rho`` (zCDP, discrete Gaussian noise) or
    ``epsilon`` (pure DP, discrete Laplace noise) in total; ``split``: ``None`` (the default) or
    ``"optimal"`` / an :class:`OptimalSplit`: each level's strategy queries and the budget shares
    of the levels and queries that minimise the error of the ``workload``, chosen from the public
    design only (:func:`optimal_split`; recorded in ``design.split_choice``); or the levels'
    weights (a list, one per level, or ``{level: weight}``; ``"equal"``: equal), each level's budget
    its share of the total (rounded down); ``queries``: what each level may measure, ``None`` (with
    the optimiser: chosen from the workload; with given weights: the cells' full histogram),
    ``{query: weight}`` / a list of queries (marginals, or residuals ``"residual:age"``: see
    :mod:`sparsedp.topdown.workload`) for every level, or a list of those per level;
    ``workload``: what the release is for, per level ``{marginal: weight}`` (default every unit's
    cells and total, equally weighted; :mod:`sparsedp.topdown.workload`), read by the optimiser;
    ``invariants``: ``"level:marginal"`` strings or :class:`Invariant` s (checked here for form;
    their values are taken or checked when the data are read); ``measure_invariants``: whether the
    cells query also measures what the invariants publish exactly (default: not for Gaussian noise,
    where the histogram's other components then cost ``1 - m / cells`` of it for an invariant
    marginal of ``m`` cells; yes for Laplace, whose contrasts would cost more in L1);
    ``contributions_per_person``: how many cells of their unit one person may be counted in (1:
    the cells partition the people; more for overlapping count columns: every query's noise is
    then calibrated to such a person, :func:`person_sensitivity`, within the same budget);
    ``shape``: ``(units, leaf units)`` per level of the real hierarchy when ``h`` is a skeleton of
    it (the chunked path), for :func:`uninformative_levels`.

    A level that carries no information (:func:`uninformative_levels`) is not measured and its
    weight goes to the other levels, so the whole budget is spent (``design.spent``);
    ``design.notices()`` names it."""
    k = check_contributions(contributions_per_person)
    noise = noise_kind(noise, rho, epsilon)
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
    choice = None
    opt = _optimal_spec(split)
    if opt is not None:
        choice = optimal_split(h, rho=rho, epsilon=epsilon, noise=noise, queries=queries, invariants=invariants,
                               secure=secure, measure_invariants=measure_invariants, spec=opt,
                               contributions_per_person=k, shape=shape, workload=workload)
        split, queries = chosen_shares(h, choice, queries)
    elif isinstance(split, str):  # "equal"
        split = None
    inv = []
    for spec in invariants:
        iv = Invariant.parse(spec)
        inv.append((h.level_index(iv.level), h.cells.axes(iv.marginal)))
    pins = _pinned_marginals(h, inv)
    qs = _informative_queries(h, parse_queries(h.cells, queries, h.depth + 1), pins)
    given = _level_weights(h, split)
    # the optimiser's reference plan found the levels without information; a zero share it chose
    # on purpose is not one
    skipped = (dict(choice.skipped) if choice is not None else
               uninformative_levels(h, qs, pins, shape, [not _is_zero(w) for w in given]))
    weights = [0 if d in skipped else w for d, w in enumerate(given)]
    if len(skipped) == h.depth + 1:
        raise SparseDPError("no level carries information (" + "; ".join(
            f"{h.levels[d]}: {why}" for d, why in skipped.items()) + "): there is nothing to measure")
    if all(_is_zero(w) for w in weights):
        raise InvalidPrivacyParameterError(
            "split: the levels with a budget carry no information (" + "; ".join(
                f"{h.levels[d]}: {why}" for d, why in skipped.items()) + "): give a weight to another level")
    budgets = _shares(weights, budget_fraction(total), "split")
    for d in range(h.depth + 1):
        if h.leaves(d).any() and budgets[d] == 0 and d not in skipped:
            raise SparseDPError(f"level {h.levels[d]!r} has leaves but no budget: their counts would be undetermined")
    skip = (noise == "gaussian") if measure_invariants is None else not bool(measure_invariants)
    levels = tuple(replace(_plan_level(h, d, budgets[d], qs[d], noise, bool(secure), pins[d] if skip else None, k),
                           skipped=skipped.get(d)) for d in range(h.depth + 1))
    design = TopDownDesign(h, noise, bool(secure), total, levels, tuple(inv), h.cells.basis(), choice, k,
                           totals_first_levels(h, workload if opt is None or opt.workload is None else opt.workload)
                           if choice is not None else ())
    _check_identifiable(design)
    _check_crossed_fallback(design)
    return design


def chosen_shares(h: Hierarchy, choice: SplitChoice, queries: Any = None) -> tuple[list[float], list[dict[Any, float]]]:
    """``(split, queries)``: the explicit level weights and per-level query weights that plan what
    ``choice`` (:func:`optimal_split`) chose -- e.g. on a skeleton of the hierarchy it was chosen
    for (the chunked release) -- with ``queries`` (those given to :func:`optimal_split`) for a
    level the choice leaves empty."""
    given = parse_queries(h.cells, queries, h.depth + 1)
    return (list(choice.level_shares),
            [{query_key(h.cells, m): f for m, f in q.items()} if q else {ax: w for ax, w in given[d]}
             for d, q in enumerate(choice.query_shares)])


def totals_first_levels(h: Hierarchy, workload: Any) -> tuple[bool, ...]:
    """Per level, whether the workload reads its totals (weight > 0) and not its cells (weight 0):
    the release then rounds each unit's total before its cells (:func:`~sparsedp.topdown.release.round_level`),
    so the accuracy the design bought for the totals survives the rounding."""
    wl = parse_workload(h.cells, workload, h.depth + 1)
    all_ax = h.cells.axes("cells")
    return tuple(any(ax == () and u > 0 for ax, u in lev) and not any(ax == all_ax and u > 0 for ax, u in lev)
                 for lev in wl)


def noise_kind(noise: str | None, rho: float | None, epsilon: float | None) -> str:
    """The noise a release draws: ``noise`` when given, else discrete Laplace for an ``epsilon``
    alone and discrete Gaussian otherwise (checked by :func:`plan_topdown`)."""
    if noise is not None:
        return noise
    return "laplace" if epsilon is not None and rho is None else "gaussian"


def _is_zero(w: Any) -> bool:
    try:
        return float(w) == 0.0
    except (TypeError, ValueError):
        return False  # not a number: _shares refuses it with a clear message


def _informative_queries(h: Hierarchy, qs: list[list[tuple[tuple[int, ...], Any]]],
                         pins: Sequence[Marginals]) -> list[list[tuple[tuple[int, ...], Any]]]:
    """Per level, its queries without those the level's invariants determine (a marginal inside a
    pinned one: measuring it would spend budget on values published exactly); the level's budget
    is then shared among the others."""
    return [[(ax, w) for ax, w in q if not _inside(key_axes(ax), pins[d])] for d, q in enumerate(qs)]


def uninformative_levels(h: Hierarchy, qs: Sequence[Sequence[tuple[tuple[int, ...], Any]]],
                         pins: Sequence[Marginals],
                         shape: Sequence[tuple[int, int]] | None = None,
                         weighted: Sequence[bool] | None = None) -> dict[int, str]:
    """The levels that carry no information, ``{depth: why}``, from the public design only (the
    hierarchy's shape, the queries, the invariants' form; never the counts): a level whose every
    query the invariants determine (``qs``: the queries left by :func:`_informative_queries`), and
    one of two levels with the same units (every unit of the upper one has exactly one child, e.g.
    a first geography column with a single unit under the root) -- the upper one when it has no
    invariant of its own that the lower one lacks and the lower one measures its queries, else
    the lower one when it has no leaves and the upper one measures its queries.  Such a level is
    not measured and its budget goes to the others.  ``shape``: ``(units, leaf units)`` per level
    (default: ``h``'s); every unit of a level has exactly one child when the level has no leaves
    and as many units as the next.  ``weighted``: per level, whether the split gives it a budget
    (default: all); of two levels with the same units, one is skipped only for a twin that has one."""
    if shape is None:
        shape = real_shape(h)
    if len(shape) != h.depth + 1:
        raise ShapeError(f"shape has {len(shape)} levels, the hierarchy {h.depth + 1}")
    out: dict[int, str] = {}
    for d in range(h.depth + 1):
        if not qs[d]:
            what = "every cell" if h.cells.axes("cells") in pins[d] else "every query it would measure"
            out[d] = f"the invariants determine {what}"
    for d in range(h.depth):
        if d in out or d + 1 in out or shape[d][1] or shape[d][0] != shape[d + 1][0]:
            continue
        upper = {ax for ax, _ in qs[d]}
        lower = {ax for ax, _ in qs[d + 1]}
        if pins[d] == pins[d + 1] and upper <= lower and (weighted is None or weighted[d + 1]):
            out[d] = f"its units equal those of {h.levels[d + 1]!r}, which is measured"
        elif (not shape[d + 1][1] and (weighted is None or weighted[d])
              and {ax for ax in lower if not _inside(key_axes(ax), pins[d])} <= upper):
            out[d + 1] = f"its units equal those of {h.levels[d]!r}, which is measured"
    return dict(sorted(out.items()))


#: the invariant marginals pinned at one level: their axes, none inside another (an antichain)
Marginals = tuple[tuple[int, ...], ...]


def pinned_marginals(design: TopDownDesign) -> list[Marginals]:
    """Per level, the invariant marginals that hold there and are inside no other one that does
    (invariants hold at their level and every level above it): ``()`` where none does, one
    marginal for nested invariants (``total`` inside ``age``: ``((age,),)``), several for crossed
    ones (``age`` and ``race``: neither contains the other, both pinned).  A component of the cells' basis (a contrast on the attributes ``a``)
    is then exact iff ``a`` is inside one of them (:func:`pinned_components`)."""
    return _pinned_marginals(design.hierarchy, design.invariants)


def _pinned_marginals(h: Hierarchy, invariants: Sequence[tuple[int, tuple[int, ...]]]) -> list[Marginals]:
    out: list[Marginals] = []
    for d in range(h.depth + 1):
        found = {tuple(ax) for dd, ax in invariants if dd >= d}
        out.append(tuple(sorted(ax for ax in found if not any(set(ax) < set(b) for b in found))))
    return out


def _inside(axes: Sequence[int], marginals: Marginals | None) -> bool:
    """Whether the marginal on ``axes`` is inside one of ``marginals`` (determined by them)."""
    return any(set(axes) <= set(m) for m in marginals or ())


def pinned_components(cells: CellDomain, marginals: Marginals | None) -> np.ndarray:
    """Per component of the cells' basis, whether the invariant ``marginals`` determine it: its
    contrast set is inside one of them (the residual basis: the marginal on ``S`` is a function of
    exactly the components on subsets of ``S``)."""
    return np.array([_inside(a, marginals) for a in cells.component_attributes()], dtype=bool)


def _check_crossed_fallback(design: TopDownDesign) -> None:
    """Below a level with crossed invariants, the rounding may have to change a parent's cells (its
    children's invariants fit no integer table under them: :mod:`sparsedp.topdown.crossed`); the
    parent then becomes the sum of its children, and so does every ancestor, whose pinned marginals
    -- all the root's -- must not move.  The true table is such a choice when every marginal pinned
    at the root is also pinned at the parent's level; otherwise (an invariant only above the
    parent's level, finer than the ones there: ``nation:cells`` with ``county:age`` and
    ``county:race``) no change may exist, and the design is refused here, before any charge."""
    h = design.hierarchy
    pins = pinned_marginals(design)
    for d in range(2, h.depth + 1):
        if len(pins[d]) < 2:
            continue
        loose = [ax for ax in pins[0] if not _inside(ax, pins[d - 1])]
        if loose:
            from ..errors import UnsupportedStructureError

            names = ", ".join(repr(h.cells.marginal_name(ax)) for ax in loose)
            raise UnsupportedStructureError(
                f"crossed invariants meet at level {h.levels[d]!r}, and {names} is pinned above level {h.levels[d - 1]!r} "
                "but not at it: the rounding could not keep it if it had to change a parent there; pin it at "
                f"{h.levels[d - 1]!r} too (or drop it)")


def _check_identifiable(design: TopDownDesign) -> None:
    """Every leaf's components must be measured at its level or pinned by an invariant."""
    h = design.hierarchy
    pins = pinned_marginals(design)
    for d in range(h.depth + 1):
        if not h.leaves(d).any():
            continue
        info = design.information(d)
        pinned = pinned_components(h.cells, pins[d])
        if np.any((info == 0) & ~pinned):
            raise SparseDPError(f"level {h.levels[d]!r} has leaves and its queries do not determine every cell: "
                                "measure the cells there (queries including 'cells')")
