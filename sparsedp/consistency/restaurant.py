"""Seed 002's restaurant: five items sold only in three combos, released per day in binary trees.

Items (cola, burger, wings, fries, nuggets); combos ``[2,1,1,0,1]``, ``[0,2,2,1,0]``,
``[1,1,0,1,1]``.  Each item's daily sales are released as a binary tree over the ``T`` days
(:func:`sparsedp.strategies.hierarchical`, ``h`` levels).  The released vector is node-major:
``x.reshape(nodes, 5)[u, i]`` is item ``i`` at tree node ``u`` (strategy row order, root first).

Privacy (event level, one order): one measurement path (issue 13).  The data are the orders
``orders[t, k]`` (combo ``k`` on day ``t``); the release measures the item sales ``s = orders @
COMBOS`` per tree node through :func:`sparsedp.measure.plan_measurement` (``.measure``), which
validates, charges the accountant (with a ledger entry), then draws -- nothing here calls a noise
sampler.  What is measured is ``A_items s`` with ``s`` the item-major sales vector
(``s[i T + t]`` = item ``i`` on day ``t``) and ``A_items = IntervalRows`` with one row per (tree
node ``u``, item ``i``), node-major, ``1`` on ``[i T + lo_u, i T + hi_u)`` -- the same matrix as
``A (x) I_5`` up to the order of its columns (``A`` the tree's node x day matrix), computed by
prefix sums in ``O(T)`` memory, never formed.  Its ``Delta_1`` is the exact integer coverage ``h``
(every item-day lies in one node per level).  One order adds one combo ``c_k`` to one day, so it
changes ``s`` by a vector of L1 norm ``||c_k||_1 <= 5`` (:data:`ORDER_L1` ``= max_k ||c_k||_1``):
the plan's ``unit = 5`` gives ``Delta_1 = 5 h`` (seed 002 sec. 7: ``Delta_1 = c h``), the same as
the orders' map ``A (x) COMBOS^T`` (:func:`restaurant_sensitivity`, checked against its explicit
entries in the tests), and the scale ``b = 5 h / epsilon`` rounded up on every node of every item
tree.  The bound is enforced on the data, not promised: given ``sales`` must equal ``orders @
COMBOS`` for non-negative integer orders (:func:`check_sales`), and every tree node must be at most
``2^50`` (:data:`~sparsedp.validation.MAX_MAGNITUDE`); all of it is checked before the budget is
charged.  Noise is exact discrete Laplace by default (``secure=True``: the counts are integers, so
the grid is exact and the noisy node values are integers); ``secure=False`` draws float64 Laplace
noise, which leaks through its low bits (Mironov, CCS 2012), an explicit opt-out for experiments.
Making the release consistent is post-processing and costs no privacy.

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

import functools
import importlib.util
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..calibration import sensitivity_bound
from ..errors import NonFiniteInputError, ShapeError, SparseDPError
from ..executors import get_executor
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..noise import as_generator
from ..privacy import Accountant, LedgerEntry
from ..releases import ReleaseResult, register_reader
from ..strategies import TreeLayout
from ..validation import (
    MAX_MAGNITUDE,
    check_counts,
    check_epsilon,
    check_positive,
    check_vector,
)
from ..workloads import _check_n
from .families import ConstraintFamily, SpanConstraints, TreeConstraints
from .solvers import GENERIC_MAX_BYTES, METHODS, ConsistencyResult, solve

__all__ = [
    "COMBOS",
    "ITEMS",
    "ORDER_L1",
    "RestaurantRelease",
    "RestaurantSales",
    "check_sales",
    "restaurant",
    "restaurant_constraints",
    "restaurant_layout",
    "restaurant_plan",
    "restaurant_release",
    "restaurant_rows",
    "restaurant_sensitivity",
    "restaurant_tree_values",
]

ITEMS = ("cola", "burger", "wings", "fries", "nuggets")
COMBOS = np.array([[2, 1, 1, 0, 1], [0, 2, 2, 1, 0], [1, 1, 0, 1, 1]], dtype=np.int64)
MEAN_ORDERS = (40.0, 25.0, 30.0)
#: ``max_k ||c_k||_1``: the L1 change of the item sales caused by one order (5).
ORDER_L1 = int(np.abs(COMBOS).sum(axis=1).max())
#: Releases of at most this many tree nodes (``T <= 1024`` days) give their error reports a shape
#: (:meth:`RestaurantRelease.error_report`; the ``nodes x nodes`` tree projection, computed on the
#: first interval request); larger ones report the variances only (normal intervals).
SHAPE_NODES = 2048
#: Up to this many released values the shape is that of the explicit projection (lattice included).
_KRON_VALUES = 1024


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
    """Exact tree-node values of every item, node-major and flattened: ``(A sales).ravel()``, by
    :func:`restaurant_rows` (prefix sums) on the item-major sales."""
    items = np.ascontiguousarray(np.asarray(sales, dtype=np.float64).T).ravel()
    return restaurant_rows(layout).matvec(items)


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
    """``Delta_1`` of the map ``orders -> node-major tree values``, ``M = A (x) COMBOS^T``.

    Column ``(t, k)`` of ``M`` has L1 norm ``||A[:, t]||_1 ||c_k||_1`` (the Kronecker product's
    entries are the products), so ``Delta_1 = max_t ||A[:, t]||_1 max_k ||c_k||_1``; the first
    factor is computed from the entries of ``layout.matrix()`` (:func:`sensitivity_bound`, exact
    for this 0/1 matrix), which is ``h`` for the balanced binary tree: ``Delta_1 = 5 h``.  The
    release's plan (:func:`restaurant_plan`) reaches the same value from :func:`restaurant_rows`
    (its exact coverage ``h``) times ``unit = 5``; the tests check both against ``M``'s entries.
    """
    return float(sensitivity_bound(layout.matrix(), 1) * ORDER_L1)


def _layout_intervals(layout: TreeLayout) -> tuple[np.ndarray, np.ndarray]:
    """Every tree node's day interval ``[lo_u, hi_u)``, in strategy row order (root first)."""
    starts = [layout.leaf_starts[level] for level in reversed(range(layout.levels))]
    return np.concatenate([s[:-1] for s in starts]), np.concatenate([s[1:] for s in starts])


def restaurant_rows(layout: TreeLayout) -> IntervalRows:
    """The measured matrix: one row per (tree node ``u``, item ``i``), node-major (row
    ``5 u + i``), ``1`` on the item-major sales columns ``[i T + lo_u, i T + hi_u)``.

    Applied to ``sales.T.ravel()`` it gives the node-major tree values
    (:func:`restaurant_tree_values`) by exact int64 prefix sums, in ``O(T)`` time and memory."""
    lo, hi = _layout_intervals(layout)
    p, T = len(ITEMS), layout.n
    off = T * np.arange(p, dtype=np.int64)
    return IntervalRows(p * T, (lo[:, None] + off).ravel(), (hi[:, None] + off).ravel(),
                        name=f"restaurant item trees ({T} days)")


def restaurant_plan(layout: TreeLayout, epsilon: float, secure: bool = True) -> MeasurementPlan:
    """The calibrated measurement of the release: :func:`restaurant_rows` with ``unit = 5``
    (:data:`ORDER_L1`), ``Delta_1 = 5 h``, homoscedastic Laplace ``b = 5 h / epsilon`` rounded up
    (exact discrete Laplace unless ``secure=False``).  Nothing is charged or drawn."""
    return plan_measurement(restaurant_rows(layout), epsilon=epsilon, unit=ORDER_L1, noise="laplace",
                            secure=_check_secure(secure))


def _check_secure(secure: Any) -> bool:
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True or False, got {secure!r}")
    return bool(secure)


def check_sales(sales: RestaurantSales, days: int | None = None) -> RestaurantSales:
    """Validated int64 copies of ``sales``, or an error before anything is charged.

    ``orders``: a ``(T, 3)`` array of non-negative integers of at most ``2^50``
    (:func:`~sparsedp.validation.check_counts`); ``sales``: a ``(T, 5)`` array equal to
    ``orders @ COMBOS`` (the one-order sensitivity assumes it); ``days`` (if given) equal to ``T``.
    """
    if not isinstance(sales, RestaurantSales):
        raise ShapeError(f"sales must be a RestaurantSales (orders and item sales), got {type(sales).__name__}")
    orders = np.asarray(sales.orders)
    if orders.ndim != 2 or orders.shape[1] != COMBOS.shape[0] or orders.shape[0] < 1:
        raise ShapeError(f"sales.orders must have shape (days, {COMBOS.shape[0]}), got {orders.shape}")
    T = orders.shape[0]
    if days is not None and _check_n(days) != T:
        raise ShapeError(f"days = {days} but the sales cover {T} days")
    o = check_counts(orders.ravel(), name="orders").astype(np.int64).reshape(T, -1)
    items = np.asarray(sales.sales)
    if items.shape != (T, COMBOS.shape[1]):
        raise ShapeError(f"sales.sales must have shape ({T}, {COMBOS.shape[1]}), got {items.shape}")
    derived = o @ COMBOS  # exact: at most 4 * 2^50 < 2^63
    given = check_vector(items.ravel(), name="sales").reshape(T, -1)
    mismatch = given != derived  # derived < 2^53: exact floats, so the comparison is exact
    if np.any(mismatch):
        t = int(np.flatnonzero(mismatch.any(axis=1))[0])
        raise SparseDPError(
            f"sales differ from orders @ COMBOS on day {t}: the release measures combos of orders (one order "
            "changes at most 5 item counts), so item sales outside the combos cannot be released"
        )
    return RestaurantSales(orders=o, sales=derived)


#: The combo matrix's columns cola, fries, nuggets: ``det = 1``, so orders = sales[:, _BASIS] @ inverse.
_BASIS = np.array([0, 3, 4])
_BASIS_INV = np.rint(np.linalg.inv(COMBOS[:, _BASIS].astype(np.float64))).astype(np.int64)


def _orders_of(table: np.ndarray, name: str = "sales", first_day: int = 0) -> np.ndarray:
    """The non-negative integer orders ``o`` with ``o @ COMBOS == table`` (a ``(days, 5)`` array of
    daily item sales), or a :class:`~sparsedp.errors.SparseDPError` naming the first bad day
    (counted from ``first_day``): missing / NaN / infinite, negative, fractional or too large
    (``> 2^50``) sales, or a day that no orders of the combos produce.

    The combo matrix has full row rank and its cola, fries and nuggets columns form a unimodular
    3 x 3 matrix, so the orders are determined by a day's sales and recovered in exact integer
    arithmetic (``sales[:, [0, 3, 4]] @ inverse``)."""
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[1] != len(ITEMS):
        raise ShapeError(f"{name} must have shape (days, {len(ITEMS)}), got {table.shape}")
    if table.dtype == bool or not np.issubdtype(table.dtype, np.number) or np.issubdtype(table.dtype, np.complexfloating):
        raise SparseDPError(f"{name}: sales are not real numbers (dtype {table.dtype})")
    table = table.astype(np.float64, copy=False)
    bad = ~np.isfinite(table)
    if bad.any():
        t, i = np.argwhere(bad)[0]
        raise NonFiniteInputError(f"{name}: sales are missing, NaN or infinite (the first: day {first_day + t}, "
                                  f"{ITEMS[i]})")
    for mask, what in ((table < 0, "negative"), (table != np.floor(table), "not whole numbers"),
                       (table > MAX_MAGNITUDE, f"above 2^50 ({MAX_MAGNITUDE})")):
        if mask.any():
            t, i = np.argwhere(mask)[0]
            raise SparseDPError(f"{name}: sales are {what} (the first: day {first_day + t}, {ITEMS[i]}); sales are "
                                "counts of items sold")  # where, never the value: the data are private
    sales = table.astype(np.int64)
    orders = sales[:, _BASIS] @ _BASIS_INV  # exact: |entries| <= 2^50 times small integers
    off = np.any(orders @ COMBOS != sales, axis=1)
    if off.any():
        t = int(np.flatnonzero(off)[0])
        raise SparseDPError(
            f"{name}: the sales of day {first_day + t} (the first such day) are not a combination of the combos "
            f"{COMBOS.tolist()}; the release protects one order of one combo, so items sold outside the combos cannot "
            "be released")
    neg = np.any(orders < 0, axis=1)
    if neg.any():
        t = int(np.flatnonzero(neg)[0])
        raise SparseDPError(
            f"{name}: the sales of day {first_day + t} (the first such day) would need a negative number of orders "
            f"of a combo; no orders of the combos {COMBOS.tolist()} produce them")
    return orders


@dataclass(frozen=True)
class RestaurantRelease:
    """A consistent DP release of the restaurant's item trees (vectors node-major, length 5 x nodes).

    Only ``x`` (and ``noisy``) are the release.  ``sales`` and ``truth`` (the exact node values,
    computed on first use) are the data, and ``rmse_noisy`` / ``rmse_consistent`` (``None`` unless
    ``evaluate=True``) compare the release with them: evaluation only, not private.  ``scale`` is
    the Laplace scale of every measured value (data units), ``variance`` its actual noise variance
    (the exact discrete-Laplace variance when ``secure``); ``private`` is ``False`` when the noise
    came from a seed; ``ledger`` is the measurement's :class:`~sparsedp.privacy.LedgerEntry`.
    """

    sales: RestaurantSales
    layout: TreeLayout
    noisy: np.ndarray
    result: ConsistencyResult
    epsilon: float
    sensitivity: float
    scale: float
    rmse_noisy: float | None
    rmse_consistent: float | None
    secure: bool = True
    private: bool = True
    variance: float = float("nan")
    ledger: LedgerEntry | None = field(default=None, compare=False)  # the measurement's ledger entry
    _truth: np.ndarray | None = field(default=None, repr=False, compare=False)

    def to_release(self, *, description: dict | None = None, private: bool | None = None) -> Any:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: every consistent value
        (node-major, 5 items per node) labelled by its node's days ``lo`` .. ``hi`` (inclusive) and
        its ``item``, with its exact variance (:meth:`variances`) and the ledger entry.  ``private``
        overrides the flag (an evaluation, or a command's own reasons); evaluation numbers are
        never part of it."""
        desc = {"days": int(self.layout.n), "epsilon": self.epsilon, "sensitivity": self.sensitivity,
                "laplace_scale": self.scale, "secure": self.secure, "method": self.result.method,
                "noise_variance": self.variance}
        desc.update(description or {})
        if private is None:
            private = self.private and self.rmse_noisy is None  # evaluation numbers are not private
        return restaurant_result(self.result.x, int(self.layout.n), self.variance, kind="restaurant",
                                 ledger=[self.ledger] if self.ledger else [], private=private, description=desc,
                                 noise="laplace", secure=bool(self.secure), source=self)

    def save(self, path: Any, description: dict | None = None, *, overwrite: bool = False) -> Any:
        """Write the consistent release (node-major, 5 items per node) with its labels and exact
        variances, the noisy counts' variance and the ledger as a release file (:meth:`to_release`
        saved by :meth:`sparsedp.releases.ReleaseResult.save`; never the sales).  An existing file
        is replaced only with ``overwrite=True``."""
        return self.to_release(description=description).save(path, overwrite=overwrite)

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """One row per (node, item) value (:meth:`sparsedp.releases.ReleaseResult.to_pandas`)."""
        return self.to_release().to_pandas(level, method)

    @property
    def x(self) -> np.ndarray:
        return self.result.x

    # -- per-answer accuracy (issue 20) --------------------------------------------------------
    def variances(self) -> np.ndarray:
        """Exact variance of every released value (node-major, like :attr:`x`).

        Every measured value has the same noise variance ``v`` (:attr:`variance`), so the consistent
        release is the orthogonal projection ``P`` of the noisy values onto the feasible subspace
        ``{(A (x) K) c}`` (``A`` the tree's node x day matrix, ``K = COMBOS^T``: each day's five
        items a combination of the combos) and ``Cov(x) = v P`` with the Kronecker form
        ``P = A (A^T A)^-1 A^T (x) K (K^T K)^-1 K^T``.  Its diagonal is the product of the tree
        BLUE's node variances at unit noise (:class:`~sparsedp.range_variance.TreeCovariance`,
        ``O(T)``) and the leverages of the combo span; no matrix is formed.  Exact for the
        projection; the solver's result matches it to its residual."""
        return _value_variances(self.layout, self.variance)

    def error_report(self) -> Any:
        """:meth:`variances` as an :class:`~sparsedp.accuracy.ErrorReport` (``total``, ``variances``,
        ``confidence_intervals(answers, level)``; Laplace noise, ``secure`` as measured).  For at
        most :data:`SHAPE_NODES` tree nodes it carries the error's shape (computed on the first
        interval request): the error is ``P z`` with the projection ``P = P_tree (x) P_span``
        (:meth:`variances`) and the measured noise ``z`` (homoscedastic, scale :attr:`scale`), so
        the default intervals are ``"accurate"`` (variance-gamma with each value's exact kurtosis;
        :mod:`sparsedp.accuracy`); beyond, ``"normal"``."""
        from ..accuracy import ErrorReport

        var = self.variances()
        total = float(var.sum())
        shape = None
        if self.layout.nodes <= SHAPE_NODES and np.isfinite(self.scale) and self.scale > 0:
            shape = functools.partial(_projection_shape, self.layout, float(self.variance), float(self.scale),
                                      bool(self.secure), var)
        return ErrorReport(total, total / var.size, "exact-tree-span", variances=var, noise="laplace",
                           secure=bool(self.secure), shape=shape)

    def confidence_intervals(self, level: float = 0.95, method: str = "auto") -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around every released value at confidence ``level``
        (:meth:`ErrorReport.confidence_intervals <sparsedp.accuracy.ErrorReport.confidence_intervals>`)."""
        return self.error_report().confidence_intervals(self.x, level, method)

    @property
    def truth(self) -> np.ndarray:
        """The exact node values ``(A sales).ravel()`` (the data; for evaluation only)."""
        if self._truth is None:
            object.__setattr__(self, "_truth", restaurant_tree_values(self.sales.sales, self.layout))
        assert self._truth is not None
        return self._truth


def restaurant_result(x: np.ndarray, days: int, variance: float | None, **fields: Any) -> Any:
    """The :class:`~sparsedp.releases.ReleaseResult` of a restaurant release's consistent values
    ``x`` (node-major, 5 items per node) over ``days`` days with noise ``variance`` per measured
    value: labels ``lo`` / ``hi`` (the node's days, inclusive) and ``item``, exact variances
    (``None`` when the variance is unknown); ``fields``: the other fields."""
    layout = restaurant_layout(days)
    lo, hi = _layout_intervals(layout)
    p = len(ITEMS)
    if np.asarray(x).size != p * lo.size:
        raise SparseDPError(f"{np.asarray(x).size} values for a restaurant release of {days} days ({p * lo.size})")
    labels = {"lo": np.repeat(lo, p), "hi": np.repeat(hi - 1, p), "item": np.tile(np.array(ITEMS), lo.size)}
    try:
        var, how = _value_variances(layout, float("nan") if variance is None else float(variance)), "exact-tree-span"
    except SparseDPError as exc:
        var, how = None, f"unavailable: {exc}"
    fields.setdefault("strategy", f"item trees over {days} days (binary, {layout.nodes} nodes) x combo span")
    return ReleaseResult(answers=x, labels=labels, variances=var, variance_method=how,
                         arrays=fields.pop("arrays", None) or {"x": x}, **fields)


def _value_variances(layout: TreeLayout, variance: float) -> np.ndarray:
    """``diag(v P_tree (x) P_span)`` node-major (see :meth:`RestaurantRelease.variances`)."""
    from ..range_variance import TreeCovariance

    if not np.isfinite(variance) or variance <= 0:
        raise SparseDPError(f"the release's noise variance is unknown or not positive ({variance!r})")
    lo, hi = _layout_intervals(layout)
    tree = TreeCovariance(layout, np.ones(layout.nodes)).ranges(lo, hi)
    Q, _ = np.linalg.qr(COMBOS.T.astype(np.float64))  # orthonormal basis of the combos' span
    span = np.einsum("ij,ij->i", Q, Q)
    return float(variance) * np.outer(tree, span).ravel()


def _projection_shape(layout: TreeLayout, variance: float, scale: float, secure: bool, var: np.ndarray) -> Any:
    """The :class:`~sparsedp.accuracy.ErrorShape` of the consistent values (node-major): their errors
    are ``(P_tree (x) P_span) z`` with ``P_tree = A A^+`` (``A`` the tree's node x day matrix),
    ``P_span = Q Q^T`` (``Q`` an orthonormal basis of the combos' span) and ``z`` the measured noise
    (variance ``variance``, scale ``scale`` in data units, the same on every value).  Up to
    ``_KRON_VALUES`` values: :func:`~sparsedp.accuracy.error_shape` of the explicit product.  Beyond,
    its Kronecker form: with one noise law on every row, the kurtosis of value ``(u, i)`` is
    ``gamma_2 k_u k_i`` and its largest term's share ``l_u l_i``, where ``k = sum_w P_w^4 / (sum_w
    P_w^2)^2`` and ``l = max_w P_w^2 / sum_w P_w^2`` over each factor's row (no lattice)."""
    from .._tails import noise_rows
    from ..accuracy import ErrorShape, error_shape

    lo, hi = _layout_intervals(layout)
    A = np.zeros((layout.nodes, layout.n))
    lengths = hi - lo
    cols = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths - lo, lengths)
    A[np.repeat(np.arange(layout.nodes), lengths), cols] = 1.0
    Pt = A @ np.linalg.pinv(A)
    Q, _ = np.linalg.qr(COMBOS.T.astype(np.float64))
    Pk = Q @ Q.T
    if len(ITEMS) * layout.nodes <= _KRON_VALUES:
        return error_shape(np.kron(Pt, Pk), "laplace", secure=secure, variances=variance, scales=scale,
                           answer_variances=var)
    rows = noise_rows("laplace", secure, np.array([variance]), scales=np.array([scale]))

    def factor(P: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        P2 = P * P
        s2 = P2.sum(axis=1)
        pos = s2 > 0
        d = np.where(pos, s2, 1.0)
        return np.where(pos, (P2 * P2).sum(axis=1) / (d * d), 0.0), np.where(pos, P2.max(axis=1) / d, 0.0)

    kt, lt = factor(Pt)
    kk, lk = factor(Pk)
    return ErrorShape(kurtosis=float(rows.gamma2[0]) * np.outer(kt, kk).ravel(), lead=np.outer(lt, lk).ravel(),
                      unit=float(rows.unit[0]), lattice=0.0)


def _check_solver_args(method: Any, max_sweeps: Any, executor: Any, callback: Any) -> int:
    """Refuse solver arguments that would make :func:`solve` fail after the noise is drawn."""
    if not isinstance(method, str) or method not in METHODS:
        raise SparseDPError(f"unknown method {method!r}; choose one of {METHODS}")
    if isinstance(max_sweeps, (bool, np.bool_)) or not isinstance(max_sweeps, numbers.Integral) or max_sweeps < 1:
        raise SparseDPError(f"max_sweeps must be an integer >= 1, got {max_sweeps!r}")
    if executor == "dask":
        if importlib.util.find_spec("dask") is None or importlib.util.find_spec("dask.distributed") is None:
            raise SparseDPError("executor 'dask' needs dask.distributed (pip install 'sparsedp[dask]')")
    elif executor in (None, "inprocess", "threads"):
        pass
    else:
        get_executor(executor)  # an Executor or a dask Client is returned as is; anything else raises
    if callback is not None and not callable(callback):
        raise SparseDPError("callback must be callable")
    return int(max_sweeps)


def _check_generic_size(constraints: list[ConstraintFamily], n: int) -> None:
    """``generic`` refuses dense problems above ``GENERIC_MAX_BYTES`` (``8 (3 m n + min(m, n)^2)``
    bytes, as in :mod:`.solvers`): refuse them here, before the charge."""
    m = sum(int(family.rows(n)[0].shape[0]) for family in constraints)
    need = 8 * (3 * m * n + min(m, n) ** 2)
    if need > GENERIC_MAX_BYTES:
        raise SparseDPError(f"method 'generic' would need {need / 2**30:.3f} GiB of dense matrices "
                            f"(limit {GENERIC_MAX_BYTES / 2**30:g} GiB); use 'auto' or 'direct'")


def restaurant_release(
    days: int | None = None,
    epsilon: float = 1.0,
    method: str = "auto",
    seed: Any = None,
    sales: RestaurantSales | None = None,
    combos_at: str = "leaves",
    tol: float | None = None,
    max_sweeps: int = 100_000,
    executor: Any = None,
    accountant: Accountant | None = None,
    callback: Callable[[int, np.ndarray, float], Any] | None = None,
    evaluate: bool = False,
    secure: bool = True,
) -> RestaurantRelease:
    """Measure every item tree with Laplace noise of scale ``Delta_1 / epsilon`` (``Delta_1 = 5 h``)
    through the measurement path (:func:`restaurant_plan`) and make it consistent.

    ``sales`` (e.g. from :func:`restaurant`; validated by :func:`check_sales`) or ``days`` (then
    synthetic ``restaurant(days, seed)``).  ``seed`` drives the noise, and the synthetic data when
    ``sales`` is not given; ``None`` (default) is OS entropy, an int is reproducible and NOT
    private.  ``secure`` (default True): exact discrete Laplace noise (integer noisy values);
    ``secure=False``: float64 Laplace noise, an explicit opt-out for experiments.  ``evaluate=True``
    (an evaluation mode for experiments, off by default) compares the release with the truth
    (``rmse_*``, the solver's error history): those numbers are not private.  ``tol`` is passed to
    :func:`~sparsedp.consistency.solve` (``None``: its default, ``max(1e-10, the float64 floor)``).

    Order (issue 19): every input and parameter is checked (:class:`InvalidPrivacyParameterError`,
    :class:`ShapeError`, :class:`InputBoundError`, :class:`SparseDPError`), then ``accountant`` is
    charged, then noise is drawn.
    """
    eps = check_epsilon(epsilon, "epsilon")
    if sales is None and days is None:
        raise ShapeError("give days or sales")
    tol = None if tol is None else check_positive(tol, "tol")
    sweeps = _check_solver_args(method, max_sweeps, executor, callback)
    secure = _check_secure(secure)
    rng = as_generator(seed)
    if sales is not None:
        sales = check_sales(sales, days)
    T = sales.days if sales is not None else _check_n(days)
    layout = restaurant_layout(T)
    constraints = restaurant_constraints(T, combos_at)
    if method == "generic":
        _check_generic_size(constraints, len(ITEMS) * layout.nodes)
    plan = restaurant_plan(layout, eps, secure)
    if sales is None:
        if accountant is not None:
            accountant.check(plan.cost)  # an over-budget call must not move the generator either
        sales = restaurant(T, rng)
    items = np.ascontiguousarray(sales.sales.T).ravel()  # item-major: s[i T + t]
    # validates (counts, 2^50 on every node), then charges the accountant, then draws
    meas = plan.measure(items, accountant=accountant, rng=None if seed is None else rng,
                        label=f"restaurant({T} days)")
    noisy = meas.y
    truth = plan.measured.matvec(items) if evaluate else None  # = restaurant_tree_values(sales.sales, layout)
    res = solve(noisy, constraints, method=method, tol=tol, max_sweeps=sweeps, executor=executor, callback=callback,
                truth=truth)
    rmse = (lambda a: float(np.sqrt(np.mean((a - truth) ** 2)))) if evaluate else (lambda a: None)
    return RestaurantRelease(
        sales=sales,
        layout=layout,
        noisy=noisy,
        result=res,
        epsilon=eps,
        sensitivity=float(meas.sensitivity),
        scale=float(meas.scales[0]),
        rmse_noisy=rmse(noisy),
        rmse_consistent=rmse(res.x),
        secure=meas.secure,
        private=meas.private,
        variance=float(meas.variances[0]),
        ledger=meas.entry,
        _truth=truth,
    )


register_reader("restaurant.result", restaurant_result)  # load_release reads earlier restaurant files with it
