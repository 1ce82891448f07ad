"""Toeplitz factorisations of the prefix matrix for ``rho``-zCDP: square root and BLT.

Factorise ``W_N = B M`` with lower-triangular Toeplitz ``B`` (decoder, coefficients ``b_k``) and
``M = B^{-1} W`` (strategy, coefficients ``m_k``).  The release is ``B (M x + z) = s + B z`` with
``z ~ N(0, sigma^2 I)``, ``sigma = Delta_2(M) / sqrt(2 rho)`` and ``Delta_2(M)^2 = sum_{k<N} m_k^2``
(column 1 is the longest column of a lower-triangular Toeplitz matrix).  One record changes one
increment by at most 1, i.e. ``M x`` by a column of ``M``: the Gaussian mechanism on ``M x`` is
``rho``-zCDP and ``s + B z`` is its post-processing; step ``t`` reads ``z_1..z_t`` and ``a_1..a_t``
only.  Step ``t`` has variance ``sigma^2 sum_{k<t} b_k^2``.

* **Square root** (Henzinger, Upadhyay, Upadhyay SODA 2023; Fichtenberger, Henzinger, Upadhyay
  ICML 2023): ``B = M = W^{1/2}``, ``b_k = m_k = binom(2k, k) / 4^k``, the coefficients of
  ``(1 - x)^{-1/2}``.  Streaming needs all past ``z``: an online convolution (:mod:`._online`),
  ``O(log^2 t)`` amortised time per step, ``O(N)`` memory.
* **BLT** (buffered linear Toeplitz; McMahan, Dvijotham et al. 2024): ``b_k = sum_j w_j theta_j^k``,
  ``d`` exponentials.  The noise ``(B z)_t = sum_j w_j u_j(t)``, ``u_j(t) = theta_j u_j(t-1) + z_t``,
  is generated in ``O(d)`` time and state.  ``m`` is rational too: ``m(x) = 1 / ((1 - x) b(x))`` has
  poles ``1`` and ``y_r`` (the ``d - 1`` zeros of ``sum_j w_j / (y - theta_j)``, which interlace the
  ``theta``), so both ``Delta_2(M)^2`` and the total error have ``O(d^2)`` closed forms (geometric
  sums), which :func:`fit_blt` minimises over ``(w, theta)`` for the given ``N``.

Measurement path (issue 13).  The noise is drawn through :func:`sparsedp.measure.plan_measurement`
on the strategy's entries: the explicit lower-triangular ``M`` for ``N <= EXPLICIT_MAX``, above that
its first column ``M e_1`` (an ``N x 1`` matrix: every column of a lower-triangular Toeplitz matrix
is a truncation of the first, so ``Delta_2(M) = ||M e_1||_2`` exactly; a test checks it against the
full matrix).  A Toeplitz operator trusted by the plan (matvec by FFT, loss from the first column)
would let the ledger show ``N`` columns; it does not exist in :mod:`sparsedp.measure` yet.

* ``secure=False``: float64 Gaussian ``z``, ``sigma`` from the counter's certified
  :func:`strategy_sq_bound` (the larger of the explicit sum and the closed form, widened), which the
  plan re-checks against the entries; the release is ``s_t + (B z)_t`` (``O(d)`` per step for BLT).
* ``secure=True`` (default): exact discrete Gaussian noise needs a *lattice* strategy -- with
  ``z`` on a lattice and a non-integer ``M``, ``s + B z`` has a support that moves with the data
  (not private at all).  So the strategy is rounded to ``m'_k = 2^-F round(2^F m_k)`` (``F <= 20``,
  smaller only at budgets where the exact sampler's scale would exceed ``2^40``) and the plan is
  grid-exact on the lattice ``q 2^-F`` (``q`` the data quantum): ``y = M' x + z`` with exact discrete
  Gaussian ``z`` of scale ``sigma = Delta_2(M') / sqrt(2 rho)`` (certified from the rounded entries,
  in lattice units) is ``rho``-zCDP.  The decoder of the rounded strategy is ``B' = W M'^{-1}``
  (lower-triangular Toeplitz, first column ``b' = cumsum(1 / m'(x))``).  The release is
  ``W M'^{-1} y``: ``y_t = (M' x)_t + z_t`` is computed *exactly* (two int64 products over a
  high / low split of the increments, sized so that neither can overflow anywhere in the increment
  domain), then ``s~_t = (B' y)_t``: a float post-processing of the exact measurement and of
  nothing else.  Both products are online convolutions (:mod:`._online`): the lags below
  ``direct_lags`` directly, the longer ones by blocked FFTs -- the integer product ``M' x`` on
  limbs small enough that every FFT result rounds to the exact integer, the decoder ``B' y`` in
  float64 on the float ``y`` (a fixed function of ``y``).  Cost ``O(log^2 t)`` amortised per step
  (BLT included; ``2^20`` steps in about 7 s), noise drawn as the stream goes; horizons whose int64
  product could overflow are refused.  The FFT blocks of the integer product skip limbs above the
  block's largest increment (their cost, not their result, depends on the data's magnitude).

  Why not ``s_t + e_t`` with offsets ``e = B' z`` drawn ahead (``O(1)`` per step)?  Mathematically
  ``s + B' z = B' y``, but ``e`` takes its values on a countable set that the public ``b'`` and the
  lattice determine, so ``s_t + e_t`` reveals ``s_t``: an observer recovers the integer noise from
  ``o - s`` by forward substitution and recomputes the output bit for bit under each hypothesis
  (measured at ``N = 64``, ``rho = 0.5``: the true stream reproduced the output 300 times in 300,
  its neighbour 6 times).  That release is refused with exact noise (``release="offsets"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.signal
import scipy.sparse as sp

from ..calibration import gaussian_sigma, round_up
from ..errors import InvalidPrivacyParameterError, SparseDPError
from ..operators import SparseOperator
from ..optimize.toeplitz_strategy import series_inverse  # one copy: Newton's iteration with FFT products
from ..privacy import Accountant
from ..validation import MAX_MAGNITUDE, check_rho
from ._stream import SCALE_SLACK, UNIT_QUANTUM, StreamingCounter, ceil_sqrt, check_accountant, higham_gamma, plan_rows
from ._online import DIRECT_LAGS, ExactOnlineConvolution, OnlineConvolution
from ._stream import row_variances
from .error import ContinualError
from .fenwick import check_horizon

__all__ = [
    "RELEASES",
    "sqrt_coefficients",
    "toeplitz_error",
    "sqrt_error",
    "BLT",
    "fit_blt",
    "ToeplitzCounter",
    "SqrtCounter",
    "BLTCounter",
    "strategy_sq_bound",
    "toeplitz_strategy",
    "toeplitz_operator",
    "series_inverse",
    "EXPLICIT_MAX",
    "STRATEGY_BITS",
]

#: Up to this horizon the plan measures the explicit lower-triangular strategy (``N (N + 1) / 2``
#: non-zeros); above it, its first column (see the module docstring).
EXPLICIT_MAX = 2048
#: Exact noise: the strategy is rounded to multiples of ``2^-STRATEGY_BITS`` (at most).
STRATEGY_BITS = 20
_INT_LIMIT = 2.0**62
#: The releases of an exact-noise Toeplitz counter (module docstring): the decoder applied to the
#: exact measurement (``O(log^2 t)`` amortised per step).  ``"offsets"`` (``s_t + e_t``) is refused: it reveals
#: the data (module docstring).
RELEASES = ("measurement",)


def sqrt_coefficients(N: int) -> np.ndarray:
    """``c_k = binom(2k, k) / 4^k`` (``k < N``): ``c_0 = 1``, ``c_k = c_{k-1} (2k - 1) / (2k)``."""
    N = check_horizon(N, "N")
    k = np.arange(1, N, dtype=np.float64)
    return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])


def toeplitz_error(b: np.ndarray, m_sq_sum: float, rho: float, method: str) -> ContinualError:
    """Per-step variance ``sigma^2 cumsum(b^2)`` with ``sigma^2 = Delta_2^2 / (2 rho)``."""
    rho = check_rho(rho, "rho")
    v = m_sq_sum / (2.0 * rho)
    per_step = v * np.cumsum(np.asarray(b, dtype=np.float64) ** 2)
    total = float(per_step.sum())
    return ContinualError(per_step, total, total / per_step.size, math.sqrt(m_sq_sum), v, method)


def sqrt_error(N: int, rho: float) -> ContinualError:
    """Exact per-step variance of the square-root factorisation under ``rho``-zCDP."""
    c = sqrt_coefficients(N)
    return toeplitz_error(c, float(np.sum(c * c)), rho, "sqrt-gaussian")


def _log_geom(l: np.ndarray, N: int) -> np.ndarray:
    """``sum_{k<N} q^k`` for ``q = exp(l) <= 1`` (``N`` at ``q = 1``), accurate near ``q = 1``."""
    l = np.minimum(l, 0.0)
    small = np.abs(l) < 1e-12
    safe = np.where(small, -1.0, l)
    out = np.expm1(N * safe) / np.expm1(safe)
    return np.where(small, N * (1.0 + l * (N - 1) / 2.0), out)


def _log_weighted_geom(l: np.ndarray, N: int) -> np.ndarray:
    """``sum_{k<N} (N - k) q^k = (N - q (1 - q^N) / (1 - q)) / (1 - q)`` for ``q = exp(l)``."""
    l = np.minimum(l, 0.0)
    small = np.abs(N * l) < 1e-4
    safe = np.where(small, -1.0, l)
    one_minus_q = -np.expm1(safe)
    q = np.exp(safe)
    out = (N - q * (-np.expm1(N * safe)) / one_minus_q) / one_minus_q
    series = N * (N + 1) / 2.0 + l * (N - 1) * N * (N + 1) / 6.0  # first-order in l
    return np.where(small, series, out)


@dataclass(frozen=True)
class BLT:
    """Decoder ``b_k = sum_j w_j theta_j^k`` with ``d = len(w)`` buffers (``w > 0``, ``0 < theta < 1``)."""

    w: np.ndarray
    theta: np.ndarray

    def __post_init__(self) -> None:
        w, th = np.asarray(self.w, float), np.asarray(self.theta, float)
        if w.ndim != 1 or w.shape != th.shape or w.size < 1:
            raise SparseDPError("BLT needs equal-length 1-D w and theta")
        if np.any(w <= 0) or np.any(th <= 0) or np.any(th >= 1) or not np.all(np.isfinite(w)):
            raise SparseDPError("BLT needs w > 0 and 0 < theta < 1")
        order = np.argsort(th)
        object.__setattr__(self, "w", w[order])
        object.__setattr__(self, "theta", th[order])

    def decoder(self, N: int) -> np.ndarray:
        """``b_0 .. b_{N-1}``, ``O(N d)``."""
        k = np.arange(check_horizon(N, "N"), dtype=np.float64)
        return np.exp(np.outer(k, np.log(self.theta))) @ self.w

    def _poles(self) -> np.ndarray:
        """Zeros ``y_r`` of ``sum_j w_j / (y - theta_j)``, one in each gap of the sorted ``theta``."""
        th, w = self.theta, self.w
        lo, hi = th[:-1].copy(), th[1:].copy()
        with np.errstate(divide="ignore", invalid="ignore"):
            for _ in range(200):
                mid = 0.5 * (lo + hi)
                f = (w[None, :] / (mid[:, None] - th[None, :])).sum(axis=1)
                lo, hi = np.where(f > 0, mid, lo), np.where(f > 0, hi, mid)
        return 0.5 * (lo + hi)

    def _strategy_terms(self) -> tuple[float, np.ndarray, np.ndarray]:
        """``m_k = kappa [k = 0] + sum_p gamma_p rho_p^k`` (poles ``rho = 1, y_r``); cached."""
        cached = self.__dict__.get("_terms")
        if cached is not None:
            return cached
        w, th = self.w, self.theta
        y = self._poles()
        g0 = 1.0 / np.sum(w / (1.0 - th))  # 1 / b(1)
        xr = 1.0 / y
        with np.errstate(divide="ignore", invalid="ignore"):  # coincident theta: caught below
            bprime = (w[None, :] * th[None, :] / (1.0 - th[None, :] * xr[:, None]) ** 2).sum(axis=1)
            gam = -y / ((1.0 - xr) * bprime)
        gammas = np.concatenate([[g0], gam])
        poles = np.concatenate([[1.0], y])
        if not np.all(np.isfinite(gammas)):
            raise SparseDPError("BLT with (numerically) coincident decays")
        kappa = 1.0 / np.sum(w) - gammas.sum()
        object.__setattr__(self, "_terms", (kappa, gammas, poles))
        return kappa, gammas, poles

    def strategy(self, N: int) -> np.ndarray:
        """``m_0 .. m_{N-1}`` (``M = B^{-1} W``) by a stable cascaded IIR filter, ``O(N d)``."""
        N = check_horizon(N, "N")
        _, _, poles = self._strategy_terms()
        sos = scipy.signal.zpk2sos(self.theta, poles, 1.0 / np.sum(self.w))
        impulse = np.zeros(N)
        impulse[0] = 1.0
        return scipy.signal.sosfilt(sos, impulse)

    def strategy_sq_sum(self, N: int) -> float:
        """``Delta_2(M)^2 = sum_{k<N} m_k^2`` in closed form, ``O(d^2)``."""
        kappa, g, p = self._strategy_terms()
        lp = np.log(p)
        cross = float(g @ _log_geom(lp[:, None] + lp[None, :], N) @ g)
        m0 = kappa + g.sum()
        return cross + m0 * m0 - g.sum() ** 2

    def strategy_sq_bound(self, N: int) -> float:
        """:func:`strategy_sq_bound` of the explicit strategy (:meth:`strategy`, ``O(N d)``) and the
        closed form (:meth:`strategy_sq_sum`): what :class:`BLTCounter` calibrates from (cached per
        ``N``; at ``N = 10^6`` the explicit sum is 1.1e-10 above the closed form)."""
        cache = self.__dict__.setdefault("_sq_bounds", {})
        if N not in cache:
            cache[N] = strategy_sq_bound(self.strategy(N), self.strategy_sq_sum(N))
        return cache[N]

    def decoder_sq_total(self, N: int) -> float:
        """``sum_{t=1}^N sum_{k<t} b_k^2 = sum_{k<N} (N - k) b_k^2`` in closed form, ``O(d^2)``."""
        lt = np.log(self.theta)
        return float(self.w @ _log_weighted_geom(lt[:, None] + lt[None, :], N) @ self.w)

    def mean_error(self, N: int, rho: float) -> float:
        """Average per-step variance ``Delta_2(M)^2 / (2 rho) * decoder_sq_total / N`` (closed form)."""
        return self.strategy_sq_sum(N) * self.decoder_sq_total(N) / (2.0 * check_rho(rho, "rho") * N)

    def error(self, N: int, rho: float) -> ContinualError:
        """Exact per-step variances (``O(N d)``)."""
        return toeplitz_error(self.decoder(N), self.strategy_sq_sum(N), rho, f"blt{self.w.size}-gaussian")


def fit_blt(N: int, buffers: int = 5) -> BLT:
    """BLT decoder minimising the total error at horizon ``N`` (scale-free: ``rho`` drops out).

    Start: ``b_k ~ k^{-1/2} / sqrt(pi)`` as a sum of exponentials with log-spaced rates
    ``r_j`` in ``[1 / (4N), 2]`` and ``w_j ~ sqrt(r_j)`` (a quadrature of
    ``k^{-1/2} = pi^{-1/2} int r^{-1/2} e^{-rk} dr``); then L-BFGS on ``(log w, log(-log theta))``
    of ``log Delta_2(M)^2 + log sum (N - k) b_k^2``, each evaluation ``O(d^2)``.
    """
    N = check_horizon(N, "N")
    d = int(buffers)
    if d < 1:
        raise SparseDPError(f"buffers must be >= 1, got {buffers!r}")
    r = np.geomspace(1.0 / (4.0 * N), 2.0, d)
    dlog = np.log(r[1] / r[0]) if d > 1 else 1.0
    w0 = np.sqrt(r) * dlog / np.sqrt(np.pi)

    def unpack(p: np.ndarray) -> BLT:
        return BLT(np.exp(p[:d]), np.exp(-np.exp(p[d:])))

    def objective(p: np.ndarray) -> float:
        try:
            blt = unpack(p)
            val = math.log(blt.strategy_sq_sum(N)) + math.log(blt.decoder_sq_total(N))
        except (SparseDPError, ValueError, FloatingPointError):
            return 1e300
        return val if math.isfinite(val) else 1e300

    p0 = np.concatenate([np.log(w0), np.log(r)])
    bounds = [(-40.0, 5.0)] * d + [(math.log(1e-3 / N), math.log(30.0))] * d
    res = scipy.optimize.minimize(objective, p0, method="L-BFGS-B", bounds=bounds,
                                  options={"maxiter": 2000, "ftol": 1e-13, "gtol": 1e-10})
    best = res.x if res.fun <= objective(p0) else p0
    return unpack(best)


def strategy_sq_bound(m: np.ndarray, closed_form: float | None = None) -> float:
    """An upper bound of ``Delta_2(M)^2 = sum_k m_k^2`` for the strategy coefficients ``m`` (and a
    closed form of the same, when there is one): the larger of the two, the exactly rounded sum of
    the float squares (:func:`math.fsum`) covered for the squares' roundings, then widened by
    ``gamma_N`` (Higham) for the float error of the decoder the counter actually applies (its
    coefficients are themselves float recursions of length ``<= N``; a margin, not a proof)."""
    m = np.asarray(m, dtype=np.float64)
    total = math.fsum((m * m).tolist())
    if closed_form is not None:
        total = max(total, float(closed_form))
    return float(round_up(total, higham_gamma(m.size + 3)))


def check_release(release: Any) -> str:
    """``release`` if it names a release of :data:`RELEASES`, else :class:`SparseDPError`
    (``"offsets"`` with an explanation: that release is not private, module docstring)."""
    if release == "offsets":
        raise SparseDPError(
            "release='offsets' is not offered: s_t + e_t with offsets e computed from the exact noise reveals the "
            "running sum s_t (the offsets lie on a set fixed by the public decoder); the release is the "
            "post-processing of the exact measurement, release='measurement'")
    if not isinstance(release, str) or release not in RELEASES:
        raise SparseDPError(f"release must be one of {RELEASES}, got {release!r}")
    return release


def toeplitz_strategy(decoder: np.ndarray, N: int) -> np.ndarray:
    """``m`` with ``B M = W`` for the lower-triangular Toeplitz decoder ``b``: column 1 of ``M`` is
    ``B^{-1} 1`` (``O(N^2)`` forward substitution via :func:`scipy.signal.lfilter`)."""
    b = np.asarray(decoder, dtype=np.float64)[:N]
    if b.size < N or not np.all(np.isfinite(b)) or b[0] <= 0:
        raise SparseDPError(f"the decoder needs {N} finite coefficients with b_0 > 0")
    m = scipy.signal.lfilter([1.0], b, np.ones(N))
    if not np.all(np.isfinite(m)):
        raise SparseDPError("the decoder's strategy B^{-1} W is not finite")
    return m


def toeplitz_operator(m: np.ndarray, name: str = "toeplitz") -> SparseOperator:
    """The strategy to plan: the explicit lower-triangular Toeplitz matrix with first column ``m``
    (``N <= EXPLICIT_MAX``), else that first column alone (the longest column: same ``Delta_p``)."""
    m = np.asarray(m, dtype=np.float64)
    N = m.size
    if N <= EXPLICIT_MAX:
        i, j = np.tril_indices(N)
        A = sp.csr_matrix((m[i - j], (i, j)), shape=(N, N))
        A.eliminate_zeros()
        return SparseOperator(A, name=f"{name} strategy (N = {N})")
    col = sp.csr_matrix(m[:, None])
    col.eliminate_zeros()
    return SparseOperator(col, name=f"{name} strategy, first column (N = {N}; Toeplitz: the longest column)")


class ToeplitzCounter(StreamingCounter):
    """Online ``s_t + (B z)_t`` for a lower-triangular Toeplitz decoder ``B`` (``rho``-zCDP).

    Generic version: keeps every input, ``O(log^2 t)`` amortised per step (:mod:`._online`).
    ``sigma = Delta_2(M) / sqrt(2 rho)`` (rounded up) is calibrated from the strategy ``M = B^{-1} W``
    of the decoder itself (``strategy=`` its first column, else computed, ``O(N^2)``): a given
    ``m_sq_sum`` can only raise ``Delta_2``, never lower it (:func:`strategy_sq_bound`).
    ``secure=True`` (default): exact discrete Gaussian noise on the rounded strategy ``M'`` (module
    docstring), released as ``W M'^{-1} y``, the rounded strategy's decoder applied to the exact
    measurement ``y`` (``release="measurement"``, the only one); ``secure=False``: float64 noise
    (an explicit opt-out that leaks through the noise's low bits; ``release`` is then unused).
    ``increments=`` and ``accountant=`` (charged ``rho`` here, before any draw) as in :mod:`._stream`.
    """

    name = "toeplitz"
    #: Lags of the exact release computed directly at every step; longer lags by blocked FFTs
    #: (:mod:`._online`).  Set on a fresh counter to ``horizon`` for the direct ``O(t)`` computation.
    direct_lags: int = DIRECT_LAGS

    def __init__(self, horizon: int, rho: float, decoder: np.ndarray, m_sq_sum: float | None = None,
                 rng: Any = None, *, strategy: np.ndarray | None = None, increments: str = "counts",
                 accountant: Accountant | None = None, secure: bool = True, release: str = "measurement") -> None:
        super().__init__(horizon, increments, secure)
        accountant = check_accountant(accountant)
        self.release = check_release(release)
        self.rho = check_rho(rho, "rho")
        N = self.horizon
        self._b = np.asarray(decoder, dtype=np.float64)[:N]
        m = toeplitz_strategy(self._b, N) if strategy is None else np.asarray(strategy, dtype=np.float64)[:N]
        self._calibrate(m, m_sq_sum)
        self._b2 = np.cumsum(self._b**2)
        self._open(accountant, rng)

    # ---- calibration ----------------------------------------------------------------------------
    def _calibrate(self, m: np.ndarray, closed_form: float | None) -> None:
        if m.shape != (self.horizon,) or not np.all(np.isfinite(m)):
            raise SparseDPError(f"the strategy needs {self.horizon} finite coefficients")
        self._m = m
        self._s = 0.0
        if self.secure:
            self._calibrate_exact(m)
            return
        self.sensitivity = ceil_sqrt(strategy_sq_bound(m, closed_form))
        sigma = math.nextafter(gaussian_sigma(self.sensitivity, self.rho) * SCALE_SLACK, math.inf)
        op = toeplitz_operator(m, self.name)
        self._make_plan(lambda grid: plan_rows(op, epsilon=None, rho=self.rho, scales=sigma, secure=False))
        self.sigma = float(self.plan.scales[0])

    def _calibrate_exact(self, m: np.ndarray) -> None:
        """Round the strategy to ``2^-F`` and plan it grid-exactly on the lattice ``q 2^-F``:
        ``F + log2(1/q)`` is the largest precision (``F <= STRATEGY_BITS``, ``q >= UNIT_QUANTUM``
        for unit increments, ``q = 1`` for counts) whose sampler scale stays below ``2^40``."""
        norm = math.sqrt(math.fsum((m * m).tolist()))
        room = math.floor(40.0 + math.log2(math.sqrt(2.0 * self.rho) / norm)) - 1
        data_bits = 0 if self.increments == "counts" else -round(math.log2(UNIT_QUANTUM))
        bits = max(0, min(STRATEGY_BITS, room))
        extra = max(0, min(data_bits, room - bits))
        last: Exception | None = None
        for F in range(bits, -1, -1):
            mi = np.round(np.ldexp(m, F))
            if mi[0] == 0:
                break
            q, grid = 2.0**-extra, 2.0 ** -(extra + F)
            op = toeplitz_operator(np.ldexp(mi, -F), self.name)
            try:
                self.plan = plan_rows(op, epsilon=None, rho=self.rho, secure=True, grid=grid)
            except InvalidPrivacyParameterError as exc:
                last = exc
                continue
            self.quantum, self.strategy_bits = q, F
            self._mf = np.ldexp(mi, -F)
            self._grid = grid
            self.sensitivity = float(self.plan.sensitivity) * grid
            self.sigma = float(self.plan.scales[0])
            N = self.horizon
            self._mi = mi.astype(np.int64)
            self._split = self._split_bits(float(np.abs(mi).max()), q)
            self._mmax = float(np.abs(mi).max())
            self._ai = np.zeros(N, dtype=np.int64)
            # the decoder b' = W M'^{-1} e_1 of the rounded strategy (data-independent, computed once):
            # Var(s~_t) = Var(z) sum_{k<t} b'_k^2
            self._b_exact = np.cumsum(series_inverse(self._mf, N))
            self._xvar = float(row_variances(self.plan)[0]) * np.cumsum(self._b_exact * self._b_exact)
            return
        raise InvalidPrivacyParameterError(
            f"rho = {self.rho!r} is too small for exact noise on this strategy (the sampler's scale would "
            "exceed 2^40 grid units even with the strategy rounded to integers): use secure=False") from last

    def _split_bits(self, mmax: float, q: float) -> int:
        """``K`` such that ``(M' x)_t = 2^K (M' x_hi)_t + (M' x_lo)_t`` with ``x = 2^K x_hi + x_lo``
        (``0 <= x_lo < 2^K``, in data quanta) has both products exact in int64: ``mmax A / 2^K`` and
        ``mmax N 2^K`` below ``2^62``, where ``A`` bounds the running sum in quanta (``2^50`` counts,
        ``N / q`` unit increments) and ``mmax = max_k |2^F m'_k|``."""
        A = MAX_MAGNITUDE if self.increments == "counts" else self.horizon / q
        K = max(0, math.ceil(math.log2(mmax * A / _INT_LIMIT)) + 1) if mmax * A >= _INT_LIMIT else 0
        if mmax * self.horizon * 2.0**K >= _INT_LIMIT:
            raise InvalidPrivacyParameterError(
                f"horizon {self.horizon} is too long for the exact int64 strategy product of exact noise: use "
                "secure=False")
        return K

    def _noise_at(self, t: int) -> float:
        """Float noise: ``(B z)_t`` by the online convolution of the drawn ``z`` (:mod:`._online`)."""
        if t == 1:
            self._bz = OnlineConvolution(self._b, self.horizon, self.direct_lags)
        return self._bz.push(t - 1, self._noise.draw())

    def _exact_product(self, t: int) -> int:
        """``(M' x)_t / (q 2^-F)`` exactly: the lags below ``direct_lags`` by one int64 dot while
        ``max|2^F m'| * (running sum / q)`` stays below ``2^62`` (no partial sum can overflow then),
        else by the high / low split; the longer lags from the exact online convolution."""
        i = t - 1
        lo = max(0, t - self.direct_lags)
        mi, ai = self._mi_rev[self.direct_lags - (t - lo):], self._ai[lo:t]
        if self._mmax * (self._total / self.quantum + float(self._ai[i])) < _INT_LIMIT:
            near = int(np.dot(mi, ai))
        else:
            K = self._split
            near = (int(np.dot(mi, ai >> K)) << K) + int(np.dot(mi, ai & ((1 << K) - 1)))
        return near + self._far.push(i, int(self._ai[i]))

    def _online(self) -> None:
        """The two online products of the exact release (built at the first step, so that
        ``direct_lags`` can be set on a fresh counter): the exact ``M' x`` beyond the direct lags
        and the float decoder ``B' y`` (:mod:`._online`)."""
        L = max(1, min(int(self.direct_lags), self.horizon))
        self.direct_lags = L
        self._mi_rev = self._mi[:L][::-1].copy()
        A = MAX_MAGNITUDE if self.increments == "counts" else 1.0 / self.quantum  # one increment, in quanta
        self._far = ExactOnlineConvolution(self._mi, self.horizon, int(A).bit_length(), L)
        self._dec = OnlineConvolution(self._b_exact, self.horizon, L)

    def _exact_step(self, a: float) -> float:
        """``y_t = (M' x)_t + z_t`` exactly, then ``s~_t = (B' y)_t`` (``B' = W M'^{-1}``, the
        decoder of the rounded strategy) by the online convolution of the float ``y``: a function of
        the exact measurement ``y`` alone; ``O(log^2 t)`` amortised per step."""
        t = self.t + 1
        i = t - 1
        if i == 0:
            self._online()
        self._ai[i] = round(a / self.quantum)
        acc = self._exact_product(t)
        k = int(self._noise.draw() / self._grid)  # the noise in grid units (exact)
        y = float(acc + k) * self._grid  # a function of the exact y (rounded for arithmetic)
        self._s = self._dec.push(i, y)
        self.last_variance = float(self._xvar[i])
        return self._s

    def _step(self, a: float) -> float:
        if self.secure:
            return self._exact_step(a)
        t = self.t + 1
        self._s += a
        self.last_variance = self.sigma**2 * self._b2[t - 1]
        return self._s + self._noise_at(t)


class SqrtCounter(ToeplitzCounter):
    """Square-root factorisation counter (``B = M = W^{1/2}``), ``rho``-zCDP: ``O(log^2 t)`` amortised
    per step (the exact measurement ``y_t = (M' x)_t + z_t`` and its decoder, online convolutions)."""

    name = "sqrt"

    def __init__(self, horizon: int, rho: float, rng: Any = None, **kw: Any) -> None:
        c = sqrt_coefficients(check_horizon(horizon))
        super().__init__(horizon, rho, c, None, rng, strategy=c, **kw)


class BLTCounter(ToeplitzCounter):
    """BLT counter: ``O(d)`` time and state per step (``u <- theta u + z``, noise ``w . u``) with
    float noise (``secure=False``); exact noise measures the rounded strategy exactly and releases its
    decoder online, ``O(log^2 t)`` amortised per step (the rounded strategy has no ``d``-buffer
    recursion)."""

    name = "blt"

    def __init__(self, horizon: int, rho: float, blt: BLT | None = None, buffers: int = 5, rng: Any = None, *,
                 increments: str = "counts", accountant: Accountant | None = None, secure: bool = True,
                 release: str = "measurement") -> None:
        N = check_horizon(horizon)
        StreamingCounter.__init__(self, N, increments, secure)
        accountant = check_accountant(accountant)
        self.release = check_release(release)
        self.rho = check_rho(rho, "rho")
        if blt is not None and not isinstance(blt, BLT):
            raise SparseDPError(f"blt must be a BLT, got {type(blt).__name__}")
        self.blt = blt if blt is not None else fit_blt(N, buffers)
        self._calibrate(self.blt.strategy(N), None if self.secure else self.blt.strategy_sq_sum(N))
        if not self.secure:  # the BLT's cached bound: the same as strategy_sq_bound(strategy, closed form)
            self.sensitivity = max(self.sensitivity, ceil_sqrt(self.blt.strategy_sq_bound(N)))
        self._u = np.zeros(self.blt.w.size)
        self._theta, self._w = self.blt.theta, self.blt.w
        self._var_b = 0.0
        self._open(accountant, rng)

    def measured_strategy(self) -> sp.csr_matrix:
        """``M = B^{-1} W`` of the BLT decoder (first column :meth:`BLT.strategy`; exact noise: rounded;
        dense: small ``N``)."""
        return super().measured_strategy()

    def _noise_at(self, t: int) -> float:
        self._u = self._theta * self._u + self._noise.draw()
        return float(self._w @ self._u)

    def _step(self, a: float) -> float:
        if self.secure:
            return self._exact_step(a)
        t = self.t + 1
        self._s += a
        bt = float(self._w @ self._theta ** (t - 1))
        self._var_b += bt * bt
        self.last_variance = self.sigma**2 * self._var_b
        return self._s + self._noise_at(t)
