"""What the progress bars cost: the library loops with a drawn bar against no bar, same run.

Issue 15: long commands show tqdm bars (``sparsedp.progress``).  Inside a ``sparsedp`` command on a
terminal the library's loops draw them -- the flows projection (CG, alternating projections), the
completion iterations, the optimiser's L-BFGS evaluations; elsewhere they are off.  This script
times each loop with its bar drawn (inside ``command_progress()``, stderr a fake terminal, no
start delay) and off, interleaved (off/drawn, then drawn/off), and reports the median ratio.

Usage::

    python benchmarks/bench_progress.py [--reps N] [--side S] [--out FILE]

One BLAS thread (threadpoolctl, recorded); results printed and written as JSON (default
``benchmarks/results/progress.json``).  Timings on a shared machine are noisy: the ratio of
interleaved medians is the number to read.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import sparsedp.progress as progress  # noqa: E402
from sparsedp import optimize  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp._threads import blas_threads  # noqa: E402
from sparsedp.completion import lmafit_sor, synthetic_problem  # noqa: E402
from sparsedp.flows import conservation_system, flow_counts, project, random_trips, road_grid  # noqa: E402


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def jobs(side: int) -> dict:
    road = road_grid(side, side, seed=0)
    x = flow_counts(road, random_trips(road, road.nodes // 2, seed=1, max_edges=40))
    system = conservation_system(road)
    noisy = x + np.random.default_rng(7).normal(0, 3, x.size)
    observed, _ = synthetic_problem(1000, rank=10, p=0.15, noise_scale=1.0, rng=0)
    return {
        f"flows CG ({road.nodes} nodes)": lambda: project(noisy, system, method="cg", tol=1e-8),
        f"flows alternating ({road.nodes} nodes)": lambda: project(noisy, system, method="alternating", tol=1e-4),
        "completion SOR (1000^2, p 0.15, r 10)": lambda: lmafit_sor(observed, 10, rng=0),
        "optimise prefix n=64 (auto)": lambda: optimize(wl.prefix(64), rng=0),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7, help="timed runs per mode (default 7)")
    ap.add_argument("--side", type=int, default=300, help="grid side of the flows network (default 300)")
    ap.add_argument("--out", default=str(HERE / "results" / "progress.json"))
    args = ap.parse_args(argv)
    progress.DELAY = 0.0  # draw from the first step (the default 1 s delay would hide short runs)
    real = sys.stderr
    rows = []
    with blas_threads(1):
        threads = [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]
        print(f"BLAS threads: {threads}; medians of {args.reps} interleaved runs; shared machine (contended)")
        print(f"{'loop':<42}{'off s':>9}{'drawn s':>9}{'drawn/off':>11}")
        for name, job in jobs(args.side).items():
            t: dict[str, list[float]] = {"off": [], "drawn": []}
            for rep in range(args.reps):
                for mode in (("off", "drawn") if rep % 2 == 0 else ("drawn", "off")):
                    sys.stderr = _Terminal() if mode == "drawn" else io.StringIO()
                    try:
                        with progress.command_progress(mode == "drawn"):
                            t0 = time.perf_counter()
                            job()
                            t[mode].append(time.perf_counter() - t0)
                    finally:
                        sys.stderr = real
            off, on = float(np.median(t["off"])), float(np.median(t["drawn"]))
            rows.append({"loop": name, "off_s": t["off"], "drawn_s": t["drawn"], "off_median_s": off,
                         "drawn_median_s": on, "ratio": on / off})
            print(f"{name:<42}{off:>9.3f}{on:>9.3f}{on / off:>11.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["python", "benchmarks/bench_progress.py", *(argv or sys.argv[1:])]),
                               "machine": platform.platform(), "blas_threads": threads, "reps": args.reps,
                               "note": "shared 2-core machine, other jobs running", "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
