"""Running the p-Identity family: a tree start, random starts, L-BFGS-B, certified normalisation,
exact score."""

from __future__ import annotations

import time

import numpy as np

from ..errors import SparseDPError
from ..operators import Operator
from .calibrate import NoiseModel, integer_pidentity, unit_variance
from .candidate import Candidate
from .gram import Gram
from .pidentity import (
    DENSE_SCORE_MAX_N,
    PIdentityObjective,
    default_p,
    dense_trace,
    pidentity_strategy,
)
from .pidentity_start import perturbed_tree_start, tree_start
from .search import Deadline, lbfgs

__all__ = ["PIDENTITY_MAX_N", "pidentity_candidates"]

#: Largest domain the dense p-Identity family is run on by ``family="auto"``.
PIDENTITY_MAX_N = 8192


def pidentity_candidates(
    W: Operator,
    gram: Gram,
    model: NoiseModel,
    *,
    p: int | None = None,
    restarts: int = 1,
    maxiter: int = 1000,
    deadline: Deadline | None = None,
    rng: np.random.Generator | None = None,
    start: str = "tree",
    progress: tuple[float, int] | None = None,
    maxcor: int = 10,
) -> list[Candidate]:
    """Optimise ``[I; Theta] D`` from ``restarts`` starts; one candidate per start.

    ``start="tree"``: the first start is the interval tree of
    :func:`~sparsedp.optimize.pidentity_start.tree_start` (internal nodes as rows, level weights
    fitted), the others ``Theta ~ U[0, 1]``; ``start="perturbed"``: the first start is that tree plus
    a positive perturbation of every entry (:func:`~sparsedp.optimize.pidentity_start.perturbed_tree_start`),
    the others ``U[0, 1]``; ``start="random"``: every start ``U[0, 1]`` (HDMM's).  ``progress = (rtol,
    window)``: each start also stops once its best error has improved by less than ``rtol`` over
    the last ``window`` evaluations (:func:`~sparsedp.optimize.search.lbfgs`); ``maxcor``: L-BFGS-B's
    memory (scipy's bounded step costs grow with it: 5 pairs take 0.25 ms per evaluation where 10
    take 0.38 ms at ``n = 256``, ``p = 17``, for the same progress per evaluation)."""
    if start not in ("tree", "random", "perturbed"):
        raise SparseDPError(f"start must be 'tree', 'perturbed' or 'random', got {start!r}")
    gen = rng if rng is not None else np.random.default_rng(0)
    n = gram.n
    p = default_p(n) if p is None else int(p)
    obj = PIdentityObjective(gram, model, p)
    bounds = (0.0, None) if model.p == 1 else None
    out = []
    for r in range(restarts):
        t0 = time.perf_counter()
        if start != "random" and r == 0:
            begin = tree_start if start == "tree" else perturbed_tree_start
            theta0, how = begin(obj, gen, deadline=deadline)
            x0 = theta0.ravel()
        else:
            x0, how = gen.random(p * n), "U[0, 1] start"
        res = lbfgs(obj, x0, bounds=bounds, deadline=deadline, maxiter=maxiter, ftol=1e-13, gtol=1e-12,
                    progress=progress, maxcor=maxcor)
        theta = res.x.reshape(p, n)
        if model.p == 1:
            theta = np.maximum(theta, 0.0)
        d = 1.0 / obj.delta(theta)
        a, B = integer_pidentity(d, theta * d[None, :], model)
        name = f"p-identity(p={p})"
        M = pidentity_strategy(a, B, name)
        if n <= DENSE_SCORE_MAX_N:
            f, method = dense_trace(np.vstack([np.diag(a), B]), gram), "pidentity-qr"
        else:  # the integer matrix is [I; B/a] diag(a)
            f, method = obj.trace(B / a[None, :], 1.0 / a)[0], "pidentity-woodbury"
        total = unit_variance(M, model) * f
        note = f"start {r} ({how}): {res.evaluations} evaluations, {res.stopped}"
        out.append(Candidate("pidentity", name, M, float(total), method, time.perf_counter() - t0, note))
        if deadline is not None and deadline.expired():
            break
    return out
