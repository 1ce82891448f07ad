"""Run the peer InfTDA (PyPI ``inf-tda`` 0.1) on the 2020 voting-district table; print JSON.

Called by ``bench_topdown.py`` as a subprocess with the *peer's* Python (a separate venv: inf-tda 0.1
runs with pandas 2.2 and opendp 0.12, not with the newest releases of either), so it imports only
the standard library, numpy, pandas and ``InfTDA`` -- never sparsedp:

    python3 -m venv /tmp/peers/inftda-venv
    /tmp/peers/inftda-venv/bin/pip install 'inf-tda==0.1.*' 'pandas==2.2.*' 'opendp==0.12.*' numpy
    /tmp/peers/inftda-venv/bin/python benchmarks/_inftda_runner.py --data FILE.csv.gz --rho 1 --reps 3

The table is read into a pandas Series with a 4-level MultiIndex (``cell``, ``state``, ``county``,
``district``) -- the cell (one of the 16 ``vap_*`` / ``u18_*`` columns) as the first index level,
the layout the issue found best; ``--layout last`` puts it last (state, county, district, cell).
Every district has all 16 cells (zeros included), as InfTDA requires.

InfTDA takes an ``(epsilon, delta)`` budget and turns it into ``rho`` with its own
``get_rho_from_budget``; the runner passes the budget that its conversion maps to ``--rho``
(``epsilon = rho + 2 sqrt(rho ln(1/delta))``, stepped down to the float at which the conversion is
not above ``rho``), so ``--rho`` is the zCDP ``rho`` *in InfTDA's own accounting*: substitution
("bounded") neighbours, l2 sensitivity ``sqrt(2)`` per level, ``rho / 4`` per level, discrete
Gaussian scale ``sqrt(4 / rho)`` per count.  Under add/remove-one-person neighbours (sparsedp's)
the same release is ``rho / 2``-zCDP: ``--rho 2`` has the per-count noise of a ``rho = 1``
add/remove release that spends ``rho / 4`` per level.  InfTDA publishes the grand total exactly.

Per release: the mean absolute error per cell at each level (nation = the 16 cells; state,
county, district = every unit x 16 cells), from the released leaves (missing keys are InfTDA's
zeros) summed up the hierarchy (InfTDA's levels add up, so these are its released levels); the
time of the ``inf_tda`` call (Series in memory -> released Series); negatives and whether the grand
total is exact.  At the end the process' peak memory (``VmHWM``).  OpenDP draws its noise from the
operating system's CSPRNG: the releases cannot be seeded.  Progress goes to stderr, the JSON (one
line) to stdout.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

GEO = ["state_fips", "county_fips", "vtd_code"]
LEVEL_KEYS = {"nation": ["cell"], "state": ["cell", "state"], "county": ["cell", "state", "county"],
              "district": ["cell", "state", "county", "district"]}


def vm(field: str) -> float:
    """``VmHWM`` / ``VmRSS`` of this process in MB (NaN where there is no ``/proc``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - not Linux
        pass
    return float("nan")


def load(path: str, layout: str) -> pd.Series:
    df = pd.read_csv(path, dtype={c: str for c in GEO})
    cells = [c for c in df.columns if c.startswith("vap_")] + [c for c in df.columns if c.startswith("u18_")]
    long = df[GEO + cells].rename(columns={"state_fips": "state", "county_fips": "county", "vtd_code": "district"})
    long = long.melt(id_vars=["state", "county", "district"], value_vars=cells, var_name="cell", value_name="count")
    order = ["cell", "state", "county", "district"] if layout == "first" else ["state", "county", "district", "cell"]
    s = long.set_index(order)["count"].astype(np.int64).sort_index()
    assert not s.index.has_duplicates and len(s) == len(df) * len(cells)
    return s


def budget_for(rho: float, delta: float) -> tuple[float, float]:
    """The ``(epsilon, delta)`` that InfTDA's ``get_rho_from_budget`` maps to ``rho`` (not above)."""
    from InfTDA.differential_privacy import get_rho_from_budget

    eps = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    while get_rho_from_budget((eps, delta)) > rho:
        eps = float(np.nextafter(eps, 0.0))
    return float(eps), float(delta)


def by_level(s: pd.Series) -> dict[str, np.ndarray]:
    """The counts of every level (each unit x 16 cells), in one canonical order for any layout."""
    out = {}
    for lv, keys in LEVEL_KEYS.items():
        g = s.reorder_levels(keys) if lv == "district" else s.groupby(level=keys, sort=False).sum()
        out[lv] = g.sort_index().to_numpy(np.float64)
    return out


def level_mae(released: pd.Series, truth: pd.Series, truth_levels: dict[str, np.ndarray]) -> dict[str, float]:
    est = by_level(released.reindex(truth.index, fill_value=0))
    return {lv: float(np.abs(est[lv] - truth_levels[lv]).mean()) for lv in LEVEL_KEYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--rho", type=float, default=1.0, help="zCDP rho in InfTDA's own (substitution) accounting")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--delta", type=float, default=1e-6, help="delta of the (epsilon, delta) handed to InfTDA "
                                                              "(any: only the rho it maps to matters)")
    ap.add_argument("--layout", choices=("first", "last"), default="first", help="cell as the first / last index level")
    args = ap.parse_args()

    from InfTDA import inf_tda
    from InfTDA.differential_privacy import get_rho_from_budget
    from InfTDA.mechanism import get_sensitivity

    t0 = time.perf_counter()
    truth = load(args.data, args.layout)
    truth_levels = by_level(truth)
    load_s = time.perf_counter() - t0
    units = [len(truth_levels[lv]) // 16 for lv in LEVEL_KEYS]
    budget = budget_for(args.rho, args.delta)
    rho_used = float(get_rho_from_budget(budget))
    sens = float(get_sensitivity(1, "bounded", True))
    T = truth.index.nlevels
    print(f"[inftda] loaded {len(truth)} counts in {load_s:.1f} s, units {units}, budget {budget} -> rho {rho_used}, "
          f"rss {vm('VmRSS'):.0f} MB", file=sys.stderr, flush=True)
    peak_loaded = vm("VmHWM")
    releases = []
    for r in range(args.reps):
        t0 = time.perf_counter()
        rel = inf_tda(truth, budget, 1, privacy_type="bounded", distinct_tuples=True)
        secs = time.perf_counter() - t0
        err = level_mae(rel, truth, truth_levels)
        releases.append({"mae": err, "seconds": secs, "negative": int((rel < 0).sum()),
                         "total_exact": bool(int(rel.sum()) == int(truth.sum())), "nonzero_counts": int(len(rel))})
        print(f"[inftda] rho {args.rho} release {r + 1}/{args.reps}: {secs:.1f} s, MAE "
              + " / ".join(f"{v:.3f}" for v in err.values()) + f", peak {vm('VmHWM'):.0f} MB",
              file=sys.stderr, flush=True)
    print(json.dumps({
        "peer": "InfTDA", "versions": {p: md.version(p) for p in ("inf-tda", "pandas", "opendp", "numpy")},
        "python": sys.version.split()[0], "layout": f"cell {args.layout}", "index_levels": T, "units": units,
        "rho_own": args.rho, "rho_used": rho_used, "budget": list(budget), "neighbours": "substitution (bounded)",
        "sensitivity_l2": sens, "noise_scale_per_count": sens / math.sqrt(2.0 * rho_used / T),
        "load_s": load_s, "peak_mb_after_load": peak_loaded, "peak_mb": vm("VmHWM"), "releases": releases,
    }))


if __name__ == "__main__":
    main()
