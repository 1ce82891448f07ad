"""Counters from optimised strategies (issue 11): sensitivity by brute force, the release equals the
batch GLS of the same noise, empirical variance against the formula, offsets independent of an
adaptive stream, exact noise by default, bad input refused before any noise or charge."""

import numpy as np
import pytest
import scipy.sparse as sp
from _counter_draws import counter_releases

from sparsedp import BudgetExceededError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from sparsedp import workloads as wl
from sparsedp.continual import OptimizedCounter, adaptive_run, optimized_counter_error
from sparsedp.optimize import optimize
from sparsedp.privacy import Accountant


@pytest.fixture(scope="module")
def strategies():
    """One optimised tree and one p-Identity strategy for prefix sums over N = 30 steps."""
    N = 30
    tree = optimize(wl.prefix(N), family="tree", rng=0)
    pid = optimize(wl.prefix(N), family="pidentity", rng=0)
    assert tree.family == "tree" and pid.family == "pidentity"
    return N, {"tree": tree, "pidentity": pid}


def dense_gls(M, v):
    P = np.diag(1.0 / v)
    cov = np.linalg.inv(M.T @ P @ M)
    return cov, cov @ M.T @ P


@pytest.mark.parametrize("fam", ["tree", "pidentity"])
@pytest.mark.parametrize("secure", [True, False])
def test_brute_force_sensitivity_and_batch_equivalence(strategies, fam, secure):
    N, strat = strategies
    eps, seed = 0.7, 11
    c = OptimizedCounter(N, eps, strat[fam], rng=seed, secure=secure)
    M = c.measured_strategy().toarray()
    assert M.shape == (strat[fam].strategy.shape[0], N)
    # Delta_1 by brute force over every column (every step); integer strategies: exact
    assert np.array_equal(M, np.round(M))
    given = strat[fam].strategy.tosparse().toarray()
    assert np.abs(given).sum(axis=0).max() == c.sensitivity == strat[fam].sensitivity
    # exact noise measures a tree as its 0/1 rows with per-row scales b / w_u, p-Identity [diag(a); B]
    # as [I; B] with scales b / a_j on the identity; float noise the strategy as given
    if not secure:
        assert np.array_equal(M, given)
    elif fam == "tree":
        assert np.array_equal(M, (given != 0).astype(float))
    else:
        assert np.array_equal(M[:N], np.eye(N)) and np.array_equal(M[N:], given[N:])
    # the certified loss of the plan's scales on the measured rows is within the budget
    b = c.noise_scales()
    assert (np.abs(M) / b[:, None]).sum(axis=0).max() <= eps * (1 + 1e-12)
    # outputs are the batch GLS release W G (M x + z) for the same noise z
    x = np.random.default_rng(3).integers(0, 5, N).astype(float)
    out = c.run(x)
    z = c.plan.noise_stream(rng=seed).all()
    v = c.plan.variances()
    _, G = dense_gls(M, v)
    np.testing.assert_allclose(out, np.cumsum(G @ (M @ x + z)), atol=1e-8 * (1 + np.abs(out).max()))
    if secure:
        assert np.array_equal(z, np.round(z))  # exact noise on the counts' lattice
    with pytest.raises(BudgetExceededError):
        c.update(1.0)


@pytest.mark.parametrize("fam", ["tree", "pidentity"])
def test_step_variances_equal_dense_formula_and_optimiser_error(strategies, fam):
    N, strat = strategies
    res = strat[fam]
    err = optimized_counter_error(N, 1.0, res)  # float noise: V = 2 b^2
    M = res.strategy.tosparse().toarray()
    b = res.sensitivity / 1.0
    cov, _ = dense_gls(M, np.full(M.shape[0], 2 * b * b))
    W = np.tril(np.ones((N, N)))
    np.testing.assert_allclose(err.per_step, np.diag(W @ cov @ W.T), rtol=1e-9)
    # the counter's total is the optimiser's objective (exact GLS error of the prefix workload)
    assert err.total == pytest.approx(res.error.total, rel=1e-9)
    assert optimized_counter_error(N, 2.0, res).total == pytest.approx(err.total / 4, rel=1e-9)


@pytest.mark.parametrize("fam", ["tree", "pidentity"])
@pytest.mark.parametrize("secure", [True, False])
def test_empirical_variance_matches_formula(strategies, fam, secure):
    N, strat = strategies
    R = 6000
    x = np.ones(N)
    # R releases of one counter's plan (tests/_counter_draws.py: the noise in one call through the plan's
    # measure, the counter's own offsets computation; its own seeded release checked = s + B z)
    runs = counter_releases(lambda rng: OptimizedCounter(N, 1.0, strat[fam], rng=rng, secure=secure), x, R, 5)
    emp = (runs - np.cumsum(x)).var(axis=0)
    c = OptimizedCounter(N, 1.0, strat[fam], rng=0, secure=secure)
    exact = c.step_variances()
    np.testing.assert_array_less(np.abs(emp / exact - 1), 0.10)
    assert abs(emp.mean() / exact.mean() - 1) < 0.03
    formula = optimized_counter_error(N, 1.0, strat[fam], secure=secure).per_step
    np.testing.assert_allclose(exact, formula, rtol=1e-12)
    if not secure:  # float Laplace: 2 b^2; exact discrete variances are a little smaller
        assert np.all(optimized_counter_error(N, 1.0, strat[fam], secure=True).per_step <= exact * (1 + 1e-12))
    assert np.isnan(c.last_variance)
    c.run(x[:5])
    assert c.last_variance == pytest.approx(exact[4])


@pytest.mark.parametrize("fam", ["tree", "pidentity"])
def test_offsets_do_not_depend_on_an_adaptive_stream(strategies, fam):
    """The two conditions of the adaptive-privacy proof (:mod:`sparsedp.continual.adaptive`)."""
    N, strat = strategies
    seed = 9

    def world(delta):
        def choose(t, past):
            if t == 12:
                return 1.0 + delta  # the challenge step
            return float(past[-1] > past[-2]) if t > 2 else 0.0  # reacts to the released values
        return adaptive_run(OptimizedCounter(N, 1.0, strat[fam], rng=seed), choose)

    (o0, a0), (o1, a1) = world(0.0), world(1.0)
    assert not np.array_equal(a0, a1)
    np.testing.assert_allclose(o0 - np.cumsum(a0), o1 - np.cumsum(a1), atol=1e-9)


def test_exact_noise_is_the_default_and_default_strategy(strategies):
    N, _ = strategies
    c = OptimizedCounter(N, 1.0)
    assert c.secure and c.plan.secure and c.private
    assert c.plan.cost.epsilon == 1.0
    # the default strategy is the optimiser's for the prefix workload, never worse than a template
    res = optimize(wl.prefix(N), rng=0)
    assert c.step_variances().sum() <= res.best_template().error * (1 + 1e-9)
    g = OptimizedCounter(N, rho=0.5, rng=1)
    assert g.kind == "gaussian" and g.plan.noise == "gaussian"
    assert np.all(np.isfinite(g.run(np.ones(N))))


def test_bad_input_refused_before_noise_or_charge(strategies):
    N, strat = strategies
    acct = Accountant(epsilon=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        OptimizedCounter(N, 0.0, strat["tree"], accountant=acct)
    with pytest.raises(InvalidPrivacyParameterError):
        OptimizedCounter(N, 1.0, strat["tree"], rho=0.5, accountant=acct)
    with pytest.raises(ShapeError):  # columns are not the horizon
        OptimizedCounter(N + 1, 1.0, strat["tree"], accountant=acct)
    with pytest.raises(SparseDPError):  # optimised for Laplace, asked for Gaussian
        OptimizedCounter(N, rho=0.5, strategy=strat["tree"], accountant=acct)
    rank_deficient = sp.csr_matrix(np.ones((3, N)))
    with pytest.raises(ShapeError):
        OptimizedCounter(N, 1.0, rank_deficient, accountant=acct, secure=False)
    with pytest.raises(SparseDPError, match="weighted-tree"):  # not a tree: no exact release
        OptimizedCounter(N, 1.0, rank_deficient, accountant=acct)
    assert acct.spent == 0 and not acct.ledger
    c = OptimizedCounter(N, 1.0, strat["pidentity"], rng=0, accountant=acct)
    assert acct.spent == 1.0 and len(acct.ledger) == 1
    for bad in (float("nan"), -1.0, 0.5, "3"):
        with pytest.raises(SparseDPError):
            c.update(bad)
    assert c.t == 0
    with pytest.raises(Exception):
        OptimizedCounter(N, 1.0, strat["tree"], accountant=acct)  # the budget is spent
    assert len(acct.ledger) == 1


@pytest.mark.parametrize("fam", ["tree", "pidentity"])
def test_unit_increments_measure_on_the_quantum_lattice(strategies, fam):
    N, strat = strategies
    c = OptimizedCounter(N, 1.0, strat[fam], increments="unit", rng=4)
    assert c.quantum == 2.0**-10 and c.plan.grid == c.quantum and c.plan.grid_exact
    z = c.plan.noise_stream(rng=4).all()
    np.testing.assert_array_equal(z / c.quantum, np.round(z / c.quantum))  # exact noise on q Z
    out = c.run(np.full(N, 0.5))
    assert np.all(np.isfinite(out))
    with pytest.raises(SparseDPError):
        OptimizedCounter(N, 1.0, strat[fam], increments="unit", rng=4).update(1.5)
