"""sparsedp marginals: the command line (CSV in, JSON of marginals / variances / privacy out)."""

import json

import numpy as np
import pytest

from sparsedp.cli import main


@pytest.fixture
def table(tmp_path):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.integers(0, 3, 400), "b": rng.integers(0, 4, 400), "c": rng.integers(0, 2, 400)})
    path = tmp_path / "data.csv"
    df.to_csv(path, index=False)
    return df, path


def test_cli_releases_marginals(table, tmp_path, capsys):
    df, path = table
    out = tmp_path / "out.json"
    assert main(["marginals", str(path), "--columns", "a,b,c", "--sizes", "3,4,2", "--k", "2", "--rho", "50",
                 "--seed", "1", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["privacy"]["rho"] == 50 and res["privacy"]["private"] is False
    assert res["privacy"]["certified_rho"] <= 50
    assert len(res["marginals"]) == 3 and "records" not in res
    ab = next(m for m in res["marginals"] if m["attributes"] == ["a", "b"])
    truth = df.groupby(["a", "b"]).size().unstack(fill_value=0).to_numpy()
    err = np.asarray(ab["counts"]) - truth
    assert np.mean(err ** 2) < 10 * ab["cell_variance"]
    assert "NOT private" in capsys.readouterr().err


def test_cli_categories_and_errors(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"x": ["u", "v", "u"], "y": ["p", "q", "r"]})
    path = tmp_path / "d.csv"
    df.to_csv(path, index=False)
    cats = tmp_path / "cats.json"
    cats.write_text(json.dumps({"x": ["u", "v"], "y": ["p", "q", "r"]}))
    out = tmp_path / "o.json"
    assert main(["marginals", str(path), "--columns", "x,y", "--categories", str(cats), "--k", "2", "--rho", "1",
                 "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["privacy"]["private"] is True and np.asarray(res["marginals"][0]["counts"]).shape == (2, 3)
    cats.write_text(json.dumps({"x": ["u"], "y": ["p", "q", "r"]}))  # "v" is not in the public domain
    out2 = tmp_path / "o2.json"
    assert main(["marginals", str(path), "--columns", "x,y", "--categories", str(cats), "--rho", "1",
                 "--out", str(out2)]) != 0
    assert not out2.exists()


def test_marginals_example_runs(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, str(root / "examples" / "marginals_release.py")], capture_output=True,
                         text=True, env=env, check=True, timeout=300)
    assert "28 marginals released" in out.stdout and "1 ledger entry" in out.stdout
