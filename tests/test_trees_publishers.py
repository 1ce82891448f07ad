"""LUE-DPTree and the baselines: interface, privacy checks before noise, accuracy, CLI."""

import numpy as np
import pytest

from sparsedp import Accountant, BudgetExceededError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from sparsedp.cli import main
from sparsedp.operators import sensitivity
from sparsedp.trees import (
    Boost,
    BoostUN,
    Dwork,
    LUEDPTree,
    Privelet,
    as_interval_tree,
    kary_tree,
    path_sums,
    to_strategy,
)
from sparsedp.trees.budget import expected_range_error
from sparsedp.trees.coverage import coverage_probabilities
from sparsedp.trees.publishers import load_release

ALL = [LUEDPTree, Boost, BoostUN, Privelet, Dwork]
X = np.random.default_rng(0).integers(0, 30, 64)


def all_ranges(n):
    lo, hi = np.triu_indices(n)
    return np.column_stack([lo, hi])


@pytest.mark.parametrize("cls", ALL)
def test_interface_and_vectorised_ranges(cls):
    pub = cls(1.0).fit(X, rng=1)
    h = pub.histogram()
    assert h.shape == (64,)
    pairs = np.array([[0, 63], [5, 5], [3, 40], [10, 20]])
    np.testing.assert_allclose(pub.ranges(pairs), [h[a : b + 1].sum() for a, b in pairs])
    assert pub.range(3, 40) == pytest.approx(h[3:41].sum())
    with pytest.raises(ShapeError):
        pub.ranges(np.array([[5, 4]]))
    with pytest.raises(ShapeError):
        pub.range(0, 64)


@pytest.mark.parametrize("cls", ALL)
def test_bad_input_fails_before_noise_and_budget(cls):
    with pytest.raises(InvalidPrivacyParameterError):
        cls(0.0)
    with pytest.raises(InvalidPrivacyParameterError):
        cls(float("nan"))
    acc = Accountant(epsilon=1.5)
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    pub = cls(1.0, accountant=acc)
    for bad in (np.array([1.0, np.nan, 2.0]), np.array([1, -1, 2]), np.ones((2, 2)), np.array([1.5, 2.0])):
        with pytest.raises(SparseDPError):
            pub.fit(bad, rng=rng)
    assert acc.spent == 0 and rng.bit_generator.state == state
    pub.fit(X, rng=rng)
    assert acc.spent == pytest.approx(1.0)
    state = rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        pub.fit(X, rng=rng)
    assert rng.bit_generator.state == state  # nothing drawn


@pytest.mark.parametrize("tree", ["sc", "kary"])
def test_lue_privacy_calibration(tree):
    pub = LUEDPTree(0.3, tree=tree).fit(X, rng=0)
    np.testing.assert_allclose(path_sums(pub.tree_, pub.eps_per_node_), 0.3, rtol=1e-12)
    assert sensitivity(to_strategy(pub.tree_, pub.eps_per_node_), 1) == pytest.approx(0.3)


def test_baseline_calibrations():
    boost = Boost(1.0).fit(X, rng=0)
    assert np.all(boost.eps_per_node_ == pytest.approx(1.0 / boost.tree_.levels))
    un = BoostUN(1.0).fit(X, rng=0)
    assert path_sums(un.tree_, un.eps_per_node_).max() == pytest.approx(1.0)
    for d in range(un.tree_.levels):  # one budget per depth
        assert np.ptp(un.eps_per_node_[un.tree_.level(d)]) < 1e-12
    pv = Privelet(1.0).fit(X, rng=0)
    assert pv.sensitivity_ == 7  # log2(64) + 1


def test_user_graph_and_query_weights():
    G = kary_tree(64, 4)
    pub = LUEDPTree(1.0, tree=G).fit(X, rng=0)
    assert pub.tree_.size == G.number_of_nodes()
    with pytest.raises(ShapeError):
        LUEDPTree(1.0, tree=kary_tree(10, 2)).fit(X, rng=0)
    prefixes = np.column_stack([np.zeros(64, int), np.arange(64)])
    pq = LUEDPTree(1.0, tree="kary", queries=prefixes).fit(X, rng=0)
    p = coverage_probabilities(pq.tree_, prefixes)
    eps_u = LUEDPTree(1.0, tree="kary").fit(X, rng=0).eps_per_node_
    # optimising for prefixes lowers the expected prefix error against the uniform allocation
    assert expected_range_error(pq.tree_, pq.eps_per_node_, p) < expected_range_error(pq.tree_, eps_u, p)


def test_empirical_error_matches_formula_and_blue_helps():
    x = np.random.default_rng(3).integers(0, 100, 40)
    pairs = all_ranges(40)
    truth = np.array([x[a : b + 1].sum() for a, b in pairs])
    raw, fitted = [], []
    # fit = checks + _prepare (data-independent plan, no noise) + _publish: each publisher's plan is
    # prepared once and the same 400 + 400 releases published through it (same generator, same
    # interleaving: the same draws as the fits; checked against fit on a first pair)
    r, b = LUEDPTree(1.0, consistency=False), LUEDPTree(1.0)
    plan_r, plan_b = r._prepare(x), b._prepare(x)
    r.fit(x, rng=np.random.default_rng(7))
    b.fit(x, rng=np.random.default_rng(7))
    np.testing.assert_array_equal(r._publish(x, plan_r, np.random.default_rng(7)).estimate, r.histogram())
    np.testing.assert_array_equal(b._publish(x, plan_b, np.random.default_rng(7)).estimate, b.histogram())
    rng = np.random.default_rng(7)
    for _ in range(400):
        raw.append(np.mean((r._publish(x, plan_r, rng).ranges(pairs) - truth) ** 2))
        fitted.append(np.mean((b._publish(x, plan_b, rng).ranges(pairs) - truth) ** 2))
    expected = expected_range_error(r.tree_, r.eps_per_node_, coverage_probabilities(r.tree_))
    assert np.mean(raw) == pytest.approx(expected, rel=0.1)
    assert np.mean(fitted) < np.mean(raw)


def test_lue_beats_boost_on_average():
    x = np.random.default_rng(4).integers(0, 100, 256)
    pairs = all_ranges(256)[::37]
    truth = np.array([x[a : b + 1].sum() for a, b in pairs])
    err = {}
    for cls in (LUEDPTree, Boost, Dwork):
        rng = np.random.default_rng(11)
        err[cls.name] = np.mean([np.mean((cls(0.5).fit(x, rng=rng).ranges(pairs) - truth) ** 2) for _ in range(60)])
    assert err["lue-dptree"] < 0.5 * err["boost"] and err["lue-dptree"] < err["dwork"]


def test_release_round_trip(tmp_path):
    pubs = (LUEDPTree(1.0), LUEDPTree(1.0, consistency=False), Dwork(1.0))
    for pub in (p.fit(X, rng=0) for p in pubs):
        path = tmp_path / "r.npz"
        pub.release_.save(path, overwrite=True)  # one file, replaced by each publisher
        back = load_release(path)
        pairs = np.array([[0, 63], [7, 9]])
        np.testing.assert_allclose(back.ranges(pairs), pub.ranges(pairs))
        assert back.method == pub.name


def test_cli_histogram_and_query(tmp_path, capsys):
    data = tmp_path / "h.npy"
    np.save(data, X)
    out = tmp_path / "rel.npz"
    for method in ("lue", "boost", "boost-un", "privelet", "dwork"):
        args = ["histogram", str(data), "--epsilon", "1", "--method", method, "--out", str(out), "--seed", "1",
                "--force"]
        assert main(args) == 0
        assert main(["query", str(out), "3", "10"]) == 0
        printed = float(capsys.readouterr().out.strip().splitlines()[-1])
        assert printed == pytest.approx(load_release(out).range(3, 10))
    assert main(["histogram", str(data), "--epsilon", "-1", "--out", str(out)]) == 2
    assert main(["query", str(out), "5", "64"]) == 2
    assert "0 <= lo <= hi < 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    assert "inclusive, 0-based" in capsys.readouterr().out


def test_tree_interval_attributes_in_graph():
    G = kary_tree(8, 2)
    t = as_interval_tree(G)
    assert G.graph["n"] == 8 and G.nodes[0]["interval"] == (0, 8)
    assert all(G.nodes[i]["depth"] == d for i, d in enumerate(t.depth))


def test_example_script_runs():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(root / "examples" / "tree_histogram.py")], capture_output=True,
                         text=True, env=env, check=True, timeout=120).stdout
    assert "spends 0.500000" in out and "refused" in out


def test_node_counts_total_error_names_the_bound_not_the_total():
    """A histogram whose total exceeds 2^50 is refused without printing that total."""
    from sparsedp.errors import InputBoundError
    from sparsedp.trees.publishers import node_counts

    x = np.array([2.0**49, 2.0**49, 12345.0, 0.0])
    with pytest.raises(InputBoundError, match="2\\^50") as info:
        node_counts(kary_tree(4, 2), x)
    msg = str(info.value)
    assert "1.1259" not in msg and str(2**50 + 12345) not in msg and str(2**50)[:10] not in msg
