"""Continual release of running sums (seed 000): Fenwick strategy, optimal weights, online counters.

* :func:`fenwick_matrices` -- sparse ``(M_N, B_N)`` with ``W_N = B_N M_N``.
* :func:`optimal_weights` -- the diagonal of eq. 5.10 by FDA (every ``N``) or SQP (reference).
* :func:`expected_error` -- per-step and total variance of a weighted Fenwick release.
* :class:`ContinualCounter` -- online, ``O(log N)`` per step, Laplace (``epsilon``) or Gaussian (``rho``),
  save / restore.
* Baselines: :class:`NaiveCounter`, :class:`BinaryMechanism`, :class:`HonakerCounter`,
  :func:`unweighted_fenwick`.
* Beyond the seed: :class:`KaryCounter` (k-ary trees, optimal per-level weights, streaming BLUE),
  :class:`NegDigitCounter` (k-ary tree with negative digits, Andersson-Pagh-Torkamani 2024),
  :class:`SqrtCounter` (square-root factorisation, zCDP), :class:`BLTCounter` / :func:`fit_blt`.
"""

from .baselines import (
    BinaryMechanism,
    HonakerCounter,
    NaiveCounter,
    binary_variance,
    honaker_variance,
    naive_variance,
    unweighted_fenwick,
)
from .counter import ContinualCounter
from .error import ContinualError, expected_error
from .fenwick import column_counts, fenwick_matrices
from .kary import KaryCounter, kary_error, kary_weights
from .negdigit import NegDigitCounter, balanced_digits, negdigit_error, negdigit_weights
from .report import error_table, format_table
from .toeplitz import BLT, BLTCounter, SqrtCounter, ToeplitzCounter, fit_blt, sqrt_coefficients, sqrt_error
from .weights import FenwickWeights, optimal_weights, weights_sensitivity

__all__ = [
    "BLT",
    "BLTCounter",
    "BinaryMechanism",
    "ContinualCounter",
    "ContinualError",
    "FenwickWeights",
    "HonakerCounter",
    "KaryCounter",
    "NaiveCounter",
    "NegDigitCounter",
    "SqrtCounter",
    "ToeplitzCounter",
    "binary_variance",
    "column_counts",
    "error_table",
    "expected_error",
    "fenwick_matrices",
    "fit_blt",
    "format_table",
    "honaker_variance",
    "kary_error",
    "kary_weights",
    "naive_variance",
    "balanced_digits",
    "negdigit_error",
    "negdigit_weights",
    "optimal_weights",
    "sqrt_coefficients",
    "sqrt_error",
    "unweighted_fenwick",
    "weights_sensitivity",
]
