"""The privacy unit in the command-line tools and in spec files: one parser for every record path.

Flags (:func:`add_unit_arguments`, read by :func:`unit_from_args`)::

    --privacy-unit COLUMN --max-rows K|auto [--max-groups G --max-rows-per-group R] [--drop-missing-units]

Spec keys in ``[privacy]`` (:func:`unit_from_spec`)::

    unit = "CustomerID"
    max_rows = 50            # or "auto"
    max_groups = 10          # optional, with max_rows_per_group
    max_rows_per_group = 5
    drop_missing_units = false

Without a declared unit the release protects one row (:data:`sparsedp.privacy_unit.ONE_ROW`).
Every check is made here, before any data are read or any budget is charged.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from typing import Any, Iterator, Mapping

from .errors import SparseDPError
from .privacy_unit import ONE_ROW, IdColumnWarning, PrivacyUnit

__all__ = ["add_unit_arguments", "unit_from_args", "unit_from_spec", "UNIT_SPEC_KEYS", "id_warnings_on_stderr"]

#: The ``[privacy]`` keys that declare a privacy unit.
UNIT_SPEC_KEYS = frozenset({"unit", "max_rows", "max_groups", "max_rows_per_group", "drop_missing_units"})


def _max_rows(text: str) -> int | str:
    """``--max-rows``: a positive integer or ``auto``."""
    if text.strip() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--max-rows is a positive integer or 'auto', got {text!r}") from exc


def add_unit_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the privacy-unit flags to a command's parser."""
    g = parser.add_argument_group("privacy unit (default: each row is protected on its own)")
    g.add_argument("--privacy-unit", default=None, metavar="COLUMN",
                   help="the column identifying whom the release protects (a person, customer, vehicle); each "
                   "unit's rows beyond the bounds are dropped (secret random choice) and the noise is calibrated "
                   "to what one whole unit can change")
    g.add_argument("--max-rows", type=_max_rows, default=None, metavar="K|auto",
                   help="rows kept per unit in total; 'auto' spends a small share of the budget on a private "
                   "choice of the bound (a DP quantile of the rows per unit)")
    g.add_argument("--max-groups", type=int, default=None, metavar="G",
                   help="distinct cells kept per unit (with --max-rows-per-group)")
    g.add_argument("--max-rows-per-group", type=int, default=None, metavar="R",
                   help="rows kept per unit in each of its cells (with --max-groups)")
    g.add_argument("--drop-missing-units", action="store_true",
                   help="drop rows without a unit id (else they are refused); how many is not published")


def _unit(column: Any, max_rows: Any, max_groups: Any, max_rows_per_group: Any, where: str) -> PrivacyUnit:
    """The declared unit, or :data:`ONE_ROW` when nothing is declared; bounds without a column refused."""
    if column is None:
        given = [n for n, v in (("max_rows", max_rows), ("max_groups", max_groups),
                                ("max_rows_per_group", max_rows_per_group)) if v is not None]
        if given:
            raise SparseDPError(f"{where}: contribution bounds ({', '.join(given)}) need the privacy unit's column")
        return ONE_ROW
    if not isinstance(column, str) or not column.strip():
        raise SparseDPError(f"{where}: the privacy unit is a column name, got {column!r}")
    return PrivacyUnit(column.strip(), max_rows=max_rows, max_groups=max_groups, max_rows_per_group=max_rows_per_group)


def unit_from_args(args: argparse.Namespace) -> tuple[PrivacyUnit, bool]:
    """``(unit, drop_missing_units)`` from the flags of :func:`add_unit_arguments`."""
    unit = _unit(args.privacy_unit, args.max_rows, args.max_groups, args.max_rows_per_group, "--privacy-unit")
    drop = bool(getattr(args, "drop_missing_units", False))
    if drop and unit.is_row:
        raise SparseDPError("--drop-missing-units goes with --privacy-unit")
    return unit, drop


def unit_from_spec(privacy: Mapping[str, Any]) -> tuple[PrivacyUnit, bool]:
    """``(unit, drop_missing_units)`` from a spec's ``[privacy]`` section (module doc)."""
    drop = privacy.get("drop_missing_units", False)
    if not isinstance(drop, bool):
        raise SparseDPError(f"privacy.drop_missing_units must be true or false, got {drop!r}")
    max_rows = privacy.get("max_rows")
    if isinstance(max_rows, str) and max_rows != "auto":
        raise SparseDPError(f"privacy.max_rows is a positive integer or 'auto', got {max_rows!r}")
    unit = _unit(privacy.get("unit"), max_rows, privacy.get("max_groups"), privacy.get("max_rows_per_group"),
                 "privacy.unit")
    if drop and unit.is_row:
        raise SparseDPError("privacy.drop_missing_units goes with privacy.unit")
    return unit, drop


@contextlib.contextmanager
def id_warnings_on_stderr() -> Iterator[None]:
    """Within the block, an identifier-like column warning (:class:`IdColumnWarning`) is printed as
    one ``warning: ...`` line on stderr (a command's user sees no Python traceback-style lines);
    other warnings go on as usual."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IdColumnWarning)
        yield
    for w in caught:
        if issubclass(w.category, IdColumnWarning):
            print(f"warning: {w.message}", file=sys.stderr)
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
