"""Traffic flows: projection onto flow conservation at 10^4, 10^5 and 10^6 intersections.

For each city size and each end-point model (start/end counts as noisy variables, or as fixed
invariants), every solver runs in its own subprocess (so its peak memory is its own): CHOLMOD
(`direct`), pyamg-preconditioned CG (`amg`), Jacobi CG (`cg`) and the seed's alternating projections
with one block per intersection (`alternating`, multicolour sweeps).  Reported: seconds of the
projection, iterations, peak resident memory of the process, residual max|Cx - b|, and the error
reduction rmse_consistent / rmse_noisy.  The baseline in each row group is `alternating`.

    python benchmarks/bench_flows.py [--sizes 100 316 1000] [--out benchmarks/results/flows.json]

Exact against float noise (issue 13, key ``measure``): seconds of the whole ``release_flows`` (trip
checks, truncation, counts, calibration, noise, projection; the city and trips are built outside
the timing) at ``--measure-side`` (default 316: 10^5 intersections) with ``secure=True`` (exact
discrete Laplace, the default) and ``secure=False`` (float Laplace), interleaved, for both end-point
models; the ratio of the medians is the issue's target (<= 1.25).  ``--measure-only`` runs just this
part and updates the ``measure`` key of an existing results file.

    python benchmarks/bench_flows.py --measure-only [--measure-reps 7]

BLAS is pinned to one thread (threadpoolctl).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from threadpoolctl import threadpool_limits
from sparsedp.flows import road_grid, random_trips, flow_counts, conservation_system, project
side, method, fixed, tol, maxiter = {side}, {method!r}, {fixed}, {tol}, {maxiter}
with threadpool_limits(1):
    road = road_grid(side, side, seed=0)
    trips = random_trips(road, road.nodes // 2, seed=1, max_edges=40, origins=min(2000, road.nodes // 4), radius=30.0)
    x = flow_counts(road, trips)
    E, V = road.edges, road.nodes
    system = conservation_system(road, x[E:E + V], x[E + V:]) if fixed else conservation_system(road)
    truth = x[:E] if fixed else x
    scale = (40 if fixed else 42) / 1.0
    noisy = truth + np.random.default_rng(2).laplace(0, scale, truth.size)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    try:
        s = project(noisy, system, None, method=method, tol=tol, maxiter=maxiter)
        status = "ok"
    except Exception as exc:  # report, do not hide
        s, status = None, f"{{type(exc).__name__}}: {{exc}}"
    sec = time.perf_counter() - t0
    out = dict(nodes=V, edges=E, variables=int(truth.size), method=method, fixed_endpoints=fixed, status=status,
               seconds=sec, peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               rss_before_solve_mb=rss0 / 1024)
    if s is not None:
        out.update(solver=s.solver, iterations=s.iterations, residual=s.residual,
                   rmse_noisy=float(np.sqrt(np.mean((noisy - truth) ** 2))),
                   rmse_consistent=float(np.sqrt(np.mean((s.x - truth) ** 2))))
    print(json.dumps(out))
"""


def run_one(side: int, method: str, fixed: bool, tol: float, maxiter: int, timeout: float) -> dict:
    code = CHILD.format(root=str(ROOT), side=side, method=method, fixed=fixed, tol=tol, maxiter=maxiter)
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(nodes=side * side, method=method, fixed_endpoints=fixed, status=f"timeout after {timeout:.0f} s")
    if proc.returncode != 0:
        return dict(nodes=side * side, method=method, fixed_endpoints=fixed, status="crashed: " + proc.stderr[-300:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_throughput(side: int, reps: int) -> list[dict]:
    """Whole ``release_flows`` seconds, exact (``secure=True``) against float (``secure=False``) noise."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    sys.path.insert(0, str(ROOT))
    from sparsedp.flows import random_trips, release_flows, road_grid

    rows = []
    with threadpool_limits(1):
        road = road_grid(side, side, seed=0)
        trips = random_trips(road, road.nodes // 2, seed=1, max_edges=40, origins=min(2000, road.nodes // 4),
                             radius=30.0)
        for fixed in (False, True):
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(reps):
                for secure in (True, False):  # interleaved, so contention hits both alike
                    t0 = time.perf_counter()
                    rel = release_flows(road, trips, epsilon=1.0, fixed_endpoints=fixed, secure=secure)
                    times[secure].append(time.perf_counter() - t0)
            ex, fl = times[True], times[False]
            rows.append({"nodes": road.nodes, "edges": road.edges, "variables": int(rel.noisy.size),
                         "fixed_endpoints": fixed, "solver": rel.solve.solver, "reps": reps, "exact_s": ex,
                         "float_s": fl, "exact_median_s": float(np.median(ex)), "float_median_s": float(np.median(fl)),
                         "ratio_median": float(np.median(ex) / np.median(fl)), "ratio_min": float(min(ex) / min(fl))})
            r = rows[-1]
            print(f"{r['nodes']:>9} {'fixed' if fixed else 'variable':<9} release: exact {r['exact_median_s']:.3f} s, "
                  f"float {r['float_median_s']:.3f} s (medians of {reps}), ratio {r['ratio_median']:.2f} "
                  f"(of minima {r['ratio_min']:.2f})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 316, 1000], help="grid side lengths")
    parser.add_argument("--methods", nargs="+", default=["direct", "amg", "cg", "alternating"])
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--maxiter", type=int, default=5000, help="iteration / sweep cap")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", default=str(HERE / "results" / "flows.json"))
    parser.add_argument("--measure-side", type=int, default=316, help="grid side of the exact-vs-float timing")
    parser.add_argument("--measure-reps", type=int, default=7, help="interleaved releases per noise kind")
    parser.add_argument("--measure-only", action="store_true",
                        help="only time exact against float noise, and update the 'measure' key of --out")
    args = parser.parse_args()
    if args.measure_only:
        rows = measure_throughput(args.measure_side, args.measure_reps)
        out = Path(args.out)
        result = json.loads(out.read_text()) if out.exists() else {}
        result["measure"] = {"command": " ".join(sys.argv), "rows": rows,
                             "note": "whole release_flows seconds, BLAS pinned to 1 thread; shared 2-core machine"}
        out.write_text(json.dumps(result, indent=2))
        print(f"updated {out} (key 'measure')")
        return
    print("flow conservation benchmark (BLAS threads pinned to 1 in each run; trips = nodes / 2, L = 40, eps = 1)")
    header = f"{'nodes':>9} {'end points':<9} {'method':<12}{'seconds':>9}{'its':>7}{'peak MB':>9}{'residual':>10}{'rmse ratio':>11}{'vs alt.':>9}  solver"
    print(header)
    sys.path.insert(0, str(ROOT))
    from tqdm import tqdm  # tqdm.write: a table row printed past the bar

    from sparsedp.progress import progress_bar

    rows = []
    bar = progress_bar(total=len(args.sizes) * 2 * len(args.methods), desc="flows runs")  # a bar on a terminal only
    for side in args.sizes:
        for fixed in (False, True):
            group = []
            for method in args.methods:
                r = run_one(side, method, fixed, args.tol, args.maxiter, args.timeout)
                group.append(r)
                bar.update(1)
            base = next((g for g in group if g["method"] == "alternating" and g.get("status") == "ok"), None)
            for r in group:
                if base is not None and r.get("status") == "ok":
                    r["speedup_vs_alternating"] = base["seconds"] / r["seconds"]
                rows.append(r)
                ends = "fixed" if fixed else "variable"
                if r.get("status") != "ok":
                    tqdm.write(f"{r['nodes']:>9} {ends:<9} {r['method']:<12} {r['status']}")
                    continue
                ratio = r["rmse_consistent"] / r["rmse_noisy"]
                sp = f"{r['speedup_vs_alternating']:.1f}x" if "speedup_vs_alternating" in r else "-"
                tqdm.write(f"{r['nodes']:>9} {ends:<9} {r['method']:<12}{r['seconds']:>9.2f}{r['iterations']:>7}"
                           f"{r['peak_rss_mb']:>9.0f}{r['residual']:>10.1e}{ratio:>11.3f}{sp:>9}  {r['solver']}")
                sys.stdout.flush()
    bar.close()
    print("exact against float noise (whole release)")
    measure = measure_throughput(args.measure_side, args.measure_reps)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"tol": args.tol, "rows": rows, "measure": {"rows": measure}}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
