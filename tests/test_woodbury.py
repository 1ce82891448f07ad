"""Woodbury GLS of [diag(a); B] strategies against the dense weighted least squares."""

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import MatrixMechanism, least_squares
from sparsedp import workloads as wl
from sparsedp.inference import linear_estimator
from sparsedp.operators import SparseOperator
from sparsedp.optimize import optimize
from sparsedp.woodbury import DENSE_FRACTION, WOODBURY_MAX_ROWS, diagonal_plus_rows, woodbury_solver

RNG = np.random.default_rng(5)


def dense_gls(M: np.ndarray, Y: np.ndarray, v: np.ndarray) -> np.ndarray:
    A = M / np.sqrt(v)[:, None]
    return np.linalg.solve(A.T @ A, A.T @ (Y / (np.sqrt(v) if Y.ndim == 1 else np.sqrt(v)[:, None])))


def random_strategy(n: int, p: int, density: float = 0.5) -> np.ndarray:
    a = RNG.uniform(0.2, 3.0, n) * RNG.choice([-1, 1], n)
    B = sp.random(p, n, density=density, random_state=RNG, data_rvs=lambda k: RNG.normal(size=k)).toarray()
    return np.vstack([np.diag(a), B])


@pytest.mark.parametrize("n,p,density", [(1, 1, 0.5), (7, 3, 0.5), (30, 12, 0.5), (40, 60, 0.5), (300, 20, 0.02)])
def test_equals_dense_gls(n, p, density):
    """Dense extra rows (BLAS products) and sparse ones (density below DENSE_FRACTION)."""
    M = random_strategy(n, p, density)
    if density < DENSE_FRACTION:
        assert 0 < np.count_nonzero(M[n:]) <= DENSE_FRACTION * p * n
    v = RNG.uniform(0.5, 4.0, n + p)
    solve = woodbury_solver(SparseOperator(M), v)
    assert solve is not None
    y = RNG.normal(size=n + p)
    np.testing.assert_allclose(solve(y), dense_gls(M, y, v), rtol=1e-9, atol=1e-10)
    Y = RNG.normal(size=(n + p, 4))
    np.testing.assert_allclose(solve(Y), dense_gls(M, Y, v), rtol=1e-9, atol=1e-10)


def test_form_is_read_from_the_matrix():
    n, p = 12, 4
    M = random_strategy(n, p)
    a, B = diagonal_plus_rows(SparseOperator(M))
    np.testing.assert_array_equal(a, np.diag(M[:n]))
    np.testing.assert_array_equal(B.toarray(), M[n:])
    # any other layout is not taken for it: rows permuted, a zero on the diagonal, an off-diagonal
    # entry in the top block, no extra row, too many extra rows, a non-sparse operator
    assert diagonal_plus_rows(SparseOperator(M[::-1])) is None
    Z = M.copy()
    Z[3, 3] = 0.0
    assert diagonal_plus_rows(SparseOperator(Z)) is None
    Z = M.copy()
    Z[3, 4] = 1.0
    assert diagonal_plus_rows(SparseOperator(Z)) is None
    assert diagonal_plus_rows(SparseOperator(M[:n])) is None
    assert diagonal_plus_rows(SparseOperator(sp.vstack([sp.identity(2), sp.csr_matrix((WOODBURY_MAX_ROWS + 1, 2))]))) is None
    assert diagonal_plus_rows(wl.prefix(5)) is None


def test_least_squares_and_estimator_use_it():
    n, p = 25, 6
    M = random_strategy(n, p)
    v = RNG.uniform(0.5, 2.0, n + p)
    y = RNG.normal(size=n + p)
    rec = least_squares(SparseOperator(M), y, v)
    assert rec.solver == f"woodbury(p={p})" and rec.iterations == 0
    np.testing.assert_allclose(rec.x, dense_gls(M, y, v), rtol=1e-9, atol=1e-10)
    fn, name = linear_estimator(SparseOperator(M), v)
    assert name == f"woodbury(p={p})"
    np.testing.assert_allclose(fn(np.eye(n + p)), dense_gls(M, np.eye(n + p), v), rtol=1e-9, atol=1e-10)


def test_optimized_pidentity_release_is_exact_gls():
    """An optimised p-Identity strategy released by the matrix mechanism: the Woodbury GLS equals the
    dense least squares of the same noisy answers."""
    n = 64
    W = wl.all_ranges(n)
    opt = optimize(W, family="pidentity", rng=0)
    mech = MatrixMechanism(W, opt.strategy, epsilon=1.0)
    x = RNG.integers(0, 20, n).astype(float)
    rel = mech.run(x, rng=np.random.default_rng(1))
    meas = rel.measurement
    assert rel.reconstruction.solver.startswith("woodbury(p=")
    M = opt.strategy.toarray()
    expected = dense_gls(M, meas.y, np.asarray(meas.variances, float) * np.ones(M.shape[0]))
    np.testing.assert_allclose(rel.x_hat, expected, rtol=1e-8, atol=1e-8)
