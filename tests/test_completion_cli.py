import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

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


def test_complete_help_documents_every_option():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "sparsedp", "complete", "--help"], capture_output=True, text=True,
                         env=env, check=True).stdout
    for opt in ("--size", "--rank", "--observed", "--noise-scale", "--method", "--seed", "--json", "--epsilon",
                "--bounds", "--max-per-row", "--save", "--max-iter", "--tol", "--secure", "--grid", "--seed-noise",
                "--plain", "--no-privacy"):
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
