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


# -- library loops: bars only inside a command (issue 15) ------------------------------------------

def test_loop_disable_is_on_only_inside_a_command():
    from sparsedp.progress import command_progress, loop_disable

    assert loop_disable() is True
    with command_progress():
        assert loop_disable() is None
        with command_progress(False):
            assert loop_disable() is True
        assert loop_disable() is None
    assert loop_disable() is True


def _flows_case(seed=2):
    from sparsedp.flows import conservation_system, flow_counts, random_trips, road_grid

    road = road_grid(6, 7, seed=1)
    x = flow_counts(road, random_trips(road, 150, seed=seed, max_edges=5))
    system = conservation_system(road)
    return x + np.random.default_rng(7).normal(0, 3, x.size), system


def _library_runs():
    """One short run of every library loop that reports progress: flows CG and alternating
    projections, a completion method, the optimiser."""
    from sparsedp import optimize
    from sparsedp import workloads as wl
    from sparsedp.completion import lmafit_sor, synthetic_problem
    from sparsedp.flows import project

    noisy, system = _flows_case()
    cg = project(noisy, system, method="cg", tol=1e-9)
    alt = project(noisy, system, method="alternating", tol=1e-6)
    observed, _ = synthetic_problem(40, 30, rank=2, p=0.5, noise_scale=0.1, rng=1)
    comp = lmafit_sor(observed, 2, max_iter=20, rng=0)
    opt = optimize(wl.prefix(16), family="tree", rng=0)
    return cg, alt, comp, opt


def test_library_loops_draw_inside_a_command_on_a_terminal_only(monkeypatch):
    import sparsedp.progress as progress

    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "MININTERVAL", 0.0)
    import sparsedp.flows.solve as flows_solve

    import importlib

    search = importlib.import_module("sparsedp.optimize.search")  # sparsedp.optimize is also a function

    monkeypatch.setattr(flows_solve, "PROGRESS_EVERY", 0.0)  # a CG residual at every step
    monkeypatch.setattr(search, "_BAR_EVERY", 0.0)  # the optimiser's bar at every evaluation
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    quiet = _library_runs()  # a library call from a program: never a bar
    assert term.getvalue() == ""
    with progress.command_progress():
        loud = _library_runs()
    text = term.getvalue()
    for desc in ("CG + Jacobi", "alternating projections", "completion", "optimise"):
        assert desc in text
    assert "residual" in text and "eval" in text and "best" in text
    cg_lines = [line for line in text.replace("\r", "\n").splitlines() if line.startswith("CG + Jacobi")]
    assert any("residual" in line for line in cg_lines)
    # the bars change nothing: same iterations, same answers
    assert loud[0].iterations == quiet[0].iterations and np.allclose(loud[0].x, quiet[0].x)
    assert loud[1].iterations == quiet[1].iterations
    assert loud[2].iterations == quiet[2].iterations and np.allclose(loud[2].left, quiet[2].left)
    assert loud[3].error.total == quiet[3].error.total
    # inside a command but not on a terminal: nothing
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    with progress.command_progress():
        _library_runs()
    assert plain.getvalue() == ""


def test_cli_runs_its_work_inside_command_progress(monkeypatch):
    import sparsedp.cli as cli
    from sparsedp.progress import loop_disable

    seen = []

    def fake(args):
        seen.append(loop_disable())
        return 0

    monkeypatch.setattr(cli, "_error", fake)
    assert cli.main(["error"]) == 0 and seen == [None]
    assert loop_disable() is True
