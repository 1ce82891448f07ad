"""Mixed-radix tree, every node measured, full GLS (best linear unbiased) estimate: the lowest
pure ``epsilon``-DP error here (a Gaussian / ``rho``-zCDP variant uses ``Delta_2``).

Strategy ``M``: a tree over the ``N`` steps (leaves), built bottom-up with branching ``radices[l]``
at level ``l + 1`` (consecutive groups; the last group of a level may be smaller), topped by one
root.  Level ``l`` is measured with weight ``lambda_l``: ``y_u = lambda_l x(I_u) + z_u``,
``z_u ~ Lap(Delta_1 / epsilon)``.  Every step lies in exactly one node per level, so
``Delta_1(Sigma M) = sum_l lambda_l`` (normalised to 1): the Laplace mechanism, ``epsilon``-DP.
A level with ``lambda_l = 0`` (allowed for the root only) is not measured.  In sum units a level-``l``
node has variance ``v_l = 2 Delta_1^2 / (epsilon lambda_l)^2``.

Estimate: the GLS (Hay et al. 2010, per-node variances; :func:`sparsedp.tree_estimator.tree_gls`) of
the leaves from *all* nodes, ``x^ = G y``, ``G M = I``, and ``s~ = W x^ = s + W G z``.  The noise
offsets ``e = W G z`` do not depend on the data, so the counter draws all node noise at construction,
computes ``e`` in ``O(N)`` (two-pass GLS + cumulative sum) and releases ``s~_t = s_t + e_t`` online.
This is the factorisation mechanism ``B (Sigma M x + z)`` with ``B = W G Sigma^{-1}`` not lower
triangular (root and parents hold future steps); see :mod:`.adaptive` for why it is ``epsilon``-DP
also against adaptively chosen streams.

Error: ``sum_t Var(s~_t) = sum_u v_u ||W G e_u||^2`` (:func:`sparsedp.tree_estimator.tree_impulse_norms`),
and its gradient in the precisions ``p_u = 1 / v_u`` is ``-v_u^2 ||W G e_u||^2`` (from
``d tr(W (M^T P M)^{-1} W^T) = -||W (M^T P M)^{-1} m_u||^2 dp_u``), which drives the per-level weight
optimiser (L-BFGS on ``log lambda``).  Per-step variances come from :func:`path_variances`: along
the path of step ``t`` the estimate is a linear function of ``O(L)`` independent pieces (each path
node's own noise; the subtree estimates of the earlier and of the later siblings), so
``Var(s~_t)`` is exact in ``O(L^2)`` per step, vectorised over ``t``.

Default radices (:func:`default_radices`): radix 12 on every level.  Measured at ``N = 2^20 - 1``,
``eps = 1``, optimal level weights (mean per-step variance): radix 8: 780.9, 9: 781.2, 10: 772.6, 11: 754.1,
12: 748.7, 13: 752.1, 14: 765.2, 16: 786.6, 32: 851.1 (Qardaji, Yang and Li 2013 find about 16 best
for range queries with equal budgets).  A top level of a few nodes with the root left unmeasured
(weight 0) is what the optimiser picks.

Measurement path (issue 13): the measured nodes are interval rows (root first), and a level-``l``
node ``lambda_l x(I_u) + z_u`` is measured as ``x(I_u) + z_u / lambda_l`` -- per-row scales
``b / lambda_l`` on the 0/1 tree -- through :func:`sparsedp.measure.plan_measurement`, which
certifies the loss; all node noise comes from its stream at construction.  The per-node variances
``v_u`` (for the GLS weights and :meth:`GLSTreeCounter.step_variances`) are the plan's: exact
discrete variances with ``secure=True`` (the default; ``secure=False``: float64 noise, an opt-out).
Exact release (``secure=True``).  Mathematically ``s + e = W G y`` for the exact measurement ``y``;
an online GLS cannot wait for ``y`` (the root holds future steps), so it releases ``s_t + e_t``.  In
float64 that would reveal ``s_t`` (``e_t`` lies on a countable set fixed by the public estimator and
the noise lattice: measured at ``N = 13``, ``epsilon = 1``, an audited lower bound of 2.254 for a
claim of 1.0).  So the offsets are computed exactly, in integers, for the two-pass GLS with its
coefficients rounded to 64-bit dyadic rationals (still exactly unbiased), and each step releases the
correctly rounded float of the exact rational ``s_t + e_t``, a function of ``y`` alone
(:mod:`.exact_offsets`; the variance moves by a relative ``O(2^-128)`` from the optimal GLS's, which
:func:`path_variances` reports).  ``secure=False`` (float noise, an opt-out that leaks through the
noise's low bits anyway) keeps the float offsets.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np
import scipy.optimize

import scipy.sparse as sp

from ..errors import SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan
from ..privacy import Accountant
from ..strategies import TreeLayout
from ..tree_estimator import tree_gls, tree_impulse_norms, upward_variances
from ..validation import check_epsilon, check_rho
from ._stream import (
    MIN_RELATIVE_WEIGHT,
    RowNoise,
    OffsetCounter,
    check_accountant,
    check_secure,
    exact_level_sensitivity,
    measurable,
    plan_rows,
    row_variances,
    weighted_scales,
)
from .error import ContinualError, noise_calibration
from .exact_offsets import exact_tree_offsets
from .fenwick import check_horizon

__all__ = [
    "calibration",
    "mixed_layout",
    "default_radices",
    "gls_tree_weights",
    "gls_tree_error",
    "gls_noise_offsets",
    "gls_plan",
    "path_variances",
    "GLSTreeCounter",
]


def _check_radices(radices: Sequence[int]) -> tuple[int, ...]:
    out = []
    for r in radices:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or int(r) < 2:
            raise SparseDPError(f"radices must be integers >= 2, got {list(radices)!r}")
        out.append(int(r))
    return tuple(out)


def mixed_layout(N: int, radices: Sequence[int]) -> TreeLayout:
    """Tree over ``N`` leaves: level ``l + 1`` groups ``radices[l]`` consecutive level-``l`` nodes;
    radices left over once one node remains are ignored, and a root over everything is added if
    the radices run out first."""
    N = check_horizon(N, "N")
    radices = _check_radices(radices)
    return TreeLayout.grouped(N, lambda level, m: radices[level] if level < len(radices) else m)


def default_radices(N: int, k: int = 12) -> tuple[int, ...]:
    """Radix ``k`` on every level, as many levels as ``k^L >= N`` needs; the top level holds the
    ``ceil(N / k^{L-1})`` remaining nodes under one root (so ``N = 2^10 - 1`` gets
    ``1023 -> 86 -> 8 -> 1``; with ``k = 16``, ``1023 -> 64 -> 4 -> 1``)."""
    N = check_horizon(N, "N")
    levels, cover = 1, k
    while cover < N:
        cover *= k
        levels += 1
    return (k,) * levels


def calibration(lam: np.ndarray, epsilon: float | None = None, rho: float | None = None) -> tuple[str, float, float]:
    """``(kind, scale, variance)`` of the unit noise for per-level weights ``lam``: Laplace with
    ``Delta_1 = sum lambda`` (``epsilon``) or Gaussian with ``Delta_2 = sqrt(sum lambda^2)`` (``rho``);
    every step lies in exactly one node per level.  ``Delta`` is the exact value over the float
    weights rounded up (:func:`._stream.exact_level_sensitivity`), the scale rounded up again."""
    if (epsilon is None) == (rho is None):
        return noise_calibration(epsilon, rho, 1.0)  # raises the budget error
    return noise_calibration(epsilon, rho, exact_level_sensitivity(lam, 1 if rho is None else 2))


def _node_variances(layout: TreeLayout, lam: np.ndarray, epsilon: float | None, rho: float | None = None) -> np.ndarray:
    """``v_u = variance / lambda_l^2`` per node in strategy row order (inf: not measured)."""
    var = calibration(lam, epsilon, rho)[2]
    with np.errstate(divide="ignore"):
        per_level = var / lam**2
    return per_row(layout, per_level)


def per_row(layout: TreeLayout, per_level: np.ndarray) -> np.ndarray:
    """Spread per-level values over the nodes, in strategy row order (root first)."""
    return np.concatenate([np.full(layout.sizes[lev], per_level[lev]) for lev in reversed(range(layout.levels))])


def _total_and_grad(layout: TreeLayout, lam: np.ndarray, epsilon: float | None,
                    rho: float | None = None) -> tuple[float, np.ndarray]:
    """``sum_t Var(s~_t)`` and its gradient in ``lambda`` (with the sensitivity coupling)."""
    var = calibration(lam, epsilon, rho)[2]
    v = _node_variances(layout, lam, epsilon, rho)
    measured = np.isfinite(v)
    norms = tree_impulse_norms(layout, v, "prefix")
    total = float(v[measured] @ norms[measured])
    # d total / d p_u = -v_u^2 norms_u at fixed sensitivity; p_u = lambda_l^2 / variance
    dp = np.zeros(layout.levels)
    for lev in range(layout.levels):
        sl = slice(layout.row_offsets[lev], layout.row_offsets[lev] + layout.sizes[lev])
        if measured[sl][0]:
            dp[lev] = -float(v[sl] @ (v[sl] * norms[sl]))
    # the variance scales total; d var / d lambda_l = 2 var / sum(lambda) (Laplace),
    # 2 lambda_l var / sum(lambda^2) (Gaussian)
    dvar = 2.0 / lam.sum() if rho is None else 2.0 * lam / (lam**2).sum()
    return total, dp * 2.0 * lam / var + total * dvar


def gls_tree_weights(N: int, radices: Sequence[int] | None = None, measure_root: bool | None = None,
                     norm: int = 1) -> np.ndarray:
    """Per-level ``lambda`` (level 0 = leaves) minimising ``sum_t Var(s~_t)`` (see :func:`_optimise`;
    results are cached per ``(N, radices, measure_root, norm)`` in the process)."""
    N = check_horizon(N, "N")
    radices = default_radices(N) if radices is None else _check_radices(radices)
    return _optimise(N, radices, measure_root, norm).copy()


@functools.lru_cache(maxsize=32)
def _optimise(N: int, radices: tuple[int, ...], measure_root: bool | None, norm: int) -> np.ndarray:
    """Per-level ``lambda`` (level 0 = leaves) minimising ``sum_t Var(s~_t)``: for Laplace noise
    (``norm=1``, normalised to ``sum lambda = 1``) or Gaussian noise (``norm=2``, ``sum lambda^2 = 1``).

    At ``lambda_root = 0`` the derivative of the error in ``lambda_root`` is ``> 0`` (the sensitivity
    grows at once, the information only to second order), so the best root weight is either 0 or an
    interior optimum.  ``measure_root=None``: L-BFGS (exact gradients) without the root, then, if a
    root at the median level weight (or ``e^-1``, ``e^-2`` of it) beats that, L-BFGS from there;
    ``True`` / ``False`` force one.  A local method: the result is a valid weighting, not a certified
    optimum."""
    if norm not in (1, 2):
        raise SparseDPError(f"norm must be 1 (Laplace) or 2 (Gaussian), got {norm!r}")
    budget = {"epsilon": 1.0, "rho": None} if norm == 1 else {"epsilon": None, "rho": 0.5}
    layout = mixed_layout(N, radices)
    L = layout.levels
    if L == 1:
        return np.ones(1)

    def objective(free: int) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
        def f(q: np.ndarray) -> tuple[float, np.ndarray]:
            lam = _softmax(q, L)
            total, g_lam = _total_and_grad(layout, lam, **budget)
            # chain rule through lam = softmax(q): d lam_i / d q_j = lam_i (delta_ij - lam_j)
            g = lam[:free] * (g_lam[:free] - float(lam[:free] @ g_lam[:free]))
            return total / N, g / N
        return f

    def solve(q0: np.ndarray, f0: float) -> tuple[float, np.ndarray]:
        f = objective(q0.size)
        res = scipy.optimize.minimize(f, q0, jac=True, method="L-BFGS-B", options={"ftol": 1e-11, "gtol": 1e-8})
        return (float(res.fun), res.x) if res.fun <= f0 else (f0, q0)

    if measure_root is not None:
        q0 = np.zeros(L if measure_root else L - 1)
        q = solve(q0, objective(q0.size)(q0)[0])[1]
    else:
        # without the root first (fast); then, only if a root of (a fraction of) the median weight
        # beats that, with the root (an optimiser driving the root weight to 0 converges slowly)
        q0 = np.zeros(L - 1)
        fun, q = solve(q0, objective(L - 1)(q0)[0])
        starts = [np.append(q, np.median(q) - shift) for shift in (0.0, 1.0, 2.0)]
        f_start, start = min(((objective(L)(st)[0], st) for st in starts), key=lambda r: r[0])
        if f_start < fun:
            q = solve(start, f_start)[1]
    return _normalise(_softmax(q, L), norm)


def _softmax(q: np.ndarray, L: int) -> np.ndarray:
    """``L`` level weights from ``q.size <= L`` logits (levels above ``q.size``: 0)."""
    lam = np.zeros(L)
    lam[:q.size] = np.exp(q - q.max())
    return lam / lam.sum()


def _normalise(lam: np.ndarray, norm: int) -> np.ndarray:
    return lam / (lam.sum() if norm == 1 else np.sqrt((lam**2).sum()))


def _resolve(N: int, radices: Sequence[int] | None, weights: Any, norm: int = 1) -> tuple[TreeLayout, np.ndarray]:
    radices = default_radices(N) if radices is None else _check_radices(radices)
    layout = mixed_layout(N, radices)
    L = layout.levels
    if isinstance(weights, str):
        if weights == "optimal":
            return layout, gls_tree_weights(N, radices, norm=norm)
        if weights == "uniform":
            return layout, _normalise(np.ones(L), norm)
        raise SparseDPError(f"weights must be 'optimal', 'uniform' or an array, got {weights!r}")
    lam = np.asarray(weights, dtype=np.float64)
    if lam.shape != (L,) or not np.all(np.isfinite(lam)) or np.any(lam[:-1] <= 0) or lam[-1] < 0:
        raise SparseDPError(f"per-level weights must be {L} numbers, > 0 (the root, last, may be 0)")
    lam = lam / lam.max()
    if np.any((lam > 0) & (lam < MIN_RELATIVE_WEIGHT)):
        raise SparseDPError(f"per-level weights must lie within a factor {1 / MIN_RELATIVE_WEIGHT:g} of each other "
                            "(the root may be 0)")
    return layout, _normalise(lam, norm)


def path_variances(layout: TreeLayout, v: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """Exact ``Var(s~_t)``, ``t = 1..N``, of the GLS running sums for node variances ``v`` (row order).

    Along the path ``p_0`` (leaf ``t``) .. ``p_{L-1}`` (root) the estimate error is linear in: the own
    noise ``n_l`` of each path node, and ``A_l`` / ``B_l``, the sums of the subtree-estimate errors of
    the children of ``p_l`` before / after ``p_{l-1}`` (independent, variances ``VA_l``, ``VB_l``).
    Upward ``u_l = own_l n_l + (1 - own_l)(u_{l-1} + A_l + B_l)``; downward ``D_l = x_l - u_{l-1} -
    A_l - B_l``, ``x_{l-1} = u_{l-1} + share_l D_l``; the running sum's error is
    ``x_0 + sum_l (A_l + F_l D_l)`` (``F_l`` = summed shares of the earlier siblings).  Its coefficient
    on every piece is found by one pass per piece (the map is linear)."""
    L, N = layout.levels, layout.n
    var_z, V = upward_variances(layout, v)
    lv = [layout.level_rows(v, lev) for lev in range(L)]
    before = [np.empty(0)] + [_earlier_siblings(var_z[lev - 1], layout.child_starts[lev - 1])
                              for lev in range(1, L)]
    out = np.empty(N)
    for lo in range(0, N, chunk):
        idx = np.arange(lo, min(N, lo + chunk))
        anc = [idx]
        for lev in range(1, L):
            anc.append(np.searchsorted(layout.child_starts[lev - 1], anc[-1], side="right") - 1)
        own = [np.ones(idx.size)] + [var_z[lev][anc[lev]] / lv[lev][anc[lev]] for lev in range(1, L)]
        share, F, VA, VB = [None], [None], [None], [None]
        for lev in range(1, L):
            c, p = anc[lev - 1], anc[lev]
            Vp = V[lev][p]
            share.append(var_z[lev - 1][c] / Vp)
            F.append(before[lev][c] / Vp)
            VA.append(before[lev][c])
            VB.append(Vp - before[lev][c] - var_z[lev - 1][c])

        def run(kind: str, at: int) -> np.ndarray:
            one = np.ones(idx.size)
            zero = np.zeros(idx.size)
            n = [one if (kind == "n" and lev == at) else zero for lev in range(L)]
            A = [one if (kind == "A" and lev == at) else zero for lev in range(L)]
            B = [one if (kind == "B" and lev == at) else zero for lev in range(L)]
            u = [n[0]]
            for lev in range(1, L):
                u.append(own[lev] * n[lev] + (1.0 - own[lev]) * (u[-1] + A[lev] + B[lev]))
            x, e = u[L - 1], np.zeros(idx.size)
            for lev in range(L - 1, 0, -1):
                D = x - (u[lev - 1] + A[lev] + B[lev])
                e = e + A[lev] + F[lev] * D
                x = u[lev - 1] + share[lev] * D
            return e + x

        var = np.zeros(idx.size)
        for lev in range(L):
            if np.isfinite(lv[lev][0]):
                var += run("n", lev) ** 2 * lv[lev][anc[lev]]
            if lev:
                var += run("A", lev) ** 2 * VA[lev] + run("B", lev) ** 2 * np.maximum(VB[lev], 0.0)
        out[lo:lo + idx.size] = var
    return out


def _earlier_siblings(a: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per node, the sum of ``a`` over its earlier siblings (``starts`` = a level's ``child_starts``)."""
    before = np.concatenate(([0.0], np.cumsum(a)))
    return before[:-1] - np.repeat(before[starts[:-1]], np.diff(starts))


def gls_tree_error(N: int, epsilon: float | None = None, radices: Sequence[int] | None = None,
                   weights: Any = "optimal", per_step: bool = True, rho: float | None = None) -> ContinualError:
    """Exact variances of :class:`GLSTreeCounter` (``epsilon``: Laplace; ``rho``: Gaussian, zCDP).
    ``per_step=False`` skips the per-step array and returns the exact total from the impulse norms
    with an empty ``per_step``."""
    N = check_horizon(N)
    kind = calibration(np.ones(1), epsilon, rho)[0]  # validates the budget before any work
    layout, lam = _resolve(N, radices, weights, 1 if rho is None else 2)
    _, _, var = calibration(lam, epsilon, rho)
    v = _node_variances(layout, lam, epsilon, rho)
    if per_step:
        steps = path_variances(layout, v)
        total = float(steps.sum())
    else:
        steps = np.empty(0)
        total = _total_and_grad(layout, lam, epsilon, rho)[0]
    radix = "x".join(str(int(np.diff(cs).max())) for cs in layout.child_starts)
    return ContinualError(steps, total, total / N, 1.0, var, f"GLS tree [{radix}], {kind}")


def gls_plan(layout: TreeLayout, lam: np.ndarray, epsilon: float | None = None, rho: float | None = None, *,
             secure: bool = True, grid: float = 1.0) -> tuple[MeasurementPlan, np.ndarray]:
    """The measurement plan of the tree's measured nodes (interval rows, root first; a root of weight
    0 left out) with per-row scales ``b / lambda_l`` (Laplace, ``epsilon``) or ``sigma / lambda_l``
    (Gaussian, ``rho``), and the mask of measured rows (strategy row order; levels that
    :func:`._stream.measurable` refuses -- ``2^30`` times noisier than the best, or beyond the exact
    sampler's range -- are left out too: the GLS handles any unmeasured level).  Nothing is charged."""
    _, scale, _ = calibration(lam, epsilon, rho)
    level_scales = np.full(lam.size, np.inf)
    level_scales[lam > 0] = weighted_scales(scale, lam[lam > 0])
    keep = measurable(level_scales, secure, grid) & (lam > 0)
    weights = per_row(layout, np.where(keep, lam, 0.0))
    measured = weights > 0
    starts = [layout.leaf_starts[level] for level in reversed(range(layout.levels))]
    lo = np.concatenate([st[:-1] for st in starts])[measured]
    hi = np.concatenate([st[1:] for st in starts])[measured]
    rows = IntervalRows(layout.n, lo, hi, name=f"GLS tree nodes (N = {layout.n}, {int(measured.sum())} measured)")
    plan = plan_rows(rows, epsilon=epsilon, rho=rho, scales=weighted_scales(scale, weights[measured]),
                     secure=check_secure(secure), grid=grid)
    return plan, measured


def _offsets(layout: TreeLayout, measured: np.ndarray, plan: MeasurementPlan,
             z_measured: np.ndarray) -> tuple[np.ndarray, np.ndarray, Any]:
    """``(z, v, e)``: per-node noise (sum units; 0 unmeasured), variances (``inf`` unmeasured) and
    the running-sum offsets ``e = W G z``: exact (:class:`~.exact_offsets.ExactOffsets`, the dyadic
    two-pass GLS) with exact noise, float64 otherwise."""
    z = np.zeros(layout.nodes)
    z[measured] = z_measured
    v = np.full(layout.nodes, np.inf)
    v[measured] = row_variances(plan)
    if plan.secure:
        return z, v, exact_tree_offsets(layout, z, v, plan.grid)
    return z, v, np.cumsum(tree_gls(layout, z, v))


def gls_noise_offsets(layout: TreeLayout, lam: np.ndarray, epsilon: float | None = None,
                      rng: Any = None, rho: float | None = None, *, secure: bool = True,
                      accountant: Accountant | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Draw, through :func:`gls_plan`'s measurement (charged to ``accountant`` once, before the
    draw), the noise ``z_u`` of scale ``b / lambda_l`` (``sigma / lambda_l``) of every measured node
    and return ``(z, e)``: ``z`` in sum units and strategy row order (0 for an unmeasured root) and
    the running-sum offsets ``e = W G z`` (``O(N)``)."""
    plan, measured = gls_plan(layout, lam, epsilon, rho, secure=secure)
    noise = RowNoise.open(plan, check_accountant(accountant), rng, f"continual: GLS tree offsets, horizon {layout.n}")
    z, _, e = _offsets(layout, measured, plan, noise.all())
    return z, (e.floats() if hasattr(e, "floats") else e)


class GLSTreeCounter(OffsetCounter):
    """Online counter: ``s~_t = s_t + e_t`` with ``e = W G z`` the GLS running-sum error of a
    mixed-radix tree, every node measured (see the module docstring).

    Privacy: ``Delta_1(Sigma M) = sum_l lambda_l = 1``, ``z ~ Lap(1 / epsilon)`` per node: ``epsilon``-DP
    for any stream, also chosen adaptively (:mod:`.adaptive`).  With ``rho`` instead:
    ``Delta_2(Sigma M) = sqrt(sum_l lambda_l^2) = 1``, ``z ~ N(0, 1 / (2 rho))``: ``rho``-zCDP (non-adaptive
    streams; for adaptive ones Denisov et al. 2022).  Cost: ``O(N)`` time and memory at construction
    (all noise is drawn then), ``O(1)`` per step.  ``secure=True`` (default): exact discrete noise;
    ``secure=False``: float64 noise (an explicit opt-out).
    """

    name = "gls-tree"

    def __init__(self, horizon: int, epsilon: float | None = None, radices: Sequence[int] | None = None,
                 weights: Any = "optimal", rng: Any = None, rho: float | None = None, *,
                 increments: str = "counts", accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.kind = calibration(np.ones(1), epsilon, rho)[0]  # exactly one budget
        self.epsilon = None if epsilon is None else check_epsilon(epsilon, "epsilon")
        self.rho = None if rho is None else check_rho(rho, "rho")
        self.layout, self.lam = _resolve(self.horizon, radices, weights, 1 if rho is None else 2)
        # every step lies in exactly one node per level: Delta_1 = sum lambda, Delta_2 = sqrt(sum lambda^2),
        # exact over the float weights and rounded up (tests check it against the measured matrix)
        self.sensitivity = exact_level_sensitivity(self.lam, 1 if rho is None else 2)
        _, self.scale, _ = calibration(self.lam, self.epsilon, self.rho)
        measured: list[np.ndarray] = []

        def build(grid: float) -> MeasurementPlan:
            plan, mask = gls_plan(self.layout, self.lam, self.epsilon, self.rho, secure=self.secure, grid=grid)
            measured[:] = [mask]
            return plan

        self._make_plan(build)
        self._open(accountant, rng)  # charges, before the noise of every node is drawn, below
        self._measured = measured[0]
        self._v_nodes = np.full(self.layout.nodes, np.inf)
        self._v_nodes[self._measured] = row_variances(self.plan)
        self._set_offsets(self._noise.all())

    def _offsets_from(self, z: np.ndarray) -> Any:
        """``e = W G z`` for the measured nodes' noise ``z`` (what the constructor computes: exact
        offsets with exact noise)."""
        return _offsets(self.layout, self._measured, self.plan, z)[2]

    def measured_strategy(self) -> sp.csr_matrix:
        """The tree's rows (root first, 0/1), unmeasured levels (a root of weight 0) left out; the
        weights are in :meth:`noise_scales` (``b / lambda_l``)."""
        return super().measured_strategy()

    def node_variances(self) -> np.ndarray:
        """Per node (strategy row order) the variance of its measurement in sum units, from the plan
        (``inf``: not measured)."""
        return self._v_nodes.copy()

    def _all_step_variances(self) -> np.ndarray:
        """``Var(s~_t)`` for every step, ``O(N L^2)`` (:func:`path_variances`)."""
        return path_variances(self.layout, self._v_nodes)
