"""DP low-rank matrix completion (seed 003): Laplace-protected observed entries, then completion.

>>> import numpy as np, scipy.sparse as sp
>>> from sparsedp.completion import privatize_observations, dlnm_qr, rse
>>> g = np.random.default_rng(0)
>>> U, V = g.standard_normal((60, 2)), g.standard_normal((50, 2))
>>> i, j = np.nonzero(g.random((60, 50)) < 0.5)
>>> observed = sp.csr_matrix(((U @ V.T)[i, j], (i, j)), shape=(60, 50))
>>> release = privatize_observations(observed, epsilon=50.0, bounds=(-8, 8), rng=1)
>>> release.scale
0.32
>>> fit = dlnm_qr(release.matrix, rank=2)
>>> rse(fit, (U, V)) < 0.2
True

Entry points: :func:`privatize_observations` (the privacy step), the completion methods
:func:`dlnm_qr`, :func:`lmafit_sor`, :func:`alternating_minimization`, :func:`soft_impute` (all take the
observed entries as a ``scipy.sparse`` matrix and return a :class:`CompletionResult` with factors),
and the metrics :func:`rse`, :func:`oracle_rse` (asymptotic floor) and :func:`oracle_least_squares`
(the exact known-subspace oracle).  Given a release (or ``noise_std=``) every method fits the
noise-calibrated nuclear-norm penalised model (:func:`calibrated_lambda`); a bare sparse matrix gets
rank-``r`` least squares.  See ``docs/completion.md``.
"""

from .als import alternating_minimization
from .dlnm_qr import column_shrink, dlnm_qr
from .lmafit import lmafit_sor
from .metrics import oracle_rse, rse
from .oracle import OracleFit, oracle_least_squares
from .privacy import PrivateObservations, observation_sensitivity, privatize_observations
from .report import CompletionResult, History
from .shrinkage import calibrated_lambda
from .soft_impute import noise_threshold, soft_impute
from .synthetic import synthetic_problem

METHODS = {
    "dlnm-qr": dlnm_qr,
    "sor": lmafit_sor,
    "am": alternating_minimization,
    "soft": soft_impute,
}

__all__ = [
    "METHODS",
    "CompletionResult",
    "History",
    "OracleFit",
    "PrivateObservations",
    "alternating_minimization",
    "calibrated_lambda",
    "column_shrink",
    "dlnm_qr",
    "lmafit_sor",
    "noise_threshold",
    "observation_sensitivity",
    "oracle_least_squares",
    "oracle_rse",
    "privatize_observations",
    "rse",
    "soft_impute",
    "synthetic_problem",
]
