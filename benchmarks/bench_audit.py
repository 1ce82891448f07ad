"""Empirical DP audits of the release paths, correct and deliberately broken (issue 13).

For each path, a tiny instance and a neighbouring pair (one count / one step / one trip changes)
are released ``--trials`` times each through the path's own measurement plan; the auditor
(:func:`sparsedp.audit.audit`) returns a 95% lower bound on epsilon.  Each path is also audited
with its noise scales halved (the sensitivity "halved"), which costs twice the epsilon it claims:
the auditor must flag it (bound > epsilon), showing it has power.

    python benchmarks/bench_audit.py [--trials 1000000] [--paths mm trees flows counter] [--out FILE]

One BLAS thread (threadpoolctl).  Results in ``benchmarks/results/audit.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from threadpoolctl import threadpool_limits  # noqa: E402

from sparsedp import strategies as st  # noqa: E402
from sparsedp.audit import audit  # noqa: E402
from sparsedp.intervals import IntervalRows  # noqa: E402
from sparsedp.measure import plan_measurement  # noqa: E402

EPS = 1.0


def _halved(plan):
    """The same plan with every noise scale halved (a broken calibration)."""
    return dataclasses.replace(plan, unit_scales=plan.unit_scales / 2, scales=plan.scales / 2)


def paths() -> dict:
    """name -> (plan, x, x_prime, statistic)."""
    out = {}
    # matrix mechanism: a 4-bin histogram, hierarchical strategy (2 levels + root), neighbours differ in bin 0
    out["mm"] = (plan_measurement(st.hierarchical(4, 2), epsilon=EPS), [3, 1, 4, 1], [4, 1, 4, 1])
    # tree publisher measurement: node intervals with per-node budgets summing to eps on every path
    lo, hi = np.array([0, 0, 2, 0, 1, 2, 3]), np.array([4, 2, 4, 1, 2, 3, 4])
    eps_node = np.array([0.2, 0.3, 0.3, 0.5, 0.5, 0.5, 0.5])
    out["trees"] = (plan_measurement(IntervalRows(4, lo, hi), scales=1 / eps_node, epsilon=EPS), [2, 0, 1, 5], [2, 1, 1, 5])
    # flows: a count vector where one trip moves L + 2 = 4 counts by one (identity, unit = 4)
    out["flows"] = (plan_measurement(st.identity(4), epsilon=EPS, unit=4), [5, 5, 5, 5], [6, 6, 6, 6])
    # continual: running sums of a 3-step stream measured by a Fenwick tree (as IntervalRows); the
    # neighbours differ in step 0, the column in two rows (the worst case: a pair differing in step
    # 1 touches one row, so even the halved copy costs only the claimed epsilon there)
    fen = IntervalRows(3, [0, 0, 2], [1, 2, 3])
    out["counter"] = (plan_measurement(fen, epsilon=EPS), [0, 0, 1], [1, 0, 1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1_000_000)
    ap.add_argument("--paths", nargs="*", default=None)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "audit.json")
    args = ap.parse_args()
    rows = []
    with threadpool_limits(1):
        for name, (plan, x, xp) in paths().items():
            if args.paths and name not in args.paths:
                continue
            for variant, p in (("correct", plan), ("scales halved", _halved(plan))):
                t = time.perf_counter()
                res = audit(lambda d, g, p=p: p.measure(d, rng=g).y, x, xp, trials=args.trials, rng=7)
                sec = time.perf_counter() - t
                flagged = res.epsilon_lower > EPS
                rows.append({"path": name, "variant": variant, "epsilon": EPS, "epsilon_lower": res.epsilon_lower,
                             "p_hat": res.p_hat, "q_hat": res.q_hat, "event": res.event, "trials": args.trials,
                             "seconds": sec, "flagged": flagged})
                print(f"{name:8s} {variant:14s} trials {args.trials:>8d}  eps_lower {res.epsilon_lower:6.3f} "
                      f"(claimed {EPS})  {'FLAGGED' if flagged else 'ok'}  {sec:6.1f} s", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.paths and args.out.exists():  # a partial run replaces only its own paths' rows
        old = json.loads(args.out.read_text()).get("rows", [])
        rows = [r for r in old if r["path"] not in args.paths] + rows
    args.out.write_text(json.dumps({"python": platform.python_version(), "blas_threads": 1, "rows": rows,
                                    "command": "python benchmarks/bench_audit.py " + " ".join(sys.argv[1:])},
                                   indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
