"""Records of a CSV / Parquet / ``.npy`` table encoded on a public domain: what ``sparsedp
marginals`` and marginal specs (``sparsedp release``) read.

The domain is public and given, never read from the data: ``sizes`` (columns of integer codes
``0..size-1``) or ``categories`` (``{column: [value, ...]}``); a missing value, a value outside its
list or a code outside its size is refused before anything is measured.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputBoundError, NonFiniteInputError, ShapeError, SparseDPError
from ..io import id_text, load_npy_table, table_columns
from .domain import Domain

__all__ = ["encode_records", "read_records", "read_unit_records"]


def read_records(path: str | Path, columns: list[str]) -> Any:
    """The named columns of a CSV / Parquet file as a DataFrame (CSV values as text), or of an
    ``(n, d)`` ``.npy`` array (``columns`` names its columns in order); every unreadable, empty or
    incomplete file raises :class:`SparseDPError` naming the problem."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("sparsedp marginals reads tables with pandas: pip install 'sparsedp[io]'") from exc
    p = Path(path)
    if not p.is_file():
        raise SparseDPError(f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        arr = load_npy_table(p, len(columns), f"an (n, {len(columns)}) array of codes, one column per --columns name",
                             "codes are not numeric")
        df = pd.DataFrame(arr, columns=columns)
    elif suffix in (".parquet", ".pq"):
        try:
            import pyarrow.parquet as pq

            names = pq.read_schema(p).names
        except ImportError as exc:  # pragma: no cover - the io extra
            raise SparseDPError("reading Parquet needs pyarrow: pip install 'sparsedp[io]'") from exc
        except Exception as exc:  # pyarrow's ArrowInvalid etc.: not a Parquet file
            raise SparseDPError(f"cannot read {p} as Parquet: {exc}") from exc
        _check_columns(p, names, columns)
        df = pd.read_parquet(p, columns=columns)
    elif suffix == ".csv":
        with open(p, newline="") as fh:
            header = next(csv.reader(fh), None)
        if header is None:
            raise SparseDPError(f"{p} is empty")
        _check_columns(p, header, columns)
        df = pd.read_csv(p, usecols=columns, dtype=str, keep_default_na=True)
    else:
        raise SparseDPError(f"unsupported data file {p.name}: use .csv, .parquet or .npy")
    if len(df) == 0:
        raise SparseDPError(f"{p} holds no records")
    return df


def read_unit_records(path: str | Path, columns: list[str], unit: Any) -> tuple[Any, Any]:
    """``(records, unit ids)``: :func:`read_records` of ``columns`` and, with a declared
    :class:`~sparsedp.privacy_unit.PrivacyUnit`, its column as text (``None`` without one; an ``.npy``
    array has no id column and is refused then).  Without a unit, a file with an identifier-like
    column draws an :class:`~sparsedp.privacy_unit.IdColumnWarning`."""
    from ..privacy_unit import warn_if_id_like

    declared = unit is not None and not unit.is_row
    if not declared:
        warn_if_id_like(table_columns(path), None)
        return read_records(path, columns), None
    if Path(path).suffix.lower() == ".npy":
        raise SparseDPError("a .npy array of codes has no unit id column: give a CSV or Parquet file with the "
                            f"privacy unit's column {unit.column!r}")
    extra = [] if unit.column in columns else [unit.column]
    df = read_records(path, columns + extra)
    return df, id_text(df[unit.column])  # as text: the same ids from CSV and Parquet, as every record path


def _check_columns(p: Path, names: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in names]
    if missing:
        raise ShapeError(f"{p} has no column(s) {', '.join(map(repr, missing))}; columns: {', '.join(names)}")


def _text_column(df: Any, columns: list[str]) -> str:
    """The first of ``columns`` that does not read as numbers (its name only: no value is shown)."""
    for c in columns:
        try:
            df[c].astype(float)
        except ValueError:
            return c
    return columns[0]  # pragma: no cover - called only when one of them failed


def encode_records(df: Any, columns: list[str], sizes: list[int] | None, categories: dict | None
                   ) -> tuple[Domain, np.ndarray]:
    """``(domain, codes)``: the records' ``columns`` as integer codes on the public domain
    (``sizes`` or ``categories``, exactly one given)."""
    if categories is not None:
        cats = [list(map(str, categories[c])) for c in columns]
        dom = Domain(columns, [len(c) for c in cats])
        X = np.empty((len(df), len(columns)), dtype=np.int64)
        for j, (c, cs) in enumerate(zip(columns, cats)):
            col = df[c]
            if col.isna().any():
                raise NonFiniteInputError(f"column {c!r} has missing values")
            lookup = {v: k for k, v in enumerate(cs)}
            codes = col.astype(str).map(lookup)
            missing = codes.isna().to_numpy()
            if missing.any():  # the record's position, never its value: the data are private
                raise InputBoundError(f"column {c!r}: record {int(np.flatnonzero(missing)[0])} holds a value not "
                                      f"among its {len(cs)} categories")
            X[:, j] = codes.to_numpy(dtype=np.int64)
        return dom, X
    dom = Domain(columns, sizes)
    try:
        X = df[columns].astype(float).to_numpy()
    except ValueError:
        raise ShapeError(f"sizes need integer codes in the columns; column {_text_column(df, columns)!r} is not numeric: "
                         "text where numbers are expected") from None
    return dom, dom.encode(X)  # NaN, fractional or out-of-domain codes: refused here, before any release
