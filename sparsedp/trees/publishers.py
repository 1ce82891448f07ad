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

Privacy (issues 16 and 19).  :meth:`TreePublisher.fit` validates everything first -- the counts
(non-negative integers, each and every node count at most ``MAX_MAGNITUDE = 2^50``), the generator,
the tree (:meth:`IntervalTree.check`), the budgets and noise scales and the privacy loss of what
will be measured -- then charges the accountant, then draws; nothing after the charge can fail.
A tree method measures the node-interval rows ``M`` (row ``i`` is ``1`` on ``[lo_i, hi_i)``, the
counts ``node_counts`` computes exactly by integer prefix differences) with ``Lap(b_i)``,
``b_i = 1 / eps_i`` rounded up (so ``1 / b_i <= eps_i``).  Its loss ``max_j sum_i M_ij / b_i`` is
bounded by the certified path-sum bound ``max(path_sum_bounds(tree, eps))`` (exact for a validated
tree: the rows covering bin ``j`` are the nodes on its path), and the release is refused unless that
bound is ``<= epsilon`` -- no slack.  ``HistogramRelease.measured_matrix()`` and ``.noise_scales``
expose what was measured so that the loss can be audited by brute force.

Range answers from a consistent release are differences of prefix sums of the leaf estimates:
every canonical decomposition gives the same sum.  ``LUEDPTree(consistency=False)`` answers from the
raw noisy node counts by the vectorised canonical decomposition instead (the error of eq. 3.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from .. import strategies as st
from .. import workloads as wl
from ..calibration import laplace_scale
from ..errors import (
    InputBoundError,
    InvalidPrivacyParameterError,
    ShapeError,
    SparseDPError,
)
from ..mechanism import MatrixMechanism
from ..noise import as_generator, laplace
from ..privacy import Accountant, PrivacyCost
from ..strategies import _interval_rows
from ..validation import MAX_MAGNITUDE, check_counts, check_epsilon, check_vector
from .blue import blue
from .budget import allocate_budget, level_budget, path_sum_bounds, uniform_budget
from .build import IntervalTree, as_interval_tree, kary_layout
from .coverage import answer_ranges, check_ranges, coverage_probabilities
from .sc import sc_layout

__all__ = [
    "HistogramRelease",
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
    What was measured, for auditing: :meth:`measured_matrix` (one row per noisy measurement) and
    ``noise_scales`` (the Laplace scale ``b_i`` of every row); the privacy loss of the release is
    ``max_j sum_i |A_ij| / b_i``.  ``private`` is ``False`` when the noise came from a seed given for
    reproducibility (then the output is not a private release)."""

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
    _prefix: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prefix", np.concatenate(([0.0], np.cumsum(self.estimate))))

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

    def save(self, path: str | Path) -> None:
        """Write the release as ``.npz`` (only released, private quantities, and the ``private``
        flag)."""
        arrays: dict[str, Any] = {
            "method": np.array(self.method),
            "epsilon": np.array(self.epsilon),
            "estimate": self.estimate,
            "consistent": np.array(self.consistent),
            "private": np.array(bool(self.private)),
        }
        if self.noise_scales is not None:
            arrays["noise_scales"] = self.noise_scales
        if self.tree is not None:
            t = self.tree
            arrays.update(lo=t.lo, hi=t.hi, parent=t.parent, child_start=t.child_start, level_start=t.level_start,
                          node_values=self.node_values, eps_per_node=self.eps_per_node)
        np.savez_compressed(path, **arrays)


def load_release(path: str | Path) -> HistogramRelease:
    """Read a release written by :meth:`HistogramRelease.save` (its tree is validated again)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            data = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise SparseDPError(f"cannot read release {path}: {exc}") from exc
    if "estimate" not in data:
        raise SparseDPError(f"{path} is not a sparsedp histogram release")
    tree = None
    if "lo" in data:
        tree = IntervalTree(int(data["hi"][0]), data["lo"], data["hi"], data["parent"],
                            data["child_start"], data["level_start"])
    return HistogramRelease(
        method=str(data["method"]), epsilon=float(data["epsilon"]), estimate=data["estimate"], tree=tree,
        node_values=data.get("node_values"), eps_per_node=data.get("eps_per_node"), consistent=bool(data["consistent"]),
        noise_scales=data.get("noise_scales"), private=bool(data["private"]) if "private" in data else True,
    )


def node_counts(tree: IntervalTree, x: Any) -> np.ndarray:
    """True count of every node, ``sum_{j in [lo_i, hi_i)} x_j``: exact integer prefix differences,
    ``O(nodes)``.  These are the rows of :meth:`HistogramRelease.measured_matrix` applied to ``x``.

    ``x`` must be non-negative integer counts; the root count (the largest node count) must be at
    most ``MAX_MAGNITUDE = 2^50`` (:class:`InputBoundError` otherwise), so every count is an exact
    float and one record moves each count on its path by exactly 1."""
    t = as_interval_tree(tree)
    xv = check_counts(x, t.n, "histogram")
    if float(np.sum(xv)) > 2.0 * MAX_MAGNITUDE:  # float sum within 1e-9 relative: int64 is safe below
        raise InputBoundError(f"the histogram's total {float(np.sum(xv)):.6g} exceeds the supported bound 2^50")
    cs = np.concatenate(([0], np.cumsum(xv.astype(np.int64))))
    if int(cs[-1]) > MAX_MAGNITUDE:
        raise InputBoundError(
            f"the histogram's total {int(cs[-1])} (the root count) exceeds the supported bound 2^50: above it "
            "float rounding, not noise, decides the output"
        )
    return (cs[t.hi] - cs[t.lo]).astype(np.float64)


@dataclass(frozen=True)
class _Plan:
    """Everything a release needs, computed and checked before the budget is charged."""

    scales: np.ndarray  # Laplace scale of every measured row
    counts: np.ndarray | None = None  # exact measured values (tree methods)
    tree: IntervalTree | None = None
    eps_per_node: np.ndarray | None = None
    loss: float | None = None  # certified bound of the privacy loss of the measurement
    mechanism: MatrixMechanism | None = None


class TreePublisher:
    """Common interface.  Subclasses implement ``_prepare(x) -> _Plan`` (all checks, no noise)
    and ``_publish(x, plan, gen) -> HistogramRelease`` (draws; cannot fail)."""

    name = "publisher"
    #: whether the measurement charges the accountant itself (Privelet's MatrixMechanism)
    _charges_itself = False

    def __init__(self, epsilon: float, accountant: Accountant | None = None) -> None:
        self.epsilon = check_epsilon(epsilon, "epsilon")
        if accountant is not None and not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        self.accountant = accountant
        self.release_: HistogramRelease | None = None

    def fit(self, histogram: Any, rng: Any = None) -> "TreePublisher":
        """Publish ``histogram`` (non-negative integer counts, at most ``2^50`` in total for the tree
        methods).  ``rng``: ``None`` (OS entropy: a private release), or a seed / numpy Generator
        (reproducible: for tests).  Validate everything, then charge ``epsilon``, then draw."""
        x = check_counts(histogram, name="histogram")
        if x.size == 0:
            raise ShapeError("histogram is empty")
        gen = as_generator(rng)
        plan = self._prepare(x)
        if plan.loss is not None and not plan.loss <= self.epsilon:
            raise SparseDPError(f"{self.name}: the measurement would cost {plan.loss!r} > epsilon {self.epsilon!r}")
        if self.accountant is not None and not self._charges_itself:
            self.accountant.spend(PrivacyCost(epsilon=self.epsilon), label=self.name)
        release = self._publish(x, plan, gen)
        self._record(plan)
        self.release_ = release
        return self

    def _prepare(self, x: np.ndarray) -> _Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def _publish(self, x: np.ndarray, plan: _Plan, gen: np.random.Generator) -> HistogramRelease:  # pragma: no cover
        raise NotImplementedError

    def _record(self, plan: _Plan) -> None:
        """Keep what was measured (after a successful release)."""
        self.noise_scales_ = plan.scales

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


#: Smallest per-node budget a tree publisher measures with: its noise scale ``1e100`` keeps every
#: noisy count, BLUE variance ``1 / eps^2`` (and their sums) and estimate finite in float64.
MIN_NODE_BUDGET = 1e-100


def _node_scales(eps: np.ndarray, name: str) -> np.ndarray:
    """``b_i = 1 / eps_i`` rounded up (so ``1 / b_i <= eps_i`` exactly), refusing budgets that are
    not > 0 or below :data:`MIN_NODE_BUDGET` (whose noise and BLUE weights would not stay finite)."""
    if np.any(eps <= 0):
        raise SparseDPError(f"{name}: every node needs a budget > 0 (an unmeasured node has no weight)")
    if np.any(eps < MIN_NODE_BUDGET):
        raise InvalidPrivacyParameterError(
            f"{name}: node budget {float(eps.min()):.3g} below the supported minimum {MIN_NODE_BUDGET:g}"
        )
    return np.nextafter(1.0 / eps, np.inf)


class _TreeMethod(TreePublisher):
    """Noisy node counts ``h_x + Lap(b_x)``, ``b_x = 1 / eps_x``, on a tree, then the BLUE (or raw
    counts)."""

    consistency = True

    def _tree(self, n: int) -> IntervalTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def _budgets(self, tree: IntervalTree) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _prepare(self, x: np.ndarray) -> _Plan:
        n = x.size
        tree = self._tree(n)
        if not isinstance(tree, IntervalTree):
            raise SparseDPError(f"{self.name}: expected an IntervalTree, got {type(tree).__name__}")
        tree.check()  # the structure the loss formula below rests on, as the object is now
        if tree.n != n:
            raise ShapeError(f"the tree covers {tree.n} bins, the histogram has {n}")
        eps = check_vector(self._budgets(tree), tree.size, "node budgets")
        scales = _node_scales(eps, self.name)
        loss = float(path_sum_bounds(tree, eps).max())  # >= max_j sum_{i covers j} 1 / b_i, certified
        if not loss <= self.epsilon:
            raise SparseDPError(
                f"{self.name}: a root-to-leaf path of node budgets sums to {loss!r} (certified bound), more "
                f"than epsilon {self.epsilon!r}"
            )
        counts = node_counts(tree, x)
        return _Plan(scales=scales, counts=counts, tree=tree, eps_per_node=eps, loss=loss)

    def _publish(self, x: np.ndarray, plan: _Plan, gen: np.random.Generator) -> HistogramRelease:
        tree, eps = plan.tree, plan.eps_per_node
        assert tree is not None and eps is not None and plan.counts is not None
        noisy = plan.counts + laplace(plan.scales, rng=gen)
        values = blue(tree, noisy, eps) if self.consistency else noisy
        return HistogramRelease(self.name, self.epsilon, values[tree.leaves], tree, values, eps, self.consistency,
                                noise_scales=plan.scales)

    def _record(self, plan: _Plan) -> None:
        super()._record(plan)
        self.tree_, self.eps_per_node_, self.privacy_loss_ = plan.tree, plan.eps_per_node, plan.loss


class LUEDPTree(_TreeMethod):
    """LUE-DPTree (seed 004, Algorithm 3.8): any interval tree, per-node budgets minimising the
    expected range error (CNCP + CNP + NPBD), Laplace noise ``Lap(1 / eps_x)`` per node, and the
    O(n) BLUE under consistency (PA_BLUE + CRC).  Privacy: every root-to-leaf path sums to at most
    ``epsilon`` exactly (Conclusion 3.4, certified bound), checked before noise is drawn.

    ``tree``: ``"sc"`` (Struct-Construct, Algorithm 3.1; ``k=None`` chooses the branching in
    ``[2, upper]``), ``"kary"`` (balanced, ``k`` default 2), or a networkx graph / IntervalTree.
    ``queries`` / ``weights``: optimise for a given list of inclusive ranges instead of uniform
    ranges (nodes no listed query uses get the probability floor ``1e-9 * max p``, so every node is
    still measured).  ``eps_per_node``: your own budgets (one per node, breadth-first, all > 0)
    instead of the optimised ones; refused before any charge unless every root-to-leaf path sums to
    at most ``epsilon`` exactly.
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
        eps_per_node: Any = None,
        consistency: bool = True,
        accountant: Accountant | None = None,
    ) -> None:
        super().__init__(epsilon, accountant)
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

    def _budgets(self, tree: IntervalTree) -> np.ndarray:
        if self.budget is not None:
            if self.budget.size != tree.size:
                raise ShapeError(f"eps_per_node has {self.budget.size} entries for {tree.size} nodes")
            return self.budget
        p = coverage_probabilities(tree, self.queries, self.weights)
        if self.queries is not None:
            p = np.maximum(p, 1e-9 * p.max())
        self.probabilities_ = p
        return allocate_budget(tree, self.epsilon, p)


class Boost(_TreeMethod):
    """Boost (Hay, Rastogi, Miklau, Suciu, VLDB 2010): balanced ``k``-ary tree, ``eps / levels`` per
    node (no path exceeds ``eps``), BLUE under consistency."""

    name = "boost"

    def __init__(self, epsilon: float, k: int = 2, accountant: Accountant | None = None) -> None:
        super().__init__(epsilon, accountant)
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

    Measured through a :class:`~sparsedp.mechanism.MatrixMechanism` built for each release with this
    publisher's accountant: it calibrates from the matrix's entries and charges the accountant itself
    (once); no mechanism is kept that could release again for free."""

    name = "privelet"
    _charges_itself = True

    def _prepare(self, x: np.ndarray) -> _Plan:
        mech = MatrixMechanism(wl.identity(x.size), st.haar(x.size), epsilon=self.epsilon, accountant=self.accountant)
        return _Plan(scales=np.full(mech.M.shape[0], mech.noise_scale()), mechanism=mech)

    def _publish(self, x: np.ndarray, plan: _Plan, gen: np.random.Generator) -> HistogramRelease:
        assert plan.mechanism is not None
        rel = plan.mechanism.run(x, rng=gen)  # validates, then charges the accountant, then draws
        strategy = sp.csr_matrix(rel.measurement.strategy.tosparse())
        return HistogramRelease(self.name, self.epsilon, np.asarray(rel.x_hat, dtype=np.float64),
                                noise_scales=np.asarray(rel.measurement.scales, dtype=np.float64), strategy=strategy)

    def _record(self, plan: _Plan) -> None:
        super()._record(plan)
        assert plan.mechanism is not None
        self.sensitivity_ = plan.mechanism.sensitivity


class Dwork(TreePublisher):
    """Dwork et al. (2006): ``x_i + Lap(1 / eps)`` on every bin (sensitivity 1, ``b`` rounded up)."""

    name = "dwork"

    def _prepare(self, x: np.ndarray) -> _Plan:
        b = laplace_scale(1.0, self.epsilon)  # rounded up: 1 / b <= epsilon exactly
        return _Plan(scales=np.full(x.size, b))

    def _publish(self, x: np.ndarray, plan: _Plan, gen: np.random.Generator) -> HistogramRelease:
        return HistogramRelease(self.name, self.epsilon, x + laplace(plan.scales, rng=gen), noise_scales=plan.scales,
                                strategy=sp.identity(x.size, format="csr"))


PUBLISHERS = {"lue": LUEDPTree, "boost": Boost, "boost-un": BoostUN, "privelet": Privelet, "dwork": Dwork}
