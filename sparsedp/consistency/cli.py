"""``sparsedp restaurant``: seed 002's restaurant release from the command line.

The noise is exact discrete Laplace from OS entropy by default; ``--float-noise`` draws float64
Laplace noise instead (leaks through its low bits: for experiments), ``--seed`` makes the noise
reproducible and the release NOT private.  The JSON records ``secure`` and ``private``; ``--out``
writes a sparsedp release file (the consistent vector ``x``, description, the measurement's ledger
entry; ``sparsedp ledger FILE`` prints it).

``--data SALES`` releases a user's own daily item sales instead of the synthetic ones
(:func:`load_sales`): one row per day, the five item columns ``cola, burger, wings, fries,
nuggets`` of a CSV / Parquet file (other columns are ignored), or a ``(days, 5)`` ``.npy`` array
in that column order.  The release's privacy unit is one *order* (one combo, at most 5 items), so
the sales must be what orders of the three combos produce: every day's row must equal
``orders @ COMBOS`` for non-negative integer orders.  The combo matrix has full row rank (its
cola, fries and nuggets columns form a unimodular 3 x 3 matrix), so those orders are determined by
the day's sales and are recovered exactly in integer arithmetic; a day whose sales no orders
produce is refused (its items are not sold in combos, and one such sale would change the counts
outside the bound ``Delta_1 = 5 h``).  Everything is checked before the budget is charged or any
noise drawn.

Scale-out (issue 14): ``--out OUT.npy|OUT.zarr`` (or ``--chunk DAYS``) releases chunk by chunk
(:func:`sparsedp.scaleout.treespan.release_restaurant`): ``--data`` a ``(days, 5)`` ``.npy``
(memory-mapped) or ``.zarr`` array, cut into chunks of ``--chunk`` days (a power of 2), each
measured, reduced and released by one task on ``--executor inprocess|threads|dask`` (a new
``LocalCluster`` of ``--workers`` processes with ``--worker-memory`` each, or ``--scheduler
ADDRESS``); the consistent ``(days, 5)`` values are written block by block to ``OUT`` and the
summary with the ledger to ``OUT.release.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from .._cli_util import warn_not_private
from ..errors import ShapeError, SparseDPError
from ..io import load_npy_table, read_columns
from ..progress import SolverProgress
from .restaurant import _BASIS, _BASIS_INV  # noqa: F401 (the order-recovery basis; checked by the tests)
from .restaurant import COMBOS, ITEMS, RestaurantSales, _orders_of, restaurant, restaurant_release
from .solvers import METHODS

__all__ = ["load_sales", "register"]

DEFAULT_DAYS = 1024
#: Phases of the chunked release that see only noisy values (their timings may be published).
_NOISY_PHASES = ("top", "downward+write")


def _sales_table(p: Path) -> np.ndarray:
    """The ``(days, 5)`` float64 item sales of a file (see the module docstring)."""
    if not p.exists():
        raise SparseDPError(f"no such file: {p}")
    suffix = p.suffix.lower()
    if suffix == ".npy":
        arr = load_npy_table(p, len(ITEMS), f"a (days, {len(ITEMS)}) array of daily sales ({', '.join(ITEMS)})",
                             "sales are not real numbers")
        table = arr.astype(np.float64)
    elif suffix in (".csv", ".parquet", ".pq"):
        cols = read_columns(p, list(ITEMS))  # missing file / column, non-numeric, no rows: SparseDPError
        table = np.column_stack([cols[item] for item in ITEMS])
    else:
        raise SparseDPError(f"unsupported sales file {p.name}: use .csv, .parquet or .npy")
    if table.shape[0] == 0:
        raise SparseDPError(f"{p} holds no days of sales")
    return table


def load_sales(path: str | Path, days: int | None = None) -> RestaurantSales:
    """A user's daily item sales from ``path``, validated, with the combo orders they imply.

    Refused with a :class:`~sparsedp.errors.SparseDPError` before anything is measured: a missing
    file or item column, non-numeric, missing / NaN / infinite, negative, fractional or too large
    (``> 2^50``) sales, a file without rows, ``days`` (if given) different from the file's row
    count, and a day whose sales are not ``orders @ COMBOS`` for non-negative integer orders.
    """
    p = Path(path)
    table = _sales_table(p)
    T = table.shape[0]
    if days is not None and days != T:
        raise ShapeError(f"--days {days} but {p.name} holds {T} days of sales (omit --days to use the file's)")
    orders = _orders_of(table, p.name)
    sales = orders @ COMBOS
    return RestaurantSales(orders=orders, sales=sales)


def _scaleout(args: argparse.Namespace) -> int:
    """The chunk-by-chunk release (module docstring); options are checked before anything is read."""
    from ..executors import DaskExecutor, InProcessExecutor, ThreadExecutor
    from ..scaleout.treespan import release_restaurant

    if args.data is None or Path(args.data).suffix not in (".npy", ".zarr"):
        raise SparseDPError("the chunked release (--out .npy/.zarr or --chunk) reads --data as a (days, 5) .npy or "
                            ".zarr array")
    if args.out is None or Path(args.out).suffix not in (".npy", ".zarr"):
        raise SparseDPError(f"the chunked release writes --out as a .npy or .zarr array, got {args.out}")
    unsupported = [flag for flag, on in (("--evaluate", args.evaluate), ("--plot", args.plot),
                                         ("--method", args.method != "auto"), ("--combos-at", args.combos_at != "leaves"),
                                         ("--tol", args.tol is not None)) if on]
    if unsupported:
        raise SparseDPError(f"{', '.join(unsupported)} do(es) not apply to the chunked release (the exact tree x span "
                            "projection)")
    if args.scheduler and args.executor != "dask":
        raise SparseDPError("--scheduler needs --executor dask")
    if args.days is not None:
        from ..scaleout.treespan import _shape

        T = _shape(args.data)[0]
        if T != args.days:
            raise ShapeError(f"--days {args.days} but {Path(args.data).name} holds {T} days of sales")
    private = warn_not_private(args.seed, False, "the true sales")
    if args.executor == "threads":
        ex = ThreadExecutor(args.workers)
    elif args.executor == "dask":
        ex = DaskExecutor.connect(args.scheduler) if args.scheduler else DaskExecutor.local(
            n_workers=args.workers or 2, threads_per_worker=1, processes=True, memory_limit=args.worker_memory)
    else:
        ex = InProcessExecutor()
    try:
        r = release_restaurant(args.data, args.epsilon, chunk=args.chunk, executor=ex, rng=args.seed, out=args.out,
                               secure=not args.float_noise)
    finally:
        ex.close()
    noise = "exact discrete Laplace" if r.secure else "float Laplace (--float-noise)"
    summary = {"private": private and r.private, "secure": r.secure, "noise": noise, "noise_seed": args.seed,
               "days": r.days, "chunk": r.chunk, "chunks": r.chunks, "levels": r.levels, "epsilon": r.epsilon,
               "certified_loss": r.loss, "sensitivity": r.sensitivity, "laplace_scale": r.scale,
               "noise_variance": r.variance, "executor": r.executor,
               # only the phases on noisy values: validating and measuring the true sales take
               # data-dependent time (issue 26), so neither they nor the total are published
               "seconds": {k: v for k, v in r.timings.items() if k in _NOISY_PHASES},
               "ledger": [r.ledger.as_dict()], "estimate": str(args.out), "items": list(ITEMS)}
    # OUT.release.json: the release record (sparsedp.load_release reads OUT with it); the summary's
    # fields also at its top level, as before; no timing in the description
    desc = {k: v for k, v in summary.items() if k not in ("private", "ledger", "seconds")}
    r.to_release(description=desc, private=summary["private"]).save(args.out, overwrite=bool(getattr(args, "force", False)))
    side = Path(str(args.out) + ".release.json")
    record = json.loads(side.read_text())
    record["seconds"] = summary["seconds"]
    side.write_text(json.dumps(record, indent=1) + "\n")
    if args.json:  # the same record
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(f"restaurant: {r.days} days x {len(ITEMS)} items released chunk by chunk on {r.executor} ({r.chunks} chunks "
          f"of {r.chunk} days)\nepsilon {r.epsilon:g}, Delta_1 = 5h = {r.sensitivity:g}, Laplace scale {r.scale:g} "
          f"({noise}) -> {args.out} (ledger: {side})")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.days is not None and args.days < 1:
        raise SparseDPError(f"--days must be >= 1, got {args.days}")
    if args.chunk is not None or (args.out is not None and Path(args.out).suffix in (".npy", ".zarr")):
        return _scaleout(args)
    if args.scheduler or args.workers or args.worker_memory:
        raise SparseDPError("--scheduler, --workers and --worker-memory apply to the chunked release (--out .npy/.zarr)")
    if args.data is not None:  # validated before anything is charged or drawn
        sales = load_sales(args.data, args.days)
    else:  # synthetic data; the noise is seeded separately
        sales = restaurant(DEFAULT_DAYS if args.days is None else args.days, seed=args.data_seed)
    private = warn_not_private(args.seed, args.evaluate, "the true sales")
    progress = SolverProgress(args.tol, desc="consistency")
    try:
        rel = restaurant_release(
            epsilon=args.epsilon,
            method=args.method,
            seed=args.seed,
            sales=sales,
            combos_at=args.combos_at,
            tol=args.tol,
            max_sweeps=args.max_sweeps,
            executor=args.executor,
            callback=progress,
            evaluate=args.evaluate,
            secure=not args.float_noise,
        )
    finally:
        progress.close()
    res = rel.result
    noise = "exact discrete Laplace" if rel.secure else "float Laplace (--float-noise)"
    summary: dict[str, Any] = {
        "private": private and rel.private,
        "secure": rel.secure,
        "noise": noise,
        "noise_seed": args.seed,
        "data": "file" if args.data is not None else "synthetic",
        "data_seed": None if args.data is not None else args.data_seed,
        "days": rel.sales.days,
        "variables": int(rel.noisy.size),
        "constraints": res.constraints,
        "method": res.method,
        "seconds": res.seconds,
        "iterations": res.iterations,
        "residual": res.residual,
        "relative_residual": res.relative_residual,
        "converged": res.converged,
        "epsilon": rel.epsilon,
        "sensitivity": rel.sensitivity,
        "laplace_scale": rel.scale,
        "executor": res.executor,
    }
    print(
        f"restaurant: {summary['days']} days, {summary['variables']} variables, {summary['constraints']} constraints\n"
        f"epsilon {rel.epsilon:g}, Delta_1 = 5h = {rel.sensitivity:g}, Laplace scale {rel.scale:g} ({noise})\n"
        f"method {res.method}: {res.iterations} iterations, {res.seconds:.3f} s, residual max|Cx-b| = {res.residual:.2e} "
        f"(relative {res.relative_residual:.1e})"
        f"{'' if res.converged else ' (NOT converged)'}"
    )
    if args.evaluate:
        summary["evaluation"] = {"rmse_noisy": rel.rmse_noisy, "rmse_consistent": rel.rmse_consistent}
        print(f"evaluation (not private): RMSE per tree node: noisy {rel.rmse_noisy:.4g} -> consistent "
              f"{rel.rmse_consistent:.4g}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    if args.out:
        desc = {k: summary[k] for k in ("secure", "noise", "days", "epsilon", "sensitivity", "laplace_scale", "method",
                                        "noise_seed", "data", "data_seed")}
        rel.to_release(description=desc, private=summary["private"]).save(args.out, overwrite=bool(getattr(args, "force", False)))
    if args.plot:
        _plot(res.history, args.plot, res.method, args.evaluate)
    return 0


def _plot(history: dict[str, np.ndarray], path: str, method: str, evaluate: bool) -> None:
    """The consistency deviation per iteration; with ``evaluate`` also the RMSE against the truth."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - optional extra
        raise SparseDPError("--plot needs matplotlib (pip install 'sparsedp[plot]')") from exc
    fig, axes = plt.subplots(1, 2 if evaluate else 1, figsize=(9 if evaluate else 4.5, 3.5), squeeze=False)
    it = np.arange(len(history["mse"]))
    a = axes[0, 0]
    a.semilogy(it, np.maximum(history["mse"], 1e-300))
    a.set(xlabel="iteration", ylabel="mse_s (eq. 14)", title=f"consistency deviation ({method})")
    if evaluate:
        b = axes[0, 1]
        b.plot(it, history["err"])
        b.set(xlabel="iteration", ylabel="err_s (eq. 15)", title="RMSE against the truth (not private)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sparsedp restaurant``."""
    p = subparsers.add_parser(
        "restaurant",
        help="seed 002's restaurant: DP item trees made consistent with tree and combo constraints",
        description="Read the restaurant's daily item sales (--data) or generate them (5 items sold in 3 combos), release each item's "
        "binary tree over the days with Laplace noise (Delta_1 = 5h, one order), and make the release "
        "consistent (parent = sum of children; every node's 5 counts in the span of the combos).  The noise "
        "is exact discrete Laplace from OS entropy (--float-noise: float64 Laplace, for experiments); --seed "
        "makes it reproducible and the release NOT private.  Comparisons with the true sales appear only "
        "with --evaluate (also not private).",
    )
    p.add_argument("--data", metavar="SALES", default=None,
                   help="the daily item sales to release: a CSV / Parquet file with one row per day and the columns "
                   "cola, burger, wings, fries, nuggets (whole non-negative counts, each day a combination of the "
                   "combos: the orders are recovered exactly), or a (days, 5) .npy array in that order; checked "
                   "before any noise is drawn (default: synthetic sales from --data-seed)")
    p.add_argument("--days", type=int, default=None,
                   help=f"number of days T (default: the file's rows with --data, else {DEFAULT_DAYS}; with --data "
                   "it must match the file)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default %(default)s)")
    p.add_argument("--method", choices=METHODS, default="auto", help="consistency solver (default %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the privacy noise (reproducible, NOT private; default: OS entropy)")
    p.add_argument("--float-noise", action="store_true",
                   help="float64 Laplace noise instead of the default exact discrete Laplace (leaks through its "
                   "low bits, Mironov 2012: for experiments only)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic sales, without --data (default %(default)s)")
    p.add_argument("--evaluate", action="store_true",
                   help="evaluation mode: also report the RMSE against the true sales, in the output, the JSON "
                   "('evaluation') and the plot (the output is NOT private)")
    p.add_argument("--combos-at", choices=("leaves", "nodes"), default="leaves",
                   help="impose the combo constraint only at the leaves (the seed's T + 5 sub-problems) or "
                   "also at every internal node (implied, redundant rows); the answer is the same "
                   "(default %(default)s)")
    p.add_argument("--tol", type=float, default=None,
                   help="stop when max |Cx - b| <= TOL (default: the solver's, max(1e-10, the float64 floor))")
    p.add_argument("--max-sweeps", type=int, default=100_000, help="iteration cap for iterative methods (default %(default)s)")
    p.add_argument("--executor", choices=("inprocess", "threads", "dask"), default="inprocess",
                   help="where block projections run, or with --out .npy/.zarr where the chunks run; 'dask' starts a "
                   "LocalCluster (default %(default)s)")
    p.add_argument("--chunk", type=int, default=None, metavar="DAYS",
                   help="release chunk by chunk (scale-out): days per chunk, a power of 2 (default with --out "
                   ".npy/.zarr: the .zarr's own chunks, else the largest power of 2 up to 2^18)")
    p.add_argument("--workers", type=int, default=None, help="chunked release: workers of the new LocalCluster "
                   "(default 2) or threads")
    p.add_argument("--worker-memory", default=None, metavar="SIZE", help="chunked release: memory limit per "
                   "LocalCluster worker (e.g. 4GB)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS", help="chunked release with --executor dask: a "
                   "running scheduler (tcp://host:8786) instead of a new LocalCluster")
    p.add_argument("--json", metavar="FILE", help="write the summary (private, days, variables, constraints, method, "
                   "seconds, iterations, residual, ...; 'evaluation' only with --evaluate) as JSON")
    p.add_argument("--out", metavar="FILE.npz", help="write the released vector as a sparsedp release file (array "
                   "'x', the description and the ledger; 'sparsedp ledger FILE' prints it); a .npy / .zarr path "
                   "releases chunk by chunk and writes the consistent (days, 5) values there, the summary and "
                   "ledger to FILE.release.json")
    p.add_argument("--plot", metavar="FILE.png", help="draw the convergence curve (with --evaluate also the error "
                   "against the truth; needs matplotlib, the 'plot' extra)")
    p.set_defaults(func=_run)
