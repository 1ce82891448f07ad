"""Baseline continual counters (pure ``epsilon``-DP, Laplace), each with its exact per-step variance.

* :class:`NaiveCounter` -- every increment gets ``Lap(1/epsilon)`` (sensitivity 1) and the output is
  the running sum of noisy increments: ``Var(s~_t) = 2 t / epsilon^2``.
* :class:`BinaryMechanism` -- Chan, Shi and Song (ACM TISSEC 2011), Algorithm 2: p-sums
  ``alpha_i`` over dyadic blocks, each with ``Lap(L / epsilon)``, ``L = floor(log2 N) + 1`` levels
  (every increment is in one p-sum per level).  ``s~_t`` adds the p-sums of the binary digits of
  ``t``: ``Var = popcount(t) 2 L^2 / epsilon^2``.  Its p-sums are exactly the Fenwick nodes, so it
  *is* the unweighted Fenwick release (:func:`unweighted_fenwick`; a test checks equal outputs).
* :class:`HonakerCounter` -- the binary tree with *every* node measured (``Lap(L / epsilon)``; still
  one node per level per increment) and Honaker's (2015) streaming estimate: the best linear unbiased
  estimate of a completed node from its own subtree, ``v_0 = sigma^2``,
  ``v_h = 1 / (1 / sigma^2 + 1 / (2 v_{h-1}))``, ``est_h = v_h (y / sigma^2 + (l + r) / (2 v_{h-1}))``;
  ``s~_t`` adds the subtree estimates of the digits of ``t``: ``Var = sum_{h in digits(t)} v_h``.

Every counter takes ``increments=`` (the enforced increment domain), ``accountant=`` (charged
``epsilon`` once, in the constructor, before any noise is drawn) and ``secure=`` (default ``True``:
exact discrete Laplace noise; ``False``: float64 noise, an explicit opt-out): see :mod:`._stream`.
Their strategies are interval rows (steps, Fenwick nodes, dyadic blocks) measured through
:func:`sparsedp.measure.plan_measurement`, which computes ``Delta_1`` from the rows (exact integer
coverage) and the scale ``Delta_1 / epsilon`` rounded up; ``measured_strategy()`` /
``noise_scales()`` expose the matrix measured and its per-row scales.  Every output is a sum (or,
for Honaker, a fixed linear combination) of measured values ``y_i = x(I_i) + z_i``, computed from
the ``y`` (exact on the lattice with exact noise).  The variance formulas below are those of float
Laplace noise; with exact noise ``last_variance`` uses the exact discrete variance (slightly smaller).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..intervals import IntervalRows
from ..privacy import Accountant
from ..validation import check_epsilon
from ._stream import StreamingCounter, check_accountant, completed_blocks, fenwick_rows, identity_rows, plan_rows
from ._stream import row_variances
from .counter import ContinualCounter
from .fenwick import check_horizon, fenwick_matrices

__all__ = [
    "NaiveCounter",
    "BinaryMechanism",
    "HonakerCounter",
    "unweighted_fenwick",
    "naive_variance",
    "binary_variance",
    "honaker_variance",
    "honaker_level_variances",
]


def _digit_sum(N: int, per_level: np.ndarray) -> np.ndarray:
    """``out[t-1] = sum over set bits h of t of per_level[h]`` for ``t = 1..N``, vectorised."""
    t = np.arange(1, N + 1, dtype=np.int64)
    out = np.zeros(N)
    for h in range(N.bit_length()):
        out += ((t >> h) & 1) * per_level[h]
    return out


def naive_variance(N: int, epsilon: float) -> np.ndarray:
    """``Var(s~_t) = 2 t / epsilon^2`` of :class:`NaiveCounter`."""
    N, eps = check_horizon(N), check_epsilon(epsilon, "epsilon")
    return 2.0 * np.arange(1, N + 1) / eps**2


def binary_variance(N: int, epsilon: float) -> np.ndarray:
    """``Var(s~_t) = popcount(t) 2 L^2 / epsilon^2`` of :class:`BinaryMechanism` (``L = bit_length(N)``)."""
    N, eps = check_horizon(N), check_epsilon(epsilon, "epsilon")
    L = N.bit_length()
    return _digit_sum(N, np.full(L, 2.0 * L * L / eps**2))


def honaker_level_variances(N: int, epsilon: float) -> np.ndarray:
    """``v_h`` of a completed level-``h`` node's subtree estimate, ``h = 0 .. L-1``."""
    N, eps = check_horizon(N), check_epsilon(epsilon, "epsilon")
    L = N.bit_length()
    s2 = 2.0 * L * L / eps**2
    v = np.empty(L)
    v[0] = s2
    for h in range(1, L):
        v[h] = 1.0 / (1.0 / s2 + 1.0 / (2.0 * v[h - 1]))
    return v


def honaker_variance(N: int, epsilon: float) -> np.ndarray:
    """``Var(s~_t) = sum_{h in digits(t)} v_h`` of :class:`HonakerCounter`."""
    return _digit_sum(check_horizon(N), honaker_level_variances(N, epsilon))


class NaiveCounter(StreamingCounter):
    """Running sum of ``a_t + Lap(1/epsilon)`` (sensitivity 1 per increment, each used once)."""

    name = "naive"

    def __init__(self, horizon: int, epsilon: float, rng: object = None, *, increments: str = "counts",
                 accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.sensitivity = 1.0
        rows = identity_rows(self.horizon)
        self._make_plan(lambda grid: plan_rows(rows, epsilon=self.epsilon, rho=None, secure=self.secure, grid=grid))
        self.scale = float(self.plan.scales[0])
        self._var = float(row_variances(self.plan)[0])
        self._sum = 0.0
        self._open(accountant, rng)

    def _step(self, a: float) -> float:
        self._sum += a + self._noise.draw()  # y_t = a_t + z_t (exact on the lattice), summed
        self.last_variance = (self.t + 1) * self._var
        return self._sum


class _BinaryTree(StreamingCounter):
    """``L = floor(log2 N) + 1`` levels; each increment is in one node per level, so ``Delta_1 = L``
    (computed by the plan from the rows) and every node gets ``Lap(L / epsilon)``."""

    def __init__(self, horizon: int, epsilon: float, rng: object = None, *, increments: str = "counts",
                 accountant: Accountant | None = None, secure: bool = True) -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.epsilon = check_epsilon(epsilon, "epsilon")
        self.levels = self.horizon.bit_length()
        self.sensitivity = float(self.levels)
        rows = self._rows()
        self._make_plan(lambda grid: plan_rows(rows, epsilon=self.epsilon, rho=None, secure=self.secure, grid=grid))
        self.scale = float(self.plan.scales[0])
        self._node_var = float(row_variances(self.plan)[0])  # 2 b^2, or the exact discrete variance
        self._setup()
        self._open(accountant, rng)

    def _rows(self) -> IntervalRows:  # pragma: no cover - abstract
        raise NotImplementedError

    def _setup(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class BinaryMechanism(_BinaryTree):
    """Chan-Shi-Song binary mechanism: ``O(log N)`` p-sums, ``Lap(L / epsilon)`` each, ``Delta_1 = L``."""

    name = "binary"

    def _rows(self) -> IntervalRows:
        """The p-sums: row ``t`` sums ``(t - lowbit(t), t]`` (the unweighted Fenwick strategy)."""
        return fenwick_rows(self.horizon, "binary mechanism p-sum")

    def _setup(self) -> None:
        self._alpha = [0.0] * self.levels
        self._noisy = [0.0] * self.levels

    def _step(self, a: float) -> float:
        t = self.t + 1
        i = (t & -t).bit_length() - 1
        self._alpha[i] = sum(self._alpha[:i]) + a
        for j in range(i):
            self._alpha[j] = self._noisy[j] = 0.0
        self._noisy[i] = self._alpha[i] + self._noise.draw()  # y_t: exact on the lattice
        self.last_variance = bin(t).count("1") * self._node_var
        return sum(self._noisy[j] for j in range(self.levels) if t >> j & 1)


class HonakerCounter(_BinaryTree):
    """Binary tree, all nodes measured with ``Lap(L / epsilon)`` (``Delta_1 = L``), Honaker's
    streaming subtree estimates; ``O(log N)`` state, amortised ``O(1)`` noise draws per step."""

    name = "honaker"

    def _rows(self) -> IntervalRows:
        """Every complete dyadic block ``(j 2^h, (j + 1) 2^h]``, ``h = 0 .. L - 1``, in the order they
        complete (at step ``t``: the leaf, then the blocks ending at ``t``, smallest first)."""
        return completed_blocks(self.horizon, 2, self.levels, "honaker dyadic")[0]

    def _setup(self) -> None:
        s2 = self._node_var
        v = [s2]
        for _ in range(1, self.levels):
            v.append(1.0 / (1.0 / s2 + 1.0 / (2.0 * v[-1])))
        self._v, self._s2 = v, s2
        self._true = [0.0] * self.levels
        self._est = [0.0] * self.levels

    def _step(self, a: float) -> float:
        t = self.t + 1
        i = (t & -t).bit_length() - 1
        v, s2 = self._v, self._s2
        right_true = a
        right_est = a + self._noise.draw()  # the leaf's y
        left_true, left_est = self._true[0], self._est[0]
        self._true[0], self._est[0] = right_true, right_est
        for h in range(1, i + 1):
            node_true = left_true + right_true
            y = node_true + self._noise.draw()  # exact on the lattice; the estimate uses y only
            est = v[h] * (y / s2 + (left_est + right_est) / (2.0 * v[h - 1]))
            left_true, left_est = self._true[h], self._est[h]
            self._true[h], self._est[h] = node_true, est
            right_true, right_est = node_true, est
        digits = [h for h in range(self.levels) if t >> h & 1]
        self.last_variance = sum(v[h] for h in digits)
        return sum(self._est[h] for h in digits)


def unweighted_fenwick(horizon: int, epsilon: float, rng: object = None, **kw: Any) -> ContinualCounter:
    """The seed's plain Fenwick release (eq. 5.7): :class:`ContinualCounter` with unit weights
    (``kw``: ``increments=``, ``accountant=``, ``secure=``)."""
    return ContinualCounter(horizon, epsilon=epsilon, weights="uniform", rng=rng, **kw)
