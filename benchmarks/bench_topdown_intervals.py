"""Coverage of the intervals of a TopDown release's published integer counts.

The shared table (``bench_topdown.load``: nation > state > county > district, 16 cells) released
at ``rho = 1`` (zCDP, add/remove-one-person), state totals invariant, ``--reps`` releases (seeds
``[7, r]``), with the design ``--split`` names: ``default`` (the default of ``plan_topdown``: the
strategy and split optimised for every unit's cells and total) or ``equal`` (the plain design:
equal split, each level's cells histogram -- the default before the per-level workload).  Per
level: the fraction of (unit, cell) whose TRUE count lies in the 95% interval around the
PUBLISHED count, for the old intervals (``count +- z sd``, the GLS estimate's half-width around
the integer count) and the new default
(``TopDownRelease.to_release().confidence_intervals()``: the GLS interval's integers, clipped at
0, widened to contain the count), and the share of intervals reaching below 0.  BLAS runs one
thread (threadpoolctl).  Results: ``results/topdown_intervals.json``.

    python benchmarks/bench_topdown_intervals.py [--reps 200] [--split default|equal] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench_topdown import INVARIANT, LEVELS, load  # noqa: E402
from sparsedp.topdown import plan_topdown, topdown  # noqa: E402


def split_levels(a: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(a, np.cumsum(sizes)[:-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--split", choices=("default", "equal"), default="default",
                    help="the design: plan_topdown's default (optimised) or the plain equal split")
    ap.add_argument("--out", default=str(HERE / "results" / "topdown_intervals.json"))
    args = ap.parse_args()
    with threadpool_limits(1, user_api="blas"):
        run(args)


def run(args: argparse.Namespace) -> None:
    table = load()
    h = table.hierarchy
    C = h.cells.size
    sizes = [s * C for s in h.sizes]
    truth = np.concatenate([t.ravel() for t in table.counts]).astype(np.float64)
    design = plan_topdown(h, rho=1.0, invariants=[INVARIANT], **({"split": "equal"} if args.split == "equal" else {}))
    hits = {"old": np.zeros(len(sizes)), "new": np.zeros(len(sizes))}
    below = {"old": np.zeros(len(sizes)), "new": np.zeros(len(sizes))}
    width = {"old": np.zeros(len(sizes)), "new": np.zeros(len(sizes))}
    t0 = time.perf_counter()
    for r in range(args.reps):
        rel = topdown(table, design=design, rng=np.random.default_rng([7, r]), keep_noisy=False).to_release()
        half = rel.error_report().half_widths(0.95, "normal")
        ends = {"old": (rel.answers - half, rel.answers + half), "new": rel.confidence_intervals(0.95)}
        for k, (lo, hi) in ends.items():
            cov = (lo <= truth) & (truth <= hi)
            for d, (c, l, w) in enumerate(zip(split_levels(cov, sizes), split_levels(lo < 0, sizes),
                                              split_levels(hi - lo, sizes))):
                hits[k][d] += c.mean()
                below[k][d] += l.mean()
                width[k][d] += w.mean()
        if (r + 1) % 20 == 0:
            print(f"{r + 1} releases, {time.perf_counter() - t0:.0f} s", flush=True)
    n = args.reps
    rows = {k: {lv: {"coverage": float(hits[k][d] / n), "below_zero": float(below[k][d] / n),
                     "mean_width": float(width[k][d] / n)} for d, lv in enumerate(LEVELS)} for k in hits}
    res = {"releases": n, "rho": 1.0, "invariant": INVARIANT, "level": 0.95, "target": [0.94, 0.97],
           "design": {"split": args.split, "shares": [lp.budget for lp in design.levels],
                      "queries": [[b.name for b in lp.blocks] for lp in design.levels]},
           "meets_target": {lv: bool(0.94 <= rows["new"][lv]["coverage"] <= 0.97 and rows["new"][lv]["below_zero"] == 0)
                            for lv in LEVELS},
           "intervals": rows, "seconds": time.perf_counter() - t0, "blas_threads": 1}
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"{'intervals':10s}" + "".join(f"{lv:>22s}" for lv in LEVELS))
    for k in rows:
        print(f"{k:10s}" + "".join(f"{rows[k][lv]['coverage']:10.4f} ({rows[k][lv]['below_zero']:5.1%} <0)"
                                   for lv in LEVELS))


if __name__ == "__main__":
    main()
