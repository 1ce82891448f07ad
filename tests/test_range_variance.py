import time
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import strategies as st
from sparsedp.operators import SparseOperator
from sparsedp.range_variance import (
    FenwickCovariance,
    HaarCovariance,
    IdentityCovariance,
    MemoryLimitError,
    TreeCovariance,
    check_memory,
)
from sparsedp.factored_covariance import structured_covariance
from sparsedp.tree_estimator import tree_impulse_norms


def dense_cov(M, v: np.ndarray) -> np.ndarray:
    """(M^T V^-1 M)^-1, the covariance of the GLS estimate."""
    A = M.toarray()
    return np.linalg.inv(A.T @ (A / v[:, None]))


def _weighted(M):
    return st.weighted(M, np.random.default_rng(M.shape[0]).uniform(0.5, 2.0, M.shape[0]))


STRATEGIES = [
    st.identity(13),
    st.fenwick(13),
    st.fenwick(16),
    st.fenwick(1),
    st.haar(16),
    st.haar(13),
    st.haar(5),
    st.haar(2),
    st.hierarchical(1, 2),
    st.hierarchical(13, 2),
    st.hierarchical(40, 3),
    st.hierarchical(64, 16),
    st.hierarchical(17, 16),
    st.hierarchical(100, 7),
    _weighted(st.hierarchical(30, 4)),
    _weighted(st.fenwick(11)),
    _weighted(st.haar(12)),
    _weighted(st.identity(6)),
]
KINDS = {"identity": IdentityCovariance, "fenwick": FenwickCovariance, "haar": HaarCovariance, "tree": TreeCovariance}


@pytest.mark.parametrize("M", STRATEGIES, ids=repr)
def test_every_range_variance_equals_the_dense_covariance(M):
    n = M.shape[1]
    v = np.random.default_rng(n).uniform(0.5, 3.0, M.shape[0])  # per-node / per-row variances
    C = dense_cov(M, v)
    cov = structured_covariance(M, v)
    assert isinstance(cov, KINDS[M.structure])
    a, e = np.triu_indices(n + 1, k=1)  # every half-open range [a, e)
    P = np.zeros((n + 1, n + 1))
    P[1:, 1:] = np.cumsum(np.cumsum(C, axis=0), axis=1)  # P[s, t] = Cov(prefix s, prefix t)
    ref = P[e, e] - 2 * P[a, e] + P[a, a]
    np.testing.assert_allclose(cov.ranges(a, e), ref, rtol=1e-10)
    np.testing.assert_allclose(cov.prefix(), np.diag(P)[1:], rtol=1e-10)


@pytest.mark.parametrize("M", STRATEGIES, ids=repr)
def test_sparse_rows_and_dense_functionals_equal_the_dense_covariance(M):
    n = M.shape[1]
    rng = np.random.default_rng(n + 1)
    v = rng.uniform(0.5, 3.0, M.shape[0])
    C = dense_cov(M, v)
    cov = structured_covariance(M, v)
    W = sp.random(9, n, density=0.5, random_state=2, format="csr") + sp.csr_matrix(np.eye(9, n))
    Wd = W.toarray()
    np.testing.assert_allclose(cov.rows(W), np.einsum("ij,jk,ik->i", Wd, C, Wd), rtol=1e-10)
    q = rng.normal(size=n)
    assert cov.functional(q) == pytest.approx(q @ C @ q, rel=1e-10)
    # rows without entries (a whole all-zero workload among them) are answered exactly: variance 0
    np.testing.assert_array_equal(cov.rows(sp.csr_matrix((3, n))), 0.0)


@pytest.mark.parametrize("n,k", [(300, 3), (256, 2), (1000, 16)])
def test_all_range_total_agrees_with_the_impulse_closed_form(n, k):
    M = st.hierarchical(n, k)
    v = np.random.default_rng(k).uniform(0.5, 3.0, M.shape[0])
    cov = structured_covariance(M, v)
    total = (n + 1) * cov.prefix().sum() - cov.functional(np.arange(n, 0, -1.0))
    layout = M.meta["layout"]
    assert total == pytest.approx(float(tree_impulse_norms(layout, v, "all_ranges") @ v), rel=1e-10)
    assert cov.prefix().sum() == pytest.approx(float(tree_impulse_norms(layout, v, "prefix") @ v), rel=1e-10)


def test_large_tree_ranges_are_fast_small_and_agree_with_the_dense_recursion():
    n = 1 << 20
    M = st.hierarchical(n, 16)
    rng = np.random.default_rng(0)
    v = rng.uniform(100.0, 900.0, M.shape[0])
    pairs = np.sort(rng.integers(0, n, (10_000, 2)), axis=1)
    tracemalloc.start()
    t0 = time.perf_counter()
    cov = structured_covariance(M, v)
    var = cov.ranges(pairs[:, 0], pairs[:, 1] + 1)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 5.0
    assert peak < 12 * 8 * M.shape[0]  # a few arrays of the tree's size, nothing n x queries
    for i in range(3):  # an independent code path: the bottom-up recursion on a dense indicator
        q = np.zeros(n)
        q[pairs[i, 0] : pairs[i, 1] + 1] = 1.0
        assert var[i] == pytest.approx(cov.functional(q), rel=1e-9)


def test_haar_matrix_that_is_not_haar_has_no_structured_covariance():
    M = st.haar(8)
    A = M.matrix.copy()
    A.data[3] *= 2.0  # one entry changed: rows are no longer two-valued
    bad = SparseOperator(A, structure="haar", meta=M.meta)
    assert structured_covariance(bad, np.ones(8)) is None
    assert structured_covariance(st.from_matrix(np.tril(np.ones((4, 4)))), np.ones(4)) is None


def test_check_memory_names_the_amount():
    check_memory(10.0, 20.0, "x")
    with pytest.raises(MemoryLimitError, match=r"needs about 1 GiB"):
        check_memory(2.0**30, 1e6, "the thing")


def test_tree_given_as_weighted_interval_rows():
    from sparsedp.intervals import IntervalRows

    n = 50
    layout = st.hierarchical(n, 3).meta["layout"]
    starts = [layout.leaf_starts[lev] for lev in reversed(range(layout.levels))]
    lo, hi = np.concatenate([a[:-1] for a in starts]), np.concatenate([a[1:] for a in starts])
    rng = np.random.default_rng(11)
    M = IntervalRows(n, lo, hi, rng.uniform(0.5, 2.0, lo.size), structure="tree", meta={"layout": layout})
    v = rng.uniform(0.5, 3.0, lo.size)
    cov = structured_covariance(M, v)
    assert isinstance(cov, TreeCovariance)
    a, e = np.triu_indices(n + 1, k=1)
    C = dense_cov(M, v)
    P = np.zeros((n + 1, n + 1))
    P[1:, 1:] = np.cumsum(np.cumsum(C, axis=0), axis=1)
    np.testing.assert_allclose(cov.ranges(a, e), P[e, e] - 2 * P[a, e] + P[a, a], rtol=1e-10)
