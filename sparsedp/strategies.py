"""Strategy builders: the queries ``M`` that are actually measured with noise.

Each builder returns a :class:`~sparsedp.operators.SparseOperator` tagged with its structure, so that
reconstruction and error analysis can use an exact fast path:

==================  ======================  ==============================  =======================
builder             structure               ``Delta_1`` (max column L1)     fast inverse / estimator
==================  ======================  ==============================  =======================
``identity(n)``     ``identity``            1                               ``x = y``
``hierarchical``    ``tree``                number of levels                O(n) two-pass GLS
``fenwick(n)``      ``fenwick``             ``floor(log2 n) + 1``           sparse ``M^-1`` (O(n))
``haar(n)``         ``haar``                ``<= ceil(log2 n) + 1`` (*)     ``M^T diag(1/||m_i||^2)``
==================  ======================  ==============================  =======================

(*) equal for powers of two; the exact value is in :func:`haar`'s docstring (9.40033 at n = 365).

``weighted(M, w)`` is ``diag(w) M`` and keeps the structure of ``M``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

from .errors import ShapeError
from .intervals import IntervalRows
from .operators import Operator, SparseOperator, aslinearoperator, scale_rows
from .workloads import _check_n

__all__ = [
    "TreeLayout",
    "identity",
    "hierarchical",
    "fenwick",
    "fenwick_inverse",
    "haar",
    "weighted",
    "from_matrix",
]


@dataclass(frozen=True)
class TreeLayout:
    """A tree over ``n`` ordered leaves, stored level by level (level 0 = leaves).

    ``child_starts[l]`` (length ``sizes[l + 1] + 1``): node ``i`` of level ``l + 1`` has the children
    ``child_starts[l][i] : child_starts[l][i + 1]`` of level ``l``.  ``leaf_starts[l]`` (length
    ``sizes[l] + 1``) gives each node's leaf interval ``[leaf_starts[l][i], leaf_starts[l][i + 1])``.
    Strategy rows are ordered root first: level ``L - 1`` (the root), ..., level 0 (the leaves);
    ``row_offsets[l]`` is the first row of level ``l``.
    """

    n: int
    sizes: tuple[int, ...]
    child_starts: tuple[np.ndarray, ...]
    leaf_starts: tuple[np.ndarray, ...]
    row_offsets: tuple[int, ...]
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def levels(self) -> int:
        return len(self.sizes)

    def bfs(self) -> tuple[np.ndarray, np.ndarray]:
        """The tree in strategy row order (breadth-first, root first) as ``(parent, level_start)``:
        ``parent[r]`` is the row of row ``r``'s parent (``-1`` for the root) and the rows of depth
        ``d`` are ``level_start[d] : level_start[d + 1]``.  Computed once per layout."""
        if "bfs" in self._cache:
            return self._cache["bfs"]
        parent = np.full(self.nodes, -1, dtype=np.int64)
        for lev in range(self.levels - 1):
            counts = np.diff(self.child_starts[lev])
            rows = self.row_offsets[lev] + np.arange(self.sizes[lev])
            parent[rows] = self.row_offsets[lev + 1] + np.repeat(np.arange(self.sizes[lev + 1]), counts)
        level_start = np.array([self.row_offsets[lev] for lev in reversed(range(self.levels))] + [self.nodes])
        self._cache["bfs"] = (parent, level_start)
        return parent, level_start

    def level_rows(self, arr: np.ndarray, level: int) -> np.ndarray:
        """The part of a per-row array (strategy row order) that belongs to ``level``."""
        off = self.row_offsets[level]
        return arr[off : off + self.sizes[level]]

    @property
    def nodes(self) -> int:
        return int(sum(self.sizes))

    @staticmethod
    def balanced(n: int, branching: int) -> "TreeLayout":
        """Group ``branching`` consecutive nodes per parent, level by level, up to one root."""
        return TreeLayout.grouped(n, lambda level, m: branching)

    @staticmethod
    def grouped(n: int, radix: Callable[[int, int], int]) -> "TreeLayout":
        """Build bottom-up: level ``l + 1`` groups ``radix(l, m)`` consecutive nodes of level ``l``
        (``m`` of them; the last group may be smaller), until one root remains."""
        sizes = [n]
        child_starts: list[np.ndarray] = []
        leaf_starts = [np.arange(n + 1, dtype=np.int64)]
        while sizes[-1] > 1:
            m = sizes[-1]
            r = int(radix(len(child_starts), m))
            parents = -(-m // r)
            starts = np.minimum(np.arange(parents + 1, dtype=np.int64) * r, m)
            child_starts.append(starts)
            leaf_starts.append(leaf_starts[-1][starts])
            sizes.append(parents)
        offsets = []
        acc = 0
        for size in reversed(sizes):
            offsets.append(acc)
            acc += size
        return TreeLayout(
            n=n,
            sizes=tuple(sizes),
            child_starts=tuple(child_starts),
            leaf_starts=tuple(leaf_starts),
            row_offsets=tuple(reversed(offsets)),
        )

    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """Every node's leaf interval ``[lo, hi)``, rows root first."""
        starts = [self.leaf_starts[level] for level in reversed(range(self.levels))]
        return np.concatenate([s[:-1] for s in starts]), np.concatenate([s[1:] for s in starts])

    def matrix(self) -> sp.csr_matrix:
        """Node-by-leaf 0/1 matrix, rows root first; ``n * levels`` non-zeros."""
        lo, hi = self.intervals()
        return _interval_rows(lo, hi, self.n)


def _interval_rows(lo: np.ndarray, hi: np.ndarray, n: int, values: np.ndarray | None = None) -> sp.csr_matrix:
    """CSR matrix whose row ``r`` has ones (or ``values[r]``) on columns ``lo[r] : hi[r]``."""
    lengths = hi - lo
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    indices = np.repeat(lo - indptr[:-1], lengths) + np.arange(indptr[-1])
    data = np.ones(indptr[-1]) if values is None else np.repeat(values, lengths)
    return sp.csr_matrix((data, indices, indptr), shape=(lo.size, n))


def identity(n: int) -> SparseOperator:
    """Measure every count directly (Dwork et al.): ``Delta_1 = 1``."""
    n = _check_n(n)
    return SparseOperator(sp.identity(n, format="csr"), name=f"identity({n})", structure="identity")


def hierarchical(n: int, branching: int = 16) -> IntervalRows:
    """Hierarchical (interval tree) strategy of Hay et al. (2010): one row per tree node.

    Every leaf lies in exactly one node per level, so ``Delta_1 = Delta_2^2 = levels``
    (``hierarchical(1024, 2)`` has 11 levels).  Reconstruction uses the O(n) two-pass GLS estimator.
    The operator is implicit (:class:`~sparsedp.intervals.IntervalRows`: node intervals, measured by
    prefix sums, calibrated by exact integer coverage); ``tosparse()`` builds the ``n * levels``
    matrix only when asked.

    ``branching`` defaults to 16, the best measured: expected GLS error per query at ``eps = 1``
    (``MatrixMechanism(W, hierarchical(n, k)).expected_error() / queries``), for k = 2 / 4 / 8 /
    16 / 32 at n = 65536: all ranges 1717 / 985 / 1015 / 845 / 1411, prefixes 1003 / 573 / 566 /
    501 / 786, single bins 351 / 128 / 87 / 47 / 49; at n = 1024 it is within 23% of the best k
    on each workload.  It is also the smallest and fastest tree (at 2^24, k = 2 took 26.1 s and
    10.8 GiB against range MSE 9,321 vs 20,050 for k = 16).  For a given workload,
    :func:`sparsedp.optimize` searches branchings and weights.
    """
    n = _check_n(n)
    if int(branching) != branching or branching < 2:
        raise ShapeError(f"branching must be an integer >= 2, got {branching!r}")
    layout = TreeLayout.balanced(n, int(branching))
    lo, hi = layout.intervals()
    return IntervalRows(n, lo, hi, name=f"hierarchical({n}, k={branching})", structure="tree", meta={"layout": layout})


def _lowbit(i: np.ndarray) -> np.ndarray:
    return i & -i


def fenwick(n: int) -> SparseOperator:
    """Fenwick (binary indexed tree) strategy of seed 000, Algorithm 5.2.

    Row ``i`` (1-based) sums ``x`` over ``(i - lowbit(i), i]``.  ``M`` is lower triangular and
    invertible, ``Delta_1 = floor(log2 n) + 1`` (Theorem 5.1, attained at column 1) and it has
    ``O(n log n)`` non-zeros.  Its inverse is sparse (:func:`fenwick_inverse`).
    """
    n = _check_n(n)
    i = np.arange(1, n + 1, dtype=np.int64)
    M = _interval_rows(i - _lowbit(i), i, n)
    return SparseOperator(M, name=f"fenwick({n})", structure="fenwick")


def fenwick_inverse(n: int) -> sp.csr_matrix:
    """Exact sparse inverse of :func:`fenwick`: ``x_i = c_i - sum_{children j} c_j``.

    The children of Fenwick node ``i`` are ``i - 2^t`` for ``2^t < lowbit(i)`` (their intervals tile
    ``(i - lowbit(i), i - 1]``), so row ``i`` of ``M^-1`` has ``1 + log2(lowbit(i))`` entries and the
    whole inverse ``O(n)``.
    """
    n = _check_n(n)
    i = np.arange(1, n + 1, dtype=np.int64)
    nchild = np.log2(_lowbit(i)).astype(np.int64)
    counts = nchild + 1
    rows = np.repeat(i - 1, counts)
    pos = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)  # 0 = diagonal
    cols = np.where(pos == 0, rows, rows - (1 << np.maximum(pos - 1, 0)))
    vals = np.where(pos == 0, 1.0, -1.0)
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def haar(n: int) -> SparseOperator:
    """Haar wavelet strategy (Privelet, Xiao et al. 2010), for any ``n``.

    Row 0 is the total; every interval ``[lo, hi)`` of length >= 2 in the dyadic split tree
    (left part ``ceil(len / 2)``) gives one row ``(|R| 1_L - |L| 1_R) / max(|L|, |R|)``.  For
    ``n = 2^m`` these are the usual ``+1 / -1`` wavelets.  The rows are orthogonal and there are
    ``n`` of them, so ``M^-1 = M^T diag(1 / ||m_i||^2)``.

    Sensitivity: column ``j`` holds the total's 1 and, for every split ``[lo, hi) -> L, R`` on the
    path to bin ``j``, ``|R| / max(|L|, |R|)`` if ``j`` is in ``L`` (``|L| / max(...)`` if in ``R``),
    so ``Delta_1 = 1 + max_j sum_{splits above j} |other part| / |larger part|``.  Each term is at
    most 1, so ``Delta_1 <= ceil(log2 n) + 1``, with equality for powers of two only:
    ``sensitivity(haar(365)) = 9.40033`` (not 10), ``haar(1024)`` gives 11.
    """
    n = _check_n(n)
    lo_all, hi_all, mid_all = [], [], []
    lo, hi = np.array([0]), np.array([n])
    while lo.size:
        keep = hi - lo >= 2
        lo, hi = lo[keep], hi[keep]
        mid = lo + (hi - lo + 1) // 2
        lo_all.append(lo), hi_all.append(hi), mid_all.append(mid)
        lo, hi = np.concatenate([lo, mid]), np.concatenate([mid, hi])
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
    lo = np.concatenate(lo_all)
    hi = np.concatenate(hi_all)
    mid = np.concatenate(mid_all)
    nl, nr = (mid - lo).astype(float), (hi - mid).astype(float)
    top = np.maximum(nl, nr)
    left = _interval_rows(lo, mid, n, nr / top)
    right = _interval_rows(mid, hi, n, -nl / top)
    details = left + right
    M = sp.vstack([sp.csr_matrix(np.ones((1, n))), details], format="csr")
    row_sq = np.concatenate(([float(n)], nl * (nr / top) ** 2 + nr * (nl / top) ** 2))
    # The same rows as integers times a per-row factor: |R| 1_L - |L| 1_R = top * row.  Exact noise
    # measures the integer rows (an exact grid) with per-row scales, then rescales (sparsedp.measure).
    int_rows = sp.vstack([sp.csr_matrix(np.ones((1, n))),
                          _interval_rows(lo, mid, n, nr) + _interval_rows(mid, hi, n, -nl)], format="csr")
    factors = np.concatenate(([1.0], 1.0 / top))
    return SparseOperator(M, name=f"haar({n})", structure="haar",
                          meta={"row_sq_norms": row_sq, "integer_rows": (int_rows, factors)})


def weighted(M: Any, w: Any) -> SparseOperator:
    """``diag(w) M``: scale each measured query (seed 000, eq. 5.8).  Keeps ``M``'s fast paths.

    With unit-scale noise on ``diag(w) M x`` the measurement of row ``i`` has noise ``z_i / w_i``; the
    sensitivity is that of the weighted matrix, ``max_j sum_i |w_i M_ij|``.
    """
    return scale_rows(M, w)


def from_matrix(A: Any, name: str = "strategy") -> Operator:
    """Any user matrix as a strategy.  A square lower-triangular matrix with a non-zero diagonal is
    tagged ``lower_triangular`` (reconstructed by a sparse triangular solve)."""
    op = aslinearoperator(A, name=name)
    if isinstance(op, SparseOperator) and op.structure == "general" and op.shape[0] == op.shape[1]:
        mat = op.matrix
        if sp.triu(mat, k=1).nnz == 0 and np.all(mat.diagonal() != 0):
            op.structure = "lower_triangular"
    return op
