"""IntervalRows: the implicit operator against its explicit matrix; the certified loss against
Fraction sums of the explicit entries."""

from fractions import Fraction

import numpy as np
import pytest
import scipy.sparse as sp

from sparsedp import ShapeError
from sparsedp.intervals import IntervalRows


def _random(seed: int) -> IntervalRows:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    m = int(rng.integers(1, 60))
    a = rng.integers(0, n, size=m)
    b = rng.integers(0, n, size=m)
    lo, hi = np.minimum(a, b), np.maximum(a, b) + 1
    w = rng.uniform(0.01, 3.0, size=m) * rng.choice([-1, 1], size=m) / rng.integers(1, 7, size=m)
    return IntervalRows(n, lo, hi, w)


def _exact_loss(op: IntervalRows, scales, p: int) -> Fraction:
    A = sp.csc_matrix(op.tosparse())
    best = Fraction(0)
    for j in range(A.shape[1]):
        sl = slice(A.indptr[j], A.indptr[j + 1])
        best = max(best, sum(((abs(Fraction(float(v))) / Fraction(float(scales[i]))) ** p
                              for v, i in zip(A.data[sl], A.indices[sl])), Fraction(0)))
    return best


@pytest.mark.parametrize("seed", range(20))
def test_products_match_the_explicit_matrix(seed):
    op = _random(seed)
    A = op.tosparse().toarray()
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 100, size=op.shape[1]).astype(float)
    np.testing.assert_allclose(op.matvec(x), A @ x, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(op.matvec(x + 0.25), A @ (x + 0.25), rtol=1e-12, atol=1e-9)
    y = rng.normal(size=op.shape[0])
    np.testing.assert_allclose(op.rmatvec(y), A.T @ y, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(op.column_norms(1), np.abs(A).sum(axis=0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("p", [1, 2])
def test_certified_loss_bounds_the_exact_one_tightly(seed, p):
    op = _random(seed)
    scales = np.random.default_rng(seed + 99).uniform(0.1, 5.0, size=op.shape[0])
    exact = _exact_loss(op, scales, p)
    got = op.certified_loss(scales, p)
    assert Fraction(got) >= exact
    assert got <= float(exact) * (1 + 1e-9)
    unit = _exact_loss(op, np.ones(op.shape[0]), p)
    assert Fraction(op.certified_loss(None, p)) >= unit


def test_integer_trees_have_exact_integer_sensitivity():
    from sparsedp import strategies as st

    lay = st.hierarchical(1000, 16).meta["layout"]
    starts = [lay.leaf_starts[level] for level in reversed(range(lay.levels))]
    lo = np.concatenate([s[:-1] for s in starts])
    hi = np.concatenate([s[1:] for s in starts])
    op = IntervalRows(1000, lo, hi)
    assert op.certified_loss() == lay.levels
    assert op.matvec(np.ones(1000))[0] == 1000.0


def test_counts_beyond_float_precision_stay_exact():
    op = IntervalRows(3, [0, 1], [3, 3])
    x = np.array([2.0**52, 1.0, 2.0])  # a float cumsum would lose the 1
    assert op.matvec(x)[1] == 3.0


@pytest.mark.parametrize("bad", [dict(lo=[0, 2], hi=[1, 2]), dict(lo=[-1], hi=[1]), dict(lo=[0], hi=[9]),
                                 dict(lo=[0], hi=[1], weights=[0.0]), dict(lo=[0], hi=[1], weights=[np.nan])])
def test_bad_intervals_are_refused(bad):
    with pytest.raises(ShapeError):
        IntervalRows(4, **bad)
