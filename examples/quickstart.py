"""Quick start: answer every running sum of a histogram with a 16-ary tree strategy.

    python examples/quickstart.py
"""

import numpy as np

import sparsedp
from sparsedp import strategies, workloads

x = np.random.default_rng(0).poisson(20, size=1024)  # a histogram of counts
W = workloads.prefix(1024)  # answer every running sum
budget = sparsedp.Accountant(epsilon=1.0)  # refuses to be overspent

print(f"{'strategy':<22}{'Delta_1':>8}{'expected MSE':>14}{'this run':>12}")
for name, M in [
    ("identity", strategies.identity(1024)),
    ("hierarchical k=16", strategies.hierarchical(1024, branching=16)),
    ("fenwick", strategies.fenwick(1024)),
]:
    mech = sparsedp.MatrixMechanism(W, M, epsilon=0.25, accountant=budget)
    release = mech.run(x, rng=1)
    mse = np.mean((release.answers - np.cumsum(x)) ** 2)
    print(f"{name:<22}{mech.sensitivity:>8g}{mech.error_report().per_query:>14.1f}{mse:>12.1f}")

print(f"budget spent {budget.spent:g} of {budget.total:g}")
try:
    sparsedp.MatrixMechanism(W, strategies.haar(1024), epsilon=0.5, accountant=budget).measure(x)
except sparsedp.BudgetExceededError as exc:
    print("refused:", exc)
