"""Histograms on interval trees of any shape with per-node budgets and O(n) BLUE (seed 004, LUE-DPTree).

See ``docs/trees.md``.  Builders return networkx graphs whose nodes carry ``interval = (lo, hi)``
(0-based, half-open); every function also accepts the flat :class:`IntervalTree` form, which the
``*_layout`` builders produce directly for large ``n``.
"""

from .blue import blue
from .budget import (
    allocate_budget,
    expected_range_error,
    level_budget,
    normalise_budget,
    optimal_error,
    path_sum_bounds,
    path_sums,
    uniform_budget,
)
from .build import (
    IntervalTree,
    as_interval_tree,
    check_structure,
    kary_layout,
    kary_tree,
    to_graph,
    tree_from_splits,
)
from .compile import to_constraints, to_strategy
from .coverage import answer_ranges, coverage_probabilities, decompose
from .gls import gls_budget, gls_error
from .publishers import (
    Boost,
    BoostUN,
    Dwork,
    HistogramRelease,
    LUEDPTree,
    Privelet,
    TreePublisher,
)
from .sc import choose_branching, sc_layout, sc_tree, subtree_coverage

__all__ = [
    "IntervalTree",
    "as_interval_tree",
    "check_structure",
    "to_graph",
    "kary_layout",
    "kary_tree",
    "tree_from_splits",
    "sc_layout",
    "sc_tree",
    "choose_branching",
    "subtree_coverage",
    "to_strategy",
    "to_constraints",
    "coverage_probabilities",
    "decompose",
    "answer_ranges",
    "allocate_budget",
    "optimal_error",
    "expected_range_error",
    "path_sums",
    "path_sum_bounds",
    "normalise_budget",
    "uniform_budget",
    "level_budget",
    "gls_budget",
    "gls_error",
    "blue",
    "TreePublisher",
    "HistogramRelease",
    "LUEDPTree",
    "Boost",
    "BoostUN",
    "Privelet",
    "Dwork",
]
