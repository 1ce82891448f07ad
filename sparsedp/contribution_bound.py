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
the smallest ``t_b`` with ``sum_{i <= b} h~_i >= q sum_i h~_i``; or, with ``quantile="error"``,
the candidate ``k`` that minimises the estimated mean absolute error per cell of a release of
``cells`` counts, ``E|beta + z|`` for a cell whose truncation bias is the mean bias ``beta(k) =
sum_b h~_b max(r_b - k, 0) / cells`` over the buckets whose noisy count stands above the noise
(truncation only lowers counts, so the mean absolute bias per
cell is exactly the rows dropped over the cells; ``r_b`` the middle of bucket ``b``) and whose noise
``z`` has sensitivity ``k`` under the release's budget: ``beta + s e^{-beta/s}`` for Laplace of
scale ``s = k / epsilon``, ``beta (1 - 2 Phi(-beta/s)) + 2 s phi(beta/s)`` for Gaussian of
``s = k / sqrt(2 rho)``.  The noisy histogram also
estimates, with no further charge, how many rows each candidate keeps
(:meth:`BoundChoice.rows_kept`): ``sum_b h~_b min(t_b, k)``.

Nothing else is computed from the data: the number of units, the largest contribution and the
rows dropped are never returned.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SparseDPError
from .measure import Measurement, measure
from .privacy import Accountant, PrivacyCost

__all__ = ["BoundChoice", "candidate_bounds", "choose_max_rows", "resolve_unit"]


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
    quantile: float | str  # the quantile of rows per unit it estimates, or "error"
    candidates: np.ndarray  # the public grid t_0 < ... < t_B
    noisy_units: np.ndarray  # the noisy bucket histogram h~ (units per bucket, noisy)
    measurement: Measurement  # the charged measurement h~ came from
    cost: PrivacyCost

    def _significant_units(self) -> np.ndarray:
        """``h~`` with the buckets whose noisy count could be noise alone set to 0: below ``t`` with
        ``P(max_b |z_b| > t) <= 5%`` (Laplace ``t = b ln(B / 0.05)``; Gaussian ``t = sigma
        sqrt(2 ln(2 B / 0.05))``).  An empty bucket of large candidates would otherwise stand for
        thousands of rows per unit of pure noise."""
        B = self.noisy_units.size
        s = float(np.max(self.measurement.scales))
        t = s * np.log(B / 0.05) if self.measurement.noise == "laplace" else s * np.sqrt(2.0 * np.log(2.0 * B / 0.05))
        return np.where(self.noisy_units > t, self.noisy_units, 0.0)

    def rows_kept(self, bounds: Any) -> np.ndarray:
        """Estimated rows kept at each bound ``k`` (post-processing of ``h~``, no charge):
        ``sum_b h~_b min(t_b, k)`` over the buckets whose count is above the noise
        (:meth:`_significant_units`), with ``t_b`` the bucket's upper edge (an over-estimate of the
        rows of the units in it)."""
        k = np.atleast_1d(np.asarray(bounds, dtype=np.float64))
        h = self._significant_units()
        return (h[None, :] * np.minimum(self.candidates[None, :], k[:, None])).sum(axis=1)

    def describe(self) -> dict[str, Any]:
        """What a release description records of the choice."""
        spent = {"epsilon": self.cost.epsilon} if self.cost.epsilon else {"rho": self.cost.rho}
        how = ("DP estimate of the error-minimising bound" if self.quantile == "error"
               else f"DP {self.quantile:g}-quantile of rows per unit")
        return {"max_rows": int(self.bound), "chosen_by": how, "spent": spent}

    def estimated_error(self, bounds: Any, cells: int, noise: str, budget: float) -> np.ndarray:
        """Estimated mean absolute error per cell at each bound (module doc): ``E|beta + z|`` with
        the mean truncation bias ``beta`` from the noisy bucket histogram.  Post-processing only."""
        k = np.atleast_1d(np.asarray(bounds, dtype=np.float64))
        h = self._significant_units()
        lower = np.r_[0.0, self.candidates[:-1].astype(np.float64)]
        mid = (lower + self.candidates) / 2.0
        bias = (h[None, :] * np.maximum(mid[None, :] - k[:, None], 0.0)).sum(axis=1) / float(cells)
        if noise == "laplace":  # E|b + z|, z ~ Laplace(s), b >= 0: b + s exp(-b / s)
            s = k / budget
            return bias + s * np.exp(-bias / s)
        from scipy.stats import norm  # E|b + z|, z ~ N(0, s^2): b (1 - 2 Phi(-b/s)) + 2 s phi(b/s)

        s = k / np.sqrt(2.0 * budget)
        return bias * (1.0 - 2.0 * norm.cdf(-bias / s)) + 2.0 * s * norm.pdf(bias / s)


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
    cells: int | None = None,
    release_budget: float | None = None,
) -> BoundChoice:
    """A private ``quantile`` of the rows per unit as ``max_rows`` (module doc).

    ``units``: the unit id of every row.  The budget (``epsilon``: exact discrete Laplace;
    ``rho``: exact discrete Gaussian) is what this choice spends -- a small share of the release's
    budget -- and is charged to ``accountant``.  Rows without an id raise unless
    ``drop_missing``.  ``quantile="error"`` needs the release's number of ``cells`` and its
    ``release_budget`` (same kind as the choice's)."""
    if quantile == "error":
        if not isinstance(cells, (int, np.integer)) or cells < 1 or release_budget is None or release_budget <= 0:
            raise SparseDPError("quantile='error' needs the release's cells (a positive integer) and release_budget")
    elif isinstance(quantile, str) or not 0.0 < float(quantile) < 1.0:
        raise SparseDPError(f"quantile must lie in (0, 1) or be 'error', got {quantile!r}")
    if (epsilon is None) == (rho is None):
        raise SparseDPError("give the budget of the choice: epsilon (Laplace) or rho (Gaussian)")
    from .privacy_unit import _codes  # the unit ids' codes, missing ids handled as truncate does

    codes, _ = _codes(np.asarray(units), "the privacy unit column", drop_missing)
    per_unit = np.bincount(codes) if codes.size else np.zeros(0, dtype=np.int64)
    grid = candidate_bounds(max_bound)
    buckets = np.minimum(np.searchsorted(grid, per_unit, side="left"), grid.size - 1)
    hist = np.bincount(buckets, minlength=grid.size).astype(np.float64)
    kw: dict[str, Any] = {"epsilon": epsilon} if epsilon is not None else {"rho": rho, "noise": "gaussian"}
    meas = measure(np.eye(grid.size), hist, accountant=accountant, rng=rng, label="privacy unit: bound (DP quantile)",
                   **kw)
    noisy = np.asarray(meas.y, dtype=np.float64)
    choice = BoundChoice(bound=0, quantile=quantile if quantile == "error" else float(quantile), candidates=grid,
                         noisy_units=noisy, measurement=meas, cost=meas.cost)
    if quantile == "error":
        est = choice.estimated_error(grid, int(cells), "laplace" if epsilon is not None else "gaussian",
                                     float(release_budget))
        at = int(np.argmin(est))
    else:
        cdf = np.cumsum(noisy)
        target = float(quantile) * cdf[-1]
        at = int(np.argmax(cdf >= target)) if np.any(cdf >= target) else grid.size - 1
    return dataclasses.replace(choice, bound=int(grid[at]))


def resolve_unit(
    unit: Any,
    units: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    accountant: Accountant | None = None,
    rng: Any = None,
    drop_missing: bool = False,
    cells: int | None = None,
) -> tuple[Any, BoundChoice | None, float]:
    """``(concrete unit, choice, budget left for the release)``.  A unit with ``max_rows="auto"``
    spends ``unit.auto_share`` of the budget (``epsilon`` or ``rho``) on :func:`choose_max_rows`
    and gets the chosen bound; any other unit is returned as is with the whole budget.
    ``cells``: the release's number of counts, needed by ``auto_quantile="error"``."""
    from .privacy_unit import PrivacyUnit

    if not isinstance(unit, PrivacyUnit):
        raise SparseDPError(f"unit must be a PrivacyUnit, got {type(unit).__name__}")
    budget = epsilon if epsilon is not None else rho
    if budget is None:
        raise SparseDPError("give the release's budget: epsilon or rho")
    if not unit.is_auto:
        return unit, None, float(budget)
    share = float(budget) * unit.auto_share
    rest = _rest(float(budget), share)
    choice = choose_max_rows(units, quantile=unit.auto_quantile, accountant=accountant, rng=rng,
                             drop_missing=drop_missing, cells=cells, release_budget=rest,
                             **({"epsilon": share} if epsilon is not None else {"rho": share}))
    concrete = PrivacyUnit(unit.column, max_rows=choice.bound, max_groups=unit.max_groups,
                           max_rows_per_group=unit.max_rows_per_group)
    return concrete, choice, rest


def _rest(budget: float, spent: float) -> float:
    """The largest float ``r <= budget - spent`` with ``spent + r <= budget`` exactly (so an
    accountant holding ``budget`` takes both charges)."""
    from fractions import Fraction

    r = budget - spent
    while Fraction(spent) + Fraction(r) > Fraction(budget):
        r = math.nextafter(r, 0.0)
    return r
