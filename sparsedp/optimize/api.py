"""``sparsedp.optimize``: the strategy with the lowest exact GLS error for a workload.

The user brings a workload ``W`` (any sparsedp operator, sparse or dense matrix); the optimiser
returns a strategy ``M`` to measure with :class:`~sparsedp.mechanism.MatrixMechanism`.  The
objective is the exact expected total squared error of the GLS answers ``W x_hat`` at unit budget,

    E(M) = Var(Delta(M)) * tr((M^T M)^{-1} W^T W),

with ``Var`` the calibration the mechanism applies to ``M``'s own entries at ``epsilon = 1``
(Laplace: ``2 Delta_1^2``) or ``rho = 1`` (Gaussian: ``Delta_2^2 / 2``).  At budget ``epsilon`` the
error is ``E / epsilon^2`` (Laplace), at ``rho`` it is ``E / rho`` (Gaussian).

Families (``family=``): ``"templates"`` (identity, hierarchical k-ary, Haar, Fenwick),
``"tree"`` (weighted interval trees, any ``n``), ``"pidentity"`` (HDMM's p-Identity, dense,
``n <= 8192``), ``"hybrid"`` (the lower levels of a weighted tree on blocks plus ``p`` dense
rows on the block sums, :mod:`~sparsedp.optimize.hybrid`), ``"gaussian"`` (the convex optimum under
Gaussian noise, ``n <= 4096``, :mod:`~sparsedp.optimize.gaussian_convex`), ``"toeplitz"`` (an
optimised lower-triangular Toeplitz factorisation of prefix sums / all ranges under Gaussian noise,
any ``n``, :mod:`~sparsedp.optimize.gaussian_structured`), ``"auto"`` (all that apply; never worse
than the best template).

Multi-dimensional workloads (issue 18, :mod:`sparsedp.optimize.multidim`): a
:class:`~sparsedp.marginals.MarginalWorkload` gets ResidualPlanner's optimum under Gaussian noise
(family ``"residual"``) or HDMM's weighted marginals under Laplace noise (``"marginals"``); a
:class:`~sparsedp.marginals.KronOperator` gets a Kronecker product of optimised 1-D factors
(``"kron"``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..accuracy import ErrorReport
from ..errors import ShapeError, SparseDPError
from ..measure import plan_measurement
from ..operators import Operator, SparseOperator, aslinearoperator
from ..validation import check_positive
from ..workloads import WeightedUnionWorkload
from ..marginals.kron_opt import KronStrategy
from ..marginals.workload import flattened_marginals
from .bounds import lower_bound as dual_lower_bound
from .bounds import multidim_lower_bound, quick_lower_bound
from .calibrate import noise_model
from .exact_score import error_under_noise, noise_factor
from .gaussian_convex import GAUSSIAN_MAX_N, gaussian_candidates
from .gaussian_structured import toeplitz_candidates, toeplitz_kind
from .candidate import Candidate, Trial
from .gram import Gram
from .hybrid_family import hybrid_candidates, hybrid_useful
from .multidim import is_multidim, kron_of_factors, optimize_multidim
from .pidentity import default_p
from .pidentity_family import PIDENTITY_MAX_N, pidentity_candidates
from .search import Deadline
from .templates import template_candidates
from .tree_family import tree_candidates
from .tree_spectral import BlockTraces

__all__ = ["FAMILIES", "DeferredBound", "OptimizedStrategy", "optimize"]

FAMILIES = ("auto", "templates", "tree", "pidentity", "hybrid", "gaussian", "toeplitz")
#: No wall-clock limit by default: every family stops on progress, iteration and evaluation counts
#: fixed by the sizes (:data:`PIDENTITY_WORK`, :data:`~sparsedp.optimize.hybrid_family.HYBRID_WORK`,
#: :data:`~sparsedp.optimize.tree_family.PER_NODE_WORK`), so the same call gives the same strategy
#: on an idle and on a loaded machine.  ``time_limit=`` stays available as an explicit option.
DEFAULT_TIME_LIMIT = None
#: Up to this many cells a result's certified lower bound is the dense dual solve
#: (:mod:`~sparsedp.optimize.bounds`); above it, the Gaussian / Toeplitz family's bound when one ran,
#: else :func:`~sparsedp.optimize.bounds.quick_lower_bound` (closed-form / dense SVD bound or the
#: spectral bound): every result carries one, computed on first access of
#: :attr:`OptimizedStrategy.lower_bound` unless a family produced it (:class:`DeferredBound`).
BOUND_AUTO_MAX_N = 512
#: ``family="auto"`` skips the tree, hybrid and p-Identity searches once a candidate with a
#: certified gap at most this is found (Gaussian optimum: 1.01).  The Toeplitz factorisations of
#: prefix sums / all ranges (gap <= 1.06 at n = 2^20) settle at this: the weighted trees, the best
#: of the other families there, are 1.59 above the bound at n = 2^20.
SETTLE_GAP = 1.01
TOEPLITZ_SETTLE_GAP = 1.10
#: The share of ``time_limit`` the families search for (the rest: scoring under the noise that runs).
SEARCH_SHARE = 0.85
#: Up to this many cells ``family="auto"`` runs p-Identity first (the weighted trees only if it does
#: not beat every template), from the perturbed tree start
#: (:func:`~sparsedp.optimize.pidentity_start.perturbed_tree_start`), one start by default, stopped
#: on relative progress (:data:`PIDENTITY_PROGRESS`) unless ``maxiter`` is given (issue 27).
SMALL_N = 512
#: ``(rtol, window)``: a p-Identity start at ``n <= SMALL_N`` stops once its best error improved by
#: less than ``rtol`` over the last ``window`` evaluations (HDMM stops on ``ftol = 1e-4`` per
#: step).  Measured from the perturbed tree start (Laplace, one BLAS thread): prefix / all ranges at
#: ``n = 256`` stop after 95 / 109 evaluations at 13,784 / 2.1452e6 (1000 iterations: 13,733 /
#: 2.1357e6; HDMM's median 14,045 / 2.1499e6); on sliding windows, random ranges and prefix / all
#: ranges at ``n = 64 - 512`` the stop is within 1.5% of 1000 iterations (Laplace and Gaussian).
PIDENTITY_PROGRESS = (1e-3, 20)
#: L-BFGS-B memory of those default small-``n`` searches (scipy's bounded step costs grow with it).
PIDENTITY_MAXCOR = 5
#: Without a time limit, ``family="auto"`` gives p-Identity above :data:`SMALL_N` at most this much
#: work (element operations, ``p^2 n`` per iteration): ``all_ranges(1024)`` (p = 69) keeps its 1000
#: iterations; ``n = 2048`` gets 130; where fewer than :data:`PIDENTITY_MIN_ITERS` are affordable it
#: is not run (sliding windows over 4,686 days, p = 300: 1005 evaluations took 260 s).
PIDENTITY_WORK = 5e9
PIDENTITY_MIN_ITERS = 100


class DeferredBound:
    """A certified lower bound computed when first asked for (:attr:`OptimizedStrategy.lower_bound`):
    ``scale * func(workload, noise)``, or ``None`` if ``func`` gives none.  The dense dual costs
    more than the whole p-Identity search at ``n = 256`` (14 eigendecompositions for prefix sums),
    so :func:`optimize` defers it; every result still carries the bound.  Picklable when the
    workload is."""

    def __init__(self, func: Any, workload: Any, noise: str, scale: float = 1.0):
        self.func, self.workload, self.noise, self.scale = func, workload, noise, float(scale)

    def __call__(self) -> float | None:
        value = self.func(self.workload, self.noise)
        return None if value is None else float(value) * self.scale


def _dense_dual(W: Any, noise: str) -> float:
    """The dense dual bound of :func:`optimize` for ``n <= BOUND_AUTO_MAX_N`` (its iteration cap, no
    wall clock: the same bound on any machine)."""
    return dual_lower_bound(W, noise, time_limit=None)


@dataclass(frozen=True)
class OptimizedStrategy:
    """The result of :func:`optimize`.

    ``strategy``: the operator to pass to ``MatrixMechanism(W, strategy, epsilon=...)`` (or
    ``rho=``, ``noise="gaussian"``) -- except for marginal workloads: family ``"residual"`` gives a
    :class:`~sparsedp.marginals.ResidualSelection` at ``rho = 1`` (release with
    :func:`~sparsedp.marginals.release_marginals`, which re-selects the same optimum at its ``rho``)
    and family ``"marginals"`` a :class:`~sparsedp.marginals.MarginalsStrategy` at ``epsilon = 1``
    (release ``strategy.at(epsilon)`` with :func:`~sparsedp.marginals.release_marginals_laplace`);
    family ``"kron"`` gives a :class:`~sparsedp.marginals.KronOperator`; family ``"toeplitz"`` an
    integer :class:`~sparsedp.optimize.toeplitz_strategy.ToeplitzStrategy` (its first column; ``R x``
    exact by a number-theoretic transform).  The optimised families return an *integer* matrix scaled to
    ``Delta_p = 2^k`` (p = 1 Laplace, 2 Gaussian; :mod:`~sparsedp.optimize.calibrate`), the
    templates their 0/1 matrices: the mechanism calibrates from the entries, so the scale does not
    change the error, and integer entries let its default exact noise measure ``M x`` without
    rounding.  ``sensitivity``: its certified ``Delta_p`` (exact for integer matrices).
    ``strategy / sensitivity`` is the same strategy normalised to ``Delta = 1``.
    ``family`` and ``name`` of the winner; ``error``: the exact expected total squared error of the
    GLS workload answers at ``epsilon = 1`` (Laplace) or ``rho = 1`` (Gaussian); ``history``: every
    candidate tried, in order; ``seconds``: wall time.
    """

    strategy: Any  # Operator; ResidualSelection / MarginalsStrategy for marginal workloads
    family: str
    name: str
    error: ErrorReport
    noise: str
    sensitivity: float
    history: tuple[Trial, ...]
    seconds: float
    budget: float = 1.0  # the epsilon (Laplace) / rho (Gaussian) the error is at
    secure: bool = True  # scored with the exact discrete noise the mechanism draws by default
    #: the certified lower bound, or a :class:`DeferredBound` computing it on first access of
    #: :attr:`lower_bound` (the dense dual for ``n <= BOUND_AUTO_MAX_N``, the Gaussian / Toeplitz
    #: family's when one ran, else ``bounds.quick_lower_bound``; multi-dimensional workloads:
    #: ``bounds.multidim_lower_bound``); ``None`` only for marginal workloads with weights or the
    #: ``"max"`` objective
    _lower_bound: Any = dataclasses.field(default=None, repr=False, compare=False)
    continuous_error: float | None = None  # the winner's error with continuous noise, at the budget

    @property
    def lower_bound(self) -> float | None:
        """Certified lower bound on the error of EVERY strategy with continuous noise of the same
        calibration at the budget (see the class docstring); computed on first access when the
        search did not produce one (the dense dual: ~0.03-0.2 s at ``n = 256``), then cached."""
        src = self._lower_bound
        if isinstance(src, DeferredBound):
            src = src()
            object.__setattr__(self, "_lower_bound", src)
        return src

    @property
    def gap(self) -> float | None:
        """``continuous_error / lower_bound`` (>= 1): how far the strategy can be from the best
        possible one, certified; ``None`` without a bound."""
        if self.lower_bound is None or self.continuous_error is None or self.lower_bound <= 0:
            return None
        return self.continuous_error / self.lower_bound

    def error_at(self, *, epsilon: float | None = None, rho: float | None = None) -> float:
        """Expected total squared error at another budget, under the same noise: float noise
        scales as ``1 / epsilon^2`` (``1 / rho``); exact discrete noise is rescored with the
        variances of the plan at that budget (:mod:`~sparsedp.optimize.exact_score`)."""
        if self.noise == "laplace":
            if epsilon is None or rho is not None:
                raise SparseDPError("Laplace strategies take epsilon")
            budget = check_positive(epsilon, "epsilon")
        else:
            if rho is None or epsilon is not None:
                raise SparseDPError("Gaussian strategies take rho")
            budget = check_positive(rho, "rho")
        if not isinstance(self.strategy, Operator):  # marginal strategies: continuous scaling
            return self.error.total * (self.budget / budget) ** (2 if self.noise == "laplace" else 1)
        model = noise_model(self.noise)
        here, _ = noise_factor(self.strategy, model, self.budget, self.secure)
        there, _ = noise_factor(self.strategy, model, budget, self.secure)
        return self.error.total * there / here

    def best_template(self) -> Trial | None:
        """The best template in the history (``None`` if none was scored)."""
        temps = [t for t in self.history if t.family == "templates"]
        return min(temps, key=lambda t: t.error) if temps else None


def recognise(W: Any) -> Any:
    """A workload's structure, whichever builder made it: the flattened marginals of
    :func:`sparsedp.workloads.marginals` become the :class:`~sparsedp.marginals.MarginalWorkload`
    they are (so the marginal families optimise them, not the 1-D ones on a flat matrix); anything
    else is returned as it is.  The recognised structure must match the operator's shape; marginals
    that a marginal workload cannot hold (repeated ones) stay flat."""
    mw = flattened_marginals(W)
    return W if mw is None else mw


def _budget(kind: str, epsilon: Any, rho: Any) -> float:
    """The budget the strategy is scored at: ``epsilon`` (Laplace) or ``rho`` (Gaussian), default 1."""
    if kind == "laplace":
        if rho is not None:
            raise SparseDPError("Laplace noise takes epsilon=, not rho=")
        return 1.0 if epsilon is None else check_positive(epsilon, "epsilon")
    if epsilon is not None:
        raise SparseDPError("Gaussian noise takes rho=, not epsilon=")
    return 1.0 if rho is None else check_positive(rho, "rho")


def _sensitivity(strategy: Operator, noise: str) -> float:
    """``Delta_p`` as the mechanism's calibration computes it."""
    if noise == "laplace":
        return float(plan_measurement(strategy, epsilon=1.0, noise="laplace", secure=False).sensitivity)
    return float(plan_measurement(strategy, rho=1.0, noise="gaussian", secure=False).sensitivity)


def _check_family(family: Any) -> str:
    if family not in FAMILIES:
        raise SparseDPError(f"family must be one of {FAMILIES}, got {family!r}")
    return family


def optimize(
    W: Any,
    *,
    noise: str = "laplace",
    family: str = "auto",
    time_limit: float | None = DEFAULT_TIME_LIMIT,
    rng: Any = 0,
    per_node: bool | None = None,
    p: int | None = None,
    restarts: int | None = None,
    domain: Any = None,
    maxiter: int | None = None,
    epsilon: float | None = None,
    rho: float | None = None,
    secure: bool = True,
) -> OptimizedStrategy:
    """The strategy with the lowest exact expected GLS error for workload ``W`` among the families
    tried (see the module docstring).

    Multi-dimensional ``W``: a :class:`~sparsedp.marginals.MarginalWorkload` (family ``"auto"``,
    ``"residual"`` for Gaussian, ``"marginals"`` for Laplace) or a
    :class:`~sparsedp.marginals.KronOperator` (family ``"kron"`` / ``"auto"`` or a 1-D family used
    for every factor); see :mod:`sparsedp.optimize.multidim`.

    Parameters
    ----------
    W:
        The workload: a sparsedp operator (``workloads.prefix(n)``, ``all_ranges(n)``,
        ``range_queries``, ...), a scipy sparse matrix or a dense array (one row per query).
    noise:
        ``"laplace"`` (pure DP, ``Delta_1 = 1``) or ``"gaussian"`` (zCDP, ``Delta_2 = 1``).
    family:
        ``"auto"``, ``"templates"``, ``"tree"``, ``"pidentity"``, ``"hybrid"``, ``"gaussian"`` or
        ``"toeplitz"`` (the last two: Gaussian noise only; ``"toeplitz"``: prefix sums and all ranges,
        and ``"auto"`` uses it for them above ``n = 4096``).
    time_limit:
        ``None`` (default): no wall clock; every family stops on progress and on iteration /
        evaluation counts fixed by the sizes, so the same call gives the same strategy on any
        machine, idle or loaded.  Seconds: an explicit limit for the whole search (85% for the
        families, the rest for scoring under the noise that runs; the templates are always
        scored); families stop at it and return the best point reached, so a search the limit
        cuts short can differ between machines.
    rng:
        Seed or generator of the random starts (default 0: the same call gives the same strategy
        every time; pass another seed for other starts).
    per_node:
        Tree family: refine per node (``True``), never (``False``) or when affordable (``None``).
    p, restarts:
        p-Identity: number of extra rows (default: the internal nodes of the 16-ary tree over
        ``n`` cells, at most 300; hybrid: dense rows on the block sums, default
        ``min(nb // 8, 64)``) and of starts (default 1; the best is kept): the first a tree with
        fitted level weights -- for ``n <=`` :data:`SMALL_N` with a positive perturbation of every
        entry -- the others random (:mod:`~sparsedp.optimize.pidentity_start`).  Weighted
        marginals (Laplace marginal workloads): random starts (default 4; ``rng`` default 0).
    domain:
        Multi-dimensional workloads only (optional): the :class:`~sparsedp.marginals.Domain` the
        workload must be on; a different one raises :class:`~sparsedp.errors.ShapeError`.
    maxiter:
        L-BFGS-B iterations of each p-Identity start and of the hybrid's final polish (default
        1000); more iterations can only lower the error reached, at ``O(p^2 n)`` each (p-Identity).
        Without it, a p-Identity start at ``n <=`` :data:`SMALL_N` also stops once its error improves
        by less than 0.1% over 20 evaluations (:data:`PIDENTITY_PROGRESS`; prefix sums and all
        ranges at ``n = 256``: about 100 evaluations, below HDMM's error); with it, it runs up to
        ``maxiter`` iterations.
    epsilon, rho, secure:
        The noise the strategy will be measured with: the budget (``epsilon`` for Laplace, ``rho``
        for Gaussian; default 1, the unit budget) and exact discrete noise (``secure=True``, the
        mechanism's default) or float noise.  Every candidate is scored, and the winner chosen,
        with the variances of that noise (:mod:`~sparsedp.optimize.exact_score`): ``error`` is the
        expected total squared error of the GLS answers at that budget under that noise, so the
        result is never worse than a template under the noise that runs.
    """
    t_start = time.perf_counter()
    model = noise_model(noise)
    budget = _budget(model.kind, epsilon, rho)
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True (exact noise) or False (float noise), got {secure!r}")
    W = recognise(W)
    if is_multidim(W):
        if time_limit is not None:
            time_limit = check_positive(time_limit, "time_limit")
        strat, fam_m, name, report, sens, hist = optimize_multidim(
            W, model_kind=model.kind, family=family, domain=domain, rng=rng, restarts=restarts,
            options={"time_limit": time_limit, "per_node": per_node, "p": p}, solve_1d=optimize)
        return OptimizedStrategy(strategy=strat, family=fam_m, name=name, error=report, noise=model.kind,
                                 sensitivity=sens, history=hist, seconds=time.perf_counter() - t_start,
                                 _lower_bound=DeferredBound(multidim_lower_bound, W, model.kind),
                                 continuous_error=report.total)
    if domain is not None:
        raise ShapeError("domain= is for multi-dimensional workloads (MarginalWorkload, KronOperator); "
                         "a 1-D workload has none")
    fam = _check_family(family)
    if time_limit is not None:
        time_limit = check_positive(time_limit, "time_limit")
    Wop = aslinearoperator(W, name="workload")
    m, n = Wop.shape
    small = n <= SMALL_N
    if restarts is None:
        # small n: the perturbed tree start alone -- at the progress stop a U[0, 1] start beside it
        # ended above it on prefix sums and all ranges at n = 256 and doubled the time (issue 27)
        restarts = 1
    for name, value in (("restarts", restarts), ("p", p), ("maxiter", maxiter)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
            raise SparseDPError(f"{name} must be a positive integer, got {value!r}")
    iters = 1000 if maxiter is None else int(maxiter)
    if m < 1 or n < 1:
        raise ShapeError(f"the workload must have at least one query and one cell, got shape {Wop.shape}")
    parts = Wop.parts if isinstance(Wop, WeightedUnionWorkload) else ((1.0, Wop),)
    if all(isinstance(Wi, SparseOperator) and Wi.matrix.nnz == 0 for _, Wi in parts):
        raise ShapeError("the workload has no non-zero entry: nothing to optimise")
    gen = np.random.default_rng(rng)
    # the families search for SEARCH_SHARE of the limit; scoring the candidates under the noise that
    # runs (a measurement plan each: 7.4 s for the 13 candidates at n = 2^20) takes the rest
    deadline = Deadline(None if time_limit is None else time_limit * SEARCH_SHARE)
    gram = Gram(Wop)
    traces = BlockTraces(Wop)

    cands: list[Candidate] = []
    if fam in ("auto", "templates"):
        cands += template_candidates(Wop, gram, traces, model)
    if fam == "gaussian" and model.kind != "gaussian":
        raise SparseDPError("family 'gaussian' is the optimum under Gaussian noise: use noise='gaussian'")
    if fam == "gaussian" or (fam == "auto" and model.kind == "gaussian" and n <= GAUSSIAN_MAX_N):
        # the convex optimum of the factorisation class, with a certified gap (gaussian_convex)
        cands += gaussian_candidates(Wop, gram, model, deadline=deadline)
    if fam == "toeplitz" and model.kind != "gaussian":
        raise SparseDPError("family 'toeplitz' is for Gaussian noise: use noise='gaussian'")
    if fam == "toeplitz" or (fam == "auto" and model.kind == "gaussian" and n > GAUSSIAN_MAX_N
                             and toeplitz_kind(Wop) is not None):
        # prefix sums / all ranges at any n: an optimised Toeplitz factorisation (gaussian_structured)
        cands += toeplitz_candidates(Wop, model, deadline=deadline)
    settled = fam == "auto" and any(
        getattr(c, "gap", math.inf) <= (TOEPLITZ_SETTLE_GAP if c.family == "toeplitz" else SETTLE_GAP) for c in cands)
    pid_iters = iters
    if fam == "auto" and not small and time_limit is None and maxiter is None:
        pid_iters = min(iters, int(PIDENTITY_WORK // (float(p or default_p(n)) ** 2 * n)))
    pid_runs = fam == "pidentity" or (fam == "auto" and not settled and n <= PIDENTITY_MAX_N
                                      and (small or pid_iters >= PIDENTITY_MIN_ITERS))
    # small n: p-Identity first, and the weighted trees only when it did not beat every template
    # (measured up to n = 512 on prefix sums, all ranges, sliding windows, random ranges and a
    # weighted union: p-Identity beat the best tree by 6-21% wherever it beat the templates)
    trees_after = fam == "auto" and small and pid_runs
    if fam == "tree" or (fam == "auto" and not settled and not trees_after):
        cands += tree_candidates(Wop, gram, traces, model, deadline=deadline, rng=gen, per_node=per_node)
    # the hybrid (O(p nb^2) per step) before the dense p-Identity (O(p^2 n)): under a time limit
    # the cheaper family gets its share first
    if fam == "hybrid" or (fam == "auto" and not settled and hybrid_useful(gram) and not deadline.expired()):
        cands += hybrid_candidates(Wop, gram, model, p=p, deadline=deadline, rng=gen, maxiter=iters)
    if pid_runs and (fam == "pidentity" or not deadline.expired()):
        # small n: from the perturbed tree, stopped on relative progress unless maxiter is given
        cands += pidentity_candidates(Wop, gram, model, p=p, restarts=int(restarts), deadline=deadline, rng=gen,
                                      maxiter=pid_iters if fam == "auto" else iters,
                                      start="perturbed" if small else "tree",
                                      progress=PIDENTITY_PROGRESS if small and maxiter is None else None,
                                      maxcor=PIDENTITY_MAXCOR if small and maxiter is None else 10)
    if trees_after and not deadline.expired():
        pid_best = min((c.total for c in cands if c.family == "pidentity"), default=math.inf)
        if pid_best >= min((c.total for c in cands if c.family == "templates"), default=math.inf):
            cands += tree_candidates(Wop, gram, traces, model, deadline=deadline, rng=gen, per_node=per_node)
    if not cands:
        raise ShapeError(f"family {fam!r} has no strategy for this workload (n = {n}, kind {gram.kind!r})")
    # score every candidate under the noise that runs (exact discrete variances by default), at the budget
    scored = [_under_noise(Wop, c, model, budget, bool(secure), gram) for c in cands]
    best = min(scored, key=lambda c: c.total)
    # the certified lower bound (continuous noise of the same calibration, at the budget) and the
    # winner's gap: known when the Gaussian family ran (its dual value at a feasible point)
    bounds = [c.lower_bound for c in cands if math.isfinite(getattr(c, "lower_bound", math.nan))]
    per_budget = budget ** (2 if model.kind == "laplace" else 1)
    lower: Any
    if bounds:
        lower = max(bounds) / per_budget
    else:  # every result carries one, computed on first access: the dual, else a closed / quick form
        func = _dense_dual if n <= BOUND_AUTO_MAX_N else quick_lower_bound
        lower = DeferredBound(func, Wop, model.kind, 1.0 / per_budget)
    winner_continuous = cands[next(i for i, c in enumerate(scored) if c is best)].total / per_budget
    report = ErrorReport(best.total, best.total / m, best.method, noise=model.kind, secure=bool(secure))
    return OptimizedStrategy(
        strategy=best.strategy,
        family=best.family,
        name=best.name,
        error=report,
        noise=model.kind,
        sensitivity=_sensitivity(best.strategy, model.kind),
        history=tuple(c.trial() for c in scored),
        seconds=time.perf_counter() - t_start,
        budget=budget,
        secure=bool(secure),
        _lower_bound=lower,
        continuous_error=winner_continuous,
    )


def _under_noise(W: Operator, c: Candidate, model: Any, budget: float, secure: bool, gram: Any = None) -> Candidate:
    """``c`` with its total rescored under the noise that runs (:func:`error_under_noise`)."""
    total, how = error_under_noise(W, c.strategy, c.total, model, budget, secure, gram)
    return dataclasses.replace(c, total=total, method=f"{c.method}; {how} at {model.kind} budget {budget:g}",
                               note=(c.note + "; " if c.note else "") + f"continuous unit error {c.total:.6g}")


def optimize_kron(workload_factors: Any, *, noise: str = "laplace", **options: Any) -> KronStrategy:
    """A Kronecker strategy for ``W_1 (x) ... (x) W_k``: each factor optimised by :func:`optimize`
    (``options`` passed on, e.g. ``family="auto"``, ``time_limit``, ``rng``), their product with its
    exact error (:class:`~sparsedp.marginals.KronStrategy`; see
    :func:`~sparsedp.optimize.multidim.kron_of_factors`).  ``optimize(KronOperator([...]))`` runs
    this for a Kronecker workload."""
    return kron_of_factors(workload_factors, noise=noise, solve_1d=optimize, **options)
