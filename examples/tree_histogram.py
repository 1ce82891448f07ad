"""Publish a histogram with LUE-DPTree and answer range counts; compare with Boost and Dwork.

Noise is exact discrete Laplace by default (``secure=True``); ``secure=False`` is the float-noise
opt-out, for experiments.  The accountant's ledger records every measurement.  The LUE-DPTree
histogram ends as a release of the common model (``to_release()``: one answer per bin, its exact
variance and 95% interval, the ledger), saved to a release file and read back with
``sparsedp.load_release``.  The comparisons with the true counts are an evaluation on synthetic
data, not part of a release.

    python examples/tree_histogram.py
"""

import tempfile
from pathlib import Path

import numpy as np

import sparsedp
from sparsedp.datasets import synthetic_histogram
from sparsedp.trees import Boost, Dwork, LUEDPTree, path_sums

x = synthetic_histogram(4096, seed=0)  # counts in 4096 bins
rng = np.random.default_rng(1)  # a seeded generator: reproducible, NOT for real releases
a, b = rng.integers(0, x.size, 1000), rng.integers(0, x.size, 1000)
queries = np.column_stack([np.minimum(a, b), np.maximum(a, b)])  # inclusive, 0-based
cs = np.concatenate(([0], np.cumsum(x)))
truth = cs[queries[:, 1] + 1] - cs[queries[:, 0]]

budget = sparsedp.Accountant(epsilon=1.5)
lue = LUEDPTree(epsilon=0.5, accountant=budget).fit(x, rng=rng)  # SC tree, per-node budgets, BLUE
print(f"LUE-DPTree: {lue.tree_.size} nodes, {lue.tree_.levels} levels, root branching {lue.tree_.degree[0]}")
print(f"every root-to-leaf path spends {path_sums(lue.tree_, lue.eps_per_node_).max():.6f} (epsilon 0.5)")
print(f"count of bins 100..199: {lue.range(100, 199):.1f} (evaluation, true {x[100:200].sum()})")

print(f"{'method':<12}{'MSE of 1000 random ranges (evaluation)':>40}")
for pub in (lue, Boost(0.5, accountant=budget).fit(x, rng=rng), Dwork(0.5, accountant=budget).fit(x, rng=rng)):
    print(f"{pub.name:<12}{np.mean((pub.ranges(queries) - truth) ** 2):>40.1f}")
try:
    LUEDPTree(0.5, accountant=budget).fit(x, rng=rng)
except sparsedp.BudgetExceededError as exc:
    print("refused:", exc)
print("ledger (seeded generator, so private=False):")
for e in budget.ledger:
    print(f"  {e.label:<22} epsilon {e.cost.epsilon:g}, {e.rows} rows, sensitivity {e.sensitivity:g}, "
          f"scales {e.scale_min:.3g}..{e.scale_max:.3g}, {'exact' if e.secure else 'float'} noise, private={e.private}")

# the release every sparsedp release converts to: labelled answers, variances, intervals, ledger
rel = lue.to_release()
lower, upper = rel.confidence_intervals(0.95)  # one interval per bin, for the noise drawn
print(f"release: {len(rel)} bins ({rel.kind}, variances {rel.variance_method}); "
      f"bin 100: {rel.answers[100]:.1f}, 95% interval [{lower[100]:.1f}, {upper[100]:.1f}]")
with tempfile.TemporaryDirectory() as tmp:
    path = rel.save(Path(tmp) / "lue_histogram.npz")  # the estimate, the tree, the variances, the ledger
    back = sparsedp.load_release(path)
    print(f"{path.name} loaded: {len(back)} answers, ledger total epsilon {back.epsilon:g}, private={back.private}")
