"""sparsedp: differentially private release of linear queries on sparse linear operators.

A workload ``W`` (what to answer), a strategy ``M`` (what to measure with noise), a privacy budget:
sparsedp measures ``y = M x + z``, reconstructs ``x_hat`` and answers ``W x_hat``.

>>> import numpy as np, sparsedp
>>> x = np.array([3, 0, 5, 2, 7, 1, 0, 4])
>>> mech = sparsedp.MatrixMechanism(sparsedp.workloads.prefix(8), sparsedp.strategies.fenwick(8), epsilon=1.0)
>>> release = mech.run(x, rng=0)
>>> release.answers.shape
(8,)
"""

from . import accuracy, consistency, executors, inference, noise, operators, privacy, strategies, workloads
from .accuracy import ErrorReport, expected_error
from .errors import (
    BudgetExceededError,
    InfeasibleConstraintsError,
    InvalidPrivacyParameterError,
    NegativeCountError,
    FractionalCountError,
    NonFiniteInputError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
    InputBoundError,
    ReleaseExistsError,
    UnsafeFileError,
)
from . import flows, marginals, topdown, trees  # each registers its readers with sparsedp.load_release
from .marginals import Domain
from .marginals.kron import kron  # implicit KronOperator (operators.kron is the explicit product)
from .inference import Reconstruction, l1_fit, least_squares, nnls, reconstruct
from .mechanism import MatrixMechanism, Release
from .measure import Measurement, MeasurementPlan, measure, plan_measurement
from .operators import Operator, SparseOperator, aslinearoperator, scale_rows, sensitivity, vstack
from .optimize import OptimizedStrategy, optimize  # sparsedp.optimize(W) is the function (issue 11)
from .privacy import Accountant, PrivacyCost
from . import releases
from .releases import ReleaseResult, load_release

__version__ = "0.1.0"

__all__ = [
    "accuracy",
    "consistency",
    "executors",
    "flows",
    "inference",
    "marginals",
    "topdown",
    "trees",
    "Domain",
    "noise",
    "operators",
    "optimize",
    "OptimizedStrategy",
    "privacy",
    "strategies",
    "workloads",
    "Accountant",
    "BudgetExceededError",
    "ErrorReport",
    "InfeasibleConstraintsError",
    "InvalidPrivacyParameterError",
    "MatrixMechanism",
    "Measurement",
    "MeasurementPlan",
    "measure",
    "plan_measurement",
    "NegativeCountError",
    "FractionalCountError",
    "NonFiniteInputError",
    "Operator",
    "PrivacyCost",
    "Reconstruction",
    "Release",
    "ReleaseResult",
    "releases",
    "ShapeError",
    "SparseDPError",
    "SparseOperator",
    "UnsupportedStructureError",
    "InputBoundError",
    "ReleaseExistsError",
    "UnsafeFileError",
    "aslinearoperator",
    "expected_error",
    "kron",
    "l1_fit",
    "least_squares",
    "load_release",
    "nnls",
    "reconstruct",
    "scale_rows",
    "sensitivity",
    "vstack",
]
