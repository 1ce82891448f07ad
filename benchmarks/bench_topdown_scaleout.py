"""TopDown release chunked by subtree on Dask: a synthetic nation of ~10^7 blocks x 16 cells.

Two configurations, each in its own subprocess (its peak RSS is the driver's):

* ``nation``: :class:`sparsedp.topdown.SyntheticNation` (``--states`` states, nation > state >
  county > tract > block, on average 64 counties, 25 tracts and 125 blocks each, sizes varying by
  +-50%; 16 cells = 2 ages x 8 races; Poisson(1.5) counts, ~22% zeros), generated state by state
  on the workers (no count of the nation on the driver: its public structure only), released with
  :func:`sparsedp.topdown.topdown_scaleout` on a fresh 2-worker ``LocalCluster`` (one thread
  each, ``--memory`` limit each): rho = 1, the default design (optimised on the whole public
  structure for the default workload; ``--design equal``: the equal split), ``--invariants``
  (default state and county totals: the county's below the subtree level, the states), exact
  discrete Gaussian noise, seeded.  Reported: wall seconds (and per phase: ``plan`` is the
  optimised design and the error summary on the whole structure), the peak RSS of the driver and
  of each worker (``VmHWM``), and the violations, counted twice: by the tasks while releasing,
  and again here by reading the output back part by part (negatives, non-integers, parents
  unequal to the sum of their children per cell, state and county totals unequal to the truth);
* ``slice``: a ~10^5-block nation of the same generator (8 states of 10 x 10 x 125), released
  in-process (:func:`sparsedp.topdown.topdown` on the table in memory: the baseline) and chunked
  on a fresh 2-worker cluster, same seed and design: every level's counts, estimates and
  variances, the ledger and the design's description compared bit for bit (asserted), and the
  time ratio (chunked / in-process).

The results file keeps the rows already in it (other designs, earlier runs) and adds this run's,
each tagged with its design and invariants.

BLAS is pinned to one thread in the driver (threadpoolctl) and in the workers (each configuration's
process, and the worker processes it starts, run with ``OPENBLAS_NUM_THREADS=1``).

    python benchmarks/bench_topdown_scaleout.py [--states 50] [--memory 2GB] [--design optimised]
        [--invariants state:total,county:total] [--skip-nation]
        [--out benchmarks/results/topdown_scaleout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from _scaleout_bench import on_local_cluster, peak_rss_mb  # noqa: E402
from _scaleout_bench import spawn as _spawn  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from sparsedp.topdown import topdown  # noqa: E402
from sparsedp.topdown.scaleout import SyntheticNation, topdown_scaleout  # noqa: E402

RHO = 1.0
SEED = 2028


def _plan_args(args: argparse.Namespace) -> dict:
    """The release's design arguments: the default (optimised) design or the equal split, and the
    invariants."""
    out: dict = {"invariants": [s for s in args.invariants.split(",") if s]}
    if args.design == "equal":
        out["split"] = "equal"
    return out


def verify(path: Path, truth_state_totals: np.ndarray, truth_county_totals: np.ndarray | None = None) -> dict:
    """Violations, read back from the files one part at a time (not the tasks' own counts); the
    county totals against ``truth_county_totals`` (in the release's order) when given."""
    with np.load(path / "top.npz", allow_pickle=False) as z:
        depth, counts = z["depth"], z["counts"]
    root_level = int(depth.max())
    roots = counts[depth == root_level]
    nation, states = counts[depth == 0], counts[depth == 1]
    bad = {"negative": int((counts < 0).sum()), "non_integer": 0 if counts.dtype.kind == "i" else -1,
           "inconsistent": int((states.sum(axis=0) != nation[0]).sum()),
           "invariant_violations": int((states.sum(axis=1) != truth_state_totals).sum())}
    units = int(depth.size)
    manifest = json.loads((path / "topdown.json").read_text())
    s = root_level
    for f in manifest["files"][1:]:
        with np.load(path / f, allow_pickle=False) as z:
            d, par, c, first = z["depth"], z["parent"], z["counts"], z["first"]
        units += int(d.size)
        bad["negative"] += int((c < 0).sum())
        bad["non_integer"] += 0 if c.dtype.kind == "i" else int(c.size)
        for lev in np.unique(d):  # children's sums against their parents (the roots, or this part's units)
            sel = d == lev
            if lev == s + 1:
                parent_counts, idx = roots, par[sel]
            else:
                parent_counts, idx = c[d == lev - 1], par[sel] - int(first[lev - 1 - s])
            sums = np.zeros_like(parent_counts)
            np.add.at(sums, idx, c[sel])
            has = np.bincount(idx, minlength=parent_counts.shape[0]) > 0
            bad["inconsistent"] += int((sums[has] != parent_counts[has]).sum())
        if truth_county_totals is not None and s == 1:
            sel = d == 2
            lo = int(first[1])
            want = truth_county_totals[lo:lo + int(sel.sum())]
            bad["invariant_violations"] += int((c[sel].sum(axis=1) != want).sum())
    bad["units"] = units
    return bad


def one_unit_in_fresh_process(out: Path, codes: tuple[str, ...]) -> dict:
    """Seconds to open the release directory and read one unit (``load_chunked(out).unit(codes)``),
    measured in a new Python process, and the cells it returned."""
    import subprocess

    code = ("import sys, time, json; t0 = time.perf_counter(); import sparsedp; from sparsedp.topdown import load_chunked; "
            "t1 = time.perf_counter(); u = load_chunked(sys.argv[1]).unit(tuple(sys.argv[2:])); "
            "print(json.dumps({'import_s': t1 - t0, 'unit_s': time.perf_counter() - t1, "
            "'level': u['level'], 'total': int(u['counts'].sum())}))")
    done = subprocess.run([sys.executable, "-c", code, str(out), *codes], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_nation(args: argparse.Namespace) -> dict:
    nat = SyntheticNation(states=args.states, seed=SEED)
    plan = _plan_args(args)
    res: dict = {"mode": "nation", "states": args.states, "levels": list(nat.levels), "cells": nat.cells.size,
                 "design": args.design, "invariants": plan["invariants"]}
    base = Path(tempfile.mkdtemp(prefix="bench-topdown-", dir=args.dir))
    out = base / "release"
    try:
        with threadpool_limits(1):
            rel, stats, _ = on_local_cluster(
                lambda ex: topdown_scaleout(nat, out, rho=RHO, rng=SEED, executor=ex, progress=False, **plan),
                res, args.workers, args.memory)
        res["seconds"] = rel.timings["total"]
        res["split_choice"] = rel.description.get("split_choice", {}).get("level_shares")
        res["error_summary"] = rel.description.get("error_summary")
        res["phases"] = rel.timings
        res["driver_peak_rss_mb"] = peak_rss_mb()
        res["worker_peak_rss_mb_each"] = sorted(s["peak_rss_mb"] for s in stats.values())
        res["units"] = rel.description["hierarchy"]["units"]
        res["leaves"] = res["units"][-1]
        res["published_counts"] = sum(res["units"]) * nat.cells.size
        res["violations_by_tasks"] = rel.check()
        # the truth of the invariant, from the generator (state by state), to check the published totals
        subs = [nat.subtree(q).counts[:2] for q in range(nat.states)]
        truth = np.array([int(c[0].sum()) for c in subs])
        counties = np.concatenate([c[1].sum(axis=1) for c in subs]) if "county:total" in plan["invariants"] else None
        del subs
        t0 = time.perf_counter()
        res["violations_read_back"] = verify(out, truth, counties)
        res["verify_seconds"] = time.perf_counter() - t0
        res["output_mb"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
        # one county's published counts from the release on disk, in a fresh process (nothing cached)
        res["one_county"] = one_unit_in_fresh_process(out, (f"{min(7, nat.states - 1):02d}", "011"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return res


def one_slice(args: argparse.Namespace) -> dict:
    nat = SyntheticNation(states=8, counties=10, tracts=10, blocks=125, seed=SEED)
    plan = _plan_args(args)
    res: dict = {"mode": "slice", "design": args.design, "invariants": plan["invariants"]}
    base = Path(tempfile.mkdtemp(prefix="bench-topdown-", dir=args.dir))
    try:
        with threadpool_limits(1):
            table = nat.table()
            res["units"] = list(table.hierarchy.sizes)
            res["leaves"] = table.hierarchy.sizes[-1]
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                a = topdown(table, rho=RHO, rng=SEED, **plan)
                times.append(time.perf_counter() - t0)
            res["inprocess_seconds"] = float(np.median(times))
            dtimes, b = [], None
            for r in range(args.reps):
                out = base / f"release{r}"
                rr: dict = {}
                b, _, _ = on_local_cluster(
                    lambda ex: topdown_scaleout(nat, out, rho=RHO, rng=SEED, executor=ex, progress=False, **plan),
                    rr, args.workers, args.memory)
                dtimes.append(b.timings["total"])
                res["dask_phases"] = b.timings
            res["dask_seconds"] = float(np.median(dtimes))
            res["ratio_dask_over_inprocess"] = res["dask_seconds"] / res["inprocess_seconds"]
            bt = b.to_topdown()
            same = {k: all(np.array_equal(x, y) for x, y in zip(getattr(a, k), getattr(bt, k)))
                    for k in ("counts", "estimate", "variance")}
            same["to_pandas"] = bool(a.to_pandas().equals(b.to_pandas()))
            same["ledger"] = [(e.label, e.cost.rho, e.rows, e.columns) for e in a.ledger] == [
                (e["label"], e["rho"], e["rows"], e["columns"]) for e in b.ledger]
            plain = json.loads(json.dumps(a.description, default=str))
            same["design"] = all(b.description.get(k) == plain.get(k)
                                 for k in ("levels", "skipped", "split_choice", "invariants", "exact_disclosures"))
            res["identical"] = same
            assert all(same.values()), same  # the chunked release is the in-process one, bit for bit
            res["violations_inprocess"] = a.check()
            res["violations_dask"] = bt.check()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--memory", default="2GB", help="memory limit per worker (default %(default)s)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions of the slice runs (medians)")
    ap.add_argument("--dir", default=None, help="where the release is written (default: the system's temp)")
    ap.add_argument("--skip-nation", action="store_true")
    ap.add_argument("--design", choices=("optimised", "equal"), default="optimised",
                    help="the default optimised design or the equal split (default %(default)s)")
    ap.add_argument("--invariants", default="state:total,county:total",
                    help="comma-separated invariants (default %(default)s)")
    ap.add_argument("--out", default=str(HERE / "results" / "topdown_scaleout.json"))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        os.environ.setdefault("TQDM_DISABLE", "1")
        res = one_nation(args) if args.one == "nation" else one_slice(args)
        print(json.dumps(res, default=float))
        return
    argv = ["--states", str(args.states), "--workers", str(args.workers), "--memory", args.memory,
            "--reps", str(args.reps), "--design", args.design, "--invariants", args.invariants] + (
        ["--dir", args.dir] if args.dir else [])
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    rows = [_spawn(__file__, "slice", argv, env)]
    if not args.skip_nation:
        rows.append(_spawn(__file__, "nation", argv, env))
    print(f"{'run':8} {'leaves':>10} {'seconds':>9} {'driver MB':>10} {'worker MB':>16} {'violations':>40}")
    for r in rows:
        if "error" in r:
            print(r["mode"], "ERROR", r["error"][-800:])
            continue
        if r["mode"] == "slice":
            print(f"{'slice':8} {r['leaves']:>10} {r['dask_seconds']:>9.2f} {'':>10} {'':>16} "
                  f"{str(r['violations_dask']):>40}")
            print(f"  in-process {r['inprocess_seconds']:.2f} s; dask / in-process = "
                  f"{r['ratio_dask_over_inprocess']:.2f}; identical: {r['identical']}")
            print(f"  phases: { {k: round(v, 2) for k, v in r['dask_phases'].items()} }")
        else:
            print(f"{'nation':8} {r['leaves']:>10} {r['seconds']:>9.1f} {r['driver_peak_rss_mb']:>10.0f} "
                  f"{str([round(x) for x in r['worker_peak_rss_mb_each']]):>16} {str(r['violations_read_back']):>40}")
            print(f"  phases: { {k: round(v, 1) for k, v in r['phases'].items()} }; tasks counted "
                  f"{r['violations_by_tasks']}")
    command = "python benchmarks/bench_topdown_scaleout.py " + " ".join(sys.argv[1:])
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for r in rows:
        r.update(command=command, date=when)
    p = Path(args.out)
    old = json.loads(p.read_text()) if p.is_file() else {}
    kept = old.get("rows", [])
    for r in kept:  # rows of earlier runs: their design and invariants said
        r.setdefault("design", "equal split (before the optimised default)")
        r.setdefault("invariants", old.get("invariants", ["state:total"]))
        r.setdefault("command", old.get("command"))
    out = {"benchmark": "topdown_scaleout", "rho": RHO, "seed": SEED,
           "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                       "note": "2 cores shared with other jobs: timings are noisy"},
           "rows": kept + rows}
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {p}")


if __name__ == "__main__":
    main()
