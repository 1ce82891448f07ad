"""TopDown-class releases of hierarchical tables: geography x categories (issue 28).

A table with geography columns (any depth, unbalanced) and count columns -- or record rows -- becomes
a :class:`Hierarchy` x :class:`CellDomain` with its counts (:class:`HierarchicalTable`,
:func:`read_table`).  :func:`topdown` measures every level's cells (and optional marginals) through
the one measurement path with exact noise (discrete Gaussian, zCDP; or discrete Laplace, pure DP),
a budget split across levels, then post-processes the measurements only: the GLS over the whole
hierarchy per component of the cells (tree x Kronecker structure: exact, ``O(units x cells)``, with
exact variances), invariants exact, and non-negative integer counts that add up at every level and
cell (top-down projection and controlled rounding).  The result is a :class:`TopDownRelease`
(``to_pandas()``: one row per unit; ``to_release()``: the common release model).

:func:`sparsedp.topdown.scaleout.topdown_scaleout` makes the same release chunked by
subtree on Dask, each worker reading, measuring, estimating, rounding and writing whole subtrees
(the noise keyed by subtree, :mod:`sparsedp.topdown.subtrees`, so both publish the same bits).
"""

from .design import Invariant, LevelPlan, OptimalSplit, QueryBlock, SplitChoice, TopDownDesign, optimal_split, plan_topdown
from .gls import HierarchyGLS, hierarchy_gls
from .hierarchy import CellDomain, HierarchicalTable, Hierarchy, expand_columns, read_table
from .scaleout import (ChunkedTopDownRelease, ParquetSource, SyntheticNation, load_chunked,  # registers the chunked
                       topdown_scaleout)  # directory's reader with load_release
from .table_file import load_table_release  # registers the reader of a table (.csv / .parquet) and its record
from .release import (
    TopDownRelease,
    estimate_from_measurements,
    integer_counts,
    load_topdown,
    release_from_measurements,
    resolve_invariants,
    topdown,
    topdown_from_result,
)

__all__ = [
    "CellDomain",
    "ChunkedTopDownRelease",
    "HierarchicalTable",
    "Hierarchy",
    "HierarchyGLS",
    "Invariant",
    "LevelPlan",
    "OptimalSplit",
    "ParquetSource",
    "QueryBlock",
    "SplitChoice",
    "SyntheticNation",
    "TopDownDesign",
    "TopDownRelease",
    "estimate_from_measurements",
    "expand_columns",
    "hierarchy_gls",
    "integer_counts",
    "load_chunked",
    "load_table_release",
    "load_topdown",
    "optimal_split",
    "plan_topdown",
    "read_table",
    "release_from_measurements",
    "resolve_invariants",
    "topdown",
    "topdown_from_result",
    "topdown_scaleout",
]
