"""Exact answer variances of the optimiser's Toeplitz and hybrid strategies (sparsedp.factored_covariance),
checked against the explicit dense covariance ``v (M^T M)^{-1}``, and the error report a mechanism and
its releases compute once."""

import numpy as np
import pytest
import scipy.sparse as sp

import sparsedp
from sparsedp import accuracy
from sparsedp import mechanism as mech_mod
from sparsedp import workloads as wl
from sparsedp.accuracy import expected_error
from sparsedp.factored_covariance import HybridCovariance, ToeplitzCovariance, WoodburyCovariance
from sparsedp.inference import least_squares
from sparsedp.operators import SparseOperator
from sparsedp.optimize.hybrid import HybridLayout, hybrid_gls, hybrid_matrix
from sparsedp.optimize.toeplitz_strategy import ToeplitzStrategy
from sparsedp.factored_covariance import structured_covariance

V = 2.5


def _hybrid(n=150, b=16, p=3, seed=0):
    """An integer hybrid strategy with a short last block (n = 150 = 9 * 16 + 6)."""
    rng = np.random.default_rng(seed)
    nb = -(-n // b)
    lay = HybridLayout(n, b, (4, 4), np.array([3.0, 2.0, 5.0]), rng.integers(1, 6, nb).astype(float),
                       rng.integers(0, 9, (p, nb)).astype(float), 64.0, 1)
    return SparseOperator(hybrid_matrix(lay), name="hybrid-test", meta={"hybrid": lay}), lay


def _toeplitz(n=97, seed=1):
    rng = np.random.default_rng(seed)
    m = rng.integers(-3, 4, n).astype(float)
    m[0] = 11.0
    return ToeplitzStrategy(m)


def _pidentity(n=120, p=6, seed=7):
    """``[diag(a); B]``: p-Identity's form (Woodbury)."""
    rng = np.random.default_rng(seed)
    B = rng.integers(0, 5, (p, n)) * (rng.random((p, n)) < 0.5)
    return SparseOperator(sp.vstack([sp.diags(rng.integers(1, 4, n).astype(float)), sp.csr_matrix(B)]))


def _ranges(n, q=300, seed=2):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, n, q)
    e = rng.integers(0, n + 1, q)
    lo, hi = np.minimum(a, e), np.maximum(a, e)
    hi = np.where(hi == lo, lo + 1, hi)
    hi = np.minimum(hi, n)
    lo = np.minimum(lo, hi - 1)
    lo[:3], hi[:3] = 0, n  # the whole domain, a one-cell range, a block boundary
    lo[1], hi[1] = 5, 6
    lo[2], hi[2] = 16, 48
    w = np.arange(n - 7)  # sliding windows of 7 cells: one length shared by many ranges
    return np.concatenate([lo, w]), np.concatenate([hi, w + 7])


@pytest.mark.parametrize("make,per_row", [(lambda: _hybrid()[0], False), (_toeplitz, False),
                                          (lambda: _hybrid(n=256, b=64, p=5, seed=3)[0], False),
                                          (_pidentity, False), (_pidentity, True)])
def test_structured_variances_equal_the_dense_computation(make, per_row):
    M = make()
    n = M.shape[1]
    v = np.full(M.shape[0], V)
    if per_row:  # Woodbury takes any row variances
        v = V * np.random.default_rng(8).uniform(0.5, 2.0, M.shape[0])
    cov = structured_covariance(M, v)
    assert isinstance(cov, (HybridCovariance, ToeplitzCovariance, WoodburyCovariance))
    D = M.tosparse().toarray()
    C = np.linalg.inv(D.T @ (D / v[:, None]))
    L = np.tril(np.ones((n, n)))
    np.testing.assert_allclose(cov.prefix(), np.einsum("ij,jk,ik->i", L, C, L), rtol=1e-9)
    lo, hi = _ranges(n)
    Q = np.zeros((lo.size, n))
    for i, (a, e) in enumerate(zip(lo, hi)):
        Q[i, a:e] = 1.0
    np.testing.assert_allclose(cov.ranges(lo, hi), np.einsum("ij,jk,ik->i", Q, C, Q), rtol=1e-9)
    rng = np.random.default_rng(4)
    S = sp.random(40, n, density=0.1, random_state=5, format="csr")
    S.data = rng.normal(size=S.nnz)
    Sd = S.toarray()
    np.testing.assert_allclose(cov.rows(S), np.einsum("ij,jk,ik->i", Sd, C, Sd), rtol=1e-9, atol=1e-12)
    q = rng.normal(size=n)
    assert cov.functional(q) == pytest.approx(q @ C @ q, rel=1e-9)
    # expected_error routes the implicit workloads to the exact path, all ranges included
    for W in (wl.prefix(n), wl.range_queries(n, np.column_stack([lo, hi - 1])), wl.all_ranges(n)):
        rep = expected_error(W, M, v)
        assert rep.method == f"exact-{cov.kind}"
        Wd = W.tosparse().toarray()
        assert rep.total == pytest.approx(float(np.einsum("ij,jk,ik->", Wd, C, Wd)), rel=1e-9)


def test_hybrid_layout_is_checked_against_the_matrix():
    M, lay = _hybrid()
    assert hybrid_gls(M) is not None
    A = M.matrix.tolil()
    A[lay.n + 3, 7] += 1.0  # one entry of a dense row off by one
    bad = SparseOperator(A.tocsr(), meta={"hybrid": lay})
    assert hybrid_gls(bad) is None
    assert structured_covariance(bad, np.full(bad.shape[0], V)) is None
    A = M.matrix.tolil()
    A[0, 0] += 1.0  # a forest entry
    assert hybrid_gls(SparseOperator(A.tocsr(), meta={"hybrid": lay})) is None


def test_per_row_variances_leave_the_factored_path():
    M, _ = _hybrid()
    v = np.full(M.shape[0], V)
    v[0] = 2 * V
    assert structured_covariance(M, v) is None
    assert structured_covariance(_toeplitz(), np.r_[V, np.full(96, 1.0)]) is None
    rep = expected_error(wl.prefix(M.shape[1]), M, v)  # still exact, by the generic path
    D = M.tosparse().toarray()
    C = np.linalg.inv(D.T @ (D / v[:, None]))
    L = np.tril(np.ones((M.shape[1],) * 2))
    assert rep.total == pytest.approx(float(np.einsum("ij,jk,ik->", L, C, L)), rel=1e-9)


def test_hybrid_reconstruction_is_the_exact_least_squares_solution():
    M, _ = _hybrid()
    y = np.random.default_rng(6).normal(size=M.shape[0]) * 10
    rec = least_squares(M, y, np.full(M.shape[0], V))
    assert rec.solver.startswith("hybrid-woodbury")
    D = M.tosparse().toarray()
    np.testing.assert_allclose(rec.x, np.linalg.lstsq(D, y, rcond=None)[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family,noise,n", [("hybrid", "laplace", 256), ("toeplitz", "gaussian", 128)])
def test_release_variances_equal_the_optimizers_report(family, noise, n):
    W = wl.prefix(n)
    res = sparsedp.optimize(W, family=family, noise=noise)
    kw = {"epsilon": 1.0} if noise == "laplace" else {"rho": 1.0, "noise": "gaussian"}
    rel = sparsedp.MatrixMechanism(W, res.strategy, **kw).run(np.arange(n) % 7, rng=0)
    rr = rel.to_release()
    assert rr.variance_method == f"exact-{family}"
    assert float(np.sum(rr.variances)) == pytest.approx(res.error.total, rel=1e-6)


def test_the_error_report_is_computed_once(monkeypatch, tmp_path):
    calls = {"report": 0, "shape": 0}
    real_error, real_shape = mech_mod.expected_error, accuracy._lazy_gls_shape

    def counting_error(*args, **kwargs):
        calls["report"] += 1
        return real_error(*args, **kwargs)

    def counting_shape(*args, **kwargs):
        calls["shape"] += 1
        return real_shape(*args, **kwargs)

    monkeypatch.setattr(mech_mod, "expected_error", counting_error)
    monkeypatch.setattr(accuracy, "_lazy_gls_shape", counting_shape)
    n = 64
    W = wl.range_queries(n, [(0, 9), (3, 40), (10, 63)])
    mech = sparsedp.MatrixMechanism(W, sparsedp.strategies.hierarchical(n, 4), epsilon=1.0)
    rel = mech.run(np.arange(n) % 5, rng=0)
    first = rel.confidence_intervals()
    second = rel.confidence_intervals()
    np.testing.assert_array_equal(first[0], second[0])
    rel.variances()
    mech.error_report()  # the mechanism's report is the releases'
    rel.to_release().save(tmp_path / "r.npz")
    assert calls == {"report": 1, "shape": 1}
    rel.error_report(method="exact")  # other options: another report
    assert calls["report"] == 2
    other = mech.run(np.arange(n) % 3, rng=1)  # another run of the same mechanism: the same report
    other.confidence_intervals()
    assert calls["report"] == 2 and other.error_report() is rel.error_report()


def test_hybrid_variances_stay_exact_when_dense_rows_pin_a_weak_block():
    """A block with forest scale 1 next to a dense weight 2^20 (what the optimiser returns for short
    range lists): Woodbury's difference of two large terms lost 8 digits; the split by block sums
    does not.  Reference: the noise coefficients ``c = pinv(M)^T q`` by SVD (no normal equations)."""
    n, b = 64, 8
    nb = n // b
    m = np.full(nb, 16383.0)
    m[3:5] = 1.0
    P = np.zeros((1, nb))
    P[0, 3:5] = 1048511.0
    P[0, 6:] = 63.0
    lay = HybridLayout(n, b, (8,), np.array([34.0, 30.0]), m, P, float(2**20), 1)
    M = SparseOperator(hybrid_matrix(lay), meta={"hybrid": lay})
    cov = structured_covariance(M, np.full(M.shape[0], V))
    assert isinstance(cov, HybridCovariance)
    D = M.tosparse().toarray()
    lo = np.array([0, 3, 10, 20, 5, 24, 0])
    hi = np.array([10, 41, 64, 21, 7, 40, 37])
    Q = np.zeros((lo.size, n))
    for i, (a, e) in enumerate(zip(lo, hi)):
        Q[i, a:e] = 1.0
    C = np.linalg.lstsq(D.T, Q.T, rcond=None)[0]  # min-norm solutions of D^T c = q
    ref = V * np.sum(C * C, axis=0)
    np.testing.assert_allclose(cov.ranges(lo, hi), ref, rtol=1e-11)
    L = np.tril(np.ones((n, n)))
    Cp = np.linalg.lstsq(D.T, L.T, rcond=None)[0]
    np.testing.assert_allclose(cov.prefix(), V * np.sum(Cp * Cp, axis=0), rtol=1e-11)


def test_kronecker_variances_are_products_of_the_factors():
    from sparsedp import strategies as st
    from sparsedp.marginals import KronOperator

    W = KronOperator([wl.prefix(6), wl.range_queries(5, [(0, 2), (1, 4), (3, 3)]), wl.all_ranges(3)])
    rng = np.random.default_rng(9)
    M = KronOperator([st.hierarchical(6, 2), _pidentity(n=5, p=2, seed=1).tosparse(), rng.integers(1, 4, (4, 3))])
    rep = expected_error(W, M, V)
    assert rep.method == "exact-kron"
    Wd, Md = W.tosparse().toarray(), M.tosparse().toarray()
    C = V * np.linalg.inv(Md.T @ Md)
    ref = np.einsum("ij,jk,ik->i", Wd, C, Wd)
    np.testing.assert_allclose(rep.variances, ref, rtol=1e-9)
    assert rep.total == pytest.approx(ref.sum(), rel=1e-9)
    # per-row variances: not a product any more, the generic exact path
    v = np.full(M.shape[0], V)
    v[0] *= 2
    assert expected_error(W, M, v).method != "exact-kron"
