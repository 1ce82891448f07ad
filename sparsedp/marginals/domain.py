"""Product domains: named attributes with finite sizes, and records encoded as integer codes.

A :class:`Domain` ``(names, sizes)`` is the set of all records ``(v_1, ..., v_d)`` with
``0 <= v_i < sizes[i]``; its size ``prod(sizes)`` can be astronomically large (20 attributes of
size 10: 10^20 cells), so nothing here ever enumerates it.  A *marginal* on a set of attributes
``S`` is the table of counts of the records' values on ``S`` (shape ``sizes[S]``).

Neighbouring data sets (the privacy unit of :mod:`sparsedp.marginals`): add or remove one record.
This changes every marginal table by one unit in exactly one cell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import InputBoundError, NonFiniteInputError, ShapeError, SparseDPError

__all__ = ["Domain", "requested_names"]


@dataclass(frozen=True)
class Domain:
    """Attributes ``names`` with ``sizes`` (each ``>= 1``); ``Domain(("a", "b"), (3, 4))``."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    def __init__(self, names: Iterable[str], sizes: Iterable[int]) -> None:
        names_t = tuple(str(n) for n in names)
        try:
            sizes_t = tuple(int(s) for s in sizes)
        except (TypeError, ValueError) as exc:
            raise ShapeError(f"domain sizes must be integers: {exc}") from exc
        if len(names_t) != len(sizes_t):
            raise ShapeError(f"{len(names_t)} names but {len(sizes_t)} sizes")
        if len(set(names_t)) != len(names_t):
            raise ShapeError("attribute names must be distinct")
        if any(s < 1 for s in sizes_t):
            raise ShapeError(f"attribute sizes must be >= 1, got {sizes_t}")
        object.__setattr__(self, "names", names_t)
        object.__setattr__(self, "sizes", sizes_t)

    @classmethod
    def uniform(cls, d: int, size: int, prefix: str = "a") -> "Domain":
        """``d`` attributes ``a0, a1, ...`` of one ``size``."""
        return cls([f"{prefix}{i}" for i in range(int(d))], [int(size)] * int(d))

    def __len__(self) -> int:
        return len(self.names)

    @property
    def size(self) -> int:
        """Number of cells ``prod(sizes)`` (a Python int: may exceed 2^63)."""
        return math.prod(self.sizes)

    def axes(self, attrs: Any) -> tuple[int, ...]:
        """Sorted attribute indices of ``attrs`` (names or indices; duplicates and unknowns raise)."""
        if type(attrs) is tuple:  # fast path: already strictly increasing in-range ints
            prev, d = -1, len(self.names)
            for a in attrs:
                if type(a) is not int or not prev < a < d:
                    break
                prev = a
            else:
                return attrs
        if isinstance(attrs, (str, int, np.integer)):
            attrs = (attrs,)
        out = []
        for a in attrs:
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                i = int(a)
                if not 0 <= i < len(self.names):
                    raise ShapeError(f"attribute index {i} outside 0..{len(self.names) - 1}")
            elif isinstance(a, str) and a in self.names:
                i = self.names.index(a)
            else:
                raise ShapeError(f"unknown attribute {a!r}; the domain has {self.names}")
            out.append(i)
        if len(set(out)) != len(out):
            raise ShapeError(f"repeated attribute in {tuple(attrs)!r}")
        return tuple(sorted(out))

    def shape(self, axes: Sequence[int]) -> tuple[int, ...]:
        """Table shape of the marginal on ``axes``."""
        return tuple(self.sizes[i] for i in axes)

    def project(self, attrs: Any) -> "Domain":
        """The sub-domain on ``attrs``."""
        ax = self.axes(attrs)
        return Domain([self.names[i] for i in ax], [self.sizes[i] for i in ax])

    def encode(self, records: Any) -> np.ndarray:
        """Records as an ``(n, d)`` integer array of codes ``0 <= v < size``, checked.

        ``records``: an ``(n, d)`` integer (or integral float) array in the domain's attribute order;
        a numpy structured array or a pandas DataFrame with a column per attribute name (integer
        codes, or a pandas ``Categorical`` whose categories number at most the attribute's size).
        Raises :class:`ShapeError` (wrong shape, missing column), :class:`NonFiniteInputError` (NaN,
        missing category) or :class:`InputBoundError` (a code outside ``0..size-1``); the array
        returned is ``int64`` (``uint8`` / ``uint16`` when every size fits, to save memory).
        """
        cols = _columns(self, records)
        X = _as_codes(cols, self)
        return X


def _columns(dom: Domain, records: Any) -> Any:
    """``records`` as a 2-D array or a list of 1-D columns in the domain's order."""
    if hasattr(records, "columns") and hasattr(records, "iloc"):  # a pandas DataFrame
        missing = [n for n in dom.names if n not in records.columns]
        if missing:
            raise ShapeError(f"records lack the column(s) {missing}")
        out = []
        for n, s in zip(dom.names, dom.sizes):
            col = records[n]
            if str(col.dtype) == "category":
                if len(col.cat.categories) > s:
                    raise InputBoundError(f"column {n!r} has {len(col.cat.categories)} categories, the domain {s}")
                codes = np.asarray(col.cat.codes)
                if np.any(codes < 0):
                    raise NonFiniteInputError(f"column {n!r} has missing values")
                out.append(codes)
            else:
                out.append(np.asarray(col))
        return out
    arr = np.asarray(records)
    if arr.dtype.names is not None:
        missing = [n for n in dom.names if n not in arr.dtype.names]
        if missing:
            raise ShapeError(f"records lack the field(s) {missing}")
        if arr.ndim != 1:
            raise ShapeError(f"a structured record array must be 1-D, got shape {arr.shape}")
        return [np.asarray(arr[n]) for n in dom.names]
    if arr.ndim != 2 or arr.shape[1] != len(dom.names):
        raise ShapeError(f"records must have shape (n, {len(dom.names)}), got {arr.shape}")
    return arr


def _as_codes(cols: Any, dom: Domain) -> np.ndarray:
    if isinstance(cols, list):
        n = {c.shape for c in cols}
        if len(n) != 1 or len(next(iter(n))) != 1:
            raise ShapeError("record columns must be 1-D and of one length")
        checked = [_check_column(c, dom.names[i], dom.sizes[i]) for i, c in enumerate(cols)]
        dt = _dtype(dom.sizes)
        X = np.empty((checked[0].shape[0], len(cols)), dtype=dt)
        for i, c in enumerate(checked):
            X[:, i] = c
        return X
    arr = cols
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise NonFiniteInputError("records contain NaN or infinite values")
        if np.any(arr != np.round(arr)):
            raise InputBoundError("records must hold integer codes")
    elif arr.dtype.kind not in "iub":
        raise ShapeError(f"records must be integer codes, got dtype {arr.dtype}")
    if arr.shape[0]:
        lo = arr.min(axis=0)
        hi = arr.max(axis=0)
        bad = [i for i in range(arr.shape[1]) if lo[i] < 0 or hi[i] >= dom.sizes[i]]
        if bad:
            i = bad[0]
            row = int(np.flatnonzero((arr[:, i] < 0) | (arr[:, i] >= dom.sizes[i]))[0])
            raise InputBoundError(f"attribute {dom.names[i]!r} has a code outside 0..{dom.sizes[i] - 1} "
                                  f"(the first in record {row})")
    dt = _dtype(dom.sizes)
    return arr if arr.dtype == dt else arr.astype(dt)


def _check_column(c: np.ndarray, name: str, size: int) -> np.ndarray:
    if c.dtype.kind == "f":
        if not np.all(np.isfinite(c)):
            raise NonFiniteInputError(f"column {name!r} contains NaN or infinite values")
        if np.any(c != np.round(c)):
            raise InputBoundError(f"column {name!r} must hold integer codes")
    elif c.dtype.kind not in "iub":
        raise SparseDPError(f"column {name!r} must hold integer codes (or be a pandas Categorical), got {c.dtype}")
    if c.size and (c.min() < 0 or c.max() >= size):
        row = int(np.flatnonzero((c < 0) | (c >= size))[0])
        raise InputBoundError(f"column {name!r} has a code outside 0..{size - 1} (the first in record {row})")
    return c


def _dtype(sizes: Sequence[int]) -> np.dtype:
    m = max(sizes) if sizes else 1
    return np.dtype(np.uint8 if m <= 256 else np.uint16 if m <= 65536 else np.int64)


def requested_names(domain: Domain, marginals: Any) -> tuple[tuple[str, ...], ...]:
    """The marginals as the user named them: attribute names in the order given, marginals in the
    order given (checked by :meth:`Domain.axes`); ``()`` for what is not a list of marginals
    (the caller's own check refuses it).  Give a list, not a one-shot iterator."""
    if isinstance(marginals, (str, bytes)) or not hasattr(marginals, "__iter__"):
        return ()
    out = []
    for m in marginals:
        domain.axes(m)  # unknown names and duplicates raise
        items = (m,) if isinstance(m, (str, int, np.integer)) else tuple(m)
        out.append(tuple(domain.names[int(a)] if isinstance(a, (int, np.integer)) and not isinstance(a, bool)
                         else str(a) for a in items))
    return tuple(out)
