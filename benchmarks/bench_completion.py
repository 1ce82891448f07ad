"""Completion benchmark: the seed's Tables 1 and 2 (seed 003), the oracle floor, and a 20000^2 run.

Synthetic problems ``X = U V^T`` (``U, V`` standard normal, rank 10), a random 15% of entries observed
with Laplace noise of scale ``b``.  For DLNM-QR, LMaFit-SOR and ridge ALS (plus, told the noise level, ALS with the MAP ridge and
Soft-Impute):
seconds until the RSE is within 5% of its final value, total seconds (to the stopping rule), iterations,
final RSE, the oracle floor and RSE / floor.  The in-run baseline ratio is DLNM-QR's seconds over SOR's
(to 5% of final RSE, and total).  Then one 20000 x 20000 run at p = 0.01.

    python benchmarks/bench_completion.py [--skip-large] [--seed 0] [--out benchmarks/results/completion.json]

BLAS is pinned to one thread (threadpoolctl): on 2-core machines multi-threaded OpenBLAS is 10-30x
slower on these small dense factorisations.  Timings are wall-clock and inflated by other jobs on a
shared machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from sparsedp.completion import METHODS, oracle_rse, synthetic_problem  # noqa: E402

# the seed's own numbers (seed 003, Tables 1 and 2): seconds and RSE after 400 iterations
SEED_TABLE1 = {200: {"sor": (1.134501, 0.69485), "dlnm-qr": (0.129055, 0.1992), "am": (None, None)},
               500: {"sor": (8.005175, 0.089262), "dlnm-qr": (0.979278, 0.089262), "am": (321.898549, 0.078076)},
               1000: {"sor": (41.163018, 0.069397), "dlnm-qr": (5.435061, 0.069397), "am": (3088.747391, 0.050587)},
               2000: {"sor": (395.808449, 0.060423), "dlnm-qr": (17.391248, 0.060423), "am": (21727.373228, 0.034986)}}
SEED_TABLE2 = {0.2: {"sor": 0.35251, "dlnm-qr": 0.30315, "am": 0.12657}, 0.5: {"sor": 0.13909, "dlnm-qr": 0.12089, "am": 0.050314},
               1.0: {"sor": 0.069397, "dlnm-qr": 0.071362, "am": 0.050587}, 2.0: {"sor": 0.034677, "dlnm-qr": 0.030209, "am": 0.012561},
               5.0: {"sor": 0.013868, "dlnm-qr": 0.012083, "am": 0.0050237}, 10.0: {"sor": 0.0069336, "dlnm-qr": 0.0060417, "am": 0.0025118}}
RANK, P = 10, 0.15


def run(name: str, observed, truth, scale: float) -> dict:
    """One completion; ``soft`` (Soft-Impute, max rank 2r) and ``am-map`` (ALS with the MAP ridge)
    are told the noise level ``sqrt(2) b``, as a DP release publishes it."""
    kwargs = {"noise_std": np.sqrt(2) * scale} if name in ("soft", "am-map") else {}
    rank = 2 * RANK if name == "soft" else RANK
    t0 = time.perf_counter()
    res = METHODS["am" if name == "am-map" else name](observed, rank, truth=truth, **kwargs)
    wall = time.perf_counter() - t0
    return {"method": name, "seconds_to_5pct": res.history.seconds_to_within(0.05), "seconds": res.seconds,
            "wall_seconds": wall, "iterations": res.iterations, "converged": res.converged, "rse": res.rse,
            "rank": res.rank if name != "soft" else res.extra["rank"]}


def table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    head = f"{'size':>6}{'b':>6}{'method':>9}{'t(5%) s':>10}{'total s':>10}{'iters':>7}{'RSE':>10}{'oracle':>9}{'RSE/or':>8}{'seed s':>10}{'seed RSE':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        seed_s = "" if r.get("seed_seconds") is None else f"{r['seed_seconds']:.3g}"
        seed_rse = "" if r.get("seed_rse") is None else f"{r['seed_rse']:.4g}"
        print(f"{r['n']:>6}{r['scale']:>6g}{r['method']:>9}{r['seconds_to_5pct']:>10.3f}{r['seconds']:>10.3f}{r['iterations']:>7}"
              f"{r['rse']:>10.4f}{r['oracle_rse']:>9.4f}{r['rse'] / r['oracle_rse']:>8.3f}{seed_s:>10}{seed_rse:>10}")


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["n"], r["scale"]) for r in rows})
    for key in keys:
        by = {r["method"]: r for r in rows if (r["n"], r["scale"]) == key}
        if "dlnm-qr" in by and "sor" in by:
            d, s = by["dlnm-qr"], by["sor"]
            out.append({"n": key[0], "scale": key[1], "dlnm_over_sor_to_5pct": d["seconds_to_5pct"] / max(s["seconds_to_5pct"], 1e-9),
                        "dlnm_over_sor_total": d["seconds"] / s["seconds"], "rse_dlnm": d["rse"], "rse_sor": s["rse"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="random seed of the synthetic problems")
    ap.add_argument("--skip-large", action="store_true", help="skip the 20000 x 20000, p = 0.01 run")
    ap.add_argument("--out", default=str(HERE / "results" / "completion.json"), help="JSON output path")
    args = ap.parse_args(argv)
    with threadpool_limits(1):
        blas = [{"api": i.get("internal_api"), "threads": i.get("num_threads")} for i in threadpool_info()]
        print(f"BLAS threads pinned: {blas}")
        t1 = []
        for n in (200, 500, 1000, 2000):
            observed, truth = synthetic_problem(n, rank=RANK, p=P, noise_scale=1.0, rng=args.seed)
            floor = oracle_rse(n, rank=RANK, p=P, scale=1.0)
            for name in ("dlnm-qr", "sor", "am", "am-map", "soft"):
                row = {"n": n, "scale": 1.0, "oracle_rse": floor, **run(name, observed, truth, 1.0)}
                row["seed_seconds"], row["seed_rse"] = SEED_TABLE1[n].get(name, (None, None))
                t1.append(row)
        table(t1, f"Table 1: n x n, p = {P}, r = {RANK}, Laplace scale b = 1")
        t2 = []
        for b in (0.2, 0.5, 1.0, 2.0, 5.0, 10.0):
            observed, truth = synthetic_problem(1000, rank=RANK, p=P, noise_scale=b, rng=args.seed)
            floor = oracle_rse(1000, rank=RANK, p=P, scale=b)
            for name in ("dlnm-qr", "sor", "am", "am-map", "soft"):
                row = {"n": 1000, "scale": b, "oracle_rse": floor, **run(name, observed, truth, b)}
                row["seed_rse"] = SEED_TABLE2[b].get(name)
                t2.append(row)
        table(t2, f"Table 2: 1000 x 1000, p = {P}, r = {RANK}, Laplace scale b")
        r1, r2 = ratios(t1), ratios(t2)
        print("\nDLNM-QR / SOR seconds (to 5% of final RSE; total):")
        for r in r1 + r2:
            print(f"  n={r['n']:>5} b={r['scale']:>5g}: {r['dlnm_over_sor_to_5pct']:.2f}  {r['dlnm_over_sor_total']:.2f}"
                  f"   (RSE {r['rse_dlnm']:.4f} vs {r['rse_sor']:.4f})")
        large = []
        if not args.skip_large:
            n, p = 20000, 0.01
            t0 = time.perf_counter()
            observed, truth = synthetic_problem(n, rank=RANK, p=p, noise_scale=1.0, rng=args.seed)
            gen = time.perf_counter() - t0
            floor = oracle_rse(n, rank=RANK, p=p, scale=1.0)
            print(f"\nLarge: {n} x {n}, p = {p} ({observed.nnz} observed entries, generated in {gen:.1f} s)")
            for name in ("dlnm-qr", "sor"):
                row = {"n": n, "p": p, "scale": 1.0, "oracle_rse": floor, **run(name, observed, truth, 1.0)}
                large.append(row)
                print(f"  {name:>8}: {row['seconds']:.1f} s total, {row['seconds_to_5pct']:.1f} s to 5%, "
                      f"{row['iterations']} iterations, RSE {row['rse']:.4f} (oracle {floor:.4f})", flush=True)
    out = {"machine": platform.platform(), "python": platform.python_version(), "blas": blas,
           "note": "wall-clock on a shared 2-core machine; inflated by contention",
           "table1": t1, "table2": t2, "ratios": r1 + r2, "large": large}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
