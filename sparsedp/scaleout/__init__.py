"""Scale-out releases: hierarchical (tree) histograms on partitioned data, chunk by chunk on Dask.

Each chunk of ``k^j`` leaves is a complete subtree of the balanced ``k``-ary tree: workers measure
its nodes through the one measurement path (independent per-chunk noise streams), run the upward
pass of the O(n) two-pass BLUE and return only the subtree root's summary; the few top levels are
measured and solved on the driver; the downward pass runs per chunk and writes the output chunk.
The budget is charged once, on the driver, before any noise is drawn.  See ``docs/scaleout.md``.

Modules: :mod:`~sparsedp.scaleout.tree` (the chunked tree, budgets and scales),
:mod:`~sparsedp.scaleout.chunked` (inputs and outputs), :mod:`~sparsedp.scaleout.passes` (the
two passes split at a subtree root), :mod:`~sparsedp.scaleout.subtree` (the per-chunk tasks),
:mod:`~sparsedp.scaleout.top` (the top measurement and solve), :mod:`~sparsedp.scaleout.release`
(the driver), :mod:`~sparsedp.scaleout.records` (Parquet / CSV records binned into the leaf
histogram part by part, then released), :mod:`~sparsedp.scaleout.lue` (LUE-DPTree: per-node
budgets on SC / top-down k-ary trees, chunks that are subtrees of any shape),
:mod:`~sparsedp.scaleout.matrix` (``MatrixMechanism.run`` with a hierarchical strategy on
partitioned data).
"""

from .chunked import as_input, as_output, open_array
from .lue import LUEScaleoutRelease, TopTree, TreeShape, chunk_roots, release_lue
from .matrix import ScaleoutMatrixRelease, hierarchical_branching
from .passes import UpwardState, downward, upward
from .records import PartCounts, RecordPart, bin_to_histogram, record_parts, release_records
from .release import ScaleoutRelease, chunk_seeds, release_hierarchical
from .subtree import ChunkSpec, ChunkSummary
from .tree import ChunkedTree, check_chunking, chunk_layout, default_chunk, level_budgets, level_coverage

__all__ = [
    "ChunkSpec",
    "ChunkSummary",
    "ChunkedTree",
    "LUEScaleoutRelease",
    "PartCounts",
    "RecordPart",
    "ScaleoutMatrixRelease",
    "ScaleoutRelease",
    "TopTree",
    "TreeShape",
    "UpwardState",
    "as_input",
    "as_output",
    "bin_to_histogram",
    "check_chunking",
    "chunk_layout",
    "chunk_roots",
    "chunk_seeds",
    "default_chunk",
    "downward",
    "hierarchical_branching",
    "level_budgets",
    "level_coverage",
    "open_array",
    "record_parts",
    "release_hierarchical",
    "release_lue",
    "release_records",
    "upward",
]
