"""A continual release of the Online Retail daily line counts, customer by customer.

The table (``shared/datasets/online_retail``, 541,909 real transaction lines, 4,372 customers) has
one row per line.  A counter that protects one *line* protects a customer who bought on 40 days, 20
lines a day, only at about 800 times its epsilon.  Here the customer is the privacy unit: each keeps
at most ``--max-groups`` days and ``--max-rows-per-group`` lines on each (a secret random choice,
:func:`sparsedp.continual.unit_increments`), and the Fenwick counter releases the running number of
lines after every calendar day (2010-12-01 to 2011-12-09: 374 public steps, not read from the data)
at ``--epsilon`` per customer, its noise calibrated to the largest change one customer's kept lines
can make (:mod:`sparsedp.continual.units`).  Lines without a customer id are dropped (how many is
not published).

For the reader (not part of a release), the script then measures, over ``--releases`` releases per
bound, the error of the released running sums against the *untruncated* truth (noise + truncation
bias) for a few bounds -- the trade-off a publisher faces: larger bounds keep more lines and add
more noise.

    python examples/retail_customer_continual.py [CSV] [--epsilon 1] [--max-groups 10] [--max-rows-per-group 20]
"""

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

import sparsedp
from sparsedp.continual import ContinualCounter, unit_increments
from sparsedp.privacy_unit import PrivacyUnit

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "online_retail" / "online_retail.csv.gz"
FIRST_DAY = pd.Timestamp("2010-12-01")
HORIZON = 374  # calendar days 2010-12-01 .. 2011-12-09: the period the shop published, not read from the data

ap = argparse.ArgumentParser()
ap.add_argument("csv", nargs="?", default=str(DATA), help="the Online Retail lines (default: the shared copy)")
ap.add_argument("--epsilon", type=float, default=1.0, help="pure-DP budget per customer, for the whole run")
ap.add_argument("--max-groups", type=int, default=10, help="days kept per customer")
ap.add_argument("--max-rows-per-group", type=int, default=20, help="lines kept per customer and day")
ap.add_argument("--releases", type=int, default=10, help="releases per bound in the error table")
args = ap.parse_args()
if not Path(args.csv).is_file():
    raise SystemExit(f"no table at {args.csv}: give the path of online_retail.csv.gz")

lines = pd.read_csv(args.csv, usecols=["InvoiceDate", "CustomerID"], dtype=str)
when = pd.to_datetime(lines["InvoiceDate"], format="%Y-%m-%d %H:%M:%S").dt.normalize()
day = ((when - FIRST_DAY).dt.days + 1).to_numpy()  # step 1 .. 374
ids = lines["CustomerID"].to_numpy(dtype=object)

# ---- the release ------------------------------------------------------------------------------
unit = PrivacyUnit("CustomerID", max_groups=args.max_groups, max_rows_per_group=args.max_rows_per_group)
budget = sparsedp.Accountant(epsilon=args.epsilon)
a = unit_increments(day, HORIZON, ids, unit, drop_missing=True)  # truncated daily line counts (secret)
counter = ContinualCounter(HORIZON, epsilon=args.epsilon, privacy_unit=unit, accountant=budget)
released = counter.run(a)  # one noisy running sum per day, each published as its day ends
print(f"{unit}: epsilon {budget.spent:g} per customer (ledger: {budget.ledger[-1].privacy_unit!r}); the noise "
      f"is {counter.unit_factor:.4g} times a one-line counter's")
print("running number of lines released after days 31, 182, 374:",
      ", ".join(f"{released[t - 1]:,.0f}" for t in (31, 182, 374)))

# ---- the trade-off (evaluation against the true data: for the reader, not a release) -----------
kept = np.asarray(pd.notna(ids), dtype=bool)
truth = np.cumsum(np.bincount(day[kept] - 1, minlength=HORIZON))  # untruncated running sums
print(f"\nerror of the running sums against the untruncated truth, {args.releases} releases per bound "
      f"(epsilon {args.epsilon:g} per customer; RMSE over the 374 days):")
print(f"{'bound':<40}{'noise':>10}{'bias':>10}{'total':>10}")
bounds = [PrivacyUnit("CustomerID", max_rows=k) for k in (10, 50, 200)] + [
    PrivacyUnit("CustomerID", max_groups=g, max_rows_per_group=r) for g, r in ((5, 20), (10, 20), (20, 50))]
for b in bounds:
    noise, bias, total = [], [], []
    for i in range(args.releases):
        inc = unit_increments(day, HORIZON, ids, b, rng=1000 + i, drop_missing=True)
        out = ContinualCounter(HORIZON, epsilon=args.epsilon, privacy_unit=b, rng=i).run(inc)
        exact = np.cumsum(inc)
        noise.append(np.mean((out - exact) ** 2))
        bias.append(np.mean((exact - truth) ** 2))
        total.append(np.mean((out - truth) ** 2))
    label = str(b).removeprefix("privacy unit: CustomerID ")
    print(f"{label:<40}{np.sqrt(np.mean(noise)):>10,.0f}{np.sqrt(np.mean(bias)):>10,.0f}"
          f"{np.sqrt(np.mean(total)):>10,.0f}")
