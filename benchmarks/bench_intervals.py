"""Coverage and width of the confidence intervals, per release kind and interval method.

For every release kind that gives intervals (matrix mechanism: identity, hierarchical tree,
optimised strategy, marginals; tree publishers; continual counters; the restaurant release; flows),
2,000 independent releases of fixed data with exact noise (the default), drawn in batches by the
plan's own measurement and mapped by the release's own linear steps (the test helpers
``tests/_mechanism_draws.py`` / ``_counter_draws.py``; the same construction as
``tests/test_intervals_coverage.py``).  Per method: the coverage of the 95% intervals over all
(release, answer) pairs, the median half-width in standard deviations, and the median ratio of the
half-width to each answer's *empirical* 95% quantile of ``|error|`` over the 2,000 releases
(standard error about 2-3% per answer); for answers that are one noise value, the median ratio to
the *exact* quantile of that value's law.  ``default`` is what ``confidence_intervals`` gives today;
rows marked ``(scales)`` / ``(shape)`` give the report the measurement's noise scales or the
coefficients its caller knows (the mechanism's ``Measurement.scales``; a counter's offset matrix; the
restaurant's projection).  A last section checks the variance-gamma approximation on synthetic sums
of float Laplace terms (400,000 draws each) against the normal quantile.

    python benchmarks/bench_intervals.py [--releases 2000] [--out benchmarks/results/intervals.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))

import sparsedp  # noqa: E402
from sparsedp import strategies as st  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp.accuracy import ErrorReport, error_shape  # noqa: E402
from sparsedp._tails import vg_multiplier  # noqa: E402

LEVEL = 0.95
METHODS = ("auto", "normal", "exact-tail", "chebyshev")


def _exact_single(rep: ErrorReport) -> np.ndarray:
    """Exact quantile of answers that are one noise value (nan elsewhere), from the full shape."""
    sh = rep.error_shape()
    out = np.full(np.asarray(rep.variances).size, np.nan)
    if sh is None:
        return out
    one = np.asarray(sh.lead) >= 1 - 1e-12
    out[one] = rep.half_widths(LEVEL, "accurate")[one]
    return out


def _measure(label: str, rep: ErrorReport, errs: np.ndarray, exact: np.ndarray | None = None) -> dict:
    sd = np.sqrt(np.asarray(rep.variances, dtype=np.float64))
    emp = np.quantile(np.abs(errs), LEVEL, axis=0)
    row: dict = {"kind": label, "answers": int(errs.shape[1]), "releases": int(errs.shape[0]), "methods": {}}
    for m in METHODS:
        t = time.perf_counter()
        h = rep.half_widths(LEVEL, m)
        sec = time.perf_counter() - t
        inside = np.abs(errs) <= h
        ok = emp > 0
        d = {"resolves_to": rep.interval_method(m), "coverage": float(inside.mean()),
             "coverage_worst_answer": float(inside.mean(axis=0).min()),
             "median_halfwidth_sd": float(np.median(h[sd > 0] / sd[sd > 0])),
             "median_ratio_empirical_quantile": float(np.median(h[ok] / emp[ok])), "seconds": sec}
        if exact is not None and np.any(np.isfinite(exact)):
            f = np.isfinite(exact) & (exact > 0)
            d["single_answers"] = int(f.sum())
            d["median_ratio_exact_quantile"] = float(np.median(h[f] / exact[f])) if f.any() else None
        row["methods"][m] = d
    return row


def _print(row: dict) -> None:
    print(f"{row['kind']}  ({row['answers']} answers x {row['releases']} releases)")
    for m, d in row["methods"].items():
        ex = d.get("median_ratio_exact_quantile")
        exs = "" if ex is None else f"  h/exact {ex:.3f} ({d['single_answers']} single)"
        print(f"    {m:10s} -> {d['resolves_to']:10s} coverage {d['coverage']:.4f} (worst answer "
              f"{d['coverage_worst_answer']:.3f})  h/sd {d['median_halfwidth_sd']:.3f}  "
              f"h/empirical q {d['median_ratio_empirical_quantile']:.3f}{exs}")


# -- release kinds -------------------------------------------------------------------------------------


def mechanisms(R: int) -> list[dict]:
    from _mechanism_draws import mechanism_answers

    dims = (4, 5, 6)
    kinds = {
        "mm identity (eps 0.1)": (wl.identity(64), lambda W: st.identity(64), 0.1),
        "mm identity prefix (eps 1)": (wl.prefix(64), lambda W: st.identity(64), 1.0),
        "mm tree prefix(64)": (wl.prefix(64), lambda W: st.hierarchical(64, 2), 1.0),
        "mm tree16 bins(256)": (wl.identity(256), lambda W: st.hierarchical(256, 16), 1.0),
        "mm optimised prefix(64)": (wl.prefix(64), lambda W: sparsedp.optimize(W), 1.0),
        "mm marginals identity (eps 0.2)": (wl.marginals(dims, k=2), lambda W: st.identity(int(np.prod(dims))), 0.2),
    }
    rows = []
    for label, (W, make_M, eps) in kinds.items():
        x = np.random.default_rng(0).poisson(20, W.shape[1])
        mech = sparsedp.MatrixMechanism(W, make_M(W), epsilon=eps)
        errs = mechanism_answers(mech, x, R, seed=11) - W.matvec(x)
        rel = mech.run(x, rng=3)
        full = rel.error_report(scales=rel.measurement.scales)
        exact = _exact_single(full)
        rows.append(_measure(label + " default", rel.error_report(), errs, exact))
        rows.append(_measure(label + " (scales)", full, errs, exact))
    return rows


def publishers(R: int) -> list[dict]:
    from sparsedp import trees

    pairs = np.array([[a, b] for a in range(0, 40, 3) for b in range(a, 40, 4)])
    kinds = {
        "trees LUEDPTree": lambda: trees.LUEDPTree(1.0),
        "trees LUEDPTree inconsistent": lambda: trees.LUEDPTree(1.0, consistency=False),
        "trees Boost": lambda: trees.Boost(1.0),
        "trees Privelet": lambda: trees.Privelet(1.0),
        "trees Dwork (eps 0.2)": lambda: trees.Dwork(0.2),
        "trees Dwork (eps 1)": lambda: trees.Dwork(1.0),
    }
    x = np.random.default_rng(0).poisson(5, 40)
    truth = np.array([x[a : b + 1].sum() for a, b in pairs])
    rows = []
    for label, make in kinds.items():
        prepared = make()
        plan = prepared._prepare(x)
        errs = np.array([prepared._publish(x, plan, 1000 + r).ranges(pairs) - truth for r in range(R)])
        rep = make().fit(x, rng=1000)._release().error_report(pairs)
        rows.append(_measure(label + " default", rep, errs, _exact_single(rep)))
    return rows


def counters(R: int) -> list[dict]:
    from _counter_draws import counter_offset_shape, counter_releases
    from sparsedp import continual as c

    kinds = {
        "continual ContinualCounter": lambda r: c.ContinualCounter(256, epsilon=1.0, rng=r),
        "continual GLSTreeCounter": lambda r: c.GLSTreeCounter(256, 1.0, rng=r),
        "continual BinaryMechanism": lambda r: c.BinaryMechanism(256, 1.0, rng=r),
        "continual HonakerCounter": lambda r: c.HonakerCounter(256, 1.0, rng=r),
        "continual ContinualCounter gaussian": lambda r: c.ContinualCounter(256, rho=0.5, noise="gaussian", rng=r),
    }
    x = np.random.default_rng(0).poisson(3, 256)
    rows = []
    for label, make in kinds.items():
        errs = counter_releases(make, x, R, 7) - np.cumsum(x)
        ctr = make(7)
        ctr.run(x)
        rep = ctr.error_report()
        shaped = dataclasses.replace(rep, shape=counter_offset_shape(make, rep.variances))
        exact = _exact_single(shaped)
        rows.append(_measure(label + " default", rep, errs, exact))
        rows.append(_measure(label + " (shape)", shaped, errs, exact))
    return rows


def consistency(R: int) -> list[dict]:
    from _restaurant_draws import restaurant_affine, restaurant_errors

    from sparsedp.audit import plan_release
    from sparsedp.consistency.restaurant import restaurant, restaurant_release
    from sparsedp.flows import random_trips, release_flows, road_grid
    from sparsedp.flows.release import _prepare, _project_after_draw

    rows = []
    T = 16
    sales = restaurant(T, 5)
    plan, items, truth, P, c0 = restaurant_affine(sales, T, True)
    errs = restaurant_errors(plan, items, truth, P, c0, R)
    rep = restaurant_release(sales=sales, epsilon=1.0, seed=0).error_report()
    sh = error_shape(P, "laplace", secure=True, variances=plan.variances(), scales=plan.scales,
                     answer_variances=rep.variances)
    rows.append(_measure("restaurant (16 days) default", rep, errs))
    rows.append(_measure("restaurant (16 days) (shape)", dataclasses.replace(rep, shape=sh), errs))
    road = road_grid(5, 5)
    trips = random_trips(road, 300, seed=1, max_edges=8)
    for fixed in (False, True):
        prep = _prepare(road, trips, 1.0, "auto", fixed, 1e-8, None, True)
        project = lambda y: _project_after_draw(y, prep.system, prep.how, prep.reason, prep.tol).x  # noqa: E731
        c0 = project(np.zeros(prep.truth.size))
        P = np.column_stack([project(e) - c0 for e in np.eye(prep.truth.size)])
        errs = plan_release(prep.plan)(prep.truth, np.random.default_rng(100), R) @ P.T + c0 - prep.truth
        rep = release_flows(road, trips, epsilon=1.0, rng=3, fixed_endpoints=fixed).error_report()
        rows.append(_measure(f"flows 5x5 fixed_endpoints={fixed} default", rep, errs, _exact_single(rep)))
    return rows


def synthetic(draws: int) -> list[dict]:
    """Sums of float Laplace terms: variance-gamma vs normal vs the exact coverage (Monte Carlo)."""
    rng = np.random.default_rng(2)
    cases = {"1 term": [1.0], "2 equal": [1.0] * 2, "3 equal": [1.0] * 3, "8 equal": [1.0] * 8,
             "64 equal": [1.0] * 64, "geometric 0.7^i, 12 terms": list(0.7 ** np.arange(12)),
             "1 + 25 x 0.1": [1.0] + [0.1] * 25, "1 + 25 x 0.2": [1.0] + [0.2] * 25, "1, 0.3": [1.0, 0.3]}
    out = []
    for label, c in cases.items():
        c = np.asarray(c)
        e = np.zeros(draws)
        for start in range(0, c.size, 8):
            part = c[start : start + 8]
            e += rng.laplace(0.0, 1.0, (draws, part.size)) @ part
        sd = math.sqrt(2.0 * float((c * c).sum()))
        g2 = 3.0 * float((c**4).sum()) / float((c * c).sum()) ** 2
        row = {"case": label, "kurtosis": g2}
        for lv in (0.9, 0.95, 0.99):
            k_vg = float(vg_multiplier(lv, g2))
            k_n = float(vg_multiplier(lv, 0.0))
            row[str(lv)] = {"variance-gamma": float(np.mean(np.abs(e) <= k_vg * sd)),
                            "normal": float(np.mean(np.abs(e) <= k_n * sd))}
        out.append(row)
        print(f"    {label:28s} kurtosis {g2:.3f}  " + "  ".join(
            f"@{lv}: vg {row[str(lv)]['variance-gamma']:.4f} normal {row[str(lv)]['normal']:.4f}" for lv in (0.9, 0.95, 0.99)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=2000)
    ap.add_argument("--draws", type=int, default=400_000)
    ap.add_argument("--out", default=str(HERE / "results" / "intervals.json"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    with threadpool_limits(1):
        for part in (mechanisms, publishers, counters, consistency):
            for row in part(args.releases):
                _print(row)
                rows.append(row)
        print("synthetic float Laplace sums (coverage; nominal 0.9 / 0.95 / 0.99)")
        syn = synthetic(args.draws)
    res = {"level": LEVEL, "releases": args.releases, "kinds": rows, "synthetic_laplace_sums": syn,
           "seconds": time.perf_counter() - t0, "python": platform.python_version(), "numpy": np.__version__,
           "machine": platform.machine()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out} ({res['seconds']:.1f} s)")


if __name__ == "__main__":
    main()
