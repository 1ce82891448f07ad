"""One file format for every release: released arrays, a description, and the privacy ledger.

A release file is a NumPy ``.npz`` archive (no pickles) holding

* the released arrays (answers, estimates, variances, ... -- never the raw data), and
* ``__sparsedp__``: a JSON document with ``format`` (``"sparsedp-release/1"``), ``kind`` (which
  release made it), ``private`` (``false`` if any noise came from a seeded generator or the file
  holds anything computed from the true data), ``description`` (strategy, parameters) and
  ``ledger`` (every measurement: what was measured, sensitivity, noise kind, scales, epsilon / rho,
  exact or float noise, time; see :class:`~sparsedp.privacy.LedgerEntry`).

:func:`save_release` writes one, :func:`load_release_file` reads it back (refusing files that are
not sparsedp releases), and ``sparsedp ledger FILE`` prints the ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from .errors import SparseDPError
from .privacy import Accountant, LedgerEntry

__all__ = ["FORMAT", "ReleaseFile", "save_release", "load_release_file", "ledger_rows"]

FORMAT = "sparsedp-release/1"
_META = "__sparsedp__"


@dataclass(frozen=True)
class ReleaseFile:
    """The content of a release file."""

    kind: str
    arrays: dict[str, np.ndarray]
    description: dict[str, Any] = field(default_factory=dict)
    ledger: tuple[dict[str, Any], ...] = ()
    private: bool = True

    @property
    def epsilon(self) -> float:
        """Total pure-DP epsilon recorded in the ledger (sequential composition)."""
        return float(sum(e.get("epsilon", 0.0) for e in self.ledger))

    @property
    def rho(self) -> float:
        """Total zCDP rho recorded in the ledger."""
        return float(sum(e.get("rho", 0.0) for e in self.ledger))


def _ledger_dicts(ledger: Accountant | Iterable[LedgerEntry | dict] | None) -> list[dict[str, Any]]:
    if ledger is None:
        return []
    entries = ledger.ledger if isinstance(ledger, Accountant) else tuple(ledger)
    out = []
    for e in entries:
        if isinstance(e, LedgerEntry):
            out.append(e.as_dict())
        elif isinstance(e, dict):
            out.append(dict(e))
        else:
            raise SparseDPError(f"a ledger holds LedgerEntry objects or dicts, got {type(e).__name__}")
    return out


def save_release(
    path: str | Path,
    kind: str,
    arrays: dict[str, Any],
    *,
    ledger: Accountant | Iterable[LedgerEntry | dict] | None = None,
    description: dict[str, Any] | None = None,
    private: bool = True,
) -> Path:
    """Write a release file (see the module docstring).  ``arrays`` must hold only released
    quantities; ``private=False`` marks seeded or evaluation output.  A ledger entry that says
    its noise was not private makes the file not private."""
    entries = _ledger_dicts(ledger)
    if any(e.get("private") is False for e in entries):
        private = False
    meta = {"format": FORMAT, "kind": str(kind), "private": bool(private),
            "description": description or {}, "ledger": entries}
    try:
        text = json.dumps(meta, allow_nan=True, default=_jsonable)
    except TypeError as exc:
        raise SparseDPError(f"the description is not JSON-serialisable: {exc}") from exc
    clean = {}
    for name, value in arrays.items():
        if name == _META:
            raise SparseDPError(f"{_META!r} is reserved")
        arr = np.asarray(value)
        if arr.dtype == object:
            raise SparseDPError(f"array {name!r} is not numeric")
        clean[name] = arr
    p = Path(path)
    with open(p, "wb") as fh:
        np.savez_compressed(fh, **clean, **{_META: np.array(text)})
    return p


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def load_release_file(path: str | Path) -> ReleaseFile:
    """Read a release file written by :func:`save_release`."""
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read release {path}: {exc}") from exc
    if _META not in data:
        raise SparseDPError(f"{path} is not a sparsedp release file (no {_META} record)")
    meta = json.loads(str(data.pop(_META)))
    if meta.get("format") != FORMAT:
        raise SparseDPError(f"{path}: unknown release format {meta.get('format')!r}")
    return ReleaseFile(kind=meta["kind"], arrays=data, description=meta.get("description", {}),
                       ledger=tuple(meta.get("ledger", [])), private=bool(meta.get("private", True)))


def ledger_rows(release: ReleaseFile) -> list[str]:
    """The ledger as printable lines (``sparsedp ledger FILE``)."""
    lines = [f"{release.kind} release, {'private' if release.private else 'NOT PRIVATE'}, "
             f"{len(release.ledger)} measurement(s)"]
    for i, e in enumerate(release.ledger):
        cost = f"epsilon={e['epsilon']:g}" if e.get("epsilon") else f"rho={e.get('rho', 0):g}"
        parts = [f"{i}: {e.get('label', '')}", cost]
        if e.get("rows") is not None:
            parts.append(f"{e['rows']}x{e['columns']}")
        if e.get("noise"):
            parts.append(f"{'exact' if e.get('secure') else 'float'} {e['noise']}")
        if e.get("sensitivity") is not None:
            parts.append(f"Delta={e['sensitivity']:g}")
        if e.get("scale_min") is not None:
            parts.append(f"scales [{e['scale_min']:g}, {e['scale_max']:g}]")
        if e.get("private") is False:
            parts.append("seeded (not private)")
        lines.append("  " + ", ".join(parts))
    total = f"epsilon {release.epsilon:g}" if release.epsilon else f"rho {release.rho:g}"
    lines.append(f"total: {total}")
    return lines
