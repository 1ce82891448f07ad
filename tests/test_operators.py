import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsedp import SparseDPError, ShapeError
from sparsedp.operators import SparseOperator, aslinearoperator, column_norms, kron, scale_rows, sensitivity, vstack


def brute_force_sensitivity(A: np.ndarray, p: int) -> float:
    """max over neighbouring count vectors x, x + e_j of ||A x' - A x||_p, via matvecs."""
    op = aslinearoperator(A)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, A.shape[1]).astype(float)
    base = op.matvec(x)
    best = 0.0
    for j in range(A.shape[1]):
        xp = x.copy()
        xp[j] += 1
        best = max(best, np.linalg.norm(op.matvec(xp) - base, ord=p))
    return best


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 12),
    n=st.integers(1, 12),
    density=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**32 - 1),
    p=st.sampled_from([1, 2]),
)
def test_sensitivity_matches_brute_force(m, n, density, seed, p):
    A = sp.random(m, n, density=density, random_state=seed, data_rvs=lambda k: np.random.default_rng(seed).normal(size=k))
    dense = A.toarray()
    assert sensitivity(A, norm=p) == pytest.approx(brute_force_sensitivity(dense, p), rel=1e-12, abs=1e-12)


def test_sparse_operator_matches_matrix():
    rng = np.random.default_rng(1)
    A = sp.random(7, 5, density=0.5, random_state=2)
    op = SparseOperator(A)
    x, y, X = rng.normal(size=5), rng.normal(size=7), rng.normal(size=(5, 3))
    dense = A.toarray()
    np.testing.assert_allclose(op.matvec(x), dense @ x)
    np.testing.assert_allclose(op.rmatvec(y), dense.T @ y)
    np.testing.assert_allclose(op.matmat(X), dense @ X)
    np.testing.assert_allclose(op.H.matvec(y), dense.T @ y)
    np.testing.assert_allclose(op.image_sq_norms(X), ((dense @ X) ** 2).sum(0))
    np.testing.assert_allclose(op.image_sq_norms(sp.csc_matrix(X)), ((dense @ X) ** 2).sum(0))
    np.testing.assert_allclose(column_norms(op, 2), np.linalg.norm(dense, axis=0))


def test_composition():
    A = np.array([[1.0, 2.0], [0.0, 1.0]])
    B = np.ones((1, 3))
    assert vstack([A, np.eye(2)]).toarray().tolist() == np.vstack([A, np.eye(2)]).tolist()
    np.testing.assert_array_equal(kron(A, np.eye(2)).toarray(), np.kron(A, np.eye(2)))
    w = np.array([2.0, 3.0])
    scaled = scale_rows(A, w)
    np.testing.assert_array_equal(scaled.toarray(), np.diag(w) @ A)
    twice = scale_rows(scaled, w)
    np.testing.assert_array_equal(twice.toarray(), np.diag(w * w) @ A)
    assert twice.base is scaled.base
    with pytest.raises(ShapeError):
        vstack([A, B])
    with pytest.raises(ShapeError):
        scale_rows(A, [1.0, 0.0])
    with pytest.raises(ShapeError):
        scale_rows(A, [1.0])


def test_bad_operators():
    with pytest.raises(ShapeError):
        aslinearoperator(np.ones(3))
    with pytest.raises(ShapeError):
        SparseOperator(np.array([[np.nan, 1.0]]))
    with pytest.raises(SparseDPError):
        sensitivity(np.eye(2), norm=3)
