"""The exact tree x span solver (vector-node two-pass), re-aggregation and the accurate residual."""

import math
from fractions import Fraction

import networkx as nx
import numpy as np
import pytest

from sparsedp.consistency import (
    FixedValues,
    SpanConstraints,
    TreeConstraints,
    restaurant,
    restaurant_constraints,
    restaurant_layout,
    restaurant_tree_values,
    solve,
)
from sparsedp.consistency import residuals as residuals_mod
from sparsedp.consistency.residuals import accurate_residual, exact_rows, two_product
from sparsedp.consistency.solvers import compile_constraints
from sparsedp.consistency.treespan import detect_tree_span, tree_span_solve
from sparsedp.errors import UnsupportedStructureError
from sparsedp.strategies import TreeLayout


def _problem(days: int, branching: int, p: int, r: int, seed: int, where: str = "leaves", perm: bool = False):
    """``p`` trees on one layout, node vectors in a random ``r``-dimensional span (leaves or all nodes)."""
    rng = np.random.default_rng(seed)
    lay = TreeLayout.balanced(days, branching)
    node = np.arange(lay.nodes)
    basis = rng.normal(size=(p, r))
    at = lay.row_offsets[0] + np.arange(lay.n) if where == "leaves" else node
    cols = rng.permutation(p) if perm else np.arange(p)
    fams = [
        TreeConstraints(lay, index=node[:, None] * p + np.arange(p), name="trees"),
        SpanConstraints(basis[cols], at[:, None] * p + cols, name="span"),
    ]
    truth = (lay.matrix() @ (rng.poisson(20, size=(days, r)) @ basis.T)).ravel()
    return lay, fams, truth, rng


def _variances(kind: str, lay: TreeLayout, p: int, rng: np.random.Generator) -> np.ndarray | None:
    if kind == "equal":
        return None
    if kind == "separable":
        return np.outer(rng.uniform(0.5, 2.0, lay.nodes), rng.uniform(0.5, 2.0, p)).ravel()
    return rng.uniform(0.3, 3.0, lay.nodes * p)


@pytest.mark.parametrize("days,branching,p,r", [(1, 2, 3, 2), (2, 2, 5, 3), (13, 2, 5, 3), (20, 3, 4, 2), (9, 4, 3, 1)])
@pytest.mark.parametrize("kind", ["equal", "separable", "general"])
@pytest.mark.parametrize("where", ["leaves", "nodes"])
def test_tree_span_matches_generic(days, branching, p, r, kind, where):
    lay, fams, truth, rng = _problem(days, branching, p, r, seed=days * 31 + p, where=where, perm=True)
    v = _variances(kind, lay, p, rng)
    x0 = truth + rng.normal(size=truth.size) * 5
    fast = solve(x0, fams, variances=v, method="structured")
    ref = solve(x0, fams, variances=v, method="generic")
    expected = "separable" if kind != "general" or lay.nodes == 1 else "blocks"  # one node is always separable
    assert fast.method == f"structured:tree-span:{expected}"
    np.testing.assert_allclose(fast.x, ref.x, atol=1e-8)
    auto = solve(x0, fams, variances=v)
    assert auto.method.startswith("auto:tree-span")
    np.testing.assert_array_equal(auto.x, fast.x)
    assert fast.converged and fast.residual <= 1e-9


@pytest.mark.parametrize("weighted", [None, "general"])
def test_restaurant_tree_span_every_formulation(weighted):
    days = 23
    lay = restaurant_layout(days)
    rng = np.random.default_rng(5)
    v = None if weighted is None else rng.uniform(0.5, 4.0, lay.nodes * 5)
    x0 = restaurant_tree_values(restaurant(days, seed=1).sales, lay) + rng.normal(size=lay.nodes * 5) * 3
    ref = solve(x0, restaurant_constraints(days, "leaves"), variances=v, method="direct").x
    for where in ("leaves", "nodes"):
        for per_item in (False, True):
            res = solve(x0, restaurant_constraints(days, where, per_item=per_item), variances=v)
            assert res.method.startswith("auto:tree-span")
            np.testing.assert_allclose(res.x, ref, atol=1e-8)


def test_trees_only_and_free_variables():
    """No span family: the trees alone (per-column variances), variables outside the trees untouched."""
    lay = TreeLayout.balanced(11, 3)
    rng = np.random.default_rng(2)
    p, extra = 2, 4
    n = lay.nodes * p + extra
    x0 = rng.normal(size=n) * 10
    v = rng.uniform(0.5, 2.0, n)
    fams = TreeConstraints(lay, index=np.arange(lay.nodes)[:, None] * p + np.arange(p) + extra)
    res = solve(x0, fams, variances=v, method="structured")
    assert res.method == "structured:tree-span:trees"
    np.testing.assert_array_equal(res.x[:extra], x0[:extra])
    np.testing.assert_allclose(res.x, solve(x0, fams, variances=v, method="generic").x, atol=1e-9)


def test_other_structures_are_not_mistaken_for_tree_span():
    lay, fams, truth, rng = _problem(8, 2, 3, 2, seed=0)
    n = truth.size
    x0 = truth + rng.normal(size=n)
    with_fixed = fams + [FixedValues([0], [truth[0]])]
    assert detect_tree_span(compile_constraints(with_fixed, n).blocks, n) is None
    with pytest.raises(UnsupportedStructureError):
        solve(x0, with_fixed, method="structured")
    assert solve(x0, with_fixed).method == "auto:direct"
    # span groups that miss a leaf, or that mix two nodes, are not the structure either
    basis = rng.normal(size=(3, 2))
    leaves = lay.row_offsets[0] + np.arange(lay.n)
    node = np.arange(lay.nodes)
    tree = TreeConstraints(lay, index=node[:, None] * 3 + np.arange(3))
    missing = SpanConstraints(basis, leaves[1:, None] * 3 + np.arange(3))
    mixed = SpanConstraints(basis, np.column_stack([leaves * 3, leaves * 3 + 1, np.roll(leaves, 1) * 3 + 2]))
    for span in (missing, mixed):
        assert detect_tree_span(compile_constraints([tree, span], n).blocks, n) is None
        np.testing.assert_allclose(
            solve(x0, [tree, span]).x, solve(x0, [tree, span], method="generic").x, atol=1e-8
        )


def test_reaggregation_makes_parents_float_sums_of_children():
    days = 1000
    lay = restaurant_layout(days)
    rng = np.random.default_rng(9)
    x0 = restaurant_tree_values(restaurant(days, seed=3).sales, lay) * 1e4 + rng.normal(size=lay.nodes * 5)
    res = solve(x0, restaurant_constraints(days, "leaves"), method="structured")
    X = res.x.reshape(lay.nodes, 5)
    for lev in range(1, lay.levels):
        kids = lay.level_rows(X, lev - 1)
        st = lay.child_starts[lev - 1]
        sums = np.array([kids[a:b].sum(axis=0) if b - a > 1 else kids[a] for a, b in zip(st[:-1], st[1:])])
        np.testing.assert_array_equal(lay.level_rows(X, lev), sums)
    # the finish moves values by rounding only: against the direct solve, a few ulps of the values
    ref = solve(x0, restaurant_constraints(days, "leaves"), method="direct").x
    assert np.max(np.abs(res.x - ref) / np.maximum(np.abs(ref), 1.0)) < 1e-12


def _exact_max_residual(C, x, b) -> float:
    C = C.tocsr()
    out = 0
    for i in range(C.shape[0]):
        lo, hi = C.indptr[i], C.indptr[i + 1]
        r = sum((Fraction(float(c)) * Fraction(float(x[j])) for c, j in zip(C.data[lo:hi], C.indices[lo:hi])), Fraction(0))
        out = max(out, abs(r - Fraction(float(b[i]))))
    return float(out)


@pytest.mark.parametrize("where", ["leaves", "nodes"])
def test_reported_residual_is_the_exact_one(where):
    """Values ~1e9: float64 evaluation errs by ~1e-7; the report is the exact residual of the vector."""
    days = 40
    lay = restaurant_layout(days)
    rng = np.random.default_rng(4)
    x0 = restaurant_tree_values(restaurant(days, seed=3).sales, lay) * 3e5 + rng.normal(size=lay.nodes * 5) * 50
    fams = restaurant_constraints(days, where)
    res = solve(x0, fams, method="structured", tol=1e-12)
    prob = compile_constraints(fams, x0.size)
    exact = _exact_max_residual(prob.C, res.x, prob.b)
    assert res.residual == pytest.approx(exact, rel=1e-12, abs=1e-14)  # floor 1e-14: every row refined if needed
    scale = float(np.max(abs(prob.C) @ np.abs(res.x) + np.abs(prob.b)))
    assert res.relative_residual == pytest.approx(res.residual / scale, rel=1e-12)


def test_exact_rows_and_two_product():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=1000) * 1e6, rng.normal(size=1000) * 1e-3
    p, e = two_product(a, b)
    for i in range(0, 1000, 97):
        assert Fraction(float(p[i])) + Fraction(float(e[i])) == Fraction(float(a[i])) * Fraction(float(b[i]))
    import scipy.sparse as sp

    C = sp.random(30, 50, density=0.2, random_state=1, format="csr")
    C.data = rng.normal(size=C.nnz)
    x = rng.normal(size=50) * 1e8
    bb = C @ x
    got = exact_rows(C, x, bb)
    for i in range(30):
        lo, hi = C.indptr[i], C.indptr[i + 1]
        ex = sum((Fraction(float(c)) * Fraction(float(x[j])) for c, j in zip(C.data[lo:hi], C.indices[lo:hi])), Fraction(0))
        assert got[i] == float(ex - Fraction(float(bb[i])))  # correctly rounded


def test_residual_refinement_cap_gives_a_true_bound(monkeypatch):
    days = 64
    lay = restaurant_layout(days)
    x = restaurant_tree_values(restaurant(days, seed=0).sales, lay) * 1e9  # exact integer sums: residual 0
    prob = compile_constraints(restaurant_constraints(days, "leaves")[0], x.size)  # the item trees
    full = accurate_residual(prob.blocks, x, 0.0)
    assert full.residual == 0.0 and not full.bounded
    monkeypatch.setattr(residuals_mod, "MAX_REFINE", 10)
    monkeypatch.setattr(residuals_mod, "CHUNK", 5)
    capped = accurate_residual(prob.blocks, x, 0.0)
    assert capped.bounded and capped.residual >= full.residual and capped.refined >= 10
    assert math.isfinite(capped.residual)


@pytest.mark.parametrize("where", ["leaves", "nodes"])
def test_select_rows_and_row_scale_match_explicit_rows(where):
    days = 19
    lay = restaurant_layout(days)
    x = np.random.default_rng(1).normal(size=lay.nodes * 5) * 100
    for blk in compile_constraints(restaurant_constraints(days, where), x.size).blocks:
        C, b = blk.local_rows()
        xl = x[blk.variables]
        rows = np.arange(C.shape[0])[::-3]
        Cs, bs = blk.select_rows(rows)
        assert abs(Cs - C[rows]).max() == 0 and np.array_equal(bs, b[rows])
        np.testing.assert_allclose(blk.row_scale(xl), abs(C) @ np.abs(xl) + np.abs(b), rtol=1e-14)
        np.testing.assert_allclose(blk.residual(xl), C @ xl - b, atol=1e-10)


def test_float_evaluation_misses_the_true_residual_of_reaggregated_trees():
    """After re-aggregation a float64 evaluation of a tree row returns exactly 0; the true residual of
    the stored vector is the rounding of the sum, which the report gives."""
    days = 64
    lay = restaurant_layout(days)
    rng = np.random.default_rng(12)
    x0 = restaurant_tree_values(restaurant(days, seed=3).sales, lay) * 1e6 + rng.normal(size=lay.nodes * 5)
    trees = restaurant_constraints(days, "leaves")[0]
    res = solve(x0, trees, method="structured", tol=1e-12)
    prob = compile_constraints(trees, x0.size)
    assert float(np.max(np.abs(prob.residual_vector(res.x)))) == 0.0  # parent - (c1 + c2) in float64
    exact = _exact_max_residual(prob.C, res.x, prob.b)
    assert exact > 0 and res.residual == pytest.approx(exact, rel=1e-12)
    # bounded by half an ulp of the largest parent
    assert res.residual <= 0.5 * np.spacing(np.max(np.abs(res.x)))


def test_nonnegative_infeasible_is_reported_before_iterating():
    from sparsedp.consistency import LinearConstraints
    from sparsedp.errors import InfeasibleConstraintsError

    C = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    x = np.array([1.0, 2.0, 3.0])
    # x0 + x1 = -1 has real solutions but none with x >= 0
    with pytest.raises(InfeasibleConstraintsError, match="x >= 0"):
        solve(x, LinearConstraints(C, [-1.0, 2.0], name="sums"), nonnegative=True, max_sweeps=10**6)
    ok = solve(x, LinearConstraints(C, [1.0, 2.0], name="sums"), nonnegative=True)
    assert ok.converged and np.all(ok.x >= 0)


def _irregular_layout() -> TreeLayout:
    """7 leaves; level 1 groups them 1 + 3 + 2 + 1 (an irregular level), level 2 groups 3 + 1."""
    cs = (np.array([0, 1, 4, 6, 7]), np.array([0, 3, 4]), np.array([0, 2]))
    sizes = (7, 4, 2, 1)
    leaf = [np.arange(8)]
    for st in cs:
        leaf.append(leaf[-1][st])
    offsets, acc = [], 0
    for size in reversed(sizes):
        offsets.append(acc)
        acc += size
    return TreeLayout(n=7, sizes=sizes, child_starts=cs, leaf_starts=tuple(leaf), row_offsets=tuple(reversed(offsets)))


@pytest.mark.parametrize("layout", [TreeLayout.balanced(37, 3), TreeLayout.balanced(50, 2), _irregular_layout()])
def test_residual_chunks_cover_every_row_in_order(layout):
    from sparsedp.consistency.blocks import LayoutTreeBlock

    rng = np.random.default_rng(0)
    blk = LayoutTreeBlock(layout, np.arange(layout.nodes)[:, None] * 2 + np.arange(2), "t")
    x = rng.normal(size=layout.nodes * 2) * 1e3
    C, b = blk.local_rows()
    for chunk in (1, 2, 5, 1 << 14):
        parts = list(blk.residual_chunks(x, chunk=chunk))
        assert [p[0] for p in parts] == list(np.cumsum([0] + [p[1].size for p in parts[:-1]]))
        np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), C @ x - b, atol=1e-9)
        np.testing.assert_allclose(np.concatenate([p[2] for p in parts]), abs(C) @ np.abs(x), rtol=1e-14)
    # and the structured solver on an irregular layout still matches generic
    if layout.n == 7:
        fam = TreeConstraints(layout, index=np.arange(layout.nodes)[:, None] * 2 + np.arange(2))
        v = rng.uniform(0.5, 2.0, x.size)
        np.testing.assert_allclose(solve(x, fam, variances=v, method="structured").x,
                                   solve(x, fam, variances=v, method="generic").x, atol=1e-8)


@pytest.mark.parametrize("r", [1, 2, 3, 4])
def test_small_spd_inverse(r):
    from sparsedp.consistency.treespan import _spd_inv

    rng = np.random.default_rng(r)
    M = rng.normal(size=(50, r, r))
    A = M @ np.swapaxes(M, 1, 2) + 0.1 * np.eye(r)
    inv = _spd_inv(A)
    np.testing.assert_allclose(inv @ A, np.broadcast_to(np.eye(r), A.shape), atol=1e-9)
    np.testing.assert_array_equal(inv, np.swapaxes(inv, 1, 2))


@pytest.mark.parametrize("kind", ["equal", "general"])
def test_networkx_trees_with_a_span_take_the_structured_path(kind):
    """p networkx trees of one (irregular) shape, node vectors of the leaves in a span."""
    g = nx.bfs_tree(nx.random_labeled_tree(40, seed=3), 0)  # edges parent -> child
    p, r = 3, 2
    rng = np.random.default_rng(1)
    nodes = list(g.nodes)
    trees = [TreeConstraints(g, index={u: 3 * i + j for i, u in enumerate(nodes)}, name=f"t{j}") for j in range(p)]
    leaves = [i for i, u in enumerate(nodes) if g.out_degree(u) == 0]
    span = SpanConstraints(rng.normal(size=(p, r)), np.array([[3 * i, 3 * i + 1, 3 * i + 2] for i in leaves]))
    n = 3 * len(nodes)
    x0 = rng.normal(size=n) * 10
    v = None if kind == "equal" else rng.uniform(0.5, 2.0, n)
    res = solve(x0, trees + [span], variances=v)
    assert res.method == "auto:tree-span:" + ("separable" if kind == "equal" else "blocks")
    np.testing.assert_allclose(res.x, solve(x0, trees + [span], variances=v, method="generic").x, atol=1e-8)
    # trees of different shapes are not one structure: the general path, same answer
    other = TreeConstraints(nx.bfs_tree(nx.random_labeled_tree(40, seed=4), 0), index={u: 3 * i + 2 for i, u in enumerate(nodes)}, name="t2")
    mixed = trees[:2] + [other, span]
    assert detect_tree_span(compile_constraints(mixed, n).blocks, n) is None
    np.testing.assert_allclose(solve(x0, mixed, variances=v).x, solve(x0, mixed, variances=v, method="generic").x,
                               atol=1e-8)


def test_auto_projects_a_single_group_once():
    from sparsedp.consistency import LinearConstraints

    rng = np.random.default_rng(0)
    C = rng.normal(size=(4, 12))
    x0 = rng.normal(size=12)
    v = rng.uniform(0.5, 2.0, 12)
    b = rng.normal(size=4)
    res = solve(x0, LinearConstraints(C, b), variances=v)
    assert res.method == "auto:one-group" and res.iterations == 1
    np.testing.assert_allclose(res.x, solve(x0, LinearConstraints(C, b), variances=v, method="generic").x, atol=1e-9)
