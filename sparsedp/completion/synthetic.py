"""The seed's synthetic completion problem, built without an ``m x n`` array.

``X = U V^T`` with ``U`` (``m x r``) and ``V`` (``n x r``) standard normal (so ``E[X_ij^2] = r``), a
uniformly random observed set of ``round(p m n)`` distinct entries, and optionally i.i.d. Laplace
noise of scale ``b`` on the observed values (seed 003, Sec. 5: noise scale ``b``, observed rate ``p``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .._threads import blas_threads
from ..errors import ShapeError
from ..noise import as_generator


def simulated_laplace(gen: np.random.Generator, scale: float, size: int) -> np.ndarray:
    """``size`` float Laplace values of scale ``b`` for *simulations* -- the synthetic problem's
    observation noise and Soft-Impute's estimate of the published noise level's spectral norm --
    never privacy noise (that is drawn by :func:`sparsedp.measure.plan_measurement` in
    :func:`~sparsedp.completion.privatize_observations`).  The only noise draw in
    :mod:`sparsedp.completion` (a test checks it)."""
    return np.asarray(gen.laplace(0.0, scale, size), dtype=np.float64)


@blas_threads()
def synthetic_problem(m: int, n: int | None = None, rank: int = 10, p: float = 0.15, noise_scale: float = 0.0,
                      rng: Any = 0) -> tuple[sp.csr_matrix, tuple[np.ndarray, np.ndarray]]:
    """Return ``(observed, (U, V))``: the noisy observed entries of ``U V^T`` as CSR, and the truth's
    factors.  ``noise_scale = 0`` gives exact observations."""
    n = m if n is None else n
    if m < 1 or n < 1 or not 1 <= rank <= min(m, n):
        raise ShapeError(f"need m, n >= 1 and 1 <= rank <= min(m, n); got {m}, {n}, {rank}")
    if not 0 < p <= 1:
        raise ShapeError(f"p must lie in (0, 1], got {p!r}")
    if not noise_scale >= 0:
        raise ShapeError(f"noise_scale must be >= 0, got {noise_scale!r}")
    gen = as_generator(rng)
    U = gen.standard_normal((m, rank))
    V = gen.standard_normal((n, rank))
    count = max(1, int(round(p * m * n)))
    flat = gen.choice(m * n, size=count, replace=False)
    i, j = np.divmod(flat, n)
    vals = np.einsum("ij,ij->i", U[i], V[j])
    if noise_scale > 0:
        vals = vals + simulated_laplace(gen, noise_scale, count)
    return sp.csr_matrix((vals, (i, j)), shape=(m, n)), (U, V)
