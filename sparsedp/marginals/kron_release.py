"""Release with a Kronecker strategy without forming it: measure, reconstruct, answer, all by factors.

For a strategy ``A = A_1 (x) ... (x) A_k`` (``A_i``: ``m_i x n_i``, full column rank; e.g. the
:class:`~sparsedp.marginals.KronStrategy` of :func:`~sparsedp.optimize.optimize_kron`) and a count
vector ``x`` on the product domain ``n_1 x ... x n_k``:

1. **Measure** ``y = A x + z`` through :func:`sparsedp.plan_measurement` with the
   :class:`~sparsedp.marginals.KronOperator` itself: ``A x`` by mode products (``x`` reshaped to the
   domain shape, each factor applied along its axis; ``O(N sum_i m_i)`` work, the ``prod m_i x prod
   n_i`` product never formed); the sensitivity is ``Delta_p(A) = prod_i Delta_p(A_i)``
   (:mod:`~sparsedp.marginals.kron_calibration`, proved and brute-forced there), so the noise is
   homoscedastic with Laplace scale ``b = Delta_1(A) / epsilon`` or Gaussian
   ``sigma = Delta_2(A) / sqrt(2 rho)``.  Exact noise (default) on the grid 1 when every factor is
   an integer matrix and ``max_total prod_i max|A_i| <= 2^49``; else the factors are scaled by
   powers of two to ``max|A_i| <= 1`` and the grid is ``g = 2^(ceil(log2 max_total) - 49)``, fixed
   by the public bound ``max_total`` on ``sum(x)`` (``|A x| / g <= 2^49``; the optimised strategies,
   integers scaled to ``Delta = 2^20``, take this path).  Validation, then the charge, then the noise: all in
   :meth:`~sparsedp.measure.MeasurementPlan.measure`.
2. **Reconstruct** by GLS, which for i.i.d. noise is least squares, and factors:
   ``x_hat = A^+ y = (A_1^+ (x) ... (x) A_k^+) y`` with ``A_i^+ = (A_i^T A_i)^{-1} A_i^T``, again by
   mode products.  ``Cov(x_hat) = v (A^T A)^{-1} = v (x)_i C_i``, ``C_i = (A_i^T A_i)^{-1}``, ``v``
   the exact per-row noise variance (discrete Laplace / Gaussian when exact).
3. **Answer** a Kronecker workload ``W = W_1 (x) ... (x) W_k`` as ``(x)_i W_i`` applied to ``x_hat``
   (a union of products, :class:`~sparsedp.marginals.KronStack`, term by term), each answer's
   variance ``v prod_i (W_i C_i W_i^T)_{r_i r_i}`` (the diagonal of a Kronecker product is the
   Kronecker product of the diagonals); ranges on every axis by inclusion-exclusion on the
   cumulative sums of ``x_hat`` (:meth:`KronRelease.ranges`: ``2^k`` look-ups per range, any
   number of ranges), with variance ``v prod_i r_i^T C_i r_i`` from the cumulative sums of ``C_i``.

The expected total squared error of ``W`` is ``v prod_i trace(W_i C_i W_i^T)``, which at
``v = 2 b^2`` (Laplace) is :meth:`KronStrategy.total_error` (McKenna et al., HDMM, VLDB 2018, Sec. 5).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import InputBoundError, InvalidPrivacyParameterError, ShapeError
from ..measure import plan_measurement
from ..privacy import LedgerEntry, PrivacyCost
from ..releases import ReleaseMethods, ReleaseResult, axis_labels
from .kron import KronOperator, KronStack, apply_factors
from .kron_opt import KronStrategy

__all__ = ["KronRelease", "release_kron", "kron_squared_error"]


@dataclass(frozen=True)
class KronRelease(ReleaseMethods):
    """The estimate ``x_hat`` (domain shape) of a Kronecker-strategy release and its factored
    covariance ``v (x)_i C_i`` (module doc).  Answers are post-processing (no budget).
    :meth:`to_release` (and through it ``confidence_intervals(level)``, ``save``, ``to_pandas``)
    releases every cell of ``x_hat``."""

    strategy: KronOperator
    x_hat: np.ndarray  # GLS estimate, shape = the domain shape
    noise_variance: float  # v: exact per-row Var(z), data units^2
    covariance_factors: tuple  # C_i = (A_i^T A_i)^{-1} (dense n_i x n_i)
    noise: str
    cost: PrivacyCost
    entry: LedgerEntry
    secure: bool
    private: bool
    seconds: dict = field(default_factory=dict)  # plan / measure / reconstruct

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.x_hat.shape)

    def to_release(self, *, description: dict | None = None) -> ReleaseResult:
        """Every cell of ``x_hat`` as one answer (C order; labels ``axis0``, ``axis1``, ...: the
        cell's index on each axis), its exact variance ``v prod_i (C_i)_{jj}``, and the covariance
        ``v (x)_i C_i`` as an operator (``covariance``); the ledger entry."""
        from scipy.sparse.linalg import LinearOperator

        var = np.full(1, self.noise_variance)
        for C in self.covariance_factors:
            var = np.kron(var, np.diag(C))
        shape, v, Cs = self.shape, self.noise_variance, list(self.covariance_factors)
        N = int(np.prod(shape))

        def cov(u: np.ndarray) -> np.ndarray:
            return v * apply_factors(Cs, np.asarray(u, dtype=np.float64).reshape(shape)).reshape(-1)

        op = LinearOperator((N, N), matvec=cov, rmatvec=cov, dtype=np.float64)
        desc = {"shape": list(shape), "strategy": self.strategy.name, "noise_variance": self.noise_variance,
                "epsilon": self.cost.epsilon, "rho": self.cost.rho}
        desc.update(description or {})
        x = self.x_hat.reshape(-1)
        return ReleaseResult(kind="kron", answers=x, labels=axis_labels(shape, [f"axis{i}" for i in range(len(shape))]),
                             variances=var, noise=self.noise, secure=bool(self.secure),
                             strategy=f"Kronecker strategy {self.strategy.name} ({self.strategy.shape[0]} rows), GLS "
                             "by factors", ledger=[self.entry], private=bool(self.private), description=desc,
                             arrays={"x_hat": x}, variance_method="exact-kron", covariance=op, source=self)

    def _terms(self, workload: Any) -> list[KronOperator]:
        terms = list(workload.terms) if isinstance(workload, KronStack) else [workload]
        if not all(isinstance(t, KronOperator) for t in terms):
            raise ShapeError("a workload must be a KronOperator or a KronStack of them")
        for t in terms:
            if t.in_shape != self.shape:
                raise ShapeError(f"workload acts on {t.in_shape}, the release on {self.shape}")
        return terms

    def answer(self, workload: Any) -> np.ndarray:
        """``W x_hat`` for a :class:`KronOperator` / :class:`KronStack` workload, by mode products
        (``prod_i m_i`` answers per term: use :meth:`ranges` for billions of ranges)."""
        return np.concatenate([apply_factors(t.factors, self.x_hat).ravel() for t in self._terms(workload)])

    def variances(self, workload: Any) -> np.ndarray:
        """Per-answer variance ``v prod_i (W_i C_i W_i^T)_{rr}`` in the order of :meth:`answer`."""
        out = []
        for t in self._terms(workload):
            v = np.full(1, self.noise_variance)
            for W, C in zip(t.factors, self.covariance_factors):
                v = np.kron(v, _diag_quadratic(W, C))
            out.append(v)
        return np.concatenate(out)

    def expected_squared_error(self, workload: Any) -> float:
        """``sum of variances = v sum_terms prod_i trace(W_i^T W_i C_i)`` (never enumerates)."""
        return float(sum(self.noise_variance * math.prod(float(np.sum(_gram(W) * C))
                                                          for W, C in zip(t.factors, self.covariance_factors))
                         for t in self._terms(workload)))

    def ranges(self, lo: Any, hi: Any) -> tuple[np.ndarray, np.ndarray]:
        """Answers and variances of the boxes ``lo[q, i] <= v_i <= hi[q, i]`` (inclusive, ``(q, k)``
        integer arrays): inclusion-exclusion over the ``2^k`` corners of the cumulative sums of
        ``x_hat`` and, per axis, of ``C_i`` (``r^T C r`` of an interval indicator ``r``)."""
        lo, hi = _boxes(lo, hi, self.shape)
        P = _cumulative(self.x_hat)
        ans = np.zeros(lo.shape[0])
        k = len(self.shape)
        for corner in range(2**k):
            idx, sign = [], 1.0
            for i in range(k):
                if corner >> i & 1:
                    idx.append(lo[:, i])
                    sign = -sign
                else:
                    idx.append(hi[:, i] + 1)
            ans += sign * P[tuple(idx)]
        var = np.full(lo.shape[0], self.noise_variance)
        for i, C in enumerate(self.covariance_factors):
            S = _cumulative(C)
            a, b = lo[:, i], hi[:, i] + 1
            var *= S[b, b] - S[a, b] - S[b, a] + S[a, a]
        return ans, var


def _diag_quadratic(W: Any, C: np.ndarray) -> np.ndarray:
    """``diag(W C W^T)`` row by row (``W`` sparse or dense ``m x n``, ``C`` dense ``n x n``)."""
    WC = np.asarray(W @ C)
    return np.asarray((W.multiply(WC) if sp.issparse(W) else W * WC).sum(axis=1)).ravel()


def _gram(W: Any) -> np.ndarray:
    """``W^T W`` dense (``n x n``; a sparse ``W`` times its dense copy, cheaper than sparse x sparse)."""
    return np.asarray(W.T @ (W.toarray() if sp.issparse(W) else np.asarray(W)))


def _cumulative(t: np.ndarray) -> np.ndarray:
    """Cumulative sums along every axis, with a leading zero on each (``P[a] - P[b]`` sums ``[b, a)``)."""
    P = np.asarray(t, dtype=np.float64)
    for ax in range(P.ndim):
        P = np.cumsum(P, axis=ax)
    return np.pad(P, [(1, 0)] * P.ndim)


def _boxes(lo: Any, hi: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    lo = np.atleast_2d(np.asarray(lo))
    hi = np.atleast_2d(np.asarray(hi))
    if lo.shape != hi.shape or lo.shape[1] != len(shape):
        raise ShapeError(f"lo and hi must both have shape (q, {len(shape)}), got {lo.shape} and {hi.shape}")
    if lo.dtype.kind not in "iu" or hi.dtype.kind not in "iu":
        raise ShapeError("range bounds must be integers")
    n = np.asarray(shape)
    if np.any(lo < 0) or np.any(hi >= n) or np.any(lo > hi):
        raise ShapeError("every range needs 0 <= lo <= hi < n on each axis")
    return lo.astype(np.intp), hi.astype(np.intp)


def _strategy(strategy: Any) -> KronOperator:
    if isinstance(strategy, KronStrategy):
        return strategy.strategy
    if isinstance(strategy, KronOperator):
        return strategy
    if isinstance(strategy, (list, tuple)):
        return KronOperator(strategy, name="kron strategy")
    raise ShapeError("strategy must be a KronStrategy, a KronOperator or a list of factors")


def _gram_inverses(K: KronOperator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``C_i = (A_i^T A_i)^{-1}`` and ``A_i^+ = C_i A_i^T`` (dense; each factor is small)."""
    Cs, Ps = [], []
    for F in K.factors:
        Fd = F.toarray() if sp.issparse(F) else np.asarray(F)
        G = Fd.T @ Fd
        try:
            L = np.linalg.cholesky(G)
        except np.linalg.LinAlgError as exc:
            raise ShapeError("every strategy factor must have full column rank (GLS needs A_i^T A_i > 0)") from exc
        Linv = np.linalg.solve(L, np.eye(G.shape[0]))
        C = Linv.T @ Linv
        Cs.append(C), Ps.append(C @ Fd.T)
    return Cs, Ps


def _scaled(K: KronOperator, secure: bool, max_total: int) -> tuple[KronOperator, float]:
    """The operator measured and its grid.  Integer factors whose product keeps
    ``max_total prod_i max|A_i| <= 2^49`` are measured as they are on the exact grid 1; otherwise
    each factor is divided by the power of two ``2^e_i >= max|A_i|`` (exact in floating point:
    the same strategy, ``2^-sum e_i A``, with the same law of ``x_hat``) and, for exact noise, the
    grid is ``g = 2^(ceil(log2 max_total) - 49)`` so that ``|A x| / g <= 2^49`` (rounding to it
    costs ~1e-6 of the loss, :mod:`~sparsedp.marginals.kron_calibration`)."""
    dense = [F.data if sp.issparse(F) else np.asarray(F) for F in K.factors]
    peak = math.prod(float(np.abs(d).max(initial=0.0)) for d in dense)
    if peak == 0.0:
        raise ShapeError("the strategy has no non-zero entry: nothing to measure")
    ints = all(bool(np.all(d == np.round(d))) for d in dense)
    if ints and float(max_total) * peak <= 2.0**49:
        return K, 1.0
    factors = []
    for F, d in zip(K.factors, dense):
        e = math.ceil(math.log2(float(np.abs(d).max())))
        factors.append(F * 2.0**-e)
    g = 2.0 ** (math.ceil(math.log2(max(float(max_total), 2.0))) - 49) if secure else 1.0
    return KronOperator(factors, name=K.name), g


def release_kron(
    x: Any,
    strategy: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    noise: str | None = None,
    accountant: Any = None,
    rng: Any = None,
    secure: bool = True,
    max_total: int = 2**24,
    label: str = "kron release",
) -> KronRelease:
    """Measure ``x`` (counts, the domain shape ``strategy.in_shape`` or flattened in C order) with
    the Kronecker ``strategy`` and reconstruct ``x_hat`` by factor-wise GLS (module doc).

    ``epsilon``: Laplace noise (pure DP); ``rho``: Gaussian noise (zCDP); ``noise`` defaults to the
    :class:`KronStrategy`'s, else to the budget given.  ``secure=True`` (default): exact noise;
    ``rng`` a seed / ``Generator`` gives reproducible, non-private noise.  ``max_total``: a public
    bound on ``sum(x)`` that fixes the grid of non-integer strategies (more raises
    :class:`InputBoundError` before anything is spent).  Neighbours: one record added or removed
    changes one cell of ``x`` by one."""
    t0 = time.perf_counter()
    K = _strategy(strategy)
    if noise is None:
        noise = strategy.noise if isinstance(strategy, KronStrategy) else ("gaussian" if rho is not None else "laplace")
    if noise == "laplace" and epsilon is None:
        raise InvalidPrivacyParameterError("Laplace noise: give epsilon")
    if noise == "gaussian" and rho is None:
        raise InvalidPrivacyParameterError("Gaussian noise: give rho")
    arr = np.asarray(x)
    if arr.shape not in (K.in_shape, (K.shape[1],)):
        raise ShapeError(f"x must have shape {K.in_shape} (or ({K.shape[1]},)), got {arr.shape}")
    K, g = _scaled(K, bool(secure), int(max_total))
    Cs, Ps = _gram_inverses(K)
    plan = plan_measurement(K, epsilon=epsilon, rho=rho, noise=noise, secure=secure, grid=g)
    flat = arr.reshape(-1)
    if arr.dtype.kind in "fiu" and np.all(np.isfinite(flat)) and float(np.sum(flat)) > max_total:
        raise InputBoundError(f"sum(x) is above max_total={max_total} (the grid's bound; raise it to a public "
                              "bound on the number of records)")
    t1 = time.perf_counter()
    m = plan.measure(flat, accountant=accountant, rng=rng, label=label)  # validate, charge, draw
    t2 = time.perf_counter()
    x_hat = apply_factors(Ps, m.y.reshape(K.out_shape))
    t3 = time.perf_counter()
    return KronRelease(strategy=K, x_hat=x_hat, noise_variance=float(m.variances[0]),
                       covariance_factors=tuple(Cs), noise=noise, cost=m.cost, entry=m.entry, secure=m.secure,
                       private=m.private, seconds={"plan": t1 - t0, "measure": t2 - t1, "reconstruct": t3 - t2})


def kron_squared_error(workload: Any, estimate: np.ndarray, truth: np.ndarray) -> float:
    """``||W (estimate - truth)||_2^2`` for a :class:`KronOperator` / :class:`KronStack` workload
    without its answers: ``<E, (x)_i G_i E>`` with ``E`` the error in the domain shape and
    ``G_i = W_i^T W_i`` (dense ``n_i x n_i``).  An evaluation helper (it reads the truth): e.g. the
    realised error over all ``~1.1e9`` ranges of a ``256 x 256`` domain in milliseconds."""
    terms = list(workload.terms) if isinstance(workload, KronStack) else [workload]
    E = np.asarray(estimate, dtype=np.float64) - np.asarray(truth, dtype=np.float64)
    total = 0.0
    for t in terms:
        E_t = E.reshape(t.in_shape)
        G = [_gram(F) for F in t.factors]
        total += float(np.sum(apply_factors(G, E_t) * E_t))
    return total
