"""The optimal consistent release ``argmin_{C x = b} ||x - x~||_D`` (seed 002), by five methods.

``D = diag(1 / variances)`` (the identity when no variances are given).  The answer is
``x~ + V C^T (C V C^T)^+ (b - C x~)`` (seed 002, Thm 1, eq. 7, in weighted form).

* ``"generic"``: that formula with a dense Moore-Penrose pseudo-inverse,
  ``x = x~ + V^{1/2} (C V^{1/2})^+ (b - C x~)``: the seed's baseline, O(m n min(m, n)) time; refuses
  problems whose dense matrices would not fit in ``generic_max_bytes``.
* ``"direct"``: one sparse factorisation of ``S = C V C^T`` (CHOLMOD, scipy ``splu`` fallback),
  regularised and refined so that redundant rows are harmless (see ``projectors.SPDSolver``).
* ``"alternating"``: the seed's method: project onto each group of blocks in turn (eq. 8), ``sweep=
  "cyclic"`` (1, 2, ..., k) or ``"symmetric"`` (1, ..., k, ..., 1).  Seed 002 proves convergence to
  the optimum for any split of the rows; the speed is the Friedrichs-angle rate, which can be
  arbitrarily close to 1 (the restaurant with equal variances: ``1 - 1/(2T - 1)``).
* ``"accelerated"``: conjugate gradients on ``(I - Q) x = c`` where ``x -> Q x + c`` is one
  symmetric sweep (CGMN, Bjorck and Elfving 1979; Gordon and Gordon 2005).  ``Q`` is self-adjoint
  and positive semi-definite in the ``D`` inner product and equals the identity exactly on
  ``null(C)``, so CG started at ``x~`` stays in ``x~ + range(V C^T)`` and converges to the optimum.
* ``"structured"``: trees on one layout whose node vectors lie in one span (the restaurant, in
  either formulation): the exact O(n) block two-pass of :mod:`.treespan`, any variances, with a
  re-aggregation finish (parents = float sums of their children).
* ``"auto"``: ``"structured"`` when the constraints have that shape; else, when all blocks touch
  disjoint variables (one group), one projection of the group (exact); else, with equal variances
  and every block a cheap structured projector, one alternating sweep first (exact when the
  projectors commute); if that does not reach ``tol``, or otherwise, ``"direct"``.

Stopping is on the constraint residual ``max |C x - b| <= tol``, never on the change between
sweeps (a slow sweep changes little while still far from the answer).  Every iterate of the
iterative methods lies in ``x~ + range(V C^T)`` (up to rounding), so the only consistent point they
can reach is the optimum.  The reported ``residual`` is the exact one of the returned vector
(:mod:`.residuals`) and ``converged`` means it meets the requested ``tol``, which is never raised: a
``tol`` below the float64 evaluation floor is met by finishing steps (iterative refinement of the
KKT system with the direct factor) or refused with :class:`ToleranceUnattainableError` naming the
attainable residual.  ``error_estimate`` is an upper bound on ``||x - x*||_D`` computed from the
exact decomposition of the error into its ``range(V C^T)`` and ``null(C)`` parts (:class:`_Certifier`)
where the direct factor is built, NaN elsewhere (:func:`solve`, ``certify``).

``nonnegative=True`` adds ``x >= 0`` by Dykstra's algorithm between the affine set (projected with
the direct factor) and the orthant (a clip, exact in any diagonal weighting); for affine sets
Dykstra's correction term is zero (Boyle and Dykstra 1986), so one correction vector suffices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError, ShapeError, SparseDPError, UnsupportedStructureError
from ..executors import Executor, get_executor
from ..validation import check_positive, check_vector
from .blocks import Block, SparseBlock, project_block
from .families import ConstraintFamily
from .residuals import accurate_residual, dot2_rows
from .treespan import detect_tree_span, tree_span_solve

__all__ = [
    "ConsistencyResult",
    "Problem",
    "ToleranceUnattainableError",
    "compile_constraints",
    "solve",
    "METHODS",
]

METHODS = ("auto", "generic", "direct", "alternating", "accelerated", "structured")
GENERIC_MAX_BYTES = 2 * 1024**3
DEFAULT_TOL = 1e-10  # tol=None: max(DEFAULT_TOL, the float64 floor of the data)
FACTOR_MAX_NNZ = 4_000_000  # certify=None: factor / bound (iterative, direct) only up to this nnz(C)
MAX_REFINEMENTS = 3  # finishing steps (iterative refinement with the direct factor)
CERTIFY_RTOL = 1e-3  # the measured correction to r^T S^+ r must stay below this share for a bound
_U = 2.0**-53


class ToleranceUnattainableError(SparseDPError):
    """``tol`` is below what the float64 answer reaches.

    ``attainable`` is the exact residual ``max |C x - b|`` of the best vector found (after any
    finishing steps): the tolerance that can be met.  ``result`` is that answer, with
    ``converged=False``, so nothing computed is lost.
    """

    def __init__(self, message: str, tol: float, attainable: float, result: "ConsistencyResult | None" = None) -> None:
        super().__init__(message)
        self.tol, self.attainable, self.result = tol, attainable, result


@dataclass(frozen=True)
class ConsistencyResult:
    """A consistent release and how it was reached.

    ``residual`` is ``max |C x - b|`` of the returned float64 vector, evaluated exactly on the rows
    where float64 evaluation could err by more than 1 % of ``tol`` (:mod:`.residuals`);
    ``relative_residual`` is ``residual / max_i (|C||x| + |b|)_i`` (normwise backward error);
    ``residual_bounded`` says the exact evaluation was capped and ``residual`` is an upper bound.
    ``history`` holds one entry per iteration (sweep or CG step) of ``mse`` (seed 002 eq. 14:
    ``||C x_s - b||^2 / m``), ``err`` (eq. 15: the RMSE against the truth, NaN without it),
    ``residual`` and ``change`` (``max |x_s - x_{s-1}|``), all evaluated in float64; finishing
    steps are iterations too (``refinements`` of them).  ``converged`` means the exact
    ``residual <= tolerance``, the ``tol`` requested (never raised).  ``error_estimate`` is an
    upper bound on ``||x - x*||_D`` (``x*`` the exact optimum, ``D = diag(1 / variances)``) or NaN
    when none was computed (:func:`solve`).
    """

    x: np.ndarray
    method: str
    iterations: int
    sweeps: float
    residual: float
    seconds: float
    converged: bool
    error_estimate: float
    history: dict[str, np.ndarray]
    executor: str = "inprocess"
    constraints: int = 0
    relative_residual: float = float("nan")
    residual_bounded: bool = False
    tolerance: float = float("nan")
    refinements: int = 0


class Problem:
    """Compiled constraints: blocks, groups of blocks on disjoint variables; all rows ``C`` (built
    only when a method needs them); residuals from the blocks' own (structured) residuals."""

    def __init__(self, n: int, blocks: list[Block], groups: list[list[int]], block_family: list[int], names: list[str]):
        self.n, self.blocks, self.groups, self.family_names = n, blocks, groups, names
        self.block_family = block_family
        self._C: sp.csr_matrix | None = None
        self._b: np.ndarray | None = None

    def _build(self) -> None:
        rows = [blk.rows(self.n) for blk in self.blocks]
        self._C = sp.vstack([r[0] for r in rows], format="csr") if rows else sp.csr_matrix((0, self.n))
        self._b = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0)

    @property
    def C(self) -> sp.csr_matrix:
        if self._C is None:
            self._build()
        return self._C  # type: ignore[return-value]

    @property
    def b(self) -> np.ndarray:
        if self._b is None:
            self._build()
        return self._b  # type: ignore[return-value]

    def residual_parts(self, x: np.ndarray) -> list[np.ndarray]:
        parts = [blk.residual(blk.local(x)) for blk in self.blocks]
        self._rows = int(sum(p.size for p in parts))
        return parts

    def residual_vector(self, x: np.ndarray) -> np.ndarray:
        parts = self.residual_parts(x)
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def rows(self) -> int:
        """Number of constraint rows (from the built ``C`` if there is one, else one residual)."""
        if self._C is not None:
            return int(self._C.shape[0])
        if getattr(self, "_rows", None) is None:
            self.residual_parts(np.zeros(self.n))
        return self._rows

    def conflicting(self, x: np.ndarray, tol: float) -> list[str]:
        """The families whose rows ``x`` misses by more than ``tol``, each named by its position in
        the constraint list, its name and the variables of its violated rows (the first few)."""
        bad: dict[int, list[int]] = {}
        for j, r in enumerate(self.residual_parts(x)):
            if r.size and np.max(np.abs(r)) > tol:
                blk = self.blocks[j]
                C, _ = blk.local_rows() if r.size <= 10_000 else (None, None)
                if C is not None:
                    rows = np.flatnonzero(np.abs(r) > tol)
                    local = np.unique(sp.csr_matrix(C)[rows].indices)
                    bad.setdefault(self.block_family[j], []).extend(blk.variables[local][:8].tolist())
                else:
                    bad.setdefault(self.block_family[j], [])
        out = []
        for i in sorted(bad):
            vars_ = sorted(set(bad[i]))[:8]
            where = f" on variables {vars_}" if vars_ else ""
            out.append(f"#{i} {self.family_names[i]!r}{where}")
        return out


def _as_families(constraints: Any) -> list[ConstraintFamily]:
    fams = [constraints] if isinstance(constraints, ConstraintFamily) else list(constraints)
    for f in fams:
        if not isinstance(f, ConstraintFamily):
            raise SparseDPError(f"constraints must be ConstraintFamily objects, got {type(f).__name__}")
    return fams


def compile_constraints(constraints: ConstraintFamily | Iterable[ConstraintFamily], n: int) -> Problem:
    """Blocks of every family, grouped greedily in order: a block joins the current group when it
    shares no variable with it (blocks of a group commute and can run in parallel)."""
    fams = _as_families(constraints)
    blocks: list[Block] = []
    names: list[str] = []
    fam_of_block: list[int] = []
    for i, fam in enumerate(fams):
        names.append(fam.name)
        for blk in fam.blocks(n):
            blocks.append(blk)
            fam_of_block.append(i)
    groups: list[list[int]] = []
    used = np.zeros(n, dtype=bool)
    for j, blk in enumerate(blocks):
        if not groups or np.any(blk.local(used)):
            for i in groups[-1] if groups else []:
                _mark(used, blocks[i], False)
            groups.append([])
        groups[-1].append(j)
        _mark(used, blk, True)
    return Problem(n, blocks, groups, fam_of_block, names)


def _mark(used: np.ndarray, blk: Block, value: bool) -> None:
    span = blk.contiguous()
    if span is None:
        used[blk.variables] = value
    else:
        used[span[0] : span[1]] = value


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


class _Recorder:
    def __init__(
        self, problem: Problem, truth: np.ndarray | None, callback: Callable[..., Any] | None, tol: float = np.inf
    ) -> None:
        self.problem, self.truth, self.callback, self.tol = problem, truth, callback, tol
        self.rows: dict[str, list[float]] = {"mse": [], "err": [], "residual": [], "change": []}

    def __call__(self, x: np.ndarray, change: float) -> float:
        """Evaluate ``x``'s residual in float64 and record the iteration; returns ``max |C x - b|``."""
        r = self.problem.residual_vector(x)
        res = float(np.max(np.abs(r), initial=0.0))
        self.record(x, change, float(np.mean(r**2)) if r.size else 0.0, res)
        return res

    def record(self, x: np.ndarray, change: float, mse: float, residual: float) -> None:
        """Append one iteration's measures (seed 002 eqs. 14-15) and call the user's callback."""
        self.rows["mse"].append(mse)
        self.rows["err"].append(float(np.sqrt(np.mean((x - self.truth) ** 2))) if self.truth is not None else np.nan)
        self.rows["residual"].append(residual)
        self.rows["change"].append(change)
        if self.callback is not None:
            self.callback(len(self.rows["residual"]), x, residual)

    def history(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.rows.items()}


class _Sweeper:
    """Applies group projections (each group's blocks through the executor)."""

    def __init__(self, problem: Problem, v: np.ndarray | None, executor: Executor) -> None:
        self.problem, self.v, self.executor = problem, v, executor
        self.handles = executor.scatter(problem.blocks)
        self.projections = 0

    def group(self, x: np.ndarray, g: int, homogeneous: bool) -> np.ndarray:
        ids = self.problem.groups[g]
        blocks = [self.problem.blocks[j] for j in ids]
        xs = [x[b.variables] for b in blocks]
        vs = [None if self.v is None else self.v[b.variables] for b in blocks]
        outs = self.executor.map(
            project_block, [self.handles[j] for j in ids], xs, vs, [homogeneous] * len(ids)
        )
        x = x.copy()
        for b, o in zip(blocks, outs):
            x[b.variables] = o
        self.projections += 1
        return x

    def sweep(self, x: np.ndarray, order: Sequence[int], homogeneous: bool = False) -> np.ndarray:
        for g in order:
            x = self.group(x, g, homogeneous)
        return x


def _inner(u: np.ndarray, w: np.ndarray, v: np.ndarray | None) -> float:
    return float(np.dot(u, w if v is None else w / v))


def _float_floor(problem: Problem, x: np.ndarray) -> float:
    """``16 eps max_row_l1 (1 + max|x|)``: below it a float64 evaluation of ``C x - b`` (what the
    iterations stop on) is dominated by its own rounding.  Iterations stop at ``max(tol, floor)``;
    a smaller ``tol`` is then met by a finishing step or refused (:class:`_Finisher`), never
    raised."""
    row_l1 = max((blk.row_l1() for blk in problem.blocks), default=0.0)
    return 16 * np.finfo(float).eps * row_l1 * (1.0 + float(np.max(np.abs(x), initial=0.0)))


def _nnz_bound(problem: Problem) -> int:
    """An upper bound on ``nnz(C)`` from the blocks' row counts and widths (``C`` is not built)."""
    parts = problem.residual_parts(np.zeros(problem.n))
    return int(sum(p.size * blk.row_terms() for blk, p in zip(problem.blocks, parts)))


def _gamma(k: int) -> float:
    return k * _U / (1.0 - k * _U)


class _Certifier:
    """The factor of the whole system's ``S = C V C^T`` (the one ``direct`` projects with), used for
    finishing steps and for the error bound.  Both come from one decomposition of the error.

    Let ``x*`` be the optimum, ``e = x - x*``, ``R = range(V C^T)`` and ``N = null(C)`` (``D``-
    orthogonal complements).  Since ``x* - x~ in R`` (optimality) and ``C e = r = C x - b``,

        ``e = e_R + e_N``,  ``e_R = V C^T S^+ r``,  ``e_N = P_N (x - x~)``,
        ``||e||_D^2 = ||e_R||_D^2 + ||e_N||_D^2``,  ``||e_R||_D^2 = r^T S^+ r``.

    * ``r`` is evaluated by :func:`~.residuals.dot2_rows` (as if in twice the working precision);
      ``z`` solves ``S z = r`` with the factor (refined).  With ``s = r - S z`` (``S z`` as
      ``C (V C^T z)``), ``r^T S^+ r = z^T S z + 2 z^T s + s^T S^+ s`` exactly; the last term is
      estimated with one more solve ``w = S^+ s`` and taken twice, so
      ``||e_R||_D^2 <= z^T S z + 2 |z^T s| + 2 |s^T w|`` (the correction is second order in the
      solve's error; above ``CERTIFY_RTOL z^T S z`` the solve is not trusted and no bound is given).
      The finishing step uses ``e_R = V C^T z``.
    * ``e_N``: for any ``y``, ``P_N (x - x~) = P_N f`` with ``f = x - x~ - V C^T y``, so
      ``||e_N||_D <= ||f||_D``; with ``y`` from two solves ``f`` has no ``R`` part left beyond
      ~1e-26 relative, so ``f`` is ``e_N``.  The rounding of evaluating ``f`` is bounded rigorously by
      ``a = u |x - x~| + sum_passes gamma_{k+3} (|f_prev| + V |C^T| |y|)`` (``k`` the most rows
      touching one variable; Higham 2002, eq. 3.5), so ``||e_N||_D <= ||f||_D + ||a||_D``.

    **Bound**: ``(1 + 1e-6) sqrt(||e_R||_D^2 + (||f||_D + ||a||_D)^2)`` with ``||e_R||_D^2`` as
    above (the factor ``1 + 1e-6`` covers the rounding of these sums).  Both parts are computed,
    not bounded through an eigenvalue estimate (``||r|| / sqrt(lambda_min+)`` can overstate by
    ``sqrt(cond(S))``), so the bound is close to the true error, not merely above it.

    **Finishing step** (one step of iterative refinement of the KKT system with the direct factor):
    ``x <- x - e_R - f``.  In exact arithmetic that is ``x*``; in floating point it leaves the
    residual at the rounding of ``x`` and the distance at the rounding of the correction.
    """

    def __init__(self, problem: Problem, v: np.ndarray | None) -> None:
        self.problem, self.v = problem, v
        self.block = _direct_block(problem)

    def decompose(self, x: np.ndarray, x0: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray, bool]:
        """``(e_R, ||e_R||_D^2, f, a, trusted)`` for ``x`` (class docstring)."""
        C = self.problem.C
        vv = np.ones(self.problem.n) if self.v is None else self.v
        solver = self.block.solver(self.v)
        CT = C.T.tocsr()
        r = dot2_rows(C, x, self.problem.b)
        e_r, e_r_sq, trusted = np.zeros_like(x), 0.0, True
        if np.any(r):
            z = solver.solve(r, rtol=1e-15)
            e_r = vv * (CT @ z)
            q = float(np.dot(e_r, CT @ z))  # z^T S z = ||V C^T z||_D^2
            s = r - C @ e_r  # r - S z
            w = solver.solve(s, rtol=1e-8, max_refine=2)  # a second-order term: a rough solve will do
            corr = 2.0 * abs(float(np.dot(z, s))) + 2.0 * abs(float(np.dot(s, w)))
            e_r_sq, trusted = q + corr, bool(corr <= CERTIFY_RTOL * q)
        f = x - x0
        a = _U * np.abs(f)
        absCT = abs(CT)
        g = _gamma(int(np.diff(CT.indptr).max(initial=0)) + 3)
        for _ in range(2):
            y = solver.solve(C @ f, rtol=1e-13, max_refine=3)  # any y is valid; the 2nd pass cleans up
            a += g * (np.abs(f) + vv * (absCT @ np.abs(y)))
            f = f - vv * (CT @ y)
        return e_r, e_r_sq, f, a, trusted

    def refine(self, x: np.ndarray, x0: np.ndarray) -> np.ndarray:
        """One finishing step ``x - e_R - f`` (class docstring)."""
        e_r, _, f, _, _ = self.decompose(x, x0)
        return x - e_r - f

    def bound(self, x: np.ndarray, x0: np.ndarray) -> float:
        """An upper bound on ``||x - x*||_D`` (class docstring), NaN if the factor's solve cannot
        be trusted."""
        _, e_r_sq, f, a, trusted = self.decompose(x, x0)
        if not trusted:
            return float("nan")
        w = 1.0 if self.v is None else 1.0 / self.v

        def norm(u: np.ndarray) -> float:  # the D-norm
            return float(np.sqrt(np.dot(u * w, u)))

        return float((1.0 + 1e-6) * np.hypot(np.sqrt(e_r_sq), norm(f) + norm(a)))


def _raise_if_infeasible(problem: Problem, x: np.ndarray, tol: float) -> None:
    gap = float(np.max(np.abs(problem.residual_vector(x)), initial=0.0))
    scale = 1.0 + float(np.max(np.abs(x), initial=0.0)) + float(np.max(np.abs(problem.b), initial=0.0))
    limit = max(tol, 1e-7 * scale)
    if gap > limit:
        names = problem.conflicting(x, limit)
        raise InfeasibleConstraintsError(
            f"the constraints have no common solution: families {', '.join(names)} conflict "
            f"(the closest point misses them by {gap:.3g})"
        )


# ----------------------------------------------------------------------------------------------
# methods
# ----------------------------------------------------------------------------------------------


def _generic(problem: Problem, x0: np.ndarray, v: np.ndarray | None, max_bytes: int) -> np.ndarray:
    m, n = problem.C.shape
    need = 8 * (3 * m * n + min(m, n) ** 2)
    if need > max_bytes:
        raise UnsupportedStructureError(
            f"generic (dense pseudo-inverse) needs about {need / 2**30:.1f} GiB for {m} x {n}; "
            f"limit is {max_bytes / 2**30:.1f} GiB (use method='direct')"
        )
    w = np.ones(n) if v is None else np.sqrt(v)
    A = (problem.C @ sp.diags(w)).toarray()
    rcond = max(m, n) * np.finfo(float).eps  # numerical rank cut-off, as in LAPACK's gelsd
    return x0 + w * (np.linalg.pinv(A, rcond=rcond) @ (problem.b - problem.C @ x0))


def _direct_block(problem: Problem) -> SparseBlock:
    return SparseBlock(problem.C, problem.b, np.arange(problem.n), "all constraints", check=False)


def _alternating(
    sweeper: _Sweeper, rec: _Recorder, x: np.ndarray, tol: float, max_sweeps: int, sweep: str
) -> tuple[np.ndarray, int, bool]:
    k = len(sweeper.problem.groups)
    order = list(range(k)) if sweep == "cyclic" else list(range(k)) + list(range(k - 2, -1, -1))
    res = rec(x, np.nan)
    s = 0
    while res > tol and s < max_sweeps:
        new = sweeper.sweep(x, order)
        change = float(np.max(np.abs(new - x)))
        x, s = new, s + 1
        res = rec(x, change)
        if change <= 1e-9 * res:  # a stationary point that is not consistent: infeasible
            break
    return x, s, res <= tol


def _accelerated(
    sweeper: _Sweeper, rec: _Recorder, x: np.ndarray, v: np.ndarray | None, tol: float, max_iter: int
) -> tuple[np.ndarray, int, bool]:
    k = len(sweeper.problem.groups)
    order = list(range(k)) + list(range(k - 2, -1, -1))
    res = rec(x, np.nan)
    r = sweeper.sweep(x, order) - x
    p = r.copy()
    rr = _inner(r, r, v)
    it = 0
    while res > tol and it < max_iter and rr > 0:
        Ap = p - sweeper.sweep(p, order, homogeneous=True)
        pAp = _inner(p, Ap, v)
        if pAp <= 0:
            break
        alpha = rr / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        rr_new = _inner(r, r, v)
        it += 1
        res = rec(x, float(alpha * np.max(np.abs(p))))
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, it, res <= tol


def _dykstra(
    problem: Problem, x0: np.ndarray, v: np.ndarray | None, tol: float, max_iter: int, rec: _Recorder
) -> tuple[np.ndarray, int, bool, float]:
    """Dykstra's iteration; returns ``x``, iterations, whether ``max |y - x| <= tol`` was reached
    and that last gap (``y`` the affine projection)."""
    block = _direct_block(problem)
    x, q = x0.copy(), np.zeros_like(x0)
    rec(x, np.nan)
    gap = np.inf
    for it in range(1, max_iter + 1):
        y = block.project(x, v) if problem.blocks else x
        z = np.maximum(y + q, 0.0)
        q = y + q - z
        change = float(np.max(np.abs(z - x)))
        x = z
        rec(x, change)
        gap = float(np.max(np.abs(y - z), initial=0.0))
        if gap <= tol:
            return x, it, True, gap
    return x, max_iter, False, gap


LP_FEASIBILITY_MAX = 200_000  # variables; above it nonnegative=True skips the LP feasibility check


def _check_nonnegative_feasible(problem: Problem) -> bool:
    """Raise :class:`InfeasibleConstraintsError` when no ``x >= 0`` satisfies ``C x = b``.

    A linear-programming feasibility problem (zero objective; scipy's HiGHS, primal feasibility
    tolerance 1e-7 scaled), run when ``n <= LP_FEASIBILITY_MAX``.  Returns whether it ran.
    """
    if problem.n > LP_FEASIBILITY_MAX or not problem.blocks:
        return False
    from scipy.optimize import linprog

    lp = linprog(np.zeros(problem.n), A_eq=problem.C, b_eq=problem.b, bounds=(0, None), method="highs")
    if lp.status == 2:
        raise InfeasibleConstraintsError(
            f"no x >= 0 satisfies the constraints of families {problem.family_names} "
            "(HiGHS linear-programming feasibility check)"
        )
    return True


def solve(
    x_noisy: Any,
    constraints: ConstraintFamily | Iterable[ConstraintFamily],
    variances: Any = None,
    method: str = "auto",
    tol: float | None = None,
    max_sweeps: int = 100_000,
    executor: Any = None,
    callback: Callable[[int, np.ndarray, float], Any] | None = None,
    truth: Any = None,
    nonnegative: bool = False,
    sweep: str = "cyclic",
    generic_max_bytes: int = GENERIC_MAX_BYTES,
    certify: bool | None = None,
) -> ConsistencyResult:
    """The optimal consistent release of ``x_noisy`` (module docstring for the methods).

    ``variances`` (length ``n``, > 0) weights the projection by ``1 / variances`` (the GLS/BLUE
    answer for independent noise of those variances).  ``tol`` bounds the exact ``max |C x - b|``
    of the returned vector, and is never raised: it is met (``converged=True``), or the iteration
    stopped at ``max_sweeps`` (``converged=False``), or :class:`ToleranceUnattainableError` is raised
    naming the residual that can be attained.  Iterations stop on the float64 residual at
    ``max(tol, floor)``, ``floor = 16 eps max_row_l1 (1 + max|x~|)`` (below it the float64
    evaluation is mostly its own rounding); a smaller ``tol`` is then met by up to
    ``MAX_REFINEMENTS`` finishing steps (iterative refinement with the factor of ``C V C^T``)
    where that factor is built.  The exact one-shot O(n) solves (``auto``/``structured`` paths),
    whose answer a finishing step would change in form, return ``converged=False`` instead of
    refusing when their rounding exceeds ``tol``.  ``tol=None`` (default) is ``max(1e-10, floor)``,
    a tolerance at the float64 level of the data; ``result.tolerance`` is the one used.

    ``certify`` says whether the factor of the whole ``C V C^T`` is built for finishing steps and
    for ``error_estimate`` (a bound on ``||x - x*||_D``, see :class:`_Certifier`): ``None`` (default)
    for ``generic`` (small problems), and for ``direct`` (its own factor; finishing steps always)
    and the iterative methods when ``nnz(C) <= FACTOR_MAX_NNZ``; not for the exact O(n) paths of
    ``auto``/``structured`` (there ``error_estimate`` is NaN and a ``tol`` below their rounding
    gives ``converged=False``).  ``True`` always, ``False`` never (NaN estimates; for the iterative
    methods a ``tol`` below their floor is refused).

    ``callback(iteration, x, residual)`` runs after every iteration.  ``truth`` (the unnoised data)
    adds the seed's error curve to the history.

    Raises :class:`ShapeError` / :class:`NonFiniteInputError` for bad input,
    :class:`InfeasibleConstraintsError` (naming the conflicting families) when no ``x`` satisfies
    the constraints, and :class:`ToleranceUnattainableError` (a :class:`SparseDPError`) for a
    ``tol`` below what the float64 answer reaches.
    """
    x0 = check_vector(x_noisy, name="x_noisy")
    n = x0.size
    v = None
    if variances is not None:
        v = check_vector(variances, n, "variances")
        if np.any(v <= 0):
            bad = np.flatnonzero(v <= 0)
            raise ShapeError(
                f"variances must all be > 0, got {v[bad[0]]!r} for variable {int(bad[0])} ({bad.size} such): a value "
                "known exactly (variance 0) is a constraint, not a measurement: pass it as "
                "FixedValues(index, values) and give its variable any positive variance"
            )
    t = check_vector(truth, n, "truth") if truth is not None else None
    if tol is not None:
        tol = check_positive(tol, "tol")
    if method not in METHODS:
        raise SparseDPError(f"unknown method {method!r}; choose one of {METHODS}")
    if sweep not in ("cyclic", "symmetric"):
        raise SparseDPError(f"sweep must be 'cyclic' or 'symmetric', got {sweep!r}")
    if int(max_sweeps) < 1:
        raise SparseDPError("max_sweeps must be >= 1")
    if certify not in (None, True, False):
        raise SparseDPError(f"certify must be None, True or False, got {certify!r}")
    start = time.perf_counter()
    problem = compile_constraints(constraints, n)
    if tol is None:  # the default: 1e-10, or the float64 level of these values
        tol = max(DEFAULT_TOL, _float_floor(problem, x0))
    floor = 1e-2 * tol  # rows whose float64 evaluation may err by more are evaluated exactly
    target = max(tol, _float_floor(problem, x0))  # where the iterations stop (float64 residual)
    rec = _Recorder(problem, t, callback, target)
    ex = get_executor(executor)
    own = executor in ("threads", "dask")
    fin = _Finisher(problem, x0, tol, floor, start, ex)

    def certifier(default: bool) -> _Certifier | None:
        return _Certifier(problem, v) if (default if certify is None else certify) else None

    try:
        if nonnegative:
            if method == "structured":
                raise UnsupportedStructureError("method='structured' does not take nonnegative=True")
            _check_nonnegative_feasible(problem)
            x, it, ok, gap = _dykstra(problem, x0, v, target, int(max_sweeps), rec)
            return fin(x, "dykstra+direct", it, it, rec, ok, None, refine=False, gap=gap)
        if method in ("auto", "structured") and problem.blocks:
            ts = detect_tree_span(problem.blocks, n)
            if ts is not None:
                x, how = tree_span_solve(ts, x0, v)
                name = f"{method}:tree-span:{how}"
                return fin(x, name, 1, 0, rec, True, certifier(False), one_shot=True, final=True)
            if method == "structured":
                raise UnsupportedStructureError(
                    "method='structured' needs layout trees plus span constraints covering their leaves "
                    "(see sparsedp.consistency.treespan); use 'auto' or 'direct'"
                )
        if not problem.blocks:
            rec(x0, 0.0)
            return fin(x0.copy(), method, 0, 0, rec, True, None, exact=True)
        chosen = method
        if method == "auto" and len(problem.groups) == 1:
            # the blocks touch disjoint variables: one projection of the group is the exact answer
            x, s, _ = _alternating(_Sweeper(problem, v, ex), rec, x0, target, 1, sweep)
            return fin(x, "auto:one-group", s, s, rec, True, certifier(False), final=True)
        if method == "auto":
            structured = all(not isinstance(b, SparseBlock) for b in problem.blocks)
            equal = v is None or float(np.ptp(v)) == 0.0
            if structured and equal and len(problem.groups) > 1:
                sweeper = _Sweeper(problem, v, ex)
                x, s, ok = _alternating(sweeper, rec, x0, target, 1, sweep)
                if ok and accurate_residual(problem.blocks, x, floor).residual <= tol:
                    return fin(x, "auto:alternating", s, s, rec, True, certifier(False))
                rec = _Recorder(problem, t, callback, target)
            chosen = "direct"
        if chosen in ("generic", "direct"):
            # direct has the factor anyway (finishing steps always; the bound by ``certify``, whose
            # default skips it above FACTOR_MAX_NNZ: it costs up to as much as the solve); generic is small
            cert = _Certifier(problem, v) if chosen == "direct" else certifier(True)
            rec(x0, np.nan)
            if chosen == "generic":
                x = _generic(problem, x0, v, generic_max_bytes)
            else:
                x = cert.block.project(x0, v)  # type: ignore[union-attr]
            _raise_if_infeasible(problem, x, target)
            rec(x, float(np.max(np.abs(x - x0))))
            name = "auto:direct" if method == "auto" else chosen
            bound = problem.C.nnz <= FACTOR_MAX_NNZ if certify is None else certify
            return fin(x, name, 1, 0, rec, True, cert, bound=bound)
        cert = certifier(certify is None and _nnz_bound(problem) <= FACTOR_MAX_NNZ)
        sweeper = _Sweeper(problem, v, ex)
        if chosen == "alternating":
            x, it, ok = _alternating(sweeper, rec, x0, target, int(max_sweeps), sweep)
        else:
            x, it, ok = _accelerated(sweeper, rec, x0, v, target, int(max_sweeps))
        if not ok:
            blk = cert.block if cert is not None else _direct_block(problem)
            _raise_if_infeasible(problem, blk.project(x0, v), target)
        sweeps = sweeper.projections / max(len(problem.groups), 1)
        return fin(x, chosen, it, sweeps, rec, ok, cert)
    finally:
        if own:
            ex.close()


class _Finisher:
    """Turns a method's answer into the reported result: exact residual, finishing steps, the
    ``converged`` flag against the requested ``tol``, the error bound, or the refusal."""

    def __init__(
        self, problem: Problem, x0: np.ndarray, tol: float, floor: float, start: float, ex: Executor
    ) -> None:
        self.problem, self.x0, self.tol, self.floor, self.start, self.ex = problem, x0, tol, floor, start, ex

    def __call__(
        self,
        x: np.ndarray,
        method: str,
        it: int,
        sweeps: float,
        rec: _Recorder,
        done: bool,
        cert: _Certifier | None,
        one_shot: bool = False,
        refine: bool = True,
        bound: bool = True,
        exact: bool = False,
        gap: float | None = None,
        final: bool = False,
    ) -> ConsistencyResult:
        """``done``: the method did all it does (a one-shot solve, or an iteration that reached its
        stopping residual; not one cut off by ``max_sweeps``).  Then, if the exact residual exceeds
        ``tol``, up to ``MAX_REFINEMENTS`` finishing steps run (``cert`` given and ``refine``), each
        recorded as an iteration and kept only if it lowers the exact residual; a residual still
        above ``tol`` raises :class:`ToleranceUnattainableError`, except for ``final`` answers (the
        exact one-shot O(n) solves, whose re-aggregated form a finishing step would undo) when no
        finishing step was tried: those are returned with ``converged=False``.  ``gap`` (Dykstra) replaces
        the residual test by ``max |y - x| <= tol``.  ``exact``: ``x`` is the optimum itself (no
        constraints), bound 0."""
        problem, tol = self.problem, self.tol
        rep = accurate_residual(problem.blocks, x, self.floor)
        problem._rows = rep.rows
        if one_shot:  # a solve that recorded no iteration (the structured one) is recorded now
            rec.record(x, np.nan, rep.mse, rep.residual)
        steps = 0
        tried = done and gap is None and rep.residual > tol and cert is not None and refine
        if tried:
            while steps < MAX_REFINEMENTS and rep.residual > tol:
                new = cert.refine(x, self.x0)
                new_rep = accurate_residual(problem.blocks, new, self.floor)
                if not new_rep.residual < rep.residual:
                    break
                steps += 1
                rec.record(new, float(np.max(np.abs(new - x))), new_rep.mse, new_rep.residual)
                x, rep = new, new_rep
        met = gap <= tol if gap is not None else rep.residual <= tol
        if exact:
            est = 0.0
        elif cert is not None and bound and gap is None:
            est = cert.bound(x, self.x0)
        else:
            est = float("nan")
        result = ConsistencyResult(
            x=x,
            method=method,
            iterations=int(it) + steps,
            sweeps=float(sweeps),
            residual=rep.residual,
            seconds=time.perf_counter() - self.start,
            converged=bool(done and met),
            error_estimate=est,
            history=rec.history(),
            executor=self.ex.name,
            constraints=problem.rows,
            relative_residual=rep.relative,
            residual_bounded=rep.bounded,
            tolerance=tol,
            refinements=steps,
        )
        if done and not met and (tried or not final):
            reached = gap if gap is not None else rep.residual
            what = "max |y - x| (Dykstra)" if gap is not None else "exact residual max |C x - b|"
            if gap is not None:
                how = "(Dykstra: no finishing step, it would undo x >= 0)"
            elif cert is not None and refine:
                how = f"after {steps} finishing step(s) with the direct factor"
            else:
                how = "with no finishing step (certify=True builds the direct factor for them)"
            raise ToleranceUnattainableError(
                f"tol={tol:.3g} is below what the float64 answer attains: its {what} is {reached:.3g} "
                f"{how} (rounding x to float64 alone moves residuals by up to u max_i(|C||x| + |b|)_i "
                f"= {_U * rep.scale:.3g}); attainable tolerance: {reached:.3g}",
                tol,
                reached,
                result,
            )
        return result
