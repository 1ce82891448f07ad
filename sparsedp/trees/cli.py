"""``sparsedp histogram`` (publish a histogram) and ``sparsedp query`` (range counts from a release).

The noise is exact discrete Laplace (the one measurement path, ``secure=True``) from OS entropy
unless ``--seed`` is given; ``--float-noise`` draws float64 Laplace noise instead (it leaks through
its low bits, Mironov 2012: for experiments only; the file records ``secure = False``).  A seeded
run is reproducible and therefore NOT a private release: it says so on stdout and saves
``private = False`` in the release file, and ``sparsedp query`` warns on stderr when it reads such a
file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


from ..io import Bins, load_histogram
from .publishers import PUBLISHERS, LUEDPTree, load_release

__all__ = ["register"]


def _histogram(args: argparse.Namespace) -> int:
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
    release = load_release(args.release)
    if not release.private:
        print(f"warning: {args.release} was published with a fixed --seed and is not private", file=sys.stderr)
    if not release.secure:
        print(f"warning: {args.release} was published with float noise (--float-noise), which leaks through its "
              "low bits", file=sys.stderr)
    print(f"{release.range(args.lo, args.hi):.6g}")
    return 0


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
                   "--bins the values are records, binned on a public domain")
    h.add_argument("--column", default=None, help="the column of a CSV / Parquet file")
    h.add_argument("--bins", type=float, nargs=3, metavar=("START", "STOP", "WIDTH"), default=None,
                   help="bin record values on the public domain [START, STOP) in bins of WIDTH")
    h.add_argument("--clip", action="store_true", help="clip records outside the domain into the end bins "
                   "(default: refuse them)")
    h.add_argument("--epsilon", type=float, required=True, help="privacy budget epsilon > 0 (pure DP)")
    h.add_argument("--method", choices=sorted(PUBLISHERS), default="lue", help="publisher (default %(default)s)")
    h.add_argument("--tree", choices=("sc", "kary"), default="sc",
                   help="tree for --method lue: sc = Struct-Construct, kary = balanced (default %(default)s)")
    h.add_argument("--k", type=int, default=None,
                   help="branching: for lue sc chosen in [2, UPPER] if omitted; kary/boost default 2")
    h.add_argument("--upper", type=int, default=20,
                   help="largest branching SC may choose (default %(default)s)")
    h.add_argument("--seed", type=int, default=None,
                   help="seed of the noise generator, for reproducible tests only: the release is then NOT "
                   "private and is marked private=False (default: OS entropy)")
    h.add_argument("--float-noise", action="store_true",
                   help="float64 Laplace noise instead of the default exact discrete Laplace (leaks through its "
                   "low bits, Mironov 2012: for experiments only; the file records secure=False)")
    h.add_argument("--out", required=True, help="output release file (.npz)")
    h.set_defaults(func=_histogram)
    q = subparsers.add_parser(
        "query",
        help="answer the range count of bins LO..HI (inclusive, 0-based) from a published release",
        description="Print the published count of bins LO..HI (inclusive, 0-based: bins are numbered "
        "from 0 and both ends count).",
    )
    q.add_argument("release", type=Path, help="release written by 'sparsedp histogram' (.npz)")
    q.add_argument("lo", type=int, help="first bin of the range (0-based, inclusive)")
    q.add_argument("hi", type=int, help="last bin of the range (0-based, inclusive)")
    q.set_defaults(func=_query)
