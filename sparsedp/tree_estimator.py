"""O(n) best linear unbiased estimate on a hierarchical (tree) strategy: the two-pass method.

Measurements ``y_u = x(I_u) + z_u`` for every tree node ``u`` (``x(I_u)`` the sum of the leaves below
``u``), independent noise of variance ``v_u``.  The generalised least-squares estimate (the BLUE)
is computed in two passes over the levels, generalising Hay, Rastogi, Miklau and Suciu (VLDB 2010)
from equal to per-node variances:

* upward: the best estimate of ``x(I_u)`` from the subtree of ``u`` combines ``u``'s own
  measurement with the sum of its children's subtree estimates, by inverse-variance weighting:
  ``z_u = (y_u / v_u + Z_u / V_u) / (1 / v_u + 1 / V_u)`` with ``Z_u = sum_c z_c``,
  ``V_u = sum_c var(z_c)`` and ``var(z_u) = 1 / (1 / v_u + 1 / V_u)`` (leaves: ``z = y``).
* downward: the root keeps ``xhat = z``; a parent's discrepancy ``xhat_u - Z_u`` is split among its
  children in proportion to ``var(z_c)``: ``xhat_c = z_c + var(z_c) / V_u (xhat_u - Z_u)``.

Each pass is one vectorised ``reduceat``/``repeat`` per level, so the cost is ``O(nodes)``; the
input may be a matrix (one column per right-hand side).
"""

from __future__ import annotations

import numpy as np

from .strategies import TreeLayout

__all__ = ["tree_gls"]


def tree_gls(layout: TreeLayout, y: np.ndarray, variances: np.ndarray) -> np.ndarray:
    """GLS leaf estimates from node measurements ``y`` (rows ordered root first, as the strategy).

    ``y`` has shape ``(nodes,)`` or ``(nodes, k)``; ``variances`` shape ``(nodes,)``, all > 0.
    Returns the ``n`` leaf estimates (shape ``(n,)`` or ``(n, k)``).
    """
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(variances, dtype=np.float64)
    extra = (slice(None),) + (None,) * (y.ndim - 1)

    def level(arr: np.ndarray, lev: int) -> np.ndarray:
        off = layout.row_offsets[lev]
        return arr[off : off + layout.sizes[lev]]

    z = [level(y, 0)]
    var_z = [level(v, 0)]
    child_sum: list[np.ndarray] = []
    child_var: list[np.ndarray] = []
    for lev in range(1, layout.levels):
        starts = layout.child_starts[lev - 1][:-1]
        Z = np.add.reduceat(z[-1], starts, axis=0)
        V = np.add.reduceat(var_z[-1], starts)
        own_w = 1.0 / level(v, lev)
        kid_w = 1.0 / V
        denom = own_w + kid_w
        z.append((level(y, lev) * own_w[extra] + Z * kid_w[extra]) / denom[extra])
        var_z.append(1.0 / denom)
        child_sum.append(Z)
        child_var.append(V)
    xhat = z[-1]
    for lev in range(layout.levels - 1, 0, -1):
        counts = np.diff(layout.child_starts[lev - 1])
        parent = np.repeat(np.arange(layout.sizes[lev]), counts)
        share = var_z[lev - 1] / child_var[lev - 1][parent]
        xhat = z[lev - 1] + share[extra] * (xhat - child_sum[lev - 1])[parent]
    return xhat
