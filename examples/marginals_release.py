"""Release all 2-way marginals of a real table (the Palmer penguins) at ResidualPlanner's optimum (zCDP).

The table: 344 penguins, 8 attributes (species, island, sex, year, and four body measurements
binned on fixed public edges, a "missing" code for missing values; sparsedp.datasets.penguins,
from the CSV inside the ``palmerpenguins`` wheel, the ``data`` extra).  Without that package the
example runs on synthetic records on the same domain (sparsedp.datasets.demo_table says which).
Every 2-way marginal and every 1-way marginal they contain is released with exact discrete
Gaussian noise through the package's measurement path, the budget is charged once, each marginal
comes with its exact per-cell variance, and the consistent non-negative version
(sparsedp.marginals.nonnegative_marginals, post-processing) is computed too.  With
``--plot FILE.png`` (matplotlib, the ``plot`` extra) a few released marginals are drawn against
the true ones, each released cell with its 95% interval.  The release ends in the common model
(``to_release()``: one answer per cell, labelled by its marginal and attribute codes, with its exact
variance and interval, and the ledger), saved to a release file in a temporary directory and read
back with ``sparsedp.load_release``.  The true marginals printed and drawn are an evaluation, not
part of a release (so the release is marked ``private=False``).

    python examples/marginals_release.py [--rho 0.5] [--plot marginals.png]
"""

import argparse
import importlib.util
import tempfile
from pathlib import Path

import numpy as np

import sparsedp
from sparsedp.datasets import demo_table
from sparsedp.marginals import marginal_tables, marginals_up_to, nonnegative_marginals, release_marginals

ap = argparse.ArgumentParser()
ap.add_argument("--rho", type=float, default=0.5)
ap.add_argument("--plot", default=None)
args = ap.parse_args()

table = demo_table()  # the penguins if palmerpenguins is installed, else synthetic records
X, dom = table.records, table.domain
print(f"data: {table.source}; domain {dict(zip(dom.names, dom.sizes))} ({dom.size:,} cells)")
work = marginals_up_to(dom, 2, exact=True)

budget = sparsedp.Accountant(rho=1.0)
release = release_marginals(X, dom, work, rho=args.rho, accountant=budget)  # exact noise from OS entropy
nn = nonnegative_marginals(release, iters=2000)  # post-processing: no budget
print(f"{len(release.marginals)} marginals released; rho spent {budget.spent} of 1.0 in "
      f"{len(budget.ledger)} ledger entry; certified loss {release.loss:.9f}")
print(f"expected total squared error (sum of all cells' variances): {release.sum_of_variances():.1f}; "
      f"ResidualPlanner's optimum {release.selection.value:.1f}")

rel = release.to_release(private=False)  # the common model: every cell, labelled, with its variance
# (private=False: this run is evaluated against the true marginals below, an evaluation, not a publication)
lower, upper = rel.confidence_intervals(0.95)
with tempfile.TemporaryDirectory() as tmp:
    back = sparsedp.load_release(rel.save(Path(tmp) / "marginals.npz"))  # never the records
    print(f"marginals.npz: {len(back)} cells, ledger total rho {back.rho:g}, private={back.private}")
    if importlib.util.find_spec("pandas"):  # to_pandas needs the io extra
        print(back.to_pandas().head(3).round(2).to_string(index=False))

truth = marginal_tables(X, dom, list(release.selection.marginals))
SHOW = [("species", "island"), ("body_mass_g", "sex"), ("species", "flipper_length_mm")]


def sq_error(marginals: dict) -> float:
    return sum(float(np.sum((marginals[tuple(dom.names[i] for i in S)] - truth[S]) ** 2)) for S in work)


print("evaluation against the true marginals (not private):")
print(f"total squared error of this release: {sq_error(release.marginals):.1f} (plain), "
      f"{sq_error(nn.marginals):.1f} (consistent non-negative, {nn.iterations} iterations)")
print(f"{'marginal':<32}{'cells':>6}{'cell std':>10}{'RMSE plain':>12}{'RMSE non-neg':>14}")
for key in SHOW:
    S = dom.axes(key)
    e, f = release.marginals[key] - truth[S], nn.marginals[key] - truth[S]
    print(f"{' x '.join(key):<32}{e.size:>6}{np.sqrt(release.variances[key]):>10.2f}"
          f"{np.sqrt(np.mean(e ** 2)):>12.2f}{np.sqrt(np.mean(f ** 2)):>14.2f}")
print("island, answered from the release (post-processing):", np.round(release.marginal(["island"]), 1),
      "(evaluation) true:", marginal_tables(X, dom, [dom.axes("island")])[dom.axes("island")].astype(int))

if args.plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(SHOW), 1, figsize=(11, 3.0 * len(SHOW)))
    for ax, key in zip(axes, SHOW):
        S = dom.axes(key)
        t, r, q = truth[S].ravel(), release.marginals[key].ravel(), nn.marginals[key].ravel()
        a, b = (table.categories[dom.names[i]] for i in S)
        ticks = [f"{u}\n{v}" if j == 0 else v for u in a for j, v in enumerate(b)]
        pos = np.arange(t.size)
        ax.bar(pos, t, color="0.8", label="true count")
        cells = rel.labels["marginal"] == ",".join(key)  # this marginal's rows of the release
        ax.errorbar(pos - 0.15, r, yerr=[r - lower[cells], upper[cells] - r], fmt="o", ms=3, lw=0.8,
                    label="released (95% interval)")
        ax.plot(pos + 0.15, q, "x", ms=5, color="C3", label="consistent non-negative")
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xticks(pos, ticks, fontsize=6)
        ax.set_title(" x ".join(key), fontsize=10)
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"{table.source}: three of the {len(work)} released 2-way marginals, rho = {args.rho}", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    print("wrote", args.plot)
