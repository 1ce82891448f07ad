"""Pure-DP marginal releases with a weighted-marginals strategy (:mod:`sparsedp.marginals.pure`).

``epsilon``-DP, neighbours = add or remove one record (one unit in one cell of every table).
Each measured marginal ``S`` (weight ``theta_S``, ``sum theta = 1``) is released as
``y_S = t_S + z_S`` with exact discrete Laplace noise of scale ``b_S = 1 / (theta_S epsilon)`` per
cell, through :func:`~sparsedp.measure.plan_measurement` of the identity on the table (one record:
one cell, L1 sensitivity 1, loss ``theta_S epsilon``); the tables of one weight are measured
together by one identity plan on their stack and charged ``m`` times its loss, and the total,
``sum_S theta_S epsilon = epsilon``, is charged once.

Reconstruction (GLS, exact): the noise of ``y_S`` is i.i.d. per cell, so its components in the
orthogonal residual subspaces are uncorrelated.  Residual ``A subset S`` is estimated from ``y_S``
by ``Q_A (y_S summed over S \\ A)`` with per-entry variance ``V_{S,A} = Var_S prod_{i in S \\ A} n_i``;
the GLS estimate of residual ``A`` is the inverse-variance average over the measured ``S superset A``
(variance ``1 / sum_S 1 / V_{S,A}``), and the marginals follow as in
:mod:`sparsedp.marginals.release`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from itertools import combinations
from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from ..errors import InputBoundError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..noise import SecureRandomBits, as_generator
from ..operators import SparseOperator
from ..privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time
from ..releases import ReleaseMethods, ReleaseResult
from ..validation import budget_fraction, check_epsilon
from .domain import Domain
from .pure import MarginalsStrategy
from .release import (_cell_variance, _reconstruct_batch, _records_or_counts, marginal_tables, marginals_result,
                      requested_tables, tables_from_counts)
from .units import declared_unit, prepare_unit, unit_entry, unit_ids_from, unit_loss, unit_record
from .residual import residual_operator

__all__ = ["PureMarginalRelease", "release_marginals_laplace"]


@dataclass(frozen=True)
class PureMarginalRelease(ReleaseMethods):
    """Released marginals (pure DP), their exact per-cell variances, the privacy spent;
    :meth:`to_release` (and through it ``confidence_intervals``, ``save``, ``to_pandas``) as
    :class:`~sparsedp.marginals.MarginalRelease`."""

    domain: Domain
    strategy: MarginalsStrategy
    marginals: dict  # {attribute names: table}
    variances: dict  # {attribute names: per-cell variance}
    residual_variances: dict  # {residual: per-entry variance of its GLS estimate}
    measurements: dict  # {measured marginal (index tuple): (noisy table, per-cell noise variance)}
    cost: PrivacyCost
    loss: float  # certified sum of the plans' losses (<= epsilon)
    entry: LedgerEntry
    secure: bool
    private: bool
    seconds: float
    privacy_unit: Any = None  # the concrete PrivacyUnit (None: one record)
    bound_choice: Any = None  # the BoundChoice of max_rows="auto" (charged before the release)

    def sum_of_variances(self) -> float:
        """Expected total squared error over the workload."""
        return float(sum(v * math.prod(self.domain.sizes[self.domain.names.index(a)] for a in k)
                         for k, v in self.variances.items()))

    def to_release(self, *, description: dict | None = None) -> ReleaseResult:
        """Every cell of the workload's marginals as one answer with its exact variance
        (:func:`~sparsedp.marginals.release.marginals_result`), the ledger entry."""
        desc = {"domain": {"names": list(self.domain.names), "sizes": list(self.domain.sizes)},
                "epsilon": self.cost.epsilon, "certified_epsilon": self.loss,
                "sum_of_variances": self.sum_of_variances()}
        desc, ledger = unit_record(desc, self.entry, self.privacy_unit, self.bound_choice, "epsilon")
        desc.update(description or {})
        return marginals_result(self.domain.names, self.domain.sizes,
                                requested_tables(self.domain, self.strategy.requested, self.marginals, self.variances),
                                noise="laplace", secure=bool(self.secure), ledger=ledger,
                                private=bool(self.private), description=desc,
                                strategy=f"weighted marginals: {len(self.measurements)} tables measured with Laplace "
                                "noise, marginals by GLS", source=self)


def residuals_of(domain: Domain, S: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], int]]:
    """The residuals ``A subset S`` with a non-zero dimension, each with ``prod_{i in S \\ A} n_i``:
    the factor by which table ``S``'s per-cell variance grows in its estimate of residual ``A``."""
    for r in range(len(S) + 1):
        for A in combinations(S, r):
            if all(domain.sizes[i] > 1 for i in A):
                yield A, math.prod(domain.sizes[i] for i in S if i not in A)


def fit_table_plans(strategy: MarginalsStrategy, epsilon: float, secure: bool
                    ) -> tuple[list[tuple[MeasurementPlan, list[int]]], Fraction]:
    """``(plans, certified total loss)``: one identity plan per weight on the stacked tables of that
    weight, scale ``b = 1 / (theta epsilon)`` per cell, rounded up until the certified total fits
    ``epsilon`` as written.  What :func:`release_marginals_laplace` measures; the plans' variances
    are those of the noise drawn (exact discrete Laplace when ``secure``)."""
    domain, eps = strategy.domain, epsilon
    theta = np.asarray(strategy.weights, dtype=np.float64)
    measured = list(strategy.measured)
    sizes = [math.prod(domain.shape(S)) for S in measured]
    # plans: identity on the stacked tables of one weight; scale b = 1 / (theta epsilon) per cell
    groups: dict[float, list[int]] = {}
    for j, th in enumerate(theta):
        groups.setdefault(float(th), []).append(j)
    widen = 1.0
    for _ in range(8):  # scales rounded up until the certified total fits epsilon exactly
        plans = []
        total = Fraction(0)
        for th, members in groups.items():
            size = int(sum(sizes[j] for j in members))
            plan = plan_measurement(SparseOperator(sp.identity(size, format="csr"), name="marginal tables"),
                                    scales=widen / (th * eps), noise="laplace", secure=secure)
            plans.append((plan, members))
            total += len(members) * Fraction(plan.loss)  # each record: one cell of each table
        if total <= budget_fraction(eps):  # the budget as written, what an Accountant charges
            break
        widen *= float(total / budget_fraction(eps)) * (1 + 1e-12)
    else:  # pragma: no cover
        raise InvalidPrivacyParameterError(f"the plans cost {float(total)!r} > epsilon {eps!r}")
    return plans, total


def release_marginals_laplace(records: Any, strategy: MarginalsStrategy, *, accountant: Accountant | None = None,
                              rng: Any = None, secure: bool = True, label: str = "marginals (laplace)",
                              counts: Any = None, privacy_unit: Any = None, unit_ids: Any = None,
                              drop_missing_units: bool = False) -> PureMarginalRelease:
    """Measure ``strategy`` (from :func:`~sparsedp.marginals.optimize_marginals_laplace`) on
    ``records`` at its ``epsilon`` and reconstruct its workload (see the module doc); ``counts``
    (with ``records=None``): the data as a histogram over the whole domain (C order).  The
    marginals come back in the order the strategy's workload named them.

    ``privacy_unit`` / ``unit_ids`` / ``drop_missing_units``: as in
    :func:`~sparsedp.marginals.release_marginals`; the tables are measured at ``epsilon / L`` so
    that one whole unit costs at most the strategy's ``epsilon`` (:mod:`sparsedp.marginals.units`)."""

    t0 = time.perf_counter()
    domain = strategy.domain
    eps = check_epsilon(strategy.epsilon)
    if accountant is not None and not isinstance(accountant, Accountant):
        raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
    unit = declared_unit(privacy_unit, drop_missing_units)
    if unit is not None and counts is not None:
        raise SparseDPError("a privacy unit needs the records (with their unit ids), not counts=")
    X, hist, n_records = _records_or_counts(records, counts, domain)
    ids = unit_ids_from(records, unit_ids, unit, n_records) if counts is None else None
    if n_records > 2**50:
        raise InputBoundError("too many records")
    seeded = rng is not None and not (isinstance(rng, SecureRandomBits) and rng.secure)
    gen = rng if rng is None or isinstance(rng, SecureRandomBits) else as_generator(rng)
    theta = np.asarray(strategy.weights, dtype=np.float64)
    if np.any(theta <= 0) or abs(float(theta.sum()) - 1.0) > 1e-9:
        raise ShapeError("strategy weights must be > 0 and sum to 1")
    up, eps_fit = None, eps
    if unit is not None:  # every check above: now the truncation (and the bound's choice, charged)
        up = prepare_unit(X, domain, ids, unit, noise="laplace", budget=eps, accountant=accountant, rng=gen,
                          drop_missing=bool(drop_missing_units))
        X, eps = up.X, up.budget
        eps_fit = up.unit.row_budget("laplace", eps)  # epsilon / L per record: epsilon per unit
    measured = list(strategy.measured)
    tables = marginal_tables(X, domain, measured) if hist is None else tables_from_counts(hist, domain, measured)
    plans, total = fit_table_plans(strategy, eps_fit, bool(secure))
    cost = PrivacyCost(epsilon=eps)
    entry = unit_entry(LedgerEntry(label=label, cost=cost, rows=int(sum(p.rows for p, _ in plans)),
                                   columns=int(sum(t.size for t in tables.values())), noise="laplace",
                                   secure=bool(secure), private=not seeded, sensitivity=float(len(measured)),
                                   scale_min=float(min(p.scales.min() for p, _ in plans)),
                                   scale_max=float(max(p.scales.max() for p, _ in plans)), time=ledger_time()),
                       up.unit if up else None)
    if accountant is not None:
        accountant.spend(cost, label=label, entry=entry)
    noisy: dict[tuple[int, ...], tuple[np.ndarray, float]] = {}
    for plan, members in plans:
        x = np.concatenate([tables[measured[j]].ravel() for j in members])
        m = plan.measure(x, accountant=None, rng=gen, label=label)
        a = 0
        for j in members:
            S = measured[j]
            size = tables[S].size
            noisy[S] = (m.y[a:a + size].reshape(domain.shape(S)), float(m.variances[a]))
            a += size
    # GLS per residual: inverse-variance average of the estimates from every measured S superset A
    num: dict[tuple[int, ...], np.ndarray] = {}
    den: dict[tuple[int, ...], float] = {}
    for S, (yS, vS) in noisy.items():
        for A, summed in residuals_of(domain, S):
            drop = tuple(k for k, i in enumerate(S) if i not in A)
            tA = yS.sum(axis=drop) if drop else yS
            est = residual_operator(domain.shape(A)).matvec(np.asarray(tA).ravel())
            V = vS * summed
            num[A] = num.get(A, 0.0) + est / V
            den[A] = den.get(A, 0.0) + 1.0 / V
    y = {A: num[A] / den[A] for A in num}
    var = {A: 1.0 / den[A] for A in den}
    out, variances = {}, {}
    by_shape: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for S in strategy.marginals:
        by_shape.setdefault(domain.shape(S), []).append(S)
    for group in by_shape.values():
        for S, tab in zip(group, _reconstruct_batch(domain, group, y)):
            out[S] = tab
    out = {tuple(domain.names[i] for i in S): out[S] for S in strategy.marginals}  # in the workload's order
    variances = {tuple(domain.names[i] for i in S): _cell_variance(domain, S, var) for S in strategy.marginals}
    return PureMarginalRelease(domain=domain, strategy=strategy, marginals=out, variances=variances,
                               residual_variances=var, measurements=noisy, cost=cost,
                               loss=unit_loss(total, up.unit if up else None, "laplace"), entry=entry,
                               secure=bool(secure), private=not seeded, seconds=time.perf_counter() - t0,
                               privacy_unit=up.unit if up else None, bound_choice=up.choice if up else None)
