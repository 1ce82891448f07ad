"""Marginal releases that never materialise the domain: residuals measured with exact discrete
Gaussian noise through :func:`sparsedp.plan_measurement`, marginals reconstructed by GLS.

Pipeline of :func:`release_marginals` (``rho``-zCDP, neighbours = add or remove one record):

1. **Validate** the records (shape, NaN, codes in range, at most ``max_records``), the budget,
   the generator and the accountant: every error is raised before anything is charged or drawn.
2. **Select** the noise per residual (:func:`~sparsedp.marginals.select.select_residuals`).
3. **Tables**: the marginal table ``t_A`` of every residual ``A`` of the closure: the sets are
   covered greedily by blocks of attributes with at most ``n / 8`` joint cells (``2^10 .. 2^17``), each block's table
   is one ``np.bincount`` of the records' joint codes, each set's table a sum of its block's
   (:func:`marginal_tables`; ``O(n)`` per block, the domain is never formed).
4. **Plan**: residual ``A`` is the query ``Q_A t_A`` (``Q_A`` the Kronecker product of orthonormal
   contrasts, :mod:`~sparsedp.marginals.residual`) on its table.  One record changes ``t_A`` by one
   unit in one cell, so its L2 sensitivity is the largest column norm of ``Q_A``, ``sqrt(p_A)``
   (every column has it).  :func:`~sparsedp.measure.plan_measurement` (``noise="gaussian"``,
   ``scales = sigma_A``, exact noise on the grid ``g``) certifies the loss from the explicit
   entries.  Residuals of the same shape and ``sigma_A`` are measured ``m`` at a time by one plan
   of ``I_m (x) Q_A`` on their stacked tables (one sampler call instead of ``m``); one record
   changes one column of *each* diagonal block, so such a block costs ``m`` times the plan's
   certified per-column loss, and the release's loss is the sum over blocks (zCDP composes
   additively).  ``Q_A`` is irrational, so the exact sampler works on a fine grid: residual
   ``A``'s grid is ``sigma_A / 2^k``, the same power of two ``2^k`` for all, so every plan has the
   sampler scale ``2^k`` (one exact-sampler table for the whole release), and every grid is at
   least ``g = 2^(ceil(log2 max_records) - 49)`` (``|Q_A t_A| / grid <= 2^49``); rounding to the
   grid adds one grid unit per entry to the certified sensitivity (a relative loss increase of
   ~1e-6), and the ``sigma_A`` are scaled up until the certified total is ``<= rho``.
   A residual whose ``Q_A`` has more than ``2^19`` non-zeros (three attributes of size 100:
   ~3.4e8) is never formed: its plan measures the :class:`~sparsedp.marginals.KronOperator` of the
   contrasts by mode products on the table, calibrated from the factors
   (:mod:`~sparsedp.marginals.kron_calibration`: ``Delta_2 = prod_i Delta_2(Q_{n_i}) = sqrt(p_A)``,
   and a factored bound for the grid rounding that is ~1e-6 relatively above the explicit one).
5. **Charge** the accountant once, ``rho`` (zCDP composes additively over the residuals; every
   record touches every residual), with one ledger entry; **then** draw each residual's noise with
   its plan (``plan.measure``, no second charge).
6. **Reconstruct** every marginal ``S``: ``t_S = sum_{A subset S} K_{S,A} y_A`` (the residual rows
   are orthogonal and each residual is measured once with i.i.d. noise, so this is the GLS
   estimate); each cell's variance is ``sum_A Var_A f_{S,A}`` with the plans' exact discrete
   variances ``Var_A``.
"""

from __future__ import annotations

import math
import time
from functools import lru_cache
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import InputBoundError, InvalidPrivacyParameterError, ShapeError, SparseDPError
from ..measure import MeasurementPlan, plan_measurement
from ..noise import SecureRandomBits, as_generator
from ..operators import SparseOperator
from ..privacy import Accountant, LedgerEntry, PrivacyCost, ledger_time
from ..releases import ReleaseMethods, ReleaseResult, register_reader
from ..validation import check_counts, check_rho
from .domain import Domain, requested_names
from .kron import KronOperator, apply_factors
from .residual import cell_variance_factor, contrast_basis, residual_operator
from .select import ResidualSelection, select_residuals
from .units import declared_unit, prepare_unit, unit_entry, unit_ids_from, unit_loss, unit_record

__all__ = ["MarginalRelease", "release_marginals", "marginal_tables", "marginals_result"]


@dataclass(frozen=True)
class MarginalRelease(ReleaseMethods):
    """Released marginals, their exact variances and the privacy spent (no record is kept).

    :meth:`to_release` is the :class:`~sparsedp.releases.ReleaseResult` of every cell of the
    workload's marginals (one answer per cell, its exact variance); ``confidence_intervals(level)``,
    ``save(path)`` and ``to_pandas()`` go through it."""

    domain: Domain
    selection: ResidualSelection
    marginals: dict  # {attribute names: reconstructed table (float array of the marginal's shape)}
    variances: dict  # {attribute names: per-cell variance (the same in every cell)}
    residuals: dict  # {residual (index tuple): noisy residual vector y_A}
    residual_variances: dict  # {residual: per-entry noise variance (exact, data units^2)}
    cost: PrivacyCost  # charged once
    loss: float  # certified sum of the residual plans' losses (<= cost.rho)
    entry: LedgerEntry
    secure: bool
    private: bool
    seconds: dict = field(default_factory=dict)  # select / tables / plan / measure / reconstruct
    #: the marginals as the user named them, in the order given (attribute names in the order given):
    #: :meth:`to_release` answers in this order, each table's axes in this order
    requested: tuple = ()
    privacy_unit: Any = None  # the concrete PrivacyUnit (None: one record)
    bound_choice: Any = None  # the BoundChoice of max_rows="auto" (charged before the release)

    def marginal(self, attrs: Any) -> np.ndarray:
        """Any marginal whose every subset was measured (the workload's and their sub-marginals),
        reconstructed from the noisy residuals (post-processing: no budget); its axes in the order
        ``attrs`` names them (``marginal(["sex", "age"])`` is sex x age)."""
        S = self.domain.axes(attrs)
        key = tuple(self.domain.names[i] for i in S)
        table = self.marginals[key] if key in self.marginals else _reconstruct(self.domain, S, self.residuals)
        named = requested_names(self.domain, [attrs])[0]
        return np.transpose(np.asarray(table), [key.index(a) for a in named]) if named != key else table

    def cell_variance(self, attrs: Any) -> float:
        """Exact per-cell variance of :meth:`marginal` ``(attrs)``."""
        S = self.domain.axes(attrs)
        return _cell_variance(self.domain, S, self.residual_variances)

    def sum_of_variances(self) -> float:
        """``sum over the workload's marginals and cells of Var``: the realised objective."""
        return float(sum(self.variances[k] * math.prod(self.domain.sizes[self.domain.names.index(a)] for a in k)
                         for k in self.marginals))

    def to_release(self, *, description: dict | None = None, categories: dict | None = None,
                   private: bool | None = None) -> ReleaseResult:
        """Every cell of the workload's marginals as one answer (:func:`marginals_result`: labels
        ``marginal`` and one column per attribute, ``-1`` where it is summed out), its exact
        variance, the ledger entry; ``categories``: ``{attribute: [names]}`` of the public domain,
        kept in the description."""
        desc = {"domain": {"names": list(self.domain.names), "sizes": list(self.domain.sizes)},
                "rho": self.cost.rho, "certified_rho": self.loss, "sum_of_variances": self.sum_of_variances()}
        if categories is not None:
            desc["categories"] = categories
        desc, ledger = unit_record(desc, self.entry, self.privacy_unit, self.bound_choice, "rho")
        desc.update(description or {})
        return marginals_result(self.domain.names, self.domain.sizes,
                                requested_tables(self.domain, self.requested, self.marginals, self.variances),
                                noise="gaussian", secure=bool(self.secure), ledger=ledger,
                                private=bool(self.private) if private is None else private, description=desc,
                                strategy=f"ResidualPlanner: {len(self.residuals)} residuals measured with "
                                "Gaussian noise, marginals by GLS", source=self)


#: Label names a marginal release uses itself: an attribute of one of these names is labelled
#: ``attribute_NAME`` (:func:`label_column`).
RESERVED_LABELS = ("marginal", "answer", "variance", "lower", "upper")


def label_column(attribute: str) -> str:
    """The label of an attribute's codes in a marginal release (:func:`marginals_result`): its name,
    or ``attribute_NAME`` for a name the release's table uses itself (``marginal``, ``lower``, ...)."""
    return f"attribute_{attribute}" if attribute in RESERVED_LABELS else attribute


def requested_tables(domain: Domain, requested: Any, tables: dict, variances: dict) -> list:
    """``[(attribute names, table, per-cell variance)]`` in the order the user asked for them, each
    table's axes in the order of its names (``tables`` are keyed by names in the domain's order);
    without ``requested``, ``tables`` as they are."""
    if not requested:
        return [(k, t, variances[k]) for k, t in tables.items()]
    out = []
    for names in requested:
        key = tuple(sorted(names, key=domain.names.index))
        perm = [key.index(a) for a in names]
        out.append((tuple(names), np.transpose(np.asarray(tables[key]), perm), variances[key]))
    return out


def marginals_result(names: Any, sizes: Any, tables: Any, **fields: Any) -> ReleaseResult:
    """The :class:`~sparsedp.releases.ReleaseResult` of marginal tables: ``tables`` lists
    ``(attribute names, table, per-cell variance)``; one answer per cell, in C order table by
    table, labelled ``marginal`` (the attributes joined by ``","``) and one column per attribute of
    the domain (``names``; the cell's code, ``-1`` where the attribute is summed out)."""
    names = [str(a) for a in names]
    cols = {label_column(a): a for a in names}
    answers, marg, var = [], [], []
    codes: dict[str, list[np.ndarray]] = {a: [] for a in names}
    for attrs, table, v in tables:
        attrs = tuple(str(a) for a in attrs)
        t = np.asarray(table, dtype=np.float64)
        shape = tuple(int(sizes[names.index(a)]) for a in attrs)
        if t.shape != shape:
            t = t.reshape(shape)
        m = t.size
        idx = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=np.int64)
        answers.append(t.reshape(-1))
        marg.append(np.full(m, ",".join(attrs)))
        var.append(np.full(m, float(v)))
        for a in names:
            codes[a].append(idx[attrs.index(a)].astype(np.int64) if a in attrs else np.full(m, -1, dtype=np.int64))
    cat = (lambda parts, dtype: np.concatenate(parts) if parts else np.zeros(0, dtype=dtype))
    labels = {"marginal": cat(marg, str)}
    for col, a in cols.items():
        labels[col] = cat(codes[a], np.int64)
    fields.setdefault("variance_method", "exact-residuals")
    return ReleaseResult(kind="marginals", answers=cat(answers, np.float64), labels=labels,
                         variances=cat(var, np.float64), **fields)


def marginals_from_json(meta: dict, path: str | None = None) -> ReleaseResult:
    """The :class:`~sparsedp.releases.ReleaseResult` of the JSON ``sparsedp marginals --out`` writes
    (its ``ledger``; files of earlier versions without one get an entry from their ``privacy``)."""
    dom = meta["domain"]
    priv = meta.get("privacy") or {}
    ledger = meta.get("ledger")
    if ledger is None and priv.get("rho") is not None:  # an earlier file: its measurement from its privacy block
        ledger = [{"label": "marginals", "rho": priv["rho"], "epsilon": 0.0, "noise": priv.get("noise"),
                   "secure": priv.get("secure"), "private": priv.get("private")}]
    # no measurement recorded (and none to read from a privacy block): an empty ledger, not private
    desc = {k: meta[k] for k in ("domain", "categories", "objective", "sum_of_variances", "privacy_unit",
                                 "privacy_unit_bound") if k in meta}
    desc.update(rho=priv.get("rho"), certified_rho=priv.get("certified_rho"))
    if "neighbours" in priv:
        desc["neighbours"] = priv["neighbours"]
    return marginals_result(dom["names"], dom["sizes"],
                            [(m["attributes"], m["counts"], m["cell_variance"]) for m in meta["marginals"]],
                            noise=priv.get("noise", "gaussian"), secure=bool(priv.get("secure", True)), ledger=ledger,
                            private=bool(meta.get("private", priv.get("private", True))), description=desc,
                            strategy="ResidualPlanner: residuals measured with Gaussian noise, marginals by GLS",
                            path=path)


def marginal_tables(X: np.ndarray, domain: Domain, sets: list[tuple[int, ...]], *, max_cells: int = 2**17,
                    chunk: int = 2**18) -> dict:
    """``{A: t_A}`` for every set in ``sets`` (index tuples) from encoded records ``X`` (n x d).

    The sets are covered greedily by *blocks* of attributes whose joint table has at most
    ``max_cells`` cells (e.g. 5 attributes of size 10 hold 10 triples); each block's table is one
    ``np.bincount`` of the records' joint codes (records in chunks of ``chunk``: memory
    ``O(chunk + max_cells)``), and each set's table is its block's table summed over the other
    attributes.  ``O(n)`` per block; the domain is never formed."""
    cols = np.asarray(X).T
    sizes = domain.sizes
    n = cols.shape[1] if cols.ndim == 2 else 0
    tables: dict[tuple[int, ...], np.ndarray] = {}
    for block, members in _cover(list(sets), sizes, max_cells):
        shape = domain.shape(block)
        cells = math.prod(shape)
        counts = np.zeros(cells, dtype=np.int64)
        dtype = np.int32 if cells < 2**31 else np.intp  # int32 codes: half the memory traffic
        if block:
            for a in range(0, n, chunk):
                c = cols[:, a:a + chunk]
                code = c[block[0]].astype(dtype)
                for i in block[1:]:
                    code *= sizes[i]
                    code += c[i]
                counts += np.bincount(code, minlength=cells)
        else:
            counts[0] = n
        table = counts.astype(np.float64).reshape(shape)
        for k in members:
            A = sets[k]
            drop = tuple(j for j, i in enumerate(block) if i not in A)
            tables[A] = table.sum(axis=drop) if drop else table
    return {A: tables[A] for A in sets}


def tables_from_counts(counts: np.ndarray, domain: Domain, sets: list[tuple[int, ...]]) -> dict:
    """``{A: t_A}`` for every set in ``sets`` (index tuples) from a histogram over the whole domain
    (C order: the layout of :func:`sparsedp.workloads.marginals`): the histogram summed over the
    attributes not in ``A``."""
    full = np.asarray(counts, dtype=np.float64).reshape(domain.sizes)
    out = {}
    for A in sets:
        drop = tuple(i for i in range(len(domain)) if i not in A)
        out[A] = full.sum(axis=drop) if drop else full.copy()
    return out


def _records_or_counts(records: Any, counts: Any, domain: Domain) -> tuple[Any, Any, int]:
    """``(codes, None, n)`` from records, or ``(None, histogram, n)`` from ``counts``; checked."""
    if counts is None:
        X = domain.encode(records)
        return X, None, int(X.shape[0])
    if records is not None:
        raise SparseDPError("give the records or counts=, not both")
    hist = check_counts(counts, math.prod(domain.sizes), "counts")
    return None, hist, int(hist.sum())


def _cover(sets: list[tuple[int, ...]], sizes: tuple[int, ...], max_cells: int
           ) -> list[tuple[tuple[int, ...], list[int]]]:
    """Greedy blocks of attributes (joint table of at most ``max_cells`` cells, or a single set if
    larger) covering every set: ``[(block, [indices of the sets it is the first to cover]), ...]``."""
    d = len(sizes)
    masks = np.array([sum(1 << i for i in A) for A in sets], dtype=np.uint64)
    uncovered = np.ones(len(sets), dtype=bool)
    logs = [math.log(s) for s in sizes]
    limit = math.log(max(int(max_cells), 1)) + 1e-9
    out = []
    for k in sorted(range(len(sets)), key=lambda j: (-len(sets[j]), sets[j])):
        if not uncovered[k]:
            continue
        block = set(sets[k])
        bmask = np.uint64(masks[k])
        size = sum(logs[i] for i in block)
        cur = int(np.count_nonzero(uncovered & ((masks & ~bmask) == 0)))
        while True:
            best, gain = None, cur
            for i in range(d):
                if i in block or size + logs[i] > limit:
                    continue
                m = bmask | np.uint64(1 << i)
                g = int(np.count_nonzero(uncovered & ((masks & ~m) == 0)))
                if g > gain:
                    best, gain = i, g
            if best is None:
                break
            block.add(best)
            bmask |= np.uint64(1 << best)
            size += logs[best]
            cur = gain
        hit = np.flatnonzero(uncovered & ((masks & ~bmask) == 0))
        uncovered[hit] = False
        out.append((tuple(sorted(block)), hit.tolist()))
    return out


def _reconstruct(domain: Domain, S: tuple[int, ...], y: dict) -> np.ndarray:
    """``t_S = sum_{A subset S} K_{S,A} y_A``: :func:`_reconstruct_batch` of the one marginal."""
    return _reconstruct_batch(domain, [S], y)[0]


def _reconstruct_batch(domain: Domain, group: list[tuple[int, ...]], y: dict) -> list[np.ndarray]:
    """``t_S = sum_{A subset S} K_{S,A} y_A`` for marginals of one table shape at once, as one
    Kronecker transform batched over a leading axis: the residuals are placed in an array of the
    marginal's shape (index 0 on an axis = "attribute not in A", 1..n-1 = the contrast
    coordinates) and each axis is mapped by ``B_n = [1/n | Q_n^T]`` (n x n)."""
    sizes_S = domain.shape(group[0])
    Z = np.zeros((len(group),) + sizes_S)
    for b, S in enumerate(group):
        for r in range(len(S) + 1):
            for A in combinations(S, r):
                if A not in y:
                    if all(domain.sizes[i] > 1 for i in A):
                        raise ShapeError(f"the residual {A} of marginal {S} was not measured")
                    continue
                idx = (b,) + tuple(slice(1, None) if i in A else 0 for i in S)
                Z[idx] = np.asarray(y[A]).reshape(tuple(domain.sizes[i] - 1 for i in A))
    if not sizes_S:
        return list(Z)
    T = apply_factors([_extended_basis(n) for n in sizes_S], Z, axes=range(1, len(sizes_S) + 1))
    return list(T)


@lru_cache(maxsize=256)
def _extended_basis(n: int) -> np.ndarray:
    return np.hstack([np.full((n, 1), 1.0 / n), contrast_basis(n).toarray().T])


def _cell_variance(domain: Domain, S: tuple[int, ...], var: dict) -> float:
    sizes_S = domain.shape(S)
    v = 0.0
    for r in range(len(S) + 1):
        for A in combinations(S, r):
            if A in var:
                v += var[A] * cell_variance_factor(sizes_S, tuple(S.index(i) for i in A))
    return v


def _grid(max_records: int) -> float:
    """The exact sampler's grid: ``|Q_A t_A| <= ||t_A||_2 <= n``, and ``n / g <= 2^49``."""
    return 2.0 ** (math.ceil(math.log2(max(int(max_records), 2))) - 49)


_BLOCK_NNZ = 2**19  # non-zeros of one block plan's explicit matrix (I_m (x) Q_A)
# A residual whose Q_A has more non-zeros than this is measured implicitly: a KronOperator of its
# contrasts (mode products on the table), calibrated from the factors by
# sparsedp.marginals.kron_calibration (Delta_2 = prod_i Delta_2(Q_{n_i}) = sqrt(p_A) up to the grid
# bound); Q_A of three attributes of size 100 has ~3.4e8 non-zeros, its table 10^6 cells.
_IMPLICIT_NNZ = _BLOCK_NNZ


def fit_residual_plans(sel: ResidualSelection, rho: float, secure: bool, max_records: int = 2**24
                       ) -> tuple[list[tuple[MeasurementPlan, list[int]]], Fraction, np.ndarray]:
    """``(plans, certified total loss, sigma_A^2)``: the residual plans of ``sel`` (:func:`_plans`)
    with every ``sigma_A^2`` scaled up until the certified total fits ``rho`` (exact noise: its grid
    rounding costs a little; ``max_records`` fixes the grid).  What :func:`release_marginals`
    measures; the plans' variances are those of the noise drawn."""
    g = _grid(max_records)
    sigma2 = sel.sigma2.copy()
    for it in range(8):
        plans, total = _plans(sel, sigma2, bool(secure), g)
        if total <= Fraction(rho):
            return plans, total, sigma2
        # the grid-rounding part of the loss does not shrink as 1 / sigma^2: a margin growing 100x
        # per round (1e-12, 1e-10, ...) ends the loop in a few rounds for any such part
        sigma2 = sigma2 * (float(total / Fraction(rho)) * (1 + 1e-12 * 100.0**it))
    raise InvalidPrivacyParameterError("could not fit the residual plans into rho")  # pragma: no cover


def residual_variances(sel: ResidualSelection, plans: list[tuple[MeasurementPlan, list[int]]]
                       ) -> dict[tuple[int, ...], float]:
    """``{residual: per-entry noise variance}`` of the plans (exact for exact noise)."""
    out = {}
    for plan, chunk in plans:
        v = float(plan.variances()[0]) if plan.rows else 0.0
        for j in chunk:
            out[sel.residuals[j]] = v
    return out


def _plans(sel: ResidualSelection, sigma2: np.ndarray, secure: bool, g: float
           ) -> tuple[list[tuple[MeasurementPlan, list[int]]], Fraction]:
    """Block plans: the residuals with the same table shape and ``sigma_A`` are measured ``m`` at a
    time by one plan of ``I_m (x) Q_A`` on their stacked tables (``m`` up to ``_BLOCK_NNZ`` non-zeros;
    same rows, scales and noise law as ``m`` separate plans, one sampler call instead of ``m``).
    One record changes one cell of *each* stacked table, i.e. one column in each of the ``m``
    diagonal blocks, so a block costs ``m`` times its plan's certified per-column loss: the total
    returned is ``sum_blocks m * plan.loss`` (zCDP composes additively), an exact rational."""
    # One sampler scale for every residual: the grid of residual A is sigma_A / 2^k (exact: a power
    # of two), so every plan's sampler scale is 2^k and the exact sampler builds one table.  The
    # grids are at least g (sigma_A / 2^k >= sigma_min / 2^k >= g), so |Q_A t_A| / grid <= 2^49 still.
    sig = np.sqrt(sigma2)
    k = min(39, math.floor(math.log2(float(sig.min()) / g))) if secure else 0
    shared = secure and k >= 24
    groups: dict[tuple, list[int]] = {}
    for j, (A, s2) in enumerate(zip(sel.residuals, sigma2)):
        groups.setdefault((sel.domain.shape(A), float(s2)), []).append(j)
    cache: dict[tuple, MeasurementPlan] = {}
    out = []
    total = Fraction(0)
    for (shape, s2), members in groups.items():
        factors = residual_operator(shape).factors
        nnz = math.prod(int(sp.csr_matrix(F).nnz) for F in factors)
        implicit = nnz > _IMPLICIT_NNZ
        m_max = max(1, _BLOCK_NNZ // max(nnz, 1))
        for a in range(0, len(members), m_max):
            chunk = members[a:a + m_max]
            m = len(chunk)
            plan = cache.get((shape, s2, m))
            if plan is None:
                name = f"I_{m} (x) residual{shape}"
                if implicit:  # mode products; calibrated from the factors (kron_calibration)
                    M = KronOperator(([sp.identity(m, format="csr")] if m > 1 else []) + list(factors), name=name)
                else:
                    Q = residual_operator(shape).tosparse()
                    M = SparseOperator(Q if m == 1 else sp.kron(sp.identity(m, format="csr"), Q, format="csr"),
                                       name=name)
                sigma = math.sqrt(s2)
                grid = (sigma / 2.0**k if shared else g) if secure else 1.0
                plan = plan_measurement(M, scales=sigma, noise="gaussian", secure=secure, grid=grid)
                cache[(shape, s2, m)] = plan
            out.append((plan, chunk))
            total += m * Fraction(plan.loss)
    return out, total


def release_marginals(
    records: Any,
    domain: Domain,
    marginals: Any,
    rho: float,
    *,
    weights: Any = None,
    objective: str = "sum",
    accountant: Accountant | None = None,
    rng: Any = None,
    secure: bool = True,
    max_records: int = 2**24,
    label: str = "marginals",
    counts: Any = None,
    privacy_unit: Any = None,
    unit_ids: Any = None,
    drop_missing_units: bool = False,
) -> MarginalRelease:
    """Release ``marginals`` of ``records`` on ``domain`` under ``rho``-zCDP (see the module doc).

    ``records``: ``(n, d)`` integer codes, a structured array or a DataFrame (:meth:`Domain.encode`).
    ``marginals``: attribute sets (names or indices).  ``weights`` / ``objective``: as in
    :func:`~sparsedp.marginals.select.select_residuals`.  ``secure=True`` (default): exact discrete
    Gaussian noise; ``rng`` an ``int`` / ``Generator`` gives reproducible, **non-private** noise.
    ``max_records``: a public bound on ``n`` that fixes the exact sampler's grid; more records raise
    :class:`InputBoundError` before anything is spent.  ``counts`` (with ``records=None``): the data
    as a histogram over the whole domain instead (C order, length ``prod(sizes)``: what
    ``MatrixMechanism`` measures).

    The marginals come back in the order given (:attr:`MarginalRelease.marginals` is keyed by the
    attribute names in the domain's order; :meth:`MarginalRelease.to_release` answers marginal by
    marginal in the order given, each table's cells in C order over its attributes *as named*).

    ``privacy_unit`` (default: one record): a :class:`~sparsedp.privacy_unit.PrivacyUnit` whose
    ids are the DataFrame's ``privacy_unit.column`` or ``unit_ids`` (one per record); each unit
    keeps at most ``max_rows`` records (or ``max_groups`` cells of the full domain with
    ``max_rows_per_group`` in each), and the release runs at ``rho / L^2`` so that one whole unit
    costs at most ``rho`` (:mod:`sparsedp.marginals.units`); ``max_rows="auto"`` spends a share of
    ``rho`` on the bound first.  ``drop_missing_units``: drop records without an id (else refused)."""
    t0 = time.perf_counter()
    r = check_rho(rho, "rho")
    if accountant is not None and not isinstance(accountant, Accountant):
        raise InvalidPrivacyParameterError(f"accountant must be an Accountant, got {type(accountant).__name__}")
    unit = declared_unit(privacy_unit, drop_missing_units)
    if unit is not None and counts is not None:
        raise SparseDPError("a privacy unit needs the records (with their unit ids), not counts=")
    X, hist, n_records = _records_or_counts(records, counts, domain)
    ids = unit_ids_from(records, unit_ids, unit, n_records) if counts is None else None
    if n_records > int(max_records):
        raise InputBoundError(f"more records than max_records={int(max_records)} (the grid's bound; raise it to a "
                              "public bound on the number of records)")
    seeded = rng is not None and not (isinstance(rng, SecureRandomBits) and rng.secure)
    gen = rng if rng is None or isinstance(rng, SecureRandomBits) else as_generator(rng)
    if not isinstance(marginals, (str, bytes)) and hasattr(marginals, "__iter__"):
        marginals = list(marginals)  # read twice below: an iterator once
    requested = requested_names(domain, marginals)
    sel = select_residuals(domain, marginals, r, weights=weights, objective=objective)
    measured = set(sel.residuals)
    for S in sel.marginals:  # every marginal must be answerable (a zero weight drops residuals)
        for k in range(len(S) + 1):
            for A in combinations(S, k):
                if A not in measured and all(domain.sizes[i] > 1 for i in A):
                    raise InvalidPrivacyParameterError(
                        f"marginal {S} needs residual {A}, which no positive weight asks for: give it a weight > 0")
    up, r_fit = None, r
    if unit is not None:  # every check above: now the truncation (and the bound's choice, charged)
        up = prepare_unit(X, domain, ids, unit, noise="gaussian", budget=r, accountant=accountant, rng=gen,
                          drop_missing=bool(drop_missing_units))
        X, n_records, r = up.X, int(up.X.shape[0]), up.budget
        r_fit = up.unit.row_budget("gaussian", r)  # rho / L^2 per record: rho per unit
        sel = select_residuals(domain, marginals, r_fit, weights=weights, objective=objective)
    t1 = time.perf_counter()
    # blocks of at most ~n/8 cells (2^10 .. 2^17): a block's table must not cost more than its records
    if hist is None:
        cells = int(min(2**17, max(2**10, n_records // 8)))
        tables = marginal_tables(X, domain, list(sel.residuals), max_cells=cells)
    else:
        tables = tables_from_counts(hist, domain, list(sel.residuals))
    t2 = time.perf_counter()
    plans, total, sigma2 = fit_residual_plans(sel, r_fit, bool(secure), max_records)
    t3 = time.perf_counter()
    cost = PrivacyCost(rho=r)  # per unit: the plans' per-record total times L^2 is at most r
    rows = int(sum(p.rows for p, _ in plans))
    scales = np.sqrt(sigma2)
    entry = unit_entry(LedgerEntry(label=label, cost=cost, rows=rows,
                                   columns=int(sum(t.size for t in tables.values())), noise="gaussian",
                                   secure=bool(secure), private=not seeded,
                                   sensitivity=float(math.sqrt(float(np.sum(sel.p)))), scale_min=float(scales.min()),
                                   scale_max=float(scales.max()), time=ledger_time()), up.unit if up else None)
    if accountant is not None:
        accountant.spend(cost, label=label, entry=entry)  # once, before any noise
    y: dict[tuple[int, ...], np.ndarray] = {}
    var: dict[tuple[int, ...], float] = {}
    for plan, chunk in plans:
        x = np.concatenate([tables[sel.residuals[j]].ravel() for j in chunk])
        m = plan.measure(x, accountant=None, rng=gen, label=f"{label} residuals")
        width = m.y.size // len(chunk)
        for k, j in enumerate(chunk):
            A = sel.residuals[j]
            y[A] = m.y[k * width:(k + 1) * width]
            var[A] = float(m.variances[k * width]) if width else 0.0
    t4 = time.perf_counter()
    out, variances = {}, {}
    by_shape: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for S in sel.marginals:
        by_shape.setdefault(domain.shape(S), []).append(S)
    for shape, group in by_shape.items():  # one batched Kronecker transform per table shape
        tabs = _reconstruct_batch(domain, group, y)
        for S, tab in zip(group, tabs):
            out[S] = tab
    out = {tuple(domain.names[i] for i in S): out[S] for S in sel.marginals}  # in the workload's order
    variances = {tuple(domain.names[i] for i in S): _cell_variance(domain, S, var) for S in sel.marginals}
    t5 = time.perf_counter()
    return MarginalRelease(
        domain=domain, selection=sel, marginals=out, variances=variances, residuals=y, residual_variances=var,
        cost=cost, loss=unit_loss(total, up.unit if up else None, "gaussian"), entry=entry, secure=bool(secure),
        private=not seeded,
        seconds={"select": t1 - t0, "tables": t2 - t1, "plan": t3 - t2, "measure": t4 - t3, "reconstruct": t5 - t4},
        requested=requested, privacy_unit=up.unit if up else None, bound_choice=up.choice if up else None,
    )


register_reader("marginals.from_json", marginals_from_json)  # load_release reads the marginals JSON through it
