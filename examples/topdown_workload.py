"""A TopDown release designed for what it is for: the workload.

A small built-in table (nation > 3 states > 12 counties > about 240 districts, 2 age groups x 4
race groups per unit; seeded Poisson counts standing in for confidential data) is released with
``rho = 1`` (zCDP), every state's total invariant (published exactly, NOT private).

First, without touching the counts, the script compares designs of the same budget:

* the **default**: optimised for every unit's cells and total (``workload={"cells": 1, "total": 1}``);
* **totals first**: optimised for the units' totals only (``workload={"total": 1}``);
* **per level**: the default workload, but nobody reads the counties' cells (one mapping per
  level, root first; ``None`` keeps the default);
* the **plain** design (``split="equal"``): every level measures its cells with a quarter of the budget.

For each it prints the budget per level and what the level measures, then per level the standard
deviation of the GLS estimate of a cell and of a unit's total (``design.error_summary()``), and for
the optimised designs each workload term's predicted error relative to the plain design's
(``design.split_choice``).  All of it is computed from the public design (the hierarchy's shape,
the cells, the workload, the invariant's form), so printing it costs no privacy.

Then it makes one release with the default design (secure noise) and prints its ledger and checks.

    python examples/topdown_workload.py
"""

import numpy as np
import pandas as pd

from sparsedp import Accountant
from sparsedp.topdown import HierarchicalTable, plan_topdown, topdown
from sparsedp.topdown.cli import design_table

RHO = 1.0
INVARIANTS = ["state:total"]
AGES, RACES = ("adult", "child"), ("a", "b", "c", "d")


def small_table(seed: int = 0) -> HierarchicalTable:
    """nation > state > county > district x (age x race): 3 states of 4 counties, 10-30 districts
    per county, Poisson counts (many small ones, as in census blocks)."""
    gen = np.random.default_rng(seed)
    means = np.outer([3.0, 1.0], [8.0, 2.0, 1.0, 0.5]).ravel()
    rows = []
    for s in range(3):
        for c in range(4):
            for d in range(int(gen.integers(10, 31))):
                counts = gen.poisson(means * gen.uniform(0.2, 2.0))
                rows.append({"state": f"{s + 1:02d}", "county": f"{c + 1:03d}", "district": f"{d + 1:04d}",
                             **{f"{a}_{r}": int(x) for (a, r), x in zip([(a, r) for a in AGES for r in RACES], counts)}})
    return HierarchicalTable.from_counts(pd.DataFrame(rows), ["state", "county", "district"], "adult_*,child_*",
                                         attributes=("age", "race"), root="nation")


table = small_table()
h = table.hierarchy
print(f"table: levels {list(h.levels)}, units {list(h.sizes)}, {h.cells.size} cells per unit "
      f"({' x '.join(h.cells.names)}); rho {RHO}, invariant {INVARIANTS[0]} (exact, NOT private)\n")

designs = {
    "default (cells and totals)": plan_topdown(h, rho=RHO, invariants=INVARIANTS),
    "totals first": plan_topdown(h, rho=RHO, invariants=INVARIANTS, workload={"total": 1}),
    "per level (the counties' totals only)": plan_topdown(
        h, rho=RHO, invariants=INVARIANTS, workload=[None, None, {"total": 1}, {"cells": 1, "total": 1}]),
    "plain (split='equal')": plan_topdown(h, rho=RHO, invariants=INVARIANTS, split="equal"),
}  # no counts read: the hierarchy (public) only

for name, design in designs.items():
    print(f"== {name}")
    print(design_table(design))
    print("  sd of the GLS estimate (before rounding):   cell    total")
    for row in design.error_summary():
        print(f"    {row['level']:10s} {'(not measured)' if row['skipped'] else '':14s}"
              f"        {row['sd_cell']:6.3f}  {row['sd_total']:7.3f}")
    choice = design.split_choice
    if choice is not None:
        ratios = ", ".join(f"{lev} {m} {e / e0:.2f}x" for (lev, m), e, e0 in
                           zip(choice.terms, choice.predicted_term_mae, choice.plain_term_mae))
        print(f"  workload terms, predicted MAE relative to the plain design: {ratios}")
    print()

acc = Accountant(rho=RHO)
rel = topdown(table, rho=RHO, invariants=INVARIANTS, accountant=acc)  # the default design; secure noise
print("one release with the default design:")
for e in acc.ledger:
    print(f"  {e.label}: rho {e.cost.rho:.4f}")
print(f"  spent rho {float(acc.spent):.6f} of {RHO}; checks {rel.check()}")
nation = rel.to_pandas().iloc[0]
print("  nation, released counts per cell: " + ", ".join(f"{c}={int(nation[c])}" for c in h.cells.columns))
