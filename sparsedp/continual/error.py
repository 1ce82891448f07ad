"""Expected error of the weighted Fenwick release (seed 000, eq. 5.9), per step and in total.

With weights ``lambda`` the release is ``s~ = B Sigma^{-1} (Sigma M x + z)`` and ``z_i`` i.i.d. with
variance ``v``:

* Laplace (pure ``epsilon``): ``z_i ~ Lap(Delta_1 / epsilon)``, ``v = 2 Delta_1^2 / epsilon^2``,
  ``Delta_1 = Delta_1(Sigma M_N) = max_j (M^T lambda)_j``.
* Gaussian (``rho``-zCDP): ``sigma = Delta_2 / sqrt(2 rho)``, ``v = sigma^2``,
  ``Delta_2 = max_j sqrt((M^T lambda^2)_j)``.

Step ``t`` has variance ``v * sum_{i in chain(t)} 1 / lambda_i^2`` and the total is
``v * sum_i ||B[:, i]||^2 / lambda_i^2 = v * trace(B^T B Sigma^{-2})`` (eq. 5.9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidPrivacyParameterError, ShapeError
from ..calibration import gaussian_sigma, laplace_scale
from ..validation import check_epsilon, check_rho, check_vector
from .fenwick import check_horizon, prefix_chain_sum
from .weights import weights_sensitivity

__all__ = ["ContinualError", "expected_error", "noise_calibration"]


@dataclass(frozen=True)
class ContinualError:
    """Per-step variances of a continual release: ``.per_step[t-1] = Var(s~_t)``; ``.total`` their sum."""

    per_step: np.ndarray
    total: float
    mean: float
    sensitivity: float
    noise_variance: float
    method: str


def noise_calibration(epsilon: float | None, rho: float | None, sensitivity: float) -> tuple[str, float, float]:
    """``(kind, scale, variance)`` of unit noise for a strategy of the given sensitivity.

    Exactly one of ``epsilon`` (Laplace ``b = Delta_1 / epsilon``, variance ``2 b^2``) and ``rho``
    (Gaussian ``sigma = Delta_2 / sqrt(2 rho)``, variance ``sigma^2``); the budget must lie in the
    accepted range (:func:`~sparsedp.validation.check_epsilon`, :func:`~sparsedp.validation.check_rho`)
    and the scale is rounded up (:func:`~sparsedp.calibration.laplace_scale`,
    :func:`~sparsedp.calibration.gaussian_sigma`), so ``Delta / b <= epsilon`` holds exactly.
    """
    if (epsilon is None) == (rho is None):
        raise InvalidPrivacyParameterError("give exactly one of epsilon (Laplace) or rho (Gaussian, zCDP)")
    if epsilon is not None:
        b = laplace_scale(sensitivity, check_epsilon(epsilon, "epsilon"))
        return "laplace", b, 2.0 * b * b
    sigma = gaussian_sigma(sensitivity, check_rho(rho, "rho"))
    return "gaussian", sigma, sigma * sigma


def expected_error(N: int, lam: Any, epsilon: float | None = None, rho: float | None = None) -> ContinualError:
    """Exact variance of every step of ``B Sigma^{-1}(Sigma M_N x + z)`` (eq. 5.9), ``O(N log N)``.

    ``lam`` are the diagonal weights (``np.ones(N)`` = the unweighted Fenwick / binary mechanism).
    """
    N = check_horizon(N, "N")
    lam = check_vector(lam, N, "lambda")
    if np.any(lam <= 0):
        raise ShapeError("weights lambda must be > 0")
    norm = 1 if rho is None else 2
    delta = weights_sensitivity(lam, norm)
    kind, _, v = noise_calibration(epsilon, rho, delta)
    per_step = v * prefix_chain_sum(1.0 / lam**2)
    total = float(per_step.sum())
    return ContinualError(per_step, total, total / N, delta, v, f"fenwick-{kind}")
