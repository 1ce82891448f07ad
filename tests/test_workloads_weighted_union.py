"""Weighted unions of workloads (``sparsedp.workloads.weighted_union``): the implicit operator against
its explicit stacked matrix, its Gram, and every family of ``sparsedp.optimize`` scoring the union
exactly (``sum_i c_i E_i`` = the dense ``Var tr((M^T M)^{-1} W^T W)`` of the stacked matrix)."""

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import expected_error
from sparsedp import strategies as st
from sparsedp import workloads as wl
from sparsedp.errors import ShapeError, SparseDPError
from sparsedp.operators import SparseOperator
from sparsedp.optimize import optimize
from sparsedp.optimize.calibrate import noise_model, unit_variance
from sparsedp.optimize.gram import Gram, GramSum, block_sq_norms, closed_parts
from sparsedp.optimize.hybrid_family import HYBRID_AUTO_MIN_N, hybrid_configs, hybrid_useful
from sparsedp.optimize.templates import template_candidates
from sparsedp.optimize.tree_spectral import BlockTraces, CompleteTree
from sparsedp.optimize.weighted_tree import TreeObjective


def _closed_union(n: int, w: float = 0.9) -> wl.WeightedUnionWorkload:
    """All ranges averaged plus ``w`` times the whole-domain query (issue 11)."""
    return wl.weighted_union([(1.0 / (n * (n + 1) / 2), wl.all_ranges(n)), (w, wl.total(n))])


def _mixed_union(n: int, seed: int = 1) -> wl.WeightedUnionWorkload:
    """Closed-form parts with a range list, a dense matrix and a sparse matrix."""
    rng = np.random.default_rng(seed)
    ranges = np.sort(rng.integers(0, n, size=(15, 2)), axis=1)
    dense = rng.random((4, n))
    sparse = sp.random(6, n, density=0.3, random_state=seed, format="csr")
    return wl.weighted_union([(2.0, wl.prefix(n)), (0.5, wl.identity(n)), (0.3, wl.range_queries(n, ranges)),
                              (1.5, dense), (0.7, sparse)])


def _explicit(U: wl.WeightedUnionWorkload) -> np.ndarray:
    """The stacked matrix ``[sqrt(c_i) W_i]`` built independently of ``U.tosparse``."""
    return np.vstack([np.sqrt(c) * W.tosparse().toarray() for c, W in U.parts])


@pytest.mark.parametrize("make", [_closed_union, _mixed_union])
def test_implicit_union_equals_its_stacked_matrix(make):
    n = 23
    U = make(n)
    A = _explicit(U)
    rng = np.random.default_rng(0)
    x, X = rng.standard_normal(n), rng.standard_normal((n, 3))
    y, Y = rng.standard_normal(A.shape[0]), rng.standard_normal((A.shape[0], 2))
    assert U.shape == A.shape and U.structure == "weighted_union"
    np.testing.assert_allclose(U.matvec(x), A @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(U.matmat(X), A @ X, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(U.rmatvec(y), A.T @ y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(U.rmatmat(Y), A.T @ Y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(U.tosparse().toarray(), A, rtol=1e-15, atol=0)
    np.testing.assert_allclose(U.column_norms(1), np.abs(A).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(U.column_norms(2), np.sqrt((A * A).sum(axis=0)), rtol=1e-12)
    np.testing.assert_allclose(U.image_sq_norms(X), ((A @ X) ** 2).sum(axis=0), rtol=1e-12)
    Xs = sp.random(n, 4, density=0.3, random_state=3, format="csc")
    np.testing.assert_allclose(U.image_sq_norms(Xs), ((A @ Xs.toarray()) ** 2).sum(axis=0), rtol=1e-12)

    G = A.T @ A
    g = Gram(U)
    assert g.kind == "sum" and [c for c, _ in g.parts] == [c for c, _ in U.parts]
    np.testing.assert_allclose(g.matmat(np.eye(n)), G, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g.diagonal(), np.diag(G), rtol=1e-12)
    assert g.trace() == pytest.approx(np.trace(G), rel=1e-12)
    np.testing.assert_allclose(g.quadratic(X), np.einsum("ij,ij->j", X, G @ X), rtol=1e-12)


def test_nested_unions_are_flattened_and_gramsum_is_the_same_sum():
    n = 9
    inner = wl.weighted_union([(2.0, wl.prefix(n)), (3.0, wl.total(n))])
    U = wl.weighted_union([(0.5, inner), (4.0, wl.identity(n))])
    assert [c for c, _ in U.parts] == [1.0, 1.5, 4.0]
    assert not any(isinstance(W, wl.WeightedUnionWorkload) for _, W in U.parts)
    A = _explicit(U)
    gs = GramSum([(1.0, Gram(wl.prefix(n))), (1.5, Gram(wl.total(n))), (4.0, Gram(wl.identity(n))),
                  (0.0, Gram(wl.all_ranges(n)))])
    np.testing.assert_allclose(gs.matmat(np.eye(n)), A.T @ A, rtol=1e-12)
    assert gs.kind == "sum" and isinstance(gs.W, wl.WeightedUnionWorkload) and len(gs.W.parts) == 3
    assert closed_parts(gs) == [(1.0, "prefix"), (1.5, "total"), (4.0, "identity"), (0.0, "all_ranges")]
    from sparsedp.optimize import hybrid

    assert hybrid.GramSum is GramSum


@pytest.mark.parametrize(
    "parts, error",
    [
        ([], SparseDPError),
        ([(0.0, wl.total(4))], SparseDPError),
        ([(-1.0, wl.total(4))], SparseDPError),
        ([(float("nan"), wl.total(4))], SparseDPError),
        ([(float("inf"), wl.total(4))], SparseDPError),
        ([(True, wl.total(4))], SparseDPError),
        ([("1", wl.total(4))], SparseDPError),
        ([(1.0, wl.total(4)), (1.0, wl.total(5))], ShapeError),
        ([(1.0, wl.total(4), 3)], SparseDPError),
        ([wl.total(4)], SparseDPError),
        ([(1.0, np.ones(4))], ShapeError),
        (None, SparseDPError),
    ],
)
def test_bad_parts_raise_clear_errors(parts, error):
    with pytest.raises(error):
        wl.weighted_union(parts)


def test_block_norms_and_expected_error_are_the_weighted_sums():
    n = 16
    U = _mixed_union(n)
    A = _explicit(U)
    Aop = SparseOperator(sp.csr_matrix(A))
    for size in (1, 2, 4, 8, 16):
        assert block_sq_norms(U, size) == pytest.approx(block_sq_norms(Aop, size), rel=1e-12)
    tree = CompleteTree(n, (2, 2, 4))
    np.testing.assert_allclose(BlockTraces(U).details(tree), BlockTraces(Aop).details(tree), rtol=1e-10, atol=1e-12)
    rng = np.random.default_rng(2)
    for M in (st.hierarchical(n, 2), st.fenwick(n), st.haar(n), st.identity(n)):
        v = rng.random(M.shape[0]) + 0.5
        got, ref = expected_error(U, M, v), expected_error(A, M, v)
        assert got.total == pytest.approx(ref.total, rel=1e-10)
        np.testing.assert_allclose(got.variances, ref.variances, rtol=1e-10, atol=1e-14)
    # a generic strategy: the exact-blocks path
    M = sp.vstack([sp.identity(n), sp.csr_matrix(rng.random((3, n)))], format="csr")
    assert expected_error(U, M, 1.0).total == pytest.approx(expected_error(A, M, 1.0).total, rel=1e-10)


@pytest.mark.parametrize("make, mode", [(_closed_union, "closed"), (_mixed_union, "explicit")])
def test_tree_objective_of_a_union_equals_the_explicit_one(make, mode):
    n = 27
    U = make(n)
    A = SparseOperator(sp.csr_matrix(_explicit(U)))
    layout = st.TreeLayout.balanced(n, 3)
    obj, ref = TreeObjective(layout, U), TreeObjective(layout, A)
    assert obj.mode == mode and ref.mode == "explicit"
    a = np.random.default_rng(4).random(layout.nodes) + 0.2
    (E, g), (E0, g0) = obj(a), ref(a)
    assert E == pytest.approx(E0, rel=1e-10)
    np.testing.assert_allclose(g, g0, rtol=1e-9, atol=1e-14)


def _dense_error(strategy, G: np.ndarray, noise: str) -> float:
    M = strategy.tosparse().toarray()
    return unit_variance(strategy, noise_model(noise)) * float(np.trace(np.linalg.solve(M.T @ M, G)))


@pytest.mark.parametrize("n", [32, 48, 64])
@pytest.mark.parametrize("make", [_closed_union, _mixed_union])
def test_every_family_reports_the_exact_error_of_the_union(n, make):
    U = make(n)
    A = _explicit(U)
    G = A.T @ A
    assert hybrid_configs(n)  # the hybrid runs from n = 24 (two blocks of its smallest tree, 12)
    noises = ("laplace", "gaussian") if n == 48 else ("laplace",)
    for noise in noises:
        for family in ("templates", "tree", "hybrid", "pidentity"):
            res = optimize(U, family=family, noise=noise, rng=0, time_limit=30, secure=False)  # the continuous formula
            assert res.family == family
            assert res.error.total == pytest.approx(_dense_error(res.strategy, G, noise), rel=1e-6), (family, noise)
    # every template, not only the winner
    gram, model = Gram(U), noise_model("laplace")
    for cand in template_candidates(U, gram, BlockTraces(U), model):
        assert cand.total == pytest.approx(_dense_error(cand.strategy, G, "laplace"), rel=1e-6), cand.name


@pytest.mark.parametrize("n, w", [(32, 0.9), (64, 0.1), (64, 5.0)])
def test_auto_on_ranges_plus_total_is_never_worse_than_any_template(n, w):
    U = _closed_union(n, w)
    G = _explicit(U).T @ _explicit(U)
    res = optimize(U, family="auto", rng=0, secure=False)
    assert res.error.total == pytest.approx(_dense_error(res.strategy, G, "laplace"), rel=1e-6)
    temps = [t for t in res.history if t.family == "templates"]
    assert len(temps) >= 5
    assert all(res.error.total <= t.error * (1 + 1e-12) for t in temps)
    # and it gains on the best template (the optimised families fit the weight w)
    assert res.error.total < min(t.error for t in temps)


def test_large_unions_keep_the_closed_forms():
    n = 1 << 16
    U = _closed_union(n)
    g = Gram(U)
    assert closed_parts(g) == [(1.0 / (n * (n + 1) / 2), "all_ranges"), (0.9, "total")]
    assert TreeObjective(st.TreeLayout.balanced(n, 16), U, g).mode == "closed"
    assert hybrid_useful(Gram(_closed_union(HYBRID_AUTO_MIN_N)))
    assert not hybrid_useful(Gram(wl.weighted_union([(1.0, wl.identity(4096)), (2.0, wl.total(4096))])))
    # G X of the 2^31-row union in O(n) per column, against the parts' own closed forms
    X = np.random.default_rng(5).random((n, 2))
    ref = Gram(wl.all_ranges(n)).matmat(X) / (n * (n + 1) / 2) + 0.9 * X.sum(axis=0, keepdims=True)
    np.testing.assert_allclose(g.matmat(X), ref, rtol=1e-12)


@pytest.mark.parametrize("make", [_closed_union, _mixed_union])
def test_hybrid_objective_of_a_union_is_its_dense_error(make):
    from _hybrid_util import normalised_matrix
    from sparsedp.optimize.hybrid import HybridObjective

    n, model = 100, noise_model("laplace")
    U = make(n)
    A = _explicit(U)
    R = np.array([0.6, 0.4])
    obj = HybridObjective(Gram(U), model, 12, (12,), R, 3)
    theta = np.random.default_rng(6).random((3, obj.nb))
    f, _ = obj(theta.ravel())
    M = normalised_matrix(n, 12, (12,), R, theta, obj.delta(theta), model.p)
    assert f == pytest.approx(np.trace(np.linalg.solve(M.T @ M, A.T @ A)), rel=1e-9)


def test_optimize_refuses_an_all_zero_union():
    zero = sp.csr_matrix((3, 8))
    with pytest.raises(ShapeError, match="no non-zero entry"):
        optimize(zero)
    with pytest.raises(ShapeError, match="no non-zero entry"):
        optimize(wl.weighted_union([(1.0, zero), (2.0, sp.csr_matrix((1, 8)))]))
    # one non-zero part is enough
    assert optimize(wl.weighted_union([(1.0, zero), (2.0, wl.total(8))]), family="templates").error.total > 0
