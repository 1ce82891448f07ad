"""Default BLAS threads vs one thread on ``sparsedp complete`` (issue 15: speed without tuning).

Usage::

    python benchmarks/bench_blas_threads.py [--runs 4] [--rounds 2] [--out FILE] [-- extra CLI args]

Runs ``sparsedp complete --size 1000 --rank 10 --observed 0.15`` (the completion CLI, DLNM-QR, with
its exact-oracle evaluation) inside fresh Python processes, ``--runs`` times each after one warm-up
run, in three settings, interleaved over ``--rounds`` rounds so that load from other jobs hits
them alike:

* ``default``: no thread variable set (what a user gets without tuning; OpenBLAS starts one
  thread per core);
* ``pinned``: ``OPENBLAS_NUM_THREADS=1``;
* ``wrapped``: like ``default``, with the completion entry points (``METHODS``,
  ``oracle_least_squares``, ``synthetic_problem``) wrapped in ``sparsedp._threads.blas_threads()``
  at run time -- what the library does once its kernels are wrapped (see ``docs/notes.md``).

Prints the medians (wall seconds of the whole command in-process, and the solve's own reported
``seconds``), the ratio default / pinned and wrapped / pinned, and whether each agrees within
1.3x; writes JSON (default ``benchmarks/results/blas_threads.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
COMMAND = ["complete", "--size", "1000", "--rank", "10", "--observed", "0.15"]
USER_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
            "VECLIB_MAXIMUM_THREADS")

CHILD = r"""
import contextlib, io, json, sys, time
mode, runs, command = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
import sparsedp.completion as C
import sparsedp.completion.cli as cli
from sparsedp._threads import blas_threads
if mode == "wrapped":
    for key, fit in list(C.METHODS.items()):
        C.METHODS[key] = blas_threads()(fit)
    cli.oracle_least_squares = blas_threads()(cli.oracle_least_squares)
    cli.synthetic_problem = blas_threads()(cli.synthetic_problem)
from threadpoolctl import threadpool_info
from sparsedp.cli import main
threads = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
out = []
for k in range(runs + 1):
    buf = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        main(command)
    wall = time.perf_counter() - t
    solve = [float(l.split(":")[1]) for l in buf.getvalue().splitlines() if l.strip().startswith("seconds")]
    if k:  # the first run is a warm-up
        out.append([wall, solve[0] if solve else float("nan")])
print(json.dumps({"threads": threads, "runs": out}))
"""


def run(mode: str, runs: int, command: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in USER_ENV}
    if mode == "pinned":
        env["OPENBLAS_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(runs), json.dumps(command)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(HERE / "results" / "blas_threads.json"))
    ap.add_argument("extra", nargs="*", help="CLI arguments replacing the default command's options")
    args = ap.parse_args(argv)
    command = ["complete", *args.extra] if args.extra else COMMAND
    modes = ("default", "pinned", "wrapped")
    data: dict[str, dict] = {m: {"threads": None, "runs": []} for m in modes}
    for r in range(args.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):
            got = run(m, args.runs, command)
            data[m]["threads"] = got["threads"]
            data[m]["runs"].extend(got["runs"])
    summary = {}
    for m in modes:
        walls = [w for w, _ in data[m]["runs"]]
        solves = [s for _, s in data[m]["runs"]]
        summary[m] = {"blas_threads": data[m]["threads"], "wall_median_s": statistics.median(walls),
                      "wall_min_s": min(walls), "solve_median_s": statistics.median(solves),
                      "solve_min_s": min(solves), "runs": len(walls)}
    for m in ("default", "wrapped"):
        ratio = summary[m]["wall_median_s"] / summary["pinned"]["wall_median_s"]
        summary[m]["over_pinned"] = ratio
        summary[m]["agrees_within_1.3x"] = bool(1 / 1.3 <= ratio <= 1.3)
    print(f"sparsedp {' '.join(command)}  ({args.rounds} rounds x {args.runs} runs per setting)")
    print(f"{'setting':<9}{'BLAS threads':>14}{'wall median':>13}{'solve median':>14}{'/ pinned':>10}")
    for m in modes:
        s = summary[m]
        extra = f"{s['over_pinned']:>9.2f}x" if "over_pinned" in s else f"{'1':>9}x"
        print(f"{m:<9}{s['blas_threads']!s:>14}{s['wall_median_s']:>12.3f}s{s['solve_median_s']:>13.3f}s{extra}")
    out = {"benchmark": "BLAS threads: default vs pinned vs blas_threads-wrapped", "command": "sparsedp " + " ".join(command),
           "python": platform.python_version(), "cpus": os.cpu_count(),
           "load_avg_1min": os.getloadavg()[0], "note": "shared 2-core machine; other jobs running",
           "summary": summary, "raw": data}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
