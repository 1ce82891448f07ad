"""Differentially private release of traffic flows, made consistent by flow conservation.

Unit of privacy: one trip.  Trips are truncated to ``L = max_edges`` edges before counting, so one
trip changes the count vector ``[edge flows, starts, ends]`` by at most ``L + 2`` in L1
(:func:`~sparsedp.flows.trips.count_sensitivity`); Laplace noise of scale ``(L + 2) / epsilon`` on
every count makes the release ``epsilon``-DP, and the projection onto flow conservation is
post-processing.  With ``fixed_endpoints=True`` the start and end counts are treated as public
invariants (released exactly, as a census publishes invariants: they are *not* protected); only
the edge flows are noisy, with scale ``L / epsilon``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..noise import laplace
from ..privacy import Accountant, PrivacyCost
from ..validation import check_positive
from .conservation import conservation_system
from .network import RoadNetwork
from .solve import FlowSolve, project
from .trips import Trips, count_sensitivity, flow_counts

__all__ = ["FlowRelease", "release_flows"]


@dataclass(frozen=True)
class FlowRelease:
    """Noisy and consistent flow counts, with the calibration used."""

    noisy: np.ndarray
    consistent: np.ndarray
    truth: np.ndarray | None  # only for evaluation; never released
    sensitivity: int
    scale: float
    epsilon: float
    fixed_endpoints: bool
    solve: FlowSolve

    def rmse(self) -> tuple[float, float]:
        """Root mean squared error of the noisy and the consistent release against the truth."""
        if self.truth is None:
            raise SparseDPError("no truth to compare with")
        return (
            float(np.sqrt(np.mean((self.noisy - self.truth) ** 2))),
            float(np.sqrt(np.mean((self.consistent - self.truth) ** 2))),
        )


def release_flows(
    road: RoadNetwork,
    trips: Trips,
    epsilon: float,
    method: str = "auto",
    fixed_endpoints: bool = False,
    rng: Any = None,
    accountant: Accountant | None = None,
    tol: float = 1e-8,
    keep_truth: bool = False,
) -> FlowRelease:
    """Count, add Laplace noise calibrated to one trip, and project onto flow conservation."""
    eps = check_positive(epsilon, "epsilon")
    if trips.max_edges is None:
        raise SparseDPError("trips must be truncated (max_edges) to bound one trip's contribution")
    counts = flow_counts(road, trips)
    E, V = road.edges, road.nodes
    if fixed_endpoints:
        sens = int(trips.max_edges)
        system = conservation_system(road, counts[E : E + V], counts[E + V :])
        truth = counts[:E]
    else:
        sens = count_sensitivity(trips.max_edges)
        system = conservation_system(road)
        truth = counts
    if accountant is not None:
        accountant.spend(PrivacyCost(epsilon=eps), label="traffic flows")
    scale = sens / eps
    noisy = truth + laplace(scale, size=truth.size, rng=rng)
    solved = project(noisy, system, None, method=method, tol=tol)
    return FlowRelease(noisy, solved.x, truth if keep_truth else None, sens, scale, eps, fixed_endpoints, solved)
