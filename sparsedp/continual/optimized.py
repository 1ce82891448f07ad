"""Counters from optimised strategies: any strategy that determines every step, run online as
"running sum + data-independent offset" (issue 11).

Strategy ``M`` (``m x N``, one column per step, full column rank): an optimised strategy for the
prefix workload ``W`` (``W_ts = 1`` for ``s <= t``) from :func:`sparsedp.optimize` -- a weighted
interval tree (integer node weights, any ``N``) or HDMM's p-Identity ``[I; Theta] D`` (integer
entries, dense, ``N <= DENSE_MAX_N``) -- or any strategy the caller brings (an
:class:`~sparsedp.optimize.OptimizedStrategy` or an operator).

Release.  ``y = M x + z`` would be the offline measurement and ``x^ = G y`` its GLS estimate,
``G = (M^T V^{-1} M)^{-1} M^T V^{-1}`` (``V`` the per-row noise variances), so ``G M = I`` and
``W x^ = s + W G z`` with ``s_t`` the running sums.  The offsets ``e = W G z`` do not depend on the
data: the counter draws ``z`` at construction (charging once, before the draw), computes ``e`` --
``O(N)`` for trees (two-pass GLS, :func:`sparsedp.tree_estimator.tree_gls`), ``O(N b + p nb)`` for
the hybrid strategies (block trees plus ``p`` dense rows on ``nb`` block sums, by Woodbury:
:class:`sparsedp.optimize.hybrid.HybridGLS`), a QR of the whitened ``M`` otherwise -- and releases
``s~_t = s_t + e_t`` online in ``O(1)`` per step.

Privacy (pure DP, ``epsilon``).  The noise is calibrated by :func:`sparsedp.measure.plan_measurement`
from the measured entries: ``Delta_1 = max_j sum_i |M_ij|`` -- exact for the integer strategies the
optimiser returns (integer sums below ``2^53``), a certified upper bound of the float sums
otherwise -- with ``z_i ~ Lap(b_i)`` (exact discrete Laplace on the data's lattice by default,
``secure=True``) and the plan's certified loss ``max_j sum_i |M_ij| / b_i <= epsilon`` (one scale
``b = Delta_1 / epsilon`` rounded up, or per-row scales of an integer-row form).  ``s + e = W G (M x
+ z)`` is post-processing of that measurement, so the whole stream is ``epsilon``-DP for a fixed
stream, and also for adaptively chosen streams by :mod:`.adaptive` with ``B = W G`` (the offsets
are a fixed linear map of noise drawn independently of the data; here all of it is drawn ahead).
With ``rho`` instead: Gaussian noise, ``Delta_2``, ``rho``-zCDP (adaptive streams: Denisov et al.
2022).

Exact release (``secure=True``, the default).  ``s_t + e_t`` evaluated in float64 would reveal
``s_t`` (``e_t`` lies on a countable set fixed by the public estimator and the noise lattice; see
:mod:`.exact_offsets`), so with exact noise the release is the correctly rounded float of the *exact*
rational ``s_t + e_t = (W G y)_t``, a function of the measurement alone.  That exact evaluation
(:mod:`.exact_offsets`) exists for two families, so with exact noise:

* a weighted tree (integer node weights ``w_u``, ``Delta_1 = max_j sum_{u covers j} w_u``) is
  measured as its 0/1 rows with per-row scales ``b / w_u`` (``b`` the scale of the weighted strategy;
  the same loss ``max_j sum w_u / b``, certified by the plan), so that every node's noise lies on the
  data's lattice; the offsets are the two-pass GLS with dyadic coefficients;
* a p-Identity strategy ``[diag(a); B]`` (integer ``a``, ``B``) is measured as ``[I; B]`` with per-row
  scales ``b / |a_j|`` on the identity rows and ``b`` on ``B`` (the same loss); the offsets are
  ``cumsum(z_1 + K (z_2 - B z_1))`` with the GLS gain ``K`` in dyadic rationals;
* the default strategy is the better of the two families for ``N <= PIDENTITY_MAX_HORIZON``, the
  weighted-tree family's beyond (:func:`exact_default_family`);
* other strategies (hybrid, general matrices) are refused with exact noise: no exact evaluation of
  their GLS exists here (``secure=False`` runs them with float noise, an opt-out that leaks through
  the noise's low bits).

Error.  ``Var(s~_t) = [W (M^T V^{-1} M)^{-1} W^T]_tt`` (:meth:`OptimizedCounter.step_variances`):
trees by :func:`~sparsedp.continual.path_variances` (``O(N L^2)``), dense strategies from ``R^{-1}``
of the QR.  With float noise ``V = 2 b^2 I``; with exact noise the discrete Laplace variance of the
same scale (smaller by ``O(b^-2)`` relative).  Measured (``benchmarks/bench_continual.py
--optimized``): see ``docs/continual.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from ..errors import ShapeError, SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan
from ..operators import Operator, SparseOperator, aslinearoperator
from ..woodbury import diagonal_plus_rows
from ..privacy import Accountant
from ..strategies import TreeLayout
from ..tree_estimator import tree_gls
from ..validation import check_epsilon, check_positive, check_rho
from ._stream import OffsetCounter, check_accountant, plan_rows, row_variances, weighted_scales
from .error import ContinualError, noise_calibration
from .exact_offsets import DiagonalPlusRows, exact_tree_offsets
from .fenwick import check_horizon
from .glstree import path_variances

__all__ = ["DENSE_MAX_N", "OptimizedCounter", "optimized_counter_error", "optimized_prefix_strategy"]

#: Largest horizon for strategies without a tree layout (dense QR, ``O(N^3)``).
DENSE_MAX_N = 4096
#: Horizons up to this get the p-Identity family in the default optimisation (dense, seconds);
#: longer ones the weighted-tree family.
PIDENTITY_MAX_HORIZON = 1024


def _noise_kind(epsilon: Any, rho: Any) -> str:
    return noise_calibration(epsilon, rho, 1.0)[0]  # exactly one budget, in range


@functools.lru_cache(maxsize=8)
def _optimized(N: int, noise: str, family: str, time_limit: float | None) -> Any:
    from .. import workloads
    from ..optimize import optimize

    if "+" not in family:
        return optimize(workloads.prefix(N), noise=noise, family=family, time_limit=time_limit, rng=0)
    first, second = family.split("+")
    half = None if time_limit is None else time_limit / 2.0
    tree = optimize(workloads.prefix(N), noise=noise, family=first, time_limit=half, rng=0)
    try:
        other = optimize(workloads.prefix(N), noise=noise, family=second, time_limit=half, rng=0)
    except ShapeError:  # e.g. no block size of the hybrid fits this N
        return tree
    best = min((tree, other), key=lambda r: r.error.total)
    return dataclasses.replace(best, history=tree.history + other.history,
                               seconds=tree.seconds + other.seconds)


def exact_default_family(N: int) -> str:
    """The default family of an exact-noise counter: the families whose release is evaluated
    exactly (:mod:`.exact_offsets`), the better of weighted trees and p-Identity for
    ``N <= PIDENTITY_MAX_HORIZON``, weighted trees beyond."""
    return "tree+pidentity" if check_horizon(N) <= PIDENTITY_MAX_HORIZON else "tree"


def optimized_prefix_strategy(N: int, noise: str = "laplace", family: str | None = None,
                              time_limit: float | None = None) -> Any:
    """:func:`sparsedp.optimize` of the prefix workload over ``N`` steps (seeded, so reproducible;
    cached per process).  ``family=None``: ``"auto"`` (templates, trees, p-Identity) for
    ``N <= PIDENTITY_MAX_HORIZON``, else ``"tree+hybrid"``: the better of the weighted-tree and the
    hybrid families (:mod:`sparsedp.optimize.hybrid`), each given half the time limit."""
    N = check_horizon(N, "N")
    if family is None:
        family = "auto" if N <= PIDENTITY_MAX_HORIZON else "tree+hybrid"
    if time_limit is not None:
        time_limit = float(check_positive(time_limit, "time_limit"))
    return _optimized(N, noise, family, time_limit)


def _tree_layout(op: Operator) -> TreeLayout | None:
    """The layout of a tree strategy given as interval rows in the layout's row order, else None."""
    layout = getattr(op, "meta", {}).get("layout") if isinstance(op, IntervalRows) else None
    if not isinstance(layout, TreeLayout) or layout.n != op.shape[1] or layout.nodes != op.shape[0]:
        return None
    lo, hi = layout.intervals()
    if not (np.array_equal(lo, op.lo) and np.array_equal(hi, op.hi)):
        return None
    return layout


def _resolve_strategy(strategy: Any, N: int, noise: str, family: str | None, time_limit: float | None) -> Operator:
    from ..optimize import OptimizedStrategy

    if strategy is None:
        strategy = optimized_prefix_strategy(N, noise, family, time_limit)
    if isinstance(strategy, OptimizedStrategy):
        if strategy.noise != noise:
            raise SparseDPError(f"the strategy was optimised for {strategy.noise} noise, the budget asks for {noise}")
        strategy = strategy.strategy
    op = aslinearoperator(strategy, name="strategy")
    if op.shape[1] != N:
        raise ShapeError(f"the strategy has {op.shape[1]} columns, the horizon is {N}")
    return op


def _hybrid_solver(op: Operator, v: np.ndarray) -> Any:
    """The Woodbury GLS of a hybrid strategy (:class:`sparsedp.optimize.hybrid.HybridGLS`, ``O(N b +
    p nb)``) when ``op`` is one (its explicit matrix is checked against the layout), else None."""
    from ..optimize.hybrid import HybridGLS, HybridLayout

    lay = getattr(op, "meta", {}).get("hybrid") if hasattr(op, "meta") else None
    if not isinstance(lay, HybridLayout) or lay.n != op.shape[1]:
        return None
    solver = HybridGLS(lay)
    # the layout must describe the matrix: the GLS of the exact measurements of any x is x itself
    x = np.cos(0.7 * np.arange(lay.n)) + 1.5  # a fixed test vector
    if solver.rows != op.shape[0] or not np.allclose(solver.solve(op.matvec(x)), x, rtol=0.0, atol=1e-9):
        raise ShapeError("the hybrid strategy's matrix does not match its layout")
    if not np.all(v == v[0]):
        raise ShapeError("hybrid strategies are solved for one noise scale on every row")
    return solver


class _Solver:
    """``e = W G z`` and ``diag(W (M^T V^-1 M)^-1 W^T)`` for one strategy and per-row variances."""

    def __init__(self, op: Operator, variances: np.ndarray):
        self.layout = _tree_layout(op)
        v = np.asarray(variances, dtype=np.float64)
        self._op, self._v, self._exact = op, v, None
        self._hybrid = _hybrid_solver(op, v)
        if self._hybrid is not None:
            self._v0 = float(v[0])
            return
        if self.layout is not None:
            w = np.asarray(op.weights, dtype=np.float64)
            if np.any(w == 0) or not np.all(np.isfinite(w)):
                raise ShapeError("every node of a tree strategy must have a non-zero weight")
            self._w = w
            self.v_sum = v / (w * w)  # node variances in sum units: y_u / w_u = x(I_u) + z_u / w_u
            return
        N = op.shape[1]
        if N > DENSE_MAX_N:
            raise ShapeError(f"a strategy without a tree layout is solved densely: horizon at most {DENSE_MAX_N}, "
                             f"got {N} (use a weighted-tree strategy)")
        A = op.tosparse() if hasattr(op, "tosparse") else sp.csr_matrix(op.matmat(np.eye(N)))
        self._s = 1.0 / np.sqrt(v)
        Aw = np.asarray(sp.csr_matrix(A).toarray(), dtype=np.float64) * self._s[:, None]
        self._Q, self._R = np.linalg.qr(Aw)
        d = np.abs(np.diag(self._R))
        if d.size < N or float(d.min()) <= 1e-10 * float(d.max()):
            raise ShapeError("the strategy must have full column rank (it must determine every step)")

    def offsets(self, z: np.ndarray) -> np.ndarray:
        if self._hybrid is not None:
            return np.cumsum(self._hybrid.solve(z))
        if self.layout is not None:
            return np.cumsum(tree_gls(self.layout, z / self._w, self.v_sum))
        xz = sla.solve_triangular(self._R, self._Q.T @ (z * self._s), lower=False, check_finite=False)
        return np.cumsum(xz)

    def exact_offsets(self, z: np.ndarray, grid: float) -> Any:
        """Exact offsets (:mod:`.exact_offsets`) of a tree of 0/1 rows or of ``[I; B]`` rows, the
        per-row noise ``z`` on the lattice ``grid``."""
        if self.layout is not None:
            if not np.all(self._w == 1.0):
                raise SparseDPError("exact offsets need a tree strategy measured as 0/1 rows")
            return exact_tree_offsets(self.layout, z, self.v_sum, grid)
        if self._exact is None:
            form = diagonal_plus_rows(self._op) if self._hybrid is None else None
            if form is None or not np.all(form[0] == 1.0):
                raise SparseDPError("exact offsets need a tree strategy or identity rows plus integer rows")
            N = self._op.shape[1]
            self._exact = DiagonalPlusRows(form[1], self._v[:N], self._v[N:])
        return self._exact.offsets(z, grid)

    def step_variances(self) -> np.ndarray:
        if self._hybrid is not None:
            return self._v0 * self._hybrid.prefix_variances()
        if self.layout is not None:
            return path_variances(self.layout, self.v_sum)
        N = self._R.shape[1]
        Rinv = sla.solve_triangular(self._R, np.eye(N), lower=False, check_finite=False)
        return np.einsum("ij,ij->i", np.cumsum(Rinv, axis=0), np.cumsum(Rinv, axis=0))


class OptimizedCounter(OffsetCounter):
    """Online counter ``s~_t = s_t + e_t`` with ``e = W G z`` the GLS running-sum error of an optimised
    strategy (see the module docstring for the release, its privacy and its variance).

    Parameters
    ----------
    horizon:
        Number of steps ``N``.
    epsilon, rho:
        Exactly one: ``epsilon`` (Laplace, pure DP) or ``rho`` (Gaussian, zCDP).
    strategy:
        ``None`` (default): :func:`optimized_prefix_strategy` for ``N`` and the noise (``family``,
        ``time_limit`` passed on; cached per process).  Without ``time_limit`` the tree family's
        per-node refinement stops after 20 s (measured for prefix at ``n = 2^20``: 18.5 s of it gave
        706.0 per query under load);
        ``time_limit=600`` lets it converge (702.94), and the hybrid family beats it (655.77; 377 s
        for both, ``benchmarks/bench_continual.py --optimized``).  Or an
        :class:`~sparsedp.optimize.OptimizedStrategy` / operator with ``N`` columns and full column
        rank (trees with a layout: any ``N``; others: ``N <= DENSE_MAX_N``).
    rng:
        Seed or generator (seeded noise is reproducible, hence not private); ``None``: fresh.
    increments, accountant, secure:
        As for every counter (:mod:`._stream`): the increment domain, charged once at creation, exact
        discrete noise by default.
    """

    name = "optimized"

    def __init__(self, horizon: int, epsilon: float | None = None, strategy: Any = None, rng: Any = None,
                 rho: float | None = None, *, family: str | None = None, time_limit: float | None = None,
                 increments: str = "counts", accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.kind = _noise_kind(epsilon, rho)
        self.epsilon = None if epsilon is None else check_epsilon(epsilon, "epsilon")
        self.rho = None if rho is None else check_rho(rho, "rho")
        if self.secure and strategy is None and family is None:
            family = exact_default_family(self.horizon)
        self.strategy = _resolve_strategy(strategy, self.horizon, self.kind, family, time_limit)
        measured_rows: list[Any] = []

        def build(grid: float) -> MeasurementPlan:
            measured_rows[:] = _measurement(self.strategy, self.epsilon, self.rho, self.secure, grid)
            return measured_rows[2]

        self._make_plan(build)
        assert self.plan is not None
        self._measured_op = measured_rows[0]
        self._solver = _Solver(self._measured_op, row_variances(self.plan))  # rank checked before the charge
        self.sensitivity = float(measured_rows[1].data_sensitivity)
        self._open(accountant, rng)  # charges, before the noise of every row is drawn, below
        self._set_offsets(self._noise.all())

    def _offsets_from(self, z: np.ndarray) -> Any:
        """The offsets for the plan's noise ``z`` (what the constructor computes; test hooks): exact
        (:class:`~.exact_offsets.ExactOffsets`) with exact noise."""
        if self.secure:
            return self._solver.exact_offsets(z, self.plan.grid)
        return self._solver.offsets(z)

    def _all_step_variances(self) -> np.ndarray:
        """``Var(s~_t)`` for every step (exact, from the plan's per-row variances)."""
        return self._solver.step_variances()


def _measurement(op: Operator, epsilon: float | None, rho: float | None, secure: bool,
                 grid: float = 1.0) -> tuple[Operator, MeasurementPlan, MeasurementPlan]:
    """``(rows measured, plan of the strategy as given, plan measured)``.  Float noise: the strategy
    as given, one plan.  Exact noise: a tree strategy (else :class:`SparseDPError`, module
    docstring), measured as its 0/1 rows with per-row scales ``b / w_u``, ``b`` the scale of the
    weighted strategy's plan (the same certified loss ``max_j sum w_u / b``)."""
    plan = plan_rows(op, epsilon=epsilon, rho=rho, secure=secure, grid=grid)
    if not secure:
        return op, plan, plan
    b = float(plan.scales[0])
    layout = _tree_layout(op)
    if layout is not None:
        rows: Operator = IntervalRows(op.shape[1], op.lo, op.hi, name=op.name + ", per-row scales",
                                      meta={"layout": layout})
        scales = weighted_scales(b, np.abs(np.asarray(op.weights, dtype=np.float64)))
        return rows, plan, plan_rows(rows, epsilon=epsilon, rho=rho, scales=scales, secure=True, grid=grid)
    form = diagonal_plus_rows(op) if np.unique(plan.scales).size == 1 else None
    if form is None or not np.array_equal(form[1].data, np.round(form[1].data)) \
            or np.abs(form[1].data).max(initial=0.0) >= 2.0**31:
        raise SparseDPError(
            "with exact noise (secure=True) an optimised counter needs a weighted-tree or an integer p-Identity "
            "strategy [diag(a); B]: its release s_t + e_t is evaluated exactly only for those, and a float evaluation "
            "would reveal the running sums; use family='tree' or 'pidentity', or secure=False (float noise, not "
            "private against float channels)")
    a, B = form
    N = op.shape[1]
    rows = SparseOperator(sp.vstack([sp.identity(N, format="csr"), B], format="csr"),
                          name=op.name + ", identity rows with per-row scales", structure="general")
    scales = np.concatenate([weighted_scales(b, np.abs(a)), np.full(B.shape[0], weighted_scales(b, np.ones(1))[0])])
    return rows, plan, plan_rows(rows, epsilon=epsilon, rho=rho, scales=scales, secure=True, grid=grid)


def optimized_counter_error(N: int, epsilon: float | None = None, strategy: Any = None, rho: float | None = None,
                            *, family: str | None = None, time_limit: float | None = None,
                            secure: bool = False) -> ContinualError:
    """Exact per-step variances of :class:`OptimizedCounter` (float noise by default: ``V = 2 b^2``
    or ``sigma^2``; ``secure=True``: the exact discrete variances).  Nothing is drawn or charged."""
    N = check_horizon(N)
    kind = _noise_kind(epsilon, rho)
    eps = None if epsilon is None else check_epsilon(epsilon, "epsilon")
    r = None if rho is None else check_rho(rho, "rho")
    if secure and strategy is None and family is None:
        family = exact_default_family(N)  # as OptimizedCounter
    op = _resolve_strategy(strategy, N, kind, family, time_limit)
    rows, plan, measured = _measurement(op, eps, r, bool(secure))
    var = row_variances(measured)
    steps = _Solver(rows, var).step_variances()
    total = float(steps.sum())
    return ContinualError(steps, total, total / N, float(plan.data_sensitivity), float(var.max()),
                          f"optimized [{op.name}], {kind}")
