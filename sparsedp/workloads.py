"""Workload builders: the linear queries ``W`` a user wants answered.

Small workloads are sparse matrices; the large ones (:func:`prefix`, :func:`all_ranges`,
:func:`range_queries`) are implicit operators whose rows are never materialised: they answer
through the prefix-sum vector ``S = [0, cumsum(x)]`` (a range ``[lo, hi]`` is ``S[hi+1] - S[lo]``)
and give their column norms and image norms in closed form.  :func:`weighted_union` stacks
workloads with weights, ``[sqrt(c_1) W_1; ...]``, so that one objective is ``sum_i c_i E(W_i)``.

Indices are 0-based and ranges inclusive: ``(lo, hi)`` is ``x[lo] + ... + x[hi]``.
"""

from __future__ import annotations

import itertools
import math
import numbers
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from .errors import ShapeError, SparseDPError
from .operators import Operator, SparseOperator, aslinearoperator

__all__ = [
    "identity",
    "total",
    "prefix",
    "all_ranges",
    "range_queries",
    "marginals",
    "from_matrix",
    "weighted_union",
    "PrefixWorkload",
    "AllRangesWorkload",
    "RangeQueriesWorkload",
    "WeightedUnionWorkload",
]


def _check_n(n: Any) -> int:
    try:
        value = int(n)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"domain size must be a positive integer, got {n!r}") from exc
    if value != n or value < 1:
        raise ShapeError(f"domain size must be a positive integer, got {n!r}")
    return value


def _prefix_moments(X: np.ndarray | sp.spmatrix) -> tuple[np.ndarray, np.ndarray]:
    """For each column ``u`` of ``X``: ``(sum_k c_k, sum_k c_k^2)`` with ``c = cumsum(u)``.

    Sparse columns are handled piecewise: ``cumsum(u)`` is constant between non-zeros, so a column
    with ``s`` non-zeros costs ``O(s)``, not ``O(n)``.
    """
    if not sp.issparse(X):
        C = np.cumsum(np.asarray(X, dtype=np.float64), axis=0)
        return C.sum(axis=0), np.einsum("ij,ij->j", C, C)
    n, k = X.shape
    A = sp.csc_matrix(X, dtype=np.float64)
    A.sum_duplicates()
    A.sort_indices()
    counts = np.diff(A.indptr)
    cols = np.repeat(np.arange(k), counts)
    cs = np.cumsum(A.data)
    start = np.concatenate(([0.0], cs))[A.indptr[:-1]]
    c = cs - np.repeat(start, counts)
    nxt = np.empty_like(A.indices)
    if A.indices.size:
        nxt[:-1] = A.indices[1:]
        last = A.indptr[1:] - 1
        nxt[last[counts > 0]] = n
    length = (nxt - A.indices).astype(np.float64)
    s1 = np.bincount(cols, weights=c * length, minlength=k)
    s2 = np.bincount(cols, weights=c * c * length, minlength=k)
    return s1, s2


def _zero_one_norms(counts: np.ndarray, p: int) -> np.ndarray:
    """Column ``p``-norms of a 0/1 matrix whose column ``j`` holds ``counts[j]`` ones."""
    if p == 1:
        return counts
    if p == 2:
        return np.sqrt(counts)
    raise SparseDPError(f"norm must be 1 or 2, got {p!r}")


class PrefixWorkload(Operator):
    """Running sums: ``W[i, j] = 1`` for ``j <= i`` (lower-triangular ones, ``n x n``).

    ``matvec`` is a cumulative sum; nothing ``n x n`` is stored.  Column ``j`` has ``n - j`` ones.
    """

    def __init__(self, n: int):
        n = _check_n(n)
        super().__init__((n, n), name=f"prefix({n})", structure="prefix")
        self.n = n

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return np.cumsum(np.ravel(x))

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return np.cumsum(np.ravel(y)[::-1])[::-1]

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.cumsum(X, axis=0)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.cumsum(Y[::-1], axis=0)[::-1]

    def tosparse(self) -> sp.csr_matrix:
        return _tril_ones(self.n)

    def column_norms(self, p: int = 1) -> np.ndarray:
        counts = np.arange(self.n, 0, -1, dtype=np.float64)
        return _zero_one_norms(counts, p)

    def image_sq_norms(self, X: np.ndarray | sp.spmatrix) -> np.ndarray:
        return _prefix_moments(X)[1]


def _tril_ones(n: int) -> sp.csr_matrix:
    rows = np.repeat(np.arange(n), np.arange(1, n + 1))
    starts = np.repeat(np.cumsum(np.arange(n + 1))[:-1], np.arange(1, n + 1))
    cols = np.arange(rows.size) - starts
    return sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(n, n))


class RangeQueriesWorkload(Operator):
    """Arbitrary range counts ``x[lo] + ... + x[hi]`` (inclusive, 0-based), answered via prefix sums."""

    def __init__(self, n: int, lo: np.ndarray, hi: np.ndarray, name: str | None = None):
        n = _check_n(n)
        lo = np.asarray(lo, dtype=np.int64).ravel()
        hi = np.asarray(hi, dtype=np.int64).ravel()
        if lo.shape != hi.shape:
            raise ShapeError("lo and hi must have the same length")
        if lo.size == 0:
            raise ShapeError("a range workload needs at least one range")
        if np.any(lo < 0) or np.any(hi >= n) or np.any(lo > hi):
            bad = int(np.flatnonzero((lo < 0) | (hi >= n) | (lo > hi))[0])
            raise ShapeError(
                f"range {bad} = ({lo[bad]}, {hi[bad]}) is not a valid inclusive range in [0, {n - 1}]"
            )
        super().__init__((lo.size, n), name=name or f"ranges({n}, {lo.size})", structure="ranges")
        self.n, self.lo, self.hi = n, lo, hi

    def _answers_from_prefix(self, S: np.ndarray) -> np.ndarray:
        return S[self.hi + 1] - S[self.lo]

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        S = np.zeros((self.n + 1,) + X.shape[1:])
        np.cumsum(X, axis=0, out=S[1:])
        return self._answers_from_prefix(S)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(np.ravel(x)[:, None])[:, 0]

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        G = np.zeros((self.n + 1, Y.shape[1]))
        np.add.at(G, self.hi + 1, Y)
        np.subtract.at(G, self.lo, Y)
        # S[k] = sum_{j<k} x[j]  =>  d/dx[j] = sum_{k>j} G[k]
        return np.cumsum(G[:0:-1], axis=0)[::-1]

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self._rmatmat(np.ravel(y)[:, None])[:, 0]

    def tosparse(self) -> sp.csr_matrix:
        lengths = self.hi - self.lo + 1
        rows = np.repeat(np.arange(self.lo.size), lengths)
        offsets = np.arange(rows.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        cols = np.repeat(self.lo, lengths) + offsets
        return sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=self.shape)

    def column_norms(self, p: int = 1) -> np.ndarray:
        diff = np.zeros(self.n + 1)
        np.add.at(diff, self.lo, 1.0)
        np.add.at(diff, self.hi + 1, -1.0)
        counts = np.cumsum(diff[:-1])
        return _zero_one_norms(counts, p)

    def image_sq_norms(self, X: np.ndarray | sp.spmatrix, block: int = 256) -> np.ndarray:
        """``||W X[:, j]||^2`` via prefix sums; a sparse ``X`` is densified ``block`` columns at a time
        (never as a whole: it may be an ``n x n`` sparse inverse)."""
        if not sp.issparse(X):
            Y = self._matmat(np.asarray(X, dtype=np.float64))
            return np.einsum("ij,ij->j", Y, Y)
        Xc = sp.csc_matrix(X)
        out = np.empty(Xc.shape[1])
        for start in range(0, Xc.shape[1], block):
            Y = self._matmat(Xc[:, start : start + block].toarray())
            out[start : start + block] = np.einsum("ij,ij->j", Y, Y)
        return out


class AllRangesWorkload(Operator):
    """Every range ``[lo, hi]``, ``0 <= lo <= hi < n``: ``n (n + 1) / 2`` queries, implicit.

    Rows are ordered by ``lo`` then ``hi``.  Column ``j`` lies in ``(j + 1)(n - j)`` ranges.  For a
    vector ``u`` with ``S = [0, cumsum(u)]`` (length ``n + 1``),
    ``||W u||^2 = sum_{a < b} (S_b - S_a)^2 = (n + 1) sum S^2 - (sum S)^2``, so image norms cost
    ``O(n)`` per column (``O(nnz)`` for sparse columns) although ``W`` has ``O(n^2)`` rows.
    """

    def __init__(self, n: int):
        n = _check_n(n)
        super().__init__((n * (n + 1) // 2, n), name=f"all_ranges({n})", structure="all_ranges")
        self.n = n

    def _pairs(self) -> tuple[np.ndarray, np.ndarray]:
        a, b = np.triu_indices(self.n + 1, k=1)
        return a, b

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        S = np.zeros((self.n + 1, X.shape[1]))
        np.cumsum(X, axis=0, out=S[1:])
        a, b = self._pairs()
        return S[b] - S[a]

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(np.ravel(x)[:, None])[:, 0]

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        a, b = self._pairs()
        G = np.zeros((self.n + 1, Y.shape[1]))
        for j in range(Y.shape[1]):
            G[:, j] = np.bincount(b, weights=Y[:, j], minlength=self.n + 1) - np.bincount(
                a, weights=Y[:, j], minlength=self.n + 1
            )
        return np.cumsum(G[:0:-1], axis=0)[::-1]

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self._rmatmat(np.ravel(y)[:, None])[:, 0]

    def tosparse(self) -> sp.csr_matrix:
        a, b = self._pairs()
        return RangeQueriesWorkload(self.n, a, b - 1).tosparse()

    def column_norms(self, p: int = 1) -> np.ndarray:
        j = np.arange(self.n, dtype=np.float64)
        counts = (j + 1) * (self.n - j)
        return _zero_one_norms(counts, p)

    def image_sq_norms(self, X: np.ndarray | sp.spmatrix) -> np.ndarray:
        s1, s2 = _prefix_moments(X)  # sums over S[1:], and S[0] = 0 adds nothing
        return (self.n + 1) * s2 - s1 * s1


def identity(n: int) -> SparseOperator:
    """Every single count ``x[i]`` (the histogram itself)."""
    n = _check_n(n)
    return SparseOperator(sp.identity(n, format="csr"), name=f"identity({n})", structure="identity")


def total(n: int) -> SparseOperator:
    """The single query ``sum(x)``."""
    n = _check_n(n)
    return SparseOperator(sp.csr_matrix(np.ones((1, n))), name=f"total({n})", structure="total")


def prefix(n: int) -> PrefixWorkload:
    """Running sums ``x[0] + ... + x[i]`` for every ``i`` (the continual-release workload)."""
    return PrefixWorkload(n)


def all_ranges(n: int) -> AllRangesWorkload:
    """All ``n (n + 1) / 2`` range queries, as an implicit operator."""
    return AllRangesWorkload(n)


def range_queries(n: int, ranges: Iterable[tuple[int, int]] | np.ndarray) -> RangeQueriesWorkload:
    """Range counts for a list of inclusive, 0-based ``(lo, hi)`` pairs."""
    arr = np.asarray(list(ranges) if not isinstance(ranges, np.ndarray) else ranges)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ShapeError(f"ranges must be a list of (lo, hi) pairs, got shape {arr.shape}")
    if arr.size and not np.all(arr == np.round(arr)):
        raise ShapeError("range bounds must be integers")
    return RangeQueriesWorkload(n, arr[:, 0], arr[:, 1])


def marginals(
    dims: Sequence[int], subsets: Iterable[Sequence[int]] | None = None, k: int | None = None
) -> SparseOperator:
    """Marginal counts over a product domain of sizes ``dims`` (row-major flattening).

    The marginal on attribute set ``S`` is ``kron_i (I_{d_i} if i in S else 1^T_{d_i})``.  Give the
    attribute sets in ``subsets`` or ask for all ``k``-way marginals with ``k``.
    """
    dims = [_check_n(d) for d in dims]
    if not dims:
        raise ShapeError("marginals need at least one attribute")
    if (subsets is None) == (k is None):
        raise SparseDPError("give exactly one of subsets= or k=")
    if k is not None:
        if not 0 <= k <= len(dims):
            raise ShapeError(f"k must lie in [0, {len(dims)}], got {k}")
        chosen = list(itertools.combinations(range(len(dims)), k))
    else:
        chosen = [tuple(sorted(set(s))) for s in subsets]  # type: ignore[union-attr]
    blocks = []
    for subset in chosen:
        if any(i < 0 or i >= len(dims) for i in subset):
            raise ShapeError(f"attribute index out of range in {subset}")
        block = sp.csr_matrix(np.ones((1, 1)))
        for i, d in enumerate(dims):
            factor = sp.identity(d, format="csr") if i in subset else sp.csr_matrix(np.ones((1, d)))
            block = sp.kron(block, factor, format="csr")
        blocks.append(block)
    # the structure, for sparsedp.optimize: the marginal families optimise this workload exactly
    # (ResidualPlanner / weighted marginals) instead of treating it as a flat matrix
    return SparseOperator(sp.vstack(blocks, format="csr"), name=f"marginals({dims}, {chosen})",
                          meta={"marginals": (tuple(dims), tuple(tuple(c) for c in chosen))})


def from_matrix(A: Any, name: str = "workload") -> Operator:
    """Any user matrix (sparse or dense) as a workload."""
    return aslinearoperator(A, name=name)


class WeightedUnionWorkload(Operator):
    """A weighted union of workloads over one domain: the rows ``sqrt(c_i) W_i`` stacked,

        W = [sqrt(c_1) W_1; ...; sqrt(c_k) W_k]   (shape ``(sum_i m_i, n)``),

    so ``W^T W = sum_i c_i W_i^T W_i`` and, under any strategy, the total squared error of the GLS
    answers is ``E(W) = tr((M^T V^{-1} M)^{-1} W^T W) = sum_i c_i E(W_i)``: the optimiser
    (:func:`sparsedp.optimize.optimize`) minimises the weighted sum of the parts' errors.  E.g.
    all ranges averaged plus ``w`` times the whole-domain query (DPBench's objective):
    ``weighted_union([(1 / (n (n + 1) / 2), all_ranges(n)), (w, total(n))])``.

    Implicit: every product goes through the parts (``W x`` stacks ``sqrt(c_i) W_i x``,
    ``W^T y = sum_i sqrt(c_i) W_i^T y_i``); column norms and image norms combine the parts'
    (closed forms where they have them); :meth:`tosparse` works when every part has a sparse form.
    Build it with :func:`weighted_union`.  ``parts``: the ``(c_i, W_i)`` (nested unions flattened).
    """

    def __init__(self, parts: Sequence[tuple[float, Operator]], name: str | None = None):
        if not parts:
            raise SparseDPError("a weighted union needs at least one (weight, workload) part")
        n = int(parts[0][1].shape[1])
        self.parts: tuple[tuple[float, Operator], ...] = tuple((float(c), W) for c, W in parts)
        rows = [int(W.shape[0]) for _, W in self.parts]
        self.row_starts = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        label = name or "weighted_union(" + ", ".join(f"{c:.6g} x {W.name}" for c, W in self.parts) + ")"
        super().__init__((int(self.row_starts[-1]), n), name=label, structure="weighted_union")
        self.n = n

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        return np.vstack([math.sqrt(c) * np.asarray(W.matmat(X)).reshape(W.shape[0], -1) for c, W in self.parts])

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self._matmat(np.ravel(x)[:, None])[:, 0]

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y, dtype=np.float64)
        out = np.zeros((self.n, Y.shape[1]))
        for (c, W), lo, hi in zip(self.parts, self.row_starts[:-1], self.row_starts[1:]):
            out += math.sqrt(c) * np.asarray(W.rmatmat(Y[lo:hi])).reshape(self.n, -1)
        return out

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self._rmatmat(np.ravel(y)[:, None])[:, 0]

    def tosparse(self) -> sp.csr_matrix:
        """``[sqrt(c_1) W_1; ...]`` as CSR (every part must have a sparse form; the all-range part
        has ``n (n + 1) / 2`` rows: for tests and small ``n``)."""
        blocks = []
        for c, W in self.parts:
            try:
                A = W.tosparse()
            except NotImplementedError as exc:
                raise NotImplementedError(f"part {W.name} of the weighted union has no sparse form") from exc
            blocks.append(math.sqrt(c) * sp.csr_matrix(A, dtype=np.float64))
        return sp.vstack(blocks, format="csr")

    def column_norms(self, p: int = 1) -> np.ndarray:
        """``sum_i sqrt(c_i) ||W_i[:, j]||_1`` (``p = 1``) or ``sqrt(sum_i c_i ||W_i[:, j]||_2^2)``
        (``p = 2``): the parts' rows are disjoint."""
        if p == 1:
            return sum(math.sqrt(c) * np.asarray(W.column_norms(1), dtype=np.float64) for c, W in self.parts)
        if p == 2:
            return np.sqrt(self.gram_diagonal())
        raise SparseDPError(f"norm must be 1 or 2, got {p!r}")

    def gram_diagonal(self) -> np.ndarray:
        """``diag(W^T W) = sum_i c_i diag(W_i^T W_i)``."""
        return sum(c * np.asarray(W.gram_diagonal(), dtype=np.float64) for c, W in self.parts)

    def image_sq_norms(self, X: np.ndarray | sp.spmatrix) -> np.ndarray:
        """``||W u||^2 = sum_i c_i ||W_i u||^2`` for every column ``u`` of ``X`` (each part's own
        closed form: ``O(n)`` per column for all ranges)."""
        return sum(c * np.asarray(W.image_sq_norms(X), dtype=np.float64) for c, W in self.parts)


def _check_weight(c: Any, index: int) -> float:
    if isinstance(c, (bool, np.bool_)) or not isinstance(c, numbers.Real):
        raise SparseDPError(f"weight of part {index} must be a real number, got {c!r}")
    value = float(c)
    if not math.isfinite(value) or value <= 0.0:
        raise SparseDPError(f"weight of part {index} must be finite and > 0, got {c!r}")
    return value


def weighted_union(parts: Iterable[tuple[float, Any]], name: str | None = None) -> WeightedUnionWorkload:
    """The workload ``[sqrt(c_1) W_1; ...; sqrt(c_k) W_k]`` whose total squared error under any
    strategy is ``sum_i c_i E(W_i)`` (Gram ``sum_i c_i W_i^T W_i``): see
    :class:`WeightedUnionWorkload`.

    ``parts``: ``(weight, workload)`` pairs, weights finite and ``> 0``, workloads over the same
    ``n`` cells (implicit workloads such as :func:`all_ranges`, sparsedp operators, scipy sparse
    or dense matrices).  A part that is itself a weighted union is flattened (its weights
    multiplied by the outer weight).  Example, all ranges averaged plus 0.9 x the total::

        W = weighted_union([(1 / (n * (n + 1) / 2), all_ranges(n)), (0.9, total(n))])
    """
    if isinstance(parts, (str, bytes)) or not isinstance(parts, Iterable):
        raise SparseDPError(f"parts must be a sequence of (weight, workload) pairs, got {type(parts).__name__}")
    flat: list[tuple[float, Operator]] = []
    for i, part in enumerate(parts):
        if not isinstance(part, (tuple, list)) or len(part) != 2:
            raise SparseDPError(f"part {i} must be a (weight, workload) pair, got {part!r:.80}")
        c = _check_weight(part[0], i)
        W = aslinearoperator(part[1], name=f"part {i}")
        if W.shape[0] < 1 or W.shape[1] < 1:
            raise ShapeError(f"part {i} must have at least one query and one cell, got shape {W.shape}")
        if isinstance(W, WeightedUnionWorkload):
            flat.extend((c * ci, Wi) for ci, Wi in W.parts)
        else:
            flat.append((c, W))
    if not flat:
        raise SparseDPError("a weighted union needs at least one (weight, workload) part")
    ns = {int(W.shape[1]) for _, W in flat}
    if len(ns) != 1:
        raise ShapeError(f"the parts of a weighted union must share one domain size, got n = {sorted(ns)}")
    return WeightedUnionWorkload(flat, name=name)
