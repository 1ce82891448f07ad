import numpy as np
import pytest

from sparsedp import ShapeError, sensitivity
from sparsedp import strategies as st
from sparsedp import workloads as wl


def test_paper_sensitivities():
    assert sensitivity(st.hierarchical(1024, branching=2)) == 11
    assert sensitivity(st.fenwick(1000)) == 10
    assert sensitivity(st.identity(17)) == 1
    assert sensitivity(st.haar(1024)) == 11


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 100, 1000, 4096])
def test_fenwick_theorems(n):
    M = st.fenwick(n)
    A = M.tosparse()
    col = np.asarray(abs(A).sum(axis=0)).ravel()
    top = int(np.floor(np.log2(n))) + 1
    assert col.max() == top and col[0] == top  # Theorem 5.1: attained at column 1
    B = (wl.prefix(n).tosparse() @ st.fenwick_inverse(n)).tocsr()  # B = W M^-1
    B.eliminate_zeros()
    rows_nnz = np.diff(B.indptr)
    popcount = np.array([bin(p).count("1") for p in range(1, n + 1)])
    assert np.array_equal(rows_nnz, popcount)  # Theorem 5.2
    assert np.allclose(B.data, 1.0)
    assert abs((B @ A - wl.prefix(n).tosparse())).max() == 0  # W = B M exactly


def test_seed_fenwick_3():
    assert st.fenwick(3).toarray().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13, 64, 100])
def test_fenwick_inverse_and_haar_orthogonality(n):
    F = st.fenwick(n).toarray()
    np.testing.assert_array_equal(st.fenwick_inverse(n).toarray() @ F, np.eye(n))
    H = st.haar(n)
    A = H.toarray()
    np.testing.assert_allclose(A @ A.T, np.diag(H.meta["row_sq_norms"]), atol=1e-12)
    assert np.linalg.matrix_rank(A) == n
    assert sensitivity(H) <= np.ceil(np.log2(max(n, 1))) + 1 + 1e-12


@pytest.mark.parametrize("n,k", [(1, 2), (5, 2), (27, 3), (100, 16), (1000, 2)])
def test_hierarchical_layout(n, k):
    M = st.hierarchical(n, branching=k)
    layout = M.meta["layout"]
    A = M.toarray()
    assert A.shape == (layout.nodes, n)
    # every level partitions the leaves: each column has exactly `levels` ones
    assert np.all(A.sum(axis=0) == layout.levels)
    assert A[0].sum() == n  # root first
    assert np.array_equal(A[-n:], np.eye(n))  # leaves last


def test_weighted_keeps_structure():
    w = np.arange(1.0, 4.0)
    M = st.weighted(st.fenwick(3), w)
    assert M.structure == "fenwick"
    assert sensitivity(M) == 3.0  # column 1: 1*1 + 2*1
    np.testing.assert_array_equal(M.toarray(), np.diag(w) @ st.fenwick(3).toarray())


def test_from_matrix_detects_triangular():
    assert st.from_matrix(np.tril(np.ones((4, 4)))).structure == "lower_triangular"
    assert st.from_matrix(np.ones((2, 2))).structure == "general"


def test_bad_branching():
    with pytest.raises(ShapeError):
        st.hierarchical(8, branching=1)


def test_default_branching_is_the_best_measured():
    # issue 20 #5: the default was 2, the slowest and least accurate tree
    from sparsedp import MatrixMechanism
    from sparsedp import workloads as wl

    n = 4096
    default = st.hierarchical(n)
    assert "k=16" in default.name
    # max_variances=0: the exact totals only (the same numbers), not the 8.4 million per-range
    # variances of all_ranges(4096) that this comparison does not use (~20 s -> ~0.05 s)
    for W in (wl.all_ranges(n), wl.prefix(n)):
        err = MatrixMechanism(W, default, epsilon=1.0).expected_error(max_variances=0)
        assert err < 0.6 * MatrixMechanism(W, st.hierarchical(n, 2), epsilon=1.0).expected_error(max_variances=0)


def test_haar_sensitivity_formula_from_the_docstring():
    # issue 20 #6: the documented ceil(log2 n) + 1 is 10 at n = 365; the true value is 9.40033
    from fractions import Fraction

    for n in (365, 20, 1024, 7):
        H = st.haar(n)
        best = Fraction(0)

        def walk(a, b, acc):
            nonlocal best
            if b - a < 2:
                best = max(best, acc)
                return
            m = a + (b - a + 1) // 2
            nl, nr = m - a, b - m
            walk(a, m, acc + Fraction(nr, max(nl, nr)))
            walk(m, b, acc + Fraction(nl, max(nl, nr)))

        walk(0, n, Fraction(1))
        assert sensitivity(H) == pytest.approx(float(best), rel=1e-14)
    assert sensitivity(st.haar(365)) == pytest.approx(9.40033, abs=1e-5)
