"""Seed 002's restaurant: five items sold only in three combos, released per day in binary trees.

Items (cola, burger, wings, fries, nuggets); combos ``[2,1,1,0,1]``, ``[0,2,2,1,0]``,
``[1,1,0,1,1]``.  Each item's daily sales are released as a binary tree over the ``T`` days
(:func:`sparsedp.strategies.hierarchical`, ``h`` levels).  The released vector is node-major:
``x.reshape(nodes, 5)[u, i]`` is item ``i`` at tree node ``u`` (strategy row order, root first).

Privacy (event level, one order).  One order adds one combo ``c`` to one day; every item ``i``
changes by ``c_i`` at that day's leaf and at all its ``h - 1`` ancestors, so the tree-measurement
vector changes by ``h ||c||_1 <= 5 h`` in L1.  Laplace noise of scale ``b = 5 h / epsilon`` on every
node of every item tree is therefore ``epsilon``-DP (``Delta_1 = 5 h``, seed 002 sec. 7:
``Delta_1 = c h``).  Making the release consistent is post-processing and costs no privacy.

Consistency.  Two families: each item's tree (parent = sum of children) and the combos (every day's
5-vector lies in the span of the combos, ``B v_t = 0``).  ``combos_at="leaves"`` (default) is the
seed's ``T + 5`` sub-problems; ``combos_at="nodes"`` also imposes the (implied, redundant) combo
constraint at every internal node: the feasible set and the answer are the same.  ``solve``'s
``auto`` recognises either as trees x span (:mod:`.treespan`) and solves it exactly in O(T) for
any variances.  With redundant rows at the internal nodes a float64 vector cannot satisfy both the
sums and the combos there to better than the rounding of node values (~1e-7 at T = 2^20), so the
leaves formulation is the one whose residual reaches 1e-8 at the largest sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import ShapeError
from ..noise import as_generator, laplace
from ..privacy import Accountant, PrivacyCost
from ..strategies import TreeLayout
from ..validation import check_positive
from ..workloads import _check_n
from .families import ConstraintFamily, SpanConstraints, TreeConstraints
from .solvers import ConsistencyResult, solve

__all__ = [
    "ITEMS",
    "COMBOS",
    "RestaurantSales",
    "RestaurantRelease",
    "restaurant",
    "restaurant_layout",
    "restaurant_tree_values",
    "restaurant_constraints",
    "restaurant_sensitivity",
    "restaurant_release",
]

ITEMS = ("cola", "burger", "wings", "fries", "nuggets")
COMBOS = np.array([[2, 1, 1, 0, 1], [0, 2, 2, 1, 0], [1, 1, 0, 1, 1]], dtype=np.int64)
MEAN_ORDERS = (40.0, 25.0, 30.0)


@dataclass(frozen=True)
class RestaurantSales:
    """``orders[t, k]``: combos ``k`` sold on day ``t``; ``sales[t, i] = (orders @ COMBOS)[t, i]``."""

    orders: np.ndarray
    sales: np.ndarray

    @property
    def days(self) -> int:
        return int(self.sales.shape[0])


def restaurant(days: int, seed: Any = None, mean_orders: tuple[float, float, float] = MEAN_ORDERS) -> RestaurantSales:
    """Synthetic sales: ``orders[t, k] ~ Poisson(mean_orders[k])`` independently; true item sales."""
    days = _check_n(days)
    lam = np.asarray(mean_orders, dtype=np.float64)
    if lam.shape != (3,) or np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ShapeError("mean_orders must be three finite non-negative numbers")
    orders = as_generator(seed).poisson(lam, size=(days, 3)).astype(np.int64)
    return RestaurantSales(orders=orders, sales=orders @ COMBOS)


def restaurant_layout(days: int) -> TreeLayout:
    """The binary tree over the days (the same for every item)."""
    return TreeLayout.balanced(_check_n(days), 2)


def restaurant_tree_values(sales: np.ndarray, layout: TreeLayout) -> np.ndarray:
    """Exact tree-node values of every item, node-major and flattened: ``(A sales).ravel()``."""
    return np.asarray(layout.matrix() @ np.asarray(sales, dtype=np.float64)).ravel()


def restaurant_constraints(
    days: int, combos_at: str = "leaves", chunks: int = 1, per_item: bool = False
) -> list[ConstraintFamily]:
    """The item trees and the combo span constraints (``combos_at`` = ``"leaves"`` or ``"nodes"``).

    The five trees are one family projected together (``per_item=False``: one vectorised two-pass
    for all items) or five families, one block each (``per_item=True``: the seed's five parallel
    sub-problems, e.g. for an executor).
    """
    layout = restaurant_layout(days)
    p = len(ITEMS)
    node = np.arange(layout.nodes)
    if per_item:
        trees: list[ConstraintFamily] = [
            TreeConstraints(layout, index=node * p + i, name=f"tree[{item}]") for i, item in enumerate(ITEMS)
        ]
    else:
        trees = [TreeConstraints(layout, index=node[:, None] * p + np.arange(p), name="item trees")]
    if combos_at == "leaves":
        at = layout.row_offsets[0] + np.arange(layout.n)
    elif combos_at == "nodes":
        at = node
    else:
        raise ShapeError(f"combos_at must be 'leaves' or 'nodes', got {combos_at!r}")
    groups = at[:, None] * p + np.arange(p)
    return trees + [SpanConstraints(COMBOS.T.astype(float), groups, name="combos", chunks=chunks)]


def restaurant_sensitivity(layout: TreeLayout) -> float:
    """``Delta_1 = h max_k ||c_k||_1 = 5 h``: one order moves every level of every item's tree."""
    return float(layout.levels * COMBOS.sum(axis=1).max())


@dataclass(frozen=True)
class RestaurantRelease:
    """A consistent DP release of the restaurant's item trees (vectors node-major, length 5 x nodes)."""

    sales: RestaurantSales
    layout: TreeLayout
    truth: np.ndarray
    noisy: np.ndarray
    result: ConsistencyResult
    epsilon: float
    sensitivity: float
    scale: float
    rmse_noisy: float
    rmse_consistent: float

    @property
    def x(self) -> np.ndarray:
        return self.result.x


def restaurant_release(
    days: int | None = None,
    epsilon: float = 1.0,
    method: str = "auto",
    seed: Any = None,
    sales: RestaurantSales | None = None,
    combos_at: str = "leaves",
    tol: float = 1e-10,
    max_sweeps: int = 100_000,
    executor: Any = None,
    accountant: Accountant | None = None,
    callback: Callable[[int, np.ndarray, float], Any] | None = None,
) -> RestaurantRelease:
    """Measure every item tree with ``Lap(5 h / epsilon)`` noise and make it consistent.

    ``sales`` (from :func:`restaurant`) or ``days`` (then ``restaurant(days, seed)``).  ``seed``
    drives both the data and the noise (reproducible, not secure).  The budget is checked and spent
    on ``accountant`` (if given) before any noise is drawn.
    """
    eps = check_positive(epsilon, "epsilon")
    if sales is None and days is None:
        raise ShapeError("give days or sales")
    T = sales.days if sales is not None else _check_n(days)
    layout = restaurant_layout(T)
    constraints = restaurant_constraints(T, combos_at)
    delta = restaurant_sensitivity(layout)
    scale = delta / eps
    if accountant is not None:  # every check is done: spend, then draw
        accountant.spend(PrivacyCost(epsilon=eps), label=f"restaurant({T} days)")
    rng = as_generator(seed)
    if sales is None:
        sales = restaurant(T, rng)
    truth = restaurant_tree_values(sales.sales, layout)
    noisy = truth + laplace(scale, truth.size, rng)
    res = solve(
        noisy, constraints, method=method, tol=tol, max_sweeps=max_sweeps, executor=executor, callback=callback, truth=truth
    )
    rmse = lambda a: float(np.sqrt(np.mean((a - truth) ** 2)))  # noqa: E731
    return RestaurantRelease(
        sales=sales,
        layout=layout,
        truth=truth,
        noisy=noisy,
        result=res,
        epsilon=eps,
        sensitivity=delta,
        scale=scale,
        rmse_noisy=rmse(noisy),
        rmse_consistent=rmse(res.x),
    )

