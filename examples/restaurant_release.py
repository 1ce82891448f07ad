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
printed below are an evaluation on synthetic data, not part of a release.  The release ends in the
common model (``to_release()``: every consistent value labelled by its days and item, with its
exact variance and 95% interval, and the ledger), saved to a release file and read back with
``sparsedp.load_release``; because this run was evaluated against the truth, it is marked
``private=False``.
"""

import importlib.util
import sys
import tempfile
from pathlib import Path

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
release = restaurant_release(sales=sales, epsilon=1.0, accountant=budget,  # exact noise from OS entropy
                             evaluate=True)  # evaluation mode: also compare with the truth (not private)
res = release.result
print(f"{days} days, {release.noisy.size} released counts, Delta_1 = 5h = {release.sensitivity:g}, "
      f"{'exact discrete' if release.secure else 'float'} Laplace scale {release.scale:g}")
print(f"consistency: method {res.method}, {res.iterations} iteration(s), {res.seconds:.3f} s, "
      f"max|Cx-b| = {res.residual:.1e} (relative {res.relative_residual:.1e})")
print(f"evaluation (not private): RMSE per tree node: noisy {release.rmse_noisy:.2f} -> "
      f"consistent {release.rmse_consistent:.2f}")

rel = release.to_release()  # the common release model: labels lo, hi (days), item; exact variances
lower, upper = rel.confidence_intervals(0.95)
truth = release.truth.reshape(-1, 5)[0]
for k, (item, true) in enumerate(zip(ITEMS, truth)):  # the first node: all days, 5 items
    print(f"  total {item:<8} released {rel.answers[k]:10.1f}, 95% interval [{lower[k]:9.1f}, {upper[k]:9.1f}]"
          f"   (evaluation: true {true:8.0f})")

# the combos imposed at every node too (redundant rows), solved by one sparse factorisation instead of
# the exact tree x span two-pass: post-processing of the same noisy vector, so no budget is spent
other = solve(release.noisy, restaurant_constraints(days, "nodes"), method="direct")
print(f"combos at every node, direct factorisation: max difference {np.max(np.abs(other.x - release.x)):.1e}")
print(f"budget spent {budget.spent:g} of {budget.total:g}")
(entry,) = budget.ledger
print(f"ledger: {entry.label}, {entry.rows} rows, sensitivity {entry.sensitivity:g}, secure={entry.secure}, "
      f"private={entry.private}")

with tempfile.TemporaryDirectory() as tmp:
    back = sparsedp.load_release(rel.save(Path(tmp) / "restaurant.npz"))  # never the sales
    print(f"restaurant.npz: {len(back)} values, ledger total epsilon {back.epsilon:g}, private={back.private} "
          "(evaluated against the truth)")
    if importlib.util.find_spec("pandas"):  # to_pandas needs the io extra
        # the same intervals as the live release above: the file keeps each value's error shape
        print(back.to_pandas().head().round(1).to_string(index=False))
