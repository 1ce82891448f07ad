"""Issue 26 (4): no command publishes a value computed from the data without noise.

Every command is run on a data set and on its neighbour (one record more, in each release's unit of
privacy) with the same noise seed; everything in the output except the noisy answers (and the
post-processing of them: solver iterations, residuals and times on the noisy values) must be
identical: printed lines, JSON summaries, the description, ledger and array shapes of release files.
"""

import json
import re

import numpy as np
import pandas as pd
import pytest

from sparsedp.cli import main
from sparsedp.consistency import COMBOS, ITEMS, restaurant
from sparsedp.flows import random_trips, road_grid
from sparsedp.release_file import load_release_file

GRID = (5, 5)


def _public(path):
    """What a release file says besides its noisy values: kind, private flag, description, the
    ledger without the wall-clock time of the charge, and every array's shape and dtype."""
    rel = load_release_file(path)
    ledger = [{k: v for k, v in e.items() if k != "time"} for e in rel.ledger]
    shapes = {k: (v.shape, str(v.dtype)) for k, v in rel.arrays.items()}
    return rel.kind, rel.private, rel.description, ledger, shapes


def _json(d, name):
    """A JSON output of a run in ``d``, with ``d`` written as ``DIR``."""
    return json.loads((d / name).read_text().replace(str(d), "DIR"))


def _run_both(tmp_path, write, argv, capsys):
    """Run ``argv`` (with ``{data}`` and ``{out}`` placeholders) on the data set ``write(path, 0)``
    and its neighbour ``write(path, 1)``; the stdout, stderr and output directory of each run."""
    runs = []
    for neighbour in (0, 1):
        d = tmp_path / f"run{neighbour}"
        d.mkdir()
        data = write(d, neighbour)
        args = [a.format(data=data, out=d) for a in argv]
        assert main(args) == 0, capsys.readouterr().err
        captured = capsys.readouterr()
        runs.append((captured.out.replace(str(d), "DIR"), captured.err.replace(str(d), "DIR"), d))
    return runs


# -- flows --trips-file: one trip more ------------------------------------------------------------
def _write_trips(d, neighbour):
    road = road_grid(*GRID, seed=0)
    trips = random_trips(road, 12 + neighbour, seed=1, max_edges=40)
    rows = []
    for i in range(trips.count):
        e = trips.edge_ids[trips.edge_ptr[i]:trips.edge_ptr[i + 1]]
        rows += [(i, int(n)) for n in [trips.origins[i], *road.heads[e]]]
    path = d / "trips.csv"
    pd.DataFrame(rows, columns=["trip", "node"]).to_csv(path, index=False)
    return path


_SOLVER_LINE = re.compile(r"\d+ iterations, [\d.]+ s, residual max\|Cx-b\| = \S+")


def test_flows_trips_file_publishes_no_exact_trip_count(tmp_path, capsys):
    argv = ["flows", "--grid", *map(str, GRID), "--trips-file", "{data}", "--seed", "3", "--json", "{out}/f.json",
            "--out", "{out}/f.npz"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, _write_trips, argv, capsys)
    assert _SOLVER_LINE.sub("", out0) == _SOLVER_LINE.sub("", out1)
    assert err0 == err1
    j0, j1 = (_json(d, "f.json") for d in (d0, d1))
    assert "trips" not in j0 and "generate_seconds" not in j0  # the exact count; the time to read the file
    noisy = {"iterations", "seconds", "residual"}  # the projection of the noisy counts (post-processing)
    assert set(j0) == set(j1)
    assert {k: v for k, v in j0.items() if k not in noisy} == {k: v for k, v in j1.items() if k not in noisy}
    assert _public(d0 / "f.npz") == _public(d1 / "f.npz")


def test_flows_synthetic_trips_report_the_public_parameter(tmp_path, capsys):
    js = tmp_path / "f.json"
    assert main(["flows", "--grid", "4", "4", "--trips", "30", "--seed", "1", "--json", str(js)]) == 0
    summary = json.loads(js.read_text())
    assert summary["trips"] == 30 and summary["trips_source"] == "synthetic"  # --trips, a public parameter
    assert "30 random trips" in capsys.readouterr().out


# -- restaurant --data: one order more ------------------------------------------------------------
def _write_sales(d, neighbour, suffix="csv"):
    s = restaurant(16, seed=3).sales.copy()
    s[5] += neighbour * COMBOS[1]  # one more combo order on day 5
    path = d / f"sales.{suffix}"
    if suffix == "npy":
        np.save(path, s)
    else:
        pd.DataFrame(s, columns=list(ITEMS)).to_csv(path, index=False)
    return path


_RESTAURANT_SOLVER = re.compile(r"method \S+: \d+ iterations, [\d.]+ s, residual .*")


def test_restaurant_data_outputs_match_on_neighbours(tmp_path, capsys):
    argv = ["restaurant", "--data", "{data}", "--seed", "2", "--json", "{out}/s.json", "--out", "{out}/r.npz"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, _write_sales, argv, capsys)
    assert _RESTAURANT_SOLVER.sub("", out0) == _RESTAURANT_SOLVER.sub("", out1) and err0 == err1
    j0, j1 = (_json(d, "s.json") for d in (d0, d1))
    noisy = {"iterations", "seconds", "residual", "relative_residual", "converged"}  # the solve of the noisy values
    assert {k: v for k, v in j0.items() if k not in noisy} == {k: v for k, v in j1.items() if k not in noisy}
    assert _public(d0 / "r.npz") == _public(d1 / "r.npz")


def test_restaurant_chunked_publishes_no_timing_of_the_true_sales(tmp_path, capsys):
    write = lambda d, neighbour: _write_sales(d, neighbour, "npy")  # noqa: E731
    argv = ["restaurant", "--data", "{data}", "--seed", "2", "--chunk", "4", "--out", "{out}/o.npy"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, write, argv, capsys)
    j0, j1 = (_json(d, "o.npy.release.json") for d in (d0, d1))
    # phases that read, validate or measure the true sales take data-dependent time: not published
    assert not {"validate", "measure+upward", "total"} & set(j0.get("seconds", {}))
    for j in (j0, j1):
        j.pop("seconds", None)  # what remains: the top solve and the downward pass on noisy values
        for e in j["ledger"]:
            e.pop("time")
    assert j0 == j1
    assert re.sub(r"[\d.]+ s\b", "", out0) == re.sub(r"[\d.]+ s\b", "", out1)
    assert " s -> " not in out0


# -- marginals: one record more -------------------------------------------------------------------
def _write_records(d, neighbour):
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.integers(0, 3, 60 + neighbour), "b": rng.integers(0, 2, 60 + neighbour)})
    path = d / "t.csv"
    df.to_csv(path, index=False)
    return path


def test_marginals_outputs_match_on_neighbours(tmp_path, capsys, monkeypatch):
    import sparsedp.marginals.cli as mcli

    shown = []

    class Bar:  # the stage bar a terminal would show: record what it says
        def __init__(self, *a, **k):
            shown.append(k.get("bar_format", ""))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def set_postfix_str(self, text):
            shown.append(text)

        def update(self, n=1):
            pass

    monkeypatch.setattr(mcli, "progress_bar", Bar)
    argv = ["marginals", "{data}", "--columns", "a,b", "--sizes", "3,2", "--rho", "1", "--seed", "0",
            "--out", "{out}/m.json"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, _write_records, argv, capsys)
    assert out0 == out1
    assert re.sub(r"sum of variances [\d.e+-]+", "", err0) == re.sub(r"sum of variances [\d.e+-]+", "", err1)
    shown[:] = [re.sub(r"run[01]", "runN", s) for s in shown]  # the output path differs
    half = len(shown) // 2
    assert shown[:half] == shown[half:], shown  # the bar shows no record count (nor a data-dependent time)
    assert not any("records" in s and any(c.isdigit() for c in s) for s in shown)
    assert not any("elapsed" in s for s in shown)
    m0, m1 = (_json(d, "m.json") for d in (d0, d1))
    for m in (m0, m1):
        for cell in m["marginals"]:
            cell.pop("counts")
    assert m0 == m1


# -- complete --epsilon: one observed value changed (the pattern is public in this model) ---------
def _write_entries(d, neighbour):
    rng = np.random.default_rng(0)
    r, c = np.divmod(rng.choice(12 * 10, size=60, replace=False), 10)
    v = rng.normal(size=60)
    v[0] += 3.0 * neighbour  # one record's value differs
    path = d / "e.csv"
    pd.DataFrame({"row": r, "col": c, "value": v}).to_csv(path, index=False)
    return path


def test_complete_outputs_match_on_neighbours(tmp_path, capsys):
    argv = ["complete", "{data}", "--rank", "2", "--epsilon", "1", "--bounds", "-4", "4", "--seed-noise",
            "--seed", "1", "--max-iter", "20", "--json", "{out}/c.json", "--save", "{out}/c.npz"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, _write_entries, argv, capsys)
    assert err0 == err1
    c0, c1 = (_json(d, "c.json") for d in (d0, d1))
    fit = {"seconds", "iterations", "converged", "residual", "rse", "ledger"}  # the fit to the noisy values
    assert {k: v for k, v in c0.items() if k not in fit} == {k: v for k, v in c1.items() if k not in fit}
    assert _public(d0 / "c.npz") == _public(d1 / "c.npz")


# -- release SPEC: one record more ----------------------------------------------------------------
SPEC = """
[data]
path = "people.csv"
column = "age"
bins = { start = 0, stop = 10, width = 1 }

[workload]
kind = "prefix"

[privacy]
epsilon = 1.0

[consistency]
nonnegative = true

[output]
release = "out.npz"
report = "out.md"
"""


def _write_spec(d, neighbour):
    ages = list(np.random.default_rng(2).integers(0, 10, size=40)) + [4] * neighbour
    (d / "people.csv").write_text("age\n" + "".join(f"{a}\n" for a in ages))
    (d / "s.toml").write_text(SPEC)
    return d / "s.toml"


def test_release_spec_outputs_match_on_neighbours(tmp_path, capsys):
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, _write_spec, ["release", "{data}", "--seed", "1"], capsys)
    assert out0 == out1 and err0 == err1
    assert _public(d0 / "out.npz") == _public(d1 / "out.npz")
    table = re.compile(r"^\| (bins? |query |bin |index )?\d+(\.\.\d+)? \| .*$", re.M)  # the released answers
    assert table.sub("", (d0 / "out.md").read_text()) == table.sub("", (d1 / "out.md").read_text())


# -- histogram: one record more -------------------------------------------------------------------
@pytest.mark.parametrize("method", ["lue", "boost", "dwork"])
def test_histogram_outputs_match_on_neighbours(tmp_path, capsys, method):
    def write(d, neighbour):
        x = np.array([3, 0, 5, 1, 0, 0, 2, 7, 1, 4, 0, 9])
        x[2] += neighbour
        np.save(d / "h.npy", x)
        return d / "h.npy"

    argv = ["histogram", "{data}", "--epsilon", "1", "--method", method, "--seed", "0", "--out", "{out}/h.npz"]
    (out0, err0, d0), (out1, err1, d1) = _run_both(tmp_path, write, argv, capsys)
    assert out0 == out1 and err0 == err1
    assert _public(d0 / "h.npz") == _public(d1 / "h.npz")
    a0, a1 = load_release_file(d0 / "h.npz").arrays, load_release_file(d1 / "h.npz").arrays
    for name in ("lo", "hi", "parent", "child_start", "level_start", "eps_per_node", "noise_scales"):
        if name in a0:  # the tree and its budgets are chosen from public parameters only
            np.testing.assert_array_equal(a0[name], a1[name], err_msg=name)


# -- no file holds how long a phase that reads the true data took ---------------------------------
#: keys that name a duration (or a clock reading)
_DURATION_KEY = re.compile(r"(^|[_.+ -])(times?|timings?|seconds?|secs?|durations?|elapsed|clock|wall)($|[_.+ -])"
                           r"|_(s|ms|us)$", re.I)
#: a duration written in a string ("1.2 s", "30 ms", "4 seconds")
_DURATION_TEXT = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|µs|us|sec|secs|seconds|minutes)\b")


def _durations(obj, where=""):
    """Every place in a JSON-like ``obj`` that holds a duration: ``where/key`` of a duration key
    (a ledger's ``time`` only when it is not a date rounded down to the hour), or of a string value
    that spells one."""
    hits = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            here = f"{where}/{k}"
            if _DURATION_KEY.search(str(k)):
                if not (str(k) == "time" and "/ledger" in where and float(v) % 3600 == 0):
                    hits.append(here)
            hits += _durations(v, here)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            hits += _durations(v, f"{where}/{i}" if not isinstance(v, dict) or "/ledger" not in where else
                               f"{where}/*")
    elif isinstance(obj, str) and _DURATION_TEXT.search(obj):
        hits.append(f"{where}={obj!r}")
    return hits


def _file_durations(d, inputs):
    """The durations of every file a run wrote into ``d`` (``inputs`` excepted): JSON documents, the
    record and array names of ``.npz`` files (release files or not), text reports and CSV headers."""
    hits = []
    for f in sorted(p for p in d.rglob("*") if p.is_file() and p.name not in inputs):
        name = str(f.relative_to(d))
        if f.suffix == ".json":
            hits += [f"{name}:{h}" for h in _durations(json.loads(f.read_text()))]
        elif f.suffix == ".npz":
            with np.load(f, allow_pickle=False) as z:
                keys = list(z.files)
            hits += [f"{name}:array {k}" for k in keys if _DURATION_KEY.search(k)]
            if "__sparsedp__" in keys:
                rel = load_release_file(f)
                record = {"description": rel.description, "ledger": list(rel.ledger), "model": rel.model}
                hits += [f"{name}:{h}" for h in _durations(record)]
        elif f.suffix in (".md", ".txt", ".csv"):
            text = f.read_text() if f.suffix != ".csv" else f.read_text().splitlines()[0]
            hits += [f"{name}:{m.group(0)!r}" for m in _DURATION_TEXT.finditer(text)]
            if f.suffix == ".csv":
                hits += [f"{name}:column {c}" for c in text.split(",") if _DURATION_KEY.search(c)]
    return hits


def _topdown_chunked(d):
    from test_topdown import small_frame

    from sparsedp.topdown import HierarchicalTable
    from sparsedp.topdown.scaleout import topdown_scaleout

    t = HierarchicalTable.from_counts(small_frame(2), ["state", "county", "vtd"], "vap_*,u18_*",
                                      attributes=("age", "race"), root="nation")
    topdown_scaleout(t, d / "chunked", rho=1.0, rng=1, invariants=["state:total"], progress=False)


def _continual_release(d):
    from sparsedp.continual import ContinualCounter

    counter = ContinualCounter(8, epsilon=1.0, rng=0)
    counter.run(np.array([1, 0, 2, 1]))
    counter.to_release().save(d / "continual.npz")


def _topdown_csv(d):
    from test_topdown import small_frame

    small_frame(5).to_csv(d / "t.csv", index=False)
    return d / "t.csv"


_TOPDOWN = ["topdown", "{data}", "--geo", "state,county,vtd", "--counts", "vap_*,u18_*", "--attributes", "age,race",
            "--invariant", "state:total", "--rho", "1", "--seed", "1"]

#: per release kind: how to make the data, the command (or the API call), and the durations its
#: files may hold -- only those of phases that read noisy values (a solve of the noisy answers)
_KINDS = {
    "histogram": (lambda d: (np.save(d / "h.npy", np.arange(12) % 4), d / "h.npy")[1],
                  ["histogram", "{data}", "--epsilon", "1", "--seed", "0", "--out", "{out}/h.npz"], set()),
    "histogram-chunked": (lambda d: (np.save(d / "h.npy", np.arange(64) % 4), d / "h.npy")[1],
                          ["histogram", "{data}", "--epsilon", "1", "--seed", "0", "--executor", "inprocess",
                           "--chunk", "16", "--out", "{out}/hc.npy"], set()),
    "trees-boost": (lambda d: (np.save(d / "h.npy", np.arange(12) % 4), d / "h.npy")[1],
                    ["histogram", "{data}", "--epsilon", "1", "--method", "boost", "--seed", "0", "--out",
                     "{out}/b.npz"], set()),
    "restaurant": (lambda d: _write_sales(d, 0),
                   ["restaurant", "--data", "{data}", "--seed", "2", "--json", "{out}/s.json", "--out", "{out}/r.npz"],
                   {"s.json:/seconds"}),
    "restaurant-chunked": (lambda d: _write_sales(d, 0, "npy"),
                           ["restaurant", "--data", "{data}", "--seed", "2", "--chunk", "4", "--out", "{out}/o.npy"],
                           {"o.npy.release.json:/seconds"}),  # its phases on noisy values only (above)
    "flows": (lambda d: _write_trips(d, 0),
              ["flows", "--grid", *map(str, GRID), "--trips-file", "{data}", "--seed", "3", "--json", "{out}/f.json",
               "--out", "{out}/f.npz"], {"f.json:/seconds"}),
    "marginals": (lambda d: _write_records(d, 0),
                  ["marginals", "{data}", "--columns", "a,b", "--sizes", "3,2", "--rho", "1", "--seed", "0",
                   "--out", "{out}/m.json"], set()),
    "marginals-npz": (lambda d: _write_records(d, 0),
                      ["marginals", "{data}", "--columns", "a,b", "--sizes", "3,2", "--rho", "1", "--seed", "0",
                       "--out", "{out}/m.npz"], set()),
    "completion": (lambda d: _write_entries(d, 0),
                   ["complete", "{data}", "--rank", "2", "--epsilon", "1", "--bounds", "-4", "4", "--seed-noise",
                    "--seed", "1", "--max-iter", "20", "--json", "{out}/c.json", "--save", "{out}/c.npz"],
                   {"c.json:/seconds"}),
    "spec": (lambda d: _write_spec(d, 0), ["release", "{data}", "--seed", "1"], set()),
    "topdown": (_topdown_csv, _TOPDOWN + ["--out", "{out}/td.npz"], set()),
    "topdown-table": (_topdown_csv, _TOPDOWN + ["--out", "{out}/td.csv"], set()),
    "topdown-chunked": (_topdown_chunked, None, set()),
    "continual": (_continual_release, None, set()),
}


@pytest.mark.parametrize("kind", sorted(_KINDS))
def test_no_release_file_holds_the_duration_of_a_phase_that_reads_the_data(tmp_path, capsys, kind):
    """Every file a release of each kind writes (release files, records, manifests, summaries,
    reports, the parts of a chunked release) is scanned for keys and values of durations: the
    only ones allowed are the solves of the noisy values, named per kind; a ledger's ``time`` is a
    date rounded down to the hour."""
    make, argv, noisy = _KINDS[kind]
    data = make(tmp_path)
    if argv is not None:
        args = [a.format(data=data, out=tmp_path) for a in argv]
        assert main(args) == 0, capsys.readouterr().err
    inputs = {"h.npy", "sales.csv", "sales.npy", "trips.csv", "t.csv", "e.csv", "people.csv", "s.toml"}
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in inputs]
    assert written, "the run wrote nothing"
    hits = set(_file_durations(tmp_path, inputs))
    assert hits == noisy, sorted(hits)
