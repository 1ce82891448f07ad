"""Full-GLS mixed-radix tree counter and the adaptive-privacy conditions of the pure-DP counters."""

import numpy as np
import pytest
from _counter_draws import counter_releases

from sparsedp import BudgetExceededError, InvalidPrivacyParameterError, SparseDPError
from sparsedp.continual import (
    BinaryMechanism,
    ContinualCounter,
    GLSTreeCounter,
    HonakerCounter,
    KaryCounter,
    NegDigitCounter,
    adaptive_run,
    default_radices,
    gls_noise_offsets,
    gls_tree_error,
    gls_tree_weights,
    mixed_layout,
    negdigit_error,
    path_variances,
)
from sparsedp.continual.glstree import _node_variances, _total_and_grad, per_row


def dense_gls(layout, lam, eps=1.0, v=None):
    """Dense reference: measured rows of M, node variances, G = (M^T P M)^{-1} M^T P."""
    v = _node_variances(layout, lam, eps) if v is None else v
    measured = np.isfinite(v)
    M = layout.matrix().toarray()[measured]
    P = np.diag(1.0 / v[measured])
    cov = np.linalg.inv(M.T @ P @ M)
    return M, measured, cov, cov @ M.T @ P


def check_gradient(layout, lam, total, grad, eps, rho, h=1e-6):
    """The analytic gradient (used by the weight optimiser) against central differences."""
    for lev in np.flatnonzero(lam > 0):
        up, dn = lam.copy(), lam.copy()
        up[lev] += h
        dn[lev] -= h
        fd = (_total_and_grad(layout, up, eps, rho)[0] - _total_and_grad(layout, dn, eps, rho)[0]) / (2 * h)
        assert grad[lev] == pytest.approx(fd, rel=1e-5, abs=1e-6 * abs(total))


CASES = [(37, (3, 4), None), (37, (2, 2, 2, 2), None), (40, (4, 4), np.array([0.4, 0.3, 0.3, 0.0])),
         (23, (5,), None)]


@pytest.mark.parametrize("N, radices, lam", CASES)
def test_path_variances_and_total_match_dense_linear_algebra(N, radices, lam):
    layout = mixed_layout(N, radices)
    if lam is None:
        lam = np.random.default_rng(N).uniform(0.3, 1.0, layout.levels)
        lam /= lam.sum()
    W = np.tril(np.ones((N, N)))
    _, _, cov, _ = dense_gls(layout, lam)
    dense = np.diag(W @ cov @ W.T)
    v = _node_variances(layout, lam, 1.0)
    np.testing.assert_allclose(path_variances(layout, v, chunk=7), dense, rtol=1e-10)
    total, grad = _total_and_grad(layout, lam, 1.0)
    assert total == pytest.approx(dense.sum(), rel=1e-10)
    check_gradient(layout, lam, total, grad, 1.0, None)


def test_mixed_layout_shapes_and_default_radices():
    layout = mixed_layout(1023, (16, 16, 4))
    assert layout.sizes == (1023, 64, 4, 1)
    assert mixed_layout(10, (3,)).sizes == (10, 4, 1)  # a root over the remaining nodes
    for N in (1, 2, 15, 16, 17, 1023, 65535, 10**6):
        r = default_radices(N)
        assert int(np.prod(r)) >= N
        assert mixed_layout(N, r).sizes[-1] == 1
    with pytest.raises(SparseDPError):
        mixed_layout(10, (1, 2))


@pytest.mark.parametrize("root", ["optimal", "unmeasured"])
@pytest.mark.parametrize("secure", [True, False])
def test_brute_force_sensitivity_and_batch_equivalence(root, secure):
    N, eps, seed = 30, 0.7, 11
    radices = (3, 5)
    lam = gls_tree_weights(N, radices) if root == "optimal" else np.array([0.4, 0.3, 0.3, 0.0])
    c = GLSTreeCounter(N, eps, radices=radices, weights=lam, rng=seed, secure=secure)
    layout = c.layout
    assert lam.sum() == pytest.approx(1.0)
    # exact L1 sensitivity of Sigma M by brute force over the columns (= every step)
    rows = per_row(layout, lam)
    SM = rows[:, None] * layout.matrix().toarray()
    assert np.abs(SM).sum(axis=0).max() == pytest.approx(c.sensitivity)
    assert c.sensitivity == pytest.approx(1.0)
    # the counter's outputs are the batch GLS release W G (M x + z) for the same z (sum units: the
    # level-l node noise has scale b / lambda_l), weighted by the plan's node variances
    x = np.random.default_rng(3).integers(0, 5, N).astype(float)
    out = c.run(x)
    z, _ = gls_noise_offsets(layout, c.lam, eps, rng=seed, secure=secure)
    M, measured, _, G = dense_gls(layout, c.lam, eps, v=c.node_variances())
    y = M @ x + z[measured]
    np.testing.assert_allclose(out, np.cumsum(G @ y), atol=1e-9)
    if secure:
        assert np.array_equal(z, np.round(z))  # exact noise on the counts' lattice
    with pytest.raises(BudgetExceededError):
        c.update(1.0)


@pytest.mark.parametrize("secure", [True, False])
def test_empirical_variance_matches_formula(secure):
    N, R = 26, 4000
    radices = (3, 3)
    lam = gls_tree_weights(N, radices)
    formula = gls_tree_error(N, 1.0, radices=radices, weights=lam).per_step
    x = np.ones(N)
    # R releases of one counter's plan (tests/_counter_draws.py: noise in one call, the counter's own offsets)
    runs = counter_releases(lambda rng: GLSTreeCounter(N, 1.0, radices=radices, weights=lam, rng=rng, secure=secure),
                            x, R, 5)
    emp = (runs - np.cumsum(x)).var(axis=0)
    c = GLSTreeCounter(N, 1.0, radices=radices, weights=lam, rng=0, secure=secure)
    exact = c.step_variances()  # from the plan's per-node variances (exact discrete ones when secure)
    np.testing.assert_array_less(np.abs(emp / exact - 1), 0.10)
    if secure:  # discrete Laplace variances are below 2 t^2; the plan rounds scales up by < 2^(1/64)
        assert np.all(exact < formula * 1.0222) and np.all(exact > 0.9 * formula)
    else:
        np.testing.assert_allclose(exact, formula, rtol=1e-5)
    assert np.isnan(c.last_variance)
    c.run(x[:5])
    assert c.last_variance == pytest.approx(exact[4])


def test_optimal_weights_beat_uniform_and_negative_digits():
    N = 2**10 - 1
    opt = gls_tree_error(N, 1.0)
    uni = gls_tree_error(N, 1.0, weights="uniform")
    assert opt.mean < uni.mean
    assert opt.mean < 0.8 * negdigit_error(N, 19, 1.0).mean  # 182.8 for the 19-ary negative digits
    fast = gls_tree_error(N, 1.0, per_step=False)
    assert fast.total == pytest.approx(opt.total, rel=1e-10)
    assert opt.per_step.shape == (N,) and np.all(opt.per_step > 0)
    # error scales as 1 / epsilon^2
    assert gls_tree_error(N, 2.0, per_step=False).total == pytest.approx(opt.total / 4, rel=1e-6)


def test_noiseless_limit_and_bad_input_before_noise():
    N = 50
    x = np.random.default_rng(1).integers(0, 9, N).astype(float)
    # eps = 1e6, the top of the accepted range: almost no noise
    np.testing.assert_allclose(GLSTreeCounter(N, 1e6, rng=2).run(x), np.cumsum(x), atol=1e-3)
    with pytest.raises(InvalidPrivacyParameterError):
        GLSTreeCounter(N, 0.0)
    with pytest.raises(SparseDPError):
        GLSTreeCounter(N, 1.0, weights=np.ones(2))
    with pytest.raises(SparseDPError):
        GLSTreeCounter(N, 1.0, weights="best")
    c = GLSTreeCounter(N, 1.0, rng=0)
    with pytest.raises(SparseDPError):
        c.update(float("nan"))
    assert c.t == 0


FACTORIES = {
    "gls-tree": lambda N, s: GLSTreeCounter(N, 1.0, radices=(4, 4), weights="uniform", rng=s),
    "negdigit": lambda N, s: NegDigitCounter(N, 1.0, k=5, weights="uniform", rng=s),
    "kary": lambda N, s: KaryCounter(N, 1.0, k=4, weights="uniform", rng=s),
    "binary": lambda N, s: BinaryMechanism(N, 1.0, rng=s),
    "honaker": lambda N, s: HonakerCounter(N, 1.0, rng=s),
    "fenwick-fda": lambda N, s: ContinualCounter(N, epsilon=1.0, rng=s),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_offsets_do_not_depend_on_an_adaptive_stream(name):
    """The two conditions of the adaptive-privacy proof (:mod:`sparsedp.continual.adaptive`): the
    released ``o_t - s_t`` is the same process whatever the (adaptively chosen) data."""
    N, seed = 60, 9
    make = FACTORIES[name]

    def world(delta):
        def choose(t, past):
            if t == 20:
                return 1.0 + delta  # the challenge step
            return float(past[-1] > past[-2]) if t > 2 else 0.0  # reacts to the released values
        return adaptive_run(make(N, seed), choose)

    (o0, a0), (o1, a1) = world(0.0), world(1.0)
    assert not np.array_equal(a0, a1)
    np.testing.assert_allclose(o0 - np.cumsum(a0), o1 - np.cumsum(a1), atol=1e-9)


def test_cli_gls_tree_method(monkeypatch, capsys):
    import io
    import sys

    from sparsedp.cli import main

    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n0\n2\n"))
    assert main(["continual", "--horizon", "10", "--method", "gls-tree", "--seed", "3", "--std"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all(float(line.split("\t")[1]) > 0 for line in lines)
    monkeypatch.setattr(sys, "stdin", io.StringIO("1\n"))
    assert main(["continual", "--horizon", "10", "--method", "gls-tree", "--rho", "0.5"]) == 2


def test_gaussian_variant_sensitivity_gradient_and_variance():
    N, rho, radices = 20, 0.5, (2, 3)
    layout = mixed_layout(N, radices)
    lam = gls_tree_weights(N, radices, norm=2)
    assert np.sum(lam**2) == pytest.approx(1.0)
    c = GLSTreeCounter(N, rho=rho, radices=radices, weights=lam, rng=0)
    SM = per_row(layout, lam)[:, None] * layout.matrix().toarray()
    assert np.sqrt((SM**2).sum(axis=0)).max() == pytest.approx(c.sensitivity)  # brute-force Delta_2
    # dense covariance with v_u = sigma^2 / lambda_l^2, sigma = Delta_2 / sqrt(2 rho)
    v = _node_variances(layout, lam, None, rho)
    M = layout.matrix().toarray()
    W = np.tril(np.ones((N, N)))
    dense = np.diag(W @ np.linalg.inv(M.T @ np.diag(1 / v) @ M) @ W.T)
    formula = gls_tree_error(N, rho=rho, radices=radices, weights=lam).per_step
    np.testing.assert_allclose(formula, dense, rtol=1e-10)
    total, grad = _total_and_grad(layout, lam, None, rho)
    check_gradient(layout, lam, total, grad, None, rho)
    runs = counter_releases(lambda rng: GLSTreeCounter(N, rho=rho, radices=radices, weights=lam, rng=rng),
                            np.ones(N), 3000, 8)
    emp = (runs - np.arange(1, N + 1)).var(axis=0)
    exact = GLSTreeCounter(N, rho=rho, radices=radices, weights=lam, rng=0).step_variances()
    np.testing.assert_array_less(np.abs(emp / exact - 1), 0.12)
    np.testing.assert_allclose(exact, formula, rtol=0.03)  # discrete Gaussian, scales rounded up
    with pytest.raises(InvalidPrivacyParameterError):
        GLSTreeCounter(N, epsilon=1.0, rho=0.5)
