"""The optimal residual noise for a marginal workload under Gaussian noise / zCDP (ResidualPlanner).

Xiao, He, Zhang, Kifer, "An optimal and scalable matrix mechanism for noisy marginals under
convex loss functions", NeurIPS 2023.  Measure each residual ``A`` of the workload's downward
closure (:mod:`sparsedp.marginals.residual`) once with i.i.d. ``N(0, sigma_A^2)`` noise in the
orthonormal basis.  With ``p_A = prod_{i in A} (n_i - 1) / n_i``:

* privacy: one added / removed record moves residual ``A`` by ``sqrt(p_A)`` in L2, in every residual
  at once, so the release is ``rho``-zCDP with ``rho = sum_A p_A / (2 sigma_A^2)`` (the Gaussian
  mechanism, Bun and Steinke 2016, composed over the residuals);
* error: the marginal ``S`` has per-cell variance ``v_S = sum_{A subset S} sigma_A^2 f_{S,A}``,
  ``f_{S,A} = prod_{i in A} (n_i - 1) / n_i prod_{i in S \\ A} 1 / n_i^2``, and its cells' variances
  sum to ``sum_{A subset S} sigma_A^2 prod_{i in A} (n_i - 1) prod_{i in S \\ A} 1 / n_i``.

Weighted sum of variances ``sum_S w_S sum_cells Var`` (``objective="sum"``) has the closed form

    c_A = sum_{S superset A} w_S prod_{i in A} (n_i - 1) prod_{i in S \\ A} 1 / n_i
    sigma_A^2 = sqrt(p_A / c_A) * (sum_B sqrt(c_B p_B)) / (2 rho)
    optimum   = (sum_A sqrt(c_A p_A))^2 / (2 rho)

(Lagrange / Cauchy-Schwarz: minimise ``sum c_A s_A`` subject to ``sum p_A / s_A = 2 rho``), and
this is the optimum over *all* Gaussian linear mechanisms for the workload (the paper's Theorem).
``objective="max"`` minimises the largest weighted per-cell variance ``max_S w_S v_S``: a small
convex program in the precisions ``1 / sigma_A^2`` (:func:`_max_variance`, SLSQP).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from dataclasses import dataclass
from itertools import combinations
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..validation import budget_fraction, check_rho
from .domain import Domain

__all__ = ["ResidualSelection", "select_residuals", "marginals_up_to", "closure", "residual_coefficients"]


def marginals_up_to(domain: Domain, k: int, exact: bool = False) -> list[tuple[int, ...]]:
    """Every marginal of order ``<= k`` (``exact``: of order ``k`` only), as sorted index tuples,
    the empty marginal (the total) included when ``k = 0`` or not ``exact``."""
    d = len(domain)
    orders = [k] if exact else range(0, k + 1)
    return [c for r in orders for c in combinations(range(d), r)]


def closure(marginals: Iterable[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The downward closure: every subset of every marginal, sorted by (order, indices)."""
    seen: set[tuple[int, ...]] = set()
    for S in marginals:
        if S in seen:
            continue
        for r in range(len(S) + 1):
            seen.update(combinations(S, r))
    return sorted(seen, key=lambda a: (len(a), a))


@dataclass(frozen=True)
class ResidualSelection:
    """The chosen noise per residual, and the exact variances it gives (see module doc)."""

    domain: Domain
    marginals: tuple[tuple[int, ...], ...]  # the workload (sorted attribute indices)
    weights: np.ndarray  # one weight per marginal
    residuals: tuple[tuple[int, ...], ...]  # the residuals measured (the closure, size-1 attributes dropped)
    sigma2: np.ndarray  # sigma_A^2 per residual (orthonormal basis; data units^2)
    p: np.ndarray  # p_A: squared L2 sensitivity of each residual
    rho: float  # zCDP cost sum_A p_A / (2 sigma_A^2)
    objective: str  # "sum" or "max"
    value: float  # the objective's value (weighted sum of all cells' variances, or max weighted cell variance)
    seconds: float = 0.0  # time to select

    @functools.cached_property
    def _index(self) -> dict[tuple[int, ...], int]:
        return {A: i for i, A in enumerate(self.residuals)}

    def index(self) -> dict[tuple[int, ...], int]:
        """``{residual: position}`` (built once per selection)."""
        return dict(self._index)

    @functools.cached_property
    def _keys(self) -> dict[int, np.ndarray] | None:
        """The residuals' integer keys per order (:func:`_tuple_keys`; ``None`` if they overflow)."""
        return _residual_keys(len(self.domain), self.residuals)

    @functools.cached_property
    def _workload_variances(self) -> dict[tuple[int, ...], float]:
        """``{S: per-cell variance}`` for the workload's marginals, computed once, all at a time."""
        ms = list(self.marginals)
        return dict(zip(ms, self._variances(ms).tolist()))

    def _variances(self, ms: list[tuple[int, ...]]) -> np.ndarray:
        fast = _cell_variances_fast(self.domain, ms, self._keys, self.sigma2) if len(ms) >= _VECTOR_MIN else None
        if fast is not None:
            return fast
        factors = _cell_factors(self.domain, ms, self._index)
        return np.array([float(np.sum(self.sigma2[js] * fs)) for js, fs in factors], dtype=np.float64)

    def cell_variances(self, marginals: Iterable[Sequence[int]]) -> np.ndarray:
        """Per-cell variance of each reconstructed marginal (every cell of a marginal has the same):
        one pass over the marginals, ``O(sum of their residual counts)``."""
        ms = [tuple(S) for S in marginals]
        if ms == list(self.marginals):
            return np.array(list(self._workload_variances.values()), dtype=np.float64)
        return self._variances(ms)

    def cell_variance(self, S: Sequence[int]) -> float:
        """Per-cell variance of the reconstructed marginal ``S`` (every cell has the same)."""
        S = tuple(S)
        v = self._workload_variances.get(S) if len(self.marginals) >= _VECTOR_MIN else None
        return v if v is not None else float(self._variances([S])[0])

    def sum_of_variances(self, marginals: Iterable[Sequence[int]] | None = None) -> float:
        """``sum_S sum_cells Var``: unweighted, over the workload (or the marginals given)."""
        ms = list(self.marginals) if marginals is None else [tuple(m) for m in marginals]
        cells = _cells(self.domain, ms)
        return float(np.dot(self.cell_variances(ms), cells)) if ms else 0.0

    def max_variance(self) -> float:
        """Largest per-cell variance over the workload (unweighted)."""
        return float(self.cell_variances(self.marginals).max())


def _normalise(domain: Domain, marginals: Any) -> list[tuple[int, ...]]:
    if isinstance(marginals, (str, bytes)) or not isinstance(marginals, Iterable):
        raise ShapeError("marginals must be a list of attribute sets (names or indices)")
    out = [domain.axes(m) for m in marginals]
    if not out:
        raise ShapeError("the workload has no marginal")
    if len(set(out)) != len(out):
        raise ShapeError("a marginal is listed twice")
    return out


def _coefficients(domain: Domain, marginals: list[tuple[int, ...]], weights: np.ndarray
                  ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """Residuals (closure minus those touching a size-1 attribute), ``c_A`` and ``p_A``."""
    if len(marginals) >= _VECTOR_MIN:
        fast = _coefficients_fast(domain, marginals, weights)
        if fast is not None:
            return fast
    return _coefficients_loop(domain, marginals, weights)


def residual_coefficients(domain: Domain, marginals: list[tuple[int, ...]], weights: np.ndarray
                          ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """``(residuals, c_A, p_A)`` of a marginal workload (sorted index tuples, one weight each): the
    residuals of its closure that have a non-zero dimension, the workload's weight on each
    (``c_A = sum_{S >= A} w_S prod_{i in S} 1 / n_i prod_{i in A} (n_i - 1) n_i``) and its squared
    sensitivity ``p_A = prod_{i in A} (n_i - 1) / n_i`` (Xiao et al., NeurIPS 2023): the optimum
    sum of variances is ``(sum_A sqrt(c_A p_A))^2 / (2 rho)``."""
    return _coefficients(domain, list(marginals), np.asarray(weights, dtype=np.float64))


def _coefficients_loop(domain: Domain, marginals: list[tuple[int, ...]], weights: np.ndarray
                       ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray]:
    """:func:`_coefficients` one marginal and one subset at a time (the reference)."""
    sizes = domain.sizes
    logm1 = [math.log(n - 1) if n > 1 else -math.inf for n in sizes]
    logn = [math.log(n) for n in sizes]
    c: dict[tuple[int, ...], float] = {}
    for S, w in zip(marginals, weights):
        if w == 0:
            continue
        base = -sum(logn[i] for i in S)  # prod_{S} 1/n
        lw = math.log(w)
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                la = sum(logm1[i] + logn[i] for i in A)  # prod_A (n-1) * n (undoes the 1/n of A)
                if la == -math.inf:
                    continue
                c[A] = c.get(A, 0.0) + math.exp(lw + base + la)
    residuals = sorted(c, key=lambda a: (len(a), a))
    cv = np.array([c[A] for A in residuals])
    pv = np.array([math.prod((sizes[i] - 1) / sizes[i] for i in A) for A in residuals])
    return residuals, cv, pv


def _cell_factors(domain: Domain, marginals: list[tuple[int, ...]], index: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each marginal: (residual positions A subset S, f_{S,A})."""
    sizes = domain.sizes
    out = []
    for S in marginals:
        js, fs = [], []
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                j = index.get(A)
                if j is None:
                    continue
                f = 1.0
                for i in S:
                    f *= (sizes[i] - 1) / sizes[i] if i in A else 1.0 / (sizes[i] ** 2)
                js.append(j), fs.append(f)
        out.append((np.array(js, dtype=np.int64), np.array(fs)))
    return out


#: Below this many marginals the one-at-a-time loops are as fast as the vectorised paths.
_VECTOR_MIN = 16
#: Rows x subsets per block in the vectorised per-cell variances (bounds the temporaries).
_BLOCK = 1 << 21


def _exact_cost(pv: np.ndarray, sigma2: np.ndarray) -> Fraction:
    """``sum_A p_A / (2 sigma_A^2)`` in exact rational arithmetic, each distinct ``(p_A, sigma_A^2)``
    pair once times its count (residuals of one shape share both: a few terms, not one per residual)."""
    pairs, counts = np.unique(np.stack([np.asarray(pv, dtype=np.float64), np.asarray(sigma2, dtype=np.float64)],
                                       axis=1), axis=0, return_counts=True)
    return sum((Fraction(float(p)) * int(k) / (2 * Fraction(float(v)))
                for (p, v), k in zip(pairs.tolist(), counts.tolist())), Fraction(0))


def _by_order(d: int, marginals: list[tuple[int, ...]]) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """The marginals grouped by order: ``{r: (positions, (m, r) index array)}``, or ``None`` unless
    every marginal is a strictly increasing tuple of ints in ``0..d-1`` whose subsets' keys fit in
    an int64 (:func:`_tuple_keys`)."""
    groups: dict[int, list[int]] = {}
    for j, S in enumerate(marginals):
        groups.setdefault(len(S), []).append(j)
    out = {}
    for r, pos in groups.items():
        if r and r * math.log2(max(d, 2)) >= 62:
            return None
        try:
            M = np.array([marginals[j] for j in pos], dtype=np.int64).reshape(len(pos), r)
        except (TypeError, ValueError, OverflowError):
            return None
        if not all(type(a) is int for j in pos for a in marginals[j]):
            return None
        if r and (M.min() < 0 or M.max() >= d or (r > 1 and np.any(np.diff(M, axis=1) <= 0))):
            return None
        out[r] = (np.asarray(pos, dtype=np.int64), M)
    return out


def _tuple_keys(A: np.ndarray, d: int) -> np.ndarray:
    """Integer keys of the rows of ``A`` (sorted index tuples of one length): base-``d`` digits, so
    the keys of one length sort as the tuples do."""
    key = np.zeros(A.shape[0], dtype=np.int64)
    for j in range(A.shape[1]):
        key = key * d + A[:, j]
    return key


def _residual_keys(d: int, residuals: Sequence[tuple[int, ...]]) -> dict[int, np.ndarray] | None:
    """``{order: sorted keys}`` of the residuals (sorted by (order, indices), so each order's keys
    are increasing and its positions are an offset plus the rank); ``None`` if a key overflows."""
    by: dict[int, list[tuple[int, ...]]] = {}
    for A in residuals:
        by.setdefault(len(A), []).append(A)
    if any(q * math.log2(max(d, 2)) >= 62 for q in by if q):
        return None
    return {q: _tuple_keys(np.array(As, dtype=np.int64).reshape(len(As), q), d) for q, As in by.items()}


def _coefficients_fast(domain: Domain, marginals: list[tuple[int, ...]], weights: np.ndarray
                       ) -> tuple[list[tuple[int, ...]], np.ndarray, np.ndarray] | None:
    """:func:`_coefficients_loop` vectorised over the marginals of each order, with the same
    floating-point operations in the same order (``math.log`` / ``math.exp`` on the distinct values,
    each ``c_A`` summed over its marginals in workload order): bit-identical.  ``None`` when the
    marginals are not plain sorted index tuples (the loop handles those)."""
    sizes = domain.sizes
    d = len(sizes)
    keep = [j for j, w in enumerate(weights) if w != 0]
    groups = _by_order(d, [marginals[j] for j in keep])
    if groups is None:
        return None
    logm1 = np.array([math.log(n - 1) if n > 1 else -math.inf for n in sizes] or [0.0])
    logn = np.array([math.log(n) for n in sizes] or [0.0])
    lmn = logm1 + logn  # logm1[i] + logn[i], as the loop adds them
    wk = np.asarray(weights, dtype=np.float64)[keep]
    uw, winv = np.unique(wk, return_inverse=True)
    lw_all = np.array([math.log(x) for x in uw.tolist()])[winv.reshape(-1)]
    keys: dict[int, list[np.ndarray]] = {}
    ent_key, ent_pos, ent_arg, ent_q = [], [], [], []
    for r, (pos, M) in groups.items():
        lw = lw_all[pos]
        if r:
            acc = logn[M[:, 0]].copy()
            for j in range(1, r):
                acc = acc + logn[M[:, j]]
            base = -acc
        else:
            base = np.zeros(len(pos))
        lwb = lw + base
        for q in range(r + 1):
            for P in combinations(range(r), q):
                A = M[:, list(P)]
                if q:
                    la = lmn[A[:, 0]].copy()
                    for j in range(1, q):
                        la = la + lmn[A[:, j]]
                    ok = la != -np.inf
                    arg = lwb[ok] + la[ok]
                    A, p_ = A[ok], pos[ok]
                else:
                    arg, p_ = lwb + 0.0, pos
                k = _tuple_keys(A, d)
                ent_key.append(k), ent_pos.append(p_), ent_arg.append(arg), ent_q.append(np.full(k.size, q))
                keys.setdefault(q, []).append(k)
    if not ent_key:
        return [], np.array([]), np.array([])
    ukeys = {q: np.unique(np.concatenate(ks)) for q, ks in sorted(keys.items())}
    ukeys = {q: u for q, u in ukeys.items() if u.size}
    offsets, o = {}, 0
    for q, u in ukeys.items():
        offsets[q] = o
        o += u.size
    ids = np.concatenate([offsets[int(qs[0])] + np.searchsorted(ukeys[int(qs[0])], k) if k.size else k
                          for k, qs in zip(ent_key, ent_q)])
    arg = np.concatenate(ent_arg)
    ua, ainv = np.unique(arg, return_inverse=True)
    val = np.array([math.exp(x) for x in ua.tolist()])[ainv.reshape(-1)]
    order = np.argsort(np.concatenate(ent_pos), kind="stable")  # each c_A summed in workload order
    cv = np.bincount(ids[order], weights=val[order], minlength=o)
    ratio = np.array([(n - 1) / n for n in sizes] or [1.0])
    residuals: list[tuple[int, ...]] = []
    pvs = []
    for q, u in ukeys.items():
        A = np.empty((u.size, q), dtype=np.int64)
        rest = u.copy()
        for j in range(q - 1, -1, -1):
            A[:, j] = rest % d
            rest //= d
        residuals.extend(map(tuple, A.tolist()))
        if q:
            pq = ratio[A[:, 0]].copy()
            for j in range(1, q):
                pq = pq * ratio[A[:, j]]
        else:
            pq = np.ones(u.size)
        pvs.append(pq)
    return residuals, cv, np.concatenate(pvs)


def _cells(domain: Domain, ms: list[tuple[int, ...]]) -> np.ndarray:
    """Cells per marginal as float64 (the int product, rounded once)."""
    sizes = domain.sizes
    if len(ms) >= _VECTOR_MIN and sizes and sum(math.log2(s) for s in sizes) < 62:
        groups = _by_order(len(sizes), ms)
        if groups is not None:
            sz = np.array(sizes, dtype=np.int64)
            out = np.empty(len(ms), dtype=np.float64)
            for r, (pos, M) in groups.items():
                out[pos] = np.prod(sz[M], axis=1) if r else 1
            return out
    return np.array([math.prod(sizes[i] for i in S) for S in ms], dtype=np.float64)


def _cell_variances_fast(domain: Domain, ms: list[tuple[int, ...]], keys: dict[int, np.ndarray] | None,
                         sigma2: np.ndarray) -> np.ndarray | None:
    """The per-cell variances of :func:`_cell_factors` + ``np.sum``, vectorised over the marginals of
    each order: ``f_{S,A}`` multiplied attribute by attribute as the loop does, the terms of each
    marginal in the loop's order (subsets by size, then lexicographic; residuals not measured left
    out) summed by ``np.sum`` along rows (the same pairwise sum as on each row alone): bit-identical.
    ``None`` when the marginals are not plain sorted index tuples or the keys overflow."""
    if keys is None:
        return None
    sizes = domain.sizes
    d = len(sizes)
    groups = _by_order(d, ms)
    if groups is None:
        return None
    ratio = np.array([(n - 1) / n for n in sizes] or [1.0])
    inv2 = np.array([1.0 / (n ** 2) for n in sizes] or [1.0])
    offsets, o = {}, 0
    for q, u in keys.items():
        offsets[q] = o
        o += u.size
    out = np.empty(len(ms), dtype=np.float64)
    for r, (pos_all, M_all) in groups.items():
        subsets = [P for q in range(r + 1) for P in combinations(range(r), q)]
        step = max(1, _BLOCK // len(subsets))
        for b in range(0, len(pos_all), step):
            pos, M = pos_all[b:b + step], M_all[b:b + step]
            R, I = ratio[M], inv2[M]
            T = np.empty((len(pos), len(subsets)))
            present = np.ones(T.shape, dtype=bool)
            for c, P in enumerate(subsets):
                inP = set(P)
                f = np.ones(len(pos))
                for j in range(r):
                    f = f * (R[:, j] if j in inP else I[:, j])
                q = len(P)
                u = keys.get(q)
                if u is None or u.size == 0:
                    present[:, c] = False
                    T[:, c] = 0.0
                    continue
                k = _tuple_keys(M[:, list(P)], d)
                at = np.minimum(np.searchsorted(u, k), u.size - 1)
                hit = u[at] == k
                present[:, c] = hit
                T[:, c] = np.where(hit, sigma2[offsets[q] + at] * f, 0.0)
            counts = present.sum(axis=1)
            full = counts == len(subsets)
            if np.all(full):
                out[pos] = T.sum(axis=1)
                continue
            # rows with residuals missing: their present terms first, in order, then sum the first k
            perm = np.argsort(~present, axis=1, kind="stable")
            Tc = np.take_along_axis(T, perm, axis=1)
            for k in np.unique(counts).tolist():
                rows = np.flatnonzero(counts == k)
                out[pos[rows]] = Tc[rows, :k].sum(axis=1) if k else 0.0
    return out


def _max_variance(domain: Domain, marginals: list[tuple[int, ...]], weights: np.ndarray, rho: float,
                  residuals: list[tuple[int, ...]], pv: np.ndarray, start: np.ndarray) -> np.ndarray:
    """``sigma_A^2`` minimising ``max_S w_S v_S`` subject to ``sum_A p_A / (2 sigma_A^2) <= rho``.

    In the precisions ``u_A = 1 / sigma_A^2`` this is convex: minimise ``t`` subject to
    ``sum_A w_S f_{S,A} / u_A <= t`` for every marginal (convex in ``u``) and the linear budget
    ``sum_A p_A u_A <= 2 rho``; solved by SLSQP (scipy) in ``log u`` from the sum-optimal point,
    with analytic gradients.  The paper solves the same program with a generic convex solver."""
    from scipy.optimize import minimize
    import scipy.sparse as sp

    index = {A: i for i, A in enumerate(residuals)}
    facts = _cell_factors(domain, marginals, index)
    rows = np.concatenate([np.full(js.size, k) for k, (js, _) in enumerate(facts)])
    cols = np.concatenate([js for js, _ in facts])
    vals = np.concatenate([fs * weights[k] for k, (_, fs) in enumerate(facts)])
    F = sp.csr_matrix((vals, (rows, cols)), shape=(len(marginals), len(residuals)))
    scale = float(np.max(F @ start))
    z0 = np.concatenate([-np.log(start / scale), [0.0]])  # log u (u in units of 1/scale), then t

    def obj(z):
        return z[-1], np.concatenate([np.zeros(z.size - 1), [1.0]])

    def var_con(z):  # t - F e^{-x} >= 0
        e = np.exp(-z[:-1])
        return z[-1] - F @ e

    def var_jac(z):
        e = np.exp(-z[:-1])
        J = (F.multiply(e[None, :])).toarray()  # d/dx of -F e^{-x} = +F diag(e)
        return np.hstack([J, np.ones((F.shape[0], 1))])

    budget = 2.0 * rho * scale

    def bud_con(z):
        return np.array([1.0 - float(pv @ np.exp(z[:-1])) / budget])

    def bud_jac(z):
        return np.concatenate([-(pv * np.exp(z[:-1])) / budget, [0.0]])[None, :]

    z0[-1] = float(np.max(var_con(np.concatenate([z0[:-1], [0.0]])) * -1.0)) * 1.0001
    res = minimize(obj, z0, jac=True, method="SLSQP",
                   constraints=[{"type": "ineq", "fun": var_con, "jac": var_jac},
                                {"type": "ineq", "fun": bud_con, "jac": bud_jac}],
                   options={"maxiter": 500, "ftol": 1e-12})
    u = np.exp(res.x[:-1]) / scale
    used = float(pv @ u) / (2.0 * rho)
    return (1.0 / u) * max(used, 1.0)  # back on the budget (never above it)


def check_weights(weights: Any, count: int, objective: str) -> np.ndarray:
    """One finite weight ``>= 0`` per marginal, not all 0 (``None``: all 1), and the objective
    ``"sum"`` or ``"max"``; the weights as a float64 array."""
    w = np.ones(count) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != (count,) or not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
        raise InvalidPrivacyParameterError("weights must be one finite value >= 0 per marginal, not all 0")
    if objective not in ("sum", "max"):
        raise SparseDPError(f"objective must be 'sum' or 'max', got {objective!r}")
    return w


def select_residuals(domain: Domain, marginals: Any, rho: float, *, weights: Any = None,
                     objective: str = "sum") -> ResidualSelection:
    """ResidualPlanner's optimal Gaussian noise for the marginal workload ``marginals`` at ``rho``-zCDP.

    ``marginals``: attribute sets (names or indices); ``weights``: one ``>= 0`` per marginal
    (default 1).  ``objective="sum"``: minimise ``sum_S w_S sum_cells Var`` (closed form, see the
    module doc); ``"max"``: minimise ``max_S w_S Var(cell of S)``.  Nothing is measured."""
    import time

    t0 = time.perf_counter()
    r = check_rho(rho, "rho")
    ms = _normalise(domain, marginals)
    w = check_weights(weights, len(ms), objective)
    residuals, cv, pv = _coefficients(domain, ms, w)
    if not residuals:
        raise ShapeError("nothing to measure: every marginal touches only size-1 attributes and has no total")
    root = np.sqrt(cv * pv)
    T = float(root.sum()) / (2.0 * r)
    sigma2 = np.sqrt(pv / cv) * T
    if objective == "max":
        sigma2 = _max_variance(domain, ms, w, r, residuals, pv, sigma2)
    rho_used = float(np.sum(pv / (2.0 * sigma2)))
    if rho_used > r:  # rounding: scale up by the excess (a few ulps)
        sigma2 = sigma2 * (rho_used / r) * (1 + 4e-16)
    # the cost, in exact arithmetic, must not exceed rho as written (budget_fraction: what an Accountant
    # charges; 1/10 for 0.1, below the float): widened by the excess where the float sums fell short
    budget = budget_fraction(r)
    for _ in range(8):
        cost = _exact_cost(pv, sigma2)
        if cost <= budget:
            break
        sigma2 = sigma2 * (float(cost / budget) * (1.0 + 2.0**-50))
    else:  # pragma: no cover
        raise InvalidPrivacyParameterError(f"the selected noise costs more than rho = {r!r}")
    sel = ResidualSelection(domain=domain, marginals=tuple(ms), weights=w, residuals=tuple(residuals),
                            sigma2=sigma2, p=pv, rho=r, objective=objective, value=0.0)
    if objective == "sum":
        value = float(root.sum()) ** 2 / (2.0 * r)
    else:
        value = float(np.max(w * sel.cell_variances(ms)))
    return ResidualSelection(domain=domain, marginals=tuple(ms), weights=w, residuals=tuple(residuals),
                             sigma2=sigma2, p=pv, rho=r, objective=objective, value=value,
                             seconds=time.perf_counter() - t0)
