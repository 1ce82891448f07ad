"""Exact GLS for strategies ``M = [diag(a); B]``: a diagonal plus a few extra rows, by Woodbury.

The p-Identity strategies of :mod:`sparsedp.optimize.pidentity` (HDMM, McKenna et al., VLDB 2018)
have this form, as does any strategy that measures every cell once plus ``p`` other queries.  With
per-row noise variances ``v = (v_1, v_2)`` (``n`` and ``p`` rows) the GLS estimate is

    x_hat = (E + B^T V_2^{-1} B)^{-1} r,   E = diag(a^2 / v_1),   r = a y_1 / v_1 + B^T (y_2 / v_2),

and by the Woodbury identity

    (E + B^T V_2^{-1} B)^{-1} = E^{-1} - E^{-1} B^T K^{-1} B E^{-1},   K = V_2 + B E^{-1} B^T  (p x p, SPD).

One Cholesky factorisation of ``K`` costs ``O(p nnz(B) + p^3)``; each solve then costs
``O(nnz(B) + p^2)``, against the iterations of LSMR on the ``(n + p) x n`` system: exact, and no
``n x n`` matrix is formed.  The form is recognised from the matrix itself (the first ``n`` rows are
a diagonal with non-zero entries), never from a name or tag.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from .operators import Operator, SparseOperator

__all__ = ["DENSE_FRACTION", "WOODBURY_MAX_ROWS", "diagonal_plus_rows", "woodbury_solver"]

#: Fraction of non-zeros above which the extra rows are held dense (products by BLAS).
DENSE_FRACTION = 0.1

#: Most extra rows ``p`` solved by Woodbury (the ``p x p`` factorisation costs ``p^3 / 3``: ~2 s at 2048).
WOODBURY_MAX_ROWS = 2048


def diagonal_plus_rows(M: Operator) -> tuple[np.ndarray, sp.csr_matrix] | None:
    """``(a, B)`` if the sparse ``M`` (``m x n``, ``n < m <= n + WOODBURY_MAX_ROWS``) is
    ``[diag(a); B]`` with every ``a_i != 0``; else ``None``.  ``O(nnz)``."""
    if not isinstance(M, SparseOperator):
        return None
    m, n = M.shape
    if not n < m <= n + WOODBURY_MAX_ROWS:
        return None
    A = M.matrix
    top = A[:n]
    if top.nnz != n or np.any(np.diff(top.indptr) != 1) or np.any(top.indices != np.arange(n)):
        return None
    a = np.asarray(top.data, dtype=np.float64)
    if np.any(a == 0.0):
        return None
    return a, sp.csr_matrix(A[n:])


def woodbury_solver(M: Operator, v: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
    """The GLS map ``Y -> x_hat`` (vectors or matrices with one column per right-hand side) of
    ``M = [diag(a); B]`` with row variances ``v`` (module docstring), or ``None`` if ``M`` does not
    have that form or ``K`` is not numerically positive definite."""
    form = diagonal_plus_rows(M)
    if form is None:
        return None
    a, B = form
    n = a.size
    v = np.asarray(v, dtype=np.float64)
    v1, v2 = v[:n], v[n:]
    e_inv = v1 / (a * a)  # E^{-1}
    if B.nnz > DENSE_FRACTION * B.shape[0] * n:  # dense rows (optimised p-Identity): BLAS products
        Bd = B.toarray()
        K = (Bd * e_inv[None, :]) @ Bd.T
        B, Bt = Bd, Bd.T
    else:
        K = np.asarray((B @ sp.diags(e_inv) @ B.T).todense())
        Bt = sp.csr_matrix(B.T)
    K[np.diag_indices_from(K)] += v2
    try:
        chol = sla.cho_factor(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None

    def solve(Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y, dtype=np.float64)
        vec = Y.ndim == 1
        Y2 = Y[:, None] if vec else Y
        r = (a / v1)[:, None] * Y2[:n] + Bt @ (Y2[n:] / v2[:, None])
        z = e_inv[:, None] * r
        x = z - e_inv[:, None] * (Bt @ sla.cho_solve(chol, B @ z, check_finite=False))
        return x[:, 0] if vec else x

    return solve
