"""Multi-dimensional releases: product domains, implicit Kronecker operators, and marginal
workloads at ResidualPlanner's optimum (Xiao et al., NeurIPS 2023) with exact noise.

* :class:`Domain` -- named attributes with sizes; records as integer codes.
* :class:`KronOperator`, :class:`KronStack`, :func:`marginal_operator` -- implicit (sums of)
  Kronecker products with factorised sensitivity and norms.
* :class:`KronStrategy` (made by :func:`sparsedp.optimize.optimize_kron`) -- Kronecker strategies for Kronecker workloads
  (2-D ranges) from optimised 1-D factors, error by factorisation.
* :func:`release_kron`, :class:`KronRelease` -- measure with a Kronecker strategy by mode products
  (never formed), factor-wise GLS, workload answers and variances from the factored covariance;
  :func:`kron_squared_error` evaluates a release on a Kronecker workload without its answers.
* :func:`optimize_marginals_laplace` -- pure-DP weighted-marginals strategies (HDMM's Marginals).
* :func:`contrast_basis`, :func:`residual_operator` -- the residual basis.
* :func:`select_residuals` -- the optimal noise per residual (sum / weighted sum / max variance).
* :func:`release_marginals` -- measure (exact discrete Gaussian, through ``sparsedp.measure``) and
  reconstruct every marginal with its exact variance.
* :class:`MarginalWorkload`, :func:`marginal_workload` -- a marginal workload for
  :func:`sparsedp.optimize` (residual optimum under Gaussian noise, weighted marginals under Laplace).
* :func:`synthetic_records` -- latent-class synthetic records for examples and benchmarks.
"""

from .domain import Domain
from .kron import KronOperator, KronStack, apply_factors, marginal_operator
from .kron_opt import KronStrategy, factor_trace
from .kron_release import KronRelease, kron_squared_error, release_kron
from .nonneg import NonNegativeMarginals, nonnegative_marginals
from .pure import MarginalsStrategy, optimize_marginals_laplace
from .pure_release import PureMarginalRelease, release_marginals_laplace
from .release import MarginalRelease, marginal_tables, release_marginals
from .residual import contrast_basis, residual_operator
from .select import ResidualSelection, closure, marginals_up_to, select_residuals
from .synthetic import synthetic_records
from .workload import MarginalWorkload, marginal_workload

__all__ = [
    "Domain",
    "KronOperator",
    "KronRelease",
    "KronStack",
    "KronStrategy",
    "MarginalRelease",
    "MarginalWorkload",
    "MarginalsStrategy",
    "NonNegativeMarginals",
    "PureMarginalRelease",
    "ResidualSelection",
    "apply_factors",
    "closure",
    "contrast_basis",
    "factor_trace",
    "kron_squared_error",
    "marginal_operator",
    "marginal_tables",
    "marginal_workload",
    "marginals_up_to",
    "nonnegative_marginals",
    "optimize_marginals_laplace",
    "release_kron",
    "release_marginals",
    "release_marginals_laplace",
    "residual_operator",
    "select_residuals",
    "synthetic_records",
]

