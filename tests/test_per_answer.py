"""Per-answer variances and confidence intervals of every release kind (issue 20, item 2).

Each release's reported variances are checked against an explicit dense formula on small cases and
against the empirical variance over repeated seeded releases (within 10%), and its 95% intervals
must cover the truth at least 95% of the time empirically.
"""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp import trees
from sparsedp.errors import SparseDPError
from sparsedp.range_variance import IntervalTreeCovariance, TreeCovariance
from sparsedp.strategies import TreeLayout
from sparsedp.trees.build import as_interval_tree, tree_from_splits


def _dense_cov(tree, v):
    """``(A^T V^-1 A)^-1`` for the node-interval rows ``A`` of ``tree`` (tests only)."""
    A = np.zeros((tree.size, tree.n))
    for i in range(tree.size):
        A[i, tree.lo[i] : tree.hi[i]] = 1.0
    return np.linalg.inv(A.T @ (A / v[:, None]))


def _all_range_variances(C):
    n = C.shape[0]
    a, b = np.triu_indices(n + 1, 1)
    cs = np.zeros((n + 1, n + 1))
    cs[1:, 1:] = np.cumsum(np.cumsum(C, 0), 1)
    return a, b, cs[b, b] - cs[a, b] - cs[b, a] + cs[a, a]


def _trees():
    yield trees.sc_layout(37, 3, 6)  # SC: leaves at several depths
    yield trees.sc_layout(100)
    yield trees.kary_layout(23, 3)
    yield as_interval_tree(tree_from_splits(30, lambda lo, hi: [1, hi - lo - 1]))  # caterpillar, depth 30
    yield as_interval_tree(tree_from_splits(29, lambda lo, hi: [2, hi - lo - 2] if hi - lo > 3 else [1] * (hi - lo)))


@pytest.mark.parametrize("tree", list(_trees()), ids=lambda t: f"n{t.n}-nodes{t.size}-depth{t.levels}")
def test_interval_tree_covariance_matches_dense_formula(tree):
    rng = np.random.default_rng(tree.size)
    v = rng.uniform(0.3, 4.0, tree.size)
    cov = IntervalTreeCovariance(tree, v)
    C = _dense_cov(tree, v)
    a, b, want = _all_range_variances(C)
    got = cov.ranges(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12 * want.max())
    Q = rng.normal(size=(tree.n, 3))
    np.testing.assert_allclose(cov.functionals(Q), np.einsum("ij,ik,kj->j", Q, C, Q), rtol=1e-10)
    assert cov.functional(Q[:, 0]) == pytest.approx(Q[:, 0] @ C @ Q[:, 0], rel=1e-10)


def test_interval_tree_covariance_equals_layered_tree_covariance():
    n = 4**6
    rng = np.random.default_rng(3)
    v = rng.uniform(0.5, 2.0, trees.kary_layout(n, 4).size)
    # kary_layout (breadth-first, root first) and TreeLayout.balanced (row order root first) agree
    # on n = k^L: same nodes in the same order
    a = rng.integers(0, n, 2000)
    b = rng.integers(0, n, 2000)
    a, b = np.minimum(a, b), np.maximum(a, b) + 1
    got = IntervalTreeCovariance(trees.kary_layout(n, 4), v).ranges(a, b)
    want = TreeCovariance(TreeLayout.balanced(n, 4), v).ranges(a, b)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_interval_tree_covariance_refuses_bad_variances():
    t = trees.kary_layout(8, 2)
    with pytest.raises(SparseDPError):
        IntervalTreeCovariance(t, np.ones(t.size - 1))
    with pytest.raises(SparseDPError):
        IntervalTreeCovariance(t, np.r_[0.0, np.ones(t.size - 1)])


# -- tree publishers -------------------------------------------------------------------------------

PAIRS = np.array([[0, 39], [3, 17], [5, 5], [10, 33], [0, 0], [39, 39], [1, 38]])


def _publishers():
    return {
        "lue-sc": lambda: trees.LUEDPTree(1.0, secure=False),
        "lue-raw": lambda: trees.LUEDPTree(1.0, consistency=False, secure=False),
        "boost3": lambda: trees.Boost(1.0, k=3, secure=False),
        "dwork": lambda: trees.Dwork(1.0, secure=False),
        "privelet": lambda: trees.Privelet(1.0, secure=False),
        "lue-exact": lambda: trees.LUEDPTree(1.0),
    }


@pytest.mark.parametrize("name", list(_publishers()))
def test_tree_release_variances_are_exact(name):
    make = _publishers()[name]
    x = np.random.default_rng(0).poisson(5, 40)
    p = make().fit(x, rng=1)
    rel = p.release_
    var = p.variances(PAIRS)
    # dense formula: the answers are linear in the noisy measurements; Var = sum_i v_i (d answer / d y_i)^2
    A = rel.measured_matrix().toarray()
    v = rel.noise_variances
    ranges = np.zeros((len(PAIRS), x.size))
    for q, (lo, hi) in enumerate(PAIRS):
        ranges[q, lo : hi + 1] = 1.0
    if rel.tree is not None and not rel.consistent:
        from sparsedp.trees.coverage import decompose

        q, node = decompose(rel.tree, PAIRS[:, 0], PAIRS[:, 1] + 1)
        D = np.zeros((len(PAIRS), rel.tree.size))
        D[q, node] = 1.0
        want = (D * D) @ v
    else:
        G = np.linalg.pinv(A.T @ (A / v[:, None])) @ (A.T / v)  # the GLS estimator (A has full column rank)
        want = ((ranges @ G) ** 2) @ v
    np.testing.assert_allclose(var, want, rtol=1e-8)
    # every bin by default, and the publisher delegates to its release
    assert p.variances().shape == (x.size,)
    lo, hi = p.confidence_intervals(PAIRS)
    assert np.all(lo < p.ranges(PAIRS)) and np.all(hi > p.ranges(PAIRS))
    assert rel.error_report(PAIRS).total == pytest.approx(var.sum())


@pytest.mark.parametrize("name", ["lue-sc", "lue-raw", "privelet"])
def test_tree_release_variances_match_empirical_and_intervals_cover(name):
    make = _publishers()[name]
    x = np.random.default_rng(0).poisson(5, 40)
    truth = np.array([x[a : b + 1].sum() for a, b in PAIRS])
    R = 2000
    errs = np.empty((R, len(PAIRS)))
    for r in range(R):
        p = make().fit(x, rng=1000 + r)
        errs[r] = p.ranges(PAIRS) - truth
        if r == 0:  # the noise scales do not depend on the data or the draw: one report serves all runs
            var = p.variances(PAIRS)
            lo, hi = p.confidence_intervals(PAIRS, level=0.95)
            half = (hi - lo) / 2.0
            np.testing.assert_allclose((hi + lo) / 2.0, p.ranges(PAIRS))
    ratio = errs.var(axis=0) / var
    assert np.all(np.abs(ratio - 1.0) < 0.10), ratio
    coverage = np.mean(np.abs(errs) <= half, axis=0)
    # a single Laplace term is covered with probability 0.953 exactly: allow 3 standard errors per
    # answer, and require 95% over all answers together
    assert np.all(coverage >= 0.95 - 3.0 * np.sqrt(0.95 * 0.05 / R)), coverage
    assert coverage.mean() >= 0.95, coverage


def test_tree_release_intervals_method_and_level():
    x = np.random.default_rng(0).poisson(5, 40)
    rel = trees.Boost(1.0, secure=False).fit(x, rng=0).release_
    rep = rel.error_report(PAIRS)
    assert rep.noise == "laplace" and not rep.secure and rep.interval_method() == "laplace"
    lo90, hi90 = rel.confidence_intervals(PAIRS, level=0.9)
    lo99, hi99 = rel.confidence_intervals(PAIRS, level=0.99)
    assert np.all(hi99 - lo99 > hi90 - lo90)
    lo, hi = rel.confidence_intervals(PAIRS, method="gaussian")
    np.testing.assert_allclose((hi - lo) / 2, 1.959963984540054 * np.sqrt(rel.variances(PAIRS)))
    exact = trees.Boost(1.0).fit(x, rng=0).release_
    assert exact.error_report(PAIRS).interval_method() == "chebyshev"


def test_tree_release_accuracy_survives_save_and_load(tmp_path):
    x = np.random.default_rng(0).poisson(5, 40)
    rel = trees.LUEDPTree(1.0).fit(x, rng=0).release_
    path = rel.save(tmp_path / "h.npz")
    from sparsedp.trees.publishers import load_release

    back = load_release(path)
    np.testing.assert_allclose(back.variances(PAIRS), rel.variances(PAIRS))
