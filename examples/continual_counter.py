"""Continual release of a running count (seed 000): a hospital's monthly HIV+ admissions.

Every month the hospital publishes the running total of HIV+ admissions; next month's number is
unknown when this month's total goes out.  The optimally weighted Fenwick counter publishes all 120
monthly totals of ten years under one budget epsilon = 1, charged once to an Accountant when the
counter is created, and its state survives a restart.  Each increment is a count of admissions (one
patient adds 1 to one month): the counter refuses anything that is not a non-negative integer.  The
noise is exact discrete Laplace noise (the default, ``secure=True``; ``secure=False`` would use
float64 noise, which leaks through its low bits), drawn through the one measurement path
(``sparsedp.measure``): the accountant's ledger records the measurement.  The seeds below make the run
reproducible, which is for a demonstration only: a seeded run is NOT private (omit ``rng`` to draw the
noise from operating-system entropy).  The GLS tree counter's 120 values end in the common release
model (``to_release()``: one answer per month, its exact variance and 95% interval, the ledger),
saved to a release file in a temporary directory and read back with ``sparsedp.load_release``;
the counter's own ``save`` writes its state, which holds the exact running sums and is never
published.  The true totals and errors printed are an evaluation, not part of a release.

    python examples/continual_counter.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparsedp import Accountant, BudgetExceededError, InputBoundError, load_release  # noqa: E402
from sparsedp.continual import (  # noqa: E402
    ContinualCounter,
    GLSTreeCounter,
    expected_error,
    gls_tree_error,
    honaker_variance,
    optimal_weights,
)

N, EPS = 120, 1.0
admissions = np.random.default_rng(7).poisson(450, N).astype(float)  # a_t: new HIV+ admissions in month t
admissions[:3] = [531, 392, 426]  # the seed's Table 5.2

budget = Accountant(epsilon=2 * EPS)  # two releases below, each of cost EPS
counter = ContinualCounter(N, epsilon=EPS, rng=2026, accountant=budget)
print(f"horizon {N} months, epsilon {EPS}: Laplace scale {counter.scale:.3f} / lambda_i per node, exact noise "
      f"(Delta_1(Sigma M) = {counter.sensitivity:.6f})")
print("month  true total (evaluation)  published   std")
published = []
with tempfile.TemporaryDirectory() as tmp:
    state = Path(tmp) / "counter.json"
    for t, a in enumerate(admissions, start=1):
        if t == 61:  # the server restarts after five years: resume from the saved state
            # the noise continues from the key saved in the state (a replayed month would repeat its
            # published value); the parameters must be those of the saved run, else it is refused
            counter = ContinualCounter.load(state, horizon=N, epsilon=EPS)
        published.append(counter.update(a))
        counter.save(state)
        if t <= 3 or t % 24 == 0:
            print(f"{t:5d}  {admissions[:t].sum():23.0f}  {published[-1]:9.1f}  {counter.last_variance ** 0.5:5.1f}")
try:
    counter.update(400)
except BudgetExceededError as exc:
    print("month 121:", exc)
try:
    ContinualCounter(N, epsilon=EPS).update(-3)
except InputBoundError as exc:
    print("a negative count:", exc)

err = np.asarray(published) - np.cumsum(admissions)
fda = expected_error(N, optimal_weights(N), epsilon=EPS)
plain = expected_error(N, np.ones(N), epsilon=EPS)
print(f"expected per-step variance: FDA {fda.mean:.1f}, unweighted Fenwick {plain.mean:.1f}, "
      f"Honaker streaming {honaker_variance(N, EPS).mean():.1f}; this run's mean squared error {np.mean(err ** 2):.1f}")

# the lowest-error pure-DP counter here: every node of a 12-ary tree measured, full GLS estimate
gls = GLSTreeCounter(N, EPS, rng=2026, accountant=budget)
gls_err = gls.run(admissions) - np.cumsum(admissions)
print(f"GLS tree: expected per-step variance {gls_tree_error(N, EPS).mean:.1f}; "
      f"this run's mean squared error {np.mean(gls_err ** 2):.1f}")
print(f"budget spent: {budget.spent} of {budget.total} ({len(budget.history)} releases)")
for entry in budget.ledger:
    print(f"  ledger: {entry.label}: {entry.rows} rows, {entry.noise}, secure={entry.secure}, "
          f"private={entry.private}, epsilon={entry.cost.epsilon}")

rel = gls.to_release()  # the common release model: label step (1..120), exact variances, the ledger
lower, upper = rel.confidence_intervals(0.95)
print(f"GLS tree release: {len(rel)} steps, month 120: {rel.answers[-1]:.1f}, "
      f"95% interval [{lower[-1]:.1f}, {upper[-1]:.1f}]")
with tempfile.TemporaryDirectory() as tmp:
    back = load_release(rel.save(Path(tmp) / "gls_counter.npz"))  # the released values, not the state
    print(f"gls_counter.npz: {back.kind}, {len(back)} values, ledger total epsilon {back.epsilon:g}, "
          f"private={back.private} (seeded)")
