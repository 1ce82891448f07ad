"""Reading data: a histogram from ``.npy``, CSV or Parquet, directly or by binning records.

* ``.npy``: a 1-D array of real numbers (an integer or floating dtype: complex, bool, text,
  dates and objects are refused, never cast).  Without ``bins`` it *is* the histogram
  (non-negative integer counts); with ``bins`` it holds one value per record, binned.
* ``.csv``: a header row; ``column`` names the column.  Without ``bins`` the column is the
  histogram (one count per row); with ``bins`` it holds one value per record.  Parsed by pandas
  when it is installed (fast), else by the standard library's ``csv`` (same results and errors).
* ``.parquet``: as CSV, read with pandas + pyarrow (the ``io`` extra:
  ``pip install 'sparsedp[io]'``).

``bins = Bins(start, stop, width)`` maps a record value ``v`` to bin ``floor((v - start) / width)``
over ``[start, stop)``; records outside are refused unless ``clip=True`` puts them in the end
bins.  The domain (``start``, ``stop``, ``width``) is public: it must not be derived from the data.
It has at most :data:`MAX_BINS` ``= 2^31`` bins (more raise
:class:`~sparsedp.errors.InputBoundError` before anything is allocated).
Every failure is a :class:`~sparsedp.errors.SparseDPError` that names the problem (missing file or
column, non-numeric or empty data, values outside the domain).

A matrix of observed entries (:func:`load_entries`, for matrix completion) is read from records
``(row, column, value)``: the named columns of a CSV / Parquet file, the arrays of an ``.npz``
(or a scipy.sparse matrix saved with ``scipy.sparse.save_npz``, its stored entries the
observations), or a 2-D ``.npy`` array whose ``NaN`` entries are the unobserved ones.
"""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import scipy.sparse as sp

from .errors import InputBoundError, NonFiniteInputError, ShapeError, SparseDPError
from .validation import check_counts

__all__ = ["Bins", "load_npy", "read_values", "read_columns", "read_id_column", "table_columns", "id_text", "load_histogram", "load_entries", "bin_records", "bin_indices"]

#: Largest number of bins of a public domain (:class:`Bins`).  A histogram of ``2^31`` bins already
#: takes 16 GiB of float64; a larger count (``--bins 0 1e13 1``) is a mistake, refused with
#: :class:`~sparsedp.errors.InputBoundError` instead of failing in the allocation.
MAX_BINS: int = 2**31


@dataclass(frozen=True)
class Bins:
    """A public binning of record values: ``[start, stop)`` in bins of ``width``."""

    start: float
    stop: float
    width: float = 1.0

    def __post_init__(self) -> None:
        for name in ("start", "stop", "width"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise SparseDPError(f"bins.{name} must be a finite number, got {v!r}")
        if self.width <= 0 or self.stop <= self.start:
            raise SparseDPError(f"bins need stop > start and width > 0, got {self}")
        ratio = (self.stop - self.start) / self.width  # float: inf for a domain wider than 10^308
        if not ratio <= MAX_BINS:  # checked before any histogram of that many bins is allocated
            many = f"{math.ceil(ratio)}" if math.isfinite(ratio) else "more than 10^308"
            raise InputBoundError(f"bins [{self.start}, {self.stop}) of width {self.width} make {many} bins; at most "
                                  f"{MAX_BINS} (2^31) bins are supported")

    @property
    def count(self) -> int:
        return int(math.ceil((self.stop - self.start) / self.width))


def _first_index(mask: np.ndarray) -> int:
    """The index of the first true entry: an error names where a bad record is, never its value."""
    return int(np.argmax(mask))


def bin_records(values: np.ndarray, bins: Bins, clip: bool = False) -> np.ndarray:
    """Histogram of record ``values`` on the public ``bins``."""
    return np.bincount(bin_indices(values, bins, clip), minlength=bins.count).astype(np.float64)


def bin_indices(values: np.ndarray, bins: Bins, clip: bool = False) -> np.ndarray:
    """The bin (int64) of every record value on the public ``bins``, by :func:`bin_records`' rule:
    NaN / infinite values raise :class:`~sparsedp.errors.NonFiniteInputError`, values outside
    ``[start, stop)`` raise :class:`~sparsedp.errors.SparseDPError` unless ``clip`` puts them in the
    end bins (for binning records a part at a time, e.g. :mod:`sparsedp.scaleout.records`)."""
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if not finite.all():
        raise NonFiniteInputError(f"record values are NaN or infinite (the first: record {_first_index(~finite)})")
    f = np.floor((v - bins.start) / bins.width)  # float: a huge value cannot wrap around in int64
    outside = (f < 0) | (f >= bins.count)
    if np.any(outside):
        if not clip:
            raise SparseDPError(f"record values lie outside [{bins.start}, {bins.stop}) (the first: record "
                                f"{_first_index(outside)}); widen the public domain or pass clip=True")
        f = np.clip(f, 0, bins.count - 1)
    return f.astype(np.int64)


def load_npy(path: str | Path) -> np.ndarray:
    """The array in a ``.npy`` file (no pickled objects); an unreadable file raises
    :class:`SparseDPError` naming it.  The callers check its shape and type."""
    p = Path(path)
    try:
        return np.load(p, allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise SparseDPError(f"cannot read {p}: {exc}") from exc


def check_real_dtype(arr: np.ndarray, path: str | Path, what: str = "values are not real numbers") -> np.ndarray:
    """``arr`` if its dtype is an integer or floating one; else :class:`SparseDPError` naming
    ``path``, ``what`` and the dtype (a complex array is never cast: that would drop its imaginary
    part; bool, text, bytes, dates, time spans and objects are not counts or record values)."""
    if arr.dtype.kind not in "iuf":  # signed, unsigned integers, floats (timedelta64 is an integer subclass: 'm')
        raise SparseDPError(f"{path}: {what} (dtype {arr.dtype}; integer or floating values are needed)")
    return arr


def load_npy_table(path: str | Path, ncols: int, need: str, what: str) -> np.ndarray:
    """A 2-D ``.npy`` array with ``ncols`` columns of real numbers (integer or floating; no bool,
    no complex), as :func:`load_npy` reads it.  A wrong shape raises :class:`ShapeError` saying
    ``need`` ("a (days, 5) array of ... is needed"); another dtype raises :class:`SparseDPError`
    with ``what`` ("sales are not real numbers")."""
    p = Path(path)
    arr = load_npy(p)
    if arr.ndim != 2 or arr.shape[1] != ncols:
        raise ShapeError(f"{p} holds an array of shape {arr.shape}; {need} is needed")
    return check_real_dtype(arr, p, what)


def read_values(path: str | Path, column: str | None = None) -> np.ndarray:
    """The numeric values of a ``.npy`` array or of one column of a CSV / Parquet file."""
    p = Path(path)
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        arr = load_npy(p)
        if arr.ndim != 1:
            raise ShapeError(f"{p} holds an array of shape {arr.shape}; a 1-D array is needed")
        values = check_real_dtype(arr, p)
    elif suffix == ".csv":
        values = _csv_column(p, column)
    elif suffix in (".parquet", ".pq"):
        values = _parquet_column(p, column)
    else:
        raise SparseDPError(f"unsupported data file {p.name}: use .npy, .csv or .parquet")
    if values.size == 0:
        raise SparseDPError(f"{p} holds no values")
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise SparseDPError(f"{p}: values are not numeric") from None  # the parser's message would quote one


def _csv_column(p: Path, column: str | None) -> np.ndarray:
    if column is None:
        raise SparseDPError(f"{p.name} is a table: name its column (column=...)")
    return _csv_columns(p, [column])[column]


def _csv_columns(p: Path, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The columns of a CSV file as float64: parsed by pandas when it is installed (the ``io``
    extra; 35x faster on a million rows), else by the standard library; a column pandas cannot
    read as numbers is re-checked value by value, so both paths accept and refuse the same text."""
    with open(p, newline="") as fh:
        header = next(csv.reader(fh), None)
    if header is None:
        raise SparseDPError(f"{p} is empty")
    for column in columns:
        if column not in header:
            raise SparseDPError(f"{p} has no column {column!r}; columns: {', '.join(header)}")
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - the io extra
        pd = None
    raw: dict[str, Any]
    if pd is not None and len(set(header)) == len(header):
        frame = pd.read_csv(p, usecols=list(dict.fromkeys(columns)), na_filter=False)
        raw = {c: frame[c] for c in columns}
        fast = {c: pd.api.types.is_float_dtype(v.dtype) or pd.api.types.is_integer_dtype(v.dtype) for c, v in raw.items()}
    else:
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
        raw = {c: [row[c] for row in rows] for c in columns}
        fast = dict.fromkeys(columns, False)
    out = {}
    for column in columns:
        if fast[column]:
            out[column] = raw[column].to_numpy(dtype=np.float64)
            continue
        texts = list(raw[column])
        values = np.empty(len(texts))
        for i, text in enumerate(texts):
            try:
                values[i] = float(text)
            except (TypeError, ValueError):
                raise SparseDPError(f"{p}: row {i + 2} of column {column!r} is not numeric: text where numbers are "
                                    "expected") from None  # its position, never its value: the data are private
        out[column] = values
    return out


def _parquet_column(p: Path, column: str | None) -> np.ndarray:
    if column is None:
        raise SparseDPError(f"{p.name} is a table: name its column (column=...)")
    return _parquet_columns(p, [column])[column]


def _parquet_columns(p: Path, columns: Sequence[str]) -> dict[str, np.ndarray]:
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("reading Parquet needs pandas and pyarrow: pip install 'sparsedp[io]'") from exc
    try:
        frame = pd.read_parquet(p, columns=list(columns))
    except ImportError as exc:
        raise SparseDPError("reading Parquet needs pyarrow: pip install 'sparsedp[io]'") from exc
    except (KeyError, ValueError) as exc:
        raise SparseDPError(f"{p}: cannot read column(s) {', '.join(map(repr, columns))} ({exc})") from exc
    out = {}
    for column in columns:
        series = frame[column]
        if (not pd.api.types.is_numeric_dtype(series) or pd.api.types.is_bool_dtype(series)
                or pd.api.types.is_complex_dtype(series)):
            raise SparseDPError(f"{p}: column {column!r} is not numeric (dtype {series.dtype})")
        out[column] = series.to_numpy(dtype=np.float64, na_value=np.nan)
    return out


def read_columns(path: str | Path, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The numeric values of several columns of a CSV / Parquet file (float64, one per row, in
    order; a missing Parquet value is ``NaN``).  Missing file or column, non-numeric values and a
    file without rows raise :class:`~sparsedp.errors.SparseDPError`."""
    p = Path(path)
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    cols = list(columns)
    if not cols or not all(isinstance(c, str) for c in cols):
        raise SparseDPError(f"columns must be a non-empty list of column names, got {columns!r}")
    suffix = p.suffix.lower()
    if suffix == ".csv":
        out = _csv_columns(p, cols)
    elif suffix in (".parquet", ".pq"):
        out = _parquet_columns(p, cols)
    else:
        raise SparseDPError(f"unsupported table {p.name}: use .csv or .parquet")
    if out[cols[0]].size == 0:
        raise SparseDPError(f"{p} holds no values")
    return out


def table_columns(path: str | Path) -> list[str]:
    """The column names of a CSV header or a Parquet schema (nothing else is read): to warn when an
    identifier-like column is present and no privacy unit is declared."""
    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq

            return list(pq.ParquetFile(str(p)).schema_arrow.names)
        except Exception:  # noqa: BLE001 - the reader reports a bad file itself
            return []
    if p.suffix.lower() == ".csv" and p.is_file():
        with open(p, newline="") as fh:
            return list(next(csv.reader(fh), None) or [])
    return []


def id_text(values: Any) -> np.ndarray:
    """Unit ids as text (an object array of ``str``; a missing id -- empty text, ``None``, ``NaN``
    -- is ``None``): the same id reads the same from CSV text and from a typed Parquet column, so
    that every path truncates the same rows."""
    import pandas as pd

    s = pd.Series(np.asarray(values, dtype=object) if not isinstance(values, pd.Series) else values)
    missing = s.isna().to_numpy() | (s.astype(str) == "").to_numpy()
    if pd.api.types.is_float_dtype(s.dtype):  # 7.0 (a float column with gaps) reads as 7, as in CSV text
        v = s.fillna(0).to_numpy(dtype=np.float64)
        whole = ~missing & (np.abs(v) < 2.0**53) & (np.floor(v) == v)  # exact integers only: no two ids merge
        text = np.where(whole, np.where(whole, v, 0).astype(np.int64).astype(str), s.astype(str).to_numpy())
    else:
        text = s.astype(str).to_numpy()
    out = text.astype(object)
    out[missing] = None
    return out


def read_id_column(path: str | Path, column: str) -> np.ndarray:
    """Every row's privacy-unit id from a CSV / Parquet file, as text (:func:`id_text`; a missing
    id is ``None``).  A missing file or column raises :class:`~sparsedp.errors.SparseDPError`
    naming it (never a value)."""
    p = Path(path)
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    if not isinstance(column, str) or not column:
        raise SparseDPError(f"the privacy unit's column must be a column name, got {column!r}")
    names = table_columns(p)
    if p.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise SparseDPError(f"unsupported table {p.name}: the privacy unit's column is read from .csv or .parquet")
    if column not in names:
        raise SparseDPError(f"{p} has no column {column!r} (the privacy unit); columns: {', '.join(names)}")
    import pandas as pd

    try:
        if p.suffix.lower() == ".csv":
            series = pd.read_csv(p, usecols=[column], dtype=str, keep_default_na=False)[column]
        else:
            series = pd.read_parquet(p, columns=[column])[column]
    except Exception as exc:  # noqa: BLE001 - any reader failure is the user's file
        raise SparseDPError(f"cannot read the privacy unit's column {column!r} of {p}") from exc
    return id_text(series)


def load_histogram(path: str | Path, column: str | None = None, bins: Bins | None = None,
                   clip: bool = False) -> np.ndarray:
    """A histogram of counts from a file: the values themselves (no ``bins``), or the records binned."""
    values = read_values(path, column)
    if bins is not None:
        return bin_records(values, bins, clip)
    return check_counts(values, name=f"counts in {Path(path).name}")


def as_bins(spec: Any) -> Bins | None:
    """A :class:`Bins` from a mapping ``{start, stop, width}`` (``None`` stays ``None``)."""
    if spec is None or isinstance(spec, Bins):
        return spec
    try:
        return Bins(**dict(spec))
    except TypeError as exc:
        raise SparseDPError(f"bins must have start, stop and optionally width: {exc}") from exc


def load_entries(
    path: str | Path,
    row: str = "row",
    col: str = "col",
    value: str = "value",
    shape: tuple[int, int] | None = None,
) -> sp.csr_matrix:
    """A sparse matrix whose stored entries are the observed ``(row, col, value)`` records of a file.

    * ``.csv`` / ``.parquet``: the columns named ``row``, ``col`` and ``value``, one record a line;
    * ``.npz``: a scipy.sparse matrix (``scipy.sparse.save_npz``; its stored entries, explicit
      zeros included), or arrays named ``row``, ``col``, ``value`` (``numpy.savez``);
    * ``.npy``: a 2-D float array; its ``NaN`` entries are unobserved, every other entry observed.

    Indices are 0-based integers; ``shape`` (default: the largest indices + 1; the pattern of
    observed entries is public in :mod:`sparsedp.completion`'s privacy model) bounds them.  A
    missing column, non-numeric, missing or infinite values, fractional, negative or out-of-range
    indices, a repeated ``(row, col)`` pair or no record at all raise
    :class:`~sparsedp.errors.SparseDPError`.  Values are not clipped here: a privacy mechanism
    clips them to its own public bounds.
    """
    p = Path(path)
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix in (".csv", ".parquet", ".pq"):
        cols = read_columns(p, [row, col, value])
        r, c, v = cols[row], cols[col], cols[value]
    elif suffix == ".npz":
        r, c, v, stored_shape = _npz_entries(p, row, col, value)
        if stored_shape is not None:
            shape = _check_shape(p, shape if shape is not None else stored_shape)
            if shape != stored_shape:
                raise ShapeError(f"{p} holds a {stored_shape[0]} x {stored_shape[1]} matrix, not {shape[0]} x {shape[1]}")
    elif suffix == ".npy":
        arr = load_npy(p)
        if arr.ndim != 2:
            raise ShapeError(f"{p} holds an array of shape {arr.shape}; a 2-D matrix (NaN = unobserved) is needed")
        if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
            raise SparseDPError(f"{p}: values are not real numbers (dtype {arr.dtype})")
        arr = arr.astype(np.float64, copy=False)
        if shape is not None and tuple(shape) != arr.shape:
            raise ShapeError(f"{p} holds a {arr.shape[0]} x {arr.shape[1]} matrix, not {shape[0]} x {shape[1]}")
        shape = arr.shape
        r, c = np.nonzero(~np.isnan(arr))
        v = arr[r, c]
        if np.any(np.isinf(v)):
            raise NonFiniteInputError(f"{p}: entries are infinite (NaN marks unobserved; the first: row "
                                      f"{int(r[np.isinf(v)][0])}, column {int(c[np.isinf(v)][0])})")
    else:
        raise SparseDPError(f"unsupported data file {p.name}: use .csv, .parquet, .npz or .npy")
    return _entries_matrix(p, r, c, v, shape, (row, col, value))


def _npz_entries(p: Path, row: str, col: str, value: str) -> tuple[Any, Any, Any, tuple[int, int] | None]:
    try:
        with np.load(p, allow_pickle=False) as z:
            names = set(z.files)
            if "format" in names:  # scipy.sparse.save_npz
                m = sp.load_npz(p).tocoo()
                return m.row, m.col, m.data, (int(m.shape[0]), int(m.shape[1]))
            missing = [n for n in (row, col, value) if n not in names]
            if missing:
                raise SparseDPError(f"{p} is neither a scipy.sparse matrix nor arrays {row!r}, {col!r}, {value!r} "
                                    f"(missing {', '.join(map(repr, missing))}; it holds {', '.join(sorted(names))})")
            arrays = [np.asarray(z[n]) for n in (row, col, value)]
    except (ValueError, OSError) as exc:
        raise SparseDPError(f"cannot read {p}: {exc}") from exc
    for name, a in zip((row, col, value), arrays):
        if a.ndim != 1:
            raise ShapeError(f"{p}: array {name!r} has shape {a.shape}; 1-D arrays of records are needed")
        if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
            raise SparseDPError(f"{p}: array {name!r} is not numeric (dtype {a.dtype})")
    if not arrays[0].size == arrays[1].size == arrays[2].size:
        raise ShapeError(f"{p}: arrays {row!r}, {col!r}, {value!r} differ in length")
    return arrays[0], arrays[1], arrays[2], None


def _check_shape(p: Path, shape: Any) -> tuple[int, int]:
    try:
        m, n = (int(s) for s in shape)
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"shape must be two integers, got {shape!r}") from exc
    if m < 1 or n < 1 or (m, n) != tuple(shape):
        raise ShapeError(f"shape must be two positive integers, got {shape!r}")
    return m, n


def _entries_matrix(p: Path, r: Any, c: Any, v: Any, shape: Any, names: tuple[str, str, str]) -> sp.csr_matrix:
    r, c, v = (np.asarray(a, dtype=np.float64) for a in (r, c, v))
    if v.size == 0:
        raise SparseDPError(f"{p} holds no observed entries")
    for a, name in ((r, names[0]), (c, names[1]), (v, names[2])):
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise NonFiniteInputError(f"{p}: values of {name!r} are missing, NaN or infinite "
                                      f"(first: record {int(bad[0]) + 1})")
    for a, name in ((r, names[0]), (c, names[1])):
        bad = np.flatnonzero((a < 0) | (a != np.floor(a)))
        if bad.size:
            raise ShapeError(f"{p}: {name!r} must hold 0-based integer indices; record {int(bad[0]) + 1} has "
                             f"{float(a[bad[0]])!r}")
    ri, ci = r.astype(np.int64), c.astype(np.int64)
    if shape is None:
        shape = (int(ri.max()) + 1, int(ci.max()) + 1)
    m, n = _check_shape(p, shape)
    for a, bound, name in ((ri, m, names[0]), (ci, n, names[1])):
        bad = np.flatnonzero(a >= bound)
        if bad.size:
            raise ShapeError(f"{p}: {bad.size} index(es) of {name!r} are outside the {m} x {n} matrix "
                             f"(first: record {int(bad[0]) + 1}, {int(a[bad[0]])})")
    key = ri * n + ci
    if np.unique(key).size != key.size:
        order = np.argsort(key, kind="stable")
        dup = order[1:][np.diff(key[order]) == 0][0]
        raise ShapeError(f"{p}: entry ({int(ri[dup])}, {int(ci[dup])}) is observed more than once "
                         f"(record {int(dup) + 1}); give one value per entry")
    return sp.csr_matrix((v, (ri, ci)), shape=(m, n))
