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

Range answers from a consistent release are differences of prefix sums of the leaf estimates:
every canonical decomposition gives the same sum.  ``LUEDPTree(consistency=False)`` answers from the
raw noisy node counts by the vectorised canonical decomposition instead (the error of eq. 3.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import strategies as st
from .. import workloads as wl
from ..errors import ShapeError, SparseDPError
from ..mechanism import MatrixMechanism
from ..noise import laplace
from ..privacy import Accountant, PrivacyCost
from ..validation import check_counts, check_positive
from .blue import blue
from .budget import allocate_budget, level_budget, path_sums, uniform_budget
from .build import IntervalTree, as_interval_tree, kary_layout
from .coverage import answer_ranges, check_ranges, coverage_probabilities
from .sc import sc_layout

__all__ = ["HistogramRelease", "load_release", "TreePublisher", "LUEDPTree", "Boost", "BoostUN", "Privelet", "Dwork"]


@dataclass(frozen=True)
class HistogramRelease:
    """A published histogram: the leaf estimates and, for tree methods, the tree and node values.

    ``node_values`` are used for range answers only when the release is not consistent."""

    method: str
    epsilon: float
    estimate: np.ndarray
    tree: IntervalTree | None = None
    node_values: np.ndarray | None = None
    eps_per_node: np.ndarray | None = None
    consistent: bool = True
    _prefix: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_prefix", np.concatenate(([0.0], np.cumsum(self.estimate))))

    @property
    def n(self) -> int:
        return int(self.estimate.size)

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
        """Write the release as ``.npz`` (only released, private quantities)."""
        arrays: dict[str, Any] = {
            "method": np.array(self.method),
            "epsilon": np.array(self.epsilon),
            "estimate": self.estimate,
            "consistent": np.array(self.consistent),
        }
        if self.tree is not None:
            t = self.tree
            arrays.update(lo=t.lo, hi=t.hi, parent=t.parent, child_start=t.child_start, level_start=t.level_start,
                          node_values=self.node_values, eps_per_node=self.eps_per_node)
        np.savez_compressed(path, **arrays)


def load_release(path: str | Path) -> HistogramRelease:
    """Read a release written by :meth:`HistogramRelease.save`."""
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
    )


class TreePublisher:
    """Common interface.  Subclasses implement ``_publish(x, rng) -> HistogramRelease``."""

    name = "publisher"

    def __init__(self, epsilon: float, accountant: Accountant | None = None) -> None:
        self.epsilon = check_positive(epsilon, "epsilon")
        self.accountant = accountant
        self.release_: HistogramRelease | None = None

    def fit(self, histogram: Any, rng: Any = None) -> "TreePublisher":
        """Publish ``histogram`` (non-negative integer counts).  Input is checked and the budget is
        charged before any noise is drawn."""
        x = check_counts(histogram, name="histogram")
        if x.size == 0:
            raise ShapeError("histogram is empty")
        self._prepare(x.size)
        if self.accountant is not None:
            self.accountant.spend(PrivacyCost(epsilon=self.epsilon), label=self.name)
        self.release_ = self._publish(x, rng)
        return self

    def _prepare(self, n: int) -> None:
        """Build and validate everything that does not touch the data (before any noise)."""

    def _publish(self, x: np.ndarray, rng: Any) -> HistogramRelease:  # pragma: no cover - abstract
        raise NotImplementedError

    def _release(self) -> HistogramRelease:
        if self.release_ is None:
            raise SparseDPError(f"{self.name}: call fit() first")
        return self.release_

    def histogram(self) -> np.ndarray:
        """The published bin estimates."""
        return self._release().estimate.copy()

    def ranges(self, pairs: Any) -> np.ndarray:
        """Answers to the inclusive 0-based ranges in ``pairs`` (shape ``(m, 2)``), vectorised."""
        return self._release().ranges(pairs)

    def range(self, lo: int, hi: int) -> float:
        """Answer to the inclusive 0-based range ``[lo, hi]``."""
        return self._release().range(lo, hi)


def node_counts(tree: IntervalTree, x: np.ndarray) -> np.ndarray:
    """True count of every node: prefix-sum differences, ``O(nodes)``."""
    cs = np.concatenate(([0.0], np.cumsum(x)))
    return cs[tree.hi] - cs[tree.lo]


class _TreeMethod(TreePublisher):
    """Noisy node counts ``h_x + Lap(1 / eps_x)`` on a tree, then the BLUE (or raw counts)."""

    consistency = True

    def _tree(self, n: int) -> IntervalTree:  # pragma: no cover - abstract
        raise NotImplementedError

    def _budgets(self, tree: IntervalTree) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _prepare(self, n: int) -> None:
        tree = self._tree(n)
        if tree.n != n:
            raise ShapeError(f"the tree covers {tree.n} bins, the histogram has {n}")
        eps = self._budgets(tree)
        worst = float(path_sums(tree, eps).max())
        if worst > self.epsilon * (1 + 1e-9) or np.any(eps <= 0):
            raise SparseDPError(f"{self.name}: budgets spend {worst} > epsilon {self.epsilon}")
        self.tree_, self.eps_per_node_ = tree, eps

    def _publish(self, x: np.ndarray, rng: Any) -> HistogramRelease:
        tree, eps = self.tree_, self.eps_per_node_
        noisy = node_counts(tree, x) + laplace(1.0 / eps, rng=rng)
        values = blue(tree, noisy, eps) if self.consistency else noisy
        return HistogramRelease(self.name, self.epsilon, values[tree.leaves], tree, values, eps, self.consistency)


class LUEDPTree(_TreeMethod):
    """LUE-DPTree (seed 004, Algorithm 3.8): any interval tree, per-node budgets minimising the
    expected range error (CNCP + CNP + NPBD), Laplace noise ``Lap(1 / eps_x)`` per node, and the
    O(n) BLUE under consistency (PA_BLUE + CRC).  Privacy: every root-to-leaf path sums to
    ``epsilon`` (Conclusion 3.4), checked before noise is drawn.

    ``tree``: ``"sc"`` (Struct-Construct, Algorithm 3.1; ``k=None`` chooses the branching in
    ``[2, upper]``), ``"kary"`` (balanced, ``k`` default 2), or a networkx graph / IntervalTree.
    ``queries`` / ``weights``: optimise for a given list of inclusive ranges instead of uniform
    ranges (nodes no listed query uses get the probability floor ``1e-9 * max p``, so every node is
    still measured).
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
        consistency: bool = True,
        accountant: Accountant | None = None,
    ) -> None:
        super().__init__(epsilon, accountant)
        if isinstance(tree, str) and tree not in ("sc", "kary"):
            raise SparseDPError(f"tree must be 'sc', 'kary' or a graph, got {tree!r}")
        self.tree_spec = tree if isinstance(tree, str) else as_interval_tree(tree)
        self.k, self.upper = k, upper
        self.queries, self.weights = queries, weights
        self.consistency = bool(consistency)

    def _tree(self, n: int) -> IntervalTree:
        if self.tree_spec == "sc":
            return sc_layout(n, self.k, self.upper)
        if self.tree_spec == "kary":
            return kary_layout(n, 2 if self.k is None else self.k)
        return self.tree_spec  # type: ignore[return-value]

    def _budgets(self, tree: IntervalTree) -> np.ndarray:
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
    (``log2 n + 1`` for powers of two), inverted exactly (``sparsedp.strategies.haar``)."""

    name = "privelet"

    def _prepare(self, n: int) -> None:
        self.mechanism_ = MatrixMechanism(wl.identity(n), st.haar(n), epsilon=self.epsilon)

    def _publish(self, x: np.ndarray, rng: Any) -> HistogramRelease:
        rel = self.mechanism_.run(x, rng=rng)
        return HistogramRelease(self.name, self.epsilon, np.asarray(rel.x_hat, dtype=np.float64))


class Dwork(TreePublisher):
    """Dwork et al. (2006): ``x_i + Lap(1 / eps)`` on every bin (sensitivity 1)."""

    name = "dwork"

    def _publish(self, x: np.ndarray, rng: Any) -> HistogramRelease:
        return HistogramRelease(self.name, self.epsilon, x + laplace(1.0 / self.epsilon, size=x.size, rng=rng))


PUBLISHERS = {"lue": LUEDPTree, "boost": Boost, "boost-un": BoostUN, "privelet": Privelet, "dwork": Dwork}
