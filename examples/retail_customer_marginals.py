"""Marginals of country x month x weekday of the Online Retail lines, customer by customer.

The table (``shared/datasets/online_retail``, 541,909 real transaction lines, 4,372 customers; one
customer has 7,983 lines, the median 42) has one row per line, not per customer.  A release that
protects one *line* would protect a customer only at about rho times the square of their lines.
Here the customer is the privacy unit: each keeps at most ``--max-rows`` of their lines (a secret
random choice; ``auto``: chosen privately with 10% of the budget), and the three 2-way marginals of
country, month and weekday are released with ResidualPlanner at ``rho / max_rows^2`` per line, i.e.
``--rho`` per customer in all.  Lines without a customer id are dropped (how many is not published).

The domain is public and written below (the shop's 38 country labels, 12 months, 7 weekdays),
never read from the data.  The script prints what a publisher would publish (the ledger, the noise
per cell, a few released counts), makes the marginals consistent and non-negative
(post-processing), saves that release, and loads it back.

    python examples/retail_customer_marginals.py [CSV] [--rho 0.5] [--max-rows 50|auto]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

import sparsedp
from sparsedp.marginals import Domain, nonnegative_marginals, release_marginals
from sparsedp.privacy_unit import PrivacyUnit

DATA = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "online_retail" / "online_retail.csv.gz"
COUNTRIES = ["Australia", "Austria", "Bahrain", "Belgium", "Brazil", "Canada", "Channel Islands", "Cyprus",
             "Czech Republic", "Denmark", "EIRE", "European Community", "Finland", "France", "Germany", "Greece",
             "Hong Kong", "Iceland", "Israel", "Italy", "Japan", "Lebanon", "Lithuania", "Malta", "Netherlands",
             "Norway", "Poland", "Portugal", "RSA", "Saudi Arabia", "Singapore", "Spain", "Sweden", "Switzerland",
             "USA", "United Arab Emirates", "United Kingdom", "Unspecified"]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]

ap = argparse.ArgumentParser()
ap.add_argument("csv", nargs="?", default=str(DATA), help="the Online Retail lines (default: the shared copy)")
ap.add_argument("--rho", type=float, default=0.5, help="zCDP budget per customer")
ap.add_argument("--max-rows", default="50", help="lines kept per customer, or 'auto'")
args = ap.parse_args()
if not Path(args.csv).is_file():
    raise SystemExit(f"no table at {args.csv}: give the path of online_retail.csv.gz")

lines = pd.read_csv(args.csv, usecols=["InvoiceDate", "CustomerID", "Country"], dtype=str)
when = pd.to_datetime(lines["InvoiceDate"], format="%Y-%m-%d %H:%M:%S")
records = pd.DataFrame({
    "Country": pd.Categorical(lines["Country"], categories=COUNTRIES).codes,  # -1 (refused) off the list
    "Month": when.dt.month.to_numpy() - 1,
    "Weekday": when.dt.day_of_week.to_numpy(),
    "CustomerID": lines["CustomerID"],
})
dom = Domain(["Country", "Month", "Weekday"], [len(COUNTRIES), 12, 7])
unit = PrivacyUnit("CustomerID", max_rows="auto" if args.max_rows == "auto" else int(args.max_rows))

budget = sparsedp.Accountant(rho=args.rho)
work = [("Country", "Month"), ("Month", "Weekday"), ("Country", "Weekday")]
rel = release_marginals(records, dom, work, args.rho, accountant=budget, privacy_unit=unit,
                        drop_missing_units=True)  # rng=None: secure randomness

print(f"protects one customer: {rel.privacy_unit}")
print(f"ledger: rho spent {budget.spent:.4f} of {args.rho}")
for e in budget.ledger:
    print(f"  {e.label}: rho {e.cost.rho:.4f}" + (f", {e.privacy_unit}" if e.privacy_unit else ""))
for m in work:
    print(f"  {' x '.join(m)}: standard deviation per cell {np.sqrt(rel.variances[m]):.1f} lines")

uk = rel.marginals[("Country", "Month")][COUNTRIES.index("United Kingdom")]
print("United Kingdom, released lines per month (customers' lines kept):")
print("  " + ", ".join(f"{m} {v:,.0f}" for m, v in zip(MONTHS, uk)))
week = rel.marginals[("Month", "Weekday")].sum(axis=0)
print("all countries, released lines per weekday: " + ", ".join(f"{d} {v:,.0f}" for d, v in zip(WEEKDAYS, week)))

# consistent, non-negative marginals (post-processing, no budget): the shop has no Saturday lines
nn = nonnegative_marginals(rel)
week = nn.marginals[("Month", "Weekday")].sum(axis=0)
print("the same, non-negative and consistent: " + ", ".join(f"{d} {v:,.0f}" for d, v in zip(WEEKDAYS, week)))

release = nn.to_release(categories={"Country": COUNTRIES, "Month": MONTHS, "Weekday": WEEKDAYS})
with tempfile.TemporaryDirectory() as tmp:
    path = release.save(Path(tmp) / "retail_marginals.npz")
    loaded = sparsedp.load_release(path)
    frame = loaded.to_pandas()
    print(f"saved and loaded back with sparsedp.load_release: {len(frame):,} cells ({loaded.kind}), "
          f"marginals {list(dict.fromkeys(frame['marginal']))} in the order asked for, "
          f"unit {loaded.description['privacy_unit']}")
