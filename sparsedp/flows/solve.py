"""Weighted projection onto flow conservation, with solvers for graph-Laplacian systems.

``x = argmin_{C x = b} sum_i (x_i - x~_i)^2 / var_i`` is ``x = x~ - V C^T lambda`` with
``S lambda = C x~ - b``, ``S = C V C^T`` (seed 002's optimal consistent release with
``D = V^-1``).  ``S`` is a weighted graph Laplacian (plus a positive diagonal when the start and
end counts are variables), so:

* ``direct``       sparse Cholesky of ``S`` (CHOLMOD via scikit-sparse, fill-reducing ordering;
                   scipy ``splu`` when scikit-sparse is missing).
* ``amg``          conjugate gradients preconditioned by pyamg smoothed aggregation (one V-cycle),
                   the method of choice for Laplacians too large to factor.
* ``cg``           Jacobi-preconditioned conjugate gradients (enough when ``S`` is well conditioned).
* ``alternating``  the seed's cyclic projections with one block per intersection; blocks of one
                   colour of a proper colouring of the road graph touch disjoint variables and are
                   projected together (a multicolour Gauss-Seidel sweep on ``S``).
* ``generic``      dense pseudo-inverse (small systems and verification only).

For the fixed-end-point system ``S`` is singular (constants on each weakly connected component);
one node per component is grounded (``lambda = 0`` there), which leaves ``V C^T lambda`` unchanged.
Every method stops on the constraint residual ``max |C x - b|`` (which equals the residual of
the ``S`` system), not on the change between iterations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import cg, splu

from ..errors import SparseDPError
from ..progress import SolverProgress, loop_disable
from ..validation import check_positive, check_vector
from .conservation import FlowSystem

__all__ = ["METHODS", "FlowSolve", "check_method", "choose_method", "project"]

METHODS = ("auto", "direct", "amg", "cg", "alternating", "generic")
PROGRESS_EVERY = 0.25  # seconds between the residuals a drawn CG progress bar computes
_GENERIC_LIMIT = 4000  # variables


@dataclass(frozen=True)
class FlowSolve:
    """A consistent flow vector and how it was obtained."""

    x: np.ndarray
    method: str
    solver: str
    reason: str
    iterations: int
    residual: float  # max |C x - b|
    seconds: float


def choose_method(system: FlowSystem) -> tuple[str, str]:
    """``auto``: the method for this system and why."""
    n = system.nodes
    if system.variables <= 2000:
        return "direct", f"small system ({system.variables} variables): one sparse Cholesky"
    if not system.fixed_endpoints:
        return "cg", "end points are variables: S = Laplacian + positive diagonal is well conditioned, Jacobi-CG converges in tens of steps"
    if n <= 200_000:
        return "direct", f"{n} nodes: the Cholesky factor of the grounded Laplacian fits and is fastest"
    return "amg", f"{n} nodes with fixed end points: singular Laplacian too large to factor quickly; AMG-preconditioned CG"


def check_method(system: FlowSystem, method: str) -> tuple[str, str]:
    """The method :func:`project` will run for ``method`` (``auto`` resolved) and why, or
    :class:`SparseDPError` if it cannot run here: an unknown name, ``generic`` above its size
    limit, ``amg`` without pyamg.  A release calls this before it charges the budget."""
    if not isinstance(method, str) or method not in METHODS:
        raise SparseDPError(f"method must be one of {METHODS}, got {method!r}")
    reason = "requested"
    if method == "auto":
        method, reason = choose_method(system)
    if method == "generic" and system.variables > _GENERIC_LIMIT:
        raise SparseDPError(f"generic (dense pseudo-inverse) is for <= {_GENERIC_LIMIT} variables, not {system.variables}")
    if method == "amg":
        try:
            import pyamg  # noqa: F401
        except ImportError as exc:
            raise SparseDPError("method 'amg' needs pyamg (pip install pyamg)") from exc
    return method, reason


def _grounded(system: FlowSystem, S: sp.csr_matrix) -> np.ndarray:
    """Indices of the rows kept after grounding one node per weakly connected component."""
    if not system.fixed_endpoints:
        return np.arange(S.shape[0])
    ncomp, labels = connected_components(S, directed=False)
    first = np.unique(labels, return_index=True)[1]
    keep = np.ones(S.shape[0], dtype=bool)
    keep[first] = False
    return np.flatnonzero(keep)


def project(
    x_noisy: np.ndarray,
    system: FlowSystem,
    variances: np.ndarray | float | None = None,
    method: str = "auto",
    tol: float = 1e-8,
    maxiter: int = 10_000,
) -> FlowSolve:
    """Weighted projection of ``x_noisy`` onto ``C x = b`` (see the module docstring)."""
    t0 = time.perf_counter()
    x0 = check_vector(x_noisy, system.variables, "x_noisy")
    if variances is None:
        var = np.ones(system.variables)
    else:
        var = check_vector(np.broadcast_to(np.asarray(variances, dtype=float), (system.variables,)), system.variables, "variances")
        if np.any(var <= 0):
            raise SparseDPError("variances must be > 0")
    tol = check_positive(tol, "tol")
    method, reason = check_method(system, method)
    C = system.C
    rhs = C @ x0 - system.b
    if method == "alternating":
        x, its = _alternating(x0, system, var, tol, maxiter)
        solver = "multicolour block projections"
    else:
        S = sp.csr_matrix(C @ sp.diags(var) @ C.T)
        keep = _grounded(system, S)
        Sk = S[keep][:, keep]
        lam = np.zeros(S.shape[0])
        its = 1
        if method == "generic":
            Cd = C.toarray()
            lam = np.linalg.pinv(Cd @ np.diag(var) @ Cd.T) @ rhs
            solver = "dense pseudo-inverse"
        elif method == "direct":
            lam[keep], solver = _direct(Sk, rhs[keep])
        elif method in ("amg", "cg"):
            lam[keep], its, solver = _krylov(Sk, rhs[keep], method, tol, maxiter)
        x = x0 - var * (C.T @ lam)
    residual = float(np.abs(C @ x - system.b).max()) if system.b.size else 0.0
    return FlowSolve(x, method, solver, reason, its, residual, time.perf_counter() - t0)


def _direct(S: sp.csr_matrix, r: np.ndarray) -> tuple[np.ndarray, str]:
    # Not the consistency engine's SPDSolver: its beta = 1e-10 max(diag) regularisation leaves
    # max|Cx - b| ~ 6e-8 on the grounded (ill-conditioned) Laplacian at 1e5 nodes, above the 1e-8
    # this solver promises; the grounded system is positive definite and needs no shift.
    try:
        from sksparse.cholmod import cholesky
    except ImportError:  # the core works without scikit-sparse
        return splu(sp.csc_matrix(S)).solve(r), "scipy splu"
    return cholesky(sp.csc_matrix(S))(r), "CHOLMOD (AMD ordering)"


def _krylov(S: sp.csr_matrix, r: np.ndarray, method: str, tol: float, maxiter: int) -> tuple[np.ndarray, int, str]:
    if method == "amg":
        import pyamg

        M = pyamg.smoothed_aggregation_solver(S, symmetry="symmetric").aspreconditioner(cycle="V")
        solver = "CG + pyamg smoothed aggregation"
    else:
        d = S.diagonal()
        M = sp.diags(1.0 / d)
        solver = "CG + Jacobi"
    count = [0]
    # the S-residual equals the constraint residual; CG's rtol is relative to ||r||_2
    scale = np.linalg.norm(r)
    rtol = min(0.5, tol / scale) if scale > 0 else 0.5
    progress = SolverProgress(rtol, desc=solver, disable=loop_disable())
    # the residual costs one more product: only for a drawn bar, at most every PROGRESS_EVERY seconds
    live = not progress.bar.disable
    shown = [time.perf_counter()]

    def cb(lam_k: np.ndarray) -> None:
        count[0] += 1
        if live and time.perf_counter() - shown[0] >= PROGRESS_EVERY:
            progress(count[0], lam_k, float(np.linalg.norm(r - S @ lam_k)) / scale if scale > 0 else 0.0)
            shown[0] = time.perf_counter()

    with progress:
        lam, info = cg(S, r, rtol=rtol, atol=0.0, maxiter=maxiter, M=M, callback=cb)
    if info > 0:
        raise SparseDPError(f"{solver} did not reach tol {tol} in {maxiter} iterations")
    return lam, count[0], solver


def _colouring(system: FlowSystem) -> np.ndarray:
    """A proper colouring of the nodes (nodes sharing an edge variable differ), vectorised Luby
    rounds: uncoloured nodes whose random priority beats all uncoloured neighbours take the
    smallest colour unused by their coloured neighbours."""
    B = system.C[:, : system.edges]
    A = sp.csr_matrix(abs(B) @ abs(B).T)
    A.setdiag(0)
    A.eliminate_zeros()
    n = A.shape[0]
    rng = np.random.default_rng(0)
    prio = rng.random(n)
    colour = np.full(n, -1)
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    cols = A.indices
    while np.any(colour < 0):
        unc = colour < 0
        # a node wins if no uncoloured neighbour has a higher priority
        beaten = np.zeros(n, dtype=bool)
        m = unc[rows] & unc[cols] & (prio[cols] > prio[rows])
        beaten[rows[m]] = True
        winners = np.flatnonzero(unc & ~beaten)
        # smallest colour not used by already coloured neighbours
        used = colour[cols]
        maxc = int(colour.max()) + 2
        taken = np.zeros((n, maxc + 1), dtype=bool) if n * (maxc + 1) < 5e7 else None
        if taken is not None:
            ok = used >= 0
            taken[rows[ok], used[ok]] = True
            colour[winners] = np.argmin(taken[winners], axis=1)
        else:  # pragma: no cover - very many colours on a huge graph
            colour[winners] = maxc
    return colour


def _alternating(x0: np.ndarray, system: FlowSystem, var: np.ndarray, tol: float, maxiter: int) -> tuple[np.ndarray, int]:
    C = system.C
    colour = _colouring(system)
    classes = [np.flatnonzero(colour == c) for c in range(int(colour.max()) + 1)]
    blocks = [(idx, sp.csr_matrix(C[idx]), np.asarray(C[idx].multiply(C[idx]) @ var).ravel()) for idx in classes]
    x = x0.copy()
    with SolverProgress(tol, desc="alternating projections", disable=loop_disable()) as progress:
        for sweep in range(1, maxiter + 1):
            for idx, Cc, diag in blocks:
                r = Cc @ x - system.b[idx]
                x -= var * (Cc.T @ (r / diag))
            residual = float(np.abs(C @ x - system.b).max())
            progress(sweep, x, residual)
            if residual <= tol:
                return x, sweep
    raise SparseDPError(f"alternating projections did not reach tol {tol} in {maxiter} sweeps")
