"""DP traffic flows on road networks, made consistent by flow conservation (issue 7).

>>> from sparsedp.flows import road_grid, random_trips, release_flows
>>> road = road_grid(10, 10, seed=0)
>>> trips = random_trips(road, 200, seed=1, max_edges=8)
>>> rel = release_flows(road, trips, epsilon=1.0)     # noise from OS entropy
>>> rel.max_edges, rel.sensitivity, rel.solve.residual < 1e-8
(8, 10, True)
"""

from .conservation import FlowSystem, conservation_system, incidence_matrix
from .network import RoadNetwork, from_networkx, road_grid
from .osm import helsinki_pbf_path, helsinki_roads, read_osm_roads
from .release import FlowRelease, release_flows
from .solve import METHODS, FlowSolve, check_method, choose_method, project
from .trips import (
    MAX_TRIP_EDGES,
    Trips,
    check_max_edges,
    check_trips,
    count_sensitivity,
    flow_counts,
    random_trips,
    route_trips,
    select_trips,
    trip_contributions,
    truncate_trips,
)

__all__ = [
    "MAX_TRIP_EDGES",
    "METHODS",
    "FlowRelease",
    "FlowSolve",
    "FlowSystem",
    "RoadNetwork",
    "Trips",
    "check_max_edges",
    "check_method",
    "check_trips",
    "choose_method",
    "conservation_system",
    "count_sensitivity",
    "flow_counts",
    "from_networkx",
    "helsinki_pbf_path",
    "helsinki_roads",
    "incidence_matrix",
    "project",
    "random_trips",
    "read_osm_roads",
    "release_flows",
    "road_grid",
    "route_trips",
    "select_trips",
    "trip_contributions",
    "truncate_trips",
]
