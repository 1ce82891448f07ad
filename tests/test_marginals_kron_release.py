"""Kronecker-strategy releases by mode products (issue 18): equal to the explicit np.kron release for
the same noise, variances from the factored covariance equal empirical ones, bad input refused before
anything is spent."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import Accountant, plan_measurement, workloads as wl
from sparsedp.errors import SparseDPError
from sparsedp.marginals import KronOperator, KronStack
from sparsedp.optimize import optimize_kron
from sparsedp.marginals.kron_release import kron_squared_error, release_kron
from sparsedp.operators import SparseOperator


def _kron(mats):
    out = np.ones((1, 1))
    for M in mats:
        out = np.kron(out, np.asarray(M.toarray() if sp.issparse(M) else M))
    return out


def _ranges(n):
    return wl.all_ranges(n).tosparse().toarray()


def _explicit(K, x, rng, **kw):
    """The release with the explicit product: plan of np.kron(factors), x_hat = pinv y."""
    A = _kron(K.factors)
    m = plan_measurement(SparseOperator(sp.csr_matrix(A)), **kw).measure(x.ravel(), rng=rng)
    return np.linalg.pinv(A) @ m.y, float(m.variances[0]), A


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_equals_the_explicit_kron_release(integer, noise):
    g = np.random.default_rng(4)
    shapes = [(5, 3), (6, 4)]
    fs = [(g.integers(-3, 4, size=s).astype(float) if integer else g.normal(size=s)) for s in shapes]
    for F in fs:
        F[: F.shape[1]] += 7 * np.eye(F.shape[1])  # full column rank
    K = KronOperator(fs)
    x = g.integers(0, 30, size=(3, 4)).astype(float)
    kw = {"epsilon": 0.8} if noise == "laplace" else {"rho": 0.4}
    secure = integer  # exact noise on the grid 1 for integer factors; float noise otherwise
    r = release_kron(x, K, noise=noise, rng=9, secure=secure, **kw)
    Kd = r.strategy  # the measured factors (scaled by powers of two when not integers)
    x_hat, v, A = _explicit(Kd, x, 9, noise=noise, secure=secure, **kw)
    np.testing.assert_allclose(r.x_hat.ravel(), x_hat, rtol=0, atol=1e-9)
    assert r.noise_variance == pytest.approx(v, rel=1e-12)
    # Kronecker and union-of-Kronecker workloads: answers and per-query variances
    W = KronStack([KronOperator([_ranges(3), _ranges(4)]), KronOperator([np.ones((1, 3)), np.eye(4)])])
    Wd = W.tosparse().toarray()
    np.testing.assert_allclose(r.answer(W), Wd @ x_hat, rtol=0, atol=1e-9)
    cov = v * np.linalg.inv(A.T @ A)
    np.testing.assert_allclose(r.variances(W), np.einsum("ij,jk,ik->i", Wd, cov, Wd), rtol=1e-9)
    assert r.expected_squared_error(W) == pytest.approx(np.trace(Wd @ cov @ Wd.T), rel=1e-9)
    truth = x.ravel()
    assert kron_squared_error(W, r.x_hat, x) == pytest.approx(np.sum((Wd @ (x_hat - truth)) ** 2), rel=1e-9)
    if not integer:  # scaled by powers of two: the same strategy up to an exact factor
        ratio = Kd.tosparse().toarray() / _kron(fs)
        assert np.allclose(ratio, ratio.flat[0]) and math.log2(ratio.flat[0]).is_integer()


def test_ranges_by_prefix_sums_equal_the_workload_answers():
    g = np.random.default_rng(1)
    K = KronOperator([np.vstack([np.eye(4), np.ones((1, 4))]), np.vstack([np.eye(3), np.ones((1, 3))]),
                      np.eye(2)])
    x = g.integers(0, 9, size=(4, 3, 2)).astype(float)
    r = release_kron(x, K, epsilon=1.0, rng=2)
    W = KronOperator([_ranges(4), _ranges(3), _ranges(2)])
    spans = [[(a, b) for a in range(n) for b in range(a, n)] for n in (4, 3, 2)]  # all_ranges' row order
    lo = np.array([[s0[0], s1[0], s2[0]] for s0 in spans[0] for s1 in spans[1] for s2 in spans[2]])
    hi = np.array([[s0[1], s1[1], s2[1]] for s0 in spans[0] for s1 in spans[1] for s2 in spans[2]])
    ans, var = r.ranges(lo, hi)
    np.testing.assert_allclose(ans, r.answer(W), rtol=0, atol=1e-9)
    np.testing.assert_allclose(var, r.variances(W), rtol=1e-12)
    with pytest.raises(SparseDPError):
        r.ranges(np.array([[0, 0, 0]]), np.array([[4, 0, 0]]))


def test_reported_variances_equal_empirical_ones():
    K = KronOperator([np.vstack([np.eye(4), np.ones((1, 4))]), np.vstack([2 * np.eye(3), np.ones((2, 3))])])
    W = KronOperator([_ranges(4), _ranges(3)])
    Wd = W.tosparse().toarray()
    x = np.arange(12.0).reshape(4, 3)
    truth = Wd @ x.ravel()
    for kw in ({"epsilon": 1.0}, {"rho": 0.5}):
        errs = []
        for seed in range(600):
            r = release_kron(x, K, rng=1000 + seed, **kw)  # exact (discrete) noise, seeded
            errs.append(r.answer(W) - truth)
        emp = np.var(np.array(errs), axis=0) + np.mean(errs, axis=0) ** 2
        rep = r.variances(W)
        assert emp.mean() == pytest.approx(rep.mean(), rel=0.1)
        assert np.all(np.abs(emp / rep - 1) < 0.4)  # 600 draws: ~6% standard error per query


@pytest.mark.parametrize("n", [16, 64])
def test_expected_error_is_the_kron_strategy_error(n):
    W1 = wl.all_ranges(n)
    k = optimize_kron([W1, W1], family="auto", rng=0, time_limit=2)
    x = np.random.default_rng(0).integers(0, 50, size=(n, n)).astype(float)
    eps = math.sqrt(2)
    r = release_kron(x, k, epsilon=eps, rng=1)
    exp = r.expected_squared_error(KronOperator([W1, W1]))
    # the factored traces are the KronStrategy's (times the square of an exact power-of-two rescaling)
    s = [abs(F).max() / abs(G).max() for F, G in zip(r.strategy.factors, k.strategy.factors)]
    assert all(math.log2(si).is_integer() for si in s)
    assert exp / r.noise_variance == pytest.approx(math.prod(t / si**2 for t, si in zip(k.traces, s)), rel=1e-9)
    b = r.entry.scale_max
    if r.strategy.factors[0] is k.strategy.factors[0]:  # integer strategy on the grid 1: discrete variance
        assert r.noise_variance <= 2 * b * b
    else:  # a fine grid: the discrete Laplace variance is 2 b^2, b within ~1e-6 of the float calibration
        assert exp == pytest.approx(k.total_error(epsilon=eps), rel=1e-5)


def test_bad_input_is_refused_before_anything_is_spent():
    K = KronOperator([np.eye(3), np.vstack([np.eye(2), np.ones((1, 2))])])
    x = np.ones((3, 2))
    acc = Accountant(epsilon=1.0)
    bad_x = [np.full((3, 2), np.nan), -x, np.ones((2, 3)), np.ones(5), x * 1e3]
    for bad in bad_x:
        with pytest.raises(SparseDPError):
            release_kron(bad, K, epsilon=0.5, accountant=acc, max_total=100)
    for kw in ({"epsilon": 0.0}, {"epsilon": -1.0}, {"epsilon": float("nan")}, {"rho": 0.5, "noise": "laplace"}):
        with pytest.raises(SparseDPError):
            release_kron(x, K, accountant=acc, **kw)
    with pytest.raises(SparseDPError):  # overspent
        release_kron(x, K, epsilon=2.0, accountant=acc)
    with pytest.raises(SparseDPError):  # rank-deficient factor: no GLS
        release_kron(x, KronOperator([np.ones((2, 3)), np.eye(2)]), epsilon=0.5, accountant=acc)
    assert acc.spent == 0 and not acc.ledger
    release_kron(x, K, epsilon=0.5, accountant=acc)
    assert acc.spent == pytest.approx(0.5) and len(acc.ledger) == 1


def test_the_max_total_error_names_the_bound_not_the_sum():
    """The refusal above ``max_total`` used to print ``sum(x) = 2.02012e+07``: a total of the
    private data, published without noise by whoever sees the error."""
    from sparsedp.errors import InputBoundError

    K = KronOperator([np.eye(3), np.eye(2)])
    x = np.full((3, 2), 3367.0)  # sum 20202
    acc = Accountant(epsilon=1.0)
    with pytest.raises(InputBoundError, match="max_total=100") as info:
        release_kron(x, K, epsilon=0.5, accountant=acc, max_total=100)
    msg = str(info.value)
    assert "20202" not in msg and "2.02" not in msg and "3367" not in msg
    assert acc.ledger == ()
