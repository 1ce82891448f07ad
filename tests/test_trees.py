"""sparsedp.trees: builders, coverage, budgets, BLUE and the seed 004 worked examples."""

import importlib.util
import itertools

import networkx as nx
import numpy as np
import pytest
from scipy.optimize import minimize

from sparsedp import UnsupportedStructureError
from sparsedp import strategies as st
from sparsedp.operators import sensitivity
from sparsedp.tree_estimator import tree_gls
from sparsedp.trees import (
    allocate_budget,
    as_interval_tree,
    blue,
    choose_branching,
    coverage_probabilities,
    decompose,
    expected_range_error,
    kary_layout,
    kary_tree,
    optimal_error,
    path_sums,
    sc_layout,
    sc_tree,
    subtree_coverage,
    to_constraints,
    to_graph,
    to_strategy,
    tree_from_splits,
)
from sparsedp.trees.sc import kary_coverage_sum


def random_tree(n, seed):
    """Mixed arity: every interval of length >= 2 is cut at random into 2..4 parts."""
    rng = np.random.default_rng(seed)

    def split(lo, hi):
        m = hi - lo
        k = int(rng.integers(2, min(4, m) + 1))
        cuts = np.sort(rng.choice(np.arange(1, m), size=k - 1, replace=False))
        return np.diff(np.concatenate(([0], cuts, [m]))).tolist()

    return tree_from_splits(n, split)


def flat_star(n):
    G = nx.DiGraph()
    G.add_node(0, interval=(0, n))
    for i in range(n):
        G.add_node(i + 1, interval=(i, i + 1))
        G.add_edge(0, i + 1)
    return G


def brute_coverage(tree):
    """Enumerate all ranges and apply condition 3.4 literally."""
    t = as_interval_tree(tree)
    counts = np.zeros(t.size)
    for a in range(t.n):
        for b in range(a + 1, t.n + 1):
            for x in range(t.size):
                inside = a <= t.lo[x] and t.hi[x] <= b
                f = t.parent[x]
                par_inside = f >= 0 and a <= t.lo[f] and t.hi[f] <= b
                counts[x] += inside and not par_inside
    return counts / (t.n * (t.n + 1) / 2)


# ---------------------------------------------------------------- the chapter's worked numbers


def test_example_3_1_probabilities_n5_binary():
    G = kary_tree(5, 2)
    assert G.nodes[2]["interval"] == (2, 5)  # node 2 = [3, 5] (1-based), as Example 3.4 says
    p = coverage_probabilities(G)
    np.testing.assert_allclose(p, np.array([1, 3, 2, 1, 4, 6, 1, 4, 1]) / 15)
    assert p[5] == pytest.approx(0.4) and p[0] == pytest.approx(0.066667, abs=1e-6)


def test_example_3_2_two_trees_of_size_3():
    # (a) root + 3 leaves (Delta = 2), (b) binary tree (Delta = 3); uniform budget 1 / Delta
    for G, delta, paper in ((flat_star(3), 2, 10.664), (kary_tree(3, 2), 3, 21.006)):
        t = as_interval_tree(G)
        assert t.levels == delta
        err = expected_range_error(G, np.full(t.size, 1.0 / delta), coverage_probabilities(G))
        assert err == pytest.approx(paper, abs=0.01)  # exact 32/3 and 21; the paper rounds p to 3 digits
    star = flat_star(3)
    assert expected_range_error(star, np.full(4, 0.5), coverage_probabilities(star)) == pytest.approx(32 / 3)


def test_example_3_3_ternary_n6():
    G = kary_tree(6, 3)
    x = next(v for v, d in G.nodes(data=True) if d["interval"] == (2, 4))
    assert coverage_probabilities(G)[x] == pytest.approx(8 / 21)


def test_example_3_4_subtree_values():
    assert subtree_coverage(5, 2, 5, 2, parent=(0, 5)) == pytest.approx(0.933333, abs=1e-6)
    assert subtree_coverage(5, 2, 5, 3, parent=(0, 5)) == pytest.approx(1.0)


def test_fig_3_1_and_3_13_allocation():
    G = flat_star(3)
    p = coverage_probabilities(G)
    np.testing.assert_allclose(p, [1 / 6, 1 / 3, 1 / 2, 1 / 3])
    eps = allocate_budget(G, 1.0, p)
    # exact optimum: root (1/7)^(1/3) / (1 + (1/7)^(1/3)) = 0.3433, leaves 0.6567 (paper: 0.33 / 0.67)
    a = (1 / 7) ** (1 / 3)
    np.testing.assert_allclose(eps, [a / (1 + a)] + [1 / (1 + a)] * 3)
    assert expected_range_error(G, np.full(4, 0.5), p) == pytest.approx(10.67, abs=0.005)
    assert expected_range_error(G, [1 / 3, 2 / 3, 2 / 3, 2 / 3], p) == pytest.approx(8.25)  # the paper's 8.25
    best = expected_range_error(G, eps, p)
    assert best == pytest.approx(8.2389, abs=1e-4) and best == pytest.approx(optimal_error(G, 1.0, p))


def test_fig_3_14_arbitrary_tree_beats_binary():
    binary = kary_tree(4, 2)
    pa = coverage_probabilities(binary)
    assert expected_range_error(binary, np.full(7, 1 / 3), pa) == pytest.approx(23.4)
    # (b): root -> [1,1], [2,3], [4,4]; [2,3] -> [2,2], [3,3]
    b = tree_from_splits(4, lambda lo, hi: [1, 2, 1] if hi - lo == 4 else [1, 1])
    pb = coverage_probabilities(b)
    np.testing.assert_allclose(sorted(pb), sorted([0.1, 0.3, 0.3, 0.3, 0.2, 0.2]))
    t = as_interval_tree(b)
    paper_eps = np.where(t.degree > 0, 1 / 3, np.where(t.depth == 1, 2 / 3, 1 / 3))
    np.testing.assert_allclose(path_sums(b, paper_eps), 1.0)
    assert expected_range_error(b, paper_eps, pb) == pytest.approx(17.1)
    # the paper's budgets are feasible but not optimal: CNP + NPBD gives less
    assert expected_range_error(b, allocate_budget(b, 1.0, pb), pb) < 17.1 - 1.0


# ---------------------------------------------------------------- coverage probabilities


@pytest.mark.parametrize("seed", range(6))
def test_coverage_equals_brute_force(seed):
    n = 3 + 2 * seed
    for G in (random_tree(n, seed), kary_tree(n, 2 + seed % 3), sc_tree(n, upper=5)):
        np.testing.assert_allclose(coverage_probabilities(G), brute_coverage(G), atol=1e-12)
        assert coverage_probabilities(G).sum() >= 1.0  # every range uses at least one node


def test_coverage_of_query_lists():
    G = random_tree(11, 3)
    lo, hi = np.triu_indices(11)
    all_ranges = np.column_stack([lo, hi])
    np.testing.assert_allclose(coverage_probabilities(G, all_ranges), coverage_probabilities(G), atol=1e-12)
    # weighted list: only prefixes, weight 2 on the full range
    prefixes = np.column_stack([np.zeros(11, int), np.arange(11)])
    w = np.ones(11)
    w[-1] = 2
    q, node = decompose(G, prefixes[:, 0], prefixes[:, 1] + 1)
    expect = np.bincount(node, weights=w[q], minlength=as_interval_tree(G).size) / w.sum()
    np.testing.assert_allclose(coverage_probabilities(G, prefixes, w), expect)
    assert coverage_probabilities(G, prefixes, w)[0] == pytest.approx(2 / 12)


def test_decomposition_tiles_the_query():
    t = as_interval_tree(random_tree(40, 1))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 40, 300)
    b = rng.integers(0, 40, 300)
    lo, hi = np.minimum(a, b), np.maximum(a, b) + 1
    q, node = decompose(t, lo, hi)
    np.testing.assert_array_equal(np.bincount(q, weights=t.hi[node] - t.lo[node], minlength=300), hi - lo)
    assert np.all((t.lo[node] >= lo[q]) & (t.hi[node] <= hi[q]))
    par = t.parent[node]
    assert not np.any((par >= 0) & (t.lo[par] >= lo[q]) & (t.hi[par] <= hi[q]))


# ---------------------------------------------------------------- budgets and privacy


@pytest.mark.parametrize("seed", range(5))
def test_allocation_paths_sum_to_epsilon_and_sensitivity(seed):
    G = random_tree(25 + seed, seed)
    eps = allocate_budget(G, 0.7, coverage_probabilities(G))
    np.testing.assert_allclose(path_sums(G, eps), 0.7, rtol=1e-12)
    M = to_strategy(G, eps)
    assert sensitivity(M, 1) == pytest.approx(0.7)  # Delta_1 of diag(eps) M = max path sum
    # brute force over neighbours: adding one record to bin j moves node counts by M[:, j]
    t = as_interval_tree(G)
    for j in range(t.n):
        d = ((t.lo <= j) & (j < t.hi)).astype(float)
        assert np.sum(np.abs(d) * eps) <= 0.7 + 1e-12


def test_allocation_is_the_optimum():
    G = random_tree(9, 7)
    t = as_interval_tree(G)
    p = coverage_probabilities(G)
    eps = allocate_budget(G, 1.0, p)
    # independent check: SLSQP on the same problem (3.6)
    leaves_paths = np.array([[(t.lo[x] <= j < t.hi[x]) for x in range(t.size)] for j in range(t.n)], float)
    res = minimize(lambda e: np.sum(p / e**2), np.full(t.size, 1.0 / t.levels), method="SLSQP",
                   constraints=[{"type": "eq", "fun": lambda e: leaves_paths @ e - 1.0}],
                   bounds=[(1e-4, 1.0)] * t.size, options={"ftol": 1e-14, "maxiter": 500})
    assert res.success
    assert expected_range_error(G, eps, p) <= 2 * res.fun * (1 + 1e-6)
    np.testing.assert_allclose(eps, res.x, atol=2e-3)


def test_expected_error_equals_mean_over_all_ranges():
    G = random_tree(12, 2)
    t = as_interval_tree(G)
    eps = allocate_budget(G, 1.0, coverage_probabilities(G))
    lo, hi = np.triu_indices(12)
    q, node = decompose(G, lo, hi + 1)
    per_query = np.bincount(q, weights=2.0 / eps[node] ** 2)  # variance of each range answer
    assert per_query.mean() == pytest.approx(expected_range_error(G, eps, coverage_probabilities(G)))
    assert t.size == eps.size


def test_noise_variance_matches_budget():
    from sparsedp.trees.publishers import LUEDPTree, node_counts

    x = np.random.default_rng(0).integers(0, 50, 16)
    pub = LUEDPTree(0.5, tree="kary", consistency=False, secure=False)  # the float formula 2 / eps^2
    # fit = checks + _prepare (data-independent plan, no noise) + _publish (measure, estimate): the
    # plan is prepared once and the same 3000 releases published through it (the same generator, so
    # the same draws as 3000 fits; the first is checked against fit itself)
    pub.fit(x, rng=np.random.default_rng(1))
    plan = pub._prepare(x)
    np.testing.assert_array_equal(pub._publish(x, plan, np.random.default_rng(1)).node_values, pub.release_.node_values)
    rng = np.random.default_rng(1)
    counts = node_counts(pub.tree_, x.astype(float))
    draws = []
    for _ in range(3000):
        draws.append(pub._publish(x, plan, rng).node_values - counts)
    var = np.var(np.array(draws), axis=0)
    np.testing.assert_allclose(var, 2.0 / pub.eps_per_node_**2, rtol=0.15)


# ---------------------------------------------------------------- BLUE


def dense_projection(tree, y, eps):
    C, b = to_constraints(tree)
    C = C.toarray()
    Dinv = np.diag(1.0 / eps**2)
    return y + Dinv @ C.T @ np.linalg.pinv(C @ Dinv @ C.T) @ (b - C @ y)


@pytest.mark.parametrize("seed", range(8))
def test_blue_equals_weighted_projection(seed):
    G = random_tree(10 + 7 * seed, seed)
    t = as_interval_tree(G)
    rng = np.random.default_rng(seed)
    eps = rng.uniform(0.05, 2.0, t.size)
    y = rng.normal(0, 20, t.size)
    h = blue(G, y, eps)
    np.testing.assert_allclose(h, dense_projection(G, y, eps), atol=1e-8)
    C, _ = to_constraints(G)
    assert np.abs(C @ h).max() < 1e-9


def test_blue_is_unbiased_on_exact_counts_and_matches_level_tree_gls():
    t = kary_layout(27, 3)
    x = np.arange(27.0)
    M = to_strategy(t)
    np.testing.assert_allclose(blue(t, M @ x, np.ones(t.size))[t.leaves], x, atol=1e-9)
    # the foundation's level-structured two-pass GLS gives the same leaves
    Mh = st.hierarchical(27, 3)
    rng = np.random.default_rng(0)
    y_h = Mh.matvec(x) + rng.normal(size=Mh.shape[0])
    v_h = rng.uniform(0.5, 2.0, Mh.shape[0])
    # match rows: hierarchical rows are root-first by level, each level ordered by lo, like ours
    order = np.lexsort((t.lo, t.depth))
    assert np.array_equal(order, np.arange(t.size))
    ours = blue(t, y_h, 1 / np.sqrt(v_h))[t.leaves]
    np.testing.assert_allclose(ours, tree_gls(Mh.meta["layout"], y_h, v_h), atol=1e-9)


@pytest.mark.skipif(importlib.util.find_spec("sparsedp.consistency") is None, reason="sparsedp.consistency not built")
def test_blue_equals_consistency_engine():
    from sparsedp import consistency

    G = random_tree(30, 11)
    t = as_interval_tree(G)
    rng = np.random.default_rng(3)
    eps = rng.uniform(0.1, 2.0, t.size)
    y = rng.normal(0, 10, t.size)
    C, b = to_constraints(G)
    mine = blue(G, y, eps)
    for family in (consistency.LinearConstraints(C, b), consistency.TreeConstraints(G)):
        res = consistency.solve(y, family, variances=1.0 / eps**2)
        assert res.converged
        np.testing.assert_allclose(mine, res.x, atol=1e-8)


# ---------------------------------------------------------------- builders


def test_graph_round_trip_and_validation():
    G = random_tree(17, 5)
    t = as_interval_tree(G)
    H = to_graph(t)
    assert nx.is_isomorphic(G, H) and all(H.nodes[i]["interval"] == G.nodes[i]["interval"] for i in G)
    assert sorted(t.lo[t.leaves]) == list(range(17))
    bad = kary_tree(6, 2)
    bad.nodes[3]["interval"] = (0, 2)
    with pytest.raises(UnsupportedStructureError):
        as_interval_tree(bad)
    with pytest.raises(UnsupportedStructureError):
        as_interval_tree(nx.path_graph(3, create_using=nx.DiGraph))
    C, b = to_constraints(G)
    assert C.shape == (int(np.sum(t.degree > 0)), t.size) and not b.any()


def test_sc_tree_choices():
    for n in (10, 37, 100, 1000):
        for k in (2, 3, 7):
            assert kary_coverage_sum(n, k) == pytest.approx(coverage_probabilities(kary_layout(n, k)).sum())
    n = 300
    k = choose_branching(n, 20)
    cost = [kary_layout(n, w).levels ** 2 * coverage_probabilities(kary_layout(n, w)).sum() for w in range(2, 21)]
    assert k == 2 + int(np.argmin(cost))
    sc = sc_layout(n, k)
    # greedy splits never increase the coverage sum of the k-ary tree (Section 3.3.2)
    assert coverage_probabilities(sc).sum() <= coverage_probabilities(kary_layout(n, k)).sum() + 1e-12
    # leftmost path is k-ary
    assert sc.degree[0] == k
    # each selectively split node chose the w minimising H among [k, 20]
    t = sc_layout(60, 2, 6)
    for x in range(t.size):
        if t.degree[x] and t.lo[x] > 0:
            f = t.parent[x]
            h = [subtree_coverage(60, t.lo[x], t.hi[x], w, (t.lo[f], t.hi[f])) for w in range(2, 7)]
            assert min(t.degree[x], t.hi[x] - t.lo[x]) == min(2 + int(np.argmin(h)), t.hi[x] - t.lo[x])


def test_all_small_trees_have_valid_structure():
    for n, k in itertools.product(range(1, 12), range(2, 5)):
        t = kary_layout(n, k)
        assert t.size == t.lo.size and t.hi[0] == n and np.all(t.hi - t.lo >= 1)
        assert np.all(t.degree[t.hi - t.lo > 1] >= 2)


def paper_pa_blue_crc(t, y, eps):
    """Algorithms 3.6 (PA_BLUE) and 3.7 (CRC) of the seed, transcribed literally (recursive)."""
    e2 = eps**2
    kids = [list(range(t.child_start[x], t.child_start[x + 1])) for x in range(t.size)]
    alpha, beta, c, d, gt = (np.zeros(t.size) for _ in range(5))
    bound = np.zeros(t.size, dtype=int)

    def pa(x):
        if not kids[x]:
            alpha[x], beta[x], c[x], d[x], gt[x], bound[x] = e2[x], 1.0, 0.0, 0.0, e2[x] * y[x], x
            return
        for ch in kids[x]:
            pa(ch)
        w = kids[x][0]  # SonBound(x): the child with L(w) = L(x)
        bound[x] = bound[w]
        gt[x] = gt[w] + e2[x] * y[x]  # g~_x: weighted noisy sum on the path x -> Bound(x)
        beta[x] = sum(beta[ch] * alpha[w] / alpha[ch] for ch in kids[x])
        alpha[x] = alpha[w] + e2[x] * beta[x]
        d[x] = sum(beta[ch] / alpha[ch] * (gt[ch] - gt[w] - c[ch] + c[w]) + d[ch] for ch in kids[x])
        c[x] = c[w] + e2[x] * d[x]

    pa(0)
    hsum = np.zeros(t.size)  # hsum(leaf) = sum over Path(root, leaf) of eps^2 h~
    for x in range(t.size):
        hsum[x] = e2[x] * y[x] + (hsum[t.parent[x]] if x else 0.0)
    out = np.zeros(t.size)

    def crc(x, tot):
        out[x] = beta[x] * (hsum[bound[x]] - tot - c[x]) / alpha[x] + d[x]
        for ch in kids[x]:
            crc(ch, tot + e2[x] * out[x])

    crc(0, 0.0)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_paper_pa_blue_crc_recursions_agree_with_blue(seed):
    t = as_interval_tree(random_tree(12 + 5 * seed, seed + 20))
    rng = np.random.default_rng(seed)
    eps = rng.uniform(0.1, 2.0, t.size)
    y = rng.normal(0, 10, t.size)
    np.testing.assert_allclose(paper_pa_blue_crc(t, y, eps), blue(t, y, eps), atol=1e-8)
