"""Generalised least squares over a hierarchy, component by component, with exact variances.

Every unit ``u`` of the hierarchy has an unbiased estimate ``y_u`` of its own vector (one column
per component) with independent errors of variance ``v_u`` per column: ``v = 0`` marks an exact
value (an invariant), ``v = inf`` no measurement.  The estimate of every unit that minimises
``sum_u (y_u - x_u)^2 / v_u`` subject to ``x_parent = sum x_children`` (the GLS, the best linear
unbiased estimate) separates by column and is computed in two passes, generalising Hay, Rastogi,
Miklau and Suciu (VLDB 2010) to per-unit variances, unbalanced trees, exact and missing values
(:func:`sparsedp.tree_estimator.two_pass` is the same recursion for trees in a layout):

* upward (deepest level first): ``Z_u = sum_c z_c``, ``V_u = sum_c a_c`` over the children,
  ``a_u = 1 / (1 / v_u + 1 / V_u)``, ``z_u = a_u (y_u / v_u + Z_u / V_u)`` (leaves: ``z = y``,
  ``a = v``): ``z_u`` is the best estimate of ``x_u`` from the subtree of ``u``;
* downward: the root keeps ``xhat = z``; a child ``c`` of ``u`` gets
  ``xhat_c = z_c + (a_c / V_u) (xhat_u - Z_u)``.

Variances, exactly, from the same passes.  ``z_c`` (variance ``a_c``) and the best estimate of
``x_c`` from outside the subtree of ``c`` are independent; the latter is ``u``'s estimate from
outside its children's subtrees (``u``'s own ``y_u`` combined with the information from outside
``u``'s subtree, variance ``w_u = 1 / (1 / o_u + 1 / v_u)``) minus the siblings' ``z``, so its
variance is ``o_c = w_u + V_u - a_c`` (root: ``o = inf``), and
``Var(xhat_c) = 1 / (1 / a_c + 1 / o_c)``.

One vectorised step per level each way (``reduceat`` over the contiguous children, ``take`` by the
parent index): ``O(units x columns)`` time and memory.  Only ``y`` and the public variances enter:
the estimate is post-processing of the measurement.

Every step is element by element or a sum over one family's children in order, so a unit's
result depends only on its own subtree and its ancestors' values: the passes can be split at any
level (:func:`upward_level` and :func:`downward_level`, the steps of one level) and run subtree by
subtree -- the chunked release on Dask does -- with results bit for bit those of the whole
hierarchy.  :func:`rowmul` is the small dense product of the component basis with the same
property (a row's result never depends on how many rows are multiplied together).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError, SparseDPError
from .hierarchy import Hierarchy

__all__ = ["HierarchyGLS", "Upward", "hierarchy_gls", "upward_level", "downward_level", "rowmul"]


@dataclass(frozen=True)
class HierarchyGLS:
    """Per level ``d``: ``estimate[d]`` and ``variance[d]`` (``(units, columns)``), consistent
    (every parent equals the sum of its children, up to float rounding)."""

    estimate: tuple[np.ndarray, ...]
    variance: tuple[np.ndarray, ...]


def _inv(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1.0 / v


_ROWS = 2048  # rows per block of rowmul


def rowmul(a: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``a @ m`` for a ``(rows, k)`` array and a small ``(k, j)`` matrix, every entry the sum over
    ``i`` of ``a[r, i] m[i, c]`` added in order, one vectorised pass per ``i``: each row's result
    depends on that row alone, so a unit's value is the same whether its level is processed whole
    or subtree by subtree (a BLAS product, or ``einsum``, may sum a row in another order depending
    on the number of rows and the memory layout)."""
    a = np.asarray(a, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    if a.ndim != 2 or m.ndim != 2 or a.shape[1] != m.shape[0]:
        raise ShapeError(f"cannot multiply {a.shape} by {m.shape}")
    n, k = a.shape
    out = np.empty((n, m.shape[1]))
    if k == 0:
        out[:] = 0.0
        return out
    tmp = np.empty((min(n, _ROWS), m.shape[1]))
    for lo in range(0, n, _ROWS):  # blocks of rows that stay in cache (the same sums, in the same order)
        o, ab = out[lo:lo + _ROWS], a[lo:lo + _ROWS]
        t = tmp[:o.shape[0]]
        np.multiply(ab[:, 0:1], m[0], out=o)
        for i in range(1, k):
            np.multiply(ab[:, i:i + 1], m[i], out=t)
            o += t
    return out


@dataclass(frozen=True)
class Upward:
    """The upward pass at one level: ``z`` / ``a`` (each unit's best estimate from its subtree and
    its variance) and ``Z`` / ``V`` (the sums of its children's; ``V = inf`` for a leaf)."""

    z: np.ndarray
    a: np.ndarray
    Z: np.ndarray
    V: np.ndarray


def upward_level(h: Hierarchy, d: int, own: np.ndarray, own_var: np.ndarray, child: Upward | None) -> Upward:
    """The upward step at level ``d`` of ``h`` from the level below's (``child``; ``None`` at the
    deepest level of ``h``)."""
    v = own_var
    y = np.where(np.isinf(v), 0.0, own)
    leaf = h.leaves(d)
    if np.any(np.isinf(v[leaf])):
        raise SparseDPError(f"a leaf of level {h.levels[d]!r} has a component that is neither measured nor "
                            "invariant: its estimate is undetermined (measure the cells at that level)")
    if child is not None:
        Z = h.children_sum(d, child.z)
        V = h.children_sum(d, child.a)
        V[leaf] = np.inf
    else:
        Z = np.zeros_like(y)
        V = np.full_like(y, np.inf)
    iv, iV = _inv(v), _inv(V)
    with np.errstate(divide="ignore", invalid="ignore"):
        av = 1.0 / (iv + iV)  # 0 when either is exact
        zz = (y * np.where(np.isinf(iv), 0.0, iv) + Z * np.where(np.isinf(iV), 0.0, iV)) * av
    zz = np.where(v == 0, y, np.where(V == 0, Z, zz))
    av = np.where((v == 0) | (V == 0), 0.0, av)
    return Upward(zz, av, Z, V)


def downward_level(parents: np.ndarray, up_parent: Upward, est_parent: np.ndarray, outside_parent: np.ndarray,
                   own_var_parent: np.ndarray, up: Upward) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The downward step to a level from its parents' (``parents``: each unit's parent index;
    ``up_parent`` / ``est_parent`` / ``outside_parent`` / ``own_var_parent``: the parent level's
    upward pass, final estimate, variance from outside its subtree (``inf`` at the root) and own
    variance; ``up``: this level's upward pass): ``(estimate, variance, outside)`` of the level."""
    p = parents
    Vu = up_parent.V[p]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(Vu > 0, up.a / Vu, 0.0)
    est = up.z + share * (est_parent - up_parent.Z)[p]
    with np.errstate(divide="ignore", invalid="ignore"):
        w = 1.0 / (_inv(outside_parent) + _inv(own_var_parent))  # u's estimate from outside its children's subtrees
        o = w[p] + np.maximum(Vu - up.a, 0.0)
        vc = 1.0 / (_inv(up.a) + _inv(o))
    vc = np.where(up.a == 0, 0.0, vc)
    return est, vc, o


def check_inputs(h: Hierarchy, own: list[np.ndarray], own_var: list[np.ndarray]) -> None:
    """Shapes and variances of :func:`hierarchy_gls`'s inputs (raises :class:`ShapeError` /
    :class:`SparseDPError`)."""
    D = h.depth
    if len(own) != D + 1 or len(own_var) != D + 1:
        raise ShapeError("one estimate array and one variance array per level")
    k = own[0].shape[1]
    for d in range(D + 1):
        if own[d].shape != (h.sizes[d], k) or own_var[d].shape != (h.sizes[d], k):
            raise ShapeError(f"level {d}: estimates and variances must have shape {(h.sizes[d], k)}")
        if np.any(np.isnan(own_var[d])) or np.any(own_var[d] < 0):
            raise SparseDPError("variances must be >= 0 (inf: not measured)")


def hierarchy_gls(h: Hierarchy, own: list[np.ndarray], own_var: list[np.ndarray]) -> HierarchyGLS:
    """The GLS estimate and its exact variances at every level (module docstring).

    ``own[d]``, ``own_var[d]``: ``(units of level d, k)`` estimates and their variances (``0``:
    exact, ``inf``: none; ``own`` is ignored where the variance is infinite).  Every leaf needs a
    finite variance in every column; raises :class:`~sparsedp.errors.SparseDPError` otherwise."""
    check_inputs(h, own, own_var)
    D = h.depth
    ups: list[Upward] = [None] * (D + 1)  # type: ignore[list-item]
    child = None
    for d in range(D, -1, -1):
        child = ups[d] = upward_level(h, d, own[d], own_var[d], child)
    est: list[np.ndarray] = [ups[0].z]
    var: list[np.ndarray] = [ups[0].a]
    outside = np.full_like(ups[0].a, np.inf)  # o_u of the current parent level
    for d in range(1, D + 1):
        e, v, outside = downward_level(h.parents[d], ups[d - 1], est[d - 1], outside, own_var[d - 1], ups[d])
        est.append(e)
        var.append(v)
    return HierarchyGLS(tuple(est), tuple(var))
