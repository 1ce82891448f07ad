"""Reading data: a histogram from ``.npy``, CSV or Parquet, directly or by binning records.

* ``.npy``: a 1-D array.  Without ``bins`` it *is* the histogram (non-negative integer counts);
  with ``bins`` it holds one value per record, binned.
* ``.csv``: a header row; ``column`` names the column.  Without ``bins`` the column is the
  histogram (one count per row); with ``bins`` it holds one value per record.
* ``.parquet``: as CSV, read with pandas + pyarrow (the ``io`` extra:
  ``pip install 'sparsedp[io]'``).

``bins = Bins(start, stop, width)`` maps a record value ``v`` to bin ``floor((v - start) / width)``
over ``[start, stop)``; records outside are refused unless ``clip=True`` puts them in the end
bins.  The domain (``start``, ``stop``, ``width``) is public: it must not be derived from the data.
Every failure is a :class:`~sparsedp.errors.SparseDPError` that names the problem (missing file or
column, non-numeric or empty data, values outside the domain).
"""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import NonFiniteInputError, ShapeError, SparseDPError
from .validation import check_counts

__all__ = ["Bins", "read_values", "load_histogram", "bin_records"]


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

    @property
    def count(self) -> int:
        return int(math.ceil((self.stop - self.start) / self.width))


def bin_records(values: np.ndarray, bins: Bins, clip: bool = False) -> np.ndarray:
    """Histogram of record ``values`` on the public ``bins``."""
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise NonFiniteInputError(f"{int(np.count_nonzero(~np.isfinite(v)))} record value(s) are NaN or infinite")
    idx = np.floor((v - bins.start) / bins.width).astype(np.int64)
    outside = (idx < 0) | (idx >= bins.count)
    if np.any(outside):
        if not clip:
            raise SparseDPError(f"{int(outside.sum())} record value(s) lie outside [{bins.start}, {bins.stop}); "
                                "widen the public domain or pass clip=True")
        idx = np.clip(idx, 0, bins.count - 1)
    return np.bincount(idx, minlength=bins.count).astype(np.float64)


def read_values(path: str | Path, column: str | None = None) -> np.ndarray:
    """The numeric values of a ``.npy`` array or of one column of a CSV / Parquet file."""
    p = Path(path)
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(p, allow_pickle=False)
        except ValueError as exc:
            raise SparseDPError(f"cannot read {p}: {exc}") from exc
        if arr.ndim != 1:
            raise ShapeError(f"{p} holds an array of shape {arr.shape}; a 1-D array is needed")
        values = arr
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
    except (TypeError, ValueError) as exc:
        raise SparseDPError(f"{p}: values are not numeric ({exc})") from exc


def _csv_column(p: Path, column: str | None) -> np.ndarray:
    if column is None:
        raise SparseDPError(f"{p.name} is a table: name its column (column=...)")
    with open(p, newline="") as fh:
        reader = csv.DictReader(fh)
        if reader.fieldnames is None:
            raise SparseDPError(f"{p} is empty")
        if column not in reader.fieldnames:
            raise SparseDPError(f"{p} has no column {column!r}; columns: {', '.join(reader.fieldnames)}")
        raw = [row[column] for row in reader]
    out = np.empty(len(raw))
    for i, s in enumerate(raw):
        try:
            out[i] = float(s)
        except (TypeError, ValueError):
            raise SparseDPError(f"{p}: row {i + 2} of column {column!r} is not numeric: {s!r}") from None
    return out


def _parquet_column(p: Path, column: str | None) -> np.ndarray:
    if column is None:
        raise SparseDPError(f"{p.name} is a table: name its column (column=...)")
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("reading Parquet needs pandas and pyarrow: pip install 'sparsedp[io]'") from exc
    try:
        frame = pd.read_parquet(p, columns=[column])
    except ImportError as exc:
        raise SparseDPError("reading Parquet needs pyarrow: pip install 'sparsedp[io]'") from exc
    except (KeyError, ValueError) as exc:
        raise SparseDPError(f"{p}: cannot read column {column!r} ({exc})") from exc
    series = frame[column]
    if not pd.api.types.is_numeric_dtype(series):
        raise SparseDPError(f"{p}: column {column!r} is not numeric (dtype {series.dtype})")
    return series.to_numpy(dtype=np.float64, na_value=np.nan)


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
