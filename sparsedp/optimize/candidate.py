"""What every family hands back: a normalised strategy and its exact error at unit budget."""

from __future__ import annotations

from dataclasses import dataclass

from ..operators import SparseOperator

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
    """A strategy with certified ``Delta <= 1`` and the exact expected total squared error of the
    GLS workload answers at ``epsilon = 1`` / ``rho = 1`` (``method`` says how it was computed)."""

    family: str
    name: str
    strategy: SparseOperator
    total: float
    method: str
    seconds: float
    note: str = ""

    def trial(self) -> Trial:
        return Trial(self.family, self.name, self.total, self.seconds, self.note)
