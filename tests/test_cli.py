import subprocess
import sys

import pytest

from sparsedp.cli import main


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "error" in out


def test_demo_runs(capsys):
    assert main(["demo", "--trials", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("identity", "hierarchical-2", "haar", "fenwick"):
        assert name in out
    assert "expected MSE" in out


def test_error_command(capsys):
    # seed 000's example: 32 / eps^2 with the paper's (float) Laplace noise
    assert main(["error", "--workload", "prefix", "--strategy", "fenwick", "--n", "3", "--float-noise"]) == 0
    out = capsys.readouterr().out
    assert "expected total squared error = 32 " in out
    # exact discrete Laplace (the default) has a slightly smaller variance at the same scale
    assert main(["error", "--workload", "prefix", "--strategy", "fenwick", "--n", "3"]) == 0
    assert "expected total squared error = 31.34" in capsys.readouterr().out


def test_bad_epsilon_is_a_clean_error(capsys):
    assert main(["error", "--epsilon", "-1"]) == 2
    assert "epsilon" in capsys.readouterr().err


def test_console_entry_point():
    out = subprocess.run([sys.executable, "-m", "sparsedp", "--help"], capture_output=True, text=True, check=True)
    assert "usage: sparsedp" in out.stdout
