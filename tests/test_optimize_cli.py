"""``sparsedp optimize`` (issue 11): the chosen family, every candidate's error per query, the time."""

import json

import numpy as np
import pytest
import scipy.sparse as sp
from _cli_help import cli_help

from sparsedp import MatrixMechanism, expected_error, optimize
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.cli import main


def test_optimize_named_workload_json_and_strategy(tmp_path, capsys):
    out, saved = tmp_path / "o.json", tmp_path / "m.npz"
    assert main(["optimize", "--workload", "prefix", "--n", "64", "--epsilon", "0.5", "--json", str(out),
                 "--save", str(saved)]) == 0
    printed = capsys.readouterr().out
    rep = json.loads(out.read_text())
    ch = rep["chosen"]
    assert rep["queries"] == 64 and rep["cells"] == 64 and rep["epsilon"] == 0.5
    assert f"chosen: {ch['family']} {ch['name']}" in printed and "optimised in" in printed
    templates = [c for c in rep["candidates"] if c["family"] == "templates"]
    assert {"identity", "haar", "fenwick", "hierarchical(k=2)"} <= {c["name"] for c in templates}
    for c in templates:  # every template's error per query at epsilon 0.5, recomputed independently
        assert c["name"] in printed
    fen = next(c for c in templates if c["name"] == "fenwick")
    # (scored under the exact discrete noise the mechanism draws by default)
    direct = MatrixMechanism(wl.prefix(64), st.fenwick(64), epsilon=0.5).error_report().per_query
    assert fen["error_per_query"] == pytest.approx(direct, rel=1e-9)
    assert ch["error_per_query"] <= min(c["error_per_query"] for c in templates)
    assert rep["best_template"]["ratio_chosen_to_template"] <= 1.0
    assert rep["seconds"] > 0
    # the saved strategy measures to the reported error
    M = sp.load_npz(saved)
    err = MatrixMechanism(wl.prefix(64), M, epsilon=0.5).error_report()
    assert err.per_query == pytest.approx(ch["error_per_query"], rel=1e-9)


def test_optimize_workload_file_and_gaussian(tmp_path):
    n = 24
    rows = [(i, j) for i in range(0, n, 3) for j in range(i, n, 5)]
    W = sp.lil_matrix((len(rows), n))
    for r, (i, j) in enumerate(rows):
        W[r, i:j + 1] = 1.0
    path = tmp_path / "w.npz"
    sp.save_npz(path, W.tocsr())
    out = tmp_path / "o.json"
    assert main(["optimize", "--workload", str(path), "--noise", "gaussian", "--rho", "2", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["noise"] == "gaussian" and rep["rho"] == 2 and rep["queries"] == len(rows)
    res = optimize(W.tocsr(), noise="gaussian", rng=0)
    assert rep["chosen"]["error_total"] == pytest.approx(res.error.total / 2, rel=1e-9)
    dense = tmp_path / "w.npy"
    np.save(dense, W.toarray())
    assert main(["optimize", "--workload", str(dense), "--family", "templates"]) == 0


def test_optimize_bad_input_exit_code_2(tmp_path, capsys):
    assert main(["optimize", "--workload", "prefix"]) == 2  # no --n
    assert "--n" in capsys.readouterr().err
    assert main(["optimize", "--workload", "prefix", "--n", "0"]) == 2
    assert main(["optimize", "--workload", "prefix", "--n", "8", "--epsilon", "-1"]) == 2
    assert main(["optimize", "--workload", "prefix", "--n", "8", "--rho", "1"]) == 2  # rho with Laplace
    assert main(["optimize", "--workload", str(tmp_path / "missing.npz")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "w.npy"
    np.save(bad, np.array([[1.0, np.nan]]))
    assert main(["optimize", "--workload", str(bad)]) == 2
    assert "NaN" in capsys.readouterr().err
    np.save(bad, np.ones(4))
    assert main(["optimize", "--workload", str(bad)]) == 2
    assert main(["optimize", "--workload", "weird.txt"]) == 2
    assert main(["optimize", "--workload", "prefix", "--n", "8", "--json", str(tmp_path / "no" / "o.json")]) == 2


def test_optimize_help_documents_every_option(monkeypatch, capsys):
    out = cli_help(["optimize", "--help"], monkeypatch, capsys)
    for opt in ("--workload", "--n", "--noise", "--family", "--epsilon", "--rho", "--time-limit", "--seed", "--json",
                "--save", "all-ranges", "--p", "--restarts", "--maxiter"):
        assert opt in out
    assert "optimize" in cli_help(["--help"], monkeypatch, capsys)


def test_error_of_saved_strategy_matches_expected_error(tmp_path):
    saved = tmp_path / "m.npz"
    assert main(["optimize", "--workload", "all-ranges", "--n", "16", "--family", "tree", "--save", str(saved)]) == 0
    M = sp.load_npz(saved)
    res = optimize(wl.all_ranges(16), family="tree", rng=0)
    var = 2.0 * res.sensitivity ** 2
    assert expected_error(wl.all_ranges(16), M, var).total == pytest.approx(res.error.total, rel=1e-9)


def test_templates_are_shown_for_comparison_whatever_the_family(tmp_path):
    out = tmp_path / "o.json"
    assert main(["optimize", "--workload", "prefix", "--n", "32", "--family", "tree", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["chosen"]["family"] == "tree" and rep["family_requested"] == "tree"
    names = {c["name"] for c in rep["candidates"] if c["family"] == "templates"}
    assert {"identity", "fenwick", "haar"} <= names and rep["best_template"] is not None


def test_error_command_with_the_optimized_strategy(capsys):
    assert main(["error", "--workload", "prefix", "--n", "32", "--strategy", "optimized", "--float-noise"]) == 0
    out = capsys.readouterr().out
    assert "strategy optimized (" in out
    total = float(out.split("expected total squared error = ")[1].split()[0])
    res = optimize(wl.prefix(32), rng=0)
    assert total == pytest.approx(res.error.total, rel=1e-5)  # printed to 6 digits
    fenwick = MatrixMechanism(wl.prefix(32), st.fenwick(32), epsilon=1, secure=False).expected_error()
    assert total < fenwick


def test_optimize_a_table_of_ranges(tmp_path, capsys):
    path = tmp_path / "q.csv"
    path.write_text("name,first,last\na,0,6\nb,7,13\nc,0,29\nd,3,3\n")
    out = tmp_path / "o.json"
    assert main(["optimize", "--workload", str(path), "--n", "30", "--lo", "first", "--hi", "last",
                 "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    W = wl.range_queries(30, [(0, 6), (7, 13), (0, 29), (3, 3)])
    assert rep["queries"] == 4 and rep["cells"] == 30
    assert rep["chosen"]["error_total"] == pytest.approx(optimize(W, rng=0).error.total, rel=1e-9)
    bad = [("name,first,last\na,0,30\n", "bin numbers 0..29"), ("name,first,last\na,5,2\n", "first > last"),
           ("name,first,last\na,0,x\n", "not numeric"), ("name,first\na,0\n", "no column 'last'"),
           ("name,first,last\n", "holds no values")]
    for text, message in bad:
        path.write_text(text)
        assert main(["optimize", "--workload", str(path), "--n", "30", "--lo", "first", "--hi", "last"]) == 2
        assert message in capsys.readouterr().err
    assert main(["optimize", "--workload", str(path), "--lo", "first", "--hi", "last"]) == 2  # no --n
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame({"lo": [0, 7, 0, 3], "hi": [6, 13, 29, 3]}).to_parquet(tmp_path / "q.parquet")
    assert main(["optimize", "--workload", str(tmp_path / "q.parquet"), "--n", "30", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["chosen"]["error_total"] == pytest.approx(rep["chosen"]["error_total"], rel=1e-9)


def test_optimize_a_weighted_union(tmp_path, capsys):
    """Repeated --workload SPEC:WEIGHT is the weighted union (sparsedp.workloads.weighted_union):
    'mean' weights a part by 1 / its queries (DPBench's averaged random ranges + w x whole domain)."""
    n, out = 32, tmp_path / "o.json"
    assert main(["optimize", "--workload", "all-ranges:mean", "--workload", "total:0.9", "--n", str(n),
                 "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    nq = n * (n + 1) // 2
    assert rep["workload"] == f"mean x all-ranges({n}) + 0.9 x total({n})" and rep["queries"] == nq + 1
    res = optimize(wl.weighted_union([(1.0 / nq, wl.all_ranges(n)), (0.9, wl.total(n))]), rng=0)
    assert rep["chosen"]["error_total"] == pytest.approx(res.error.total, rel=1e-9)
    # the union's weighted total, not a mean over its rows
    assert rep["error_unit"] == "weighted total"
    assert rep["chosen"]["error_per_query"] == pytest.approx(res.error.total, rel=1e-9)
    assert "expected weighted total squared error" in capsys.readouterr().out
    # the union's error is the weighted sum of the parts' errors under the saved strategy
    saved = tmp_path / "m.npz"
    assert main(["optimize", "--workload", "all-ranges:mean", "--workload", "total:0.9", "--n", str(n),
                 "--family", "tree", "--save", str(saved)]) == 0
    tree = optimize(wl.weighted_union([(1.0 / nq, wl.all_ranges(n)), (0.9, wl.total(n))]), family="tree", rng=0)
    M, var = sp.load_npz(saved), 2.0 * tree.sensitivity ** 2
    parts = expected_error(wl.all_ranges(n), M, var).total / nq + 0.9 * expected_error(wl.total(n), M, var).total
    assert parts == pytest.approx(tree.error.total, rel=1e-9)
    # one part with weight 1 is the plain workload
    assert main(["optimize", "--workload", "prefix:1", "--n", "8", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["workload"] == "prefix(8)"
    capsys.readouterr()
    for bad in ("total:-1", "total:0", "total:nan", "total:inf"):
        assert main(["optimize", "--workload", "prefix", "--workload", bad, "--n", "8"]) == 2
        assert "weight must be a positive number" in capsys.readouterr().err


def test_optimize_pidentity_options(tmp_path, capsys):
    """--p, --restarts and --maxiter reach optimize: the same strategy and error as the API call."""
    out = tmp_path / "o.json"
    args = ["optimize", "--workload", "all-ranges", "--n", "64", "--family", "pidentity", "--p", "5", "--restarts", "2",
            "--maxiter", "40", "--json", str(out)]
    assert main(args) == 0
    rep = json.loads(out.read_text())
    res = optimize(wl.all_ranges(64), family="pidentity", p=5, restarts=2, maxiter=40, rng=0)
    assert rep["chosen"]["name"] == res.name == "p-identity(p=5)"
    assert rep["chosen"]["error_total"] == pytest.approx(res.error.total, rel=1e-12)
    tried = [c for c in rep["candidates"] if c["family"] == "pidentity"]
    # both starts stopped at the 40 iterations asked (with the default 1000 they converge first)
    assert len(tried) == 2 and all("ITERATIONS REACHED LIMIT" in c["note"] for c in tried)
    capsys.readouterr()
    for bad in (["--p", "0"], ["--maxiter", "-3"], ["--restarts", "0"]):
        assert main(["optimize", "--workload", "prefix", "--n", "8", *bad]) == 2
        assert "must be a positive integer" in capsys.readouterr().err
