"""The workload's Gram matrix ``G = W^T W`` as an operator: all the optimiser needs of ``W``.

The GLS error of a full-column-rank strategy is ``Var * tr((M^T M)^{-1} G)``: the workload enters
only through ``G``.  For the implicit workloads ``G`` is applied in ``O(n)`` per column and never
formed (``L`` = lower-triangular ones, so ``S = L x`` are the prefix sums):

* prefix: ``W = L``, ``G X = L^T (L X)`` (a cumulative sum and a reversed one);
* all ranges: ``||W u||^2 = (n + 1) ||L u||^2 - (1^T L u)^2`` (see
  :class:`~sparsedp.workloads.AllRangesWorkload`), so ``G = L^T ((n + 1) I - 1 1^T) L``;
* identity: ``G = I``; total: ``G = 1 1^T``;
* range lists and other implicit operators: ``W^T (W X)`` through their own products;
* explicit matrices: ``W^T (W X)`` on the sparse matrix, or a dense ``G`` built once when the
  workload has more non-zeros than ``G`` has entries and ``n`` is small;
* weighted unions (:func:`~sparsedp.workloads.weighted_union`, kind ``"sum"``):
  ``G = sum_i c_i G_i``, every part with its own form (:class:`GramSum` builds one from Grams).
  Everything the optimiser computes from ``G`` is linear in it, so each part keeps its closed form
  (:func:`closed_parts`).

:func:`block_sq_norms` gives ``sum_B ||W 1_B||^2`` over the blocks of a partition of the domain
into consecutive blocks of one size, the workload term of the tree closed form
(:mod:`~sparsedp.optimize.tree_spectral`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import SparseDPError
from ..operators import Operator, SparseOperator, aslinearoperator
from ..workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload, WeightedUnionWorkload

__all__ = [
    "CLOSED_KINDS",
    "Gram",
    "GramSum",
    "block_sq_norms",
    "closed_parts",
    "kind_block_sq_norms",
    "parts_block_sq_norms",
    "workload_rows",
]

#: Workload kinds with closed forms (Gram products, block norms, tree impulse norms).
CLOSED_KINDS = ("prefix", "all_ranges", "identity", "total")

_DENSE_GRAM_LIMIT = 4096


def _rev_cumsum(X: np.ndarray) -> np.ndarray:
    """``L^T X``: ``out[i] = sum_{k >= i} X[k]``."""
    return np.cumsum(X[::-1], axis=0)[::-1]


def _is_identity(W: Operator) -> bool:
    """A workload tagged ``identity`` whose entries are the identity (the tag alone is not trusted)."""
    if W.structure != "identity" or not isinstance(W, SparseOperator) or W.shape[0] != W.shape[1]:
        return False
    A = W.matrix
    return A.nnz == W.shape[0] and bool(np.all(A.diagonal() == 1.0))


def _is_total(W: Operator) -> bool:
    """A workload tagged ``total`` whose single row is all ones."""
    if W.structure != "total" or not isinstance(W, SparseOperator) or W.shape[0] != 1:
        return False
    A = W.matrix
    return A.nnz == W.shape[1] and bool(np.all(A.data == 1.0))


class Gram:
    """``G = W^T W`` of a workload, applied without forming it when ``W`` has structure.

    ``kind``: ``"prefix"``, ``"all_ranges"``, ``"identity"``, ``"total"`` (closed forms),
    ``"sparse"``, ``"dense"``, ``"operator"``, or ``"sum"`` for a
    :class:`~sparsedp.workloads.WeightedUnionWorkload` (then ``parts`` lists ``(c_i, Gram(W_i))``
    and ``G = sum_i c_i G_i``)."""

    parts: list[tuple[float, "Gram"]] | None = None

    def __init__(self, workload: Any):
        self.W = aslinearoperator(workload, name="workload")
        self.n = int(self.W.shape[1])
        self.queries = int(self.W.shape[0])
        self._dense: np.ndarray | None = None
        self._sparse: sp.csr_matrix | None = None
        kind = self.W.structure
        if isinstance(self.W, WeightedUnionWorkload):
            self.kind = "sum"
            self.parts = [(c, Gram(Wi)) for c, Wi in self.W.parts]
        elif isinstance(self.W, (PrefixWorkload, AllRangesWorkload)) or _is_identity(self.W) or _is_total(self.W):
            self.kind = kind
        elif isinstance(self.W, SparseOperator):
            self.kind = "sparse"
            A = self.W.matrix
            if A.nnz > self.n * self.n and self.n <= _DENSE_GRAM_LIMIT:
                self.kind = "dense"
                self._dense = np.asarray((A.T @ A).toarray())
            else:
                self._sparse = A
        else:
            self.kind = "operator"

    def diagonal(self) -> np.ndarray:
        """``diag(G)``: the squared column norms of ``W`` (closed forms for implicit workloads;
        ``sum_i c_i diag(G_i)`` for a sum)."""
        if self.parts is not None:
            return sum(c * g.diagonal() for c, g in self.parts)
        return np.asarray(self.W.gram_diagonal(), dtype=np.float64)

    def trace(self) -> float:
        """``tr(G) = ||W||_F^2``."""
        return float(self.diagonal().sum())

    def matmat(self, X: np.ndarray) -> np.ndarray:
        """``G X`` for a dense ``n x k`` matrix (``sum_i c_i G_i X`` for a sum)."""
        X = np.asarray(X, dtype=np.float64)
        if self.parts is not None:
            return sum(c * g.matmat(X) for c, g in self.parts)
        if self.kind == "prefix":
            return _rev_cumsum(np.cumsum(X, axis=0))
        if self.kind == "all_ranges":
            S = np.cumsum(X, axis=0)
            Y = (self.n + 1) * S - S.sum(axis=0, keepdims=True)
            return _rev_cumsum(Y)
        if self.kind == "identity":
            return X.copy()
        if self.kind == "total":
            return np.broadcast_to(X.sum(axis=0, keepdims=True), X.shape).copy()
        if self.kind == "dense":
            return self._dense @ X  # type: ignore[operator]
        if self.kind == "sparse":
            A = self._sparse
            return np.asarray(A.T @ np.asarray(A @ X))  # type: ignore[union-attr]
        return np.asarray(self.W.rmatmat(self.W.matmat(X)))

    def quadratic(self, U: np.ndarray) -> np.ndarray:
        """``u^T G u`` for every column ``u`` of ``U`` (``= ||W u||^2``)."""
        return np.einsum("ij,ij->j", U, self.matmat(U))


class GramSum(Gram):
    """``G = sum_i c_i G_i`` built from Grams directly (weights ``c_i >= 0``, one domain): the Gram
    of ``weighted_union([(c_i, G_i.W)])``, e.g. all ranges averaged plus ``w`` times the
    whole-domain query, ``G = G_ranges / (n (n + 1) / 2) + w 1 1^T`` (issue 11).  Parts of weight
    0 contribute nothing and are left out of ``W``."""

    def __init__(self, parts: list[tuple[float, Gram]]):
        self.parts = [(float(c), g) for c, g in parts]
        ns = {g.n for _, g in self.parts}
        if len(ns) != 1 or any(not np.isfinite(c) or c < 0 for c, _ in self.parts):
            raise SparseDPError("GramSum needs Grams over one domain and finite non-negative weights")
        self.n = ns.pop()
        self.queries = sum(g.queries for _, g in self.parts)
        self.kind = "sum"
        self._dense = None
        self._sparse = None
        positive = [(c, g.W) for c, g in self.parts if c > 0 and g.W is not None]
        self.W = WeightedUnionWorkload(positive) if positive else None  # type: ignore[assignment]


def closed_parts(gram: Gram) -> list[tuple[float, str]] | None:
    """``[(c_i, kind_i)]`` when ``G = sum_i c_i G_i`` with every ``G_i`` of a closed-form kind
    (:data:`CLOSED_KINDS`; ``[(1, kind)]`` for one such workload), else ``None``."""
    if gram.kind in CLOSED_KINDS:
        return [(1.0, gram.kind)]
    if gram.parts is None:
        return None
    out: list[tuple[float, str]] = []
    for c, g in gram.parts:
        sub = closed_parts(g)
        if sub is None:
            return None
        out += [(c * ci, k) for ci, k in sub]
    return out


def parts_block_sq_norms(parts: list[tuple[float, str]], n: int, size: int) -> float:
    """``sum_i c_i kind_block_sq_norms(kind_i, n, size)``: the block norms of a weighted sum of
    closed-form workloads (``sum_B ||W 1_B||^2`` is linear in ``W^T W``)."""
    return float(sum(c * kind_block_sq_norms(k, n, size) for c, k in parts))


def kind_block_sq_norms(kind: str, n: int, size: int) -> float:
    """``sum_B ||W 1_B||^2`` in closed form for the implicit workloads over ``n`` cells, the blocks
    ``B = [i size, (i + 1) size)`` cut at ``n`` (the last one partial when ``size`` does not divide
    ``n``; equivalently ``W`` padded with zero columns to a multiple of ``size``).  With
    ``m = n // size`` full blocks and ``r = n - m size`` cells in the partial one:

    * prefix (rows ``[0, t)``, ``t = 1..n``): block ``i`` overlaps row ``t`` in
      ``clamp(t - i size, 0, size)`` cells, so the sum is
      ``m S_2(size) + size^2 (m n - size m (m + 1) / 2) + S_2(r)``, ``S_2(s) = s (s + 1) (2 s + 1) / 6``
      (exact integer arithmetic);
    * all ranges (``[lo, hi)``, ``0 <= lo < hi <= n``): ``||W 1_B||^2 = sum_{i, j in B}`` (ranges
      containing ``i`` and ``j``) ``= sum_{i, j in B} (min + 1)(n - max)``, which sums to
      ``sum_j (n - j) ((j + 1)^2 - a_j (a_j + 1))`` with ``a_j`` the first cell of ``j``'s block:
      an exact integer for the first part and ``O(n / size)`` float64 terms for the second;
    * identity: ``n``; total: ``m size^2 + r^2``.
    """
    n, size = int(n), int(size)
    if n < 1 or size < 1:
        raise ValueError(f"need n >= 1 and size >= 1, got {n}, {size}")
    m, r = divmod(n, size)

    def s2(s: int) -> int:
        return s * (s + 1) * (2 * s + 1) // 6

    if kind == "prefix":
        return float(m * s2(size) + size * size * (m * n - size * m * (m + 1) // 2) + s2(r))
    if kind == "all_ranges":
        # sum_j (n - j)(j + 1)^2 = (n + 1) S_2(n) - S_3(n) exactly, minus, per block starting at a
        # with c cells, a (a + 1) sum_{j in block} (n - j) = a (a + 1) (c n - c (2 a + c - 1) / 2)
        whole = (n + 1) * s2(n) - (n * (n + 1) // 2) ** 2
        a = np.arange(m + (1 if r else 0), dtype=np.float64) * size
        c = np.full(a.size, float(size))
        if r:
            c[-1] = float(r)
        return float(whole) - float(np.sum(a * (a + 1.0) * (c * n - c * (2.0 * a + c - 1.0) / 2.0)))
    if kind == "identity":
        return float(n)
    if kind == "total":
        return float(m * size * size + r * r)
    raise ValueError(f"no closed form for workload kind {kind!r}")


def block_sq_norms(W: Operator, size: int, *, padded: bool = False) -> float:
    """``sum_B ||W 1_B||^2`` over the blocks ``B = [i size, (i + 1) size)`` (``size`` divides ``n``;
    with ``padded=True`` it need not: the last block is cut at ``n``, i.e. ``W`` padded with zero
    columns to a multiple of ``size``, as :class:`~sparsedp.optimize.tree_family.EmbeddedTraces`
    needs for the near-complete trees).

    Prefix, all-range, identity and total workloads in closed form (:func:`kind_block_sq_norms`);
    weighted unions as the weighted sum of their parts'; range lists use the overlaps in closed form (``O(queries)``); other workloads their image norms
    of the sparse block indicators (a sparse product for explicit matrices).
    """
    n = int(W.shape[1])
    if n % size and not padded:
        raise ValueError(f"block size {size} does not divide n = {n}")
    if isinstance(W, WeightedUnionWorkload):  # rows sqrt(c_i) W_i: sum_i c_i sum_B ||W_i 1_B||^2
        return float(sum(c * block_sq_norms(Wi, size, padded=padded) for c, Wi in W.parts))
    if isinstance(W, PrefixWorkload):
        return kind_block_sq_norms("prefix", n, size)
    if isinstance(W, AllRangesWorkload):
        return kind_block_sq_norms("all_ranges", n, size)
    if _is_identity(W):
        return kind_block_sq_norms("identity", n, size)
    if _is_total(W):
        return kind_block_sq_norms("total", n, size)
    if isinstance(W, RangeQueriesWorkload):
        lo, hi = W.lo.astype(np.int64), W.hi.astype(np.int64) + 1  # half-open [lo, hi)
        first, last = lo // size, (hi - 1) // size
        same = first == last
        head = (first + 1) * size - lo
        tail = hi - last * size
        inner = np.maximum(last - first - 1, 0)
        sq = np.where(same, (hi - lo) ** 2, head**2 + tail**2 + inner * size * size)
        return float(np.sum(sq.astype(np.float64)))
    starts = np.append(np.arange(0, n, size), n)  # the last block cut at n
    ind = sp.csc_matrix((np.ones(n), np.arange(n), starts), shape=(n, starts.size - 1))
    return float(np.sum(W.image_sq_norms(ind)))


def workload_rows(W: Operator, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of an explicit or range-list workload as a dense ``n x (stop - start)``
    matrix (one column per query)."""
    n = int(W.shape[1])
    if isinstance(W, RangeQueriesWorkload):
        lo, hi = W.lo[start:stop].astype(np.int64), W.hi[start:stop].astype(np.int64) + 1
        out = np.zeros((n + 1, stop - start))
        cols = np.arange(stop - start)
        out[lo, cols] += 1.0
        out[hi, cols] -= 1.0
        return np.cumsum(out[:-1], axis=0)
    return np.asarray(W.tosparse()[start:stop].toarray().T)
