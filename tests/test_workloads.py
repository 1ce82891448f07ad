import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import ShapeError, SparseDPError
from sparsedp import workloads as wl

SMALL = [
    wl.prefix(1),
    wl.prefix(9),
    wl.all_ranges(1),
    wl.all_ranges(7),
    wl.range_queries(10, [(0, 9), (3, 3), (2, 6), (2, 6), (9, 9)]),
    wl.identity(5),
    wl.total(5),
    wl.marginals((2, 3, 2), k=1),
    wl.marginals((2, 3), subsets=[(0, 1), ()]),
]


@pytest.mark.parametrize("W", SMALL, ids=repr)
def test_implicit_equals_explicit(W):
    rng = np.random.default_rng(0)
    A = W.toarray()
    m, n = A.shape
    x, y = rng.normal(size=n), rng.normal(size=m)
    X, Y = rng.normal(size=(n, 3)), rng.normal(size=(m, 2))
    np.testing.assert_allclose(W.matvec(x), A @ x, atol=1e-12)
    np.testing.assert_allclose(W.rmatvec(y), A.T @ y, atol=1e-12)
    np.testing.assert_allclose(W.matmat(X), A @ X, atol=1e-12)
    np.testing.assert_allclose(W.rmatmat(Y), A.T @ Y, atol=1e-12)
    for p in (1, 2):
        np.testing.assert_allclose(W.column_norms(p), np.linalg.norm(A, ord=p, axis=0), atol=1e-12)
    np.testing.assert_allclose(W.image_sq_norms(X), ((A @ X) ** 2).sum(0), rtol=1e-12)
    Xs = sp.random(n, 6, density=0.3, random_state=3, format="csc")
    np.testing.assert_allclose(W.image_sq_norms(Xs), ((A @ Xs.toarray()) ** 2).sum(0), rtol=1e-10, atol=1e-12)


def test_shapes_and_orders():
    assert wl.all_ranges(4).shape == (10, 4)
    A = wl.all_ranges(3).toarray()
    assert A.tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 1, 0], [0, 1, 1], [0, 0, 1]]
    assert wl.prefix(3).toarray().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    M = wl.marginals((2, 3), k=1).toarray()
    np.testing.assert_array_equal(M, np.vstack([np.kron(np.eye(2), np.ones((1, 3))), np.kron(np.ones((1, 2)), np.eye(3))]))


def test_large_implicit_never_materialised():
    n = 1 << 20
    W = wl.all_ranges(n)
    assert W.shape == (n * (n + 1) // 2, n)
    np.testing.assert_allclose(W.column_norms(1)[[0, n // 2, n - 1]], [n, (n // 2 + 1) * (n - n // 2), n])
    u = sp.csc_matrix(([1.0], ([5], [0])), shape=(n, 1))  # a single unit: lies in (6)(n - 5) ranges
    assert W.image_sq_norms(u)[0] == pytest.approx(6.0 * (n - 5))


@pytest.mark.parametrize(
    "bad",
    [lambda: wl.range_queries(5, [(2, 1)]), lambda: wl.range_queries(5, [(0, 5)]), lambda: wl.range_queries(5, [(-1, 2)]),
     lambda: wl.prefix(0), lambda: wl.prefix(2.5), lambda: wl.range_queries(5, [1, 2, 3]), lambda: wl.range_queries(5, [])],
)
def test_bad_input(bad):
    with pytest.raises(ShapeError):
        bad()


def test_marginals_needs_one_spec():
    with pytest.raises(SparseDPError):
        wl.marginals((2, 2))


def test_range_image_norms_of_a_large_sparse_matrix_in_blocks():
    n = 5000
    W = wl.range_queries(n, [(0, n - 1), (10, 4000), (2500, 2500)])
    X = sp.identity(n, format="csc")  # an n x n sparse matrix: must not be densified whole
    got = W.image_sq_norms(X)
    np.testing.assert_allclose(got, W.column_norms(1))  # 0/1 rows: ||W e_j||^2 = ranges containing j
