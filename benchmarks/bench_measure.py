"""Exact against float noise on every release path, in one run (issue 13's throughput target).

Issue 13: "every release path with exact noise within 1.25x of its float-noise time at its
benchmark size".  For each path the whole release (calibration, validation, the measurement and the
post-processing the path does) is timed with ``secure=True`` (exact discrete noise through
:mod:`sparsedp.measure`, the default) and ``secure=False`` (float64 noise, the explicit opt-out),
on the same data:

==========================  ====================================================================
path                        release timed (size)
==========================  ====================================================================
matrix mechanism            ``MatrixMechanism(prefix(n), hierarchical(n, 16))``: plan, measure,
                            two-pass GLS reconstruction (``n = 2^20``)
trees                       ``LUEDPTree(1).fit`` and ``Boost(1).fit`` (``n = 2^20``, counts 0..99,
                            as ``bench_trees.py --measure-only``)
flows                       ``release_flows`` on a 316 x 316 road grid (10^5 intersections), both
                            end-point models (as ``bench_flows.py --measure-only``)
restaurant                  ``restaurant_release`` of ``T = 2^20`` days (synthetic sales built
                            once, untimed)
continual                   build + all ``N`` steps of every counter at ``N = 2^20``; the square
                            root (``O(t)`` per step with float noise) and BLT at ``N = 2^14``,
                            BLT also at ``2^20`` (as ``bench_continual.py --exact-only``)
completion                  ``privatize_observations`` entry and user level (``k = 20``) on the
                            1000 x 1000, p = 0.15 (150k entries) and 20000 x 20000, p = 0.01 (4M
                            entries) patterns of ``bench_completion.py --release-only``
==========================  ====================================================================

Paths run one after the other.  Per path: the data are built (untimed), one warm-up release with
each noise is timed apart (``first_exact_s`` / ``first_float_s``: the exact sampler builds a table
per noise scale on first use -- about 200 scales for LUE-DPTree, 380 for the FDA weights -- which a
long-running process pays once), then ``--reps`` repetitions, exact and float back to back with the
order alternating, so contention from other jobs hits both alike; the table reports the medians
and their ratio (target ``<= 1.25``).  BLAS is pinned to one thread (:func:`sparsedp._threads.blas_threads`; the count is
recorded).  Results: ``benchmarks/results/measure.json``, rewritten after every path
(``"complete": false`` until the last).

    python benchmarks/bench_measure.py [--reps 5] [--paths trees completion ...] [--out FILE]
    python benchmarks/bench_measure.py --quick      # small sizes, a few seconds (a smoke test)

Timings on a shared machine are inflated by other jobs: the ratio of medians from the same run is
the number to read, not the seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_completion import synthetic_problem  # noqa: E402  (the release benchmark's patterns)

from sparsedp import MatrixMechanism, reconstruct  # noqa: E402
from sparsedp import strategies as st  # noqa: E402
from sparsedp import workloads as wl  # noqa: E402
from sparsedp._threads import blas_threads  # noqa: E402
from sparsedp.completion import privatize_observations  # noqa: E402
from sparsedp.consistency import restaurant, restaurant_release  # noqa: E402
from sparsedp.continual import (  # noqa: E402
    BLT,
    BinaryMechanism,
    BLTCounter,
    ContinualCounter,
    GLSTreeCounter,
    HonakerCounter,
    KaryCounter,
    NaiveCounter,
    NegDigitCounter,
    SqrtCounter,
    default_radices,
    fit_blt,
    gls_tree_weights,
)
from sparsedp.flows import random_trips, release_flows, road_grid  # noqa: E402
from sparsedp.trees import Boost, LUEDPTree  # noqa: E402

TARGET = 1.25
EPS = 1.0
RHO = EPS**2 / 2


@dataclass
class ReleasePath:
    """One release path at one size: ``setup()`` builds the data (untimed), ``run(data, secure)`` is
    the timed release."""

    group: str
    name: str
    size: str
    setup: Callable[[], Any]
    run: Callable[[Any, bool], Any]


def _counter_run(make: Callable[[bool], Any], n: int) -> Callable[[Any, bool], Any]:
    def run(_: Any, secure: bool) -> None:
        c = make(secure)
        update = c.update
        for _ in range(n):
            update(1)

    return run


def paths(quick: bool) -> list[ReleasePath]:
    """Every release path at its benchmark size (``quick``: small sizes for a smoke test)."""
    n_mm = 2**10 if quick else 2**20
    n_tree = 2**10 if quick else 2**20
    side = 12 if quick else 316
    days = 2**6 if quick else 2**20
    n_cont = 2**8 if quick else 2**20
    n_toep = 2**6 if quick else 2**14
    comp = ((40, 0.2),) if quick else ((1000, 0.15), (20000, 0.01))
    out: list[ReleasePath] = []

    def mm_setup() -> tuple[Any, Any, np.ndarray]:
        return wl.prefix(n_mm), st.hierarchical(n_mm, 16), np.random.default_rng(0).integers(0, 100, n_mm).astype(float)

    def mm_run(data: tuple[Any, Any, np.ndarray], secure: bool) -> None:
        W, M, x = data
        reconstruct(MatrixMechanism(W, M, epsilon=EPS, secure=secure).measure(x))

    out.append(ReleasePath("matrix mechanism", "hierarchical k=16, prefix workload", f"n = 2^{n_mm.bit_length() - 1}",
                     mm_setup, mm_run))

    def tree_setup() -> np.ndarray:
        return np.random.default_rng(0).integers(0, 100, n_tree).astype(np.float64)

    for name, cls in (("LUE-DPTree", LUEDPTree), ("Boost", Boost)):
        out.append(ReleasePath("trees", name, f"n = 2^{n_tree.bit_length() - 1}", tree_setup,
                         lambda x, s, cls=cls: cls(EPS, secure=s).fit(x)))

    def flows_setup() -> tuple[Any, Any]:
        road = road_grid(side, side, seed=0)  # bench_flows.py --measure-only's instance
        trips = random_trips(road, road.nodes // 2, seed=1, max_edges=40, origins=min(2000, road.nodes // 4),
                             radius=30.0)
        return road, trips

    for fixed in (False, True):
        out.append(ReleasePath("flows", f"release_flows ({'fixed' if fixed else 'variable'} end points)",
                         f"{side * side:,} intersections", flows_setup,
                         lambda d, s, fixed=fixed: release_flows(d[0], d[1], epsilon=EPS, fixed_endpoints=fixed,
                                                                 secure=s)))

    out.append(ReleasePath("restaurant", "restaurant_release (auto)", f"T = 2^{days.bit_length() - 1} days",
                     lambda: restaurant(days, seed=0),
                     lambda sales, s: restaurant_release(sales=sales, epsilon=EPS, secure=s)))

    blt_small = {}
    gls = {}

    def blt_for(n: int) -> Any:
        if n not in blt_small:  # --quick: a fixed two-buffer decoder (fitting takes seconds)
            blt_small[n] = BLT(np.array([0.3, 0.2]), np.array([0.5, 0.9])) if quick else fit_blt(n, 5)
        return blt_small[n]

    def gls_lam() -> np.ndarray:
        if "lam" not in gls:
            gls["lam"] = gls_tree_weights(n_cont, default_radices(n_cont, 12))
        return gls["lam"]

    N = n_cont
    blt_name = "BLT, 2 buffers (zCDP)" if quick else "BLT, 5 buffers (zCDP)"
    counters: list[tuple[str, int, Callable[[bool], Any]]] = [
        ("naive", N, lambda s: NaiveCounter(N, EPS, secure=s)),
        ("binary = Fenwick", N, lambda s: BinaryMechanism(N, EPS, secure=s)),
        ("Honaker", N, lambda s: HonakerCounter(N, EPS, secure=s)),
        ("Fenwick + FDA", N, lambda s: ContinualCounter(N, epsilon=EPS, secure=s)),
        ("Fenwick + FDA (L2, zCDP)", N, lambda s: ContinualCounter(N, rho=RHO, secure=s)),
        ("16-ary tree", N, lambda s: KaryCounter(N, EPS, k=16, secure=s)),
        ("19-ary negative digits", N, lambda s: NegDigitCounter(N, EPS, k=19, secure=s)),
        ("12-ary GLS tree", N, lambda s: GLSTreeCounter(N, EPS, weights=gls_lam(), secure=s)),
        ("square root (zCDP)", n_toep, lambda s: SqrtCounter(n_toep, RHO, secure=s)),
        (blt_name, n_toep, lambda s: BLTCounter(n_toep, RHO, blt=blt_for(n_toep), secure=s)),
    ]
    if not quick:
        counters.append((blt_name, N, lambda s: BLTCounter(N, RHO, blt=blt_for(N), secure=s)))
    for name, n, make in counters:
        setup = (lambda: gls_lam()) if "GLS" in name else (lambda n=n: blt_for(n)) if "BLT" in name else (lambda: None)
        out.append(ReleasePath("continual", name, f"N = 2^{n.bit_length() - 1}", setup, _counter_run(make, n)))

    for side_c, p in comp:
        for k in (None, 20):
            out.append(ReleasePath("completion", f"privatize_observations ({'entry' if k is None else f'user, k = {k}'})",
                             f"{side_c}^2, p = {p}",
                             lambda side_c=side_c, p=p: synthetic_problem(side_c, rank=2, p=p, rng=0)[0],
                             lambda obs, s, k=k: privatize_observations(obs, EPS, (-5.0, 5.0), max_entries_per_row=k,
                                                                        secure=s)))
    return out


def blas_info() -> list[dict]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover
        return []
    return [{"api": i.get("internal_api"), "threads": i.get("num_threads")} for i in threadpool_info()
            if i.get("user_api") == "blas"]


def run(selected: list[ReleasePath], reps: int, log: Callable[[str], None] = print,
        partial: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Time every path (see the module docstring): build its data, one untimed warm-up release with
    each noise (recorded as ``first_*_s``: the exact sampler builds its tables on first use of a
    scale, and other paths would evict them), then ``reps`` repetitions, exact and float back to
    back in alternating order.  ``partial(rows)`` is called after every path with the rows so far."""
    times: dict[tuple[int, bool], list[float]] = {}
    first: dict[tuple[int, bool], float] = {}
    done: list[ReleasePath] = []
    for i, p in enumerate(selected):
        t0 = time.perf_counter()
        data = p.setup()
        log(f"  {p.group}: {p.name} ({p.size}): data {time.perf_counter() - t0:.1f} s")
        for secure in (True, False):
            gc.collect()
            t0 = time.perf_counter()
            p.run(data, secure)
            first[(i, secure)] = time.perf_counter() - t0
            times[(i, secure)] = []
        for r in range(reps):
            for secure in ((True, False) if r % 2 == 0 else (False, True)):
                gc.collect()
                t0 = time.perf_counter()
                p.run(data, secure)
                times[(i, secure)].append(time.perf_counter() - t0)
        del data
        done.append(p)
        ex, fl = np.median(times[(i, True)]), np.median(times[(i, False)])
        log(f"    float {fl:.3f} s, exact {ex:.3f} s, ratio {ex / fl:.2f} (medians of {reps})")
        if partial is not None and i + 1 < len(selected):
            partial(_rows(done, times, first))
    return _rows(selected, times, first)


def _rows(selected: list[ReleasePath], times: dict[tuple[int, bool], list[float]],
          first: dict[tuple[int, bool], float]) -> list[dict]:
    rows = []
    for i, p in enumerate(selected):
        ex, fl = times[(i, True)], times[(i, False)]
        ratio = float(np.median(ex) / np.median(fl))
        rows.append({"group": p.group, "path": p.name, "size": p.size, "reps": len(ex),
                     "float_s": fl, "exact_s": ex, "float_median_s": float(np.median(fl)),
                     "exact_median_s": float(np.median(ex)), "ratio_median": ratio,
                     "ratio_min": float(min(ex) / min(fl)), "first_float_s": first[(i, False)],
                     "first_exact_s": first[(i, True)], "target": TARGET, "met": ratio <= TARGET})
    return rows


def table(rows: list[dict]) -> str:
    head = f"{'group':<17}{'path':<44}{'size':<26}{'float s':>9}{'exact s':>9}{'ratio':>7}{'target':>7}  met"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['group']:<17}{r['path']:<44}{r['size']:<26}{r['float_median_s']:>9.3f}"
                     f"{r['exact_median_s']:>9.3f}{r['ratio_median']:>7.2f}{r['target']:>7.2f}  "
                     f"{'yes' if r['met'] else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=None, help="interleaved repetitions per path (default 5; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke test of the script")
    ap.add_argument("--paths", nargs="*", default=None,
                    help="groups to run (matrix, trees, flows, restaurant, continual, completion; default all)")
    ap.add_argument("--out", default=None, help="JSON output (default benchmarks/results/measure.json; "
                    "--quick: not written unless given)")
    args = ap.parse_args(argv)
    reps = args.reps if args.reps is not None else (1 if args.quick else 5)
    selected = paths(args.quick)
    if args.paths:
        keep = [g.lower() for g in args.paths]
        selected = [p for p in selected if any(p.group.lower().startswith(k) for k in keep)]
    with blas_threads(1):
        blas = blas_info()
        note = (f"shared machine ({os.cpu_count()} cores, other jobs running): timings are inflated by "
                f"contention; ratios are of medians of {reps} interleaved repetitions in one run")
        print(f"BLAS threads: {blas}; {note}", flush=True)
        out = args.out if args.out is not None else (None if args.quick else str(HERE / "results" / "measure.json"))
        command = " ".join(["python", "benchmarks/bench_measure.py", *(argv if argv is not None else sys.argv[1:])])
        t0 = time.perf_counter()

        def write(rows: list[dict], complete: bool) -> None:
            if not out:
                return
            result = {"command": command, "machine": platform.platform(), "cpus": os.cpu_count(),
                      "blas_threads": blas, "note": note, "quick": args.quick, "reps": reps, "complete": complete,
                      "target": TARGET, "seconds": time.perf_counter() - t0, "rows": rows}
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps(result, indent=1))

        rows = run(selected, reps, log=lambda s: print(s, flush=True), partial=lambda r: write(r, False))
        total = time.perf_counter() - t0
        write(rows, True)
    print()
    print(table(rows))
    missed = [r for r in rows if not r["met"]]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} paths within {TARGET}x ({total:.0f} s in all)")
    if out:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
