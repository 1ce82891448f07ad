"""The noise model of the optimiser: unit budget, sensitivity norm, certified normalisation.

Every family optimises the error *per unit budget*: ``epsilon = 1`` for Laplace noise (pure DP,
``Delta_1``, the largest column L1 norm) and ``rho = 1`` for Gaussian noise (zCDP, ``Delta_2``, the
largest column L2 norm).  A strategy normalised to ``Delta = 1`` then has homoscedastic noise of
variance

* Laplace: ``Var = 2 b^2`` with ``b = Delta_1 / epsilon = 1``, i.e. ``2``;
* Gaussian: ``Var = sigma^2`` with ``sigma = Delta_2 / sqrt(2 rho) = 1 / sqrt(2)``, i.e. ``1/2``;

and the expected total squared error of the GLS workload answers is ``Var * tr((M^T M)^+ W^T W)``.
At another budget the error scales as ``1 / epsilon^2`` (Laplace) or ``1 / rho`` (Gaussian).

The returned strategy is measured by :class:`~sparsedp.mechanism.MatrixMechanism`, which
calibrates from its entries with the certified :func:`~sparsedp.calibration.sensitivity_bound`;
:func:`unit_variance` reproduces that calibration exactly, so the reported error is the error the
mechanism delivers, not the error of an idealised ``Delta = 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..calibration import gaussian_sigma, laplace_scale, sensitivity_bound
from ..errors import SparseDPError
from ..operators import SparseOperator, scale_rows

__all__ = ["NoiseModel", "noise_model", "unit_variance", "normalise"]


@dataclass(frozen=True)
class NoiseModel:
    """``kind`` (``"laplace"`` / ``"gaussian"``), the sensitivity norm ``p`` and the noise variance
    ``sigma2`` of a strategy with ``Delta_p = 1`` at unit budget."""

    kind: str
    p: int
    sigma2: float


def noise_model(kind: str) -> NoiseModel:
    """The :class:`NoiseModel` of ``"laplace"`` (``p = 1``, ``Var = 2``) or ``"gaussian"``
    (``p = 2``, ``Var = 1/2``)."""
    if kind == "laplace":
        return NoiseModel("laplace", 1, 2.0)
    if kind == "gaussian":
        return NoiseModel("gaussian", 2, 0.5)
    raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {kind!r}")


def unit_variance(strategy: SparseOperator, model: NoiseModel) -> float:
    """The per-row noise variance :class:`~sparsedp.mechanism.MatrixMechanism` uses for
    ``strategy`` at ``epsilon = 1`` (Laplace) or ``rho = 1`` (Gaussian): the certified sensitivity
    of its entries, the scale rounded up."""
    delta = sensitivity_bound(strategy.tosparse(), model.p)
    if model.kind == "laplace":
        b = laplace_scale(delta, 1.0)
        return 2.0 * b * b
    s = gaussian_sigma(delta, 1.0)
    return s * s


def normalise(strategy: SparseOperator, model: NoiseModel, name: str | None = None) -> tuple[SparseOperator, float]:
    """``(factor * strategy, factor)`` with the certified ``Delta_p`` of the result at most 1 (and
    within a few ulps of it).

    Row weights and structure tags are kept (:func:`~sparsedp.operators.scale_rows`).  A float
    division can land a hair above 1; the factor is nudged down until the certified bound of the
    scaled entries is ``<= 1``.
    """
    delta = sensitivity_bound(strategy.tosparse(), model.p)
    if delta == 0:
        raise SparseDPError("the strategy has no non-zero entry")
    if 1.0 - 1e-12 <= delta <= 1.0:
        return strategy, 1.0
    factor = 1.0 / delta
    for _ in range(64):
        out = scale_rows(strategy, np.full(strategy.shape[0], factor), name=name or strategy.name)
        if sensitivity_bound(out.tosparse(), model.p) <= 1.0:
            return out, factor
        factor = float(np.nextafter(factor * (1.0 - 2.0**-52), 0.0))
    raise SparseDPError("could not normalise the strategy's sensitivity to 1")  # pragma: no cover
