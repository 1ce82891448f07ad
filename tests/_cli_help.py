"""Test helper (not collected): a subcommand's ``--help`` text, in process.

``cli_help(argv, monkeypatch, capsys)`` runs the parser ``python -m sparsedp`` builds
(:func:`sparsedp.cli.main`) on ``argv`` (e.g. ``["optimize", "--help"]``) at ``COLUMNS=80``, the
width a non-terminal subprocess gets, checks that argparse exits with code 0 and returns what it
printed.  In process saves a ~2-5 s interpreter start with every import; tests/test_cli.py runs the
entry point itself in a subprocess.
"""

from __future__ import annotations

import pytest

from sparsedp.cli import main


def cli_help(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "80")
    capsys.readouterr()  # drop anything printed before
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    assert exc.value.code == 0
    return capsys.readouterr().out
