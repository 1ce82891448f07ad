"""Analytic error of workload answers reconstructed by generalised least squares.

For measurements ``y = M x + z`` with independent noise ``Var(z_i) = v_i`` and the GLS estimate
``x_hat = G y`` (``G = (M^T V^-1 M)^-1 M^T V^-1``, which is ``M^-1`` for a square invertible
strategy), the workload answers ``W x_hat`` are unbiased and their total squared error is

    E = sum_i v_i ||W G e_i||^2 = trace(W G V G^T W^T).

With homoscedastic Laplace noise on a square strategy this is the low-rank mechanism's
``(2 Delta^2 / eps^2) trace(B^T B)``, ``B = W M^-1`` (seed 000, eq. 5.2 and 5.9).

How ``E`` is computed, without forming a dense inverse:

* ``sparse-inverse``: identity, Fenwick and Haar strategies (and their weighted forms) have an exact
  sparse ``G``; ``E`` is the workload's image norms of ``G V^{1/2}``, which implicit workloads give in
  closed form (``O(nnz(G))`` for prefix and all-range workloads).
* ``tree-closed-form``: hierarchical strategies with the prefix, all-range, identity or total
  workload: the leaf response to each measurement is a sum of scaled subtree profiles, whose image
  norms follow from profile moments computed bottom-up, ``O(n log n)`` in all
  (:func:`~sparsedp.tree_estimator.tree_impulse_norms`).
* ``exact-blocks``: otherwise (trees, general matrices) ``G`` is applied to blocks of unit vectors
  with the fast estimator (two-pass for trees), ``O(m)`` solves in all: exact, for moderate sizes.
* ``estimate``: Hutchinson's estimator ``E = E_z ||W G V^{1/2} z||^2`` with Rademacher ``z``,
  reported with its standard error, for sizes beyond the exact limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from .errors import SparseDPError
from .inference import linear_estimator, sparse_inverse
from .operators import SparseOperator, aslinearoperator
from .tree_estimator import tree_impulse_norms

__all__ = ["ErrorReport", "expected_error"]

_TREE_WORKLOADS = ("prefix", "all_ranges", "identity", "total")


@dataclass(frozen=True)
class ErrorReport:
    """Expected total squared error of the workload answers, and how it was obtained."""

    total: float
    per_query: float  # total / number of workload queries
    method: str  # "sparse-inverse", "tree-closed-form", "exact-blocks" or "estimate"
    stderr: float = 0.0  # standard error of an estimate; 0 when exact

    @property
    def exact(self) -> bool:
        return self.method != "estimate"

    def __float__(self) -> float:
        return self.total


def expected_error(
    workload: Any,
    strategy: Any,
    variances: Any,
    *,
    method: str = "auto",
    exact_limit: float = 2.0**27,
    probes: int = 64,
    block: int = 512,
    rng: Any = None,
) -> ErrorReport:
    """Expected total squared error ``sum_i v_i ||W G e_i||^2`` of GLS workload answers.

    ``method``: ``"auto"`` (sparse inverse if the strategy has one, the tree closed form for
    trees with prefix / all-range / identity / total workloads, exact blocks if
    ``rows(M) * n <= exact_limit``, else an estimate), ``"exact"`` or ``"estimate"``.
    """
    W = aslinearoperator(workload)
    M = aslinearoperator(strategy)
    m, n = M.shape
    if W.shape[1] != n:
        raise SparseDPError(f"workload has {W.shape[1]} columns but the strategy {n}")
    v = np.broadcast_to(np.asarray(variances, dtype=np.float64), (m,))
    if method not in ("auto", "exact", "estimate"):
        raise SparseDPError(f"method must be 'auto', 'exact' or 'estimate', got {method!r}")
    queries = W.shape[0]
    std = np.sqrt(v)
    if method != "estimate":
        G = sparse_inverse(M)
        if G is not None:
            total = float(W.image_sq_norms(sp.csc_matrix(G)) @ v)
            return ErrorReport(total, total / queries, "sparse-inverse")
        base, vb = M, v
        if isinstance(M, SparseOperator) and M.base is not None and M.row_weights is not None:
            base, vb = M.base, v / (M.row_weights * M.row_weights)
        if base.structure == "tree" and W.structure in _TREE_WORKLOADS:
            norms = tree_impulse_norms(base.meta["layout"], vb, W.structure)  # type: ignore[attr-defined]
            total = float(norms @ vb)
            return ErrorReport(total, total / queries, "tree-closed-form")
        if method == "exact" or m * n <= exact_limit:
            apply, _ = linear_estimator(M, v)
            total = 0.0
            for start in range(0, m, block):
                stop = min(start + block, m)
                E = np.zeros((m, stop - start))
                E[np.arange(start, stop), np.arange(stop - start)] = 1.0
                total += float(W.image_sq_norms(apply(E)) @ v[start:stop])
            return ErrorReport(total, total / queries, "exact-blocks")
    gen = np.random.default_rng(rng)
    apply, _ = linear_estimator(M, v)
    samples = []
    for start in range(0, probes, block):
        k = min(block, probes - start)
        Z = gen.choice([-1.0, 1.0], size=(m, k)) * std[:, None]
        samples.append(W.image_sq_norms(apply(Z)))
    s = np.concatenate(samples)
    total = float(s.mean())
    stderr = float(s.std(ddof=1) / np.sqrt(s.size)) if s.size > 1 else float("inf")
    return ErrorReport(total, total / queries, "estimate", stderr)
