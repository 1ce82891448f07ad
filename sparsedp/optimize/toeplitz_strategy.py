"""Lower-triangular Toeplitz strategies as operators: exact integer products, ``O(n log n)`` solves.

A :class:`ToeplitzStrategy` is the ``n x n`` lower-triangular Toeplitz matrix ``R`` with first
column ``m`` (``R_ij = m_{i-j}`` for ``i >= j``, else 0), kept as that column alone: ``O(n)``
memory at any ``n`` (the explicit matrix of ``n = 2^20`` would have ``5.5e11`` entries).

* **Its entries are its first column.**  Column ``j`` is ``m_0 .. m_{n-1-j}``, a truncation of
  column 0, so ``Delta_p(R) = ||m||_p`` exactly, and :func:`toeplitz_calibration` (what
  :func:`sparsedp.measure.plan_measurement` calls for this type) computes the sensitivity with
  the certified :func:`sparsedp.calibration.sensitivity_bound` of the ``n x 1`` matrix ``m``.
* **Exact products.**  For integer ``m`` and integer data, ``R x`` is an integer convolution,
  computed exactly by a number-theoretic transform (:func:`exact_convolution`: three primes
  ``p = c 2^k + 1`` below ``2^31``, products below ``2^62`` in ``uint64``, Garner's
  reconstruction; ``O(n log n)``, ~2 s at ``n = 2^20``), so the exact discrete Gaussian
  mechanism measures ``R x`` with no rounding.  Other inputs use a float FFT.
* **Solves.**  ``R^{-1} y`` is the convolution with the series inverse ``1 / m(x)`` (Newton's
  iteration, FFT products): the GLS estimate of a square invertible strategy, whatever the
  variances (:meth:`ToeplitzStrategy.exact_solve`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..calibration import sensitivity_bound
from ..errors import InputBoundError, ShapeError, SparseDPError, UnsupportedStructureError
from ..grid_product import FLOAT_EXACT, check_integer_range, grid_integers
from ..operators import Operator

__all__ = ["EXPLICIT_MAX_N", "ToeplitzStrategy", "exact_convolution", "series_inverse", "toeplitz_calibration"]

#: Largest ``n`` whose explicit (``tosparse``) form is built: ``n (n + 1) / 2`` entries.
EXPLICIT_MAX_N = 4096

# NTT primes p = c 2^k + 1 < 2^31 with a primitive root g: transforms of length up to 2^k
_PRIMES = ((2013265921, 31, 27), (469762049, 3, 26), (754974721, 11, 24))
#: |exact result| must stay below half the product of the primes (2^88.2) for Garner's step.
_CRT_LIMIT = 2.0**87


_TABLES: dict[tuple[int, int, bool], tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]] = {}


def fftconvolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`scipy.signal.fftconvolve`, imported on first use: ``scipy.signal`` takes about 0.25 s
    to import, which ``import sparsedp`` should not pay for a strategy it may never build."""
    from scipy.signal import fftconvolve as convolve

    return convolve(a, b)


def _tables(N: int, p: int, g: int, inverse: bool) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """The bit-reversal permutation of length ``N`` and, per stage, the twiddles ``w^0 .. w^(h-1)``
    with their Shoup constants ``floor(w 2^32 / p)`` (cached: a few transform lengths are used)."""
    key = (N, p, inverse)
    if key not in _TABLES:
        k = N.bit_length() - 1
        idx = np.arange(N, dtype=np.int64)
        rev = np.zeros(N, dtype=np.int64)
        for b in range(k):
            rev |= ((idx >> b) & 1) << (k - 1 - b)
        stages = []
        h = 1
        while h < N:
            w = pow(g, (p - 1) // (2 * h), p)
            if inverse:
                w = pow(w, p - 2, p)
            tw = np.empty(h, dtype=np.uint64)
            tw[0] = 1
            s, ws = 1, w
            while s < h:  # powers by doubling: tw[s:2s] = tw[:s] w^s
                tw[s:2 * s] = (tw[:s] * np.uint64(ws)) % np.uint64(p)
                ws = ws * ws % p
                s *= 2
            stages.append((tw, (tw << np.uint64(32)) // np.uint64(p)))
            h *= 2
        if len(_TABLES) > 16:
            _TABLES.clear()
        _TABLES[key] = (rev, stages)
    return _TABLES[key]


def _mulmod(v: np.ndarray, w: np.ndarray, ws: np.ndarray, p: np.uint64) -> np.ndarray:
    """``v w mod p`` for ``v, w < p < 2^31`` by Shoup's method: ``q = (v ws) >> 32`` with
    ``ws = floor(w 2^32 / p)``, then ``v w - q p`` (wrapping ``uint64`` arithmetic, exact) lies in
    ``[0, 2p)``; one conditional subtraction (``min(r, r - p)``: ``r - p`` wraps when ``r < p``)."""
    q = (v * ws) >> np.uint64(32)
    r = v * w - q * p
    return np.minimum(r, r - p)


def _ntt(a: np.ndarray, p: int, g: int, inverse: bool = False) -> np.ndarray:
    """Number-theoretic transform of ``a`` (``uint64`` residues below ``p``, length a power of two)
    modulo ``p``: iterative radix-2 Cooley-Tukey on the bit-reversed input, each stage vectorised."""
    N = a.size
    rev, stages = _tables(N, p, g, inverse)
    a = a[rev]
    pu = np.uint64(p)
    h = 1
    for tw, ws in stages:
        A = a.reshape(-1, 2 * h)
        u = A[:, :h].copy()
        v = _mulmod(A[:, h:], tw[None, :], ws[None, :], pu)
        top = u + v
        A[:, :h] = np.minimum(top, top - pu)
        bot = u + (pu - v)
        A[:, h:] = np.minimum(bot, bot - pu)
        h *= 2
    if inverse:
        ninv = pow(N, p - 2, p)
        a = _mulmod(a, np.uint64(ninv), np.uint64((ninv << 32) // p), pu)
    return a


def _residues(v: np.ndarray, p: int) -> np.ndarray:
    return np.mod(v, p).astype(np.uint64)


def exact_convolution(a: np.ndarray, b: np.ndarray, size: int, cache: dict | None = None) -> np.ndarray:
    """The first ``size`` terms of the convolution of the integer vectors ``a`` and ``b``, exactly,
    as ``float64`` (exact below ``2^53``; the measurement path refuses products above ``2^50``).

    Residues modulo two primes (``P = p_1 p_2 ~ 2^59.7``) when ``sum |a| max |b| < 2^58``, else
    three (``~ 2^89``), then Garner's reconstruction of the representative in ``(-P/2, P/2)``,
    which is the exact value since ``|sum_j a_j b_{k-j}| <= sum |a| max |b| < P / 2``.  ``cache``:
    a dict in which the transforms of ``a`` are kept (a strategy measured several times).  Raises
    when ``sum |a| max |b| >= 2^87`` (the caller splits the data into halves of bits)."""
    a = np.asarray(a, dtype=np.int64)[:size]
    b = np.asarray(b, dtype=np.int64)[:size]
    bound = float(np.abs(a).astype(np.float64).sum()) * float(np.abs(b).max(initial=0))
    if bound >= _CRT_LIMIT:
        raise SparseDPError("exact convolution: the product could exceed the CRT range")
    N = 1 << max(1, (a.size + b.size - 1).bit_length())
    if N > 1 << 24:
        raise SparseDPError(f"exact convolution: length {size} is above the transform limit 2^23")
    primes = _PRIMES[:2] if bound < 2.0**58 else _PRIMES
    res = []
    for p, g, _ in primes:
        key = (N, p)
        fa = None if cache is None else cache.get(key)
        if fa is None:
            fa = _ntt(np.concatenate([_residues(a, p), np.zeros(N - a.size, np.uint64)]), p, g)
            if cache is not None:
                cache[key] = fa
        fb = _ntt(np.concatenate([_residues(b, p), np.zeros(N - b.size, np.uint64)]), p, g)
        res.append(_ntt((fa * fb) % np.uint64(p), p, g, inverse=True)[:size])
    (p1, _, _), (p2, _, _), (p3, _, _) = _PRIMES
    r1, r2 = res[0], res[1]
    # Garner: x = r1 + p1 t2 (+ p1 p2 t3), 0 <= t2 < p2, 0 <= t3 < p3
    inv_p1_p2 = pow(p1, p2 - 2, p2)
    t2 = ((r2 + np.uint64(p2) - r1 % np.uint64(p2)) % np.uint64(p2) * np.uint64(inv_p1_p2)) % np.uint64(p2)
    low = r1.astype(np.int64) + np.int64(p1) * t2.astype(np.int64)  # < p1 p2 < 2^60: exact
    if len(res) == 2:
        P = p1 * p2
        return np.where(low >= P // 2, low - np.int64(P), low).astype(np.float64)
    r3 = res[2]
    inv_p1p2_p3 = pow((p1 * p2) % p3, p3 - 2, p3)
    lhs = (r1 % np.uint64(p3) + (np.uint64(p1 % p3) * t2) % np.uint64(p3)) % np.uint64(p3)
    t3 = ((r3 + np.uint64(p3) - lhs) % np.uint64(p3) * np.uint64(inv_p1p2_p3)) % np.uint64(p3)
    # the symmetric representative: t3 in the upper half of [0, p3) means a negative value
    t3s = t3.astype(np.int64) - np.where(t3 >= np.uint64(p3 // 2), p3, 0)
    out = low.astype(np.float64) + float(p1 * p2) * t3s.astype(np.float64)
    small = np.abs(out) < 2.0**62
    if np.any(small):  # the exact integer where it fits in int64
        out[small] = (low[small] + np.int64(p1 * p2) * t3s[small]).astype(np.float64)
    return out


def series_inverse(a: np.ndarray, N: int) -> np.ndarray:
    """The first ``N`` coefficients of ``1 / a(x)`` (``a_0 != 0``): the first column of the inverse
    of the lower-triangular Toeplitz matrix with first column ``a``.  Newton's iteration ``u <- u
    (2 - a u) mod x^{2k}`` with FFT products, ``O(N log N)`` (float accuracy)."""
    a = np.asarray(a, dtype=np.float64)[:N]
    if a.size < 1 or a[0] == 0:
        raise SparseDPError("the series inverse needs a_0 != 0")
    u = np.array([1.0 / a[0]])
    k = 1
    while k < N:
        k = min(2 * k, N)
        au = fftconvolve(a[:k], u)[:k]
        au[0] -= 2.0
        u = -fftconvolve(u, au)[:k]
    return u


class ToeplitzStrategy(Operator):
    """The lower-triangular Toeplitz strategy with first column ``m`` (module docstring): square,
    invertible (``m_0 != 0``), kept as ``m`` alone."""

    def calibration_rule(self) -> Any:
        """Calibrated from the first column (:func:`toeplitz_calibration`); a subclass from its entries."""
        return toeplitz_calibration if type(self) is ToeplitzStrategy else None

    def __init__(self, m: Any, name: str = "toeplitz", meta: dict | None = None) -> None:
        col = np.array(m, dtype=np.float64, copy=True).ravel()
        if col.size < 1 or not np.all(np.isfinite(col)) or col[0] == 0:
            raise ShapeError("a Toeplitz strategy needs finite coefficients with m_0 != 0")
        super().__init__((col.size, col.size), name=name, structure="toeplitz")
        col.flags.writeable = False
        self._m = col
        self.meta = dict(meta or {})
        self._inv: np.ndarray | None = None
        self._ntt_cache: dict = {}

    @property
    def first_column(self) -> np.ndarray:
        """``m`` (read-only)."""
        return self._m

    @property
    def integral(self) -> bool:
        return bool(np.all(self._m == np.round(self._m)))

    def frozen_copy(self) -> "ToeplitzStrategy":
        """Itself: its only array is a private read-only copy made at construction."""
        return self

    # -- products -------------------------------------------------------------------------------
    def _matvec(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).ravel()
        n = self.shape[0]
        if self.integral and np.all(x == np.round(x)) and float(np.abs(x).max(initial=0)) < 2.0**62:
            return self._exact_matvec(x)
        return fftconvolve(self._m, x)[:n]

    def _exact_matvec(self, x: np.ndarray) -> np.ndarray:
        """``R x`` exactly for integer ``m`` and ``x`` (:func:`exact_convolution`; the data split
        into high and low halves of bits when the product could leave the CRT range)."""
        n = self.shape[0]
        mi = self._m.astype(np.int64)
        xi = x.astype(np.int64)
        l1 = float(np.abs(self._m).sum())
        if l1 * float(np.abs(x).max(initial=0)) < _CRT_LIMIT:
            return exact_convolution(mi, xi, n, self._ntt_cache)
        K = 31
        hi, lo = xi >> K, xi & ((1 << K) - 1)  # x = 2^K hi + lo, 0 <= lo < 2^K
        out = exact_convolution(mi, hi, n, self._ntt_cache) * float(2**K) + exact_convolution(mi, lo, n, self._ntt_cache)
        return out

    def grid_product(self, x: np.ndarray, grid: float, exact: bool) -> np.ndarray:
        """:meth:`~sparsedp.operators.Operator.grid_product`: ``(m / g) * x`` by the exact
        number-theoretic convolution (:func:`exact_convolution`), never a float FFT (whose rounding
        reaches every row).  Only exact grids are measured (:func:`toeplitz_calibration` refuses
        others); the result must stay below ``2^52`` to be returned exactly."""
        if not exact:
            raise UnsupportedStructureError("a Toeplitz strategy is measured with exact noise only on a grid "
                                            "on which its first column is integral")
        v = np.asarray(x, dtype=np.float64).ravel()
        if not np.all(v == np.round(v)):
            raise UnsupportedStructureError("exact noise on a Toeplitz strategy needs integral data")
        k = grid_integers(self._m, grid)
        # every term of the convolution is below sum |k| max |x|: int64-exact below 2^61
        check_integer_range(float(np.abs(k).astype(np.float64).sum()) * float(np.abs(v).max(initial=0.0)), self.name)
        out = exact_convolution(k, v.astype(np.int64), self.shape[0], self._ntt_cache if grid == 1.0 else None)
        if out.size and not float(np.abs(out).max()) < FLOAT_EXACT:
            raise InputBoundError(f"{self.name}: the product on the grid reaches 2^52, beyond the exact range")
        return np.rint(out).astype(np.int64)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64).ravel()
        n = self.shape[0]
        return fftconvolve(y[::-1], self._m)[:n][::-1]

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.column_stack([self._matvec(X[:, j]) for j in range(X.shape[1])])

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.column_stack([self._rmatvec(Y[:, j]) for j in range(Y.shape[1])])

    def inverse_column(self) -> np.ndarray:
        """The first column of ``R^{-1}`` (lower-triangular Toeplitz too), computed once."""
        if self._inv is None:
            self._inv = series_inverse(self._m, self.shape[0])
        return self._inv

    def exact_solve(self, Y: np.ndarray) -> np.ndarray:
        """``R^{-1} Y`` (vectors or matrices): the GLS estimate of this square invertible strategy
        under any noise variances."""
        h = self.inverse_column()
        n = self.shape[0]
        Y = np.asarray(Y, dtype=np.float64)
        if Y.ndim == 1:
            return fftconvolve(h, Y)[:n]
        return np.column_stack([fftconvolve(h, Y[:, j])[:n] for j in range(Y.shape[1])])

    # -- explicit form and norms ----------------------------------------------------------------
    def tosparse(self) -> sp.csr_matrix:
        n = self.shape[0]
        if n > EXPLICIT_MAX_N:
            raise SparseDPError(f"the explicit form of a Toeplitz strategy is for n <= {EXPLICIT_MAX_N} "
                                f"({n} x {n} lower triangle requested)")
        i, j = np.tril_indices(n)
        A = sp.csr_matrix((self._m[i - j], (i, j)), shape=(n, n))
        A.eliminate_zeros()
        return A

    def column_norms(self, p: int = 1) -> np.ndarray:
        a = np.abs(self._m)
        acc = np.cumsum(a if p == 1 else a * a)  # column j: the first n - j coefficients
        out = acc[::-1]
        return out if p == 1 else np.sqrt(out)

    def gram_diagonal(self) -> np.ndarray:
        return self.column_norms(2) ** 2


def toeplitz_calibration(op: ToeplitzStrategy, secure: bool, g: float, p: int,
                         unit_scales: np.ndarray | None) -> tuple[Operator, bool, float, float, float, bool]:
    """:func:`sparsedp.measure.plan_measurement`'s calibration of a :class:`ToeplitzStrategy`:
    ``(measured, grid exact, sensitivity, data sensitivity, loss of the given scales, identity)``.
    The sensitivity is the certified ``Delta_p`` of the ``n x 1`` first column (the longest
    column).  Exact noise needs ``m / g`` integral (the product ``R x`` is then exact); per-row
    scales must be one scale (the loss is then that of the first column)."""
    from ..calibration import gaussian_loss, laplace_loss

    col = sp.csr_matrix(np.asarray(op.first_column)[:, None])
    col.eliminate_zeros()
    if secure:
        unit = op.first_column / g if g != 1.0 else op.first_column
        if not np.all(unit == np.round(unit)):
            raise UnsupportedStructureError("exact noise on a Toeplitz strategy needs entries on the grid "
                                            "(integer multiples of grid)")
        ucol = col if g == 1.0 else sp.csr_matrix(col / g)
    else:
        ucol = col
    sens = sensitivity_bound(ucol, p)
    data_sens = sens if ucol is col else sensitivity_bound(col, p)
    loss = float("nan")
    if unit_scales is not None:
        if float(unit_scales.min()) != float(unit_scales.max()):
            raise UnsupportedStructureError("a Toeplitz strategy is measured with one noise scale on every row")
        s = np.full(ucol.shape[0], float(unit_scales[0]))
        loss = laplace_loss(ucol, s) if p == 1 else gaussian_loss(ucol, s)
    if math.isnan(sens):  # pragma: no cover - finite by construction
        raise SparseDPError("non-finite sensitivity")
    return op, True, sens, data_sens, loss, False
