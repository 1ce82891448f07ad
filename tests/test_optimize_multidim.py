"""sparsedp.optimize on multi-dimensional workloads (issue 18): marginal workloads (residual optimum
under Gaussian noise, weighted marginals under Laplace) and Kronecker workloads (optimize_kron)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sparsedp.optimize import optimize_kron
import scipy.sparse as sp

import sparsedp
from sparsedp import marginals as mg
from sparsedp import workloads
from sparsedp.errors import ShapeError, SparseDPError


def test_gaussian_marginals_is_the_residual_optimum():
    D = mg.Domain.uniform(8, 4)
    wl = mg.marginal_workload(D, k=2)
    r = sparsedp.optimize(wl, noise="gaussian")
    sel = mg.select_residuals(D, wl.marginals, 1.0)
    assert r.family == "residual" and r.noise == "gaussian"
    assert isinstance(r.strategy, mg.ResidualSelection)
    assert r.error.total == pytest.approx(sel.sum_of_variances(), rel=1e-12)
    assert r.error.total == pytest.approx(sel.value, rel=1e-12)  # unit weights: objective = total
    np.testing.assert_allclose(r.strategy.sigma2, sel.sigma2, rtol=1e-12)
    # ResidualPlanner's figure for this workload at rho = 1/2 (issue 18's table)
    assert r.error_at(rho=0.5) == pytest.approx(6431.620, abs=1e-3)
    assert r.error.variances.size == wl.cells == 28 * 16
    assert r.error.variances.sum() == pytest.approx(r.error.total, rel=1e-12)
    assert r.history[0].family == "residual" and r.history[0].error == r.error.total
    assert r.sensitivity == pytest.approx(np.sqrt(np.sum(sel.p)))


def test_gaussian_weighted_and_max_objectives():
    D = mg.Domain(("a", "b", "c"), (2, 3, 4))
    wl = mg.marginal_workload(D, [("a", "b"), ("c",)], weights=[1.0, 3.0], objective="max")
    r = sparsedp.optimize(wl, noise="gaussian", family="residual")
    sel = mg.select_residuals(D, [("a", "b"), ("c",)], 1.0, weights=[1.0, 3.0], objective="max")
    assert r.error.total == pytest.approx(sel.sum_of_variances(), rel=1e-9)
    assert "objective max" in r.history[0].note


def test_residual_strategy_releases_at_its_variances():
    D = mg.Domain(("a", "b", "c"), (2, 3, 4))
    wl = mg.marginal_workload(D, k=2)
    r = sparsedp.optimize(wl, noise="gaussian")
    X = np.random.default_rng(1).integers(0, (2, 3, 4), size=(500, 3))
    rel = mg.release_marginals(X, D, r.strategy.marginals, 0.25, weights=r.strategy.weights, rng=3, secure=False)
    for S in wl.marginals:  # the release's reported variance is the selection's at rho = 1/4 (after grid rounding)
        key = tuple(D.names[i] for i in S)
        assert rel.variances[key] == pytest.approx(r.strategy.cell_variance(S) / 0.25, rel=1e-3)


def _dense_marginals_error(D, workload, measured, theta):
    """2 Delta_1^2 tr(W^T W (M^T M)^+) with the explicit matrices (tiny domains)."""
    W = sp.vstack([mg.marginal_operator(D, S).tosparse() for S in workload]).toarray()
    M = sp.vstack([t * mg.marginal_operator(D, S).tosparse() for S, t in zip(measured, theta)]).toarray()
    delta = np.abs(M).sum(axis=0).max()
    return 2.0 * delta**2 * np.trace(W.T @ W @ np.linalg.pinv(M.T @ M))


def test_laplace_marginals_is_the_weighted_marginals_strategy():
    D = mg.Domain(("a", "b", "c", "d"), (2, 3, 2, 3))
    wl = mg.marginal_workload(D, k=2)
    r = sparsedp.optimize(wl, noise="laplace")
    ref = mg.optimize_marginals_laplace(D, wl.marginals, 1.0)
    assert r.family == "marginals" and isinstance(r.strategy, mg.MarginalsStrategy)
    assert r.error.total == ref.total_error
    assert r.strategy.measured == ref.measured
    np.testing.assert_array_equal(r.strategy.weights, ref.weights)
    dense = _dense_marginals_error(D, wl.marginals, r.strategy.measured, r.strategy.weights)
    assert r.error.total == pytest.approx(dense, rel=1e-8)
    assert r.error_at(epsilon=2.0) == pytest.approx(r.strategy.at(2.0).total_error, rel=1e-12)
    # seeds pass through
    other = sparsedp.optimize(wl, noise="laplace", rng=5, restarts=1)
    ref5 = mg.optimize_marginals_laplace(D, wl.marginals, 1.0, rng=5, restarts=1)
    assert other.error.total == ref5.total_error
    X = np.random.default_rng(0).integers(0, (2, 3, 2, 3), size=(200, 4))
    rel = mg.release_marginals_laplace(X, r.strategy.at(0.5), rng=0, secure=False)
    assert rel.sum_of_variances() == pytest.approx(r.error_at(epsilon=0.5), rel=1e-6)


def test_kron_is_optimize_kron_and_matches_dense_error():
    K = mg.KronOperator([workloads.all_ranges(6), workloads.all_ranges(5)])
    for noise in ("laplace", "gaussian"):
        r = sparsedp.optimize(K, noise=noise, rng=0)
        ks = optimize_kron([workloads.all_ranges(6), workloads.all_ranges(5)], noise=noise, rng=0)
        unit = {"epsilon": 1.0} if noise == "laplace" else {"rho": 1.0}
        assert r.family == "kron" and isinstance(r.strategy, mg.KronOperator)
        assert r.error.total == pytest.approx(ks.total_error(**unit), rel=1e-12)
        W = K.tosparse().toarray()
        M = r.strategy.tosparse().toarray()
        if noise == "laplace":
            var = 2.0 * np.abs(M).sum(axis=0).max() ** 2
        else:
            var = (M * M).sum(axis=0).max() / 2.0
        dense = var * np.trace(W.T @ W @ np.linalg.inv(M.T @ M))
        assert r.error.total == pytest.approx(dense, rel=1e-8)
        assert r.error.per_query == pytest.approx(r.error.total / W.shape[0])
        assert r.sensitivity == pytest.approx(ks.sensitivity)


def test_kron_equal_factors_optimised_once():
    K = mg.KronOperator([workloads.all_ranges(8), workloads.all_ranges(8)])
    r = sparsedp.optimize(K, noise="laplace", rng=0)
    a, b = r.strategy.factors
    assert (sp.csr_matrix(a) != sp.csr_matrix(b)).nnz == 0


def test_one_dimensional_path_unchanged():
    W = workloads.all_ranges(16)
    a = sparsedp.optimize(W, noise="laplace", family="templates")
    b = sparsedp.optimize(W, noise="laplace", family="templates")
    assert a.error.total == b.error.total and a.family == "templates"
    with pytest.raises(ShapeError, match="1-D workload"):
        sparsedp.optimize(W, domain=mg.Domain.uniform(1, 16))


def test_bad_input_is_a_clear_error():
    D = mg.Domain(("a", "b", "c"), (2, 3, 4))
    wl = mg.marginal_workload(D, k=2)
    with pytest.raises(ShapeError, match="domain mismatch"):
        sparsedp.optimize(wl, noise="gaussian", domain=mg.Domain(("a", "b", "c"), (2, 3, 5)))
    with pytest.raises(ShapeError, match="domain mismatch"):
        sparsedp.optimize(wl, noise="gaussian", domain=mg.Domain(("x", "y", "z"), (2, 3, 4)))
    with pytest.raises(ShapeError, match="domain mismatch"):
        sparsedp.optimize(mg.KronOperator([np.eye(3), np.eye(4)]), domain=D)
    with pytest.raises(ShapeError, match="unknown attribute"):
        mg.marginal_workload(D, [("a", "q")])
    with pytest.raises(ShapeError):
        mg.marginal_workload(D, k=4)
    with pytest.raises(SparseDPError, match="either marginals or k"):
        mg.marginal_workload(D)
    with pytest.raises(SparseDPError, match="'residual'"):
        sparsedp.optimize(wl, noise="gaussian", family="marginals")
    with pytest.raises(SparseDPError, match="'marginals'"):
        sparsedp.optimize(wl, noise="laplace", family="residual")
    with pytest.raises(SparseDPError, match="family"):
        sparsedp.optimize(wl, noise="gaussian", family="tree")
    with pytest.raises(SparseDPError, match="unit weights"):
        sparsedp.optimize(mg.marginal_workload(D, k=1, weights=[1, 2, 3]), noise="laplace")
    with pytest.raises(ShapeError, match="domain mismatch"):
        sparsedp.optimize(mg.KronStack([mg.marginal_operator(D, S) for S in itertools.combinations(range(3), 2)]),
                          domain=mg.Domain.uniform(3, 4))
    with pytest.raises(SparseDPError):
        sparsedp.optimize(wl, noise="poisson")


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_union_of_kron_products_exact_error_and_never_worse_than_identity(noise):
    R, one = workloads.all_ranges, (lambda n: np.ones((1, n)))
    U = mg.KronStack([mg.KronOperator([R(8), R(6)]), mg.KronOperator([R(8), one(6)]),
                      mg.KronOperator([one(8), R(6)])])
    r = sparsedp.optimize(U, noise=noise, rng=0)
    assert r.family == "kron" and isinstance(r.strategy, mg.KronOperator)
    W = U.tosparse().toarray()
    M = r.strategy.tosparse().toarray()
    var = 2.0 * np.abs(M).sum(axis=0).max() ** 2 if noise == "laplace" else (M * M).sum(axis=0).max() / 2.0
    assert r.error.total == pytest.approx(var * np.trace(W.T @ W @ np.linalg.inv(M.T @ M)), rel=1e-8)
    ident = [h for h in r.history if h.name.startswith("identity")][0]
    idvar = 2.0 if noise == "laplace" else 0.5  # Delta = 1 for the identity product
    assert ident.error == pytest.approx(idvar * np.trace(W.T @ W), rel=1e-12)
    assert r.error.total <= ident.error
    if noise == "gaussian":  # ranges under Gaussian noise: trees beat the identity clearly
        assert r.error.total < 0.8 * ident.error
