"""``sparsedp histogram`` (publish a histogram) and ``sparsedp query`` (range counts from a release).

The noise is exact discrete Laplace (the one measurement path, ``secure=True``) from OS entropy
unless ``--seed`` is given; ``--float-noise`` draws float64 Laplace noise instead (it leaks through
its low bits, Mironov 2012: for experiments only; the file records ``secure = False``).  A seeded
run is reproducible and therefore NOT a private release: it says so on stdout and saves
``private = False`` in the release file, and ``sparsedp query`` warns on stderr when it reads such a
file.

One method name is one algorithm, whichever path runs it (issue 27): ``--method boost``,
``boost-un`` and ``lue`` run the chunked functions of :mod:`sparsedp.scaleout` in this process
(``--out`` an ``.npz`` with each bin's exact variance) and with ``--executor inprocess|threads|dask``
(``--out`` a ``.npy`` / ``.zarr`` array of leaf estimates written block by block, with the ledger in
``OUT.release.json``, and a bound on the variances); the same ``--seed`` (and ``--k`` / ``--chunk``)
publishes the same answers on every path, bit for bit.

* ``boost``: Boost (Hay, Rastogi, Miklau, Suciu, VLDB 2010) -- every node of the balanced ``--k``-ary
  tree of :func:`sparsedp.strategies.hierarchical` (default ``k = 16``; ``--k 2`` is the paper's
  binary tree) measured with the uniform budget ``epsilon / levels``, then the BLUE under
  consistency (:func:`sparsedp.scaleout.release_hierarchical`);
* ``boost-un``: the same tree with one budget per level ``~ P_l^(1/3)`` (Boost-UN);
* ``lue``: LUE-DPTree (``--tree sc|kary``, per-node budgets; :func:`sparsedp.scaleout.release_lue`),
  whose chunks are the maximal tree nodes of at most ``--chunk`` leaves (default ``2^20``).

``--chunk`` (leaves per task: boost a power of ``k``, default the largest up to ``2^20``) decides
which noise stream draws which node, so it is part of the release on every path.  With
``--executor``: a new ``LocalCluster`` (``--workers K --worker-memory 4GB``) or a running scheduler
(``--scheduler ADDRESS``); DATA is a ``.npy`` (memory-mapped) or ``.zarr`` array of counts, or
(boost, boost-un) records -- a Parquet / CSV file or a directory of them -- with ``--column C --bins
START STOP WIDTH`` (binned part by part on the workers, :func:`sparsedp.scaleout.release_records`;
outside the domain refused unless ``--clip``).  ``privelet`` and ``dwork`` run in this process only
(``--executor`` refuses them).  A progress bar counts chunks on a terminal.

Records of many rows per person: ``--privacy-unit COLUMN --max-rows K|auto [--max-groups G
--max-rows-per-group R] [--drop-missing-units]`` (with ``--column`` and ``--bins``) reads the unit's
column as text, truncates each unit's rows (the bins as groups; priorities keyed on the row itself,
so the same rows on every path) and runs the method at ``unit.row_budget("laplace", epsilon)``:
``--epsilon`` per unit (``auto``: a share of it chooses the bound first, its own ledger entry).
Without a unit, a table with an identifier-like column draws a one-line warning on stderr.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path
from typing import Any

import numpy as np


from ..io import Bins, load_histogram
from ..privacy_unit_cli import add_unit_arguments, id_warnings_on_stderr, unit_from_args
from .publishers import PUBLISHERS

__all__ = ["register"]


def _scaleout_executor(args: argparse.Namespace):
    from ..executors import DaskExecutor, InProcessExecutor, ThreadExecutor

    if args.executor == "inprocess":
        return InProcessExecutor()
    if args.executor == "threads":
        return ThreadExecutor(args.workers)
    if args.scheduler:
        return DaskExecutor.connect(args.scheduler)
    return DaskExecutor.local(n_workers=args.workers or 2, threads_per_worker=1, processes=True,
                              memory_limit=args.worker_memory)


def _records_histogram(args: argparse.Namespace, bins: Bins | None) -> tuple[np.ndarray, Any, Any, float]:
    """``(histogram, privacy unit, bound choice, epsilon the publisher runs at)`` in this process.
    Without ``--privacy-unit``: the histogram as read (warning on stderr when the table has an
    identifier-like column) at ``--epsilon``.  With it: the records binned (every check), the unit
    ids read as text, ``--max-rows auto`` chosen (charged, after the checks), each unit's rows
    truncated (:func:`sparsedp.unit_records.truncated_histogram`, the bins as groups), and the
    publisher run at the unit's per-row budget, so that the release costs ``--epsilon`` per unit."""
    from ..errors import SparseDPError
    from ..io import table_columns
    from ..privacy_unit import warn_if_id_like
    from ..unit_records import read_unit_histogram

    unit, drop = unit_from_args(args)
    if unit.is_row:
        with id_warnings_on_stderr():
            warn_if_id_like(table_columns(args.data), unit)
        return load_histogram(args.data, args.column, bins, clip=args.clip), unit, None, args.epsilon
    if bins is None or args.column is None:
        raise SparseDPError("--privacy-unit applies to records: give --column and --bins START STOP WIDTH (a table of "
                            "counts has no rows per unit)")
    x, concrete, choice, rest = read_unit_histogram(args.data, args.column, bins, unit, clip=args.clip,
                                                    drop_missing=drop, epsilon=args.epsilon, rng=args.seed)
    return x, concrete, choice, concrete.row_budget("laplace", rest)


def _unit_text(unit: Any, choice: Any, epsilon: float) -> str:
    """``epsilon 1 per CustomerID (max_rows 50)``, and how an ``auto`` bound was chosen."""
    from ..unit_records import unit_summary

    text = unit_summary(unit, epsilon)
    if choice is not None:
        spent = ", ".join(f"{k} {v:g}" for k, v in choice.describe()["spent"].items())
        text += f" (max_rows chosen privately with {spent} of it)"
    return text


#: The methods published chunk by chunk (the same function in process and on every executor).
CHUNKED = ("boost", "boost-un", "lue")

#: ``--k`` of boost / boost-un when omitted: 16 (measured in docs/trees.md: at 2^20 bins the mean
#: variance of a random range is 2.07x lower than the binary tree's, per bin 7.9x, and it is faster).
BOOST_K = 16


def _histogram_chunked(args: argparse.Namespace, method: str) -> int:
    """``--method boost | boost-un | lue``: :func:`sparsedp.scaleout.release_hierarchical` or
    :func:`sparsedp.scaleout.release_lue`, in this process (``--out`` an ``.npz`` with each bin's
    exact variance) or on ``--executor`` (``--out`` a ``.npy`` / ``.zarr`` written block by block
    and its record): one function, so one ``--seed`` publishes the same answers on every path."""
    from ..errors import SparseDPError
    from ..executors import InProcessExecutor
    from ..scaleout import release_hierarchical, release_lue

    inproc = args.executor is None
    records = args.column is not None or args.bins is not None
    if inproc:
        if Path(args.out).suffix in (".npy", ".zarr"):
            raise SparseDPError(f"--out {args.out}: a histogram published in this process is an .npz release file "
                                "(with each bin's exact variance); a .npy / .zarr array of bins is written chunk by "
                                "chunk with --executor inprocess|threads|dask")
    else:
        data = Path(args.data)
        if method == "lue" and (records or args.clip):
            raise SparseDPError("--method lue with --executor publishes a .npy / .zarr array of counts; records "
                                "(--column / --bins) are binned with --method boost or boost-un")
        if records and (args.column is None or args.bins is None):
            raise SparseDPError("--executor bins records: give both --column and --bins START STOP WIDTH "
                                "(or pass a .npy / .zarr array of counts with neither)")
        if not records and (data.is_dir() and data.suffix != ".zarr" or
                            data.suffix.lower() in (".parquet", ".pq", ".csv")):
            raise SparseDPError(f"{args.data} holds records: give --column and --bins START STOP WIDTH to bin them")
        if args.clip and not records:
            raise SparseDPError("--clip applies to records binned with --column / --bins")
        if Path(args.out).suffix not in (".npy", ".zarr"):
            raise SparseDPError(f"--out must be a .npy or .zarr path with --executor, got {args.out}")
    source: object = args.data
    unit, drop = unit_from_args(args)
    choice, epsilon = None, args.epsilon
    if inproc:  # .npy, CSV or Parquet (records binned here), checked as the in-process publishers check it
        bins = None if args.bins is None else Bins(*args.bins)
        source, unit, choice, epsilon = _records_histogram(args, bins)
    else:
        if not unit.is_row and not records:
            raise SparseDPError("--privacy-unit applies to records: give --column and --bins START STOP WIDTH")
        if unit.is_row:
            from ..io import table_columns
            from ..privacy_unit import warn_if_id_like

            with id_warnings_on_stderr():
                warn_if_id_like(table_columns(args.data), unit)
    out = None if inproc else args.out
    common = dict(chunk=args.chunk, rng=args.seed, out=out, secure=not args.float_noise, progress=None,
                  variances=inproc)
    ex = InProcessExecutor() if inproc else _scaleout_executor(args)
    try:
        if method == "lue":
            r = release_lue(source, epsilon, tree=args.tree, k=args.k, upper=args.upper, executor=ex, **common)
        else:
            kw = dict(k=args.k or BOOST_K, level_weights="boost-un" if method == "boost-un" else None, **common)
            if records and not inproc:
                from ..scaleout import release_records

                start, stop, width = args.bins
                kw.pop("variances")
                r = release_records(args.data, args.column, Bins(start, stop, width), args.epsilon, clip=args.clip,
                                    executor=ex, privacy_unit=unit, drop_missing_units=drop, **kw)
                unit, choice = r.privacy_unit or unit, r.bound_choice
            else:
                r = release_hierarchical(source, epsilon, executor=ex, **kw)
    finally:
        ex.close()
    if method == "lue":
        largest = int(np.diff(r.bounds).max())
        meta = {"method": "lue", "tree": r.tree, "n": r.n, "k": r.k, "chunks": r.chunks, "largest_chunk": largest,
                "levels": r.levels, "nodes": r.nodes, "epsilon": r.epsilon, "certified_loss": r.loss,
                "min_scale": r.min_scale, "max_scale": r.max_scale}
        shape = f"{r.chunks} chunks of at most {largest} leaves, {r.tree} tree, k = {r.k}"
    else:
        meta = {"method": method, "n": r.n, "k": r.k, "chunk": r.chunk, "chunks": r.chunks, "levels": r.levels,
                "epsilon": r.epsilon, "certified_loss": r.loss, "level_scales": r.level_scales.tolist(),
                "level_variances": r.level_variances.tolist()}
        shape = f"{r.chunks} chunks of {r.chunk} leaves, k = {r.k}"
    meta.update(secure=r.secure, executor=r.executor, privacy_unit=unit.describe())
    if records:
        meta.update(column=args.column, bins=dict(zip(("start", "stop", "width"), args.bins)), clip=bool(args.clip))
    noise = "exact discrete Laplace" if r.secure else "float Laplace (--float-noise)"
    if inproc:
        from ..unit_records import per_unit_release

        per_unit_release(r.to_release(description=meta), unit, choice).save(
            args.out, overwrite=bool(getattr(args, "force", False)))
        where, side = "in process", ""
    else:
        meta.update(estimate=str(args.out), private=r.private, ledger=[r.ledger.as_dict()])
        where, side = f"on {r.executor}", f" (ledger: {_write_record(r, meta, args.out, bool(getattr(args, 'force', False)))})"
    print(f"{method}: published {r.n} bins at {_unit_text(unit, choice, args.epsilon)} {where} ({shape}), {noise} noise -> "
          f"{args.out}{side}")
    if args.seed is not None:
        print("WARNING: NOT private: --seed makes the noise reproducible (the file records private=False); "
              "omit it for a real release.")
    return 0


def _write_record(r, meta: dict, out: str, overwrite: bool) -> Path:
    """``OUT.release.json``: the release record of the chunked release ``r`` (its
    :meth:`to_release` saved next to ``OUT``, which holds the answers already), with ``meta``'s
    fields as its description and, as in earlier versions, at its top level (an existing record is
    replaced only with ``overwrite``: ``--force``)."""
    desc = {k: v for k, v in meta.items() if k not in ("private", "ledger")}
    r.to_release(description=desc).save(out, overwrite=overwrite)
    return Path(str(out) + ".release.json")


def _histogram(args: argparse.Namespace) -> int:
    from ..errors import SparseDPError

    if args.executor is None and (args.scheduler or args.workers or args.worker_memory):
        raise SparseDPError("--scheduler, --workers and --worker-memory need --executor")
    if args.scheduler and args.executor != "dask":
        raise SparseDPError("--scheduler needs --executor dask")
    method = args.method or ("lue" if args.executor is None else "boost")
    if method in CHUNKED:
        return _histogram_chunked(args, method)
    if args.executor is not None:
        raise SparseDPError(f"--method {method} runs in this process only (omit --executor); --executor publishes "
                            f"--method {', '.join(CHUNKED)} chunk by chunk")
    if args.chunk is not None:
        raise SparseDPError(f"--chunk applies to --method {', '.join(CHUNKED)} (published chunk by chunk), not {method}")
    if Path(args.out).suffix in (".npy", ".zarr"):
        raise SparseDPError(f"--out {args.out}: a histogram published in one piece is an .npz release file (with each "
                            "bin's variance); a .npy / .zarr array of bins is written chunk by chunk with --method "
                            f"{', '.join(CHUNKED)} and --executor inprocess|threads|dask")
    bins = None
    if args.bins is not None:
        start, stop, width = args.bins
        bins = Bins(start, stop, width)
    x, unit, choice, epsilon = _records_histogram(args, bins)  # .npy, CSV or Parquet; truncated per unit
    pub = PUBLISHERS[method](epsilon, secure=not args.float_noise)
    pub.fit(x, rng=args.seed)  # None: OS entropy
    release = pub.release_
    assert release is not None
    if args.seed is not None:
        release = dataclasses.replace(release, private=False)
    from ..unit_records import per_unit_release

    per_unit_release(release.to_release(), unit, choice).save(args.out, overwrite=bool(getattr(args, "force", False)))
    noise = "exact discrete Laplace" if release.secure else "float Laplace (--float-noise)"
    print(f"{method}: published {release.n} bins at {_unit_text(unit, choice, args.epsilon)}, {noise} noise -> "
          f"{args.out}")
    if args.seed is not None:
        print("WARNING: NOT private: --seed makes the noise reproducible (the file records private=False); "
              "omit it for a real release.")
    return 0


def _query(args: argparse.Namespace) -> int:
    from ..errors import SparseDPError
    from ..releases import load_release

    release = load_release(args.release)  # every release file: .npz, .npy / .zarr with its record, JSON
    if not release.private:
        why = "it records no measurement" if not release.ledger else "it was published with a fixed --seed"
        print(f"warning: {args.release} is not private ({why})", file=sys.stderr)
    if not release.secure:
        print(f"warning: {args.release} was published with float noise (--float-noise), which leaks through its "
              "low bits", file=sys.stderr)
    if (args.lo is None) != (args.hi is None):
        raise SparseDPError("give both LO and HI, or neither (every answer)")
    n = len(release)
    if args.lo is not None and list(release.labels) == ["bin"]:  # a histogram: the count of bins LO..HI
        if not 0 <= args.lo <= args.hi < n:
            raise SparseDPError(f"need 0 <= lo <= hi < {n}, got lo={args.lo}, hi={args.hi}")
        source = release.source
        if hasattr(source, "range"):  # a histogram file (exact for trees answered from raw nodes too)
            value = source.range(args.lo, args.hi)
        else:  # consistent leaf estimates: a range is their sum
            value = float(np.sum(np.asarray(release.answers[args.lo:args.hi + 1], dtype=np.float64)))
        print(f"{value:.6g}")
        return 0
    rows = None
    if args.lo is not None:
        if not 0 <= args.lo <= args.hi < n:
            raise SparseDPError(f"need 0 <= lo <= hi < {n} (answers of this {release.kind} release), got lo={args.lo}, "
                                f"hi={args.hi}")
        rows = slice(args.lo, args.hi + 1)
    table = release.table(args.level, rows=rows)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow([*table.keys()])
    cols = list(table.values())
    for i in range(cols[0].shape[0]):
        out.writerow([_cell(c[i]) for c in cols])
    return 0


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.10g}"
    return str(v)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``histogram`` and ``query`` commands."""
    h = subparsers.add_parser(
        "histogram",
        help="publish an epsilon-DP histogram (LUE-DPTree or a baseline) to an .npz release",
        description="Publish the counts in DATA.npy (1-D non-negative integers) with epsilon-DP. "
        "lue = LUE-DPTree (per-node budgets on an interval tree + O(n) BLUE); boost = Boost (Hay et al. 2010): "
        "balanced --k-ary tree (default 16; --k 2 is the paper's binary tree), uniform budget epsilon / levels "
        "per node, BLUE under consistency; boost-un = the same tree, one budget per level ~ P_l^(1/3); "
        "privelet = Haar wavelet; dwork = Laplace noise on every bin. boost, boost-un and lue run one chunked "
        "algorithm in this process (.npz with each bin's exact variance) and with --executor (.npy / .zarr): "
        "the same --seed, --k and --chunk publish the same answers on every path.",
    )
    h.add_argument("data", help="input: a .npy array of counts, or a CSV / Parquet file (with --column); with "
                   "--bins the values are records, binned on a public domain (with --executor: a .npy / .zarr array "
                   "of counts, or a Parquet / CSV file or directory of records with --column and --bins)")
    h.add_argument("--column", default=None, help="the column of a CSV / Parquet file")
    h.add_argument("--bins", type=float, nargs=3, metavar=("START", "STOP", "WIDTH"), default=None,
                   help="bin record values on the public domain [START, STOP) in bins of WIDTH")
    h.add_argument("--clip", action="store_true", help="clip records outside the domain into the end bins "
                   "(default: refuse them)")
    h.add_argument("--epsilon", type=float, required=True, help="privacy budget epsilon > 0 (pure DP)")
    h.add_argument("--method", choices=sorted(PUBLISHERS), default=None,
                   help="publisher (default lue in this process, boost with --executor); boost, boost-un and lue "
                   "run the same algorithm on both paths, privelet and dwork in this process only")
    h.add_argument("--tree", choices=("sc", "kary"), default="sc",
                   help="tree for --method lue: sc = Struct-Construct, kary = balanced (default %(default)s)")
    h.add_argument("--k", type=int, default=None,
                   help="branching: boost / boost-un default 16 (2 = the paper's binary tree); lue sc chosen in "
                   "[2, UPPER] if omitted, kary default 2")
    h.add_argument("--upper", type=int, default=20,
                   help="largest branching SC may choose (default %(default)s)")
    h.add_argument("--seed", type=int, default=None,
                   help="seed of the noise generator, for reproducible tests only: the release is then NOT "
                   "private and is marked private=False (default: OS entropy)")
    h.add_argument("--float-noise", action="store_true",
                   help="float64 Laplace noise instead of the default exact discrete Laplace (leaks through its "
                   "low bits, Mironov 2012: for experiments only; the file records secure=False)")
    h.add_argument("--out", required=True, help="output release file (.npz, with each bin's exact variance); with "
                   "--executor the leaf estimates (.npy or .zarr, written chunk by chunk) and OUT.release.json")
    s = h.add_argument_group("scale-out (chunk by chunk, sparsedp.scaleout; --method boost, boost-un or lue: the "
                             "same release as in this process)")
    s.add_argument("--executor", choices=("inprocess", "threads", "dask"), default=None,
                   help="publish chunk by chunk on this executor (default: the whole array in this process)")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="with --executor dask: a running scheduler (tcp://host:8786) instead of a new LocalCluster")
    s.add_argument("--workers", type=int, default=None, help="workers of the new LocalCluster (default 2) or threads")
    s.add_argument("--worker-memory", default=None, metavar="SIZE",
                   help="memory limit per LocalCluster worker, e.g. 4GB (default: Dask's share of the machine)")
    s.add_argument("--chunk", type=int, default=None,
                   help="leaves per task, in this process too (it decides which noise stream draws which node): "
                   "boost / boost-un a power of --k (default: the largest power of k up to 2^20); lue the largest "
                   "chunk, whose roots are the maximal tree nodes of at most that many leaves (default 2^20)")
    add_unit_arguments(h)
    h.set_defaults(func=_histogram)
    q = subparsers.add_parser(
        "query",
        help="answers of a release file: the range count of bins LO..HI of a histogram, or every answer",
        description="Read any sparsedp release file (an .npz, a chunked .npy / .zarr array with its .release.json "
        "record, the JSON of 'sparsedp marginals'). For a histogram (answers labelled by bin), LO HI print the "
        "published count of bins LO..HI (inclusive, 0-based: bins are numbered from 0 and both ends count). "
        "Otherwise, or without LO HI, print the answers as CSV: their labels, answer, variance and the interval "
        "at --level (rows LO..HI only when given).",
    )
    q.add_argument("release", type=Path, help="a release file written by sparsedp (any kind)")
    q.add_argument("lo", type=int, nargs="?", default=None, help="first bin / answer (0-based, inclusive)")
    q.add_argument("hi", type=int, nargs="?", default=None, help="last bin / answer (0-based, inclusive)")
    q.add_argument("--level", type=float, default=0.95,
                   help="confidence level of the intervals in the table (default %(default)s)")
    q.set_defaults(func=_query)
