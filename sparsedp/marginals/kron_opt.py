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
``Kron`` parametrisation, McKenna et al. VLDB 2018, optimises the same product).  The optimiser
itself, :func:`optimize_kron`, lives with the other optimisers (:mod:`sparsedp.optimize.multidim`;
``sparsedp.optimize.optimize_kron`` names it): this module holds the result type and the formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ShapeError, SparseDPError
from ..operators import aslinearoperator
from .kron import KronOperator

__all__ = ["KronStrategy", "factor_trace"]


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
