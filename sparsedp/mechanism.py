"""The matrix mechanism (Li, Hay, Rastogi, Miklau, McGregor; seed 001) and its low-rank form.

Measure a strategy ``M`` with noise, ``y = M x + z``, reconstruct ``x_hat`` by generalised least
squares and answer the workload ``W x_hat``.  For a factorisation ``W = B M`` this is seed 000's
``A(W, x) = B (M x + (Delta_M / eps) L)`` (eq. 5.1); with a weighted strategy ``diag(w) M`` it is
eq. 5.8.

Noise calibration (one record changes one entry of the count vector ``x`` by one):

* Laplace, ``epsilon``-DP:  ``z_i ~ Lap(b)``, ``b = Delta_1(M) / epsilon``,
  ``Delta_1(M) = max_j sum_i |M_ij|``; ``Var(z_i) = 2 b^2``.
* Gaussian, ``rho``-zCDP:   ``z_i ~ N(0, sigma^2)``, ``sigma = Delta_2(M) / sqrt(2 rho)``,
  ``Delta_2(M) = max_j sqrt(sum_i M_ij^2)`` (Bun and Steinke 2016).  ``(epsilon, delta)`` may be
  given instead of ``rho``; it is converted with :func:`~sparsedp.privacy.rho_for_approx_dp`.
* ``secure=True``: exact discrete Laplace / discrete Gaussian noise (Canonne, Kamath, Steinke 2020)
  from OS random bits, on the grid ``g`` (default 1): ``y = g (round(M x / g) + k)``.  When
  ``M x / g`` is integral for integral ``x`` (integer multiples of ``g`` in ``M``), the sensitivity in
  grid units is ``Delta_p(M) / g``; otherwise rounding can move every touched row by one more unit
  and the mechanism uses ``max_j sum_{i: M_ij != 0} (|M_ij| / g + 1)`` (p = 1; the root of the
  sum of squares for p = 2).  The discrete Laplace with scale ``t`` is ``epsilon``-DP for grid
  sensitivity ``Delta`` when ``t = Delta / epsilon``; the discrete Gaussian with ``sigma^2 =
  Delta^2 / (2 rho)`` is ``rho``-zCDP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .accuracy import ErrorReport, expected_error
from .range_variance import DEFAULT_MEMORY_LIMIT, MemoryLimitError, format_bytes
from .errors import InvalidPrivacyParameterError, ShapeError, SparseDPError, UnsupportedStructureError
from .inference import _METHODS as RECONSTRUCTION_METHODS
from .inference import Reconstruction, reconstruct
from .calibration import gaussian_sigma, laplace_scale
from .measure import Measurement, plan_measurement
from .operators import aslinearoperator
from .marginals.mechanism import MarginalPlan, is_marginal_strategy, marginal_plan
from .marginals.workload import MarginalWorkload
from .privacy import Accountant
from .releases import ReleaseResult, workload_labels

__all__ = ["Measurement", "Release", "MatrixMechanism"]


@dataclass(frozen=True)
class Release:
    """Workload answers from one run of a mechanism.

    Per-answer accuracy (issue 20): :meth:`variances` is the variance of each workload answer,
    ``Var((W x_hat)_q) = sum_i Var(z_i) (W G)_{qi}^2`` with ``G`` the GLS estimator of the measured
    strategy and ``Var(z_i)`` the noise actually drawn (exact discrete variances for exact noise);
    :meth:`confidence_intervals` puts an interval around each answer at the level asked for.  The
    default (``method="auto"``) is accurate for the noise drawn (:mod:`sparsedp.accuracy`): the
    normal quantile for float Gaussian noise; otherwise ``"accurate"`` -- the exact quantile of the
    noise value's law for an answer that is one noise value (identity rows: the discrete Laplace /
    discrete Gaussian quantile on its lattice with exact noise), and the variance-gamma law with
    the answer's exact variance and kurtosis for a sum (continuity-corrected on a lattice).  The
    report knows the sampler scales of the noise drawn (``Measurement.scales`` and the plan's
    ``unit_scales``), so exact noise is described exactly.  ``method="exact-tail"`` (or
    ``"chebyshev"``, any noise) gives certified intervals (coverage at least ``level``).  Both
    hold for the least-squares reconstruction (``method="ls"``), the unbiased one; ``nnls`` and
    ``l1`` answers are biased and are refused.

    ``unit_scales``: the sampler's per-row scales (grid units; ``MeasurementPlan.unit_scales``),
    which a :class:`~sparsedp.measure.Measurement` does not carry; :meth:`MatrixMechanism.run`
    sets them.  Exact Gaussian noise needs them for its exact law (a discrete Gaussian's scale in
    data units does not name its sampler scale above ``sigma ~ 1.2``); without them its intervals
    fall back to the normal shape.
    """

    answers: np.ndarray
    x_hat: np.ndarray
    measurement: Measurement
    reconstruction: Reconstruction
    workload: Any = field(default=None, repr=False, compare=False)  # the answered W (an operator)
    unit_scales: np.ndarray | None = field(default=None, repr=False, compare=False)  # the sampler's (grid units)
    #: what the optimiser said of the strategy, when ``sparsedp.optimize`` chose it (:func:`optimizer_record`)
    optimizer: dict | None = field(default=None, repr=False, compare=False)
    #: error reports computed so far, by their options (shared with the mechanism that ran: the
    #: report depends on the strategy and its noise only, never on the answers)
    _reports: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def private(self) -> bool:
        """False when the noise came from a seeded generator."""
        return self.measurement.private

    def error_report(self, **kwargs: Any) -> ErrorReport:
        """The :class:`~sparsedp.accuracy.ErrorReport` of these answers (their variances, total and
        intervals) from the strategy measured and its noise variances; ``kwargs`` go to
        :func:`~sparsedp.accuracy.expected_error` (``method``, ``memory_limit``, ...).  Computed
        once per set of options and kept (:meth:`variances`, :meth:`confidence_intervals`,
        :meth:`to_release` and :meth:`save` reuse it, as does the mechanism that ran)."""
        if self.workload is None:
            raise SparseDPError("this release does not know its workload: make it with MatrixMechanism.run")
        if self.reconstruction.method != "ls":
            raise SparseDPError(f"per-answer variances are those of the least-squares answers; this release "
                                f"was reconstructed with {self.reconstruction.method!r} (biased): run with method='ls'")
        return cached_report(self._reports, kwargs, self._compute_report)

    def _compute_report(self, **kwargs: Any) -> ErrorReport:
        m = self.measurement
        kwargs.setdefault("noise", m.noise)
        kwargs.setdefault("secure", m.secure)
        if kwargs["noise"] == m.noise and bool(kwargs["secure"]) == bool(m.secure):
            _noise_law(kwargs, m.scales, self.unit_scales)
        return expected_error(self.workload, m.strategy, m.variances, **kwargs)

    def variances(self, **kwargs: Any) -> np.ndarray:
        """Variance of each workload answer (see the class docstring)."""
        rep = self.error_report(**kwargs)
        if rep.variances is None:
            raise SparseDPError("the error report of this workload carries no per-answer variances "
                                "(too many queries for max_variances)")
        return rep.variances

    def confidence_intervals(self, level: float = 0.95, method: str = "auto",
                             **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around each answer at confidence ``level`` (``method``: ``"auto"``,
        accurate for the noise drawn; ``"exact-tail"`` or ``"chebyshev"``, coverage at least
        ``level``; ``"accurate"``, ``"normal"``, ``"laplace"``, ``"gaussian"``; see
        :mod:`sparsedp.accuracy`)."""
        return self.error_report(**kwargs).confidence_intervals(self.answers, level, method)

    def to_release(self, *, description: dict | None = None, private: bool | None = None,
                   **kwargs: Any) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: the workload answers labelled
        by :func:`~sparsedp.releases.workload_labels` (``lo`` / ``hi`` ranges, ``bin`` or ``query``),
        their exact variances (:meth:`variances`; ``None`` for biased ``nnls`` / ``l1`` answers or
        when they cannot be listed), ``x_hat`` and the noise scales as arrays, the ledger entry;
        ``private=False`` marks a release that was evaluated against the truth (it can only lower
        the measurement's own flag); ``kwargs`` go to :meth:`error_report`."""
        m = self.measurement
        desc = {"strategy": m.strategy.name, "noise": m.noise, "secure": m.secure,
                "sensitivity": m.sensitivity, "epsilon": m.cost.epsilon, "rho": m.cost.rho,
                "privacy_unit": (m.entry.privacy_unit if m.entry is not None else None) or "one row"}
        if self.optimizer is not None:
            desc["optimizer"] = dict(self.optimizer)
        desc.update(description or {})
        try:
            rep = self.error_report(**kwargs)
            var, how = rep.variances, rep.method
            if var is None:
                rep, how = None, "unavailable: too many answers to list their variances"
        except SparseDPError as exc:
            rep, var, how = None, None, f"unavailable: {exc}"
        labels = workload_labels(self.workload) if self.workload is not None else {}
        arrays = {"answers": self.answers, "x_hat": self.x_hat, "scales": m.scales, "noise_variances": m.variances}
        return ReleaseResult(
            kind="matrix-mechanism", answers=self.answers, labels=labels, variances=var, noise=m.noise,
            secure=bool(m.secure), strategy=f"{m.strategy.name} ({m.strategy.shape[0]} rows), "
            f"{self.reconstruction.method} reconstruction", ledger=[m.entry] if m.entry is not None else [],
            private=bool(m.private) and private is not False, description=desc, arrays=arrays, variance_method=how,
            report=rep, source=self)

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """One row per workload answer (:meth:`sparsedp.releases.ReleaseResult.to_pandas`)."""
        return self.to_release().to_pandas(level, method)

    def save(self, path: str | Path, *, description: dict | None = None, overwrite: bool = False) -> Path:
        """Write the answers with their labels and variances, the estimate and the measurement's
        ledger entry as a release file (:meth:`to_release` saved by
        :meth:`sparsedp.releases.ReleaseResult.save`; never the data).  An existing file is
        replaced only with ``overwrite=True``."""
        return self.to_release(description=description).save(path, overwrite=overwrite)


def cached_report(cache: dict, kwargs: dict[str, Any], compute: Any) -> ErrorReport:
    """``compute(**kwargs)``, kept in ``cache`` under the options (computed anew when an option is
    not hashable, e.g. an array of scales)."""
    try:
        key = tuple(sorted(kwargs.items()))
        hash(key)
    except TypeError:
        return compute(**kwargs)
    if key not in cache:
        cache[key] = compute(**kwargs)
    return cache[key]


def optimizer_record(opt: Any) -> dict[str, Any]:
    """What a release keeps of the :class:`~sparsedp.optimize.OptimizedStrategy` it measured (public:
    it depends on the workload only): the family and strategy chosen, its expected total squared
    error under the noise that runs (``exact_error``), the same with continuous noise of the same
    calibration (``error``) and the certified lower bound on every strategy's (``lower_bound``) at
    the optimiser's budget, and the gap ``error / lower_bound`` (``None`` when no bound is known)."""
    gap = opt.gap
    cont = opt.continuous_error if opt.continuous_error is not None else opt.error.total
    return {"family": opt.family, "name": opt.name, "noise": opt.noise, "budget": float(opt.budget),
            "error": float(cont), "exact_error": float(opt.error.total),
            "lower_bound": None if opt.lower_bound is None else float(opt.lower_bound),
            "gap": None if gap is None else float(gap)}


def _noise_law(kwargs: dict[str, Any], scales: Any, unit_scales: Any) -> None:
    """Default the noise's scales in ``kwargs`` (for :func:`~sparsedp.accuracy.expected_error`):
    the measurement's ``scales`` (data units) and the sampler's ``unit_scales`` (grid units), unless
    the caller gave either (a caller's ``scales=`` is not overridden by the sampler's)."""
    if "scales" in kwargs or "unit_scales" in kwargs:
        kwargs.setdefault("scales", scales)
        return
    kwargs["scales"] = scales
    if unit_scales is not None:
        kwargs["unit_scales"] = unit_scales


def _optimized_strategy(W: Any, M: Any, noise: str, options: dict[str, Any] | None) -> Any:
    """The :class:`~sparsedp.optimize.OptimizedStrategy` that ``M`` names or is (``None`` for any
    other strategy); checked against the mechanism's noise before anything is measured."""
    from .optimize import OptimizedStrategy, optimize  # the optimiser builds on this module's neighbours

    if isinstance(M, str):
        if M != "optimized":
            raise InvalidPrivacyParameterError(f"a strategy given by name must be 'optimized', got {M!r}")
        opts = dict(options or {})
        if "noise" in opts:
            raise InvalidPrivacyParameterError("optimize_options must not set noise: the mechanism's noise is used")
        if noise not in ("laplace", "gaussian"):
            raise InvalidPrivacyParameterError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
        return optimize(W, noise=noise, **opts)
    if options:
        raise InvalidPrivacyParameterError('optimize_options apply only to M="optimized"')
    if isinstance(M, OptimizedStrategy):
        if M.noise != noise:
            raise InvalidPrivacyParameterError(f"this strategy was optimised for {M.noise} noise, the mechanism "
                                               f"uses {noise}: optimise again with noise={noise!r}")
        return M
    return None


class MatrixMechanism:
    """Answer workload ``W`` by measuring strategy ``M`` with calibrated noise.

    Parameters
    ----------
    W, M:
        Workload and strategy (operators, sparse or dense matrices) with the same column count.
        ``M="optimized"`` runs :func:`sparsedp.optimize` on ``W`` for this mechanism's ``noise``
        (with ``optimize_options``) and measures the strategy it returns; an
        :class:`~sparsedp.optimize.OptimizedStrategy` (the result of an earlier ``optimize`` call)
        is measured as is.  Either way ``self.optimized`` holds the result (``None`` otherwise).
    epsilon:
        Pure-DP budget of one measurement (Laplace), or with ``delta`` an ``(epsilon, delta)`` target
        for Gaussian noise.
    rho:
        zCDP budget of one measurement (Gaussian).
    noise:
        ``"laplace"`` or ``"gaussian"``.
    secure:
        Exact discrete noise from OS random bits on the grid ``grid`` (see the module docstring);
        the default.  ``secure=False`` draws textbook float64 Laplace / Gaussian noise, which leaks
        through its low bits (Mironov, CCS 2012): an explicit opt-out for experiments.
    accountant:
        Optional :class:`~sparsedp.privacy.Accountant`; every :meth:`measure` spends its cost there
        first and raises :class:`~sparsedp.errors.BudgetExceededError` before drawing noise.
    privacy_unit:
        Whom the release protects (:class:`~sparsedp.privacy_unit.PrivacyUnit`; default one row).
        The data passed to :meth:`run` must already obey its bounds (build it with
        :func:`~sparsedp.privacy_unit.unit_histogram`); the sensitivity is multiplied by what one
        unit can change (:func:`~sparsedp.measure.plan_measurement`) and the ledger names the unit.
    optimize_options:
        Keyword arguments of :func:`sparsedp.optimize` for ``M="optimized"`` (``family``,
        ``time_limit``, ``rng``, ...); ``noise`` is this mechanism's.  The optimiser chooses the
        strategy from the workload alone (never from the data), so it costs no budget; the
        mechanism calibrates from the returned strategy's own entries as for any other strategy.
    """

    def __init__(
        self,
        W: Any,
        M: Any,
        epsilon: float | None = None,
        *,
        rho: float | None = None,
        delta: float | None = None,
        noise: str = "laplace",
        secure: bool = True,
        grid: float = 1.0,
        accountant: Accountant | None = None,
        optimize_options: dict[str, Any] | None = None,
        privacy_unit: Any = None,
    ):
        self.optimized = _optimized_strategy(W, M, noise, optimize_options)
        self._reports: dict = {}  # error reports by their options (cached_report)
        target = M if self.optimized is None else self.optimized.strategy
        self._marginal: MarginalPlan | None = None
        self.privacy_unit = privacy_unit
        if is_marginal_strategy(target):  # ResidualPlanner / weighted marginals: measured by marginals.mechanism
            if privacy_unit is not None and not getattr(privacy_unit, "is_row", False):
                raise UnsupportedStructureError("a privacy unit with a marginal strategy is not supported yet: "
                                                "measure the marginals' explicit matrix")
            self._init_marginal(W, target, epsilon, rho, delta, noise, secure, accountant)
            return
        if isinstance(W, MarginalWorkload):
            raise ShapeError("a marginal workload is measured with the optimiser's marginal strategy: pass "
                             "M='optimized' or sparsedp.optimize(W) (or build the matrix with workloads.marginals)")
        self.W = aslinearoperator(W, name="workload")
        self.M = aslinearoperator(target, name="strategy")
        if self.W.shape[1] != self.M.shape[1]:
            raise ShapeError(f"workload has {self.W.shape[1]} columns, strategy {self.M.shape[1]}")
        self.noise = noise
        self.secure = bool(secure)
        if accountant is not None and not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        self.accountant = accountant
        if noise == "laplace" and epsilon is None and rho is None and delta is None:
            raise InvalidPrivacyParameterError("Laplace noise needs epsilon")
        if noise == "gaussian" and rho is None and (epsilon is None or delta is None):
            raise InvalidPrivacyParameterError("Gaussian noise needs rho, or epsilon and delta")
        # One measurement path: the plan measures the operator's explicit matrix and calibrates
        # from the same entries (never from a structure tag or a closed form it claims).
        self._plan = plan_measurement(self.M, epsilon=epsilon, rho=rho, delta=delta, noise=noise,
                                      secure=self.secure, grid=grid, privacy_unit=privacy_unit)
        # the plan's read-only copy of the strategy (interval rows, sparse and Kronecker operators):
        # editing the caller's M later changes neither the measurement nor its reconstruction
        self.M = self._plan.strategy
        self.grid = self._plan.grid
        self.cost = self._plan.cost
        if noise == "laplace":
            self.epsilon = self.cost.epsilon
        else:
            self.rho = self.cost.rho
        self.sensitivity = self._plan.data_sensitivity

    def _init_marginal(self, W: Any, strategy: Any, epsilon: float | None, rho: float | None, delta: float | None,
                       noise: str, secure: bool, accountant: Accountant | None) -> None:
        """A marginal strategy (:mod:`sparsedp.marginals.mechanism`): checked, nothing measured."""
        if accountant is not None and not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        plan = marginal_plan(W, strategy, noise=noise, epsilon=epsilon, rho=rho, delta=delta, secure=secure)
        self._marginal = plan
        self.W, self.M = W, plan.strategy
        self.noise, self.secure, self.accountant = noise, bool(secure), accountant
        self.grid = 1.0
        self.cost = plan.cost
        if noise == "laplace":
            self.epsilon = self.cost.epsilon
        else:
            self.rho = self.cost.rho

    def _not_marginal(self, what: str) -> None:
        if self._marginal is not None:
            raise SparseDPError(f"{what} is not defined for a marginal strategy (one noise scale per residual or "
                                "table): run(x) releases the marginals, error_report() gives their variances")

    # -- calibration -----------------------------------------------------------------------------
    @property
    def _grid_exact(self) -> bool:
        return self._plan.grid_exact

    @property
    def _grid_sensitivity(self) -> float:
        """Secure mode: the sensitivity in grid units (``Delta_p(M / g)``, or with every entry
        ``ceil(|M_ij| / g) + 1`` when ``M / g`` is not integral)."""
        return self._plan.sensitivity if self.secure else 0.0

    def noise_scale(self) -> float:
        """Laplace ``b = Delta_1 / epsilon`` or Gaussian ``sigma = Delta_2 / sqrt(2 rho)`` (float
        noise), rounded up so that the stated budget is never exceeded."""
        self._not_marginal("noise_scale()")
        if self.noise == "laplace":
            return laplace_scale(self.sensitivity, self.epsilon)
        return gaussian_sigma(self.sensitivity, self.rho)

    def _secure_scale(self) -> float:
        """Scale in grid units of the discrete noise (``t`` or ``sigma``), rounded up."""
        return float(self._plan.unit_scales[0])

    def variances(self) -> np.ndarray:
        """Per-row noise variance of one measurement (exact discrete variances when secure)."""
        self._not_marginal("variances()")
        return self._plan.variances()

    # -- measuring -------------------------------------------------------------------------------
    def measure(self, x: Any, rng: Any = None, *, counts: bool = True) -> Measurement:
        """Draw ``y = M x + z`` through :meth:`sparsedp.measure.MeasurementPlan.measure`.

        ``x`` must be a finite vector of length ``n`` (non-negative integral counts unless
        ``counts=False``), at most ``2^50`` in magnitude, as must ``M x``.  Input is checked, then
        the budget charged, then noise drawn.
        """
        self._not_marginal("measure()")
        return self._plan.measure(x, accountant=self.accountant, rng=rng, counts=counts,
                                  label=f"MatrixMechanism({self.M.name})")

    def run(self, x: Any, rng: Any = None, method: str = "ls", *, counts: bool = True, executor: Any = None,
            chunk: int | None = None, out: Any = None, scratch: Any = None, progress: bool | None = None) -> Any:
        """Measure, reconstruct (``ls``, ``nnls`` or ``l1``) and answer the workload.

        Another ``method`` raises :class:`~sparsedp.errors.SparseDPError` before anything is
        charged or drawn (as does bad input, in :meth:`measure`).

        Partitioned data (issue 14): when ``x`` is a ``.npy`` / ``.zarr`` path or a ``dask.array``, or
        ``executor`` / ``out`` is given, a hierarchical strategy (``hierarchical(n, k)``) is measured
        chunk by chunk through :func:`sparsedp.scaleout.release_hierarchical` (``executor``:
        ``None``, ``"threads"``, ``"dask"``, a ``Client`` or an executor; ``chunk``: leaves per task,
        a power of ``k``; ``out``: a ``.npy`` / ``.zarr`` path for ``x_hat``) and a
        :class:`~sparsedp.scaleout.matrix.ScaleoutMatrixRelease` is returned: the same GLS estimate
        for the same noise, one ledger entry; see :mod:`sparsedp.scaleout.matrix` for what differs."""
        from .scaleout.matrix import is_partitioned, run_scaleout

        if not isinstance(method, str) or method not in RECONSTRUCTION_METHODS:  # before anything is charged
            raise SparseDPError(f"method must be one of {sorted(RECONSTRUCTION_METHODS)}, got {method!r}")
        if self._marginal is not None:  # the marginal release (GLS over the residuals), in the workload's order
            if method != "ls" or not counts or any(v is not None for v in (executor, out, chunk, scratch)):
                raise SparseDPError("a marginal strategy runs in process on a histogram of counts with method='ls' "
                                    "(the GLS of its residuals)")
            return self._marginal.run(x, accountant=self.accountant, rng=rng)
        if executor is not None or out is not None or chunk is not None or scratch is not None or is_partitioned(x):
            return run_scaleout(self, x, rng=rng, method=method, counts=counts, executor=executor, chunk=chunk,
                                out=out, scratch=scratch, progress=progress)
        # the answers W x_hat are held as float64: refuse, before anything is charged, a workload whose
        # answers cannot be held (all_ranges(2^16) has 2^31 of them: 16 GiB)
        if 8.0 * float(self.W.shape[0]) > DEFAULT_MEMORY_LIMIT:
            raise MemoryLimitError(
                f"the workload has {self.W.shape[0]} queries: their answers need {format_bytes(8.0 * self.W.shape[0])}, "
                f"more than {format_bytes(DEFAULT_MEMORY_LIMIT)}; measure with a workload of the queries you publish "
                "(the strategy's estimate answers any range afterwards), nothing was charged")
        meas = self.measure(x, rng=rng, counts=counts)
        rec = reconstruct(meas, method=method)
        rel = Release(self.W.matvec(rec.x), rec.x, meas, rec, workload=self.W, unit_scales=self._plan.unit_scales,
                      optimizer=None if self.optimized is None else optimizer_record(self.optimized))
        object.__setattr__(rel, "_reports", self._reports)  # the plan's report: the same for every run
        return rel

    # -- analytics -------------------------------------------------------------------------------
    def error_report(self, **kwargs: Any) -> ErrorReport:
        """Expected total squared error of the workload answers (GLS), with how it was computed.

        ``sum_i Var(z_i) ||W G e_i||^2``, ``G`` the GLS estimator; for homoscedastic Laplace on a
        square strategy, ``(2 Delta_1^2 / eps^2) trace(B^T B)`` with ``B = W M^-1``.  The report
        carries each answer's variance (``.variances``) and confidence intervals
        (``.confidence_intervals(answers, level)``) for this mechanism's noise, with the plan's
        scales (``scales``, ``unit_scales``), so the intervals use the exact law of exact noise.
        Computed once per set of options and kept; the releases :meth:`run` returns share it.
        """
        return cached_report(self._reports, kwargs, self._compute_report)

    def _compute_report(self, **kwargs: Any) -> ErrorReport:
        if self._marginal is not None:
            if kwargs:
                raise SparseDPError("a marginal strategy's error report takes no options")
            return self._marginal.error_report()
        kwargs.setdefault("noise", self.noise)
        kwargs.setdefault("secure", self.secure)
        if kwargs["noise"] == self.noise and bool(kwargs["secure"]) == self.secure:
            _noise_law(kwargs, self._plan.scales, self._plan.unit_scales)
        return expected_error(self.W, self.M, self.variances(), **kwargs)

    def expected_error(self, **kwargs: Any) -> float:
        """The total of :meth:`error_report` as a float."""
        return self.error_report(**kwargs).total
