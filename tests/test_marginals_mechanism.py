"""MatrixMechanism measures whatever sparsedp.optimize returns for a marginal workload: the
residual (zCDP) and weighted-marginals (pure DP) strategies, through the marginal releases, in the
workload's row order, charged once, with variances that match the draws."""

import numpy as np
import pytest

import sparsedp
from sparsedp import SparseDPError, workloads
from sparsedp.marginals import Domain, marginal_workload, release_marginals
from sparsedp.privacy import Accountant

DIMS = (3, 2, 4)
SUBSETS = [(1, 2), (0,), (0, 1)]  # not sorted by shape: the release must keep this order


def _x(seed=0):
    return np.random.default_rng(seed).poisson(6, size=int(np.prod(DIMS))).astype(np.int64)


@pytest.mark.parametrize("noise,budget", [("gaussian", {"rho": 0.5}), ("laplace", {"epsilon": 1.0})])
def test_the_release_answers_the_flattened_workload_in_its_row_order(noise, budget):
    W = workloads.marginals(DIMS, subsets=SUBSETS)
    S = sparsedp.optimize(W, noise=noise, **budget)
    acc = Accountant(**budget)
    rel = sparsedp.MatrixMechanism(W, S, noise=noise, accountant=acc, **budget).run(_x(), rng=3).to_release()
    assert len(rel) == W.shape[0] and len(acc.ledger) == 1
    assert acc.spent == pytest.approx(next(iter(budget.values())))
    marg = np.asarray(rel.labels["marginal"])
    assert list(dict.fromkeys(marg)) == ["a1,a2", "a0", "a0,a1"]
    # row r of W sums the cells the label names: with the true counts, the labels index W's rows
    truth = W.matvec(_x())
    codes = np.stack([np.asarray(rel.labels[f"a{i}"]) for i in range(3)], axis=1)
    full = _x().reshape(DIMS)
    for r in range(W.shape[0]):
        idx = tuple(slice(None) if c < 0 else c for c in codes[r])
        assert full[idx].sum() == truth[r]


def test_counts_give_the_release_the_records_give():
    dom = Domain(["a", "b", "c"], list(DIMS))
    rng = np.random.default_rng(1)
    records = np.column_stack([rng.integers(0, d, size=300) for d in DIMS])
    counts = np.bincount(np.ravel_multi_index(records.T, DIMS), minlength=int(np.prod(DIMS)))
    a = release_marginals(records, dom, [("a", "b"), ("c",)], 0.3, rng=7)
    b = release_marginals(None, dom, [("a", "b"), ("c",)], 0.3, rng=7, counts=counts)
    for k in a.marginals:
        np.testing.assert_array_equal(a.marginals[k], b.marginals[k])
    with pytest.raises(SparseDPError, match="not both"):
        release_marginals(records, dom, [("a",)], 0.3, counts=counts)


@pytest.mark.parametrize("noise,budget", [("gaussian", {"rho": 2.0}), ("laplace", {"epsilon": 2.0})])
def test_variances_match_the_draws(noise, budget):
    W = marginal_workload(Domain(["a", "b", "c"], list(DIMS)), k=2)
    mm = sparsedp.MatrixMechanism(W, "optimized", noise=noise, **budget)
    x = _x(4)
    truth = np.concatenate([x.reshape(DIMS).sum(axis=tuple(i for i in range(3) if i not in S)).ravel()
                            for S in W.marginals])
    runs = 400
    err = np.empty((runs, truth.size))
    for i in range(runs):
        rel = mm.run(x, rng=1000 + i).to_release()
        err[i] = rel.answers - truth
    exact = np.asarray(rel.variances)
    assert np.all(np.abs(err.mean(axis=0)) < 5 * np.sqrt(exact / runs))  # unbiased
    ratio = err.var(axis=0).mean() / exact.mean()
    assert 0.9 < ratio < 1.1  # 400 x 26 cells: the mean of the variance ratio is within a few %
    # the plan's report: the variances of the noise that runs, before anything is drawn
    np.testing.assert_allclose(mm.error_report().variances, exact, rtol=1e-12)


def test_mismatches_are_refused_before_anything_is_charged():
    W = workloads.marginals(DIMS, k=2)
    S = sparsedp.optimize(W, noise="gaussian", rho=1.0)
    with pytest.raises(SparseDPError, match="optimised for gaussian"):
        sparsedp.MatrixMechanism(W, S, epsilon=1.0)
    with pytest.raises(SparseDPError, match="residual strategy"):
        sparsedp.MatrixMechanism(W, S.strategy, epsilon=1.0)
    with pytest.raises(SparseDPError, match="another workload"):
        sparsedp.MatrixMechanism(workloads.marginals(DIMS, k=1), S, noise="gaussian", rho=1.0)
    with pytest.raises(SparseDPError, match="not one"):
        sparsedp.MatrixMechanism(workloads.prefix(24), S, noise="gaussian", rho=1.0)
    with pytest.raises(SparseDPError, match="marginal workload is measured"):
        sparsedp.MatrixMechanism(marginal_workload(Domain(["a", "b", "c"], list(DIMS)), k=2),
                                 sparsedp.strategies.identity(24), epsilon=1.0)
    acc = Accountant(rho=1.0)
    mm = sparsedp.MatrixMechanism(W, S, noise="gaussian", rho=0.5, accountant=acc)
    for call in (lambda: mm.run(_x(), method="nnls"), lambda: mm.measure(_x()), lambda: mm.variances(),
                 lambda: mm.run(-_x()), lambda: mm.run(_x()[:5]), lambda: mm.run(np.full(24, np.nan))):
        with pytest.raises(SparseDPError):
            call()
    assert not acc.ledger
