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

from ..errors import ShapeError
from ._loop import Monitor
from ._observed import as_pattern, spectral_init
from .report import CompletionResult


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


def lmafit_sor(
    observed: Any,
    rank: int,
    *,
    rank_adaptive: bool = False,
    rank_gap: float = 3.0,
    w_max: float = 100.0,
    tol: float = 1e-4,
    abs_tol: float = 1e-7,
    max_iter: int = 500,
    init: str = "spectral",
    truth: Any = None,
    rng: Any = 0,
) -> CompletionResult:
    """Complete the observed entries with LMaFit's nonlinear SOR; see the module docstring.

    ``rank``: the rank ``k`` (with ``rank_adaptive=True``, an upper estimate that may be lowered once
    by the QR-gap rule with threshold ``rank_gap``).  ``w_max``: cap of the over-relaxation weight.
    ``init``: ``"spectral"`` (randomized SVD of ``P_Omega(M)/p``) or ``"random"`` (Gaussian ``Y``, as
    LMaFit).  Stops on the shared rule (``tol``, ``abs_tol``, ``max_iter``).  Returns
    :class:`CompletionResult` (``left = X``, ``right = Y^T``), ``extra = {"w": final weight,
    "rejected": rejected steps, "rank": final k}``.
    """
    pat = as_pattern(observed, rank)
    k = int(rank)
    if init == "spectral":
        U, s, V = spectral_init(pat, k, rng)
        X, Yt = U, V * s
    elif init == "random":
        X, Yt = np.zeros((pat.shape[0], k)), np.random.default_rng(rng).standard_normal((pat.shape[1], k))
    else:
        raise ShapeError(f"init must be 'spectral' or 'random', got {init!r}")
    S = pat.values - pat.sampled(X, Yt)
    res = float(np.linalg.norm(S))
    mon = Monitor(pat, truth, tol, abs_tol, max_iter)
    w, inc, rejected, adapt = 1.0, 1.0, 0, rank_adaptive
    while True:
        Smat = pat.matrix(S)
        ZYt = X @ (Yt.T @ Yt) + w * (Smat @ Yt)  # Z_w Y^T
        dropped = False
        if adapt:
            Q, R, piv = scipy.linalg.qr(ZYt, mode="economic", pivoting=True)
            drop = _rank_drop(R, rank_gap)
            if drop is not None:
                adapt, dropped = False, True
                Q = Q[:, :drop]  # leading pivoted columns span the kept subspace
        else:
            Q = np.linalg.qr(ZYt)[0]
        Yt_new = Yt @ (X.T @ Q) + w * (Smat.T @ Q)  # (Q^T Z_w)^T
        S_new = pat.values - pat.sampled(Q, Yt_new)
        res_new = float(np.linalg.norm(S_new))
        if res_new >= res and w > 1.0 and not dropped:  # reject: redo from the last accepted point with w = 1
            rejected += 1
            inc = max(0.1 * (w - 1.0), 0.1 * inc)
            w = 1.0
            continue
        if res_new >= 0.7 * res:
            inc = max(inc, 0.25 * (w - 1.0))
        w = min(w + inc, w_max)
        X, Yt, S, res = Q, Yt_new, S_new, res_new
        if mon.record(res, X, Yt):
            break
    return mon.result(X, Yt, "sor", {"w": w, "rejected": rejected, "rank": X.shape[1]})
