"""Quick start: answer every running sum of a histogram with a 16-ary tree strategy.

The last release ends in the common release model (``to_release()``: labelled answers, exact
variances, 95% intervals, the ledger), saved to a release file in a temporary directory and read
back with ``sparsedp.load_release``.  The errors against the true running sums ("this run") are an
evaluation, not part of a release.

    python examples/quickstart.py
"""

import tempfile
from pathlib import Path

import numpy as np

import sparsedp
from sparsedp import strategies, workloads

x = np.random.default_rng(0).poisson(20, size=1024)  # a histogram of counts
W = workloads.prefix(1024)  # answer every running sum
budget = sparsedp.Accountant(epsilon=1.0)  # refuses to be overspent

print(f"{'strategy':<20}{'Delta_1':>8}{'expected MSE':>14}{'this run':>10}{'Var(first)':>12}{'Var(last)':>11}")
for name, M in [
    ("identity", strategies.identity(1024)),
    ("hierarchical k=16", strategies.hierarchical(1024, branching=16)),
    ("fenwick", strategies.fenwick(1024)),
]:
    mech = sparsedp.MatrixMechanism(W, M, epsilon=0.25, accountant=budget)  # exact noise by default
    release = mech.run(x)  # noise from OS entropy: a private release
    report = mech.error_report()
    mse = np.mean((release.answers - np.cumsum(x)) ** 2)
    v = report.variances
    print(f"{name:<20}{mech.sensitivity:>8g}{report.per_query:>14.1f}{mse:>10.1f}{v[0]:>12.1f}{v[-1]:>11.1f}")

# Why "this run" differs from "expected": the expected MSE averages each answer's variance; one run
# is a single draw, and with the identity strategy the errors of all running sums are one random
# walk (answer t adds up t noisy bins, Var grows from ~32 to ~32,000), so one run's mean can land
# far from the expected value. Each answer's variance and a 95% interval are in the report:
# the common release model: labels lo, hi; exact variances; the ledger (private=False: the table above
# compared this run with the true counts, an evaluation, not a publication)
rel = release.to_release(private=False)
lo, hi = rel.confidence_intervals(0.95)
print(f"last running sum: {rel.answers[-1]:.0f}, 95% interval [{lo[-1]:.0f}, {hi[-1]:.0f}]")
with tempfile.TemporaryDirectory() as tmp:
    back = sparsedp.load_release(rel.save(Path(tmp) / "running_sums.npz"))  # never the data
    print(f"running_sums.npz: {len(back)} answers, ledger total epsilon {back.epsilon:g}, private={back.private}")

print(f"budget spent {budget.spent:g} of {budget.total:g}")
try:
    sparsedp.MatrixMechanism(W, strategies.haar(1024), epsilon=0.5, accountant=budget).measure(x)
except sparsedp.BudgetExceededError as exc:
    print("refused:", exc)
