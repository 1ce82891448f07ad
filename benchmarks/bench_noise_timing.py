"""Timing channel of the exact samplers: does the time of a draw depend on the value drawn?

Issue 19 (#10) asks to measure it.  The exact discrete Laplace sampler resolves most draws with
one table lookup, but a draw whose value lands in a flagged bucket or in the tail (``|k| >= M``,
probability about ``2^-10``) takes a slower branch (more random bits, an overflow geometric).  An
adversary who can time a release of one value learns that its noise was large, which shifts the
likelihood of neighbouring data sets at the edge of the tail: pure DP does not hold against an
observer of timings.  This script measures the gap per single draw (``size=1``) and for batches.

Usage::

    python benchmarks/bench_noise_timing.py [--calls N] [--out FILE]

One BLAS thread (threadpoolctl); results printed and written as JSON
(default ``benchmarks/results/noise_timing.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
try:
    import sparsedp  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, str(HERE.parent))

from sparsedp import noise as nz  # noqa: E402

try:
    from threadpoolctl import threadpool_limits
except ImportError:  # pragma: no cover
    threadpool_limits = None

DEFAULT_OUT = HERE / "results" / "noise_timing.json"


def single_draws(kind: str, scale: float, calls: int) -> dict:
    """Time ``calls`` single draws; split them by whether the value is in the sampler's tail."""
    f = nz.discrete_laplace if kind == "laplace" else nz.discrete_gaussian
    f(scale, size=1)  # build and cache the tables
    plan = nz._laplace_plan(scale, light=True) if kind == "laplace" else None
    times = np.empty(calls)
    values = np.empty(calls, dtype=np.int64)
    for i in range(calls):
        t = time.perf_counter_ns()
        values[i] = f(scale, size=1)[0]
        times[i] = time.perf_counter_ns() - t
    # the tail: the overflow categories of the Laplace main table, or |k| beyond 4 sigma
    edge = plan.M if plan is not None else 4 * scale
    tail = np.abs(values) >= edge
    row = {
        "kind": kind, "scale": scale, "calls": calls, "tail_edge": int(edge), "tail_draws": int(tail.sum()),
        "median_ns_main": float(np.median(times[~tail])),
        "median_ns_tail": float(np.median(times[tail])) if tail.any() else None,
        "p99_ns_main": float(np.percentile(times[~tail], 99)),
    }
    row["tail_over_main"] = row["median_ns_tail"] / row["median_ns_main"] if tail.any() else None
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40000)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    ctx = threadpool_limits(1) if threadpool_limits else None
    rows = [single_draws("laplace", s, args.calls) for s in (1.0, 10.0, 1000.0)]
    rows += [single_draws("gaussian", s, args.calls // 4) for s in (1.0, 10.0)]
    print(f"{'kind':9s} {'scale':>7s} {'calls':>7s} {'tail':>6s} {'main ns':>9s} {'tail ns':>9s} {'tail/main':>9s}")
    for r in rows:
        ratio = f"{r['tail_over_main']:.2f}" if r["tail_over_main"] else "-"
        tail_ns = f"{r['median_ns_tail']:.0f}" if r["median_ns_tail"] else "-"
        print(f"{r['kind']:9s} {r['scale']:7g} {r['calls']:7d} {r['tail_draws']:6d} "
              f"{r['median_ns_main']:9.0f} {tail_ns:>9s} {ratio:>9s}")
    out = {"python": platform.python_version(), "blas_threads": 1, "rows": rows,
           "command": "python benchmarks/bench_noise_timing.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    if ctx is not None:
        ctx.unregister() if hasattr(ctx, "unregister") else None
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
