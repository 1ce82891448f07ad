"""Certified calibration of a Kronecker product ``A = A_1 (x) ... (x) A_k`` from its factors.

:func:`sparsedp.plan_measurement` calls :func:`kron_calibration` for a
:class:`~sparsedp.marginals.KronOperator` (exact type, like :class:`~sparsedp.intervals.IntervalRows`):
the product is applied by mode products and never formed, and its loss is certified from the
factors' own entries -- the entries the mode products use.

**Sensitivity of a Kronecker product.**  Column ``j = (j_1, ..., j_k)`` of ``A`` is
``A_1[:, j_1] (x) ... (x) A_k[:, j_k]``, whose entries are the products ``prod_i A_i[r_i, j_i]``.
Hence, for ``p`` in {1, 2},

    ||A[:, j]||_p^p = sum_{r_1..r_k} prod_i |A_i[r_i, j_i]|^p = prod_i ||A_i[:, j_i]||_p^p,

and since the factors are non-negative and the ``j_i`` range independently,

    Delta_p(A) = max_j ||A[:, j]||_p = prod_i max_{j_i} ||A_i[:, j_i]||_p = prod_i Delta_p(A_i).

(One record changes one cell of the domain by one, i.e. ``x`` by ``e_j``; ``||A e_j||_p`` is the
column norm.)  Each factor's ``max_j sum_r |a_rj|^p`` is certified by
:func:`sparsedp.calibration.column_norm_bound` (``p = 2``: the sum of squares, exact for integer
entries); the product of those bounds is formed in exact rational arithmetic and rounded up once,
so the bound is ``>=`` the exact sensitivity of the float factors (equal to it for integer
factors: the product of exact integers).

**Exact noise on a grid** ``g`` (``y = g (round(A x / g) + k)``): the grid is exact when
``A_1 / g`` and ``A_2 .. A_k`` are integer matrices (then every entry of ``A / g`` is an integer).
Otherwise one changed cell moves row ``r`` of ``round(A x / g)`` by at most
``ceil(|A_rj| / g) + 1 <= |A_rj| / g + 2`` units, on the ``nnz_j`` rows where ``A_rj != 0``, so in
grid units

    Delta_1 <= max_j (S1_j / g + 2 Z_j),     Delta_2^2 <= max_j (S2_j / g^2 + 4 S1_j / g + 4 Z_j),

with ``S1_j = prod_i ||A_i[:, j_i]||_1``, ``S2_j = prod_i ||A_i[:, j_i]||_2^2`` and ``Z_j = prod_i
nnz(A_i[:, j_i])`` (the non-zeros of a product column are the products of non-zeros); the max of a
sum is at most the sum of the maxima, each of which factors as above.  (The explicit path sums
``(ceil(|A_rj| / g) + 1)^p`` entry by entry; this bound is at most ``~4 g S1 / S2`` relatively
larger.)

**Loss** of homoscedastic scales ``s`` (grid units when secure): ``epsilon = Delta_1 / s``
(Laplace), ``rho = Delta_2^2 / (2 s^2)`` (Gaussian), rounded up exactly.  Per-row scales are not
a Kronecker quantity in general and are refused (:class:`UnsupportedStructureError`).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..calibration import certified_sqrt, column_norm_bound
from ..errors import ShapeError, UnsupportedStructureError

__all__ = ["kron_calibration", "kron_sensitivity"]


def _up(q: Fraction) -> float:
    """The smallest float ``>= q``."""
    f = float(q)
    return f if Fraction(f) >= q else math.nextafter(f, math.inf)


def _sparse(F: Any) -> sp.csr_matrix:
    M = sp.csr_matrix(F, dtype=np.float64, copy=True)  # eliminate_zeros below must not touch the caller's factor
    if M.nnz and not np.all(np.isfinite(M.data)):
        raise ShapeError("a Kronecker factor contains NaN or infinite entries")
    M.eliminate_zeros()
    return M


def _factor_maxima(M: sp.csr_matrix, scale: float = 1.0) -> tuple[Fraction, Fraction, int]:
    """Certified ``(max_j sum_r |a_rj|, max_j sum_r a_rj^2, max_j nnz_j)`` of ``M / scale``."""
    A = M if scale == 1.0 else sp.csr_matrix(M / scale)
    if not A.nnz:
        return Fraction(0), Fraction(0), 0
    s1 = float(column_norm_bound(A, 1).max())
    n2 = column_norm_bound(A, 2)  # certified sqrt of certified sums of squares
    sq = A.data * A.data
    if np.all(A.data == np.round(A.data)) and np.all(np.abs(A.data) < 2.0**26):
        s2 = Fraction(float(np.bincount(A.indices, weights=sq, minlength=A.shape[1]).max()))  # exact integers
    else:
        s2 = Fraction(float(n2.max())) ** 2
    z = int(np.bincount(A.indices, minlength=A.shape[1]).max())
    return Fraction(s1), s2, z


def kron_sensitivity(factors: Any, p: int = 1) -> float:
    """Certified ``Delta_p(A_1 (x) ... (x) A_k) = prod_i Delta_p(A_i)`` (module doc), data units."""
    if p not in (1, 2):
        raise ShapeError(f"norm must be 1 or 2, got {p!r}")
    q = Fraction(1)
    for F in factors:
        s1, s2, _ = _factor_maxima(_sparse(F))
        q *= s1 if p == 1 else s2
    return _up(q) if p == 1 else float(certified_sqrt(_up(q)))


def kron_calibration(op: Any, secure: bool, g: float, p: int, unit_scales: np.ndarray | None
                     ) -> tuple[Any, bool, float, float, float, bool]:
    """``(measured operator, grid exact, sensitivity in sampler units, data sensitivity, loss,
    identity)`` of the :class:`~sparsedp.marginals.KronOperator` ``op`` from its factors (module
    doc), the tuple :func:`sparsedp.plan_measurement` takes from its explicit calibration.  The
    operator measured is ``op`` itself (mode products); ``loss`` is ``nan`` without scales."""
    factors = [_sparse(F) for F in op.factors]
    data = [_factor_maxima(F) for F in factors]
    data_sens = _prod_sens(data, p)
    grid_exact = True
    if secure:
        first = factors[0].data / g
        grid_exact = bool(np.all(first == np.round(first))) and all(
            bool(np.all(F.data == np.round(F.data))) for F in factors[1:])
    if not secure or (grid_exact and g == 1.0):
        sens_q = _prod_q(data, p)
    elif grid_exact:
        sens_q = _prod_q([_factor_maxima(factors[0], g)] + data[1:], p)
    else:
        S1 = math.prod((d[0] for d in data), start=Fraction(1))
        S2 = math.prod((d[1] for d in data), start=Fraction(1))
        Z = math.prod(d[2] for d in data)
        G = Fraction(g)
        sens_q = S1 / G + 2 * Z if p == 1 else S2 / G**2 + 4 * S1 / G + 4 * Z
    sens = _up(sens_q) if p == 1 else float(certified_sqrt(_up(sens_q)))
    loss = float("nan")
    if unit_scales is not None:
        s = np.asarray(unit_scales, dtype=np.float64)
        if s.size and float(s.min()) != float(s.max()):
            raise UnsupportedStructureError(
                "a Kronecker strategy is measured with one noise scale for all rows (per-row scales do not factor)")
        t = Fraction(float(s[0]))
        loss = _up(sens_q / t) if p == 1 else _up(sens_q / (2 * t * t))
    return op, grid_exact, sens, data_sens, loss, False


def _prod_q(data: list, p: int) -> Fraction:
    """``prod_i max_j ||A_i[:, j]||_p^p`` exactly (``p = 1``: L1 sums, ``p = 2``: sums of squares)."""
    return math.prod((d[0] if p == 1 else d[1] for d in data), start=Fraction(1))


def _prod_sens(data: list, p: int) -> float:
    q = _prod_q(data, p)
    return _up(q) if p == 1 else float(certified_sqrt(_up(q)))
