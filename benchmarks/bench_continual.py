"""Continual release (seed 000 and beyond): error, weight computation and counter throughput.

For N in {2^10 - 1, 2^16 - 1, 2^20 - 1, 10^6} and eps = 1 (zCDP methods at rho = eps^2 / 2 = 1/2):

* analytic average per-step variance of every method (naive, binary = unweighted Fenwick, Honaker
  streaming, FDA-weighted Fenwick, k-ary trees with optimal level weights, the negative-digit k-ary
  tree, the 12- and 16-ary trees with every node measured and the full GLS estimate (best pure-DP
  here), and for zCDP the L2-optimal Fenwick, the square-root factorisation and BLT), and the
  empirical mean squared error of the online counters at the smaller N (``--runs`` streams at
  2^10 - 1, a few at 2^16 - 1);
* GLS tree: time of its level-weight optimisation, of the counter's construction (all noise drawn,
  offsets computed) and of its exact per-step variances;
* time to compute the weights: FDA against SLSQP (the seed's SQP, small N only) and against the
  PyPI package ``dpcrpy`` (FDA, N = 2^m - 1 only; optional: skipped and said so when absent), with
  the largest weight difference;
* counter throughput (updates/s) over the first ``--steps`` steps, against dpcrpy's FDA counter;
* a plot of per-step variance against t (benchmarks/results/continual.png);
* exact noise against float noise (issue 13): for every counter, the time to build it and to run
  all ``N`` steps with ``secure=True`` (the default: exact discrete noise through the measurement
  plan) and with ``secure=False``, and their ratio (target: exact within 1.25x of float), at
  ``N = 2^20`` (square root and BLT, ``O(t)`` per step with exact noise, at ``N = 2^14``).  Best of
  ``--repeat`` interleaved runs.

    python benchmarks/bench_continual.py [--runs 200] [--steps 200000] [--out benchmarks/results/continual.json]
    python benchmarks/bench_continual.py --exact-only [--exact-n 1048576] [--out benchmarks/results/continual_exact.json]
    python benchmarks/bench_continual.py --optimized [--opt-time-limit 600] [--runs 200]

``--optimized`` (issue 11) runs only the counters from optimised strategies
(:class:`~sparsedp.continual.OptimizedCounter`: ``sparsedp.optimize`` of the prefix workload --
p-Identity at ``N = 2^10 - 1``, a per-node weighted tree at ``2^20 - 1``) side by side with the
12-ary GLS tree (analytic average per-step variance, exact; the optimiser's time; the counter's
construction with exact noise; the empirical MSE at ``2^10 - 1``) and merges them into the JSON
under ``"optimized"`` (the other entries are kept).

BLAS is pinned to one thread (threadpoolctl).  Timings on a shared machine are inflated by contention.
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

from sparsedp.continual import (  # noqa: E402
    BinaryMechanism,
    BLTCounter,
    ContinualCounter,
    FenwickWeights,
    GLSTreeCounter,
    HonakerCounter,
    KaryCounter,
    NaiveCounter,
    NegDigitCounter,
    OptimizedCounter,
    SqrtCounter,
    error_table,
    default_radices,
    fit_blt,
    gls_tree_weights,
    kary_weights,
    gls_tree_error,
    negdigit_weights,
    optimal_weights,
    optimized_counter_error,
    optimized_prefix_strategy,
)

try:  # optional comparison
    from dpcrpy.bitMethods.fda import FDA as DpcrFDA
    from dpcrpy.framework.noiMech import LapNoiMech
except ImportError:  # pragma: no cover
    DpcrFDA = None

HORIZONS = (2**10 - 1, 2**16 - 1, 2**20 - 1, 10**6)
EPS = 1.0
RHO = EPS**2 / 2


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def counters(N: int, blt, lams) -> dict:
    kary_lam, neg_lam, gls_lam = lams
    return {
        "naive": lambda rng: NaiveCounter(N, EPS, rng=rng),
        "binary (Chan-Shi-Song) = Fenwick": lambda rng: BinaryMechanism(N, EPS, rng=rng),
        "Honaker streaming": lambda rng: HonakerCounter(N, EPS, rng=rng),
        "Fenwick + FDA weights": lambda rng: ContinualCounter(N, epsilon=EPS, rng=rng),
        "16-ary tree, opt. level weights": lambda rng: KaryCounter(N, EPS, k=16, weights=kary_lam, rng=rng),
        "19-ary neg. digits, opt. level weights": lambda rng: NegDigitCounter(N, EPS, k=19, weights=neg_lam, rng=rng),
        "12-ary GLS tree, opt. level weights": lambda rng: GLSTreeCounter(N, EPS, weights=gls_lam, rng=rng),
        "Fenwick + FDA weights (L2)": lambda rng: ContinualCounter(N, rho=RHO, rng=rng),
        # exact noise makes the Toeplitz counters O(t) per step (see exact_vs_float): float noise here
        "BLT (5 buffers)": lambda rng: BLTCounter(N, RHO, blt=blt, rng=rng, secure=False),
    }


def empirical(N: int, runs: int, blt, kary_lam, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 3, N).astype(float)
    truth = np.cumsum(x)
    out = {}
    for name, make in counters(N, blt, kary_lam).items():
        sq = 0.0
        for _ in range(runs):
            sq += float(np.mean((make(rng).run(x) - truth) ** 2))
        out[name] = sq / runs
    if N <= 2**16:
        sq = 0.0
        for _ in range(max(1, runs // 10)):
            sq += float(np.mean((SqrtCounter(N, RHO, rng=rng, secure=False).run(x) - truth) ** 2))
        out["square-root factorisation"] = sq / max(1, runs // 10)
    return out


OPT_HORIZONS = (2**10 - 1, 2**20 - 1)
#: issue 11's targets for the average per-step variance (pure DP, eps = 1).
OPT_TARGETS = {2**10 - 1: ("<=", 92.0), 2**20 - 1: ("<", 700.0)}


def optimized_rows(runs: int, time_limit: float | None, horizons=OPT_HORIZONS) -> dict:
    """Counters from optimised strategies against the 12-ary GLS tree (issue 11)."""
    out = {}
    for N in horizons:
        t0 = time.perf_counter()
        res = optimized_prefix_strategy(N, time_limit=time_limit)
        opt_seconds = time.perf_counter() - t0
        err = optimized_counter_error(N, EPS, res)  # float Laplace calibration, 2 b^2
        gls = gls_tree_error(N, EPS, radices=default_radices(N, 12), per_step=False)
        t0 = time.perf_counter()
        # exact noise (the default) has an exact release for trees and p-Identity; others run with float noise
        exact_release = res.family in ("tree", "pidentity")
        counter = OptimizedCounter(N, EPS, res, rng=0, secure=exact_release)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        exact_mean = float(counter.step_variances().mean())
        var_seconds = time.perf_counter() - t0
        emp = None
        if N <= 2**10 and runs:
            rng = np.random.default_rng(0)
            x = rng.integers(0, 3, N).astype(float)
            truth = np.cumsum(x)
            emp = float(np.mean([np.mean((OptimizedCounter(N, EPS, res, rng=rng, secure=exact_release).run(x) - truth) ** 2)
                                 for _ in range(runs)]))
        op, target = OPT_TARGETS.get(N, ("", float("nan")))
        met = err.mean <= target if op == "<=" else err.mean < target
        out[str(N)] = {
            "strategy": res.name, "family": res.family, "optimiser_seconds": opt_seconds,
            "exact_noise_release": exact_release,
            "optimiser_time_limit": time_limit, "optimiser_history": [t.__dict__ for t in res.history],
            "mean_per_step_variance": err.mean, "max_per_step_variance": float(err.per_step.max()),
            "mean_per_step_variance_exact_noise": exact_mean, "empirical_mse": emp, "empirical_runs": runs if emp else 0,
            "gls12_mean_per_step_variance": gls.mean, "ratio_to_gls12": err.mean / gls.mean,
            "target": f"{op} {target}", "target_met": bool(met),
            "construction_seconds": build, "step_variances_seconds": var_seconds,
        }
        print(f"N = {N}: optimised counter [{res.name}] {err.mean:.2f} per step (exact noise {exact_mean:.2f}"
              + (f", empirical {emp:.2f} over {runs} streams" if emp else "")
              + f") vs 12-ary GLS tree {gls.mean:.2f} (x{err.mean / gls.mean:.3f}); target {op} {target:g}: "
              f"{'met' if met else 'MISSED'}; optimiser {opt_seconds:.1f} s, construction {build:.2f} s, "
              f"per-step variances {var_seconds:.2f} s", flush=True)
    return out


def weight_timings(N: int) -> dict:
    res = {"fda_seconds": best_of(lambda: FenwickWeights.build(N).array())}
    if DpcrFDA is not None and (N + 1) & N == 0:
        m = N.bit_length()
        ref = DpcrFDA(kOrder=m, isInit=False)
        t0 = time.perf_counter()
        theirs = np.array([ref.getCof(t) for t in range(1, N + 1)])
        res["dpcrpy_seconds"] = time.perf_counter() - t0
        res["dpcrpy_max_abs_diff"] = float(np.abs(theirs - optimal_weights(N)).max())
        res["dpcrpy_over_fda"] = res["dpcrpy_seconds"] / res["fda_seconds"]
    return res


def sqp_timings() -> list[dict]:
    rows = []
    for N in (31, 63, 127, 255):
        t0 = time.perf_counter()
        sqp = optimal_weights(N, "sqp")
        sec = time.perf_counter() - t0
        fda_sec = best_of(lambda: optimal_weights(N, "fda"))
        rows.append({"N": N, "sqp_seconds": sec, "fda_seconds": fda_sec, "sqp_over_fda": sec / fda_sec,
                     "max_abs_diff": float(np.abs(sqp - optimal_weights(N)).max())})
    return rows


def throughput(N: int, steps: int, blt, kary_lam) -> dict[str, float]:
    steps = min(steps, N)
    out = {}
    for name, make in counters(N, blt, kary_lam).items():
        c = make(0)
        t0 = time.perf_counter()
        for _ in range(steps):
            c.update(1.0)
        out[name] = steps / (time.perf_counter() - t0)
    k = min(steps, 20000)
    c = SqrtCounter(N, RHO, rng=0, secure=False)
    t0 = time.perf_counter()
    for _ in range(k):
        c.update(1.0)
    out[f"square-root factorisation (first {k} steps, O(t) each)"] = k / (time.perf_counter() - t0)
    if DpcrFDA is not None and (N + 1) & N == 0:
        mech = DpcrFDA(kOrder=N.bit_length(), noiMech=LapNoiMech(epsilon=EPS))
        t0 = time.perf_counter()
        for _ in range(steps):
            mech.dpRelease(1.0)
        out["dpcrpy FDA"] = steps / (time.perf_counter() - t0)
    return out


def exact_vs_float(N: int, repeat: int = 2, small: int = 2**14) -> dict[str, dict]:
    """Build + all-steps time with exact (``secure=True``) and float (``secure=False``) noise."""
    blt_small = fit_blt(small, 5)
    gls_lam = gls_tree_weights(N, default_radices(N, 12))
    makers = {
        "naive": (N, lambda s: NaiveCounter(N, EPS, secure=s)),
        "binary (Chan-Shi-Song) = Fenwick": (N, lambda s: BinaryMechanism(N, EPS, secure=s)),
        "Honaker streaming": (N, lambda s: HonakerCounter(N, EPS, secure=s)),
        "Fenwick + FDA weights": (N, lambda s: ContinualCounter(N, epsilon=EPS, secure=s)),
        "Fenwick + FDA weights (L2)": (N, lambda s: ContinualCounter(N, rho=RHO, secure=s)),
        "16-ary tree, opt. level weights": (N, lambda s: KaryCounter(N, EPS, k=16, secure=s)),
        "19-ary neg. digits, opt. level weights": (N, lambda s: NegDigitCounter(N, EPS, k=19, secure=s)),
        "12-ary GLS tree, opt. level weights": (N, lambda s: GLSTreeCounter(N, EPS, weights=gls_lam, secure=s)),
        "square-root factorisation": (small, lambda s: SqrtCounter(small, RHO, secure=s)),
        "BLT (5 buffers)": (small, lambda s: BLTCounter(small, RHO, blt=blt_small, secure=s)),
    }
    out = {}
    for name, (n, make) in makers.items():
        best: dict[bool, tuple[float, float]] = {}
        for _ in range(repeat):
            for secure in (False, True):
                t0 = time.perf_counter()
                c = make(secure)
                t1 = time.perf_counter()
                update = c.update
                for _ in range(n):
                    update(1)
                t2 = time.perf_counter()
                if secure not in best or t2 - t0 < sum(best[secure]):
                    best[secure] = (t1 - t0, t2 - t1)
        (fb, fs), (eb, es) = best[False], best[True]
        out[name] = {"N": n, "float_build_s": fb, "float_steps_s": fs, "exact_build_s": eb, "exact_steps_s": es,
                     "float_updates_per_s": n / (fb + fs), "exact_updates_per_s": n / (eb + es),
                     "exact_over_float": (eb + es) / (fb + fs)}
        print(f"  {name:<40} N = {n:>8}: float {fb + fs:6.2f} s ({n / (fb + fs):>9,.0f}/s), exact {eb + es:6.2f} s "
              f"({n / (eb + es):>9,.0f}/s), exact / float {(eb + es) / (fb + fs):.2f}", flush=True)
    return out


def plot(N: int, rows, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return False
    fig, ax = plt.subplots(figsize=(9, 5))
    t = np.arange(1, N + 1)
    shown = [r for r in rows if r.method != "naive"]
    colours = plt.cm.tab20(np.linspace(0, 1, len(shown)))
    for r, colour in zip(shown, colours):
        ax.plot(t, r.per_step, lw=0.6, color=colour, label=f"{r.method} [{r.privacy}]")
    ax.set_yscale("log")
    ax.set_xlabel("step t")
    ax.set_ylabel("variance of the released running sum")
    ax.set_title(f"Continual release, N = {N}, eps = {EPS:g} / rho = {RHO:g}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="empirical streams at N = 2^10 - 1 (a 50th at 2^16 - 1)")
    ap.add_argument("--steps", type=int, default=200000, help="steps timed per counter for throughput")
    ap.add_argument("--out", default=None, help="JSON output (default benchmarks/results/continual.json, "
                    "continual_exact.json with --exact-only)")
    ap.add_argument("--exact-only", action="store_true", help="only time exact against float noise")
    ap.add_argument("--exact-n", type=int, default=2**20, help="horizon of the exact-vs-float timings")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved repeats of the exact-vs-float timings")
    ap.add_argument("--optimized", action="store_true",
                    help="only the counters from optimised strategies (issue 11), merged into the JSON")
    ap.add_argument("--opt-time-limit", type=float, default=600.0,
                    help="time limit of the optimiser per horizon for --optimized (s)")
    ap.add_argument("--opt-horizons", type=int, nargs="+", default=list(OPT_HORIZONS), metavar="N",
                    help="horizons of --optimized (the rows of other horizons in the JSON are kept)")
    args = ap.parse_args()
    if args.optimized:
        out = Path(args.out) if args.out else HERE / "results" / "continual.json"
        with threadpool_limits(1):
            blas = [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]
            print(f"BLAS threads: {blas}   (timings on a shared machine are inflated by contention)")
            rows = optimized_rows(args.runs, args.opt_time_limit, tuple(args.opt_horizons))
        result = json.loads(out.read_text()) if out.exists() else {"epsilon": EPS, "rho": RHO}
        kept = {k: v for k, v in result.get("optimized", {}).get("horizons", {}).items() if k not in rows}
        result["optimized"] = {"machine": platform.platform(), "blas": blas, "epsilon": EPS,
                               "horizons": dict(sorted({**kept, **rows}.items(), key=lambda kv: int(kv[0])))}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"merged into {out}")
        return
    default = "continual_exact.json" if args.exact_only else "continual.json"
    out = Path(args.out) if args.out else HERE / "results" / default
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.exact_only:
        with threadpool_limits(1):
            print(f"exact (secure=True) vs float (secure=False) noise, build + all steps, best of {args.repeat}:")
            result = {"machine": platform.platform(), "epsilon": EPS, "rho": RHO,
                      "exact_vs_float": exact_vs_float(args.exact_n, args.repeat)}
        out.write_text(json.dumps(result, indent=1))
        print(f"wrote {out}")
        return
    with threadpool_limits(1):
        blas = [(i.get("internal_api"), i.get("num_threads")) for i in threadpool_info()]
        print(f"BLAS threads: {blas}   (timings on a shared machine are inflated by contention)")
        print(f"dpcrpy: {'installed' if DpcrFDA is not None else 'NOT installed: comparison skipped'}")
        result = {"epsilon": EPS, "rho": RHO, "machine": platform.platform(), "blas": blas,
                  "dpcrpy": DpcrFDA is not None, "horizons": {}}
        for N in HORIZONS:
            t0 = time.perf_counter()
            blt = fit_blt(N, 5)
            blt_fit = time.perf_counter() - t0
            t0 = time.perf_counter()
            gls_lam = gls_tree_weights(N, default_radices(N, 12))
            gls_seconds = time.perf_counter() - t0
            kary_lam = (kary_weights(N, 16), negdigit_weights(N, 19), gls_lam)
            rows = error_table(N, EPS, RHO, gls=(12, 16))
            emp = {}
            if N <= 2**10:
                emp = empirical(N, args.runs, blt, kary_lam)
            elif N <= 2**16:
                emp = empirical(N, max(2, args.runs // 50), blt, kary_lam)
            if N == 2**10 - 1:
                result["plot"] = str(out.with_suffix(".png")) if plot(N, rows, out.with_suffix(".png")) else None
            t0 = time.perf_counter()
            gls_counter = GLSTreeCounter(N, EPS, weights=gls_lam, rng=0)
            gls_build = time.perf_counter() - t0  # draws all node noise, computes the offsets (O(N))
            t0 = time.perf_counter()
            gls_counter.step_variances()
            gls_var_seconds = time.perf_counter() - t0
            w = weight_timings(N)
            thr = throughput(N, args.steps, blt, kary_lam)
            print(f"\nN = {N}: average per-step variance (analytic; empirical MSE where run)")
            print(f"{'method':<40} {'privacy':<9} {'analytic':>11} {'empirical':>11} {'vs Honaker':>10}")
            honaker = next(r.mean for r in rows if r.method == "Honaker streaming")
            for r in rows:
                e = emp.get(r.method)
                es = f"{e:11.2f}" if e is not None else f"{'-':>11}"
                ratio = f"{r.mean / honaker:10.3f}" if r.privacy.startswith("eps") else f"{'':>10}"
                print(f"{r.method:<40} {r.privacy:<9} {r.mean:11.2f} {es} {ratio}")
            print(f"weights: FDA {w['fda_seconds'] * 1e3:.2f} ms", end="")
            if "dpcrpy_seconds" in w:
                print(f"; dpcrpy {w['dpcrpy_seconds']:.3f} s (x{w['dpcrpy_over_fda']:.0f} slower), "
                      f"max |diff| {w['dpcrpy_max_abs_diff']:.1e}", end="")
            print(f"; BLT fit {blt_fit:.2f} s; GLS tree: level weights {gls_seconds:.2f} s, "
                  f"counter construction {gls_build:.2f} s, exact per-step variances {gls_var_seconds:.2f} s")
            print("throughput (updates/s): " + ", ".join(f"{k}: {v:,.0f}" for k, v in thr.items()))
            result["horizons"][str(N)] = {
                "analytic_mean": {f"{r.method} [{r.privacy}]": r.mean for r in rows},
                "analytic_max": {f"{r.method} [{r.privacy}]": r.max for r in rows},
                "empirical_mse": emp,
                "weights": w,
                "blt": {"fit_seconds": blt_fit, "w": blt.w.tolist(), "theta": blt.theta.tolist()},
                "kary16_level_weights": kary_lam[0].tolist(), "negdigit19_level_weights": kary_lam[1].tolist(),
                "gls12_level_weights": gls_lam.tolist(), "gls12_weights_seconds": gls_seconds,
                "gls12_radices": list(default_radices(N, 12)),
                "gls12_construction_seconds": gls_build, "gls12_step_variances_seconds": gls_var_seconds,
                "throughput_updates_per_s": thr,
                "throughput_steps": min(args.steps, N),
            }
        print("\nexact (secure=True) vs float (secure=False) noise at N = 2^20, build + all steps:")
        result["exact_vs_float"] = exact_vs_float(2**20, args.repeat)
        sqp = sqp_timings()
        print("\nSQP (SLSQP, the seed's reference) vs FDA:")
        for r in sqp:
            print(f"  N = {r['N']:4d}: SQP {r['sqp_seconds']:.2f} s, FDA {r['fda_seconds'] * 1e6:.0f} us "
                  f"(x{r['sqp_over_fda']:,.0f}), max |diff| {r['max_abs_diff']:.1e}")
        result["sqp_vs_fda"] = sqp
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
