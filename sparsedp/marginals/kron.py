"""Implicit Kronecker operators ``A_1 (x) A_2 (x) ... (x) A_k`` on product domains.

``(A_1 (x) ... (x) A_k) x`` is computed on ``x`` reshaped to ``(n_1, ..., n_k)`` (C order, the order
of :func:`numpy.kron`) by applying each factor along its axis: ``O(N sum_i m_i)`` work for a dense
``n_i x n_i`` factor instead of ``O(N^2)``, and the ``N = prod n_i`` columns are never formed as a
matrix.  The factorisation also gives, without the product:

* column norms: ``||(A (x) B)[:, (i, j)]||_p = ||A[:, i]||_p ||B[:, j]||_p``, so the sensitivity
  ``Delta_p = prod_i Delta_p(A_i)`` (the maximum of a product of non-negative independent factors);
* ``||A (x) B||_F^2 = ||A||_F^2 ||B||_F^2`` (traces of Kronecker products factor);
* transpose / pseudo-inverse factor by factor: ``(A (x) B)^+ = A^+ (x) B^+``.

:class:`KronStack` is a union (vertical stack) of Kronecker products with the same column space
(``sum-of-Kronecker`` workloads such as a set of marginals).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import ShapeError
from ..grid_product import FLOAT_EXACT, check_integer_range, check_rounding, grid_integers
from ..operators import Operator, frozen_csr, readonly_copy
from .domain import Domain
from .kron_calibration import kron_calibration

__all__ = ["KronOperator", "KronStack", "marginal_operator", "apply_factors"]


def _factor(A: Any) -> Any:
    if sp.issparse(A):
        return sp.csr_matrix(A, dtype=np.float64)
    if isinstance(A, Operator):
        return sp.csr_matrix(A.tosparse(), dtype=np.float64)
    arr = np.asarray(A, dtype=np.float64)
    if arr.ndim != 2:
        raise ShapeError(f"a Kronecker factor must be 2-D, got shape {arr.shape}")
    return arr


def apply_factors(factors: Sequence[Any], t: np.ndarray, axes: Sequence[int] | None = None) -> np.ndarray:
    """Apply ``factors[k]`` along axis ``axes[k]`` of the array ``t`` (default: axis ``k``).

    ``t`` has shape ``(..., n_k, ...)``; the result has ``m_k`` in place of ``n_k`` on each axis.
    This is ``(A_1 (x) ... (x) A_k) vec(t)`` for C-ordered ``t``, never forming the product."""
    axes = range(len(factors)) if axes is None else axes
    for F, ax in zip(factors, axes):
        t = np.moveaxis(t, ax, 0)
        shp = t.shape
        flat = t.reshape(shp[0], -1)
        out = F @ flat
        t = np.moveaxis(np.asarray(out).reshape((F.shape[0],) + shp[1:]), 0, ax)
    return t


def _integer_factor(F: Any) -> Any:
    """The factor ``F`` (entries certified integral) as int64, sparse or dense as given."""
    if sp.issparse(F):
        M = sp.csr_matrix(F)
        return sp.csr_matrix((grid_integers(M.data, 1.0), M.indices, M.indptr), shape=M.shape)
    return grid_integers(np.asarray(F), 1.0)


class KronOperator(Operator):
    """``A_1 (x) ... (x) A_k`` as an implicit :class:`~sparsedp.operators.Operator` (see module doc).

    ``factors``: dense arrays, sparse matrices or operators (kept as given; small).  ``tosparse``
    forms the product explicitly and is for small domains and tests only."""

    def calibration_rule(self) -> Any:
        """Calibrated from the factors (mode products, never the product's entries:
        :func:`~sparsedp.marginals.kron_calibration.kron_calibration`); a subclass from its entries."""
        return kron_calibration if type(self) is KronOperator else None

    def __init__(self, factors: Sequence[Any], name: str = "kron"):
        fs = [_factor(A) for A in factors]
        if not fs:
            raise ShapeError("a Kronecker product needs at least one factor")
        self.factors = fs
        self.in_shape = tuple(int(F.shape[1]) for F in fs)
        self.out_shape = tuple(int(F.shape[0]) for F in fs)
        super().__init__((math.prod(self.out_shape), math.prod(self.in_shape)), name=name, structure="kron")

    def frozen_copy(self) -> "KronOperator":
        """A :class:`KronOperator` (this exact class) over read-only copies of the factors (dense
        factors stay dense, sparse ones CSR: :func:`~sparsedp.operators.frozen_csr`), ``O(sum of the
        factors' sizes)``.  What :func:`~sparsedp.measure.plan_measurement` measures, so that editing
        a factor after planning changes nothing measured."""
        out = KronOperator([frozen_csr(F) if sp.issparse(F) else readonly_copy(F, np.float64) for F in self.factors],
                           name=self.name)
        for F in out.factors:  # the constructor keeps the given (frozen) arrays; this makes sure
            for arr in ((F.data, F.indices, F.indptr) if sp.issparse(F) else (F,)):
                arr.flags.writeable = False
        return out

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return apply_factors(self.factors, np.asarray(x, dtype=np.float64).reshape(self.in_shape)).ravel()

    def grid_product(self, x: np.ndarray, grid: float, exact: bool) -> np.ndarray:
        """:meth:`~sparsedp.operators.Operator.grid_product` by mode products (row-local: row ``r``
        of the result reads only the ``x_j`` with ``A_rj != 0``; zero factor entries contribute
        exact zeros).  The grid divides the first factor (``kron_calibration`` certifies ``A_1 / g``
        and ``A_2 .. A_k`` integral for an exact grid).  Exact: the integer factors are applied in
        float64 when every stage's ``|K| |x|`` stays below ``2^52`` (exact there), else in int64
        below ``2^61``, else refused.  Inexact: float mode products, refused unless their rounding
        (``sum_i`` terms per row of factor ``i``) is below a quarter grid unit."""
        t = np.asarray(x).reshape(self.in_shape)
        first = self.factors[0] / grid if grid != 1.0 else self.factors[0]
        factors = [first] + list(self.factors[1:])
        if exact:
            factors = [_integer_factor(F) for F in factors]
        absf = [abs(F) for F in factors]
        stage = np.abs(t).astype(np.float64)
        peak = 0.0
        for F, ax in zip(absf, range(len(absf))):  # the bound of every intermediate
            stage = apply_factors([F.astype(np.float64)], stage, axes=[ax])
            peak = max(peak, float(stage.max(initial=0.0)))
        if not exact:
            terms = sum(int(F.shape[1]) if not sp.issparse(F) else int(np.diff(sp.csr_matrix(F).indptr).max(initial=0))
                        for F in factors)
            check_rounding(peak, terms, self.name)
            return apply_factors(factors, t.astype(np.float64)).ravel()
        check_integer_range(peak, self.name)
        if peak < FLOAT_EXACT:  # integers below 2^53 at every partial sum: float64 (BLAS) is exact
            out = apply_factors([F.astype(np.float64) for F in factors], t.astype(np.float64))
            return np.rint(out).astype(np.int64).ravel()
        return np.asarray(apply_factors(factors, t.astype(np.int64)), dtype=np.int64).ravel()

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return apply_factors([F.T for F in self.factors], np.asarray(y, dtype=np.float64).reshape(self.out_shape)).ravel()

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        t = apply_factors(self.factors, X.reshape(self.in_shape + (X.shape[1],)))
        return t.reshape(self.shape[0], X.shape[1])

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        Y = np.asarray(Y, dtype=np.float64)
        t = apply_factors([F.T for F in self.factors], Y.reshape(self.out_shape + (Y.shape[1],)))
        return t.reshape(self.shape[1], Y.shape[1])

    def _adjoint(self) -> "KronOperator":
        return KronOperator([F.T for F in self.factors], name=f"{self.name}^T")

    _transpose = _adjoint

    def tosparse(self) -> sp.csr_matrix:
        out = sp.csr_matrix(self.factors[0])
        for F in self.factors[1:]:
            out = sp.kron(out, sp.csr_matrix(F), format="csr")
        return out

    def factor_column_norms(self, p: int = 1) -> list[np.ndarray]:
        """Per-factor column ``p``-norms; the product's are their Kronecker product."""
        out = []
        for F in self.factors:
            if p == 1:
                out.append(np.asarray(abs(F).sum(axis=0)).ravel())
            elif p == 2:
                out.append(np.sqrt(np.asarray((F.multiply(F) if sp.issparse(F) else F * F).sum(axis=0)).ravel()))
            else:
                raise ShapeError(f"norm must be 1 or 2, got {p!r}")
        return out

    def column_norms(self, p: int = 1) -> np.ndarray:
        """All column norms (a vector of the domain's length: small domains only)."""
        out = np.ones(1)
        for c in self.factor_column_norms(p):
            out = np.kron(out, c)
        return out

    def sensitivity(self, p: int = 1) -> float:
        """``Delta_p = max_j ||A[:, j]||_p = prod_i max_j ||A_i[:, j]||_p`` (one record changes one
        cell of the domain by one)."""
        return float(math.prod(float(c.max()) for c in self.factor_column_norms(p)))

    def frobenius_sq(self) -> float:
        """``||A||_F^2 = prod_i ||A_i||_F^2`` (the trace of ``A^T A``)."""
        return float(math.prod(float((F.multiply(F)).sum() if sp.issparse(F) else (F * F).sum())
                                for F in self.factors))

    def pinv(self) -> "KronOperator":
        """``A^+ = A_1^+ (x) ... (x) A_k^+`` (dense pseudo-inverses of the small factors)."""
        return KronOperator([np.linalg.pinv(F.toarray() if sp.issparse(F) else F) for F in self.factors],
                            name=f"{self.name}^+")


class KronStack(Operator):
    """A union of Kronecker products over one domain: rows ``[K_1; K_2; ...]`` (each a
    :class:`KronOperator` with the same input shape)."""

    def __init__(self, terms: Sequence[KronOperator], name: str = "kron stack"):
        terms = list(terms)
        if not terms:
            raise ShapeError("a stack needs at least one term")
        shape_in = terms[0].in_shape
        if any(t.in_shape != shape_in for t in terms):
            raise ShapeError("every Kronecker term must act on the same domain shape")
        self.terms = terms
        self.offsets = np.cumsum([0] + [t.shape[0] for t in terms])
        super().__init__((int(self.offsets[-1]), terms[0].shape[1]), name=name, structure="kron_stack")

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([t.matvec(x) for t in self.terms])

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        y = np.ravel(y)
        out = np.zeros(self.shape[1])
        for t, a, b in zip(self.terms, self.offsets[:-1], self.offsets[1:]):
            out += t.rmatvec(y[a:b])
        return out

    def tosparse(self) -> sp.csr_matrix:
        return sp.vstack([t.tosparse() for t in self.terms], format="csr")

    def sensitivity(self, p: int = 1) -> float:
        """``Delta_p`` of the stack.  Exact when every term's factors have constant column norms
        (marginals, residuals): then every column has norm ``(sum_t prod_i c_{t,i}^p)^(1/p)``.
        Otherwise the upper bound ``(sum_t Delta_p(K_t)^p)^(1/p)``."""
        return float(sum(t.sensitivity(p) ** p for t in self.terms) ** (1.0 / p))


def kron(A: Any, B: Any, *more: Any, name: str | None = None) -> KronOperator:
    """``A (x) B (x) ...``: queries (or a strategy) on a product domain as an implicit
    :class:`KronOperator` -- never formed: matrix-vector products cost ``O(sum of the factors'
    work)`` per cell, and :func:`sparsedp.optimize` and :func:`sparsedp.measure.plan_measurement`
    use the factors (the Kronecker family; sensitivity as the product of the factors').  ``tosparse``
    forms the product for small domains.  (:func:`sparsedp.operators.kron` is the explicit sparse
    product.)"""
    factors = (A, B) + tuple(more)
    names = [getattr(F, "name", type(F).__name__) for F in factors]
    flat: list[Any] = []
    for F in factors:  # a Kronecker factor that is itself a Kronecker product contributes its factors
        flat.extend(F.factors if isinstance(F, KronOperator) else [F])
    return KronOperator(flat, name=name or f"kron({', '.join(names)})")


def marginal_operator(domain: Domain, attrs: Any) -> KronOperator:
    """The marginal on ``attrs`` as a Kronecker product: identity on each attribute kept, a row of
    ones (the sum) on each other: ``W_S = (x)_i (I if i in S else 1^T)``.  ``W_S x`` is the marginal
    table (C order over the kept attributes) of the full-domain count vector ``x``."""
    ax = set(domain.axes(attrs))
    factors = [sp.identity(n, format="csr") if i in ax else np.ones((1, n)) for i, n in enumerate(domain.sizes)]
    return KronOperator(factors, name=f"marginal{tuple(domain.names[i] for i in sorted(ax))}")
