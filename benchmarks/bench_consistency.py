"""Seed 002's experiment: the restaurant release made consistent, generic vs the fast methods.

Part 1 (T in --days, default 32 ... 1024): generic (dense pseudo-inverse, only up to --generic-max
days), alternating (the seed's cyclic projections), direct (CHOLMOD), accelerated (CGMN) and auto,
on the seed's formulation (combos at the leaves: T + 5 sub-problems) with equal variances (the
homoscedastic Laplace release); auto detects the tree x span structure and runs the exact O(n)
two-pass on the combo coordinates (sparsedp.consistency.treespan).
Columns: seconds, sweeps, residual max|Cx - b|, max |x - x_ref| (x_ref = generic when it ran,
else direct; the column says which).

Part 2 (T = 2^--large-min ... 2^--large-max): the fast methods alone, equal and unequal variances,
each in its own subprocess so that the peak resident memory (VmHWM) is that run's own.  auto runs
both formulations (combos at the leaves, and at every node: redundant rows); direct and accelerated
the leaves.  Wall seconds and the process's CPU seconds (less sensitive to other jobs on the
machine) are both recorded; the residual is the exact max|Cx - b| of the returned vector
(sparsedp.consistency.residuals) and its normwise relative value.

Part 3: a Dask LocalCluster (2 worker processes, 1 thread each) beside in-process.

BLAS is pinned to one thread (threadpoolctl).  Every speed-up is a ratio measured in this run.
Writes benchmarks/results/consistency.json.

    python benchmarks/bench_consistency.py                 # full run (~10-15 min on 2 busy cores)
    python benchmarks/bench_consistency.py --quick         # small sizes, a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
from tqdm import tqdm  # tqdm.write: table rows printed past the progress bar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparsedp.consistency import (  # noqa: E402
    restaurant,
    restaurant_constraints,
    restaurant_layout,
    restaurant_sensitivity,
    restaurant_tree_values,
    solve,
)
from sparsedp.executors import DaskExecutor  # noqa: E402
from sparsedp.progress import progress_bar  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "consistency.json"


def instance(days: int, unequal: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Truth, noisy release (Laplace, epsilon = 1) and variances (None = equal)."""
    rng = np.random.default_rng(seed)
    lay = restaurant_layout(days)
    truth = restaurant_tree_values(restaurant(days, rng).sales, lay)
    b = restaurant_sensitivity(lay)
    if not unequal:
        return truth, truth + rng.laplace(0.0, b, truth.size), None
    # heteroscedastic: every node of every item measured with its own scale in [0.5 b, 2 b]
    scales = b * rng.uniform(0.5, 2.0, truth.size)
    return truth, truth + rng.laplace(0.0, scales), 2 * scales**2


GENERIC_MAX_BYTES = 2 * 1024**3


def run(days: int, method: str, where: str, unequal: bool, tol: float, max_sweeps: int, executor=None) -> dict:
    truth, noisy, v = instance(days, unequal)
    fams = restaurant_constraints(days, where, chunks=2 if executor is not None else 1)
    t0, c0 = time.perf_counter(), time.process_time()
    res = solve(noisy, fams, variances=v, method=method, tol=tol, max_sweeps=max_sweeps, executor=executor,
                generic_max_bytes=GENERIC_MAX_BYTES)
    sec, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "days": days,
        "variables": int(noisy.size),
        "constraints": res.constraints,
        "method": method,
        "ran": res.method,
        "combos_at": where,
        "variances": "unequal" if unequal else "equal",
        "seconds": sec,
        "cpu_seconds": cpu,
        "iterations": res.iterations,
        "sweeps": res.sweeps,
        "residual": res.residual,
        "relative_residual": res.relative_residual,
        "residual_bounded": res.residual_bounded,
        "converged": res.converged,
        "error_estimate": res.error_estimate,
        "x": res.x,
    }


def peak_rss_mb() -> float:
    """This process's own peak resident memory (VmHWM; ru_maxrss would include the parent's at fork)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def table(title: str, hdr: str) -> None:
    print(f"\n{title}\n{hdr}\n" + "-" * len(hdr))


def one(args: argparse.Namespace) -> None:
    """Subprocess mode: one large run; print JSON with this process's peak RSS."""
    with threadpool_limits(1):
        r = run(args.one_days, args.one_method, args.one_where, args.one_unequal, args.tol, args.max_sweeps)
    r.pop("x")
    r["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(r))


def part1(args: argparse.Namespace) -> list[dict]:
    rows = []
    table("Part 1: seed 002 sizes (combos at the leaves, equal variances)",
          f"{'T':>6}{'method':>13}{'seconds':>10}{'sweeps':>9}{'residual':>10}{'max|x-ref|':>12}{'ref':>8}{'x faster':>10}")
    for T in progress_bar(args.days, desc="part 1 sizes"):  # a bar on a terminal only
        runs = {}
        methods = (["generic"] if T <= args.generic_max else []) + ["direct", "alternating", "accelerated", "auto"]
        for m in methods:
            runs[m] = run(T, m, "leaves", False, args.tol, args.max_sweeps)
        ref_name = "generic" if "generic" in runs else "direct"
        ref = runs[ref_name]["x"]
        for m, r in runs.items():
            r["max_dev"] = float(np.max(np.abs(r["x"] - ref)))
            r["reference"] = ref_name
            r["speedup_vs_generic"] = runs["generic"]["seconds"] / r["seconds"] if "generic" in runs else None
            sp_txt = f"{r['speedup_vs_generic']:.0f}" if r["speedup_vs_generic"] else "-"
            tqdm.write(f"{T:>6}{m:>13}{r['seconds']:>10.4f}{r['sweeps']:>9.0f}{r['residual']:>10.1e}{r['max_dev']:>12.1e}"
                       f"{ref_name:>8}{sp_txt:>10}")
            r.pop("x")
            rows.append(r)
        alt, acc = runs["alternating"], runs["accelerated"]
        if alt["converged"] and acc["converged"]:
            tqdm.write(f"{'':>6}  alternating / accelerated sweeps = {alt['sweeps'] / max(acc['sweeps'], 1):.0f}")
    return rows


def part2(args: argparse.Namespace) -> list[dict]:
    rows = []
    table("Part 2: large T, fast methods (one subprocess per run; peak = that run's own VmHWM)",
          f"{'T':>9}{'variables':>11}{'variances':>10}{'method':>13}{'combos':>7}{'ran':>30}{'seconds':>9}{'cpu s':>8}"
          f"{'iters':>7}{'residual':>10}{'relative':>10}{'peak MB':>9}")
    for e in progress_bar(range(args.large_min, args.large_max + 1), desc="part 2 sizes"):
        T = 2**e
        for unequal in (False, True):
            for m, where in (("auto", "leaves"), ("auto", "nodes"), ("direct", "leaves"), ("accelerated", "leaves")):
                if m == "accelerated" and e > args.accel_large_max:
                    continue
                cmd = [sys.executable, __file__, "--one-days", str(T), "--one-method", m, "--one-where", where,
                       "--tol", str(args.tol), "--max-sweeps", str(args.accel_max_iter)]
                if unequal:
                    cmd.append("--one-unequal")
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode != 0:
                    tqdm.write(f"{T:>9} {m} failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                r = json.loads(out.stdout.strip().splitlines()[-1])
                tqdm.write(f"{T:>9}{r['variables']:>11}{r['variances']:>10}{m:>13}{where:>7}{r['ran']:>30}"
                           f"{r['seconds']:>9.3f}{r['cpu_seconds']:>8.3f}{r['iterations']:>7}{r['residual']:>10.1e}"
                           f"{r['relative_residual']:>10.1e}{r['peak_rss_mb']:>9.0f}")
                rows.append(r)
    return rows


def part3(args: argparse.Namespace) -> list[dict]:
    rows = []
    table("Part 3: Dask LocalCluster (2 processes x 1 thread) beside in-process",
          f"{'T':>8}{'method':>13}{'combos':>8}{'in-process s':>14}{'dask s':>9}{'max|dx|':>10}")
    ex = DaskExecutor.local(n_workers=2, threads_per_worker=1, processes=True)
    try:
        for T, m, where in ((1024, "accelerated", "leaves"), (2**16, "alternating", "nodes")):
            a = run(T, m, where, False, args.tol, args.max_sweeps)
            b = run(T, m, where, False, args.tol, args.max_sweeps, executor=ex)
            dev = float(np.max(np.abs(a["x"] - b["x"])))
            print(f"{T:>8}{m:>13}{where:>8}{a['seconds']:>14.3f}{b['seconds']:>9.3f}{dev:>10.1e}")
            rows.append({"days": T, "method": m, "combos_at": where, "inprocess_seconds": a["seconds"],
                         "dask_seconds": b["seconds"], "max_dev": dev, "iterations": a["iterations"]})
    finally:
        ex.close()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--days", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024], help="part 1 sizes")
    p.add_argument("--generic-max", type=int, default=256,
                   help="largest T for the dense generic baseline (512 takes minutes, 1024 tens of minutes)")
    p.add_argument("--large-min", type=int, default=14, help="part 2 from T = 2^this")
    p.add_argument("--large-max", type=int, default=20, help="part 2 up to T = 2^this")
    p.add_argument("--accel-large-max", type=int, default=18, help="accelerated in part 2 only up to 2^this")
    p.add_argument("--accel-max-iter", type=int, default=300, help="iteration cap for part 2 iterative runs")
    p.add_argument("--tol", type=float, default=1e-8, help="residual target max|Cx - b|")
    p.add_argument("--max-sweeps", type=int, default=60_000, help="sweep cap for part 1 alternating")
    p.add_argument("--generic-max-gb", type=float, default=2.0, help="memory allowed to the dense generic baseline")
    p.add_argument("--json", default=str(RESULTS), help="where to write the results (default %(default)s)")
    p.add_argument("--skip-dask", action="store_true", help="skip part 3")
    p.add_argument("--quick", action="store_true", help="small sizes only (smoke test)")
    p.add_argument("--one-days", type=int, help=argparse.SUPPRESS)
    p.add_argument("--one-method", help=argparse.SUPPRESS)
    p.add_argument("--one-where", help=argparse.SUPPRESS)
    p.add_argument("--one-unequal", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    global GENERIC_MAX_BYTES
    GENERIC_MAX_BYTES = int(args.generic_max_gb * 1024**3)
    if args.one_days:
        one(args)
        return
    if args.quick:
        args.days, args.generic_max, args.large_min, args.large_max = [32, 64], 64, 12, 13
    with threadpool_limits(1):
        blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info()]
        print(f"BLAS threads pinned: {blas}; cpus {os.cpu_count()}; {platform.processor() or platform.machine()}")
        print("NOTE: timings on a shared 2-core machine are inflated by contention.")
        t0 = time.perf_counter()
        out = {"blas": blas, "tol": args.tol, "part1": part1(args)}
        out["part2"] = part2(args)
        out["part3"] = [] if args.skip_dask else part3(args)
        out["total_seconds"] = time.perf_counter() - t0
    if not args.quick:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
