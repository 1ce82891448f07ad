"""Intervals for the published integer counts of a TopDown release.

The published count of a cell is the GLS estimate ``e`` (exact variance ``v``) moved to a
non-negative integer consistent with its parent.  The true count ``x`` is an integer >= 0 and
``e - x`` is the (Gaussian or discrete-Gaussian) noise carried through the GLS, so
``[e - z sqrt(v), e + z sqrt(v)]`` covers ``x`` with probability ``level``.  Because ``x`` is an
integer >= 0, the integers ``max(0, ceil(e - z sqrt(v))) .. floor(e + z sqrt(v))`` cover it exactly as
often, with a shorter interval that never reaches below 0; the interval is then widened, if needed,
to contain the published count itself.  Computed from the published estimate, variances and
counts only: post-processing of the release, no data read.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..accuracy import ErrorReport

#: slack against floating error in the ends before rounding them to integers
_EPS = 1e-9


def count_intervals(counts: np.ndarray, estimate: np.ndarray, half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer ``(lower, upper)`` for the published ``counts``: the integers of the estimate's
    interval ``estimate +- half`` (floor/ceil inward, exact for integer truths), clipped at 0 and
    widened to contain the published count."""
    c = np.asarray(counts, dtype=np.float64)
    e = np.asarray(estimate, dtype=np.float64)
    lo = np.maximum(np.ceil(e - half - _EPS), 0.0)
    hi = np.maximum(np.floor(e + half + _EPS), 0.0)
    return np.minimum(lo, c), np.maximum(hi, c)


class CountErrorReport(ErrorReport):
    """The GLS estimate's :class:`~sparsedp.accuracy.ErrorReport` whose
    :meth:`confidence_intervals` gives :func:`count_intervals` for the published counts (any
    ``method``: its half-widths are the estimate's)."""

    def __init__(self, base: ErrorReport, estimate: np.ndarray) -> None:
        super().__init__(base.total, base.per_query, base.method, base.stderr, base.variances, base.noise,
                         base.secure, base.shape)
        object.__setattr__(self, "_estimate", np.asarray(estimate, dtype=np.float64))

    def confidence_intervals(self, answers: Any, level: float = 0.95,
                             method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """Integer, non-negative ``(lower, upper)`` around the published counts ``answers``."""
        a = np.asarray(answers, dtype=np.float64)
        lo, hi = super().confidence_intervals(a, level, method)  # shape checks; estimate-free ends
        half = (hi - lo) / 2.0
        if a.shape[-1:] != self._estimate.shape:
            return lo, hi
        return count_intervals(a, self._estimate, half)


def count_report(variances: np.ndarray, estimate: np.ndarray, noise: str | None, secure: bool) -> CountErrorReport:
    """The report a TopDown :class:`~sparsedp.releases.ReleaseResult` carries: the GLS estimate's
    exact ``variances`` (as a report made from them would be) with count intervals."""
    var = np.asarray(variances, dtype=np.float64)
    total = float(var.sum())
    base = ErrorReport(total, total / max(var.size, 1), "gls", variances=var, noise=noise, secure=bool(secure))
    return CountErrorReport(base, estimate)
