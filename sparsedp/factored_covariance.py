"""Exact answer variances for the strategies the optimiser builds at scale: Toeplitz and hybrid.

:func:`structured_covariance` (below) returns these for a strategy measured with
one noise variance ``v`` on every row (what the mechanism draws for both), so that the error report
of a release at ``n = 2^20`` is exact and takes seconds, never a stochastic estimate.

**Toeplitz** (:class:`~sparsedp.optimize.toeplitz_strategy.ToeplitzStrategy`, lower-triangular with
first column ``m``).  The estimate is ``x_hat = R^{-1} y``; ``R^{-1}`` is lower-triangular Toeplitz
with first column ``h = 1 / m(x)`` (the series inverse), so the prefix estimates ``P_t = sum_{s<t}
x_hat_s`` are ``B y`` with ``B`` lower-triangular Toeplitz of first column ``b = cumsum(h)``:

    Var(P_t) = v sum_{k<t} b_k^2,
    Cov(P_a, P_e) = v sum_{k<a} b_k b_{k+e-a}        (a <= e),

and a range ``[a, e)`` is ``P_e - P_a`` (the difference of two rows of ``B``):

    Var = v (c_{e} + c_{a} - 2 sum_{k<a} b_k b_{k+d}),   c_t = sum_{k<t} b_k^2,  d = e - a.

The prefix workload is ``O(n)``; for a list of ranges, the ranges of one length ``d`` share one
cumulative sum of ``b_k b_{k+d}`` (``O(n)``, then ``O(1)`` per range: sliding windows of a few
lengths cost ``O(n)`` in all), or, when they are few, each takes one dot product of length ``a``
-- whichever is cheaper, so a report costs at most ``O(min(n L, sum_q a_q))`` for ``L`` distinct
lengths (1.2 s for 10,000 random ranges at ``n = 2^20``, 0.2 s for its 2 million windows of 7 and 30
cells).  A dense query ``q`` has variance
``v ||R^{-T} q||^2`` (one FFT correlation).

**Hybrid** (:mod:`sparsedp.optimize.hybrid`: block forests ``A`` plus ``p`` dense rows on the block
sums ``s``; :class:`~sparsedp.optimize.hybrid.HybridGLS`).  Woodbury's form ``A^{-1} - H P^T S^{-1}
P H^T`` subtracts two large terms when a block's forest is weak and the dense rows pin its sum (an
optimised block scale ``m_j = 1`` next to dense weights ``~2^20``: ``1e-8`` relative error).  So the
variance is split by the law of total variance over the block sums instead, with no such
subtraction.  Given the sums, the blocks are independent and block ``j``'s cells have covariance
``(A_s^{-1} - h h^T / sigma_s^2) / m_j^2`` (``h = A_s^{-1} 1``, ``sigma_s^2 = 1^T h``); the
estimate of the sums has covariance ``(Sigma^{-1} + P^T P)^{-1} = F^T F`` with ``Sigma =
diag(sigma_s^2 / m_j^2)`` and ``F = R^{-T} Sigma^{1/2}``, ``R^T R = I + Sigma^{1/2} P^T P
Sigma^{1/2}`` (``R`` from a QR factorisation of ``[P Sigma^{1/2}; I]``, which never forms the sum:
its large entries would swamp the identity).  A query ``q`` has

    Var = sum_j (q_j^T A_s^{-1} q_j - (q_j^T h)^2 / sigma_s^2) / m_j^2  +  ||F c||^2,
    c_j = q_j^T h / sigma_s^2,

and for a range ``[a, e)`` only the (at most two) partial blocks have a within term (read off the
2-D cumulative sums of ``A_s^{-1}``), ``c`` is 1 on the whole blocks inside, and ``F c`` is a
difference of cumulative sums of ``F``'s columns plus the two partial columns: ``O(nb)`` per range
(``nb`` blocks, at most 1024).

**Diagonal plus rows** (p-Identity ``M = [diag(a); B]``, :mod:`sparsedp.woodbury`; any per-row
variances ``v = (v_1, v_2)``).  ``Cov(x_hat) = E^{-1} - E^{-1} B^T K^{-1} B E^{-1}`` with
``E^{-1} = diag(v_1 / a^2)`` and ``K = V_2 + B E^{-1} B^T = L L^T``.  With ``Z = L^{-1} [0, cumsum
of the columns of B E^{-1}]`` (``p x (n + 1)``), a range ``[a, e)`` has variance

    sum_{a <= s < e} v_{1,s} / a_s^2  -  ||Z_{:, e} - Z_{:, a}||^2,

``O(p)`` per range after an ``O(p n + p^3)`` setup (``O(p^2 n)`` for the triangular solve).

**Kronecker** (``W = W_1 (x) ... (x) W_k`` answered by ``M = A_1 (x) ... (x) A_k`` with one noise
variance ``v``): ``(M^T M)^{-1} = (x)_i (A_i^T A_i)^{-1}``, so the answer of query row
``(r_1, ..., r_k)`` has variance ``v prod_i d_i[r_i]`` with ``d_i`` the per-answer variances of
``W_i`` on ``A_i`` at unit noise (each factor by the exact paths here, on its own small domain),
and the total is ``v prod_i sum(d_i)`` (:func:`kron_variances`).

All are exact in floating point; :func:`~sparsedp.accuracy.expected_error` reports them as
``exact-toeplitz``, ``exact-hybrid``, ``exact-woodbury`` and ``exact-kron``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

import scipy.linalg as sla

from .operators import Operator, SparseOperator
from .range_variance import (
    DEFAULT_MEMORY_LIMIT,
    FenwickCovariance,
    HaarCovariance,
    IdentityCovariance,
    StructuredCovariance,
    TreeCovariance,
    check_memory,
)
from .woodbury import diagonal_plus_rows

__all__ = ["HybridCovariance", "ToeplitzCovariance", "WoodburyCovariance", "factored_covariance",
           "structured_covariance"]

_ROWS = 1 << 12  # rows of a general sparse workload per batch
_RANGE_BATCH = 1 << 13  # ranges per batch of the hybrid path (nb words each)


def _homoscedastic(v: np.ndarray) -> float | None:
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0 or not float(v.min()) == float(v.max()):
        return None
    return float(v[0])


def factored_covariance(base: Any, v: np.ndarray) -> StructuredCovariance | None:
    """The :class:`WoodburyCovariance` (any row variances ``v``), :class:`ToeplitzCovariance` or
    :class:`HybridCovariance` (one value on every row) of the unweighted strategy ``base``, or
    ``None``."""
    form = diagonal_plus_rows(base)
    if form is not None:
        return WoodburyCovariance.build(*form, np.asarray(v, dtype=np.float64))
    var = _homoscedastic(v)
    if var is None:
        return None
    if base.structure == "toeplitz" and callable(getattr(base, "inverse_column", None)) \
            and base.shape[0] == base.shape[1]:
        return ToeplitzCovariance(np.asarray(base.inverse_column(), dtype=np.float64), var)
    if getattr(base, "meta", None) and isinstance(base.meta, dict) and "hybrid" in base.meta:
        from .optimize.hybrid import hybrid_gls

        gls = hybrid_gls(base)
        if gls is not None:
            return HybridCovariance(gls, var)
    return None


class ToeplitzCovariance(StructuredCovariance):
    """``Var`` of the answers of a lower-triangular Toeplitz strategy whose inverse has first column
    ``h``, under noise variance ``v`` on every row (module docstring)."""

    kind = "toeplitz"

    def __init__(self, h: np.ndarray, v: float):
        self.n = int(h.size)
        self.h = h
        self.v = float(v)
        self.b = np.cumsum(h)
        self.c = np.concatenate(([0.0], np.cumsum(self.b * self.b)))  # c_t = sum_{k<t} b_k^2

    def _fixed(self) -> float:
        return 4.0 * self.n

    def prefix(self) -> np.ndarray:
        return self.v * self.c[1:]

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        d = e - a
        cross = np.zeros(a.size)
        inner = a > 0
        lengths, inverse = np.unique(d[inner], return_inverse=True)
        where = np.flatnonzero(inner)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(lengths.size + 1))
        for g, length in enumerate(lengths):
            sel = where[order[bounds[g]: bounds[g + 1]]]
            k = int(length)
            if float(a[sel].sum()) < self.n - k:  # few ranges of this length: one dot product each
                for i in sel:
                    cross[i] = float(self.b[: a[i]] @ self.b[k: k + a[i]])
            else:  # cs[a - 1] = sum_{k' < a} b_k' b_{k' + d}, for every range of this length at once
                cs = np.cumsum(self.b[: self.n - k] * self.b[k:])
                cross[sel] = cs[a[sel] - 1]
        return self.v * (self.c[e] + self.c[a] - 2.0 * cross)

    def memory(self, queries: int) -> float:
        return 8.0 * (self._fixed() + 4 * queries)

    def _adjoint(self, q: np.ndarray) -> np.ndarray:
        """``R^{-T} q``: the noise coefficients of the answer ``q^T x_hat``."""
        from .optimize.toeplitz_strategy import fftconvolve

        return fftconvolve(np.asarray(q, dtype=np.float64)[::-1], self.h)[: self.n][::-1]

    def functional(self, q: np.ndarray) -> float:
        c = self._adjoint(q)
        return self.v * float(c @ c)

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of ``W``: ``v ||R^{-T} w||^2`` over the row's support (``O(n log n)`` each)."""
        W = sp.csr_matrix(W, dtype=np.float64)
        check_memory(8.0 * (self._fixed() + 4 * self.n + W.shape[0]), memory_limit,
                     "the per-query variances of this workload")
        out = np.zeros(W.shape[0])
        for i in range(W.shape[0]):
            lo, hi = W.indptr[i], W.indptr[i + 1]
            if hi == lo:
                continue
            top = int(W.indices[lo:hi].max()) + 1  # R^{-T} w vanishes above the row's last column
            q = np.zeros(top)
            np.add.at(q, W.indices[lo:hi], W.data[lo:hi])
            from .optimize.toeplitz_strategy import fftconvolve

            c = fftconvolve(q[::-1], self.h[:top])[:top]
            out[i] = self.v * float(c @ c)
        return out


class HybridCovariance(StructuredCovariance):
    """``Var`` of the answers of a hybrid strategy (:class:`~sparsedp.optimize.hybrid.HybridGLS`)
    under noise variance ``v`` on every row (module docstring)."""

    kind = "hybrid"

    def __init__(self, gls: Any, v: float):
        self.gls = gls
        self.v = float(v)
        lay = gls.layout
        self.n = int(lay.n)
        self.starts = gls.starts
        self.sizes = gls.sizes
        self.nb = int(self.sizes.size)
        self.m2 = gls.m2
        P = np.asarray(lay.P, dtype=np.float64)  # p x nb
        root = np.sqrt(gls.sig2)  # Sigma^{1/2}: the forest's sd of each block sum
        # R^T R = I + G^T G (G = P Sigma^{1/2}) by a QR of [G; I], not a Cholesky factor of the sum:
        # a dense row pinning weak blocks puts ~1e10 next to 1 there, and forming G^T G loses the 1
        R = np.linalg.qr(np.vstack([P * root[None, :], np.eye(self.nb)]), mode="r")
        F = sla.solve_triangular(R, np.diag(root), trans="T", check_finite=False)  # Cov(s) = F^T F
        self.FT = np.ascontiguousarray(F.T)  # row j: F e_j
        self.FcT = np.zeros((self.nb + 1, self.nb))  # row k: sum_{j<k} F e_j
        np.cumsum(self.FT, axis=0, out=self.FcT[1:])
        # per block size: 2-D cumulative sums of A_s^{-1} (zero first row / column), of h, and sigma_s^2
        self.Lc: dict[int, np.ndarray] = {}
        self.hc: dict[int, np.ndarray] = {}
        self.s2: dict[int, float] = {}
        for size, sh in gls.shape.items():
            Lc = np.zeros((size + 1, size + 1))
            Lc[1:, 1:] = np.cumsum(np.cumsum(sh.Ainv, axis=0), axis=1)
            self.Lc[size] = Lc
            self.hc[size] = np.concatenate(([0.0], np.cumsum(sh.h)))
            self.s2[size] = float(sh.sigma2)

    def _fixed(self) -> float:
        return float(sum(L.size for L in self.Lc.values()) + 3 * self.nb * (self.nb + 1))

    def memory(self, queries: int) -> float:
        return 8.0 * (self._fixed() + (12 + 4 * self.nb) * min(queries, _RANGE_BATCH) + queries)

    def _locate(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block ``j(t)`` and offset ``t - starts[j]`` of positions ``t`` in ``[0, n]`` (``n``: the
        end of the last block)."""
        j = np.minimum(np.searchsorted(self.starts, t, side="right") - 1, self.nb - 1)
        return j, t - self.starts[j]

    def _partial(self, j: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the cells ``[lo, hi)`` of block ``j`` (local offsets): their variance given the
        block's sum, ``(q^T A_s^{-1} q - (q^T h)^2 / sigma_s^2) / m_j^2``, and their share
        ``g = q^T h / sigma_s^2`` of the block sum's estimate."""
        within = np.empty(j.size)
        g = np.empty(j.size)
        sizes = self.sizes[j]
        for size, Lc in self.Lc.items():
            sel = sizes == size
            if np.any(sel):
                a, e = lo[sel], hi[sel]
                hq = self.hc[size][e] - self.hc[size][a]
                within[sel] = Lc[e, e] - 2.0 * Lc[a, e] + Lc[a, a] - hq * hq / self.s2[size]
                g[sel] = hq / self.s2[size]
        return np.maximum(within, 0.0) / self.m2[j], g

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        out = np.empty(a.size)
        for start in range(0, a.size, _RANGE_BATCH):
            sl = slice(start, min(start + _RANGE_BATCH, a.size))
            out[sl] = self._range_batch(a[sl], e[sl])
        return out

    def prefix(self) -> np.ndarray:
        """``Var(P(t))``, ``t = 1 .. n``, in ``O(1)`` each: ``F c = F_{<j} + g F_j`` for ``t`` in
        block ``j``, so ``||F c||^2 = A_j + 2 g B_j + g^2 C_j`` from three numbers per block (an
        answer where these terms cancel to below ``1e-3`` of their size is recomputed directly)."""
        t = np.arange(1, self.n + 1, dtype=np.int64)
        j, off = self._locate(t)
        within, g = self._partial(j, np.zeros_like(off), off)
        A = np.einsum("ij,ij->i", self.FcT[:-1], self.FcT[:-1])
        B = np.einsum("ij,ij->i", self.FcT[:-1], self.FT)
        C = np.einsum("ij,ij->i", self.FT, self.FT)
        size = A[j] + g * g * C[j]
        out = within + size + 2.0 * g * B[j]
        redo = np.flatnonzero(out - within < 1e-3 * size)
        if redo.size:
            out[redo] = self._ranges(np.zeros(redo.size, dtype=np.int64), t[redo]) / self.v
        return self.v * out

    def _range_batch(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        ja, oa = self._locate(a)
        je, oe = self._locate(e)
        same = ja == je
        wa, ga = self._partial(ja, oa, np.where(same, oe, self.sizes[ja]))
        we, ge = self._partial(je, np.zeros_like(oe), oe)
        we, ge = np.where(same, 0.0, we), np.where(same, 0.0, ge)
        # F c: the whole blocks strictly between (none when same), the partial end blocks
        z = self.FcT[je] - self.FcT[np.minimum(ja + 1, je)]
        z += ga[:, None] * self.FT[ja] + ge[:, None] * self.FT[je]
        return self.v * (wa + we + np.einsum("ij,ij->i", z, z))

    def _terms(self, Q: Any) -> tuple[np.ndarray, np.ndarray]:
        """For the rows of ``Q`` (dense ``r x n`` or CSC sparse): the variance given the block sums
        and the vectors ``F c`` (``r x nb``, ``c_j = q_j^T h / sigma_s^2``)."""
        r = Q.shape[0]
        within = np.zeros(r)
        c = np.zeros((r, self.nb))
        for j in range(self.nb):
            lo, hi = int(self.starts[j]), int(self.starts[j + 1])
            sh = self.gls.block_shape[j]
            Qj = Q[:, lo:hi]
            if sp.issparse(Qj):
                if Qj.nnz == 0:
                    continue
                quad = np.asarray(Qj.multiply(np.asarray(Qj @ sh.Ainv)).sum(axis=1)).ravel()
                hq = np.asarray(Qj @ sh.h).ravel()
            else:
                quad = np.einsum("ij,ij->i", Qj @ sh.Ainv, Qj)
                hq = Qj @ sh.h
            within += np.maximum(quad - hq * hq / sh.sigma2, 0.0) / self.m2[j]
            c[:, j] = hq / sh.sigma2
        return within, c @ self.FT

    def functional(self, q: np.ndarray) -> float:
        within, z = self._terms(np.asarray(q, dtype=np.float64)[None, :])
        return self.v * float(within[0] + z[0] @ z[0])

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of ``W``, in batches of rows (``O(nnz b + r nb^2)``, ``b`` the block size)."""
        W = sp.csr_matrix(W, dtype=np.float64)
        bmax = int(self.sizes.max())
        batch = max(1, min(_ROWS, W.shape[0]))
        check_memory(8.0 * (self._fixed() + batch * (bmax + 2 * self.nb) + W.shape[0]),
                     memory_limit, "the per-query variances of this workload")
        out = np.zeros(W.shape[0])
        for start in range(0, W.shape[0], batch):
            blk = W[start: start + batch].tocsc()
            within, z = self._terms(blk)
            out[start: start + blk.shape[0]] = self.v * (within + np.einsum("ij,ij->i", z, z))
        return out


class WoodburyCovariance(StructuredCovariance):
    """``Var`` of the GLS answers of ``M = [diag(a); B]`` under row variances ``v`` (module
    docstring): the estimator of :func:`sparsedp.woodbury.woodbury_solver`."""

    kind = "woodbury"

    def __init__(self, e_inv: np.ndarray, BE: np.ndarray, chol: np.ndarray):
        self.n = int(e_inv.size)
        self.e_inv = e_inv  # v_1 / a^2
        self.d = np.concatenate(([0.0], np.cumsum(e_inv)))
        self.BE = BE  # B E^{-1}, p x n (dense)
        self.L = chol  # lower Cholesky factor of K
        cum = np.zeros((BE.shape[0], self.n + 1))
        np.cumsum(BE, axis=1, out=cum[:, 1:])
        self.Z = sla.solve_triangular(chol, cum, lower=True, check_finite=False)  # p x (n + 1)
        self.ZT = np.ascontiguousarray(self.Z.T)

    @staticmethod
    def build(a: np.ndarray, B: sp.csr_matrix, v: np.ndarray) -> "WoodburyCovariance | None":
        """From the form ``(a, B)`` of :func:`~sparsedp.woodbury.diagonal_plus_rows`; ``None`` when
        ``K`` is not numerically positive definite (the solver then does not use Woodbury either)."""
        n = a.size
        v1, v2 = v[:n], v[n:]
        e_inv = v1 / (a * a)
        BE = np.asarray(B.toarray() if sp.issparse(B) else B, dtype=np.float64) * e_inv[None, :]
        K = BE @ np.asarray(B.toarray() if sp.issparse(B) else B, dtype=np.float64).T
        K[np.diag_indices_from(K)] += v2
        try:
            L = np.linalg.cholesky(0.5 * (K + K.T))
        except np.linalg.LinAlgError:
            return None
        return WoodburyCovariance(e_inv, BE, L)

    def _fixed(self) -> float:
        return float(3 * self.Z.size + 2 * self.n)

    def memory(self, queries: int) -> float:
        return 8.0 * (self._fixed() + (3 * self.Z.shape[0] + 4) * min(queries, 1 << 14) + queries)

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        out = self.d[e] - self.d[a]
        for start in range(0, a.size, 1 << 14):
            sl = slice(start, min(start + (1 << 14), a.size))
            U = self.ZT[e[sl]] - self.ZT[a[sl]]
            out[sl] -= np.einsum("ij,ij->i", U, U)
        return out

    def prefix(self) -> np.ndarray:
        Z = self.ZT[1:] - self.ZT[0]
        return self.d[1:] - np.einsum("ij,ij->i", Z, Z)

    def functional(self, q: np.ndarray) -> float:
        q = np.asarray(q, dtype=np.float64)
        z = sla.solve_triangular(self.L, self.BE @ q, lower=True, check_finite=False)
        return float(q @ (self.e_inv * q) - z @ z)

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of ``W`` (``O(nnz p + r p^2)``)."""
        W = sp.csr_matrix(W, dtype=np.float64)
        p = self.BE.shape[0]
        check_memory(8.0 * (self._fixed() + 3 * p * min(W.shape[0], _ROWS) + W.shape[0]), memory_limit,
                     "the per-query variances of this workload")
        W2 = W.multiply(W)
        out = np.asarray(W2 @ self.e_inv).ravel()
        BEt = np.ascontiguousarray(self.BE.T)
        for start in range(0, W.shape[0], _ROWS):
            blk = W[start: start + _ROWS]
            U = np.asarray(blk @ BEt)  # r x p
            Z = sla.solve_triangular(self.L, U.T, lower=True, check_finite=False)
            out[start: start + blk.shape[0]] -= np.einsum("ij,ij->j", Z, Z)
        return out


# -- dispatch ------------------------------------------------------------------------------------


def structured_covariance(M: Operator, variances: np.ndarray) -> StructuredCovariance | None:
    """The exact covariance of the estimator :mod:`sparsedp.inference` uses for ``M`` (identity,
    Fenwick, Haar, tree, and their weighted forms ``diag(w) B`` with variances ``v / w^2``; the
    optimiser's Toeplitz and hybrid strategies under one noise variance on every row and
    ``[diag(a); B]`` under any, :mod:`sparsedp.factored_covariance`), or ``None`` for other
    strategies."""
    from .inference import _unweight, tree_layout  # the estimator's own reductions

    base, _, v = _unweight(M, np.zeros(M.shape[0]), np.asarray(variances, dtype=np.float64))
    layout = tree_layout(base)
    if layout is not None:
        return TreeCovariance(layout, v)
    factored = factored_covariance(base, v)
    if factored is not None:
        return factored
    if not isinstance(base, SparseOperator):
        return None
    m, n = base.shape
    if base.structure == "identity" and m == n:
        return IdentityCovariance(n, v)
    if base.structure == "fenwick" and m == n:
        return FenwickCovariance(n, v)
    if base.structure == "haar" and m == n:
        cov = HaarCovariance.build(base, v)
        if cov is not None:
            cov.M = base
        return cov
    return None
