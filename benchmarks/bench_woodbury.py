"""GLS of p-Identity strategies: the Woodbury solve (sparsedp.woodbury) against LSMR.

For each ``n`` and two integer p-Identity strategies ``[diag(a); B]`` on all ranges (default ``p``;
:func:`strategy`: a short optimiser run, whose rows are still mostly sparse, and dense rows as after
a long run), measured once with Laplace noise: the GLS estimate by

* ``woodbury``: :func:`sparsedp.woodbury.woodbury_solver` (Cholesky of the ``p x p`` matrix ``K``,
  then one solve), what ``least_squares`` now uses for this form;
* ``lsmr``: the generic path it replaced (Jacobi-preconditioned LSMR, tol 1e-10, as in
  ``sparsedp.inference``), the baseline;

with the seconds of each (best of ``--repeat``), the ratio, LSMR's iterations, and the largest
difference of each from a dense least-squares reference (``numpy.linalg.lstsq``, ``n <= 4096``).

    python benchmarks/bench_woodbury.py [--sizes 1024 4096 8192] [--repeat 3] [--out benchmarks/results/woodbury.json]

BLAS is pinned to one thread (threadpoolctl) and reported.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp import workloads as wl  # noqa: E402
from sparsedp.inference import _lsmr_gls  # noqa: E402
from sparsedp.measure import plan_measurement  # noqa: E402
from sparsedp.optimize.calibrate import integer_pidentity, noise_model  # noqa: E402
from sparsedp.optimize.gram import Gram  # noqa: E402
from sparsedp.optimize.pidentity import PIdentityObjective, default_p, pidentity_strategy  # noqa: E402
from sparsedp.optimize.pidentity_family import pidentity_candidates  # noqa: E402
from sparsedp.optimize.pidentity_start import tree_start  # noqa: E402
from sparsedp.woodbury import woodbury_solver  # noqa: E402

DENSE_MAX_N = 4096


def best_of(repeat: int, fn):
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def strategy(n: int, kind: str, maxiter: int):
    """``"optimised"``: the p-Identity family's integer strategy on all ranges after ``maxiter``
    iterations from its tree start (still mostly the tree's sparse rows); ``"dense"``: the tree start
    plus ``U[0, 0.01]`` on every entry of ``Theta``, normalised and rounded the same way (dense rows,
    like the strategies of long runs)."""
    W = wl.all_ranges(n)
    model = noise_model("laplace")
    if kind == "optimised":
        (cand,) = pidentity_candidates(W, Gram(W), model, maxiter=maxiter, rng=np.random.default_rng(0))
        return cand.strategy
    obj = PIdentityObjective(Gram(W), model, default_p(n))
    theta = tree_start(obj, np.random.default_rng(0))[0] + np.random.default_rng(3).uniform(0, 0.01, (obj.p, n))
    d = 1.0 / obj.delta(theta)
    a, B = integer_pidentity(d, theta * d[None, :], model)
    return pidentity_strategy(a, B, f"dense p-identity(p={obj.p})")


def row(n: int, kind: str, repeat: int, maxiter: int) -> dict:
    M = strategy(n, kind, maxiter)
    m = M.shape[0]
    x = np.random.default_rng(1).integers(0, 50, n)
    y = plan_measurement(M, epsilon=1.0, noise="laplace").measure(x, rng=np.random.default_rng(2)).y
    v = np.ones(m)
    t_wb, x_wb = best_of(repeat, lambda: woodbury_solver(M, v)(y))
    t_ls, (x_ls, its) = best_of(repeat, lambda: _lsmr_gls(M, y, v, 1e-10, None))
    out = {"n": n, "strategy": kind, "p": m - n, "nnz": int(M.matrix.nnz), "woodbury_s": t_wb, "lsmr_s": t_ls, "lsmr_iterations": its,
           "speedup": t_ls / t_wb, "woodbury_vs_lsmr_max_diff": float(np.abs(x_wb - x_ls).max())}
    if n <= DENSE_MAX_N:
        ref = np.linalg.lstsq(M.toarray(), y, rcond=None)[0]
        out["woodbury_vs_dense_max_diff"] = float(np.abs(x_wb - ref).max())
        out["lsmr_vs_dense_max_diff"] = float(np.abs(x_ls - ref).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--maxiter", type=int, default=30, help="p-Identity iterations per strategy")
    ap.add_argument("--out", default=str(HERE / "results" / "woodbury.json"))
    args = ap.parse_args()
    with threadpool_limits(1):
        threads = sorted({d.get("num_threads") for d in threadpool_info()})
        print(f"BLAS threads: {threads}")
        rows = [row(n, kind, args.repeat, args.maxiter) for kind in ("optimised", "dense") for n in args.sizes]
    print(f"{'strategy':>9} {'n':>6} {'p':>4} {'nnz':>9} {'woodbury s':>11} {'LSMR s (its)':>16} {'speed-up':>9} "
          f"{'max |wb - dense|':>17} {'max |lsmr - dense|':>19}")
    for r in rows:
        print(f"{r['strategy']:>9} {r['n']:>6} {r['p']:>4} {r['nnz']:>9} {r['woodbury_s']:>11.4f} {r['lsmr_s']:>9.3f} ({r['lsmr_iterations']:>4}) "
              f"{r['speedup']:>8.0f}x {r.get('woodbury_vs_dense_max_diff', float('nan')):>17.2e} "
              f"{r.get('lsmr_vs_dense_max_diff', float('nan')):>19.2e}")
    result = {"benchmark": "woodbury", "machine": {"python": platform.python_version(), "platform": platform.platform()},
              "blas_threads": threads, "repeat": args.repeat, "rows": rows, "command": " ".join(sys.argv)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
