"""Marginal strategies in the matrix mechanism: what ``MatrixMechanism(W, S)`` measures when
``S = sparsedp.optimize(W)`` is a marginal strategy.

For a marginal workload (:func:`~sparsedp.marginals.marginal_workload`, or the flattened
:func:`sparsedp.workloads.marginals`, which :func:`sparsedp.optimize` recognises) the optimiser
returns a strategy that is not one matrix with one noise scale:

* Gaussian noise (zCDP): ResidualPlanner's optimum, a
  :class:`~sparsedp.marginals.ResidualSelection` -- each residual measured with its own noise
  (Xiao et al., NeurIPS 2023);
* Laplace noise (pure DP): HDMM's weighted marginals, a
  :class:`~sparsedp.marginals.MarginalsStrategy` -- each measured marginal with noise ``1 /
  (theta_S epsilon)`` (McKenna et al., VLDB 2018).

A :class:`MarginalPlan` holds such a strategy at the mechanism's budget and runs it on the data
vector the mechanism takes (a histogram over the whole domain, C order) through
:func:`~sparsedp.marginals.release_marginals` / :func:`~sparsedp.marginals.release_marginals_laplace`:
the same exact noise, calibration and charge as those functions (their module docs give the
sensitivities: ``Delta_2^2 = sum_A p_A`` per residual plan, ``Delta_1 = 1`` per weighted table).
The release answers the workload in its row order (a flattened workload's blocks, each in C order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..accuracy import ErrorReport
from ..errors import InvalidPrivacyParameterError, ShapeError
from ..privacy import Accountant, PrivacyCost
from ..validation import check_epsilon, check_rho
from .domain import Domain
from .pure import MarginalsStrategy
from .pure_release import PureMarginalRelease, fit_table_plans, release_marginals_laplace, residuals_of
from .release import MarginalRelease, _cell_variance, fit_residual_plans, release_marginals, residual_variances
from .select import ResidualSelection, select_residuals
from .workload import MarginalWorkload, flattened_marginals

__all__ = ["MarginalPlan", "is_marginal_strategy", "marginal_plan"]


def is_marginal_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` (an optimiser's ``.strategy``) is a marginal one (not an operator)."""
    return isinstance(strategy, (ResidualSelection, MarginalsStrategy))


@dataclass(frozen=True)
class MarginalPlan:
    """A marginal strategy at a budget: ``run`` measures a histogram with it (module doc).

    ``order``: the workload's marginals in its row order (attribute index tuples); ``strategy``:
    the :class:`ResidualSelection` (Gaussian, at ``budget = rho``) or :class:`MarginalsStrategy`
    (Laplace, at ``budget = epsilon``)."""

    domain: Domain
    order: tuple[tuple[int, ...], ...]
    noise: str
    budget: float
    secure: bool
    strategy: Any

    @property
    def cost(self) -> PrivacyCost:
        """What one run charges: ``rho`` or ``epsilon``, once."""
        return PrivacyCost(rho=self.budget) if self.noise == "gaussian" else PrivacyCost(epsilon=self.budget)

    @property
    def cells(self) -> int:
        """The workload's answers: its marginals' cells."""
        return int(sum(math.prod(self.domain.sizes[i] for i in S) for S in self.order))

    def error_report(self) -> ErrorReport:
        """The expected total squared error of the workload's cells at the plan's budget and each
        cell's variance: exact for the noise that runs (Gaussian: the residual plans the release
        measures; Laplace: the tables' plans), exact discrete variances when secure."""
        if self.noise == "gaussian":
            plans, _, _ = fit_residual_plans(self.strategy, self.budget, self.secure)
            var = residual_variances(self.strategy, plans)
            per = [_cell_variance(self.domain, S, var) for S in self.order]
        else:
            per = _laplace_cell_variances(self.strategy, self.secure, self.order)
        var = np.concatenate([np.full(math.prod(self.domain.sizes[i] for i in S), v) for S, v in zip(self.order, per)])
        total = float(var.sum())
        return ErrorReport(total, total / max(var.size, 1), "exact-residual", variances=var, noise=self.noise,
                           secure=False)

    def run(self, x: Any, *, accountant: Accountant | None = None, rng: Any = None
            ) -> MarginalRelease | PureMarginalRelease:
        """Release the workload's marginals of the histogram ``x`` (checked: non-negative integer
        counts, one per cell of the domain, before anything is charged); the release lists them in
        the workload's row order."""
        names = self.domain.names
        if self.noise == "gaussian":
            sel = self.strategy
            rel: Any = release_marginals(None, self.domain, list(sel.marginals), self.budget, weights=sel.weights,
                                         objective=sel.objective, accountant=accountant, rng=rng,
                                         secure=self.secure, counts=x, label="MatrixMechanism(residuals)")
        else:
            rel = release_marginals_laplace(None, self.strategy, accountant=accountant, rng=rng, secure=self.secure,
                                            counts=x, label="MatrixMechanism(weighted marginals)")
        keys = [tuple(names[i] for i in S) for S in self.order]
        return replace(rel, marginals={k: rel.marginals[k] for k in keys}, variances={k: rel.variances[k] for k in keys})


def _laplace_cell_variances(strategy: MarginalsStrategy, secure: bool, order: tuple[tuple[int, ...], ...]
                            ) -> list[float]:
    """Per-cell variance of each marginal under the weighted-marginals GLS of
    :mod:`sparsedp.marginals.pure_release`, for the noise its plans draw: table ``S`` has per-cell
    variance ``V_S`` (the plan's, exact discrete Laplace when ``secure``); residual ``A`` is the
    inverse-variance average over the measured ``S superset A`` of ``V_S prod_{i in S \\ A} n_i``;
    a marginal's cell variance sums its residuals' (:func:`~sparsedp.marginals.release._cell_variance`)."""
    dom = strategy.domain
    plans, _ = fit_table_plans(strategy, strategy.epsilon, secure)
    den: dict[tuple[int, ...], float] = {}
    for plan, members in plans:
        vS = float(plan.variances()[0])
        for j in members:
            for A, summed in residuals_of(dom, strategy.measured[j]):
                den[A] = den.get(A, 0.0) + 1.0 / (vS * summed)
    var = {A: 1.0 / d for A, d in den.items()}
    return [_cell_variance(dom, S, var) for S in order]


def _workload_marginals(W: Any) -> tuple[Domain, tuple[tuple[int, ...], ...]] | None:
    """``(domain, marginals in row order)`` of a marginal workload, flattened or not; else ``None``."""
    mw = W if isinstance(W, MarginalWorkload) else flattened_marginals(W)
    return None if mw is None else (mw.domain, tuple(tuple(S) for S in mw.marginals))


def marginal_plan(W: Any, strategy: Any, *, noise: str, epsilon: float | None, rho: float | None,
                  delta: float | None, secure: bool) -> MarginalPlan:
    """The :class:`MarginalPlan` of a marginal ``strategy`` (``optimize(W).strategy``) for workload
    ``W`` at the mechanism's budget; refuses a mismatch (noise, budget, domain, marginals) before
    anything is measured."""
    found = _workload_marginals(W)
    if found is None:
        raise ShapeError("a marginal strategy answers a marginal workload (marginal_workload or "
                         "workloads.marginals); this workload is not one")
    domain, order = found
    if tuple(domain.sizes) != tuple(strategy.domain.sizes) or set(order) != set(strategy.marginals):
        raise ShapeError("this marginal strategy was optimised for another workload (its domain or marginals differ)")
    if isinstance(strategy, ResidualSelection):
        if noise != "gaussian" or epsilon is not None or delta is not None or rho is None:
            raise InvalidPrivacyParameterError("a residual strategy (zCDP) is measured with noise='gaussian' and rho=")
        r = check_rho(rho, "rho")
        sel = select_residuals(strategy.domain, list(strategy.marginals), r, weights=strategy.weights,
                               objective=strategy.objective)
        return MarginalPlan(strategy.domain, order, "gaussian", r, bool(secure), sel)
    if noise != "laplace" or rho is not None or delta is not None or epsilon is None:
        raise InvalidPrivacyParameterError("a weighted-marginals strategy (pure DP) is measured with Laplace noise "
                                           "and epsilon=")
    return MarginalPlan(strategy.domain, order, "laplace", check_epsilon(epsilon), bool(secure),
                        strategy.at(epsilon))
