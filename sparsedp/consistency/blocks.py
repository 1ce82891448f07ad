"""Blocks: rows ``C_j x = b_j`` over a set of variables, with an exact weighted projector.

A block works on its *local* variables (``x[block.variables]``), so it can be shipped to another
thread or Dask worker.  ``project(x_local, v_local, homogeneous)`` returns

    ``x + V C_j^T (C_j V C_j^T)^+ (b_j - C_j x)``   (``b_j`` replaced by 0 when ``homogeneous``),

the ``D``-orthogonal projection (``D = V^-1``) onto the block's affine set (seed 002, eq. 7).  The
homogeneous form is the linear part, used by the accelerated (Krylov) solver.

* :class:`SparseBlock`: any sparse rows; projector = one cached :class:`SPDSolver` factor.
* :class:`TreeBlock`: ``parent = sum(children)`` on a forest; O(n) two-pass projector.
* :class:`LayoutTreeBlock`: the same on a :class:`~sparsedp.strategies.TreeLayout`, for ``k``
  trees at once.  Both use the foundation's :func:`~sparsedp.tree_estimator.two_pass`.
* :class:`BatchedBlock`: ``G`` disjoint groups of ``p`` variables sharing one small ``k x p``
  matrix; one vectorised batched solve.
* :class:`FixedBlock`: ``x_i = c_i``; the projection sets them.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError
from ..strategies import TreeLayout
from ..tree_estimator import bfs_order, layout_plan, two_pass, two_pass_plan
from .projectors import SPDSolver, batched_project, tree_project

__all__ = ["Block", "SparseBlock", "TreeBlock", "LayoutTreeBlock", "BatchedBlock", "FixedBlock", "project_block"]

FEASIBILITY_RTOL = 1e-7


class Block:
    """Base class: ``variables`` (global indices, unique), ``family`` (name), ``local_rows()``."""

    variables: np.ndarray
    family: str

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        """``(C_j restricted to the block's variables, b_j)``."""
        raise NotImplementedError

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        raise NotImplementedError

    def residual(self, x: np.ndarray) -> np.ndarray:
        """``C_j x - b_j`` on the local variables (structured blocks override it)."""
        C, b = self.local_rows()
        return C @ x - b

    def row_l1(self) -> float:
        """``max_i ||C_j[i, :]||_1`` (for the attainable-precision floor of the tolerance)."""
        C = self.local_rows()[0]
        return float(np.max(abs(C) @ np.ones(C.shape[1]), initial=0.0))

    def contiguous(self) -> tuple[int, int] | None:
        """``(start, stop)`` when ``variables == arange(start, stop)`` (checked once), else ``None``."""
        span = getattr(self, "_span", False)
        if span is False:
            v = self.variables
            span = None
            if v.size and int(v[-1]) - int(v[0]) == v.size - 1 and _is_step_one(v):
                span = (int(v[0]), int(v[-1]) + 1)
            self._span = span
        return span

    def local(self, x: np.ndarray) -> np.ndarray:
        """``x[self.variables]``: a view when the variables are one contiguous range."""
        span = self.contiguous()
        return x[self.variables] if span is None else x[span[0] : span[1]]

    def residual_scale(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`residual` and :meth:`row_scale` together."""
        return self.residual(x), self.row_scale(x)

    def residual_chunks(self, x: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(first row, residual, row scale)`` over consecutive row ranges covering the block; large
        structured blocks yield cache-sized chunks (no block-sized temporaries)."""
        r, s = self.residual_scale(x)
        yield 0, r, s

    def row_scale(self, x: np.ndarray) -> np.ndarray:
        """``|C_j| |x| + |b_j|`` per row: the size of the terms a row's residual cancels."""
        C, b = self.local_rows()
        return abs(C) @ np.abs(x) + np.abs(b)

    def row_terms(self) -> int:
        """The largest number of non-zeros in one row (for rounding-error bounds)."""
        C = self.local_rows()[0]
        return int(np.diff(C.indptr).max(initial=0))

    def select_rows(self, rows: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
        """Rows ``rows`` (in the order of :meth:`residual`) as ``(C over the local variables, b)``."""
        C, b = self.local_rows()
        return C[rows], b[rows]

    def rows(self, n: int) -> tuple[sp.csr_matrix, np.ndarray]:
        """The block's rows as an ``m_j x n`` sparse matrix over all ``n`` variables, and ``b_j``."""
        C, b = self.local_rows()
        C = sp.coo_matrix(C)
        return sp.csr_matrix((C.data, (C.row, self.variables[C.col])), shape=(C.shape[0], n)), b

    def check_feasible(self, x: np.ndarray) -> None:
        """Raise :class:`InfeasibleConstraintsError` if the projection ``x`` misses the block's rows:
        the block alone has no solution (e.g. contradictory fixed values)."""
        r = self.residual(x)
        if r.size == 0:
            return
        gap = float(np.max(np.abs(r)))
        scale = 1.0 + float(np.max(np.abs(self.local_rows()[1]), initial=0.0)) + float(np.max(np.abs(x), initial=0.0))
        if gap > FEASIBILITY_RTOL * scale:
            raise InfeasibleConstraintsError(
                f"constraint family {self.family!r} is infeasible by itself: its rows leave a gap {gap:.3g}"
            )


def _is_step_one(v: np.ndarray, chunk: int = 1 << 18) -> bool:
    """``v[i + 1] - v[i] == 1`` for all ``i``, in cache-sized chunks (no array-sized temporaries)."""
    return all(bool(np.all(np.diff(v[lo : lo + chunk + 1]) == 1)) for lo in range(0, max(v.size - 1, 0), chunk))


def project_block(block: Block, x: np.ndarray, v: np.ndarray | None, homogeneous: bool) -> np.ndarray:
    """Module-level task (picklable) for executors."""
    return block.project(x, v, homogeneous)


class SparseBlock(Block):
    """General sparse rows; projector from a cached factor of ``C V C^T`` (redundant rows allowed)."""

    def __init__(self, C: Any, b: np.ndarray, variables: np.ndarray, family: str, check: bool = True) -> None:
        self.C = sp.csr_matrix(C, dtype=np.float64)
        self.b = np.asarray(b, dtype=np.float64)
        self.variables = np.asarray(variables, dtype=np.int64)
        self.family = family
        self._solver: SPDSolver | None = None
        self._v: np.ndarray | None = None
        self._checked = not check

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_solver"] = None  # factors are rebuilt where the block lands
        state["_v"] = None
        return state

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        return self.C, self.b

    def solver(self, v: np.ndarray | None) -> SPDSolver:
        """The factor of ``C V C^T``; refactorised numerically only when the variances change."""
        same = (self._v is None and v is None) or (
            self._v is not None and v is not None and self._v.shape == v.shape and np.array_equal(self._v, v)
        )
        if self._solver is not None and same:
            return self._solver
        CV = self.C if v is None else self.C @ sp.diags(v)
        S = (CV @ self.C.T).tocsc()
        if self._solver is None:
            self._solver = SPDSolver(S)
        else:
            self._solver.refactor(S)
        self._v = None if v is None else v.copy()
        return self._solver

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        r = -(self.C @ x) if homogeneous else self.b - self.C @ x
        step = self.C.T @ self.solver(v).solve(r)
        out = x + (step if v is None else v * step)
        if not homogeneous and not self._checked:
            self.check_feasible(out)
            self._checked = True
        return out


class TreeBlock(Block):
    """``x_u = sum_{c child of u} x_c`` on a forest given by a local parent array (``-1`` = root)."""

    def __init__(self, parent: np.ndarray, variables: np.ndarray, family: str) -> None:
        self.parent = np.asarray(parent, dtype=np.int64)
        self.variables = np.asarray(variables, dtype=np.int64)
        self.family = family
        self._bfs = bfs_order(self.parent)  # computed once, reused every sweep
        self._plan = two_pass_plan(*self._bfs[1:])

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        kids = np.flatnonzero(self.parent >= 0)
        internal = np.unique(self.parent[kids])
        row_of = np.full(self.parent.size, -1, dtype=np.int64)
        row_of[internal] = np.arange(internal.size)
        rows = np.concatenate([np.arange(internal.size), row_of[self.parent[kids]]])
        cols = np.concatenate([internal, kids])
        vals = np.concatenate([np.ones(internal.size), -np.ones(kids.size)])
        C = sp.csr_matrix((vals, (rows, cols)), shape=(internal.size, self.parent.size))
        return C, np.zeros(internal.size)

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        return tree_project(self.parent, x, np.ones(x.size) if v is None else v, order=self._bfs, plan=self._plan)


class LayoutTreeBlock(Block):
    """Tree consistency on a :class:`TreeLayout`, for ``k`` trees sharing the layout.

    ``variables`` has shape ``(nodes,)`` or ``(nodes, k)`` (strategy row order, root first); the local
    vector is node-major, ``x_local.reshape(nodes, k)``.  All ``k`` trees are projected by one call
    of :func:`~sparsedp.tree_estimator.two_pass` (per-tree variances allowed).
    """

    def __init__(self, layout: TreeLayout, variables: np.ndarray, family: str) -> None:
        self.layout = layout
        self._bfs = layout.bfs()  # strategy row order is breadth-first
        var = np.asarray(variables, dtype=np.int64)
        self.k = 1 if var.ndim == 1 else int(var.shape[1])
        self.variables = var.ravel()
        self.family = family

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        lay = self.layout
        rows, cols, vals = [], [], []
        r = 0
        for lev in range(1, lay.levels):
            starts = lay.child_starts[lev - 1]
            parents = lay.row_offsets[lev] + np.arange(lay.sizes[lev])
            kids = lay.row_offsets[lev - 1] + np.arange(lay.sizes[lev - 1])
            prow = r + np.arange(lay.sizes[lev])
            rows += [prow, np.repeat(prow, np.diff(starts))]
            cols += [parents, kids]
            vals += [np.ones(parents.size), -np.ones(kids.size)]
            r += lay.sizes[lev]
        if not rows:  # a single node: no rows
            return sp.csr_matrix((0, lay.nodes * self.k)), np.zeros(0)
        C = sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, lay.nodes)
        )
        C = sp.kron(C, sp.identity(self.k), format="csr") if self.k > 1 else C
        return C, np.zeros(r * self.k)

    def residual(self, x: np.ndarray) -> np.ndarray:
        """``parent - sum(children)`` per row, level by level from the leaves' parents up."""
        return self.residual_scale(x, scale=False)[0]

    def residual_scale(self, x: np.ndarray, scale: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """The residual and (``scale=True``) the row scales ``|parent| + sum |children|``."""
        parts = list(self.residual_chunks(x, scale))
        if not parts:
            return np.zeros(0), np.zeros(0) if scale else None
        r = np.concatenate([p[1] for p in parts])
        return r, np.concatenate([p[2] for p in parts]) if scale else None

    def residual_chunks(  # type: ignore[override]
        self, x: np.ndarray, scale: bool = True, chunk: int = 1 << 14
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """Level by level from the leaves' parents up, ``chunk`` parents at a time (reshapes on
        balanced levels)."""
        X = x.reshape(self.layout.nodes, self.k)
        at = 0
        for lp in layout_plan(self.layout):  # deepest parents first = residual row order
            kids = X[lp.lo : lp.hi]
            m = lp.counts.size
            for i0 in range(0, m, chunk):
                i1 = min(m, i0 + chunk)
                P = lp.parent_rows(X, i0, i1)
                r = P - lp.sum_range(kids, i0, i1)
                s = np.abs(P) + lp.sum_range(kids, i0, i1, absolute=True) if scale else None
                yield at * self.k, r.ravel(), None if s is None else s.ravel()  # type: ignore[misc]
                at += i1 - i0

    @property
    def rows_per_tree(self) -> int:
        return self.layout.nodes - self.layout.n

    def row_l1(self) -> float:
        return 1.0 + max((int(np.diff(s).max()) for s in self.layout.child_starts), default=0)

    def row_terms(self) -> int:
        return int(self.row_l1())

    def row_scale(self, x: np.ndarray) -> np.ndarray:
        return self.residual_scale(x)[1]  # type: ignore[return-value]

    def select_rows(self, rows: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
        lay, k = self.layout, self.k
        level_first = np.concatenate(([0], np.cumsum(lay.sizes[1:])))  # first residual row-group per level
        pos, col = np.divmod(np.asarray(rows, dtype=np.int64), k)
        lev = np.searchsorted(level_first, pos, side="right")  # level of the parent (1-based)
        i = pos - level_first[lev - 1]
        offsets = np.asarray(lay.row_offsets)
        first = np.empty(rows.size, dtype=np.int64)
        count = np.empty(rows.size, dtype=np.int64)
        for L in np.unique(lev):
            m = lev == L
            st = lay.child_starts[L - 1]
            first[m], count[m] = offsets[L - 1] + st[i[m]], st[i[m] + 1] - st[i[m]]
        kid = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
        cols = np.concatenate([(offsets[lev] + i) * k + col, kid * k + np.repeat(col, count)])
        rws = np.concatenate([np.arange(rows.size), np.repeat(np.arange(rows.size), count)])
        vals = np.concatenate([np.ones(rows.size), -np.ones(count.sum())])
        C = sp.csr_matrix((vals, (rws, cols)), shape=(rows.size, lay.nodes * k))
        return C, np.zeros(rows.size)

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        lay = self.layout
        X = x.reshape(lay.nodes, self.k)
        V = np.ones(lay.nodes) if v is None else v.reshape(lay.nodes, self.k)
        if V.ndim == 2 and np.all(V == V[:, :1]):
            V = V[:, 0]  # one variance per node, shared by the k trees
        return two_pass(*self._bfs, X, V, plan=layout_plan(lay)).ravel()


class BatchedBlock(Block):
    """``B x_g = r_g`` for ``G`` disjoint groups ``g`` of ``p`` variables; ``B`` is ``k x p``."""

    def __init__(self, B: np.ndarray, groups: np.ndarray, rhs: np.ndarray | None, family: str) -> None:
        self.B = np.asarray(B, dtype=np.float64)
        self.groups = np.asarray(groups, dtype=np.int64)
        self.variables = self.groups.ravel()
        G = self.groups.shape[0]
        self.rhs = np.zeros((G, self.B.shape[0])) if rhs is None else np.asarray(rhs, dtype=np.float64)
        self.family = family

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        G, p = self.groups.shape
        C = sp.kron(sp.identity(G, format="csr"), sp.csr_matrix(self.B), format="csr")
        return C, self.rhs.ravel()

    def residual(self, x: np.ndarray) -> np.ndarray:
        return (x.reshape(self.groups.shape) @ self.B.T - self.rhs).ravel()

    def row_l1(self) -> float:
        return float(np.abs(self.B).sum(axis=1).max(initial=0.0))

    def row_terms(self) -> int:
        return int(self.B.shape[1])

    def row_scale(self, x: np.ndarray) -> np.ndarray:
        return (np.abs(x.reshape(self.groups.shape)) @ np.abs(self.B).T + np.abs(self.rhs)).ravel()

    def residual_chunks(self, x: np.ndarray, chunk: int = 1 << 14) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        X = x.reshape(self.groups.shape)
        k = self.B.shape[0]
        for g0 in range(0, X.shape[0], chunk):
            Xc, R = X[g0 : g0 + chunk], self.rhs[g0 : g0 + chunk]
            yield g0 * k, (Xc @ self.B.T - R).ravel(), (np.abs(Xc) @ np.abs(self.B).T + np.abs(R)).ravel()

    def select_rows(self, rows: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
        G, p = self.groups.shape
        g, i = np.divmod(np.asarray(rows, dtype=np.int64), self.B.shape[0])
        cols = (g[:, None] * p + np.arange(p)).ravel()
        C = sp.csr_matrix((self.B[i].ravel(), (np.repeat(np.arange(rows.size), p), cols)), shape=(rows.size, G * p))
        return C, self.rhs.ravel()[rows]

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        G, p = self.groups.shape
        X = x.reshape(G, p)
        R = np.zeros_like(self.rhs) if homogeneous else self.rhs
        VX = None if v is None else v.reshape(G, p)
        return batched_project(X, self.B, R, VX).ravel()


class FixedBlock(Block):
    """``x_i = c_i`` (invariants); the weighted projection simply sets them."""

    def __init__(self, values: np.ndarray, variables: np.ndarray, family: str) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.variables = np.asarray(variables, dtype=np.int64)
        self.family = family

    def local_rows(self) -> tuple[sp.csr_matrix, np.ndarray]:
        k = self.values.size
        return sp.identity(k, format="csr"), self.values

    def residual(self, x: np.ndarray) -> np.ndarray:
        return x - self.values

    def row_l1(self) -> float:
        return 1.0

    def row_terms(self) -> int:
        return 1

    def row_scale(self, x: np.ndarray) -> np.ndarray:
        return np.abs(x) + np.abs(self.values)

    def project(self, x: np.ndarray, v: np.ndarray | None, homogeneous: bool = False) -> np.ndarray:
        return np.zeros_like(self.values) if homogeneous else self.values.copy()
