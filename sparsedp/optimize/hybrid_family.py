"""Running the hybrid family (:mod:`.hybrid`): block sizes, the level-weight search, integer form,
exact score.

For each block tree ``(k, L)`` of :func:`hybrid_configs` (``b = k^L`` cells per block, at most
:data:`HYBRID_MAX_BLOCK`, and at most :data:`HYBRID_MAX_BLOCKS` blocks), the level weights ``R``
(``L + 1`` of them) are searched by Nelder-Mead on their log-ratios, each point scored by
L-BFGS-B on the dense rows ``Theta`` (warm-started from the best point so far, ``inner_iter``
iterations); the best ``R`` is then polished with ``maxiter`` iterations.  The result is rounded to
integers (:func:`~sparsedp.optimize.hybrid.integer_hybrid`) and scored exactly on the integer
matrix (same Woodbury formula, checked against the dense GLS error in the tests).
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import minimize

from ..operators import Operator, SparseOperator
from .calibrate import NoiseModel
from .candidate import Candidate
from .gram import Gram, closed_parts
from .hybrid import HYBRID_DENSE_GRAM_MAX_N, HybridLayout, HybridObjective, hybrid_matrix, integer_hybrid
from .pidentity import DENSE_SCORE_MAX_N, dense_trace
from .search import Deadline, lbfgs

__all__ = ["HYBRID_MAX_BLOCK", "HYBRID_MAX_BLOCKS", "HYBRID_RADICES", "hybrid_candidates", "hybrid_configs",
           "hybrid_error", "hybrid_useful"]

#: Largest block (the dense inverse of its tree Gram is ``O(b^3)``).
HYBRID_MAX_BLOCK = 2048
#: Most blocks (an evaluation is ``O(p nb^2)``).
HYBRID_MAX_BLOCKS = 1024
#: ``family="auto"`` runs the hybrid family from this many cells on (below, p-Identity covers it).
HYBRID_AUTO_MIN_N = 2048
#: Radices of the block trees tried (radix 4 was the slowest and the worst for all ranges at
#: ``n = 4096``: 233.9 per range against 225.1 for radix 12).
HYBRID_RADICES = (12, 8, 16)
#: Work (element operations, ``p nb^2 + n`` per evaluation) each block tree may spend when
#: ``optimize`` has no time limit (:func:`hybrid_eval_budget`): a count of evaluations fixed by the
#: sizes, never the wall clock, so the result is the same on an idle and on a loaded machine.
#: ``prefix(2^20)``: the 12 x 12 x 12 block tree (p = 64 rows on 607 blocks) gets 1,463, about
#: what the former 52 s default reached (1,478).
HYBRID_WORK = 3.6e10
#: ... at least this many evaluations, and at most this many.
HYBRID_MIN_EVALS = 50
HYBRID_MAX_EVALS = 1500


def hybrid_configs(n: int, radices: tuple[int, ...] = HYBRID_RADICES) -> list[tuple[int, int]]:
    """``(k, L)`` per radix: the fewest levels ``L >= 1`` with ``ceil(n / k^L) <= HYBRID_MAX_BLOCKS``,
    kept if ``k^L <= HYBRID_MAX_BLOCK`` and there are at least 2 blocks."""
    out = []
    for k in radices:
        L = 1
        while -(-n // k**L) > HYBRID_MAX_BLOCKS:
            L += 1
        if k**L <= HYBRID_MAX_BLOCK and -(-n // k**L) >= 2 and (k, L) not in out:
            out.append((k, L))
    return out


def _range_like(gram: Gram) -> bool:
    """A prefix or all-range workload, or a weighted sum of closed-form workloads with at least one
    of them (the hybrid's closed form applies, and it scores them by the Woodbury form)."""
    parts = closed_parts(gram)
    return parts is not None and any(k in ("prefix", "all_ranges") for _, k in parts)


def hybrid_useful(gram: Gram) -> bool:
    """Whether ``family="auto"`` runs the hybrid family: a workload it has a closed form for (prefix,
    all ranges, or a weighted sum of closed-form workloads with one of them) with at least
    :data:`HYBRID_AUTO_MIN_N` cells.  Not for other workloads (``family="hybrid"`` still takes those
    with a dense Gram up to :data:`~sparsedp.optimize.hybrid.HYBRID_DENSE_GRAM_MAX_N` cells): their
    evaluations cost ``O(n^2)`` and more -- on sliding windows over 4,686 days the three block trees
    took 60-90 s each and ended at or above the near-complete weighted tree (313,823 - 316,325
    against 313,559) -- and on identity and total workloads a tree is already optimal."""
    return gram.n >= HYBRID_AUTO_MIN_N and bool(hybrid_configs(gram.n)) and _range_like(gram)


def default_hybrid_p(nb: int) -> int:
    """Dense rows: ``nb / 8``, between 1 and 64."""
    return int(min(64, max(1, nb // 8)))


def hybrid_error(layout: HybridLayout, gram: Gram, model: NoiseModel) -> float:
    """Exact expected total squared error at unit budget of the integer hybrid strategy: a dense QR
    for ``n <= 2048`` (and explicit workloads up to ``DENSE_SCORE_MAX_N``), else the Woodbury form
    (float calibration: ``2 Delta_1^2`` Laplace, ``Delta_2^2 / 2`` Gaussian, ``Delta`` the exact
    integer column norm)."""
    norm = float(layout.column_sensitivity().max())
    if gram.n <= 2048 or (not _range_like(gram) and gram.n <= DENSE_SCORE_MAX_N):
        # backward-stable dense score (the Woodbury difference loses digits when the strategy
        # answers a low-rank workload almost exactly; see pidentity.dense_trace)
        f = dense_trace(hybrid_matrix(layout).toarray() / layout.scale, gram) / layout.scale**2
    else:
        theta, delta = layout.theta_delta()
        obj = HybridObjective(gram, model, layout.b, layout.radices, layout.R, theta.shape[0])
        f = obj.value(theta, delta) / layout.scale**2
    return model.sigma2 * (norm * norm if model.p == 1 else norm) * f


def _normalise(R: np.ndarray, model: NoiseModel) -> np.ndarray:
    return R / (R.sum() if model.p == 1 else np.sqrt(np.sum(R * R)))


def hybrid_eval_budget(n: int, nb: int, p: int) -> int:
    """Objective evaluations one block tree gets without a time limit: :data:`HYBRID_WORK` over the
    ``O(p nb^2 + n)`` of one evaluation (between :data:`HYBRID_MIN_EVALS` and
    :data:`HYBRID_MAX_EVALS`), fixed by the sizes."""
    return min(max(int(HYBRID_WORK // (p * nb * nb + n)), HYBRID_MIN_EVALS), HYBRID_MAX_EVALS)


def _fit(gram: Gram, model: NoiseModel, k: int, L: int, p: int, deadline: Deadline, rng: np.random.Generator,
         inner_iter: int, maxiter: int, outer_evals: int,
         max_evals: int | None = None) -> tuple[float, np.ndarray, np.ndarray, int]:
    """Search ``R`` (outer) and ``Theta`` (inner); returns ``(f, R, Theta, evaluations)``.
    ``max_evals``: the evaluations of all the inner searches together (``None``: no cap)."""
    b = k**L
    radices = (k,) * L
    R0 = _normalise(np.ones(L + 1), model)
    obj0 = HybridObjective(gram, model, b, radices, R0, p)
    nb = obj0.nb
    bounds = (0.0, None) if model.p == 1 else None
    state = {"x": rng.random(p * nb) * 0.1, "f": np.inf, "R": R0, "evals": 0}

    def spent() -> bool:
        return deadline.expired() or (max_evals is not None and state["evals"] >= max_evals)

    def inner(R: np.ndarray, iters: int) -> float:
        obj = obj0 if np.array_equal(R, R0) else HybridObjective(gram, model, b, radices, R, p)
        left = None if max_evals is None else max(max_evals - state["evals"], 1)
        res = lbfgs(obj, state["x"], bounds=bounds, deadline=deadline, maxiter=iters, ftol=1e-13, gtol=1e-12,
                    max_evals=left)
        state["evals"] += res.evaluations
        if res.fun < state["f"]:
            state.update(x=res.x, f=res.fun, R=R)
        return res.fun

    inner(R0, inner_iter)

    def outer(u: np.ndarray) -> float:
        if spent():
            return np.inf
        return inner(_normalise(np.exp(np.concatenate(([0.0], u))), model), inner_iter)

    if L >= 1 and outer_evals > 0 and not spent():
        minimize(outer, np.zeros(L), method="Nelder-Mead",
                 options={"maxfev": outer_evals, "initial_simplex": np.vstack([np.zeros(L), 0.5 * np.eye(L)]),
                          "xatol": 1e-3, "fatol": 1e-6})
    if not spent():
        inner(state["R"], maxiter)
    theta = state["x"].reshape(p, nb)
    if model.p == 1:
        theta = np.maximum(theta, 0.0)
    return state["f"], state["R"], theta, state["evals"]


def hybrid_candidates(
    W: Operator,
    gram: Gram,
    model: NoiseModel,
    *,
    p: int | None = None,
    configs: list[tuple[int, int]] | None = None,
    deadline: Deadline | None = None,
    rng: np.random.Generator | None = None,
    inner_iter: int = 150,
    maxiter: int = 1000,
    outer_evals: int = 12,
) -> list[Candidate]:
    """One candidate per block tree of :func:`hybrid_configs` (all of them with ``configs=None``;
    stops early at the deadline, or without one after :func:`hybrid_eval_budget` evaluations per
    block tree)."""
    gen = rng if rng is not None else np.random.default_rng(0)
    deadline = deadline if deadline is not None else Deadline(None)
    n = gram.n
    if closed_parts(gram) is None and n > HYBRID_DENSE_GRAM_MAX_N:
        return []
    out: list[Candidate] = []
    for k, L in (hybrid_configs(n) if configs is None else configs):
        t0 = time.perf_counter()
        nb = -(-n // k**L)
        pp = default_hybrid_p(nb) if p is None else int(min(p, nb))
        budget = None if deadline.end is not None else hybrid_eval_budget(n, nb, pp)
        f, R, theta, evals = _fit(gram, model, k, L, pp, deadline, gen, inner_iter, maxiter, outer_evals, budget)
        obj = HybridObjective(gram, model, k**L, (k,) * L, R, pp)
        lay = integer_hybrid(theta, obj.delta(theta), R, n, k**L, (k,) * L, model)
        name = f"hybrid[{'x'.join([str(k)] * L)} blocks + {pp} rows on {nb}]"
        M = SparseOperator(hybrid_matrix(lay), name=name, structure="general", meta={"hybrid": lay})
        total = hybrid_error(lay, gram, model)
        note = f"R = {np.round(R, 4).tolist()}, {evals} evaluations"
        method = "hybrid-qr" if n <= 2048 or not _range_like(gram) else "hybrid-woodbury"
        out.append(Candidate("hybrid", name, M, float(total), method, time.perf_counter() - t0, note))
        if deadline.expired():
            break
    return out
