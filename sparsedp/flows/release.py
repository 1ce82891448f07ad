"""Differentially private release of traffic flows, made consistent by flow conservation.

Unit of privacy: one trip.  The release enforces its own contribution bound: every trip is checked
against the road network (:func:`~sparsedp.flows.trips.check_trips`) and cut to its first ``L``
edges (:func:`~sparsedp.flows.trips.truncate_trips`; ``L`` = the ``max_edges`` argument, default
the trips' claimed ``max_edges``, which is therefore only a default and never trusted).  One
truncated trip's contribution to the measured counts ``[edge flows, starts, ends]``
(:func:`~sparsedp.flows.trips.trip_contributions`) has L1 norm at most ``L + 2``.

One measurement path (issue 13): the counts are measured with the identity strategy through
:func:`sparsedp.measure.plan_measurement` with ``unit = L + 2`` (one trip changes the count vector
by at most ``L + 2`` in L1), so ``Delta_1 = L + 2`` and every count gets Laplace noise of scale
``b = (L + 2) / epsilon`` (rounded up): ``max_trip sum_i |c_i| / b <= epsilon``.  The path
validates, charges the accountant (with a ledger entry), then draws; nothing here calls a noise
sampler.  The projection onto flow conservation is post-processing.  With ``fixed_endpoints=True``
the start and end counts are treated as public invariants (released exactly, as a census publishes
invariants: they are *not* protected); only the edge flows are measured, with ``unit = L``.

Noise is exact by default (``secure=True``): discrete Laplace on the integer grid -- the counts are
integers, so the grid is exact and the noisy counts are integers.  ``secure=False`` draws float64
Laplace noise, which leaks through its low bits (Mironov, CCS 2012): an explicit opt-out for
experiments.

Order of work (issue 19): validate everything (budget, bound, trips, method, tolerance, generator),
then charge the accountant, then draw the noise; the projection falls back to the direct solver
rather than fail after the draw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import strategies as st
from ..errors import SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..privacy import Accountant, LedgerEntry
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
    fixed end points: the ``unit`` of the measurement), ``scale`` the Laplace scale of every measured
    count (:attr:`scales`), ``noise_variance`` its actual variance (exact discrete-Laplace variance
    when ``secure``).  ``private`` is ``False`` when the noise came from a seed; ``ledger`` is the
    measurement's :class:`~sparsedp.privacy.LedgerEntry` (the record the accountant keeps).
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
    secure: bool = True
    private: bool = True
    noise_variance: float = float("nan")
    ledger: LedgerEntry | None = field(default=None, compare=False)  # the measurement's ledger entry

    def save(self, path: Any, description: dict | None = None) -> Any:
        """Write the consistent flows, their noise variance and the ledger as a release file
        (:mod:`sparsedp.release_file`; never the trips or the true counts)."""
        from ..release_file import save_release

        desc = {"epsilon": self.epsilon, "max_trip_edges": self.max_edges, "sensitivity": self.sensitivity,
                "laplace_scale": self.scale, "secure": self.secure, "fixed_endpoints": self.fixed_endpoints,
                "noise_variance": self.noise_variance}
        desc.update(description or {})
        return save_release(path, "flows", {"x": self.consistent}, ledger=[self.ledger] if self.ledger else [],
                            description=desc, private=self.private)

    @property
    def scales(self) -> np.ndarray:
        """The Laplace scale of each measured count (all equal to :attr:`scale`)."""
        return np.full(self.noisy.size, self.scale)

    @property
    def variances(self) -> np.ndarray:
        """The noise variance of each measured count (all equal to :attr:`noise_variance`)."""
        return np.full(self.noisy.size, self.noise_variance)

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
    """The true counts the release measures, the conservation system and the L1 bound of one
    trip's change of them (the measurement's ``unit``: ``L + 2``, or ``L`` with fixed end points)."""
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
    secure: bool = True,
) -> FlowRelease:
    """Truncate every trip to ``L = max_edges`` edges (default ``trips.max_edges``), count, measure
    the counts with Laplace noise of scale ``(L + 2) / epsilon`` (``L / epsilon`` with
    ``fixed_endpoints``) through the measurement path, and project onto flow conservation.

    ``secure`` (default True): exact discrete Laplace noise (integer noisy counts); ``False``: float64
    Laplace noise, an explicit opt-out for experiments.  ``rng=None`` draws the noise from OS
    entropy; a seed makes it reproducible (not private: ``private=False``).

    Raises before anything is charged or drawn: :class:`InvalidPrivacyParameterError` for an
    ``epsilon`` outside ``[1e-9, 1e6]`` (or a bool, a string), :class:`SparseDPError` without a bound
    ``L`` or with one that is not an integer in ``[1, 2^31]``, :class:`ShapeError` for trips that are
    not walks on ``road``, and for an unknown or unavailable ``method``, a bad ``tol``, ``secure`` or
    ``rng``.
    """
    prep = _prepare(road, trips, epsilon, method, fixed_endpoints, tol, max_edges, secure)
    # validates the counts and the generator, then charges the accountant, then draws
    meas = prep.plan.measure(prep.truth, accountant=accountant, rng=rng, label=f"traffic flows (L = {prep.L})")
    solved = _project_after_draw(meas.y, prep.system, prep.how, prep.reason, prep.tol)
    return FlowRelease(meas.y, solved.x, prep.truth if keep_truth else None, prep.unit, float(meas.scales[0]),
                       prep.epsilon, bool(fixed_endpoints), solved, prep.L, meas.secure, meas.private,
                       float(meas.variances[0]), meas.entry)


@dataclass(frozen=True)
class _Prepared:
    """What :func:`release_flows` measures, checked before any charge (the tests audit ``plan``)."""

    plan: MeasurementPlan  # identity strategy, unit = L + 2 (or L), epsilon
    truth: np.ndarray  # the true counts (the data; never released)
    system: FlowSystem
    epsilon: float
    L: int
    unit: int
    how: str
    reason: str
    tol: float


def _prepare(road: RoadNetwork, trips: Trips, epsilon: Any, method: Any, fixed_endpoints: Any, tol: Any,
             max_edges: Any, secure: Any) -> _Prepared:
    """Every check of :func:`release_flows`, the true counts and the calibrated measurement plan."""
    eps = check_epsilon(epsilon, "epsilon")
    L = _bound(trips, max_edges)
    tol = check_positive(tol, "tol")
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True or False, got {secure!r}")
    truth, system, unit = _measured(road, trips, L, bool(fixed_endpoints))
    how, reason = check_method(system, method)
    plan = plan_measurement(st.identity(truth.size), epsilon=eps, unit=unit, noise="laplace", secure=bool(secure))
    return _Prepared(plan, truth, system, eps, L, unit, how, reason, tol)
