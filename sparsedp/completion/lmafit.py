"""LMaFit: nonlinear successive over-relaxation for low-rank factorisation with rank adaptation.

Wen, Yin and Zhang, "Solving a low-rank factorization model for matrix completion by a nonlinear
successive over-relaxation algorithm", Math. Prog. Comp. 4:333-361, 2012.  Model
``min ||X Y - Z||_F^2`` s.t. ``P_Omega(Z) = P_Omega(M)`` with ``X`` ``m x k``, ``Y`` ``k x n``.  With
``S = P_Omega(M - X Y)`` and the over-relaxed ``Z_w = X Y + w S``, one step is

    ``X+ = orth(Z_w Y^T)``, ``Y+ = X+^T Z_w``, ``S+ = P_Omega(M - X+ Y+)``

(orthonormalising ``X+`` gives the same product as ``X+ = Z_w Y^T (Y Y^T)^+``, paper Sec. 2.2).
Weight control (paper Alg. 1): with ``g = ||S+|| / ||S||``, ``g >= 1`` (and ``w > 1``) rejects the
step, sets ``d = max(0.1 (w - 1), 0.1 d)`` and retries from ``w = 1``; ``g >= 0.7`` accepts and raises
the increment ``d = max(d, 0.25 (w - 1))``; every accepted step sets ``w = min(w + d, w_max)``.
Rank decreasing (paper Sec. 3.4): ``k`` starts at ``rank`` (an overestimate); after a step, the
pivoted-QR diagonal ``|R_ii|`` of ``Z_w Y^T`` gives ratios ``l_i = |R_ii| / |R_{i+1,i+1}|``; if
``l_p > rank_gap * max(median_{i != p} l_i, 1)`` (``p = argmax``; the paper compares with the mean)
the rank drops to ``p`` (once; that step is always accepted).
All products use ``Z_w = X Y + w S`` with sparse ``S``: ``O(|Omega| k + (m + n) k^2)`` per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from .._threads import blas_threads
from ..errors import ShapeError
from ..validation import check_positive
from ._linalg import thin_qr
from ._loop import Monitor
from ._relax import OverRelaxation
from ._observed import Residual, as_pattern, spectral_init
from .report import CompletionResult
from .shrinkage import nuclear_objective, resolve_lambda, thin_svd


def _rank_drop(R: np.ndarray, gap: float) -> int | None:
    """Rank to drop to, or None: the largest ratio ``l_p`` of consecutive pivoted-QR diagonal entries
    against the median of the other ratios (the median instead of the paper's mean: robust when
    several spurious columns decay together; decided here)."""
    d = np.abs(np.diag(R))
    if d.size < 2:
        return None
    if d[-1] <= 1e-14 * d[0]:
        nz = int(np.count_nonzero(d > 1e-14 * d[0]))
        return nz if nz >= 1 else None
    ratios = d[:-1] / d[1:]
    p = int(np.argmax(ratios))
    others = np.delete(ratios, p)
    base = float(np.median(others)) if others.size else 1.0
    return p + 1 if ratios[p] > gap * max(base, 1.0) else None


@blas_threads()
def lmafit_sor(
    observed: Any,
    rank: int,
    *,
    rank_adaptive: bool = False,
    rank_gap: float = 3.0,
    w_max: float = 100.0,
    w0: float = 1.0,
    noise_std: float | None = None,
    lam: float | None = None,
    tol: float = 1e-4,
    abs_tol: float = 1e-7,
    max_iter: int = 500,
    init: str = "spectral",
    truth: Any = None,
    rng: Any = 0,
) -> CompletionResult:
    """Complete the observed entries with LMaFit's nonlinear SOR; see the module docstring.

    ``rank``: the rank ``k`` (with ``rank_adaptive=True``, an upper estimate that may be lowered once
    by the QR-gap rule with threshold ``rank_gap``).  ``w_max``: cap of the over-relaxation weight;
    ``w0``: its first value (1 as published; DLNM-QR's adaptive iteration starts at ``1 / (4p)``).
    ``init``: ``"spectral"`` (randomized SVD of ``P_Omega(M)/p``) or ``"random"`` (Gaussian ``Y``, as
    LMaFit).  Stops on the shared rule (``tol``, ``abs_tol``, ``max_iter``).

    Noise-aware mode (``noise_std=sigma``, read from a
    :class:`~sparsedp.completion.privacy.PrivateObservations` release when not given, or ``lam=``):
    each step's singular values are soft-thresholded by ``w lam``,
    ``X+ Y+ = S_{w lam}(top-k(Z_w))``; a fixed point then satisfies
    ``P_Omega(M - X Y) in lam d||X Y||_*``, the optimality condition of
    ``1/2 ||P_Omega(M - Z)||^2 + lam ||Z||_*`` with ``rank Z <= k`` (whatever ``w``), and steps are
    accepted or rejected on that objective instead of the residual (``lam`` from
    :func:`~sparsedp.completion.shrinkage.calibrated_lambda`).  Returns
    :class:`CompletionResult` (``left = X``, ``right = Y^T``), ``extra = {"w": final weight,
    "rejected": rejected steps, "rank": final k, "lam": lam (0: least squares)}``.
    """
    pat = as_pattern(observed, rank)
    k = int(rank)
    lam = resolve_lambda(observed, pat, noise_std, lam, k)
    if init == "spectral":
        U, s, V = spectral_init(pat, k, rng)
        X, Yt = U, V * s
    elif init == "random":
        X, Yt = np.zeros((pat.shape[0], k)), np.random.default_rng(rng).standard_normal((pat.shape[1], k))
    else:
        raise ShapeError(f"init must be 'spectral' or 'random', got {init!r}")
    if lam > 0:
        X, s, V = thin_svd(X, Yt)
        X, Yt = X, V * _shrink(s, lam)
    S, S_new = Residual(pat).update(X, Yt), Residual(pat)  # two buffers, swapped on acceptance
    merit = _merit(S.data, Yt, lam)
    mon = Monitor(pat, truth, tol, abs_tol, max_iter)
    relax, adapt = OverRelaxation(w_max, check_positive(w0, "w0")), rank_adaptive
    while True:
        w = relax.w
        ZYt = X @ (Yt.T @ Yt) + w * (S.csr @ Yt)  # Z_w Y^T
        dropped = False
        if adapt:
            Q, R, piv = scipy.linalg.qr(ZYt, mode="economic", pivoting=True)
            drop = _rank_drop(R, rank_gap)
            if drop is not None:
                adapt, dropped = False, True
                Q = Q[:, :drop]  # leading pivoted columns span the kept subspace
        else:
            Q = thin_qr(ZYt, want_r=False)[0]
        Yt_new = Yt @ (X.T @ Q) + w * (S.csc @ Q)  # (Q^T Z_w)^T
        if lam > 0:  # X+ Y+ = Q Yt_new^T = (Q G) diag(sig) P^T, soft-thresholded by w lam
            P, sig, Gt = np.linalg.svd(Yt_new, full_matrices=False)
            Q, Yt_new = Q @ Gt.T, P * _shrink(sig, w * lam)
        merit_new = _merit(S_new.update(Q, Yt_new).data, Yt_new, lam)
        if not relax.accept(merit_new, merit, force=dropped):  # rejected: redo from the last accepted point, w = 1
            continue
        X, Yt, merit = Q, Yt_new, merit_new
        S, S_new = S_new, S
        if mon.record(S.norm(), X, Yt):
            break
    return mon.result(X, Yt, "sor", {"w": relax.w, "rejected": relax.rejected, "rank": X.shape[1], "lam": lam})


def _shrink(s: np.ndarray, t: float) -> np.ndarray:
    return np.maximum(s - t, 0.0)


def _merit(S: np.ndarray, Yt: np.ndarray, lam: float) -> float:
    """``sqrt(2 f)`` of the penalised objective ``f`` (with ``X`` orthonormal, ``||X Y||_* = ||Y||_*``,
    which is ``sum ||y_j||`` after the SVD step); equals the residual norm when ``lam = 0``."""
    nuclear = np.linalg.norm(Yt, axis=0) if lam > 0 else np.zeros(0)
    return float(np.sqrt(2.0 * nuclear_objective(S, nuclear, lam)))
