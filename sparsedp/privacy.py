"""Privacy budgets and accounting.

Two notions, one interface:

* pure ``epsilon``-DP (Laplace mechanisms).  Sequential composition adds epsilons; parallel
  composition (measurements on disjoint parts of the data) costs the maximum.
* ``rho``-zCDP (Gaussian mechanisms; Bun and Steinke, TCC 2016).  Sequential composition adds rhos;
  ``epsilon``-DP implies ``epsilon^2 / 2``-zCDP; ``rho``-zCDP implies
  ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP.

An :class:`Accountant` holds a total budget and refuses (with :class:`BudgetExceededError`) any
spend that would exceed it, *before* the caller draws noise: mechanisms call :meth:`Accountant.spend`
first and sample only if it returns.
"""

from __future__ import annotations

import math
import numbers
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from .errors import BudgetExceededError, InvalidPrivacyParameterError
from .validation import budget_fraction, check_positive, check_probability

__all__ = [
    "PrivacyCost",
    "LedgerEntry",
    "Accountant",
    "zcdp_to_approx_dp",
    "rho_for_approx_dp",
    "sequential",
    "parallel",
]

#: Seconds to which a ledger entry's charge time is rounded down (one hour).
LEDGER_TIME_RESOLUTION = 3600


def ledger_time(now: float | None = None) -> float:
    """The time a ledger records for a charge made ``now`` (default: the clock), rounded down to
    :data:`LEDGER_TIME_RESOLUTION`: precise enough to order and audit releases, too coarse to time
    the reading of the data that came before the charge."""
    import time as _time

    t = _time.time() if now is None else float(now)
    return float(int(t // LEDGER_TIME_RESOLUTION) * LEDGER_TIME_RESOLUTION)


@dataclass(frozen=True)
class PrivacyCost:
    """The privacy loss of one release: pure ``epsilon``, or ``rho``-zCDP.  Exactly one is > 0."""

    epsilon: float = 0.0
    rho: float = 0.0

    def __post_init__(self) -> None:
        for name in ("epsilon", "rho"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
                raise InvalidPrivacyParameterError(f"{name} must be a real number, got {value!r}")
            value = float(value)
            if not math.isfinite(value) or value < 0:
                raise InvalidPrivacyParameterError(f"{name} must be finite and >= 0, got {value!r}")
            object.__setattr__(self, name, value)
        if self.epsilon > 0 and self.rho > 0:
            raise InvalidPrivacyParameterError("a cost is either pure epsilon or rho-zCDP, not both")

    @property
    def is_pure(self) -> bool:
        return self.rho == 0.0

    def as_rho(self) -> float:
        """The cost in zCDP: ``rho``, or ``epsilon^2 / 2`` for a pure cost (Bun-Steinke Prop. 1.4)."""
        return self.rho if self.rho > 0 else self.epsilon**2 / 2

    def exact_rho(self) -> Fraction:
        """:meth:`as_rho` in exact rational arithmetic over the budgets as written
        (:func:`budget_fraction`)."""
        return budget_fraction(self.rho) if self.rho > 0 else budget_fraction(self.epsilon) ** 2 / 2


@dataclass(frozen=True)
class LedgerEntry:
    """One accepted spend in an :class:`Accountant`'s ledger: what was measured and how.

    Entries made by :func:`sparsedp.measure.measure` fill every field; a spend made with a bare
    :class:`PrivacyCost` records the label and cost only (the other fields are ``None``)."""

    label: str
    cost: PrivacyCost
    rows: int | None = None  # rows of the measured matrix
    columns: int | None = None  # its columns (the data's length)
    noise: str | None = None  # "laplace" or "gaussian"
    secure: bool | None = None  # exact discrete noise
    private: bool | None = None  # False when noise came from a seeded generator
    sensitivity: float | None = None  # Delta_p of the measured matrix (sampler units)
    scale_min: float | None = None  # smallest and largest per-row noise scale
    scale_max: float | None = None
    #: UNIX time of the charge, rounded down to the hour (:data:`LEDGER_TIME_RESOLUTION`): the charge
    #: comes after the data are read and checked, so a finer clock would show how long that took
    time: float | None = None
    #: whom the measurement protects (:class:`~sparsedp.privacy_unit.PrivacyUnit`): ``None`` is one
    #: row; else the unit's column and bounds, e.g. ``"CustomerID (max_rows 50)"``
    privacy_unit: str | None = None

    def as_dict(self) -> dict:
        """A JSON-ready dict (the cost as ``epsilon`` / ``rho``)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "cost"}
        d["epsilon"], d["rho"] = self.cost.epsilon, self.cost.rho
        return d


def sequential(*costs: PrivacyCost) -> PrivacyCost:
    """Cost of running all ``costs`` on the same data: epsilons add (or rhos add), exactly, rounded
    up to the next float so the result never understates the sum."""
    if all(c.is_pure for c in costs):
        return PrivacyCost(epsilon=_ceil_float(sum((Fraction(c.epsilon) for c in costs), Fraction(0))))
    return PrivacyCost(rho=_ceil_float(sum((c.exact_rho() for c in costs), Fraction(0))))


def parallel(*costs: PrivacyCost) -> PrivacyCost:
    """Cost of running ``costs`` on disjoint parts of the data: the largest of them."""
    if all(c.is_pure for c in costs):
        return PrivacyCost(epsilon=max((c.epsilon for c in costs), default=0.0))
    return PrivacyCost(rho=_ceil_float(max((c.exact_rho() for c in costs), default=Fraction(0))))


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """``epsilon`` such that ``rho``-zCDP implies ``(epsilon, delta)``-DP: ``rho + 2 sqrt(rho ln(1/delta))``."""
    rho = check_positive(rho, "rho")
    delta = check_probability(delta, "delta")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def rho_for_approx_dp(epsilon: float, delta: float) -> float:
    """Largest ``rho`` whose conversion gives at most ``(epsilon, delta)``-DP (inverse of the above).

    Solving ``rho + 2 sqrt(rho L) = epsilon`` with ``L = ln(1/delta)``:
    ``sqrt(rho) = sqrt(L + epsilon) - sqrt(L)``.
    """
    epsilon = check_positive(epsilon, "epsilon")
    delta = check_probability(delta, "delta")
    L = math.log(1.0 / delta)
    return (math.sqrt(L + epsilon) - math.sqrt(L)) ** 2


class Accountant:
    """A privacy budget that refuses to be overspent, by even one ulp, counting budgets as the
    decimals written (:func:`budget_fraction`: ``Accountant(epsilon=1.0)`` takes ten spends of
    ``0.1`` and refuses an eleventh).

    ``Accountant(epsilon=1.0)`` is a pure-DP budget; ``Accountant(rho=0.5)`` a zCDP budget (pure
    costs are charged as ``epsilon^2 / 2``).  :meth:`spend` records a cost or raises
    :class:`BudgetExceededError` and records nothing.

    * Exact: costs are added as rationals (:class:`fractions.Fraction` of the float values that
      calibrated the noise), and a spend is accepted only if ``spent + cost <= total`` exactly.  So
      ten spends of ``0.1`` do *not* fit in ``1.0`` (the float ``0.1`` is
      ``0.1000000000000000055...``; the noise was calibrated with it), while eight of ``0.125`` do.
    * Thread-safe: the check and the record happen under one lock, so concurrent spends can never
      together exceed the budget.
    * Tamper-evident: the budget cannot be changed after construction (``acc.epsilon = 100``
      raises, and so does calling ``__init__`` again, which would reset :attr:`spent`), and
      :attr:`history` is a tuple copy: the ledger is append-only through
      :meth:`spend`.  (This protects against mistakes and careless callers, not against code
      running in the same interpreter that means harm.)
    """

    __slots__ = ("_epsilon", "_rho", "_total", "_spent", "_history", "_lock")

    def __init__(self, epsilon: float | None = None, rho: float | None = None) -> None:
        try:  # __init__ runs once per object: calling it again would reset what was spent
            object.__getattribute__(self, "_lock")
        except AttributeError:
            pass
        else:
            raise InvalidPrivacyParameterError(
                "this Accountant is already initialised: its budget and what it has spent cannot be reset "
                "(create a new Accountant for a new budget)")
        if (epsilon is None) == (rho is None):
            raise InvalidPrivacyParameterError("give exactly one total budget: epsilon= or rho=")
        eps = None if epsilon is None else check_positive(epsilon, "epsilon")
        r = None if rho is None else check_positive(rho, "rho")
        object.__setattr__(self, "_epsilon", eps)
        object.__setattr__(self, "_rho", r)
        object.__setattr__(self, "_total", budget_fraction(eps if eps is not None else r))
        object.__setattr__(self, "_spent", Fraction(0))
        object.__setattr__(self, "_history", [])
        object.__setattr__(self, "_lock", threading.Lock())

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"an Accountant's {name!r} cannot be changed after construction")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"an Accountant's {name!r} cannot be deleted")

    def __repr__(self) -> str:
        unit = "epsilon" if self.is_pure else "rho"
        return f"Accountant({unit}={self.total!r}, spent={self.spent!r}, releases={len(self._history)})"

    @property
    def epsilon(self) -> float | None:
        """The pure-DP budget (``None`` for a zCDP budget)."""
        return self._epsilon

    @property
    def rho(self) -> float | None:
        """The zCDP budget (``None`` for a pure-DP budget)."""
        return self._rho

    @property
    def is_pure(self) -> bool:
        return self._epsilon is not None

    @property
    def total(self) -> float:
        return float(self._total)

    @property
    def history(self) -> tuple[tuple[str, PrivacyCost], ...]:
        """Every accepted spend ``(label, cost)``, oldest first (a copy: append only via :meth:`spend`)."""
        with self._lock:
            return tuple((e.label, e.cost) for e in self._history)

    @property
    def ledger(self) -> tuple[LedgerEntry, ...]:
        """Every accepted spend as a :class:`LedgerEntry`, oldest first (a copy)."""
        with self._lock:
            return tuple(self._history)

    def _amount(self, cost: PrivacyCost) -> Fraction:
        if not isinstance(cost, PrivacyCost):
            raise InvalidPrivacyParameterError(f"expected a PrivacyCost, got {type(cost).__name__}")
        if cost.epsilon == 0 and cost.rho == 0:
            raise InvalidPrivacyParameterError("a zero PrivacyCost cannot be spent: no release is free")
        if self.is_pure:
            if not cost.is_pure:
                raise BudgetExceededError("a rho-zCDP cost cannot be charged to a pure-epsilon budget")
            return budget_fraction(cost.epsilon)
        return cost.exact_rho()

    @property
    def spent_exact(self) -> Fraction:
        """What has been spent, exactly."""
        with self._lock:
            return self._spent

    @property
    def spent(self) -> float:
        """What has been spent (rounded up to a float, so it never understates)."""
        return _ceil_float(self.spent_exact)

    @property
    def remaining(self) -> float:
        """What is left (rounded down to a float, so it never overstates)."""
        with self._lock:
            left = self._total - self._spent
        return max(_floor_float(left), 0.0)

    def _refuse(self, amount: Fraction, left: Fraction) -> BudgetExceededError:
        unit = "epsilon" if self.is_pure else "rho"
        return BudgetExceededError(
            f"{unit} {float(amount)!r} requested but only {_floor_float(left)!r} of {self.total!r} remains"
        )

    def check(self, cost: PrivacyCost) -> None:
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit; spend nothing."""
        amount = self._amount(cost)
        with self._lock:
            left = self._total - self._spent
        if amount > left:
            raise self._refuse(amount, left)

    def check_all(self, costs: Sequence[PrivacyCost]) -> None:
        """Raise :class:`BudgetExceededError` unless ``costs``, spent one after another, all fit
        (the exact sum of what each is charged: a float sum of the costs can round above it);
        spend nothing."""
        amounts = [self._amount(c) for c in costs]
        total = sum(amounts, Fraction(0))
        with self._lock:
            left = self._total - self._spent
        if total > left:
            raise self._refuse(total, left)

    def spend(self, cost: PrivacyCost, label: str = "", *, entry: LedgerEntry | None = None) -> None:
        """Record ``cost`` if it fits exactly, else raise :class:`BudgetExceededError` and record
        nothing.  Atomic: the check and the record hold one lock.  ``entry`` describes the
        measurement in the ledger (its cost must be ``cost``)."""
        amount = self._amount(cost)
        if entry is None:
            entry = LedgerEntry(label=str(label), cost=cost)
        elif not isinstance(entry, LedgerEntry) or entry.cost != cost:
            raise InvalidPrivacyParameterError("the ledger entry must be a LedgerEntry with the cost charged")
        with self._lock:
            left = self._total - self._spent
            if amount > left:
                raise self._refuse(amount, left)
            object.__setattr__(self, "_spent", self._spent + amount)
            self._history.append(entry)


def _ceil_float(q: Fraction) -> float:
    """The smallest float ``>= q``."""
    f = float(q)
    return f if Fraction(f) >= q else math.nextafter(f, math.inf)


def _floor_float(q: Fraction) -> float:
    """The largest float ``<= q``."""
    f = float(q)
    return f if Fraction(f) <= q else math.nextafter(f, -math.inf)
