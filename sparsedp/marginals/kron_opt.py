"""Kronecker strategies for Kronecker workloads: optimise each 1-D factor, error by factorisation.

For a workload ``W = W_1 (x) ... (x) W_k`` (e.g. all 2-D ranges: ``AllRange (x) AllRange``) and a
strategy ``M = M_1 (x) ... (x) M_k`` with full column rank factors, the reconstruction
``W M^+ y`` has total squared error (homoscedastic noise, one record = one cell)

    Laplace, epsilon-DP:  2 Delta_1(M)^2 / epsilon^2 * ||W M^+||_F^2
    Gaussian, rho-zCDP:   Delta_2(M)^2 / (2 rho)    * ||W M^+||_F^2

and both factors split: ``Delta_p(M) = prod_i Delta_p(M_i)`` and
``||W M^+||_F^2 = prod_i ||W_i M_i^+||_F^2 = prod_i trace(W_i^T W_i (M_i^T M_i)^{-1})``.  So the error
is the product of the 1-D errors (at unit budget, over 2 or 1/2), and minimising each 1-D factor's
error with :func:`sparsedp.optimize` minimises the product over Kronecker strategies (HDMM's
``Kron`` parametrisation, McKenna et al. VLDB 2018, optimises the same product).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ShapeError, SparseDPError
from ..operators import aslinearoperator
from .kron import KronOperator

__all__ = ["KronStrategy", "optimize_kron", "factor_trace"]


def factor_trace(W: Any, M: Any) -> float:
    """``||W M^+||_F^2 = trace(W^T W (M^T M)^{-1})`` for a full-column-rank ``M`` (dense ``n x n``
    solves: 1-D factors only)."""
    Wm = aslinearoperator(W).tosparse()
    Mm = aslinearoperator(M).tosparse()
    if Wm.shape[1] != Mm.shape[1]:
        raise ShapeError(f"W has {Wm.shape[1]} columns, M {Mm.shape[1]}")
    G = (Wm.T @ Wm).toarray()
    H = (Mm.T @ Mm).toarray()
    try:
        X = np.linalg.solve(H, G)
    except np.linalg.LinAlgError as exc:
        raise ShapeError("a strategy factor must have full column rank") from exc
    return float(np.trace(X))


@dataclass(frozen=True)
class KronStrategy:
    """A Kronecker strategy and its exact error on a Kronecker workload (see module doc)."""

    strategy: KronOperator
    factors: tuple  # the per-factor strategies (operators)
    names: tuple[str, ...]  # what each factor is (e.g. "p-identity(p=2)")
    noise: str
    sensitivity: float  # Delta_1 (Laplace) or Delta_2 (Gaussian) of the product
    traces: tuple[float, ...]  # ||W_i M_i^+||_F^2 per factor
    queries: int  # rows of the workload
    seconds: float

    def total_error(self, *, epsilon: float | None = None, rho: float | None = None) -> float:
        """Expected total squared error of all workload answers at ``epsilon`` (Laplace) or ``rho``."""
        frob = math.prod(self.traces)
        if self.noise == "laplace":
            if epsilon is None or not epsilon > 0:
                raise SparseDPError("Laplace noise: give epsilon > 0")
            return 2.0 * self.sensitivity**2 / epsilon**2 * frob
        if rho is None or not rho > 0:
            raise SparseDPError("Gaussian noise: give rho > 0")
        return self.sensitivity**2 / (2.0 * rho) * frob

    def rmse(self, **budget: float) -> float:
        """Per-query root mean squared error."""
        return math.sqrt(self.total_error(**budget) / self.queries)


def optimize_kron(workload_factors: Sequence[Any], *, noise: str = "laplace", **options: Any) -> KronStrategy:
    """Optimise each factor ``W_i`` with :func:`sparsedp.optimize` (``options`` passed on, e.g.
    ``family="auto"``, ``time_limit``, ``rng``) and return their Kronecker product with its exact
    error.  Identical factors are optimised once."""
    from ..optimize import optimize

    t0 = time.perf_counter()
    Ws = [aslinearoperator(W) for W in workload_factors]
    if not Ws:
        raise ShapeError("give at least one workload factor")
    p = 1 if noise == "laplace" else 2
    done: dict[int, tuple] = {}
    factors, names, traces, sens = [], [], [], 1.0
    for W in Ws:
        key = id(W)
        if key not in done:
            res = optimize(W, noise=noise, **options)
            M = res.strategy
            Mm = M.tosparse()
            col = np.asarray(abs(Mm).sum(axis=0)).ravel() if p == 1 else np.sqrt(np.asarray(Mm.multiply(Mm).sum(axis=0)).ravel())
            done[key] = (M, res.name, factor_trace(W, M), float(col.max()))
        M, name, tr, d = done[key]
        factors.append(M), names.append(name), traces.append(tr)
        sens *= d
    return KronStrategy(strategy=KronOperator([M.tosparse() for M in factors], name="kron strategy"),
                        factors=tuple(factors), names=tuple(names), noise=noise, sensitivity=sens,
                        traces=tuple(traces), queries=math.prod(W.shape[0] for W in Ws),
                        seconds=time.perf_counter() - t0)
