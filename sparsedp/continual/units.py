"""Continual counters per privacy unit: the increments of a stream of records, and the sensitivity
of a counter's strategy to one whole unit.

Records.  Each record is one row ``(step, unit id)``: it adds 1 to the increment of its step
(steps ``1 .. N``).  A unit (a person, a customer) may have many rows; :func:`unit_increments`
truncates each unit's rows to the declared bounds with the steps as the groups
(:func:`sparsedp.privacy_unit.unit_histogram`): at most ``max_groups = g`` steps per unit, at most
``max_rows_per_group = r`` rows in each, and at most ``max_rows = k`` rows in all (``k`` alone: the
``k`` rows may all fall in one step).  Removing one unit from the truncated records then changes the
increment vector ``a`` by ``d`` with ``0 <= d_s <= r``, at most ``g`` non-zero entries and
``sum_s d_s <= k`` (``r = k``, ``g = N`` when only ``k`` is declared).

Sensitivity.  A counter measures ``A a + z`` with ``A`` non-negative (the weighted Fenwick nodes).
For a feasible ``d`` (all entries of one sign), ``||A d||_1 = sum_s d_s ||A_s||_1`` exactly and
``||A d||_2 <= sum_s d_s ||A_s||_2`` (triangle inequality), ``A_s`` the column of step ``s``.  The
largest value over the feasible ``d`` is reached greedily (a fractional knapsack with unit sizes):
sort the column norms in decreasing order and give the largest ``r`` each, until ``g`` columns or
``k`` rows are used (:func:`unit_sensitivity`).  That is the sum of the ``g`` largest column norms
times ``r`` when ``k >= g r``, and at most ``k`` times the largest -- often much less: the Fenwick
columns' norms vary (the optimal weights flatten them only in the worst column).  For Laplace noise
the value is the exact largest ``||A d||_1``; for Gaussian noise it is a certified upper bound.

The counter gets this through :func:`sparsedp.measure.plan_measurement`'s ``unit`` factor
``c = S / Delta`` (``Delta`` the largest column norm, ``S`` the bound above), rounded up with a
margin that covers every float64 rounding of the norms (:func:`unit_factor`): the plan's
sensitivity is then ``c Delta_plan >= S``, and the noise is calibrated so that the whole stream
costs the stated budget *per unit*.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..privacy_unit import PrivacyUnit, unit_histogram

__all__ = ["unit_increments", "StreamTruncation", "fenwick_column_norms", "unit_sensitivity", "unit_factor",
           "check_counter_unit"]

_U = 2.0**-53


def check_counter_unit(privacy_unit: Any) -> PrivacyUnit | None:
    """The unit a counter protects: ``None`` for one row; a concrete :class:`PrivacyUnit` else.
    ``max_rows="auto"`` is refused: choosing the bound needs every record up front (use
    :func:`sparsedp.contribution_bound.resolve_unit` on the whole file first)."""
    if privacy_unit is None:
        return None
    if not isinstance(privacy_unit, PrivacyUnit):
        raise SparseDPError(f"privacy_unit must be a PrivacyUnit, got {type(privacy_unit).__name__}")
    if privacy_unit.is_row:
        return None
    if privacy_unit.is_auto:
        raise SparseDPError("a continual counter needs a fixed contribution bound: max_rows='auto' is chosen from "
                            "all the records first (sparsedp.contribution_bound.resolve_unit), which a stream "
                            "does not have; give max_rows or max_groups and max_rows_per_group")
    return privacy_unit


def unit_increments(steps: Any, horizon: int, unit_ids: Any, unit: PrivacyUnit, *, rng: Any = None,
                    drop_missing: bool = False) -> np.ndarray:
    """The per-step increments (int64, length ``horizon``) of records ``(steps[i], unit_ids[i])``
    after each unit's rows are truncated to ``unit``'s bounds, the steps being the groups (module
    doc).  ``steps`` are integers ``1 .. horizon``; a row without a unit id is refused unless
    ``drop_missing`` (how many were dropped is not returned).  The truncation's priorities are secret
    (``rng=None``) or from a seed (reproducible, not private)."""
    from .fenwick import check_horizon

    N = check_horizon(horizon)
    u = check_counter_unit(unit)
    if u is None:
        raise SparseDPError("unit_increments needs a declared privacy unit (a column and its bounds)")
    s = np.asarray(steps)
    if s.ndim != 1:
        raise SparseDPError("steps must be one step number per record")
    if s.size and s.dtype.kind == "f":
        if not np.all(np.isfinite(s)) or np.any(s != np.floor(s)):
            raise SparseDPError("steps must be whole numbers 1 .. horizon (a record has a missing or fractional step)")
        s = s.astype(np.int64)
    elif s.size and s.dtype.kind not in "iu":
        raise SparseDPError(f"steps must be integers 1 .. horizon, got dtype {s.dtype}")
    if s.size and (int(s.min()) < 1 or int(s.max()) > N):
        raise SparseDPError(f"steps must lie in 1 .. {N} (the horizon)")
    if np.asarray(unit_ids).shape != s.shape:
        raise SparseDPError("steps and unit ids must be one value per record")
    cells = s.astype(np.int64) - 1
    return unit_histogram(cells, N, unit_ids, u, rng=rng, drop_missing=drop_missing).astype(np.int64)


class StreamTruncation:
    """Per-unit truncation of records that arrive step by step (a true stream: the records of later
    steps are not known yet).  :meth:`step` takes the unit ids of one step's records (one per
    record) and returns that step's increment: each unit keeps ``min(its rows, r, k - rows kept so
    far)`` of them, and only while it has used fewer than ``g`` steps (``r = k``, no step limit, when
    only ``max_rows = k`` is declared).  Rows of one unit in one step are interchangeable (each adds
    1), so no randomness is needed; first come, first kept.  What a unit keeps depends only on its
    own records, so removing a whole unit changes the increments by one ``d`` the counter is
    calibrated for (module doc): the truncation is stable.

    The per-unit tallies are as secret as the records: :meth:`state` / :meth:`from_state` carry
    them between runs (keep them with the counter's state; a resume without them would let a unit
    contribute its bounds again).  Memory: two integers per unit seen."""

    def __init__(self, unit: PrivacyUnit, *, drop_missing: bool = False) -> None:
        u = check_counter_unit(unit)
        if u is None:
            raise SparseDPError("StreamTruncation needs a declared privacy unit (a column and its bounds)")
        if not isinstance(drop_missing, bool):
            raise SparseDPError(f"drop_missing must be True or False, got {drop_missing!r}")
        self.unit = u
        self.drop_missing = drop_missing
        self._rows: dict[str, int] = {}  # rows kept so far, per unit
        self._steps: dict[str, int] = {}  # steps with a kept row, per unit

    def step(self, unit_ids: Any) -> int:
        """The increment of one step: how many of its records (``unit_ids``, one per record) are
        kept.  A record without an id is refused (before anything changes) unless ``drop_missing``."""
        from ..privacy_unit import _codes

        ids = np.asarray(unit_ids, dtype=object).ravel()
        if ids.size == 0:
            return 0
        _, present = _codes(ids, f"the privacy unit column {self.unit.column!r}", self.drop_missing)
        names, counts = np.unique(ids[present].astype(str), return_counts=True)
        r, g, k = _caps(self.unit, np.iinfo(np.int64).max)
        total = 0
        for name, c in zip(names.tolist(), counts.tolist()):
            used = self._rows.get(name, 0)
            if self._steps.get(name, 0) >= g:
                continue
            kept = min(int(c), r, k - used)
            if kept > 0:
                self._rows[name] = used + kept
                self._steps[name] = self._steps.get(name, 0) + 1
                total += kept
        return total

    def state(self) -> dict[str, Any]:
        """JSON-able tallies (secret: they hold every unit's id and how much it contributed)."""
        return {"privacy_unit": self.unit.describe(), "drop_missing": self.drop_missing,
                "rows": dict(self._rows), "steps": dict(self._steps)}

    @classmethod
    def from_state(cls, state: dict[str, Any], unit: PrivacyUnit) -> "StreamTruncation":
        """Continue from :meth:`state`; ``unit`` must be the one the state was made with."""
        if not isinstance(state, dict) or state.get("privacy_unit") != check_counter_unit(unit).describe():
            raise SparseDPError("the truncation state was made for another privacy unit (or is malformed)")
        obj = cls(unit, drop_missing=bool(state.get("drop_missing", False)))
        try:
            rows = {str(a): int(b) for a, b in state["rows"].items()}
            steps = {str(a): int(b) for a, b in state["steps"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SparseDPError(f"malformed truncation state: {exc!r}") from exc
        r, g, k = _caps(obj.unit, np.iinfo(np.int64).max)
        if set(rows) != set(steps) or any(not (1 <= steps[u] <= min(g, rows[u]) and rows[u] <= min(k, steps[u] * r))
                                          for u in rows):
            raise SparseDPError("malformed truncation state: tallies outside the unit's bounds")
        obj._rows, obj._steps = rows, steps
        return obj


def fenwick_column_norms(weights: Any, p: int) -> np.ndarray:
    """``||A_s||_p^p`` for every column of ``A = diag(w) M_N`` (the Fenwick nodes weighted ``w``):
    column ``s`` (1-based) is covered by the nodes ``s, s + lowbit(s), ...`` up to ``N``, so its
    ``p``-th powers are summed over at most ``floor(log2 N) + 1`` terms, vectorised level by level
    (``O(N log N)``).  Exact for integer weights; with float weights each sum has a relative error
    of at most ``(log2 N + 3) 2^-53`` (covered by :func:`unit_factor`)."""
    w = np.asarray(weights, dtype=np.float64)
    N = w.size
    wp = w if p == 1 else w * w
    out = np.zeros(N, dtype=np.float64)
    idx = np.arange(1, N + 1, dtype=np.int64)
    live = np.ones(N, dtype=bool)
    while live.any():
        cols = np.flatnonzero(live)
        out[cols] += wp[idx[cols] - 1]
        idx[cols] += idx[cols] & -idx[cols]
        live[cols] = idx[cols] <= N
    return out


def _caps(unit: PrivacyUnit, n: int) -> tuple[int, int, int]:
    """``(r, g, k)``: rows per step, steps, rows in all a unit can change (module doc)."""
    if unit.grouped:
        r, g = int(unit.max_rows_per_group), int(unit.max_groups)
        k = int(unit.max_rows) if unit.max_rows is not None else g * r
    else:
        k = int(unit.max_rows)
        r, g = k, n
    return r, min(g, n), k


def unit_sensitivity(norms: Any, unit: PrivacyUnit) -> float:
    """``max sum_s d_s norms_s`` over the changes ``d`` one unit can make (module doc): the largest
    norms get ``r`` each, in decreasing order, until ``g`` steps or ``k`` rows are used."""
    v = np.sort(np.asarray(norms, dtype=np.float64))[::-1]
    r, g, k = _caps(unit, v.size)
    full = min(g, k // r)
    total = float(r) * math.fsum(v[:full].tolist())
    rest = min(k - full * r, r) if full < g else 0
    if rest > 0 and full < v.size:
        total += rest * float(v[full])
    return total


def unit_factor(weights: Any, p: int, unit: PrivacyUnit) -> float:
    """``c >= S / Delta`` (module doc) for the Fenwick strategy weighted ``weights`` and the noise's
    norm ``p`` (1: Laplace, 2: Gaussian), rounded up: the exact ratio of the exact norms is at most
    ``c``.  The float64 norms have relative error ``<= e = (log2 N + g + 8) 2^-53`` (sums of
    non-negative terms, square roots correctly rounded), so ``c`` is the computed ratio times
    ``1 + 4 e``, one step up.  ``k`` alone (no groups): ``c = k`` exactly."""
    if not unit.grouped:
        return float(unit.max_rows)
    powers = fenwick_column_norms(weights, p)
    norms = powers if p == 1 else np.sqrt(powers)
    S = unit_sensitivity(norms, unit)
    D = float(norms.max())
    if not (S > 0 and D > 0):
        raise SparseDPError("the counter's strategy has no non-zero column")
    _, g, _ = _caps(unit, norms.size)
    e = (math.log2(max(norms.size, 2)) + g + 8) * _U
    c = math.nextafter(S / D * (1.0 + 4.0 * e), math.inf)
    return min(c, float(unit.l1_bound()))  # never above ||d||_1 max_s norm_s / Delta = ||d||_1
