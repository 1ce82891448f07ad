"""The Gaussian optimum of the factorization mechanism and the certified lower bounds (issue 29)."""

import math

import numpy as np
import pytest
import scipy.linalg as sla
from _mechanism_draws import mechanism_answers
from scipy.optimize import minimize

import sparsedp
from sparsedp import operators as ops
from sparsedp import workloads as wl
from sparsedp.errors import SparseDPError
from sparsedp.marginals import KronOperator
from sparsedp.optimize import optimize
from sparsedp.optimize.bounds import gaussian_dual, lower_bound, optimality_gap, svd_bound, svd_bound_raw
from sparsedp.optimize.calibrate import noise_model, unit_variance
from sparsedp.optimize.gaussian_convex import (
    GaussianCandidate,
    cell_atoms,
    dense_gram,
    dual_start,
    gaussian_candidates,
    integer_strategy,
    solve_gaussian,
)
from sparsedp.optimize.gram import Gram
from sparsedp.optimize.pidentity import dense_trace
from sparsedp.optimize.search import Deadline

GAUSS = noise_model("gaussian")


def _random_ranges(n, m, seed=0):
    r = np.sort(np.random.default_rng(seed).integers(0, n, size=(m, 2)), axis=1)
    return wl.range_queries(n, r)


def _union(n):
    return wl.weighted_union([(1 / (n * (n + 1) / 2), wl.all_ranges(n)), (1 / n, wl.prefix(n)),
                              (1 / n, wl.identity(n)), (0.9, wl.total(n))])


def _workloads(n):
    k = int(round(math.sqrt(n)))
    return {
        "prefix": wl.prefix(n),
        "all_ranges": wl.all_ranges(n),
        "random": _random_ranges(n, n),
        "random_few": _random_ranges(n, n // 3, seed=3),
        "union": _union(n),
        "2d": ops.kron(wl.all_ranges(k), wl.all_ranges(k)),
    }


def _primal_error(G, X):
    """tr(G X^-1) with X's columns normalised (the feasible point of X's direction), independently."""
    d = np.sqrt(np.diag(X))
    Xn = X / np.outer(d, d)
    return float(np.trace(sla.solve(Xn, G, assume_a="pos")))


# -- duality, optimality ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["prefix", "all_ranges", "random", "random_few", "union", "2d"])
def test_dual_never_exceeds_primal(name):
    W = _workloads(36)[name]
    G = dense_gram(Gram(W))
    sol = solve_gaussian(G, tol=1e-8, max_iter=300)
    best_dual = max(d for d, _ in sol.history)
    assert sol.dual_raw == best_dual
    # every dual value is below every primal value, and the returned primal is the best
    assert all(d <= sol.primal_raw for d, _ in sol.history)
    assert sol.primal_raw == pytest.approx(min(p for _, p in sol.history), rel=1e-12)
    assert 1.0 <= sol.gap < 1.001
    # the continuous strategy: columns of norm at most 1, error = primal (recomputed by a dense solve)
    M = sol.strategy()
    assert np.sqrt((M * M).sum(axis=0)).max() <= 1.0 + 1e-9
    assert np.trace(sla.solve(M.T @ M, G, assume_a="pos")) == pytest.approx(sol.primal_raw, rel=1e-6)


def test_bound_matches_independent_solves_on_tiny_problems():
    rng = np.random.default_rng(5)
    for n in (4, 6):
        A = rng.standard_normal((n + 2, n))
        G = A.T @ A
        sol = solve_gaussian(G, tol=1e-10, max_iter=500)

        # primal, independently: minimise tr(G X^-1) over X = M^T M with unit columns (BFGS, numeric gradient)
        def primal(v):
            M = v.reshape(n, n)
            X = M.T @ M + 1e-12 * np.eye(n)
            return _primal_error(G, X)

        best = min(minimize(primal, (np.eye(n) + 0.1 * rng.standard_normal((n, n))).ravel(), method="BFGS",
                            options={"gtol": 1e-10, "maxiter": 5000}).fun for _ in range(3))

        # dual, independently: maximise 2 tr((L^1/2 G L^1/2)^1/2) - sum L over log L (Nelder-Mead + BFGS)
        def neg_dual(u):
            L = np.exp(u)
            q = np.sqrt(L)
            lam = np.linalg.eigvalsh(q[:, None] * G * q[None, :])
            return -(2.0 * np.sum(np.sqrt(np.maximum(lam, 0.0))) - L.sum())

        dual = -minimize(neg_dual, np.log(np.diag(G)), method="BFGS", options={"gtol": 1e-10}).fun
        assert dual == pytest.approx(best, rel=1e-6)  # strong duality, two independent solves
        assert sol.dual_raw <= best * (1 + 1e-9)
        assert sol.dual_raw == pytest.approx(best, rel=1e-7)
        assert sol.primal_raw == pytest.approx(best, rel=1e-7)


def test_kkt_conditions_at_the_optimum():
    G = dense_gram(Gram(wl.all_ranges(48)))
    sol = solve_gaussian(G, tol=1e-10, max_iter=500)
    X = sol.strategy().T @ sol.strategy()
    np.testing.assert_allclose(np.diag(X), 1.0, atol=1e-6)  # the constraint is active everywhere
    # X = L^-1/2 (L^1/2 G L^1/2)^1/2 L^-1/2 at the returned dual point (computed independently)
    q = np.sqrt(sol.L)
    S = sla.sqrtm(q[:, None] * G * q[None, :]).real
    XL = S / np.outer(q, q)
    np.testing.assert_allclose(np.diag(XL), 1.0, atol=1e-5)
    np.testing.assert_allclose(XL, X, atol=1e-5)
    # and the dual value g(L) = 2 tr S - sum L = tr S = sum L equals the primal
    assert 2 * np.trace(S) - sol.L.sum() == pytest.approx(sol.primal_raw, rel=1e-8)


def test_issue_29_figures_at_rho_one_half():
    # issue 29 reports the optimum at variance Delta_2^2 (rho = 1/2): tr(G X^-1) itself
    pre = gaussian_dual(wl.prefix(256), tol=1e-7)
    ar = gaussian_dual(wl.all_ranges(256), tol=1e-7)
    assert pre.dual_raw == pytest.approx(1631.4, abs=0.05)
    assert ar.dual_raw == pytest.approx(2.7693e5, rel=5e-5)
    # sparsedp's normalisation (rho = 1) is half that
    assert pre.bound == pytest.approx(pre.dual_raw / 2)
    # the SVD bounds of the issue's table, in closed form
    assert svd_bound_raw(wl.prefix(256)) == pytest.approx(1563.66, abs=0.01)
    assert svd_bound_raw(wl.all_ranges(256)) == pytest.approx(2.7216e5, rel=5e-5)


def test_svd_bound_closed_forms_match_dense_and_stay_below_the_dual():
    for W in (wl.prefix(40), wl.all_ranges(40)):
        lam = np.linalg.eigvalsh(dense_gram(Gram(W)))
        dense = np.sum(np.sqrt(np.maximum(lam, 0))) ** 2 / 40
        assert svd_bound_raw(W) == pytest.approx(dense, rel=1e-10)
        assert svd_bound_raw(W) <= gaussian_dual(W).dual_raw
    assert svd_bound(wl.prefix(2**20), "gaussian") > 0  # O(n) at any n
    assert lower_bound(wl.all_ranges(2**16)) == pytest.approx(svd_bound(wl.all_ranges(2**16)))


# -- the bound against every existing family --------------------------------------------------------


@pytest.mark.parametrize("noise", ["gaussian", "laplace"])
@pytest.mark.parametrize("n", [32, 64])
def test_no_strategy_of_the_existing_families_beats_the_bound(noise, n):
    Ws = {"prefix": wl.prefix(n), "all_ranges": wl.all_ranges(n), "random": _random_ranges(n, n, 1),
          "union": _union(n)}
    for name, W in Ws.items():
        lb = lower_bound(W, noise)
        for family in ("templates", "tree", "pidentity"):
            res = optimize(W, noise=noise, family=family, rng=0)
            assert {t.family for t in res.history} == {family}
            for t in res.history:  # every strategy tried, not only the winner
                assert t.error >= lb, (name, t.family, t.name, t.error, lb)
            assert optimality_gap(res, W) >= 1.0
    # Laplace: Delta_1 >= Delta_2 and Var = 2 Delta_1^2 (eps = 1) against Delta_2^2 / 2 (rho = 1)
    W = wl.prefix(n)
    assert lower_bound(W, "laplace") == pytest.approx(4 * lower_bound(W, "gaussian"), rel=1e-12)


def test_kron_bound_is_the_product_of_the_factors():
    W1, W2 = wl.all_ranges(6), wl.prefix(5)
    K = KronOperator([W1.tosparse(), W2.tosparse()])
    flat = ops.kron(W1, W2)
    lb = lower_bound(K)
    assert lb == pytest.approx(0.5 * gaussian_dual(W1).dual_raw * gaussian_dual(W2).dual_raw, rel=1e-12)
    # the product of the 1-D optima is optimal: the dense bound of the flattened workload agrees
    assert lb == pytest.approx(lower_bound(flat), rel=1e-6)
    assert lb <= lower_bound(flat) * (1 + 1e-9)


# -- merged cells, integer strategies, the family -------------------------------------------------


def test_cell_atoms_merge_identical_columns_only():
    W = wl.range_queries(10, [(0, 3), (2, 5), (7, 7)])  # cells 8, 9 untouched
    labels, reps = cell_atoms(dense_gram(Gram(W)))
    assert labels.tolist() == [0, 0, 1, 1, 2, 2, -1, 3, -1, -1]
    assert reps.tolist() == [0, 2, 4, 7]
    sol = solve_gaussian(Gram(W), tol=1e-9)
    assert sol.labels is not None and sol.L.shape == (10,) and np.all(sol.L[labels < 0] == 0)
    M = sol.strategy()
    assert M.shape == (10, 10) and np.linalg.matrix_rank(M) == 10
    assert np.sqrt((M * M).sum(axis=0)).max() <= 1 + 1e-12
    G = dense_gram(Gram(W))
    assert np.trace(sla.solve(M.T @ M, G, assume_a="pos")) == pytest.approx(sol.primal_raw, rel=1e-6)
    # merging changes neither the bound nor the optimum
    plain = solve_gaussian(Gram(W), tol=1e-9, merge=False)
    assert plain.labels is None
    assert sol.dual_raw == pytest.approx(plain.dual_raw, rel=1e-6)


@pytest.mark.parametrize("name", ["prefix", "all_ranges", "random", "random_few", "union", "2d"])
def test_integer_strategy_within_one_percent(name):
    W = _workloads(100)[name]
    gram = Gram(W)
    (cand,) = gaussian_candidates(W, gram, GAUSS)
    assert isinstance(cand, GaussianCandidate) and cand.family == "gaussian"
    B = cand.strategy.tosparse().toarray()
    assert np.all(B == np.round(B))
    assert (B * B).sum(axis=0).max() <= 4.0**16  # Delta_2 <= 2^16, exact integer sums
    assert unit_variance(cand.strategy, GAUSS) == pytest.approx(0.5 * 4.0**16)
    # the reported error is the integer matrix's own, exactly (dense QR here, an independent solve)
    exact = 0.5 * 4.0**16 * np.trace(sla.solve(B.T @ B, dense_gram(gram), assume_a="pos"))
    assert cand.total == pytest.approx(exact, rel=1e-6)
    assert cand.lower_bound <= cand.continuous <= cand.total <= 1.01 * cand.continuous
    assert cand.gap <= 1.01
    # the mechanism's own expected error agrees
    mech = sparsedp.MatrixMechanism(W, cand.strategy, rho=1.0, noise="gaussian", secure=False)
    assert mech.expected_error() == pytest.approx(cand.total, rel=1e-6)


def test_integer_strategy_rounds_within_the_sensitivity():
    M = np.random.default_rng(0).standard_normal((7, 5))
    M /= np.sqrt((M * M).sum(axis=0))
    B = integer_strategy(M, GAUSS)
    assert (B * B).sum(axis=0).max() <= 4.0**16 and np.abs(B - M * 2**16).max() <= 1.0
    B = integer_strategy(M, GAUSS, top=1000.0)
    assert (B * B).sum(axis=0).max() <= 1000.0
    with pytest.raises(SparseDPError):
        integer_strategy(M, noise_model("laplace"))


def test_family_returns_nothing_for_laplace_or_large_n():
    W = wl.prefix(16)
    assert gaussian_candidates(W, Gram(W), noise_model("laplace")) == []
    assert gaussian_candidates(W, Gram(W), GAUSS, max_n=8) == []
    assert lower_bound(W) <= optimize(W, noise="gaussian").error.total


@pytest.mark.parametrize("W", [wl.prefix(24), _random_ranges(24, 8, seed=2)], ids=["prefix", "merged"])
def test_exact_noise_mechanism_measures_the_reported_error(W):
    (cand,) = gaussian_candidates(W, Gram(W), GAUSS)
    rho = 0.5
    mech = sparsedp.MatrixMechanism(W, cand.strategy, rho=rho, noise="gaussian")  # exact discrete noise
    assert mech.expected_error() == pytest.approx(cand.total / rho, rel=1e-6)
    x = np.random.default_rng(0).integers(0, 40, W.shape[1])
    truth = W.matvec(x)
    errs = np.sum((mechanism_answers(mech, x, 2000, 2029) - truth) ** 2, axis=1)
    assert np.mean(errs) == pytest.approx(cand.total / rho, rel=0.10)


# -- solver behaviour -------------------------------------------------------------------------------


def test_deadline_and_warm_start():
    W = _random_ranges(200, 200)
    G = dense_gram(Gram(W))
    quick = solve_gaussian(G, max_iter=100, deadline=Deadline(0.0), polish=False)
    assert quick.iterations == 1 and quick.stopped == "time limit"
    full = solve_gaussian(G, tol=1e-7, max_iter=400)
    assert quick.dual_raw <= full.dual_raw <= full.primal_raw <= quick.primal_raw
    # warm start from the solution's L: converged at once
    warm = solve_gaussian(G, L0=full.L, tol=1e-5)
    assert warm.iterations <= 2 and warm.gap <= 1 + 1e-5
    # ... or from any strategy's X (stationarity), e.g. the identity's: a valid start
    L0 = dual_start(G, np.eye(200))
    assert solve_gaussian(G, L0=L0, max_iter=3).dual_raw <= full.primal_raw
    with pytest.raises(SparseDPError):
        solve_gaussian(G, L0=np.ones(3))


def test_polish_only_improves_and_the_dense_score_agrees():
    W = _random_ranges(120, 40, seed=4)
    gram = Gram(W)
    rough = solve_gaussian(gram, max_iter=2, polish=False)
    polished = solve_gaussian(gram, max_iter=2, polish=True)
    assert polished.dual_raw == rough.dual_raw
    assert polished.primal_raw <= rough.primal_raw
    M = polished.strategy()
    assert dense_trace(M, gram) == pytest.approx(polished.primal_raw, rel=1e-6)


def test_dense_gram_paths_agree_with_the_gram_products():
    rng = np.random.default_rng(7)
    sparse_w = ops.kron(wl.all_ranges(5), wl.prefix(4))  # more non-zeros than n^2: Gram holds a dense G
    few = sparsedp.operators.SparseOperator(rng.integers(0, 2, size=(30, 20)).astype(float))  # kind "sparse"
    for W in (wl.prefix(20), _union(20), _random_ranges(20, 9), sparse_w, few):
        gram = Gram(W)
        n = gram.n
        np.testing.assert_allclose(dense_gram(gram), gram.matmat(np.eye(n)), rtol=1e-12, atol=1e-12)
    B = rng.standard_normal((20, 20))
    G = dense_gram(Gram(few))
    from sparsedp.optimize.gaussian_convex import dense_score
    assert dense_score(B, G) == pytest.approx(dense_trace(B, Gram(few)), rel=1e-10)


def test_optimize_auto_under_gaussian_noise_returns_the_certified_optimum():
    from sparsedp import workloads as wl
    from sparsedp.errors import SparseDPError
    from sparsedp.optimize import optimize

    for W in (wl.prefix(64), wl.all_ranges(48)):
        res = optimize(W, noise="gaussian")
        assert res.family == "gaussian"
        assert res.lower_bound is not None and 1.0 <= res.gap <= 1.01
        assert all(res.error.total <= t.error * (1 + 1e-12) for t in res.history)
        half = optimize(W, noise="gaussian", rho=0.5)  # the bound scales with the budget
        assert half.lower_bound == pytest.approx(2 * res.lower_bound, rel=1e-12)
    with pytest.raises(SparseDPError, match="Gaussian noise"):
        optimize(wl.prefix(16), family="gaussian")
    lap = optimize(wl.prefix(16))  # Laplace, small n: a bound too (4x the Gaussian dual)
    assert lap.lower_bound is not None and lap.gap >= 1.0
    flo = optimize(wl.prefix(16), secure=False)  # continuous noise: no candidate beats the bound
    assert flo.lower_bound == pytest.approx(lap.lower_bound, rel=1e-9)
    assert all(t.error >= flo.lower_bound * (1 - 1e-9) for t in flo.history)
