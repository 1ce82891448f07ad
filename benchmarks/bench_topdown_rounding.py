"""The time of a totals-first TopDown release against the default release, in one run (a ratio).

Data: the shared 2020 Census voting-district table (``bench_topdown.load``: nation > 48 states >
3,044 counties > 157,050 voting districts, 16 cells per unit).  Both designs spend ``rho = 1``
(zCDP), the state totals are invariant, as in ``bench_topdown_workload.py``:

* **default**: ``plan_topdown(h, rho=1, invariants=[INVARIANT])`` (cells and totals workload; each
  parent's children rounded cell by cell, largest remainders);
* **totals-first**: the same with ``workload={"total": 1}``: each unit's total rounded first, then
  its cells as a transportation problem (the children x cells table of each parent with the
  parent's cells as column sums and the children's totals as row sums): the weighted projection
  onto that polytope (``rounding.project_transport``) and the controlled rounding (one linear
  program per parent, ``rounding.round_transport``).

Each design is planned once (data free, not timed), then released ``--reps`` times with the seeds
``[7, r]`` (``topdown(table, design=design, rng=..., keep_noisy=False, invariants=[INVARIANT])``),
the two designs alternating so that a busy machine slows both alike.  Per release: the seconds end
to end; for totals-first also the seconds of the district level's projection and rounding (the
module's two functions wrapped with a timer) and the geography-total MAE of the released counts
per level (county and district ~0.73 / 0.72 expected).  Reported: the medians, the ratio
totals-first / default of the median release seconds, the machine's load average before and after.
BLAS runs one thread (threadpoolctl).

    python benchmarks/bench_topdown_rounding.py [--reps 3] [--out FILE]

Results: ``results/topdown_rounding.json``.  The releases use seeded generators (reproducible;
marked not private), as benchmarks do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _results import peak_rss_mib  # noqa: E402
from bench_topdown import INVARIANT, LEVELS, load  # noqa: E402
import sparsedp.topdown.release as release  # noqa: E402
from sparsedp.topdown import plan_topdown, topdown  # noqa: E402

SEED = 7
DESIGNS: dict[str, dict[str, Any]] = {"default": {}, "totals-first": {"workload": {"total": 1}}}


class PhaseTimer:
    """Wraps ``release.project_transport`` and ``release.round_transport`` (the names the release
    calls) to record each call's seconds and table size; restores them on exit."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __enter__(self) -> "PhaseTimer":
        self._orig = (release.project_transport, release.round_transport)
        proj, rnd = self._orig

        def timed(fn: Any, phase: str) -> Any:
            def run(x: np.ndarray, *a: Any, **k: Any) -> np.ndarray:
                t0 = time.perf_counter()
                out = fn(x, *a, **k)
                self.calls.append({"phase": phase, "rows": int(x.shape[0]), "seconds": time.perf_counter() - t0})
                return out
            return run

        release.project_transport, release.round_transport = timed(proj, "project"), timed(rnd, "round")
        return self

    def __exit__(self, *exc: Any) -> None:
        release.project_transport, release.round_transport = self._orig

    def largest(self, phase: str) -> float:
        """Seconds of the phase's call on the largest table (the district level)."""
        calls = [c for c in self.calls if c["phase"] == phase]
        return max(calls, key=lambda c: c["rows"])["seconds"] if calls else 0.0


def total_mae(table: Any, rel: Any) -> dict[str, float]:
    """Per level, ``mean_units |sum of the released cells - true total|``."""
    return {lv: float(np.abs(np.asarray(c, dtype=np.int64).sum(axis=1) - np.asarray(t).sum(axis=1)).mean())
            for lv, c, t in zip(LEVELS, rel.counts, table.counts)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results" / "topdown_rounding.json"))
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    load_before = os.getloadavg()
    with threadpool_limits(1, user_api="blas"):
        table = load()
        designs = {k: plan_topdown(table.hierarchy, rho=1.0, invariants=[INVARIANT], **kw) for k, kw in DESIGNS.items()}
        rows: dict[str, dict[str, Any]] = {k: {"seconds": [], "total_mae": [], "project_s": [], "round_s": []}
                                           for k in DESIGNS}
        for r in range(args.reps):
            for name, design in designs.items():
                with PhaseTimer() as pt:
                    t0 = time.perf_counter()
                    rel = topdown(table, design=design, rng=np.random.default_rng([SEED, r]), keep_noisy=False,
                                  invariants=[INVARIANT])
                    secs = time.perf_counter() - t0
                row = rows[name]
                row["seconds"].append(secs)
                row["total_mae"].append(total_mae(table, rel))
                row["project_s"].append(pt.largest("project"))
                row["round_s"].append(pt.largest("round"))
                assert sum(rel.check().values()) == 0
                print(f"{name:13s} release {r}: {secs:6.2f} s (district projection {row['project_s'][-1]:.2f} s, "
                      f"rounding {row['round_s'][-1]:.2f} s)  total MAE " + " / ".join(
                          f"{row['total_mae'][-1][lv]:.3f}" for lv in LEVELS), flush=True)
    out_rows = []
    for name, row in rows.items():
        out_rows.append({
            "design": name, "plan_kwargs": DESIGNS[name], "releases": args.reps,
            "seconds": row["seconds"], "median_seconds": float(np.median(row["seconds"])),
            "district_project_seconds": float(np.median(row["project_s"])),
            "district_round_seconds": float(np.median(row["round_s"])),
            "total_mae": {lv: float(np.mean([m[lv] for m in row["total_mae"]])) for lv in LEVELS},
        })
    ratio = out_rows[1]["median_seconds"] / out_rows[0]["median_seconds"]
    print(f"\nmedian seconds per release: default {out_rows[0]['median_seconds']:.2f}, totals-first "
          f"{out_rows[1]['median_seconds']:.2f} (district projection {out_rows[1]['district_project_seconds']:.2f}, "
          f"rounding {out_rows[1]['district_round_seconds']:.2f}); ratio {ratio:.2f}")
    res = {"benchmark": "topdown_rounding", "rho": 1.0, "invariant": INVARIANT, "levels": list(LEVELS),
           "seeds": f"np.random.default_rng([{SEED}, r])", "rows": out_rows, "ratio_totals_first_to_default": ratio,
           "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
           "blas_threads": 1, "peak_mb_process": peak_rss_mib(), "python": platform.python_version(),
           "numpy": np.__version__}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
