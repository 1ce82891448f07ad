"""Scoring under the noise that runs: the expected error of a candidate strategy with the noise the
mechanism will actually draw, at the budget it will be drawn at.

The families optimise the error at unit budget with the continuous noise model of
:mod:`~sparsedp.optimize.calibrate` (Laplace ``Var = 2 Delta_1^2`` at ``epsilon = 1``, Gaussian
``Delta_2^2 / 2`` at ``rho = 1``), which makes the error scale as ``1 / epsilon^2`` (``1 / rho``).
:class:`~sparsedp.mechanism.MatrixMechanism` draws *exact* discrete noise by default: the discrete
Laplace of scale ``t`` (grid units) has variance ``2 q / (1 - q)^2``, ``q = e^{-1/t}``, below the
continuous ``2 t^2`` -- 1.84 instead of 2 for the identity at ``epsilon = 1`` (``t = 1``), within
``1e-13`` of it for the integer strategies scaled to ``Delta = 2^20``.  So the ranking of a 0/1
template against an optimised integer strategy depends on the noise; comparing them under the
continuous model can pick a strategy that is worse under the mechanism that runs.

:func:`noise_factor` gives, for one strategy, the factor ``f`` with

    E(budget, noise that runs) <= f * E_unit(continuous),

``f = max_i v_i / v_unit``: ``v_i`` the per-row variances of the plan the mechanism builds
(:func:`sparsedp.measure.plan_measurement`, same calibration, exact discrete variances when
``secure``), ``v_unit`` the continuous unit-budget variance the family scored with.  It is an
equality when the plan is homoscedastic (one scale on every row: every family here and the 0/1
templates); with per-row scales (integer forms, e.g. Haar) it is an upper bound, since
``V <= f v_unit I`` implies ``W (M^T V^{-1} M)^{-1} W^T <= f v_unit W (M^T M)^{-1} W^T`` (Loewner
order), and :func:`error_under_noise` computes the exact GLS error with the plan's variances
instead (:func:`sparsedp.accuracy.expected_error`, exact method) where that fits in memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..accuracy import expected_error
from ..range_variance import MemoryLimitError
from ..measure import plan_measurement
from ..operators import Operator
from .calibrate import NoiseModel, unit_variance

__all__ = ["EXACT_PER_ROW_MAX_N", "ORTHOGONAL_MAX_N", "error_under_noise", "noise_factor", "orthogonal_rows_error"]

#: Largest domain for which a plan with per-row scales is scored by the exact GLS error (above it,
#: by the upper bound ``f * unit_total``: the exact computation costs seconds per candidate).
EXACT_PER_ROW_MAX_N = 1 << 16


#: Largest square strategy checked for orthogonal rows by :func:`orthogonal_rows_error` (it forms
#: ``G M^T``, ``n x n`` dense).
ORTHOGONAL_MAX_N = 2048


def orthogonal_rows_error(strategy: Operator, variances: Any, gram: Any) -> float | None:
    """The exact GLS error of a square strategy with orthogonal rows (the identity, Haar), else
    ``None``: with ``V = diag(v)``, ``M^T V^-1 M = sum_i m_i m_i^T / v_i`` and the ``m_i / ||m_i||``
    orthonormal, ``(M^T V^-1 M)^-1 = sum_i v_i m_i m_i^T / ||m_i||^4``, so the error is
    ``sum_i v_i (m_i^T G m_i) / ||m_i||^4`` -- one product of ``G`` (``gram``, a
    :class:`~sparsedp.optimize.gram.Gram`) with ``M^T``, where the general exact path solves.
    Rows count as orthogonal when every off-diagonal entry of ``M M^T`` is at most ``1e-13
    sqrt(||m_i||^2 ||m_j||^2)`` (Haar's rational entries for ``n`` not a power of two)."""
    m, n = (int(d) for d in strategy.shape)
    if m != n or n > ORTHOGONAL_MAX_N or gram is None:
        return None
    A = strategy.tosparse().tocsr().astype(np.float64)
    P = (A @ A.T).tocoo()
    norms2 = np.zeros(n)
    on = P.row == P.col
    np.add.at(norms2, P.row[on], P.data[on])
    if np.any(norms2 <= 0):
        return None
    off = ~on
    if np.any(np.abs(P.data[off]) > 1e-13 * np.sqrt(norms2[P.row[off]] * norms2[P.col[off]])):
        return None
    MT = A.T.toarray()
    q = np.einsum("ji,ji->i", MT, gram.matmat(MT))  # m_i^T G m_i
    v = np.broadcast_to(np.asarray(variances, dtype=np.float64), (n,))
    return float(np.sum(v * q / (norms2 * norms2)))


def _plan(strategy: Operator, model: NoiseModel, budget: float, secure: bool) -> Any:
    """The plan the mechanism builds for ``strategy`` at ``budget`` (nothing drawn or charged)."""
    kw = {"epsilon": budget} if model.kind == "laplace" else {"rho": budget}
    return plan_measurement(strategy, noise=model.kind, secure=bool(secure), **kw)


def noise_factor(strategy: Operator, model: NoiseModel, budget: float, secure: bool,
                 plan: Any = None) -> tuple[float, bool]:
    """``(f, exact)``: the error of ``strategy`` at ``budget`` (``epsilon`` for Laplace, ``rho`` for
    Gaussian) under the noise the mechanism draws (exact discrete noise when ``secure``) is ``f``
    times its continuous unit-budget error; ``exact`` is False when ``f`` is an upper bound (a plan
    with per-row scales).  ``plan``: :func:`_plan`'s, if already built.  Nothing is drawn or charged.

    One scale on every row (every family's integer strategies, the 0/1 templates): the continuous
    unit-budget variance is the plan's own ``2 b^2 epsilon^2`` (``sigma^2 rho``) -- the calibration
    is the same with float noise for these lattice strategies -- so one plan suffices.  Per-row
    scales: the float plan at unit budget gives it (:func:`~.calibrate.unit_variance`)."""
    plan = _plan(strategy, model, budget, secure) if plan is None else plan
    v = plan.variances()
    top = float(v.max())
    if float(v.min()) == top and plan.row_factors is None:
        b = float(np.max(plan.scales))
        unit = (2.0 * b * b * budget * budget) if model.kind == "laplace" else (b * b * budget)
        return top / unit, True
    return top / unit_variance(strategy, model), False


def error_under_noise(workload: Operator, strategy: Operator, unit_total: float, model: NoiseModel, budget: float,
                      secure: bool, gram: Any = None) -> tuple[float, str]:
    """``(total, how)``: the expected total squared error of the GLS answers of ``strategy`` at
    ``budget`` under the noise the mechanism draws, from its continuous unit-budget error
    ``unit_total``: exactly ``f * unit_total`` for homoscedastic plans (:func:`noise_factor`); for
    per-row scales the exact GLS error with the plan's variances, or the upper bound
    ``f * unit_total`` above :data:`EXACT_PER_ROW_MAX_N` cells or when that computation would not
    fit in memory.  ``gram`` (the workload's :class:`~sparsedp.optimize.gram.Gram`, optional): square
    strategies with orthogonal rows are then scored by :func:`orthogonal_rows_error`."""
    plan = _plan(strategy, model, budget, secure)
    f, homoscedastic = noise_factor(strategy, model, budget, secure, plan)
    noise = "exact discrete noise" if secure else "float noise"
    if homoscedastic:
        return unit_total * f, noise
    if strategy.shape[1] > EXACT_PER_ROW_MAX_N:  # seconds per candidate above this: the bound
        return unit_total * f, noise + ", upper bound"
    ortho = orthogonal_rows_error(strategy, plan.variances(), gram)
    if ortho is not None:
        return min(ortho, unit_total * f), noise + ", per-row variances"
    try:
        rep = expected_error(workload, strategy, plan.variances(), method="exact")
    except MemoryLimitError:
        return unit_total * f, noise + ", upper bound"
    return min(rep.total, unit_total * f), noise + ", per-row variances"
