"""Flow conservation as linear constraints: what enters an intersection leaves it.

Variables ``[f (E edge flows), s (V trips started), t (V trips ended)]``.  At every node ``v``

    sum_{e into v} f_e + s_v - sum_{e out of v} f_e - t_v = 0,

one row per node: ``C = [B | I | -I]`` with ``B`` the signed node-edge incidence matrix
(``+1`` at the head, ``-1`` at the tail).  When the start and end counts are *invariants*
(published exactly, or known), they move to the right side: ``B f = t - s``.

For the weighted projection ``argmin_{C x = b} ||x - x~||_D`` (``D`` the inverse noise variances)
the normal matrix ``C D^-1 C^T`` is a weighted graph Laplacian of the road network: plus the
diagonal ``Var(s_v) + Var(t_v)`` when the end points are variables (positive definite and well
conditioned), and singular (constants per weakly connected component) when they are fixed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..errors import InfeasibleConstraintsError, ShapeError
from ..validation import check_vector
from .network import RoadNetwork

__all__ = ["incidence_matrix", "FlowSystem", "conservation_system"]


def incidence_matrix(road: RoadNetwork) -> sp.csr_matrix:
    """Signed node-edge incidence ``B`` (V x E): ``B[head(e), e] = 1``, ``B[tail(e), e] = -1``."""
    e = np.arange(road.edges)
    rows = np.concatenate([road.heads, road.tails])
    cols = np.concatenate([e, e])
    vals = np.concatenate([np.ones(road.edges), -np.ones(road.edges)])
    return sp.csr_matrix((vals, (rows, cols)), shape=(road.nodes, road.edges))


@dataclass(frozen=True)
class FlowSystem:
    """Constraints ``C x = b`` on the variables, and which of ``[f, s, t]`` they are."""

    C: sp.csr_matrix
    b: np.ndarray
    edges: int
    nodes: int
    fixed_endpoints: bool

    @property
    def variables(self) -> int:
        return int(self.C.shape[1])


def conservation_system(road: RoadNetwork, starts: np.ndarray | None = None, ends: np.ndarray | None = None) -> FlowSystem:
    """Flow conservation at every node.

    With ``starts`` and ``ends`` given, they are invariants and only the ``E`` edge flows are
    variables (``B f = ends - starts``); their totals must agree (every trip starts and ends once)
    or :class:`InfeasibleConstraintsError` is raised.  Otherwise the variables are
    ``[f, s, t]`` and the system is homogeneous.
    """
    B = incidence_matrix(road)
    if (starts is None) != (ends is None):
        raise ShapeError("give both starts and ends (fixed end points) or neither")
    if starts is None:
        I = sp.identity(road.nodes, format="csr")
        C = sp.hstack([B, I, -I], format="csr")
        return FlowSystem(C, np.zeros(road.nodes), road.edges, road.nodes, False)
    s = check_vector(starts, road.nodes, "starts")
    t = check_vector(ends, road.nodes, "ends")
    b = t - s
    # each weakly connected component must balance: sum of b over it is 0
    from scipy.sparse.csgraph import connected_components

    ncomp, labels = connected_components(road.adjacency(), directed=True, connection="weak")
    imbalance = np.bincount(labels, weights=b, minlength=ncomp)
    if np.any(np.abs(imbalance) > 1e-9 * max(1.0, np.abs(b).sum())):
        raise InfeasibleConstraintsError(
            "flow conservation is infeasible: trips started and ended differ in a connected part of the network"
        )
    return FlowSystem(B, b, road.edges, road.nodes, True)
