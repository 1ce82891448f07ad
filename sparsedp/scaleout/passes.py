"""The two passes of the O(n) tree BLUE split at a subtree root (Hay et al. 2010, per-node variances).

:func:`sparsedp.tree_estimator.two_pass` runs both passes over one tree.  A scale-out release
runs them in three parts, with the same arithmetic per node:

* :func:`upward` on each chunk subtree: ``z_u = (y_u / v_u + Z_u / V_u) / (1 / v_u + 1 / V_u)``
  with ``Z_u = sum_c z_c``, ``V_u = sum_c var(z_c)``, ``var(z_u) = 1 / (1 / v_u + 1 / V_u)``
  (leaves: ``z = y``).  Only the root's ``(z_root, var(z_root))`` leaves the chunk: for the tree
  above, a chunk subtree is one leaf measured as ``z_root`` with variance ``var(z_root)`` (the
  upward pass never looks inside a child's subtree again).
* the top tree's full two-pass on the driver, its leaves being the chunk summaries: it gives every
  chunk root its final estimate ``xhat_root``;
* :func:`downward` on each chunk subtree, the root pinned to ``xhat_root``:
  ``xhat_c = z_c + var(z_c) / V_u (xhat_u - Z_u)``.

Because a node's update reads only its own subtree (upward) or its parent (downward), the result is
the whole-tree :func:`two_pass` (``tests/test_scaleout.py`` compares them to ``1e-9``).

:func:`final_variances` gives the exact variance of every node's final estimate the same way (no
data: only the variances).  A node ``c`` splits the measurements into its subtree and the rest,
which are independent; the rest estimates ``x_c`` with the *outside variance* ``s_c`` (the parent's
outside estimate combined with its own measurement, minus the siblings' upward estimates):
``s_c = 1 / (1 / s_u + 1 / v_u) + V_u - var(z_c)`` (``s_root = inf``), and the final estimate is the
inverse-variance combination of ``z_c`` and that outside estimate:
``Var(xhat_c) = 1 / (1 / var(z_c) + 1 / s_c)``.  Split at the chunk roots as the two passes are: the
top tree gives every chunk root its ``s``, each chunk continues from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..tree_estimator import LevelPlan

__all__ = ["UpwardState", "upward", "downward", "final_variances"]


@dataclass(frozen=True)
class UpwardState:
    """The upward pass of one subtree: ``z`` (upward estimates), ``var`` (their variances) for every
    node, ``Z`` / ``V`` (children's sums) for the inner nodes; row order = breadth-first, root first."""

    z: np.ndarray
    var: np.ndarray
    Z: np.ndarray
    V: np.ndarray

    @property
    def root(self) -> tuple[float, float]:
        """``(z_root, var(z_root))``: the subtree seen from above."""
        return float(self.z[0]), float(self.var[0])


def upward(plans: tuple[LevelPlan, ...], level_start: np.ndarray, y: np.ndarray, v: np.ndarray,
           overwrite: bool = False) -> UpwardState:
    """The upward pass of :func:`~sparsedp.tree_estimator.two_pass` (same operations in the same order).

    ``y``, ``v``: measurements and variances (``> 0``) of every node, breadth-first; ``plans`` from
    :func:`~sparsedp.tree_estimator.two_pass_plan`.  ``overwrite``: reuse ``y`` as ``z``."""
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    z = y if overwrite and y.flags.writeable else y.copy()
    var = v.copy()
    inner = int(level_start[-2]) if len(level_start) > 1 else 0
    Z = np.empty(inner)
    V = np.empty(inner)
    for lp in plans:  # deepest parents first
        idx = lp.parents
        Zi = lp.sum(z[lp.lo : lp.hi])
        Vi = lp.sum(var[lp.lo : lp.hi])
        vi = v[idx]
        vari = 1.0 / (1.0 / vi + 1.0 / Vi)
        own = vari / vi
        Z[idx], V[idx], var[idx] = Zi, Vi, vari
        z[idx] = z[idx] * own + Zi * (1.0 - own)  # z[idx] is still y[idx]: parents are updated once
    return UpwardState(z, var, Z, V)


def downward(plans: tuple[LevelPlan, ...], state: UpwardState, root_value: float | None = None) -> np.ndarray:
    """The downward pass, in place on ``state.z``: the root keeps ``root_value`` (its final estimate
    from the tree above; ``None``: its own ``z``, a stand-alone tree).  Returns the final estimate of
    every node (``state.z``)."""
    z = state.z
    if root_value is not None:
        z[0] = float(root_value)
    for lp in reversed(plans):
        idx = lp.parents
        sl = slice(lp.lo, lp.hi)
        lp.add_spread(z[sl], state.var[sl] / lp.spread(state.V[idx]), z[idx] - state.Z[idx])
    return z


def final_variances(plans: tuple[LevelPlan, ...], state: UpwardState, v: np.ndarray, outside: float = np.inf
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(Var(xhat), s)`` of every node of a subtree (breadth-first): the exact variance of its final
    (BLUE) estimate and its outside variance (see the module docstring).  ``state``: the subtree's
    :func:`upward` pass (its ``var`` and ``V``); ``v``: the nodes' measurement variances (the BLUE
    weights); ``outside``: the root's outside variance (``inf`` for a whole tree; a chunk root's
    from the top tree).  No data is read: post-processing of public variances only."""
    v = np.asarray(v, dtype=np.float64)
    var = state.var
    s = np.empty_like(var)
    s[0] = float(outside)
    with np.errstate(divide="ignore"):
        for lp in reversed(plans):  # the root's children first
            idx = lp.parents
            w = 1.0 / (1.0 / s[idx] + 1.0 / v[idx])  # the parent's outside estimate with its own measurement
            s[lp.lo : lp.hi] = lp.spread(w + state.V[idx]) - var[lp.lo : lp.hi]
        return 1.0 / (1.0 / var + 1.0 / s), s
