import math
from fractions import Fraction

import pytest

from sparsedp import Accountant, BudgetExceededError, InvalidPrivacyParameterError, PrivacyCost
from sparsedp.privacy import parallel, rho_for_approx_dp, sequential, zcdp_to_approx_dp


def test_pure_budget_sequential_and_refusal():
    acc = Accountant(epsilon=1.0)
    for _ in range(8):
        acc.spend(PrivacyCost(epsilon=0.125))  # dyadic: fits exactly
    assert acc.remaining == 0.0 and acc.spent == 1.0
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=5e-324))  # not even the smallest float is left
    assert len(acc.history) == 8  # the refused spend was not recorded


def test_exact_arithmetic_refuses_ulp_overspend():
    # budgets count as the decimals written (0.1 is 1/10: ten of them fill 1.0, see below), and in
    # exact arithmetic: a spend one ulp above what is left is refused
    import math

    acc = Accountant(epsilon=1.0)
    acc.spend(PrivacyCost(epsilon=0.5))
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=math.nextafter(0.5, 1.0)))
    assert acc.spent_exact == Fraction(1, 2)
    acc.spend(PrivacyCost(epsilon=0.5))  # the exact rest fits
    assert acc.spent_exact == 1


def test_overspend_in_one_step():
    acc = Accountant(epsilon=0.5)
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=0.5000001))
    assert acc.spent == 0


def test_composition_rules():
    a, b = PrivacyCost(epsilon=0.3), PrivacyCost(epsilon=0.5)
    assert sequential(a, b).epsilon == pytest.approx(0.8)
    assert parallel(a, b).epsilon == 0.5
    assert sequential(a, PrivacyCost(rho=0.1)).rho == pytest.approx(0.3**2 / 2 + 0.1)


def test_zcdp_budget_and_conversion():
    acc = Accountant(rho=0.5)
    acc.spend(PrivacyCost(rho=0.375))
    acc.spend(PrivacyCost(epsilon=0.5))  # pure eps costs eps^2 / 2 = 0.125
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(rho=1e-6))
    eps = zcdp_to_approx_dp(0.5, 1e-6)
    assert eps == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e6)))
    assert rho_for_approx_dp(eps, 1e-6) == pytest.approx(0.5)


def test_pure_budget_refuses_zcdp_cost():
    with pytest.raises(BudgetExceededError):
        Accountant(epsilon=1.0).spend(PrivacyCost(rho=0.01))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_parameters(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        Accountant(epsilon=bad)
    with pytest.raises(InvalidPrivacyParameterError):
        zcdp_to_approx_dp(bad, 1e-6)
    if bad != 0.0:
        with pytest.raises(InvalidPrivacyParameterError):
            PrivacyCost(epsilon=bad)


def test_concurrent_spends_never_exceed_the_budget():
    # issue 19 #5: 8 threads each spending 0.6 of 1.0; the old accountant accepted two spends in
    # 14 of 300 trials (check and record were not atomic)
    import threading

    for _ in range(300):
        acc = Accountant(epsilon=1.0)
        barrier = threading.Barrier(8)
        accepted = []

        def worker() -> None:
            barrier.wait()
            try:
                acc.spend(PrivacyCost(epsilon=0.6))
                accepted.append(1)
            except BudgetExceededError:
                pass

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(accepted) == 1 and len(acc.history) == 1


def test_budget_and_history_cannot_be_edited():
    acc = Accountant(epsilon=1.0)
    acc.spend(PrivacyCost(epsilon=0.75), "first")
    for name, value in [("epsilon", 100.0), ("epsilon", float("nan")), ("rho", 1.0), ("history", [])]:
        with pytest.raises(AttributeError):
            setattr(acc, name, value)
    with pytest.raises(AttributeError):
        acc.history.clear()  # a tuple copy: nothing to clear
    assert acc.epsilon == 1.0 and acc.spent == 0.75 and acc.history == (("first", PrivacyCost(epsilon=0.75)),)
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=0.5))


def test_zero_cost_cannot_be_spent():
    acc = Accountant(epsilon=1.0)
    with pytest.raises(InvalidPrivacyParameterError):
        acc.spend(PrivacyCost())
    with pytest.raises(InvalidPrivacyParameterError):
        acc.spend("0.5")  # type: ignore[arg-type]
    assert acc.history == ()


@pytest.mark.parametrize("bad", ["1", True, 1 + 0j, None])
def test_budgets_must_be_real_numbers(bad):
    with pytest.raises(InvalidPrivacyParameterError):
        Accountant(epsilon=bad) if bad is not None else Accountant()
    if bad is not None:
        with pytest.raises(InvalidPrivacyParameterError):
            PrivacyCost(epsilon=bad)


def test_sequential_never_understates():
    total = sequential(*[PrivacyCost(epsilon=0.1)] * 10)
    assert Fraction(total.epsilon) >= 10 * Fraction(0.1)


@pytest.mark.parametrize("again", [dict(epsilon=1.0), dict(epsilon=100.0), dict(rho=5.0)])
def test_reinitialising_a_spent_accountant_is_refused(again):
    from sparsedp.errors import SparseDPError

    acc = Accountant(epsilon=1.0)
    acc.spend(PrivacyCost(epsilon=0.75), "first")
    with pytest.raises(SparseDPError, match="already"):
        Accountant.__init__(acc, **again)
    assert acc.spent == 0.75 and acc.total == 1.0 and acc.is_pure and len(acc.ledger) == 1
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=0.5))
    fresh = Accountant(rho=0.5)  # an unspent one is refused too: __init__ runs once per object
    with pytest.raises(SparseDPError, match="already"):
        fresh.__init__(rho=0.5)
    assert fresh.rho == 0.5 and fresh.spent == 0.0


def test_ledger_time_is_rounded_to_the_hour_so_it_cannot_time_the_data_read():
    """The charge comes after the data are read: a precise clock time minus a known start would show
    how long reading took (it grows with the data).  The ledger keeps the hour only."""
    import time

    import numpy as np

    from sparsedp.measure import plan_measurement
    from sparsedp.privacy import LEDGER_TIME_RESOLUTION, ledger_time

    assert ledger_time(7199.9) == 3600.0 and ledger_time(7200.0) == 7200.0
    meas = plan_measurement(np.eye(4), epsilon=1.0).measure(np.arange(4.0), rng=0)
    after = time.time()
    t = meas.entry.time
    assert t % LEDGER_TIME_RESOLUTION == 0 and after - LEDGER_TIME_RESOLUTION < t <= after


def test_ten_spends_of_a_tenth_fill_a_budget_of_one_and_an_eleventh_is_refused():
    """Budgets count as the decimals written (0.1 is 1/10), and the noise is calibrated to them."""
    from fractions import Fraction

    import numpy as np

    from sparsedp.errors import BudgetExceededError
    from sparsedp.measure import plan_measurement
    from sparsedp.privacy import Accountant, PrivacyCost

    acc = Accountant(epsilon=1.0)
    for _ in range(10):
        acc.spend(PrivacyCost(epsilon=0.1))
    assert acc.spent_exact == 1
    with pytest.raises(BudgetExceededError):
        acc.spend(PrivacyCost(epsilon=0.1))
    # the plans charge 0.1 and are calibrated to 1/10 exactly or below (never to the float 0.1 > 1/10)
    for sens_matrix in (np.eye(3), np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]), np.array([[3.0, 1.0]])):
        for secure in (True, False):
            plan = plan_measurement(sens_matrix, epsilon=0.1, secure=secure)
            b = Fraction(float(plan.scales.min()))
            assert Fraction(float(plan.data_sensitivity)) / b <= Fraction(1, 10)
            g = plan_measurement(sens_matrix, rho=0.1, noise="gaussian", secure=secure)
            s = Fraction(float(g.scales.min()))
            assert Fraction(float(g.data_sensitivity)) ** 2 / (2 * s * s) <= Fraction(1, 10)
    acc = Accountant(epsilon=1.0)
    for _ in range(10):
        plan_measurement(np.eye(2), epsilon=0.1).measure(np.zeros(2), rng=0, accountant=acc)
    assert acc.spent_exact == 1
