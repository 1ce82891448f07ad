"""``MatrixMechanism`` with a hierarchical strategy on partitioned data (issue 14).

``MatrixMechanism(W, hierarchical(n, k), epsilon).run(data, executor=..., out=...)`` measures the
strategy's rows -- the node intervals of the balanced ``k``-ary tree of
:class:`~sparsedp.strategies.TreeLayout` -- chunk by chunk through
:func:`~sparsedp.scaleout.release_hierarchical` and returns the GLS estimate, which for this
strategy is the O(n) two-pass BLUE (the in-process mechanism's ``reconstruct`` solves the same
system).  What is kept from :class:`~sparsedp.mechanism.Release`: ``x_hat`` (or the ``out`` file),
``answers = W x_hat`` when the estimate is in memory (:meth:`ScaleoutMatrixRelease.workload_answers`
otherwise), ``private``, one ledger entry charged once to the mechanism's accountant.  What differs:

* the strategy is recognised from its intervals (never from its name or tag): an
  :class:`~sparsedp.intervals.IntervalRows` of unit weights whose rows are exactly
  ``hierarchical(n, k)``'s for the ``k`` its first column's widths give (:func:`hierarchical_branching`);
  anything else is refused, as are Gaussian noise, a grid other than 1 and ``method`` other than ``"ls"``;
* the noise scale is the tree publishers' per-level rule, ``b = (1 + m) L / epsilon`` rounded up
  (``m < 1e-9``), not the mechanism's ``b = L / epsilon``: the certificate is added over the top
  plan and a chunk plan, each rounded up, and needs the margin; the noise law differs by a relative
  scale below ``1e-9``;
* there is no in-memory :class:`~sparsedp.measure.Measurement` (the noisy rows live in scratch
  files between the passes and are deleted); ``scaleout`` holds the
  :class:`~sparsedp.scaleout.ScaleoutRelease` (per-level scales and variances, certified loss,
  timings); per-answer variances (``Release.variances``) are not offered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..intervals import IntervalRows
from ..privacy import LedgerEntry
from ..releases import ReleaseMethods, ReleaseResult, workload_labels
from .release import ScaleoutRelease, release_hierarchical

__all__ = ["ScaleoutMatrixRelease", "hierarchical_branching", "is_partitioned", "run_scaleout"]


def is_partitioned(x: Any) -> bool:
    """Whether ``x`` is partitioned data for the scale-out path: a path (``.npy`` / ``.zarr``) or a dask array."""
    from pathlib import Path

    return isinstance(x, (str, Path)) or (hasattr(x, "dask") and hasattr(x, "chunks"))


def hierarchical_branching(M: Any) -> int | None:
    """``k`` when ``M`` is exactly the strategy ``hierarchical(n, k)`` (unit-weight interval rows, root
    first, the nodes of ``TreeLayout.balanced(n, k)`` level by level), else ``None``.  ``k`` is read
    from the rows starting at bin 0 (one per level: widths ``n, ..., k, 1``) and every interval is
    then compared with the balanced layout's."""
    from ..strategies import TreeLayout

    if type(M) is not IntervalRows or not np.all(M.weights == 1.0):
        return None
    n = int(M.shape[1])
    lo, hi = np.asarray(M.lo), np.asarray(M.hi)
    first = hi[lo == 0]
    if n < 2 or first.size < 2 or first[0] != n or first[-1] != 1:
        return None
    k = int(first[-2])
    if k < 2:
        return None
    layout = TreeLayout.balanced(n, k)
    if layout.nodes != lo.size:
        return None
    L, H = layout.intervals()
    return k if np.array_equal(L, lo) and np.array_equal(H, hi) else None


@dataclass(frozen=True)
class ScaleoutMatrixRelease(ReleaseMethods):
    """A :class:`~sparsedp.mechanism.MatrixMechanism` release computed chunk by chunk (see the module
    docstring for what differs from :class:`~sparsedp.mechanism.Release`)."""

    answers: np.ndarray | None
    x_hat: np.ndarray | None
    scaleout: ScaleoutRelease
    workload: Any = field(default=None, repr=False, compare=False)

    @property
    def private(self) -> bool:
        return self.scaleout.private

    @property
    def ledger(self) -> LedgerEntry:
        return self.scaleout.ledger

    @property
    def out(self) -> str | None:
        return self.scaleout.out

    def load(self) -> np.ndarray:
        """``x_hat``, or the written output (memory-mapped ``.npy`` / Zarr)."""
        return self.x_hat if self.x_hat is not None else self.scaleout.load()

    def workload_answers(self) -> np.ndarray:
        """``W x_hat`` (reads the whole estimate: for workloads whose answers fit in memory)."""
        if self.answers is not None:
            return self.answers
        return np.asarray(self.workload.matvec(np.asarray(self.load(), dtype=np.float64)))

    def to_release(self, *, description: dict | None = None) -> ReleaseResult:
        """This release as a :class:`~sparsedp.releases.ReleaseResult`: the workload answers
        (:meth:`workload_answers`, labelled by :func:`~sparsedp.releases.workload_labels`) with
        their exact variances -- the GLS of ``hierarchical(n, k)`` at the per-level noise variances
        the chunks drew (:func:`sparsedp.accuracy.expected_error`), ``None`` where they cannot be
        listed -- ``x_hat`` when in memory, the one ledger entry."""
        r = self.scaleout
        answers = self.workload_answers()
        desc = {"strategy": f"hierarchical({r.n}, k={r.k})", "noise": "laplace", "secure": r.secure,
                "epsilon": r.epsilon, "chunks": r.chunks, "chunk": r.chunk, "executor": r.executor}
        if r.out is not None:
            desc["estimate"] = str(r.out)
        desc.update(description or {})
        rep, var, how = None, None, None
        try:
            rep = _workload_report(self.workload, r)
            var, how = rep.variances, rep.method
            if var is None:
                rep, how = None, "unavailable: too many answers to list their variances"
        except SparseDPError as exc:
            how = f"unavailable: {exc}"
        arrays = {"answers": answers} if self.x_hat is None else {"answers": answers, "x_hat": self.x_hat}
        return ReleaseResult(
            kind="matrix-mechanism", answers=answers, labels=workload_labels(self.workload) if self.workload is not None
            else {}, variances=var, noise="laplace", secure=bool(r.secure),
            strategy=f"hierarchical({r.n}, k={r.k}), GLS, chunk by chunk ({r.chunks} chunks)", ledger=[r.ledger],
            private=bool(r.private), description=desc, arrays=arrays, variance_method=how, report=rep, source=self)


def _workload_report(W: Any, r: ScaleoutRelease) -> Any:
    """The :class:`~sparsedp.accuracy.ErrorReport` of ``W`` on the GLS of ``hierarchical(n, k)``
    with the per-level noise variances of the chunked release ``r`` (its tree is that strategy's)."""
    from ..accuracy import expected_error
    from ..strategies import TreeLayout, hierarchical
    from .subtree import MIN_VARIANCE
    from .tree import row_levels

    if W is None:
        raise SparseDPError("this release does not know its workload")
    M = hierarchical(r.n, r.k)
    levels = row_levels(TreeLayout.balanced(r.n, r.k))
    if levels.size != M.shape[0] or r.level_variances.size != int(levels.max()) + 1:
        raise SparseDPError("the chunked tree is not hierarchical(n, k)'s")
    v = np.maximum(r.level_variances[levels], MIN_VARIANCE)
    return expected_error(W, M, v, noise="laplace", secure=bool(r.secure))


def run_scaleout(mech: Any, data: Any, *, rng: Any = None, method: str = "ls", counts: bool = True,
                 executor: Any = None, chunk: int | None = None, out: Any = None, scratch: Any = None,
                 progress: bool | None = None) -> ScaleoutMatrixRelease:
    """``mech.run`` on partitioned data (:meth:`MatrixMechanism.run` with ``executor`` / ``out`` or a
    path / dask array).  Everything is checked before the budget is charged (once, to
    ``mech.accountant``)."""
    k = hierarchical_branching(mech.M)
    if k is None:
        raise SparseDPError(f"scale-out releases need the strategy hierarchical(n, k) (unit interval rows of the balanced "
                            f"k-ary tree); {mech.M.name!r} is not")
    if mech.noise != "laplace":
        raise SparseDPError("scale-out releases use Laplace noise (epsilon-DP); this mechanism uses Gaussian noise")
    if mech.grid != 1.0:
        raise SparseDPError(f"scale-out releases measure on the integer grid; this mechanism's grid is {mech.grid!r}")
    if method != "ls":
        raise SparseDPError(f"scale-out releases reconstruct by least squares (the two-pass GLS); got method={method!r}")
    if not counts:
        raise SparseDPError("scale-out releases publish non-negative integer counts (counts=True)")
    r = release_hierarchical(data, mech.epsilon, k=k, chunk=chunk, executor=executor, accountant=mech.accountant,
                             rng=rng, out=out, secure=mech.secure, scratch=scratch, progress=progress)
    x_hat = r.estimate
    answers = None if x_hat is None else np.asarray(mech.W.matvec(x_hat))
    return ScaleoutMatrixRelease(answers, x_hat, r, workload=mech.W)
