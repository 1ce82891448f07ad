"""sparsedp.progress: tqdm bars that draw on a terminal only, and the solver callback."""

from __future__ import annotations

import io
import math
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp.consistency import LinearConstraints, solve
from sparsedp.progress import SolverProgress, disabled_by_env, progress_bar


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)


def test_draws_on_a_terminal():
    out = Terminal()
    with progress_bar(total=3, desc="chunks", file=out, delay=0, leave=True) as bar:
        bar.update(3)
    assert "chunks" in out.getvalue() and "3/3" in out.getvalue()


def test_silent_when_not_a_terminal():
    out = io.StringIO()
    with progress_bar(total=3, file=out, delay=0) as bar:
        bar.update(3)
    assert bar.disable and out.getvalue() == ""


def test_default_stream_is_stderr_at_creation(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    for _ in progress_bar(range(4), desc="loop", delay=0, leave=True):
        pass
    assert "loop" in term.getvalue() and "4/4" in term.getvalue()


def test_quick_runs_print_nothing():
    out = Terminal()
    with progress_bar(total=3, file=out) as bar:  # default delay: 1 s
        bar.update(3)
    assert out.getvalue() == ""


def test_environment_and_explicit_disable(monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    out = Terminal()
    with progress_bar(total=2, file=out, delay=0) as bar:
        bar.update(2)
    assert out.getvalue() == ""
    forced = io.StringIO()  # disable=False draws even off a terminal, whatever the environment says
    with progress_bar(total=2, file=forced, delay=0, disable=False, leave=True) as bar:
        bar.update(2)
    assert "2/2" in forced.getvalue()


def test_disabled_by_env_values():
    assert not disabled_by_env({})
    assert not any(disabled_by_env({"TQDM_DISABLE": v}) for v in ("", "0", "false", "No"))
    assert all(disabled_by_env({"TQDM_DISABLE": v}) for v in ("1", "true", "yes"))


def test_solver_fraction_is_monotone_and_reaches_one_at_tol():
    p = SolverProgress(1e-8, disable=True)
    residuals = [1e3, 1.0, 1e-2, 1e-5, 1e-8, 1e-12]
    fractions = [p.fraction(r) for r in residuals]
    assert fractions == sorted(fractions) and 0 < fractions[0] < 0.01
    assert fractions[-2] == pytest.approx(1.0) and fractions[-1] == 1.0
    assert p.fraction(math.nan) == 0.0 and p.fraction(math.inf) == 0.0 and p.fraction(0.0) == 1.0


def test_solver_bar_never_moves_back_and_shows_the_residual():
    out = Terminal()
    with SolverProgress(1e-6, file=out, delay=0) as p:
        p(1, None, 1e-2)
        high = p.steps
        p(2, None, 1.0)  # a residual that went up: the bar stays
        assert p.steps == p.bar.n == high > 0
        p.bar.refresh()
    assert "iteration 2, residual 1.00e+00" in out.getvalue() and p.iterations == 2


@pytest.mark.parametrize("tol", [math.inf, None, 0.0])
def test_unbounded_tolerance_counts_iterations(tol):
    with SolverProgress(tol, disable=True) as p:
        for k in range(1, 6):
            p(k, None, 1.0 / k)
        assert p.steps == 5 and p.bar.total is None


def test_as_a_consistency_callback():
    out = Terminal()
    rng = np.random.default_rng(0)
    C = sp.random(30, 200, density=0.05, random_state=1, format="csr") + sp.eye(30, 200, format="csr")
    b = C @ rng.random(200)
    with SolverProgress(1e-9, file=out, delay=0) as p:
        res = solve(rng.random(200), LinearConstraints(C, b), method="alternating", tol=1e-9, callback=p)
        p.bar.refresh()
    assert res.converged and p.iterations >= 1 and p.steps == p.bar.n > 0
    assert "residual" in out.getvalue()
