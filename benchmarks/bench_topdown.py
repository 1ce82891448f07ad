"""TopDown releases of the 2020 Census voting-district table (issue 28), side by side in one run.

Data: ``../shared/datasets/census2020_vtd/us2020_vtd_race_eth_age.csv.gz`` -- nation > 48 states >
3,044 counties > 157,050 voting districts, 16 cells per district (2 age groups x 8 Hispanic-origin /
race groups), 286,218,531 people.  Every release spends ``rho = 1`` (zCDP) in total; neighbours add
or remove one person.  Per release and level (nation / state / county / district) the mean absolute
error per cell over all units and cells; then the mean (and its standard error) over releases.

Rows:

* **release** (``sparsedp.topdown.topdown``): exact discrete Gaussian noise on every level's cells,
  the state totals invariant (published exactly), GLS, then non-negative integer counts that add
  up -- for the default (equal) split, three other fixed splits and the split tuned on this table
  for the issue's targets (more releases, for a smaller standard error at the nation, whose 16
  cells make it the noisiest figure);
* **optimiser** rows: the data-free split of ``split="optimal"`` (``OptimalSplit``: minimise a
  level-weighted expected MAE of the GLS, from the exact GLS variances of the design, no data) with
  its default (every level weighs the same; as many releases as the tuned split), and three other
  objectives / level weights: minimax across levels, minimax of error / target for the issue's
  targets, the nation weighted twice.  Each row prints the shares chosen and the data-free
  prediction ``sqrt(2/pi) * mean sd`` per level next to the measured MAE (the ratio shows what
  the non-negativity and rounding change);
* **GLS** of the same releases before the projection and rounding (real-valued, consistent);
* **issue GLS row**: every level's 16-cell histogram at ``rho / 4``, continuous Gaussian noise
  (``secure=False``), no invariant, the exact tree GLS, no rounding (the issue's
  1.13 / 1.09 / 1.08 / 1.12);
* **leaves only**: all of ``rho`` on the districts, parents by summation (the GLS with only the
  leaves measured is the sum), and that measurement made non-negative integer by the same rounding;
* **district totals invariant** (a few releases, for the cost): every district's total published
  exactly, so every level's rounding is a 2-D controlled rounding (transportation problems);
* **InfTDA** (the peer, PyPI ``inf-tda`` 0.1; only with ``--inftda-python``): run from its own venv
  by ``_inftda_runner.py`` in a subprocess (inf-tda 0.1 needs pandas 2.2 and opendp 0.12, not the
  newest releases), on the same CSV as a pandas Series indexed (cell, state, county, district) --
  the cell as the first index level, the layout the issue found best.  InfTDA spends ``rho / 4`` per
  level with discrete Gaussian noise, publishes the grand total exactly and rounds each parent's
  children to non-negative integers that add up to it (Chebyshev ``int_opt``).  Its ``rho`` is for
  *substitution* neighbours (l2 sensitivity ``sqrt(2)``), so two rows: ``rho = 1`` in its own
  accounting (per-count sd 2; ``rho = 1/2`` for add/remove neighbours) and ``rho = 2`` in its own
  accounting (per-count sd ``sqrt(2)``, the noise of the issue GLS row: ``rho = 1`` add/remove).
  ``--inftda-reps`` releases each (~50-60 s and ~0.8 GB per release; OpenDP's noise cannot be
  seeded).  Per level the same MAE per cell, from InfTDA's released leaves summed up (they add up
  to its released levels); the time of the ``inf_tda`` call and the peer process' ``VmHWM``.  The
  issue's figures are printed under each row.  Without ``--inftda-python`` (or if the path is
  missing) the rows are skipped with a message.  ``--only-peers`` (``--merge``) runs only these
  rows and merges them into the existing ``--out`` JSON (replacing earlier peer rows; the sparsedp
  rows are not recomputed, and ``peers.mode`` records that the rows come from two runs).

For each release row the violations are counted over all levels and cells (negative counts,
non-integers, parents unequal to the sum of their children, invariants not equal to the truth)
and must all be 0.  Time per release (``topdown`` from the table in memory to the release object)
and the process' peak memory so far (``VmHWM``, else ``resource.getrusage``) are recorded; the whole path CSV -> release
file (``read_table``, ``topdown``, ``save``) runs in a fresh subprocess for its own time and peak
memory.  BLAS runs one thread (threadpoolctl).

    python benchmarks/bench_topdown.py [--reps 20] [--target-reps 200] [--leaf-reps 3] [--out FILE] [--plot FILE]
    python benchmarks/bench_topdown.py --only-default   # only the default split's row (--target-reps releases), merged
    python benchmarks/bench_topdown.py --inftda-append RUN.json   # add a separate peer run's releases (the runner's JSON)
    python benchmarks/bench_topdown.py --quick        # 2 releases per row (a smoke test)
    python benchmarks/bench_topdown.py --inftda-python /tmp/peers/inftda-venv/bin/python [--inftda-reps 3]
    python benchmarks/bench_topdown.py --only-peers --inftda-python /tmp/peers/inftda-venv/bin/python
    python benchmarks/bench_topdown.py --replot benchmarks/results/topdown.json --plot docs/topdown_error.png

The peer's venv::

    python3 -m venv /tmp/peers/inftda-venv
    /tmp/peers/inftda-venv/bin/pip install 'inf-tda==0.1.*' 'pandas==2.2.*' 'opendp==0.12.*' numpy

The releases use seeded generators (reproducible; marked not private), as benchmarks do (InfTDA's
cannot be seeded).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _results import peak_rss_mib  # noqa: E402  (benchmarks/ is on sys.path when run as a script)
from sparsedp.topdown import plan_topdown, read_table, topdown  # noqa: E402
from sparsedp.topdown.design import OptimalSplit  # noqa: E402

DATA = HERE.parent.parent / "shared" / "datasets" / "census2020_vtd" / "us2020_vtd_race_eth_age.csv.gz"
GEO = "state_fips,county_fips,vtd_code"
COUNTS = "vap_*,u18_*"
LEVELS = ("nation", "state", "county", "district")
INVARIANT = "state_fips:total"
TARGETS = {"nation": 0.88, "state": 1.09, "county": 1.08, "district": 1.01}
ISSUE_GLS = {"nation": 1.13, "state": 1.09, "county": 1.08, "district": 1.12}
#: the issue's InfTDA rows (cell as the first index level; rho in InfTDA's own, substitution, accounting)
ISSUE_INFTDA = {1.0: {"nation": 1.57, "state": 1.63, "county": 1.60, "district": 1.35},
                2.0: {"nation": 0.88, "state": 1.23, "county": 1.18, "district": 1.01}}
ISSUE_INFTDA_TIME = "49-52 s, 0.8-1.07 GB"
RUNNER = HERE / "_inftda_runner.py"
#: the split chosen for the issue's targets (nation / state / county / district shares of rho)
TARGET_SPLIT = [0.37, 0.22, 0.225, 0.185]
SPLITS = {
    "default (equal)": [1, 1, 1, 1],
    "nation-heavy": [0.4, 0.2, 0.2, 0.2],
    "leaf-light": [0.35, 0.25, 0.25, 0.15],
    "district-heavy": [0.2, 0.2, 0.2, 0.4],
}
#: data-free optimiser rows (the first: its defaults, with --target-reps releases)
#: (the per-cell objective these rows were measured with: each level's expected MAE per cell, absolute,
#: unconstrained; the library's default optimises a cells-and-totals workload instead, see
#: bench_topdown_workload.py)
PER_CELL = dict(workload={"cells": 1}, relative=False, cap=None)
OPTIMISED = {
    "optimal (equal weights)": OptimalSplit(**PER_CELL),
    "optimal minimax": OptimalSplit(objective="max", **PER_CELL),
    "optimal for targets": OptimalSplit.for_targets([TARGETS[lv] for lv in LEVELS]),
    "optimal, nation x2": OptimalSplit(level_weights=[2, 1, 1, 1], **PER_CELL),
}


def load() -> Any:
    return read_table(DATA, GEO, COUNTS, attributes=("age", "race"), root="nation")


def mae(values: tuple[np.ndarray, ...], truth: tuple[np.ndarray, ...]) -> list[float]:
    return [float(np.abs(np.asarray(v, dtype=np.float64) - t).mean()) for v, t in zip(values, truth)]


def summarise(rows: list[list[float]]) -> dict[str, dict[str, float]]:
    a = np.asarray(rows)
    se = a.std(axis=0, ddof=1) / np.sqrt(a.shape[0]) if a.shape[0] > 1 else np.full(a.shape[1], np.nan)
    return {lv: {"mean": float(a[:, i].mean()), "se": float(se[i])} for i, lv in enumerate(LEVELS)}


def run_row(table: Any, name: str, reps: int, seed: int, **kw: Any) -> dict[str, Any]:
    truth = table.counts
    t0 = time.perf_counter()
    design = plan_topdown(table.hierarchy, **{k: v for k, v in kw.items() if k not in ("weights",)})
    plan_s = time.perf_counter() - t0
    predicted = design.level_errors()  # data-free: sqrt(2/pi) * mean GLS sd per level
    rel_err, gls_err, pred, secs = [], [], [], []
    viol = {"negative": 0, "non_integer": 0, "inconsistent": 0, "invariant_violations": 0}
    inv_exact = True
    for r in range(reps):
        gen = np.random.default_rng([seed, r])
        t0 = time.perf_counter()
        rel = topdown(table, design=design, rng=gen, keep_noisy=False)
        secs.append(time.perf_counter() - t0)
        rel_err.append(mae(rel.counts, truth))
        gls_err.append(mae(rel.estimate, truth))
        pred.append([float(np.sqrt(2.0 / np.pi) * np.sqrt(v).mean()) for v in rel.variance])
        for k, v in rel.check().items():
            viol[k] += v
        for spec in kw.get("invariants", ()):
            d = table.hierarchy.level_index(spec.split(":")[0])
            inv_exact &= bool(np.array_equal(rel.counts[d].sum(axis=1), truth[d].sum(axis=1)))
    spec = kw.get("split")
    out = {
        "name": name, "releases": reps, "split": [lp.budget for lp in design.levels],
        "split_spec": spec if isinstance(spec, (str, list)) else repr(spec),
        "split_choice": design.split_choice.describe() if design.split_choice is not None else None,
        "plan_seconds": plan_s,
        "predicted_gls_mae_data_free": dict(zip(LEVELS, predicted)),
        "invariants": list(kw.get("invariants", ())), "secure": design.secure,
        "queries": [[b.name for b in lp.blocks] for lp in design.levels],
        "release_mae": summarise(rel_err), "gls_mae": summarise(gls_err),
        "gls_mae_predicted_gaussian": dict(zip(LEVELS, np.mean(pred, axis=0).tolist())),
        "violations": viol, "invariants_exact": inv_exact,
        "meets_targets": {lv: bool(np.mean(np.asarray(rel_err)[:, i]) <= TARGETS[lv]) for i, lv in enumerate(LEVELS)},
        "seconds_per_release": {"median": float(np.median(secs)), "max": float(np.max(secs))},
        "peak_mb_process": peak_rss_mib(),
    }
    shares = "/".join(f"{b:.4g}" for b in out["split"])
    print(f"{name:26s} {shares:28s} {reps:4d}  release " + " / ".join(
        f"{out['release_mae'][lv]['mean']:.3f}({out['release_mae'][lv]['se']:.3f})" for lv in LEVELS)
          + "   gls " + " / ".join(f"{out['gls_mae'][lv]['mean']:.3f}" for lv in LEVELS)
          + "   predicted " + " / ".join(f"{p:.3f}" for p in predicted)
          + f"   {np.median(secs):.2f} s  viol {sum(viol.values())}", flush=True)
    return out


def end_to_end(split: list[float]) -> dict[str, Any]:
    """CSV -> release file in this process (called in a fresh subprocess)."""
    t0 = time.perf_counter()
    table = load()
    t1 = time.perf_counter()
    rel = topdown(table, rho=1.0, split=split, invariants=[INVARIANT], rng=np.random.default_rng(0))
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = rel.save(Path(tmp) / "release.npz")
        size = path.stat().st_size
    t3 = time.perf_counter()
    return {"read_s": t1 - t0, "release_s": t2 - t1, "save_s": t3 - t2, "total_s": t3 - t0, "peak_mb": peak_rss_mib(),
            "file_mb": size / 2**20, "published_counts": int(sum(c.size for c in rel.counts)),
            "violations": rel.check()}


def run_peers(python: str | None, reps: int) -> tuple[list[dict[str, Any]], str | None]:
    """The InfTDA rows: ``_inftda_runner.py`` under the peer's Python, once per ``rho`` (its own
    accounting).  Returns the rows and, when they are skipped, why."""
    if not python:
        return [], "--inftda-python not given"
    if not Path(python).exists():
        return [], f"--inftda-python {python} not found"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    rows = []
    for rho_own in ISSUE_INFTDA:
        print(f"InfTDA, rho {rho_own:g} in its own accounting, {reps} releases (~50 s each) ...", flush=True)
        proc = subprocess.run([python, str(RUNNER), "--data", str(DATA), "--rho", str(rho_own), "--reps", str(reps)],
                              stdout=subprocess.PIPE, stderr=None, text=True, env=env)
        if proc.returncode != 0:
            return rows, f"{RUNNER.name} failed under {python} (exit {proc.returncode})"
        peer = json.loads(proc.stdout.strip().splitlines()[-1])
        rel = peer.pop("releases")
        errs = [[r["mae"][lv] for lv in LEVELS] for r in rel]
        secs = [r["seconds"] for r in rel]
        row = {
            "kind": "peer", "name": f"InfTDA {peer['versions']['inf-tda']}, rho {rho_own:g} (own)",
            "releases": len(rel), "rho_own_accounting": rho_own, "rho_add_remove": peer["rho_used"] / 2.0,
            "layout": peer["layout"], "release_mae": summarise(errs), "per_release_mae": errs,
            "meets_targets": {lv: bool(np.mean(np.asarray(errs)[:, i]) <= TARGETS[lv]) for i, lv in enumerate(LEVELS)},
            "negative": sum(r["negative"] for r in rel), "total_exact": all(r["total_exact"] for r in rel),
            "seconds_per_release": {"median": float(np.median(secs)), "max": float(np.max(secs)), "all": secs},
            "peak_mb_process": peer["peak_mb"], "issue": {"release_mae": ISSUE_INFTDA[rho_own],
                                                          "time_memory": ISSUE_INFTDA_TIME},
            "peer": peer,
        }
        print(f"{row['name']:26s} {row['layout']:28s} {len(rel):4d}  release " + " / ".join(
            f"{row['release_mae'][lv]['mean']:.3f}({row['release_mae'][lv]['se']:.3f})" for lv in LEVELS)
              + f"   {np.median(secs):.1f} s  peak {peer['peak_mb']:.0f} MB  negatives {row['negative']}", flush=True)
        rows.append(row)
    return rows, None


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\nrelease MAE per cell (standard error), ratio release / data-free GLS prediction; targets "
          + " / ".join(f"{TARGETS[lv]}" for lv in LEVELS))
    print(f"{'row':26s} {'shares (nation/state/county/district)':38s} {'n':>4s}  "
          + "  ".join(f"{lv:>22s}" for lv in LEVELS))
    for r in rows:
        if r["kind"] not in ("release", "optimiser"):
            continue
        cells = []
        for lv in LEVELS:
            m, se, p = r["release_mae"][lv]["mean"], r["release_mae"][lv]["se"], r["predicted_gls_mae_data_free"][lv]
            cells.append(f"{m:.3f}({se:.2g}){'*' if m <= TARGETS[lv] else ' '} x{m / p:.3f}")
        shares = "/".join(f"{b:.4g}" for b in r["split"])
        print(f"{r['name']:26s} {shares:38s} {r['releases']:4d}  " + "  ".join(f"{c:>22s}" for c in cells))
    peers = [r for r in rows if r["kind"] == "peer"]
    for r in peers:
        cells = [f"{r['release_mae'][lv]['mean']:.3f}({r['release_mae'][lv]['se']:.2g})"
                 f"{'*' if r['release_mae'][lv]['mean'] <= TARGETS[lv] else ' '}       " for lv in LEVELS]
        desc = f"{r['layout']}, add/remove rho {r['rho_add_remove']:.3g}"
        print(f"{r['name']:26s} {desc:38s} {r['releases']:4d}  " + "  ".join(f"{c:>22s}" for c in cells)
              + f"   {r['seconds_per_release']['median']:.1f} s, {r['peak_mb_process'] / 1024:.2f} GB")
        issue = r["issue"]["release_mae"]
        print(f"{'  (issue)':26s} {'':38s} {'':4s}  " + "  ".join(f"{issue[lv]:>14.2f}        " for lv in LEVELS)
              + f"   {r['issue']['time_memory']}")
    print("(* meets the target; x: measured / predicted, the baseline model in the same run"
          + ("; InfTDA: rho in its own accounting (substitution neighbours), time per release, "
             "peak memory of the peer process" if peers else "") + ")")


def merge_peers(args: argparse.Namespace) -> None:
    """``--only-peers``: run just the InfTDA rows and merge them into the results JSON ``--out``
    (replacing its earlier peer rows); the sparsedp rows are not recomputed."""
    out = Path(args.out)
    if not out.exists():
        raise SystemExit(f"--only-peers merges into {out}, which does not exist: run the full benchmark first")
    results = json.loads(out.read_text())
    peers, skipped = run_peers(args.inftda_python, args.inftda_reps)
    if skipped:
        print(f"InfTDA rows skipped: {skipped} (see the module docstring for the peer venv)", flush=True)
    if not peers:
        return
    results["rows"] = [r for r in results["rows"] if r["kind"] != "peer"] + peers
    results["peers"] = {"measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "mode": "merged (--only-peers) into an "
                        "earlier run's sparsedp rows", "inftda_reps": args.inftda_reps, "skipped": skipped}
    print_table(results["rows"])
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"merged {len(peers)} InfTDA rows into {out}")


def append_peer_runs(out: Path, files: list[str]) -> None:
    """``--inftda-append FILE``: add the releases of a separate ``_inftda_runner.py`` run (its JSON
    output) to the InfTDA row of the same ``rho`` in ``--out`` (more releases, a smaller standard
    error; the row records every run it holds)."""
    results = json.loads(out.read_text())
    for f in files:
        peer = json.loads(Path(f).read_text().strip().splitlines()[-1])
        rel = peer.pop("releases")
        row = next((r for r in results["rows"] if r["kind"] == "peer" and r["rho_own_accounting"] == peer["rho_own"]),
                   None)
        if row is None:
            raise SystemExit(f"{f}: no InfTDA row at rho {peer['rho_own']} in {out} to append to")
        errs = row["per_release_mae"] + [[r["mae"][lv] for lv in LEVELS] for r in rel]
        secs = row["seconds_per_release"]["all"] + [r["seconds"] for r in rel]
        row.update(releases=len(errs), per_release_mae=errs, release_mae=summarise(errs),
                   meets_targets={lv: bool(np.mean(np.asarray(errs)[:, i]) <= TARGETS[lv]) for i, lv in enumerate(LEVELS)},
                   negative=row["negative"] + sum(r["negative"] for r in rel),
                   total_exact=row["total_exact"] and all(r["total_exact"] for r in rel),
                   seconds_per_release={"median": float(np.median(secs)), "max": float(np.max(secs)), "all": secs},
                   peak_mb_process=max(row["peak_mb_process"], peer["peak_mb"]))
        row.setdefault("runs", [len(errs) - len(rel)]).append(len(rel))
    print_table(results["rows"])
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"appended {len(files)} InfTDA run(s) to {out}")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 4.6))
    x = np.arange(len(LEVELS))
    shown = [r for r in results["rows"] if r["kind"] in ("release", "optimiser")]
    for i, row in enumerate(shown):
        m = [row["release_mae"][lv]["mean"] for lv in LEVELS]
        s = [row["release_mae"][lv]["se"] for lv in LEVELS]
        split = "/".join(f"{b:.3g}" for b in row["split"])
        ax.errorbar(x + 0.015 * (i - len(shown) / 2), m, yerr=s, marker="o" if row["kind"] == "release" else "s",
                    ls="-" if row["kind"] == "release" else "--", capsize=3, label=f"{row['name']} ({split})")
    ax.plot(x, [TARGETS[lv] for lv in LEVELS], "k--", lw=1, label="issue targets")
    ax.plot(x, [ISSUE_GLS[lv] for lv in LEVELS], ":", color="gray", lw=1, label="issue GLS row")
    ax.set_xticks(x, LEVELS)
    ax.set_ylabel("mean absolute error per cell")
    ax.set_title("TopDown release, rho = 1, state totals invariant (integer, non-negative, consistent); "
                 "dashed: split='optimal' variants", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merge_default(args: argparse.Namespace) -> None:
    """Run the default (equal) split's row alone (``--target-reps`` releases, its seeds as in a full
    run) and replace it in the existing ``--out`` JSON."""
    from threadpoolctl import threadpool_limits

    out = Path(args.out)
    results = json.loads(out.read_text())
    name, split = next(iter(SPLITS.items()))
    with threadpool_limits(1, user_api="blas"):
        table = load()
        row = {"kind": "release", **run_row(table, name, 2 if args.quick else args.target_reps, 100, rho=1.0,
                                             split=split, invariants=[INVARIANT])}
    results["rows"] = [row if r["name"] == name else r for r in results["rows"]]
    out.write_text(json.dumps(results, indent=1) + "\n")
    print_table(results["rows"])
    print(f"merged {name!r} into {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--target-reps", type=int, default=200)
    ap.add_argument("--leaf-reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "topdown.json"))
    ap.add_argument("--plot", default=str(HERE / "results" / "topdown.png"))
    ap.add_argument("--end-to-end", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--replot", default=None, help="only draw --plot from this results JSON (no releases)")
    ap.add_argument("--inftda-python", default=None, metavar="PATH",
                    help="Python of a venv with inf-tda 0.1 (pandas 2.2, opendp 0.12); "
                         "without it the InfTDA rows are skipped")
    ap.add_argument("--inftda-reps", type=int, default=3, help="InfTDA releases per rho (~50 s each)")
    ap.add_argument("--only-peers", "--merge", dest="only_peers", action="store_true",
                    help="run only the InfTDA rows and merge them into the existing --out JSON")
    ap.add_argument("--inftda-append", nargs="+", default=None, metavar="FILE",
                    help="add the releases of separate _inftda_runner.py runs (their JSON output) to the InfTDA "
                         "rows of --out")
    ap.add_argument("--only-default", action="store_true",
                    help="run only the default (equal) split row, --target-reps releases, and merge it into --out")
    args = ap.parse_args()
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.plot))
        return
    if args.only_peers:
        merge_peers(args)
        return
    if args.only_default:
        merge_default(args)
        return
    if args.inftda_append:
        append_peer_runs(Path(args.out), args.inftda_append)
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, user_api="blas"):
        if args.end_to_end:
            print(json.dumps(end_to_end(TARGET_SPLIT)))
            return
        proc = subprocess.run([sys.executable, __file__, "--end-to-end"], capture_output=True, text=True,
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, check=True)
        e2e = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"CSV -> release file: {e2e['total_s']:.2f} s, peak {e2e['peak_mb']:.0f} MB, "
              f"{e2e['published_counts']} counts, {e2e['file_mb']:.0f} MB file", flush=True)
        reps = 2 if args.quick else args.reps
        target_reps = 2 if args.quick else args.target_reps
        t0 = time.perf_counter()
        table = load()
        read_s = time.perf_counter() - t0
        print(f"read {DATA.name}: {read_s:.2f} s, units per level {table.hierarchy.sizes}", flush=True)
        rows = []
        for i, (name, split) in enumerate(SPLITS.items()):  # the default (first): --target-reps releases
            rows.append({"kind": "release", **run_row(table, name, target_reps if i == 0 else reps, 100 + i,
                                                       rho=1.0, split=split, invariants=[INVARIANT])})
        rows.append({"kind": "release", **run_row(table, "target split", target_reps, 200, rho=1.0,
                                                   split=TARGET_SPLIT, invariants=[INVARIANT])})
        for i, (name, spec) in enumerate(OPTIMISED.items()):
            rows.append({"kind": "optimiser", **run_row(table, name, target_reps if i == 0 else reps, 600 + i, rho=1.0,
                                                         split=spec, invariants=[INVARIANT])})
        rows.append({"kind": "issue GLS row", **run_row(table, "issue GLS row (float)", reps, 300, rho=1.0,
                                                         split=[1, 1, 1, 1], secure=False)})
        rows.append({"kind": "leaves only", **run_row(table, "leaves only", reps, 400, rho=1.0, split=[0, 0, 0, 1])})
        leaf_reps = 1 if args.quick else args.leaf_reps
        rows.append({"kind": "leaf invariant", **run_row(table, "district totals invariant", leaf_reps, 500, rho=1.0,
                                                          split=TARGET_SPLIT, invariants=["vtd_code:total"])})
        peer_reps = 1 if args.quick else args.inftda_reps
        peers, skipped = run_peers(args.inftda_python, peer_reps)
        if skipped:
            print(f"InfTDA rows skipped: {skipped} (see the module docstring for the peer venv)", flush=True)
        rows += peers
    target = next(r for r in rows if r["name"] == "target split")
    meets = {lv: target["release_mae"][lv]["mean"] <= TARGETS[lv] for lv in LEVELS}
    print_table(rows)
    results = {
        "benchmark": "bench_topdown", "data": DATA.name, "rho": 1.0, "units": list(table.hierarchy.sizes),
        "cells": table.cells.size, "targets": TARGETS, "issue_gls_row": ISSUE_GLS, "rows": rows,
        "target_split_meets_targets": meets, "end_to_end": e2e, "read_s": read_s,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "blas_threads": 1},
        "quick": bool(args.quick),
        "peers": {"measured": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "mode": "same run",
                  "inftda_reps": peer_reps, "skipped": skipped},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, Path(args.plot))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
