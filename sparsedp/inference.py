"""Reconstruction: from noisy measurements ``y = M x + z`` back to an estimate of ``x``.

* ``ls``   generalised least squares ``argmin_x ||V^{-1/2} (M x - y)||_2`` (``V`` = noise variances;
           seed 001 section 1.3).  Structure-aware: ``x = y`` for the identity, the exact sparse
           inverse for Fenwick (seed 000), ``M^T diag(1/||m_i||^2) y`` for Haar, a sparse triangular
           solve for square lower-triangular strategies, the O(n) two-pass estimator for trees,
           Woodbury for ``[diag(a); B]`` with at most 2048 extra rows (p-Identity;
           :mod:`sparsedp.woodbury`), and LSMR with column-norm (Jacobi) preconditioning otherwise.
* ``nnls`` the same objective with ``x >= 0`` (bounded least squares).
* ``l1``   ``argmin_{x >= 0} sum_i |y_i - (M x)_i| / s_i`` (seed 001 section 1.4; ``s_i`` the noise
           standard deviations, so with Laplace noise this is the maximum-likelihood estimate under
           non-negativity), solved as a linear program by HiGHS.

Weighted strategies ``diag(w) M`` are reduced to ``M`` with measurements ``y / w`` and variances
``V / w^2`` first, so they use ``M``'s fast path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, lsq_linear
from scipy.sparse.linalg import lsmr, spsolve_triangular

from .errors import ShapeError, SparseDPError
from .intervals import IntervalRows
from .operators import Operator, SparseOperator, aslinearoperator
from .strategies import TreeLayout, fenwick_inverse
from .tree_estimator import layout_plan, tree_gls, two_pass
from .validation import check_vector
from .woodbury import woodbury_solver

__all__ = ["Reconstruction", "l1_fit", "least_squares", "linear_estimator", "nnls", "reconstruct", "sparse_inverse"]


@dataclass(frozen=True)
class Reconstruction:
    """An estimate of the data vector and how it was obtained."""

    x: np.ndarray
    method: str
    solver: str
    iterations: int
    seconds: float
    residual: float  # weighted residual norm ||V^{-1/2}(M x - y)||_2

    def answer(self, workload: Any) -> np.ndarray:
        """Workload answers ``W x``."""
        return aslinearoperator(workload).matvec(self.x)


def _unweight(M: Operator, y: np.ndarray, variances: np.ndarray) -> tuple[Operator, np.ndarray, np.ndarray]:
    """Reduce ``diag(w) B`` to ``B`` with ``y / w`` and ``V / w^2`` (a weighted operator, or a tree
    given as weighted :class:`~sparsedp.intervals.IntervalRows`)."""
    if isinstance(M, SparseOperator) and M.base is not None and M.row_weights is not None:
        w = M.row_weights
        return M.base, y / w, variances / (w * w)
    if isinstance(M, IntervalRows) and M.structure == "tree" and not np.all(M.weights == 1.0):
        w = M.weights
        base = IntervalRows(M.shape[1], M.lo, M.hi, name=M.name, structure="tree", meta=M.meta)
        return base, y / w, variances / (w * w)
    return M, y, variances


def tree_layout(op: Operator) -> TreeLayout | None:
    """The :class:`~sparsedp.strategies.TreeLayout` whose node sums the (unweighted) tree strategy
    ``op`` measures, rows root first, or ``None``.  For interval rows the intervals are checked
    against the layout (``O(nodes)``, once per operator); a matrix operator is trusted by its tag,
    as for every structured fast path."""
    if op.structure != "tree":
        return None
    layout = getattr(op, "meta", {}).get("layout")
    if not isinstance(layout, TreeLayout) or op.shape != (layout.nodes, layout.n):
        return None
    if isinstance(op, IntervalRows):
        if "layout_checked" not in op.meta:
            starts = [layout.leaf_starts[lev] for lev in reversed(range(layout.levels))]
            lo = np.concatenate([a[:-1] for a in starts])
            hi = np.concatenate([a[1:] for a in starts])
            op.meta["layout_checked"] = bool(np.array_equal(lo, op.lo) and np.array_equal(hi, op.hi))
        if not op.meta["layout_checked"]:
            return None
    return layout


def _prepare(M: Any, y: Any, variances: Any) -> tuple[Operator, np.ndarray, np.ndarray]:
    op = aslinearoperator(M)
    yv = check_vector(y, op.shape[0], "y")
    if variances is None:
        v = np.ones(op.shape[0])
    else:
        v = check_vector(np.broadcast_to(np.asarray(variances, dtype=float), (op.shape[0],)), op.shape[0], "variances")
        if np.any(v <= 0):
            raise SparseDPError("variances must be > 0")
    return op, yv, v


def sparse_inverse(M: Operator) -> sp.csr_matrix | None:
    """The exact sparse inverse of a square structured strategy (identity, Fenwick, Haar, and their
    weighted forms), or ``None`` if the structure gives none."""
    if isinstance(M, SparseOperator) and M.base is not None and M.row_weights is not None:
        inv = sparse_inverse(M.base)
        return None if inv is None else sp.csr_matrix(inv @ sp.diags(1.0 / M.row_weights))
    n = M.shape[1]
    if M.structure == "identity":
        return sp.identity(n, format="csr")
    if M.structure == "fenwick":
        if "inverse" not in M.meta:  # type: ignore[attr-defined]
            M.meta["inverse"] = fenwick_inverse(n)  # type: ignore[attr-defined]
        return M.meta["inverse"]  # type: ignore[attr-defined]
    if M.structure == "haar":
        assert isinstance(M, SparseOperator)
        if "inverse" not in M.meta:  # built once per operator
            M.meta["inverse"] = sp.csr_matrix(M.matrix.T @ sp.diags(1.0 / M.meta["row_sq_norms"]))
        return M.meta["inverse"]
    return None


def _exact_solver(base: Operator, v: np.ndarray):
    """The exact structured GLS solve ``Y -> X`` of an unweighted strategy (vectors or matrices),
    and its name; ``None`` when only an iterative method applies."""
    inv = sparse_inverse(base)
    if inv is not None:
        return (lambda Y: inv @ Y), f"sparse-inverse({base.structure})"
    layout = tree_layout(base)
    if layout is not None:
        return (lambda Y: tree_gls(layout, Y, v)), "tree-two-pass"
    solve = getattr(base, "exact_solve", None)  # a square invertible structured strategy (Toeplitz)
    if solve is not None:
        return solve, f"exact-solve({base.structure})"
    hybrid = _hybrid_solver(base, v)  # the optimiser's hybrid strategies: Woodbury on block forests
    if hybrid is not None:
        return hybrid
    if base.structure == "lower_triangular":
        L = sp.csr_matrix(base.tosparse())
        return (lambda Y: spsolve_triangular(L, Y, lower=True)), "triangular-solve"
    wb = woodbury_solver(base, v)  # [diag(a); B]: p-Identity and other identity-plus-rows strategies
    if wb is not None:
        return wb, f"woodbury(p={base.shape[0] - base.shape[1]})"
    return None


def _hybrid_solver(base: Operator, v: np.ndarray):
    """The exact GLS of a hybrid strategy (:class:`sparsedp.optimize.hybrid.HybridGLS`, its layout
    checked against the matrix) under one noise variance on every row (GLS = ordinary least
    squares), vectors or matrices; ``None`` otherwise."""
    if not (isinstance(base, SparseOperator) and "hybrid" in base.meta):
        return None
    v = np.asarray(v, dtype=np.float64)
    if v.size == 0 or float(v.min()) != float(v.max()):
        return None
    from .optimize.hybrid import hybrid_gls

    gls = hybrid_gls(base)
    if gls is None:
        return None

    def solve(Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim == 1:
            return gls.solve(Y)
        return np.column_stack([gls.solve(Y[:, j]) for j in range(Y.shape[1])])

    return solve, f"hybrid-woodbury(p={base.meta['hybrid'].P.shape[0]})"


def linear_estimator(M: Any, variances: Any = None):
    """The GLS estimator ``y -> x_hat`` as a function on vectors or matrices (one column each).

    Returns ``(apply, solver_name)``.  Used for error analytics (applied to unit vectors).
    """
    op = aslinearoperator(M)
    v = np.ones(op.shape[0]) if variances is None else np.broadcast_to(np.asarray(variances, float), (op.shape[0],))
    base, _, vb = _unweight(op, np.zeros(op.shape[0]), v)
    w = None if base is op else (op.weights if isinstance(op, IntervalRows) else op.row_weights)
    exact = _exact_solver(base, vb)
    if exact is not None:
        fn, name = exact
    else:
        def fn(Y: np.ndarray) -> np.ndarray:
            if Y.ndim == 1:
                return least_squares(base, Y, vb).x
            return np.column_stack([least_squares(base, Y[:, j], vb).x for j in range(Y.shape[1])])

        name = "per-column least squares"
    if w is None:
        return fn, name

    def weighted_fn(Y: np.ndarray) -> np.ndarray:
        return fn(Y / (w if Y.ndim == 1 else w[:, None]))

    return weighted_fn, name


def least_squares(
    M: Any,
    y: Any,
    variances: Any = None,
    *,
    tol: float = 1e-12,
    maxiter: int | None = None,
) -> Reconstruction:
    """Generalised least squares ``argmin_x ||V^{-1/2}(M x - y)||_2``, structure-aware.

    For a rank-deficient general ``M`` the minimum-norm solution is returned (LSMR from zero).
    """
    t0 = time.perf_counter()
    op, yv, v = _prepare(M, y, variances)
    base, yb, vb = _unweight(op, yv, v)
    iterations = 0
    layout = tree_layout(base)
    if layout is not None:
        x, resid = _tree_least_squares(layout, yb, vb)
        return Reconstruction(x, "ls", "tree-two-pass", 0, time.perf_counter() - t0, resid)
    exact = _exact_solver(base, vb)
    if exact is not None:
        fn, solver = exact
        x = fn(yb)
    else:
        x, iterations = _lsmr_gls(base, yb, vb, tol, maxiter)
        solver = "lsmr"
    x = np.asarray(x, dtype=np.float64).ravel()
    resid = float(np.linalg.norm((base.matvec(x) - yb) / np.sqrt(vb)))
    return Reconstruction(x, "ls", solver, iterations, time.perf_counter() - t0, resid)


def _tree_least_squares(layout: TreeLayout, y: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, float]:
    """GLS on a tree strategy by the publishers' code path: :func:`~sparsedp.tree_estimator.two_pass`
    with the layout's cached plan, ``O(nodes)`` time and memory, never the explicit matrix.

    The node estimates are consistent, so they *are* ``M x_hat`` (in strategy row order) and the
    residual ``||V^{-1/2}(M x_hat - y)||`` needs no product with ``M``."""
    parent, level_start = layout.bfs()
    nodes = two_pass(parent, level_start, y, v, plan=layout_plan(layout))
    x = layout.level_rows(nodes, 0).copy()  # leaves; the copy lets the node array go
    nodes -= y
    nodes /= np.sqrt(v)
    return x, float(np.linalg.norm(nodes))


def _lsmr_gls(M: Operator, y: np.ndarray, v: np.ndarray, tol: float, maxiter: int | None) -> tuple[np.ndarray, int]:
    """LSMR on ``V^{-1/2} M D^{-1}`` with ``D`` the column 2-norms (Jacobi preconditioning)."""
    A = sp.diags(1.0 / np.sqrt(v)) @ M.tosparse()
    d = np.sqrt(np.asarray(A.multiply(A).sum(axis=0)).ravel())
    d[d == 0] = 1.0
    As = A @ sp.diags(1.0 / d)
    out = lsmr(As, y / np.sqrt(v), atol=tol, btol=tol, maxiter=maxiter or 20 * max(M.shape))
    return out[0] / d, int(out[2])


def nnls(M: Any, y: Any, variances: Any = None, *, tol: float = 1e-10) -> Reconstruction:
    """Non-negative GLS: ``argmin_{x >= 0} ||V^{-1/2}(M x - y)||_2`` (scipy ``lsq_linear``, TRF)."""
    t0 = time.perf_counter()
    op, yv, v = _prepare(M, y, variances)
    ls = least_squares(op, yv, v)
    if np.all(ls.x >= 0):  # the unconstrained optimum is feasible, hence optimal
        return Reconstruction(ls.x, "nnls", ls.solver + " (feasible)", 0, time.perf_counter() - t0, ls.residual)
    s = 1.0 / np.sqrt(v)
    A = sp.diags(s) @ op.tosparse()
    res = lsq_linear(A, yv * s, bounds=(0.0, np.inf), method="trf", tol=tol, lsmr_tol="auto", max_iter=2000)
    x = np.maximum(res.x, 0.0)
    resid = float(np.linalg.norm(A @ x - yv * s))
    return Reconstruction(x, "nnls", "lsq_linear-trf", int(res.nit), time.perf_counter() - t0, resid)


def l1_fit(M: Any, y: Any, variances: Any = None) -> Reconstruction:
    """``argmin_{x >= 0} sum_i |y_i - (M x)_i| / s_i`` as an LP (HiGHS), ``s_i = sqrt(variance_i)``.

    Variables ``[x (n), t (m)]``: minimise ``sum t_i / s_i`` subject to ``M x - t <= y``,
    ``-M x - t <= -y``, ``x, t >= 0``.
    """
    t0 = time.perf_counter()
    op, yv, v = _prepare(M, y, variances)
    m, n = op.shape
    A = op.tosparse()
    I = sp.identity(m, format="csr")
    A_ub = sp.vstack([sp.hstack([A, -I]), sp.hstack([-A, -I])], format="csr")
    b_ub = np.concatenate([yv, -yv])
    c = np.concatenate([np.zeros(n), 1.0 / np.sqrt(v)])
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, bounds=(0, None), method="highs")
    if res.status != 0:
        raise SparseDPError(f"L1 fit failed: {res.message}")
    x = np.maximum(res.x[:n], 0.0)
    resid = float(np.linalg.norm((A @ x - yv) / np.sqrt(v)))
    return Reconstruction(x, "l1", "highs-lp", int(getattr(res, "nit", 0)), time.perf_counter() - t0, resid)


_METHODS = {"ls": least_squares, "nnls": nnls, "l1": l1_fit}


def reconstruct(measurement: Any, method: str = "ls") -> Reconstruction:
    """Estimate ``x`` from a :class:`~sparsedp.mechanism.Measurement` (uses its per-row variances)."""
    if method not in _METHODS:
        raise SparseDPError(f"method must be one of {sorted(_METHODS)}, got {method!r}")
    try:
        strategy, y, variances = measurement.strategy, measurement.y, measurement.variances
    except AttributeError as exc:
        raise ShapeError("reconstruct() needs a Measurement (with strategy, y and variances)") from exc
    return _METHODS[method](strategy, y, variances)
