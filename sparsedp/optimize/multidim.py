"""Multi-dimensional workloads for :func:`sparsedp.optimize` (issue 18, sharing issue 11's entry point).

* :class:`~sparsedp.marginals.MarginalWorkload` (``marginals.marginal_workload(domain, k=2)``):

  - ``noise="gaussian"``: ResidualPlanner's optimum (Xiao et al., NeurIPS 2023) by
    :func:`~sparsedp.marginals.select_residuals` at ``rho = 1``, family ``"residual"``.  It is the
    optimum over all Gaussian linear mechanisms for the workload; the strategy is the
    :class:`~sparsedp.marginals.ResidualSelection` (noise per residual), not one matrix:
    ``MatrixMechanism`` measures it through :func:`~sparsedp.marginals.release_marginals`
    (:mod:`sparsedp.marginals.mechanism`), or release records with that function directly.
  - ``noise="laplace"``: HDMM's weighted-marginals parametrisation (McKenna et al., VLDB 2018) by
    :func:`~sparsedp.marginals.optimize_marginals_laplace` at ``epsilon = 1``, family
    ``"marginals"``; the strategy is the :class:`~sparsedp.marginals.MarginalsStrategy`, released by
    :func:`~sparsedp.marginals.release_marginals_laplace` (``strategy.at(epsilon)``).

* :class:`~sparsedp.marginals.KronOperator` (e.g. ``KronOperator([all_ranges(32)] * 2)``): a
  Kronecker product of optimised 1-D factors by :func:`~sparsedp.optimize.optimize_kron`, family
  ``"kron"``; the strategy is a :class:`~sparsedp.marginals.KronOperator` usable in ``MatrixMechanism``.
  A :class:`~sparsedp.marginals.KronStack` (union of products, e.g. 2-D ranges plus each
  attribute's 1-D ranges) gets one Kronecker strategy whose axes are optimised for the stacked,
  trace-weighted terms (:func:`_union`), never worse than the identity product.

The error is exact in every case: ``(sum_A sqrt(c_A p_A))^2 / 2`` (residual), ``2 Delta_1^2
tr(W^T W (M^T M)^+)`` in the residual basis (marginals), the product of the 1-D traces (kron).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np
import scipy.sparse as sp

from ..accuracy import ErrorReport
from ..errors import ShapeError, SparseDPError
from ..marginals.domain import Domain
from ..marginals.kron import KronOperator, KronStack
from ..marginals.kron_opt import KronStrategy, factor_trace
from ..marginals.pure import optimize_marginals_laplace
from ..marginals.select import select_residuals
from ..marginals.workload import MarginalWorkload
from ..operators import SparseOperator, aslinearoperator
from .candidate import Trial

__all__: list[str] = []  # reached through sparsedp.optimize

MARGINAL_FAMILIES = ("auto", "residual", "marginals")
MAX_LISTED_CELLS = 10**7  # per-cell variances are listed in the ErrorReport up to this many cells


def is_multidim(W: Any) -> bool:
    """Whether ``W`` is a workload this module handles."""
    return isinstance(W, (MarginalWorkload, KronOperator, KronStack))


def _check_domain(domain: Any, sizes: tuple[int, ...], what: str) -> None:
    if domain is None:
        return
    if not isinstance(domain, Domain):
        raise ShapeError(f"domain must be a sparsedp.Domain, got {type(domain).__name__}")
    if tuple(domain.sizes) != tuple(sizes):
        raise ShapeError(f"domain mismatch: the domain has sizes {domain.sizes} but {what} has {tuple(sizes)}")


def _cell_variances(wl: MarginalWorkload, per_cell) -> np.ndarray | None:
    if wl.cells > MAX_LISTED_CELLS:
        return None
    sizes = wl.domain.sizes
    return np.concatenate([np.full(math.prod(sizes[i] for i in S), per_cell(S)) for S in wl.marginals])


def _marginals(wl: MarginalWorkload, model_kind: str, family: str, domain: Any, rng: Any, restarts: Any):
    _check_domain(domain, wl.domain.sizes, "the workload's domain")
    if wl.domain != domain and domain is not None:
        raise ShapeError(f"domain mismatch: the workload is on {wl.domain.names}, not {domain.names}")
    if family not in MARGINAL_FAMILIES:
        raise SparseDPError(f"family for a marginal workload must be one of {MARGINAL_FAMILIES}, got {family!r}")
    t0 = time.perf_counter()
    if model_kind == "gaussian":
        if family == "marginals":
            raise SparseDPError("family 'marginals' is the pure-DP (laplace) strategy; Gaussian noise uses 'residual'")
        sel = select_residuals(wl.domain, wl.marginals, 1.0, weights=wl.weights, objective=wl.objective)
        total = sel.sum_of_variances()
        variances = _cell_variances(wl, sel.cell_variance)
        note = f"objective {wl.objective}: {sel.value:.10g}; {len(sel.residuals)} residuals"
        trial = Trial("residual", "residual optimum", total, time.perf_counter() - t0, note)
        return (sel, "residual", "residual optimum", ErrorReport(total, total / wl.cells, "exact-residual",
                variances=variances, noise="gaussian"), float(math.sqrt(float(np.sum(sel.p)))), (trial,))
    if family == "residual":
        raise SparseDPError("family 'residual' is the Gaussian (zCDP) optimum; Laplace noise uses 'marginals'")
    if not wl.unit_weights or wl.objective != "sum":
        raise SparseDPError("the pure-DP marginals strategy minimises the unweighted sum of squared errors: "
                            "use unit weights and objective='sum'")
    strat = optimize_marginals_laplace(wl.domain, wl.marginals, 1.0, restarts=4 if restarts is None else int(restarts),
                                       rng=0 if rng is None else rng)
    total = float(strat.total_error)
    name = f"weighted marginals ({len(strat.measured)} measured)"
    trial = Trial("marginals", name, total, time.perf_counter() - t0)
    return (strat, "marginals", name, ErrorReport(total, total / wl.cells, "exact-residual", noise="laplace"),
            1.0, (trial,))


def _dedup_factors(K: KronOperator) -> list[Any]:
    """The factors as operators, equal factors as one object (so optimize_kron optimises them once)."""
    out: list[Any] = []
    for F in K.factors:
        Fs = sp.csr_matrix(F)
        for G in out:
            if G.shape == Fs.shape and (G.matrix != Fs).nnz == 0:
                out.append(G)
                break
        else:
            out.append(SparseOperator(Fs, name="workload factor"))
    return out


def _union(K: KronStack, model_kind: str, family: str, options: dict, solve_1d: Callable[..., Any]):
    """One Kronecker strategy ``M = (x)_i M_i`` for a union of products ``[(x)_i W_{t,i}]_t``.

    Exact error: ``Var(Delta(M)) sum_t prod_i tr(W_{t,i}^T W_{t,i} (M_i^T M_i)^{-1})`` (each term's
    trace factors; the sum does not).  Axis ``i`` is optimised by the 1-D :func:`sparsedp.optimize`
    for the stacked workload ``[sqrt(c_{t,i}) W_{t,i}]_t`` with ``c_{t,i} = prod_{j != i}
    ||W_{t,j}||_F^2`` (the other axes' traces under the identity: HDMM's surrogate for unions);
    the identity product is scored too and the better one kept, so it is never worse than identity.
    ``solve_1d``: the 1-D optimiser (:func:`sparsedp.optimize`, which dispatches here).
    """
    t0 = time.perf_counter()
    terms = [[sp.csr_matrix(F) for F in T.factors] for T in K.terms]
    k = len(terms[0])
    if any(len(T) != k for T in terms):
        raise ShapeError("every term of the union must have one factor per attribute")
    frob = np.array([[float(F.multiply(F).sum()) for F in T] for T in terms])  # (terms, axes)
    p = 1 if model_kind == "laplace" else 2
    var = (lambda d: 2.0 * d * d) if p == 1 else (lambda d: d * d / 2.0)
    fam = "auto" if family == "kron" else family

    def score(Ms: list) -> tuple[float, float]:
        tr = np.array([[factor_trace(SparseOperator(F), SparseOperator(M)) for F, M in zip(T, Ms)] for T in terms])
        sens = math.prod(float(np.max(np.asarray(abs(M).sum(axis=0)).ravel() if p == 1 else
                                      np.sqrt(np.asarray(M.multiply(M).sum(axis=0)).ravel()))) for M in Ms)
        return var(sens) * float(np.sum(np.prod(tr, axis=1))), sens

    n = [terms[0][i].shape[1] for i in range(k)]
    ident = [sp.identity(m, format="csr") for m in n]
    e_id, s_id = score(ident)
    opt, names = [], []
    for i in range(k):
        c = np.prod(np.delete(frob, i, axis=1), axis=1)
        Wi = sp.vstack([math.sqrt(ct) * T[i] for ct, T in zip(c, terms) if ct > 0], format="csr")
        res = solve_1d(SparseOperator(Wi, name=f"axis {i} union"), noise=model_kind, family=fam,
                          **{"secure": False, **{key: v for key, v in options.items() if v is not None}})
        opt.append(sp.csr_matrix(res.strategy.tosparse())), names.append(res.name)
    e_opt, s_opt = score(opt)
    t1 = time.perf_counter()
    hist = (Trial("kron", "identity (x) ... (x) identity", e_id, 0.0),
            Trial("kron", " (x) ".join(names), e_opt, t1 - t0, "axes optimised for the stacked terms"))
    if e_opt <= e_id:
        return opt, " (x) ".join(names), e_opt, s_opt, hist
    return ident, "identity (x) ... (x) identity", e_id, s_id, hist


def _kron(K: Any, model_kind: str, family: str, domain: Any, options: dict, solve_1d: Callable[..., Any]):
    if isinstance(K, KronStack):
        if any(not isinstance(T, KronOperator) for T in K.terms):
            raise SparseDPError("a union workload must be a KronStack of KronOperators")
        _check_domain(domain, K.terms[0].in_shape, "the union of Kronecker products")
        Ms, name, total, sens, hist = _union(K, model_kind, family, options, solve_1d)
        strat = KronOperator(Ms, name="kron strategy")
        return (strat, "kron", name, ErrorReport(total, total / K.shape[0], "exact-kron", noise=model_kind),
                float(sens), hist)
    _check_domain(domain, K.in_shape, "the Kronecker workload")
    fam = "auto" if family == "kron" else family
    ks = kron_of_factors(_dedup_factors(K), noise=model_kind, solve_1d=solve_1d, family=fam,
                         **{k: v for k, v in options.items() if v is not None})
    total = ks.total_error(epsilon=1.0) if model_kind == "laplace" else ks.total_error(rho=1.0)
    name = " (x) ".join(ks.names)
    trial = Trial("kron", name, total, ks.seconds)
    return (ks.strategy, "kron", name, ErrorReport(total, total / ks.queries, "exact-kron", noise=model_kind),
            float(ks.sensitivity), (trial,))


def optimize_multidim(W: Any, *, model_kind: str, family: str, domain: Any, rng: Any, restarts: Any,
                      options: dict, solve_1d: Callable[..., Any]) -> tuple:
    """``(strategy, family, name, ErrorReport, sensitivity, history)`` for a multi-dimensional ``W``;
    ``solve_1d``: the 1-D optimiser for a Kronecker workload's factors (:func:`sparsedp.optimize`)."""
    if isinstance(W, MarginalWorkload):
        return _marginals(W, model_kind, family, domain, rng, restarts)
    return _kron(W, model_kind, family, domain, dict(options, rng=rng, restarts=restarts), solve_1d)


def kron_of_factors(workload_factors: Sequence[Any], *, noise: str = "laplace", solve_1d: Callable[..., Any],
                    **options: Any) -> KronStrategy:
    """Optimise each factor ``W_i`` with ``solve_1d`` (:func:`sparsedp.optimize`; ``options`` passed
    on, e.g. ``family="auto"``, ``time_limit``, ``rng``) and return their Kronecker product with its
    exact error (:func:`sparsedp.optimize.optimize_kron` is this with the library's optimiser).
    Identical factors are optimised once.  The factors are scored with continuous noise
    (``secure=False`` unless given): the product's noise scale is the product of the factors'
    sensitivities, so its exact discrete noise is within ``O(scale^-2)`` of the continuous one, and a
    factor's own discrete correction says nothing about the product."""
    t0 = time.perf_counter()
    Ws = [aslinearoperator(W) for W in workload_factors]
    if not Ws:
        raise ShapeError("give at least one workload factor")
    p = 1 if noise == "laplace" else 2
    done: dict[int, tuple] = {}
    factors, names, traces, sens = [], [], [], 1.0
    for W in Ws:
        key = id(W)
        if key not in done:
            res = solve_1d(W, noise=noise, **{"secure": False, **options})
            M = res.strategy
            Mm = M.tosparse()
            col = np.asarray(abs(Mm).sum(axis=0)).ravel() if p == 1 else np.sqrt(np.asarray(Mm.multiply(Mm).sum(axis=0)).ravel())
            done[key] = (M, res.name, factor_trace(W, M), float(col.max()))
        M, name, tr, d = done[key]
        factors.append(M), names.append(name), traces.append(tr)
        sens *= d
    return KronStrategy(strategy=KronOperator([M.tosparse() for M in factors], name="kron strategy"),
                        factors=tuple(factors), names=tuple(names), noise=noise, sensitivity=sens,
                        traces=tuple(traces), queries=math.prod(W.shape[0] for W in Ws),
                        seconds=time.perf_counter() - t0)
