"""``sparsedp histogram`` (publish a histogram) and ``sparsedp query`` (range counts from a release).

The noise is exact discrete Laplace (the one measurement path, ``secure=True``) from OS entropy
unless ``--seed`` is given; ``--float-noise`` draws float64 Laplace noise instead (it leaks through
its low bits, Mironov 2012: for experiments only; the file records ``secure = False``).  A seeded
run is reproducible and therefore NOT a private release: it says so on stdout and saves
``private = False`` in the release file, and ``sparsedp query`` warns on stderr when it reads such a
file.

``--executor inprocess|threads|dask`` publishes chunk by chunk instead (:mod:`sparsedp.scaleout`,
issue 14): ``--method boost`` (uniform budget) or ``boost-un`` (budgets per level), the BLUE on a
balanced ``--k``-ary tree (default 16) whose subtrees of ``--chunk`` leaves are measured, reduced
and released one task each, on a new
``LocalCluster`` (``--workers K --worker-memory 4GB``) or a running scheduler (``--scheduler
ADDRESS``); DATA is a ``.npy`` (memory-mapped) or ``.zarr`` array of counts, or records (a Parquet /
CSV file or a directory of them) with ``--column C --bins START STOP WIDTH`` (binned part by part on
the workers, :func:`sparsedp.scaleout.release_records`; outside the domain refused unless
``--clip``), and ``--out`` a ``.npy`` / ``.zarr`` array of leaf estimates written block by block,
with the ledger in ``OUT.release.json``.  ``--method lue --executor ...`` publishes LUE-DPTree
(``--tree sc|kary``, per-node budgets) chunk by chunk (:func:`sparsedp.scaleout.release_lue`): its
chunks are the maximal tree nodes of at most ``--chunk`` leaves (default ``2^20``).  A progress
bar counts chunks on a terminal.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
from pathlib import Path

import numpy as np


from ..io import Bins, load_histogram
from .publishers import PUBLISHERS, LUEDPTree

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


def _histogram_scaleout(args: argparse.Namespace) -> int:
    from ..errors import SparseDPError
    from ..scaleout import release_hierarchical

    method = args.method or "boost"
    if method not in ("boost", "boost-un", "lue"):
        raise SparseDPError(f"--executor publishes --method boost, boost-un or lue (BLUE) chunk by chunk; got {method!r}")
    if method == "lue":
        return _histogram_scaleout_lue(args)
    records = args.column is not None or args.bins is not None
    data = Path(args.data)
    if records and (args.column is None or args.bins is None):
        raise SparseDPError("--executor bins records: give both --column and --bins START STOP WIDTH "
                            "(or pass a .npy / .zarr array of counts with neither)")
    if not records and (data.is_dir() and data.suffix != ".zarr" or data.suffix.lower() in (".parquet", ".pq", ".csv")):
        raise SparseDPError(f"{args.data} holds records: give --column and --bins START STOP WIDTH to bin them")
    if args.clip and not records:
        raise SparseDPError("--clip applies to records binned with --column / --bins")
    if Path(args.out).suffix not in (".npy", ".zarr"):
        raise SparseDPError(f"--out must be a .npy or .zarr path with --executor, got {args.out}")
    kwargs = dict(k=args.k or 16, chunk=args.chunk, rng=args.seed, out=args.out, secure=not args.float_noise,
                  progress=None, level_weights="boost-un" if method == "boost-un" else None)
    ex = _scaleout_executor(args)
    try:
        if records:
            from ..scaleout import release_records

            start, stop, width = args.bins
            r = release_records(args.data, args.column, Bins(start, stop, width), args.epsilon, clip=args.clip,
                                executor=ex, **kwargs)
        else:
            r = release_hierarchical(args.data, args.epsilon, executor=ex, **kwargs)
    finally:
        ex.close()
    meta = {"method": method, "n": r.n, "k": r.k, "chunk": r.chunk, "chunks": r.chunks, "levels": r.levels,
            "epsilon": r.epsilon, "certified_loss": r.loss, "level_scales": r.level_scales.tolist(),
            "level_variances": r.level_variances.tolist(), "private": r.private, "secure": r.secure,
            "executor": r.executor, "ledger": [r.ledger.as_dict()], "estimate": str(args.out)}
    if records:
        meta.update(column=args.column, bins=dict(zip(("start", "stop", "width"), args.bins)), clip=bool(args.clip))
    side = _write_record(r, meta, args.out)
    noise = "exact discrete Laplace" if r.secure else "float Laplace (--float-noise)"
    print(f"{method}: published {r.n} bins at epsilon {r.epsilon} on {r.executor} ({r.chunks} chunks of {r.chunk} "
          f"leaves, k = {r.k}), {noise} noise -> {args.out} (ledger: {side})")
    if args.seed is not None:
        print("WARNING: NOT private: --seed makes the noise reproducible (the ledger records private=False); "
              "omit it for a real release.")
    return 0


def _write_record(r, meta: dict, out: str) -> Path:
    """``OUT.release.json``: the release record of the chunked release ``r`` (its
    :meth:`to_release` saved next to ``OUT``, which holds the answers already), with ``meta``'s
    fields as its description and, as in earlier versions, at its top level."""
    desc = {k: v for k, v in meta.items() if k not in ("private", "ledger")}
    r.to_release(description=desc).save(out)
    return Path(str(out) + ".release.json")


def _histogram_scaleout_lue(args: argparse.Namespace) -> int:
    """``--method lue --executor ...``: :func:`sparsedp.scaleout.release_lue` on a .npy / .zarr array."""
    from ..errors import SparseDPError
    from ..scaleout import release_lue

    if args.column is not None or args.bins is not None or args.clip:
        raise SparseDPError("--method lue with --executor publishes a .npy / .zarr array of counts; records "
                            "(--column / --bins) are binned with --method boost or boost-un")
    if Path(args.out).suffix not in (".npy", ".zarr"):
        raise SparseDPError(f"--out must be a .npy or .zarr path with --executor, got {args.out}")
    ex = _scaleout_executor(args)
    try:
        r = release_lue(args.data, args.epsilon, tree=args.tree, k=args.k, upper=args.upper, chunk=args.chunk,
                        executor=ex, rng=args.seed, out=args.out, secure=not args.float_noise, progress=None)
    finally:
        ex.close()
    meta = {"method": "lue", "tree": r.tree, "n": r.n, "k": r.k, "chunks": r.chunks, "largest_chunk":
            int(np.diff(r.bounds).max()), "levels": r.levels, "nodes": r.nodes, "epsilon": r.epsilon,
            "certified_loss": r.loss, "min_scale": r.min_scale, "max_scale": r.max_scale, "private": r.private,
            "secure": r.secure, "executor": r.executor, "ledger": [r.ledger.as_dict()], "estimate": str(args.out)}
    side = _write_record(r, meta, args.out)
    noise = "exact discrete Laplace" if r.secure else "float Laplace (--float-noise)"
    print(f"lue: published {r.n} bins at epsilon {r.epsilon} on {r.executor} ({r.chunks} chunks of at most "
          f"{meta['largest_chunk']} leaves, {r.tree} tree, k = {r.k}), {noise} noise -> {args.out} "
          f"(ledger: {side})")
    if args.seed is not None:
        print("WARNING: NOT private: --seed makes the noise reproducible (the ledger records private=False); "
              "omit it for a real release.")
    return 0


def _histogram(args: argparse.Namespace) -> int:
    from ..errors import SparseDPError

    if args.executor is None and (args.scheduler or args.workers or args.worker_memory or args.chunk):
        raise SparseDPError("--scheduler, --workers, --worker-memory and --chunk need --executor")
    if args.scheduler and args.executor != "dask":
        raise SparseDPError("--scheduler needs --executor dask")
    if args.executor is not None:
        return _histogram_scaleout(args)
    if Path(args.out).suffix in (".npy", ".zarr"):
        raise SparseDPError(f"--out {args.out}: a histogram published in one piece is an .npz release file (with its "
                            "tree and each bin's variance); a .npy / .zarr array of bins is written chunk by chunk "
                            "with --executor inprocess|threads|dask")
    if args.method is None:
        args.method = "lue"
    bins = None
    if args.bins is not None:
        start, stop, width = args.bins
        bins = Bins(start, stop, width)
    x = load_histogram(args.data, args.column, bins, clip=args.clip)  # .npy, CSV or Parquet
    secure = not args.float_noise
    if args.method == "lue":
        pub = LUEDPTree(args.epsilon, tree=args.tree, k=args.k, upper=args.upper, secure=secure)
    elif args.method in ("boost", "boost-un"):
        pub = PUBLISHERS[args.method](args.epsilon, k=args.k or 2, secure=secure)
    else:
        pub = PUBLISHERS[args.method](args.epsilon, secure=secure)
    pub.fit(x, rng=args.seed)  # None: OS entropy
    release = pub.release_
    assert release is not None
    if args.seed is not None:
        release = dataclasses.replace(release, private=False)
    release.save(args.out)
    extra = f", {release.tree.size} tree nodes" if release.tree is not None else ""
    noise = "exact discrete Laplace" if release.secure else "float Laplace (--float-noise)"
    print(f"{args.method}: published {release.n} bins at epsilon {args.epsilon}{extra}, {noise} noise -> {args.out}")
    if args.seed is not None:
        print("WARNING: NOT private: --seed makes the noise reproducible (the file records private=False); "
              "omit it for a real release.")
    return 0


def _query(args: argparse.Namespace) -> int:
    from ..errors import SparseDPError
    from ..releases import load_release

    release = load_release(args.release)  # every release file: .npz, .npy / .zarr with its record, JSON
    if not release.private:
        print(f"warning: {args.release} was published with a fixed --seed and is not private", file=sys.stderr)
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
        "lue = LUE-DPTree (per-node budgets on an interval tree + O(n) BLUE); boost = binary tree, "
        "uniform budget + consistency; boost-un = level-wise budgets; privelet = Haar wavelet; "
        "dwork = Laplace noise on every bin.",
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
                   help="publisher (default lue; boost with --executor)")
    h.add_argument("--tree", choices=("sc", "kary"), default="sc",
                   help="tree for --method lue: sc = Struct-Construct, kary = balanced (default %(default)s)")
    h.add_argument("--k", type=int, default=None,
                   help="branching: for lue sc chosen in [2, UPPER] if omitted; kary/boost default 2 (16 with --executor)")
    h.add_argument("--upper", type=int, default=20,
                   help="largest branching SC may choose (default %(default)s)")
    h.add_argument("--seed", type=int, default=None,
                   help="seed of the noise generator, for reproducible tests only: the release is then NOT "
                   "private and is marked private=False (default: OS entropy)")
    h.add_argument("--float-noise", action="store_true",
                   help="float64 Laplace noise instead of the default exact discrete Laplace (leaks through its "
                   "low bits, Mironov 2012: for experiments only; the file records secure=False)")
    h.add_argument("--out", required=True, help="output release file (.npz); with --executor the leaf estimates "
                   "(.npy or .zarr, written chunk by chunk) and OUT.release.json")
    s = h.add_argument_group("scale-out (chunk by chunk, sparsedp.scaleout; --method boost, boost-un or lue)")
    s.add_argument("--executor", choices=("inprocess", "threads", "dask"), default=None,
                   help="publish chunk by chunk on this executor (default: the whole array in this process)")
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="with --executor dask: a running scheduler (tcp://host:8786) instead of a new LocalCluster")
    s.add_argument("--workers", type=int, default=None, help="workers of the new LocalCluster (default 2) or threads")
    s.add_argument("--worker-memory", default=None, metavar="SIZE",
                   help="memory limit per LocalCluster worker, e.g. 4GB (default: Dask's share of the machine)")
    s.add_argument("--chunk", type=int, default=None,
                   help="leaves per task: boost / boost-un a power of --k (default: the largest power of k up to "
                   "2^20); lue the largest chunk, whose roots are the maximal tree nodes of at most that many "
                   "leaves (default 2^20)")
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
