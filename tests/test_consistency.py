import networkx as nx
import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as hst

from sparsedp import InfeasibleConstraintsError, NonFiniteInputError, ShapeError, SparseDPError
from sparsedp.consistency import (
    HAVE_CHOLMOD,
    ConstraintFamily,
    FixedValues,
    LinearConstraints,
    SPDSolver,
    SpanConstraints,
    TreeConstraints,
    compile_constraints,
    solve,
    tree_project,
)
from sparsedp.errors import UnsupportedStructureError
from sparsedp.strategies import TreeLayout

METHODS = ["direct", "alternating", "accelerated", "auto"]


def reference(x, C, b, v=None):
    """Weighted projection by the KKT system (dense, independent of the library's code paths)."""
    n, m = C.shape[1], C.shape[0]
    D = np.diag(1.0 / (np.ones(n) if v is None else v))
    K = np.block([[D, C.T], [C, np.zeros((m, m))]])
    rhs = np.concatenate([D @ x, b])
    return np.linalg.lstsq(K, rhs, rcond=None)[0][:n]


def random_problem(seed, n=14, m=8, redundant=2):
    rng = np.random.default_rng(seed)
    C = rng.normal(size=(m, n)) * (rng.random((m, n)) < 0.4)
    C[np.arange(m), rng.integers(0, n, m)] += 1.0  # no empty rows
    if redundant:
        C = np.vstack([C, rng.normal(size=(redundant, m)) @ C])  # linearly dependent rows
    b = C @ rng.normal(size=n) * 5
    x = rng.normal(size=n) * 10
    v = rng.uniform(0.2, 5.0, size=n)
    return C, b, x, v


def split_families(C, b, parts, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, parts, C.shape[0])
    return [LinearConstraints(C[labels == k], b[labels == k], name=f"part{k}") for k in range(parts) if np.any(labels == k)]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_every_method_agrees_with_generic(method, weighted):
    for seed in range(3):
        C, b, x, v = random_problem(seed)
        fams = split_families(C, b, 3, seed)
        vv = v if weighted else None
        gen = solve(x, fams, variances=vv, method="generic")
        np.testing.assert_allclose(gen.x, reference(x, C, b, vv), atol=1e-8)
        res = solve(x, fams, variances=vv, method=method, tol=1e-12)
        assert res.converged
        np.testing.assert_allclose(res.x, gen.x, atol=1e-8)
        assert res.residual <= 1e-9
        assert np.max(np.abs(C @ res.x - b)) <= 1e-9


@settings(max_examples=25, deadline=None)
@given(seed=hst.integers(0, 10_000), parts=hst.integers(1, 5), weighted=hst.booleans())
def test_alternating_converges_to_generic_for_any_split(seed, parts, weighted):
    C, b, x, v = random_problem(seed, n=9, m=5, redundant=1)
    vv = v if weighted else None
    fams = split_families(C, b, parts, seed + 1)
    res = solve(x, fams, variances=vv, method="alternating", tol=1e-11, sweep="symmetric" if seed % 2 else "cyclic")
    np.testing.assert_allclose(res.x, reference(x, C, b, vv), atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(seed=hst.integers(0, 10_000), weighted=hst.booleans())
def test_seed_theorems_2_4_5(seed, weighted):
    C, b, x, v = random_problem(seed, n=10, m=6)
    vv = v if weighted else None
    D = 1.0 / (np.ones(10) if vv is None else vv)
    fam = LinearConstraints(C, b)
    y = solve(x, fam, variances=vv, method="direct").x
    # Thm 2: consistent and idempotent
    assert np.max(np.abs(C @ y - b)) < 1e-8
    np.testing.assert_allclose(solve(y, fam, variances=vv, method="direct").x, y, atol=1e-8)
    # two other consistent releases p1, p2 (projections of random points)
    rng = np.random.default_rng(seed)
    p1 = solve(rng.normal(size=10) * 10, fam, variances=vv, method="direct").x
    p2 = solve(rng.normal(size=10) * 10, fam, variances=vv, method="direct").x
    nrm = lambda a: float(np.sum(D * a * a))  # noqa: E731
    # Thm 4 (norm invariance / Pythagoras): ||x - p||^2 = ||x - y||^2 + ||y - p||^2
    assert nrm(x - p1) == pytest.approx(nrm(x - y) + nrm(y - p1), rel=1e-9, abs=1e-7)
    # Thm 5 (inner-product invariance): <x - y, p1 - p2>_D = 0
    assert abs(float(np.sum(D * (x - y) * (p1 - p2)))) <= 1e-7 * (1 + nrm(x - y) + nrm(p1 - p2))


def random_tree(seed, size=25):
    rng = np.random.default_rng(seed)
    T = nx.DiGraph()
    T.add_node(0)
    for u in range(1, size):
        T.add_edge(int(rng.integers(0, u)), u)
    return T


def tree_rows(T):
    internal = [u for u in T.nodes if T.out_degree(u) > 0]
    C = np.zeros((len(internal), T.number_of_nodes()))
    for r, u in enumerate(internal):
        C[r, u] = 1
        for c in T.successors(u):
            C[r, c] = -1
    return C


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tree_projection_is_weighted_blue(seed):
    T = random_tree(seed)
    rng = np.random.default_rng(seed)
    n = T.number_of_nodes()
    x, v = rng.normal(size=n) * 5, rng.uniform(0.5, 4, n)
    C = tree_rows(T)
    want = reference(x, C, np.zeros(C.shape[0]), v)
    for method in ("generic", "alternating", "direct", "auto"):
        res = solve(x, TreeConstraints(T), variances=v, method=method)
        np.testing.assert_allclose(res.x, want, atol=1e-8)
    # structured projector used directly
    parent = np.full(n, -1)
    for p, c in T.edges:
        parent[c] = p
    np.testing.assert_allclose(tree_project(parent, x, v), want, atol=1e-9)


def test_tree_constraints_on_layout_match_networkx_tree():
    lay = TreeLayout.balanced(11, 3)
    G = nx.DiGraph()
    G.add_nodes_from(range(lay.nodes))
    for lev in range(1, lay.levels):
        for i in range(lay.sizes[lev]):
            for c in range(lay.child_starts[lev - 1][i], lay.child_starts[lev - 1][i + 1]):
                G.add_edge(lay.row_offsets[lev] + i, lay.row_offsets[lev - 1] + c)
    rng = np.random.default_rng(3)
    x, v = rng.normal(size=lay.nodes), rng.uniform(0.5, 2, lay.nodes)
    a = solve(x, TreeConstraints(lay), variances=v, method="alternating").x
    b = solve(x, TreeConstraints(G), variances=v, method="alternating").x
    np.testing.assert_allclose(a, b, atol=1e-10)
    np.testing.assert_allclose(a, solve(x, TreeConstraints(G), variances=v, method="generic").x, atol=1e-9)


def test_tree_index_attribute_and_offset():
    T = nx.DiGraph([("r", "a"), ("r", "b")])
    for i, u in enumerate(["a", "b", "r"]):
        T.nodes[u]["index"] = i
    x = np.array([0.0, 1.0, 2.0, 4.0, 7.0])  # variables 2, 3, 4 = a, b, r
    res = solve(x, TreeConstraints(T, offset=2), method="direct")
    assert res.x[4] == pytest.approx(res.x[2] + res.x[3])
    np.testing.assert_allclose(res.x[:2], x[:2])
    # (a, b, r) = (2, 4, 7): gap 1 split in thirds
    np.testing.assert_allclose(res.x[2:], [2 + 1 / 3, 4 + 1 / 3, 7 - 1 / 3], atol=1e-12)


@pytest.mark.parametrize("weighted", [False, True])
def test_span_constraints_batched(weighted):
    rng = np.random.default_rng(5)
    basis = rng.normal(size=(5, 2))
    groups = np.arange(40).reshape(8, 5)
    x, v = rng.normal(size=40), rng.uniform(0.3, 3, 40)
    vv = v if weighted else None
    fam = SpanConstraints(basis, groups, chunks=3)
    got = solve(x, fam, variances=vv, method="alternating")
    assert got.iterations == 1  # disjoint groups: one sweep is exact
    np.testing.assert_allclose(got.x, solve(x, fam, variances=vv, method="generic").x, atol=1e-10)
    # every group lies in the span
    resid = got.x.reshape(8, 5).T - basis @ np.linalg.lstsq(basis, got.x.reshape(8, 5).T, rcond=None)[0]
    assert np.max(np.abs(resid)) < 1e-9


def test_fixed_values_and_mixed_families():
    C, b, x, v = random_problem(7, n=12, m=4, redundant=0)
    fams = [LinearConstraints(C, b), FixedValues([0, 3], [1.5, -2.0])]
    gen = solve(x, fams, variances=v, method="generic")
    assert gen.x[0] == pytest.approx(1.5) and gen.x[3] == pytest.approx(-2.0)
    for m in METHODS:
        np.testing.assert_allclose(solve(x, fams, variances=v, method=m, tol=1e-12).x, gen.x, atol=1e-8)


def test_custom_family_by_rows_only():
    class EqualTotals(ConstraintFamily):
        name = "equal-totals"

        def rows(self, n):
            C = sp.csr_matrix(np.concatenate([np.ones(n // 2), -np.ones(n - n // 2)])[None, :])
            return C, np.zeros(1)

    x = np.arange(6.0)
    res = solve(x, EqualTotals(), method="direct")
    assert res.x[:3].sum() == pytest.approx(res.x[3:].sum())
    np.testing.assert_allclose(res.x, x + np.array([1.5, 1.5, 1.5, -1.5, -1.5, -1.5]), atol=1e-12)


@pytest.mark.parametrize("method", ["generic", "direct", "alternating", "accelerated", "auto"])
def test_infeasible_constraints_name_the_families(method):
    x = np.zeros(4)
    fams = [FixedValues([0], [1.0], name="invariant"), LinearConstraints([[1.0, 0, 0, 0]], [2.0], name="policy"),
            LinearConstraints([[0, 1.0, 1.0, 0]], [3.0], name="innocent")]
    with pytest.raises(InfeasibleConstraintsError) as exc:
        solve(x, fams, method=method, max_sweeps=200)
    msg = str(exc.value)
    assert "invariant" in msg and "policy" in msg and "innocent" not in msg


def test_infeasible_within_one_family():
    with pytest.raises(InfeasibleConstraintsError, match="fixed"):
        FixedValues([1, 1], [0.0, 1.0])
    with pytest.raises(InfeasibleConstraintsError, match="contra"):
        solve(np.zeros(3), [LinearConstraints([[1.0, 1, 0], [2.0, 2, 0]], [1.0, 3.0], name="contra"),
                            FixedValues([2], [0.0])], method="alternating")


def test_bad_input_raises_before_work():
    fam = LinearConstraints([[1.0, 1.0]], [1.0])
    with pytest.raises(NonFiniteInputError):
        solve([np.nan, 1.0], fam)
    with pytest.raises(ShapeError):
        solve([1.0, 2.0, 3.0], fam)
    with pytest.raises(ShapeError):
        solve([1.0, 2.0], fam, variances=[1.0, 0.0])
    with pytest.raises(SparseDPError):
        solve([1.0, 2.0], fam, method="magic")
    with pytest.raises(ShapeError):
        solve([1.0, 2.0], FixedValues([5], [1.0]))
    with pytest.raises(SparseDPError):
        solve([1.0, 2.0], ["not a family"])
    with pytest.raises(NonFiniteInputError):
        LinearConstraints([[1.0, 1.0]], [np.inf])
    with pytest.raises(UnsupportedStructureError):
        solve(np.zeros(50), LinearConstraints(np.ones((3, 50)), np.zeros(3)), method="generic", generic_max_bytes=1000)


def test_redundant_rows_direct_matches_generic_large_duplicates():
    C, b, x, v = random_problem(11, n=30, m=10, redundant=10)
    C = np.vstack([C, C])  # exact duplicates too
    b = np.concatenate([b, b])
    for vv in (None, v):
        np.testing.assert_allclose(
            solve(x, LinearConstraints(C, b), variances=vv, method="direct").x, reference(x, C, b, vv), atol=1e-8
        )


@pytest.mark.skipif(not HAVE_CHOLMOD, reason="needs scikit-sparse")
def test_splu_fallback_and_refactorisation_agree():
    rng = np.random.default_rng(2)
    A = sp.random(30, 20, density=0.2, random_state=3, format="csr") + sp.eye(30, 20)
    S = (A @ A.T).tocsc()  # rank 20 < 30: singular
    r = S @ rng.normal(size=30)
    for backend in ("cholmod", "splu"):
        y = SPDSolver(S, backend=backend).solve(r)
        assert np.linalg.norm(S @ y - r) <= 1e-9 * np.linalg.norm(r)
    s = SPDSolver(S)
    d = sp.diags(rng.uniform(1, 2, 20))
    S2 = (A @ d @ A.T).tocsc()
    s.refactor(S2)
    r2 = S2 @ rng.normal(size=30)
    assert np.linalg.norm(S2 @ s.solve(r2) - r2) <= 1e-9 * np.linalg.norm(r2)


def test_history_and_honest_stopping():
    C, b, x, v = random_problem(4, n=20, m=10, redundant=0)
    fams = split_families(C, b, 4, 0)
    truth = reference(x, C, b) + 0.1
    res = solve(x, fams, method="alternating", tol=1e-6, truth=truth)
    h = res.history
    assert len(h["mse"]) == res.iterations + 1 and np.all(np.isfinite(h["err"]))
    assert h["residual"][-1] == pytest.approx(res.residual) and res.residual <= 1e-6
    assert np.all(h["residual"][1:] <= 1e-6) == (res.iterations == 1)
    # residual-based stopping: the distance left is bounded by the residual through the smallest
    # non-zero singular value of C; and the reported estimate is of the right order
    gap = np.max(np.abs(res.x - reference(x, C, b)))
    smin = np.linalg.svd(C, compute_uv=False).min()
    assert gap <= np.sqrt(C.shape[0]) * res.residual / smin * 1.0001
    assert res.error_estimate >= 0


def test_callback_sees_every_iteration():
    C, b, x, _ = random_problem(2)
    seen = []
    res = solve(x, split_families(C, b, 2, 1), method="accelerated", callback=lambda i, xx, r: seen.append((i, r)))
    assert len(seen) == res.iterations + 1 and seen[-1][1] == pytest.approx(res.residual)


def test_nonnegative_dykstra_matches_qp():
    rng = np.random.default_rng(8)
    n = 8
    C = np.vstack([np.ones(n), np.r_[np.ones(4), np.zeros(4)]])
    b = np.array([10.0, 3.0])
    x = rng.normal(size=n) * 3
    v = rng.uniform(0.5, 2, n)
    res = solve(x, LinearConstraints(C, b), variances=v, nonnegative=True, tol=1e-10)
    assert res.converged and np.all(res.x >= 0) and res.residual <= 1e-8
    qp = scipy.optimize.minimize(
        lambda z: np.sum((z - x) ** 2 / v), np.full(n, 10 / n), jac=lambda z: 2 * (z - x) / v,
        constraints=[{"type": "eq", "fun": lambda z: C @ z - b, "jac": lambda z: C}],
        bounds=[(0, None)] * n, method="SLSQP", options={"ftol": 1e-14, "maxiter": 500},
    )
    np.testing.assert_allclose(res.x, qp.x, atol=1e-5)
    assert np.any(solve(x, LinearConstraints(C, b), variances=v).x < 0)  # the constraint mattered


def test_groups_are_disjoint_blocks():
    lay = TreeLayout.balanced(4, 2)
    node = np.arange(lay.nodes)
    fams = [TreeConstraints(lay, index=node * 2), TreeConstraints(lay, index=node * 2 + 1),
            FixedValues([0], [3.0])]
    prob = compile_constraints(fams, 2 * lay.nodes)
    assert [len(g) for g in prob.groups] == [2, 1]


def test_tree_nodes_are_variables_by_label_not_insertion_order():
    # issue 20 #1: a geography (1 country, 10 states, 100 counties; node i is variable i) built
    # with county edges listed before state edges was solved against the wrong variables (MSE
    # 13,943,740 instead of ~7) because nodes were numbered by insertion order
    rng = np.random.default_rng(0)
    states = [(0, s) for s in range(1, 11)]
    counties = [(s, 11 + 10 * (s - 1) + c) for s in range(1, 11) for c in range(10)]
    truth = np.zeros(111)
    truth[11:] = rng.integers(100, 1000, size=100)
    for s in range(1, 11):
        truth[s] = truth[11 + 10 * (s - 1): 21 + 10 * (s - 1)].sum()
    truth[0] = truth[1:11].sum()
    noisy = truth + rng.normal(0, 3, size=111)
    ordered = solve(noisy, TreeConstraints(nx.DiGraph(states + counties)), method="auto").x
    for order in (counties + states, list(reversed(states + counties)), list(rng.permutation(110))):
        edges = order if isinstance(order[0], tuple) else [(states + counties)[i] for i in order]
        x = solve(noisy, TreeConstraints(nx.DiGraph(edges)), method="auto").x
        np.testing.assert_allclose(x, ordered, atol=1e-9)
    assert np.mean((ordered - truth) ** 2) < 20


def test_non_integer_labels_need_an_explicit_mapping():
    G = nx.DiGraph([("US", "CA"), ("US", "NY")])
    with pytest.raises(SparseDPError, match="variables="):
        TreeConstraints(G)
    fam = TreeConstraints(G, variables={"US": 0, "CA": 1, "NY": 2})
    x = solve(np.array([10.0, 4.0, 5.0]), fam, method="generic").x
    assert x[0] == pytest.approx(x[1] + x[2])
    with pytest.raises(SparseDPError, match="no entry"):
        TreeConstraints(G, variables={"US": 0, "CA": 1})


def test_short_x_error_names_the_length_of_x():
    # issue 20 #6: "variable indices must lie in [0, 110), got [0, 110]" did not say x was short
    G = nx.DiGraph([(0, i) for i in range(1, 111)])
    with pytest.raises(ShapeError, match="x has only 110 values.*at least 111"):
        solve(np.zeros(110), TreeConstraints(G))


def test_infeasible_families_are_named_by_position_and_variables():
    # issue 20 #6: "families ['tree', 'fixed', 'fixed'] conflict" did not say which 'fixed'
    G = nx.DiGraph([(0, 1), (0, 2)])
    fams = [TreeConstraints(G), FixedValues([1], [3.0]), FixedValues([0, 2], [10.0, 4.0])]
    with pytest.raises(InfeasibleConstraintsError) as err:
        solve(np.zeros(3), fams, method="direct")
    msg = str(err.value)
    assert "#1 'fixed' on variables [1]" in msg and "#2 'fixed' on variables [0, 2]" in msg


def test_zero_variance_names_the_family_to_use():
    with pytest.raises(ShapeError, match="FixedValues"):
        solve(np.zeros(3), TreeConstraints(nx.DiGraph([(0, 1), (0, 2)])), variances=[1.0, 0.0, 1.0])
