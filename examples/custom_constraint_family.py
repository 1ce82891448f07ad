"""Plug a constraint family written from scratch into the consistency engine.

    python examples/custom_constraint_family.py

A noisy weekly release of three regions' daily counts must satisfy
  * a family we write here, ``WeeklyTotalsMatch``: for every week, the sum of region A's 7 days
    equals a published (exact, public) weekly total;
  * a built-in family: the three regions' counts on each day add up to a national count that is
    released separately (``LinearConstraints``).
A family only has to say what its rows are: ``rows(n) -> (C, b)`` with ``C`` sparse ``m x n``.
"""

import numpy as np
import scipy.sparse as sp

from sparsedp.consistency import ConstraintFamily, LinearConstraints, solve


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
noisy = x + rng.laplace(0, 4.0, x.size)

weekly = truth[0].reshape(4, 7).sum(axis=1)  # public weekly totals of region A
national = truth.sum(axis=0)  # per-day national counts (treated here as exact)
C_nat = sp.hstack([sp.identity(days)] * regions, format="csr")
fams = [WeeklyTotalsMatch(0, weekly), LinearConstraints(C_nat, national, name="national")]

for method in ("generic", "direct", "alternating", "accelerated"):
    res = solve(noisy, fams, method=method, truth=x)
    print(f"{method:<12} iterations {res.iterations:>5}  max|Cx-b| {res.residual:8.1e}  "
          f"RMSE {np.sqrt(np.mean((res.x - x) ** 2)):.3f} (noisy {np.sqrt(np.mean((noisy - x) ** 2)):.3f})")
res = solve(noisy, fams, method="direct")
print("region A weekly sums:", np.round(res.x[:days].reshape(4, 7).sum(axis=1), 6), "published:", weekly)
