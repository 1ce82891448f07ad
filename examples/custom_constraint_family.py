"""Plug a constraint family written from scratch into the consistency engine.

    python examples/custom_constraint_family.py

A noisy weekly release of three regions' daily counts must satisfy
  * a family we write here, ``WeeklyTotalsMatch``: for every week, the sum of region A's 7 days
    equals a published (exact, public) weekly total;
  * a built-in family: the three regions' counts on each day add up to a national count that is
    released separately (``LinearConstraints``).
A family only has to say what its rows are: ``rows(n) -> (C, b)`` with ``C`` sparse ``m x n``.
The daily counts are measured through the package's measurement path (exact discrete Laplace noise,
scale 4: epsilon = 0.25, from a seeded generator, so NOT private; omit the seed for a real
release), and the consistent counts end as a release path of your own in the common release model:
a ``ReleaseResult`` built by hand (labels ``region`` and ``day``, the measurement's ledger entry,
the noise variance as a bound on each value's variance: an orthogonal projection never raises it),
with 95% intervals, saved to a release file in a temporary directory and read back with
``sparsedp.load_release``.  The RMSEs against the true counts are an evaluation.
"""

import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import sparsedp
from sparsedp import strategies
from sparsedp.consistency import ConstraintFamily, LinearConstraints, solve
from sparsedp.releases import ReleaseResult, axis_labels


class WeeklyTotalsMatch(ConstraintFamily):
    """``sum(x[start + 7w : start + 7w + 7]) = totals[w]`` for every week ``w``."""

    name = "weekly-totals"

    def __init__(self, start: int, totals: np.ndarray) -> None:
        self.start, self.totals = start, np.asarray(totals, dtype=float)

    def rows(self, n: int):
        weeks = self.totals.size
        cols = self.start + np.arange(7 * weeks)
        C = sp.csr_matrix((np.ones(7 * weeks), (np.repeat(np.arange(weeks), 7), cols)), shape=(weeks, n))
        return C, self.totals


rng = np.random.default_rng(0)
days, regions = 28, 3
truth = rng.poisson(50, size=(regions, days)).astype(float)  # region-major: x[r * days + t]
x = truth.ravel()
# one person adds 1 to one region's count on one day (L1 sensitivity 1): scale 4 is epsilon = 0.25
meas = sparsedp.measure(strategies.identity(x.size), x, epsilon=0.25, rng=rng, label="3 regions x 28 days")
noisy = meas.y

weekly = truth[0].reshape(4, 7).sum(axis=1)  # public weekly totals of region A
national = truth.sum(axis=0)  # per-day national counts (treated here as exact)
C_nat = sp.hstack([sp.identity(days)] * regions, format="csr")
fams = [WeeklyTotalsMatch(0, weekly), LinearConstraints(C_nat, national, name="national")]

for method in ("generic", "direct", "alternating", "accelerated"):
    res = solve(noisy, fams, method=method, truth=x)
    print(f"{method:<12} iterations {res.iterations:>5}  max|Cx-b| {res.residual:8.1e}  "
          f"evaluation: RMSE {np.sqrt(np.mean((res.x - x) ** 2)):.3f} (noisy {np.sqrt(np.mean((noisy - x) ** 2)):.3f})")
res = solve(noisy, fams, method="direct")
print("region A weekly sums:", np.round(res.x[:days].reshape(4, 7).sum(axis=1), 6), "published:", weekly)

# a release path of your own, in the common release model (the projection is post-processing)
rel = ReleaseResult(kind="regions", answers=res.x, labels=axis_labels((regions, days), ["region", "day"]),
                    variances=meas.variances[0], variance_method="bound", noise="laplace", secure=meas.secure,
                    strategy="every (region, day) count, projected on the weekly and national totals",
                    ledger=[meas.entry])
lower, upper = rel.confidence_intervals(0.95)  # conservative: the variances are upper bounds
print(f"region A, day 1: {rel.answers[0]:.1f}, 95% interval [{lower[0]:.1f}, {upper[0]:.1f}]")
with tempfile.TemporaryDirectory() as tmp:
    back = sparsedp.load_release(rel.save(Path(tmp) / "regions.npz"))
    print(f"regions.npz: {len(back)} values, ledger total epsilon {back.epsilon:g}, private={back.private} (seeded)")
