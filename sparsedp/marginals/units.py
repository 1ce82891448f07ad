"""Marginals of a table that protect a privacy unit (a customer, a person) with many rows.

The records are truncated per unit (:func:`~sparsedp.privacy_unit.truncate`: secret random
priorities, stable): a unit keeps at most ``max_rows`` rows, or its ``max_groups`` cells of the
*full* domain (one cell = one combination of every attribute's value) with ``max_rows_per_group``
rows in each.  One unit then changes the full-domain histogram ``x`` by ``d >= 0`` with ``||d||_1
<= L = unit.l1_bound()``.

**The calibration.**  Both marginal releases are calibrated to one record, which changes ``x`` by
one unit vector ``e`` and every marginal table ``t_S = M_S x`` by one cell:

* ResidualPlanner (zCDP, :func:`~sparsedp.marginals.release_marginals`) measures ``Q_A M_A x``
  with Gaussian noise ``sigma_A``; its loss for a change ``d`` is ``sum_A ||Q_A M_A d||^2 / (2
  sigma_A^2)``.  ``d`` is the sum of at most ``L`` records' unit vectors, so by the triangle
  inequality ``||Q_A M_A d|| <= L max_e ||Q_A M_A e||`` and the loss is at most ``L^2`` times one
  record's.  A marginal *sums* cells, so a unit's ``g`` distinct cells can fall into one cell of a
  marginal (``||M d||_2 = ||d||_1``): even with ``max_groups`` the factor is ``L^2``, not
  ``l2_bound()^2``.  The release is run at ``rho / L^2``.
* Weighted marginals (pure DP, :func:`~sparsedp.marginals.release_marginals_laplace`) add Laplace
  noise ``b_S`` to every table: the loss for ``d`` is ``sum_S ||M_S d||_1 / b_S <= ||d||_1 sum_S
  1 / b_S``, ``L`` times one record's: run at ``epsilon / L``.

Both bounds are reached (``L`` rows in one cell), and the grid rounding of the exact sampler is
inside the per-record certificate, so ``L`` (``L^2``) times it bounds the unit's loss.  The ledger
entry charges the per-unit budget, records the unit and a sensitivity ``L`` times one record's.

``max_rows="auto"`` spends ``unit.auto_share`` of the budget on a DP quantile of the rows per unit
(:func:`sparsedp.contribution_bound.resolve_unit`) -- only after every check, the accountant's
room for the whole budget included -- and the release gets the rest; the choice's ledger entry
comes first in :meth:`to_release`.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..privacy import Accountant, LedgerEntry, PrivacyCost, sequential
from ..privacy_unit import PrivacyUnit, declared, scaled_up, truncate, warn_if_id_like
from .domain import Domain

__all__ = ["UnitPlan", "declared_unit", "prepare_unit", "unit_entry", "unit_loss", "unit_record", "unit_ids_from"]


def declared_unit(privacy_unit: Any, drop_missing_units: Any) -> PrivacyUnit | None:
    """The declared unit (``None``: one row), checked before anything is read or charged
    (:func:`sparsedp.privacy_unit.declared`)."""
    return declared(privacy_unit, drop_missing_units)


def unit_ids_from(records: Any, unit_ids: Any, unit: PrivacyUnit | None, n: int) -> Any:
    """Every record's unit id: ``unit_ids`` if given, else the unit's column of a DataFrame of
    records; a table with an identifier-like column and no declared unit draws an
    :class:`~sparsedp.privacy_unit.IdColumnWarning`."""
    columns = list(records.columns) if hasattr(records, "columns") and hasattr(records, "iloc") else []
    if unit is None:
        if unit_ids is not None:
            raise SparseDPError("unit_ids= goes with a declared privacy_unit")
        warn_if_id_like(columns, None)
        return None
    if unit_ids is None:
        if unit.column not in columns:
            raise SparseDPError(f"privacy unit {unit.column!r} declared but the records have no such column: give "
                                "a DataFrame with it, or every record's id with unit_ids=")
        unit_ids = records[unit.column].to_numpy()
    ids = np.asarray(unit_ids)
    if ids.ndim != 1 or ids.shape[0] != n:
        raise SparseDPError(f"unit_ids must give one id per record ({n}), got shape {ids.shape}")
    return ids


def _groups(X: np.ndarray, domain: Domain, unit: PrivacyUnit) -> np.ndarray | None:
    """The full-domain cell of every record (the groups of ``max_groups``), as a code per row."""
    if not unit.grouped:
        return None
    if math.prod(domain.sizes) < 2**62:
        return np.ravel_multi_index(tuple(np.asarray(X, dtype=np.int64).T), domain.sizes) if X.shape[0] else \
            np.zeros(0, dtype=np.int64)
    return np.unique(X, axis=0, return_inverse=True)[1].ravel()


@dataclasses.dataclass(frozen=True)
class UnitPlan:
    """What a marginal release with a privacy unit runs: the kept records, the concrete unit, the
    private choice of its bound (already charged; ``None`` unless auto) and the budget per unit
    left for the release."""

    X: np.ndarray
    unit: PrivacyUnit
    choice: Any
    budget: float

    @property
    def factor(self) -> int:
        """``L``: how many records' changes one unit's change is at most (module doc)."""
        return self.unit.l1_bound()


def prepare_unit(X: np.ndarray, domain: Domain, ids: Any, unit: PrivacyUnit, *, noise: str, budget: float,
                 accountant: Accountant | None, rng: Any, drop_missing: bool) -> UnitPlan:
    """Truncate the records per unit (module doc).  The ids are checked first (missing ids refused
    unless ``drop_missing``) by a truncation that keeps every row; a ``max_rows="auto"`` unit is
    then chosen -- after checking that ``accountant`` holds the whole ``budget`` -- and charged."""
    _check_row_budget(unit, noise, budget)
    probe = PrivacyUnit(unit.column, max_rows=2**62, max_groups=unit.max_groups,
                        max_rows_per_group=unit.max_rows_per_group)
    groups = _groups(X, domain, unit)
    truncate(ids, probe, groups, rng=np.random.default_rng(0), drop_missing=drop_missing)  # checks only
    choice, rest = None, float(budget)
    if unit.is_auto:
        from ..contribution_bound import resolve_unit

        if accountant is not None:
            accountant.check(PrivacyCost(epsilon=budget) if noise == "laplace" else PrivacyCost(rho=budget))
        kw = {"epsilon": budget} if noise == "laplace" else {"rho": budget}
        unit, choice, rest = resolve_unit(unit, ids, accountant=accountant, rng=rng, drop_missing=drop_missing, **kw)
    from ..noise import SecureRandomBits

    # priorities: a seeded generator's (reproducible, not private), else the secure generator's
    keep = truncate(ids, unit, groups, rng=None if isinstance(rng, SecureRandomBits) else rng,
                    drop_missing=drop_missing)
    return UnitPlan(np.asarray(X)[keep], unit, choice, rest)


def _check_row_budget(unit: PrivacyUnit, noise: str, budget: float) -> None:
    """Refuse, before any charge, a per-record budget (at the largest bound ``auto`` can choose)
    below what the noise allows."""
    from ..validation import check_epsilon, check_rho

    if unit.is_auto:
        from ..contribution_bound import candidate_bounds

        rest = float(budget) * (1.0 - float(unit.auto_share))
        unit = PrivacyUnit(unit.column, max_rows=int(candidate_bounds()[-1]), max_groups=unit.max_groups,
                           max_rows_per_group=unit.max_rows_per_group)
    else:
        rest = float(budget)
    row = unit.row_budget(noise, rest)
    (check_epsilon if noise == "laplace" else check_rho)(row, f"the budget per row ({unit})")


def unit_loss(total: Fraction, unit: PrivacyUnit | None, noise: str) -> float:
    """The certified per-unit loss of a release whose per-record certificate is ``total``:
    ``L`` (Laplace) or ``L^2`` (zCDP) times it (module doc)."""
    if unit is None:
        return float(total)
    L = unit.l1_bound()
    return scaled_up(total, L if noise == "laplace" else L * L)


def unit_entry(entry: LedgerEntry, unit: PrivacyUnit | None) -> LedgerEntry:
    """The release's ledger entry with the unit: its sensitivity ``L`` times one record's (what one
    unit moves the measurement by at most) and the unit's name; unchanged without a unit."""
    if unit is None:
        return entry
    sens = None if entry.sensitivity is None else scaled_up(Fraction(entry.sensitivity), unit.l1_bound())
    return dataclasses.replace(entry, sensitivity=sens, privacy_unit=unit.label)


def unit_record(desc: dict, entry: LedgerEntry, unit: PrivacyUnit | None, choice: Any, key: str
                ) -> tuple[dict, list[LedgerEntry]]:
    """``(description, ledger)`` of a marginal release: the unit (``{"privacy_unit": "one row"}``
    without one), the bound's choice first in the ledger and under ``privacy_unit_bound``, the
    budget ``key`` (``"rho"`` / ``"epsilon"``) the total of the ledger, the neighbours."""
    out = dict(desc)
    ledger = [entry]
    out["privacy_unit"] = unit.describe() if unit is not None else {"privacy_unit": "one row"}
    if unit is not None:
        out["neighbours"] = (f"add or remove one {unit.column} with all of their rows (after truncation at most "
                             f"{unit.l1_bound()}, in any cells)")
    if choice is not None:
        ledger = [choice.measurement.entry, entry]
        out["privacy_unit_bound"] = choice.describe()
        total = sequential(*(e.cost for e in ledger))
        out[key] = total.epsilon if key == "epsilon" else total.rho
    return out, ledger
