"""The shared iteration monitor: timing, residual/RSE history and the stopping rule.

Stopping rule (all methods): stop when the relative observed residual
``r_k = ||P_Omega(M - X_k)||_F / ||P_Omega(M)||_F`` falls below ``abs_tol`` (exact data), or when both
the residual and the iterate stop moving, ``|r_k - r_{k-1}| <= tol r_{k-1}`` and
``||X_k - X_{k-1}||_F <= tol ||X_k||_F`` (noisy data: the residual settles at the noise level; the
change is computed from the factors in ``O((m + n) k^2)``), or when the residual is flat and the
estimate is negligible and not growing, ``||X_k||_F <= min(tol ||P_Omega(M)||_F / sqrt(p), ||X_{k-1}||_F)`` (a penalised fit decaying
geometrically to the zero matrix, whose relative change never falls), or at ``max_iter``.  (The residual rule
alone stopped DLNM-QR early: its multiplier can hold the residual flat while the estimate still
moves; the iterate rule alone stopped exact-data runs early during slow linear convergence.)  Time spent computing the RSE against a supplied truth is excluded from
``seconds``.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np

from ..errors import ShapeError
from ..progress import loop_disable, progress_bar
from ..validation import check_positive
from ._observed import Pattern
from .metrics import RSETracker, rse
from .report import CompletionResult, History


def check_iteration_args(tol: float, abs_tol: float, max_iter: int) -> None:
    check_positive(tol, "tol")
    check_positive(abs_tol, "abs_tol")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ShapeError(f"max_iter must be a positive integer, got {max_iter!r}")


class Monitor:
    def __init__(self, pat: Pattern, truth: Any, tol: float, abs_tol: float, max_iter: int) -> None:
        check_iteration_args(tol, abs_tol, max_iter)
        self.t0 = time.perf_counter()
        self.excluded = 0.0
        self.norm = float(np.linalg.norm(pat.values)) or 1.0
        self.scale = self.norm * float(np.sqrt(pat.shape[0] * pat.shape[1] / pat.nnz))  # ~ ||M||_F
        self.tol, self.abs_tol, self.max_iter = tol, abs_tol, int(max_iter)
        self.residuals: list[float] = []
        self.seconds: list[float] = []
        self.tracker = RSETracker(truth, pat.shape)
        self.converged = False
        self.previous: tuple[np.ndarray, np.ndarray] | None = None
        self.size = np.inf  # ||X_{k-1}||_F
        # a tqdm bar of the iterations inside a sparsedp command on a terminal (sparsedp.progress)
        self.bar = progress_bar(total=self.max_iter, desc="completion", disable=loop_disable())

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0 - self.excluded

    def record(self, residual_norm: float, A: np.ndarray, B: np.ndarray) -> bool:
        """Record one iteration (``X_k = A B^T``); return True when the run should stop."""
        self.seconds.append(self.elapsed())
        r = residual_norm / self.norm
        t = time.perf_counter()
        self.tracker(A, B)
        self.excluded += time.perf_counter() - t
        prev = self.residuals[-1] if self.residuals else np.inf
        self.residuals.append(r)
        flat = abs(prev - r) <= self.tol * prev
        moved = self._moved(A, B)
        size = _fro(A, B)
        # small and decaying (not growing, as from the paper's zero start), never on the first step
        negligible = self.previous is not None and size <= self.tol * self.scale and size <= self.size
        self.previous, self.size = (A, B), size
        if r <= self.abs_tol or (flat and (moved <= self.tol or negligible)):
            self.converged = True
        self.bar.update(1)
        self.bar.set_postfix_str(f"residual {r:.3e}", refresh=False)
        return self.converged or len(self.residuals) >= self.max_iter

    def _moved(self, A: np.ndarray, B: np.ndarray) -> float:
        """``||X_k - X_{k-1}||_F / ||X_k||_F`` from the factors (0 when both are zero)."""
        if self.previous is None:
            return np.inf
        zero_now = not (np.any(A) and np.any(B))
        zero_before = not (np.any(self.previous[0]) and np.any(self.previous[1]))
        if zero_now:
            return 0.0 if zero_before else np.inf
        return rse(self.previous, (A, B)) if not zero_before else np.inf

    def result(self, A: np.ndarray, B: np.ndarray, method: str, extra: Mapping[str, Any] | None = None) -> CompletionResult:
        self.bar.close()
        return CompletionResult(
            left=A, right=B, method=method, iterations=len(self.residuals), seconds=self.elapsed(),
            converged=self.converged, residual=self.residuals[-1] if self.residuals else float("nan"),
            history=History(tuple(self.residuals), tuple(self.seconds), tuple(self.tracker.values)),
            extra=dict(extra or {}),
        )


def _fro(A: np.ndarray, B: np.ndarray) -> float:
    """``||A B^T||_F`` from the ``k x k`` Gram matrices."""
    return float(np.sqrt(max(np.sum((A.T @ A) * (B.T @ B)), 0.0)))
