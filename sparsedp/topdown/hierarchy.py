"""From a table to a hierarchy x categories domain.

A :class:`Hierarchy` is the public structure of a geographic release: a root (level 0) and one
level per geography column (``state_fips``, ``county_fips``, ``vtd_code``, ...), each unit with the
index of its parent in the level above.  Units of a level are numbered in the order
``(parent, code)``, so the children of a unit are contiguous (breadth-first order, what the
two-pass estimator and the top-down rounding want).  Leaves may sit at any depth: a row whose
deeper geography columns are empty (``NaN``, ``None`` or ``""``) is a leaf at the depth of its
last code (an unbalanced hierarchy).

A :class:`CellDomain` is the categories: a product of attributes (``age`` x ``race``), its cells in
C order, each cell the count column it was read from.

A :class:`HierarchicalTable` is a hierarchy with its (secret) counts: one ``(units, cells)`` int64
array per level, the leaves' rows of the input and, above them, the sums of their children.
Built, vectorised (``pandas.factorize`` / ``numpy.unique`` per level, never a Python loop over
units), from

* a table of count columns (:meth:`HierarchicalTable.from_counts`: one row per leaf unit, one
  column per cell), or
* record rows (:meth:`HierarchicalTable.from_records`: one row per person, categorical columns),
  aggregated to counts over a public list of units and a public category domain,

or read from CSV / Parquet by :func:`read_table`.  The geography (which units exist) and the cells
are taken as public: they shape the release and are published with it.  For count tables this is
the table's own list of rows (the census geography is public); for records, the units and the
category values must be given (or stated to be public: ``units="observed"``), because the units
and values that occur among the records are themselves a function of the data.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import FractionalCountError, InputBoundError, NegativeCountError, NonFiniteInputError, ShapeError, SparseDPError
from ..privacy_unit import PrivacyUnit, truncate, warn_if_id_like
from ..validation import MAX_MAGNITUDE

__all__ = ["CellDomain", "Hierarchy", "HierarchicalTable", "read_table", "expand_columns", "check_cells_partition",
           "check_contributions"]


def _pd() -> Any:
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("sparsedp.topdown needs pandas: pip install 'sparsedp[io]'") from exc
    return pd


# -- the categories -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellDomain:
    """The categories of a release: attributes ``names`` with their ``values``; the cells are the
    product in C order (the last attribute fastest), ``columns[j]`` the count column of cell ``j``
    (or its label, for records).  ``CellDomain.flat(columns)`` is one attribute ``cell``."""

    names: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        names = tuple(str(n) for n in self.names)
        values = tuple(tuple(str(v) for v in vals) for vals in self.values)
        columns = tuple(str(c) for c in self.columns)
        if len(names) != len(values) or not names:
            raise ShapeError(f"a cell domain needs one list of values per attribute ({len(names)} names, "
                             f"{len(values)} lists)")
        if len(set(names)) != len(names):
            raise ShapeError(f"attribute names must be distinct, got {names}")
        for n, vals in zip(names, values):
            if not vals:
                raise ShapeError(f"attribute {n!r} has no values")
            if len(set(vals)) != len(vals):
                raise ShapeError(f"attribute {n!r} has repeated values")
        size = int(np.prod([len(v) for v in values]))
        if len(columns) != size or len(set(columns)) != size:
            raise ShapeError(f"{len(columns)} distinct cell columns for a domain of {size} cells")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "columns", columns)

    @classmethod
    def flat(cls, columns: Sequence[str], name: str = "cell") -> "CellDomain":
        """One attribute whose values are the columns."""
        cols = tuple(str(c) for c in columns)
        return cls((name,), (cols,), cols)

    @classmethod
    def from_columns(cls, columns: Sequence[str], attributes: Sequence[str], sep: str = "_") -> "CellDomain":
        """Attributes parsed from column names: ``vap_hisp`` with ``attributes=("age", "race")`` and
        ``sep="_"`` is the cell ``(vap, hisp)``.  Values are kept in order of first appearance; the
        columns must be the complete product, each cell once (they are reordered to C order)."""
        attrs = tuple(str(a) for a in attributes)
        k = len(attrs)
        if k == 1:
            return cls.flat(columns, attrs[0])
        parts = []
        for c in columns:
            p = str(c).split(sep, k - 1)
            if len(p) != k:
                raise ShapeError(f"column {c!r} does not split into {k} parts ({', '.join(attrs)}) at {sep!r}")
            parts.append(p)
        values: list[list[str]] = [[] for _ in attrs]
        for p in parts:
            for i, v in enumerate(p):
                if v not in values[i]:
                    values[i].append(v)
        index = {tuple(p): str(c) for p, c in zip(parts, columns)}
        if len(index) != len(parts):
            raise ShapeError("two columns name the same cell")
        sizes = [len(v) for v in values]
        if len(index) != int(np.prod(sizes)):
            raise ShapeError(f"the columns are not the complete product of {dict(zip(attrs, values))}: "
                             f"{len(index)} of {int(np.prod(sizes))} cells")
        ordered = [index[tuple(values[i][j] for i, j in enumerate(idx))] for idx in np.ndindex(*sizes)]
        return cls(attrs, tuple(tuple(v) for v in values), tuple(ordered))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.values)

    @property
    def size(self) -> int:
        return int(np.prod(self.sizes))

    def axes(self, spec: Any) -> tuple[int, ...]:
        """The attributes a marginal keeps: ``"total"`` (none), ``"cells"`` (all), an attribute
        name, ``"age+race"``, or a sequence of names / indices."""
        if isinstance(spec, str):
            if spec == "total":
                return ()
            if spec == "cells":
                return tuple(range(len(self.names)))
            spec = [s for s in spec.split("+") if s]
        out = []
        for a in spec:
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool) and 0 <= int(a) < len(self.names):
                out.append(int(a))
            elif isinstance(a, str) and a in self.names:
                out.append(self.names.index(a))
            else:
                raise ShapeError(f"unknown attribute {a!r}: the cells have {self.names} (or say 'total' / 'cells')")
        if len(set(out)) != len(out):
            raise ShapeError(f"repeated attribute in {spec!r}")
        return tuple(sorted(out))

    def marginal_name(self, axes: Sequence[int]) -> str:
        axes = tuple(axes)
        if not axes:
            return "total"
        if len(axes) == len(self.names):
            return "cells"
        return "+".join(self.names[i] for i in axes)

    def cell_to_marginal(self, axes: Sequence[int]) -> np.ndarray:
        """For every cell (C order), the index of its cell in the marginal on ``axes`` (C order)."""
        sizes = self.sizes
        grid = np.indices(sizes).reshape(len(sizes), -1)
        sub = [sizes[i] for i in axes]
        if not axes:
            return np.zeros(self.size, dtype=np.int64)
        return np.ravel_multi_index(tuple(grid[i] for i in axes), sub).astype(np.int64)

    def marginal_size(self, axes: Sequence[int]) -> int:
        return int(np.prod([self.sizes[i] for i in axes])) if axes else 1

    def marginal_labels(self, axes: Sequence[int]) -> list[str]:
        """Labels of the cells of the marginal on ``axes`` (``"total"`` for the empty marginal)."""
        if not axes:
            return ["total"]
        sub = [self.values[i] for i in axes]
        return ["/".join(v[j] for v, j in zip(sub, idx)) for idx in np.ndindex(*[len(v) for v in sub])]

    def marginal(self, counts: np.ndarray, axes: Sequence[int]) -> np.ndarray:
        """The marginal on ``axes`` of ``(units, cells)`` counts: ``(units, marginal cells)``."""
        c = np.asarray(counts)
        t = c.reshape((c.shape[0],) + self.sizes)
        drop = tuple(1 + i for i in range(len(self.sizes)) if i not in axes)
        return t.sum(axis=drop).reshape(c.shape[0], -1) if drop else t.reshape(c.shape[0], -1)

    def integer_basis(self) -> tuple[np.ndarray, np.ndarray]:
        """``(R, norms)``: an orthogonal integer ``(cells, cells)`` basis (rows) and its row norms,
        the Kronecker product over the attributes of ``[1, ..., 1]`` and the Helmert contrasts
        ``(1, .., 1, -k, 0, .., 0)`` (``k`` ones).  Row ``k`` is the component whose attribute ``i``
        index is ``k_i`` (0: constant along ``i``)."""
        R = np.ones((1, 1), dtype=np.int64)
        norms = np.ones(1)
        for n in self.sizes:
            H = np.zeros((n, n), dtype=np.int64)
            H[0] = 1
            for k in range(1, n):
                H[k, :k] = 1
                H[k, k] = -k
            R = np.kron(R, H)
            norms = np.kron(norms, np.sqrt((H * H).sum(axis=1)))
        return R, norms

    def basis(self) -> np.ndarray:
        """The orthonormal ``(cells, cells)`` basis ``B`` (rows): :meth:`integer_basis` normalised.
        Every marginal's Gram matrix ``Q_S^T Q_S`` is diagonal in it (a marginal on ``S`` sees
        exactly the components that are constant along every attribute outside ``S``)."""
        R, norms = self.integer_basis()
        return R / norms[:, None]

    def component_attributes(self) -> list[tuple[int, ...]]:
        """For every basis row, the attributes on which it is a contrast (its residual set)."""
        sizes = self.sizes
        return [tuple(i for i, k in enumerate(idx) if k) for idx in np.ndindex(*sizes)]


# -- the hierarchy --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Hierarchy:
    """A geographic hierarchy x a cell domain (public).  ``levels[0]`` is the root; ``levels[d]``
    for ``d >= 1`` the geography column of depth ``d``.  ``parents[d]`` (``d >= 1``) gives every
    unit of level ``d`` the index of its parent in level ``d - 1`` (non-decreasing: children are
    contiguous); ``codes[d]`` its code in its level's column (``codes[0] = [root]``)."""

    levels: tuple[str, ...]
    parents: tuple[np.ndarray, ...]
    codes: tuple[np.ndarray, ...]
    cells: CellDomain
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.levels) != len(self.parents) or len(self.levels) != len(self.codes):
            raise ShapeError("one parent array and one code array per level")
        if len(set(self.levels)) != len(self.levels):
            raise ShapeError(f"level names must be distinct, got {self.levels}")
        if self.parents[0].shape != (1,) or self.codes[0].shape != (1,):
            raise ShapeError("level 0 is the root: one unit")
        for d in range(1, len(self.levels)):
            p = self.parents[d]
            if p.ndim != 1 or p.shape != self.codes[d].shape or (p.size and (
                    p[0] < 0 or p[-1] >= self.parents[d - 1].size or np.any(np.diff(p) < 0))):
                raise ShapeError(f"level {d}: parent indices must be sorted and point into level {d - 1}")
        for a in (*self.parents, *self.codes):
            a.flags.writeable = False

    @property
    def depth(self) -> int:
        """Index of the deepest level."""
        return len(self.levels) - 1

    @property
    def sizes(self) -> tuple[int, ...]:
        """Units per level."""
        return tuple(int(p.size) for p in self.parents)

    @property
    def units(self) -> int:
        return int(sum(self.sizes))

    @property
    def geo(self) -> tuple[str, ...]:
        """The geography columns (levels below the root)."""
        return self.levels[1:]

    def level_index(self, level: Any) -> int:
        """A level by name or index."""
        if isinstance(level, (int, np.integer)) and not isinstance(level, bool):
            if 0 <= int(level) <= self.depth:
                return int(level)
        elif isinstance(level, str) and level in self.levels:
            return self.levels.index(level)
        raise ShapeError(f"unknown level {level!r}: the hierarchy has {self.levels}")

    def indptr(self, d: int) -> np.ndarray:
        """Children of unit ``u`` of level ``d`` are ``indptr(d)[u] : indptr(d)[u + 1]`` of level
        ``d + 1`` (``d < depth``)."""
        key = ("indptr", d)
        if key not in self._cache:
            n = self.sizes[d]
            counts = np.bincount(self.parents[d + 1], minlength=n) if d < self.depth else np.zeros(n, np.int64)
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(counts, out=ptr[1:])
            ptr.flags.writeable = False
            self._cache[key] = ptr
        return self._cache[key]

    def leaves(self, d: int) -> np.ndarray:
        """Whether each unit of level ``d`` is a leaf (has no children)."""
        return np.diff(self.indptr(d)) == 0

    def children_sum(self, d: int, child_values: np.ndarray) -> np.ndarray:
        """Per unit of level ``d``, the sum of its children's rows (level ``d + 1``); 0 for leaves.
        Exact for integers; float sums are sequential within each family."""
        ptr = self.indptr(d)
        out = np.zeros((self.sizes[d],) + child_values.shape[1:], dtype=child_values.dtype)
        has = ptr[1:] > ptr[:-1]
        if child_values.shape[0]:
            out[has] = np.add.reduceat(child_values, ptr[:-1][has], axis=0)
        return out

    def spread(self, d: int, values: np.ndarray) -> np.ndarray:
        """Each unit's row of ``values`` (level ``d - 1``) repeated for each of its children (level ``d``)."""
        return values[self.parents[d]]

    def paths(self, d: int) -> list[np.ndarray]:
        """The codes of every unit of level ``d`` on each geography level ``1..d`` (its ancestors' codes)."""
        out = [self.codes[d]]
        idx = np.arange(self.sizes[d])
        for e in range(d, 1, -1):
            idx = self.parents[e][idx]
            out.append(self.codes[e - 1][idx])
        return out[::-1]

    def unit_frame(self) -> Any:
        """One row per unit, levels in order (root first): ``level`` (its name), ``depth``, and one
        column per geography level with the unit's code and its ancestors' (``None`` below it)."""
        pd = _pd()
        frames = []
        for d in range(self.depth + 1):
            n = self.sizes[d]
            data: dict[str, Any] = {"level": np.full(n, self.levels[d], dtype=object),
                                    "depth": np.full(n, d, dtype=np.int64)}
            paths = self.paths(d) if d else []
            for e, g in enumerate(self.geo, start=1):
                data[g] = paths[e - 1] if e <= d else np.full(n, None, dtype=object)
            frames.append(pd.DataFrame(data))
        return pd.concat(frames, ignore_index=True)

    def offsets(self) -> np.ndarray:
        """Start of each level in the units numbered level by level (root 0)."""
        return np.concatenate(([0], np.cumsum(self.sizes))).astype(np.int64)

    def describe(self) -> dict[str, Any]:
        """Public summary (JSON-ready)."""
        return {"levels": list(self.levels), "units": list(self.sizes), "cells": list(self.cells.columns),
                "attributes": {n: list(v) for n, v in zip(self.cells.names, self.cells.values)},
                "leaves": [int(self.leaves(d).sum()) for d in range(self.depth + 1)]}


def _missing(col: Any) -> np.ndarray:
    pd = _pd()
    s = pd.Series(col)
    miss = s.isna().to_numpy()
    return miss | (s.astype(str).str.strip().to_numpy() == "") if not miss.all() else miss


def _build_hierarchy(frame: Any, geo: Sequence[str], cells: CellDomain, root: str,
                     unique_rows: bool) -> tuple[Hierarchy, np.ndarray, np.ndarray]:
    """The hierarchy of the rows of ``frame`` (geography columns ``geo``), and for every row its
    depth and its unit index at that depth.  ``unique_rows``: two rows may not be the same unit."""
    pd = _pd()
    geo = list(geo)
    missing = [g for g in geo if g not in frame.columns]
    if missing:
        raise ShapeError(f"unknown geography column(s) {missing}; the table has {list(frame.columns)[:30]}")
    if len(set(geo)) != len(geo) or not geo:
        raise ShapeError(f"the geography columns must be distinct and at least one, got {geo}")
    if root in geo:
        raise ShapeError(f"the root's name {root!r} is also a geography column")
    rows = len(frame)
    if rows == 0:
        raise ShapeError("the table has no rows")
    present = np.empty((rows, len(geo)), dtype=bool)
    for i, g in enumerate(geo):
        present[:, i] = ~_missing(frame[g])
    if not present[:, 0].all():
        raise ShapeError(f"{int((~present[:, 0]).sum())} row(s) have no {geo[0]!r} code")
    if np.any(present[:, 1:] & ~present[:, :-1]):
        bad = int(np.flatnonzero((present[:, 1:] & ~present[:, :-1]).any(axis=1))[0])
        raise ShapeError(f"row {bad}: a geography code below an empty one (codes must be empty only at the end)")
    depth = present.sum(axis=1).astype(np.int64)
    unit = np.zeros(rows, dtype=np.int64)  # unit index at the current level of every row still that deep
    parents = [np.array([-1], dtype=np.int64)]
    codes = [np.array([root], dtype=object)]
    row_unit = np.zeros(rows, dtype=np.int64)
    prev_n = 1
    for d, g in enumerate(geo, start=1):
        sel = depth >= d
        col = frame[g].to_numpy()[sel]
        code_idx, uniq = pd.factorize(pd.Series(col).astype(str).str.strip(), sort=True)
        nc = max(len(uniq), 1)
        key = unit[sel] * nc + code_idx.astype(np.int64)
        keys, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        par = keys // nc
        parents.append(par.astype(np.int64))
        codes.append(np.asarray(uniq, dtype=object)[keys % nc])
        # a unit that is a leaf row here and also has deeper rows: ambiguous
        here = depth[sel] == d
        deeper_units = np.unique(inv[~here])
        leaf_units = inv[here]
        if leaf_units.size and deeper_units.size and np.isin(leaf_units, deeper_units).any():
            u = int(leaf_units[np.isin(leaf_units, deeper_units)][0])
            raise ShapeError(f"unit {codes[-1][u]!r} of {g!r} has its own row and rows below it: give its own "
                             "counts a code of the next level")
        new_unit = np.zeros(rows, dtype=np.int64)
        new_unit[sel] = inv
        row_unit[sel & (depth == d)] = inv[here]
        unit = new_unit
        if par.size and par[-1] >= prev_n:  # pragma: no cover - by construction
            raise AssertionError("parent index out of range")
        prev_n = keys.size
    h = Hierarchy((root, *geo), tuple(parents), tuple(codes), cells)
    if unique_rows:
        flat = h.offsets()[depth] + row_unit
        dup = np.bincount(flat, minlength=h.units) > 1
        if dup.any():
            first = int(np.flatnonzero(dup[flat])[0])
            raise ShapeError(f"row {first}: the unit {tuple(frame[geo].iloc[first])} appears more than once")
    return h, depth, row_unit


def _check_count_matrix(values: Any, names: Sequence[str]) -> np.ndarray:
    """``(rows, cells)`` non-negative integer counts as int64 (raises before anything is measured)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iuf":
        raise ShapeError(f"count columns must be numeric, got dtype {arr.dtype} in {list(names)[:5]}")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise NonFiniteInputError(f"count column {names[bad[1]]!r} has a NaN or infinite value (row {bad[0]})")
        if np.any(arr != np.round(arr)):
            bad = np.argwhere(arr != np.round(arr))[0]
            raise FractionalCountError(f"count column {names[bad[1]]!r} has a count that is not an integer (row {bad[0]})")
    if arr.size and arr.min() < 0:
        bad = np.argwhere(arr < 0)[0]
        raise NegativeCountError(f"count column {names[bad[1]]!r} has a negative count (row {bad[0]})")
    if arr.size and float(arr.max()) > MAX_MAGNITUDE:
        raise InputBoundError(f"a count exceeds {MAX_MAGNITUDE:.0f}")
    return arr.astype(np.int64)


def check_contributions(k: Any) -> int:
    """``contributions_per_person``: how many count columns (cells) of one unit one person may be
    counted in, a whole number >= 1 (1: the cells partition the people)."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or int(k) < 1:
        raise ShapeError(f"contributions_per_person must be a whole number >= 1 (cells one person is counted in), "
                         f"got {k!r}")
    return int(k)


#: rows on which candidate summands are screened before a check over every row
_SCREEN_ROWS = 4096
#: a column is judged a sum only when it is non-zero on at least this many rows (on fewer, a
#: coincidence is likely: three small counts often add up once)
_MIN_EVIDENCE = 3


def _sum_of(X: np.ndarray, c: int, members: np.ndarray) -> bool:
    """Whether column ``c`` of ``X`` equals the sum of the columns ``members`` (at least two) on every row."""
    idx = np.flatnonzero(members)
    return idx.size >= 2 and bool(np.array_equal(X[:, idx].sum(axis=1), X[:, c]))


def _fitted_summands(X: np.ndarray, c: int, cand: np.ndarray) -> np.ndarray:
    """The candidates whose least-squares weight in column ``c`` is above one half: the set when
    ``c`` is a sum of candidates and they are linearly independent over the rows (then the
    least-squares weights are exactly that set's 0/1 indicator)."""
    idx = np.flatnonzero(cand)
    A = X[:, idx].astype(np.float64)
    w = np.linalg.lstsq(A.T @ A, A.T @ X[:, c].astype(np.float64), rcond=None)[0]
    out = np.zeros_like(cand)
    out[idx] = w > 0.5
    return out


def check_cells_partition(values: Any, names: Sequence[str], sep: str = "_") -> None:
    """Refuse count columns that do not partition the people: a column equal, on every row, to the
    sum of two or more other (non-zero) columns -- a ``total`` beside its parts -- would let one
    person change two counts of a unit while the release is charged for one.  General subset sums
    are not searched (that is NP-hard); for each column ``c`` these sets of other columns are
    tried, vectorised over the rows: all the others; the columns ``<= c`` on every row; those of
    them in ``c``'s name group (the part of the name before ``sep``: ``vap_total`` and
    ``vap_*``); and those of them whose least-squares weight in ``c`` is above one half (exactly
    the summands when the candidates are linearly independent over the rows, as real columns
    are); each set is then checked exactly, in integers.  A column non-zero on fewer than three
    rows is not judged (a coincidence is then likely), so a table of one or two units is not
    checked.  Reads the data but raises (:class:`~sparsedp.errors.ShapeError`) naming columns
    only, never a value; call it before anything is charged or drawn."""
    X = np.asarray(values)
    if X.ndim != 2 or X.shape[1] < 3 or X.shape[0] == 0:
        return
    X = X.astype(np.int64, copy=False)
    cols = [str(n) for n in names]
    nonzero = X.any(axis=0)
    judged = nonzero & ((X > 0).sum(axis=0) >= _MIN_EVIDENCE)
    total = X.sum(axis=1)
    group = np.array([n.split(sep, 1)[0] if sep and sep in n else None for n in cols], dtype=object)
    head = X[:_SCREEN_ROWS]
    for c in np.flatnonzero(judged):
        others = nonzero.copy()
        others[c] = False
        found = others if np.array_equal(2 * X[:, c], total) and others.sum() >= 2 else None
        cand = others & (head <= head[:, c:c + 1]).all(axis=0)
        if found is None and cand.sum() >= 2:
            cand = _below(X, c, cand)
            same = cand & (group == group[c]) if group[c] is not None else np.zeros_like(cand)
            for members in (cand, same):
                if _sum_of(X, c, members):
                    found = members
                    break
            else:
                fitted = _fitted_summands(X, c, cand)
                found = fitted if _sum_of(X, c, fitted) else None
        if found is not None:
            parts = [cols[j] for j in np.flatnonzero(found)]
            raise ShapeError(
                f"count column {cols[c]!r} equals the sum of {parts} on every row: the count columns must "
                "partition the people (each person counted in one column of their unit), else one person changes "
                "several counts while the release is charged for one.  Drop the column(s) that are sums, or state "
                "how many columns one person is counted in (contributions_per_person=K, --cells-per-person K): "
                "the noise is then calibrated to that")


def _below(X: np.ndarray, c: int, cand: np.ndarray) -> np.ndarray:
    """``cand`` restricted to the columns ``<= c`` on every row (column by column: no copy of ``X``)."""
    out = cand.copy()
    for j in np.flatnonzero(cand):
        out[j] = bool(np.all(X[:, j] <= X[:, c]))
    return out


def expand_columns(spec: Any, available: Sequence[str]) -> list[str]:
    """Column names from a list or a comma-separated string of names and glob patterns
    (``'vap_*,u18_*'``), in the order of the patterns, each pattern's matches in table order."""
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s) for s in spec]
    out: list[str] = []
    avail = [str(a) for a in available]
    for item in items:
        if not item:
            continue
        hits = [a for a in avail if fnmatch.fnmatchcase(a, item)] if any(ch in item for ch in "*?[") else (
            [item] if item in avail else [])
        if not hits:
            raise ShapeError(f"no column matches {item!r}; the table has {avail[:40]}")
        out.extend(h for h in hits if h not in out)
    if not out:
        raise ShapeError("no count columns given")
    return out


def _cell_domain(columns: Sequence[str], attributes: Any, sep: str) -> CellDomain:
    if isinstance(attributes, CellDomain):
        if set(attributes.columns) != set(columns):
            raise ShapeError("the cell domain's columns are not the count columns")
        return attributes
    if attributes is None:
        return CellDomain.flat(columns)
    return CellDomain.from_columns(columns, attributes, sep)


@dataclass(frozen=True, eq=False)
class HierarchicalTable:
    """A :class:`Hierarchy` with its counts: ``counts[d]`` is the ``(units of level d, cells)``
    int64 array (leaves: their rows; other units: the sums of their children).  SECRET: these are
    the true data; only a release made from them through the measurement path may be published."""

    hierarchy: Hierarchy
    counts: tuple[np.ndarray, ...]
    #: the units were taken from the records themselves (``units="observed"``): declared public
    units_observed: bool = False
    #: how many cells of its unit one person may be counted in (1: the cells partition the people;
    #: more for overlapping count columns, declared by the user: the release calibrates to it)
    contributions_per_person: int = 1
    #: whom the counts protect (:class:`~sparsedp.privacy_unit.PrivacyUnit`, records only): each
    #: unit's records were truncated to its bounds; ``None``: each record is its own unit
    privacy_unit: PrivacyUnit | None = None
    #: the truncation's priorities came from a seed (reproducible): the release is then not private
    truncation_seeded: bool = False

    def __post_init__(self) -> None:
        h = self.hierarchy
        if self.privacy_unit is not None and (not isinstance(self.privacy_unit, PrivacyUnit) or self.privacy_unit.is_auto):
            raise SparseDPError("privacy_unit must be a PrivacyUnit with concrete bounds (resolve max_rows='auto' "
                                "first: sparsedp.contribution_bound.resolve_unit)")
        object.__setattr__(self, "contributions_per_person", check_contributions(self.contributions_per_person))
        if len(self.counts) != h.depth + 1:
            raise ShapeError("one count array per level")
        for d, c in enumerate(self.counts):
            if c.shape != (h.sizes[d], h.cells.size) or c.dtype != np.int64:
                raise ShapeError(f"level {d}: counts must be int64 of shape {(h.sizes[d], h.cells.size)}")
            c.flags.writeable = False

    @property
    def cells(self) -> CellDomain:
        return self.hierarchy.cells

    @classmethod
    def from_leaf_counts(cls, hierarchy: Hierarchy, depth: np.ndarray, row_unit: np.ndarray,
                         counts: np.ndarray, units_observed: bool = False, contributions_per_person: int = 1
                         ) -> "HierarchicalTable":
        """Counts per level from the rows' leaf units (rows of one unit are added)."""
        h = hierarchy
        C = h.cells.size
        levels = [np.zeros((n, C), dtype=np.int64) for n in h.sizes]
        for d in range(h.depth + 1):
            sel = depth == d
            if not sel.any():
                continue
            if _unique(row_unit[sel]):
                levels[d][row_unit[sel]] = counts[sel]
            else:  # several rows of one unit: added
                np.add.at(levels[d], row_unit[sel], counts[sel])
        for d in range(h.depth - 1, -1, -1):
            levels[d] += h.children_sum(d, levels[d + 1])
        total = int(levels[0].sum())
        if total > MAX_MAGNITUDE:
            raise InputBoundError(f"the total count exceeds {MAX_MAGNITUDE:.0f}")  # the bound, never the total
        return cls(h, tuple(levels), units_observed, contributions_per_person)

    @classmethod
    def from_counts(cls, frame: Any, geo: Sequence[str], counts: Any, *, attributes: Any = None, sep: str = "_",
                    root: str = "root", contributions_per_person: int = 1) -> "HierarchicalTable":
        """From a DataFrame with one row per leaf unit: geography columns ``geo`` (outermost first;
        codes as strings -- read them as ``str`` to keep leading zeros) and count columns
        ``counts`` (names or glob patterns, e.g. ``'vap_*,u18_*'``).  ``attributes``: ``None`` (one
        attribute ``cell``), attribute names to parse from the column names at ``sep``
        (``("age", "race")``: ``vap_hisp`` is ``(vap, hisp)``), or a :class:`CellDomain`.  A unit
        may appear once.  Raises :class:`~sparsedp.errors.SparseDPError` on unknown columns, NaN,
        negative or non-integer counts.

        The count columns must **partition the people**: each person is counted in one column of
        their unit (``vap_*`` and ``u18_*``, not also ``total``).  A column that is the sum of
        others (:func:`check_cells_partition` says what is checked) is refused, naming the columns.
        Columns that really overlap are taken with ``contributions_per_person=K``, the most columns
        one person is counted in: the check is then skipped and the release calibrates its noise to
        a person changing ``K`` counts of their unit (recorded in the ledger)."""
        cols = expand_columns(counts, list(frame.columns))
        overlap = set(cols) & set(geo)
        if overlap:
            raise ShapeError(f"{sorted(overlap)} are both geography and count columns")
        cells = _cell_domain(cols, attributes, sep)
        k = check_contributions(contributions_per_person)
        values = _check_count_matrix(frame[list(cells.columns)].to_numpy(), cells.columns)
        if k == 1:
            check_cells_partition(values, cells.columns, sep)
        h, depth, row_unit = _build_hierarchy(frame, geo, cells, root, unique_rows=True)
        return cls.from_leaf_counts(h, depth, row_unit, values, contributions_per_person=k)

    @classmethod
    def from_records(cls, frame: Any, geo: Sequence[str], categories: Sequence[str], *,
                     domain: Mapping[str, Sequence[Any]] | None = None, units: Any = None,
                     root: str = "root", privacy_unit: PrivacyUnit | None = None,
                     drop_missing_units: bool = False, rng: Any = None) -> "HierarchicalTable":
        """From record rows (one per person, or several per person with a ``privacy_unit``):
        geography columns ``geo`` and categorical columns ``categories``, aggregated to counts.
        The category values are ``domain[name]`` or, for a pandas ``Categorical`` column, its
        categories (a value outside them raises).  ``units``: a DataFrame of the geography columns
        listing every unit (public: units without records get zero counts), or ``"observed"`` to
        declare the units present among the records public (they are a function of the data; the
        release description records the choice).

        ``privacy_unit``: whom the release protects when one entity has several records (a
        person's events, a household's members): a :class:`~sparsedp.privacy_unit.PrivacyUnit`
        naming the id column, with ``max_rows`` and/or ``max_groups`` / ``max_rows_per_group``,
        a group being a (leaf unit, cell) pair.  Each entity's records beyond the bounds are
        dropped (:func:`~sparsedp.privacy_unit.truncate`: secret random choice, or reproducible
        from ``rng`` and then not private) before counting, and :func:`~sparsedp.topdown.topdown`
        calibrates the noise to one whole entity.  ``max_rows="auto"`` is resolved first, with
        its share of the budget (:func:`sparsedp.contribution_bound.resolve_unit`).  Records
        without an id are refused unless ``drop_missing_units``.  Without a unit, an
        identifier-like column (``person_id``, ``CustomerID``) draws a one-line warning."""
        pd = _pd()
        cats = [str(c) for c in categories]
        if not cats:
            raise ShapeError("give at least one category column")
        unit = _records_unit(privacy_unit, frame, geo)
        unknown = [c for c in (*geo, *cats) if c not in frame.columns]
        if unknown:
            raise ShapeError(f"unknown column(s) {unknown}; the records have {list(frame.columns)[:30]}")
        values = []
        codes = []
        for c in cats:
            col = frame[c]
            if domain is not None and c in domain:
                vals = list(domain[c])
            elif isinstance(col.dtype, pd.CategoricalDtype):
                vals = list(col.cat.categories)
            else:
                raise ShapeError(f"category {c!r}: give its values (domain={{{c!r}: [...]}}) or make it a pandas "
                                 "Categorical; values seen in the records are a function of the data")
            cat = pd.Categorical(col, categories=vals)
            if (cat.codes < 0).any():
                raise ShapeError(f"category {c!r}: a record's value is not in its domain {vals[:20]}")
            values.append(tuple(str(v) for v in vals))
            codes.append(cat.codes.astype(np.int64))
        sizes = [len(v) for v in values]
        cell = np.ravel_multi_index(tuple(codes), sizes) if codes else np.zeros(len(frame), np.int64)
        labels = ["/".join(str(v[j]) for v, j in zip(values, idx)) for idx in np.ndindex(*sizes)]
        cells = CellDomain(tuple(cats), tuple(values), tuple(labels))
        observed = isinstance(units, str) and units == "observed"
        if units is None:
            raise ShapeError("give units= (a table of every unit's geography codes, public) or units='observed' "
                             "to declare the units present among the records public")
        unit_frame = frame[list(geo)] if observed else units
        missing = [g for g in geo if g not in unit_frame.columns]
        if missing:
            raise ShapeError(f"the units table lacks geography column(s) {missing}")
        unit_frame = _normalised_geo(unit_frame[list(geo)]).drop_duplicates(ignore_index=True)
        h, depth, row_unit = _build_hierarchy(unit_frame, geo, cells, root, unique_rows=True)
        index = pd.MultiIndex.from_frame(unit_frame)
        rec_index = pd.MultiIndex.from_frame(_normalised_geo(frame[list(geo)]))
        at = index.get_indexer(rec_index)
        if (at < 0).any():
            bad = tuple(frame[list(geo)].iloc[int(np.flatnonzero(at < 0)[0])])
            raise ShapeError(f"a record's geography {bad} is not a unit of the units table")
        C = cells.size
        group = at.astype(np.int64) * C + cell  # (leaf unit, cell) of every record
        if unit is not None:  # each entity's records within its bounds, chosen by secret priorities
            keep = truncate(frame[unit.column].to_numpy(), unit, group if unit.grouped else None, rng=rng,
                            drop_missing=drop_missing_units)
            group = group[keep]
        counts = np.bincount(group, minlength=len(unit_frame) * C).reshape(len(unit_frame), C)
        table = cls.from_leaf_counts(h, depth, row_unit, counts.astype(np.int64), observed)
        if unit is None:
            return table
        seeded = rng is not None and not getattr(rng, "secure", False)
        return cls(table.hierarchy, table.counts, observed, 1, unit, seeded)

    def level_frame(self, d: int) -> Any:
        """Level ``d`` as a DataFrame: its codes and one column per cell (SECRET: the true counts)."""
        pd = _pd()
        h = self.hierarchy
        data = {g: p for g, p in zip(h.geo, h.paths(d))} if d else {h.levels[0]: h.codes[0]}
        out = pd.DataFrame(data)
        for j, c in enumerate(h.cells.columns):
            out[c] = self.counts[d][:, j]
        return out


def _records_unit(unit: Any, frame: Any, geo: Sequence[str]) -> PrivacyUnit | None:
    """The declared unit of a records table (``None``: one record), checked before anything is
    read; an identifier-like column with no unit draws a one-line warning."""
    if unit is None or (isinstance(unit, PrivacyUnit) and unit.is_row):
        warn_if_id_like([c for c in frame.columns if c not in set(geo)], None)
        return None
    if not isinstance(unit, PrivacyUnit):
        raise SparseDPError(f"privacy_unit must be a PrivacyUnit, got {type(unit).__name__}")
    if unit.is_auto:
        raise SparseDPError("max_rows='auto' is chosen with a share of the release's budget first: unit, choice, "
                            "budget = sparsedp.contribution_bound.resolve_unit(unit, frame[unit.column], rho=..., "
                            "accountant=...); then build the table with the resolved unit and release with the budget "
                            "left")
    if unit.column not in frame.columns:
        raise ShapeError(f"the privacy unit's column {unit.column!r} is not a column of the records "
                         f"({list(frame.columns)[:30]})")
    return unit


def _unique(a: np.ndarray) -> bool:
    return a.size < 2 or np.unique(a).size == a.size


def _normalised_geo(frame: Any) -> Any:
    """Geography codes as stripped strings, missing codes as ``""``."""
    out = frame.copy()
    for c in out.columns:
        miss = _missing(out[c])
        s = out[c].astype(str).str.strip()
        s[miss] = ""
        out[c] = s
    return out


def read_table(path: str | Path, geo: Sequence[str] | str, counts: Any = None, *, categories: Any = None,
               attributes: Any = None, sep: str = "_", root: str = "root", domain: Any = None,
               units: Any = None, contributions_per_person: int = 1, privacy_unit: PrivacyUnit | None = None,
               drop_missing_units: bool = False, rng: Any = None) -> HierarchicalTable:
    """Read a CSV (``.csv``, ``.csv.gz``, ...) or Parquet (``.parquet``, ``.pq``) table into a
    :class:`HierarchicalTable`: count columns ``counts`` (names or glob patterns) as in
    :meth:`HierarchicalTable.from_counts`, or record rows with ``categories`` as in
    :meth:`HierarchicalTable.from_records`.  Geography columns are read as strings (leading zeros
    kept).  ``contributions_per_person``: for count columns, how many of them one person may be
    counted in (:meth:`HierarchicalTable.from_counts`).  ``privacy_unit``,
    ``drop_missing_units``, ``rng``: for records, whom the release protects and how their records
    are truncated (:meth:`HierarchicalTable.from_records`); a count table has no ids to bound."""
    pd = _pd()
    p = Path(path)
    if not p.is_file():
        raise SparseDPError(f"no such table: {p}")
    geo_cols = [g.strip() for g in geo.split(",")] if isinstance(geo, str) else [str(g) for g in geo]
    parquet = p.suffix.lower() in (".parquet", ".pq")
    if (counts is None) == (categories is None):
        raise ShapeError("give count columns (counts=) or record categories (categories=), one of them")
    try:
        if parquet:
            import pyarrow.parquet as pq

            header = list(pq.read_schema(p).names)
        else:
            header = list(pd.read_csv(p, nrows=0).columns)
    except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
        raise SparseDPError(f"cannot read {p}: {exc}") from exc
    cats = ([c.strip() for c in categories.split(",")] if isinstance(categories, str) else list(categories or []))
    value_cols = expand_columns(counts, [h for h in header if h not in geo_cols]) if counts is not None else cats
    missing = [g for g in geo_cols if g not in header]
    if missing:
        raise ShapeError(f"unknown geography column(s) {missing}; {p.name} has {header[:40]}")
    use = geo_cols + [c for c in value_cols if c not in geo_cols]
    declared = privacy_unit is not None and not privacy_unit.is_row
    if declared and counts is not None:
        raise ShapeError("a privacy unit bounds the records of each entity: give record rows (categories=), not a "
                         "table of counts (which has no ids; overlapping count columns: contributions_per_person)")
    if declared and privacy_unit.column not in use:
        if privacy_unit.column not in header:
            raise ShapeError(f"the privacy unit's column {privacy_unit.column!r} is not a column of {p.name} "
                             f"({header[:40]})")
        use.append(privacy_unit.column)
    if categories is not None and not declared:  # the columns not read, which from_records does not see
        warn_if_id_like([h for h in header if h not in set(use)], None)
    try:
        if parquet:
            frame = pd.read_parquet(p, columns=use)
            for g in geo_cols:
                frame[g] = frame[g].astype("string").astype(object)
        else:
            dtypes = {g: str for g in geo_cols}
            if categories is not None:
                dtypes.update({c: str for c in cats})
                if declared:
                    dtypes[privacy_unit.column] = str  # ids as text; an empty one is missing
            # a geography code is missing only when empty: "NA" may be a code (pandas reads it as NaN)
            na = {g: [""] for g in geo_cols}
            na.update({c: ["", "NA", "N/A", "NaN", "nan", "null", "NULL"] for c in value_cols if c not in geo_cols})
            if declared and privacy_unit.column not in na:
                na[privacy_unit.column] = [""]  # an empty id is a missing one
            frame = pd.read_csv(p, usecols=use, dtype=dtypes, keep_default_na=False, na_values=na)
    except Exception as exc:  # noqa: BLE001
        raise SparseDPError(f"cannot read {p}: {exc}") from exc
    if counts is not None:
        return HierarchicalTable.from_counts(frame, geo_cols, value_cols, attributes=attributes, sep=sep, root=root,
                                             contributions_per_person=contributions_per_person)
    return HierarchicalTable.from_records(frame, geo_cols, cats, domain=domain, units=units, root=root,
                                          privacy_unit=privacy_unit, drop_missing_units=drop_missing_units, rng=rng)
