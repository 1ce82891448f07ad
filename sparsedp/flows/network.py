"""Road networks as arrays: directed edges between intersections.

A :class:`RoadNetwork` stores what a million-intersection city needs and nothing more: the number of
intersections, the tail and head of every directed street segment and its length.  It converts to
a ``networkx.DiGraph`` (:meth:`RoadNetwork.to_networkx`) and from one (:func:`from_networkx`), and
gives a CSR adjacency with edge ids (:meth:`RoadNetwork.adjacency`) for routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import ShapeError

__all__ = ["RoadNetwork", "road_grid", "from_networkx"]


@dataclass(frozen=True)
class RoadNetwork:
    """Directed road network: ``tails[e] -> heads[e]`` with ``lengths[e]``, ``nodes`` intersections."""

    nodes: int
    tails: np.ndarray
    heads: np.ndarray
    lengths: np.ndarray
    coords: np.ndarray | None = None  # (nodes, 2) positions, for plotting
    _adjacency: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.tails.shape != self.heads.shape or self.tails.shape != self.lengths.shape:
            raise ShapeError("tails, heads and lengths must have the same length")
        if self.tails.size and (min(self.tails.min(), self.heads.min()) < 0 or max(self.tails.max(), self.heads.max()) >= self.nodes):
            raise ShapeError("edge end points must lie in [0, nodes)")
        if np.any(self.tails == self.heads):
            raise ShapeError("self-loops are not street segments")
        if not np.all(np.isfinite(self.lengths)) or np.any(self.lengths <= 0):
            raise ShapeError("edge lengths must be finite and > 0")

    @property
    def edges(self) -> int:
        return int(self.tails.size)

    def adjacency(self) -> sp.csr_matrix:
        """CSR matrix ``A[u, v] = edge id + 1`` (0 = no edge); built once."""
        if "csr" not in self._adjacency:
            ids = np.arange(1, self.edges + 1, dtype=np.float64)
            A = sp.csr_matrix((ids, (self.tails, self.heads)), shape=(self.nodes, self.nodes))
            if A.nnz != self.edges:
                raise ShapeError("parallel edges (same tail and head) are not supported")
            A.sort_indices()
            self._adjacency["csr"] = A
        return self._adjacency["csr"]

    def lengths_matrix(self) -> sp.csr_matrix:
        """CSR matrix of edge lengths, for shortest paths."""
        return sp.csr_matrix((self.lengths, (self.tails, self.heads)), shape=(self.nodes, self.nodes))

    def edge_ids(self, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Edge id of each ``(u[i], v[i])`` (vectorised lookup in the CSR rows); raises if missing."""
        A = self.adjacency()
        u = np.asarray(u, dtype=np.int64)
        v = np.asarray(v, dtype=np.int64)
        start, stop = A.indptr[u], A.indptr[u + 1]
        # binary search of v inside each sorted row segment
        lo, hi = start.copy(), stop.copy()
        while np.any(lo < hi):
            active = lo < hi
            mid = (lo + hi) // 2
            go_right = active & (A.indices[np.minimum(mid, A.indices.size - 1)] < v)
            lo = np.where(go_right, mid + 1, lo)
            hi = np.where(active & ~go_right, mid, hi)
        found = (lo < stop) & (A.indices[np.minimum(lo, A.indices.size - 1)] == v)
        if not np.all(found):
            bad = int(np.flatnonzero(~found)[0])
            raise ShapeError(f"no edge {u[bad]} -> {v[bad]}")
        return (A.data[lo] - 1).astype(np.int64)

    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph`` with edge attributes ``length`` and ``id``."""
        import networkx as nx

        G = nx.DiGraph()
        G.add_nodes_from(range(self.nodes))
        G.add_edges_from(
            (int(u), int(v), {"length": float(w), "id": e})
            for e, (u, v, w) in enumerate(zip(self.tails, self.heads, self.lengths))
        )
        return G


def from_networkx(G: Any, weight: str = "length", nodes: Any = None) -> tuple[RoadNetwork, list]:
    """A :class:`RoadNetwork` from a directed networkx graph, and the node list (index -> node).

    Variables follow labels, never the order the graph was built in (a graph built in another
    order gives the same network):

    * node ``i``: with integer labels ``0..V-1`` the label itself; otherwise ``nodes`` (a list of
      the nodes, index -> node, or a mapping node -> index) is required;
    * edge ``e``: the ``id`` attribute when every edge has one (``0..E-1``, as
      :meth:`RoadNetwork.to_networkx` writes), else edges sorted by ``(tail index, head index)``.

    Edge lengths come from the ``weight`` attribute (1 where absent).
    """
    labels = list(G.nodes())
    V = len(labels)
    if nodes is not None:
        index = dict(nodes) if isinstance(nodes, dict) else {u: i for i, u in enumerate(nodes)}
        if sorted(index.values()) != list(range(V)) or set(index) != set(labels):
            raise ShapeError(f"nodes must map the graph's {V} nodes one to one onto 0..{V - 1}")
    elif all(isinstance(u, (int, np.integer)) and not isinstance(u, bool) for u in labels) and \
            sorted(int(u) for u in labels) == list(range(V)):
        index = {u: int(u) for u in labels}
    else:
        raise ShapeError(
            "node labels are not the integers 0..V-1: pass nodes=[...] (index -> node) or a mapping "
            "node -> index; insertion order is never used as a numbering"
        )
    order = [None] * V
    for u, i in index.items():
        order[i] = u
    edges = list(G.edges(data=True))
    tails = np.array([index[u] for u, _, _ in edges], dtype=np.int64)
    heads = np.array([index[v] for _, v, _ in edges], dtype=np.int64)
    lengths = np.array([float(d.get(weight, 1.0)) for _, _, d in edges])
    if edges and all("id" in d for _, _, d in edges):
        ids = np.array([int(d["id"]) for _, _, d in edges], dtype=np.int64)
        if not np.array_equal(np.sort(ids), np.arange(len(edges))):
            raise ShapeError("edge ids must be 0..E-1, each once")
        perm = np.argsort(ids)
    else:
        perm = np.lexsort((heads, tails))
    return RoadNetwork(V, tails[perm], heads[perm], lengths[perm]), order


def road_grid(rows: int, cols: int, seed: int | None = 0, one_way: float = 0.5, jitter: float = 0.2) -> RoadNetwork:
    """A synthetic city: a ``rows x cols`` grid of intersections with perturbed positions.

    Streets join grid neighbours.  Every second row and column street is one-way with alternating
    direction (like a Manhattan grid, which keeps the city strongly connected) with probability
    ``one_way`` per street; the others are two-way (one edge each direction).  The border streets
    are always two-way.  Lengths are the Euclidean distances between the jittered positions.
    """
    if rows < 2 or cols < 2:
        raise ShapeError("a road grid needs at least 2 rows and 2 columns")
    rng = np.random.default_rng(seed)
    n = rows * cols
    idx = np.arange(n).reshape(rows, cols)
    coords = np.stack(np.meshgrid(np.arange(cols, dtype=float), np.arange(rows, dtype=float)), axis=-1).reshape(n, 2)
    coords += rng.uniform(-jitter, jitter, size=coords.shape)
    tails, heads = [], []
    for count, a, b, axis in ((rows, idx[:, :-1], idx[:, 1:], 0), (cols, idx[:-1, :], idx[1:, :], 1)):
        oneway = (np.arange(count) % 2 == 1) & (rng.random(count) < one_way)
        oneway[[0, -1]] = False  # border streets stay two-way
        forward = np.arange(count) % 4 == 1  # alternate the direction of one-way streets
        shape = (-1, 1) if axis == 0 else (1, -1)
        fwd = np.broadcast_to((~oneway | forward).reshape(shape), a.shape)
        bwd = np.broadcast_to((~oneway | ~forward).reshape(shape), a.shape)
        tails += [a[fwd], b[bwd]]
        heads += [b[fwd], a[bwd]]
    t = np.concatenate(tails).astype(np.int64)
    h = np.concatenate(heads).astype(np.int64)
    lengths = np.linalg.norm(coords[t] - coords[h], axis=1)
    return RoadNetwork(n, t, h, lengths, coords)
