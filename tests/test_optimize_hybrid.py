"""sparsedp.optimize.hybrid: block trees plus dense rows on block sums (Woodbury objective)."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from _hybrid_util import normalised_matrix
from sparsedp import workloads as wl
from sparsedp.continual import OptimizedCounter, optimized_counter_error
from sparsedp.errors import ShapeError
from sparsedp.optimize import optimize
from sparsedp.optimize.calibrate import noise_model, unit_variance
from sparsedp.optimize.gram import Gram
from sparsedp.optimize.hybrid import (
    HybridGLS,
    HybridObjective,
    hybrid_matrix,
    integer_hybrid,
)
from sparsedp.optimize.hybrid_family import hybrid_configs, hybrid_error

RNG_RANGES = [(int(a), int(min(95, a + l))) for a, l in zip(np.random.default_rng(5).integers(0, 96, 40),
                                                            np.random.default_rng(6).integers(0, 50, 40))]
WORKLOADS = {
    "prefix": lambda n: wl.prefix(n),
    "all_ranges": lambda n: wl.all_ranges(n),
    "identity": lambda n: wl.identity(n),
    "ranges": lambda n: wl.range_queries(n, [r for r in RNG_RANGES if r[1] < n]),
}
SHAPES = [(96, 20, (4, 5)), (64, 16, (2, 8)), (100, 16, (4, 4)), (64, 12, (12,))]


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
def test_objective_is_the_dense_gls_error_and_its_gradient_is_exact(kind, shape, noise):
    n, b, radices = shape
    rng = np.random.default_rng(hash((kind, n, b, noise)) % 2**32)
    model = noise_model(noise)
    gram = Gram(WORKLOADS[kind](n))
    R = rng.random(len(radices) + 1) + 0.2
    R /= R.sum() if model.p == 1 else np.sqrt(np.sum(R * R))
    p = 3
    obj = HybridObjective(gram, model, b, radices, R, p)
    theta = rng.random((p, obj.nb))
    f, grad = obj(theta.ravel())
    delta = obj.delta(theta)
    M = normalised_matrix(n, b, radices, R, theta, delta, model.p)
    G = gram.matmat(np.eye(n))
    assert f == pytest.approx(np.trace(np.linalg.solve(M.T @ M, G)), rel=1e-10)
    norms = np.abs(M).sum(axis=0) if model.p == 1 else (M * M).sum(axis=0)
    assert norms.max() == pytest.approx(1.0, rel=1e-12) and np.all(norms <= 1 + 1e-12)  # Delta = 1
    if model.p == 1:  # Laplace: every column uses the whole budget (a short last block's top node too)
        assert norms == pytest.approx(np.ones(n), rel=1e-12)
    x = theta.ravel()
    for k in rng.choice(x.size, 6, replace=False):
        h = 1e-6 * max(1.0, abs(x[k]))
        xp, xm = x.copy(), x.copy()
        xp[k] += h
        xm[k] -= h
        fd = (obj(xp)[0] - obj(xm)[0]) / (2 * h)
        assert grad[k] == pytest.approx(fd, rel=1e-5, abs=1e-6 * abs(f))


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_integer_strategy_sensitivity_error_and_gls(noise, shape):
    n, b, radices = shape
    rng = np.random.default_rng(n + b)
    model = noise_model(noise)
    R = rng.random(len(radices) + 1) + 0.2
    R /= R.sum() if model.p == 1 else np.sqrt(np.sum(R * R))
    nb = -(-n // b)
    theta = rng.random((4, nb))
    delta = 1 + theta.sum(axis=0) if model.p == 1 else np.sqrt(1 + (theta * theta).sum(axis=0))
    lay = integer_hybrid(theta, delta, R, n, b, radices, model)
    A = hybrid_matrix(lay)
    M = A.toarray()
    assert np.all(M == np.round(M))
    # brute-force sensitivity, exactly, against the layout's bound
    cols = sp.csc_matrix(A)
    exact = max(sum((Fraction(abs(v)) if model.p == 1 else Fraction(v) ** 2)
                    for v in cols.data[cols.indptr[j]: cols.indptr[j + 1]]) for j in range(n))
    assert exact == Fraction(float(lay.column_sensitivity().max()))
    assert exact <= Fraction(lay.scale) ** model.p
    assert lay.scale == 2.0**model.bits  # M x stays below 2^50 for totals up to 2^30, as for the other families
    # rounding costs little (Laplace: within 2e-3 of the float strategy's error; Gaussian, whose
    # level weights have 4 bits, within 5%, or better where a short block's spare budget goes to P)
    gram0 = Gram(wl.all_ranges(n))
    f_float = model.sigma2 * HybridObjective(gram0, model, b, radices, R, 4).value(theta, delta)
    if model.p == 1:
        assert hybrid_error(lay, gram0, model) == pytest.approx(f_float, rel=2e-3)
    else:
        assert hybrid_error(lay, gram0, model) <= 1.05 * f_float
    # exact error of the integer matrix: Woodbury form = dense GLS with the mechanism's calibration
    W = wl.all_ranges(n)
    gram = Gram(W)
    from sparsedp.operators import SparseOperator
    var = unit_variance(SparseOperator(A), model)
    dense = var * np.trace(np.linalg.solve(M.T @ M, gram.matmat(np.eye(n))))
    assert hybrid_error(lay, gram, model) == pytest.approx(dense, rel=1e-9)
    # the O(n b + p nb) GLS and prefix variances
    gls = HybridGLS(lay)
    y = rng.standard_normal(M.shape[0])
    assert gls.solve(y) == pytest.approx(np.linalg.lstsq(M, y, rcond=None)[0], rel=1e-9, abs=1e-12)
    L = np.tril(np.ones((n, n)))
    assert gls.prefix_variances() == pytest.approx(np.diag(L @ np.linalg.inv(M.T @ M) @ L.T), rel=1e-9)


def test_configs():
    assert hybrid_configs(2**20 - 1)[0] == (12, 3)
    assert all(k**L <= 2048 and -(-4096 // k**L) <= 1024 for k, L in hybrid_configs(4096))
    assert hybrid_configs(3) == []
    with pytest.raises(ShapeError):
        optimize(wl.prefix(3), family="hybrid")


def test_hybrid_counter_variance_is_reported_and_empirical():
    N = 300
    res = optimize(wl.prefix(N), family="hybrid", rng=0)
    assert res.family == "hybrid"
    err = optimized_counter_error(N, 1.0, res)
    assert err.total == pytest.approx(res.error.total, rel=1e-9)  # same GLS, same calibration
    runs, sq = 300, np.zeros(N)
    for r in range(runs):
        c = OptimizedCounter(N, 1.0, strategy=res, rng=r, secure=False)
        out = np.array([c.update(1) for _ in range(N)])
        sq += (out - np.arange(1, N + 1)) ** 2
    assert (sq / runs).mean() == pytest.approx(err.mean, rel=0.1)
    # a matrix whose layout does not describe it is refused
    from sparsedp.operators import SparseOperator
    lay = res.strategy.meta["hybrid"]
    bad = SparseOperator(res.strategy.tosparse() * 1.0, meta={"hybrid": lay})
    bad.matrix.data[0] *= 1.5
    with pytest.raises(ShapeError):
        OptimizedCounter(N, 1.0, strategy=bad, rng=0, secure=False)


@pytest.fixture(scope="module")
def auto_prefix_2048():
    """One ``family="auto"`` run on prefix(2048) (the smallest ``n`` at which auto runs the hybrid,
    ``HYBRID_AUTO_MIN_N``), shared by the two tests below.  ``p=8`` dense rows (hybrid and
    p-Identity) so every family stops at its iteration caps (~10 s on one core, no time limit, so
    p-Identity is always reached and the run is deterministic): with the
    default ``p`` p-Identity alone ran to the 30 s limit.  The tree candidates are those of
    ``family="tree"`` (same calls, same generator state)."""
    return optimize(wl.prefix(2048), rng=0, per_node=False, p=8)


def test_hybrid_beats_the_tree_on_long_prefix(auto_prefix_2048):
    # Was n = 4096 with family="hybrid" and family="tree" run separately (~16 s); at n = 2048 the
    # hybrid still wins by the same required 5% margin (measured: 263,843 vs 314,858, ratio 0.84),
    # and the candidates come from the shared auto run.
    hist = auto_prefix_2048.history
    hyb = min(t.error for t in hist if t.family == "hybrid")
    tree = min(t.error for t in hist if t.family == "tree")
    assert hyb < 0.95 * tree


def test_auto_tries_the_hybrid_and_keeps_the_best(auto_prefix_2048):
    res = auto_prefix_2048
    fams = {t.family for t in res.history}
    assert {"templates", "tree", "hybrid", "pidentity"} <= fams
    assert res.error.total == min(t.error for t in res.history)
    assert res.error.total <= res.best_template().error
