"""Exact answer variances for the strategies the optimiser builds at scale: Toeplitz and hybrid.

:func:`sparsedp.range_variance.structured_covariance` returns these for a strategy measured with
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

The prefix workload is ``O(n)``; a list of ranges costs ``O(n)`` per distinct length ``d`` (one
cumulative sum of ``b_k b_{k+d}``) plus ``O(1)`` per range.  A dense query ``q`` has variance
``v ||R^{-T} q||^2`` (one FFT correlation).

**Hybrid** (:mod:`sparsedp.optimize.hybrid`: block forests ``A`` plus ``p`` dense rows on the block
sums).  By Woodbury, ``(M^T M)^{-1} = A^{-1} - H P^T S^{-1} P H^T`` with ``A^{-1}`` block diagonal
(``A_s^{-1} / m_j^2`` on block ``j``), ``H`` the block vectors ``h_s / m_j^2`` and ``S`` ``p x p``
(:class:`~sparsedp.optimize.hybrid.HybridGLS`).  For a range ``[a, e)``:

* the forest part is the range's quadratic form in ``A_s^{-1}`` on the (at most two) partial blocks
  -- read off the 2-D cumulative sums of ``A_s^{-1}`` -- plus ``sigma_s^2 / m_j^2`` for every whole
  block inside, by a cumulative sum over the blocks;
* the correction is ``u^T S^{-1} u`` with ``u = X_e - X_a``, ``X_t = C_{j(t)} + beta_t P_{:, j(t)}``,
  ``C_j = sum_{k<j} P_{:, k} sigma_k^2 / m_k^2`` and ``beta_t`` the partial sum of ``h`` in ``t``'s
  block (``O(p^2)`` per range; the prefix workload uses the ``O(1)`` form of
  :meth:`~sparsedp.optimize.hybrid.HybridGLS.prefix_variances`).

Both are exact in floating point; :func:`~sparsedp.accuracy.expected_error` reports them as
``exact-toeplitz`` and ``exact-hybrid``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from .range_variance import DEFAULT_MEMORY_LIMIT, StructuredCovariance, check_memory

__all__ = ["HybridCovariance", "ToeplitzCovariance", "factored_covariance"]

_ROWS = 1 << 12  # rows of a general sparse workload per batch


def _homoscedastic(v: np.ndarray) -> float | None:
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0 or not float(v.min()) == float(v.max()):
        return None
    return float(v[0])


def factored_covariance(base: Any, v: np.ndarray) -> StructuredCovariance | None:
    """The :class:`ToeplitzCovariance` or :class:`HybridCovariance` of the unweighted strategy
    ``base`` with row variances ``v`` (one value on every row), or ``None``."""
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
        for length in np.unique(d[a > 0]):
            sel = np.flatnonzero((d == length) & (a > 0))
            k = int(length)
            cs = np.cumsum(self.b[: self.n - k] * self.b[k:])  # cs[a - 1] = sum_{k'<a} b_k' b_{k'+d}
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
        self.P = np.asarray(lay.P, dtype=np.float64)  # p x nb
        self.Sinv = gls.Sinv
        self.m2 = gls.m2
        self.sig2 = gls.sig2  # sigma_s^2 / m_j^2 per block
        self.sig_cum = np.concatenate(([0.0], np.cumsum(self.sig2)))
        self.C = np.vstack([np.zeros(self.P.shape[0]), np.cumsum((self.P * self.sig2[None, :]).T, axis=0)])
        # per block size: 2-D cumulative sums of A_s^{-1} (zero first row / column) and of h
        self.Lc: dict[int, np.ndarray] = {}
        self.hc: dict[int, np.ndarray] = {}
        for size, sh in gls.shape.items():
            L = np.zeros((size + 1, size + 1))
            L[1:, 1:] = np.cumsum(np.cumsum(sh.Ainv, axis=0), axis=1)
            self.Lc[size] = L
            self.hc[size] = np.concatenate(([0.0], np.cumsum(sh.h)))

    def _fixed(self) -> float:
        return float(sum(L.size for L in self.Lc.values()) + self.P.size * 2 + 4 * self.nb)

    def memory(self, queries: int) -> float:
        p = self.P.shape[0]
        return 8.0 * (self._fixed() + (12 + 3 * p) * min(queries, 1 << 15) + queries)

    def prefix(self) -> np.ndarray:
        return self.v * self.gls.prefix_variances()

    def _locate(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Block ``j(t)`` and offset ``t - starts[j]`` of positions ``t`` in ``[0, n]`` (``n``: the
        end of the last block)."""
        j = np.minimum(np.searchsorted(self.starts, t, side="right") - 1, self.nb - 1)
        return j, t - self.starts[j]

    def _local(self, j: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """``1_{[lo, hi)}^T A_s^{-1} 1_{[lo, hi)}`` in block ``j`` (local offsets)."""
        out = np.empty(j.size)
        sizes = self.sizes[j]
        for size, L in self.Lc.items():
            sel = sizes == size
            if np.any(sel):
                a, e = lo[sel], hi[sel]
                out[sel] = L[e, e] - 2.0 * L[a, e] + L[a, a]
        return out

    def _beta(self, j: np.ndarray, off: np.ndarray) -> np.ndarray:
        out = np.empty(j.size)
        sizes = self.sizes[j]
        for size, hc in self.hc.items():
            sel = sizes == size
            if np.any(sel):
                out[sel] = hc[off[sel]]
        return out / self.m2[j]

    def _ranges(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        out = np.empty(a.size)
        for start in range(0, a.size, 1 << 15):
            sl = slice(start, min(start + (1 << 15), a.size))
            out[sl] = self._range_batch(a[sl], e[sl])
        return out

    def _range_batch(self, a: np.ndarray, e: np.ndarray) -> np.ndarray:
        ja, oa = self._locate(a)
        je, oe = self._locate(e)
        same = ja == je
        size_a = self.sizes[ja]
        forest = np.where(
            same,
            self._local(ja, oa, np.where(same, oe, size_a)) / self.m2[ja],
            self._local(ja, oa, size_a) / self.m2[ja]
            + (self.sig_cum[je] - self.sig_cum[np.minimum(ja + 1, je)])
            + self._local(je, np.zeros_like(oe), oe) / self.m2[je],
        )
        u = (self.C[je] + self._beta(je, oe)[:, None] * self.P.T[je]) \
            - (self.C[ja] + self._beta(ja, oa)[:, None] * self.P.T[ja])
        corr = np.einsum("ij,ij->i", u @ self.Sinv, u)
        return self.v * (forest - corr)

    def _terms(self, Q: Any) -> tuple[np.ndarray, np.ndarray]:
        """For the rows of ``Q`` (dense ``r x n`` or CSC sparse): the forest forms
        ``sum_j q_j^T A_j^{-1} q_j`` and the vectors ``u = P H^T q`` (``r x p``)."""
        r = Q.shape[0]
        forest = np.zeros(r)
        c = np.zeros((r, self.nb))
        for j in range(self.nb):
            lo, hi = int(self.starts[j]), int(self.starts[j + 1])
            sh = self.gls.block_shape[j]
            Qj = Q[:, lo:hi]
            if sp.issparse(Qj):
                if Qj.nnz == 0:
                    continue
                D = np.asarray(Qj @ sh.Ainv)
                forest += np.asarray(Qj.multiply(D).sum(axis=1)).ravel() / self.m2[j]
                c[:, j] = np.asarray(Qj @ sh.h).ravel() / self.m2[j]
            else:
                forest += np.einsum("ij,ij->i", Qj @ sh.Ainv, Qj) / self.m2[j]
                c[:, j] = (Qj @ sh.h) / self.m2[j]
        return forest, c @ self.P.T

    def functional(self, q: np.ndarray) -> float:
        forest, u = self._terms(np.asarray(q, dtype=np.float64)[None, :])
        return self.v * float(forest[0] - u[0] @ self.Sinv @ u[0])

    def rows(self, W: sp.csr_matrix, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> np.ndarray:
        """Every row of ``W``, in batches of rows (``O(nnz b + r p^2)``, ``b`` the block size)."""
        W = sp.csr_matrix(W, dtype=np.float64)
        bmax = int(self.sizes.max())
        batch = max(1, min(_ROWS, W.shape[0]))
        check_memory(8.0 * (self._fixed() + batch * (bmax + self.nb + self.P.shape[0]) + W.shape[0]),
                     memory_limit, "the per-query variances of this workload")
        out = np.zeros(W.shape[0])
        for start in range(0, W.shape[0], batch):
            blk = W[start: start + batch].tocsc()
            forest, u = self._terms(blk)
            out[start: start + blk.shape[0]] = self.v * (forest - np.einsum("ij,ij->i", u @ self.Sinv, u))
        return out
