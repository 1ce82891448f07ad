"""Noise-calibrated shrinkage, the exact oracle, the relaxed DLNM-QR and the secure release."""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import InvalidPrivacyParameterError, NonFiniteInputError, ShapeError
from sparsedp.completion import (
    METHODS,
    alternating_minimization,
    dlnm_qr,
    lmafit_sor,
    oracle_rse,
    privatize_observations,
    rse,
    soft_impute,
    synthetic_problem,
)
from sparsedp.completion._observed import as_pattern
from sparsedp.completion.oracle import oracle_least_squares
from sparsedp.completion.shrinkage import calibrated_lambda, signal_scale, thin_svd
from sparsedp.noise import discrete_laplace_variance

FIXED_RANK = {"dlnm-qr": dlnm_qr, "sor": lmafit_sor, "am": alternating_minimization}


@pytest.fixture(scope="module")
def undersampled():
    # |Omega| / df = 3375 / 1475 = 2.3: least squares overfits (as n = 200 in the benchmark)
    n, r, p, b = 150, 5, 0.15, 1.0
    observed, truth = synthetic_problem(n, rank=r, p=p, noise_scale=b, rng=21)
    return observed, truth, r, np.sqrt(2) * b, oracle_least_squares(observed, truth)


# --- the exact oracle ---------------------------------------------------------------------------------

def test_oracle_least_squares_matches_dense_lstsq():
    m, n, r = 40, 30, 2
    observed, (U, V) = synthetic_problem(m, n, rank=r, p=0.5, noise_scale=0.5, rng=3)
    fit = oracle_least_squares(observed, (U, V))
    assert fit.istop in (1, 2)
    Qu, Qv = np.linalg.qr(U)[0], np.linalg.qr(V)[0]
    i, j = observed.nonzero()
    y = np.asarray(observed.tocsr()[i, j]).ravel()
    design = np.hstack([np.einsum("ta,tb->tab", Qu[i], np.eye(n)[j]).reshape(i.size, -1),
                        np.einsum("ta,tb->tab", np.eye(m)[i], Qv[j]).reshape(i.size, -1)])
    coef = np.linalg.lstsq(design, y, rcond=None)[0]
    Z = Qu @ coef[: r * n].reshape(r, n) + coef[r * n:].reshape(m, r) @ Qv.T
    np.testing.assert_allclose(fit.left @ fit.right.T, Z, atol=1e-6)
    assert fit.rse == pytest.approx(np.linalg.norm(Z - U @ V.T) / np.linalg.norm(U @ V.T), rel=1e-6)
    # a dense truth gives the same subspaces and the same fit
    dense = oracle_least_squares(observed, U @ V.T, rank=r)
    assert dense.rse == pytest.approx(fit.rse, rel=1e-6)
    with pytest.raises(ShapeError):
        oracle_least_squares(observed, U @ V.T)  # dense truth needs rank=


def test_exact_oracle_exceeds_the_asymptotic_floor_when_undersampled():
    # the inverse-Wishart factor: error^2 larger by about |Omega| / (|Omega| - df)
    n, r, p = 120, 4, 0.2
    ratios, predicted = [], []
    for seed in range(4):
        observed, truth = synthetic_problem(n, rank=r, p=p, noise_scale=1.0, rng=seed)
        ratios.append(oracle_least_squares(observed, truth).rse / oracle_rse(n, rank=r, p=p, scale=1.0))
        mo, df = observed.nnz, r * (2 * n - r)
        predicted.append(math.sqrt(mo / (mo - df)))
    assert np.mean(ratios) > 1.1
    assert np.mean(ratios) == pytest.approx(np.mean(predicted), rel=0.12)


# --- calibration ---------------------------------------------------------------------------------------

def test_calibrated_lambda_formula_and_signal_scale():
    n, r, b = 400, 4, 0.5
    observed, _ = synthetic_problem(n, rank=r, p=0.3, noise_scale=b, rng=2)
    pat = as_pattern(observed)
    sigma = np.sqrt(2) * b
    # X = U V^T with standard normal factors: mean square r, so s_typ = sqrt(n^2 r / r) = n
    assert signal_scale(pat, sigma, r) == pytest.approx(n, rel=0.05)
    expected = 0.5 * sigma**2 * (2 * np.sqrt(n)) ** 2 / signal_scale(pat, sigma, r)
    assert calibrated_lambda(pat, sigma, r) == pytest.approx(expected, rel=1e-12)
    # no signal above the published noise: infinite threshold (the zero matrix)
    g = np.random.default_rng(0)
    i, j = np.nonzero(g.random((50, 40)) < 0.5)
    noise_only = as_pattern(sp.csr_matrix((g.normal(0, 1.0, i.size), (i, j)), shape=(50, 40)))
    assert calibrated_lambda(noise_only, 1.5, 2) == math.inf


@pytest.mark.parametrize("name", sorted(FIXED_RANK))
def test_noise_aware_mode_reaches_the_exact_oracle_where_least_squares_overfits(name, undersampled):
    observed, truth, r, sigma, oracle = undersampled
    plain = FIXED_RANK[name](observed, r, truth=truth)
    shrunk = FIXED_RANK[name](observed, r, truth=truth, noise_std=sigma)
    assert shrunk.converged and shrunk.extra["lam"] > 0 and plain.extra["lam"] < 1e-3 * shrunk.extra["lam"]
    assert plain.rse > 1.15 * oracle.rse  # least squares misses the target here
    assert shrunk.rse <= oracle.rse  # the calibrated shrinkage meets (beats) the known-subspace oracle


def test_all_methods_solve_the_same_penalised_problem(undersampled):
    observed, truth, r, sigma, _ = undersampled
    fits = {name: f(observed, r, truth=truth, noise_std=sigma, tol=1e-7, max_iter=3000) for name, f in FIXED_RANK.items()}
    fits["soft"] = soft_impute(observed, r, lam="calibrated", noise_std=sigma, truth=truth, tol=1e-7, max_iter=3000)
    lam = fits["sor"].extra["lam"]
    pat = as_pattern(observed)
    for name, fit in fits.items():
        assert fit.extra["lam"] == pytest.approx(lam, rel=1e-12), name
        # optimality of 1/2 ||P(M - Z)||^2 + lam ||Z||_* (rank <= r): U^T R V = lam I on the kept components
        U, s, V = thin_svd(fit.left, fit.right)
        R = pat.matrix(pat.values - fit.predict(pat.rows, pat.cols))
        kept = s > 1e-8 * s[0]
        G = U[:, kept].T @ (R @ V[:, kept])
        np.testing.assert_allclose(G, lam * np.eye(int(kept.sum())), atol=2e-3 * lam, err_msg=name)
    for name, fit in fits.items():
        assert rse(fit, fits["sor"]) < 2e-3, name


@pytest.mark.parametrize("name", sorted(FIXED_RANK))
def test_noise_aware_mode_is_never_worse_than_zero_at_high_noise(name):
    n, r, p, b = 200, 3, 0.2, 20.0
    observed, truth = synthetic_problem(n, rank=r, p=p, noise_scale=b, rng=11)
    plain = FIXED_RANK[name](observed, r, truth=truth, max_iter=100)
    shrunk = FIXED_RANK[name](observed, r, truth=truth, noise_std=np.sqrt(2) * b)
    assert plain.rse > 1.0
    assert shrunk.rse <= 1.0 + 1e-9 and shrunk.converged and shrunk.iterations < 50


@pytest.mark.parametrize("name", sorted(FIXED_RANK))
def test_private_release_input_switches_the_noise_aware_mode_on(name):
    observed, truth = synthetic_problem(120, rank=3, p=0.3, rng=4)
    rel = privatize_observations(observed, epsilon=10.0, bounds=(-10, 10), rng=1)
    from_release = FIXED_RANK[name](rel, 3, truth=truth)
    explicit = FIXED_RANK[name](rel.matrix, 3, truth=truth, noise_std=rel.noise_std)
    assert from_release.extra["lam"] == pytest.approx(explicit.extra["lam"]) and from_release.extra["lam"] > 0
    assert from_release.rse == pytest.approx(explicit.rse, rel=1e-9)


# --- relaxed DLNM-QR -----------------------------------------------------------------------------------

def test_relaxed_dlnm_qr_agrees_with_the_paper_iteration_in_fewer_sweeps():
    observed, truth = synthetic_problem(400, rank=5, p=0.2, noise_scale=1.0, rng=6)
    sigma = np.sqrt(2)
    fast = dlnm_qr(observed, 5, truth=truth, noise_std=sigma)
    paper = dlnm_qr(observed, 5, truth=truth, noise_std=sigma, relax="paper")
    assert fast.converged and paper.converged
    assert fast.rse == pytest.approx(paper.rse, rel=2e-3)
    assert fast.iterations < paper.iterations
    D = fast.extra["D"]
    assert np.count_nonzero(D - np.diag(np.diag(D))) == 0  # the core is diagonal: ||D||_{2,1} = ||X||_*
    # SOR and the relaxed DLNM-QR converge to the same least-squares point in a similar number of steps
    ls_d, ls_s = dlnm_qr(observed, 5, truth=truth), lmafit_sor(observed, 5, truth=truth)
    assert ls_d.rse == pytest.approx(ls_s.rse, rel=1e-3)
    assert ls_d.iterations <= ls_s.iterations + 2


def test_relaxation_arguments_are_validated():
    observed, _ = synthetic_problem(30, rank=2, p=0.5, rng=0)
    with pytest.raises(ShapeError):
        dlnm_qr(observed, 2, relax="fast")
    for kw in ({"w0": 0.0}, {"w_max": -1.0}):
        with pytest.raises(InvalidPrivacyParameterError):  # check_positive's error type
            dlnm_qr(observed, 2, **kw)
    with pytest.raises(InvalidPrivacyParameterError):
        lmafit_sor(observed, 2, w0=-2.0)
    with pytest.raises(ShapeError):
        dlnm_qr(observed, 2, relax="paper", noise_std=1.0, mu_max=1e3)
    with pytest.raises(ShapeError):
        soft_impute(observed, 2, lam="oracle", noise_std=1.0)
    with pytest.raises(ShapeError):
        soft_impute(observed, 2, lam="calibrated")  # no noise level


# --- secure release ------------------------------------------------------------------------------------

def test_secure_release_grid_calibration_and_variance():
    n = 300
    g = np.random.default_rng(5)
    i, j = np.nonzero(g.random((n, n)) < 0.5)
    vals = g.uniform(-4, 4, i.size)
    observed = sp.csr_matrix((vals, (i, j)), shape=(n, n))
    rel = privatize_observations(observed, epsilon=0.5, bounds=(-3, 3), rng=2, secure=True)
    gamma = 6 / 1024
    assert rel.secure and rel.grid == pytest.approx(gamma)
    assert rel.sensitivity == pytest.approx(6.0) and rel.scale == pytest.approx(12.0)
    # released values lie on the grid
    assert np.allclose(rel.matrix.data / gamma, np.rint(rel.matrix.data / gamma), atol=1e-9)
    noise = np.asarray(rel.matrix.tocsr()[i, j]).ravel() - gamma * np.rint(np.clip(vals, -3, 3) / gamma)
    # exact discrete Laplace of t = 1024 / 0.5 grid units: variance gamma^2 2q/(1-q)^2, ~45k draws
    assert rel.variance == pytest.approx(gamma**2 * discrete_laplace_variance(2048.0))
    assert rel.variance == pytest.approx(2 * 12.0**2, rel=1e-3)
    assert np.var(noise) == pytest.approx(rel.variance, rel=0.05)
    assert np.mean(np.abs(noise)) == pytest.approx(12.0, rel=0.03)
    # user level: k entries per row, k times the grid sensitivity
    user = privatize_observations(observed, epsilon=1.0, bounds=(-3, 3), rng=2, secure=True, grid=0.5,
                                  max_entries_per_row=3)
    assert user.sensitivity == pytest.approx(3 * 6.0) and user.scale == pytest.approx(18.0)
    assert np.diff(user.matrix.indptr).max() <= 3


def test_secure_release_brute_force_grid_sensitivity_and_bad_grid():
    lo, hi, gamma = -2.3, 4.1, 0.7
    from sparsedp.noise import snap_to_grid

    worst = max(abs(int(snap_to_grid(np.clip(a, lo, hi), gamma)) - int(snap_to_grid(np.clip(b, lo, hi), gamma)))
                for a, b in np.random.default_rng(0).uniform(-10, 10, (3000, 2)))
    rel = privatize_observations(synthetic_problem(20, rank=2, p=0.5, rng=0)[0], 1.0, (lo, hi), rng=0,
                                 secure=True, grid=gamma)
    assert worst * gamma == pytest.approx(rel.sensitivity)
    observed, _ = synthetic_problem(20, rank=2, p=0.5, rng=0)
    with pytest.raises(InvalidPrivacyParameterError):
        privatize_observations(observed, 1.0, (0, 1), secure=True, grid=5.0)  # coarser than the bounds
    with pytest.raises(InvalidPrivacyParameterError):
        privatize_observations(observed, 1.0, (0, 1), secure=True, grid=-1.0)
    bad = observed.copy()
    bad.data[0] = np.nan
    with pytest.raises(NonFiniteInputError):
        privatize_observations(bad, 1.0, (0, 1), secure=True)


def test_methods_table_unchanged():
    assert set(METHODS) == {"dlnm-qr", "sor", "am", "soft"}
