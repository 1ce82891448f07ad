"""Frozen result types of :mod:`sparsedp.completion`.

A completion is returned as factors ``X_hat = left @ right.T`` (``left`` is ``m x k``, ``right`` is
``n x k``): the dense ``m x n`` matrix is formed only when asked (:meth:`CompletionResult.to_dense`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import ShapeError


@dataclass(frozen=True)
class History:
    """Per-iteration trace: relative observed residual, wall-clock seconds since the start, and the
    RSE against the truth (only when a truth was passed; empty otherwise)."""

    residual: tuple[float, ...]
    seconds: tuple[float, ...]
    rse: tuple[float, ...] = ()

    def seconds_to_within(self, fraction: float = 0.05) -> float | None:
        """Seconds until the RSE first comes within ``fraction`` of its final value
        (``rse_k <= (1 + fraction) * rse_final``); ``None`` without an RSE trace."""
        if not self.rse:
            return None
        rse = np.asarray(self.rse)
        hit = np.flatnonzero(rse <= (1.0 + fraction) * rse[-1])
        return float(self.seconds[int(hit[0])])


@dataclass(frozen=True)
class CompletionResult:
    """A low-rank completion ``X_hat = left @ right.T``.

    ``residual`` is the final relative residual on the observed entries,
    ``||P_Omega(M - X_hat)||_F / ||P_Omega(M)||_F``; ``converged`` says whether the stopping rule
    (not the iteration cap) ended the run; ``extra`` holds method-specific items (e.g. the DLNM-QR
    core ``D``, the soft-threshold ``lam``).
    """

    left: np.ndarray
    right: np.ndarray
    method: str
    iterations: int
    seconds: float
    converged: bool
    residual: float
    history: History
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.left.shape[0], self.right.shape[0])

    @property
    def rank(self) -> int:
        """Number of columns of the factors (an upper bound of the rank of ``X_hat``)."""
        return int(self.left.shape[1])

    @property
    def rse(self) -> float | None:
        """Final RSE against the truth, when a truth was given."""
        return self.history.rse[-1] if self.history.rse else None

    def to_dense(self) -> np.ndarray:
        """The dense ``m x n`` estimate ``left @ right.T`` (forms the full matrix: small problems only)."""
        return self.left @ self.right.T

    def predict(self, rows: Any, cols: Any) -> np.ndarray:
        """Entries ``X_hat[rows[t], cols[t]]`` without forming the dense matrix."""
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(cols, dtype=np.int64)
        m, n = self.shape
        if r.shape != c.shape or (r.size and (r.min() < 0 or r.max() >= m or c.min() < 0 or c.max() >= n)):
            raise ShapeError(f"rows/cols must be equal-length indices inside {self.shape}")
        return np.einsum("ij,ij->i", self.left[r], self.right[c])
