"""Histograms of records with a privacy unit: truncation that is the same on every path.

A histogram of records released per unit (:class:`~sparsedp.privacy_unit.PrivacyUnit`) is:
bin every record, drop each unit's rows beyond its bounds (:func:`~sparsedp.privacy_unit.truncate`,
the bins as the groups), and run a row-level publisher at
``unit.row_budget("laplace", epsilon)`` on the truncated histogram -- one unit then moves it by
at most ``unit.l1_bound()`` rows, so the release costs ``epsilon`` per unit.

**Partition-independent priorities.**  :func:`truncate` keeps a unit's rows by priority.  Drawn
in row order, the priorities would depend on how the table is split into parts (one process, or a
shuffle on Dask workers).  :func:`cell_priorities` instead gives each row the keyed hash of its
own identity for the histogram: its unit id, its bin, and its occurrence among the rows of that
unit in that bin (rows of one unit in one bin are interchangeable, so which of them is the first
does not change the histogram).  The key is secret (16 bytes from the secure generator), or
derived from the seed of a reproducible, non-private run; one seed therefore truncates the same
rows in process and on any partitioning.  A row's priority depends on its own unit's rows only,
which is what makes truncation stable (the privacy argument of :mod:`sparsedp.privacy_unit`).

:func:`per_unit_release` makes the release file say what it protects: the ledger entry is the
per-unit cost (``||d||_1`` times the per-row one) with the unit, the description has the unit
(and, for ``max_rows="auto"``, the private choice of the bound, whose charge is the first ledger
entry).  Nothing about truncation (rows or units dropped, the largest contribution) is returned.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .errors import SparseDPError
from .privacy_unit import PrivacyUnit, _rank_within, scaled_up, truncate

__all__ = ["unit_key", "choice_rng", "read_unit_histogram", "cell_priorities", "kept_rows", "truncated_histogram", "per_unit_release", "unit_summary"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def unit_key(rng: Any = None) -> str:
    """The secret key of the truncation priorities: 16 hexadecimal characters (64 bits) from the
    secure generator without ``rng``; from a seed (an ``int``), the same key every time (a
    reproducible run, not private)."""
    if rng is None:
        from .noise import SecureRandomBits  # local: noise is a heavy import

        raw = SecureRandomBits().bytes(8)
    elif isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        seq = np.random.SeedSequence([int(rng), 0x5EED_0F_7E])  # a stream of its own, apart from the noise's
        raw = seq.generate_state(2, dtype=np.uint32).tobytes()
    elif isinstance(rng, np.random.Generator):
        raw = rng.integers(0, 2**32, size=2, dtype=np.uint32).tobytes()
    else:
        raise SparseDPError(f"the truncation key is derived from an integer seed or drawn securely (None), got "
                            f"{type(rng).__name__}")
    return bytes(raw).hex()


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (a bijection that spreads every input bit)."""
    z = z.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def cell_priorities(ids: Any, cells: Any, key: str) -> np.ndarray:
    """One int64 priority per row (module doc): a keyed hash of (unit id, cell, the row's
    occurrence among that unit's rows in that cell).  ``ids``: text ids (:func:`sparsedp.io.id_text`;
    ``None`` rows get priority 0 and are dropped or refused by :func:`truncate`); ``cells``: integer
    bins.  Vectorised: ``O(rows log rows)``."""
    import pandas as pd

    ids = np.asarray(ids, dtype=object)
    c = np.asarray(cells, dtype=np.int64)
    if ids.shape != c.shape or ids.ndim != 1:
        raise SparseDPError("ids and cells must be one value per row")
    if not (isinstance(key, str) and len(key.encode()) == 16):
        raise SparseDPError("the truncation key is 16 characters (unit_key)")
    out = np.zeros(ids.size, dtype=np.int64)
    present = ~pd.isna(ids)
    if not present.any():
        return out
    idp = ids[present]
    cp = c[present]
    h = pd.util.hash_array(idp, hash_key=key, categorize=True).astype(np.uint64)  # keyed SipHash of the id text
    _, code = np.unique(idp.astype(str), return_inverse=True)
    lo = int(cp.min())
    pair = code.astype(np.int64) * (int(cp.max()) - lo + 1) + (cp - lo)  # (unit, cell) as one key
    occ = _rank_within(pair, np.zeros(cp.size, dtype=np.int64))  # 0, 1, ... among a unit's rows in a cell
    salt = np.uint64(int(key, 16))
    with np.errstate(over="ignore"):
        inner = _mix(cp.astype(np.uint64) * _GOLDEN + occ.astype(np.uint64) + salt)
        p = _mix(h ^ inner)
    out[present] = (p >> np.uint64(1)).astype(np.int64)
    return out


def choice_rng(rng: Any) -> Any:
    """The generator of ``max_rows="auto"``'s noise: secure without ``rng``; from an integer seed a
    stream of its own (the same on every path); a Generator as given."""
    if rng is None or isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng([int(rng), 1])


def read_unit_histogram(path: Any, column: str, bins: Any, unit: PrivacyUnit, *, clip: bool = False,
                        drop_missing: bool = False, epsilon: float | None = None, rho: float | None = None,
                        accountant: Any = None, rng: Any = None) -> tuple[np.ndarray, PrivacyUnit, Any, float]:
    """``(histogram, concrete unit, bound choice, budget left)`` of the records of a CSV / Parquet
    file in one process: column ``column`` binned on the public ``bins`` (every check), the unit ids
    read as text, a missing id refused unless ``drop_missing`` -- all before any charge -- then
    ``max_rows="auto"`` chosen (``auto_share`` of ``epsilon`` / ``rho`` charged to ``accountant``,
    :func:`~sparsedp.contribution_bound.resolve_unit`) and each unit's rows truncated
    (:func:`truncated_histogram`, keyed by :func:`unit_key` of ``rng``)."""
    from .contribution_bound import resolve_unit
    from .io import bin_indices, read_id_column, read_values
    from .privacy_unit import _codes

    if unit.is_row:
        raise SparseDPError("read_unit_histogram needs a declared privacy unit (a column and its bounds)")
    cells = bin_indices(read_values(path, column), bins, clip)
    ids = read_id_column(path, unit.column)
    if ids.shape != cells.shape:
        raise SparseDPError(f"{path}: the value and unit columns have different lengths")
    _codes(ids, f"the privacy unit column {unit.column!r}", drop_missing)  # a missing id, before any charge
    key = unit_key(rng)
    concrete, choice, rest = resolve_unit(unit, ids, epsilon=epsilon, rho=rho, accountant=accountant,
                                          rng=choice_rng(rng), drop_missing=drop_missing)
    return truncated_histogram(cells, bins.count, ids, concrete, key, drop_missing), concrete, choice, rest


def kept_rows(cells: Any, ids: Any, unit: PrivacyUnit, key: str, drop_missing: bool = False) -> np.ndarray:
    """The rows :func:`truncate` keeps (a boolean mask), with the bins ``cells`` as the groups and
    the priorities of :func:`cell_priorities`: the same rows however the table is split into parts
    (each unit's rows in one part)."""
    c = np.asarray(cells, dtype=np.int64)
    return truncate(ids, unit, c if unit.grouped else None, drop_missing=drop_missing,
                    priorities=cell_priorities(ids, c, key))


def truncated_histogram(cells: Any, n: int, ids: Any, unit: PrivacyUnit, key: str,
                        drop_missing: bool = False) -> np.ndarray:
    """The int64 histogram (``n`` bins) of the rows :func:`kept_rows` keeps."""
    c = np.asarray(cells, dtype=np.int64)
    return np.bincount(c[kept_rows(c, ids, unit, key, drop_missing)], minlength=n).astype(np.int64)


def per_unit_release(result: Any, unit: PrivacyUnit, choice: Any = None) -> Any:
    """A :class:`~sparsedp.releases.ReleaseResult` of a row-level release run on truncated data at
    ``unit.row_budget(...)``, made to say what it protects: every ledger entry's cost and
    sensitivity times ``unit.l1_bound()`` with the unit named; ``description["epsilon"]`` the
    per-unit total, ``per_row_epsilon`` what the publisher ran at, ``privacy_unit`` the unit
    (``{"privacy_unit": "one row"}`` when none is declared) and, with the ``BoundChoice`` of
    ``max_rows="auto"``, its charge first in the ledger and ``privacy_unit_bound``."""
    desc = dict(result.description)
    if unit.is_row:
        desc["privacy_unit"] = unit.describe()
        return dataclasses.replace(result, description=desc)
    L = unit.l1_bound()
    name = unit.label
    ledger = [{**e, "epsilon": scaled_up(e.get("epsilon") or 0.0, L), "privacy_unit": name,
               "sensitivity": None if e.get("sensitivity") is None else scaled_up(e["sensitivity"], L)}
              for e in result.ledger]
    desc["per_row_epsilon"] = desc.get("epsilon")
    desc["privacy_unit"] = unit.describe()
    if choice is not None:
        if choice.measurement.entry is None:  # pragma: no cover - measure always records one
            raise SparseDPError("the bound's measurement has no ledger entry")
        ledger.insert(0, choice.measurement.entry.as_dict())
        desc["privacy_unit_bound"] = choice.describe()
    desc["epsilon"] = float(sum(e.get("epsilon") or 0.0 for e in ledger))
    return dataclasses.replace(result, ledger=tuple(ledger), description=desc)


def unit_summary(unit: PrivacyUnit, epsilon: float) -> str:
    """The budget and whom it protects, for a command's summary line: ``epsilon 1 per CustomerID
    (max_rows 50)``, or ``epsilon 1 per row``."""
    if unit.is_row:
        return f"epsilon {epsilon:g} per row"
    return f"epsilon {epsilon:g} per {unit.label}"
