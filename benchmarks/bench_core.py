"""Core benchmark: measure + reconstruct at n = 2^20 for every structured strategy.

For each strategy: seconds to build it, to calibrate and measure ``y = M x + Lap``, and to
reconstruct by its structure-aware GLS path; the same reconstruction by the generic path (LSMR on the
sparse matrix, Jacobi-preconditioned) as the in-run baseline, with the speed ratio; and the max
error of the fast reconstruction against an exact dense least-squares reference at n = 2^11.
Then the noise throughputs of ``bench_noise.py`` (float, secure discrete, opendp).

    python benchmarks/bench_core.py [--n 1048576] [--ref-n 2048] [--out benchmarks/results/core.json]

BLAS is pinned to one thread (threadpoolctl): on 2-core machines multi-threaded OpenBLAS is slower.
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
sys.path.insert(0, str(HERE))

from sparsedp import MatrixMechanism, least_squares, reconstruct  # noqa: E402
from sparsedp import strategies as st  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp.operators import SparseOperator  # noqa: E402

STRATEGIES = {
    "identity": st.identity,
    "hierarchical k=2": lambda n: st.hierarchical(n, 2),
    "hierarchical k=16": lambda n: st.hierarchical(n, 16),
    "haar": st.haar,
    "fenwick": st.fenwick,
}


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def reference_error(name: str, n: int, seed: int = 0) -> float:
    """Max |fast GLS - dense least squares| on the same noisy measurement at size n."""
    M = STRATEGIES[name](n)
    x = np.random.default_rng(seed).integers(0, 100, n).astype(float)
    meas = MatrixMechanism(wl.prefix(n), M, epsilon=1.0).measure(x, rng=seed)
    fast = reconstruct(meas).x
    A = M.toarray()
    ref = np.linalg.lstsq(A, meas.y, rcond=None)[0]  # homoscedastic: GLS = OLS
    return float(np.abs(fast - ref).max())


def run_core(n: int, ref_n: int, seed: int = 0, args_maxiter: int = 1000) -> list[dict]:
    rows = []
    x = np.random.default_rng(seed).integers(0, 100, n).astype(float)
    W = wl.prefix(n)
    for name, build in STRATEGIES.items():
        M, t_build = timed(build, n)
        mech, t_cal = timed(MatrixMechanism, W, M, epsilon=1.0)
        meas, t_meas = timed(mech.measure, x, rng=seed)
        rec, t_rec = timed(reconstruct, meas)
        generic = SparseOperator(M.tosparse(), name=f"generic {name}")  # same matrix, no structure tag
        base, t_base = timed(least_squares, generic, meas.y, meas.variances, tol=1e-10, maxiter=args_maxiter)
        total = t_build + t_cal + t_meas + t_rec
        rows.append(
            {
                "strategy": name,
                "n": n,
                "rows": M.shape[0],
                "nnz": int(M.tosparse().nnz),
                "sensitivity": mech.sensitivity,
                "build_s": t_build,
                "calibrate_s": t_cal,
                "measure_s": t_meas,
                "reconstruct_s": t_rec,
                "total_s": total,
                "solver": rec.solver,
                "baseline_lsmr_s": t_base,
                "baseline_lsmr_iterations": base.iterations,
                "baseline_lsmr_maxiter": args_maxiter,
                "speedup_vs_lsmr": t_base / t_rec,
                "max_diff_vs_lsmr": float(np.abs(base.x - rec.x).max()),
                "ref_n": ref_n,
                "max_error_vs_dense_ref": reference_error(name, ref_n, seed),
            }
        )
        r = rows[-1]
        print(
            f"{name:<19}{r['total_s']:>8.2f}{r['reconstruct_s']:>10.3f}{r['baseline_lsmr_s']:>10.2f}"
            f"{r['baseline_lsmr_iterations']:>6d}{r['speedup_vs_lsmr']:>9.0f}x{r['max_diff_vs_lsmr']:>12.2e}"
            f"{r['max_error_vs_dense_ref']:>12.2e}  {r['solver']}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1 << 20)
    parser.add_argument("--ref-n", type=int, default=1 << 11)
    parser.add_argument("--lsmr-maxiter", type=int, default=1000, help="iteration cap of the LSMR baseline")
    parser.add_argument("--noise-n", type=int, default=1_000_000, help="samples per noise throughput run")
    parser.add_argument("--out", default=str(HERE / "results" / "core.json"))
    args = parser.parse_args()
    with threadpool_limits(limits=1):
        threads = sorted({info.get("num_threads") for info in threadpool_info()})
        print(f"sparsedp core benchmark, n = {args.n}, BLAS threads pinned to {threads}, {platform.processor() or platform.machine()}")
        print(f"\n{'strategy':<19}{'total s':>8}{'recon s':>10}{'lsmr s':>10}{'its':>6}{'speedup':>10}{'|fast-lsmr|':>12}{'err@ref':>12}  solver")
        core = run_core(args.n, args.ref_n, args_maxiter=args.lsmr_maxiter)
        slowest = max(r["total_s"] for r in core)
        print(f"\nslowest strategy, build + calibrate + measure + reconstruct: {slowest:.2f} s (target < 5 s)")
        noise_rows = None
        try:
            from bench_noise import format_table, run as run_noise  # type: ignore

            print("\nnoise throughput (samples/s; ratio against opendp's integer Laplace in the same run)")
            noise_rows = run_noise(args.noise_n)
            print(format_table(noise_rows))
        except ImportError as exc:  # pragma: no cover
            print(f"noise benchmark unavailable: {exc}")
    out = {"n": args.n, "blas_threads": threads, "core": core, "noise": noise_rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
