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


# -- the variances alone, on the hierarchy's shape classes --------------------------------------------

@dataclass(frozen=True)
class ShapeClasses:
    """The hierarchy compressed for variances (public: its shape only).  When every unit of a level
    has the same own variances, the GLS variance of a unit depends only on the shape of its subtree
    (its **class**) and on the classes along its path from the root and their siblings' (its
    **context**).  Per level ``d``: ``weight[d]`` (units of the hierarchy per context),
    ``parent[d]`` (the parent context), ``kind[d]`` (the context's class), and per class
    ``leaf[d]``, ``edges[d]`` (CSR over child classes: ``ptr``, ``child`` class, ``mult`` children of
    that class per unit).  On the census VTD table: 160,245 units, a few thousand contexts."""

    leaf: tuple[np.ndarray, ...]
    ptr: tuple[np.ndarray, ...]
    child: tuple[np.ndarray, ...]
    mult: tuple[np.ndarray, ...]
    weight: tuple[np.ndarray, ...]
    parent: tuple[np.ndarray, ...]
    kind: tuple[np.ndarray, ...]

    @property
    def contexts(self) -> int:
        return int(sum(w.size for w in self.weight))


def shape_classes(h: Hierarchy) -> ShapeClasses:
    """:class:`ShapeClasses` of ``h``: classes bottom-up (a unit's class is its leaf flag and the
    multiset of its children's classes, identified by two independent 64-bit sums of fixed random
    keys per child class -- a collision needs two different multisets to agree on 128 bits), then
    contexts top-down (one per parent context and child class).  Computed once per hierarchy
    (cached on it: the shape is immutable)."""
    if "shape_classes" not in h._cache:
        h._cache["shape_classes"] = _shape_classes(h)
    return h._cache["shape_classes"]


def _shape_classes(h: Hierarchy) -> ShapeClasses:
    D = h.depth
    keys = np.random.default_rng(0x5eed).integers(1, 2**63 - 1, size=(2, h.units + 2), dtype=np.int64).view(np.uint64)
    cls: list[np.ndarray] = [None] * (D + 1)  # type: ignore[list-item]
    leaf, ptr, child, mult = [None] * (D + 1), [None] * (D + 1), [None] * (D + 1), [None] * (D + 1)
    cls[D] = np.zeros(h.sizes[D], dtype=np.int64)
    leaf[D], ptr[D] = np.ones(1, dtype=bool), np.zeros(2, dtype=np.int64)
    child[D], mult[D] = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    for d in range(D - 1, -1, -1):
        cc = cls[d + 1]
        n = h.sizes[d]
        with np.errstate(over="ignore"):
            sig = np.zeros((n, 2), dtype=np.uint64)
            for j in range(2):
                np.add.at(sig[:, j], h.parents[d + 1], keys[j, cc])
        sig = np.column_stack([sig.view(np.int64), h.leaves(d).astype(np.int64)])
        _, first, inv = np.unique(sig, axis=0, return_index=True, return_inverse=True)
        cls[d] = np.asarray(inv).reshape(-1).astype(np.int64)
        k = first.size
        leaf[d] = h.leaves(d)[first]
        # per class, its representative's children classes and their multiplicities
        ip = h.indptr(d)
        pairs = np.column_stack([np.repeat(np.arange(k), ip[first + 1] - ip[first]),
                                 np.concatenate([cc[ip[u]:ip[u + 1]] for u in first]) if k else np.zeros(0, np.int64)])
        up, cnt = np.unique(pairs, axis=0, return_counts=True) if pairs.size else (np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
        ptr[d] = np.searchsorted(up[:, 0], np.arange(k + 1)).astype(np.int64)
        child[d], mult[d] = up[:, 1].astype(np.int64), cnt.astype(np.int64)
    weight, parent, kind = [np.ones(1, dtype=np.int64)], [np.array([-1], dtype=np.int64)], [cls[0][:1].copy()]
    for d in range(D):
        k = kind[d]
        lo, hi = ptr[d][k], ptr[d][k + 1]
        n_e = hi - lo
        par = np.repeat(np.arange(k.size), n_e)
        e = np.arange(int(n_e.sum())) - np.repeat(np.cumsum(n_e) - n_e, n_e) + np.repeat(lo, n_e)
        kind.append(child[d][e])
        parent.append(par)
        weight.append(weight[d][par] * mult[d][e])
    return ShapeClasses(tuple(leaf), tuple(ptr), tuple(child), tuple(mult), tuple(weight), tuple(parent), tuple(kind))


def class_variances(sc: ShapeClasses, own_var: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Per level, the ``(contexts, columns)`` GLS variances when every unit of level ``d`` has own
    variances ``own_var[d]`` (``(columns,)``; 0 exact, ``inf`` none): those of
    :func:`hierarchy_gls`, one row per context (weights: ``sc.weight``)."""
    D = len(sc.leaf) - 1
    k = own_var[0].size
    a: list[np.ndarray] = [None] * (D + 1)  # type: ignore[list-item]
    V: list[np.ndarray] = [None] * (D + 1)  # type: ignore[list-item]
    for d in range(D, -1, -1):
        n = sc.leaf[d].size
        Vd = np.full((n, k), np.inf)
        if d < D:
            owner = np.repeat(np.arange(n), np.diff(sc.ptr[d]))
            s = np.zeros((n, k))
            np.add.at(s, owner, sc.mult[d][:, None] * a[d + 1][sc.child[d]])
            has = np.diff(sc.ptr[d]) > 0
            Vd[has] = s[has]
        v = np.broadcast_to(own_var[d], (n, k))
        if np.any(np.isinf(v[sc.leaf[d]])):
            raise SparseDPError("a leaf has a component that is neither measured nor invariant")
        with np.errstate(divide="ignore", invalid="ignore"):
            ad = 1.0 / (_inv(v) + _inv(Vd))
        a[d] = np.where((v == 0) | (Vd == 0), 0.0, ad)
        V[d] = Vd
    var = [a[0][sc.kind[0]]]
    outside = np.full((1, k), np.inf)
    for d in range(1, D + 1):
        p = sc.parent[d]
        kp = sc.kind[d - 1][p]
        ac = a[d][sc.kind[d]]
        Vu = V[d - 1][kp]
        with np.errstate(divide="ignore", invalid="ignore"):
            w = 1.0 / (_inv(outside) + _inv(np.broadcast_to(own_var[d - 1], outside.shape)))
            o = w[p] + np.maximum(Vu - ac, 0.0)
            vc = 1.0 / (_inv(ac) + _inv(o))
        var.append(np.where(ac == 0, 0.0, vc))
        outside = o
    return tuple(var)
