import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp

from sparsedp import ShapeError, SparseDPError
from sparsedp import strategies as st
from sparsedp.inference import l1_fit, least_squares, linear_estimator, nnls, sparse_inverse
from sparsedp.tree_estimator import tree_gls

SEED_A = np.array([[1.0, 1.0], [1.0, -1.0]])


def dense_gls(A: np.ndarray, y: np.ndarray, v: np.ndarray) -> np.ndarray:
    Wt = np.diag(1.0 / v)
    return np.linalg.lstsq(A.T @ Wt @ A, A.T @ Wt @ y, rcond=None)[0]


def test_seed_001_worked_example():
    A = st.from_matrix(SEED_A)
    np.testing.assert_allclose(least_squares(A, [303, -101]).x, [101, 202], atol=1e-9)
    np.testing.assert_allclose(least_squares(A, [300, 150]).x, [225, 75], atol=1e-9)
    np.testing.assert_allclose(least_squares(A, [305, -105]).x, [100, 205], atol=1e-9)
    np.testing.assert_allclose(least_squares(A, [290, 90]).x, [190, 100], atol=1e-9)
    # non-negative and L1 fits agree when the LS solution is already non-negative
    np.testing.assert_allclose(nnls(A, [300, 150]).x, [225, 75], atol=1e-9)
    np.testing.assert_allclose(l1_fit(A, [300, 150]).x, [225, 75], atol=1e-7)


def test_seed_001_negative_case_l1():
    # r = [100, 200] has the LS solution [150, -50]; the L1 fit with x >= 0 is feasible and no worse
    A = st.from_matrix(SEED_A)
    ls = least_squares(A, [100, 200]).x
    np.testing.assert_allclose(ls, [150, -50], atol=1e-9)
    fit = l1_fit(A, [100, 200])
    assert np.all(fit.x >= 0)
    obj = lambda x: np.abs(np.array([100, 200]) - SEED_A @ x).sum()
    grid = [np.array([a, b]) for a in np.linspace(0, 300, 61) for b in np.linspace(0, 300, 61)]
    assert obj(fit.x) <= min(obj(g) for g in grid) + 1e-6


STRUCTURED = [
    st.identity(9),
    st.fenwick(13),
    st.haar(16),
    st.haar(11),
    st.hierarchical(13, 2),
    st.hierarchical(40, 3),
    st.hierarchical(64, 16),
    st.from_matrix(np.tril(np.random.default_rng(5).uniform(1, 2, (6, 6)))),
    st.from_matrix(np.vstack([np.eye(5), np.ones((1, 5)), np.random.default_rng(6).normal(size=(3, 5))])),
]


@pytest.mark.parametrize("M", STRUCTURED, ids=repr)
@pytest.mark.parametrize("weighted", [False, True])
def test_fast_paths_equal_dense_gls(M, weighted):
    rng = np.random.default_rng(7)
    m = M.shape[0]
    if weighted:
        M = st.weighted(M, rng.uniform(0.5, 2.0, m))
    A = M.toarray()
    y = rng.normal(size=m) * 10
    v = rng.uniform(0.5, 4.0, m)
    ref = dense_gls(A, y, v)
    rec = least_squares(M, y, v)
    np.testing.assert_allclose(rec.x, ref, atol=1e-8 * max(1, np.abs(ref).max()))
    apply, _ = linear_estimator(M, v)
    Y = rng.normal(size=(m, 3))
    np.testing.assert_allclose(apply(Y), np.column_stack([dense_gls(A, Y[:, j], v) for j in range(3)]), atol=1e-8)


def test_solver_names():
    assert least_squares(st.fenwick(8), np.ones(8)).solver == "sparse-inverse(fenwick)"
    assert least_squares(st.hierarchical(8, 2), np.ones(15)).solver == "tree-two-pass"
    assert least_squares(st.haar(8), np.ones(8)).solver == "sparse-inverse(haar)"
    assert sparse_inverse(st.hierarchical(8, 2)) is None


def test_tree_gls_large_is_linear_time():
    n = 1 << 16
    M = st.hierarchical(n, 4)
    x = np.random.default_rng(0).integers(0, 10, n).astype(float)
    y = M.matvec(x)
    np.testing.assert_allclose(tree_gls(M.meta["layout"], y, np.ones(M.shape[0])), x, atol=1e-8)


def test_nnls_matches_active_set():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(30, 12))
    y = rng.normal(size=30)
    v = rng.uniform(0.5, 2.0, 30)
    s = 1 / np.sqrt(v)
    ref = scipy.optimize.nnls(A * s[:, None], y * s)[0]
    got = nnls(st.from_matrix(A), y, v)
    assert np.all(got.x >= 0)
    obj = lambda x: np.sum(((A @ x - y) * s) ** 2)
    assert obj(got.x) <= obj(ref) * (1 + 1e-6) + 1e-9
    np.testing.assert_allclose(got.x, ref, atol=1e-4)


def test_l1_matches_dense_lp():
    rng = np.random.default_rng(4)
    A = rng.integers(0, 2, size=(15, 6)).astype(float)
    y = A @ rng.integers(0, 20, 6) + rng.laplace(0, 2, 15)
    got = l1_fit(st.from_matrix(A), y)
    c = np.concatenate([np.zeros(6), np.ones(15)])
    A_ub = np.block([[A, -np.eye(15)], [-A, -np.eye(15)]])
    ref = scipy.optimize.linprog(c, A_ub=A_ub, b_ub=np.concatenate([y, -y]), bounds=(0, None), method="highs")
    assert np.abs(y - A @ got.x).sum() == pytest.approx(ref.fun, rel=1e-7)


def test_bad_input():
    A = st.from_matrix(SEED_A)
    with pytest.raises(ShapeError):
        least_squares(A, [1.0, 2.0, 3.0])
    with pytest.raises(SparseDPError):
        least_squares(A, [1.0, np.nan])
    with pytest.raises(SparseDPError):
        least_squares(A, [1.0, 2.0], variances=[1.0, -1.0])


# -- issue 20, item 4: a tree strategy reconstructs through the publishers' O(n) path -------------


@pytest.mark.parametrize("weighted", [False, True])
def test_tree_reconstruction_never_touches_the_explicit_matrix(weighted):
    n = 200
    M = st.hierarchical(n, 4)
    rng = np.random.default_rng(8)
    if weighted:
        M = st.weighted(M, rng.uniform(0.5, 2.0, M.shape[0]))
    A = M.toarray()
    y = rng.normal(size=M.shape[0]) * 10
    v = rng.uniform(0.5, 4.0, M.shape[0])
    ref = dense_gls(A, y, v)
    def boom():  # the strategy is implicit (IntervalRows): building its matrix would be the slow path
        raise AssertionError("the explicit matrix was built")

    M.tosparse = boom
    rec = least_squares(M, y, v)
    assert rec.solver == "tree-two-pass"
    np.testing.assert_allclose(rec.x, ref, atol=1e-8 * np.abs(ref).max())
    assert rec.residual == pytest.approx(np.linalg.norm((A @ ref - y) / np.sqrt(v)), rel=1e-9)


def test_tree_reconstruction_equals_the_publishers_blue():
    from sparsedp.trees import blue, kary_layout

    n = 4096  # a power of 16: the publishers' k-ary tree and hierarchical(n, 16) are the same tree
    M = st.hierarchical(n, 16)
    tree = kary_layout(n, 16)
    rng = np.random.default_rng(9)
    y = M.matvec(rng.integers(0, 30, n).astype(float)) + rng.laplace(0, 3.0, M.shape[0])
    # same node order (breadth-first, root first), same variances: the same estimate
    np.testing.assert_array_equal(tree.lo, np.concatenate([M.meta["layout"].leaf_starts[lev][:-1]
                                                           for lev in reversed(range(M.meta["layout"].levels))]))
    nodes = blue(tree, y, np.full(M.shape[0], 1.0))
    np.testing.assert_allclose(least_squares(M, y, 2.0).x, nodes[tree.leaves], rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("weights", [None, "random"])
def test_tree_given_as_interval_rows_uses_the_two_pass_path(weights):
    from sparsedp.intervals import IntervalRows

    n = 90
    tree = st.hierarchical(n, 4)
    layout = tree.meta["layout"]
    starts = [layout.leaf_starts[lev] for lev in reversed(range(layout.levels))]
    lo, hi = np.concatenate([a[:-1] for a in starts]), np.concatenate([a[1:] for a in starts])
    rng = np.random.default_rng(10)
    w = None if weights is None else rng.uniform(0.5, 2.0, lo.size)
    M = IntervalRows(n, lo, hi, w, structure="tree", meta={"layout": layout})
    A = M.toarray()
    y = rng.normal(size=lo.size) * 10
    v = rng.uniform(0.5, 4.0, lo.size)
    rec = least_squares(M, y, v)
    assert rec.solver == "tree-two-pass"
    np.testing.assert_allclose(rec.x, dense_gls(A, y, v), atol=1e-8 * max(1.0, np.abs(rec.x).max()))
    apply, _ = linear_estimator(M, v)
    Y = rng.normal(size=(lo.size, 2))
    np.testing.assert_allclose(apply(Y), np.column_stack([dense_gls(A, Y[:, j], v) for j in range(2)]), atol=1e-8)
    # intervals that are not the layout's nodes: no tree fast path
    bad = IntervalRows(n, lo[::-1].copy(), hi[::-1].copy(), structure="tree", meta={"layout": layout})
    assert least_squares(bad, y, v).solver != "tree-two-pass"
