"""Differentially private histogram publishers with one interface: LUE-DPTree and four baselines.

Every publisher is built with ``epsilon`` (and optionally an :class:`~sparsedp.privacy.Accountant`,
charged ``epsilon`` before any noise is drawn), published by ``.fit(histogram, rng=...)`` and then
answers ``.range(lo, hi)`` / ``.ranges(pairs)`` (inclusive, 0-based bins) and ``.histogram()``.

==============  =====================================================  ==================================
publisher       measurement (all eps-DP for one record = one bin += 1)  estimate
==============  =====================================================  ==================================
``LUEDPTree``   SC (or any) tree, ``Lap(1/eps_x)`` per node, budgets    BLUE under consistency (O(n))
                of CNP + NPBD: every root-to-leaf path sums to eps
``Boost``       binary tree, ``eps / levels`` per node (Hay 2010)       same BLUE (uniform weights)
``BoostUN``     binary tree, one budget per depth ~ ``P_d^(1/3)``       same BLUE
``Privelet``    Haar wavelet rows, ``Lap(Delta_1 / eps)``,              inverse wavelet transform
                ``Delta_1 = log2 n + 1`` (Xiao et al. 2010)
``Dwork``       every bin, ``Lap(1 / eps)``                             the noisy bins
==============  =====================================================  ==================================

Privacy (issues 13, 16 and 19): one measurement path.  Every publisher draws its noise through
:func:`sparsedp.measure.plan_measurement` (``.measure``), which validates, charges the accountant
(with a ledger entry), then draws; nothing here calls a noise sampler.  The privacy argument is
"the sensitivity of this measured matrix at these scales":

* tree methods measure ``IntervalRows(n, tree.lo, tree.hi)`` (row ``i`` is ``1`` on
  ``[lo_i, hi_i)``, one row per node) with per-row Laplace scales ``b_i = (1 + m) / eps_i`` rounded
  up (``m = 2^-40 + nodes levels 2^-58``, below ``1e-9``: it absorbs the certificate's own upward
  rounding), and the plan's budget is the publisher's ``epsilon``: the plan refuses, before any
  charge, unless the certified coverage loss ``max_j sum_{i: lo_i <= j < hi_i} 1 / b_i`` -- computed
  exactly in integers from the intervals themselves -- is at most ``epsilon``.  Before that the tree
  is re-validated (:meth:`IntervalTree.check`) and the budgets must pass the rule they were made
  for (every root-to-leaf path sums to at most ``epsilon``, :func:`path_sum_bounds`; a user budget
  that does not is refused);
* ``Dwork`` measures the identity, ``Delta_1 = 1``, ``b = 1 / epsilon`` rounded up;
* ``Privelet`` measures the Haar rows through a :class:`~sparsedp.mechanism.MatrixMechanism` (the
  same path, calibrated from the matrix's entries).

Noise is exact by default (``secure=True``): discrete Laplace on the integer grid, so the noisy
node counts (and Dwork's bins) are integers.  With many distinct node budgets the path rounds the
exact sampler's scales *up* to a ``2^(k/64)`` grid (at most 1.1% more noise standard deviation), so
the BLUE weights are the measurement's actual per-row variances (``Measurement.variances``, exact
discrete-Laplace variances), not ``2 / eps_i^2``.  ``secure=False`` draws textbook float64 Laplace
noise, which leaks through its low bits (Mironov, CCS 2012): an explicit opt-out for experiments.

Inputs: counts must be non-negative integers with every node count (the root count, the total) at
most ``MAX_MAGNITUDE = 2^50``; ``rng`` is ``None`` (OS entropy) or a seed / numpy ``Generator``
(reproducible; the release then says ``private=False``).  ``HistogramRelease.measured_matrix()``,
``.noise_scales``, ``.noise_variances`` and ``.ledger`` say what was measured and how.

Range answers from a consistent release are differences of prefix sums of the leaf estimates:
every canonical decomposition gives the same sum.  ``LUEDPTree(consistency=False)`` answers from the
raw noisy node counts by the vectorised canonical decomposition instead (the error of eq. 3.2).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import strategies as st
from .. import workloads as wl
from ..accuracy import ErrorReport
from ..errors import (
    InputBoundError,
    InvalidPrivacyParameterError,
    ShapeError,
    SparseDPError,
)
from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..mechanism import MatrixMechanism
from ..privacy import Accountant, LedgerEntry, PrivacyCost
from ..factored_covariance import structured_covariance
from ..range_variance import IntervalTreeCovariance
from ..release_file import load_release_file
from ..releases import ReleaseResult, axis_labels, register_reader
from ..strategies import _interval_rows
from ..validation import MAX_MAGNITUDE, check_counts, check_epsilon, check_vector
from .blue import blue
from .budget import (
    allocate_budget,
    level_budget,
    normalise_budget,
    path_sum_bounds,
    uniform_budget,
)
from .build import IntervalTree, as_interval_tree, kary_layout
from .gls import gls_budget, gls_error, query_coverage
from .coverage import answer_ranges, check_ranges, coverage_probabilities, decompose
from .sc import sc_layout

__all__ = [
    "HistogramRelease",
    "histogram_from_release",
    "load_release",
    "node_counts",
    "TreePublisher",
    "LUEDPTree",
    "Boost",
    "BoostUN",
    "Privelet",
    "Dwork",
]


@dataclass(frozen=True)
class HistogramRelease:
    """A published histogram: the leaf estimates and, for tree methods, the tree and node values.

    ``node_values`` are used for range answers only when the release is not consistent.
    What was measured, for auditing: :meth:`measured_matrix` (one row per noisy measurement),
    ``noise_scales`` (the Laplace scale ``b_i`` of every row, in data units, as the measurement path
    used them) and ``noise_variances`` (their actual variances: exact discrete-Laplace variances when
    ``secure``); the privacy loss of the release is ``max_j sum_i |A_ij| / b_i``.  ``ledger`` is the
    measurement's :class:`~sparsedp.privacy.LedgerEntry` (``Measurement.entry``, the record the
    accountant keeps: what, sensitivity, noise, scales, epsilon, secure, private, time).  ``private`` is ``False`` when the noise came from a seed given for
    reproducibility (then the output is not a private release); ``secure`` is ``False`` for float
    noise (``secure=False``)."""

    method: str
    epsilon: float
    estimate: np.ndarray
    tree: IntervalTree | None = None
    node_values: np.ndarray | None = None
    eps_per_node: np.ndarray | None = None
    consistent: bool = True
    noise_scales: np.ndarray | None = None
    strategy: sp.csr_matrix | None = field(default=None, repr=False, compare=False)
    private: bool = True
    secure: bool = True
    noise_variances: np.ndarray | None = field(default=None, repr=False, compare=False)
    ledger: LedgerEntry | None = field(default=None, compare=False)
    _prefix: np.ndarray = field(init=False, repr=False, compare=False)
    _cache: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prefix", np.concatenate(([0.0], np.cumsum(self.estimate))))
        object.__setattr__(self, "_cache", {})

    @property
    def n(self) -> int:
        return int(self.estimate.size)

    def measured_matrix(self) -> sp.csr_matrix:
        """The matrix whose rows were measured with noise: the node-interval rows of the tree
        (row ``i`` is ``1`` on ``[lo_i, hi_i)``), or the strategy of a non-tree method (Haar rows,
        the identity)."""
        if self.tree is not None:
            return _interval_rows(self.tree.lo, self.tree.hi, self.tree.n)
        if self.strategy is not None:
            return sp.csr_matrix(self.strategy)
        if self.method == Dwork.name:
            return sp.identity(self.n, format="csr")
        if self.method == Privelet.name:
            return sp.csr_matrix(st.haar(self.n).tosparse())
        raise SparseDPError(f"unknown measurement for method {self.method!r}")

    def ranges(self, pairs: Any) -> np.ndarray:
        """Answers to the inclusive 0-based ranges ``pairs[i] = (lo, hi)`` (shape ``(m, 2)``)."""
        lo, hi = check_ranges(pairs, self.n, "pairs")
        if self.consistent or self.tree is None:
            return self._prefix[hi] - self._prefix[lo]
        return answer_ranges(self.tree, self.node_values, lo, hi)

    def range(self, lo: int, hi: int) -> float:
        """Answer to the inclusive 0-based range ``[lo, hi]``."""
        return float(self.ranges(np.array([[lo, hi]]))[0])

    # -- per-answer accuracy (issue 20) --------------------------------------------------------
    def error_report(self, pairs: Any = None) -> ErrorReport:
        """Variance of each answer to the inclusive ranges ``pairs`` (every bin when ``None``), exact,
        as an :class:`~sparsedp.accuracy.ErrorReport` (``.variances``, ``.total``,
        ``.confidence_intervals(answers, level)``).  From the measured rows' actual noise variances:
        a consistent tree release by :class:`~sparsedp.range_variance.IntervalTreeCovariance` (the
        BLUE's covariance on any tree shape, ``O(nodes)`` once, then ``O(depth)`` per range), an
        inconsistent one as the sum over the canonical decomposition, Dwork and Privelet by the
        identity and Haar closed forms."""
        return _answer_report(self, pairs)

    def variances(self, pairs: Any = None) -> np.ndarray:
        """``Var`` of each answer of :meth:`ranges` (every bin when ``pairs`` is ``None``), exact."""
        return self.error_report(pairs).variances  # type: ignore[return-value]

    def confidence_intervals(self, level: Any = 0.95, method: Any = "auto", pairs: Any = None
                             ) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` around the answers to the inclusive ranges ``pairs`` (every bin when
        ``None``) at confidence ``level``:
        :meth:`ErrorReport.confidence_intervals <sparsedp.accuracy.ErrorReport.confidence_intervals>`
        (``method="auto"``: the default interval for the noise drawn).  The call of every release
        (:meth:`sparsedp.releases.ReleaseResult.confidence_intervals`); the ranges go by keyword
        (``pairs=``; an array given first is still taken as the ranges)."""
        level, method, pairs = _interval_args(level, method, pairs)
        answers = self.estimate if pairs is None else self.ranges(pairs)
        return self.error_report(pairs).confidence_intervals(answers, level, method)

    def to_release(self, *, private: bool | None = None, ledger: Any = None, description: dict | None = None,
                   arrays: dict | None = None, path: str | None = None) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: one answer per bin (label
        ``bin``), its exact variance (:meth:`variances`), the arrays of :meth:`save` and the
        ledger entry; ``source`` is this object (it answers any range)."""
        arr = self._arrays() if arrays is None else dict(arrays)
        try:
            rep = self.error_report()
            var, how = rep.variances, rep.method
        except SparseDPError as exc:  # a file of an earlier version without noise variances
            rep, var, how = None, None, f"unavailable: {exc}"
        desc = {"method": self.method, "epsilon": self.epsilon, "consistent": bool(self.consistent),
                "secure": bool(self.secure)}
        desc.update(description or {})
        if self.tree is not None:
            what = f"{self.method}: {self.tree.size} interval-tree nodes, {'BLUE' if self.consistent else 'raw nodes'}"
        else:
            what = {Dwork.name: "dwork: every bin", Privelet.name: "privelet: Haar wavelet rows"}.get(
                self.method, self.method)
        return ReleaseResult(
            kind="histogram", answers=arr["estimate"], labels=axis_labels((self.n,), ["bin"]), variances=var,
            noise="laplace", secure=bool(self.secure), strategy=what,
            ledger=([self.ledger] if self.ledger is not None else []) if ledger is None else ledger,
            private=bool(self.private) if private is None else private, description=desc, arrays=arr,
            variance_method=how, report=rep, source=self, path=path)

    def _arrays(self) -> dict[str, Any]:
        arrays: dict[str, Any] = {"estimate": self.estimate}
        if self.noise_scales is not None:
            arrays["noise_scales"] = self.noise_scales
        if self.noise_variances is not None:
            arrays["noise_variances"] = self.noise_variances
        if self.tree is not None:
            t = self.tree
            arrays.update(lo=t.lo, hi=t.hi, parent=t.parent, child_start=t.child_start, level_start=t.level_start,
                          node_values=self.node_values, eps_per_node=self.eps_per_node)
        return arrays

    def to_pandas(self, level: float = 0.95, method: str = "auto") -> Any:
        """One row per bin (:meth:`sparsedp.releases.ReleaseResult.to_pandas`)."""
        return self.to_release().to_pandas(level, method)

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the release as a sparsedp release file (:meth:`to_release` saved by
        :meth:`sparsedp.releases.ReleaseResult.save`: the released arrays with each bin's variance,
        a JSON description with ``method``, ``epsilon``, ``consistent`` and ``secure``, the ledger
        entry of the measurement and the ``private`` flag; never the data).  ``sparsedp ledger
        FILE`` prints its ledger, :func:`sparsedp.load_release` reads it back.  An existing file
        is replaced only with ``overwrite=True``."""
        return self.to_release().save(path, overwrite=overwrite)


def _interval_args(level: Any, method: Any, pairs: Any) -> tuple[float, str, Any]:
    """``(level, method, pairs)`` of ``confidence_intervals``; the earlier call
    ``confidence_intervals(pairs, level, method)`` (ranges first) is recognised by its array."""
    if level is None or not np.isscalar(level):
        if pairs is not None and not isinstance(pairs, str):
            raise SparseDPError("confidence_intervals(level, method, pairs=...): the level must be a number")
        level, method, pairs = (method if not isinstance(method, str) else 0.95,
                                pairs if isinstance(pairs, str) else (method if isinstance(method, str) else "auto"),
                                level)
    return level, method, pairs


def _node_noise_variances(rel: HistogramRelease) -> np.ndarray:
    """Per measured row the noise variance: the measurement's own, or ``2 b^2`` for float Laplace."""
    if rel.noise_variances is not None:
        return np.asarray(rel.noise_variances, dtype=np.float64)
    if rel.noise_scales is not None and not rel.secure:
        b = np.asarray(rel.noise_scales, dtype=np.float64)
        return 2.0 * b * b
    raise SparseDPError("this release does not record its noise variances, so its accuracy is unknown")


def _answer_report(rel: HistogramRelease, pairs: Any = None) -> ErrorReport:
    """:meth:`HistogramRelease.error_report` (see there)."""
    if pairs is None:
        lo = np.arange(rel.n, dtype=np.int64)
        hi = lo + 1
    else:
        lo, hi = check_ranges(pairs, rel.n, "pairs")
    v = np.maximum(_node_noise_variances(rel), MIN_VARIANCE)  # the weights the estimate used
    if rel.tree is not None and rel.consistent:
        cov = rel._cache.get("cov")
        if cov is None:
            cov = rel._cache.setdefault("cov", IntervalTreeCovariance(rel.tree, v))
        var, how = cov.ranges(lo, hi), "exact-tree"
    elif rel.tree is not None:
        q, node = decompose(rel.tree, lo, hi)
        var, how = np.bincount(q, weights=v[node], minlength=lo.size), "exact-decomposition"
    elif rel.method == Dwork.name:
        cs = np.concatenate(([0.0], np.cumsum(v)))
        var, how = cs[hi] - cs[lo], "exact-identity"
    elif rel.method == Privelet.name:
        cov = structured_covariance(st.haar(rel.n), v)
        if cov is None:  # pragma: no cover - st.haar is always recognised
            raise SparseDPError("no closed form for this Haar strategy")
        var, how = cov.ranges(lo, hi), "exact-haar"
    else:
        raise SparseDPError(f"no per-answer accuracy for method {rel.method!r}")
    total = float(var.sum())
    return ErrorReport(total, total / max(lo.size, 1), how, variances=var, noise="laplace", secure=bool(rel.secure),
                       shape=functools.partial(_answer_shape, rel, lo, hi, v, var))  # on first use


def _answer_shape(rel: HistogramRelease, lo: np.ndarray, hi: np.ndarray, v: np.ndarray, var: np.ndarray) -> Any:
    """The answers' :class:`~sparsedp.accuracy.ErrorShape` (what the intervals use beyond the variances)
    from their coefficients on the measured rows; ``None`` above ``2^27`` coefficients."""
    from ..accuracy import error_shape, gls_error_shape
    from .._tails import ShapeAccumulator, noise_rows
    from ..tree_estimator import two_pass

    kw = {"noise": "laplace", "secure": bool(rel.secure), "scales": rel.noise_scales}
    if rel.tree is None:
        M = st.identity(rel.n) if rel.method == Dwork.name else st.haar(rel.n)
        W = wl.range_queries(rel.n, np.column_stack([lo, hi - 1]))
        return gls_error_shape(W, M, v, answer_variances=var, **kw)
    t = rel.tree
    if not rel.consistent:
        q, node = decompose(t, lo, hi)
        D = sp.csr_matrix((np.ones(q.size), (q, node)), shape=(lo.size, t.size))
        return error_shape(D, variances=v, answer_variances=var, **kw)
    if float(t.size) * max(t.size, lo.size) > 2.0**27:
        return None
    rows = noise_rows("laplace", bool(rel.secure), v, scales=rel.noise_scales)
    acc = ShapeAccumulator(lo.size, rows, var)
    for start in range(0, t.size, 256):  # the BLUE (linear) of blocks of unit vectors, then the ranges
        stop = min(start + 256, t.size)
        E = np.zeros((t.size, stop - start))
        E[np.arange(start, stop), np.arange(stop - start)] = 1.0
        leaf = two_pass(t.parent, t.level_start, E, v, plan=t.plan, overwrite=True)[t.leaves]  # what blue runs
        P = np.vstack([np.zeros((1, stop - start)), np.cumsum(leaf, axis=0)])
        acc.add(P[hi] - P[lo], slice(start, stop))
    return acc.result()


def _entry_from_dict(d: dict) -> LedgerEntry:
    """A :class:`LedgerEntry` from its :meth:`LedgerEntry.as_dict` form."""
    d = dict(d)
    cost = PrivacyCost(epsilon=d.pop("epsilon", 0.0), rho=d.pop("rho", 0.0))
    fields = set(LedgerEntry.__dataclass_fields__) - {"cost"}
    return LedgerEntry(cost=cost, **{k: v for k, v in d.items() if k in fields})


def _read_arrays(path: str | Path) -> tuple[dict[str, Any], dict[str, Any], LedgerEntry | None, bool]:
    """``(arrays, description, ledger entry, private)`` of a release file, or of the older
    histogram ``.npz`` layout (description fields stored as arrays)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            names = set(f.files)
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read release {path}: {exc}") from exc
    if "__sparsedp__" in names:
        rf = load_release_file(path)
        if rf.kind != "histogram":
            raise SparseDPError(f"{path} is a {rf.kind!r} release, not a histogram")
        return dict(rf.arrays), dict(rf.description), _ledger_entry(rf.ledger, path), rf.private
    with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    desc = {k: data.pop(k).item() for k in ("method", "epsilon", "consistent", "private") if k in data}
    desc.setdefault("secure", False)  # files written before exact noise was the default
    desc.pop("private", None)
    return data, desc, None, False  # this layout records no measurement: never reported private


def _ledger_entry(ledger: Any, path: Any) -> LedgerEntry | None:
    try:
        return _entry_from_dict(ledger[0]) if ledger else None
    except (ValueError, TypeError) as exc:
        raise SparseDPError(f"{path}: unreadable ledger entry: {exc}") from exc


def _histogram(data: dict[str, Any], desc: dict[str, Any], ledger: LedgerEntry | None, private: bool,
               path: Any) -> HistogramRelease:
    if "estimate" not in data or "method" not in desc:
        raise SparseDPError(f"{path} is not a sparsedp histogram release")
    tree = None
    if "lo" in data:
        tree = IntervalTree(int(data["hi"][0]), data["lo"], data["hi"], data["parent"],
                            data["child_start"], data["level_start"])
    return HistogramRelease(
        method=str(desc["method"]), epsilon=float(desc["epsilon"]), estimate=data["estimate"], tree=tree,
        node_values=data.get("node_values"), eps_per_node=data.get("eps_per_node"),
        consistent=bool(desc.get("consistent", True)), noise_scales=data.get("noise_scales"), private=private,
        secure=bool(desc.get("secure", False)), noise_variances=data.get("noise_variances"), ledger=ledger,
    )


def load_release(path: str | Path) -> HistogramRelease:
    """Read a release written by :meth:`HistogramRelease.save` (its tree is validated again) as a
    :class:`HistogramRelease`; :func:`sparsedp.load_release` reads it (and every other release
    file) as a :class:`~sparsedp.releases.ReleaseResult`."""
    data, desc, ledger, private = _read_arrays(path)
    return _histogram(data, desc, ledger, private, path)


def histogram_from_release(release: ReleaseResult) -> HistogramRelease:
    """The :class:`HistogramRelease` of a ``histogram`` :class:`~sparsedp.releases.ReleaseResult`
    read from an ``.npz`` file (its arrays and description; the tree is validated again)."""
    if release.kind != "histogram":
        raise SparseDPError(f"a {release.kind!r} release is not a histogram")
    return _histogram(dict(release.arrays), dict(release.description), _ledger_entry(release.ledger, release.path),
                      bool(release.private), release.path)


def node_counts(tree: IntervalTree, x: Any) -> np.ndarray:
    """True count of every node, ``sum_{j in [lo_i, hi_i)} x_j``: exact integer prefix differences,
    ``O(nodes)``.  These are the rows of :meth:`HistogramRelease.measured_matrix` applied to ``x``
    (what the measurement path computes with ``IntervalRows(n, tree.lo, tree.hi)``).

    ``x`` must be non-negative integer counts; the root count (the largest node count) must be at
    most ``MAX_MAGNITUDE = 2^50`` (:class:`InputBoundError` otherwise), so every count is an exact
    float and one record moves each count on its path by exactly 1."""
    t = as_interval_tree(tree)
    xv = check_counts(x, t.n, "histogram")
    if float(np.sum(xv)) > 2.0 * MAX_MAGNITUDE:  # float sum within 1e-9 relative: int64 is safe below
        raise InputBoundError("the histogram's total exceeds the supported bound 2^50")
    cs = np.concatenate(([0], np.cumsum(xv.astype(np.int64))))
    if int(cs[-1]) > MAX_MAGNITUDE:
        raise InputBoundError(
            "the histogram's total (the root count) exceeds the supported bound 2^50: above it "
            "float rounding, not noise, decides the output"
        )
    return (cs[t.hi] - cs[t.lo]).astype(np.float64)


def _check_secure(secure: Any) -> bool:
    if not isinstance(secure, (bool, np.bool_)):
        raise SparseDPError(f"secure must be True or False, got {secure!r}")
    return bool(secure)


def _calibrate(name: str, M: Any, epsilon: float, secure: bool, scales: Any = None) -> MeasurementPlan:
    """The measurement plan of ``M`` at ``epsilon`` (homoscedastic from ``Delta_1``, or the given
    per-row scales, whose certified loss must be ``<= epsilon``); nothing is charged or drawn."""
    try:
        return plan_measurement(M, epsilon=epsilon, scales=scales, noise="laplace", secure=secure)
    except SparseDPError as exc:
        raise type(exc)(f"{name}: {exc}") from exc


@dataclass(frozen=True)
class _Plan:
    """Everything a release needs, computed and checked before the budget is charged."""

    measurement: MeasurementPlan | None = None  # the calibrated measurement (tree methods, Dwork)
    tree: IntervalTree | None = None
    eps_per_node: np.ndarray | None = None
    loss: float | None = None  # certified privacy loss of the measurement (<= epsilon)
    mechanism: MatrixMechanism | None = None  # Privelet


class TreePublisher:
    """Common interface.  Subclasses implement ``_prepare(x) -> _Plan`` (all checks, no noise)
    and ``_publish(x, plan, rng) -> HistogramRelease`` (measures through the measurement path,
    which validates ``x`` and ``rng``, charges, then draws; the post-processing cannot fail).

    ``secure=True`` (default): exact discrete Laplace noise; ``secure=False``: float64 Laplace
    noise (leaks through its low bits; an explicit opt-out for experiments)."""

    name = "publisher"

    def __init__(self, epsilon: float, accountant: Accountant | None = None, *, secure: bool = True) -> None:
        self.epsilon = check_epsilon(epsilon, "epsilon")
        if accountant is not None and not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        self.accountant = accountant
        self.secure = _check_secure(secure)
        self.release_: HistogramRelease | None = None

    def fit(self, histogram: Any, rng: Any = None) -> "TreePublisher":
        """Publish ``histogram`` (non-negative integer counts, at most ``2^50`` in total for the tree
        methods).  ``rng``: ``None`` (OS entropy: a private release), or a seed / numpy Generator
        (reproducible, for tests; the release says ``private=False``).  Validate everything, then
        charge ``epsilon``, then draw."""
        x = check_counts(histogram, name="histogram")
        if x.size == 0:
            raise ShapeError("histogram is empty")
        plan = self._prepare(x)
        release = self._publish(x, plan, rng)
        self._record(plan, release)
        self.release_ = release
        return self

    def _label(self, x: np.ndarray) -> str:
        return f"{self.name}({x.size} bins)"

    def _prepare(self, x: np.ndarray) -> _Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def _publish(self, x: np.ndarray, plan: _Plan, rng: Any) -> HistogramRelease:  # pragma: no cover
        raise NotImplementedError

    def _record(self, plan: _Plan, release: HistogramRelease) -> None:
        """Keep what was measured (after a successful release)."""
        self.noise_scales_ = release.noise_scales

    def _release(self) -> HistogramRelease:
        if self.release_ is None:
            raise SparseDPError(f"{self.name}: call fit() first")
        return self.release_

    def measured_matrix(self) -> sp.csr_matrix:
        """The matrix the last release measured (see :meth:`HistogramRelease.measured_matrix`)."""
        return self._release().measured_matrix()

    def histogram(self) -> np.ndarray:
        """The published bin estimates."""
        return self._release().estimate.copy()

    def ranges(self, pairs: Any) -> np.ndarray:
        """Answers to the inclusive 0-based ranges in ``pairs`` (shape ``(m, 2)``), vectorised."""
        return self._release().ranges(pairs)

    def range(self, lo: int, hi: int) -> float:
        """Answer to the inclusive 0-based range ``[lo, hi]``."""
        return self._release().range(lo, hi)

    def variances(self, pairs: Any = None) -> np.ndarray:
        """Exact variance of each answer (see :meth:`HistogramRelease.error_report`)."""
        return self._release().variances(pairs)

    def confidence_intervals(self, level: Any = 0.95, method: Any = "auto", pairs: Any = None
                             ) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` at confidence ``level`` around the answers to ``pairs`` (every bin when
        ``None``; see :meth:`HistogramRelease.confidence_intervals`)."""
        return self._release().confidence_intervals(level, method, pairs)

    def to_release(self) -> ReleaseResult:
        """The last release as a :class:`~sparsedp.releases.ReleaseResult`."""
        return self._release().to_release()


#: Smallest per-node budget a tree publisher measures with: its noise scale ``1e100`` keeps every
#: noisy count, BLUE variance ``1 / eps^2`` (and their sums) and estimate finite in float64 (float
#: noise; exact noise is limited to scales ``<= 2^40`` by its sampler).
MIN_NODE_BUDGET = 1e-100

#: BLUE weights use ``max(variance, MIN_VARIANCE)``: an exact discrete Laplace of scale below about
#: ``1 / 745`` has variance 0 in float64 (it is 0 with probability ``> 1 - 1e-300``).  Weights are
#: post-processing and cost no privacy.
MIN_VARIANCE = 1e-100


#: With exact noise the sampler's scale is at most ``2^40`` (``sparsedp.noise.MAX_DISCRETE_SCALE``):
#: budgets made by a publisher's own rule (not ``eps_per_node`` given by the user) are raised to at
#: least ``2^-39`` and normalised again (:func:`normalise_budget`), so tiny epsilons (down to
#: ``1e-9``) and nodes of near-zero coverage stay measurable.  It moves budget only where a node's
#: budget is below ``2^-39`` (``epsilon`` below about ``1e-8``, or a root of coverage ~ ``1 / n^2``).
SECURE_MIN_BUDGET = 2.0**-39


def _secure_floor(tree: IntervalTree, eps: np.ndarray, epsilon: float) -> np.ndarray:
    """``eps`` with every budget below :data:`SECURE_MIN_BUDGET` raised to it, normalised so every
    path still sums to at most ``epsilon`` exactly."""
    if not np.any(eps < SECURE_MIN_BUDGET):
        return eps
    return normalise_budget(tree, np.maximum(eps, SECURE_MIN_BUDGET), epsilon)


def _node_scales(eps: np.ndarray, name: str, tree: IntervalTree) -> np.ndarray:
    """``b_i = (1 + m) / eps_i`` rounded up, ``m = 2^-40 + nodes levels 2^-58`` (so the certified
    coverage loss, whose every term and sum is rounded up, stays ``<= epsilon`` for budgets whose
    paths sum to ``epsilon`` exactly); refusing budgets that are not > 0 or below
    :data:`MIN_NODE_BUDGET` (whose noise and BLUE weights would not stay finite)."""
    if np.any(eps <= 0):
        raise SparseDPError(f"{name}: every node needs a budget > 0 (an unmeasured node has no weight)")
    if np.any(eps < MIN_NODE_BUDGET):
        raise InvalidPrivacyParameterError(
            f"{name}: node budget {float(eps.min()):.3g} below the supported minimum {MIN_NODE_BUDGET:g}"
        )
    margin = 2.0**-40 + float(tree.size) * float(tree.levels) * 2.0**-58
    return np.nextafter((1.0 / eps) * (1.0 + margin), np.inf)


class _TreeMethod(TreePublisher):
    """Noisy node counts ``h_x + Lap(b_x)``, ``b_x = 1 / eps_x`` (see :func:`_node_scales`), on a tree,
    measured as ``IntervalRows(n, tree.lo, tree.hi)`` through the measurement path, then the BLUE
    (weighted by the measurement's actual variances) or the raw counts."""

    consistency = True

    def _tree(self, n: int) -> IntervalTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def _budgets(self, tree: IntervalTree) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _user_budgets(self) -> bool:
        """Whether the budgets are the user's own (then they are measured as given, or refused)."""
        return False

    def _prepare(self, x: np.ndarray) -> _Plan:
        n = x.size
        tree = self._tree(n)
        if not isinstance(tree, IntervalTree):
            raise SparseDPError(f"{self.name}: expected an IntervalTree, got {type(tree).__name__}")
        tree.check()  # the structure the budget rule rests on, as the object is now
        if tree.n != n:
            raise ShapeError(f"the tree covers {tree.n} bins, the histogram has {n}")
        eps = check_vector(self._budgets(tree), tree.size, "node budgets")
        if self.secure and not self._user_budgets():
            eps = _secure_floor(tree, eps, self.epsilon)
        scales = _node_scales(eps, self.name, tree)
        bound = float(path_sum_bounds(tree, eps).max())  # the budget rule: every path sums to <= epsilon
        if not bound <= self.epsilon:
            raise SparseDPError(
                f"{self.name}: a root-to-leaf path of node budgets sums to {bound!r} (certified bound), more "
                f"than epsilon {self.epsilon!r}"
            )
        rows = IntervalRows(n, tree.lo, tree.hi, name=f"{self.name} node intervals ({tree.size} nodes)")
        plan = _calibrate(self.name, rows, self.epsilon, self.secure, scales)  # refuses a loss > epsilon
        return _Plan(measurement=plan, tree=tree, eps_per_node=eps, loss=plan.loss)

    def _publish(self, x: np.ndarray, plan: _Plan, rng: Any) -> HistogramRelease:
        tree, eps, mp = plan.tree, plan.eps_per_node, plan.measurement
        assert tree is not None and eps is not None and mp is not None
        label = self._label(x)
        meas = mp.measure(x, accountant=self.accountant, rng=rng, label=label)  # validate, charge, draw
        values = meas.y
        if self.consistency:
            values = blue(tree, meas.y, variances=np.maximum(meas.variances, MIN_VARIANCE))
        return HistogramRelease(self.name, self.epsilon, values[tree.leaves], tree, values, eps, self.consistency,
                                noise_scales=meas.scales, private=meas.private, secure=meas.secure,
                                noise_variances=meas.variances, ledger=meas.entry)

    def _record(self, plan: _Plan, release: HistogramRelease) -> None:
        super()._record(plan, release)
        self.tree_, self.eps_per_node_, self.privacy_loss_ = plan.tree, plan.eps_per_node, plan.loss


class LUEDPTree(_TreeMethod):
    """LUE-DPTree (seed 004, Algorithm 3.8): any interval tree, per-node budgets minimising the
    expected range error (CNCP + CNP + NPBD), Laplace noise ``Lap(1 / eps_x)`` per node (exact
    discrete Laplace by default), and the O(n) BLUE under consistency (PA_BLUE + CRC).  Privacy: the
    certified loss of the measured node intervals at these scales is at most ``epsilon`` (every
    root-to-leaf path sums to at most ``epsilon``, Conclusion 3.4), checked before noise is drawn.

    ``tree``: ``"sc"`` (Struct-Construct, Algorithm 3.1; ``k=None`` chooses the branching in
    ``[2, upper]``), ``"kary"`` (balanced, ``k`` default 2), or a networkx graph / IntervalTree.
    ``queries`` / ``weights``: optimise for a given list of inclusive ranges instead of uniform
    ranges (nodes no listed query uses get the probability floor ``1e-9 * max p``, so every node is
    still measured).  ``eps_per_node``: your own budgets (one per node, breadth-first, all > 0)
    instead of the optimised ones; refused before any charge unless every root-to-leaf path sums to
    at most ``epsilon`` exactly.  ``secure=False``: float noise (an explicit opt-out).

    ``whole_domain`` in ``[0, 1]``: the probability of the whole-domain query ``[0, n - 1]`` mixed
    into the query distribution (uniform ranges or the list).  ``objective``: ``"lue"`` (default, the
    paper's proxy: the error *before* consistency, eq. 3.6, minimised in closed form) or ``"gls"``
    (:func:`~sparsedp.trees.gls.gls_budget`: the exact expected squared error of the BLUE
    answer to one query of the distribution, ``sum_q D(q) q^T P^{-1} q`` with
    ``P = sum_x m_x m_x^T eps_x^2 / 2``, minimised over per-node budgets by L-BFGS-B with exact
    gradients from :mod:`sparsedp.optimize`; needs ``consistency=True``; at most ``gls_seconds``
    per search; the budgets are data-independent and cached per tree).  After ``fit``,
    :meth:`expected_error` is that exact error at the budgets used (float Laplace variances
    ``2 / eps_x^2``; the exact sampler's scales are rounded up, see the module docstring).
    """

    name = "lue-dptree"

    def __init__(
        self,
        epsilon: float,
        tree: Any = "sc",
        *,
        k: int | None = None,
        upper: int = 20,
        queries: Any = None,
        weights: Any = None,
        whole_domain: float = 0.0,
        objective: str = "lue",
        eps_per_node: Any = None,
        consistency: bool = True,
        accountant: Accountant | None = None,
        secure: bool = True,
        gls_seconds: float | None = 30.0,
    ) -> None:
        super().__init__(epsilon, accountant, secure=secure)
        if objective not in ("lue", "gls"):
            raise SparseDPError(f"objective must be 'lue' or 'gls', got {objective!r}")
        wd = float(whole_domain)
        if not 0.0 <= wd <= 1.0:
            raise SparseDPError(f"whole_domain must be in [0, 1], got {whole_domain!r}")
        if objective == "gls" and not consistency:
            raise SparseDPError("objective='gls' optimises the consistent (BLUE) answers: use consistency=True")
        if eps_per_node is not None and (objective == "gls" or wd):
            raise SparseDPError("give either eps_per_node or an objective / whole_domain, not both")
        self.objective, self.whole_domain, self.gls_seconds = objective, wd, gls_seconds
        self._gls_cache: dict[tuple, np.ndarray] = {}
        if isinstance(tree, str) and tree not in ("sc", "kary"):
            raise SparseDPError(f"tree must be 'sc', 'kary' or a graph, got {tree!r}")
        self.tree_spec = tree if isinstance(tree, str) else as_interval_tree(tree)
        self.k, self.upper = k, upper
        self.queries, self.weights = queries, weights
        if eps_per_node is not None and (queries is not None or weights is not None):
            raise SparseDPError("give either eps_per_node or queries/weights, not both")
        self.budget = None if eps_per_node is None else check_vector(eps_per_node, name="eps_per_node").copy()
        self.consistency = bool(consistency)

    def _tree(self, n: int) -> IntervalTree:
        if self.tree_spec == "sc":
            return sc_layout(n, self.k, self.upper)
        if self.tree_spec == "kary":
            return kary_layout(n, 2 if self.k is None else self.k)
        return self.tree_spec  # type: ignore[return-value]

    def _user_budgets(self) -> bool:
        return self.budget is not None

    def _budgets(self, tree: IntervalTree) -> np.ndarray:
        if self.budget is not None:
            if self.budget.size != tree.size:
                raise ShapeError(f"eps_per_node has {self.budget.size} entries for {tree.size} nodes")
            return self.budget
        p = query_coverage(tree, self.queries, self.weights, self.whole_domain)
        self.probabilities_ = p
        if self.objective == "lue":
            eps = allocate_budget(tree, self.epsilon, p)
        else:
            key = (tree.n, tree.size, hashlib.sha1(tree.lo.tobytes() + tree.hi.tobytes()).hexdigest())
            if key not in self._gls_cache:  # data-independent unit budgets, computed once per tree
                self._gls_cache[key] = gls_budget(tree, 1.0, self.queries, self.weights, self.whole_domain,
                                                  seconds=self.gls_seconds)
            eps = normalise_budget(tree, self._gls_cache[key] * self.epsilon, self.epsilon)
        return eps

    def release(self, data: Any, *, executor: Any = None, chunk: int | None = None, out: Any = None,
                rng: Any = None, scratch: Any = None, progress: bool | None = None) -> Any:
        """Publish a partitioned histogram chunk by chunk (:func:`sparsedp.scaleout.release_lue`):
        the same tree, per-node budgets, scales and BLUE as :meth:`fit`, never gathered on one
        process.  ``data``: a ``.npy`` / ``.zarr`` path, a ``dask.array`` or a numpy array;
        ``executor``: ``None`` (in-process), ``"threads"``, ``"dask"``, a ``dask.distributed.Client``
        or an executor; ``chunk``: the largest number of leaves per task; ``out``: a ``.npy`` path
        (or ``.zarr`` when the chunks are equal) or ``None``.  Charges this publisher's accountant
        once.  Returns a :class:`~sparsedp.scaleout.lue.LUEScaleoutRelease` (the publisher keeps no
        in-memory release: ``histogram()`` / ``ranges()`` stay those of the last :meth:`fit`).
        Supported: ``tree="sc"`` or ``"kary"`` with the uniform-range budgets (the defaults);
        ``queries`` / ``weights`` / ``whole_domain`` / ``objective="gls"`` / ``eps_per_node`` /
        ``consistency=False`` / a given graph are refused (:class:`SparseDPError`) before anything."""
        from ..scaleout.lue import release_lue

        unsupported = [name for name, off in (
            ("a given tree", isinstance(self.tree_spec, str)), ("queries/weights", self.queries is None and
                                                               self.weights is None),
            ("whole_domain", not self.whole_domain), ("objective='gls'", self.objective == "lue"),
            ("eps_per_node", self.budget is None), ("consistency=False", self.consistency)) if not off]
        if unsupported:
            raise SparseDPError(f"{self.name}: scale-out publishes the uniform-range budgets on an 'sc' or 'kary' "
                                f"tree; not supported there: {', '.join(unsupported)}")
        return release_lue(data, self.epsilon, tree=self.tree_spec, k=self.k, upper=self.upper, chunk=chunk,
                           executor=executor, accountant=self.accountant, rng=rng, out=out, secure=self.secure,
                           scratch=scratch, progress=progress)

    def expected_error(self) -> float:
        """Exact expected squared error of the BLUE answer to one query of this publisher's query
        distribution at the budgets of the last release (Laplace variances ``2 / eps_x^2``,
        :func:`~sparsedp.trees.gls.gls_error`); needs ``consistency=True``."""
        if self.release_ is None:
            raise SparseDPError(f"{self.name}: call fit() first")
        if not self.consistency:
            raise SparseDPError("expected_error is the error of the consistent (BLUE) answers")
        return gls_error(self.tree_, self.eps_per_node_, self.queries, self.weights, self.whole_domain)


class Boost(_TreeMethod):
    """Boost (Hay, Rastogi, Miklau, Suciu, VLDB 2010): balanced ``k``-ary tree, ``eps / levels`` per
    node (no path exceeds ``eps``), BLUE under consistency."""

    name = "boost"

    def __init__(self, epsilon: float, k: int = 2, accountant: Accountant | None = None, *,
                 secure: bool = True) -> None:
        super().__init__(epsilon, accountant, secure=secure)
        self.k = k

    def _tree(self, n: int) -> IntervalTree:
        return kary_layout(n, self.k)

    def _budgets(self, tree: IntervalTree) -> np.ndarray:
        return uniform_budget(tree, self.epsilon)


class BoostUN(Boost):
    """Boost with level-wise budgets (the seed's Boost-UN): one budget per depth,
    ``eps_d ~ P_d^(1/3)`` for the uniform coverage ``P_d`` of depth ``d``, then BLUE."""

    name = "boost-un"

    def _budgets(self, tree: IntervalTree) -> np.ndarray:
        return level_budget(tree, self.epsilon, coverage_probabilities(tree))


class Privelet(TreePublisher):
    """Privelet (Xiao, Wang, Gehrke, ICDE 2010): Haar wavelet coefficients with
    ``Lap(Delta_1 / eps)``, ``Delta_1`` the max column L1 norm of the Haar strategy
    (``log2 n + 1`` for powers of two), inverted exactly (``sparsedp.strategies.haar``).

    Measured through a :class:`~sparsedp.mechanism.MatrixMechanism` (the one measurement path,
    calibrated from the matrix's entries) built for each release with this publisher's accountant and
    ``secure`` flag; it charges the accountant itself (once); no mechanism is kept that could release
    again for free.  With exact noise the Haar entries must be integers for the grid to be exact (``n``
    a power of two); otherwise the path bounds the rounding (each touched row can move one more grid
    unit), so the noise is larger.  The estimate is ``H^-1 y = H^T diag(1 / ||h_i||^2) y`` (the rows
    are orthogonal; for a square invertible strategy this is the GLS estimate whatever the variances)."""

    name = "privelet"

    def _prepare(self, x: np.ndarray) -> _Plan:
        mech = MatrixMechanism(wl.identity(x.size), st.haar(x.size), epsilon=self.epsilon, accountant=self.accountant,
                               secure=self.secure)
        return _Plan(mechanism=mech)

    def _publish(self, x: np.ndarray, plan: _Plan, rng: Any) -> HistogramRelease:
        mech = plan.mechanism
        assert mech is not None
        meas = mech.measure(x, rng=rng)  # validates, then charges the accountant, then draws
        H = sp.csr_matrix(meas.strategy.tosparse())
        norms = np.asarray(H.multiply(H).sum(axis=1), dtype=np.float64).ravel()
        x_hat = np.asarray(H.T @ (meas.y / norms), dtype=np.float64)
        return HistogramRelease(self.name, self.epsilon, x_hat, noise_scales=np.asarray(meas.scales, dtype=np.float64),
                                strategy=H, private=meas.private, secure=meas.secure, noise_variances=meas.variances,
                                ledger=meas.entry)

    def _record(self, plan: _Plan, release: HistogramRelease) -> None:
        super()._record(plan, release)
        assert plan.mechanism is not None
        self.sensitivity_ = plan.mechanism.sensitivity


class Dwork(TreePublisher):
    """Dwork et al. (2006): ``x_i + Lap(1 / eps)`` on every bin (the identity, ``Delta_1 = 1``, ``b``
    rounded up), through the measurement path; exact discrete Laplace (integer output) by default."""

    name = "dwork"

    def _prepare(self, x: np.ndarray) -> _Plan:
        return _Plan(measurement=_calibrate(self.name, st.identity(x.size), self.epsilon, self.secure))

    def _publish(self, x: np.ndarray, plan: _Plan, rng: Any) -> HistogramRelease:
        assert plan.measurement is not None
        label = self._label(x)
        meas = plan.measurement.measure(x, accountant=self.accountant, rng=rng, label=label)
        return HistogramRelease(self.name, self.epsilon, meas.y, noise_scales=meas.scales,
                                strategy=sp.identity(x.size, format="csr"), private=meas.private,
                                secure=meas.secure, noise_variances=meas.variances, ledger=meas.entry)


PUBLISHERS = {"lue": LUEDPTree, "boost": Boost, "boost-un": BoostUN, "privelet": Privelet, "dwork": Dwork}


register_reader("histogram.load", load_release)  # load_release reads histogram files through these
register_reader("histogram.from_release", histogram_from_release)
