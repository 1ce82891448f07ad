"""The sweep kernels: LAPACK thin QR / small SVD, the preallocated residual, and the fast relaxed
DLNM-QR sweep against the straightforward one (same iterates)."""

import numpy as np
import pytest

from sparsedp.completion import column_shrink, dlnm_qr, synthetic_problem
from sparsedp.completion._linalg import small_svd, thin_qr
from sparsedp.completion._loop import Monitor
from sparsedp.completion._observed import Residual, as_pattern, spectral_init
from sparsedp.completion._relax import OverRelaxation
from sparsedp.completion.shrinkage import nuclear_objective, resolve_lambda
from sparsedp.errors import SparseDPError


@pytest.mark.parametrize("shape", [(50, 7), (7, 7), (300, 10)])
def test_thin_qr_matches_numpy_and_leaves_input_alone(shape):
    A = np.random.default_rng(1).standard_normal(shape)
    A0 = A.copy()
    Q, R = thin_qr(A)
    Qn, Rn = np.linalg.qr(A)
    np.testing.assert_allclose(Q @ R, A, atol=1e-12)
    np.testing.assert_allclose(Q.T @ Q, np.eye(shape[1]), atol=1e-12)
    assert np.array_equal(np.triu(R), R)
    np.testing.assert_allclose(np.abs(Q), np.abs(Qn), atol=1e-12)  # same Householder QR (up to signs)
    np.testing.assert_allclose(np.abs(R), np.abs(Rn), atol=1e-12)
    assert np.array_equal(A, A0)
    with pytest.raises(SparseDPError):
        thin_qr(A.T[:, :-1] if shape[0] > shape[1] else np.ones((2, 3)))


def test_small_svd_is_an_svd():
    A = np.random.default_rng(2).standard_normal((10, 10))
    P, s, Gt = small_svd(A)
    np.testing.assert_allclose((P * s) @ Gt, A, atol=1e-12)
    np.testing.assert_allclose(s, np.linalg.svd(A, compute_uv=False), rtol=1e-12)


def test_residual_buffer_and_its_views():
    observed, _ = synthetic_problem(60, rank=3, p=0.3, rng=0)
    pat = as_pattern(observed, 3)
    g = np.random.default_rng(3)
    A, B = g.standard_normal((60, 3)), g.standard_normal((60, 3))
    E = Residual(pat).update(A, B)
    dense = observed.toarray() - np.where(observed.toarray() != 0, A @ B.T, 0.0)
    np.testing.assert_allclose(E.csr.toarray(), dense, atol=1e-12)
    np.testing.assert_allclose(E.csc @ A, dense.T @ A, atol=1e-10)
    assert E.norm() == pytest.approx(np.linalg.norm(dense), rel=1e-12)
    E.update(2 * A, B)  # in place: the views follow the buffer
    np.testing.assert_allclose(E.csr @ B, (observed.toarray() - np.where(observed.toarray() != 0, 2 * A @ B.T, 0.0)) @ B, atol=1e-10)


def _straightforward(observed, r, noise_std):
    """The relaxed DLNM-QR as first written: rebuilt sparse matrices, numpy QR/SVD, column_shrink,
    ``L`` and ``D`` kept separately, the core diagonalised every sweep."""
    pat = as_pattern(observed, r)
    lam = resolve_lambda(observed, pat, noise_std, None, r)
    U, s, V = spectral_init(pat, r, 0)
    L, Rt, D = U, V, np.diag(s)
    mon = Monitor(pat, None, 1e-4, 1e-7, 500)
    relax = OverRelaxation(100.0, 0.25 * pat.shape[0] * pat.shape[1] / pat.nnz)
    merit_of = lambda E, D: float(np.sqrt(2.0 * nuclear_objective(E, np.linalg.norm(D, axis=0), lam)))  # noqa: E731
    E = pat.values - pat.sampled(L @ D, Rt)
    merit = merit_of(E, D)
    while True:
        w = relax.w
        S = pat.matrix(w * E)
        L_new = np.linalg.qr(L @ D + S @ Rt)[0]
        Q, T = np.linalg.qr(Rt @ (D.T @ (L.T @ L_new)) + S.T @ L_new)
        P, sig, Gt = np.linalg.svd(T.T)
        L_new, Rt_new, D_new = L_new @ P, Q @ Gt.T, column_shrink(np.diag(sig), w * lam)
        E_new = pat.values - pat.sampled(L_new @ D_new, Rt_new)
        merit_new = merit_of(E_new, D_new)
        if not relax.accept(merit_new, merit):
            continue
        L, Rt, D, E, merit = L_new, Rt_new, D_new, E_new, merit_new
        if mon.record(float(np.linalg.norm(E)), L @ D, Rt):
            return mon.result(L @ D, Rt, "ref"), relax.rejected


@pytest.mark.parametrize("noise_std", [np.sqrt(2), None])
def test_fast_relaxed_sweep_has_the_same_iterates(noise_std):
    observed, truth = synthetic_problem(300, rank=5, p=0.2, noise_scale=1.0, rng=4)
    ref, rejected = _straightforward(observed, 5, noise_std)
    fast = dlnm_qr(observed, 5, noise_std=noise_std)
    assert fast.iterations == ref.iterations and fast.extra["rejected"] == rejected
    np.testing.assert_allclose(fast.history.residual, ref.history.residual, rtol=1e-10)
    X, Xr = fast.left @ fast.right.T, ref.left @ ref.right.T
    assert np.linalg.norm(X - Xr) <= 1e-10 * np.linalg.norm(Xr)
    D = fast.extra["D"]
    assert np.count_nonzero(D - np.diag(np.diag(D))) == 0  # diagonal core in both modes
