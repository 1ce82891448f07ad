"""The top of the tree, on the driver: measure the nodes above the chunk roots and solve them.

The top tree (``ChunkedTree.top``) has the ``m`` chunk roots as its leaves.  Its inner nodes are
measured from the chunks' exact totals ``t_q`` (a node above the chunk roots counts the records of
the chunks below it): ``IntervalRows(m, lo, hi)`` over ``t`` with the top levels' scales, through
the one measurement path.  One record changes one ``t_q`` by one, so this plan's certified loss is
its coverage over the chunk columns; a leaf's total loss is that plus its chunk's subtree coverage
(:func:`certify`).

The solve is :func:`sparsedp.tree_estimator.two_pass` on the top tree whose leaves are the chunk
summaries (``z_root`` with variance ``var(z_root)``, see :mod:`sparsedp.scaleout.passes`): it returns
the final estimate of every top node, the chunk roots last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..intervals import IntervalRows
from ..measure import MeasurementPlan, plan_measurement
from ..tree_estimator import two_pass, two_pass_plan
from .tree import ChunkedTree, row_levels

__all__ = ["TopPlan", "top_plan", "solve_top"]


@dataclass(frozen=True)
class TopPlan:
    """The measurement plan of the top tree's inner nodes (``None`` when one chunk is the whole tree)."""

    plan: MeasurementPlan | None
    inner: int  # rows of the top tree above the chunk roots

    @property
    def loss(self) -> float:
        return 0.0 if self.plan is None else float(self.plan.loss)


def top_plan(tree: ChunkedTree, level_scales: np.ndarray, secure: bool) -> TopPlan:
    """Plan the top inner nodes' measurement with the scales of the top ``tree.top_levels`` levels
    (``level_scales``: all levels, root first)."""
    top = tree.top
    inner = top.nodes - top.sizes[0]
    if inner == 0:
        return TopPlan(None, 0)
    lo, hi = top.intervals()
    scales = np.asarray(level_scales, dtype=np.float64)[row_levels(top)[:inner]]
    rows = IntervalRows(tree.chunks, lo[:inner], hi[:inner], name=f"top({tree.chunks} chunk roots, k={tree.k})")
    return TopPlan(plan_measurement(rows, scales=scales, noise="laplace", secure=secure), inner)


def solve_top(tree: ChunkedTree, y_top: np.ndarray, v_top: np.ndarray, z: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Final estimates of all top nodes (strategy row order, root first; the last ``m`` are the chunk
    roots) from the inner measurements ``y_top`` / ``v_top`` and the chunk summaries ``z`` / ``var``."""
    if tree.chunks == 1:
        return np.asarray(z, dtype=np.float64).copy()
    parent, level_start = tree.top.bfs()
    y = np.concatenate([y_top, z])
    v = np.concatenate([v_top, var])
    return two_pass(parent, level_start, y, v, plan=two_pass_plan(parent, level_start))
