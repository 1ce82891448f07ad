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
from dataclasses import dataclass, field

from .errors import BudgetExceededError, InvalidPrivacyParameterError
from .validation import check_positive, check_probability

__all__ = [
    "PrivacyCost",
    "Accountant",
    "zcdp_to_approx_dp",
    "rho_for_approx_dp",
    "sequential",
    "parallel",
]

# Relative slack for float round-off in sums such as 10 * 0.1; far below any meaningful epsilon.
_SLACK = 1e-12


@dataclass(frozen=True)
class PrivacyCost:
    """The privacy loss of one release: pure ``epsilon``, or ``rho``-zCDP.  Exactly one is > 0."""

    epsilon: float = 0.0
    rho: float = 0.0

    def __post_init__(self) -> None:
        for name in ("epsilon", "rho"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidPrivacyParameterError(f"{name} must be finite and >= 0, got {value!r}")
        if self.epsilon > 0 and self.rho > 0:
            raise InvalidPrivacyParameterError("a cost is either pure epsilon or rho-zCDP, not both")

    @property
    def is_pure(self) -> bool:
        return self.rho == 0.0

    def as_rho(self) -> float:
        """The cost in zCDP: ``rho``, or ``epsilon^2 / 2`` for a pure cost (Bun-Steinke Prop. 1.4)."""
        return self.rho if self.rho > 0 else self.epsilon**2 / 2


def sequential(*costs: PrivacyCost) -> PrivacyCost:
    """Cost of running all ``costs`` on the same data: epsilons add (or rhos add)."""
    if all(c.is_pure for c in costs):
        return PrivacyCost(epsilon=math.fsum(c.epsilon for c in costs))
    return PrivacyCost(rho=math.fsum(c.as_rho() for c in costs))


def parallel(*costs: PrivacyCost) -> PrivacyCost:
    """Cost of running ``costs`` on disjoint parts of the data: the largest of them."""
    if all(c.is_pure for c in costs):
        return PrivacyCost(epsilon=max((c.epsilon for c in costs), default=0.0))
    return PrivacyCost(rho=max((c.as_rho() for c in costs), default=0.0))


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


@dataclass
class Accountant:
    """A privacy budget that refuses to be overspent.

    ``Accountant(epsilon=1.0)`` is a pure-DP budget; ``Accountant(rho=0.5)`` a zCDP budget (pure
    costs are charged as ``epsilon^2 / 2``).  :meth:`spend` records a cost or raises
    :class:`BudgetExceededError` and records nothing.
    """

    epsilon: float | None = None
    rho: float | None = None
    history: list[tuple[str, PrivacyCost]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.epsilon is None) == (self.rho is None):
            raise InvalidPrivacyParameterError("give exactly one total budget: epsilon= or rho=")
        if self.epsilon is not None:
            self.epsilon = check_positive(self.epsilon, "epsilon")
        else:
            self.rho = check_positive(self.rho, "rho")

    @property
    def is_pure(self) -> bool:
        return self.epsilon is not None

    @property
    def total(self) -> float:
        return float(self.epsilon if self.epsilon is not None else self.rho)  # type: ignore[arg-type]

    def _amount(self, cost: PrivacyCost) -> float:
        if self.is_pure:
            if not cost.is_pure:
                raise BudgetExceededError("a rho-zCDP cost cannot be charged to a pure-epsilon budget")
            return cost.epsilon
        return cost.as_rho()

    @property
    def spent(self) -> float:
        return math.fsum(self._amount(c) for _, c in self.history)

    @property
    def remaining(self) -> float:
        return max(self.total - self.spent, 0.0)

    def check(self, cost: PrivacyCost) -> None:
        """Raise :class:`BudgetExceededError` if ``cost`` does not fit; spend nothing."""
        amount = self._amount(cost)
        if self.spent + amount > self.total * (1 + _SLACK):
            unit = "epsilon" if self.is_pure else "rho"
            raise BudgetExceededError(
                f"{unit} {amount:g} requested but only {self.remaining:g} of {self.total:g} remains"
            )

    def spend(self, cost: PrivacyCost, label: str = "") -> None:
        """Record ``cost`` if it fits, else raise :class:`BudgetExceededError` and record nothing."""
        self.check(cost)
        self.history.append((label, cost))
