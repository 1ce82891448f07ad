"""The noise model of the optimiser: unit budget, sensitivity norm, integer strategies.

Every family optimises the error *per unit budget*: ``epsilon = 1`` for Laplace noise (pure DP,
``Delta_1``, the largest column L1 norm) and ``rho = 1`` for Gaussian noise (zCDP, ``Delta_2``, the
largest column L2 norm).  A strategy with ``Delta = 1`` has homoscedastic noise of variance

* Laplace: ``Var = 2 b^2`` with ``b = Delta_1 / epsilon = 1``, i.e. ``2``;
* Gaussian: ``Var = sigma^2`` with ``sigma = Delta_2 / sqrt(2 rho) = 1 / sqrt(2)``, i.e. ``1/2``;

and the expected total squared error of the GLS workload answers is ``Var * tr((M^T M)^+ W^T W)``.
At another budget the error scales as ``1 / epsilon^2`` (Laplace) or ``1 / rho`` (Gaussian).  It
does not depend on the scale of ``M``: :class:`~sparsedp.mechanism.MatrixMechanism` calibrates the
noise from the entries it measures (:func:`sparsedp.measure.plan_measurement`), and
:func:`unit_variance` takes the variance from that same calibration.

**Integer strategies.**  The mechanism's default exact noise (``secure=True``) measures ``M x`` on a
grid; for a matrix whose entries are not integer multiples of the grid, rounding can move every
touched row by one more unit and the sensitivity is inflated accordingly (by up to twice the
number of non-zeros per column with grid 1).  The optimised strategies are therefore returned as
*integer* matrices scaled to ``Delta = 2^k`` (:data:`INTEGER_BITS`): a strategy with ``Delta = 1``
times ``2^k``, each entry rounded down (so the sensitivity stays at most ``2^k``; the entries
that round to 0 and must stay are kept at 1, within the same bound).  Then ``M x`` is an integer
for integer data, the exact mechanism needs no rounding, the float sums of the sensitivity are
exact, and the error reported is that of the integer matrix itself.  The rounding costs at most
``levels / 2^k`` of the budget (``~ 1e-5``).  ``k`` is smaller for Gaussian noise, whose exact
sampler's variance is summed over ``~ 40 sigma`` points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..errors import SparseDPError
from ..measure import plan_measurement
from ..operators import Operator
from ..strategies import TreeLayout

__all__ = [
    "INTEGER_BITS",
    "NoiseModel",
    "integer_pidentity",
    "integer_weights",
    "layout_path_sums",
    "noise_model",
    "unit_variance",
]

#: ``Delta`` of the integer strategies is ``2^k``: ``k = 20`` (Laplace), ``16`` (Gaussian).
INTEGER_BITS = {"laplace": 20, "gaussian": 16}


@dataclass(frozen=True)
class NoiseModel:
    """``kind`` (``"laplace"`` / ``"gaussian"``), the sensitivity norm ``p``, the noise variance
    ``sigma2`` of a strategy with ``Delta_p = 1`` at unit budget, and ``bits`` of the integer scale."""

    kind: str
    p: int
    sigma2: float
    bits: int

    @property
    def scale(self) -> int:
        """``Delta`` of the integer strategies, ``2^bits``."""
        return 1 << self.bits


def noise_model(kind: str) -> NoiseModel:
    """The :class:`NoiseModel` of ``"laplace"`` (``p = 1``, ``Var = 2``) or ``"gaussian"``
    (``p = 2``, ``Var = 1/2``)."""
    if kind == "laplace":
        return NoiseModel("laplace", 1, 2.0, INTEGER_BITS["laplace"])
    if kind == "gaussian":
        return NoiseModel("gaussian", 2, 0.5, INTEGER_BITS["gaussian"])
    raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {kind!r}")


def unit_variance(strategy: Operator, model: NoiseModel) -> float:
    """The per-row noise variance of ``strategy`` at ``epsilon = 1`` (Laplace) or ``rho = 1``
    (Gaussian), taken from :func:`sparsedp.measure.plan_measurement` -- the calibration
    :class:`~sparsedp.mechanism.MatrixMechanism` applies (certified sensitivity of the measured
    entries, scale rounded up) -- with float noise (``secure=False``): ``2 b^2`` or ``sigma^2``.
    The exact (discrete) noise of the default mechanism has the variance of the discrete
    distribution with the same scale, smaller by a relative ``O(scale^-2)``: ``< 1e-9`` for the
    integer strategies here, larger for 0/1 templates with few levels (``1.84`` instead of ``2`` at
    ``Delta = 1``)."""
    plan = (
        plan_measurement(strategy, epsilon=1.0, noise="laplace", secure=False)
        if model.kind == "laplace"
        else plan_measurement(strategy, rho=1.0, noise="gaussian", secure=False)
    )
    var = plan.variances()
    if var.size == 0 or not np.all(var == var[0]):  # pragma: no cover - homoscedastic by construction
        raise SparseDPError("expected homoscedastic noise")
    return float(var[0])


def layout_path_sums(layout: TreeLayout, x: np.ndarray) -> np.ndarray:
    """``T^T x`` for the node-by-leaf 0/1 matrix ``T`` of ``layout`` (rows root first) without
    forming it: per leaf, the sum of ``x`` over its root-to-leaf path (top-down, ``O(nodes)``;
    exact for integer ``x`` below ``2^53``)."""
    x = np.asarray(x, dtype=np.float64)
    acc = layout.level_rows(x, layout.levels - 1).copy()
    for lev in range(layout.levels - 2, -1, -1):
        acc = np.repeat(acc, np.diff(layout.child_starts[lev])) + layout.level_rows(x, lev)
    return acc


def integer_weights(shares: np.ndarray, paths: sp.spmatrix | TreeLayout, model: NoiseModel) -> np.ndarray:
    """Integer row weights of a tree from path shares ``q`` (every root-to-leaf path sums to 1).

    ``paths``: the node-by-leaf 0/1 matrix, or the :class:`~sparsedp.strategies.TreeLayout` (path
    sums by :func:`layout_path_sums`, without the matrix).  Laplace ``w = floor(q 2^k)``, Gaussian
    ``w = floor(sqrt(q) 2^k)`` (``sum w^2 <= 4^k`` on every path), at least 1.  If raising a weight
    to 1 pushes a path over the bound, every share is first scaled by ``1 - levels / 4^k`` (which
    leaves room for the raised ones)."""
    q = np.asarray(shares, dtype=np.float64)
    if isinstance(paths, TreeLayout):
        levels = paths.levels

        def path_max(x: np.ndarray) -> float:
            return float(layout_path_sums(paths, x).max())
    else:
        P = sp.csc_matrix(paths)
        levels = int(P.sum(axis=0).max())

        def path_max(x: np.ndarray) -> float:
            return float((P.T @ x).max())

    for reserve in (0.0, float(levels)):
        if model.p == 1:
            w = np.maximum(1.0, np.floor(q * (model.scale - reserve)))
            ok = path_max(w) <= model.scale
        else:
            w = np.maximum(1.0, np.floor(np.sqrt(q * (float(model.scale) ** 2 - reserve))))
            ok = path_max(w * w) <= float(model.scale) ** 2
        if ok:
            return w
    raise SparseDPError("could not round the tree weights to integers")  # pragma: no cover


def integer_pidentity(d: np.ndarray, bottom: np.ndarray, model: NoiseModel) -> tuple[np.ndarray, np.ndarray]:
    """Integer form of ``[diag(d); B]`` (columns of norm 1): ``(a, B_int)`` with ``a = max(1,
    floor(d 2^k))`` and ``B_int = trunc(B 2^k)``, every column's L1 norm (Laplace) or squared L2
    norm (Gaussian) at most ``2^k`` / ``4^k`` (exact integer sums; if not, the scale is reduced by
    the rows of the column and rounded again)."""
    rows = 1 + bottom.shape[0]
    for reserve in (1e-6, float(rows) + 1e-6):
        if model.p == 1:
            scale = model.scale - reserve
        else:
            scale = float(np.sqrt(float(model.scale) ** 2 - reserve))
        a = np.maximum(1.0, np.floor(d * scale))
        B = np.trunc(bottom * scale)
        if model.p == 1:
            ok = float((a + np.abs(B).sum(axis=0)).max()) <= model.scale
        else:
            ok = float((a * a + (B * B).sum(axis=0)).max()) <= float(model.scale) ** 2
        if ok:
            return a, B
    raise SparseDPError("could not round the strategy to integers")  # pragma: no cover
