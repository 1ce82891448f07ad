"""Sparse-backed linear operators: the one currency of sparsedp.

Every workload ``W`` and strategy ``M`` is an :class:`Operator`, a
:class:`scipy.sparse.linalg.LinearOperator` that can also give its sparse matrix
(:meth:`Operator.tosparse`), its column norms (the sensitivity, without densifying), and the squared
norms of its images ``||W X[:, j]||^2`` (the building block of the analytic error).  Large workloads
such as ``all_ranges`` are *implicit*: they implement ``matvec``/``rmatvec`` and the norms in closed
form and never materialise their rows.

An operator also carries a ``structure`` tag (``"identity"``, ``"fenwick"``, ``"haar"``, ``"tree"``,
``"lower_triangular"``, ``"general"``) and optional ``row_weights``: a weighted strategy
``diag(w) M`` keeps the structure of ``M`` so that reconstruction can use the fast path for ``M`` with
per-row variances ``Var(z_i) / w_i^2``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from .calibration import sensitivity_bound
from .errors import ShapeError, SparseDPError, UnsupportedStructureError
from .grid_product import csr_grid_product
from .validation import check_vector

__all__ = [
    "Operator",
    "SparseOperator",
    "aslinearoperator",
    "vstack",
    "kron",
    "scale_rows",
    "column_norms",
    "sensitivity",
]


def readonly_copy(a: Any, dtype: Any = None) -> np.ndarray:
    """A copy of the array ``a`` that cannot be written to (``flags.writeable = False``).

    What a measurement plan keeps of the arrays it calibrated: the caller's own array stays
    writeable, and editing it later changes nothing the plan measures."""
    out = np.array(a, dtype=dtype, copy=True)
    out.flags.writeable = False
    return out


def frozen_csr(A: Any) -> sp.csr_matrix:
    """A float64 CSR copy of the sparse (or dense) matrix ``A`` whose ``data``, ``indices`` and
    ``indptr`` are fresh read-only arrays, in canonical form (sorted indices, duplicates summed, so
    that no scipy routine needs to sort it in place later).  ``O(nnz)`` for a sparse ``A``: never
    densified."""
    M = sp.csr_matrix(A, dtype=np.float64, copy=True)
    if not M.has_canonical_format:
        M.sum_duplicates()
    for arr in (M.data, M.indices, M.indptr):
        arr.flags.writeable = False
    return M


class Operator(LinearOperator):
    """Base class of sparsedp operators (a :class:`LinearOperator` with sparse extras).

    Subclasses implement ``_matvec``/``_rmatvec`` (and, for speed, ``_matmat``/``_rmatmat``),
    :meth:`tosparse`, and may override :meth:`column_norms` and :meth:`image_sq_norms` with closed
    forms.
    """

    structure: str = "general"
    name: str = "operator"
    row_weights: np.ndarray | None = None

    def __init__(self, shape: tuple[int, int], name: str = "operator", structure: str = "general"):
        super().__init__(dtype=np.float64, shape=(int(shape[0]), int(shape[1])))
        self.name = name
        self.structure = structure

    # -- explicit form -------------------------------------------------------------------------
    def calibration_rule(self) -> Any:
        """How :func:`sparsedp.measure.plan_measurement` calibrates this operator without reading
        every entry: a function ``(op, secure, grid, p, given scales) -> (measured operator, grid
        exact, sensitivity, data sensitivity, loss of the given scales, identity)``, or ``None``
        (the default: from its explicit entries).  A structured operator whose entries follow from a
        few numbers (a Kronecker product's factors, a Toeplitz matrix's first column) returns its
        rule; a subclass that changes the products must return ``None`` again."""
        return None

    def tosparse(self) -> sp.csr_matrix:
        """The operator as a CSR matrix (may be large for implicit workloads)."""
        raise NotImplementedError

    def grid_product(self, x: np.ndarray, grid: float, exact: bool) -> np.ndarray:
        """What exact noise snaps to its grid (:mod:`sparsedp.grid_product`): with ``exact`` (every
        ``A_ij / grid`` an integer, ``x`` integral) the integers ``(A / grid) x`` computed exactly,
        as int64; otherwise ``A x / grid`` by a row-local float product whose rounding is certified
        below a quarter grid unit.  Raises :class:`~sparsedp.errors.InputBoundError` when the data
        are too large for that certificate.  The measurement path measures only operators that
        implement it (:class:`SparseOperator`, interval rows, Kronecker products, Toeplitz
        strategies); this default refuses."""
        raise UnsupportedStructureError(
            f"{type(self).__name__} has no certified product on the noise grid; measure its explicit form")

    def _scaled_rows(self, weights: np.ndarray, name: str | None) -> "Operator | None":
        """``diag(weights) self`` as an operator of this kind when it stays implicit
        (:func:`scale_rows`); ``None``: :func:`scale_rows` builds a weighted sparse operator."""
        return None

    def toarray(self) -> np.ndarray:
        """Dense matrix; for tests and small sizes only."""
        return self.tosparse().toarray()

    # -- norms ---------------------------------------------------------------------------------
    def column_norms(self, p: int = 1) -> np.ndarray:
        """Per-column ``p``-norms (``p`` in {1, 2}), from the sparse structure."""
        return column_norms(self.tosparse(), p)

    def image_sq_norms(self, X: np.ndarray | sp.spmatrix) -> np.ndarray:
        """``||A X[:, j]||_2^2`` for every column ``j`` of ``X`` (dense ``n x k`` or sparse)."""
        if sp.issparse(X):
            prod = self.tosparse() @ sp.csc_matrix(X)
            return np.asarray(prod.multiply(prod).sum(axis=0)).ravel()
        Y = self.matmat(np.asarray(X, dtype=np.float64))
        return np.einsum("ij,ij->j", Y, Y)

    def gram_diagonal(self) -> np.ndarray:
        """Squared column 2-norms, ``diag(A^T A)``."""
        return self.column_norms(2) ** 2

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.shape[0]}x{self.shape[1]} ({self.structure})>"


class SparseOperator(Operator):
    """A :class:`LinearOperator` backed by a ``scipy.sparse`` matrix.

    Parameters
    ----------
    matrix:
        Any sparse (or dense, converted) 2-D matrix.
    name, structure:
        A label and the structure tag used by fast solvers.
    meta:
        Structure data for fast paths (e.g. the tree layout of a hierarchical strategy).
    base, row_weights:
        For a weighted operator ``diag(w) base``: the unweighted structured operator and ``w``.
    """

    def __init__(
        self,
        matrix: Any,
        name: str = "matrix",
        structure: str = "general",
        meta: dict | None = None,
        base: "SparseOperator | None" = None,
        row_weights: np.ndarray | None = None,
    ):
        mat = sp.csr_matrix(matrix, dtype=np.float64)
        if mat.ndim != 2:
            raise ShapeError(f"operator matrix must be 2-D, got {mat.ndim}-D")
        if mat.nnz and not np.all(np.isfinite(mat.data)):
            raise ShapeError("operator matrix contains NaN or infinite entries")
        super().__init__(mat.shape, name=name, structure=structure)
        self.matrix = mat
        self.meta = dict(meta or {})
        self.base = base
        self.row_weights = None if row_weights is None else np.asarray(row_weights, dtype=np.float64)

    def _matvec(self, x: np.ndarray) -> np.ndarray:
        return self.matrix @ np.ravel(x)

    def _rmatvec(self, y: np.ndarray) -> np.ndarray:
        return self.matrix.T @ np.ravel(y)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix @ X)

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        return np.asarray(self.matrix.T @ Y)

    def _adjoint(self) -> "SparseOperator":
        return SparseOperator(self.matrix.T, name=f"{self.name}^T")

    def tosparse(self) -> sp.csr_matrix:
        return self.matrix

    def grid_product(self, x: np.ndarray, grid: float, exact: bool) -> np.ndarray:
        """:meth:`Operator.grid_product` of the explicit matrix (int64 CSR product when exact)."""
        return csr_grid_product(self.matrix, x, grid, exact, self.name)

    def frozen_copy(self) -> "SparseOperator":
        """A :class:`SparseOperator` (this exact class) with read-only copies of this operator's
        arrays: the matrix (:func:`frozen_csr`), ``row_weights``, the ``base`` of a weighted operator
        (its own frozen copy) and the ``integer_rows`` form of ``meta`` (the other ``meta`` entries
        are shared: they only guide estimators).  ``O(nnz)``.  What
        :func:`~sparsedp.measure.plan_measurement` measures, so that editing the caller's operator
        after planning changes nothing measured."""
        meta = dict(self.meta)
        form = meta.get("integer_rows")
        if form is not None:
            H, f = form
            meta["integer_rows"] = (frozen_csr(H), readonly_copy(f, np.float64))
        base = self.base.frozen_copy() if isinstance(self.base, SparseOperator) else self.base
        out = SparseOperator(
            frozen_csr(self.matrix),
            name=self.name,
            structure=self.structure,
            meta=meta,
            base=base,
            row_weights=None if self.row_weights is None else readonly_copy(self.row_weights, np.float64),
        )
        for arr in (out.matrix.data, out.matrix.indices, out.matrix.indptr):
            arr.flags.writeable = False  # the constructor shares the frozen arrays; this makes sure
        return out


def aslinearoperator(A: Any, name: str = "matrix") -> Operator:
    """Wrap a sparse matrix, dense array or :class:`Operator` as an :class:`Operator`."""
    if isinstance(A, Operator):
        return A
    if isinstance(A, LinearOperator):
        raise SparseDPError(
            "a plain LinearOperator has no sparse form; wrap its matrix with sparsedp.operators.SparseOperator"
        )
    if sp.issparse(A):
        return SparseOperator(A, name=name)
    arr = np.asarray(A, dtype=np.float64)
    if arr.ndim != 2:
        raise ShapeError(f"an operator must be 2-D, got shape {arr.shape}")
    return SparseOperator(sp.csr_matrix(arr), name=name)


def column_norms(A: Any, p: int = 1) -> np.ndarray:
    """Per-column ``L_p`` norms (``p`` in {1, 2}) of a sparse matrix or operator, without densifying."""
    if isinstance(A, Operator):
        return A.column_norms(p)
    mat = A if sp.issparse(A) else sp.csr_matrix(A, dtype=np.float64)
    if p == 1:
        return np.asarray(abs(mat).sum(axis=0)).ravel()
    if p == 2:
        return np.sqrt(np.asarray(mat.multiply(mat).sum(axis=0)).ravel())
    raise SparseDPError(f"norm must be 1 or 2, got {p!r}")


def sensitivity(M: Any, norm: int = 1) -> float:
    """Sensitivity of ``x -> M x`` when one record changes one entry of ``x`` by one.

    ``Delta_p(M) = max_j ||M[:, j]||_p``: the largest column ``L_1`` norm (Laplace, pure epsilon) or
    ``L_2`` norm (Gaussian, zCDP).  Seed 001: ``A = [[1, 1], [1, -1]]`` has ``Delta_1 = 2``.

    Computed from the explicit entries of ``M`` (``M.tosparse()``), never from a closed form an
    operator claims, and certified: the float result is ``>=`` the exact sum of the float entries
    (:func:`sparsedp.calibration.sensitivity_bound`), so noise calibrated with it is never short.
    """
    return sensitivity_bound(aslinearoperator(M), norm)


def vstack(operators: Sequence[Any], name: str | None = None) -> SparseOperator:
    """Stack operators with the same number of columns (union of queries / measurements)."""
    ops = [aslinearoperator(op) for op in operators]
    if not ops:
        raise ShapeError("vstack needs at least one operator")
    n = ops[0].shape[1]
    for op in ops:
        if op.shape[1] != n:
            raise ShapeError(f"vstack: column counts differ ({op.shape[1]} != {n})")
    mat = sp.vstack([op.tosparse() for op in ops], format="csr")
    return SparseOperator(mat, name=name or "vstack(" + ", ".join(op.name for op in ops) + ")")


def kron(A: Any, B: Any, name: str | None = None) -> SparseOperator:
    """Kronecker product ``A (x) B``: queries on a product domain (marginals, multi-dim ranges)."""
    a, b = aslinearoperator(A), aslinearoperator(B)
    mat = sp.kron(a.tosparse(), b.tosparse(), format="csr")
    return SparseOperator(mat, name=name or f"kron({a.name}, {b.name})")


def scale_rows(M: Any, w: Iterable[float], name: str | None = None) -> Operator:
    """Row scaling ``diag(w) M``.  Structure tags and fast paths of ``M`` are kept.

    ``w`` must be finite and non-zero (a zero weight would drop a measurement and break the inverse
    of a square strategy; drop the row explicitly instead).
    """
    op = aslinearoperator(M)
    weights = check_vector(list(w) if not isinstance(w, np.ndarray) else w, op.shape[0], "row weights")
    if np.any(weights == 0):
        raise ShapeError("row weights must be non-zero")
    implicit = op._scaled_rows(weights, name)  # an operator that stays implicit (interval rows)
    if implicit is not None:
        return implicit
    if isinstance(op, SparseOperator) and op.base is not None:
        base = op.base
        total = weights * op.row_weights
    elif isinstance(op, SparseOperator):
        base, total = op, weights
    else:
        base, total = SparseOperator(op.tosparse(), name=op.name), weights
    mat = sp.diags(total) @ base.matrix
    return SparseOperator(
        mat,
        name=name or f"weighted({base.name})",
        structure=base.structure,
        meta=base.meta,
        base=base,
        row_weights=total,
    )
