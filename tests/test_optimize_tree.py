"""Weighted trees: the spectral closed form, the exact evaluator, their gradients, the parametrisations."""

import numpy as np
import pytest

from sparsedp import expected_error
from sparsedp import workloads as wl
from sparsedp.optimize.calibrate import noise_model
from sparsedp.optimize.gram import Gram
from sparsedp.optimize.level_search import LevelSearch
from sparsedp.optimize.params import (
    LevelShares,
    NodeSplit,
    level_to_node,
    node_to_level,
    precision,
    precision_pullback,
)
from sparsedp.optimize.tree_spectral import (
    BlockTraces,
    CompleteTree,
    collapse,
    level_error,
    prime_factors,
    radix_orders,
)
from sparsedp.optimize.weighted_tree import TreeObjective, tree_strategy
from sparsedp.strategies import TreeLayout

N = 24
RNG = np.random.default_rng(7)
WORKLOADS = [
    wl.prefix(N),
    wl.all_ranges(N),
    wl.identity(N),
    wl.total(N),
    wl.range_queries(N, [(0, 3), (5, 20), (7, 7), (2, 23)]),
    wl.from_matrix(RNG.normal(size=(5, N))),
]
LAYOUTS = [TreeLayout.balanced(N, 2), TreeLayout.balanced(N, 5), CompleteTree(N, (2, 3, 4)).layout()]


def dense_error(W: np.ndarray, M: np.ndarray, a: np.ndarray) -> float:
    """tr(W (M^T diag(a) M)^-1 W^T): GLS error with precisions a."""
    P = M.T @ (a[:, None] * M)
    return float(np.trace(W @ np.linalg.solve(P, W.T)))


def fd(fun, x, i, h=1e-6):
    e = np.zeros_like(x)
    e[i] = h
    return (fun(x + e) - fun(x - e)) / (2 * h)


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("layout", LAYOUTS, ids=["k2", "k5", "2x3x4"])
def test_tree_objective_value_and_gradient(W, layout):
    Wd, M = W.toarray(), layout.matrix().toarray()
    a = RNG.uniform(0.2, 3.0, layout.nodes)
    obj = TreeObjective(layout, W)
    assert obj.mode == ("explicit" if W.structure in ("ranges", "general") else "closed")
    E, g = obj(a)
    assert E == pytest.approx(dense_error(Wd, M, a), rel=1e-11)
    for i in (0, 3, layout.nodes - 1):
        assert g[i] == pytest.approx(fd(lambda x: dense_error(Wd, M, x), a, i), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
def test_spectral_closed_form(W):
    tree = CompleteTree(N, (2, 3, 4))
    layout = tree.layout()
    c = BlockTraces(W).details(tree)
    assert np.all(c >= 0)
    a_lev = RNG.uniform(0.2, 3.0, tree.levels)
    a = level_to_node(layout, a_lev)
    E, g = level_error(c, tree.sizes, a_lev)
    assert E == pytest.approx(dense_error(W.toarray(), layout.matrix().toarray(), a), rel=1e-11)
    for lev in range(tree.levels):
        assert g[lev] == pytest.approx(fd(lambda x: level_error(c, tree.sizes, x)[0], a_lev, lev), rel=1e-5)
    # the per-level gradient is the per-node gradient summed over the level
    _, gn = TreeObjective(layout, W)(a)
    np.testing.assert_allclose(node_to_level(layout, gn), g, rtol=1e-9)


def test_spectral_agrees_with_expected_error_at_scale():
    n = 1024
    W = wl.all_ranges(n)
    tree = CompleteTree(n, (4,) * 5)
    a_lev = np.linspace(0.5, 2.0, tree.levels)
    E, _ = level_error(BlockTraces(W).details(tree), tree.sizes, a_lev)
    layout = tree.layout()
    ref = expected_error(W, tree_strategy(layout, np.ones(layout.nodes), "t"), 1.0 / level_to_node(layout, a_lev))
    assert E == pytest.approx(ref.total, rel=1e-10)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_node_split_keeps_every_path_at_one_and_gradient(noise):
    layout = TreeLayout.balanced(13, 3)
    split = NodeSplit(layout)
    x = RNG.uniform(0.05, 0.95, split.inner)
    q = split.shares(x)
    paths = layout.matrix().T @ q  # sum of shares along each leaf's path
    np.testing.assert_allclose(paths, 1.0, rtol=1e-14)
    np.testing.assert_allclose(split.start(q), x, rtol=1e-10)
    model = noise_model(noise)
    obj = TreeObjective(layout, wl.prefix(13))

    def E(xv):
        return obj(precision(split.shares(xv), model))[0]

    qv = split.shares(x)
    _, dEa = obj(precision(qv, model))
    g = split.pullback(x, precision_pullback(qv, dEa, model))
    for i in (0, 1, split.inner - 1):  # a component near 0: the finite difference's own error (abs)
        assert g[i] == pytest.approx(fd(E, x, i), rel=1e-5, abs=1e-6 * float(np.abs(g).max()))


def test_level_shares_gradient():
    shares = LevelShares(5)
    model = noise_model("laplace")
    tree = CompleteTree(32, (2, 2, 2, 4))
    c = BlockTraces(wl.prefix(32)).details(tree)

    def E(u):
        return level_error(c, tree.sizes, precision(shares.shares(u), model))[0]

    u = RNG.uniform(0.1, 1.0, 5)
    q = shares.shares(u)
    _, dEa = level_error(c, tree.sizes, precision(q, model))
    g = shares.pullback(u, precision_pullback(q, dEa, model))
    for i in range(5):
        assert g[i] == pytest.approx(fd(E, u, i), rel=1e-5)


def test_level_search_finds_the_best_subset_of_a_small_tree():
    # exhaustive check over every subset of the inner levels of the binary tree over 64 cells
    W = wl.all_ranges(64)
    tree = CompleteTree(64, (2,) * 6)
    search = LevelSearch(BlockTraces(W).details(tree), tree.sizes, noise_model("laplace"))
    best, _ = search.run([frozenset(range(0, 7, k)) | {6} for k in (1, 2, 3)])
    exhaustive = min(search.value(frozenset({0} | {l for l in range(1, 7) if mask >> (l - 1) & 1}))[0] for mask in range(64))
    assert best == pytest.approx(exhaustive, rel=1e-9)


def test_collapse_and_radices():
    tree = CompleteTree(16, (2, 2, 2, 2))
    small, q = collapse(tree, np.array([0.5, 0.0, 0.5, 0.0, 0.0]))
    assert small.radices == (4, 4) and q.sum() == pytest.approx(1.0) and q[-1] < 1e-8
    assert prime_factors(360) == [2, 2, 2, 3, 3, 5]
    orders = radix_orders(12)
    assert (2, 2, 3) in orders and (3, 2, 2) in orders and len(set(orders)) == len(orders)
    with pytest.raises(ValueError):
        CompleteTree(12, (2, 5))


def test_tree_gram_reused():
    g = Gram(wl.prefix(N))
    assert TreeObjective(LAYOUTS[0], wl.prefix(N), g).mode == "closed"


@pytest.mark.parametrize("workload", ["prefix", "all_ranges", "identity", "total"])
@pytest.mark.parametrize(
    "layout",
    [TreeLayout.balanced(37, 3), CompleteTree(96, (2, 3, 4, 4)).layout(), TreeLayout.balanced(100, 7)],
    ids=["k3-incomplete", "complete-mixed", "k7-incomplete"],
)
def test_impulse_norms_equal_the_reference_closed_form(workload, layout):
    from sparsedp.tree_estimator import ImpulseNorms
    from sparsedp.tree_estimator import tree_impulse_norms

    v = RNG.uniform(0.5, 2.0, layout.nodes)
    np.testing.assert_allclose(ImpulseNorms(layout, workload)(v), tree_impulse_norms(layout, v, workload), rtol=1e-12)


def test_layout_path_sums_equal_the_node_by_leaf_product():
    from sparsedp.optimize.calibrate import layout_path_sums

    for layout in (TreeLayout.balanced(37, 3), TreeLayout.grouped(100, lambda lev, m: (4, 5, 2)[lev] if lev < 3 else m)):
        x = RNG.integers(0, 1000, layout.nodes).astype(float)
        np.testing.assert_array_equal(layout_path_sums(layout, x), layout.matrix().T @ x)


@pytest.mark.parametrize("kind", ["prefix", "all_ranges", "identity", "total"])
@pytest.mark.parametrize("n,k", [(20, 3), (23, 5), (16, 4)])
def test_near_complete_proxy_is_the_padded_workload_on_the_complete_tree(kind, n, k):
    """EmbeddedTraces + the spectral form = dense GLS error of the complete tree over n' >= n
    leaves for the workload over n cells padded with zero columns; the near-complete layout over n
    has the same levels."""
    from sparsedp.optimize.tree_family import EmbeddedTraces, _grouped, near_complete

    tree = near_complete(n, k)
    assert tree.n >= n and tree.n < n * k and all(r == k for r in tree.radices[:-1])
    W = {"prefix": wl.prefix, "all_ranges": wl.all_ranges, "identity": wl.identity, "total": wl.total}[kind](n)
    Wd = np.hstack([W.toarray(), np.zeros((W.shape[0], tree.n - n))])
    a = RNG.uniform(0.2, 2.0, tree.levels)
    E, _ = level_error(EmbeddedTraces(kind, n).details(tree), tree.sizes, a)
    layout = tree.layout()
    assert E == pytest.approx(dense_error(Wd, layout.matrix().toarray(), level_to_node(layout, a)), rel=1e-9)
    if tree.n == n:
        np.testing.assert_allclose(EmbeddedTraces(kind, n).details(tree), BlockTraces(W).details(tree), rtol=1e-12)
    assert _grouped(n, tree.radices).levels == tree.levels


def test_tree_family_scores_near_complete_trees_exactly():
    from sparsedp.optimize import optimize

    n = 100  # 2^2 5^2: radices 3, 6, 7, 8, .. only as near-complete trees
    W = wl.prefix(n)
    res = optimize(W, family="tree", rng=0, per_node=False)
    near = [t for t in res.history if "near-complete" in t.note]
    assert near, [t.note for t in res.history]
    best = min(res.history, key=lambda t: t.error)
    assert res.error.total == best.error
    var = 2.0 * res.sensitivity**2
    assert res.error.total == pytest.approx(expected_error(W, res.strategy, var).total, rel=1e-9)


@pytest.mark.parametrize("n,k", [(20, 3), (23, 5)])
def test_near_complete_proxy_of_range_lists_and_explicit_workloads(n, k):
    """The proxy takes any range list or explicit workload (padded block norms): the spectral form
    equals the dense GLS error of the complete tree over n' >= n leaves on the padded workload."""
    from sparsedp.optimize.tree_family import EmbeddedTraces, embeddable, near_complete

    tree = near_complete(n, k)
    ranges = wl.range_queries(n, [(i, i + w - 1) for w in (3, 7) for i in range(n - w + 1)])
    explicit = wl.from_matrix(RNG.integers(0, 3, size=(9, n)).astype(float))
    for W in (ranges, explicit):
        assert embeddable(W)
        Wd = np.hstack([W.toarray(), np.zeros((W.shape[0], tree.n - n))])
        a = RNG.uniform(0.2, 2.0, tree.levels)
        E, _ = level_error(EmbeddedTraces(W, n).details(tree), tree.sizes, a)
        layout = tree.layout()
        assert E == pytest.approx(dense_error(Wd, layout.matrix().toarray(), level_to_node(layout, a)), rel=1e-9)


def test_lbfgs_stops_after_max_evals_with_the_best_point():
    from sparsedp.optimize.search import lbfgs

    calls = []

    def fun(x):
        calls.append(1)
        return float(np.sum((x - 3.0) ** 4)), 4.0 * (x - 3.0) ** 3

    res = lbfgs(fun, np.zeros(5), max_evals=4)
    assert res.evaluations == 4 == len(calls) and res.stopped == "4 evaluations"
    assert res.fun < fun(np.zeros(5))[0]
