"""Shared plumbing of the online counters: the increment domain, the one measurement path (plan,
charge, noise stream), step bookkeeping and certified sensitivities.

**Increment domain** (``increments=``; issue 19 #7).  The guarantee of every counter is stated for
neighbouring streams that differ in ONE step by at most 1.  The counter enforces a domain in which
that relation is meaningful, and refuses anything else with
:class:`~sparsedp.errors.InputBoundError` *before* anything changes (no step is counted, no noise is
drawn, the running sum is untouched):

* ``"counts"`` (default): every increment is a non-negative integer -- the number of records that
  arrive at that step -- and the running sum stays at most
  :data:`~sparsedp.validation.MAX_MAGNITUDE` ``= 2^50``.  One record adds exactly 1 to one step, so
  two streams that differ in one record differ in one increment by 1 (event-level privacy, the same
  relation as a histogram of counts).  Integers below ``2^53`` add exactly in float64, so the exact
  running sums a counter keeps are exact; above ``2^53`` float rounding, not noise, would separate
  neighbours (issue 19 #3).  A record counted in ``k`` increments is protected at ``k epsilon``.
* ``"unit"``: every increment is a real number in ``[0, 1]`` (a bounded contribution per step).  Any
  two streams that differ in one step are then at distance at most 1 there, so the relation holds
  whatever the step's value is replaced by.  With exact noise (``secure=True``) each increment is
  first rounded to the quantum ``q = 2^-10`` (:data:`UNIT_QUANTUM`; coarser only if the exact
  sampler's scale limit requires it at a tiny budget): rounding is monotone, so ``[0, 1]`` maps onto
  ``{0, q, .., 1}`` and neighbours still differ by at most 1, now on the lattice ``q Z`` the exact
  noise lives on (discrete noise added to an off-lattice value would reveal it).

Negative, fractional (for counts), non-finite or overflowing increments are refused, never clipped:
clipping a count would silently change the data.

**One measurement path** (issue 13).  Every counter is a strategy ``M`` (one row per noisy
measurement, one column per step) with per-row noise scales, and draws its noise through
:func:`sparsedp.measure.plan_measurement`: trees, Fenwick nodes and blocks are
:class:`~sparsedp.intervals.IntervalRows` (0/1 rows, calibrated exactly in integers without the
matrix), and a weighted row ``lambda_i x(I_i) + Lap(b)`` is measured as ``x(I_i) + Lap(b / lambda_i)``
(per-row scales on a 0/1 strategy: exact noise needs no grid rounding).  The plan certifies the loss
of those scales on those rows (``max_j sum_{i covers j} lambda_i / b``, or its Gaussian analogue)
and the budget must cover it.  Since a counter's noise does not depend on the data (its release is
"running sum + data-independent offset", :mod:`.adaptive`), it is drawn from the plan's
:meth:`~sparsedp.measure.MeasurementPlan.noise_stream`: charged once, rows handed out once, in
increasing order, drawn ahead in batches (:class:`RowNoise`).  Exact noise (``secure=True``) is the
default: discrete Laplace / Gaussian on the lattice of the data; ``secure=False`` is the explicit
opt-out to textbook float64 noise (leaks through its low bits, Mironov 2012; for experiments).
Memory: the plan keeps ``O(N)`` per-row arrays (interval ends, scales and variances: about 50 bytes
per row).

**Accountant.**  A counter's whole stream is one release of cost ``epsilon`` (or ``rho``).  A
counter given ``accountant=`` charges it once, in the constructor, through the plan's ledger entry,
after every parameter has been checked and the noise calibrated, and before the first noise value is
drawn.  Charging at creation makes the charge independent of the data and of how many steps are
eventually used, and a refused budget refuses before anything is released.  A counter rebuilt from a
saved state continues the release that was charged when it was created and charges nothing.
"""

from __future__ import annotations

import copy
import functools
import math
from fractions import Fraction
from typing import Any, Callable, Iterable

import numpy as np
import scipy.sparse as sp

from ..calibration import round_up
from ..errors import BudgetExceededError, InputBoundError, InvalidPrivacyParameterError, NonFiniteInputError, SparseDPError
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, NoiseStream, plan_measurement
from ..noise import MAX_DISCRETE_SCALE, KeyedRandomBits, discrete_gaussian_variance
from ..privacy import Accountant, PrivacyCost
from ..validation import MAX_MAGNITUDE
from .fenwick import check_horizon

__all__ = [
    "INCREMENTS",
    "MIN_RELATIVE_WEIGHT",
    "UNIT_QUANTUM",
    "SCALE_SLACK",
    "RowNoise",
    "StreamingCounter",
    "check_increments",
    "check_accountant",
    "check_secure",
    "exact_level_sensitivity",
    "certified_sum",
    "ceil_sqrt",
    "higham_gamma",
    "plan_rows",
    "measurable",
    "row_variances",
    "weighted_scales",
    "fenwick_rows",
    "identity_rows",
    "completed_blocks",
]

#: The increment domains a counter can enforce (see the module docstring).
INCREMENTS = ("counts", "unit")
#: User-given weights are scaled to a largest weight of 1; a measured weight below this is refused
#: (noise divided by it, and variances divided by its square, must stay finite at every budget).
MIN_RELATIVE_WEIGHT = 1e-100
#: With exact noise, ``increments="unit"`` are rounded to this quantum (a power of two: sums of
#: its multiples below ``2^43`` are exact in float64).
UNIT_QUANTUM = 2.0**-10
#: Per-row scales ``b / lambda_i`` are widened by this factor: the plan's certified loss (exact
#: integer coverage of upward-rounded fixed-point terms) is then ``<= epsilon`` although the
#: weights are normalised to a sensitivity of exactly 1 (costs ``2^-19`` relative variance).
SCALE_SLACK = 1.0 + 2.0**-20
#: Plans with more distinct sampler scales than this draw all their noise at once (the exact
#: sampler caches tables for 32 scales; per-batch draws would rebuild them).
_FEW_SCALES = 24
_BATCH = 1 << 16
#: Counters with ``horizon * rows`` at most this give their error reports a shape (the offset
#: matrix ``B``: ``horizon * rows`` runs of the counter's own steps, about 1-5 s at ``2^20``, computed
#: on the first interval request); larger ones report variances only (normal intervals).
SHAPE_LIMIT = 1 << 20

_U = 2.0**-53


def check_increments(kind: Any) -> str:
    """``kind`` if it names an increment domain (``"counts"`` or ``"unit"``), else :class:`SparseDPError`."""
    if not isinstance(kind, str) or kind not in INCREMENTS:
        raise SparseDPError(f"increments must be one of {INCREMENTS}, got {kind!r}")
    return kind


def check_accountant(accountant: Any) -> Accountant | None:
    """``None`` or an :class:`~sparsedp.privacy.Accountant`, else :class:`SparseDPError`."""
    if accountant is not None and not isinstance(accountant, Accountant):
        raise SparseDPError(f"accountant must be a sparsedp.privacy.Accountant, got {type(accountant).__name__}")
    return accountant


def higham_gamma(k: int) -> float:
    """Higham's ``gamma_k = k u / (1 - k u)``: relative error bound of ``k`` float roundings."""
    ku = k * _U
    if ku >= 0.5:
        raise SparseDPError(f"cannot certify {k} float roundings")
    return ku / (1.0 - ku)


def certified_sum(sums: np.ndarray, terms: int, roundings: int = 0, integer_terms: bool = False) -> np.ndarray:
    """Upper bounds of exact sums that were computed in float64 by adding at most ``terms``
    non-negative terms one at a time, each term within ``roundings`` roundings of its exact value
    (Higham, *Accuracy and Stability of Numerical Algorithms*, eq. 3.4):
    ``s <= s_hat (1 + gamma_{terms - 1 + roundings})``, rounded up once more.  Sums of integer terms
    (``integer_terms``, no term roundings) below ``2^53`` are exact and returned as they are."""
    v = np.asarray(sums, dtype=np.float64)
    if integer_terms and roundings == 0 and float(np.max(v, initial=0.0)) < 2.0**53:
        return v
    return round_up(v, higham_gamma(max(terms - 1, 0) + roundings + 1))


def _ceil_float(q: Fraction) -> float:
    f = float(q)
    return f if Fraction(f) >= q else math.nextafter(f, math.inf)


def _ceil_sqrt(q: Fraction) -> float:
    """The smallest float whose square is ``>= q`` (exactly)."""
    d = math.sqrt(float(q))
    while Fraction(d) ** 2 < q:
        d = math.nextafter(d, math.inf)
    return d


def exact_level_sensitivity(lam: np.ndarray, norm: int) -> float:
    """``Delta_1 = sum_l lambda_l`` or ``Delta_2 = sqrt(sum_l lambda_l^2)``, rounded up from the exact
    rational value of the float weights: the sensitivity of a strategy in which every step lies in
    exactly one measured node per level, level ``l`` weighted ``lambda_l`` (trees; tests check the
    formula against the entries of the measured matrix)."""
    weights = [Fraction(float(v)) for v in np.abs(np.asarray(lam, dtype=np.float64)).ravel()]
    if norm == 1:
        return _ceil_float(sum(weights, Fraction(0)))
    return _ceil_sqrt(sum((w * w for w in weights), Fraction(0)))


def ceil_sqrt(value: float) -> float:
    """The smallest float whose square is ``>= value`` (exactly)."""
    return _ceil_sqrt(Fraction(float(value)))


def check_secure(secure: Any) -> bool:
    """``secure`` as a bool (``True``: exact discrete noise; ``False``: float64 noise), else
    :class:`SparseDPError` (a truthy string must not select a noise kind by accident)."""
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True (exact noise) or False (float noise), got {secure!r}")
    return bool(secure)


def weighted_scales(base: float, lam: np.ndarray) -> np.ndarray:
    """Per-row scales ``base / lambda_i`` (rounded up, widened by :data:`SCALE_SLACK`): measuring
    ``x(I_i)`` with them is measuring ``lambda_i x(I_i)`` with scale ``base`` (see the module
    docstring); rows with ``lambda_i = 0`` must be left out by the caller."""
    lam = np.asarray(lam, dtype=np.float64)
    return np.nextafter(np.nextafter(base / lam, np.inf) * SCALE_SLACK, np.inf)


#: Levels whose noise scale is more than this factor above the best level's are left unmeasured.
UNMEASURED_FACTOR = 2.0**30


def measurable(level_scales: np.ndarray, secure: bool, grid: float) -> np.ndarray:
    """Which levels of a weighted tree to measure: those whose per-row scale is at most
    :data:`UNMEASURED_FACTOR` times the smallest (a level ``2^30`` times noisier carries ``2^-60`` of
    the information) and, with exact noise, within 90% of the sampler's limit ``2^40`` grid units
    (room for the plan's upward rounding); level 0 (the leaves) always.  Leaving rows out only
    lowers the privacy loss; the estimators treat such a level as unmeasured."""
    s = np.asarray(level_scales, dtype=np.float64)
    keep = s <= float(s.min()) * UNMEASURED_FACTOR
    if secure:
        keep &= s / grid <= 0.9 * MAX_DISCRETE_SCALE
    keep[0] = True
    return keep


def plan_rows(rows: Any, *, epsilon: float | None, rho: float | None, scales: Any = None, secure: bool,
              grid: float = 1.0) -> MeasurementPlan:
    """:func:`sparsedp.measure.plan_measurement` of a counter's strategy: Laplace with ``epsilon``
    or Gaussian with ``rho``, homoscedastic (``scales=None``) or per-row ``scales`` whose certified
    loss must be covered by the budget; ``grid`` is the data's lattice (exact noise only)."""
    noise = "laplace" if rho is None else "gaussian"
    return plan_measurement(rows, epsilon=epsilon, rho=rho, scales=scales, noise=noise, secure=secure,
                            grid=grid if secure else 1.0)


def row_variances(plan: MeasurementPlan) -> np.ndarray:
    """Per-row noise variances of ``plan`` in data units (:meth:`MeasurementPlan.variances`), except
    that an exact discrete Gaussian of scale ``t > 1000`` grid units gets ``t^2`` directly: its
    variance is ``t^2 (1 - O(t^2 e^{-2 pi^2 t^2}))`` (Poisson summation), ``t^2`` in float64, and the
    exact sum over ``|k| <= 40 t`` would allocate ``80 t`` floats (gigabytes at tiny budgets)."""
    if not (plan.secure and plan.noise == "gaussian") or float(plan.unit_scales.max()) <= 1000.0:
        return plan.variances()
    uniq, inv = np.unique(plan.unit_scales, return_inverse=True)
    unit = np.array([discrete_gaussian_variance(float(u)) if u <= 1000.0 else float(u) * float(u) for u in uniq])
    return unit[inv] * plan.grid**2


class RowNoise:
    """The noise of a counter's plan, row by row, in increasing row order (each row at most once).

    Wraps :meth:`MeasurementPlan.noise_stream <sparsedp.measure.MeasurementPlan.noise_stream>`
    (which charges once, when it is opened) and hands out values from batches taken ahead: one
    stream request per ``chunk`` rows, a list ``pop`` per row (``O(1)``).  The noise does not depend
    on the data, so taking it early changes nothing; values taken but never used are never published
    and are discarded with the object.  ``chunk``: ``_BATCH`` rows, or every row at once when the plan
    has more than ``_FEW_SCALES`` distinct sampler scales (the FDA weights: about 380 at
    ``N = 2^20`` after the plan's rounding; the exact sampler caches 32 tables, and per-batch draws
    would rebuild them -- all at once costs 8 bytes per row).

    Keyed noise (``keys=``, a :class:`~sparsedp.noise.KeyedRandomBits`; the resumable
    :class:`~sparsedp.continual.ContinualCounter`): the rows are cut into fixed blocks of ``chunk``
    rows, and block ``b`` (rows ``[b chunk, (b + 1) chunk)``) is drawn by the same exact samplers from
    the byte stream ``keys.at(b)`` alone.  The noise of every row is then a function of the key, the
    block size and the row -- not of where the draws started -- so a counter rebuilt from a saved
    state (key and block size included) draws, for a step it replays, the value already published.
    A resume at row ``t`` redraws block ``t // chunk`` and drops its rows before ``t``: ``O(chunk)``
    once, as before; each block is still drawn once per process.  ``keys`` may be a function that
    makes the key: it is called at the first use, so a counter given a numpy Generator reads the key
    from it only when it draws (or saves), never at creation."""

    def __init__(self, stream: NoiseStream, chunk: int,
                 keys: KeyedRandomBits | Callable[[], KeyedRandomBits] | None = None) -> None:
        self._stream = stream
        self.rows = stream.plan.rows
        self._chunk = max(1, int(chunk))
        self._keys = keys
        self._vals: list[float] = []  # reversed: pop() returns row self._row
        self._row = 0

    @staticmethod
    def chunk_for(plan: MeasurementPlan) -> int:
        """Rows per batch for ``plan`` (see the class docstring)."""
        if plan.rows <= _BATCH or np.unique(plan.unit_scales).size > _FEW_SCALES:
            return plan.rows
        return _BATCH

    @classmethod
    def open(cls, plan: MeasurementPlan, accountant: Accountant | None, rng: Any, label: str,
             keys: KeyedRandomBits | Callable[[], KeyedRandomBits] | None = None,
             block: int | None = None) -> "RowNoise":
        """Charge ``plan`` to ``accountant`` (with its ledger entry; ``rng`` says whether it is seeded)
        and return its noise.  With ``keys`` the noise is keyed (see the class docstring) in blocks of
        ``block`` rows (default :meth:`chunk_for`)."""
        chunk = cls.chunk_for(plan) if block is None else int(block)
        if chunk < 1:
            raise SparseDPError(f"the noise block must be a positive number of rows, got {block!r}")
        return cls(plan.noise_stream(accountant=accountant, rng=rng, label=label, chunk=chunk), chunk, keys)

    @property
    def keys(self) -> KeyedRandomBits | None:
        """The key of keyed noise (made now if it was given as a function), else ``None``."""
        if callable(self._keys) and not isinstance(self._keys, KeyedRandomBits):
            self._keys = self._keys()
        return self._keys  # type: ignore[return-value]

    @property
    def block(self) -> int:
        """Rows per batch (with keyed noise: per keyed block)."""
        return self._chunk

    @property
    def private(self) -> bool:
        """False when the noise comes from a seeded (reproducible) generator."""
        return bool(self._stream.private)

    @property
    def next_row(self) -> int:
        return self._row

    def draw(self) -> float:
        """The noise of the next row."""
        if not self._vals:
            end = (self._row // self._chunk + 1) * self._chunk if self._keys is not None else self._row + self._chunk
            stop = min(self.rows, end)
            if stop <= self._row:
                raise SparseDPError("every noise row of this counter has been used")
            self._vals = self._take(self._row, stop)[::-1].tolist()
        self._row += 1
        return self._vals.pop()

    def at(self, row: int) -> float:
        """The noise of ``row`` (``>= next_row``; rows skipped are never drawn or published)."""
        if row < self._row:
            raise SparseDPError(f"noise row {row} was already used: a row's noise is drawn once")
        self.skip_to(row)
        return self.draw()

    def skip_to(self, row: int) -> None:
        """Discard the rows before ``row`` (a resumed counter continues at its saved step)."""
        k = int(row) - self._row
        if k <= 0:
            return
        if k < len(self._vals):
            del self._vals[len(self._vals) - k:]
        else:
            self._vals = []
        self._row = int(row)

    def all(self) -> np.ndarray:
        """The noise of every remaining row, as an array (counters that draw everything at once)."""
        out = self._take(self._row, self.rows) if self._row < self.rows else np.zeros(0)
        self._vals, self._row = [], self.rows
        return out

    def _take(self, start: int, stop: int) -> np.ndarray:
        """The noise of rows ``[start, stop)``: from the plan's stream, or from the keyed blocks."""
        if self._keys is None:
            return self._stream.take(np.arange(start, stop))
        C = self._chunk
        parts = []
        for b in range(start // C, (stop - 1) // C + 1):
            lo = b * C
            z = self._keyed_block(b, lo, min(self.rows, lo + C))
            parts.append(z[max(start, lo) - lo: min(stop, lo + C) - lo])
        return np.concatenate(parts)

    def _keyed_block(self, b: int, lo: int, hi: int) -> np.ndarray:
        """Block ``b`` (rows ``[lo, hi)``), drawn by the plan's own noise stream from the bytes of
        ``keys.at(b)`` only (float noise: the numpy generator of the same key and block)."""
        plan = self._stream.plan
        bits = self.keys.at(b)
        gen = bits if plan.secure else bits.generator()
        return NoiseStream(plan, gen, self._stream.private, hi - lo, start=lo).take(np.arange(lo, hi))


class StreamingCounter:
    """Base of every online counter: ``update(a_t)`` -> noisy ``s_t``; refuses step ``horizon + 1``
    and increments outside the domain (module docstring).

    Subclasses implement ``_step(a) -> float`` and build their :class:`MeasurementPlan` with
    :meth:`_make_plan`, then open its noise with :meth:`_open` (this charges the accountant) before
    their first draw.  :meth:`measured_strategy` / :meth:`noise_scales` are the plan's explicit
    matrix and per-row scales (what is audited); ``last_variance`` is the exact variance of the last
    output (from the plan's per-row variances: exact discrete variances with ``secure=True``).
    """

    name = "counter"
    epsilon: float | None = None
    rho: float | None = None

    def __init__(self, horizon: int, increments: str = "counts", secure: bool = True) -> None:
        self.horizon = check_horizon(horizon)
        self.increments = check_increments(increments)
        self.secure = check_secure(secure)
        self.t = 0
        self.last_variance = float("nan")
        self._total = 0.0  # the exact running sum of accepted increments (domain bookkeeping)
        self.quantum: float | None = None  # the data lattice of exact noise (set by _make_plan)
        self.plan: MeasurementPlan | None = None
        self._noise: RowNoise | None = None

    # ---- privacy bookkeeping ----------------------------------------------------------------
    @property
    def privacy_cost(self) -> PrivacyCost:
        """What the whole stream costs (the plan's charge): ``PrivacyCost(epsilon=...)`` or ``(rho=...)``."""
        if self.plan is not None:
            return self.plan.cost
        return PrivacyCost(rho=self.rho) if self.rho is not None else PrivacyCost(epsilon=self.epsilon or 0.0)

    @property
    def private(self) -> bool:
        """False when the noise comes from a seeded generator (reproducible, hence not private)."""
        return self._noise is not None and self._noise.private

    @property
    def label(self) -> str:
        return f"continual: {self.name} counter, horizon {self.horizon}"

    def _make_plan(self, build: Callable[[float], MeasurementPlan]) -> MeasurementPlan:
        """``build(grid)`` for the data's lattice, stored as :attr:`plan` (nothing charged or drawn).

        Counts: grid 1.  ``increments="unit"`` with exact noise: grid :data:`UNIT_QUANTUM`, doubled
        (up to 1) while the exact sampler refuses the scale (tiny budgets), and increments are
        rounded to it (module docstring).  Float noise: no lattice."""
        if not self.secure or self.increments == "counts":
            self.plan = build(1.0)
            self.quantum = 1.0 if self.secure else None
            return self.plan
        q = UNIT_QUANTUM
        while True:
            try:
                self.plan = build(q)
            except InvalidPrivacyParameterError:
                if q >= 1.0:
                    raise
                q *= 2.0
                continue
            self.quantum = q
            return self.plan

    def _open(self, accountant: Accountant | None, rng: Any,
              keys: KeyedRandomBits | Callable[[], KeyedRandomBits] | None = None, block: int | None = None) -> None:
        """Charge the plan (once, with its ledger entry) and open its noise; call once, after every
        check and before the first draw.  ``keys`` / ``block``: keyed noise (:class:`RowNoise`)."""
        assert self.plan is not None
        self._noise = RowNoise.open(self.plan, accountant, rng, self.label, keys, block)

    def measured_strategy(self) -> sp.csr_matrix:
        """The strategy the counter measures (one row per noisy measurement, one column per step):
        the plan's explicit matrix, built for audits (small horizons)."""
        assert self.plan is not None
        return self.plan.matrix

    def noise_scales(self) -> np.ndarray:
        """Per-row noise scale of :meth:`measured_strategy` in data units: Laplace ``b_i`` or
        Gaussian ``sigma_i`` (exact noise: ``grid t_i``, the sampler's scale on the data lattice)."""
        assert self.plan is not None
        return self.plan.scales.copy()

    # ---- the stream -------------------------------------------------------------------------
    def check_increment(self, a: Any) -> float:
        """``a`` as a float if it lies in the counter's increment domain given the running sum so far;
        :class:`NonFiniteInputError` for non-numbers and NaN/inf, :class:`InputBoundError` outside."""
        if isinstance(a, (str, bytes)) or a is None:
            raise NonFiniteInputError(f"increment must be a number, got {type(a).__name__}")
        try:
            value = float(a)
        except OverflowError as exc:  # an integer beyond float64
            raise InputBoundError(f"an increment is above the bound {MAX_MAGNITUDE:.0f} = 2^50") from exc
        except (TypeError, ValueError) as exc:
            raise NonFiniteInputError(f"increment must be a finite number, got {type(a).__name__}") from exc
        if not math.isfinite(value):
            raise NonFiniteInputError("increment must be finite (NaN or infinity given)")
        if self.increments == "unit":
            if not 0.0 <= value <= 1.0:
                raise InputBoundError("an increment lies outside [0, 1] (increments='unit')")
            return value
        if value < 0 or value != math.floor(value):
            raise InputBoundError("an increment is not a non-negative integer count (increments='counts'; "
                                  "use increments='unit' for real values in [0, 1])")
        if self._total + value > MAX_MAGNITUDE:
            raise InputBoundError(f"the increment would take the running sum above {MAX_MAGNITUDE:.0f} = 2^50, "
                                  "beyond which float rounding, not noise, decides the output")
        return value

    def update(self, a: float) -> float:
        """Take the increment of step ``t + 1`` and return the noisy running sum at that step."""
        if self.t >= self.horizon:
            raise BudgetExceededError(
                f"{self.name}: the horizon of {self.horizon} steps is used up; step {self.t + 1} is refused"
            )
        value = self.check_increment(a)
        if self.quantum is not None and self.quantum != 1.0:
            value = self.quantum * round(value / self.quantum)  # onto the exact noise's lattice
        if self.t == 0:
            self._keep_shape_source()
        out = self._step(value)
        self.t += 1
        self._total += value
        self._log_step(out)
        return out

    # ---- per-step accuracy (issue 20) ---------------------------------------------------------
    def _log_step(self, out: float) -> None:
        """Keep each released value and its variance (``last_variance``), 16 bytes per step."""
        log = getattr(self, "_step_log", None)
        if log is None:
            log = self._step_log = np.full((2, self.horizon), np.nan)
        log[0, self.t - 1] = out
        if not hasattr(self, "step_variances"):  # those counters know every step's variance at once
            log[1, self.t - 1] = self.last_variance

    def released(self) -> np.ndarray:
        """The values released so far, ``s~_1 .. s~_t`` (``nan`` for steps released before this
        object was restored from a saved state)."""
        log = getattr(self, "_step_log", None)
        return np.full(self.t, np.nan) if log is None else log[0, : self.t].copy()

    def variances(self) -> np.ndarray:
        """``Var(s~_1) .. Var(s~_t)``: the exact variance of every value released so far (each step's
        ``last_variance``, from the plan's per-row variances; ``nan`` for steps released before this
        object was restored from a saved state)."""
        if hasattr(self, "step_variances"):  # GLS-tree and optimised counters: all steps, computed once
            return np.array(self.step_variances()[: self.t], dtype=np.float64)
        log = getattr(self, "_step_log", None)
        return np.full(self.t, np.nan) if log is None else log[1, : self.t].copy()

    def error_report(self) -> Any:
        """The released steps' variances as an :class:`~sparsedp.accuracy.ErrorReport` (``total``,
        ``per_query``, ``variances``, ``confidence_intervals(answers, level)``), with the counter's
        noise and ``secure`` flag for the interval method and, when ``horizon * rows <=``
        :data:`SHAPE_LIMIT`, the error's shape: the released offsets are ``e = B z`` (``B`` the
        counter's offset matrix, :meth:`_offset_matrix`, computed on the first interval request
        from a copy of the counter kept before its first step; ``z`` the plan's noise), so the
        default intervals are ``"accurate"`` (exact quantile for a step that is one noise value,
        variance-gamma with the exact kurtosis otherwise; :mod:`sparsedp.accuracy`).  Larger
        counters, and counters restored from a saved state, report the variances only (the
        ``"normal"`` intervals)."""
        from ..accuracy import ErrorReport

        var = self.variances()
        if not var.size:
            raise SparseDPError(f"{self.name}: nothing released yet")
        if not np.all(np.isfinite(var)):
            first = int(np.flatnonzero(~np.isfinite(var))[0]) + 1
            raise SparseDPError(f"{self.name}: the variance of step {first} is not known to this object (released "
                                "before it was restored from a saved state, or not reported by the counter)")
        total = float(var.sum())
        noise = self.plan.noise if self.plan is not None else ("gaussian" if self.rho is not None else "laplace")
        source = self._shape_source()
        shape = None if source is None else functools.partial(_counter_shape, source, var)
        return ErrorReport(total, total / var.size, f"exact-{self.name}", variances=var, noise=noise,
                           secure=bool(self.secure), shape=shape)

    def confidence_intervals(self, level: float = 0.95, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around every released ``s~_t`` at confidence ``level`` (the methods of
        :meth:`~sparsedp.accuracy.ErrorReport.confidence_intervals`; the default is the normal
        quantile for float Gaussian noise, else ``"accurate"`` when the counter knows its error's
        shape (:meth:`error_report`) and ``"normal"`` when not; ``method="exact-tail"`` or
        ``"chebyshev"``: certified, coverage at least ``level``)."""
        return self.error_report().confidence_intervals(self.released(), level, method)

    # ---- the error's shape (what the intervals use beyond the variances) ----------------------
    def _keep_shape_source(self) -> None:
        """Called before the first step: a copy of this counter as it is now -- nothing stepped, no
        data seen -- without its noise stream (the copy draws nothing and can never hand out this
        counter's noise), from which :meth:`_offset_matrix` is computed later; only for a counter
        that draws its own noise (not a test-hook clone) with ``horizon * rows <= SHAPE_LIMIT``."""
        if self.plan is None or not isinstance(self._noise, RowNoise):
            return
        if self.horizon * self.plan.rows > SHAPE_LIMIT:
            return
        self._shape_copy = self._noiseless_copy()

    def _shape_source(self) -> "StreamingCounter | None":
        """What :meth:`_offset_matrix` is computed on (``None``: no shape)."""
        return getattr(self, "_shape_copy", None)

    def to_release(self) -> Any:
        """The values released so far as a :class:`~sparsedp.releases.ReleaseResult` (one answer
        per step, label ``step`` from 1, their exact variances and the counter's ledger record:
        the plan's cost, noise and scales).  Its ``save(path)`` writes a release file; the
        counter's own :meth:`save` (ContinualCounter) writes its *state*, which holds the exact
        running sums and is never a release."""
        from ..releases import ReleaseResult

        values = self.released()
        try:
            rep = self.error_report()
            var, how = rep.variances, rep.method
        except SparseDPError as exc:
            rep, var, how = None, None, f"unavailable: {exc}"
        cost = self.privacy_cost
        entry: dict[str, Any] = {"label": self.label, "epsilon": cost.epsilon, "rho": cost.rho}
        if self.plan is not None:
            entry.update(rows=self.plan.rows, columns=self.horizon, noise=self.plan.noise, secure=bool(self.secure),
                         private=self.private, sensitivity=float(self.plan.data_sensitivity),
                         scale_min=float(self.plan.scales.min()), scale_max=float(self.plan.scales.max()))
        noise = self.plan.noise if self.plan is not None else ("gaussian" if self.rho is not None else "laplace")
        return ReleaseResult(kind="continual", answers=values, labels={"step": np.arange(1, values.size + 1)},
                             variances=var, noise=noise, secure=bool(self.secure),
                             strategy=f"{self.name} counter, horizon {self.horizon}", ledger=[entry],
                             private=self.private, description={"counter": self.name, "horizon": self.horizon,
                                                                "steps": int(self.t), "increments": self.increments},
                             variance_method=how, report=rep, source=self)

    def run(self, increments: Iterable[float]) -> np.ndarray:
        """``update`` over ``increments`` in order; the outputs as an array."""
        return np.array([self.update(a) for a in increments], dtype=np.float64)

    def _step(self, a: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- test hooks: many independent releases of one plan (suite speed) ---------------------
    def _offsets_for(self, z: np.ndarray) -> np.ndarray:
        """Test hook: the offsets ``s~_t - s_t`` (``t = 1 .. horizon``) this counter releases when its
        plan's noise is ``z`` (one value per row, data units).  Runs this counter's own steps on a
        copy made before its first step, fed ``z`` instead of its noise stream, on all-zero data
        (the offsets do not depend on the data: :mod:`.adaptive`).  Nothing is drawn or charged."""
        return self._given_copy(z, "_offsets_for").run(np.zeros(self.horizon))

    def _release_for(self, increments: Any, z: np.ndarray) -> np.ndarray:
        """Test hook: what this counter releases for the stream ``increments`` when its plan's noise
        is ``z`` (one value per row, data units, in the plan's row order): this counter's own code
        run on a copy made before its first step, fed ``z`` instead of its noise stream.  Nothing is
        drawn or charged.  The privacy tests use it for the post-processing rule: with ``y = M x + z``
        (``M`` = :meth:`measured_strategy`), two (stream, noise) pairs with the same ``y`` must give
        the same release, bit for bit."""
        return self._given_copy(z, "_release_for").run(increments)

    def _noiseless_copy(self) -> "StreamingCounter":
        """A deep copy of this counter that shares its plan and has no noise stream (it can never
        hand out this counter's noise)."""
        return copy.deepcopy(self, {id(self.plan): self.plan, id(self._noise): None})

    def _given_copy(self, z: np.ndarray, hook: str) -> "StreamingCounter":
        """Test hooks: a copy of this counter before its first step, fed the noise ``z`` (data
        units, plan row order) instead of its noise stream."""
        if self.t:
            raise SparseDPError(f"{hook} needs a counter before its first step")
        assert self.plan is not None
        clone = self._noiseless_copy()
        clone._noise = _GivenNoise(np.asarray(z, dtype=np.float64), self._noise)
        clone._given_noise()
        return clone

    def _given_noise(self) -> None:
        """Called on a test-hook clone after its noise was replaced (:meth:`_release_for`): counters
        that compute from the noise at creation recompute here."""

    def _offset_matrix(self) -> np.ndarray:
        """Test hook: ``B`` (``horizon x rows``) with offsets ``e = B z`` for the plan's noise ``z``:
        column ``j`` is :meth:`_offsets_for` the ``j``-th unit vector (the offsets are linear in the
        noise; tests check ``B z`` against the counter's own releases for the noise it drew)."""
        assert self.plan is not None
        eye = np.eye(self.plan.rows)
        return np.column_stack([self._offsets_for(eye[j]) for j in range(self.plan.rows)])

    def _draw_offsets(self, k: int, rng: Any, B: np.ndarray | None = None) -> np.ndarray:
        """Test hook: the offsets of ``k`` independent releases (``k x horizon``): ``k`` noise vectors
        of this counter's plan, drawn in one call by the plan's own ``measure`` on a block-diagonal
        copy (:func:`sparsedp.audit.plan_release` of all-zero data, whose release is the noise; no
        accountant), times :meth:`_offset_matrix` (or ``B``, that matrix computed before).  The law of
        ``k`` counters' releases, one plan built."""
        from ..audit import plan_release  # local: the auditor is a test harness

        assert self.plan is not None
        Z = plan_release(self.plan, counts=False)(np.zeros(self.plan.measured.shape[1]), rng, int(k))
        return Z @ (self._offset_matrix() if B is None else B).T


def _counter_shape(source: StreamingCounter, var: np.ndarray) -> Any:
    """The :class:`~sparsedp.accuracy.ErrorShape` of a counter's first ``var.size`` steps: the rows
    of its offset matrix ``B`` (computed once per source, kept on it) with the plan's noise."""
    from ..accuracy import error_shape

    plan = source.plan
    assert plan is not None
    B = getattr(source, "_shape_offsets", None)
    if B is None:
        B = source._offset_matrix()
        source._shape_offsets = B
    return error_shape(B[: var.size], plan.noise, secure=plan.secure, variances=row_variances(plan),
                       unit_scales=plan.unit_scales, answer_variances=var)


class _GivenNoise:
    """Stands in for a counter's :class:`RowNoise` in the test hooks: hands out the given ``z`` with
    the same interface (``draw``, ``at``, ``skip_to``, ``all``, ``next_row``, ``private``)."""

    def __init__(self, z: np.ndarray, like: RowNoise | None) -> None:
        self._z = z
        self.rows = z.size
        self._row = 0
        self.private = False if like is None else like.private

    @property
    def next_row(self) -> int:
        return self._row

    def draw(self) -> float:
        if self._row >= self.rows:
            raise SparseDPError("every noise row of this counter has been used")
        self._row += 1
        return float(self._z[self._row - 1])

    def at(self, row: int) -> float:
        if row < self._row:
            raise SparseDPError(f"noise row {row} was already used: a row's noise is drawn once")
        self._row = int(row)
        return self.draw()

    def skip_to(self, row: int) -> None:
        self._row = max(self._row, int(row))

    def all(self) -> np.ndarray:
        out = self._z[self._row:].copy()
        self._row = self.rows
        return out


class OffsetCounter(StreamingCounter):
    """Base of the counters that release ``s~_t = s_t + e_t`` with every offset ``e = B z`` computed
    at creation from noise drawn ahead (the GLS tree, optimised strategies): ``O(1)`` per step.

    With exact noise (``secure=True``) the offsets are exact rationals
    (:class:`~sparsedp.continual.exact_offsets.ExactOffsets`) and each step releases the correctly
    rounded float of the exact ``s_t + e_t = (B y)_t``: a function of the measurement ``y = M x + z``
    alone (the post-processing rule; a float ``s_t + e_t`` would reveal ``s_t``, see
    :mod:`.exact_offsets`).  With float noise (``secure=False``, an opt-out that leaks anyway) the
    offsets are floats.

    Subclasses implement :meth:`_offsets_from` (exact noise: returns an ``ExactOffsets``; float
    noise: an array of ``horizon`` floats), call :meth:`_set_offsets` after :meth:`_open` charged,
    and implement :meth:`_all_step_variances` (``Var(e_t)`` for every step, exact, from the plan's
    per-row variances); :meth:`step_variances` computes it once, on first use.
    """

    _offsets: Any = None
    _s: float = 0.0
    _var: np.ndarray | None = None

    def _all_step_variances(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def step_variances(self) -> np.ndarray:
        """``Var(s~_t)`` for every step (exact; computed on first use)."""
        if self._var is None:
            self._var = self._all_step_variances()
        return self._var

    @property
    def last_variance(self) -> float:
        """Exact variance of the last output (``nan`` before the first step)."""
        return float(self.step_variances()[self.t - 1]) if self.t else float("nan")

    @last_variance.setter
    def last_variance(self, value: float) -> None:  # the base class initialises it; derived here
        pass

    def _keep_shape_source(self) -> None:
        """Nothing to keep: the offsets' computation (:meth:`_offsets_for`) needs no earlier state."""

    def _shape_source(self) -> "StreamingCounter | None":
        if self.plan is None or self.horizon * self.plan.rows > SHAPE_LIMIT:
            return None
        return self

    def _set_offsets(self, z: np.ndarray) -> None:
        """The offsets of the plan's noise ``z`` (all rows, data units), as the steps will use them."""
        e = self._offsets_from(np.asarray(z, dtype=np.float64))
        self._offsets = e if hasattr(e, "release") else np.asarray(e, dtype=np.float64).tolist()

    def _given_noise(self) -> None:
        assert self._noise is not None
        self._set_offsets(self._noise.all())

    def _step(self, a: float) -> float:
        self._s += a
        if hasattr(self._offsets, "release"):  # exact: fl(s_t + e_t), a function of y alone
            return self._offsets.release(self.t, self._s)
        return self._s + self._offsets[self.t]

    def _offsets_from(self, z: np.ndarray) -> Any:  # pragma: no cover - abstract
        """The offsets ``e`` for the plan's noise ``z`` (what the constructor computes)."""
        raise NotImplementedError

    def _offsets_for(self, z: np.ndarray) -> np.ndarray:
        """Test hook (see :meth:`StreamingCounter._offsets_for`): the constructor's own offsets
        computation (:meth:`_offsets_from`) applied to ``z``, as floats (exact offsets correctly
        rounded)."""
        e = self._offsets_from(np.asarray(z, dtype=np.float64))
        return e.floats() if hasattr(e, "release") else np.asarray(e, dtype=np.float64)


def fenwick_rows(N: int, name: str = "fenwick") -> IntervalRows:
    """The Fenwick nodes as interval rows: row ``t - 1`` sums the steps ``(t - lowbit(t), t]``
    (0-based columns ``[t - lowbit(t), t)``), i.e. :func:`sparsedp.continual.fenwick_matrices`' ``M_N``."""
    t = np.arange(1, check_horizon(N) + 1, dtype=np.int64)
    return IntervalRows(N, t - (t & -t), t, name=f"{name} nodes (N = {N})")


def identity_rows(N: int, name: str = "naive") -> IntervalRows:
    """One row per step (the identity)."""
    t = np.arange(check_horizon(N), dtype=np.int64)
    return IntervalRows(N, t, t + 1, name=f"{name} steps (N = {N})")


def completed_blocks(N: int, k: int, levels: int, name: str = "tree") -> tuple[IntervalRows, np.ndarray]:
    """The complete aligned blocks of ``k^l`` steps, ``l = 0 .. levels - 1``, in the order an online
    tree measures them: at step ``t`` the leaf, then each block that ends at ``t`` from the smallest
    up.  Returns the rows and each row's level."""
    N = check_horizon(N)
    t = np.arange(1, N + 1, dtype=np.int64)
    top = np.zeros(N, dtype=np.int64)
    size = 1
    for _ in range(1, levels):
        size *= k
        top += (t % size == 0)  # k^l | t implies k^(l-1) | t: counting gives the valuation, capped
    counts = top + 1
    tt = np.repeat(t, counts)
    first = np.cumsum(counts) - counts
    level = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first, counts)
    lo = tt - np.power(np.int64(k), level)
    return IntervalRows(N, lo, tt, name=f"{name} blocks (N = {N}, k = {k})"), level
