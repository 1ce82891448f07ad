"""The privacy unit (sparsedp.privacy_unit): bounds, stable truncation, and unit-level sensitivity
through the one measurement path, checked by brute force on small random tables."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

import sparsedp
from sparsedp.errors import SparseDPError
from sparsedp.measure import plan_measurement
from sparsedp.operators import SparseOperator
from sparsedp.privacy import Accountant
from sparsedp.privacy_unit import (
    IdColumnWarning,
    PrivacyUnit,
    disjoint_columns,
    id_like_columns,
    truncate,
    unit_histogram,
    warn_if_id_like,
)


def _changes(unit: PrivacyUnit, n: int):
    """Every histogram change ``d >= 0`` one unit can make on ``n`` cells under ``unit``'s bounds."""
    top = unit.max_rows_per_group if unit.grouped else unit.max_rows
    for d in itertools.product(range(top + 1), repeat=n):
        v = np.array(d, dtype=float)
        if unit.max_rows is not None and v.sum() > unit.max_rows:
            continue
        if unit.grouped and np.count_nonzero(v) > unit.max_groups:
            continue
        yield v


@pytest.mark.parametrize("k,g,r", [(5, None, None), (None, 2, 3), (4, 2, 3), (7, 3, 2), (2, 3, 3)])
def test_bounds_are_the_largest_change_by_brute_force(k, g, r) -> None:
    unit = PrivacyUnit("id", max_rows=k, max_groups=g, max_rows_per_group=r)
    ds = list(_changes(unit, 4))
    assert unit.l1_bound() == max(d.sum() for d in ds)
    assert unit.l2_bound() == pytest.approx(max(np.linalg.norm(d) for d in ds), rel=1e-15)
    assert unit.l2_bound() >= max(np.linalg.norm(d) for d in ds)


def test_bad_declarations_are_refused() -> None:
    for kwargs in ({"column": "id"}, {"max_rows": 3}, {"column": "id", "max_rows": 0},
                   {"column": "id", "max_rows": 2.5}, {"column": "id", "max_groups": 2},
                   {"column": "", "max_rows": 2}, {"column": "id", "max_rows": True}):
        with pytest.raises(SparseDPError):
            PrivacyUnit(**kwargs)
    assert str(PrivacyUnit()) == "privacy unit: one row"
    assert PrivacyUnit().describe() == {"privacy_unit": "one row"}


def _table(rng: np.random.Generator, rows: int, units: int, cells: int) -> tuple[np.ndarray, np.ndarray]:
    heavy = rng.zipf(1.6, units).clip(1, 60)  # a few units with many rows, as in real data
    ids = rng.choice(units, size=rows, p=heavy / heavy.sum())
    return ids, rng.integers(0, cells, rows)


@pytest.mark.parametrize("unit", [PrivacyUnit("id", max_rows=3), PrivacyUnit("id", max_groups=2, max_rows_per_group=2),
                                  PrivacyUnit("id", max_rows=3, max_groups=2, max_rows_per_group=2)])
def test_truncation_keeps_every_unit_within_its_bounds(unit: PrivacyUnit) -> None:
    rng = np.random.default_rng(0)
    ids, cells = _table(rng, 3000, 200, 6)
    keep = truncate(ids, unit, cells, rng=1)
    for u in np.unique(ids):
        mine = keep & (ids == u)
        per_cell = np.bincount(cells[mine], minlength=6)
        if unit.max_rows is not None:
            assert mine.sum() <= unit.max_rows
            if not unit.grouped:
                assert mine.sum() == min(unit.max_rows, (ids == u).sum())  # nothing dropped needlessly
        if unit.grouped:
            assert np.count_nonzero(per_cell) <= unit.max_groups
            assert per_cell.max() <= unit.max_rows_per_group


@pytest.mark.parametrize("unit", [PrivacyUnit("id", max_rows=3), PrivacyUnit("id", max_rows=4, max_groups=2, max_rows_per_group=3)])
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_removing_a_whole_unit_moves_the_measurement_by_at_most_the_charged_sensitivity(unit, noise) -> None:
    """Unit-level coupling: the table with unit ``u`` appended keeps, for every other unit, the same
    rows (same secret priorities, drawn in row order), so the histograms differ by ``u``'s kept
    contribution; through the plan, one noise seed each side, the measurements differ by
    ``||M d||_p <= `` the charged sensitivity."""
    rng = np.random.default_rng(5)
    n = 5
    M = SparseOperator(sp.random(7, n, density=0.6, random_state=3, data_rvs=lambda k: rng.integers(-3, 4, k)) + sp.eye(7, n))
    kw = {"epsilon": 1.0} if noise == "laplace" else {"rho": 0.5, "noise": "gaussian"}
    plan = plan_measurement(M, privacy_unit=unit, **kw)
    p = 1 if noise == "laplace" else 2
    brute = max(np.linalg.norm(M.matrix @ d, p) for d in _changes(unit, n))
    assert plan.data_sensitivity >= brute - 1e-9
    ids, cells = _table(rng, 400, 40, n)
    for u in range(5):
        rest = ids != u
        order = np.r_[np.flatnonzero(rest), np.flatnonzero(~rest)]  # u's rows last
        full = unit_histogram(cells[order], n, ids[order], unit, rng=11)
        without = unit_histogram(cells[order][: rest.sum()], n, ids[order][: rest.sum()], unit, rng=11)
        d = full - without
        assert np.all(d >= 0) and d.sum() <= unit.l1_bound() and np.linalg.norm(d) <= unit.l2_bound()
        gap = np.linalg.norm(plan.measure(full, rng=u).y - plan.measure(without, rng=u).y, p)
        assert gap <= plan.data_sensitivity + 1e-9


def test_gaussian_on_disjoint_columns_uses_the_l2_bound() -> None:
    unit = PrivacyUnit("id", max_groups=4, max_rows_per_group=2)
    ident = plan_measurement(np.eye(6), rho=0.5, noise="gaussian", privacy_unit=unit)
    assert disjoint_columns(ident.strategy) and ident.data_sensitivity == pytest.approx(4.0)  # sqrt(4) * 2
    tree = plan_measurement(sparsedp.strategies.hierarchical(8, 2), rho=0.5, noise="gaussian", privacy_unit=unit)
    assert not disjoint_columns(tree.strategy)
    base = plan_measurement(sparsedp.strategies.hierarchical(8, 2), rho=0.5, noise="gaussian")
    assert tree.data_sensitivity == pytest.approx(8 * base.data_sensitivity)  # ||d||_1 = 8
    lap = plan_measurement(np.eye(6), epsilon=1.0, privacy_unit=unit)
    assert lap.data_sensitivity == 8.0


def test_the_ledger_names_the_unit() -> None:
    acct = Accountant(epsilon=2.0)
    unit = PrivacyUnit("CustomerID", max_rows=50)
    mech = sparsedp.MatrixMechanism(np.eye(4), np.eye(4), epsilon=1.0, privacy_unit=unit, accountant=acct)
    mech.run(np.array([3.0, 0.0, 5.0, 1.0]))
    assert acct.ledger[-1].privacy_unit == "CustomerID (max_rows 50)"
    assert acct.ledger[-1].as_dict()["privacy_unit"] == "CustomerID (max_rows 50)"
    assert mech.sensitivity == 50.0
    plain = sparsedp.MatrixMechanism(np.eye(4), np.eye(4), epsilon=1.0)
    assert plain._plan.privacy_unit is None


def test_missing_unit_ids_are_refused_unless_dropped() -> None:
    ids = np.array([1.0, np.nan, 2.0, 2.0])
    with pytest.raises(SparseDPError, match="no value"):
        truncate(ids, PrivacyUnit("id", max_rows=1), rng=0)
    keep = truncate(ids, PrivacyUnit("id", max_rows=1), rng=0, drop_missing=True)
    assert not keep[1] and keep.sum() == 2
    obj = np.array(["a", None, "b", "a"], dtype=object)
    assert truncate(obj, PrivacyUnit("id", max_rows=1), rng=0, drop_missing=True).sum() == 2


def test_secure_truncation_is_uniform_over_a_units_rows() -> None:
    ids = np.zeros(4, dtype=int)
    kept = np.array([np.flatnonzero(truncate(ids, PrivacyUnit("id", max_rows=1)))[0] for _ in range(800)])
    freq = np.bincount(kept, minlength=4) / kept.size
    assert np.all(np.abs(freq - 0.25) < 0.07)


def test_id_like_columns_warn_once_without_a_unit() -> None:
    assert id_like_columns(["CustomerID", "user_name", "amount", "day", "order_id", "valid"]) == [
        "CustomerID", "user_name", "order_id"]
    with pytest.warns(IdColumnWarning, match="CustomerID"):
        warn_if_id_like(["Quantity", "CustomerID"], None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_id_like(["CustomerID"], PrivacyUnit("CustomerID", max_rows=5)) == []
        assert warn_if_id_like(["amount"], None) == []


def test_row_budget_gives_the_unit_budget_through_the_group_bound() -> None:
    unit = PrivacyUnit("id", max_rows=7)
    assert unit.row_budget("laplace", 1.0) * 7 <= 1.0
    assert unit.row_budget("gaussian", 0.5) * 49 <= 0.5
    grouped = PrivacyUnit("id", max_groups=4, max_rows_per_group=1)
    assert grouped.row_budget("gaussian", 0.5, disjoint_columns=True) == pytest.approx(0.5 / 4)
    with pytest.raises(SparseDPError, match="auto"):
        PrivacyUnit("id", max_rows="auto").l1_bound()


def test_release_files_and_the_ledger_say_whom_they_protect(tmp_path) -> None:
    from sparsedp.release_file import ledger_rows

    unit = PrivacyUnit("CustomerID", max_rows=50)
    rel = sparsedp.MatrixMechanism(np.eye(3), np.eye(3), epsilon=1.0, privacy_unit=unit).run(np.array([1.0, 2, 3]))
    saved = rel.to_release().save(tmp_path / "unit.npz")
    lines = ledger_rows(sparsedp.load_release(saved))
    assert "protects: one CustomerID (max_rows 50)" in lines[1] and "per CustomerID (max_rows 50)" in lines[2]
    plain = sparsedp.MatrixMechanism(np.eye(3), np.eye(3), epsilon=1.0).run(np.array([1.0, 2, 3])).to_release()
    assert plain.description["privacy_unit"] == "one row"
    assert ledger_rows(plain)[1].strip() == "protects: one row"


def test_an_audit_with_unit_level_neighbours_stays_below_the_claim() -> None:
    """Neighbours differ by one whole unit (its kept rows, up to max_rows = 4 in one cell):
    the audit of the unit-level release finds no loss above epsilon 1."""
    from sparsedp.audit import audit, plan_release

    unit = PrivacyUnit("id", max_rows=4)
    ids = np.r_[np.arange(30), np.full(9, 99)]  # unit 99 has 9 rows, all in cell 0
    cells = np.r_[np.arange(30) % 6, np.zeros(9, dtype=int)]
    full = unit_histogram(cells, 6, ids, unit, rng=0)
    without = unit_histogram(cells[:30], 6, ids[:30], unit, rng=0)
    assert (full - without).tolist() == [4, 0, 0, 0, 0, 0]
    plan = plan_measurement(np.eye(6), epsilon=1.0, privacy_unit=unit)
    res = audit(plan_release(plan), full, without, trials=20000, rng=1, batched=True)
    assert res.epsilon_lower <= 1.0
    row_level = plan_measurement(np.eye(6), epsilon=1.0)  # calibrated to one row: the audit sees the gap
    assert audit(plan_release(row_level), full, without, trials=20000, rng=1, batched=True).epsilon_lower > 1.0
