"""Soft-Impute: nuclear-norm regularised completion for high noise (never worse than zero).

Mazumder, Hastie and Tibshirani, "Spectral regularization algorithms for learning large incomplete
matrices", JMLR 11:2287-2322, 2010: ``min_Z 1/2 ||P_Omega(M - Z)||_F^2 + lam ||Z||_*`` by iterating
``Z <- SVT_lam(P_Omega(M) + P_Omega^perp(Z))`` (singular values soft-thresholded: ``s <- max(s - lam, 0)``).

Why: a fixed-rank fit (DLNM-QR, SOR, AM) fits ``r (m + n - r)`` parameters whatever the noise; when
the noise swamps the signal it fits noise and its RSE exceeds 1, i.e. it is worse than releasing the
zero matrix.  Soft-thresholding keeps only singular values above the noise level.

Threshold (decided here): ``lam = threshold * edge`` with ``edge`` the spectral norm of the sampled
noise ``P_Omega(E)``: the larger of the asymptotic value ``sigma sqrt(p) (sqrt(m) + sqrt(n))`` (Bai-Yin /
Latala: ``||G||_2 ~ sqrt(m) + sqrt(n)`` for a unit-variance ``m x n`` matrix) and a direct estimate
(power iteration on fresh Laplace noise placed on the actual pattern: sparse patterns and heavy tails
push the norm above the asymptotic value at small sizes).  Components weaker than the noise then get
singular value 0, so pure noise is completed to zero.
``sigma`` is known for a DP release: ``sqrt(2) b`` for Laplace scale ``b`` (:mod:`.privacy`).

Implementation (decided here): ``Z = U diag(s) V^T`` of rank ``<= max_rank``; each iteration applies
one warm-started block power step to ``W = Z + P_Omega(M - Z)`` (low rank + sparse):
``Q = orth(W V)``, ``W^T Q = P Sigma G^T``, then ``U = Q G``, ``V = P``, ``s = max(Sigma - lam, 0)``
(the "warm start" of the paper's Sec. 5 with a one-step partial SVD).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._threads import blas_threads
from ..errors import ShapeError
from ..validation import check_positive
from ._loop import Monitor
from ..noise import as_generator
from ._observed import Pattern, as_pattern, spectral_init, spectral_norm
from .report import CompletionResult
from .shrinkage import calibrated_lambda, resolve_noise_std
from .synthetic import simulated_laplace


def noise_threshold(shape: tuple[int, int], p: float, sigma: float) -> float:
    """``sigma sqrt(p) (sqrt(m) + sqrt(n))``: the expected spectral norm of sampled i.i.d. noise."""
    m, n = shape
    return float(sigma * math.sqrt(p) * (math.sqrt(m) + math.sqrt(n)))


def sampled_noise_norm(pat: Pattern, sigma: float, rng: Any = 0, draws: int = 2, iters: int = 25) -> float:
    """``max`` over ``draws`` of ``||P_Omega(E)||_2`` for fresh Laplace noise ``E`` of standard deviation
    ``sigma`` on the actual observed pattern (power iteration).  Uses only public information (the
    pattern and the published noise level), never the data: a simulation, not privacy noise (nothing
    it draws is released), so it is not a measurement."""
    gen = as_generator(rng)
    b = sigma / math.sqrt(2.0)
    return max(spectral_norm(pat, iters, gen, values=simulated_laplace(gen, b, pat.nnz)) for _ in range(draws))


@blas_threads()
def soft_impute(
    observed: Any,
    max_rank: int,
    *,
    lam: float | str | None = None,
    noise_std: float | None = None,
    threshold: float = 1.1,
    tol: float = 1e-4,
    abs_tol: float = 1e-7,
    max_iter: int = 500,
    truth: Any = None,
    rng: Any = 0,
) -> CompletionResult:
    """Complete the observed entries by Soft-Impute; see the module docstring.

    Give ``lam`` directly, or ``noise_std`` (``sigma``; for a
    :class:`~sparsedp.completion.privacy.PrivateObservations` it is read from the release when
    neither is given), then ``lam = threshold * noise_threshold(shape, p_hat, sigma)`` (the safe
    threshold: never worse than the zero matrix, about 2x the oracle at low noise).
    ``lam="calibrated"``: the noise-calibrated ``lam`` of
    :func:`~sparsedp.completion.shrinkage.calibrated_lambda` with ``rank = max_rank`` (give the
    rank of the signal as ``max_rank``; then it is the estimator of the other methods' noise-aware
    mode, at the oracle).
    ``max_rank``: cap on the rank of the iterate (``extra["rank"]`` reports the rank reached; if it
    equals ``max_rank`` the cap was binding).  Returns :class:`CompletionResult`
    (``left = U diag(s)``, ``right = V``), ``extra = {"lam", "rank", "singular_values"}``.
    """
    pat = as_pattern(observed, max_rank)
    m, n = pat.shape
    if isinstance(lam, str):
        if lam != "calibrated":
            raise ShapeError(f"lam must be a number, None or 'calibrated', got {lam!r}")
        sigma = resolve_noise_std(observed, noise_std)
        if sigma is None:
            raise ShapeError("lam='calibrated' needs noise_std= (or a PrivateObservations input)")
        lam = calibrated_lambda(pat, sigma, int(max_rank))
    elif lam is None:
        if noise_std is None:
            noise_std = getattr(observed, "noise_std", None)
        if noise_std is None:
            raise ShapeError("soft_impute needs lam= or noise_std= (or a PrivateObservations input)")
        sigma = check_positive(noise_std, "noise_std")
        edge = max(noise_threshold((m, n), pat.nnz / (m * n), sigma), sampled_noise_norm(pat, sigma, rng))
        lam = check_positive(threshold, "threshold") * edge
    else:
        lam = check_positive(lam, "lam")
    U, s, V = spectral_init(pat, int(max_rank), rng)
    s = np.maximum(s * (pat.nnz / (m * n)) - lam, 0.0)  # first SVT of P_Omega(M) itself
    mon = Monitor(pat, truth, tol, abs_tol, max_iter)
    S = pat.values - pat.sampled(U * s, V)
    while True:
        Smat = pat.matrix(S)
        Q = np.linalg.qr((U * s) + Smat @ V)[0]  # W V with V^T V = I
        P, sig, Gt = np.linalg.svd(V @ (s[:, None] * (U.T @ Q)) + Smat.T @ Q, full_matrices=False)
        U, V = Q @ Gt.T, P
        s = np.maximum(sig - lam, 0.0)
        S = pat.values - pat.sampled(U * s, V)
        if mon.record(float(np.linalg.norm(S)), U * s, V):
            break
    return mon.result(U * s, V, "soft-impute", {"lam": lam, "rank": int(np.count_nonzero(s)), "singular_values": s})
