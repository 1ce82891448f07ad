"""Privacy of the traffic-flow release (issue 19 #2, #4, #8): the release enforces the trip bound it
calibrates for, validates before it charges, and the CLI's noise is not reproducible by default."""

import json
import re
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from sparsedp import Accountant, SparseDPError, flows
from sparsedp.validation import budget_fraction
from sparsedp.audit import audit
from sparsedp.cli import main
from sparsedp.flows import Trips, flow_counts, random_trips, release_flows, road_grid
from sparsedp.flows import release as release_mod
from sparsedp.measure import plan_measurement
from sparsedp.release_file import load_release_file


def drop(trips: Trips, i: int) -> Trips:
    """The neighbouring trip set without trip ``i`` (same claimed ``max_edges``)."""
    keep = np.delete(np.arange(trips.count), i)
    lens = np.diff(trips.edge_ptr)[keep]
    ids = np.concatenate([trips.edge_ids[trips.edge_ptr[j] : trips.edge_ptr[j + 1]] for j in keep] or [np.empty(0, np.int64)])
    ptr = np.concatenate(([0], np.cumsum(lens)))
    return Trips(trips.origins[keep], trips.ends[keep], ptr, ids.astype(np.int64), trips.max_edges)


def relabel(trips: Trips, max_edges) -> Trips:
    """The same trips with a different (possibly false) claimed ``max_edges``."""
    return Trips(trips.origins, trips.ends, trips.edge_ptr, trips.edge_ids, max_edges)


def exact_loss(diff: np.ndarray, scales: np.ndarray) -> Fraction:
    """``sum_i |diff_i| / b_i`` in exact arithmetic."""
    return sum((Fraction(abs(float(d))) / Fraction(float(b)) for d, b in zip(diff, scales) if d != 0), Fraction(0))


def independent_contribution(road, trips: Trips, i: int, L: int, fixed: bool) -> np.ndarray:
    """Trip ``i``'s contribution to ``[f, s, t]`` (``[f]`` with fixed end points) after truncation to
    its first ``L`` edges, computed here without the library."""
    E, V = road.edges, road.nodes
    e = trips.edge_ids[trips.edge_ptr[i] : trips.edge_ptr[i + 1]][:L]
    c = np.zeros(E if fixed else E + 2 * V)
    for edge in e:
        c[edge] += 1
    if not fixed:
        c[E + trips.origins[i]] += 1
        c[E + V + (road.heads[e[-1]] if e.size else trips.origins[i])] += 1
    return c


def untruncated_trips():
    road = road_grid(4, 4, seed=0)
    return road, random_trips(road, 30, seed=1, max_edges=None)


# --------------------------------------------------------------------------------------------------
# (issue 19 #2) a lying max_edges
# --------------------------------------------------------------------------------------------------


def test_lying_max_edges_costs_no_more_than_charged():
    """The issue's reproduction: trips of up to 6 edges claiming max_edges=1.  Removing one trip must
    move the measured counts by at most epsilon in the Laplace loss sum_i |d_i| / b_i."""
    road, trips = untruncated_trips()
    assert trips.lengths().max() == 6
    liar = relabel(trips, 1)
    acc = Accountant(epsilon=1.0)
    rel = release_flows(road, liar, epsilon=1.0, rng=0, accountant=acc, keep_truth=True)
    worst = Fraction(0)
    for i in range(liar.count):
        other = release_flows(road, drop(liar, i), epsilon=1.0, rng=0, keep_truth=True)
        worst = max(worst, exact_loss(rel.truth - other.truth, np.broadcast_to(rel.scale, rel.truth.shape)))
    assert worst <= acc.spent_exact == Fraction(1.0)
    assert worst == 1  # truncation to 1 edge: sensitivity 3, scale 3, a long trip moves 3 counts


def test_explicit_bound_truncates_every_trip():
    road, trips = untruncated_trips()
    rel = release_flows(road, trips, epsilon=1.0, rng=0, max_edges=2, keep_truth=True)
    assert rel.max_edges == 2 and rel.sensitivity == 4
    want = sum(independent_contribution(road, trips, i, 2, False) for i in range(trips.count))
    np.testing.assert_array_equal(rel.truth, want)
    fixed = release_flows(road, trips, epsilon=1.0, rng=0, max_edges=2, keep_truth=True, fixed_endpoints=True)
    assert fixed.sensitivity == 2
    want = sum(independent_contribution(road, trips, i, 2, True) for i in range(trips.count))
    np.testing.assert_array_equal(fixed.truth, want)


def test_untruncated_trips_without_a_bound_are_refused():
    road, trips = untruncated_trips()
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="max_edges"):
        release_flows(road, trips, epsilon=1.0, accountant=acc)
    assert acc.spent_exact == 0


def test_truncate_and_contributions_match_the_counts():
    road, trips = untruncated_trips()
    cut = flows.truncate_trips(road, trips, 3)
    assert cut.max_edges == 3 and cut.lengths().max() == 3
    C = flows.trip_contributions(road, cut)
    assert C.shape == (trips.count, road.edges + 2 * road.nodes)
    np.testing.assert_array_equal(np.asarray(C.sum(axis=0)).ravel(), flow_counts(road, cut))
    for i in range(trips.count):
        np.testing.assert_array_equal(C[i].toarray().ravel(), independent_contribution(road, trips, i, 3, False))
    # a truncated trip ends where it was cut, so the counts still satisfy flow conservation
    x = flow_counts(road, cut)
    E, V = road.edges, road.nodes
    inflow = np.bincount(road.heads, weights=x[:E], minlength=V)
    outflow = np.bincount(road.tails, weights=x[:E], minlength=V)
    np.testing.assert_array_equal(inflow + x[E : E + V], outflow + x[E + V :])


@settings(max_examples=25, deadline=None)
@given(
    rows=hst.integers(2, 4),
    cols=hst.integers(2, 4),
    k=hst.integers(1, 12),
    seed=hst.integers(0, 10_000),
    claimed=hst.one_of(hst.none(), hst.integers(1, 8)),
    bound=hst.one_of(hst.none(), hst.integers(1, 8)),
    fixed=hst.booleans(),
    eps=hst.sampled_from([0.1, 0.3, 1.0, 2.5]),
)
def test_property_charged_epsilon_covers_every_trip(rows, cols, k, seed, claimed, bound, fixed, eps):
    """For random trip sets whose claimed max_edges may lie: epsilon charged >= the exact loss of
    every trip's contribution to the measured counts, sum_i |c_i| / b_i (Fraction arithmetic); the
    contributions computed independently, and also as truth differences of neighbouring releases."""
    road = road_grid(rows, cols, seed=seed)
    trips = relabel(random_trips(road, k, seed=seed + 1, max_edges=None), claimed)
    if claimed is None and bound is None:
        with pytest.raises(SparseDPError):
            release_flows(road, trips, epsilon=eps, rng=0)
        return
    acc = Accountant(epsilon=10.0)
    rel = release_flows(road, trips, epsilon=eps, rng=0, max_edges=bound, fixed_endpoints=fixed,
                        accountant=acc, keep_truth=True)
    L = bound if bound is not None else claimed
    assert rel.max_edges == L
    scales = rel.scales
    assert scales.shape == rel.noisy.shape
    charged = acc.spent_exact
    assert charged == budget_fraction(eps)  # epsilon as written (0.1 is 1/10)
    contributions = [independent_contribution(road, trips, i, L, fixed) for i in range(trips.count)]
    np.testing.assert_array_equal(sum(contributions), rel.truth)  # what was measured
    worst = max(exact_loss(c, scales) for c in contributions)
    assert worst <= charged
    i = seed % trips.count
    other = release_flows(road, drop(trips, i), epsilon=eps, rng=0, max_edges=bound, fixed_endpoints=fixed,
                          keep_truth=True)
    assert exact_loss(rel.truth - other.truth, scales) <= charged
    # worst case over all trips of <= L edges: L + 2 (L) counts; the calibration is not looser
    assert rel.sensitivity == (L if fixed else L + 2)


# --------------------------------------------------------------------------------------------------
# (issue 19 #2, #4) invalid trips, parameters and magnitudes fail before the charge
# --------------------------------------------------------------------------------------------------


def bad_trip_sets():
    road = road_grid(4, 4, seed=0)
    t = random_trips(road, 10, seed=1, max_edges=4)
    E, V = road.edges, road.nodes
    ids = t.edge_ids.copy()
    ids[0] = E  # no such edge
    yield "edge id", Trips(t.origins, t.ends, t.edge_ptr, ids, 4)
    ids = t.edge_ids.copy()
    ids[0] = -1
    yield "negative edge id", Trips(t.origins, t.ends, t.edge_ptr, ids, 4)
    o = t.origins.copy()
    o[0] = V
    yield "origin", Trips(o, t.ends, t.edge_ptr, t.edge_ids, 4)
    e = t.ends.astype(float)
    e[0] = 1e308
    yield "huge end", Trips(t.origins, e, t.edge_ptr, t.edge_ids, 4)
    e = t.ends.astype(float)
    e[0] = np.nan
    yield "nan end", Trips(t.origins, e, t.edge_ptr, t.edge_ids, 4)
    ptr = t.edge_ptr.copy()
    ptr[-1] += 1
    yield "edge_ptr", Trips(t.origins, t.ends, ptr, t.edge_ids, 4)
    yield "lengths", Trips(t.origins[:-1], t.ends, t.edge_ptr, t.edge_ids, 4)
    i = int(np.flatnonzero(t.lengths() >= 2)[0])
    ids = t.edge_ids.copy()
    ids[t.edge_ptr[i]], ids[t.edge_ptr[i] + 1] = ids[t.edge_ptr[i] + 1], ids[t.edge_ptr[i]]
    yield "not a walk", Trips(t.origins, t.ends, t.edge_ptr, ids, 4)
    e = t.ends.copy()
    e[i] = t.origins[i]
    yield "wrong end", Trips(t.origins, e, t.edge_ptr, t.edge_ids, 4)


@pytest.mark.parametrize("name,trips", list(bad_trip_sets()), ids=[n for n, _ in bad_trip_sets()])
def test_invalid_trips_are_refused_before_the_charge(name, trips):
    road = road_grid(4, 4, seed=0)
    acc = Accountant(epsilon=1.0)
    rng = np.random.default_rng(4)
    state = rng.bit_generator.state
    with pytest.raises(SparseDPError):
        release_flows(road, trips, epsilon=1.0, rng=rng, accountant=acc)
    assert acc.spent_exact == 0 and rng.bit_generator.state == state


@pytest.mark.parametrize("kwargs", [
    {"epsilon": "1"}, {"epsilon": True}, {"epsilon": 1e300}, {"epsilon": float("nan")}, {"epsilon": 0},
    {"max_edges": 0}, {"max_edges": 2.5}, {"max_edges": True}, {"max_edges": 1e308}, {"max_edges": "3"},
    {"method": "magic"}, {"tol": float("nan")}, {"tol": 0}, {"rng": "seed"},
    {"method": "generic", "max_edges": 3},  # fine: small system, must not raise (checked below)
])
def test_bad_parameters_fail_before_the_charge(kwargs):
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 10, seed=1, max_edges=4)
    acc = Accountant(epsilon=1e307)  # room for epsilon = 1e300: check_epsilon, not the budget, refuses it
    args = {"epsilon": 0.5, **kwargs}
    if kwargs.get("method") == "generic":
        release_flows(road, trips, accountant=acc, **args)
        assert acc.spent_exact == Fraction(0.5)
        return
    with pytest.raises(SparseDPError):
        release_flows(road, trips, accountant=acc, **args)
    assert acc.spent_exact == 0


def test_generic_too_large_fails_before_the_charge():
    road = road_grid(30, 30, seed=0)
    trips = random_trips(road, 20, seed=1, max_edges=4)
    acc = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="generic"):
        release_flows(road, trips, epsilon=1.0, method="generic", accountant=acc)
    assert acc.spent_exact == 0


def test_projection_failure_after_the_draw_falls_back_to_direct(monkeypatch):
    """Once noise is drawn the release must not fail: an iterative solver that gives up is replaced."""
    from sparsedp.flows import release as module

    real = module.project

    def flaky(x, system, variances=None, method="auto", tol=1e-8):
        if method == "cg":
            raise SparseDPError("CG + Jacobi did not reach tol")
        return real(x, system, variances, method=method, tol=tol)

    monkeypatch.setattr(module, "project", flaky)
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 10, seed=1, max_edges=4)
    acc = Accountant(epsilon=1.0)
    rel = release_flows(road, trips, epsilon=0.5, method="cg", accountant=acc)
    assert rel.solve.method == "direct" and "cg failed" in rel.solve.reason
    assert rel.solve.residual <= 1e-8 and acc.spent_exact == Fraction(0.5)


def test_scale_is_rounded_up():
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 10, seed=1, max_edges=4)
    rel = release_flows(road, trips, epsilon=0.3, rng=0)
    assert Fraction(rel.sensitivity) / Fraction(rel.scale) <= Fraction(0.3)


# --------------------------------------------------------------------------------------------------
# (issue 19 #8) the CLI: OS-entropy noise by default, truth only in evaluation mode
# --------------------------------------------------------------------------------------------------

CLI = ["flows", "--grid", "8", "8", "--trips", "200", "--max-trip-edges", "5"]


def run_cli(tmp_path, name, *extra):
    js, out = tmp_path / f"{name}.json", tmp_path / f"{name}.npz"
    assert main([*CLI, "--json", str(js), "--out", str(out), *extra]) == 0
    return json.loads(js.read_text()), np.load(out)["x"]


def test_cli_default_noise_is_fresh_and_json_has_no_truth(tmp_path, capsys):
    a, xa = run_cli(tmp_path, "a")
    b, xb = run_cli(tmp_path, "b")
    assert not np.array_equal(xa, xb)
    for data in (a, b):
        assert data["private"] is True
        assert not any("rmse" in key or "truth" in key for key in data)
    captured = capsys.readouterr()
    assert "RMSE" not in captured.out and "not private" not in captured.err.lower()


def test_cli_seeded_noise_is_reproducible_and_marked_not_private(tmp_path, capsys):
    a, xa = run_cli(tmp_path, "a", "--seed", "5")
    _, xb = run_cli(tmp_path, "b", "--seed", "5")
    np.testing.assert_array_equal(xa, xb)
    assert a["private"] is False and a["noise_seed"] == 5
    assert "not private" in capsys.readouterr().err.lower()


def test_cli_evaluation_mode_reports_rmse_and_is_not_private(tmp_path, capsys):
    data, _ = run_cli(tmp_path, "e", "--evaluate")
    assert data["private"] is False
    assert data["evaluation"]["rmse_consistent"] < data["evaluation"]["rmse_noisy"]
    captured = capsys.readouterr()
    assert "RMSE" in captured.out and "not private" in captured.err.lower()


def test_cli_data_seed_changes_the_city_not_the_privacy(tmp_path):
    a, _ = run_cli(tmp_path, "a", "--data-seed", "1")
    assert a["private"] is True and a["data_seed"] == 1


# --------------------------------------------------------------------------------------------------
# (issue 13) the one measurement path: identity strategy, unit = L + 2, exact noise by default
# --------------------------------------------------------------------------------------------------

NOISE_CALL = re.compile(r"laplace\(|gaussian\(|discrete_laplace|discrete_gaussian|noise\.noise|_noise\.noise")


def test_issue13_no_noise_sampler_is_called_in_flows():
    root = Path(flows.__file__).parent
    hits = [f"{f.name}:{i}" for f in sorted(root.glob("*.py"))
            for i, line in enumerate(f.read_text().splitlines(), 1) if NOISE_CALL.search(line)]
    assert hits == []


def duplicate(trips: Trips, i: int) -> Trips:
    """The neighbouring trip set with one more trip: a copy of trip ``i``."""
    a, b = trips.edge_ptr[i], trips.edge_ptr[i + 1]
    ids = np.concatenate([trips.edge_ids, trips.edge_ids[a:b]])
    ptr = np.append(trips.edge_ptr, trips.edge_ptr[-1] + (b - a))
    return Trips(np.append(trips.origins, trips.origins[i]), np.append(trips.ends, trips.ends[i]), ptr, ids,
                 trips.max_edges)


def small_city():
    road = road_grid(4, 4, seed=0)
    return road, random_trips(road, 20, seed=1, max_edges=3)


def test_issue13_release_is_the_plan_measurement_with_unit_L_plus_2():
    road, trips = small_city()
    for fixed, unit in ((False, 5), (True, 3)):
        prep = release_mod._prepare(road, trips, 0.5, "auto", fixed, 1e-8, None, True)
        assert prep.unit == unit and prep.plan.sensitivity == unit  # identity (Delta_1 = 1) times unit
        assert prep.plan.scales[0] == unit / 0.5 and prep.plan.cost.epsilon == 0.5
        rel = release_flows(road, trips, epsilon=0.5, rng=7, fixed_endpoints=fixed)
        np.testing.assert_array_equal(rel.noisy, prep.plan.measure(prep.truth, rng=7).y)


def test_issue13_default_is_exact_noise_and_float_is_an_opt_out():
    road, trips = small_city()
    acc = Accountant(epsilon=2.0)
    rel = release_flows(road, trips, epsilon=0.5, accountant=acc)
    assert rel.secure and rel.private and np.array_equal(rel.noisy, np.round(rel.noisy))
    (entry,) = acc.ledger
    assert entry.secure and entry.private and entry.cost.epsilon == 0.5 and entry.rows == rel.noisy.size
    assert entry.sensitivity == 5 and entry.label == "traffic flows (L = 3)" and rel.ledger == entry
    seeded = release_flows(road, trips, epsilon=0.5, accountant=acc, rng=1, secure=False)
    assert not seeded.secure and not seeded.private and not np.array_equal(seeded.noisy, np.round(seeded.noisy))
    assert not acc.ledger[1].secure and acc.ledger[1].private is False


def test_issue13_exact_noise_variance_matches_the_measurement():
    road, trips = small_city()
    prep = release_mod._prepare(road, trips, 10.0, "auto", False, 1e-8, None, True)  # scale 0.5
    rng = np.random.default_rng(3)
    z = np.concatenate([prep.plan.measure(prep.truth, rng=rng).y - prep.truth for _ in range(300)])
    rel = release_flows(road, trips, epsilon=10.0, rng=0)
    assert rel.scale == 0.5
    assert np.mean(z**2) == pytest.approx(rel.noise_variance, rel=0.1)
    assert rel.noise_variance < 0.8 * 2 * rel.scale**2  # the discrete variance, not 2 b^2


@pytest.mark.parametrize("kwargs", [
    {"epsilon": 0.0}, {"epsilon": float("nan")}, {"max_edges": 0}, {"method": "magic"}, {"tol": -1.0},
    {"rng": "seed"}, {"secure": "yes"}, {"epsilon": 1.5},  # the last one overspends the accountant
])
def test_issue13_bad_input_records_nothing_in_the_ledger(kwargs):
    road, trips = small_city()
    acc = Accountant(epsilon=1.0)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    args = {"epsilon": 1.0, "rng": rng, "accountant": acc, **kwargs}
    with pytest.raises(SparseDPError):
        release_flows(road, trips, **args)
    assert acc.ledger == () and acc.spent_exact == 0 and rng.bit_generator.state == state


def _flow_audit_setup():
    road = road_grid(2, 2, seed=0)
    trips = random_trips(road, 5, seed=1, max_edges=1)
    other = duplicate(trips, 0)  # one more trip: +1 on one edge, one start and one end (L + 2 = 3)
    a = release_mod._prepare(road, trips, 1.0, "auto", False, 1e-8, None, True)
    b = release_mod._prepare(road, other, 1.0, "auto", False, 1e-8, None, True)
    np.testing.assert_array_equal(a.plan.scales, b.plan.scales)
    touched = np.flatnonzero(b.truth != a.truth)
    assert touched.size == 3 and np.all(b.truth[touched] - a.truth[touched] == 1)
    base = a.truth[touched]
    return a, b, lambda y: [float(np.min(y[touched] - base))]  # the orthant event: ratio e^loss


def test_issue13_audit_flows():
    a, b, stat = _flow_audit_setup()
    good = audit(lambda x, g: stat(a.plan.measure(x, rng=g).y), a.truth, b.truth, trials=2000, rng=1)
    assert good.epsilon_lower <= 1.0


def test_issue13_audit_detects_a_broken_copy_with_halved_scales():
    a, b, stat = _flow_audit_setup()
    broken = plan_measurement(a.plan.strategy, scales=a.plan.scales / 2)  # as if calibrated to (L + 2) / 2
    bad = audit(lambda x, g: stat(broken.measure(x, rng=g).y), a.truth, b.truth, trials=2000, rng=1)
    assert bad.epsilon_lower > 1.0, bad


def test_issue13_cli_defaults_to_exact_noise(tmp_path, capsys):
    data, _ = run_cli(tmp_path, "d")
    assert data["secure"] is True and data["private"] is True and data["noise"] == "exact discrete Laplace"
    assert "exact discrete Laplace" in capsys.readouterr().out
    data, _ = run_cli(tmp_path, "f", "--float-noise")
    assert data["secure"] is False
    d, f = load_release_file(tmp_path / "d.npz"), load_release_file(tmp_path / "f.npz")
    assert d.kind == "flows" and d.description["secure"] is True and f.description["secure"] is False
    assert d.private and d.ledger[0]["secure"] is True and f.ledger[0]["secure"] is False
    assert d.ledger[0]["label"] == "traffic flows (L = 5)" and d.epsilon == 1.0
    assert main(["ledger", str(tmp_path / "d.npz")]) == 0
    assert "exact laplace" in capsys.readouterr().out


# --------------------------------------------------------------------------------------------------
# privacy unit: a vehicle with many trips
# --------------------------------------------------------------------------------------------------

from sparsedp.contribution_bound import UnreliableBoundWarning  # noqa: E402
from sparsedp.errors import BudgetExceededError  # noqa: E402
from sparsedp.flows import select_trips  # noqa: E402
from sparsedp.privacy_unit import IdColumnWarning, PrivacyUnit  # noqa: E402


def vehicle_city(seed: int = 0, k: int = 30, vehicles: int = 6):
    """Untruncated random trips (up to 6 edges) on a 4 x 4 city, driven by a few vehicles."""
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, k, seed=seed + 1, max_edges=None)
    return road, trips.with_units(np.random.default_rng(seed).integers(0, vehicles, size=k))


def last(trips: Trips, v) -> tuple[Trips, Trips]:
    """``(with, without)``: the trips with vehicle ``v``'s trips moved last, and without them."""
    mine = np.asarray(trips.units) == v
    order = np.r_[np.flatnonzero(~mine), np.flatnonzero(mine)]
    lens = np.diff(trips.edge_ptr)[order]
    ids = np.concatenate([trips.edge_ids[trips.edge_ptr[j]:trips.edge_ptr[j + 1]] for j in order])
    moved = Trips(trips.origins[order], trips.ends[order], np.r_[0, np.cumsum(lens)], ids.astype(np.int64), None,
                  np.asarray(trips.units)[order])
    keep = np.r_[np.ones((~mine).sum(), bool), np.zeros(mine.sum(), bool)]
    return moved, select_trips(moved, keep)


@pytest.mark.parametrize("fixed", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_unit_removing_a_whole_vehicle_costs_at_most_the_charge(fixed, seed):
    """Brute force: removing any one vehicle with all its trips (appended last, same truncation
    priorities) moves the measured counts by at most the charged sensitivity ``max_rows (L + 2)``
    (``max_rows L`` with fixed end points) in L1, and costs at most the charged epsilon; some vehicle
    reaches it.  Calibrated to one trip, the same vehicle costs more than epsilon."""
    road, trips = vehicle_city(seed)
    k, L, eps = 3, 2, 0.5
    unit = PrivacyUnit("vehicle", max_rows=k)
    per_trip = L if fixed else L + 2
    worst_l1, worst_loss, worst_row_loss = 0.0, Fraction(0), Fraction(0)
    for v in np.unique(trips.units):
        moved, without = last(trips, v)
        a = release_mod._prepare(road, moved, eps, "auto", fixed, 1e-8, L, True, privacy_unit=unit,
                                 rng=np.random.default_rng(seed))
        b = release_mod._prepare(road, without, eps, "auto", fixed, 1e-8, L, True, privacy_unit=unit,
                                 rng=np.random.default_rng(seed))
        assert a.unit == k * per_trip and a.plan.sensitivity == k * per_trip and a.plan.cost.epsilon == eps
        assert a.plan.privacy_unit == "vehicle (max_rows 3)"
        diff = a.truth - b.truth
        worst_l1 = max(worst_l1, float(np.abs(diff).sum()))
        worst_loss = max(worst_loss, exact_loss(diff, a.plan.scales))
        row = release_mod._prepare(road, moved.with_units(None), eps, "auto", fixed, 1e-8, L, True)  # one trip
        worst_row_loss = max(worst_row_loss, exact_loss(row.truth - release_mod._prepare(
            road, without.with_units(None), eps, "auto", fixed, 1e-8, L, True).truth, row.plan.scales))
    assert worst_l1 <= k * per_trip and worst_loss <= Fraction(eps)
    assert worst_l1 == k * per_trip  # the bound is reached: 3 kept trips of >= 2 edges
    assert worst_row_loss > Fraction(eps)  # what the one-trip calibration would have let through


def test_unit_release_charges_once_and_records_the_unit():
    road, trips = vehicle_city(1)
    acc = Accountant(epsilon=1.0)
    rel = release_flows(road, trips, epsilon=1.0, max_edges=2, accountant=acc, privacy_unit=PrivacyUnit("vehicle", max_rows=4))
    (entry,) = acc.ledger
    assert acc.spent_exact == Fraction(1.0) and entry.privacy_unit == "vehicle (max_rows 4)"
    assert rel.sensitivity == 16 == entry.sensitivity and rel.scale == 16.0
    res = rel.to_release()
    assert res.description["privacy_unit"] == {"privacy_unit": "vehicle", "max_rows": 4}
    assert "privacy_unit_bound" not in res.description
    plain = release_flows(road, trips.with_units(None), epsilon=1.0, max_edges=2, rng=0).to_release()
    assert plain.description["privacy_unit"] == {"privacy_unit": "one trip"}


def test_unit_truncation_keeps_at_most_max_rows_trips_per_vehicle():
    road, trips = vehicle_city(2, k=40, vehicles=3)
    unit = PrivacyUnit("vehicle", max_rows=2)
    prep = release_mod._prepare(road, trips, 1.0, "auto", False, 1e-8, 40, True, privacy_unit=unit, rng=5)
    E, V = road.edges, road.nodes
    assert prep.truth[E:E + V].sum() == 3 * 2  # trips started: 2 per vehicle, every vehicle has more
    again = release_mod._prepare(road, trips, 1.0, "auto", False, 1e-8, 40, True, privacy_unit=unit, rng=5)
    np.testing.assert_array_equal(prep.truth, again.truth)  # a seed makes the truncation reproducible


def test_unit_auto_spends_a_share_first_and_the_rest_on_the_flows():
    road = road_grid(4, 4, seed=0)
    trips = random_trips(road, 600, seed=3, max_edges=None)
    trips = trips.with_units(np.repeat(np.arange(200), 3))  # 200 vehicles, 3 trips each
    acc = Accountant(epsilon=50.0)
    rel = release_flows(road, trips, epsilon=50.0, max_edges=2, accountant=acc, rng=1,
                        privacy_unit=PrivacyUnit("vehicle", max_rows="auto"))
    first, second = acc.ledger
    assert first.label.startswith("privacy unit: bound") and first.cost.epsilon == 5.0
    assert acc.spent_exact <= Fraction(50.0) and second.cost.epsilon == pytest.approx(45.0)
    k = rel.privacy_unit.max_rows
    assert k == rel.bound_choice.bound == 3  # the true 0.95-quantile, at this budget
    assert rel.sensitivity == 4 * k == second.sensitivity and second.privacy_unit == "vehicle (max_rows 3)"
    res = rel.to_release()
    assert [e["label"] for e in res.ledger][0].startswith("privacy unit: bound")
    assert res.description["privacy_unit_bound"]["max_rows"] == k and res.description["epsilon"] == 50.0


def _refusals(road, trips):
    yield "grouped", dict(privacy_unit=PrivacyUnit("vehicle", max_groups=2, max_rows_per_group=1)), trips
    yield "no ids", dict(privacy_unit=PrivacyUnit("vehicle", max_rows=2)), trips.with_units(None)
    missing = np.asarray(trips.units, dtype=object).copy()
    missing[3] = None
    yield "missing id", dict(privacy_unit=PrivacyUnit("vehicle", max_rows=2)), trips.with_units(missing)
    yield "missing id auto", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto")), trips.with_units(missing)
    yield "ids per trip", dict(privacy_unit=PrivacyUnit("vehicle", max_rows=2)), trips.with_units(trips.units[:-1])
    yield "not a unit", dict(privacy_unit="vehicle"), trips
    yield "drop without unit", dict(drop_missing_units=True), trips.with_units(None)
    yield "auto, bad method", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto"), method="nope"), trips
    yield "auto, bad rng", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto"), rng="x"), trips
    bad = Trips(trips.origins, trips.ends, trips.edge_ptr, trips.edge_ids[::-1].copy(), None, trips.units)
    yield "auto, bad trips", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto")), bad
    yield "auto, rest too small", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto", auto_share=0.95),
                                       epsilon=1.5e-9), trips  # the choice's share is a valid budget, the rest not
    yield "auto, over budget", dict(privacy_unit=PrivacyUnit("vehicle", max_rows="auto"), epsilon=2.0), trips


@pytest.mark.parametrize("case", [c for c, _, _ in _refusals(*vehicle_city())])
def test_unit_bad_declarations_are_refused_before_any_charge(case):
    road, trips = vehicle_city()
    kw, data = next((k, t) for c, k, t in _refusals(road, trips) if c == case)
    kw = {"epsilon": 1.0, "max_edges": 2, **kw}
    acc = Accountant(epsilon=1.0)
    with pytest.raises((SparseDPError, BudgetExceededError)):
        release_flows(road, data, accountant=acc, **kw)
    assert acc.ledger == () and acc.spent_exact == 0


def test_unit_drop_missing_drops_those_trips():
    road, trips = vehicle_city(3)
    ids = np.asarray(trips.units, dtype=object).copy()
    ids[:5] = None
    unit = PrivacyUnit("vehicle", max_rows=100)  # keeps every trip with an id
    got = release_mod._prepare(road, trips.with_units(ids), 1.0, "auto", False, 1e-8, 40, True, privacy_unit=unit,
                               drop_missing_units=True, rng=0)
    kept = select_trips(trips, np.r_[np.zeros(5, bool), np.ones(trips.count - 5, bool)]).with_units(None)
    np.testing.assert_array_equal(got.truth, release_mod._prepare(road, kept, 1.0, "auto", False, 1e-8, 40, True).truth)


def test_unit_ids_without_a_declared_unit_warn():
    road, trips = vehicle_city()
    with pytest.warns(IdColumnWarning, match="one trip, not one vehicle"):
        release_flows(road, trips, epsilon=1.0, max_edges=2, rng=0)


def _vehicle_audit_setup():
    """Neighbours that differ by one whole vehicle: one more vehicle with two copies of trip 0
    (its trips last), each kept (``max_rows = 2``), moving 3 counts by 2 (``max_rows (L + 2) = 6``)."""
    road = road_grid(2, 2, seed=0)
    trips = random_trips(road, 5, seed=1, max_edges=1).with_units(np.arange(5))
    other = duplicate(duplicate(trips, 0).with_units(None), 0).with_units(np.r_[np.arange(5), 9, 9])
    unit = PrivacyUnit("vehicle", max_rows=2)
    a = release_mod._prepare(road, trips, 1.0, "auto", False, 1e-8, None, True, privacy_unit=unit, rng=3)
    b = release_mod._prepare(road, other, 1.0, "auto", False, 1e-8, None, True, privacy_unit=unit, rng=3)
    touched = np.flatnonzero(b.truth != a.truth)
    assert touched.size == 3 and np.all(b.truth[touched] - a.truth[touched] == 2)
    base = a.truth[touched]
    return a, b, lambda y: [float(np.min(y[touched] - base))]


def test_unit_audit_flows_with_vehicle_neighbours():
    """The auditor on neighbours one whole vehicle apart: the per-vehicle release stays within its
    epsilon; the same counts calibrated to one trip (scale L + 2) are flagged."""
    a, b, stat = _vehicle_audit_setup()
    good = audit(lambda x, g: stat(a.plan.measure(x, rng=g).y), a.truth, b.truth, trials=2000, rng=1)
    assert good.epsilon_lower <= 1.0
    per_trip = plan_measurement(a.plan.strategy, epsilon=1.0, unit=3)
    bad = audit(lambda x, g: stat(per_trip.measure(x, rng=g).y), a.truth, b.truth, trials=2000, rng=1)
    assert bad.epsilon_lower > 1.0, bad
