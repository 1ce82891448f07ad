"""The one measurement path: plan (calibrate from the measured entries), validate, charge, draw."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import Accountant, InvalidPrivacyParameterError, SparseDPError
from sparsedp import noise as noise_module
from sparsedp import strategies as st
from sparsedp.audit import plan_release
from sparsedp.measure import measure, plan_measurement


def test_homoscedastic_plan_matches_the_sensitivity():
    plan = plan_measurement(st.hierarchical(16, 2), epsilon=0.5, secure=False)
    assert plan.sensitivity == 5 and plan.scales[0] == 10.0 and plan.cost.epsilon == 0.5
    np.testing.assert_allclose(plan.variances(), 200.0)


def test_per_row_scales_are_charged_their_exact_loss():
    M = st.hierarchical(8, 2).tosparse()  # 15 rows, 4 levels
    b = np.repeat([1.0, 2.0, 4.0, 8.0], [1, 2, 4, 8])
    plan = plan_measurement(M, scales=b, secure=False)
    exact = Fraction(1) + Fraction(1, 2) + Fraction(1, 4) + Fraction(1, 8)
    assert Fraction(plan.loss) >= exact and plan.loss == pytest.approx(float(exact), rel=1e-14)
    assert plan.cost.epsilon == plan.loss
    with pytest.raises(InvalidPrivacyParameterError, match="more than"):
        plan_measurement(M, scales=b, epsilon=1.8, secure=False)  # a budget that does not cover them
    assert plan_measurement(M, scales=b, epsilon=2.0, secure=False).cost.epsilon == 2.0


def test_ledger_records_the_measurement_and_seeded_runs_are_not_private():
    acc = Accountant(epsilon=1.0)
    m1 = measure(st.identity(4), [1, 2, 3, 4], epsilon=0.25, accountant=acc, label="a")
    m2 = measure(st.identity(4), [1, 2, 3, 4], epsilon=0.25, accountant=acc, rng=3, label="b")
    assert m1.secure and m1.private and not m2.private
    a, b = acc.ledger
    assert (a.label, a.rows, a.columns, a.noise, a.secure, a.private, a.sensitivity) == ("a", 4, 4, "laplace", True, True, 1.0)
    assert b.private is False and a.scale_min == a.scale_max == 4.0
    assert acc.history == (("a", a.cost), ("b", b.cost))


def test_exact_noise_is_the_default_and_integral():
    m = measure(st.hierarchical(8, 2), np.arange(8), epsilon=1.0)
    assert m.secure and np.all(m.y == np.round(m.y))


@pytest.mark.parametrize("bad", [dict(x=[1, 2, np.nan, 4]), dict(x=[1, 2, 3]), dict(x=[-1, 0, 0, 0]),
                                 dict(x=[2**51, 0, 0, 0]), dict(rng="x"), dict(accountant="acc")])
def test_bad_input_raises_before_charge_or_noise(bad, monkeypatch):
    def boom(*a, **k):  # pragma: no cover
        raise AssertionError("noise drawn")

    monkeypatch.setattr(noise_module, "noise", boom)
    acc = Accountant(epsilon=1.0)
    kwargs = dict(x=[1, 2, 3, 4], accountant=acc)
    kwargs.update(bad)
    with pytest.raises(SparseDPError):
        measure(st.identity(4), kwargs.pop("x"), epsilon=0.5, **kwargs)
    assert acc.ledger == ()


@pytest.mark.parametrize("secure", [False, True])
def test_empirical_variance_matches_the_plan(secure):
    b = np.array([0.7, 2.0, 5.0])
    plan = plan_measurement(sp.eye(3), scales=b, secure=secure)
    ys = np.array([plan.measure([0, 0, 0], rng=i).y for i in range(4000)])
    np.testing.assert_allclose(ys.var(axis=0), plan.variances(), rtol=0.1)


def test_gaussian_per_row_sigmas():
    M = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]])
    sig = np.array([1.0, 2.0, 3.0])
    plan = plan_measurement(M, scales=sig, noise="gaussian", secure=False)
    exact = max(Fraction(1) + Fraction(1, 4), Fraction(1, 4) + Fraction(4, 9)) / 2
    assert Fraction(plan.loss) >= exact and plan.cost.rho == plan.loss


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("secure", [False, True])
def test_interval_rows_are_calibrated_like_their_explicit_matrix(noise, secure):
    from sparsedp.intervals import IntervalRows

    rng = np.random.default_rng(1)
    lo = rng.integers(0, 20, size=30)
    hi = lo + rng.integers(1, 6, size=30)
    op = IntervalRows(25, lo, hi, rng.integers(1, 4, size=30).astype(float))
    b = rng.uniform(0.5, 3.0, size=30)
    implicit = plan_measurement(op, scales=b, noise=noise, secure=secure)
    explicit = plan_measurement(op.tosparse(), scales=b, noise=noise, secure=secure)
    assert implicit.loss >= explicit.loss * (1 - 1e-12) and implicit.loss <= explicit.loss * (1 + 1e-9)
    assert implicit.sensitivity == pytest.approx(explicit.sensitivity, rel=1e-12)
    x = rng.integers(0, 9, size=25)
    # measured without forming the matrix, through the plan's own read-only copy of the rows
    assert type(implicit.measured) is IntervalRows and implicit.measured is not op
    assert not implicit.measured.weights.flags.writeable and op.weights.flags.writeable
    if noise == "laplace":
        h = plan_measurement(op, epsilon=0.7, secure=secure)
        assert h.sensitivity == explicit.sensitivity
    m = implicit.measure(x, rng=0)
    assert m.y.shape == (30,)


def test_unit_multiplies_the_sensitivity():
    plan = plan_measurement(sp.eye(6), epsilon=1.0, unit=5, secure=True)  # e.g. one order = 5 items
    assert plan.sensitivity == 5 and plan.scales[0] == 5.0
    per_row = plan_measurement(sp.eye(3), scales=[2.0, 4.0, 8.0], unit=3, secure=False)
    assert Fraction(per_row.loss) >= Fraction(3, 2)


def test_many_distinct_scales_are_rounded_up_for_the_exact_sampler():
    b = np.linspace(1.0, 50.0, 1000)
    plan = plan_measurement(sp.eye(1000), scales=b, secure=True)
    assert np.unique(plan.unit_scales).size <= 64 * 6 + 1
    assert np.all(plan.unit_scales >= b) and np.all(plan.unit_scales <= b * 2 ** (1 / 64) * (1 + 1e-12))
    assert Fraction(plan.loss) >= max(Fraction(1) / Fraction(float(t)) for t in plan.unit_scales)


def test_noise_stream_charges_once_and_never_repeats_a_row():
    acc = Accountant(epsilon=1.0)
    plan = plan_measurement(st.identity(10), epsilon=0.5)
    stream = plan.noise_stream(accountant=acc, rng=4)
    assert len(acc.ledger) == 1 and acc.ledger[0].private is False
    a = stream.take([0, 1, 2])
    b = stream.take([5])
    assert a.shape == (3,) and b.shape == (1,) and np.all(a == np.round(a))
    for bad in ([5], [4], [7, 6], [10]):
        with pytest.raises(SparseDPError):
            stream.take(bad)
    assert stream.all().shape == (4,)
    with pytest.raises(SparseDPError):
        plan.noise_stream(accountant=acc, rng="x")  # bad generator: refused before the charge
    assert len(acc.ledger) == 1


def test_noise_stream_batches_give_the_same_noise_as_one_draw():
    plan = plan_measurement(st.identity(50), epsilon=1.0, secure=True)
    one = plan.noise_stream(rng=9, chunk=1000).all()
    stream = plan.noise_stream(rng=9, chunk=7)
    parts = [stream.take([0]), stream.take([1, 2, 3]), stream.take(np.arange(4, 20)), stream.take([25]),
             stream.take(np.arange(26, 50))]
    got = np.concatenate(parts)
    want = np.concatenate([one[:20], one[25:]])
    assert got.shape == want.shape and np.all(got == np.round(got))
    # same generator, but rows 20..24 are drawn and dropped in different batches: compare the
    # distribution loosely and the exact values where both streams drew in one piece
    np.testing.assert_array_equal(parts[0], one[:1])


def test_tiny_exact_noise_has_a_positive_reported_variance():
    # the discrete Laplace variance 2q/(1-q)^2 underflows to 0 for t ~ 1e-5; estimators weight by
    # 1/variance, so the plan reports at least 1e-200 (an overstatement)
    plan = plan_measurement(st.haar(8), epsilon=1e6)
    assert np.all(plan.variances() > 0)


@pytest.mark.parametrize("n", [37, 20, 64])
def test_haar_exact_noise_uses_the_integer_rows(n):
    # Haar rows for n not a power of two are not integers: the inexact-grid rule added one unit per
    # touched row (2.2x the noise at n = 37); the integer form measures |R| 1_L - |L| 1_R exactly
    H = st.haar(n)
    exact = plan_measurement(H, epsilon=1.0, secure=True)
    flt = plan_measurement(H, epsilon=1.0, secure=False)
    assert exact.row_factors is not None
    np.testing.assert_allclose(exact.scales, flt.scales, rtol=1e-9)
    Hint = exact.measured.tosparse()
    assert _exact_l1(Hint, exact.unit_scales) <= Fraction(1)
    # 3000 draws through the plan's own measure, in one call on a block-diagonal copy (plan_release)
    # instead of 3000 calls (the copy has the same grid, per-row scales and row factors)
    ys = plan_release(exact)(np.arange(n), np.random.default_rng(0), 3000)
    assert exact.measure(np.arange(n), rng=0).y.shape == ys[0].shape
    np.testing.assert_allclose(ys.mean(axis=0), H.matvec(np.arange(n)), atol=0.3 * np.sqrt(exact.variances()).max())
    np.testing.assert_allclose(ys.var(axis=0).mean(), exact.variances().mean(), rtol=0.1)


def _exact_l1(A, scales) -> Fraction:
    A = sp.csc_matrix(A)
    return max(sum((abs(Fraction(float(v))) / Fraction(float(scales[i])) for v, i in
                    zip(A.data[A.indptr[j]:A.indptr[j + 1]], A.indices[A.indptr[j]:A.indptr[j + 1]])), Fraction(0))
               for j in range(A.shape[1]))


@pytest.mark.parametrize("kind", ["weighted-sparse", "weighted-intervals"])
def test_weighted_strategies_get_exact_noise_on_their_integer_rows(kind):
    # diag(w) M with fractional w: the inexact-grid rule would add a unit per touched row; the
    # integer form measures M with per-row scales b / |w_i| (the same law as the float mechanism)
    rng = np.random.default_rng(2)
    base = st.hierarchical(32, 4) if kind == "weighted-intervals" else st.fenwick(32)
    w = rng.uniform(0.3, 2.0, size=base.shape[0]) * rng.choice([-1, 1], size=base.shape[0])
    A = st.weighted(base, w)
    exact = plan_measurement(A, epsilon=0.8, secure=True)
    flt = plan_measurement(A, epsilon=0.8, secure=False)
    assert exact.row_factors is not None
    np.testing.assert_allclose(exact.scales, flt.scales, rtol=1e-9)
    assert Fraction(exact.loss) <= Fraction(0.8)
    Hm = sp.csr_matrix(exact.measured.tosparse())
    assert _exact_l1(Hm, exact.unit_scales) <= Fraction(0.8)
    x = rng.integers(0, 20, size=32)
    # 2000 draws through the plan's own measure, in one call on a block-diagonal copy (plan_release)
    ys = plan_release(exact)(x, np.random.default_rng(0), 2000)
    np.testing.assert_allclose(ys.mean(axis=0), A.matvec(x), atol=4 * np.sqrt(exact.variances().max() / 2000) + 1e-9)


# ---- the identity fast path (no product, no second pass: y = x + z) ---------------------------------

def _general_path(monkeypatch):
    """Plans built inside this context take the general explicit-matrix path even for the identity."""
    import importlib

    monkeypatch.setattr(importlib.import_module("sparsedp.measure"), "_is_identity", lambda A: False)


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("counts", [True, False])
@pytest.mark.parametrize("unit", [1.0, 3.5])
def test_identity_fast_path_equals_the_general_path(noise, secure, counts, unit, monkeypatch):
    budget = dict(epsilon=0.7) if noise == "laplace" else dict(rho=0.3)
    n = 200
    rng = np.random.default_rng(5)
    x = rng.integers(0, 40, size=n).astype(float) - (0 if counts else 20)
    fast = plan_measurement(st.identity(n), noise=noise, secure=secure, unit=unit, **budget)
    scaled = plan_measurement(st.identity(n), noise=noise, secure=secure, scales=np.linspace(1, 3, n))
    assert fast.identity and scaled.identity and fast.sensitivity == _exact_sens(unit)
    total = dict(epsilon=5.0) if noise == "laplace" else dict(rho=5.0)
    acc_fast, acc_general = Accountant(**total), Accountant(**total)
    m_fast = fast.measure(x, rng=11, counts=counts, accountant=acc_fast, label="m")
    s_fast = scaled.measure(x, rng=12, counts=counts)
    with monkeypatch.context() as mp:
        _general_path(mp)
        general = plan_measurement(st.identity(n), noise=noise, secure=secure, unit=unit, **budget)
        scaled_general = plan_measurement(st.identity(n), noise=noise, secure=secure, scales=np.linspace(1, 3, n))
    assert not general.identity and not scaled_general.identity
    for a, b in ((fast, general), (scaled, scaled_general)):
        assert (a.sensitivity, a.data_sensitivity, a.loss, a.cost, a.grid_exact) == \
            (b.sensitivity, b.data_sensitivity, b.loss, b.cost, b.grid_exact)
        np.testing.assert_array_equal(a.scales, b.scales)
        np.testing.assert_array_equal(a.variances(), b.variances())
    m_general = general.measure(x, rng=11, counts=counts, accountant=acc_general, label="m")
    np.testing.assert_array_equal(m_fast.y, m_general.y)  # same generator: the same release, bit for bit
    np.testing.assert_array_equal(s_fast.y, scaled_general.measure(x, rng=12, counts=counts).y)
    a, b = acc_fast.ledger[0], acc_general.ledger[0]
    assert (a.cost, a.sensitivity, a.rows, a.columns, a.secure, a.scale_min) == \
        (b.cost, b.sensitivity, b.rows, b.columns, b.secure, b.scale_min)
    if secure:
        assert np.all(m_fast.y == np.round(m_fast.y))


def _exact_sens(unit):
    from sparsedp.measure import _times

    return _times(1.0, unit)


@pytest.mark.parametrize("secure", [False, True])
@pytest.mark.parametrize("bad", [dict(x=[1, 2, np.nan, 4]), dict(x=[1, 2, 3]), dict(x=[[1, 2], [3, 4]]),
                                 dict(x=[-1, 0, 0, 0]), dict(x=[2**51, 0, 0, 0]), dict(x=[0, 0, 0, -(2**51)], counts=False),
                                 dict(x=[1, 0, np.inf, 0], counts=False), dict(x=[0.5, 0, 0, 0]),
                                 dict(rng="x"), dict(accountant="acc"), dict(accountant="overspent")])
def test_identity_fast_path_refuses_bad_input_before_the_charge(bad, secure, monkeypatch):
    def boom(*a, **k):  # pragma: no cover
        raise AssertionError("noise drawn")

    for name in ("noise", "discrete_laplace", "discrete_gaussian", "laplace", "gaussian"):
        monkeypatch.setattr(noise_module, name, boom)
    acc = Accountant(epsilon=1.0)
    kwargs = dict(x=[1, 2, 3, 4], accountant=acc)
    kwargs.update(bad)
    if kwargs["accountant"] == "overspent":
        acc.spend(sparsedp_cost(0.8))
        kwargs["accountant"] = acc
    plan = plan_measurement(st.identity(4), epsilon=0.5, secure=secure)
    assert plan.identity
    spent = acc.spent
    with pytest.raises(SparseDPError):
        plan.measure(kwargs.pop("x"), **kwargs)
    assert acc.spent == spent and len(acc.ledger) == (1 if bad.get("accountant") == "overspent" else 0)


def test_identity_fast_path_refuses_fractional_data_for_exact_noise_only():
    plan = plan_measurement(st.identity(3), epsilon=1.0, secure=True)
    with pytest.raises(SparseDPError, match="integral"):
        plan.measure([0.5, -1.0, 2.0], counts=False)
    y = plan_measurement(st.identity(3), epsilon=1.0, secure=False).measure([0.5, -1.0, 2.0], counts=False, rng=0).y
    assert y.shape == (3,) and np.all(np.isfinite(y))


def sparsedp_cost(eps):
    from sparsedp.privacy import PrivacyCost

    return PrivacyCost(epsilon=eps)


def test_identity_is_recognised_from_the_entries_never_from_a_claim():
    from sparsedp.operators import SparseOperator

    n = 6
    I = sp.identity(n, format="csr")
    not_identity = {
        "twice": SparseOperator(2 * I, structure="identity", name="claims identity"),
        "permutation": sp.csr_matrix(np.eye(n)[::-1]),
        "missing entry": sp.csr_matrix(np.diag([1, 1, 1, 0, 1, 1.0])),
        "explicit zero": sp.csr_matrix((np.array([1, 1, 1, 1, 1, 1, 0.0]), np.array([0, 1, 2, 3, 4, 5, 0]),
                                        np.array([0, 1, 2, 3, 4, 5, 7])), shape=(n, n)),
        "rectangular": sp.csr_matrix(np.eye(n, n + 1)),
    }
    for name, A in not_identity.items():
        plan = plan_measurement(A, epsilon=1.0, secure=False)
        assert not plan.identity, name
    assert plan_measurement(not_identity["twice"], epsilon=1.0, secure=False).sensitivity == 2.0
    assert plan_measurement(sp.csr_matrix(np.eye(n)), epsilon=1.0).identity
    assert plan_measurement(I, epsilon=1.0, secure=False, grid=0.5).identity  # float noise: no grid
    assert not plan_measurement(I, epsilon=1.0, secure=True, grid=0.5).identity  # exact, grid != 1: general


@pytest.mark.parametrize("block", [3, 1 << 16])
def test_the_blocked_input_check_accepts_exactly_what_the_validators_accept(block, monkeypatch):
    """The identity path checks x in one cache-blocked pass and falls back to the standard validators
    on any doubt: it must never accept what they refuse (nor refuse what they accept)."""
    import importlib

    from sparsedp.validation import MAX_MAGNITUDE, check_counts, check_magnitude, check_vector

    measure_module = importlib.import_module("sparsedp.measure")
    monkeypatch.setattr(measure_module, "_BLOCK", block)
    base = np.arange(10, dtype=float)
    variants = [base, -base, base + 0.5, np.zeros(0), np.full(10, -0.0)]
    for i in (0, 4, 9):  # the first, a middle and the last block
        for bad in (np.nan, np.inf, -np.inf, 0.25, -1.0, MAX_MAGNITUDE, np.nextafter(MAX_MAGNITUDE, np.inf),
                    -MAX_MAGNITUDE, -np.nextafter(MAX_MAGNITUDE, np.inf)):
            v = base.copy()
            v[i] = bad
            variants.append(v)
    variants += [base[:9], base.reshape(2, 5), ["a"] * 10]
    for v in variants:
        n = 10 if np.ndim(v) != 1 or len(v) != 0 else 0
        for counts in (False, True):
            for integral in ({True} if counts else {False, True}):
                def standard():
                    xv = check_counts(v, n, "x") if counts else check_vector(v, n, "x")
                    check_magnitude(xv, "x")
                    if integral and not np.array_equal(xv, np.round(xv)):
                        raise SparseDPError("not integral")
                    return xv
                try:
                    want = standard()
                except SparseDPError:
                    want = None
                got = measure_module._clean_vector(v, n, counts, integral)
                assert (got is None) == (want is None), (v, counts, integral)
                if got is not None:
                    np.testing.assert_array_equal(got, want)
