"""Certified calibration: every bound is >= the exact value over the float entries (Fraction)."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import strategies as st
from sparsedp.calibration import (
    column_norm_bound,
    gaussian_loss,
    gaussian_sigma,
    laplace_loss,
    laplace_scale,
    sensitivity_bound,
)
from sparsedp.operators import sensitivity


def _exact_l1(A: sp.spmatrix, scales=None) -> Fraction:
    A = sp.csc_matrix(A)
    best = Fraction(0)
    for j in range(A.shape[1]):
        lo, hi = A.indptr[j], A.indptr[j + 1]
        if scales is None:
            s = sum((abs(Fraction(float(v))) for v in A.data[lo:hi]), Fraction(0))
        else:
            s = sum((abs(Fraction(float(v))) / Fraction(float(scales[i]))
                     for v, i in zip(A.data[lo:hi], A.indices[lo:hi])), Fraction(0))
        best = max(best, s)
    return best


def _exact_sq(A: sp.spmatrix, scales=None) -> Fraction:
    A = sp.csc_matrix(A)
    best = Fraction(0)
    for j in range(A.shape[1]):
        lo, hi = A.indptr[j], A.indptr[j + 1]
        w = [Fraction(1)] * (hi - lo) if scales is None else [Fraction(float(scales[i])) for i in A.indices[lo:hi]]
        best = max(best, sum((Fraction(float(v)) ** 2 / s**2 for v, s in zip(A.data[lo:hi], w)), Fraction(0)))
    return best


def test_haar_20_sensitivity_is_not_one_ulp_low():
    # issue 19 #10: the float column sum of haar(20) is 5.166666666666666, below the exact sum of
    # its float entries; the certified bound is >= it (and within a few ulps)
    H = st.haar(20).tosparse()
    exact = _exact_l1(H)
    d = sensitivity(st.haar(20))
    assert Fraction(d) >= exact
    assert d - float(exact) < 1e-14
    assert Fraction(float(np.asarray(abs(H).sum(axis=0)).max())) < exact  # the old computation


def test_integer_strategies_stay_exact():
    assert sensitivity(st.hierarchical(1024, 4)) == 6.0
    assert sensitivity(st.identity(7)) == 1.0
    d2 = sensitivity(st.hierarchical(64, 2), 2)  # sqrt(7 levels), rounded up
    assert Fraction(d2) ** 2 >= 7 and d2 - 7**0.5 <= 1e-15


@pytest.mark.parametrize("seed", range(12))
def test_bounds_dominate_exact_fraction_sums(seed):
    rng = np.random.default_rng(seed)
    m, n = rng.integers(2, 30, size=2)
    A = sp.random(m, n, density=0.4, random_state=seed, format="csr")
    A.data = rng.standard_normal(A.nnz) / rng.integers(1, 7, size=A.nnz)
    scales = rng.uniform(0.1, 3.0, size=m) / 3.0
    assert Fraction(sensitivity_bound(A, 1)) >= _exact_l1(A)
    assert Fraction(laplace_loss(A, scales)) >= _exact_l1(A, scales)
    assert Fraction(sensitivity_bound(A, 2)) ** 2 >= _exact_sq(A)
    assert Fraction(gaussian_loss(A, scales)) >= _exact_sq(A, scales) / 2
    # and tight: within 1e-13 relative
    assert laplace_loss(A, scales) <= float(_exact_l1(A, scales)) * (1 + 1e-13)
    norms = column_norm_bound(A, 1)
    assert norms.shape == (n,)


@pytest.mark.parametrize("delta,eps", [(1.0, 0.1), (3.0, 0.7), (31 / 6, 0.3), (11.0, 1e-9), (2.0, 1e6)])
def test_scales_rounded_up(delta, eps):
    b = laplace_scale(delta, eps)
    assert Fraction(delta) / Fraction(b) <= Fraction(eps)
    sigma = gaussian_sigma(delta, eps)
    assert Fraction(delta) ** 2 / (2 * Fraction(sigma) ** 2) <= Fraction(eps)
