"""Choosing a privacy unit's contribution bound from the data, privately.

A bound ``k`` on the rows per unit trades noise for bias: the noise of a release grows like ``k``
(the sensitivity is ``k`` times one row's), while truncation drops ``sum_u max(c_u - k, 0)`` of
the ``c_u`` rows of unit ``u``.  :func:`choose_max_rows` spends a stated share of the budget on a
differentially private quantile of the rows per unit and returns it as the bound
(``max_rows="auto"`` on the record paths).

**Mechanism.**  Each unit's row count ``c_u`` falls in one bucket of a public geometric grid of
candidate bounds ``t_0 < t_1 < ... < t_B`` (``round(2^(i/4))`` up to ``max_bound``; counts above
it in the last bucket): bucket ``b`` counts the units with ``t_{b-1} < c_u <= t_b``.  Adding or
removing one unit changes one bucket by one, so the bucket histogram has ``Delta_1 = Delta_2 =
1`` and is measured through the one measurement path (:func:`sparsedp.measure.measure`, exact
noise, charged to the accountant).  The bound is post-processing of that noisy histogram ``h~``:
the smallest ``t_b`` with ``sum_{i <= b} h~_i >= q sum_i h~_i``.  The noisy histogram also
estimates, with no further charge, how many rows each candidate keeps
(:meth:`BoundChoice.rows_kept`): ``sum_b h~_b min(t_b, k)``.

Nothing else is computed from the data: the number of units, the largest contribution and the
rows dropped are never returned.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SparseDPError
from .measure import Measurement, measure
from .privacy import Accountant, PrivacyCost

__all__ = ["BoundChoice", "UnreliableBoundWarning", "candidate_bounds", "choose_max_rows", "resolve_unit"]


class UnreliableBoundWarning(UserWarning):
    """The private quantile was computed from too few units for its noise (:func:`choose_max_rows`)."""


def candidate_bounds(max_bound: int = 2**16, per_octave: int = 4) -> np.ndarray:
    """The public grid of candidate bounds: ``round(2^(i / per_octave))``, distinct, from 1 to
    ``max_bound`` (``max_bound`` itself last)."""
    if not isinstance(max_bound, (int, np.integer)) or isinstance(max_bound, bool) or max_bound < 1:
        raise SparseDPError(f"max_bound must be a positive integer, got {max_bound!r}")
    top = int(np.ceil(np.log2(max_bound) * per_octave))
    grid = np.unique(np.round(np.exp2(np.arange(top + 1) / per_octave)).astype(np.int64))
    grid = grid[grid < max_bound]
    return np.append(grid, np.int64(max_bound))


@dataclass(frozen=True)
class BoundChoice:
    """A contribution bound chosen privately (module doc)."""

    bound: int  # the chosen max_rows
    quantile: float  # the quantile of rows per unit it estimates
    candidates: np.ndarray  # the public grid t_0 < ... < t_B
    noisy_units: np.ndarray  # the noisy bucket histogram h~ (units per bucket, noisy)
    measurement: Measurement  # the charged measurement h~ came from
    cost: PrivacyCost

    def rows_kept(self, bounds: Any) -> np.ndarray:
        """Estimated rows kept at each bound ``k`` (post-processing of ``h~``, no charge):
        ``sum_b max(h~_b, 0) min(t_b, k)``, with ``t_b`` the bucket's upper edge (an over-estimate
        of the rows of the units in it)."""
        k = np.atleast_1d(np.asarray(bounds, dtype=np.float64))
        h = np.clip(self.noisy_units, 0.0, None)
        return (h[None, :] * np.minimum(self.candidates[None, :], k[:, None])).sum(axis=1)

    def describe(self) -> dict[str, Any]:
        """What a release description records of the choice."""
        spent = {"epsilon": self.cost.epsilon} if self.cost.epsilon else {"rho": self.cost.rho}
        return {"max_rows": int(self.bound), "chosen_by": f"DP {self.quantile:g}-quantile of rows per unit",
                "spent": spent}


def choose_max_rows(
    units: Any,
    *,
    quantile: float = 0.95,
    epsilon: float | None = None,
    rho: float | None = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    max_bound: int = 2**16,
    drop_missing: bool = False,
    rows_per_unit: Any = None,
) -> BoundChoice:
    """A private ``quantile`` of the rows per unit as ``max_rows`` (module doc).

    ``units``: the unit id of every row.  The budget (``epsilon``: exact discrete Laplace;
    ``rho``: exact discrete Gaussian) is what this choice spends -- a small share of the release's
    budget -- and is charged to ``accountant``.  Rows without an id raise unless
    ``drop_missing``.  ``rows_per_unit`` (instead of ``units``, which is then ignored): the number of
    rows of every unit, counted where the records are (e.g. on workers after a shuffle by unit)."""
    if not 0.0 < float(quantile) < 1.0:
        raise SparseDPError(f"quantile must lie in (0, 1), got {quantile!r}")
    if (epsilon is None) == (rho is None):
        raise SparseDPError("give the budget of the choice: epsilon (Laplace) or rho (Gaussian)")
    from .privacy_unit import _codes  # the unit ids' codes, missing ids handled as truncate does

    if rows_per_unit is not None:
        per_unit = np.asarray(rows_per_unit, dtype=np.int64)
    else:
        codes, _ = _codes(np.asarray(units), "the privacy unit column", drop_missing)
        per_unit = np.bincount(codes) if codes.size else np.zeros(0, dtype=np.int64)
    grid = candidate_bounds(max_bound)
    buckets = np.minimum(np.searchsorted(grid, per_unit, side="left"), grid.size - 1)
    hist = np.bincount(buckets, minlength=grid.size).astype(np.float64)
    kw: dict[str, Any] = {"epsilon": epsilon} if epsilon is not None else {"rho": rho, "noise": "gaussian"}
    meas = measure(np.eye(grid.size), hist, accountant=accountant, rng=rng, label="privacy unit: bound (DP quantile)",
                   **kw)
    noisy = np.asarray(meas.y, dtype=np.float64)
    cdf = np.cumsum(noisy)
    noise_sd = float(np.sqrt(np.max(meas.variances) * grid.size))  # of the noisy number of units
    if cdf[-1] < 20.0 * noise_sd:  # post-processing of the noisy total: says nothing more about the data
        warnings.warn(f"the private {quantile:g}-quantile of rows per unit is unreliable here: the noisy number of "
                      f"units is below 20 times its noise ({noise_sd:.3g}); give max_rows yourself or raise the "
                      "share of the budget (auto_share)", UnreliableBoundWarning, stacklevel=2)
    target = float(quantile) * cdf[-1]
    at = int(np.argmax(cdf >= target)) if np.any(cdf >= target) else grid.size - 1
    return BoundChoice(bound=int(grid[at]), quantile=float(quantile), candidates=grid, noisy_units=noisy,
                       measurement=meas, cost=meas.cost)


def resolve_unit(
    unit: Any,
    units: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    drop_missing: bool = False,
    rows_per_unit: Any = None,
) -> tuple[Any, BoundChoice | None, float]:
    """``(concrete unit, choice, budget left for the release)``.  A unit with ``max_rows="auto"``
    spends ``unit.auto_share`` of the budget (``epsilon`` or ``rho``) on :func:`choose_max_rows`
    and gets the chosen bound; any other unit is returned as is with the whole budget.
    ``rows_per_unit``: as in :func:`choose_max_rows`."""
    from .privacy_unit import PrivacyUnit

    if not isinstance(unit, PrivacyUnit):
        raise SparseDPError(f"unit must be a PrivacyUnit, got {type(unit).__name__}")
    budget = epsilon if epsilon is not None else rho
    if budget is None:
        raise SparseDPError("give the release's budget: epsilon or rho")
    if not unit.is_auto:
        return unit, None, float(budget)
    share = float(budget) * unit.auto_share
    choice = choose_max_rows(units, quantile=unit.auto_quantile, accountant=accountant, rng=rng,
                             drop_missing=drop_missing, rows_per_unit=rows_per_unit,
                             **({"epsilon": share} if epsilon is not None else {"rho": share}))
    concrete = PrivacyUnit(unit.column, max_rows=choice.bound, max_groups=unit.max_groups,
                           max_rows_per_group=unit.max_rows_per_group)
    return concrete, choice, _rest(float(budget), share)


def _rest(budget: float, spent: float) -> float:
    """The largest float ``r <= budget - spent`` with ``spent + r <= budget`` exactly (so an
    accountant holding ``budget`` takes both charges)."""
    from fractions import Fraction

    r = budget - spent
    while Fraction(spent) + Fraction(r) > Fraction(budget):
        r = math.nextafter(r, 0.0)
    return r
