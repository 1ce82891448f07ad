"""Large multi-dimensional releases without explicit products (issue 18, helper G).

* ``kron``: all 2-D ranges ``n x n`` (``AllRange (x) AllRange``) at eps = sqrt(2), pure DP: the
  Kronecker strategy of sparsedp.optimize.optimize_kron (``family="auto"``, seed 0,
  ``--kron-time`` seconds per factor), then sparsedp.marginals.release_kron on a synthetic count
  table (``--kron-records`` records from a mixture of 2-D Gaussian blobs): measure (exact discrete
  Laplace, OS entropy, through plan_measurement with the KronOperator: mode products) and
  reconstruct (factor-wise GLS).  Reported: seconds per phase; the expected per-query RMSE from the
  factored covariance (``v prod_i trace(W_i^T W_i C_i)``, exact discrete variance) against
  optimize_kron's formula (32.44 at 256) and HDMM's README (32.69); the realised RMSE over *all*
  ``(n (n+1) / 2)^2`` ranges (``kron_squared_error``: ``<E, G_1 E G_2>``, no answer enumerated),
  mean over ``--kron-releases`` releases; ``--sample`` random ranges answered by
  inclusion-exclusion on the 2-D cumulative sums with their variances (seconds, empirical RMSE
  over the same releases, root of the mean reported variance).  One release's errors on the ranges
  are strongly correlated (a few noise components dominate), so single-release RMSEs scatter by
  several per cent around the expected value.  Baseline in the same run: the explicit release with the
  product formed (``sp.kron`` of the factors, plan_measurement of that matrix, and a dense
  ``pinv`` for the GLS) where it fits (``n <= --explicit-max``), interleaved with the implicit one
  (medians of ``--reps``, after one untimed warm-up release); at larger ``n`` the explicit *measurement* only (the dense GLS of a
  ``n^2 x n^2`` Gram does not fit).
* ``residual``: sparsedp.marginals.release_marginals (rho = 1/2, exact discrete Gaussian) of all 2-
  and 3-way marginals of ``d`` attributes of size ``s`` (``--tables``, default 3x40, 4x50, 3x100, 4x100),
  ``--records`` synthetic records: select + tables + plan + measure + reconstruct seconds (median
  of ``--reps``), tracemalloc peak of one release, the realised sum of variances and the empirical
  total squared error of one release over the reported sum of variances.  Residuals whose
  ``Q_A`` has more than 2^19 non-zeros are measured implicitly (mode products); the baseline is
  the explicit path (every ``Q_A`` formed, ``_IMPLICIT_NNZ`` raised) where it fits (explicit
  ``Q_A`` non-zeros ``<= --explicit-nnz``), interleaved, with the ratio of medians.

The machine has 2 cores shared with other jobs (up to 7 other sessions during the measurements):
timings are noisy; ratios are of medians of interleaved runs in one process.  BLAS is pinned to one
thread (``sparsedp._threads.blas_threads(1)``).

    python benchmarks/bench_marginals_large.py [--parts kron residual] [--kron-n 32 64 256]
        [--kron-time 25] [--kron-releases 30] [--kron-records 1000000] [--sample 1000000]
        [--explicit-max 32] [--tables 3x40 4x50 3x100 4x100] [--records 100000] [--reps 3]
        [--explicit-nnz 30000000] [--out benchmarks/results/marginals_large.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp import plan_measurement  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp._threads import blas_threads  # noqa: E402
from sparsedp.marginals import (Domain, KronOperator, kron_squared_error, marginal_tables,  # noqa: E402
                                marginals_up_to, optimize_kron, release_kron, release_marginals,
                                synthetic_records)
import sparsedp.marginals.release as release_mod  # noqa: E402
from sparsedp.marginals.residual import contrast_basis  # noqa: E402
from sparsedp.operators import SparseOperator  # noqa: E402

HDMM_RMSE_256 = 32.69


def blobs(n: int, records: int, seed: int = 0) -> np.ndarray:
    """A synthetic ``n x n`` count table: ``records`` points from 5 Gaussian blobs, binned."""
    g = np.random.default_rng(seed)
    centres = g.uniform(0.15, 0.85, size=(5, 2)) * n
    widths = g.uniform(0.03, 0.15, size=5) * n
    k = g.integers(0, 5, size=records)
    pts = np.clip(np.rint(centres[k] + g.normal(size=(records, 2)) * widths[k, None]), 0, n - 1).astype(np.intp)
    return np.bincount(pts[:, 0] * n + pts[:, 1], minlength=n * n).reshape(n, n).astype(float)


def explicit_kron_release(x: np.ndarray, K: KronOperator, eps: float, gls: bool) -> tuple[float, float]:
    """The baseline: the product formed (sparse), measured by plan_measurement (exact noise on the
    same grid), and (``gls``) the dense least-squares reconstruction.  Returns (seconds, seconds of
    the measurement alone)."""
    t0 = time.perf_counter()
    A = sp.csr_matrix(K.factors[0])
    for F in K.factors[1:]:
        A = sp.kron(A, sp.csr_matrix(F), format="csr")
    g = 2.0 ** (math.ceil(math.log2(2**24)) - 49)
    plan = plan_measurement(SparseOperator(A), epsilon=eps, noise="laplace", grid=g)
    y = plan.measure(x.ravel()).y
    t1 = time.perf_counter()
    if gls:
        Ad = A.toarray()
        np.linalg.solve(Ad.T @ Ad, Ad.T @ y)
    return time.perf_counter() - t0, t1 - t0


def kron_rows(ns: list[int], seconds: float, releases: int, records: int, sample: int, explicit_max: int,
              reps: int) -> list[dict]:
    rows = []
    eps = math.sqrt(2)
    for n in ns:
        W = wl.all_ranges(n)
        t = time.perf_counter()
        k = optimize_kron([W, W], family="auto", rng=0, time_limit=seconds)
        t_opt = time.perf_counter() - t
        x = blobs(n, records)
        WK = KronOperator([W, W])
        q = WK.shape[0]
        imp, exp_t, exp_measure, realised, sampled, phases = [], [], [], [], [], []
        g = np.random.default_rng(1)
        ends = np.sort(g.integers(0, n, size=(sample, 2, 2)), axis=1)  # random ranges (lo <= hi per axis)
        lo_s, hi_s = ends[:, 0, :], ends[:, 1, :]
        P = np.pad(x.cumsum(0).cumsum(1), [(1, 0), (1, 0)])
        a, b = lo_s, hi_s + 1
        truth = P[b[:, 0], b[:, 1]] - P[a[:, 0], b[:, 1]] - P[b[:, 0], a[:, 1]] + P[a[:, 0], a[:, 1]]
        rel = release_kron(x, k, epsilon=eps)  # warm-up (the exact sampler's table), not timed
        for rep in range(max(reps, releases)):
            t = time.perf_counter()
            rel = release_kron(x, k, epsilon=eps)  # exact discrete Laplace, OS entropy
            imp.append(time.perf_counter() - t)
            phases.append(rel.seconds)
            if rep < releases:
                realised.append(kron_squared_error(WK, rel.x_hat, x))
                sampled.append(float(np.mean((rel.ranges(lo_s, hi_s)[0] - truth) ** 2)))
            if rep < reps:
                e_all, e_meas = explicit_kron_release(x, rel.strategy, eps, gls=n <= explicit_max)
                exp_t.append(e_all), exp_measure.append(e_meas)
        t = time.perf_counter()
        expected = rel.expected_squared_error(WK)
        t_expected = time.perf_counter() - t
        t = time.perf_counter()
        ans, var = rel.ranges(lo_s, hi_s)
        t_ranges = time.perf_counter() - t
        row = {
            "workload": f"all 2-D ranges {n} x {n}", "queries": q, "epsilon": eps, "records": records,
            "factors": list(k.names), "optimise_seconds": t_opt, "time_limit_per_factor": seconds,
            "release_seconds_median": statistics.median(imp), "release_phases_last": phases[-1],
            "expected_rmse": math.sqrt(expected / q), "optimize_kron_rmse": k.rmse(epsilon=eps),
            "expected_over_optimize_kron": math.sqrt(expected / q) / k.rmse(epsilon=eps),
            "expected_seconds": t_expected,
            "realised_rmse_all_ranges_mean": math.sqrt(statistics.mean(realised) / q),
            "realised_rmse_all_ranges_each": [math.sqrt(r / q) for r in realised],
            "sample_ranges": sample, "sample_seconds": t_ranges,
            "sample_rmse_last": float(np.sqrt(np.mean((ans - truth) ** 2))),
            "sample_rmse_mean": math.sqrt(statistics.mean(sampled)), "sample_reported_rmse": float(np.sqrt(var.mean())),
            "explicit_gls": n <= explicit_max,
            "explicit_seconds_median": statistics.median(exp_t),
            "explicit_measure_seconds_median": statistics.median(exp_measure),
            "explicit_over_implicit": statistics.median(exp_t) / statistics.median(imp),
            "optimise_release_expected_seconds": t_opt + statistics.median(imp) + t_expected,
        }
        if n == 256:
            row["hdmm_rmse"] = HDMM_RMSE_256
            row["ratio_to_hdmm"] = row["expected_rmse"] / HDMM_RMSE_256
        rows.append(row)
        print(f"{row['workload']}: {'/'.join(k.names)}; optimise {t_opt:.1f} s, release {row['release_seconds_median']:.3f} s "
              f"(explicit{'' if row['explicit_gls'] else ' measure only'} {row['explicit_seconds_median']:.3f} s, "
              f"ratio {row['explicit_over_implicit']:.1f}); expected RMSE {row['expected_rmse']:.4f} "
              f"(optimize_kron {row['optimize_kron_rmse']:.4f}); realised over all {q:.3g} ranges "
              f"{row['realised_rmse_all_ranges_mean']:.4f} (mean of {releases}); {sample} sampled ranges in "
              f"{t_ranges:.2f} s: RMSE {row['sample_rmse_mean']:.3f} (mean of {releases}), reported {row['sample_reported_rmse']:.3f}")
    return rows


def _explicit_nnz(dom: Domain) -> int:
    """Non-zeros of the largest explicit Q_A of the 3-way residuals."""
    nnz = [contrast_basis(s).nnz for s in dom.sizes]
    return max(math.prod(c) for c in itertools.combinations(nnz, 3))


def _release(X, dom, work, implicit: bool):
    old = release_mod._IMPLICIT_NNZ
    release_mod._IMPLICIT_NNZ = old if implicit else 2**62
    try:
        t = time.perf_counter()
        rel = release_marginals(X, dom, work, 0.5)  # exact discrete Gaussian, OS entropy
        return rel, time.perf_counter() - t
    finally:
        release_mod._IMPLICIT_NNZ = old


def residual_rows(tables: list[str], records: int, reps: int, explicit_nnz: int) -> list[dict]:
    rows = []
    for spec in tables:
        d, s = (int(v) for v in spec.split("x"))
        dom = Domain.uniform(d, s)
        X = synthetic_records(dom, records, rng=1)
        work = [S for S in marginals_up_to(dom, 3) if len(S) >= 2]
        big = _explicit_nnz(dom)
        do_explicit = big <= explicit_nnz
        imp, exp, phases = [], [], []
        _release(X, dom, work, True)  # warm-up (the exact sampler's tables for these scales), not timed
        for _ in range(reps):
            rel, sec = _release(X, dom, work, True)
            imp.append(sec), phases.append(rel.seconds)
            if do_explicit:
                exp.append(_release(X, dom, work, False)[1])
        tracemalloc.start()
        rel, _ = _release(X, dom, work, True)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        peak_exp = None
        if do_explicit:
            tracemalloc.start()
            _release(X, dom, work, False)
            peak_exp = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        truth = marginal_tables(X, dom, work)
        err = sum(float(np.sum((rel.marginals[tuple(dom.names[i] for i in S)] - truth[S]) ** 2)) for S in work)
        row = {"table": f"{d} attributes of size {s}", "marginals": len(work),
               "cells": int(sum(math.prod(dom.shape(S)) for S in work)), "records": records, "rho": 0.5,
               "largest_explicit_Q_nnz": big, "seconds_median": statistics.median(imp), "phases_last": phases[-1],
               "tracemalloc_peak_mb": peak / 2**20, "sum_of_variances": rel.sum_of_variances(),
               "empirical_sq_error_over_reported": err / rel.sum_of_variances(), "loss": rel.loss,
               "explicit_seconds_median": statistics.median(exp) if exp else None,
               "explicit_tracemalloc_peak_mb": peak_exp,
               "explicit_over_implicit": statistics.median(exp) / statistics.median(imp) if exp else None}
        rows.append(row)
        print(f"{row['table']}, {len(work)} marginals ({row['cells']} cells), {records} records: "
              f"{row['seconds_median']:.2f} s (phases {', '.join(f'{k} {v:.2f}' for k, v in row['phases_last'].items())}), "
              f"peak {row['tracemalloc_peak_mb']:.0f} MB; empirical/reported {row['empirical_sq_error_over_reported']:.3f}"
              + (f"; explicit {row['explicit_seconds_median']:.2f} s, peak {peak_exp:.0f} MB, ratio "
                 f"{row['explicit_over_implicit']:.1f}" if exp else f"; explicit skipped (Q_A {big:.3g} non-zeros)"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", default=["kron", "residual"], choices=["kron", "residual"])
    ap.add_argument("--kron-n", type=int, nargs="+", default=[32, 64, 256])
    ap.add_argument("--kron-time", type=float, default=25.0)
    ap.add_argument("--kron-releases", type=int, default=30)
    ap.add_argument("--kron-records", type=int, default=10**6)
    ap.add_argument("--sample", type=int, default=10**6)
    ap.add_argument("--explicit-max", type=int, default=32)
    ap.add_argument("--tables", nargs="+", default=["3x40", "4x50", "3x100", "4x100"])
    ap.add_argument("--records", type=int, default=10**5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--explicit-nnz", type=int, default=30_000_000)
    ap.add_argument("--out", default=str(HERE / "results" / "marginals_large.json"))
    args = ap.parse_args()
    old = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() else {}
    with blas_threads(1):
        kr = kron_rows(args.kron_n, args.kron_time, args.kron_releases, args.kron_records, args.sample,
                       args.explicit_max, args.reps) if "kron" in args.parts else old.get("kron", [])
        rr = residual_rows(args.tables, args.records, args.reps, args.explicit_nnz) \
            if "residual" in args.parts else old.get("residual", [])
    cmd = "python benchmarks/bench_marginals_large.py " + " ".join(sys.argv[1:])
    for part, rows in (("kron", kr), ("residual", rr)):
        if part in args.parts:
            for row in rows:
                row["command"] = cmd
    out = {"kron": kr, "residual": rr, "blas_threads": 1, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
           "python": platform.python_version(), "numpy": np.__version__,
           "command": cmd}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
