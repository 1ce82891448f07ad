"""LUE-DPTree with objective="gls": exact post-BLUE error, its gradient, budgets, privacy, empirical MSE."""

from fractions import Fraction

import numpy as np
import pytest

from sparsedp.errors import SparseDPError
from sparsedp.validation import budget_fraction
from sparsedp.privacy import Accountant
from sparsedp.trees import (
    LUEDPTree,
    allocate_budget,
    as_interval_tree,
    coverage_probabilities,
    kary_layout,
    sc_layout,
    tree_from_splits,
)
from sparsedp.trees.gls import (
    GLSQueryObjective,
    embed_layout,
    gls_budget,
    gls_error,
    query_coverage,
)


def fraction_path_sums(tree, eps):
    t = as_interval_tree(tree)
    out = []
    for leaf in t.leaves:
        s, v = Fraction(0), int(leaf)
        while v >= 0:
            s += Fraction(float(eps[v]))
            v = int(t.parent[v])
        out.append(s)
    return out


def dense_error(tree, variances, queries=None, weights=None, whole_domain=0.0):
    """``sum_q D(q) q^T P^{-1} q`` with the dense ``P`` (tests only)."""
    t = as_interval_tree(tree)
    n = t.n
    M = np.zeros((t.size, n))
    for i in range(t.size):
        M[i, t.lo[i] : t.hi[i]] = 1.0
    Pinv = np.linalg.inv(M.T @ (M / np.asarray(variances)[:, None]))
    if queries is None:
        pairs = [(a, b) for a in range(n) for b in range(a, n)]
        w = np.ones(len(pairs))
    else:
        pairs = [tuple(q) for q in queries]
        w = np.ones(len(pairs)) if weights is None else np.asarray(weights, dtype=float)
    W = np.zeros((len(pairs), n))
    for i, (a, b) in enumerate(pairs):
        W[i, a : b + 1] = 1.0
    per_query = np.einsum("ij,jk,ik->i", W, Pinv, W)
    one = np.ones(n)
    return (1 - whole_domain) * float(per_query @ w / w.sum()) + whole_domain * float(one @ Pinv @ one)


def ragged_trees():
    """Trees whose leaves lie at several depths (the embedding's pass-through rows are exercised)."""
    rng = np.random.default_rng(7)

    def split(lo, hi):
        m = hi - lo
        k = int(rng.integers(2, min(4, m) + 1))
        cuts = np.sort(rng.choice(np.arange(1, m), size=k - 1, replace=False))
        return np.diff(np.concatenate(([0], cuts, [m]))).tolist()

    return [kary_layout(7, 2), kary_layout(13, 3), sc_layout(20), kary_layout(16, 4),
            as_interval_tree(tree_from_splits(11, split))]


@pytest.mark.parametrize("index", range(5))
def test_embedding_is_the_tree(index):
    t = ragged_trees()[index]
    emb = embed_layout(t)
    lo, hi = emb.layout.intervals()
    assert np.array_equal(lo[emb.rows], t.lo) and np.array_equal(hi[emb.rows], t.hi)
    assert emb.real.sum() == t.size and np.array_equal(np.flatnonzero(emb.real), np.sort(emb.rows))
    # every extra row repeats the interval of a real leaf (a pass-through copy)
    leaf_iv = {(int(a), int(b)) for a, b in zip(t.lo[t.degree == 0], t.hi[t.degree == 0])}
    assert {(int(a), int(b)) for a, b in zip(lo[~emb.real], hi[~emb.real])} <= leaf_iv


@pytest.mark.parametrize("index", range(5))
def test_exact_error_equals_dense_gls(index):
    t = ragged_trees()[index]
    rng = np.random.default_rng(index)
    eps = rng.uniform(0.05, 1.0, t.size)
    v = 2.0 / eps**2
    qs = np.array([[0, t.n - 1], [1, t.n // 2], [2, 2], [0, 3]])
    wq = np.array([1.0, 2.0, 0.5, 3.0])
    for kw in ({}, {"whole_domain": 0.3}, {"queries": qs, "weights": wq}, {"queries": qs, "whole_domain": 0.6}):
        got = gls_error(t, eps, **kw)
        want = dense_error(t, v, **kw)
        assert got == pytest.approx(want, rel=1e-10), kw


@pytest.mark.parametrize("kw", [{}, {"whole_domain": 0.4}, {"queries": np.array([[0, 5], [3, 9], [4, 4]])}])
def test_gradient_equals_finite_differences(kw):
    t = sc_layout(12)
    obj = GLSQueryObjective(t, **kw)
    rng = np.random.default_rng(3)
    a = np.full(obj.layout.nodes, 1.0)
    a[obj.embedding.rows] = rng.uniform(0.2, 2.0, t.size)
    E, g = obj(a)
    assert np.all(g[~obj.embedding.real] == 0.0)
    for r in obj.embedding.rows:
        h = 1e-6 * a[r]
        ap, am = a.copy(), a.copy()
        ap[r] += h
        am[r] -= h
        fd = (obj(ap)[0] - obj(am)[0]) / (2 * h)
        assert g[r] == pytest.approx(fd, rel=1e-5, abs=1e-9 * abs(E))
    assert np.all(g[obj.embedding.rows] < 0)  # more precision never hurts


@pytest.mark.parametrize("index", range(5))
def test_gls_budget_never_worse_than_the_proxy(index):
    t = ragged_trees()[index]
    for w in (0.0, 0.5):
        p = query_coverage(t, whole_domain=w)
        lue = gls_error(t, allocate_budget(t, 1.0, p), whole_domain=w)
        gls = gls_error(t, gls_budget(t, 1.0, whole_domain=w), whole_domain=w)
        assert gls <= lue * (1 + 1e-12)


def test_gls_budget_improves_the_proxy_and_the_whole_domain():
    t = sc_layout(64)
    lue = allocate_budget(t, 1.0, coverage_probabilities(t))
    gls = gls_budget(t, 1.0)
    assert gls_error(t, gls) < 0.97 * gls_error(t, lue)  # a real improvement, not a tie
    mixed = gls_budget(t, 1.0, whole_domain=0.5)
    assert gls_error(t, mixed, whole_domain=1.0) < 0.5 * gls_error(t, gls, whole_domain=1.0)
    assert gls_error(t, gls) <= gls_error(t, mixed)  # what the whole domain costs the ranges


@pytest.mark.parametrize("eps", [1.0, 0.1, 0.7, 1e-3])
@pytest.mark.parametrize("index", range(5))
def test_gls_paths_sum_to_at_most_epsilon_exactly(eps, index):
    t = ragged_trees()[index]
    acc = Accountant(epsilon=eps)
    pub = LUEDPTree(eps, tree=t, objective="gls", whole_domain=0.2, accountant=acc).fit(np.arange(t.n), rng=0)
    sums = fraction_path_sums(t, pub.eps_per_node_)
    assert max(sums) <= Fraction(eps)  # the nominal allocation
    assert float(min(sums)) > (1 - 1e-8) * eps  # the budget is spent (up to the 2^-39 floor), not wasted
    # the certified loss of the scales (margin 2^-40 over the allocation) is within epsilon as written
    # (0.1 is 1/10, below the float), which is what the accountant charges
    assert Fraction(pub.privacy_loss_) <= budget_fraction(eps)
    assert acc.spent_exact == budget_fraction(eps)  # charged once, exactly epsilon as written


def test_default_objective_is_the_papers_proxy():
    t = sc_layout(40)
    pub = LUEDPTree(1.0, tree=t).fit(np.zeros(40, dtype=int), rng=0)
    assert np.array_equal(pub.eps_per_node_, allocate_budget(t, 1.0, coverage_probabilities(t)))
    gls = LUEDPTree(1.0, tree=t, objective="gls").fit(np.zeros(40, dtype=int), rng=0)
    assert gls.expected_error() < pub.expected_error()


@pytest.mark.parametrize(
    "kw",
    [
        {"objective": "blue"},
        {"objective": "gls", "consistency": False},
        {"whole_domain": 1.5},
        {"whole_domain": -0.1},
        {"objective": "gls", "eps_per_node": np.ones(3)},
    ],
)
def test_bad_arguments_are_refused_before_any_charge(kw):
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError):
        LUEDPTree(1.0, accountant=acc, **kw).fit(np.zeros(8, dtype=int), rng=0)
    assert acc.spent_exact == 0


@pytest.mark.parametrize("secure", [False, True])
def test_empirical_mse_matches_the_exact_error(secure):
    n, reps = 24, 1200
    x = np.random.default_rng(0).integers(0, 50, n)
    pub = LUEDPTree(1.0, tree=sc_layout(n), objective="gls", whole_domain=0.3, secure=secure)
    a, b = np.triu_indices(n)
    pairs = np.column_stack([a, b])  # every range once: the uniform distribution
    cs = np.concatenate(([0], np.cumsum(x)))
    truth = cs[b + 1] - cs[a]
    # fit = checks + _prepare (the optimised budgets and calibrated plan: data-independent, no noise)
    # + _publish: prepared once, the same reps releases published through it (same generator, same
    # draws as reps fits; the first is checked against fit itself)
    pub.fit(x, rng=np.random.default_rng(1))
    plan = pub._prepare(x)
    np.testing.assert_array_equal(pub._publish(x, plan, np.random.default_rng(1)).estimate, pub.release_.estimate)
    rng = np.random.default_rng(1)
    mse = 0.0
    for _ in range(reps):
        rel = pub._publish(x, plan, rng)
        mse += 0.7 * np.mean((rel.ranges(pairs) - truth) ** 2) + 0.3 * (rel.range(0, n - 1) - x.sum()) ** 2
    mse /= reps
    obj = GLSQueryObjective(pub.tree_, whole_domain=0.3)
    predicted = obj.error(pub.release_.noise_variances)  # the measurement's actual variances
    assert mse == pytest.approx(predicted, rel=0.10)
    if not secure:
        assert predicted == pytest.approx(pub.expected_error(), rel=1e-9)
