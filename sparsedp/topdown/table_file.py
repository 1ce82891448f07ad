"""A TopDown release written as a table (``.csv`` / ``.parquet``) with its release record.

``sparsedp topdown ... --out units.parquet`` writes the published table -- one row per
geographic unit: its level, depth, codes and one column per cell -- and the release record
(ledger, parameters, the hierarchy's levels and cells) in ``units.parquet.release.json``.
:func:`load_table_release` reads the pair back as a release of the common model
(:class:`~sparsedp.releases.ReleaseResult`, kind ``"topdown"``): one answer per (unit, cell),
what ``sparsedp.load_release``, ``sparsedp ledger`` and ``sparsedp query`` use.  The codes are
read as text (leading zeros kept).  The table holds the published counts only: the variances
stay in the ``.npz`` release file (``variances`` is ``None`` here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import SparseDPError
from ..releases import AxisLabel, ReleaseResult, register_reader

__all__ = ["load_table_release"]



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
            text = {c: str for c in head.columns if c not in cells}  # codes as text: leading zeros kept
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
