"""Exact running-sum offsets of the tree counters (sparsedp/continual/exact_offsets.py): the dyadic
two-pass GLS is exactly unbiased, agrees with the float GLS, and makes every tree counter's release a
function of the measurement alone (bit for bit)."""

import numpy as np
import pytest

from sparsedp import SparseDPError
from sparsedp import workloads as wl
from sparsedp.audit import plan_release
from sparsedp.continual import GLSTreeCounter, OptimizedCounter
from sparsedp.continual.exact_offsets import exact_tree_offsets
from sparsedp.optimize import optimize
from sparsedp.privacy import Accountant
from sparsedp.strategies import TreeLayout
from sparsedp.tree_estimator import tree_gls

LAYOUTS = [(1, 2), (13, 2), (13, 3), (100, 12), (257, 5)]


def _random_tree(n, k, seed, root_measured=False):
    rng = np.random.default_rng(seed)
    layout = TreeLayout.balanced(n, k)
    v = rng.uniform(1.0, 5.0, layout.nodes)
    if n > 1 and not root_measured:
        v[0] = np.inf  # an unmeasured root
    return layout, v, rng


@pytest.mark.parametrize("n,k", LAYOUTS)
def test_exact_offsets_are_exactly_unbiased(n, k):
    """Noise-free measurements M x give the exact running sums, as exact rationals: G M = I holds
    in exact arithmetic whatever the rounding of the coefficients."""
    layout, v, rng = _random_tree(n, k, n + k)
    x = rng.integers(0, 1000, n)
    lo, hi = layout.intervals()
    cs = np.concatenate([[0], np.cumsum(x)])
    y = (cs[hi] - cs[lo]).astype(float)
    y[~np.isfinite(v)] = 0.0
    ex = exact_tree_offsets(layout, y, v, 1.0)
    assert list(ex.num) == [int(s) << ex.shift for s in np.cumsum(x)]


@pytest.mark.parametrize("n,k", LAYOUTS)
def test_exact_offsets_agree_with_the_float_gls(n, k):
    layout, v, rng = _random_tree(n, k, 7 * n + k, root_measured=True)
    v[-1] = 1e6  # a node much noisier than the rest (small coefficients must keep their precision)
    z = rng.integers(-10**6, 10**6, layout.nodes).astype(float)
    e = exact_tree_offsets(layout, z, v, 1.0).floats()
    ref = np.cumsum(tree_gls(layout, z, v))
    np.testing.assert_allclose(e, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())


def test_exact_offsets_refuse_noise_off_the_lattice():
    layout, v, _ = _random_tree(13, 3, 1)
    with pytest.raises(SparseDPError, match="lattice"):
        exact_tree_offsets(layout, np.full(layout.nodes, 0.5), v, 1.0)


def test_release_is_the_correctly_rounded_exact_sum():
    layout, v, rng = _random_tree(13, 2, 3)
    z = rng.integers(-50, 50, layout.nodes).astype(float)
    ex = exact_tree_offsets(layout, z, v, 1.0)
    from fractions import Fraction

    for t, s in [(0, 0.0), (5, 17.0), (12, 2.0**50)]:
        exact = Fraction(int(s)) + Fraction(ex.num[t], 1 << ex.shift)
        assert ex.release(t, s) == float(exact)
    with pytest.raises(SparseDPError, match="lattice"):
        ex.release(0, 0.5)


def _counters():
    tree = optimize(wl.prefix(20), family="tree", rng=0)
    pid = optimize(wl.prefix(20), family="pidentity", rng=0)
    pid_g = optimize(wl.prefix(20), family="pidentity", noise="gaussian", rng=0)
    return {
        "gls-tree": lambda: GLSTreeCounter(20, epsilon=1.0, rng=1),
        "gls-tree-gaussian": lambda: GLSTreeCounter(20, rho=0.5, rng=1),
        "gls-tree-unit": lambda: GLSTreeCounter(20, epsilon=1.0, rng=1, increments="unit"),
        "optimized-tree": lambda: OptimizedCounter(20, 1.0, tree, rng=1),
        "optimized-default": lambda: OptimizedCounter(20, 1.0, rng=1),
        "optimized-pidentity": lambda: OptimizedCounter(20, 1.0, pid, rng=1),
        "optimized-pidentity-gaussian": lambda: OptimizedCounter(20, rho=0.5, strategy=pid_g, rng=1),
    }


@pytest.mark.parametrize("name", sorted(_counters()))
def test_tree_counter_release_depends_on_the_measurement_only(name):
    """Same y = M x + z, same release, bit for bit: x0 with noise z and its neighbour x1 with noise
    z + M (x0 - x1).  (The float s_t + e_t of the old code failed this for every z.)"""
    c = _counters()[name]()
    N = c.horizon
    rng = np.random.default_rng(5)
    x0 = rng.integers(0, 3, N).astype(float) if not name.endswith("unit") else rng.uniform(0, 1, N).round(3)
    x0 = c.quantum * np.round(x0 / c.quantum)
    x1 = x0.copy()
    x1[3] += c.quantum if name.endswith("unit") else 1.0
    M = c.measured_strategy().toarray()
    Z = plan_release(c.plan, counts=False)(np.zeros(N), rng, 4)
    for z in Z:
        a = c._release_for(x0, z)
        b = c._release_for(x1, z + M @ (x0 - x1))
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c._release_for(x1, z))  # the check can fail


def test_optimized_counter_refuses_strategies_without_an_exact_release():
    # a full-rank integer strategy that is neither a tree nor [diag(a); B]: lower-triangular ones
    prefix = np.tril(np.ones((20, 20)))
    acct = Accountant(epsilon=1.0)
    with pytest.raises(SparseDPError, match="weighted-tree or an integer p-Identity"):
        OptimizedCounter(20, 1.0, prefix, rng=0, accountant=acct)
    assert acct.spent == 0
    c = OptimizedCounter(20, 1.0, prefix, rng=0, secure=False)  # float noise: an explicit opt-out
    assert np.all(np.isfinite(c.run(np.ones(20))))


def test_pidentity_exact_offsets_agree_with_the_dense_gls():
    from sparsedp.continual.exact_offsets import DiagonalPlusRows
    import scipy.sparse as sp

    rng = np.random.default_rng(2)
    N, p = 40, 6
    B = sp.csr_matrix(rng.integers(0, 4, (p, N)))
    v1, v2 = rng.uniform(1, 9, N), rng.uniform(1, 9, p)
    z = rng.integers(-10**5, 10**5, N + p).astype(float)
    e = DiagonalPlusRows(B, v1, v2).offsets(z, 1.0).floats()
    M = np.vstack([np.eye(N), B.toarray()])
    V = np.concatenate([v1, v2])
    G = np.linalg.solve(M.T @ (M / V[:, None]), (M / V[:, None]).T)
    ref = np.cumsum(G @ z)
    np.testing.assert_allclose(e, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    x = rng.integers(0, 50, N)  # exactly unbiased: noise-free measurements give the exact sums
    ex = DiagonalPlusRows(B, v1, v2).offsets(M @ x, 1.0)
    assert list(ex.num) == [int(s) << ex.shift for s in np.cumsum(x)]
