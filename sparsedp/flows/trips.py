"""Trips on a road network: shortest-path routing, truncation, and the released count vector.

Each trip starts at an origin, follows a walk along directed edges and ends at its destination
(:func:`route_trips` and :func:`random_trips` route on shortest paths).  A trip is truncated to its
first ``L`` edges (:func:`truncate_trips`): it then *ends* where it was cut (the head of its last
kept edge).  The count vector released for a set of trips is ``[edge flows (E), trips started at
each node (V), trips ended at each node (V)]``; one trip's contribution to it
(:func:`trip_contributions`) adds 1 per kept edge (an edge used twice counts twice), 1 to one start
and 1 to one end count, so its L1 norm is at most ``L + 2`` (:func:`count_sensitivity`), whatever
the trip.  The release (:func:`~sparsedp.flows.release_flows`) truncates every trip itself and
never trusts the ``max_edges`` a :class:`Trips` object claims.

Trips may carry the id of whoever drove them (``Trips.units``, one id per trip: a vehicle, a
person; :meth:`Trips.with_units`).  A release that protects that unit keeps at most ``max_rows``
trips per id (:func:`select_trips` of the rows :func:`~sparsedp.privacy_unit.truncate` keeps):
one vehicle then changes the counts by at most ``max_rows (L + 2)`` in L1.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from ..errors import InputBoundError, ShapeError, SparseDPError
from .network import RoadNetwork

__all__ = [
    "MAX_TRIP_EDGES",
    "Trips",
    "check_max_edges",
    "check_trips",
    "count_sensitivity",
    "flow_counts",
    "random_trips",
    "route_trips",
    "select_trips",
    "trip_contributions",
    "truncate_trips",
]

#: Largest accepted truncation bound ``L`` (edges per trip).  Far above any road trip; it keeps
#: ``(L + 2) / epsilon`` a finite Laplace scale for every accepted ``epsilon``.
MAX_TRIP_EDGES: int = 2**31


@dataclass(frozen=True)
class Trips:
    """Routed trips: trip ``i`` starts at ``origins[i]``, ends at ``ends[i]`` and uses the edges
    ``edge_ids[edge_ptr[i]:edge_ptr[i + 1]]`` in order.  ``max_edges`` is what the builder claims
    (the truncation :func:`route_trips` applied); the release checks the arrays
    (:func:`check_trips`) and truncates them itself instead of trusting it.  ``units``: the id of
    the privacy unit (vehicle, person) that made each trip, or ``None``; a release that declares a
    privacy unit needs them (:meth:`with_units`)."""

    origins: np.ndarray
    ends: np.ndarray
    edge_ptr: np.ndarray
    edge_ids: np.ndarray
    max_edges: int | None
    units: np.ndarray | None = None

    @property
    def count(self) -> int:
        return int(self.origins.size)

    def lengths(self) -> np.ndarray:
        return np.diff(self.edge_ptr)

    def with_units(self, units: Any) -> "Trips":
        """The same trips, trip ``i`` made by the unit ``units[i]`` (a vehicle id, a person id; any
        hashable values, ``None`` / NaN for a missing id).  Checked by :func:`check_trips`."""
        return Trips(self.origins, self.ends, self.edge_ptr, self.edge_ids, self.max_edges,
                     None if units is None else np.asarray(units))


def check_max_edges(max_edges: Any, name: str = "max_edges") -> int:
    """``max_edges`` as an int in ``[1, MAX_TRIP_EDGES]`` (an integral real number; not a bool or a
    string), else :class:`SparseDPError` (:class:`InputBoundError` above the bound)."""
    if isinstance(max_edges, (bool, np.bool_)) or not isinstance(max_edges, numbers.Real):
        raise SparseDPError(f"{name} must be a positive integer, got {type(max_edges).__name__} {max_edges!r}")
    value = float(max_edges)
    if not np.isfinite(value) or value != int(value) or value < 1:
        raise SparseDPError(f"{name} must be a positive integer, got {max_edges!r}")
    if value > MAX_TRIP_EDGES:
        raise InputBoundError(f"{name} = {max_edges!r} is above the supported bound {MAX_TRIP_EDGES} edges per trip")
    return int(value)


def count_sensitivity(max_edges: int) -> int:
    """L1 sensitivity of the count vector to one trip truncated to ``max_edges`` edges: ``L + 2``
    (``L`` edge counts, one start, one end; :func:`trip_contributions` gives each trip's part)."""
    return check_max_edges(max_edges) + 2


def _index_array(values: Any, name: str, upper: int) -> np.ndarray:
    """``values`` as a 1-D int64 array of integers in ``[0, upper)`` (integral floats accepted)."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ShapeError(f"trips.{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ShapeError(f"trips.{name} must hold integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
        raise ShapeError(f"trips.{name} must hold finite integers")
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        bad = int(np.flatnonzero((arr < 0) | (arr >= upper))[0])  # where, never the value: the data are private
        raise ShapeError(f"trips.{name} must lie in [0, {upper}) (entry {bad} does not)")
    return arr.astype(np.int64)


def check_trips(road: RoadNetwork, trips: Trips) -> Trips:
    """Validated int64 copies of ``trips``' arrays, or :class:`ShapeError`.

    Checks: ``origins`` and ``ends`` are intersections, ``edge_ids`` are edges of ``road``,
    ``edge_ptr`` is a non-decreasing pointer array from 0 to ``len(edge_ids)`` with one entry per
    trip plus one, and every trip is a walk: its first edge leaves its origin, each edge starts
    where the previous one ended, and it ends at the head of its last edge (at its origin when it
    has no edge).  ``max_edges`` is carried over unchecked: the release never relies on it.
    ``units``, when given, must hold one id per trip (their values are checked where a release
    reads them: :func:`~sparsedp.privacy_unit.truncate`).
    """
    if not isinstance(trips, Trips):
        raise ShapeError(f"trips must be a Trips, got {type(trips).__name__}")
    origins = _index_array(trips.origins, "origins", road.nodes)
    ends = _index_array(trips.ends, "ends", road.nodes)
    ids = _index_array(trips.edge_ids, "edge_ids", road.edges)
    ptr = _index_array(trips.edge_ptr, "edge_ptr", ids.size + 1)
    k = origins.size
    if ends.size != k or ptr.size != k + 1:
        raise ShapeError(f"trips: {k} origins need {k} ends and {k + 1} edge_ptr entries, got {ends.size} and {ptr.size}")
    if ptr[0] != 0 or ptr[-1] != ids.size or np.any(np.diff(ptr) < 0):
        raise ShapeError("trips.edge_ptr must rise from 0 to len(edge_ids)")
    lens = np.diff(ptr)
    walked = lens > 0
    first, last = ptr[:-1][walked], ptr[1:][walked] - 1
    bad = np.zeros(k, dtype=bool)
    bad[walked] = (road.tails[ids[first]] != origins[walked]) | (road.heads[ids[last]] != ends[walked])
    bad[~walked] = ends[~walked] != origins[~walked]
    if np.any(bad):
        raise ShapeError(f"trip {int(np.flatnonzero(bad)[0])} does not start at its origin or end at its end")
    inner = np.ones(ids.size, dtype=bool)
    inner[last] = False  # position j continues into j + 1 unless j is a trip's last edge
    j = np.flatnonzero(inner)
    if np.any(road.heads[ids[j]] != road.tails[ids[j + 1]]):
        at = int(j[np.flatnonzero(road.heads[ids[j]] != road.tails[ids[j + 1]])[0]])
        trip = int(np.searchsorted(ptr, at, side="right") - 1)
        raise ShapeError(f"trip {trip} is not a walk: its edge at position {at} of edge_ids does not lead to the next")
    units = None
    if trips.units is not None:
        units = np.asarray(trips.units)
        if units.ndim != 1 or units.shape[0] != k:
            raise ShapeError(f"trips.units must hold one id per trip ({k}), got shape {units.shape}")
    return Trips(origins, ends, ptr, ids, trips.max_edges, units)


def select_trips(trips: Trips, keep: np.ndarray) -> Trips:
    """The trips where the boolean mask ``keep`` (one entry per trip) is true, in order, with their
    units.  ``trips`` must be valid (:func:`check_trips`)."""
    keep = np.asarray(keep, dtype=bool)
    lens = np.diff(trips.edge_ptr)
    ids = trips.edge_ids[np.repeat(keep, lens)]
    ptr = np.concatenate(([0], np.cumsum(lens[keep]))).astype(np.int64)
    units = None if trips.units is None else np.asarray(trips.units)[keep]
    return Trips(np.asarray(trips.origins)[keep], np.asarray(trips.ends)[keep], ptr, ids, trips.max_edges, units)


def truncate_trips(road: RoadNetwork, trips: Trips, max_edges: int) -> Trips:
    """Every trip cut to its first ``max_edges`` edges; a cut trip ends at the head of its last kept
    edge (so flow conservation still holds).  Per record and data independent: the result's
    ``max_edges`` is true.  ``trips`` must be valid (:func:`check_trips`)."""
    L = check_max_edges(max_edges)
    lens = np.diff(trips.edge_ptr)
    kept = np.minimum(lens, L)
    pos = np.arange(trips.edge_ids.size) - np.repeat(trips.edge_ptr[:-1], lens)
    ids = trips.edge_ids[pos < L]
    ptr = np.concatenate(([0], np.cumsum(kept))).astype(np.int64)
    ends = np.array(trips.ends, dtype=np.int64, copy=True)
    cut = np.flatnonzero(lens > L)
    ends[cut] = road.heads[ids[ptr[cut + 1] - 1]]
    return Trips(np.array(trips.origins, dtype=np.int64), ends, ptr, ids, L, trips.units)


def trip_contributions(road: RoadNetwork, trips: Trips, endpoints: bool = True) -> sp.csr_matrix:
    """Row ``i``: trip ``i``'s contribution to ``[edge flows, starts, ends]`` (``[edge flows]`` with
    ``endpoints=False``), so :func:`flow_counts` is the column sum.  A neighbouring trip set (one
    trip added or removed) moves the counts by exactly one row."""
    k, E, V = trips.count, road.edges, road.nodes
    lens = np.diff(trips.edge_ptr)
    rows = [np.repeat(np.arange(k), lens)]
    cols = [np.asarray(trips.edge_ids, dtype=np.int64)]
    if endpoints:
        rows += [np.arange(k), np.arange(k)]
        cols += [E + np.asarray(trips.origins, dtype=np.int64), E + V + np.asarray(trips.ends, dtype=np.int64)]
    r, c = np.concatenate(rows), np.concatenate(cols)
    width = E + 2 * V if endpoints else E
    return sp.csr_matrix((np.ones(r.size), (r, c)), shape=(k, width))


def route_trips(
    road: RoadNetwork,
    origins: np.ndarray,
    destinations: np.ndarray,
    max_edges: int | None = None,
    chunk: int = 16,
) -> Trips:
    """Route every ``origins[i] -> destinations[i]`` on a shortest path, truncated to ``max_edges``.

    Shortest paths come from one Dijkstra run per distinct origin (``chunk`` origins at a time);
    paths are then walked back from the destinations, vectorised over the trips of a chunk.
    Unreachable destinations raise :class:`ShapeError`.
    """
    origins = np.asarray(origins, dtype=np.int64).ravel()
    destinations = np.asarray(destinations, dtype=np.int64).ravel()
    if origins.shape != destinations.shape:
        raise ShapeError("origins and destinations must have the same length")
    if origins.size and (min(origins.min(), destinations.min()) < 0 or max(origins.max(), destinations.max()) >= road.nodes):
        raise ShapeError("trip end points must be intersections of the network")
    return _route(road, origins, lambda sources, dist, rows: destinations[rows], max_edges, np.inf, chunk)


def random_trips(
    road: RoadNetwork,
    k: int,
    seed: int | None = 0,
    max_edges: int | None = None,
    origins: int | None = None,
    radius: float | None = None,
) -> Trips:
    """``k`` random trips: ``origins`` distinct origin intersections (default ``min(k, 256)``), each
    trip from a random one of them to a random intersection within path length ``radius`` of it
    (anywhere reachable if ``None``), routed on a shortest path and truncated to ``max_edges``."""
    if k < 1:
        raise ShapeError("k must be >= 1")
    rng = np.random.default_rng(seed)
    n_orig = min(k, origins or 256, road.nodes)
    starts = rng.choice(road.nodes, size=n_orig, replace=False)
    trip_origin = starts[rng.integers(0, n_orig, size=k)]

    def pick(sources: np.ndarray, dist: np.ndarray, rows: np.ndarray) -> np.ndarray:
        dests = np.empty(rows.size, dtype=np.int64)
        which = np.searchsorted(sources, trip_origin[rows])
        for j, s in enumerate(sources):
            reach = np.flatnonzero(np.isfinite(dist[j]))
            reach = reach[reach != s]
            if reach.size == 0:
                raise ShapeError(f"no intersection is reachable from {s} within radius {radius}")
            sel = which == j
            dests[sel] = reach[rng.integers(0, reach.size, size=int(sel.sum()))]
        return dests

    return _route(road, trip_origin, pick, max_edges, np.inf if radius is None else float(radius), 16)


def _route(road: RoadNetwork, origins: np.ndarray, destinations_of, max_edges: int | None, limit: float, chunk: int) -> Trips:
    """Shared routing loop: Dijkstra from ``chunk`` distinct origins at a time (distances bounded
    by ``limit``), ``destinations_of(sources, dist, trip_rows)`` gives the trips' destinations, and
    the paths are walked back from them."""
    if max_edges is not None:
        max_edges = check_max_edges(max_edges)
    order = np.argsort(origins, kind="stable")
    uniq, first = np.unique(origins[order], return_index=True)
    graph = road.lengths_matrix()
    ends = np.empty_like(origins)
    lengths = np.zeros(origins.size, dtype=np.int64)
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    for c0 in range(0, uniq.size, chunk):
        sources = uniq[c0 : c0 + chunk]
        rows = order[first[c0] : (first[c0 + chunk] if c0 + chunk < uniq.size else origins.size)]
        dist, pred = dijkstra(graph, indices=sources, return_predecessors=True, limit=limit)
        dests = destinations_of(sources, dist, rows)
        which = np.searchsorted(sources, origins[rows])
        trip_ends, ids = _walk_back(road, pred, which, origins[rows], dests, max_edges)
        ends[rows] = trip_ends
        lengths[rows] = (ids >= 0).sum(axis=1)
        chunks.append((rows, ids))
    ptr = np.concatenate(([0], np.cumsum(lengths)))
    edge_ids = np.empty(ptr[-1], dtype=np.int64)
    for rows, ids in chunks:
        # trips of a chunk, each row its edges from the origin, -1 padded at the front
        starts = ptr[rows]
        valid = ids >= 0
        offsets = np.cumsum(valid, axis=1) - 1
        edge_ids[(starts[:, None] + offsets)[valid]] = ids[valid]
    return Trips(origins, ends, ptr, edge_ids, max_edges)


def _walk_back(
    road: RoadNetwork, pred: np.ndarray, row: np.ndarray, origins: np.ndarray, dests: np.ndarray, max_edges: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Truncated ends and the kept edge ids as a ``(trips, steps)`` array in order from the origin
    (``-1`` padding first); vectorised over trips, one step of every path at a time."""
    cur = dests.copy()
    steps_u, steps_v = [], []
    active = cur != origins
    while np.any(active):
        prev = np.where(active, pred[row, cur], cur)
        if np.any(prev[active] < 0):
            bad = int(np.flatnonzero(active & (prev < 0))[0])
            raise ShapeError(f"destination {dests[bad]} is not reachable from {origins[bad]}")
        steps_u.append(np.where(active, prev, -1))
        steps_v.append(np.where(active, cur, -1))
        cur = prev
        active = cur != origins
    if not steps_u:
        return dests.copy(), np.empty((dests.size, 0), dtype=np.int64)
    U = np.stack(steps_u)  # (steps, trips): step s is the edge at position length - 1 - s
    V = np.stack(steps_v)
    length = (U >= 0).sum(axis=0)
    keep = length if max_edges is None else np.minimum(length, max_edges)
    pos = length[None, :] - 1 - np.arange(U.shape[0])[:, None]
    mask = (U >= 0) & (pos < keep[None, :])
    ids = np.full(U.shape, -1, dtype=np.int64)
    ids[mask] = road.edge_ids(U[mask], V[mask])
    ends = dests.copy()
    cut = np.flatnonzero(keep < length)
    # a truncated trip ends at the head of its last kept edge (position keep - 1, step length - keep)
    ends[cut] = V[length[cut] - keep[cut], cut]
    return ends, ids[::-1].T


def flow_counts(road: RoadNetwork, trips: Trips) -> np.ndarray:
    """``[edge flows, starts per node, ends per node]`` (length ``E + 2V``) of a set of trips."""
    flows = np.bincount(trips.edge_ids, minlength=road.edges)
    starts = np.bincount(trips.origins, minlength=road.nodes)
    ends = np.bincount(trips.ends, minlength=road.nodes)
    return np.concatenate([flows, starts, ends]).astype(np.float64)
