"""Laplace protection of observed matrix entries (seed 003, Sec. 3-4), entry level or user level.

Unit of privacy.  *Entry level* (default): two data sets are neighbours when they differ in the
value of ONE observed entry.  Values are clipped to ``bounds = (lo, hi)``, so one entry moves by at
most ``hi - lo`` and the vector of observed values has L1 sensitivity ``Delta_1 = hi - lo``; adding
``Lap(b)`` with ``b = (hi - lo) / epsilon`` to every observed entry is ``epsilon``-DP (the Laplace
mechanism, Dwork-McSherry-Nissim-Smith 2006; seed 003 eq. (9)-(15)).  It does NOT protect a user
(row) as a whole: a user with ``k`` entries is protected only at ``k * epsilon`` (group privacy).

*User level* (``max_entries_per_row=k``): neighbours differ in the values of ONE row.  Rows with
more than ``k`` observations keep ``k`` of them chosen uniformly at random (the choice depends on the
pattern only, never on values), so one row moves the released vector by at most ``k (hi - lo)`` in
L1, and every kept entry gets ``Lap(b)`` with ``b = k (hi - lo) / epsilon`` (the budget split
``epsilon / k`` per entry).

Neither mode hides WHICH entries are observed: the pattern ``Omega`` is treated as public.

One measurement path (issue 13): the release is :func:`sparsedp.measure.plan_measurement` of the
identity on the vector of kept values with ``unit`` = the L1 change of one neighbour (``hi - lo`` per
entry, ``k (hi - lo)`` per row; in grid units in secure mode), measured with
:meth:`~sparsedp.measure.MeasurementPlan.measure` (``counts=False``), which validates the vector,
charges the accountant with a ledger entry, then draws.

*Secure mode* (``secure=True``, the default): the clipped values are snapped to the grid ``gamma`` (default
``(hi - lo) / 1024``), ``k_i = round(clip(v_i) / gamma)``, and exact discrete Laplace noise
(:func:`sparsedp.noise.discrete_laplace`, random bits from an OS-seeded CSPRNG unless ``rng`` is a
seed or a Generator) is added to the integers; the release is ``gamma (k_i + z_i)``.  Snapping is
monotone, so a clipped value in ``[lo, hi]`` maps into ``[round(lo/gamma), round(hi/gamma)]`` and one
entry moves ``k`` by at most ``Delta_k = round(hi/gamma) - round(lo/gamma)`` grid units (``k Delta_k``
for one row at user level); ``z_i ~ DLap(t)`` with ``t = Delta_k / epsilon`` (entry level) or
``k Delta_k / epsilon`` (row level) is then ``epsilon``-DP (the geometric mechanism, Ghosh,
Roughgarden, Sundararajan 2009).  Per-entry noise variance ``gamma^2 2 q / (1 - q)^2``,
``q = exp(-1/t)`` (slightly below the ``2 b^2`` of the continuous Laplace with ``b = gamma t``).
``secure=False`` is the explicit opt-out to textbook float64 Laplace noise (it leaks through its low
bits, Mironov 2012; for experiments): ``b = k (hi - lo) / epsilon`` on the clipped values.

Order of operations (issue 19 #4): everything is validated first -- the budget (``check_epsilon``:
a real number in ``[1e-9, 1e6]``), the bounds (finite, ``lo < hi``, ``|lo|, |hi|`` and ``hi - lo`` at
most :data:`~sparsedp.validation.MAX_MAGNITUDE` ``= 2^50``: :class:`InputBoundError` above), the
per-row bound, the pattern and its values (finite, no duplicates), the grid and the snapped values
(secure mode), the generator argument, the accountant, and that the sampler accepts the scale (the
exact sampler's ``t <= MAX_DISCRETE_SCALE = 2^40`` grid units) -- then the accountant is charged,
then the per-row selection and the noise are drawn (the budget is checked with
:meth:`Accountant.check` before the selection touches the generator); nothing after the draw can
fail.  The scale is
certified: the width ``hi - lo`` is taken from the exact rationals of the float bounds and rounded
up, and ``b = k (hi - lo) / epsilon`` (``t = k Delta_k / epsilon``) is rounded up
(:func:`sparsedp.calibration.laplace_scale`), so ``k (hi - lo) / b <= epsilon`` holds exactly.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..measure import plan_measurement
from ..noise import as_generator, discrete_laplace_variance, laplace_variance, snap_to_grid
from ..privacy import Accountant, LedgerEntry
from ..strategies import identity
from ..validation import MAX_MAGNITUDE, check_epsilon, check_magnitude, check_positive
from ._observed import Pattern, as_pattern


@dataclass(frozen=True)
class PrivateObservations:
    """A privatized set of observed entries.

    ``matrix``: CSR matrix of the noisy values on the kept pattern.  ``scale``: Laplace scale ``b``
    (secure mode: ``gamma t``, the discrete scale in value units); ``sensitivity``: L1 sensitivity
    of the released vector under ``unit`` (in value units; secure mode: ``gamma Delta_k``);
    ``epsilon``: the privacy cost; ``dropped``: observations removed by the per-row bound;
    ``secure``/``grid``: exact discrete sampler on the grid ``gamma``; ``discrete_scale``: the scale
    ``t`` (grid units) the exact sampler was given (secure mode only); ``private``: False for noise
    from a seeded generator; ``entry``: the measurement's ledger record.
    """

    matrix: sp.csr_matrix
    epsilon: float
    bounds: tuple[float, float]
    scale: float
    sensitivity: float
    unit: str
    max_entries_per_row: int | None
    dropped: int
    secure: bool = False
    grid: float | None = None
    discrete_scale: float | None = None
    private: bool = True  # False when the noise came from a seeded generator (reproducible)
    entry: LedgerEntry | None = None  # the ledger record of the measurement

    @property
    def variance(self) -> float:
        """Noise variance per entry: ``2 b^2`` (float Laplace), or ``gamma^2 2 q / (1 - q)^2`` with
        ``q = exp(-gamma / b)`` (secure: discrete Laplace of scale ``t = b / gamma`` grid units)."""
        if self.secure and self.grid is not None:
            return self.grid**2 * discrete_laplace_variance(self.scale / self.grid)
        return laplace_variance(self.scale)

    @property
    def noise_std(self) -> float:
        """Noise standard deviation per entry, ``sqrt(2) b`` (what :func:`soft_impute` calibrates on)."""
        return math.sqrt(self.variance)


def check_bounds(bounds: Any) -> tuple[float, float]:
    """``(lo, hi)`` finite with ``lo < hi`` (else :class:`InvalidPrivacyParameterError`) and
    ``|lo|, |hi|, hi - lo <= MAX_MAGNITUDE = 2^50`` (else :class:`InputBoundError`)."""
    try:
        lo, hi = (float(v) for v in bounds)
    except (TypeError, ValueError) as exc:
        raise InvalidPrivacyParameterError(f"bounds must be a pair (lo, hi), got {bounds!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise InvalidPrivacyParameterError(f"bounds must be finite with lo < hi, got {bounds!r}")
    check_magnitude(np.array([lo, hi]), "bounds")
    check_magnitude(np.array([exact_width(lo, hi)]), "the width hi - lo of the bounds")
    return lo, hi


def exact_width(lo: float, hi: float, per_row: int = 1) -> float:
    """``per_row (hi - lo)`` from the exact rationals of the float bounds, rounded up to a float
    (the float subtraction can round down: ``0.7 - 0.1`` is below the exact difference)."""
    return _ceil_float((Fraction(hi) - Fraction(lo)) * per_row)


def _ceil_float(q: Fraction) -> float:
    """The smallest float ``>= q``."""
    f = float(q)
    return f if Fraction(f) >= q else math.nextafter(f, math.inf)


def observation_sensitivity(bounds: Any, max_entries_per_row: int | None = None) -> float:
    """L1 sensitivity of the clipped observed values: ``hi - lo`` per entry, ``k (hi - lo)`` per row
    (rounded up from the exact value)."""
    lo, hi = check_bounds(bounds)
    return exact_width(lo, hi, 1 if max_entries_per_row is None else _check_per_row(max_entries_per_row))


def _check_per_row(k: Any) -> int:
    """A positive integer per-row bound (not a bool, not a float with a fraction), else :class:`ShapeError`."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, numbers.Real) or k != math.floor(k) or k < 1:
        raise ShapeError(f"max_entries_per_row must be a positive integer, got {k!r}")
    k = int(k)
    if k > 2**31:
        raise ShapeError(f"max_entries_per_row must be at most 2^31, got {k!r}")
    return k


def bound_rows(pat: Pattern, k: int, rng: np.random.Generator) -> np.ndarray:
    """Indices (CSR order) of at most ``k`` entries per row, chosen uniformly at random per row."""
    keys = rng.random(pat.nnz)
    order = np.lexsort((keys, pat.rows))  # rows stay grouped, random order inside each row
    position = np.arange(pat.nnz) - np.repeat(pat.indptr[:-1], np.diff(pat.indptr))
    return np.sort(order[position < k])


def privatize_observations(
    observed: Any,
    epsilon: float,
    bounds: Any,
    rng: Any = None,
    *,
    max_entries_per_row: int | None = None,
    accountant: Accountant | None = None,
    secure: bool = True,
    grid: float | None = None,
) -> PrivateObservations:
    """Clip the observed entries to ``bounds`` and add Laplace noise (see the module docstring).

    Entry level: ``b = (hi - lo) / epsilon`` on every observed entry (``epsilon``-DP per entry; a row
    with ``k`` entries gets ``k epsilon``).  ``max_entries_per_row=k``: user level, at most ``k``
    entries per row kept, ``b = k (hi - lo) / epsilon`` (``epsilon``-DP per row).  ``accountant``:
    charged ``epsilon`` (with the measurement's ledger entry) before any noise is drawn
    (:class:`BudgetExceededError` if it does not fit).  ``secure=True`` (default): values snapped to
    the grid ``gamma = grid`` (default ``(hi - lo) / 1024``) and exact discrete Laplace noise
    ``DLap(t)``, ``t = Delta_k / epsilon`` grid units with ``Delta_k = round(hi/gamma) -
    round(lo/gamma)`` per entry (``k Delta_k`` per row); ``secure=False``: float64 Laplace noise (an
    explicit opt-out).  ``rng=None`` draws from an OS-seeded CSPRNG (:class:`sparsedp.noise.SecureRandomBits`); a seed or Generator
    is reproducible but not private (``private=False``).
    """
    # ---- 1. validate everything (nothing is charged or drawn before this block ends) ----
    eps = check_epsilon(epsilon, "epsilon")
    lo, hi = check_bounds(bounds)
    if accountant is not None and not isinstance(accountant, Accountant):
        raise SparseDPError(f"accountant must be a sparsedp.privacy.Accountant, got {type(accountant).__name__}")
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True (exact noise) or False (float noise), got {secure!r}")
    k = None if max_entries_per_row is None else _check_per_row(max_entries_per_row)
    per_row = 1 if k is None else k
    pat = as_pattern(observed)
    gen = as_generator(rng)  # checks the argument; creating or passing a generator draws nothing
    clipped = np.clip(pat.values, lo, hi)
    if secure:
        gamma = check_positive(grid, "grid") if grid is not None else (hi - lo) / 1024.0
        values = _snap(clipped, gamma, lo, hi)
        units = int(snap_to_grid(hi, gamma)) - int(snap_to_grid(lo, gamma))  # Delta_k, grid units
        if units < 1:
            raise InvalidPrivacyParameterError(f"grid {gamma!r} is coarser than the bounds {(lo, hi)!r}")
        unit = _ceil_float(Fraction(units * per_row))
    else:
        gamma, values = None, clipped
        unit = exact_width(lo, hi, per_row)
    kept = int(pat.nnz if k is None else np.minimum(np.diff(pat.indptr), k).sum())
    # the identity on the kept values; one neighbour moves them by <= unit in L1: Delta_1 = unit,
    # b = unit / epsilon rounded up (grid units when secure); the plan checks the sampler's range
    plan = plan_measurement(identity(kept), epsilon=eps, unit=unit, secure=bool(secure), grid=1.0)
    if accountant is not None:
        accountant.check(plan.cost)  # before the per-row selection advances the generator
    # ---- 2. select (pattern only), then measure: charge, then draw (nothing below can fail) ----
    rows, cols = pat.rows, pat.indices
    keep = None if k is None else bound_rows(pat, k, gen)
    if keep is not None:
        rows, cols, values = rows[keep], cols[keep], values[keep]
    unit_name = "entry" if k is None else "row"
    meas = plan.measure(values, accountant=accountant, rng=None if rng is None else gen, counts=False,
                        label=f"completion: Laplace on observed entries ({unit_name} level)")
    t = float(plan.scales[0])
    noisy = np.multiply(meas.y, gamma, out=meas.y) if secure else meas.y  # y is ours: scale in place
    matrix = sp.csr_matrix((noisy, (rows, cols)), shape=pat.shape)
    return PrivateObservations(
        matrix=matrix, epsilon=eps, bounds=(lo, hi), scale=gamma * t if secure else t,
        sensitivity=gamma * units * per_row if secure else unit, unit=unit_name, max_entries_per_row=k,
        dropped=pat.nnz - rows.size, secure=bool(secure), grid=gamma, discrete_scale=t if secure else None,
        private=meas.private, entry=meas.entry,
    )


def _snap(values: np.ndarray, gamma: float, lo: float, hi: float) -> np.ndarray:
    """``round(values / gamma)`` (half to even, as :func:`~sparsedp.noise.snap_to_grid`), as float64
    integers, computed in place in ``values`` (finite, already clipped to ``[lo, hi]``), checked before
    anything is charged: the grid must hold the bounds in at most ``2^50`` units, so every snapped
    value is an exact float64 integer and the integers plus noise stay exact (no int64 round trip)."""
    if max(abs(lo), abs(hi)) / gamma > MAX_MAGNITUDE:
        raise InvalidPrivacyParameterError(
            f"grid {gamma!r} is too fine for the bounds {(lo, hi)!r}: more than 2^50 grid units")
    out = np.divide(values, gamma, out=values)
    return np.rint(out, out=out)
