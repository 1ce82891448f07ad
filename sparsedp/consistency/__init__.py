"""Optimal consistent release under families of linear constraints (seed 002).

``solve(x_noisy, constraints, variances=None, method="auto")`` returns the point closest to
``x_noisy`` (in the norm weighted by ``1 / variances``) that satisfies every constraint.
See ``docs/consistency.md``.
"""

from .accuracy import projection_variances
from .blocks import BatchedBlock, Block, FixedBlock, LayoutTreeBlock, SparseBlock, TreeBlock
from .families import ConstraintFamily, FixedValues, LinearConstraints, SpanConstraints, TreeConstraints
from .projectors import HAVE_CHOLMOD, SPDSolver, tree_project
from .restaurant import (
    COMBOS,
    ITEMS,
    RestaurantRelease,
    RestaurantSales,
    check_sales,
    restaurant,
    restaurant_constraints,
    restaurant_layout,
    restaurant_release,
    restaurant_sensitivity,
    restaurant_tree_values,
)
from .residuals import ResidualReport, accurate_residual
from .solvers import METHODS, ConsistencyResult, Problem, ToleranceUnattainableError, compile_constraints, solve
from .treespan import TreeSpan, detect_tree_span, reaggregate, tree_span_solve

__all__ = [
    "FlowConservation",
    "BatchedBlock",
    "Block",
    "COMBOS",
    "ConsistencyResult",
    "ConstraintFamily",
    "FixedBlock",
    "FixedValues",
    "HAVE_CHOLMOD",
    "ITEMS",
    "LayoutTreeBlock",
    "LinearConstraints",
    "METHODS",
    "Problem",
    "RestaurantRelease",
    "RestaurantSales",
    "ResidualReport",
    "SPDSolver",
    "SparseBlock",
    "SpanConstraints",
    "TreeBlock",
    "TreeConstraints",
    "TreeSpan",
    "accurate_residual",
    "compile_constraints",
    "detect_tree_span",
    "projection_variances",
    "reaggregate",
    "check_sales",
    "restaurant",
    "restaurant_constraints",
    "restaurant_layout",
    "restaurant_release",
    "restaurant_sensitivity",
    "restaurant_tree_values",
    "solve",
    "ToleranceUnattainableError",
    "tree_project",
    "tree_span_solve",
]


def __getattr__(name: str):
    # FlowConservation lives with the flows subsystem (it needs road networks); re-exported here
    if name == "FlowConservation":
        from ..flows.family import FlowConservation

        return FlowConservation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
