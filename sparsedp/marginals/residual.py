"""The residual basis of marginal workloads (ResidualPlanner, Xiao, He, Zhang, Kifer, NeurIPS 2023).

For an attribute of size ``n`` let ``Q_n`` be an ``(n-1) x n`` matrix whose orthonormal rows span
the complement of the all-ones vector (here a Haar-like basis: a balanced split of the cells into
``L`` and ``R`` gives the row ``(1_L / |L| - 1_R / |R|) / sqrt(1/|L| + 1/|R|)``, recursively in
``L`` and ``R``; ``n log2 n`` non-zeros).  For a set of attributes ``A`` the *residual* ``A`` is

    R_A = (x)_{i in A} Q_{n_i}  (x)_{i not in A} 1^T        (``prod_{i in A} (n_i - 1)`` rows).

The row spaces of ``R_A`` for different ``A`` are orthogonal, and the marginal ``W_S`` lies in the
span of the residuals ``A subset S``:

    W_S = sum_{A subset S} K_{S,A} R_A,   K_{S,A} = (x)_{i in A} Q_{n_i}^T (x)_{i in S \\ A} 1 / n_i,

so measuring every residual once with noise ``N(0, sigma_A^2 I)`` answers every marginal of the
closure; ``R_A x = Q_A t_A`` (``Q_A = (x)_{i in A} Q_{n_i}``, ``t_A`` the marginal table on ``A``) is
computed on the small table ``t_A``, never on the domain.  Every column of ``R_A`` has squared norm
``p_A = prod_{i in A} (n_i - 1) / n_i`` (the diagonal of ``I - 11^T / n``), so one added or removed
record moves the residual measurement by exactly ``sqrt(p_A)`` in L2.  A cell of ``S`` has variance
``sum_{A subset S} sigma_A^2 prod_{i in A} (n_i - 1) / n_i prod_{i in S \\ A} 1 / n_i^2``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import ShapeError
from .kron import KronOperator, apply_factors

__all__ = ["contrast_basis", "residual_operator", "residual_p", "residual_to_marginal", "cell_variance_factor"]


@lru_cache(maxsize=256)
def _contrast(n: int) -> sp.csr_matrix:
    rows, cols, vals = [], [], []

    def split(lo: int, hi: int) -> None:
        size = hi - lo
        if size < 2:
            return
        mid = lo + size // 2
        a, b = mid - lo, hi - mid
        norm = math.sqrt(1.0 / a + 1.0 / b)
        r = len(rows_start)
        rows_start.append(r)
        for j in range(lo, mid):
            rows.append(r), cols.append(j), vals.append(1.0 / a / norm)
        for j in range(mid, hi):
            rows.append(r), cols.append(j), vals.append(-1.0 / b / norm)
        split(lo, mid)
        split(mid, hi)

    rows_start: list[int] = []
    split(0, n)
    Q = sp.csr_matrix((vals, (rows, cols)), shape=(n - 1, n))
    Q.sort_indices()
    return Q


def contrast_basis(n: int) -> sp.csr_matrix:
    """``Q_n``: ``n - 1`` orthonormal rows orthogonal to ``1`` (Haar-like; see module doc).  A copy."""
    n = int(n)
    if n < 1:
        raise ShapeError(f"an attribute size must be >= 1, got {n}")
    return _contrast(n).copy()


def residual_operator(sizes: Sequence[int]) -> KronOperator:
    """``Q_A = (x)_i Q_{n_i}`` acting on the C-ordered marginal table of shape ``sizes`` (the empty
    residual, ``sizes = ()``, is the total count: the 1 x 1 matrix ``[1]``)."""
    if not sizes:
        return KronOperator([np.ones((1, 1))], name="residual()")
    return KronOperator([_contrast(int(n)) for n in sizes], name=f"residual{tuple(sizes)}")


def residual_p(sizes: Sequence[int]) -> float:
    """``p_A = prod (n_i - 1) / n_i``: the squared L2 norm of every column of ``R_A``."""
    return float(math.prod((n - 1) / n for n in sizes))


def residual_to_marginal(r: np.ndarray, sizes_S: Sequence[int], pos: Sequence[int], out: np.ndarray | None = None
                         ) -> np.ndarray:
    """Add ``K_{S,A} r`` to ``out`` (shape ``sizes_S``): ``r`` is the residual vector of ``A``
    (whose attributes sit at positions ``pos`` of ``S``), mapped back by ``Q_{n_i}^T`` on each axis of
    ``A`` and spread uniformly (``1 / n_i``) over the others.  The pseudo-inverse of ``R_A``
    restricted to ``S`` (``R_A^+ = (x) Q^T (x) 1 / n``)."""
    sizes_S = tuple(int(n) for n in sizes_S)
    if out is None:
        out = np.zeros(sizes_S)
    if pos:
        shape_r = tuple(sizes_S[k] - 1 for k in pos)
        t = apply_factors([_contrast(sizes_S[k]).T for k in pos], np.asarray(r, dtype=np.float64).reshape(shape_r))
    else:
        t = np.asarray(r, dtype=np.float64).reshape(())
    scale = 1.0
    expand = [1] * len(sizes_S)
    for k, n in enumerate(sizes_S):
        if k in pos:
            expand[k] = n
        else:
            scale /= n
    out += t.reshape(expand) * scale
    return out


def cell_variance_factor(sizes_S: Sequence[int], pos: Sequence[int]) -> float:
    """Per-cell variance of ``K_{S,A} r`` when ``r`` has i.i.d. unit-variance entries:
    ``prod_{i in A} (n_i - 1) / n_i * prod_{i in S \\ A} 1 / n_i^2`` (the same in every cell)."""
    f = 1.0
    for k, n in enumerate(sizes_S):
        f *= (n - 1) / n if k in pos else 1.0 / (n * n)
    return f
