"""The exact (empirical) oracle: least squares on the true tangent space, knowing the subspaces.

:func:`~sparsedp.completion.metrics.oracle_rse` is the *asymptotic* Candes-Plan floor
``sigma^2 r (m + n - r) / p``.  The estimator it describes is the oracle that knows the column and
row spaces ``U``, ``V`` of the truth and fits the tangent space
``T = {U A^T + B V^T}`` (``df = r (m + n - r)`` free parameters) to the observed entries by least
squares (Candes and Plan, "Matrix completion with noise", Proc. IEEE 98(6), 2010, Sec. III.B):

    ``X_or = argmin_{Z in T} ||P_Omega(Z - M)||_F``.

Its error is ``sigma^2 tr((P_T P_Omega P_T)^+)``, which is ``sigma^2 df / p`` only when the number of
observations ``|Omega|`` is much larger than ``df``; otherwise it is larger, by about
``|Omega| / (|Omega| - df)`` (the inverse-Wishart factor: ``P_T P_Omega P_T`` has eigenvalues spread
around ``p``).  :func:`oracle_least_squares` computes ``X_or`` for the actual pattern and the actual
noisy values by LSQR on the operator ``(A, B) -> P_Omega(U A^T + B V^T)`` (``U``, ``V``
orthonormalised), in ``O(|Omega| r)`` per iteration and without any ``m x n`` array.  It needs the
truth, so it is a benchmark yardstick, not an estimator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse.linalg as spla

from .._threads import blas_threads
from ..errors import ShapeError
from ._observed import as_pattern
from .metrics import _as_factors_or_dense, rse


@dataclass(frozen=True)
class OracleFit:
    """The oracle least-squares estimate ``left @ right.T`` (rank ``<= 2r``), its RSE against the truth,
    LSQR's iteration count and stop code (1 or 2: converged), and the seconds it took."""

    left: np.ndarray
    right: np.ndarray
    rse: float
    iterations: int
    istop: int
    seconds: float


def _truth_subspaces(truth: Any, rank: int | None) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    T = _as_factors_or_dense(truth, "truth")
    if isinstance(T, tuple):
        U, V = T
    else:  # dense truth: its top-`rank` singular subspaces (small problems only)
        if rank is None:
            raise ShapeError("a dense truth needs rank=")
        P, s, Qt = np.linalg.svd(T, full_matrices=False)
        U, V = P[:, :rank] * s[:rank], Qt[:rank].T
    return np.linalg.qr(U)[0], np.linalg.qr(V)[0], (U, V)


@blas_threads()
def oracle_least_squares(observed: Any, truth: Any, rank: int | None = None, *, tol: float = 1e-10,
                         max_iter: int | None = None) -> OracleFit:
    """Least squares of the observed (noisy) entries over the true tangent space; see module doc.

    ``observed``: the observations (``scipy.sparse`` or a release); ``truth``: a factor pair ``(U, V)``
    meaning ``U V^T`` (or a dense array with ``rank``).  LSQR (Paige-Saunders) starts at zero, so it
    returns the minimum-norm coefficients of the (over-complete by ``r^2``) parameterisation; the
    estimate ``Z`` itself is unique.  ``tol`` is LSQR's ``atol = btol``.
    """
    pat = as_pattern(observed)
    Qu, Qv, factors = _truth_subspaces(truth, rank)
    m, n = pat.shape
    if Qu.shape[0] != m or Qv.shape[0] != n:
        raise ShapeError(f"truth has shape {(Qu.shape[0], Qv.shape[0])}, observed {pat.shape}")
    r = Qu.shape[1]

    def forward(x: np.ndarray) -> np.ndarray:
        A = x[: n * r].reshape(n, r)
        B = x[n * r:].reshape(m, r)
        return pat.sampled(Qu, A) + pat.sampled(B, Qv)

    def adjoint(e: np.ndarray) -> np.ndarray:
        S = pat.matrix(np.ravel(e))
        return np.concatenate([np.asarray(S.T @ Qu).ravel(), np.asarray(S @ Qv).ravel()])

    op = spla.LinearOperator((pat.nnz, (m + n) * r), matvec=forward, rmatvec=adjoint, dtype=np.float64)
    t0 = time.perf_counter()
    sol = spla.lsqr(op, pat.values, atol=tol, btol=tol, iter_lim=max_iter or 10 * (m + n))
    seconds = time.perf_counter() - t0
    x, istop, iters = sol[0], int(sol[1]), int(sol[2])
    A = x[: n * r].reshape(n, r)
    B = x[n * r:].reshape(m, r)
    left, right = np.hstack([Qu, B]), np.hstack([A, Qv])
    return OracleFit(left, right, rse((left, right), factors), iters, istop, seconds)
