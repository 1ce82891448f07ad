"""benchmarks/bench_measure.py (issue 13's throughput table) stays runnable: ``--quick`` times every
release path at small sizes, exact against float noise, and writes the table's JSON."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GROUPS = {"matrix mechanism", "trees", "flows", "restaurant", "continual", "completion"}


def _load():
    spec = importlib.util.spec_from_file_location("bench_measure", ROOT / "benchmarks" / "bench_measure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_measure"] = module  # dataclasses look their module up
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_quick_run_times_every_path_exact_against_float(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "measure.json"
    assert bench.main(["--quick", "--reps", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["quick"] is True and res["complete"] is True and res["reps"] == 1 and res["target"] == 1.25
    assert "contention" in res["note"]
    assert isinstance(res["blas_threads"], list)
    rows = res["rows"]
    assert {r["group"] for r in rows} == GROUPS
    for r in rows:
        assert len(r["exact_s"]) == len(r["float_s"]) == 1 and r["exact_median_s"] > 0 and r["float_median_s"] > 0
        assert r["ratio_median"] == r["exact_median_s"] / r["float_median_s"]
        assert r["met"] == (r["ratio_median"] <= 1.25)
    names = {r["path"] for r in rows}
    assert {"LUE-DPTree", "Boost", "square root (zCDP)", "12-ary GLS tree"} <= names
    text = capsys.readouterr().out
    assert "ratio" in text and "target" in text and f"of {len(rows)} paths within 1.25x" in text


def test_group_selection_runs_only_those_paths(tmp_path):
    bench = _load()
    out = tmp_path / "m.json"
    assert bench.main(["--quick", "--reps", "1", "--paths", "completion", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert rows and {r["group"] for r in rows} == {"completion"}
