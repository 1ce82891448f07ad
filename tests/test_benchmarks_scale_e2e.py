"""benchmarks/bench_scale_e2e.py stays runnable: each kind's steps at a small size, the optimised
release's saved variances equal to the optimiser's report, the file loading back to the same answers."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load():
    spec = importlib.util.spec_from_file_location("bench_scale_e2e", ROOT / "benchmarks" / "bench_scale_e2e.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale_e2e"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("kind,log_n", [("prefix", 8), ("prefix-gaussian", 8), ("histogram", 10)])
def test_each_step_runs_and_the_release_keeps_the_exact_variances(kind, log_n):
    bench = _load()
    row = bench.one(kind, log_n)
    steps = [s["step"] for s in row["steps"]]
    assert steps[-5:] == ["confidence_intervals again", "to_release", "save", "load_release",
                          "query (rows + intervals)"]
    assert row["loaded_equal"] and row["n"] == 1 << log_n
    assert all(s["seconds"] >= 0 and s["peak_rss_mib"] > 0 for s in row["steps"])
    assert row["variance_method"] == row["report_method"] and row["report_method"] != "estimate"
    if kind.startswith("prefix"):
        assert row["rel_diff"] < 1e-6
    table = bench._table([row])
    assert f"| {kind} | 2^{log_n} | **total** |" in table
