"""Online convolution ``y_t = sum_{s <= t} h_{t-s} x_s`` in ``O(log^2 t)`` amortised time per step.

The Toeplitz counters (square root, BLT, generic) with exact noise release ``B' y``, ``y = M' x + z``
the exact measurement: two lower-triangular Toeplitz products applied one step at a time.  Done
directly, step ``t`` costs ``O(t)`` (``2^20`` steps: minutes).  Here each product is split by lag:

* lags ``[0, L)`` (``L`` = ``direct`` lags): a dot product at every step;
* lags ``[B, 2B)`` for ``B = L, 2L, 4L, ...``: when an aligned block of ``B`` inputs completes (at
  ``t + 1`` a multiple of ``B``), its convolution with ``h[B : 2B]`` (by FFT, size ``2B``) is added
  to a buffer of pending outputs ``t + 1 .. t + 3B - 1``.  Every pair ``(s, t)`` with lag ``t - s``
  in ``[B, 2B)`` is covered by exactly one aligned block of level ``B``, and that block completes
  before step ``s + B <= t``, so each output is complete when its step comes.  Each level costs
  ``O(N log B)`` over ``N`` steps: ``O(N log^2 N)`` in all, ``O(N)`` memory.

:class:`OnlineConvolution` does it in float64 (deterministic: the output is a fixed function of the
inputs, so applied to the exact measurement it is post-processing).  :class:`ExactOnlineConvolution`
does it for integers, exactly: both operands are cut into ``c``-bit limbs, the FFT of each limb
product is rounded to the nearest integer -- exact because ``c`` is chosen so that the float error
bound of the FFT stays below ``1/8`` (and each rounding is checked: a fractional part above ``1/4``
raises) -- and the limb products are kept per shift in ``int64`` and combined in Python integers.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SparseDPError

__all__ = ["DIRECT_LAGS", "OnlineConvolution", "ExactOnlineConvolution", "limb_bits"]

#: Lags computed directly at every step (the rest by blocked FFTs).
DIRECT_LAGS = 128
_EPS = 2.0**-53


def _levels(n: int, direct: int) -> list[int]:
    """The block sizes ``B = L, 2L, ...`` below ``n`` (lags ``[B, 2B)`` exist)."""
    out, B = [], direct
    while B < n:
        out.append(B)
        B *= 2
    return out


class OnlineConvolution:
    """``y_t = sum_{s <= t} h_{t-s} x_s`` (float64), one input at a time (:meth:`push`)."""

    def __init__(self, h: np.ndarray, n: int, direct: int = DIRECT_LAGS) -> None:
        self.n = int(n)
        self.h = np.asarray(h, dtype=np.float64)[: self.n]
        self.L = max(1, min(int(direct), self.n))
        self._hrev = self.h[: self.L][::-1].copy()
        self._x = np.zeros(self.n)
        self._pend = np.zeros(self.n)
        self._fft: dict[int, np.ndarray] = {}

    def push(self, i: int, value: float) -> float:
        """Take ``x_i`` (``i`` = 0, 1, ... in order) and return ``y_i``."""
        x = self._x
        x[i] = value
        lo = max(0, i - self.L + 1)
        out = float(self._pend[i]) + float(np.dot(self._hrev[self.L - (i + 1 - lo):], x[lo: i + 1]))
        self._flush(i + 1)
        return out

    def _segment(self, B: int) -> np.ndarray:
        H = self._fft.get(B)
        if H is None:
            H = self._fft[B] = np.fft.rfft(self.h[B: min(2 * B, self.n)], 2 * B)
        return H

    def _flush(self, k: int) -> None:
        B = self.L
        while B < self.n and k % B == 0 and k < self.n:
            r = np.fft.irfft(np.fft.rfft(self._x[k - B: k], 2 * B) * self._segment(B), 2 * B)
            m = min(2 * B - 1, self.n - k)
            self._pend[k: k + m] += r[:m]
            B *= 2


def limb_bits(n: int, hmax: int, direct: int = DIRECT_LAGS) -> int:
    """The limb width ``c`` for :class:`ExactOnlineConvolution` of length ``n``: the largest ``c <= 20``
    with ``u B 2^{2c} 6 log2(2B) 2^-53 <= 1/8`` at the largest block ``B`` (``u`` limbs of ``h``): a
    bound of the float error of an FFT product of two vectors of ``B`` entries below ``2^c``, summed
    over the ``u`` limb pairs of one shift (Higham, ch. 24: ``O(log n)`` roundings per entry)."""
    levels = _levels(n, direct)
    B = levels[-1] if levels else 1
    for c in range(20, 1, -1):
        u = _limbs(hmax, c, signed=True)
        if u * B * 2.0 ** (2 * c) * 6.0 * math.log2(2 * B) * _EPS <= 0.125:
            return c
    raise SparseDPError(f"no exact FFT limb width for n = {n}")


def _limbs(vmax: int, c: int, signed: bool) -> int:
    """Limbs of ``c`` bits needed for values up to ``vmax`` in magnitude (signed: top limb signed)."""
    bits = int(vmax).bit_length() + (1 if signed else 0)
    return max(1, -(-bits // c))


def _split(v: np.ndarray, c: int, count: int) -> list[np.ndarray]:
    """``v = sum_p 2^{cp} v_p`` (lower limbs in ``[0, 2^c)``, the top limb signed), as float64."""
    mask = (1 << c) - 1
    out = [((v >> (c * p)) & mask).astype(np.float64) for p in range(count - 1)]
    out.append((v >> (c * (count - 1))).astype(np.float64))
    return out


class ExactOnlineConvolution:
    """Exact integer ``y_t = sum_{L <= t-s} h_{t-s} x_s`` (lags from ``L`` on; the caller does lags
    below ``L`` directly) for ``int64`` ``h`` and non-negative ``int64`` inputs below ``2^xbits``,
    one input at a time (:meth:`push`); outputs are Python integers (any size)."""

    def __init__(self, h: np.ndarray, n: int, xbits: int, direct: int = DIRECT_LAGS) -> None:
        self.n = int(n)
        self.h = np.asarray(h, dtype=np.int64)[: self.n]
        self.L = max(1, min(int(direct), self.n))
        hmax = int(np.abs(self.h).max(initial=0))
        self.c = limb_bits(self.n, hmax, self.L)
        self.u = _limbs(hmax, self.c, signed=True)
        self.v = _limbs((1 << int(xbits)) - 1, self.c, signed=False)
        self._x = np.zeros(self.n, dtype=np.int64)
        self._pend = np.zeros((self.u + self.v - 1, self.n), dtype=np.int64)
        self._fft: dict[int, list[np.ndarray]] = {}
        self._shifts = [self.c * s for s in range(self.u + self.v - 1)]

    def push(self, i: int, value: int) -> int:
        """Take ``x_i`` (``i`` = 0, 1, ... in order) and return the far-lag part of ``y_i``."""
        self._x[i] = value
        col = self._pend[:, i].tolist()
        out = 0
        for s, p in zip(self._shifts, col):
            if p:
                out += p << s
        self._flush(i + 1)
        return out

    def _segment(self, B: int) -> list[np.ndarray]:
        H = self._fft.get(B)
        if H is None:
            seg = self.h[B: min(2 * B, self.n)]
            H = self._fft[B] = [np.fft.rfft(part, 2 * B) for part in _split(seg, self.c, self.u)]
        return H

    def _flush(self, k: int) -> None:
        B = self.L
        while B < self.n and k % B == 0 and k < self.n:
            self._add_block(k, B)
            B *= 2

    def _add_block(self, k: int, B: int) -> None:
        """The block ``x[k - B : k]`` times ``h[B : 2B]`` into the pending outputs ``k ..``."""
        block = self._x[k - B: k]
        top = int(block.max(initial=0))
        if top == 0:
            return
        nx = min(self.v, _limbs(top, self.c, signed=False))
        X = [np.fft.rfft(part, 2 * B) for part in _split(block, self.c, nx)] if nx > 1 else \
            [np.fft.rfft(block.astype(np.float64), 2 * B)]
        H = self._segment(B)
        m = min(2 * B - 1, self.n - k)
        for s in range(self.u + nx - 1):
            acc = None
            for p in range(max(0, s - nx + 1), min(self.u, s + 1)):
                term = H[p] * X[s - p]
                acc = term if acc is None else acc + term
            r = np.fft.irfft(acc, 2 * B)[:m]
            ri = np.rint(r)
            if m and float(np.max(np.abs(r - ri))) > 0.25:
                raise SparseDPError("inexact FFT product in the exact online convolution (limb width too large)")
            self._pend[s, k: k + m] += ri.astype(np.int64)
