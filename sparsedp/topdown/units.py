"""TopDown releases that protect a privacy unit (a person, a household) with many records.

Records with a declared :class:`~sparsedp.privacy_unit.PrivacyUnit` are truncated per unit
(:meth:`~sparsedp.topdown.hierarchy.HierarchicalTable.from_records`): after it, one unit changes
the leaf x cell counts by a vector ``d >= 0`` of integers with ``||d||_1 <= L = unit.l1_bound()``
(``max_rows``, or ``min(max_rows, max_groups max_rows_per_group)``), its records possibly spread
over several cells **and several leaves**.

**The calibration.**  Every level ``i`` of a TopDown release measures ``A_i G_i d`` (``G_i`` adds
the leaves into the level's units), calibrated so that one record -- which moves exactly one cell
of the level by one, or nothing -- costs at most the level's budget ``b_i`` (Laplace: ``sum_r
|(A_i e)_r| / s_r <= b_i``; zCDP: ``||S^-1 A_i e||_2^2 / 2 <= b_i``).  A unit's change is the sum of
its ``L`` (or fewer) records' changes ``e_1 + ... + e_L``, so by the triangle inequality its loss
at level ``i`` is at most ``L b_i`` (Laplace) and, since ``||S^-1 A_i (e_1 + ... + e_L)||_2 <= L
sqrt(2 b_i)``, at most ``L^2 b_i`` (zCDP).  Both bounds are reached: ``L`` records in one leaf cell
move every level by ``L`` times one record.  The release is therefore planned at the per-record
budget ``epsilon / L`` (``rho / L^2``: :meth:`~sparsedp.privacy_unit.PrivacyUnit.row_budget`),
which is exactly a calibration of every level to ``L`` times its one-record sensitivity, and each
level is charged ``L b_i`` (``L^2 b_i``) per unit, recorded in the ledger with the unit.

The cells-per-person rule (``contributions_per_person=K``, for overlapping count columns) is
*not* this: it assumes one person counted in ``K`` **distinct** cells of **one** leaf unit, and
bounds a histogram's ``Delta_2`` by ``sqrt(K)`` and its ``Delta_1`` by ``min(K, cells)``.  A unit
of ``K`` records may put all of them in one cell (``Delta_2 = K``), more than ``cells`` of them in a
leaf, or spread them over leaves that merge into one cell of the level above (``Delta_2 = K``
there again); ``tests/test_topdown.py`` shows the loss exceeding the charge under that rule.

With ``max_groups`` / ``max_rows_per_group`` and Gaussian noise, a leaf level's cells histogram
alone would allow ``Delta_2 = unit.l2_bound() < L`` (distinct groups are distinct leaf cells), but
every level above merges leaves, where a unit's ``g`` groups can fall into one cell; ``L`` is used
at every level (valid, and tight above the leaves).
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any, Callable

from ..errors import SparseDPError
from ..privacy import LedgerEntry, PrivacyCost, sequential
from ..privacy_unit import PrivacyUnit, scaled_up
from ..validation import budget_fraction
from .design import noise_kind

__all__ = ["declared_unit", "per_record_budget", "plan_for_unit", "design_unit_charge", "level_costs", "unit_cost", "unit_entry",
           "unit_description", "resolve_records_unit", "with_bound_choice", "read_unit_ids", "probe_unit",
           "read_records"]


def declared_unit(unit: Any) -> PrivacyUnit | None:
    """The table's unit when one is declared (``None``: each record is its own unit)."""
    if unit is None or (isinstance(unit, PrivacyUnit) and unit.is_row):
        return None
    if not isinstance(unit, PrivacyUnit) or unit.is_auto:
        raise SparseDPError("a TopDown release needs a PrivacyUnit with concrete bounds")
    return unit


def _factor(unit: PrivacyUnit, noise: str) -> int:
    """What one unit's loss is at most, in multiples of one record's: ``L`` (Laplace), ``L^2`` (zCDP)."""
    L = unit.l1_bound()
    return L if noise == "laplace" else L * L


def per_record_budget(unit: PrivacyUnit, noise: str, budget: float) -> float:
    """The budget a row-level TopDown design is planned with so that one unit costs at most
    ``budget``: ``epsilon / L`` or ``rho / L^2`` (module doc), rounded down."""
    return unit.row_budget(noise, float(budget), disjoint_columns=False)


def plan_for_unit(plan: Callable[[float | None, float | None], Any], unit: PrivacyUnit, rho: float | None,
                  epsilon: float | None, noise: str | None) -> Any:
    """A design whose per-unit cost fits ``rho`` / ``epsilon``: ``plan(rho, epsilon)`` (a
    :func:`~sparsedp.topdown.design.plan_topdown` call) at the per-record budget
    (:func:`per_record_budget`), lowered by a float step while the levels' costs, each rounded up
    when made per unit, would add up to more than the budget.  A budget the planner refuses is
    passed on as given (its error names it)."""
    kind = noise_kind(noise, rho, epsilon)
    budget = epsilon if kind == "laplace" else rho
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not math.isfinite(budget) or budget <= 0:
        return plan(rho, epsilon)
    row = per_record_budget(unit, kind, budget)
    for _ in range(64):
        design = plan(*((None, row) if kind == "laplace" else (row, None)))
        if design_unit_charge(design, unit) <= budget_fraction(budget):
            return design
        row = math.nextafter(row, 0.0)
    raise SparseDPError("cannot fit the per-unit cost in the budget")  # pragma: no cover - a float step suffices


def design_unit_charge(design: Any, unit: PrivacyUnit) -> Fraction:
    """What an :class:`~sparsedp.privacy.Accountant` charges one unit for the design, exactly: the
    sum of each measured level's per-unit cost as the number it reads (a float sum of the costs
    can round above it)."""
    return sum((budget_fraction(c.epsilon if design.noise == "laplace" else c.rho) for c in level_costs(design, unit)),
               Fraction(0))


def level_costs(design: Any, unit: PrivacyUnit | None) -> list[PrivacyCost]:
    """What each measured level of ``design`` charges, in order: its plan's cost, made per unit
    (:func:`unit_cost`) when ``unit`` is given."""
    return [lp.plan.cost if unit is None else unit_cost(lp.plan.cost, unit, design.noise) for lp in design.measured]


def unit_cost(cost: PrivacyCost, unit: PrivacyUnit, noise: str) -> PrivacyCost:
    """A per-record cost made per unit (module doc): ``L`` times an epsilon, ``L^2`` times a rho."""
    f = _factor(unit, noise)
    if cost.epsilon:
        return PrivacyCost(epsilon=scaled_up(cost.epsilon, f))
    return PrivacyCost(rho=scaled_up(cost.rho, f))


def unit_entry(entry: LedgerEntry, unit: PrivacyUnit) -> LedgerEntry:
    """A level's ledger entry made per unit: its cost (:func:`unit_cost`), its sensitivity ``L``
    times one record's (what one unit moves the level's measurement by), and the unit."""
    name = unit.label
    return dataclasses.replace(entry, cost=unit_cost(entry.cost, unit, entry.noise or "gaussian"),
                               sensitivity=None if entry.sensitivity is None else
                               scaled_up(float(entry.sensitivity), unit.l1_bound()),
                               privacy_unit=name)


def unit_description(desc: dict[str, Any], unit: PrivacyUnit, noise: str, charged: float) -> dict[str, Any]:
    """The release description of a per-unit release: the budget per unit (what was charged),
    the levels' and queries' budgets per unit, the per-record budget the design was planned at,
    the neighbours and the unit (its bounds)."""
    key = "epsilon" if noise == "laplace" else "rho"
    f = _factor(unit, noise)
    out = dict(desc)
    out["per_record_" + key] = desc.get(key)
    out[key] = charged
    if "spent" in desc:  # what the measured levels charge, per unit (the levels' sum)
        out["spent"] = charged
    out["levels"] = [{**lv, key: scaled_up(lv[key], f), "queries": {q: scaled_up(b, f) for q, b in lv["queries"].items()}}
                     for lv in desc.get("levels", [])]
    out["neighbours"] = (f"add or remove one {unit.column} with all of their records (after truncation at most "
                         f"{unit.l1_bound()}, in any leaf units and cells)")
    out["privacy_unit"] = unit.describe()
    return out


def resolve_records_unit(unit: PrivacyUnit, ids: Any, *, rho: float | None = None, epsilon: float | None = None,
                         accountant: Any = None, rng: Any = None, drop_missing: bool = False
                         ) -> tuple[PrivacyUnit, Any, float | None, float | None]:
    """``(unit, choice, rho, epsilon)`` for a TopDown release of records: a unit with
    ``max_rows="auto"`` spends ``unit.auto_share`` of the budget on a DP quantile of the rows per
    unit (``ids``: every record's unit id; charged to ``accountant``,
    :func:`sparsedp.contribution_bound.resolve_unit`) and the release gets the rest; any other unit
    keeps the whole budget (``choice`` is then ``None``).  Give the release
    :func:`with_bound_choice` afterwards so that its ledger and description show the choice."""
    from ..contribution_bound import resolve_unit

    if (rho is None) == (epsilon is None):
        raise SparseDPError("give the release's budget: rho (zCDP) or epsilon (pure DP)")
    if not isinstance(unit, PrivacyUnit):
        raise SparseDPError(f"privacy_unit must be a PrivacyUnit, got {type(unit).__name__}")
    if not unit.is_auto:
        return unit, None, rho, epsilon
    concrete, choice, rest = resolve_unit(unit, ids, rho=rho, epsilon=epsilon, accountant=accountant, rng=rng,
                                          drop_missing=drop_missing)
    return (concrete, choice, rest, None) if rho is not None else (concrete, choice, None, rest)


def with_bound_choice(release: Any, choice: Any) -> Any:
    """The TopDown release with the private choice of its contribution bound (a
    :class:`~sparsedp.contribution_bound.BoundChoice`, or ``None``: unchanged) first in its ledger,
    the budget in its description the total of both, and ``description["privacy_unit_bound"]``."""
    if choice is None:
        return release
    entry = choice.measurement.entry
    if entry is None:  # pragma: no cover - measure always records one
        raise SparseDPError("the bound's measurement has no ledger entry")
    key = "epsilon" if release.noise == "laplace" else "rho"
    desc = dict(release.description)
    desc["privacy_unit_bound"] = choice.describe()
    total = sequential(entry.cost, *(e.cost for e in release.ledger))
    desc[key] = total.epsilon if key == "epsilon" else total.rho
    return dataclasses.replace(release, ledger=(entry, *release.ledger), description=desc)


def read_unit_ids(path: Any, column: str) -> Any:
    """Every record's unit id from a CSV or Parquet file (an empty id is missing), to choose
    ``max_rows="auto"`` from."""
    from pathlib import Path

    import pandas as pd

    p = Path(path)
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(p, columns=[column])[column].to_numpy()
        return pd.read_csv(p, usecols=[column], dtype=str, keep_default_na=False, na_values=[""])[column].to_numpy()
    except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
        raise SparseDPError(f"cannot read the privacy unit's column {column!r} of {p}: {exc}") from exc


def probe_unit(unit: PrivacyUnit) -> PrivacyUnit:
    """A concrete stand-in for a ``max_rows="auto"`` unit that keeps every record: reading the
    records with it checks them (columns, domain, geography, ids) before the choice is charged."""
    return PrivacyUnit(unit.column, max_rows=2**62, max_groups=unit.max_groups,
                       max_rows_per_group=unit.max_rows_per_group)


def read_records(path: Any, geo: Any, categories: Any, *, domain: Any, units: Any, root: str = "root",
                 privacy_unit: PrivacyUnit | None = None, drop_missing_units: bool = False, rng: Any = None,
                 rho: float | None = None, epsilon: float | None = None, accountant: Any = None
                 ) -> tuple[Any, Any, float | None, float | None]:
    """``(table, bound choice, rho, epsilon)``: a records file read into a
    :class:`~sparsedp.topdown.hierarchy.HierarchicalTable` (:func:`~sparsedp.topdown.hierarchy.read_table`)
    for a release of budget ``rho`` / ``epsilon``.  ``units``: a DataFrame or a CSV file of every
    unit's geography codes, or ``"observed"``.  A ``max_rows="auto"`` unit is chosen only after the
    records were read and checked with every record kept (so bad input costs nothing), charged
    to ``accountant``; the records are then read again and truncated at the chosen bound, and the
    release gets the budget left (give it :func:`with_bound_choice` afterwards)."""
    from pathlib import Path

    import pandas as pd

    from .hierarchy import read_table

    if isinstance(units, (str, Path)) and str(units) != "observed":
        try:
            units = pd.read_csv(units, dtype=str, keep_default_na=False, na_values=[""])
        except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
            raise SparseDPError(f"cannot read the units table {units}: {exc}") from exc
    unit = privacy_unit if privacy_unit is not None else PrivacyUnit()

    def read(u: PrivacyUnit) -> Any:
        return read_table(path, geo, categories=categories, domain=domain, units=units, root=root, privacy_unit=u,
                          drop_missing_units=drop_missing_units, rng=rng)

    table = read(probe_unit(unit) if unit.is_auto else unit)
    if not unit.is_auto:
        return table, None, rho, epsilon
    del table  # every check made: now the choice is charged, and the records truncated at it
    unit, choice, rho, epsilon = resolve_records_unit(unit, read_unit_ids(path, unit.column), rho=rho,
                                                      epsilon=epsilon, accountant=accountant, rng=rng,
                                                      drop_missing=drop_missing_units)
    return read(unit), choice, rho, epsilon
