"""The empirical auditor: valid on a correct release, and powerful enough to catch a release whose
sensitivity was halved (it then costs twice the epsilon it claims)."""

import dataclasses
import math

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp import noise as nz
from sparsedp import strategies as st
from sparsedp import audit as audit_module
from sparsedp.audit import audit, clopper_pearson, plan_release
from sparsedp.measure import plan_measurement


def test_clopper_pearson_covers_the_truth():
    rng = np.random.default_rng(0)
    misses = 0
    for _ in range(400):
        k = int(rng.binomial(200, 0.1))
        lo, hi = clopper_pearson(k, 200, 0.05)
        misses += not (lo <= 0.1 <= hi)
    assert misses <= 40  # exact intervals are conservative: ~5% or fewer
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0 and clopper_pearson(10, 10, 0.05)[1] == 1.0


def test_correct_release_is_not_flagged_and_broken_release_is():
    plan = plan_measurement(st.identity(1), epsilon=1.0)  # exact discrete Laplace, Delta = 1

    def correct(x, g):
        return plan.measure(x, rng=g).y

    def broken(x, g):  # claims epsilon 1 but calibrates for sensitivity 1/2: costs 2
        return np.asarray(x, float) + nz.discrete_laplace(0.5, size=1, rng=g)

    good = audit(correct, [5], [6], trials=4000, rng=1)
    bad = audit(broken, [5], [6], trials=4000, rng=1)
    assert good.epsilon_lower <= 1.0
    assert bad.epsilon_lower > 1.0, bad
    assert math.isclose(bad.p_hat / max(bad.q_hat, 1e-9), math.exp(2), rel_tol=0.6)


def test_bad_arguments():
    with pytest.raises(SparseDPError):
        audit(lambda x, g: x, [1], [2], trials=10)
    with pytest.raises(SparseDPError):
        audit(lambda x, g: [np.nan], [1], [2], trials=400)


# ---- the batched protocol (issue 13: 10^6 trials per path in seconds) -------------------------------

def _uniform(d: int = 2):
    """The same law as a per-trial and a batched release; both draw the generator's doubles in the
    same order (``random((k, d))`` fills row by row), so the audits must agree exactly."""

    def one(x, g):
        return np.asarray(x, float) + g.random(d)

    def many(x, g, k):
        return np.asarray(x, float) + g.random((k, d))

    return one, many


def test_batched_audit_equals_the_per_trial_audit_on_a_seeded_case():
    one, many = _uniform()
    g1, g2 = np.random.default_rng(0), np.random.default_rng(0)
    np.testing.assert_array_equal(np.vstack([one([0, 0], g1) for _ in range(5)]), many([0, 0], g2, 5))
    per = audit(one, [0.0, 0.0], [0.3, 0.0], trials=3000, rng=11)
    for chunk in (64, 1000, 10**6):
        bat = audit(many, [0.0, 0.0], [0.3, 0.0], trials=3000, rng=11, batched=True, chunk=chunk)
        assert bat == per
    assert per.epsilon_lower > 0.5  # uniform shifted by 0.3: {R_0 < 0.3} has probability 0.3 against 0
    assert per.selection_trials + per.held_out_trials == 3000 and per.selection_trials == 1500


def test_outputs_are_drawn_selection_first_then_held_out_in_bounded_chunks():
    calls = []

    def spy(x, g, k):
        calls.append((float(x[0]), k))
        return np.asarray(x, float) + g.random((k, 1))

    res = audit(spy, [0.0], [0.5], trials=1000, rng=0, batched=True, chunk=128, selection=0.3)
    sel = [128, 128, 44]  # 300 selection trials per input, chunks of at most 128
    hold = [128] * 5 + [60]  # then 700 held-out trials per input
    expected = [(0.0, k) for k in sel] + [(0.5, k) for k in sel] + [(0.0, k) for k in hold] + [(0.5, k) for k in hold]
    assert calls == expected
    assert (res.selection_trials, res.held_out_trials) == (300, 700)


def test_the_bound_uses_only_held_out_draws():
    """A release that separates the inputs in the selection draws and not afterwards: the event is
    chosen on the selection part (very unequal there), but the held-out laws are equal, so a valid
    auditor reports no privacy loss.  Counting on the selection draws would report a large one."""
    drawn = {"n": 0}

    def release(x, g, k):
        sel = drawn["n"] < 2 * 2000  # the first 2 x 2000 draws are the selection part
        drawn["n"] += k
        return g.standard_normal((k, 1)) + (5.0 * x[0] if sel else 0.0)

    res = audit(release, [1.0], [0.0], trials=4000, rng=3, batched=True, chunk=500)
    assert "more likely under x" in res.event and "x_prime" not in res.event
    assert res.epsilon_lower == 0.0, res


def test_delta_is_subtracted():
    one, many = _uniform(1)
    pure = audit(many, [0.0], [0.3], trials=4000, rng=5, batched=True)
    approx = audit(many, [0.0], [0.3], trials=4000, rng=5, batched=True, delta=0.05)
    assert approx.delta == 0.05 and 0 < approx.epsilon_lower < pure.epsilon_lower
    if approx.p_lower > 0.05:
        assert math.isclose(approx.epsilon_lower, math.log((approx.p_lower - 0.05) / approx.q_upper))
    with pytest.raises(SparseDPError):
        audit(many, [0.0], [0.3], trials=4000, batched=True, delta=1.0)
    with pytest.raises(SparseDPError):
        audit(many, [0.0], [0.3], trials=4000, batched=True, selection=1.0)


def test_plan_release_has_the_law_of_the_plan(monkeypatch):
    """``plan_release`` draws ``k`` measurements through the plan's own ``measure`` (one call per
    chunk): mean ``A x``, the plan's per-row variances, values on each row's lattice ``f_i Z``."""
    from sparsedp.intervals import IntervalRows
    from sparsedp.measure import MeasurementPlan

    rows = IntervalRows(4, [0, 0, 2, 0], [4, 2, 4, 1], weights=[0.5, 1.5, 1.5, 2.0])  # integer form: f = weights
    plan = plan_measurement(rows, epsilon=1.0)
    assert plan.row_factors is not None
    calls = []
    real = MeasurementPlan.measure
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    x = np.array([3, 1, 4, 1])
    Y = plan_release(plan)(x, np.random.default_rng(0), 40000)
    assert Y.shape == (40000, 4) and len(calls) == 1
    exact = rows.tosparse() @ x
    assert np.all(np.abs(Y.mean(axis=0) - exact) <= 5 * np.sqrt(plan.variances() / 40000))
    np.testing.assert_allclose(Y.var(axis=0), plan.variances(), rtol=0.05)
    k = (Y - exact) / plan.row_factors
    np.testing.assert_array_equal(k, np.round(k))
    stat = plan_release(plan, lambda Y: Y[:, :2].sum(axis=1))(x, np.random.default_rng(1), 10)
    assert stat.shape == (10, 1)
    monkeypatch.setattr(audit_module, "_MAX_BLOCK_ENTRIES", 64)  # memory bound: several smaller copies
    calls.clear()
    Y = plan_release(plan)(x, np.random.default_rng(2), 100)
    assert Y.shape == (100, 4) and len(calls) > 1
    k = (Y - exact) / plan.row_factors
    np.testing.assert_array_equal(k, np.round(k))


def test_zcdp_audit_with_delta_flags_halved_sigma():
    """Gaussian (rho-zCDP) claim converted to (eps(delta), delta); the copy with sigma halved costs
    4 rho.  Statistic: the likelihood-ratio projection of the noisy answers."""
    from sparsedp.privacy import zcdp_to_approx_dp

    plan = plan_measurement(st.hierarchical(4, 2), rho=0.25, noise="gaussian")
    broken = dataclasses.replace(plan, scales=plan.scales / 2, unit_scales=plan.unit_scales / 2)
    x0, x1 = np.array([3, 1, 4, 1]), np.array([4, 1, 4, 1])
    A = plan.strategy.tosparse()
    a0, d = A @ x0, A @ (x1 - x0)
    claim = zcdp_to_approx_dp(0.25, 1e-5)
    out = {}
    for name, p in (("correct", plan), ("broken", broken)):
        w = d / p.scales**2
        out[name] = audit(plan_release(p, lambda Y, w=w: (Y - a0) @ w), x0, x1, trials=400_000, rng=2,
                          batched=True, delta=1e-5)
    assert out["correct"].epsilon_lower <= claim, out["correct"]
    assert out["broken"].epsilon_lower > claim, out["broken"]


def test_generic_events_include_the_orthant():
    """Raw answers of a tree (no hand-made statistic): the neighbour moves four node counts, each by
    a quarter of the loss; no linear projection reaches the orthant's ratio ``e^loss``, the orthant
    statistic does, so the copy with halved scales (loss 2) is flagged from the raw answers."""
    plan = plan_measurement(st.hierarchical(8, 2), epsilon=1.0)
    broken = dataclasses.replace(plan, scales=plan.scales / 2, unit_scales=plan.unit_scales / 2)
    x0 = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    x1 = x0 + np.eye(8, dtype=int)[0]
    bad = audit(plan_release(broken), x0, x1, trials=100_000, rng=4, batched=True)
    good = audit(plan_release(plan), x0, x1, trials=100_000, rng=4, batched=True)
    assert "orthant" in bad.event and bad.epsilon_lower > 1.7, bad  # linear events alone: 1.28 here
    assert good.epsilon_lower <= 1.0, good
