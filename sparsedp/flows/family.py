"""Flow conservation as a constraint family of the consistency engine.

``sparsedp.consistency.solve(x, FlowConservation(graph), variances)`` projects a noisy flow vector
onto flow conservation with any of the engine's methods (and together with other families);
:func:`sparsedp.flows.project` is the dedicated solver stack for large road networks (Jacobi-CG and
AMG-preconditioned CG on the graph Laplacian).  Both compute the same projection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..consistency.families import ConstraintFamily
from ..errors import ShapeError
from .conservation import conservation_system
from .network import RoadNetwork, from_networkx

__all__ = ["FlowConservation"]


class FlowConservation(ConstraintFamily):
    """Inflow + trips started = outflow + trips ended, at every node of a directed graph.

    ``graph`` is a :class:`~sparsedp.flows.RoadNetwork` or a directed ``networkx`` graph (edges in
    ``graph.edges`` order).  Without ``sources``/``sinks`` the variables are ``[edge flows, starts,
    ends]`` (``E + 2V``); with both given they are public invariants and the variables are the
    ``E`` edge flows.  ``offset`` places the variables inside a longer release vector.
    """

    def __init__(self, graph: Any, sources: Any = None, sinks: Any = None, offset: int = 0, name: str = "flow conservation"):
        self.road = graph if isinstance(graph, RoadNetwork) else from_networkx(graph)[0]
        self.system = conservation_system(self.road, sources, sinks)
        self.offset = int(offset)
        self.name = name

    def rows(self, n: int) -> tuple[sp.csr_matrix, np.ndarray]:
        m, k = self.system.C.shape
        if self.offset < 0 or self.offset + k > n:
            raise ShapeError(f"{self.name}: variables {self.offset}..{self.offset + k} do not fit in a release of {n}")
        C = sp.hstack([sp.csr_matrix((m, self.offset)), self.system.C, sp.csr_matrix((m, n - self.offset - k))], format="csr")
        return C, self.system.b
