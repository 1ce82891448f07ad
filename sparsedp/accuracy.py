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
* ``exact-kron``: a Kronecker workload on a Kronecker strategy (one noise variance): each answer's
  variance is the product of its factors' (computed on each factor's own domain).
* ``exact-toeplitz``, ``exact-hybrid``, ``exact-woodbury``: the optimiser's lower-triangular
  Toeplitz and hybrid (block forests plus dense rows) strategies under one noise variance on every
  row, and p-Identity's ``[diag(a); B]`` under any variances, with the same workloads: closed
  forms from the series inverse and from the Woodbury factors (:mod:`sparsedp.factored_covariance`),
  ``O(n)`` for the prefix workload at any ``n``, ``O(p)`` per range.
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
``e_q = sum_i c_i z_i``, ``c = G^T w_q``, with variance ``sigma_q^2``; ``answer +- h_q``.  Methods
(``method=``; the formulas and their sources are in ``sparsedp._tails``):

* ``"accurate"`` (what ``"auto"`` picks when the report knows the error's shape; not certified):
  an answer that is one noise value (``c`` has one non-zero: identity rows, a tree leaf, one
  counter node) gets the *exact* quantile of that value's law, scaled by ``|c|`` -- for discrete
  Laplace ``P(|K| > k) = 2 q^{k+1} / (1 + q)``, the discrete Gaussian by its pmf, float Laplace
  ``sigma ln(1 / (1 - level)) / sqrt 2``.  A sum of several is given the variance-gamma law with
  the same variance and fourth cumulant (excess kurtosis ``gamma_2 = sum_i c_i^4 kappa_4(z_i) /
  sigma^4``; ``kappa_4 = 3 Var^2`` for Laplace, ``Var^2 (3 + 2 sinh^2(1 / (2 t)))`` for the
  discrete Laplace of scale ``t``), which is exact for sums of equal Laplace terms and tends to the
  normal as terms are added; on a lattice (exact noise, commensurate coefficients) its quantile is
  continuity-corrected.  Measured coverage of nominal 95%: 0.9495-0.9517 over float Laplace sums
  of 1 to 64 terms with equal, geometric or one-dominant weights, where the normal quantile gives
  0.9376-0.9497; 0.947-0.957 on every release kind with exact noise
  (``benchmarks/bench_intervals.py``).  Cost: the shape comes from the coefficients
  ``W G`` (closed form for identity strategies, else ``G`` applied to blocks of unit vectors, like
  ``exact-blocks``), computed on the first interval request and only when
  ``rows * n <= exact_limit`` and ``queries * rows <= exact_limit``.
* ``"normal"``: ``z_{(1+level)/2} sigma_q``; what ``"auto"`` picks for non-Gaussian noise when the
  shape is not known (an estimated or too large report, or a caller that gives only variances).
  Under-covers when one Laplace term dominates an answer (0.938 at 95% for a single term).
* ``"gaussian"``: the same multiplier; exact for float Gaussian noise (``"auto"`` there).
* ``"exact-tail"`` (certified): coverage at least ``level`` for the noise drawn.  Float Gaussian:
  normal quantile; float Laplace: the ``"laplace"`` multiplier; one noise value: its exact quantile;
  discrete Laplace sums: ``K = floor(t E_1) - floor(t E_2) = L + D``, ``L ~ Lap(t)``, ``|D| < 1``
  (``E_j ~ Exp(1)``), so the Laplace-sum bound on ``sum a_i L_i`` plus Hoeffding on ``sum a_i D_i``
  (2.45 ``sigma_q`` at 95% for ``t = 10``); discrete Gaussian sums: sub-Gaussian, ``sqrt(2 ln(2 /
  (1 - level)))`` standard deviations (2.72 at 95%; Canonne, Kamath, Steinke 2020); each capped
  by Chebyshev.  Needs the sampler scales of exact noise (``scales=`` / ``unit_scales=``), else
  Chebyshev.
* ``"laplace"`` (certified for float Laplace): ``kappa(level) sigma_q``, ``kappa(0.95) = 2.157``.
  Each ``Lap(b)`` is a normal scale mixture ``N(0, 2 b^2 E)``, ``E ~ Exp(1)``, so the error is
  ``N(0, sigma_q^2 sum_i p_i E_i)`` given the ``E_i`` (``p_i = 2 c_i^2 b_i^2 / sigma_q^2`` sum to
  1).  ``sum_i p_i E_i`` is below ``E_1`` in convex order (Jensen), so for any convex ``h >= g``,
  ``g(w) = P(|N(0, w)| > t)``: ``P(|error| > t) <= E h(sigma_q^2 E_1)``.  ``h`` is ``g`` up to a
  point ``w0 <= t^2 / 3`` (where ``g`` is convex) and then the steepest chord of ``g`` from
  ``w0``; ``kappa`` is the smallest ``t / sigma`` whose bound, minimised over ``w0``, is ``1 -
  level`` (computed numerically, rounded up).  A single Laplace term needs ``2.118``.
* ``"chebyshev"`` (certified for any noise): ``sigma_q / sqrt(1 - level)`` (4.47 at 95%).

On a coarse lattice (exact noise of scale ~1 grid unit on an answer of one or few terms) no
interval ``answer +- h`` has coverage close to ``level``: the exact quantile's coverage is the
first attainable value at or above it (0.973 for one discrete Laplace term of scale 1 at 95%).

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
from scipy import special

from .errors import SparseDPError
from .inference import linear_estimator, sparse_inverse
from .operators import Operator, SparseOperator, aslinearoperator
from .factored_covariance import _homoscedastic, structured_covariance
from .range_variance import (
    DEFAULT_MEMORY_LIMIT,
    MemoryLimitError,
    StructuredCovariance,
    check_memory,
    format_bytes,
)
from ._tails import (
    SINGLE,
    ErrorShape,
    NoiseRows,
    ShapeAccumulator,
    certified_multiplier,
    laplace_multiplier,
    lattice_half_width,
    noise_rows,
    single_term_half_width,
    vg_multiplier,
)
from .workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload, WeightedUnionWorkload

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "ErrorReport",
    "ErrorShape",
    "MemoryLimitError",
    "error_shape",
    "expected_error",
    "gls_error_shape",
    "interval_multiplier",
]

INTERVAL_METHODS = ("auto", "accurate", "exact-tail", "gaussian", "laplace", "chebyshev", "normal")


@dataclass(frozen=True)
class ErrorReport:
    """Accuracy of the workload answers and how it was obtained.

    ``total`` is the expected total squared error, ``per_query`` its mean over the answers,
    ``variances`` each answer's variance (``None`` only for an all-range workload too large to
    list), ``stderr`` the standard error of an estimated total (0 when exact), ``noise`` /
    ``secure`` the noise the variances come from (``None`` if not given), ``shape`` what the
    intervals use beyond the variances (a :class:`~sparsedp.accuracy.ErrorShape`, or a function
    returning one or ``None``, called on the first interval request; ``None``: unknown).
    """

    total: float
    per_query: float  # total / number of workload queries
    method: str  # "exact-tree", "exact-fenwick", "exact-haar", "exact-identity", "exact-toeplitz",
    #              "exact-hybrid", "exact-woodbury", "exact-kron", "sparse-inverse",
    #              "exact-blocks" or "estimate"
    stderr: float = 0.0  # standard error of an estimated total; 0 when exact
    variances: np.ndarray | None = field(default=None, repr=False, compare=False)
    noise: str | None = None
    secure: bool = False
    shape: Any = field(default=None, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def exact(self) -> bool:
        return self.method != "estimate"

    def __float__(self) -> float:
        return self.total

    def error_shape(self) -> ErrorShape | None:
        """The answers' :class:`~sparsedp.accuracy.ErrorShape` (computed once), or ``None``."""
        if "shape" not in self._cache:
            sh = self.shape() if callable(self.shape) else self.shape
            if sh is not None and self.variances is not None:
                try:
                    sh = sh.broadcast(np.asarray(self.variances).size)
                except ValueError as exc:
                    raise SparseDPError(f"the error shape does not fit the report's "
                                        f"{np.asarray(self.variances).size} answers: {exc}") from exc
            self._cache["shape"] = sh
        return self._cache["shape"]

    def interval_method(self, method: str = "auto") -> str:
        """The interval method ``method="auto"`` resolves to (see the module docstring):
        ``"gaussian"`` for float Gaussian noise, ``"accurate"`` when the error's shape is known,
        else ``"normal"``."""
        if method not in INTERVAL_METHODS:
            raise SparseDPError(f"interval method must be one of {INTERVAL_METHODS}, got {method!r}")
        if method != "auto":
            return method
        if self.noise not in ("gaussian", "laplace"):
            raise SparseDPError(
                "the noise of this report is unknown: pass noise='laplace' or 'gaussian' (and secure=) to "
                "expected_error, or choose the interval method ('chebyshev' holds for any noise)"
            )
        if self.noise == "gaussian" and not self.secure:
            return "gaussian"
        return "accurate" if self.variances is not None and self.error_shape() is not None else "normal"

    def half_widths(self, level: float = 0.95, method: str = "auto") -> np.ndarray:
        """Half-width of each answer's interval at confidence ``level``."""
        if self.variances is None:
            raise SparseDPError("this report has no per-answer variances (all_ranges above max_variances)")
        how = self.interval_method(method)
        lv = _check_level(level)
        sd = np.sqrt(np.asarray(self.variances, dtype=np.float64))
        if how in ("gaussian", "normal", "laplace", "chebyshev"):
            return interval_multiplier(lv, how) * sd
        if self.noise not in ("gaussian", "laplace"):
            raise SparseDPError(f"interval method {how!r} needs the noise: pass noise='laplace' or 'gaussian'")
        shape = self.error_shape()
        if how == "accurate":
            return _accurate_half_widths(lv, sd, shape, self.noise, self.secure)
        return _certified_half_widths(lv, sd, shape, self.noise, self.secure)

    def confidence_intervals(self, answers: Any, level: float = 0.95,
                             method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around the GLS ``answers`` (one per workload query on the last axis;
        leading axes, e.g. one row per run, broadcast).  ``method``: ``"auto"`` (accurate for the
        noise drawn), ``"accurate"``, ``"exact-tail"`` (certified), ``"chebyshev"`` (certified, any
        noise), ``"laplace"``, ``"gaussian"`` or ``"normal"``; see :mod:`sparsedp.accuracy`."""
        a = np.asarray(answers, dtype=np.float64)
        h = self.half_widths(level, method)
        if a.ndim < 1 or a.shape[-1] != h.size:
            raise SparseDPError(f"answers of shape {a.shape} for a report of {h.size} queries (the last axis)")
        return a - h, a + h


# -- interval multipliers ------------------------------------------------------------------------


def _check_level(level: Any) -> float:
    lv = float(level)
    if not 0.0 < lv <= 1.0 - 1e-9:
        raise SparseDPError(f"level must lie in (0, 1 - 1e-9], got {level!r}")
    return lv


def interval_multiplier(level: float, method: str) -> float:
    """``kappa`` with ``answer +- kappa sigma`` covering the truth with probability ``level``:
    ``gaussian`` / ``normal`` the normal quantile, ``laplace`` the guaranteed bound for sums of
    independent Laplace variables, ``chebyshev`` ``1 / sqrt(1 - level)`` (any noise).  The
    ``accurate`` and ``exact-tail`` half-widths depend on each answer:
    :meth:`ErrorReport.half_widths`."""
    lv = _check_level(level)
    if method in ("gaussian", "normal"):
        return float(special.ndtri(0.5 + lv / 2.0))
    if method == "laplace":
        return laplace_multiplier(lv)
    if method == "chebyshev":
        return 1.0 / math.sqrt(1.0 - lv)
    if method in ("accurate", "exact-tail"):
        raise SparseDPError(f"the {method!r} half-widths differ per answer: use ErrorReport.half_widths")
    raise SparseDPError(f"interval method must be 'gaussian', 'laplace', 'chebyshev' or 'normal', got {method!r}")


def _accurate_half_widths(level: float, sd: np.ndarray, shape: ErrorShape | None, noise: str,
                          secure: bool) -> np.ndarray:
    """``"accurate"``: exact for one noise value, variance-gamma (lattice-corrected) for sums."""
    if shape is None:  # nothing known beyond the variance
        return float(special.ndtri(0.5 + level / 2.0)) * sd
    kurt = np.asarray(shape.kurtosis, dtype=np.float64)
    if noise == "gaussian" and not secure:
        kurt = np.zeros_like(kurt)
    kappa = vg_multiplier(level, kurt)
    h = kappa * sd
    lat = np.asarray(shape.lattice, dtype=np.float64)
    on = (lat > 0) & (sd > 0)
    if secure and np.any(on):
        h[on] = lattice_half_width(kappa[on], sd[on], lat[on])
    one = np.asarray(shape.lead) >= SINGLE
    if np.any(one):
        unit = np.asarray(shape.unit, dtype=np.float64)[one] if secure else np.inf
        h[one] = single_term_half_width(level, sd[one], noise, unit)
    return np.where(sd > 0, h, 0.0)


def _certified_half_widths(level: float, sd: np.ndarray, shape: ErrorShape | None, noise: str,
                           secure: bool) -> np.ndarray:
    """``"exact-tail"``: coverage at least ``level`` (see the module docstring)."""
    if shape is None:
        umin = np.full(sd.shape, np.nan)
    else:
        umin = np.asarray(shape.unit_min, dtype=np.float64)
    h = certified_multiplier(level, noise, secure, umin) * sd
    if shape is not None:
        one = np.asarray(shape.lead) >= SINGLE
        unit = np.asarray(shape.unit, dtype=np.float64)
        if secure:
            one &= np.isfinite(unit) & (unit > 0)  # an unknown sampler scale has no exact quantile
        if np.any(one):
            h[one] = np.minimum(h[one], single_term_half_width(level, sd[one], noise, unit[one] if secure else np.inf))
    return h


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
    scales: Any = None,
    unit_scales: Any = None,
) -> ErrorReport:
    """Variance of every GLS workload answer and their total ``sum_i v_i ||W G e_i||^2``.

    ``method``: ``"auto"`` (the exact structured path for identity / Fenwick / Haar / tree
    strategies and the optimiser's Toeplitz / hybrid / p-Identity ones, exact blocks if ``rows(M) * n <= exact_limit``, else an estimate), ``"exact"`` or
    ``"estimate"``.  ``memory_limit`` (bytes) bounds what the computation allocates: a path that
    would need more raises :class:`MemoryLimitError` before allocating.  ``noise`` (``"laplace"``
    or ``"gaussian"``) and ``secure`` are recorded for :meth:`ErrorReport.confidence_intervals`;
    for exact noise, ``scales`` (per row ``b_i`` / ``sigma_i`` in data units, as
    :attr:`Measurement.scales <sparsedp.measure.Measurement.scales>`) or ``unit_scales`` (the
    sampler's, in grid units) let the intervals use the noise's exact law (single-term quantiles,
    lattices, the certified ``exact-tail`` bound).  The report's shape (:func:`gls_error_shape`)
    is computed on its first interval request.
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
    sc, us = _check_scales(scales, m, "scales"), _check_scales(unit_scales, m, "unit_scales")

    def shaped(var: np.ndarray | None) -> dict:
        if noise is None or var is None:
            return tag
        # computed on the first interval request (a partial, not a closure: the report stays picklable)
        return {**tag, "shape": functools.partial(_lazy_gls_shape, W, M, (noise, bool(secure), v, sc, us), var,
                                                  exact_limit, block, memory_limit)}

    if method != "estimate":
        kron = _kron_variances(W, M, v, max_variances, memory_limit)
        if kron is not None:  # a Kronecker workload on a Kronecker strategy: products of factor variances
            total, var = kron
            return ErrorReport(total, total / queries, "exact-kron", variances=var, **shaped(var))
        cov = structured_covariance(M, v)
        if cov is not None:
            got = _structured(W, cov, memory_limit, max_variances)
            if got is not None:
                total, var = got
                return ErrorReport(total, total / queries, f"exact-{cov.kind}", variances=var, **shaped(var))
            G = sparse_inverse(M)
            if G is not None:
                check_memory(24.0 * G.nnz + 16.0 * n * 256, memory_limit, "the sparse-inverse image norms")
                total = float(W.image_sq_norms(sp.csc_matrix(G)) @ v)
                return ErrorReport(total, total / queries, "sparse-inverse", **tag)
        if method == "exact" or m * n <= exact_limit:
            total, var = _exact_blocks(W, M, v, block, memory_limit, per)
            return ErrorReport(total, total / queries, "exact-blocks", variances=var, **shaped(var))
    total, var, stderr = _estimate(W, M, v, probes, block, rng, memory_limit, per)
    return ErrorReport(total, total / queries, "estimate", stderr, variances=var, **tag)


def _check_scales(scales: Any, m: int, name: str) -> np.ndarray | None:
    if scales is None:
        return None
    try:
        s = np.broadcast_to(np.asarray(scales, dtype=np.float64), (m,))
    except (TypeError, ValueError) as exc:
        raise SparseDPError(f"{name} must be a number or one per strategy row ({m})") from exc
    if not np.all(s > 0) or np.any(np.isnan(s)):
        raise SparseDPError(f"{name} must be > 0")
    return s


# -- error shapes (what the intervals use beyond the variances) ----------------------------------


def error_shape(coefficients: Any, noise: str, *, secure: bool = False, variances: Any, scales: Any = None,
                unit_scales: Any = None, answer_variances: Any = None, block: int = 512) -> ErrorShape:
    """The :class:`~sparsedp.accuracy.ErrorShape` of answers whose errors are ``C z``: ``coefficients``
    ``C`` (answers x noise rows, dense or sparse), ``variances`` / ``scales`` / ``unit_scales`` of
    the noise rows (see :func:`expected_error`).  Pass the result as ``ErrorReport(...,
    shape=...)`` (or a function returning it, to compute it only when intervals are asked for).
    ``O(answers * block)`` memory: ``C`` is read in blocks of ``block`` noise rows."""
    C = coefficients
    if not sp.issparse(C):
        C = np.asarray(C, dtype=np.float64)
        if C.ndim != 2:
            raise SparseDPError(f"coefficients must be a matrix (answers x noise rows), got shape {C.shape}")
    q, m = C.shape
    v = _check_variances(variances, m)
    rows = noise_rows(noise, bool(secure), v, scales=_check_scales(scales, m, "scales"),
                      unit_scales=_check_scales(unit_scales, m, "unit_scales"))
    return _shape_of_matrix(C, rows, answer_variances, block)


def _shape_of_matrix(C: Any, rows: NoiseRows, sigma2: Any, block: int) -> ErrorShape:
    q, m = C.shape
    acc = ShapeAccumulator(q, rows, sigma2)
    if sp.issparse(C):
        C = sp.csc_matrix(C)
    b = max(1, min(int(block), m))
    for start in range(0, m, b):
        stop = min(start + b, m)
        acc.add(C[:, start:stop], slice(start, stop))
    return acc.result()


def gls_error_shape(workload: Any, strategy: Any, variances: Any, *, noise: str, secure: bool = False,
                    scales: Any = None, unit_scales: Any = None, answer_variances: Any = None,
                    limit: float = 2.0**27, block: int = 512,
                    memory_limit: float = DEFAULT_MEMORY_LIMIT) -> ErrorShape | None:
    """The :class:`~sparsedp.accuracy.ErrorShape` of the GLS answers ``W x_hat`` of strategy ``M``
    measured with noise ``variances`` (and ``scales`` / ``unit_scales``; see
    :func:`expected_error`): closed form for identity strategies with range / prefix workloads,
    ``W G`` for the sparse-inverse strategies and explicit workloads, else ``G`` applied to blocks
    of unit vectors when ``rows * n`` and ``queries * rows`` are at most ``limit`` (``None``
    beyond, and for an all-range workload too large to list)."""
    W = aslinearoperator(workload)
    M = aslinearoperator(strategy)
    m = M.shape[0]
    v = _check_variances(variances, m)
    rows = noise_rows(noise, bool(secure), v, scales=_check_scales(scales, m, "scales"),
                      unit_scales=_check_scales(unit_scales, m, "unit_scales"))
    return _gls_shape(W, M, rows, answer_variances, limit, block, memory_limit)


def _lazy_gls_shape(W: Operator, M: Operator, noise: tuple, sigma2: Any, limit: float, block: int,
                    memory_limit: float) -> ErrorShape | None:
    kind, secure, v, sc, us = noise
    return _gls_shape(W, M, noise_rows(kind, secure, v, scales=sc, unit_scales=us), sigma2, limit, block, memory_limit)


def _gls_shape(W: Operator, M: Operator, rows: NoiseRows, sigma2: Any, limit: float, block: int,
               memory_limit: float) -> ErrorShape | None:
    m, n = M.shape
    q = W.shape[0]
    if not _per_query(W, int(limit), memory_limit):
        return None
    G = sparse_inverse(M)
    if G is not None:
        G = sp.csr_matrix(G)
        diag = G.nnz == n and m == n and np.all(G.indices == np.repeat(np.arange(n), np.diff(G.indptr)))
        if diag and isinstance(W, (PrefixWorkload, RangeQueriesWorkload)):
            got = _identity_range_shape(W, G.diagonal(), rows)
            if got is not None:
                return got
        if isinstance(W, SparseOperator) and W.matrix.nnz * max(1, G.nnz // max(n, 1)) <= limit:
            return _shape_of_matrix(sp.csr_matrix(W.matrix) @ G, rows, sigma2, block)
    if float(q) * m > limit or float(m) * n > limit:
        return None
    try:
        apply, solver = linear_estimator(M, rows.v)
        b = _block_size(W, M, solver, block, memory_limit / 3.0, "the error shape (unit-vector blocks)", True)
    except MemoryLimitError:
        return None
    acc = ShapeAccumulator(q, rows, sigma2)
    for start in range(0, m, b):
        stop = min(start + b, m)
        E = np.zeros((m, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        acc.add(W.matmat(apply(E)), slice(start, stop))
    return acc.result()


def _identity_range_shape(W: Operator, d: np.ndarray, rows: NoiseRows) -> ErrorShape | None:
    """Ranges of the identity strategy ``diag(d)`` (``G = diag(1 / d)``): each answer is the sum of
    its bins' noise over ``d``; closed form when every bin's noise is alike (else ``None``)."""
    n = d.size
    if isinstance(W, PrefixWorkload):
        lo, hi = np.zeros(n, dtype=np.int64), np.arange(1, n + 1, dtype=np.int64)
    else:
        lo, hi = np.asarray(W.lo, dtype=np.int64), np.asarray(W.hi, dtype=np.int64) + 1
    T = rows.v / (d * d)
    a = rows.grid / np.abs(d)
    same = lambda x: bool(np.all(x == x[0]) or np.all(np.isnan(x)))  # noqa: E731
    if n == 0 or not (same(T) and same(rows.unit) and same(a) and same(rows.gamma2)):
        return None
    length = (hi - lo).astype(np.float64)
    lat = float(a[0]) if rows.lattice else 0.0
    return ErrorShape(kurtosis=rows.gamma2[0] / length, lead=1.0 / length, unit=float(rows.unit[0]),
                      unit_min=float(rows.unit[0]), lattice=lat)


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


def _kron_variances(W: Any, M: Any, v: np.ndarray, max_variances: int,
                   memory_limit: float) -> tuple[float, np.ndarray | None] | None:
    """``(total, variances)`` of a Kronecker workload answered by a Kronecker strategy with the same
    factor domains under one noise variance on every row (module docstring), or ``None`` when
    that is not the case.  ``variances`` is ``None`` when the product has more than
    ``max_variances`` answers or they would not fit in ``memory_limit`` (the total stays exact)."""
    from .marginals.kron import KronOperator  # local: marginals imports this module

    var = _homoscedastic(v)
    if var is None or type(W) is not KronOperator or type(M) is not KronOperator:
        return None
    if len(W.factors) != len(M.factors) or tuple(W.in_shape) != tuple(M.in_shape):
        return None
    parts = []
    for Wi, Ai in zip(W.factors, M.factors):
        rep = expected_error(Wi, Ai, 1.0, method="exact", memory_limit=memory_limit)
        if rep.variances is None:
            return None
        parts.append(np.asarray(rep.variances, dtype=np.float64))
    total = var * float(np.prod([p.sum() for p in parts]))
    size = int(np.prod([p.size for p in parts], dtype=np.float64))
    if size > max_variances or 16.0 * size > memory_limit:
        return total, None
    out = np.array([var])
    for p in parts:  # C order: the last factor's index varies fastest, as KronOperator's rows
        out = np.multiply.outer(out, p).ravel()
    return total, out
