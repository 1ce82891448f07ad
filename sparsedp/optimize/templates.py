"""The fixed strategies (identity, hierarchical k-ary trees, Haar, Fenwick) scored by the exact error.

They are the floor of :func:`~sparsedp.optimize.optimize`: ``family="auto"`` never returns a
strategy worse than the best of them.  Each is kept as built (0/1 matrices: the mechanism
calibrates from the entries, so the scale does not change the error) and scored by the exact GLS
error at unit budget: the sparse inverse (identity, Fenwick, Haar), the spectral closed form of complete trees
(:mod:`~sparsedp.optimize.tree_spectral`, any workload), the ``O(n log n)`` tree closed form
(prefix, all ranges, identity, total) or the explicit two-pass evaluation
(:class:`~sparsedp.optimize.weighted_tree.TreeObjective`).  A weighted union of workloads
(:func:`~sparsedp.workloads.weighted_union`) is scored as ``sum_i c_i E_i``: every form above is
linear in ``G = sum_i c_i G_i`` (:class:`~sparsedp.optimize.tree_spectral.BlockTraces`,
:func:`sparsedp.expected_error` per part).
"""

from __future__ import annotations

import time

import numpy as np

from .. import strategies as st
from ..accuracy import expected_error
from ..operators import Operator, SparseOperator
from .calibrate import NoiseModel, unit_variance
from .candidate import Candidate
from .exact_score import orthogonal_rows_error
from .gram import Gram
from .params import node_to_level
from .tree_spectral import BlockTraces, CompleteTree, level_error
from .weighted_tree import TreeObjective, row_weights

__all__ = ["TEMPLATE_BRANCHINGS", "score_template", "template_candidates", "template_strategies", "tree_error"]

TEMPLATE_BRANCHINGS = (2, 4, 8, 16, 32, 64)


def template_strategies(n: int) -> list[tuple[str, Operator]]:
    """``identity``, ``hierarchical(k)`` for ``k`` in :data:`TEMPLATE_BRANCHINGS` (``k <= n``),
    ``haar`` and ``fenwick`` over ``n`` cells."""
    out = [("identity", st.identity(n))]
    if n >= 2:
        out += [(f"hierarchical(k={k})", st.hierarchical(n, k)) for k in TEMPLATE_BRANCHINGS if k <= n]
        out += [("haar", st.haar(n)), ("fenwick", st.fenwick(n))]
    return out


def _power_of(n: int, k: int) -> int | None:
    """``L`` with ``k^L = n``, or ``None``."""
    L, m = 0, 1
    while m < n:
        m *= k
        L += 1
    return L if m == n else None


def tree_error(
    layout: st.TreeLayout,
    precisions: np.ndarray,
    W: Operator,
    gram: Gram,
    traces: BlockTraces,
    tree: CompleteTree | None = None,
) -> tuple[float, str]:
    """Exact total squared error of a tree strategy with node precisions ``a`` (row order): the
    spectral form when ``tree`` (complete) is given and ``a`` is constant per level, the
    ``O(n log n)`` closed form for prefix / all-range / identity / total workloads (and weighted
    unions of them: the weighted sum of the parts' forms), otherwise
    :func:`sparsedp.expected_error` (its exact tree path; the search's two-pass evaluator loses
    digits for extreme weight ratios, see :class:`~sparsedp.optimize.weighted_tree.TreeObjective`)."""
    if tree is not None:
        per_level = node_to_level(layout, precisions) / np.asarray(layout.sizes, dtype=np.float64)
        uniform = all(
            np.allclose(layout.level_rows(precisions, lev), per_level[lev], rtol=1e-14, atol=0.0)
            for lev in range(layout.levels)
        )
        if uniform:
            E, _ = level_error(traces.details(tree), tree.sizes, per_level)
            return E, "tree-spectral"
    obj = TreeObjective(layout, W, gram)
    if obj.mode == "closed":
        E, _ = obj(precisions)
        return E, "tree-closed-form"
    M = SparseOperator(layout.matrix(), name="tree", structure="tree", meta={"layout": layout})
    rep = expected_error(W, M, 1.0 / np.asarray(precisions, dtype=np.float64), method="exact")
    return rep.total, rep.method


def score_template(
    name: str, M: Operator, W: Operator, gram: Gram, traces: BlockTraces, model: NoiseModel
) -> Candidate:
    """One template's exact error at unit budget (the template itself is returned as built: an
    integer matrix except Haar for ``n`` not a power of two)."""
    t0 = time.perf_counter()
    var = unit_variance(M, model)
    n = M.shape[1]
    if M.structure == "tree":
        layout = M.meta["layout"]
        w = row_weights(M)
        a = w * w / var
        k = int(layout.child_starts[0][1] - layout.child_starts[0][0]) if layout.levels > 1 else 0
        L = _power_of(n, k) if k >= 2 else None
        tree = CompleteTree(n, (k,) * L) if L else None
        # complete trees: the spectral form; others on prefix / all-range / identity / total
        # workloads: the O(n log n) closed form (tree_error; exact to ~1e-12 at the templates'
        # uniform weights, 10-50x faster than the exact tree path at n = 256 - 512)
        total, method = tree_error(layout, a, W, gram, traces, tree)
    else:
        ortho = None if M.structure == "identity" else orthogonal_rows_error(M, var, gram)  # Haar
        if ortho is not None:
            total, method = ortho, "orthogonal-rows"
        else:
            rep = expected_error(W, M, var)
            total, method = rep.total, rep.method
    return Candidate("templates", name, M, float(total), method, time.perf_counter() - t0)


def template_candidates(W: Operator, gram: Gram, traces: BlockTraces, model: NoiseModel) -> list[Candidate]:
    """Every template of :func:`template_strategies`, scored."""
    return [score_template(name, M, W, gram, traces, model) for name, M in template_strategies(W.shape[1])]
