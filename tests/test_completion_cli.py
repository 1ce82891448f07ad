import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from _cli_help import cli_help

from sparsedp.cli import main
from sparsedp.completion import synthetic_problem

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("method", ["dlnm-qr", "sor", "am", "soft"])
def test_complete_synthetic_json(tmp_path, method, capsys):
    out = tmp_path / "r.json"
    code = main(["complete", "--size", "120", "--rank", "3", "--observed", "0.3", "--noise-scale", "0.1",
                 "--method", method, "--seed", "2", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    for key in ("rse", "oracle_rse", "seconds", "iterations"):
        assert key in report
    assert report["iterations"] >= 1 and report["seconds"] > 0
    bound = 0.2 if method == "soft" else 2.0 * report["oracle_rse"]
    assert report["rse"] < bound
    assert "oracle_rse" in capsys.readouterr().out


def test_complete_user_matrix_with_privacy(tmp_path):
    observed, (U, V) = synthetic_problem(150, 100, rank=2, p=0.4, rng=1)
    path = tmp_path / "data.npz"
    sp.save_npz(path, observed)
    out, factors = tmp_path / "r.json", tmp_path / "f.npz"
    code = main(["complete", str(path), "--rank", "2", "--epsilon", "100", "--bounds", "-8", "8",
                 "--method", "sor", "--json", str(out), "--save", str(factors)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["laplace_scale"] == pytest.approx(16 / 100) and report["unit"] == "entry"
    assert report["rse"] is None and report["nnz"] == observed.nnz
    f = np.load(factors)
    est = f["left"] @ f["right"].T
    assert np.linalg.norm(est - U @ V.T) / np.linalg.norm(U @ V.T) < 0.15


def test_complete_bad_input_exit_code_2(tmp_path, capsys):
    assert main(["complete", "--size", "50", "--rank", "50"]) == 2
    assert main(["complete", "--size", "50", "--observed", "0"]) == 2
    observed, _ = synthetic_problem(30, rank=2, p=0.5, rng=1)
    path = tmp_path / "d.npz"
    sp.save_npz(path, observed)
    assert main(["complete", str(path), "--rank", "2", "--epsilon", "1"]) == 2  # no bounds
    assert main(["complete", str(path), "--rank", "2", "--epsilon", "1", "--bounds", "3", "1"]) == 2
    assert main(["complete", str(tmp_path / "missing.npz")]) == 2


def test_complete_help_documents_every_option(monkeypatch, capsys):
    out = cli_help(["complete", "--help"], monkeypatch, capsys)
    for opt in ("--size", "--rank", "--observed", "--noise-scale", "--method", "--seed", "--json", "--epsilon",
                "--bounds", "--max-per-row", "--save", "--max-iter", "--tol", "--secure", "--grid", "--seed-noise",
                "--plain", "--no-privacy", "--row", "--col", "--value", "--shape", "Parquet"):
        assert opt in out


def test_complete_reports_both_oracles_and_shrinks_by_default(tmp_path):
    out, plain = tmp_path / "a.json", tmp_path / "b.json"
    common = ["complete", "--size", "150", "--rank", "5", "--observed", "0.15", "--noise-scale", "1", "--seed", "3"]
    assert main(common + ["--method", "sor", "--json", str(out)]) == 0
    assert main(common + ["--method", "sor", "--plain", "--json", str(plain)]) == 0
    a, b = json.loads(out.read_text()), json.loads(plain.read_text())
    assert a["shrinkage"] == "noise-calibrated" and b["shrinkage"] is None
    assert a["oracle_exact"] > a["oracle_rse"]  # 3375 observations for 1475 parameters
    assert a["rse"] <= a["oracle_exact"] < b["rse"]


def test_complete_user_matrix_secure_release(tmp_path):
    observed, (U, V) = synthetic_problem(120, 100, rank=2, p=0.4, rng=1)
    path = tmp_path / "data.npz"
    sp.save_npz(path, observed)
    out = tmp_path / "r.json"
    code = main(["complete", str(path), "--rank", "2", "--epsilon", "100", "--bounds", "-8", "8", "--secure",
                 "--grid", "0.01", "--method", "dlnm-qr", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["secure"] is True and report["grid"] == pytest.approx(0.01)
    assert report["laplace_scale"] == pytest.approx(16 / 100) and report["shrinkage"] == "noise-calibrated"
    assert main(["complete", str(path), "--rank", "2", "--epsilon", "1", "--bounds", "0", "1", "--secure",
                 "--grid", "3"]) == 2  # grid coarser than the bounds


def _records(observed):
    coo = observed.tocoo()
    return coo.row, coo.col, coo.data


def _fit(argv, tmp_path, name):
    out = tmp_path / f"{name}.json"
    assert main(["complete", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_complete_reads_csv_parquet_npz_records_and_npy(tmp_path):
    # issue 15: tabular input; every format gives the same matrix, so the same seeded fit
    observed, _ = synthetic_problem(40, 30, rank=2, p=0.5, rng=1)
    r, c, v = _records(observed)
    common = ["--rank", "2", "--no-privacy", "--method", "sor", "--seed", "1", "--max-iter", "30"]
    sp.save_npz(tmp_path / "m.npz", observed)
    ref = _fit([str(tmp_path / "m.npz"), *common], tmp_path, "ref")
    assert ref["shape"] == [40, 30] and ref["nnz"] == observed.nnz
    order = np.random.default_rng(0).permutation(v.size)  # record order does not matter
    (tmp_path / "m.csv").write_text("user,item,rating,extra\n" + "".join(
        f"{r[i]},{c[i]},{float(v[i])!r},x\n" for i in order))
    csv_args = ["--row", "user", "--col", "item", "--value", "rating", "--shape", "40", "30"]
    got = _fit([str(tmp_path / "m.csv"), *csv_args, *common], tmp_path, "csv")
    assert got["residual"] == pytest.approx(ref["residual"], rel=1e-9) and got["nnz"] == ref["nnz"]
    np.savez(tmp_path / "rec.npz", row=r, col=c, value=v)
    got = _fit([str(tmp_path / "rec.npz"), "--shape", "40", "30", *common], tmp_path, "rec")
    assert got["residual"] == pytest.approx(ref["residual"], rel=1e-9)
    dense = np.full((40, 30), np.nan)
    dense[r, c] = v
    np.save(tmp_path / "m.npy", dense)
    got = _fit([str(tmp_path / "m.npy"), *common], tmp_path, "npy")
    assert got["residual"] == pytest.approx(ref["residual"], rel=1e-9)
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pd.DataFrame({"user": r, "item": c, "rating": v}).to_parquet(tmp_path / "m.parquet")
    got = _fit([str(tmp_path / "m.parquet"), *csv_args, *common], tmp_path, "pq")
    assert got["residual"] == pytest.approx(ref["residual"], rel=1e-9)


def test_complete_csv_release_is_private_by_default(tmp_path):
    observed, (U, V) = synthetic_problem(120, 100, rank=2, p=0.4, rng=1)
    r, c, v = _records(observed)
    (tmp_path / "m.csv").write_text("row,col,value\n" + "".join(f"{a},{b},{float(x)!r}\n" for a, b, x in zip(r, c, v)))
    rep = _fit([str(tmp_path / "m.csv"), "--rank", "2", "--epsilon", "100", "--bounds", "-8", "8"], tmp_path, "p")
    assert rep["private"] is True and rep["secure"] is True and rep["ledger"] is not None


BAD_TABLES = [
    ("row,col,value\n0,0,1\n", ["--value", "rating"], "no column 'rating'"),
    ("row,col,value\n0,0,1\n1,1,high\n", [], "row 3 of column 'value' is not numeric"),
    ("row,col,value\n0,0,1\n1,1,\n", [], "not numeric"),
    ("row,col,value\n", [], "holds no values"),
    ("", [], "empty"),
    ("row,col,value\n0,0,1\n-1,1,2\n", [], "0-based integer indices"),
    ("row,col,value\n0,0,1\n0.5,1,2\n", [], "0-based integer indices"),
    ("row,col,value\n0,0,1\n5,1,2\n", ["--shape", "3", "3"], "outside the 3 x 3 matrix"),
    ("row,col,value\n0,0,1\n0,0,2\n", [], "observed more than once"),
    ("row,col,value\n0,0,1\n1,1,inf\n", [], "infinite"),
]


@pytest.mark.parametrize("text,extra,message", BAD_TABLES)
def test_complete_bad_tables_refused_before_noise(tmp_path, monkeypatch, capsys, text, extra, message):
    import sparsedp.completion.cli as ccli

    def no_noise(*a, **k):
        raise AssertionError("noise drawn for bad input")

    monkeypatch.setattr(ccli, "privatize_observations", no_noise)
    path = tmp_path / "m.csv"
    path.write_text(text)
    assert main(["complete", str(path), "--rank", "1", "--epsilon", "1", "--bounds", "0", "5", *extra]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""


def test_complete_bad_npz_and_npy(tmp_path, capsys):
    np.savez(tmp_path / "a.npz", i=np.arange(3), j=np.arange(3), x=np.ones(3))
    assert main(["complete", str(tmp_path / "a.npz"), "--no-privacy", "--rank", "1"]) == 2
    assert "neither a scipy.sparse matrix" in capsys.readouterr().err
    np.savez(tmp_path / "b.npz", row=np.arange(3), col=np.arange(2), value=np.ones(3))
    assert main(["complete", str(tmp_path / "b.npz"), "--no-privacy", "--rank", "1"]) == 2
    assert "differ in length" in capsys.readouterr().err
    np.save(tmp_path / "c.npy", np.ones(4))
    assert main(["complete", str(tmp_path / "c.npy"), "--no-privacy", "--rank", "1"]) == 2
    assert "2-D" in capsys.readouterr().err
    sp.save_npz(tmp_path / "d.npz", sp.eye(4, format="csr"))
    assert main(["complete", str(tmp_path / "d.npz"), "--no-privacy", "--rank", "1", "--shape", "5", "4"]) == 2
    assert "not 5 x 4" in capsys.readouterr().err
    assert main(["complete", "--shape", "5", "4"]) == 2  # --shape without a file


def test_complete_save_is_a_release_file_with_the_ledger(tmp_path, capsys):
    from sparsedp.release_file import load_release_file

    observed, _ = synthetic_problem(60, 50, rank=2, p=0.4, rng=1)
    r, c, v = _records(observed)
    (tmp_path / "m.csv").write_text("row,col,value\n" + "".join(f"{a},{b},{float(x)!r}\n" for a, b, x in zip(r, c, v)))
    fac = tmp_path / "f.npz"
    assert main(["complete", str(tmp_path / "m.csv"), "--rank", "2", "--epsilon", "2", "--bounds", "-8", "8",
                 "--save", str(fac)]) == 0
    rf = load_release_file(fac)
    assert rf.kind == "completion" and rf.private and rf.epsilon == pytest.approx(2.0)
    assert set(rf.arrays) >= {"left", "right"} and "value" not in rf.arrays
    assert rf.arrays["left"].shape == (60, 2) and rf.arrays["right"].shape == (50, 2)
    capsys.readouterr()
    assert main(["ledger", str(fac)]) == 0
    assert "epsilon" in capsys.readouterr().out
    raw = tmp_path / "raw.npz"
    assert main(["complete", str(tmp_path / "m.csv"), "--rank", "2", "--no-privacy", "--save", str(raw)]) == 0
    rf = load_release_file(raw)
    assert not rf.private and rf.ledger == ()
