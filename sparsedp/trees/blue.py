"""O(n) best linear unbiased estimate on an interval tree of any shape (seed 004, 3.4.3).

Conclusion 3.6: the BLUE of the node counts under the consistency constraints
``h_x = sum_{y in Son(x)} h_y`` is the weighted least-squares fit

    min_h  sum_x eps_x^2 (h~_x - h_x)^2   s.t.  C h = 0,

i.e. the weighted projection ``h~ + D^-1 C^T (C D^-1 C^T)^+ (0 - C h~)`` with ``D = diag(eps_x^2)``
(inverse noise variances, ``Var = 2 / eps_x^2``).  The seed computes it by its PA_BLUE and CRC
recursions (Algorithms 3.6-3.7, parameters ``alpha, beta, c, d``).  Here the same estimate is
computed by the two-pass inverse-variance method (Hay et al. 2010, generalised to per-node
variances ``v_x = 1 / eps_x^2`` and to leaves at different depths), one vectorised step per depth:

* upward (deepest level first): leaves ``z = h~``, ``var(z) = v``; an internal node with child
  sums ``Z = sum z_c`` and ``V = sum var(z_c)`` gets
  ``z = (h~ / v + Z / V) / (1 / v + 1 / V)``, ``var(z) = 1 / (1 / v + 1 / V)``;
* downward: ``h_root = z_root``; ``h_c = z_c + var(z_c) / V_parent * (h_parent - Z_parent)``.

``O(nodes)`` time and memory; the result is consistent (every parent equals the sum of its children).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import SparseDPError
from ..tree_estimator import two_pass
from ..validation import check_vector
from .build import as_interval_tree

__all__ = ["blue"]


def blue(tree: Any, noisy_counts: Any, eps_per_node: Any = None, *, variances: Any = None) -> np.ndarray:
    """The consistent BLUE of all node counts (breadth-first order) from noisy node counts.

    Give the noise of every node either as ``eps_per_node`` (``h~_x = h_x + Lap(1 / eps_x)``: weights
    ``eps_x^2``, every ``eps_x > 0``) or as ``variances`` (the actual per-node noise variances, all
    ``> 0``; e.g. ``Measurement.variances`` of an exact discrete-Laplace measurement, whose scales the
    measurement path may have rounded up).  Only the ratios of the variances matter."""
    t = as_interval_tree(tree)
    y = check_vector(noisy_counts, t.size, "noisy_counts")
    if (eps_per_node is None) == (variances is None):
        raise SparseDPError("give eps_per_node or variances (one of them)")
    if variances is not None:
        v = check_vector(variances, t.size, "variances")
        if np.any(v <= 0):
            raise SparseDPError("variances must be > 0 on every node")
        return two_pass(t.parent, t.level_start, y, v, plan=t.plan)
    e = check_vector(eps_per_node, t.size, "eps_per_node")
    if np.any(e <= 0):
        raise SparseDPError("eps_per_node must be > 0 on every node (an unmeasured node has no weight to give)")
    return two_pass(t.parent, t.level_start, y, 1.0 / (e * e), plan=t.plan)  # variances up to the common factor 2
