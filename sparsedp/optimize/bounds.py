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
from ..workloads import AllRangesWorkload, PrefixWorkload
from .calibrate import noise_model
from .gaussian_convex import GAUSSIAN_MAX_N, GAUSSIAN_SECONDS, GaussianSolution, dense_gram, solve_gaussian
from .gram import Gram
from .search import Deadline

__all__ = ["gaussian_dual", "lower_bound", "optimality_gap", "svd_bound", "svd_bound_raw"]


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


def svd_bound(W: Any, noise: str = "gaussian") -> float:
    """The SVD bound at unit budget (``sigma2 * svd_bound_raw``; see the module docstring)."""
    return noise_model(noise).sigma2 * svd_bound_raw(W)


def _kron_raw(W: Any, **kw: Any) -> float:
    out = 1.0
    for F in W.factors:
        out *= _raw_dense(F, **kw)
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
    from ..marginals.kron import KronOperator

    if isinstance(W, KronOperator):
        return model.sigma2 * _kron_raw(W, **kw)
    Wop = aslinearoperator(W, name="workload")
    n = int(Wop.shape[1])
    if n > max_n:
        if isinstance(Wop, (PrefixWorkload, AllRangesWorkload)):
            return model.sigma2 * svd_bound_raw(Wop)
        raise SparseDPError(f"no lower bound for this workload at n = {n} > {max_n} (dense solve)")
    return model.sigma2 * _raw_dense(Wop, **kw)


def optimality_gap(result: Any, W: Any, **kw: Any) -> float:
    """``result.error.total / lower_bound(W, result.noise)`` for an
    :class:`~sparsedp.optimize.OptimizedStrategy` of ``W`` (``>= 1``)."""
    return float(result.error.total) / lower_bound(W, result.noise, **kw)
