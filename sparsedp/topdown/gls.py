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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError, SparseDPError
from .hierarchy import Hierarchy

__all__ = ["HierarchyGLS", "hierarchy_gls"]


@dataclass(frozen=True)
class HierarchyGLS:
    """Per level ``d``: ``estimate[d]`` and ``variance[d]`` (``(units, columns)``), consistent
    (every parent equals the sum of its children, up to float rounding)."""

    estimate: tuple[np.ndarray, ...]
    variance: tuple[np.ndarray, ...]


def _inv(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return 1.0 / v


def hierarchy_gls(h: Hierarchy, own: list[np.ndarray], own_var: list[np.ndarray]) -> HierarchyGLS:
    """The GLS estimate and its exact variances at every level (module docstring).

    ``own[d]``, ``own_var[d]``: ``(units of level d, k)`` estimates and their variances (``0``:
    exact, ``inf``: none; ``own`` is ignored where the variance is infinite).  Every leaf needs a
    finite variance in every column; raises :class:`~sparsedp.errors.SparseDPError` otherwise."""
    D = h.depth
    if len(own) != D + 1 or len(own_var) != D + 1:
        raise ShapeError("one estimate array and one variance array per level")
    k = own[0].shape[1]
    for d in range(D + 1):
        if own[d].shape != (h.sizes[d], k) or own_var[d].shape != (h.sizes[d], k):
            raise ShapeError(f"level {d}: estimates and variances must have shape {(h.sizes[d], k)}")
        if np.any(np.isnan(own_var[d])) or np.any(own_var[d] < 0):
            raise SparseDPError("variances must be >= 0 (inf: not measured)")
    z: list[np.ndarray] = [np.empty(0)] * (D + 1)
    a: list[np.ndarray] = [np.empty(0)] * (D + 1)
    Zc: list[np.ndarray] = [np.empty(0)] * (D + 1)
    Vc: list[np.ndarray] = [np.empty(0)] * (D + 1)
    for d in range(D, -1, -1):
        v = own_var[d]
        y = np.where(np.isinf(v), 0.0, own[d])
        leaf = h.leaves(d)
        if np.any(np.isinf(v[leaf])):
            raise SparseDPError(f"a leaf of level {h.levels[d]!r} has a component that is neither measured nor "
                                "invariant: its estimate is undetermined (measure the cells at that level)")
        if d < D:
            Z = h.children_sum(d, z[d + 1])
            V = h.children_sum(d, a[d + 1])
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
        z[d], a[d], Zc[d], Vc[d] = zz, av, Z, V
    est: list[np.ndarray] = [z[0]]
    var: list[np.ndarray] = [a[0]]
    outside = np.full_like(a[0], np.inf)  # o_u of the current parent level
    for d in range(1, D + 1):
        p = h.parents[d]
        Vu = Vc[d - 1][p]
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(Vu > 0, a[d] / Vu, 0.0)
        est.append(z[d] + share * (est[d - 1] - Zc[d - 1])[p])
        with np.errstate(divide="ignore", invalid="ignore"):
            w = 1.0 / (_inv(outside) + _inv(own_var[d - 1]))  # u's estimate from outside its children's subtrees
            o = w[p] + np.maximum(Vu - a[d], 0.0)
            vc = 1.0 / (_inv(a[d]) + _inv(o))
        vc = np.where(a[d] == 0, 0.0, vc)
        var.append(vc)
        outside = o
    return HierarchyGLS(tuple(est), tuple(var))
