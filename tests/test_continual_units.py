"""Continual counters per privacy unit (sparsedp.continual.units, ContinualCounter(privacy_unit=))."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sparsedp.continual import ContinualCounter
from sparsedp.continual.units import fenwick_column_norms, unit_factor, unit_increments, unit_sensitivity
from sparsedp.errors import SparseDPError
from sparsedp.privacy import Accountant
from sparsedp.privacy_unit import PrivacyUnit

UNITS = [
    PrivacyUnit("id", max_rows=3),
    PrivacyUnit("id", max_groups=2, max_rows_per_group=2),
    PrivacyUnit("id", max_rows=3, max_groups=3, max_rows_per_group=2),
]


def _changes(unit: PrivacyUnit, n: int):
    """Every change ``d`` of the increments one unit's truncated rows can make (brute force)."""
    r = unit.max_rows_per_group if unit.grouped else unit.max_rows
    g = unit.max_groups if unit.grouped else n
    k = unit.max_rows if unit.max_rows is not None else g * r
    for d in itertools.product(range(r + 1), repeat=n):
        if np.count_nonzero(d) <= g and sum(d) <= k:
            yield np.array(d, dtype=np.float64)


def _table(rng: np.random.Generator, rows: int, units: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    ids = rng.integers(0, units, rows)
    steps = rng.integers(1, horizon + 1, rows)
    heavy = ids == 0  # unit 0 piles rows into two steps (beyond every bound)
    steps[heavy] = 1 + (np.arange(heavy.sum()) % 2)
    return ids, steps


@pytest.mark.parametrize("unit", UNITS, ids=str)
@pytest.mark.parametrize("kw", [{"epsilon": 1.0}, {"rho": 0.5}], ids=["laplace", "gaussian"])
@pytest.mark.parametrize("weights", ["optimal", "uniform"])
@pytest.mark.parametrize("secure", [False, True], ids=["float", "exact"])
def test_removing_a_whole_unit_moves_the_counter_by_at_most_the_charged_sensitivity(unit, kw, weights, secure) -> None:
    """Unit-level coupling: with unit ``u``'s rows last and one truncation seed, the other units
    keep the same rows, so the increments differ by ``u``'s kept contribution ``d``; the counter's
    measured vector moves by ``||A d||_p <=`` the charged sensitivity; and the bound is the
    brute-force largest change (Laplace) or above it (Gaussian)."""
    rng = np.random.default_rng(3)
    N = 7
    counter = ContinualCounter(N, weights=weights, rng=0, secure=secure, privacy_unit=unit, **kw)
    A = counter.measured_strategy().toarray()
    p = counter.norm
    sens = counter.plan.data_sensitivity
    brute = max(np.linalg.norm(A @ d, p) for d in _changes(unit, N))
    assert brute <= sens
    if p == 1:
        assert sens <= brute * (1 + 1e-9)  # the k largest columns: tight, not ||d||_1 times the largest
    ids, steps = _table(rng, 120, 15, N)
    for u in range(6):
        rest = ids != u
        order = np.r_[np.flatnonzero(rest), np.flatnonzero(~rest)]
        full = unit_increments(steps[order], N, ids[order], unit, rng=11)
        without = unit_increments(steps[order][: rest.sum()], N, ids[order][: rest.sum()], unit, rng=11)
        d = (full - without).astype(np.float64)
        assert np.all(d >= 0) and d.sum() <= unit.l1_bound()
        assert np.linalg.norm(A @ d, p) <= sens * (1 + 1e-12)
    # the heavy unit 0 changes the stream by more than one row's calibration allows
    row_level = ContinualCounter(N, weights=weights, rng=0, secure=secure, **kw).plan.data_sensitivity
    order = np.r_[np.flatnonzero(ids != 0), np.flatnonzero(ids == 0)]
    m = int((ids != 0).sum())
    d = unit_increments(steps[order], N, ids[order], unit, rng=1) - unit_increments(steps[order][:m], N,
                                                                                   ids[order][:m], unit, rng=1)
    assert np.linalg.norm(A @ d, p) > row_level


def test_the_k_largest_columns_beat_the_generic_unit_multiplier() -> None:
    """Binary mechanism (uniform weights), N = 16: columns covered by 5, 4, 4, 3, ... nodes; a unit
    in at most 2 steps with 1 row each moves it by at most 5 + 4 = 9, not 2 x 5 = 10."""
    unit = PrivacyUnit("id", max_groups=2, max_rows_per_group=1)
    norms = fenwick_column_norms(np.ones(16), 1)
    assert sorted(norms)[-3:] == [4.0, 4.0, 5.0]
    assert unit_sensitivity(norms, unit) == 9.0
    assert 1.8 <= unit_factor(np.ones(16), 1, unit) < 1.8 * (1 + 1e-12)
    c = ContinualCounter(16, epsilon=1.0, weights="uniform", rng=0, privacy_unit=unit)
    assert c.plan.data_sensitivity == pytest.approx(9.0) and c.plan.data_sensitivity >= 9.0
    assert PrivacyUnit("id", max_rows=2).l1_bound() * 5 == 10  # what privacy_unit= of the plan would charge


def test_unit_sensitivity_is_the_greedy_optimum() -> None:
    rng = np.random.default_rng(0)
    for unit in UNITS + [PrivacyUnit("id", max_rows=5, max_groups=3, max_rows_per_group=2)]:
        for _ in range(20):
            norms = rng.uniform(0.1, 3.0, 5)
            best = max(float(d @ norms) for d in _changes(unit, 5))
            assert unit_sensitivity(norms, unit) == pytest.approx(best, rel=1e-12)


def test_the_counter_records_the_unit_in_its_ledger_release_and_state(tmp_path) -> None:
    unit = PrivacyUnit("CustomerID", max_groups=3, max_rows_per_group=2)
    acc = Accountant(epsilon=2.0)
    c = ContinualCounter(20, epsilon=1.0, rng=4, privacy_unit=unit, accountant=acc)
    assert acc.ledger[-1].privacy_unit == "CustomerID (max_groups 3, max_rows_per_group 2)"
    assert acc.spent == 1.0
    out = c.run([1, 0, 3, 2])
    rel = c.to_release()
    assert rel.description["privacy_unit"] == unit.describe()
    assert rel.ledger[0]["privacy_unit"] == "CustomerID (max_groups 3, max_rows_per_group 2)"
    assert ContinualCounter(20, epsilon=1.0, rng=4).to_release().description["privacy_unit"] == {
        "privacy_unit": "one row"}
    path = tmp_path / "state.json"
    c.save(path)
    back = ContinualCounter.load(path, privacy_unit=unit)
    assert back.privacy_unit == unit and back.plan.data_sensitivity == c.plan.data_sensitivity
    assert back.update(5) == c.update(5)  # same key, same noise scale
    assert len(out) == 4
    with pytest.raises(SparseDPError, match="privacy_unit"):
        ContinualCounter.load(path, privacy_unit=PrivacyUnit("CustomerID", max_rows=9))
    with pytest.raises(SparseDPError, match="privacy_unit"):
        ContinualCounter.load(path, privacy_unit=PrivacyUnit())  # a one-row resume of a per-unit run


@pytest.mark.parametrize("bad, kw", [
    (PrivacyUnit("id", max_rows="auto"), {}),
    (PrivacyUnit("id", max_rows=3), {"increments": "unit"}),
    ("id", {}),
])
def test_bad_declarations_are_refused_before_any_charge(bad, kw) -> None:
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError):
        ContinualCounter(10, epsilon=1.0, privacy_unit=bad, accountant=acc, **kw)
    assert acc.spent == 0


def test_unit_increments_checks_its_records() -> None:
    unit = PrivacyUnit("id", max_rows=2)
    a = unit_increments(np.array([1, 1, 1, 2, 3]), 4, np.array(["a", "a", "a", "b", "b"]), unit, rng=0)
    assert a.sum() == 4 and a[0] == 2 and a[3] == 0 and a.dtype == np.int64
    with pytest.raises(SparseDPError, match="1 .. 4"):
        unit_increments(np.array([0, 1]), 4, np.array(["a", "b"]), unit)
    with pytest.raises(SparseDPError, match="1 .. 4"):
        unit_increments(np.array([1, 5]), 4, np.array(["a", "b"]), unit)
    with pytest.raises(SparseDPError, match="no value"):
        unit_increments(np.array([1, 2]), 4, np.array(["a", None], dtype=object), unit)
    kept = unit_increments(np.array([1, 2]), 4, np.array(["a", None], dtype=object), unit, drop_missing=True)
    assert kept.tolist() == [1, 0, 0, 0]
    with pytest.raises(SparseDPError, match="auto"):
        unit_increments(np.array([1]), 4, np.array(["a"]), PrivacyUnit("id", max_rows="auto"))


def test_an_audit_with_unit_level_neighbours_stays_below_the_claim() -> None:
    """Neighbours differ by one whole unit: its kept rows, 2 in each of steps 1 and 2, which is the
    worst change (``||A d||_1 = 2 (4 + 3) = 14`` on the binary mechanism, N = 8).  The audit of the
    per-unit counter finds no loss above epsilon 1; the one-row counter is caught."""
    from sparsedp.audit import audit, plan_release

    unit = PrivacyUnit("id", max_groups=2, max_rows_per_group=2)
    ids = np.r_[np.arange(20), np.full(7, 99)]
    steps = np.r_[np.arange(20) % 8 + 1, [1, 1, 1, 2, 2, 2, 2]]
    full = unit_increments(steps, 8, ids, unit, rng=0)
    without = unit_increments(steps[:20], 8, ids[:20], unit, rng=0)
    assert (full - without)[:2].tolist() == [2, 2] and (full - without).sum() == 4
    counter = ContinualCounter(8, epsilon=1.0, weights="uniform", rng=0, privacy_unit=unit)
    assert counter.plan.data_sensitivity == pytest.approx(14.0)
    res = audit(plan_release(counter.plan), full, without, trials=20000, rng=1, batched=True)
    assert res.epsilon_lower <= 1.0
    row_level = ContinualCounter(8, epsilon=1.0, weights="uniform", rng=0)
    assert audit(plan_release(row_level.plan), full, without, trials=20000, rng=1, batched=True).epsilon_lower > 1.0


def test_states_without_a_unit_resume_as_one_row_and_a_bad_unit_is_refused() -> None:
    c = ContinualCounter(10, epsilon=1.0, rng=0)
    c.update(2)
    state = c.state()
    assert state["privacy_unit"] == {"privacy_unit": "one row"}
    old = {k: v for k, v in state.items() if k != "privacy_unit"}  # written before units existed
    assert ContinualCounter.from_state(old).privacy_unit.is_row
    with pytest.raises(SparseDPError, match="privacy_unit"):
        ContinualCounter.from_state({**state, "privacy_unit": {"privacy_unit": "id", "max_rows": 2, "x": 1}})
    with pytest.raises(SparseDPError, match="privacy_unit"):
        ContinualCounter.from_state({**state, "privacy_unit": "id"})


@pytest.mark.parametrize("unit", UNITS, ids=str)
def test_a_stream_truncated_step_by_step_moves_the_counter_by_at_most_the_charged_sensitivity(unit) -> None:
    """True streaming (StreamTruncation): removing a whole unit from the stream changes the
    increments by a change the counter is calibrated for, and the counter by at most its charge."""
    from sparsedp.continual.units import StreamTruncation

    rng = np.random.default_rng(9)
    N = 7
    ids, steps = _table(rng, 150, 12, N)
    counter = ContinualCounter(N, epsilon=1.0, weights="uniform", rng=0, secure=False, privacy_unit=unit)
    A = counter.measured_strategy().toarray()

    def stream(drop=None):
        t = StreamTruncation(unit)
        return np.array([t.step([f"u{i}" for i in ids[(steps == s) & (ids != drop)]]) for s in range(1, N + 1)])

    full = stream()
    for u in range(12):
        d = (full - stream(u)).astype(np.float64)
        r = unit.max_rows_per_group if unit.grouped else unit.max_rows
        g = unit.max_groups if unit.grouped else N
        assert np.all(d >= 0) and np.all(d <= r) and np.count_nonzero(d) <= g and d.sum() <= unit.l1_bound()
        assert np.linalg.norm(A @ d, 1) <= counter.plan.data_sensitivity * (1 + 1e-12)
    assert full[:2].sum() < np.isin(steps, [1, 2]).sum()  # unit 0's pile in steps 1-2 was cut


def test_stream_truncation_state_resumes_and_checks() -> None:
    from sparsedp.continual.units import StreamTruncation

    unit = PrivacyUnit("id", max_rows=5, max_groups=2, max_rows_per_group=2)
    batches = [["a", "a", "a", "b"], ["a", "b", "b"], ["a", "b", "c"], ["c", "c", "c"]]
    one = StreamTruncation(unit)
    whole = [one.step(b) for b in batches]
    assert whole == [3, 3, 1, 2]
    first = StreamTruncation(unit)
    head = [first.step(b) for b in batches[:2]]
    resumed = StreamTruncation.from_state(first.state(), unit)
    assert head + [resumed.step(b) for b in batches[2:]] == whole
    with pytest.raises(SparseDPError, match="another privacy unit"):
        StreamTruncation.from_state(first.state(), PrivacyUnit("id", max_rows=9))
    bad = first.state()
    bad["rows"]["a"] = 99
    with pytest.raises(SparseDPError, match="bounds"):
        StreamTruncation.from_state(bad, unit)
    with pytest.raises(SparseDPError, match="no value"):
        StreamTruncation(unit).step(["a", None])
    assert StreamTruncation(unit, drop_missing=True).step(["a", None]) == 1
    with pytest.raises(SparseDPError, match="auto"):
        StreamTruncation(PrivacyUnit("id", max_rows="auto"))
