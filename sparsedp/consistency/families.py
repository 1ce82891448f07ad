"""Constraint families: each yields blocks of rows ``C_j x = b_j`` (seed 002's sub-problems).

A user plugs a new family by subclassing :class:`ConstraintFamily` and writing ``rows(n)`` (a sparse
``m x n`` matrix and ``b``); the default ``blocks(n)`` wraps them in one factorised
:class:`~sparsedp.consistency.blocks.SparseBlock`.  A family that knows a cheaper exact projector
overrides ``blocks(n)`` instead (see :class:`TreeConstraints`).
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping

import networkx as nx
import numpy as np
import scipy.linalg
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError, ShapeError, SparseDPError
from ..strategies import TreeLayout
from ..validation import check_vector
from .blocks import BatchedBlock, Block, FixedBlock, LayoutTreeBlock, SparseBlock, TreeBlock

__all__ = ["ConstraintFamily", "LinearConstraints", "TreeConstraints", "SpanConstraints", "FixedValues"]


def _check_index(index: np.ndarray, n: int, name: str, distinct: str | None = None) -> None:
    """Indices in ``[0, n)``; with ``distinct`` (the message), no index may repeat (O(n): increasing
    indices are distinct, else a bincount)."""
    if index.size and index.min() < 0:
        raise ShapeError(f"{name}: variable index {int(index.min())} is negative")
    if index.size and index.max() >= n:
        top = int(index.max())
        raise ShapeError(
            f"{name}: the family uses variable {top}, but x has only {n} values (indices 0..{n - 1}); "
            f"x needs at least {top + 1} values, or the family's variables are off"
        )
    flat = index.ravel()
    if distinct and flat.size > 1 and not np.all(flat[1:] > flat[:-1]) and np.bincount(flat, minlength=n).max() > 1:
        raise ShapeError(f"{name}: {distinct}")


def node_variables(graph: nx.Graph, variables: Mapping[Hashable, int] | None, name: str) -> np.ndarray:
    """The variable index of every node of ``graph`` (in ``graph.nodes`` order), by the label rule:
    an explicit ``variables`` mapping, else every node's ``index`` attribute, else integer labels
    (node ``i`` is variable ``i``).  Any other labelling raises :class:`SparseDPError`: a graph's
    insertion order is never used as a numbering."""
    nodes = list(graph.nodes)
    if variables is not None:
        missing = [u for u in nodes if u not in variables]
        if missing:
            raise SparseDPError(f"{name}: variables has no entry for node(s) {missing[:5]!r}")
        return np.array([variables[u] for u in nodes], dtype=np.int64)
    if all("index" in graph.nodes[u] for u in nodes):
        return np.array([graph.nodes[u]["index"] for u in nodes], dtype=np.int64)
    bad = [u for u in nodes if isinstance(u, (bool, np.bool_)) or not isinstance(u, (int, np.integer))]
    if bad:
        raise SparseDPError(
            f"{name}: node {bad[0]!r} is not an integer label; integer labels 0..n-1 are variable "
            "indices, other labels need variables={node: index} (or an 'index' attribute on every node)"
        )
    return np.array(nodes, dtype=np.int64)


class ConstraintFamily:
    """Base class.  Subclasses set ``name`` and implement ``rows(n)`` or ``blocks(n)``."""

    name: str = "constraints"

    def rows(self, n: int) -> tuple[sp.csr_matrix, np.ndarray]:
        """All rows of the family as ``(C, b)``, ``C`` sparse ``m x n``."""
        C = [blk.rows(n) for blk in self.blocks(n)]
        if not C:
            return sp.csr_matrix((0, n)), np.zeros(0)
        return sp.vstack([c for c, _ in C], format="csr"), np.concatenate([b for _, b in C])

    def blocks(self, n: int) -> list[Block]:
        """The family's blocks; by default one :class:`SparseBlock` over the columns ``rows`` touches."""
        C, b = self.rows(n)
        C = sp.csr_matrix(C, dtype=np.float64)
        b = check_vector(b, C.shape[0], f"{self.name}: b")
        if C.shape[1] != n:
            raise ShapeError(f"{self.name}: rows have {C.shape[1]} columns, expected {n}")
        if not np.all(np.isfinite(C.data)):
            raise SparseDPError(f"{self.name}: constraint matrix holds NaN or infinity")
        cols = np.unique(C.indices)
        return [SparseBlock(C[:, cols], b, cols, self.name)]


class LinearConstraints(ConstraintFamily):
    """Any sparse rows ``C x = b`` (redundant rows are allowed; contradictory ones are reported)."""

    def __init__(self, C: Any, b: Any, name: str = "linear") -> None:
        self.C = sp.csr_matrix(C, dtype=np.float64)
        self.b = check_vector(b, self.C.shape[0], f"{name}: b")
        self.name = name

    def rows(self, n: int) -> tuple[sp.csr_matrix, np.ndarray]:
        if self.C.shape[1] != n:
            raise ShapeError(f"{self.name}: C has {self.C.shape[1]} columns, the release has {n} values")
        return self.C, self.b


class TreeConstraints(ConstraintFamily):
    """Every internal node equals the sum of its children.

    ``tree`` is a ``networkx.DiGraph`` (edges parent -> child; a forest is accepted) or a
    :class:`~sparsedp.strategies.TreeLayout`.  Which variable a node is, for a graph:

    1. ``variables={node: index}`` (alias ``index=``) if given;
    2. else the node's ``index`` attribute, if every node has one;
    3. else the node's *label*, which must then be an integer: node ``7`` is variable
       ``offset + 7`` whatever order the graph was built in.  Other labels (strings, tuples) need
       1. or 2.; they raise :class:`SparseDPError` instead of being numbered by insertion order
       (which once silently matched county edges to state values).

    For a layout a node is its strategy row (root first); ``index`` may be an integer array
    (shape ``(nodes, k)`` for ``k`` trees sharing the layout, projected together).  The projector
    is the O(n) two-pass weighted estimate (Hay et al. 2010 generalised to per-node variances);
    ``solve(x, TreeConstraints(t), variances=v)`` is therefore the tree BLUE of node measurements
    with variances ``v``.
    """

    def __init__(
        self,
        tree: Any,
        offset: int = 0,
        index: Mapping[Hashable, int] | np.ndarray | None = None,
        name: str = "tree",
        *,
        variables: Mapping[Hashable, int] | np.ndarray | None = None,
    ) -> None:
        self.name = name
        if variables is not None and index is not None:
            raise SparseDPError(f"{name}: give variables= or index=, not both")
        index = variables if variables is not None else index
        if isinstance(tree, TreeLayout):
            self.layout: TreeLayout | None = tree
            idx = np.arange(tree.nodes) if index is None else np.asarray(index, dtype=np.int64)
            if idx.ndim not in (1, 2) or idx.shape[0] != tree.nodes:
                raise ShapeError(f"{name}: index must have one row per node ({tree.nodes}), got shape {idx.shape}")
            self.variables = idx + int(offset)
            self.parent = None
            return
        if not isinstance(tree, nx.DiGraph):
            raise SparseDPError(f"{name}: tree must be a networkx.DiGraph or a TreeLayout, got {type(tree).__name__}")
        if tree.number_of_nodes() == 0 or not nx.is_forest(tree.to_undirected(as_view=True)):
            raise SparseDPError(f"{name}: the graph is not a non-empty forest")
        if any(d > 1 for _, d in tree.in_degree()):
            raise SparseDPError(f"{name}: a node has two parents; edges must point parent -> child")
        nodes = list(tree.nodes)
        pos = {u: i for i, u in enumerate(nodes)}
        self.layout = None
        self.variables = node_variables(tree, index, name) + int(offset)
        parent = np.full(len(nodes), -1, dtype=np.int64)
        for p, c in tree.edges:
            parent[pos[c]] = pos[p]
        self.parent = parent

    def blocks(self, n: int) -> list[Block]:
        _check_index(self.variables, n, self.name, distinct="two nodes map to the same variable")
        if self.layout is not None:
            return [LayoutTreeBlock(self.layout, self.variables, self.name)]  # 2-D: k trees at once
        return [TreeBlock(self.parent, self.variables, self.name)]  # type: ignore[arg-type]


class SpanConstraints(ConstraintFamily):
    """Each group of ``p`` variables must lie in the column span of ``basis`` (``p x r``).

    Written as ``B x_g = 0`` with ``B`` (``k x p``) an orthonormal basis of the orthogonal complement
    of the span (``k = p - rank(basis)``; seed 002, eq. 13, uses any basis ``B``).  ``groups`` is a
    ``G x p`` integer array of variable indices (disjoint groups).  The projector handles all groups
    in one batched operation; ``chunks > 1`` splits them into that many blocks (for executors).
    """

    def __init__(self, basis: Any, groups: Any, name: str = "span", chunks: int = 1) -> None:
        basis = np.asarray(basis, dtype=np.float64)
        if basis.ndim != 2 or not np.all(np.isfinite(basis)):
            raise ShapeError(f"{name}: basis must be a finite 2-D array (p x r)")
        groups = np.asarray(groups, dtype=np.int64)
        if groups.ndim != 2 or groups.shape[1] != basis.shape[0]:
            raise ShapeError(f"{name}: groups must be G x {basis.shape[0]}, got shape {groups.shape}")
        self.basis = basis
        self.B = scipy.linalg.null_space(basis.T).T  # k x p, orthonormal rows
        self.groups = groups
        self.name = name
        self.chunks = max(1, int(chunks))

    def blocks(self, n: int) -> list[Block]:
        _check_index(self.groups, n, self.name, distinct="groups must be disjoint")
        if self.B.shape[0] == 0 or self.groups.shape[0] == 0:
            return []
        G = self.groups.shape[0]
        k = min(self.chunks, G)
        bounds = [G * i // k for i in range(k + 1)]  # contiguous chunks: views, no copies
        return [BatchedBlock(self.B, self.groups[lo:hi], None, self.name) for lo, hi in zip(bounds[:-1], bounds[1:])]


class FixedValues(ConstraintFamily):
    """Invariants ``x[index] = values``.  Repeated indices must repeat the same value."""

    def __init__(self, index: Any, values: Any, name: str = "fixed") -> None:
        idx = np.atleast_1d(np.asarray(index, dtype=np.int64))
        vals = check_vector(np.broadcast_to(np.asarray(values, dtype=np.float64), idx.shape), idx.size, f"{name}: values")
        uniq, first = np.unique(idx, return_index=True)
        canon = vals[first][np.searchsorted(uniq, idx)]
        if np.any(canon != vals):
            bad = idx[canon != vals][0]
            raise InfeasibleConstraintsError(f"constraint family {name!r} fixes variable {bad} to two different values")
        self.index, self.values, self.name = uniq, vals[first], name

    def blocks(self, n: int) -> list[Block]:
        _check_index(self.index, n, self.name)
        return [FixedBlock(self.values, self.index, self.name)] if self.index.size else []
