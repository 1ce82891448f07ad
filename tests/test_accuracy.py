import numpy as np
import pytest

from sparsedp import SparseDPError, expected_error
from sparsedp import strategies as st
from sparsedp import workloads as wl


def dense_error(W: np.ndarray, M: np.ndarray, v: np.ndarray) -> float:
    """trace(W G V G^T W^T) with G the dense GLS estimator."""
    Vi = np.diag(1 / v)
    G = np.linalg.pinv(M.T @ Vi @ M) @ M.T @ Vi
    B = W @ G
    return float(np.sum(B * B * v[None, :]))


WORKLOADS = [wl.prefix(16), wl.all_ranges(16), wl.identity(16), wl.total(16), wl.range_queries(16, [(0, 3), (4, 15), (7, 7)])]
STRATEGIES = [st.identity(16), st.fenwick(16), st.haar(16), st.hierarchical(16, 2), st.hierarchical(16, 3),
              st.from_matrix(np.tril(np.ones((16, 16))))]


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
@pytest.mark.parametrize("M", STRATEGIES, ids=repr)
def test_exact_error_matches_dense(W, M):
    rng = np.random.default_rng(0)
    v = rng.uniform(0.5, 3.0, M.shape[0])
    rep = expected_error(W, M, v)
    assert rep.exact
    assert rep.total == pytest.approx(dense_error(W.toarray(), M.toarray(), v), rel=1e-9)


def test_seed_000_fenwick_3():
    # prefix(3) with fenwick(3): (2 Delta^2 / eps^2) trace(B^T B) = 2 * 4 * 4 = 32 at eps = 1
    assert expected_error(wl.prefix(3), st.fenwick(3), 2 * 2.0**2).total == 32
    # doubling row 3 (seed: 32/eps^2 -> 26/eps^2): Delta stays 2, row 3 noise variance / 4
    M = st.weighted(st.fenwick(3), [1.0, 1.0, 2.0])
    assert expected_error(wl.prefix(3), M, 2 * 2.0**2).total == pytest.approx(26)


def test_estimate_agrees_with_exact():
    W, M = wl.prefix(64), st.hierarchical(64, 2)
    v = np.full(M.shape[0], 2.0)
    exact = expected_error(W, M, v).total
    est = expected_error(W, M, v, method="estimate", probes=4000, rng=1)
    assert not est.exact and est.stderr > 0
    assert abs(est.total - exact) < 5 * est.stderr


def test_large_sparse_inverse_paths_are_fast():
    n = 1 << 18
    rep = expected_error(wl.all_ranges(n), st.fenwick(n), 1.0)
    assert rep.method == "sparse-inverse" and rep.total > 0
    # identity strategy: per-entry variance times the number of ranges containing it
    j = np.arange(n, dtype=float)
    ident = expected_error(wl.all_ranges(n), st.identity(n), 1.0).total
    assert ident == pytest.approx(((j + 1) * (n - j)).sum(), rel=1e-12)


def test_shape_mismatch():
    with pytest.raises(SparseDPError):
        expected_error(wl.prefix(4), st.identity(5), 1.0)
