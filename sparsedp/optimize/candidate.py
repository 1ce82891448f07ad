"""What every family hands back: a strategy and its exact error at unit budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..operators import Operator

__all__ = ["Candidate", "Trial"]


@dataclass(frozen=True)
class Trial:
    """One entry of an optimisation's history: what was tried, its exact total squared error at
    unit budget, and the seconds it took."""

    family: str
    name: str
    error: float
    seconds: float
    note: str = ""


@dataclass(frozen=True)
class Candidate:
    """A strategy (an integer matrix for the optimised families) and the exact expected total
    squared error of the GLS workload answers at ``epsilon = 1`` / ``rho = 1`` when the mechanism
    calibrates from its entries (``method`` says how the error was computed)."""

    family: str
    name: str
    strategy: Operator
    total: float
    method: str
    seconds: float
    note: str = ""

    def trial(self) -> Trial:
        return Trial(self.family, self.name, self.total, self.seconds, self.note)
