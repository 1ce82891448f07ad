"""Progress bars for long commands: tqdm, silent unless the output is a terminal.

Every bar writes to ``sys.stderr`` (looked up when the bar is made, so a redirected stream is
honoured) and follows tqdm's ``disable=None`` rule: it draws only when that stream is a terminal,
so logs, pipes, CI and tests stay clean.  ``TQDM_DISABLE=1`` in the environment turns every bar
off; ``disable=False`` forces one on.  By default a bar appears only after ``delay`` seconds
(1 s), so quick runs print nothing.

* :func:`progress_bar` -- a ``tqdm`` bar (a counter, or a loop with ``iterable=``).
* :class:`SolverProgress` -- a callback ``(iteration, x, residual)`` for the iterative solvers
  (``sparsedp.consistency.solve(..., callback=...)``): the bar advances with
  ``log(1 + 1/residual) / log(1 + 1/tol)`` (digits of the residual gained towards ``tol``) and
  shows the iteration and the residual.

Library loops (the flows projection's CG / alternating sweeps, the completion iterations, the
optimiser's L-BFGS evaluations) make their bars with ``disable=``:func:`loop_disable` ``()``: off
unless they run inside :func:`command_progress`, which the ``sparsedp`` command (and a benchmark
script) wraps around its work.  A library call from a user's program or a test never draws; a
command run on a terminal does.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO

from tqdm import tqdm

__all__ = ["SolverProgress", "command_progress", "disabled_by_env", "loop_disable", "progress_bar"]

DELAY = 1.0  # seconds before a bar appears
MININTERVAL = 0.5  # seconds between redraws
_IN_COMMAND: ContextVar[bool] = ContextVar("sparsedp_progress_in_command", default=False)


@contextmanager
def command_progress(enabled: bool = True) -> Iterator[None]:
    """Within this block the library's own loops may draw bars (on a terminal only); ``sparsedp``
    commands and benchmark scripts run inside it.  ``enabled=False`` silences them again."""
    token = _IN_COMMAND.set(bool(enabled))
    try:
        yield
    finally:
        _IN_COMMAND.reset(token)


def loop_disable() -> bool | None:
    """The ``disable=`` for a bar inside a library loop: ``None`` (tqdm's terminal rule) within
    :func:`command_progress`, ``True`` (never draw) outside it."""
    return None if _IN_COMMAND.get() else True


def disabled_by_env(environ: Any = None) -> bool:
    """Whether ``TQDM_DISABLE`` asks for no bars (any value but empty, ``0`` or ``false``)."""
    value = str((os.environ if environ is None else environ).get("TQDM_DISABLE", "")).strip().lower()
    return value not in ("", "0", "false", "no")


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: float | None = None,
    desc: str | None = None,
    unit: str = "it",
    disable: bool | None = None,
    file: TextIO | None = None,
    delay: float | None = None,
    **kwargs: Any,
) -> tqdm:
    """A tqdm bar on ``file`` (default ``sys.stderr``), drawn only on a terminal (``disable=None``).

    ``disable=True`` never draws, ``False`` always does; ``TQDM_DISABLE`` set in the environment
    wins over ``None``.  ``delay``: seconds before the bar appears (default ``DELAY``, 1 s).
    Other keyword arguments go to ``tqdm``.  Use it as a context manager or
    call ``close()``.
    """
    stream = sys.stderr if file is None else file
    if disable is None and disabled_by_env():
        disable = True
    delay = DELAY if delay is None else delay
    kwargs.setdefault("mininterval", MININTERVAL)
    kwargs.setdefault("leave", False)
    kwargs.setdefault("dynamic_ncols", True)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, file=stream, delay=delay, **kwargs)


class SolverProgress:
    """A solver callback ``(iteration, x, residual)`` showing a tqdm bar of the residual's progress.

    ``done = log10(1 + 1/residual) / log10(1 + 1/tol)`` in ``[0, 1]`` (the share of the residual's
    decades gained towards ``tol``; it never moves back), shown in thousandths; the postfix carries the
    iteration and the residual.  With ``tol`` ``None`` or not a finite positive number the bar just
    counts iterations.  Call :meth:`close` (or use ``with``) when the solve returns.
    """

    STEPS = 1000

    def __init__(self, tol: float | None, *, desc: str = "solve", disable: bool | None = None,
                 file: TextIO | None = None, delay: float | None = None) -> None:
        self.tol = math.inf if tol is None else float(tol)
        self.bounded = math.isfinite(self.tol) and self.tol > 0
        self.bar = progress_bar(total=self.STEPS if self.bounded else None, desc=desc,
                                unit="it" if not self.bounded else "", disable=disable, file=file, delay=delay,
                                bar_format=None if not self.bounded else "{desc}: {percentage:3.0f}%|{bar}| {postfix}")
        self.iterations = 0
        self.steps = 0  # the bar's position (kept here too: a disabled tqdm bar does not count)

    def fraction(self, residual: float) -> float:
        """The share of the way from residual ``inf`` to ``tol`` (``0`` for a NaN / infinite residual)."""
        if not self.bounded or not (residual > 0 and math.isfinite(residual)):
            return 1.0 if self.bounded and residual == 0 else 0.0
        return min(1.0, max(0.0, math.log10(1.0 + 1.0 / residual) / math.log10(1.0 + 1.0 / self.tol)))

    def __call__(self, iteration: int, x: Any, residual: float) -> None:
        self.iterations = int(iteration)
        step = 1
        if self.bounded:
            step = max(0, int(self.STEPS * self.fraction(float(residual))) - self.steps)
        if step:
            self.steps += step
            self.bar.update(step)
        self.bar.set_postfix_str(f"iteration {iteration}, residual {float(residual):.2e}", refresh=False)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> SolverProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
