"""The weighted-tree family: interval trees with optimised per-level, then per-node, weights.

1. **Complete trees, per-level weights** (:mod:`~sparsedp.optimize.tree_spectral`): for each
   ordering of ``n``'s prime factors as radices (for ``n = 2^m`` just the binary tree, whose level
   subsets are every power-of-two radix sequence), which levels to measure and their shares are
   found by :class:`~sparsedp.optimize.level_search.LevelSearch` on the exact ``O(L)`` closed form,
   started from every k-ary tree the levels contain (so the result is never worse than those
   templates).  Levels left with a negligible share are then removed (their children attach to
   their parents).
2. **Near-complete k-ary trees, per-level weights** (prefix, all-range, identity and total
   workloads, and weighted unions of them): for every radix ``k`` in :data:`NEAR_RADICES` whose complete trees do not fit ``n``
   exactly (those are step 1's), the tree over ``n`` that groups ``k``
   nodes per parent on every level (the last group of a level smaller), i.e. the first ``n`` leaves
   of the complete tree over ``n' = k^(L-1) r >= n`` leaves.  Its levels and shares are chosen by
   the closed form on that complete tree with the workload padded by zero columns
   (:class:`EmbeddedTraces`: a close proxy), then the best :data:`NEAR_SCORED` by the proxy are
   scored exactly on ``n`` if their proxy is within :data:`NEAR_MARGIN` of the best exact error.
   Radices that are not powers of two matter: for prefix sums at ``n = 2^20`` radix 12 with
   per-level shares has 748.7 per query against 761.0 for the best power-of-two tree.
3. **Incomplete balanced trees, per-level weights**, when ``n`` has a prime factor above 16 (so the
   complete trees have a wide flat level) and the workload has no proxy: k-ary layouts for ``k`` in
   (2, 4, 8, 16), on the exact evaluator of :mod:`~sparsedp.optimize.weighted_tree`.
4. **Per-node refinement** of the best tree by the top-down budget split
   (:class:`~sparsedp.optimize.params.NodeSplit`), on the same exact evaluator, until the time
   limit given, convergence, or (without a time limit) :data:`PER_NODE_WORK`; ``per_node=False``
   skips it, ``per_node=None`` also when that work buys fewer than :data:`PER_NODE_MIN_EVALS`
   evaluations.

Every candidate is rounded to an integer strategy with ``Delta <= 2^k``
(:mod:`~sparsedp.optimize.calibrate`) and its error recomputed exactly on the returned weights.
"""

from __future__ import annotations

import time

import numpy as np

from ..operators import Operator, SparseOperator
from ..workloads import AllRangesWorkload, PrefixWorkload, RangeQueriesWorkload, WeightedUnionWorkload
from ..strategies import TreeLayout
from .calibrate import NoiseModel, integer_weights, unit_variance
from .candidate import Candidate
from .gram import Gram, block_sq_norms, closed_parts, parts_block_sq_norms
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

#: Work (element operations, :attr:`~sparsedp.optimize.weighted_tree.TreeObjective.cost` per
#: evaluation) the per-node refinement may spend when ``optimize`` has no time limit: an evaluation
#: count fixed by the sizes, so the result does not depend on the machine's speed or load.
PER_NODE_WORK = 4e9
#: ``per_node=None`` skips the refinement when the work allows fewer evaluations than this (sliding
#: windows over 4,686 days, 9,337 queries: 9 affordable; 14 evaluations took 8.8 s for 0.02%).
PER_NODE_MIN_EVALS = 20

#: Complete trees with more levels than this get no random starts in the level search.
DEEP_LEVELS = 12

#: Radices of the near-complete k-ary trees (step 2 of the module docstring).
NEAR_RADICES = tuple(range(2, 17))
#: How many near-complete trees (best by the proxy's error) are scored exactly ...
NEAR_SCORED = 2
#: ... if their proxy error is within this fraction above the best exact per-level error so far.
NEAR_MARGIN = 0.005



class EmbeddedTraces:
    """:class:`~sparsedp.optimize.tree_spectral.BlockTraces` of a closed-form workload over ``n``
    cells padded with zero columns to the ``n' >= n`` leaves of a complete tree: the workload
    ``[W, 0]``, whose block norms are those of ``W`` with the last block cut at ``n``
    (:func:`~sparsedp.optimize.gram.kind_block_sq_norms`).  The complete tree over ``n'`` with this
    workload differs from the near-complete tree over ``n`` only in the padded cells being
    unknowns rather than absent (one partial block per level), so its closed form is a close proxy
    for the error on ``n`` (measured at ``n = 2^20``, prefix, radices 2..16: 0 to 1.7% above the
    exact per-level error on the truncated tree, 0.3% for radix 12, which both rank first).

    ``kind``: one closed-form kind, or the ``[(c_i, kind_i)]`` of a weighted sum of them
    (:func:`~sparsedp.optimize.gram.closed_parts`; the block norms are ``sum_i c_i`` of the parts'),
    or the workload operator itself (range lists, explicit matrices: the block norms of
    :func:`~sparsedp.optimize.gram.block_sq_norms` with the last block cut at ``n``, ``O(queries)``
    for range lists).  Sliding windows over 4,686 days: the near-complete 8-ary tree from this proxy
    is within 0.1% of the per-level optimum the exact evaluator finds in 6-9 s."""

    def __init__(self, kind: str | list[tuple[float, str]] | Operator, n: int):
        self.kind, self.n = kind, int(n)
        self.W = kind if isinstance(kind, Operator) else None
        self.parts = [] if self.W is not None else (
            [(1.0, kind)] if isinstance(kind, str) else [(float(c), str(k)) for c, k in kind])  # type: ignore[union-attr]
        self._t: dict[int, float] = {}

    def t(self, size: int) -> float:
        size = int(size)
        if size not in self._t:
            norms = (block_sq_norms(self.W, size, padded=True) if self.W is not None
                     else parts_block_sq_norms(self.parts, self.n, size))
            self._t[size] = norms / size
        return self._t[size]

    def details(self, tree: CompleteTree) -> np.ndarray:
        t = np.array([self.t(int(s)) for s in tree.sizes] + [0.0])
        return np.maximum(t[:-1] - t[1:], 0.0)


def embeddable(W: Operator) -> bool:
    """Whether :class:`EmbeddedTraces` can take the workload itself (its padded block norms cost
    ``O(queries)`` or one sparse product): range lists, explicit sparse matrices and weighted
    unions of them (closed-form workloads go by their kinds)."""
    if isinstance(W, WeightedUnionWorkload):
        return all(embeddable(Wi) or isinstance(Wi, (PrefixWorkload, AllRangesWorkload)) for _, Wi in W.parts)
    return isinstance(W, (RangeQueriesWorkload, SparseOperator))


def near_complete(n: int, k: int, lower: tuple[int, ...] = ()) -> CompleteTree:
    """The complete tree with radices ``lower`` on the bottom levels, then radix ``k`` on every level
    but the top one (``r <= k``), over the fewest leaves ``n' = prod(lower) k^j r >= n``
    (``n >= 2``, ``prod(lower) < n``)."""
    radices = list(lower)
    size = int(np.prod(radices)) if radices else 1
    if size >= n:
        raise ValueError(f"the lower radices {lower} already cover n = {n}")
    while size * k < n:
        size *= k
        radices.append(k)
    top = -(-n // size)
    radices.append(top)
    return CompleteTree(size * top, tuple(radices))


def _grouped(n: int, radices: tuple[int, ...]) -> TreeLayout:
    """The first ``n`` leaves of the complete tree with these radices (groups of ``radices[l]``
    consecutive nodes, the last group of a level smaller; one root over what is left)."""
    return TreeLayout.grouped(n, lambda level, m: radices[level] if level < len(radices) else m)


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
    obj: TreeObjective, model: NoiseModel, q0: np.ndarray, deadline: Deadline | None = None, maxiter: int = 300,
    max_evals: int | None = None,
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
        max_evals=max_evals,
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
    w = integer_weights(q_nodes, layout, model)
    M = tree_strategy(layout, w, name=name)
    var = unit_variance(M, model)
    total, method = tree_error(layout, w * w / var, W, gram, traces, tree)
    return Candidate("tree", name, M, float(total), method, time.perf_counter() - t0, family_note)


def _proxy_levels(traces: EmbeddedTraces, tree: CompleteTree, model: NoiseModel, deadline: Deadline | None,
                  rng: np.random.Generator | None = None) -> tuple[float, np.ndarray]:
    """Best level shares of a complete tree over ``n' >= n`` leaves for the workload over ``n``
    padded with zero columns (``traces``): ``(E, q)``."""
    search = LevelSearch(traces.details(tree), tree.sizes, model, deadline)
    starts = [frozenset(range(tree.levels))]
    if rng is not None:
        starts += _start_subsets(tree, rng, 1)
    return search.run(starts)


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
        # deep trees (n = 2^20: 21 levels) take seconds per random start, and the k-ary starts
        # already reach the best subset there (prefix and all ranges, measured)
        _, q = search.run(_start_subsets(tree, gen, random_starts if tree.levels <= DEEP_LEVELS else 0))
        small, qs = collapse(tree, q)
        layout = small.layout()
        name = f"tree[{_radix_name(small.radices)}] per-level"
        cand = _finish(f"levels of {_radix_name(radices)}", name, layout, level_to_node(layout, qs), W, gram, traces, model, small, t0)
        out.append(cand)
        if best_level is None or cand.total < best_level[0]:
            best_level = (cand.total, layout, level_to_node(layout, qs), small, name)
        if deadline is not None and deadline.expired():
            break

    # 2. near-complete k-ary trees: levels and shares from the closed form on n' >= n leaves
    proxy_parts = closed_parts(gram)
    proxy = proxy_parts is not None or embeddable(W)
    if proxy and n > 2 and not (deadline is not None and deadline.expired()):
        ranked = []
        embedded = EmbeddedTraces(proxy_parts if proxy_parts is not None else W, n)  # type: ignore[arg-type]
        for k in NEAR_RADICES:
            if k >= n or (deadline is not None and deadline.expired()):
                break
            t0 = time.perf_counter()
            tree = near_complete(n, k)
            if tree.n == n:  # complete: step 1 searched it (a coarsening of a prime-factor ordering)
                continue
            E, q = _proxy_levels(embedded, tree, model, deadline, gen)
            small, qs = collapse(tree, q)
            ranked.append((E, k, small, qs, time.perf_counter() - t0))
        ranked.sort(key=lambda r: r[0])
        for E, k, small, qs, secs in ranked[:NEAR_SCORED]:
            if deadline is not None and deadline.expired():
                break
            if best_level is not None and E > (1.0 + NEAR_MARGIN) * best_level[0]:
                break  # the proxy is at or above the exact error: this tree would not win
            t0 = time.perf_counter() - secs
            layout = _grouped(n, small.radices)
            if layout.levels != qs.size:  # pragma: no cover - n' < n k^0 keeps every level non-trivial
                continue
            name = f"tree[{_radix_name(small.radices)}~] per-level"
            note = f"near-complete radix {k} (levels from the closed form on n' = {small.n})"
            q_nodes = level_to_node(layout, qs)
            cand = _finish(note, name, layout, q_nodes, W, gram, traces, model, None, t0)
            out.append(cand)
            if best_level is None or cand.total < best_level[0]:
                best_level = (cand.total, layout, q_nodes, None, name)

    # 3. incomplete balanced trees when the complete ones are forced into wide flat levels
    if not proxy and n > 2 and max(prime_factors(n)) > 16:
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

    # 4. per-node refinement of the best per-level tree, within the time left (keeping time for
    #    one more evaluation: the exact score of the result); without a time limit, PER_NODE_WORK
    timed = deadline is not None and deadline.end is not None
    if best_level is not None and per_node is not False and not (timed and deadline.expired()):  # type: ignore[union-attr]
        _, layout, q_nodes, _, name = best_level
        obj = TreeObjective(layout, W, gram)
        evals = None if timed else max(int(PER_NODE_WORK // max(obj.cost, 1.0)), 2)
        if per_node is None and evals is not None and evals < PER_NODE_MIN_EVALS:
            return out  # not affordable at this size: the per-level trees stand
        if per_node is True and evals is not None:
            evals = max(evals, PER_NODE_MIN_EVALS)
        # levels the workload does not need get shares ~1e-16 (e.g. leaves under weekly totals);
        # lift every share to at least 1e-6 (paths still sum to 1) so the evaluator's precision
        # ratios stay within ~1e12 and the split has something to move
        floor = 1e-6
        q_nodes = (1.0 - layout.levels * floor) * q_nodes + floor
        t0 = time.perf_counter()
        q, _, evals = fit_nodes(obj, model, q_nodes, deadline if timed else None, maxiter=300, max_evals=evals)
        if evals > 1:
            note = f"refined from {name} ({evals} evaluations)"
            out.append(_finish(note, name.replace("per-level", "per-node"), layout, q, W, gram, traces, model, None, t0))
    return out
