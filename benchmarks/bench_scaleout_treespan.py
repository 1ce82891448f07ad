"""Scale-out restaurant release (issue 14): trees x span chunk by chunk vs the whole release in memory.

For every horizon ``T`` (``--sizes``, log2 of the days) the daily item sales of seed 002's
restaurant (orders ~ Poisson(40, 25, 30) of the three combos, ``sales = orders @ COMBOS``, int64,
``(T, 5)``) are written to a ``.npy`` file under ``--dir`` block by block, and released at
epsilon 1 with exact noise from OS entropy by:

* ``whole``: ``np.load`` of the whole file, the orders recovered and checked, then
  ``sparsedp.consistency.restaurant_release(sales=...)`` (one measurement of all ``5 x nodes``
  rows, the exact O(T) trees x span projection), at sizes up to ``--whole-max``;
* ``chunked``: ``sparsedp.scaleout.treespan.release_restaurant`` on the in-process executor
  (chunks of ``2^--chunk`` days, read memory-mapped, output written block by block to ``.npy``);
* ``dask``: the same on a fresh ``LocalCluster`` of ``--workers`` worker processes (1 thread,
  ``--memory`` limit each); the cluster's start is reported apart and not counted.

Each run is its own subprocess (its peak RSS, ``VmHWM``, is the driver's memory; the workers report
theirs through ``client.run``); the modes alternate over ``--reps`` repetitions and the medians are
compared in the same run (ratios).  BLAS pinned to 1 thread (recorded).  The machine has 2 cores
and is shared with other jobs: timings are noisy (the load average is recorded).

    python benchmarks/bench_scaleout_treespan.py [--sizes 20 22] [--chunk 18] [--reps 2] [--workers 2]
        [--memory 4GB] [--whole-max 21] [--dir /tmp] [--out benchmarks/results/scaleout_treespan.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _scaleout_bench import on_local_cluster, peak_rss_mb, record_release, remove_dir  # noqa: E402
from _scaleout_bench import spawn as _spawn  # noqa: E402

from sparsedp._threads import blas_threads  # noqa: E402

EPSILON = 1.0
BLAS_THREADS = 1


def make_input(path: Path, days: int, block: int = 2**20, seed: int = 0) -> None:
    """``(days, 5)`` int64 daily item sales of Poisson combo orders, written block by block."""
    from sparsedp.consistency.restaurant import COMBOS, MEAN_ORDERS

    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int64, shape=(days, 5))
    rng = np.random.default_rng(seed)
    for lo in range(0, days, block):
        hi = min(lo + block, days)
        out[lo:hi] = rng.poisson(MEAN_ORDERS, size=(hi - lo, 3)).astype(np.int64) @ COMBOS
    out.flush()
    del out


def run_one(mode: str, path: str, out: str, chunk: int, workers: int, memory: str) -> dict:
    """One configuration, in this process."""
    from sparsedp.scaleout.treespan import release_restaurant

    days = int(np.load(path, mmap_mode="r").shape[0])
    res: dict = {"mode": mode, "days": days}
    with blas_threads(BLAS_THREADS):
        if mode == "whole":
            from sparsedp.consistency.restaurant import COMBOS, RestaurantSales, _orders_of, restaurant_release

            t0 = time.perf_counter()
            sales = np.load(path)
            orders = _orders_of(sales, "sales")
            r = restaurant_release(sales=RestaurantSales(orders=orders, sales=orders @ COMBOS), epsilon=EPSILON)
            res["seconds"] = time.perf_counter() - t0
            res["solve_seconds"] = r.result.seconds
            res["method"] = r.result.method
            res["checksum"] = float(r.x.sum())
        elif mode == "chunked":
            record_release(res, release_restaurant(path, EPSILON, chunk=chunk, out=out))
        else:
            r, _, _ = on_local_cluster(lambda ex: release_restaurant(path, EPSILON, chunk=chunk, executor=ex, out=out),
                                       res, workers, memory)
            record_release(res, r)
        res["driver_peak_rss_mb"] = peak_rss_mb()
    return res


def spawn(mode: str, path: Path, out: Path, args: argparse.Namespace) -> dict:
    threads = {v: str(BLAS_THREADS) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return _spawn(__file__, mode, ["--input", str(path), "--output", str(out), "--chunk", str(args.chunk),
                                   "--workers", str(args.workers), "--memory", args.memory], threads)


def _median(runs: list[dict], key: str) -> float:
    vals = [r[key] for r in runs if key in r]
    return float(statistics.median(vals)) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 22], help="log2 of the days T")
    ap.add_argument("--chunk", type=int, default=18, help="log2 of the days per chunk")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="4GB", help="memory limit per worker")
    ap.add_argument("--whole-max", type=int, default=21, help="largest log2 T for the whole in-memory release")
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=str(HERE / "results" / "scaleout_treespan.json"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--input", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.input, args.output, 2**args.chunk, args.workers, args.memory)))
        return

    base = Path(args.dir) / f"sparsedp-bench-restaurant-{os.getpid()}"
    base.mkdir(parents=True, exist_ok=True)
    sizes = []
    print(f"{'T':>6} {'mode':>8} {'median s':>9} {'driver MB':>10} {'worker MB':>10} {'s / whole':>10} {'MB / whole':>11}")
    try:
        for lg in args.sizes:
            T = 2**lg
            path = base / f"s{lg}.npy"
            make_input(path, T)
            modes = (["whole"] if lg <= args.whole_max else []) + ["chunked", "dask"]
            runs: dict[str, list[dict]] = {m: [] for m in modes}
            for _ in range(args.reps):  # interleaved repetitions
                for mode in modes:
                    out = base / f"o{lg}-{mode}.npy"
                    runs[mode].append(spawn(mode, path, out, args))
                    out.unlink(missing_ok=True)
            summary = {}
            for mode in modes:
                ok = [r for r in runs[mode] if "error" not in r]
                if not ok:
                    print(f"2^{lg:<4} {mode:>8} FAILED: {runs[mode][0]['error'][-400:]}")
                    summary[mode] = {"error": runs[mode][0]["error"][-2000:]}
                    continue
                summary[mode] = {"median_seconds": _median(ok, "seconds"),
                                 "median_driver_peak_rss_mb": _median(ok, "driver_peak_rss_mb"),
                                 "median_worker_peak_rss_mb": _median(ok, "worker_peak_rss_mb"),
                                 "runs": ok}
            w = summary.get("whole", {})
            for mode in modes:
                s = summary[mode]
                if "error" in s:
                    continue
                if "median_seconds" in w and mode != "whole":
                    s["time_ratio_vs_whole"] = s["median_seconds"] / w["median_seconds"]
                    s["driver_memory_ratio_vs_whole"] = s["median_driver_peak_rss_mb"] / w["median_driver_peak_rss_mb"]
                if mode == "dask" and "median_seconds" in summary.get("chunked", {}):
                    s["time_ratio_vs_chunked"] = s["median_seconds"] / summary["chunked"]["median_seconds"]
                print(f"2^{lg:<4} {mode:>8} {s['median_seconds']:9.2f} {s['median_driver_peak_rss_mb']:10.0f} "
                      f"{s['median_worker_peak_rss_mb']:10.0f} {s.get('time_ratio_vs_whole', float('nan')):10.2f} "
                      f"{s.get('driver_memory_ratio_vs_whole', float('nan')):11.2f}")
            sizes.append({"log2_days": lg, "days": T, "modes": summary})
            path.unlink(missing_ok=True)
    finally:
        remove_dir(base)
    result = {
        "benchmark": "scaleout_treespan",
        "command": "python benchmarks/bench_scaleout_treespan.py " + " ".join(sys.argv[1:]),
        "epsilon": EPSILON, "chunk_days": 2**args.chunk, "reps": args.reps, "workers": args.workers,
        "worker_memory": args.memory, "blas_threads": BLAS_THREADS, "noise": "exact discrete Laplace, OS entropy",
        "cpus": os.cpu_count(), "load_average_end": os.getloadavg(), "python": platform.python_version(),
        "note": "2-core machine shared with other jobs: seconds are noisy; medians of interleaved runs, each its own "
                "process; dask seconds exclude the cluster's start",
        "sizes": sizes,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
