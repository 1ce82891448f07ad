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

**A privacy unit** (``privacy_unit=PrivacyUnit("vehicle", max_rows=k)``, the trips carrying their
vehicle ids in ``Trips.units``): every vehicle keeps at most ``k`` of its trips (secret random
priorities, stable: :func:`~sparsedp.privacy_unit.truncate`), each cut to ``L`` edges.  A
vehicle's change of the counts is the sum of its kept trips' changes, each of L1 norm at most
``L + 2``, so ``||d||_1 <= k (L + 2)``: the measurement is planned with ``unit = L + 2`` and
``privacy_unit`` (which multiplies the sensitivity by ``k``; Laplace noise, whose loss is linear in
``||d||_1``), and the ledger entry names the unit.  ``max_rows="auto"`` spends ``auto_share`` of
the budget on a DP quantile of the trips per vehicle
(:func:`~sparsedp.contribution_bound.resolve_unit`), after every check; its own ledger entry comes
first.  Trips have no natural cells to group by, so ``max_groups`` / ``max_rows_per_group`` are
refused.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components
from scipy.sparse.linalg import splu

from .. import strategies as st
from ..accuracy import ErrorReport
from ..errors import SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..privacy import Accountant, LedgerEntry, PrivacyCost
from ..privacy_unit import IdColumnWarning, PrivacyUnit, declared, truncate
from ..releases import ReleaseResult, register_reader
from ..range_variance import DEFAULT_MEMORY_LIMIT, check_memory
from ..validation import check_epsilon, check_magnitude, check_positive
from .conservation import FlowSystem, conservation_system
from .network import RoadNetwork
from .solve import FlowSolve, check_method, project
from .trips import Trips, check_max_edges, check_trips, flow_counts, select_trips, truncate_trips

__all__ = ["FlowRelease", "release_flows"]

#: What a release without a declared unit protects (its description's ``privacy_unit``).
ONE_TRIP: dict[str, str] = {"privacy_unit": "one trip"}


@dataclass(frozen=True)
class FlowRelease:
    """Noisy and consistent flow counts, with the calibration used.

    ``max_edges`` is the bound ``L`` the release enforced (every trip was cut to it),
    ``sensitivity`` the L1 norm bound of one truncated trip's contribution (``L + 2``, or ``L`` with
    fixed end points: the ``unit`` of the measurement), ``scale`` the Laplace scale of every measured
    count (:attr:`scales`), ``noise_variance`` its actual variance (exact discrete-Laplace variance
    when ``secure``).  ``private`` is ``False`` when the noise came from a seed; ``ledger`` is the
    measurement's :class:`~sparsedp.privacy.LedgerEntry` (the record the accountant keeps).
    With a privacy unit, ``sensitivity`` is what one whole unit changes (``max_rows (L + 2)``),
    ``privacy_unit`` the unit with its concrete bound and ``bound_choice`` the private choice of
    ``max_rows="auto"`` (a :class:`~sparsedp.contribution_bound.BoundChoice`, charged with its own
    ledger entry); ``epsilon`` is then the whole budget, the choice's share included.
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
    system: FlowSystem | None = field(default=None, repr=False, compare=False)  # the constraints projected on
    privacy_unit: PrivacyUnit | None = None  # the vehicle (concrete bounds) it protects; None: one trip
    bound_choice: Any = field(default=None, repr=False, compare=False)  # the private choice of max_rows ("auto")

    @property
    def ledger_entries(self) -> list[LedgerEntry]:
        """Every ledger entry of the release: the bound's choice (``max_rows="auto"``) first, then
        the measurement."""
        first = [] if self.bound_choice is None else [self.bound_choice.measurement.entry]
        return [e for e in (*first, self.ledger) if e is not None]

    def to_release(self, *, description: dict | None = None, private: bool | None = None,
                   method: str = "auto") -> Any:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: every consistent value
        labelled by ``part`` (``edge``, ``start`` or ``end``) and ``id`` (edge or node), with its
        variance from :meth:`error_report` (``method``: exact up to 4000 nodes, else the bound
        ``v``, ``variance_method`` says which) and the ledger entry."""
        desc = {"epsilon": self.epsilon, "max_trip_edges": self.max_edges, "sensitivity": self.sensitivity,
                "laplace_scale": self.scale, "secure": self.secure, "fixed_endpoints": self.fixed_endpoints,
                "noise_variance": self.noise_variance}
        if self.system is not None:
            desc.update(nodes=int(self.system.nodes), edges=int(self.system.edges))
        desc["privacy_unit"] = self.privacy_unit.describe() if self.privacy_unit is not None else ONE_TRIP
        if self.bound_choice is not None:
            desc["privacy_unit_bound"] = self.bound_choice.describe()
        desc.update(description or {})
        try:
            rep = self.error_report(method)
        except SparseDPError as exc:
            rep = exc
        return flows_result(self.consistent, desc, kind="flows", ledger=self.ledger_entries,
                            private=self.private if private is None else private, noise="laplace",
                            secure=bool(self.secure), source=self, report=rep)

    def save(self, path: Any, description: dict | None = None, *, overwrite: bool = False) -> Any:
        """Write the consistent flows with their labels and variances, the noise variance and the
        ledger as a release file (:meth:`to_release` saved by
        :meth:`sparsedp.releases.ReleaseResult.save`; never the trips or the true counts).  An
        existing file is replaced only with ``overwrite=True``."""
        return self.to_release(description=description).save(path, overwrite=overwrite)

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """One row per consistent value (:meth:`sparsedp.releases.ReleaseResult.to_pandas`)."""
        return self.to_release().to_pandas(level, method)

    @property
    def scales(self) -> np.ndarray:
        """The Laplace scale of each measured count (all equal to :attr:`scale`)."""
        return np.full(self.noisy.size, self.scale)

    @property
    def variances(self) -> np.ndarray:
        """The noise variance of each measured count (all equal to :attr:`noise_variance`)."""
        return np.full(self.noisy.size, self.noise_variance)

    # -- per-answer accuracy (issue 20) --------------------------------------------------------
    def error_report(self, method: str = "auto", *, probes: int = 64, rng: Any = None,
                     exact_nodes: int = 4_000, memory_limit: float = DEFAULT_MEMORY_LIMIT) -> ErrorReport:
        """Variance of every consistent value (:attr:`consistent`) as an
        :class:`~sparsedp.accuracy.ErrorReport`.

        Every count is measured with the same noise variance ``v`` and the release is the orthogonal
        projection onto ``C x = b`` (``b`` public), so ``Cov = v (I - P)``, ``P = C^T (C C^T)^+ C``.
        ``method``:

        * ``"exact"``: ``P_jj = c_j^T (C C^T)^+ c_j`` from a sparse LU of the (grounded) Laplacian
          ``C C^T``, solved against blocks of unit vectors (``O(V)`` solves, memory bounded by
          ``memory_limit``): an edge ``u -> w`` needs ``G_uu + G_ww - 2 G_uw``, a start / end count
          ``G_uu``.
        * ``"bound"``: ``v`` for every value, an exact *upper* bound (a projection cannot raise a
          coordinate's variance); intervals from it are conservative.
        * ``"estimate"``: ``(I - P)_jj ~ mean_k ((I - P) q_k)_j^2`` over ``probes`` Rademacher vectors
          ``q_k`` (one projection each): unbiased, relative standard error at most
          ``sqrt(2 / probes)`` (18% at 64).  ``stderr`` of the report is that bound on the total.
        * ``"auto"``: exact up to ``exact_nodes`` network nodes, else the bound.
        """
        if method not in ("auto", "exact", "bound", "estimate"):
            raise SparseDPError(f"method must be 'auto', 'exact', 'bound' or 'estimate', got {method!r}")
        v = float(self.noise_variance)
        if not np.isfinite(v) or v <= 0:
            raise SparseDPError("this release does not record its noise variance, so its accuracy is unknown")
        if method != "bound" and self.system is None:
            raise SparseDPError("this release does not carry its constraint system: only method='bound' applies")
        if method == "auto":
            method = "exact" if self.system is not None and self.system.C.shape[0] <= exact_nodes else "bound"
        stderr = 0.0
        if method == "bound":
            var = np.full(self.consistent.size, v)
        elif method == "exact":
            var = v * np.maximum(1.0 - _projection_diagonal(self.system, memory_limit), 0.0)
        else:
            var = v * _residual_diagonal_estimate(self.system, probes, rng)
            stderr = float(np.sqrt(2.0 / probes) * var.sum())
        total = float(var.sum())
        shape = None
        if method == "exact":
            sys_, scale, secure = self.system, float(self.scale), bool(self.secure)
            shape = functools.partial(_projection_shape, sys_, v, scale, secure, var)  # on first use
        return ErrorReport(total, total / var.size, f"{method}-projection", stderr, variances=var, noise="laplace",
                           secure=bool(self.secure), shape=shape)

    def confidence_intervals(self, level: float = 0.95, method: str = "auto", *,
                             report: ErrorReport | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around every consistent value at confidence ``level`` from ``report``
        (default :meth:`error_report`); ``method`` is the interval method of
        :meth:`ErrorReport.confidence_intervals <sparsedp.accuracy.ErrorReport.confidence_intervals>`."""
        rep = self.error_report() if report is None else report
        return rep.confidence_intervals(self.consistent, level, method)

    def rmse(self) -> tuple[float, float]:
        """Root mean squared error of the noisy and the consistent release against the truth
        (evaluation only: the result depends on the data beyond what was released)."""
        if self.truth is None:
            raise SparseDPError("no truth to compare with (release with keep_truth=True to evaluate)")
        return (
            float(np.sqrt(np.mean((self.noisy - self.truth) ** 2))),
            float(np.sqrt(np.mean((self.consistent - self.truth) ** 2))),
        )


def flows_result(x: np.ndarray, description: dict, *, report: Any = None, **fields: Any) -> Any:
    """The :class:`~sparsedp.releases.ReleaseResult` of consistent flow values ``x``: labels
    ``part`` / ``id`` when ``description`` gives the network's ``nodes`` and ``edges`` (the
    variables ``[edge flows, starts, ends]``, or edge flows only with ``fixed_endpoints``), else the
    index; variances from ``report`` (an :class:`~sparsedp.accuracy.ErrorReport`), else the exact
    upper bound ``noise_variance`` of every value (``variance_method="bound"``)."""
    x = np.asarray(x)
    nodes, edges = description.get("nodes"), description.get("edges")
    labels: dict[str, np.ndarray] = {}
    if nodes is not None and edges is not None:
        parts = [("edge", int(edges))] + ([] if description.get("fixed_endpoints") else
                                           [("start", int(nodes)), ("end", int(nodes))])
        if sum(k for _, k in parts) == x.size:
            labels = {"part": np.concatenate([np.full(k, name) for name, k in parts]),
                      "id": np.concatenate([np.arange(k) for _, k in parts])}
    var, how = None, None
    if isinstance(report, ErrorReport):
        var, how = report.variances, report.method
    else:
        v = description.get("noise_variance")
        if v is not None and np.isfinite(v) and v > 0:
            var, how = np.broadcast_to(np.float64(v), (x.size,)), "bound"
        else:
            how = f"unavailable: {report}" if report is not None else "unavailable: no noise variance recorded"
        report = None
    fields.setdefault("strategy", f"identity on {x.size} counts, projected on flow conservation")
    return ReleaseResult(answers=x, labels=labels, variances=var, variance_method=how, report=report,
                         description=description, arrays=fields.pop("arrays", None) or {"x": x}, **fields)


def _laplacian(system: FlowSystem) -> tuple[sp.csr_matrix, np.ndarray]:
    """``C C^T`` and the rows kept after grounding one node per component (fixed end points)."""
    C = sp.csr_matrix(system.C, dtype=np.float64)
    S = sp.csr_matrix(C @ C.T)
    if not system.fixed_endpoints:
        return S, np.arange(S.shape[0])
    ncomp, labels = connected_components(S, directed=False)
    keep = np.ones(S.shape[0], dtype=bool)
    keep[np.unique(labels, return_index=True)[1]] = False
    return S, np.flatnonzero(keep)


def _projection_diagonal(system: FlowSystem, memory_limit: float) -> np.ndarray:
    """``diag(C^T G C)`` for a generalised inverse ``G`` of ``C C^T`` (grounded nodes: zero rows
    and columns; every column of ``C`` is orthogonal to the per-component constants), from a sparse
    LU solved against blocks of unit vectors."""
    S, keep = _laplacian(system)
    V = S.shape[0]
    pos = np.full(V, -1, dtype=np.int64)
    pos[keep] = np.arange(keep.size)
    Cc = sp.csc_matrix(system.C, dtype=np.float64)
    Cc.sum_duplicates()
    col = np.repeat(np.arange(Cc.shape[1]), np.diff(Cc.indptr))
    # all pairs (a, b) of non-zeros of one column: their rows, weights and column
    first = Cc.indptr[:-1][col]
    cnt = np.diff(Cc.indptr)[col]
    pa = np.repeat(np.arange(Cc.nnz), cnt)
    pb = np.repeat(first, cnt) + (np.arange(pa.size) - np.repeat(np.cumsum(cnt) - cnt, cnt))
    ra, rb = pos[Cc.indices[pa]], pos[Cc.indices[pb]]
    w = Cc.data[pa] * Cc.data[pb]
    ok = (ra >= 0) & (rb >= 0)
    ra, rb, w, pcol = ra[ok], rb[ok], w[ok], col[pa][ok]
    order = np.argsort(rb, kind="stable")
    ra, rb, w, pcol = ra[order], rb[order], w[order], pcol[order]
    k = keep.size
    block = int(max(1, min(k, (memory_limit / 4) // (16.0 * max(k, 1)), 512)))
    check_memory(16.0 * k * block + 40.0 * w.size, memory_limit, "the exact variances of the flow release")
    lu = splu(sp.csc_matrix(S[keep][:, keep]))
    out = np.zeros(Cc.shape[1])
    bounds = np.searchsorted(rb, np.arange(0, k + block, block))
    for i, start in enumerate(range(0, k, block)):
        stop = min(start + block, k)
        E = np.zeros((k, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        X = lu.solve(E)
        sl = slice(bounds[i], bounds[i + 1])
        np.add.at(out, pcol[sl], w[sl] * X[ra[sl], rb[sl] - start])
    return out


def _projection_shape(system: FlowSystem, v: float, scale: float, secure: bool, var: np.ndarray,
                      limit: float = 2.0**27) -> Any:
    """The consistent values' :class:`~sparsedp.accuracy.ErrorShape` (what the intervals use beyond the
    variances): their errors are ``(I - P) z``, built from the same grounded LU as the variances,
    in blocks of columns ``e_j - C^T G c_j``; ``None`` above ``limit`` coefficients."""
    from .._tails import ShapeAccumulator, noise_rows

    C = sp.csc_matrix(system.C, dtype=np.float64)
    N = C.shape[1]
    if float(N) * N > limit:
        return None
    S, keep = _laplacian(system)
    lu = splu(sp.csc_matrix(S[keep][:, keep]))
    CT = sp.csr_matrix(C.T)
    acc = ShapeAccumulator(N, noise_rows("laplace", secure, np.full(N, v), scales=np.full(N, scale)), var)
    for start in range(0, N, 256):
        stop = min(start + 256, N)
        R = C[:, start:stop].toarray()
        X = np.zeros_like(R)
        X[keep] = lu.solve(np.ascontiguousarray(R[keep]))
        B = -np.asarray(CT @ X)
        B[np.arange(start, stop), np.arange(stop - start)] += 1.0
        acc.add(B, slice(start, stop))
    return acc.result()


def _residual_diagonal_estimate(system: FlowSystem, probes: int, rng: Any) -> np.ndarray:
    """Unbiased estimate of ``diag(I - P)``: ``mean_k ((I - P) q_k)^2`` over Rademacher ``q_k``."""
    if isinstance(probes, (bool, np.bool_)) or not isinstance(probes, (int, np.integer)) or probes < 1:
        raise SparseDPError(f"probes must be an integer >= 1, got {probes!r}")
    S, keep = _laplacian(system)
    lu = splu(sp.csc_matrix(S[keep][:, keep]))
    C = sp.csr_matrix(system.C, dtype=np.float64)
    gen = np.random.default_rng(rng)
    acc = np.zeros(C.shape[1])
    for start in range(0, int(probes), 64):
        k = min(64, int(probes) - start)
        Q = gen.choice([-1.0, 1.0], size=(C.shape[1], k))
        lam = np.zeros((C.shape[0], k))
        lam[keep] = lu.solve(np.asarray(C @ Q)[keep])
        A = Q - np.asarray(C.T @ lam)
        acc += np.einsum("ij,ij->i", A, A)
    return acc / int(probes)


def _bound(trips: Trips, max_edges: Any) -> int:
    """The truncation bound ``L``: ``max_edges`` if given, else the trips' claimed one."""
    if max_edges is None:
        if getattr(trips, "max_edges", None) is None:
            raise SparseDPError(
                "trips must be truncated to bound one trip's contribution: give max_edges= (or trips with max_edges)"
            )
        return check_max_edges(trips.max_edges, "trips.max_edges")
    return check_max_edges(max_edges)


def _measured(road: RoadNetwork, trips: Trips, L: int, fixed_endpoints: bool, unit: PrivacyUnit | None = None,
              rng: Any = None, drop_missing: bool = False) -> tuple[np.ndarray, FlowSystem, int]:
    """The true counts the release measures, the conservation system and the L1 bound of one
    trip's change of them (the measurement's ``unit``: ``L + 2``, or ``L`` with fixed end points).
    With a privacy ``unit`` every unit first keeps at most ``max_rows`` of its trips
    (:func:`~sparsedp.privacy_unit.truncate`, priorities from ``rng``; ``None``: secure)."""
    checked = check_trips(road, trips)
    if unit is not None:
        checked = select_trips(checked, truncate(checked.units, unit, rng=rng, drop_missing=drop_missing))
    counts = flow_counts(road, truncate_trips(road, checked, L))
    check_magnitude(counts, "flow counts")
    E, V = road.edges, road.nodes
    if fixed_endpoints:
        return counts[:E], conservation_system(road, counts[E : E + V], counts[E + V :]), L
    return counts, conservation_system(road), L + 2


def _flow_unit(privacy_unit: Any, drop_missing_units: Any, trips: Any) -> PrivacyUnit | None:
    """The declared unit (``None``: one trip), checked before anything is read or charged: a
    :class:`PrivacyUnit` bounded by ``max_rows`` (a trip has no natural cell, so ``max_groups`` /
    ``max_rows_per_group`` are refused) on trips that carry their units' ids.  Trips carrying ids
    with no declared unit get an :class:`~sparsedp.privacy_unit.IdColumnWarning`."""
    privacy_unit = declared(privacy_unit, drop_missing_units)
    if privacy_unit is None:
        if getattr(trips, "units", None) is not None:
            warnings.warn("the trips carry unit ids (trips.units) but no privacy unit is declared: this release "
                          "protects one trip, not one vehicle; declare privacy_unit=PrivacyUnit(COLUMN, max_rows=K)",
                          IdColumnWarning, stacklevel=3)
        return None
    if privacy_unit.grouped:
        raise SparseDPError("traffic flows bound the trips per unit with max_rows only: a trip has no natural cell to "
                            "group by, so max_groups / max_rows_per_group are refused")
    if getattr(trips, "units", None) is None:
        raise SparseDPError(f"privacy unit {privacy_unit.column!r} declared but the trips carry no unit ids: give one "
                            "per trip with trips.with_units(ids) (or a trips file column of that name)")
    return privacy_unit


def _seeded(rng: Any) -> Any:
    """The generator a release with a privacy unit shares between the truncation, the bound's choice
    and the noise: ``None`` (secure, OS entropy) or a validated :class:`numpy.random.Generator` from a
    seed (so the three draw different numbers; a seeded release is not private anyway)."""
    from ..noise import SecureRandomBits, as_generator

    if rng is None or isinstance(rng, SecureRandomBits):
        return rng
    return as_generator(rng)


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
    privacy_unit: PrivacyUnit | None = None,
    drop_missing_units: bool = False,
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

    ``privacy_unit`` (default: one trip): a :class:`~sparsedp.privacy_unit.PrivacyUnit` naming the
    vehicle (or person) whose trips ``trips.units`` identifies; each keeps at most ``max_rows`` trips
    (``"auto"``: chosen privately with a share of ``epsilon``) and the noise is calibrated to
    ``max_rows (L + 2)`` (module doc).  ``drop_missing_units``: drop trips without a unit id (else
    refused).  Refused before any charge: a unit with ``max_groups`` / ``max_rows_per_group``,
    trips without ids, missing ids.
    """
    if privacy_unit is not None and not (isinstance(privacy_unit, PrivacyUnit) and privacy_unit.is_row):
        rng = _seeded(rng)
    prep = _prepare(road, trips, epsilon, method, fixed_endpoints, tol, max_edges, secure,
                    privacy_unit=privacy_unit, drop_missing_units=drop_missing_units, rng=rng, accountant=accountant)
    # validates the counts and the generator, then charges the accountant, then draws
    meas = prep.plan.measure(prep.truth, accountant=accountant, rng=rng, label=f"traffic flows (L = {prep.L})")
    solved = _project_after_draw(meas.y, prep.system, prep.how, prep.reason, prep.tol)
    return FlowRelease(meas.y, solved.x, prep.truth if keep_truth else None, prep.unit, float(meas.scales[0]),
                       prep.epsilon, bool(fixed_endpoints), solved, prep.L, meas.secure, meas.private,
                       float(meas.variances[0]), meas.entry, prep.system, prep.privacy_unit, prep.choice)


@dataclass(frozen=True)
class _Prepared:
    """What :func:`release_flows` measures, checked before any charge (the tests audit ``plan``)."""

    plan: MeasurementPlan  # identity strategy, unit = L + 2 (or L), times max_rows with a privacy unit; epsilon
    truth: np.ndarray  # the true counts (the data; never released)
    system: FlowSystem
    epsilon: float  # the whole budget (the bound's choice included)
    L: int
    unit: int  # the L1 bound of one protected unit's change of the counts (the release's sensitivity)
    how: str
    reason: str
    tol: float
    privacy_unit: PrivacyUnit | None = None  # concrete bounds; None: one trip
    choice: Any = None  # the BoundChoice of max_rows="auto" (already charged)


def _prepare(road: RoadNetwork, trips: Trips, epsilon: Any, method: Any, fixed_endpoints: Any, tol: Any,
             max_edges: Any, secure: Any, *, privacy_unit: Any = None, drop_missing_units: Any = False,
             rng: Any = None, accountant: Accountant | None = None) -> _Prepared:
    """Every check of :func:`release_flows`, the true counts and the calibrated measurement plan.

    With a privacy unit the trips are read with every trip kept first (so bad trips and missing
    ids are refused before anything is charged); ``max_rows="auto"`` is then chosen -- the only
    charge made here, to ``accountant``, after it was checked to hold the whole ``epsilon`` and the
    plan for the rest of it was checked -- and the trips truncated at the bound."""
    eps = check_epsilon(epsilon, "epsilon")
    L = _bound(trips, max_edges)
    tol = check_positive(tol, "tol")
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True or False, got {secure!r}")
    fixed = bool(fixed_endpoints)
    unit = _flow_unit(privacy_unit, drop_missing_units, trips)
    drop = bool(drop_missing_units)
    if unit is None:
        truth, system, per_trip = _measured(road, trips, L, fixed)
        how, reason = check_method(system, method)
        plan = plan_measurement(st.identity(truth.size), epsilon=eps, unit=per_trip, noise="laplace",
                                secure=bool(secure))
        return _Prepared(plan, truth, system, eps, L, per_trip, how, reason, tol)
    # every trip kept (priorities irrelevant): checks the trips, the ids, the counts and the method
    truth, system, per_trip = _measured(road, trips, L, fixed, _keep_all(unit), np.random.default_rng(0), drop)
    check_method(system, method)
    choice, budget = None, eps
    if unit.is_auto:
        from ..contribution_bound import candidate_bounds, resolve_unit

        rest = eps * (1.0 - float(unit.auto_share)) * (1.0 - 1e-9)  # below what resolve_unit leaves
        worst = PrivacyUnit(unit.column, max_rows=int(candidate_bounds()[-1]))
        plan_measurement(st.identity(truth.size), epsilon=rest, unit=per_trip, noise="laplace", secure=bool(secure),
                         privacy_unit=worst)  # the release's plan at any chosen bound: refused now, not after the charge
        if accountant is not None:
            accountant.check(PrivacyCost(epsilon=eps))
        ids = check_trips(road, trips).units
        unit, choice, budget = resolve_unit(unit, ids, epsilon=eps, accountant=accountant, rng=rng,
                                            drop_missing=drop)
    truth, system, per_trip = _measured(road, trips, L, fixed, unit, rng, drop)
    how, reason = check_method(system, method)
    plan = plan_measurement(st.identity(truth.size), epsilon=budget, unit=per_trip, noise="laplace",
                            secure=bool(secure), privacy_unit=unit)
    return _Prepared(plan, truth, system, eps, L, per_trip * unit.l1_bound(), how, reason, tol, unit, choice)


def _keep_all(unit: PrivacyUnit) -> PrivacyUnit:
    """A stand-in for ``unit`` that keeps every trip: reading the trips with it checks them and their
    ids before a ``max_rows="auto"`` choice is charged."""
    return PrivacyUnit(unit.column, max_rows=2**62)


register_reader("flows.result", flows_result)  # load_release reads earlier flows files with it
