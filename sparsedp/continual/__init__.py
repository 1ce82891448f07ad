"""Continual release of running sums (seed 000): Fenwick strategy, optimal weights, online counters.

* :func:`fenwick_matrices` -- sparse ``(M_N, B_N)`` with ``W_N = B_N M_N``.
* :func:`optimal_weights` -- the diagonal of eq. 5.10 by FDA (every ``N``) or SQP (reference).
* :func:`expected_error` -- per-step and total variance of a weighted Fenwick release.
* :class:`ContinualCounter` -- online, ``O(log N)`` per step, Laplace (``epsilon``) or Gaussian (``rho``),
  save / restore.
* Baselines: :class:`NaiveCounter`, :class:`BinaryMechanism`, :class:`HonakerCounter`,
  :func:`unweighted_fenwick`.
* Best pure-DP counter here: :class:`GLSTreeCounter` (mixed-radix tree, every node measured,
  optimal per-level weights, full GLS; the release is ``s_t + e_t`` with data-independent ``e``).
* :func:`adaptive_run` and :mod:`.adaptive`: why ``s_t + e_t`` counters are private against adaptive
  streams.
* Every counter enforces an increment domain (``increments="counts"``: non-negative integers with a
  running sum ``<= 2^50``; ``"unit"``: reals in ``[0, 1]``), refusing anything else with
  :class:`~sparsedp.errors.InputBoundError` before the step; takes ``accountant=`` (charged once, at
  creation, before any noise, with the measurement's ledger entry); draws every noise value through
  :func:`sparsedp.measure.plan_measurement` (its strategy's rows with per-row scales, the plan's
  noise stream); uses exact discrete noise by default (``secure=True``; ``secure=False`` is the
  explicit opt-out to float64 noise); and exposes ``measured_strategy()`` / ``noise_scales()`` and
  ``plan`` for audits.
* Beyond the seed: :class:`KaryCounter` (k-ary trees, optimal per-level weights, streaming BLUE),
  :class:`NegDigitCounter` (k-ary tree with negative digits, Andersson-Pagh-Torkamani 2024),
  :class:`SqrtCounter` (square-root factorisation, zCDP), :class:`BLTCounter` / :func:`fit_blt`.
* :class:`OptimizedCounter` (issue 11): any strategy from :func:`sparsedp.optimize` for the prefix
  workload (weighted trees, p-Identity), run online as ``s_t + e_t``.
"""

from .adaptive import adaptive_run
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
from .glstree import (
    GLSTreeCounter,
    default_radices,
    gls_noise_offsets,
    gls_tree_error,
    gls_tree_weights,
    mixed_layout,
    path_variances,
)
from .kary import KaryCounter, kary_error, kary_weights
from .negdigit import NegDigitCounter, balanced_digits, negdigit_error, negdigit_weights
from .optimized import OptimizedCounter, optimized_counter_error, optimized_prefix_strategy
from .report import error_table, format_table
from .toeplitz import BLT, BLTCounter, SqrtCounter, ToeplitzCounter, fit_blt, sqrt_coefficients, sqrt_error
from .units import StreamTruncation, unit_increments
from .weights import FenwickWeights, optimal_weights, weights_sensitivity

__all__ = [
    "BLT",
    "BLTCounter",
    "BinaryMechanism",
    "ContinualCounter",
    "ContinualError",
    "FenwickWeights",
    "GLSTreeCounter",
    "HonakerCounter",
    "KaryCounter",
    "NaiveCounter",
    "NegDigitCounter",
    "OptimizedCounter",
    "SqrtCounter",
    "StreamTruncation",
    "ToeplitzCounter",
    "adaptive_run",
    "binary_variance",
    "column_counts",
    "error_table",
    "expected_error",
    "fenwick_matrices",
    "default_radices",
    "fit_blt",
    "gls_noise_offsets",
    "gls_tree_error",
    "gls_tree_weights",
    "format_table",
    "honaker_variance",
    "kary_error",
    "kary_weights",
    "mixed_layout",
    "naive_variance",
    "balanced_digits",
    "negdigit_error",
    "negdigit_weights",
    "optimal_weights",
    "optimized_counter_error",
    "optimized_prefix_strategy",
    "path_variances",
    "sqrt_coefficients",
    "sqrt_error",
    "unit_increments",
    "unweighted_fenwick",
    "weights_sensitivity",
]
