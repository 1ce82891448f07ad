import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import Accountant, BudgetExceededError, InvalidPrivacyParameterError, NonFiniteInputError, ShapeError
from sparsedp.completion import (
    METHODS,
    alternating_minimization,
    column_shrink,
    dlnm_qr,
    lmafit_sor,
    noise_threshold,
    observation_sensitivity,
    oracle_rse,
    privatize_observations,
    rse,
    soft_impute,
    synthetic_problem,
)
from sparsedp.completion._observed import spectral_norm
from sparsedp.completion.soft_impute import sampled_noise_norm
from sparsedp.completion._observed import as_pattern

FIXED_RANK = {"dlnm-qr": dlnm_qr, "sor": lmafit_sor, "am": alternating_minimization}


@pytest.fixture(scope="module")
def exact_problem():
    return synthetic_problem(100, rank=5, p=0.3, rng=3)


# --- metrics ---------------------------------------------------------------------------------------

def test_rse_factor_forms_agree_with_dense():
    g = np.random.default_rng(0)
    A, B, U, V = g.normal(size=(30, 3)), g.normal(size=(20, 3)), g.normal(size=(30, 4)), g.normal(size=(20, 4))
    dense = np.linalg.norm(A @ B.T - U @ V.T) / np.linalg.norm(U @ V.T)
    assert rse(A @ B.T, U @ V.T) == pytest.approx(dense, rel=1e-12)
    assert rse((A, B), (U, V)) == pytest.approx(dense, rel=1e-10)
    assert rse((A, B), U @ V.T) == pytest.approx(dense, rel=1e-10)
    assert rse(A @ B.T, (U, V)) == pytest.approx(dense, rel=1e-10)
    assert rse(np.zeros((30, 20)), (U, V)) == pytest.approx(1.0)
    with pytest.raises(ShapeError):
        rse(A @ B.T, np.ones((20, 30)))


def test_oracle_rse_formula_and_issue_value():
    # the issue's number: n = 2000, r = 10, p = 0.15, b = 1 gives ~0.115
    n, r, p, b = 2000, 10, 0.15, 1.0
    expected = np.sqrt(2) * b * np.sqrt((2 * n * r - r * r) / p) / (n * np.sqrt(r))
    assert oracle_rse(n, rank=r, p=p, scale=b) == pytest.approx(expected, rel=1e-12)
    assert oracle_rse(n, rank=r, p=p, scale=b) == pytest.approx(0.1153, abs=5e-4)
    assert oracle_rse(n, rank=r, p=p, scale=2 * b) == pytest.approx(2 * expected)
    assert oracle_rse(300, 200, rank=4, p=0.5, scale=1.0) == pytest.approx(
        np.sqrt(2 * 4 * (500 - 4) / 0.5) / np.sqrt(300 * 200 * 4))


def test_oracle_floor_is_met_by_an_oracle_that_knows_the_subspaces():
    # least squares of the r(m+n-r) tangent parameters with known U, V: the floor's own derivation
    m, r, p, b = 60, 3, 0.5, 1.0
    g = np.random.default_rng(4)
    errs = []
    for t in range(20):
        U, V = g.normal(size=(m, r)), g.normal(size=(m, r))
        mask = g.random((m, m)) < p
        i, j = np.nonzero(mask)
        Qu, Qv = np.linalg.qr(U)[0], np.linalg.qr(V)[0]
        # X = Qu A^T + B Qv^T parameterisation (over-complete; lstsq takes the minimum-norm solution)
        design = np.hstack([np.einsum("ta,tb->tab", Qu[i], np.eye(m)[j]).reshape(i.size, -1),
                            np.einsum("ta,tb->tab", np.eye(m)[i], Qv[j]).reshape(i.size, -1)])
        X = U @ V.T
        y = X[i, j] + g.laplace(0, b, i.size)
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        A = coef[: r * m].reshape(r, m).T
        B = coef[r * m:].reshape(m, r)
        errs.append(np.sum((Qu @ A.T + B @ Qv.T - X) ** 2) / np.sum(X**2))
    measured = np.sqrt(np.mean(errs))
    floor = oracle_rse(m, rank=r, p=p, scale=b, signal_power=np.mean([r]))
    assert measured == pytest.approx(floor, rel=0.25)


# --- privacy -----------------------------------------------------------------------------------------

def test_privatize_entry_level_scale_clip_and_variance():
    n = 400
    g = np.random.default_rng(1)
    i, j = np.nonzero(g.random((n, n)) < 0.5)
    vals = g.uniform(-3, 3, i.size)
    observed = sp.csr_matrix((vals, (i, j)), shape=(n, n))
    rel = privatize_observations(observed, epsilon=0.5, bounds=(-1, 1), rng=2)
    assert rel.scale == pytest.approx(4.0) and rel.sensitivity == 2.0 and rel.unit == "entry"
    assert rel.variance == pytest.approx(2 * 4.0**2) and rel.noise_std == pytest.approx(np.sqrt(32))
    assert rel.matrix.nnz == observed.nnz and rel.dropped == 0
    noise = rel.matrix.tocsr()[i, j].A1 - np.clip(vals, -1, 1)
    # empirical variance against 2 b^2 (80k draws: sd of the variance estimate ~ 0.9%)
    assert np.var(noise) == pytest.approx(rel.variance, rel=0.05)
    assert np.mean(noise) == pytest.approx(0, abs=0.1)
    # the Laplace shape: mean |z| = b
    assert np.mean(np.abs(noise)) == pytest.approx(rel.scale, rel=0.03)


def test_brute_force_sensitivity_of_clipped_values():
    lo, hi = -2.0, 5.0
    g = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        a, b = g.uniform(-20, 20, 2)
        worst = max(worst, abs(np.clip(a, lo, hi) - np.clip(b, lo, hi)))
    worst = max(worst, abs(np.clip(-np.inf, lo, hi) - np.clip(np.inf, lo, hi)))
    assert worst == pytest.approx(observation_sensitivity((lo, hi)))
    # user level: k entries of one row each move by at most hi - lo
    k = 3
    row_worst = 0.0
    for _ in range(500):
        x, y = g.uniform(-20, 20, (2, k))
        row_worst = max(row_worst, np.abs(np.clip(x, lo, hi) - np.clip(y, lo, hi)).sum())
    assert row_worst <= observation_sensitivity((lo, hi), k) + 1e-12
    assert row_worst > 0.9 * observation_sensitivity((lo, hi), k)


def test_privatize_user_level_bounds_rows_and_splits_budget():
    observed, _ = synthetic_problem(200, rank=3, p=0.3, rng=5)
    rel = privatize_observations(observed, epsilon=1.0, bounds=(-10, 10), rng=0, max_entries_per_row=4)
    counts = np.diff(rel.matrix.indptr)
    assert counts.max() <= 4 and rel.unit == "row"
    assert rel.scale == pytest.approx(4 * 20 / 1.0) and rel.sensitivity == 80
    assert rel.dropped == observed.nnz - rel.matrix.nnz > 0
    # kept entries are a subset of the observed pattern
    assert (rel.matrix.astype(bool).multiply(observed.astype(bool))).nnz == rel.matrix.nnz
    # rows with <= k observations keep all of them
    small = np.diff(observed.tocsr().indptr) <= 4
    assert np.array_equal(counts[small], np.diff(observed.tocsr().indptr)[small])


def test_privatize_accountant_and_bad_input_before_noise():
    observed, _ = synthetic_problem(30, rank=2, p=0.5, rng=0)
    acc = Accountant(epsilon=1.0)
    privatize_observations(observed, 0.6, (-5, 5), rng=0, accountant=acc)
    with pytest.raises(BudgetExceededError):
        privatize_observations(observed, 0.6, (-5, 5), rng=0, accountant=acc)
    assert acc.spent == pytest.approx(0.6)

    class Boom:
        def laplace(self, *a, **k):  # pragma: no cover - must never be reached
            raise AssertionError("noise drawn")

    for eps, bounds in [(0.0, (0, 1)), (-1, (0, 1)), (np.nan, (0, 1)), (1.0, (1, 1)), (1.0, (2, 1)), (1.0, (0, np.inf))]:
        with pytest.raises(InvalidPrivacyParameterError):
            privatize_observations(observed, eps, bounds, rng=0, accountant=acc)
    bad = observed.copy()
    bad.data[0] = np.nan
    with pytest.raises(NonFiniteInputError):
        privatize_observations(bad, 0.1, (0, 1), accountant=acc)
    with pytest.raises(ShapeError):
        privatize_observations(sp.csr_matrix((5, 5)), 0.1, (0, 1), accountant=acc)
    with pytest.raises(ShapeError):
        privatize_observations(np.ones((5, 5)), 0.1, (0, 1), accountant=acc)
    assert acc.spent == pytest.approx(0.6)  # nothing charged by the failures


# --- methods -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FIXED_RANK))
def test_noiseless_recovery_rank5_100x100_30pct(name, exact_problem):
    observed, truth = exact_problem
    res = FIXED_RANK[name](observed, 5, truth=truth)
    assert res.converged and res.iterations < 500
    assert rse(res, truth) < 1e-3
    # the last recorded RSE is that of the returned estimate (up to rounding: the Gram-matrix RSE cancels
    # at RSE ~ 3e-7, where an r x r rotation of the factors at rounding level moves it by ~1e-3 relative)
    assert res.rse == pytest.approx(rse(res, truth), rel=1e-2)
    assert res.left.shape == (100, 5) and res.right.shape == (100, 5)
    assert len(res.history.residual) == len(res.history.seconds) == len(res.history.rse) == res.iterations
    assert np.all(np.diff(res.history.seconds) >= 0)
    # residual reported only on observed entries
    pat = as_pattern(observed)
    direct = np.linalg.norm(pat.values - res.predict(pat.rows, pat.cols)) / np.linalg.norm(pat.values)
    assert res.residual == pytest.approx(direct, rel=1e-6, abs=1e-12)


def test_dlnm_qr_paper_init_also_recovers(exact_problem):
    observed, truth = exact_problem
    res = dlnm_qr(observed, 5, init="paper", truth=truth)
    assert res.converged and res.rse < 1e-3
    D = res.extra["D"]
    # at convergence the CSVD-QR core is (nearly) diagonal: the singular values of the estimate
    off = D - np.diag(np.diag(D))
    assert np.linalg.norm(off) < 1e-3 * np.linalg.norm(D)
    sv = np.linalg.svd(res.to_dense(), compute_uv=False)[:5]
    np.testing.assert_allclose(np.sort(np.abs(np.diag(D)))[::-1], sv, rtol=1e-3)


def test_column_shrink_is_the_l21_prox():
    g = np.random.default_rng(0)
    T = g.normal(size=(4, 5))
    tau = 1.3
    D = column_shrink(T, tau)
    # brute force: per column, minimise tau ||d|| + 1/2 ||d - t||^2 over a fine radial search
    for j in range(5):
        t = T[:, j]
        radii = np.linspace(0, np.linalg.norm(t), 20001)
        obj = tau * radii + 0.5 * (radii - np.linalg.norm(t)) ** 2
        best = radii[np.argmin(obj)]
        assert np.linalg.norm(D[:, j]) == pytest.approx(best, abs=1e-3)
    assert np.allclose(column_shrink(T, 100.0), 0)


def test_spectral_norm_estimate():
    observed, _ = synthetic_problem(80, rank=3, p=0.4, rng=1)
    assert spectral_norm(as_pattern(observed), iters=30) == pytest.approx(np.linalg.norm(observed.toarray(), 2), rel=1e-2)


def test_sor_random_init_also_recovers(exact_problem):
    observed, truth = exact_problem
    res = lmafit_sor(observed, 5, init="random", truth=truth)
    assert res.converged and res.rse < 1e-3 and res.extra["rejected"] >= 0


def test_sor_rank_adaptation_finds_true_rank(exact_problem):
    observed, truth = exact_problem
    res = lmafit_sor(observed, 9, rank_adaptive=True, truth=truth)
    assert res.extra["rank"] == 5 and res.rse < 1e-3


def test_noisy_fits_near_the_oracle_floor():
    n, r, p, b = 300, 3, 0.3, 1.0
    observed, truth = synthetic_problem(n, rank=r, p=p, noise_scale=b, rng=7)
    floor = oracle_rse(n, rank=r, p=p, scale=b)
    for name, method in FIXED_RANK.items():
        res = method(observed, r, truth=truth)
        assert res.converged, name
        assert floor * 0.8 < res.rse < floor * 1.25, (name, res.rse, floor)
        # stopped on convergence well before the cap, and the RSE reached 5% of final early
        assert res.iterations < 200
        assert res.history.seconds_to_within(0.05) <= res.seconds


def test_soft_impute_never_worse_than_zero_at_high_noise():
    n, r, p = 200, 3, 0.2
    for b in (5.0, 20.0):
        observed, truth = synthetic_problem(n, rank=r, p=p, noise_scale=b, rng=11)
        assert oracle_rse(n, rank=r, p=p, scale=b) > 1.0
        fixed = lmafit_sor(observed, r, truth=truth)
        soft = soft_impute(observed, 10, noise_std=np.sqrt(2) * b, truth=truth)
        assert fixed.rse > 1.0  # the fixed-rank fit is worse than releasing zeros
        assert soft.rse <= 1.0 + 1e-9, (b, soft.rse)
    # pure-noise regime over many seeds: exactly the zero matrix or better
    for seed in range(8):
        observed, truth = synthetic_problem(120, 100, rank=2, p=0.25, noise_scale=20.0, rng=100 + seed)
        soft = soft_impute(observed, 6, noise_std=np.sqrt(2) * 20.0, truth=truth)
        assert soft.rse <= 1.0 + 1e-9, (seed, soft.rse)
    # at low noise it still recovers the signal
    observed, truth = synthetic_problem(n, rank=r, p=0.4, noise_scale=0.1, rng=12)
    soft = soft_impute(observed, 10, noise_std=np.sqrt(2) * 0.1, truth=truth)
    assert soft.rse < 0.1 and soft.extra["rank"] >= r


def test_soft_impute_reads_noise_from_private_release():
    observed, truth = synthetic_problem(150, rank=2, p=0.3, rng=2)
    rel = privatize_observations(observed, epsilon=2.0, bounds=(-10, 10), rng=3)
    res = soft_impute(rel, 8, truth=truth)
    analytic = noise_threshold((150, 150), rel.matrix.nnz / 150**2, rel.noise_std)
    direct = sampled_noise_norm(as_pattern(rel), rel.noise_std, rng=0)
    assert res.extra["lam"] == pytest.approx(1.1 * max(analytic, direct))
    # the direct estimate of ||P_Omega(noise)||_2 is close to the asymptotic value at this size
    assert 0.8 < direct / analytic < 1.3
    assert res.rse <= 1.0
    with pytest.raises(ShapeError):
        soft_impute(observed, 8)


@pytest.mark.parametrize("name", sorted(METHODS))
def test_bad_input_raises(name):
    method = METHODS[name]
    observed, _ = synthetic_problem(20, 15, rank=2, p=0.5, rng=0)
    kw = {"lam": 1.0} if name == "soft" else {}
    with pytest.raises(ShapeError):
        method(observed, 15, **kw)  # rank >= min(m, n)
    with pytest.raises(ShapeError):
        method(observed, 0, **kw)
    with pytest.raises(ShapeError):
        method(sp.csr_matrix((20, 15)), 2, **kw)  # nothing observed
    with pytest.raises(ShapeError):
        method(observed.toarray(), 2, **kw)  # not sparse
    bad = observed.copy()
    bad.data[3] = np.inf
    with pytest.raises(NonFiniteInputError):
        method(bad, 2, **kw)
    dup = sp.coo_matrix((np.array([1.0, 2.0, 3.0]), (np.array([0, 0, 1]), np.array([0, 0, 1]))), shape=(20, 15))
    with pytest.raises(ShapeError):
        method(dup, 2, **kw)
    with pytest.raises(ShapeError):
        method(observed, 2, max_iter=0, **kw)


def test_am_map_ridge_shrinks_more_under_heavy_noise():
    observed, truth = synthetic_problem(200, rank=4, p=0.15, noise_scale=2.0, rng=4)
    plain = alternating_minimization(observed, 4, truth=truth)
    map_ = alternating_minimization(observed, 4, noise_std=np.sqrt(2) * 2.0, truth=truth)
    assert map_.extra["lam"] > 100 * plain.extra["lam"]
    assert map_.rse < plain.rse
    assert np.linalg.norm(map_.left) * np.linalg.norm(map_.right) < np.linalg.norm(plain.left) * np.linalg.norm(plain.right)


def test_monitor_stops_when_estimate_stays_zero():
    observed, truth = synthetic_problem(100, rank=2, p=0.2, noise_scale=50.0, rng=1)
    res = soft_impute(observed, 5, noise_std=np.sqrt(2) * 50.0, truth=truth)
    assert res.converged and res.iterations < 20 and res.rse == pytest.approx(1.0)


def test_pattern_same_from_coo_and_canonical_csr():
    M = sp.random(50, 40, density=0.3, format="coo", random_state=0)
    a, b = as_pattern(M), as_pattern(M.tocsr())
    for field in ("indptr", "indices", "rows", "values"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    X = np.random.default_rng(0).normal(size=(50, 3)), np.random.default_rng(1).normal(size=(40, 3))
    dense = X[0] @ X[1].T
    np.testing.assert_allclose(a.sampled(*X), dense[a.rows, a.indices], rtol=1e-12)
    sparse = as_pattern(sp.random(300, 400, density=0.01, format="csr", random_state=1))  # gather path
    Y = np.random.default_rng(2).normal(size=(300, 3)), np.random.default_rng(3).normal(size=(400, 3))
    np.testing.assert_allclose(sparse.sampled(*Y), (Y[0] @ Y[1].T)[sparse.rows, sparse.indices], rtol=1e-12)


def test_default_rho_and_no_overflow_over_long_runs():
    from sparsedp.completion.dlnm_qr import default_rho

    assert default_rho(0.01) == 1.2 and default_rho(0.15) == pytest.approx(1 / 0.7) and default_rho(0.5) == 5.0
    # an over-parameterised noisy fit that never settles, rho = 5 for 700 iterations: mu = 5^700 would
    # overflow (NaN through Y / mu); 1/mu and Y/mu are tracked instead
    observed, truth = synthetic_problem(60, rank=2, p=0.5, noise_scale=2.0, rng=0)
    res = dlnm_qr(observed, 6, relax="paper", rho=5.0, tol=1e-300, abs_tol=1e-300, max_iter=700, truth=truth)
    assert res.iterations == 700 and not res.converged and res.extra["mu"] == np.inf
    assert np.all(np.isfinite(res.left)) and np.all(np.isfinite(res.right)) and np.isfinite(res.rse)
    capped = dlnm_qr(observed, 2, relax="paper", rho=1.5, mu_max=1e3, truth=truth, max_iter=50)
    assert np.isfinite(capped.extra["mu"]) and capped.extra["mu"] <= 1e3 * (1 + 1e-12)


@pytest.mark.parametrize("name", sorted(FIXED_RANK))
def test_rectangular_and_private_release_input(name):
    observed, truth = synthetic_problem(80, 130, rank=3, p=0.4, rng=9)
    res = FIXED_RANK[name](observed, 3, truth=truth)
    assert res.shape == (80, 130) and res.rse < 1e-3
    rel = privatize_observations(observed, epsilon=200.0, bounds=(-12, 12), rng=0)  # b = 0.12
    noisy = FIXED_RANK[name](rel, 3, truth=truth)
    floor = oracle_rse(80, 130, rank=3, p=0.4, scale=rel.scale)
    assert noisy.converged and noisy.rse < 1.5 * floor
