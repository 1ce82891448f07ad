"""Kronecker strategies measured through plan_measurement without forming the product: the
factored sensitivity (brute-forced on small domains), the certified loss against the explicit
np.kron calibration, and the same release as the explicit matrix for the same noise."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import plan_measurement
from sparsedp.errors import UnsupportedStructureError
from sparsedp.marginals import KronOperator
from sparsedp.marginals.kron_calibration import kron_calibration, kron_sensitivity
from sparsedp.operators import SparseOperator


def _factors(rng, shapes, integer=False):
    out = []
    for m, n in shapes:
        F = rng.integers(-3, 4, size=(m, n)).astype(float) if integer else rng.normal(size=(m, n))
        F[rng.random((m, n)) < 0.3] = 0.0
        F[0, :] = np.where(F[0, :] == 0, 1.0, F[0, :])  # no zero column
        out.append(F)
    return out


def _dense(factors):
    out = np.ones((1, 1))
    for F in factors:
        out = np.kron(out, F)
    return out


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("integer", [False, True])
def test_sensitivity_is_the_product_of_factor_sensitivities_brute_force(p, integer):
    rng = np.random.default_rng(3 + p + 10 * integer)
    for shapes in ([(3, 2), (4, 3)], [(2, 3), (3, 2), (2, 2)]):
        fs = _factors(rng, shapes, integer)
        A = _dense(fs)
        # brute force over neighbouring count vectors x, x + e_j on the whole (small) domain
        x = rng.integers(0, 5, size=A.shape[1]).astype(float)
        worst = max(np.linalg.norm(A @ (x + e) - A @ x, ord=p) for e in np.eye(A.shape[1]))
        s = kron_sensitivity(fs, p)
        assert s >= worst * (1 - 1e-12)
        assert s == pytest.approx(worst, rel=1e-12)
        assert s == pytest.approx(math.prod(float(np.max(np.linalg.norm(F, ord=p, axis=0))) for F in fs), rel=1e-12)
        if integer:  # exact integers: the product equals the explicit certified value exactly
            ref = plan_measurement(SparseOperator(sp.csr_matrix(A)), epsilon=1.0 if p == 1 else None,
                                   rho=1.0 if p == 2 else None, noise="laplace" if p == 1 else "gaussian")
            assert s == ref.data_sensitivity


@pytest.mark.parametrize("noise", ["laplace", "gaussian"])
@pytest.mark.parametrize("grid", [1.0, 2.0**-20])
def test_calibration_bounds_the_explicit_one(noise, grid):
    rng = np.random.default_rng(7)
    fs = _factors(rng, [(4, 3), (3, 3), (2, 2)])
    K = KronOperator(fs)
    E = SparseOperator(sp.csr_matrix(_dense(fs)))
    kw = {"epsilon": 1.0} if noise == "laplace" else {"rho": 0.5}
    for secure in (False, True):
        pk = plan_measurement(K, noise=noise, secure=secure, grid=grid, **kw)
        pe = plan_measurement(E, noise=noise, secure=secure, grid=grid, **kw)
        assert type(pk.measured) is KronOperator and pk.measured is not K  # never formed: the plan's own copy
        assert pk.grid_exact == pe.grid_exact
        # both certify the exact column norms (the explicit one of the rounded products fl(a b),
        # this one of the exact products a b the mode products apply): equal up to their slack
        assert pk.sensitivity >= pe.sensitivity * (1 - 1e-13)
        # the factored inexact-grid bound is slightly larger than the entry-by-entry one; the rounding
        # of a grid 1 adds whole units per entry (both grow), a fine grid adds ~g / entry relatively
        tol = 1e-12 if not secure else (1e-4 if grid < 1 else 1.0)
        assert pk.sensitivity <= pe.sensitivity * (1 + tol)
        sk = plan_measurement(K, scales=pe.scales[0], noise=noise, secure=secure, grid=grid)
        se = plan_measurement(E, scales=pe.scales[0], noise=noise, secure=secure, grid=grid)
        assert sk.loss >= se.loss * (1 - 1e-13) and sk.loss <= se.loss * (1 + tol) ** 2


def test_integer_factors_on_the_unit_grid_are_exact_and_release_the_same_values():
    rng = np.random.default_rng(11)
    fs = _factors(rng, [(5, 4), (3, 3)], integer=True)
    K, E = KronOperator(fs), SparseOperator(sp.csr_matrix(_dense(fs)))
    x = rng.integers(0, 20, size=12).astype(float)
    for noise, kw in (("laplace", {"epsilon": 0.7}), ("gaussian", {"rho": 0.3})):
        pk, pe = (plan_measurement(M, noise=noise, **kw) for M in (K, E))
        assert pk.grid_exact and pe.grid_exact and pk.sensitivity == pe.sensitivity
        np.testing.assert_array_equal(pk.unit_scales, pe.unit_scales)
        yk = pk.measure(x, rng=5).y
        ye = pe.measure(x, rng=5).y
        np.testing.assert_allclose(yk, ye, rtol=0, atol=1e-9)


def test_float_noise_release_equals_explicit():
    rng = np.random.default_rng(12)
    fs = _factors(rng, [(5, 4), (3, 3), (2, 2)])
    K, E = KronOperator(fs), SparseOperator(sp.csr_matrix(_dense(fs)))
    x = rng.integers(0, 20, size=24).astype(float)
    pk = plan_measurement(K, rho=0.5, noise="gaussian", secure=False)
    pe = plan_measurement(E, rho=0.5, noise="gaussian", secure=False)
    np.testing.assert_allclose(pk.scales, pe.scales, rtol=1e-12)
    np.testing.assert_allclose(pk.measure(x, rng=1).y, pe.measure(x, rng=1).y, rtol=1e-9, atol=1e-9)


def test_per_row_scales_are_refused_and_bad_input_is_refused_before_the_charge():
    from sparsedp import Accountant
    from sparsedp.errors import SparseDPError

    K = KronOperator([np.eye(2), np.eye(3)])
    with pytest.raises(UnsupportedStructureError):
        plan_measurement(K, scales=np.arange(1.0, 7.0), noise="gaussian")
    plan = plan_measurement(K, epsilon=1.0)
    acc = Accountant(epsilon=2.0)
    for bad in (np.full(6, np.nan), np.ones(5), -np.ones(6)):
        with pytest.raises(SparseDPError):
            plan.measure(bad, accountant=acc)
    assert acc.spent == 0 and not acc.ledger


def test_kron_calibration_refuses_non_finite_factors():
    from sparsedp.errors import ShapeError

    with pytest.raises(ShapeError):
        kron_calibration(KronOperator([np.array([[1.0, np.inf]]), np.eye(2)]), True, 1.0, 1, None)


def test_all_columns_enumerated_small_domain():
    # every column norm of the product is the product of factor column norms (the identity behind the bound)
    rng = np.random.default_rng(2)
    fs = _factors(rng, [(3, 2), (2, 3)])
    A = _dense(fs)
    for j, (a, b) in enumerate(itertools.product(range(2), range(3))):
        assert np.abs(A[:, j]).sum() == pytest.approx(np.abs(fs[0][:, a]).sum() * np.abs(fs[1][:, b]).sum())
