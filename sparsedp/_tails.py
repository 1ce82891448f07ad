"""Tails of a linear combination of independent noise values: what confidence intervals need.

The error of an unbiased linear answer is ``e = sum_i c_i z_i`` with independent noise values
``z_i``: float Laplace or Gaussian, or exact discrete noise ``z_i = g_i K_i`` on a grid ``g_i``
(``K_i`` discrete Laplace of scale ``t_i`` or discrete Gaussian of parameter ``sigma_i``, in grid
units: the *sampler scale*).  Its variance ``sigma^2 = sum_i c_i^2 Var(z_i)`` is what every release
reports; this module adds what the shape of ``e`` needs (:class:`ErrorShape`) and the quantiles.

Noise values (per row; :func:`noise_rows`):

* discrete Laplace ``P(k) = (1 - q) / (1 + q) q^|k|``, ``q = e^{-1/t}``, is the difference of two
  independent geometric variables, so its even cumulants are twice theirs:
  ``Var = 2 q / (1 - q)^2 = 1 / (2 sinh^2(1 / (2 t)))`` and ``kappa_4 = 2 q (1 + 4 q + q^2) /
  (1 - q)^4``: excess kurtosis ``3 + 2 sinh^2(1 / (2 t))`` (3, the Laplace value, as ``t -> inf``).
  Its two-sided tail is ``P(|K| > k) = 2 q^{k+1} / (1 + q)``.
* discrete Gaussian ``P(k) ~ exp(-k^2 / (2 sigma^2))``: variance and kurtosis by summing the pmf for
  ``sigma < 3``; above, the normal values (the lattice corrections are below ``e^{-2 pi^2 sigma^2}``,
  ``< 1e-70``), and ``P(|K| <= k) = 2 Phi((k + 1/2) / sigma) - 1`` to the same precision (Poisson
  summation).
* float Laplace: excess kurtosis 3; float Gaussian: 0.

Shapes (:class:`ShapeAccumulator`, from the coefficients ``c``): the excess kurtosis of ``e``,
``gamma_2 = sum_i c_i^4 kappa_4(z_i) / sigma^4``; the largest share ``c_i^2 Var(z_i) / sigma^2`` of
one noise value (1: ``e`` *is* one noise value, scaled); the sampler scale of that term and the
smallest among the terms; and, for exact noise, the lattice ``delta Z`` on which ``e`` lies when
every ``|c_i| g_i`` is an integer multiple of the smallest (0 otherwise).

Quantiles:

* one noise value: the exact quantile of its distribution (:func:`single_term_half_width`).
* several: the variance-gamma distribution with the same variance and fourth cumulant
  (:func:`vg_multiplier`): ``X = sqrt(V) N``, ``V ~ Gamma(lambda, 1 / lambda)``, ``lambda = 3 /
  gamma_2``.  A sum of ``lambda`` equal Laplace variables has exactly this law (so one Laplace term,
  ``gamma_2 = 3``, is exact), and it tends to the normal as ``gamma_2 -> 0``; for unequal weights it
  is Satterthwaite's two-moment approximation of the mixing variance ``sum_i p_i E_i`` of the
  Laplace sum by a gamma variable.  On a lattice the quantile is continuity-corrected: the smallest
  ``k`` with ``P_VG(|X| <= (k + 1/2) delta) >= level``, half-width ``k delta``.
* certified bounds (:func:`certified_multiplier`): for float Laplace sums the convex-order bound of
  :func:`laplace_multiplier`; for discrete Laplace ``K = floor(t E_1) - floor(t E_2)`` (``E_j ~
  Exp(1)``) ``= L + D`` with ``L ~ Lap(t)`` and ``|D| < 1`` symmetric, independent across terms,
  so ``P(|e| > h) <= P(|sum a_i L_i| > h - d) + 2 exp(-d^2 / (2 sum a_i^2))`` (Hoeffding,
  ``a_i = c_i g_i``); for discrete Gaussian noise the sub-Gaussian bound ``E e^{s K} <= e^{s^2
  sigma^2 / 2}`` (Canonne, Kamath, Steinke 2020), ``P(|e| > h) <= 2 exp(-h^2 / (2 sum a_i^2
  sigma_i^2))``; each capped by Chebyshev.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import integrate, interpolate, optimize, special

from .errors import SparseDPError

__all__ = [
    "ErrorShape",
    "NoiseRows",
    "ShapeAccumulator",
    "certified_multiplier",
    "laplace_multiplier",
    "noise_rows",
    "single_term_half_width",
    "vg_multiplier",
]

#: an answer whose largest term holds at least this share of its variance is that term alone
SINGLE = 1.0 - 1e-12
#: a term below this share of its answer's variance is not counted as a term (lattice, smallest scale)
_NEGLIGIBLE = 1e-24
#: half-widths on a lattice ``k delta`` are widened by ``1e-6 delta``: rounding in the estimate
#: cannot move a lattice point out of its interval
_SLACK = 1e-6
_DG_SUMMED = 3.0  # discrete Gaussian: pmf sums below this sigma, normal values above


# -- discrete Laplace ---------------------------------------------------------------------------


def dl_variance(t: Any) -> np.ndarray:
    """``Var(K) = 2 q / (1 - q)^2 = 1 / (2 sinh^2(1 / (2 t)))`` of the discrete Laplace of scale ``t``."""
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore"):
        return 0.5 / np.sinh(0.5 / t) ** 2


def dl_scale_from_variance(var: Any) -> np.ndarray:
    """The scale ``t`` whose discrete Laplace has variance ``var`` (grid units)."""
    var = np.asarray(var, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return 0.5 / np.arcsinh(1.0 / np.sqrt(2.0 * var))


def dl_scale_from_ratio(r: Any) -> np.ndarray:
    """The scale ``t`` with ``sd(K) / t = r``: ``sqrt(2) u / sinh(u) = r``, ``u = 1 / (2 t)``.
    (A row's standard deviation over its scale, both in data units, names its sampler scale.)"""
    y = np.asarray(r, dtype=np.float64) / math.sqrt(2.0)  # u / sinh(u), in (0, 1]
    out = np.full(y.shape, np.inf)
    near = (y > 1.0 - 1e-6) & (y < 1.0)
    out[near] = 0.5 / np.sqrt(6.0 * (1.0 - y[near]))  # u / sinh u = 1 - u^2 / 6 + ...
    far = y <= 1.0 - 1e-6
    if np.any(far):
        yf = y[far]
        lo, hi = np.zeros_like(yf), np.full_like(yf, 700.0)
        for _ in range(80):  # u / sinh(u) decreases in u
            mid = 0.5 * (lo + hi)
            big = mid / np.sinh(mid) > yf
            lo = np.where(big, mid, lo)
            hi = np.where(big, hi, mid)
        out[far] = 0.5 / (0.5 * (lo + hi))
    return out


def dl_excess_kurtosis(t: Any) -> np.ndarray:
    """``kappa_4 / Var^2 = 3 + 2 sinh^2(1 / (2 t))`` of the discrete Laplace (3 for ``t = inf``)."""
    t = np.asarray(t, dtype=np.float64)
    with np.errstate(over="ignore", divide="ignore"):
        return 3.0 + 2.0 * np.sinh(0.5 / t) ** 2


def dl_quantile(t: Any, level: float) -> np.ndarray:
    """Smallest integer ``k >= 0`` with ``P(|K| <= k) >= level``: ``P(|K| > k) = 2 q^{k+1} / (1 +
    q)``, so ``k = ceil(t ln(2 / ((1 - level)(1 + q)))) - 1``."""
    t = np.asarray(t, dtype=np.float64)
    q = np.exp(-1.0 / t)
    k = np.ceil(t * np.log(2.0 / ((1.0 - level) * (1.0 + q)))) - 1.0
    return np.maximum(k, 0.0)


# -- discrete Gaussian --------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _dg_pmf(sigma: float) -> tuple[np.ndarray, np.ndarray]:
    K = int(math.ceil(40 * sigma + 10))
    k = np.arange(0, K + 1, dtype=np.float64)
    w = np.exp(-(k * k) / (2.0 * sigma * sigma))
    w[1:] *= 2.0  # |K| = k
    return k, w / w.sum()


def _dg_moments(sigma: float) -> tuple[float, float]:
    if sigma >= _DG_SUMMED:
        return sigma * sigma, 0.0
    k, p = _dg_pmf(float(sigma))
    m2 = float((p * k * k).sum())
    m4 = float((p * k**4).sum())
    return m2, m4 / (m2 * m2) - 3.0


def dg_variance(sigma: Any) -> np.ndarray:
    s = np.asarray(sigma, dtype=np.float64)
    return np.vectorize(lambda x: _dg_moments(float(x))[0], otypes=[float])(s) if s.size else s.copy()


def dg_excess_kurtosis(sigma: Any) -> np.ndarray:
    s = np.asarray(sigma, dtype=np.float64)
    return np.vectorize(lambda x: _dg_moments(float(x))[1], otypes=[float])(s) if s.size else s.copy()


def _dg_from(value: float, ratio: bool) -> float:
    """``sigma`` with ``var_DG(sigma) = value`` (``ratio=False``) or ``sigma^2 / var_DG(sigma) =
    value`` (``True``; ``nan`` where the ratio does not identify it: ``sigma`` above ~1.2)."""
    if ratio:
        if not value > 1.0 + 1e-12:
            return float("nan")
        f = lambda s: s * s / _dg_moments(s)[0] - value  # noqa: E731  decreasing in s
        return float(optimize.brentq(f, 1e-3, _DG_SUMMED, xtol=1e-14)) if f(1e-3) > 0 > f(_DG_SUMMED) else float("nan")
    if value >= _DG_SUMMED**2:
        return math.sqrt(value)
    f = lambda s: _dg_moments(s)[0] - value  # noqa: E731  increasing in s
    return float(optimize.brentq(f, 1e-3, _DG_SUMMED, xtol=1e-14)) if f(1e-3) < 0 else 1e-3


def dg_quantile(sigma: Any, level: float) -> np.ndarray:
    """Smallest integer ``k >= 0`` with ``P(|K| <= k) >= level`` for the discrete Gaussian."""
    s = np.asarray(sigma, dtype=np.float64)
    z = float(special.ndtri(0.5 + level / 2.0))

    def one(x: float) -> float:
        if x >= _DG_SUMMED:
            return max(0.0, math.ceil(z * x - 0.5))
        k, p = _dg_pmf(float(x))
        return float(np.searchsorted(np.cumsum(p), level - 1e-15))

    return np.vectorize(one, otypes=[float])(s) if s.size else s.copy()


# -- the noise of each row ----------------------------------------------------------------------


@dataclass(frozen=True)
class NoiseRows:
    """Per noise row: variance ``v`` (data units), excess kurtosis ``gamma2``, sampler scale
    ``unit`` (``t`` or ``sigma`` in grid units; ``inf`` for float noise, ``nan`` if unknown) and grid
    ``grid`` (data units per grid unit; ``nan`` for float or unknown)."""

    kind: str  # "laplace" or "gaussian"
    secure: bool
    v: np.ndarray
    gamma2: np.ndarray
    unit: np.ndarray
    grid: np.ndarray

    @property
    def lattice(self) -> bool:
        return bool(self.secure) and bool(np.all(np.isfinite(self.grid)))


def noise_rows(noise: str, secure: bool, variances: Any, *, scales: Any = None,
               unit_scales: Any = None) -> NoiseRows:
    """:class:`NoiseRows` of a measurement: ``variances`` per row (data units), and for exact noise
    ``unit_scales`` (the sampler's ``t_i`` / ``sigma_i`` in grid units) or ``scales`` (``b_i`` /
    ``sigma_i`` in data units, ``= g_i t_i``), from which the sampler scale is solved (always for the
    discrete Laplace; for the discrete Gaussian only below ``sigma ~ 1.2``, where its variance
    differs from ``sigma^2``).  Without either, exact noise is treated as its float counterpart."""
    if noise not in ("laplace", "gaussian"):
        raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
    v = np.array(variances, dtype=np.float64, ndmin=1)
    m = v.size
    nan = np.full(m, np.nan)
    if not secure:
        g2 = np.full(m, 3.0 if noise == "laplace" else 0.0)
        return NoiseRows(noise, False, v, g2, np.full(m, np.inf), nan)
    if unit_scales is not None:
        unit = np.broadcast_to(np.asarray(unit_scales, dtype=np.float64), (m,)).copy()
    elif scales is not None:
        b = np.broadcast_to(np.asarray(scales, dtype=np.float64), (m,))
        if m and b.min() == b.max() and v.min() == v.max():  # homoscedastic: one scale
            vals, inv = np.array([[b[0]], [v[0]]]), np.zeros(m, dtype=np.int64)
        else:
            vals, inv = np.unique(np.stack([b, v]), axis=1, return_inverse=True)
            inv = np.ravel(inv)
        if noise == "laplace":
            u = dl_scale_from_ratio(np.sqrt(vals[1]) / vals[0])
        else:
            u = np.array([_dg_from(float(bb * bb / vv), True) for bb, vv in vals.T])
        unit = u[inv]
    else:
        unit = nan.copy()
    known = np.isfinite(unit) & (unit > 0)
    grid = nan.copy()
    g2 = np.full(m, 3.0 if noise == "laplace" else 0.0)
    if np.any(known):
        uk, inv = np.unique(unit[known], return_inverse=True)
        if noise == "laplace":
            var_u, g2u = dl_variance(uk), dl_excess_kurtosis(uk)
        else:
            var_u, g2u = dg_variance(uk), dg_excess_kurtosis(uk)
        grid[known] = np.sqrt(v[known] / var_u[inv])
        g2[known] = g2u[inv]
    unit[~known & ~np.isinf(unit)] = np.nan
    return NoiseRows(noise, True, v, g2, unit, grid)


# -- shapes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorShape:
    """What the intervals use of each answer's error beyond its variance (one entry per answer).

    ``kurtosis``: excess kurtosis ``sum_i c_i^4 kappa_4(z_i) / sigma^4`` (0 normal, 3 one Laplace
    term); ``lead``: the largest share ``c_i^2 Var(z_i) / sigma^2`` of one noise value (1: the error
    is that value, scaled); ``unit``: that term's sampler scale (grid units; ``inf`` float noise,
    ``nan`` unknown); ``unit_min``: the smallest sampler scale among the terms (certified bounds;
    default ``unit``); ``lattice``: ``delta > 0`` when the error lies on ``delta Z`` (data units),
    else 0.  Arrays or numbers (broadcast to the answers)."""

    kurtosis: Any
    lead: Any = 0.0
    unit: Any = np.inf
    unit_min: Any = None
    lattice: Any = 0.0

    def broadcast(self, q: int) -> ErrorShape:
        def b(x: Any) -> np.ndarray:
            return np.broadcast_to(np.asarray(x, dtype=np.float64), (q,))

        umin = self.unit if self.unit_min is None else self.unit_min
        return ErrorShape(b(self.kurtosis), b(self.lead), b(self.unit), b(umin), b(self.lattice))


class ShapeAccumulator:
    """:class:`ErrorShape` of ``q`` answers from blocks of their coefficient matrix ``C`` (answers
    x noise rows): :meth:`add` ``(C[:, cols], cols)`` for blocks of columns covering every row
    once, then :meth:`result`.  ``sigma2`` (the answers' variances, if known) sets which terms are
    negligible (``< 1e-24 sigma^2``); otherwise every non-zero coefficient is a term."""

    def __init__(self, q: int, rows: NoiseRows, sigma2: Any = None) -> None:
        self.rows = rows
        self.s2 = np.zeros(q)
        self.s4 = np.zeros(q)
        self.top = np.zeros(q)
        self.unit = np.full(q, np.nan)
        self.umin = np.full(q, np.inf)
        self.delta = np.full(q, np.inf)
        self.ok = np.full(q, rows.lattice)
        self.thr = np.zeros(q) if sigma2 is None else _NEGLIGIBLE * np.asarray(sigma2, dtype=np.float64)

    def add(self, C: Any, cols: Any) -> None:
        C = np.asarray(C.toarray() if hasattr(C, "toarray") else C, dtype=np.float64)
        r = self.rows
        T = C * C * r.v[cols]
        self.s2 += T.sum(axis=1)
        self.s4 += (T * T) @ r.gamma2[cols]
        if not T.shape[1]:
            return
        j = T.argmax(axis=1)
        tb = T[np.arange(T.shape[0]), j]
        upd = tb > self.top
        self.top[upd] = tb[upd]
        unit = r.unit[cols]
        self.unit[upd] = unit[j[upd]]
        sig = T > self.thr[:, None]
        self.umin = np.minimum(self.umin, np.where(sig, unit[None, :], np.inf).min(axis=1))
        if np.any(self.ok):
            A = np.abs(C) * r.grid[cols]
            mb = np.where(sig, A, np.inf).min(axis=1)
            new = np.minimum(self.delta, mb)
            with np.errstate(invalid="ignore", divide="ignore"):
                moved = np.isfinite(self.delta) & (new < self.delta)
                self.ok &= ~moved | _integral(self.delta / new)
                R = A / new[:, None]
                self.ok &= np.all(~sig | _integral(R), axis=1)
            self.delta = new

    def result(self) -> ErrorShape:
        with np.errstate(invalid="ignore", divide="ignore"):
            pos = self.s2 > 0
            kurt = np.where(pos, self.s4 / np.where(pos, self.s2, 1.0) ** 2, 0.0)
            lead = np.where(pos, self.top / np.where(pos, self.s2, 1.0), 0.0)
        lat = np.where(self.ok & np.isfinite(self.delta), self.delta, 0.0)
        return ErrorShape(kurt, lead, self.unit.copy(), self.umin.copy(), lat)  # nan: a term's scale is unknown


def _integral(r: np.ndarray) -> np.ndarray:
    return np.abs(r - np.rint(r)) <= 1e-8 * np.maximum(1.0, np.abs(r))


# -- float Laplace sums: the certified convex-order multiplier ----------------------------------


def _tail(w: float, k: float) -> float:
    """``g(w) = P(|N(0, w)| > k)``."""
    return float(special.erfc(k / math.sqrt(2.0 * w))) if w > 0 else 0.0


def _majorant_tail(k: float, w0: float) -> float:
    """``E h(E_1)``, ``h`` = ``g`` on ``[0, w0]`` and the steepest chord from ``w0`` beyond (a convex
    majorant of ``g`` when ``w0 <= k^2 / 3``)."""
    g0 = _tail(w0, k)

    def neg_chord(x: float) -> float:
        d = math.exp(x)
        return -(_tail(w0 + d, k) - g0) / d

    res = optimize.minimize_scalar(neg_chord, bounds=(math.log(1e-9 * (1 + w0)), math.log(1e4 * (1 + k * k))),
                                   method="bounded", options={"xatol": 1e-10})
    slope = -float(res.fun) * (1 + 1e-6)
    head = integrate.quad(lambda u: _tail(u, k) * math.exp(-u), 0.0, w0, epsabs=1e-14, epsrel=1e-10, limit=200)[0]
    return head + math.exp(-w0) * (g0 + slope)


def _laplace_tail_bound(k: float) -> float:
    """Upper bound on ``P(|sum_i c_i z_i| > k)`` over independent Laplace ``z_i`` with total variance 1."""
    res = optimize.minimize_scalar(lambda w0: _majorant_tail(k, w0), bounds=(1e-6 * k * k, k * k / 3.0),
                                   method="bounded", options={"xatol": 1e-8 * k * k})
    return min(float(res.fun), _majorant_tail(k, k * k / 3.0), 1.0)


@functools.lru_cache(maxsize=256)
def laplace_multiplier(level: float) -> float:
    """``kappa`` with ``P(|sum_i c_i L_i| <= kappa sigma) >= level`` for every combination of
    independent float Laplace variables (2.157 at 95%)."""
    alpha = 1.0 - level
    k = optimize.brentq(lambda k: _laplace_tail_bound(k) - alpha, 1e-3, 80.0, xtol=1e-10, rtol=1e-12)
    return k * (1 + 1e-6)  # rounded up: coverage stays >= level


# -- the variance-gamma multiplier --------------------------------------------------------------


def _vg_tail(x: np.ndarray, lam: np.ndarray, npts: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    """``P(|X| > x)`` and its derivative in ``x`` for ``X = sqrt(V) N``, ``V ~ Gamma(lam, 1 /
    lam)``: the trapezoid rule in ``u = log V`` (the integrand is smooth and decays at both ends)."""
    big = np.sqrt(100.0 / lam)
    lo = np.maximum(np.log(np.maximum(x, 1e-3) ** 2 / 90.0), -np.maximum(big, 60.0 / lam + 3.0))
    hi = np.maximum(np.maximum(big, np.log(10.0 + 80.0 / lam)), lo + 1.0)  # (far tails: ~0 either way)
    s = np.linspace(0.0, 1.0, npts)
    u = lo[:, None] + (hi - lo)[:, None] * s
    L = lam[:, None]
    dens = np.exp(L * np.log(L) + L * u - L * np.exp(u) - special.gammaln(L))
    sd = np.exp(0.5 * u)
    f = dens * special.erfc(x[:, None] / (math.sqrt(2.0) * sd))
    d = -dens * math.sqrt(2.0 / math.pi) / sd * np.exp(-0.5 * (x[:, None] / sd) ** 2)
    du = (hi - lo) / (npts - 1)

    def trap(g: np.ndarray) -> np.ndarray:
        return (g.sum(axis=1) - 0.5 * (g[:, 0] + g[:, -1])) * du

    return trap(f), trap(d)


_VG_LOW, _VG_HIGH = 1e-3, 1e3  # kurtosis range of the table (Cornish-Fisher below, clamped above)


@functools.lru_cache(maxsize=64)
def _vg_table(level: float) -> interpolate.PchipInterpolator:
    alpha = 1.0 - level
    g = np.logspace(math.log10(_VG_LOW), math.log10(_VG_HIGH), 145)
    lam = 3.0 / g
    z = float(special.ndtri(0.5 + level / 2.0))
    lo = np.full(g.size, 1e-3)
    hi = np.full(g.size, 1e3)
    x = np.full(g.size, z)
    for _ in range(60):  # safeguarded Newton on the decreasing tail
        t, dt = _vg_tail(x, lam)
        lo = np.where(t > alpha, x, lo)
        hi = np.where(t > alpha, hi, x)
        step = x - (t - alpha) / np.where(dt < 0, dt, -1.0)
        x_new = np.where((step >= lo) & (step <= hi), step, 0.5 * (lo + hi))
        if np.all(np.abs(x_new - x) <= 1e-12 * x):
            x = x_new
            break
        x = x_new
    return interpolate.PchipInterpolator(np.log(g), x)


def vg_multiplier(level: float, kurtosis: Any) -> np.ndarray:
    """``kappa`` with ``P(|X| <= kappa) = level`` for the standardised variance-gamma law of excess
    kurtosis ``kurtosis`` (per entry; below ``1e-3``, and for negative values, the Cornish-Fisher
    ``z + gamma_2 (z^3 - 3 z) / 24``, which agrees there to ``1e-6``)."""
    g = np.asarray(kurtosis, dtype=np.float64)
    z = float(special.ndtri(0.5 + level / 2.0))
    out = z + g * (z**3 - 3.0 * z) / 24.0
    tab = g >= _VG_LOW
    if np.any(tab):
        out = np.array(out, dtype=np.float64, copy=True)
        out[tab] = _vg_table(float(level))(np.log(np.minimum(g[tab], _VG_HIGH)))
    return out


# -- single terms and certified bounds ----------------------------------------------------------


def single_term_half_width(level: float, sd: np.ndarray, kind: str, unit: np.ndarray) -> np.ndarray:
    """Exact half-width ``h`` (smallest with ``P(|e| <= h) >= level``) of ``e = a z`` with one
    noise value ``z`` (``sd`` the standard deviation of ``e``).  Float noise (``unit = inf``) and
    unknown sampler scales (``nan``): the Laplace ``sd ln(1 / (1 - level)) / sqrt 2`` or normal
    quantile; exact noise: ``(k + 1e-6) |a| g`` with the discrete quantile ``k``."""
    sd = np.asarray(sd, dtype=np.float64)
    unit = np.broadcast_to(np.asarray(unit, dtype=np.float64), sd.shape)
    if kind == "laplace":
        h = sd * math.log(1.0 / (1.0 - level)) / math.sqrt(2.0)
    else:
        h = sd * float(special.ndtri(0.5 + level / 2.0))
    disc = np.isfinite(unit) & (unit > 0)
    if np.any(disc):
        uk, inv = np.unique(unit[disc], return_inverse=True)
        if kind == "laplace":
            k, var = dl_quantile(uk, level), dl_variance(uk)
        else:
            k, var = dg_quantile(uk, level), dg_variance(uk)
        step = sd[disc] / np.sqrt(var[inv])  # |a| g: the error's lattice step
        h = np.array(h, copy=True)
        h[disc] = (k[inv] + _SLACK) * step
    return h


def lattice_half_width(kappa: np.ndarray, sd: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Continuity-corrected half-width on a lattice ``delta Z``: ``k delta`` with the smallest
    ``k >= 0`` such that ``(k + 1/2) delta >= kappa sd``."""
    k = np.maximum(np.ceil(kappa * sd / delta - 0.5), 0.0)
    return (k + _SLACK) * delta


@functools.lru_cache(maxsize=1024)
def _dl_certified(t: float, level: float) -> float:
    """``h / sigma`` certified for sums of discrete Laplace terms whose sampler scales are all
    ``>= t``: ``rho kappa_L(1 - (alpha - a2)) + r sqrt(2 ln(2 / a2))`` minimised over ``a2``, with
    ``rho^2 = max 2 t_i^2 / Var(K_i) = 4 t^2 sinh^2(1 / (2 t))`` (the Laplace parts' variance over
    the answer's) and ``r^2 = max 1 / Var(K_i) = 2 sinh^2(1 / (2 t))`` (``sum a_i^2`` over it)."""
    alpha = 1.0 - level
    cheb = 1.0 / math.sqrt(alpha)
    if not t > 0:
        return cheb
    if math.isinf(t):
        return min(laplace_multiplier(level), cheb)
    sh = math.sinh(0.5 / t)
    rho, r = 2.0 * t * sh, math.sqrt(2.0) * sh
    best = cheb
    for frac in (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7):
        a2 = frac * alpha
        h = rho * laplace_multiplier(round(1.0 - (alpha - a2), 12)) + r * math.sqrt(2.0 * math.log(2.0 / a2))
        best = min(best, h)
    return best


def _dg_certified(sigma: float, level: float) -> float:
    """``h / sigma_e`` certified for sums of discrete Gaussian terms whose parameters are all
    ``>= sigma``: ``sqrt(sigma^2 / Var(K)) sqrt(2 ln(2 / alpha))``, capped by Chebyshev."""
    alpha = 1.0 - level
    cheb = 1.0 / math.sqrt(alpha)
    if not sigma > 0:
        return cheb
    ratio = 1.0 if math.isinf(sigma) or sigma >= _DG_SUMMED else sigma * sigma / _dg_moments(sigma)[0]
    return min(cheb, math.sqrt(ratio) * math.sqrt(2.0 * math.log(2.0 / alpha)))


def certified_multiplier(level: float, kind: str, secure: bool, unit_min: Any) -> np.ndarray:
    """Per answer a multiplier ``kappa`` with ``P(|e| <= kappa sigma) >= level`` for *every* error
    of this noise whose terms have sampler scales ``>= unit_min`` (``nan``: unknown -> Chebyshev)."""
    um = np.asarray(unit_min, dtype=np.float64)
    alpha = 1.0 - level
    cheb = 1.0 / math.sqrt(alpha)
    if not secure:
        val = float(special.ndtri(0.5 + level / 2.0)) if kind == "gaussian" else min(laplace_multiplier(level), cheb)
        return np.full(um.shape, val)
    out = np.full(um.shape, cheb)
    known = ~np.isnan(um)
    if np.any(known):
        uk, inv = np.unique(um[known], return_inverse=True)
        f = _dl_certified if kind == "laplace" else _dg_certified
        out[known] = np.array([f(float(u), float(level)) for u in uk])[inv]
    return out
