"""k-ary tree counters with optimal per-level weights and streaming best linear estimates (pure DP).

Tree: level ``l`` nodes cover aligned blocks of ``k^l`` steps; a node is measured once, when its
block is complete, for levels ``l = 0 .. L-1`` (``L`` = number of base-``k`` digits of ``N``; a
level-``L`` block would never complete).  Weights ``lambda_l`` per level: node ``y = lambda_l *
(block sum) + Lap(Delta_1 / epsilon)`` with ``Delta_1 = sum_l lambda_l`` (one node per level holds a
given increment), so the run is ``epsilon``-DP; in sum units a level-``l`` node has variance
``sigma_l^2 = 2 Delta_1^2 / (epsilon lambda_l)^2``.

Streaming estimate (Honaker 2015, generalised to ``k`` children and per-level variances): a completed
node is estimated from its own subtree, ``v_0 = sigma_0^2``,
``v_l = 1 / (1 / sigma_l^2 + 1 / (k v_{l-1}))``.  No other released measurement informs it (nodes
outside are on disjoint data; ancestors are not measured yet), so this is the best linear unbiased
estimate given the past.  ``s~_t`` is the sum of the estimates of the completed children of the
current path, ``digit_l(t)`` of them at level ``l``: ``Var(s~_t) = sum_l digit_l(t) v_l``.
For ``k = 2`` and equal weights this is :class:`HonakerCounter` exactly.

Optimal per-level weights minimise the mean of that variance over ``t = 1..N`` subject to
``sum lambda_l = 1`` (``L`` variables, SLSQP).

The negative-digit variant (Andersson, Pagh, Torkamani 2024) is :mod:`.negdigit`.

``Delta_1`` is the exact sum of the float level weights rounded up, the scale ``Delta_1 / epsilon``
rounded up.  The blocks are interval rows measured through
:func:`sparsedp.measure.plan_measurement` with per-row scales ``b / lambda_l`` (a weighted row is a
per-row scale on the 0/1 block, so exact noise needs no rounding of the strategy), which certifies
their loss exactly: a node is ``y = x(block) + z``, ``z`` of scale ``b / lambda_l``, and every
estimate is a fixed linear combination of the ``y`` (exact on the lattice with exact noise).  The
streaming estimate uses the plan's per-row variances (exact discrete ones with ``secure=True``, the
default; ``secure=False``: float64 noise, an explicit opt-out).  ``increments=``, ``accountant=``
and ``secure=`` as in :mod:`._stream`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import scipy.optimize

import scipy.sparse as sp

from ..calibration import laplace_scale
from ..errors import SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan
from ..privacy import Accountant
from ..validation import check_epsilon
from ._stream import (
    MIN_RELATIVE_WEIGHT,
    StreamingCounter,
    measurable,
    check_accountant,
    completed_blocks,
    exact_level_sensitivity,
    plan_rows,
    row_variances,
    weighted_scales,
)
from .error import ContinualError
from .fenwick import check_horizon

__all__ = ["kary_levels", "kary_digit_means", "kary_level_variances", "kary_weights", "kary_error", "KaryCounter"]


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 2:
        raise SparseDPError(f"branching k must be an integer >= 2, got {k!r}")
    return int(k)


def kary_levels(N: int, k: int) -> int:
    """``L``: the number of base-``k`` digits of ``N``."""
    N, k = check_horizon(N), _check_k(k)
    L = 0
    while N > 0:
        N //= k
        L += 1
    return L


def _digit_sum(N: int, k: int, coeffs: np.ndarray) -> np.ndarray:
    """``out[t-1] = sum_l coeffs[l] * digit_l(t)`` for ``t = 1..N`` (one level at a time)."""
    t = np.arange(1, N + 1, dtype=np.int64)
    out = np.zeros(N)
    for level, c in enumerate(coeffs):
        out += c * ((t // k**level) % k)
    return out


def kary_digit_means(N: int, k: int) -> np.ndarray:
    """Mean over ``t = 1..N`` of ``digit_l(t)``, per level."""
    N, k = check_horizon(N), _check_k(k)
    t = np.arange(1, N + 1, dtype=np.int64)
    return np.array([((t // k**level) % k).mean() for level in range(kary_levels(N, k))])


def kary_level_variances(lam: np.ndarray, k: int, epsilon: float) -> np.ndarray:
    """``v_l`` (subtree estimates) for per-level weights ``lam`` (``Delta_1 = sum lam``)."""
    lam = np.asarray(lam, dtype=np.float64)
    eps = check_epsilon(epsilon, "epsilon")
    with np.errstate(divide="ignore", over="ignore"):  # lambda -> 0: the level carries no information
        s2 = 2.0 * lam.sum() ** 2 / (eps * lam) ** 2
    v = np.empty(lam.size)
    v[0] = s2[0]
    for level in range(1, lam.size):
        v[level] = 1.0 / (1.0 / s2[level] + 1.0 / (k * v[level - 1]))
    return v


def kary_weights(N: int, k: int) -> np.ndarray:
    """Per-level ``lambda`` (summing to 1) minimising the mean per-step variance."""
    k = _check_k(k)
    D = kary_digit_means(N, k)
    L = D.size
    if L == 1:
        return np.ones(1)

    def f(q: np.ndarray) -> float:
        lam = np.exp(q - q.max())
        return float(D @ kary_level_variances(lam / lam.sum(), k, 1.0))

    q0 = np.zeros(L)
    res = scipy.optimize.minimize(f, q0, method="L-BFGS-B", options={"ftol": 1e-14, "gtol": 1e-10})
    q = res.x if res.fun <= f(q0) else q0
    lam = np.maximum(np.exp(q - q.max()), 1e-9)  # no level is left unmeasured
    return lam / lam.sum()


def kary_error(N: int, k: int, epsilon: float, weights: Any = "optimal") -> ContinualError:
    """Exact per-step variances of :class:`KaryCounter` (``weights`` = ``"optimal"``, ``"uniform"``
    or per-level array)."""
    N, k = check_horizon(N), _check_k(k)
    L = kary_levels(N, k)
    lam = level_weights(weights, L, lambda: kary_weights(N, k))
    v = kary_level_variances(lam, k, epsilon)
    per_step = _digit_sum(N, k, v)
    total = float(per_step.sum())
    eps = check_epsilon(epsilon, "epsilon")
    return ContinualError(per_step, total, total / N, 1.0, 2.0 / eps**2, f"{k}-ary")


def level_weights(weights: Any, L: int, optimal: Callable[[], np.ndarray]) -> np.ndarray:
    """Per-level weights from ``"optimal"`` (calls ``optimal()``), ``"uniform"`` or ``L`` positive
    numbers; normalised to sum to 1 (``Delta_1 = 1``)."""
    if isinstance(weights, str):
        if weights == "optimal":
            return optimal()
        if weights == "uniform":
            return np.full(L, 1.0 / L)
        raise SparseDPError(f"weights must be 'optimal', 'uniform' or an array, got {weights!r}")
    lam = np.asarray(weights, dtype=np.float64)
    if lam.shape != (L,) or not np.all(np.isfinite(lam)) or np.any(lam <= 0):
        raise SparseDPError(f"per-level weights must be {L} positive numbers")
    lam = lam / lam.max()
    if lam.min() < MIN_RELATIVE_WEIGHT:
        raise SparseDPError(f"per-level weights must lie within a factor {1 / MIN_RELATIVE_WEIGHT:g} of each other")
    return lam / lam.sum()


class KaryCounter(StreamingCounter):
    """Online k-ary tree counter (see module docstring); ``O(k log_k N)`` state."""

    name = "kary"

    def __init__(self, horizon: int, epsilon: float, k: int = 16, weights: Any = "optimal", rng: Any = None, *,
                 increments: str = "counts", accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.k = _check_k(k)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        L = kary_levels(self.horizon, self.k)
        self.lam = level_weights(weights, L, lambda: kary_weights(self.horizon, self.k))
        # one measured node per level holds a step: Delta_1 = sum lambda (= 1 up to rounding), exactly
        self.sensitivity = exact_level_sensitivity(self.lam, 1)
        self.scale = laplace_scale(self.sensitivity, self.epsilon)
        all_rows, all_level = completed_blocks(self.horizon, self.k, L, f"{self.k}-ary")
        level_scales = weighted_scales(self.scale, self.lam)
        kept: list[np.ndarray] = []

        def build(grid: float) -> MeasurementPlan:
            keep = measurable(level_scales, self.secure, grid)  # too-noisy levels are not measured
            sel = keep[all_level]
            rows = IntervalRows(self.horizon, all_rows.lo[sel], all_rows.hi[sel], name=all_rows.name)
            kept[:] = [keep, all_level[sel]]
            return plan_rows(rows, epsilon=self.epsilon, rho=None, scales=level_scales[all_level[sel]],
                             secure=self.secure, grid=grid)

        self._make_plan(build)
        self.measured_levels, level = kept
        var = row_variances(self.plan)
        s2 = np.full(L, np.inf)  # per level: every row of a level has the same scale
        for lev in np.flatnonzero(self.measured_levels):
            s2[lev] = var[int(np.argmax(level == lev))]
        v = [float(s2[0])]
        for lev in range(1, L):
            v.append(1.0 / (1.0 / float(s2[lev]) + 1.0 / (self.k * v[-1])))  # s2 = inf: k v (children only)
        self._v, self._s2 = v, s2.tolist()
        self._true: list[list[float]] = [[] for _ in range(L)]
        self._est: list[list[float]] = [[] for _ in range(L)]
        self._est_sum = [0.0] * L
        self._open(accountant, rng)

    def measured_strategy(self) -> sp.csr_matrix:
        """Level ``l = 0 .. L-1``: every complete block of ``k^l`` steps (0/1 rows, in the order they
        complete); the weights are in :meth:`noise_scales` (``b / lambda_l``)."""
        return super().measured_strategy()

    def _measure(self, level: int, true: float) -> float:
        if not self.measured_levels[level]:
            return 0.0  # an unmeasured level: its weight 1 / s2 = 0 in the estimate
        return true + self._noise.draw()  # y = x(block) + z, z of scale b / lambda_level

    def _step(self, a: float) -> float:
        v, s2, k = self._v, self._s2, self.k
        true, est = a, self._measure(0, a)
        level = 0
        while True:
            self._true[level].append(true)
            self._est[level].append(est)
            self._est_sum[level] += est
            if len(self._true[level]) < k or level + 1 >= len(self._true):
                break
            # the level+1 block is complete: measure it and combine with its children
            true = math.fsum(self._true[level])
            kids = self._est_sum[level]
            y = self._measure(level + 1, true)
            est = v[level + 1] * (y / s2[level + 1] + kids / (k * v[level]))
            self._true[level].clear()
            self._est[level].clear()
            self._est_sum[level] = 0.0
            level += 1
        self.last_variance = sum(len(e) * v[i] for i, e in enumerate(self._est))
        return sum(self._est_sum)
