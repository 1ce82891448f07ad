"""The privacy unit: whom a release protects, and how much one of them may contribute.

Without a declared unit a release protects **one row** (one record changes one count by one).
Real tables have many rows per person: in the UCI Online Retail data one customer has 7,983 lines,
and a release at epsilon 1 per line protects that customer only at about epsilon 7,983.  A
:class:`PrivacyUnit` names the column that identifies the protected entity and bounds what one
entity contributes; :func:`truncate` drops the rows beyond the bounds, and the release is
calibrated to the bounds (Tumult Analytics' ``MaxRowsPerID`` / ``MaxGroupsPerID`` /
``MaxRowsPerGroupPerID``, OpenDP's ``max_contributions`` state the same contract).

**Truncation is stable.**  Which of a unit's rows are kept depends only on that unit's own rows
and on secret randomness (a uniformly random priority per row from the secure generator; with a
seed, reproducible and therefore not private).  Adding or removing one whole unit therefore
changes the kept table by exactly that unit's kept rows, which obey the bounds:

* ``max_rows = k`` alone: at most ``k`` kept rows, so a histogram moves by ``d >= 0`` with
  ``||d||_1 <= k`` and ``||d||_2 <= k``;
* ``max_groups = g`` and ``max_rows_per_group = r`` (groups are the cells a row falls in): at most
  ``g`` cells, at most ``r`` rows in each: ``||d||_1 <= g r``, ``||d||_2 <= sqrt(g) r``; with
  ``max_rows = k`` as well, ``||d||_1 <= min(k, g r)`` and ``||d||_2^2 <= q r^2 + s^2`` with
  ``q = min(g, floor(k / r))`` full cells and ``s`` the rest (:meth:`PrivacyUnit.l2_bound`).

A strategy ``M`` then moves by ``||M d||_1 <= Delta_1(M) ||d||_1`` and ``||M d||_2 <= Delta_2(M)
||d||_1`` (triangle inequality over the changed cells), or ``Delta_2(M) ||d||_2`` when the columns
of ``M`` have disjoint supports (the identity: the measured cells are the histogram).  Nothing
about truncation -- how many rows or units were dropped, the largest contribution -- is published.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import scipy.sparse as sp

from .errors import SparseDPError

__all__ = ["PrivacyUnit", "ONE_ROW", "declared", "scaled_up", "truncate", "unit_histogram", "disjoint_columns", "id_like_columns",
           "warn_if_id_like", "IdColumnWarning"]


def _bound(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        raise SparseDPError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class PrivacyUnit:
    """The protected entity and its contribution bounds (module doc).

    ``column``: the column identifying a unit (``None``: each row is its own unit, the default of
    every release).  ``max_rows``: rows kept per unit in total.  ``max_groups`` and
    ``max_rows_per_group``: distinct cells per unit and rows per cell, for grouped releases
    (histograms, marginals, per-unit tables).  A declared column needs ``max_rows`` or both group
    bounds.  ``max_rows="auto"`` chooses it from the data, privately, with ``auto_share`` of the
    release's budget spent on a DP ``auto_quantile`` of the rows per unit
    (:func:`sparsedp.contribution_bound.resolve_unit`)."""

    column: str | None = None
    max_rows: int | str | None = None
    max_groups: int | None = None
    max_rows_per_group: int | None = None
    auto_quantile: float = 0.95
    auto_share: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.max_rows, str) and self.max_rows == "auto":
            if self.column is None:
                raise SparseDPError("max_rows='auto' needs the column that identifies the privacy unit")
            q = self.auto_quantile
            if not (isinstance(q, (int, float)) and not isinstance(q, bool) and 0.0 < q < 1.0):
                raise SparseDPError(f"auto_quantile must lie in (0, 1), got {q!r}")
            if not 0.0 < float(self.auto_share) < 1.0:
                raise SparseDPError("auto_share must lie in (0, 1)")
        else:
            object.__setattr__(self, "max_rows", _bound(self.max_rows, "max_rows"))
        object.__setattr__(self, "max_groups", _bound(self.max_groups, "max_groups"))
        object.__setattr__(self, "max_rows_per_group", _bound(self.max_rows_per_group, "max_rows_per_group"))
        if self.column is None:
            if any(b is not None for b in (self.max_rows, self.max_groups, self.max_rows_per_group)):
                raise SparseDPError("contribution bounds need the column that identifies the privacy unit")
            return
        if not isinstance(self.column, str) or not self.column:
            raise SparseDPError(f"the privacy unit's column must be a column name, got {self.column!r}")
        if (self.max_groups is None) != (self.max_rows_per_group is None):
            raise SparseDPError("max_groups and max_rows_per_group are given together")
        if self.max_rows is None and self.max_groups is None:
            raise SparseDPError(f"privacy unit {self.column!r}: give max_rows (rows per unit) or max_groups "
                                "and max_rows_per_group")

    @property
    def is_row(self) -> bool:
        """Whether each row is its own unit (nothing declared)."""
        return self.column is None

    @property
    def grouped(self) -> bool:
        return self.max_groups is not None

    @property
    def is_auto(self) -> bool:
        """Whether ``max_rows`` is still to be chosen from the data (``"auto"``)."""
        return self.max_rows == "auto"

    def _concrete(self) -> None:
        if self.is_auto:
            raise SparseDPError("max_rows='auto' is chosen from the data first "
                                "(sparsedp.contribution_bound.resolve_unit)")

    def l1_bound(self) -> int:
        """``max ||d||_1`` over the histogram changes one unit can make (module doc)."""
        self._concrete()
        if self.is_row:
            return 1
        bounds = [b for b in (self.max_rows, None if not self.grouped else self.max_groups * self.max_rows_per_group)
                  if b is not None]
        return int(min(bounds))

    def l2_bound(self) -> float:
        """``max ||d||_2`` over the histogram changes one unit can make (module doc), rounded up."""
        self._concrete()
        if self.is_row:
            return 1.0
        if not self.grouped:
            return float(self.max_rows)
        g, r = self.max_groups, self.max_rows_per_group
        k = self.max_rows if self.max_rows is not None else g * r
        q = min(g, k // r)
        rest = min(k - q * r, r) if q < g else 0
        sq = q * r * r + rest * rest  # exact integers
        root = math.isqrt(sq)
        return float(root) if root * root == sq else math.nextafter(math.sqrt(sq), math.inf)

    def multiplier(self, noise: str, disjoint_columns: bool) -> float:
        """The factor on a strategy's sensitivity ``Delta_p(M)``: ``||d||_1`` for Laplace, and for
        Gaussian ``||d||_2`` when the strategy's columns have disjoint supports, else ``||d||_1``."""
        if noise == "laplace" or not disjoint_columns:
            return float(self.l1_bound())
        return self.l2_bound()

    def row_budget(self, noise: str, budget: float, disjoint_columns: bool = False) -> float:
        """The budget per *row* that gives ``budget`` per *unit* for a row-level release whose
        loss is linear in ``||d||_1`` (Laplace: ``epsilon / ||d||_1``) or quadratic in it
        (zCDP: ``rho / m^2`` with ``m`` the :meth:`multiplier`).  For a release calibrated with
        per-count sensitivity 1 this is exact, not an approximation: its loss for a change ``d`` is
        at most ``||d||_1`` (or ``m^2``) times its loss for one row.  Rounded down."""
        m = self.multiplier(noise, disjoint_columns)
        out = budget / m if noise == "laplace" else budget / (m * m)
        f = Fraction(m) if noise == "laplace" else Fraction(m) ** 2
        while out > 0.0 and Fraction(out) * f > Fraction(budget):  # exact: the per-unit cost never exceeds budget
            out = math.nextafter(out, 0.0)
        return out

    def describe(self) -> dict[str, Any]:
        """What the ledger and a release file record: the unit and its bounds."""
        if self.is_row:
            return {"privacy_unit": "one row"}
        out: dict[str, Any] = {"privacy_unit": self.column}
        for key in ("max_rows", "max_groups", "max_rows_per_group"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.is_auto:
            out.update(auto_quantile=self.auto_quantile, auto_share=self.auto_share)
        return out

    @property
    def label(self) -> str:
        """The unit as ledgers and summaries name it: ``"CustomerID (max_rows 50)"``, ``"one row"``."""
        if self.is_row:
            return "one row"
        bounds = ", ".join(f"{k} {v}" for k, v in self.describe().items()
                           if k in ("max_rows", "max_groups", "max_rows_per_group"))
        return f"{self.column} ({bounds})"

    def __str__(self) -> str:
        return f"privacy unit: {self.label}"


def scaled_up(value: Any, factor: int) -> float:
    """``factor * value`` as a float never below the exact product (a per-unit cost or sensitivity
    made from a per-record one is never understated)."""
    exact = Fraction(value) * factor
    out = float(exact)
    return out if Fraction(out) >= exact else math.nextafter(out, math.inf)


#: The default of every release: each row is protected on its own.
ONE_ROW = PrivacyUnit()


def declared(privacy_unit: Any, drop_missing_units: Any = False) -> PrivacyUnit | None:
    """The unit a release was given, checked before anything is read or charged: ``None`` for
    one row (nothing declared, or :data:`ONE_ROW`), else the :class:`PrivacyUnit`.  Anything else,
    and ``drop_missing_units`` (which must be a bool) without a declared unit, raise
    :class:`~sparsedp.errors.SparseDPError`."""
    if not isinstance(drop_missing_units, (bool, np.bool_)):
        raise SparseDPError(f"drop_missing_units must be True or False, got {drop_missing_units!r}")
    if privacy_unit is not None and not isinstance(privacy_unit, PrivacyUnit):
        raise SparseDPError(f"privacy_unit must be a PrivacyUnit, got {type(privacy_unit).__name__}")
    if privacy_unit is None or privacy_unit.is_row:
        if drop_missing_units:
            raise SparseDPError("drop_missing_units goes with a declared privacy_unit")
        return None
    return privacy_unit


def disjoint_columns(M: Any) -> bool:
    """Whether the columns of ``M`` have disjoint supports (every row has at most one non-zero;
    then ``||M d||_2 <= Delta_2(M) ||d||_2``).  Checked on explicit sparse matrices and on interval
    rows (no two intervals overlap); any other operator is taken as not disjoint (the bound then
    uses ``||d||_1``, which is always valid)."""
    from .intervals import IntervalRows  # local: intervals imports operators, which this module need not
    from .operators import SparseOperator

    if type(M) is IntervalRows:
        order = np.argsort(M.lo, kind="stable")
        return bool(np.all(M.hi[order][:-1] <= M.lo[order][1:]))
    if isinstance(M, SparseOperator) or sp.issparse(M):
        A = sp.csr_matrix(M.matrix if isinstance(M, SparseOperator) else M)
        counts = np.diff(A.indptr) if not np.any(A.data == 0) else np.bincount(
            np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))[A.data != 0], minlength=A.shape[0])
        return bool(np.all(counts <= 1))
    return False


def _priorities(size: int, rng: Any) -> np.ndarray:
    """Uniform random 63-bit priorities: secure bytes without a seed, else the seeded generator."""
    if rng is None:
        from .noise import SecureRandomBits  # local: noise is a heavy import for a small module

        raw = np.frombuffer(SecureRandomBits().bytes(8 * size), dtype=np.uint64)
        return (raw >> np.uint64(1)).astype(np.int64)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    return gen.integers(0, 2**63 - 1, size=size, dtype=np.int64)


def _codes(values: Any, what: str, drop_missing: bool) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes of the unit ids (or group keys) and the mask of rows with an id."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise SparseDPError(f"{what} must be one value per row")
    if arr.dtype.kind == "f":
        present = ~np.isnan(arr)
    elif arr.dtype.kind == "O":
        present = ~_object_missing(arr)
    else:
        present = np.ones(arr.shape, dtype=bool)
    if not np.all(present) and not drop_missing:
        raise SparseDPError(f"{what}: some rows have no value; pass drop_missing=True to drop them (how many is "
                            "not published)")
    _, codes = np.unique(arr[present].astype(str) if arr.dtype.kind == "O" else arr[present], return_inverse=True)
    return codes.astype(np.int64).ravel(), present


def _object_missing(arr: np.ndarray) -> np.ndarray:
    """Missing entries (None / NaN) of an object array, vectorised through pandas when present."""
    try:
        import pandas as pd

        return np.asarray(pd.isna(arr), dtype=bool)
    except ImportError:  # pragma: no cover
        return np.array([v is None or (isinstance(v, float) and math.isnan(v)) for v in arr], dtype=bool)


def _rank_within(keys: np.ndarray, prio: np.ndarray) -> np.ndarray:
    """The rank (0, 1, ...) of each row among the rows of its key, in order of priority."""
    order = np.lexsort((prio, keys))
    k = keys[order]
    start = np.r_[True, k[1:] != k[:-1]]
    idx = np.arange(k.size)
    first = np.maximum.accumulate(np.where(start, idx, 0))
    rank = np.empty(k.size, dtype=np.int64)
    rank[order] = idx - first
    return rank


def truncate(units: Any, unit: PrivacyUnit, groups: Any = None, *, rng: Any = None,
             drop_missing: bool = False, priorities: Any = None) -> np.ndarray:
    """The rows to keep (a boolean mask) so that every unit obeys ``unit``'s bounds (module doc).

    ``units``: the unit id of every row.  ``groups``: the cell of every row (any hashable codes,
    e.g. bin indices), needed for ``max_groups`` / ``max_rows_per_group``.  Each row gets a
    uniformly random priority (secure without ``rng``); a unit keeps its ``max_groups``
    highest-priority cells (a cell's priority is its best row's), in each at most
    ``max_rows_per_group`` rows, and at most ``max_rows`` rows in all, by priority.  Rows without a
    unit id raise :class:`~sparsedp.errors.SparseDPError` unless ``drop_missing``.  ``O(rows log
    rows)``, vectorised; nothing of what is dropped is returned but the mask.

    ``priorities`` (one int64 per row, instead of drawing them from ``rng``): given priorities that
    are a function of a row's own content and a secret key (:func:`sparsedp.unit_records.cell_priorities`)
    make the kept rows the same however the table is split into parts, so a release truncated part by
    part on workers equals the one truncated in one process.  They keep the stability above as long as
    a row's priority does not depend on other units' rows."""
    if not isinstance(unit, PrivacyUnit):
        raise SparseDPError(f"unit must be a PrivacyUnit, got {type(unit).__name__}")
    ids = np.asarray(units)
    n = ids.shape[0] if ids.ndim == 1 else -1
    if unit.is_row:
        return np.ones(max(n, 0), dtype=bool)
    ucode, present = _codes(ids, f"the privacy unit column {unit.column!r}", drop_missing)
    keep = np.zeros(ids.shape[0], dtype=bool)
    rows = np.flatnonzero(present)
    if priorities is None:
        prio = _priorities(rows.size, rng)
    else:
        given = np.asarray(priorities)
        if given.shape != ids.shape or given.dtype.kind not in "iu":
            raise SparseDPError("priorities must be one integer per row")
        prio = given[rows].astype(np.int64)
    ok = np.ones(rows.size, dtype=bool)
    if unit.grouped:
        if groups is None:
            raise SparseDPError("max_groups / max_rows_per_group need the cell of every row (groups=)")
        gvals = np.asarray(groups)
        if gvals.shape[0] != ids.shape[0]:
            raise SparseDPError("groups must give one cell per row")
        gcode, _ = _codes(gvals[rows], "groups", False)
        pair = ucode * (int(gcode.max(initial=0)) + 1) + gcode  # (unit, cell) as one key
        # rows per cell: the r highest-priority rows of each (unit, cell)
        ok &= _rank_within(pair, prio) < unit.max_rows_per_group
        # cells per unit: rank the unit's cells by their best row's priority, keep g
        best = np.full(int(pair.max(initial=0)) + 1, -1, dtype=np.int64)
        np.maximum.at(best, pair, prio)
        cell_prio = best[pair]
        is_head = prio == cell_prio  # one row per (unit, cell) carries the cell's priority (ties: 2^-63)
        head_rank = np.full(rows.size, np.iinfo(np.int64).max)
        heads = np.flatnonzero(is_head)
        head_rank[heads] = _rank_within(ucode[heads], -prio[heads])
        cell_rank = np.zeros(int(pair.max(initial=0)) + 1, dtype=np.int64)
        cell_rank[pair[heads]] = head_rank[heads]
        ok &= cell_rank[pair] < unit.max_groups
    if unit.max_rows is not None:
        cand = np.flatnonzero(ok)
        ok[cand] = _rank_within(ucode[cand], -prio[cand]) < unit.max_rows
    keep[rows[ok]] = True
    return keep


def unit_histogram(cells: Any, n: int, units: Any, unit: PrivacyUnit, *, rng: Any = None,
                   drop_missing: bool = False) -> np.ndarray:
    """The histogram (length ``n``, float64 counts) of the rows kept by :func:`truncate`, each row
    counted in its cell ``cells[i]`` (integers in ``[0, n)``; the cells are the groups of
    ``max_groups`` / ``max_rows_per_group``).  One unit then moves it by a vector within
    ``unit.l1_bound()`` / ``unit.l2_bound()``."""
    c = np.asarray(cells)
    if c.ndim != 1 or (c.size and (not np.issubdtype(c.dtype, np.integer) or c.min() < 0 or c.max() >= n)):
        raise SparseDPError(f"cells must be integers in [0, {n}), one per row")
    keep = truncate(units, unit, c if unit.grouped else None, rng=rng, drop_missing=drop_missing)
    return np.bincount(c[keep], minlength=n).astype(np.float64)


_ID_SUFFIX = re.compile(r"(^id$)|([_ -]id$)", re.IGNORECASE)  # id, order_id, user id
_ID_CAMEL = re.compile(r"[a-z0-9](ID|Id)$")  # CustomerID, userId (not "valid", "paid")
_ID_PREFIX = re.compile(r"^(user|customer|person|client|patient|member)", re.IGNORECASE)


class IdColumnWarning(UserWarning):
    """A table has a column that looks like an identifier while no privacy unit is declared."""


def id_like_columns(names: Iterable[str]) -> list[str]:
    """The column names that look like identifiers: ``id``, ``*_id``, ``*ID`` / ``*Id`` after a
    lower-case letter or digit (``CustomerID``, not ``valid``), and ``user*``, ``customer*``,
    ``person*``, ``client*``, ``patient*``, ``member*``."""
    return [str(c) for c in names if _ID_SUFFIX.search(str(c)) or _ID_CAMEL.search(str(c)) or _ID_PREFIX.search(str(c))]


def warn_if_id_like(names: Sequence[str], unit: PrivacyUnit | None) -> list[str]:
    """One warning line when the input has an identifier-like column and no declared unit: the
    release then protects one row, not the entity the column names.  Returns the columns named."""
    if unit is not None and not unit.is_row:
        return []
    cols = id_like_columns(names)
    if cols:
        warnings.warn(f"column {cols[0]!r} looks like an identifier but no privacy unit is declared: this release "
                      f"protects one row, not one {cols[0]}; declare it (privacy_unit / --privacy-unit) with "
                      "contribution bounds", IdColumnWarning, stacklevel=2)
    return cols
