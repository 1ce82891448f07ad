"""An empirical differential-privacy auditor: a statistical lower bound on a release's epsilon.

For a release ``R`` and neighbouring inputs ``x, x'``, every event ``S`` satisfies
``P[R(x) in S] <= e^eps P[R(x') in S]`` if ``R`` is ``eps``-DP.  So a pair of confidence bounds,
``p_lo <= P[R(x) in S]`` and ``q_hi >= P[R(x') in S]``, gives ``eps >= ln(p_lo / q_hi)`` with the
joint confidence of the two bounds.  The auditor (in the spirit of DP-Sniper, Bichsel et al.,
IEEE S&P 2021, and the statistical testers of Ding et al., CCS 2018):

1. draws ``trials`` outputs of ``R(x)`` and of ``R(x')``;
2. on the first half (selection), projects every output onto candidate directions -- each output
   coordinate and the difference of the two sample means -- and scores threshold events
   ``{<v, R> > t}`` / ``{<v, R> < t}`` at quantile thresholds by their empirical log ratio,
   keeping the best (both orders of ``x, x'``);
3. on the held-out half, counts the chosen event and returns Clopper-Pearson bounds
   (``alpha / 2`` each side, so the bound holds with probability ``>= 1 - alpha``) and
   ``epsilon_lower = ln(p_lo / q_hi)``.

What it can and cannot prove: a lower bound above the claimed epsilon is evidence of a privacy
bug (with confidence ``1 - alpha``); a bound below it proves nothing about the upper bound -- an
auditor only finds violations it has the events and the samples to see.  Selecting the event on
data independent of the counted half keeps the bound valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import stats

from .errors import SparseDPError

__all__ = ["AuditResult", "audit", "clopper_pearson"]


@dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`audit`."""

    epsilon_lower: float  # ln(p_lo / q_hi), or 0 if no event separates the outputs
    p_hat: float  # frequency of the event under the first input (held-out half)
    q_hat: float  # under the second input
    p_lower: float
    q_upper: float
    event: str  # description of the chosen event
    trials: int  # per input
    alpha: float


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided ``1 - alpha`` binomial confidence interval for ``k`` successes in ``n``."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _outputs(release: Callable[..., Any], x: Any, trials: int, gen: np.random.Generator) -> np.ndarray:
    rows = [np.atleast_1d(np.asarray(release(x, gen), dtype=np.float64)).ravel() for _ in range(trials)]
    out = np.vstack(rows)
    if not np.all(np.isfinite(out)):
        raise SparseDPError("the release produced non-finite outputs")
    return out


def _best_event(A: np.ndarray, B: np.ndarray, directions: np.ndarray, min_count: int) -> tuple[float, int, float, int]:
    """On selection samples: the (score, direction, threshold, sign) maximising ln(p / q)."""
    best = (-math.inf, 0, 0.0, 1)
    qs = np.linspace(0.01, 0.99, 33)
    for d in range(directions.shape[0]):
        a, b = A @ directions[d], B @ directions[d]
        for sign in (1, -1):
            sa, sb = sign * a, sign * b
            for t in np.unique(np.quantile(sb, qs)):
                p = np.count_nonzero(sa > t)
                q = np.count_nonzero(sb > t)
                if p < min_count:
                    continue
                score = math.log(p / len(sa)) - math.log(max(q, 1) / len(sb))
                if score > best[0]:
                    best = (score, d, float(t), sign)
    return best


def audit(
    release: Callable[[Any, np.random.Generator], Any],
    x: Any,
    x_prime: Any,
    *,
    trials: int = 20000,
    alpha: float = 0.05,
    rng: Any = None,
) -> AuditResult:
    """A ``1 - alpha`` lower bound on the epsilon of ``release`` from ``x`` against ``x_prime``.

    ``release(data, generator)`` must return the released vector (noise drawn from
    ``generator``, a seeded :class:`numpy.random.Generator` so runs are reproducible).  See the
    module docstring for the method and what the bound means."""
    if trials < 200:
        raise SparseDPError("an audit needs at least 200 trials per input")
    if not 0 < alpha < 1:
        raise SparseDPError("alpha must lie in (0, 1)")
    gen = np.random.default_rng(rng)
    A = _outputs(release, x, trials, gen)
    B = _outputs(release, x_prime, trials, gen)
    if A.shape[1] != B.shape[1]:
        raise SparseDPError("the two inputs give outputs of different lengths")
    half = trials // 2
    sel_a, sel_b, hold_a, hold_b = A[:half], B[:half], A[half:], B[half:]
    dim = A.shape[1]
    diff = sel_a.mean(axis=0) - sel_b.mean(axis=0)
    directions = np.vstack([np.eye(dim), diff[None, :] / (np.linalg.norm(diff) or 1.0)]) if dim > 1 else np.eye(1)
    min_count = max(10, half // 1000)
    forward = _best_event(sel_a, sel_b, directions, min_count)
    backward = _best_event(sel_b, sel_a, directions, min_count)
    swap = backward[0] > forward[0]
    score, d, t, sign = backward if swap else forward
    P, Q = (hold_b, hold_a) if swap else (hold_a, hold_b)
    if not math.isfinite(score):
        return AuditResult(0.0, 0.0, 0.0, 0.0, 1.0, "none", trials, alpha)
    k_p = int(np.count_nonzero(sign * (P @ directions[d]) > t))
    k_q = int(np.count_nonzero(sign * (Q @ directions[d]) > t))
    p_lo, _ = clopper_pearson(k_p, P.shape[0], alpha)
    _, q_hi = clopper_pearson(k_q, Q.shape[0], alpha)
    eps = math.log(p_lo / q_hi) if p_lo > 0 else 0.0
    name = f"coordinate {d}" if d < dim else "mean difference"
    event = f"{'+' if sign > 0 else '-'}<{name}, R> > {t:g} (more likely under {'x_prime' if swap else 'x'})"
    return AuditResult(max(eps, 0.0), k_p / P.shape[0], k_q / Q.shape[0], p_lo, q_hi, event, trials, alpha)
