"""Scale-out hierarchical release (issue 14): a LocalCluster against in-process, n = 2^24 ... 2^28.

For every size ``n`` (``--sizes``, log2), a histogram of ``n`` int64 counts is written to a ``.npy``
file under ``--dir`` (default ``/tmp``; generated block by block, never whole in memory) and
released with ``sparsedp.scaleout.release_hierarchical`` (BLUE, uniform budget = Boost, ``k = 16``,
chunks of ``2^20`` leaves, exact noise from OS entropy, epsilon 1) on:

* ``dask``: a fresh ``LocalCluster`` of ``--workers`` worker processes (1 thread each) with a
  ``--memory`` limit each, output written block by block to a ``.npy`` file;
* ``inprocess-chunked``: the same code on the in-process executor (one process, chunk by chunk), at
  sizes up to ``--chunked-max`` (default 28);
* ``inprocess-boost``: ``Boost(1, k=16).fit`` on the whole array in memory (the publisher; same
  tree and scales), at sizes up to ``--inprocess-max`` (it holds everything: ~3 GB at 2^24).

LUE-DPTree rows (``--lue-sizes``, log2; none by default): ``lue-chunked`` =
``sparsedp.scaleout.release_lue`` (SC tree, per-node budgets, chunks of at most ``2^20`` leaves) on
the in-process executor, output to a ``.npy`` file, against ``lue-whole`` = ``LUEDPTree(1).fit`` on
the whole array in memory, ``--lue-reps`` times each, interleaved, medians, and their ratio;
``--lue-dask`` adds one ``lue-dask`` run (``release_lue`` on a fresh ``LocalCluster`` as ``dask``).

Each configuration runs in its own subprocess, so that process's peak RSS is the driver's memory.
Reported: wall seconds (per phase for the chunked runs), peak RSS of the driver and of every
worker (``VmHWM``; fresh workers per size; file pages of the memory-mapped input count while mapped), the bytes moved (``driver->workers``: pickled task
arguments; ``workers->driver`` and ``between workers``: the workers' own transfer counters;
``disk``: input read twice (validate, measure), scratch written and read, output written), and the
ratios against the in-process runs of the same size in the same run.  The machine has 2 cores and
is shared with other jobs: timings are noisy (they say so in the results).  BLAS is pinned to one
thread (not used by these kernels).

    python benchmarks/bench_scaleout.py [--sizes 24 26 28] [--workers 2] [--memory 4GB] [--dir /tmp]
        [--inprocess-max 24] [--chunked-max 28] [--lue-sizes 24] [--lue-reps 2]
        [--out benchmarks/results/scaleout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _scaleout_bench import on_local_cluster, peak_rss_mb, record_release, remove_dir  # noqa: E402
from _scaleout_bench import spawn as _spawn  # noqa: E402

from sparsedp._threads import blas_threads  # noqa: E402

K = 16
EPSILON = 1.0


def make_input(path: Path, n: int, block: int = 2**24, seed: int = 0) -> None:
    """``n`` int64 counts (Poisson(20)-ish, uniform 0..40) written block by block."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(n,))
    rng = np.random.default_rng(seed)
    for lo in range(0, n, block):
        hi = min(lo + block, n)
        out[lo:hi] = rng.integers(0, 41, hi - lo)
    out.flush()
    del out


def run_one(mode: str, path: str, out: str, workers: int, memory: str) -> dict:
    """One configuration (in this process): timings and memory."""
    from sparsedp.scaleout import ChunkedTree, release_hierarchical

    n = int(np.load(path, mmap_mode="r").shape[0])
    res: dict = {"mode": mode, "n": n}
    with blas_threads(1):
        if mode == "lue-whole":
            from sparsedp.trees import LUEDPTree

            t0 = time.perf_counter()
            x = np.load(path)
            pub = LUEDPTree(EPSILON).fit(x)
            res["seconds"] = time.perf_counter() - t0
            res["nodes"], res["levels"] = int(pub.tree_.size), int(pub.tree_.levels)
            res["checksum"] = float(pub.release_.estimate.sum())
        elif mode in ("lue-chunked", "lue-dask"):
            from sparsedp.scaleout import release_lue

            if mode == "lue-dask":
                r, _, ex = on_local_cluster(lambda ex: release_lue(path, EPSILON, out=out, executor=ex), res, workers,
                                            memory)
                res["driver_to_workers_bytes"] = ex.sent
            else:
                r = release_lue(path, EPSILON, out=out)
            res["seconds"] = r.timings["total"]
            res["phases"] = r.timings
            res["chunks"], res["largest_chunk"] = r.chunks, int(np.diff(r.bounds).max())
            res["nodes"], res["levels"], res["k"] = r.nodes, r.levels, r.k
        elif mode == "inprocess-boost":
            from sparsedp.trees import Boost

            t0 = time.perf_counter()
            x = np.load(path)
            pub = Boost(EPSILON, k=K).fit(x)
            est = pub.release_.estimate
            res["seconds"] = time.perf_counter() - t0
            res["checksum"] = float(est.sum())
        elif mode == "inprocess-chunked":
            record_release(res, release_hierarchical(path, EPSILON, k=K, out=out))
        else:
            r, stats, ex = on_local_cluster(lambda ex: release_hierarchical(path, EPSILON, k=K, executor=ex, out=out),
                                            res, workers, memory)
            record_release(res, r)
            res["workers"] = {addr: s for addr, s in stats.items()}
            tree = ChunkedTree(n, K, r.chunk)
            res["bytes"] = {
                "driver_to_workers": ex.sent,
                "workers_outgoing": sum(s["outgoing_bytes"] for s in stats.values()),
                "between_workers_incoming": sum(s["incoming_bytes"] for s in stats.values()),
                "disk_input_read": 2 * n * 8,
                "disk_scratch_write_read": 2 * (tree.nodes() - tree.top.nodes + tree.chunks) * 8,
                "disk_output_write": n * 8,
            }
        res["driver_peak_rss_mb"] = peak_rss_mb()
    return res


def spawn(mode: str, path: Path, out: Path, args: argparse.Namespace) -> dict:
    return _spawn(__file__, mode, ["--input", str(path), "--output", str(out), "--workers", str(args.workers),
                                   "--memory", args.memory])


def run_lue(args: argparse.Namespace, base: Path) -> list:
    """LUE-DPTree: chunked (in-process executor) vs the whole-array publisher, interleaved, medians."""
    out_rows = []
    for lg in args.lue_sizes:
        n = 2**lg
        path = base / f"lue{lg}.npy"
        make_input(path, n)
        runs: dict[str, list] = {"lue-chunked": [], "lue-whole": []}
        for rep in range(args.lue_reps):
            order = ("lue-chunked", "lue-whole") if rep % 2 == 0 else ("lue-whole", "lue-chunked")
            for mode in order:
                out = base / f"lue-out{lg}.npy"
                runs[mode].append(spawn(mode, path, out, args))
                out.unlink(missing_ok=True)
        if args.lue_dask:
            out = base / f"lue-out{lg}.npy"
            runs["lue-dask"] = [spawn("lue-dask", path, out, args)]
            out.unlink(missing_ok=True)
        row: dict = {"log2_n": lg, "n": n, "runs": runs}
        ok = {m: [r for r in rs if "error" not in r] for m, rs in runs.items()}
        for mode, rs in ok.items():
            if rs:
                row[mode] = {"median_seconds": float(np.median([r["seconds"] for r in rs])),
                             "peak_rss_mb": float(max(r["driver_peak_rss_mb"] for r in rs))}
            for r in runs[mode]:
                if "error" in r:
                    print(f"2^{lg:<4} {mode:>18} FAILED: {r['error'][-300:]}")
        if ok["lue-chunked"] and ok["lue-whole"]:
            row["ratio_chunked_vs_whole"] = row["lue-chunked"]["median_seconds"] / row["lue-whole"]["median_seconds"]
            row["memory_ratio_chunked_vs_whole"] = row["lue-chunked"]["peak_rss_mb"] / row["lue-whole"]["peak_rss_mb"]
        if "lue-dask" in row and "lue-chunked" in row:
            row["ratio_dask_vs_chunked"] = row["lue-dask"]["median_seconds"] / row["lue-chunked"]["median_seconds"]
            row["lue-dask"]["worker_peak_rss_mb"] = max(r.get("worker_peak_rss_mb", 0.0) for r in ok["lue-dask"])
        ratios = {"lue-chunked": row.get("ratio_chunked_vs_whole", float("nan")), "lue-whole": 1.0,
                  "lue-dask": row.get("ratio_dask_vs_chunked", float("nan"))}
        for mode in ("lue-chunked", "lue-whole", "lue-dask"):
            if mode in row:
                print(f"2^{lg:<4} {mode:>18} {row[mode]['median_seconds']:9.2f} {row[mode]['peak_rss_mb']:10.0f} "
                      f"{row[mode].get('worker_peak_rss_mb', float('nan')):10.0f} {ratios[mode]:7.2f}")
        out_rows.append(row)
        path.unlink(missing_ok=True)
    return out_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[24, 26, 28], help="log2 of n")
    ap.add_argument("--lue-sizes", type=int, nargs="*", default=[], help="log2 of n for the LUE-DPTree rows")
    ap.add_argument("--lue-reps", type=int, default=2, help="repetitions of each LUE run (interleaved; medians)")
    ap.add_argument("--lue-dask", action="store_true", help="also run release_lue once per LUE size on a LocalCluster")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="4GB", help="memory limit per worker")
    ap.add_argument("--dir", default="/tmp", help="where the input and output files go (deleted after)")
    ap.add_argument("--inprocess-max", type=int, default=24, help="largest log2 n for the whole-array Boost run")
    ap.add_argument("--chunked-max", type=int, default=28, help="largest log2 n for the in-process chunked run")
    ap.add_argument("--out", default=str(HERE / "results" / "scaleout.json"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--input", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.input, args.output, args.workers, args.memory)))
        return

    results = []
    base = Path(args.dir) / f"sparsedp-bench-scaleout-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    print(f"{'n':>6} {'mode':>18} {'seconds':>9} {'driver MB':>10} {'worker MB':>10} {'ratio':>7}")
    try:
        for lg in args.sizes:
            n = 2**lg
            path = base / f"x{lg}.npy"
            t0 = time.perf_counter()
            make_input(path, n)
            gen = time.perf_counter() - t0
            modes = ["dask"]
            if lg <= args.chunked_max:
                modes.append("inprocess-chunked")
            if lg <= args.inprocess_max:
                modes.append("inprocess-boost")
            rows = {}
            for mode in modes:
                out = base / f"out{lg}-{mode}.npy"
                rows[mode] = spawn(mode, path, out, args)
                out.unlink(missing_ok=True)
            for mode, r in rows.items():
                if "error" in r:
                    print(f"2^{lg:<4} {mode:>18} FAILED: {r['error'][-300:]}")
                    continue
                for other in ("inprocess-chunked", "inprocess-boost"):
                    if other in rows and "seconds" in rows[other] and mode == "dask":
                        r[f"ratio_vs_{other}"] = r["seconds"] / rows[other]["seconds"]
                ratio = r.get("ratio_vs_inprocess-boost", r.get("ratio_vs_inprocess-chunked", float("nan")))
                print(f"2^{lg:<4} {mode:>18} {r['seconds']:9.2f} {r['driver_peak_rss_mb']:10.0f} "
                      f"{r.get('worker_peak_rss_mb', float('nan')):10.0f} {ratio:7.2f}")
            results.append({"log2_n": lg, "n": n, "generate_seconds": gen, "runs": rows})
            path.unlink(missing_ok=True)
        lue_results = run_lue(args, base)
    finally:
        remove_dir(base)
    doc = {
        "benchmark": "bench_scaleout",
        "command": "python " + " ".join(["benchmarks/bench_scaleout.py"] + sys.argv[1:]),
        "k": K, "epsilon": EPSILON, "method": "BLUE, uniform budget (Boost), exact discrete Laplace, OS entropy",
        "workers": args.workers, "worker_memory": args.memory, "threads_per_worker": 1, "blas_threads": 1,
        "machine": {"cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "note": "2-core machine shared with up to 7 other jobs running at the same time: timings are noisy"},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if Path(args.out).exists():
        try:
            old = json.loads(Path(args.out).read_text())
            keep = [r for r in old.get("results", []) if r["log2_n"] not in args.sizes]
            doc["results"] = sorted(keep + results, key=lambda r: r["log2_n"])
            if not args.sizes:  # an LUE-only run keeps the earlier run's description
                doc.update({k: v for k, v in old.items() if k not in ("results", "lue")})
            keep_lue = [r for r in old.get("lue", []) if r["log2_n"] not in args.lue_sizes]
            lue_results = sorted(keep_lue + lue_results, key=lambda r: r["log2_n"])
        except (ValueError, KeyError):
            pass
    if lue_results:
        doc["lue"] = lue_results
        doc["lue_command"] = "python " + " ".join(["benchmarks/bench_scaleout.py"] + sys.argv[1:])
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
