"""sparsedp.marginals: Kronecker operators, residual basis, ResidualPlanner's optimum, releases."""

from __future__ import annotations

import dataclasses
import math
from itertools import combinations

import numpy as np
import pytest
import scipy.sparse as sp
from _marginal_draws import marginal_releases

import sparsedp
from sparsedp.errors import (InputBoundError, InvalidPrivacyParameterError, NonFiniteInputError, ShapeError,
                             BudgetExceededError, SparseDPError)
from sparsedp.marginals import (Domain, KronOperator, KronStack, contrast_basis, marginal_operator, marginal_tables,
                                marginals_up_to, release_marginals, residual_operator, select_residuals)
from sparsedp.marginals.residual import residual_to_marginal


def _full_counts(X, dom):
    """The full-domain count vector (tests only: small domains)."""
    code = np.ravel_multi_index(tuple(X[:, i].astype(np.intp) for i in range(len(dom))), dom.sizes)
    return np.bincount(code, minlength=dom.size).astype(float)


# -- Kronecker operators ------------------------------------------------------------------------

def test_kron_operator_equals_explicit_kron():
    rng = np.random.default_rng(0)
    A, B, C = rng.normal(size=(2, 3)), sp.random(4, 4, density=0.5, random_state=1), rng.normal(size=(3, 2))
    K = KronOperator([A, B, C])
    E = np.kron(np.kron(A, B.toarray()), C)
    x, y = rng.normal(size=E.shape[1]), rng.normal(size=E.shape[0])
    assert K.shape == E.shape
    np.testing.assert_allclose(K.matvec(x), E @ x, atol=1e-12)
    np.testing.assert_allclose(K.rmatvec(y), E.T @ y, atol=1e-12)
    np.testing.assert_allclose(K.T.matvec(y), E.T @ y, atol=1e-12)
    X = rng.normal(size=(E.shape[1], 3))
    np.testing.assert_allclose(K.matmat(X), E @ X, atol=1e-12)
    np.testing.assert_allclose(K.tosparse().toarray(), E, atol=1e-14)
    for p in (1, 2):
        norms = np.abs(E).sum(0) if p == 1 else np.sqrt((E * E).sum(0))
        np.testing.assert_allclose(K.column_norms(p), norms, rtol=1e-12)
        assert K.sensitivity(p) == pytest.approx(norms.max(), rel=1e-12)
    assert K.frobenius_sq() == pytest.approx((E * E).sum(), rel=1e-12)
    np.testing.assert_allclose(K.pinv().tosparse().toarray(), np.linalg.pinv(E), atol=1e-10)


def test_marginal_operator_and_stack():
    dom = Domain(["a", "b", "c"], [2, 3, 4])
    rng = np.random.default_rng(1)
    x = rng.integers(0, 5, dom.size).astype(float)
    W = marginal_operator(dom, ["a", "c"])
    np.testing.assert_allclose(W.matvec(x), x.reshape(2, 3, 4).sum(axis=1).ravel())
    stack = KronStack([marginal_operator(dom, S) for S in [("a", "b"), ("b", "c"), ("a", "c")]])
    E = stack.tosparse().toarray()
    np.testing.assert_allclose(stack.matvec(x), E @ x)
    np.testing.assert_allclose(stack.rmatvec(np.arange(E.shape[0], dtype=float)), E.T @ np.arange(E.shape[0]))
    for p in (1, 2):  # marginals have constant column norms: the stack's sensitivity is exact
        norms = np.abs(E).sum(0) if p == 1 else np.sqrt((E * E).sum(0))
        assert stack.sensitivity(p) == pytest.approx(norms.max(), rel=1e-12)
    assert stack.sensitivity(1) == 3 and stack.sensitivity(2) == pytest.approx(math.sqrt(3))


# -- residual basis -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 17])
def test_contrast_basis_orthonormal_and_orthogonal_to_ones(n):
    Q = contrast_basis(n).toarray()
    assert Q.shape == (n - 1, n)
    np.testing.assert_allclose(Q @ Q.T, np.eye(n - 1), atol=1e-12)
    np.testing.assert_allclose(Q @ np.ones(n), 0, atol=1e-12)
    np.testing.assert_allclose(Q.T @ Q, np.eye(n) - 1.0 / n, atol=1e-12)


def test_residuals_decompose_marginals():
    """W_S = sum_{A subset S} K_{S,A} R_A on the full domain, checked with explicit matrices."""
    dom = Domain(["a", "b", "c"], [2, 3, 4])
    x = np.random.default_rng(2).integers(0, 9, dom.size).astype(float)
    t = x.reshape(dom.sizes)
    for S in [(0, 1), (1, 2), (0, 1, 2), (2,)]:
        out = np.zeros(dom.shape(S))
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                tA = t.sum(axis=tuple(i for i in range(3) if i not in A))
                rA = residual_operator(dom.shape(A)).matvec(tA.ravel())
                residual_to_marginal(rA, dom.shape(S), tuple(S.index(i) for i in A), out)
        np.testing.assert_allclose(out, t.sum(axis=tuple(i for i in range(3) if i not in S)), atol=1e-9)


# -- selection: ResidualPlanner's optimum --------------------------------------------------------

@pytest.mark.parametrize("sizes, k, exact, value", [
    ([4] * 8, 2, True, 6431.620),
    ([4, 5, 6, 7, 8, 9, 10, 10], 2, True, 28050.956),
    ([10] * 20, 2, True, 2.620638e6),
    ([10] * 20, 3, False, 8.398599e8),
])
def test_selection_reproduces_residualplanner(sizes, k, exact, value):
    """The issue's figures (ResidualPlanner, rho = 1/2, sum of all cells' variances, unit weights),
    given to 7 significant digits there: equal to that precision."""
    dom = Domain([f"a{i}" for i in range(len(sizes))], sizes)
    sel = select_residuals(dom, marginals_up_to(dom, k, exact), 0.5)
    assert sel.value == pytest.approx(value, rel=6e-7)
    assert sel.sum_of_variances() == pytest.approx(sel.value, rel=1e-10)
    assert float(np.sum(sel.p / (2 * sel.sigma2))) <= 0.5


def test_selection_is_optimal_against_perturbations_and_dense_formula():
    dom = Domain(["a", "b", "c"], [2, 3, 4])
    ms = [(0, 1), (1, 2), (0, 2)]
    w = np.array([1.0, 3.0, 0.5])
    sel = select_residuals(dom, ms, 0.7, weights=w)
    # dense check of the variance formula: explicit strategy, explicit W, trace of W R^+ V R^+T W^T
    R = sp.vstack([KronOperator([contrast_basis(n) if i in A else np.ones((1, n))
                                 for i, n in enumerate(dom.sizes)]).tosparse() for A in sel.residuals]).toarray()
    V = np.concatenate([np.full(R_rows, s2) for R_rows, s2 in
                        zip([math.prod(dom.sizes[i] - 1 for i in A) for A in sel.residuals], sel.sigma2)])
    Rp = np.linalg.pinv(R)
    total = 0.0
    for S, wS in zip(ms, w):
        Wd = marginal_operator(dom, S).tosparse().toarray()
        B = Wd @ Rp
        total += wS * np.trace(B @ np.diag(V) @ B.T)
        assert np.trace(B @ np.diag(V) @ B.T) / Wd.shape[0] == pytest.approx(sel.cell_variance(S), rel=1e-9)
    assert total == pytest.approx(sel.value, rel=1e-9)
    # privacy: the largest column of R^T V^-1 R / 2 is rho
    loss = (R * R / V[:, None]).sum(0) / 2
    assert loss.max() == pytest.approx(0.7, rel=1e-12) and loss.min() == pytest.approx(0.7, rel=1e-12)
    # any other feasible choice (random, rescaled onto the budget) is no better
    rng = np.random.default_rng(3)
    for _ in range(20):
        s2 = sel.sigma2 * np.exp(rng.normal(scale=0.3, size=sel.sigma2.size))
        s2 *= np.sum(sel.p / (2 * s2)) / 0.7
        c = [sum(wS * math.prod(dom.sizes[i] - 1 if i in A else 1 for i in S) /
                 math.prod(dom.sizes[i] for i in S if i not in A) for S, wS in zip(ms, w) if set(A) <= set(S))
             for A in sel.residuals]
        assert float(np.dot(c, s2)) >= sel.value * (1 - 1e-12)


def test_selection_max_objective_not_worse_than_sum_on_max():
    dom = Domain([f"a{i}" for i in range(5)], [2, 3, 4, 5, 6])
    ms = marginals_up_to(dom, 2, exact=True)
    s_sum = select_residuals(dom, ms, 0.5)
    s_max = select_residuals(dom, ms, 0.5, objective="max")
    assert s_max.max_variance() < 0.7 * s_sum.max_variance()
    assert float(np.sum(s_max.p / (2 * s_max.sigma2))) <= 0.5
    # a local search (the problem is convex in 1 / sigma^2) cannot improve on it
    from scipy.optimize import minimize

    def f(z):  # max variance x budget used: scale invariant
        s = dataclasses.replace(s_max, sigma2=np.exp(z))
        return math.log(s.max_variance()) + math.log(float(np.sum(s.p / (2 * np.exp(z)))) / 0.5)

    r = minimize(f, np.log(s_max.sigma2), method="Powell", options={"maxiter": 3000})
    assert math.exp(r.fun) >= s_max.max_variance() * (1 - 1e-7)


# -- releases -----------------------------------------------------------------------------------

def _small():
    dom = Domain(["a", "b", "c", "d"], [2, 3, 4, 2])
    X = np.random.default_rng(5).integers(0, dom.sizes, size=(300, 4))
    return dom, X


def test_neighbouring_relation_and_tables():
    """Adding one record changes every marginal table by exactly one unit in one cell."""
    dom, X = _small()
    sets = [(), (0,), (1, 2), (0, 1, 3), (0, 1, 2, 3)]
    t0 = marginal_tables(X, dom, sets)
    x = _full_counts(X, dom).reshape(dom.sizes)
    for A in sets:
        np.testing.assert_array_equal(t0[A], x.sum(axis=tuple(i for i in range(4) if i not in A)))
    t1 = marginal_tables(np.vstack([X, [[1, 2, 3, 0]]]), dom, sets)
    for A in sets:
        d = t1[A] - t0[A]
        assert d.sum() == 1 and np.abs(d).sum() == 1


def test_sensitivity_brute_force():
    """Over every possible added record, sum_A ||Q_A (t_A' - t_A)||^2 / sigma_A^2 / 2 equals the
    charged rho (every column of every residual has the same norm), and the plans certify it."""
    dom, X = _small()
    ms = [(0, 1), (1, 2, 3), (0, 3)]
    rel = release_marginals(X, dom, ms, 0.3, rng=0)
    sel = rel.selection
    base = marginal_tables(X, dom, list(sel.residuals))
    losses = []
    for cell in np.ndindex(*dom.sizes):
        t1 = marginal_tables(np.vstack([X, [cell]]), dom, list(sel.residuals))
        loss = 0.0
        for A, s2 in zip(sel.residuals, sel.sigma2):
            d = residual_operator(dom.shape(A)).matvec((t1[A] - base[A]).ravel())
            loss += float(d @ d) / (2 * s2)
        losses.append(loss)
    assert max(losses) == pytest.approx(0.3, rel=1e-9) and min(losses) == pytest.approx(0.3, rel=1e-9)
    assert rel.loss <= 0.3 and rel.loss == pytest.approx(0.3, rel=1e-4)


def test_release_reconstruction_equals_dense_gls():
    dom, X = _small()
    ms = [(0, 1), (1, 2), (2, 3), (0, 3)]
    rel = release_marginals(X, dom, ms, 1.0, rng=11)
    sel = rel.selection
    # dense GLS over the full domain from the same noisy residuals
    R = sp.vstack([KronOperator([contrast_basis(n) if i in A else np.ones((1, n))
                                 for i, n in enumerate(dom.sizes)]).tosparse() for A in sel.residuals]).toarray()
    y = np.concatenate([rel.residuals[A] for A in sel.residuals])
    v = np.concatenate([np.full(rel.residuals[A].size, rel.residual_variances[A]) for A in sel.residuals])
    G = R.T @ (R / v[:, None])
    xhat = np.linalg.pinv(G) @ (R.T @ (y / v))
    for S in ms:
        Wd = marginal_operator(dom, S).tosparse().toarray()
        key = tuple(dom.names[i] for i in S)
        np.testing.assert_allclose(rel.marginals[key].ravel(), Wd @ xhat, atol=1e-6)
        B = Wd @ np.linalg.pinv(R)
        dense_var = np.diag(B @ np.diag(v) @ B.T)
        np.testing.assert_allclose(dense_var, rel.variances[key], rtol=1e-9)
    # sub-marginals of the workload are answered too
    np.testing.assert_allclose(rel.marginal(["b"]), rel.marginals[("a", "b")].sum(axis=0), atol=1e-8)


def test_reported_variances_match_empirical():
    dom, X = _small()
    ms = [(0, 1, 2), (1, 2, 3)]
    truth = {S: _full_counts(X, dom).reshape(dom.sizes).sum(axis=tuple(i for i in range(4) if i not in S))
             for S in ms}
    # 24 cells x 400 releases: the variance estimate's std error ~1.4% (was 120 release_marginals
    # calls, ~2.6%).  The releases: one real release's plans measured 400 times by their batched
    # release and reconstructed by the release's own step (tests/_marginal_draws.py; the real
    # release is checked to be that reconstruction of what its plans drew)
    rel, tabs, _ = marginal_releases(400, 7, X, dom, ms, 0.05)
    errs = {S: tabs[tuple(dom.names[i] for i in S)] - truth[S].ravel() for S in ms}
    for S in ms:
        e = np.array(errs[S])
        assert abs(e.mean()) < 4 * math.sqrt(rel.variances[tuple(dom.names[i] for i in S)] / e.size)
        assert np.mean(e * e) == pytest.approx(rel.variances[tuple(dom.names[i] for i in S)], rel=0.10)


def test_secure_release_charges_once_and_is_exact_noise():
    dom, X = _small()
    acc = sparsedp.Accountant(rho=1.0)
    rel = release_marginals(X, dom, [(0, 1), (2, 3)], 0.4, accountant=acc)
    assert rel.secure and rel.private
    assert len(acc.ledger) == 1 and acc.spent == pytest.approx(0.4)
    assert acc.ledger[0].cost.rho == 0.4 and acc.ledger[0].noise == "gaussian"
    with pytest.raises(BudgetExceededError):
        release_marginals(X, dom, [(0, 1)], 0.7, accountant=acc)
    assert len(acc.ledger) == 1
    # the realised sum of variances is the optimum within the fine grid's slack
    assert rel.sum_of_variances() == pytest.approx(rel.selection.value, rel=1e-4)
    assert rel.sum_of_variances() >= rel.selection.value * (1 - 1e-12)


@pytest.mark.parametrize("bad, err", [
    (lambda X: np.vstack([X, [[2, 0, 0, 0]]]), InputBoundError),  # code out of range
    (lambda X: np.vstack([X, [[-1, 0, 0, 0]]]), InputBoundError),
    (lambda X: np.vstack([X.astype(float), [[np.nan, 0, 0, 0]]]), NonFiniteInputError),
    (lambda X: X[:, :3], ShapeError),
    (lambda X: X.ravel(), ShapeError),
    (lambda X: X + 0.5, InputBoundError),
])
def test_bad_records_raise_before_noise(bad, err):
    dom, X = _small()
    acc = sparsedp.Accountant(rho=1.0)
    with pytest.raises(err):
        release_marginals(bad(X), dom, [(0, 1)], 0.5, accountant=acc)
    assert acc.ledger == ()


@pytest.mark.parametrize("rho", [0, -1, float("nan"), float("inf"), "1"])
def test_bad_rho_raises(rho):
    dom, X = _small()
    acc = sparsedp.Accountant(rho=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        release_marginals(X, dom, [(0, 1)], rho, accountant=acc)
    assert acc.ledger == ()


def test_bad_workload_and_records_bound():
    dom, X = _small()
    with pytest.raises(ShapeError):
        release_marginals(X, dom, [("a", "z")], 0.5)
    with pytest.raises(ShapeError):
        release_marginals(X, dom, [("a", "a")], 0.5)
    with pytest.raises(InputBoundError, match="max_records=100") as info:
        release_marginals(X, dom, [("a",)], 0.5, max_records=100)
    assert str(X.shape[0]) not in str(info.value)  # the bound, never the number of records
    with pytest.raises(SparseDPError):
        select_residuals(dom, [(0, 1)], 0.5, objective="median")
    acc = sparsedp.Accountant(rho=1.0)
    with pytest.raises(InvalidPrivacyParameterError):  # a zero weight leaves (2, 3) unanswerable
        release_marginals(X, dom, [(0, 1), (2, 3)], 0.5, weights=[1, 0], accountant=acc)
    assert acc.ledger == ()


def test_structured_and_dataframe_records():
    dom, X = _small()
    rec = np.zeros(X.shape[0], dtype=[(n, "i4") for n in dom.names])
    for i, n in enumerate(dom.names):
        rec[n] = X[:, i]
    np.testing.assert_array_equal(dom.encode(rec), X)
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(X, columns=dom.names)
    df["a"] = pd.Categorical.from_codes(X[:, 0], ["x", "y"])
    np.testing.assert_array_equal(dom.encode(df), X)
    df.loc[0, "a"] = None
    with pytest.raises(NonFiniteInputError):
        dom.encode(df)


def test_block_plans_charge_every_stacked_table():
    """On a uniform domain the residuals of one order share a scale and are measured in block
    plans I_m (x) Q_A: the certified loss must still be the brute-forced sum over residuals."""
    dom = Domain.uniform(5, 3)
    work = marginals_up_to(dom, 2, exact=True)
    rel = release_marginals(np.zeros((10, 5), dtype=np.int64), dom, work, 0.25, rng=1)
    sel = rel.selection
    exact = float(np.sum(sel.p / (2 * sel.sigma2)))
    assert exact == pytest.approx(0.25, rel=1e-12)
    assert rel.loss <= 0.25 and rel.loss == pytest.approx(0.25, rel=1e-4)
    # a block plan was used: some residual vectors come from one measurement
    from sparsedp.marginals.release import _plans
    plans, total = _plans(sel, sel.sigma2, True, 2.0**-25)
    assert any(len(chunk) > 1 for _, chunk in plans)
    assert float(total) == pytest.approx(sum(len(c) * p.loss for p, c in plans), rel=1e-12)
    assert float(total) == pytest.approx(exact, rel=1e-5) and float(total) >= exact


def test_tables_cover_any_block_size():
    dom = Domain([f"a{i}" for i in range(6)], [2, 3, 2, 4, 3, 2])
    X = np.random.default_rng(9).integers(0, dom.sizes, size=(500, 6))
    sets = [A for A in __import__("sparsedp").marginals.closure(marginals_up_to(dom, 3))]
    ref = marginal_tables(X, dom, sets, max_cells=1)
    for cells in (8, 64, 10**6):
        got = marginal_tables(X, dom, sets, max_cells=cells, chunk=77)
        for A in sets:
            np.testing.assert_array_equal(got[A], ref[A])


def test_synthetic_records_are_valid_and_reproducible():
    from sparsedp.marginals import synthetic_records

    dom = Domain([f"a{i}" for i in range(4)], [2, 5, 7, 3])
    X = synthetic_records(dom, 1000, rng=3)
    np.testing.assert_array_equal(X, synthetic_records(dom, 1000, rng=3))
    assert X.shape == (1000, 4) and np.array_equal(dom.encode(X), X)
    assert (X.max(axis=0) < np.array(dom.sizes)).all()


def test_kron_strategy_error_equals_dense_formula():
    from sparsedp import workloads as wl
    from sparsedp.optimize import optimize_kron

    W1, W2 = wl.all_ranges(6), wl.prefix(5)
    k = optimize_kron([W1, W2], family="templates")
    W = np.kron(W1.tosparse().toarray(), W2.tosparse().toarray())
    M = k.strategy.tosparse().toarray()
    B = W @ np.linalg.pinv(M)
    d1 = np.abs(M).sum(0).max()
    assert k.sensitivity == pytest.approx(d1, rel=1e-12)
    assert k.total_error(epsilon=0.5) == pytest.approx(2 * d1**2 / 0.25 * (B * B).sum(), rel=1e-9)
    assert k.rmse(epsilon=0.5) == pytest.approx(math.sqrt(k.total_error(epsilon=0.5) / W.shape[0]))
    g = optimize_kron([W1, W1], noise="gaussian", family="templates")
    M = g.strategy.tosparse().toarray()
    Wg = np.kron(W1.tosparse().toarray(), W1.tosparse().toarray())
    B = Wg @ np.linalg.pinv(M)
    d2 = np.sqrt((M * M).sum(0)).max()
    assert g.total_error(rho=0.3) == pytest.approx(d2**2 / 0.6 * (B * B).sum(), rel=1e-9)
    with pytest.raises(SparseDPError):
        g.total_error(epsilon=1.0)


def test_pure_dp_weighted_marginals_error_equals_dense():
    from sparsedp.marginals import optimize_marginals_laplace

    dom = Domain(["a", "b", "c", "d"], [2, 3, 2, 3])
    ms = marginals_up_to(dom, 2, exact=True)
    s = optimize_marginals_laplace(dom, ms, 0.5, restarts=2)
    W = np.vstack([marginal_operator(dom, S).tosparse().toarray() for S in ms])
    M = np.vstack([th * marginal_operator(dom, S).tosparse().toarray() for S, th in zip(s.measured, s.weights)])
    d1 = np.abs(M).sum(0).max()
    assert d1 == pytest.approx(1.0)  # weights sum to 1: Delta_1 = sum theta
    B = W @ np.linalg.pinv(M)
    assert np.allclose(B @ M, W, atol=1e-8)  # the strategy answers the workload
    assert s.total_error == pytest.approx(2 * d1**2 / 0.25 * (B * B).sum(), rel=1e-8)
    ident = 2 / 0.25 * (W * W).sum()  # the identity (the full table) is one of the candidates
    assert s.total_error <= ident * (1 + 1e-9)


def test_one_sampler_scale_for_the_whole_release():
    """Heterogeneous sizes give many sigma_A; the grids sigma_A / 2^k give every plan the same
    sampler scale (one exact-sampler table), grids no finer than the magnitude grid."""
    from sparsedp.marginals.release import _grid, _plans

    dom = Domain([f"a{i}" for i in range(5)], [2, 3, 5, 7, 4])
    sel = select_residuals(dom, marginals_up_to(dom, 2, exact=True), 0.5)
    assert np.unique(sel.sigma2).size > 5
    g = _grid(2**24)
    plans, total = _plans(sel, sel.sigma2, True, g)
    units = {float(p.unit_scales[0]) for p, _ in plans}
    assert len(units) == 1 and all(np.all(p.unit_scales == p.unit_scales[0]) for p, _ in plans)
    assert all(p.grid >= g for p, _ in plans)
    assert float(total) == pytest.approx(float(np.sum(sel.p / (2 * sel.sigma2))), rel=1e-5)


def test_pure_dp_release_is_dense_gls_and_charged_once():
    from sparsedp.marginals import optimize_marginals_laplace
    from sparsedp.marginals.pure_release import release_marginals_laplace

    dom = Domain(["a", "b", "c"], [2, 3, 4])
    ms = marginals_up_to(dom, 2, exact=True)
    strat = optimize_marginals_laplace(dom, ms, 2.0, restarts=1)
    strat = strat.__class__(**{**strat.__dict__, "measured": ((0, 1), (0, 2), (1, 2), (0, 1, 2)),
                               "weights": np.array([0.2, 0.3, 0.1, 0.4])})  # several tables, weights sum 1
    X = np.random.default_rng(4).integers(0, dom.sizes, size=(200, 3))
    acc = sparsedp.Accountant(epsilon=3.0)
    rel = release_marginals_laplace(X, strat, accountant=acc, rng=3)
    assert len(acc.ledger) == 1 and acc.ledger[0].cost.epsilon == 2.0 and rel.loss <= 2.0
    assert rel.loss == pytest.approx(2.0, rel=1e-9)
    # dense GLS over the full domain with the exact discrete Laplace variances of each table
    Ms, vs = [], []
    for S, th in zip(strat.measured, strat.weights):
        Wd = marginal_operator(dom, S).tosparse().toarray()
        Ms.append(Wd)
        vs.append(np.full(Wd.shape[0], sparsedp.noise.discrete_laplace_variance(1.0 / (th * 2.0))))
    M = np.vstack(Ms)
    v = np.concatenate(vs)
    G = np.linalg.pinv(M.T @ (M / v[:, None]))
    y = np.concatenate([rel.measurements[S][0].ravel() for S in strat.measured])
    xhat = G @ (M.T @ (y / v))
    for S in ms:
        Wd = marginal_operator(dom, S).tosparse().toarray()
        np.testing.assert_allclose(rel.marginals[tuple(dom.names[i] for i in S)].ravel(), Wd @ xhat, atol=1e-8)
        dense = np.diag(Wd @ G @ Wd.T)
        key = tuple(dom.names[i] for i in S)
        np.testing.assert_allclose(dense, rel.variances[key], rtol=1e-6)
    with pytest.raises(InputBoundError):
        release_marginals_laplace(np.vstack([X, [[0, 0, 9]]]), strat, accountant=acc)
    assert len(acc.ledger) == 1


def test_nonnegative_marginals_consistent_and_closer():
    from sparsedp.marginals import nonnegative_marginals, synthetic_records
    from sparsedp.marginals.nonneg import _adjoint, _forward, _groups

    dom = Domain([f"a{i}" for i in range(5)], [3, 4, 5, 2, 6])
    X = synthetic_records(dom, 300, rng=0)
    rel = release_marginals(X, dom, marginals_up_to(dom, 2, exact=True), 0.05, rng=1)
    g = _groups(rel)
    rng = np.random.default_rng(0)
    r = {A: rng.standard_normal(v.shape) for A, v in rel.residuals.items()}
    lam = {S: rng.standard_normal(dom.shape(S)) for S in rel.selection.marginals}
    f, a = _forward(rel, g, r), _adjoint(rel, g, lam)  # the adjoint is the adjoint
    assert sum(float(np.sum(f[S] * lam[S])) for S in lam) == pytest.approx(
        sum(float(np.sum(r[A] * a[A])) for A in r), rel=1e-10)
    assert min(float(t.min()) for t in rel.marginals.values()) < -1  # something to fix
    nn = nonnegative_marginals(rel, iters=3000, tol=1e-6)
    assert nn.max_violation <= 1e-6
    assert all(t.min() >= -1e-6 for t in nn.marginals.values())
    # consistent: every 2-way marginal containing a0 gives the same a0 marginal
    a0 = [nn.marginals[k].sum(axis=1) for k in nn.marginals if k[0] == "a0"]
    for m in a0[1:]:
        np.testing.assert_allclose(m, a0[0], atol=1e-8)
    truth = marginal_tables(X, dom, list(rel.selection.marginals))
    err = lambda ms: sum(float(np.sum((ms[tuple(dom.names[i] for i in S)] - truth[S]) ** 2))  # noqa: E731
                         for S in rel.selection.marginals)
    assert err(nn.marginals) < err(rel.marginals)
    # a release with no negative cell is returned unchanged
    big = release_marginals(synthetic_records(dom, 20000, rng=0), dom, [(0, 1)], 10.0, rng=1)
    same = nonnegative_marginals(big)
    assert same.iterations == 0 and np.array_equal(same.marginals[("a0", "a1")], big.marginals[("a0", "a1")])


def test_cell_variances_of_many_marginals_equal_one_at_a_time():
    """The vectorised per-marginal variances (one pass, one residual index) equal the one-marginal
    formula, and the sum / max over the workload use them."""
    dom = Domain([f"a{i}" for i in range(6)], [2, 3, 4, 2, 5, 3])
    ms = marginals_up_to(dom, 3, exact=False)
    sel = select_residuals(dom, ms, 0.7)
    many = sel.cell_variances(ms)
    one = np.array([sel.cell_variance(S) for S in ms])
    np.testing.assert_allclose(many, one, rtol=1e-14)
    cells = np.array([math.prod(dom.sizes[i] for i in S) for S in ms])
    assert sel.sum_of_variances() == pytest.approx(float(np.dot(one, cells)), rel=1e-13)
    assert sel.max_variance() == float(one.max())
    assert sel.index() == {A: i for i, A in enumerate(sel.residuals)}


def test_wide_domains_weight_the_workloads_closure_only():
    # above FULL_MAX_D attributes the Laplace strategy weights the workload's downward closure; on
    # a small domain the closure objective equals the full one for weights on the closure
    import math as _m

    from sparsedp.marginals import pure as P
    from sparsedp.marginals.select import closure as _closure

    dom = Domain(["a", "b", "c", "d"], [3, 2, 4, 1])
    ms = [(0, 1), (1, 2), (3,)]
    full_sub, E, c = P._setup(dom, ms)
    clo_sub, Ec, cc = P._setup_closure(dom, ms)
    assert set(clo_sub) == set(_closure(ms))
    rng = np.random.default_rng(0)
    theta_c = rng.random(len(clo_sub)) + 0.1
    theta_f = np.array([theta_c[clo_sub.index(S)] if S in clo_sub else 0.0 for S in full_sub])
    assert P._objective(theta_c, Ec, cc)[0] == pytest.approx(P._objective(theta_f, E, c)[0], rel=1e-12)
    wide = Domain([f"x{i}" for i in range(P.FULL_MAX_D + 4)], [5] * (P.FULL_MAX_D + 4))
    s = P.optimize_marginals_laplace(wide, marginals_up_to(wide, 2, exact=True), 1.0)
    assert all(len(S) <= 2 for S in s.measured) and _m.isfinite(s.total_error) and s.total_error > 0


def test_out_of_domain_codes_are_located_not_shown():
    """A code outside its attribute's domain names the attribute and the record, not the code (nor
    the column's minimum and maximum, which the message used to print)."""
    dom = Domain(["a", "b"], [2, 3])
    X = np.array([[0, 1], [1, 2], [0, 977], [1, 0]])
    with pytest.raises(InputBoundError, match="record 2") as info:
        release_marginals(X, dom, [("a",)], 0.5)
    assert "977" not in str(info.value) and "'b'" in str(info.value)
