"""Shared plumbing of the online counters: step bookkeeping and buffered noise draws."""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from ..errors import BudgetExceededError, NonFiniteInputError, SparseDPError
from ..noise import as_generator
from .fenwick import check_horizon

__all__ = ["BufferedNoise", "StreamingCounter"]


class BufferedNoise:
    """Draws i.i.d. ``Lap(0, scale)`` or ``N(0, scale^2)`` from ``rng`` in chunks (fast scalar draws).

    Chunks of ``chunk`` values are drawn with one numpy call; a value is used once.  Unused buffered
    values are never published and are discarded with the object.
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
    """Base of every online counter: ``update(a_t)`` -> noisy ``s_t``; refuses step ``horizon + 1``.

    Subclasses implement ``_step(a) -> float``.  ``last_variance`` is the exact variance of the last
    output (for subclasses that track it).
    """

    name = "counter"

    def __init__(self, horizon: int) -> None:
        self.horizon = check_horizon(horizon)
        self.t = 0
        self.last_variance = float("nan")

    def update(self, a: float) -> float:
        """Take the increment of step ``t + 1`` and return the noisy running sum at that step."""
        if self.t >= self.horizon:
            raise BudgetExceededError(
                f"{self.name}: the horizon of {self.horizon} steps is used up; step {self.t + 1} is refused"
            )
        try:
            value = float(a)
        except (TypeError, ValueError) as exc:
            raise NonFiniteInputError(f"increment must be a number, got {a!r}") from exc
        if not math.isfinite(value):
            raise NonFiniteInputError(f"increment must be finite, got {a!r}")
        out = self._step(value)
        self.t += 1
        return out

    def run(self, increments: Iterable[float]) -> np.ndarray:
        """``update`` over ``increments`` in order; the outputs as an array."""
        return np.array([self.update(a) for a in increments], dtype=np.float64)

    def _step(self, a: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError
