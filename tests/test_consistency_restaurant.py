import json

import numpy as np
import pytest

from sparsedp import Accountant, BudgetExceededError, InvalidPrivacyParameterError
from sparsedp.cli import main
from sparsedp.consistency import (
    COMBOS,
    restaurant,
    restaurant_constraints,
    restaurant_layout,
    restaurant_release,
    restaurant_sensitivity,
    restaurant_tree_values,
    solve,
)
from sparsedp.noise import laplace_variance


def test_restaurant_data():
    a, b = restaurant(20, seed=3), restaurant(20, seed=3)
    np.testing.assert_array_equal(a.sales, b.sales)
    assert a.sales.shape == (20, 5) and a.orders.shape == (20, 3)
    np.testing.assert_array_equal(a.sales, a.orders @ COMBOS)
    assert np.all(a.orders >= 0) and a.orders.sum() > 0


@pytest.mark.parametrize("days", [1, 5, 8, 13])
def test_sensitivity_brute_force(days):
    """One order (any combo, any day) moves the tree-measurement vector by at most 5h in L1."""
    lay = restaurant_layout(days)
    base = restaurant(days, seed=0).sales
    f0 = restaurant_tree_values(base, lay)
    worst = 0.0
    for t in range(days):
        for c in COMBOS:
            s = base.copy()
            s[t] += c
            worst = max(worst, np.abs(restaurant_tree_values(s, lay) - f0).sum())
    assert worst == restaurant_sensitivity(lay) == 5 * lay.levels


def test_noise_calibration_and_variance():
    rel = restaurant_release(512, epsilon=0.5, seed=1, method="direct")
    h = rel.layout.levels
    assert rel.sensitivity == 5 * h and rel.scale == pytest.approx(5 * h / 0.5)
    z = rel.noisy - rel.truth
    var = rel.variance  # exact discrete Laplace (the default): within 1e-4 of 2 b^2 at this scale
    assert rel.secure and var == pytest.approx(laplace_variance(rel.scale), rel=1e-4)
    # 5 * 1023 samples: the sample variance of Laplace noise has relative sd ~ sqrt(5 / N) ~ 3 %
    assert np.var(z) == pytest.approx(var, rel=0.15)
    assert abs(np.mean(z)) < 4 * np.sqrt(var / z.size)


def test_budget_is_checked_before_noise():
    acc = Accountant(epsilon=1.0)
    restaurant_release(8, epsilon=0.75, seed=1, accountant=acc)
    assert acc.spent == pytest.approx(0.75)
    rng = np.random.default_rng(5)
    state = rng.bit_generator.state
    with pytest.raises(BudgetExceededError):
        restaurant_release(8, epsilon=0.5, seed=rng, accountant=acc)
    assert acc.spent == pytest.approx(0.75)
    with pytest.raises(InvalidPrivacyParameterError):
        restaurant_release(8, epsilon=0.0, seed=rng)
    assert rng.bit_generator.state == state


@pytest.mark.parametrize("days", [7, 16])
def test_release_consistent_with_both_families(days):
    ref = restaurant_release(days, seed=2, method="generic", combos_at="leaves", evaluate=True)
    X = ref.x.reshape(-1, 5)
    A = ref.layout.matrix()
    leaves = X[ref.layout.row_offsets[0]:]
    np.testing.assert_allclose(A @ leaves, X, atol=1e-8)  # tree consistency
    coef = np.linalg.lstsq(COMBOS.T.astype(float), X.T, rcond=None)[0]
    np.testing.assert_allclose(COMBOS.T @ coef, X.T, atol=1e-8)  # combos everywhere
    assert ref.rmse_consistent < ref.rmse_noisy
    for method in ("direct", "alternating", "accelerated", "auto"):
        for where in ("leaves", "nodes"):
            rel = restaurant_release(days, seed=2, method=method, combos_at=where)
            np.testing.assert_allclose(rel.x, ref.x, atol=1e-8)


def test_nodes_formulation_is_exact_in_one_sweep_and_leaves_is_slow():
    fast = restaurant_release(64, seed=4, method="alternating", combos_at="nodes")
    assert fast.result.iterations == 1
    acc = restaurant_release(64, seed=4, method="accelerated", combos_at="leaves", tol=1e-8)
    slow = restaurant_release(64, seed=4, method="alternating", combos_at="leaves", tol=1e-8, max_sweeps=300)
    assert not slow.result.converged and slow.result.residual > 1e-8
    assert acc.result.converged and acc.result.sweeps < 300 / 5
    # the error still to go, estimated from the contraction rate, is larger than the step size
    assert slow.result.error_estimate > slow.result.history["change"][-1]
    gap = np.max(np.abs(slow.x - fast.x))
    assert gap <= 3 * slow.result.error_estimate


def test_weighted_restaurant_all_methods_agree():
    days = 16
    rng = np.random.default_rng(0)
    sales = restaurant(days, seed=1)
    lay = restaurant_layout(days)
    truth = restaurant_tree_values(sales.sales, lay)
    v = rng.uniform(0.5, 3.0, truth.size)
    x = truth + rng.normal(size=truth.size) * np.sqrt(v)
    fams = restaurant_constraints(days, "leaves")
    gen = solve(x, fams, variances=v, method="generic")
    for m in ("direct", "alternating", "accelerated", "auto"):
        np.testing.assert_allclose(solve(x, fams, variances=v, method=m, tol=1e-11).x, gen.x, atol=1e-8)


def test_cli_restaurant(tmp_path, capsys):
    js, out, png = tmp_path / "r.json", tmp_path / "x.npz", tmp_path / "c.png"
    assert main(["restaurant", "--days", "32", "--epsilon", "1", "--method", "accelerated", "--seed", "3",
                 "--combos-at", "leaves", "--json", str(js), "--out", str(out), "--plot", str(png), "--evaluate"]) == 0
    data = json.loads(js.read_text())
    for key in ("private", "days", "variables", "constraints", "method", "seconds", "iterations", "residual",
                "evaluation"):
        assert key in data
    assert data["private"] is False  # seeded noise and evaluation against the truth
    assert data["days"] == 32 and data["variables"] == 5 * 63 and data["constraints"] == 5 * 31 + 2 * 32
    assert data["residual"] <= 1e-8
    assert data["evaluation"]["rmse_consistent"] < data["evaluation"]["rmse_noisy"]
    assert np.load(out)["x"].shape == (5 * 63,)
    assert png.stat().st_size > 1000
    assert "Delta_1 = 5h = 30" in capsys.readouterr().out
    assert 0 <= data["relative_residual"] < 1e-12
    # the default: auto, combos at the leaves, the exact tree x span solve
    assert main(["restaurant", "--days", "40", "--seed", "3", "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    internal = restaurant_layout(40).nodes - 40
    assert data["method"] == "auto:tree-span:separable" and data["constraints"] == 5 * internal + 2 * 40
    assert data["converged"] and data["residual"] <= 1e-10


def test_cli_rejects_bad_input(capsys):
    assert main(["restaurant", "--days", "8", "--epsilon", "-1"]) == 2
    assert "epsilon" in capsys.readouterr().err


@pytest.mark.parametrize("script,needle", [("restaurant_release.py", "max difference"),
                                           ("custom_constraint_family.py", "published")])
def test_examples_run(script, needle):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(root / "examples" / script), *(["64"] if "restaurant" in script else [])],
                         capture_output=True, text=True, env=env, check=True, timeout=120)
    assert needle in out.stdout


def test_docs_page_examples_run():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "consistency.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    ns: dict = {}
    for code in blocks:
        exec(compile(code, "docs/consistency.md", "exec"), ns)
    np.testing.assert_allclose(ns["solve"](np.arange(6.0), ns["EqualHalves"]()).x, [1.5, 2.5, 3.5, 1.5, 2.5, 3.5])
    assert ns["ev"].rmse_consistent < ns["ev"].rmse_noisy and ns["rel"].rmse_noisy is None


def test_rank_one_variances_commute_one_sweep():
    """Variances v_node * w_item: tree and combo projectors commute, one sweep is exact."""
    days = 16
    lay = restaurant_layout(days)
    rng = np.random.default_rng(3)
    v = np.outer(rng.uniform(0.5, 2, lay.nodes), rng.uniform(0.5, 2, 5)).ravel()
    x = restaurant_tree_values(restaurant(days, seed=2).sales, lay) + rng.normal(size=v.size) * np.sqrt(v)
    one = solve(x, restaurant_constraints(days, "nodes"), variances=v, method="alternating")
    assert one.iterations == 1
    ref = solve(x, restaurant_constraints(days, "leaves"), variances=v, method="generic")
    np.testing.assert_allclose(one.x, ref.x, atol=1e-8)
    auto = solve(x, restaurant_constraints(days, "nodes"), variances=v, method="auto")
    assert auto.method == "auto:tree-span:separable"  # v_node * w_item: the scalar two-pass on combo coordinates
    np.testing.assert_allclose(auto.x, ref.x, atol=1e-8)


@pytest.mark.parametrize("weighted", [None, "per-node", "general"])
def test_joint_and_per_item_trees_agree(weighted):
    days = 12
    lay = restaurant_layout(days)
    rng = np.random.default_rng(9)
    x = rng.normal(size=5 * lay.nodes) * 20
    v = {None: None, "per-node": np.repeat(rng.uniform(0.5, 2, lay.nodes), 5),
         "general": rng.uniform(0.5, 2, 5 * lay.nodes)}[weighted]
    joint = solve(x, restaurant_constraints(days, "leaves"), variances=v, method="alternating", max_sweeps=40, tol=1e-12)
    split = solve(x, restaurant_constraints(days, "leaves", per_item=True), variances=v, method="alternating",
                  max_sweeps=40, tol=1e-12)
    np.testing.assert_allclose(joint.x, split.x, atol=1e-10)
    np.testing.assert_allclose(joint.history["residual"], split.history["residual"], rtol=1e-8, atol=1e-12)


def test_bad_sales_are_located_never_shown():
    """A bad day's sales used to be printed (``{'cola': 7, ...}``, the offending value, how many
    such days): the error now names the day and item only."""
    from sparsedp.consistency.restaurant import COMBOS, _orders_of
    from sparsedp.errors import SparseDPError

    good = np.array([[3, 1, 2]]) @ COMBOS  # the sales of 3, 1 and 2 orders of the three combos: a valid day
    table = np.vstack([good, good, good])
    for day, edit, secret in ((1, lambda t: t.__setitem__((1, 2), 4321.5), "4321"),
                              (2, lambda t: t.__setitem__((2, 0), t[2, 0] + 7777), "7777")):
        t = table.astype(np.float64)
        edit(t)
        with pytest.raises(SparseDPError, match=f"day {day}") as info:
            _orders_of(t)
        assert secret not in str(info.value) and "{" not in str(info.value)
