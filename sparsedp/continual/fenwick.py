"""Fenwick factorisation ``W_N = B_N M_N`` of the running-sum workload (seed 000, Algs. 5.1-5.3).

``M_N`` (Algorithm 5.2) measures node ``i`` = ``sum a_j`` over ``(i - lowbit(i), i]``; ``B_N``
(Algorithm 5.3) rebuilds ``s_p`` from the chain ``p, p - lowbit(p), ...`` (eq. 5.6).  Both are built
in ``O(N log N)`` as sparse matrices.  Note that the seed's Algorithm 5.2 prints ``while pt < N``:
that loses row ``N`` of every column (``M_N`` would be singular); the correct bound is ``pt <= N``.

Two closed forms used everywhere in :mod:`sparsedp.continual`:

* ``||B[:, i]||_2^2 = min(lowbit(i), N - i + 1)``: row ``p`` uses node ``i`` iff ``p`` keeps the bits
  of ``i`` above ``lowbit(i)``, i.e. ``p`` in ``[i, i + lowbit(i) - 1]``, cut at ``N``.
* column ``j`` of ``M`` has its ones on the rows ``j, j + lowbit(j), ...`` (``<= N``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import strategies as st
from ..errors import ShapeError

__all__ = ["fenwick_matrices", "lowbit", "column_counts", "check_horizon", "prefix_chain_sum", "column_chain_sum"]


def check_horizon(N: Any, name: str = "horizon") -> int:
    """``N`` as a positive ``int`` (:class:`ShapeError` otherwise)."""
    if isinstance(N, (bool, np.bool_)) or not isinstance(N, (int, np.integer)) or int(N) < 1:
        raise ShapeError(f"{name} must be an integer >= 1, got {N!r}")
    return int(N)


def lowbit(i: np.ndarray | int) -> np.ndarray | int:
    """Algorithm 5.1: the lowest set bit of ``i`` (``lowbit(10) = 2``), vectorised."""
    return i & -i


def column_counts(N: int) -> np.ndarray:
    """``||B_N[:, i]||^2 = min(lowbit(i), N - i + 1)`` for ``i = 1..N`` (the weights of eq. 5.10)."""
    N = check_horizon(N, "N")
    i = np.arange(1, N + 1, dtype=np.int64)
    return np.minimum(lowbit(i), N - i + 1).astype(np.float64)


def prefix_chain_sum(values: np.ndarray) -> np.ndarray:
    """``out[p] = sum_{q in chain(p)} values[q]`` (chain ``p, p - lowbit(p), ... > 0``), i.e. ``B v``.

    ``O(N log N)`` in ``floor(log2 N) + 1`` vectorised passes.
    """
    N = values.size
    q = np.arange(1, N + 1, dtype=np.int64)
    out = np.zeros(N)
    while True:
        live = q > 0
        if not live.any():
            return out
        out[live] += values[q[live] - 1]
        q = q - lowbit(q)


def column_chain_sum(values: np.ndarray) -> np.ndarray:
    """``out[j] = sum_{i = j, j + lowbit(j), ... <= N} values[i]``, i.e. ``M_N^T v``."""
    N = values.size
    q = np.arange(1, N + 1, dtype=np.int64)
    out = np.zeros(N)
    while True:
        live = q <= N
        if not live.any():
            return out
        out[live] += values[q[live] - 1]
        q = np.where(live, q + lowbit(q), q)


def fenwick_matrices(N: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """``(M_N, B_N)`` as CSR matrices with ``W_N = B_N M_N`` (lower-triangular ones), no dense step.

    ``M_N`` is :func:`sparsedp.strategies.fenwick` (Theorem 5.1: ``||M_N||_1 = floor(log2 N) + 1``);
    ``B_N[p, q] = 1`` for ``q`` in the chain of ``p`` (Theorem 5.2: row ``p`` has ``popcount(p)``
    ones), equal to ``W_N M_N^{-1}``.
    """
    N = check_horizon(N, "N")
    M = st.fenwick(N).tosparse().tocsr()
    p = np.arange(1, N + 1, dtype=np.int64)
    rows, cols = [], []
    q = p.copy()
    while True:
        live = q > 0
        if not live.any():
            break
        rows.append(p[live] - 1)
        cols.append(q[live] - 1)
        q = q - lowbit(q)
    r = np.concatenate(rows)
    c = np.concatenate(cols)
    B = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(N, N))
    return M, B
