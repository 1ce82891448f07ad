"""Multi-dimensional releases (issue 18): ResidualPlanner's zCDP optimum and full marginal releases.

* ``zcdp``: the sum of the variances of all marginal cells (unit weight per marginal, rho = 1/2)
  of sparsedp.marginals.select_residuals against the ResidualPlanner figures measured for the issue
  (they are the optimum: the target is equality to 1e-6 relative), with the selection time (median
  of ``--reps`` interleaved runs).
* ``release``: 20 attributes of size 10, ``--records`` synthetic records (latent-class model,
  sparsedp.marginals.synthetic_records), all 1,351 marginals of order <= 3: select + tables +
  measure (exact discrete Gaussian noise from OS entropy, through plan_measurement) + reconstruct.
  Reported: wall seconds per phase for a *cold* release (the first of that size in the process;
  in the first size's, the exact sampler's tables for each noise scale are built) and the median
  of ``--warm`` warm releases;
  peak memory as tracemalloc's peak during one release and the process's ``VmHWM`` (records,
  generator temporaries and interpreter included); the realised sum of variances against the
  optimum; and the empirical total squared error of one release against the true marginals
  divided by the reported sum of variances (1 in expectation).
* ``kron``: all 2-D ranges as ``AllRange (x) AllRange`` with a Kronecker strategy of 1-D factors
  optimised by sparsedp.optimize (sparsedp.optimize.optimize_kron, ``family="auto"``): total
  squared error at eps = 1 on 32 x 32 against HDMM's KronPIdentity (6.453e7) and the identity
  strategy (the baseline, same run); per-query RMSE at eps = sqrt(2) on 256 x 256 against HDMM's
  README (32.69), with the optimise + evaluate seconds (``--kron-time`` seconds per factor).
* ``pure``: all 2-way marginals of sizes (2,3,4,5,4,3,2,6), eps = 1, total squared error of the
  weighted-marginals strategy (sparsedp.marginals.optimize_marginals_laplace, 4 and 16 restarts,
  seed 0) against HDMM's Marginals template (1.763e5) and the identity (full table) baseline;
  then a release with it (exact discrete Laplace) of 10^5 synthetic records: seconds, exact sum of
  variances (exact discrete variances: a little below the continuous formula) and the empirical
  total squared error of that one release.
* ``nonneg``: consistent non-negative marginals (sparsedp.marginals.nonnegative_marginals) on
  all 2-way marginals of 8 attributes (sizes 9,2,5,6,4,7,3,8), 2,000 synthetic records, rho = 0.1:
  total squared error against the truth with and without the option, mean over 5 releases
  (exact noise), the smallest cell before, iterations and seconds.
* ``penguins``: the shipped real table (sparsedp.datasets.penguins: 344 Palmer penguins, 8
  attributes of sizes 3..8, the ``data`` extra): all 2-way and all 3-way marginals at each
  ``--penguin-rho``, ``--penguin-releases`` releases each (exact noise): seconds of a release
  (select + tables + measure + reconstruct) and of the consistent non-negative post-processing;
  total squared error against the true marginals, mean over the releases, of the plain release,
  of the non-negative one (``metric="workload"``, the default, and ``metric="gls"``, the former
  default) and of clipping negative cells to 0 (an inconsistent baseline), with
  the paired ratio non-negative / plain (the same releases: a ratio measured in the same run);
  and the released number of records (the sum of a marginal) of both, against the true 344.
* baseline in the same run: the tables by one ``np.bincount`` per maximal marginal (intp codes)
  against the block tables (ratio of seconds).

The machine has 2 cores shared with other jobs (load ~8 during the measurements): timings are
noisy and several times the unloaded ones.  BLAS is pinned to one thread (not used here).

    python benchmarks/bench_multidim.py [--records 1000000] [--reps 5] [--warm 2] [--kron-time 25]
        [--parts zcdp release kron pure nonneg penguins] [--penguin-rho 0.5 5] [--penguin-releases 20]
        [--out benchmarks/results/multidim.json]

(parts not run keep their rows from an existing ``--out`` file.)
"""

from __future__ import annotations

import argparse
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp._threads import blas_threads  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp.marginals import (Domain, closure, marginal_tables, marginals_up_to,  # noqa: E402
                                release_marginals, select_residuals, synthetic_records)
from sparsedp.marginals import marginal_operator, optimize_marginals_laplace, release_marginals_laplace  # noqa: E402
from sparsedp.optimize import optimize_kron  # noqa: E402
from sparsedp.marginals.kron_opt import factor_trace  # noqa: E402

# (label, sizes, order, exact order only, ResidualPlanner's value, its seconds, as measured for the issue)
RP_ROWS = [
    ("2-way, 8 x size 4", [4] * 8, 2, True, 6431.620, 0.002),
    ("2-way, sizes (4,5,6,7,8,9,10,10)", [4, 5, 6, 7, 8, 9, 10, 10], 2, True, 28050.956, 0.002),
    ("2-way, 20 x size 10", [10] * 20, 2, True, 2.620638e6, 0.014),
    ("2-way, 50 x size 10", [10] * 50, 2, True, 1.048781e8, 0.086),
    ("2-way, 100 x size 10", [10] * 100, 2, True, 1.680797e9, 0.32),
    ("order <= 3, 20 x size 10", [10] * 20, 3, False, 8.398599e8, None),
]
RHO = 0.5
PARTS = ["zcdp", "release", "kron", "pure", "nonneg", "penguins"]


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def zcdp_rows(reps: int) -> list[dict]:
    doms = [Domain([f"a{i}" for i in range(len(s))], s) for _, s, *_ in RP_ROWS]
    wls = [marginals_up_to(d, k, exact) for d, (_, _, k, exact, *_) in zip(doms, RP_ROWS)]
    times: list[list[float]] = [[] for _ in RP_ROWS]
    values = [0.0] * len(RP_ROWS)
    for _ in range(reps):  # interleaved repetitions
        for j, (d, w) in enumerate(zip(doms, wls)):
            t = time.perf_counter()
            sel = select_residuals(d, w, RHO)
            times[j].append(time.perf_counter() - t)
            values[j] = sel.value
    rows = []
    for j, (label, sizes, k, exact, ref, rp_s) in enumerate(RP_ROWS):
        rows.append({"workload": label, "marginals": len(wls[j]), "sum_of_variances": values[j],
                     "residualplanner": ref, "relative_difference": values[j] / ref - 1.0,
                     "seconds_median": statistics.median(times[j]), "residualplanner_seconds": rp_s})
    return rows


def naive_tables(X: np.ndarray, dom: Domain, sets: list) -> float:
    """Baseline: one bincount per maximal set (intp codes), seconds."""
    t = time.perf_counter()
    cols = np.ascontiguousarray(X.T)
    for A in sets:
        code = cols[A[0]].astype(np.intp)
        for i in A[1:]:
            code = code * dom.sizes[i] + cols[i]
        np.bincount(code, minlength=math.prod(dom.shape(A)))
    return time.perf_counter() - t


def release_rows(n: int, warm: int) -> dict:
    dom = Domain.uniform(20, 10)
    X = synthetic_records(dom, n, rng=2026)
    work = marginals_up_to(dom, 3)
    out: dict = {"records": n, "attributes": 20, "size": 10, "marginals": len(work), "rho": RHO}
    t = time.perf_counter()
    rel = release_marginals(X, dom, work, RHO)
    out["cold_seconds"] = time.perf_counter() - t
    out["cold_phases"] = rel.seconds
    warm_t, phases = [], []
    for _ in range(warm):
        t = time.perf_counter()
        rel = release_marginals(X, dom, work, RHO)
        warm_t.append(time.perf_counter() - t)
        phases.append(rel.seconds)
    out["warm_seconds_median"] = statistics.median(warm_t)
    out["warm_seconds"] = warm_t
    out["warm_phases"] = phases
    tracemalloc.start()
    rel = release_marginals(X, dom, work, RHO)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["tracemalloc_peak_mb"] = peak / 2**20
    out["records_mb"] = X.nbytes / 2**20
    out["vmhwm_mb"] = peak_rss_mb()
    out["sum_of_variances"] = rel.sum_of_variances()
    out["optimum"] = rel.selection.value
    out["realised_over_optimum"] = rel.sum_of_variances() / rel.selection.value
    out["certified_rho"] = rel.loss
    truth = marginal_tables(X, dom, list(rel.selection.marginals))
    sq = sum(float(np.sum((rel.marginals[tuple(dom.names[i] for i in S)] - truth[S]) ** 2))
             for S in rel.selection.marginals)
    out["empirical_sq_error_over_reported"] = sq / rel.sum_of_variances()
    sets = [A for A in closure(work) if len(A) == 3]
    t = time.perf_counter()
    marginal_tables(X, dom, closure(work), max_cells=int(min(2**17, max(2**10, n // 8))))  # as the release
    blocks = time.perf_counter() - t
    naive = naive_tables(X, dom, sets)
    out["tables_blocks_seconds"] = blocks
    out["tables_naive_seconds"] = naive
    out["tables_naive_over_blocks"] = naive / blocks
    return out


def kron_rows(seconds: float) -> list[dict]:
    rows = []
    for n, eps, ref, what in [(32, 1.0, 6.453e7, "total"), (256, math.sqrt(2), 32.69, "rmse")]:
        W = wl.all_ranges(n)
        t = time.perf_counter()
        k = optimize_kron([W, W], family="auto", rng=0, time_limit=seconds)
        value = k.total_error(epsilon=eps) if what == "total" else k.rmse(epsilon=eps)
        el = time.perf_counter() - t
        ident = 2.0 / eps**2 * factor_trace(W, wl.identity(n)) ** 2  # identity: Delta_1 = 1
        base = ident if what == "total" else math.sqrt(ident / k.queries)
        rows.append({"workload": f"all 2-D ranges {n} x {n}", "epsilon": eps, "measure": what, "sparsedp": value,
                     "hdmm": ref, "ratio_to_hdmm": value / ref, "identity_baseline": base,
                     "ratio_to_identity": value / base, "factors": list(k.names), "seconds": el,
                     "time_limit_per_factor": seconds})
    return rows


def pure_rows() -> list[dict]:
    dom = Domain([f"a{i}" for i in range(8)], [2, 3, 4, 5, 4, 3, 2, 6])
    work = marginals_up_to(dom, 2, exact=True)
    # identity baseline: the full table with Laplace(1/eps): 2 * sum_S ||W_S||_F^2 = 2 * cells(S) * N_S summed
    ident = 2.0 * sum(marginal_operator(dom, S).frobenius_sq() for S in work)
    rows = []
    for restarts in (4, 16):
        t = time.perf_counter()
        s = optimize_marginals_laplace(dom, work, 1.0, restarts=restarts, rng=0)
        el = time.perf_counter() - t
        X = synthetic_records(dom, 10**5, rng=1)
        t = time.perf_counter()
        rel = release_marginals_laplace(X, s)  # exact discrete Laplace, OS entropy
        rel_s = time.perf_counter() - t
        truth = marginal_tables(X, dom, work)
        sq = sum(float(np.sum((rel.marginals[tuple(dom.names[i] for i in S)] - truth[S]) ** 2)) for S in work)
        rows.append({"workload": "all 2-way marginals, sizes (2,3,4,5,4,3,2,6)", "epsilon": 1.0,
                     "restarts": restarts, "sparsedp": s.total_error, "hdmm_marginals": 1.763e5,
                     "ratio_to_hdmm": s.total_error / 1.763e5, "identity_baseline": ident,
                     "measured_marginals": len(s.measured), "seconds": el,
                     "release_records": 10**5, "release_seconds": rel_s,
                     "release_sum_of_variances": rel.sum_of_variances(),
                     "release_empirical_sq_error": sq})
    return rows


def nonneg_rows(reps: int = 5) -> list[dict]:
    from sparsedp.marginals import nonnegative_marginals

    dom = Domain(["age", "sex", "region", "edu", "work", "income", "health", "tenure"], [9, 2, 5, 6, 4, 7, 3, 8])
    X = synthetic_records(dom, 2000, rng=0)
    work = marginals_up_to(dom, 2, exact=True)
    truth = marginal_tables(X, dom, work)

    def err(ms: dict) -> float:
        return sum(float(np.sum((ms[tuple(dom.names[i] for i in S)] - truth[S]) ** 2)) for S in work)

    rows = []
    for _ in range(reps):
        rel = release_marginals(X, dom, work, 0.1)
        t = time.perf_counter()
        nn = nonnegative_marginals(rel, iters=2000)
        rows.append({"plain": err(rel.marginals), "nonneg": err(nn.marginals), "seconds": time.perf_counter() - t,
                     "iterations": nn.iterations, "max_violation": nn.max_violation,
                     "min_cell_before": min(float(m.min()) for m in rel.marginals.values()),
                     "reported_sum_of_variances": rel.sum_of_variances()})
    return [{"workload": "all 2-way, 8 attributes (9,2,5,6,4,7,3,8), 2000 records, rho 0.1", "releases": rows,
             "mean_plain": statistics.mean(r["plain"] for r in rows),
             "mean_nonneg": statistics.mean(r["nonneg"] for r in rows)}]


def penguins_rows(rhos: list[float], releases: int) -> list[dict]:
    from sparsedp.datasets import penguins
    from sparsedp.errors import SparseDPError
    from sparsedp.marginals import nonnegative_marginals

    try:
        table = penguins()
    except SparseDPError as exc:
        print(f"penguins: skipped ({exc})")
        return []
    X, dom = table.records, table.domain
    rows = []
    for k in (2, 3):
        work = marginals_up_to(dom, k, exact=True)
        truth = marginal_tables(X, dom, work)
        keys = [(tuple(dom.names[i] for i in S), S) for S in work]

        def err(ms: dict) -> float:
            return sum(float(np.sum((ms[key] - truth[S]) ** 2)) for key, S in keys)

        for rho in rhos:
            runs = []
            for _ in range(releases):
                t = time.perf_counter()
                rel = release_marginals(X, dom, work, rho)  # exact noise from OS entropy
                t_rel = time.perf_counter() - t
                t = time.perf_counter()
                nn = nonnegative_marginals(rel, iters=2000)  # metric="workload" (the default)
                t_nn = time.perf_counter() - t
                t = time.perf_counter()
                gls = nonnegative_marginals(rel, iters=2000, metric="gls")  # the former default
                t_gls = time.perf_counter() - t
                plain, nonneg, nonneg_gls = err(rel.marginals), err(nn.marginals), err(gls.marginals)
                assert min(float(m.min()) for m in (*nn.marginals.values(), *gls.marginals.values())) >= 0
                runs.append({"plain": plain, "nonneg": nonneg, "clipped": err({q: np.maximum(m, 0.0) for q, m in rel.marginals.items()}),
                             "ratio": nonneg / plain, "release_seconds": t_rel, "nonneg_seconds": t_nn,
                             "nonneg_gls": nonneg_gls, "ratio_gls": nonneg_gls / plain, "gls_seconds": t_gls,
                             "gls_iterations": gls.iterations, "mix": nn.mix, "gls_mix": gls.mix,
                             "total_gls": float(next(iter(gls.marginals.values())).sum()),
                             "phases": rel.seconds, "iterations": nn.iterations, "max_violation": nn.max_violation,
                             "negative_cells": int(sum(int(np.count_nonzero(m < 0)) for m in rel.marginals.values())),
                             # the released number of records: the sum of any one (consistent) marginal
                             "total_plain": float(next(iter(rel.marginals.values())).sum()),
                             "total_nonneg": float(next(iter(nn.marginals.values())).sum())})
            rows.append({
                "workload": f"all {k}-way marginals, Palmer penguins (344 records, sizes {','.join(map(str, dom.sizes))})",
                "order": k, "marginals": len(work), "cells": int(sum(math.prod(dom.shape(S)) for S in work)),
                "rho": rho, "releases": releases, "reported_sum_of_variances": rel.sum_of_variances(),
                "mean_plain": statistics.mean(r["plain"] for r in runs),
                "sem_plain": statistics.stdev(r["plain"] for r in runs) / math.sqrt(releases),
                "mean_nonneg": statistics.mean(r["nonneg"] for r in runs),
                "sem_nonneg": statistics.stdev(r["nonneg"] for r in runs) / math.sqrt(releases),
                "mean_clipped": statistics.mean(r["clipped"] for r in runs),
                "nonneg_over_plain": statistics.mean(r["nonneg"] for r in runs) / statistics.mean(r["plain"] for r in runs),
                "nonneg_over_plain_paired_mean": statistics.mean(r["ratio"] for r in runs),
                "nonneg_better_in": sum(r["ratio"] < 1 for r in runs),
                "mean_nonneg_gls": statistics.mean(r["nonneg_gls"] for r in runs),
                "gls_over_plain": statistics.mean(r["nonneg_gls"] for r in runs) / statistics.mean(r["plain"] for r in runs),
                "gls_better_in": sum(r["ratio_gls"] < 1 for r in runs),
                "gls_seconds_median": statistics.median(r["gls_seconds"] for r in runs),
                "gls_iterations_median": statistics.median(r["gls_iterations"] for r in runs),
                "total_gls_mean": statistics.mean(r["total_gls"] for r in runs),
                "mix_max": max(max(r["mix"], r["gls_mix"]) for r in runs),
                "release_seconds_median": statistics.median(r["release_seconds"] for r in runs),
                "nonneg_seconds_median": statistics.median(r["nonneg_seconds"] for r in runs),
                "iterations_median": statistics.median(r["iterations"] for r in runs),
                "max_violation": max(r["max_violation"] for r in runs),
                "negative_cells_mean": statistics.mean(r["negative_cells"] for r in runs),
                "records": int(X.shape[0]), "total_plain_mean": statistics.mean(r["total_plain"] for r in runs),
                "total_nonneg_mean": statistics.mean(r["total_nonneg"] for r in runs),
                "load_average": os.getloadavg(), "command": "python benchmarks/bench_multidim.py " + " ".join(sys.argv[1:]),
                "runs": runs})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, nargs="+", default=[10**6])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--kron-time", type=float, default=25.0)
    ap.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS)
    ap.add_argument("--penguin-rho", type=float, nargs="+", default=[0.5, 5.0])
    ap.add_argument("--penguin-releases", type=int, default=20)
    ap.add_argument("--out", default=str(HERE / "results" / "multidim.json"))
    args = ap.parse_args()
    zc, rels, kr = [], [], []
    with blas_threads(1):
        if "zcdp" in args.parts:
            zc = zcdp_rows(args.reps)
            print(f"{'workload':36s} {'sparsedp':>16s} {'ResidualPlanner':>16s} {'rel diff':>10s} {'seconds':>8s}")
            for r in zc:
                print(f"{r['workload']:36s} {r['sum_of_variances']:16.9g} {r['residualplanner']:16.9g} "
                      f"{r['relative_difference']:10.2e} {r['seconds_median']:8.4f}")
        for n in (args.records if "release" in args.parts else []):
            r = release_rows(n, args.warm)
            rels.append(r)
            print(f"release n={n}: cold {r['cold_seconds']:.2f} s, warm median {r['warm_seconds_median']:.2f} s "
                  f"(phases {', '.join(f'{k} {v:.2f}' for k, v in r['warm_phases'][-1].items())}), "
                  f"tracemalloc peak {r['tracemalloc_peak_mb']:.0f} MB, VmHWM {r['vmhwm_mb']:.0f} MB; "
                  f"realised/optimum {r['realised_over_optimum']:.8f}; empirical/reported "
                  f"{r['empirical_sq_error_over_reported']:.4f}; tables naive/blocks {r['tables_naive_over_blocks']:.2f}")
        if "kron" in args.parts:
            kr = kron_rows(args.kron_time)
            for r in kr:
                print(f"{r['workload']} eps={r['epsilon']:.4g} {r['measure']}: {r['sparsedp']:.6g} (HDMM {r['hdmm']:.6g}, "
                      f"ratio {r['ratio_to_hdmm']:.4f}; identity {r['identity_baseline']:.6g}) {r['factors'][0]} "
                      f"in {r['seconds']:.1f} s")
        pr = pure_rows() if "pure" in args.parts else []
        for r in pr:
            print(f"pure DP {r['workload']}, {r['restarts']} restarts: {r['sparsedp']:.6g} (HDMM {r['hdmm_marginals']:.6g}, "
                  f"ratio {r['ratio_to_hdmm']:.4f}; identity {r['identity_baseline']:.6g}) in {r['seconds']:.2f} s; "
                  f"release of 10^5 records {r['release_seconds']:.2f} s, exact variance {r['release_sum_of_variances']:.6g}, "
                  f"empirical squared error {r['release_empirical_sq_error']:.6g}")
        nr = nonneg_rows() if "nonneg" in args.parts else []
        for r in nr:
            print(f"nonneg {r['workload']}: total squared error {r['mean_plain']:.6g} -> {r['mean_nonneg']:.6g} "
                  f"(mean of {len(r['releases'])}; {statistics.mean(x['seconds'] for x in r['releases']):.2f} s each)")
        pg = penguins_rows(args.penguin_rho, args.penguin_releases) if "penguins" in args.parts else []
        if pg:
            print(f"{'penguins':10s} {'rho':>5s} {'marg':>5s} {'plain':>10s} {'non-neg':>10s} {'nn gls':>10s} {'clipped':>10s} "
                  f"{'nn/plain':>9s} {'gls/plain':>9s} {'nn better':>9s} {'release s':>10s} {'nonneg s':>9s} {'gls s':>7s} "
                  f"{'iters':>6s} {'total plain / nn / gls':>24s}")
            for r in pg:
                print(f"{str(r['order']) + '-way':10s} {r['rho']:5.2g} {r['marginals']:5d} {r['mean_plain']:10.1f} "
                      f"{r['mean_nonneg']:10.1f} {r['mean_nonneg_gls']:10.1f} {r['mean_clipped']:10.1f} "
                      f"{r['nonneg_over_plain']:9.3f} {r['gls_over_plain']:9.3f} "
                      f"{r['nonneg_better_in']:>4d}/{r['releases']:<4d} {r['release_seconds_median']:10.3f} "
                      f"{r['nonneg_seconds_median']:9.2f} {r['gls_seconds_median']:7.2f} {r['iterations_median']:6.0f} "
                      f"{r['total_plain_mean']:8.1f} / {r['total_nonneg_mean']:.1f} / {r['total_gls_mean']:.1f}")
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    cmd = "python benchmarks/bench_multidim.py " + " ".join(sys.argv[1:])
    pg = pg or old.get("penguins", [])
    nr = nr or old.get("nonneg", [])
    pr = pr or old.get("pure", [])
    zc = zc or old.get("zcdp", [])
    rels = rels or old.get("release", [])
    kr = kr or old.get("kron", [])
    result = {
        "zcdp": zc, "release": rels, "kron": kr, "pure": pr, "nonneg": nr, "penguins": pg, "blas_threads": 1, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
        "python": platform.python_version(), "numpy": np.__version__, "rho": RHO,
        "note": "2-core machine shared with other jobs: timings are noisy (see load_average)",
        "command": cmd,
        # the command that produced each part's rows (parts not run keep theirs)
        "commands": {**(old.get("commands") or dict.fromkeys(PARTS, old.get("command"))), **dict.fromkeys(args.parts, cmd)},
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
