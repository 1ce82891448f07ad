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

Measurement path (issue 13): the strategy is the set of blocks some step uses (interval rows), in
the order of their first use (``t``, then levels from the top, then position; the block ranges move
forward monotonically, so the order is computed in ``O(N)`` at construction), measured through
:func:`sparsedp.measure.plan_measurement` with per-row scales ``b / lambda_l`` (weights as per-row
scales on 0/1 blocks), which certifies the loss; the noise comes from its stream in that order.
A block's noise ``z`` then has scale ``b / lambda_l`` directly, and ``s~_t = s_t + sum_l sign(d_l)
sum z`` is an exact integer (lattice) computation with exact noise (``secure=True``, the default):
the signed blocks tile ``[0, t)``, so this is exactly ``sum_l sign(d_l) sum y_block`` of the
measured ``y = x(block) + z``.  ``secure=False``: float64 noise (an explicit opt-out).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import scipy.sparse as sp

from ..calibration import laplace_scale
from ..errors import SparseDPError
from ..intervals import IntervalRows
from ..privacy import Accountant
from ..validation import check_epsilon
from ._stream import StreamingCounter, check_accountant, exact_level_sensitivity, plan_rows, weighted_scales
from ._stream import row_variances
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


def first_use_blocks(N: int, k: int, levels: int) -> tuple[IntervalRows, np.ndarray, list[np.ndarray]]:
    """The blocks :class:`NegDigitCounter` uses, as interval rows in the order of their first use,
    with each row's level and, per level, the row of block ``j`` (``-1``: never used).  Blocks are
    not cut at ``N``: the rows' columns extend past ``N`` with phantom steps that are always 0.

    At step ``t`` level ``l`` uses the blocks ``j`` in ``[min(p_l, p_{l+1}), max(p_l, p_{l+1})) / k^l``
    (``p_l`` = ``t`` rounded to the nearest multiple of ``k^l``, ``p_levels = 0``); both ends are
    non-decreasing in ``t``, so block ``j`` is first used at the first ``t`` whose upper end passes
    ``j``, if the lower end is not already past it (else never).  Within a step the counter visits
    the levels from the top and the blocks in order."""
    t = np.arange(1, N + 1, dtype=np.int64)
    above = np.zeros(N, dtype=np.int64)
    keys, lo_cols, hi_cols, lev_of = [], [], [], []
    for level in reversed(range(levels)):
        size = k**level
        half = (size - 1) // 2
        p = t - (((t + half) % size) - half)
        lo, hi = np.minimum(p, above) // size, np.maximum(p, above) // size
        j = np.arange(int(hi.max()) if N else 0, dtype=np.int64)
        first = np.searchsorted(hi, j, side="right")  # 0-based step index of the first t with hi > j
        used = first < N
        used[used] = lo[first[used]] <= j[used]
        j, first = j[used], first[used]
        keys.append(np.stack([first, np.full(j.size, levels - 1 - level), j]))
        lo_cols.append(j * size)
        hi_cols.append((j + 1) * size)
        lev_of.append(np.full(j.size, level))
        above = p
    key = np.concatenate(keys, axis=1)
    order = np.lexsort(key[::-1])  # by first use, then level from the top, then position
    lo_c, hi_c = np.concatenate(lo_cols)[order], np.concatenate(hi_cols)[order]
    level_of = np.concatenate(lev_of)[order]
    # a negative digit can subtract blocks that lie wholly after step N (rounded-up p_{l+1}): they
    # hold no step, and the columns past N are phantom steps that are always 0 (no data, only noise)
    cols = max(N, int(hi_c.max()))
    rows = IntervalRows(cols, lo_c, hi_c, name=f"{k}-ary negative-digit blocks (N = {N}, {cols - N} phantom steps)")
    row_of = []
    for level in range(levels):
        size = k**level
        idx = np.flatnonzero(level_of == level)
        table = np.full(-(-cols // size) + 1, -1, dtype=np.int64)
        table[lo_c[idx] // size] = idx
        row_of.append(table)
    return rows, level_of, row_of


class NegDigitCounter(StreamingCounter):
    """Online negative-digit k-ary tree counter (see the module docstring)."""

    name = "negdigit"

    def __init__(self, horizon: int, epsilon: float, k: int = 19, weights: Any = "optimal", rng: Any = None, *,
                 increments: str = "counts", accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.k = _check_k(k)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.lam = _level_weights(self.horizon, self.k, weights)
        self.levels = self.lam.size
        self.sensitivity = exact_level_sensitivity(self.lam, 1)  # one block per level holds a step
        self.scale = laplace_scale(self.sensitivity, self.epsilon)
        rows, level_of, self._row_of = first_use_blocks(self.horizon, self.k, self.levels)
        scales = weighted_scales(self.scale, self.lam[level_of])
        self._make_plan(lambda grid: plan_rows(rows, epsilon=self.epsilon, rho=None, scales=scales,
                                               secure=self.secure, grid=grid))
        var = row_variances(self.plan)
        self._s2 = [float(var[np.argmax(level_of == lev)]) if np.any(level_of == lev) else 0.0
                    for lev in range(self.levels)]  # every block of a level has the same scale
        self._z: list[dict[int, float]] = [{} for _ in range(self.levels)]
        self._p = [-1] * self.levels  # (p_l, p_{l+1}) of the cached contribution of each level
        self._above = [-1] * self.levels
        self._contrib = [0.0] * self.levels
        self._var = [0.0] * self.levels
        self._s = 0.0
        self._open(accountant, rng)

    def measured_strategy(self) -> sp.csr_matrix:
        """Every block some step uses (0/1 rows in the order of first use, restricted to the ``N``
        real steps: a block past ``N`` is a row of zeros, pure noise); the weights are in
        :meth:`noise_scales` (``b / lambda_l``)."""
        return sp.csr_matrix(super().measured_strategy()[:, : self.horizon])

    def _node(self, level: int, index: int) -> float:
        z = self._z[level]
        if index not in z:
            z[index] = self._noise.at(int(self._row_of[level][index]))
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
                self._contrib[level] = total if d >= 0 else -total  # z already of scale b / lambda
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
