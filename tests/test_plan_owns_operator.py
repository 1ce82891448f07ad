"""Issue 26, finding 5: a plan owns read-only copies of what it calibrated.

Editing the caller's operator after ``plan_measurement(...)`` / ``MatrixMechanism(...)`` must not
change what is measured (the calibration and the charge are fixed at plan time).  Every operator
kind a plan accepts is covered: interval rows (unit weights, and non-integer weights measured
through their integer form), plain / weighted / identity / integer-row sparse operators, a scipy
matrix, a dense array, a Kronecker product (dense and sparse factors) and any other operator
(calibrated from its explicit entries).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import strategies, workloads
from sparsedp.intervals import IntervalRows
from sparsedp.marginals.kron import KronOperator
from sparsedp.measure import plan_measurement
from sparsedp.mechanism import MatrixMechanism
from sparsedp.operators import Operator, SparseOperator

N = 8
BIG = 1e6


class _StoredMatrix(Operator):
    """Any other operator: its explicit entries are a matrix it keeps (and hands out as is)."""

    def __init__(self, matrix: sp.csr_matrix) -> None:
        super().__init__(matrix.shape, name="stored")
        self.m = matrix

    def _matvec(self, x):
        return self.m @ np.ravel(x)

    def _rmatvec(self, y):
        return self.m.T @ np.ravel(y)

    def tosparse(self):
        return self.m


def _tree():
    M = strategies.hierarchical(N, 2)

    def edit():
        M.weights[:] = BIG
        M.hi[:] = N
    return M, edit


def _intervals_weighted():
    M = IntervalRows(N, [0, 0, 4, 2], [8, 4, 8, 6], weights=[0.5, 1.5, 0.25, 3.0])

    def edit():
        M.weights[:] = BIG
    return M, edit


def _sparse():
    M = strategies.fenwick(N)

    def edit():
        M.matrix.data[:] = BIG
    return M, edit


def _scipy():
    A = sp.csr_matrix(np.tril(np.ones((N, N))))

    def edit():
        A.data[:] = BIG
    return A, edit


def _dense():
    A = np.tril(np.ones((N, N)))

    def edit():
        A[:] = BIG
    return A, edit


def _weighted():
    M = strategies.weighted(strategies.fenwick(N), np.linspace(0.5, 1.5, N))

    def edit():
        M.base.matrix.data[:] = BIG
        M.row_weights[:] = BIG
        M.matrix.data[:] = BIG
    return M, edit


def _haar():
    M = strategies.haar(6)  # an integer-row form in its meta

    def edit():
        H, f = M.meta["integer_rows"]
        H.data[:] = BIG
        f[:] = BIG
        M.matrix.data[:] = BIG
    return M, edit


def _identity():
    M = strategies.identity(N)

    def edit():
        M.matrix.data[:] = BIG
    return M, edit


def _kron():
    F0 = np.array([[1.0, 1.0], [1.0, -1.0]])
    F1 = sp.csr_matrix(np.tril(np.ones((4, 4))))
    M = KronOperator([F0, F1])

    def edit():
        F0[:] = BIG
        F1.data[:] = BIG
    return M, edit


def _other():
    M = _StoredMatrix(sp.csr_matrix(np.tril(np.ones((N, N)))))

    def edit():
        M.m.data[:] = BIG
    return M, edit


KINDS = {"hierarchical": _tree, "intervals-weighted": _intervals_weighted, "sparse": _sparse, "scipy": _scipy,
         "dense": _dense, "weighted": _weighted, "haar": _haar, "identity": _identity, "kron": _kron,
         "other": _other}


def _arrays(op):
    """Every array through which ``op`` computes ``A x`` (and its calibration)."""
    if isinstance(op, IntervalRows):
        return [op.lo, op.hi, op.weights]
    if isinstance(op, KronOperator):
        out = []
        for F in op.factors:
            out += [F.data, F.indices, F.indptr] if sp.issparse(F) else [F]
        return out
    if isinstance(op, SparseOperator):
        out = [op.matrix.data, op.matrix.indices, op.matrix.indptr]
        if op.row_weights is not None:
            out.append(op.row_weights)
        if op.base is not None:
            out += _arrays(op.base)
        form = op.meta.get("integer_rows")
        if form is not None:
            out += [form[0].data, form[0].indices, form[0].indptr, form[1]]
        return out
    return []


def _plan_arrays(plan):
    out = _arrays(plan.measured) + [plan.scales, plan.unit_scales]
    if plan.row_factors is not None:
        out.append(plan.row_factors)
    if type(plan.strategy) in (IntervalRows, SparseOperator, KronOperator):
        out += _arrays(plan.strategy)
    return out


def _data(n):
    return np.arange(n, dtype=np.float64) % 5


@pytest.mark.parametrize("secure", [True, False])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_editing_the_operator_after_planning_changes_nothing_measured(kind, secure):
    M, edit = KINDS[kind]()
    plan = plan_measurement(M, epsilon=1.0, secure=secure)
    reference = plan_measurement(KINDS[kind]()[0], epsilon=1.0, secure=secure)  # never edited
    matrix = plan.matrix.toarray()
    edit()
    x = _data(plan.measured.shape[1])
    got = plan.measure(x, rng=11)
    want = reference.measure(x, rng=11)
    np.testing.assert_allclose(got.y, want.y, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(plan.matrix.toarray(), matrix)
    assert plan.sensitivity == reference.sensitivity and plan.cost == reference.cost


@pytest.mark.parametrize("secure", [True, False])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_plan_arrays_are_read_only(kind, secure):
    M, _ = KINDS[kind]()
    plan = plan_measurement(M, epsilon=1.0, secure=secure)
    arrays = _plan_arrays(plan)
    assert arrays
    for a in arrays:
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[...] = 0
    # the caller's own arrays stay writeable (the plan froze copies, not them)
    mine = _arrays(M) if isinstance(M, Operator) else [M.data] if sp.issparse(M) else [M]
    for a in mine:
        assert a.flags.writeable


def test_the_tree_example_of_the_review():
    """``hierarchical(4, 2)`` planned at epsilon 1, then its weights set to 10^6: the outputs of
    neighbouring inputs must still differ by about the noise, not by 10^6."""
    M = strategies.hierarchical(4, 2)
    plan = plan_measurement(M, epsilon=1.0)
    M.weights[:] = 1e6
    a = plan.measure(np.array([0, 0, 0, 0]), rng=5).y
    b = plan.measure(np.array([1, 0, 0, 0]), rng=5).y
    assert np.abs(a - b).max() <= 1.0  # the same noise: the rows' difference, unweighted


@pytest.mark.parametrize("kind", ["hierarchical", "weighted", "sparse", "kron"])
def test_matrix_mechanism_owns_its_strategy(kind):
    M, edit = KINDS[kind]()
    n = M.shape[1]
    W = workloads.prefix(n)
    mech = MatrixMechanism(W, M, epsilon=1.0)
    reference = MatrixMechanism(W, KINDS[kind]()[0], epsilon=1.0)
    edit()
    x = _data(n)
    got, want = mech.run(x, rng=3), reference.run(x, rng=3)
    np.testing.assert_allclose(got.answers, want.answers, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(mech.expected_error(), reference.expected_error(), rtol=1e-12)
    for a in _arrays(mech.M):
        assert not a.flags.writeable
