"""Crossed-marginal invariants in the TopDown release (sparsedp.topdown.crossed and the pins of
design / release): pinned marginals per level, exact invariants in every release, the GLS against
a dense constrained GLS, the rounding against brute force, the fallback when no integer table
exists, refusals before any charge (disagreeing values; the chunked release)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from test_topdown import _loss_within_charge, assert_dense_constrained_gls, full_matrix, leaves_below, table

from sparsedp import Accountant
from sparsedp.errors import InfeasibleConstraintsError, UnsupportedStructureError
from sparsedp.measure import MeasurementPlan
from sparsedp.topdown import (
    HierarchicalTable,
    Invariant,
    estimate_from_measurements,
    integer_counts,
    plan_topdown,
    resolve_invariants,
    topdown,
)
from sparsedp.topdown.crossed import project_crossed, round_crossed
from sparsedp.topdown.design import pinned_components, pinned_marginals
from sparsedp.topdown.release import round_level

CELLS3 = [f"{a}_{r}_{s}" for a in ("vap", "u18") for r in ("a", "b", "c") for s in ("f", "m")]  # age x race x sex


def cross_table(seed: int = 0, high: int = 9) -> HierarchicalTable:
    """A state > county > district table (some counties leaves) with age x race x sex cells."""
    gen = np.random.default_rng(seed)
    rows = []
    for s in ("01", "02", "10"):
        for c in range(int(gen.integers(1, 4))):
            county = f"{c * 2 + 1:03d}"
            if gen.random() < 0.3:
                rows.append((s, county, None))
                continue
            for v in range(int(gen.integers(1, 4))):
                rows.append((s, county, f"000{v}"))
    frame = pd.DataFrame(rows, columns=["state", "county", "vtd"])
    for c in CELLS3:
        frame[c] = gen.integers(0, high, len(frame))
    frame.loc[gen.random(len(frame)) < 0.4, "u18_c_f"] = 0
    return HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], "vap_*,u18_*",
                                         attributes=("age", "race", "sex"), root="nation")


def test_pinned_marginals_are_the_maximal_invariants_of_each_level():
    h = cross_table().hierarchy
    design = plan_topdown(h, rho=1.0, invariants=["state:total", "state:age", "county:race+sex"], split="equal")
    assert pinned_marginals(design) == [((0,), (1, 2)), ((0,), (1, 2)), ((1, 2),), ()]
    nested = plan_topdown(h, rho=1.0, invariants=["state:total", "county:age"], split="equal")
    assert pinned_marginals(nested) == [((0,),), ((0,),), ((0,),), ()]
    # a component is exact iff its contrast set is inside one of the marginals
    comp = h.cells.component_attributes()
    mask = pinned_components(h.cells, ((0,), (1, 2)))
    assert [a for a, m in zip(comp, mask) if not m] == [a for a in comp if 0 in a and len(a) > 1]


CROSSED = [
    dict(rho=0.5, invariants=["state:age", "state:race"]),
    dict(rho=0.5, invariants=["state:total", "county:age+sex", "county:race"], split="equal"),
    dict(epsilon=1.0, invariants=["vtd:age", "county:race+sex", "state:sex"]),
]


@pytest.mark.parametrize("cfg", CROSSED, ids=[str(i) for i in range(len(CROSSED))])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_crossed_invariants_hold_exactly_and_counts_add_up(cfg, seed):
    t = cross_table(seed, high=3 + 15 * seed)
    h = t.hierarchy
    acc = Accountant(rho=1.0) if "rho" in cfg else Accountant(epsilon=2.0)
    rel = topdown(t, accountant=acc, rng=seed, **cfg)
    assert rel.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    for d in range(h.depth + 1):
        assert rel.counts[d].dtype == np.int64 and rel.counts[d].min() >= 0
        if d < h.depth:
            inner = ~h.leaves(d)
            np.testing.assert_array_equal(h.children_sum(d, rel.counts[d + 1])[inner], rel.counts[d][inner])
    for spec in cfg["invariants"]:
        level, _, marg = spec.partition(":")
        axes = h.cells.axes(marg)
        for e in range(h.level_index(level) + 1):  # at the level and every level above, the true values
            np.testing.assert_array_equal(h.cells.marginal(rel.counts[e], axes), h.cells.marginal(t.counts[e], axes))
    assert rel.description["rounding"]["crossed_fallbacks"] >= 0
    assert float(acc.spent) == pytest.approx(cfg.get("rho", cfg.get("epsilon")), rel=1e-9)  # all of it


def test_the_gls_is_the_dense_gls_under_crossed_invariants():
    """The component-wise hierarchy GLS with crossed state invariants (age, race) is the GLS of the
    whole stacked measurement subject to every state's age and race marginals (KKT, dense)."""
    t = table(4)
    h = t.hierarchy
    inv = ["state:age", "state:race"]
    design = plan_topdown(h, rho=0.7, queries={"cells": 2, "total": 1, "age": 1}, split=[2, 1, 1, 1],
                          invariants=inv)
    pins = resolve_invariants(t, design, inv)
    gen = np.random.default_rng(5)
    ys = [lp.plan.measure(t.counts[lp.depth].ravel(), rng=gen).y if lp.plan is not None else None
          for lp in design.levels]
    est, var = estimate_from_measurements(design, ys, pins)
    C = h.cells.size
    M = full_matrix(design)[0].toarray()
    v = np.concatenate([lp.plan.variances() for lp in design.levels if lp.plan is not None])
    y = np.concatenate([y_ for y_ in ys if y_ is not None])
    _, G = leaves_below(h)
    rows, vals = [], []
    for marg in ("age", "race"):
        ax = h.cells.axes(marg)
        Q = np.zeros((h.cells.marginal_size(ax), C))
        Q[h.cells.cell_to_marginal(ax), np.arange(C)] = 1.0
        rows.append(np.kron(G[1], Q))
        vals.append(h.cells.marginal(t.counts[1], ax).ravel().astype(float))
    E, e = np.vstack(rows), np.concatenate(vals)  # redundant rows (the state totals twice): pinv
    assert_dense_constrained_gls(design, est, var, M, v, y, E, e, G, atol=1e-7)
    for d in (0, 1):  # the pinned marginals are exact
        for marg in ("age", "race"):
            ax = h.cells.axes(marg)
            np.testing.assert_allclose(h.cells.marginal(est[d], ax), h.cells.marginal(t.counts[d], ax), atol=1e-8)


def _grouped(sizes, axes_list):
    """``(c2m, marginal size)`` of each marginal of a small C-order cell grid."""
    grid = np.indices(sizes).reshape(len(sizes), -1)
    out = []
    for axes in axes_list:
        sub = [sizes[i] for i in axes]
        c2m = np.ravel_multi_index(tuple(grid[i] for i in axes), sub) if axes else np.zeros(grid.shape[1], int)
        out.append((c2m, int(np.prod(sub))))
    return out


def test_the_crossed_rounding_is_the_closest_integer_table_on_small_cases():
    """Two children x (2 x 2) cells, age and race pinned per child, the parent's cells as column
    sums: the mixed integer program's table is the closest of all the integer tables whose values
    are their estimate's floor or ceiling (brute force), and the projection is feasible and no
    farther from the estimate than that table."""
    gen = np.random.default_rng(0)
    (ca, ma), (cr, mr) = _grouped((2, 2), [(0,), (1,)])
    checked = 0
    for _ in range(40):
        truth = gen.integers(0, 4, (2, 4))
        parent = truth.sum(axis=0, keepdims=True)
        groups = [(ca, np.stack([np.bincount(ca, r, ma) for r in truth]).astype(np.int64)),
                  (cr, np.stack([np.bincount(cr, r, mr) for r in truth]).astype(np.int64))]
        est = truth + gen.normal(0, 0.8, truth.shape)
        w = gen.uniform(0.5, 2.0, truth.shape)
        parents = np.zeros(2, dtype=np.int64)
        x = project_crossed(est, w, groups, parents, parent)
        assert x.min() >= -1e-9
        np.testing.assert_allclose(x.sum(axis=0), parent[0], atol=1e-6)
        for c2m, vals in groups:
            np.testing.assert_allclose(np.stack([np.bincount(c2m, r, vals.shape[1]) for r in x]), vals, atol=1e-6)
        assert (w * (x - est) ** 2).sum() <= (w * (truth - est) ** 2).sum() * (1 + 1e-6)  # truth is feasible
        r = round_crossed(x, w, groups, parents, parent)
        assert r.fallbacks == 0
        X = r.counts
        np.testing.assert_array_equal(X.sum(axis=0), parent[0])
        best = None
        for bits in itertools.product((0, 1), repeat=8):
            Y = np.floor(x).astype(int) + np.array(bits).reshape(2, 4)
            ok = (Y >= 0).all() and (Y.sum(axis=0) == parent[0]).all() and all(
                (np.stack([np.bincount(c2m, r_, vals.shape[1]) for r_ in Y]) == vals).all() for c2m, vals in groups)
            if ok:
                cost = float((w * (Y - x) ** 2).sum())
                best = cost if best is None else min(best, cost)
        if best is not None:
            assert float((w * (X - x) ** 2).sum()) <= best + 1e-9
            checked += 1
    assert checked >= 20


def _infeasible_case():
    """Child A is (young, white) by its marginals, child B (old, black); the parent's cells say
    (young, black) = 1 and (old, white) = 1: no integer table (nor any table) fits."""
    (ca, ma), (cr, mr) = _grouped((2, 2), [(0,), (1,)])
    groups = [(ca, np.array([[1, 0], [0, 1]])), (cr, np.array([[1, 0], [0, 1]]))]
    parent = np.array([[0, 1, 1, 0]])
    return groups, parent


def test_a_parent_without_an_integer_table_becomes_the_sum_of_its_children():
    groups, parent = _infeasible_case()
    est = np.array([[0.2, 0.5, 0.4, 0.1], [0.1, 0.4, 0.6, 0.2]])
    w = np.ones_like(est)
    parents = np.zeros(2, dtype=np.int64)
    x = project_crossed(est, w, groups, parents, parent)
    r = round_crossed(x, w, groups, parents, parent)
    assert r.fallbacks == 1
    np.testing.assert_array_equal(r.counts, [[1, 0, 0, 0], [0, 0, 0, 1]])
    np.testing.assert_array_equal(r.parent_counts, [[1, 0, 0, 1]])
    # the parent keeps its own marginals (age and race: (1, 1) each)
    ca, cr = groups[0][0], groups[1][0]
    r2 = round_crossed(x, w, groups, parents, parent, keep=[ca, cr])
    np.testing.assert_array_equal(r2.parent_counts, [[1, 0, 0, 1]])


def test_the_fallback_gives_a_valid_release_and_is_counted():
    """nation > state > two counties, age x race cells, county age and race invariant: estimates
    that round the nation and the state to (young, black) + (old, white) leave the counties --
    (young, white) and (old, black) -- no table; the state and the nation become the sums of the
    counties, every invariant exact, and the release's rounding report counts the fallback."""
    frame = pd.DataFrame({"state": ["01", "01"], "county": ["001", "002"],
                          "vap_a": [1, 0], "vap_b": [0, 0], "u18_a": [0, 0], "u18_b": [0, 1]})
    t = HierarchicalTable.from_counts(frame, ["state", "county"], "vap_*,u18_*", attributes=("age", "race"),
                                      root="nation")
    h = t.hierarchy
    inv = ["county:age", "county:race"]
    design = plan_topdown(h, rho=1.0, invariants=inv, split="equal")
    pins = resolve_invariants(t, design, inv)
    wrong = np.array([[0.0, 1.0, 1.0, 0.0]])
    est = (wrong, wrong.copy(), np.array([[0.4, 0.6, 0.0, 0.0], [0.0, 0.4, 0.6, 0.0]]))
    var = tuple(np.ones_like(e) for e in est)
    with pytest.raises(InfeasibleConstraintsError, match="integer_counts"):  # a parent would have to change
        round_level(h.cells, 2, est[2], var[2], pins[2], h.parents[2], np.array([[0, 1, 1, 0]]))
    report: dict = {}
    counts = integer_counts(design, est, var, pins, report=report)
    assert report == {"crossed_fallbacks": 1}
    np.testing.assert_array_equal(counts[2], t.counts[2])  # the counties' marginals fix them
    np.testing.assert_array_equal(counts[1], t.counts[1])
    np.testing.assert_array_equal(counts[0], t.counts[0])


def test_disagreeing_crossed_invariants_are_refused_before_any_charge():
    t = cross_table(1)
    h = t.hierarchy
    age = h.cells.marginal(t.counts[1], h.cells.axes("age"))
    race = h.cells.marginal(t.counts[1], h.cells.axes("race"))
    wrong = race.copy()
    wrong[0, 0] += 1  # the first state's race values add up to one more than its age values
    acc = Accountant(rho=1.0)
    gen = np.random.default_rng(4)
    state = gen.bit_generator.state
    with pytest.raises(InfeasibleConstraintsError, match="disagree"):
        topdown(t, rho=1.0, invariants=[Invariant("state", "age", age), Invariant("state", "race", wrong)],
                accountant=acc, rng=gen)
    with pytest.raises(InfeasibleConstraintsError, match="disagree"):  # explicit values against the data's
        topdown(t, rho=1.0, invariants=["state:age", Invariant("state", "race", wrong)], accountant=acc, rng=gen)
    # three official marginals that agree pairwise (every one-way margin (1, 1)) but no table has:
    # age = race and race = sex, yet age != sex
    ar, rs, as_ = (np.zeros((3, 6), dtype=np.int64), np.zeros((3, 6), dtype=np.int64), np.zeros((3, 4), dtype=np.int64))
    ar[0, [0, 4]] = 1  # (young, a), (old, b)
    rs[0, [0, 3]] = 1  # (a, f), (b, m)
    as_[0, [1, 2]] = 1  # (young, m), (old, f)
    with pytest.raises(InfeasibleConstraintsError, match="no table"):
        topdown(t, rho=1.0, invariants=[Invariant("state", "age+race", ar), Invariant("state", "race+sex", rs),
                                        Invariant("state", "age+sex", as_)], accountant=acc, rng=gen)
    assert acc.history == () and gen.bit_generator.state == state
    # official values that differ from the data but agree are kept exactly
    official_age = age + 1
    official_race = race.copy()
    official_race[:, 0] += 2
    rel = topdown(t, rho=1.0, invariants=[Invariant("state", "age", official_age),
                                          Invariant("state", "race", official_race)], rng=1)
    np.testing.assert_array_equal(h.cells.marginal(rel.counts[1], h.cells.axes("age")), official_age)
    np.testing.assert_array_equal(h.cells.marginal(rel.counts[1], h.cells.axes("race")), official_race)
    assert rel.check()["inconsistent"] == 0


def test_the_certified_loss_of_a_crossed_design_is_within_the_charge():
    """The optimised design with crossed invariants (the cells' other components measured): the
    brute-force loss of every leaf cell is within the charge, and the budget is used."""
    _loss_within_charge(table(8), dict(rho=0.8, invariants=["state:age", "county:race"]))


def test_the_chunked_release_refuses_crossed_invariants_below_its_subtree_level_before_any_charge(tmp_path,
                                                                                                 monkeypatch):
    """The chunked release rounds crossed invariants on its driver (levels down to the subtree level;
    tests/test_topdown_scaleout.py): crossed ones meeting below it are refused before any charge."""
    from sparsedp.topdown.scaleout import topdown_scaleout

    t = table(1, high=6)
    calls = []
    real = MeasurementPlan.measure
    monkeypatch.setattr(MeasurementPlan, "measure", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    acc = Accountant(rho=1.0)
    with pytest.raises(UnsupportedStructureError, match="crossed.*subtree_level='county'"):
        topdown_scaleout(t, tmp_path / "rel", rho=0.5, rng=1, invariants=["county:age", "county:race"],
                         accountant=acc, progress=False)
    assert acc.spent == 0 and not acc.ledger and not calls
    assert not (tmp_path / "rel").exists()


def test_command_line_releases_crossed_invariants_exactly(tmp_path, capsys):
    """The in-process command takes crossed invariants like any others (``--invariant`` twice)."""
    from test_topdown import small_frame

    from sparsedp.cli import main

    frame = small_frame(2)
    frame.to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / "units.csv"
    assert main(["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
                 "--attributes", "age,race", "--rho", "1", "--invariant", "state:age", "--invariant", "state:race",
                 "--seed", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "state:age" in printed and "state:race" in printed
    got = pd.read_csv(out, dtype={"state": str, "county": str, "vtd": str})
    states = got[got["level"] == "state"].sort_values("state")
    truth = frame.groupby("state")[[c for c in frame.columns if c.startswith(("vap_", "u18_"))]].sum().sort_index()
    for prefix in ("vap_", "u18_"):  # each state's age
        cols = [c for c in truth.columns if c.startswith(prefix)]
        np.testing.assert_array_equal(states[cols].sum(axis=1).to_numpy(), truth[cols].sum(axis=1).to_numpy())
    for race in ("a", "b", "c"):  # and race, exactly
        cols = [f"vap_{race}", f"u18_{race}"]
        np.testing.assert_array_equal(states[cols].sum(axis=1).to_numpy(), truth[cols].sum(axis=1).to_numpy())


def test_the_integer_program_runs_when_the_relaxation_is_fractional():
    """``x1 + x2 = x2 + x3 = x1 + x3 = 1``: the linear relaxation's only point is (1/2, 1/2, 1/2)
    and there is no integer one; with a slack ``x4`` in the first row the integer optimum costs 1
    where the relaxation costs 0 -- the branch and bound decides both."""
    import scipy.sparse as sp

    from sparsedp.topdown.crossed import _milp

    A = sp.csr_matrix(np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], dtype=float))
    assert _milp(np.zeros(3), A, np.ones(3), np.ones(3)) is None
    A4 = sp.csr_matrix(np.array([[1, 1, 0, 1], [0, 1, 1, 0], [1, 0, 1, 0]], dtype=float))
    s = _milp(np.array([0.0, 0.0, 0.0, 1.0]), A4, np.ones(3), np.ones(4))
    np.testing.assert_array_equal(s, [0, 0, 1, 1])


def test_a_finer_invariant_above_the_parent_of_crossed_ones_is_refused_when_planned():
    """``nation:cells`` with ``county:age`` and ``county:race``: a state the rounding had to change
    would move the nation's pinned cells, so the design is refused before anything is charged; the
    same marginals pinned at the states too are fine."""
    h = cross_table().hierarchy
    with pytest.raises(UnsupportedStructureError, match="'cells' is pinned above level 'state'"):
        plan_topdown(h, rho=1.0, invariants=["nation:cells", "county:age", "county:race"])
    plan_topdown(h, rho=1.0, invariants=["state:total", "county:age", "county:race"])
    plan_topdown(h, rho=1.0, invariants=["nation:cells", "state:age", "state:race"])  # the parent is the root
