import sparsedp
import numpy as np
import pytest
from _coverage import assert_certified_coverage, assert_default_coverage
from _mechanism_draws import mechanism_answers

from sparsedp import (
    Accountant,
    BudgetExceededError,
    FractionalCountError,
    InvalidPrivacyParameterError,
    MatrixMechanism,
    NegativeCountError,
    NonFiniteInputError,
    ShapeError,
    SparseDPError,
    reconstruct,
)
from sparsedp import noise as noise_module
from sparsedp import strategies as st
from sparsedp import workloads as wl


def test_seed_000_expected_error_is_32():
    # the seed's continuous Laplace noise (exact discrete noise, the default, gives 31.34)
    assert MatrixMechanism(wl.prefix(3), st.fenwick(3), epsilon=1, secure=False).expected_error() == 32
    assert MatrixMechanism(wl.prefix(3), st.fenwick(3), epsilon=1).expected_error() == pytest.approx(31.3416, abs=1e-4)


def test_calibration_laplace_and_gaussian():
    M = st.hierarchical(64, 2)  # 7 levels
    lap = MatrixMechanism(wl.prefix(64), M, epsilon=0.5, secure=False)
    assert lap.sensitivity == 7 and lap.noise_scale() == 14
    np.testing.assert_allclose(lap.variances(), 2 * 14.0**2)
    gau = MatrixMechanism(wl.prefix(64), M, rho=0.5, noise="gaussian", secure=False)
    assert gau.sensitivity == pytest.approx(np.sqrt(7))
    assert gau.noise_scale() == pytest.approx(np.sqrt(7) / np.sqrt(2 * 0.5))


@pytest.mark.parametrize("strategy", [st.identity(64), st.hierarchical(64, 2), st.fenwick(64)], ids=repr)
def test_empirical_error_matches_expected(strategy):
    mech = MatrixMechanism(wl.prefix(64), strategy, epsilon=1.0)
    x = np.random.default_rng(0).integers(0, 50, 64)
    truth = np.cumsum(x)
    # 2000 independent mech.run(x): the plan's batched release answered by the mechanism's own
    # reconstruction as a linear map (tests/_mechanism_draws.py, checked against run first)
    errs = np.sum((mechanism_answers(mech, x, 2000, 12345) - truth) ** 2, axis=1)
    expected = mech.expected_error()
    assert np.mean(errs) == pytest.approx(expected, rel=0.10)


def test_gaussian_empirical_variance():
    mech = MatrixMechanism(wl.identity(50), st.identity(50), rho=0.125, noise="gaussian")
    x = np.zeros(50)
    ys = np.array([mech.measure(x, rng=i).y for i in range(400)])
    assert ys.var() == pytest.approx(mech.noise_scale() ** 2, rel=0.05)  # sigma = 1 / sqrt(0.25) = 2


def test_measurement_is_frozen_and_reconstructs():
    mech = MatrixMechanism(wl.prefix(8), st.haar(8), epsilon=1.0)
    meas = mech.measure(np.arange(8), rng=0)
    with pytest.raises(AttributeError):
        meas.y = None  # type: ignore[misc]
    assert meas.cost.epsilon == 1.0 and meas.sensitivity == 4
    assert reconstruct(meas).x.shape == (8,)


class Tripwire:
    """Records whether noise was drawn."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = noise_module.noise

        def counting(*args, **kwargs):
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(noise_module, "noise", counting)


@pytest.mark.parametrize(
    "x,err",
    [
        (np.array([1.0, np.nan, 2.0, 3.0]), NonFiniteInputError),
        (np.array([1.0, np.inf, 2.0, 3.0]), NonFiniteInputError),
        (np.array([1.0, 2.0, 3.0]), ShapeError),
        (np.ones((2, 2)), ShapeError),
        (np.array([1.0, -2.0, 2.0, 3.0]), NegativeCountError),
        (np.array([1.0, 0.5, 2.0, 3.0]), FractionalCountError),
        (["1", "2", "3", "4"], ShapeError),  # numeric text is text, not counts
    ],
)
def test_bad_data_raises_before_noise_and_budget(monkeypatch, x, err):
    trip = Tripwire(monkeypatch)
    acc = Accountant(epsilon=1.0)
    mech = MatrixMechanism(wl.prefix(4), st.fenwick(4), epsilon=0.5, accountant=acc)
    with pytest.raises(err):
        mech.measure(x, rng=0)
    assert trip.calls == 0 and acc.spent == 0


def test_budget_refused_before_noise(monkeypatch):
    trip = Tripwire(monkeypatch)
    acc = Accountant(epsilon=1.0)
    mech = MatrixMechanism(wl.prefix(4), st.fenwick(4), epsilon=0.4, accountant=acc)
    mech.measure(np.ones(4), rng=0)
    mech.measure(np.ones(4), rng=1)
    assert trip.calls == 2
    with pytest.raises(BudgetExceededError):
        mech.measure(np.ones(4), rng=2)
    assert trip.calls == 2 and acc.spent == pytest.approx(0.8)


@pytest.mark.parametrize("eps", [0, -1, float("nan"), float("inf"), None])
def test_bad_epsilon(eps):
    with pytest.raises(InvalidPrivacyParameterError):
        MatrixMechanism(wl.prefix(4), st.fenwick(4), epsilon=eps)


def test_bad_parameters():
    with pytest.raises(ShapeError):
        MatrixMechanism(wl.prefix(4), st.fenwick(5), epsilon=1)
    with pytest.raises(InvalidPrivacyParameterError):
        MatrixMechanism(wl.prefix(4), st.fenwick(4), noise="gaussian", epsilon=1)  # no delta
    with pytest.raises(ValueError):
        MatrixMechanism(wl.prefix(4), st.fenwick(4), epsilon=1, noise="cauchy")


def test_secure_mode_integer_grid():
    mech = MatrixMechanism(wl.prefix(16), st.fenwick(16), epsilon=1.0, secure=True)
    x = np.random.default_rng(1).integers(0, 9, 16)
    ys = np.array([mech.measure(x, rng=i).y for i in range(300)])
    assert np.all(ys == np.round(ys))  # integers: no floating-point low bits to leak
    resid = ys - st.fenwick(16).matvec(x)
    t = 5.0  # Delta_1 = floor(log2 16) + 1 = 5 at eps = 1
    q = np.exp(-1 / t)
    assert mech.variances()[0] == pytest.approx(2 * q / (1 - q) ** 2)
    assert resid.var() == pytest.approx(mech.variances()[0], rel=0.1)


def test_secure_mode_rounding_grid_inflates_sensitivity():
    M = 0.5 * np.eye(4)  # a plain matrix: no integer form is known (st.weighted would give one)
    mech = MatrixMechanism(wl.identity(4), M, epsilon=1.0, secure=True, grid=1.0)
    # 0.5 x is not integral: rounding may move a row by one more unit.  The integer change of a
    # row is at most ceil(0.5) + 1 = 2 (ceil: float error in M x cannot push it past that)
    assert mech._grid_sensitivity == 2.0


def test_low_rank_form_of_seed_000():
    """With a square strategy, GLS answers are the low-rank mechanism's B (M x + noise), B = W M^-1."""
    n = 37
    mech = MatrixMechanism(wl.prefix(n), st.fenwick(n), epsilon=1.0)
    x = np.random.default_rng(2).integers(0, 9, n)
    rel = mech.run(x, rng=3)
    B = wl.prefix(n).tosparse() @ st.fenwick_inverse(n)  # seed Algorithm 5.3's B
    np.testing.assert_allclose(rel.answers, B @ rel.measurement.y, atol=1e-9)


@pytest.mark.parametrize("secure", [False, True])
def test_counts_above_the_bound_are_refused(secure, monkeypatch):
    # issue 19 #3: 10**18 + 64 and 10**18 + 65 released 1e18 and 1e18 + 128 whatever the noise
    from sparsedp import InputBoundError

    monkeypatch.setattr(noise_module, "noise", _no_noise)
    acc = Accountant(epsilon=1.0)
    mech = MatrixMechanism(wl.identity(1), st.identity(1), epsilon=1.0, secure=secure, accountant=acc)
    for big in ([10**18 + 64], [2**53 + 2], [2.0**62], [1e308]):
        with pytest.raises(InputBoundError):
            mech.measure(big)
    # the sum of counts may exceed the bound even when every count is below it: M x is checked
    tree = MatrixMechanism(wl.total(4), st.hierarchical(4, 2), epsilon=1.0, secure=secure, accountant=acc)
    with pytest.raises(InputBoundError):
        tree.measure([2**49, 2**49, 2**49, 0])
    assert acc.history == ()


def _no_noise(*args, **kwargs):  # pragma: no cover - must never be reached
    raise AssertionError("noise drawn for refused input")


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=1e-13, secure=True),  # exact sampler's scale limit
    dict(epsilon=1e-13),
    dict(epsilon=1e300),
    dict(epsilon="1"),
    dict(epsilon=True),
    dict(epsilon=5e-324),
])
def test_bad_budgets_refused_at_construction(kwargs):
    # issue 19 #4 / #10: epsilon=1e-13 used to charge, then fail in the sampler
    with pytest.raises(InvalidPrivacyParameterError):
        MatrixMechanism(wl.identity(3), st.identity(3), **kwargs)


def test_failures_never_charge_nor_advance_the_generator(monkeypatch):
    # issue 19 #4: validate, then charge, then draw
    acc = Accountant(epsilon=1.0)
    gen = np.random.default_rng(5)
    state = gen.bit_generator.state
    mech = MatrixMechanism(wl.identity(2), st.identity(2), epsilon=0.5, accountant=acc)
    for bad in ([2.0**62, 1.0], [1e308, 1e308], [np.nan, 1.0], [1.0]):
        with pytest.raises(SparseDPError):
            mech.run(bad, rng=gen)
    with pytest.raises(SparseDPError):
        mech.run([1.0, 2.0], rng="seed")
    assert acc.history == () and gen.bit_generator.state == state
    mech.run([1.0, 2.0], rng=gen)
    assert acc.spent == 0.5


def test_calibration_uses_the_matrix_that_is_measured():
    # a user Operator whose closed-form column norms understate its entries is calibrated from
    # the entries (issue 19: calibration from the matrix actually measured)
    from sparsedp.operators import SparseOperator

    class Liar(SparseOperator):
        def column_norms(self, p=1):
            return np.ones(self.shape[1])

    M = Liar(np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]))
    mech = MatrixMechanism(wl.identity(2), M, epsilon=1.0)
    assert mech.sensitivity == 3.0 and mech.noise_scale() == 3.0


def test_optimized_strategy_by_name_and_by_result():
    # issue 11: MatrixMechanism(W, "optimized") measures sparsedp.optimize's strategy for W
    from sparsedp import optimize

    W = wl.all_ranges(32)
    mech = MatrixMechanism(W, "optimized", epsilon=0.5, secure=False, optimize_options={"rng": 0})
    res = mech.optimized
    assert res is not None and res.noise == "laplace"
    # the mechanism's own analytic error is the optimiser's, rescaled to the budget
    assert mech.expected_error() == pytest.approx(res.error_at(epsilon=0.5), rel=1e-9)
    best_template = min(MatrixMechanism(W, st.hierarchical(32, k), epsilon=0.5, secure=False).expected_error()
                        for k in (2, 4, 8, 16))
    assert mech.expected_error() < best_template
    again = MatrixMechanism(W, res, epsilon=0.5, secure=False)  # an earlier result, measured as is
    assert again.optimized is res and again.expected_error() == pytest.approx(mech.expected_error(), rel=1e-12)
    x = np.arange(32)
    rel = again.run(x, rng=1)
    assert rel.answers.shape == (W.shape[0],)
    gauss = optimize(wl.prefix(16), noise="gaussian", family="tree", rng=0)
    assert MatrixMechanism(wl.prefix(16), gauss, rho=1.0, noise="gaussian").optimized is gauss
    with pytest.raises(InvalidPrivacyParameterError, match="optimised for gaussian"):
        MatrixMechanism(wl.prefix(16), gauss, epsilon=1.0)
    with pytest.raises(InvalidPrivacyParameterError, match="'optimized'"):
        MatrixMechanism(W, "best", epsilon=1.0)
    with pytest.raises(InvalidPrivacyParameterError, match="only to"):
        MatrixMechanism(W, st.identity(32), epsilon=1.0, optimize_options={"family": "tree"})
    with pytest.raises(ShapeError):
        MatrixMechanism(wl.prefix(8), res, epsilon=1.0)  # optimised for 32 cells


# -- per-answer accuracy carried by the release (issue 20 #2) ----------------------------------------


def test_release_carries_each_answers_variance_and_interval():
    W = wl.prefix(16)
    mech = MatrixMechanism(W, st.hierarchical(16, 2), epsilon=1.0, secure=False)
    x = np.arange(16) % 5
    runs = [mech.run(x, rng=seed) for seed in range(4000)]
    v = runs[0].variances()
    np.testing.assert_allclose(v, mech.error_report().variances, rtol=1e-12)
    # dense GLS formula: Var(W x_hat) = diag(W (M^T V^-1 M)^-1 W^T)
    Md = st.hierarchical(16, 2).tosparse().toarray()
    Wd = W.tosparse().toarray()
    cov = Wd @ np.linalg.inv(Md.T @ np.diag(1.0 / mech.variances()) @ Md) @ Wd.T
    np.testing.assert_allclose(v, np.diag(cov), rtol=1e-9)
    answers = np.array([r.answers for r in runs])
    truth = Wd @ x
    emp = answers.var(axis=0)
    # 4000 runs: relative s.e. of a variance estimate ~ sqrt((kurtosis - 1) / 4000) < 0.05 here
    np.testing.assert_allclose(emp.mean() / v.mean(), 1.0, atol=0.1)
    lo, hi = runs[0].confidence_intervals(0.95)
    assert lo.shape == hi.shape == (16,) and np.all(hi > lo)
    assert runs[0].error_report().interval_method() == "accurate"  # float Laplace, the error's shape known
    # the intervals do not depend on the draw: one report's half-widths serve every run
    for method in ("auto", "exact-tail", "laplace", "chebyshev"):
        lo, hi = runs[0].confidence_intervals(0.95, method)
        for r in runs[1:3]:
            lo_r, hi_r = r.confidence_intervals(0.95, method)
            np.testing.assert_allclose(hi_r - r.answers, hi - runs[0].answers, rtol=1e-12)
        half = hi - runs[0].answers
        inside = np.abs(answers - truth) <= half
        if method == "auto":  # accurate: coverage about the level (issue 27's window)
            assert_default_coverage(inside, "float Laplace, hierarchical(16)")
        else:  # certified: at least the level
            assert_certified_coverage(inside, 0.95, method)


def test_release_per_answer_accuracy_refuses_biased_reconstructions():
    mech = MatrixMechanism(wl.prefix(8), st.identity(8), epsilon=1.0, secure=False)
    rel = mech.run(np.arange(8), rng=0, method="nnls")
    with pytest.raises(SparseDPError, match="least-squares"):
        rel.variances()


def test_release_intervals_of_exact_noise_use_the_noise_law():
    mech = MatrixMechanism(wl.prefix(8), st.identity(8), epsilon=1.0)
    rel = mech.run(np.arange(8))
    rep = rel.error_report()
    assert rep.secure and rep.interval_method() == "accurate"
    # the first prefix is one discrete Laplace value of scale t = 1 (grid 1): its exact quantile,
    # P(|K| > k) = 2 q^(k+1) / (1 + q)
    t = float(mech._plan.unit_scales[0])
    assert t == float(rel.measurement.scales[0]) == 1.0
    q = np.exp(-1.0 / t)
    k = int(np.ceil(t * np.log(2.0 / (0.1 * (1.0 + q))))) - 1
    assert 2 * q ** (k + 1) / (1 + q) <= 0.1 < 2 * q**k / (1 + q)
    lo, hi = rel.confidence_intervals(0.9)
    assert hi[0] - rel.answers[0] == pytest.approx(k, abs=1e-5) and hi[0] - rel.answers[0] >= k
    # longer prefixes are sums of such values on the integer lattice: continuity-corrected, integral
    half = hi - rel.answers
    np.testing.assert_allclose(half, np.round(half), atol=1e-5)
    np.testing.assert_allclose(mech.error_report().half_widths(0.9), half, rtol=1e-12)
    # the certified methods by name: Chebyshev sqrt(1 / 0.1) sd, exact-tail at most that
    lo, hi = rel.confidence_intervals(0.9, "chebyshev")
    np.testing.assert_allclose(hi - rel.answers, np.sqrt(10.0) * np.sqrt(rel.variances()), rtol=1e-12)
    assert np.all(rep.half_widths(0.9, "exact-tail") <= rep.half_widths(0.9, "chebyshev") * (1 + 1e-12))
    # a caller's scales= is used, not replaced by the sampler's
    assert rel.error_report(scales=rel.measurement.scales).interval_method() == "accurate"


def test_release_of_exact_gaussian_noise_knows_its_sampler_scales():
    import dataclasses

    from sparsedp._tails import dg_quantile

    mech = MatrixMechanism(wl.identity(6), st.identity(6), rho=0.02, noise="gaussian")  # sigma = 5 grid units
    rel = mech.run(np.arange(6), rng=0)
    np.testing.assert_array_equal(rel.unit_scales, mech._plan.unit_scales)
    sigma = float(mech._plan.unit_scales[0])
    assert sigma == pytest.approx(5.0, rel=1e-6)
    k = float(dg_quantile(sigma, 0.95))  # the discrete Gaussian's exact quantile (an integer)
    assert k == 10.0
    lo, hi = rel.confidence_intervals(0.95)
    np.testing.assert_allclose(hi - rel.answers, k + 1e-6, rtol=1e-9)
    np.testing.assert_allclose(mech.error_report().half_widths(0.95), hi - rel.answers, rtol=1e-12)
    # a discrete Gaussian's scale in data units does not name its sampler scale above sigma ~ 1.2:
    # without unit_scales the answer is one value of unknown law: the normal quantile
    bare = dataclasses.replace(rel, unit_scales=None).error_report()
    np.testing.assert_allclose(bare.half_widths(0.95), 1.959963984540054 * np.sqrt(rel.variances()), rtol=1e-9)


def test_release_intervals_of_exact_noise_cover():
    W = wl.prefix(32)
    for noise, budget in (("laplace", {"epsilon": 0.2}), ("gaussian", {"rho": 0.02})):
        mech = MatrixMechanism(W, st.hierarchical(32, 2), noise=noise, **budget)  # exact noise (the default)
        x = np.arange(32) % 7
        errs = mechanism_answers(mech, x, 2000, seed=5) - W.matvec(x)
        rep = mech.run(x, rng=0).error_report()
        assert rep.interval_method() == "accurate"
        assert_default_coverage(np.abs(errs) <= rep.half_widths(0.95), noise)
        for method in ("exact-tail", "chebyshev"):
            assert_certified_coverage(np.abs(errs) <= rep.half_widths(0.95, method), 0.95, f"{noise} {method}")


@pytest.mark.parametrize("strategy", [st.identity(4), st.fenwick(4)])
def test_run_refuses_numeric_text_before_charge(monkeypatch, strategy):
    """``run(["10", "20", ...])`` used to release the strings as numbers (the identity fast path
    cast them); text is refused like everywhere else, before any budget or noise."""
    trip = Tripwire(monkeypatch)
    acc = Accountant(epsilon=1.0)
    mech = MatrixMechanism(wl.prefix(4), strategy, epsilon=0.5, accountant=acc)
    for text in (["10", "20", "30", "40"], np.array(["10", "20", "30", "40"]), [10, 20, "30", 40]):
        with pytest.raises(ShapeError, match="text where numbers are expected"):
            mech.run(text, rng=0)
    with pytest.raises(FractionalCountError, match="not an integer"):
        mech.run([10, 20, 1.5, 40], rng=0)
    assert trip.calls == 0 and acc.spent == 0
    assert mech.run([10, 20, 30, 40], rng=0).answers.shape == (4,)


def test_a_workload_too_large_to_answer_is_refused_before_the_charge():
    """all_ranges(2^16) has 2^31 answers (16 GiB as float64): refused before anything is charged
    (it used to run out of memory after the measurement)."""
    from sparsedp.range_variance import MemoryLimitError

    acct = sparsedp.Accountant(epsilon=1.0)
    n = 2**16
    mech = sparsedp.MatrixMechanism(wl.all_ranges(n), st.hierarchical(n, 16), epsilon=1.0,
                                    accountant=acct)
    with pytest.raises(MemoryLimitError, match="nothing was charged"):
        mech.run(np.zeros(n))
    assert acct.spent == 0.0
