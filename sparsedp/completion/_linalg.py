"""Thin QR of a tall ``m x k`` block (``k`` small) straight from LAPACK.

``numpy.linalg.qr`` adds per-call overhead (argument checks, a workspace query, a copy, ``triu``)
that dominates on ``k = 10`` columns and grows badly with ``m``: measured (one BLAS thread, min of 7
x 200 calls) 0.12 ms vs 0.066 ms at ``1000 x 10`` and 6.6 ms vs 1.1 ms at ``20000 x 10``.  The
factorisation is the same (Householder ``dgeqrf`` then ``dorgqr``; bitwise equal factors in those
measurements), so iterates do not change.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack

from ..errors import SparseDPError


def thin_qr(A: np.ndarray, want_r: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """``A = Q R`` with ``Q`` (``m x k``, orthonormal columns) and ``R`` (``k x k``, upper triangular;
    ``None`` unless ``want_r``), for ``m >= k`` (Householder QR: LAPACK ``dgeqrf`` + ``dorgqr``)."""
    m, k = A.shape
    if m < k:
        raise SparseDPError(f"thin_qr needs a tall matrix, got {A.shape}")
    qr, tau, _, info = lapack.dgeqrf(A)  # (a Fortran-ordered copy of A: A is not overwritten)
    if info != 0:
        raise SparseDPError(f"LAPACK dgeqrf failed (info={info})")  # pragma: no cover
    R = np.triu(qr[:k]) if want_r else None
    Q, _, info = lapack.dorgqr(qr, tau, overwrite_a=1)
    if info != 0:
        raise SparseDPError(f"LAPACK dorgqr failed (info={info})")  # pragma: no cover
    return Q, R


def small_svd(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A = P diag(s) G^T`` of a small square core (LAPACK ``dgesdd`` directly: ``numpy.linalg.svd``'s
    wrapper costs more than the ``10 x 10`` factorisation itself; same routine, same factors)."""
    P, s, Gt, info = lapack.dgesdd(A)
    if info != 0:
        raise SparseDPError(f"LAPACK dgesdd failed (info={info})")  # pragma: no cover
    return P, s, Gt
