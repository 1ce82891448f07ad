"""An empirical differential-privacy auditor: a statistical lower bound on a release's epsilon.

For a release ``R`` and neighbouring inputs ``x, x'``, every event ``S`` satisfies
``P[R(x) in S] <= e^eps P[R(x') in S] + delta`` if ``R`` is ``(eps, delta)``-DP.  So a pair of
confidence bounds, ``p_lo <= P[R(x) in S]`` and ``q_hi >= P[R(x') in S]``, gives
``eps >= ln((p_lo - delta) / q_hi)`` with the joint confidence of the two bounds (``delta = 0``
for pure DP).  The auditor (in the spirit of DP-Sniper, Bichsel et al., IEEE S&P 2021, and the
statistical testers of Ding et al., CCS 2018):

1. splits the ``trials`` per input into a *selection* part and a *held-out* part (half each by
   default), drawn independently;
2. on the selection part only, projects every output onto candidate directions -- each output
   coordinate and the difference of the two selection means -- and onto an orthant statistic
   (the smallest standardized shift over the coordinates whose means differ; its threshold events
   are orthants, the events of largest ratio for independent Laplace noise), and scores threshold
   events ``{stat > t}`` / ``{stat < t}`` at quantile thresholds (log-spaced into both tails, so rare
   events with large ratios are tried) by the Clopper-Pearson bound they give on the selection
   part itself (at confidence ``1 - 10^-3``, which penalises rare events whose selection counts
   are lucky), keeping the best (both orders of ``x, x'``);
3. on the held-out part, counts the one chosen event and returns Clopper-Pearson bounds
   (``alpha / 2`` each side, so the bound holds with probability ``>= 1 - alpha``) and
   ``epsilon_lower = ln((p_lo - delta) / q_hi)``.

The event is a function of the selection draws alone, which are independent of the held-out
draws, so the held-out counts are binomial given the event: the bound is valid however hard the
search looked.

**Two release protocols.**  ``release(data, generator)`` returns one output vector (called once
per trial; the original API).  With ``batched=True``, ``release(data, generator, k)`` returns a
``(k, d)`` array of ``k`` independent outputs, which is how a million trials take seconds:
:func:`plan_release` builds such a release from a :class:`~sparsedp.measure.MeasurementPlan`
(the noise is drawn by the plan's own ``measure``: the measurement path stays the only noise
drawer).  Outputs are drawn ``chunk`` trials at a time; the held-out part is counted chunk by chunk
and never stored, so memory is ``O((selection trials + chunk) d)``.

**What it can and cannot prove.**  A lower bound above the claimed epsilon is evidence, at
confidence ``1 - alpha``, that the release is *not* as private as claimed (a calibration bug).  A
bound below the claim proves nothing about the upper bound: an auditor only finds violations it
has the events and the samples to see (its events are thresholds on linear projections and on
one orthant statistic; the neighbouring pair is the caller's choice; ``eps`` near the claim needs events of probability
``>> 1 / trials``).  Auditing a deliberately broken copy (noise halved, so twice the claimed loss)
shows whether the test *could* have seen a violation of that size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import scipy.sparse as sp
from scipy import stats

from .errors import SparseDPError

__all__ = ["AuditResult", "audit", "clopper_pearson", "plan_release"]

_MAX_BLOCK_ENTRIES = 1 << 22  # plan_release: entries of one block-diagonal copy (memory bound)
# events are scored on the selection part at this stricter confidence: among hundreds of candidates,
# rare events with lucky counts look best at alpha = 0.05 and then fail on the held-out part
_SELECTION_ALPHA = 1e-3


@dataclass(frozen=True)
class AuditResult:
    """The outcome of :func:`audit`."""

    epsilon_lower: float  # ln((p_lo - delta) / q_hi), or 0 if no event separates the outputs
    p_hat: float  # frequency of the event under the input it favours (held-out part)
    q_hat: float  # under the other input
    p_lower: float
    q_upper: float
    event: str  # description of the chosen event
    trials: int  # per input (selection + held-out)
    alpha: float
    delta: float = 0.0  # the delta subtracted (0: a pure-DP bound)
    selection_trials: int = 0  # per input, used only to choose the event
    held_out_trials: int = 0  # per input, used only for the bound


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact two-sided ``1 - alpha`` binomial confidence interval for ``k`` successes in ``n``."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _cp_lower(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        lo = stats.beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1)
    return np.where(k > 0, lo, 0.0)


def _cp_upper(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        hi = stats.beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1))
    return np.where(k < n, hi, 1.0)


# ---- drawing outputs ------------------------------------------------------------------------------

def _as_rows(out: Any, k: int) -> np.ndarray:
    arr = np.asarray(out, dtype=np.float64)
    arr = arr.reshape(k, -1) if arr.ndim != 2 or arr.shape[0] != k else arr
    if not np.all(np.isfinite(arr)):
        raise SparseDPError("the release produced non-finite outputs")
    return arr


def _chunks(release: Callable[..., Any], data: Any, count: int, gen: np.random.Generator, batched: bool,
            chunk: int) -> Iterator[np.ndarray]:
    """``count`` outputs of ``release(data)``, ``chunk`` trials at a time, as ``(k, d)`` arrays."""
    done = 0
    while done < count:
        k = min(chunk, count - done)
        if batched:
            arr = _as_rows(release(data, gen, k), k)
        else:
            arr = _as_rows(
                np.vstack([np.atleast_1d(np.asarray(release(data, gen), dtype=np.float64)).ravel() for _ in range(k)]),
                k)
        done += k
        yield arr


# ---- choosing the event (selection part) -----------------------------------------------------------

@dataclass(frozen=True)
class _Event:
    score: float  # the event's bound on the selection part
    project: Callable[[np.ndarray], np.ndarray]  # (k, d) outputs -> (k,) statistic
    sign: float
    threshold: float
    swap: bool  # True: the event is more likely under x_prime
    name: str


def _levels(n: int) -> np.ndarray:
    """Quantile levels: log-spaced into both tails down to ~5 / n, and uniform in the middle."""
    f0 = min(0.25, 5.0 / n)
    tail = np.geomspace(f0, 0.5, 48)
    return np.unique(np.concatenate([tail, 1.0 - tail, np.linspace(0.02, 0.98, 49)]))


def _directions(Sa: np.ndarray, Sb: np.ndarray, max_coordinates: int = 256) -> tuple[np.ndarray, list[str]]:
    """Unit directions: output coordinates (the ``max_coordinates`` with the largest standardized
    mean difference when there are more) and the difference of the two selection means."""
    dim = Sa.shape[1]
    diff = Sa.mean(axis=0) - Sb.mean(axis=0)
    if dim == 1:
        return np.ones((1, 1)), ["coordinate 0"]
    coords = np.arange(dim)
    if dim > max_coordinates:
        spread = np.sqrt(0.5 * (Sa.var(axis=0) + Sb.var(axis=0))) + 1e-300
        coords = np.sort(np.argsort(-np.abs(diff) / spread)[:max_coordinates])
    eye = np.zeros((coords.size, dim))
    eye[np.arange(coords.size), coords] = 1.0
    norm = float(np.linalg.norm(diff))
    dirs = np.vstack([eye, diff[None, :] / (norm or 1.0)])
    return dirs, [f"coordinate {c}" for c in coords] + ["mean difference"]


def _orthant(Sa: np.ndarray, Sb: np.ndarray, z_min: float = 4.0, most: int = 64):
    """A non-linear candidate from the selection part: ``min_i s_i (R_i - mb_i) / |m_i|`` over the
    coordinates whose means differ significantly (``|m_i| > z_min`` standard errors, at most
    ``most``; ``m = mean_a - mean_b``, ``s = sign m``, ``mb`` the second input's means).  Its
    threshold events are orthants along the mean shift, ``{s_i (R_i - mb_i) > t |m_i| for all i}``:
    for independent Laplace noise the orthant beyond the shift has probability ratio exactly
    ``e^loss``, which no linear projection of several coordinates reaches.  ``None`` if fewer than
    two coordinates qualify (a coordinate direction is then the same event)."""
    ma, mb = Sa.mean(axis=0), Sb.mean(axis=0)
    m = ma - mb
    se = np.sqrt(Sa.var(axis=0) / Sa.shape[0] + Sb.var(axis=0) / Sb.shape[0]) + 1e-300
    z = np.abs(m) / se
    T = np.flatnonzero(z > z_min)
    if T.size < 2:
        return None
    T = np.sort(T[np.argsort(-z[T])[:most]])
    sgn, base, width = np.sign(m[T]), mb[T], np.abs(m[T])
    return lambda R: np.min(sgn * (R[:, T] - base) / width, axis=1)


def _best_event(Sa: np.ndarray, Sb: np.ndarray, alpha: float, delta: float) -> _Event | None:
    """On the selection part: the threshold event with the largest Clopper-Pearson bound
    ``ln((p_lo - delta) / q_hi)``, over the candidate statistics (directions and the orthant
    statistic), both signs and both orders of the inputs.  Counts for all thresholds at once by
    sorting (``O(n log n)`` per candidate)."""
    na, nb = Sa.shape[0], Sb.shape[0]
    dirs, names = _directions(Sa, Sb)
    candidates: list[tuple[Callable[[np.ndarray], np.ndarray], str]] = [
        ((lambda R, v=v: R @ v), f"<{name}, R>") for v, name in zip(dirs, names)]
    orth = _orthant(Sa, Sb)
    if orth is not None:
        candidates.append((orth, "orthant statistic"))
    levels = _levels(min(na, nb))
    best: _Event | None = None
    for project, name in candidates:
        a, b = project(Sa), project(Sb)
        for sign in (1.0, -1.0):
            sa, sb = np.sort(sign * a), np.sort(sign * b)
            t = np.unique(np.quantile(np.concatenate([sa, sb]), levels))
            ka = na - np.searchsorted(sa, t, side="right")  # #{sa > t}
            kb = nb - np.searchsorted(sb, t, side="right")
            for swap, kp, np_, kq, nq in ((False, ka, na, kb, nb), (True, kb, nb, ka, na)):
                p_lo = _cp_lower(kp, np_, alpha) - delta
                q_hi = _cp_upper(kq, nq, alpha)
                with np.errstate(divide="ignore", invalid="ignore"):
                    score = np.where(p_lo > 0, np.log(np.maximum(p_lo, 1e-300) / q_hi), -np.inf)
                i = int(np.argmax(score))
                if math.isfinite(score[i]) and (best is None or score[i] > best.score):
                    best = _Event(float(score[i]), project, sign, float(t[i]), swap, name)
    return best


def _count(chunks: Iterator[np.ndarray], ev: _Event) -> tuple[int, int]:
    k = n = 0
    for arr in chunks:
        k += int(np.count_nonzero(ev.sign * ev.project(arr) > ev.threshold))
        n += arr.shape[0]
    return k, n


def audit(
    release: Callable[..., Any],
    x: Any,
    x_prime: Any,
    *,
    trials: int = 20000,
    alpha: float = 0.05,
    rng: Any = None,
    batched: bool = False,
    delta: float = 0.0,
    chunk: int = 65536,
    selection: float = 0.5,
) -> AuditResult:
    """A ``1 - alpha`` lower bound on the epsilon of ``release`` from ``x`` against ``x_prime``.

    ``release(data, generator)`` must return the released vector (noise drawn from
    ``generator``, a seeded :class:`numpy.random.Generator` so runs are reproducible); with
    ``batched=True``, ``release(data, generator, k)`` returns a ``(k, d)`` array of ``k``
    independent releases (see :func:`plan_release`).  ``trials`` per input are split into
    ``selection * trials`` draws that choose the event and the rest, which bound it.  ``delta > 0``
    gives an ``(eps, delta)`` bound, ``ln((p_lo - delta) / q_hi)``, for approximate-DP (e.g. zCDP
    converted) claims.  See the module docstring for the method and what the bound means."""
    if trials < 200:
        raise SparseDPError("an audit needs at least 200 trials per input")
    if not 0 < alpha < 1:
        raise SparseDPError("alpha must lie in (0, 1)")
    if not 0 <= delta < 1:
        raise SparseDPError("delta must lie in [0, 1)")
    if not 0 < selection < 1:
        raise SparseDPError("selection must lie in (0, 1)")
    chunk = max(1, int(chunk))
    gen = np.random.default_rng(rng)
    n_sel = min(max(int(trials * selection), 100), trials - 100)
    n_hold = trials - n_sel

    def draw(data: Any, count: int) -> Iterator[np.ndarray]:
        return _chunks(release, data, count, gen, batched, chunk)

    Sa = np.vstack(list(draw(x, n_sel)))
    Sb = np.vstack(list(draw(x_prime, n_sel)))
    if Sa.shape[1] != Sb.shape[1]:
        raise SparseDPError("the two inputs give outputs of different lengths")
    ev = _best_event(Sa, Sb, min(alpha, _SELECTION_ALPHA), delta)
    del Sa, Sb
    if ev is None:
        return AuditResult(0.0, 0.0, 0.0, 0.0, 1.0, "none", trials, alpha, delta, n_sel, n_hold)
    k_a, n_a = _count(draw(x, n_hold), ev)
    k_b, n_b = _count(draw(x_prime, n_hold), ev)
    (k_p, n_p), (k_q, n_q) = ((k_b, n_b), (k_a, n_a)) if ev.swap else ((k_a, n_a), (k_b, n_b))
    p_lo, _ = clopper_pearson(k_p, n_p, alpha)
    _, q_hi = clopper_pearson(k_q, n_q, alpha)
    eps = math.log((p_lo - delta) / q_hi) if p_lo > delta else 0.0
    event = (f"{'+' if ev.sign > 0 else '-'}{ev.name} > {ev.threshold:g} "
             f"(more likely under {'x_prime' if ev.swap else 'x'})")
    return AuditResult(max(eps, 0.0), k_p / n_p, k_q / n_q, p_lo, q_hi, event, trials, alpha, delta, n_sel, n_hold)


# ---- batched releases from a measurement plan ------------------------------------------------------

def _replicate(plan: Any, k: int) -> Any:
    """``k`` independent copies of ``plan`` as one block-diagonal plan: measuring ``tile(x, k)``
    with it draws, through the plan's own :meth:`~sparsedp.measure.MeasurementPlan.measure`, the
    noise of ``k`` independent measurements of ``x`` (same grid, same per-row scales and factors).
    For auditing only: its charge is one plan's, not ``k``."""
    from .operators import SparseOperator  # local: keep the auditor importable without the path

    A = sp.csr_matrix(plan.measured.tosparse(), dtype=np.float64)
    block = SparseOperator(sp.kron(sp.identity(k, format="csr"), A, format="csr"),
                           name=f"{plan.strategy.name} x {k} audit trials")
    rf = None if plan.row_factors is None else np.tile(plan.row_factors, k)
    return dataclasses.replace(plan, strategy=block, measured=block, scales=np.tile(plan.scales, k),
                               unit_scales=np.tile(plan.unit_scales, k), row_factors=rf)


def plan_release(
    plan: Any, statistic: Callable[[np.ndarray], Any] | None = None, *, counts: bool = True
) -> Callable[[Any, np.random.Generator, int], np.ndarray]:
    """A batched release (``audit(..., batched=True)``) of a :class:`~sparsedp.measure.MeasurementPlan`:
    ``release(x, generator, k)`` measures ``x`` ``k`` independent times and returns the ``(k, rows)``
    noisy answers, or ``statistic(Y)`` (a vectorised post-processing: ``(k, rows) -> (k, d)``).

    The noise is drawn by the plan's own ``measure`` (on a block-diagonal copy of the plan, so one
    call draws up to ``k``; the measurement path stays the only noise drawer), with the plan's
    validation (``counts=False`` for non-count data).  A copy holds at most about ``2^22``
    matrix entries (larger ``k`` is drawn in several calls), so memory stays bounded for big plans.
    No accountant is charged: this is a test harness, and the copy's ledger cost is one plan's."""
    cache: dict[int, Any] = {}
    A = plan.measured
    # block-diagonal copies hold k (nnz + rows + columns) numbers: at most ~2^22 per call
    per_trial = int(sp.csr_matrix(A.tosparse()).nnz) + int(A.shape[0]) + int(A.shape[1])
    most = max(1, _MAX_BLOCK_ENTRIES // max(per_trial, 1))

    def block(x: np.ndarray, gen: np.random.Generator, k: int) -> np.ndarray:
        rep = cache.get(k)
        if rep is None:
            if len(cache) >= 4:
                cache.clear()
            rep = cache[k] = _replicate(plan, k)
        Y = rep.measure(np.tile(x, k), rng=gen, counts=counts).y
        return np.asarray(Y, dtype=np.float64).reshape(k, plan.rows)

    def release(x: Any, gen: np.random.Generator, k: int) -> np.ndarray:
        xv = np.asarray(x, dtype=np.float64).ravel()
        parts, done = [], 0
        while done < k:
            j = min(most, k - done)
            Y = block(xv, gen, j)
            parts.append(Y if statistic is None else np.asarray(statistic(Y), dtype=np.float64).reshape(j, -1))
            done += j
        return parts[0] if len(parts) == 1 else np.vstack(parts)

    return release
