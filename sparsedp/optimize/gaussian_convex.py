"""The optimum of the factorization mechanism under Gaussian noise, with a certified gap (issue 29).

Under Gaussian noise (``Delta_2``, zCDP) a strategy ``M`` enters the GLS error only through
``X = M^T M`` and its column norms ``sqrt(diag X)``: normalised to ``Delta_2 = 1`` (``diag X <=
1``), its error at ``rho = 1`` is ``sigma^2 tr(G X^-1)`` with ``G = W^T W`` and ``sigma^2 = 1/2``
(:mod:`~sparsedp.optimize.calibrate`).  The best strategy of the whole class solves the convex
problem (Yuan et al., KDD 2016; Li, Miklau et al.)

    minimise tr(G X^-1)  subject to  diag(X) <= 1,  X positive definite.

**Dual.**  For a diagonal ``L > 0`` the Lagrangian ``tr(G X^-1) + sum_i L_i (X_ii - 1)`` is
minimised by ``X(L) = L^-1/2 S L^-1/2`` with ``S = H^1/2``, ``H = L^1/2 G L^1/2`` (substitute
``Y = L^1/2 X L^1/2``: ``tr(H Y^-1) + tr(Y) >= 2 tr(H^1/2)``), so for *every* ``L > 0``

    g(L) = 2 tr((L^1/2 G L^1/2)^1/2) - sum(L)  <=  tr(G X^-1)  for every feasible X

(weak duality; a rank-deficient strategy that answers the workload is the limit of feasible full
rank ones, so the bound holds for it too).  ``g(c L) = 2 sqrt(c) tr S - c sum L`` is maximised over
the scale ``c`` in closed form, ``(tr S)^2 / sum L``: that is the bound reported at each ``L``.
The gradient of ``g`` is ``diag X(L) - 1``; the optimum has ``diag X = 1``.

**Solver.**  The multiplicative fixed point ``L <- L diag(X(L))^alpha`` (``alpha = 2``: ``X(L)``
scales as ``L^-1/2``, so the update is invariant to the scale of ``L`` and drives ``diag X`` to 1),
one eigendecomposition ``H = U diag(lambda) U^T`` per step, started at ``L = diag(G)`` (or a given
``L0``: warm start).  If a step lowers the dual, ``alpha`` is damped toward 1.  Every step also
gives *feasible* primal points: ``X(L)`` with its columns scaled, ``X' = D_f^-1/2 X(L) D_f^-1/2``
with ``f >= diag X(L)``, whose error is ``tr(G X'^-1) = e^T (H o S^-1) e`` (``e = sqrt(f)``; ``o``
the entrywise product), evaluated in the eigenbasis as ``sum_jk lambda_j R_jk^2 / s_k`` with
``R = U^T D_e U`` (one symmetric rank-k product).  Unit columns (``f = diag X(L)``) are best near
the optimum; a partly uniform ``f = max(diag X(L), c)`` is far better while ``L`` is rough on a
rank-deficient ``G`` (column scaling moves the range of a nearly singular ``X(L)``).  The search
stops when ``primal / dual <= 1 + tol``, after ``max_iter`` steps, or before a step would overrun
the deadline; unless converged, the last step's scaling ``e`` is then optimised exactly, a convex
quadratic programme with bounds (:func:`_polish`).  Measured from ``L = diag(G)``: prefix, all
ranges, weighted unions and 2-D ranges reach a gap of ``1.002`` at the second step and ``1.00001``
after ~5-20; rank-deficient workloads (``n`` random ranges) need ~5 steps for ``1.01``.

**Identical cells.**  Cells whose columns of ``W`` are identical (identical rows of ``G``, e.g.
cells between two consecutive range end points) are merged first (:func:`cell_atoms`): with ``P``
the cell-to-atom indicator, ``W = W_r P`` and the dual of the reduced problem on ``G_r = W_r^T W_r``
at ``Lambda_b = sum_{i in b} L_i`` *equals* the full dual at ``L`` (the non-zero spectrum of
``L^1/2 P^T G_r P L^1/2`` is that of ``Lambda^1/2 G_r Lambda^1/2``), so the bound is the same; the
reduced strategy ``M_r`` is lifted to ``[sqrt(1 - eta^2) M_r P; eta C; I_zero]`` with ``C`` the
differences of consecutive cells within each atom (rows orthogonal to ``P``'s, entries
``+-1/sqrt 2``) and identity rows on the cells no query touches: square, full rank, columns of norm
at most 1, and the GLS error is exactly ``tr(G_r X_r^-1) / (1 - eta^2)`` (``eta^2 = 1e-6``).

**Certification.**  The dual value is a valid lower bound at any iterate.  Floating point is
accounted for: the computed eigenvalues ``lambda_hat`` of the formed ``H`` are exact for a
perturbation of norm at most ``delta = 8 n eps lambda_max`` (LAPACK's backward error, plus the
rounding of ``H``'s entries), so ``tr H^1/2 >= sum_i sqrt(max(lambda_hat_i - delta, 0))``.  A
small ridge ``tau I`` keeps ``H`` positive definite for rank-deficient workloads (and the strategy
full rank); the bound for ``G`` itself then uses Rotfel'd's inequality, ``tr((A + B)^1/2) <= tr A^1/2
+ tr B^1/2``: ``tr (L^1/2 G L^1/2)^1/2 >= tr S_tau - sqrt(tau) sum_i sqrt(L_i)``.

**Strategy.**  ``M = S^1/2 diag(1 / (q e))`` (``q = sqrt(L)``) has ``M^T M = X'`` and unit columns;
:func:`integer_strategy` scales it to ``Delta_2 = 2^16`` and rounds every entry to an integer
(to nearest; a column whose squared norm would exceed ``4^16`` is truncated instead), so the
exact-noise mechanism measures ``M x`` without rounding and the sensitivity is exact.

Dense: ``O(n^2)`` memory (a few ``n x n`` arrays) and ``O(n^3)`` per step, for ``n <= 4096``
(:data:`GAUSSIAN_MAX_N`; one step ~11 s at 4096 with one BLAS thread, 0.2 s at 1024).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla
from scipy.linalg.blas import dsyrk

from ..errors import ShapeError, SparseDPError
from ..operators import Operator, SparseOperator
from .calibrate import NoiseModel, unit_variance
from .candidate import Candidate
from .gram import Gram
from .search import Deadline, lbfgs

__all__ = [
    "GAUSSIAN_MAX_N",
    "GaussianCandidate",
    "GaussianSolution",
    "cell_atoms",
    "dense_gram",
    "dense_score",
    "dual_start",
    "gaussian_candidates",
    "integer_strategy",
    "solve_gaussian",
]

#: Largest ``n`` of the dense solver (a step is one ``n x n`` eigendecomposition).
GAUSSIAN_MAX_N = 4096

#: Ridge ``tau = GAUSSIAN_RIDGE * tr(G) / n`` added to ``G`` inside the solver (see module doc).
GAUSSIAN_RIDGE = 1e-10

#: Seconds :func:`sparsedp.optimize.bounds.lower_bound` gives the solver by default (it stops
#: earlier at ``tol``).
GAUSSIAN_SECONDS = 45.0
#: Without a deadline the optimiser's Gaussian family takes at most ``GAUSSIAN_WORK / n^3`` steps
#: (a step is one ``n x n`` eigendecomposition; at least 2), and stops earlier at ``tol``: a count
#: fixed by ``n``, not the wall clock.  ``n = 4096``: 3 steps (about what 45 s bought before; 4
#: took 72 s for ``prefix(4096)`` on the shared machine); ``n = 2048``: 24; ``n <= 1024``: the
#: full ``max_iter``.
GAUSSIAN_WORK = 2.07e11

#: Share ``eta^2`` of each merged cell's budget given to the within-atom contrast rows.
CONTRAST_SHARE = 1e-6

_EPS = np.finfo(np.float64).eps


def cell_atoms(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cells with identical columns of ``W``, from the rows of ``G``: ``(labels, reps)``, with
    ``labels[i]`` the atom of cell ``i`` (``-1`` for a cell no query touches, ``G_ii = 0``) and
    ``reps[b]`` the first cell of atom ``b``.  Rows are compared exactly (bit for bit): identical
    columns give identical rows in every ``G`` built here (the same sums in the same order), and a
    near miss is simply not merged."""
    n = G.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    live = np.flatnonzero(np.diag(G) > 0.0)
    if live.size == 0:
        return labels, np.empty(0, dtype=np.int64)
    _, first, inverse = np.unique(G[live], axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first)  # atoms numbered by their first cell
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    labels[live] = rank[np.ravel(inverse)]
    return labels, live[np.sort(first)]


def dense_gram(gram: Gram | np.ndarray) -> np.ndarray:
    """``G = W^T W`` as a dense symmetric ``n x n`` array (``gram.matmat`` on the identity; an array
    is symmetrised and returned)."""
    if isinstance(gram, np.ndarray):
        G = np.asarray(gram, dtype=np.float64)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise ShapeError(f"a Gram matrix must be square, got shape {G.shape}")
    else:
        n = gram.n
        if n > GAUSSIAN_MAX_N:
            raise SparseDPError(f"the dense Gaussian solver is for n <= {GAUSSIAN_MAX_N}, got n = {n}")
        G = _densify(gram)
    G = 0.5 * (G + G.T)
    if not np.all(np.isfinite(G)):
        raise SparseDPError("the Gram matrix has non-finite entries")
    return G


#: An explicit workload with at most this many entries is made dense to form ``W^T W`` by BLAS.
_DENSE_WORKLOAD_ENTRIES = 1 << 25


def _densify(gram: Gram) -> np.ndarray:
    """``G`` of a :class:`Gram` as an array: a dense ``G`` the Gram holds is copied, a sparse
    workload with at most :data:`_DENSE_WORKLOAD_ENTRIES` entries is made dense and multiplied by
    BLAS (``A^T (A I)`` through scipy.sparse takes ~30 s at ``n = 4096`` for 4M non-zeros, the
    dense product ~2 s), a weighted sum part by part; otherwise ``G I``."""
    n = gram.n
    if gram.parts is not None:
        return sum(c * _densify(g) for c, g in gram.parts)
    if gram.kind == "dense" and getattr(gram, "_dense", None) is not None:
        return np.array(gram._dense, dtype=np.float64)
    A = getattr(gram, "_sparse", None)
    if gram.kind == "sparse" and A is not None and A.shape[0] * n <= _DENSE_WORKLOAD_ENTRIES:
        Ad = A.toarray()
        return Ad.T @ Ad
    return np.asarray(gram.matmat(np.eye(n)), dtype=np.float64)


def dense_score(B: np.ndarray, G: np.ndarray) -> float:
    """``tr((B^T B)^-1 G)`` for a square or tall full-rank ``B`` and a dense ``G``, by a thin QR
    (as :func:`~sparsedp.optimize.pidentity.dense_trace`, with the dense ``G`` at hand):
    ``<Z, G Z>`` with ``Z = R^-1``."""
    R = np.linalg.qr(np.asarray(B, dtype=np.float64), mode="r")
    Z = sla.solve_triangular(R, np.eye(R.shape[1]), lower=False, check_finite=False)
    return float(np.einsum("ij,ij->", Z, G @ Z))


def dual_start(G: np.ndarray, X: np.ndarray) -> np.ndarray:
    """A warm start for the dual from any strategy's ``X = M^T M`` (positive definite): the
    stationarity condition of the Lagrangian, ``X^-1 G X^-1 = diag(L)``, read off its diagonal."""
    C = sla.cho_factor(np.asarray(X, dtype=np.float64))
    Y = sla.cho_solve(C, G)  # X^-1 G
    Z = sla.cho_solve(C, Y.T)  # X^-1 G X^-1 (G symmetric)
    return np.maximum(np.diag(Z), 0.0)


@dataclass
class _Step:
    """One evaluation at ``L``: the eigendecomposition of ``H_tau`` and what follows from it."""

    L: np.ndarray
    q: np.ndarray
    lam: np.ndarray  # eigenvalues of H_tau (clipped at 0)
    s: np.ndarray  # s' = sqrt(max(lam, float noise)): the strategy's S' = U diag(s') U^T
    U: np.ndarray
    d: np.ndarray  # diag X(L) = diag(S') / L
    trace_lb: float  # certified lower bound on tr((L^1/2 G L^1/2)^1/2)
    dual: float  # certified lower bound on min tr(G X^-1): trace_lb^2 / sum L
    primal: float  # tr(G X'^-1) of the best feasible X' = D_f^-1/2 X(L) D_f^-1/2 tried
    f: np.ndarray  # its column scales (f >= d)


def _evaluate(G: np.ndarray, L: np.ndarray, tau: float, want_primal: bool = True,
              quantiles: tuple[float, ...] = (0.0, 0.9)) -> _Step:
    n = G.shape[0]
    q = np.sqrt(L)
    H = np.multiply(G, q[:, None])
    H *= q[None, :]
    if tau > 0.0:
        H[np.diag_indices(n)] += tau * L
    lam, U = sla.eigh(H, overwrite_a=True, check_finite=False, driver="evd")
    del H
    lam_max = float(max(lam[-1], 0.0))
    delta = 8.0 * n * _EPS * lam_max
    # the eigenvalues of H = H_tau - tau diag(L) are at least those of H_tau minus tau max(L) (Weyl),
    # and tr H^1/2 >= tr H_tau^1/2 - sqrt(tau) sum sqrt(L) (Rotfel'd): the larger bound is kept
    weyl = float(np.sum(np.sqrt(np.maximum(lam - (delta + tau * float(L.max())), 0.0))))
    trace_lb = weyl
    if tau > 0.0:
        trace_lb = max(weyl, float(np.sum(np.sqrt(np.maximum(lam - delta, 0.0)))) - math.sqrt(tau) * float(np.sum(q)))
    trace_lb = max(trace_lb, 0.0) * (1.0 - 4.0 * n * _EPS)  # the float sum, rounded down
    dual = trace_lb * trace_lb / float(np.sum(L)) * (1.0 - 4.0 * _EPS)
    # the strategy's S' = U diag(s') U^T with s' = sqrt(max(lambda, delta)): eigenvalues below the
    # float noise are raised to it (S' = S up to rounding; positive definite however singular G is)
    lam = np.maximum(lam, 0.0)
    sp_ = np.sqrt(np.maximum(lam, max(delta, 1e-300)))
    U2 = U * U
    d = (U2 @ sp_) / L  # diag X(L) = diag(S') / L
    primal, f = math.inf, d
    if want_primal and np.all(d > 0.0):
        # feasible points X(L) D_f^-1 (scaled per column by f >= d): f = d (unit columns) is best near
        # the optimum of a full-rank G; a uniform or partly uniform f = max(d, c) keeps the range of
        # X(L) and is far better while L is still rough on a (nearly) rank-deficient G
        null = U2 @ (1.0 / sp_)  # diag S'^-1
        del U2
        uniform = float(d.max()) * (float(np.sum(lam / sp_)) - tau * float(L @ null))
        primal, f = uniform, np.full(n, float(d.max()))
        for qq in quantiles:
            fq = np.maximum(d, np.quantile(d, qq)) if qq > 0 else d
            pq = _primal(U, lam, sp_, q, np.sqrt(fq), tau, null)
            if pq < primal:
                primal, f = pq, fq
    return _Step(L, q, lam, sp_, U, d, trace_lb, dual, primal, f)


def _primal(U: np.ndarray, lam: np.ndarray, s: np.ndarray, q: np.ndarray, e: np.ndarray, tau: float,
            null: np.ndarray) -> float:
    """``tr(G X'^-1)`` for ``X' = D_c S' D_c``, ``c = 1 / (q e)``, ``S' = U diag(s) U^T`` and
    ``H_tau = U diag(lam) U^T``: ``tr(D_e H_tau D_e S'^-1) - tau tr(X'^-1)`` with ``R = U^T D_e U``,
    ``sum_jk R_jk^2 lam_j / s_k`` (positive terms); ``null = diag(S'^-1)``."""
    V = U * np.sqrt(e)[:, None]
    R = dsyrk(1.0, V, trans=1, lower=0)  # upper triangle of V^T V = U^T D_e U (zeros below)
    del V
    rat = lam / s
    # sum over j < k of R_jk^2 (lam_j / s_k + lam_k / s_j), plus the diagonal R_kk^2 lam_k / s_k
    Wt = np.multiply.outer(lam, 1.0 / s)
    Wt += Wt.T
    R *= R
    Wt *= R
    total = float(Wt.sum()) - float(np.diag(R) @ rat)
    del R, Wt
    if tau > 0.0:
        total -= tau * float(((q * e) ** 2) @ null)
    return total


@dataclass
class GaussianSolution:
    """The result of :func:`solve_gaussian`.  Raw values are ``tr(G X^-1)`` at ``diag X <= 1``;
    times ``sigma2`` they are errors at unit budget (``sigma2 = 1/2``: ``rho = 1``, sparsedp's
    normalisation; ``sigma2 = 1``: ``rho = 1/2``, variance ``Delta_2^2``).

    ``L``: the dual point of the bound, per cell (scaled to its best multiple); ``dual_raw``: the
    certified lower bound ``g(L)`` on ``tr(G X^-1)`` of every strategy; ``primal_raw``: that of the
    continuous strategy :meth:`strategy`; ``history``: ``(dual_raw, primal_raw)`` per step (the
    primal of the lifted strategy when cells were merged); ``labels``, ``reps``: the merged cells (:func:`cell_atoms`; ``None`` if none)."""

    L: np.ndarray
    dual_raw: float
    primal_raw: float
    sigma2: float
    iterations: int
    seconds: float
    stopped: str
    tau: float
    n: int
    history: list[tuple[float, float]] = field(default_factory=list)
    labels: np.ndarray | None = None
    reps: np.ndarray | None = None
    _best: _Step | None = field(default=None, repr=False)

    @property
    def bound(self) -> float:
        """The lower bound on the error at unit budget, ``sigma2 * dual_raw``."""
        return self.sigma2 * self.dual_raw

    @property
    def error(self) -> float:
        """The continuous strategy's error at unit budget, ``sigma2 * primal_raw``."""
        return self.sigma2 * self.primal_raw

    @property
    def gap(self) -> float:
        """``primal / dual`` (``>= 1``; ``inf`` if no feasible primal point was evaluated)."""
        return self.primal_raw / self.dual_raw if self.dual_raw > 0 else math.inf

    def reduced_strategy(self) -> np.ndarray:
        """``M_r = S^1/2 diag(c)`` on the merged cells (``c = 1 / (q e)``): ``M_r^T M_r = X'``,
        columns of norm at most 1 (``n x n`` when no cell was merged)."""
        st = self._best
        if st is None:
            raise SparseDPError("no primal point was evaluated")
        c = 1.0 / (st.q * np.sqrt(st.f))
        left = st.U * np.sqrt(st.s)[None, :]
        return left @ (st.U.T * c[None, :])

    def strategy(self) -> np.ndarray:
        """The continuous strategy on all ``n`` cells (``n x n``, columns of norm at most 1), of
        error ``primal_raw``: :meth:`reduced_strategy`, lifted when cells were merged (module doc)."""
        Mr = self.reduced_strategy()
        if self.labels is None:
            return Mr
        eta2 = CONTRAST_SHARE
        return _lift(Mr * math.sqrt(1.0 - eta2), self.labels, math.sqrt(eta2 / 2.0), 1.0)

    def integer_matrix(self, model: NoiseModel) -> np.ndarray:
        """:meth:`strategy` as an integer matrix with ``Delta_2 <= 2^k`` (:func:`integer_strategy`;
        merged cells: the contrast rows are ``+-a``, ``a = floor(eta 2^k / sqrt 2)``, the reduced
        part rounded within ``4^k - 2 a^2`` per column, the untouched cells ``2^k``)."""
        Mr = self.reduced_strategy()
        if self.labels is None:
            return integer_strategy(Mr, model)
        a = math.floor(math.sqrt(CONTRAST_SHARE / 2.0) * model.scale)
        Br = integer_strategy(Mr, model, top=float(model.scale) ** 2 - 2.0 * a * a)
        return _lift(Br, self.labels, float(a), float(model.scale))


def _lift(Mr: np.ndarray, labels: np.ndarray, contrast: float, untouched: float) -> np.ndarray:
    """``[Mr P; contrast C; untouched I_zero]`` (module doc): ``n x n``."""
    n = labels.size
    k = Mr.shape[1]
    out = np.zeros((n, n))
    live = labels >= 0
    out[:k, live] = Mr[:, labels[live]]
    row = k
    order = np.argsort(labels, kind="stable")  # cells by atom, in order within each
    lab = labels[order]
    same = (lab[1:] == lab[:-1]) & (lab[1:] >= 0)
    for i in np.flatnonzero(same):
        out[row, order[i]] = contrast
        out[row, order[i + 1]] = -contrast
        row += 1
    for i in np.flatnonzero(~live):
        out[row, i] = untouched
        row += 1
    assert row == n
    return out


def solve_gaussian(
    G: Gram | np.ndarray,
    *,
    sigma2: float = 0.5,
    L0: np.ndarray | None = None,
    tol: float = 1e-6,
    max_iter: int = 200,
    alpha: float = 2.0,
    deadline: Deadline | None = None,
    reserve: float = 0.0,
    ridge: float = GAUSSIAN_RIDGE,
    polish: bool = True,
    merge: bool = True,
) -> GaussianSolution:
    """Solve ``min tr(G X^-1) s.t. diag X <= 1`` by the dual fixed point (see the module docstring).

    ``G``: a :class:`~sparsedp.optimize.gram.Gram` or a dense ``n x n`` array.  ``L0``: warm start
    (``n`` non-negative numbers; e.g. a previous solution's ``L`` or :func:`dual_start`), default
    ``diag(G)``.  Stops at ``primal / dual <= 1 + tol``, after ``max_iter`` steps, or when the next
    step is not expected to end ``reserve`` seconds before the ``deadline`` (at least one step is
    taken).  Unless converged, the last step's column scaling is then optimised (``polish``,
    :func:`_polish`).  ``merge``: merge cells with identical columns first (:func:`cell_atoms`).
    """
    t0 = time.perf_counter()
    Gd = dense_gram(G)
    n_full = Gd.shape[0]
    if n_full < 1:
        raise ShapeError("the Gram matrix is empty")
    if not float(np.trace(Gd)) > 0.0:
        raise ShapeError("the workload is zero: nothing to optimise")
    if L0 is not None:
        L0 = np.asarray(L0, dtype=np.float64)
        if L0.shape != (n_full,) or not np.all(np.isfinite(L0)) or np.any(L0 < 0):
            raise SparseDPError(f"L0 must be {n_full} finite non-negative numbers")
    labels = reps = None
    if merge:
        lab, rp = cell_atoms(Gd)
        if rp.size < n_full:
            labels, reps = lab, rp
            Gd = Gd[np.ix_(rp, rp)]
            if L0 is not None:
                L0 = np.bincount(lab[lab >= 0], weights=L0[lab >= 0], minlength=rp.size)
    n = Gd.shape[0]
    gdiag = np.diag(Gd).copy()
    scale = float(gdiag.sum()) / n
    tau = float(ridge) * scale
    if L0 is None:
        L = gdiag + max(tau, 1e-12 * scale)
    else:
        floor = 1e-12 * float(L0.max()) if L0.max() > 0 else 1.0
        L = np.maximum(L0, floor)
    L *= n / float(L.sum())
    quantiles = (0.0, 0.9) if n <= 2048 else (0.0,)
    best_dual: _Step | None = None
    best_primal: _Step | None = None
    history: list[tuple[float, float]] = []
    prev_dual = -math.inf
    a = float(alpha)
    stopped = "max_iter"
    step_time = 0.0
    it = 0
    st: _Step | None = None
    for it in range(1, int(max_iter) + 1):
        ts = time.perf_counter()
        prev, st = st, _evaluate(Gd, L, tau, quantiles=quantiles)
        if prev is not None and prev is not best_primal:
            prev.U = np.empty((0, 0))  # eigenvectors (n x n) are kept for the best and the last step only
        step_time = max(step_time, time.perf_counter() - ts) if it > 1 else time.perf_counter() - ts
        history.append((st.dual, st.primal))
        if best_dual is None or st.dual > best_dual.dual:
            best_dual = st
        if st.primal < math.inf and (best_primal is None or st.primal < best_primal.primal):
            best_primal = st
        if st.dual < prev_dual * (1.0 - 1e-12) and a > 1.0:
            a = max(1.0, 0.7 * a)  # a step that lowered the dual: damp
        prev_dual = max(prev_dual, st.dual)
        if best_primal is not None and best_primal.primal <= (1.0 + tol) * best_dual.dual:
            stopped = "converged"
            break
        if deadline is not None and deadline.remaining() < (1.5 if polish else 1.0) * step_time + reserve:
            stopped = "time limit"
            break
        base = best_dual if st.dual < best_dual.dual else st
        L = base.L * base.d**a
        if not np.all(np.isfinite(L)) or np.any(L <= 0):
            stopped = "numerical breakdown"
            break
        L *= n / float(L.sum())
    assert best_dual is not None and st is not None
    if polish and stopped != "converged" and st.primal < math.inf:
        pol = _polish(Gd, st, tau, deadline=deadline, reserve=reserve)
        if pol is not None and (best_primal is None or pol.primal < best_primal.primal):
            best_primal = pol
            history.append((st.dual, pol.primal))
    # the bound's dual point at its best scale c = (tr S / sum L)^2, spread over the merged cells
    c = (best_dual.trace_lb / float(np.sum(best_dual.L))) ** 2
    L_best = best_dual.L * c
    primal = best_primal.primal if best_primal is not None else math.inf
    if labels is not None:
        sizes = np.bincount(labels[labels >= 0], minlength=n).astype(np.float64)
        L_full = np.zeros(n_full)
        L_full[labels >= 0] = (L_best / sizes)[labels[labels >= 0]]
        L_best = L_full
        primal = primal / (1.0 - CONTRAST_SHARE)
        history = [(d, p / (1.0 - CONTRAST_SHARE)) for d, p in history]
    return GaussianSolution(
        L=L_best,
        dual_raw=best_dual.dual,
        primal_raw=primal,
        sigma2=float(sigma2),
        iterations=it,
        seconds=time.perf_counter() - t0,
        stopped=stopped,
        tau=tau,
        n=n_full,
        history=history,
        labels=labels,
        reps=reps,
        _best=best_primal,
    )


def _polish(G: np.ndarray, st: _Step, tau: float, *, maxiter: int = 200, deadline: Deadline | None = None,
            reserve: float = 0.0) -> _Step | None:
    """The best column scaling of ``X(L)`` at the step ``st``: ``X' = D_c S' D_c``, ``c = 1 / (q e)``,
    has error ``e^T Q e`` with ``Q = H_tau o S'^-1 - tau diag(L o diag S'^-1)`` (``tr(D_e A D_e B) =
    e^T (A o B) e``; ``Q`` is positive semidefinite by Schur's product theorem), and is feasible iff
    ``e >= sqrt(diag X(L))``: a convex quadratic programme with bounds, solved by L-BFGS-B on
    ``y = sqrt(diag Q) e`` from the step's best scaling.  One ``n x n`` product and ``maxiter``
    ``O(n^2)`` products; the error of the result is recomputed by :func:`_primal`."""
    n = G.shape[0]
    U, s = st.U, st.s
    if U.size == 0:
        return None
    Si = (U / s[None, :]) @ U.T  # S'^-1
    Q = np.multiply(G, st.q[:, None])
    Q *= st.q[None, :]
    Q[np.diag_indices(n)] += tau * st.L
    Q *= Si
    null = np.diag(Si).copy()
    del Si
    Q[np.diag_indices(n)] -= tau * st.L * null
    w = np.sqrt(np.maximum(np.diag(Q), 1e-300))
    Q /= w[:, None]
    Q /= w[None, :]
    lo = np.sqrt(st.d) * w

    def fun(y: np.ndarray) -> tuple[float, np.ndarray]:
        Qy = Q @ y
        return float(y @ Qy), 2.0 * Qy

    dl = deadline
    if deadline is not None and deadline.end is not None and reserve > 0:
        dl = Deadline(max(deadline.remaining() - reserve, 0.0))
    res = lbfgs(fun, np.maximum(np.sqrt(st.f) * w, lo), bounds=(lo, None), deadline=dl, maxiter=maxiter,
                ftol=1e-14, gtol=1e-12, maxcor=20)
    del Q
    e = np.maximum(res.x / w, np.sqrt(st.d))
    primal = _primal(U, st.lam, s, st.q, e, tau, null)
    return _Step(st.L, st.q, st.lam, s, U, st.d, st.trace_lb, st.dual, primal, e * e)


def integer_strategy(M: np.ndarray, model: NoiseModel, top: float | None = None) -> np.ndarray:
    """``M`` (columns of 2-norm at most about 1) as an integer matrix with every column's squared
    norm at most ``top`` (default ``4^k``, ``Delta_2 <= 2^k``, ``k = model.bits``): every entry of
    ``M sqrt(top)`` rounded to the nearest integer; a column whose squared norm would then exceed
    ``top`` is truncated toward zero instead (``|trunc(v)| <= |v|``), at a scale reduced by the
    float error of its norm.  The integer sums are exact in float64."""
    if model.p != 2:
        raise SparseDPError("integer_strategy is for Gaussian (L2) strategies")
    M = np.asarray(M, dtype=np.float64)
    top = float(model.scale) ** 2 if top is None else float(top)
    root = math.sqrt(top)
    norms = np.sqrt(np.einsum("ij,ij->j", M, M))
    if not np.all(norms > 0):
        raise SparseDPError("the strategy has a zero column")
    B = np.rint(M * (root / np.maximum(norms, 1.0))[None, :])
    bad = np.einsum("ij,ij->j", B, B) > top
    if np.any(bad):
        sc = root * (1.0 - 1e-9) / norms[bad]
        B[:, bad] = np.trunc(M[:, bad] * sc[None, :])
    if float(np.einsum("ij,ij->j", B, B).max()) > top:  # pragma: no cover - by construction
        raise SparseDPError("could not round the strategy to integers")
    return B


@dataclass(frozen=True)
class GaussianCandidate(Candidate):
    """A :class:`~sparsedp.optimize.candidate.Candidate` of the Gaussian family, with the certified
    lower bound on the error of every strategy (same unit budget) and the continuous optimum."""

    lower_bound: float = math.nan
    continuous: float = math.nan

    @property
    def gap(self) -> float:
        """``total / lower_bound``: how far the returned (integer) strategy is from the optimum."""
        return self.total / self.lower_bound if self.lower_bound > 0 else math.inf


def gaussian_candidates(
    W: Operator,
    gram: Gram,
    model: NoiseModel,
    *,
    deadline: Deadline | None = None,
    tol: float = 1e-5,
    max_iter: int = 200,
    L0: np.ndarray | None = None,
    max_n: int = GAUSSIAN_MAX_N,
) -> list[GaussianCandidate]:
    """The Gaussian family: the optimum of the convex problem (:func:`solve_gaussian`) as an
    integer strategy scored exactly (dense QR of the returned matrix), with its certified bound.
    Nothing for Laplace noise or ``n > max_n``.  Without a deadline the solver gets at most
    ``GAUSSIAN_WORK / n^3`` steps (:data:`GAUSSIAN_WORK`; it stops earlier at ``tol``)."""
    if model.kind != "gaussian" or gram.n > max_n or gram.n < 1:
        return []
    if deadline is not None and deadline.expired():
        return []
    t0 = time.perf_counter()
    n = gram.n
    dl = deadline if deadline is not None and deadline.end is not None else None
    if dl is None:
        max_iter = min(max_iter, max(2, int(GAUSSIAN_WORK // float(n) ** 3)))
    # the final factor and the exact score cost about one step (measured: 0.6-0.9 of a step)
    G = dense_gram(gram)
    sol = solve_gaussian(G, sigma2=model.sigma2, L0=L0, tol=tol, max_iter=max_iter, deadline=dl,
                         reserve=_final_cost(n))
    if not math.isfinite(sol.primal_raw):
        return []
    B = sol.integer_matrix(model)
    M = SparseOperator(B, name="gaussian-optimum", structure="general")
    f = dense_score(B, G)
    total = unit_variance(M, model) * f
    note = (f"{sol.iterations} steps ({sol.stopped}); bound {sol.bound:.8g}, continuous {sol.error:.8g}, "
            f"gap {total / sol.bound:.6f}")
    return [GaussianCandidate("gaussian", "gaussian-optimum", M, float(total), "dense-qr",
                              time.perf_counter() - t0, note, lower_bound=sol.bound, continuous=sol.error)]


def _final_cost(n: int) -> float:
    """Seconds reserved for the factor, the rounding and the exact score: ``~1.2e-10 n^3``
    (4096: ~8 s with one BLAS thread)."""
    return 1.2e-10 * float(n) ** 3
