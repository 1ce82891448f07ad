import numpy as np
import pytest

from sparsedp import expected_error
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.tree_estimator import tree_gls, tree_impulse_norms

TREES = [(1, 2), (2, 2), (5, 2), (13, 3), (16, 2), (40, 3), (64, 16), (100, 7), (257, 4)]


@pytest.mark.parametrize("n,k", TREES)
def test_tree_gls_is_consistent_and_exact_on_noiseless_data(n, k):
    M = st.hierarchical(n, k)
    layout = M.meta["layout"]
    rng = np.random.default_rng(n)
    x = rng.integers(0, 20, n).astype(float)
    v = rng.uniform(0.5, 3.0, M.shape[0])
    np.testing.assert_allclose(tree_gls(layout, M.matvec(x), v), x, atol=1e-9)
    # the estimate of a noisy measurement is consistent: node sums of the leaf estimate are its
    # own fitted node values, so re-estimating from M x_hat returns x_hat
    xh = tree_gls(layout, M.matvec(x) + rng.normal(size=M.shape[0]), v)
    np.testing.assert_allclose(tree_gls(layout, M.matvec(xh), v), xh, atol=1e-9)


@pytest.mark.parametrize("n,k", TREES)
@pytest.mark.parametrize("workload", ["prefix", "all_ranges", "identity", "total"])
def test_impulse_norms_equal_explicit_responses(n, k, workload):
    M = st.hierarchical(n, k)
    layout = M.meta["layout"]
    v = np.random.default_rng(k).uniform(0.5, 3.0, M.shape[0])
    G = tree_gls(layout, np.eye(M.shape[0]), v)  # column u: leaf response to an impulse at node u
    W = {"prefix": wl.prefix, "all_ranges": wl.all_ranges, "identity": wl.identity, "total": wl.total}[workload](n)
    np.testing.assert_allclose(tree_impulse_norms(layout, v, workload), W.image_sq_norms(G), rtol=1e-10, atol=1e-12)


def test_closed_form_is_used_and_agrees_with_blocks():
    tree = st.hierarchical(300, 3)
    M = st.weighted(tree, np.random.default_rng(0).uniform(0.5, 2.0, tree.shape[0]))
    v = np.full(M.shape[0], 3.0)
    fast = expected_error(wl.all_ranges(300), M, v)
    assert fast.method == "tree-closed-form"
    # the same total through the generic block path (range list = all ranges, explicitly)
    lo, hi = np.triu_indices(300)
    slow = expected_error(wl.range_queries(300, np.column_stack([lo, hi])), M, v)
    assert slow.method == "exact-blocks"
    assert fast.total == pytest.approx(slow.total, rel=1e-10)


def test_large_tree_error_is_exact_and_fast():
    n = 1 << 16
    rep = expected_error(wl.prefix(n), st.hierarchical(n, 2), 2.0)
    assert rep.method == "tree-closed-form"
    est = expected_error(wl.prefix(n), st.hierarchical(n, 2), 2.0, method="estimate", probes=256, rng=0)
    assert abs(est.total - rep.total) < 5 * est.stderr
