"""Issue 20 item 2: per-answer variances of tree releases on any interval tree.

``IntervalTreeCovariance`` (any tree shape: leaves at several depths) against the layered
``TreeCovariance`` of :mod:`sparsedp.range_variance` on the same balanced 16-ary tree (``n = 16^L``,
where ``kary_layout`` and ``TreeLayout.balanced`` give the same tree: the baseline, answers must
agree), then on the SC tree of ``LUEDPTree`` (leaves at several depths, no layered baseline) at
``2^20`` and ``2^24``: set-up (upward pass, sibling prefix sums), 10,000 random ranges, traced peak
(``tracemalloc``) beyond the tree, medians of interleaved repetitions.  The same node variances
(uniform in ``[0.5, 3]``) for both.  BLAS pinned to one thread (threadpoolctl); the machine has 2
cores shared with other helpers, so absolute times are contended: compare the ratios.

    python benchmarks/bench_per_answer.py [--log-n 20 24] [--reps 3] [--out benchmarks/results/per_answer.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

QUERIES = 10_000


def _ranges(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a, b = np.sort(rng.integers(0, n, (2, QUERIES)), axis=0)
    return a, b + 1


def _time(make, a, e, reps):
    setup, query, peak = [], [], []
    out = None
    for _ in range(reps):
        tracemalloc.start()
        t0 = time.perf_counter()
        cov = make()
        t1 = time.perf_counter()
        out = cov.ranges(a, e)
        t2 = time.perf_counter()
        peak.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
        setup.append(t1 - t0)
        query.append(t2 - t1)
        del cov
    return float(np.median(setup)), float(np.median(query)), float(np.median(peak)), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-n", type=int, nargs="+", default=[20, 24])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "per_answer.json"))
    args = ap.parse_args()
    from sparsedp.range_variance import IntervalTreeCovariance, TreeCovariance
    from sparsedp.strategies import TreeLayout
    from sparsedp.trees import kary_layout, sc_layout

    rows = []
    with threadpool_limits(1):
        # baseline: the same balanced tree, layered vs any-shape covariance
        n = 16**5
        tree, layout = kary_layout(n, 16), TreeLayout.balanced(n, 16)
        v = np.random.default_rng(1).uniform(0.5, 3.0, tree.size)
        a, e = _ranges(n)
        base, new = [], []
        for _ in range(args.reps):  # interleaved repetitions
            base.append(_time(lambda: TreeCovariance(layout, v), a, e, 1))
            new.append(_time(lambda: IntervalTreeCovariance(tree, v), a, e, 1))
        b = [float(np.median([r[i] for r in base])) for i in range(3)]
        w = [float(np.median([r[i] for r in new])) for i in range(3)]
        agree = float(np.max(np.abs(new[0][3] - base[0][3]) / base[0][3]))
        rows.append({"tree": "16-ary balanced", "n": n, "nodes": int(tree.size), "depth": int(tree.levels),
                     "layered_setup_s": b[0], "layered_ranges_s": b[1], "layered_peak_mib": b[2],
                     "any_shape_setup_s": w[0], "any_shape_ranges_s": w[1], "any_shape_peak_mib": w[2],
                     "ranges_ratio": w[1] / b[1], "setup_ratio": w[0] / b[0], "max_rel_diff": agree})
        for log_n in args.log_n:
            n = 2**log_n
            t0 = time.perf_counter()
            tree = sc_layout(n)
            build = time.perf_counter() - t0
            v = np.random.default_rng(1).uniform(0.5, 3.0, tree.size)
            a, e = _ranges(n)
            s, q, p, _ = _time(lambda t=tree, w=v: IntervalTreeCovariance(t, w), a, e, args.reps)
            rows.append({"tree": "SC (LUE-DPTree)", "n": n, "nodes": int(tree.size), "depth": int(tree.levels),
                         "tree_build_s": build, "any_shape_setup_s": s, "any_shape_ranges_s": q,
                         "any_shape_peak_mib": p})
    print(f"per-answer variances of {QUERIES} random ranges (BLAS threads: 1, load {os.getloadavg()[0]:.1f})")
    print(f"{'tree':<18} {'n':>10} {'nodes':>10} {'depth':>5} {'setup s':>8} {'ranges s':>9} {'peak MiB':>9} {'vs layered':>11}")
    for r in rows:
        ratio = f"{r['ranges_ratio']:.2f}x" if "ranges_ratio" in r else "-"
        print(f"{r['tree']:<18} {r['n']:>10} {r['nodes']:>10} {r['depth']:>5} {r['any_shape_setup_s']:>8.3f} "
              f"{r['any_shape_ranges_s']:>9.4f} {r['any_shape_peak_mib']:>9.1f} {ratio:>11}")
        if "ranges_ratio" in r:
            print(f"{'  layered':<18} {'':>10} {'':>10} {'':>5} {r['layered_setup_s']:>8.3f} "
                  f"{r['layered_ranges_s']:>9.4f} {r['layered_peak_mib']:>9.1f}   (max rel. diff {r['max_rel_diff']:.1e})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"queries": QUERIES, "blas_threads": 1, "reps": args.reps,
                               "machine": platform.platform(), "cores": os.cpu_count(),
                               "load_end": os.getloadavg()[0], "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
