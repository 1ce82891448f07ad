"""Trips on a road network: shortest-path routing, truncation, and the released count vector.

Each trip starts at an origin, follows a shortest path (by edge length) and ends at its destination.
A trip is truncated to its first ``L`` edges (``max_edges``): it then *ends* where it was cut.  The
count vector released for a set of trips is ``[edge flows (E), trips started at each node (V),
trips ended at each node (V)]``.  One trip adds 1 to at most ``L`` distinct edge flows (a shortest
path never repeats an edge), 1 to one start and 1 to one end count, so the L1 sensitivity of the
count vector to adding or removing one trip is ``L + 2`` (:func:`count_sensitivity`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse.csgraph import dijkstra

from ..errors import ShapeError, SparseDPError
from .network import RoadNetwork

__all__ = ["Trips", "route_trips", "random_trips", "flow_counts", "count_sensitivity"]


@dataclass(frozen=True)
class Trips:
    """Routed trips: trip ``i`` starts at ``origins[i]``, ends at ``ends[i]`` and uses the edges
    ``edge_ids[edge_ptr[i]:edge_ptr[i + 1]]`` in order."""

    origins: np.ndarray
    ends: np.ndarray
    edge_ptr: np.ndarray
    edge_ids: np.ndarray
    max_edges: int | None

    @property
    def count(self) -> int:
        return int(self.origins.size)

    def lengths(self) -> np.ndarray:
        return np.diff(self.edge_ptr)


def count_sensitivity(max_edges: int) -> int:
    """L1 sensitivity of the count vector to one trip truncated to ``max_edges`` edges: ``L + 2``."""
    if int(max_edges) != max_edges or max_edges < 1:
        raise SparseDPError(f"max_edges must be a positive integer, got {max_edges!r}")
    return int(max_edges) + 2


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
        count_sensitivity(max_edges)  # validates
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
