"""Toeplitz factorisations of prefix sums / all ranges (family "toeplitz"), their exact integer
measurement, and the certified bounds every optimised strategy carries."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from _mechanism_draws import mechanism_answers

import sparsedp
from sparsedp import workloads as wl
from sparsedp.errors import SparseDPError, UnsupportedStructureError
from sparsedp.measure import plan_measurement
from sparsedp.optimize import optimize
from sparsedp.optimize.bounds import (
    gaussian_dual,
    lower_bound,
    quick_lower_bound,
    spectral_bound_raw,
    svd_bound,
    svd_bound_raw,
)
from sparsedp.optimize.calibrate import noise_model
from sparsedp.optimize.gaussian_structured import (
    integer_column,
    optimize_toeplitz,
    sqrt_column,
    toeplitz_candidates,
    toeplitz_error_raw,
    toeplitz_objective,
)
from sparsedp.optimize.toeplitz_strategy import ToeplitzStrategy, exact_convolution, series_inverse

GAUSS = noise_model("gaussian")


def _exact(a, b, size):
    return [sum(int(a[j]) * int(b[k - j]) for j in range(k + 1)) for k in range(size)]


# -- exact products ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n, bits", [(1, 20), (3, 30), (64, 20), (300, 24), (200, 30)])
def test_exact_convolution_matches_integer_arithmetic(n, bits):
    rng = np.random.default_rng(n + bits)
    a = rng.integers(-(2**16), 2**16, n)
    b = rng.integers(-(2**bits), 2**bits, n)
    ref = _exact(a, b, n)
    got = exact_convolution(a, b, n)
    assert max(abs(v) for v in ref) < 2**53
    assert [int(v) for v in got] == ref  # bit for bit (2 primes, or 3 above 2^58)


def test_exact_convolution_three_primes_and_refusal():
    rng = np.random.default_rng(7)
    a = rng.integers(-(2**16), 2**16, 40)
    b = rng.integers(0, 2**41, 40)  # sum|a| max|b| > 2^58: three primes; values up to ~2^60
    assert float(np.abs(a).sum()) * float(b.max()) > 2.0**58
    ref = _exact(a, b, 40)
    got = exact_convolution(a, b, 40)
    assert max(abs(r) for r in ref) > 2**55
    assert all(float(r) == g for r, g in zip(ref, got))  # the exact integers, correctly rounded
    with pytest.raises(SparseDPError):
        exact_convolution(np.full(4, 2**40), np.full(4, 2**48), 4)


def test_toeplitz_strategy_against_its_explicit_matrix():
    rng = np.random.default_rng(3)
    m = np.r_[5000.0, rng.integers(-900, 900, 99)]
    R = ToeplitzStrategy(m)
    D = R.tosparse().toarray()
    assert np.array_equal(D, np.tril(sp.diags([m[k] * np.ones(100 - k) for k in range(100)],
                                              [-k for k in range(100)]).toarray()))
    x = rng.integers(0, 2**30, 100).astype(float)
    assert np.array_equal(R.matvec(x), D @ x)  # exact for integers (D @ x is exact below 2^53 here)
    y = rng.standard_normal(100)
    np.testing.assert_allclose(R.rmatvec(y), D.T @ y, rtol=1e-10, atol=1e-6)
    np.testing.assert_allclose(R.exact_solve(y), np.linalg.solve(D, y), rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(R.column_norms(2), np.sqrt((D * D).sum(axis=0)))
    np.testing.assert_allclose(R.column_norms(1), np.abs(D).sum(axis=0))
    np.testing.assert_allclose(series_inverse(m, 100), np.linalg.inv(D)[:, 0], rtol=1e-8, atol=1e-15)
    with pytest.raises(SparseDPError):
        ToeplitzStrategy(np.ones(5000)).tosparse()
    with pytest.raises(SparseDPError):
        ToeplitzStrategy(np.r_[0.0, 1.0])


def test_plan_calibrates_from_the_first_column():
    m = np.r_[300.0, -120.0, 77.0, 5.0, 1.0, 0.0, 3.0]
    R = ToeplitzStrategy(m)
    D = sp.csr_matrix(R.tosparse())
    for noise, kw in (("gaussian", {"rho": 0.5}), ("laplace", {"epsilon": 1.0})):
        a = plan_measurement(R, noise=noise, **kw)
        b = plan_measurement(sparsedp.operators.SparseOperator(D), noise=noise, **kw)
        assert a.sensitivity == b.sensitivity and np.array_equal(a.unit_scales, b.unit_scales)
    with pytest.raises(UnsupportedStructureError):  # exact noise needs grid-exact entries
        plan_measurement(ToeplitzStrategy(m + 0.5), rho=1.0, noise="gaussian")
    with pytest.raises(UnsupportedStructureError):  # one scale on every row
        plan_measurement(R, scales=np.arange(1.0, 8.0), noise="gaussian", rho=10.0)


# -- the objective -----------------------------------------------------------------------------------


def _dense_error_raw(m, kind):
    n = m.size
    R = ToeplitzStrategy(m).tosparse().toarray()
    W = (wl.prefix(n) if kind == "prefix" else wl.all_ranges(n)).tosparse().toarray()
    L = W @ np.linalg.inv(R)
    return float(np.sum(L * L)) * float(m @ m)


@pytest.mark.parametrize("kind", ["prefix", "all_ranges"])
def test_objective_is_the_dense_error_and_its_gradient_is_exact(kind):
    n = 40
    rng = np.random.default_rng(1)
    r = sqrt_column(n) * (1.0 + 0.2 * rng.standard_normal(n))
    r[0] = 1.0
    f, g = toeplitz_objective(r, kind)
    assert f == pytest.approx(_dense_error_raw(r, kind), rel=1e-9)
    assert toeplitz_error_raw(r, kind) == pytest.approx(f, rel=1e-12)
    for j in (0, 3, 17, 39):
        e = 1e-6 * max(abs(r[j]), 1e-3)
        rp, rm = r.copy(), r.copy()
        rp[j] += e
        rm[j] -= e
        fd = (toeplitz_objective(rp, kind)[0] - toeplitz_objective(rm, kind)[0]) / (2 * e)
        assert g[j] == pytest.approx(fd, rel=1e-5)
    # scale free
    assert toeplitz_objective(3.0 * r, kind)[0] == pytest.approx(f, rel=1e-12)


@pytest.mark.parametrize("kind, W", [("prefix", wl.prefix(256)), ("all_ranges", wl.all_ranges(256))])
def test_optimised_toeplitz_beats_the_square_root_and_not_the_dual(kind, W):
    r, raw, _ = optimize_toeplitz(256, kind)
    assert raw < 0.99 * toeplitz_error_raw(sqrt_column(256), kind)
    dual = gaussian_dual(W, tol=1e-6)
    assert dual.dual_raw <= raw  # no strategy beats the dual bound
    assert svd_bound_raw(W) <= dual.dual_raw
    (c,) = toeplitz_candidates(W, GAUSS)
    assert c.family == "toeplitz" and isinstance(c.strategy, ToeplitzStrategy)
    m = c.strategy.first_column
    assert np.all(m == np.round(m)) and float(m @ m) <= float(GAUSS.scale) ** 2
    assert c.continuous <= c.total <= c.continuous * (1 + 1e-4)  # the integer strategy, rescored
    assert c.total == pytest.approx(0.5 * _dense_error_raw(m, kind) * plan_measurement(
        c.strategy, rho=1.0, noise="gaussian", secure=False).sensitivity ** 2 / float(m @ m), rel=1e-9)
    assert c.lower_bound == pytest.approx(svd_bound(W), rel=1e-12) and 1.0 < c.gap < 1.13


def test_integer_column_keeps_the_sensitivity():
    r = sqrt_column(5000)
    m = integer_column(r, GAUSS)
    assert float(m @ m) <= 4.0**16 and m[0] >= 1
    with pytest.raises(SparseDPError):
        integer_column(r, noise_model("laplace"))


# -- optimize() and the release path ----------------------------------------------------------------


def test_auto_uses_the_toeplitz_family_above_the_dense_solver():
    for W in (wl.prefix(8192), wl.all_ranges(8192)):
        res = optimize(W, noise="gaussian")
        assert res.family == "toeplitz"
        assert res.lower_bound == pytest.approx(svd_bound(W), rel=1e-12)
        assert 1.0 <= res.gap <= 1.10
        assert res.error.total <= min(t.error for t in res.history if t.family == "templates")
        assert not any(t.family in ("tree", "hybrid", "pidentity") for t in res.history)  # settled
    with pytest.raises(SparseDPError):
        optimize(wl.prefix(64), family="toeplitz")  # Laplace
    with pytest.raises(SparseDPError):
        optimize(wl.identity(64), noise="gaussian", family="toeplitz")  # not prefix / all ranges


@pytest.mark.parametrize("W", [wl.prefix(256), wl.all_ranges(64)])
def test_exact_noise_error_matches_the_reported_error(W):
    res = optimize(W, noise="gaussian", family="toeplitz", rho=0.5)
    assert res.family == "toeplitz"
    mech = sparsedp.MatrixMechanism(W, res, rho=0.5, noise="gaussian")
    assert mech.sensitivity == pytest.approx(math.sqrt(float(res.strategy.first_column @ res.strategy.first_column)))
    x = np.random.default_rng(0).integers(0, 40, W.shape[1])
    truth = W.matvec(x)
    errs = np.sum((mechanism_answers(mech, x, 2000, 2029) - truth) ** 2, axis=1)
    # 2,000 releases: the mean total squared error is the reported one within 10%
    assert np.mean(errs) == pytest.approx(res.error.total, rel=0.10)
    rel = mech.run(x, rng=5)
    assert rel.measurement.y.size == W.shape[1]


# -- bounds for every n ------------------------------------------------------------------------------


def _random_workload(rng, n):
    kind = rng.integers(3)
    if kind == 0:
        r = np.sort(rng.integers(0, n, size=(rng.integers(3, 2 * n), 2)), axis=1)
        return wl.range_queries(n, r)
    if kind == 1:
        return sparsedp.operators.SparseOperator(sp.random(int(rng.integers(2, 3 * n)), n, density=0.3,
                                                           random_state=int(rng.integers(1 << 30)),
                                                           data_rvs=lambda k: rng.standard_normal(k)))
    return wl.weighted_union([(float(rng.uniform(0.1, 2)), wl.prefix(n)), (float(rng.uniform(0.1, 2)), wl.identity(n))])


def test_quick_bounds_are_below_the_dual_and_every_strategy():
    rng = np.random.default_rng(29)
    for trial in range(8):
        n = int(rng.integers(4, 40))
        W = _random_workload(rng, n)
        if float(np.sum(W.column_norms(2) ** 2)) == 0:
            continue
        dual = gaussian_dual(W, tol=1e-7).dual_raw
        spec = spectral_bound_raw(W)
        assert spec <= svd_bound_raw(W) * (1 + 1e-9) <= dual * (1 + 1e-9)
        for noise in ("gaussian", "laplace"):
            q = quick_lower_bound(W, noise)
            assert q <= lower_bound(W, noise) * (1 + 1e-9)
            res = optimize(W, noise=noise, secure=False, time_limit=5.0)
            # no template, tree, p-Identity (or other) candidate beats the quick bound or the dual
            assert all(t.error >= q * (1 - 1e-9) for t in res.history)
            assert res.lower_bound is not None and res.gap >= 1.0 - 1e-9


def test_every_result_carries_a_bound_above_the_dual_size():
    W = wl.range_queries(700, np.sort(np.random.default_rng(1).integers(0, 700, size=(300, 2)), axis=1))
    for noise in ("laplace", "gaussian"):
        res = optimize(W, noise=noise, family="templates")
        assert res.lower_bound is not None
        assert res.lower_bound == pytest.approx(quick_lower_bound(W, noise), rel=1e-12)
        assert res.gap >= 1.0
    # prefix / all ranges: the closed form at any n, general workloads the spectral bound
    big = wl.range_queries(2**18, np.array([[0, 2**18 - 1], [5, 70000], [3, 3]]))
    assert lower_bound(big) == pytest.approx(0.5 * spectral_bound_raw(big))
    assert quick_lower_bound(wl.prefix(2**20)) == pytest.approx(svd_bound(wl.prefix(2**20)))
    # the spectral bound: ||W||_F^4 / (n ||W||_2^2) for the identity is n (tight: the SVD bound)
    assert spectral_bound_raw(wl.identity(50)) == pytest.approx(50.0, rel=1e-9)


def test_multidimensional_results_carry_a_bound():
    import sparsedp.marginals as mg
    from sparsedp.optimize.bounds import marginal_svd_raw, multidim_lower_bound

    D = mg.Domain(["a", "b", "c"], [3, 4, 2])
    mw = mg.marginal_workload(D, [("a", "b"), ("c",), ("b", "c")])
    flat = wl.marginals([3, 4, 2], [(0, 1), (2,), (1, 2)])
    assert marginal_svd_raw(mw) == pytest.approx(svd_bound_raw(flat), rel=1e-9)  # closed form = dense
    for noise in ("gaussian", "laplace"):
        res = optimize(mw, noise=noise)
        assert res.lower_bound == pytest.approx(multidim_lower_bound(mw, noise))
        assert res.lower_bound <= lower_bound(flat, noise) * (1 + 1e-9) <= res.error.total * (1 + 1e-9)
        assert res.gap >= 1.0 - 1e-9
    K = mg.KronOperator([wl.all_ranges(6), wl.prefix(5)])
    res = optimize(K, noise="gaussian")
    assert res.lower_bound <= res.error.total and res.lower_bound == pytest.approx(lower_bound(K), rel=1e-6)
    U = mg.KronStack([mg.KronOperator([wl.all_ranges(5), np.ones((1, 4))]),
                      mg.KronOperator([np.eye(5), wl.prefix(4).tosparse()])])
    dense = sparsedp.operators.SparseOperator(sp.vstack([sp.kron(sp.csr_matrix(T.factors[0]), sp.csr_matrix(T.factors[1]))
                                                         for T in U.terms]))
    assert multidim_lower_bound(U) <= lower_bound(dense) * (1 + 1e-9)
    res = optimize(U, noise="gaussian")
    assert res.lower_bound is not None and res.lower_bound <= res.error.total
    weighted = mg.marginal_workload(D, [("a", "b"), ("c",)], weights=[1.0, 3.0])
    assert multidim_lower_bound(weighted) is None  # no closed form for weighted marginals


def test_quick_bound_of_large_prefix_and_all_ranges_is_closed_form():
    W = wl.all_ranges(2**20)  # 5.5e11 rows: no product with W may be formed
    assert quick_lower_bound(W) == pytest.approx(svd_bound(W), rel=1e-12)
    assert quick_lower_bound(W, "laplace") == pytest.approx(4 * svd_bound(W), rel=1e-12)
