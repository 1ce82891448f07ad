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

Neither mode hides WHICH entries are observed: the pattern ``Omega`` is treated as public.  By
default the float Laplace sampler is used (see :mod:`sparsedp.noise` on floating-point attacks).

*Secure mode* (``secure=True``): the clipped values are snapped to the grid ``gamma`` (default
``(hi - lo) / 1024``), ``k_i = round(clip(v_i) / gamma)``, and exact discrete Laplace noise
(:func:`sparsedp.noise.discrete_laplace`, random bits from the operating system unless ``rng`` is a
seed or a Generator) is added to the integers; the release is ``gamma (k_i + z_i)``.  Snapping is
monotone, so a clipped value in ``[lo, hi]`` maps into ``[round(lo/gamma), round(hi/gamma)]`` and one
entry moves ``k`` by at most ``Delta_k = round(hi/gamma) - round(lo/gamma)`` grid units (``k Delta_k``
for one row at user level); ``z_i ~ DLap(t)`` with ``t = Delta_k / epsilon`` (entry level) or
``k Delta_k / epsilon`` (row level) is then ``epsilon``-DP (the geometric mechanism, Ghosh,
Roughgarden, Sundararajan 2009).  Per-entry noise variance ``gamma^2 2 q / (1 - q)^2``,
``q = exp(-1/t)`` (slightly below the ``2 b^2`` of the continuous Laplace with ``b = gamma t``).  Bad input
(non-finite values, ``epsilon <= 0``, ``lo >= hi``, no entries) raises before any noise is drawn and
before the accountant is charged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import InvalidPrivacyParameterError, ShapeError
from ..noise import as_generator, discrete_laplace, discrete_laplace_variance, laplace, laplace_variance, snap_to_grid
from ..privacy import Accountant, PrivacyCost
from ..validation import check_positive
from ._observed import Pattern, as_pattern


@dataclass(frozen=True)
class PrivateObservations:
    """A privatized set of observed entries.

    ``matrix``: CSR matrix of the noisy values on the kept pattern.  ``scale``: Laplace scale ``b``
    (secure mode: ``gamma t``, the discrete scale in value units); ``sensitivity``: L1 sensitivity
    of the released vector under ``unit`` (in value units; secure mode: ``gamma Delta_k``);
    ``epsilon``: the privacy cost; ``dropped``: observations removed by the per-row bound;
    ``secure``/``grid``: exact discrete sampler on the grid ``gamma``.
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
    """``(lo, hi)`` finite with ``lo < hi``, else :class:`InvalidPrivacyParameterError`."""
    try:
        lo, hi = (float(v) for v in bounds)
    except (TypeError, ValueError) as exc:
        raise InvalidPrivacyParameterError(f"bounds must be a pair (lo, hi), got {bounds!r}") from exc
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
        raise InvalidPrivacyParameterError(f"bounds must be finite with lo < hi, got {bounds!r}")
    return lo, hi


def observation_sensitivity(bounds: Any, max_entries_per_row: int | None = None) -> float:
    """L1 sensitivity of the clipped observed values: ``hi - lo`` per entry, ``k (hi - lo)`` per row."""
    lo, hi = check_bounds(bounds)
    return (hi - lo) * (1 if max_entries_per_row is None else int(max_entries_per_row))


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
    secure: bool = False,
    grid: float | None = None,
) -> PrivateObservations:
    """Clip the observed entries to ``bounds`` and add Laplace noise (see the module docstring).

    Entry level: ``b = (hi - lo) / epsilon`` on every observed entry (``epsilon``-DP per entry; a row
    with ``k`` entries gets ``k epsilon``).  ``max_entries_per_row=k``: user level, at most ``k``
    entries per row kept, ``b = k (hi - lo) / epsilon`` (``epsilon``-DP per row).  ``accountant``:
    charged ``epsilon`` before any noise is drawn (:class:`BudgetExceededError` if it does not fit).
    ``secure=True``: values snapped to the grid ``gamma = grid`` (default ``(hi - lo) / 1024``) and
    exact discrete Laplace noise ``DLap(t)``, ``t = Delta_k / epsilon`` grid units with
    ``Delta_k = round(hi/gamma) - round(lo/gamma)`` per entry (``k Delta_k`` per row); ``rng=None``
    draws the bits from the operating system, a seed or Generator is reproducible but not secure.
    """
    eps = check_positive(epsilon, "epsilon")
    lo, hi = check_bounds(bounds)
    pat = as_pattern(observed)
    if max_entries_per_row is not None:
        if int(max_entries_per_row) != max_entries_per_row or max_entries_per_row < 1:
            raise ShapeError(f"max_entries_per_row must be a positive integer, got {max_entries_per_row!r}")
        max_entries_per_row = int(max_entries_per_row)
    per_row = 1 if max_entries_per_row is None else max_entries_per_row
    if secure:
        gamma = check_positive(grid, "grid") if grid is not None else (hi - lo) / 1024.0
        units = int(snap_to_grid(hi, gamma)) - int(snap_to_grid(lo, gamma))  # Delta_k, grid units
        if units < 1:
            raise InvalidPrivacyParameterError(f"grid {gamma!r} is coarser than the bounds {(lo, hi)!r}")
        sens = gamma * units * per_row
        if sens / gamma / eps > 2.0**40:
            raise InvalidPrivacyParameterError("discrete Laplace scale above 2^40 grid units: use a coarser grid")
    else:
        gamma = None
        sens = observation_sensitivity((lo, hi), max_entries_per_row)
    scale = sens / eps
    if accountant is not None:
        unit = "entry" if max_entries_per_row is None else "row"
        accountant.spend(PrivacyCost(epsilon=eps), label=f"completion: Laplace on observed entries ({unit} level)")
    gen = as_generator(rng)
    rows, cols, vals = pat.rows, pat.indices, pat.values
    if max_entries_per_row is not None:
        keep = bound_rows(pat, max_entries_per_row, gen)
        rows, cols, vals = rows[keep], cols[keep], vals[keep]
    if gamma is not None:
        ints = snap_to_grid(np.clip(vals, lo, hi), gamma) + discrete_laplace(scale / gamma, vals.size, None if rng is None else gen)
        noisy = gamma * ints.astype(np.float64)
    else:
        noisy = np.clip(vals, lo, hi) + laplace(scale, vals.size, gen)
    matrix = sp.csr_matrix((noisy, (rows, cols)), shape=pat.shape)
    return PrivateObservations(
        matrix=matrix, epsilon=eps, bounds=(lo, hi), scale=scale, sensitivity=sens,
        unit="entry" if max_entries_per_row is None else "row", max_entries_per_row=max_entries_per_row,
        dropped=pat.nnz - vals.size, secure=bool(secure), grid=gamma,
    )
