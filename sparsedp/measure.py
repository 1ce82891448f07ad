"""The one measurement path: ``y = A x + z`` with calibrated noise, checked, charged and recorded.

Every release is a strategy with per-row noise scales followed by post-processing (tree budgets,
Fenwick weights, LUE budgets, flow and completion scales are all per-row scales).  This module
is where privacy noise is drawn for a measurement:

1. :func:`plan_measurement` fixes *what* is measured -- the explicit matrix ``A`` (the operator's
   own entries, ``M.tosparse()``), the noise kind, per-row scales -- and computes its privacy loss
   from those entries with :mod:`sparsedp.calibration` (certified upper bounds)::

       Laplace  (epsilon-DP):  epsilon >= max_j sum_i |A_ij| / b_i
       Gaussian (rho-zCDP):    rho     >= max_j sum_i A_ij^2 / (2 sigma_i^2)

   Given ``epsilon`` (or ``rho``) alone, the scales are homoscedastic, ``b = Delta_1(A) / epsilon``
   (``sigma = Delta_2(A) / sqrt(2 rho)``), rounded up.  Given ``scales``, the loss of those scales
   is computed; a stated ``epsilon`` must cover it.  The plan owns what it calibrated: read-only
   copies (``O(nnz)``, never densified) of the interval rows, sparse matrices, Kronecker factors or
   explicit entries it measures, so editing the caller's operator afterwards changes nothing
   measured (issue 26).
2. :meth:`MeasurementPlan.measure` validates the data (shape, finite, counts, the input bound
   ``2^50`` on ``x`` and on ``A x``, the certified range of the product on the grid), the generator and the budget, **then** charges the
   accountant (with a :class:`~sparsedp.privacy.LedgerEntry`), **then** draws the noise.
   The identity (recognised from its entries, ``plan.identity``; completion and flows measure it
   on millions of values) takes a fast path with the same checks in one cache-blocked pass and
   no product: ``Delta_1 = Delta_2 = 1`` exactly, ``y = x + z``.

``secure=True`` (the default here) draws exact discrete Laplace / discrete Gaussian noise
(Canonne, Kamath, Steinke 2020) on the grid ``g``: ``y = g (round(A x / g) + k)``, ``k`` with
per-row scales ``t_i = b_i / g``.  If every ``A_ij / g`` is an integer and ``x`` is integral the
rounding is exact and the loss is the one above; otherwise each touched row can move by one more
grid unit, and the loss is computed for ``ceil(|A_ij| / g) + 1`` grid units per entry.
The product ``A x / g`` is the measured operator's certified
:meth:`~sparsedp.operators.Operator.grid_product` (:mod:`sparsedp.grid_product`): exact integers
on an exact grid (refused past ``2^61``), a row-local float product with rounding below a quarter
grid unit otherwise -- never a float product snapped as if it were exact.
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import noise as _noise
from .calibration import certified_sqrt, gaussian_loss, gaussian_sigma, laplace_loss, laplace_scale, sensitivity_bound
from .errors import (
    InputBoundError,
    InvalidPrivacyParameterError,
    ShapeError,
    SparseDPError,
    UnsupportedStructureError,
)
from .intervals import IntervalRows
from .operators import Operator, SparseOperator, aslinearoperator, frozen_csr
from .privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time, rho_for_approx_dp
from .privacy_unit import PrivacyUnit, disjoint_columns
from .validation import (
    MAX_MAGNITUDE,
    budget_fraction,
    check_counts,
    check_epsilon,
    check_magnitude,
    check_positive,
    check_rho,
    check_vector,
)

__all__ = ["Measurement", "MeasurementPlan", "NoiseStream", "plan_measurement", "measure"]


@dataclass(frozen=True)
class Measurement:
    """Noisy strategy answers and everything needed to use them."""

    y: np.ndarray  # noisy answers, one per strategy row
    strategy: Operator
    noise: str  # "laplace" or "gaussian"
    scales: np.ndarray  # per-row noise scale: Laplace b_i or Gaussian sigma_i, in data units
    variances: np.ndarray  # per-row noise variance Var(z_i)
    sensitivity: float  # Delta_1 (Laplace) or Delta_2 (Gaussian) of the strategy, data units (certified)
    cost: PrivacyCost
    secure: bool = False
    private: bool = True  # False when the noise came from a seeded (reproducible) generator
    entry: LedgerEntry | None = None  # the ledger record of this measurement


@dataclass(frozen=True)
class MeasurementPlan:
    """A calibrated measurement of a fixed matrix, ready to be applied to data (see module doc)."""

    strategy: Operator
    measured: Operator  # what computes A x: the explicit matrix, or an IntervalRows operator
    noise: str
    secure: bool
    grid: float
    grid_exact: bool  # secure only: every A_ij / grid is an integer
    scales: np.ndarray  # per-row scales in data units (b_i or sigma_i)
    unit_scales: np.ndarray  # per-row scales of the sampler (grid units when secure; = scales otherwise)
    sensitivity: float  # Delta_p of the matrix (grid units, bumped, when secure and inexact)
    data_sensitivity: float  # Delta_p of the matrix in data units (times ``unit``), certified
    loss: float  # certified epsilon (Laplace) or rho (Gaussian) of these scales on this matrix
    cost: PrivacyCost  # what is charged: the stated budget, which covers ``loss``
    row_factors: np.ndarray | None = None  # integer-row form: y = f * (integer rows x + noise)
    identity: bool = False  # the measured matrix is the identity (checked entry by entry): y = x + z
    privacy_unit: str | None = None  # whom it protects (None: one row), as the ledger records it

    def __post_init__(self) -> None:
        # The plan's own arrays (never the caller's: plan_measurement copies what it calibrates)
        # are made read-only, like the operator measured: a plan is fixed once calibrated.
        for arr in (self.scales, self.unit_scales, self.row_factors):
            if isinstance(arr, np.ndarray):
                arr.flags.writeable = False

    @property
    def rows(self) -> int:
        return int(self.measured.shape[0])

    @property
    def matrix(self) -> sp.csr_matrix:
        """The explicit matrix measured (built on demand for implicit interval rows)."""
        return sp.csr_matrix(self.measured.tosparse())

    def variances(self) -> np.ndarray:
        """Per-row noise variance ``Var(z_i)`` (exact discrete variances when secure)."""
        return self._variances.copy()

    @cached_property
    def _uniform(self) -> float | None:
        """The one scale every row has, if so (homoscedastic plans skip per-row work)."""
        s = self.unit_scales
        return float(s[0]) if s.size and float(s.min()) == float(s.max()) else None

    def _unit_noise(self, rows: int | None = None, sl: slice | np.ndarray | None = None) -> Any:
        """The sampler's scale argument: a scalar for homoscedastic plans, else per-row scales."""
        if self._uniform is not None:
            return self._uniform
        return self.unit_scales if sl is None else self.unit_scales[sl]

    @cached_property
    def _variances(self) -> np.ndarray:
        s = self.unit_scales
        if self._uniform is not None:
            var = np.full(s.size, self._variance_of(np.array([self._uniform]))[0])
        else:
            var = self._variance_of(s)
        return var if self.row_factors is None else var * self.row_factors**2

    def _variance_of(self, s: np.ndarray) -> np.ndarray:
        if not self.secure:
            return 2.0 * s * s if self.noise == "laplace" else s * s
        f = _noise.discrete_laplace_variance if self.noise == "laplace" else _noise.discrete_gaussian_variance
        uniq, inv = _noise._unique_inverse(s)  # np.unique's result, O(n) for scales in runs
        # A tiny scale has a variance that underflows (2 e^{-1/t}); report at least 1e-200 grid
        # units^2 (an overstatement, never an understatement) so estimators can weight by 1/var.
        unit = np.maximum(np.array([f(float(t)) for t in uniq]), 1e-200)
        return unit[inv] * self.grid**2

    def _charge(self, accountant: Accountant | None, label: str, seeded: bool, columns: int) -> LedgerEntry:
        """Spend this plan's cost with a ledger entry (raises, recording nothing, if it does not
        fit); the entry is returned (and made) with or without an accountant."""
        entry = LedgerEntry(
            label=label or f"measure({self.strategy.name})",
            cost=self.cost,
            rows=self.rows,
            columns=columns,
            noise=self.noise,
            secure=self.secure,
            private=not seeded,
            sensitivity=self.data_sensitivity,
            scale_min=float(self.scales.min()),
            scale_max=float(self.scales.max()),
            time=ledger_time(),
            privacy_unit=self.privacy_unit,
        )
        if accountant is not None:
            accountant.spend(self.cost, label=entry.label, entry=entry)
        return entry

    def noise_stream(
        self, *, accountant: Accountant | None = None, rng: Any = None, label: str = "", chunk: int = 4096
    ) -> "NoiseStream":
        """Charge now and return a :class:`NoiseStream` that draws this plan's noise row by row, in
        increasing row order, each row at most once (for streams whose data arrive later: the
        release is ``A x + z`` with ``z`` independent of the data, so drawing it early or lazily is
        the same measurement)."""
        _check_accountant(accountant)
        seeded, gen = _generator(rng)
        self._charge(accountant, label, seeded, int(self.measured.shape[1]))
        return NoiseStream(self, gen, not seeded, chunk)

    def measure(
        self,
        x: Any,
        *,
        accountant: Accountant | None = None,
        rng: Any = None,
        counts: bool = True,
        label: str = "",
    ) -> Measurement:
        """Validate ``x``, then charge ``accountant``, then draw ``y = A x + z``."""
        n = self.measured.shape[1]
        if self.identity:
            return self._measure_identity(x, accountant, rng, counts, label)
        xv = check_counts(x, n, "x") if counts else check_vector(x, n, "x")
        check_magnitude(xv, "x")
        if self.secure and self.grid_exact and not np.all(xv == np.round(xv)):
            raise SparseDPError("secure mode with an exact grid needs integral data; pass grid= or round x")
        _check_accountant(accountant)
        cells = None
        if self.secure:  # the certified product on the grid (sparsedp.grid_product), never a float guess
            cells = self._grid_cells(xv)
        else:
            exact = np.asarray(self.measured.matvec(xv), dtype=np.float64)
            if not np.all(np.isfinite(exact)):
                raise InputBoundError("A x overflows float64")
            check_magnitude(exact, "A x")
        seeded, gen = _generator(rng)
        entry = self._charge(accountant, label, seeded, n)
        if self.secure:
            k = _noise.noise(self.noise, self._unit_noise(), size=self.rows, rng=gen, secure=True)
            y = self.grid * (cells + k) if self.grid != 1.0 else cells + k
            if self.row_factors is not None:
                y = self.row_factors * y
        else:
            y = exact + _noise.noise(self.noise, self._unit_noise(), size=self.rows, rng=gen, secure=False)
        return Measurement(
            y=np.asarray(y, dtype=np.float64),
            strategy=self.strategy,
            noise=self.noise,
            scales=self.scales,
            variances=self.variances(),
            sensitivity=self.data_sensitivity,
            cost=self.cost,
            secure=self.secure,
            private=not seeded,
            entry=entry,
        )


    def _grid_cells(self, xv: np.ndarray) -> np.ndarray:
        """``round(A x / g)`` for exact noise, from the measured operator's certified
        :meth:`~sparsedp.operators.Operator.grid_product`: the exact integers ``(A / g) x`` on an
        exact grid (never a float product snapped as if exact), else a row-local float product
        whose rounding is below a quarter grid unit; then the documented bounds ``|A x| <= 2^50``
        and ``|A x / g| <= 2^50``."""
        raw = np.asarray(self.measured.grid_product(xv, self.grid, self.grid_exact))
        if self.grid_exact:
            cells = raw.astype(np.int64, copy=False)
            check_magnitude(cells.astype(np.float64), "A x / grid")
            check_magnitude(cells * self.grid, "A x")
            return cells
        if not np.all(np.isfinite(raw)):
            raise InputBoundError("A x overflows float64")
        check_magnitude(raw, "A x / grid")
        check_magnitude(raw * self.grid, "A x")
        return _noise.snap_to_grid(raw, 1.0)

    def _measure_identity(self, x: Any, accountant: Accountant | None, rng: Any, counts: bool,
                          label: str) -> Measurement:
        """:meth:`measure` for the identity (``plan.identity``): the same checks in the same order --
        shape, finite, counts, the input bound ``2^50``, integral data for exact noise, the
        generator and the accountant -- then the charge, then ``y = x + z``.  ``A x = x`` needs no
        product and no second bound check; for exact noise the plan's grid is 1, so ``x`` is its own
        grid cell and ``y = x + k`` (integers below ``2^53``: exact).  The release has the law (and,
        for the same generator, the values) of the general path's."""
        n = self.measured.shape[1]
        xv = _clean_vector(x, n, counts, counts or self.secure)
        if xv is None:  # the standard validators, which raise the precise error
            xv = check_counts(x, n, "x") if counts else check_vector(x, n, "x")
            if not counts:  # check_counts has checked the bound and integrality already
                check_magnitude(xv, "x")
                if self.secure and not np.array_equal(xv, np.round(xv)):
                    raise SparseDPError("secure mode with an exact grid needs integral data; pass grid= or round x")
        _check_accountant(accountant)
        seeded, gen = _generator(rng)
        entry = self._charge(accountant, label, seeded, n)
        if self.secure:  # int64 draws added to the integers x: one pass, exact below 2^53
            sampler = _noise.discrete_laplace if self.noise == "laplace" else _noise.discrete_gaussian
            y = np.add(xv, sampler(self._unit_noise(), self.rows, gen), dtype=np.float64)
        else:
            y = _noise.noise(self.noise, self._unit_noise(), size=self.rows, rng=gen, secure=False)
            y += xv  # in place: the noise array is ours
        return Measurement(
            y=y,
            strategy=self.strategy,
            noise=self.noise,
            scales=self.scales,
            variances=self.variances(),
            sensitivity=self.data_sensitivity,
            cost=self.cost,
            secure=self.secure,
            private=not seeded,
            entry=entry,
        )


class NoiseStream:
    """The noise of a charged :class:`MeasurementPlan`, drawn on demand (see
    :meth:`MeasurementPlan.noise_stream`).  Rows must be asked for in strictly increasing order,
    so no row's noise is ever handed out twice; values are in data units (``g k`` when secure).

    Noise is drawn ahead in batches of ``chunk`` rows (one sampler call per batch instead of one
    per row: the noise does not depend on the data, so drawing it early changes nothing); memory
    is ``O(chunk)``.  ``start``: the first row it may draw (rows below it are never drawn: a
    counter's keyed block of noise starts at its own row)."""

    def __init__(self, plan: MeasurementPlan, gen: Any, private: bool, chunk: int = 4096, start: int = 0) -> None:
        self.plan, self._gen, self.private = plan, gen, private
        start = int(start)
        if not 0 <= start <= plan.rows:
            raise ShapeError(f"a noise stream starts at a row in [0, {plan.rows}], got {start}")
        self._next = start  # rows below start are never drawn (a keyed block of a counter starts there)
        self._chunk = max(1, int(chunk))
        self._buf = np.zeros(0)
        self._buf_start = start  # row of self._buf[0]

    @property
    def next_row(self) -> int:
        """The smallest row that may still be drawn."""
        return self._next

    def _fill(self, upto: int) -> None:
        """Make the buffer cover rows ``[self._next, upto)``."""
        end = self._buf_start + self._buf.size
        if upto <= end:
            return
        start = max(end, self._next)
        stop = min(self.plan.rows, max(upto, start + self._chunk))
        p = self.plan
        z = _noise.noise(p.noise, p._unit_noise(sl=slice(start, stop)), size=stop - start, rng=self._gen,
                         secure=p.secure)
        z = p.grid * z if p.secure else z
        if p.row_factors is not None:
            z = p.row_factors[start:stop] * z
        keep = self._buf[max(self._next - self._buf_start, 0):] if end > self._next else np.zeros(0)
        self._buf = np.concatenate([keep, z])
        self._buf_start = start - keep.size

    def take(self, rows: Any) -> np.ndarray:
        """Noise for ``rows`` (strictly increasing, all ``>= next_row``)."""
        r = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        if r.size == 0:
            return np.zeros(0)
        if r[0] < self._next or np.any(np.diff(r) <= 0) or r[-1] >= self.plan.rows:
            raise SparseDPError(
                f"noise rows must be strictly increasing, from {self._next} and below {self.plan.rows}: "
                "a row's noise is drawn once"
            )
        self._fill(int(r[-1]) + 1)
        out = self._buf[r - self._buf_start]
        self._next = int(r[-1]) + 1
        return out

    def all(self) -> np.ndarray:
        """The noise of every remaining row."""
        return self.take(np.arange(self._next, self.plan.rows))


_BLOCK = 1 << 16  # elements per block of _clean_vector (512 KB: stays in cache)


def _clean_vector(x: Any, n: int, counts: bool, integral: bool) -> np.ndarray | None:
    """``x`` as a float64 vector if it passes every check of the standard validators -- length
    ``n``, finite, ``|x| <= MAX_MAGNITUDE``, non-negative (``counts``), integral (``integral``) --
    verified in one cache-blocked pass (block minima and maxima, in which NaN propagates, and
    ``rint(v) == v``); ``None`` if anything fails (the caller then runs the standard validators,
    which raise the precise error).  Never a weaker check: every condition is the validators'."""
    try:
        raw = x if isinstance(x, np.ndarray) else np.asarray(x)
    except (TypeError, ValueError):
        return None
    if raw.dtype.kind not in "biuf":  # text ("10" too), objects, ...: the validators refuse or vet them
        return None
    arr = np.asarray(raw, dtype=np.float64)
    if arr.ndim != 1 or arr.shape[0] != n:
        return None
    if arr.size == 0:
        return arr
    buf = np.empty(min(_BLOCK, arr.size)) if integral else None
    lo, hi = math.inf, -math.inf
    for a in range(0, arr.size, _BLOCK):
        v = arr[a:a + _BLOCK]
        vmin, vmax = float(v.min()), float(v.max())  # NaN if any NaN
        if not (math.isfinite(vmin) and math.isfinite(vmax)):
            return None
        lo, hi = min(lo, vmin), max(hi, vmax)
        if buf is not None:
            w = buf[:v.size]
            np.rint(v, out=w)
            if not np.array_equal(w, v):
                return None
    if max(-lo, hi) > MAX_MAGNITUDE or (counts and lo < 0):
        return None
    return arr


def _check_accountant(accountant: Any) -> None:
    if accountant is not None and not isinstance(accountant, Accountant):
        raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")


def _generator(rng: Any) -> tuple[bool, Any]:
    """``(seeded, generator)``: validates ``rng`` (before any charge) and says whether it is seeded."""
    seeded = rng is not None and not (isinstance(rng, _noise.SecureRandomBits) and rng.secure)
    gen = rng if rng is None or isinstance(rng, _noise.SecureRandomBits) else _noise.as_generator(rng)
    return seeded, gen


def _quantize_up(t: np.ndarray, steps: int = 64) -> np.ndarray:
    """Round every scale *up* to the grid ``2^(k / steps)``: more noise, never less (so the loss
    only falls); the exact samplers then build at most a few tables per octave."""
    k = np.ceil(np.log2(t) * steps)
    q = np.exp2(k / steps)
    return np.where(q >= t, q, np.exp2((k + 1) / steps))  # log2's rounding can leave q a hair below t


def _budget(noise: str, epsilon: Any, rho: Any, delta: Any) -> tuple[float | None, float | None]:
    """Validated ``(epsilon, rho)``: one of them set, as the noise kind requires."""
    if noise not in ("laplace", "gaussian"):
        raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
    if noise == "laplace":
        if rho is not None or delta is not None:
            raise InvalidPrivacyParameterError("Laplace noise takes epsilon only (pure DP)")
        return (None if epsilon is None else check_epsilon(epsilon, "epsilon")), None
    if rho is None:
        if epsilon is None and delta is None:
            return None, None
        if epsilon is None or delta is None:
            raise InvalidPrivacyParameterError("Gaussian noise needs rho, or epsilon and delta")
        rho = rho_for_approx_dp(check_epsilon(epsilon, "epsilon"), delta)
    elif epsilon is not None:
        raise InvalidPrivacyParameterError("give rho or (epsilon, delta), not both")
    return None, check_rho(rho, "rho")


def _times(value: float, factor: float) -> float:
    """``value * factor`` rounded up (exact when both are integers below 2^26)."""
    prod = value * factor
    if not math.isfinite(prod):
        return prod
    if value == math.floor(value) and factor == math.floor(factor) and prod < 2.0**52:
        return prod
    return math.nextafter(prod, math.inf)


def _is_identity(A: sp.csr_matrix) -> bool:
    """Whether the CSR matrix ``A`` is the identity, checked entry by entry (never from a claimed
    structure): square, one stored entry per row (``indptr = 0, 1, .., n``), on the diagonal
    (``indices = 0, .., n - 1``), equal to 1."""
    n = A.shape[0]
    if A.shape[1] != n or A.nnz != n or A.indptr[0] != 0 or A.indices.size != n:
        return False
    ramp = np.arange(n + 1, dtype=A.indptr.dtype)
    return (np.array_equal(A.indptr, ramp) and np.array_equal(A.indices, ramp[:n].astype(A.indices.dtype, copy=False))
            and bool(np.all(A.data == 1.0)))


def _owned(op: Operator) -> Operator:
    """The operator a plan keeps: for the kinds whose arrays the plan measures directly
    (:class:`IntervalRows`, :class:`SparseOperator` and :class:`~sparsedp.marginals.KronOperator`,
    exact types) a copy with read-only arrays (``frozen_copy``, ``O(nnz)``), so that editing the
    caller's operator after planning (``M.weights[:] = 1e6``) changes neither what is measured nor
    what it was calibrated for.  Any other operator is returned as is: it is calibrated and
    measured through a read-only copy of its explicit entries (:func:`_explicit_calibration`,
    :func:`_integer_form`)."""
    from .marginals.kron import KronOperator  # local: marginals imports this module

    if type(op) in (IntervalRows, SparseOperator, KronOperator):
        return op.frozen_copy()  # type: ignore[attr-defined]
    return op


def _explicit_calibration(
    op: Operator, secure: bool, g: float, p: int, unit_scales: np.ndarray | None
) -> tuple[Operator, bool, float, float, float, bool]:
    """From the explicit entries: (measured operator, grid exact, sensitivity, loss of the scales,
    identity).  The identity (float noise, or exact noise on the grid 1) is recognised from its
    entries: every column holds one 1, so ``Delta_1 = Delta_2 = 1`` exactly, the grid is exact,
    and :meth:`MeasurementPlan.measure` skips the product (``y = x + z``)."""
    A = sp.csr_matrix(op.tosparse(), dtype=np.float64)
    if type(op) is not SparseOperator:  # a SparseOperator here is the plan's frozen copy (_owned)
        A = frozen_csr(A)  # the operator may hand out a matrix it keeps (and its caller may edit)
    if A.shape != op.shape:
        raise ShapeError(f"the strategy's explicit form has shape {A.shape}, not {op.shape}")
    if (not secure or g == 1.0) and _is_identity(A):
        loss = float("nan") if unit_scales is None else _loss(A, unit_scales, p)
        return SparseOperator(A, name=op.name), True, 1.0, 1.0, loss, True
    if A.nnz and not np.all(np.isfinite(A.data)):
        raise ShapeError("the strategy contains NaN or infinite entries")
    # the matrix in the sampler's units: A / g (exact grid), or ceil(|A| / g) + 1 (rounding)
    grid_exact = True
    unit = A
    if secure:
        unit = sp.csr_matrix(A / g) if g != 1.0 else A  # A / 1 is A: no copy, one sensitivity below
        grid_exact = bool(np.all(unit.data == np.round(unit.data)))
        if not grid_exact:
            unit = unit.copy()
            unit.data = np.ceil(np.abs(unit.data)) + 1.0
    sens = _sensitivity(unit, p)
    data_sens = sens if unit is A else _sensitivity(A, p)
    loss = float("nan") if unit_scales is None else _loss(unit, unit_scales, p)
    return SparseOperator(A, name=op.name), grid_exact, sens, data_sens, loss, False


def _interval_calibration(
    op: IntervalRows, secure: bool, g: float, p: int, unit_scales: np.ndarray | None
) -> tuple[Operator, bool, float, float, float, bool]:
    """The same for interval rows, by the exact integer coverage of :class:`IntervalRows`."""
    grid_exact = True
    unit = op
    if secure:
        w = op.weights / g if g != 1.0 else op.weights
        grid_exact = bool(np.all(w == np.round(w)))
        if not grid_exact:
            w = np.ceil(np.abs(w)) + 1.0
        if w is not op.weights:  # g == 1 with integer weights: the operator itself, not a copy
            unit = IntervalRows(op.shape[1], op.lo, op.hi, w)
    sens = _sensitivity(unit, p)
    data_sens = sens if unit is op else _sensitivity(op, p)
    loss = float("nan") if unit_scales is None else _loss(unit, unit_scales, p)
    return op, grid_exact, sens, data_sens, loss, False


def _sensitivity(A: IntervalRows | sp.spmatrix, p: int) -> float:
    """Certified ``Delta_p`` of a measured matrix: interval rows by their exact integer coverage,
    anything else from its explicit entries."""
    if type(A) is IntervalRows:
        return A.certified_loss(None, 1) if p == 1 else float(certified_sqrt(A.certified_loss(None, 2)))
    return sensitivity_bound(A, p)


def _loss(A: IntervalRows | sp.spmatrix, unit_scales: np.ndarray, p: int) -> float:
    """Certified epsilon (``p = 1``) or rho (``p = 2``) of measuring ``A`` with per-row scales."""
    if type(A) is IntervalRows:
        loss = A.certified_loss(unit_scales, p)
        return loss if p == 1 else math.nextafter(loss / 2.0, math.inf)
    return laplace_loss(A, unit_scales) if p == 1 else gaussian_loss(A, unit_scales)


def _check_scales(scales: Any, m: int) -> np.ndarray:
    """Per-row scales (a scalar broadcast to ``m`` rows), finite and > 0."""
    out = np.broadcast_to(np.asarray(scales, dtype=np.float64), (m,)).copy()
    if not np.all(np.isfinite(out)) or np.any(out <= 0):
        raise InvalidPrivacyParameterError("scales must be finite and > 0")
    return out


def _charge_for(noise: str, loss: float, eps: float | None, r: float | None, unit_scales: np.ndarray,
                secure: bool, calibrated: bool = False) -> PrivacyCost:
    """What a plan charges: the stated budget, which must cover ``loss`` (else ``loss`` itself), in
    the accepted range; and, for exact noise, scales the sampler accepts.  The budget is the number
    as written (:func:`~sparsedp.validation.budget_fraction`, what an Accountant charges), and the
    certified ``loss`` must not exceed it in exact arithmetic (``calibrated``: the scales were
    computed from the budget by :func:`~sparsedp.calibration.laplace_scale` /
    :func:`~sparsedp.calibration.gaussian_sigma`, which guarantee it)."""
    budget = eps if noise == "laplace" else r
    if budget is not None and not calibrated and Fraction(loss) > budget_fraction(budget):
        raise InvalidPrivacyParameterError(
            f"these scales cost {'epsilon' if noise == 'laplace' else 'rho'} {loss!r} on this matrix, "
            f"more than the {budget!r} given"
        )
    charged = budget if budget is not None else loss
    if noise == "laplace":
        check_epsilon(charged, "epsilon of these scales")
    else:
        check_rho(charged, "rho of these scales")
    if secure and float(unit_scales.max()) > _noise.MAX_DISCRETE_SCALE:
        raise InvalidPrivacyParameterError(
            f"the exact sampler's scale would be {float(unit_scales.max()):.6g} grid units, above its limit "
            f"{_noise.MAX_DISCRETE_SCALE:g}: raise epsilon/rho or the grid"
        )
    return PrivacyCost(epsilon=charged) if noise == "laplace" else PrivacyCost(rho=charged)


def _integer_form(op: Operator) -> tuple[Operator, np.ndarray] | None:
    """``(H, f)`` with ``op = diag(f) H`` and ``H`` integer, when the operator says so: a Haar-like
    ``integer_rows`` form, a weighted strategy over an integer base, or interval rows with
    non-integer weights.  ``None`` when ``op`` is already integer or has no such form."""
    if type(op) is IntervalRows:  # the plan's frozen copy (_owned): its weights are read-only
        w = op.weights
        if np.all(w == np.round(w)):
            return None
        return IntervalRows(op.shape[1], op.lo, op.hi, name=f"{op.name} (unit rows)").frozen_copy(), w
    if not isinstance(op, SparseOperator):
        return None
    if type(op) is not SparseOperator:  # a subclass is not copied by _owned: copy what is measured
        op = op.frozen_copy()
    form = op.meta.get("integer_rows") if op.base is None else None
    if form is not None:
        H, f = form  # frozen by SparseOperator.frozen_copy
        return SparseOperator(H, name=f"{op.name} (integer rows)"), f
    if op.base is not None and op.row_weights is not None:
        base = op.base
        if isinstance(base, SparseOperator) and base.matrix.nnz and np.all(base.matrix.data == np.round(base.matrix.data)):
            if not np.all(op.row_weights == np.round(op.row_weights)):
                return base, op.row_weights
    return None


def _integer_rows_plan(op: Operator, form: tuple[Operator, np.ndarray], noise: str, eps: float | None,
                       r: float | None, scales: Any, max_distinct_scales: int) -> MeasurementPlan:
    """Exact noise for a strategy ``A = diag(f) H`` with integer ``H`` (Haar for any ``n``,
    weighted strategies, weighted trees): measure ``H x`` on the exact integer grid with per-row
    scales ``b_i / |f_i|`` and release ``f_i (H x + z)_i``, which has the law of ``A x`` plus noise of
    scale ``b_i`` on a grid of ``|f_i|``.  The loss is certified on ``H`` and those scales
    (``max_j sum_i |H_ij| |f_i| / b_i``); without the integer form the inexact-grid rule would add
    one unit per touched row (2.2x more noise for Haar at n = 37)."""
    H, f = form
    if H.shape != op.shape or f.shape != (op.shape[0],) or not np.all(np.isfinite(f)) or np.any(f == 0):
        raise ShapeError("an integer form needs an integer matrix of the strategy's shape and a non-zero factor per row")
    if type(H) is not IntervalRows and not np.all(H.tosparse().data == np.round(H.tosparse().data)):
        raise ShapeError("integer_rows must be an integer matrix")
    p = 1 if noise == "laplace" else 2
    data_sens = _sensitivity(op if type(op) is IntervalRows else sp.csr_matrix(op.tosparse(), dtype=np.float64), p)
    if scales is None:
        b = laplace_scale(data_sens, eps) if noise == "laplace" else gaussian_sigma(data_sens, r)
        target = np.full(op.shape[0], b)
    else:
        target = _check_scales(scales, op.shape[0])
    # scales on the integer rows, with a 2^-40 margin over the certificate's rounding slack
    unit_scales = np.nextafter(target / np.abs(f), np.inf) * (1.0 + 2.0**-40)
    if _noise._unique_values(unit_scales).size > int(max_distinct_scales):
        unit_scales = _quantize_up(unit_scales)
    Hm = H if type(H) is IntervalRows else sp.csr_matrix(H.tosparse(), dtype=np.float64)
    loss = _loss(Hm, unit_scales, p)
    h_sens = _sensitivity(Hm, p)
    cost = _charge_for(noise, loss, eps, r, unit_scales, secure=True)
    return MeasurementPlan(
        strategy=op, measured=H, noise=noise, secure=True, grid=1.0, grid_exact=True,
        scales=unit_scales * np.abs(f), unit_scales=unit_scales, sensitivity=h_sens, data_sensitivity=data_sens,
        loss=loss, cost=cost, row_factors=f,
    )


def plan_measurement(
    M: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    delta: float | None = None,
    scales: Any = None,
    noise: str = "laplace",
    secure: bool = True,
    grid: float = 1.0,
    unit: float = 1.0,
    max_distinct_scales: int = 64,
    privacy_unit: Any = None,
) -> MeasurementPlan:
    """Calibrate a measurement of ``M`` (see the module docstring); nothing is drawn or charged.

    Give ``epsilon`` (Laplace) or ``rho`` / ``(epsilon, delta)`` (Gaussian) for homoscedastic noise
    calibrated to the sensitivity, or ``scales`` (one per row, or a scalar) for given per-row scales:
    the plan's ``loss`` is then what they cost, and a budget given beside them must cover it.

    ``unit``: one record changes ``x`` by a vector ``d`` with ``||d||_1 <= unit`` (default 1: one
    count by one).  Then ``||A d||_1 <= unit Delta_1(A)`` and ``||A d||_2 <= unit Delta_2(A)``, so
    the sensitivity is multiplied by ``unit`` (a restaurant order: 5; a trip of at most ``L`` edges
    counted with its two end points: ``L + 2``; a bounded value: the width of its range).

    ``privacy_unit``: a :class:`~sparsedp.privacy_unit.PrivacyUnit` whose contribution bounds the
    data obey (truncated with :func:`~sparsedp.privacy_unit.truncate`): one unit moves ``x`` by ``d``
    with ``||d||_1 <= unit.l1_bound()`` (and ``||d||_2 <= unit.l2_bound()``), so the sensitivity is
    multiplied by ``||d||_1`` -- or, with Gaussian noise on a strategy whose columns have disjoint
    supports, by ``||d||_2`` -- on top of ``unit``.  The ledger entry names the unit.

    ``max_distinct_scales``: with exact noise the sampler builds a table per distinct scale; when
    more scales are given, each is rounded *up* to the grid ``2^(k/64)`` (at most 1.1% more noise
    standard deviation; the loss is computed after rounding, so it only falls).
    """
    op = _owned(aslinearoperator(M, name="strategy"))  # read-only copies: later edits of M change nothing
    eps, r = _budget(noise, epsilon, rho, delta)
    m = op.shape[0]
    g = check_positive(grid, "grid")
    p = 1 if noise == "laplace" else 2
    secure = bool(secure)
    c = check_positive(unit, "unit")
    pu = _privacy_unit(privacy_unit)
    if pu is not None and not pu.is_row:
        c = _times(c, pu.multiplier(noise, p == 2 and disjoint_columns(op)))
    if scales is not None:
        unit_scales = _check_scales(scales, m)
    integer_form = _integer_form(op) if secure and c == 1.0 and g == 1.0 else None
    if integer_form is not None:
        return _integer_rows_plan(op, integer_form, noise, eps, r, scales, max_distinct_scales)
    if scales is not None and secure:
        unit_scales = np.nextafter(unit_scales / g, np.inf)  # never below the scale asked for
        if _noise._unique_values(unit_scales).size > int(max_distinct_scales):
            unit_scales = _quantize_up(unit_scales)
    given = unit_scales if scales is not None else None
    # exact structured loss for interval rows; a structured operator by its own rule (a Kronecker
    # product from its factors, a Toeplitz strategy from its first column: Operator.calibration_rule);
    # anything else from its entries
    rule = op.calibration_rule() if isinstance(op, Operator) else None
    calibrate = _interval_calibration if type(op) is IntervalRows else rule or _explicit_calibration
    measured, grid_exact, sens, data_sens, given_loss, is_identity = calibrate(op, secure, g, p, given)
    if sens == 0:
        raise ShapeError("the strategy has no non-zero entry: nothing to measure")
    if c != 1.0:
        if secure and not grid_exact:
            raise UnsupportedStructureError(
                "unit != 1 with an inexact grid: rounding bounds hold per changed entry; snap the data to the grid")
        sens = _times(sens, c)
        data_sens = _times(data_sens, c)
        given_loss = _times(given_loss, c if p == 1 else c * c)
    if scales is None:
        if eps is None and r is None:
            raise InvalidPrivacyParameterError("give a budget (epsilon or rho) or per-row scales")
        s = laplace_scale(sens, eps) if noise == "laplace" else gaussian_sigma(sens, r)
        unit_scales = np.full(m, s)
        # Delta (certified >= the exact one) / scale (rounded up) <= the budget: no recomputation,
        # which could only add the certificate's own slack
        loss = eps if noise == "laplace" else r
    else:
        loss = given_loss
    cost = _charge_for(noise, loss, eps, r, unit_scales, secure, calibrated=scales is None)
    return MeasurementPlan(
        strategy=op,
        measured=measured,
        noise=noise,
        secure=secure,
        grid=g,
        grid_exact=grid_exact,
        scales=unit_scales * g if secure else unit_scales,
        unit_scales=unit_scales,
        sensitivity=sens,
        data_sensitivity=data_sens,
        loss=loss,
        cost=cost,
        identity=is_identity,
        privacy_unit=None if pu is None or pu.is_row else pu.label,
    )


def _privacy_unit(value: Any) -> Any:
    """``None`` or a :class:`~sparsedp.privacy_unit.PrivacyUnit` (anything else refused)."""
    if value is None or isinstance(value, PrivacyUnit):
        return value
    raise SparseDPError(f"privacy_unit must be a PrivacyUnit, got {type(value).__name__}")


def measure(
    M: Any,
    x: Any,
    *,
    epsilon: float | None = None,
    rho: float | None = None,
    delta: float | None = None,
    scales: Any = None,
    noise: str = "laplace",
    secure: bool = True,
    grid: float = 1.0,
    accountant: Accountant | None = None,
    rng: Any = None,
    counts: bool = True,
    label: str = "",
    unit: float = 1.0,
    privacy_unit: Any = None,
) -> Measurement:
    """Measure ``M x`` with calibrated noise: :func:`plan_measurement` then
    :meth:`MeasurementPlan.measure` (validate, charge, draw).  Exact noise by default."""
    plan = plan_measurement(M, epsilon=epsilon, rho=rho, delta=delta, scales=scales, noise=noise,
                            secure=secure, grid=grid, unit=unit, privacy_unit=privacy_unit)
    return plan.measure(x, accountant=accountant, rng=rng, counts=counts, label=label)
