"""Consistent non-negative marginals (sparsedp.marginals.nonneg): exact non-negativity, consistency,
identity on non-negative releases, and the workload metric's error guarantee (issue 18)."""

from __future__ import annotations

import numpy as np
import pytest

from sparsedp.marginals import (Domain, marginal_tables, marginals_up_to, nonnegative_marginals, release_marginals,
                                synthetic_records)
from sparsedp.marginals.nonneg import _forward, _groups, _metric_weights

DOM = Domain([f"a{i}" for i in range(5)], [3, 4, 5, 2, 6])


def _err(dom, truth, work, ms):
    return sum(float(np.sum((ms[tuple(dom.names[i] for i in S)] - truth[S]) ** 2)) for S in work)


def _consistent(nn, dom):
    """Every marginal containing an attribute gives the same 1-way marginal, and all share one total."""
    totals = [float(t.sum()) for t in nn.marginals.values()]
    np.testing.assert_allclose(totals, totals[0], rtol=1e-10)
    for a in dom.names:
        ones = [t.sum(axis=tuple(j for j in range(t.ndim) if k[j] != a)) for k, t in nn.marginals.items() if a in k]
        for m in ones[1:]:
            np.testing.assert_allclose(m, ones[0], atol=1e-8)


def test_metric_weights_give_the_workload_error():
    # sum_S ||K_S r||^2 == sum_A w_A ||r_A||^2 for any residuals r
    X = synthetic_records(DOM, 200, rng=0)
    work = marginals_up_to(DOM, 2, exact=True) + [(0, 2, 4)]
    rel = release_marginals(X, DOM, work, 1.0, rng=1)
    rng = np.random.default_rng(3)
    r = {A: rng.standard_normal(v.shape) for A, v in rel.residuals.items()}
    t = _forward(rel, _groups(rel), r)
    w = _metric_weights(rel)
    assert sum(float(np.sum(x * x)) for x in t.values()) == pytest.approx(
        sum(w[A] * float(np.sum(r[A] ** 2)) for A in r), rel=1e-10)


@pytest.mark.parametrize("metric", ["workload", "gls"])
def test_exactly_nonnegative_and_consistent(metric):
    X = synthetic_records(DOM, 300, rng=0)
    rel = release_marginals(X, DOM, marginals_up_to(DOM, 2, exact=True), 0.05, rng=2)
    assert min(float(t.min()) for t in rel.marginals.values()) < -1  # something to fix
    nn = nonnegative_marginals(rel, iters=3000, tol=1e-6, metric=metric)
    assert nn.metric == metric and nn.iterations > 0
    assert all(float(t.min()) >= 0.0 for t in nn.marginals.values())  # exact, not up to tol
    assert nn.max_violation <= 1e-6 and 0 <= nn.mix < 1e-4
    _consistent(nn, DOM)


def test_fixup_is_exact_even_when_iterations_stop_early():
    X = synthetic_records(DOM, 300, rng=0)
    rel = release_marginals(X, DOM, marginals_up_to(DOM, 2, exact=True), 0.05, rng=2)
    nn = nonnegative_marginals(rel, iters=3)  # far from converged: a large violation to lift
    assert nn.max_violation > 1e-3 and nn.mix > 0
    assert all(float(t.min()) >= 0.0 for t in nn.marginals.values())
    _consistent(nn, DOM)


def test_nonnegative_release_returned_unchanged():
    big = release_marginals(synthetic_records(DOM, 20000, rng=0), DOM, [(0, 1), (1, 2)], 10.0, rng=1)
    assert min(float(t.min()) for t in big.marginals.values()) >= 0
    for metric in ("workload", "gls"):
        same = nonnegative_marginals(big, metric=metric)
        assert same.iterations == 0 and same.mix == 0.0
        for k, t in big.marginals.items():
            assert np.array_equal(same.marginals[k], t)


def test_workload_metric_never_increases_the_error():
    # the projection onto a convex set holding the truth is non-expansive in the workload's metric:
    # per release err(non-neg) <= err(plain) (up to the tolerance), and clearly lower on average
    X = synthetic_records(DOM, 150, rng=4)
    work = marginals_up_to(DOM, 2, exact=True)
    truth = marginal_tables(X, DOM, work)
    plain, nonneg = [], []
    for seed in range(8):
        rel = release_marginals(X, DOM, work, 0.1, rng=100 + seed)
        nn = nonnegative_marginals(rel, iters=3000, tol=1e-7)
        plain.append(_err(DOM, truth, work, rel.marginals))
        nonneg.append(_err(DOM, truth, work, nn.marginals))
        assert nonneg[-1] <= plain[-1] * (1 + 1e-6)
    assert np.mean(nonneg) < 0.9 * np.mean(plain)


def test_bad_metric():
    rel = release_marginals(synthetic_records(DOM, 50, rng=0), DOM, [(0, 1)], 0.01, rng=1)
    with pytest.raises(ValueError, match="metric"):
        nonnegative_marginals(rel, metric="l1")
