"""Exact O(n) solver for trees whose node vectors must lie in one span (the restaurant's structure).

Setting.  ``p`` trees share one :class:`~sparsedp.strategies.TreeLayout` (``x_u`` in ``R^p`` is the
vector of the ``p`` trees' values at node ``u``): every parent equals the sum of its children
(:class:`~sparsedp.consistency.TreeConstraints`), and every leaf vector lies in the column span of
one ``p x r`` matrix (:class:`~sparsedp.consistency.SpanConstraints` over the leaves, optionally
also over internal nodes, where it is implied).  Seed 002's restaurant is ``p = 5`` items, ``r = 3``
combos.  The feasible set is ``x = (S (x) Q) c``: ``Q`` (``p x r``) an orthonormal basis of the
span, ``c_u`` in ``R^r`` the combo coordinates of node ``u`` and ``c_parent = sum c_children``.

So the weighted projection ``argmin sum_u (y_u - Q c_u)^T V_u^-1 (y_u - Q c_u)`` (``V_u`` the
diagonal variances of node ``u``) is a tree GLS with vector-valued nodes, solved exactly by the
two-pass recursion of Hay et al. (VLDB 2010) with ``r x r`` blocks (the Rauch-Tung-Striebel
smoother on a tree).  Each node's measurement carries the information ``J_u = Q^T V_u^-1 Q`` and
``h_u = Q^T V_u^-1 y_u``:

* upward: leaves ``P_u = J_u^-1``, ``z_u = P_u h_u``; a parent with ``Z_u = sum_c z_c``,
  ``S_u = sum_c P_c`` gets ``P_u = (J_u + S_u^-1)^-1`` and ``z_u = P_u (h_u + S_u^-1 Z_u)``;
* downward: roots keep ``c_u = z_u``; a child gets ``c_c = z_c + P_c S_u^-1 (c_u - Z_u)``.

Separable variances ``V_u = s_u diag(w)`` (equal variances included) make every ``J_u`` a multiple
of one matrix; then the node coordinates ``z_u = (Q^T W^-1 Q)^-1 Q^T W^-1 y_u`` go through the
scalar :func:`~sparsedp.tree_estimator.two_pass` with variances ``s_u`` (``r`` right-hand sides),
which is the closed form ``(P_tree (x) Q_span)`` of the previous engine without the redundant rows.

Finish ("re-aggregation").  The leaves are set to ``Q c_leaf`` and every internal node to the
floating-point sum of its children, bottom-up.  This moves internal nodes by rounding only (a few
ulps of their size) and makes every tree row hold to the rounding of one addition per child (half
an ulp of the parent), the best a float64 vector can do; see :mod:`.residuals` for how the reported
residual is evaluated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

from ..strategies import TreeLayout
from ..tree_estimator import LevelPlan, layout_plan, two_pass
from .blocks import BatchedBlock, Block, LayoutTreeBlock, TreeBlock

__all__ = ["TreeSpan", "detect_tree_span", "tree_span_solve", "reaggregate"]

SEPARABLE_RTOL = 1e-13


@dataclass(frozen=True)
class TreeSpan:
    """The trees in breadth-first order (``parent``, ``level_start``, ``plans`` as
    :func:`~sparsedp.tree_estimator.two_pass` takes them); ``variables[u, j]`` the global variable of
    tree ``j`` at node ``u``; ``leaves`` the childless nodes (a slice when they are the last rows);
    ``Q`` (``p x r``, orthonormal columns) spans the allowed leaf vectors, in tree order."""

    parent: np.ndarray
    level_start: np.ndarray
    plans: tuple[LevelPlan, ...]
    variables: np.ndarray
    leaves: slice | np.ndarray
    Q: np.ndarray
    offset: int | None = None  # variables == offset + arange(nodes * p), node-major: views, no gathers

    @property
    def nodes(self) -> int:
        return int(self.variables.shape[0])

    def values(self, x: np.ndarray) -> np.ndarray:
        """``x[variables]`` (a view when the variables are contiguous)."""
        if self.offset is None:
            return x[self.variables]
        return x[self.offset : self.offset + self.variables.size].reshape(self.variables.shape)


def _trees(trees: list[Block]) -> tuple[np.ndarray, np.ndarray, tuple[LevelPlan, ...], np.ndarray, int | None] | None:
    """Breadth-first shape and ``(nodes, p)`` variables of trees that share one shape, or ``None``:
    layout trees on one layout, or networkx trees whose breadth-first forms coincide."""
    if all(isinstance(t, LayoutTreeBlock) for t in trees):
        layout = trees[0].layout  # type: ignore[attr-defined]
        if any(t.layout is not layout and t.layout != layout for t in trees):  # type: ignore[attr-defined]
            return None
        parent, level_start = layout.bfs()
        variables = np.concatenate([t.variables.reshape(layout.nodes, t.k) for t in trees], axis=1)  # type: ignore[attr-defined]
        span = trees[0].contiguous() if len(trees) == 1 else None
        return parent, level_start, layout_plan(layout), variables, None if span is None else span[0]
    if all(isinstance(t, TreeBlock) for t in trees):
        _, parent, level_start = trees[0]._bfs  # type: ignore[attr-defined]
        for t in trees[1:]:
            if not (np.array_equal(t._bfs[1], parent) and np.array_equal(t._bfs[2], level_start)):  # type: ignore[attr-defined]
                return None
        variables = np.column_stack([t.variables[t._bfs[0]] for t in trees])  # type: ignore[attr-defined]
        return parent, level_start, trees[0]._plan, variables, None  # type: ignore[attr-defined]
    return None


def _leaves(plans: tuple[LevelPlan, ...], nodes: int) -> slice | np.ndarray:
    internal = np.zeros(nodes, dtype=bool)
    for lp in plans:
        internal[lp.parents] = True
    first = int(np.argmin(internal)) if not internal.all() else nodes
    return slice(first, nodes) if not internal[first:].any() else np.flatnonzero(~internal)


def detect_tree_span(blocks: list[Block], n: int) -> TreeSpan | None:
    """The :class:`TreeSpan` structure of a compiled problem, or ``None`` if it has another shape.

    Accepted: ``p`` trees of one shape (layout trees on one layout: one block with ``p`` columns or
    ``p`` blocks; or networkx trees with identical breadth-first forms) plus any number of span
    blocks (``B x_g = 0``, one shared ``B``) whose groups each hold the ``p`` tree values of one node,
    in one common column order, covering every leaf.  No other blocks.
    """
    trees = [b for b in blocks if isinstance(b, (LayoutTreeBlock, TreeBlock))]
    spans = [b for b in blocks if isinstance(b, BatchedBlock)]
    if not trees or len(trees) + len(spans) != len(blocks):
        return None
    shape = _trees(trees)
    if shape is None:
        return None
    parent, level_start, plans, variables, offset = shape
    nodes = variables.shape[0]
    if len(trees) > 1 and np.unique(variables).size != variables.size:
        return None  # two tree families share variables
    p = variables.shape[1]
    leaves = _leaves(plans, nodes)
    if not spans:
        return TreeSpan(parent, level_start, plans, variables, leaves, np.eye(p), offset)
    B = spans[0].B
    if any(s.B.shape != B.shape or not np.array_equal(s.B, B) or np.any(s.rhs != 0) for s in spans):
        return None
    if B.shape[1] != p:
        return None
    groups = np.concatenate([s.groups for s in spans]) if len(spans) > 1 else spans[0].groups
    if offset is not None:  # node and column by arithmetic: one pass to check every group against the first
        node0 = (groups[:, 0] - offset) // p
        perm = groups[0] - offset - node0[0] * p
        ok = (0 <= perm).all() and (perm < p).all() and (node0 >= 0).all() and (node0 < nodes).all()
        if not ok or not np.array_equal(groups, (offset + node0 * p)[:, None] + perm):
            return None
        node_col = node0[:, None], perm[None, :]
    else:
        node_of = np.full(n, -1, dtype=np.int64)
        col_of = np.full(n, -1, dtype=np.int64)
        node_of[variables] = np.arange(nodes)[:, None]
        col_of[variables] = np.arange(p)
        node_col = node_of[groups], col_of[groups]
    gnode, gcol = node_col
    if np.any(gnode < 0) or np.any(gnode != gnode[:, :1]) or np.any(gcol != gcol[:1]):
        return None  # a group mixes nodes, leaves the trees, or orders the columns differently
    perm = gcol[0]
    if np.unique(perm).size != p:
        return None
    covered = np.zeros(nodes, dtype=bool)
    covered[gnode[:, 0]] = True
    if not covered[leaves].all():
        return None
    basis = scipy.linalg.null_space(B)  # columns in the groups' order
    Q = np.empty_like(basis)
    Q[perm] = basis
    return TreeSpan(parent, level_start, plans, variables, leaves, Q, offset)


def reaggregate(plans: tuple[LevelPlan, ...] | TreeLayout, X: np.ndarray) -> np.ndarray:
    """In place: every internal node of ``X`` (rows in breadth-first order; ``plans`` from
    :func:`~sparsedp.tree_estimator.two_pass_plan`, or a layout) becomes the float sum of its
    children, bottom-up.  Returns ``X``."""
    for lp in layout_plan(plans) if isinstance(plans, TreeLayout) else plans:  # deepest parents first
        X[lp.parents] = lp.sum(X[lp.lo : lp.hi])
    return X


def _separable(V: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(s, w)`` with ``V = s[:, None] * w[None, :]`` (to ``SEPARABLE_RTOL``), else ``None``."""
    s = V[:, 0].copy()
    w = V[0] / V[0, 0]
    if np.all(np.abs(V - s[:, None] * w) <= SEPARABLE_RTOL * V):
        return s, w
    return None


def _rows_times(Y: np.ndarray, M: np.ndarray) -> np.ndarray:
    """``Y @ M.T`` for a tall ``Y`` and a tiny ``M`` without BLAS (multi-threaded BLAS on skinny
    products is many times slower than numpy's own loop on a busy machine)."""
    return np.einsum("uj,ij->ui", Y, M)


def _spd_inv(A: np.ndarray) -> np.ndarray:
    """Inverses of a stack of small symmetric positive-definite matrices (symmetric results).

    ``r <= 3``: the adjugate over the determinant, elementwise over the stack (one pass of numpy
    arithmetic instead of one LAPACK call per matrix); larger ``r``: ``numpy.linalg.inv``.
    """
    r = A.shape[-1]
    if r == 1:
        return 1.0 / A
    if r == 2:
        a, b, d = A[:, 0, 0], A[:, 0, 1], A[:, 1, 1]
        det = a * d - b * b
        out = np.empty_like(A)
        out[:, 0, 0], out[:, 1, 1] = d / det, a / det
        out[:, 0, 1] = out[:, 1, 0] = -b / det
        return out
    if r == 3:
        a, b, c = A[:, 0, 0], A[:, 0, 1], A[:, 0, 2]
        d, e, f = A[:, 1, 1], A[:, 1, 2], A[:, 2, 2]
        c00, c01, c02 = d * f - e * e, c * e - b * f, b * e - c * d
        det = a * c00 + b * c01 + c * c02
        out = np.empty_like(A)
        out[:, 0, 0], out[:, 1, 1], out[:, 2, 2] = c00 / det, (a * f - c * c) / det, (a * d - b * b) / det
        out[:, 0, 1] = out[:, 1, 0] = c01 / det
        out[:, 0, 2] = out[:, 2, 0] = c02 / det
        out[:, 1, 2] = out[:, 2, 1] = (b * c - a * e) / det
        return out
    out = np.linalg.inv(A)
    return 0.5 * (out + np.swapaxes(out, -1, -2))


def _block_two_pass(plans: tuple[LevelPlan, ...], J: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Vector-node two-pass GLS (module docstring); ``J`` (nodes, r, r), ``h`` (nodes, r)."""
    P = np.empty_like(J)
    z = np.empty_like(h)
    internal = np.zeros(J.shape[0], dtype=bool)
    Sinv = np.empty_like(J)
    Zs = np.empty_like(h)
    for lp in plans:
        internal[lp.parents] = True
    leaves = ~internal
    P[leaves] = _spd_inv(J[leaves])
    z[leaves] = np.einsum("uij,uj->ui", P[leaves], h[leaves])
    for lp in plans:  # upward, deepest parents first
        idx = lp.parents
        S = lp.sum(P[lp.lo : lp.hi])
        Zi = lp.sum(z[lp.lo : lp.hi])
        Si = _spd_inv(S)
        Pu = _spd_inv(J[idx] + Si)
        z[idx] = np.einsum("uij,uj->ui", Pu, h[idx] + np.einsum("uij,uj->ui", Si, Zi))
        P[idx], Sinv[idx], Zs[idx] = Pu, Si, Zi
    for lp in reversed(plans):  # downward: the parents' z is final
        idx = lp.parents
        d = np.einsum("uij,uj->ui", Sinv[idx], z[idx] - Zs[idx])
        sl = slice(lp.lo, lp.hi)
        z[sl] += np.einsum("uij,uj->ui", P[sl], lp.spread(d))
    return z


def tree_span_solve(ts: TreeSpan, x0: np.ndarray, v: np.ndarray | None) -> tuple[np.ndarray, str]:
    """The weighted projection of ``x0`` onto the :class:`TreeSpan` constraints, re-aggregated.

    Returns ``(x, how)``: ``how`` is ``"separable"`` (scalar two-pass on the span coordinates),
    ``"blocks"`` (``r x r`` block two-pass) or ``"trees"`` (no span family: the scalar two-pass with
    per-column variances).  Variables outside the trees keep their value.
    """
    plans, parent, level_start = ts.plans, ts.parent, ts.level_start
    Y = ts.values(x0)
    V = None if v is None else ts.values(v)
    Q = ts.Q
    sep = (np.ones(ts.nodes), np.ones(Q.shape[0])) if V is None else _separable(V)
    if V is not None and sep is None and Q.shape[0] == Q.shape[1] and np.array_equal(Q, np.eye(Q.shape[0])):
        c = two_pass(parent, level_start, Y, V, plan=plans)  # trees only: per-column variances as they are
        how = "trees"
    elif sep is not None:
        s, w = sep
        QW = Q.T / w  # r x p: Q^T W^-1
        G = np.linalg.solve(QW @ Q, QW)  # coordinates of the W-weighted projection onto the span
        c = two_pass(parent, level_start, _rows_times(Y, G), s, plan=plans, overwrite=True)  # our temporary
        how = "separable"
    else:
        J = np.einsum("pi,up,pj->uij", Q, 1.0 / V, Q)
        h = _rows_times(Y / V, Q.T)
        c = _block_two_pass(plans, J, h)
        how = "blocks"
    whole = ts.offset == 0 and ts.variables.size == x0.size
    x = np.empty_like(x0) if whole else x0.copy()  # variables outside the trees keep their value
    X = ts.values(x) if ts.offset is not None else np.empty_like(Y)
    X[ts.leaves] = _rows_times(c[ts.leaves], Q)
    reaggregate(plans, X)
    if ts.offset is None:
        x[ts.variables] = X
    return x, how
