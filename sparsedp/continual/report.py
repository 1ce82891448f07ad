"""The error table of every continual-release method for one horizon (CLI ``--report``, benchmark)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import check_epsilon, check_rho
from .baselines import binary_variance, honaker_variance, naive_variance
from .error import expected_error
from .fenwick import check_horizon
from .glstree import default_radices, gls_tree_error
from .kary import kary_error
from .negdigit import negdigit_error
from .toeplitz import fit_blt, sqrt_error
from .weights import FenwickWeights

__all__ = ["MethodError", "error_table", "format_table"]


@dataclass(frozen=True)
class MethodError:
    """Analytic per-step variance summary of one method: ``mean`` over the ``N`` steps, ``max``."""

    method: str
    privacy: str
    mean: float
    max: float
    per_step: np.ndarray


def _row(method: str, privacy: str, per_step: np.ndarray) -> MethodError:
    return MethodError(method, privacy, float(per_step.mean()), float(per_step.max()), per_step)


def error_table(N: int, epsilon: float = 1.0, rho: float | None = None, blt_buffers: int = 5,
                kary: tuple[int, ...] = (2, 16), negdigit: tuple[int, ...] = (7, 19),
                gls: tuple[int, ...] = (12,)) -> list[MethodError]:
    """Per-step variances of every method at horizon ``N``: pure ``epsilon``-DP (Laplace) methods,
    then ``rho``-zCDP (Gaussian) methods (``rho = epsilon^2 / 2`` by default, the zCDP level that
    ``epsilon``-DP implies).  ``gls``: radices of the full-GLS trees (their weight optimisation takes
    about 10-20 s at ``N = 2^20``)."""
    N = check_horizon(N)
    eps = check_epsilon(epsilon, "epsilon")
    rho = check_rho(eps * eps / 2.0 if rho is None else rho, "rho")
    pure, zc = f"eps={eps:g}", f"rho={rho:g}"
    rows = [
        _row("naive", pure, naive_variance(N, eps)),
        _row("binary (Chan-Shi-Song) = Fenwick", pure, binary_variance(N, eps)),
        _row("Honaker streaming", pure, honaker_variance(N, eps)),
        _row("Fenwick + FDA weights", pure,
             expected_error(N, FenwickWeights.build(N, 1).array(), epsilon=eps).per_step),
    ]
    for k in kary:
        rows.append(_row(f"{k}-ary tree, opt. level weights", pure, kary_error(N, k, epsilon=eps).per_step))
    for k in negdigit:
        rows.append(_row(f"{k}-ary neg. digits, opt. level weights", pure, negdigit_error(N, k, epsilon=eps).per_step))
    for k in gls:
        rows.append(_row(f"{k}-ary GLS tree, opt. level weights", pure,
                         gls_tree_error(N, eps, radices=default_radices(N, k)).per_step))
    rows += [
        _row("Fenwick + FDA weights (L2)", zc, expected_error(N, FenwickWeights.build(N, 2).array(), rho=rho).per_step),
        _row("square-root factorisation", zc, sqrt_error(N, rho).per_step),
        _row(f"BLT ({blt_buffers} buffers)", zc, fit_blt(N, blt_buffers).error(N, rho).per_step),
    ]
    return rows


def format_table(N: int, rows: list[MethodError]) -> str:
    """Plain-text table: method, privacy, mean and max per-step variance."""
    lines = [f"continual release, N = {N}: analytic per-step variance of the running sum",
             f"{'method':<40} {'privacy':<10} {'mean':>12} {'max':>12}"]
    lines += [f"{r.method:<40} {r.privacy:<10} {r.mean:>12.2f} {r.max:>12.2f}" for r in rows]
    return "\n".join(lines)
