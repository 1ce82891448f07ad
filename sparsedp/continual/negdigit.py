"""k-ary tree with negative digits (Andersson, Pagh, Torkamani 2024), pure ``epsilon``-DP.

For odd ``k`` (``m = (k - 1) / 2``) write ``t`` in the balanced base-``k`` system,
``t = sum_l d_l k^l`` with ``d_l`` in ``{-m, .., m}``: ``r_l(t) = ((t + c_l) mod k^l) - c_l``,
``c_l = (k^l - 1) / 2``, ``p_l = t - r_l`` (a multiple of ``k^l``) and ``d_l = (p_l - p_{l+1}) / k^l``.
Then ``[0, t) = sum_l sign(d_l) * (|d_l| aligned level-l blocks between p_{l+1} and p_l)``: about
``(k^2 - 1) / (4k)`` blocks per level on average instead of ``(k - 1) / 2`` with ordinary digits.
Levels ``l = 0 .. H`` with ``k^{H+1} >= 2N + 1`` (then ``p_{H+1} = 0`` for every ``t <= N``).

Release (the matrix mechanism ``B (Sigma M x + z)`` written as ``s_t + noise``): every aligned block
(node) ``v`` at level ``l`` has one noise value ``z_v ~ Lap(Delta_1 / epsilon)``, scaled by
``1 / lambda_l``; step ``t`` releases ``s_t + sum_l sign(d_l) sum_{v in blocks_l(t)} z_v / lambda_l``.
Since the signed blocks add up to ``[0, t)`` exactly, this *is* ``B Sigma^{-1}(Sigma M x + z)`` with
``M`` = all blocks, and it is a post-processing of the Laplace mechanism on ``Sigma M x``, whose L1
sensitivity is ``Delta_1 = sum_l lambda_l`` (an increment lies in one block per level).  Blocks with a
negative sign end after ``t``: their noise is drawn when first needed (they are never "measured" from
data), so the release is online even though ``M`` is not lower triangular.  Which noise values are
drawn at step ``t`` depends on ``t`` only, so the offsets ``s~_t - s_t`` have the same joint law as
with all noise drawn ahead and do not depend on the data: the run is ``epsilon``-DP also for
adaptively chosen streams (proof in :mod:`.adaptive`; a test plays the adaptive game).
``Var(s~_t) = sum_l |d_l(t)| 2 Delta_1^2 / (epsilon lambda_l)^2``.

Per-level weights: minimising the mean variance ``sum_l D_l / lambda_l^2`` (``D_l`` = mean ``|d_l|``)
subject to ``sum lambda_l = 1`` gives ``lambda_l = D_l^{1/3} / sum_j D_j^{1/3}`` (Lagrange), and the
mean variance ``2 (sum_l D_l^{1/3})^3 / epsilon^2``.

Streaming: level ``l``'s signed block sum changes only when ``p_l`` changes (every ``k^l`` steps), so
an update recomputes ``O(m)`` noise terms amortised; noise of blocks that can no longer be used (more
than ``k^{l+1}`` behind ``t``) is discarded, so the state is ``O(k log_k N)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import scipy.sparse as sp

from ..calibration import laplace_scale
from ..errors import SparseDPError
from ..privacy import Accountant
from ..validation import check_epsilon
from ._stream import BufferedNoise, StreamingCounter, check_accountant, exact_level_sensitivity, level_strategy
from .error import ContinualError
from .fenwick import check_horizon
from .kary import level_weights

__all__ = ["negdigit_levels", "balanced_digits", "negdigit_weights", "negdigit_error", "NegDigitCounter"]


def _check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 3 or int(k) % 2 == 0:
        raise SparseDPError(f"the negative-digit tree needs an odd branching k >= 3, got {k!r}")
    return int(k)


def negdigit_levels(N: int, k: int) -> int:
    """Number of levels ``H + 1``: the smallest with ``k^{H+1} >= 2N + 1``."""
    N, k = check_horizon(N), _check_k(k)
    L, size = 1, k
    while size < 2 * N + 1:
        size *= k
        L += 1
    return L


def balanced_digits(t: np.ndarray | int, k: int, levels: int) -> np.ndarray:
    """``(levels, len(t))`` balanced digits ``d_l(t)`` (``sum_l d_l k^l = t``, ``|d_l| <= (k-1)/2``)."""
    k = _check_k(k)
    t = np.atleast_1d(np.asarray(t, dtype=np.int64))
    p = [t - (((t + (k**level - 1) // 2) % k**level) - (k**level - 1) // 2) for level in range(levels + 1)]
    return np.stack([(p[level] - p[level + 1]) // k**level for level in range(levels)])


def _mean_abs_digits(N: int, k: int, levels: int) -> np.ndarray:
    t = np.arange(1, N + 1, dtype=np.int64)
    return np.array([np.abs(d).mean() for d in balanced_digits(t, k, levels)])


def negdigit_weights(N: int, k: int) -> np.ndarray:
    """Optimal per-level ``lambda_l = D_l^{1/3} / sum_j D_j^{1/3}`` (levels never used get a tiny weight)."""
    N, k = check_horizon(N), _check_k(k)
    D = _mean_abs_digits(N, k, negdigit_levels(N, k))
    w = np.maximum(np.cbrt(D), 1e-9)
    return w / w.sum()


def _level_weights(N: int, k: int, weights: Any) -> np.ndarray:
    return level_weights(weights, negdigit_levels(N, k), lambda: negdigit_weights(N, k))


def negdigit_error(N: int, k: int, epsilon: float, weights: Any = "optimal") -> ContinualError:
    """Exact per-step variances of :class:`NegDigitCounter`."""
    N, k = check_horizon(N), _check_k(k)
    eps = check_epsilon(epsilon, "epsilon")
    lam = _level_weights(N, k, weights)
    s2 = 2.0 / (eps * lam) ** 2  # Delta_1 = sum lambda = 1
    t = np.arange(1, N + 1, dtype=np.int64)
    per_step = np.zeros(N)
    for level, d in enumerate(balanced_digits(t, k, lam.size)):
        per_step += np.abs(d) * s2[level]
    total = float(per_step.sum())
    return ContinualError(per_step, total, total / N, 1.0, 2.0 / eps**2, f"{k}-ary negative digits")


class NegDigitCounter(StreamingCounter):
    """Online negative-digit k-ary tree counter (see the module docstring)."""

    name = "negdigit"

    def __init__(self, horizon: int, epsilon: float, k: int = 19, weights: Any = "optimal", rng: Any = None, *,
                 increments: str = "counts", accountant: Accountant | None = None) -> None:
        super().__init__(horizon, increments)
        accountant = check_accountant(accountant)
        self.k = _check_k(k)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.lam = _level_weights(self.horizon, self.k, weights)
        self.levels = self.lam.size
        self.sensitivity = exact_level_sensitivity(self.lam, 1)  # one block per level holds a step
        self.scale = laplace_scale(self.sensitivity, self.epsilon)
        self._noise = BufferedNoise("laplace", self.scale, rng)
        self._s2 = 2.0 * self.sensitivity**2 / (self.epsilon * self.lam) ** 2
        self._z: list[dict[int, float]] = [{} for _ in range(self.levels)]
        self._p = [-1] * self.levels  # (p_l, p_{l+1}) of the cached contribution of each level
        self._above = [-1] * self.levels
        self._contrib = [0.0] * self.levels
        self._var = [0.0] * self.levels
        self._s = 0.0
        self._charge(accountant)

    def measured_strategy(self) -> sp.csr_matrix:
        """Level ``l``: every aligned block of ``k^l`` steps that holds a step (the last cut at ``N``),
        weighted ``lambda_l`` -- the implicit measurements ``lambda_l x(block) + z_block``."""
        return level_strategy(self.horizon, [(self.k**lev, float(w), False) for lev, w in enumerate(self.lam)])

    def noise_scales(self) -> np.ndarray:
        return np.full(self.measured_strategy().shape[0], self.scale)

    def _node(self, level: int, index: int) -> float:
        z = self._z[level]
        if index not in z:
            z[index] = self._noise.draw()
        return z[index]

    def _step(self, a: float) -> float:
        t = self.t + 1
        k = self.k
        self._s += a
        p_above = 0
        for level in reversed(range(self.levels)):
            size = k**level
            half = (size - 1) // 2
            p = t - (((t + half) % size) - half)
            if p != self._p[level] or p_above != self._above[level]:
                d = (p - p_above) // size
                lo, hi = (p_above // size, p // size) if d >= 0 else (p // size, p_above // size)
                total = sum(self._node(level, j) for j in range(lo, hi))
                self._contrib[level] = (total if d >= 0 else -total) / self.lam[level]
                self._var[level] = abs(d) * self._s2[level]
                self._p[level] = p
                self._above[level] = p_above
                self._prune(level, t)
            p_above = p
        self.last_variance = float(sum(self._var))
        return self._s + sum(self._contrib)

    def _prune(self, level: int, t: int) -> None:
        z = self._z[level]
        floor = (t - self.k ** (level + 1)) // self.k**level - 1
        for j in [j for j in z if j < floor]:
            del z[j]
