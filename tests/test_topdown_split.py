"""The data-free budget split of TopDown releases (``split="optimal"``, ``OptimalSplit``).

The optimiser's model against the exact GLS variances of the planned design, its optimum against
other splits, the minimax and target objectives, level and query shares, that the split depends
on the public design only (never the counts), that it is charged exactly, and bad input refused
before anything is charged."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from sparsedp import Accountant
from sparsedp.errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from sparsedp.validation import budget_fraction
from sparsedp.topdown import HierarchicalTable, plan_topdown, topdown
from sparsedp.topdown.design import OptimalSplit, SplitChoice, optimal_split

CELLS = ["vap_a", "vap_b", "vap_c", "u18_a", "u18_b", "u18_c"]  # age (2) x race (3)


def frame(seed: int = 0, states: int = 3) -> pd.DataFrame:
    """state > county > district with unequal fan-outs (a few counties are leaves)."""
    gen = np.random.default_rng(seed)
    rows = []
    for s in range(states):
        for c in range(2 + s):
            if c == 0 and s == 1:
                rows.append((f"{s:02d}", f"{c:03d}", None))  # a county with no districts
                continue
            for v in range(3 + 2 * c):
                rows.append((f"{s:02d}", f"{c:03d}", f"{v:04d}"))
    out = pd.DataFrame(rows, columns=["state", "county", "vtd"])
    for col in CELLS:
        out[col] = gen.integers(0, 30, len(out))
    return out


def table(seed: int = 0, counts_seed: int | None = None) -> HierarchicalTable:
    f = frame(seed)
    if counts_seed is not None:
        gen = np.random.default_rng(counts_seed)
        for col in CELLS:
            f[col] = gen.integers(0, 500, len(f))
    return HierarchicalTable.from_counts(f, ["state", "county", "vtd"], "vap_*,u18_*", attributes=("age", "race"),
                                         root="nation")


#: the optimiser's objective before workloads: per-level expected MAE per cell, absolute, unconstrained
PER_CELL = dict(workload={"cells": 1}, relative=False, cap=None)


def objective(design, weights, kind: str) -> float:
    E = np.asarray(design.level_errors())
    w = np.asarray(weights, dtype=float)
    if kind == "max":
        return float(np.max(w * E))
    return float(np.sum(w * E) / w.sum())


def default_cap(design, d: int, marg: str) -> float:
    """The default caps of a workload term (``OptimalSplit``): 1.012 x the plain design's at a level
    with leaves, 1.0 above them, 0.998 for the cells of a level above the leaves that measures more
    than its cells."""
    h = design.hierarchy
    if h.leaves(d).any():
        return 1.012
    mixed = any(b.axes != h.cells.axes("cells") and b.budget > 0 for b in design.levels[d].blocks)
    return 0.998 if mixed and marg == "cells" else 1.0


@pytest.mark.parametrize("kw", [
    dict(rho=1.0),
    dict(rho=0.3, invariants=["state:total"]),
    dict(epsilon=1.5, invariants=["state:total"]),
    dict(rho=2.0, queries={"cells": 2, "total": 1, "age": 1}, invariants=["county:age"]),
])
def test_model_is_the_exact_gls_of_the_planned_design(kw):
    """The optimiser's reduced GLS (one column per group of components) gives the same per-level
    expected errors as the full ``gls_variances`` of the design it plans."""
    h = table().hierarchy
    design = plan_topdown(h, split="optimal", **kw)
    c = design.split_choice
    assert isinstance(c, SplitChoice)
    np.testing.assert_allclose(c.predicted_mae, design.level_errors(), rtol=1e-6)
    eq = plan_topdown(h, split="equal", queries=None, **{k: v for k, v in kw.items() if k != "queries"})
    totals = [np.sqrt(2 / np.pi) * np.sqrt(v).mean() for v in design.total_variances()]
    plain_totals = [np.sqrt(2 / np.pi) * np.sqrt(v).mean() for v in eq.total_variances()]
    for (level, marg), e, p in zip(c.terms, c.predicted_term_mae, c.plain_term_mae):
        d = h.level_index(level)  # every workload term against the full GLS of its design
        assert e == pytest.approx(design.level_errors()[d] if marg == "cells" else totals[d], rel=1e-6)
        assert p == pytest.approx(eq.level_errors()[d] if marg == "cells" else plain_totals[d], rel=1e-6)
        assert e <= p * default_cap(design, d, marg) * (1 + 1e-5)
    assert c.value <= c.equal_value * (1 + 1e-9)
    assert abs(sum(c.level_shares) - 1.0) < 1e-12
    for d, q in enumerate(c.query_shares):
        assert abs(sum(q.values()) - c.level_shares[d]) < 1e-12


def test_optimum_beats_the_equal_split_and_random_splits():
    h = table().hierarchy
    design = plan_topdown(h, rho=1.0, split=OptimalSplit(**PER_CELL), invariants=["state:total"])
    best = objective(design, [1, 1, 1, 1], "mae")
    gen = np.random.default_rng(7)
    others = [objective(plan_topdown(h, rho=1.0, split=list(gen.dirichlet(np.ones(4))), invariants=["state:total"]),
                        [1, 1, 1, 1], "mae") for _ in range(25)]
    others.append(objective(plan_topdown(h, rho=1.0, invariants=["state:total"]), [1, 1, 1, 1], "mae"))
    assert best <= min(others) * (1 + 1e-4)
    # a local perturbation of the chosen shares does not improve it either (4-digit rounding aside)
    s = np.asarray(design.split)
    for i in range(4):
        for j in range(4):
            if i != j:
                t = s.copy()
                t[i] += 0.02
                t[j] -= 0.02
                assert objective(plan_topdown(h, rho=1.0, split=list(t), invariants=["state:total"]),
                                 [1, 1, 1, 1], "mae") >= best * (1 - 1e-4)


def test_minimax_equalises_the_levels_and_targets_scale_them():
    h = table().hierarchy
    d = plan_topdown(h, rho=1.0, split=OptimalSplit(objective="max", **PER_CELL))
    E = np.asarray(d.level_errors())
    assert E.max() / E.min() < 1.01  # every level at the same expected error
    eq = np.asarray(plan_topdown(h, rho=1.0, split="equal").level_errors())
    assert E.max() < eq.max()
    targets = [0.8, 1.0, 1.1, 1.2]
    dt = plan_topdown(h, rho=1.0, split=OptimalSplit.for_targets(targets))
    r = np.asarray(dt.level_errors()) / targets
    assert r.max() / r.min() < 1.01  # error / target the same at every level
    assert dt.split_choice.objective == "max" and dt.split_choice.level_weights == tuple(1 / t for t in targets)
    assert dt.split[0] > d.split[0]  # the tighter nation target buys the nation more budget
    named = plan_topdown(h, rho=1.0, split=OptimalSplit.for_targets(dict(zip(h.levels, targets))))
    assert named.split == dt.split


def test_level_weights_move_the_budget():
    h = table().hierarchy
    base = plan_topdown(h, rho=1.0, split=OptimalSplit(**PER_CELL))
    heavy = plan_topdown(h, rho=1.0, split=OptimalSplit(level_weights=[4, 1, 1, 1], **PER_CELL))
    named = plan_topdown(h, rho=1.0, split=OptimalSplit(level_weights={"nation": 4, "state": 1, "county": 1, "vtd": 1},
                                                        **PER_CELL))
    assert heavy.split == named.split
    assert heavy.split[0] > base.split[0] + 0.05
    assert heavy.level_errors()[0] < base.level_errors()[0]
    # a level with weight 0 is not in the objective: with only the districts counted, the upper levels
    # get what helps the districts (little), the districts almost everything
    leaf = plan_topdown(h, rho=1.0, split=OptimalSplit(level_weights=[0, 0, 0, 1], **PER_CELL))
    assert leaf.split[3] > 0.9


def test_query_shares_are_optimised_within_levels():
    h = table().hierarchy
    q = {"cells": 1, "total": 1}
    both = plan_topdown(h, rho=1.0, split=OptimalSplit(**PER_CELL), queries=q)
    fixed = plan_topdown(h, rho=1.0, split=OptimalSplit(queries=False, **PER_CELL), queries=q)
    for d in (both, fixed):
        np.testing.assert_allclose(d.split_choice.predicted_mae, d.level_errors(), rtol=1e-6)
    assert both.split_choice.value <= fixed.split_choice.value * (1 + 1e-9)
    for lp in fixed.levels:  # queries=False keeps the given 1:1 shares within each level
        b = {blk.name: blk.budget for blk in lp.blocks}
        assert abs(b["cells"] - b["total"]) <= 1e-4 * lp.budget
    # per-cell error: the total query adds nothing the cells do not measure better -> (almost) no budget
    for qs in both.split_choice.query_shares:
        assert qs["total"] <= 0.01


def test_split_depends_on_the_public_design_only_and_is_charged_exactly():
    t1, t2 = table(0), table(0, counts_seed=99)  # same hierarchy, other counts
    assert t1.hierarchy.sizes == t2.hierarchy.sizes
    assert not all(np.array_equal(a, b) for a, b in zip(t1.counts, t2.counts))
    acc = Accountant(rho=1.0)
    r1 = topdown(t1, rho=1.0, split="optimal", invariants=["state:total"], rng=1, accountant=acc)
    r2 = topdown(t2, rho=1.0, split="optimal", invariants=["state:total"], rng=2)
    assert r1.design.split == r2.design.split and r1.design.split_choice is not None
    assert acc.spent_exact <= Fraction(1) and float(acc.spent_exact) > 0.999
    assert sum(budget_fraction(b) for b in r1.design.split) <= Fraction(1)  # what is charged for them
    assert len(acc.ledger) == 4 and r1.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0,
                                                    "invariant_violations": 0}
    desc = r1.design.describe()
    assert desc["split_choice"]["level_shares"] == list(r1.design.split_choice.level_shares)
    # the split is a function of the planning arguments alone
    assert optimal_split(t1.hierarchy, rho=1.0, invariants=["state:total"]).level_shares == \
        r1.design.split_choice.level_shares


def test_equal_keyword_and_zero_level():
    h = table().hierarchy
    assert plan_topdown(h, rho=1.0, split="equal").split == plan_topdown(h, rho=1.0, split=[1, 1, 1, 1]).split
    # a non-leaf level may get nothing when only the districts count; the design stays valid
    d = plan_topdown(h, rho=1.0, split=OptimalSplit(level_weights=[0, 0, 0, 1], decimals=2))
    assert all(b >= 0 for b in d.split) and d.split[2] > 0 and d.split[3] > 0  # county leaves keep a budget


@pytest.mark.parametrize("split,err", [
    ("best", ShapeError),
    (OptimalSplit(objective="median"), SparseDPError),
    (OptimalSplit(level_weights=[1, 1, 1]), ShapeError),
    (OptimalSplit(level_weights={"town": 1}), ShapeError),
    (OptimalSplit(level_weights=[1, -1, 1, 1]), SparseDPError),
    (OptimalSplit(level_weights=[0, 0, 0, 0]), SparseDPError),
    (OptimalSplit(level_weights=[1, float("nan"), 1, 1]), SparseDPError),
    (OptimalSplit(level_weights=[1, True, 1, 1]), SparseDPError),
    (OptimalSplit(decimals=1), SparseDPError),
])
def test_bad_split_specs_are_refused_before_any_charge(split, err):
    t = table()
    acc = Accountant(rho=1.0)
    gen = np.random.default_rng(0)
    state = gen.bit_generator.state
    with pytest.raises(err):
        topdown(t, rho=1.0, split=split, accountant=acc, rng=gen)
    assert acc.history == () and gen.bit_generator.state == state


def test_bad_targets_and_budget():
    for bad in ([1, 0, 1, 1], [1, -2, 1, 1], [1, "a", 1, 1], {"nation": float("inf")}):
        with pytest.raises(SparseDPError):
            OptimalSplit.for_targets(bad)
    with pytest.raises(InvalidPrivacyParameterError):
        plan_topdown(table().hierarchy, rho=-1.0, split="optimal")
    with pytest.raises(SparseDPError):
        optimal_split(table().hierarchy, rho=1.0, spec="other")


def test_example_runs_on_a_small_table(tmp_path, monkeypatch, capsys):
    """examples/topdown_release.py on a small table of the shared data's layout (the shared table
    itself takes ~10 s; the script is run on it by the documentation build)."""
    import runpy
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    gen = np.random.default_rng(3)
    races = ["hisp", "white", "black", "aian", "asian", "nhpi", "other", "two"]
    rows = [(f"{s:02d}", f"{c:03d}", f"{v:06d}") for s in (1, 6, 11) for c in range(1, 4) for v in range(4)]
    f = pd.DataFrame(rows, columns=["state_fips", "county_fips", "vtd_code"])
    for a in ("vap", "u18"):
        for r in races:
            f[f"{a}_{r}"] = gen.integers(0, 40, len(f))
    f.to_csv(tmp_path / "t.csv.gz", index=False)
    argv = ["topdown_release.py", str(tmp_path / "t.csv.gz"), "--out", str(tmp_path / "r.npz")]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(root / "examples" / "topdown_release.py"), run_name="__main__")  # in process: fast
    out = capsys.readouterr().out
    assert "loaded back with sparsedp.load_release" in out and (tmp_path / "r.npz").is_file()
    assert "'negative': 0, 'non_integer': 0, 'inconsistent': 0, 'invariant_violations': 0" in out
    assert "EVALUATION" not in out  # nothing compared with the truth unless asked


def test_leaf_cap_bounds_the_leaves_terms_and_is_checked():
    """``leaf_cap`` bounds the terms of a level with leaves (``None``: ``cap``); a bad one is
    refused before anything is planned."""
    h = table().hierarchy
    for bad in (0, -1.0, float("nan"), True, "1.01"):
        with pytest.raises(SparseDPError, match="leaf_cap"):
            plan_topdown(h, rho=1.0, split=OptimalSplit(leaf_cap=bad))
    loose = plan_topdown(h, rho=1.0, split=OptimalSplit(leaf_cap=1.05), invariants=["state:total"]).split_choice
    tight = plan_topdown(h, rho=1.0, split=OptimalSplit(leaf_cap=None), invariants=["state:total"]).split_choice
    for c, bound in ((loose, 1.05), (tight, 1.0)):
        for (level, marg), e, p in zip(c.terms, c.predicted_term_mae, c.plain_term_mae):
            if h.leaves(h.level_index(level)).any():
                assert e <= p * bound * (1 + 1e-5)
    # what the leaves may give buys the totals: the looser cap's summed relative error is lower
    assert loose.value < tight.value
