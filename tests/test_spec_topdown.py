"""TopDown specs (``[data] geo``): the release topdown() makes, consistent non-negative integers
with exact invariants, a report from the release's own variances, refusals before any charge."""

import numpy as np
import pytest

from sparsedp import SparseDPError, load_release
from sparsedp.cli import main
from sparsedp.privacy import Accountant
from sparsedp.spec import run_spec
from sparsedp.topdown import read_table, topdown

SPEC = """
[data]
path = "counts.csv"
geo = ["state", "county", "district"]
counts = ["adult_*", "child_*"]
attributes = ["age", "group"]

[strategy]
split = [1, 1, 1, 1]

[privacy]
rho = 0.5

[consistency]
invariants = ["state:total"]

[output]
release = "td.npz"
report = "td.md"
plot = "td.png"
"""


def _write(tmp_path, spec=SPEC):
    rng = np.random.default_rng(3)
    rows = ["state,county,district,adult_a,adult_b,child_a,child_b"]
    for s in ("01", "02"):
        for c in range(3):
            for d in range(int(rng.integers(2, 6))):
                counts = rng.poisson([40, 10, 12, 3])
                rows.append(f"{s},{c:03d},{d:04d}," + ",".join(map(str, counts)))
    (tmp_path / "counts.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "td.toml"
    path.write_text(spec)
    return path


def test_a_topdown_spec_is_the_topdown_release(tmp_path):
    path = _write(tmp_path)
    res = run_spec(path, rng=5)
    table = read_table(tmp_path / "counts.csv", ["state", "county", "district"], ["adult_*", "child_*"],
                       attributes=["age", "group"])
    want = topdown(table, rho=0.5, split=[1, 1, 1, 1], invariants=["state:total"], rng=5, keep_noisy=False)
    for a, b in zip(res.release.counts, want.counts):
        np.testing.assert_array_equal(a, b)
    assert res.release.check() == {k: 0 for k in res.release.check()}
    np.testing.assert_array_equal(res.release.counts[1].sum(axis=1), table.counts[1].sum(axis=1))  # invariant
    assert res.accountant.spent == pytest.approx(0.5) and len(res.accountant.ledger) == 4
    back = load_release(res.files["release"])
    np.testing.assert_array_equal(np.asarray(back.answers), np.asarray(res.result.answers))
    report = res.files["report"].read_text()
    assert "negative 0" in report and "state:total" in report and "| district |" in report
    assert res.files["plot"].stat().st_size > 1000


def test_the_report_names_a_level_that_is_not_measured(tmp_path):
    """Every cell of the root invariant: the root is not measured, the whole rho is charged to the
    other levels, and the report says so."""
    path = _write(tmp_path, SPEC.replace('["state:total"]', '["nation:cells"]').replace(
        "[data]", '[data]\nroot = "nation"'))
    res = run_spec(path, rng=5)
    assert res.accountant.spent == pytest.approx(0.5, rel=1e-12) and len(res.accountant.ledger) == 3
    assert "- not measured: level 'nation' (the invariants determine every cell)" in res.files["report"].read_text()


def test_the_command_line_runs_a_topdown_spec(tmp_path, capsys):
    path = _write(tmp_path)
    assert main(["release", str(path), "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "released" in out and "rho 0.5" in out
    assert main(["ledger", str(tmp_path / "td.npz")]) == 0


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.replace("split = [1, 1, 1, 1]", "split = [1, 1]"), "split"),
    (lambda s: s.replace('["state:total"]', '["nation:total", "zzz"]'), "invariant|level"),
    (lambda s: s.replace('counts = ["adult_*", "child_*"]', 'counts = ["adults"]'), "adults"),
    (lambda s: s.replace('release = "td.npz"', 'release = "td.csv"'), "npz"),
    (lambda s: s.replace("rho = 0.5", "rho = 0.5\nepsilon = 1.0"), "exactly one"),
    (lambda s: s.replace("rho = 0.5", "rho = -1"), "rho"),
    (lambda s: s.replace("[strategy]", "[strategy]\nbranching = 4"), "not used by a TopDown"),
    (lambda s: s + "\n[workload]\nkind = \"prefix\"\n", "'kind': not used by a TopDown"),
    (lambda s: s.replace('attributes = ["age", "group"]', 'attributes = ["age", "group"]\ncolumns = ["a"]'),
     "two kinds"),
])
def test_bad_topdown_specs_are_refused_before_any_charge(tmp_path, edit, match):
    path = _write(tmp_path)
    path.write_text(edit(path.read_text()))
    acc = Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(path, accountant=acc)
    assert not acc.ledger and not (tmp_path / "td.npz").exists()



def test_overlapping_count_columns_need_cells_per_person(tmp_path):
    """A spec whose count columns include their own total is refused before any charge; declared
    with data.cells_per_person, the release is calibrated to a person in two cells."""
    path = _write(tmp_path)
    counts = tmp_path / "counts.csv"
    lines = counts.read_text().splitlines()
    lines = [lines[0] + ",total"] + [ln + f",{sum(map(int, ln.split(',')[3:]))}" for ln in lines[1:]]
    counts.write_text("\n".join(lines) + "\n")
    spec = SPEC.replace('counts = ["adult_*", "child_*"]\nattributes = ["age", "group"]',
                        'counts = ["*_a", "*_b", "total"]')
    declare = lambda k: spec.replace('"*_b", "total"]', f'"*_b", "total"]\ncells_per_person = {k}')  # noqa: E731
    path.write_text(spec)
    acc = Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match="'total' equals the sum of"):
        run_spec(path, accountant=acc)
    assert not acc.ledger and not (tmp_path / "td.npz").exists()
    path.write_text(declare(2))
    res = run_spec(path, rng=1, accountant=acc)
    assert all("2 cells per person" in e.label for e in acc.ledger) and acc.spent == pytest.approx(0.5)
    path.write_text(declare(0))
    with pytest.raises(SparseDPError, match="contributions_per_person"):
        run_spec(path, accountant=Accountant(rho=1.0), force=True)
    assert res.release.description["contributions_per_person"] == 2


RECORDS_SPEC = """
[data]
path = "records.csv"
geo = ["state", "county"]
categories = { age = ["young", "old"], sex = ["f", "m"] }
units = "units.csv"

[privacy]
epsilon = 1.0
unit = "person_id"
max_rows = 3

[output]
release = "td.npz"
"""


def _records(tmp_path, spec=RECORDS_SPEC):
    rng = np.random.default_rng(4)
    units = [("01", "001"), ("01", "002"), ("02", "003")]
    (tmp_path / "units.csv").write_text("state,county\n" + "\n".join(f"{s},{c}" for s, c in units) + "\n")
    rows = ["person_id,state,county,age,sex"]
    for p in range(40):
        for _ in range(int(rng.integers(1, 8))):
            s, c = units[int(rng.integers(0, 3))]
            rows.append(f"p{p},{s},{c},{rng.choice(['young', 'old'])},{rng.choice(['f', 'm'])}")
    (tmp_path / "records.csv").write_text("\n".join(rows) + "\n")
    path = tmp_path / "rec.toml"
    path.write_text(spec)
    return path


def test_a_records_spec_protects_the_declared_unit(tmp_path):
    from sparsedp.privacy_unit import PrivacyUnit

    path = _records(tmp_path)
    acc = Accountant(epsilon=1.0)
    res = run_spec(path, rng=3, accountant=acc)
    unit = PrivacyUnit("person_id", max_rows=3)
    table = read_table(tmp_path / "records.csv", ["state", "county"], categories=["age", "sex"],
                       domain={"age": ["young", "old"], "sex": ["f", "m"]}, units="observed", privacy_unit=unit, rng=3)
    want = topdown(table, epsilon=1.0, rng=3, keep_noisy=False)
    for a, b in zip(res.release.counts, want.counts):  # the same truncation and noise
        np.testing.assert_array_equal(a, b)
    assert res.release.description["privacy_unit"] == unit.describe()
    assert acc.spent == pytest.approx(1.0) and all(e.privacy_unit == "person_id (max_rows 3)" for e in acc.ledger)
    path.write_text(RECORDS_SPEC.replace("max_rows = 3", 'max_rows = "auto"'))
    acc = Accountant(epsilon=1.0)
    res = run_spec(path, rng=3, accountant=acc, force=True)
    assert res.release.description["privacy_unit_bound"]["max_rows"] >= 1
    assert acc.ledger[0].label.startswith("privacy unit: bound") and acc.spent == pytest.approx(1.0)
    assert len(load_release(res.files["release"]).ledger) == len(acc.ledger)


@pytest.mark.parametrize("edit,match", [
    (lambda s: s.replace('unit = "person_id"', 'unit = "nobody"'), "nobody"),
    (lambda s: s.replace('unit = "person_id"\n', ""), "column"),  # bounds without a unit
    (lambda s: s.replace('max_rows = 3', 'max_rows = "many"'), "max_rows"),
    (lambda s: s.replace('units = "units.csv"\n', ""), "data.units"),
    (lambda s: s.replace('sex = ["f", "m"]', 'sex = ["f"]'), "domain"),  # a record's value outside it
    (lambda s: s.replace('max_rows = 3', 'max_rows = "auto"').replace('sex = ["f", "m"]', 'sex = ["f"]'), "domain"),
    (lambda s: s.replace("categories = {", 'counts = ["x"]\ncategories = {'), "one of them"),
])
def test_bad_records_specs_are_refused_before_any_charge(tmp_path, edit, match):
    path = _records(tmp_path, edit(RECORDS_SPEC))
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(path, accountant=acc)
    assert not acc.ledger and not (tmp_path / "td.npz").exists()


def test_a_counts_spec_takes_no_privacy_unit(tmp_path):
    path = _write(tmp_path, SPEC.replace("rho = 0.5", 'rho = 0.5\nunit = "person"\nmax_rows = 2'))
    with pytest.raises(SparseDPError, match="record rows"):
        run_spec(path)


_OPTIMISED = SPEC.replace("split = [1, 1, 1, 1]\n", "")


@pytest.mark.parametrize("marginals, want", [
    ("{ total = 1 }", {"total": 1}),
    ('{ "age+group" = 2, group = 1 }', {"age+group": 2, "group": 1}),
    ('"total"', "total"),
    ("[{ total = 1 }, { total = 1 }, { cells = 1 }, { cells = 1, total = 1 }]",
     [{"total": 1}, {"total": 1}, {"cells": 1}, {"cells": 1, "total": 1}]),
    ("{ county = { total = 1 }, district = { age = 2 } }", [None, None, {"total": 1}, {"age": 2}]),
])
def test_a_spec_workload_is_the_topdown_workload(tmp_path, marginals, want):
    """``[workload] marginals`` (a table, a name, per level as a list root first or by level name)
    gives the release ``topdown(workload=...)`` gives, its design optimised for it."""
    path = _write(tmp_path, _OPTIMISED + f"\n[workload]\nmarginals = {marginals}\n")
    res = run_spec(path, rng=5)
    table = read_table(tmp_path / "counts.csv", ["state", "county", "district"], ["adult_*", "child_*"],
                       attributes=["age", "group"])
    rel = topdown(table, rho=0.5, workload=want, invariants=["state:total"], rng=5, keep_noisy=False)
    for a, b in zip(res.release.counts, rel.counts):
        np.testing.assert_array_equal(a, b)
    assert res.release.design.split_choice.terms == rel.design.split_choice.terms
    assert res.release.design.split == rel.design.split
    assert res.accountant.spent == pytest.approx(0.5)


def test_the_spec_workload_changes_the_design(tmp_path):
    """Totals first measures the districts' totals with more of the budget than the default does,
    and predicts a smaller error for them."""
    designs = []
    for i, extra in enumerate(("", "\n[workload]\nmarginals = { total = 1 }\n")):
        d = tmp_path / str(i)
        d.mkdir()
        designs.append(run_spec(_write(d, _OPTIMISED + extra), rng=5).release.design)
    mae = [dict(zip(c.split_choice.terms, c.split_choice.predicted_term_mae)) for c in designs]
    assert mae[1][("district", "total")] < mae[0][("district", "total")]
    assert designs[1].levels[3].plan is not None


@pytest.mark.parametrize("marginals, match", [
    ("{ nosuch = 1 }", "nosuch"),
    ("{ total = -1 }", "weights"),
    ("{ total = true }", "workload.marginals must be"),
    ("[{ total = 1 }, { total = 1 }]", "2 tables for 4 levels"),
    ("{ town = { total = 1 } }", "unknown level"),
    ("[]", "workload.marginals must be"),
    ("3", "workload.marginals must be"),
])
def test_bad_spec_workloads_are_refused_before_any_charge(tmp_path, marginals, match):
    path = _write(tmp_path, _OPTIMISED + f"\n[workload]\nmarginals = {marginals}\n")
    acc = Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match=match):
        run_spec(path, accountant=acc)
    assert not acc.ledger and not (tmp_path / "td.npz").exists()


def test_a_spec_workload_with_a_given_split_is_refused(tmp_path):
    path = _write(tmp_path, SPEC + "\n[workload]\nmarginals = { total = 1 }\n")
    acc = Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match="would be ignored"):
        run_spec(path, accountant=acc)
    assert not acc.ledger
