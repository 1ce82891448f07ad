"""What ``optimize(W)`` with its defaults costs and returns, and that it does not depend on load.

Rows (Laplace at ``epsilon = 1`` unless noted, exact discrete noise as the mechanism draws it,
``OPENBLAS_NUM_THREADS=1``):

* ``windows``: daily counts over 4,686 days, every 7- and 30-day window (9,337 queries) -- the
  default call on an idle machine and again with two CPU-bound processes spinning (``same`` says
  whether both gave the identical strategy), with the ratio to the identity and the best template;
* ``prefix`` / ``all_ranges`` at ``n = 256`` and ``all_ranges`` at ``n = 1024`` (the small-``n``
  targets of ``benchmarks/bench_peers.py``: 13,784 / 2.1452e6 at ``n = 256``, float Laplace);
* with ``--large``: ``prefix(2**20)`` (about 40 s);
* with ``--slow``: the windows workload with an explicit ``time_limit=60`` (p-Identity gets the time);
* with ``--sweep``: the sizes between, where the work caps decide what runs (prefix 2048, all ranges
  4096, windows over 1,000 and 2,000 days, Laplace; prefix 4096 and windows 2,000 Gaussian).

``before``: the same calls measured on the code before the default lost its wall clock (commit
4ab28d8, ``time_limit=52`` by default), on the shared 2-core machine.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python benchmarks/bench_optimize_defaults.py [--large] [--slow]

writes ``benchmarks/results/optimize_defaults.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_rows  # noqa: E402

from sparsedp import workloads as wl  # noqa: E402
from sparsedp.optimize import optimize  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "optimize_defaults.json"

#: Measured on 4ab28d8 (default time_limit=52), one BLAS thread, the shared 2-core machine.
BEFORE = {
    "windows": "45.0 s, tree[k=8] per-level 314,862.9 (0.9915x identity; the issue: 52-55 s 0.9913x "
               "quiet, 44.7 s the identity loaded; 39 s in the binary-tree family)",
    "prefix(2^20)": "58.3 s (50.5 s in the issue), hybrid 688,279,428 (0.740x the best template)",
    "prefix(256)": "13,784 (float Laplace), 0.05 s",
    "all_ranges(256)": "2.1452e6 (float Laplace), 0.05 s",
}


def windows(n: int = 4686) -> object:
    """Every 7- and 30-day window over ``n`` days."""
    return wl.range_queries(n, [(i, i + w - 1) for w in (7, 30) for i in range(n - w + 1)])


def _row(label: str, W: object, **kw: object) -> tuple[dict, object]:
    t0 = time.perf_counter()
    res = optimize(W, **kw)
    secs = time.perf_counter() - t0
    ident = next((t.error for t in res.history if t.name == "identity"), None)
    best_t = res.best_template()
    row = {"workload": label, "n": int(W.shape[1]), "queries": int(W.shape[0]), "options": repr(kw),
           "seconds": round(secs, 3), "family": res.family, "name": res.name, "error": res.error.total,
           "vs_identity": None if ident is None else res.error.total / ident,
           "vs_best_template": None if best_t is None else res.error.total / best_t.error,
           "before": BEFORE.get(label)}
    return row, res


def _busy(W: object) -> tuple[float, object]:
    """The default call with two CPU-bound processes spinning."""
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        t0 = time.perf_counter()
        res = optimize(W)
        return time.perf_counter() - t0, res
    finally:
        for proc in spin:
            proc.kill()
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", action="store_true", help="also prefix(2**20) (about 40 s)")
    ap.add_argument("--slow", action="store_true", help="also the windows workload with time_limit=60")
    ap.add_argument("--sweep", action="store_true", help="also the sizes between (about 2 minutes)")
    ap.add_argument("--merge", action="store_true", help="keep rows of an earlier run this one did not measure")
    args = ap.parse_args()
    rows = []
    W = windows()
    row, quiet = _row("windows", W)
    secs, busy = _busy(W)
    row.update(busy_seconds=round(secs, 3), same=bool(
        busy.name == quiet.name and busy.error.total == quiet.error.total
        and (busy.strategy.tosparse() != quiet.strategy.tosparse()).nnz == 0))
    rows.append(row)
    for label, Wk, kw in (("prefix(256)", wl.prefix(256), {"secure": False}),
                          ("all_ranges(256)", wl.all_ranges(256), {"secure": False}),
                          ("all_ranges(1024)", wl.all_ranges(1024), {})):
        rows.append(_row(label, Wk, **kw)[0])
    if args.slow:
        rows.append(_row("windows", W, time_limit=60.0)[0] | {"workload": "windows, time_limit=60"})
    if args.sweep:
        for label, Wk, kw in (("prefix(2048)", wl.prefix(2048), {}), ("all_ranges(4096)", wl.all_ranges(4096), {}),
                              ("windows", windows(1000), {}), ("windows", windows(2000), {}),
                              ("prefix(4096) gaussian", wl.prefix(4096), {"noise": "gaussian"}),
                              ("windows gaussian", windows(2000), {"noise": "gaussian"})):
            rows.append(_row(label, Wk, **kw)[0])
    if args.large:
        rows.append(_row("prefix(2^20)", wl.prefix(2**20))[0])
    print(f"{'workload':<24}{'s':>8}{'busy s':>8}  {'same':<5} {'winner':<34}{'error':>14}{'/ident':>8}{'/templ':>8}")
    for r in rows:
        vi = "" if r["vs_identity"] is None else f"{r['vs_identity']:.4f}"
        vt = "" if r["vs_best_template"] is None else f"{r['vs_best_template']:.4f}"
        print(f"{r['workload']:<24}{r['seconds']:>8.2f}{r.get('busy_seconds', float('nan')):>8.2f}  "
              f"{str(r.get('same', '')):<5} {r['name'][:33]:<34}{r['error']:>14.6g}{vi:>8}{vt:>8}")
    write_rows(OUT, {"benchmark": "optimize_defaults", "command": " ".join(sys.argv), "rows": rows},
               args.merge, key=("workload", "n"))


if __name__ == "__main__":
    main()
