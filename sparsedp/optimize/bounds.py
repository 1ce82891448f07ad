"""Certified lower bounds on the error of *every* strategy for a workload (issue 29).

The error :func:`~sparsedp.optimize.optimize` reports is the expected total squared error of the
GLS workload answers at unit budget with the calibrated noise variance (:mod:`.calibrate`):
``sigma2 * tr(G X^+)`` for a strategy normalised to ``Delta_p = 1``, ``X = M^T M``, ``G = W^T W``,
``sigma2 = 1/2`` (Gaussian, ``rho = 1``) or ``2`` (Laplace, ``epsilon = 1``).

* **Gaussian.**  ``Delta_2(M) = 1`` means ``diag X <= 1``, so ``tr(G X^+) >= OPT``, the optimum
  of the convex problem of :mod:`.gaussian_convex`; every dual point ``L > 0`` certifies
  ``OPT >= g(L)`` (weak duality), whatever the number of iterations that produced it.  The bound
  is ``sigma2 * g(L) = g(L) / 2``.
* **Laplace.**  Every column has ``||c||_2 <= ||c||_1``, so a strategy with ``Delta_1 = 1`` has
  ``Delta_2 <= 1`` and ``X`` is feasible for the same problem: its error ``2 tr(G X^+)`` is at
  least ``2 g(L)``, i.e. 4x the Gaussian bound at sparsedp's normalisation (2x at the issue's
  ``Var = Delta^2``).  It is tight only for strategies whose columns have one non-zero entry (the
  identity); at n = 32 and 64 (prefix, all ranges, random ranges, a weighted union) the best
  p-Identity strategies sit 2.5-3.3x above it, the trees 2.8-3.8x, the templates 2.6-5.4x.
* **SVD bound** (:func:`svd_bound`): the dual at ``L = c 1``, ``(sum_i sigma_i(W))^2 / n``
  (Li and Miklau's bound), weaker but in closed form for prefix sums (``G^-1`` is the tridiagonal
  ``[-1, 2, -1]`` with last diagonal entry 1: ``lambda_k = 1 / (4 sin^2((2k - 1) pi / (4n + 2)))``)
  and all ranges (``G = (n + 1) T^-1`` with ``T = [-1, 2, -1]``: ``lambda_k = (n + 1) / (4
  sin^2(k pi / (2n + 2)))``), so it is available at any ``n`` (``O(n)``).

* **Spectral bound** (:func:`spectral_bound_raw`, any workload, any ``n``): ``sum_i sigma_i >=
  sum_i sigma_i^2 / sigma_1 = ||W||_F^2 / ||W||_2``, so the SVD bound is at least ``||W||_F^4 /
  (n ||W||_2^2)``, with ``||W||_2^2 = lambda_max(W^T W) <= max_j (|W|^T |W| 1)_j`` (the largest row
  sum of the non-negative matrix ``|W|^T |W|``, which bounds its spectral radius and, entrywise,
  ``W^T W``'s; at most ``||W||_1 ||W||_inf``).  Two products with ``|W|``, ``O(nnz)``; rounded
  down by a relative ``8 (m + n) eps`` margin.  It is weaker (prefix sums: ``pi^2 n / 16`` against
  ``~ n ln(n)^2 / pi^2``), but certified for every workload at any size.

Kronecker workloads ``W = W_1 (x) ... (x) W_k`` (:class:`~sparsedp.marginals.KronOperator`): at
``L = L_1 (x) ... (x) L_k`` the dual factorises, ``tr S = prod tr S_i`` and ``sum L = prod sum L_i``,
so the bound is the product of the factors' raw bounds (and at the factors' optima it is the
optimum: the Kronecker product of the 1-D optima satisfies the optimality conditions).

The bound is on the error with the calibrated (continuous-noise) variance, as reported by
``optimize``; the exact discrete samplers have a variance smaller by a relative ``O(scale^-2)``
(``< 1e-9`` for the integer strategies scaled to ``2^k``; up to 8% for 0/1 templates under exact
Laplace noise, see :func:`~sparsedp.optimize.calibrate.unit_variance`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..operators import aslinearoperator
from ..intervals import IntervalRows
from ..marginals.kron import KronOperator, KronStack
from ..marginals.select import residual_coefficients
from ..marginals.workload import MarginalWorkload
from ..operators import SparseOperator
from ..workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload, WeightedUnionWorkload
from .calibrate import noise_model
from .gaussian_convex import GAUSSIAN_MAX_N, GAUSSIAN_SECONDS, GaussianSolution, dense_gram, solve_gaussian
from .gram import Gram
from .search import Deadline

__all__ = ["gaussian_dual", "lower_bound", "marginal_svd_raw", "multidim_lower_bound", "optimality_gap",
           "quick_lower_bound", "spectral_bound_raw", "svd_bound", "svd_bound_raw"]


def gaussian_dual(
    W: Any,
    *,
    tol: float = 1e-6,
    max_iter: int = 200,
    time_limit: float | None = GAUSSIAN_SECONDS,
    max_n: int = GAUSSIAN_MAX_N,
    polish: bool = True,
) -> GaussianSolution:
    """The dense dual solve for ``W`` (``n <= max_n``), at ``rho = 1`` (``sigma2 = 1/2``); it stops
    at ``tol``, ``max_iter`` or ``time_limit`` seconds (``None``: no limit), its bound valid at any."""
    Wop = aslinearoperator(W, name="workload")
    n = int(Wop.shape[1])
    if n > max_n:
        raise SparseDPError(f"the dense Gaussian bound is for n <= {max_n}, got n = {n}")
    gram = Gram(Wop)
    return solve_gaussian(gram, sigma2=0.5, tol=tol, max_iter=max_iter, polish=polish,
                          deadline=Deadline(time_limit) if time_limit is not None else None)


def _raw_dense(W: Any, **kw: Any) -> float:
    return gaussian_dual(W, polish=False, **kw).dual_raw  # the primal polish does not move the bound


def svd_bound_raw(W: Any) -> float:
    """``(sum_i sigma_i(W))^2 / n``: a lower bound on ``tr(G X^+)`` over ``diag X <= 1`` (closed form
    for prefix sums and all ranges at any ``n``; a dense eigendecomposition of ``G`` otherwise,
    ``n <= 4096``).  Rounded down by a relative ``n eps``-sized margin."""
    Wop = aslinearoperator(W, name="workload")
    n = int(Wop.shape[1])
    k = np.arange(1, n + 1, dtype=np.float64)
    if isinstance(Wop, PrefixWorkload):
        sv = 1.0 / (2.0 * np.sin((2.0 * k - 1.0) * np.pi / (4.0 * n + 2.0)))
    elif isinstance(Wop, AllRangesWorkload):
        sv = math.sqrt(n + 1.0) / (2.0 * np.sin(k * np.pi / (2.0 * n + 2.0)))
    else:
        if n > GAUSSIAN_MAX_N:
            raise SparseDPError(f"the SVD bound of a general workload is dense, n <= {GAUSSIAN_MAX_N}; got n = {n}")
        lam = np.linalg.eigvalsh(dense_gram(Gram(Wop)))
        delta = 8.0 * n * np.finfo(np.float64).eps * max(float(lam[-1]), 0.0)
        sv = np.sqrt(np.maximum(lam - delta, 0.0))
    total = float(np.sum(sv)) * (1.0 - 4.0 * n * np.finfo(np.float64).eps)
    return total * total / n


#: ``svd_bound_raw`` of a general workload by a dense eigendecomposition of ``W^T W`` up to this many
#: cells in :func:`quick_lower_bound` (~1 s at 2048 with one BLAS thread); above it the spectral bound.
QUICK_DENSE_MAX_N = 2048
#: A Kronecker workload whose factors all have at most this many cells gets their dense duals.
DUAL_FACTOR_MAX_N = 512


def _abs_gram_rows(W: Any) -> np.ndarray:
    """``|W|^T |W| 1`` (the row sums of ``|W|^T |W|``), from ``|W|``'s products: the 0/1 builders
    (prefix, all ranges, range queries) are their own absolute value; interval rows with their
    weights' absolute values; a weighted union part by part (``sum_i c_i |W_i|^T |W_i| 1``);
    anything else from its explicit entries."""
    if isinstance(W, WeightedUnionWorkload):
        return sum(c * _abs_gram_rows(Wi) for c, Wi in W.parts)
    n = int(W.shape[1])
    one = np.ones(n)
    if type(W) in (PrefixWorkload, AllRangesWorkload, RangeQueriesWorkload):
        return np.asarray(W.rmatvec(W.matvec(one)), dtype=np.float64).ravel()
    if type(W) is IntervalRows:
        A = IntervalRows(n, W.lo, W.hi, np.abs(W.weights))
        return np.asarray(A.rmatvec(A.matvec(one)), dtype=np.float64).ravel()
    A = abs(W.matrix if isinstance(W, SparseOperator) else W.tosparse())
    return np.asarray(A.T @ (A @ one), dtype=np.float64).ravel()


def spectral_bound_raw(W: Any) -> float:
    """``||W||_F^4 / (n ||W||_2^2)`` with a certified upper bound on ``||W||_2^2`` (module
    docstring): a lower bound on ``tr(G X^+)`` over ``diag X <= 1`` for any workload, ``O(nnz)``."""
    Wop = aslinearoperator(W, name="workload")
    m, n = (int(d) for d in Wop.shape)
    fro = float(np.sum(np.asarray(Wop.column_norms(2), dtype=np.float64) ** 2))
    top = float(np.max(_abs_gram_rows(Wop)))
    if not (fro > 0 and top > 0 and math.isfinite(fro) and math.isfinite(top)):
        raise SparseDPError("the workload is zero or not finite: no bound")
    margin = 8.0 * (m + n) * np.finfo(np.float64).eps
    return (fro * (1.0 - margin)) ** 2 / (n * top * (1.0 + margin))


def svd_bound(W: Any, noise: str = "gaussian") -> float:
    """The SVD bound at unit budget (``sigma2 * svd_bound_raw``; see the module docstring)."""
    return noise_model(noise).sigma2 * svd_bound_raw(W)


def _kron_raw(W: Any, **kw: Any) -> float:
    """The product of the factors' raw bounds: the dense dual of each factor up to ``max_n`` cells,
    :func:`quick_raw` above (each is the dual at a point of its factor, so the product is the dual at
    their Kronecker product)."""
    out = 1.0
    for F in W.factors:
        nf = int(aslinearoperator(F, name="factor").shape[1])
        out *= _raw_dense(F, **kw) if nf <= kw.get("max_n", GAUSSIAN_MAX_N) else quick_raw(F)
    return out


def lower_bound(
    W: Any,
    noise: str = "gaussian",
    *,
    time_limit: float | None = GAUSSIAN_SECONDS,
    tol: float = 1e-6,
    max_iter: int = 200,
    max_n: int = GAUSSIAN_MAX_N,
) -> float:
    """A certified lower bound on the expected total squared error of the GLS answers of ``W``
    under *every* strategy, at ``rho = 1`` (``noise="gaussian"``) or ``epsilon = 1``
    (``"laplace"``), on the scale of ``optimize(W, noise=...).error.total``.

    ``n <= max_n``: the dual of the Gaussian convex problem at the solver's best point (valid at
    any iteration; ``time_limit`` / ``tol`` / ``max_iter`` only tighten it), times ``1/2``
    (Gaussian) or ``2`` (Laplace).  Larger prefix / all-range workloads: the closed-form SVD bound.
    A :class:`~sparsedp.marginals.KronOperator`: the product of its factors' bounds."""
    model = noise_model(noise)
    kw = {"time_limit": time_limit, "tol": tol, "max_iter": max_iter, "max_n": max_n}
    if isinstance(W, KronOperator):
        return model.sigma2 * _kron_raw(W, **kw)
    Wop = aslinearoperator(W, name="workload")
    n = int(Wop.shape[1])
    if n > max_n:
        if isinstance(Wop, (PrefixWorkload, AllRangesWorkload)):
            return model.sigma2 * svd_bound_raw(Wop)
        return model.sigma2 * spectral_bound_raw(Wop)
    return model.sigma2 * _raw_dense(Wop, **kw)


def quick_raw(W: Any) -> float:
    """The cheapest certified raw bound worth having: the closed-form SVD bound (prefix sums, all
    ranges), the dense SVD bound (``n <=`` :data:`QUICK_DENSE_MAX_N`), else the spectral bound; a
    Kronecker product: the product of its factors' (each a valid dual point of its factor)."""
    if isinstance(W, KronOperator):
        out = 1.0
        for F in W.factors:
            out *= quick_raw(F)
        return out
    Wop = aslinearoperator(W, name="workload")
    n = int(Wop.shape[1])
    if isinstance(Wop, (PrefixWorkload, AllRangesWorkload)):
        return svd_bound_raw(Wop)  # closed form, O(n) (all ranges has n (n + 1) / 2 rows: no products)
    if n <= QUICK_DENSE_MAX_N:
        return max(svd_bound_raw(Wop), spectral_bound_raw(Wop))
    return spectral_bound_raw(Wop)


def marginal_svd_raw(mw: Any) -> float:
    """The SVD bound of a :class:`~sparsedp.marginals.MarginalWorkload` with unit weights and the
    ``"sum"`` objective, in closed form: ``G = sum_S Q_S^T Q_S`` with ``Q_S^T Q_S = (x)_i (I if i in
    S else J)`` is diagonal in the tensor basis of constant / mean-zero vectors per attribute; on the
    block of the attributes ``A`` (mean-zero there, constant elsewhere; dimension ``prod_{i in A}
    (n_i - 1)``) its eigenvalue is ``lambda_A = sum_{S >= A} prod_{i not in S} n_i`` (the residual
    spaces of ResidualPlanner), so ``sum sigma = sum_A dim_A sqrt(lambda_A)`` over the subsets of
    the marginals, and the bound is ``(sum sigma)^2 / prod n_i``."""
    if not bool(np.all(np.asarray(mw.weights) == 1.0)) or mw.objective != "sum":
        raise SparseDPError("the closed-form marginal bound is for unit weights and the 'sum' objective")
    # dim_A^2 lambda_A / prod n_i = c_A p_A (ResidualPlanner's coefficients), so the bound is
    # (sum_A sqrt(c_A p_A))^2: one vectorised pass over the residuals (residual_coefficients)
    residuals, c, pv = residual_coefficients(mw.domain, list(mw.marginals), np.ones(len(mw.marginals)))
    total = float(np.sum(np.sqrt(c * pv)))
    total *= 1.0 - 8.0 * (len(residuals) + len(mw.marginals) + 8) * np.finfo(np.float64).eps
    return total * total


def _kron_stack_spectral_raw(K: Any) -> float:
    """The spectral bound of a union of Kronecker products ``[K_1; K_2; ...]``: ``||W||_F^2 = sum_t
    prod_i ||F_ti||_F^2`` and ``|W|^T |W| 1 = sum_t (x)_i |F_ti|^T |F_ti| 1``, whose largest entry is
    at most ``sum_t prod_i max(|F_ti|^T |F_ti| 1)``."""
    import scipy.sparse as sp

    fro, top, n = 0.0, 0.0, None
    for T in K.terms:
        f, t, size = 1.0, 1.0, 1
        for F in T.factors:
            A = abs(sp.csr_matrix(F, dtype=np.float64))
            f *= float(A.multiply(A).sum())
            t *= float(np.max(A.T @ (A @ np.ones(A.shape[1]))))
            size *= A.shape[1]
        fro, top, n = fro + f, top + t, size
    margin = 8.0 * (K.shape[0] + K.shape[1]) * np.finfo(np.float64).eps
    return (fro * (1.0 - margin)) ** 2 / (float(n) * top * (1.0 + margin))


def multidim_lower_bound(W: Any, noise: str = "gaussian") -> float | None:
    """A certified bound for the multi-dimensional workloads of :func:`~sparsedp.optimize.optimize`
    at unit budget: a Kronecker product (the product of its factors' dense dual bounds when every
    factor has at most :data:`DUAL_FACTOR_MAX_N` cells, else of their :func:`quick_raw`), a union of products (the
    spectral bound), a marginal workload with unit weights and the ``"sum"`` objective (the
    closed-form SVD bound, :func:`marginal_svd_raw`); ``None`` for other marginal objectives."""
    sigma2 = noise_model(noise).sigma2
    if isinstance(W, KronOperator):
        if all(int(F.shape[1]) <= DUAL_FACTOR_MAX_N for F in W.factors):  # the factors' dense duals
            return sigma2 * _kron_raw(W, time_limit=10.0, tol=1e-6, max_iter=200, max_n=DUAL_FACTOR_MAX_N)
        return sigma2 * quick_raw(W)
    if isinstance(W, KronStack):
        return sigma2 * _kron_stack_spectral_raw(W)
    if isinstance(W, MarginalWorkload) and bool(np.all(np.asarray(W.weights) == 1.0)) and W.objective == "sum":
        return sigma2 * marginal_svd_raw(W)
    return None


def quick_lower_bound(W: Any, noise: str = "gaussian") -> float:
    """A certified lower bound on the error of every strategy at unit budget without a dual solve
    (:func:`quick_raw` times the unit variance ``1/2`` Gaussian, ``2`` Laplace): what
    :func:`~sparsedp.optimize.optimize` attaches when the dense dual is not run."""
    return noise_model(noise).sigma2 * quick_raw(W)


def optimality_gap(result: Any, W: Any, **kw: Any) -> float:
    """``result.error.total / lower_bound(W, result.noise)`` for an
    :class:`~sparsedp.optimize.OptimizedStrategy` of ``W`` (``>= 1``)."""
    return float(result.error.total) / lower_bound(W, result.noise, **kw)
