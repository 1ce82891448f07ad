"""The epsilon (rho) a release charges is >= its exact privacy loss, computed by brute force with
Fraction arithmetic from the matrix that is actually measured (issue 19's property test for the
matrix mechanism; the subsystems' own audits live in test_trees_privacy.py, test_flows_privacy.py,
test_continual_privacy.py and test_completion_privacy.py)."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import Accountant, MatrixMechanism
from sparsedp import strategies as st
from sparsedp import workloads as wl


def _loss_l1(A: sp.spmatrix, scale: float) -> Fraction:
    """max_j sum_i |A_ij| / b in exact arithmetic over the float entries."""
    A = sp.csc_matrix(A)
    b = Fraction(scale)
    return max(sum((abs(Fraction(float(v))) for v in A.data[A.indptr[j]:A.indptr[j + 1]]), Fraction(0))
               for j in range(A.shape[1])) / b


def _loss_zcdp(A: sp.spmatrix, sigma: float) -> Fraction:
    A = sp.csc_matrix(A)
    s2 = Fraction(sigma) ** 2
    return max(sum((Fraction(float(v)) ** 2 for v in A.data[A.indptr[j]:A.indptr[j + 1]]), Fraction(0))
               for j in range(A.shape[1])) / (2 * s2)


def _random_strategy(rng: np.random.Generator, n: int) -> sp.csr_matrix:
    kind = rng.integers(4)
    if kind == 0:
        base = st.hierarchical(n, int(rng.integers(2, 5)))
    elif kind == 1:
        base = st.haar(n)
    elif kind == 2:
        base = st.fenwick(n)
    else:
        A = sp.random(int(rng.integers(n, 2 * n)), n, density=0.4, random_state=int(rng.integers(1 << 30)))
        A = A + sp.eye(A.shape[0], n)
        A.data = rng.standard_normal(A.nnz) / 3.0
        return sp.csr_matrix(A)
    w = rng.uniform(0.05, 2.0, size=base.shape[0]) / rng.integers(1, 9, size=base.shape[0])
    return st.weighted(base, w).tosparse()


@pytest.mark.parametrize("seed", range(25))
def test_matrix_mechanism_charges_at_least_the_exact_loss(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 24))
    A = _random_strategy(rng, n)
    eps = float(rng.uniform(0.01, 3.0))
    acc = Accountant(epsilon=eps)
    mech = MatrixMechanism(wl.identity(n), A, epsilon=eps, accountant=acc)
    x = rng.integers(0, 50, size=n)
    meas = mech.measure(x, rng=seed)
    assert _loss_l1(A, float(meas.scales[0])) <= Fraction(acc.spent) <= Fraction(eps)
    rho = float(rng.uniform(0.01, 2.0))
    g = MatrixMechanism(wl.identity(n), A, rho=rho, noise="gaussian")
    assert _loss_zcdp(A, float(g.measure(x, rng=seed).scales[0])) <= Fraction(rho)


@pytest.mark.parametrize("seed", range(10))
def test_secure_mode_charges_at_least_the_exact_loss_in_grid_units(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 16))
    base = st.hierarchical(n, 2).tosparse()
    w = rng.integers(1, 4, size=base.shape[0]).astype(float)
    A = sp.diags(w) @ base  # integer strategy: the grid is exact
    eps = float(rng.uniform(0.05, 2.0))
    mech = MatrixMechanism(wl.identity(n), A, epsilon=eps, secure=True)
    meas = mech.measure(rng.integers(0, 9, size=n), rng=seed)
    assert _loss_l1(A, float(meas.scales[0])) <= Fraction(eps)
