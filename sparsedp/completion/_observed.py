"""Observed entries as a fixed sparsity pattern, and the products every method needs.

Every method keeps its iterate as *low rank + sparse*: ``Z = A B^T + S`` with ``S`` supported on the
observed set ``Omega`` (LMaFit's trick, Wen-Yin-Zhang 2012, Sec. 3).  Then ``Z V``, ``Z^T U`` cost
``O(|Omega| k + (m + n) k^2)`` and no ``m x n`` array is formed.  The pattern (CSR order) is
validated and frozen once; a sparse matrix on it is rebuilt from a new data vector for free.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import NonFiniteInputError, ShapeError
from ..noise import as_generator

CHUNK = 1 << 19
DENSE_BLOCKS = 0.05  # density above which sampled products use BLAS row blocks


@dataclass(frozen=True)
class Pattern:
    """The observed set ``Omega`` of an ``m x n`` matrix in CSR order, with the observed values."""

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    rows: np.ndarray
    values: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.values.size)

    @property
    def cols(self) -> np.ndarray:
        return self.indices

    def matrix(self, data: np.ndarray) -> sp.csr_matrix:
        """The CSR matrix with this pattern and ``data`` (one value per observed entry)."""
        return sp.csr_matrix((data, self.indices, self.indptr), shape=self.shape, copy=False)

    def sampled(self, A: np.ndarray, B: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``(A @ B.T)[Omega]`` in CSR order in ``O(|Omega| k)`` memory, never an ``m x n`` array
        (written into ``out``, a float64 vector of length ``|Omega|``, when given).

        Dense enough patterns (density > ``DENSE_BLOCKS``) multiply blocks of rows of ``A`` by
        ``B.T`` with BLAS and pick the observed entries (``<= CHUNK`` entries per block, their flat
        offsets computed once per pattern); sparse ones gather rows of ``A`` and ``B`` per observed
        entry (``np.take`` + ``einsum``, chunked).
        """
        out = np.empty(self.nnz) if out is None else out
        if self._blocks is not None:
            Bt = B.T
            for s, e, a, b, flat in self._blocks:
                np.take((A[s:e] @ Bt).ravel(), flat, out=out[a:b], mode="clip")  # (flat is in range)
            return out
        for s in range(0, self.nnz, CHUNK):
            e = min(s + CHUNK, self.nnz)
            np.einsum("ij,ij->i", np.take(A, self.rows[s:e], axis=0), np.take(B, self.indices[s:e], axis=0), out=out[s:e])
        return out

    @cached_property
    def _blocks(self) -> list[tuple[int, int, int, int, np.ndarray]] | None:
        """Row blocks ``(s, e, a, b, flat)`` of the dense-block product (``None`` for sparse patterns):
        rows ``s:e`` hold entries ``a:b``, at offsets ``flat`` of the ``(e - s) x n`` block."""
        m, n = self.shape
        if self.nnz <= DENSE_BLOCKS * m * n:
            return None
        step, blocks = max(1, CHUNK // n), []
        for s in range(0, m, step):
            e = min(s + step, m)
            a, b = int(self.indptr[s]), int(self.indptr[e])
            if a < b:
                blocks.append((s, e, a, b, (self.rows[a:b].astype(np.int64) - s) * n + self.indices[a:b]))
        return blocks


class Residual:
    """The observed residual ``E = P_Omega(M - A B^T)`` in one preallocated vector ``data``, with a CSR
    matrix (``csr``) and its CSC transpose (``csc``) built once on that same vector, so each sweep's
    ``E V`` and ``E^T U`` reuse them instead of rebuilding (and re-validating) a sparse matrix.
    Iterations keep two and swap them when a step is accepted."""

    def __init__(self, pat: Pattern) -> None:
        self.pat = pat
        self.data = np.empty(pat.nnz)
        self.csr = pat.matrix(self.data)
        self.csc = self.csr.T
        if not (np.shares_memory(self.csr.data, self.data) and np.shares_memory(self.csc.data, self.data)):
            raise AssertionError("sparse views must share the residual buffer")  # pragma: no cover

    def update(self, A: np.ndarray, B: np.ndarray) -> "Residual":
        """Set ``data = M_Omega - (A B^T)_Omega`` in place (one pass over ``Omega``)."""
        np.subtract(self.pat.values, self.pat.sampled(A, B, out=self.data), out=self.data)
        return self

    def norm(self) -> float:
        return float(np.sqrt(self.data @ self.data))


def as_pattern(observed: Any, rank: int | None = None) -> Pattern:
    """Validate ``observed`` (a ``scipy.sparse`` matrix, or anything with a ``.matrix`` attribute
    holding one, e.g. :class:`~sparsedp.completion.privacy.PrivateObservations`).

    The *stored* entries are the observations (an explicitly stored 0 is an observed zero).
    Raises :class:`ShapeError` for non-sparse or 2-D-less input, no observations, duplicate
    entries, or ``rank`` outside ``1 <= rank < min(m, n)``; :class:`NonFiniteInputError` for NaN/inf.
    """
    matrix = getattr(observed, "matrix", observed)
    if not sp.issparse(matrix):
        raise ShapeError(f"observed entries must be a scipy.sparse matrix, got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise ShapeError(f"observed must be 2-D, got shape {matrix.shape}")
    m, n = matrix.shape
    if matrix.nnz == 0:
        raise ShapeError("no observed entries")
    if rank is not None:
        if int(rank) != rank or not 1 <= rank < min(m, n):
            raise ShapeError(f"rank must be an integer with 1 <= rank < min(m, n) = {min(m, n)}, got {rank!r}")
    if matrix.format == "csr" and matrix.has_canonical_format:  # sorted, no duplicates: no sort needed
        data = np.asarray(matrix.data, dtype=np.float64)
        if not np.all(np.isfinite(data)):
            raise NonFiniteInputError("observed values must be finite (found NaN or inf)")
        indptr = np.asarray(matrix.indptr, dtype=np.int64)
        rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(indptr))
        return _frozen((m, n), indptr, np.asarray(matrix.indices, dtype=np.int64), rows, data.copy())
    coo = sp.coo_matrix(matrix)
    data = np.asarray(coo.data, dtype=np.float64)
    if not np.all(np.isfinite(data)):
        raise NonFiniteInputError("observed values must be finite (found NaN or inf)")
    order = np.lexsort((coo.col, coo.row))
    rows = np.asarray(coo.row, dtype=np.int64)[order]
    cols = np.asarray(coo.col, dtype=np.int64)[order]
    if rows.size > 1 and np.any((np.diff(rows) == 0) & (np.diff(cols) == 0)):
        raise ShapeError("observed has duplicate entries; sum or drop them first")
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=m), out=indptr[1:])
    return _frozen((m, n), indptr, cols, rows, data[order].copy())


def _frozen(shape: tuple[int, int], indptr: np.ndarray, cols: np.ndarray, rows: np.ndarray, values: np.ndarray) -> Pattern:
    idx = np.int32 if max(shape[0], shape[1], rows.size) < 2**31 - 1 else np.int64
    return Pattern(shape, indptr.astype(idx), cols.astype(idx), rows.astype(idx), values)


def spectral_init(pat: Pattern, k: int, rng: Any = 0, power: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``k`` SVD ``U diag(s) V^T`` of ``P_Omega(M) / p_hat`` by a randomized range finder with
    ``power`` subspace iterations (Halko-Martinsson-Tropp 2011, Alg. 4.4) on the sparse matrix only."""
    gen = as_generator(rng)
    M = pat.matrix(pat.values)
    p_hat = pat.nnz / (pat.shape[0] * pat.shape[1])
    q = min(k + 5, min(pat.shape))
    Q = np.linalg.qr(M @ gen.standard_normal((pat.shape[1], q)))[0]
    for _ in range(power):
        Q = np.linalg.qr(M @ np.linalg.qr(M.T @ Q)[0])[0]
    Bt = M.T @ Q  # n x q, = (Q^T M)^T
    P, s, Gt = np.linalg.svd(Bt, full_matrices=False)
    U = Q @ Gt.T
    return U[:, :k], s[:k] / p_hat, P[:, :k]


def spectral_norm(pat: Pattern, iters: int = 8, rng: Any = 0, values: np.ndarray | None = None) -> float:
    """Estimate ``||P_Omega(M)||_2`` (or of ``values`` on the pattern) by ``iters`` power iterations
    on the sparse matrix (a lower bound that tightens with ``iters``)."""
    M = pat.matrix(pat.values if values is None else values)
    v = as_generator(rng).standard_normal(pat.shape[1])
    s = 0.0
    for _ in range(iters):
        u = M @ v
        v = M.T @ u
        nv = np.linalg.norm(v)
        if nv == 0:
            return 0.0
        s = float(np.sqrt(nv))
        v /= nv
    return s

