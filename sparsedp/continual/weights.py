"""Optimal diagonal weights ``Sigma_N = diag(lambda)`` for the Fenwick strategy (seed 000, 5.4.2-5.4.3).

Problem (eq. 5.10; ``c_i = ||B[:, i]||^2 = min(lowbit(i), N - i + 1)``)::

    minimise  sum_i c_i / lambda_i^2   s.t.  M_N^T lambda <= 1,  lambda > 0          (norm=1, Laplace)

For the Gaussian mechanism the sensitivity is ``Delta_2(Sigma M) = max_j sqrt((M^T lambda^2)_j)``;
with ``u = lambda^2`` the same problem reads ``minimise sum c_i / u_i s.t. M^T u <= 1`` (norm=2).
Both are ``minimise sum c_i / u_i^p s.t. M^T u <= 1`` with ``p = 2`` (``u = lambda``) or ``p = 1``
(``u = lambda^2``).

**FDA** (Theorem 5.4, completed).  For ``N = 2^m - 1`` the matrices split as eqs. 5.12/5.13: a left
copy of the ``2^{m-1} - 1`` problem, the middle node ``2^{m-1}`` (column norm ``c = 2^{m-1}``; its
row of ``M`` covers every left column), and an independent right copy.  With the middle weight
``1 - alpha`` the left copy must satisfy ``M^T u <= alpha`` and its optimum is ``alpha U*`` with cost
``e / alpha^p`` (``e`` = optimum of the smaller problem).  So the seed's last line becomes::

    h(alpha) = e / alpha^p + c / (1 - alpha)^p,
    h'(alpha) = 0  <=>  ((1 - alpha) / alpha)^{p+1} = c / e
    alpha* = e^{1/(p+1)} / (e^{1/(p+1)} + c^{1/(p+1)}),   h(alpha*) = (e^{1/(p+1)} + c^{1/(p+1)})^{p+1}
    err_m = (err_{m-1}^{1/3} + 2^{(m-1)/3})^3 + err_{m-1}                  (p = 2, err_0 = 0)
    U*_m = (alpha* U*_{m-1}, 1 - alpha*, U*_{m-1})                                  (eq. 5.11)

**Every N.**  Write ``N = 2^{k_1} + 2^{k_2} + ...`` (``k_1 > k_2 > ...``).  The Fenwick forest has
one tree per binary digit: block ``b`` covers ``(s_b, s_b + 2^{k_b}]`` (``s_b`` = the higher digits)
and its root ``r_b = s_b + 2^{k_b}`` is read by every later step, ``c = N - r_b + 1``.  Each column of
``M`` lies in one block, so both objective and constraints separate by block.  A block is a full
``2^{k_b} - 1`` tree under its root; the step above with ``e = err_{k_b}`` and ``c = N - r_b + 1``
gives its optimum (for ``k_b = 0`` the block is the root alone, ``u = 1``).  For ``N = 2^m - 1`` this
reproduces the recursion.  Weights cost ``O(N)`` for the whole vector and ``O(log N)`` for one
``lambda_i`` (:meth:`FenwickWeights.at`), which is what the online counter uses.

**SQP** (the seed's reference): scipy's SLSQP on the same convex problem, small ``N`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np
import scipy.optimize


from ..errors import SparseDPError
from ._stream import ceil_sqrt, certified_sum
from .fenwick import check_horizon, column_chain_sum, column_counts, fenwick_matrices

__all__ = [
    "FenwickWeights",
    "optimal_weights",
    "fda_weights",
    "sqp_weights",
    "weights_sensitivity",
    "certified_weights_sensitivity",
]


def _power(norm: int) -> int:
    if norm not in (1, 2):
        raise SparseDPError(f"norm must be 1 (Laplace) or 2 (Gaussian), got {norm!r}")
    return 3 - norm


def _split(e: float, c: float, p: int) -> tuple[float, float]:
    """``(alpha*, h(alpha*))`` for ``min_alpha e / alpha^p + c / (1 - alpha)^p``."""
    if e <= 0.0:
        return 0.0, c
    q = 1.0 / (p + 1)
    eq, cq = e**q, c**q
    return eq / (eq + cq), (eq + cq) ** (p + 1)


@dataclass(frozen=True)
class FenwickWeights:
    """FDA-optimal weights for horizon ``N`` under ``norm`` (1: Laplace/pure DP, 2: Gaussian/zCDP).

    Holds ``O(log N)`` numbers: ``alphas[k]`` for the full ``2^k - 1`` trees, and one
    ``(offset, k, beta)`` per binary digit of ``N``.  ``objective`` is the optimum of eq. 5.10
    (``sum c_i / lambda_i^2``, without the ``2 / eps^2`` factor).
    """

    N: int
    norm: int
    alphas: tuple[float, ...]
    errs: tuple[float, ...]
    blocks: tuple[tuple[int, int, float], ...]
    objective: float

    @classmethod
    def build(cls, N: int, norm: int = 1) -> "FenwickWeights":
        N = check_horizon(N, "N")
        p = _power(norm)
        top = N.bit_length()
        alphas, errs = [0.0], [0.0]
        for k in range(1, top):
            a, h = _split(errs[-1], float(2 ** (k - 1)), p)
            alphas.append(a)
            errs.append(h + errs[-1])
        blocks, total, s = [], 0.0, 0
        for k in reversed(range(top)):
            if N >> k & 1:
                root = s + (1 << k)
                beta, h = _split(errs[k], float(N - root + 1), p)
                blocks.append((s, k, beta))
                total += h
                s = root
        return cls(N, norm, tuple(alphas), tuple(errs), tuple(blocks), total)

    def _factors(self, i: int) -> tuple[list[float], float]:
        """The multipliers from the block down to node ``i`` and the node's own ``1 - alpha`` term."""
        if not 1 <= i <= self.N:
            raise SparseDPError(f"index {i} outside 1..{self.N}")
        for s, k, beta in self.blocks:
            root = s + (1 << k)
            if i == root:
                return [], 1.0 - beta
            if i < root:
                factors, j = [beta], i - s
                while True:  # descend U*_k: (alpha U*_{k-1}, 1 - alpha, U*_{k-1})
                    half = 1 << (k - 1)
                    if j == half:
                        return factors, 1.0 - self.alphas[k]
                    if j < half:
                        factors.append(self.alphas[k])
                    else:
                        j -= half
                    k -= 1
        raise AssertionError("index outside the forest")  # pragma: no cover

    def u_at(self, i: int) -> float:
        """``u_i`` (``lambda_i`` for norm 1, ``lambda_i^2`` for norm 2), 1-based, in ``O(log N)``.

        Multiplies innermost first, so the value is bit-for-bit the one :meth:`u_array` gives.
        """
        factors, value = self._factors(i)
        for f in reversed(factors):
            value = f * value
        return value

    def at(self, i: int) -> float:
        """``lambda_i`` (1-based) in ``O(log N)`` time and memory."""
        u = self.u_at(i)
        return u if self.norm == 1 else float(np.sqrt(u))

    def u_array(self) -> np.ndarray:
        """All ``u_i`` in ``O(N)``: ``U*_k`` by doubling, then one slice per binary digit of ``N``."""
        full = [np.zeros(0)]
        for k in range(1, len(self.alphas)):
            a = self.alphas[k]
            full.append(np.concatenate([a * full[-1], [1.0 - a], full[-1]]))
        parts = []
        for _, k, beta in self.blocks:
            parts.append(beta * full[k])
            parts.append([1.0 - beta])
        return np.concatenate(parts)

    def array(self) -> np.ndarray:
        """All ``lambda_i`` as a float64 array of length ``N``."""
        u = self.u_array()
        return u if self.norm == 1 else np.sqrt(u)


def fda_weights(N: int, norm: int = 1) -> np.ndarray:
    """FDA-optimal ``lambda`` (see the module docstring), ``O(N)``."""
    return FenwickWeights.build(N, norm).array()


def weights_sensitivity(lam: np.ndarray, norm: int = 1) -> float:
    """``Delta_norm(diag(lam) M_N)``: ``max_j (M^T lam)_j`` or ``max_j sqrt((M^T lam^2)_j)``, O(N log N)."""
    _power(norm)
    lam = np.asarray(lam, dtype=np.float64)
    if norm == 1:
        return float(column_chain_sum(np.abs(lam)).max())
    return float(np.sqrt(column_chain_sum(lam * lam).max()))


def certified_weights_sensitivity(lam: np.ndarray, norm: int = 1) -> float:
    """:func:`weights_sensitivity`, certified ``>=`` the exact value over the float weights.

    Column ``j`` of ``M_N`` has at most ``L = bit_length(N)`` ones, and :func:`column_chain_sum` adds
    its terms one at a time, so Higham's ``gamma_{L-1}`` bounds the rounding (one more rounding per
    term for the squares of ``norm=2``); integer weights (unit: ``L`` exactly) are exact.  The
    structured formula is checked against the entries of ``diag(lam) M_N`` in the tests.
    """
    _power(norm)
    lam = np.abs(np.asarray(lam, dtype=np.float64))
    L = lam.size.bit_length()
    if norm == 1:
        integer = bool(np.all(lam == np.floor(lam)))
        return float(certified_sum(column_chain_sum(lam), L, integer_terms=integer).max())
    return ceil_sqrt(float(certified_sum(column_chain_sum(lam * lam), L, roundings=1).max()))


def sqp_weights(N: int, norm: int = 1, tol: float = 1e-12, maxiter: int = 2000) -> np.ndarray:
    """Reference solution of eq. 5.10 by SLSQP (scipy), in ``u`` (see module docstring).

    Dense constraint Jacobian, ``O(N^3)`` per iteration: small ``N`` only (refused above 2000).
    """
    N = check_horizon(N, "N")
    if N > 2000:
        raise SparseDPError(f"sqp_weights is a small-N reference; N = {N} > 2000 (use method='fda')")
    p = _power(norm)
    c = column_counts(N)
    M, _ = fenwick_matrices(N)
    A = np.asarray(M.T.todense())  # small N only
    u0 = np.full(N, 1.0 / N.bit_length())
    scale = float(np.sum(c / u0**p))

    def f(u: np.ndarray) -> float:
        return float(np.sum(c / u**p)) / scale

    def g(u: np.ndarray) -> np.ndarray:
        return -p * c / u ** (p + 1) / scale

    res = scipy.optimize.minimize(
        f,
        u0,
        jac=g,
        method="SLSQP",
        bounds=[(1e-9, 1.0)] * N,
        constraints=[{"type": "ineq", "fun": lambda u: 1.0 - A @ u, "jac": lambda u: -A}],
        options={"ftol": tol, "maxiter": maxiter},
    )
    if not res.success:
        raise SparseDPError(f"SLSQP did not converge for N = {N}: {res.message}")
    u = res.x
    return u if norm == 1 else np.sqrt(u)


def optimal_weights(N: int, method: str = "fda", norm: int = 1) -> np.ndarray:
    """The diagonal ``lambda`` of seed eq. 5.10: ``method="fda"`` (fast, exact) or ``"sqp"`` (reference).

    ``norm=1`` optimises for Laplace noise (``Delta_1(Sigma M) <= 1``), ``norm=2`` for Gaussian noise
    (``Delta_2(Sigma M) <= 1``).
    """
    if method == "fda":
        return fda_weights(N, norm)
    if method == "sqp":
        return sqp_weights(N, norm)
    raise SparseDPError(f"method must be 'fda' or 'sqp', got {method!r}")


