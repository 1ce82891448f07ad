"""LMaFit's over-relaxation weight control, shared by SOR and the relaxed DLNM-QR.

Wen, Yin and Zhang 2012 (Math. Prog. Comp. 4:333-361), Alg. 1: a step taken with weight ``w`` on the
observed residual (``Z_w = X + w P_Omega(M - X)``) is judged by the ratio ``g`` of the new merit to
the old one.  ``g >= 1`` with ``w > 1`` rejects the step, sets the increment
``d = max(0.1 (w - 1), 0.1 d)`` and retries from the last accepted point with ``w = 1``; otherwise
the step is accepted, ``g >= 0.7`` (slow progress) enlarges ``d = max(d, 0.25 (w - 1))``, and
``w = min(w + d, w_max)``.
"""

from __future__ import annotations


class OverRelaxation:
    """Mutable weight state ``w``, increment ``d`` and rejection count of one run."""

    def __init__(self, w_max: float = 100.0, w0: float = 1.0) -> None:
        self.w, self.inc, self.rejected, self.w_max = min(max(float(w0), 1.0), float(w_max)), 1.0, 0, float(w_max)

    def accept(self, merit_new: float, merit: float, force: bool = False) -> bool:
        """Judge a step taken with the current ``w``; update ``w``; return whether it is accepted
        (``force`` accepts unconditionally, e.g. a rank change)."""
        if merit_new >= merit and self.w > 1.0 and not force:
            self.rejected += 1
            self.inc = max(0.1 * (self.w - 1.0), 0.1 * self.inc)
            self.w = 1.0
            return False
        if merit_new >= 0.7 * merit:
            self.inc = max(self.inc, 0.25 * (self.w - 1.0))
        self.w = min(self.w + self.inc, self.w_max)
        return True
