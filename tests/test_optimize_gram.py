"""The optimiser's view of a workload: G = W^T W applied without forming it, and block norms."""

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import SparseOperator
from sparsedp import workloads as wl
from sparsedp.optimize.gram import Gram, block_sq_norms, kind_block_sq_norms, workload_rows

N = 24
RNG = np.random.default_rng(3)
WORKLOADS = [
    wl.prefix(N),
    wl.all_ranges(N),
    wl.identity(N),
    wl.total(N),
    wl.range_queries(N, [(0, 3), (5, 20), (7, 7), (2, 23), (16, 17)]),
    wl.from_matrix(RNG.normal(size=(5, N))),
    wl.from_matrix(sp.random(40, N, density=0.9, random_state=1)),  # more entries than G: dense Gram
]


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
def test_gram_products_equal_dense(W):
    Wd = W.toarray()
    G = Gram(W)
    X = RNG.normal(size=(N, 3))
    np.testing.assert_allclose(G.matmat(X), Wd.T @ Wd @ X, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(G.diagonal(), np.sum(Wd * Wd, axis=0), rtol=1e-12)
    assert G.trace() == pytest.approx(np.sum(Wd * Wd), rel=1e-12)
    np.testing.assert_allclose(G.quadratic(X), np.sum((Wd @ X) ** 2, axis=0), rtol=1e-10)


def test_gram_kinds():
    assert Gram(wl.prefix(8)).kind == "prefix"
    assert Gram(wl.all_ranges(8)).kind == "all_ranges"
    assert Gram(wl.identity(8)).kind == "identity"
    assert Gram(wl.total(8)).kind == "total"
    assert Gram(wl.from_matrix(sp.random(40, N, density=0.9, random_state=1))).kind == "dense"
    # a tag is not trusted: a matrix tagged identity that is not the identity is treated as sparse
    fake = SparseOperator(2 * sp.identity(8), structure="identity")
    assert Gram(fake).kind == "sparse"


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 8, 12, 24])
def test_block_sq_norms(W, size):
    Wd = W.toarray()
    blocks = Wd.reshape(Wd.shape[0], N // size, size).sum(axis=2)
    assert block_sq_norms(W, size) == pytest.approx(float(np.sum(blocks * blocks)), rel=1e-12)


def test_block_size_must_divide():
    with pytest.raises(ValueError):
        block_sq_norms(wl.prefix(10), 3)


def test_workload_rows():
    W = WORKLOADS[4]
    np.testing.assert_array_equal(workload_rows(W, 1, 4), W.toarray()[1:4].T)
    M = WORKLOADS[5]
    np.testing.assert_array_equal(workload_rows(M, 0, 5), M.toarray().T)


@pytest.mark.parametrize("n", [17, 24, 30])
@pytest.mark.parametrize("kind", ["prefix", "all_ranges", "identity", "total"])
def test_kind_block_sq_norms_with_a_partial_last_block(n, kind):
    """The closed forms against brute force, for every block size (the last block cut at n)."""
    W = {"prefix": wl.prefix, "all_ranges": wl.all_ranges, "identity": wl.identity, "total": wl.total}[kind](n)
    Wd = W.toarray()
    for size in range(1, n + 3):
        blocks = -(-n // size)
        ind = np.zeros((n, blocks))
        ind[np.arange(n), np.arange(n) // size] = 1.0
        ref = float(np.sum((Wd @ ind) ** 2))
        assert kind_block_sq_norms(kind, n, size) == pytest.approx(ref, rel=1e-12)
        if n % size == 0:
            assert block_sq_norms(W, size) == pytest.approx(ref, rel=1e-12)
    with pytest.raises(ValueError):
        kind_block_sq_norms("sparse", n, 2)


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("size", [5, 7, 10, 25])
def test_padded_block_sq_norms_cut_the_last_block_at_n(W, size):
    """``padded=True``: blocks of any size, the last one cut at n (W padded with zero columns)."""
    m = -(-N // size)
    Wd = np.hstack([W.toarray(), np.zeros((W.shape[0], m * size - N))])
    blocks = Wd.reshape(Wd.shape[0], m, size).sum(axis=2)
    assert block_sq_norms(W, size, padded=True) == pytest.approx(float(np.sum(blocks * blocks)), rel=1e-12)
