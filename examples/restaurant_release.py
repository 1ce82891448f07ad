"""Seed 002's restaurant: a DP release of five item trees, made consistent with two families.

    python examples/restaurant_release.py [days]

One order (a combo of up to 5 items on one day) moves each item's binary tree by up to its count at
every level, so the tree measurements have L1 sensitivity 5h and Laplace(5h / epsilon) noise is
epsilon-DP.  The release checks the sales (non-negative integer orders, item sales equal to
orders @ COMBOS) before it charges the budget, and draws exact discrete Laplace noise from OS
entropy through the package's one measurement path (``secure=False`` would draw float noise, an
opt-out for experiments); the accountant's ledger records the measurement.  The consistent
release (parent = sum of children, every node's 5 counts in the span of the combos) is
post-processing: it costs no privacy and lowers the error.  The comparisons with the true sales
printed below are an evaluation on synthetic data, not part of a release.
"""

import sys

import numpy as np

import sparsedp
from sparsedp.consistency import (
    ITEMS,
    restaurant,
    restaurant_constraints,
    restaurant_release,
    solve,
)

days = int(sys.argv[1]) if len(sys.argv) > 1 else 365
sales = restaurant(days, seed=7)  # synthetic orders and item sales (the secret data)
budget = sparsedp.Accountant(epsilon=1.0)
rel = restaurant_release(sales=sales, epsilon=1.0, accountant=budget,  # exact noise from OS entropy
                         evaluate=True)  # evaluation mode: also compare with the truth (not private)
res = rel.result
print(f"{days} days, {rel.noisy.size} released counts, Delta_1 = 5h = {rel.sensitivity:g}, "
      f"{'exact discrete' if rel.secure else 'float'} Laplace scale {rel.scale:g}")
print(f"consistency: method {res.method}, {res.iterations} iteration(s), {res.seconds:.3f} s, "
      f"max|Cx-b| = {res.residual:.1e} (relative {res.relative_residual:.1e})")
print(f"evaluation (not private): RMSE per tree node: noisy {rel.rmse_noisy:.2f} -> consistent {rel.rmse_consistent:.2f}")

root = rel.x.reshape(-1, 5)[0]  # the all-days totals, consistent with the combos
truth = rel.truth.reshape(-1, 5)[0]
for item, est, true in zip(ITEMS, root, truth):
    print(f"  total {item:<8} released {est:10.1f}   true {true:8.0f}")

# the combos imposed at every node too (redundant rows), solved by one sparse factorisation instead of
# the exact tree x span two-pass: post-processing of the same noisy vector, so no budget is spent
other = solve(rel.noisy, restaurant_constraints(days, "nodes"), method="direct")
print(f"combos at every node, direct factorisation: max difference {np.max(np.abs(other.x - rel.x)):.1e}")
print(f"budget spent {budget.spent:g} of {budget.total:g}")
(entry,) = budget.ledger
print(f"ledger: {entry.label}, {entry.rows} rows, sensitivity {entry.sensitivity:g}, secure={entry.secure}, "
      f"private={entry.private}")
