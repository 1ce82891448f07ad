"""Bring your own workload: optimise the strategy for queries written as a sparse matrix.

A year of daily counts (n = 364 days = 52 weeks).  The analyst wants, with pure DP:

* every weekly total (52 queries),
* every 4-week "month" total (13 queries),
* the year-to-date total at the end of each month (13 prefix queries),
* the difference between consecutive weeks (51 contrasts, entries +1 / -1).

The workload is a scipy sparse matrix; ``sparsedp.optimize`` returns the strategy with the lowest
exact expected error for it, never worse than the fixed templates, and the mechanism measures it.
The release ends in the common model (``to_release()``: one answer per query, its exact variance
and 95% interval, the ledger), saved to a release file in a temporary directory and read back with
``sparsedp.load_release``.  The squared error against the true answers is an evaluation on
synthetic data, not part of a release.

    python examples/optimize_custom_workload.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp

import sparsedp


def build_workload(n_weeks: int = 52) -> sp.csr_matrix:
    n = 7 * n_weeks
    rows = []
    week = sp.kron(sp.identity(n_weeks), np.ones((1, 7)), format="csr")  # weekly totals
    rows.append(week)
    rows.append(sp.kron(sp.identity(n_weeks // 4), np.ones((1, 28)), format="csr"))  # 4-week totals
    ends = np.arange(28, n + 1, 28)
    rows.append(sp.csr_matrix((np.arange(n)[None, :] < ends[:, None]).astype(float)))  # year to date
    diff = sp.diags([-np.ones(n_weeks - 1), np.ones(n_weeks - 1)], [0, 1], shape=(n_weeks - 1, n_weeks))
    rows.append(sp.csr_matrix(diff @ week))  # week-on-week changes
    return sp.vstack(rows, format="csr")


def main() -> None:
    W = build_workload()
    print(f"workload: {W.shape[0]} queries over {W.shape[1]} days, {W.nnz} non-zeros")

    res = sparsedp.optimize(W, noise="laplace", rng=0, time_limit=30)
    print(f"chosen: {res.family} / {res.name}, {res.seconds:.1f} s")
    print(f"expected total squared error at eps = 1: {res.error.total:.4g} ({res.error.per_query:.3g} per query)")
    best = res.best_template()
    print(f"best template: {best.name} {best.error:.4g}  -> ratio {res.error.total / best.error:.3f}")
    for t in res.history:
        print(f"   {t.family:<10} {t.name:<34} {t.error:12.4g}  {t.seconds:6.2f} s  {t.note}")

    # measure a (synthetic) year of counts with the optimised strategy
    rng = np.random.default_rng(1)
    x = rng.poisson(120 + 40 * np.sin(np.arange(W.shape[1]) * 2 * np.pi / 7))
    eps = 0.5
    mech = sparsedp.MatrixMechanism(W, res.strategy, epsilon=eps)
    release = mech.run(x, rng=2)
    truth = W @ x
    print(f"one release at eps = {eps}: squared error {np.sum((release.answers - truth) ** 2):.4g} (evaluation), "
          f"expected {res.error_at(epsilon=eps):.4g}")

    rel = release.to_release()  # the common release model: one answer per row of W, exact variances
    lower, upper = rel.confidence_intervals(0.95)
    print(f"week 1 total: {rel.answers[0]:.1f}, 95% interval [{lower[0]:.1f}, {upper[0]:.1f}]; "
          f"variances {rel.variance_method}")
    with tempfile.TemporaryDirectory() as tmp:
        back = sparsedp.load_release(rel.save(Path(tmp) / "custom_workload.npz"))
        print(f"custom_workload.npz: {len(back)} answers, ledger total epsilon {back.epsilon:g}, "
              f"private={back.private} (seeded)")


if __name__ == "__main__":
    main()
