"""Pure-DP (Laplace) strategies for marginal workloads: weighted marginals (HDMM's ``Marginals``
parametrisation, McKenna et al., VLDB 2018), optimised in the residual basis.

The strategy measures every marginal ``S`` of the domain (``2^d`` of them) with weight
``theta_S >= 0``: ``M = [theta_S W_S]_S``.  One record changes one cell of every marginal table,
so ``Delta_1(M) = sum_S theta_S``.  The Gram matrices of marginals are diagonal in the residual
basis (:mod:`sparsedp.marginals.residual`): ``W_S^T W_S`` acts on residual ``A`` as
``N_S = prod_{i not in S} n_i`` if ``A subset S`` and as 0 otherwise.  So with
``lambda_A = sum_{S superset A} theta_S^2 N_S`` and, for the workload, ``mu_A = sum_{S in W, S superset A} N_S``,

    total squared error = 2 Delta_1^2 / epsilon^2 * trace(W^T W (M^T M)^+)
                        = 2 (sum_S theta_S)^2 / epsilon^2 * sum_A dim_A mu_A / lambda_A,

``dim_A = prod_{i in A} (n_i - 1)``: a smooth function of ``2^d`` weights, minimised by L-BFGS-B
(scale-invariant and not convex: starts at the workload's marginals, the full table, all
marginals, and ``restarts`` random weightings favouring large marginals; the best is kept).  Above
``d = 16`` attributes the candidates are the workload's marginals and their sub-marginals only (the
downward closure: ``sum_S 2^|S|`` of them, ``E`` sparse), the sub-parametrisation with the other
weights at 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from itertools import combinations
from typing import Any

import numpy as np

from ..noise import as_generator
from ..validation import check_epsilon
from .domain import Domain, requested_names
from .select import _normalise, closure

__all__ = ["FULL_MAX_D", "MarginalsStrategy", "optimize_marginals_laplace"]

#: Up to this many attributes the strategy may weight every marginal of the domain (``2^d``); on
#: wider domains only the workload's marginals and their sub-marginals.
FULL_MAX_D = 16


@dataclass(frozen=True)
class MarginalsStrategy:
    """Weights ``theta`` of the measured marginals (normalised to ``sum = 1``) and the error."""

    domain: Domain
    marginals: tuple[tuple[int, ...], ...]  # the workload
    measured: tuple[tuple[int, ...], ...]  # marginals with a positive weight
    weights: np.ndarray  # theta of each measured marginal (sum 1: Delta_1 = 1)
    epsilon: float
    total_error: float  # expected total squared error of the workload's answers at epsilon
    seconds: float
    #: the marginals as the user named them (order of marginals and of their attributes): the
    #: release answers in this order (:func:`~sparsedp.marginals.release.requested_names`)
    requested: tuple = ()

    def at(self, epsilon: float) -> "MarginalsStrategy":
        """The same weights at another ``epsilon`` (the error scales as ``1 / epsilon^2``): what
        :func:`~sparsedp.marginals.release_marginals_laplace` measures at that budget."""
        from dataclasses import replace

        eps = check_epsilon(epsilon)
        return replace(self, epsilon=eps, total_error=self.total_error * (self.epsilon / eps) ** 2)


def _setup(domain: Domain, ms: list[tuple[int, ...]]):
    d = len(domain)
    sizes = domain.sizes
    subsets = [S for r in range(d + 1) for S in combinations(range(d), r)]
    res = [A for A in closure(ms) if all(sizes[i] > 1 for i in A)]
    N = np.array([math.prod(sizes[i] for i in range(d) if i not in S) for S in subsets], dtype=np.float64)
    E = np.zeros((len(res), len(subsets)))
    mu = np.zeros(len(res))
    msets = [set(S) for S in ms]
    for a, A in enumerate(res):
        As = set(A)
        for s, S in enumerate(subsets):
            if As <= set(S):
                E[a, s] = N[s]
        mu[a] = sum(math.prod(sizes[i] for i in range(d) if i not in S) for S, Ss in zip(ms, msets) if As <= Ss)
    dim = np.array([math.prod(sizes[i] - 1 for i in A) for A in res], dtype=np.float64)
    return subsets, E, dim * mu


def _setup_closure(domain: Domain, ms: list[tuple[int, ...]]):
    """:func:`_setup` with the candidate marginals restricted to the workload's downward closure
    (every subset of a workload marginal; the others' weights fixed at 0): ``E`` sparse (``A
    subset S`` pairs only) and every ``N_S`` divided by ``prod_i n_i`` (``prod_{i in S} 1 / n_i``:
    no overflow on wide domains; the objective's ratio ``mu_A / lambda_A`` is unchanged)."""
    import scipy.sparse as sp

    sizes = domain.sizes
    subsets = sorted(closure(ms), key=lambda S: (len(S), S))
    res = [A for A in subsets if all(sizes[i] > 1 for i in A)]
    index = {A: a for a, A in enumerate(res)}
    inv = {S: math.prod(1.0 / sizes[i] for i in S) for S in subsets}
    rows, cols, vals = [], [], []
    for s_, S in enumerate(subsets):
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                a = index.get(A)
                if a is not None:
                    rows.append(a), cols.append(s_), vals.append(inv[S])
    E = sp.csr_matrix((vals, (rows, cols)), shape=(len(res), len(subsets)))
    mu = np.zeros(len(res))
    for S in ms:
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                a = index.get(A)
                if a is not None:
                    mu[a] += inv[S]
    dim = np.array([math.prod(sizes[i] - 1 for i in A) for A in res], dtype=np.float64)
    return subsets, E, dim * mu


def _objective(theta: np.ndarray, E: np.ndarray, c: np.ndarray) -> tuple[float, np.ndarray]:
    s = float(theta.sum())
    lam = E @ (theta * theta)
    lam = np.maximum(lam, 1e-100)  # lam**2 stays a normal number: no division by zero
    g = float(np.sum(c / lam))
    dg = -(E.T @ (c / lam**2)) * 2.0 * theta
    f = s * s * g
    return f, 2.0 * s * g + s * s * dg


def optimize_marginals_laplace(domain: Domain, marginals: Any, epsilon: float, *, restarts: int = 4,
                               rng: Any = 0) -> MarginalsStrategy:
    """Weighted-marginals strategy minimising the workload's total squared error under
    ``epsilon``-DP Laplace noise (see module doc).  Nothing is measured."""
    from scipy.optimize import Bounds, minimize

    t0 = time.perf_counter()
    eps = check_epsilon(epsilon)
    if not isinstance(marginals, (str, bytes)) and hasattr(marginals, "__iter__"):
        marginals = list(marginals)  # read twice below: an iterator once
    ms = _normalise(domain, marginals)
    subsets, E, c = _setup(domain, ms) if len(domain) <= FULL_MAX_D else _setup_closure(domain, ms)
    gen = as_generator(rng)
    mset = set(ms)
    wl_ind = np.array([1.0 if S in mset else 0.0 for S in subsets])
    full = np.array([1.0 if len(S) == len(domain) else 0.0 for S in subsets])
    order = np.array([len(S) for S in subsets], dtype=np.float64)
    wide = len(domain) > FULL_MAX_D  # no full table among the candidates; fewer starts (each ~10 steps there)
    starts = [wl_ind, order / max(order.max(), 1.0)] if wide else \
        [wl_ind, full, np.ones(len(subsets)), order / max(order.max(), 1.0)]
    starts += [gen.random(len(subsets)) * (order / max(order.max(), 1.0)) ** gen.uniform(0, 3)
               for _ in range(max(0, min(restarts, 1) if wide else restarts))]
    best = None
    for x0 in starts:  # non-convex in theta: several starts (HDMM restarts too)
        x0 = x0 + 0.05 * gen.random(len(subsets))
        res = minimize(_objective, x0, args=(E, c), jac=True, method="L-BFGS-B",
                       bounds=Bounds(np.zeros(len(subsets)), np.full(len(subsets), np.inf)),
                       options={"maxiter": 5000, "ftol": 1e-15, "gtol": 1e-12})
        if best is None or res.fun < best.fun:
            best = res
    theta = best.x / best.x.sum()
    f, _ = _objective(theta, E, c)
    keep = theta > 1e-12
    return MarginalsStrategy(domain=domain, marginals=tuple(ms),
                             measured=tuple(S for S, k in zip(subsets, keep) if k), weights=theta[keep],
                             epsilon=eps, total_error=2.0 * f / eps**2, seconds=time.perf_counter() - t0,
                             requested=requested_names(domain, marginals))
