"""A marginal workload: a set of marginals on a :class:`~sparsedp.marginals.Domain` (with a weight
per marginal and the loss to minimise), the object :func:`sparsedp.optimize` takes for marginals.

``MarginalWorkload(domain, marginals, weights, objective)``; :func:`marginal_workload` builds it
from names or indices, or from ``k`` (every marginal of order ``k``, or ``<= k`` with
``exact=False``).  Nothing here enumerates the domain: a workload is its list of attribute sets.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ShapeError, SparseDPError
from ..operators import SparseOperator
from .domain import Domain
from .select import _normalise, check_weights, marginals_up_to

__all__ = ["MarginalWorkload", "flattened_marginals", "marginal_workload"]


@dataclass(frozen=True)
class MarginalWorkload:
    """Marginals (sorted attribute-index tuples) on ``domain``, one weight ``>= 0`` each, and the
    objective: ``"sum"`` (weighted sum of all cells' variances / squared errors) or ``"max"``
    (largest weighted per-cell variance; Gaussian only)."""

    domain: Domain
    marginals: tuple[tuple[int, ...], ...]
    weights: np.ndarray
    objective: str = "sum"

    @functools.cached_property
    def cells(self) -> int:
        """Number of answers: the cells of all the marginal tables."""
        sizes = self.domain.sizes
        if len(self.marginals) >= 16 and sizes and max(sizes) > 1:
            # one order at a time in int64 when no product or sum can overflow (else the exact loop)
            lmax = math.log2(max(sizes))
            by: dict[int, list[tuple[int, ...]]] = {}
            for S in self.marginals:
                by.setdefault(len(S), []).append(S)
            if all(r * lmax + math.log2(len(ms)) < 62 for r, ms in by.items()):
                sz = np.array(sizes, dtype=np.int64)
                return sum(int(np.prod(sz[np.array(ms, dtype=np.int64).reshape(len(ms), r)], axis=1).sum()) if r
                           else len(ms) for r, ms in by.items())
        return int(sum(math.prod(sizes[i] for i in S) for S in self.marginals))

    @property
    def unit_weights(self) -> bool:
        return bool(np.all(self.weights == 1.0))


def marginal_workload(domain: Domain, marginals: Any = None, *, k: int | None = None, exact: bool = True,
                      weights: Any = None, objective: str = "sum") -> MarginalWorkload:
    """The workload of ``marginals`` (attribute sets: names or indices) on ``domain``, or, with
    ``k``, of every marginal of order ``k`` (``exact=False``: every order ``<= k``, the total
    included).  ``weights``: one ``>= 0`` per marginal (default 1).  Unknown attributes, repeated
    marginals and bad weights raise before anything is optimised."""
    if not isinstance(domain, Domain):
        raise ShapeError(f"domain must be a sparsedp.Domain, got {type(domain).__name__}")
    if (marginals is None) == (k is None):
        raise SparseDPError("give either marginals or k")
    if k is not None:
        if isinstance(k, bool) or int(k) != k or not 0 <= int(k) <= len(domain):
            raise ShapeError(f"k must be an integer in 0..{len(domain)}, got {k!r}")
        marginals = marginals_up_to(domain, int(k), exact=exact)
    ms = _normalise(domain, marginals)
    w = check_weights(weights, len(ms), objective)
    w.flags.writeable = False
    return MarginalWorkload(domain=domain, marginals=tuple(ms), weights=w, objective=objective)


def flattened_marginals(W: Any) -> MarginalWorkload | None:
    """The :class:`MarginalWorkload` that a flattened :func:`sparsedp.workloads.marginals` operator
    is (attributes ``a0``, ``a1``, ...; its marginals in the operator's row order), or ``None`` for
    any other workload -- and for one whose structure a marginal workload cannot hold (a marginal
    repeated) or whose shape does not match it."""
    meta = getattr(W, "meta", None)
    if not isinstance(W, SparseOperator) or not isinstance(meta, dict) or "marginals" not in meta:
        return None
    sizes, subsets = meta["marginals"]
    try:
        mw = marginal_workload(Domain([f"a{i}" for i in range(len(sizes))], list(sizes)), [list(S) for S in subsets])
    except SparseDPError:
        return None
    return mw if (mw.cells, int(np.prod(sizes))) == W.shape else None
