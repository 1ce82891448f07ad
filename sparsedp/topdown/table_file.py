"""A TopDown release written as a table (``.csv`` / ``.parquet``) with its release record.

``sparsedp topdown ... --out units.parquet`` writes the published table -- one row per
geographic unit: its level, depth, codes and one column per cell -- and the release record
(ledger, parameters, the hierarchy's levels and cells) in ``units.parquet.release.json``.
:func:`load_table_release` reads the pair back as a release of the common model
(:class:`~sparsedp.releases.ReleaseResult`, kind ``"topdown"``): one answer per (unit, cell),
what ``sparsedp.load_release``, ``sparsedp ledger`` and ``sparsedp query`` use.  The codes are
read as text (leading zeros kept).  The table holds the published counts only: the variances
stay in the ``.npz`` release file (``variances`` is ``None`` here).

A unit's full code (the table's ``code`` column, :func:`full_codes`) is its own code and its
ancestors', outermost first, joined by ``/`` (:data:`CODE_SEP`): state ``55``, county ``025``,
district ``000150`` give ``55/025/000150``.  A plain concatenation (``55025000150``, a Census
GEOID) is ambiguous when the codes of a level differ in width (``1`` + ``23`` and ``12`` + ``3``
both give ``123``); with the separator every path has its own full code.  A ``/`` or ``\\``
inside a code is written ``\\/`` or ``\\\\`` (a backslash escapes the next character), so any
code is allowed and :func:`split_full_code` gives the path back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import SparseDPError
from ..releases import AxisLabel, ReleaseResult, register_reader

__all__ = ["CODE_SEP", "full_codes", "load_table_release", "split_full_code"]

#: joins the codes of a unit's path into its full code (outermost first)
CODE_SEP = "/"
#: escapes a ``CODE_SEP`` or itself inside a code
CODE_ESCAPE = "\\"


def _escaped(codes: Any) -> np.ndarray:
    """``codes`` as text with every :data:`CODE_ESCAPE` and :data:`CODE_SEP` preceded by
    :data:`CODE_ESCAPE` (the escape first, so that the two never mix), vectorised."""
    text = np.asarray(codes).astype(str)
    text = np.char.replace(text, CODE_ESCAPE, CODE_ESCAPE + CODE_ESCAPE)
    return np.char.replace(text, CODE_SEP, CODE_ESCAPE + CODE_SEP)


def full_codes(hierarchy: Any) -> np.ndarray:
    """Every unit's full code (module doc), units level by level as in
    :meth:`~sparsedp.topdown.Hierarchy.unit_frame` (root first): an object array of text,
    ``None`` for the root.  Level by level, ``full[d] = full[d - 1][parent] + "/" + escaped code``
    (``O(units)`` string operations, no loop over units)."""
    h = hierarchy
    out: list[np.ndarray] = [np.array([None], dtype=object)]
    prev = np.zeros(0, dtype=str)
    for d in range(1, h.depth + 1):
        own = _escaped(h.codes[d])
        cur = own if d == 1 else np.char.add(np.char.add(prev[np.asarray(h.parents[d], dtype=np.int64)], CODE_SEP),
                                             own)
        out.append(cur.astype(object))
        prev = cur
    return np.concatenate(out)


def split_full_code(code: str) -> tuple[str, ...]:
    """The codes of the path a full code names, outermost first (the inverse of
    :func:`full_codes`: a :data:`CODE_ESCAPE` keeps the next character, an unescaped
    :data:`CODE_SEP` ends a code).  A code ending in a lone escape raises
    :class:`~sparsedp.errors.SparseDPError`."""
    if not isinstance(code, str):
        raise SparseDPError(f"a full code is text, got {code!r}")
    parts, cur, i = [], [], 0
    while i < len(code):
        ch = code[i]
        if ch == CODE_ESCAPE:
            if i + 1 == len(code):
                raise SparseDPError(f"the full code {code!r} ends in a lone {CODE_ESCAPE!r}")
            cur.append(code[i + 1])
            i += 2
            continue
        if ch == CODE_SEP:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return tuple(parts)



class _UnitTable:
    """The published table, as ``ReleaseResult.to_pandas()`` gives it (a copy each call)."""

    def __init__(self, frame: Any) -> None:
        self._frame = frame

    def unit_table(self) -> Any:
        return self._frame.copy()


def _read(path: Path, cells: list[str]) -> Any:
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - the io extra
        raise SparseDPError("reading a table release needs pandas: pip install 'sparsedp[io]'") from exc
    try:
        if path.suffix.lower() == ".csv":
            head = pd.read_csv(path, nrows=0)
            numbers = {*cells, "depth", "unit_total" if "total" in cells else "total"}
            text = {c: str for c in head.columns if c not in numbers}  # codes as text: leading zeros kept
            return pd.read_csv(path, dtype=text, keep_default_na=False, na_values={c: [""] for c in cells})
        return pd.read_parquet(path)
    except (OSError, ValueError, ImportError) as exc:
        raise SparseDPError(f"cannot read the table {path.name}: {exc}") from exc


def load_table_release(path: str | Path, meta: Mapping[str, Any]) -> ReleaseResult:
    """The TopDown table at ``path`` and its release record ``meta`` (the parsed
    ``PATH.release.json``) as a :class:`~sparsedp.releases.ReleaseResult` (module doc).  A table
    whose cell columns are missing, not integers or negative raises
    :class:`~sparsedp.errors.SparseDPError`."""
    p = Path(path)
    desc = dict(meta.get("description") or {})
    hier = desc.get("hierarchy") or {}
    cells = [str(c) for c in hier.get("cells") or ()]
    if meta.get("kind") != "topdown" or not cells:
        raise SparseDPError(f"{p.name}.release.json is not the record of a TopDown table (no kind 'topdown' with cells)")
    frame = _read(p, cells)
    missing = [c for c in cells if c not in frame.columns]
    if missing:
        raise SparseDPError(f"{p.name} lacks the cell column(s) {missing[:5]} its record names")
    counts = frame[cells].to_numpy(dtype=np.float64)
    if counts.size and (not np.all(np.isfinite(counts)) or np.any(counts < 0) or np.any(counts != np.round(counts))):
        raise SparseDPError(f"{p.name}: the cell columns must hold the published non-negative integer counts")
    shape = (counts.shape[0], len(cells))
    labels: dict[str, Any] = {"unit": AxisLabel(shape, 0), "cell": AxisLabel(shape, 1, cells)}
    if "depth" in frame.columns:
        labels["depth"] = np.repeat(frame["depth"].to_numpy(dtype=np.int64), len(cells))
    ledger = tuple(meta.get("ledger") or ())
    return ReleaseResult(
        kind="topdown", answers=counts.ravel(), labels=labels, variances=None, noise=meta.get("noise"),
        secure=bool(meta.get("secure", True)), strategy="TopDown (a table of the published counts)",
        ledger=ledger, private=bool(meta.get("private", True)) and bool(ledger), description=desc,
        variance_method="not in a table file: the .npz release keeps the variances",
        source=_UnitTable(frame), path=str(p))


register_reader("topdown.load_table", load_table_release)  # load_release reads TopDown tables with it
