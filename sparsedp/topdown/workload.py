"""What a TopDown release is for (the workload) and what each level may measure (the strategy).

A **workload** says, per geographic level, which marginals of the cells users will read and how
much each matters: ``{"cells": 1, "total": 1}`` (the default: every unit's cells and its
population, both weighted), ``{"total": 1}`` (totals first), ``{"age+race": 2, "race": 1}``, ...
-- one mapping for every level, or a list of them, one per level (root first).  It is public and
costs nothing: the design (:func:`sparsedp.topdown.design.plan_topdown`) chooses from it, without
any data, what each level measures and with how much of the budget.

A **strategy query** of a level is either a marginal of the cells (``"cells"``, ``"total"``,
``"age"``, ...: ``Q_S x`` for each unit) or a **residual** (``"residual:age+race"``): the basis
components of the cells whose contrast set is exactly ``S`` (:meth:`CellDomain.component_attributes`;
the orthonormal Helmert-Kronecker rows of :meth:`CellDomain.basis`).  Residuals are the strategy
family of McKenna, Mullins, Sheldon and Miklau's ResidualPlanner (NeurIPS 2023): a marginal on
``S`` sees exactly the residuals on the subsets of ``S``, so measuring each residual with its own
noise scale is the most general marginal strategy for Gaussian noise at the same cost per unit of
information (one cell moves the residual on ``S`` by ``sqrt(m_S / C)`` in L2, ``m_S`` its rows,
``C`` the cells: the rows of the whole basis add up to one, as for the cells' histogram).

The expected error of a marginal cell from per-component GLS variances ``v_k`` is
``Var = sum_k v_k (Q_S B^T)_{mk}^2`` (:func:`marginal_mix`): the design's error model evaluates
every workload marginal at every level from that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import ShapeError
from .hierarchy import CellDomain

__all__ = ["Residual", "query_key", "query_name", "key_axes", "parse_queries", "parse_workload",
           "marginal_mix", "DEFAULT_WORKLOAD"]

#: the default workload of every level: each unit's cells and its total, equally weighted
DEFAULT_WORKLOAD: Mapping[str, float] = {"cells": 1.0, "total": 1.0}

_RESIDUAL = "residual:"


@dataclass(frozen=True)
class Residual:
    """The strategy query that measures the basis components whose contrast set is ``axes``."""

    axes: tuple[int, ...]


Key = Any  # tuple[int, ...] (a marginal) or Residual


def key_axes(key: Key) -> tuple[int, ...]:
    """The attributes a strategy query involves (a marginal's kept axes, a residual's contrast set)."""
    return key.axes if isinstance(key, Residual) else tuple(key)


def query_key(cells: CellDomain, spec: Any) -> Key:
    """A strategy query from its name: a marginal (``"cells"``, ``"total"``, ``"age+race"``, axes)
    or ``"residual:S"`` (``"residual:total"`` is the constant component)."""
    if isinstance(spec, Residual):
        return Residual(cells.axes(list(spec.axes)) if spec.axes else ())
    if isinstance(spec, str) and spec.startswith(_RESIDUAL):
        rest = spec[len(_RESIDUAL):]
        return Residual(() if rest == "total" else cells.axes(rest))
    return cells.axes(spec)


def query_name(cells: CellDomain, key: Key) -> str:
    """The name :func:`query_key` reads back (``"residual:age+race"`` spells out every attribute)."""
    if isinstance(key, Residual):
        return _RESIDUAL + ("+".join(cells.names[i] for i in key.axes) if key.axes else "total")
    return cells.marginal_name(key)


def _one(cells: CellDomain, q: Any, keys: bool) -> list[tuple[Key, Any]]:
    if q is None:
        return [(cells.axes("cells"), 1)]
    if isinstance(q, str):
        q = [q]
    items = list(q.items()) if isinstance(q, Mapping) else [(m, 1) for m in q]
    out: list[tuple[Key, Any]] = []
    for m, w in items:
        k = query_key(cells, m) if keys else cells.axes(m)
        if any(k == a for a, _ in out):
            raise ShapeError(f"the query {query_name(cells, k)!r} is listed twice")
        out.append((k, w))
    if not out:
        raise ShapeError("a level's query list is empty (give it a zero budget to skip it)")
    return out


def _per_level(spec: Any, levels: int) -> bool:
    return isinstance(spec, (list, tuple)) and len(spec) == levels and bool(spec) and all(
        s is None or isinstance(s, (Mapping, list, tuple)) for s in spec)


def parse_queries(cells: CellDomain, spec: Any, levels: int) -> list[list[tuple[Key, Any]]]:
    """Per level, ``[(key, weight)]`` of a strategy: ``None`` (the cells), a mapping ``{query:
    weight}`` or a sequence of queries (equal weights) for every level, or a list of those, one per
    level; a query is a marginal or a residual (:func:`query_key`)."""
    if _per_level(spec, levels):
        return [_one(cells, s, True) for s in spec]
    return [_one(cells, spec, True)] * levels


def parse_workload(cells: CellDomain, spec: Any, levels: int) -> list[list[tuple[tuple[int, ...], float]]]:
    """Per level, ``[(marginal axes, weight)]`` of a workload (module docstring): ``None`` (the
    default, :data:`DEFAULT_WORKLOAD`), a mapping ``{marginal: weight}`` or a list of marginals for
    every level, or a list of those, one per level.  Weights are finite numbers ``>= 0`` and not all
    0 (a level may have weight 0 everywhere: nobody reads it)."""
    if spec is None:
        spec = DEFAULT_WORKLOAD
    per = [_one(cells, s if s is not None else DEFAULT_WORKLOAD, False) for s in spec] if _per_level(spec, levels) \
        else [_one(cells, spec, False)] * levels
    out = []
    total = 0.0
    for lev in per:
        row = []
        for ax, w in lev:
            if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(float(w)) or float(w) < 0:
                raise ShapeError(f"workload weights must be finite numbers >= 0, got {w!r}")
            row.append((ax, float(w)))
            total += float(w)
        out.append(row)
    if total <= 0:
        raise ShapeError("the workload's weights add up to 0")
    return out


def marginal_mix(cells: CellDomain, basis: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """``(components, marginal cells)``: ``(Q_S B^T)^T`` squared, entry ``[k, m]`` the weight of
    component ``k``'s variance in the variance of marginal cell ``m`` (``Var = sum_k v_k M[k, m]``
    for independent per-component errors ``v_k``; the cells: ``B^2``; the total: ``C`` on the
    constant component)."""
    QBt = cells.marginal(np.asarray(basis, dtype=np.float64), axes)
    return QBt * QBt
