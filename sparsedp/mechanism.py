"""The matrix mechanism (Li, Hay, Rastogi, Miklau, McGregor; seed 001) and its low-rank form.

Measure a strategy ``M`` with noise, ``y = M x + z``, reconstruct ``x_hat`` by generalised least
squares and answer the workload ``W x_hat``.  For a factorisation ``W = B M`` this is seed 000's
``A(W, x) = B (M x + (Delta_M / eps) L)`` (eq. 5.1); with a weighted strategy ``diag(w) M`` it is
eq. 5.8.

Noise calibration (one record changes one entry of the count vector ``x`` by one):

* Laplace, ``epsilon``-DP:  ``z_i ~ Lap(b)``, ``b = Delta_1(M) / epsilon``,
  ``Delta_1(M) = max_j sum_i |M_ij|``; ``Var(z_i) = 2 b^2``.
* Gaussian, ``rho``-zCDP:   ``z_i ~ N(0, sigma^2)``, ``sigma = Delta_2(M) / sqrt(2 rho)``,
  ``Delta_2(M) = max_j sqrt(sum_i M_ij^2)`` (Bun and Steinke 2016).  ``(epsilon, delta)`` may be
  given instead of ``rho``; it is converted with :func:`~sparsedp.privacy.rho_for_approx_dp`.
* ``secure=True``: exact discrete Laplace / discrete Gaussian noise (Canonne, Kamath, Steinke 2020)
  from OS random bits, on the grid ``g`` (default 1): ``y = g (round(M x / g) + k)``.  When
  ``M x / g`` is integral for integral ``x`` (integer multiples of ``g`` in ``M``), the sensitivity in
  grid units is ``Delta_p(M) / g``; otherwise rounding can move every touched row by one more unit
  and the mechanism uses ``max_j sum_{i: M_ij != 0} (|M_ij| / g + 1)`` (p = 1; the root of the
  sum of squares for p = 2).  The discrete Laplace with scale ``t`` is ``epsilon``-DP for grid
  sensitivity ``Delta`` when ``t = Delta / epsilon``; the discrete Gaussian with ``sigma^2 =
  Delta^2 / (2 rho)`` is ``rho``-zCDP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import noise as _noise
from .accuracy import ErrorReport, expected_error
from .errors import InputBoundError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from .inference import Reconstruction, reconstruct
from .calibration import gaussian_sigma, laplace_scale, sensitivity_bound
from .operators import Operator, aslinearoperator
from .privacy import Accountant, PrivacyCost, rho_for_approx_dp
from .noise import discrete_gaussian_variance, discrete_laplace_variance, snap_to_grid
from .validation import check_counts, check_epsilon, check_magnitude, check_positive, check_rho, check_vector

__all__ = ["Measurement", "Release", "MatrixMechanism"]


@dataclass(frozen=True)
class Measurement:
    """Noisy strategy answers and everything needed to use them."""

    y: np.ndarray  # noisy answers, one per strategy row
    strategy: Operator
    noise: str  # "laplace" or "gaussian"
    scales: np.ndarray  # per-row noise scale: Laplace b_i or Gaussian sigma_i (before grid rounding)
    variances: np.ndarray  # per-row noise variance Var(z_i)
    sensitivity: float  # Delta_1 (Laplace) or Delta_2 (Gaussian) used for calibration
    cost: PrivacyCost
    secure: bool = False


@dataclass(frozen=True)
class Release:
    """Workload answers from one run of a mechanism."""

    answers: np.ndarray
    x_hat: np.ndarray
    measurement: Measurement
    reconstruction: Reconstruction


class MatrixMechanism:
    """Answer workload ``W`` by measuring strategy ``M`` with calibrated noise.

    Parameters
    ----------
    W, M:
        Workload and strategy (operators, sparse or dense matrices) with the same column count.
    epsilon:
        Pure-DP budget of one measurement (Laplace), or with ``delta`` an ``(epsilon, delta)`` target
        for Gaussian noise.
    rho:
        zCDP budget of one measurement (Gaussian).
    noise:
        ``"laplace"`` or ``"gaussian"``.
    secure:
        Exact discrete noise from OS random bits on the grid ``grid`` (see the module docstring).
    accountant:
        Optional :class:`~sparsedp.privacy.Accountant`; every :meth:`measure` spends its cost there
        first and raises :class:`~sparsedp.errors.BudgetExceededError` before drawing noise.
    """

    def __init__(
        self,
        W: Any,
        M: Any,
        epsilon: float | None = None,
        *,
        rho: float | None = None,
        delta: float | None = None,
        noise: str = "laplace",
        secure: bool = False,
        grid: float = 1.0,
        accountant: Accountant | None = None,
    ):
        self.W = aslinearoperator(W, name="workload")
        self.M = aslinearoperator(M, name="strategy")
        if self.W.shape[1] != self.M.shape[1]:
            raise ShapeError(f"workload has {self.W.shape[1]} columns, strategy {self.M.shape[1]}")
        if noise not in ("laplace", "gaussian"):
            raise SparseDPError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
        self.noise = noise
        self.secure = bool(secure)
        self.grid = check_positive(grid, "grid")
        if accountant is not None and not isinstance(accountant, Accountant):
            raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
        self.accountant = accountant
        # The matrix that is measured is the one whose entries calibrate the noise: one object,
        # never a structure tag or a closed form an operator claims for itself.
        self._matrix = sp.csr_matrix(self.M.tosparse(), dtype=np.float64)
        if self._matrix.shape != self.M.shape:
            raise ShapeError(f"the strategy's explicit form has shape {self._matrix.shape}, not {self.M.shape}")
        if noise == "laplace":
            if rho is not None or delta is not None:
                raise InvalidPrivacyParameterError("Laplace noise takes epsilon only (pure DP)")
            if epsilon is None:
                raise InvalidPrivacyParameterError("Laplace noise needs epsilon")
            self.epsilon = check_epsilon(epsilon, "epsilon")
            self.cost = PrivacyCost(epsilon=self.epsilon)
            self.sensitivity = sensitivity_bound(self._matrix, 1)
        else:
            if rho is None:
                if epsilon is None or delta is None:
                    raise InvalidPrivacyParameterError("Gaussian noise needs rho, or epsilon and delta")
                rho = rho_for_approx_dp(check_epsilon(epsilon, "epsilon"), delta)
            elif epsilon is not None:
                raise InvalidPrivacyParameterError("give rho or (epsilon, delta), not both")
            self.rho = check_rho(rho, "rho")
            self.cost = PrivacyCost(rho=self.rho)
            self.sensitivity = sensitivity_bound(self._matrix, 2)
        if self.sensitivity == 0:
            raise ShapeError("the strategy has no non-zero entry: nothing to measure")
        self._grid_exact, self._grid_sensitivity = self._grid_calibration() if self.secure else (True, 0.0)
        if self.secure and self._secure_scale() > _noise.MAX_DISCRETE_SCALE:
            raise InvalidPrivacyParameterError(
                f"the exact sampler's scale would be {self._secure_scale():.6g} grid units, above its limit "
                f"{_noise.MAX_DISCRETE_SCALE:g}: raise epsilon/rho or the grid"
            )

    # -- calibration -----------------------------------------------------------------------------
    def _grid_calibration(self) -> tuple[bool, float]:
        """Sensitivity in grid units for secure mode, and whether ``M x / g`` is integral.

        Exact grid (every ``M_ij / g`` an integer): ``Delta_p(M / g)``.  Otherwise rounding can move
        every touched row by one more unit: ``max_j sum_{i: M_ij != 0} (ceil(|M_ij| / g) + 1)``
        (``p = 1``; the root of the sum of squares for ``p = 2``), certified upward."""
        A = sp.csc_matrix(self._matrix) / self.grid
        p = 1 if self.noise == "laplace" else 2
        exact = bool(np.all(A.data == np.round(A.data)))
        if exact:
            return True, sensitivity_bound(A, p)
        bumped = A.copy()
        bumped.data = np.ceil(np.abs(bumped.data)) + 1.0
        return False, sensitivity_bound(bumped, p)

    def noise_scale(self) -> float:
        """Laplace ``b = Delta_1 / epsilon`` or Gaussian ``sigma = Delta_2 / sqrt(2 rho)`` (float
        noise), rounded up so that the stated budget is never exceeded."""
        if self.noise == "laplace":
            return laplace_scale(self.sensitivity, self.epsilon)
        return gaussian_sigma(self.sensitivity, self.rho)

    def _secure_scale(self) -> float:
        """Scale in grid units of the discrete noise (``t`` or ``sigma``), rounded up."""
        if self.noise == "laplace":
            return laplace_scale(self._grid_sensitivity, self.epsilon)
        return gaussian_sigma(self._grid_sensitivity, self.rho)

    def variances(self) -> np.ndarray:
        """Per-row noise variance of one measurement."""
        m = self.M.shape[0]
        if not self.secure:
            b = self.noise_scale()
            var = 2 * b * b if self.noise == "laplace" else b * b
        else:
            t = self._secure_scale()
            unit = discrete_laplace_variance(t) if self.noise == "laplace" else discrete_gaussian_variance(t)
            var = unit * self.grid**2
        return np.full(m, var)

    # -- measuring -------------------------------------------------------------------------------
    def measure(self, x: Any, rng: Any = None, *, counts: bool = True) -> Measurement:
        """Draw ``y = M x + z``.

        ``x`` must be a finite vector of length ``n`` (non-negative integral counts unless
        ``counts=False``).  Input is checked and the budget charged *before* noise is drawn.
        """
        n = self.M.shape[1]
        xv = check_counts(x, n, "x") if counts else check_vector(x, n, "x")
        check_magnitude(xv, "x")
        if self.secure and not np.all(xv == np.round(xv)) and self._grid_exact:
            raise SparseDPError("secure mode with an exact grid needs integral data; pass grid= or round x")
        # Everything that can fail is computed and checked before the budget is charged and the
        # generator advanced: validate, then charge, then draw.
        m = self.M.shape[0]
        exact = np.asarray(self._matrix @ xv, dtype=np.float64)
        if not np.all(np.isfinite(exact)):
            raise InputBoundError("M x overflows float64")
        check_magnitude(exact, "M x")
        if self.secure:
            check_magnitude(exact / self.grid, "M x / grid")
            cells = snap_to_grid(exact, self.grid)
            scale = self._secure_scale() * self.grid
        else:
            scale = self.noise_scale()
        gen = rng if rng is None or isinstance(rng, _noise.SecureRandomBits) else _noise.as_generator(rng)
        if self.accountant is not None:
            self.accountant.spend(self.cost, label=f"MatrixMechanism({self.M.name})")
        if self.secure:
            k = _noise.noise(self.noise, self._secure_scale(), size=m, rng=gen, secure=True)
            y = self.grid * (cells + k)
        else:
            y = exact + _noise.noise(self.noise, scale, size=m, rng=gen, secure=False)
        return Measurement(
            y=np.asarray(y, dtype=np.float64),
            strategy=self.M,
            noise=self.noise,
            scales=np.full(m, scale),
            variances=self.variances(),
            sensitivity=self.sensitivity,
            cost=self.cost,
            secure=self.secure,
        )

    def run(self, x: Any, rng: Any = None, method: str = "ls", *, counts: bool = True) -> Release:
        """Measure, reconstruct (``ls``, ``nnls`` or ``l1``) and answer the workload."""
        meas = self.measure(x, rng=rng, counts=counts)
        rec = reconstruct(meas, method=method)
        return Release(self.W.matvec(rec.x), rec.x, meas, rec)

    # -- analytics -------------------------------------------------------------------------------
    def error_report(self, **kwargs: Any) -> ErrorReport:
        """Expected total squared error of the workload answers (GLS), with how it was computed.

        ``sum_i Var(z_i) ||W G e_i||^2``, ``G`` the GLS estimator; for homoscedastic Laplace on a
        square strategy, ``(2 Delta_1^2 / eps^2) trace(B^T B)`` with ``B = W M^-1``.
        """
        return expected_error(self.W, self.M, self.variances(), **kwargs)

    def expected_error(self, **kwargs: Any) -> float:
        """The total of :meth:`error_report` as a float."""
        return self.error_report(**kwargs).total
