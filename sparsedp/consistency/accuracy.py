"""Variance of every value of a consistent release made by the consistency engine (issue 20).

:func:`~sparsedp.consistency.solve` returns the GLS projection of the noisy values ``x~`` (noise
variances ``V = diag(v)``) onto ``{x : C x = b}``:
``x = x~ - V C^T (C V C^T)^+ (C x~ - b)``.  It is linear in the noise, so

    Cov(x) = (I - P) V = V - V C^T (C V C^T)^+ C V,     P = V C^T (C V C^T)^+ C,

and ``Var(x_j) <= v_j`` (a projection cannot raise a variance).  :func:`projection_variances`
gives its diagonal:

* ``"exact"``: the formula with dense matrices (``n`` values, ``m`` constraint rows): ``O(m n)``
  memory, for small problems (``n <= dense_limit``; larger ones are refused with a
  :class:`~sparsedp.range_variance.MemoryLimitError`-style message, nothing allocated).
* ``"estimate"``: ``mean_k ((I - P) z_k)_j^2`` with ``z_k = V^{1/2} r_k``, ``r_k`` Rademacher,
  ``(I - P) z = solve(x + z) - x`` for the feasible release ``x`` (the projection is affine): one
  engine solve per probe, any size, unbiased up to the solver's tolerance; the relative standard
  error of each variance is at most ``sqrt(2 / probes)`` (``Var((a^T r)^2) <= 2 (a^T a)^2``).
* ``"bound"``: ``v`` itself, a guaranteed upper bound (intervals from it are conservative).
* ``"auto"``: exact up to ``dense_limit`` values, else the estimate.

With ``noise=`` given, the ``"exact"`` report also carries the error's shape (the coefficients
``I - P`` of the noise; computed on the first interval request, the same dense formula again), so
its default intervals are ``"accurate"`` (:mod:`sparsedp.accuracy`); for exact noise, ``scales=`` /
``unit_scales=`` (as :func:`~sparsedp.accuracy.expected_error`'s) let them use the noise's exact
law.  Estimated and bounded reports give ``"normal"`` intervals (``"exact-tail"`` or
``"chebyshev"``: certified, by name).

Structured results have exact ``O(n)`` forms elsewhere: the restaurant
(:meth:`~sparsedp.consistency.RestaurantRelease.variances`, trees x span), trees
(:class:`~sparsedp.range_variance.IntervalTreeCovariance`) and flows
(:meth:`~sparsedp.flows.FlowRelease.error_report`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..accuracy import ErrorReport, _check_scales, error_shape
from ..errors import SparseDPError
from ..range_variance import DEFAULT_MEMORY_LIMIT, check_memory
from ..validation import check_vector
from .families import ConstraintFamily
from .solvers import solve

__all__ = ["projection_variances"]


def _families(constraints: ConstraintFamily | Iterable[ConstraintFamily]) -> list[ConstraintFamily]:
    return [constraints] if isinstance(constraints, ConstraintFamily) else list(constraints)


def projection_variances(
    x: Any,
    constraints: ConstraintFamily | Iterable[ConstraintFamily],
    variances: Any = None,
    *,
    method: str = "auto",
    probes: int = 64,
    rng: Any = None,
    dense_limit: int = 4000,
    memory_limit: float = DEFAULT_MEMORY_LIMIT,
    noise: str | None = None,
    secure: bool = False,
    scales: Any = None,
    unit_scales: Any = None,
    **solve_options: Any,
) -> ErrorReport:
    """Variance of every value of the consistent release ``x`` (``solve(x~, constraints,
    variances).x``) as an :class:`~sparsedp.accuracy.ErrorReport` (module docstring for the methods).

    ``variances``: the noise variance of every noisy value (a number or one per value; ``None``: 1,
    i.e. ``Var(x_j) / v`` for homoscedastic noise).  ``noise`` (``"laplace"`` / ``"gaussian"``) and
    ``secure`` are recorded for the report's confidence intervals (and, for exact noise, the noisy
    values' ``scales`` in data units or the sampler's ``unit_scales``; see
    :func:`~sparsedp.accuracy.expected_error`).  ``solve_options`` go to
    :func:`~sparsedp.consistency.solve` for the estimate's solves."""
    x = check_vector(x, name="x")
    n = x.size
    if method not in ("auto", "exact", "estimate", "bound"):
        raise SparseDPError(f"method must be 'auto', 'exact', 'estimate' or 'bound', got {method!r}")
    if noise not in (None, "laplace", "gaussian"):
        raise SparseDPError(f"noise must be 'laplace', 'gaussian' or None, got {noise!r}")
    try:
        v = np.broadcast_to(np.asarray(1.0 if variances is None else variances, dtype=np.float64), (n,)).copy()
    except (TypeError, ValueError) as exc:
        raise SparseDPError(f"variances must be a number or one per value ({n})") from exc
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise SparseDPError("variances must be finite and > 0")
    fams = _families(constraints)
    if method == "auto":
        method = "exact" if n <= dense_limit else "estimate"
    stderr = 0.0
    shape = None
    if method == "bound":
        var = v
    elif method == "exact":
        if n > dense_limit:
            raise SparseDPError(f"method='exact' forms dense matrices and is limited to dense_limit = {dense_limit} "
                                f"values (this release has {n}); use method='estimate' (unbiased) or 'bound'")
        C = sp.vstack([f.rows(n)[0] for f in fams], format="csr") if fams else sp.csr_matrix((0, n))
        m = C.shape[0]
        check_memory(8.0 * (3 * m * n + m * m), memory_limit, "the exact variances of this consistent release")
        K = C.toarray() * v  # C V
        G = np.linalg.pinv(K @ C.toarray().T, hermitian=True)
        var = np.maximum(v - np.einsum("ij,ij->j", K, G @ K), 0.0)
        if noise is not None:
            # computed on the first interval request (a partial: the report stays picklable)
            law = (noise, bool(secure), _check_scales(scales, n, "scales"),
                   _check_scales(unit_scales, n, "unit_scales"))
            shape = functools.partial(_projection_shape, C, v, law, var, memory_limit)
    else:
        if isinstance(probes, (bool, np.bool_)) or not isinstance(probes, (int, np.integer)) or probes < 1:
            raise SparseDPError(f"probes must be an integer >= 1, got {probes!r}")
        gen = np.random.default_rng(rng)
        sd = np.sqrt(v)
        acc = np.zeros(n)
        for _ in range(int(probes)):
            z = gen.choice([-1.0, 1.0], size=n) * sd
            a = solve(x + z, fams, variances=v, **solve_options).x - x
            acc += a * a
        var = acc / int(probes)
        stderr = float(np.sqrt(2.0 / probes) * var.sum())
    total = float(var.sum())
    return ErrorReport(total, total / max(n, 1), f"{method}-projection", stderr, variances=var, noise=noise,
                       secure=bool(secure), shape=shape)


def _projection_shape(C: sp.csr_matrix, v: np.ndarray, noise: tuple, var: np.ndarray, memory_limit: float) -> Any:
    """The :class:`~sparsedp.accuracy.ErrorShape` of the consistent values: their errors are
    ``(I - P) z`` with ``P = V C^T (C V C^T)^+ C`` (module docstring), i.e. ``I - K^T G C`` with
    ``K = C V``, ``G = (K C^T)^+`` (``None`` if its dense matrices exceed ``memory_limit``)."""
    kind, secure, scales, unit_scales = noise
    m, n = C.shape
    if 8.0 * (3 * m * n + m * m + 2 * n * n) > memory_limit:
        return None
    Cd = C.toarray()
    K = Cd * v
    G = np.linalg.pinv(K @ Cd.T, hermitian=True)
    coef = np.eye(v.size) - K.T @ (G @ Cd)
    return error_shape(coef, kind, secure=secure, variances=v, scales=scales, unit_scales=unit_scales,
                       answer_variances=var)
