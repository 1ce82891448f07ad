"""``sparsedp flows --trips-file``: a user's trips on the grid city from CSV / Parquet (issue 15)."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from _tables import write_table
from sparsedp.cli import main
from sparsedp.errors import SparseDPError
from sparsedp.flows import random_trips, release_flows, road_grid
from sparsedp.flows import cli as fcli
from sparsedp.release_file import load_release_file

GRID = (6, 6)


@pytest.fixture(scope="module")
def road():
    return road_grid(*GRID, seed=0)  # the CLI's city for --grid 6 6 --data-seed 0


@pytest.fixture(scope="module")
def trips(road):
    return random_trips(road, 25, seed=1, max_edges=40)


def _frame(road, trips):
    rows = []
    for i in range(trips.count):
        e = trips.edge_ids[trips.edge_ptr[i]:trips.edge_ptr[i + 1]]
        rows += [(700 + 3 * i, int(n)) for n in [trips.origins[i], *road.heads[e]]]
    return pd.DataFrame(rows, columns=["trip", "node"])


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_load_trips_round_trip(tmp_path, road, trips, ext):
    df = _frame(road, trips)
    df.insert(1, "note", "x")  # other columns are ignored
    got = fcli.load_trips(write_table(df, tmp_path / f"t.{ext}"), road)
    for name in ("origins", "ends", "edge_ptr", "edge_ids"):
        np.testing.assert_array_equal(getattr(got, name), getattr(trips, name), err_msg=name)


def test_one_row_trip_goes_nowhere(tmp_path, road):
    df = pd.DataFrame({"trip": [1, 2, 2], "node": [5, 0, 1]})
    got = fcli.load_trips(write_table(df, tmp_path / "t.csv"), road)
    np.testing.assert_array_equal(got.lengths(), [0, 1])
    np.testing.assert_array_equal(got.origins, [5, 0])  # trip 1 starts and ends at 5
    np.testing.assert_array_equal(got.ends, [5, 1])


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_cli_releases_the_file(tmp_path, road, trips, ext):
    data = write_table(_frame(road, trips), tmp_path / f"t.{ext}")
    out, js, net = tmp_path / "f.npz", tmp_path / "f.json", tmp_path / "net.csv"
    argv = ["flows", "--grid", *map(str, GRID), "--trips-file", data, "--seed", "4", "--out", str(out),
            "--json", str(js), "--write-network", str(net)]
    assert main(argv) == 0
    summary = json.loads(js.read_text())
    assert "trips" not in summary and summary["trips_source"] == "file"  # the exact trip count is private (issue 26)
    assert summary["sensitivity"] == 42  # L + 2 with the default L = 40
    lib = release_flows(road, trips, epsilon=1.0, rng=4, max_edges=40)
    rel = load_release_file(out)
    np.testing.assert_allclose(rel.arrays["x"], lib.consistent, atol=1e-6)
    # the release, its labels and variances, and its ledger: never the trips
    kept = {k for k in rel.arrays if not k.startswith("error_shape.")}  # the intervals' shape of the noise
    assert kept == {"x", "variances", "label.part", "label.id"} and len(rel.ledger) == 1
    edges = pd.read_csv(net)
    np.testing.assert_array_equal(edges["tail"], road.tails)
    np.testing.assert_array_equal(edges["head"], road.heads)


def _bad_cases(road, trips):
    good = _frame(road, trips)
    # a pair of grid neighbours joined only one way (a one-way street), driven the wrong way
    pairs = set(zip(road.tails.tolist(), road.heads.tolist()))
    u, v = next((h, t) for t, h in pairs if (h, t) not in pairs)
    nan = good.astype(float)
    nan.loc[2, "node"] = np.nan
    frac = good.astype(float)
    frac.loc[1, "trip"] = 700.5
    text = good.astype(object)
    text.loc[3, "node"] = "north"
    split = good.copy()
    split.loc[len(split)] = [700, int(good["node"].iloc[0])]  # trip 700 again after the others
    return {
        "missing column": (good.drop(columns="node"), "no column 'node'|'node'"),
        "non-numeric": (text, "not numeric"),
        "NaN": (nan, "NaN|not numeric"),
        "non-integer": (frac, "integer ids"),
        "empty": (good.iloc[:0], "no values|empty"),
        "unknown node": (pd.DataFrame({"trip": [1, 1], "node": [0, road.nodes]}), "not an intersection"),
        "negative node": (pd.DataFrame({"trip": [1, 1], "node": [-1, 0]}), "not an intersection"),
        "trip split": (split, "not together"),
        "jump": (pd.DataFrame({"trip": [1, 1], "node": [0, road.nodes - 1]}), "not a walk"),
        "wrong way": (pd.DataFrame({"trip": [1, 1], "node": [u, v]}), "not a walk"),
    }


CASES = ["missing column", "non-numeric", "NaN", "non-integer", "empty", "unknown node", "negative node", "trip split",
         "jump", "wrong way"]


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@pytest.mark.parametrize("case", CASES)
def test_cli_refuses_bad_trips_before_any_noise(tmp_path, road, trips, ext, case, capsys, monkeypatch):
    df, pattern = _bad_cases(road, trips)[case]
    if ext == "parquet" and case == "non-numeric":
        df = df.astype({"node": str})
    data = write_table(df, tmp_path / f"bad.{ext}")
    monkeypatch.setattr(fcli, "release_flows", lambda *a, **k: pytest.fail("reached the release with bad trips"))
    out = tmp_path / "f.npz"
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sparsedp: error" in err and re.search(pattern, err), err
    assert not out.exists()
    with pytest.raises(SparseDPError):
        fcli.load_trips(data, road)


def test_cli_refuses_missing_and_unsupported_files(tmp_path, capsys):
    (tmp_path / "t.npy").write_bytes(b"")
    for path, pattern in ((tmp_path / "absent.csv", "no such file"), (tmp_path / "t.npy", "unsupported")):
        assert main(["flows", "--grid", "4", "4", "--trips-file", str(path)]) == 2
        assert pattern in capsys.readouterr().err
    (tmp_path / "blank.csv").write_text("")
    assert main(["flows", "--grid", "4", "4", "--trips-file", str(tmp_path / "blank.csv")]) == 2
    assert "empty" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# privacy unit: --privacy-unit COLUMN names the vehicle of every row
# --------------------------------------------------------------------------------------------------

from sparsedp.privacy_unit import IdColumnWarning, PrivacyUnit  # noqa: E402


def _vehicles(trips):
    return np.array([f"car-{i % 4}" for i in range(trips.count)], dtype=object)  # 4 vehicles, 6-7 trips each


def _vehicle_frame(road, trips, column="vehicle"):
    df = _frame(road, trips)
    first = np.r_[True, df["trip"].to_numpy()[1:] != df["trip"].to_numpy()[:-1]]
    df[column] = _vehicles(trips)[np.cumsum(first) - 1]
    return df


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_cli_privacy_unit_releases_per_vehicle(tmp_path, road, trips, ext):
    data = write_table(_vehicle_frame(road, trips), tmp_path / f"t.{ext}")
    out, js = tmp_path / "f.npz", tmp_path / "f.json"
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, "--seed", "4", "--max-trip-edges", "5",
                 "--privacy-unit", "vehicle", "--max-rows", "2", "--out", str(out), "--json", str(js)]) == 0
    summary = json.loads(js.read_text())
    assert summary["sensitivity"] == 2 * 7 and summary["laplace_scale"] == 14.0
    assert summary["privacy_unit"] == {"privacy_unit": "vehicle", "max_rows": 2}
    unit = PrivacyUnit("vehicle", max_rows=2)
    lib = release_flows(road, trips.with_units(_vehicles(trips)), epsilon=1.0, rng=4, max_edges=5, privacy_unit=unit)
    rel = load_release_file(out)
    np.testing.assert_allclose(rel.arrays["x"], lib.consistent, atol=1e-6)
    (entry,) = rel.ledger
    assert entry["privacy_unit"] == "vehicle (max_rows 2)" and entry["sensitivity"] == 14
    assert rel.description["privacy_unit"] == {"privacy_unit": "vehicle", "max_rows": 2}
    # nothing about the truncation is published: the same keys as a release of one trip, and the unit
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, "--seed", "4",
                 "--json", str(tmp_path / "g.json")]) == 0
    plain = json.loads((tmp_path / "g.json").read_text())
    assert plain["privacy_unit"] == {"privacy_unit": "one trip"} and set(summary) == set(plain)


def test_cli_privacy_unit_auto_records_the_choice(tmp_path, road, trips):
    data = write_table(_vehicle_frame(road, trips), tmp_path / "t.csv")
    out = tmp_path / "f.npz"
    with pytest.warns(UserWarning):  # 4 vehicles: the private quantile is unreliable, and says so
        assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, "--privacy-unit", "vehicle",
                     "--max-rows", "auto", "--out", str(out)]) == 0
    rel = load_release_file(out)
    first, second = rel.ledger
    assert first["label"].startswith("privacy unit: bound") and first["epsilon"] == pytest.approx(0.1)
    k = rel.description["privacy_unit_bound"]["max_rows"]
    assert rel.description["privacy_unit"]["max_rows"] == k and second["privacy_unit"] == f"vehicle (max_rows {k})"
    assert rel.description["epsilon"] == 1.0


def test_cli_id_like_column_warns_without_a_unit(tmp_path, road, trips, capsys):
    data = write_table(_vehicle_frame(road, trips, "vehicle_id"), tmp_path / "t.csv")
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data]) == 0
    assert "warning: column 'vehicle_id' looks like an identifier" in capsys.readouterr().err
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, "--privacy-unit", "vehicle_id",
                 "--max-rows", "3"]) == 0
    assert "looks like an identifier" not in capsys.readouterr().err
    with pytest.warns(IdColumnWarning):
        fcli.load_trips(data, road)


def _unit_refusals(road, trips):
    two = _vehicle_frame(road, trips)
    two.loc[1, "vehicle"] = "other"  # a row of the first trip names another vehicle
    blank = _vehicle_frame(road, trips)
    blank["vehicle"] = blank["vehicle"].astype(object)
    blank.loc[blank["trip"] == blank["trip"].iloc[0], "vehicle"] = None
    ok = _vehicle_frame(road, trips)
    return {
        "two vehicles": (two, ["--privacy-unit", "vehicle", "--max-rows", "2"], "names two units"),
        "missing id": (blank, ["--privacy-unit", "vehicle", "--max-rows", "2"], "have no value"),
        "no such column": (ok, ["--privacy-unit", "car", "--max-rows", "2"], "not a column"),
        "grouped": (ok, ["--privacy-unit", "vehicle", "--max-groups", "2", "--max-rows-per-group", "1"], "no natural cell"),
        "bound without unit": (ok, ["--max-rows", "2"], "need the privacy unit"),
        "drop without unit": (ok, ["--drop-missing-units"], "goes with --privacy-unit"),
    }


@pytest.mark.parametrize("case", ["two vehicles", "missing id", "no such column", "grouped", "bound without unit",
                                  "drop without unit"])
def test_cli_refuses_bad_unit_declarations_before_any_noise(tmp_path, road, trips, case, capsys, monkeypatch):
    df, flags, pattern = _unit_refusals(road, trips)[case]
    data = write_table(df, tmp_path / "t.csv")
    from sparsedp.flows import release as release_mod

    monkeypatch.setattr(release_mod, "plan_measurement", lambda *a, **k: pytest.fail("planned a measurement"))
    out = tmp_path / "f.npz"
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "sparsedp: error" in err and re.search(pattern, err), err
    assert not out.exists()


def test_cli_drop_missing_units_and_random_trips(tmp_path, road, trips, capsys):
    df, flags, _ = _unit_refusals(road, trips)["missing id"]
    data = write_table(df, tmp_path / "t.csv")
    assert main(["flows", "--grid", *map(str, GRID), "--trips-file", data, *flags, "--drop-missing-units"]) == 0
    assert main(["flows", "--grid", *map(str, GRID), "--privacy-unit", "vehicle", "--max-rows", "2"]) == 2
    assert "names a column of --trips-file" in capsys.readouterr().err
