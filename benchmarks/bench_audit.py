"""Empirical DP audits of every release path, correct and deliberately broken (issue 13).

For each path, a tiny instance and a neighbouring pair are released ``--trials`` times each through
the path's own measurement plan (the plan the subsystem builds; the noise is drawn by the plan's
``measure``, batched with :func:`sparsedp.audit.plan_release`), and the auditor
(:func:`sparsedp.audit.audit`) returns a lower bound on epsilon.  The table holds jointly with 95%
confidence: each row's Clopper-Pearson bound is at ``1 - 0.05 / rows`` (Bonferroni; ``--alpha``),
so a correct path whose claim is exactly tight (as these are) is flagged by chance in no run more
than 5% of the time -- at 95% per row, some row of forty would be, now and then.  Each path is also audited with
its noise scales halved -- the sensitivity "halved" -- which costs twice the epsilon it claims
(four times the rho): the auditor must flag it (bound > claim), showing it has power.

The neighbouring pair is the path's own (one record more in a bin / one step / one trip / one
order / one entry), at the column that costs the most (``max_j sum_i |A_ij| / b_i``).  The
audited statistic is a post-processing of the noisy answers (so its epsilon is at most the
release's): for Laplace paths, ``min_i s_i (y_i - (A x)_i - d_i)`` over the rows the neighbour
touches (``d = A (x' - x)``, ``s = sign d``), whose tail events have probability ratio exactly
``e^loss`` (the orthant event); for Gaussian (zCDP) paths, the likelihood-ratio projection
``sum_i d_i (y_i - (A x)_i) / sigma_i^2``.  zCDP claims are converted with
:func:`sparsedp.privacy.zcdp_to_approx_dp` to ``(eps(delta), delta)`` and audited with ``delta``
subtracted: ``ln((p_lo - delta) / q_hi)``.

Baseline in the same run: the per-trial API (``release(x, generator)`` once per trial, as before
the batched protocol) on the first path for ``--baseline-trials`` trials; the table reports the
throughput ratio.

    python benchmarks/bench_audit.py [--trials 1000000] [--paths mm trees-lue ...] [--raw] [--out FILE]

``--raw`` adds rows auditing the raw noisy answers with the auditor's generic events (coordinates
and the mean-difference projection), without the path statistic: what a black-box audit sees.

One BLAS thread (``sparsedp._threads.blas_threads``).  Results in ``benchmarks/results/audit.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp import strategies as st  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp._threads import blas_threads  # noqa: E402
from sparsedp.audit import audit, plan_release  # noqa: E402
from sparsedp.completion import privatize_observations  # noqa: E402
from sparsedp.consistency import COMBOS, RestaurantSales, check_sales, restaurant_layout  # noqa: E402
from sparsedp.consistency.restaurant import restaurant_plan  # noqa: E402
from sparsedp.continual import (  # noqa: E402
    BinaryMechanism,
    BLTCounter,
    ContinualCounter,
    GLSTreeCounter,
    HonakerCounter,
    KaryCounter,
    NegDigitCounter,
    SqrtCounter,
)
from sparsedp.flows import Trips, random_trips, road_grid  # noqa: E402
from sparsedp.flows import release as flows_release  # noqa: E402
from sparsedp.mechanism import MatrixMechanism  # noqa: E402
from sparsedp.measure import plan_measurement  # noqa: E402
from sparsedp.privacy import zcdp_to_approx_dp  # noqa: E402
from sparsedp.trees import Boost, BoostUN, Dwork, LUEDPTree, Privelet  # noqa: E402

EPS = 1.0
RHO = 0.25  # Gaussian paths: rho-zCDP, audited as (eps(delta), delta)
DELTA = 1e-5
X8 = np.array([3, 1, 4, 1, 5, 9, 2, 6])


@dataclasses.dataclass(frozen=True)
class Case:
    plan: Any  # the path's MeasurementPlan
    x: np.ndarray
    x_prime: np.ndarray
    counts: bool = True  # the plan's input is a count vector
    note: str = ""


def halved(plan):
    """The same plan with every noise scale halved (a broken calibration: ``2 eps`` / ``4 rho``)."""
    return dataclasses.replace(plan, unit_scales=plan.unit_scales / 2, scales=plan.scales / 2)


def worst_column(plan) -> int:
    """The column whose change costs the most: ``max_j sum_i |A_ij| / b_i`` (``A_ij^2 / sigma_i^2``)."""
    A = sp.csc_matrix(plan.strategy.tosparse())
    w = 1.0 / plan.scales if plan.noise == "laplace" else 1.0 / plan.scales**2
    A = sp.diags(w) @ (abs(A) if plan.noise == "laplace" else A.multiply(A))
    return int(np.argmax(np.asarray(A.sum(axis=0)).ravel()))


def bin_pair(plan, x0: np.ndarray) -> Case:
    """Neighbours: one record more in the worst bin / step."""
    j = worst_column(plan)
    x1 = np.array(x0, dtype=np.int64).copy()
    x1[j] += 1
    return Case(plan, np.asarray(x0, dtype=np.int64), x1, note=f"+1 in column {j}")


def statistic(plan, case: Case) -> Callable[[np.ndarray], np.ndarray]:
    """The audited post-processing (module docstring): orthant (Laplace) or likelihood ratio (Gaussian)."""
    A = sp.csr_matrix(plan.strategy.tosparse())
    a0 = A @ case.x.astype(np.float64)
    d = A @ (case.x_prime.astype(np.float64) - case.x.astype(np.float64))
    if plan.noise == "gaussian":
        w = d / plan.scales**2
        return lambda Y: (Y - a0) @ w
    t = np.flatnonzero(d)
    s, base = np.sign(d[t]), a0[t] + d[t]
    return lambda Y: np.min(s * (Y[:, t] - base), axis=1)


def _duplicate(trips: Trips, i: int) -> Trips:
    a, b = trips.edge_ptr[i], trips.edge_ptr[i + 1]
    ids = np.concatenate([trips.edge_ids, trips.edge_ids[a:b]])
    ptr = np.append(trips.edge_ptr, trips.edge_ptr[-1] + (b - a))
    return Trips(np.append(trips.origins, trips.origins[i]), np.append(trips.ends, trips.ends[i]), ptr, ids,
                 trips.max_edges)


def _tree_plan(pub, x0):
    return pub._prepare(np.asarray(x0, dtype=np.float64)).measurement


def _mechanism_plan(mech):
    return mech._plan  # what MatrixMechanism.measure measures with


def _counter_case(plan) -> Case:
    """A counter's plan over its (possibly padded) horizon: the all-zero stream and one more event."""
    return bin_pair(plan, np.zeros(plan.strategy.shape[1], dtype=np.int64))


def cases() -> dict[str, Callable[[], Case]]:
    """name -> builder of the path's plan and neighbouring pair (built lazily, so --paths is cheap)."""
    out: dict[str, Callable[[], Case]] = {}
    x4 = np.array([3, 1, 4, 1])
    out["mm"] = lambda: bin_pair(_mechanism_plan(MatrixMechanism(wl.identity(4), st.hierarchical(4, 2), epsilon=EPS)), x4)
    out["mm-gaussian"] = lambda: bin_pair(_mechanism_plan(
        MatrixMechanism(wl.identity(4), st.hierarchical(4, 2), rho=RHO, noise="gaussian")), x4)
    out["trees-lue"] = lambda: bin_pair(_tree_plan(LUEDPTree(EPS, tree="kary", k=2, consistency=False), X8), X8)
    out["trees-boost"] = lambda: bin_pair(_tree_plan(Boost(EPS), X8), X8)
    out["trees-boost-un"] = lambda: bin_pair(_tree_plan(BoostUN(EPS), X8), X8)
    out["trees-privelet"] = lambda: bin_pair(
        _mechanism_plan(Privelet(EPS)._prepare(X8.astype(np.float64)).mechanism), X8)
    out["trees-dwork"] = lambda: bin_pair(_tree_plan(Dwork(EPS), X8), X8)

    def flows() -> Case:
        road = road_grid(2, 2, seed=0)
        trips = random_trips(road, 5, seed=1, max_edges=1)
        a = flows_release._prepare(road, trips, EPS, "auto", False, 1e-8, None, True)
        b = flows_release._prepare(road, _duplicate(trips, 0), EPS, "auto", False, 1e-8, None, True)
        assert np.array_equal(a.plan.scales, b.plan.scales)
        return Case(a.plan, a.truth, b.truth, note="one more trip (L + 2 = 3 counts)")

    out["flows"] = flows

    def restaurant() -> Case:
        one = RestaurantSales(np.array([[3, 2, 1]]), np.array([[3, 2, 1]]) @ COMBOS)
        more = RestaurantSales(np.array([[3, 3, 1]]), np.array([[3, 3, 1]]) @ COMBOS)
        x0, x1 = check_sales(one).sales.T.ravel(), check_sales(more).sales.T.ravel()
        return Case(restaurant_plan(restaurant_layout(1), EPS), x0, x1, note="one more order of combo 1")

    out["restaurant"] = restaurant
    counters = {
        "counter-fenwick": lambda: ContinualCounter(8, epsilon=EPS, rng=0),
        "counter-binary": lambda: BinaryMechanism(8, EPS, rng=0),
        "counter-honaker": lambda: HonakerCounter(8, EPS, rng=0),
        "counter-kary": lambda: KaryCounter(8, EPS, k=3, rng=0),
        "counter-negdigit": lambda: NegDigitCounter(8, EPS, k=3, rng=0),
        "counter-glstree": lambda: GLSTreeCounter(8, epsilon=EPS, rng=0),
        "counter-fenwick-gaussian": lambda: ContinualCounter(8, rho=RHO, rng=0),
        "counter-glstree-gaussian": lambda: GLSTreeCounter(8, rho=RHO, rng=0),
        "counter-sqrt-gaussian": lambda: SqrtCounter(8, RHO, rng=0),
        "counter-blt-gaussian": lambda: BLTCounter(8, RHO, rng=0),
    }
    for name, make in counters.items():
        out[name] = lambda make=make: _counter_case(make().plan)

    def completion() -> Case:
        # privatize_observations with bounds (0, 1), grid 1/8: values in grid units 0..8, the identity
        # on the kept entries with unit 8 (Delta_1 = 8 grid units); neighbours 0 and 1 (0 and 8 units)
        plan = plan_measurement(st.identity(1), epsilon=EPS, unit=8.0, grid=1.0)
        ref = privatize_observations(sp.csr_matrix(([1.0], ([0], [0])), shape=(1, 1)), EPS, (0.0, 1.0), rng=0,
                                     grid=1 / 8)
        assert ref.discrete_scale == float(plan.scales[0]), (ref.discrete_scale, plan.scales)
        return Case(plan, np.array([0.0]), np.array([8.0]), counts=False, note="one entry 0 -> 1 (8 grid units)")

    out["completion"] = completion
    return out


def claim(plan) -> tuple[float, float]:
    """``(epsilon claimed, delta)``: the plan's epsilon, or rho converted to ``(eps(delta), delta)``."""
    if plan.noise == "laplace":
        return float(plan.cost.epsilon), 0.0
    return zcdp_to_approx_dp(float(plan.cost.rho), DELTA), DELTA


def run_one(name: str, case: Case, variant: str, trials: int, seed: int, raw: bool = False,
            alpha: float = 0.05) -> dict:
    plan = case.plan if variant == "correct" else halved(case.plan)
    eps_claim, delta = claim(case.plan)
    stat = None if raw else statistic(plan, case)
    t = time.perf_counter()
    res = audit(plan_release(plan, stat, counts=case.counts), case.x, case.x_prime, trials=trials, rng=seed,
                batched=True, delta=delta, alpha=alpha)
    sec = time.perf_counter() - t
    flagged = res.epsilon_lower > eps_claim
    ok = flagged if variant != "correct" else not flagged
    loss = float(case.plan.loss) * ((2.0 if plan.noise == "laplace" else 4.0) if variant != "correct" else 1.0)
    kind = "raw answers" if raw else ("orthant" if plan.noise == "laplace" else "likelihood ratio")
    return {"path": name, "variant": variant, "statistic": kind, "noise": plan.noise, "neighbours": case.note,
            "claimed_epsilon": eps_claim, "delta": delta,
            "claimed_rho": None if plan.noise == "laplace" else float(case.plan.cost.rho),
            "true_loss": loss, "epsilon_lower": res.epsilon_lower, "p_hat": res.p_hat, "q_hat": res.q_hat,
            "p_lower": res.p_lower, "q_upper": res.q_upper, "event": res.event, "trials": trials,
            "selection_trials": res.selection_trials, "held_out_trials": res.held_out_trials,
            "alpha": alpha, "seconds": sec, "flagged": flagged, "as_expected": ok}


def baseline(case: Case, trials: int, seed: int) -> dict:
    """The per-trial API on the same path (one ``plan.measure`` per trial) vs the batched protocol."""
    plan, stat = case.plan, statistic(case.plan, case)
    t = time.perf_counter()
    per = audit(lambda x, g: stat(plan.measure(x, rng=g, counts=case.counts).y[None, :]), case.x, case.x_prime,
                trials=trials, rng=seed)
    per_s = time.perf_counter() - t
    t = time.perf_counter()
    bat = audit(plan_release(plan, stat, counts=case.counts), case.x, case.x_prime, trials=trials, rng=seed,
                batched=True)
    bat_s = time.perf_counter() - t
    return {"trials": trials, "per_trial_seconds": per_s, "batched_seconds": bat_s,
            "speedup": per_s / bat_s, "per_trial_epsilon_lower": per.epsilon_lower,
            "batched_epsilon_lower": bat.epsilon_lower}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1_000_000)
    ap.add_argument("--paths", nargs="*", default=None)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--baseline-trials", type=int, default=4000)
    ap.add_argument("--alpha", type=float, default=0.05,
                    help="family-wise error of the whole table: each row's bound is at 1 - alpha / rows (Bonferroni)")
    ap.add_argument("--raw", action="store_true",
                    help="also audit the raw noisy answers (no path statistic): the generic auditor's power")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "audit.json")
    args = ap.parse_args()
    builders = cases()
    names = [n for n in builders if not args.paths or n in args.paths]
    unknown = set(args.paths or ()) - set(builders)
    if unknown:
        raise SystemExit(f"unknown paths {sorted(unknown)}; known: {list(builders)}")
    rows, base = [], None
    row_alpha = args.alpha / (len(names) * (4 if args.raw else 2))  # every row's bound holds jointly
    start = time.perf_counter()
    with blas_threads(1):
        for name in names:
            case = builders[name]()
            if base is None and args.baseline_trials:
                base = {"path": name, **baseline(case, args.baseline_trials, args.seed)}
                print(f"baseline {name}: {base['trials']} trials per-trial API {base['per_trial_seconds']:.2f} s, "
                      f"batched {base['batched_seconds']:.3f} s (x{base['speedup']:.0f})", flush=True)
            for raw, variant in [(False, "correct"), (False, "halved")] + [(True, "correct"), (True, "halved")] * args.raw:
                r = run_one(name, case, variant, args.trials, args.seed, raw, row_alpha)
                rows.append(r)
                miss = "  (missed: no power)" if raw else "  (UNEXPECTED)"
                tag = ("FLAGGED" if r["flagged"] else "ok") + ("" if r["as_expected"] else miss)
                print(f"{name:26s} {variant:8s} {'raw ' if raw else 'stat'} trials {r['trials']:>8d}  eps_lower {r['epsilon_lower']:6.3f} "
                      f"(claimed {r['claimed_epsilon']:.3f}{', delta %g' % r['delta'] if r['delta'] else ''}; "
                      f"true {'eps' if r['noise'] == 'laplace' else 'rho'} {r['true_loss']:.3f})  {tag}  {r['seconds']:6.1f} s", flush=True)
    total = time.perf_counter() - start
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.paths and args.out.exists():  # a partial run replaces only its own paths' rows
        prev = json.loads(args.out.read_text())
        order = list(builders)
        rows = sorted([r for r in prev.get("rows", []) if r["path"] not in names] + rows,
                      key=lambda r: order.index(r["path"]) if r["path"] in order else len(order))
        base = base or prev.get("baseline")
    blas = "user (environment)" if any(os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")) else 1
    args.out.write_text(json.dumps({
        "python": platform.python_version(), "blas_threads": blas, "family_alpha": args.alpha, "rho": RHO, "delta": DELTA,
        "run_seconds": total, "audit_seconds": sum(r["seconds"] for r in rows), "baseline": base, "rows": rows,
        "all_as_expected": all(r["as_expected"] for r in rows if r["statistic"] != "raw answers"),
        "command": "python benchmarks/bench_audit.py " + " ".join(sys.argv[1:]),
        "note": "machine shared with other helpers (2 cores): seconds are wall time under contention"},
        indent=2))
    print(f"total {total:.1f} s; written {args.out}")


if __name__ == "__main__":
    main()
