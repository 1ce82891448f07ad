"""Histogram publishers on interval trees (seed 004): accuracy on DPBench + synthetic, and scale.

Accuracy: for every data set (the 16 DPBench 1-D histograms, n = 4096, and a synthetic n = 2^16),
every eps in {1, 0.1, 0.01} and every publisher (LUE-DPTree on its SC tree; LUE-DPTree on the
binary tree, to separate the budget from the tree; Boost; Boost-UN; Privelet; Dwork), the mean
squared error (eq. 3.16) of 1000 random ranges (endpoints uniform, sorted) and of 1000 random
ranges of each fixed length 2^0 ... 2^12, averaged over ``--reps`` runs (default 50).  The
baseline in the same run is Boost: the table prints the ratio LUE-DPTree / Boost.

Analytic: the expected random-range error without consistency (eq. 3.2 / 3.6) of the binary tree
and the SC tree with uniform budgets and with CNP + NPBD budgets (the seed's Fig. 3.10 claim).

Scale: seconds of the whole LUE-DPTree pipeline (SC tree, coverage, budgets, noise, BLUE, 1000
range answers) for n = 2^16 ... 2^24, against Boost (binary tree, uniform budget, same BLUE) in the
same run, and the BLUE alone against the consistency engine's sparse direct solve (CHOLMOD) of the
same weighted projection where that fits (n <= 2^20).

Exact against float noise (issue 13, key ``measure``): seconds of ``LUEDPTree(1).fit`` and
``Boost(1).fit`` at n = 2^20 with ``secure=True`` (exact discrete Laplace, the default) and
``secure=False`` (float Laplace), interleaved, ``--measure-reps`` times each; the ratio of the
medians is the issue's throughput target (<= 1.25).  ``--measure-only`` runs just this part and
updates the ``measure`` key of an existing results file.

Exact post-BLUE budgets (issue 11, key ``gls``): on every DPBench data set (n = 4096) and eps in
{1, 0.1}, side by side in one run with the same noise stream per publisher: LUE-DPTree (SC tree,
the paper's proxy budgets), ``LUEDPTree(objective="gls")`` for uniform random ranges on the same
tree, the same with the whole-domain query listed (``whole_domain=GLS_WHOLE``), and a uniform
16-ary tree (``Boost(k=16)``).  Expected errors are exact (:class:`sparsedp.trees.gls.GLSQueryObjective`
on each release's actual per-node noise variances: the random-range MSE over all ``n(n+1)/2``
ranges, and the whole-domain variance), checked against the empirical squared errors of
``--gls-reps`` releases (1000 random ranges; the whole domain, pooled over data sets since its
error does not depend on the data).  Targets: random-range MSE of gls <= 0.9 x LUE-DPTree's,
whole-domain error of gls (whole domain listed) <= 2 x the 16-ary tree's.  Also the hybrid strategy
(block trees plus dense rows on block sums, ``sparsedp.optimize(all_ranges(n), family="hybrid")``,
:class:`HybridRelease`) on the same data sets, noise seeds and ranges.  Also the exact
trade-off between the two as the whole-domain weight grows.  ``--gls-only`` runs just this part
and updates the ``gls`` key of an existing results file.

Both targets at once (issue 11, key ``hybrid_whole``): the hybrid strategy optimised for the exact
objective "all ranges averaged + ``w`` x the whole-domain query" for a sweep of ``w``
(:func:`hybrid_whole_tradeoff`): exact random-range MSE and whole-domain error against the two
targets, and an empirical check of the point closest to them.  ``--hybrid-whole-only`` runs just
this part and updates the ``hybrid_whole`` key.

    python benchmarks/bench_trees.py [--reps 50] [--max-log-n 24] [--out benchmarks/results/trees.json]
    python benchmarks/bench_trees.py --measure-only [--measure-reps 7]
    python benchmarks/bench_trees.py --gls-only [--gls-reps 100] [--datasets 16]
    python benchmarks/bench_trees.py --hybrid-whole-only [--hybrid-whole-reps 20] [--datasets 16]

BLAS is pinned to one thread (threadpoolctl).
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

from sparsedp.datasets import dpbench_names, load_dpbench, synthetic_histogram  # noqa: E402
from sparsedp.intervals import IntervalRows  # noqa: E402
from sparsedp.measure import plan_measurement  # noqa: E402
from sparsedp.trees.gls import GLSQueryObjective  # noqa: E402
from sparsedp.trees import (  # noqa: E402
    Boost,
    BoostUN,
    Dwork,
    LUEDPTree,
    Privelet,
    allocate_budget,
    blue,
    coverage_probabilities,
    expected_range_error,
    kary_layout,
    sc_layout,
    to_constraints,
    uniform_budget,
)

EPSILONS = (1.0, 0.1, 0.01)
METHODS = {
    "lue-dptree": lambda e: LUEDPTree(e),
    "lue-binary": lambda e: LUEDPTree(e, tree="kary", k=2),
    "boost": lambda e: Boost(e),
    "boost-un": lambda e: BoostUN(e),
    "privelet": lambda e: Privelet(e),
    "dwork": lambda e: Dwork(e),
}


def random_ranges(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    a, b = rng.integers(0, n, m), rng.integers(0, n, m)
    return np.column_stack([np.minimum(a, b), np.maximum(a, b)])


def fixed_ranges(n: int, length: int, m: int, rng: np.random.Generator) -> np.ndarray:
    lo = rng.integers(0, n - length + 1, m)
    return np.column_stack([lo, lo + length - 1])


def truth(x: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    cs = np.concatenate(([0.0], np.cumsum(x)))
    return cs[pairs[:, 1] + 1] - cs[pairs[:, 0]]


def accuracy(datasets: dict[str, np.ndarray], reps: int, seed: int) -> list[dict]:
    rows = []
    for dname, x in datasets.items():
        n = x.size
        qrng = np.random.default_rng(seed)
        sets = {"random": random_ranges(n, 1000, qrng)}
        for j in range(13):
            if 2**j <= n:
                sets[f"len{2 ** j}"] = fixed_ranges(n, 2**j, 1000, qrng)
        allq = np.concatenate(list(sets.values()))
        bounds = np.cumsum([0] + [len(v) for v in sets.values()])
        t_all = truth(x, allq)
        for ie, eps in enumerate(EPSILONS):
            for mname, make in METHODS.items():
                rng = np.random.default_rng([seed, ie, 1])  # fresh noise per eps
                sq = np.zeros(len(sets))
                t0 = time.perf_counter()
                for _ in range(reps):
                    err2 = (make(eps).fit(x, rng=rng).ranges(allq) - t_all) ** 2
                    sq += np.add.reduceat(err2, bounds[:-1]) / np.diff(bounds)
                sec = (time.perf_counter() - t0) / reps
                rows.append({"dataset": dname, "n": n, "epsilon": eps, "method": mname, "seconds_per_run": sec,
                             **{k: float(v / reps) for k, v in zip(sets, sq)}})
            print(f"  {dname:<48} eps={eps:<5} " + "  ".join(
                f"{r['method']}={r['random']:.4g}" for r in rows[-len(METHODS):]), flush=True)
    return rows


def analytic(ns: list[int]) -> list[dict]:
    """Expected random-range error (no consistency, eq. 3.2 / 3.6) at eps = 1."""
    out = []
    for n in ns:
        for tname, tree in (("binary", kary_layout(n, 2)), ("sc", sc_layout(n))):
            p = coverage_probabilities(tree)
            out.append({"n": n, "tree": tname, "nodes": tree.size, "levels": tree.levels,
                        "uniform": expected_range_error(tree, uniform_budget(tree, 1.0), p),
                        "allocated": expected_range_error(tree, allocate_budget(tree, 1.0, p), p)})
    return out


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def scale(log_ns: list[int], seed: int) -> list[dict]:
    rows = []
    for ln in log_ns:
        n = 1 << ln
        x = np.random.default_rng(seed).integers(0, 100, n).astype(np.float64)
        pairs = random_ranges(n, 1000, np.random.default_rng(seed))
        rng = np.random.default_rng(seed + 1)
        tree, t_tree = timed(sc_layout, n)
        p, t_cov = timed(coverage_probabilities, tree)
        eps, t_alloc = timed(allocate_budget, tree, 1.0, p)
        t0 = time.perf_counter()
        noisy = plan_measurement(IntervalRows(n, tree.lo, tree.hi), scales=1.0 / eps).measure(x, rng=rng).y
        t_noise = time.perf_counter() - t0
        _, t_blue = timed(blue, tree, noisy, eps)
        lue, t_lue = timed(LUEDPTree(1.0).fit, x, rng)
        _, t_q = timed(lue.ranges, pairs)
        boost, t_boost = timed(Boost(1.0).fit, x, rng)
        _, t_bq = timed(boost.ranges, pairs)
        row = {"n": n, "nodes": tree.size, "levels": tree.levels, "sc_tree_s": t_tree, "coverage_s": t_cov,
               "allocate_s": t_alloc, "noise_s": t_noise, "blue_s": t_blue, "lue_pipeline_s": t_lue + t_q,
               "boost_pipeline_s": t_boost + t_bq}
        if n <= 1 << 20:
            try:
                from sparsedp import consistency

                C, b = to_constraints(tree)
                res, t_direct = timed(consistency.solve, noisy, consistency.LinearConstraints(C, b),
                                      variances=1.0 / eps**2, method="direct")
                row["engine_direct_s"] = t_direct
                row["blue_vs_direct_maxdiff"] = float(np.abs(res.x - blue(tree, noisy, eps)).max())
            except ImportError:
                pass
        rows.append(row)
        print(f"  n=2^{ln}: nodes {tree.size}, LUE pipeline {row['lue_pipeline_s']:.2f} s, "
              f"Boost {row['boost_pipeline_s']:.2f} s, BLUE {t_blue:.2f} s", flush=True)
    return rows


def measure_throughput(log_n: int, reps: int, seed: int) -> list[dict]:
    """Exact (``secure=True``) against float (``secure=False``) noise: whole ``fit`` seconds."""
    n = 1 << log_n
    x = np.random.default_rng(seed).integers(0, 100, n).astype(np.float64)
    pubs = {"lue-dptree": LUEDPTree, "boost": Boost}
    times: dict[tuple[str, bool], list[float]] = {(m, s): [] for m in pubs for s in (True, False)}
    for _ in range(reps):
        for name, cls in pubs.items():
            for secure in (True, False):  # interleaved, so contention hits both alike
                _, t = timed(cls(1.0, secure=secure).fit, x)
                times[(name, secure)].append(t)
    rows = []
    for name in pubs:
        ex, fl = times[(name, True)], times[(name, False)]
        rows.append({"method": name, "n": n, "reps": reps, "exact_s": ex, "float_s": fl,
                     "exact_median_s": float(np.median(ex)), "float_median_s": float(np.median(fl)),
                     "ratio_median": float(np.median(ex) / np.median(fl)), "ratio_min": float(min(ex) / min(fl))})
        r = rows[-1]
        print(f"  {name:<11} n=2^{log_n}: exact {r['exact_median_s']:.3f} s, float {r['float_median_s']:.3f} s "
              f"(medians of {reps}), ratio {r['ratio_median']:.2f} (of minima {r['ratio_min']:.2f})", flush=True)
    return rows


#: Probability of the whole-domain query in the "whole domain listed" configuration.
GLS_WHOLE = 0.6
GLS_EPSILONS = (1.0, 0.1)
GLS_METHODS = {
    "lue-dptree": lambda e: LUEDPTree(e),
    "lue-gls": lambda e: LUEDPTree(e, objective="gls"),
    "lue-gls-k16": lambda e: LUEDPTree(e, tree="kary", k=16, objective="gls"),
    "lue-gls-whole": lambda e: LUEDPTree(e, objective="gls", whole_domain=GLS_WHOLE),
    "boost-16": lambda e: Boost(e, k=16),
}


#: Time limit of the hybrid strategy's optimisation for uniform random ranges (n = 4096).
HYBRID_TIME_LIMIT = 300.0


class HybridRelease:
    """A release of the hybrid strategy optimised for uniform random ranges (all ranges, issue 11):
    ``sparsedp.optimize(all_ranges(n), family="hybrid")``, measured by its own plan (exact Laplace
    noise, seeded here) and reconstructed by the Woodbury GLS (:class:`sparsedp.optimize.hybrid.HybridGLS`).
    Its exact errors follow from the plan's variance: random-range MSE ``v * f / (n (n + 1) / 2)``
    and whole domain ``v * [(M^T M)^{-1}]_{1 1^T}`` (the last prefix variance)."""

    def __init__(self, n: int, time_limit: float = HYBRID_TIME_LIMIT):
        from sparsedp import workloads
        from sparsedp.optimize import optimize
        from sparsedp.optimize.calibrate import noise_model, unit_variance
        from sparsedp.optimize.hybrid import HybridGLS

        t0 = time.perf_counter()
        self.res = optimize(workloads.all_ranges(n), family="hybrid", rng=0, time_limit=time_limit)
        self.seconds = time.perf_counter() - t0
        self.n = n
        self.gls = HybridGLS(self.res.strategy.meta["hybrid"])
        self.f = self.res.error.total / unit_variance(self.res.strategy, noise_model("laplace"))
        self.whole = float(self.gls.prefix_variances()[-1])
        self.plans: dict[float, object] = {}

    def release(self, x: np.ndarray, eps: float, rng) -> tuple[np.ndarray, float]:
        if eps not in self.plans:
            self.plans[eps] = plan_measurement(self.res.strategy, epsilon=eps, noise="laplace")
        plan = self.plans[eps]
        y = plan.measure(x, rng=rng).y
        return np.concatenate(([0.0], np.cumsum(self.gls.solve(y)))), float(plan.variances()[0])


def gls_compare(datasets: dict[str, np.ndarray], reps: int, seed: int) -> dict:
    """objective="gls" against LUE-DPTree and a uniform 16-ary tree (module docstring), plus the
    hybrid strategy (:class:`HybridRelease`)."""
    rows = []
    hybrids: dict[int, HybridRelease] = {}
    pubs = {(m, eps): make(eps) for m, make in GLS_METHODS.items() for eps in GLS_EPSILONS}
    t0 = time.perf_counter()
    for pub in pubs.values():  # budgets are data-independent: optimise once (timed), reuse per release
        pub.fit(next(iter(datasets.values())).astype(np.int64), rng=seed)
    budget_s = time.perf_counter() - t0
    whole_sq: dict[tuple[str, float], list[float]] = {k: [] for k in pubs}
    for idata, (dname, x) in enumerate(datasets.items()):
        n = x.size
        xi = x.astype(np.int64)
        pairs = random_ranges(n, 1000, np.random.default_rng(seed))
        t_pairs, total = truth(x, pairs), float(x.sum())
        for ie, eps in enumerate(GLS_EPSILONS):
            for mname in GLS_METHODS:
                pub = pubs[(mname, eps)]
                rng = np.random.default_rng([seed, ie, 7, idata])  # one noise stream per (data set, eps)
                rr, wd = [], []
                for _ in range(reps):
                    rel = pub.fit(xi, rng=rng).release_
                    rr.append(float(np.mean((rel.ranges(pairs) - t_pairs) ** 2)))
                    wd.append((rel.range(0, n - 1) - total) ** 2)
                whole_sq[(mname, eps)] += wd
                v = rel.noise_variances
                exact_rr = GLSQueryObjective(rel.tree).error(v)
                exact_wd = GLSQueryObjective(rel.tree, whole_domain=1.0).error(v)
                rows.append({"dataset": dname, "n": n, "epsilon": eps, "method": mname, "reps": reps,
                             "tree_nodes": rel.tree.size, "exact_range_mse": exact_rr, "exact_whole_domain": exact_wd,
                             "empirical_range_mse": float(np.mean(rr)), "empirical_whole_domain": float(np.mean(wd))})
            if n not in hybrids:
                hybrids[n] = HybridRelease(n)
            hyb = hybrids[n]
            rng = np.random.default_rng([seed, ie, 7, idata])
            rr, wd = [], []
            for _ in range(reps):
                cs, v = hyb.release(xi, eps, rng)
                rr.append(float(np.mean((cs[pairs[:, 1] + 1] - cs[pairs[:, 0]] - t_pairs) ** 2)))
                wd.append((cs[-1] - total) ** 2)
            whole_sq.setdefault(("hybrid", eps), []).extend(wd)
            rows.append({"dataset": dname, "n": n, "epsilon": eps, "method": "hybrid", "reps": reps,
                         "strategy": hyb.res.name, "optimiser_seconds": hyb.seconds,
                         "exact_range_mse": v * hyb.f / (n * (n + 1) / 2), "exact_whole_domain": v * hyb.whole,
                         "empirical_range_mse": float(np.mean(rr)), "empirical_whole_domain": float(np.mean(wd))})
            r = {m["method"]: m for m in rows[-len(GLS_METHODS) - 1:]}
            print(f"  {dname:<48} eps={eps:<4} range MSE exact/emp: " + "  ".join(
                f"{m}={v['exact_range_mse']:.4g}/{v['empirical_range_mse']:.4g}" for m, v in r.items()), flush=True)
    # exact trade-off between random ranges and the whole domain (SC tree, n = 4096, eps = 1)
    trade = []
    from sparsedp.trees import gls_budget, gls_error

    tree = sc_layout(4096)
    for w in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, GLS_WHOLE, 0.8):
        e = gls_budget(tree, 1.0, whole_domain=w)
        trade.append({"whole_domain": w, "range_mse": gls_error(tree, e), "whole_domain_error": gls_error(tree, e, whole_domain=1.0)})
    lue_e = allocate_budget(tree, 1.0, coverage_probabilities(tree))
    trade.append({"whole_domain": "lue", "range_mse": gls_error(tree, lue_e), "whole_domain_error": gls_error(tree, lue_e, whole_domain=1.0)})
    b16 = kary_layout(4096, 16)
    u16 = uniform_budget(b16, 1.0)
    trade.append({"whole_domain": "boost-16", "range_mse": gls_error(b16, u16), "whole_domain_error": gls_error(b16, u16, whole_domain=1.0)})
    pooled = {f"{m}@{eps}": {"releases": len(v), "empirical_whole_domain": float(np.mean(v))} for (m, eps), v in whole_sq.items()}
    return {"rows": rows, "pooled_whole_domain": pooled, "tradeoff_sc4096_eps1": trade, "budget_seconds_all": budget_s,
            "whole_domain_weight": GLS_WHOLE, "epsilons": list(GLS_EPSILONS)}


def gls_summary(res: dict) -> dict:
    """Per (data set, eps) the target ratios, exact and empirical; prints the table."""
    rows = res["rows"]
    out = []
    print("\nobjective='gls' (issue 11 targets: range ratio <= 0.9, whole-domain ratio <= 2)")
    print(f"{'dataset':<44}{'eps':>5}{'LUE rng':>10}{'gls rng':>10}{'ratio':>7}{'(emp)':>7}{'k16':>7}{'(emp)':>7}"
          f"{'16-ary wd':>11}{'gls-w wd':>10}{'ratio':>7}{'(emp)':>7}{'gls-w rng':>11}{'gls wd':>9}")
    for dname in dict.fromkeys(r["dataset"] for r in rows):
        for eps in res["epsilons"]:
            m = {r["method"]: r for r in rows if r["dataset"] == dname and r["epsilon"] == eps}
            lue, gls, glw, b16 = m["lue-dptree"], m["lue-gls"], m["lue-gls-whole"], m["boost-16"]
            s = {"dataset": dname, "epsilon": eps,
                 "range_ratio_exact": gls["exact_range_mse"] / lue["exact_range_mse"],
                 "range_ratio_empirical": gls["empirical_range_mse"] / lue["empirical_range_mse"],
                 "range_ratio_exact_k16": m["lue-gls-k16"]["exact_range_mse"] / lue["exact_range_mse"],
                 "range_ratio_empirical_k16": m["lue-gls-k16"]["empirical_range_mse"] / lue["empirical_range_mse"],
                 "range_ratio_exact_hybrid": m["hybrid"]["exact_range_mse"] / lue["exact_range_mse"],
                 "range_ratio_empirical_hybrid": m["hybrid"]["empirical_range_mse"] / lue["empirical_range_mse"],
                 "whole_ratio_exact": glw["exact_whole_domain"] / b16["exact_whole_domain"],
                 "whole_ratio_empirical": glw["empirical_whole_domain"] / b16["empirical_whole_domain"]}
            s["range_target_met"] = min(s["range_ratio_exact"], s["range_ratio_exact_k16"]) <= 0.9
            s["range_target_met_hybrid"] = s["range_ratio_exact_hybrid"] <= 0.9
            s["whole_target_met"] = s["whole_ratio_exact"] <= 2.0
            out.append(s)
            print(f"{dname[:43]:<44}{eps:>5}{lue['exact_range_mse']:>10.4g}{gls['exact_range_mse']:>10.4g}"
                  f"{s['range_ratio_exact']:>7.3f}{s['range_ratio_empirical']:>7.3f}{s['range_ratio_exact_k16']:>7.3f}"
                  f"{s['range_ratio_empirical_k16']:>7.3f}{b16['exact_whole_domain']:>11.4g}"
                  f"{glw['exact_whole_domain']:>10.4g}{s['whole_ratio_exact']:>7.3f}{s['whole_ratio_empirical']:>7.3f}"
                  f"{glw['exact_range_mse']:>11.4g}{gls['exact_whole_domain']:>9.4g}"
                  f"  hybrid {s['range_ratio_exact_hybrid']:.3f} ({s['range_ratio_empirical_hybrid']:.3f})")
    pooled = res["pooled_whole_domain"]
    pooled_range = {}
    for eps in res["epsilons"]:
        emp = {m: float(np.mean([r["empirical_range_mse"] for r in rows if r["method"] == m and r["epsilon"] == eps]))
               for m in (*GLS_METHODS, "hybrid")}
        pooled_range[str(eps)] = emp
        print(f"  pooled random-range MSE over data sets, eps={eps}: " + "  ".join(f"{m}={v:.4g}" for m, v in emp.items())
              + f"; gls/LUE {emp['lue-gls'] / emp['lue-dptree']:.3f}, gls-k16/LUE {emp['lue-gls-k16'] / emp['lue-dptree']:.3f}"
              + f", hybrid/LUE {emp['hybrid'] / emp['lue-dptree']:.3f}")
    for eps in res["epsilons"]:
        a, b = pooled[f"lue-gls-whole@{eps}"], pooled[f"boost-16@{eps}"]
        print(f"  pooled whole-domain squared error, eps={eps}: gls-whole {a['empirical_whole_domain']:.4g} vs 16-ary "
              f"{b['empirical_whole_domain']:.4g} ({a['releases']} releases each): ratio "
              f"{a['empirical_whole_domain'] / b['empirical_whole_domain']:.3f}")
    print("  exact trade-off, SC tree n=4096 eps=1 (whole_domain weight: range MSE, whole-domain error):")
    for t in res["tradeoff_sc4096_eps1"]:
        print(f"    {t['whole_domain']!s:>8}: {t['range_mse']:.4g}  {t['whole_domain_error']:.4g}")
    return {"ratios": out, "pooled_range_mse": pooled_range, "range_target_met_all": all(s["range_target_met"] for s in out),
            "whole_target_met_all": all(s["whole_target_met"] for s in out),
            "range_target_met_all_hybrid": all(s["range_target_met_hybrid"] for s in out)}


def empirical_range_whole(datasets: dict[str, np.ndarray], plan, solve, reps: int,
                          seed: list[int]) -> tuple[list[float], list[float]]:
    """``reps`` releases of ``plan`` per data set (generator ``[*seed, data set index]``), each
    reconstructed by ``solve`` (measurements as columns -> estimates as columns): the MSE over the
    same 1000 random ranges (generator ``seed[0]``) and the squared whole-domain error, per release."""
    rr: list[float] = []
    wd: list[float] = []
    for idata, x in enumerate(datasets.values()):
        xi = x.astype(np.int64)
        pairs = random_ranges(x.size, 1000, np.random.default_rng(seed[0]))
        t_pairs, total = truth(x, pairs), float(x.sum())
        rng = np.random.default_rng([*seed, idata])
        Y = np.column_stack([plan.measure(xi, rng=rng).y for _ in range(reps)])
        cs = np.vstack([np.zeros((1, reps)), np.cumsum(solve(Y), axis=0)])
        rr += np.mean((cs[pairs[:, 1] + 1] - cs[pairs[:, 0]] - t_pairs[:, None]) ** 2, axis=0).tolist()
        wd += ((cs[-1] - total) ** 2).tolist()
    return rr, wd


#: Whole-domain weights ``w`` of the hybrid trade-off (issue 11, key ``hybrid_whole``).
HYBRID_WHOLE_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
#: Block tree of the trade-off's hybrid strategies: radix 12, one level (the all-range winner at
#: n = 4096; radix 16, radix 8 and two-level blocks were worse at w = 1 in a trial run).
HYBRID_WHOLE_RADIX = 12


def hybrid_whole_tradeoff(datasets: dict[str, np.ndarray], reps: int, seed: int) -> dict:
    """The hybrid strategy optimised for ``G = G_ranges / (n (n + 1) / 2) + w 1 1^T`` (uniform random
    ranges plus ``w`` times the whole-domain query; :class:`sparsedp.optimize.hybrid.GramSum`) for
    every ``w`` of :data:`HYBRID_WHOLE_WEIGHTS`: exact random-range MSE (all ``n (n + 1) / 2`` ranges,
    Woodbury) and exact whole-domain error (``[(M^T M)^{-1}]_{1 1^T}``) at each eps of the gls part,
    against the targets (<= 0.9 x LUE-DPTree's range MSE, <= 2 x the uniform 16-ary tree's whole
    domain, both from the same publishers' exact errors as the gls part).  The point closest to the
    targets (least range MSE with the whole-domain target met) is checked empirically on the data
    sets (``reps`` releases each, exact Laplace noise seeded, 1000 random ranges)."""
    from sparsedp import workloads
    from sparsedp.optimize.calibrate import noise_model
    from sparsedp.optimize.gram import Gram
    from sparsedp.optimize.hybrid import GramSum, HybridGLS, HybridObjective, hybrid_matrix, integer_hybrid
    from sparsedp.optimize.hybrid_family import _fit, default_hybrid_p, hybrid_error
    from sparsedp.optimize.search import Deadline
    from sparsedp.operators import SparseOperator

    x0 = next(iter(datasets.values()))
    n = x0.size
    nq = n * (n + 1) / 2
    model = noise_model("laplace")
    g_ranges, g_total = Gram(workloads.all_ranges(n)), Gram(workloads.total(n))
    refs = {}
    for eps in GLS_EPSILONS:  # the targets' references, exactly as in the gls part
        lue = LUEDPTree(eps).fit(x0.astype(np.int64), rng=seed).release_
        b16 = Boost(eps, k=16).fit(x0.astype(np.int64), rng=seed).release_
        refs[eps] = {"lue_range_mse": GLSQueryObjective(lue.tree).error(lue.noise_variances),
                     "boost16_whole_domain": GLSQueryObjective(b16.tree, whole_domain=1.0).error(b16.noise_variances)}
    k = HYBRID_WHOLE_RADIX
    p = default_hybrid_p(-(-n // k))
    curve, layouts = [], {}
    for w in HYBRID_WHOLE_WEIGHTS:
        t0 = time.perf_counter()
        gram = GramSum([(1.0 / nq, g_ranges), (w, g_total)])
        _, R, theta, _ = _fit(gram, model, k, 1, p, Deadline(None), np.random.default_rng(seed), 150, 1000, 12)
        lay = integer_hybrid(theta, HybridObjective(gram, model, k, (k,), R, p).delta(theta), R, n, k, (k,), model)
        layouts[w] = lay
        norm = float(lay.column_sensitivity().max())
        r1 = hybrid_error(lay, g_ranges, model) / nq  # eps = 1: Laplace variance 2 Delta^2
        w1 = model.sigma2 * norm**2 * float(HybridGLS(lay).prefix_variances()[-1])
        row = {"w": w, "strategy": f"hybrid[{k} blocks + {p} rows on {-(-n // k)}]", "R": np.round(R, 4).tolist(),
               "optimiser_seconds": time.perf_counter() - t0}
        for eps in GLS_EPSILONS:  # errors scale as 1 / eps^2
            rr, wd = r1 / eps**2, w1 / eps**2
            rr_ratio, wd_ratio = rr / refs[eps]["lue_range_mse"], wd / refs[eps]["boost16_whole_domain"]
            row[str(eps)] = {"exact_range_mse": rr, "exact_whole_domain": wd, "range_ratio_lue": rr_ratio,
                             "whole_ratio_boost16": wd_ratio, "both_met": bool(rr_ratio <= 0.9 and wd_ratio <= 2.0)}
        curve.append(row)
        e1 = row["1.0"]
        print(f"  w={w:<5} range MSE {e1['exact_range_mse']:8.2f} ({e1['range_ratio_lue']:.3f} x LUE)  whole "
              f"{e1['exact_whole_domain']:8.2f} ({e1['whole_ratio_boost16']:.2f} x 16-ary)  both met: {e1['both_met']}"
              f"  [{row['optimiser_seconds']:.1f} s]", flush=True)
    ok_whole = [r for r in curve if r["1.0"]["whole_ratio_boost16"] <= 2.0]
    ok_range = [r for r in curve if r["1.0"]["range_ratio_lue"] <= 0.9]
    closest = min(ok_whole, key=lambda r: r["1.0"]["range_ratio_lue"]) if ok_whole else None
    best_range_side = min(ok_range, key=lambda r: r["1.0"]["whole_ratio_boost16"]) if ok_range else None
    check = []
    if closest is not None and reps > 0:  # empirical check of the closest point's exact errors
        lay = layouts[closest["w"]]
        M = SparseOperator(hybrid_matrix(lay), name="hybrid-whole", structure="general")
        gls = HybridGLS(lay)
        for ie, eps in enumerate(GLS_EPSILONS):
            plan = plan_measurement(M, epsilon=eps, noise="laplace")
            rr, wd = empirical_range_whole(
                datasets, plan, lambda Y: np.column_stack([gls.solve(y) for y in Y.T]), reps, [seed, ie, 11])
            ex = closest[str(eps)]
            check.append({"w": closest["w"], "epsilon": eps, "releases": len(rr), "data_sets": len(datasets),
                          "exact_range_mse": ex["exact_range_mse"], "empirical_range_mse": float(np.mean(rr)),
                          "exact_whole_domain": ex["exact_whole_domain"], "empirical_whole_domain": float(np.mean(wd))})
            c = check[-1]
            print(f"  empirical check w={c['w']} eps={eps}: range MSE {c['empirical_range_mse']:.4g} (exact "
                  f"{c['exact_range_mse']:.4g}), whole {c['empirical_whole_domain']:.4g} (exact "
                  f"{c['exact_whole_domain']:.4g}), {c['releases']} releases", flush=True)
    return {"n": n, "radix": k, "p": p, "epsilons": list(GLS_EPSILONS), "references": {str(e): v for e, v in refs.items()},
            "targets": {"range_ratio_lue": 0.9, "whole_ratio_boost16": 2.0}, "curve": curve,
            "both_met_any": any(r[str(e)]["both_met"] for r in curve for e in GLS_EPSILONS),
            "closest_whole_met": closest and {"w": closest["w"], **closest["1.0"]},
            "closest_range_met": best_range_side and {"w": best_range_side["w"], **best_range_side["1.0"]},
            "empirical_check": check}


def pidentity_whole_point(n: int, w: float, p: int, maxiter: int, seed: int, start: str = "tree",
                          datasets: dict[str, np.ndarray] | None = None, reps: int = 0) -> dict:
    """p-Identity (``[I; Theta] D``, :mod:`sparsedp.optimize.pidentity`) optimised for the same
    objective as :func:`hybrid_whole_tradeoff` at one ``w`` (``p`` rows, ``maxiter`` L-BFGS-B
    iterations, one start: the tree start of :mod:`sparsedp.optimize.pidentity_start` or HDMM's
    ``U[0, 1]``): exact random-range MSE and whole-domain error at eps = 1 of the integer strategy,
    both from the backward-stable dense QR score (``O(n^3)``, about 10 s at ``n = 4096``).  With
    ``reps > 0`` the errors are checked empirically on the data sets at every eps of the gls part:
    ``reps`` releases each (exact Laplace noise, seeded; the Woodbury GLS of
    :mod:`sparsedp.woodbury`), 1000 random ranges and the whole domain."""
    from sparsedp import workloads
    from sparsedp.optimize.calibrate import noise_model, unit_variance
    from sparsedp.optimize.gram import Gram
    from sparsedp.optimize.hybrid import GramSum
    from sparsedp.optimize.pidentity import dense_trace
    from sparsedp.optimize.pidentity_family import pidentity_candidates
    from sparsedp.optimize.search import Deadline
    from sparsedp.woodbury import woodbury_solver

    model = noise_model("laplace")
    nq = n * (n + 1) / 2
    g_ranges, g_total = Gram(workloads.all_ranges(n)), Gram(workloads.total(n))
    t0 = time.perf_counter()
    cand = pidentity_candidates(None, GramSum([(1.0 / nq, g_ranges), (w, g_total)]), model, p=p, maxiter=maxiter,
                                deadline=Deadline(None), rng=np.random.default_rng(seed), start=start)[0]
    sec = time.perf_counter() - t0
    M = cand.strategy.matrix.toarray().astype(np.float64)
    uv = unit_variance(cand.strategy, model)
    row = {"w": w, "p": p, "maxiter": maxiter, "start": start, "note": cand.note, "optimiser_seconds": sec,
           "exact_range_mse_eps1": uv * dense_trace(M, g_ranges) / nq, "exact_whole_domain_eps1": uv * dense_trace(M, g_total)}
    print(f"  p-Identity w={w} p={p} maxiter={maxiter} start={start}: range MSE {row['exact_range_mse_eps1']:.2f}, "
          f"whole {row['exact_whole_domain_eps1']:.2f} [{sec:.0f} s; {cand.note}]", flush=True)
    check = []
    for ie, eps in enumerate(GLS_EPSILONS if reps > 0 and datasets else ()):
        plan = plan_measurement(cand.strategy, epsilon=eps, noise="laplace")
        solve = woodbury_solver(cand.strategy, np.ones(M.shape[0]))  # one noise scale for every row
        rr, wd = empirical_range_whole(datasets, plan, solve, reps, [seed, ie, 13])
        check.append({"epsilon": eps, "releases": len(rr), "data_sets": len(datasets),
                      "exact_range_mse": row["exact_range_mse_eps1"] / eps**2, "empirical_range_mse": float(np.mean(rr)),
                      "exact_whole_domain": row["exact_whole_domain_eps1"] / eps**2,
                      "empirical_whole_domain": float(np.mean(wd))})
        c = check[-1]
        print(f"  empirical check eps={eps}: range MSE {c['empirical_range_mse']:.4g} (exact {c['exact_range_mse']:.4g}), "
              f"whole {c['empirical_whole_domain']:.4g} (exact {c['exact_whole_domain']:.4g}), {c['releases']} releases",
              flush=True)
    if check:
        row["empirical_check"] = check
    return row


def union_optimize_point(n: int, w: float, p: int, seed: int) -> dict:
    """The same objective through the public API: ``optimize(weighted_union([(1 / (n (n + 1) / 2),
    all_ranges(n)), (w, total(n))]), family="pidentity", p=p)`` (its defaults: the tree start, 1000
    iterations), with the exact random-range MSE and whole-domain error at eps = 1 of the returned
    strategy (dense QR score, as :func:`pidentity_whole_point`)."""
    from sparsedp import workloads
    from sparsedp.optimize import optimize
    from sparsedp.optimize.gram import Gram
    from sparsedp.optimize.pidentity import dense_trace

    nq = n * (n + 1) / 2
    t0 = time.perf_counter()
    res = optimize(workloads.weighted_union([(1.0 / nq, workloads.all_ranges(n)), (w, workloads.total(n))]),
                   family="pidentity", p=p, rng=seed)
    sec = time.perf_counter() - t0
    M = res.strategy.toarray() / res.sensitivity  # Delta_1 = 1: Laplace variance 2 at eps = 1
    row = {"w": w, "p": p, "name": res.name, "optimize_seconds": sec, "reported_error": res.error.total,
           "exact_range_mse_eps1": 2.0 * dense_trace(M, Gram(workloads.all_ranges(n))) / nq,
           "exact_whole_domain_eps1": 2.0 * dense_trace(M, Gram(workloads.total(n)))}
    print(f"  optimize(weighted_union(ranges, {w} x total), family='pidentity', p={p}): range MSE "
          f"{row['exact_range_mse_eps1']:.2f}, whole {row['exact_whole_domain_eps1']:.2f} [{sec:.0f} s]", flush=True)
    return row


def plot(rows: list[dict], path: Path, dataset: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(EPSILONS), figsize=(5 * len(EPSILONS), 4), sharey=False)
    for ax, eps in zip(axes, EPSILONS):
        for m in METHODS:
            r = next(r for r in rows if r["dataset"] == dataset and r["epsilon"] == eps and r["method"] == m)
            lens = sorted(int(k[3:]) for k in r if k.startswith("len"))
            ax.plot(lens, [r[f"len{v}"] for v in lens], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{dataset}, eps={eps}")
        ax.set_xlabel("range length")
        ax.set_ylabel("mean squared error")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def update_results(out: Path, key: str, update) -> None:
    """Read the results file (or start one), replace its ``key`` by ``update(old value or {})`` and
    write it back: the partial runs (``--gls-only``, ``--pidentity-whole``, ...) each own a key."""
    result = json.loads(out.read_text()) if out.exists() else {"benchmark": "trees"}
    result[key] = update(result.get(key, {}))
    out.write_text(json.dumps(result, indent=1))
    print(f"updated {out} (key {key!r})")


def target_ratios(range_mse: float, whole: float, ref: dict) -> dict:
    """A strategy's exact errors against the issue-11 DPBench targets: random-range MSE <= 0.9 x
    LUE-DPTree's and whole-domain error <= 2 x the uniform 16-ary tree's (``ref``: one eps)."""
    rr, wd = range_mse / ref["lue_range_mse"], whole / ref["boost16_whole_domain"]
    return {"range_ratio_lue": rr, "whole_ratio_boost16": wd, "both_met": bool(rr <= 0.9 and wd <= 2.0)}


def add_point(hw: dict, list_key: str, row: dict, fields: tuple[str, ...]) -> dict:
    """``hw`` (the ``hybrid_whole`` key) with ``row`` in its list ``list_key``, replacing the row with
    the same ``fields``, sorted by them."""
    key = lambda r: tuple(r[f] for f in fields)  # noqa: E731
    hw[list_key] = sorted([r for r in hw.get(list_key, []) if key(r) != key(row)] + [row], key=key)
    return hw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50, help="noisy runs per (data set, eps, method)")
    ap.add_argument("--max-log-n", type=int, default=24, help="largest n = 2^k of the scale run")
    ap.add_argument("--datasets", type=int, default=16, help="how many DPBench data sets (0-16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "results" / "trees.json"))
    ap.add_argument("--measure-log-n", type=int, default=20, help="n = 2^k of the exact-vs-float timing")
    ap.add_argument("--measure-reps", type=int, default=7, help="interleaved runs per (publisher, noise)")
    ap.add_argument("--measure-only", action="store_true",
                    help="only time exact against float noise, and update the 'measure' key of --out")
    ap.add_argument("--gls-reps", type=int, default=100, help="releases per (data set, eps, method) of the gls part")
    ap.add_argument("--gls-only", action="store_true",
                    help="only compare objective='gls' (issue 11), and update the 'gls' key of --out")
    ap.add_argument("--hybrid-whole-only", action="store_true",
                    help="only the hybrid trade-off ranges + w x whole domain (issue 11), update key 'hybrid_whole'")
    ap.add_argument("--hybrid-whole-reps", type=int, default=20,
                    help="releases per (data set, eps) of the hybrid trade-off's empirical check")
    ap.add_argument("--pidentity-whole", type=float, default=None, metavar="W",
                    help="only p-Identity for all ranges + W x whole domain; appended to key 'hybrid_whole'")
    ap.add_argument("--pidentity-p", type=int, default=256, help="rows of --pidentity-whole")
    ap.add_argument("--pidentity-maxiter", type=int, default=1000, help="iterations of --pidentity-whole")
    ap.add_argument("--pidentity-start", choices=("tree", "random"), default="tree",
                    help="start of --pidentity-whole: the fitted 16-ary tree or HDMM's U[0, 1]")
    ap.add_argument("--pidentity-reps", type=int, default=0,
                    help="releases per (data set, eps) of the --pidentity-whole empirical check (0: none)")
    ap.add_argument("--union-optimize", type=float, default=None, metavar="W",
                    help="only optimize(weighted_union(ranges, W x total), family='pidentity'); key 'hybrid_whole'")
    args = ap.parse_args()
    if args.union_optimize is not None:
        with threadpool_limits(1):
            threads = sorted({d.get("num_threads") for d in threadpool_info()})
            row = union_optimize_point(4096, args.union_optimize, args.pidentity_p, args.seed)
        row.update(command=" ".join(sys.argv), blas_threads=threads)

        def with_union_point(hw: dict) -> dict:
            ref = hw.get("references", {}).get("1.0")
            if ref:
                row.update(target_ratios(row["exact_range_mse_eps1"], row["exact_whole_domain_eps1"], ref))
                print(f"  ratios: range {row['range_ratio_lue']:.4f} x LUE, whole {row['whole_ratio_boost16']:.4f} "
                      f"x 16-ary, both met: {row['both_met']}")
            return add_point(hw, "optimize_union", row, ("w", "p"))

        update_results(Path(args.out), "hybrid_whole", with_union_point)
        return
    if args.pidentity_whole is not None:
        data = ({name: load_dpbench(name).astype(np.float64) for name in dpbench_names()[: args.datasets]}
                if args.pidentity_reps > 0 else None)
        with threadpool_limits(1):
            threads = sorted({d.get("num_threads") for d in threadpool_info()})
            row = pidentity_whole_point(4096, args.pidentity_whole, args.pidentity_p, args.pidentity_maxiter, args.seed,
                                        args.pidentity_start, data, args.pidentity_reps)
        row.update(command=" ".join(sys.argv), blas_threads=threads)

        def with_pidentity_point(hw: dict) -> dict:
            refs = hw.get("references", {})
            if refs.get("1.0"):
                row.update(target_ratios(row["exact_range_mse_eps1"], row["exact_whole_domain_eps1"], refs["1.0"]))
                # the same strategy at every eps of the references (errors scale as 1 / eps^2)
                row["ratios_by_eps"] = {
                    e: target_ratios(row["exact_range_mse_eps1"] / float(e) ** 2,
                                     row["exact_whole_domain_eps1"] / float(e) ** 2, r) for e, r in refs.items()}
                print(f"  ratios: {json.dumps(row['ratios_by_eps'])}")
            for r in hw.get("pidentity", []):
                r.setdefault("start", "random")  # the rows measured before the tree start existed
            return add_point(hw, "pidentity", row, ("w", "p", "maxiter", "start"))

        update_results(Path(args.out), "hybrid_whole", with_pidentity_point)
        return
    if args.hybrid_whole_only:
        with threadpool_limits(1):
            threads = sorted({d.get("num_threads") for d in threadpool_info()})
            print(f"BLAS threads: {threads}; hybrid strategy for all ranges + w x whole domain (n = 4096, Laplace)")
            data = {name: load_dpbench(name).astype(np.float64) for name in dpbench_names()[: args.datasets]}
            t0 = time.perf_counter()
            res = hybrid_whole_tradeoff(data, args.hybrid_whole_reps, args.seed)
            res["seconds"] = time.perf_counter() - t0
        update_results(Path(args.out), "hybrid_whole", lambda old: {
            **{k: old[k] for k in ("pidentity", "optimize_union") if k in old},  # other runs' points stay
            "command": " ".join(sys.argv), "blas_threads": threads, **res,
            "note": "exact errors (eps = 1 computed, eps = 0.1 = x100); empirical check at the closest point; "
                    "shared 2-core machine"})
        return
    if args.gls_only:
        with threadpool_limits(1):
            threads = sorted({d.get("num_threads") for d in threadpool_info()})
            print(f"BLAS threads: {threads}; objective='gls' against LUE-DPTree and a uniform 16-ary tree")
            data = {name: load_dpbench(name).astype(np.float64) for name in dpbench_names()[: args.datasets]}
            t0 = time.perf_counter()
            res = gls_compare(data, args.gls_reps, args.seed)
            res["seconds"] = time.perf_counter() - t0
        res.update(gls_summary(res))
        update_results(Path(args.out), "gls", lambda _: {
            "command": " ".join(sys.argv), "blas_threads": threads, **res,
            "note": "exact errors from each release's actual noise variances (data-independent); "
                    "empirical: mean squared error of --gls-reps releases; shared 2-core machine"})
        return
    if args.measure_only:
        with threadpool_limits(1):
            threads = sorted({d.get("num_threads") for d in threadpool_info()})
            print(f"BLAS threads: {threads}; exact (secure=True) against float (secure=False) noise")
            rows = measure_throughput(args.measure_log_n, args.measure_reps, args.seed)
        update_results(Path(args.out), "measure", lambda _: {
            "command": " ".join(sys.argv), "blas_threads": threads, "rows": rows,
            "note": "whole fit() seconds; shared 2-core machine under contention"})
        return
    with threadpool_limits(1):
        threads = sorted({d.get("num_threads") for d in threadpool_info()})
        print(f"BLAS threads: {threads}")
        data = {name: load_dpbench(name).astype(np.float64) for name in dpbench_names()[: args.datasets]}
        data["synthetic-65536"] = synthetic_histogram(1 << 16, seed=args.seed).astype(np.float64)
        print(f"accuracy: {len(data)} data sets x {len(EPSILONS)} eps x {len(METHODS)} methods x {args.reps} runs")
        t0 = time.perf_counter()
        acc = accuracy(data, args.reps, args.seed)
        t_acc = time.perf_counter() - t0
        print("analytic expected error (eq. 3.2/3.6, eps = 1)")
        ana = analytic([4096, 1 << 16])
        for r in ana:
            print(f"  n={r['n']:<6} {r['tree']:<7} nodes={r['nodes']:<7} levels={r['levels']:<3} "
                  f"uniform={r['uniform']:.4g} allocated={r['allocated']:.4g}")
        print("scale")
        sc = scale(list(range(16, args.max_log_n + 1, 2)), args.seed)
        print("exact against float noise")
        meas = measure_throughput(args.measure_log_n, args.measure_reps, args.seed)

    # summary tables
    print(f"\nMSE of 1000 random ranges, mean of {args.reps} runs; ratio = LUE-DPTree / Boost (baseline)")
    header = f"{'dataset':<48}{'eps':>6}" + "".join(f"{m:>12}" for m in METHODS) + f"{'LUE/Boost':>11}"
    print(header)
    print("-" * len(header))
    ratios = []
    for dname in data:
        for eps in EPSILONS:
            rs = {r["method"]: r["random"] for r in acc if r["dataset"] == dname and r["epsilon"] == eps}
            ratio = rs["lue-dptree"] / rs["boost"]
            ratios.append({"dataset": dname, "epsilon": eps, "lue_over_boost": ratio,
                           "best": min(rs, key=rs.get)})
            print(f"{dname:<48}{eps:>6}" + "".join(f"{rs[m]:>12.4g}" for m in METHODS) + f"{ratio:>11.3f}")
    print(f"\n{'n':>10}{'nodes':>10}{'SC tree':>9}{'BLUE':>8}{'LUE total':>11}{'Boost':>8}{'LUE/Boost':>11}{'direct':>9}")
    for r in sc:
        direct = f"{r['engine_direct_s']:>9.2f}" if "engine_direct_s" in r else f"{'-':>9}"
        print(f"{r['n']:>10}{r['nodes']:>10}{r['sc_tree_s']:>9.2f}{r['blue_s']:>8.2f}{r['lue_pipeline_s']:>11.2f}"
              f"{r['boost_pipeline_s']:>8.2f}{r['lue_pipeline_s'] / r['boost_pipeline_s']:>11.2f}{direct}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(acc, out.with_suffix(".png"), "synthetic-65536")
    plot(acc, out.with_name(out.stem + "_hepth.png"), next((d for d in data if d.startswith("HEPTH")), next(iter(data))))
    result = {"benchmark": "trees", "command": " ".join(sys.argv), "reps": args.reps, "blas_threads": threads,
              "python": platform.python_version(), "machine": platform.machine(), "accuracy_seconds": t_acc,
              "accuracy": acc, "ratios": ratios, "analytic": ana, "scale": sc,
              "measure": {"blas_threads": threads, "rows": meas},
              "note": "timings on a shared 2-core machine under contention"}
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
