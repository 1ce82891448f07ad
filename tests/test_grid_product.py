"""The product exact noise snaps to its grid (sparsedp.grid_product and Operator.grid_product).

Exact noise is only exact if ``round(A x / g)`` is computed exactly: these tests compare every
operator's grid product with Python's exact integers, and reproduce the attacks on float products
(signed strategies on large counts, float FFTs of Toeplitz strategies on a grid): with one noise
seed, neighbours' measurements differ by at most the certified sensitivity, or the input is
refused before anything is charged.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import sparsedp
from sparsedp.audit import audit, plan_release
from sparsedp.errors import InputBoundError, UnsupportedStructureError
from sparsedp.intervals import IntervalRows
from sparsedp.marginals.kron import KronOperator
from sparsedp.measure import plan_measurement
from sparsedp.operators import Operator, SparseOperator
from sparsedp.optimize.toeplitz_strategy import ToeplitzStrategy
from sparsedp.privacy import Accountant


def _exact(A_int: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``A x`` in Python integers (object arrays: no rounding, no overflow)."""
    return np.array([sum(int(a) * int(v) for a, v in zip(row, x)) for row in A_int.astype(object)], dtype=object)


@pytest.mark.parametrize("seed", range(3))
def test_grid_products_equal_python_integers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(2**44, 2**46, 12)  # products far above 2^53 in their partial sums
    # explicit signed matrix on the grid 1/4
    K = rng.integers(-40, 41, (7, 12))
    got = SparseOperator(K / 4).grid_product(x.astype(float), 0.25, True)
    assert got.dtype == np.int64 and list(got) == list(_exact(K, x))
    # interval rows with integer weights on the grid 1/2
    lo = rng.integers(0, 6, 9)
    hi = lo + rng.integers(1, 7, 9)
    w = rng.integers(1, 30, 9) * rng.choice([-1, 1], 9)
    R = IntervalRows(12, lo, hi, w / 2)
    assert list(R.grid_product(x.astype(float), 0.5, True)) == list(_exact(sp.csr_matrix(R.tosparse() * 2).toarray(), x))
    # a Kronecker product (dense and sparse factors), the grid dividing the first factor
    F1, F2 = rng.integers(-9, 10, (3, 3)), rng.integers(-9, 10, (2, 4))
    for f2 in (F2, sp.csr_matrix(F2)):
        op = KronOperator([F1 / 8, f2])
        assert list(op.grid_product(x.astype(float), 0.125, True)) == list(_exact(np.kron(F1, F2), x))
    # a Toeplitz strategy whose first column is on the grid 1/2 but not integral
    m = rng.integers(-7, 8, 12) + 0.5
    T = ToeplitzStrategy(m)
    small = rng.integers(0, 2**30, 12)
    Tint = np.tril(np.array([[m[i - j] * 2 if i >= j else 0 for j in range(12)] for i in range(12)]))
    assert list(T.grid_product(small.astype(float), 0.5, True)) == list(_exact(Tint, small))


def _neighbour_gap(plan, x: np.ndarray, j: int, step: float, seeds: range, p: int) -> float:
    """The largest ``||y(x) - y(x + step e_j)||_p / grid`` over the noise seeds (same seed each side)."""
    x2 = x.copy()
    x2[j] += step
    gaps = [np.linalg.norm((plan.measure(x, rng=s).y - plan.measure(x2, rng=s).y) / plan.grid, p) for s in seeds]
    return float(max(gaps))


@pytest.mark.parametrize("form", ["kron", "explicit"])
def test_signed_strategy_on_large_counts_moves_by_its_sensitivity(form: str) -> None:
    """``I_4 (x) (16 I - J)`` (``Delta_1 = 30``), Laplace epsilon 1, counts near ``2^50``: the float
    product's partial sums pass ``2^53`` while ``|A x|`` stays small; neighbours moved by 54 with
    the float product."""
    B = 16 * np.eye(16) - np.ones((16, 16))
    M = sparsedp.kron(np.eye(4), B) if form == "kron" else SparseOperator(sp.kron(sp.eye(4), B))
    plan = plan_measurement(M, epsilon=1.0)
    assert plan.sensitivity == 30.0 and plan.grid_exact
    rng = np.random.default_rng(1)
    worst = 0.0
    for t in range(40):
        x = (2**50 - rng.integers(0, 2**20, 64)).astype(float)
        worst = max(worst, _neighbour_gap(plan, x, int(rng.integers(64)), -1.0, range(t, t + 1), 1))
    assert worst <= 30.0


def test_toeplitz_strategy_on_a_grid_moves_by_its_sensitivity() -> None:
    """First column ``(1.5, -1.5, 0, ...)`` on the grid 1/2 (not integral): a float FFT flipped the
    rounding of rows the change does not touch (gap 4.58 against a sensitivity of 4.24)."""
    n = 4096
    m = np.zeros(n)
    m[:2] = 1.5, -1.5
    plan = plan_measurement(ToeplitzStrategy(m), rho=0.5, noise="gaussian", grid=0.5)
    rng = np.random.default_rng(3)
    x = (2**48 + rng.integers(0, 1000, n)).astype(float)
    x[0] = 2**40
    gap = _neighbour_gap(plan, x, n // 2, 1.0, range(3), 2)
    assert gap <= plan.sensitivity
    assert gap == pytest.approx(np.sqrt(18.0))  # exactly the column (3, -3) in grid units


def test_audit_of_the_signed_strategy_stays_below_the_claim() -> None:
    B = 16 * np.eye(16) - np.ones((16, 16))
    plan = plan_measurement(sparsedp.kron(np.eye(2), B), epsilon=1.0)
    x = np.full(32, 2.0**50)
    x2 = x.copy()
    x2[3] -= 1
    res = audit(plan_release(plan), x, x2, trials=20000, rng=0, batched=True)
    assert res.epsilon_lower <= 1.0


def test_too_large_for_the_certificate_is_refused_before_the_charge() -> None:
    acct = Accountant(epsilon=1.0)
    B = 2.0**12 * np.eye(8) - np.ones((8, 8))  # |K| |x| ~ 2^63 at counts 2^50
    plan = plan_measurement(SparseOperator(B), epsilon=1.0)
    with pytest.raises(InputBoundError, match="2\\^61"):
        plan.measure(np.full(8, 2.0**50), accountant=acct)
    assert acct.spent == 0.0
    # an inexact grid (0.35 / 0.1 is not an integer): the float rounding must stay below
    # a quarter grid unit, which fails at counts near 2^50 and holds at ordinary ones
    inexact = plan_measurement(SparseOperator(np.array([[0.35, -0.35], [0.35, 0.35]])), epsilon=1.0, grid=0.1)
    assert not inexact.grid_exact
    with pytest.raises(InputBoundError, match="quarter grid unit"):
        inexact.measure(np.array([2.0**49, 2.0**49 - 1]), accountant=acct)
    assert acct.spent == 0.0
    inexact.measure(np.array([1000.0, 999.0]), accountant=acct)
    assert acct.spent == 1.0


def test_operators_without_a_certified_grid_product_are_refused() -> None:
    class Plain(Operator):
        def _matvec(self, x: np.ndarray) -> np.ndarray:
            return np.ravel(x)

    with pytest.raises(UnsupportedStructureError):
        Plain((3, 3)).grid_product(np.ones(3), 1.0, True)
    with pytest.raises(UnsupportedStructureError, match="integral data"):
        IntervalRows(4, [0, 1], [2, 4], [0.3, 0.7]).grid_product(np.array([0.5, 1.0, 2.0, 3.0]), 0.1, False)
    with pytest.raises(UnsupportedStructureError):
        ToeplitzStrategy([1.0, 0.5]).grid_product(np.ones(2), 1.0, False)
