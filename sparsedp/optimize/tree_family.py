"""The weighted-tree family: interval trees with optimised per-level, then per-node, weights.

1. **Complete trees, per-level weights** (:mod:`~sparsedp.optimize.tree_spectral`): for each
   ordering of ``n``'s prime factors as radices (for ``n = 2^m`` just the binary tree, whose level
   subsets are every power-of-two radix sequence), which levels to measure and their shares are
   found by :class:`~sparsedp.optimize.level_search.LevelSearch` on the exact ``O(L)`` closed form,
   started from every k-ary tree the levels contain (so the result is never worse than those
   templates).  Levels left with a negligible share are then removed (their children attach to
   their parents).
2. **Incomplete balanced trees, per-level weights**, when ``n`` has a prime factor above 16 (so the
   complete trees have a wide flat level): k-ary layouts for ``k`` in (2, 4, 8, 16), on the exact
   evaluator of :mod:`~sparsedp.optimize.weighted_tree`.
3. **Per-node refinement** of the best tree by the top-down budget split
   (:class:`~sparsedp.optimize.params.NodeSplit`), on the same exact evaluator, until the time
   limit (:data:`PER_NODE_SECONDS` without one) or convergence; ``per_node=False`` skips it.

Every candidate is rounded to an integer strategy with ``Delta <= 2^k``
(:mod:`~sparsedp.optimize.calibrate`) and its error recomputed exactly on the returned weights.
"""

from __future__ import annotations

import time

import numpy as np

from ..operators import Operator
from ..strategies import TreeLayout
from .calibrate import NoiseModel, integer_weights, unit_variance
from .candidate import Candidate
from .gram import Gram
from .level_search import LevelSearch
from .params import (
    LevelShares,
    NodeSplit,
    level_to_node,
    node_to_level,
    precision,
    precision_pullback,
)
from .search import Deadline, lbfgs
from .templates import tree_error
from .tree_spectral import (
    BlockTraces,
    CompleteTree,
    collapse,
    prime_factors,
    radix_orders,
)
from .weighted_tree import TreeObjective, tree_strategy

__all__ = ["fit_levels", "fit_nodes", "tree_candidates"]

_EMBED_BRANCHINGS = (2, 3, 4, 5, 8, 16, 32, 64)

#: Time given to the per-node refinement when ``optimize`` has no time limit.
PER_NODE_SECONDS = 20.0


def _is_power(s: int, k: int) -> bool:
    while s > 1 and s % k == 0:
        s //= k
    return s == 1


def _start_subsets(tree: CompleteTree, rng: np.random.Generator, random_starts: int) -> list[frozenset]:
    """Level subsets to start the search from: every k-ary tree the levels contain (sizes ``k^i``
    and the root), all levels, and a few random subsets."""
    sizes = tree.sizes.astype(np.int64)
    L = sizes.size
    out: list[frozenset] = []
    for k in _EMBED_BRANCHINGS:
        on = frozenset(int(l) for l in range(L) if sizes[l] == sizes[-1] or _is_power(int(sizes[l]), k))
        if on not in out:
            out.append(on)
    if frozenset(range(L)) not in out:
        out.append(frozenset(range(L)))
    for _ in range(random_starts):
        pick = frozenset(int(l) for l in np.flatnonzero(rng.random(L) < 0.4)) | {0}
        if pick not in out:
            out.append(pick)
    return out


def fit_levels(
    obj: TreeObjective, model: NoiseModel, q0: np.ndarray, deadline: Deadline | None = None, maxiter: int = 200
) -> tuple[np.ndarray, float]:
    """Best level shares of any tree layout on the exact evaluator (per-level weights)."""
    layout = obj.layout
    shares = LevelShares(layout.levels)

    def fun(u: np.ndarray) -> tuple[float, np.ndarray]:
        q = shares.shares(u)
        qn = level_to_node(layout, q)
        E, dEa = obj(precision(qn, model))
        dq = node_to_level(layout, precision_pullback(qn, dEa, model))
        return E, shares.pullback(u, dq)

    res = lbfgs(fun, shares.start(q0), bounds=shares.bounds, deadline=deadline, maxiter=maxiter, ftol=1e-13, gtol=1e-12)
    return shares.shares(res.x), res.fun


def fit_nodes(
    obj: TreeObjective, model: NoiseModel, q0: np.ndarray, deadline: Deadline | None = None, maxiter: int = 300
) -> tuple[np.ndarray, float, int]:
    """Per-node shares (top-down split) from per-node start shares ``q0``; returns
    ``(shares, error, evaluations)``.

    Diagonal preconditioning: the search runs on ``y_u = c_u s_u`` with ``c_u`` the square root of
    the number of leaves below ``u`` (normalised to at most 1).  A node's effect on the error
    grows with its subtree, so the raw gradient spans orders of magnitude across levels; with this
    scaling L-BFGS-B reaches the optimum in ~25 evaluations where the raw parameters need ~100
    (prefix, ``n = 2^16``).
    """
    split = NodeSplit(obj.layout)
    lo, hi = obj.layout.intervals()
    c = np.sqrt((hi - lo)[: split.inner].astype(np.float64))
    c /= c.max() if c.size else 1.0

    def fun(y: np.ndarray) -> tuple[float, np.ndarray]:
        x = y / c
        q = split.shares(x)
        E, dEa = obj(precision(q, model))
        return E, split.pullback(x, precision_pullback(q, dEa, model)) / c

    lo_b, hi_b = split.bounds
    res = lbfgs(
        fun,
        split.start(q0) * c,
        bounds=(lo_b * c, hi_b * c),
        deadline=deadline,
        maxiter=maxiter,
        ftol=1e-13,
        gtol=1e-12,
        reserve=1.0,
    )
    return split.shares(res.x / c), res.fun, res.evaluations


def _finish(
    family_note: str,
    name: str,
    layout: TreeLayout,
    q_nodes: np.ndarray,
    W: Operator,
    gram: Gram,
    traces: BlockTraces,
    model: NoiseModel,
    tree: CompleteTree | None,
    t0: float,
) -> Candidate:
    """Build the integer weighted tree (:func:`~sparsedp.optimize.calibrate.integer_weights`) and
    score it exactly."""
    w = integer_weights(q_nodes, layout.matrix(), model)
    M = tree_strategy(layout, w, name=name)
    var = unit_variance(M, model)
    total, method = tree_error(layout, w * w / var, W, gram, traces, tree)
    return Candidate("tree", name, M, float(total), method, time.perf_counter() - t0, family_note)


def _radix_name(radices: tuple[int, ...]) -> str:
    return "x".join(str(r) for r in radices) if radices else "1"


def tree_candidates(
    W: Operator,
    gram: Gram,
    traces: BlockTraces,
    model: NoiseModel,
    *,
    deadline: Deadline | None = None,
    rng: np.random.Generator | None = None,
    per_node: bool | None = None,
    random_starts: int = 4,
) -> list[Candidate]:
    """Weighted-tree candidates for workload ``W`` (see the module docstring), best last refined."""
    gen = rng if rng is not None else np.random.default_rng(0)
    n = int(W.shape[1])
    out: list[Candidate] = []
    best_level: tuple[float, TreeLayout, np.ndarray, CompleteTree | None, str] | None = None

    # 1. complete trees, spectral
    for radices in radix_orders(n, rng=gen):
        t0 = time.perf_counter()
        tree = CompleteTree(n, radices)
        search = LevelSearch(traces.details(tree), tree.sizes, model, deadline)
        _, q = search.run(_start_subsets(tree, gen, random_starts))
        small, qs = collapse(tree, q)
        layout = small.layout()
        name = f"tree[{_radix_name(small.radices)}] per-level"
        cand = _finish(f"levels of {_radix_name(radices)}", name, layout, level_to_node(layout, qs), W, gram, traces, model, small, t0)
        out.append(cand)
        if best_level is None or cand.total < best_level[0]:
            best_level = (cand.total, layout, level_to_node(layout, qs), small, name)
        if deadline is not None and deadline.expired():
            break

    # 2. incomplete balanced trees when the complete ones are forced into wide flat levels
    if n > 2 and max(prime_factors(n)) > 16:
        for k in (2, 4, 8, 16):
            if k >= n or (deadline is not None and deadline.expired()):
                break
            t0 = time.perf_counter()
            layout = TreeLayout.balanced(n, k)
            obj = TreeObjective(layout, W, gram)
            q, _ = fit_levels(obj, model, np.full(layout.levels, 1.0 / layout.levels), deadline)
            name = f"tree[k={k}] per-level"
            cand = _finish("balanced, incomplete", name, layout, level_to_node(layout, q), W, gram, traces, model, None, t0)
            out.append(cand)
            if best_level is None or cand.total < best_level[0]:
                best_level = (cand.total, layout, level_to_node(layout, q), None, name)

    # 3. per-node refinement of the best per-level tree, within the time left (keeping time for
    #    one more evaluation: the exact score of the result); without a time limit, 20 s at most
    if best_level is not None and per_node is not False and not (deadline is not None and deadline.expired()):
        _, layout, q_nodes, _, name = best_level
        # levels the workload does not need get shares ~1e-16 (e.g. leaves under weekly totals);
        # lift every share to at least 1e-6 (paths still sum to 1) so the evaluator's precision
        # ratios stay within ~1e12 and the split has something to move
        floor = 1e-6
        q_nodes = (1.0 - layout.levels * floor) * q_nodes + floor
        obj = TreeObjective(layout, W, gram)
        t0 = time.perf_counter()
        node_deadline = deadline if deadline is not None and deadline.end is not None else Deadline(PER_NODE_SECONDS)
        q, _, evals = fit_nodes(obj, model, q_nodes, node_deadline, maxiter=300)
        if evals > 1:
            note = f"refined from {name} ({evals} evaluations)"
            out.append(_finish(note, name.replace("per-level", "per-node"), layout, q, W, gram, traces, model, None, t0))
    return out
