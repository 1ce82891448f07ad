"""Workload-driven strategy optimisation (issue 11): :func:`optimize` returns the strategy with the
lowest exact expected GLS error for a workload among weighted interval trees, HDMM's p-Identity
strategies and the fixed templates.

Modules, one idea each: :mod:`.calibrate` (unit budget, certified normalisation), :mod:`.gram`
(``W^T W`` without forming it), :mod:`.tree_spectral` (complete trees with per-level weights in
closed form), :mod:`.weighted_tree` (any tree, per-node weights, exact gradient),
:mod:`.params` (parametrisations that keep ``Delta = 1`` exactly), :mod:`.pidentity` (p-Identity
objective and gradient), :mod:`.templates`, :mod:`.tree_family`, :mod:`.pidentity_family`,
:mod:`.search` (L-BFGS-B stopped on progress or evaluation counts; a deadline only when asked), :mod:`.api`.
"""

from .api import FAMILIES, OptimizedStrategy, optimize, optimize_kron
from .candidate import Trial

__all__ = ["FAMILIES", "OptimizedStrategy", "Trial", "optimize", "optimize_kron"]
