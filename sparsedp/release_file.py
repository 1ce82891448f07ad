"""One file format for every release: released arrays, a description, and the privacy ledger.

A release file is a NumPy ``.npz`` archive (no pickles) holding

* the released arrays (answers, estimates, variances, ... -- never the raw data), and
* ``__sparsedp__``: a JSON document with ``format`` (``"sparsedp-release/1"``), ``kind`` (which
  release made it), ``private`` (``false`` if any noise came from a seeded generator or the file
  holds anything computed from the true data), ``description`` (strategy, parameters),
  ``ledger`` (every measurement: what was measured, sensitivity, noise kind, scales, epsilon / rho,
  exact or float noise, time; see :class:`~sparsedp.privacy.LedgerEntry`) and ``model`` (which
  array holds the answers, their labels and variances, the noise: the layout of
  :class:`sparsedp.releases.ReleaseResult`; absent in files of earlier versions).

This module is the low-level ``.npz`` format: :func:`save_release` writes one,
:func:`load_release_file` reads it back (refusing files that are not sparsedp releases).
:func:`sparsedp.load_release` (:mod:`sparsedp.releases`) reads every release file the library
writes, this one and the chunked ``.npy`` / ``.zarr`` arrays with their ``.release.json`` record,
as one :class:`~sparsedp.releases.ReleaseResult`; ``sparsedp ledger FILE`` prints the ledger.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import SparseDPError
from .privacy import Accountant, LedgerEntry
from .safe_files import refuse_existing

__all__ = ["FORMAT", "ReleaseFile", "release_record", "save_release", "load_release_file", "ledger_rows"]

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
    model: dict[str, Any] = field(default_factory=dict)  # the answers' layout (empty in older files)

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


def release_record(
    kind: str,
    *,
    ledger: Accountant | Iterable[LedgerEntry | dict] | None = None,
    description: dict[str, Any] | None = None,
    private: bool = True,
    model: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``__sparsedp__`` record (a JSON-ready dict; see the module docstring).  A ledger entry
    that says its noise was not private makes the record not private."""
    entries = _ledger_dicts(ledger)
    if any(e.get("private") is False for e in entries):
        private = False
    meta = {"format": FORMAT, "kind": str(kind), "private": bool(private),
            "description": description or {}, "ledger": entries}
    if model:
        meta["model"] = model
    try:
        return json.loads(json.dumps(meta, allow_nan=True, default=_jsonable))
    except TypeError as exc:
        raise SparseDPError(f"the description is not JSON-serialisable: {exc}") from exc


def save_release(
    path: str | Path,
    kind: str,
    arrays: dict[str, Any],
    *,
    ledger: Accountant | Iterable[LedgerEntry | dict] | None = None,
    description: dict[str, Any] | None = None,
    private: bool = True,
    model: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a release file (see the module docstring).  ``arrays`` must hold only released
    quantities; ``private=False`` marks seeded or evaluation output.  A ledger entry that says
    its noise was not private makes the file not private.  ``model``: the answers' layout
    (written by :meth:`sparsedp.releases.ReleaseResult.save`).  An existing ``path`` is replaced
    only with ``overwrite=True`` (else :class:`~sparsedp.errors.ReleaseExistsError`, before
    anything is written)."""
    refuse_existing([path], overwrite)
    meta = release_record(kind, ledger=ledger, description=description, private=private, model=model)
    text = json.dumps(meta, allow_nan=True)
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
    ledger = tuple(meta.get("ledger") or ())
    # a file that records no measurement does not show noise was added: never reported private
    return ReleaseFile(kind=meta["kind"], arrays=data, description=meta.get("description", {}),
                       ledger=ledger, private=bool(meta.get("private", True)) and bool(ledger),
                       model=dict(meta.get("model") or {}))


def _unit_line(release: Any) -> str:
    """Whom a release protects, from its description (``privacy_unit``: the unit's
    :meth:`~sparsedp.privacy_unit.PrivacyUnit.describe`) or its ledger entries; ``"one row"``
    when no unit was declared (every release before the privacy unit existed)."""
    desc = (getattr(release, "description", None) or {}).get("privacy_unit")
    if isinstance(desc, Mapping):
        name = desc.get("privacy_unit", "one row")
        bounds = ", ".join(f"{k} {desc[k]}" for k in ("max_rows", "max_groups", "max_rows_per_group") if k in desc)
        return f"one {name} ({bounds})" if bounds and name != "one row" else "one row" if name == "one row" else str(name)
    if isinstance(desc, str) and desc:
        return desc if desc == "one row" else f"one {desc}"
    units = {e.get("privacy_unit") for e in release.ledger if isinstance(e, Mapping) and e.get("privacy_unit")}
    return " and ".join(f"one {u}" for u in sorted(units)) if units else "one row"


def ledger_rows(release: Any) -> list[str]:
    """The ledger as printable lines (``sparsedp ledger FILE``) of a :class:`ReleaseFile` or a
    :class:`~sparsedp.releases.ReleaseResult` (anything with ``kind``, ``private``, ``ledger``,
    ``epsilon`` and ``rho``)."""
    exact = list((getattr(release, "description", None) or {}).get("exact_disclosures") or ())
    lines = [f"{release.kind} release, {'private' if release.private else 'NOT PRIVATE'}"
             f"{f' noise, {len(exact)} exact disclosure(s), NOT private' if exact else ''}, "
             f"{len(release.ledger)} measurement(s)"]
    lines.append(f"  protects: {_unit_line(release)}")
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
        if e.get("privacy_unit"):
            parts.append(f"per {e['privacy_unit']}")
        if e.get("private") is False:
            parts.append("seeded (not private)")
        lines.append("  " + ", ".join(parts))
    total = f"epsilon {release.epsilon:g}" if release.epsilon else f"rho {release.rho:g}"
    lines.append(f"total: {total}")
    for d in exact:  # an invariant: the true values, published exactly (no noise, no privacy)
        size = f" ({d['units']} unit(s) x {d['cells']} value(s))" if d.get("units") is not None else ""
        lines.append(f"exact: {d.get('what', '?')}{size} published exactly, NOT under DP (not private, not in the "
                     "total above)")
    opt = (getattr(release, "description", None) or {}).get("optimizer")
    if isinstance(opt, dict):  # the strategy sparsedp.optimize chose, with its certified gap
        gap = f", certified gap {opt['gap']:.4g} (error {opt['error']:.6g} >= bound {opt['lower_bound']:.6g} at " \
              f"{'epsilon' if opt.get('noise') == 'laplace' else 'rho'} {opt.get('budget', 1.0):g})" \
            if opt.get("gap") is not None else ", no certified bound"
        lines.append(f"strategy: {opt.get('family')} / {opt.get('name')}{gap}")
    return lines
