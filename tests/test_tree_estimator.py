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


def test_exact_tree_path_agrees_with_the_estimator_applied_to_unit_vectors():
    from sparsedp.inference import linear_estimator

    n = 120
    tree = st.hierarchical(n, 3)
    M = st.weighted(tree, np.random.default_rng(0).uniform(0.5, 2.0, tree.shape[0]))
    v = np.full(M.shape[0], 3.0)
    fast = expected_error(wl.all_ranges(n), M, v)
    assert fast.method == "exact-tree"
    apply, _ = linear_estimator(M, v)
    B = wl.all_ranges(n).matmat(apply(np.eye(M.shape[0])))  # W G, rows ordered by lo then hi
    ref = (B * B) @ v
    assert fast.total == pytest.approx(ref.sum(), rel=1e-10)
    np.testing.assert_allclose(fast.variances, ref, rtol=1e-9)
    lo, hi = np.triu_indices(n)
    listed = expected_error(wl.range_queries(n, np.column_stack([lo, hi])), M, v)
    assert listed.method == "exact-tree"
    np.testing.assert_allclose(listed.variances, ref, rtol=1e-9)


def test_large_tree_error_is_exact_and_fast():
    n = 1 << 16
    rep = expected_error(wl.prefix(n), st.hierarchical(n, 2), 2.0)
    assert rep.method == "exact-tree"
    est = expected_error(wl.prefix(n), st.hierarchical(n, 2), 2.0, method="estimate", probes=256, rng=0)
    assert abs(est.total - rep.total) < 5 * est.stderr


def _dense_tree_gls(parent: np.ndarray, y: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Reference: the weighted projection onto parent = sum(children) by a dense KKT solve."""
    n = parent.size
    kids = np.flatnonzero(parent >= 0)
    internal = np.unique(parent[kids])
    C = np.zeros((internal.size, n))
    C[np.arange(internal.size), internal] = 1.0
    row = {u: i for i, u in enumerate(internal)}
    for c in kids:
        C[row[parent[c]], c] = -1.0
    return y - v * (C.T @ np.linalg.solve(C @ (v[:, None] * C.T), C @ y))


@pytest.mark.parametrize("n,k", TREES + [(7, 3), (33, 2), (81, 3)])
def test_two_pass_plan_fast_path_matches_dense_gls(n, k):
    from sparsedp.tree_estimator import layout_plan, two_pass, two_pass_plan

    layout = st.hierarchical(n, k).meta["layout"]
    parent, level_start = layout.bfs()
    rng = np.random.default_rng(7 * n + k)
    Y = rng.normal(size=(layout.nodes, 3)) * 10
    V = rng.uniform(0.5, 3.0, (layout.nodes, 3))
    plan = layout_plan(layout)
    assert any(lp.k for lp in plan) or layout.nodes == 1  # balanced levels take the reshape path
    for j in range(3):  # per-column variances (2-D) agree with one column at a time, and with dense
        ref = _dense_tree_gls(parent, Y[:, j], V[:, j])
        np.testing.assert_allclose(two_pass(parent, level_start, Y, V, plan=plan)[:, j], ref, atol=1e-9)
        np.testing.assert_allclose(two_pass(parent, level_start, Y[:, j], V[:, j]), ref, atol=1e-9)
    np.testing.assert_array_equal(two_pass(parent, level_start, Y, V[:, 0], plan=two_pass_plan(parent, level_start)),
                                  two_pass(parent, level_start, Y, V[:, 0], plan=plan))


def test_two_pass_irregular_forest_takes_general_path():
    from sparsedp.tree_estimator import bfs_order, two_pass, two_pass_plan

    rng = np.random.default_rng(3)
    # a random forest: node i > 2 hangs below a random earlier node; nodes 0, 1, 2 are roots
    parent = np.array([-1, -1, -1] + [int(rng.integers(0, i)) for i in range(3, 60)])
    perm, bparent, level_start = bfs_order(parent)
    plan = two_pass_plan(bparent, level_start)
    assert not all(lp.k for lp in plan)  # irregular: some depth uses reduceat
    y = rng.normal(size=parent.size) * 5
    v = rng.uniform(0.5, 2.0, parent.size)
    out = np.empty_like(y)
    out[perm] = two_pass(bparent, level_start, y[perm], v[perm], plan=plan)
    np.testing.assert_allclose(out, _dense_tree_gls(parent, y, v), atol=1e-9)


def test_two_pass_overwrite_gives_the_same_answer_and_leaves_input_alone_otherwise():
    from sparsedp.tree_estimator import layout_plan, two_pass

    layout = st.hierarchical(45, 2).meta["layout"]
    parent, level_start = layout.bfs()
    rng = np.random.default_rng(1)
    y = rng.normal(size=(layout.nodes, 3))
    v = rng.uniform(0.5, 2.0, layout.nodes)
    keep = y.copy()
    ref = two_pass(parent, level_start, y, v, plan=layout_plan(layout))
    np.testing.assert_array_equal(y, keep)  # default: input untouched
    np.testing.assert_array_equal(two_pass(parent, level_start, y.copy(), v, overwrite=True), ref)
