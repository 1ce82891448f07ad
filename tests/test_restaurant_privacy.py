"""Privacy of the restaurant release (issue 19 #4, #8): the data are validated before the charge,
the sensitivity is the measured matrix's, and the CLI's noise is not reproducible by default."""

import importlib
import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import Accountant, InputBoundError, SparseDPError
from sparsedp.audit import audit, plan_release
from sparsedp.cli import main
from sparsedp.consistency import (
    COMBOS,
    RestaurantSales,
    check_sales,
    restaurant,
    restaurant_layout,
    restaurant_release,
    restaurant_sensitivity,
)
from sparsedp.consistency import cli as rcli_mod
from sparsedp.consistency.restaurant import restaurant_plan, restaurant_rows
from sparsedp.measure import plan_measurement
from sparsedp.release_file import load_release_file

restaurant_mod = importlib.import_module("sparsedp.consistency.restaurant")  # the attribute is the function


def sales_with(orders=None, sales=None, days=8):
    base = restaurant(days, seed=1)
    o = base.orders if orders is None else orders
    s = base.sales if sales is None else sales
    return RestaurantSales(orders=o, sales=s)


def bad_sales():
    base = restaurant(8, seed=1)
    s = base.sales.astype(float)
    s[2, 1] = np.nan
    yield "nan sales", RestaurantSales(base.orders, s), SparseDPError
    yield "short sales", RestaurantSales(base.orders, base.sales[:-1]), SparseDPError
    yield "sales columns", RestaurantSales(base.orders, base.sales[:, :4]), SparseDPError
    yield "orders columns", RestaurantSales(base.orders[:, :2], base.sales), SparseDPError
    yield "1-d", RestaurantSales(base.orders.ravel(), base.sales.ravel()), SparseDPError
    o = base.orders.copy()
    o[0, 0] = -1
    yield "negative orders", RestaurantSales(o, o @ COMBOS), SparseDPError
    o = base.orders.astype(float)
    o[0, 0] += 0.5
    yield "fractional orders", RestaurantSales(o, o @ COMBOS), SparseDPError
    s = base.sales.copy()
    s[3, 0] += 1  # one cola sold outside any combo: sales != orders @ COMBOS
    yield "inconsistent", RestaurantSales(base.orders, s), SparseDPError
    s = base.sales.astype(float)
    s[3, 0] = 1e308
    yield "huge sales", RestaurantSales(base.orders, s), SparseDPError
    o = base.orders.astype(float)
    o[0, 0] = 1e308
    yield "huge orders", RestaurantSales(o, base.sales), InputBoundError
    o = np.full((8, 3), 2**48, dtype=np.int64)  # each order count fine, the tree's root sums 2^51 * 5
    yield "root above 2^50", RestaurantSales(o, o @ COMBOS), InputBoundError
    yield "not sales", base.sales, SparseDPError


@pytest.mark.parametrize("name,sales,error", list(bad_sales()), ids=[n for n, _, _ in bad_sales()])
def test_bad_sales_are_refused_before_the_charge(name, sales, error):
    acc = Accountant(epsilon=1.0)
    rng = np.random.default_rng(3)
    state = rng.bit_generator.state
    with pytest.raises(error):
        restaurant_release(sales=sales, epsilon=0.5, seed=rng, accountant=acc)
    assert acc.spent_exact == 0 and rng.bit_generator.state == state


@pytest.mark.parametrize("kwargs", [
    {"epsilon": "1"}, {"epsilon": True}, {"epsilon": 1e300}, {"epsilon": float("inf")},
    {"method": "magic"}, {"tol": float("nan")}, {"max_sweeps": 0}, {"executor": "cloud"},
    {"combos_at": "roots"}, {"days": 9}, {"seed": "x"},
])
def test_bad_parameters_fail_before_the_charge(kwargs):
    acc = Accountant(epsilon=1e307)  # room for epsilon = 1e300: check_epsilon, not the budget, refuses it
    args = {"sales": restaurant(8, seed=1), "epsilon": 0.5, **kwargs}
    with pytest.raises(SparseDPError):
        restaurant_release(accountant=acc, **args)
    assert acc.spent_exact == 0


def test_generic_too_large_fails_before_the_charge():
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="generic"):
        restaurant_release(1024, epsilon=0.5, method="generic", accountant=acc)
    assert acc.spent_exact == 0
    restaurant_release(16, epsilon=0.5, method="generic", accountant=acc)  # small enough: runs
    assert acc.spent_exact == Fraction(0.5)


def test_valid_sales_are_measured_from_the_orders():
    data = restaurant(13, seed=2)
    acc = Accountant(epsilon=1.0)
    rel = restaurant_release(sales=data, epsilon=0.5, seed=0, accountant=acc)
    assert acc.spent_exact == Fraction(0.5)
    A = restaurant_layout(13).matrix()
    np.testing.assert_array_equal(rel.truth, (A @ (data.orders @ COMBOS)).ravel())
    # float-typed but integral data are accepted
    same = RestaurantSales(data.orders.astype(float), data.sales.astype(float))
    np.testing.assert_array_equal(restaurant_release(sales=same, epsilon=0.5, seed=0).x, rel.x)
    # days agreeing with the data is fine
    restaurant_release(13, sales=data, epsilon=0.5, seed=0)


def measured_matrix(days: int) -> sp.csr_matrix:
    """The explicit matrix orders -> node-major tree values: M[(u, i), (t, k)] = A[u, t] COMBOS[k, i]."""
    A = restaurant_layout(days).matrix()
    A = A.tosparse() if hasattr(A, "tosparse") else sp.csr_matrix(A)
    return sp.csr_matrix(sp.kron(A, COMBOS.T))


@pytest.mark.parametrize("days", [1, 2, 3, 5, 7, 8, 13, 16, 21, 33])
def test_sensitivity_equals_the_measured_matrix_column_norm(days):
    """Delta_1 = max over (day, combo) of the exact column L1 norm of the orders -> node values map,
    and that map is what the release measures."""
    M = measured_matrix(days).tocsc()
    norms = [sum((Fraction(abs(float(v))) for v in M.data[M.indptr[j] : M.indptr[j + 1]]), Fraction(0))
             for j in range(M.shape[1])]
    assert Fraction(restaurant_sensitivity(restaurant_layout(days))) == max(norms)
    data = restaurant(days, seed=5)
    rel = restaurant_release(sales=data, epsilon=1.0, seed=0)
    np.testing.assert_array_equal(rel.truth, M @ data.orders.ravel())
    assert Fraction(rel.sensitivity) / Fraction(rel.scale) <= Fraction(1.0)


def test_without_evaluation_nothing_is_compared_with_the_truth():
    rel = restaurant_release(16, epsilon=1.0, seed=0, evaluate=False)
    assert rel.rmse_noisy is None and rel.rmse_consistent is None
    assert np.all(np.isnan(rel.result.history["err"]))


# --------------------------------------------------------------------------------------------------
# (issue 19 #8) the CLI
# --------------------------------------------------------------------------------------------------


def run_cli(tmp_path, name, *extra):
    js, out = tmp_path / f"{name}.json", tmp_path / f"{name}.npz"
    assert main(["restaurant", "--days", "16", "--json", str(js), "--out", str(out), *extra]) == 0
    return json.loads(js.read_text()), np.load(out)["x"]


def test_cli_default_noise_is_fresh_and_json_has_no_truth(tmp_path, capsys):
    a, xa = run_cli(tmp_path, "a")
    b, xb = run_cli(tmp_path, "b")
    assert not np.array_equal(xa, xb)
    for data in (a, b):
        assert data["private"] is True and data["noise_seed"] is None
        assert not any("rmse" in key or "truth" in key or "evaluation" in key for key in data)
    captured = capsys.readouterr()
    assert "RMSE" not in captured.out and "not private" not in captured.err.lower()


def test_cli_seeded_noise_is_reproducible_and_marked_not_private(tmp_path, capsys):
    a, xa = run_cli(tmp_path, "a", "--seed", "5")
    _, xb = run_cli(tmp_path, "b", "--seed", "5")
    np.testing.assert_array_equal(xa, xb)
    assert a["private"] is False and a["noise_seed"] == 5
    assert "not private" in capsys.readouterr().err.lower()
    c, xc = run_cli(tmp_path, "c", "--seed", "5", "--data-seed", "1")
    assert c["data_seed"] == 1 and not np.array_equal(xa, xc)


def test_cli_evaluation_mode(tmp_path, capsys):
    png = tmp_path / "c.png"
    data, _ = run_cli(tmp_path, "e", "--evaluate", "--plot", str(png))
    assert data["private"] is False
    assert data["evaluation"]["rmse_consistent"] < data["evaluation"]["rmse_noisy"]
    assert png.stat().st_size > 1000
    captured = capsys.readouterr()
    assert "RMSE" in captured.out and "not private" in captured.err.lower()


def test_cli_plot_without_evaluation_has_no_truth_panel(tmp_path, monkeypatch):
    from sparsedp.consistency import cli as rcli

    panels = []
    real = rcli._plot

    def spy(history, path, method, evaluate):
        panels.append(evaluate)
        return real(history, path, method, evaluate)

    monkeypatch.setattr(rcli, "_plot", spy)
    png = tmp_path / "p.png"
    assert main(["restaurant", "--days", "16", "--plot", str(png)]) == 0
    assert panels == [False] and png.stat().st_size > 1000


# --------------------------------------------------------------------------------------------------
# (issue 13) the one measurement path: item sales per tree node, unit = 5, exact noise by default
# --------------------------------------------------------------------------------------------------

NOISE_CALL = re.compile(r"laplace\(|gaussian\(|discrete_laplace|discrete_gaussian|noise\.noise|_noise\.noise")


def test_issue13_no_noise_sampler_is_called_in_the_restaurant():
    for mod in (restaurant_mod, rcli_mod):
        text = Path(mod.__file__).read_text()
        assert [line for line in text.splitlines() if NOISE_CALL.search(line)] == []
    assert "plan_measurement" in Path(restaurant_mod.__file__).read_text()


@pytest.mark.parametrize("days", [1, 2, 3, 5, 8, 13])
def test_issue13_measured_rows_and_sensitivity_against_the_explicit_kron(days):
    """The plan measures the item sales with IntervalRows == (A (x) I_5) up to its column order;
    on the orders that is A (x) COMBOS^T, whose exact Delta_1 is the plan's (unit 5 x coverage h)."""
    lay = restaurant_layout(days)
    rows = restaurant_rows(lay)
    j = np.arange(5 * days)  # item-major column j = i T + t is day-major column 5 t + i
    Q = sp.csr_matrix((np.ones(5 * days), ((j % days) * 5 + j // days, j)))
    np.testing.assert_array_equal(rows.tosparse().toarray(), (sp.kron(lay.matrix(), sp.identity(5)) @ Q).toarray())
    plan = restaurant_plan(lay, 1.0)
    M = measured_matrix(days).tocsc()
    exact = max(sum((Fraction(abs(float(v))) for v in M.data[M.indptr[j]:M.indptr[j + 1]]), Fraction(0))
                for j in range(M.shape[1]))
    assert Fraction(plan.sensitivity) == exact == Fraction(restaurant_sensitivity(lay)) == 5 * lay.levels
    assert plan.cost.epsilon == 1.0 and Fraction(float(plan.scales[0])) >= exact
    data = restaurant(days, seed=2)
    np.testing.assert_array_equal(rows.matvec(data.sales.T.ravel()), M @ data.orders.ravel())


def test_issue13_release_is_the_plan_measurement():
    data = restaurant(8, seed=3)
    rel = restaurant_release(sales=data, epsilon=0.5, seed=11, evaluate=False)
    plan = restaurant_plan(restaurant_layout(8), 0.5)
    np.testing.assert_array_equal(rel.noisy, plan.measure(data.sales.T.ravel(), rng=np.random.default_rng(11)).y)


def test_issue13_default_is_exact_noise_and_float_is_an_opt_out():
    acc = Accountant(epsilon=2.0)
    rel = restaurant_release(16, epsilon=0.5, accountant=acc, evaluate=False)
    assert rel.secure and rel.private and np.array_equal(rel.noisy, np.round(rel.noisy))
    (entry,) = acc.ledger
    assert entry.secure and entry.private and entry.cost.epsilon == 0.5 and entry.sensitivity == 5 * 5
    assert entry.rows == rel.noisy.size == 5 * rel.layout.nodes and entry.columns == 5 * 16 and rel.ledger == entry
    flt = restaurant_release(16, epsilon=0.5, accountant=acc, seed=1, secure=False, evaluate=False)
    assert not flt.secure and not flt.private and not np.array_equal(flt.noisy, np.round(flt.noisy))
    assert acc.ledger[1].secure is False and acc.ledger[1].private is False


def test_issue13_exact_noise_variance_matches_the_measurement():
    lay = restaurant_layout(4)  # 3 levels: Delta_1 = 15; epsilon 30 gives scale 0.5
    data = restaurant(4, seed=4)
    rel = restaurant_release(sales=data, epsilon=30.0, seed=0, evaluate=False)
    assert rel.scale == 0.5
    plan = restaurant_plan(lay, 30.0)
    rng = np.random.default_rng(5)
    items = data.sales.T.ravel()
    z = np.concatenate([plan.measure(items, rng=rng).y - rel.truth for _ in range(300)])
    assert np.mean(z**2) == pytest.approx(rel.variance, rel=0.1)
    assert rel.variance < 0.8 * 2 * rel.scale**2  # the exact discrete variance, not 2 b^2


@pytest.mark.parametrize("name,sales,error", list(bad_sales()), ids=[n for n, _, _ in bad_sales()])
def test_issue13_bad_sales_record_nothing_in_the_ledger(name, sales, error):
    acc = Accountant(epsilon=1.0)
    with pytest.raises(error):
        restaurant_release(sales=sales, epsilon=0.5, seed=0, accountant=acc)
    assert acc.ledger == ()


@pytest.mark.parametrize("kwargs", [{"epsilon": 0.0}, {"epsilon": 2.0}, {"secure": "yes"}, {"seed": "x"},
                                    {"method": "magic"}, {"tol": 0.0}])
def test_issue13_bad_parameters_record_nothing_in_the_ledger(kwargs):
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError):
        restaurant_release(**{"days": 8, "epsilon": 0.5, "accountant": acc, **kwargs})
    assert acc.ledger == ()


def _restaurant_audit_setup():
    one = RestaurantSales(np.array([[3, 2, 1]]), np.array([[3, 2, 1]]) @ COMBOS)
    more = RestaurantSales(np.array([[3, 3, 1]]), np.array([[3, 3, 1]]) @ COMBOS)  # one more combo 1
    plan = restaurant_plan(restaurant_layout(1), 1.0)
    x0, x1 = check_sales(one).sales.T.ravel(), check_sales(more).sales.T.ravel()
    d = (x1 - x0).astype(float)  # (0, 2, 2, 1, 0): L1 norm 5 (the plan's unit)
    touched = np.flatnonzero(d)
    # orthant event {y_i >= x0_i + d_i on every touched item}: probability ratio e^loss
    # vectorised over trials: (k, rows) -> (k, 1), for audit.plan_release
    return plan, x0, x1, lambda Y: np.min(Y[:, touched] - x0[touched] - d[touched], axis=1)[:, None]


def test_issue13_audit_restaurant():
    plan, x0, x1, stat = _restaurant_audit_setup()
    # batched: the plan's own measure on a block-diagonal copy draws many trials per call
    good = audit(plan_release(plan, stat), x0, x1, trials=2000, rng=1, batched=True)
    assert good.epsilon_lower <= 1.0


def test_issue13_audit_detects_a_broken_copy_with_halved_scales():
    plan, x0, x1, stat = _restaurant_audit_setup()
    broken = plan_measurement(plan.strategy, scales=plan.scales / 2)  # as if Delta_1 were 5h / 2
    # batched as above, 2000 trials: the broken copy's bound was 1.43-1.57 over audit seeds 1-6 (the
    # valid plan's 0.46-0.71)
    bad = audit(plan_release(broken, stat), x0, x1, trials=2000, rng=1, batched=True)
    assert bad.epsilon_lower > 1.0, bad


def test_issue13_cli_defaults_to_exact_noise(tmp_path, capsys):
    data, _ = run_cli(tmp_path, "d")
    assert data["secure"] is True and data["private"] is True and data["noise"] == "exact discrete Laplace"
    assert "exact discrete Laplace" in capsys.readouterr().out
    data, _ = run_cli(tmp_path, "f", "--float-noise")
    assert data["secure"] is False and data["private"] is True
    d, f = load_release_file(tmp_path / "d.npz"), load_release_file(tmp_path / "f.npz")
    assert d.kind == "restaurant" and d.description["secure"] is True and f.description["secure"] is False
    assert d.private and d.ledger[0]["secure"] is True and f.ledger[0]["secure"] is False
    assert d.ledger[0]["label"] == "restaurant(16 days)" and d.epsilon == 1.0
    assert main(["ledger", str(tmp_path / "d.npz")]) == 0
    assert "exact laplace" in capsys.readouterr().out
