"""Accuracy of GLS workload answers: the variance of every answer, their total, and intervals.

For measurements ``y = M x + z`` with independent noise ``Var(z_i) = v_i`` and the GLS estimate
``x_hat = G y`` (``G = (M^T V^-1 M)^-1 M^T V^-1``, which is ``M^-1`` for a square invertible
strategy), the workload answers ``W x_hat`` are unbiased; answer ``q`` has variance

    Var(w_q^T x_hat) = sum_i v_i (W G)_{qi}^2 = w_q^T (M^T V^-1 M)^-1 w_q,

and their total squared error is ``E = trace(W G V G^T W^T)``.  With homoscedastic Laplace noise on
a square strategy ``E`` is the low-rank mechanism's ``(2 Delta^2 / eps^2) trace(B^T B)``,
``B = W M^-1`` (seed 000, eq. 5.2 and 5.9).

How it is computed (``ErrorReport.method``), never with a dense inverse:

* ``exact-tree``, ``exact-fenwick``, ``exact-haar``, ``exact-identity``: hierarchical (any
  per-node variances), Fenwick, Haar and identity strategies and their weighted forms, with range
  lists, prefix, identity, total, all-range or any explicit sparse workload: every answer's
  variance in closed form (:mod:`sparsedp.range_variance`), ``O(levels)`` per range after an
  ``O(nodes)`` pass, batched; ``all_ranges`` as the exact total
  ``(n + 1) sum_t Var(P_t) - Var(sum_t P_t)`` over the prefix estimates ``P_t`` (per-answer
  variances too when there are at most ``max_variances`` ranges).
* ``sparse-inverse``: the same strategies with any other implicit workload: the total from the
  image norms of the sparse ``G V^{1/2}``.
* ``exact-blocks``: any other strategy: ``G`` applied to blocks of unit vectors with the fast
  estimator, ``O(rows)`` solves; exact, for moderate sizes (``rows * n <= exact_limit``).
* ``estimate``: Hutchinson's estimator ``E_z (W G V^{1/2} z)^2`` with Rademacher ``z``, per answer
  and in total, with the total's standard error.

Before a generic path allocates, it estimates its memory and raises
:class:`~sparsedp.range_variance.MemoryLimitError` (naming the amount) if it would exceed
``memory_limit`` (default 4 GB); it shrinks its blocks first.

Confidence intervals (:meth:`ErrorReport.confidence_intervals`): the error of answer ``q`` is
``sum_i c_i z_i``, ``c = G^T w_q``, with variance ``sigma_q^2``.

* Gaussian noise: the error is ``N(0, sigma_q^2)``: ``answer +- z_{(1+level)/2} sigma_q``, exact.
* Laplace noise: ``answer +- kappa(level) sigma_q`` with coverage *at least* ``level`` for every
  such sum.  Each ``Lap(b)`` is a normal scale mixture ``N(0, 2 b^2 E)``, ``E ~ Exp(1)``, so the
  error is ``N(0, sigma_q^2 sum_i p_i E_i)`` given the ``E_i`` (``p_i = 2 c_i^2 b_i^2 /
  sigma_q^2`` sum to 1).  ``sum_i p_i E_i`` is below ``E_1`` in convex order (Jensen), so for any
  convex ``h >= g``, ``g(w) = P(|N(0, w)| > t)``: ``P(|error| > t) <= E h(sigma_q^2 E_1)``.
  ``h`` is ``g`` up to a point ``w0 <= t^2 / 3`` (where ``g`` is convex) and then the steepest
  chord of ``g`` from ``w0``; ``kappa`` is the smallest ``t / sigma`` whose bound, minimised over
  ``w0``, is ``1 - level`` (computed numerically, rounded up).  ``kappa(0.95) = 2.157``; a single
  Laplace term, one of the sums covered, needs ``2.118`` (so no valid multiplier is smaller), a
  normal ``1.960``.
* Exact discrete noise (``secure=True``) or unknown noise: Chebyshev, ``sigma_q / sqrt(1 -
  level)``: coverage at least ``level`` for any noise distribution.
* ``method="normal"``: ``z_{(1+level)/2} sigma_q`` as an *approximation* for non-Gaussian noise
  (the central limit theorem; no coverage guarantee).

Intervals are for the GLS answers (``reconstruct(..., method="ls")``); ``nnls`` and ``l1`` fits
are biased and not covered.  With ``method="estimate"`` the variances are estimates too.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import integrate, optimize, special

from .errors import SparseDPError
from .inference import linear_estimator, sparse_inverse
from .operators import Operator, SparseOperator, aslinearoperator
from .range_variance import (
    DEFAULT_MEMORY_LIMIT,
    MemoryLimitError,
    StructuredCovariance,
    check_memory,
    format_bytes,
    structured_covariance,
)
from .workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload, WeightedUnionWorkload

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ErrorReport",
    "MemoryLimitError",
    "expected_error",
    "interval_multiplier",
]

INTERVAL_METHODS = ("auto", "gaussian", "laplace", "chebyshev", "normal")


@dataclass(frozen=True)
class ErrorReport:
    """Accuracy of the workload answers and how it was obtained.

    ``total`` is the expected total squared error, ``per_query`` its mean over the answers,
    ``variances`` each answer's variance (``None`` only for an all-range workload too large to
    list), ``stderr`` the standard error of an estimated total (0 when exact), ``noise`` /
    ``secure`` the noise the variances come from (``None`` if not given).
    """

    total: float
    per_query: float  # total / number of workload queries
    method: str  # "exact-tree", "exact-fenwick", "exact-haar", "exact-identity", "sparse-inverse",
    #              "exact-blocks" or "estimate"
    stderr: float = 0.0  # standard error of an estimated total; 0 when exact
    variances: np.ndarray | None = field(default=None, repr=False, compare=False)
    noise: str | None = None
    secure: bool = False

    @property
    def exact(self) -> bool:
        return self.method != "estimate"

    def __float__(self) -> float:
        return self.total

    def interval_method(self, method: str = "auto") -> str:
        """The interval method ``method="auto"`` resolves to (see the module docstring)."""
        if method not in INTERVAL_METHODS:
            raise SparseDPError(f"interval method must be one of {INTERVAL_METHODS}, got {method!r}")
        if method != "auto":
            return method
        if self.secure:
            return "chebyshev"
        if self.noise in ("gaussian", "laplace"):
            return self.noise
        raise SparseDPError(
            "the noise of this report is unknown: pass noise='laplace' or 'gaussian' (and secure=) to "
            "expected_error, or choose the interval method ('chebyshev' holds for any noise)"
        )

    def half_widths(self, level: float = 0.95, method: str = "auto") -> np.ndarray:
        """Half-width of each answer's interval at confidence ``level``."""
        if self.variances is None:
            raise SparseDPError("this report has no per-answer variances (all_ranges above max_variances)")
        return interval_multiplier(level, self.interval_method(method)) * np.sqrt(self.variances)

    def confidence_intervals(self, answers: Any, level: float = 0.95,
                             method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around the GLS ``answers`` (one per workload query on the last axis;
        leading axes, e.g. one row per run, broadcast)."""
        a = np.asarray(answers, dtype=np.float64)
        h = self.half_widths(level, method)
        if a.ndim < 1 or a.shape[-1] != h.size:
            raise SparseDPError(f"answers of shape {a.shape} for a report of {h.size} queries (the last axis)")
        return a - h, a + h


# -- interval multipliers ------------------------------------------------------------------------


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


@functools.lru_cache(maxsize=64)
def _laplace_multiplier(level: float) -> float:
    alpha = 1.0 - level
    k = optimize.brentq(lambda k: _laplace_tail_bound(k) - alpha, 1e-3, 80.0, xtol=1e-10, rtol=1e-12)
    return k * (1 + 1e-6)  # rounded up: coverage stays >= level


def interval_multiplier(level: float, method: str) -> float:
    """``kappa`` with ``answer +- kappa sigma`` covering the truth with probability ``level``:
    ``gaussian`` / ``normal`` the normal quantile, ``laplace`` the guaranteed bound for sums of
    independent Laplace variables, ``chebyshev`` ``1 / sqrt(1 - level)`` (any noise)."""
    lv = float(level)
    if not 0.0 < lv <= 1.0 - 1e-9:
        raise SparseDPError(f"level must lie in (0, 1 - 1e-9], got {level!r}")
    if method in ("gaussian", "normal"):
        return float(special.ndtri(0.5 + lv / 2.0))
    if method == "laplace":
        return _laplace_multiplier(lv)
    if method == "chebyshev":
        return 1.0 / math.sqrt(1.0 - lv)
    raise SparseDPError(f"interval method must be 'gaussian', 'laplace', 'chebyshev' or 'normal', got {method!r}")


# -- the report ----------------------------------------------------------------------------------


def _check_variances(variances: Any, m: int) -> np.ndarray:
    try:
        v = np.broadcast_to(np.asarray(variances, dtype=np.float64), (m,))
    except (TypeError, ValueError) as exc:
        raise SparseDPError(f"variances must be a number or one per strategy row ({m})") from exc
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise SparseDPError("variances must be finite and > 0")
    return v


def _structured(W: Operator, cov: StructuredCovariance, memory_limit: float,
                max_variances: int) -> tuple[float, np.ndarray | None] | None:
    """``(total, variances)`` of a workload on a structured strategy, or ``None`` if the workload
    has no exact path here."""
    n = cov.n
    if isinstance(W, WeightedUnionWorkload):
        # rows sqrt(c_i) W_i: answer variances c_i Var(W_i answers), total sum_i c_i E_i
        got = [(c, _structured(Wi, cov, memory_limit, max_variances)) for c, Wi in W.parts]
        if any(g is None for _, g in got):
            return None
        total = float(sum(c * g[0] for c, g in got))  # type: ignore[index]
        var = None
        if all(g[1] is not None for _, g in got):  # type: ignore[index]
            var = np.concatenate([c * g[1] for c, g in got])  # type: ignore[index]
        return total, var
    if isinstance(W, RangeQueriesWorkload):
        check_memory(cov.memory(W.lo.size), memory_limit, "the per-query variances of these ranges")
        var = cov.ranges(W.lo, W.hi + 1)
        return float(var.sum()), var
    if isinstance(W, PrefixWorkload):
        check_memory(cov.memory(n), memory_limit, "the per-query variances of the prefix workload")
        var = cov.prefix()
        return float(var.sum()), var
    if isinstance(W, AllRangesWorkload):
        check_memory(cov.memory(n), memory_limit, "the prefix variances of the all-range workload")
        pv = cov.prefix()
        # sum_{a<b} (S_b - S_a)^2 = (n + 1) sum_t S_t^2 - (sum_t S_t)^2 for the prefix errors S
        total = (n + 1) * float(pv.sum()) - cov.functional(np.arange(n, 0, -1, dtype=np.float64))
        var = None
        queries = W.shape[0]
        if queries <= max_variances and cov.memory(queries) + 16.0 * queries <= memory_limit:
            a, b = np.triu_indices(n + 1, k=1)
            var = cov.ranges(a, b)
        return total, var
    if isinstance(W, SparseOperator):
        var = cov.rows(W.matrix, memory_limit)
        return float(var.sum()), var
    return None


def expected_error(
    workload: Any,
    strategy: Any,
    variances: Any,
    *,
    method: str = "auto",
    exact_limit: float = 2.0**27,
    probes: int = 64,
    block: int = 512,
    rng: Any = None,
    memory_limit: float = DEFAULT_MEMORY_LIMIT,
    max_variances: int = 1 << 24,
    noise: str | None = None,
    secure: bool = False,
) -> ErrorReport:
    """Variance of every GLS workload answer and their total ``sum_i v_i ||W G e_i||^2``.

    ``method``: ``"auto"`` (the exact structured path for identity / Fenwick / Haar / tree
    strategies, exact blocks if ``rows(M) * n <= exact_limit``, else an estimate), ``"exact"`` or
    ``"estimate"``.  ``memory_limit`` (bytes) bounds what the computation allocates: a path that
    would need more raises :class:`MemoryLimitError` before allocating.  ``noise`` (``"laplace"``
    or ``"gaussian"``) and ``secure`` are recorded for :meth:`ErrorReport.confidence_intervals`.
    """
    W = aslinearoperator(workload)
    M = aslinearoperator(strategy)
    m, n = M.shape
    if W.shape[1] != n:
        raise SparseDPError(f"workload has {W.shape[1]} columns but the strategy {n}")
    if method not in ("auto", "exact", "estimate"):
        raise SparseDPError(f"method must be 'auto', 'exact' or 'estimate', got {method!r}")
    if noise not in (None, "laplace", "gaussian"):
        raise SparseDPError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
    if not memory_limit > 0:
        raise SparseDPError(f"memory_limit must be > 0 bytes, got {memory_limit!r}")
    v = _check_variances(variances, m)
    queries = W.shape[0]
    tag = {"noise": noise, "secure": bool(secure)}
    per = _per_query(W, max_variances, memory_limit)
    if method != "estimate":
        cov = structured_covariance(M, v)
        if cov is not None:
            got = _structured(W, cov, memory_limit, max_variances)
            if got is not None:
                total, var = got
                return ErrorReport(total, total / queries, f"exact-{cov.kind}", variances=var, **tag)
            G = sparse_inverse(M)
            if G is not None:
                check_memory(24.0 * G.nnz + 16.0 * n * 256, memory_limit, "the sparse-inverse image norms")
                total = float(W.image_sq_norms(sp.csc_matrix(G)) @ v)
                return ErrorReport(total, total / queries, "sparse-inverse", **tag)
        if method == "exact" or m * n <= exact_limit:
            total, var = _exact_blocks(W, M, v, block, memory_limit, per)
            return ErrorReport(total, total / queries, "exact-blocks", variances=var, **tag)
    total, var, stderr = _estimate(W, M, v, probes, block, rng, memory_limit, per)
    return ErrorReport(total, total / queries, "estimate", stderr, variances=var, **tag)


# -- generic paths -------------------------------------------------------------------------------


def _per_query(W: Operator, max_variances: int, memory_limit: float) -> bool:
    """Whether the generic paths list every answer's variance (all but a huge all-range workload,
    whose rows ``W`` materialises as index pairs)."""
    q = W.shape[0]
    big = isinstance(W, AllRangesWorkload) or (
        isinstance(W, WeightedUnionWorkload) and any(isinstance(Wi, AllRangesWorkload) for _, Wi in W.parts))
    return not big or (q <= max_variances and 40.0 * q <= memory_limit / 4)


def _block_size(W: Operator, M: Operator, solver: str, want: int, memory_limit: float, what: str,
                per: bool) -> int:
    """Largest block of columns (``<= want``) whose estimated memory fits ``memory_limit``.

    Per column: the unit / probe vectors (``m``), the estimator's work space (``4 m`` for the
    tree two-pass, ``6 (m + n)`` for LSMR), its result and the workload's prefix sums (``2 n``)
    and the workload answers and their squares (``2 q``).  Fixed: the per-answer accumulator and,
    for LSMR, scaled copies of the strategy (``3 x 12`` bytes per non-zero)."""
    m, n = M.shape
    q = W.shape[0] if per else 0
    work = 4 * m if "two-pass" in solver else (6 * (m + n) if "least squares" in solver else m + n)
    per_col = 8.0 * (m + work + 2 * n + 2 * q + 2)
    nnz = M.tosparse().nnz if "least squares" in solver else 0
    fixed = 8.0 * q + 36.0 * nnz
    fits = int((memory_limit - fixed) // per_col)
    if fits < 1:
        raise MemoryLimitError(
            f"{what} needs about {format_bytes(fixed + per_col)} even one column at a time "
            f"({m} strategy rows, n = {n}, {q} per-query variances), more than memory_limit = "
            f"{format_bytes(memory_limit)}; raise memory_limit or use a structured strategy "
            "(hierarchical, fenwick, haar, identity)"
        )
    return max(1, min(want, fits))


def _exact_blocks(W: Operator, M: Operator, v: np.ndarray, block: int, memory_limit: float,
                  per: bool) -> tuple[float, np.ndarray | None]:
    """``sum_i v_i (W G e_i)^2`` over blocks of unit vectors ``e_i``: per answer, and in total."""
    m = M.shape[0]
    apply, solver = linear_estimator(M, v)
    b = _block_size(W, M, solver, block, memory_limit, "the exact error (unit-vector blocks)", per)
    var = np.zeros(W.shape[0]) if per else None
    total = 0.0
    for start in range(0, m, b):
        stop = min(start + b, m)
        E = np.zeros((m, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        X = apply(E)
        if per:
            Y = W.matmat(X)
            var += (Y * Y) @ v[start:stop]  # type: ignore[operator]
        else:
            total += float(W.image_sq_norms(X) @ v[start:stop])
    return (float(var.sum()) if per else total), var  # type: ignore[union-attr]


def _estimate(W: Operator, M: Operator, v: np.ndarray, probes: int, block: int, rng: Any,
              memory_limit: float, per: bool) -> tuple[float, np.ndarray | None, float]:
    """Hutchinson: ``E_z (W G V^{1/2} z)^2`` with Rademacher ``z``, per answer and in total."""
    m = M.shape[0]
    gen = np.random.default_rng(rng)
    apply, solver = linear_estimator(M, v)
    b = _block_size(W, M, solver, min(block, probes), memory_limit, "the error estimate", per)
    std = np.sqrt(v)
    acc = np.zeros(W.shape[0]) if per else None
    samples = []
    for start in range(0, probes, b):
        k = min(b, probes - start)
        Z = gen.choice([-1.0, 1.0], size=(m, k)) * std[:, None]
        X = apply(Z)
        if per:
            Y = W.matmat(X)
            Y *= Y
            acc += Y.sum(axis=1)  # type: ignore[operator]
            samples.append(Y.sum(axis=0))
        else:
            samples.append(W.image_sq_norms(X))
    s = np.concatenate(samples)
    total = float(s.mean())
    stderr = float(s.std(ddof=1) / np.sqrt(s.size)) if s.size > 1 else float("inf")
    return total, (acc / probes if per else None), stderr
