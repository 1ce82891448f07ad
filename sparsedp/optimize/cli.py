"""``sparsedp optimize``: the strategy with the lowest exact GLS error for a workload (issue 11).

No data is read and no noise is drawn: the command only chooses a strategy.  It prints the family
and strategy chosen, the expected squared error per query at the budget given (``--epsilon`` for
Laplace, ``--rho`` for Gaussian; default 1) next to every candidate's (each template's among them)
and the time; ``--json`` writes the same as JSON and ``--save`` the strategy as a scipy sparse
``.npz`` to measure later with ``MatrixMechanism(W, scipy.sparse.load_npz(FILE), epsilon=...)``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import workloads as wl
from ..errors import ShapeError, SparseDPError
from ..io import read_columns
from ..operators import Operator, aslinearoperator
from ..validation import check_positive
from .api import DEFAULT_TIME_LIMIT, FAMILIES, OptimizedStrategy, optimize

__all__ = ["NAMED_WORKLOADS", "load_union", "load_workload", "register"]

NAMED_WORKLOADS = {
    "prefix": wl.prefix,
    "all-ranges": wl.all_ranges,
    "identity": wl.identity,
    "total": wl.total,
}

HELP = """Find the measurement strategy with the lowest exact expected error of the GLS answers to a
workload (sparsedp.optimize): weighted interval trees, HDMM's p-Identity (n <= 8192) and the fixed
templates (identity, hierarchical k-ary, Haar, Fenwick); --family auto never returns worse than
the best template.  No data is read and no noise is drawn.

--workload is prefix, all-ranges, identity or total over --n cells, or FILE.npz (a scipy.sparse
matrix saved with scipy.sparse.save_npz, one row per query), FILE.npy (a dense 2-D array) or
FILE.csv / FILE.parquet (one range query per row: the inclusive 0-based bins in the --lo and --hi
columns, over --n cells).  Repeated, each with :WEIGHT (a positive number, or mean = 1 / the part's
number of queries), it is the weighted union sum_i WEIGHT_i x (squared errors of part i)
(sparsedp.workloads.weighted_union): --workload all-ranges:mean --workload total:0.9 --n 4096 is
the average random-range error plus 0.9 x the whole-domain error.
Printed: the family and strategy chosen, the expected squared error per query at --epsilon
(Laplace, pure DP; default 1) or --rho (Gaussian, zCDP; default 1) of the chosen strategy and of
every candidate tried and every template (scored for comparison even when --family excludes them)
with its ratio to the chosen one, and the time.  --json OUT writes the same as JSON; --save FILE.npz the strategy (an integer matrix: the
mechanism calibrates from its entries) to measure with
MatrixMechanism(W, scipy.sparse.load_npz(FILE), epsilon=...)."""


def _range_table(path: Path, n: int | None, lo: str, hi: str) -> tuple[Operator, str]:
    """Range queries over ``n`` cells from the ``lo`` / ``hi`` columns (inclusive, 0-based) of a table."""
    if n is None:
        raise ShapeError(f"a table of ranges ({path.name}) needs --n (the number of cells)")
    cols = read_columns(path, [lo, hi])
    a, b = cols[lo], cols[hi]
    for values, name in ((a, lo), (b, hi)):
        bad = np.flatnonzero(~np.isfinite(values) | (values != np.floor(values)) | (values < 0) | (values >= n))
        if bad.size:
            raise ShapeError(f"{path.name}: column {name!r} must hold bin numbers 0..{n - 1}; row {int(bad[0]) + 2} "
                             f"has {float(values[bad[0]])!r}")
    bad = np.flatnonzero(a > b)
    if bad.size:
        raise ShapeError(f"{path.name}: row {int(bad[0]) + 2} has {lo} > {hi}")
    pairs = np.stack([a, b], axis=1).astype(np.int64)
    return wl.range_queries(int(n), pairs), f"{path.name} ({pairs.shape[0]} ranges over {n} cells)"


def load_workload(spec: str, n: int | None, lo: str = "lo", hi: str = "hi") -> tuple[Operator, str]:
    """The workload operator and its label: a named workload over ``n`` cells, or a file (a sparse
    ``.npz`` / dense ``.npy`` matrix, or a CSV / Parquet table of inclusive ranges ``lo``, ``hi``)."""
    if spec in NAMED_WORKLOADS:
        if n is None:
            raise ShapeError(f"--workload {spec} needs --n (the number of cells)")
        if isinstance(n, bool) or int(n) != n or n < 1:
            raise ShapeError(f"--n must be a positive integer, got {n!r}")
        return NAMED_WORKLOADS[spec](int(n)), f"{spec}({n})"
    path = Path(spec)
    suffix = path.suffix.lower()
    if suffix not in (".npz", ".npy", ".csv", ".parquet", ".pq"):
        raise SparseDPError(f"--workload must be one of {', '.join(NAMED_WORKLOADS)} or a .npz / .npy / .csv / "
                            f".parquet file, got {spec!r}")
    if not path.is_file():
        raise SparseDPError(f"no such file: {path}")
    if suffix in (".csv", ".parquet", ".pq"):
        return _range_table(path, n, lo, hi)
    try:
        matrix: Any = sp.load_npz(path) if suffix == ".npz" else np.load(path, allow_pickle=False)
    except (ValueError, OSError, KeyError) as exc:
        kind = "a scipy.sparse .npz file (scipy.sparse.save_npz)" if suffix == ".npz" else "a .npy array"
        raise SparseDPError(f"{path} is not {kind}: {exc}") from exc
    if matrix.ndim != 2:
        raise ShapeError(f"{path} holds an array of shape {matrix.shape}; a 2-D workload matrix is needed")
    if not np.issubdtype(matrix.dtype, np.number) or np.issubdtype(matrix.dtype, np.complexfloating):
        raise SparseDPError(f"{path}: the workload must be real numbers, got dtype {matrix.dtype}")
    data = matrix.data if sp.issparse(matrix) else matrix
    if not np.all(np.isfinite(data)):
        raise SparseDPError(f"{path}: the workload has NaN or infinite entries")
    if n is not None and matrix.shape[1] != n:
        raise ShapeError(f"{path} has {matrix.shape[1]} columns but --n is {n}")
    return aslinearoperator(matrix, name=path.stem), f"{path.name} ({matrix.shape[0]} x {matrix.shape[1]})"


def _split_weight(spec: str) -> tuple[str, str | None]:
    """``SPEC[:WEIGHT]`` -> ``(SPEC, WEIGHT)``: the text after the last ``:`` is a weight when it is
    ``mean`` or parses as a number (so a path with a colon in it still works)."""
    head, sep, tail = spec.rpartition(":")
    if not sep or not head:
        return spec, None
    if tail == "mean":
        return head, tail
    try:
        float(tail)
    except ValueError:
        return spec, None
    return head, tail


def load_union(specs: list[str], n: int | None, lo: str = "lo", hi: str = "hi") -> tuple[Operator, str]:
    """One workload (``SPEC``, as :func:`load_workload`) or the weighted union of several
    (``SPEC:WEIGHT``, :func:`~sparsedp.workloads.weighted_union`): ``WEIGHT`` a positive number or
    ``mean`` (1 / the part's number of queries: its errors averaged), 1 when omitted."""
    parts, labels, plain = [], [], []
    for spec in specs:
        base, weight = _split_weight(spec)
        W, label = load_workload(base, n, lo, hi)
        if weight is None:
            c = 1.0
        elif weight == "mean":
            c = 1.0 / W.shape[0]
        else:
            c = float(weight)
            if not np.isfinite(c) or c <= 0:
                raise SparseDPError(f"--workload {spec}: the weight must be a positive number or 'mean', got {weight!r}")
        parts.append((c, W))
        plain.append(label)
        labels.append(label if weight is None else f"{weight} x {label}")
    if len(parts) == 1 and parts[0][0] == 1.0:
        return parts[0][1], plain[0]
    return wl.weighted_union(parts), " + ".join(labels)


def _budget(args: argparse.Namespace) -> tuple[str, float, float]:
    """``(label, value, divisor)``: the error at the budget is the unit-budget error / divisor."""
    if args.noise == "laplace":
        if args.rho is not None:
            raise SparseDPError("--rho is for --noise gaussian; Laplace takes --epsilon")
        eps = check_positive(1.0 if args.epsilon is None else args.epsilon, "epsilon")
        return "epsilon", eps, eps ** 2
    if args.epsilon is not None:
        raise SparseDPError("--epsilon is for --noise laplace; Gaussian takes --rho")
    rho = check_positive(1.0 if args.rho is None else args.rho, "rho")
    return "rho", rho, rho


def report(res: OptimizedStrategy, workload: str, queries: int, cells: int, budget: tuple[str, float, float],
           family: str, templates: OptimizedStrategy | None = None, union: bool = False) -> dict[str, Any]:
    """The command's JSON report (errors per query at the budget; for a weighted ``union`` the
    weighted total ``sum_i c_i E_i`` instead, in the same fields: a mean over the union's rows
    would mix the parts' weights); ``templates``: a separate scoring of the templates, for
    comparison, when ``family`` did not include them."""
    name, value, div = budget
    per = 1 if union else queries
    chosen = res.error.total / div / per
    trials = list(res.history) + (list(templates.history) if templates is not None else [])
    cands = [{"family": t.family, "name": t.name, "error_per_query": t.error / div / per,
              "ratio_to_chosen": t.error / res.error.total if res.error.total > 0 else float("nan"),
              "seconds": t.seconds, "note": t.note} for t in trials]
    best = res.best_template() or (templates.best_template() if templates is not None else None)
    out: dict[str, Any] = {
        "workload": workload, "queries": queries, "cells": cells, "noise": res.noise, name: value,
        "error_unit": "weighted total" if union else "per query",
        "family_requested": family,
        "chosen": {"family": res.family, "name": res.name, "error_per_query": chosen,
                   "error_total": res.error.total / div, "sensitivity": res.sensitivity},
        "best_template": None, "candidates": cands, "seconds": res.seconds,
        "lower_bound_per_query": None if res.lower_bound is None else res.lower_bound / div / per,
        "certified_gap": res.gap,
    }
    if best is not None:
        out["best_template"] = {"name": best.name, "error_per_query": best.error / div / per,
                                "ratio_chosen_to_template": res.error.total / best.error if best.error > 0 else None}
    return out


def _print(rep: dict[str, Any]) -> None:
    budget = "epsilon" if "epsilon" in rep else "rho"
    kind = "Laplace, pure DP, Delta_1" if rep["noise"] == "laplace" else "Gaussian, zCDP, Delta_2"
    ch = rep["chosen"]
    print(f"workload {rep['workload']}: {rep['queries']} queries over {rep['cells']} cells; {kind} calibration; "
          f"{budget} = {rep[budget]:g}")
    union = rep["error_unit"] == "weighted total"
    what = "weighted total squared error (sum of weight x part's total)" if union else "squared error per query"
    print(f"chosen: {ch['family']} {ch['name']}: expected {what} {ch['error_per_query']:.6g}")
    if rep.get("certified_gap") is not None:
        print(f"certified: no strategy has an error below {rep['lower_bound_per_query']:.6g} (continuous noise); "
              f"gap {rep['certified_gap']:.5f}")
    best = rep["best_template"]
    if best is not None and best["ratio_chosen_to_template"] is not None:
        print(f"best template: {best['name']}: {best['error_per_query']:.6g}{'' if union else ' per query'} "
              f"(chosen / template = {best['ratio_chosen_to_template']:.4f})")
    header = f"{'family':<11}{'candidate':<34}{'weighted err' if union else 'error/query':>14}{'x chosen':>10}{'seconds':>10}"
    print()
    print(header)
    print("-" * len(header))
    for c in rep["candidates"]:
        print(f"{c['family']:<11}{c['name']:<34}{c['error_per_query']:>14.6g}{c['ratio_to_chosen']:>10.4f}"
              f"{c['seconds']:>10.3f}")
    print(f"\noptimised in {rep['seconds']:.3f} s (expected error of the GLS answers, exact; no data read, "
          "no noise drawn)")


def _optimize(args: argparse.Namespace) -> int:
    budget = _budget(args)
    if args.time_limit is not None:
        check_positive(args.time_limit, "time_limit")
    for flag, target in (("--json", args.json), ("--save", args.save)):
        if target is not None and not Path(target).resolve().parent.is_dir():
            raise SparseDPError(f"{flag}: the directory of {target} does not exist")
    W, label = load_union(args.workload, args.n, args.lo, args.hi)
    # scored at the budget, under the noise the mechanism draws (exact discrete noise unless --float-noise)
    at = {budget[0]: budget[1], "secure": not args.float_noise}
    res = optimize(W, noise=args.noise, family=args.family, time_limit=args.time_limit, rng=args.seed, p=args.p,
                   restarts=args.restarts, maxiter=args.maxiter, **at)
    templates = None
    if args.family not in ("auto", "templates"):  # the templates are always shown, for comparison
        templates = optimize(W, noise=args.noise, family="templates", **at)
    rep = report(res, label, W.shape[0], W.shape[1], (budget[0], budget[1], 1.0), args.family, templates,
                 union=isinstance(W, wl.WeightedUnionWorkload))
    _print(rep)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    if args.save:
        sp.save_npz(args.save, sp.csr_matrix(res.strategy.tosparse()))
        print(f"strategy ({res.strategy.shape[0]} x {res.strategy.shape[1]}, Delta = {res.sensitivity:.10g}) -> {args.save}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``optimize`` command."""
    p = subparsers.add_parser("optimize", help="the strategy with the lowest exact error for a workload",
                              description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", required=True, action="append", metavar="prefix|all-ranges|identity|total|FILE[:W]",
                   help="a named workload over --n cells, FILE.npz (scipy.sparse) / FILE.npy (dense), one row "
                   "per query, or FILE.csv / FILE.parquet: one range query per row (--lo, --hi columns); "
                   "repeat it, with :WEIGHT (a positive number, or 'mean' = 1 / its queries), to optimise a "
                   "weighted union, e.g. --workload all-ranges:mean --workload total:0.9")
    p.add_argument("--n", type=int, default=None,
                   help="number of cells (required for a named workload and a table of ranges)")
    p.add_argument("--lo", default="lo", help="a CSV / Parquet workload: the column of each range's first bin "
                   "(0-based, inclusive; default lo)")
    p.add_argument("--hi", default="hi", help="a CSV / Parquet workload: the column of each range's last bin "
                   "(inclusive; default hi)")
    p.add_argument("--noise", choices=("laplace", "gaussian"), default="laplace",
                   help="laplace (pure DP, Delta_1 = 1; default) or gaussian (zCDP, Delta_2 = 1)")
    p.add_argument("--family", choices=FAMILIES, default="auto",
                   help="strategy family: auto (all that apply, never worse than the best template; default), "
                   "templates, tree, hybrid or pidentity")
    p.add_argument("--epsilon", type=float, default=None, help="score and report errors at this epsilon (Laplace; "
                   "default 1)")
    p.add_argument("--float-noise", action="store_true", help="score with float noise (the mechanism's "
                   "secure=False) instead of the exact discrete noise it draws by default")
    p.add_argument("--rho", type=float, default=None, help="score and report errors at this rho (Gaussian; "
                   "default 1)")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, metavar="SECONDS",
                   help="wall-clock limit of the search (the templates are always scored; default: none, "
                   "the search stops on progress and iteration counts, so it gives the same strategy on any machine)")
    p.add_argument("--p", type=int, default=None, help="p-Identity: extra rows (default: the internal nodes of the "
                   "16-ary tree over --n cells, at most 300); hybrid: dense rows on the block sums")
    p.add_argument("--restarts", type=int, default=None, help="p-Identity starts, the first a fitted tree "
                   "(default 2 for n <= 512, else 1)")
    p.add_argument("--maxiter", type=int, default=None, help="L-BFGS-B iterations per p-Identity start and of the "
                   "hybrid's polish (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the optimiser's random starts (default 0; no "
                   "privacy noise is drawn)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the report as JSON to OUT")
    p.add_argument("--save", default=None, metavar="FILE", help="write the strategy as a scipy.sparse .npz")
    p.set_defaults(func=_optimize)
