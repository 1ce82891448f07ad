"""Shared plumbing of the online counters: the increment domain, the accountant charge, step
bookkeeping, buffered noise draws and certified sensitivities.

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
  whatever the step's value is replaced by.

Negative, fractional (for counts), non-finite or overflowing increments are refused, never clipped:
clipping a count would silently change the data.

**Accountant.**  A counter's whole stream is one release of cost ``epsilon`` (or ``rho``): the
Laplace (Gaussian) mechanism on ``Sigma M x`` over all ``N`` steps.  A counter given
``accountant=`` charges it once, in the constructor, after every parameter has been checked and the
noise calibrated, and before the first noise value is drawn (the GLS-tree counter draws all its noise
in the constructor; the others draw lazily).  Charging at creation makes the charge independent of
the data and of how many steps are eventually used, and a refused budget refuses before anything is
released.  A counter rebuilt from a saved state continues the release that was charged when it was
created and charges nothing.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterable

import numpy as np
import scipy.sparse as sp

from ..calibration import round_up
from ..errors import BudgetExceededError, InputBoundError, NonFiniteInputError, SparseDPError
from ..noise import as_generator
from ..privacy import Accountant, PrivacyCost
from ..validation import MAX_MAGNITUDE
from .fenwick import check_horizon

__all__ = [
    "INCREMENTS",
    "MIN_RELATIVE_WEIGHT",
    "BufferedNoise",
    "StreamingCounter",
    "check_increments",
    "check_accountant",
    "exact_level_sensitivity",
    "certified_sum",
    "ceil_sqrt",
    "higham_gamma",
    "level_strategy",
]

#: The increment domains a counter can enforce (see the module docstring).
INCREMENTS = ("counts", "unit")
#: User-given weights are scaled to a largest weight of 1; a measured weight below this is refused
#: (noise divided by it, and variances divided by its square, must stay finite at every budget).
MIN_RELATIVE_WEIGHT = 1e-100

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


class BufferedNoise:
    """Draws i.i.d. ``Lap(0, scale)`` or ``N(0, scale^2)`` from ``rng`` in chunks (fast scalar draws).

    Chunks of ``chunk`` values are drawn with one numpy call; a value is used once.  Unused buffered
    values are never published and are discarded with the object.  Creating it draws nothing.
    """

    def __init__(self, kind: str, scale: float, rng: Any = None, chunk: int = 4096) -> None:
        if kind not in ("laplace", "gaussian"):
            raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {kind!r}")
        if not (math.isfinite(scale) and scale > 0):
            raise SparseDPError(f"noise scale must be finite and > 0, got {scale!r}")
        self.kind, self.scale, self.chunk = kind, float(scale), int(chunk)
        self._gen = as_generator(rng)
        self._buf: list[float] = []

    def _refill(self) -> None:
        if self.kind == "laplace":
            vals = self._gen.laplace(0.0, self.scale, self.chunk)
        else:
            vals = self._gen.normal(0.0, self.scale, self.chunk)
        self._buf = vals[::-1].tolist()  # pop() from the end returns them in draw order

    def draw(self) -> float:
        if not self._buf:
            self._refill()
        return self._buf.pop()


class StreamingCounter:
    """Base of every online counter: ``update(a_t)`` -> noisy ``s_t``; refuses step ``horizon + 1``
    and increments outside the domain (module docstring).

    Subclasses implement ``_step(a) -> float``, :meth:`measured_strategy` and :meth:`noise_scales`,
    and call :meth:`_charge` once, before their first noise draw.  ``last_variance`` is the exact
    variance of the last output (for subclasses that track it).
    """

    name = "counter"
    epsilon: float | None = None
    rho: float | None = None

    def __init__(self, horizon: int, increments: str = "counts") -> None:
        self.horizon = check_horizon(horizon)
        self.increments = check_increments(increments)
        self.t = 0
        self.last_variance = float("nan")
        self._total = 0.0  # the exact running sum of accepted increments (domain bookkeeping)

    # ---- privacy bookkeeping ----------------------------------------------------------------
    @property
    def privacy_cost(self) -> PrivacyCost:
        """What the whole stream costs: ``PrivacyCost(epsilon=...)`` or ``PrivacyCost(rho=...)``."""
        return PrivacyCost(rho=self.rho) if self.rho is not None else PrivacyCost(epsilon=self.epsilon or 0.0)

    def _charge(self, accountant: Accountant | None) -> None:
        """Charge :attr:`privacy_cost` to ``accountant`` (once, before any noise is drawn)."""
        if accountant is not None:
            accountant.spend(self.privacy_cost, label=f"continual: {self.name} counter, horizon {self.horizon}")

    def measured_strategy(self) -> sp.csr_matrix:
        """The weighted strategy ``Sigma M`` the counter measures (one row per noisy measurement,
        one column per step), built explicitly for audits (small horizons)."""
        raise NotImplementedError  # pragma: no cover - every counter overrides it

    def noise_scales(self) -> np.ndarray:
        """Per-row noise scale of :meth:`measured_strategy`: Laplace ``b_i`` or Gaussian ``sigma_i``."""
        raise NotImplementedError  # pragma: no cover

    # ---- the stream -------------------------------------------------------------------------
    def check_increment(self, a: Any) -> float:
        """``a`` as a float if it lies in the counter's increment domain given the running sum so far;
        :class:`NonFiniteInputError` for non-numbers and NaN/inf, :class:`InputBoundError` outside."""
        if isinstance(a, (str, bytes)) or a is None:
            raise NonFiniteInputError(f"increment must be a number, got {a!r}")
        try:
            value = float(a)
        except OverflowError as exc:  # an integer beyond float64
            raise InputBoundError(f"increment {a!r} is above the bound {MAX_MAGNITUDE:.0f} = 2^50") from exc
        except (TypeError, ValueError) as exc:
            raise NonFiniteInputError(f"increment must be a finite number, got {a!r}") from exc
        if not math.isfinite(value):
            raise NonFiniteInputError(f"increment must be finite, got {a!r}")
        if self.increments == "unit":
            if not 0.0 <= value <= 1.0:
                raise InputBoundError(f"increment {a!r} outside [0, 1] (increments='unit')")
            return value
        if value < 0 or value != math.floor(value):
            raise InputBoundError(f"increment {a!r} is not a non-negative integer count (increments='counts'; "
                                  "use increments='unit' for real values in [0, 1])")
        if self._total + value > MAX_MAGNITUDE:
            raise InputBoundError(f"increment {a!r} would take the running sum above {MAX_MAGNITUDE:.0f} = 2^50, "
                                  "beyond which float rounding, not noise, decides the output")
        return value

    def update(self, a: float) -> float:
        """Take the increment of step ``t + 1`` and return the noisy running sum at that step."""
        if self.t >= self.horizon:
            raise BudgetExceededError(
                f"{self.name}: the horizon of {self.horizon} steps is used up; step {self.t + 1} is refused"
            )
        value = self.check_increment(a)
        out = self._step(value)
        self.t += 1
        self._total += value
        return out

    def run(self, increments: Iterable[float]) -> np.ndarray:
        """``update`` over ``increments`` in order; the outputs as an array."""
        return np.array([self.update(a) for a in increments], dtype=np.float64)

    def _step(self, a: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


def level_strategy(N: int, level_blocks: list[tuple[int, float, bool]]) -> sp.csr_matrix:
    """The explicit strategy of a counter that measures aligned blocks: for each ``(size, weight,
    complete)`` one row per block ``[j size, (j + 1) size)`` of the (0-based) steps with entries
    ``weight``; ``complete=True`` keeps the blocks that end within the horizon only, ``False`` also
    the last one, cut at ``N``."""
    rows, cols, vals = [], [], []
    r = 0
    for size, weight, complete in level_blocks:
        blocks = N // size if complete else -(-N // size)
        for j in range(blocks):
            c = np.arange(j * size, min(N, (j + 1) * size))
            rows.append(np.full(c.size, r))
            cols.append(c)
            vals.append(np.full(c.size, weight))
            r += 1
    if r == 0:
        return sp.csr_matrix((0, N))
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, N))
