"""Hybrid strategies: the lower levels of a weighted interval tree plus ``p`` dense rows on block sums.

The domain ``[0, n)`` is cut into ``nb`` consecutive blocks of ``b`` cells (the last one may be
shorter).  Every block carries the lower levels of a tree (its leaves, then groups of ``radices[0]``,
``radices[1]``, ... up to one node for the whole block), with one weight per level ``R_l`` (leaf
level first) scaled per block by ``c_j``: block ``j``'s rows are ``c_j R_level T_j``.  On top of this
*forest*, ``p`` dense rows ``P`` (``p x nb``) measure the block sums ``B x`` (``B``: ``nb x n``, the
block indicators): the strategy is ``M = [T; P B]`` and replaces the upper tree levels by HDMM's
p-Identity idea (McKenna et al., VLDB 2018, section 5.2) on the block domain.

**Parametrisation.**  As in p-Identity, ``Theta`` (``p x nb``) is free and every column is
normalised: ``delta_j = 1 + sum_i Theta_ij`` (Laplace, with ``sum_l R_l = 1``) or
``sqrt(1 + sum_i Theta_ij^2)`` (Gaussian, ``sum_l R_l^2 = 1``), ``c_j = 1 / delta_j`` and
``P = Theta diag(1 / delta)``.  Then every leaf's column has ``Delta_1 = 1`` (``Delta_2 = 1``) exactly.

**Objective** (per unit noise variance), ``f = tr(G (M^T M)^{-1})``, ``G = W^T W``.  With
``A = T^T T`` (block diagonal: ``A_j = c_j^2 A_s``, ``A_s`` the forest of block shape ``s`` with
weights ``R``) and ``U = B^T P^T`` of rank ``p``, Woodbury gives
``(A + U U^T)^{-1} = A^{-1} - Z S^{-1} Z^T`` with ``Z = A^{-1} U`` and ``S = I_p + U^T Z``.  The block
structure makes everything small: ``A^{-1} B^T`` has column ``j`` equal to ``delta_j^2 h_s`` on block
``j`` (``h_s = A_s^{-1} 1``, ``sigma_s^2 = 1^T h_s``), so

    S = I + Theta Sigma Theta^T,   Sigma = diag(sigma_j^2),
    f = sum_j delta_j^2 e_j - tr(S^{-1} Theta X Theta^T),   X = D K D,  D = diag(delta),

with ``e_j = <G_jj, A_s^{-1}>`` (the forest's error on block ``j`` at unit weights) and
``K = H^T G H`` (``nb x nb``, ``H`` the ``h_s`` on their blocks).  ``e`` and ``K`` are computed once
per weight shape ``R``: for prefix, all-range, identity and total workloads in closed form from a
few moments of each block shape (``O(b^3)`` for the dense ``A_s^{-1}`` of the two shapes, plus
``O(nb^2)``), never touching ``n x n`` or even ``n x nb``; other workloads with ``n <= 8192`` from the
dense ``G``.  One evaluation of ``f`` and of its exact gradient then costs ``O(p nb^2)``:

    df/dTheta = -2 S^{-1} Y + 2 (S^{-1} Y Theta^T) S^{-1} Theta Sigma + col . ddelta/dTheta,
    col_j = df/ddelta_j = 2 delta_j e_j - 2 <(S^{-1} Theta)[:, j], Y[:, j]> / delta_j,   Y = Theta X,

(``ddelta_j / dTheta_ij`` is 1 for Laplace, ``Theta_ij / delta_j`` for Gaussian).  ``R`` itself is
chosen by a derivative-free search over its few level ratios around the inner L-BFGS-B
(:mod:`.hybrid_family`).

**Integer form** (:func:`integer_hybrid`): ``Delta = 2^k`` (``k = 20`` Laplace, 16 Gaussian), shape
``R_int`` integers, block scales ``m_j`` integers and ``P_int`` integers with
``m_j sum R_int + sum_i P_int_ij <= 2^k`` (Laplace) or the squared version; its error is evaluated exactly with the same formula (``delta_j = 2^k / m_j``,
``Theta = P_int diag(1 / m)``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from ..errors import SparseDPError
from ..strategies import TreeLayout
from .calibrate import NoiseModel
from .gram import Gram, GramSum  # GramSum re-exported: it lives in .gram now

__all__ = [
    "HYBRID_DENSE_GRAM_MAX_N",
    "BlockShape",
    "GramSum",
    "HybridLayout",
    "HybridGLS",
    "HybridObjective",
    "block_starts",
    "hybrid_matrix",
    "hybrid_gls",
    "integer_hybrid",
]

#: Workloads without a closed form are handled through the dense ``G`` up to this ``n``.
HYBRID_DENSE_GRAM_MAX_N = 8192
_CLOSED = ("prefix", "all_ranges", "identity", "total")


def block_starts(n: int, b: int) -> np.ndarray:
    """``[0, b, 2b, ..., n]``: block ``j`` is ``[starts[j], starts[j + 1])``."""
    return np.append(np.arange(0, n, b, dtype=np.int64), np.int64(n))


def _local_layout(size: int, radices: tuple[int, ...]) -> TreeLayout:
    """The lower tree of one block: groups of ``radices[l]`` on level ``l``, the last level one root."""
    return TreeLayout.grouped(int(size), lambda level, m: radices[level] if level < len(radices) - 1 else m)


def _row_weights(layout: TreeLayout, R: np.ndarray, p: int) -> np.ndarray:
    """Row weights (root first) of a block's lower tree from the level weights ``R`` (leaf first).
    A block with fewer levels than ``R`` (a short last block) gives its top node the budget of the
    missing levels under Laplace noise (``sum``, an integer for integer ``R``), so every path has the
    full ``sum R``; under Gaussian noise it keeps its own ``R_l`` (a path sum of squares below
    ``sum R^2``: valid, a little budget unused)."""
    L = layout.levels
    w = np.empty(layout.nodes)
    for lev in range(L):
        if lev < L - 1:
            val = R[lev]
        else:
            val = R[lev:].sum() if p == 1 else R[lev]
        off = layout.row_offsets[lev]
        w[off: off + layout.sizes[lev]] = val
    return w


@dataclass(frozen=True)
class BlockShape:
    """One block size's forest at level weights ``R``: ``A_s^{-1}``, ``h = A_s^{-1} 1``,
    ``sigma2 = 1^T h`` and the moments of the closed-form block Grams (see :func:`_moments`)."""

    size: int
    layout: TreeLayout
    weights: np.ndarray  # row weights, root first
    Ainv: np.ndarray
    h: np.ndarray
    sigma2: float
    moments: dict = field(default_factory=dict)

    @staticmethod
    def build(size: int, radices: tuple[int, ...], R: np.ndarray, p: int) -> "BlockShape":
        lay = _local_layout(size, radices)
        w = _row_weights(lay, R, p)
        T = lay.matrix().toarray()
        A = (T * (w * w)[:, None]).T @ T
        c = sla.cho_factor(A, lower=True, check_finite=False)
        Ainv = sla.cho_solve(c, np.eye(size), check_finite=False)
        Ainv = 0.5 * (Ainv + Ainv.T)
        h = Ainv.sum(axis=1)
        return BlockShape(int(size), lay, w, Ainv, h, float(h.sum()), _moments(Ainv, h))


def _moments(Ainv: np.ndarray, h: np.ndarray) -> dict:
    """``<Basis, A^{-1}>`` and ``h^T Basis h`` for the local bases of the closed-form block Grams
    (``J`` ones, ``Mx = max(s, t)``, ``Mn = min(s, t)``, ``MnMx`` their product, ``I``), and
    ``tau = sum_s s h_s``."""
    s = Ainv.shape[0]
    idx = np.arange(s, dtype=np.float64)
    Mx = np.maximum(idx[:, None], idx[None, :])
    Mn = np.minimum(idx[:, None], idx[None, :])
    out = {}
    for name, Bm in (("Mx", Mx), ("Mn", Mn), ("MnMx", Mn * Mx)):
        out["A" + name] = float(np.einsum("ij,ij->", Bm, Ainv))
        out["h" + name] = float(h @ (Bm @ h))
    out["AI"] = float(np.trace(Ainv))
    out["hI"] = float(h @ h)
    out["AJ"] = float(h.sum())
    out["hJ"] = float(h.sum()) ** 2
    out["tau"] = float(idx @ h)
    return out


def _block_terms(kind: str, n: int, start: int) -> list[tuple[float, str]]:
    """``G_jj`` of the block starting at ``start`` as ``sum coef * Basis`` (local indices)."""
    a = float(start)
    if kind == "prefix":  # G_st = n - max(s, t)
        return [(n - a, "J"), (-1.0, "Mx")]
    if kind == "all_ranges":  # G_st = (min + 1)(n - max)
        return [((a + 1.0) * (n - a), "J"), (n - a, "Mn"), (-(a + 1.0), "Mx"), (-1.0, "MnMx")]
    if kind == "identity":
        return [(1.0, "I")]
    if kind == "total":
        return [(1.0, "J")]
    raise ValueError(kind)


@dataclass(frozen=True)
class HybridLayout:
    """A hybrid strategy's structure: ``n``, block size ``b``, the block trees' ``radices``, integer
    level weights ``R`` (leaf first), integer block scales ``m`` and integer dense rows ``P``
    (``p x nb``); the strategy ``[m_j R T_j (block by block); P B]`` has ``Delta <= scale``."""

    n: int
    b: int
    radices: tuple[int, ...]
    R: np.ndarray
    m: np.ndarray
    P: np.ndarray
    scale: float
    p_norm: int

    @property
    def starts(self) -> np.ndarray:
        return block_starts(self.n, self.b)

    def column_sensitivity(self) -> np.ndarray:
        """Per-block column norm (``Delta_1`` or ``Delta_2^2``) of the integer strategy."""
        if self.p_norm == 1:
            return self.m * float(np.sum(self.R)) + np.abs(self.P).sum(axis=0)
        return (self.m ** 2) * float(np.sum(self.R * self.R)) + (self.P * self.P).sum(axis=0)

    def theta_delta(self) -> tuple[np.ndarray, np.ndarray]:
        """The objective's parameters of this matrix scaled by ``1 / scale``: ``delta = scale / m``,
        ``Theta = P diag(1 / m)`` (forest of block ``j`` = ``R / delta_j``)."""
        return self.P / self.m[None, :], self.scale / self.m


class HybridObjective:
    """``Theta (flattened p x nb) -> (f, df/dTheta)`` for a fixed block forest shape (module
    docstring); :meth:`value` evaluates any ``(Theta, delta)``."""

    def __init__(self, gram: Gram, model: NoiseModel, b: int, radices: tuple[int, ...], R: np.ndarray, p: int):
        n = gram.n
        self.n, self.b, self.radices, self.p, self.model = n, int(b), tuple(int(r) for r in radices), int(p), model
        if int(np.prod(self.radices)) != self.b:
            raise SparseDPError(f"the radices {radices} do not multiply to the block size {b}")
        self.R = np.asarray(R, dtype=np.float64)
        if self.R.size != len(self.radices) + 1 or np.any(self.R <= 0):
            raise SparseDPError("R needs one positive weight per level of the block tree")
        self.starts = block_starts(n, self.b)
        self.nb = self.starts.size - 1
        sizes = np.diff(self.starts)
        self.shapes = {int(s): _shape(int(s), self.radices, tuple(self.R), model.p) for s in np.unique(sizes)}
        self.block_shape = [self.shapes[int(s)] for s in sizes]
        self.sig2 = np.array([sh.sigma2 for sh in self.block_shape])
        self.e, self.K = _workload_terms(gram, self.starts, self.block_shape)

    def delta(self, theta: np.ndarray) -> np.ndarray:
        if self.model.p == 1:
            return 1.0 + theta.sum(axis=0)
        return np.sqrt(1.0 + np.einsum("ij,ij->j", theta, theta))

    def _parts(self, theta: np.ndarray, delta: np.ndarray):
        X = delta[:, None] * self.K * delta[None, :]
        Y = theta @ X
        S = (theta * self.sig2[None, :]) @ theta.T
        S[np.diag_indices_from(S)] += 1.0
        Sinv = np.linalg.inv(S)
        Am, Bm = Sinv @ theta, Sinv @ Y
        f = float(np.sum(delta * delta * self.e) - np.einsum("ij,ij->", Am, Y))
        return f, Y, Am, Bm

    def value(self, theta: np.ndarray, delta: np.ndarray) -> float:
        """``f`` for dense rows ``Theta diag(1 / delta)`` and forest scales ``1 / delta``."""
        return self._parts(np.asarray(theta, dtype=np.float64), np.asarray(delta, dtype=np.float64))[0]

    def __call__(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):  # a line-search probe far out: reported as inf
            return self._value_grad(x)

    def _value_grad(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        theta = x.reshape(self.p, self.nb)
        delta = self.delta(theta)
        f, Y, Am, Bm = self._parts(theta, delta)
        grad = -2.0 * Bm + 2.0 * ((Bm @ theta.T) @ Am) * self.sig2[None, :]
        col = 2.0 * delta * self.e - 2.0 * np.einsum("ij,ij->j", Am, Y) / delta
        if self.model.p == 1:
            grad += col[None, :]
        else:
            grad += col[None, :] * theta / delta[None, :]
        return f, grad.ravel()


@functools.lru_cache(maxsize=16)
def _shape(size: int, radices: tuple[int, ...], R: tuple[float, ...], p: int) -> BlockShape:
    return BlockShape.build(size, radices, np.asarray(R, dtype=np.float64), p)


def _workload_terms(gram: Gram, starts: np.ndarray, shapes: list[BlockShape]) -> tuple[np.ndarray, np.ndarray]:
    """``e_j = <G_jj, A_s^{-1}>`` and ``K = H^T G H`` (module docstring)."""
    if gram.parts is not None:  # a weighted sum (GramSum, weighted_union): linear in G, the parts' terms
        terms = [(c, _workload_terms(g, starts, shapes)) for c, g in gram.parts]
        return sum(c * t[0] for c, t in terms), sum(c * t[1] for c, t in terms)
    n, nb = gram.n, starts.size - 1
    kind = gram.kind
    if kind in _CLOSED:
        e = np.empty(nb)
        kd = np.empty(nb)
        for j in range(nb):
            mo = shapes[j].moments
            terms = _block_terms(kind, n, int(starts[j]))
            e[j] = sum(c * mo["A" + name] for c, name in terms)
            kd[j] = sum(c * mo["h" + name] for c, name in terms)
        sig2 = np.array([s.sigma2 for s in shapes])
        tau = np.array([s.moments["tau"] for s in shapes])
        a0 = starts[:-1].astype(np.float64)
        # j < k (cells s in j before t in k): prefix G_st = n - t, all ranges (s + 1)(n - t)
        mu = (n - a0) * sig2 - tau  # sum_t h_t (n - t)
        if kind == "prefix":
            left, right = sig2, mu
        elif kind == "all_ranges":
            left, right = (a0 + 1.0) * sig2 + tau, mu
        elif kind == "total":
            left, right = sig2, sig2
        else:
            left, right = np.zeros(nb), np.zeros(nb)
        K = np.triu(np.outer(left, right), 1)
        K = K + K.T
        K[np.diag_indices(nb)] = kd
        return e, K
    if n > HYBRID_DENSE_GRAM_MAX_N:
        raise SparseDPError(f"hybrid strategies need a prefix, all-range, identity or total workload above "
                            f"n = {HYBRID_DENSE_GRAM_MAX_N}, got kind {kind!r} with n = {n}")
    G = gram.matmat(np.eye(n))
    e = np.empty(nb)
    H = np.zeros((n, nb))
    for j in range(nb):
        lo, hi = int(starts[j]), int(starts[j + 1])
        e[j] = float(np.einsum("ij,ij->", G[lo:hi, lo:hi], shapes[j].Ainv))
        H[lo:hi, j] = shapes[j].h
    K = H.T @ (G @ H)
    return e, 0.5 * (K + K.T)


def integer_hybrid(theta: np.ndarray, delta: np.ndarray, R: np.ndarray, n: int, b: int, radices: tuple[int, ...],
                   model: NoiseModel) -> HybridLayout:
    """Integers for ``(Theta, delta, R)`` with ``Delta <= 2^k`` (``k`` of the noise model: 20 Laplace,
    16 Gaussian, as for the other families, so that ``M x`` stays below ``2^50`` for data totals up
    to ``2^30``): level weights ``R_int = max(1, round(R 2^s))`` (``s = 6`` Laplace, ``4`` Gaussian:
    the shape moves by at most ``2^-(s+1)``, its error is scored on the rounded shape), block scales
    ``m_j = floor(2^k / (delta_j |R_int|))`` (at least 1), and the dense column ``j`` scaled to the
    budget the block tree leaves, ``P_int[:, j] = trunc(Theta_j r_j / |Theta_j|)`` with
    ``r_j = 2^k - m_j |R_int|`` (L1) or ``sqrt(4^k - m_j^2 |R_int|^2)`` (L2); every column's exact
    integer norm is checked (the scale is lowered a little if one does not fit)."""
    bits, shape_bits = (model.bits, 6) if model.p == 1 else (model.bits, 4)
    scale = float(1 << bits)
    R_int = np.maximum(1.0, np.round(np.asarray(R, dtype=np.float64) * (1 << shape_bits)))
    theta = np.maximum(np.asarray(theta, dtype=np.float64), 0.0) if model.p == 1 else np.asarray(theta, float)
    if model.p == 1:
        rnorm, tnorm = float(R_int.sum()), np.abs(theta).sum(axis=0)
    else:
        rnorm, tnorm = float(np.sqrt(np.sum(R_int * R_int))), np.sqrt(np.sum(theta * theta, axis=0))
    for reserve in (1e-9, 1e-6, 1e-3):
        s = scale * (1.0 - reserve)
        m = np.maximum(1.0, np.floor(s / (delta * rnorm)))
        left = s - m * rnorm if model.p == 1 else np.sqrt(np.maximum(s * s - (m * rnorm) ** 2, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(tnorm > 0, np.maximum(left, 0.0) / tnorm, 0.0)
        P = np.trunc(theta * ratio[None, :])
        lay = HybridLayout(int(n), int(b), tuple(radices), R_int, m, P, scale, model.p)
        if float(lay.column_sensitivity().max()) <= (scale if model.p == 1 else scale * scale):
            return lay
    raise SparseDPError("could not round the hybrid strategy to integers")  # pragma: no cover


def _forest_matrix(layout: HybridLayout) -> sp.csr_matrix:
    """The block forests of :func:`hybrid_matrix` (its first rows), block-diagonal."""
    starts = layout.starts
    blocks = []
    for j in range(starts.size - 1):
        size = int(starts[j + 1] - starts[j])
        lay = _local_layout(size, layout.radices)
        w = _row_weights(lay, layout.R, layout.p_norm) * layout.m[j]
        blocks.append(sp.diags(w) @ lay.matrix())
    return sp.block_diag(blocks, format="csr")


def hybrid_matrix(layout: HybridLayout) -> sp.csr_matrix:
    """The explicit integer strategy ``[block forests; P B]`` (rows: block 0's tree root first, ...,
    then the ``p`` dense rows).  ``n (levels + p)`` non-zeros at most."""
    starts = layout.starts
    forest = _forest_matrix(layout)
    sizes = np.diff(starts)
    Pcols = np.repeat(layout.P, sizes, axis=1)
    dense = sp.csr_matrix(Pcols)
    dense.eliminate_zeros()
    return sp.vstack([forest, dense], format="csr")


class HybridGLS:
    """The GLS estimate and the prefix-sum variances of an integer hybrid strategy under iid noise
    of unit variance, in ``O(n b + p nb)`` (``b`` the block size; module docstring).

    With forest rows ``m_j w_s T_s`` on block ``j`` (``A_j = m_j^2 A_s``), ``H~`` the block vectors
    ``h_s / m_j^2`` and ``S = I + P diag(sigma_s^2 / m_j^2) P^T``,
    ``(M^T M)^{-1} = A^{-1} - H~ P^T S^{-1} P H~^T`` (Woodbury), so
    ``x^ = x_A - H~ P^T S^{-1} P B x_A`` with ``x_A = A^{-1} M^T y``."""

    def __init__(self, layout: HybridLayout):
        self.layout = lay = layout
        self.starts = lay.starts
        sizes = np.diff(self.starts)
        self.sizes = sizes
        R = np.asarray(lay.R, dtype=np.float64)
        self.shape = {int(s): _shape(int(s), lay.radices, tuple(R), lay.p_norm) for s in np.unique(sizes)}
        self.block_shape = [self.shape[int(s)] for s in sizes]
        self.row_starts = np.concatenate(([0], np.cumsum([sh.layout.nodes for sh in self.block_shape])))
        m = np.asarray(lay.m, dtype=np.float64)
        self.m2 = m * m
        self.sig2 = np.array([sh.sigma2 for sh in self.block_shape]) / self.m2
        P = np.asarray(lay.P, dtype=np.float64)
        S = (P * self.sig2[None, :]) @ P.T
        S[np.diag_indices_from(S)] += 1.0
        self.Sinv = np.linalg.inv(S)
        self._estimators: dict[int, np.ndarray] = {}

    @property
    def rows(self) -> int:
        return int(self.row_starts[-1]) + self.layout.P.shape[0]

    def _estimator(self, size: int) -> np.ndarray:
        """``A_s^{-1} T_s^T diag(w_s)`` (``size x nodes``): the block forest's own GLS at unit scale."""
        if size not in self._estimators:
            sh = self.shape[size]
            T = sh.layout.matrix().toarray()
            self._estimators[size] = sh.Ainv @ (T.T * sh.weights[None, :])
        return self._estimators[size]

    def _block_expand(self, c: np.ndarray) -> np.ndarray:
        """``H c``: ``c_j h_s`` on block ``j``."""
        out = np.empty(self.layout.n)
        for j, sh in enumerate(self.block_shape):
            out[self.starts[j]: self.starts[j + 1]] = c[j] * sh.h
        return out

    def solve(self, y: np.ndarray) -> np.ndarray:
        """``x^ = (M^T M)^{-1} M^T y`` for measurements ``y`` in the row order of :func:`hybrid_matrix`."""
        y = np.asarray(y, dtype=np.float64)
        lay = self.layout
        m = np.asarray(lay.m, dtype=np.float64)
        nrows = int(self.row_starts[-1])
        yF, yP = y[:nrows], y[nrows:]
        x = np.empty(lay.n)
        for size in self.shape:
            blocks = np.flatnonzero(self.sizes == size)
            nodes = self.shape[size].layout.nodes
            idx = self.row_starts[blocks][None, :] + np.arange(nodes)[:, None]
            X = self._estimator(size) @ yF[idx]  # size x blocks
            x[(self.starts[blocks][None, :] + np.arange(size)[:, None]).ravel(order="F")] = (X / m[blocks][None, :]).ravel(order="F")
        c = (lay.P.T @ yP) / self.m2  # A^{-1} B^T P^T y_P = H (P^T y_P / m^2)
        x += self._block_expand(c)
        d = lay.P @ np.add.reduceat(x, self.starts[:-1])  # Z^T r = U^T A^{-1} r = P B x_A
        corr = lay.P.T @ (self.Sinv @ d)
        return x - self._block_expand(corr / self.m2)

    def prefix_variances(self) -> np.ndarray:
        """``diag(W (M^T M)^{-1} W^T)`` for the prefix workload (``W_ts = 1`` for ``s <= t``)."""
        lay = self.layout
        P = np.asarray(lay.P, dtype=np.float64)
        out = np.empty(lay.n)
        before = np.concatenate(([0.0], np.cumsum(self.sig2)))[:-1]  # forest variance of the earlier blocks
        Cq = np.vstack([np.zeros(P.shape[0]), np.cumsum((P * self.sig2[None, :]).T, axis=0)[:-1]])  # nb x p
        SC = Cq @ self.Sinv
        cc = np.einsum("ij,ij->i", SC, Cq)
        cp = np.einsum("ij,ji->i", SC, P)
        pp = np.einsum("ij,ij->j", P, self.Sinv @ P)
        local = {}
        for size, sh in self.shape.items():
            Lc = np.cumsum(np.cumsum(sh.Ainv, axis=0), axis=1)
            local[size] = (np.diag(Lc).copy(), np.cumsum(sh.h))
        for j, sh in enumerate(self.block_shape):
            vloc, hcum = local[sh.size]
            beta = hcum / self.m2[j]
            lo, hi = self.starts[j], self.starts[j + 1]
            out[lo:hi] = before[j] + vloc / self.m2[j] - (cc[j] + 2.0 * beta * cp[j] + beta * beta * pp[j])
        return out


def _matches(matrix: sp.csr_matrix, layout: HybridLayout, forest_rows: int) -> bool:
    """Whether ``matrix`` is exactly :func:`hybrid_matrix` of ``layout``: the forest rows compared
    as sparse matrices, each dense row against ``P_i`` repeated over the blocks (``O(nnz)`` time,
    one dense row of memory at a time: the ``p n`` dense entries are never built twice)."""
    lay = layout
    P = np.asarray(lay.P, dtype=np.float64)
    if matrix.shape != (forest_rows + P.shape[0], lay.n):
        return False
    A = sp.csr_matrix(matrix)
    if (A[:forest_rows] != _forest_matrix(lay)).nnz:
        return False
    sizes = np.diff(lay.starts)
    for i in range(P.shape[0]):
        if not np.array_equal(A[forest_rows + i].toarray().ravel(), np.repeat(P[i], sizes)):
            return False
    return True


def hybrid_gls(op: Any) -> "HybridGLS | None":
    """The :class:`HybridGLS` of a strategy operator that the hybrid family built (its
    :class:`HybridLayout` in ``meta["hybrid"]``), or ``None``.  The layout is checked against the
    operator's own matrix (never trusted from the tag alone: a wrong layout would give wrong
    estimates and variances), once per operator; the solver is kept on the operator."""
    got = getattr(op, "_hybrid_gls", False)
    if got is not False:
        return got
    lay = getattr(op, "meta", {}).get("hybrid") if isinstance(getattr(op, "meta", None), dict) else None
    solver = None
    matrix = getattr(op, "matrix", None)
    if isinstance(lay, HybridLayout) and sp.issparse(matrix) and getattr(op, "base", None) is None:
        cand = HybridGLS(lay)
        if _matches(matrix, lay, int(cand.row_starts[-1])):
            solver = cand
    try:
        op._hybrid_gls = solver
    except AttributeError:  # pragma: no cover - operators take attributes
        pass
    return solver
