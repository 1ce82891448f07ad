"""Issue 28: TopDown releases of hierarchical tables (sparsedp.topdown).

Hierarchy from tables (unbalanced, codes), the tree x Kronecker GLS against a dense GLS, exact
variances against draws, the post-processing rule bit for bit, non-negative integer consistent
output with exact invariants, the privacy loss by brute force, and bad input refused before any
noise is drawn or budget charged."""

from __future__ import annotations

import dataclasses
import itertools
import json
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from test_postprocessing_rule import NoiseTape, assert_same_bits

from sparsedp import Accountant
from sparsedp.audit import audit, plan_release
from sparsedp.errors import (
    BudgetExceededError,
    InfeasibleConstraintsError,
    FractionalCountError,
    InvalidPrivacyParameterError,
    NegativeCountError,
    NonFiniteInputError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
)
from sparsedp.privacy import zcdp_to_approx_dp
from sparsedp.validation import budget_fraction
from sparsedp.topdown import (
    CellDomain,
    HierarchicalTable,
    Invariant,
    OptimalSplit,
    estimate_from_measurements,
    hierarchy_gls,
    load_topdown,
    plan_topdown,
    read_table,
    resolve_invariants,
    topdown,
    topdown_from_result,
)
from sparsedp.releases import load_release

CELLS = ["vap_a", "vap_b", "vap_c", "u18_a", "u18_b", "u18_c"]  # age (2) x race (3)


def small_frame(seed=0, unbalanced=True, high=9):
    """A state > county > district table; with ``unbalanced`` some counties are leaves (no
    district code).  Codes keep leading zeros and mix letters."""
    gen = np.random.default_rng(seed)
    rows = []
    for s in ("01", "02", "10"):
        for c in range(int(gen.integers(1, 4))):
            county = f"{c * 2 + 1:03d}"
            if unbalanced and gen.random() < 0.3:
                rows.append((s, county, None))
                continue
            for v in range(int(gen.integers(1, 4))):
                rows.append((s, county, f"00{v}A" if v % 2 else f"000{v}0"))
    frame = pd.DataFrame(rows, columns=["state", "county", "vtd"])
    for c in CELLS:
        frame[c] = gen.integers(0, high, len(frame))
    frame.loc[gen.random(len(frame)) < 0.3, "vap_c"] = 0  # many zero cells
    return frame


def table(seed=0, unbalanced=True, high=9):
    return HierarchicalTable.from_counts(small_frame(seed, unbalanced, high), ["state", "county", "vtd"], "vap_*,u18_*",
                                         attributes=("age", "race"), root="nation")


def leaves_below(h):
    """Leaves (level, index) and, per level, the 0/1 matrix from the leaves to the level's units."""
    leaves = [(d, i) for d in range(h.depth + 1) for i in np.flatnonzero(h.leaves(d))]
    G = [np.zeros((h.sizes[d], len(leaves))) for d in range(h.depth + 1)]
    for j, (d, i) in enumerate(leaves):
        while True:
            G[d][i, j] = 1.0
            if d == 0:
                break
            i, d = h.parents[d][i], d - 1
    return leaves, G


def full_matrix(design):
    """The matrix every measured level applies to the leaf-cell counts (the effect of one person
    in each leaf cell on every measurement), and the rows' noise scales."""
    h = design.hierarchy
    C = h.cells.size
    _, G = leaves_below(h)
    blocks, scales = [], []
    for lp in design.measured:
        agg = sp.kron(sp.csr_matrix(G[lp.depth]), sp.identity(C), format="csr")
        # the strategy as calibrated (diag(f) H for the integer-row form the plan measures)
        blocks.append(sp.csr_matrix(lp.plan.strategy.tosparse()) @ agg)
        scales.append(np.asarray(lp.plan.scales))
    return sp.vstack(blocks, format="csr"), np.concatenate(scales)


# -- the hierarchy ---------------------------------------------------------------------------------


def test_hierarchy_from_an_unbalanced_table_with_codes():
    frame = pd.DataFrame({
        "st": ["01", "01", "01", "02", "02", "10"],
        "co": ["003", "003", "001", "005", "005", None],
        "vtd": ["00A1", "0002", None, "0001", "000B", None],
        "x_p": [1, 2, 3, 4, 5, 6], "x_q": [0, 1, 0, 1, 0, 1],
    })
    t = HierarchicalTable.from_counts(frame, ["st", "co", "vtd"], ["x_*"], root="us")
    h = t.hierarchy
    assert h.levels == ("us", "st", "co", "vtd")
    assert h.sizes == (1, 3, 3, 4)
    assert list(h.codes[1]) == ["01", "02", "10"]  # leading zeros kept, sorted
    assert list(h.codes[2]) == ["001", "003", "005"] and list(h.parents[2]) == [0, 0, 1]
    assert list(h.codes[3]) == ["0002", "00A1", "0001", "000B"] and list(h.parents[3]) == [1, 1, 2, 2]
    assert list(h.leaves(1)) == [False, False, True] and list(h.leaves(2)) == [True, False, False]
    assert t.cells.columns == ("x_p", "x_q")
    np.testing.assert_array_equal(t.counts[0], [[21, 3]])
    np.testing.assert_array_equal(t.counts[1], [[6, 1], [9, 1], [6, 1]])
    np.testing.assert_array_equal(t.counts[2], [[3, 0], [3, 1], [9, 1]])
    uf = h.unit_frame()
    assert len(uf) == h.units and list(uf.columns) == ["level", "depth", "st", "co", "vtd"]
    assert uf.iloc[-1].tolist() == ["vtd", 3, "02", "005", "000B"]


def test_cells_from_column_names_and_basis():
    cells = CellDomain.from_columns(["u18_b", "vap_a", "vap_b", "u18_a"], ("age", "race"))
    assert cells.names == ("age", "race") and cells.values == (("u18", "vap"), ("b", "a"))
    assert cells.columns == ("u18_b", "u18_a", "vap_b", "vap_a")
    B = table().cells.basis()
    np.testing.assert_allclose(B @ B.T, np.eye(6), atol=1e-14)
    for axes in [(), (0,), (1,), (0, 1)]:  # every marginal's Gram matrix is diagonal in the basis
        Q = np.zeros((table().cells.marginal_size(axes), 6))
        Q[table().cells.cell_to_marginal(axes), np.arange(6)] = 1
        G = B @ Q.T @ Q @ B.T
        np.testing.assert_allclose(G, np.diag(np.diag(G)), atol=1e-12)
    with pytest.raises(ShapeError):
        CellDomain.from_columns(["vap_a", "vap_b", "u18_a"], ("age", "race"))  # not a product


def test_records_are_aggregated_over_public_units():
    units = pd.DataFrame({"st": ["1", "1", "2"], "co": ["a", "b", "c"]})
    rec = pd.DataFrame({"st": ["1", "1", "2", "1"], "co": ["a", "a", "c", "a"],
                        "age": ["old", "young", "old", "old"], "sex": ["f", "m", "f", "f"]})
    dom = {"age": ["young", "old"], "sex": ["f", "m"]}
    t = HierarchicalTable.from_records(rec, ["st", "co"], ["age", "sex"], domain=dom, units=units)
    assert t.hierarchy.sizes == (1, 2, 3) and t.cells.columns == ("young/f", "young/m", "old/f", "old/m")
    np.testing.assert_array_equal(t.counts[2], [[0, 1, 2, 0], [0, 0, 0, 0], [0, 0, 1, 0]])  # unit b: no records
    assert not t.units_observed
    with pytest.raises(ShapeError, match="domain"):
        HierarchicalTable.from_records(rec, ["st", "co"], ["age", "sex"], units=units)
    with pytest.raises(ShapeError, match="units"):
        HierarchicalTable.from_records(rec, ["st", "co"], ["age", "sex"], domain=dom)
    obs = HierarchicalTable.from_records(rec, ["st", "co"], ["age", "sex"], domain=dom, units="observed")
    assert obs.units_observed and obs.hierarchy.sizes == (1, 2, 2)
    assert topdown(obs, rho=1.0, rng=0).description["units_observed"] is True


def test_read_table_csv_and_parquet(tmp_path):
    frame = small_frame(3)
    frame.to_csv(tmp_path / "t.csv", index=False)
    t = read_table(tmp_path / "t.csv", "state,county,vtd", "vap_*,u18_*", attributes=("age", "race"))
    ref = table(3)
    assert t.hierarchy.sizes == ref.hierarchy.sizes and list(t.hierarchy.codes[1]) == ["01", "02", "10"]
    for a, b in zip(t.counts, ref.counts):
        np.testing.assert_array_equal(a, b)
    odd = frame.copy()
    odd.loc[0, "county"] = "NA"  # a code, not a missing value
    odd.loc[1, "vap_a"] = np.nan
    odd.iloc[:1].to_csv(tmp_path / "na.csv", index=False)
    assert list(read_table(tmp_path / "na.csv", "state,county,vtd", CELLS).hierarchy.codes[2]) == ["NA"]
    odd.iloc[:2].to_csv(tmp_path / "nan.csv", index=False)
    with pytest.raises(NonFiniteInputError):
        read_table(tmp_path / "nan.csv", "state,county,vtd", CELLS)
    pytest.importorskip("pyarrow")
    frame.to_parquet(tmp_path / "t.parquet")
    tp = read_table(tmp_path / "t.parquet", ["state", "county", "vtd"], CELLS, attributes=("age", "race"))
    for a, b in zip(tp.counts, ref.counts):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("edit, error", [
    (lambda f: f.__setitem__("vap_a", f["vap_a"].astype(float).where(f.index != 2, np.nan)), NonFiniteInputError),
    (lambda f: f.__setitem__("vap_b", f["vap_b"].where(f.index != 1, -1)), NegativeCountError),
    (lambda f: f.__setitem__("vap_b", f["vap_b"].astype(float).where(f.index != 1, 1.5)), FractionalCountError),
    (lambda f: f.__setitem__("vap_b", f["vap_b"].astype(str)), ShapeError),
])
def test_bad_counts_are_refused(edit, error):
    frame = small_frame(1)
    edit(frame)
    with pytest.raises(error):
        HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], CELLS)


def test_bad_tables_are_refused():
    frame = small_frame(1, unbalanced=False)
    with pytest.raises(ShapeError, match="no column matches"):
        HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], "vap_*,pop_*")
    with pytest.raises(ShapeError, match="unknown geography"):
        HierarchicalTable.from_counts(frame, ["state", "tract"], CELLS)
    with pytest.raises(ShapeError, match="more than once"):
        HierarchicalTable.from_counts(pd.concat([frame, frame.iloc[:1]]), ["state", "county", "vtd"], CELLS)
    gap = frame.copy()
    gap.loc[0, "county"] = None
    with pytest.raises(ShapeError, match="below an empty"):
        HierarchicalTable.from_counts(gap, ["state", "county", "vtd"], CELLS)
    both = pd.concat([frame, frame.iloc[:1].assign(vtd=None)])
    with pytest.raises(ShapeError, match="own row and rows below"):
        HierarchicalTable.from_counts(both, ["state", "county", "vtd"], CELLS)


def test_errors_name_the_bound_never_the_data():
    """A table whose total is above the input bound, and a record outside its category's domain,
    are refused with messages that name the bound or the domain, never the secret total or value."""
    from sparsedp.errors import InputBoundError
    from sparsedp.validation import MAX_MAGNITUDE

    big = int(MAX_MAGNITUDE) - 3  # each count within the bound, their sum not
    frame = pd.DataFrame({"state": ["01", "02"], "a": [big, big], "b": [0, 5]})
    with pytest.raises(InputBoundError) as err:
        HierarchicalTable.from_counts(frame, ["state"], "a,b")
    assert str(2 * big + 5) not in str(err.value) and f"{MAX_MAGNITUDE:.0f}" in str(err.value)
    records = pd.DataFrame({"state": ["01", "02"], "sex": ["f", "secret-value"]})
    with pytest.raises(ShapeError) as err:
        HierarchicalTable.from_records(records, ["state"], ["sex"], domain={"sex": ["f", "m"]}, units="observed")
    assert "secret-value" not in str(err.value) and "'f', 'm'" in str(err.value)


# -- the estimate ----------------------------------------------------------------------------------


def test_hierarchy_gls_equals_a_dense_gls_with_exact_and_missing_values():
    h = table(2).hierarchy
    gen = np.random.default_rng(0)
    k = 3
    own = [gen.normal(size=(n, k)) * 5 for n in h.sizes]
    var = [gen.uniform(0.5, 3.0, size=(n, k)) for n in h.sizes]
    var[0][0, 0] = np.inf  # the root unmeasured in column 0
    var[1][:, 1] = np.inf  # the states unmeasured in column 1
    leaves, G = leaves_below(h)
    # column 2: the states exact (an invariant), the root consistent with them
    x_true = gen.normal(size=len(leaves)) * 5
    var[1][:, 2] = 0.0
    own[1][:, 2] = G[1] @ x_true
    var[0][:, 2] = 0.0
    own[0][:, 2] = G[0] @ x_true
    res = hierarchy_gls(h, own, var)
    A = np.vstack(G)
    for c in range(k):
        y = np.concatenate([o[:, c] for o in own])
        v = np.concatenate([w[:, c] for w in var])
        meas, exact = np.isfinite(v) & (v > 0), v == 0
        W = np.diag(1.0 / v[meas])
        Am, Ae = A[meas], A[exact]
        # KKT of min (y - A x)' W (y - A x) s.t. Ae x = ye
        K = np.block([[2 * Am.T @ W @ Am, Ae.T], [Ae, np.zeros((Ae.shape[0], Ae.shape[0]))]])
        Kp = np.linalg.pinv(K)
        rhs = np.concatenate([2 * Am.T @ W @ y[meas], y[exact]])
        x = (Kp @ rhs)[:len(leaves)]
        # covariance of x: the map from y to x, times the noise covariance
        Mmap = Kp[:len(leaves)] @ np.vstack([np.hstack([2 * Am.T @ W, np.zeros((len(leaves), Ae.shape[0]))]),
                                              np.hstack([np.zeros((Ae.shape[0], Am.shape[0])), np.eye(Ae.shape[0])])])
        cov = Mmap[:, :Am.shape[0]] @ np.diag(v[meas]) @ Mmap[:, :Am.shape[0]].T
        for d in range(h.depth + 1):
            np.testing.assert_allclose(res.estimate[d][:, c], G[d] @ x, atol=1e-9)
            np.testing.assert_allclose(res.variance[d][:, c], np.einsum("ij,jk,ik->i", G[d], cov, G[d]), atol=1e-9)
    np.testing.assert_allclose(res.variance[1][:, 2], 0.0)


def test_tree_kronecker_gls_equals_the_dense_gls_of_all_levels():
    """Marginal queries at every level (cells, total, age) and a state-total invariant: the
    component-wise hierarchy GLS is the GLS of the whole stacked measurement, with its variances."""
    t = table(4)
    h = t.hierarchy
    inv = ["state:total"]
    design = plan_topdown(h, rho=0.7, queries={"cells": 2, "total": 1, "age": 1}, split=[2, 1, 1, 1],
                          invariants=inv)
    pins = resolve_invariants(t, design, inv)
    gen = np.random.default_rng(5)
    ys = [lp.plan.measure(t.counts[lp.depth].ravel(), rng=gen).y for lp in design.levels]
    est, var = estimate_from_measurements(design, ys, pins)
    C = h.cells.size
    M, _ = full_matrix(design)
    M = M.toarray()
    v = np.concatenate([lp.plan.variances() for lp in design.levels])
    y = np.concatenate(ys)
    _, G = leaves_below(h)
    Q = np.ones((1, C))
    E = np.kron(G[1], Q)  # the invariant rows: every state's total
    e = t.counts[1].sum(axis=1).astype(float)
    assert_dense_constrained_gls(design, est, var, M, v, y, E, e, G, atol=1e-8)


def assert_dense_constrained_gls(design, est, var, M, v, y, E, e, G, atol: float) -> None:
    """``est`` / ``var`` (every level's estimate and variances) are the GLS of the stacked
    measurement ``y = M x + noise`` (variances ``v``) subject to ``E x = e``, and its exact
    variances: the KKT system, dense (pseudo-inverse: redundant constraint rows are fine), mapped
    to each level by ``G[d]`` (leaves below each unit) x the identity on the cells."""
    h = design.hierarchy
    C = h.cells.size
    n = M.shape[1]
    K = np.block([[M.T @ (M / v[:, None]), E.T], [E, np.zeros((E.shape[0], E.shape[0]))]])
    Kp = np.linalg.pinv(K)
    x = (Kp @ np.concatenate([M.T @ (y / v), e]))[:n]
    T = Kp[:n, :n] @ M.T / v  # d x / d y
    cov = T @ np.diag(v) @ T.T
    for d in range(h.depth + 1):
        Gd = np.kron(G[d], np.eye(C))
        np.testing.assert_allclose(est[d].ravel(), Gd @ x, atol=atol)
        np.testing.assert_allclose(var[d].ravel(), np.einsum("ij,jk,ik->i", Gd, cov, Gd), atol=atol)
        np.testing.assert_allclose(design.gls_variances()[d], var[d], atol=1e-12)


def test_variances_match_draws_and_the_estimate_is_unbiased():
    t = table(6)
    design = plan_topdown(t.hierarchy, rho=0.5, queries={"cells": 3, "race": 1}, split=[1, 2, 1, 1])
    pins = resolve_invariants(t, design)
    R = 3000
    gen = np.random.default_rng(11)
    draws = [plan_release(lp.plan)(t.counts[lp.depth].ravel(), gen, R) for lp in design.levels]
    ests = [estimate_from_measurements(design, [Y[r] for Y in draws], pins)[0] for r in range(R)]
    _, var = estimate_from_measurements(design, [Y[0] for Y in draws], pins)
    for a, b in zip(var, design.gls_variances()):  # the same without data (up to the products' rounding)
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=0)
    for d in range(t.hierarchy.depth + 1):
        E = np.stack([e[d] for e in ests])
        emp = E.var(axis=0, ddof=1)
        ratio = emp / var[d]
        assert 0.85 < ratio.min() and ratio.max() < 1.15, (d, ratio.min(), ratio.max())
        z = (E.mean(axis=0) - t.counts[d]) / np.sqrt(var[d] / R)
        assert np.abs(z).max() < 5


def test_projection_and_controlled_rounding_are_optimal_on_small_cases():
    from sparsedp.topdown.rounding import round_groups, round_transport, simplex_project

    gen = np.random.default_rng(3)
    for _ in range(30):
        sizes = gen.integers(1, 6, gen.integers(1, 5))
        starts = np.concatenate(([0], np.cumsum(sizes)))
        v, w = gen.normal(0, 3, starts[-1]), gen.uniform(0.2, 3, starts[-1])
        t = gen.integers(0, 9, sizes.size).astype(float)
        x = simplex_project(v, w, starts, t)
        for g in range(sizes.size):  # KKT: x = max(0, v - lam / w) with one lam per group, sum = t
            sl = slice(starts[g], starts[g + 1])
            assert x[sl].min() >= 0 and abs(x[sl].sum() - t[g]) < 1e-9
            act = x[sl] > 0
            if act.any():
                lam = (v[sl] - x[sl]) * w[sl]
                assert np.ptp(lam[act]) < 1e-8 and np.all(v[sl][~act] * w[sl][~act] <= lam[act][0] + 1e-8)
        r = round_groups(x, starts, t)
        assert np.all(np.add.reduceat(r, starts[:-1]) == t) and np.all((r == np.floor(x)) | (r == np.floor(x) + 1))
    # 2-D: a parent's 3 children x 2 cells, the children's totals fixed; brute force over floor / ceil tables
    for _ in range(30):
        truth = gen.integers(0, 5, (3, 2))
        x = truth + gen.uniform(-0.5, 0.5, (3, 2))
        x[:, 1] = truth.sum(axis=1) - x[:, 0]  # the rows add up
        x = np.clip(x, 0, None)
        cols, rows = truth.sum(axis=0)[None, :], truth.sum(axis=1)[:, None]
        from sparsedp.topdown.rounding import project_transport

        p = project_transport(x, np.ones_like(x), np.zeros(3, dtype=int), cols, np.zeros(2, dtype=int), rows)
        X = round_transport(p, np.ones_like(p), np.zeros(3, dtype=int), cols, np.zeros(2, dtype=int), rows)
        assert np.all(X.sum(axis=0) == cols[0]) and np.all(X.sum(axis=1) == rows[:, 0]) and X.min() >= 0
        best = min(((np.asarray(c).reshape(3, 2) - p) ** 2).sum()
                   for c in itertools.product(*[range(int(np.floor(a)), int(np.ceil(a)) + 1) for a in p.ravel()])
                   if np.all(np.asarray(c).reshape(3, 2).sum(axis=0) == cols[0])
                   and np.all(np.asarray(c).reshape(3, 2).sum(axis=1) == rows[:, 0]))
        assert ((X - p) ** 2).sum() <= best + 1e-9


# -- the release ----------------------------------------------------------------------------------


CONFIGS = [
    dict(rho=1.0),
    dict(rho=0.3, invariants=["state:total"]),
    dict(rho=0.3, invariants=["county:total"], split=[3, 1, 1, 1]),
    dict(rho=0.3, invariants=["vtd:age", "state:total"]),
    dict(rho=0.2, invariants=["nation:total"], queries={"cells": 1, "total": 1, "age": 1, "race": 1}),
    dict(rho=0.2, invariants=["state:cells"]),
    dict(epsilon=0.5, invariants=["state:race"], split={"nation": 0, "state": 1, "vtd": 2, "county": 1}),
    dict(epsilon=2.0, split=[0, 0, 1, 2]),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_are_nonnegative_integers_that_add_up_with_exact_invariants(cfg, seed):
    t = table(seed, high=4 + 20 * seed)
    acc = Accountant(rho=1.0) if "rho" in cfg else Accountant(epsilon=2.0)
    rel = topdown(t, accountant=acc, rng=seed, **cfg)
    assert rel.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    h = t.hierarchy
    for d in range(h.depth + 1):
        assert rel.counts[d].dtype == np.int64
        if d < h.depth:  # consistency, independently of check()
            inner = ~h.leaves(d)
            np.testing.assert_array_equal(h.children_sum(d, rel.counts[d + 1])[inner], rel.counts[d][inner])
    for spec in cfg.get("invariants", ()):
        level, _, marg = spec.partition(":")
        d = h.level_index(level)
        axes = h.cells.axes(marg)
        for e in range(d + 1):  # at the level and above
            np.testing.assert_array_equal(h.cells.marginal(rel.counts[e], axes), h.cells.marginal(t.counts[e], axes))
    assert len(rel.ledger) == len([b for b in rel.design.split if b > 0])
    assert Fraction(acc.spent_exact) <= Fraction(acc.total)
    assert rel.private is False  # seeded


def test_release_tables_and_files(tmp_path):
    t = table(0)
    rel = topdown(t, rho=1.0, invariants=["state:total"], rng=3)
    frame = rel.to_pandas()
    h = t.hierarchy
    assert len(frame) == h.units
    assert list(frame.columns) == ["level", "depth", "state", "county", "vtd", *h.cells.columns]
    np.testing.assert_array_equal(frame.loc[frame.level == "county", list(h.cells.columns)].to_numpy(), rel.counts[2])
    assert rel.level("state").shape == (3, 1 + 6) and list(rel.level("state").state) == ["01", "02", "10"]
    r = rel.to_release()
    assert len(r) == h.units * h.cells.size and r.kind == "topdown" and r.rho == pytest.approx(1.0)
    lo, hi = r.confidence_intervals(0.9)
    assert np.all(lo <= hi)
    path = rel.save(tmp_path / "rel.npz")
    back = load_topdown(path)
    for a, b in itertools.chain(zip(back.counts, rel.counts), zip(back.estimate, rel.estimate)):
        np.testing.assert_array_equal(a, b)
    assert back.to_pandas().equals(frame)
    assert back.invariants[0]["level"] == "state" and back.check()["invariant_violations"] == 0
    assert [e["label"] for e in back.ledger] == [e.label for e in rel.ledger]
    assert topdown_from_result(r) is rel
    again = topdown_from_result(load_release(path))
    assert again.to_pandas().equals(frame)


# -- the post-processing rule ---------------------------------------------------------------------


def _run(cfg):
    def run(frame, seed):
        t = HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], CELLS, attributes=("age", "race"))
        rel = topdown(t, rng=seed, **cfg)
        return {"counts": np.concatenate(rel.counts).astype(float), "estimate": np.concatenate(rel.estimate),
                "variance": np.concatenate(rel.variance)}

    return run


@pytest.mark.parametrize("cfg, move", [
    (dict(rho=0.5), "add"),
    (dict(rho=0.5, queries={"cells": 2, "total": 1, "age": 1}), "remove"),
    (dict(epsilon=1.0, split=[1, 1, 2, 3]), "add"),
    (dict(rho=0.5, invariants=["state:total"]), "move"),  # a neighbour that keeps the invariant
])
def test_the_release_is_a_function_of_the_measurement_only(monkeypatch, cfg, move):
    """The release of ``x0`` with noise ``z`` equals, bit for bit, the release of a neighbour
    ``x1`` with noise ``z + M (x0 - x1)``: the same measurement ``y``."""
    x0 = small_frame(7, high=6)
    x1 = x0.copy()
    row = 3
    src = next(c for c in CELLS[1:] if x0.loc[row, c] > 0)  # a person who can be removed or moved
    if move == "add":
        x1.loc[row, "vap_b"] += 1
    elif move == "remove":
        x1.loc[row, src] -= 1
    else:
        x1.loc[row, src] -= 1
        x1.loc[row, "vap_a"] += 1
        assert x1[CELLS].to_numpy().sum() == x0[CELLS].to_numpy().sum()
    assert not x0.equals(x1)
    run = _run(cfg)
    tape = NoiseTape(monkeypatch)
    out0 = run(x0, 5)
    tape.replay()
    out1 = run(x1, 5)
    tape.finish()
    for key in out0:
        assert_same_bits(out0[key], out1[key], key)


# -- privacy ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [
    dict(rho=0.9),
    dict(rho=0.37, split=[0.3, 0, 0.1, 0.2], queries={"cells": 3, "total": 1, "age": 1, "race": 2}),
    dict(epsilon=1.3, queries=[None, {"cells": 1, "age": 1}, {"total": 1, "cells": 2}, None]),
    dict(epsilon=0.7, split=[1, 0, 3, 2], queries={"race": 1, "cells": 1}),
    dict(rho=0.8, invariants=["county:total"], queries={"cells": 3, "age": 1}),  # contrasts + marginals
    dict(rho=0.6, invariants=["vtd:age"], split=[1, 2, 2, 3]),  # the cells' contrasts alone
])
def test_the_certified_loss_of_all_levels_is_within_the_charge(cfg):
    """Brute force over the measured matrix of every level applied to the leaf cells (one person
    in a leaf cell changes that cell at every level by one): the exact loss of the worst leaf
    cell, in Fractions, is at most what the accountant was charged, which is within the budget."""
    _loss_within_charge(table(8), cfg)


def _loss_within_charge(t, cfg):
    """The brute-force check of the certified loss of ``topdown(t, **cfg)`` against its charge."""
    gauss = "rho" in cfg
    total = cfg.get("rho", cfg.get("epsilon"))
    acc = Accountant(rho=total) if gauss else Accountant(epsilon=total)
    rel = topdown(t, accountant=acc, rng=1, **cfg)
    M, scales = full_matrix(rel.design)
    M = sp.csc_matrix(M)
    worst = Fraction(0)
    for j in range(M.shape[1]):
        rows, vals = M.indices[M.indptr[j]:M.indptr[j + 1]], M.data[M.indptr[j]:M.indptr[j + 1]]
        if gauss:
            loss = sum(Fraction(a) ** 2 / (2 * Fraction(float(scales[i])) ** 2) for i, a in zip(rows, vals))
        else:
            loss = sum(abs(Fraction(a)) / Fraction(float(scales[i])) for i, a in zip(rows, vals))
        worst = max(worst, loss)
    # what the accountant adds: each level's budget as written (never above its float)
    charged = sum((budget_fraction(e.cost.rho if gauss else e.cost.epsilon) for e in rel.ledger), Fraction(0))
    assert worst <= charged <= budget_fraction(total)
    assert acc.spent_exact == charged
    assert worst > charged * Fraction(99, 100)  # the split is used, not wasted
    with pytest.raises(BudgetExceededError):  # nothing left: refused before anything is drawn
        topdown(t, accountant=acc, rng=1, **cfg)
    assert acc.spent_exact == charged


def single_state(seed=0):
    """A file of one state read the natural way: root (1 unit) > state (1 unit, the same counts)
    > county > district."""
    frame = small_frame(seed, unbalanced=False)
    frame = frame[frame["state"] == "01"].reset_index(drop=True)
    return HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], "vap_*,u18_*", attributes=("age", "race"),
                                         root="nation")


def weekly(seed=0):
    """Cases per county and week (8 weeks): nation > state > county."""
    gen = np.random.default_rng(seed)
    rows = [(s, f"{s}{c:03d}") for s in ("01", "02", "04") for c in range(int(gen.integers(1, 4)))]
    frame = pd.DataFrame(rows, columns=["state", "county"])
    weeks = [f"w{k}" for k in range(1, 9)]
    for w in weeks:
        frame[w] = gen.integers(0, 12, len(frame))
    return HierarchicalTable.from_counts(frame, ["state", "county"], weeks, root="nation")


SKIPPING = [  # (table, cfg, the levels not measured)
    (weekly, dict(rho=1.0, invariants=["nation:cells"]), ["nation"]),  # the national total per week invariant
    (weekly, dict(rho=1.0, invariants=["nation:cells"], split="optimal"), ["nation"]),
    (single_state, dict(rho=0.9), ["nation"]),
    (single_state, dict(rho=0.9, invariants=["state:total"]), ["nation"]),
    (single_state, dict(epsilon=1.1, split=[3, 1, 1, 2]), ["nation"]),
    (single_state, dict(rho=0.8, split="optimal"), ["nation"]),
    (single_state, dict(rho=0.8, split=[1, 0, 1, 1]), ["state"]),  # its twin, the nation, is measured instead
    (single_state, dict(rho=0.7, invariants=["nation:total"], queries={"cells": 2, "total": 1}), ["state"]),
    (table, dict(rho=0.9, invariants=["nation:cells"]), ["nation"]),  # every cell of the root published
    (table, dict(epsilon=0.9, invariants=["nation:cells"]), ["nation"]),
    (table, dict(rho=0.6, invariants=["state:age"], queries=[{"age": 1}, {"cells": 1}, None, None]), ["nation"]),
    (table, dict(rho=0.9, invariants=["state:total"], split="optimal"), []),
]


@pytest.mark.parametrize("make, cfg, skipped", SKIPPING)
def test_levels_without_information_are_not_paid_for(make, cfg, skipped):
    """A level the invariants determine, or one whose units equal the next level's, is not
    measured: the whole budget goes to the others (ledger = requested = description), the release
    names it, and the counts are still valid."""
    t = make(0)
    key = "rho" if "rho" in cfg else "epsilon"
    acc = Accountant(**{key: cfg[key]})
    rel = topdown(t, accountant=acc, rng=2, **cfg)
    assert [lp.name for lp in rel.design.levels if lp.skipped] == skipped
    assert all(lp.plan is None and lp.budget == 0 for lp in rel.design.levels if lp.skipped)
    assert float(acc.spent) == pytest.approx(cfg[key], rel=1e-12) and float(acc.spent) <= cfg[key]
    assert rel.description[key] == cfg[key]
    assert rel.description["spent"] == pytest.approx(float(acc.spent), rel=1e-15)
    assert [s["level"] for s in rel.description["skipped"]] == skipped
    notices = rel.design.notices()
    assert len(notices) == len(skipped) and all(f"'{lv}'" in n for lv, n in zip(skipped, notices))
    assert rel.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    truth = t.counts
    for d in range(t.hierarchy.depth):  # the skipped level's counts are its neighbours' (one child each)
        if t.hierarchy.sizes[d] == t.hierarchy.sizes[d + 1] and not t.hierarchy.leaves(d).any():
            assert np.array_equal(rel.counts[d], rel.counts[d + 1]) and np.array_equal(truth[d], truth[d + 1])


def test_a_redundant_level_costs_nothing():
    """The natural call on a one-state file gives the same design below the state as the state
    read as the root: the same budgets for county and district."""
    a = plan_topdown(single_state().hierarchy, rho=1.0)
    frame = small_frame(0, unbalanced=False)
    frame = frame[frame["state"] == "01"].reset_index(drop=True)
    b = plan_topdown(HierarchicalTable.from_counts(frame, ["county", "vtd"], "vap_*,u18_*", attributes=("age", "race"),
                                                   root="state").hierarchy, rho=1.0)
    assert a.split == (0.0,) + b.split
    assert a.level_errors()[1:] == pytest.approx(b.level_errors(), rel=1e-9)


def test_command_line_prints_the_skipped_level_and_the_error_by_level_and_writes_codes_and_totals(tmp_path, capsys):
    """The natural call on a one-state file: a note names the level not measured, the summary
    prints the whole budget and per level the sd and 95% half-width of a cell and a total (the
    design's, no data); the table output carries each unit's full code (text) and its total."""
    from sparsedp.cli import main

    frame = small_frame(0, unbalanced=False)
    frame[frame["state"] == "01"].to_csv(tmp_path / "one.csv", index=False)
    out = tmp_path / "units.csv"
    assert main(["topdown", str(tmp_path / "one.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
                 "--attributes", "age,race", "--rho", "1", "--invariant", "state:total", "--seed", "3",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "rho 1," in printed
    assert "note: level 'root' is not measured" in printed
    rows = [line.split() for line in printed.splitlines() if line.startswith("  vtd ")]
    assert len(rows) == 1 and float(rows[0][3]) == pytest.approx(1.96 * float(rows[0][2]), abs=2e-3)
    assert float(rows[0][4]) > float(rows[0][2]) > 0  # a total is noisier than a cell
    table_out = pd.read_csv(out, dtype={"state": str, "county": str, "vtd": str, "code": str})
    cells = [c for c in table_out.columns if c.startswith(("vap_", "u18_"))]
    np.testing.assert_array_equal(table_out["total"], table_out[cells].sum(axis=1))
    vtds = table_out[table_out["level"] == "vtd"]
    assert (vtds["code"] == vtds["state"] + "/" + vtds["county"] + "/" + vtds["vtd"]).all()
    assert vtds["code"].str.startswith("01").all()  # leading zeros kept
    assert load_release(out).answers.size == len(table_out) * len(cells)


def test_the_error_summary_is_the_variance_of_the_estimate():
    """sd of a unit's total from the design (no data) against 300 releases."""
    t = table(0)
    design = plan_topdown(t.hierarchy, rho=0.5, invariants=["state:total"])
    draws = [[rel.estimate[d].sum(axis=1) - t.counts[d].sum(axis=1) for d in range(4)]
             for rel in (topdown(t, design=design, rng=s) for s in range(300))]
    for d, row in enumerate(design.error_summary()):
        emp = np.sqrt(np.mean([np.var([x[d] for x in draws], axis=0)]))
        assert emp == pytest.approx(row["sd_total"], rel=0.15, abs=1e-9)
        assert row["half_width_total"] == pytest.approx(1.959964 * row["sd_total"])
    assert design.error_summary()[1]["sd_total"] == 0.0  # the state totals are invariant


def test_a_split_only_on_levels_without_information_is_refused_before_any_charge():
    acc = Accountant(rho=1.0)
    with pytest.raises(InvalidPrivacyParameterError, match="nation"):
        topdown(single_state(), rho=1.0, split={"nation": 1}, invariants=["nation:cells"], accountant=acc, rng=1)
    with pytest.raises(SparseDPError, match="nothing to measure"):  # every cell of every leaf published
        topdown(table(0, unbalanced=False), rho=1.0, invariants=["vtd:cells"], accountant=acc, rng=1)
    assert acc.spent == 0


@pytest.mark.parametrize("make, cfg, skipped", SKIPPING[:-1])
def test_the_certified_loss_of_designs_with_skipped_levels_is_within_the_charge(make, cfg, skipped):
    _loss_within_charge(make(8), cfg)


@pytest.mark.parametrize("states, skipped, kw", [
    (["1", "1", "2"], [], dict(split=[1, 1, 2])),
    (["1", "1", "1"], ["root"], dict(split=[1, 1, 2])),
    (["1", "1", "2"], [], dict(workload={"cells": 1, "total": 3})),  # the optimised design
])
def test_audit_of_the_measurement_of_all_levels(states, skipped, kw):
    """The measurement of every level (what the release post-processes), audited on neighbours that
    differ by one person in one leaf cell: the bound stays below the claim; a copy calibrated for
    twice the budget is flagged.  With one state (root and state the same units) the root is not
    measured and the others take the whole budget: still within the claim.  The same for a design
    the optimiser chose for a workload (pure DP: marginal queries)."""
    frame = pd.DataFrame({"st": states, "co": ["a", "b", "c"], "p": [3, 1, 2], "q": [0, 2, 1]})
    t = HierarchicalTable.from_counts(frame, ["st", "co"], ["p", "q"])
    frame1 = frame.copy()
    frame1.loc[0, "p"] += 1
    t1 = HierarchicalTable.from_counts(frame1, ["st", "co"], ["p", "q"])

    def release(eps):
        design = plan_topdown(t.hierarchy, epsilon=eps, **kw)
        assert [lp.name for lp in design.levels if lp.skipped] == skipped
        assert design.spent == pytest.approx(eps, rel=1e-9)
        plans = [(lp.depth, plan_release(lp.plan)) for lp in design.measured]

        def run(tab, gen, k):
            return np.hstack([p(tab.counts[d].ravel(), gen, k) for d, p in plans])

        return run

    ok = audit(release(1.0), t, t1, trials=200_000, rng=1, batched=True)
    assert ok.epsilon_lower <= 1.0
    bad = audit(release(2.0), t, t1, trials=200_000, rng=2, batched=True)
    assert bad.epsilon_lower > 1.0


# -- bad input: refused before anything is charged or drawn ----------------------------------------


@pytest.mark.parametrize("kw, error", [
    (dict(invariants=[Invariant("vtd", "total", "ones")]), UnsupportedStructureError),  # county leaves above
    (dict(invariants=[Invariant("state", "total", np.array([1, 2]))]), ShapeError),
    (dict(invariants=["tract:total"]), ShapeError),
    (dict(invariants=["state:sex"]), ShapeError),
    (dict(split=[1, 1, 0, 1]), SparseDPError),  # the counties with no districts are leaves
    (dict(split=[1, 1, 1]), ShapeError),
    (dict(queries={"total": 1}), SparseDPError),  # the leaves' cells undetermined
    (dict(rho=2.0), BudgetExceededError),
])
def test_bad_designs_are_refused_before_any_charge_or_draw(kw, error):
    t = table(0)
    acc = Accountant(rho=1.0)
    gen = np.random.default_rng(3)
    state = gen.bit_generator.state
    first = kw.get("invariants", [None])[0]
    if isinstance(first, Invariant) and isinstance(first.values, str):
        kw = dict(invariants=[Invariant("vtd", "total", np.ones(t.hierarchy.sizes[3], dtype=int))])
    with pytest.raises(error):
        topdown(t, accountant=acc, rng=gen, **{"rho": 1.0, **kw})
    assert acc.history == () and gen.bit_generator.state == state


def test_infeasible_explicit_invariants_are_refused_before_any_charge():
    t = table(0, unbalanced=False)
    h = t.hierarchy
    states = t.counts[1].sum(axis=1)
    counties = t.counts[2].sum(axis=1)
    acc = Accountant(rho=1.0)
    gen = np.random.default_rng(4)
    state = gen.bit_generator.state
    wrong = counties.copy()
    wrong[0] += 1  # the counties no longer add up to the states' totals
    for invs, error in [
        ([Invariant("state", "total", states), Invariant("county", "total", wrong)], InfeasibleConstraintsError),
        ([Invariant("county", "total", -counties)], InfeasibleConstraintsError),
        ([Invariant("county", "total", counties + 0.5)], InfeasibleConstraintsError),
        ([Invariant("county", "total", counties[:-1])], ShapeError),
    ]:
        with pytest.raises(error):
            topdown(t, rho=1.0, invariants=invs, accountant=acc, rng=gen)
    design = plan_topdown(h, rho=1.0, invariants=["state:total"])
    with pytest.raises(ShapeError):  # values for another invariant than the design's
        topdown(t, design=design, invariants=[Invariant("county", "total", counties)], accountant=acc, rng=gen)
    assert acc.history == () and gen.bit_generator.state == state
    # consistent explicit values (official figures that differ from the data) are kept exactly
    official = counties + np.arange(counties.size)
    rel = topdown(t, rho=1.0, invariants=[Invariant("county", "total", official)], rng=1)
    np.testing.assert_array_equal(rel.counts[2].sum(axis=1), official)
    np.testing.assert_array_equal(rel.counts[0].sum(), official.sum())
    assert rel.check()["inconsistent"] == 0 and h.sizes == rel.hierarchy.sizes


def test_gaussian_zcdp_claim_and_ledger():
    t = table(1)
    acc = Accountant(rho=1.0)
    rel = topdown(t, rho=1.0, split=[1, 1, 1, 1], accountant=acc)
    assert [e.label for e in acc.ledger] == [f"topdown {lv} (cells)" for lv in t.hierarchy.levels]
    assert all(e.noise == "gaussian" and e.secure and e.private for e in acc.ledger)
    assert [e.cost.rho for e in acc.ledger] == [0.25] * 4 and rel.private
    assert zcdp_to_approx_dp(acc.spent, 1e-6) > 0


def test_command_line(tmp_path, capsys):
    import argparse

    from sparsedp.releases import load_release
    from sparsedp.topdown.cli import register

    small_frame(5).to_csv(tmp_path / "t.csv", index=False)
    parser = argparse.ArgumentParser(prog="sparsedp")
    register(parser.add_subparsers(dest="command"))
    base = ["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
            "--attributes", "age,race", "--root", "nation", "--invariant", "state:total", "--seed", "1"]
    args = parser.parse_args(base + ["--rho", "0.5", "--split", "2,1,1,1", "--out", str(tmp_path / "r.npz")])
    assert args.func(args) == 0
    assert "released" in capsys.readouterr().out
    r = load_release(tmp_path / "r.npz")
    assert r.kind == "topdown" and not r.private and [e["rho"] for e in r.ledger] == [0.2, 0.1, 0.1, 0.1]
    back = load_topdown(tmp_path / "r.npz")
    assert back.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    args = parser.parse_args(base + ["--epsilon", "1", "--out", str(tmp_path / "r.csv")])
    assert args.func(args) == 0
    frame = pd.read_csv(tmp_path / "r.csv", dtype={"state": str, "county": str, "vtd": str})
    assert len(frame) == back.hierarchy.units and (tmp_path / "r.csv.release.json").is_file()
    for bad in (["--rho", "1", "--epsilon", "1", "--out", str(tmp_path / "x.npz")],
                ["--rho", "1", "--out", str(tmp_path / "x.txt")]):
        args = parser.parse_args(base + bad)
        with pytest.raises(SparseDPError):
            args.func(args)


def test_load_release_to_pandas_is_one_row_per_unit(tmp_path):
    # sparsedp.load_release(path).to_pandas(): the published table, one row per geographic unit with
    # its level and codes and one column per cell; table() stays one row per answer
    t = table(4)
    rel = topdown(t, rho=1.0, invariants=["state:total"], rng=2)
    path = rel.save(tmp_path / "td.npz")
    back = load_release(path)
    frame = back.to_pandas()
    h = rel.hierarchy
    assert len(frame) == sum(h.sizes) and {"level", "depth", *h.geo, *h.cells.columns} <= set(frame.columns)
    np.testing.assert_array_equal(frame[list(h.cells.columns)].to_numpy(), np.concatenate(rel.counts, axis=0))
    assert list(frame["level"].iloc[:2]) == [h.levels[0], h.levels[1]]
    assert back.table()["answer"].shape == (sum(h.sizes) * h.cells.size,)
    assert rel.to_release().to_pandas().equals(frame)


def test_invariants_are_listed_as_exact_disclosures_in_every_file_and_the_ledger(tmp_path, capsys):
    """An invariant is not private: the release record, its reloaded form and `sparsedp ledger` list
    it as an exact disclosure (units and values), beside the private noise and its total cost."""
    from sparsedp.cli import main
    from sparsedp.topdown.scaleout import topdown_scaleout

    t = table(2)
    rel = topdown(t, rho=1.0, invariants=["state:total"])
    want = [{"what": "state:total", "level": "state", "marginal": "total", "units": t.hierarchy.sizes[1], "cells": 1,
             "values": t.hierarchy.sizes[1], "published": "exactly (the true values): not differentially private"}]
    assert list(rel.to_release().exact_disclosures) == want and rel.private
    chunked = topdown_scaleout(t, tmp_path / "dir", rho=1.0, invariants=["state:total"], progress=False)
    assert chunked.manifest["exact_disclosures"] == want
    for path in (rel.save(tmp_path / "td.npz"), tmp_path / "dir"):
        back = load_release(path)
        assert list(back.exact_disclosures) == want and back.private
        assert main(["ledger", str(path)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert "1 exact disclosure(s), NOT private" in out[0]
        assert out[-1].startswith(f"exact: state:total ({t.hierarchy.sizes[1]} unit(s) x 1 value(s)) published "
                                  "exactly, NOT under DP")
    assert topdown(t, rho=1.0).to_release().exact_disclosures == ()
    assert main(["ledger", str(topdown(t, rho=1.0).save(tmp_path / "plain.npz"))]) == 0
    plain = capsys.readouterr().out
    assert "exact:" not in plain and "disclosure" not in plain


# -- the cells must partition the people -----------------------------------------------------------
def _with_sum(frame, name, parts):
    out = frame.copy()
    out[name] = out[parts].sum(axis=1)
    return out


@pytest.mark.parametrize("name, parts", [
    ("total", CELLS),  # the sum of every other column
    ("vap_total", ["vap_a", "vap_b", "vap_c"]),  # the sum of its name group
    ("odd", ["vap_b", "u18_a", "u18_c"]),  # a sum of columns of both groups (the least-squares fit)
])
def test_a_count_column_that_is_a_sum_of_others_is_refused_naming_the_columns(name, parts):
    frame = _with_sum(small_frame(4, high=30), name, parts)
    secret = str(int(frame[name].sum()))
    with pytest.raises(ShapeError, match="must partition the people") as err:
        HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], CELLS + [name])
    msg = str(err.value)
    assert repr(name) in msg and all(repr(p) in msg for p in parts) and secret not in msg
    # declared: one person is counted in two columns (their cell and the sum)
    t = HierarchicalTable.from_counts(frame, ["state", "county", "vtd"], CELLS + [name], contributions_per_person=2)
    assert t.contributions_per_person == 2
    acc = Accountant(rho=1.0)
    with pytest.raises(ShapeError, match="at least 2"):  # never fewer than the table declares
        topdown(t, rho=1.0, accountant=acc, contributions_per_person=1)
    assert acc.spent == 0
    rel = topdown(t, rho=1.0, accountant=acc, rng=0)
    assert rel.description["contributions_per_person"] == 2 and acc.spent == pytest.approx(1.0)
    assert all("2 cells per person" in e.label for e in acc.ledger)


@pytest.mark.parametrize("cfg", [
    dict(rho=0.9),
    dict(epsilon=1.3),
    dict(rho=0.37, split=[0.3, 0, 0.1, 0.2], queries={"cells": 3, "total": 1, "age": 1, "race": 2}),
    dict(epsilon=0.7, split=[1, 0, 3, 2], queries={"race": 1, "cells": 1, "total": 1}),
    dict(rho=0.8, invariants=["county:total"], queries={"cells": 3, "age": 1}),
    dict(rho=0.6, invariants=["vtd:age"], split=[1, 2, 2, 3]),
])
@pytest.mark.parametrize("k", [2, 3])
def test_a_person_in_k_cells_costs_at_most_the_charge(cfg, k):
    """Brute force over every leaf and every set of at most k of its cells (one person counted in
    each, hence in those cells of every level above): the loss is within what was charged; the
    calibration for one cell per person would exceed it (what overlapping columns did)."""
    t = table(8)
    gauss = "rho" in cfg
    total = cfg.get("rho", cfg.get("epsilon"))

    def worst_loss(design):
        M, scales = full_matrix(design)
        C = design.hierarchy.cells.size
        sets = [s for j in range(1, k + 1) for s in itertools.combinations(range(C), j)]
        E = np.zeros((C, len(sets)))
        for i, s in enumerate(sets):
            E[list(s), i] = 1.0
        worst = 0.0
        for leaf in range(M.shape[1] // C):
            D = M[:, leaf * C:(leaf + 1) * C] @ E  # every set's change to every measurement
            loss = ((D / scales[:, None]) ** 2).sum(axis=0) / 2 if gauss else (abs(D) / scales[:, None]).sum(axis=0)
            worst = max(worst, float(loss.max()))
        return worst

    acc = Accountant(rho=total) if gauss else Accountant(epsilon=total)
    rel = topdown(t, accountant=acc, rng=1, contributions_per_person=k, **cfg)
    charged = acc.spent
    assert charged <= total * (1 + 1e-12)
    assert worst_loss(rel.design) <= charged
    assert worst_loss(rel.design) > charged * 0.5  # the noise is not wasted
    assert worst_loss(plan_topdown(t.hierarchy, **cfg)) > total  # one cell per person: the charge is exceeded
    assert rel.description["contributions_per_person"] == k
    assert all(f"{k} cells per person" in e.label for e in acc.ledger)


def test_command_line_refuses_overlapping_columns_unless_declared(tmp_path, capsys):
    from sparsedp.cli import main

    _with_sum(small_frame(5, high=20), "total", CELLS).to_csv(tmp_path / "t.csv", index=False)
    base = ["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*,total",
            "--rho", "1", "--seed", "1"]
    assert main(base + ["--out", str(tmp_path / "a.npz")]) == 2
    err = capsys.readouterr().err
    assert "'total' equals the sum of" in err and "--cells-per-person" in err
    assert not (tmp_path / "a.npz").exists()
    assert main(base + ["--cells-per-person", "2", "--out", str(tmp_path / "b.npz")]) == 0
    capsys.readouterr()
    assert main(["ledger", str(tmp_path / "b.npz")]) == 0
    out = capsys.readouterr().out
    assert "2 cells per person" in out and "total: rho 1" in out


# -- records with a privacy unit (a person with several records) ----------------------------------

from sparsedp.privacy_unit import IdColumnWarning, PrivacyUnit  # noqa: E402
from sparsedp.topdown.design import person_sensitivity  # noqa: E402

REC_DOMAIN = {"age": ["young", "old"], "sex": ["f", "m"]}


def record_frame(seed=0, people=8):
    """Records of ``people`` persons (``pid``), 1 to 6 records each, in random leaves of an
    unbalanced state > county > district geography and random cells; and the public units."""
    gen = np.random.default_rng(seed)
    units = pd.DataFrame({"st": ["1", "1", "1", "2", "2", "3"], "co": ["a", "a", "b", "c", "d", "e"],
                          "vtd": ["x", "y", None, "z", "w", None]})
    rows = []
    for p in range(people):
        for _ in range(int(gen.integers(1, 7))):
            st, co, vtd = units.iloc[int(gen.integers(0, len(units)))]
            rows.append((f"p{p}", st, co, vtd, gen.choice(REC_DOMAIN["age"]), gen.choice(REC_DOMAIN["sex"])))
    return pd.DataFrame(rows, columns=["pid", "st", "co", "vtd", "age", "sex"]), units


def record_table(frame, units, unit, rng=0):
    return HierarchicalTable.from_records(frame, ["st", "co", "vtd"], ["age", "sex"], domain=REC_DOMAIN, units=units,
                                          privacy_unit=unit, rng=rng)


def _loss(D, scales, gauss):
    """The privacy loss of changing the measurements by the columns of ``D`` (exact for the
    discrete noises' float scales up to rounding)."""
    return ((D / scales[:, None]) ** 2).sum(axis=0) / 2 if gauss else (abs(D) / scales[:, None]).sum(axis=0)


UNIT_CFGS = [
    dict(rho=0.9),
    dict(epsilon=1.3),
    dict(rho=0.37, split=[0.3, 0, 0.1, 0.2], queries={"cells": 3, "total": 1, "age": 1, "sex": 2}),
    dict(epsilon=0.7, queries={"sex": 1, "cells": 1, "total": 1}),
    dict(rho=0.8, invariants=["co:total"], queries={"cells": 3, "age": 1}),
]
UNITS = [PrivacyUnit("pid", max_rows=3), PrivacyUnit("pid", max_groups=2, max_rows_per_group=2),
         PrivacyUnit("pid", max_rows=3, max_groups=3, max_rows_per_group=2), PrivacyUnit("pid", max_rows=7)]


@pytest.mark.parametrize("cfg", UNIT_CFGS)
@pytest.mark.parametrize("unit", UNITS, ids=str)
def test_removing_a_whole_unit_moves_every_level_within_the_charge(cfg, unit):
    """Brute force on random record tables: for every person, the table with and without all of
    their records (theirs appended last, the same truncation seed: the others' records keep their
    priorities) -- every level's measurement moves by at most the ledger's sensitivity, in the
    noise's norm, and the loss over all levels stays within the charge per unit."""
    gauss = "rho" in cfg
    total = cfg.get("rho", cfg.get("epsilon"))
    frame, units = record_frame(4)
    acc = Accountant(rho=total) if gauss else Accountant(epsilon=total)
    base = record_table(frame, units, unit)
    rel = topdown(base, accountant=acc, rng=1, **cfg)
    charged = acc.spent_exact
    assert charged <= budget_fraction(total)
    assert rel.description["privacy_unit"] == unit.describe() and not rel.private  # seeded truncation and noise
    assert all(e.privacy_unit == str(unit).removeprefix("privacy unit: ") for e in rel.ledger)
    M, scales = full_matrix(rel.design)
    leaves, _ = leaves_below(rel.hierarchy)
    worst = 0.0
    for p in frame["pid"].unique():
        mine = frame["pid"] == p
        others = frame[~mine]
        t1 = record_table(pd.concat([others, frame[mine]], ignore_index=True), units, unit)
        t0 = record_table(others, units, unit)
        assert 0 < t1.counts[0].sum() - t0.counts[0].sum() <= unit.l1_bound()
        for lp, entry in zip(rel.design.measured, rel.ledger):
            d = (t1.counts[lp.depth] - t0.counts[lp.depth]).ravel().astype(float)
            moved = sp.csr_matrix(lp.plan.strategy.tosparse()) @ d
            assert np.linalg.norm(moved, 2 if gauss else 1) <= entry.sensitivity * (1 + 1e-12)
        d = np.concatenate([t1.counts[dd][i] - t0.counts[dd][i] for dd, i in leaves]).astype(float)
        worst = max(worst, float(_loss((M @ d)[:, None], scales, gauss)[0]))
    assert worst <= float(charged) * (1 + 1e-12)
    # every change a unit can make: d >= 0 with ||d||_1 <= L; the loss is convex, so its maximum is
    # at a vertex L e_j -- all of the unit's records in one leaf cell -- and it reaches the charge
    L = unit.l1_bound()
    vertex = float(_loss(M.toarray() * L, scales, gauss).max())
    assert worst <= vertex <= float(charged) * (1 + 1e-12)
    assert vertex > float(charged) * 0.99  # the budget is used, not wasted


@pytest.mark.parametrize("cfg, L", [(dict(rho=0.9), 2), (dict(rho=0.8, invariants=["co:total"]), 3),
                                    (dict(epsilon=1.3), 5)])
def test_the_cells_per_person_rule_does_not_cover_a_unit_of_records(cfg, L):
    """The calibration for a person in L distinct cells of one leaf (overlapping count columns)
    is not enough for a unit of L records: they can share one cell (Gaussian: Delta_2 = L, not
    sqrt(L)) or be more than the cells (Laplace: L > 4 cells); the per-unit calibration is."""
    gauss = "rho" in cfg
    total = cfg.get("rho", cfg.get("epsilon"))
    frame, units = record_frame(2)
    t = record_table(frame, units, PrivacyUnit("pid", max_rows=L))
    cells_block = plan_topdown(t.hierarchy, rho=1.0, split="equal").levels[0].blocks[0]  # the cells histogram
    assert person_sensitivity(t.cells, cells_block, 1.0, L, "gaussian") < L  # sqrt(L): distinct cells assumed
    assert person_sensitivity(t.cells, cells_block, 1.0, 5, "laplace") == 4  # at most every cell once
    cpp = plan_topdown(t.hierarchy, contributions_per_person=L, split="equal", **cfg)  # the cells histogram
    M, scales = full_matrix(cpp)
    assert float(_loss(M.toarray() * L, scales, gauss).max()) > total * 1.2  # L records in one cell
    rel = topdown(t, rng=0, **cfg)
    M, scales = full_matrix(rel.design)
    assert float(_loss(M.toarray() * L, scales, gauss).max()) <= total * (1 + 1e-12)


def test_records_are_truncated_per_unit_and_the_release_says_whom_it_protects():
    frame, units = record_frame(7, people=12)
    big = pd.concat([frame, pd.DataFrame([("p0", "1", "a", "x", "old", "f")] * 40, columns=frame.columns)],
                    ignore_index=True)
    t = record_table(big, units, PrivacyUnit("pid", max_rows=2), rng=None)
    assert t.privacy_unit == PrivacyUnit("pid", max_rows=2) and not t.truncation_seeded
    assert t.counts[0].sum() == np.minimum(big["pid"].value_counts(), 2).sum()  # at most 2 kept per person
    g = record_table(big, units, PrivacyUnit("pid", max_groups=1, max_rows_per_group=3))
    assert g.counts[0].sum() <= 3 * 12
    rel = topdown(t, epsilon=1.0)
    assert rel.private and rel.description["privacy_unit"] == {"privacy_unit": "pid", "max_rows": 2}
    assert rel.description["epsilon"] <= 1.0 and rel.description["per_record_epsilon"] == pytest.approx(0.5)
    assert rel.description["spent"] == rel.description["epsilon"]  # per unit, as charged
    assert "one pid" in rel.description["neighbours"]
    assert all(e.privacy_unit == "pid (max_rows 2)" for e in rel.ledger)
    res = rel.to_release()
    assert res.epsilon == pytest.approx(1.0) and res.description["privacy_unit"]["privacy_unit"] == "pid"
    plain = topdown(HierarchicalTable.from_records(frame, ["st", "co", "vtd"], ["age", "sex"], domain=REC_DOMAIN,
                                                   units=units), rho=1.0, rng=0)
    assert plain.description["privacy_unit"] == {"privacy_unit": "one row"}


def test_bad_unit_declarations_are_refused_before_any_charge(tmp_path):
    from sparsedp.topdown import topdown_scaleout

    frame, units = record_frame(1)
    acc = Accountant(rho=1.0)
    bad = [(PrivacyUnit("person", max_rows=2), ShapeError),  # no such column
           (PrivacyUnit("pid", max_rows="auto"), SparseDPError),  # resolve it first, with its budget
           ("pid", SparseDPError)]
    for unit, error in bad:
        with pytest.raises(error):
            topdown(record_table(frame, units, unit), rho=1.0, accountant=acc)
    missing = frame.copy()
    missing.loc[3, "pid"] = None
    with pytest.raises(SparseDPError, match="drop_missing"):
        record_table(missing, units, PrivacyUnit("pid", max_rows=2))
    kept = HierarchicalTable.from_records(missing, ["st", "co", "vtd"], ["age", "sex"], domain=REC_DOMAIN, units=units,
                                          privacy_unit=PrivacyUnit("pid", max_rows=9), drop_missing_units=True)
    assert kept.counts[0].sum() == len(frame) - 1
    t = record_table(frame, units, PrivacyUnit("pid", max_rows=2))
    with pytest.raises(SparseDPError, match="in process"):
        topdown_scaleout(t, tmp_path / "out", rho=1.0, accountant=acc, rng=0)
    with pytest.raises(BudgetExceededError):  # a design planned per record at the full budget costs L^2 times it
        topdown(t, accountant=acc, rng=0, design=plan_topdown(t.hierarchy, rho=1.0))
    frame[["st", "co", "vtd", "age", "sex"]].assign(n=1).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ShapeError, match="records"):
        read_table(tmp_path / "c.csv", "st,co,vtd", ["n"], privacy_unit=PrivacyUnit("pid", max_rows=2))
    assert acc.spent == 0 and not (tmp_path / "out").exists()


def test_an_id_like_column_without_a_unit_warns(tmp_path):
    frame, units = record_frame(1)
    frame = frame.rename(columns={"pid": "person_id"})
    with pytest.warns(IdColumnWarning, match="person_id"):
        HierarchicalTable.from_records(frame, ["st", "co", "vtd"], ["age", "sex"], domain=REC_DOMAIN, units=units)
    frame.to_csv(tmp_path / "r.csv", index=False)
    with pytest.warns(IdColumnWarning, match="person_id"):
        read_table(tmp_path / "r.csv", "st,co,vtd", categories="age,sex", domain=REC_DOMAIN, units=units)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = read_table(tmp_path / "r.csv", "st,co,vtd", categories="age,sex", domain=REC_DOMAIN, units=units,
                       privacy_unit=PrivacyUnit("person_id", max_rows=3), rng=0)
    assert t.privacy_unit.column == "person_id" and t.counts[0].sum() <= 3 * frame["person_id"].nunique()


def test_command_line_reads_records_with_a_privacy_unit(tmp_path, capsys):
    from sparsedp.cli import main

    frame, units = record_frame(3, people=30)
    frame.rename(columns={"pid": "person_id"}).to_csv(tmp_path / "r.csv", index=False)
    units.to_csv(tmp_path / "units.csv", index=False)
    base = ["topdown", str(tmp_path / "r.csv"), "--geo", "st,co,vtd", "--categories", "age,sex", "--domain",
            "age=young,old", "--domain", "sex=f,m", "--units", str(tmp_path / "units.csv"), "--seed", "1"]
    assert main(base + ["--rho", "1", "--out", str(tmp_path / "row.npz")]) == 0
    assert "'person_id' looks like an identifier" in capsys.readouterr().err  # one line, not an error
    assert main(base + ["--epsilon", "1", "--privacy-unit", "person_id", "--max-rows", "3",
                        "--out", str(tmp_path / "unit.csv")]) == 0
    out, err = capsys.readouterr()
    assert "identifier" not in err and "epsilon 1 per person_id" in out
    record = json.loads((tmp_path / "unit.csv.release.json").read_text())
    assert record["description"]["privacy_unit"] == {"privacy_unit": "person_id", "max_rows": 3}
    assert all(e["privacy_unit"] == "person_id (max_rows 3)" for e in record["ledger"])
    assert sum(e["epsilon"] for e in record["ledger"]) == pytest.approx(1.0)
    assert main(base + ["--rho", "1", "--privacy-unit", "person_id", "--max-rows", "auto",
                        "--out", str(tmp_path / "auto.npz")]) == 0
    assert "max_rows" in capsys.readouterr().out
    rel = load_topdown(tmp_path / "auto.npz")
    assert rel.ledger[0]["label"].startswith("privacy unit: bound") and rel.description["privacy_unit_bound"]
    assert sum(e["rho"] for e in rel.ledger) == pytest.approx(1.0)
    assert main(["ledger", str(tmp_path / "auto.npz")]) == 0
    assert "protects: one person_id (max_rows" in capsys.readouterr().out
    bad = [["--rho", "1", "--privacy-unit", "nobody", "--max-rows", "3"],  # no such column
           ["--rho", "1", "--privacy-unit", "person_id", "--max-rows", "auto", "--domain", "age=young"],  # a value
           ["--rho", "1", "--max-rows", "3"],  # bounds without a unit
           ["--rho", "1", "--privacy-unit", "person_id", "--max-rows", "3", "--executor", "dask"]]
    for i, extra in enumerate(bad):
        out = tmp_path / (f"bad{i}" + (".npz" if "dask" not in extra else ""))
        assert main(base + extra + ["--out", str(out)]) == 2
        assert "error" in capsys.readouterr().err and not out.exists()


def test_audit_with_unit_level_neighbours():
    """The measurement of every level of a per-unit release, audited on neighbours that differ by
    one whole unit with all its records (3, in one leaf cell: the worst case): the bound stays
    below the claimed epsilon; the per-record calibration of the same records is flagged."""
    units = pd.DataFrame({"st": ["1", "1", "2"], "co": ["a", "b", "c"]})
    rec = pd.DataFrame({"pid": ["p", "p", "q", "r", "r", "r"], "st": ["1", "1", "2", "1", "2", "1"],
                        "co": ["a", "b", "c", "a", "c", "a"], "age": ["old", "young", "old", "old", "old", "young"]})
    extra = pd.DataFrame({"pid": ["u"] * 3, "st": ["1"] * 3, "co": ["b"] * 3, "age": ["young"] * 3})
    unit = PrivacyUnit("pid", max_rows=3)

    def table(frame):
        return HierarchicalTable.from_records(frame, ["st", "co"], ["age"], domain={"age": ["young", "old"]},
                                              units=units, privacy_unit=unit, rng=0)

    t, t1 = table(rec), table(pd.concat([rec, extra], ignore_index=True))
    assert t1.counts[0].sum() - t.counts[0].sum() == 3

    def release(design):
        plans = [plan_release(lp.plan) for lp in design.levels]

        def run(tab, gen, k):
            return np.hstack([p(tab.counts[d].ravel(), gen, k) for d, p in enumerate(plans)])

        return run

    per_unit = topdown(t, epsilon=1.0, split=[1, 1, 2], rng=0).design
    ok = audit(release(per_unit), t, t1, trials=200_000, rng=1, batched=True)
    assert ok.epsilon_lower <= 1.0
    per_record = plan_topdown(t.hierarchy, epsilon=1.0, split=[1, 1, 2])
    bad = audit(release(per_record), t, t1, trials=200_000, rng=2, batched=True)
    assert bad.epsilon_lower > 1.0


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_table_output_is_a_release_for_load_ledger_and_query(tmp_path, capsys, suffix):
    """``sparsedp topdown ... --out units.csv|.parquet`` writes the published table and its record:
    load_release, sparsedp ledger and sparsedp query read the pair (codes as text); a table without
    a record is refused as 'not a release'."""
    from sparsedp.cli import main

    small_frame(5).to_csv(tmp_path / "t.csv", index=False)
    out = tmp_path / f"units{suffix}"
    assert main(["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
                 "--attributes", "age,race", "--root", "nation", "--rho", "1", "--seed", "3", "--out", str(out)]) == 0
    capsys.readouterr()
    rel = load_release(out)
    frame = rel.to_pandas()
    cells = [c for c in frame.columns if c.startswith(("vap_", "u18_"))]
    assert rel.kind == "topdown" and rel.answers.size == len(frame) * len(cells) and len(rel.ledger) > 0
    np.testing.assert_array_equal(rel.answers, frame[cells].to_numpy(dtype=float).ravel())
    assert (frame["state"].dropna() == frame["state"].dropna().astype(str)).all() and "01" in set(frame["state"])
    assert not rel.private  # seeded
    assert load_release(str(out) + ".release.json").answers.tolist() == rel.answers.tolist()
    assert main(["ledger", str(out)]) == 0
    assert "topdown release" in capsys.readouterr().out
    assert main(["query", str(out), "0", "3"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 5 and printed[0].startswith("unit,cell")  # header and answers 0..3
    (tmp_path / "input.csv").write_text("a,b\n1,2\n")
    with pytest.raises(SparseDPError, match="is a table, not a release"):
        load_release(tmp_path / "input.csv")


# -- the optimised designs: per-level workloads, residual strategies -----------------------------------

WORKLOAD_DESIGNS = [
    dict(rho=0.9),  # the default: cells and totals, residual queries per level
    dict(rho=0.9, invariants=["state:total"]),
    dict(rho=0.7, workload={"total": 1}),  # totals first
    dict(rho=1.1, workload={"cells": 1, "total": 2, "race": 1}, invariants=["county:age"]),
    dict(rho=0.8, workload=[{"total": 1}, {"cells": 1}, {"cells": 1, "total": 1}, {"cells": 1}]),
    dict(rho=0.6, queries={"cells": 1, "total": 1, "residual:age+race": 1}),
    dict(rho=0.9, split=OptimalSplit(family="residual"), invariants=["state:total"]),  # a residual per query
    dict(epsilon=1.2),  # Laplace: marginal candidates
    dict(epsilon=0.8, workload={"total": 1, "age": 1}, invariants=["state:total"]),
]


@pytest.mark.parametrize("cfg", WORKLOAD_DESIGNS)
def test_the_certified_loss_of_optimised_designs_is_within_the_charge(cfg):
    """Brute force over every leaf cell, in exact rationals: one person added anywhere moves the
    optimised design's measurements (residual rows, weighted marginals, every level) by a loss
    within what the accountant charged, and the whole budget is used."""
    _loss_within_charge(table(8), cfg)


@pytest.mark.parametrize("cfg", WORKLOAD_DESIGNS[:3] + WORKLOAD_DESIGNS[6:7])
def test_the_optimised_design_is_the_same_whatever_the_counts(cfg):
    """The design (queries, budgets, scales) is a function of the hierarchy, the workload and the
    invariants' form only: two tables with the same units and other counts get the same one."""
    a = topdown(table(0), rng=1, **cfg).design
    b = topdown(table(0, high=90), rng=2, **cfg).design
    assert [[(q.name, q.budget) for q in lp.blocks] for lp in a.levels] == \
        [[(q.name, q.budget) for q in lp.blocks] for lp in b.levels]
    assert [list(lp.plan.scales) if lp.plan else None for lp in a.levels] == \
        [list(lp.plan.scales) if lp.plan else None for lp in b.levels]


# -- the command line's workload and design table ----------------------------------------------------

def _cli_base(tmp_path):
    small_frame(5).to_csv(tmp_path / "t.csv", index=False)
    return ["topdown", str(tmp_path / "t.csv"), "--geo", "state,county,vtd", "--counts", "vap_*,u18_*",
            "--attributes", "age,race", "--root", "nation", "--invariant", "state:total", "--seed", "1"]


def _design_lines(printed: str) -> dict[str, str]:
    """The design table's first line per level, by level name."""
    lines = printed.split("design by level", 1)[1].split("error by level", 1)[0].splitlines()[1:]
    return {line.split(":")[0].strip(): line for line in lines if line.startswith("  ") and not line.startswith("   ")}


@pytest.mark.parametrize("option, workload", [
    ([], None),
    (["--workload", "total"], {"total": 1}),
    (["--workload", "cells:1,total:2"], {"cells": 1, "total": 2}),
    (["--workload", "age+race:2,race:1", "--workload", "county=total:1,cells:0"],
     [{"age+race": 2, "race": 1}, {"age+race": 2, "race": 1}, {"total": 1, "cells": 0}, {"age+race": 2, "race": 1}]),
    (["--workload", "vtd=race"], [None, None, None, {"race": 1}]),
])
def test_command_line_workload_is_the_library_workload_and_the_design_is_printed(tmp_path, capsys, option, workload):
    """``--workload`` gives the release ``topdown(workload=...)`` gives (same seed, same counts);
    the design table prints every level with its budget and its queries' budgets (adding up to
    the level's, the levels' to the total, within the printed rounding) and the workload's
    predicted errors next to the plain design's."""
    from sparsedp.cli import main
    from sparsedp.topdown.workload import DEFAULT_WORKLOAD

    out = tmp_path / "r.npz"
    assert main(_cli_base(tmp_path) + ["--rho", "0.5", "--out", str(out)] + option) == 0
    printed = capsys.readouterr().out
    t = HierarchicalTable.from_counts(small_frame(5), ["state", "county", "vtd"], "vap_*,u18_*",
                                      attributes=("age", "race"), root="nation")
    want = topdown(t, rho=0.5, invariants=["state:total"], rng=1, workload=workload)
    for a, b in zip(load_topdown(out).counts, want.counts):
        np.testing.assert_array_equal(a, b)
    rows = _design_lines(printed)
    assert list(rows) == list(t.hierarchy.levels)
    total = 0.0
    for lp in want.design.levels:
        head, _, queries = rows[lp.name].partition(" = ")
        if lp.plan is None:
            assert "not measured" in head
            continue
        level = float(head.split()[-1])
        parts = [q.rsplit(" ", 1) for q in queries.split(", ")]
        assert level == pytest.approx(lp.budget, rel=1e-3)
        assert sum(float(b) for _, b in parts) == pytest.approx(level, rel=2e-3)
        assert {n for n, _ in parts} <= {b.name for b in lp.blocks}
        total += level
    assert total == pytest.approx(0.5, rel=2e-3)
    choice = want.design.split_choice
    for (lev, marg), e, e0 in zip(choice.terms, choice.predicted_term_mae, choice.plain_term_mae):
        assert f"{marg} (weight " in printed and f"{e:.3g} (plain {e0:.3g})" in printed
    if workload is None:  # the default workload: every unit's cells and total, weight 1
        assert {m for _, m in choice.terms} == set(DEFAULT_WORKLOAD) and set(choice.term_weights) == {1.0}


def test_command_line_plain_design_prints_the_budgets_and_no_workload(tmp_path, capsys):
    from sparsedp.cli import main

    assert main(_cli_base(tmp_path) + ["--epsilon", "1", "--split", "2,1,1,1", "--out", str(tmp_path / "r.npz")]) == 0
    printed = capsys.readouterr().out
    rows = _design_lines(printed)
    assert [float(r.split(" = ")[0].split()[-1]) for r in rows.values()] == pytest.approx([0.4, 0.2, 0.2, 0.2])
    assert "nation: epsilon 0.4 = " in rows["nation"] and "workload" not in printed.split("error by level")[0]


@pytest.mark.parametrize("option, match", [
    (["--workload", "total:-1"], "finite number >= 0"),
    (["--workload", "total:x"], "finite number >= 0"),
    (["--workload", "total:nan"], "finite number >= 0"),
    (["--workload", "cells,,total"], "empty marginal"),
    (["--workload", "total,total:2"], "listed twice"),
    (["--workload", "total", "--workload", "cells"], "one SPEC for every level"),
    (["--workload", "town=total"], "unknown level"),
    (["--workload", "county=total", "--workload", "county=cells"], "names a level once"),
    (["--workload", "nosuch:1"], "nosuch"),
    (["--workload", "total:0"], "add up to 0"),
    (["--workload", "total", "--split", "equal"], "would be ignored"),
    (["--workload", "total", "--split", "1,1,1,1"], "would be ignored"),
])
def test_command_line_bad_workloads_are_refused_before_any_charge(tmp_path, capsys, monkeypatch, option, match):
    from sparsedp.cli import main
    from sparsedp.privacy import Accountant as Acc

    charged = []
    monkeypatch.setattr(Acc, "spend", lambda self, *a, **k: charged.append(a))
    out = tmp_path / "r.npz"
    assert main(_cli_base(tmp_path) + ["--rho", "0.5", "--out", str(out)] + option) == 2
    assert match in capsys.readouterr().err  # the message names the problem
    assert not charged and not out.exists()


def test_command_line_workload_with_the_chunked_executor(tmp_path, capsys):
    """The chunked path takes ``--workload`` when ``topdown_scaleout`` does, else refuses it
    before anything is read or charged."""
    import inspect

    from sparsedp.cli import main
    from sparsedp.topdown.scaleout import topdown_scaleout

    args = _cli_base(tmp_path) + ["--rho", "0.5", "--workload", "total", "--executor", "dask", "--out",
                                  str(tmp_path / "chunked")]
    if "workload" in inspect.signature(topdown_scaleout).parameters:
        pytest.skip("the chunked release takes a workload: tested with the chunked path")
    assert main(args) == 2
    assert "not taken by the chunked release" in capsys.readouterr().err
    assert not (tmp_path / "chunked").exists()


def test_a_totals_first_workload_rounds_the_totals_before_the_cells():
    """A workload that reads the totals and not the cells: each unit's total is made an integer
    first and its cells rounded to add up to it, so the released totals keep the accuracy the
    design bought (the per-cell rounding splits each parent's cells among the children and loses
    it); the counts are still non-negative integers that add up, the invariants exact."""
    t = table(3, high=60)
    truth = [c.sum(axis=1) for c in t.counts]
    design = plan_topdown(t.hierarchy, rho=0.5, workload={"total": 1}, invariants=["state:total"])
    assert design.totals_first == (True,) * 4 and design.describe()["totals_first"] == list(t.hierarchy.levels)
    plain_rounding = dataclasses.replace(design, totals_first=())
    err, err_cells_rounding, err_gls = [], [], []
    for seed in range(6):
        a = topdown(t, design=design, rng=seed, invariants=["state:total"])
        b = topdown(t, design=plain_rounding, rng=seed, invariants=["state:total"])
        assert a.check() == {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
        err.append([np.abs(a.counts[d].sum(axis=1) - truth[d]).mean() for d in range(4)])
        err_cells_rounding.append([np.abs(b.counts[d].sum(axis=1) - truth[d]).mean() for d in range(4)])
        err_gls.append([np.abs(a.estimate[d].sum(axis=1) - truth[d]).mean() for d in range(4)])
    err, err_cells_rounding, err_gls = (np.mean(e, axis=0) for e in (err, err_cells_rounding, err_gls))
    assert np.all(err[2:] < 0.5 * err_cells_rounding[2:])  # the totals survive the rounding...
    assert np.all(err[2:] < err_gls[2:] + 1.0)  # ...within about the rounding of the GLS totals
    # a workload that reads the cells keeps the per-cell rounding
    assert plan_topdown(t.hierarchy, rho=0.5).totals_first == (False,) * 4
    assert plan_topdown(t.hierarchy, rho=0.5, split="equal", workload={"total": 1}).totals_first == ()


def test_the_transport_projection_of_a_family_depends_on_that_family_alone():
    """Dykstra's projection family by family: a level projected whole gives every family the same
    bits as projected in two parts (the chunked release's subtrees), and meets both sums."""
    from sparsedp.topdown.rounding import project_transport

    gen = np.random.default_rng(4)
    kids = gen.integers(1, 6, 40)
    parents = np.repeat(np.arange(40), kids)
    n, C = parents.size, 6
    truth = gen.integers(0, 9, (n, C))
    parent_counts = np.zeros((40, C), dtype=np.int64)
    np.add.at(parent_counts, parents, truth)
    c2m = np.array([0, 0, 1, 1, 2, 2])
    values = np.stack([truth[:, 2 * j:2 * j + 2].sum(axis=1) for j in range(3)], axis=1)
    est = truth + gen.normal(0, 2.0 + 3.0 * (parents[:, None] % 3), (n, C))  # families converging at other speeds
    w = gen.uniform(0.5, 2.0, (n, C))
    whole = project_transport(est, w, parents, parent_counts, c2m, values)
    cut = int(np.searchsorted(parents, 17))
    parts = [project_transport(est[s], w[s], parents[s] - parents[s][0], parent_counts[parents[s][0]:parents[s][-1] + 1],
                               c2m, values[s]) for s in (slice(0, cut), slice(cut, n))]
    assert np.array_equal(whole, np.concatenate(parts))
    assert whole.min() >= 0
    col = np.zeros((40, C))
    np.add.at(col, parents, whole)
    np.testing.assert_allclose(col, parent_counts, atol=1e-6)
    np.testing.assert_allclose(np.stack([whole[:, 2 * j:2 * j + 2].sum(axis=1) for j in range(3)], axis=1), values,
                               atol=1e-6)
