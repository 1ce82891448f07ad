"""TopDown designs optimised for a per-level workload, side by side with the plain design, in one run.

Data: the shared 2020 Census voting-district table (``bench_topdown.load``: nation > 48 states >
3,044 counties > 157,050 voting districts, 16 cells per unit: 2 age groups x 8 Hispanic-origin /
race groups).  Every release spends ``rho = 1`` (zCDP, discrete Gaussian noise) in total,
neighbours add or remove one person, the state totals are invariant (published exactly).

Rows -- one design each, planned once per row (``plan_topdown``, timed: ``plan_seconds``; data
free), then released with ``topdown(table, design=design, rng=np.random.default_rng([seed, r]),
keep_noisy=False, invariants=[INVARIANT])``, the same seeds ``[seed, r]`` for every row:

* **plain** (``split="equal"``, the baseline: every level's cells histogram at ``rho / 4``, the
  top levels ``cells | total``) -- the default before the per-level workload;
* **default** (no split / workload argument): strategy and split optimised for the default
  workload ``{"cells": 1, "total": 1}`` at every level, no workload term worse than 1.002x the
  plain design's (``OptimalSplit.cap``);
* **totals-first** (``workload={"total": 1}``);
* the trade-off between them: ``workload={"cells": 1, "total": w}`` for ``w`` in 0.05, 0.2 (the
  default cap), and without the cap (``OptimalSplit(cap=None)``) for the default workload and
  ``w`` = 0.2, 5 and 20;
* **marginals** (``workload={"cells": 1, "total": 1, "race": 1}``: the race marginal of every unit
  as a third term).

Per release and level: the mean absolute error per cell over all units and cells (``cells``); of
the geography total, ``mean_units |sum of the released cells - true total|`` (``total``; 0 at the
nation and the states, whose totals the invariant fixes); of the race marginal's cells (``race``);
the same for the GLS estimate before non-negativity and rounding (``gls_cells``, ``gls_total``).
Then per row the mean and standard error over releases, the ratio to the plain row's mean and the
paired difference (same seeds) with its standard error, the violations counted by
``TopDownRelease.check()`` (negative, non-integer, inconsistent counts, invariants unequal to the
truth: must be 0), the design's data-free predictions (``design.level_errors()`` for a cell and
``sqrt(2 / pi) * mean sqrt(design.total_variances())`` for a total, of the GLS estimate before
non-negativity and rounding; and, for the optimised rows, ``design.split_choice``'s workload terms
with the plain design's), and the seconds per release.  The issue's targets are checked with
their margins: (a) the default row's per-cell MAE at every level <= the old default's (1.006 /
0.996 / 1.000 / 0.858, and <= the plain row of the same run) and its total MAE at county and
district <= 0.9x the old default's (4.30, 4.18; and 0.9x the plain row); (b) the totals-first row's
total MAE <= 3.0 at every level, with its per-cell cost.  The plain and default rows run
``--target-reps`` releases (the nation's 16 cells make its figure the noisiest: a standard error
of ~0.02 needs ~200), the others ``--reps``.  BLAS runs one thread (threadpoolctl).

    python benchmarks/bench_topdown_workload.py [--reps 50] [--target-reps 200] [--out FILE] [--plot FILE]
    python benchmarks/bench_topdown_workload.py --quick              # 2 releases per row (a smoke test)
    python benchmarks/bench_topdown_workload.py --rows plain,default   # some rows only
    python benchmarks/bench_topdown_workload.py --replot benchmarks/results/topdown_workload.json

Results: ``results/topdown_workload.json``; the plot (``--plot``, default
``docs/topdown_workload.png``): per-cell MAE against total MAE at the counties and the districts,
one point per design.  The releases use seeded generators (reproducible; marked not private), as
benchmarks do.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _results import peak_rss_mib  # noqa: E402
from bench_topdown import INVARIANT, LEVELS, load  # noqa: E402
from sparsedp.topdown import plan_topdown, topdown  # noqa: E402
from sparsedp.topdown.design import OptimalSplit  # noqa: E402

SEED = 7
#: the old default's (equal split) release MAE per cell and total MAE (issue 36)
OLD_CELLS = {"nation": 1.006, "state": 0.996, "county": 1.000, "district": 0.858}
OLD_TOTALS = {"county": 4.30, "district": 4.18}
TOTAL_FACTOR = 0.9
TOTALS_FIRST_TARGET = 3.0
#: the levels whose totals the invariant (state totals) fixes: no total error to measure
INVARIANT_TOTAL_LEVELS = ("nation", "state")
METRICS = ("cells", "total", "race", "gls_cells", "gls_total")
#: name -> plan_topdown keyword arguments (besides rho and invariants)
ROWS: dict[str, dict[str, Any]] = {
    "plain": {"split": "equal"},
    "default": {},
    "totals-first": {"workload": {"total": 1}},
    "cells + 0.05 total": {"workload": {"cells": 1, "total": 0.05}},
    "cells + 0.2 total": {"workload": {"cells": 1, "total": 0.2}},
    "no cap": {"split": OptimalSplit(cap=None)},
    "no cap, cells + 0.2 total": {"split": OptimalSplit(cap=None), "workload": {"cells": 1, "total": 0.2}},
    "no cap, cells + 5 total": {"split": OptimalSplit(cap=None), "workload": {"cells": 1, "total": 5}},
    "no cap, cells + 20 total": {"split": OptimalSplit(cap=None), "workload": {"cells": 1, "total": 20}},
    "marginals (race)": {"workload": {"cells": 1, "total": 1, "race": 1}},
}
TARGET_ROWS = ("plain", "default")


def level_errors(table: Any, rel: Any, race: tuple[int, ...]) -> dict[str, list[float]]:
    """Per metric, per level: the mean absolute error of the released cells, of each unit's total
    (the sum of its released cells) and of its race marginal's cells; and of the GLS estimate's
    cells and totals (real-valued, before non-negativity and rounding)."""
    cells = table.hierarchy.cells
    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for c, e, t in zip(rel.counts, rel.estimate, table.counts):
        diff = np.asarray(c, dtype=np.int64) - np.asarray(t, dtype=np.int64)
        out["cells"].append(float(np.abs(diff).mean()))
        out["total"].append(float(np.abs(diff.sum(axis=1)).mean()))
        out["race"].append(float(np.abs(cells.marginal(diff, race)).mean()))
        g = np.asarray(e, dtype=np.float64) - t
        out["gls_cells"].append(float(np.abs(g).mean()))
        out["gls_total"].append(float(np.abs(g.sum(axis=1)).mean()))
    return out


def summarise(a: np.ndarray) -> dict[str, dict[str, float]]:
    """Mean and standard error over releases (rows) per level (columns)."""
    se = a.std(axis=0, ddof=1) / np.sqrt(a.shape[0]) if a.shape[0] > 1 else np.full(a.shape[1], np.nan)
    return {lv: {"mean": float(a[:, i].mean()), "se": float(se[i])} for i, lv in enumerate(LEVELS)}


def predictions(design: Any) -> dict[str, Any]:
    """The design's data-free expected MAE of the GLS estimate (before non-negativity and
    rounding) per level, of a cell and of a unit's total; and the optimiser's workload terms."""
    k = float(np.sqrt(2.0 / np.pi))
    tot = [k * float(np.sqrt(v).mean()) if v.size else 0.0 for v in design.total_variances()]
    out: dict[str, Any] = {"cells": dict(zip(LEVELS, design.level_errors())), "total": dict(zip(LEVELS, tot))}
    if design.split_choice is not None:
        out["workload_terms"] = design.split_choice.describe()["workload"]
    return out


def run_row(table: Any, name: str, kw: dict[str, Any], reps: int) -> dict[str, Any]:
    race = table.hierarchy.cells.axes("race")
    t0 = time.perf_counter()
    design = plan_topdown(table.hierarchy, rho=1.0, invariants=[INVARIANT], **kw)
    plan_s = time.perf_counter() - t0
    errs: dict[str, list[list[float]]] = {m: [] for m in METRICS}
    viol = {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    secs = []
    for r in range(reps):
        gen = np.random.default_rng([SEED, r])
        t0 = time.perf_counter()
        rel = topdown(table, design=design, rng=gen, keep_noisy=False, invariants=[INVARIANT])
        secs.append(time.perf_counter() - t0)
        for m, v in level_errors(table, rel, race).items():
            errs[m].append(v)
        for k, v in rel.check().items():
            viol[k] += int(v)
    spec = {k: (v if not isinstance(v, OptimalSplit) else repr(v)) for k, v in kw.items()}
    row = {
        "name": name, "releases": reps, "plan_kwargs": spec, "plan_seconds": plan_s,
        "split": [lp.budget for lp in design.levels],
        "queries": [[b.name for b in lp.blocks] for lp in design.levels],
        "query_budgets": [[float(b.budget) for b in lp.blocks] for lp in design.levels],
        "predicted_gls_mae": predictions(design),
        "mae": {m: summarise(np.asarray(errs[m])) for m in METRICS},
        "per_release": errs,
        "violations": viol,
        "seconds_per_release": {"median": float(np.median(secs)), "max": float(np.max(secs))},
        "peak_mb_process": peak_rss_mib(),
    }
    print(f"{name:26s} {reps:4d}  plan {plan_s:5.1f} s  {np.median(secs):.2f} s/rel  cells " + " / ".join(
        f"{row['mae']['cells'][lv]['mean']:.3f}" for lv in LEVELS) + "  total " + " / ".join(
        f"{row['mae']['total'][lv]['mean']:.2f}" for lv in LEVELS) + f"  viol {sum(viol.values())}", flush=True)
    return row


def compare(rows: list[dict[str, Any]]) -> None:
    """Each row's ratio to the plain row's mean and the paired difference (the releases both rows
    have, same seeds) with its standard error, per metric and level."""
    base = next((r for r in rows if r["name"] == "plain"), None)
    if base is None:
        return
    for r in rows:
        r["vs_plain"] = {}
        for m in METRICS:
            a, b = np.asarray(r["per_release"][m]), np.asarray(base["per_release"][m])
            n = min(len(a), len(b))
            d = a[:n] - b[:n]
            se = d.std(axis=0, ddof=1) / np.sqrt(n) if n > 1 else np.full(d.shape[1], np.nan)
            r["vs_plain"][m] = {lv: {"ratio": (r["mae"][m][lv]["mean"] / base["mae"][m][lv]["mean"]
                                               if base["mae"][m][lv]["mean"] > 1e-9 else None),
                                     "paired_diff": float(d[:, i].mean()), "paired_se": float(se[i]), "paired_n": n}
                                for i, lv in enumerate(LEVELS)}


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets (a) and (b), each level with its bound, the measured mean, the margin
    (bound - mean; >= 0: met) and the margin in standard errors."""
    by = {r["name"]: r for r in rows}
    out: dict[str, Any] = {}

    def check(row: dict[str, Any], metric: str, bound: float, lv: str) -> dict[str, Any]:
        m, se = row["mae"][metric][lv]["mean"], row["mae"][metric][lv]["se"]
        return {"bound": bound, "mean": m, "se": se, "margin": bound - m,
                "margin_se": (bound - m) / se if se and se > 0 else None, "met": bool(m <= bound)}

    if "default" in by:
        d = by["default"]
        a: dict[str, Any] = {"cells_vs_old_default": {}, "total_vs_0.9_old_default": {}}
        for lv in LEVELS:
            a["cells_vs_old_default"][lv] = check(d, "cells", OLD_CELLS[lv], lv)
        for lv in OLD_TOTALS:
            a["total_vs_0.9_old_default"][lv] = check(d, "total", TOTAL_FACTOR * OLD_TOTALS[lv], lv)
        if "plain" in by:
            p = by["plain"]
            a["cells_vs_plain_this_run"] = {lv: check(d, "cells", p["mae"]["cells"][lv]["mean"], lv) for lv in LEVELS}
            a["total_vs_0.9_plain_this_run"] = {lv: check(d, "total", TOTAL_FACTOR * p["mae"]["total"][lv]["mean"], lv)
                                                for lv in OLD_TOTALS}
        a["met"] = all(v["met"] for k in ("cells_vs_old_default", "total_vs_0.9_old_default") for v in a[k].values())
        out["a"] = a
    if "totals-first" in by:
        t = by["totals-first"]
        b = {"total": {lv: check(t, "total", TOTALS_FIRST_TARGET, lv) for lv in LEVELS},
             "cells_cost": {lv: t["mae"]["cells"][lv]["mean"] for lv in LEVELS}}
        if "plain" in by:
            b["cells_ratio_to_plain"] = {lv: t["vs_plain"]["cells"][lv]["ratio"] for lv in LEVELS}
        b["met"] = all(v["met"] for v in b["total"].values())
        out["b"] = b
    return out


def print_table(rows: list[dict[str, Any]], tg: dict[str, Any]) -> None:
    print("\nper level (nation / state / county / district): mean MAE (standard error) [ratio to plain]; "
          "nation and state totals are invariant (0)")
    for m, title in (("cells", "per-cell MAE"), ("total", "geography-total MAE"), ("race", "race-marginal MAE"),
                     ("gls_cells", "GLS estimate (before non-negativity and rounding), per-cell MAE"),
                     ("gls_total", "GLS estimate, geography-total MAE")):
        print(f"\n{title}")
        print(f"{'row':26s} {'n':>4s} " + "".join(f"{lv:>24s}" for lv in LEVELS) + "   predicted GLS")
        for r in rows:
            cells = []
            for lv in LEVELS:
                s = r["mae"][m][lv]
                ratio = r.get("vs_plain", {}).get(m, {}).get(lv, {}).get("ratio")
                cells.append(f"{s['mean']:.3f}({s['se']:.3f})" + (f" [{ratio:.3f}]" if ratio is not None else ""))
            pred = r["predicted_gls_mae"].get(m.replace("gls_", ""))
            ptxt = " / ".join(f"{pred[lv]:.3f}" for lv in LEVELS) if pred else ""
            print(f"{r['name']:26s} {r['releases']:4d} " + "".join(f"{c:>24s}" for c in cells) + f"   {ptxt}")
    print("\nshares (nation/state/county/district), queries, plan seconds, violations")
    for r in rows:
        print(f"{r['name']:26s} " + "/".join(f"{b:.4g}" for b in r["split"]) + "  "
              + " ; ".join(",".join(q) for q in r["queries"]) + f"  {r['plan_seconds']:.2f} s  "
              + f"viol {sum(r['violations'].values())}")
    for key, label in (("a", "target (a), default workload"), ("b", "target (b), totals-first")):
        if key not in tg:
            continue
        print(f"\n{label}: {'MET' if tg[key]['met'] else 'MISSED'}")
        for part, checks in tg[key].items():
            if not isinstance(checks, dict) or not checks or not isinstance(next(iter(checks.values())), dict):
                continue
            print(f"  {part:28s} " + "  ".join(
                f"{lv} {c['mean']:.3f} <= {c['bound']:.3f}: {'ok' if c['met'] else 'MISS'} "
                f"({c['margin']:+.3f}" + (f", {c['margin_se']:+.1f} se)" if c["margin_se"] is not None else ")")
                for lv, c in checks.items()))
        if key == "b":
            print("  per-cell cost " + " / ".join(f"{tg['b']['cells_cost'][lv]:.3f}" for lv in LEVELS)
                  + ("  (x plain " + " / ".join(f"{tg['b']['cells_ratio_to_plain'][lv]:.2f}" for lv in LEVELS) + ")"
                     if "cells_ratio_to_plain" in tg["b"] else ""))


def plot(results: dict[str, Any], path: Path) -> None:
    """Per-cell MAE (x) against total MAE (y) at the counties and the districts, one marker per
    design (error bars: standard errors), the totals-first design (whose cells cost many times
    more) left out there and shown with the others in a third panel (log-log, both levels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    far = {"totals-first"}
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>pPX*h"
    style = {r["name"]: (colours[i % len(colours)], markers[i % len(markers)]) for i, r in enumerate(rows)}
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2))
    for ax, lv in zip(axes, ("county", "district")):
        for r in rows:
            if r["name"] in far:
                continue
            x, y = r["mae"]["cells"][lv], r["mae"]["total"][lv]
            c, mk = style[r["name"]]
            ax.errorbar(x["mean"], y["mean"], xerr=x["se"], yerr=y["se"], fmt=mk, color=c, ms=7, mfc="none",
                        mew=1.4, label=f"{r['name']} ({r['releases']})")
            if r["name"] in TARGET_ROWS:
                ax.annotate(r["name"], (x["mean"], y["mean"]), textcoords="offset points", xytext=(8, 6), fontsize=8)
        if lv in OLD_TOTALS:
            ax.axhline(TOTAL_FACTOR * OLD_TOTALS[lv], color="grey", ls="--", lw=0.8)
            ax.axvline(OLD_CELLS[lv], color="grey", ls=":", lw=0.8)
            ax.axhline(TOTALS_FIRST_TARGET, color="tab:red", ls="-.", lw=0.6)
        ax.set_xlabel(f"{lv}: mean absolute error per cell")
        ax.set_ylabel(f"{lv}: mean absolute error of the unit's total")
        ax.set_title(f"{lv} level", fontsize=9)
        ax.margins(x=0.12, y=0.12)
    ax = axes[2]
    for r in rows:
        c, mk = style[r["name"]]
        for lv, fill in (("county", "none"), ("district", c)):
            ax.plot(r["mae"]["cells"][lv]["mean"], r["mae"]["total"][lv]["mean"], mk, color=c, mfc=fill, ms=6)
        if r["name"] in far:
            for lv in ("county", "district"):
                x, y = r["mae"]["cells"][lv]["mean"], r["mae"]["total"][lv]["mean"]
                ax.annotate(f"{r['name']}, {lv}\n({x:.1f}, {y:.1f})", (x, y), textcoords="offset points",
                            xytext=(-95, -4), fontsize=7)
    ax.axhline(TOTALS_FIRST_TARGET, color="tab:red", ls="-.", lw=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean absolute error per cell (log)")
    ax.set_ylabel("mean absolute error of the total (log)")
    ax.set_title("all designs, county (open) and district (filled)", fontsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    tf = [r for r in rows if r["name"] in far]
    for r in tf:
        c, mk = style[r["name"]]
        handles.append(plt.Line2D([], [], ls="", marker=mk, color=c))
        labels.append(f"{r['name']} ({r['releases']})")
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7.5, title="design (releases)",
               title_fontsize=8, frameon=False)
    fig.suptitle("TopDown on the shared table (rho = 1, add/remove one person, state totals invariant): "
                 "per-cell error vs geography-total error of the released counts, by design\n"
                 "dashed: 0.9 x the old default's total MAE; dotted: the old default's cell MAE; dash-dot: "
                 "total MAE 3.0", fontsize=9)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--target-reps", type=int, default=200, help="releases of the plain and default rows")
    ap.add_argument("--quick", action="store_true", help="2 releases per row")
    ap.add_argument("--rows", default=None, help="comma-separated row names (default: all): " + ", ".join(ROWS))
    ap.add_argument("--out", default=str(HERE / "results" / "topdown_workload.json"))
    ap.add_argument("--plot", default=str(HERE.parent / "docs" / "topdown_workload.png"))
    ap.add_argument("--replot", default=None, help="only draw --plot from this results JSON (no releases)")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.plot))
        return
    names = list(ROWS) if args.rows is None else [s.strip() for s in args.rows.split(",") if s.strip()]
    unknown = [s for s in names if s not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
    from threadpoolctl import threadpool_limits

    t_all = time.perf_counter()
    with threadpool_limits(1, user_api="blas"):
        table = load()
        print(f"units per level {table.hierarchy.sizes}, {table.hierarchy.cells.size} cells", flush=True)
        rows = []
        for name in names:
            reps = 2 if args.quick else (args.target_reps if name in TARGET_ROWS else args.reps)
            rows.append(run_row(table, name, ROWS[name], reps))
    compare(rows)
    tg = targets(rows)
    print_table(rows, tg)
    out = {"benchmark": "topdown_workload", "rho": 1.0, "invariant": INVARIANT, "neighbours": "add/remove one person",
           "seeds": f"np.random.default_rng([{SEED}, r])", "levels": list(LEVELS),
           "old_default": {"cells": OLD_CELLS, "total": OLD_TOTALS}, "targets": tg, "rows": rows,
           "quick": bool(args.quick), "blas_threads": 1, "seconds": time.perf_counter() - t_all,
           "python": platform.python_version(), "numpy": np.__version__}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    if args.plot:
        plot(out, Path(args.plot))


if __name__ == "__main__":
    main()
