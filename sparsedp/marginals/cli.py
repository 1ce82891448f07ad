"""``sparsedp marginals``: release the marginals of a CSV / Parquet table under zCDP.

The domain is public and must be given: ``--sizes`` (columns of integer codes ``0..size-1``) or
``--categories FILE.json`` (``{"column": ["value", ...], ...}``: each column's category list; a value
outside its list, or a missing value, is an error raised before anything is measured).  The
domain is never read from the data (the set of values present is itself private).  The output
JSON holds the released marginals, their per-cell variances and the privacy parameters; never
a record.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .._cli_util import warn_not_private
from ..errors import InputBoundError, NonFiniteInputError, ShapeError, SparseDPError
from .domain import Domain
from .release import release_marginals
from .select import marginals_up_to


def _read_table(path: str, columns: list[str]):
    import pandas as pd

    p = Path(path)
    if p.suffix.lower() in (".parquet", ".pq"):
        df = pd.read_parquet(p, columns=columns)
    else:
        df = pd.read_csv(p, usecols=columns, dtype=str, keep_default_na=True)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ShapeError(f"{path} lacks the column(s) {missing}")
    return df


def _encode(df, columns: list[str], sizes: list[int] | None, categories: dict | None) -> tuple[Domain, np.ndarray]:
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
            if codes.isna().any():
                bad = col[codes.isna()].iloc[0]
                raise InputBoundError(f"column {c!r} has the value {bad!r}, not among its {len(cs)} categories")
            X[:, j] = codes.to_numpy(dtype=np.int64)
        return dom, X
    dom = Domain(columns, sizes)
    try:
        X = df[columns].astype(float).to_numpy()
    except ValueError as exc:
        raise ShapeError(f"--sizes needs integer codes in the columns: {exc}") from exc
    return dom, X


def _run(args: argparse.Namespace) -> int:
    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    if (args.sizes is None) == (args.categories is None):
        raise SparseDPError("give the public domain: --sizes or --categories (not both)")
    sizes = None if args.sizes is None else [int(s) for s in args.sizes.split(",")]
    if sizes is not None and len(sizes) != len(columns):
        raise ShapeError(f"{len(columns)} columns but {len(sizes)} sizes")
    categories = None
    if args.categories is not None:
        categories = json.loads(Path(args.categories).read_text())
        missing = [c for c in columns if c not in categories]
        if missing:
            raise ShapeError(f"--categories lacks the column(s) {missing}")
    df = _read_table(args.data, columns)
    dom, X = _encode(df, columns, sizes, categories)
    work = marginals_up_to(dom, args.k, exact=not args.lower)
    rel = release_marginals(X, dom, work, args.rho, rng=args.seed, objective=args.objective)
    private = warn_not_private(args.seed, False)
    out = {
        "domain": {"names": list(dom.names), "sizes": list(dom.sizes)},
        "categories": None if categories is None else {c: categories[c] for c in columns},
        "privacy": {"rho": rel.cost.rho, "certified_rho": rel.loss, "noise": "gaussian", "secure": rel.secure,
                    "private": private and rel.private, "neighbours": "add or remove one record"},
        "objective": args.objective,
        "sum_of_variances": rel.sum_of_variances(),
        "marginals": [{"attributes": list(k), "counts": np.asarray(v).tolist(), "cell_variance": rel.variances[k]}
                      for k, v in rel.marginals.items()],
    }
    Path(args.out).write_text(json.dumps(out) + "\n")
    print(f"released {len(rel.marginals)} marginals of {len(columns)} columns at rho={args.rho:g} "
          f"(sum of variances {rel.sum_of_variances():.6g}) to {args.out}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``marginals`` command."""
    m = subparsers.add_parser(
        "marginals", help="release the k-way marginals of a CSV / Parquet table under zCDP (ResidualPlanner)",
        description=__doc__.split("\n\n")[0] + " Residuals measured with exact discrete Gaussian noise; every "
        "marginal reconstructed by GLS with its exact variance.")
    m.add_argument("data", help="a CSV or Parquet file with one row per record")
    m.add_argument("--columns", required=True, help="comma-separated columns (the attributes)")
    m.add_argument("--sizes", default=None, help="comma-separated public sizes: columns hold codes 0..size-1")
    m.add_argument("--categories", default=None, help="JSON file {column: [categories]}: the public domain")
    m.add_argument("--k", type=int, default=2, help="marginal order (default %(default)s)")
    m.add_argument("--lower", action="store_true", help="also release every marginal of lower order")
    m.add_argument("--rho", type=float, required=True, help="zCDP budget rho > 0")
    m.add_argument("--objective", choices=("sum", "max"), default="sum",
                   help="minimise the sum of the cells' variances or the largest (default %(default)s)")
    m.add_argument("--seed", type=int, default=None, help="reproducible, NOT private noise (tests only)")
    m.add_argument("--out", required=True, help="output JSON (marginals, variances, privacy; never records)")
    m.set_defaults(func=_run)
