"""``sparsedp continual DATA --column C`` (issue 15): a stream from a file, checked before any noise."""

import io
import sys

import numpy as np
import pytest
from _cli_help import cli_help

import sparsedp.continual.cli as ccli
from sparsedp.cli import main

STREAM = [3, 0, 5, 1, 0, 0, 2, 7]


def _stdin_run(monkeypatch, capsys, argv, values):
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{v}\n" for v in values)))
    assert main(["continual", *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("method", ["fenwick", "gls-tree"])
def test_file_stream_equals_the_stdin_stream(tmp_path, monkeypatch, capsys, method):
    argv = ["--horizon", "10", "--seed", "4", "--std", "--method", method]
    piped = _stdin_run(monkeypatch, capsys, argv, STREAM)
    assert len(piped.splitlines()) == len(STREAM)
    csv = tmp_path / "s.csv"
    csv.write_text("day,n\n" + "".join(f"{d},{v}\n" for d, v in enumerate(STREAM)))
    npy = tmp_path / "s.npy"
    np.save(npy, np.array(STREAM, dtype=np.int64))
    monkeypatch.setattr(sys, "stdin", io.StringIO("999\n"))  # a DATA file is read instead of stdin
    assert main(["continual", str(csv), "--column", "n", *argv]) == 0
    assert capsys.readouterr().out == piped
    assert main(["continual", str(npy), *argv]) == 0
    assert capsys.readouterr().out == piped
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    pq = tmp_path / "s.parquet"
    pd.DataFrame({"n": STREAM}).to_parquet(pq)
    assert main(["continual", str(pq), "--column", "n", *argv]) == 0
    assert capsys.readouterr().out == piped


def test_unit_increments_from_a_file(tmp_path, monkeypatch, capsys):
    vals = [0.25, 1.0, 0.0, 0.5]
    argv = ["--horizon", "4", "--seed", "2", "--increments", "unit"]
    piped = _stdin_run(monkeypatch, capsys, argv, vals)
    path = tmp_path / "u.csv"
    path.write_text("x\n" + "".join(f"{v}\n" for v in vals))
    assert main(["continual", str(path), "--column", "x", *argv]) == 0
    assert capsys.readouterr().out == piped


BAD = [
    ("day,n\n0,1\n1,2\n", ["--column", "count"], "no column 'count'"),
    ("day,n\n0,1\n1,two\n", ["--column", "n"], "row 3 of column 'n' is not numeric"),
    ("day,n\n0,1\n1,\n", ["--column", "n"], "not numeric"),
    ("day,n\n", ["--column", "n"], "holds no values"),
    ("", ["--column", "n"], "empty"),
    ("n\n1\n-1\n", ["--column", "n"], "row 3: increment -1.0 is not a non-negative integer"),
    ("n\n1\n1.5\n", ["--column", "n"], "not a non-negative integer"),
    ("n\n0.5\n1.5\n", ["--column", "n", "--increments", "unit"], "outside [0, 1]"),
    ("n\n1\nnan\n", ["--column", "n"], "NaN"),
    ("n\n" + "1\n" * 6, ["--column", "n"], "holds 6 increments but --horizon is 5"),
    ("n\n1\n", [], "name its column"),
]


@pytest.mark.parametrize("text,extra,message", BAD)
def test_bad_files_are_refused_before_any_counter_exists(tmp_path, monkeypatch, capsys, text, extra, message):
    path = tmp_path / "s.csv"
    path.write_text(text)

    def no_counter(*a, **k):
        raise AssertionError("a counter (and its noise) was created for bad input")

    monkeypatch.setattr(ccli, "ContinualCounter", no_counter)
    monkeypatch.setattr(ccli, "GLSTreeCounter", no_counter)
    assert main(["continual", str(path), "--horizon", "5", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing released
    assert message in captured.err


def test_other_bad_sources(tmp_path, monkeypatch, capsys):
    assert main(["continual", str(tmp_path / "missing.csv"), "--column", "n", "--horizon", "5"]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["continual", "--column", "n", "--horizon", "5"]) == 2  # --column without a file
    assert "--column" in capsys.readouterr().err
    np.save(tmp_path / "m.npy", np.ones((2, 2)))
    assert main(["continual", str(tmp_path / "m.npy"), "--horizon", "5"]) == 2
    assert "1-D" in capsys.readouterr().err
    (tmp_path / "s.txt").write_text("1\n")
    assert main(["continual", str(tmp_path / "s.txt"), "--horizon", "5"]) == 2
    assert "unsupported" in capsys.readouterr().err
    (tmp_path / "ok.csv").write_text("n\n1\n")
    assert main(["continual", str(tmp_path / "ok.csv"), "--column", "n", "--horizon", "0"]) == 2


def test_resumed_state_checks_the_steps_left(tmp_path, monkeypatch, capsys):
    state = str(tmp_path / "s.json")
    _stdin_run(monkeypatch, capsys, ["--horizon", "4", "--state", state, "--seed", "1"], [1, 1])
    path = tmp_path / "rest.csv"
    path.write_text("n\n1\n1\n1\n")
    assert main(["continual", str(path), "--column", "n", "--horizon", "4", "--state", state, "--seed", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "only 2 of the --horizon 4 steps are left" in captured.err
    path.write_text("n\n1\n1\n")
    assert main(["continual", str(path), "--column", "n", "--horizon", "4", "--state", state, "--seed", "1"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_no_progress_bar_when_not_a_terminal(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text("n\n" + "1\n" * 50)
    assert main(["continual", str(path), "--column", "n", "--horizon", "64"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and len(captured.out.splitlines()) == 50


def test_a_reader_that_stops_early_ends_the_stream_quietly(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    data = tmp_path / "s.npy"
    np.save(data, np.ones(200_000, dtype=np.int64))
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen([sys.executable, "-m", "sparsedp", "continual", str(data), "--horizon", "200000",
                             "--float-noise"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert float(first) == float(first) and "Traceback" not in err


def test_continual_help_documents_the_file_input(monkeypatch, capsys):
    out = cli_help(["continual", "--help"], monkeypatch, capsys)
    for word in ("data", "--column", "CSV", "Parquet", ".npy", "--horizon", "stdin"):
        assert word in out
