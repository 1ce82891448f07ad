"""``sparsedp marginals``: release the marginals of a CSV / Parquet table under zCDP.

The domain is public and must be given: ``--sizes`` (columns of integer codes ``0..size-1``) or
``--categories FILE.json`` (``{"column": ["value", ...], ...}``: each column's category list; a value
outside its list, or a missing value, is an error raised before anything is measured).  The
domain is never read from the data (the set of values present is itself private).  The output
JSON holds the released marginals, their per-cell variances and the privacy parameters; never
a record; it is a release file too (``format``, ``kind``, ``private``, ``ledger``), which
:func:`sparsedp.load_release`, ``sparsedp ledger`` and ``sparsedp query`` read.  ``--out F.npz``
writes the release as an ``.npz`` release file instead (one answer per cell,
:meth:`sparsedp.marginals.MarginalRelease.to_release`).

The data: a CSV or Parquet file with one row per record (the named columns; others are ignored),
or an ``(n, d)`` ``.npy`` array of integer codes whose columns ``--columns`` names in order (with
``--sizes``).  A missing file or column, an empty file, non-numeric or missing codes and codes
outside the domain are refused before anything is measured.  On a terminal a tqdm bar shows the
command's stages (read, encode, release, write; :mod:`sparsedp.progress`); it is silent in pipes,
logs and tests.

``--privacy-unit COLUMN --max-rows K|auto`` (and ``--max-groups`` / ``--max-rows-per-group``,
``--drop-missing-units``) protects each value of ``COLUMN`` with all of its rows
(:mod:`sparsedp.marginals.units`): ``--rho`` is then the budget per unit, and the output records
the unit.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .._cli_util import warn_not_private
from ..progress import loop_disable, progress_bar
from ..errors import ShapeError, SparseDPError
from ..release_file import FORMAT
from .domain import Domain
from .release import release_marginals
from .select import marginals_up_to
from ..privacy_unit_cli import add_unit_arguments, id_warnings_on_stderr, unit_from_args
from .table import encode_records, read_unit_records


def _run(args: argparse.Namespace) -> int:
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    if (args.sizes is None) == (args.categories is None):
        raise SparseDPError("give the public domain: --sizes or --categories (not both)")
    try:
        sizes = None if args.sizes is None else [int(s) for s in args.sizes.split(",")]
    except ValueError as exc:
        raise SparseDPError(f"--sizes must be comma-separated integers, got {args.sizes!r}") from exc
    if sizes is not None and len(sizes) != len(columns):
        raise ShapeError(f"{len(columns)} columns but {len(sizes)} sizes")
    categories = None
    if args.categories is not None:
        try:
            categories = json.loads(Path(args.categories).read_text())
        except (OSError, ValueError) as exc:
            raise SparseDPError(f"cannot read --categories {args.categories}: {exc}") from exc
        if not isinstance(categories, dict):
            raise SparseDPError("--categories must hold a JSON object {column: [categories]}")
        missing = [c for c in columns if c not in categories]
        if missing:
            raise ShapeError(f"--categories lacks the column(s) {missing}")
    if sizes is None and Path(args.data).suffix.lower() == ".npy":
        raise SparseDPError("a .npy array holds codes: give the public domain with --sizes")
    unit, drop = unit_from_args(args)  # checked before anything is read
    private = warn_not_private(args.seed, False)
    # a bar of the command's stages, drawn only on a terminal inside the sparsedp command (loop_disable);
    # it shows neither the number of records nor times (reading and encoding take data-dependent time)
    with progress_bar(total=4, desc="marginals", unit="stage", disable=loop_disable(),
                      bar_format="{desc}: {n_fmt}/{total_fmt} stages |{bar}| {postfix}") as bar:
        bar.set_postfix_str(f"reading {Path(args.data).name}")
        with id_warnings_on_stderr():
            df, ids = read_unit_records(args.data, columns, unit)
        bar.update(1)
        bar.set_postfix_str("encoding the records")  # not how many: the record count is private (issue 26)
        dom, X = encode_records(df, columns, sizes, categories)
        del df
        bar.update(1)
        bar.set_postfix_str("selecting, measuring, reconstructing")
        work = marginals_up_to(dom, args.k, exact=not args.lower)
        rel = release_marginals(X, dom, work, args.rho, rng=args.seed, objective=args.objective,
                                privacy_unit=None if unit.is_row else unit, unit_ids=ids, drop_missing_units=drop)
        bar.update(1)
        bar.set_postfix_str(f"writing {args.out}")
        _write(args, rel, dom, columns, categories, private)
        bar.update(1)
    print(f"released {len(rel.marginals)} marginals of {len(columns)} columns at rho={args.rho:g} "
          f"per {'record' if unit.is_row else unit.column} "
          f"(sum of variances {rel.sum_of_variances():.6g}) to {args.out}", file=sys.stderr)
    return 0


def _write(args: argparse.Namespace, rel, dom: Domain, columns: list[str], categories: dict | None,
           private: bool) -> None:
    cats = None if categories is None else {c: categories[c] for c in columns}
    if Path(args.out).suffix == ".npz":  # a release file (sparsedp.releases): one answer per cell
        rel.to_release(description={"objective": args.objective}, categories=cats,
                       private=private and rel.private).save(args.out, overwrite=bool(getattr(args, "force", False)))
        return
    record = rel.to_release()  # the unit, the bound's choice and the ledger as every release records them
    # the ledger entries without their time: the JSON is the same for neighbouring data sets (issue 26)
    entries = ([rel.bound_choice.measurement.entry] if rel.bound_choice is not None else []) + [rel.entry]
    ledger = [{k: v for k, v in e.as_dict().items() if k != "time"} for e in entries]
    for entry in ledger:
        if not (private and rel.private):
            entry["private"] = False
    unit_keys = {k: record.description[k] for k in ("privacy_unit", "privacy_unit_bound") if k in record.description}
    out = {
        "format": FORMAT,
        "kind": "marginals",
        "private": private and rel.private,
        "ledger": ledger,
        "domain": {"names": list(dom.names), "sizes": list(dom.sizes)},
        "categories": cats,
        "privacy": {"rho": record.description["rho"], "certified_rho": rel.loss, "noise": "gaussian",
                    "secure": rel.secure, "private": private and rel.private,
                    "neighbours": record.description.get("neighbours", "add or remove one record")},
        **unit_keys,
        "objective": args.objective,
        "sum_of_variances": rel.sum_of_variances(),
        "marginals": [{"attributes": list(k), "counts": np.asarray(v).tolist(), "cell_variance": rel.variances[k]}
                      for k, v in rel.marginals.items()],  # in the order of the workload
    }
    Path(args.out).write_text(json.dumps(out) + "\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``marginals`` command."""
    m = subparsers.add_parser(
        "marginals", help="release the k-way marginals of a CSV / Parquet table under zCDP (ResidualPlanner)",
        description=__doc__.split("\n\n")[0] + " Residuals measured with exact discrete Gaussian noise; every "
        "marginal reconstructed by GLS with its exact variance.")
    m.add_argument("data", help="a CSV or Parquet file with one row per record (the --columns are read; missing file or "
                   "column, empty file, non-numeric or missing codes are refused before any noise), or an (n, d) .npy "
                   "array of integer codes, its columns named by --columns in order (with --sizes)")
    m.add_argument("--columns", required=True, help="comma-separated columns (the attributes)")
    m.add_argument("--sizes", default=None, help="comma-separated public sizes: columns hold codes 0..size-1")
    m.add_argument("--categories", default=None, help="JSON file {column: [categories]}: the public domain")
    m.add_argument("--k", type=int, default=2, help="marginal order (default %(default)s)")
    m.add_argument("--lower", action="store_true", help="also release every marginal of lower order")
    m.add_argument("--rho", type=float, required=True, help="zCDP budget rho > 0")
    m.add_argument("--objective", choices=("sum", "max"), default="sum",
                   help="minimise the sum of the cells' variances or the largest (default %(default)s)")
    m.add_argument("--seed", type=int, default=None, help="reproducible, NOT private noise (tests only)")
    add_unit_arguments(m)
    m.add_argument("--out", required=True, help="output JSON (marginals, variances, privacy, ledger; never records), "
                   "or an .npz release file")
    m.set_defaults(func=_run)
