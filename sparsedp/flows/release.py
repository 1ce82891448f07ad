"""Differentially private release of traffic flows, made consistent by flow conservation.

Unit of privacy: one trip.  The release enforces its own contribution bound: every trip is checked
against the road network (:func:`~sparsedp.flows.trips.check_trips`) and cut to its first ``L``
edges (:func:`~sparsedp.flows.trips.truncate_trips`; ``L`` = the ``max_edges`` argument, default
the trips' claimed ``max_edges``, which is therefore only a default and never trusted).  One
truncated trip's contribution to the measured counts ``[edge flows, starts, ends]``
(:func:`~sparsedp.flows.trips.trip_contributions`) has L1 norm at most ``L + 2``, so Laplace noise
of scale ``b = (L + 2) / epsilon`` (rounded up) on every count makes the release ``epsilon``-DP:
``max_trip sum_i |c_i| / b <= epsilon``.  The projection onto flow conservation is post-processing.
With ``fixed_endpoints=True`` the start and end counts are treated as public invariants (released
exactly, as a census publishes invariants: they are *not* protected); only the edge flows are
measured, with ``Delta_1 = L`` and scale ``L / epsilon``.

Order of work (issue 19): validate everything (budget, bound, trips, method, tolerance, generator),
then charge the accountant, then draw the noise; the projection falls back to the direct solver
rather than fail after the draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..calibration import laplace_scale
from ..errors import SparseDPError
from ..noise import as_generator, laplace
from ..privacy import Accountant, PrivacyCost
from ..validation import check_epsilon, check_magnitude, check_positive
from .conservation import FlowSystem, conservation_system
from .network import RoadNetwork
from .solve import FlowSolve, check_method, project
from .trips import Trips, check_max_edges, check_trips, flow_counts, truncate_trips

__all__ = ["FlowRelease", "release_flows"]


@dataclass(frozen=True)
class FlowRelease:
    """Noisy and consistent flow counts, with the calibration used.

    ``max_edges`` is the bound ``L`` the release enforced (every trip was cut to it),
    ``sensitivity`` the L1 norm bound of one truncated trip's contribution (``L + 2``, or ``L`` with
    fixed end points), ``scale`` the Laplace scale of every measured count (:attr:`scales`).
    """

    noisy: np.ndarray
    consistent: np.ndarray
    truth: np.ndarray | None  # only for evaluation (keep_truth=True); never released
    sensitivity: int
    scale: float
    epsilon: float
    fixed_endpoints: bool
    solve: FlowSolve
    max_edges: int

    @property
    def scales(self) -> np.ndarray:
        """The Laplace scale of each measured count (all equal to :attr:`scale`)."""
        return np.full(self.noisy.size, self.scale)

    def rmse(self) -> tuple[float, float]:
        """Root mean squared error of the noisy and the consistent release against the truth
        (evaluation only: the result depends on the data beyond what was released)."""
        if self.truth is None:
            raise SparseDPError("no truth to compare with (release with keep_truth=True to evaluate)")
        return (
            float(np.sqrt(np.mean((self.noisy - self.truth) ** 2))),
            float(np.sqrt(np.mean((self.consistent - self.truth) ** 2))),
        )


def _bound(trips: Trips, max_edges: Any) -> int:
    """The truncation bound ``L``: ``max_edges`` if given, else the trips' claimed one."""
    if max_edges is None:
        if getattr(trips, "max_edges", None) is None:
            raise SparseDPError(
                "trips must be truncated to bound one trip's contribution: give max_edges= (or trips with max_edges)"
            )
        return check_max_edges(trips.max_edges, "trips.max_edges")
    return check_max_edges(max_edges)


def _measured(road: RoadNetwork, trips: Trips, L: int, fixed_endpoints: bool) -> tuple[np.ndarray, FlowSystem, int]:
    """The true counts the release measures, the conservation system and ``Delta_1``."""
    counts = flow_counts(road, truncate_trips(road, check_trips(road, trips), L))
    check_magnitude(counts, "flow counts")
    E, V = road.edges, road.nodes
    if fixed_endpoints:
        return counts[:E], conservation_system(road, counts[E : E + V], counts[E + V :]), L
    return counts, conservation_system(road), L + 2


def _project_after_draw(noisy: np.ndarray, system: FlowSystem, method: str, reason: str, tol: float) -> FlowSolve:
    """The projection, which must not fail once noise is drawn: an iterative method that does not
    reach ``tol`` is replaced by the direct solve (the reason says so)."""
    try:
        solved = project(noisy, system, None, method=method, tol=tol)
    except SparseDPError as exc:
        if method in ("direct", "generic"):
            raise
        solved = project(noisy, system, None, method="direct", tol=tol)
        return FlowSolve(solved.x, solved.method, solved.solver, f"{method} failed ({exc}); direct solve instead",
                         solved.iterations, solved.residual, solved.seconds)
    return FlowSolve(solved.x, solved.method, solved.solver, reason, solved.iterations, solved.residual, solved.seconds)


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
    max_edges: int | None = None,
) -> FlowRelease:
    """Truncate every trip to ``L = max_edges`` edges (default ``trips.max_edges``), count, add
    Laplace noise of scale ``(L + 2) / epsilon`` (``L / epsilon`` with ``fixed_endpoints``) and
    project onto flow conservation.

    Raises before anything is charged or drawn: :class:`InvalidPrivacyParameterError` for an
    ``epsilon`` outside ``[1e-9, 1e6]`` (or a bool, a string), :class:`SparseDPError` without a bound
    ``L`` or with one that is not an integer in ``[1, 2^31]``, :class:`ShapeError` for trips that are
    not walks on ``road``, and for an unknown or unavailable ``method``, a bad ``tol`` or ``rng``.
    ``rng=None`` draws the noise from OS entropy; a seed makes it reproducible (not private).
    """
    eps = check_epsilon(epsilon, "epsilon")
    L = _bound(trips, max_edges)
    tol = check_positive(tol, "tol")
    gen = as_generator(rng)
    truth, system, sens = _measured(road, trips, L, bool(fixed_endpoints))
    scale = laplace_scale(sens, eps)
    how, reason = check_method(system, method)
    if accountant is not None:  # every check is done: charge, then draw
        accountant.spend(PrivacyCost(epsilon=eps), label=f"traffic flows (L = {L})")
    noisy = truth + laplace(scale, size=truth.size, rng=gen)
    solved = _project_after_draw(noisy, system, how, reason, tol)
    return FlowRelease(noisy, solved.x, truth if keep_truth else None, sens, scale, eps, bool(fixed_endpoints), solved, L)
