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
rows on the block sums, :mod:`~sparsedp.optimize.hybrid`), ``"auto"`` (all that apply; never
worse than the best template).

Multi-dimensional workloads (issue 18, :mod:`sparsedp.optimize.multidim`): a
:class:`~sparsedp.marginals.MarginalWorkload` gets ResidualPlanner's optimum under Gaussian noise
(family ``"residual"``) or HDMM's weighted marginals under Laplace noise (``"marginals"``); a
:class:`~sparsedp.marginals.KronOperator` gets a Kronecker product of optimised 1-D factors
(``"kron"``).
"""

from __future__ import annotations

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
from .calibrate import noise_model
from .candidate import Candidate, Trial
from .gram import Gram
from .hybrid_family import hybrid_candidates, hybrid_useful
from .multidim import is_multidim, optimize_multidim
from .pidentity_family import PIDENTITY_MAX_N, pidentity_candidates
from .search import Deadline
from .templates import template_candidates
from .tree_family import tree_candidates
from .tree_spectral import BlockTraces

__all__ = ["FAMILIES", "OptimizedStrategy", "optimize"]

FAMILIES = ("auto", "templates", "tree", "pidentity", "hybrid")


@dataclass(frozen=True)
class OptimizedStrategy:
    """The result of :func:`optimize`.

    ``strategy``: the operator to pass to ``MatrixMechanism(W, strategy, epsilon=...)`` (or
    ``rho=``, ``noise="gaussian"``) -- except for marginal workloads: family ``"residual"`` gives a
    :class:`~sparsedp.marginals.ResidualSelection` at ``rho = 1`` (release with
    :func:`~sparsedp.marginals.release_marginals`, which re-selects the same optimum at its ``rho``)
    and family ``"marginals"`` a :class:`~sparsedp.marginals.MarginalsStrategy` at ``epsilon = 1``
    (release ``strategy.at(epsilon)`` with :func:`~sparsedp.marginals.release_marginals_laplace`);
    family ``"kron"`` gives a :class:`~sparsedp.marginals.KronOperator`.  The optimised families return an *integer* matrix scaled to
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

    def error_at(self, *, epsilon: float | None = None, rho: float | None = None) -> float:
        """Expected total squared error at another budget (``E / epsilon^2`` or ``E / rho``)."""
        if self.noise == "laplace":
            if epsilon is None or rho is not None:
                raise SparseDPError("Laplace strategies take epsilon")
            return self.error.total / check_positive(epsilon, "epsilon") ** 2
        if rho is None or epsilon is not None:
            raise SparseDPError("Gaussian strategies take rho")
        return self.error.total / check_positive(rho, "rho")

    def best_template(self) -> Trial | None:
        """The best template in the history (``None`` if none was scored)."""
        temps = [t for t in self.history if t.family == "templates"]
        return min(temps, key=lambda t: t.error) if temps else None


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
    time_limit: float | None = None,
    rng: Any = None,
    per_node: bool | None = None,
    p: int | None = None,
    restarts: int | None = None,
    domain: Any = None,
    maxiter: int | None = None,
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
        ``"auto"``, ``"templates"``, ``"tree"``, ``"pidentity"`` or ``"hybrid"``.
    time_limit:
        Seconds for the whole search (the templates are always scored); ``None``: iteration caps
        only.  Families stop at the limit and return the best point reached.
    rng:
        Seed or generator of the random starts (results are reproducible for a fixed seed).
    per_node:
        Tree family: refine per node (``True``), never (``False``) or when affordable (``None``).
    p, restarts:
        p-Identity: number of extra rows (default: the internal nodes of the 16-ary tree over
        ``n`` cells, at most 300; hybrid: dense rows on the block sums, default
        ``min(nb // 8, 64)``) and of starts (default 3 for ``n <= 512``, else 1; the best is kept):
        the first a tree with fitted level weights, the others random
        (:mod:`~sparsedp.optimize.pidentity_start`).  Weighted marginals (Laplace
        marginal workloads): random starts (default 4; ``rng`` default 0).
    domain:
        Multi-dimensional workloads only (optional): the :class:`~sparsedp.marginals.Domain` the
        workload must be on; a different one raises :class:`~sparsedp.errors.ShapeError`.
    maxiter:
        L-BFGS-B iterations of each p-Identity start and of the hybrid's final polish (default
        1000); more iterations can only lower the error reached, at ``O(p^2 n)`` each (p-Identity).
    """
    t_start = time.perf_counter()
    model = noise_model(noise)
    if is_multidim(W):
        if time_limit is not None:
            time_limit = check_positive(time_limit, "time_limit")
        strat, fam_m, name, report, sens, hist = optimize_multidim(
            W, model_kind=model.kind, family=family, domain=domain, rng=rng, restarts=restarts,
            options={"time_limit": time_limit, "per_node": per_node, "p": p})
        return OptimizedStrategy(strategy=strat, family=fam_m, name=name, error=report, noise=model.kind,
                                 sensitivity=sens, history=hist, seconds=time.perf_counter() - t_start)
    if domain is not None:
        raise ShapeError("domain= is for multi-dimensional workloads (MarginalWorkload, KronOperator); "
                         "a 1-D workload has none")
    fam = _check_family(family)
    if time_limit is not None:
        time_limit = check_positive(time_limit, "time_limit")
    Wop = aslinearoperator(W, name="workload")
    m, n = Wop.shape
    if restarts is None:
        restarts = 3 if n <= 512 else 1
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
    deadline = Deadline(time_limit)
    gram = Gram(Wop)
    traces = BlockTraces(Wop)

    cands: list[Candidate] = []
    if fam in ("auto", "templates"):
        cands += template_candidates(Wop, gram, traces, model)
    if fam in ("auto", "tree"):
        cands += tree_candidates(Wop, gram, traces, model, deadline=deadline, rng=gen, per_node=per_node)
    # the hybrid (O(p nb^2) per step) before the dense p-Identity (O(p^2 n)): under a time limit
    # the cheaper family gets its share first
    if fam == "hybrid" or (fam == "auto" and hybrid_useful(gram) and not deadline.expired()):
        cands += hybrid_candidates(Wop, gram, model, p=p, deadline=deadline, rng=gen, maxiter=iters)
    if fam == "pidentity" or (fam == "auto" and n <= PIDENTITY_MAX_N and not deadline.expired()):
        cands += pidentity_candidates(Wop, gram, model, p=p, restarts=int(restarts), deadline=deadline, rng=gen,
                                      maxiter=iters)
    if not cands:
        raise ShapeError(f"family {fam!r} has no strategy for this workload (n = {n}, kind {gram.kind!r})")
    best = min(cands, key=lambda c: c.total)
    report = ErrorReport(best.total, best.total / m, best.method)
    return OptimizedStrategy(
        strategy=best.strategy,
        family=best.family,
        name=best.name,
        error=report,
        noise=model.kind,
        sensitivity=_sensitivity(best.strategy, model.kind),
        history=tuple(c.trial() for c in cands),
        seconds=time.perf_counter() - t_start,
    )
