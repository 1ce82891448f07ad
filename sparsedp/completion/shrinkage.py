"""Noise-calibrated nuclear-norm shrinkage for fixed-rank fits (the ``noise_std=`` mode of every method).

Why.  A rank-``r`` least-squares fit has ``df = r (m + n - r)`` free parameters; when the number of
observations ``|Omega|`` is not much larger than ``df`` it overfits the noise (RSE 1.32 at n = 200,
r = 10, p = 0.15, b = 1, where the exact known-subspace oracle of :mod:`.oracle` gets 0.64), and when
the noise is near the detection edge it is worse than the zero matrix (RSE 3.05 at n = 1000, b = 10).
A DP release publishes its noise level (``sigma = sqrt(2) b``), so the fit can be regularised by it:

    ``min_{rank Z <= r} 1/2 ||P_Omega(M - Z)||_F^2 + lam ||Z||_*``
    ``= min_{A, B} 1/2 ||P_Omega(M - A B^T)||_F^2 + lam/2 (||A||_F^2 + ||B||_F^2)``

(Srebro-Rennie-Jaakkola 2005; Mazumder-Hastie-Tibshirani 2010; the factor form is ridge ALS with
``lam``).  Each method solves it in its own style (DLNM-QR: the L2,1 threshold of its core; SOR: the
singular values of each step; ALS: the ridge).

Calibration (derived here, then checked by measurement).  A component of full-scale singular value
``s`` seen through noise of per-entry standard deviation ``sigma_e = sigma / sqrt(p)`` (the
observed entries rescaled by ``1/p``) is best estimated by shrinking it by about
``sigma_e^2 (m + n) / s`` (Gavish and Donoho, "Optimal shrinkage of singular values", IEEE Trans.
Inf. Theory 63(4), 2017: ``eta(y) = sqrt((y^2 - beta - 1)^2 - 4 beta) / y`` in units of
``sigma_e sqrt(n)``, ``~ y - (1 + beta) / y`` for strong components).  In the penalised problem a
threshold ``lam`` on ``P_Omega``'s scale shrinks the full-scale singular values by ``lam / p``, so
the matching threshold is ``lam = sigma^2 (m + n) / s``.  With ``s`` the root-mean-square singular
value of the signal, estimated without bias from the release and the published noise,
``s_typ = sqrt(m n P_hat / r)``, ``P_hat = mean(M_Omega^2) - sigma^2``:

    ``lam = c sigma^2 (sqrt(m) + sqrt(n))^2 / s_typ``,  ``c = 1/2``

(``(sqrt m + sqrt n)^2 / 2 ~ m + n``).  If ``P_hat <= 0`` (no signal above the noise) ``lam = inf``
and the fit is the zero matrix.  Measured (benchmark setting, r = 10, p = 0.15, seeds 0 and 1):
the RSE with ``c`` in 0.45-0.6 was 0.87-1.00x the exact oracle for n = 200-2000, b = 0.2-5, and
exactly the zero matrix (RSE 1.0000) at b = 10, where every unregularised fit exceeded 3.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..validation import check_positive
from ._observed import Pattern

CALIBRATION = 0.5


def resolve_noise_std(observed: Any, noise_std: float | None) -> float | None:
    """``noise_std`` if given, else the noise level a :class:`PrivateObservations` release publishes
    (``sqrt(2) b``), else ``None`` (unknown noise: plain least squares)."""
    if noise_std is None:
        noise_std = getattr(observed, "noise_std", None)
    return None if noise_std is None else check_positive(noise_std, "noise_std")


def resolve_lambda(observed: Any, pat: Pattern, noise_std: float | None, lam: float | None, rank: int) -> float:
    """The penalty of a method call: ``lam`` if given (> 0), else :func:`calibrated_lambda` of the
    noise level (``noise_std`` or the release's), else 0 (unknown noise: least squares)."""
    if lam is not None:
        return check_positive(lam, "lam")
    sigma = resolve_noise_std(observed, noise_std)
    return 0.0 if sigma is None else calibrated_lambda(pat, sigma, rank)


def signal_scale(pat: Pattern, noise_std: float, rank: int) -> float:
    """``s_typ = sqrt(m n P_hat / r)`` with ``P_hat = mean(M_Omega^2) - sigma^2`` (0 if negative): the
    root-mean-square singular value of a rank-``r`` signal, estimated from the observed entries."""
    m, n = pat.shape
    power = float(np.mean(pat.values**2)) - noise_std**2
    return math.sqrt(m * n * power / rank) if power > 0 else 0.0


def calibrated_lambda(pat: Pattern, noise_std: float, rank: int, c: float = CALIBRATION) -> float:
    """``lam = c sigma^2 (sqrt m + sqrt n)^2 / s_typ`` on ``P_Omega``'s scale (``inf`` without signal);
    see the module docstring for the derivation and the measurements behind ``c = 1/2``."""
    s = signal_scale(pat, noise_std, rank)
    if s <= 0:
        return math.inf
    m, n = pat.shape
    return float(check_positive(c, "c") * noise_std**2 * (math.sqrt(m) + math.sqrt(n)) ** 2 / s)


def thin_svd(A: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``A B^T = U diag(s) V^T`` from the factors in ``O((m + n) k^2)`` (QR of each, SVD of ``k x k``)."""
    Qa, Ra = np.linalg.qr(A)
    Qb, Rb = np.linalg.qr(B)
    P, s, Gt = np.linalg.svd(Ra @ Rb.T)
    return Qa @ P, s, Qb @ Gt.T


def nuclear_objective(residual: np.ndarray, singular_values: np.ndarray, lam: float) -> float:
    """``1/2 ||P_Omega(M - Z)||^2 + lam ||Z||_*`` (``lam = 0``: half the squared residual)."""
    total = float(np.sum(singular_values))
    return 0.5 * float(residual @ residual) + (lam * total if lam > 0 and total > 0 else 0.0)
