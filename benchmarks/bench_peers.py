"""sparsedp against its peers, side by side in one run: HDMM's p-Identity and ResidualPlanner.

The peers are read from checkouts given on the command line (never installed into, copied into or
vendored by sparsedp); a peer that is not given or does not import is skipped with a message.

* ``hdmm`` (pure DP, Laplace, ``eps = 1``): ``prefix`` and ``all_ranges`` at ``n = 256`` and
  ``1024``.  sparsedp: ``sparsedp.optimize(W)`` with its defaults, as a user calls it (deterministic,
  ``rng=0``).  HDMM (McKenna et al., VLDB 2018, github.com/dpcomp-org/hdmm): its p-Identity
  optimiser with its own defaults, ``templates.PIdentity(n // 16, n, seed).optimize(W)`` (``p =
  n / 16`` as its ``OPT0`` and README use; random ``U[0, 1]`` start; L-BFGS-B with ``ftol = 1e-4``),
  one run per seed ``0 .. --seeds - 1``.  Error in one unit for both: HDMM's own
  ``error.expected_error(W, A, eps=1)`` (continuous Laplace, ``2 Delta_1^2 tr(W^T W (A^T A)^+)``),
  applied to HDMM's strategy and to the strategy sparsedp returns.  sparsedp's ``error.total`` is
  also listed: it is the error under the noise sparsedp runs by default (exact discrete Laplace,
  whose variance on the integer grid is below the continuous one: the identity's is 0.92x).
  Cross-check at ``n = 256``: ``sparsedp.expected_error`` of HDMM's strategy under float Laplace
  equals HDMM's number.
* ``rp`` (zCDP, Gaussian, sum of variances): 100 attributes of size 10, all 2-way marginals
  (4,950); 50 attributes of size 10, all marginals of order ``<= 3`` (20,876).  sparsedp:
  ``sparsedp.optimize(marginal_workload(dom, k=...), noise="gaussian")`` (the residual optimum; the
  default noise is Laplace, which gives HDMM-style weighted marginals instead).  ResidualPlanner
  (Xiao, He, Zhang, Kifer, NeurIPS 2023, github.com/dkifer/ResidualPlanner): its selection-only
  sum-of-variance planner ``RPSumVar`` (``selection_only/class_sumvar.py``), timed as its own
  experiment scripts time it: enumerate the marginals and ``input_mech`` each (the per-residual
  coefficients), then ``get_noise_level()`` (the closed-form budget split); the closed form alone
  is listed too.  sparsedp is timed with the workload built (``optimize`` only) and including
  ``marginal_workload``.  Both objectives are the sum of all cells' variances; compared at RP's
  unit, privacy cost ``sum_A p_A / sigma_A^2 = 1`` (``rho = 1/2``): sparsedp's total at ``rho = 1``
  times 2.  ``class_sumvar.py`` imports ``gurobipy`` and ``cvxpy`` at the top but the
  sum-of-variance path calls neither; where they are not installed, empty stand-in modules are
  registered for the import (``--no-stub`` to refuse).

Timings are wall-clock, BLAS pinned to one thread for sparsedp and the peers alike
(``threadpoolctl``, ``--threads``); the repeats of sparsedp and of the peer are interleaved and the
median reported (the machine is shared: expect +-30%); each row also lists the first call in the
process (one-time set-up included).  Ratios are sparsedp / peer within this run.

Getting the peers (any checkout works; the commits measured are in the JSON)::

    git clone https://github.com/dpcomp-org/hdmm /tmp/peers/hdmm
    git clone https://github.com/dkifer/ResidualPlanner /tmp/peers/ResidualPlanner
    python benchmarks/bench_peers.py --hdmm /tmp/peers/hdmm/src --rp /tmp/peers/ResidualPlanner
        [--parts hdmm rp] [--seeds 3] [--repeats 5] [--large-repeats 3] [--threads 1]
        [--out benchmarks/results/peers.json]

HDMM is AGPL and ResidualPlanner GPL: they are run from their checkouts, never copied here.
HDMM's ``EkteloMatrix.sensitivity`` calls ``np.abs(self)`` relying on ``__abs__``, which scipy's
``LinearOperator`` (``__array_ufunc__ = None``) no longer allows; the run replaces that one method
by ``abs(self)`` (the same computation, HDMM's own ``__abs__``) before calling ``expected_error``.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import sparsedp  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp.marginals import Domain, marginal_workload, select_residuals  # noqa: E402

from _results import write_rows  # noqa: E402


#: A marginal ``optimize`` call slower than this (s) on its first run is timed once more, not ``--repeats`` times.
SLOW_OPTIMIZE = 5.0


def _commit(path: Path) -> str | None:
    for p in [path, *path.parents]:
        if (p / ".git").exists():
            try:
                return subprocess.run(["git", "-C", str(p), "rev-parse", "HEAD"], capture_output=True, text=True,
                                      check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError):
                return None
    return None


def _timed(f):
    t = time.perf_counter()
    out = f()
    return out, time.perf_counter() - t


# -- HDMM --------------------------------------------------------------------------------------

def load_hdmm(path: str | None):
    if not path:
        print("hdmm: skipped (no --hdmm PATH to HDMM's src/ directory)")
        return None
    src = Path(path).resolve()
    if (src / "src" / "hdmm").is_dir():
        src = src / "src"
    sys.path.insert(0, str(src))
    try:
        from hdmm import error, matrix, templates, workload
    except Exception as exc:  # noqa: BLE001  (any import failure: the peer is skipped)
        print(f"hdmm: skipped ({type(exc).__name__}: {exc}; --hdmm must be HDMM's src/ directory)")
        return None
    matrix.EkteloMatrix.sensitivity = lambda self: float(np.max(abs(self).sum(axis=0)))  # see module doc
    return types.SimpleNamespace(error=error, matrix=matrix, templates=templates, workload=workload,
                                 path=str(src), commit=_commit(src))


def hdmm_row(hd, kind: str, n: int, seeds: int, repeats: int) -> dict:
    W_s = wl.prefix(n) if kind == "prefix" else wl.all_ranges(n)
    W_h = hd.workload.Prefix(n) if kind == "prefix" else hd.workload.AllRange(n)
    p = max(n // 16, 1)

    def run_hdmm(seed):
        pid = hd.templates.PIdentity(p, n, seed=seed)
        pid.optimize(W_h)
        return pid.strategy()

    def err_hdmm(A):
        return float(hd.error.expected_error(W_h, A, eps=1.0))

    first_res, first_s = _timed(lambda: sparsedp.optimize(W_s))
    first_h, first_hs = _timed(lambda: run_hdmm(0))
    sp_s, h_s, h_err = [], [], []
    res = first_res
    for rep in range(max(repeats, seeds)):
        if rep < repeats:
            res, s = _timed(lambda: sparsedp.optimize(W_s))
            sp_s.append(s)
        if rep < seeds:
            A, s = _timed(lambda: run_hdmm(rep))
            h_s.append(s)
            h_err.append(err_hdmm(A))
    # the certified lower bound: computed on first access of ``res.lower_bound`` (issue 27), timed here
    bound, bound_s = _timed(lambda: res.lower_bound)
    M = res.strategy
    M = M.tosparse() if hasattr(M, "tosparse") else M
    M = M.toarray() if hasattr(M, "toarray") else np.asarray(M, dtype=np.float64)
    sp_err_hdmm_units = err_hdmm(hd.matrix.EkteloMatrix(np.asarray(M, dtype=np.float64)))
    row = {
        "part": "hdmm", "workload": kind, "n": n, "noise": "laplace", "epsilon": 1.0,
        "sparsedp": {"call": "sparsedp.optimize(W)", "family": res.family, "name": res.name,
                     "error_total_default_noise": res.error.total, "error_method": res.error.method,
                     "error_hdmm_formula": sp_err_hdmm_units, "seconds_median": statistics.median(sp_s),
                     "seconds_min": min(sp_s), "seconds_each": sp_s, "first_call_seconds": first_s,
                     "lower_bound": bound, "lower_bound_first_access_seconds": bound_s,
                     "history": [{"family": t.family, "name": t.name, "error": t.error, "seconds": t.seconds}
                                 for t in res.history]},
        "hdmm": {"call": f"templates.PIdentity({p}, {n}, seed).optimize(W)", "p": p, "seeds": list(range(seeds)),
                 "error_each": h_err, "error_median": statistics.median(h_err), "error_min": min(h_err),
                 "seconds_each": h_s, "seconds_median": statistics.median(h_s), "seconds_min": min(h_s),
                 "first_call_seconds": first_hs},
    }
    row["error_ratio"] = sp_err_hdmm_units / row["hdmm"]["error_median"]
    row["error_ratio_to_best_seed"] = sp_err_hdmm_units / row["hdmm"]["error_min"]
    row["time_ratio"] = row["sparsedp"]["seconds_median"] / row["hdmm"]["seconds_median"]
    if n <= 256:
        from sparsedp import MatrixMechanism, expected_error

        A = first_h.matrix
        A = np.asarray(A.toarray() if hasattr(A, "toarray") else A, dtype=np.float64)
        mech = MatrixMechanism(W_s, A, epsilon=1.0, secure=False)
        ours = expected_error(W_s, A, mech.variances(), method="exact").total
        row["cross_check"] = {"sparsedp_expected_error_of_hdmm_strategy": ours,
                              "hdmm_expected_error": err_hdmm(first_h), "rel_diff": ours / err_hdmm(first_h) - 1}
        row["target"] = {"what": "sparsedp no slower than HDMM at equal or lower error",
                         "met": bool(row["time_ratio"] <= 1.0 and row["error_ratio"] <= 1.0)}
    elif kind == "all_ranges":
        row["target"] = {"what": "sparsedp under 30 s", "met": bool(row["sparsedp"]["seconds_median"] < 30.0)}
    return row


# -- ResidualPlanner ---------------------------------------------------------------------------

def load_rp(path: str | None, stub: bool):
    if not path:
        print("rp: skipped (no --rp PATH to a ResidualPlanner checkout)")
        return None
    root = Path(path).resolve()
    sel = next((p for p in (root / "residual_planner" / "selection_only", root / "selection_only", root)
                if (p / "class_sumvar.py").is_file()), None)
    if sel is None:
        print(f"rp: skipped (no class_sumvar.py under {root})")
        return None
    sys.path.insert(0, str(sel))
    stubbed = []
    for name in ("gurobipy", "cvxpy"):
        try:
            __import__(name)
        except ImportError:
            if not stub:
                print(f"rp: skipped ({name} is not installed and --no-stub was given)")
                return None
            mod = types.ModuleType(name)
            mod.GRB = None  # class_sumvar: ``from gurobipy import GRB``
            sys.modules[name] = mod
            stubbed.append(name)
    try:
        import class_sumvar
    except Exception as exc:  # noqa: BLE001
        print(f"rp: skipped ({type(exc).__name__}: {exc})")
        return None
    return types.SimpleNamespace(RPSumVar=class_sumvar.RPSumVar, path=str(sel), commit=_commit(sel), stubbed=stubbed)


def rp_row(rp, d: int, size: int, k: int, exact: bool, repeats: int) -> dict:
    dom = Domain.uniform(d, size)
    label = f"{d} attributes of size {size}, {'all ' + str(k) + '-way' if exact else 'all <= ' + str(k) + '-way'}"

    def build_sp():
        return marginal_workload(dom, k=k, exact=exact)

    def run_rp():
        system = rp.RPSumVar([size] * d)
        for r in ([k] if exact else range(k + 1)):
            for S in itertools.combinations(range(d), r):
                system.input_mech(S)
        t = time.perf_counter()
        obj = system.get_noise_level()
        return obj, time.perf_counter() - t, system.num_of_res

    W, first_build = _timed(build_sp)
    first_res, first_s = _timed(lambda: sparsedp.optimize(W, noise="gaussian"))
    (_, _, _), first_rp = _timed(run_rp)
    sp_reps = repeats if first_s < SLOW_OPTIMIZE else 1  # a slow optimize call: timed once more only
    sp_s, sp_build, sel_s, rp_s, rp_solve = [], [], [], [], []
    res = first_res
    for rep in range(repeats):
        W, b = _timed(build_sp)
        if rep < sp_reps:
            res, s = _timed(lambda: sparsedp.optimize(W, noise="gaussian"))
            sp_s.append(s), sp_build.append(b + s)
        sel, s = _timed(lambda: select_residuals(dom, W.marginals, 1.0))  # the selection step alone
        sel_s.append(s)
        (obj, solve, nres), s = _timed(run_rp)
        rp_s.append(s), rp_solve.append(solve)
    bound_s = None
    try:  # the certified lower bound optimize attaches (where this version has one), timed alone
        mlb = getattr(importlib.import_module("sparsedp.optimize.bounds"), "multidim_lower_bound", None)
    except ImportError:
        mlb = None
    if mlb is not None:
        _, bound_s = _timed(lambda: mlb(W, "gaussian"))
    sp_obj_rp_units = 2.0 * res.error.total  # rho = 1 -> rho = 1/2
    row = {
        "part": "rp", "workload": label, "n": f"{d}x{size}", "attributes": d, "size": size, "k": k, "exact": exact,
        "marginals": len(W.marginals), "cells": W.cells, "noise": "gaussian",
        "sparsedp": {"call": f"sparsedp.optimize(marginal_workload(dom, k={k}, exact={exact}), noise='gaussian')",
                     "family": res.family, "residuals": len(res.strategy.residuals),
                     "sum_of_variances_rho_1": res.error.total, "sum_of_variances_rp_units": sp_obj_rp_units,
                     "seconds_median": statistics.median(sp_s), "seconds_min": min(sp_s), "seconds_each": sp_s,
                     "with_workload_build_median": statistics.median(sp_build), "first_call_seconds": first_s,
                     "first_workload_build_seconds": first_build,
                     "select_residuals_seconds_median": statistics.median(sel_s), "select_residuals_value": sel.value,
                     "lower_bound_seconds": bound_s},
        "rp": {"call": "RPSumVar(domains); input_mech(S) per marginal; get_noise_level()", "residuals": nres,
               "sum_of_variances_rp_units": float(obj), "seconds_median": statistics.median(rp_s),
               "seconds_min": min(rp_s), "seconds_each": rp_s, "solve_only_median": statistics.median(rp_solve),
               "first_call_seconds": first_rp},
    }
    row["objective_rel_diff"] = sp_obj_rp_units / float(obj) - 1.0
    row["time_ratio"] = row["sparsedp"]["seconds_median"] / row["rp"]["seconds_median"]
    row["selection_time_ratio"] = row["sparsedp"]["select_residuals_seconds_median"] / row["rp"]["seconds_median"]
    row["time_ratio_with_build"] = row["sparsedp"]["with_workload_build_median"] / row["rp"]["seconds_median"]
    same = abs(row["objective_rel_diff"]) < 1e-9
    row["target"] = {"what": "no slower than ResidualPlanner's selection at the same objective",
                     "met_selection": bool(row["selection_time_ratio"] <= 1.0 and same),
                     "met_optimize": bool(row["time_ratio"] <= 1.0 and same)}
    if exact and k == 2 and d == 100:
        row["target"] = {"what": "optimize under 0.2 s", "met": bool(row["sparsedp"]["seconds_median"] < 0.2 and same),
                         "met_selection": bool(row["selection_time_ratio"] <= 1.0 and same),
                         "met_optimize": bool(row["time_ratio"] <= 1.0 and same)}
    return row


def _verdict(t: dict) -> str:
    parts = [f"{'met' if t['met'] else 'MISSED'} ({t['what']})"] if "met" in t else [t["what"] + ":"]
    parts.append(f"select {'met' if t['met_selection'] else 'MISSED'}, optimize {'met' if t['met_optimize'] else 'MISSED'}"
                 " vs RP")
    return " ".join(parts)


# -- output ------------------------------------------------------------------------------------

def print_tables(rows: list[dict]) -> None:
    h = [r for r in rows if r["part"] == "hdmm"]
    if h:
        print("\nHDMM p-Identity vs sparsedp.optimize(W), Laplace eps = 1, total squared error "
              "(HDMM's expected_error on both strategies; sparsedp's own figure under its exact discrete noise in [])")
        print(f"{'workload':<11}{'n':>6} {'sparsedp error':>26}{'s':>8}  {'HDMM error (median)':>20}{'s':>8}"
              f"{'err ratio':>10}{'time ratio':>11}  target")
        for r in h:
            s, p = r["sparsedp"], r["hdmm"]
            t = r.get("target")
            print(f"{r['workload']:<11}{r['n']:>6} {s['error_hdmm_formula']:>12.5g} [{s['error_total_default_noise']:>10.5g}]"
                  f"{s['seconds_median']:>8.3f}  {p['error_median']:>20.5g}{p['seconds_median']:>8.3f}"
                  f"{r['error_ratio']:>10.3f}{r['time_ratio']:>11.2f}  "
                  f"{'' if t is None else ('met' if t['met'] else 'MISSED') + ' (' + t['what'] + ')'}")
        for r in h:
            p = r["hdmm"]
            print(f"  {r['workload']} {r['n']}: sparsedp chose {r['sparsedp']['name']} (first call "
                  f"{r['sparsedp']['first_call_seconds']:.2f} s); HDMM seeds {p['seeds']}: errors "
                  + ", ".join(f"{e:.5g}" for e in p["error_each"]) + "; seconds "
                  + ", ".join(f"{x:.3f}" for x in p["seconds_each"])
                  + (f"; cross-check rel diff {r['cross_check']['rel_diff']:.1e}" if "cross_check" in r else ""))
    m = [r for r in rows if r["part"] == "rp"]
    if m:
        print("\nResidualPlanner (RPSumVar selection) vs sparsedp.optimize(marginal_workload, noise='gaussian'), "
              "sum of variances at privacy cost 1 (rho = 1/2)")
        print(f"{'workload':<42}{'marginals':>10} {'sparsedp obj':>14}{'select s':>9}{'optimize s':>11}"
              f"{'(bound s)':>10}  {'RP obj':>14}{'RP s':>8}{'(solve)':>9}{'obj rel diff':>13}"
              f"{'select/RP':>10}{'optimize/RP':>12}  target")
        for r in m:
            s, p = r["sparsedp"], r["rp"]
            t = r["target"]
            b = "-" if s["lower_bound_seconds"] is None else f"{s['lower_bound_seconds']:.3f}"
            print(f"{r['workload']:<42}{r['marginals']:>10} {s['sum_of_variances_rp_units']:>14.8g}"
                  f"{s['select_residuals_seconds_median']:>9.3f}{s['seconds_median']:>11.3f}{b:>10}"
                  f"  {p['sum_of_variances_rp_units']:>14.8g}{p['seconds_median']:>8.3f}{p['solve_only_median']:>9.4f}"
                  f"{r['objective_rel_diff']:>13.1e}{r['selection_time_ratio']:>10.2f}{r['time_ratio']:>12.2f}"
                  f"  {_verdict(t)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hdmm", help="HDMM's src/ directory (or the checkout holding it)")
    ap.add_argument("--rp", help="a ResidualPlanner checkout (or its selection_only/ directory)")
    ap.add_argument("--parts", nargs="+", default=["hdmm", "rp"], choices=["hdmm", "rp"])
    ap.add_argument("--seeds", type=int, default=3, help="HDMM runs (seeds 0..seeds-1) per row")
    ap.add_argument("--repeats", type=int, default=5, help="timed sparsedp runs per row (and RP runs)")
    ap.add_argument("--large-repeats", type=int, default=3, help="timed sparsedp runs at n = 1024")
    ap.add_argument("--large", nargs="*", default=["all_ranges", "prefix"], help="workloads also run at n = 1024")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-stub", action="store_true", help="skip RP unless gurobipy and cvxpy import")
    ap.add_argument("--out", default=str(HERE / "results" / "peers.json"))
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of --out that this run did not measure (e.g. the rp rows with --parts hdmm)")
    args = ap.parse_args()
    rows: list[dict] = []
    peers = {}
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    with threadpool_limits(limits=args.threads, user_api="blas"):
        blas = [{k: d.get(k) for k in ("internal_api", "num_threads", "version")} for d in threadpool_info()]
        if "hdmm" in args.parts:
            hd = load_hdmm(args.hdmm)
            if hd is not None:
                peers["hdmm"] = {"path": hd.path, "commit": hd.commit}
                for kind, n in [("prefix", 256), ("all_ranges", 256)] + [(k, 1024) for k in args.large]:
                    reps = args.repeats if n <= 256 else args.large_repeats
                    rows.append(hdmm_row(hd, kind, n, args.seeds, reps))
                    r = rows[-1]
                    print(f"done {kind} {n}: sparsedp {r['sparsedp']['error_hdmm_formula']:.5g} in "
                          f"{r['sparsedp']['seconds_median']:.3f} s, HDMM {r['hdmm']['error_median']:.5g} in "
                          f"{r['hdmm']['seconds_median']:.3f} s", flush=True)
        if "rp" in args.parts:
            rp = load_rp(args.rp, not args.no_stub)
            if rp is not None:
                peers["rp"] = {"path": rp.path, "commit": rp.commit, "stubbed_imports": rp.stubbed}
                for d, k, exact in [(100, 2, True), (50, 3, False)]:
                    rows.append(rp_row(rp, d, 10, k, exact, args.repeats))
                    r = rows[-1]
                    print(f"done {r['workload']}: sparsedp {r['sparsedp']['seconds_median']:.3f} s, "
                          f"RP {r['rp']['seconds_median']:.3f} s", flush=True)
    print_tables(rows)
    if hasattr(os, "getloadavg"):
        print(f"\nload average (1, 5, 15 min) before {load_before}, after {os.getloadavg()} on {os.cpu_count()} CPUs")
    out = {
        "benchmark": "peers",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "numpy": np.__version__},
        "blas": blas,
        "threads": args.threads,
        "peers": peers,
        "timing": "wall clock; medians of interleaved repeats; BLAS pinned for sparsedp and the peers",
        "load_average_before_after": [load_before, os.getloadavg() if hasattr(os, "getloadavg") else None],
        "rows": rows,
    }
    if rows:
        if args.merge and Path(args.out).exists():  # the peers of the rows kept
            import json

            out["peers"] = {**json.loads(Path(args.out).read_text()).get("peers", {}), **peers}
        write_rows(args.out, out, merge=args.merge)


if __name__ == "__main__":
    main()
