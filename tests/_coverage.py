"""Test helper (not collected): empirical coverage of confidence intervals over repeated releases.

``inside`` is a boolean array, one row per independent release (fixed seeds: every check is
deterministic), one column per answer.  Answers of one release share noise, so the pairs are not
independent; the releases are.  The standard error of the coverage is therefore taken from the
per-release means (their standard deviation over ``sqrt(releases)``), which holds whatever the
correlation between answers.

* :func:`assert_default_coverage`: the default intervals (``method="auto"``) must cover within the
  target of issue 27, ``[0.945, 0.965]`` at 95%, widened by four standard errors (the widening only
  keeps a change of seed from failing it; four standard errors of a mean of ``R`` releases are at
  most ``4 sqrt(0.0475 / R)``: 0.028 at ``R = 1000``, less when the answers are not fully
  correlated).
* :func:`assert_certified_coverage`: certified intervals (``"exact-tail"``, ``"chebyshev"``, float
  Laplace ``"laplace"``) must cover at least ``level`` less three standard errors.
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95
#: issue 27's target for the default 95% intervals
DEFAULT_WINDOW = (0.945, 0.965)


def coverage(inside) -> tuple[float, float]:
    """``(coverage over all pairs, its standard error from the per-release means)``."""
    a = np.asarray(inside, dtype=np.float64)
    a = a.reshape(a.shape[0], -1)
    per = a.mean(axis=1)
    se = float(per.std(ddof=1) / math.sqrt(per.size)) if per.size > 1 else 0.0
    return float(per.mean()), se


def assert_default_coverage(inside, label: str = "", window: tuple[float, float] = DEFAULT_WINDOW) -> float:
    cov, se = coverage(inside)
    lo, hi = window
    assert lo - 4 * se <= cov <= hi + 4 * se, f"{label}: default intervals cover {cov:.4f} (s.e. {se:.4f})"
    return cov


def assert_certified_coverage(inside, level: float = LEVEL, label: str = "") -> float:
    cov, se = coverage(inside)
    assert cov >= level - 3 * se, f"{label}: certified intervals cover {cov:.4f} (s.e. {se:.4f}) < {level}"
    return cov
