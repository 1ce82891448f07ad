"""A single-state file released the natural way: does a level that carries no information cost budget?

Data: one state's rows of ``../shared/datasets/census2020_vtd/us2020_vtd_race_eth_age.csv.gz``
(default Wisconsin, ``55``: 72 counties, 7,059 voting districts, 16 cells), written to a CSV with
its codes as text.  The natural call keeps the national file's geography columns,
``--geo state_fips,county_fips,vtd_code``, so the hierarchy is root (1 unit) > state (1 unit, equal
to the root) > county > district; the state total is invariant, ``rho = 1``, equal split (the
default).  A second row reads the same file with the state as the root (``--geo
county_fips,vtd_code --root state``): the hierarchy without the redundant level.  Per level: the
mean absolute error per cell and per geography total (a unit's sum over its cells) over all units,
mean (and standard error) over releases; the rho charged (ledger) against the rho requested.

    python benchmarks/bench_topdown_single_state.py [--state 55] [--reps 50] [--out FILE]
    python benchmarks/bench_topdown_single_state.py --shared [--reps 50]   # the whole table, root:cells
    python benchmarks/bench_topdown_single_state.py --paired [--reps 100]  # default vs equal split, paired

``--shared``: the whole table (nation > state > county > district), the state totals and every
cell of the nation invariant (``nation:cells``: the root is then determined by the invariants);
then the same table with a first geography column of one unit (``country = US``: nation > country
> state > county > district, the country's units the nation's), the state totals invariant.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
if "SPARSEDP_SRC" in os.environ:  # measure another checkout (e.g. the code before a change)
    sys.path.insert(0, os.environ["SPARSEDP_SRC"])
else:
    sys.path.insert(0, str(HERE.parent))

from sparsedp.privacy import Accountant  # noqa: E402
from sparsedp.topdown import plan_topdown, read_table, topdown  # noqa: E402

DATA = HERE.parent.parent / "shared" / "datasets" / "census2020_vtd" / "us2020_vtd_race_eth_age.csv.gz"
COUNTS = "vap_*,u18_*"


def state_csv(state: str, folder: str) -> Path:
    """The rows of one state, as a CSV file (codes kept as written: text)."""
    out = Path(folder) / f"state_{state}.csv"
    with gzip.open(DATA, "rt") as src, open(out, "w") as dst:
        header = src.readline()
        dst.write(header)
        for line in src:
            if line.startswith(state + ","):
                dst.write(line)
    return out


def with_country(folder: str) -> Path:
    """The whole table with a first geography column ``country`` holding one unit (``US``)."""
    out = Path(folder) / "with_country.csv"
    with gzip.open(DATA, "rt") as src, open(out, "w") as dst:
        dst.write("country," + src.readline())
        for line in src:
            dst.write("US," + line)
    return out


def summarise(rows: list[list[float]], levels: list[str]) -> dict[str, dict[str, float]]:
    a = np.asarray(rows)
    se = a.std(axis=0, ddof=1) / np.sqrt(a.shape[0])
    return {lv: {"mean": float(a[:, i].mean()), "se": float(se[i])} for i, lv in enumerate(levels)}


def run_row(path: Path, name: str, geo: str, root: str, reps: int, rho: float, invariant: Any) -> dict[str, Any]:
    table = read_table(path, geo, COUNTS, attributes=("age", "race"), root=root)
    invariants = [invariant] if isinstance(invariant, str) else list(invariant)
    h = table.hierarchy
    truth = table.counts
    cell_err, total_err, spent, secs = [], [], [], []
    rel = None
    for r in range(reps):
        acc = Accountant(rho=rho)
        t0 = time.perf_counter()
        rel = topdown(table, rho=rho, invariants=invariants, accountant=acc, rng=np.random.default_rng([7, r]),
                      keep_noisy=False)
        secs.append(time.perf_counter() - t0)
        spent.append(float(acc.spent))
        cell_err.append([float(np.abs(c - t).mean()) for c, t in zip(rel.counts, truth)])
        total_err.append([float(np.abs(c.sum(axis=1) - t.sum(axis=1)).mean()) for c, t in zip(rel.counts, truth)])
        assert sum(rel.check().values()) == 0
    levels = list(h.levels)
    desc = rel.description
    out = {"name": name, "geo": geo, "root": root, "releases": reps, "levels": levels, "units": list(h.sizes),
           "rho_requested": rho, "rho_ledger": spent[0], "rho_description": desc.get("rho"),
           "split": [lv.get("rho") for lv in desc.get("levels", [])],
           "skipped": desc.get("skipped", []),
           "cell_mae": summarise(cell_err, levels), "total_mae": summarise(total_err, levels),
           "seconds_per_release": float(np.median(secs))}
    print(f"{name}: {' > '.join(f'{lv} {n}' for lv, n in zip(levels, h.sizes))}; rho ledger {spent[0]:.4f} of "
          f"{rho} (description {desc.get('rho')}); split {out['split']}; {reps} releases, "
          f"{np.median(secs):.2f} s each", flush=True)
    for lv in levels:
        c, t = out["cell_mae"][lv], out["total_mae"][lv]
        print(f"  {lv:10s} cell MAE {c['mean']:.3f} ({c['se']:.3f})   total MAE {t['mean']:.3f} ({t['se']:.3f})",
              flush=True)
    return out


def paired_with_equal_split(path: Path, reps: int, rho: float) -> dict[str, Any]:
    """The state as the root, the default design against the equal split on the same seeds
    ``[7, r]``: per level the mean per-cell and per-total MAE of each, and their paired difference
    (default - equal) with its standard error."""
    table = read_table(path, "county_fips,vtd_code", COUNTS, attributes=("age", "race"), root="state")
    inv = ["state:total"]
    designs = {"equal": plan_topdown(table.hierarchy, rho=rho, invariants=inv, split="equal"),
               "default": plan_topdown(table.hierarchy, rho=rho, invariants=inv)}
    errs: dict[str, list[list[float]]] = {k: [] for k in designs}
    for r in range(reps):
        for k, design in designs.items():
            rel = topdown(table, design=design, invariants=inv, rng=np.random.default_rng([7, r]), keep_noisy=False)
            assert sum(rel.check().values()) == 0
            errs[k].append([float(np.abs(c - t).mean()) for c, t in zip(rel.counts, table.counts)]
                           + [float(np.abs(c.sum(axis=1) - t.sum(axis=1)).mean()) for c, t in zip(rel.counts, table.counts)])
    levels = list(table.hierarchy.levels)
    a, b = np.asarray(errs["default"]), np.asarray(errs["equal"])
    diff = a - b
    se = diff.std(axis=0, ddof=1) / np.sqrt(reps)
    out: dict[str, Any] = {"name": "state as the root, default vs equal split (paired)", "releases": reps,
                           "levels": levels}
    for j, what in enumerate(("cell_mae", "total_mae")):
        sl = slice(j * len(levels), (j + 1) * len(levels))
        out[what] = {lv: {"default": float(x), "equal": float(y), "paired_diff": float(d), "paired_se": float(e)}
                     for lv, x, y, d, e in zip(levels, a[:, sl].mean(0), b[:, sl].mean(0), diff[:, sl].mean(0), se[sl])}
    for lv in levels:
        c, t = out["cell_mae"][lv], out["total_mae"][lv]
        print(f"  {lv:10s} cell MAE {c['default']:.4f} vs {c['equal']:.4f} (paired {c['paired_diff']:+.4f} "
              f"+- {c['paired_se']:.4f})   total MAE {t['default']:.3f} vs {t['equal']:.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", default="55", help="the state's FIPS code (default %(default)s: Wisconsin)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--rho", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--shared", action="store_true", help="the whole table with nation:cells invariant")
    ap.add_argument("--paired", action="store_true",
                    help="the state as the root: the default design against the equal split, same seeds")
    args = ap.parse_args()
    if args.paired:
        with tempfile.TemporaryDirectory() as tmp:
            row = paired_with_equal_split(state_csv(args.state, tmp), args.reps, args.rho)
        if args.out:
            Path(args.out).write_text(json.dumps({"state": args.state, "rows": [row]}, indent=1) + "\n")
        return
    if args.shared:
        rows = [run_row(DATA, "shared table, state totals and nation:cells invariant",
                        "state_fips,county_fips,vtd_code", "nation", args.reps, args.rho,
                        ["state_fips:total", "nation:cells"])]
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run_row(with_country(tmp), "shared table with a first column of one unit (country)",
                                "country,state_fips,county_fips,vtd_code", "nation", args.reps, args.rho,
                                "state_fips:total"))
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = state_csv(args.state, tmp)
        rows = [run_row(path, "natural call (--geo state_fips,county_fips,vtd_code)", "state_fips,county_fips,vtd_code",
                        "root", args.reps, args.rho, "state_fips:total"),
                run_row(path, "state as the root (--geo county_fips,vtd_code --root state)", "county_fips,vtd_code",
                        "state", args.reps, args.rho, "state:total")]
    if args.out:
        Path(args.out).write_text(json.dumps({"state": args.state, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
