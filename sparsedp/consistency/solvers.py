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
iterative methods lies in ``x~ + range(V C^T)``, so the only consistent point they can reach is the
optimum; for the distance still to go they report ``error_estimate = change * q / (1 - q)``, with
``q`` the contraction ratio of the last two changes (an estimate, exact for a geometric tail; not a
bound).  The reported ``residual`` is the exact one of the returned vector (:mod:`.residuals`).

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
from .residuals import accurate_residual
from .treespan import detect_tree_span, tree_span_solve

__all__ = ["ConsistencyResult", "Problem", "compile_constraints", "solve", "METHODS"]

METHODS = ("auto", "generic", "direct", "alternating", "accelerated", "structured")
GENERIC_MAX_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ConsistencyResult:
    """A consistent release and how it was reached.

    ``residual`` is ``max |C x - b|`` of the returned float64 vector, evaluated exactly on the rows
    where float64 evaluation could err by more than 1 % of ``tol`` (:mod:`.residuals`);
    ``relative_residual`` is ``residual / max_i (|C||x| + |b|)_i`` (normwise backward error);
    ``residual_bounded`` says the exact evaluation was capped and ``residual`` is an upper bound.
    ``history`` holds one entry per iteration (sweep or CG step) of ``mse`` (seed 002 eq. 14:
    ``||C x_s - b||^2 / m``), ``err`` (eq. 15: the RMSE against the truth, NaN without it),
    ``residual`` and ``change`` (``max |x_s - x_{s-1}|``), all evaluated in float64.
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
        bad = {self.block_family[j] for j, r in enumerate(self.residual_parts(x)) if r.size and np.max(np.abs(r)) > tol}
        return [self.family_names[i] for i in sorted(bad)]


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

    def error_estimate(self) -> float:
        ch = [c for c in self.rows["change"][1:] if np.isfinite(c)]
        if len(ch) < 2 or ch[-2] <= 0:
            return 0.0 if not ch else float(ch[-1])
        q = min(ch[-1] / ch[-2], 1.0 - 1e-16)
        return float(ch[-1] * q / (1.0 - q))


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


def _tolerance(problem: Problem, x: np.ndarray, tol: float) -> float:
    """``tol``, raised to what double precision can certify: ``16 eps max_row_l1 max|x|``."""
    row_l1 = max((blk.row_l1() for blk in problem.blocks), default=0.0)
    return max(tol, 16 * np.finfo(float).eps * row_l1 * (1.0 + float(np.max(np.abs(x)))))


def _raise_if_infeasible(problem: Problem, x: np.ndarray, tol: float) -> None:
    gap = float(np.max(np.abs(problem.residual_vector(x)), initial=0.0))
    scale = 1.0 + float(np.max(np.abs(x), initial=0.0)) + float(np.max(np.abs(problem.b), initial=0.0))
    limit = max(tol, 1e-7 * scale)
    if gap > limit:
        names = problem.conflicting(x, limit)
        raise InfeasibleConstraintsError(
            f"the constraints have no common solution: families {names} conflict "
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
) -> tuple[np.ndarray, int, bool]:
    block = _direct_block(problem)
    x, q = x0.copy(), np.zeros_like(x0)
    rec(x, np.nan)
    for it in range(1, max_iter + 1):
        y = block.project(x, v) if problem.blocks else x
        z = np.maximum(y + q, 0.0)
        q = y + q - z
        change = float(np.max(np.abs(z - x)))
        x = z
        rec(x, change)
        if float(np.max(np.abs(y - z), initial=0.0)) <= tol:
            return x, it, True
    return x, max_iter, False


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
    tol: float = 1e-10,
    max_sweeps: int = 100_000,
    executor: Any = None,
    callback: Callable[[int, np.ndarray, float], Any] | None = None,
    truth: Any = None,
    nonnegative: bool = False,
    sweep: str = "cyclic",
    generic_max_bytes: int = GENERIC_MAX_BYTES,
) -> ConsistencyResult:
    """The optimal consistent release of ``x_noisy`` (module docstring for the methods).

    ``variances`` (length ``n``, > 0) weights the projection by ``1 / variances`` (the GLS/BLUE
    answer for independent noise of those variances).  ``tol`` bounds ``max |C x - b|`` (raised to
    what double precision can certify).  ``callback(iteration, x, residual)`` runs after every
    iteration.  ``truth`` (the unnoised data) adds the seed's error curve to the history.

    Raises :class:`ShapeError` / :class:`NonFiniteInputError` for bad input and
    :class:`InfeasibleConstraintsError` (naming the conflicting families) when no ``x`` satisfies
    the constraints.
    """
    x0 = check_vector(x_noisy, name="x_noisy")
    n = x0.size
    v = None
    if variances is not None:
        v = check_vector(variances, n, "variances")
        if np.any(v <= 0):
            raise ShapeError("variances must all be > 0")
    t = check_vector(truth, n, "truth") if truth is not None else None
    tol = check_positive(tol, "tol")
    floor = 1e-2 * tol  # rows whose float64 evaluation may err by more are evaluated exactly
    if method not in METHODS:
        raise SparseDPError(f"unknown method {method!r}; choose one of {METHODS}")
    if sweep not in ("cyclic", "symmetric"):
        raise SparseDPError(f"sweep must be 'cyclic' or 'symmetric', got {sweep!r}")
    if int(max_sweeps) < 1:
        raise SparseDPError("max_sweeps must be >= 1")
    start = time.perf_counter()
    problem = compile_constraints(constraints, n)
    tol = _tolerance(problem, x0, tol)
    rec = _Recorder(problem, t, callback, tol)
    ex = get_executor(executor)
    own = executor in ("threads", "dask")
    try:
        if nonnegative:
            if method == "structured":
                raise UnsupportedStructureError("method='structured' does not take nonnegative=True")
            _check_nonnegative_feasible(problem)
            x, it, ok = _dykstra(problem, x0, v, tol, int(max_sweeps), rec)
            return _result(x, "dykstra+direct", it, it, problem, start, ok, rec, ex, floor)
        if method in ("auto", "structured") and problem.blocks:
            ts = detect_tree_span(problem.blocks, n)
            if ts is not None:
                x, how = tree_span_solve(ts, x0, v)
                return _result(x, f"{method}:tree-span:{how}", 1, 0, problem, start, True, rec, ex, floor, one_shot=True)
            if method == "structured":
                raise UnsupportedStructureError(
                    "method='structured' needs layout trees plus span constraints covering their leaves "
                    "(see sparsedp.consistency.treespan); use 'auto' or 'direct'"
                )
        if not problem.blocks:
            rec(x0, 0.0)
            return _result(x0.copy(), method, 0, 0, problem, start, True, rec, ex, floor)
        chosen = method
        if method == "auto" and len(problem.groups) == 1:
            # the blocks touch disjoint variables: one projection of the group is the exact answer
            x, s, ok = _alternating(_Sweeper(problem, v, ex), rec, x0, tol, 1, sweep)
            return _result(x, "auto:one-group", s, s, problem, start, ok, rec, ex, floor)
        if method == "auto":
            structured = all(not isinstance(b, SparseBlock) for b in problem.blocks)
            equal = v is None or float(np.ptp(v)) == 0.0
            if structured and equal and len(problem.groups) > 1:
                sweeper = _Sweeper(problem, v, ex)
                x, s, ok = _alternating(sweeper, rec, x0, tol, 1, sweep)
                if ok:
                    return _result(x, "auto:alternating", s, s, problem, start, True, rec, ex, floor)
                rec = _Recorder(problem, t, callback, tol)
            chosen = "direct"
        if chosen in ("generic", "direct"):
            rec(x0, np.nan)
            if chosen == "generic":
                x = _generic(problem, x0, v, generic_max_bytes)
            else:
                x = _direct_block(problem).project(x0, v)
            _raise_if_infeasible(problem, x, tol)
            res = rec(x, float(np.max(np.abs(x - x0))))
            name = "auto:direct" if method == "auto" else chosen
            return _result(x, name, 1, 0, problem, start, res <= tol, rec, ex, floor)
        sweeper = _Sweeper(problem, v, ex)
        if chosen == "alternating":
            x, it, ok = _alternating(sweeper, rec, x0, tol, int(max_sweeps), sweep)
        else:
            x, it, ok = _accelerated(sweeper, rec, x0, v, tol, int(max_sweeps))
        if not ok:
            _raise_if_infeasible(problem, _direct_block(problem).project(x0, v), tol)
        sweeps = sweeper.projections / max(len(problem.groups), 1)
        return _result(x, chosen, it, sweeps, problem, start, ok, rec, ex, floor)
    finally:
        if own:
            ex.close()


def _result(
    x: np.ndarray,
    method: str,
    it: int,
    sweeps: float,
    problem: Problem,
    start: float,
    ok: bool,
    rec: _Recorder,
    ex: Executor,
    floor: float,
    one_shot: bool = False,
) -> ConsistencyResult:
    """The frozen result of ``x``, its exact residual (:mod:`.residuals`); ``one_shot``: a solve that
    recorded no iteration (the structured one) is recorded now, with that residual, and converged
    means it reached ``tol``."""
    rep = accurate_residual(problem.blocks, x, floor)
    problem._rows = rep.rows
    if one_shot:
        rec.record(x, np.nan, rep.mse, rep.residual)
        ok = rep.residual <= rec.tol
    est = rec.error_estimate() if method in ("alternating", "accelerated", "dykstra+direct") else 0.0
    return ConsistencyResult(
        x=x,
        method=method,
        iterations=int(it),
        sweeps=float(sweeps),
        residual=rep.residual,
        seconds=time.perf_counter() - start,
        converged=bool(ok),
        error_estimate=est,
        history=rec.history(),
        executor=ex.name,
        constraints=problem.rows,
        relative_residual=rep.relative,
        residual_bounded=rep.bounded,
    )
