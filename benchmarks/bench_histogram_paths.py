"""``sparsedp histogram`` in process against ``--executor threads``, same method and seed (issue 27).

For each method (``--methods``, default ``boost lue``) the command

    sparsedp histogram X.npy --epsilon 1 --method M --seed 3 --out a.npz                     # in process
    sparsedp histogram X.npy --epsilon 1 --method M --seed 3 --out b.npy --executor threads  # chunk by chunk

runs ``--reps`` times each (interleaved, each a fresh process: imports, reading the input, the
release and writing the file are all counted), on ``2^--log2n`` Poisson(3) counts (default 2^22,
generated with seed 0).  Reported: the minimum and median wall seconds of each path, their ratio
(in process / threads, within this run), the time the in-process run spends writing its ``.npz``
(``save``, measured in process), and whether the two files hold the same answers (``np.array_equal``:
one chunked algorithm on both paths, so they must).  BLAS is pinned to one thread (``threadpoolctl``
here, ``OPENBLAS_NUM_THREADS=1`` etc. in the subprocesses).  The machine has 2 cores shared with
other jobs: timings are noisy.

    python benchmarks/bench_histogram_paths.py [--log2n 22] [--reps 3] [--methods boost lue]
        [--dir /tmp] [--out benchmarks/results/histogram_paths.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

SAVE_PROBE = """
import sys, time
from sparsedp.scaleout import release_hierarchical, release_lue
import numpy as np
x, method, out = sys.argv[1], sys.argv[2], sys.argv[3]
f = release_lue if method == "lue" else release_hierarchical
kw = {} if method == "lue" else {"k": 16}
r = f(np.load(x), 1.0, rng=3, variances=True, **kw)
rel = r.to_release()
t = time.perf_counter(); rel.save(out, overwrite=True); print(time.perf_counter() - t)  # one probe file per run
"""


def run(argv: list[str]) -> float:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "sparsedp", *argv], env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2n", type=int, default=22)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=["boost", "lue"])
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "histogram_paths.json"))
    args = ap.parse_args()
    from sparsedp.releases import load_release

    n = 2**args.log2n
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d, threadpool_limits(1):
        x = Path(d) / "x.npy"
        np.save(x, np.random.default_rng(0).poisson(3, n))
        for method in args.methods:
            base = ["histogram", str(x), "--epsilon", "1", "--method", method, "--seed", "3", "--force"]
            a, b = Path(d) / f"{method}.npz", Path(d) / f"{method}.npy"
            inproc, threads = [], []
            for _ in range(args.reps):
                inproc.append(run(base + ["--out", str(a)]))
                threads.append(run(base + ["--out", str(b), "--executor", "threads", "--workers", "2"]))
            ra, rb = load_release(a), load_release(b)
            same = bool(np.array_equal(np.asarray(ra.answers), np.asarray(rb.answers)))
            probe = subprocess.run([sys.executable, "-c", SAVE_PROBE, str(x), method, str(Path(d) / "probe.npz")],
                                   env=ENV, capture_output=True, text=True, check=True)
            rows.append({"method": method, "n": n, "inprocess_min_s": min(inproc), "inprocess_median_s":
                         statistics.median(inproc), "threads_min_s": min(threads), "threads_median_s":
                         statistics.median(threads), "ratio_min": min(inproc) / min(threads),
                         "ratio_median": statistics.median(inproc) / statistics.median(threads),
                         "npz_save_s": float(probe.stdout.split()[-1]), "npz_bytes": a.stat().st_size,
                         "same_answers": same, "inprocess_variances": ra.variance_method,
                         "strategy": ra.strategy, "inprocess_all_s": inproc, "threads_all_s": threads})
    print(f"{'method':8} {'n':>9} {'in process s':>13} {'threads s':>10} {'ratio':>6} {'npz save s':>10} same")
    for r in rows:
        print(f"{r['method']:8} {r['n']:>9} {r['inprocess_min_s']:>13.2f} {r['threads_min_s']:>10.2f} "
              f"{r['ratio_min']:>6.2f} {r['npz_save_s']:>10.2f} {r['same_answers']}")
    out = {"benchmark": "histogram_paths", "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "note": "min of --reps fresh processes per path, interleaved; 2 shared cores: "
           "noisy; ratio = in process / threads in this run", "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
