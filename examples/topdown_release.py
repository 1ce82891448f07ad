"""A TopDown release of the 2020 Census voting-district table: nation > state > county > district x 16 cells.

The table (``shared/datasets/census2020_vtd``, 157,050 voting districts of 47 states and DC, 2 age
groups x 8 Hispanic-origin / race groups, real P.L. 94-171 counts) is read with
``sparsedp.topdown.read_table``.  The release spends ``rho = 1`` (zCDP) in total, neighbours add or
remove one person, and:

* the budget split across the four levels is chosen by ``split="optimal"`` from the public design
  only (the hierarchy's shape, the cells, the queries, the invariant's form -- never the counts),
  minimising the expected mean absolute error per cell of the GLS estimate, every level counted
  the same;
* every state's total population is an **invariant**: published exactly, NOT private (as in the
  2020 Census);
* the counts are non-negative integers, every parent equals the sum of its children in every cell.

The script prints what a publisher would publish about the release (its summary, the split, the
ledger, the expected error from the public design), writes the release file, and loads it back
with ``sparsedp.load_release``.  Nothing it prints by default is computed from the true counts
except the released figures themselves.  ``--evaluate`` adds a comparison with the confidential
truth, clearly marked (for judging the method, not for publishing).

    python examples/topdown_release.py [CSV] [--out release.npz] [--force] [--rho 1.0] [--evaluate]
"""

import argparse
import time
from pathlib import Path

import numpy as np

import sparsedp
from sparsedp.topdown import read_table, topdown

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "census2020_vtd" / "us2020_vtd_race_eth_age.csv.gz"

ap = argparse.ArgumentParser()
ap.add_argument("csv", nargs="?", default=str(DATA), help="the voting-district table (default: the shared copy)")
ap.add_argument("--out", default="topdown_release.npz")
ap.add_argument("--force", action="store_true", help="replace --out if it exists (default: refuse)")
ap.add_argument("--rho", type=float, default=1.0)
ap.add_argument("--evaluate", action="store_true", help="also compare with the true counts (NOT a private output)")
args = ap.parse_args()
if not Path(args.csv).is_file():
    raise SystemExit(f"no table at {args.csv}: give the path of us2020_vtd_race_eth_age.csv.gz")
if Path(args.out).exists() and not args.force:  # refused before anything is measured, as the CLI does
    raise SystemExit(f"{args.out} exists: pass --force to replace it, or choose another --out")

t0 = time.perf_counter()
table = read_table(args.csv, geo="state_fips,county_fips,vtd_code", counts="vap_*,u18_*",
                   attributes=("age", "race"), root="nation")
h = table.hierarchy
print(f"read {Path(args.csv).name}: levels {list(h.levels)}, units {list(h.sizes)}, "
      f"{h.cells.size} cells per unit ({' x '.join(h.cells.names)})")

budget = sparsedp.Accountant(rho=args.rho)
rel = topdown(table, rho=args.rho, split="optimal", invariants=["state_fips:total"], accountant=budget,
              keep_noisy=False)  # rng=None: secure randomness from the OS
print(f"released in {time.perf_counter() - t0:.1f} s (read + plan + measure + estimate + round)")

choice = rel.design.split_choice  # chosen from the public design only
print("budget split (data-free optimum, every level weighted the same):")
for lp, share, err in zip(rel.design.levels, choice.level_shares, choice.predicted_mae):
    print(f"  {lp.name:12s} share {share:.4f}  rho {lp.budget:.4f}  expected MAE per cell of the GLS "
          f"estimate {err:.3f}")
print(f"ledger: {len(budget.ledger)} entries, rho spent {float(budget.spent_exact):.6f} of {args.rho}")
for e in budget.ledger:
    print(f"  {e.label}: rho {e.cost.rho:.4f}")
print("invariants (published exactly, NOT private):", rel.description.get("invariants"))
print("checks:", rel.check())

path = rel.save(args.out, overwrite=args.force)  # an earlier release is replaced only when asked
loaded = sparsedp.load_release(path)
frame = loaded.to_pandas()
print(f"saved {path.name} ({path.stat().st_size / 2**20:.1f} MB); loaded back with sparsedp.load_release: "
      f"{len(frame):,} units ({loaded.kind}: one row per unit), columns {list(frame.columns)}")
nation = frame[frame["depth"] == 0].iloc[0]
print("nation, released counts per cell:")
print("  " + ", ".join(f"{c}={int(nation[c]):,}" for c in h.cells.columns))

if args.evaluate:
    print("\n--- EVALUATION AGAINST THE CONFIDENTIAL TRUTH (for judging the method; not part of the release) ---")
    for d, name in enumerate(h.levels):
        err = np.abs(rel.counts[d] - table.counts[d]).mean()
        print(f"  {name:12s} mean absolute error per cell {err:.3f}")
