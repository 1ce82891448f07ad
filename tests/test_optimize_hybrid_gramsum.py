"""GramSum: the hybrid objective for a weighted sum of workloads (all ranges + w x whole domain, issue 11)."""

import numpy as np
import pytest

from _hybrid_util import normalised_matrix
from sparsedp import workloads as wl
from sparsedp.errors import SparseDPError
from sparsedp.optimize.calibrate import noise_model
from sparsedp.optimize.gram import Gram
from sparsedp.optimize.hybrid import GramSum, HybridGLS, HybridObjective
from sparsedp.optimize.hybrid import hybrid_matrix, integer_hybrid
from sparsedp.optimize.hybrid_family import hybrid_error


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("n", [96, 100])
def test_sum_objective_is_the_dense_error_of_the_summed_gram(noise, n):
    model = noise_model(noise)
    rng = np.random.default_rng(n)
    nq, w = n * (n + 1) / 2, 0.7
    g = GramSum([(1.0 / nq, Gram(wl.all_ranges(n))), (w, Gram(wl.total(n)))])
    G = g.matmat(np.eye(n))
    ones = np.ones(n)
    # the summed Gram, built independently: all ranges (min + 1)(n - max) averaged, plus w 1 1^T
    i = np.arange(n)
    G_ref = (np.minimum.outer(i, i) + 1.0) * (n - np.maximum.outer(i, i)) / nq + w * np.outer(ones, ones)
    np.testing.assert_allclose(G, G_ref, rtol=1e-12)
    assert g.trace() == pytest.approx(np.trace(G_ref), rel=1e-12)
    R = np.array([0.6, 0.4]) if model.p == 1 else np.array([0.8, 0.6])
    obj = HybridObjective(g, model, 12, (12,), R, 3)
    theta = rng.random((3, obj.nb))
    f, grad = obj(theta.ravel())
    M = normalised_matrix(n, 12, (12,), R, theta, obj.delta(theta), model.p)
    assert f == pytest.approx(np.trace(np.linalg.solve(M.T @ M, G_ref)), rel=1e-9)
    x = theta.ravel()
    for k in rng.choice(x.size, 5, replace=False):
        xp, xm = x.copy(), x.copy()
        xp[k] += 1e-6
        xm[k] -= 1e-6
        assert grad[k] == pytest.approx((obj(xp)[0] - obj(xm)[0]) / 2e-6, rel=1e-5, abs=1e-6 * f)


def test_whole_domain_variance_and_score_of_the_integer_strategy():
    n, model = 96, noise_model("laplace")
    gr, gt = Gram(wl.all_ranges(n)), Gram(wl.total(n))
    g = GramSum([(2.0 / (n * (n + 1)), gr), (1.0, gt)])
    theta = np.random.default_rng(1).random((2, 8))
    R = np.array([0.5, 0.5])
    lay = integer_hybrid(theta, HybridObjective(g, model, 12, (12,), R, 2).delta(theta), R, n, 12, (12,), model)
    M = hybrid_matrix(lay).toarray()
    norm = float(np.abs(M).sum(axis=0).max())
    assert norm <= lay.scale
    whole = float(np.ones(n) @ np.linalg.solve(M.T @ M, np.ones(n)))  # [(M^T M)^{-1}]_{1 1^T}
    assert HybridGLS(lay).prefix_variances()[-1] == pytest.approx(whole, rel=1e-9)
    # the score of the sum is the weighted sum of the parts' scores
    assert hybrid_error(lay, g, model) == pytest.approx(
        2.0 / (n * (n + 1)) * hybrid_error(lay, gr, model) + hybrid_error(lay, gt, model), rel=1e-9)
    assert hybrid_error(lay, gt, model) == pytest.approx(model.sigma2 * norm**2 * whole, rel=1e-9)


def test_gramsum_rejects_mixed_domains_and_negative_weights():
    with pytest.raises(SparseDPError):
        GramSum([(1.0, Gram(wl.total(8))), (1.0, Gram(wl.total(9)))])
    with pytest.raises(SparseDPError):
        GramSum([(-1.0, Gram(wl.total(8)))])
