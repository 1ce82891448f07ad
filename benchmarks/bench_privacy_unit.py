"""Customer-level releases of the real Online Retail data: error against the bound, side by side
with OpenDP at the same bound and noise family, and the time of truncation + release.

The data (``../shared/datasets/online_retail``, 541,909 lines, 4,372 customers, 24.9% of lines
without a customer id) are released with the customer as the privacy unit, epsilon 1 per
customer, exact discrete Laplace noise:

* ``daily``: line counts per trading day (305 days, the public calendar of the shop);
* ``country_month``: line counts per country x month (38 countries x 13 months, public lists).

Lines without a ``CustomerID`` cannot be protected per customer and are dropped
(``drop_missing=True``); the truth is the untruncated count of the lines with an id.  For each
``max_rows`` (10, 50, 200 and ``auto``: a DP 95th percentile of the lines per customer with 10% of
the budget) and over ``--releases`` releases: the mean absolute error per cell against that truth
(noise and truncation bias), its noise part (against the truncated truth) and its bias part.
OpenDP (``opendp`` of this environment, imported here only; its ``make_laplace`` on the same
truncated histogram with scale ``max_rows / epsilon``) gives the noise part of the same query,
bound and noise family.  The time is that of the public calls a user makes on the whole table:
``resolve_unit`` (auto), ``unit_histogram``, ``MatrixMechanism(...).run`` with the secure default
generator.

    python benchmarks/bench_privacy_unit.py [--releases 100] [--out benchmarks/results/privacy_unit.json]
        [--plot docs/privacy_unit_tradeoff.png] [--no-opendp]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import sparsedp  # noqa: E402
from sparsedp.contribution_bound import resolve_unit  # noqa: E402
from sparsedp.privacy_unit import PrivacyUnit, truncate, unit_histogram  # noqa: E402

DATA = HERE.parent.parent / "shared" / "datasets" / "online_retail" / "online_retail.csv.gz"
EPSILON = 1.0
BOUNDS = (10, 50, 200, "auto")


def load(path: Path) -> dict:
    """The retail lines as codes: trading day, country x month, customer id (text)."""
    import pandas as pd

    df = pd.read_csv(path, usecols=["InvoiceDate", "CustomerID", "Country"], dtype={"CustomerID": str})
    when = pd.to_datetime(df["InvoiceDate"])
    days = when.dt.normalize()
    calendar = np.sort(days.unique())  # the shop's trading days (public)
    day = np.searchsorted(calendar, days.to_numpy())
    countries = np.sort(df["Country"].unique())
    month = (when.dt.year.to_numpy() - 2010) * 12 + when.dt.month.to_numpy() - 12  # Dec 2010 = 0
    cm = np.searchsorted(countries, df["Country"].to_numpy()) * 13 + month
    ids = df["CustomerID"].to_numpy(dtype=object)
    return {"daily": (day.astype(np.int64), int(calendar.size)), "country_month": (cm.astype(np.int64), int(countries.size) * 13),
            "ids": ids, "lines": int(len(df))}


def opendp_noise(bound: int, size: int, reps: int, seed_hist: np.ndarray) -> np.ndarray:
    """OpenDP's discrete Laplace on the same histogram: ``reps`` noisy vectors (noise only)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=bound / EPSILON)
    assert meas.map(bound) <= EPSILON + 1e-12  # the same budget per customer
    x = [int(v) for v in seed_hist]
    return np.array([np.asarray(meas(x)) - seed_hist for _ in range(reps)], dtype=np.float64)


def run(releases: int, opendp: bool) -> dict:
    data = load(DATA)
    ids = data["ids"]
    have = np.array([v is not None and v == v for v in ids])  # rows with a customer id
    rows = []
    for query in ("daily", "country_month"):
        cells, n = data[query]
        truth = np.bincount(cells[have], minlength=n).astype(np.float64)  # untruncated, lines with an id
        for b in BOUNDS:
            unit = PrivacyUnit("CustomerID", max_rows=b)
            err, noise_err, bias, chosen, times = [], [], [], [], []
            for r in range(releases):
                t0 = time.perf_counter()
                concrete, choice, eps = resolve_unit(unit, ids, epsilon=EPSILON, drop_missing=True,
                                                     rng=None if r == 0 else 10_000 + r)
                x = unit_histogram(cells, n, ids, concrete, drop_missing=True, rng=None if r == 0 else r)
                rel = sparsedp.MatrixMechanism(np.eye(n), np.eye(n), epsilon=eps, privacy_unit=concrete).run(
                    x, rng=None if r == 0 else 20_000 + r)
                times.append(time.perf_counter() - t0)
                est = np.asarray(rel.answers)
                err.append(np.abs(est - truth).mean())
                noise_err.append(np.abs(est - x).mean())
                bias.append(np.abs(x - truth).mean())
                chosen.append(concrete.max_rows)
            row = {"query": query, "cells": n, "max_rows": b, "releases": releases,
                   "chosen_bound_median": float(np.median(chosen)),
                   "mae": float(np.mean(err)), "mae_se": float(np.std(err) / np.sqrt(releases)),
                   "noise_mae": float(np.mean(noise_err)), "bias_mae": float(np.mean(bias)),
                   "first_release_s": times[0], "median_release_s": float(np.median(times))}
            if opendp and not str(b).startswith("auto"):
                x = unit_histogram(cells, n, ids, unit, drop_missing=True, rng=0)
                z = opendp_noise(b, n, releases, x)
                row["opendp_noise_mae"] = float(np.abs(z).mean())
                row["noise_ratio"] = row["noise_mae"] / row["opendp_noise_mae"]
            rows.append(row)
            print(f"{query:14s} max_rows {str(b):>5s} (chosen {row['chosen_bound_median']:>6.0f}): MAE "
                  f"{row['mae']:9.2f} +- {row['mae_se']:.2f}  noise {row['noise_mae']:8.2f}  bias {row['bias_mae']:9.2f}"
                  + (f"  OpenDP noise {row['opendp_noise_mae']:8.2f} (ratio {row['noise_ratio']:.3f})"
                     if "opendp_noise_mae" in row else "")
                  + f"  time {row['first_release_s']:.2f} s (secure), median {row['median_release_s']:.2f} s",
                  flush=True)
    # how the bound trades bias for noise (the curve of the docs page): rows kept and error per bound
    cells, n = data["daily"]
    truth = np.bincount(cells[have], minlength=n).astype(np.float64)
    curve = []
    for b in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 8000):
        keep = truncate(ids, PrivacyUnit("CustomerID", max_rows=b), rng=0, drop_missing=True)
        x = np.bincount(cells[keep], minlength=n).astype(np.float64)
        noise_mae = b / EPSILON  # E|discrete Laplace(b)| ~ b for b >> 1
        curve.append({"max_rows": b, "rows_kept": int(keep.sum()), "rows_with_id": int(have.sum()),
                      "bias_mae": float(np.abs(x - truth).mean()), "noise_mae_expected": noise_mae})
    return {"rows": rows, "curve": curve, "lines": data["lines"], "lines_with_id": int(have.sum())}


def plot(out: dict, path: Path) -> None:
    """Rows kept and per-day error against the bound (daily line counts): the docs page's figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = out["curve"]
    k = np.array([r["max_rows"] for r in c], dtype=float)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.semilogx(k, [r["rows_kept"] / r["rows_with_id"] for r in c], "o-")
    a.set_xlabel("max_rows (lines per customer)")
    a.set_ylabel("share of lines kept")
    a.set_title("Truncation keeps")
    a.grid(alpha=0.3)
    b.loglog(k, [max(r["bias_mae"], 1e-1) for r in c], "o-", label="truncation bias (per day)")
    b.loglog(k, [r["noise_mae_expected"] for r in c], "s--", label="noise, epsilon 1 per customer")
    meas = [r for r in out["rows"] if r["query"] == "daily"]
    b.loglog([r["chosen_bound_median"] for r in meas], [r["mae"] for r in meas], "k*", ms=10,
             label="measured MAE (10, 50, 200, auto)")
    b.set_xlabel("max_rows (lines per customer)")
    b.set_ylabel("mean absolute error per day")
    b.set_title("Daily line counts, customer-level")
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", type=int, default=100)
    ap.add_argument("--no-opendp", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results" / "privacy_unit.json"))
    ap.add_argument("--plot", default=None, help="write the trade-off figure here (docs/privacy_unit_tradeoff.png)")
    args = ap.parse_args()
    with threadpool_limits(1):
        out = run(args.releases, not args.no_opendp)
    out.update(blas_threads=1, python=platform.python_version(), numpy=np.__version__, epsilon=EPSILON)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {args.out}")
    if args.plot:
        plot(out, Path(args.plot))


if __name__ == "__main__":
    main()
