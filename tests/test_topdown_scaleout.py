"""The TopDown release chunked by subtree (sparsedp.topdown.scaleout): the same bits as the in-process
release on Dask, exact invariants and no violations, the chunked release directory read back by
the common loader, Parquet parts read by the workers, and bad input refused before any charge or
noise."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from test_topdown import CELLS, single_state, small_frame, table

from sparsedp import Accountant
from sparsedp.errors import (
    BudgetExceededError,
    InfeasibleConstraintsError,
    InvalidPrivacyParameterError,
    NegativeCountError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
)
from sparsedp.executors import DaskExecutor
from sparsedp.measure import MeasurementPlan
from sparsedp.releases import load_release
from sparsedp.topdown import HierarchicalTable, Invariant, OptimalSplit, load_topdown, topdown, topdown_from_result
from sparsedp.topdown.scaleout import (
    ParquetSource,
    SubtreeData,
    SyntheticNation,
    TableSource,
    load_chunked,
    split_subtrees,
    topdown_scaleout,
)

CLEAN = {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}


def _county_totals(t):
    """The table's county totals, ``(counties, 1)``."""
    return t.counts[2].sum(axis=1, keepdims=True)


def _moved_county_totals(t):
    """The table's county totals with one person moved between two counties of one state: every
    state's total (and the nation's) is the data's, two counties' are not."""
    totals = _county_totals(t).copy()
    parents = np.asarray(t.hierarchy.parents[2])
    state = int(np.flatnonzero(np.bincount(parents) >= 2)[0])
    first, second = np.flatnonzero(parents == state)[:2]
    totals[first] += 1
    totals[second] -= 1
    if totals[second] < 0:  # keep the values counts: move the person the other way
        totals[first] -= 2
        totals[second] += 2
    return totals


@pytest.fixture(scope="module")
def cluster():
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=False)
    yield ex
    ex.close()


def _budget(cfg):
    return Accountant(rho=cfg["rho"]) if "rho" in cfg else Accountant(epsilon=cfg["epsilon"])


def _same(a, b):
    for key in ("counts", "estimate", "variance"):
        for d, (x, y) in enumerate(zip(getattr(a, key), getattr(b, key))):
            assert x.dtype == y.dtype and x.shape == y.shape, (key, d)
            assert np.array_equal(x, y), (key, d)  # bit for bit (no tolerance)


CONFIGS = [
    (dict(rho=0.5), 1),
    (dict(rho=0.5, invariants=["state:total"]), 1),
    (dict(epsilon=1.0, split=[1, 1, 2, 3]), 1),
    (dict(rho=0.7, queries={"cells": 2, "total": 1, "age": 1}, split=[2, 1, 1, 1], invariants=["state:total"]), 1),
    (dict(rho=0.6, queries={"cells": 3, "race": 1}, split=[1, 0, 1, 1]), 1),
    (dict(rho=0.5, invariants=["county:age", "state:total"]), "county"),  # transport rounding at the top
    (dict(rho=0.5, workload={"total": 1}, invariants=["state:total"]), 1),  # totals rounded before cells
]


@pytest.mark.parametrize("cfg, level", CONFIGS)
def test_dask_release_is_the_in_process_release_bit_for_bit(tmp_path, cluster, cfg, level):
    t = table(4, high=12)  # unbalanced: some counties are leaves
    acc_a, acc_b = _budget(cfg), _budget(cfg)
    a = topdown(t, rng=7, subtree_level=level, accountant=acc_a, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=7, subtree_level=level, accountant=acc_b, executor=cluster,
                         per_part=2, progress=False, **cfg)
    bt = b.to_topdown()
    _same(a, bt)
    assert a.to_pandas().equals(b.to_pandas())
    assert b.check() == CLEAN and bt.check() == CLEAN and a.check() == CLEAN
    # the same charge: one entry per measured level, the same labels, costs and sizes
    assert acc_a.spent_exact == acc_b.spent_exact
    key = "rho" if "rho" in cfg else "epsilon"
    assert [(e.label, getattr(e.cost, key), e.rows, e.columns) for e in a.ledger] == [
        (e["label"], e[key], e["rows"], e["columns"]) for e in b.ledger]
    assert b.private is False and a.private is False  # seeded: reproducible, not private


def _same_run(a, b, acc_a, acc_b):
    """The chunked release ``b`` is the in-process ``a``: counts, estimates, variances bit for bit,
    the same charge and ledger, the same design description (its optimised choice included)."""
    import json

    _same(a, b.to_topdown())
    assert b.check() == CLEAN and a.check() == CLEAN
    assert acc_a.spent_exact == acc_b.spent_exact
    assert [e.as_dict()["label"] for e in a.ledger] == [e["label"] for e in b.ledger]
    plain = json.loads(json.dumps(a.description, default=str))
    for key in ("levels", "skipped", "split_choice", "invariants", "exact_disclosures", "spent"):
        assert b.description.get(key) == plain.get(key), key


@pytest.mark.parametrize("cfg", [
    dict(rho=0.5),  # the default: the optimised design (split=None)
    dict(rho=0.5, split="optimal", workload={"cells": 1, "age": 2}),
    dict(rho=0.5, split=OptimalSplit(queries=False), invariants=["state:total"]),
    dict(rho=0.6, workload=[{"total": 1}, {"total": 1}, {"cells": 1}, {"cells": 1, "race": 1}]),
    dict(epsilon=1.0, invariants=["county:total"]),  # Laplace, an invariant below the subtree level
    dict(rho=0.5, split="equal", workload={"total": 1}),  # the workload unused, as in process
])
def test_the_optimised_design_is_chosen_on_the_whole_structure(tmp_path, cfg):
    """The optimised design (the default, ``"optimal"``, an OptimalSplit, for a workload) is chosen
    on the whole public structure gathered from the parts -- not on the skeleton the chunked path
    plans -- so the release, its ledger and its description (the choice) are the in-process ones."""
    t = table(4, high=12)
    acc_a, acc_b = _budget(cfg), _budget(cfg)
    a = topdown(t, rng=9, accountant=acc_a, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=9, accountant=acc_b, per_part=2, progress=False, **cfg)
    _same_run(a, b, acc_a, acc_b)
    assert ("split_choice" in b.description) == (cfg.get("split") != "equal")


@pytest.mark.parametrize("invariants, level", [
    (["county:total"], 1),
    (["vtd:age", "state:total"], 1),  # pinned at every level, the transport rounding below the subtrees' roots
    (["county:cells"], 1),  # a level published exactly
    (["vtd:total"], "county"),
])
def test_invariants_below_the_subtree_level_from_the_data(tmp_path, cluster, invariants, level):
    """Invariants below the subtree level are taken by each task from its own subtrees' counts (read
    again for the release: never written to the scratch files) and are exact; the release is the
    in-process one bit for bit, on Dask."""
    t = table(4, high=12)
    cfg = dict(rho=0.8, invariants=invariants, subtree_level=level)
    acc_a, acc_b = _budget(cfg), _budget(cfg)
    a = topdown(t, rng=4, accountant=acc_a, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=4, accountant=acc_b, executor=cluster, per_part=2, progress=False,
                         **cfg)
    _same_run(a, b, acc_a, acc_b)
    bt = b.to_topdown()
    for spec in invariants:
        lev, _, marg = spec.partition(":")
        d = t.hierarchy.level_index(lev)
        ax = t.cells.axes(marg)
        assert np.array_equal(t.cells.marginal(bt.counts[d], ax), t.cells.marginal(t.counts[d], ax))


def test_explicit_invariant_values(tmp_path):
    """Explicit invariant values, at and below the subtree level (not the data's: the release keeps
    the given ones), are checked on the driver before any charge and give the in-process release."""
    t = table(4, high=12)
    totals = _county_totals(t) + np.arange(t.hierarchy.sizes[2])[:, None] % 3  # not the data's totals
    ages = t.cells.marginal(t.counts[1], t.cells.axes("age"))
    for invariants in ([Invariant("county", "total", totals)],
                       [Invariant("state", "age", ages), Invariant("county", "total", t.counts[2].sum(axis=1))]):
        acc_a, acc_b = Accountant(rho=1.0), Accountant(rho=1.0)
        a = topdown(t, rho=0.7, rng=2, accountant=acc_a, invariants=invariants)
        b = topdown_scaleout(t, tmp_path / f"rel{len(invariants)}", rho=0.7, rng=2, accountant=acc_b,
                             invariants=invariants, per_part=2, progress=False)
        _same_run(a, b, acc_a, acc_b)
    assert np.array_equal(b.to_topdown().counts[2].sum(axis=1), t.counts[2].sum(axis=1))
    first = topdown_scaleout(t, tmp_path / "rel3", rho=0.7, rng=2, invariants=[Invariant("county", "total", totals)],
                             progress=False)
    assert np.array_equal(first.to_topdown().counts[2].sum(axis=1, keepdims=True), totals)


@pytest.mark.parametrize("invariants", [
    # explicit values finer than the data's: the workers pin the explicit county x age values
    lambda t: ["county:total", Invariant("county", "age", t.cells.marginal(t.counts[2], t.cells.axes("age")))],
    # the data's finer than explicit values: the workers pin their own counties' age marginal
    lambda t: ["county:age", Invariant("county", "total", _county_totals(t)), "state:total"],
    # explicit values at the subtree level and below it, the data's at every level
    lambda t: [Invariant("state", "total", t.counts[1].sum(axis=1)), "county:cells",
               Invariant("county", "race", t.cells.marginal(t.counts[2], t.cells.axes("race")))],
])
def test_explicit_values_meeting_invariants_from_the_data_below_the_subtree_level(tmp_path, invariants):
    """Below the subtree level, where explicit invariant values meet an invariant taken from the
    data, every part is read once more before the charge to check, subtree by subtree, that they
    agree; the workers then pin the finest of them, and the release is the in-process one bit for
    bit (counts, estimates, variances, ledger)."""
    t = table(4, high=12)
    cfg = dict(rho=0.8, invariants=invariants(t))
    acc_a, acc_b = _budget(cfg), _budget(cfg)
    a = topdown(t, rng=5, accountant=acc_a, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=5, accountant=acc_b, executor="threads", per_part=2,
                         progress=False, **cfg)
    _same_run(a, b, acc_a, acc_b)
    assert [(e.label, e.cost.rho, e.rows, e.columns) for e in a.ledger] == [
        (e["label"], e["rho"], e["rows"], e["columns"]) for e in b.ledger]
    assert "check invariants" in b.timings  # the agreement was read before the charge
    bt = b.to_topdown()
    assert np.array_equal(bt.counts[2].sum(axis=1), t.counts[2].sum(axis=1))  # every county total is kept


def test_explicit_values_disagreeing_with_the_data_below_the_subtree_level(tmp_path, monkeypatch):
    """Explicit county totals that are not the data's (every state total is) meet an invariant from
    the data below the subtree level: InfeasibleConstraintsError, as in process, naming the subtree,
    before any noise, charge or file."""
    t = table(4, high=12)
    invariants = ["vtd:age", Invariant("county", "total", _moved_county_totals(t))]
    with pytest.raises(InfeasibleConstraintsError):
        topdown(t, rho=0.8, rng=1, invariants=invariants)
    calls = []
    real = MeasurementPlan.measure
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    acc = Accountant(rho=1.0)
    with pytest.raises(InfeasibleConstraintsError, match="subtree .*disagree at level 'county'"):
        topdown_scaleout(t, tmp_path / "rel", rho=0.8, rng=1, invariants=invariants, accountant=acc,
                         executor="threads", per_part=2, progress=False)
    assert acc.spent == 0 and not acc.ledger and not calls
    assert not (tmp_path / "rel").exists() and not list(tmp_path.iterdir())  # no output, no scratch


# -- crossed invariants: rounded on the driver, at or above the subtree level ----------------------


def _crossed_table(seed=4, high=12):
    """An age x race x sex table (state > county > district, some counties leaves)."""
    from test_topdown_crossed import cross_table

    return cross_table(seed, high=high)


def _official(t, level, marg, bump=0):
    """The data's values of ``marg`` at ``level`` (explicit, as official figures), the first cell of
    every unit raised by ``bump``."""
    d = t.hierarchy.level_index(level)
    vals = t.cells.marginal(t.counts[d], t.cells.axes(marg)).copy()
    vals[:, 0] += bump
    return Invariant(level, marg, vals)


CROSSED = [
    (lambda t: ["state:age", "state:race"], 1),  # crossed at the subtree level
    (lambda t: ["state:age", "state:race", "county:total"], "county"),  # above it, nested at it
    (lambda t: ["county:age+sex", "county:race", "state:total"], "county"),
    (lambda t: ["state:age", "state:race", "state:sex"], 1),  # three marginals
    # official values, not the data's (raised alike: they agree on what they share), kept exactly
    (lambda t: [_official(t, "state", "age", 2), _official(t, "state", "race", 2)], "county"),
    (lambda t: ["state:age", _official(t, "state", "race"), "nation:sex"], 1),  # the data's met by official ones
]


@pytest.mark.parametrize("make, level", CROSSED, ids=[str(i) for i in range(len(CROSSED))])
def test_crossed_invariants_at_and_above_the_subtree_level(tmp_path, make, level):
    """Crossed invariants meeting at or above the subtree level are rounded on the driver (with the
    in-process rounding of :mod:`sparsedp.topdown.crossed`): the chunked release is the in-process
    one bit for bit (counts, estimates, variances, charge, ledger, description with its rounding
    report), and every invariant holds exactly at its level and above."""
    t = _crossed_table()
    invariants = make(t)
    for cfg in (dict(rho=0.6), dict(epsilon=1.0)):
        acc_a, acc_b = _budget(cfg), _budget(cfg)
        a = topdown(t, rng=6, subtree_level=level, accountant=acc_a, invariants=invariants, **cfg)
        b = topdown_scaleout(t, tmp_path / f"rel{len(cfg)}{list(cfg)[0]}", rng=6, subtree_level=level,
                             accountant=acc_b, invariants=invariants, per_part=2, progress=False, **cfg)
        _same_run(a, b, acc_a, acc_b)
        assert b.description["rounding"] == a.description["rounding"]
        assert b.description["subtree_level"] == t.hierarchy.levels[t.hierarchy.level_index(level)]
        bt = b.to_topdown()
        for inv in invariants:
            iv = Invariant.parse(inv)
            d, ax = t.hierarchy.level_index(iv.level), t.cells.axes(iv.marginal)
            want = t.cells.marginal(t.counts[d], ax) if iv.values is None else np.asarray(iv.values)
            for e in range(d, -1, -1):  # at its level and every level above
                assert np.array_equal(t.cells.marginal(bt.counts[e], ax), want), (inv, e)
                want = t.hierarchy.children_sum(e - 1, want) if e else want


def _fallback_table(states=4):
    """nation > state > county > district, age x race cells: in every state one county holds one
    (adult, a) person and the other one (minor, b), each in the first of its two districts.  With
    the counties' age and race invariant, a state's (and the nation's) cells rounded to (adult, b)
    + (minor, a) -- as noisy estimates often are -- leave its counties no integer table: the
    fallback makes the state the sum of its counties and the nation the sum of its states."""
    import pandas as pd

    rows = []
    for st in range(states):
        for county, cell in (("001", "vap_a"), ("002", "u18_b")):
            for vtd in ("0001", "0002"):
                row = {"state": f"{st + 1:02d}", "county": county, "vtd": vtd, "vap_a": 0, "vap_b": 0, "u18_a": 0,
                       "u18_b": 0}
                row[cell] = int(vtd == "0001")
                rows.append(row)
    return HierarchicalTable.from_counts(pd.DataFrame(rows), ["state", "county", "vtd"], "vap_*,u18_*",
                                         attributes=("age", "race"), root="nation")


def test_the_crossed_fallback_on_the_driver_is_the_in_process_one(tmp_path):
    """A release whose crossed rounding falls back (a state and the nation summed again from the
    counties, on the driver) is still the in-process release bit for bit, the fallbacks counted
    alike; the districts below are rounded from the counties' final counts, every invariant exact."""
    t = _fallback_table()
    inv = ["county:age", "county:race"]
    seed = next((r for r in range(30)
                 if topdown(t, rho=0.05, rng=r, subtree_level="county", invariants=inv)
                 .description["rounding"]["crossed_fallbacks"]), None)
    assert seed is not None  # half the states' tables round the wrong way at this noise
    acc_a, acc_b = Accountant(rho=0.05), Accountant(rho=0.05)
    a = topdown(t, rho=0.05, rng=seed, subtree_level="county", invariants=inv, accountant=acc_a)
    b = topdown_scaleout(t, tmp_path / "rel", rho=0.05, rng=seed, subtree_level="county", invariants=inv,
                         accountant=acc_b, per_part=3, progress=False)
    _same_run(a, b, acc_a, acc_b)
    assert b.description["rounding"] == a.description["rounding"] and a.description["rounding"]["crossed_fallbacks"]
    bt = b.to_topdown()
    for d in (0, 1, 2):  # the counties' marginals fix them, and the sums above
        assert np.array_equal(bt.counts[d], t.counts[d])


@pytest.mark.parametrize("invariants, level, need", [
    (["county:age", "county:race"], 1, "county"),
    (["vtd:age", "county:race", "state:total"], "state", "county"),  # nested in the root's total
    (["vtd:age", "vtd:race"], "county", "vtd"),
    (["state:age", "state:race", "vtd:race+sex", "county:age+sex"], 1, "county"),  # the deepest meeting
])
def test_crossed_invariants_below_the_subtree_level_are_refused_before_anything(tmp_path, monkeypatch, invariants,
                                                                                level, need):
    """Crossed invariants meeting below the subtree level (a fallback there would change a subtree's
    root after the parts are split) are refused before any part is read, any noise drawn or budget
    charged, naming the subtree level that takes them."""
    import sparsedp.topdown.scaleout as sc

    calls = []
    real = MeasurementPlan.measure
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    monkeypatch.setattr(sc, "validate_part", lambda *a: calls.append("read"))
    acc = Accountant(rho=1.0)
    with pytest.raises(UnsupportedStructureError, match=f"below the subtree level.*subtree_level='{need}'"):
        topdown_scaleout(_crossed_table(), tmp_path / "rel", rho=0.5, rng=1, invariants=invariants,
                         subtree_level=level, accountant=acc, progress=False)
    assert acc.spent == 0 and not acc.ledger and not calls
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("cfg", [dict(rho=0.5), dict(rho=0.5, invariants=["county:total"]),
                                 dict(epsilon=1.0, split=[1, 1, 2, 3], invariants=["vtd:age"])])
def test_the_error_summary_is_the_whole_hierarchy_s(tmp_path, cfg):
    """The chunked design is planned on a skeleton, whose own error summary is not the real one; the
    release records the summary of the whole public structure (shape classes, no data): the
    in-process design's, level by level, and chunked_error_table prints it without planning again."""
    from sparsedp.topdown.cli import chunked_error_table, error_table

    t = table(4, high=12)
    a = topdown(t, rng=3, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=3, progress=False, **cfg)
    want = a.design.error_summary()
    got = load_chunked(tmp_path / "rel").description["error_summary"]
    assert [r["units"] for r in got] == list(t.hierarchy.sizes) == [r["units"] for r in want]
    for r, w in zip(got, want):
        assert r["level"] == w["level"] and r["skipped"] == w["skipped"]
        for key in ("sd_cell", "half_width_cell", "sd_total", "half_width_total"):
            assert r[key] == pytest.approx(w[key], rel=1e-9, abs=1e-12), (r["level"], key)
    assert chunked_error_table(b) == error_table(a.design)


@pytest.mark.parametrize("cfg", [dict(rho=0.8, invariants=["state:total"]), dict(rho=0.8, invariants=["nation:cells"])])
def test_a_level_without_information_is_skipped_alike_in_process_and_chunked(tmp_path, cfg):
    """One state read the natural way (root and state the same units) or the root's every cell
    invariant: the chunked design skips the same level as the in-process one (decided on the real
    hierarchy, not the skeleton), spends the whole budget, and gives the same release."""
    t = single_state(4)
    acc_a, acc_b = _budget(cfg), _budget(cfg)
    a = topdown(t, rng=5, accountant=acc_a, **cfg)
    b = topdown_scaleout(t, tmp_path / "rel", rng=5, accountant=acc_b, per_part=2, progress=False, **cfg)
    assert [s["level"] for s in a.description["skipped"]] == ["nation"]
    assert b.description["skipped"] == a.description["skipped"]
    assert acc_a.spent_exact == acc_b.spent_exact and float(acc_a.spent) == pytest.approx(0.8, rel=1e-12)
    _same(a, b.to_topdown())


def test_the_noise_is_keyed_by_subtree():
    """Another subtree level keys the noise differently (another release); the same one in-process
    twice is the same; subtrees' streams are independent of how subtrees are grouped in tasks."""
    t = table(2, high=10)
    a1 = topdown(t, rho=1.0, rng=3)
    a2 = topdown(t, rho=1.0, rng=3)
    b = topdown(t, rho=1.0, rng=3, subtree_level="county")
    _same(a1, a2)
    assert not all(np.array_equal(x, y) for x, y in zip(a1.estimate, b.estimate))


@pytest.mark.parametrize("per_part", [1, 3])
def test_grouping_of_subtrees_into_tasks_changes_nothing(tmp_path, per_part):
    t = table(6, high=8)
    a = topdown(t, rho=0.8, rng=11, invariants=["state:total"])
    b = topdown_scaleout(t, tmp_path / "r", rho=0.8, rng=11, invariants=["state:total"], per_part=per_part,
                         progress=False)
    _same(a, b.to_topdown())


def test_synthetic_nation_generated_by_the_workers(tmp_path, cluster):
    """A small synthetic nation generated state by state on the workers: the in-process release of
    the same nation, bit for bit; invariants exact; no violation."""
    nat = SyntheticNation(states=3, counties=4, tracts=3, blocks=6, seed=1)
    t = nat.table()
    a = topdown(t, rho=1.0, rng=5, invariants=["state:total"])
    b = topdown_scaleout(nat, tmp_path / "r", rho=1.0, rng=5, invariants=["state:total"], executor=cluster,
                         progress=False)
    bt = b.to_topdown()
    _same(a, bt)
    assert b.check() == CLEAN and bt.check() == CLEAN
    truth = t.counts[1].sum(axis=1)
    assert np.array_equal(bt.counts[1].sum(axis=1), truth)  # state totals exact
    assert all((c >= 0).all() and c.dtype == np.int64 for c in bt.counts)
    assert b.description["hierarchy"]["units"] == list(t.hierarchy.sizes)


def test_load_the_chunked_release(tmp_path):
    t = table(3, high=9)
    a = topdown(t, rho=0.9, rng=2, invariants=["state:total"])
    b = topdown_scaleout(t, tmp_path / "rel", rho=0.9, rng=2, invariants=["state:total"], progress=False)
    assert b.check() == CLEAN and b.path == str(tmp_path / "rel")
    assert sorted(p.name for p in (tmp_path / "rel").iterdir()) == ["parts", "top.npz", "topdown.json"]
    r = load_release(tmp_path / "rel")  # the common loader: a ReleaseResult of kind topdown
    ra = a.to_release()
    assert r.kind == "topdown" and r.private is False and r.noise == "gaussian"
    assert np.array_equal(np.asarray(r.answers), np.asarray(ra.answers))
    assert np.array_equal(r.variances, ra.variances)
    assert np.array_equal(np.asarray(r.labels["depth"]), np.asarray(ra.labels["depth"]))
    assert [e["label"] for e in r.ledger] == [e["label"] for e in ra.ledger]
    lo, hi = r.confidence_intervals(0.9)
    assert np.all(lo <= hi)
    back = load_topdown(tmp_path / "rel")  # one row per unit: level, depth, the codes, one column per cell
    frame = back.to_pandas()
    assert frame.equals(a.to_pandas()) and list(frame.columns[:2]) == ["level", "depth"]
    assert list(frame.columns[-len(CELLS):]) == list(t.cells.columns) and len(frame) == t.hierarchy.units
    assert back.check() == CLEAN and back.invariants[0]["level"] == "state"
    assert topdown_from_result(r).to_pandas().equals(frame)
    assert load_chunked(tmp_path / "rel" / "topdown.json").check() == CLEAN
    parts = list(load_chunked(tmp_path / "rel").parts())
    assert sum(len(p["depth"]) for p in parts) == t.hierarchy.units
    (tmp_path / "rel" / "parts" / "part-00001.npz").unlink()
    with pytest.raises(SparseDPError, match="missing"):
        load_release(tmp_path / "rel")


def test_a_manifest_naming_files_outside_its_directory_is_refused(tmp_path):
    """A chunked TopDown directory's topdown.json names its files: a name with '..', an absolute path
    or a symlink leading out of the directory would present another file (another release, or the
    true counts saved with the same arrays) as this release's; each is refused before it is read."""
    import json
    import shutil

    from sparsedp.errors import UnsafeFileError

    t = table(3, high=9)
    topdown_scaleout(t, tmp_path / "rel", rho=0.9, rng=2, progress=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(tmp_path / "rel" / "top.npz", elsewhere / "top.npz")  # a well-formed file outside the release
    manifest = json.loads((tmp_path / "rel" / "topdown.json").read_text())
    (tmp_path / "rel" / "link.npz").symlink_to(elsewhere / "top.npz")
    for name in ("../elsewhere/top.npz", str(elsewhere / "top.npz"), "link.npz"):
        crafted = tmp_path / "crafted"
        shutil.rmtree(crafted, ignore_errors=True)
        shutil.copytree(tmp_path / "rel", crafted, symlinks=True)
        (crafted / "topdown.json").write_text(json.dumps({**manifest, "files": [name] + manifest["files"][1:]}))
        for read in (load_release, load_chunked, load_topdown):
            with pytest.raises(UnsafeFileError, match="directory"):
                read(crafted)
        with pytest.raises(UnsafeFileError):  # a manifest changed after it was opened: parts() checks again
            list(type(load_chunked(tmp_path / "rel"))(str(crafted), {**manifest, "files": [name]}).parts())


def test_parquet_partitions_are_read_by_the_workers(tmp_path, cluster):
    frame = small_frame(9, high=7)
    frame.to_parquet(tmp_path / "data", partition_cols=["state"], index=False)
    src = ParquetSource(str(tmp_path / "data"), ("state", "county", "vtd"), "vap_*,u18_*", attributes=("age", "race"),
                        root="nation")
    t = HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], "vap_*,u18_*", attributes=("age", "race"),
                                      root="nation")
    a = topdown(t, rho=0.5, rng=4, invariants=["state:total"])
    b = topdown_scaleout(src, tmp_path / "rel", rho=0.5, rng=4, invariants=["state:total"], executor=cluster,
                         progress=False)
    _same(a, b.to_topdown())
    assert b.to_pandas().equals(a.to_pandas())


# -- bad input: refused before anything is charged or drawn ----------------------------------------


class _BadPart:
    def __init__(self, sub):
        self.sub = sub

    def read(self):
        return [self.sub]


class _BadSource:
    """A source one of whose parts has a negative count."""

    def __init__(self, t):
        self.t = t
        self.levels = t.hierarchy.levels
        self.cells = t.cells
        self.in_order = True

    def parts(self, s):
        subs = split_subtrees(self.t, s)
        c = [x.copy() for x in subs[-1].counts]
        c[-1][0, 0] = -1
        bad = SubtreeData(subs[-1].path, subs[-1].hierarchy, tuple(c))
        return [_BadPart(x) for x in subs[:-1]] + [_BadPart(bad)]


@pytest.mark.parametrize("make, kw, error", [
    (lambda t: _BadSource(t), {}, NegativeCountError),
    # below the subtree level, explicit values that disagree with an invariant from the data: read on the workers
    (lambda t: t, dict(invariants=["vtd:total", Invariant("county", "total", _moved_county_totals(table(1, high=6)))]),
     InfeasibleConstraintsError),
    # crossed invariants: the chunked release rounds one pinned marginal per level
    (lambda t: t, dict(invariants=["county:age", "county:race"]), UnsupportedStructureError),
    (lambda t: t, dict(invariants=[Invariant("state", "total", np.array([[1], [2], [-3]]))]),
     InfeasibleConstraintsError),  # explicit values: non-negative integers
    (lambda t: t, dict(invariants=[Invariant("state", "total", np.array([[1], [2]]))]), ShapeError),
    (lambda t: t, dict(invariants=["nation:total", Invariant("county", "total", _county_totals(table(1, high=6)) + 1)]),
     InfeasibleConstraintsError),  # explicit county totals that do not add up to the data's nation total
    (lambda t: t, dict(invariants=[Invariant("county", "age", np.ones((7, 2), dtype=np.int64)),
                                   Invariant("county", "total", np.ones((7, 1), dtype=np.int64))]),
     InfeasibleConstraintsError),  # two explicit invariants below the subtree level that disagree
    (lambda t: t, dict(split="best"), ShapeError),
    (lambda t: t, dict(workload={"nope": 1}), ShapeError),
    (lambda t: t, dict(subtree_level=0), ShapeError),
    (lambda t: t, dict(subtree_level="block"), ShapeError),
    (lambda t: t, dict(weights="l1"), SparseDPError),
    (lambda t: t, dict(rng=-1), SparseDPError),
    (lambda t: t, dict(rho=-1.0), InvalidPrivacyParameterError),
    (lambda t: t, dict(split=[1, 1]), ShapeError),
    (lambda t: t, dict(rho=2.0), BudgetExceededError),  # more than the accountant holds
    (lambda t: TableSource(t), dict(queries={"nope": 1}), ShapeError),
])
def test_bad_input_is_refused_before_any_charge_or_noise(tmp_path, monkeypatch, make, kw, error):
    t = table(1, high=6)
    calls = []
    real = MeasurementPlan.measure
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    acc = Accountant(rho=1.0)
    args = {"rho": 0.5, "rng": 1, **kw}
    with pytest.raises(error):
        topdown_scaleout(make(t), tmp_path / "rel", accountant=acc, progress=False, **args)
    assert acc.spent == 0 and not acc.ledger and not calls
    assert not (tmp_path / "rel").exists()


def test_an_existing_output_directory_is_refused(tmp_path):
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / "x").write_text("keep")
    acc = Accountant(rho=1.0)
    with pytest.raises(SparseDPError, match="not an empty directory"):
        topdown_scaleout(table(1), tmp_path / "rel", rho=0.5, accountant=acc, progress=False)
    assert acc.spent == 0 and (tmp_path / "rel" / "x").read_text() == "keep"


def test_command_line_with_dask(tmp_path, capsys):
    """``--executor dask`` (a LocalCluster of one worker process here): the chunked release of the
    in-process command's release (the design optimised for ``--workload``, an invariant below the
    subtree level), read back by ``load_topdown``."""
    from sparsedp.topdown.cli import register

    small_frame(5).to_csv(tmp_path / "t.csv", index=False)
    parser = argparse.ArgumentParser(prog="sparsedp")
    register(parser.add_subparsers(dest="command"))
    base = ["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
            "--attributes", "age,race", "--root", "nation", "--invariant", "state:total", "--seed", "1",
            "--rho", "0.5", "--workload", "cells:1,total:2", "--invariant", "county:total"]
    args = parser.parse_args(base + ["--out", str(tmp_path / "r.npz")])
    assert args.func(args) == 0
    first = capsys.readouterr().out
    in_process = _error_lines(first)
    args = parser.parse_args(base + ["--executor", "dask", "--workers", "1", "--out", str(tmp_path / "rel")])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "chunked by state" in printed
    assert len(in_process) == 6 and _error_lines(printed) == in_process  # the same error table, per level
    # and the same design table, printed from what the chunked release recorded (no second plan)
    assert _design_lines(printed) == _design_lines(first) and len(_design_lines(first)) > 4
    a, b = load_topdown(tmp_path / "r.npz"), load_topdown(tmp_path / "rel")
    for x, y in zip(a.counts, b.counts):
        assert np.array_equal(x, y)
    assert b.check() == CLEAN
    for bad in (["--executor", "dask", "--out", str(tmp_path / "x.npz")], ["--workers", "2", "--out",
                                                                             str(tmp_path / "y.npz")]):
        args = parser.parse_args(base + bad)
        with pytest.raises(SparseDPError):
            args.func(args)


def _design_lines(printed):
    """The lines of the printed design table (its title and the indented lines after it)."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("design by level"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("  "))
    return lines[start:end]


def _error_lines(printed):
    """The lines of the printed error table (its title, header and one row per level)."""
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("error by level"))
    return lines[start:start + 2 + sum(1 for line in lines[start + 2:] if line.startswith("  "))]


@pytest.mark.parametrize("cfg", [dict(rho=0.5, invariants=["state:total"]), dict(epsilon=1.0, split=[1, 1, 2, 3])])
def test_the_error_table_of_a_chunked_release_is_its_design_s(tmp_path, cfg):
    """The chunked release keeps no design: its error table is the design planned again on the
    hierarchy (given, or read from the release's files), the in-process release's; its sd of a
    cell is the root mean of the variances the chunked release published, level by level."""
    from sparsedp.topdown.cli import chunked_error_table, error_table

    t = table(4, high=12)
    crel = topdown_scaleout(t, tmp_path / "rel", rng=3, progress=False, **cfg)
    want = error_table(topdown(t, rng=3, **cfg).design)
    assert chunked_error_table(crel, **cfg) == want  # the hierarchy read from the files
    assert chunked_error_table(crel, t.hierarchy, **cfg) == want
    rows = [line.split() for line in want.splitlines()[2:]]
    for d, row in enumerate(rows):
        assert float(row[2]) == pytest.approx(np.sqrt(crel.level(d, "variance").mean()), abs=1e-3)
    with pytest.raises(SparseDPError, match="differs"):  # another plan than the one that ran: no table
        chunked_error_table(crel, t.hierarchy, **{**cfg, "split": [3, 1, 1, 1]})


@pytest.mark.parametrize("cfg", [
    dict(rho=0.5),  # the identity (the cells' histogram)
    dict(rho=0.7, queries={"cells": 2, "total": 1, "age": 1}),  # stacked marginals
    dict(rho=0.5, invariants=["state:total"]),  # the cells' contrasts: integer rows with row factors
    dict(epsilon=1.0, queries={"race": 1, "cells": 1}),
])
def test_a_subtree_is_measured_by_the_level_plan_restricted_to_its_units(cfg):
    """The plan a subtree's units are measured with (UnitPlan.for_units) is the level plan: for all
    of a level's units, the same matrix, per-row scales, grid, row factors, loss and charge -- so
    measuring a level subtree by subtree is the same measurement, at the same cost."""
    from sparsedp.topdown import plan_topdown
    from sparsedp.topdown.subtrees import unit_plan

    t = table(4)
    design = plan_topdown(t.hierarchy, **cfg)
    for lp in design.measured:
        p, q = lp.plan, unit_plan(lp).for_units(lp.units)
        assert (p.matrix != q.matrix).nnz == 0 and p.matrix.shape == q.matrix.shape
        for f in ("scales", "unit_scales"):
            assert np.array_equal(getattr(p, f), getattr(q, f))
        assert (p.row_factors is None) == (q.row_factors is None)
        assert p.row_factors is None or np.array_equal(p.row_factors, q.row_factors)
        assert (p.grid, p.grid_exact, p.identity, p.loss, p.cost) == (q.grid, q.grid_exact, q.identity, q.loss, q.cost)
        assert np.array_equal(p.variances(), q.variances())
        x = t.counts[lp.depth].ravel()
        if not p.identity:
            assert np.array_equal(p.measured.matvec(x.astype(float)), q.measured.matvec(x.astype(float)))


def test_a_subtree_over_the_bound_is_refused_without_its_total(tmp_path):
    """Validation names the input bound, never the subtree's (or the table's) exact total."""
    from sparsedp.errors import InputBoundError
    from sparsedp.topdown import CellDomain, Hierarchy
    from sparsedp.validation import MAX_MAGNITUDE

    big = int(MAX_MAGNITUDE) - 3
    cells = CellDomain.flat(["a", "b"])
    h = Hierarchy(("nation", "state", "county"), (np.array([-1]), np.array([0]), np.array([0])),
                  (np.array(["nation"], dtype=object), np.array(["01"], dtype=object),
                   np.array(["001"], dtype=object)), cells)
    leaf = np.array([[big, big - 7]], dtype=np.int64)  # every count within the bound, the subtree's total not
    with pytest.raises(InputBoundError) as err:
        topdown_scaleout(HierarchicalTable(h, (leaf, leaf, leaf)), tmp_path / "out", rho=1.0, rng=0)
    assert "total count exceeds" in str(err.value) and f"{MAX_MAGNITUDE:.0f}" in str(err.value)
    assert str(2 * big - 7) not in str(err.value)


def _scratch_dirs(parent):
    return sorted(p for p in parent.iterdir() if p.name.startswith("sparsedp-topdown-"))


def test_scratch_is_private_holds_no_count_and_is_removed_on_every_exit(tmp_path, monkeypatch):
    """The scratch directory is mode 0700 and holds the public geography and the noisy measurements
    only (no exact count of a subtree); it is gone after a return, an exception and a SIGTERM; the
    manifest holds no timing (the in-memory release keeps them)."""
    import os
    import signal
    import stat

    import sparsedp.topdown.scaleout as sc

    real = sc.release_part
    seen = []

    def inspect(spec, summaries, finals, offsets, out, *rest):
        d = os.path.dirname(summaries[0].path)
        seen.append(stat.S_IMODE(os.stat(d).st_mode))
        for s in summaries:
            with np.load(s.path) as f:
                assert all(k.startswith(("parent", "code", "y")) for k in f.files), f.files
        return real(spec, summaries, finals, offsets, out, *rest)

    monkeypatch.setattr(sc, "release_part", inspect)
    t = table(3)
    inv = ["state:total", "county:total"]  # the county's below the subtree level: read again, never in scratch
    rel = topdown_scaleout(t, tmp_path / "rel", rho=0.9, rng=2, invariants=inv, progress=False)
    assert seen and set(seen) == {0o700} and not _scratch_dirs(tmp_path)
    assert "timings" not in rel.manifest and {"validate", "plan", "total"} <= set(rel.timings)
    assert "timings" not in load_chunked(tmp_path / "rel").manifest
    # the same release as before the scratch changed: the invariants pinned from the driver's copy / the parts
    ref = topdown(t, rho=0.9, rng=2, invariants=inv)
    np.testing.assert_array_equal(np.concatenate(rel.to_topdown().counts), np.concatenate(ref.counts))

    def fail(*a, **k):
        raise RuntimeError("a worker died")

    monkeypatch.setattr(sc, "release_part", fail)
    with pytest.raises(RuntimeError):
        topdown_scaleout(t, tmp_path / "rel2", rho=0.9, rng=2, progress=False)
    assert not _scratch_dirs(tmp_path)
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("another SIGTERM handler is installed")

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(sc, "release_part", terminated)
    with pytest.raises(SystemExit):
        topdown_scaleout(t, tmp_path / "rel3", rho=0.9, rng=2, progress=False)
    assert not _scratch_dirs(tmp_path) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_overlapping_columns_are_refused_by_the_workers_unless_declared(tmp_path):
    """A Parquet part whose 'total' column is the sum of the cells is refused during validation,
    before any charge; declared (two cells per person), the chunked release is the in-process
    one, calibrated to it."""
    pytest.importorskip("pyarrow")
    frame = small_frame(6, unbalanced=False, high=20)
    frame["total"] = frame[CELLS].sum(axis=1)
    frame.to_parquet(tmp_path / "t.parquet")
    geo = ("state", "county", "vtd")
    acc = Accountant(rho=1.0)
    with pytest.raises(ShapeError, match="'total' equals the sum of"):
        topdown_scaleout(ParquetSource(str(tmp_path / "t.parquet"), geo, "vap_*,u18_*,total"), tmp_path / "a",
                         rho=1.0, accountant=acc, progress=False)
    assert acc.spent == 0
    src = ParquetSource(str(tmp_path / "t.parquet"), geo, "vap_*,u18_*,total", contributions_per_person=2)
    b = topdown_scaleout(src, tmp_path / "b", rho=1.0, rng=3, accountant=acc, progress=False)
    t = HierarchicalTable.from_counts(frame, list(geo), "vap_*,u18_*,total", root="root", contributions_per_person=2)
    a = topdown(t, rho=1.0, rng=3)
    np.testing.assert_array_equal(np.concatenate(b.to_topdown().counts), np.concatenate(a.counts))
    assert all("2 cells per person" in e["label"] for e in b.ledger) and acc.spent == pytest.approx(1.0)
    with pytest.raises(ShapeError, match="at least 2"):
        topdown_scaleout(src, tmp_path / "c", rho=1.0, contributions_per_person=1, progress=False)


def test_one_unit_is_read_from_one_part_and_equals_the_whole_release(tmp_path) -> None:
    """``ChunkedTopDownRelease.unit(codes)`` reads the top file and the one part holding the unit's
    subtree (compressed ``.npz``): every unit equals the whole release's row, with the manifest's
    index and without it (parts searched), and an unknown code is refused."""
    import json
    import zipfile

    from sparsedp.topdown.scaleout import SyntheticNation, load_chunked, topdown_scaleout

    nat = SyntheticNation(states=3, counties=3, tracts=3, blocks=6, seed=1)
    rel = topdown_scaleout(nat, tmp_path / "rel", rho=1.0, rng=0)
    assert rel.manifest["contiguous"] and len(rel.manifest["subtrees"]) == 3
    with zipfile.ZipFile(tmp_path / "rel" / rel.manifest["files"][1]) as z:
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    loaded = load_chunked(tmp_path / "rel")
    td = loaded.to_topdown()
    h = td.hierarchy
    for lev in range(1, len(h.levels)):
        for i in range(len(h.parents[lev])):
            codes, j = [], i
            for d in range(lev, 0, -1):
                codes.append(str(h.codes[d][j]))
                j = int(h.parents[d][j])
            u = loaded.unit(tuple(reversed(codes)))
            assert u["level"] == h.levels[lev]
            np.testing.assert_array_equal(u["counts"], td.counts[lev][i])
            np.testing.assert_array_equal(u["estimate"], td.estimate[lev][i])
    manifest = dict(loaded.manifest, contiguous=False)  # the fallback: read everything
    (tmp_path / "rel" / "topdown.json").write_text(json.dumps(manifest))
    slow = load_chunked(tmp_path / "rel")
    deep = (str(h.codes[1][0]), str(h.codes[2][0]), str(h.codes[3][0]))
    np.testing.assert_array_equal(slow.unit(deep)["counts"], loaded.unit(deep)["counts"])
    with pytest.raises(SparseDPError, match="no county"):
        loaded.unit((str(h.codes[1][0]), "no-such-county"))


def test_one_level_is_read_part_by_part(tmp_path) -> None:
    from sparsedp.topdown.scaleout import SyntheticNation, load_chunked, topdown_scaleout

    nat = SyntheticNation(states=3, counties=2, tracts=2, blocks=4, seed=2)
    topdown_scaleout(nat, tmp_path / "rel", rho=1.0, rng=0)
    rel = load_chunked(tmp_path / "rel")
    td = rel.to_topdown()
    for d, name in enumerate(td.hierarchy.levels):
        for values, whole in (("counts", td.counts), ("estimate", td.estimate), ("variance", td.variance)):
            np.testing.assert_array_equal(rel.level(name, values), whole[d])
    with pytest.raises(SparseDPError, match="no level"):
        rel.level("planet")
