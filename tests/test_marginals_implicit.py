"""Issue 18: residuals measured implicitly (Kronecker of the contrasts by mode products) give the
explicit path's release on small domains, and large tables (three attributes of 100) run."""

from __future__ import annotations

import numpy as np
import pytest
from _marginal_draws import marginal_releases

import sparsedp.marginals.release as release_mod
from sparsedp import Accountant
from sparsedp.errors import SparseDPError
from sparsedp.marginals import Domain, KronOperator, marginals_up_to, release_marginals, synthetic_records


@pytest.fixture
def small():
    dom = Domain(["a", "b", "c", "d"], [3, 4, 5, 2])
    return dom, synthetic_records(dom, 3000, rng=1), marginals_up_to(dom, 3)


def _release(monkeypatch, implicit, *args, **kw):
    monkeypatch.setattr(release_mod, "_IMPLICIT_NNZ", 0 if implicit else 2**62)
    return release_marginals(*args, **kw)


def test_implicit_residuals_equal_the_explicit_release(monkeypatch, small):
    dom, X, work = small
    ex = _release(monkeypatch, False, X, dom, work, 0.5, rng=3, secure=False)
    im = _release(monkeypatch, True, X, dom, work, 0.5, rng=3, secure=False)
    assert ex.marginals.keys() == im.marginals.keys()
    for key in ex.marginals:
        np.testing.assert_allclose(im.marginals[key], ex.marginals[key], rtol=0, atol=1e-9)
        assert im.variances[key] == pytest.approx(ex.variances[key], rel=1e-9)
    assert im.loss == pytest.approx(ex.loss, rel=1e-9) and im.loss <= 0.5


def test_implicit_plans_are_kronecker_and_exact_noise_costs_at_most_rho(monkeypatch, small):
    dom, X, work = small
    seen = []
    real = release_mod.plan_measurement

    def spy(M, **kw):
        seen.append(M)
        return real(M, **kw)

    monkeypatch.setattr(release_mod, "plan_measurement", spy)
    acc = Accountant(rho=1.0)
    im = _release(monkeypatch, True, X, dom, work, 0.5, accountant=acc)
    assert seen and all(type(M) is KronOperator for M in seen)
    assert im.loss <= 0.5 and acc.spent == pytest.approx(0.5) and len(acc.ledger) == 1
    ex = _release(monkeypatch, False, X, dom, work, 0.5, rng=4)
    # exact noise: the factored grid bound is a hair above the explicit one, so sigma is too
    for A, v in im.residual_variances.items():
        assert v == pytest.approx(ex.residual_variances[A], rel=1e-5)
    truth_err = [np.abs(im.marginals[k] - ex.marginals[k]).max() for k in im.marginals]
    assert max(truth_err) < 200  # both near the truth (sanity; the noise differs)


def test_implicit_variances_match_empirical(monkeypatch):
    dom = Domain(["a", "b", "c"], [3, 4, 3])
    X = synthetic_records(dom, 500, rng=2)
    work = marginals_up_to(dom, 3)
    from sparsedp.marginals import marginal_tables

    truth = marginal_tables(X, dom, list(work))
    # the releases: one real implicit release's plans (KronOperator, calibrated from the factors)
    # measured R times by their batched release and reconstructed by the release's own step
    # (tests/_marginal_draws.py; the real release, mode products and all, is checked to be that
    # reconstruction of what its plans drew).  Was 200 release_marginals calls (2.8 s).
    monkeypatch.setattr(release_mod, "_IMPLICIT_NNZ", 0)
    r, tabs, plans = marginal_releases(1000, 100, X, dom, work, 2.0)
    assert plans and all(type(p.strategy) is KronOperator for p in plans)
    for S in (S for S in work if len(S) >= 2):  # >= 9 cells x 1000 releases: <= 2.2% sampling error
        key = tuple(dom.names[i] for i in S)
        emp = float(np.mean(np.square(tabs[key] - truth[S].ravel())))
        assert emp == pytest.approx(r.variances[key], rel=0.1)


def test_bad_input_refused_before_noise(monkeypatch, small):
    dom, X, work = small
    acc = Accountant(rho=1.0)
    bad = X.astype(float)
    bad[0, 0] = np.nan
    with pytest.raises(SparseDPError):
        _release(monkeypatch, True, bad, dom, work, 0.5, accountant=acc)
    bad = X.astype(np.int64)
    bad[0, 1] = 7
    with pytest.raises(SparseDPError):
        _release(monkeypatch, True, bad, dom, work, 0.5, accountant=acc)
    assert acc.spent == 0 and not acc.ledger


@pytest.mark.parametrize("size", [40, 100])
def test_three_attributes_all_3_way(size):
    # the explicit Q_A of the 3-way residual would hold ~9.5e6 / ~3.4e8 non-zeros; implicitly it is
    # one table (40: the sigma rescaling must converge with the factored grid bound)
    dom = Domain.uniform(3, size)
    X = synthetic_records(dom, 20000, rng=5)
    r = release_marginals(X, dom, marginals_up_to(dom, 3), 0.5)
    assert r.marginals[("a0", "a1", "a2")].shape == (size,) * 3
    assert r.loss <= 0.5
    assert r.marginals[("a0", "a1", "a2")].sum() == pytest.approx(
        20000, abs=50 * np.sqrt(size**3 * r.variances[("a0", "a1", "a2")]))
